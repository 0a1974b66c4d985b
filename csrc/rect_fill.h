// Shared argument checks for rect_fill (CPU and CUDA).
#pragma once
#include <ATen/ATen.h>

#include "check.h"

namespace overinterp_fast {

inline void check_rect_fill(const at::Tensor& rects, const at::Tensor& owner, const at::Tensor& weights, int64_t n,
                            int64_t height, int64_t width, bool check_indices) {
  TORCH_CHECK(rects.scalar_type() == at::kLong && rects.dim() == 2 && rects.size(1) == 4,
              "rect_fill: rects must be int64 [R, 4] (y0, x0, y1, x1)");
  TORCH_CHECK(owner.scalar_type() == at::kLong && owner.dim() == 1 && owner.size(0) == rects.size(0),
              "rect_fill: owner must be int64 [R]");
  TORCH_CHECK(weights.scalar_type() == at::kLong && weights.dim() == 1 && weights.size(0) == rects.size(0),
              "rect_fill: weights must be int64 [R]");
  TORCH_CHECK(n >= 0 && height >= 0 && width >= 0, "rect_fill: n, height and width must be >= 0");
  TORCH_CHECK(owner.device() == rects.device() && weights.device() == rects.device(),
              "rect_fill: all tensors must be on one device");
  // also when n, height or width is 0
  if (check_indices) check_ranges("rect_fill", {{owner, 0, n, "owner"}});
}

}  // namespace overinterp_fast
