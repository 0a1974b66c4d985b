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

With ``low`` (a :class:`~overinterp_fast.methods.low_precision.LowPrecision`), a step of an image with more than K
features present is scored in the low dtype and its K best candidates again in the full dtype (tag ``_LOW``); the
first step whose decision the check could not prove is kept on the device (``unsafe_step``) and read where the round
ends, and the round is then run again from that step in the full dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..ops import kernels as _ops
from ..runtime.batching import CandidateEvaluator, ChunkRunner
from ..runtime.estimate import progress_bar
from .findsis import find_sis, sis_score
from .low_precision import LowPrecision
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores
from .prefix import verify_prefix_sets
from .results import SISResult, first_with_collection
from ..runtime.schedule import CandidateQueue, upload
from ..runtime.sync import to_host

_STEP, _SCORE, _LOW = 0, 1, 2  # a full-dtype step, the score of a round's input, a low-precision step


@dataclass
class _Images:
    """Host bookkeeping of every image, as arrays updated for all the images a batch completes at once."""

    count: np.ndarray  # int64 [N]: features present (candidates of the next step)
    step: np.ndarray  # int64 [N]: steps done this round
    score: np.ndarray  # float64 [N]: f of the input this round starts from
    rescored: np.ndarray  # int64 [N]: candidates of this round scored in the full dtype after the low one
    full: np.ndarray  # bool [N]: this round runs in the full dtype from here on (a step failed its check)
    rounds: list[list[SISResult]]

    @classmethod
    def start(cls, n: int, p: int, scores: list[float]) -> "_Images":
        return cls(np.full(n, p, np.int64), np.zeros(n, np.int64), np.asarray(scores, np.float64),
                   np.zeros(n, np.int64), np.zeros(n, bool), [[] for _ in range(n)])


@dataclass
class _ExactRun:
    """State of one :func:`exact_sis` run, shared by its steps and rounds.

    Device tensors (see the module docstring): ``remaining`` int64 [N, p + 1], ``present`` bool [N, p],
    ``order`` int64 [N, p], ``values`` float64 [N, p], ``scores`` float64 [N, p + 1] and ``total`` (float64 [],
    the sum of every score so far: NaN or inf once a score was; scores are probabilities, whose sum cannot
    overflow). Host: the images' ``state`` (arrays), the ``queue`` of candidate ranges and the
    ``bar``.
    With ``low``: ``unsafe_step`` int64 [N], each image's first step of the round that failed the low-precision check
    (p: none), and ``low_step`` (host bool [N]: the image's step in flight is a low-precision one).
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
    total: torch.Tensor
    state: _Images
    queue: CandidateQueue
    low: LowPrecision | None = None
    unsafe_step: torch.Tensor | None = None
    low_step: np.ndarray | None = None
    bar: tqdm | None = None

    @classmethod
    def start(cls, prep: Prepared, targets: torch.Tensor, scores0: torch.Tensor, thresholds: list[float],
              collection: bool, verifier: CandidateEvaluator | None, engine: str, low: LowPrecision | None = None,
              evaluator: Callable | None = None) -> "_ExactRun":
        """Every feature present and every image's first step queued (no bar yet). With ``low``, its margin is
        measured first (``evaluator`` scores in the full dtype)."""
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
        total = images.new_zeros((), dtype=torch.float64)

        measured = () if low is None else (low.measure(evaluator, present),)
        host_scores, targets_host, *measured = (t.tolist() for t in to_host(scores0, targets, *measured,
                                                                          label="start"))
        state = _Images.start(n, p, host_scores)
        queue = CandidateQueue(images=n, slots=cols, capacity=n)
        run = cls(prep, thresholds, collection, verifier, engine, targets_host, remaining, present, order,
                  values, scores, total, state, queue, low)
        if low is not None:
            low.start(measured[0], p)
            run.unsafe_step = images.new_full((n,), p, dtype=torch.int64)
            run.low_step = np.zeros(n, dtype=bool)
        run.push_steps(np.arange(n, dtype=np.int64))
        return run

    def push_steps(self, ids: np.ndarray) -> None:
        """Queue the next step of images ``ids`` (int64 [S], in order): in the low dtype where an image has more
        candidates than are re-scored."""
        count = self.state.count[ids]
        if self.low is None:
            self.queue.push_many(ids, 0, count, _STEP)
            return
        low = ~self.state.full[ids] & (count > self.low.rescore)
        self.low_step[ids] = low
        self.queue.push_many(ids, 0, count, np.where(low, _LOW, _STEP))

    def step(self, evaluator: Callable, batch) -> None:
        """Score one batch of candidates, advance the images whose step it completes, and end or start rounds.

        Candidates of low-precision steps are scored by ``low``; the others (full-dtype steps, the inputs of new
        rounds) and the re-scores of the low-precision steps this batch completes by ``evaluator``, in one call."""
        dev, p = self.prep.images.device, self.prep.num_features
        state, low = self.state, self.low
        done, tag = batch.done_image, batch.done_tag
        if low is None:
            full_steps = stepped = done[tag == _STEP]
            low_steps = stepped[:0]
        else:
            full_steps, low_steps = done[tag == _STEP], done[tag == _LOW]
            stepped = np.concatenate([full_steps, low_steps])
        scored = done[tag == _SCORE]
        # slots as flat indices into remaining and scores [N, p + 1]: index_select / index_copy_ on the flat views
        # cost less per call than indexing by (image, slot) pairs
        flat = batch.image * (p + 1) + batch.slot
        # n0: the batch's full-dtype slots; padding rows or the re-scores of low-precision steps follow them in f
        if low is None:  # every slot is scored in the full dtype
            n0 = len(flat)
            img_host = batch.image
            pad = evaluator.padded_rows(n0) - n0 if hasattr(evaluator, "padded_rows") else 0
            if pad > 0:  # the model's batch shape: repeats of the last candidate, padded here on the host
                img_host, flat = (np.concatenate([a, np.repeat(a[-1:], pad)]) for a in (img_host, flat))
            img, flat, rows, counts, steps = upload(dev, img_host, flat, stepped, state.count[stepped],
                                                    state.step[stepped])
            img_low = None
        else:
            is_low = self.low_step[batch.image] & (batch.slot < p)
            pos, rank = ((), ()) if not low_steps.size else low.plan(state.count[low_steps])
            # every index this step needs, in one host-to-device transfer (schedule.upload)
            img, flat, img_low, flat_low, rows, counts, steps, pos, rank = upload(
                dev, batch.image[~is_low], flat[~is_low], batch.image[is_low], flat[is_low], stepped,
                state.count[stepped], state.step[stepped], pos, rank)
            n0 = flat.shape[0]
        scores, remaining = self.scores.view(-1), self.remaining.view(-1)
        if img_low is not None and img_low.numel():
            scores.index_copy_(0, flat_low, low.evaluator(self.present, img_low, img_low,
                                                          remaining.index_select(0, flat_low)))
        feature = remaining.index_select(0, flat)
        if low_steps.size:  # the low-precision steps' best candidates join the full-dtype call
            k = len(full_steps)
            picked = low.pick(self.scores, rows[k:], pos, rank, self.present, self.remaining)
            again = rows[k:][pos]
            img, feature = torch.cat([img, again]), torch.cat([feature, picked.rescored])
        if img.numel():  # none where the batch is all low-precision candidates and completes no step
            kw = {}
            if getattr(evaluator, "takes_starts", False):  # incremental: the images whose inputs changed, from here
                im, sl = (batch.image, batch.slot) if low is None else (batch.image[~is_low], batch.slot[~is_low])
                begins = (sl == 0) | (sl == p)  # a step's first slot, a round's input
                kw["starts"] = np.unique(im[begins]).tolist()
            f = evaluator(self.present, img, img, feature, **kw)
            self.total += f.sum()  # two ops per call; isfinite(f).all() and &= took three
            if f.shape[0] == n0:
                scores.index_copy_(0, flat, f)
            else:  # padding rows, or re-scores of low-precision steps, follow the batch's own slots
                scores.index_copy_(0, flat[:n0], f[:n0])
        if low_steps.size:
            low.settle(picked, f[n0:], self.scores, rows[k:], counts[k:], steps[k:], pos, rank,
                       self.unsafe_step)
            state.rescored[low_steps] += np.minimum(low.rescore, state.count[low_steps])
        if stepped.size:
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
            state.count[stepped] -= 1
            state.step[stepped] += 1
            going = state.count[stepped] > 0
            self.push_steps(stepped[going])
            if not going.all():
                self.finish_rounds(stepped[~going].tolist())
        if scored.size:
            self.start_rounds(scored.tolist())
        self.bar.update(len(batch))

    def finish_rounds(self, ids: list[int]) -> None:
        """FindSIS on the rounds of images ``ids`` that just ended; with a collection, queue their next rounds.
        A round with a step that failed the low-precision check runs again from that step instead."""
        thresholds = self.thresholds
        (rows,) = upload(self.prep.images.device, ids)
        unsafe = () if self.low is None else (self.unsafe_step[rows],)
        total, ords, vals, *unsafe = to_host(self.total, self.order[rows], self.values[rows], *unsafe,
                                              label="round end")
        check_finite_scores(math.isfinite(total))
        row = {i: k for k, i in enumerate(ids)}
        if unsafe:
            redo = {i: t for i, t in zip(ids, unsafe[0].tolist()) if t < self.state.step[i]}
            if redo:
                self.low.grow(self.prep.num_features)
            for i, t in redo.items():
                self.redo(i, ords[row[i], t: self.state.step[i]], t)
            ids = [i for i in ids if i not in redo]
        st = self.state
        found = {}
        for i in ids:
            m, score = int(st.step[i]), float(st.score[i])
            o, v = ords[row[i], :m].clone(), vals[row[i], :m].clone()
            sis = find_sis(o, v, thresholds[i]) if score >= thresholds[i] else None
            found[i] = (o, v, sis, None if sis is None else sis_score(v, score, sis.numel()))
        if self.verifier is not None:
            self.verify(found)
        for i in ids:
            m = int(st.step[i])
            o, v, sis, f_sis = found[i]
            st.rounds[i].append(
                SISResult(
                    order=o,
                    values=v,
                    sis=sis,
                    mask=None if sis is None else self.prep.feature_mask(sis),
                    target=self.targets_host[i],
                    score=float(st.score[i]),
                    threshold=thresholds[i],
                    sis_score=f_sis,
                    engine=self.engine,
                    rescored=int(st.rescored[i]),
                )
            )
            st.rescored[i], st.full[i] = 0, False
            if not self.collection or sis is None or sis.numel() == 0 or sis.numel() == m:
                continue
            self.next_round(i, o, sis)

    def next_round(self, i: int, o: torch.Tensor, sis: torch.Tensor) -> None:
        """Queue image i's next round: what this round started with (its order ``o``), less its SIS."""
        p = self.prep.num_features
        keep = torch.zeros(p, dtype=torch.bool, device="cpu")  # on the host: o and sis are host tensors
        keep[o] = True
        keep[sis] = False
        (rest,) = upload(self.prep.images.device, keep.nonzero().flatten())
        self.present[i] = False
        self.present[i].index_fill_(0, rest, True)  # x[i, idx] = True would copy a host scalar: a wait
        # remaining[i, :p] is all -1 here: each backselect_update step writes -1 into the slot it frees
        self.remaining[i, : rest.numel()] = rest
        m = rest.numel()
        self.state.count[i], self.state.step[i] = m, 0
        self.bar.total += 1 + m * (m + 1) // 2
        self.queue.push(i, p, p + 1, _SCORE)

    def redo(self, i: int, rest: torch.Tensor, t: int) -> None:
        """Run image i's round again from its step ``t`` in the full dtype: ``rest`` (int64 [m - t], host) are the
        features that step started with. The candidates of the steps run again count as re-scored."""
        st = self.state
        (feats,) = upload(self.prep.images.device, rest)
        self.present[i] = False
        self.present[i].index_fill_(0, feats, True)
        # remaining[i, :p] is all -1 here (see next_round); the slots' order does not matter (ties go by feature id)
        self.remaining[i, : feats.numel()] = feats
        self.unsafe_step[i] = self.prep.num_features
        m = feats.numel()
        st.count[i], st.step[i], st.full[i] = m, t, True
        again = m * (m + 1) // 2
        st.rescored[i] += again
        self.bar.total += again
        self.push_steps(np.array([i], np.int64))

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
        total, new_scores = to_host(self.total, self.scores[rows, p], label="round start")
        check_finite_scores(math.isfinite(total))
        st, going = self.state, []
        for i, s in zip(ids, new_scores.tolist()):
            st.score[i] = s
            if s >= self.thresholds[i]:
                going.append(i)
            else:
                m = int(st.count[i])
                self.bar.total -= m * (m + 1) // 2
        self.push_steps(np.asarray(going, np.int64))


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
    low: LowPrecision | None = None,
) -> list[SISResult]:
    """Run exact SIS on every image; see :func:`overinterp_fast.fast_sis`.

    ``fn`` scores the candidates (the engine named ``engine``). With ``verifier`` (an
    evaluator of the user's own model, when ``fn`` is a stand-in), every SIS is checked
    there: f(x_S) >= tau, and where it fails FindSIS goes on adding features
    (last-masked first) until the set passes on the user's model.
    ``evaluator(present, image, row, feature)`` scores candidates (default: a
    :class:`CandidateEvaluator` of ``fn``, dense forward passes; e.g. an
    :class:`~overinterp_fast.runtime.incremental.IncrementalEvaluator`).
    With ``low``, candidates are scored in its low dtype first and the result is still the full-dtype run's (see
    :mod:`~overinterp_fast.methods.low_precision`); each result's ``rescored`` counts the re-scored candidates.
    """
    if evaluator is None:  # the queue and backselect_update make valid indices: no per-call checks
        evaluator = CandidateEvaluator(fn, prep, targets, runner, check_indices=False)
    run = _ExactRun.start(prep, targets, scores0, thresholds, collection, verifier, engine, low, evaluator)
    n, p = prep.images.shape[0], prep.num_features
    # progress=None: a bar only on a terminal (tqdm's own rule).
    run.bar = progress_bar(tqdm, total=n * p * (p + 1) // 2, unit="cand", desc="exact SIS",  # time left: estimated
                   disable=None if progress is None else not progress)
    while run.queue:
        run.step(evaluator, run.queue.take(batch_size))
    run.bar.close()
    check_finite_scores(math.isfinite(to_host(run.total, label="end")[0]))

    return [first_with_collection(rounds, collection) for rounds in run.state.rounds]
