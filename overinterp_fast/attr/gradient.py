"""GradientSIS: batched-gradient SIS for large inputs (docs: algorithms.md, Batched-gradient SIS)."""
from __future__ import annotations

import time

import torch

from ..methods.gradient import check_autocast, gradient_sis
from ..methods.results import SISResult
from ..runtime import estimate, job
from ..runtime.calibration import candidate_probe
from ..runtime.engines import Engine
from ..runtime.model import initial_predictions
from ._base import Data, SetAttribution
from .options import GradientOptions, RunOptions

_R, _G = RunOptions, GradientOptions  # the defaults' single source


class GradientSIS(SetAttribution):
    """Batched-gradient SIS: backward selection that masks the ``k`` features of largest gradient per step (about
    p / k backward passes per image, all images of a batch in one), then FindSIS; needs a torch model.

    ``attribute()`` returns the masking order as scores (feature ``order[t - 1]`` scores t), as
    :class:`~overinterp_fast.attr.ExactSIS`. Every SIS is checked by a forward pass in the inputs' dtype.

    Args:
        forward_func: torch module (in eval mode) or callable [B, *D] -> logits [B, K] (gradients needed: no
            ONNX model).
        threshold, outputs, batch_size, collection: as :class:`~overinterp_fast.attr.ExactSIS`.
        k, autocast, channels_last: :class:`~overinterp_fast.attr.options.GradientOptions` (by default
            bf16 autocast for float32 images on CUDA and on CPUs with bf16 hardware, and channels_last gradient
            steps for convolutional models; every SIS is still checked in the images' dtype).

    Example:
        >>> results = GradientSIS(model, k=50).find_sis(images, target=3)
    """

    options_class = GradientOptions

    def __init__(self, forward_func, *, threshold=_R.threshold, outputs: str = _R.outputs,
                 batch_size: int | None = _R.batch_size, collection: bool = _R.collection, k: int = _G.k,
                 autocast: str | torch.dtype | None = _G.autocast,
                 channels_last: bool | None = _G.channels_last) -> None:
        super().__init__(forward_func, RunOptions(threshold, outputs, "auto", batch_size, collection),
                         GradientOptions(k, autocast, channels_last))

    def _check(self) -> None:
        engine = self.run.engine
        if engine not in ("auto", "torch"):
            raise ValueError(f"method='gradient' needs the torch model's gradients; engine must be 'auto' or "
                             f"'torch', got {engine!r}")

    def _run(self, d: Data) -> list[SISResult]:
        run, opts, progress = self.run, self.options, d.progress
        s, targets, scores0, est = self._prepare(d)
        autocast = check_autocast(opts.autocast, s.prep.images.device, s.prep.images.dtype)
        with estimate.announced(est):
            return gradient_sis(s.fn, s.prep, targets, scores0, thresholds=s.thresholds, collection=run.collection,
                                k=opts.k, runner=s.runner, autocast=autocast,
                                progress=progress, channels_last=opts.channels_last)

    def _estimate_only(self, d: Data) -> estimate.Estimate:
        return self._prepare(d, measure=True)[3]

    def _prepare(self, d: Data, measure: bool = False) -> tuple[job.Setup, torch.Tensor, torch.Tensor,
                                                                  estimate.Estimate]:
        """The call's set-up, targets, first scores and estimate (``measure``: timed even when short)."""
        opts = self.options
        s = self._setup(d, "gradient")
        n, p = s.prep.images.shape[0], s.prep.num_features
        with torch.no_grad():
            t0 = time.perf_counter()
            targets, scores0 = initial_predictions(s.fn, s.prep.images, d.target, s.runner)
            first_pass_s = time.perf_counter() - t0
            # FindSIS's prefix batches: calibrated like the others (small jobs keep the fallback size)
            eng = job.choose_engine(s, "torch", targets, max_rows=n * 32,
                                    expected_rows=n * (estimate.gradient_steps(p, opts.k) + 1),
                                    measure_fn="score_and_top1")
            return s, targets, scores0, self._estimate(s, targets, eng, first_pass_s, measure)

    def _estimate(self, s: job.Setup, targets: torch.Tensor, eng: Engine, first_pass_s: float,
                  measure: bool = False) -> estimate.Estimate:
        """The run's estimate: its gradient steps at about :data:`~overinterp_fast.runtime.estimate.
        GRADIENT_ROW_COST` forward rows each, a forward row's time from the calibration, else from the first pass
        (timed once at N rows where that predicts a long run, or with ``measure``); a larger k as the faster option
        where there are many steps."""
        n, p, k = s.prep.images.shape[0], s.prep.num_features, self.options.k
        rows, _ = estimate.gradient(n, p, k, 0.0)
        probe = candidate_probe(eng.fn.unfixed().score, s.prep, targets)
        cal = estimate.timed(eng.calibration, probe, n, int(rows * estimate.GRADIENT_ROW_COST), first_pass_s, n,
                             always=measure)
        row_s = estimate.row_seconds(cal, first_pass_s, n)
        rows, seconds = estimate.gradient(n, p, k, row_s)
        faster = None
        if estimate.gradient_steps(p, k) >= 50:
            _, fewer = estimate.gradient(n, p, 5 * k, row_s)
            faster = f"k={5 * k} (coarser steps), {estimate.about(fewer)}"
        return estimate.Estimate(f"gradient SIS of {n:,} image{'s' if n > 1 else ''} x {p:,} features, k={k}", rows,
                                 "gradient rows", seconds, estimate.device_name(s.prep.images.device), faster)
