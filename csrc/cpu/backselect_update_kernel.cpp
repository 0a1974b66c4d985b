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
      const int64_t i = rw[k], count = ct[k], step = st[k];
      const double* s = sc + i * S;
      int64_t* r = rem + i * S;
      // Largest score wins; among equal scores the lowest feature id (the
      // reference's argmax over candidates listed in ascending id order).
      int64_t best = 0;
      for (int64_t j = 1; j < count; ++j) {
        if (s[j] > s[best] || (s[j] == s[best] && r[j] < r[best])) best = j;
      }
      const int64_t feature = r[best];
      ord[i * M + step] = feature;
      val[i * M + step] = s[best];
      pres[i * P + feature] = false;
      // Swap-with-last keeps the present features compact in r[0, count - 1).
      r[best] = r[count - 1];
      r[count - 1] = -1;
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("backselect_update", &backselect_update_cpu); }

}  // namespace overinterp_fast
