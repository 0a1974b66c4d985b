"""SufficientSubset: a sufficient set from any ranking (a saliency map, gradients, a Captum attribution,
responsibility): batched FindSIS (docs: algorithms.md, Sufficient subsets of a ranking; docs: guides/rankings.md)."""
from __future__ import annotations

import torch

from ..methods.extraction import ExtractionConfig, extract_sets
from ..methods.results import SISResult
from ..runtime import job
from ..runtime.inputs import Prepared
from ..runtime.model import initial_predictions
from ._base import Data, SISAttribution, captum_call, element_features, spread
from .options import RunOptions, SubsetOptions, criterion_threshold

_R, _S = RunOptions, SubsetOptions  # the defaults' single source


def feature_scores(ranking, prep: Prepared) -> torch.Tensor:
    """One score per feature, float64 [N, p] on the images' device, from a ranking [N, p] or [N, *grid], or from
    an attribution of the inputs' shape [N, *D] (a Captum attribution): the sum of each feature's elements."""
    images = prep.images
    n, p = images.shape[0], prep.num_features
    if isinstance(ranking, torch.Tensor) and ranking.shape == images.shape:
        flat = ranking.detach().reshape(n, -1).to(images.device, torch.float64)
        scores = torch.zeros(n, p, dtype=torch.float64, device=images.device)
        scores.index_add_(1, prep.feature_map.reshape(-1), flat)
    elif isinstance(ranking, torch.Tensor) and ranking.dim() >= 1 and ranking.shape[0] == n and ranking[0].numel() == p:
        scores = ranking.detach().reshape(n, p).to(images.device, torch.float64)
    else:
        raise ValueError(f"ranking must be a tensor [N, *grid] with {p} scores per image, or an attribution of the "
                         f"inputs' shape {list(images.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("ranking contains NaN or inf")
    return scores


class SufficientSubset(SISAttribution):
    """Turn any ranking into a sufficient set per example: the first prefix of the ranking (features by
    descending score; ties: the higher feature id first, as ReX) that passes, found in batches, optionally made
    feature-exact and pruned to a 1-minimal set.

    Args:
        forward_func: torch module or callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or OnnxModel.
        threshold, outputs, batch_size: as :class:`~overinterp_fast.attr.ExactSIS` (threshold None: 0.9; refused
            with criterion="top1", which has none, as :class:`~overinterp_fast.attr.MinimalPixelSet`'s).
        engine: "auto", "torch", "onnxruntime" or "compile"; every set is checked on the model as given.
        criterion, step, refine, refine_budget: :class:`~overinterp_fast.attr.options.SubsetOptions`.

    Example:
        >>> from captum.attr import IntegratedGradients
        >>> attr = IntegratedGradients(model).attribute(images, target=3)            # [N, C, H, W]
        >>> sets = SufficientSubset(model).find_sis(images, attr, target=3, feature_mask=patches)
    """

    options_class = SubsetOptions

    def __init__(self, forward_func, *, threshold=None, outputs: str = _R.outputs, engine: str = _R.engine,
                 batch_size: int | None = _R.batch_size, criterion: str = _S.criterion, step: int = _S.step,
                 refine: bool | str = _S.refine, refine_budget: int | str | None = _S.refine_budget) -> None:
        threshold = criterion_threshold(threshold, criterion, type(self).__name__)
        super().__init__(forward_func, RunOptions(threshold, outputs, engine, batch_size),
                         SubsetOptions(criterion, step, refine, refine_budget))

    def _run(self, d: Data, ranking) -> list[SISResult]:
        o, run = self.options, self.run
        s = self._setup(d, "exact")
        n, p = s.prep.images.shape[0], s.prep.num_features
        scores = feature_scores(ranking, s.prep)
        passes = job.passes(o.criterion, s.thresholds)
        with torch.inference_mode():
            targets, scores0 = initial_predictions(s.fn, s.prep.images, d.target, s.runner)
            rounds = min(-(-p // o.step), 64)
            eng = job.choose_engine(s, run.engine, targets, max_rows=n * min(rounds, 32), expected_rows=n * rounds,
                                    measure_fn="score_and_top1")
            evaluator, verifier = job.evaluators(s, eng, targets)
            config = ExtractionConfig(step=o.step, verifier=verifier, engine=eng.name, refine=o.refine,
                                      refine_budget=o.refine_budget)
            return extract_sets(evaluator, s.prep, targets, scores0, s.thresholds, lambda present: (scores, None),
                                passes, config)

    def _results(self, d: Data, ranking) -> list[SISResult]:
        """:meth:`_run`, example by example where needed (each with its row of ``ranking``), with the run's
        info."""
        def work(one: Data) -> list[SISResult]:
            i = one.example
            return self._run(one, ranking if i is None or not isinstance(ranking, torch.Tensor) else ranking[i:i + 1])

        return self._each(d, work)

    @captum_call(skip=1)
    def find_sis(self, inputs: torch.Tensor, ranking: torch.Tensor, baselines=None, target=None,
                 additional_forward_args=None, feature_mask=None) -> list[SISResult]:
        """One sufficient set per example from its ranking.

        Args (after the ranking, Captum's names and positional order):
            inputs: [N, *D] floating tensor, normalized as the model expects.
            ranking: scores per feature, higher = kept first: [N, p], [N, *grid] (e.g. [N, H, W] for pixels), or an
                attribution of the inputs' shape [N, *D] (e.g. from Captum), reduced to one score per feature: the
                sum over the feature's elements (without ``feature_mask``: over the channels of each pixel for
                [N, C, H, W]).
            baselines, target, additional_forward_args, feature_mask: as
                :meth:`~overinterp_fast.attr.ExactSIS.find_sis`.

        Returns:
            One :class:`~overinterp_fast.SISResult` per example: ``order`` the features by descending score,
            ``values`` their scores, ``sis`` the set (None if even all features fail), ``sis_score`` f on it.
        """
        return self._results(self._data(inputs, baselines, target, additional_forward_args, feature_mask, False),
                             ranking)

    @captum_call(skip=1)
    def attribute(self, inputs: torch.Tensor, ranking: torch.Tensor, baselines=None, target=None,
                  additional_forward_args=None, feature_mask=None) -> torch.Tensor:
        """The set of :meth:`find_sis` as a 0/1 tensor of ``inputs``' shape [N, *D] and dtype (1 on every element
        of the set's features; all 0 where an example has no set)."""
        d = self._data(inputs, baselines, target, additional_forward_args, feature_mask, False)
        results = self._results(d, ranking)
        fm = element_features(inputs, d.features)
        member = torch.zeros(len(results), int(fm.max()) + 1, dtype=torch.float64)
        for i, r in enumerate(results):
            if r.sis is not None:
                member[i, r.sis] = 1.0
        return spread(member, inputs, fm)
