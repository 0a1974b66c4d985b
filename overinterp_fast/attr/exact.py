"""ExactSIS: Sufficient Input Subsets by backward selection over every feature (docs: algorithms.md, Exact SIS)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..methods.exact import exact_sis
from ..methods.low_precision import LowPrecision, resolve_score_dtype
from ..methods.choice import has_gradients
from ..methods.results import RunInfo, SISResult
from ..runtime import estimate, job
from ..runtime.calibration import Calibration, candidate_probe, exact_job_time
from ..runtime.calibration import measure as calibration_measure
from ..runtime.engines import (Engine, dense_is_short, incremental_calibration, incremental_pays, low_precision_calibration,
                               time_small_job)
from ..runtime.memory_format import channels_last_copy, choose_channels_last
from ..runtime.incremental import IncrementalEvaluator
from ..runtime.incremental import choose as choose_incremental
from ..runtime.incremental import probe as incremental_probe
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
        channels_last: :class:`~overinterp_fast.attr.options.ExactOptions`' ``channels_last`` (None: measured on a
            GPU; True, False).

    Every result of a call carries the same ``info`` (:class:`~overinterp_fast.methods.results.RunInfo`): the
    engine, the batch size and how it was chosen, the memory format, and the candidates scored and re-scored.

    Example:
        >>> sis = ExactSIS(model, threshold=0.9)
        >>> results = sis.find_sis(images)            # list[SISResult]
        >>> scores = sis.attribute(images)            # images' shape [N, C, H, W]
    """

    options_class = ExactOptions

    def __init__(self, forward_func, *, threshold=_R.threshold, outputs: str = _R.outputs, engine: str = _R.engine,
                 batch_size: int | None = _R.batch_size, collection: bool = _R.collection,
                 incremental: bool | None = _E.incremental, score_dtype: torch.dtype | None = _E.score_dtype,
                 channels_last: bool | None = _E.channels_last) -> None:
        super().__init__(forward_func, RunOptions(threshold, outputs, engine, batch_size, collection),
                         ExactOptions(incremental, score_dtype, channels_last))

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
        if opts.channels_last and engine not in ("auto", "torch"):
            raise ValueError(f"channels_last=True runs a copy of the torch model; engine must be 'auto' or 'torch', "
                             f"got {engine!r}")

    def _run(self, d: Data) -> list[SISResult]:
        call = self._job(d)
        with torch.inference_mode(), estimate.announced(call.estimate):
            return call.run()

    def _estimate_only(self, d: Data) -> estimate.Estimate:
        return self._job(d, measure=True).estimate

    def _job(self, d: Data, measure: bool = False) -> "_Job":
        """The call ``d`` decided: its estimate, and the run (the initial predictions made, the engine and path
        chosen). ``measure``: time the candidate calls even where the first pass predicts a short run."""
        run, target, progress = self.run, d.target, d.progress
        s = self._setup(d, "exact")
        score_dtype = resolve_score_dtype(self.options.score_dtype, s.prep.images.dtype)
        with torch.inference_mode():
            # the format of the full-dtype model: the plain run's, so that with score_dtype its scores (the first
            # pass and the re-scored candidates) are the plain run's to the last bit; the low copy's is chosen below
            given = (s.fn, s.prep)
            targets, scores0, first_pass_s, layout = self._first_pass(s, target)
            common = dict(thresholds=s.thresholds, collection=run.collection)
            if score_dtype is not None:  # the torch model, dense; a copy of it in score_dtype scores first
                low, cal, layout = self._low_precision(s, targets, score_dtype, given)
                est = self._estimate(s, targets, None, first_pass_s, measure=measure)  # from the first pass

                def low_run() -> list[SISResult]:
                    results = exact_sis(s.fn, s.prep, targets, scores0, **common, batch_size=cal.batch_size,
                                        runner=s.runner, progress=progress, low=low)
                    return with_info(results, "torch", cal, layout, low)

                return _Job(est, low_run)
            incremental, eng, icl, incremental_s = self._incremental(s, targets, first_pass_s, measure)
            if incremental is not None:
                est = self._estimate(s, targets, eng, first_pass_s, incremental_s, measure)

                def incremental_run() -> list[SISResult]:
                    results = exact_sis(s.fn, s.prep, targets, scores0, **common, batch_size=s.runner.chunk,
                                        runner=s.runner, progress=progress, engine="torch", evaluator=incremental)
                    return with_info(results, "incremental", icl, layout)

                return _Job(est, incremental_run)
            if eng is None:
                eng = self._dense(s, targets)
            est = self._estimate(s, targets, eng, first_pass_s, measure=measure)

            def dense_run() -> list[SISResult]:
                results = exact_sis(eng.fn, s.prep, targets, scores0, **common, batch_size=eng.batch_size,
                                    runner=s.runner, progress=progress, verifier=job.verifier(s, eng, targets),
                                    engine=eng.name)
                return with_info(results, eng.name, eng.calibration or Calibration(eng.batch_size, {}, "user"), layout)

            return _Job(est, dense_run)

    def _estimate(self, s: job.Setup, targets: torch.Tensor, eng: Engine | None, first_pass_s: float,
                  incremental_s: float | None = None, measure: bool = False) -> estimate.Estimate:
        """The run's estimate (:mod:`~overinterp_fast.runtime.estimate`): the incremental path's predicted time
        where it runs (``incremental_s``), else the dense engine's calibrated schedule, else (no calibration) the
        first pass's time per image, timed once at the batch size where that predicts a long run (or with
        ``measure``)."""
        n, p = s.prep.images.shape[0], s.prep.num_features
        cal = None if eng is None else eng.calibration
        if incremental_s is None and eng is not None:
            probe = candidate_probe(eng.fn.unfixed().score, s.prep, targets)
            cal = estimate.timed(cal, probe, eng.batch_size, estimate.exact_rows(n, p), first_pass_s, n,
                                 always=measure)
        seconds = (incremental_s if incremental_s is not None
                   else estimate.exact_seconds(cal, first_pass_s, n, p))
        return estimate.exact_estimate(n, p, seconds, s.prep.images.device,
                                       estimate.row_seconds(cal, first_pass_s, n), has_gradients(self.forward_func))

    def choices(self, inputs: torch.Tensor, feature_mask=None, baselines=None) -> RunInfo:
        """What a call on ``inputs`` would choose, without running it: the batch size (calibrated as the call does,
        on the dense torch path, or on the low-dtype copy with ``score_dtype``) and the memory format, as a
        :class:`~overinterp_fast.methods.results.RunInfo` (no candidates counted). For runs whose results must not
        depend on timing (a stored audit): measure once, then pass ``batch_size`` and ``channels_last``."""
        s = self._setup(self._data(inputs, baselines, None, None, feature_mask, False), "exact")
        score_dtype = resolve_score_dtype(self.options.score_dtype, s.prep.images.dtype)
        with torch.inference_mode():
            given = (s.fn, s.prep)
            targets, _, _, layout = self._first_pass(s, None)
            if score_dtype is not None:
                low, cal, layout = self._low_precision(s, targets, score_dtype, given)
                return RunInfo("torch", cal.batch_size, cal.source, layout[0], dict(cal.times), dict(layout[1]),
                               low=low.summary())
            eng = self._dense(s, targets, engine="torch" if self.run.engine == "auto" else None)
            cal = eng.calibration or Calibration(eng.batch_size, {}, "user")
            return RunInfo(eng.name, cal.batch_size, cal.source, layout[0], dict(cal.times), dict(layout[1]))

    def _first_pass(self, s: job.Setup, target) -> tuple[torch.Tensor, torch.Tensor, float, tuple[bool, dict]]:
        """(targets int64 [N], f(x) float64 [N], the first pass's seconds, :meth:`_layout`'s choice). The first
        pass runs before the format is measured, so that the inputs and the model's outputs are checked
        (:func:`~overinterp_fast.runtime.model.initial_predictions`) before any candidate; where the job runs
        channels_last, f(x) is taken again from the channels_last copy, whose candidates it is compared with."""
        t0 = time.perf_counter()
        targets, scores0 = initial_predictions(s.fn, s.prep.images, target, s.runner)
        first_pass_s = time.perf_counter() - t0
        layout = self._layout(s)
        if layout[0]:
            t0 = time.perf_counter()
            targets, scores0 = initial_predictions(s.fn, s.prep.images, target, s.runner)
            first_pass_s = time.perf_counter() - t0
        return targets, scores0, first_pass_s, layout

    def _layout(self, s: job.Setup) -> tuple[bool, dict]:
        """Whether the job runs channels_last (:func:`~overinterp_fast.runtime.memory_format.choose_channels_last`, at the
        runner's first batch size), and the times measured; where it does, ``s`` takes the channels_last copy of
        the model and images. Engines other than torch run the model as given."""
        if self.run.engine not in ("auto", "torch"):
            return False, {}
        cl, times = choose_channels_last(self.options.channels_last, s.fn, s.prep, s.runner.chunk)
        if cl:
            s.fn, s.prep = channels_last_copy(s.fn, s.prep)
            job.fixed_shapes(s.fn, s.runner)
        return cl, times

    def _low_precision(self, s: job.Setup, targets: torch.Tensor, dtype: torch.dtype,
                       given: tuple) -> tuple[LowPrecision, Calibration, tuple[bool, dict]]:
        """The low-precision scoring of the job: the low copy's format (measured on that copy, see
        :meth:`_layout`), its batch size (calibrated on the low copy, whose rows are nearly all of the job's:
        engines.low_precision_calibration), and both the full model's and the copy's calls padded to the runner's
        fixed shapes (CUDA graphs on a GPU). ``given``: (f, prepared images) of the model as given, which the low
        copy is made from (``s`` may hold the full-dtype model's channels_last copy by now)."""
        fn, prep = given
        low = LowPrecision(fn, prep, targets, s.runner, dtype)
        layout = (False, {})
        if self.run.engine in ("auto", "torch"):
            layout = choose_channels_last(self.options.channels_last, low.evaluator.fn, low.evaluator.prep,
                                          s.runner.chunk)
            if layout[0]:
                low = LowPrecision(fn, prep, targets, s.runner, dtype, channels_last=True)
        n, p = s.prep.images.shape[0], s.prep.num_features
        cal = low_precision_calibration(low.evaluator.fn, fn, low.evaluator.prep, targets,
                                        batch_size=s.batch_size, exact_shape=(n, p))
        s.runner.chunk = cal.batch_size
        job.fixed_shapes(s.fn, s.runner)
        job.fixed_shapes(low.evaluator.fn, s.runner)
        return low, cal, layout

    def _dense(self, s: job.Setup, targets: torch.Tensor, rival_s: float | None = None,
               engine: str | None = None) -> Engine:
        """The dense engine of the job (``engine``, default the run's): every candidate of n images of p features."""
        n, p = s.prep.images.shape[0], s.prep.num_features
        return job.choose_engine(s, engine or self.run.engine, targets, max_rows=n * p,
                                 expected_rows=estimate.exact_rows(n, p), exact_shape=(n, p), rival_s=rival_s)

    def _incremental(self, s: job.Setup, targets: torch.Tensor, first_pass_s: float, measure: bool = False
                     ) -> tuple[IncrementalEvaluator | None, Engine | None, Calibration | None, float | None]:
        """(the incremental evaluator where it runs the job, else None; the dense engine where it was chosen while
        timing the incremental path against it, else None; the incremental path's calibration where it was made;
        its predicted seconds where it runs and was timed, else None). The runner takes the incremental batch
        size. ``measure``: where the path runs untimed, one call at its batch size is timed for the estimate."""
        engine, incremental = self.run.engine, self.options.incremental
        n, p = s.prep.images.shape[0], s.prep.num_features
        if (incremental is None and engine in ("auto", "torch") and s.batch_size is None
                and isinstance(s.fn.model, torch.nn.Module)):
            # a short job stays dense, untraced: the torch engine's calibration (kept for the dense run) says
            if dense_is_short(self._dense(s, targets, engine="torch"), (n, p)):
                return None, None, None, None
        pl = choose_incremental(s.fn, s.prep, incremental if engine in ("auto", "torch") else False)
        if pl is None:
            return None, None, None, None
        icl = incremental_calibration(pl, s.fn, s.prep, targets, batch_size=s.batch_size, exact_shape=(n, p))
        eng = None
        if incremental is None:  # auto: time it against the dense engine (no ONNX export when it is short)
            rival = exact_job_time(icl.times, icl.batch_size, n, p) if icl.times else None
            eng = self._dense(s, targets, rival)
            icl, eng = time_small_job(pl, s.fn, s.prep, targets, icl, eng, (n, p), first_pass_s)
        if eng is None or incremental_pays(pl, icl, eng, (n, p)):
            s.runner.chunk = icl.batch_size
            timed = icl
            if measure and not icl.times:  # the estimate's own timing at the path's batch size: it changes no choice
                probe = incremental_probe(pl, s.fn, s.prep, targets)
                rows = estimate.exact_rows(n, p)
                timed = Calibration(icl.batch_size, calibration_measure(probe, [icl.batch_size], expected_rows=rows),
                                    "measured")
            seconds = None
            if timed.times:  # its calls, and its base runs (a dense pass of the images per step)
                dense = None if eng is None else eng.calibration
                seconds = (estimate.incremental_seconds(timed, dense, n, p) if dense is not None and dense.times
                           else estimate.exact_seconds(timed, first_pass_s, n, p) + p * first_pass_s)
            return IncrementalEvaluator(pl, s.fn, s.prep, targets, s.runner), None, icl, seconds
        return None, eng, icl, None


@dataclass
class _Job:
    """An exact SIS call decided: its estimate, and ``run()`` (its results, with their info)."""

    estimate: estimate.Estimate
    run: Callable[[], list[SISResult]]


def with_info(results: list[SISResult], engine: str, cal: Calibration, layout: tuple[bool, dict],
              low: LowPrecision | None = None) -> list[SISResult]:
    """``results`` with one :class:`~overinterp_fast.methods.results.RunInfo` of the call on each: ``engine``, the
    batch size ``cal`` chose and how, the ``layout`` (channels_last, its measured times), the candidates and
    re-scored candidates of every round the results hold (a collection's rounds included), and ``low``'s summary."""
    rounds = [c for r in results for c in ([r] + [c for c in (r.collection or []) if c is not r])]
    first = next((c.info for c in rounds if c.info is not None), None)  # exact_sis's: what ran the steps
    info = RunInfo(engine, cal.batch_size, cal.source, layout[0], dict(cal.times), dict(layout[1]),
                   candidates=sum(c.order.numel() * (c.order.numel() + 1) // 2 for c in rounds),
                   rescored=sum(c.rescored or 0 for c in rounds), low=None if low is None else low.summary(),
                   step="" if first is None else first.step, steps=None if first is None else first.steps)
    for r in results:
        r.info = info
        for c in r.collection or []:
            c.info = info
    return results
