// Shared argument checks for backselect_update (CPU and CUDA).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>

#include "check.h"

namespace overinterp_fast {

inline void check_backselect_update(const at::Tensor& scores, const at::Tensor& rows, const at::Tensor& counts,
                                    const at::Tensor& steps, const at::Tensor& remaining,
                                    const at::Tensor& present, const at::Tensor& order,
                                    const at::Tensor& values, bool check_indices) {
  TORCH_CHECK(scores.scalar_type() == at::kDouble && scores.dim() == 2 && scores.is_contiguous(),
              "backselect_update: scores must be a contiguous float64 [N, P] tensor");
  TORCH_CHECK(remaining.scalar_type() == at::kLong && remaining.sizes() == scores.sizes() &&
                  remaining.is_contiguous(),
              "backselect_update: remaining must be a contiguous int64 tensor shaped like scores");
  TORCH_CHECK(present.scalar_type() == at::kBool && present.dim() == 2 && present.size(0) == scores.size(0) &&
                  present.is_contiguous(),
              "backselect_update: present must be a contiguous bool [N, p] tensor");
  TORCH_CHECK(order.scalar_type() == at::kLong && order.dim() == 2 && order.size(0) == scores.size(0) &&
                  order.is_contiguous(),
              "backselect_update: order must be a contiguous int64 [N, m] tensor");
  TORCH_CHECK(values.scalar_type() == at::kDouble && values.sizes() == order.sizes() && values.is_contiguous(),
              "backselect_update: values must be a contiguous float64 tensor shaped like order");
  TORCH_CHECK(present.size(1) <= scores.size(1), "backselect_update: scores needs at least p columns");
  for (const auto* t : {&rows, &counts, &steps}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->dim() == 1 && t->size(0) == rows.size(0),
                "backselect_update: rows, counts and steps must be int64 [K]");
  }
  for (const auto* t : {&rows, &counts, &steps, &remaining, &present, &order, &values}) {
    TORCH_CHECK(t->device() == scores.device(), "backselect_update: all tensors must be on ", scores.device());
  }
  if (!check_indices) return;
  const int64_t S = scores.size(1), P = present.size(1);
  check_ranges("backselect_update", {{rows, 0, scores.size(0), "row"},
                                     {counts, 1, std::min(S, P) + 1, "count"},
                                     {steps, 0, order.size(1), "step"}});
  if (rows.numel() > 0) {
    // The scored slots remaining[row, :count] must hold feature ids (the pick is one of them).
    const at::Tensor slots = remaining.index_select(0, rows);
    const at::Tensor scored = at::arange(S, rows.options()).unsqueeze(0) < counts.unsqueeze(1);
    check_ranges("backselect_update", {{slots.masked_fill(scored.logical_not(), 0), 0, P, "remaining feature"}});
  }
}

// One backward-selection step of row i of the [N, S] tables (CPU): the largest of scores[i, :count] wins, among
// equal scores the lowest feature id (the reference's argmax over candidates listed in ascending id order); the
// feature goes to order/values at `step`, leaves `present`, and the last scored slot moves into its place
// (swap-with-last keeps the present features compact in remaining[i, :count - 1]).
inline void backselect_row(const double* scores, int64_t* remaining, bool* present, int64_t* order, double* values,
                           int64_t i, int64_t count, int64_t step, int64_t S, int64_t P, int64_t M) {
  const double* s = scores + i * S;
  int64_t* r = remaining + i * S;
  int64_t best = 0;
  for (int64_t j = 1; j < count; ++j) {
    if (s[j] > s[best] || (s[j] == s[best] && r[j] < r[best])) best = j;
  }
  const int64_t feature = r[best];
  order[i * M + step] = feature;
  values[i * M + step] = s[best];
  present[i * P + feature] = false;
  r[best] = r[count - 1];
  r[count - 1] = -1;
}

}  // namespace overinterp_fast
