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

from ..runtime.batching import CandidateEvaluator, check_candidates
from ..runtime.model import check_finite_host
from ..runtime.schedule import upload
from ..runtime.sync import to_host

FIRST_CHUNK = {"cuda": 8}  # per device type; others: 2
MAX_CHUNK = {"cuda": 1 << 30}  # per device type; others: 32


def evaluate_prefixes(evaluator, pos: torch.Tensor, images: list[int], rows: list[int], sizes: list[int]):
    """Score candidate c = the prefix of ``sizes[c]`` features of row ``rows[c]``'s ranking (``pos``, image
    ``images[rows[c]]``) in one call of ``evaluator``; its measure's output (f float64 [C] first, checked finite),
    read to the host in one transfer (:func:`~overinterp_fast.runtime.sync.to_host`)."""
    dev = pos.device
    img = [images[r] for r in rows]
    check_candidates(evaluator.prep, img)  # on the host: no device wait (rows 0..C-1, no feature dropped)
    c = len(rows)
    rows_t, sizes_t, img_t, at_t, none_t = upload(dev, rows, sizes, img, range(c), [-1] * c)  # one copy
    present = pos[rows_t] < sizes_t.view(-1, 1)  # [C, p]
    out = to_host(*evaluator(present, img_t, at_t, none_t, check_indices=False), label="prefixes")
    check_finite_host(out[0])  # on the host, after the read: nothing more on the device
    return out


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
        f, top1 = evaluate_prefixes(evaluator, pos, images, rows, [sizes[r][k] for r, k in zip(rows, ks)])
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


SPECULATION = {"cuda": 3}  # boundary search: levels of the one-probe search evaluated per round; others: 1


class _Bracket:
    """Search state of one row: the largest size known to fail (lo), the smallest known to pass (hi), the phase.
    One probe at a time: :meth:`probe` names the next size, :meth:`update` takes its result."""

    def __init__(self, start: int, count: int, stride: int):
        self.count, self.stride = count, max(1, stride)
        self.lo, self.hi, self.f_hi = 0, None, 0.0  # size 0 is taken as failing
        self.start = min(max(1, start), count)
        self.phase = "start"

    def probe(self) -> int:
        if self.phase == "start":
            return self.start
        if self.phase == "grow":
            return min(self.lo + self.stride, self.count)
        if self.phase == "shrink":
            return max(self.hi - self.stride, self.lo + 1)
        return self.lo + max(1, (self.hi - self.lo) // 2)

    def update(self, size: int, passed: bool, f: float) -> bool:
        """Take the result of probing ``size`` (passed, f); True when the row is resolved."""
        was = self.phase
        if passed:
            if self.hi is None or size < self.hi:
                self.hi, self.f_hi = size, f
        elif size > self.lo:
            self.lo = size
        if self.hi is None:  # nothing passes yet: grow from the largest failing size
            if self.lo >= self.count:
                return True
            self.stride = self.stride if was == "start" else self.stride << 1
            self.phase = "grow"
            return False
        if self.hi - self.lo <= 1:
            return True
        if self.lo == 0 and passed and was in ("start", "shrink"):
            self.stride = self.stride if was == "start" else self.stride << 1
            self.phase = "shrink"  # only the assumed empty prefix fails below: keep stepping down
        else:
            self.phase = "bisect"
        return False

    def copy(self) -> "_Bracket":
        other = _Bracket.__new__(_Bracket)
        other.__dict__.update(self.__dict__)
        return other


def _speculate(bracket: _Bracket, levels: int) -> list[int]:
    """The sizes the one-probe search from ``bracket`` probes in its next ``levels`` probes, whatever their
    results: the probes of a binary tree of depth ``levels`` (at most 2^levels - 1 sizes), ascending."""
    sizes, frontier = set(), [bracket]
    for _ in range(levels):
        nxt = []
        for b in frontier:
            s = b.probe()
            sizes.add(s)
            for passed in (False, True):
                c = b.copy()
                if not c.update(s, passed, 0.0):
                    nxt.append(c)
        frontier = nxt
    return sorted(sizes)


def boundary_prefix(
    evaluator: CandidateEvaluator,
    pos: torch.Tensor,
    images: list[int],
    counts: list[int],
    passes: Callable[[int, float, bool], bool],
    starts: list[int | None] | None = None,
    brackets: list[tuple[int, int, float] | None] | None = None,
) -> tuple[list[tuple[int, float] | None], list[int]]:
    """For each row, a pixel-exact boundary of its ranking: a passing prefix size k whose k - 1 fails.

    Exponential search from ``starts[r]`` (default 10: sizes 10, 20, 40, ... up to the
    row's count; from a given start, strides start/32, doubling, both ways), then
    bisection between the largest failing and the smallest passing size, one probe at a
    time (about 2 log2(k) queries per row). With a monotone criterion the boundary is the
    first passing prefix; otherwise it is a passing prefix whose predecessor fails, and
    which one depends on the order of the probes. So the order is the same everywhere: on
    a GPU, where a wider batch costs little, each round evaluates every size the one-probe
    search could probe in its next ``SPECULATION`` probes (3: at most 7 sizes per row),
    then follows the path the results pick. The answer is the one-probe search's on every
    device; only the queries (all the sizes evaluated) and the rounds differ. The empty
    prefix is taken as failing without a query (a pruning pass finds out).

    Args: as :func:`first_passing_prefix`, with ``counts[r]`` the row's largest size.
        brackets: per row, (lo, hi, f on hi) with prefix lo known to fail and hi to pass (e.g. the
            last two sizes of a scan): only the bisection between them runs. None: search.

    Returns:
        (per row (k, f on prefix k) or None when even ``counts[r]`` fails, queries per row).
    """
    dev = pos.device
    levels = SPECULATION.get(dev.type, 1)
    n = len(images)
    state = {
        r: _Bracket(10, counts[r], 10) if not starts or starts[r] is None else _Bracket(starts[r], counts[r],
                                                                                       starts[r] // 32)
        for r in range(n) if counts[r] > 0
    }
    for r, b in enumerate(brackets or []):
        if b is not None and r in state:
            st = state[r]
            st.lo, st.hi, st.f_hi, st.phase = b[0], b[1], b[2], "bisect"
    queries = [0] * n
    todo = sorted(r for r in state if state[r].hi is None or state[r].hi - state[r].lo > 1)
    while todo:
        rows, sizes = [], []
        for r in todo:
            c = _speculate(state[r], levels)
            rows += [r] * len(c)
            sizes += c
        f, top1 = evaluate_prefixes(evaluator, pos, images, rows, sizes)
        seen: dict[int, dict[int, tuple[bool, float]]] = {}
        for r, s, fi, ti in zip(rows, sizes, f.tolist(), top1.tolist()):
            queries[r] += 1
            seen.setdefault(r, {})[s] = (passes(r, fi, ti), fi)
        nxt = []
        for r in todo:  # follow the one-probe search along the results
            st, resolved = state[r], False
            for _ in range(levels):
                s = st.probe()
                resolved = st.update(s, *seen[r][s])
                if resolved:
                    break
            if not resolved:
                nxt.append(r)
        todo = nxt
    return [None if r not in state or state[r].hi is None else (state[r].hi, state[r].f_hi) for r in range(n)], queries
