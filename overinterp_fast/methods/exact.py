"""Exact SIS: backward selection, FindSIS and disjoint SIS collections, batched on the device.

State lives on the images' device: per image the present features (bool [N, p]),
a compact list of them (int64 [N, p + 1]), the scores of the step in flight
(float64 [N, p + 1]) and the order/values of the round. Column p of ``remaining``
is a permanent -1, so slot p is "mask nothing": the score of the current input.
The host only schedules (exact_step.py's StepSchedule): a step's candidate count is known in advance
(one feature leaves per step), so the schedule of many batches is made at once, without reading the device.
It reads device values only through :func:`~overinterp_fast.runtime.sync.to_host`, at
the start and where rounds end or start (FindSIS, the collection logic and the
verification need the values), never per step. The candidate indices are checked where
they are made (the schedule's bounds; ``remaining`` is kept valid by the step ops),
so the ops skip their own per-call checks, each of which would wait for the device.

Each batch is one :class:`~overinterp_fast.methods.exact_step.DenseStep` (the dense path: three ops around the
forward pass, one captured CUDA graph per batch shape on a GPU), or, for incremental inference, low precision and
after an out-of-memory error, :meth:`_ExactRun.step` through an evaluator.

With ``low`` (a :class:`~overinterp_fast.methods.low_precision.LowPrecision`), a step of an image with more than K
features present is scored in the low dtype and its K best candidates again in the full dtype (tag ``LOW``); the
first step whose decision the check could not prove is kept on the device (``unsafe_step``) and read where the round
ends, and the round is then run again from that step in the full dtype.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from ..ops import kernels as _ops
from ..runtime import graphs
from ..runtime.batching import CandidateEvaluator, ChunkRunner, bucket_sizes, largest_bucket
from ..runtime.estimate import progress_bar
from . import exact_state
from .findsis import sis_score, sis_starts
from .low_precision import LowPrecision
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores
from .prefix import verify_prefix_sets
from .results import RunInfo, SISResult, StepCounts, first_with_collection
from ..runtime.schedule import upload
from ..runtime.sync import to_host
from .exact_step import (LOW as _LOW, SCORE as _SCORE, STEP as _STEP, DenseStep, StepSchedule, window_batches,
                         StepTables, Window)


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

    Device tensors ``t`` (:class:`~overinterp_fast.methods.exact_step.StepTables`, see the module docstring):
    ``remaining`` int64 [N, p + 1], ``present`` bool [N, p], ``order`` int64 [N, p], ``values`` float64 [N, p],
    ``scores`` float64 [N, p + 1] and ``total`` (float64 [], the sum of every score so far: NaN or inf once a score
    was; scores are probabilities, whose sum cannot overflow). Host: the images' ``state`` (arrays), the ``schedule`` of candidate ranges (windows of batches) and
    the ``bar``.
    With ``low``: ``unsafe_step`` int64 [N], each image's first step of the round that failed the low-precision check
    (p: none).
    """

    prep: Prepared
    thresholds: list[float]
    collection: bool
    verifier: CandidateEvaluator | None
    engine: str
    targets_host: list[int]
    t: StepTables
    state: _Images
    schedule: StepSchedule
    low: LowPrecision | None = None
    unsafe_step: torch.Tensor | None = None
    bar: tqdm | None = None
    path: str = "fused"  # what ran the steps (SISResult.step)
    counts: StepCounts = field(default_factory=StepCounts)  # the job's batch shapes, rows and graphs
    shapes: set = field(default_factory=set)  # the batch shapes of the dense steps so far
    stale: set = field(default_factory=set)  # incremental: images to run again at their next batch (a restore)
    scored: int = 0  # candidates scored so far (the bar's count, kept when the bar is off too)

    @classmethod
    def start(cls, prep: Prepared, targets: torch.Tensor, scores0: torch.Tensor, thresholds: list[float],
              collection: bool, verifier: CandidateEvaluator | None, engine: str, low: LowPrecision | None = None,
              evaluator: Callable | None = None, sizes=(), tables: StepTables | None = None) -> "_ExactRun":
        """Every feature present and every image's first step queued (no bar yet). With ``low``, its margin is
        measured first (``evaluator`` scores in the full dtype). ``tables``: the state to use (reset), else new."""
        images = prep.images
        n, p = images.shape[0], prep.num_features
        cols = p + 1
        # Every tensor is made on the images' device (new_* / device=dev), never on torch's default device.
        t = tables if tables is not None else StepTables.new(images, n, p)
        measured = () if low is None else (low.measure(evaluator, t.present),)
        host_scores, targets_host, *measured = (x.tolist() for x in to_host(scores0, targets, *measured,
                                                                          label="start"))
        state = _Images.start(n, p, host_scores)
        schedule = StepSchedule(state.count, state.step, state.full, cols, sizes)
        run = cls(prep, thresholds, collection, verifier, engine, targets_host, t, state, schedule, low)
        if low is not None:
            low.start(measured[0], p)
            run.unsafe_step = images.new_full((n,), p, dtype=torch.int64)
        run.push_steps(np.arange(n, dtype=np.int64))
        return run

    def rescore(self) -> int:
        """K of low precision (a step with more candidates is scored in the low dtype first), 0 without it."""
        return 0 if self.low is None else self.low.rescore

    def push_steps(self, ids: np.ndarray) -> None:
        """Queue the next step of images ``ids`` (int64 [S], in order): in the low dtype where an image has more
        candidates than are re-scored."""
        count = self.state.count[ids]
        if self.low is None:
            self.schedule.queue.push_many(ids, 0, count, _STEP)
            return
        # the rule the schedule's windows apply too (ops.schedule_window): more candidates than are re-scored
        low = ~self.state.full[ids] & (count > self.low.per_step(count))
        self.schedule.queue.push_many(ids, 0, count, np.where(low, _LOW, _STEP))

    def run_window(self, window: Window, dense: DenseStep | None, evaluator: Callable) -> DenseStep | None:
        """Run every batch of ``window``, then end and start the rounds it finished. Returns the dense step to use
        from here on: None once an out-of-memory error moved the loop to ``evaluator`` (whose runner halves its
        chunks)."""
        k = 0
        self.scored += int(window.batches[:, 2].sum())
        if dense is not None:
            bar = None if getattr(self.bar, "disable", False) else self.bar
            self.shapes.update(window.batches[:, 1].tolist())
            self.counts.rows += int(window.batches[:, 1].sum())
            for block, done in window.blocks(self.prep.images.device):
                try:
                    dense(block, done)
                except torch.OutOfMemoryError:  # this batch again, and every later one, through the evaluator
                    if self.prep.images.device.type == "cuda":
                        torch.cuda.empty_cache()
                    dense = None
                    self.path = "evaluator"
                    break
                if bar is not None:
                    bar.update(int(window.batches[k, 2]))
                k += 1
            else:
                self.path = dense.path
        for j in range(k, len(window)):
            self.step(evaluator, window, j)
        ended = window.ended()
        if ended.size:
            self.finish_rounds(ended.tolist())
        scored = window.scored()
        if scored.size:
            self.start_rounds(scored.tolist())
        return dense

    def step(self, evaluator: Callable, window: Window, k: int) -> None:
        """Score batch ``k`` of ``window`` through ``evaluator`` and finish the steps it completes (the schedule has
        already advanced the host's counts).

        Candidates of low-precision steps are scored by ``low``; the others (full-dtype steps, the inputs of new
        rounds) and the re-scores of the low-precision steps this batch completes by ``evaluator``, in one call."""
        dev, p = self.prep.images.device, self.prep.num_features
        state, low = self.state, self.low
        image, flat, tag, done = window.batch(k)
        slot = flat - image * (p + 1)
        steps = done[done[:, 2] != _SCORE]
        if low is None:
            full, lows = steps, steps[:0]
        else:
            full, lows = steps[steps[:, 2] == _STEP], steps[steps[:, 2] == _LOW]
        stepped = np.concatenate([full, lows])  # (batch, image, tag, count, step) rows
        full_steps, low_steps = full[:, 1], lows[:, 1]
        # n0: the batch's full-dtype slots; padding rows or the re-scores of low-precision steps follow them in f
        if low is None:  # every slot is scored in the full dtype
            n0 = len(flat)
            img_host = image
            pad = evaluator.padded_rows(n0) - n0 if hasattr(evaluator, "padded_rows") else 0
            if pad > 0:  # the model's batch shape: repeats of the last candidate, padded here on the host
                img_host, flat = (np.concatenate([a, np.repeat(a[-1:], pad)]) for a in (img_host, flat))
            img, flat, rows, counts, steps_t = upload(dev, img_host, flat, stepped[:, 1], stepped[:, 3],
                                                      stepped[:, 4])
            img_low = None
        else:
            is_low = tag == _LOW
            pos, rank = ((), ()) if not low_steps.size else low.plan(lows[:, 3])
            # every index this step needs, in one host-to-device transfer (schedule.upload)
            img, flat, img_low, flat_low, rows, counts, steps_t, pos, rank = upload(
                dev, image[~is_low], flat[~is_low], image[is_low], flat[is_low], stepped[:, 1], stepped[:, 3],
                stepped[:, 4], pos, rank)
            n0 = flat.shape[0]
        scores, remaining = self.t.scores.view(-1), self.t.remaining.view(-1)
        if img_low is not None and img_low.numel():
            scores.index_copy_(0, flat_low, low.evaluator(self.t.present, img_low, img_low,
                                                          remaining.index_select(0, flat_low)))
        feature = remaining.index_select(0, flat)
        if low_steps.size:  # the low-precision steps' best candidates join the full-dtype call
            kf = len(full_steps)
            picked = low.pick(self.t.scores, rows[kf:], pos, rank, self.t.present, self.t.remaining)
            again = rows[kf:][pos]
            img, feature = torch.cat([img, again]), torch.cat([feature, picked.rescored])
        if img.numel():  # none where the batch is all low-precision candidates and completes no step
            kw = {}
            if getattr(evaluator, "takes_starts", False):  # incremental: the images whose inputs changed, from here
                im, sl = (image, slot) if low is None else (image[~is_low], slot[~is_low])
                begins = (sl == 0) | (sl == p)  # a step's first slot, a round's input
                starts = np.unique(im[begins])
                if self.stale:  # restored mid-step: the images' inputs run again where they come first
                    here = self.stale.intersection(np.unique(im).tolist())
                    self.stale -= here
                    starts = np.union1d(starts, np.fromiter(here, np.int64, len(here)))
                kw["starts"] = starts.tolist()
            f = evaluator(self.t.present, img, img, feature, **kw)
            self.t.total += f.sum()  # two ops per call; isfinite(f).all() and &= took three
            if f.shape[0] == n0:
                scores.index_copy_(0, flat, f)
            else:  # padding rows, or re-scores of low-precision steps, follow the batch's own slots
                scores.index_copy_(0, flat[:n0], f[:n0])
        if low_steps.size:
            kf = len(full_steps)
            low.settle(picked, f[n0:], self.t.scores, rows[kf:], counts[kf:], steps_t[kf:], pos, rank,
                       self.unsafe_step)
            state.rescored[low_steps] += low.per_step(lows[:, 3])  # the counts before the step
        if stepped.size:
            _ops.backselect_update(
                self.t.scores,
                rows,
                counts,
                steps_t,
                self.t.remaining,
                self.t.present,
                self.t.order,
                self.t.values,
                False,  # rows/counts/steps come from the host's bookkeeping; remaining is kept valid
            )
        self.bar.update(len(image))

    def finish_rounds(self, ids: list[int]) -> None:
        """FindSIS on the rounds of images ``ids`` that just ended; with a collection, queue their next rounds.
        A round with a step that failed the low-precision check runs again from that step instead."""
        thresholds = self.thresholds
        (rows,) = upload(self.prep.images.device, ids)
        unsafe = () if self.low is None else (self.unsafe_step[rows],)
        total, ords, vals, *unsafe = to_host(self.t.total, self.t.order[rows], self.t.values[rows], *unsafe,
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
        found, sis_host = {}, {}
        ords, vals = ords.numpy(), vals.numpy()  # host copies: each round's own arrays, with no op per image
        # FindSIS of every round at once, in numpy, and the SIS' feature masks
        k = np.fromiter((row[i] for i in ids), dtype=np.int64, count=len(ids))
        ords, vals, ms = ords[k], vals[k], st.step[ids].astype(np.int64)  # row j: image ids[j]
        starts = sis_starts(vals, ms, np.fromiter((thresholds[i] for i in ids), np.float64, len(ids)))
        masks = self.prep.feature_masks(ords, starts, ms)
        for j, i in enumerate(ids):
            m, score = int(ms[j]), float(st.score[i])
            o_host, v_host = ords[j, :m].copy(), vals[j, :m].copy()
            o, v = torch.from_numpy(o_host), torch.from_numpy(v_host)
            sis = None
            if score >= thresholds[i]:
                sis_host[i] = o_host[starts[j]:][::-1].copy()
                sis = torch.from_numpy(sis_host[i])
            found[i] = (o, v, sis, None if sis is None else sis_score(v_host, score, sis.numel()))
        if self.verifier is not None:
            self.verify(found)
        for j, i in enumerate(ids):
            m = int(ms[j])
            o, v, sis, f_sis = found[i]
            st.rounds[i].append(
                SISResult(
                    order=o,
                    values=v,
                    sis=sis,
                    # the host's array where the check kept FindSIS's set (its sets are prefixes of one reversed
                    # order: the same length is the same set)
                    mask=None if sis is None else (
                        torch.from_numpy(masks[j]) if sis.numel() == len(sis_host.get(i, ()))
                        else self.prep.feature_mask(sis)),
                    target=self.targets_host[i],
                    score=float(st.score[i]),
                    threshold=thresholds[i],
                    sis_score=f_sis,
                    engine=self.engine,
                    rescored=int(st.rescored[i]),
                    # the caller's RunInfo takes its step and the job's step counts (filled when the loop ends)
                    info=RunInfo(self.engine, 0, "", step=self.path, steps=self.counts),
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
        self.t.present[i] = False
        self.t.present[i].index_fill_(0, rest, True)  # x[i, idx] = True would copy a host scalar: a wait
        # remaining[i, :p] is all -1 here: each backselect_update step writes -1 into the slot it frees
        self.t.remaining[i, : rest.numel()] = rest
        m = rest.numel()
        self.state.count[i], self.state.step[i] = m, 0
        self.bar.total += 1 + m * (m + 1) // 2
        self.schedule.queue.push(i, p, p + 1, _SCORE)

    def redo(self, i: int, rest: torch.Tensor, t: int) -> None:
        """Run image i's round again from its step ``t`` in the full dtype: ``rest`` (int64 [m - t], host) are the
        features that step started with. The candidates of the steps run again count as re-scored."""
        st = self.state
        (feats,) = upload(self.prep.images.device, rest)
        self.t.present[i] = False
        self.t.present[i].index_fill_(0, feats, True)
        # remaining[i, :p] is all -1 here (see next_round); the slots' order does not matter (ties go by feature id)
        self.t.remaining[i, : feats.numel()] = feats
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
        total, new_scores = to_host(self.t.total, self.t.scores[rows, p], label="round start")
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

    Without ``evaluator`` and ``low``, each batch is one :class:`~overinterp_fast.methods.exact_step.DenseStep`
    (three ops around the forward pass; on CUDA a captured graph per batch shape); the schedule of many batches is
    made at once (:class:`~overinterp_fast.methods.exact_step.StepSchedule`). Each result's ``info.step`` says what
    ran.
    """
    dense = None
    sizes = bucket_sizes(runner.chunk) if fn.pad_to is not None else ()
    if evaluator is None:  # the schedule and backselect_update make valid indices: no per-call checks
        evaluator = CandidateEvaluator(fn, prep, targets, runner, check_indices=False)
        if low is None:  # the dense step of the job (kept from an earlier job of the same shapes, with its graphs)
            dense = DenseStep.for_job(fn, prep, targets, sizes)
            dense.prime(sizes)  # every shape's graph captured once, in the model's first job of these shapes
    kept = dense
    try:
        return _run_loop(fn, prep, targets, scores0, thresholds, collection, batch_size, runner, progress, verifier,
                         engine, evaluator, low, sizes, dense)
    finally:
        if kept is not None:
            kept.release()


def _run_loop(fn, prep, targets, scores0, thresholds, collection, batch_size, runner, progress, verifier, engine,
              evaluator, low, sizes, dense) -> list[SISResult]:
    """:func:`exact_sis` once its dense step (or None) is chosen."""
    kept = dense
    forward = fn.run if isinstance(fn.run, graphs.GraphedForward) else None  # the forward passes' graphs
    graphed = (0, 0) if forward is None else (forward.captures, forward.replays)
    run = _ExactRun.start(prep, targets, scores0, thresholds, collection, verifier, engine, low, evaluator, sizes,
                          tables=None if dense is None else dense.t)
    run.path = "fused" if dense else ("low-precision" if low is not None else "incremental")
    n, p = prep.images.shape[0], prep.num_features
    keep = exact_state.keeper(run, min(batch_size, runner.chunk))  # saved and continued where the caller asks
    counted = None if keep is None else keep.restore()
    done, total = counted or (0, n * p * (p + 1) // 2)
    # progress=None: a bar only on a terminal (tqdm's own rule).
    run.bar = progress_bar(tqdm, total=total, initial=done, unit="cand", desc="exact SIS",  # time left: estimated
                           disable=None if progress is None else not progress)
    stop = collection or low is not None  # round ends change the schedule: FindSIS (and the check) decide what next
    with exact_state.deferred(keep):  # Ctrl-C or SIGTERM: the state is saved where the window ends, then raised
        while run.schedule:  # a batch: one forward call, at most the runner's chunk (halved after out-of-memory)
            batch = min(batch_size, runner.chunk)
            if sizes:  # full calls take one of the job's shapes too
                batch = largest_bucket(batch, sizes[-1])
            most = window_batches(batch)
            t0 = time.perf_counter()
            window = run.schedule.window(batch, rescore=run.rescore(), stop_at_round_end=stop,
                                         max_batches=most if keep is None else keep.window_batches(most))
            dense = run.run_window(window, dense, evaluator)
            if keep is not None:
                keep.after(len(window), time.perf_counter() - t0)
        if keep is not None:
            keep.done()
    run.bar.close()
    if kept is not None:  # the job's steps: their shapes, rows and graphs (the steps' and the forward passes')
        c = run.counts
        c.shapes = tuple(sorted(run.shapes))
        c.captures, c.replays = kept.job_counts()
        if forward is not None:
            c.captures += forward.captures - graphed[0]
            c.replays += forward.replays - graphed[1]
        c.graphs = "cuda" if kept.family.on else ("stand-in" if kept.family.counting else "off")
    check_finite_scores(math.isfinite(to_host(run.t.total, label="end")[0]))

    return [first_with_collection(rounds, collection) for rounds in run.state.rounds]
