// Launch configuration shared by the grid-stride CUDA kernels.
#pragma once
#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstdint>

namespace overinterp_fast {

constexpr int kThreadsPerBlock = 256;

// Blocks for `work` items of a grid-stride loop: enough to cover them, at most 32 per SM (the loop takes the
// rest), and at least 1 (a launch of 0 blocks is an error).
inline int blocks_for(int64_t work, int threads = kThreadsPerBlock) {
  const int64_t max_blocks = at::cuda::getCurrentDeviceProperties()->multiProcessorCount * 32;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, max_blocks)));
}

}  // namespace overinterp_fast
