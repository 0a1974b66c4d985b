"""Rankings as positions: where each feature stands when features are ranked by score.

Shared by the extraction of sets from a ranking (:mod:`.extraction`), the square-by-square ranking
(:mod:`.blocks`) and the responsibility descents' stopping rule (:mod:`.responsibility`).
"""
from __future__ import annotations

import torch


def ranking_positions(scores: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Position of every feature when ranked by descending score (ties: higher index first).

    scores: [n, p]; present: bool [n, p] (absent features rank last, at position p).
    Returns int64 [n, p].
    """
    n, p = scores.shape
    s = torch.where(present, scores.double(), torch.full_like(scores, -torch.inf, dtype=torch.float64))
    # descending score; equal scores: the higher index first (a stable sort of the reversed features)
    order = torch.sort(s.flip(1), dim=1, descending=True, stable=True).indices
    return order_positions(p - 1 - order, present)


def order_positions(order: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Position of every feature from a ranked order: int64 [n, p], ``order[r, k]`` at position k;
    features not ``present`` (bool [n, p]) at position p."""
    n, p = order.shape
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(p, device=order.device).expand(n, p).contiguous())
    return torch.where(present, pos, torch.full_like(pos, p))
