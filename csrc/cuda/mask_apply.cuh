// The CUDA kernel that writes masked candidates: shared by mask_apply and exact_candidates.
#pragma once
#include <ATen/cuda/CUDAContext.h>

#include <cstdint>

namespace overinterp_fast {
namespace cuda {
namespace {  // each translation unit that launches it has its own copy of the kernel

// out[b, e] = base[img, e] if present[row, fm[e]] and fm[e] != removed, else baseline[img or 0, e], with
// img = cand_image[b], row = cand_row[b] and removed = cand_feature[b]; or, with `remaining` (exact_candidates),
// row = img and removed = remaining[slot[b]] for slot[b] >= 0, -1 (nothing removed) for slot[b] < 0.
template <typename scalar_t>
__global__ void mask_apply_kernel(const scalar_t* __restrict__ base, const scalar_t* __restrict__ baseline,
                                  bool per_image_baseline, const int64_t* __restrict__ fm,
                                  const bool* __restrict__ present, const int64_t* __restrict__ cand_image,
                                  const int64_t* __restrict__ cand_row, const int64_t* __restrict__ cand_feature,
                                  const int64_t* __restrict__ remaining, scalar_t* __restrict__ out, int64_t total,
                                  int64_t E, int64_t P, int64_t n_images, int64_t n_rows) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t b = idx / E, e = idx - b * E;
    const int64_t img = cand_image[b];
    int64_t row, removed;
    if (remaining != nullptr) {
      row = img;
      const int64_t slot = cand_feature[b];
      removed = slot >= 0 ? remaining[slot] : -1;
    } else {
      row = cand_row[b];
      removed = cand_feature[b];
    }
    CUDA_KERNEL_ASSERT(img >= 0 && img < n_images);
    CUDA_KERNEL_ASSERT(row >= 0 && row < n_rows);
    CUDA_KERNEL_ASSERT(removed >= -1 && removed < P);
    const int64_t f = fm[e];
    CUDA_KERNEL_ASSERT(f >= 0 && f < P);
    out[idx] = (present[row * P + f] && f != removed) ? base[img * E + e]
                                                      : baseline[(per_image_baseline ? img * E : 0) + e];
  }
}

}  // namespace
}  // namespace cuda
}  // namespace overinterp_fast
