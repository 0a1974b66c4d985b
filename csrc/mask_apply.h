// Shared argument and index checks and memory-layout planning for mask_apply (CPU and CUDA).
#pragma once
#include <ATen/ATen.h>

#include "check.h"

namespace overinterp_fast {

// The kernels see every per-sample tensor as a flat array of E elements in one
// physical order. For channels_last inputs that order is NHWC: base and out are
// viewed through a permutation (no copy) and the small per-sample tensors
// (feature map, baseline) are permuted to match.
struct MaskApplyPlan {
  at::Tensor out;       // [B, *D], logical shape, in base's memory format
  at::Tensor out_flat;  // contiguous view of out in physical order
  at::Tensor base;      // contiguous, physical order
  at::Tensor baseline;  // contiguous, physical order, [1 or N, ...]
  at::Tensor fm;        // contiguous int64, physical order
  int64_t batch = 0;    // B
  int64_t elems = 0;    // E = elements per sample
  int64_t num_features = 0;  // p
};

// The memory layout of a batch of B candidates: base, baseline and the feature map in one physical order, and
// the output (a new tensor, or `out` when defined: [B, *D] in base's dtype, device and memory format).
inline void layout_mask_plan(MaskApplyPlan& plan, const at::Tensor& base, const at::Tensor& baseline,
                             const at::Tensor& feature_map, int64_t num_features, int64_t batch,
                             const at::Tensor& out) {
  plan.batch = batch;
  plan.elems = base[0].numel();
  plan.num_features = num_features;
  std::vector<int64_t> out_shape{plan.batch};
  for (auto s : base.sizes().slice(1)) out_shape.push_back(s);

  const bool channels_last = base.dim() == 4 && !base.is_contiguous() &&
                             base.is_contiguous(at::MemoryFormat::ChannelsLast);
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (out.defined()) {
    TORCH_CHECK(out.sizes() == at::IntArrayRef(out_shape) && out.scalar_type() == base.scalar_type() &&
                    out.device() == base.device() && out.is_contiguous(format),
                "out must be ", at::IntArrayRef(out_shape), " ", base.scalar_type(), " on ", base.device(),
                channels_last ? ", channels_last" : ", contiguous", "; got ", out.sizes(), " ", out.scalar_type(),
                " on ", out.device());
    plan.out = out;
  } else {
    plan.out = at::empty(out_shape, base.options().memory_format(format));
  }
  if (channels_last) {
    plan.out_flat = plan.out.permute({0, 2, 3, 1});
    plan.base = base.permute({0, 2, 3, 1}).contiguous();  // a view: already NHWC in memory
    plan.baseline = baseline.permute({0, 2, 3, 1}).contiguous();
    plan.fm = feature_map.permute({1, 2, 0}).contiguous();
  } else {
    plan.out_flat = plan.out;
    plan.base = base.contiguous();
    plan.baseline = baseline.contiguous();
    plan.fm = feature_map.contiguous();
  }
}

// The checks of the images, baseline, feature map and present rows that every candidate-writing op shares.
inline void check_mask_inputs(const char* op, const at::Tensor& base, const at::Tensor& baseline,
                              const at::Tensor& feature_map, const at::Tensor& present) {
  TORCH_CHECK(base.dim() >= 2, op, ": base must be [N, *D], got ", base.sizes());
  TORCH_CHECK(at::isFloatingType(base.scalar_type()), op, ": base must be floating point, got ",
              base.scalar_type());
  TORCH_CHECK(baseline.scalar_type() == base.scalar_type(), op, ": baseline dtype ",
              baseline.scalar_type(), " differs from base dtype ", base.scalar_type());
  TORCH_CHECK(baseline.dim() == base.dim() && baseline.sizes().slice(1) == base.sizes().slice(1) &&
                  (baseline.size(0) == 1 || baseline.size(0) == base.size(0)),
              op, ": baseline must be [1, *D] or [N, *D] with base [N, *D]; got ", baseline.sizes(),
              " and ", base.sizes());
  TORCH_CHECK(feature_map.scalar_type() == at::kLong, op, ": feature_map must be int64");
  TORCH_CHECK(feature_map.sizes() == base.sizes().slice(1), op, ": feature_map must be [*D] = ",
              base.sizes().slice(1), ", got ", feature_map.sizes());
  TORCH_CHECK(present.scalar_type() == at::kBool && present.dim() == 2,
              op, ": present must be a bool [R, p] tensor");
  for (const auto* t : {&baseline, &feature_map, &present}) {
    TORCH_CHECK(t->device() == base.device(), op, ": all tensors must be on ", base.device(),
                ", found one on ", t->device());
  }
}

inline MaskApplyPlan plan_mask_apply(
    const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
    const at::Tensor& present, const at::Tensor& cand_image, const at::Tensor& cand_row,
    const at::Tensor& cand_feature, bool check_indices) {
  check_mask_inputs("mask_apply", base, baseline, feature_map, present);
  for (const auto* t : {&cand_image, &cand_row, &cand_feature}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1, "mask_apply: candidate lists must be int64 [B]");
    TORCH_CHECK(t->size(0) == cand_image.size(0), "mask_apply: candidate lists differ in length");
  }
  for (const auto* t : {&cand_image, &cand_row, &cand_feature}) {
    TORCH_CHECK(t->device() == base.device(), "mask_apply: all tensors must be on ", base.device(),
                ", found one on ", t->device());
  }

  if (check_indices) check_ranges("mask_apply", {{cand_image, 0, base.size(0), "cand_image"},
                              {cand_row, 0, present.size(0), "cand_row"},
                              {cand_feature, -1, present.size(1), "cand_feature"},
                              {feature_map, 0, present.size(1), "feature_map id"}});

  MaskApplyPlan plan;
  layout_mask_plan(plan, base, baseline, feature_map, present.size(1), cand_image.size(0), at::Tensor());
  return plan;
}

}  // namespace overinterp_fast
