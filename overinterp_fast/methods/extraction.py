"""Sufficient sets from a ranking (minimal pixel sets), with collections of disjoint sets."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..runtime.batching import CandidateEvaluator, check_candidates
from .blocks import block_positions, scan_sizes
from ..runtime.inputs import Prepared
from .guided import guided_first_prefix
from .minimal import prune_to_minimal
from .ranking import ranking_positions
from .prefix import boundary_prefix, first_passing_prefix, verify_prefix_sets
from .results import SISResult, first_with_collection
from ..runtime.schedule import upload
from ..runtime.sync import to_host

AUTO_PRUNE_FEATURES = 256  # refine_budget="auto": sets of up to this many features are pruned to 1-minimal


class CountingEvaluator:
    """Wraps a CandidateEvaluator and counts the candidates (forward passes) of each image of n.

    The tally stays on the candidates' device; :attr:`counts` reads it (one read each time it is asked).
    """

    def __init__(self, evaluator: CandidateEvaluator, n: int):
        self.evaluator = evaluator
        self.runner = evaluator.runner
        self.prep = evaluator.prep
        self.n = n
        self._tally: torch.Tensor | None = None  # int64 [n] on the candidates' device, from the first call

    def __call__(self, present, image, row, feature, **kw):
        if self._tally is None:
            self._tally = torch.zeros(self.n, dtype=torch.int64, device=image.device)
        self._tally.index_add_(0, image, torch.ones_like(image))  # (bincount would read its size from the device)
        return self.evaluator(present, image, row, feature, **kw)

    @property
    def counts(self) -> list[int]:
        """Candidates per image so far (n ints), read from the device."""
        if self._tally is None:
            return [0] * self.n
        (tally,) = to_host(self._tally, label="query counts")
        return tally.tolist()


def refined_sets(
    evaluator: CandidateEvaluator,
    pos: torch.Tensor,
    images: list[int],
    counts: list[int],
    passes: Callable[[int, float, bool], bool],
    prune: bool = True,
    budget: int | str | None = None,
    scan: int | list[list[int]] | None = None,
    guide: Callable[[int, float, bool, float], float] | None = None,
) -> tuple[list[tuple[torch.Tensor, int, float, bool | None] | None], list[int], list[int]]:
    """Per row of a ranking (``pos``, int64 [R, p]): a pixel-exact boundary prefix, pruned to a 1-minimal set
    (``prune=False``: the boundary prefix itself). ``budget``: the most pruning queries per row (None: no
    limit); a row that runs out keeps the smaller, still passing set it reached, not certified 1-minimal.
    "auto": rows whose boundary prefix holds at most ``AUTO_PRUNE_FEATURES`` features are pruned without
    limit; larger ones keep the boundary prefix (not certified: certifying costs a query per feature).

    The boundary: with ``scan``, the first passing prefix of the sizes scan, 2 scan, ... (an int:
    ReX's extraction) or of the given ascending sizes per row (a list: e.g. the ends of the squares
    of :func:`~overinterp_fast.methods.blocks.block_positions`); on a criterion that is far from monotone, as
    the top-1 class of a large model over prefix sizes, a scan finds the first passing window, which
    an exponential search jumps over. Then bisection inside that last step. Without, an exponential search from 10
    (:func:`~overinterp_fast.methods.prefix.boundary_prefix`, about 2 log2(k) queries). With ``scan`` an int
    and ``guide`` (slack(row, f, top1, margin): :func:`~overinterp_fast.methods.guided.guided_first_prefix`),
    the scan's first passing size is searched for where the slacks of a few tried sizes say it may
    lie, instead of trying every size up to it.

    Returns:
        (per row (the set's features in ranking order, the boundary prefix size, f on the set, whether
        the set is certified 1-minimal: None without pruning) or None when even the whole row fails;
        queries of the boundary search per row; of the pruning).
    """
    if scan:
        sizes = scan if isinstance(scan, list) else [list(range(scan, c, scan)) + [c] if c else [] for c in counts]
        if guide is not None and not isinstance(scan, list):
            first, scanned = guided_first_prefix(evaluator, pos, images, sizes, passes, guide)
        else:
            counted = CountingEvaluator(evaluator, max(images, default=-1) + 1)
            first = first_passing_prefix(counted, pos, images, sizes, passes)
            tally = counted.counts
            scanned = [tally[i] for i in images]  # one row per image
        brackets = [None if h is None else (sizes[r][h[0] - 1] if h[0] else 0, sizes[r][h[0]], h[1])
                    for r, h in enumerate(first)]
        hits, q_boundary = boundary_prefix(evaluator, pos, images, [c if b else 0 for c, b in zip(counts, brackets)],
                                           passes, brackets=brackets)
        hits = [None if b is None else h for h, b in zip(hits, brackets)]
        q_boundary = [a + b for a, b in zip(scanned, q_boundary)]
    else:
        hits, q_boundary = boundary_prefix(evaluator, pos, images, counts, passes)
    rows = [r for r, h in enumerate(hits) if h is not None]
    out: list[tuple[torch.Tensor, int, float, bool | None] | None] = [None] * len(images)
    q_prune = [0] * len(images)
    prefix = dict(zip(rows, prefix_features(pos, rows, [hits[r][0] for r in rows])))  # one read
    unpruned = rows if not prune else [r for r in rows if budget == "auto" and hits[r][0] > AUTO_PRUNE_FEATURES]
    for r in unpruned:
        out[r] = (prefix[r], hits[r][0], hits[r][1], None if not prune else False)
    if not prune:
        return out, q_boundary, q_prune
    rows = [r for r in rows if r not in unpruned]
    budget = None if budget == "auto" else budget
    if not rows:
        return out, q_boundary, q_prune
    dev = pos.device
    rows_t, k_t = upload(dev, rows, [hits[r][0] for r in rows])  # one host-to-device copy
    sets = pos[rows_t] < k_t.view(-1, 1)
    orders = [prefix[r].flip(0).tolist() for r in rows]  # least responsible first
    # the boundary's predecessor (prefix k - 1) failed: removing the last pixel is known to fail
    known = [o[0] if hits[r][0] >= 2 else None for o, r in zip(orders, rows)]
    pruned, f, q, certified = prune_to_minimal(evaluator, sets, orders, [images[r] for r in rows],
                                               [hits[r][1] for r in rows], lambda j, fj, tj: passes(rows[j], fj, tj),
                                               known, budget)
    (pruned,) = to_host(pruned, label="pruned sets")
    for j, r in enumerate(rows):
        ranked = prefix[r]
        out[r] = (ranked[pruned[j, ranked]], hits[r][0], f[j], certified[j])
        q_prune[r] = q[j]
    return out, q_boundary, q_prune


def prefix_features(pos: torch.Tensor, rows: list[int], sizes: list[int]) -> list[torch.Tensor]:
    """The features of the prefix of ``sizes[j]`` features of ranking row ``rows[j]`` (``pos`` int64 [R, p], each
    feature's position), in ranking order: one int64 [sizes[j]] CPU tensor per row, all read in one transfer."""
    if not rows:
        return []
    (rows_t,) = upload(pos.device, rows)
    (first,) = to_host(torch.argsort(pos[rows_t], dim=1)[:, : max(sizes)], label="prefixes' features")
    return [first[j, :k].clone() for j, k in enumerate(sizes)]


@dataclass(frozen=True)
class ExtractionConfig:
    """How :func:`extract_sets` extracts a set from a ranking.

    Attributes:
        step: refine=False: the prefix sizes step, step*2, ..., p (ReX's extraction uses 10).
        collection: also find every further disjoint set (the ranking recomputed on the rest).
        verifier: the user's model, when the evaluator runs a stand-in engine named ``engine``; each set is
            checked there. None: the evaluator is the user's model.
        engine: the name of the engine that scores the candidates (``SISResult.engine``).
        refine: False, True or "boundary" (see :func:`extract_sets`).
        refine_budget: the most pruning queries per image and round (None: no limit; "auto": see
            :func:`refined_sets`).
        refine_scan: with refine=True, the boundary is found by a scan in steps of ``refine_scan`` and bisection
            inside the last step (None: by exponential search).
        block: rank pixels square by square, squares of ``block`` x ``block`` pixels (None or 1: pixel by pixel).
        guide: slack(image, f, top1, margin), positive when a prefix passes (None: no guided search).
    """

    step: int = 1
    collection: bool = False
    verifier: CandidateEvaluator | None = None
    engine: str = "torch"
    refine: bool | str = False
    refine_budget: int | str | None = None
    refine_scan: int | None = None
    block: int | None = None
    guide: Callable[[int, float, bool, float], float] | None = None


def extract_sets(
    evaluator: CandidateEvaluator,
    prep: Prepared,
    targets: torch.Tensor,
    scores0: torch.Tensor,
    thresholds: list[float],
    rank_fn: Callable[[torch.Tensor], tuple[torch.Tensor, list[int] | None]],
    passes: Callable[[int, float, bool], bool],
    config: ExtractionConfig = ExtractionConfig(),
) -> list[SISResult]:
    """Per image, a sufficient set from its ranking (the options: :class:`ExtractionConfig`).

    refine=False: the first prefix of the ranking (in steps of ``step`` features) that passes (ReX's
    extraction). refine=True: a pixel-exact boundary prefix (:func:`refined_sets`: a scan in steps of
    ``refine_scan`` or an exponential search, then bisection), pruned to a 1-minimal set
    (:func:`~overinterp_fast.methods.minimal.prune_to_minimal`, least-ranked features first, at most
    ``refine_budget`` queries per image and round; ``SISResult.minimal`` says whether the set is certified).
    refine="boundary": the boundary prefix, not pruned. ``block`` (refine=True or "boundary", pixel features of
    [N, C, H, W] images): rank the pixels square by square
    (:func:`~overinterp_fast.methods.blocks.block_positions`; ``values`` then holds each pixel's square mean) and,
    where a square holds at least ``refine_scan`` pixels, scan one square at a time. ``guide``: the first passing
    prefix in steps of ``refine_scan`` is found by :func:`~overinterp_fast.methods.guided.guided_first_prefix`.

    Args:
        evaluator: scores candidates (f, top-1 is the target). prep: the prepared images [N, *D].
        targets: int64 [N]. scores0: f of each image, float64 [N]. thresholds: one per image.
        rank_fn: ``rank_fn(present)`` ranks the features still allowed (bool [N, p]): (scores float [N, p],
            queries per image or None). With ``collection``, each set found is masked and the ranking recomputed
            on the rest, while the rest passes.
        passes: ``passes(image, f, top1) -> bool``.
        config: the :class:`ExtractionConfig`. With its ``verifier`` (the user's model, when ``evaluator`` runs a
            stand-in engine), each set is checked there and, where it fails, the search goes on there.

    Returns:
        One :class:`~overinterp_fast.methods.results.SISResult` per image, its queries counted: ``queries`` (the
        ranking), ``extraction_queries`` and ``refine_queries``.
    """
    step, collection, verifier, engine = config.step, config.collection, config.verifier, config.engine
    refine, refine_budget, guide = config.refine, config.refine_budget, config.guide
    dev = prep.images.device
    n, p = prep.images.shape[0], prep.num_features
    present = torch.ones((n, p), dtype=torch.bool, device=dev)
    left = [p] * n  # features still present per image (the host's copy of present.sum(1))
    rounds: list[list[SISResult]] = [[] for _ in range(n)]
    round_score, target_list = (t.tolist() for t in to_host(scores0, targets, label="extraction start"))
    active = list(range(n))
    while active:
        (rows,) = upload(dev, active)
        scores, queries = rank_fn(present)
        ranked = scores[rows].reshape(len(active), p)
        pos, ranked, scan = _positions(ranked, present[rows], prep, config)
        counts = [left[i] for i in active]
        row_passes = lambda r, f, top1, active=active: passes(active[r], f, top1)  # noqa: E731
        row_guide = None if guide is None else (
            lambda r, f, top1, margin, active=active: guide(active[r], f, top1, margin))
        if refine:
            refined, extraction, refinement = refined_sets(evaluator, pos, active, counts, row_passes,
                                                           prune=refine is True, budget=refine_budget, scan=scan,
                                                           guide=row_guide)
            if verifier is not None:
                refined = _verify_refined(verifier, pos, active, counts, refined, extraction, refinement, row_passes,
                                          prune=refine is True, budget=refine_budget, scan=scan, guide=row_guide)
            hits = [None if x is None else (x[1], x[2]) for x in refined]
        else:
            hits, extraction = _prefix_hits(evaluator, verifier, pos, active, counts, step, row_passes, n)
        orders, scores_cpu = to_host(torch.argsort(pos, dim=1), ranked.double(), label="rankings")
        nxt, gone = [], []
        for r, i in enumerate(active):
            order = orders[r, : counts[r]].clone()
            hit = hits[r]
            if hit is None:
                found = None
            elif refine:
                found = refined[r][0]
            else:
                found = order[: hit[0]].clone()
            rounds[i].append(
                SISResult(
                    order=order, values=scores_cpu[r, order], sis=found,
                    mask=None if found is None else prep.feature_mask(found), target=target_list[i],
                    score=round_score[i], threshold=thresholds[i], sis_score=None if hit is None else hit[1],
                    queries=None if queries is None else queries[i], engine=engine,
                    extraction_queries=extraction[r],
                    size_before_refine=None if hit is None or not refine else hit[0],
                    refine_queries=refinement[r] if refine else None,
                    minimal=None if hit is None or not refine else refined[r][3],
                )
            )
            if collection and found is not None and 0 < found.numel() < counts[r]:
                gone.append(found)
                left[i] -= found.numel()
                nxt.append(i)
        if nxt:  # each set found leaves its image's features: one copy for all
            img, feat = upload(dev, np.repeat(nxt, [g.numel() for g in gone]), torch.cat(gone))
            present.index_put_((img, feat), present.new_zeros(()))  # no host scalar to copy: no wait
        active = _still_passing(evaluator, present, nxt, passes, round_score)
    return [first_with_collection(r, collection) for r in rounds]


def _positions(ranked: torch.Tensor, present: torch.Tensor, prep: Prepared,
               config: ExtractionConfig) -> tuple[torch.Tensor, torch.Tensor, int | list[list[int]] | None]:
    """(every feature's position int64 [R, p], the scores ranked by [R, p], the refined boundary's scan) of the
    rows ``ranked`` (scores [R, p]) with features ``present`` (bool [R, p]): square by square with a ``block``
    (refine only), else feature by feature."""
    block, refine = config.block, config.refine
    scan = config.refine_scan if refine is True else None
    if refine and block and block > 1:
        h, w = prep.images.shape[-2:]
        pos, ends, ranked = block_positions(ranked, present, h, w, block)
        if scan and block * block >= scan and config.guide is None:
            scan = [scan_sizes(e) for e in ends]
        return pos, ranked, scan
    return ranking_positions(ranked, present), ranked, scan


def _prefix_hits(evaluator, verifier, pos, active, counts, step, row_passes, n) -> tuple[list, list[int]]:
    """refine=False: per row, (the first passing prefix size in steps of ``step``, f on it) or None, checked on
    the ``verifier`` where there is one; and the queries per row."""
    counted = CountingEvaluator(evaluator, n)
    sizes = [list(range(step, c, step)) + [c] if c else [] for c in counts]
    hits = first_passing_prefix(counted, pos, active, sizes, row_passes)
    tally = counted.counts
    if verifier is not None:
        counted_v = CountingEvaluator(verifier, n)
        hits = _verify(counted_v, pos, active, counts, sizes, hits, row_passes, pos.shape[1])
        tally = [a + b for a, b in zip(tally, counted_v.counts)]
    hits = [None if h is None else (sizes[r][h[0]], h[1]) for r, h in enumerate(hits)]
    return hits, [tally[i] for i in active]


def _still_passing(evaluator, present: torch.Tensor, nxt: list[int], passes, round_score: list[float]) -> list[int]:
    """The images of ``nxt`` whose features still ``present`` pass (their next round's f goes to ``round_score``)."""
    if not nxt:
        return []
    check_candidates(evaluator.prep, nxt, nxt, rows=present.shape[0])  # on the host: no device wait
    rows, none = upload(present.device, nxt, [-1] * len(nxt))
    f, top1 = to_host(*evaluator(present, rows, rows, none, check_indices=False), label="rest")
    still = []
    for i, fi, ti in zip(nxt, f.tolist(), top1.tolist()):
        if passes(i, fi, ti):
            round_score[i] = fi
            still.append(i)
    return still


def _verify(verifier, pos, active, counts, sizes, hits, rows_pass, p) -> list[tuple[int, float] | None]:
    """Re-check each row's hit on the user's model; where it fails, continue with the larger prefixes."""
    todo = [r for r, h in enumerate(hits) if h is not None]
    if not todo:
        return hits
    keep_first = prefix_features(pos, todo, [counts[r] for r in todo])
    rest = [sizes[r][hits[r][0]:] for r in todo]
    checked = verify_prefix_sets(verifier, [active[r] for r in todo], keep_first, rest,
                                 lambda k, f, top1: rows_pass(todo[k], f, top1), p)
    out = list(hits)
    for r, c in zip(todo, checked):
        out[r] = None if c is None else (hits[r][0] + c[0], c[1])
    return out


def _verify_refined(verifier, pos, active, counts, refined, extraction, refinement, rows_pass, prune=True,
                    budget=None, scan: int | list[list[int]] | None = None, guide=None) -> list:
    """Check each refined set on the user's model; a row whose set fails there is refined again on it.

    Adds the queries to ``extraction`` / ``refinement`` (in place). The sets were made 1-minimal on
    the stand-in engine; its scores equal the model's up to float noise, so a set that passes on
    the model is 1-minimal there too unless a removal was a near-tie.
    """
    todo = [r for r, x in enumerate(refined) if x is not None]
    if not todo:
        return refined
    dev = pos.device
    p = pos.shape[1]
    sets = torch.zeros((len(todo), p), dtype=torch.bool, device=dev)
    members = [refined[r][0] for r in todo]  # int64 [k] CPU, each set's features
    check_candidates(verifier.prep, [active[r] for r in todo])  # on the host: no device wait
    img, row, feat, at, none = upload(dev, [active[r] for r in todo],
                                      np.repeat(np.arange(len(todo)), [m.numel() for m in members]),
                                      torch.cat(members), range(len(todo)), [-1] * len(todo))  # one copy
    sets.index_put_((row, feat), sets.new_ones(()))  # no host scalar to copy: no wait
    f, top1 = to_host(*verifier(sets, img, at, none, check_indices=False), label="verified sets")
    out = list(refined)
    again = []
    for j, (r, fj, tj) in enumerate(zip(todo, f.tolist(), top1.tolist())):
        refinement[r] += 1
        if rows_pass(r, fj, tj):
            out[r] = (refined[r][0], refined[r][1], fj, refined[r][3])
        else:
            again.append(r)
    if again:
        redo, q_b, q_p = refined_sets(verifier, pos[upload(dev, again)[0]], [active[r] for r in again],
                                      [counts[r] for r in again], lambda k, f, t: rows_pass(again[k], f, t),
                                      prune=prune, budget=budget,
                                      scan=[scan[r] for r in again] if isinstance(scan, list) else scan,
                                      guide=None if guide is None else (
                                          lambda k, f, t, m: guide(again[k], f, t, m)))
        for k, r in enumerate(again):
            out[r] = redo[k]
            extraction[r] += q_b[k]
            refinement[r] += q_p[k]
    return out
