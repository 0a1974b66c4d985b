"""Batch sizes by measurement: a short, cached calibration per (model, engine, input shape, dtype, device).

On a CPU the cost per row of a convolutional net depends strongly and
non-monotonically on the batch size (on a 2-core AMD EPYC, a small CNN at 24x24
ran 256 rows at 8.8 us per row and 288 rows at 18 us per row), and the best size
differs between CPUs, models and input shapes, so no fixed element budget picks it
well. Instead, the first job on a (model, shape) times a few candidate batch sizes
on real candidate-like inputs (the fused mask-apply kernel on random present-sets,
then the model and f), within a bounded budget (``BUDGET_S`` seconds at most and
``BUDGET_FRACTION`` of the job's estimated time), and keeps the result in a
process-wide cache.

The choice is a pure function of the measured call times (``choose``): for
exact SIS it simulates how backward-selection steps pack into batches of size B
(full batches plus one tail per step, see schedule.py) and takes the B with the
least predicted total time; for other methods, the least time per row.
Jobs too small to pay for a calibration keep the fallback size
(:func:`overinterp_fast.runtime.batching.auto_batch_size`).

With the environment variable ``OVERINTERP_FAST_CACHE_DIR`` set, calibrations
are also kept on disk (``calibration.json`` there), keyed by what determines the
timing (the model's structure and parameter shapes, not its weights; input
shape, dtype, device, engine, thread count, CPU model and torch version): later
processes on the same machine skip the measurement and use the same batch size. The file is updated under
its lock (``calibration.json.lock``: read, merge, write atomically), so processes calibrating at once keep each
other's entries.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from ..ops import kernels as _ops
from .batching import step_bucket
from .inputs import Prepared
from ..util.files import update_json

# Seconds a calibration may spend at most, and at most this fraction of the job's estimated time.
BUDGET_S = 0.5
BUDGET_FRACTION = 0.05
# Jobs with fewer rows than this keep the fallback size: the first probe would cost a sizeable share.
MIN_ROWS = 4096
# The job's own work per call (scheduling, bookkeeping kernels, Python) is at least this, whatever the probe saw.
JOB_CALL_OVERHEAD_S = 3e-4
# Sizes whose predicted cost is within this fraction of the least count as equal; the largest is taken.
TOLERANCE = 0.10
# Below this size a calibration does not choose: if nothing this large could be measured within the
# budget, the fallback size is used (one noisy call must not make a job run row by row).
MIN_CHOICE = 16
# Batch sizes tried (those up to the job's largest useful batch, plus that size itself). A CPU stops at
# CPU_LADDER_MAX (larger calls spill its caches); a GPU goes on while its memory bound (``upper``) allows: a small
# model there needs tens of thousands of rows per call to fill the device (ResNet-20 at 32 x 32 on an H200).
LADDER = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384, 32768)
CPU_LADDER_MAX = 4096


@dataclass
class Calibration:
    """Measured call times and the batch size chosen from them.

    Attributes:
        batch_size: the rows per forward call to use.
        times: {batch size: seconds per call (the minimum of its timed calls)}.
        source: "measured", "cached", or "fallback" (job too small, nothing measured).
        spent_s: seconds the measurement took (0 for cached or fallback).
    """

    batch_size: int
    times: dict[int, float] = field(default_factory=dict)
    source: str = "measured"
    spent_s: float = 0.0

    def per_row(self) -> dict[int, float]:
        return {b: t / b for b, t in self.times.items()}


_CACHE: dict[tuple, Calibration] = {}
LAST: list[Calibration] = []  # the latest calibration made or reused (one entry; for benchmarks and logs)


CACHE_DIR_ENV = "OVERINTERP_FAST_CACHE_DIR"
DISK_LOCK_S = 30.0  # seconds to wait for another process writing the on-disk cache


def clear_cache() -> None:
    """Forget every calibration cached in this process, the models' (runtime.model_state) and the others (the
    on-disk cache, if any, is kept)."""
    from . import model_state

    _CACHE.clear()
    model_state.clear(("calibration", "exact_top"))


@functools.lru_cache(maxsize=None)
def _cpu_name() -> str:
    """The CPU's model name (read once per process)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def disk_key(*parts) -> str:
    """A key for the on-disk cache: a hash of ``parts`` (their repr) with the CPU model and torch version."""
    text = repr((parts, _cpu_name(), torch.__version__))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _disk_path() -> str | None:
    d = os.environ.get(CACHE_DIR_ENV)
    return os.path.join(d, "calibration.json") if d else None


def _disk_load(key: str) -> Calibration | None:
    path = _disk_path()
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            rec = json.load(fh).get(key)
        if rec is None:
            return None
        return Calibration(int(rec["batch_size"]), {int(b): float(t) for b, t in rec["times"].items()}, "cached", 0.0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # an unreadable cache is ignored, never fatal


def _disk_store(key: str, cal: Calibration) -> None:
    """Add ``key``'s calibration to the on-disk cache: read, merge and write back under the cache's lock, so
    that processes calibrating at once keep each other's entries. A cache that cannot be written (a read-only
    folder, a full disk, a lock held past ``DISK_LOCK_S``) is skipped, never fatal."""
    path = _disk_path()
    if path is None:
        return
    entry = {"batch_size": cal.batch_size, "times": {str(b): t for b, t in cal.times.items()}}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        update_json(path, lambda data: data.update({key: entry}), timeout=DISK_LOCK_S)
    except OSError:  # filelock.Timeout is an OSError (TimeoutError) too
        pass


def ladder(max_rows: int, upper: int | None = None) -> list[int]:
    """Batch sizes to time: LADDER up to min(max_rows, upper), plus that cap itself; without ``upper`` (a CPU) at
    most CPU_LADDER_MAX."""
    cap = max(1, min(max_rows, upper or max_rows, LADDER[-1] if upper else CPU_LADDER_MAX))
    sizes = [b for b in LADDER if b < cap]
    return sizes + [cap]


def call_time(times: dict[int, float]) -> Callable[[np.ndarray], np.ndarray]:
    """Predicted seconds of a call of r rows: linear interpolation of the measured times; below the smallest
    measured size, the line from the fixed cost of a call (:func:`per_call_overhead`, 0 with one size measured)
    at r = 0 to the smallest size; beyond the largest, that size's per-row cost. 0 for r = 0."""
    sizes = np.array(sorted(times), dtype=np.float64)
    secs = np.array([times[int(b)] for b in sizes])
    if sizes[0] > 1:
        fixed = min(per_call_overhead(times), float(secs[0]))
        sizes, secs = np.concatenate([[0.0], sizes]), np.concatenate([[fixed], secs])

    def t(r: np.ndarray) -> np.ndarray:
        r = np.asarray(r, dtype=np.float64)
        inside = np.interp(r, sizes, secs)
        beyond = secs[-1] * r / sizes[-1]
        return np.where(r > sizes[-1], beyond, np.where(r > 0, inside, 0.0))

    return t


def exact_schedule_time(times: dict[int, float], batch: int, images: int, features: int) -> float:
    """Predicted seconds of exact SIS's candidate calls with batches of ``batch`` rows.

    Backward selection on N images with p features has, for r = p .. 1, a step of
    r candidates per image; the queue packs the N steps of one "level" together
    (N r rows: floor(N r / B) full batches and one tail of N r mod B rows, which the
    model runs padded to its batch shape, batching.step_bucket).
    """
    return _schedule_time(tuple(sorted(times.items())), batch, images, features)


@functools.lru_cache(maxsize=1024)
def _schedule_time(items: tuple, batch: int, images: int, features: int) -> float:
    """:func:`exact_schedule_time` of the measured (size, seconds) pairs ``items`` (kept per process: every job
    of a calibrated shape asks the same question)."""
    times = dict(items)
    t = call_time(times)
    r = np.arange(1, features + 1, dtype=np.int64) * images
    full, tail = r // batch, r % batch
    padded = np.array([step_bucket(int(x), batch) if x else 0 for x in tail], dtype=np.int64)
    return float((full * t(np.array([batch]))[0]).sum() + t(padded).sum())


def per_call_overhead(times: dict[int, float]) -> float:
    """The fixed cost of a call: the intercept (>= 0) of the least-squares line through the
    measured (size, seconds) points; 0 with fewer than two points."""
    return _intercept(tuple(sorted(times.items()))) if len(times) >= 2 else 0.0


@functools.lru_cache(maxsize=1024)
def _intercept(items: tuple) -> float:
    """:func:`per_call_overhead` of the measured (size, seconds) pairs ``items``, sorted (kept per process)."""
    b = np.array([x for x, _ in items], dtype=np.float64)
    t = np.array([y for _, y in items])
    slope, intercept = np.polyfit(b, t, 1)
    return max(0.0, float(intercept))


def exact_calls(batch: int, images: int, features: int) -> int:
    """Calls exact SIS's schedule makes with batches of ``batch`` rows (see :func:`exact_schedule_time`)."""
    r = np.arange(1, features + 1, dtype=np.int64) * images
    return int((-(-r // batch)).sum())


def exact_job_time(times: dict[int, float], batch: int, images: int, features: int) -> float:
    """Predicted seconds of exact SIS's candidate calls at ``batch`` rows per call: the schedule's
    call times (:func:`exact_schedule_time`) plus, per call, the job's own fixed work that the probe
    does not see (:func:`per_call_overhead`, at least JOB_CALL_OVERHEAD_S)."""
    extra = max(per_call_overhead(times), JOB_CALL_OVERHEAD_S)
    return exact_schedule_time(times, batch, images, features) + extra * exact_calls(batch, images, features)


def choose(times: dict[int, float], *, images: int | None = None, features: int | None = None) -> int:
    """The batch size to use, from measured call times {size: seconds}.

    With ``images`` and ``features`` (exact SIS): the measured size with the least
    predicted schedule time (:func:`exact_schedule_time`). Otherwise: the least time
    per row. Both add to every call the probe's own fixed cost per call
    (:func:`per_call_overhead`, at least JOB_CALL_OVERHEAD_S) once more, for the
    job's work per call that the probe does not see (scheduling, bookkeeping): that
    work is as fixed as the model's call overhead, and larger batches amortise it. Among sizes within TOLERANCE of
    the least cost the largest wins. Sizes under MIN_CHOICE (given for the
    interpolation only) are chosen only when nothing larger was measured. The result
    depends only on ``times``.
    """
    if not times:
        raise ValueError("no measured batch sizes to choose from")
    sizes = [b for b in sorted(times) if b >= MIN_CHOICE] or sorted(times)
    extra = max(per_call_overhead(times), JOB_CALL_OVERHEAD_S)
    if images is not None and features is not None:
        cost = {b: exact_job_time(times, b, images, features) for b in sizes}
    else:
        cost = {b: (times[b] + extra) / b for b in sizes}
    best = min(cost.values())
    return max(b for b in sizes if cost[b] <= best * (1 + TOLERANCE))


def measure(
    probe: Callable[[int], None],
    sizes: Sequence[int],
    *,
    expected_rows: int,
    start: int | None = None,
    repeats: int = 2,
    budget_s: float = BUDGET_S,
    budget_fraction: float = BUDGET_FRACTION,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[int, float]:
    """Time ``probe(b)`` (one forward call of b candidate-like rows) for ascending sizes.

    Each size runs once untimed (per-shape set-up: oneDNN primitives, allocator) and
    then ``repeats`` times timed, keeping the minimum (on a shared machine noise only
    ever adds time). A size is skipped, and the ladder ends, when its predicted cost
    (the last size's per-row cost) would take the time spent past min(budget_s,
    budget_fraction * the job's estimated time), the job estimated from the best
    per-row cost so far times ``expected_rows``; the first size is always measured, and so is the largest size
    of at most half the first one, where the budget stopped the ladder before it (two points give the fixed
    cost of a call, see :func:`call_time`).
    Then the two best sizes are timed once more (one lucky call does not decide).
    With ``start``, the sizes from the first one >= start run first, ascending, then
    the smaller ones, descending (the budget then cuts the sizes farthest from start).
    Returns {size: seconds per call}.
    """
    sizes = sorted(sizes)
    if start is not None:
        k = next((i for i, b in enumerate(sizes) if b >= start), len(sizes) - 1)
        sizes = sizes[k:] + sizes[:k][::-1]
    # the size measured whatever the budget, after the first: the largest at most half of the first one
    half = max((b for b in sizes if 2 * b <= sizes[0]), default=None) if sizes else None
    t_start = timer()
    times: dict[int, float] = {}
    budget = budget_s

    def timed(b: int) -> float:
        t0 = timer()
        probe(b)
        return timer() - t0

    for b in sizes:
        if times:  # skip a size whose predicted cost (the nearest measured size's per row) overruns the budget
            near = min(times, key=lambda s: abs(s - b))
            if timer() - t_start + (repeats + 1) * times[near] * b / near > budget:
                break
        try:
            probe(b)
            times[b] = min(timed(b) for _ in range(repeats))
        except torch.OutOfMemoryError:
            if not times:
                raise
            break  # larger sizes do not fit either
        best_per_row = min(t / s for s, t in times.items())
        budget = min(budget_s, budget_fraction * best_per_row * expected_rows)
    if len(times) == 1 and half is not None and half not in times:
        # a second point, however short the budget: calls shorter than the measured size (a step's tail, the
        # last steps of backward selection) are predicted from the line through both, whose intercept is the
        # fixed cost of a call (large for incremental scoring: its many small ops per call)
        probe(half)
        times[half] = min(timed(half) for _ in range(repeats))
    for b in sorted(times, key=lambda s: (times[s] / s, s))[:2]:
        if timer() - t_start > budget:
            break
        times[b] = min(times[b], timed(b))
    return times


def calibrate(
    key: tuple | None,
    probe: Callable[[int], None],
    *,
    max_rows: int,
    expected_rows: int,
    fallback: int,
    upper: int | None = None,
    images: int | None = None,
    features: int | None = None,
    timer: Callable[[], float] = time.perf_counter,
    disk: str | None = None,
    cache: dict | None = None,
) -> Calibration:
    """The batch size for a job, measured once per ``key`` (None: never cached) in ``cache`` (a model's table of
    calibrations, runtime.model_state; None: the process's).

    Args:
        key: identifies model, engine, input shape, dtype, device and the job's largest
            useful batch; a cached calibration under it is reused.
        probe: probe(b) runs one forward call of b candidate-like rows (and synchronises the device).
        max_rows: the largest batch the job can fill (exact SIS: N p; larger sizes are not tried).
        expected_rows: the job's total rows, to bound the measurement and skip small jobs.
        fallback: the size used without a measurement (jobs under MIN_ROWS rows).
        upper: a hard upper bound (CUDA: the memory-based size).
        images, features: for exact SIS, to choose by simulated schedule (see :func:`choose`).
        timer: seconds; injectable for tests.
        disk: the job's key in the on-disk cache (see :func:`disk_key`; used when
            OVERINTERP_FAST_CACHE_DIR is set).
    """
    cal = _calibrate(key, probe, max_rows, expected_rows, fallback, upper, images, features, timer, disk,
                     _CACHE if cache is None else cache)
    LAST[:] = [cal]
    return cal


def _calibrate(key, probe, max_rows, expected_rows, fallback, upper, images, features, timer, disk,
               store) -> Calibration:
    if key is not None and key in store:
        cal = store[key]
        return Calibration(cal.batch_size, dict(cal.times), "cached", 0.0)
    if expected_rows < MIN_ROWS:
        return Calibration(max(1, min(fallback, max_rows, upper or fallback)), {}, "fallback", 0.0)
    stored = _disk_load(disk) if disk is not None else None
    if stored is not None and stored.batch_size <= min(max_rows, upper or max_rows):
        if key is not None:
            store[key] = stored
        return stored
    t0 = timer()
    try:
        times = measure(probe, ladder(max_rows, upper), expected_rows=expected_rows, start=fallback, timer=timer)
    except torch.OutOfMemoryError:
        return Calibration(max(1, min(fallback, max_rows, upper or fallback)), {}, "fallback", timer() - t0)
    if max(times) < MIN_CHOICE <= max_rows:  # the budget did not reach a usable size
        return Calibration(max(1, min(fallback, max_rows, upper or fallback)), times, "fallback", timer() - t0)
    cal = Calibration(choose(times, images=images, features=features), times, "measured", timer() - t0)
    if key is not None:
        store[key] = cal
    if disk is not None:
        _disk_store(disk, cal)
    return cal


def candidate_probe(
    measure_fn: Callable[[torch.Tensor, torch.Tensor], object],
    prep: Prepared,
    targets: torch.Tensor,
    patterns: int = 64,
    seed: int = 0,
) -> Callable[[int], None]:
    """probe(b): one call of ``measure_fn`` on b candidate-like rows, built by the fused mask-apply kernel.

    Row j is image j % N with present-set j % ``patterns``; each present-set keeps every
    feature with probability u (u uniform in [0, 1], seeded), so rows range from almost
    whole to almost empty inputs as backward selection's candidates do (a batch of one
    repeated input runs measurably faster on a CPU and would mislead the timing).
    """
    dev = prep.images.device
    n, p = prep.images.shape[0], prep.num_features
    made: list[torch.Tensor] = []  # the present-sets, drawn at the first call (a cached calibration makes none)

    def probe(b: int) -> None:
        if not made:
            g = torch.Generator().manual_seed(seed)
            u = torch.rand(patterns, 1, generator=g, dtype=torch.float64)
            made.append((torch.rand(patterns, p, generator=g, dtype=torch.float64) < u).to(dev))
        present = made[0]
        j = torch.arange(b, device=dev)
        image = j % n
        # indices valid by construction (images j % N, present-sets j % patterns, no feature): no check, no wait
        x = _ops.mask_apply(prep.images, prep.baseline, prep.feature_map, present, image, j % patterns,
                            torch.full_like(j, -1), False)
        out = measure_fn(x, targets[image])
        first = out[0] if isinstance(out, tuple) else out
        first[:1].cpu()  # synchronise (CUDA) so the call is timed whole

    return probe
