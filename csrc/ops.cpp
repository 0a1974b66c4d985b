// Operator schemas of the overinterp_fast extension. Kernels are registered per
// dispatch key in csrc/cpu/*_kernel.cpp and csrc/cuda/*_kernel.cu; the fake
// (meta) implementations live in overinterp_fast/_ops.py.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// Importing overinterp_fast._C loads this library, which runs the static
// registrations below. The module itself exposes nothing.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "overinterp_fast C++/CUDA operators", -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(overinterp_fast, m) {
  // out[b, e] = base[cand_image[b], e]      if present[cand_row[b], fm[e]] and fm[e] != cand_feature[b]
  //           = baseline[cand_image[b], e]  otherwise (baseline row 0 when baseline has one row)
  m.def(
      "mask_apply(Tensor base, Tensor baseline, Tensor feature_map, Tensor present, "
      "Tensor cand_image, Tensor cand_row, Tensor cand_feature, bool check_indices=True) -> Tensor");
  // One backward-selection step for each row in `rows`: segmented argmax of
  // scores[row, :count] (ties to the lowest feature id), then in place: the
  // chosen feature is appended to order/values at `steps`, cleared in
  // `present` and removed from the compact `remaining` list.
  // check_indices=false skips the host-side range checks (csrc/check.h), which cost one device
  // synchronisation per call on CUDA: only for callers whose indices were checked where they were made.
  m.def(
      "backselect_update(Tensor scores, Tensor rows, Tensor counts, Tensor steps, "
      "Tensor(a!) remaining, Tensor(b!) present, Tensor(c!) order, Tensor(d!) values, bool check_indices=True) -> ()");
  // out[o, y, x] = sum of weights[r] over rectangles r with owner[r] == o that
  // cover (y, x); rects[r] = (y0, x0, y1, x1), half-open, clipped to the image.
  // int64 weights keep the sums exact (2D difference arrays and prefix sums).
  // check_indices=false skips the range check of `owner` (as for mask_apply).
  m.def(
      "rect_fill(Tensor rects, Tensor owner, Tensor weights, int n, int height, int width, "
      "bool check_indices=True) -> Tensor");
  // Incremental inference: out[b, c, i, j] at map position (y, x) = region_origin[b] + (i, j) is
  //   pad_value                                  outside the map [0, H) x [0, W),
  //   patch[b, c, y - py, x - px]                inside valid[b] (y0, x0, y1, x1) and the patch at (py, px),
  //   stored[image[b], c, y, x]                  elsewhere;
  // changed[b]: some patch value read differs from the stored value under it.
  // check_indices=false skips the range check of `image` (as for mask_apply).
  m.def(
      "patch_gather(Tensor stored, Tensor image, Tensor patch, Tensor patch_origin, Tensor valid, "
      "Tensor region_origin, int height, int width, float pad_value, bool check_indices=True) -> (Tensor, Tensor)");
  // The exact SIS step loop (csrc/exact_step.h describes a batch's schedule block `sched`, int64 [R, B]).
  // exact_candidates writes batch b's candidates into out [B, *D]: out[b] is mask_apply's candidate of image
  // sched[0, b] with present row sched[0, b] and feature remaining.view(-1)[sched[1, b]] masked (none for a
  // padding row, sched[1, b] < 0). held, snap and version (optional, all three or none) are the row memo of
  // csrc/exact_step.h: what each row of out holds, updated by every implementation in the same way; the CPU
  // kernel rewrites only the elements that changed in rows that already hold their image's candidate.
  m.def(
      "exact_candidates(Tensor base, Tensor baseline, Tensor feature_map, Tensor present, Tensor remaining, "
      "Tensor sched, Tensor(a!) out, bool check_indices=True, Tensor(b!)? held=None, Tensor(c!)? snap=None, "
      "Tensor(d!)? version=None) -> ()");
  // exact_scores: f[b] = probs[b, targets[sched[0, b]]] (as float64) goes to scores.view(-1)[sched[1, b]] where
  // sched[1, b] >= 0, and total (a float64 scalar) becomes NaN once such an f is not finite (it stays 0 otherwise);
  // then backselect_update's step for every entry k of done (int64 [3, D]: row, count, step) with done[0, k] >= 0.
  // One op per batch, with no host read: a step made of exact_candidates, the model and exact_scores can be
  // captured as a CUDA graph.
  m.def(
      "exact_scores(Tensor probs, Tensor targets, Tensor sched, Tensor done, Tensor(a!) scores, Tensor(b!) total, "
      "Tensor(c!) remaining, Tensor(d!) present, Tensor(e!) order, Tensor(f!) values, bool check_indices=True) -> ()");
  // The host's schedule of the step loop for up to max_batches batches (csrc/cpu/schedule_window_kernel.cpp): the
  // queue's segments (int64 [4, S]: image, start, stop, tag) in, the batches' schedule blocks out, with each
  // image's candidate count and step index advanced in place. Returns (records int64 [sum of 6 * Bp]: the
  // batches' [6, Bp] blocks one after the other; batches int64 [W, 5]: offset, Bp, rows, first completion,
  // completions; done int64 [D, 5]: batch, image, tag, count and step before, of every completed segment in
  // queue order; the segments left, int64 [4, S']). CPU only.
  m.def(
      "schedule_window(Tensor segments, Tensor(a!) count, Tensor(b!) step, Tensor full, Tensor sizes, "
      "int batch_size, int stride, int rescore, bool stop_at_round_end, int max_batches) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
}
