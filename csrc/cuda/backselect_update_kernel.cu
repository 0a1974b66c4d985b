// CUDA kernel of overinterp_fast::backselect_update: one block per updated row.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../backselect_update.h"
#include "backselect_update.cuh"

namespace overinterp_fast {
namespace {

void backselect_update_cuda(const at::Tensor& scores, const at::Tensor& rows, const at::Tensor& counts,
                            const at::Tensor& steps, const at::Tensor& remaining, const at::Tensor& present,
                            const at::Tensor& order, const at::Tensor& values,
                           bool check_indices) {
  const c10::cuda::CUDAGuard guard(scores.device());
  check_backselect_update(scores, rows, counts, steps, remaining, present, order, values, check_indices);
  const int64_t K = rows.size(0);
  if (K == 0) return;
  auto rows_c = rows.contiguous(), counts_c = counts.contiguous(), steps_c = steps.contiguous();
  cuda::launch_backselect_update(
      scores.data_ptr<double>(), rows_c.data_ptr<int64_t>(), counts_c.data_ptr<int64_t>(),
      steps_c.data_ptr<int64_t>(), remaining.data_ptr<int64_t>(), present.data_ptr<bool>(),
      order.data_ptr<int64_t>(), values.data_ptr<double>(), K, scores.size(0), scores.size(1), present.size(1),
      order.size(1), at::cuda::getCurrentCUDAStream());
}

}  // namespace

TORCH_LIBRARY_IMPL(overinterp_fast, CUDA, m) { m.impl("backselect_update", &backselect_update_cuda); }

}  // namespace overinterp_fast
