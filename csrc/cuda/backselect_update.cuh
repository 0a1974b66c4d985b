// The CUDA kernel of one backward-selection step per row: shared by backselect_update and exact_scores.
#pragma once
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>

namespace overinterp_fast {
namespace cuda {
namespace {  // each translation unit that launches it has its own copy of the kernel

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
    if (i < 0) continue;  // a padding entry (exact_scores' fixed-size lists): the same for the whole block
    CUDA_KERNEL_ASSERT(i < N);
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

// Launches the kernel over the K entries of rows/counts/steps (entries with a negative row are skipped).
inline void launch_backselect_update(const double* scores, const int64_t* rows, const int64_t* counts,
                                     const int64_t* steps, int64_t* remaining, bool* present, int64_t* order,
                                     double* values, int64_t K, int64_t N, int64_t S, int64_t P, int64_t M,
                                     cudaStream_t stream) {
  if (K == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(K, 65535));
  backselect_update_kernel<<<blocks, kThreads, 0, stream>>>(scores, rows, counts, steps, remaining, present, order,
                                                            values, K, N, S, P, M);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda
}  // namespace overinterp_fast
