// The CPU loop of the candidate-writing ops (mask_apply, exact_candidates): shared by their kernels.
#pragma once
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "../mask_apply.h"

namespace overinterp_fast {
namespace cpu {

// dst[e] = keep[e] ? src[e] : fill[e], with both values loaded unconditionally so that the compiler turns the
// select into a vector blend.
template <typename scalar_t>
inline void blend(scalar_t* __restrict__ dst, const scalar_t* __restrict__ src, const scalar_t* __restrict__ fill,
                  const uint8_t* __restrict__ keep, int64_t n) {
  for (int64_t e = 0; e < n; ++e) {
    const scalar_t a = src[e], z = fill[e];
    dst[e] = keep[e] ? a : z;
  }
}

// Floating types of 4 and 8 bytes: the same select on the bit patterns, with a mask made from keep (0 or all ones),
// which every x86-64 and ARM vector unit does without a blend instruction; exact for every value (NaN, -0.0).
template <typename bits_t, typename scalar_t>
inline void blend_bits(scalar_t* __restrict__ dst, const scalar_t* __restrict__ src,
                       const scalar_t* __restrict__ fill, const uint8_t* __restrict__ keep, int64_t n) {
  static_assert(sizeof(bits_t) == sizeof(scalar_t), "same width");
  bits_t* __restrict__ d = reinterpret_cast<bits_t*>(dst);
  const bits_t* __restrict__ a = reinterpret_cast<const bits_t*>(src);
  const bits_t* __restrict__ z = reinterpret_cast<const bits_t*>(fill);
  for (int64_t e = 0; e < n; ++e) {
    const bits_t m = bits_t(0) - bits_t(keep[e]);
    d[e] = (a[e] & m) | (z[e] & ~m);
  }
}

template <>
inline void blend<float>(float* __restrict__ dst, const float* __restrict__ src, const float* __restrict__ fill,
                         const uint8_t* __restrict__ keep, int64_t n) {
  blend_bits<uint32_t>(dst, src, fill, keep, n);
}

template <>
inline void blend<double>(double* __restrict__ dst, const double* __restrict__ src, const double* __restrict__ fill,
                          const uint8_t* __restrict__ keep, int64_t n) {
  blend_bits<uint64_t>(dst, src, fill, keep, n);
}

// What each row of a kept candidates buffer holds (exact_candidates' row memo, csrc/exact_step.h): per row the
// image, removed feature and the image's snapshot version it was written from (held rows, each [B]); per image the
// present row of its snapshot (snap, bool [N, p]) and the snapshot's version (int64 [N]). Null: no memo.
struct RowMemo {
  int64_t* image = nullptr;
  int64_t* feature = nullptr;
  int64_t* version_of_row = nullptr;
  bool* snap = nullptr;
  int64_t* version = nullptr;
};

// Per image of a call: its snapshot's version before and after the call, the features whose presence differs
// from the snapshot, and whether rows written from the old snapshot are patched (few elements change) or rewritten.
struct ImageUpdate {
  int64_t old_version = 0, new_version = 0;
  std::vector<int64_t> diff;
  bool patch = false;
};

template <typename scalar_t>
inline void mask_apply_cpu_impl(const MaskApplyPlan& plan, const bool* present, const int64_t* cand_image,
                         const int64_t* cand_row, const int64_t* cand_feature, const RowMemo* memo = nullptr) {
  const int64_t E = plan.elems, P = plan.num_features;
  const scalar_t* base = plan.base.data_ptr<scalar_t>();
  const scalar_t* baseline = plan.baseline.data_ptr<scalar_t>();
  const bool per_image_baseline = plan.baseline.size(0) > 1;
  const int64_t* fm = plan.fm.data_ptr<int64_t>();
  scalar_t* out = static_cast<scalar_t*>(plan.out_flat.data_ptr());
  // The elements of each feature (a counting sort of the feature map, O(E) per call): a candidate's removed
  // feature is written from this list instead of being compared at every element.
  std::vector<int64_t> first(P + 1, 0), elems(E);
  for (int64_t e = 0; e < E; ++e) ++first[fm[e] + 1];
  for (int64_t f = 0; f < P; ++f) first[f + 1] += first[f];
  {
    std::vector<int64_t> next(first.begin(), first.end() - 1);
    for (int64_t e = 0; e < E; ++e) elems[next[fm[e]]++] = e;
  }
  // With a memo: each image's snapshot brought up to its present row (serially, once per image), and each row
  // pointed at its image's update. The rows a call writes are described by (image, removed feature, new version).
  std::vector<ImageUpdate> updates;
  std::vector<int32_t> update_of;
  if (memo != nullptr) {
    std::unordered_map<int64_t, int32_t> index;
    update_of.resize(plan.batch);
    int64_t last = -1;
    int32_t k = -1;
    for (int64_t b = 0; b < plan.batch; ++b) {
      const int64_t img = cand_image[b];
      if (img != last) {
        auto [it, fresh] = index.emplace(img, static_cast<int32_t>(updates.size()));
        if (fresh) {
          ImageUpdate u;
          const bool* pres = present + cand_row[b] * P;
          bool* snap = memo->snap + img * P;
          int64_t changed = 0;
          for (int64_t f = 0; f < P; ++f) {
            if (snap[f] != pres[f]) {
              u.diff.push_back(f);
              changed += first[f + 1] - first[f];
              snap[f] = pres[f];
            }
          }
          u.old_version = memo->version[img];
          u.new_version = u.old_version + (u.diff.empty() ? 0 : 1);
          memo->version[img] = u.new_version;
          u.patch = 2 * changed <= E;  // else a rewrite costs about as much
          updates.push_back(std::move(u));
        }
        k = it->second, last = img;
      }
      update_of[b] = k;
    }
  }
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(E, 1));
  at::parallel_for(0, plan.batch, grain, [&](int64_t begin, int64_t end) {
    // Candidates of one step share their image and present row and come in runs: the run's masked input is made
    // once (a branch-free blend of the image and the baseline, vectorized), and each candidate is a copy of it
    // with its removed feature's elements set to the baseline.
    std::vector<scalar_t> current;
    std::vector<uint8_t> keep;
    int64_t run_row = -1, run_img = -1;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t img = cand_image[b], row = cand_row[b], removed = cand_feature[b];
      const scalar_t* __restrict__ src = base + img * E;
      const scalar_t* __restrict__ fill = baseline + (per_image_baseline ? img * E : 0);
      scalar_t* __restrict__ dst = out + b * E;
      if (memo != nullptr) {
        const ImageUpdate& u = updates[update_of[b]];
        const int64_t was = memo->feature[b];
        const bool held = memo->image[b] == img && memo->version_of_row[b] == u.old_version && was >= -1 && was < P;
        memo->image[b] = img, memo->feature[b] = removed, memo->version_of_row[b] = u.new_version;
        if (held && u.patch) {  // the row holds this image's candidate of the old snapshot: patch what changed
          const bool* pres = present + row * P;
          auto put = [&](int64_t f) {
            const bool on = pres[f] && f != removed;
            for (int64_t j = first[f]; j < first[f + 1]; ++j) dst[elems[j]] = on ? src[elems[j]] : fill[elems[j]];
          };
          if (was >= 0 && was != removed) put(was);
          for (int64_t f : u.diff) put(f);
          if (removed >= 0) put(removed);
          continue;
        }
      }
      if (row != run_row || img != run_img) {
        current.resize(E), keep.resize(E);
        const bool* pres = present + row * P;
        for (int64_t e = 0; e < E; ++e) keep[e] = pres[fm[e]];
        blend(current.data(), src, fill, keep.data(), E);
        run_row = row, run_img = img;
      }
      std::memcpy(dst, current.data(), E * sizeof(scalar_t));
      if (removed >= 0) {
        for (int64_t j = first[removed]; j < first[removed + 1]; ++j) dst[elems[j]] = fill[elems[j]];
      }
    }
  });
}

}  // namespace cpu
}  // namespace overinterp_fast
