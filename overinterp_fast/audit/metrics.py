"""Per-image facts of an audit, computed from the record alone: where each SIS lies and whether a model is right.

What the report (:mod:`overinterp_fast.audit.report`) and the table (:mod:`overinterp_fast.audit.table`) show:
the pixel grid of a display, the outer border band, the pixel subsets of backward selection, and per image the
SIS's size, its share in the border or in a region (an object mask), and the model's correctness.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

from typing import Sequence

import numpy as np
import torch

from ..methods.results import SISResult
from .records import AuditRecord, ModelRecord
from .stats import fraction_inside
from .subsets import keep_last_mask

BORDER = 0.10  # width of the border band, as a fraction of each side of the image
SUBSET_FRACTION = 0.05  # the pixel subsets of Carter et al. 2021: the last 5% of backward selection


def grid_shape(display: np.ndarray) -> tuple[int, int]:
    """The pixel grid (H, W) of a display image [H, W] or [H, W, 3]."""
    return tuple(int(s) for s in np.asarray(display).shape[:2])


def on_grid(r: SISResult, display: np.ndarray) -> bool:
    """Whether the result's mask lies on the display's pixel grid (False without a mask)."""
    return r.mask is not None and tuple(r.mask.shape) == grid_shape(display)


def common_grid(record: AuditRecord, model: ModelRecord) -> tuple[int, int] | None:
    """(H, W) when every display has that grid and every SIS mask of the model lies on it, else None."""
    shapes = {grid_shape(d) for d in record.displays}
    if len(shapes) != 1:
        return None
    if any(r.mask is not None and not on_grid(r, d) for r, d in zip(model.results, record.displays)):
        return None
    return shapes.pop()


def border_mask(shape: tuple[int, int], fraction: float = BORDER) -> np.ndarray:
    """bool [H, W]: the outer band of ``fraction`` of each side (at least one pixel wide)."""
    h, w = shape
    bh, bw = max(1, round(fraction * h)), max(1, round(fraction * w))
    inner = np.zeros((h, w), dtype=bool)
    inner[bh:h - bh, bw:w - bw] = True
    return ~inner


def subset_mask(order: torch.Tensor, shape: tuple[int, int], fraction: float = SUBSET_FRACTION) -> torch.Tensor | None:
    """bool [H, W]: the last ``fraction`` of a backward-selection order over the grid (None: order not on it)."""
    if order.numel() != shape[0] * shape[1]:
        return None
    return keep_last_mask(order, fraction).view(shape)


def sis_fractions(model: ModelRecord) -> np.ndarray:
    """float [n]: SIS size as a fraction of the features, for the images that have a SIS."""
    return np.array([r.fraction for r in model.results if r.sis is not None], dtype=float)


def correctness(record: AuditRecord, model: ModelRecord) -> list[bool | None]:
    """Per image: whether the model's class (``target``) is the true label; None where the label is unknown."""
    return [None if lab is None else int(r.target) == int(lab) for r, lab in zip(model.results, record.labels)]


def inside_fractions(record: AuditRecord, model: ModelRecord, regions: Sequence[np.ndarray]) -> np.ndarray:
    """float [N]: per image, the fraction of its SIS pixels inside ``regions[i]`` (bool [H, W]);
    NaN where the SIS is missing, empty or off the pixel grid."""
    out = np.full(len(model.results), np.nan)
    for i, (r, d, region) in enumerate(zip(model.results, record.displays, regions)):
        if on_grid(r, d) and r.size:
            out[i] = fraction_inside(r.mask.numpy(), region)
    return out


def border_fractions(record: AuditRecord, model: ModelRecord, fraction: float = BORDER) -> np.ndarray:
    """float [N]: per image, the fraction of its SIS pixels in the outer border (NaN: no, empty or off-grid SIS)."""
    return inside_fractions(record, model, [border_mask(grid_shape(d), fraction) for d in record.displays])


def border_share(record: AuditRecord, fraction: float = BORDER) -> float:
    """The border's share of the image area, averaged over the images."""
    return float(np.mean([border_mask(grid_shape(d), fraction).mean() for d in record.displays]))
