// CPU kernel of overinterp_fast::patch_gather: windows of stored activation maps with
// each candidate's recomputed patch laid over them (incremental inference).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../patch_gather.h"

namespace overinterp_fast {
namespace {

template <typename scalar_t>
void patch_gather_cpu_impl(const PatchGatherPlan& plan, const at::Tensor& stored, const at::Tensor& patch,
                           scalar_t pad, uint8_t* row_changed) {
  const int64_t B = plan.batch, C = plan.channels, H = plan.map_h, W = plan.map_w;
  const int64_t h = plan.out.size(2), w = plan.out.size(3), ph = plan.patch_h, pw = plan.patch_w;
  const Strides4 ss = strides4(stored), os = strides4(plan.out);
  const Strides4 ps = ph > 0 ? strides4(patch) : Strides4{0, 0, 0, 0};
  const scalar_t* S = stored.data_ptr<scalar_t>();
  const scalar_t* P = ph > 0 ? patch.data_ptr<scalar_t>() : nullptr;
  scalar_t* O = plan.out.data_ptr<scalar_t>();
  const int64_t* img = plan.image.data_ptr<int64_t>();
  const int64_t* po = plan.patch_origin.data_ptr<int64_t>();
  const int64_t* va = plan.valid.data_ptr<int64_t>();
  const int64_t* ro = plan.region_origin.data_ptr<int64_t>();
  const bool cl = plan.channels_last;
  // out is dense in its memory format: NCHW rows have unit stride along x, channels_last pixels along c.
  TORCH_INTERNAL_ASSERT(cl ? os.c == 1 : os.w == 1, "patch_gather: unexpected output strides");
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(w * C, 1));
  // One task per output row (b, i): pad outside the map, a bulk copy of the stored row inside it, then the
  // candidate's patch laid over valid box ∩ patch extent ∩ map (compared with the stored values it replaces).
  at::parallel_for(0, B * h, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / h, i = t - b * h;
      const int64_t y = ro[2 * b] + i, x0 = ro[2 * b + 1];
      const scalar_t* src = S + img[b] * ss.n + y * ss.h;
      scalar_t* dst = O + b * os.n + i * os.h;
      const bool row_in_map = y >= 0 && y < H;
      // Output columns [ja, jb) lie inside the map (x = x0 + j in [0, W)).
      const int64_t ja = row_in_map ? std::min(w, std::max<int64_t>(0, -x0)) : w;
      const int64_t jb = row_in_map ? std::max(ja, std::min(w, W - x0)) : w;
      if (cl) {
        for (int64_t j = 0; j < w; ++j) {
          scalar_t* d = dst + j * os.w;
          if (j < ja || j >= jb) {
            std::fill(d, d + C, pad);
          } else if (ss.c == 1) {
            std::memcpy(d, src + (x0 + j) * ss.w, C * sizeof(scalar_t));
          } else {
            const scalar_t* s0 = src + (x0 + j) * ss.w;
            for (int64_t c = 0; c < C; ++c) d[c] = s0[c * ss.c];
          }
        }
      } else {
        for (int64_t c = 0; c < C; ++c) {
          scalar_t* d = dst + c * os.c;
          const scalar_t* s0 = src + c * ss.c + x0 * ss.w;
          std::fill(d, d + ja, pad);
          if (ss.w == 1) {
            if (jb > ja) std::memcpy(d + ja, s0 + ja, (jb - ja) * sizeof(scalar_t));
          } else {
            for (int64_t j = ja; j < jb; ++j) d[j] = s0[j * ss.w];
          }
          std::fill(d + jb, d + w, pad);
        }
      }
      // The patch: rows and columns where valid box, patch extent and map overlap.
      bool changed = false;
      const int64_t py = po[2 * b], px = po[2 * b + 1];
      const int64_t vy0 = std::max(va[4 * b], py), vy1 = std::min(va[4 * b + 2], py + ph);
      if (P != nullptr && row_in_map && y >= vy0 && y < vy1) {
        const int64_t vx0 = std::max(va[4 * b + 1], px), vx1 = std::min(va[4 * b + 3], px + pw);
        const int64_t j0 = std::max(ja, vx0 - x0), j1 = std::min(jb, vx1 - x0);
        const scalar_t* prow = P + b * ps.n + (y - py) * ps.h;
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t x = x0 + j;
          for (int64_t c = 0; c < C; ++c) {
            const scalar_t v = prow[c * ps.c + (x - px) * ps.w];
            scalar_t& o = dst[j * os.w + c * os.c];
            changed |= !(v == o);
            o = v;
          }
        }
      }
      row_changed[t] = changed;
    }
  });
}

std::tuple<at::Tensor, at::Tensor> patch_gather_cpu(const at::Tensor& stored, const at::Tensor& image,
                                                    const at::Tensor& patch, const at::Tensor& patch_origin,
                                                    const at::Tensor& valid, const at::Tensor& region_origin,
                                                    int64_t height, int64_t width, double pad_value,
                                                    bool check_indices) {
  PatchGatherPlan plan =
      plan_patch_gather(stored, image, patch, patch_origin, valid, region_origin, height, width,
                        check_indices);
  const int64_t rows = plan.batch * height;
  if (rows == 0 || plan.channels == 0 || width == 0) return {plan.out, plan.changed};
  std::vector<uint8_t> row_changed(rows, 0);
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, stored.scalar_type(), "patch_gather_cpu", [&] {
    patch_gather_cpu_impl<scalar_t>(plan, stored, patch, static_cast<scalar_t>(pad_value), row_changed.data());
  });
  bool* changed = plan.changed.data_ptr<bool>();
  for (int64_t t = 0; t < rows; ++t) changed[t / height] |= row_changed[t] != 0;
  return {plan.out, plan.changed};
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("patch_gather", &patch_gather_cpu); }

}  // namespace overinterp_fast
