// Host-side index validation shared by the CPU and CUDA kernels.
//
// A bad index inside a CUDA kernel can only trip a device-side assert, which
// poisons the CUDA context for the rest of the process. Every index a kernel
// reads is therefore checked here first, on any device, with the same one-line
// RuntimeError on the CPU and on CUDA. On CUDA the min and max of every checked
// tensor reach the host in one transfer (one device synchronisation per call).
// All tensors of one call are on one device (the callers check that first).
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <initializer_list>
#include <vector>

namespace overinterp_fast {

struct RangeCheck {
  const at::Tensor& values;  // int64, any shape
  int64_t lo;                // values must lie in [lo, hi)
  int64_t hi;
  const char* what;
};

inline void check_ranges(const char* op, std::initializer_list<RangeCheck> checks) {
  std::vector<int64_t> bounds;  // (min, max) of each non-empty tensor, in order
  if (checks.begin()->values.is_cpu()) {
    for (const auto& c : checks) {  // a plain scan: no allocation on the CPU
      if (c.values.numel() == 0) continue;
      const at::Tensor t = c.values.contiguous();
      const int64_t* p = t.data_ptr<int64_t>();
      int64_t lo = p[0], hi = p[0];
      for (int64_t i = 1, n = t.numel(); i < n; ++i) {
        lo = std::min(lo, p[i]);
        hi = std::max(hi, p[i]);
      }
      bounds.push_back(lo);
      bounds.push_back(hi);
    }
  } else {
    std::vector<at::Tensor> parts;
    for (const auto& c : checks) {
      if (c.values.numel() == 0) continue;
      auto [lo, hi] = at::aminmax(c.values);
      parts.push_back(lo.reshape({1}));
      parts.push_back(hi.reshape({1}));
    }
    if (parts.empty()) return;
    const at::Tensor host = at::cat(parts).to(at::kCPU);  // the one synchronisation
    bounds.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  }
  const int64_t* v = bounds.data();
  for (const auto& c : checks) {
    if (c.values.numel() == 0) continue;
    const int64_t lo = v[0], hi = v[1];
    v += 2;
    TORCH_CHECK(lo >= c.lo, op, ": ", c.what, " ", lo, " out of range [", c.lo, ", ", c.hi, ")");
    TORCH_CHECK(hi < c.hi, op, ": ", c.what, " ", hi, " out of range [", c.lo, ", ", c.hi, ")");
  }
}

}  // namespace overinterp_fast
