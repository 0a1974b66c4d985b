"""Each audited model on its own pixel subsets: the rows "full images -> 5% backward-selection subsets" and
"full images -> 5% random" of Carter et al. 2021, Table 1.

For a backward-selection method (exact or gradient SIS over the pixels), an audit keeps, per model and image, what
the model says on the image with only the last ``fraction`` of its backward-selection order present (the 5%
pixel subset, 52 of 1,024 pixels at 32 x 32) and on the image with as many pixels drawn at random (from the audit's
seed and the image's position, the draws of the pixel-subset files:
:func:`~overinterp_fast.audit.subset_files.random_keep`), the rest at the baseline:

- ``backselect_class``, ``random_class`` (int64 [N]): the class it predicts there;
- ``backselect_score``, ``random_score`` (float64 [N]): its probability there of the class it predicted on the
  whole image (the class whose SIS it is): its confidence on the subset.

These per-image columns are stored with the results (the chunk parts), in the pixel-subset files, and summed up
per model in results.json (:func:`subset_summary`): the accuracy on the full images, on the 5% backward-selection
subsets and on the random 5%, and the mean confidence on each subset.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

from typing import Sequence

import numpy as np
import torch

from ..methods.results import SISResult
from ..runtime.model import ModelFn, check_output_kind
from .store import OWN_SUBSET_COLUMNS as COLUMNS
from .subset_files import random_keep
from .subsets import _apply, keep_last, pixel_subsets

KINDS = ("backselect", "random")


def on_pixels(images: torch.Tensor, results: Sequence[SISResult]) -> bool:
    """Whether every result's order ranks every pixel of ``images`` [N, C, H, W] (the first round of a backward
    selection over pixel features), as the pixel subsets need."""
    p = images.shape[-1] * images.shape[-2]
    return len(results) > 0 and all(r.order.numel() == p for r in results)


def subset_inputs(images: torch.Tensor, results: Sequence[SISResult], indices: Sequence[int], fraction: float,
                  baselines, seed: int) -> dict[str, torch.Tensor]:
    """{"backselect": x, "random": x}, each [N, C, H, W]: ``images`` with only the last ``fraction`` of each
    result's order present, or as many pixels drawn for image ``indices[i]`` (its position in the audit) from
    ``seed``; the rest at ``baselines``."""
    bs, _ = pixel_subsets(images, results, fraction, baselines)
    p = images.shape[-1] * images.shape[-2]
    k = keep_last(torch.arange(p), fraction).numel()
    keep = torch.from_numpy(np.stack([random_keep(p, k, seed, int(i)) for i in indices]))
    return {"backselect": bs, "random": _apply(images, keep, baselines, None)}


@torch.no_grad()
def class_probabilities(model, x: torch.Tensor, batch_size: int = 64, outputs: str = "logits") -> torch.Tensor:
    """float [N, K]: ``model``'s class probabilities on ``x`` [N, *D] (the softmax of its logits, or its outputs
    with ``outputs="probabilities"``), in batches; a FloatingPointError when any is NaN or inf, and outputs that
    contradict ``outputs`` refused (:func:`~overinterp_fast.runtime.model.check_output_kind`)."""
    fn = ModelFn(model, outputs=outputs, device=x.device)
    out = torch.cat([fn.forward(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)])
    if not bool(torch.isfinite(out).all()):
        raise FloatingPointError("the model's output contains NaN or inf")
    check_output_kind(out, outputs)
    return fn.probabilities(out)


@torch.no_grad()
def subset_columns(model, images: torch.Tensor, results: Sequence[SISResult], indices: Sequence[int],
                   fraction: float, baselines, seed: int, outputs: str = "logits") -> dict[str, np.ndarray] | None:
    """The per-image columns of the module docstring for one model on one chunk ``images`` [N, C, H, W] (its
    ``results``, the images' positions ``indices``); None when the orders do not rank the pixels."""
    if not on_pixels(images, results):
        return None
    target = torch.tensor([int(r.target) for r in results], device=images.device)
    cols = {}
    for kind, x in subset_inputs(images, results, indices, fraction, baselines, seed).items():
        probs = class_probabilities(model, x, outputs=outputs)
        cols[f"{kind}_class"] = probs.argmax(1).cpu().numpy().astype(np.int64)
        cols[f"{kind}_score"] = probs.gather(1, target.view(-1, 1)).view(-1).double().cpu().numpy()
    return cols


def split_columns(cols: dict | None) -> tuple[dict | None, dict | None]:
    """A chunk's per-image columns of one model as stored (noise sensitivity and own-subset columns together)
    -> (the noise-sensitivity columns or None, the own-subset columns or None)."""
    if not cols:
        return None, None
    subsets = {k: v for k, v in cols.items() if k in COLUMNS}
    others = {k: v for k, v in cols.items() if k not in COLUMNS}
    return others or None, (subsets if len(subsets) == len(COLUMNS) else None)


def merge_columns(sensitivity: dict | None, subsets: dict | None) -> dict | None:
    """Inverse of :func:`split_columns`: one dict of per-image columns (None when both are None)."""
    if sensitivity is None and subsets is None:
        return None
    return {**(sensitivity or {}), **(subsets or {})}


def concat_columns(chunks: Sequence[dict | None]) -> dict[str, np.ndarray] | None:
    """Own-subset columns over every chunk, in order; None when a chunk lacks them (parts written before they were
    stored, or orders that do not rank the pixels)."""
    if not chunks or any(c is None for c in chunks):
        return None
    return {k: np.concatenate([np.asarray(c[k], dtype=t) for c in chunks]) for k, t in COLUMNS.items()}


def subset_summary(cols: dict[str, np.ndarray], targets: Sequence[int], labels: Sequence[int | None],
                   fraction: float) -> dict:
    """What results.json keeps of one model's own-subset columns over all N images: {"fraction", "images",
    "reference" ("labels" when every label is known, else "full-image predictions": the model's own classes),
    "accuracy": {"full", "backselect", "random"}, "confidence": {"backselect", "random"} (the mean of the scores)}."""
    targets = np.asarray(targets, dtype=np.int64)
    known = all(lab is not None for lab in labels)
    reference = np.asarray(labels, dtype=np.int64) if known else targets
    n = len(targets)
    if n == 0 or len(cols["backselect_class"]) != n:
        raise ValueError(f"{len(cols['backselect_class'])} own-subset rows for {n} images")
    return {"fraction": fraction, "images": n, "reference": "labels" if known else "full-image predictions",
            "accuracy": {"full": float(np.mean(targets == reference)),
                         **{k: float(np.mean(cols[f"{k}_class"] == reference)) for k in KINDS}},
            "confidence": {k: float(np.mean(cols[f"{k}_score"])) for k in KINDS}}
