"""How long a run will take, said before it starts: its forward rows and the time on this device, from the timing
the engine choice already did (docs: guides/formats.md, Estimates).

Every run notes its estimate in its info (``"estimate"``). A run estimated above :data:`LONG_RUN_S` also says it
in one line before it starts, with the faster method where there is one::

    exact SIS of 2 images x 1,024 features: 1,049,600 forward rows, about 5.6 min on this CPU (2 threads);
    faster: method 'gradient', 11 gradient steps per image, under 0.1 s

The Python API logs that line (logger ``overinterp_fast.runtime.estimate``, level INFO; the command line prints
it). The progress bar takes its time left from the same estimate (:func:`progress_bar`).

Where the time per row comes from, best first: the calibration of the job's engine (the measured call times of
:mod:`~overinterp_fast.runtime.calibration`, through the schedule of exact SIS, :func:`exact_job_time`); for a run
without one (a small job, or a batch size given), the images' own first forward pass, per image; and where that
predicts a long run, one timed call at the run's batch size (calibration.measure), so that the line is not said
on the first pass's word alone. Rows are exact: exact SIS of N images with p features scores N p (p + 1) / 2
candidates in its first round (a collection's later rounds add theirs); batched-gradient SIS takes ceil(p / k)
gradient steps of N rows.
"""
from __future__ import annotations

import contextlib
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm

from . import runinfo
from .calibration import Calibration, call_time, exact_job_time, measure

logger = logging.getLogger(__name__)
LONG_RUN_S = 60.0  # runs estimated longer than this say so before they start
# A gradient step's cost per row in forward rows: the forward pass, and the backward pass (about twice a forward).
GRADIENT_ROW_COST = 3.0
# The bar's time left comes from the estimate until the run has spent this share of the estimated time (at least
# BAR_WARMUP_S seconds), then from the rate measured so far.
BAR_WARMUP_SHARE = 0.1
BAR_WARMUP_S = 2.0
_CURRENT: ContextVar["Estimate | None"] = ContextVar("overinterp_fast_estimate", default=None)
_SAID: ContextVar[bool] = ContextVar("overinterp_fast_estimate_said", default=False)
_BAR_OPTIONS: ContextVar[dict] = ContextVar("overinterp_fast_bar_options", default={})


@dataclass(frozen=True)
class Estimate:
    """A run's estimate.

    Attributes:
        what: the run, e.g. "exact SIS of 2 images x 1,024 features".
        rows: the rows it computes (its first round: a collection's later rounds add theirs); unit: what a row is
            ("forward rows", "gradient rows").
        seconds: the estimated time. device: where ("this CPU (2 threads)", "cuda:0 (NVIDIA H200)").
        faster: the faster method where there is one, with its own estimate ("method 'gradient', 11 gradient
            steps per image, under 0.1 s"), else None.
    """

    what: str
    rows: int
    unit: str
    seconds: float
    device: str
    faster: str | None = None

    def line(self) -> str:
        """The estimate in one line."""
        text = f"{self.what}: {self.rows:,} {self.unit}, {about(self.seconds)} on {self.device}"
        return text + (f"; faster: {self.faster}" if self.faster else "")

    @property
    def long(self) -> bool:
        """Whether the run is estimated above :data:`LONG_RUN_S`."""
        return self.seconds > LONG_RUN_S


def about(seconds: float) -> str:
    """An estimated time as a person reads it: "about 45 s", "about 6.1 min", "under 0.1 s"."""
    return "under 0.1 s" if seconds < 0.1 else f"about {duration(seconds)}"


def duration(seconds: float) -> str:
    """Seconds as a person reads them: "0.04 s", "0.4 s", "45 s", "6.1 min", "2.5 h", "3.2 d" (from 48 hours)."""
    if seconds < 0.1:
        return f"{seconds:.2g} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def device_name(device: torch.device) -> str:
    """This device as the estimate names it."""
    if device.type == "cpu":
        return f"this CPU ({torch.get_num_threads()} threads)"
    if device.type == "cuda" and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def exact_rows(images: int, features: int) -> int:
    """Candidates of exact SIS's first round: every image scores r candidates at its step of r features present,
    r = p .. 1: N p (p + 1) / 2."""
    return images * features * (features + 1) // 2


def gradient_steps(features: int, k: int) -> int:
    """Gradient steps of batched-gradient SIS's first round: ceil(p / k) per image."""
    return -(-features // k)


def row_seconds(cal: Calibration | None, first_pass_s: float, images: int) -> float:
    """Seconds per forward row: the calibration's least per-row time where it measured, else the images' first
    forward pass per image."""
    if cal is not None and cal.times:
        return min(t / b for b, t in cal.times.items())
    return first_pass_s / max(1, images)


def exact_seconds(cal: Calibration | None, first_pass_s: float, images: int, features: int) -> float:
    """Predicted seconds of exact SIS's candidate calls: the schedule's calls at the calibrated batch size
    (:func:`~overinterp_fast.runtime.calibration.exact_job_time`), else every candidate at the first pass's time
    per image."""
    if cal is not None and cal.times:
        return exact_job_time(cal.times, cal.batch_size, images, features)
    return exact_rows(images, features) * first_pass_s / max(1, images)


def incremental_seconds(incr: Calibration, dense: Calibration, images: int, features: int) -> float:
    """Predicted seconds of exact SIS with incremental scoring: its calls at its batch size, plus its base runs
    (one dense forward pass of every image per step, N at a time). The prediction engines.incremental_pays weighs
    against the dense engine's, and the run's estimate where it runs."""
    return (exact_job_time(incr.times, incr.batch_size, images, features)
            + float(call_time(dense.times)(images)) * features)


def timed(cal: Calibration | None, probe: Callable[[int], None], batch_size: int, rows: int,
          first_pass_s: float, images: int, timer: Callable[[], float] = time.perf_counter,
          always: bool = False) -> Calibration | None:
    """``cal`` where it measured; else, where the first pass predicts a long run (half of :data:`LONG_RUN_S`) or
    ``always``, a calibration of one size, ``batch_size``, timed by ``probe`` (one untimed call, then the timed ones,
    within calibration's budget; ``timer``: seconds, injectable for tests); else ``cal``."""
    if (cal is not None and cal.times) or (not always and rows * first_pass_s / max(1, images) < LONG_RUN_S / 2):
        return cal
    return Calibration(batch_size, measure(probe, [batch_size], expected_rows=rows, timer=timer), "measured")


def gradient(images: int, features: int, k: int, forward_row_s: float) -> tuple[int, float]:
    """(gradient rows, seconds) of batched-gradient SIS's first round: ceil(p / k) steps of N rows, each a
    forward and a backward pass (:data:`GRADIENT_ROW_COST` forward rows), and FindSIS's prefixes (at most one
    per block and image)."""
    steps = gradient_steps(features, k)
    rows = images * steps
    return rows, forward_row_s * (rows * GRADIENT_ROW_COST + images * (steps + 1))


def exact_estimate(images: int, features: int, seconds: float, device: torch.device, forward_row_s: float,
                   gradients: bool) -> Estimate:
    """Exact SIS's estimate, with batched-gradient SIS (k = 100, its default) as the faster method for a torch
    model (``gradients``) where it is."""
    faster = None
    if gradients:
        rows, grad_s = gradient(images, features, 100, forward_row_s)
        if grad_s < seconds / 2:
            steps = gradient_steps(features, 100)
            faster = f"method 'gradient', {steps:,} gradient step{'s' if steps > 1 else ''} per image, {about(grad_s)}"
    return Estimate(f"exact SIS of {images:,} image{'s' if images > 1 else ''} x {features:,} features",
                    exact_rows(images, features), "forward rows", seconds, device_name(device), faster)


@contextlib.contextmanager
def announced(est: Estimate) -> Iterator[Estimate]:
    """The run inside the block has the estimate ``est``: noted in its info, said in one line (logged at INFO)
    when long (unless inside :func:`said_before`), and the time left of its progress bar (:func:`progress_bar`)."""
    runinfo.note("estimate", est.line())
    if est.long and not _SAID.get():
        logger.info(est.line())
    token = _CURRENT.set(est)
    try:
        yield est
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def said_before(**bar_options) -> Iterator[None]:
    """Runs inside the block do not say their estimates: their caller said one for all of them (a stored audit's,
    before its first chunk); they still note them, and their bars still take their time left from them. Their
    bars (:func:`progress_bar`) take ``bar_options`` (tqdm's: e.g. ``leave=False`` under the caller's own bar)."""
    said, options = _SAID.set(True), _BAR_OPTIONS.set(dict(bar_options))
    try:
        yield
    finally:
        _SAID.reset(said)
        _BAR_OPTIONS.reset(options)


class EstimatedBar(tqdm):
    """A progress bar whose time left is the run's estimate: ``seconds`` for the bar's ``total`` at the start,
    scaled to what is left; once the run has spent :data:`BAR_WARMUP_SHARE` of the estimate (at least
    :data:`BAR_WARMUP_S`), the rate measured so far."""

    def __init__(self, *args, seconds: float, **kwargs):
        self.estimated_s = seconds
        kwargs.setdefault("bar_format", "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{left}, {rate_fmt}{postfix}]")
        super().__init__(*args, **kwargs)

    def time_left(self, n: float, total: float, elapsed: float) -> float:
        """Seconds left after ``n`` of ``total`` in ``elapsed`` seconds (the rate counted from the bar's
        ``initial``: a run that continues a saved one)."""
        if not total:
            return 0.0
        warm = max(BAR_WARMUP_S, BAR_WARMUP_SHARE * self.estimated_s)
        done = n - getattr(self, "initial", 0)  # a disabled bar has none
        if done > 0 and elapsed >= warm:
            return (total - n) * elapsed / done
        return max(0.0, self.estimated_s * (total - n) / total)  # the estimate covers the whole run

    @property
    def format_dict(self):
        d = super().format_dict
        d["left"] = tqdm.format_interval(self.time_left(d["n"], d["total"] or 0, d["elapsed"]))
        return d


def progress_bar(bar: Callable[..., tqdm] = tqdm, **kwargs) -> tqdm:
    """``bar(**kwargs)`` (a tqdm class); inside :func:`announced`, an :class:`EstimatedBar` (its time left from the
    estimate). Inside :func:`said_before`, its bar options apply."""
    kwargs.update(_BAR_OPTIONS.get())
    est = _CURRENT.get()
    if est is None:
        return bar(**kwargs)
    return EstimatedBar(seconds=est.seconds, **kwargs)


__all__ = ["Estimate", "LONG_RUN_S", "announced", "exact_estimate", "exact_rows", "exact_seconds", "gradient",
           "gradient_steps", "incremental_seconds", "progress_bar", "row_seconds", "said_before", "timed"]
