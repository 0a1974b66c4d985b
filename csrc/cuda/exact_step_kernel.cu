// CUDA kernels of the exact SIS step: overinterp_fast::exact_candidates and overinterp_fast::exact_scores.
// Neither reads anything back to the host (with check_indices=false), so a step made of them can be captured in a
// CUDA graph.
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../exact_step.h"
#include "backselect_update.cuh"
#include "launch.cuh"
#include "mask_apply.cuh"

namespace overinterp_fast {
namespace {

void exact_candidates_cuda(const at::Tensor& base, const at::Tensor& baseline, const at::Tensor& feature_map,
                           const at::Tensor& present, const at::Tensor& remaining, const at::Tensor& sched,
                           const at::Tensor& out, bool check_indices, const c10::optional<at::Tensor>& held,
                           const c10::optional<at::Tensor>& snap, const c10::optional<at::Tensor>& version) {
  const c10::cuda::CUDAGuard guard(base.device());
  check_exact_candidates(base, baseline, feature_map, present, remaining, sched, out, check_indices);
  const bool with_memo = check_row_memo("exact_candidates", held, snap, version, present, sched.size(1));
  MaskApplyPlan plan;
  layout_mask_plan(plan, base, baseline, feature_map, present.size(1), sched.size(1), out);
  if (with_memo) {  // every row is rewritten below: the memo only follows
    update_row_memo(sched[0], slot_features(remaining, sched[1]), present, *held, *snap, *version);
  }
  const int64_t total = plan.batch * plan.elems;
  if (total == 0) return;
  auto present_c = present.contiguous();
  const int64_t* image = sched.data_ptr<int64_t>();
  const int64_t* slot = image + sched.stride(0);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, base.scalar_type(), "exact_candidates_cuda", [&] {
    cuda::mask_apply_kernel<scalar_t><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(
        plan.base.data_ptr<scalar_t>(), plan.baseline.data_ptr<scalar_t>(), plan.baseline.size(0) > 1,
        plan.fm.data_ptr<int64_t>(), present_c.data_ptr<bool>(), image, image, slot,
        remaining.data_ptr<int64_t>(), static_cast<scalar_t*>(plan.out_flat.data_ptr()), total, plan.elems,
        plan.num_features, base.size(0), present.size(0));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// f[b] = probs[b, targets[image[b]]] as float64 into scores[slot[b]] (slot >= 0), and its sum into total.
template <typename scalar_t>
__global__ void exact_scores_kernel(const scalar_t* __restrict__ probs, const int64_t* __restrict__ targets,
                                    const int64_t* __restrict__ image, const int64_t* __restrict__ slot,
                                    double* __restrict__ scores, double* __restrict__ total, int64_t B, int64_t K) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < B;
       b += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    if (slot[b] < 0) continue;  // a padding row
    const double f = static_cast<double>(probs[b * K + targets[image[b]]]);
    scores[slot[b]] = f;
    atomicAdd(total, f * 0.0);  // 0, or NaN once a score is not finite: exact in any order
  }
}

void exact_scores_cuda(const at::Tensor& probs, const at::Tensor& targets, const at::Tensor& sched,
                       const at::Tensor& done, const at::Tensor& scores, const at::Tensor& total, const at::Tensor& remaining,
                       const at::Tensor& present, const at::Tensor& order, const at::Tensor& values,
                       bool check_indices) {
  const c10::cuda::CUDAGuard guard(scores.device());
  check_exact_scores(probs, targets, sched, done, scores, total, remaining, present, order, values, check_indices);
  const int64_t B = sched.size(1), D = done.size(1);
  const int64_t* image = sched.data_ptr<int64_t>();
  const int64_t* rows = done.data_ptr<int64_t>();
  const int64_t ds = done.stride(0);
  const at::Tensor probs_c = probs.contiguous(), targets_c = targets.contiguous();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (B > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, probs.scalar_type(), "exact_scores_cuda", [&] {
      exact_scores_kernel<scalar_t><<<blocks_for(B), kThreadsPerBlock, 0, stream>>>(
          probs_c.data_ptr<scalar_t>(), targets_c.data_ptr<int64_t>(), image, image + sched.stride(0),
          scores.data_ptr<double>(), total.data_ptr<double>(), B, probs.size(1));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  cuda::launch_backselect_update(scores.data_ptr<double>(), rows, rows + ds, rows + 2 * ds,
                                 remaining.data_ptr<int64_t>(), present.data_ptr<bool>(), order.data_ptr<int64_t>(),
                                 values.data_ptr<double>(), D, scores.size(0), scores.size(1), present.size(1),
                                 order.size(1), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CUDA, m) {
  m.impl("exact_candidates", &exact_candidates_cuda);
  m.impl("exact_scores", &exact_scores_cuda);
}

}  // namespace overinterp_fast
