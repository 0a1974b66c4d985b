"""Causal responsibility maps and minimal pixel sets (the ReX algorithm of Kelly, Chanchal and Blake; docs: algorithms.md,
Causal responsibility and minimal pixel sets).

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
With ``monotone=True`` (fast_sis's default outside ReX's extraction) a level scores
each split's mutants in three rounds (3 quadrants kept, then 2, then 1) and skips
those whose scored supersets all failed (see :func:`descend`).

Speed comes from the structure: all iterations of all images descend together,
so each level is one large batch of mutants (mutants of one image that show the
same rectangles, as empty quadrants make them, share one forward pass; the
sequential loop, ``overinterp_fast.methods.reference.responsibility``, gives the same
map); mutants are unions of rectangles,
painted by the ``rect_fill`` kernel (2D difference arrays, exact integer sums)
and written by ``mask_apply``; responsibility is accumulated by ``rect_fill`` as
well (weights 6/k, so the sums are exact integers); the minimal pixel set is the
first passing prefix of the ranking in steps of 10 pixels, evaluated in batches.

The host draws the splits and keeps the mutant cache; the masks, the scores and the
maps stay on the images' device. The host reads device values only through
:func:`~overinterp_fast.runtime.sync.to_host`, once per scoring round (the round's
scores: one round per level, three with ``monotone=True``), however many mutants the
round holds; it uploads each round's rectangles in one copy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..ops import kernels as _ops
from ..ops.pure import check_ranges
from ..runtime.batching import CandidateEvaluator, check_candidates
from ..runtime.inputs import Prepared
from ..runtime.schedule import upload
from ..runtime.sync import to_host
from .ranking import ranking_positions
from .results import RunInfo

SUBSETS = [[c for c in range(4) if s >> c & 1] for s in range(1, 15)]  # the 14 non-empty proper subsets
# monotone=True: for each subset, the indices of its proper supersets among SUBSETS, and the rounds of a level
# (the four 3-quadrant subsets, then the six pairs, then the four single quadrants)
SUPERSETS = [[u for u, big in enumerate(SUBSETS) if set(small) < set(big)] for small in SUBSETS]
_ROUNDS = [[k for k, sub in enumerate(SUBSETS) if len(sub) == size] for size in (3, 2, 1)]
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
        info: how the call ran (:class:`~overinterp_fast.methods.results.RunInfo`, as
            :attr:`overinterp_fast.SISResult.info`): what it decided and why.
    """

    map: torch.Tensor
    queries: int
    target: int
    iterations: int
    info: RunInfo | None = None


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
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # numpy's generators take seeds >= 0
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def descent_rng(seed: int):
    """The random source of one descent: split points are drawn from it (``integers``), row then column."""
    return np.random.default_rng(seed)


def skipped(k: int, superset_passed: list[bool]) -> bool:
    """monotone=True: whether mutant ``SUBSETS[k]`` is taken as failing without a query, given whether each
    of its supersets ``SUPERSETS[k]`` (same split, scored or taken as failing before it) passed: when none did."""
    return not any(superset_passed)


def _split(box, rng) -> list[tuple[int, int, int, int]]:
    y0, x0, y1, x1 = box
    ys = int(rng.integers(y0, y1 + 1))
    xs = int(rng.integers(x0, x1 + 1))
    return [(y0, x0, ys, xs), (y0, xs, ys, x1), (ys, x0, y1, xs), (ys, xs, y1, x1)]


def _area(box) -> int:
    return max(0, box[2] - box[0]) * max(0, box[3] - box[1])


def _rect_cover(runner, rects, owner, weight, m: int, h: int, w: int, dev: torch.device,
                use: Callable[[slice, torch.Tensor], object], maps: Callable[[int], int] | None = None) -> list:
    """Paint rectangles into m coverage maps in chunks of owners (the runner's chunk, with its
    out-of-memory back-off): ``use(owners, cover int64 [maps(chunk), H, W])`` per chunk, results listed.

    ``rects``: R rectangles (y0, x0, y1, x1), host 4-tuples or an int64 [R, 4] tensor; ``owner[i]`` in [0, m) is
    the map of rectangle i (any order: host ints, or an int64 [R] tensor, read to the host once); ``weight[i]``
    its int weight (host ints; None: 1). A ``use`` that returns None (its work done in place) lists nothing.
    The host groups the rectangles by owner and uploads them in one copy,
    so painting waits for no device value. ``maps(n)`` >= n: the maps painted for a chunk of n owners (the maps
    past n are empty: a chunk painted at its batch shape); None: n.
    """
    if isinstance(owner, torch.Tensor):
        (owner,) = to_host(owner, label="rectangle owners")
    owner_np = np.asarray(owner, dtype=np.int64).reshape(-1)
    # the op's own check, here on the host where the chunks' owners are made: rect_fill then skips it (a device
    # synchronisation per chunk on CUDA)
    check_ranges("rect_fill", [(owner_np, 0, m, "owner")])
    by_owner = np.argsort(owner_np, kind="stable")
    starts = np.searchsorted(owner_np[by_owner], np.arange(m + 1)).tolist()
    weight_np = np.ones(len(owner_np), np.int64) if weight is None else np.asarray(weight, np.int64)[by_owner]
    if isinstance(rects, torch.Tensor):
        order_t, owner_t, weight_t = upload(dev, by_owner, owner_np[by_owner], weight_np)
        rect_t = rects.to(dev).view(-1, 4)[order_t]
    else:
        rect_t, owner_t, weight_t = upload(dev, np.asarray(rects, np.int64).reshape(-1, 4)[by_owner],
                                           owner_np[by_owner], weight_np)
        rect_t = rect_t.view(-1, 4)

    def work(sl: slice):
        a, b = starts[sl.start], starts[sl.stop]
        n = sl.stop - sl.start
        owners = owner_t[a:b] if sl.start == 0 else owner_t[a:b] - sl.start
        cover = _ops.rect_fill(rect_t[a:b], owners, weight_t[a:b], n if maps is None else maps(n), h, w, False)
        got = use(sl, cover)
        return None if got is None else (got,)

    out = runner.run(m, lambda sl: work(sl)) if m else None
    return [] if out is None else list(out)


class MutantCache:
    """(f, top-1 is the target) of mutants already scored, keyed by image and shown rectangles.

    Shared by all levels and iterations of one ranking (one set of pixels allowed):
    a mutant that shows the same rectangles of the same image is the same input.
    ``hits``: mutants not scored on their own: found here, or the same input as a mutant scored in their round;
    ``level_queries[l]``: the mutants the model scored at
    level l of the descents (0: the whole image split once), all images and iterations together;
    ``guessed``: the keys whose answer came from a surrogate (:mod:`overinterp_fast.experimental.surrogate`), not the model.
    """

    def __init__(self):
        self.scores: dict[tuple, tuple[float, bool, int]] = {}  # key -> (f, top-1 correct, pixels kept)
        self.guessed: set[tuple] = set()  # keys answered by a surrogate, not by the model (no query)
        self.hits = 0
        self.level_queries: list[int] = []


def score_painted(evaluator: CandidateEvaluator, rects, owner, images: torch.Tensor, present: torch.Tensor,
                  h: int, w: int, checked: bool = False) -> torch.Tensor:
    """Score m mutants on ``evaluator`` by painting them: rectangles ``rects`` (int64 [R, 4] or a list of
    4-tuples) of mutant ``owner`` (int64 [R] in [0, m), or a list of R ints) of images ``images`` (int64 [m]),
    each keeping the pixels its rectangles cover that are ``present`` (bool [N, H*W]). Returns float64 [m, 3] on
    the images' device: f, top-1 is the target (0 or 1), pixels kept. Masks are painted and scored on the
    device, chunk by chunk (:func:`_rect_cover`), each chunk at its batch shape (the evaluator's padded rows:
    the maps past the chunk's mutants are empty, their scores dropped), the scores written into the result in
    place; with host lists and ``checked`` images (their range checked on the host,
    :func:`~overinterp_fast.runtime.batching.check_candidates`) nothing is read back, else the images are checked
    once here."""
    dev = images.device
    m = images.shape[0]
    if m == 0:
        return torch.zeros(0, 3, dtype=torch.float64, device=dev)
    if not checked:
        check_candidates(evaluator.prep, images)  # once, not per chunk
    shape = evaluator.padded_rows
    most = max(shape(min(m, evaluator.runner.chunk)), min(m, evaluator.runner.chunk))
    # the chunks' candidate lists at their batch shapes, made once: images (the last repeated past m), painted
    # maps 0, 1, ... and no feature dropped
    padded, at, none = upload(dev, np.arange(m + most), np.arange(most), np.full(most, -1))
    padded = images[padded.clamp_(max=m - 1)]
    out = torch.empty((m, 3), dtype=torch.float64, device=dev)

    def score(sl: slice, cover: torch.Tensor) -> None:
        k, n = cover.shape[0], sl.stop - sl.start
        img = padded[sl.start:sl.start + k]
        keep = (cover.view(k, h * w) > 0) & present[img]
        f, top1 = evaluator(keep, img, at[:k], none[:k], check_indices=False)
        mine = out[sl]
        mine[:, 0].copy_(f[:n])
        mine[:, 1].copy_(top1[:n])
        torch.sum(keep[:n], 1, dtype=torch.float64, out=mine[:, 2])

    _rect_cover(evaluator.runner, rects, owner, None, m, h, w, dev, score,
                maps=lambda n: max(n, shape(n)))
    return out


def select_mutants(rects: torch.Tensor, owner: torch.Tensor, m: int, rows: torch.Tensor) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """The rectangles of mutants ``rows`` (int64 [k], ascending) among m mutants given by rectangles ``rects``
    (int64 [R, 4]) of mutant ``owner`` (int64 [R] in [0, m)), on ``rows``' device: (their rectangles, their owners
    renumbered: j for mutant ``rows[j]``)."""
    dev = rows.device
    renumber = torch.full((m,), -1, dtype=torch.int64, device=dev)
    renumber[rows] = torch.arange(len(rows), device=dev)
    owner = owner.to(dev)
    mine = renumber[owner] >= 0
    return rects.to(dev)[mine], renumber[owner[mine]]


def score_painted_rows(evaluator: CandidateEvaluator, rects: torch.Tensor, owner: torch.Tensor, images: torch.Tensor,
                       rows: torch.Tensor, present: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """:func:`score_painted` of some of m mutants: ``rows`` (int64 [k], ascending, on ``images``' device) of the
    mutants given by rectangles ``rects`` of mutant ``owner`` of ``images`` (int64 [m]; :func:`select_mutants`).
    Returns float64 [k, 3], row j for mutant ``rows[j]``."""
    sub_rects, sub_owner = select_mutants(rects, owner, images.shape[0], rows)
    return score_painted(evaluator, sub_rects, sub_owner, images[rows], present, h, w)


def _score_keys(evaluator: CandidateEvaluator, rects: list, owner: list, evals: list[int], keys: list[tuple],
                present: torch.Tensor, cache: MutantCache, h: int, w: int, dev) -> None:
    """Score new mutants (rectangles ``rects`` of mutant ``owner``, of images ``evals``) into the cache.

    An evaluator with a ``score_rectangles(rects, owner, images, present)`` method (the surrogates of
    :mod:`overinterp_fast.experimental.surrogate`) scores them from the rectangles, and may add a fourth column: 1 where
    the model was asked, 0 where the answer is the surrogate's (the key goes to ``cache.guessed``); any
    other evaluator gets painted masks (:func:`score_painted`).
    """
    score_rectangles = getattr(evaluator, "score_rectangles", None)
    if score_rectangles is not None:  # an evaluator that reads the rectangles itself (surrogate.py): no painting
        img_all, rect_t, owner_t = upload(dev, evals, rects, owner)  # one host-to-device copy
        scored = score_rectangles(rect_t.view(-1, 4), owner_t, img_all, present)
    else:  # score_painted uploads the rectangles itself (_rect_cover)
        check_candidates(evaluator.prep, evals)  # on the host: no device wait
        (img_all,) = upload(dev, evals)
        scored = score_painted(evaluator, rects, owner, img_all, present, h, w, checked=True)
    (scored,) = to_host(scored, label="mutants")  # the round's one read
    for key, row in zip(keys, scored.tolist()):
        cache.scores[key] = (row[0], bool(row[1]), int(row[2]))
        if len(row) > 3 and not row[3]:
            cache.guessed.add(key)


def descend(
    evaluator: CandidateEvaluator,
    prep: Prepared,
    present: torch.Tensor,
    passes,
    descents: list[tuple[int, int]],
    depth: int,
    min_box: int,
    cache: MutantCache,
    progress: bool | None = None,
    monotone: bool = False,
    per_image: bool = False,
) -> tuple[torch.Tensor, list[int]]:
    """Run the given descents (image, seed) together: (float64 [D, H, W] log per-iteration maps,
    queries per image of ``prep``).

    ``per_image``: the log maps of each image's descents summed, descent by descent in the given order: float64
    [N, H, W] (zero for an image with no descent). Memory: one map per image, not per descent (100 descents of
    a 224 x 224 image would hold 40 MB).

    ``present``: bool [N, H*W], the pixels that may be kept (others stay masked:
    used by collections). ``passes(image, f, top1) -> bool``.

    ``monotone``: score each split's mutants in three rounds (keeping 3 quadrants, then 2, then 1) and
    take a mutant none of whose scored supersets (mutants of the same split that keep more
    quadrants) passed as failing, without a query: exact where passing is monotone in the pixels
    kept; the top-1 criterion of a real model is nearly so (on EfficientNet-Lite0, 1.3% of the
    passing mutants were missed at 71% of the queries). False: every mutant is scored (ReX).

    Host reads: one :func:`~overinterp_fast.runtime.sync.to_host` per scoring round that has mutants to score
    (so at most one per level, three with ``monotone``), none for the maps.
    """
    n, _, h, w = prep.images.shape
    dev = prep.images.device
    run = _DescentRun(evaluator, present, passes, cache, monotone, h, w, dev,
                      [_Descent(i, descent_rng(s), [(0, 0, h, w)]) for i, s in descents], [0] * n, [], [], [])
    bar = tqdm(total=depth, unit="level", desc="responsibility", disable=None if progress is None else not progress)
    level = 0
    while any(d.alive for d in run.state):
        splits = run.splits(min_box)
        if not splits:
            break
        run.refine(run.score_level(splits, level), depth)
        bar.update(1)
        level += 1
    bar.close()
    return run.log_maps(descents, per_image, n), run.queries


@dataclass
class _DescentRun:
    """The descents of one :func:`descend` call, level by level, and what their levels share: the scoring
    (``evaluator``, ``present``, ``passes``, the ``cache``, ``monotone``), the image size, each descent's
    state, the queries per image and the responsibility rectangles gathered (rectangle, descent, weight)."""

    evaluator: CandidateEvaluator
    present: torch.Tensor
    passes: Callable
    cache: MutantCache
    monotone: bool
    h: int
    w: int
    dev: torch.device
    state: list[_Descent]
    queries: list[int]
    resp_rects: list[tuple[int, int, int, int]]
    resp_owner: list[int]
    resp_weight: list[int]

    def splits(self, min_box: int) -> list[tuple[int, list[tuple], list[tuple]]]:
        """The splits of this level: (descent, quadrants, the other active boxes). A live descent with no box
        of ``min_box`` pixels stops."""
        splits = []
        for di, d in enumerate(self.state):
            if not d.alive:
                continue
            made = False
            for b, box in enumerate(d.active):
                if _area(box) < min_box:
                    continue
                splits.append((di, _split(box, d.rng), d.active[:b] + d.active[b + 1:]))
                made = True
            if not made:
                d.alive = False
        return splits

    def score_level(self, splits: list, level: int) -> list:
        """The mutants of this level: (descent, kept quadrants, key, passed), split by split, subsets in SUBSETS
        order. Mutants of one image with the same non-empty rectangles (empty quadrants make these, in this
        level or before) share one pass."""
        cache = self.cache
        mutants: list = []  # (split, subset, descent, kept quadrants, key, passed)
        if len(cache.level_queries) <= level:
            cache.level_queries.append(0)
        done: dict[tuple[int, int], bool] = {}  # (split, subset) -> passed (evaluated or inferred)
        for group in _ROUNDS if self.monotone else (range(len(SUBSETS)),):
            for si, k, di, kept, key in self._score_round(splits, group, done, level):
                fk, tk, _ = cache.scores[key]
                done[si, k] = bool(self.passes(self.state[di].image, fk, tk))
                mutants.append((si, k, di, kept, key, done[si, k]))
        mutants.sort(key=lambda mu: mu[:2])  # split by split, subsets in SUBSETS order (ties of the best below)
        return [mu[2:] for mu in mutants]

    def _score_round(self, splits: list, group, done: dict, level: int) -> list:
        """Score the mutants of subsets ``group`` of every split that the cache does not hold (monotone: not
        those taken as failing, which go to ``done``): (split, subset, descent, kept quadrants, key) of each."""
        cache = self.cache
        rects, owner, evals, keys = [], [], [], []
        new: set[tuple] = set()
        round_mutants = []
        for si, (di, quads, static) in enumerate(splits):
            d = self.state[di]
            for k in group:
                if self.monotone and SUPERSETS[k] and skipped(k, [done[si, u] for u in SUPERSETS[k]]):
                    done[si, k] = False  # no superset passed: taken as failing, not scored
                    continue
                kept = [quads[c] for c in SUBSETS[k]]
                shown = sorted({r for r in kept + static if _area(r) > 0})
                key = (d.image, *shown)
                if key in cache.scores or key in new:  # answered already, or by the same input's pass
                    cache.hits += 1
                else:
                    new.add(key)
                    keys.append(key)
                    evals.append(d.image)
                    rects.extend(shown)
                    owner.extend([len(evals) - 1] * len(shown))
                round_mutants.append((si, k, di, kept, key))
        if evals:
            _score_keys(self.evaluator, rects, owner, evals, keys, self.present, cache, self.h, self.w, self.dev)
            for key in keys:  # a query: the model answered (not a surrogate)
                if key not in cache.guessed:
                    self.queries[key[0]] += 1
                    cache.level_queries[level] += 1
        return round_mutants

    def refine(self, mutants: list, depth: int) -> None:
        """Per descent: stop where no mutant passed; otherwise add the responsibility of its mutants predicted
        as the target and refine the smallest passing one."""
        cache = self.cache
        by_descent: dict[int, list[int]] = {}
        for mi, (di, _, _, _) in enumerate(mutants):
            by_descent.setdefault(di, []).append(mi)
        for di, mis in by_descent.items():
            d = self.state[di]
            res = [cache.scores[mutants[mi][2]] for mi in mis]
            ok = [mi for mi in mis if mutants[mi][3]]
            if not ok:
                d.alive = False
                continue
            for mi, (_, tm, _) in zip(mis, res):  # every mutant predicted as the target shares 1 among its kept quadrants
                if tm:
                    kept = mutants[mi][1]
                    for q in kept:
                        self.resp_rects.append(q)
                        self.resp_owner.append(di)
                        self.resp_weight.append(_UNIT // len(kept))
            # the passing mutant with the smallest unmasked area (ties: the first) is refined next
            best = min(ok, key=lambda mi: (cache.scores[mutants[mi][2]][2], mi))
            d.active = [q for q in mutants[best][1] if _area(q) > 0]
            d.level += 1
            if d.level >= depth:
                d.alive = False

    def log_maps(self, descents: list[tuple[int, int]], per_image: bool, n: int) -> torch.Tensor:
        """The log per-iteration maps: float64 [D, H, W], or [N, H, W] summed per image (``per_image``).

        Each image's maps are added descent by descent in the given order, one descent of an image per addition:
        no two additions into one map run at once, so the sums do not depend on the device's scheduling (an
        index_add_ with repeated rows adds in any order on CUDA, and ties of the ranking would break apart).
        """
        h, w, dev = self.h, self.w, self.dev
        rows = [i for i, _ in descents] if per_image else list(range(len(self.state)))
        seen: dict[int, int] = {}
        step = []  # each descent's place among the descents of its map
        for r in rows:
            step.append(seen.get(r, 0))
            seen[r] = step[-1] + 1
        out = torch.zeros(n if per_image else len(self.state), h, w, dtype=torch.float64, device=dev)

        def add_logs(sl: slice, acc: torch.Tensor) -> None:
            logs = torch.log1p(acc.double() / _UNIT)
            by_step: dict[int, list[int]] = {}
            for j in range(sl.start, sl.stop):
                by_step.setdefault(step[j], []).append(j)
            groups = [by_step[k] for k in sorted(by_step)]
            parts = upload(dev, *([j - sl.start for j in g] for g in groups), *([rows[j] for j in g] for g in groups))
            for at, row in zip(parts[: len(groups)], parts[len(groups):]):
                out.index_add_(0, row, logs[at])

        _rect_cover(self.evaluator.runner, self.resp_rects, self.resp_owner, self.resp_weight, len(self.state), h, w,
                    dev, add_logs)
        return out


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
    monotone: bool = False,
    cache: MutantCache | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """Responsibility of every image's pixels: (float64 [N, H, W], queries per image).

    All ``iterations`` descents of every image (seeds seed + t) in one batched descent;
    see :func:`descend` (and its ``monotone``). ``cache``: the mutant cache to use (None: a new one).
    """
    descents = [(i, seed + t) for i in range(prep.images.shape[0]) for t in range(iterations)]
    return descend(evaluator, prep, present, passes, descents, depth, min_box,
                   MutantCache() if cache is None else cache, progress, monotone, per_image=True)


AUTO_MAX_ITERATIONS = 20  # iterations="auto" never runs more than ReX's default
# The stopping rule, chosen from data (docs: notes/measurements.md, "Choosing the `iterations="auto"` rule from data"):
# stop an image after iteration t >= AUTO_MIN_ITERATIONS once the AUTO_TOP_FRACTION top-ranked pixels have kept a
# Dice of at least AUTO_DICE with those of the iteration before for AUTO_PATIENCE iterations in a row.
AUTO_MIN_ITERATIONS = 6
AUTO_PATIENCE = 2
AUTO_DICE = 0.95
AUTO_TOP_FRACTION = 0.025


@dataclass
class AutoInfo:
    """What iterations="auto" did per image: the iterations run, and the mutant cache's hits."""

    iterations: list[int]
    cache_hits: int


def _dice(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Dice of the sets ``a`` and ``b`` (bool [..., p]) row by row: float64 [...] on their device, 2 |a & b| /
    (|a| + |b|), 1 where both are empty."""
    total = a.sum(-1) + b.sum(-1)
    both = (a & b).sum(-1)
    return torch.where(total == 0, 1.0, 2 * both.double() / total.clamp(min=1).double())


def auto_responsibility(
    evaluator: CandidateEvaluator,
    prep: Prepared,
    present: torch.Tensor,
    passes,
    depth: int,
    min_box: int,
    seed: int,
    progress: bool | None,
    patience: int = AUTO_PATIENCE,
    min_dice: float = AUTO_DICE,
    max_iterations: int = AUTO_MAX_ITERATIONS,
    top_fraction: float = AUTO_TOP_FRACTION,
    min_iterations: int = AUTO_MIN_ITERATIONS,
    monotone: bool = False,
    cache: MutantCache | None = None,
) -> tuple[torch.Tensor, list[int], AutoInfo]:
    """Responsibility with as many iterations as each image needs: (float64 [N, H, W], queries, AutoInfo).

    Iteration t of an image is its descent seeded seed + t (as in :func:`compute_responsibility`), with one
    mutant cache for all levels and iterations. After every iteration, the K = ceil(``top_fraction`` x allowed
    pixels) top-ranked pixels are compared with those of the iteration before (no query); an image stops after
    iteration t >= ``min_iterations`` once their Dice has been at least ``min_dice`` for ``patience`` iterations
    in a row, or after ``max_iterations``. ``monotone``: see :func:`descend`. ``cache``: the mutant cache to use
    (None: a new one).

    The iterations an image must run whatever their Dice (the first ``max(min_iterations, patience + 1)``, then
    ``patience`` minus its calm iterations so far) run together, those of all images in one batched descent
    (:meth:`_AutoRun.block`; images in groups whose log maps fit ``AUTO_BLOCK_BYTES``): the stops, maps and
    queries of one iteration at a time, in a few rounds of ``depth`` levels. Host reads: the allowed pixels
    once, then the Dice of each block and group once.
    """
    n, _, h, w = prep.images.shape
    (allowed,) = to_host(present.sum(1), label="auto start")
    run = _AutoRun(evaluator, prep, present, passes, depth, min_box, seed, monotone,
                   MutantCache() if cache is None else cache,
                   total=torch.zeros(n, h, w, dtype=torch.float64, device=prep.images.device),
                   last=torch.zeros_like(present), size=[max(1, math.ceil(c * top_fraction)) for c in allowed.tolist()],
                   queries=[0] * n, runs=[0] * n)
    calm = [0] * n
    active = [i for i, c in enumerate(allowed.tolist()) if c > 0]
    bar = tqdm(total=max_iterations, unit="iteration", desc="responsibility",
               disable=None if progress is None else not progress)
    runs = run.runs
    while active:
        # iterations that cannot stop the image: calm grows by at most one per iteration, and not at its first
        need = {i: min(max_iterations - runs[i],
                       max(min_iterations - runs[i], patience - calm[i] + (runs[i] == 0), 1)) for i in active}
        dice = {}
        for group in _auto_groups(active, need, h * w):
            dice.update(run.block(group, need))
        still = []
        for i in active:
            for j, d in enumerate(dice[i]):
                if runs[i] + j > 0:  # an image runs from iteration 0 on: later ones have an iteration before
                    calm[i] = calm[i] + 1 if d >= min_dice else 0
            runs[i] += need[i]
            if runs[i] < max_iterations and (runs[i] < min_iterations or calm[i] < patience):
                still.append(i)
        active = still
        bar.update(max(runs) - bar.n)
    bar.close()
    return run.total, run.queries, AutoInfo(runs, run.cache.hits)


AUTO_BLOCK_BYTES = 1 << 28  # iterations="auto": the log maps of one batched descent stay under this (float64)


def _auto_groups(active: list[int], need: dict[int, int], pixels: int) -> list[list[int]]:
    """``active`` in groups whose descents' log maps (``need[i]`` maps of ``pixels`` float64 per image) fit in
    AUTO_BLOCK_BYTES (at least one image per group)."""
    groups, cur, used = [], [], 0
    for i in active:
        cost = need[i] * pixels * 8
        if cur and used + cost > AUTO_BLOCK_BYTES:
            groups.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += cost
    return groups + [cur] if cur else groups


@dataclass
class _AutoRun:
    """The descents of one :func:`auto_responsibility` call and what they share: the scoring (``evaluator``,
    ``present``, ``passes``, ``monotone``, the ``cache``), the descent options, and per image the summed log
    maps (``total`` float64 [N, H, W]), the top pixels after its last iteration (``last`` bool [N, H*W]), how
    many top pixels it compares (``size``), its queries and its iterations run (``runs``)."""

    evaluator: CandidateEvaluator
    prep: Prepared
    present: torch.Tensor
    passes: Callable
    depth: int
    min_box: int
    seed: int
    monotone: bool
    cache: MutantCache
    total: torch.Tensor
    last: torch.Tensor
    size: list[int]
    queries: list[int]
    runs: list[int]

    def block(self, group: list[int], need: dict[int, int]) -> dict[int, list[float]]:
        """The next ``need[i]`` iterations of the images of ``group`` (from iteration ``runs[i]``) in one batched
        descent: their log maps added into ``total`` iteration by iteration, in order, as one iteration at a
        time would; ``last`` and ``queries`` follow (``runs`` is the caller's to advance). Returns each image's
        Dice after each of its new iterations (one read for the block)."""
        dev = self.total.device
        descents = [(i, self.seed + self.runs[i] + j) for i in group for j in range(need[i])]
        # no bar per descent: the bar of iterations stands for them (progress=False silences both)
        logs, q = descend(self.evaluator, self.prep, self.present, self.passes, descents, self.depth, self.min_box,
                          self.cache, progress=False, monotone=self.monotone)
        for i in group:
            self.queries[i] += q[i]
        at = np.cumsum([0] + [need[i] for i in group[:-1]]).tolist()  # each image's first descent in ``descents``
        dice = []
        for j in range(max(need[i] for i in group)):  # iteration by iteration: the images still in the block
            mine = [(i, a) for i, a in zip(group, at) if j < need[i]]
            rows, pick, k = upload(dev, [i for i, _ in mine], [a + j for _, a in mine],
                                   [self.size[i] for i, _ in mine])
            self.total.index_add_(0, rows, logs[pick])
            top = ranking_positions(self.total[rows].view(len(mine), -1), self.present[rows]) < k.view(-1, 1)
            dice.append(_dice(top, self.last[rows]))
            self.last[rows] = top
        (flat,) = to_host(torch.cat(dice), label="auto stop")  # the block's one read
        values = iter(flat.tolist())
        out: dict[int, list[float]] = {i: [] for i in group}
        for j in range(len(dice)):
            for i in group:
                if j < need[i]:
                    out[i].append(next(values))
        return out


@dataclass(frozen=True)
class RankingHook:
    """Where research code (:mod:`overinterp_fast.experimental`) plugs into :func:`ranking_maps`.

    Attributes:
        descents: runs an int number of real descents instead of :func:`compute_responsibility` (same
            arguments and result); None: :func:`compute_responsibility`.
        after: ``after(maps, queries, cache, evaluator, prep, present, passes, plan) -> (maps, queries)``, called
            once the real descents are done (``maps`` float64 [N, H, W], ``queries`` per image, ``cache`` their
            :class:`MutantCache`, ``plan`` the :class:`DescentPlan`); None: the real descents' maps as they are.
    """

    descents: Callable | None = None
    after: Callable | None = None


@dataclass(frozen=True)
class DescentPlan:
    """The descents :func:`ranking_maps` runs.

    Attributes:
        iterations: descents per image (an int: seeds seed + t; "auto": :func:`auto_responsibility`).
        depth: levels per descent at most. min_box: boxes with a smaller area (pixels) are not split.
        seed: the first descent's seed (an int >= 0).
        progress: show a progress bar (None: only on a terminal).
        monotone: see :func:`descend`.
        hook: research code's :class:`RankingHook` (None: the plain descents).
    """

    iterations: int | str
    depth: int = 10
    min_box: int = 10
    seed: int = 0
    progress: bool | None = None
    monotone: bool = False
    hook: RankingHook | None = None


def ranking_maps(evaluator, prep: Prepared, present: torch.Tensor, passes,
                 plan: DescentPlan) -> tuple[torch.Tensor, list[int]]:
    """The maps minimal pixel sets and responsibility maps rank by: ``plan.iterations`` real descents per image
    with one mutant cache (an int: :func:`compute_responsibility`, or the hook's ``descents``; "auto":
    :func:`auto_responsibility`), then the hook's ``after``.

    Args:
        evaluator: scores mutants (f, top-1 is the target). prep: the prepared images [N, C, H, W].
        present: bool [N, H*W], the pixels that may be kept. passes: ``passes(image, f, top1) -> bool``.
        plan: the :class:`DescentPlan`.

    Returns:
        (float64 [N, H, W] the summed log maps, the model's queries per image).
    """
    cache = MutantCache()
    hook = plan.hook or RankingHook()
    if plan.iterations == "auto":
        maps, queries, _ = auto_responsibility(evaluator, prep, present, passes, plan.depth, plan.min_box, plan.seed,
                                               plan.progress, monotone=plan.monotone, cache=cache)
    else:
        real = hook.descents or compute_responsibility
        maps, queries = real(evaluator, prep, present, passes, plan.iterations, plan.depth, plan.min_box, plan.seed,
                             plan.progress, monotone=plan.monotone, cache=cache)
    if hook.after is not None:
        maps, queries = hook.after(maps, queries, cache, evaluator, prep, present, passes, plan)
    return maps, queries
