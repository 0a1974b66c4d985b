"""The first passing prefix of a ranking from a few queries, guided by how far each tried prefix is from passing.

ReX's extraction tries the prefixes of a ranking in steps of 10 pixels and keeps the first that
passes: about k / 10 forward passes for a set of k pixels (580 for the median set of EfficientNet-Lite0
on the bundled photos). The criterion is far from monotone along the ranking: the first passing
window is often 10 pixels wide, so a coarser scan steps over it and returns a larger set.

Every forward pass also says how far the prefix is from passing: its *slack* (for criterion="top1",
the target's log-odds against the strongest other class; for a threshold, log f - log tau), positive
when it passes. Along a ranking the slack moves like a random walk with per-step variance sigma^2 (measured
on ReX's and our maps: the mean squared change over a lag of L steps grows about as L sigma^2). So

1. sizes ``GRID`` steps apart (or ``RATIO`` times the size, where that is more) are tried, with the empty
   prefix and the whole ranking, in rounds of at most ``COARSE_CHUNK`` per row (every size tried past the
   answer is a forward pass lost), until one passes;
2. between two tried sizes a < b that both fail, the walk crosses 0 with the probability of a Brownian
   bridge, exp(-2 s(a) s(b) / (sigma^2 (b - a))) (the reflection principle), where sigma^2 is ``SAFETY``
   times the row's pooled estimate: the sum of (s(b) - s(a))^2 over the sum of (b - a), over neighbouring
   tried sizes up to the earliest passing one. Every interval below it where that probability exceeds
   ``EPS`` is bisected; all rows' midpoints go in one batch per round, until no interval is left.

The interval just below the earliest passing size always has probability 1 (one end is at 0), so it is
bisected down to one step: the answer's predecessor was tried and fails, and the pixel-exact boundary
between them (:func:`~overinterp_fast.methods.prefix.boundary_prefix`) follows. Where no interval is likely to
hide a crossing, the answer is the first passing size of the whole scan; where one does and it is missed,
the answer is a later passing size, never a failing one. On EfficientNet-Lite0 and the 7 bundled photos,
over the rankings of ReX's maps (3 seeds) and ours (2 settings, 3 seeds, squares and pixels), the search
returned the scan's first passing size in 104 of 105, with a median of 95 forward passes against the scan's
547 (benchmarks/guided_scan_study.py; docs: guides/responsibility.md). The constants were chosen on recorded margin curves of
such rankings (GRID 32, RATIO 0.1, SAFETY 3: the scan's answer in 103 of 103 curves; SAFETY 2: 100).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..runtime.batching import CandidateEvaluator
from .prefix import FIRST_CHUNK, evaluate_prefixes

GRID = 32  # the coarse scan steps by 32 sizes (320 pixels in steps of 10) ...
RATIO = 0.1  # ... or by a tenth of the sizes below, where that is more
SAFETY = 3.0  # the bridge's per-step variance: three times the row's pooled estimate
EPS = 0.05  # an interval is bisected while a crossing of 0 inside it has probability above 5%
COARSE_CHUNK = {"cuda": 32}  # the coarse scan's sizes per row and round, at most, per device type; others: 4
_CLAMP = 1e30  # slacks are clamped to +-1e30 (log 0, a single class)


def crossing_probability(sa: float, sb: float, steps: int, sigma2: float) -> float:
    """Probability that a Brownian bridge from ``sa`` to ``sb`` over ``steps`` steps of variance ``sigma2``
    reaches 0 (1 when an end is at or above 0)."""
    sa, sb = min(sa, 0.0), min(sb, 0.0)
    if sa == 0.0 or sb == 0.0:
        return 1.0
    if sigma2 <= 0.0:
        return 0.0
    return math.exp(-2.0 * sa * sb / (sigma2 * steps))


class _Row:
    """Search state of one row: the tried indices (-1: the empty prefix) with (slack, passed, f)."""

    def __init__(self, n: int, grid: int, ratio: float):
        self.n = n
        self.tried: dict[int, tuple[float, bool, float]] = {}
        self.coarse = []  # the coarse scan's indices, ending at the last
        k = grid - 1
        while k < n - 1:
            self.coarse.append(k)
            k += max(grid, int(ratio * (k + 1)))
        self.coarse.append(n - 1)
        self.next_coarse = 0  # the coarse scan's next index in ``coarse``
        self.first: int | None = None  # the earliest passing index tried

    def take_coarse(self, chunk: int) -> list[int]:
        """The coarse scan's next ``chunk`` indices (fewer at its end), marked as taken."""
        out = self.coarse[self.next_coarse:self.next_coarse + chunk]
        self.next_coarse += len(out)
        return out

    def add(self, k: int, slack: float, passed: bool, f: float) -> None:
        passed = passed and k >= 0  # the empty prefix is never the answer
        self.tried[k] = (max(-_CLAMP, min(_CLAMP, slack)), passed, f)
        if passed and (self.first is None or k < self.first):
            self.first = k

    def midpoints(self, safety: float, eps: float) -> list[int]:
        """Indices to try next: midpoints of the intervals below the earliest passing index likely to hold a
        crossing."""
        bound = self.first if self.first is not None else self.n - 1
        pts = sorted(k for k in self.tried if k <= bound)
        pairs = list(zip(pts, pts[1:]))
        steps = sum(b - a for a, b in pairs)
        sigma2 = safety * sum((self.tried[b][0] - self.tried[a][0]) ** 2 for a, b in pairs) / steps if steps else 0.0
        out = []
        for a, b in pairs:
            sb = 0.0 if b == self.first else self.tried[b][0]
            if b - a > 1 and crossing_probability(self.tried[a][0], sb, b - a, sigma2) > eps:
                out.append((a + b) // 2)
        return out


def guided_first_prefix(
    evaluator: CandidateEvaluator,
    pos: torch.Tensor,
    images: list[int],
    sizes: list[list[int]],
    passes: Callable[[int, float, bool], bool],
    slack: Callable[[int, float, bool, float], float],
    grid: int = GRID,
    safety: float = SAFETY,
    eps: float = EPS,
    ratio: float = RATIO,
) -> tuple[list[tuple[int, float] | None], list[int]]:
    """For each row: (index into its sizes, f) of the first passing prefix found, or None; and its queries.

    Args: as :func:`~overinterp_fast.methods.prefix.first_passing_prefix` (``evaluator`` is re-used with
        ``fn.score_top1_margin`` as its measure), and
        slack: slack(row, f, top1, margin) -> float, positive when the prefix passes, moving about
            continuously with the prefix (e.g. the margin for the top-1 criterion).
        grid, safety, eps, ratio: the search's constants (module docstring).

    Returns:
        (per row (index i, f on prefix ``sizes[r][i]``), with ``sizes[r][i - 1]`` tried and failing (or
        i = 0), or None when no tried size passes; the forward passes per row, the empty prefix included).
    """
    if grid < 1 or safety <= 0 or not 0 < eps < 1 or ratio < 0:
        raise ValueError(f"need grid >= 1, safety > 0, 0 < eps < 1 and ratio >= 0, got {grid}, {safety}, {eps}, "
                         f"{ratio}")
    dev = pos.device
    measure = evaluator.measuring(evaluator.fn.score_top1_margin)
    rows = {r: _Row(len(sizes[r]), grid, ratio) for r in range(len(images)) if sizes[r]}
    queries = [0] * len(images)
    chunk = FIRST_CHUNK.get(dev.type, 2)
    todo: dict[int, list[int]] = {r: [-1] + st.take_coarse(chunk) for r, st in rows.items()}
    while todo:
        flat = [(r, k) for r, ks in todo.items() for k in ks]
        f, top1, margin = evaluate_prefixes(measure, pos, images, [r for r, _ in flat],
                                            [sizes[r][k] if k >= 0 else 0 for r, k in flat])
        for (r, k), fi, ti, mi in zip(flat, f.tolist(), top1.tolist(), margin.tolist()):
            queries[r] += 1
            rows[r].add(k, slack(r, fi, ti, mi), passes(r, fi, ti), fi)
        chunk = min(2 * chunk, COARSE_CHUNK.get(dev.type, 4))
        todo = {}
        for r, st in rows.items():
            if st.first is None and st.next_coarse < len(st.coarse):  # go on scanning
                todo[r] = st.take_coarse(chunk)
            else:
                mids = st.midpoints(safety, eps)
                if mids:
                    todo[r] = mids
    out: list[tuple[int, float] | None] = [None] * len(images)
    for r, st in rows.items():
        if st.first is not None:
            out[r] = (st.first, st.tried[st.first][2])
    return out, queries
