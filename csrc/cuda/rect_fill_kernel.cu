// CUDA kernel of overinterp_fast::rect_fill: weighted rectangle coverage via 2D difference arrays.
// Integer atomics make the corner sums exact and independent of scheduling order.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../rect_fill.h"
#include "launch.cuh"

namespace overinterp_fast {
namespace {

__device__ __forceinline__ void add(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

__global__ void corners_kernel(const int64_t* __restrict__ r, const int64_t* __restrict__ o,
                               const int64_t* __restrict__ w, int64_t* __restrict__ d, int64_t R, int64_t n,
                               int64_t H, int64_t W) {
  const int64_t W1 = W + 1, plane = (H + 1) * W1;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < R;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    CUDA_KERNEL_ASSERT(o[i] >= 0 && o[i] < n);
    const int64_t y0 = min(max(r[4 * i], int64_t(0)), H), x0 = min(max(r[4 * i + 1], int64_t(0)), W);
    const int64_t y1 = min(max(r[4 * i + 2], int64_t(0)), H), x1 = min(max(r[4 * i + 3], int64_t(0)), W);
    if (y0 >= y1 || x0 >= x1) continue;
    int64_t* p = d + o[i] * plane;
    add(p + y0 * W1 + x0, w[i]);
    add(p + y0 * W1 + x1, -w[i]);
    add(p + y1 * W1 + x0, -w[i]);
    add(p + y1 * W1 + x1, w[i]);
  }
}

// One thread per (map, row): running sums along x.
__global__ void scan_rows_kernel(int64_t* __restrict__ d, int64_t n, int64_t H, int64_t W) {
  const int64_t W1 = W + 1;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n * H;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int64_t* p = d + (t / H) * (H + 1) * W1 + (t % H) * W1;
    for (int64_t x = 1; x < W; ++x) p[x] += p[x - 1];
  }
}

// One thread per (map, column): running sums along y.
__global__ void scan_cols_kernel(int64_t* __restrict__ d, int64_t n, int64_t H, int64_t W) {
  const int64_t W1 = W + 1;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < n * W;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int64_t* p = d + (t / W) * (H + 1) * W1 + (t % W);
    for (int64_t y = 1; y < H; ++y) p[y * W1] += p[(y - 1) * W1];
  }
}

at::Tensor rect_fill_cuda(const at::Tensor& rects, const at::Tensor& owner, const at::Tensor& weights, int64_t n,
                          int64_t height, int64_t width, bool check_indices) {
  const c10::cuda::CUDAGuard guard(rects.device());
  check_rect_fill(rects, owner, weights, n, height, width, check_indices);
  at::Tensor diff = at::zeros({n, height + 1, width + 1}, rects.options());
  if (n == 0 || height == 0 || width == 0) return diff.narrow(1, 0, height).narrow(2, 0, width).contiguous();
  auto rc = rects.contiguous(), oc = owner.contiguous(), wc = weights.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int threads = kThreadsPerBlock;
  const int64_t R = rects.size(0);
  if (R > 0) {
    corners_kernel<<<blocks_for(R, threads), threads, 0, stream>>>(
        rc.data_ptr<int64_t>(), oc.data_ptr<int64_t>(), wc.data_ptr<int64_t>(), diff.data_ptr<int64_t>(), R, n,
        height, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  scan_rows_kernel<<<blocks_for(n * height, threads), threads, 0, stream>>>(diff.data_ptr<int64_t>(), n, height,
                                                                             width);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  scan_cols_kernel<<<blocks_for(n * width, threads), threads, 0, stream>>>(diff.data_ptr<int64_t>(), n, height,
                                                                            width);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return diff.narrow(1, 0, height).narrow(2, 0, width).contiguous();
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CUDA, m) { m.impl("rect_fill", &rect_fill_cuda); }

}  // namespace overinterp_fast
