"""The first sufficient prefix of a ranking, evaluated in batches (FindSIS over any ordering).

Candidate k of row r keeps the features whose position ``pos[r, f]`` in the row's
ranking is below ``sizes[r][k]`` (sizes ascending) and masks the rest. The answer
for a row is the first k that passes, exactly what trying the sizes one forward
pass at a time would give; instead, each round evaluates the next chunk of sizes
of every unresolved row together, in batches built by the fused mask_apply
kernel. Chunks double per round: 8, 16, 32, ... on a GPU; on a CPU, where a
large batch saves little and every evaluation past the answer costs a full
forward pass, 2, 4, 8, 16, 32 and then 32 per round.
"""
from __future__ import annotations

from typing import Callable

import torch

from .batching import CandidateEvaluator
from .model import check_finite_scores

FIRST_CHUNK = {"cuda": 8}  # per device type; others: 2
MAX_CHUNK = {"cuda": 1 << 30}  # per device type; others: 32


def first_passing_prefix(
    evaluator: CandidateEvaluator,
    pos: torch.Tensor,
    images: list[int],
    sizes: list[list[int]],
    passes: Callable[[int, float, bool], bool],
) -> list[tuple[int, float] | None]:
    """For each row: (index into its sizes, f) of the first passing prefix, or None.

    Args:
        evaluator: scores candidates; called with a measure returning (f, top-1 correct).
        pos: int64 [R, p] on the images' device: each feature's position in the row's ranking
            (a value >= every size keeps a feature masked in all prefixes).
        images: the image of each row.
        sizes: ascending prefix sizes to try, per row.
        passes: passes(row, f, top1) -> bool.
    """
    dev = pos.device
    found: list[tuple[int, float] | None] = [None] * len(images)
    todo = {r: 0 for r in range(len(images)) if sizes[r]}
    chunk = FIRST_CHUNK.get(dev.type, 2)
    while todo:
        rows, ks = [], []
        for r, lo in todo.items():
            hi = min(lo + chunk, len(sizes[r]))
            rows += [r] * (hi - lo)
            ks += list(range(lo, hi))
        rows_t = torch.tensor(rows, device=dev)
        size_t = torch.tensor([sizes[r][k] for r, k in zip(rows, ks)], device=dev)
        present = pos[rows_t] < size_t.view(-1, 1)  # [C, p]
        img_t = torch.tensor([images[r] for r in rows], device=dev)
        f, top1 = evaluator(present, img_t, torch.arange(len(rows), device=dev), torch.full_like(img_t, -1))
        check_finite_scores(torch.isfinite(f).all())
        f, top1 = f.tolist(), top1.tolist()
        nxt, at = {}, 0
        for r, lo in todo.items():
            hi = min(lo + chunk, len(sizes[r]))
            hit = next((k for k in range(lo, hi) if passes(r, f[at + k - lo], top1[at + k - lo])), None)
            if hit is not None:
                found[r] = (hit, f[at + hit - lo])
            elif hi < len(sizes[r]):
                nxt[r] = hi
            at += hi - lo
        todo = nxt
        chunk = min(2 * chunk, MAX_CHUNK.get(dev.type, 32))
    return found


def verify_prefix_sets(
    evaluator: CandidateEvaluator,
    images: list[int],
    keep_first: list[torch.Tensor],
    sizes: list[list[int]],
    passes: Callable[[int, float, bool], bool],
    num_features: int,
) -> list[tuple[int, float] | None]:
    """Check sets found by a stand-in engine on the user's model, continuing where one fails.

    Row r's set is ``keep_first[r][:sizes[r][0]]``; when it fails on ``evaluator`` (the
    user's model), the next sizes ``sizes[r][1:]`` are tried in order (FindSIS goes on
    adding features) until one passes. Returns per row (index into ``sizes[r]``, f on the
    user's model), or None when no size passes.

    Args:
        keep_first: int64 [m_r] per row, features in the order they join the set.
        sizes: ascending set sizes per row (at most m_r).
    """
    dev = evaluator.prep.images.device
    pos = torch.full((len(images), num_features), num_features, dtype=torch.int64)
    for r, order in enumerate(keep_first):
        pos[r, order] = torch.arange(order.numel())
    return first_passing_prefix(evaluator, pos.to(dev), images, sizes, passes)
