// The CPU loop of the candidate-writing ops (mask_apply, exact_candidates): shared by their kernels.
#pragma once
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
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

template <typename scalar_t>
inline void mask_apply_cpu_impl(const MaskApplyPlan& plan, const bool* present, const int64_t* cand_image,
                         const int64_t* cand_row, const int64_t* cand_feature) {
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
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(E, 1));
  at::parallel_for(0, plan.batch, grain, [&](int64_t begin, int64_t end) {
    // Candidates of one step share their image and present row and come in runs: the run's masked input is made
    // once (a branch-free blend of the image and the baseline, vectorized), and each candidate is a copy of it
    // with its removed feature's elements set to the baseline.
    std::vector<scalar_t> current(E);
    std::vector<uint8_t> keep(E);
    int64_t run_row = -1, run_img = -1;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t img = cand_image[b], row = cand_row[b], removed = cand_feature[b];
      const scalar_t* __restrict__ fill = baseline + (per_image_baseline ? img * E : 0);
      if (row != run_row || img != run_img) {
        const bool* pres = present + row * P;
        for (int64_t e = 0; e < E; ++e) keep[e] = pres[fm[e]];
        blend(current.data(), base + img * E, fill, keep.data(), E);
        run_row = row, run_img = img;
      }
      scalar_t* __restrict__ dst = out + b * E;
      std::memcpy(dst, current.data(), E * sizeof(scalar_t));
      if (removed >= 0) {
        for (int64_t j = first[removed]; j < first[removed + 1]; ++j) dst[elems[j]] = fill[elems[j]];
      }
    }
  });
}

}  // namespace cpu
}  // namespace overinterp_fast
