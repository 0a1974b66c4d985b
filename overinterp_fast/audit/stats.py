"""Audit statistics: SIS sizes, heatmaps, set overlaps, model comparisons, foreground/background sensitivity.

Tests of significance come from scipy.stats; nothing statistical is hand-written.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

from typing import Sequence

import numpy as np
import torch
from scipy import stats
from scipy.spatial.distance import directed_hausdorff

from ..methods.findsis import find_sis
from ..methods.results import SISResult


def sis_size_curve(results: Sequence[SISResult], thresholds: Sequence[float]) -> np.ndarray:
    """SIS size as a fraction of the features, per image and threshold, from exact-SIS results.

    FindSIS is re-run on each result's order/values (no model calls).

    Returns:
        float [n_images, n_thresholds]; NaN where f(x) < threshold (no SIS).
    """
    out = np.full((len(results), len(thresholds)), np.nan)
    for i, r in enumerate(results):
        if r.blocks is not None:
            raise ValueError("sis_size_curve needs exact-SIS results (one value per feature)")
        for j, tau in enumerate(thresholds):
            if r.score >= tau:
                out[i, j] = find_sis(r.order, r.values, tau).numel() / r.order.numel()
    return out


def mean_ci(values, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its t-based confidence interval (scipy.stats.t), ignoring NaN: (mean, low, high)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return (float("nan"),) * 3
    m = float(v.mean())
    if v.size == 1:
        return m, float("nan"), float("nan")
    low, high = stats.t.interval(confidence, v.size - 1, loc=m, scale=stats.sem(v))
    return m, float(low), float(high)


def heatmap(masks: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """Fraction of the images whose set (SIS or pixel subset, bool [H, W]) contains each pixel; None skipped."""
    kept = [m.bool() for m in masks if m is not None]
    if not kept:
        raise ValueError("no masks to aggregate")
    return torch.stack(kept).double().mean(0)


def _pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"masks differ in shape: {a.shape} and {b.shape}")
    return a, b


def dice(a, b) -> float:
    """Sorensen-Dice coefficient 2|A & B| / (|A| + |B|) of two boolean masks (1 when both are empty)."""
    a, b = _pair(a, b)
    total = a.sum() + b.sum()
    return 1.0 if total == 0 else float(2 * (a & b).sum() / total)


def iou(a, b) -> float:
    """Intersection over union of two boolean masks (1 when both are empty)."""
    a, b = _pair(a, b)
    union = (a | b).sum()
    return 1.0 if union == 0 else float((a & b).sum() / union)


def hausdorff(a, b) -> float:
    """Symmetric Hausdorff distance (pixels) between the pixel sets of two boolean [H, W] masks."""
    a, b = _pair(a, b)
    pa, pb = np.argwhere(a), np.argwhere(b)
    if len(pa) == 0 or len(pb) == 0:
        raise ValueError("the Hausdorff distance needs two non-empty pixel sets")
    return float(max(directed_hausdorff(pa, pb)[0], directed_hausdorff(pb, pa)[0]))


def fraction_inside(mask, object_mask) -> float:
    """Fraction of the set's pixels that lie inside the object mask (Carter et al. 2021: SIS near the borders)."""
    a, obj = _pair(mask, object_mask)
    return float((a & obj).sum() / a.sum()) if a.sum() else float("nan")


def kruskal_wallis(groups: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Kruskal-Wallis H test across independent groups (e.g. MPS sizes of architectures): (H, p)."""
    res = stats.kruskal(*[np.asarray(g, dtype=float) for g in groups])
    return float(res.statistic), float(res.pvalue)


def friedman(groups: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Friedman test across matched groups (the same images under each model; 3 or more models): (chi2, p)."""
    res = stats.friedmanchisquare(*[np.asarray(g, dtype=float) for g in groups])
    return float(res.statistic), float(res.pvalue)


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    """Bonferroni-corrected p-values: min(1, p * m) for m tests."""
    m = len(pvalues)
    return [min(1.0, float(p) * m) for p in pvalues]


def rfs(a_fg: float, a_bg: float) -> float:
    """Relative foreground sensitivity (Moayeri et al. 2022): (a_bg - a_fg) / (2 min(a_mean, 1 - a_mean)), in [-1, 1].

    a_fg, a_bg: accuracy with the foreground, resp. background, corrupted. Higher: more sensitive to the
    foreground. NaN when a_mean is 0 or 1 (no room to differ).
    """
    mean = (a_fg + a_bg) / 2
    denom = 2 * min(mean, 1 - mean)
    return float("nan") if denom == 0 else (a_bg - a_fg) / denom


def irfs(p_fg: float, p_bg: float) -> float:
    """RFS with the true-class probabilities in place of accuracies (per image or averaged)."""
    return rfs(p_fg, p_bg)


@torch.no_grad()
def noise_sensitivity(
    model,
    images: torch.Tensor,
    object_masks: torch.Tensor,
    labels: torch.Tensor,
    sigma: float,
    low: float | None = None,
    high: float | None = None,
    seed: int = 0,
    outputs: str = "logits",
) -> dict:
    """Accuracy and true-class probability with Gaussian noise on only the foreground or only the background.

    Args:
        model: maps [N, C, H, W] to logits (``outputs="probabilities"``: to probabilities). images: [N, C, H, W];
            object_masks: bool [N, H, W]
            (True on the object); labels: int64 [N]; sigma: the noise's standard deviation, in the
            images' units; low/high: the valid range to clip to (None: no clipping).

    Returns:
        {"a_fg", "a_bg", "p_fg" [N], "p_bg" [N], "correct_fg" [N], "correct_bg" [N] (bool),
        "rfs", "irfs" (of the mean probabilities)}.
    """
    g = torch.Generator(device=images.device).manual_seed(seed)
    noise = sigma * torch.randn(images.shape, generator=g, device=images.device, dtype=images.dtype)
    fg = object_masks.bool().unsqueeze(1).to(images.device)
    out = {}
    for name, where in (("fg", fg), ("bg", ~fg)):
        x = torch.where(where, images + noise, images)
        if low is not None or high is not None:
            x = x.clamp(low, high)
        scores = model(x)
        probs = scores if outputs == "probabilities" else torch.softmax(scores, 1)
        right = (probs.argmax(1) == labels).cpu()
        out[f"correct_{name}"] = right
        out[f"a_{name}"] = float(right.double().mean())
        out[f"p_{name}"] = probs.gather(1, labels.view(-1, 1)).view(-1).double().cpu()
    out["rfs"] = rfs(out["a_fg"], out["a_bg"])
    out["irfs"] = irfs(float(out["p_fg"].mean()), float(out["p_bg"].mean()))
    return out
