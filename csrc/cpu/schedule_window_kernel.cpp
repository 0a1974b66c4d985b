// CPU kernel of overinterp_fast::schedule_window: the exact SIS step loop's schedule for many batches at once.
//
// The loop's queue holds segments (image, start, stop, tag): a backward-selection step of an image with r
// features present is the segment of its r candidate slots. Each batch takes the next `batch_size` slots in
// queue order, splitting the last segment it touches. A batch that holds the last slot of a step (tag STEP or
// LOW) completes it: the image's candidate count drops by one, its step index grows by one, and its next step is
// queued behind everything else (the steps of STEP segments first, then those of LOW segments, each in queue
// order), tagged LOW where rescore > 0, the image is not `full` and it has more than `rescore` candidates. A step
// that leaves no candidate ends the image's round. A completed SCORE segment (the input of a new round) is left to
// the host. The window stops after the batch that completes a SCORE segment, after one that ends a round when
// stop_at_round_end, when the queue is empty, or after max_batches batches.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace overinterp_fast {
namespace {

constexpr int64_t kStep = 0, kScore = 1, kLow = 2;
constexpr int64_t kRecordRows = 6;

struct Segment {
  int64_t image, start, stop, tag;
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> schedule_window_cpu(
    const at::Tensor& segments, const at::Tensor& count, const at::Tensor& step, const at::Tensor& full,
    const at::Tensor& sizes, int64_t batch_size, int64_t stride, int64_t rescore, bool stop_at_round_end,
    int64_t max_batches) {
  const char* op = "schedule_window";
  TORCH_CHECK(segments.scalar_type() == at::kLong && segments.dim() == 2 && segments.size(0) == 4, op,
              ": segments must be int64 [4, S] (image, start, stop, tag), got ", segments.sizes());
  TORCH_CHECK(count.scalar_type() == at::kLong && count.dim() == 1 && count.is_contiguous() &&
                  step.scalar_type() == at::kLong && step.sizes() == count.sizes() && step.is_contiguous(),
              op, ": count and step must be contiguous int64 [N]");
  TORCH_CHECK(full.scalar_type() == at::kBool && full.sizes() == count.sizes(), op, ": full must be bool [N]");
  TORCH_CHECK(sizes.scalar_type() == at::kLong && sizes.dim() == 1, op, ": sizes must be int64 [Z]");
  for (const auto* t : {&segments, &count, &step, &full, &sizes}) {
    TORCH_CHECK(t->is_cpu(), op, ": every tensor must be on the CPU (the schedule is the host's)");
  }
  TORCH_CHECK(batch_size >= 1 && stride >= 1 && rescore >= 0 && max_batches >= 1, op,
              ": batch_size, stride and max_batches must be >= 1 and rescore >= 0");
  const int64_t N = count.size(0);
  int64_t* cnt = count.data_ptr<int64_t>();
  int64_t* stp = step.data_ptr<int64_t>();
  const at::Tensor full_c = full.contiguous(), sizes_c = sizes.contiguous(), seg_c = segments.contiguous();
  const bool* fl = full_c.data_ptr<bool>();
  const int64_t* sz = sizes_c.data_ptr<int64_t>();
  const int64_t Z = sizes_c.numel();

  std::vector<Segment> queue;
  const int64_t S = seg_c.size(1);
  queue.reserve(S + 16);
  const int64_t* sg = seg_c.data_ptr<int64_t>();
  for (int64_t k = 0; k < S; ++k) {
    const Segment s{sg[k], sg[S + k], sg[2 * S + k], sg[3 * S + k]};
    TORCH_CHECK(s.image >= 0 && s.image < N, op, ": segment image ", s.image, " out of range [0, ", N, ")");
    TORCH_CHECK(s.start >= 0 && s.start < s.stop && s.stop <= stride, op, ": segment slots [", s.start, ", ", s.stop,
                ") out of range [0, ", stride, ")");
    TORCH_CHECK(s.tag == kStep || s.tag == kScore || s.tag == kLow, op, ": segment tag ", s.tag, " unknown");
    queue.push_back(s);
  }

  // The window's batches, as pieces of segments (image, first slot, slots taken, tag) and completed steps: the
  // blocks are written at the end, straight into the output, in tight loops over each piece's slots.
  struct Piece {
    int64_t image, start, take, tag;
  };
  std::vector<Piece> pieces;
  std::vector<int64_t> steps, batches, done;  // steps: (row, count, step) triples
  std::vector<int64_t> piece_first{0}, step_first{0}, going_step, going_low;
  size_t head = 0;
  for (int64_t w = 0; w < max_batches && head < queue.size(); ++w) {
    going_step.clear(), going_low.clear();
    const int64_t done_offset = static_cast<int64_t>(done.size()) / 5;
    bool stop = false;
    int64_t n = 0;
    // take the next batch_size slots
    while (n < batch_size && head < queue.size()) {
      Segment& s = queue[head];
      const int64_t take = std::min(batch_size - n, s.stop - s.start);
      pieces.push_back(Piece{s.image, s.start, take, s.tag});
      n += take;
      s.start += take;
      if (s.start < s.stop) break;  // it goes on in the next batch
      ++head;
      const int64_t i = s.image;
      if (s.tag == kScore) {  // a new round's input: the host decides what follows
        done.insert(done.end(), {w, i, s.tag, cnt[i], stp[i]});
        stop = true;
        continue;
      }
      TORCH_CHECK(cnt[i] >= 1, op, ": image ", i, " completes a step with no candidate left");
      done.insert(done.end(), {w, i, s.tag, cnt[i], stp[i]});
      steps.insert(steps.end(), {i, cnt[i], stp[i]});
      cnt[i] -= 1;
      stp[i] += 1;
      if (cnt[i] > 0) {
        (s.tag == kStep ? going_step : going_low).push_back(i);
      } else if (stop_at_round_end) {
        stop = true;
      }
    }
    for (const auto* going : {&going_step, &going_low}) {
      for (int64_t i : *going) {
        const int64_t tag = (rescore > 0 && !fl[i] && cnt[i] > rescore) ? kLow : kStep;
        queue.push_back(Segment{i, 0, cnt[i], tag});
      }
    }
    // the batch's shape: the smallest of `sizes` that holds it (its own size beyond them)
    const int64_t* fit = std::lower_bound(sz, sz + Z, n);
    const int64_t bp = fit == sz + Z ? n : *fit;
    batches.insert(batches.end(), {0, bp, n, done_offset, static_cast<int64_t>(done.size()) / 5 - done_offset});
    piece_first.push_back(static_cast<int64_t>(pieces.size()));
    step_first.push_back(static_cast<int64_t>(steps.size()) / 3);
    if (stop) break;
  }
  const int64_t W = static_cast<int64_t>(batches.size()) / 5, D = static_cast<int64_t>(done.size()) / 5;
  int64_t total = 0;
  for (int64_t w = 0; w < W; ++w) {
    batches[5 * w] = total;
    total += kRecordRows * batches[5 * w + 1];
  }
  auto i64 = at::TensorOptions().dtype(at::kLong);
  at::Tensor records = at::empty({total}, i64);
  int64_t* rec = records.data_ptr<int64_t>();
  for (int64_t w = 0; w < W; ++w) {
    const int64_t bp = batches[5 * w + 1], n = batches[5 * w + 2];
    int64_t* r = rec + batches[5 * w];
    int64_t b = 0, last = 0;
    for (int64_t k = piece_first[w]; k < piece_first[w + 1]; ++k) {
      const Piece& pc = pieces[k];
      const int64_t flat = pc.image * stride + pc.start;
      std::fill(r + b, r + b + pc.take, pc.image);
      for (int64_t j = 0; j < pc.take; ++j) r[bp + b + j] = flat + j;
      std::fill(r + 5 * bp + b, r + 5 * bp + b + pc.take, pc.tag);
      b += pc.take;
      last = pc.image;
    }
    std::fill(r + n, r + bp, last);  // padding rows: the last candidate's image, no slot, no tag
    std::fill(r + bp + n, r + 2 * bp, -1);
    std::fill(r + 5 * bp + n, r + 6 * bp, -1);
    const int64_t s0 = step_first[w], d = step_first[w + 1] - s0;
    for (int64_t k = 0; k < d; ++k) {
      r[2 * bp + k] = steps[3 * (s0 + k)];
      r[3 * bp + k] = steps[3 * (s0 + k) + 1];
      r[4 * bp + k] = steps[3 * (s0 + k) + 2];
    }
    std::fill(r + 2 * bp + d, r + 3 * bp, -1);  // no step past the batch's own
    std::fill(r + 3 * bp + d, r + 4 * bp, 1);
    std::fill(r + 4 * bp + d, r + 5 * bp, 0);
  }
  auto to_tensor = [&](const std::vector<int64_t>& v, std::vector<int64_t> shape) {
    at::Tensor t = at::empty(shape, i64);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t;
  };
  const int64_t left = static_cast<int64_t>(queue.size() - head);
  at::Tensor rest = at::empty({4, left}, i64);
  int64_t* rp = rest.data_ptr<int64_t>();
  for (int64_t k = 0; k < left; ++k) {
    const Segment& s = queue[head + k];
    rp[k] = s.image, rp[left + k] = s.start, rp[2 * left + k] = s.stop, rp[3 * left + k] = s.tag;
  }
  return {records, to_tensor(batches, {W, 5}), to_tensor(done, {D, 5}), rest};
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("schedule_window", &schedule_window_cpu); }

}  // namespace overinterp_fast
