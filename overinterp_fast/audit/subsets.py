"""Pixel-subset datasets (Carter et al. 2021, Table 1): the last 5% of backward selection, or 5% at random."""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import math
from typing import Sequence

import torch

from ..ops import kernels as _ops
from ..runtime.inputs import prepare
from ..runtime.renames import renamed_keywords
from ..methods.results import SISResult


# methods whose ``order`` is a backward-selection order (most important feature last)
BACKWARD_METHODS = ("exact", "gradient")


def keep_last(order: torch.Tensor, fraction: float = 0.05) -> torch.Tensor:
    """The last ceil(fraction * m) features of a backward-selection order [m] (52 of 1024 at 5%)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    m = order.numel()
    return order[m - math.ceil(fraction * m - 1e-9):]


def keep_last_mask(order: torch.Tensor, fraction: float = 0.05) -> torch.Tensor:
    """bool [m] over the feature ids 0..m-1 of an order [m]: True on :func:`keep_last`'s features."""
    mask = torch.zeros(order.numel(), dtype=torch.bool)
    mask[keep_last(order, fraction)] = True
    return mask


def _apply(images, keep: torch.Tensor, baselines, feature_mask) -> torch.Tensor:
    """images with only the features in ``keep`` (bool [N, p]) present, by the fused mask_apply kernel."""
    prep = prepare(images, features=feature_mask, mask_value=0.0 if baselines is None else baselines)
    n = prep.images.shape[0]
    idx = torch.arange(n, device=prep.images.device)
    return _ops.mask_apply(prep.images, prep.baseline, prep.feature_map, keep.to(prep.images.device), idx, idx,
                           torch.full_like(idx, -1))


@renamed_keywords(mask_value="baselines", features="feature_mask")
def pixel_subsets(
    images: torch.Tensor,
    results: Sequence[SISResult],
    fraction: float = 0.05,
    baselines: float | torch.Tensor | None = None,
    feature_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the last ``fraction`` of each image's backward-selection order, mask the rest.

    Args:
        images: [N, *D]; results: exact-SIS results of those images (their ``order``);
        baselines, feature_mask: as for :func:`overinterp_fast.fast_sis` (same as the run).

    Returns:
        (masked images [N, *D], kept features bool [N, p]).
    """
    if len(results) != images.shape[0]:
        raise ValueError(f"{len(results)} results for {images.shape[0]} images")
    p = results[0].order.numel()
    if any(r.order.numel() != p for r in results):
        raise ValueError("every result must cover all features (use the first round of backward selection)")
    keep = torch.stack([keep_last_mask(r.order, fraction) for r in results])
    return _apply(images, keep, baselines, feature_mask), keep


@renamed_keywords(mask_value="baselines", features="feature_mask")
def random_subsets(
    images: torch.Tensor,
    fraction: float = 0.05,
    seed: int = 0,
    baselines: float | torch.Tensor | None = None,
    feature_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: per image, the same number of features as :func:`keep_last`, uniformly at random (seeded)."""
    p = prepare(images[:1], features=feature_mask).num_features
    k = keep_last(torch.arange(p), fraction).numel()
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(images.shape[0], p, dtype=torch.bool)
    for i in range(images.shape[0]):
        keep[i, torch.randperm(p, generator=g)[:k]] = True
    return _apply(images, keep, baselines, feature_mask), keep
