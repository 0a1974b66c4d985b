"""Responsibility: causal responsibility maps, ReX's algorithm (docs: algorithms.md, Causal responsibility and
minimal pixel sets). Black box: forward passes only."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..methods.responsibility import DescentPlan, RankingHook, ResponsibilityMap, ranking_maps
from ..runtime import estimate, job
from ..runtime.calibration import candidate_probe
from ..runtime.batching import CandidateEvaluator
from ..runtime.engines import Engine
from ..runtime.model import initial_predictions
from ._base import Data, SISAttribution, captum_call, check_show_progress, element_features, spread
from .options import ResponsibilityOptions, RunOptions, criterion_threshold

_R, _O = RunOptions, ResponsibilityOptions  # the defaults' single source


def responsibility_rows(n: int, iterations: int | str) -> tuple[int, int]:
    """(largest batch, total rows) of responsibility maps: 14 mutants per active box and descent, about 6 levels
    (iterations="auto": one descent per image at a time, about 13 iterations on EfficientNet-Lite0)."""
    if iterations == "auto":
        return n * 14, n * 13 * 14 * 6
    return n * iterations * 14, n * iterations * 14 * 6


@dataclass
class MapsJob:
    """A responsibility job's pieces (:func:`start_maps`): the set-up, the pass criterion, the targets [N] and
    f(x) [N], the engine, its evaluator and the user's model's (None when they are one)."""

    s: job.Setup
    passes: object
    targets: torch.Tensor
    scores0: torch.Tensor
    engine: Engine
    evaluator: CandidateEvaluator
    verifier: CandidateEvaluator | None
    estimate: estimate.Estimate


def start_maps(obj: SISAttribution, d: Data, iterations: int | str, criterion: str,
               measure: bool = False) -> MapsJob:
    """Set up a responsibility job of ``obj`` (Responsibility or MinimalPixelSet; call it in inference mode) for
    the call ``d``: images [N, C, H, W] with pixel features, the targets, the engine sized for ``iterations``
    descents (``measure``: its estimate timed even where the first pass predicts a short run)."""
    run = obj.run
    s = obj._setup(d, "responsibility")
    job.check_pixels(s, obj.name)
    passes = job.passes(criterion, s.thresholds)
    t0 = time.perf_counter()
    targets, scores0 = initial_predictions(s.fn, s.prep.images, d.target, s.runner)
    first_pass_s = time.perf_counter() - t0
    n = s.prep.images.shape[0]
    max_rows, expected = responsibility_rows(n, iterations)
    eng = job.choose_engine(s, run.engine, targets, max_rows=max_rows, expected_rows=expected,
                            measure_fn="score_and_top1")
    evaluator, verifier = job.evaluators(s, eng, targets)
    cal = estimate.timed(eng.calibration, candidate_probe(eng.fn.unfixed().score_and_top1, s.prep, targets),
                         eng.batch_size, expected, first_pass_s, n, always=measure)
    est = estimate.Estimate(f"responsibility maps of {n:,} image{'s' if n > 1 else ''} x {s.prep.num_features:,} "
                            f"pixels, {iterations} iterations", expected, "forward rows",
                            expected * estimate.row_seconds(cal, first_pass_s, n),
                            estimate.device_name(s.prep.images.device))
    return MapsJob(s, passes, targets, scores0, eng, evaluator, verifier, est)


class Responsibility(SISAttribution):
    """Causal responsibility maps (ReX 0.4.1's algorithm, after Kelly, Chanchal and Blake): ``iterations`` random descents per image
    through boxes of pixels, all run together; the map is the sum over descents of log(per-descent map).

    ``attribute()`` returns the map broadcast over channels (inputs' shape [N, C, H, W] and dtype; higher = more
    responsible); ``compute_maps()`` the :class:`~overinterp_fast.methods.responsibility.ResponsibilityMap`s.

    Args:
        forward_func: torch module or callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or OnnxModel.
        outputs, engine, batch_size: as :class:`~overinterp_fast.attr.ExactSIS`.
        threshold: the criterion's tau with ``criterion="threshold"`` (a number, or one per image; None: 0.9);
            refused with the default criterion, "top1", which has none (as :class:`MinimalPixelSet`'s).
        iterations, seed, depth, min_box, criterion, monotone:
            :class:`~overinterp_fast.attr.options.ResponsibilityOptions` (monotone None: off, as ReX).

    Example:
        >>> maps = Responsibility(model, iterations=20).attribute(images)   # [N, C, H, W]
    """

    options_class = ResponsibilityOptions

    def __init__(self, forward_func, *, outputs: str = _R.outputs, engine: str = _R.engine,
                 batch_size: int | None = _R.batch_size, iterations: int = _O.iterations, seed: int = _O.seed,
                 depth: int = _O.depth, min_box: int = _O.min_box, criterion: str = _O.criterion,
                 threshold=None, monotone: bool | None = _O.monotone) -> None:
        threshold = criterion_threshold(threshold, criterion, type(self).__name__)
        super().__init__(forward_func, RunOptions(threshold, outputs, engine, batch_size),
                         ResponsibilityOptions(iterations, seed, depth, min_box, criterion, monotone))

    def _hook(self) -> RankingHook | None:
        """Research code's hook into the descents (:mod:`overinterp_fast.experimental`); None here."""
        return None

    def _maps(self, d: Data) -> list[ResponsibilityMap]:
        o = self.options
        with torch.inference_mode():
            mj = start_maps(self, d, o.iterations, o.criterion)
            n, p = mj.s.prep.images.shape[0], mj.s.prep.num_features
            present = torch.ones((n, p), dtype=torch.bool, device=mj.s.prep.images.device)
            plan = DescentPlan(o.iterations, o.depth, o.min_box, o.seed, d.progress, monotone=bool(o.monotone),
                               hook=self._hook())
            with estimate.announced(mj.estimate):
                maps, queries = ranking_maps(mj.evaluator, mj.s.prep, present, mj.passes, plan)
        return [ResponsibilityMap(maps[i].cpu(), queries[i], int(mj.targets[i]), o.iterations) for i in range(n)]

    def _results(self, d: Data) -> list[ResponsibilityMap]:
        """:meth:`_maps`, example by example where needed, with the run's info."""
        return self._each(d, self._maps)

    @captum_call()
    def compute_maps(self, inputs: torch.Tensor, baselines=None, target=None, additional_forward_args=None,
                     feature_mask=None, *, show_progress: bool = False) -> list[ResponsibilityMap]:
        """One responsibility map per image.

        Args (Captum's names and positional order):
            inputs: images [N, C, H, W], normalized as the model expects.
            baselines, target, additional_forward_args, show_progress: as
                :meth:`~overinterp_fast.attr.ExactSIS.find_sis`.
            feature_mask: None (the maps rank pixels; any other map is refused).

        Returns:
            One :class:`~overinterp_fast.methods.responsibility.ResponsibilityMap` per image: ``map`` float64
            [H, W] (the sum over iterations of log(per-iteration map)), the ``queries`` used and the run's
            ``info``.
        """
        return self._results(self._data(inputs, baselines, target, additional_forward_args, feature_mask,
                                         check_show_progress(show_progress)))

    @captum_call()
    def attribute(self, inputs: torch.Tensor, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, *, show_progress: bool = False) -> torch.Tensor:
        """The maps of :meth:`compute_maps` broadcast over channels: inputs' shape [N, C, H, W] and dtype."""
        maps = self.compute_maps(inputs, baselines=baselines, target=target,
                                 additional_forward_args=additional_forward_args, feature_mask=feature_mask,
                                 show_progress=show_progress)
        per_pixel = torch.stack([m.map.reshape(-1) for m in maps])
        return spread(per_pixel, inputs, element_features(inputs, None))
