"""ExactSIS: Sufficient Input Subsets by backward selection over every feature (docs: algorithms.md, Exact SIS)."""
from __future__ import annotations

import time

import torch

from ..methods.exact import exact_sis
from ..methods.low_precision import LowPrecision, resolve_score_dtype
from ..methods.results import SISResult
from ..methods.choice import has_gradients
from ..runtime import estimate, job
from ..runtime.calibration import candidate_probe, exact_job_time
from ..runtime.engines import Engine, incremental_calibration, incremental_pays, time_small_job
from ..runtime.incremental import IncrementalEvaluator
from ..runtime.incremental import choose as choose_incremental
from ..runtime.model import initial_predictions
from ._base import Data, SetAttribution
from .options import ExactOptions, RunOptions

_R, _E = RunOptions, ExactOptions  # the defaults' single source


class ExactSIS(SetAttribution):
    """Exact SIS: backward selection over every feature (p(p+1)/2 forward passes per image), then FindSIS.

    ``attribute()`` returns the backward-selection order as scores: feature ``order[t - 1]`` (the t-th masked,
    1-based) scores t, so sorting by score, descending, gives the order back from the last masked.

    Args:
        forward_func: torch module (in eval mode) or callable [B, *D] -> logits [B, K]; a list of models is an
            ensemble; an ``.onnx`` path, ``onnxruntime.InferenceSession`` or OnnxModel.
        threshold: tau in [0, 1]: the SIS keeps f >= tau (a number, or one per example: a sequence or [N]).
        outputs: "logits" (f = softmax probability) or "probabilities".
        engine: what scores the candidates: "auto", "torch", "onnxruntime" or "compile"; every SIS is checked
            on the model as given (docs: guides/exact.md).
        batch_size: candidates per forward call (None: calibrated).
        collection: also find every further disjoint SIS (``SISResult.collection``).
        incremental: :class:`~overinterp_fast.attr.options.ExactOptions`' ``incremental``.
        score_dtype: :class:`~overinterp_fast.attr.options.ExactOptions`' ``score_dtype`` (None, torch.bfloat16 or
            torch.float16: candidates scored in that dtype first; the result is the images' dtype's).

    Example:
        >>> sis = ExactSIS(model, threshold=0.9)
        >>> results = sis.find_sis(images)            # list[SISResult]
        >>> scores = sis.attribute(images)            # images' shape [N, C, H, W]
    """

    options_class = ExactOptions

    def __init__(self, forward_func, *, threshold=_R.threshold, outputs: str = _R.outputs, engine: str = _R.engine,
                 batch_size: int | None = _R.batch_size, collection: bool = _R.collection,
                 incremental: bool | None = _E.incremental, score_dtype: torch.dtype | None = _E.score_dtype) -> None:
        super().__init__(forward_func, RunOptions(threshold, outputs, engine, batch_size, collection),
                         ExactOptions(incremental, score_dtype))

    def _check(self) -> None:
        engine, opts = self.run.engine, self.options
        if opts.incremental and engine not in ("auto", "torch"):
            raise ValueError(f"incremental=True runs the torch model; engine must be 'auto' or 'torch', got {engine!r}")
        if opts.score_dtype is not None and engine not in ("auto", "torch"):
            raise ValueError(f"score_dtype runs a copy of the torch model; engine must be 'auto' or 'torch', got "
                             f"{engine!r}")
        if opts.score_dtype is not None and opts.incremental:
            raise ValueError("score_dtype is not combined with incremental=True (incremental inference runs in the "
                             "images' dtype); leave incremental None or False")

    def _run(self, d: Data) -> list[SISResult]:
        run, target, progress = self.run, d.target, d.progress
        s = self._setup(d, "exact")
        score_dtype = resolve_score_dtype(self.options.score_dtype, s.prep.images.dtype)
        with torch.inference_mode():
            t0 = time.perf_counter()
            targets, scores0 = initial_predictions(s.fn, s.prep.images, target, s.runner)
            first_pass_s = time.perf_counter() - t0
            common = dict(thresholds=s.thresholds, collection=run.collection)
            if score_dtype is not None:  # the torch model, dense; a copy of it in score_dtype scores first
                low = LowPrecision(s.fn, s.prep, targets, s.runner, score_dtype)
                eng = self._dense(s, targets, engine="torch")  # the batch size: the full-dtype model's
                with estimate.announced(self._estimate(s, targets, eng, first_pass_s)):
                    return exact_sis(s.fn, s.prep, targets, scores0, **common, batch_size=eng.batch_size,
                                     runner=s.runner, progress=progress, low=low)
            incremental, eng, incremental_s = self._incremental(s, targets, first_pass_s)
            if incremental is not None:
                with estimate.announced(self._estimate(s, targets, eng, first_pass_s, incremental_s)):
                    return exact_sis(s.fn, s.prep, targets, scores0, **common, batch_size=s.runner.chunk,
                                     runner=s.runner, progress=progress, engine="torch", evaluator=incremental)
            if eng is None:
                eng = self._dense(s, targets)
            with estimate.announced(self._estimate(s, targets, eng, first_pass_s)):
                return exact_sis(eng.fn, s.prep, targets, scores0, **common, batch_size=eng.batch_size,
                                 runner=s.runner, progress=progress, verifier=job.verifier(s, eng, targets),
                                 engine=eng.name)

    def _estimate(self, s: job.Setup, targets: torch.Tensor, eng: Engine | None, first_pass_s: float,
                  incremental_s: float | None = None) -> estimate.Estimate:
        """The run's estimate (:mod:`~overinterp_fast.runtime.estimate`): the incremental path's predicted time
        where it runs (``incremental_s``), else the dense engine's calibrated schedule, else (no calibration) the
        first pass's time per image, timed once at the batch size where that predicts a long run."""
        n, p = s.prep.images.shape[0], s.prep.num_features
        cal = None if eng is None else eng.calibration
        if incremental_s is None and eng is not None:
            probe = candidate_probe(eng.fn.score, s.prep, targets)
            cal = estimate.timed(cal, probe, eng.batch_size, estimate.exact_rows(n, p), first_pass_s, n)
        seconds = (incremental_s * estimate.INCREMENTAL_SHORTFALL if incremental_s is not None
                   else estimate.exact_seconds(cal, first_pass_s, n, p))
        return estimate.exact_estimate(n, p, seconds, s.prep.images.device,
                                       estimate.row_seconds(cal, first_pass_s, n), has_gradients(self.forward_func))

    def _dense(self, s: job.Setup, targets: torch.Tensor, rival_s: float | None = None,
               engine: str | None = None) -> Engine:
        """The dense engine of the job (``engine``, default the run's): every candidate of n images of p features."""
        n, p = s.prep.images.shape[0], s.prep.num_features
        return job.choose_engine(s, engine or self.run.engine, targets, max_rows=n * p,
                                 expected_rows=estimate.exact_rows(n, p), exact_shape=(n, p), rival_s=rival_s)

    def _incremental(self, s: job.Setup, targets: torch.Tensor,
                     first_pass_s: float) -> tuple[IncrementalEvaluator | None, Engine | None, float | None]:
        """(the incremental evaluator where it runs the job, else None; the dense engine where it was chosen while
        timing the incremental path against it, else None; the incremental path's predicted seconds where it runs
        and was timed, else None). The runner takes the incremental batch size."""
        engine, incremental = self.run.engine, self.options.incremental
        pl = choose_incremental(s.fn, s.prep, incremental if engine in ("auto", "torch") else False)
        if pl is None:
            return None, None, None
        n, p = s.prep.images.shape[0], s.prep.num_features
        icl = incremental_calibration(pl, s.fn, s.prep, targets, batch_size=s.batch_size, exact_shape=(n, p))
        eng = None
        if incremental is None:  # auto: time it against the dense engine (no ONNX export when it is short)
            rival = exact_job_time(icl.times, icl.batch_size, n, p) if icl.times else None
            eng = self._dense(s, targets, rival)
            icl, eng = time_small_job(pl, s.fn, s.prep, targets, icl, eng, (n, p), first_pass_s)
        if eng is None or incremental_pays(pl, icl, eng, (n, p)):
            s.runner.chunk = icl.batch_size
            seconds = None
            if icl.times:  # its calls, and its base runs (a dense pass of the images per step)
                dense = None if eng is None else eng.calibration
                seconds = (estimate.incremental_seconds(icl, dense, n, p) if dense is not None and dense.times
                           else estimate.exact_seconds(icl, first_pass_s, n, p) + p * first_pass_s)
            return IncrementalEvaluator(pl, s.fn, s.prep, targets, s.runner), None, seconds
        return None, eng, None
