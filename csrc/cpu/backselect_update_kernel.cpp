// CPU kernel of overinterp_fast::backselect_update: one backward-selection step per row.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../backselect_update.h"

namespace overinterp_fast {
namespace {

void backselect_update_cpu(const at::Tensor& scores, const at::Tensor& rows, const at::Tensor& counts,
                           const at::Tensor& steps, const at::Tensor& remaining, const at::Tensor& present,
                           const at::Tensor& order, const at::Tensor& values,
                           bool check_indices) {
  check_backselect_update(scores, rows, counts, steps, remaining, present, order, values, check_indices);  // indices too
  const int64_t K = rows.size(0);
  if (K == 0) return;
  auto rows_c = rows.contiguous(), counts_c = counts.contiguous(), steps_c = steps.contiguous();
  const int64_t S = scores.size(1), P = present.size(1), M = order.size(1);
  const double* sc = scores.data_ptr<double>();
  int64_t* rem = remaining.data_ptr<int64_t>();
  bool* pres = present.data_ptr<bool>();
  int64_t* ord = order.data_ptr<int64_t>();
  double* val = values.data_ptr<double>();
  const int64_t* rw = rows_c.data_ptr<int64_t>();
  const int64_t* ct = counts_c.data_ptr<int64_t>();
  const int64_t* st = steps_c.data_ptr<int64_t>();
  at::parallel_for(0, K, 16, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      if (rw[k] >= 0) backselect_row(sc, rem, pres, ord, val, rw[k], ct[k], st[k], S, P, M);  // < 0: padding
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("backselect_update", &backselect_update_cpu); }

}  // namespace overinterp_fast
