// Shared argument and index checks of the exact SIS step ops (exact_candidates, exact_scores; CPU and CUDA).
//
// A batch of the step loop is described by int64 rows (runtime/schedule.py makes them, one [6, Bp] block per batch):
//   sched [>= 2, B]: row 0 the image of candidate b; row 1 its slot in the flat [N, S] tables (image * S + j:
//          candidate b masks remaining[image, j]), -1 for a padding row (the batch's fixed shape: the image's
//          current input, its score dropped);
//   done [3, D]: the backward-selection steps the batch completes: row, candidate count and step index; an entry
//          with row -1 is padding (skipped: a captured step has a fixed number of entries).
// Each row of sched and done is contiguous (stride(1) == 1); the rows may be views of one block.
#pragma once
#include <ATen/ATen.h>

#include "check.h"
#include "mask_apply.h"

namespace overinterp_fast {

inline void check_sched(const char* op, const at::Tensor& sched, int64_t rows, const at::Tensor& like,
                        const char* name = "sched") {
  TORCH_CHECK(sched.scalar_type() == at::kLong && sched.dim() == 2 && sched.size(0) >= rows &&
                  (sched.size(1) <= 1 || sched.stride(1) == 1),
              op, ": ", name, " must be an int64 [", rows, ", B] tensor with contiguous rows, got ", sched.sizes(), " ",
              sched.scalar_type());
  TORCH_CHECK(sched.device() == like.device(), op, ": all tensors must be on ", like.device(), ", found one on ",
              sched.device());
}

// The features candidate slots mask (remaining at each slot >= 0, -1 for padding rows), for the index checks.
inline at::Tensor slot_features(const at::Tensor& remaining, const at::Tensor& slots) {
  const at::Tensor flat = remaining.reshape({-1});
  return at::where(slots >= 0, flat.index_select(0, slots.clamp_min(0)), at::full_like(slots, -1));
}

// exact_candidates' optional row memo: what each row of `out` holds, so that a kernel may rewrite only what changed
// since. held int64 [3, B] (per row: image, removed feature, the image's snapshot version it was written from;
// image -1: unknown), snap bool [N, p] (per image: the present row of its latest snapshot), version int64 [N].
// Every implementation updates them the same way: each image of the call whose present row differs from snap gets
// version + 1 and snap = its present row, and held[:, b] = (image, removed feature or -1, version of the image).
// All three or none; `out` must not be changed by anything else between calls (or held reset to -1).
inline bool check_row_memo(const char* op, const c10::optional<at::Tensor>& held, const c10::optional<at::Tensor>& snap,
                           const c10::optional<at::Tensor>& version, const at::Tensor& present, int64_t rows) {
  const bool any = held.has_value() || snap.has_value() || version.has_value();
  if (!any) return false;
  TORCH_CHECK(held.has_value() && snap.has_value() && version.has_value(), op,
              ": held, snap and version go together (all three or none)");
  const int64_t n = present.size(0), p = present.size(1);
  TORCH_CHECK(held->scalar_type() == at::kLong && held->dim() == 2 && held->size(0) == 3 && held->size(1) == rows &&
                  held->is_contiguous(),
              op, ": held must be a contiguous int64 [3, ", rows, "] tensor, got ", held->sizes(), " ",
              held->scalar_type());
  TORCH_CHECK(snap->scalar_type() == at::kBool && snap->dim() == 2 && snap->size(0) == n && snap->size(1) == p &&
                  snap->is_contiguous(),
              op, ": snap must be a contiguous bool [", n, ", ", p, "] tensor, got ", snap->sizes(), " ",
              snap->scalar_type());
  TORCH_CHECK(version->scalar_type() == at::kLong && version->dim() == 1 && version->size(0) == n &&
                  version->is_contiguous(),
              op, ": version must be a contiguous int64 [", n, "] tensor, got ", version->sizes(), " ",
              version->scalar_type());
  for (const auto* t : {&*held, &*snap, &*version}) {
    TORCH_CHECK(t->device() == present.device(), op, ": all tensors must be on ", present.device(),
                ", found one on ", t->device());
  }
  return true;
}

// The row memo's update in tensor ops, for kernels that rewrite every row (CUDA): no host read.
inline void update_row_memo(const at::Tensor& image, const at::Tensor& feature, const at::Tensor& present,
                            const at::Tensor& held, const at::Tensor& snap, const at::Tensor& version) {
  if (image.numel() == 0) return;
  const at::Tensor now = present.index_select(0, image);
  const at::Tensor changed = now.ne(snap.index_select(0, image)).any(1);
  // an image on several rows writes the same values there
  version.index_put_({image}, version.index_select(0, image) + changed.to(at::kLong));
  snap.index_put_({image}, now);
  held[0].copy_(image);
  held[1].copy_(feature);
  held[2].copy_(version.index_select(0, image));
}

inline void check_exact_candidates(const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
                                   const at::Tensor& present, const at::Tensor& remaining, const at::Tensor& sched,
                                   const at::Tensor& out, bool check_indices) {
  const char* op = "exact_candidates";
  check_mask_inputs(op, base, baseline, feature_map, present);
  check_sched(op, sched, 2, base);
  TORCH_CHECK(present.size(0) == base.size(0), op, ": present must have one row per image, got ", present.sizes(),
              " for ", base.size(0), " images");
  TORCH_CHECK(remaining.scalar_type() == at::kLong && remaining.dim() == 2 && remaining.size(0) == base.size(0) &&
                  remaining.size(1) >= present.size(1) && remaining.is_contiguous(),
              op, ": remaining must be a contiguous int64 [N, S >= p] tensor, got ", remaining.sizes());
  TORCH_CHECK(remaining.device() == base.device() && out.device() == base.device(), op,
              ": all tensors must be on ", base.device());
  if (!check_indices) return;
  const at::Tensor image = sched[0], slot = sched[1];
  check_ranges(op, {{image, 0, base.size(0), "image"},
                    {slot, -1, remaining.numel(), "slot"},
                    {feature_map, 0, present.size(1), "feature_map id"}});
  if (slot.numel() > 0) check_ranges(op, {{slot_features(remaining, slot), -1, present.size(1), "slot feature"}});
}

inline void check_exact_scores(const at::Tensor& probs, const at::Tensor& targets, const at::Tensor& sched,
                               const at::Tensor& done, const at::Tensor& scores, const at::Tensor& total, const at::Tensor& remaining,
                               const at::Tensor& present, const at::Tensor& order, const at::Tensor& values,
                               bool check_indices) {
  const char* op = "exact_scores";
  check_sched(op, sched, 2, scores);
  check_sched(op, done, 3, scores, "done");
  TORCH_CHECK(done.size(0) == 3, op, ": done must be int64 [3, D] (row, count, step), got ", done.sizes());
  TORCH_CHECK(probs.dim() == 2 && at::isFloatingType(probs.scalar_type()) && probs.size(0) == sched.size(1) &&
                  probs.size(1) >= 1,
              op, ": probs must be a floating [B, K] tensor with B = ", sched.size(1), " (the schedule's rows), got ",
              probs.sizes(), " ", probs.scalar_type());
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.dim() == 1 && targets.size(0) == scores.size(0),
              op, ": targets must be int64 [N] with N = ", scores.size(0), ", got ", targets.sizes());
  TORCH_CHECK(scores.scalar_type() == at::kDouble && scores.dim() == 2 && scores.is_contiguous(), op,
              ": scores must be a contiguous float64 [N, S] tensor");
  TORCH_CHECK(total.scalar_type() == at::kDouble && total.numel() == 1, op, ": total must be a float64 scalar");
  TORCH_CHECK(remaining.scalar_type() == at::kLong && remaining.sizes() == scores.sizes() && remaining.is_contiguous(),
              op, ": remaining must be a contiguous int64 tensor shaped like scores");
  TORCH_CHECK(present.scalar_type() == at::kBool && present.dim() == 2 && present.size(0) == scores.size(0) &&
                  present.size(1) <= scores.size(1) && present.is_contiguous(),
              op, ": present must be a contiguous bool [N, p <= S] tensor");
  TORCH_CHECK(order.scalar_type() == at::kLong && order.dim() == 2 && order.size(0) == scores.size(0) &&
                  order.is_contiguous(),
              op, ": order must be a contiguous int64 [N, m] tensor");
  TORCH_CHECK(values.scalar_type() == at::kDouble && values.sizes() == order.sizes() && values.is_contiguous(), op,
              ": values must be a contiguous float64 tensor shaped like order");
  for (const auto* t : {&probs, &targets, &total, &remaining, &present, &order, &values}) {
    TORCH_CHECK(t->device() == scores.device(), op, ": all tensors must be on ", scores.device(), ", found one on ",
                t->device());
  }
  if (!check_indices) return;
  const int64_t N = scores.size(0), S = scores.size(1), P = present.size(1);
  check_ranges(op, {{sched[0], 0, N, "image"},
                    {sched[1], -1, scores.numel(), "slot"},
                    {done[0], -1, N, "row"},
                    {done[1], 1, std::min(S, P) + 1, "count"},
                    {done[2], 0, order.size(1), "step"},
                    {targets, 0, probs.size(1), "target"}});
  const at::Tensor rows = done[0], valid = rows >= 0;
  if (rows.numel() > 0) {
    // the scored slots remaining[row, :count] of every step must hold feature ids (the pick is one of them)
    const at::Tensor slots = remaining.index_select(0, rows.clamp_min(0));
    const at::Tensor scored =
        (at::arange(S, rows.options()).unsqueeze(0) < done[1].unsqueeze(1)).logical_and(valid.unsqueeze(1));
    check_ranges(op, {{slots.masked_fill(scored.logical_not(), 0), 0, P, "remaining feature"}});
  }
}

}  // namespace overinterp_fast
