// CPU kernel of overinterp_fast::rect_fill: weighted rectangle coverage via 2D difference arrays.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "../rect_fill.h"

namespace overinterp_fast {
namespace {

at::Tensor rect_fill_cpu(const at::Tensor& rects, const at::Tensor& owner, const at::Tensor& weights, int64_t n,
                         int64_t height, int64_t width, bool check_indices) {
  check_rect_fill(rects, owner, weights, n, height, width, check_indices);
  const int64_t H = height, W = width, R = rects.size(0), W1 = width + 1, plane = (height + 1) * (width + 1);
  at::Tensor diff = at::zeros({n, H + 1, W1}, rects.options());
  auto rc = rects.contiguous(), oc = owner.contiguous(), wc = weights.contiguous();
  const int64_t* r = rc.data_ptr<int64_t>();
  const int64_t* o = oc.data_ptr<int64_t>();
  const int64_t* w = wc.data_ptr<int64_t>();
  int64_t* d = diff.data_ptr<int64_t>();
  for (int64_t i = 0; i < R; ++i) {  // R is small next to n * H * W: corners serially
    const int64_t y0 = std::clamp<int64_t>(r[4 * i], 0, H), x0 = std::clamp<int64_t>(r[4 * i + 1], 0, W);
    const int64_t y1 = std::clamp<int64_t>(r[4 * i + 2], 0, H), x1 = std::clamp<int64_t>(r[4 * i + 3], 0, W);
    if (y0 >= y1 || x0 >= x1) continue;
    int64_t* p = d + o[i] * plane;
    p[y0 * W1 + x0] += w[i];
    p[y0 * W1 + x1] -= w[i];
    p[y1 * W1 + x0] -= w[i];
    p[y1 * W1 + x1] += w[i];
  }
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      int64_t* p = d + k * plane;
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 1; x < W; ++x) p[y * W1 + x] += p[y * W1 + x - 1];
      for (int64_t y = 1; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) p[y * W1 + x] += p[(y - 1) * W1 + x];
    }
  });
  return diff.narrow(1, 0, H).narrow(2, 0, W).contiguous();
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CPU, m) { m.impl("rect_fill", &rect_fill_cpu); }

}  // namespace overinterp_fast
