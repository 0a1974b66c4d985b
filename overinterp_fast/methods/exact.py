"""Exact SIS: backward selection, FindSIS and disjoint SIS collections, batched on the device.

State lives on the images' device: per image the present features (bool [N, p]),
a compact list of them (int64 [N, p + 1]), the scores of the step in flight
(float64 [N, p + 1]) and the order/values of the round. Column p of ``remaining``
is a permanent -1, so slot p is "mask nothing": the score of the current input.
The host only schedules (see schedule.py): a step's candidate count is known in advance
(one feature leaves per step), so within a round the host never waits for the device.
It reads device values only through :func:`~overinterp_fast.runtime.sync.to_host`, at
the start and where rounds end or start (FindSIS, the collection logic and the
verification need the values), never per step. The candidate indices are checked where
they are made (the queue's bounds; ``remaining`` is kept valid by backselect_update),
so the ops skip their own per-call checks, each of which would wait for the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..ops import kernels as _ops
from ..runtime.batching import CandidateEvaluator, ChunkRunner
from .findsis import find_sis, sis_score
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores
from .prefix import verify_prefix_sets
from .results import SISResult, first_with_collection
from ..runtime.schedule import CandidateQueue, upload
from ..runtime.sync import to_host

_STEP, _SCORE = 0, 1


class _Image:
    """Host bookkeeping of one image."""

    __slots__ = ("count", "step", "score", "rounds")

    def __init__(self, count: int, score: float):
        self.count = count  # features present (candidates of the next step)
        self.step = 0  # steps done this round
        self.score = score  # f of the input this round starts from
        self.rounds: list[SISResult] = []


@dataclass
class _ExactRun:
    """State of one :func:`exact_sis` run, shared by its steps and rounds.

    Device tensors (see the module docstring): ``remaining`` int64 [N, p + 1], ``present`` bool [N, p],
    ``order`` int64 [N, p], ``values`` float64 [N, p], ``scores`` float64 [N, p + 1] and ``finite`` (bool [],
    every score so far finite). Host: ``state`` per image, the ``queue`` of candidate ranges and the ``bar``.
    """

    prep: Prepared
    thresholds: list[float]
    collection: bool
    verifier: CandidateEvaluator | None
    engine: str
    targets_host: list[int]
    remaining: torch.Tensor
    present: torch.Tensor
    order: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    finite: torch.Tensor
    state: list[_Image]
    queue: CandidateQueue
    bar: tqdm | None = None

    @classmethod
    def start(cls, prep: Prepared, targets: torch.Tensor, scores0: torch.Tensor, thresholds: list[float],
              collection: bool, verifier: CandidateEvaluator | None, engine: str) -> "_ExactRun":
        """Every feature present and every image's first step queued (no bar yet)."""
        images = prep.images
        dev = images.device
        n, p = images.shape[0], prep.num_features
        cols = p + 1
        # Every tensor is made on the images' device (new_* / device=dev), never on torch's default device.
        remaining = images.new_full((n, cols), -1, dtype=torch.int64)
        remaining[:, :p] = torch.arange(p, device=dev)
        present = images.new_ones((n, p), dtype=torch.bool)
        order = images.new_full((n, p), -1, dtype=torch.int64)
        values = images.new_zeros((n, p), dtype=torch.float64)
        scores = images.new_zeros((n, cols), dtype=torch.float64)
        finite = images.new_ones((), dtype=torch.bool)

        host_scores, targets_host = (t.tolist() for t in to_host(scores0, targets, label="start"))
        state = [_Image(p, host_scores[i]) for i in range(n)]
        queue = CandidateQueue(images=n, slots=cols)
        for i in range(n):
            queue.push(i, 0, p, _STEP)
        return cls(prep, thresholds, collection, verifier, engine, targets_host, remaining, present, order,
                   values, scores, finite, state, queue)

    def step(self, evaluator: Callable, batch) -> None:
        """Score one batch of candidates, advance the images whose step it completes, and end or start rounds."""
        dev, p = self.prep.images.device, self.prep.num_features
        state, queue = self.state, self.queue
        stepped = [i for i, tag in batch.completed if tag == _STEP]
        scored = [i for i, tag in batch.completed if tag == _SCORE]
        # every index this step needs, in one host-to-device transfer (schedule.upload)
        img, slot, rows, counts, steps = upload(dev, batch.image, batch.slot, stepped,
                                                [state[i].count for i in stepped], [state[i].step for i in stepped])
        feature = self.remaining[img, slot]
        f = evaluator(self.present, img, img, feature)
        self.scores[img, slot] = f
        self.finite &= torch.isfinite(f).all()
        ended = []
        if stepped:
            _ops.backselect_update(
                self.scores,
                rows,
                counts,
                steps,
                self.remaining,
                self.present,
                self.order,
                self.values,
                False,  # rows/counts/steps come from the host's bookkeeping; remaining is kept valid
            )
            for i in stepped:
                st = state[i]
                st.count -= 1
                st.step += 1
                if st.count > 0:
                    queue.push(i, 0, st.count, _STEP)
                else:
                    ended.append(i)
        if ended:
            self.finish_rounds(ended)
        if scored:
            self.start_rounds(scored)
        self.bar.update(len(batch))

    def finish_rounds(self, ids: list[int]) -> None:
        """FindSIS on the rounds of images ``ids`` that just ended; with a collection, queue their next rounds."""
        thresholds = self.thresholds
        (rows,) = upload(self.prep.images.device, ids)
        finite, ords, vals = to_host(self.finite, self.order[rows], self.values[rows], label="round end")
        check_finite_scores(finite)
        found = {}
        for k, i in enumerate(ids):
            st = self.state[i]
            o, v = ords[k, : st.step].clone(), vals[k, : st.step].clone()
            sis = find_sis(o, v, thresholds[i]) if st.score >= thresholds[i] else None
            found[i] = (o, v, sis, None if sis is None else sis_score(v, st.score, sis.numel()))
        if self.verifier is not None:
            self.verify(found)
        for i in ids:
            st = self.state[i]
            m = st.step
            o, v, sis, f_sis = found[i]
            st.rounds.append(
                SISResult(
                    order=o,
                    values=v,
                    sis=sis,
                    mask=None if sis is None else self.prep.feature_mask(sis),
                    target=self.targets_host[i],
                    score=st.score,
                    threshold=thresholds[i],
                    sis_score=f_sis,
                    engine=self.engine,
                )
            )
            if not self.collection or sis is None or sis.numel() == 0 or sis.numel() == m:
                continue
            self.next_round(i, o, sis)

    def next_round(self, i: int, o: torch.Tensor, sis: torch.Tensor) -> None:
        """Queue image i's next round: what this round started with (its order ``o``), less its SIS."""
        p = self.prep.num_features
        st = self.state[i]
        keep = torch.zeros(p, dtype=torch.bool, device="cpu")  # on the host: o and sis are host tensors
        keep[o] = True
        keep[sis] = False
        (rest,) = upload(self.prep.images.device, keep.nonzero().flatten())
        self.present[i] = False
        self.present[i, rest] = True
        # remaining[i, :p] is all -1 here: each backselect_update step writes -1 into the slot it frees
        self.remaining[i, : rest.numel()] = rest
        st.count, st.step = rest.numel(), 0
        self.bar.total += 1 + st.count * (st.count + 1) // 2
        self.queue.push(i, p, p + 1, _SCORE)

    def verify(self, found: dict) -> None:
        """Check each SIS on the user's model; where it fails, take more of the order until one passes."""
        todo = [i for i, (_, _, sis, _) in found.items() if sis is not None]
        if not todo:
            return
        thresholds = self.thresholds
        keep_first = [found[i][0].flip(0) for i in todo]
        sizes = [list(range(found[i][2].numel(), found[i][0].numel() + 1)) for i in todo]
        hits = verify_prefix_sets(self.verifier, todo, keep_first, sizes,
                                  lambda r, f, top1: f >= thresholds[todo[r]], self.prep.num_features)
        for i, kf, sz, hit in zip(todo, keep_first, sizes, hits):
            o, v = found[i][:2]
            found[i] = (o, v, None, None) if hit is None else (o, v, kf[: sz[hit[0]]].clone(), hit[1])

    def start_rounds(self, ids: list[int]) -> None:
        """The inputs of images ``ids``' new rounds are scored: start those that pass their threshold."""
        p = self.prep.num_features
        (rows,) = upload(self.prep.images.device, ids)
        finite, new_scores = to_host(self.finite, self.scores[rows, p], label="round start")
        check_finite_scores(finite)
        for i, s in zip(ids, new_scores.tolist()):
            st = self.state[i]
            st.score = s
            if s >= self.thresholds[i]:
                self.queue.push(i, 0, st.count, _STEP)
            else:
                self.bar.total -= st.count * (st.count + 1) // 2


def exact_sis(
    fn: ModelFn,
    prep: Prepared,
    targets: torch.Tensor,
    scores0: torch.Tensor,
    thresholds: list[float],
    collection: bool,
    batch_size: int,
    runner: ChunkRunner,
    progress: bool | None,
    verifier: CandidateEvaluator | None = None,
    engine: str = "torch",
    evaluator: Callable | None = None,
) -> list[SISResult]:
    """Run exact SIS on every image; see :func:`overinterp_fast.fast_sis`.

    ``fn`` scores the candidates (the engine named ``engine``). With ``verifier`` (an
    evaluator of the user's own model, when ``fn`` is a stand-in), every SIS is checked
    there: f(x_S) >= tau, and where it fails FindSIS goes on adding features
    (last-masked first) until the set passes on the user's model.
    ``evaluator(present, image, row, feature)`` scores candidates (default: a
    :class:`CandidateEvaluator` of ``fn``, dense forward passes; e.g. an
    :class:`~overinterp_fast.runtime.incremental.IncrementalEvaluator`).
    """
    run = _ExactRun.start(prep, targets, scores0, thresholds, collection, verifier, engine)
    if evaluator is None:  # the queue and backselect_update make valid indices: no per-call checks
        evaluator = CandidateEvaluator(fn, prep, targets, runner, check_indices=False)
    n, p = prep.images.shape[0], prep.num_features
    # progress=None: a bar only on a terminal (tqdm's own rule).
    run.bar = tqdm(total=n * p * (p + 1) // 2, unit="cand", desc="exact SIS",
                   disable=None if progress is None else not progress)
    while run.queue:
        run.step(evaluator, run.queue.take(batch_size))
    run.bar.close()
    check_finite_scores(to_host(run.finite, label="end")[0])

    return [first_with_collection(st.rounds, collection) for st in run.state]
