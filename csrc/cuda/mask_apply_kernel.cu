// CUDA kernel of overinterp_fast::mask_apply: writes a batch of masked candidates.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../mask_apply.h"
#include "launch.cuh"
#include "mask_apply.cuh"

namespace overinterp_fast {
namespace {

at::Tensor mask_apply_cuda(const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
                           const at::Tensor& present, const at::Tensor& cand_image, const at::Tensor& cand_row,
                           const at::Tensor& cand_feature, bool check_indices) {
  const c10::cuda::CUDAGuard guard(base.device());
  MaskApplyPlan plan =
      plan_mask_apply(base, baseline, feature_map, present, cand_image, cand_row, cand_feature, check_indices);
  const int64_t total = plan.batch * plan.elems;
  if (total == 0) return plan.out;
  auto present_c = present.contiguous();
  auto img = cand_image.contiguous(), row = cand_row.contiguous(), feat = cand_feature.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, base.scalar_type(), "mask_apply_cuda", [&] {
    cuda::mask_apply_kernel<scalar_t><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(
        plan.base.data_ptr<scalar_t>(), plan.baseline.data_ptr<scalar_t>(), plan.baseline.size(0) > 1,
        plan.fm.data_ptr<int64_t>(), present_c.data_ptr<bool>(), img.data_ptr<int64_t>(),
        row.data_ptr<int64_t>(), feat.data_ptr<int64_t>(), nullptr, static_cast<scalar_t*>(plan.out_flat.data_ptr()),
        total, plan.elems, plan.num_features, base.size(0), present.size(0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return plan.out;
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CUDA, m) { m.impl("mask_apply", &mask_apply_cuda); }

}  // namespace overinterp_fast
