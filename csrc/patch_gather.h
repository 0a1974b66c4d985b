// Shared argument checks and output planning for patch_gather (CPU and CUDA).
#pragma once
#include <ATen/ATen.h>

#include "check.h"

namespace overinterp_fast {

// Strides of a [*, C, H, W] tensor as plain integers (elements).
struct Strides4 {
  int64_t n, c, h, w;
};

inline Strides4 strides4(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

struct PatchGatherPlan {
  at::Tensor out;      // [B, C, height, width], stored's memory format
  at::Tensor changed;  // bool [B]
  at::Tensor image, patch_origin, valid, region_origin;  // contiguous int64
  int64_t batch = 0, channels = 0, map_h = 0, map_w = 0, patch_h = 0, patch_w = 0;
  bool channels_last = false;
};

// Validates shapes, dtypes and devices, and (on the host: a RuntimeError, not a
// device assert; skipped with check_indices=false) that every image index lies in [0, N).
inline PatchGatherPlan plan_patch_gather(const at::Tensor& stored, const at::Tensor& image,
                                         const at::Tensor& patch, const at::Tensor& patch_origin,
                                         const at::Tensor& valid, const at::Tensor& region_origin,
                                         int64_t height, int64_t width, bool check_indices) {
  TORCH_CHECK(stored.dim() == 4, "patch_gather: stored must be [N, C, H, W], got ", stored.sizes());
  TORCH_CHECK(patch.dim() == 4 && patch.scalar_type() == stored.scalar_type(),
              "patch_gather: patch must be a [B, C, h, w] tensor of stored's dtype ", stored.scalar_type());
  TORCH_CHECK(image.scalar_type() == at::kLong && image.dim() == 1, "patch_gather: image must be int64 [B]");
  const int64_t B = image.size(0);
  TORCH_CHECK(patch.size(1) == stored.size(1) && (patch.size(0) == B || patch.numel() == 0),
              "patch_gather: patch must be [B, C, h, w] with B = ", B, " and C = ", stored.size(1), ", got ",
              patch.sizes());
  TORCH_CHECK(patch_origin.scalar_type() == at::kLong && patch_origin.dim() == 2 && patch_origin.size(0) == B &&
                  patch_origin.size(1) == 2,
              "patch_gather: patch_origin must be int64 [B, 2]");
  TORCH_CHECK(region_origin.scalar_type() == at::kLong && region_origin.dim() == 2 &&
                  region_origin.size(0) == B && region_origin.size(1) == 2,
              "patch_gather: region_origin must be int64 [B, 2]");
  TORCH_CHECK(valid.scalar_type() == at::kLong && valid.dim() == 2 && valid.size(0) == B && valid.size(1) == 4,
              "patch_gather: valid must be int64 [B, 4] (y0, x0, y1, x1)");
  TORCH_CHECK(height >= 0 && width >= 0, "patch_gather: region size must be non-negative, got ", height, "x",
              width);
  for (const auto* t : {&image, &patch, &patch_origin, &valid, &region_origin}) {
    TORCH_CHECK(t->device() == stored.device(), "patch_gather: all tensors must be on ", stored.device(),
                ", found one on ", t->device());
  }
  if (check_indices) check_ranges("patch_gather", {{image, 0, stored.size(0), "image"}});
  PatchGatherPlan plan;
  plan.batch = B;
  plan.channels = stored.size(1);
  plan.map_h = stored.size(2);
  plan.map_w = stored.size(3);
  plan.patch_h = patch.numel() == 0 ? 0 : patch.size(2);
  plan.patch_w = patch.numel() == 0 ? 0 : patch.size(3);
  plan.channels_last = !stored.is_contiguous() && stored.is_contiguous(at::MemoryFormat::ChannelsLast);
  auto fmt = plan.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  plan.out = at::empty({B, plan.channels, height, width}, stored.options().memory_format(fmt));
  plan.changed = at::zeros({B}, stored.options().dtype(at::kBool));
  plan.image = image.contiguous();
  plan.patch_origin = patch_origin.contiguous();
  plan.valid = valid.contiguous();
  plan.region_origin = region_origin.contiguous();
  return plan;
}

}  // namespace overinterp_fast
