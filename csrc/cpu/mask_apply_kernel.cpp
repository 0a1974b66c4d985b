// CPU kernel of overinterp_fast::mask_apply: writes a batch of masked candidates.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "mask_apply_impl.h"

namespace overinterp_fast {
namespace {

using cpu::mask_apply_cpu_impl;

at::Tensor mask_apply_cpu(const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
                          const at::Tensor& present, const at::Tensor& cand_image, const at::Tensor& cand_row,
                          const at::Tensor& cand_feature, bool check_indices) {
  MaskApplyPlan plan =
      plan_mask_apply(base, baseline, feature_map, present, cand_image, cand_row, cand_feature, check_indices);
  if (plan.batch == 0 || plan.elems == 0) return plan.out;
  auto present_c = present.contiguous();
  auto img = cand_image.contiguous(), row = cand_row.contiguous(), feat = cand_feature.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, base.scalar_type(), "mask_apply_cpu", [&] {
    mask_apply_cpu_impl<scalar_t>(plan, present_c.data_ptr<bool>(), img.data_ptr<int64_t>(),
                                  row.data_ptr<int64_t>(), feat.data_ptr<int64_t>());
  });
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("mask_apply", &mask_apply_cpu); }

}  // namespace overinterp_fast
