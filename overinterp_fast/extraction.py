"""Sufficient sets from a ranking (minimal pixel sets), with collections of disjoint sets."""
from __future__ import annotations

from typing import Callable

import torch

from .batching import CandidateEvaluator
from .inputs import Prepared
from .prefix import first_passing_prefix, verify_prefix_sets
from .results import SISResult, first_with_collection


def extract_sets(
    evaluator: CandidateEvaluator,
    prep: Prepared,
    targets: torch.Tensor,
    scores0: torch.Tensor,
    rank_fn: Callable[[torch.Tensor], tuple[torch.Tensor, list[int] | None]],
    passes: Callable[[int, float, bool], bool],
    step: int,
    collection: bool,
    thresholds: list[float],
    verifier: CandidateEvaluator | None = None,
    engine: str = "torch",
) -> list[SISResult]:
    """Per image, the first prefix of its ranking (in steps of ``step`` features) that passes.

    ``rank_fn(present)`` ranks the features still allowed (bool [N, p]) and returns
    (scores float [N, p], queries per image or None). With ``collection``, each set
    found is masked and the ranking recomputed on the rest, while the rest passes.
    ``passes(image, f, top1)``. With ``verifier`` (the user's model, when ``evaluator``
    runs a stand-in engine named ``engine``), each set is checked there and, where it
    fails, the next prefix sizes are tried on the user's model until one passes.
    """
    from .responsibility import ranking_positions

    dev = prep.images.device
    n, p = prep.images.shape[0], prep.num_features
    present = torch.ones((n, p), dtype=torch.bool, device=dev)
    rounds: list[list[SISResult]] = [[] for _ in range(n)]
    round_score = scores0.tolist()
    active = list(range(n))
    while active:
        rows = torch.tensor(active, device=dev)
        scores, queries = rank_fn(present)
        pos = ranking_positions(scores[rows].reshape(len(active), p), present[rows])
        counts = present[rows].sum(1).tolist()
        sizes = [list(range(step, c, step)) + [c] if c else [] for c in counts]
        rows_pass = lambda r, f, top1, active=active: passes(active[r], f, top1)
        hits = first_passing_prefix(evaluator, pos, active, sizes, rows_pass)
        if verifier is not None:
            hits = _verify(verifier, pos, active, counts, sizes, hits, rows_pass, p)
        pos_cpu, scores_cpu = pos.cpu(), scores[rows].reshape(len(active), p).double().cpu()
        nxt = []
        for r, i in enumerate(active):
            order = torch.argsort(pos_cpu[r])[: counts[r]]
            hit = hits[r]
            found = None if hit is None else order[: sizes[r][hit[0]]].clone()
            rounds[i].append(
                SISResult(
                    order=order, values=scores_cpu[r, order], sis=found,
                    mask=None if found is None else prep.feature_mask(found), target=int(targets[i]),
                    score=round_score[i], threshold=thresholds[i], sis_score=None if hit is None else hit[1],
                    queries=None if queries is None else queries[i], engine=engine,
                )
            )
            if collection and found is not None and 0 < found.numel() < counts[r]:
                present[i, found.to(dev)] = False
                nxt.append(i)
        if nxt:  # does what is left still pass?
            rows = torch.tensor(nxt, device=dev)
            f, top1 = evaluator(present, rows, rows, torch.full_like(rows, -1))
            nxt_active = []
            for i, fi, ti in zip(nxt, f.tolist(), top1.tolist()):
                if passes(i, fi, ti):
                    round_score[i] = fi
                    nxt_active.append(i)
            nxt = nxt_active
        active = nxt
    return [first_with_collection(r, collection) for r in rounds]


def _verify(verifier, pos, active, counts, sizes, hits, rows_pass, p) -> list[tuple[int, float] | None]:
    """Re-check each row's hit on the user's model; where it fails, continue with the larger prefixes."""
    todo = [r for r, h in enumerate(hits) if h is not None]
    if not todo:
        return hits
    pos_cpu = pos.cpu()
    keep_first = [torch.argsort(pos_cpu[r])[: counts[r]] for r in todo]
    rest = [sizes[r][hits[r][0]:] for r in todo]
    checked = verify_prefix_sets(verifier, [active[r] for r in todo], keep_first, rest,
                                 lambda k, f, top1: rows_pass(todo[k], f, top1), p)
    out = list(hits)
    for r, c in zip(todo, checked):
        out[r] = None if c is None else (hits[r][0] + c[0], c[1])
    return out
