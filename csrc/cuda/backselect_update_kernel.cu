// CUDA kernel of overinterp_fast::backselect_update: one block per updated row.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../backselect_update.h"

namespace overinterp_fast {
namespace {

constexpr int kThreads = 256;

// (score, feature id, slot): larger score wins, then the lower feature id.
struct Best {
  double score;
  int64_t feature;
  int64_t slot;
};

__device__ __forceinline__ bool better(const Best& a, const Best& b) {
  return a.score > b.score || (a.score == b.score && a.feature < b.feature);
}

__global__ void backselect_update_kernel(const double* __restrict__ scores, const int64_t* __restrict__ rows,
                                         const int64_t* __restrict__ counts, const int64_t* __restrict__ steps,
                                         int64_t* __restrict__ remaining, bool* __restrict__ present,
                                         int64_t* __restrict__ order, double* __restrict__ values, int64_t K,
                                         int64_t N, int64_t S, int64_t P, int64_t M) {
  __shared__ Best shared[kThreads];
  for (int64_t k = blockIdx.x; k < K; k += gridDim.x) {
    const int64_t i = rows[k], count = counts[k], step = steps[k];
    CUDA_KERNEL_ASSERT(i >= 0 && i < N);
    CUDA_KERNEL_ASSERT(count >= 1 && count <= S && count <= P);
    CUDA_KERNEL_ASSERT(step >= 0 && step < M);
    const double* s = scores + i * S;
    int64_t* r = remaining + i * S;
    Best mine{-INFINITY, INT64_MAX, -1};
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      Best cand{s[j], r[j], j};
      if (mine.slot < 0 || better(cand, mine)) mine = cand;
    }
    shared[threadIdx.x] = mine;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
      if (threadIdx.x < stride) {
        const Best other = shared[threadIdx.x + stride];
        if (other.slot >= 0 && (shared[threadIdx.x].slot < 0 || better(other, shared[threadIdx.x]))) {
          shared[threadIdx.x] = other;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const Best best = shared[0];
      CUDA_KERNEL_ASSERT(best.slot >= 0 && best.feature >= 0 && best.feature < P);
      order[i * M + step] = best.feature;
      values[i * M + step] = best.score;
      present[i * P + best.feature] = false;
      r[best.slot] = r[count - 1];
      r[count - 1] = -1;
    }
    __syncthreads();
  }
}

void backselect_update_cuda(const at::Tensor& scores, const at::Tensor& rows, const at::Tensor& counts,
                            const at::Tensor& steps, const at::Tensor& remaining, const at::Tensor& present,
                            const at::Tensor& order, const at::Tensor& values,
                           bool check_indices) {
  const c10::cuda::CUDAGuard guard(scores.device());
  check_backselect_update(scores, rows, counts, steps, remaining, present, order, values, check_indices);
  const int64_t K = rows.size(0);
  if (K == 0) return;
  auto rows_c = rows.contiguous(), counts_c = counts.contiguous(), steps_c = steps.contiguous();
  const int blocks = static_cast<int>(std::min<int64_t>(K, 65535));
  backselect_update_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      scores.data_ptr<double>(), rows_c.data_ptr<int64_t>(), counts_c.data_ptr<int64_t>(),
      steps_c.data_ptr<int64_t>(), remaining.data_ptr<int64_t>(), present.data_ptr<bool>(),
      order.data_ptr<int64_t>(), values.data_ptr<double>(), K, scores.size(0), scores.size(1), present.size(1),
      order.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CUDA, m) { m.impl("backselect_update", &backselect_update_cuda); }

}  // namespace overinterp_fast
