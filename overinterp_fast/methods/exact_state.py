"""Exact SIS that survives an interruption: its state saved between windows of batches, continued by a rerun with
the uninterrupted run's results, bit for bit.

    keep = Checkpoints("work/state.pt", every=300.0, on_images=store_them)
    with saving(keep):
        results = fast_sis(model, images, method="exact", batch_size=256)   # continues work/state.pt if saved

What a state holds: the loop's device tables (:class:`~overinterp_fast.methods.exact_step.StepTables`: per image
the features present, their compact list, the order and values of the round, the scores of the step in flight and
the running total), the host's bookkeeping of every image (features present, step of the round, the score the
round started from, re-scored candidates, full-dtype flags and the rounds ended so far: a finished image's
result, and the earlier rounds of a collection), the schedule's queue of segments, the progress bar's count and,
with low precision, its margin, K and each image's first unproven step. The batches that follow depend on nothing
else (:mod:`~overinterp_fast.methods.exact_step`: a batch's candidates follow from the queue, the counts and the
batch size), so the rerun scores the same batches, and every score, order and set is the uninterrupted run's.
With incremental inference, an image whose step was in flight runs its current input again at its next batch
(its stored activations are not saved).

When a state is saved: between two windows of batches (where the tables and the host agree), every ``every``
seconds, as soon as an image's result is final (after ``on_images`` was given it), and when a signal is taken
(:mod:`overinterp_fast.util.interrupts`: Ctrl-C or SIGTERM inside ``caught()``; the state is saved, then the signal
raised). Windows are kept to about :data:`WINDOW_S` seconds (the first is one batch, the next sized from its time),
so that a signal is answered within seconds; where a window ends does not change the batches (the schedule goes
on from the queue). A state made for another job (other images, thresholds, batch size, collection or path) is
not used: the run starts over and says so in one logged line.
"""
from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch

from ..util import interrupts
from ..util.files import atomic_write
from .results import RunInfo, SISResult, first_with_collection

logger = logging.getLogger(__name__)
STATE_VERSION = 1
DEFAULT_EVERY_S = 240.0  # a state at least every 4 minutes: an interruption loses less than 5 minutes of work
WINDOW_S = 2.0  # a window of batches takes about this long: a signal is taken within seconds
TABLES = ("remaining", "present", "order", "values", "scores", "total")
HOST = ("count", "step", "score", "rescored", "full")
_ROUND_TENSORS = ("order", "values", "sis", "mask")
_ROUND_VALUES = ("target", "score", "threshold", "sis_score", "engine", "rescored")
_CURRENT: ContextVar["Checkpoints | None"] = ContextVar("overinterp_fast_exact_checkpoints", default=None)


@dataclass
class Checkpoints:
    """Where and how often exact SIS saves its state (see the module docstring), and who hears of finished images.

    Attributes:
        path: the state's file (written whole or not at all: ``write``); a rerun continues from it.
        every: seconds between two saves at most (while no image finishes).
        on_images: called with {image index: its final SISResult} for the images that finished in a window, once
            per image, before the state that holds them is saved (e.g. to store them durably).
        write: ``write(path, fill)`` writes a file whole (``fill(tmp)`` writes it; default:
            :func:`~overinterp_fast.util.files.atomic_write`).
        clock: seconds (monotonic), injectable for tests.
        window_s: the target duration of a window of batches.
        stop: asked after each window; True ends the run there: its state is saved and :class:`Stopped` raised
            (e.g. a trial run timed for an estimate, continued later).

    During and after a run: ``restored`` says whether it continued a saved state, ``earlier`` the loop's seconds in
    the runs before (from that state), ``scored`` the candidates scored so far (set before each call of ``clock``
    after a window), ``saves`` how many states it wrote, ``seconds`` (once the loop ended) its seconds over every
    run of the job.
    """

    path: str
    every: float = DEFAULT_EVERY_S
    on_images: Callable[[dict[int, SISResult]], None] | None = None
    write: Callable[[str, Callable[[str], None]], None] = atomic_write
    clock: Callable[[], float] = time.monotonic
    window_s: float = WINDOW_S
    stop: Callable[[], bool] | None = None
    restored: bool = False
    earlier: float = 0.0
    scored: int = 0
    saves: int = 0
    seconds: float = 0.0
    _told: set = field(default_factory=set, repr=False)
    _last: float = field(default=0.0, repr=False)
    _batch_s: float | None = field(default=None, repr=False)
    _start: float = field(default=0.0, repr=False)

    def __post_init__(self):
        check_interval(self.every, "every")


class Stopped(Exception):
    """The run ended where its checkpoints' ``stop`` asked, its state saved: a rerun continues it."""


def check_interval(every, name: str) -> None:
    """One-line ValueError unless ``every`` is a finite number of seconds >= 0 (``name``: the option)."""
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not (math.isfinite(every) and every >= 0):
        raise ValueError(f"{name} must be a number of seconds >= 0, got {every!r}")


@contextmanager
def saving(checkpoints: Checkpoints) -> Iterator[Checkpoints]:
    """Exact SIS runs inside the block save their state as ``checkpoints`` says, and continue a saved one."""
    token = _CURRENT.set(checkpoints)
    try:
        yield checkpoints
    finally:
        _CURRENT.reset(token)


def current() -> Checkpoints | None:
    """The checkpoints of the enclosing :func:`saving` block, or None."""
    return _CURRENT.get()


def job_key(run: "exact._ExactRun", batch_size: int) -> dict:
    """What a saved state must have been made for: the job's shape, batch size and shapes, collection, path,
    thresholds, targets and the images' first scores (float64, bit for bit)."""
    n, p = run.prep.images.shape[0], run.prep.num_features
    return {"version": STATE_VERSION, "images": n, "features": p, "batch_size": int(batch_size),
            "sizes": run.schedule.sizes.tolist(), "collection": bool(run.collection), "path": run.path,
            "low": run.low is not None, "engine": run.engine, "thresholds": [float(t) for t in run.thresholds],
            "targets": [int(t) for t in run.targets_host], "scores": [float(s) for s in run.state.score]}


class Keeper:
    """One run's saving: :meth:`restore` before the loop, :meth:`window_batches` for each window, :meth:`after` after
    it (see the module docstring)."""

    def __init__(self, checkpoints: Checkpoints, run: "exact._ExactRun", batch_size: int):
        self.c, self.run = checkpoints, run
        self.key = job_key(run, batch_size)
        c = self.c
        c.restored, c.saves, c._told, c._batch_s, c.scored = False, 0, set(), None, 0
        c._start = c._last = c.clock()
        c.earlier = 0.0

    # ------------------------------------------------------------------------------------------ restore

    def restore(self) -> tuple[int, int] | None:
        """Continue the saved state when there is one for this job: (the bar's count, its total), else None."""
        path = self.c.path
        if not os.path.exists(path):
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a file this version cannot read: the job starts over
            logger.warning("%s: not a saved exact SIS state (%s); starting over", path, str(exc).splitlines()[0])
            return None
        if not isinstance(saved, dict) or saved.get("key") != self.key:
            logger.warning("%s was saved for another exact SIS job; starting over", path)
            return None
        run = self.run
        for name in TABLES:  # in place: a dense step's captured graphs read these tensors
            getattr(run.t, name).copy_(saved["tables"][name])
        for name in HOST:  # in place: the schedule shares these arrays
            getattr(run.state, name)[...] = saved["host"][name].numpy()
        run.state.rounds = [[_result(d, saved["path"]) for d in rounds] for rounds in saved["rounds"]]
        run.schedule.queue.replace(saved["queue"].numpy())
        run.path = saved["path"]
        if run.low is not None:
            low = saved["low"]
            run.low.margin = low["margin"].to(run.low.margin.device)
            run.low.rescore, run.low.declined = int(low["rescore"]), bool(low["declined"])
            run.low.predicted_share = float(low["predicted_share"])
            run.unsafe_step.copy_(low["unsafe_step"])
        run.stale = set(range(run.prep.images.shape[0]))  # incremental inference: stored activations are gone
        queued = self._queued()
        self.c._told = {i for i, rounds in enumerate(run.state.rounds) if rounds and i not in queued}
        self.c.earlier = float(saved["seconds"])
        run.scored = self.c.scored = int(saved["bar"][0])
        self.c.restored = True
        logger.info("%s: exact SIS continues from its saved state (%d of %d candidates scored)", path,
                    run.scored, int(saved["bar"][1]))
        return int(saved["bar"][0]), int(saved["bar"][1])

    # ------------------------------------------------------------------------------------------ the loop

    def window_batches(self, default: int) -> int:
        """Batches of the next window: one for the first, then about ``window_s`` of them (at most ``default``)."""
        if self.c._batch_s is None:
            return 1
        return max(1, min(default, int(self.c.window_s / max(self.c._batch_s, 1e-9))))

    def after(self, window_batches: int, seconds: float) -> None:
        """After a window of ``window_batches`` batches that took ``seconds``: tell the finished images, save where
        due, and raise a signal taken meanwhile (after saving)."""
        c = self.c
        if window_batches:
            c._batch_s = seconds / window_batches
        c.scored = self.run.scored
        now = c.clock()  # once per window
        finished = self.finished()
        pending = interrupts.take()
        if pending is None and c.stop is not None and self.run.schedule and c.stop():
            pending = Stopped(c.path)
        if finished and c.on_images is not None:
            c.on_images(finished)
        if finished or now - c._last >= c.every or pending is not None:
            self.save(now)
        if pending is not None:
            raise pending

    def finished(self) -> dict[int, SISResult]:
        """The images whose result became final since the last call: {image: result}."""
        queued, out = self._queued(), {}
        for i, rounds in enumerate(self.run.state.rounds):  # final: a round ended, and nothing of it is queued
            if rounds and i not in queued and i not in self.c._told:
                out[i] = first_with_collection(rounds, self.run.collection)
        self.c._told.update(out)
        return out

    def _queued(self) -> set[int]:
        """The images with a segment in the queue: a step in flight or a round to come."""
        return set(self.run.schedule.queue.segments()[0].tolist())

    def save(self, now: float) -> None:
        """Write the state (whole or not at all); ``now``: the clock's time."""
        run, c = self.run, self.c
        low = None
        if run.low is not None:
            low = {"margin": run.low.margin.detach().cpu(), "rescore": int(run.low.rescore),
                   "declined": bool(run.low.declined), "predicted_share": float(run.low.predicted_share),
                   "unsafe_step": run.unsafe_step.detach().cpu()}
        state = {
            "key": self.key,
            "tables": {name: getattr(run.t, name).detach().cpu().clone() for name in TABLES},
            "host": {name: torch.from_numpy(np.array(getattr(run.state, name))) for name in HOST},
            "rounds": [[_saved(r) for r in rounds] for rounds in run.state.rounds],
            "queue": torch.from_numpy(np.array(run.schedule.queue.segments())),
            "bar": [int(run.scored), int(run.bar.total)],  # candidates scored, and all the job's known so far
            "path": run.path,
            "low": low,
            "seconds": c.earlier + now - c._start,  # the loop's seconds over every run of the job
        }
        c.write(c.path, lambda tmp: torch.save(state, tmp))
        c.saves += 1
        c._last = now

    def done(self) -> None:
        """The loop ended: the seconds of every run are the checkpoints' ``seconds``."""
        self.c.seconds = self.c.earlier + self.c.clock() - self.c._start


def keeper(run: "exact._ExactRun", batch_size: int) -> Keeper | None:
    """The saving of ``run`` inside a :func:`saving` block, else None."""
    c = current()
    return None if c is None else Keeper(c, run, batch_size)


def _saved(r: SISResult) -> dict:
    d = {k: getattr(r, k) for k in _ROUND_TENSORS}
    d.update({k: getattr(r, k) for k in _ROUND_VALUES})
    return d


def _result(d: dict, path: str) -> SISResult:
    r = SISResult(**{k: d[k] for k in (*_ROUND_TENSORS, *_ROUND_VALUES)})
    r.info = RunInfo(r.engine, 0, "", step=path)  # as the loop makes it (the caller's RunInfo takes its step)
    return r


@contextmanager
def deferred(keep: Keeper | None) -> Iterator[None]:
    """Signals wait for the window's end where the run saves its state (:func:`interrupts.deferred`)."""
    if keep is None:
        yield
        return
    with interrupts.deferred():
        yield


__all__ = ["Checkpoints", "DEFAULT_EVERY_S", "Keeper", "Stopped", "current", "keeper", "saving"]
