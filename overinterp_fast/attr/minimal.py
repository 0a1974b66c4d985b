"""MinimalPixelSet: minimal pixel sets from responsibility maps (docs: algorithms.md, Causal responsibility and
minimal pixel sets; docs: guides/responsibility.md). Black box: forward passes only."""
from __future__ import annotations

import torch

from ..methods.blocks import auto_block
from ..methods.extraction import ExtractionConfig, extract_sets
from ..methods.responsibility import DescentPlan, RankingHook, ranking_maps
from ..methods.results import SISResult
from ..runtime import estimate, job
from ._base import Data, SetAttribution
from .options import MinimalPixelSetOptions, ResponsibilityOptions, RunOptions, criterion_threshold
from .responsibility import start_maps

_R, _M = RunOptions, MinimalPixelSetOptions  # the defaults' single source
REX_STEP = 10  # ReX's extraction: prefixes in steps of 10 pixels (the guided search and the scan look for it too)


class MinimalPixelSet(SetAttribution):
    """Minimal pixel sets: the pixels ranked by causal responsibility (ReX's descents, depth 10, boxes of at least
    10 pixels), then a small set that passes the criterion, extracted from the ranking and checked on the model.

    ``attribute()`` returns the ranking as scores: ``order[j]`` (j-th most responsible, of m ranked) scores m - j,
    so sorting by score, descending, gives the order back. In each :class:`~overinterp_fast.SISResult`,
    ``order`` ranks the pixels, ``values`` holds their responsibility (with ``block`` > 1: their square's mean),
    ``sis``/``mask`` is the minimal pixel set; ``queries``, ``extraction_queries`` and ``refine_queries`` count the
    forward passes of the maps, the prefix search and the pruning, ``minimal`` whether the set is certified
    1-minimal.

    Args:
        forward_func: torch module or callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or OnnxModel.
        threshold: tau, with ``criterion="threshold"`` (None: 0.9). The default criterion, "top1" (ReX's: the set
            restores the top-1 class), has no threshold: a threshold given with it is refused with one line, not
            ignored and not taken as a switch to "threshold" (see below).
        outputs, engine, batch_size, collection: as :class:`~overinterp_fast.attr.ExactSIS`.
        iterations, seed, criterion, monotone, refine, refine_budget, block, prefix_search:
            :class:`~overinterp_fast.attr.options.MinimalPixelSetOptions`. ReX-faithful:
            ``iterations=20, refine=False``.

    Criterion and threshold: ``MinimalPixelSet(model)`` finds sets that restore the top-1 class (ReX's
    criterion); ``MinimalPixelSet(model, criterion="threshold", threshold=0.9)`` sets with f(x_S) >= tau, which
    are SIS. ``MinimalPixelSet(model, threshold=0.5)`` alone is refused: a threshold with the top-1 criterion would
    be ignored (the sets' f may lie below it, their ``threshold`` field saying otherwise), and switching the
    criterion because a threshold was given would make the same call mean two algorithms depending on whether a
    default was spelled out; one word, ``criterion="threshold"``, says which is meant.

    Example:
        >>> results = MinimalPixelSet(model).find_sis(images)   # sets that restore the top-1 class
        >>> sis = MinimalPixelSet(model, criterion="threshold", threshold=0.9).find_sis(images)   # f(x_S) >= 0.9
    """

    options_class = MinimalPixelSetOptions
    masking_order = False

    def __init__(self, forward_func, *, threshold=None, outputs: str = _R.outputs, engine: str = _R.engine,
                 batch_size: int | None = _R.batch_size, collection: bool = _R.collection,
                 iterations: int | str = _M.iterations, seed: int = _M.seed, criterion: str = _M.criterion,
                 monotone: bool | None = _M.monotone, refine: bool | str = _M.refine,
                 refine_budget: int | str | None = _M.refine_budget, block: int | str = _M.block,
                 prefix_search: str = _M.prefix_search) -> None:
        threshold = criterion_threshold(threshold, criterion, type(self).__name__)
        super().__init__(forward_func, RunOptions(threshold, outputs, engine, batch_size, collection),
                         MinimalPixelSetOptions(iterations, seed, criterion, monotone, refine, refine_budget, block,
                                                prefix_search))

    def _hook(self) -> RankingHook | None:
        """Research code's hook into the descents (:mod:`overinterp_fast.experimental`); None here."""
        return None

    def _plan(self, progress) -> DescentPlan:
        """The descents of the ranking: ReX's depth and box size; monotone None: on unless refine=False."""
        o = self.options
        monotone = o.refine is not False if o.monotone is None else o.monotone
        return DescentPlan(o.iterations, ResponsibilityOptions.depth, ResponsibilityOptions.min_box, o.seed, progress,
                           monotone=monotone, hook=self._hook())

    def _estimate_only(self, d: Data):
        with torch.inference_mode():
            return start_maps(self, d, self.options.iterations, self.options.criterion, measure=True).estimate

    def _run(self, d: Data) -> list[SISResult]:
        o = self.options
        with torch.inference_mode():
            mj = start_maps(self, d, o.iterations, o.criterion)
            s, plan = mj.s, self._plan(d.progress)

            def rank(present):
                maps, queries = ranking_maps(mj.evaluator, s.prep, present, mj.passes, plan)
                return maps.view(maps.shape[0], -1), queries

            config = ExtractionConfig(
                step=REX_STEP, collection=self.run.collection, verifier=mj.verifier, engine=mj.engine.name,
                refine=o.refine, refine_budget=o.refine_budget, refine_scan=REX_STEP,
                block=auto_block(*s.prep.images.shape[-2:]) if o.block == "auto" else o.block,
                guide=job.slack(o.criterion, s.thresholds) if o.prefix_search == "guided" else None)
            with estimate.announced(mj.estimate):
                return extract_sets(mj.evaluator, s.prep, mj.targets, mj.scores0, s.thresholds, rank, mj.passes,
                                    config)
