// CPU kernel of overinterp_fast::patch_gather: windows of stored activation maps with
// each candidate's recomputed patch laid over them (incremental inference).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(w * C, 1));
  // One task per output row (b, i).
  at::parallel_for(0, B * h, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / h, i = t - b * h;
      const int64_t y = ro[2 * b] + i, x0 = ro[2 * b + 1];
      const scalar_t* src = S + img[b] * ss.n;
      scalar_t* dst = O + b * os.n + i * os.h;
      // Patch values are used on valid box ∩ patch extent.
      const int64_t py = po[2 * b], px = po[2 * b + 1];
      const int64_t vy0 = std::max(va[4 * b], py), vy1 = std::min(va[4 * b + 2], py + ph);
      const int64_t vx0 = std::max(va[4 * b + 1], px), vx1 = std::min(va[4 * b + 3], px + pw);
      const bool row_in_map = y >= 0 && y < H;
      const bool row_in_patch = P != nullptr && y >= vy0 && y < vy1;
      bool changed = false;
      auto element = [&](int64_t j, int64_t c) {
        const int64_t x = x0 + j;
        scalar_t v;
        if (!row_in_map || x < 0 || x >= W) {
          v = pad;
        } else {
          const scalar_t s = src[c * ss.c + y * ss.h + x * ss.w];
          if (row_in_patch && x >= vx0 && x < vx1) {
            v = P[b * ps.n + c * ps.c + (y - py) * ps.h + (x - px) * ps.w];
            changed |= !(v == s);
          } else {
            v = s;
          }
        }
        dst[j * os.w + c * os.c] = v;
      };
      if (cl) {
        for (int64_t j = 0; j < w; ++j)
          for (int64_t c = 0; c < C; ++c) element(j, c);
      } else {
        for (int64_t c = 0; c < C; ++c)
          for (int64_t j = 0; j < w; ++j) element(j, c);
      }
      row_changed[t] = changed;
    }
  });
}

std::tuple<at::Tensor, at::Tensor> patch_gather_cpu(const at::Tensor& stored, const at::Tensor& image,
                                                    const at::Tensor& patch, const at::Tensor& patch_origin,
                                                    const at::Tensor& valid, const at::Tensor& region_origin,
                                                    int64_t height, int64_t width, double pad_value) {
  PatchGatherPlan plan =
      plan_patch_gather(stored, image, patch, patch_origin, valid, region_origin, height, width);
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
