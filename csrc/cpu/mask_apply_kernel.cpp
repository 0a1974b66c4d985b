// CPU kernel of overinterp_fast::mask_apply: writes a batch of masked candidates.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../mask_apply.h"

namespace overinterp_fast {
namespace {

template <typename scalar_t>
void mask_apply_cpu_impl(const MaskApplyPlan& plan, const bool* present, const int64_t* cand_image,
                         const int64_t* cand_row, const int64_t* cand_feature) {
  const int64_t E = plan.elems, P = plan.num_features;
  const scalar_t* base = plan.base.data_ptr<scalar_t>();
  const scalar_t* baseline = plan.baseline.data_ptr<scalar_t>();
  const bool per_image_baseline = plan.baseline.size(0) > 1;
  const int64_t* fm = plan.fm.data_ptr<int64_t>();
  scalar_t* out = static_cast<scalar_t*>(plan.out_flat.data_ptr());
  // One task per candidate keeps the inner loop branch-light and vectorizable.
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(E, 1));
  at::parallel_for(0, plan.batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t img = cand_image[b], row = cand_row[b], removed = cand_feature[b];
      const bool* pres = present + row * P;
      const scalar_t* src = base + img * E;
      const scalar_t* fill = baseline + (per_image_baseline ? img * E : 0);
      scalar_t* dst = out + b * E;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t f = fm[e];
        dst[e] = (pres[f] && f != removed) ? src[e] : fill[e];
      }
    }
  });
}

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
