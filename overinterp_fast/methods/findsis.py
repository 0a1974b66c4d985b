"""FindSIS over a backward-selection result."""
from __future__ import annotations

import torch


def find_sis(order: torch.Tensor, values: torch.Tensor, threshold: float) -> torch.Tensor:
    """The SIS of a backward selection, last-masked first.

    Args:
        order: int64 [m], features in masking order.
        values: [m], ``values[t]`` = f with only ``order[t+1:]`` present.
        threshold: tau.

    Returns:
        int64 [k]: ``order[t+1:]`` reversed for the largest t with
        ``values[t] >= threshold``; all of ``order`` reversed when no value
        reaches it; empty when the fully masked input (``values[-1]``) passes.
        (The reference sis.py skips the last-masked feature in that case; we
        return the empty SIS, as docs/algorithms.md, Exact SIS, says.) The caller checks the
        precondition f(x) >= threshold.
    """
    if order.shape != values.shape or order.dim() != 1:
        raise ValueError("order and values must be 1-D and of the same length")
    passing = torch.nonzero(values >= threshold).flatten()
    start = 0 if passing.numel() == 0 else int(passing[-1]) + 1
    return order[start:].flip(0).clone()


def sis_score(values: torch.Tensor, score: float, sis_size: int) -> float:
    """f with only the SIS present, read off a backward selection: the value just
    before the SIS's first feature was masked (``score``, f of the whole input,
    when the SIS is every feature)."""
    start = values.numel() - sis_size
    return float(values[start - 1]) if start > 0 else float(score)
