// CPU kernels of the exact SIS step: overinterp_fast::exact_candidates and overinterp_fast::exact_scores.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <vector>

#include "../backselect_update.h"
#include "../exact_step.h"
#include "mask_apply_impl.h"

namespace overinterp_fast {
namespace {

void exact_candidates_cpu(const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
                          const at::Tensor& present, const at::Tensor& remaining, const at::Tensor& sched,
                          const at::Tensor& out, bool check_indices, const c10::optional<at::Tensor>& held,
                          const c10::optional<at::Tensor>& snap, const c10::optional<at::Tensor>& version) {
  check_exact_candidates(base, baseline, feature_map, present, remaining, sched, out, check_indices);
  const bool with_memo = check_row_memo("exact_candidates", held, snap, version, present, sched.size(1));
  MaskApplyPlan plan;
  layout_mask_plan(plan, base, baseline, feature_map, present.size(1), sched.size(1), out);
  if (plan.batch == 0) return;
  const int64_t B = plan.batch;
  const int64_t* image = sched.data_ptr<int64_t>();
  const int64_t* slot = image + sched.stride(0);
  const int64_t* rem = remaining.data_ptr<int64_t>();
  std::vector<int64_t> feature(B);
  for (int64_t b = 0; b < B; ++b) feature[b] = slot[b] >= 0 ? rem[slot[b]] : -1;
  auto present_c = present.contiguous();
  cpu::RowMemo memo;
  if (with_memo) {
    int64_t* h = held->data_ptr<int64_t>();
    memo.image = h, memo.feature = h + B, memo.version_of_row = h + 2 * B;
    memo.snap = snap->data_ptr<bool>(), memo.version = version->data_ptr<int64_t>();
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, base.scalar_type(), "exact_candidates_cpu", [&] {
    // each image's present features are its own row of `present`; with the memo, rows that already hold their
    // image's candidate of an earlier present row are patched where it changed
    cpu::mask_apply_cpu_impl<scalar_t>(plan, present_c.data_ptr<bool>(), image, image, feature.data(),
                                       with_memo ? &memo : nullptr);
  });
}

void exact_scores_cpu(const at::Tensor& probs, const at::Tensor& targets, const at::Tensor& sched,
                      const at::Tensor& done, const at::Tensor& scores, const at::Tensor& total, const at::Tensor& remaining,
                      const at::Tensor& present, const at::Tensor& order, const at::Tensor& values,
                      bool check_indices) {
  check_exact_scores(probs, targets, sched, done, scores, total, remaining, present, order, values, check_indices);
  const int64_t B = sched.size(1), K = probs.size(1), D = done.size(1);
  const int64_t S = scores.size(1), P = present.size(1), M = order.size(1);
  const int64_t* image = sched.data_ptr<int64_t>();
  const int64_t* slot = image + sched.stride(0);
  const int64_t* rows = done.data_ptr<int64_t>();
  const int64_t* counts = rows + done.stride(0);
  const int64_t* steps = rows + 2 * done.stride(0);
  const at::Tensor targets_c = targets.contiguous();
  const int64_t* tg = targets_c.data_ptr<int64_t>();
  double* sc = scores.data_ptr<double>();
  const at::Tensor probs_c = probs.contiguous();
  double sum = 0.0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, probs.scalar_type(), "exact_scores_cpu", [&] {
    const scalar_t* pr = probs_c.data_ptr<scalar_t>();
    for (int64_t b = 0; b < B; ++b) {
      if (slot[b] < 0) continue;  // a padding row
      const double f = static_cast<double>(pr[b * K + tg[image[b]]]);
      sc[slot[b]] = f;
      sum += f * 0.0;  // 0, or NaN once a score is not finite: the loop's finiteness check, exact in any order
    }
  });
  *total.data_ptr<double>() += sum;
  int64_t* rem = remaining.data_ptr<int64_t>();
  bool* pres = present.data_ptr<bool>();
  int64_t* ord = order.data_ptr<int64_t>();
  double* val = values.data_ptr<double>();
  for (int64_t k = 0; k < D; ++k) {
    if (rows[k] >= 0) backselect_row(sc, rem, pres, ord, val, rows[k], counts[k], steps[k], S, P, M);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) {
  m.impl("exact_candidates", &exact_candidates_cpu);
  m.impl("exact_scores", &exact_scores_cpu);
}

}  // namespace overinterp_fast
