"""The compiled operators (overinterp_fast._C), their fake implementations, and thin wrappers.

The schemas live in csrc/ops.cpp; CPU and CUDA kernels are registered per dispatch
key in csrc/cpu and csrc/cuda. Importing this module loads the library once and
raises a clear ImportError when the extension was not built.
"""
from __future__ import annotations

import torch

try:
    from . import _C  # noqa: F401  (loading the library registers the ops)
except ImportError as exc:  # pragma: no cover - exercised only on broken installs
    raise ImportError(
        "overinterp_fast's compiled extension (overinterp_fast._C) could not be loaded: "
        f"{exc}. Build it with `pip install --no-build-isolation -e .` from the repository root "
        "(in the environment whose torch it must link against), or run ./scripts/test, which does."
    ) from exc

_lib = torch.ops.overinterp_fast


def has_cuda_kernels() -> bool:
    """True when the extension was built with its CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("overinterp_fast::mask_apply", "CUDA")


@torch.library.register_fake("overinterp_fast::mask_apply")
def _mask_apply_fake(base, baseline, feature_map, present, cand_image, cand_row, cand_feature):
    torch._check(base.dim() >= 2)
    torch._check(feature_map.shape == base.shape[1:])
    torch._check(cand_image.shape == cand_row.shape == cand_feature.shape)
    shape = (cand_image.shape[0], *base.shape[1:])
    channels_last = (
        base.dim() == 4
        and not base.is_contiguous()
        and base.is_contiguous(memory_format=torch.channels_last)
    )
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return base.new_empty(shape).contiguous(memory_format=fmt)


@torch.library.register_fake("overinterp_fast::backselect_update")
def _backselect_update_fake(scores, rows, counts, steps, remaining, present, order, values):
    torch._check(rows.shape == counts.shape == steps.shape)
    return None


@torch.library.register_fake("overinterp_fast::rect_fill")
def _rect_fill_fake(rects, owner, weights, n, height, width):
    torch._check(rects.dim() == 2 and rects.shape[1] == 4)
    return rects.new_empty((n, height, width))


def rect_fill(
    rects: torch.Tensor, owner: torch.Tensor, weights: torch.Tensor, n: int, height: int, width: int
) -> torch.Tensor:
    """Weighted coverage of unions of rectangles, exactly (2D difference arrays and prefix sums).

    Args:
        rects: int64 [R, 4], (y0, x0, y1, x1) half-open, clipped to [0, height] x [0, width].
        owner: int64 [R] in [0, n): the map each rectangle is painted into.
        weights: int64 [R].

    Returns:
        int64 [n, height, width]: ``out[o, y, x]`` = sum of the weights of owner o's
        rectangles that cover (y, x).
    """
    return _lib.rect_fill(rects, owner, weights, n, height, width)


def mask_apply(
    base: torch.Tensor,
    baseline: torch.Tensor,
    feature_map: torch.Tensor,
    present: torch.Tensor,
    cand_image: torch.Tensor,
    cand_row: torch.Tensor,
    cand_feature: torch.Tensor,
) -> torch.Tensor:
    """Write a batch of masked candidates in one pass.

    Args:
        base: [N, *D] floating images (any float dtype; channels_last kept).
        baseline: [1, *D] or [N, *D], same dtype: what a masked element becomes.
        feature_map: int64 [*D], feature id in [0, p) of every element.
        present: bool [R, p], rows of present features.
        cand_image, cand_row, cand_feature: int64 [B]. Candidate b starts from
            image ``cand_image[b]`` with the features of ``present[cand_row[b]]``
            and additionally masks feature ``cand_feature[b]`` (-1: none).

    Returns:
        [B, *D] tensor in base's dtype and memory format.
    """
    return _lib.mask_apply(base, baseline, feature_map, present, cand_image, cand_row, cand_feature)


def backselect_update(
    scores: torch.Tensor,
    rows: torch.Tensor,
    counts: torch.Tensor,
    steps: torch.Tensor,
    remaining: torch.Tensor,
    present: torch.Tensor,
    order: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Finish one backward-selection step for each row in ``rows``, in place.

    Args:
        scores: float64 [N, S]: ``scores[i, j]`` is f after masking ``remaining[i, j]``.
        rows, counts, steps: int64 [K], distinct rows; ``counts[k]`` candidates
            (``remaining[rows[k], :counts[k]]``) are scored; ``steps[k]`` is the
            position in order/values to write.
        remaining: int64 [N, S], compact lists of present feature ids (-1 past the end).
        present: bool [N, p]; order: int64 [N, m]; values: float64 [N, m].

    Picks the largest score, ties to the lowest feature id; writes order/values,
    clears the feature in ``present`` and removes it from ``remaining`` (the last
    entry moves into its slot).
    """
    _lib.backselect_update(scores, rows, counts, steps, remaining, present, order, values)
