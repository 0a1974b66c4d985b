"""The ops: compiled C++/CUDA kernels (``overinterp_fast._C``, schema in csrc/ops.cpp) behind thin wrappers
(:mod:`.kernels`), and their pure-PyTorch versions (:mod:`.pure`), which run wherever a kernel is missing or
fails its self-check."""
from . import kernels, pure
from .kernels import (ENV_VAR, MODES, OpInfo, backselect_update, call, exact_candidates, exact_scores, extension_loaded,
                      extension_ops, has_cuda_kernels, kernel, mask_apply, mode, ops_info, patch_gather, rect_fill,
                      schedule_window, self_check)

__all__ = ["ENV_VAR", "MODES", "OpInfo", "backselect_update", "call", "exact_candidates", "exact_scores",
           "extension_loaded", "extension_ops", "schedule_window",
           "has_cuda_kernels", "kernel", "mask_apply", "mode", "ops_info", "patch_gather", "rect_fill", "self_check",
           "kernels", "pure"]
