"""Forward engines for the black-box methods, and the batch size each runs at.

``engine="torch"`` runs the user's model as given. ``"onnxruntime"`` exports a
torch model to ONNX once (per model, input shape, dtype and device; cached for
the process) and scores candidates with ONNX Runtime. ``"compile"`` runs
``torch.compile(model)``. ``"auto"`` (the default) calibrates the torch model's
batch size (calibration.py) and, where the job is long enough to pay for an
export (``AUTO_MIN_JOB_S`` seconds predicted) on a CPU with a float32 torch
module, also exports it, calibrates ONNX Runtime the same way and keeps the
engine with the lower predicted job time. ``compile`` is never chosen by auto:
its compilation takes tens of seconds.

Whatever engine scores the candidates, each set returned is checked on the
user's own model (see prefix.verify_prefix_sets): the engine is a faster
stand-in, and a near-tie it decides differently never yields a set that fails
on the user's model. An export that fails falls back to torch: with one warning where the engine was asked
for by name, silently under "auto" (logged at INFO, and the run's info says so).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import math
import os
import tempfile
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from .batching import auto_batch_size
from . import estimate, incremental, model_state, runinfo
from .calibration import (MIN_ROWS, Calibration, calibrate, candidate_probe, disk_key, exact_job_time,
                          measure)
from .inputs import Prepared
from .model import ModelFn
from .onnx import OnnxModel, export_onnx

logger = logging.getLogger(__name__)

ENGINES = ("auto", "torch", "onnxruntime", "compile")
# incremental=None on a job too small to calibrate (under calibration.MIN_ROWS candidates) but long in
# seconds (EfficientNet-Lite0 with 49 patches: 1,225 candidates of about 6 ms): both paths are timed at
# their batch sizes when the job is predicted, from the images' own first forward pass, to take this long.
SMALL_JOB_TIMING_S = 2.0
# auto exports to ONNX only when the torch job is predicted to take at least this long:
# export + session + calibration cost about 0.5-1 s on 2 cores, and a tiny job must not pay it.
AUTO_MIN_JOB_S = 10.0
# incremental=None picks incremental scoring when its timed prediction is at least this many times shorter than
# the dense engine's: across the exact benchmark's configs on 2 CPU cores its prediction came out up to 1.4x
# short of the measured time (many small ops per call, which the short probe times at their best), the dense
# one less, and on near-ties incremental ran slower (ResNet-20, 4x4 patches: predicted 5.5 s against 6.0 s
# dense, measured 6.8 s against 5.1 s).
INCREMENTAL_MARGIN = 1.2
# incremental=None leaves incremental scoring out, untraced and untimed, when the dense torch engine's calibration
# predicts the whole job under this many seconds: tracing and timing the incremental path cost about 0.1 s of a
# small CNN's job (the digits CNN's 12 images of 64 features: 0.10 s of a 0.56 s first call) and its gain, at most
# the dense job's time, is smaller still where its prediction errs (up to 2.8x short on that job).
INCREMENTAL_MIN_JOB_S = 1.0


def check_engine(engine) -> str:
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return engine


@dataclass
class Engine:
    """What scores the candidates of a job.

    Attributes:
        name: "torch", "onnxruntime" or "compile".
        fn: the score f computed by that engine.
        batch_size: rows per forward call.
        calibration: how batch_size was chosen (None: the user gave it).
        verify: True when ``fn`` is not the user's model, so every set found must be checked on it.
    """

    name: str
    fn: ModelFn
    batch_size: int
    calibration: Calibration | None
    verify: bool


class EngineUnavailable(Exception):
    """The engine cannot run this model (the message says why)."""


_TMP: tempfile.TemporaryDirectory | None = None


def clear_cache() -> None:
    """Forget exported and compiled engines, and the small jobs' timings (kept in each model's state,
    runtime.model_state: "engine" {(name, shape, dtype, device): ModelFn or the EngineUnavailable raised} and
    "small_job")."""
    model_state.clear(("engine", "small_job"))


def _export(model: nn.Module, example: torch.Tensor, device: torch.device) -> OnnxModel:
    global _TMP
    if _TMP is None:
        _TMP = tempfile.TemporaryDirectory(prefix="overinterp_fast_onnx_")
    path = os.path.join(_TMP.name, f"model_{id(model):x}_{len(os.listdir(_TMP.name))}.onnx")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        export_onnx(model, path, example, dynamo=False)  # checks the export against the model
    return OnnxModel(path, device=device)


def _compile(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """torch.compile of a copy of ``model`` (kept in the model's state, the compiled module must not keep the model
    alive), compiled now on ``example`` (compilation errors surface here, not mid-job)."""
    compiled = torch.compile(copy.deepcopy(model))
    with torch.inference_mode():
        want, got = model(example), compiled(example)
    tol = 1e-4 if example.dtype == torch.float32 else 1e-9
    if not torch.allclose(got, want, rtol=tol, atol=tol):
        raise ValueError(f"the compiled model differs from the model: max error {(got - want).abs().max().item():.3g}")
    return compiled


def _build(name: str, user: ModelFn, images: torch.Tensor) -> ModelFn:
    """The engine's f for ``user``'s model; raises EngineUnavailable with the reason."""
    model = user.model
    if name == "torch":
        if isinstance(model, OnnxModel):
            raise ValueError("engine='torch' needs a torch model; this one is ONNX (use engine='auto' or 'onnxruntime')")
        return user
    if name == "onnxruntime" and isinstance(model, OnnxModel):
        return user
    if name == "compile" and isinstance(model, OnnxModel):
        raise ValueError("engine='compile' needs a torch model; this one is ONNX (use engine='auto' or 'onnxruntime')")
    if not isinstance(model, nn.Module):
        raise EngineUnavailable(f"{type(model).__name__} is not a torch.nn.Module")
    key = (name, tuple(images.shape[1:]), images.dtype, str(images.device))
    state = model_state.state_of(model)
    per_model = {} if state is None else state.table("engine")
    if key not in per_model:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if name == "onnxruntime":
                    built = ModelFn(_export(model, images[:2].contiguous(), images.device), outputs=user.outputs,
                                    device=images.device)
                else:
                    built = ModelFn(_compile(model, images[:2].contiguous()), outputs=user.outputs)
        except Exception as exc:  # exporters and compilers raise many types
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            built = EngineUnavailable(f"{type(exc).__name__}: {first}")
        per_model[key] = built
    built = per_model[key]
    if isinstance(built, EngineUnavailable):  # a new exception: a kept one's traceback would keep the model alive
        raise EngineUnavailable(str(built))
    return built


def _calibrate(name: str, fn: ModelFn, user: ModelFn, prep: Prepared, targets: torch.Tensor, measure_fn: str,
               max_rows: int, expected_rows: int, exact_shape: tuple[int, int] | None,
               bound: int | None = None) -> Calibration:
    images = prep.images
    upper = auto_batch_size(images, 1 << 30) if images.device.type == "cuda" else None
    if bound is not None:
        upper = bound if upper is None else min(upper, bound)
    fallback = auto_batch_size(images, max_rows)
    key, disk = _calibration_keys(user, prep, name, measure_fn, max_rows, exact_shape)
    tops = _exact_tops(user) if exact_shape is not None else None
    top_key = key[1:8]  # the key less the model and the job's shape: engine, measure, image shape, dtype, ...
    if tops is not None and top_key in tops:
        kept = tops[top_key]
        return Calibration(kept.batch_size, dict(kept.times), "cached", 0.0)
    probe = candidate_probe(getattr(fn.unfixed(), measure_fn), prep, targets)
    n, p = exact_shape if exact_shape is not None else (None, None)
    cal = calibrate(key, probe, max_rows=max_rows, expected_rows=expected_rows, fallback=fallback, upper=upper,
                    images=n, features=p, disk=disk, cache=_calibration_cache(user))
    if tops is not None and cal.source != "fallback":
        tops[top_key] = cal
    return cal


def _exact_tops(user: ModelFn) -> dict | None:
    """The batch sizes of exact SIS jobs kept in the model's state ("exact_top": per engine, measure, image shape,
    dtype, device, layout and thread count), or None where nothing is kept. The first calibrated job of a model
    and image shape decides the largest batch shape, and with it the few batch shapes of every later job of that
    model and shape (runtime.batching.bucket_sizes), whatever its number of images: the dense steps and their
    CUDA graphs made for the first job serve the later ones (methods.exact_step)."""
    state = model_state.state_of(user.model)
    return None if state is None else state.table("exact_top")


def _calibration_keys(user: ModelFn, prep: Prepared, name: str, measure_fn: str, max_rows: int,
                      exact_shape: tuple[int, int] | None) -> tuple[tuple, str | None]:
    """(the process cache's key, the disk cache's key or None) of a calibration: the model (an ONNX file's path;
    else "state": the key is kept in the model's own state, :func:`_calibration_cache`), what is timed (engine and
    measure), input shape, dtype, device, layout, thread count and the job's shape."""
    images = prep.images
    model_key = user.model.path if isinstance(user.model, OnnxModel) and user.model.path else "state"
    key = (model_key, name, measure_fn, tuple(images.shape[1:]), images.dtype, str(images.device),
           images.is_contiguous(), torch.get_num_threads(), max_rows,
           None if exact_shape is None else exact_shape)
    structure = _structure(user.model)
    return key, None if structure is None else disk_key(structure, *key[1:])


def _calibration_cache(user: ModelFn) -> dict | None:
    """Where a calibration of ``user``'s model is kept in the process: an ONNX file's in the process's table (keyed
    by its path: every call opens the file anew), any other model's in its state (runtime.model_state: it goes
    with the model); {} (kept for the job alone) where the model keeps no state."""
    if isinstance(user.model, OnnxModel) and user.model.path:
        return None
    state = model_state.state_of(user.model)
    return {} if state is None else state.table("calibration")


def _structure(model) -> str | None:
    """What a model's speed depends on, stable across processes: its class, layers and parameter shapes
    (None for a plain callable: nothing identifies it across processes)."""
    if isinstance(model, OnnxModel):
        return f"onnx:{model.path}:{os.path.getsize(model.path) if model.path else ''}:{model.input_shape}"
    if isinstance(model, nn.Module):
        shapes = [(k, tuple(t.shape), str(t.dtype)) for k, t in model.state_dict().items()]
        return f"{type(model).__module__}.{type(model).__qualname__}:{model!r}:{shapes}"
    return None


def _job_seconds(cal: Calibration, expected_rows: int) -> float:
    return min(t / b for b, t in cal.times.items()) * expected_rows if cal.times else 0.0


def select_engine(
    engine: str,
    user: ModelFn,
    prep: Prepared,
    targets: torch.Tensor,
    *,
    batch_size: int | None,
    max_rows: int,
    expected_rows: int,
    measure_fn: str = "score",
    exact_shape: tuple[int, int] | None = None,
    rival_s: float | None = None,
    max_batch: int | None = None,
) -> Engine:
    """Resolve ``engine`` for a job and choose its batch size.

    Args:
        engine: one of ENGINES.
        user: the user's model as f.
        prep, targets: the job's prepared images and target classes (for candidate-like probes).
        batch_size: the user's batch size (wins over calibration), or None.
        max_rows: the largest batch the job can fill; expected_rows: its total rows.
        measure_fn: "score" or "score_and_top1", what the job computes per row.
        exact_shape: (N, p) for exact SIS (batch size chosen by simulated schedule).
        rival_s: the predicted job time of another path (exact SIS's incremental scoring), or None:
            auto exports to ONNX only when both torch and the rival are predicted at AUTO_MIN_JOB_S or more.
        max_batch: the largest batch a torch or compiled engine may be given (the ladder's top, runtime.job), or
            None; ONNX Runtime's is not bounded by it.
    """
    check_engine(engine)
    images = prep.images
    if engine == "auto":
        name = "onnxruntime" if isinstance(user.model, OnnxModel) else "torch"
    else:
        name = engine
    try:
        fn = _build(name, user, images)
    except EngineUnavailable as why:
        warnings.warn(f"engine={name!r} is not available for this model ({why}); running the torch model")
        name, fn = "torch", user

    # auto weighs ONNX Runtime against torch only where ORT's CPU kernels serve: float32 torch modules on a CPU
    weigh_ort = (engine == "auto" and name == "torch" and isinstance(user.model, nn.Module)
                 and images.device.type == "cpu" and images.dtype == torch.float32)

    def calibrated(name, fn) -> Calibration:
        if batch_size is None:
            args = (name, fn, user, prep, targets, measure_fn, max_rows, expected_rows, exact_shape)
            bound = None if name == "onnxruntime" else max_batch
            return _calibrate(*args) if bound is None else _calibrate(*args, bound=bound)
        times = {}
        if weigh_ort and expected_rows >= MIN_ROWS:  # time the user's size, to compare the engines
            probe = candidate_probe(getattr(fn.unfixed(), measure_fn), prep, targets)
            times = measure(probe, [batch_size], expected_rows=expected_rows)
        return Calibration(batch_size, times, "user", 0.0)

    cal = calibrated(name, fn)
    if weigh_ort and min(_job_seconds(cal, expected_rows), math.inf if rival_s is None else rival_s) >= AUTO_MIN_JOB_S:
        try:
            ort_fn = _build("onnxruntime", user, images)
        except EngineUnavailable as why:  # a speed path that does not apply to this model: it steps aside
            logger.info("engine='auto': the ONNX export failed (%s); running the torch model", why)
            runinfo.note("engine", f"torch: the ONNX export failed ({why})")
        else:
            ort_cal = calibrated("onnxruntime", ort_fn)
            if ort_cal.times and _job_seconds(ort_cal, expected_rows) < _job_seconds(cal, expected_rows):
                name, fn, cal = "onnxruntime", ort_fn, ort_cal
    return Engine(name, fn, cal.batch_size, None if cal.source == "user" else cal, verify=fn is not user)


def incremental_calibration(pl: incremental.IncrementalPlan, user: ModelFn, prep: Prepared, targets: torch.Tensor, *,
                            batch_size: int | None, exact_shape: tuple[int, int]) -> Calibration:
    """The batch size of exact SIS's incremental scoring (docs: algorithms.md, Incremental inference), measured like a dense
    engine's (calibration.calibrate: cached per model, input shape, dtype, device and thread count;
    jobs under calibration.MIN_ROWS rows keep the plan's element-budget size). The user's
    ``batch_size`` wins and is not timed."""
    if batch_size is not None:
        return Calibration(batch_size, {}, "user", 0.0)
    n, p = exact_shape
    key, disk = _calibration_keys(user, prep, "incremental", "score", n * p, exact_shape)
    return calibrate(key, incremental.probe(pl, user, prep, targets), max_rows=n * p,
                     expected_rows=n * p * (p + 1) // 2, fallback=pl.batch_size(), images=n, features=p, disk=disk,
                     cache=_calibration_cache(user))


def low_precision_calibration(low_fn: ModelFn, user: ModelFn, low_prep: Prepared, targets: torch.Tensor, *,
                              batch_size: int | None, exact_shape: tuple[int, int]) -> Calibration:
    """The batch size of exact SIS with ``score_dtype``: nearly every row of its calls is scored by the low-dtype copy
    ``low_fn`` on ``low_prep`` (its images in the low dtype and format), so those calls are timed, like a dense
    engine's (calibration.calibrate: cached per model, dtype, format, device and thread count; the job's schedule
    picks the size). The user's ``batch_size`` wins and is not timed."""
    if batch_size is not None:
        return Calibration(batch_size, {}, "user", 0.0)
    n, p = exact_shape
    return _calibrate("low", low_fn, user, low_prep, targets, "score", n * p, n * p * (p + 1) // 2, exact_shape)


def dense_is_short(dense: Engine, exact_shape: tuple[int, int]) -> bool:
    """incremental=None: whether the dense engine's calibration predicts the job under INCREMENTAL_MIN_JOB_S, so
    that incremental scoring is not tried (False where the engine was not timed)."""
    cal = dense.calibration
    if cal is None or not cal.times:
        return False
    n, p = exact_shape
    seconds = exact_job_time(cal.times, cal.batch_size, n, p)
    if seconds >= INCREMENTAL_MIN_JOB_S:
        return False
    runinfo.note("incremental", f"off: the dense job is predicted at {seconds:.3g} s, under "
                                f"{INCREMENTAL_MIN_JOB_S:g} s ({dense.name})")
    return True


def incremental_pays(pl: incremental.IncrementalPlan, incr: Calibration, dense: Engine,
                     exact_shape: tuple[int, int]) -> bool:
    """incremental=None: whether incremental scoring is predicted to beat the dense engine on this job.

    Where both were timed: the predicted time of the job's candidate calls at each one's batch
    size (calibration.exact_job_time), the incremental side plus its base runs (one dense
    forward pass of every image per step, N at a time), which must be at least INCREMENTAL_MARGIN times
    shorter than the dense side's. Otherwise (a job too small to
    calibrate, or the user's batch size): the plan's estimate, at most AUTO_MAX_COST_RATIO
    of a dense pass. Both paths give the same SIS (docs: algorithms.md, Incremental inference); only the time differs.
    """
    n, p = exact_shape
    cal = dense.calibration
    if incr.times and cal is not None and cal.times:
        t_incr = estimate.incremental_seconds(incr, cal, n, p)
        t_dense = exact_job_time(cal.times, cal.batch_size, n, p)
        pays = t_incr * INCREMENTAL_MARGIN < t_dense
        logger.info("incremental inference %s (timed: predicted %.3g s against %.3g s dense, %s)",
                    "on" if pays else "off", t_incr, t_dense, dense.name)
        runinfo.note("incremental", f"{'on' if pays else 'off'}: predicted {t_incr:.3g} s against {t_dense:.3g} s "
                                    f"dense ({dense.name})")
        return pays
    pays = pl.cost_ratio <= incremental.AUTO_MAX_COST_RATIO
    logger.info("incremental inference %s (estimated %.2fx the work of a dense pass)",
                "on" if pays else "off", pl.cost_ratio)
    runinfo.note("incremental", f"{'on' if pays else 'off'}: estimated {pl.cost_ratio:.2f}x the work of a dense "
                                f"pass")
    return pays


def time_small_job(pl: incremental.IncrementalPlan, user: ModelFn, prep: Prepared, targets: torch.Tensor,
                   incr: Calibration, dense: Engine, exact_shape: tuple[int, int],
                   first_pass_s: float) -> tuple[Calibration, Engine]:
    """For :func:`incremental_pays` on a job that calibration skipped as small (both paths on their
    fallback sizes, no user batch size): time one call of each path at its batch size (calibration.measure,
    one warm-up call, then timed ones within its budget) when the job is predicted to take at least
    SMALL_JOB_TIMING_S, the prediction being ``first_pass_s`` (the N images' own forward pass) per image
    times the job's candidates. Otherwise, or for timed jobs, returns (incr, dense) unchanged."""
    n, p = exact_shape
    rows = n * p * (p + 1) // 2
    if incr.source != "fallback" or dense.calibration is None or dense.calibration.source != "fallback":
        return incr, dense
    if first_pass_s / max(n, 1) * rows < SMALL_JOB_TIMING_S:
        return incr, dense
    # measured once per (model, job shape, engine, batch sizes) in a process: a small job's timing would
    # otherwise cost every call about as much as the job itself
    key = (_calibration_keys(user, prep, "small job", "score", n * p, exact_shape)[0], dense.name, dense.batch_size,
           incr.batch_size)
    state = model_state.state_of(user.model)
    _small_jobs = {} if state is None else state.table("small_job")
    timed = _small_jobs.get(key)
    if timed is None:
        d = measure(candidate_probe(dense.fn.unfixed().score, prep, targets), [dense.batch_size], expected_rows=rows,
                    repeats=1)
        i = measure(incremental.probe(pl, user, prep, targets), [incr.batch_size], expected_rows=rows, repeats=1)
        timed = _small_jobs[key] = (i, d)
    i, d = timed
    return (Calibration(incr.batch_size, i, "measured", 0.0),
            dataclasses.replace(dense, calibration=Calibration(dense.batch_size, d, "measured", 0.0)))
