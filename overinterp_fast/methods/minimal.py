"""Pruning a sufficient set until it is 1-minimal: removing any single feature breaks the criterion.

Candidates are tried in a given order (for minimal pixel sets: least responsible
first). A greedy pass walks the order and removes a candidate when the set without
it still passes; removal is tried in adaptive blocks (a block of B consecutive
candidates in one query: passing doubles B, failing halves it) and, at B = 1, as W
single removals evaluated side by side (the first that passes is taken; the ones
before it are kept; W doubles while all fail). Every round evaluates one batch
across all rows, built on the device from one upload of host indices, and reads its
answers back in one transfer (:func:`~overinterp_fast.runtime.sync.to_host`); the host
keeps its own copy of the current sets, so planning a round reads nothing. The
criterion need not be monotone, so a kept feature's failing
test only counts while the set it was tested against is the final one: after a
pass, the features tested before a later removal are tested again, until a pass
removes nothing. The result is then 1-minimal by direct test, and passes.

Certifying 1-minimality costs at least one query per feature of the result (each
kept feature's removal must be seen to fail): at 224x224 a set of 3,000 pixels
costs 3,000+ queries. With a per-row ``budget`` the pass stops once a row has spent
it: the set still passes (a removal is only taken when the smaller set passed) and
is no larger than the input, but it is not certified 1-minimal (``certified`` False).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..runtime.batching import CandidateEvaluator, check_candidates
from ..runtime.model import check_finite_host
from ..runtime.schedule import upload
from ..runtime.sync import to_host

MAX_WIDTH = {"cuda": 1024}  # single removals evaluated side by side per row and round; others: 32


@dataclass
class _Row:
    order: list[int]  # candidates, in the order they are tried
    f: float  # f on the current set
    queue: list[int] = field(default_factory=list)
    j: int = 0
    block: int = 1
    width: int = 1
    removals: int = 0
    tested: dict[int, int] = field(default_factory=dict)  # feature -> removals when its removal failed
    queries: int = 0
    done: bool = False
    budget: int | None = None  # queries this row may spend (None: no limit)
    certified: bool = False  # the pass ended with every kept feature's removal seen to fail


def prune_to_minimal(
    evaluator: CandidateEvaluator,
    sets: torch.Tensor,
    orders: list[list[int]],
    images: list[int],
    scores: list[float],
    passes: Callable[[int, float, bool], bool],
    known_failing: list[int | None] | None = None,
    budget: int | None = None,
) -> tuple[torch.Tensor, list[float], list[int], list[bool]]:
    """Prune every row's passing set to a 1-minimal one.

    Args:
        evaluator: scores candidates (measure returning (f, top-1 correct)).
        sets: bool [R, p] on the images' device: the passing sets (each row's features present).
        orders: per row, the features of its set in the order removal is tried.
        images: the image of each row. scores: f on each row's set.
        passes: passes(row, f, top1) -> bool.
        known_failing: per row, a feature whose removal from the given set is already
            known to fail (e.g. the last pixel of a boundary prefix): not queried again.
        budget: the most queries a row may spend (None: no limit, every row ends 1-minimal).

    Returns:
        (bool [R, p] the pruned sets, f on each, queries per row, per row whether the set
        is certified 1-minimal: False where the budget ran out first).
    """
    dev = sets.device
    cur = sets.clone()
    (kept,) = to_host(sets, label="pruning start")
    kept = kept.clone()  # the host's copy of ``cur``, changed with it
    wmax = MAX_WIDTH.get(dev.type, 32)
    rows = _start_rows(orders, scores, known_failing, budget)
    zero = cur.new_zeros(())  # the value of cleared features, on the device (no host scalar to copy: no wait)
    while True:
        plan = _plan_round(rows, kept)
        if not plan:
            break
        base, (clear_at, clear_feat), img, prow, feat = _round_candidates(plan, images)
        check_candidates(evaluator.prep, img, prow, feat, len(base))  # on the host: no device wait
        base_t, clear_at_t, clear_feat_t, img_t, prow_t, feat_t = upload(dev, base, clear_at, clear_feat, img, prow,
                                                                          feat)  # one host-to-device copy
        present = cur[base_t]
        present.index_put_((clear_at_t, clear_feat_t), zero)
        f, top1 = evaluator(present, img_t, prow_t, feat_t, check_indices=False)
        f, top1 = to_host(f, top1, label="pruning")  # the round's one read
        check_finite_host(f)
        at, gone = _apply_round(plan, rows, f.tolist(), top1.tolist(), passes, wmax)
        if at:  # what passed leaves the sets, on the host and on the device
            kept[at, gone] = False
            at_t, gone_t = upload(dev, at, gone)
            cur.index_put_((at_t, gone_t), zero)
    return cur, [row.f for row in rows], [row.queries for row in rows], [row.certified for row in rows]


def _start_rows(orders: list[list[int]], scores: list[float], known_failing: list[int | None] | None,
                budget: int | None) -> list[_Row]:
    """Each row's state before the first pass: its queue is its order, less a feature known to fail."""
    rows = [_Row(list(o), float(s), budget=budget) for o, s in zip(orders, scores)]
    for r, row in enumerate(rows):
        row.queue = row.order
        if known_failing and known_failing[r] is not None:
            row.tested[known_failing[r]] = 0
            row.queue = [c for c in row.order if c != known_failing[r]]
    return rows


def _plan_round(rows: list[_Row], kept: torch.Tensor) -> list[tuple[int, str, list[int]]]:
    """What each unfinished row tries this round: (row, kind, features), kind "block" removes all the features
    at once, "single" one each. Rows at the end of a pass start the next one (or finish, certified); rows out of
    budget finish. ``kept``: bool [R, p] on the host, each row's current set."""
    plan = []
    for r, row in enumerate(rows):
        if row.done:
            continue
        if row.j >= len(row.queue):  # end of a pass: retest what a later removal made stale
            live = kept[r, row.order].tolist()
            row.queue = [c for c, keep in zip(row.order, live) if keep and row.tested.get(c, -1) < row.removals]
            row.j, row.block, row.width = 0, 1, 1
            if not row.queue:
                row.done = row.certified = True
                continue
        left = None if row.budget is None else row.budget - row.queries
        if left is not None and left <= 0:  # out of budget: the set passes, but is not certified
            row.done = True
            continue
        if row.block > 1:
            plan.append((r, "block", row.queue[row.j : row.j + row.block]))
        else:
            plan.append((r, "single", row.queue[row.j : row.j + (row.width if left is None else min(row.width, left))]))
    return plan


def _round_candidates(plan: list[tuple[int, str, list[int]]], images: list[int]) -> tuple[
        list[int], tuple[list[int], list[int]], list[int], list[int], list[int]]:
    """The round's candidates for the evaluator, as host index lists: (``base``, (``at``, ``feature``), ``img``,
    ``prow``, ``feat``). Present row q is row ``base[q]`` of the current sets, less ``feature[j]`` wherever
    ``at[j]`` is q; candidate b starts from image ``img[b]`` with present row ``prow[b]`` and masks feature
    ``feat[b]`` (-1: none). A block is one present row without its features; singles share their row's current
    set."""
    base, at, cleared, img, prow, feat = [], [], [], [], [], []
    for r, kind, feats in plan:
        base.append(r)
        if kind == "block":
            at += [len(base) - 1] * len(feats)
            cleared += feats
            img.append(images[r])
            prow.append(len(base) - 1)
            feat.append(-1)
        else:
            for c in feats:
                img.append(images[r])
                prow.append(len(base) - 1)
                feat.append(c)
    return base, (at, cleared), img, prow, feat


def _apply_round(plan: list[tuple[int, str, list[int]]], rows: list[_Row], f: list[float], top1: list[bool],
                 passes: Callable[[int, float, bool], bool], wmax: int) -> tuple[list[int], list[int]]:
    """Take the round's answers (f and top-1 per candidate, in plan order): adapt each row's block size and
    width. Returns what passed, to be removed from the current sets: (rows, features), one pair per feature."""
    gone_row: list[int] = []
    gone: list[int] = []
    at = 0
    for r, kind, feats in plan:
        row = rows[r]
        if kind == "block":
            row.queries += 1
            if passes(r, f[at], top1[at]):
                gone_row += [r] * len(feats)
                gone += feats
                row.f, row.removals, row.j = f[at], row.removals + 1, row.j + len(feats)
                row.block *= 2
            else:
                row.block //= 2
                row.width = 1
            at += 1
            continue
        row.queries += len(feats)
        hit = next((i for i in range(len(feats)) if passes(r, f[at + i], top1[at + i])), None)
        for c in feats[: len(feats) if hit is None else hit]:
            row.tested[c] = row.removals
        if hit is None:
            row.j += len(feats)
            row.width = min(2 * row.width, wmax)
        else:
            gone_row.append(r)
            gone.append(feats[hit])
            row.f, row.removals, row.j = f[at + hit], row.removals + 1, row.j + hit + 1
            row.block, row.width = 2, 1
        at += len(feats)
    return gone_row, gone
