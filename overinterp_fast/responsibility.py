"""Causal responsibility maps and minimal pixel sets (paper 002; the ReX algorithm, SPEC.md section 3a).

Black box: forward passes only, so it serves torch and ONNX models alike.

One iteration (seeded by seed + i) is a greedy random descent through a tree of
boxes whose root is the whole image. At each level every active box with an
area of at least ``min_box`` pixels is split at a uniformly random point into 4
quadrants (some may be empty); for each such box the 14 mutants keep one
non-empty proper subset of its quadrants plus the other active boxes and mask
everything else. A mutant passes when the model's top-1 class on it is the
target (or, with ``criterion="threshold"``, when f >= threshold). If any mutant
of the level passed, every mutant predicted as the target adds 1/k to the
pixels of each of its k kept quadrants (a per-iteration map that starts at 1).
The passing mutant with the smallest unmasked area is refined next: its kept
quadrants become the active boxes. The descent stops when nothing passes, no
box can be split, or after ``depth`` levels. The maps of the iterations
multiply; we rank by the sum of their logarithms, which orders pixels the same.

Speed comes from the structure: all iterations of all images descend together,
so each level is one large batch of mutants (mutants of one image that show the
same rectangles, as empty quadrants make them, share one forward pass; the
sequential loop, ``overinterp_fast.reference.responsibility``, gives the same
map); mutants are unions of rectangles,
painted by the ``rect_fill`` kernel (2D difference arrays, exact integer sums)
and written by ``mask_apply``; responsibility is accumulated by ``rect_fill`` as
well (weights 6/k, so the sums are exact integers); the minimal pixel set is the
first passing prefix of the ranking in steps of 10 pixels, evaluated in batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from . import _ops
from .batching import CandidateEvaluator
from .inputs import Prepared

SUBSETS = [[c for c in range(4) if s >> c & 1] for s in range(1, 15)]  # the 14 non-empty proper subsets
_UNIT = 6  # 1/k for k = 1, 2, 3 as exact integers: 6, 3, 2


@dataclass
class ResponsibilityMap:
    """Responsibility of one image's pixels.

    Attributes:
        map: float64 [H, W], the sum over iterations of log(per-iteration map);
            higher = more responsible. (ReX's product of maps is exp(map).)
        queries: forward passes the descent used for this image (distinct mutants).
        target: the class explained.
        iterations: iterations run.
    """

    map: torch.Tensor
    queries: int
    target: int
    iterations: int


@dataclass
class _Descent:
    image: int
    rng: np.random.Generator
    active: list[tuple[int, int, int, int]]
    level: int = 0
    alive: bool = True


def check_responsibility_options(iterations, depth, min_box, seed) -> None:
    for name, v, lo in (("iterations", iterations, 1), ("depth", depth, 1), ("min_box", min_box, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _split(box, rng) -> list[tuple[int, int, int, int]]:
    y0, x0, y1, x1 = box
    ys = int(rng.integers(y0, y1 + 1))
    xs = int(rng.integers(x0, x1 + 1))
    return [(y0, x0, ys, xs), (y0, xs, ys, x1), (ys, x0, y1, xs), (ys, xs, y1, x1)]


def _area(box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def compute_responsibility(
    evaluator: CandidateEvaluator,
    prep: Prepared,
    present: torch.Tensor,
    passes,
    iterations: int,
    depth: int,
    min_box: int,
    seed: int,
    progress: bool | None,
) -> tuple[torch.Tensor, list[int]]:
    """Responsibility of every image's pixels: (float64 [N, H, W], queries per image).

    ``present``: bool [N, H*W], the pixels that may be kept (others stay masked:
    used by collections). ``passes(image, f, top1) -> bool``.
    """
    n, _, h, w = prep.images.shape
    dev = prep.images.device
    descents = [
        _Descent(i, np.random.default_rng(seed + t), [(0, 0, h, w)]) for i in range(n) for t in range(iterations)
    ]
    queries = [0] * n
    resp_rects: list[tuple[int, int, int, int]] = []
    resp_owner: list[int] = []
    resp_weight: list[int] = []
    bar = tqdm(total=depth, unit="level", desc="responsibility", disable=None if progress is None else not progress)
    while any(d.alive for d in descents):
        # mutants of this level: (descent, kept quadrants, index of its forward pass). Mutants of
        # one image with the same non-empty rectangles (empty quadrants make these) share one pass.
        mutants: list[tuple[int, list[tuple[int, int, int, int]], int]] = []
        rects, owner, evals = [], [], []
        seen: dict[tuple, int] = {}
        for di, d in enumerate(descents):
            if not d.alive:
                continue
            made = False
            for b, box in enumerate(d.active):
                if _area(box) < min_box:
                    continue
                quads = _split(box, d.rng)
                static = d.active[:b] + d.active[b + 1 :]
                for subset in SUBSETS:
                    kept = [quads[c] for c in subset]
                    shown = sorted({r for r in kept + static if _area(r) > 0})
                    e = seen.setdefault((d.image, *shown), len(evals))
                    if e == len(evals):
                        evals.append(d.image)
                        queries[d.image] += 1
                        rects.extend(shown)
                        owner.extend([e] * len(shown))
                    mutants.append((di, kept, e))
                made = True
            if not made:
                d.alive = False
        if not mutants:
            break
        m = len(evals)
        cover = _ops.rect_fill(
            torch.tensor(rects, dtype=torch.int64, device=dev).view(-1, 4),
            torch.tensor(owner, dtype=torch.int64, device=dev),
            torch.ones(len(rects), dtype=torch.int64, device=dev), m, h, w,
        )
        img = torch.tensor(evals, device=dev)
        keep = (cover.view(m, h * w) > 0) & present[img]
        f_e, top1_e = evaluator(keep, img, torch.arange(m, device=dev), torch.full_like(img, -1))
        area_e = keep.sum(1).tolist()
        f_e, top1_e = f_e.tolist(), top1_e.tolist()
        f = [f_e[e] for _, _, e in mutants]
        top1 = [top1_e[e] for _, _, e in mutants]
        area = [area_e[e] for _, _, e in mutants]
        by_descent: dict[int, list[int]] = {}
        for mi, (di, _, _) in enumerate(mutants):
            by_descent.setdefault(di, []).append(mi)
        for di, mis in by_descent.items():
            d = descents[di]
            ok = [mi for mi in mis if passes(d.image, f[mi], top1[mi])]
            if not ok:
                d.alive = False
                continue
            for mi in mis:  # every mutant predicted as the target shares 1 among its kept quadrants
                if top1[mi]:
                    kept = mutants[mi][1]
                    for q in kept:
                        resp_rects.append(q)
                        resp_owner.append(di)
                        resp_weight.append(_UNIT // len(kept))
            best = min(ok, key=lambda mi: (area[mi], mi))
            d.active = [q for q in mutants[best][1] if _area(q) > 0]
            d.level += 1
            if d.level >= depth:
                d.alive = False
        bar.update(1)
    bar.close()
    acc = _ops.rect_fill(
        torch.tensor(resp_rects, dtype=torch.int64, device=dev).view(-1, 4),
        torch.tensor(resp_owner, dtype=torch.int64, device=dev),
        torch.tensor(resp_weight, dtype=torch.int64, device=dev), len(descents), h, w,
    )
    logs = torch.log1p(acc.double() / _UNIT).view(n, iterations, h, w)
    return logs.sum(1), queries


def ranking_positions(scores: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Position of every feature when ranked by descending score (ties: higher index first).

    scores: [n, p]; present: bool [n, p] (absent features rank last, at position p).
    Returns int64 [n, p].
    """
    n, p = scores.shape
    s = torch.where(present, scores.double(), torch.full_like(scores, -torch.inf, dtype=torch.float64))
    # descending score; equal scores: the higher index first (a stable sort of the reversed features)
    order = torch.sort(s.flip(1), dim=1, descending=True, stable=True).indices
    order = p - 1 - order
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(p, device=scores.device).expand(n, p).contiguous())
    return torch.where(present, pos, torch.full_like(pos, p))
