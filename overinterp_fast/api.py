"""The function forms: fast_sis, responsibility, sufficient_subset (thin, over :mod:`overinterp_fast.attr`)."""
from __future__ import annotations

import math
from typing import Callable

import torch

from .attr._base import DATA_RENAMES, Data, captum_data
from .attr import (ExactOptions, ExactSIS, GradientOptions, GradientSIS, MinimalPixelSet, MinimalPixelSetOptions,
                   Responsibility, ResponsibilityOptions, RunOptions, SubsetOptions, SufficientSubset)
from .attr.options import criterion_threshold
from .methods import choice
from .methods.responsibility import ResponsibilityMap
from .methods.results import SISResult
from .runtime import runinfo
from .runtime.estimate import Estimate
from .runtime.inputs import check_feature_map, default_feature_map
from .runtime.renames import renamed_keywords

METHODS = {"exact": ExactSIS, "gradient": GradientSIS, "responsibility": MinimalPixelSet}
_R, _O, _S = RunOptions, ResponsibilityOptions, SubsetOptions  # the defaults' single source
OLD_NAMES = DATA_RENAMES  # fast_sis's keywords before it took Captum's names (a FutureWarning for one release)


def _data(images, target, baselines, feature_mask, show_progress, additional_forward_args=None) -> Data:
    """The function forms' data-side arguments as the classes' (:func:`~overinterp_fast.attr._base.captum_data`:
    the same checks and forms; error messages call the inputs ``images``)."""
    return captum_data(images, baselines, target, additional_forward_args, feature_mask, show_progress, "images")


def _auto_method(model, images, feature_mask) -> str:
    """What method="auto" runs on these inputs (:func:`overinterp_fast.methods.choice.resolve_method`, the
    audits' rule): their number of features, and whether the model has gradients. Inputs the run will refuse
    resolve to "exact", whose checks then name what is wrong."""
    if not isinstance(images, torch.Tensor) or images.dim() < 2:
        return "exact"
    shape = tuple(images.shape[1:])
    try:
        p = (check_feature_map(feature_mask, shape)[1] if feature_mask is not None
             else math.prod(default_feature_map(shape)[1]))
    except (TypeError, ValueError):
        return "exact"
    pixels = feature_mask is None and images.dim() == 4
    return choice.resolve_method("auto", p, [model], pixels=pixels)


@renamed_keywords(**OLD_NAMES)
def fast_sis(
    model: torch.nn.Module | Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    threshold: float | list[float] | torch.Tensor | None = None,
    *,
    method: str = "exact",
    target: int | torch.Tensor | None = None,
    baselines: float | torch.Tensor | None = None,
    additional_forward_args: object = None,
    feature_mask: torch.Tensor | None = None,
    collection: bool = _R.collection,
    batch_size: int | None = _R.batch_size,
    outputs: str = _R.outputs,
    show_progress: bool | None = None,
    engine: str = _R.engine,
    options: ExactOptions | GradientOptions | MinimalPixelSetOptions | None = None,
) -> list[SISResult]:
    """Sufficient Input Subsets of every image (docs: algorithms.md, Exact SIS and Batched-gradient SIS).

    Args:
        model: ``torch.nn.Module`` (in eval mode) or callable mapping [B, *D] to logits [B, K]; a list of models
            is an ensemble (mean of logits); for the black-box methods also an ``.onnx`` path, an
            ``onnxruntime.InferenceSession`` or an :class:`~overinterp_fast.OnnxModel`. A TorchScript,
            ``torch.export`` or ``torch.save`` file is loaded first, with
            ``overinterp_fast.zoo.models.load_model(path).model`` (its path alone is refused in one line).
        images: [N, *D] floating tensor ([N, C, H, W] for images), normalized as the model expects. Computation
            runs in its dtype and on its device; channels_last is kept for the candidate batches. One tensor:
            several input tensors (Captum's tuple of inputs) are refused; pass the others as
            ``additional_forward_args``.
        threshold: tau in [0, 1]: the SIS keeps f >= tau. A number, or one per image (a sequence or [N]); None:
            0.9. With method="responsibility" it is the tau of ``MinimalPixelSetOptions(criterion="threshold")``;
            with that method's default criterion, "top1" (sets that restore the top-1 class), a threshold given
            is refused with one line (it would be ignored).
        method: "exact" (:class:`~overinterp_fast.attr.ExactSIS`: backward selection over every feature),
            "gradient" (:class:`~overinterp_fast.attr.GradientSIS`: batched-gradient SIS for large images; needs
            a torch model), "responsibility" (:class:`~overinterp_fast.attr.MinimalPixelSet`: minimal pixel
            sets from ReX's responsibility maps; black box) or "auto": exact SIS up to 1,024 features, else
            gradient SIS for a torch model, else minimal pixel sets (the audits' rule,
            :func:`~overinterp_fast.methods.choice.resolve_method`; the choice is in each result's ``info``).
        target: class whose probability is f; None = the class predicted on the unmasked image. An int, or one
            per image (int64 [N]).
        baselines: what masked elements become: None (0), a number, one value per channel ([C]), or a
            baseline tensor ([*D], [1, *D] or [N, *D]).
        additional_forward_args: passed to the model after the images, ``model(x, *args)``, as Captum passes them
            (and as the classes' ``find_sis``): None (nothing), one argument or a tuple. A tensor holds one row per
            image ([N, ...]): each image's row is expanded to the rows of its candidate batches, and the images
            then run one at a time; anything else is passed as it is. A torch model or a callable only (not an
            ONNX model or a list of models).
        feature_mask: None = one feature per pixel across channels ([C, H, W] inputs; id = row * W + col) or per
            element (other shapes); or an integer feature map broadcastable to [*D] (or [1, *D], or [N, *D] when
            it is the same for every image) with ids 0..p-1.
        collection: also find every further disjoint SIS (``SISResult.collection``).
        batch_size: candidates per forward call (None: chosen by a short timed calibration).
        outputs: "logits" (f = softmax probability) or "probabilities".
        show_progress: show a progress bar (None: only on a terminal).
        engine: what scores the candidates: "auto", "torch", "onnxruntime" or "compile"; every SIS is checked on
            the user's model (method="gradient": "auto" or "torch").
        options: the method's options object (:class:`~overinterp_fast.attr.options.ExactOptions`,
            :class:`~overinterp_fast.attr.options.GradientOptions` or
            :class:`~overinterp_fast.attr.options.MinimalPixelSetOptions`); None: its defaults. With
            method="auto", the options of the method it resolves to (or None).

    Returns:
        One :class:`SISResult` per image (tensors on the CPU). Images with f(x) < threshold get ``sis=None``
        (their ``order``/``values`` are still computed).

    The keywords ``mask_value``, ``features`` and ``progress`` (the names before ``baselines``,
    ``feature_mask`` and ``show_progress``) still work, with a FutureWarning.
    """
    with runinfo.collecting():  # the choice of "auto" is part of the run's info
        d = _data(images, target, baselines, feature_mask, show_progress, additional_forward_args)
        job = _method_job(model, d, threshold, method, collection, batch_size, outputs, engine, options)
        return job._results(d)


def _method_job(model, d: Data, threshold, method: str, collection: bool, batch_size, outputs: str, engine: str,
                options):
    """The method's object that :func:`fast_sis` (and :func:`estimate_sis`) runs on the checked data ``d``:
    "auto" resolved, ``options`` checked against the method, a threshold given with a top-1 criterion refused."""
    if method != "auto" and method not in METHODS:
        raise ValueError(f"method must be one of {('auto', *METHODS)}, got {method!r}")
    if method == "auto":
        method = _auto_method(model, d.images, d.features)
    cls = METHODS[method]
    if options is not None and not isinstance(options, cls.options_class):
        raise ValueError(f"options for method={method!r} must be {cls.options_class.__name__} (or None), got "
                         f"{type(options).__name__}")
    name = f'method="{method}"'
    criterion = getattr(cls.options_class() if options is None else options, "criterion", None)
    switch = f"options={cls.options_class.__name__}(criterion='threshold')"
    run = RunOptions(criterion_threshold(threshold, criterion, name, switch), outputs, engine, batch_size, collection)
    return cls.from_options(model, run, options, name=name)


@renamed_keywords(**OLD_NAMES)
def estimate_sis(
    model: torch.nn.Module | Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    threshold: float | list[float] | torch.Tensor = _R.threshold,
    *,
    method: str = "exact",
    target: int | torch.Tensor | None = None,
    baselines: float | torch.Tensor | None = None,
    feature_mask: torch.Tensor | None = None,
    collection: bool = _R.collection,
    batch_size: int | None = _R.batch_size,
    outputs: str = _R.outputs,
    engine: str = _R.engine,
    options: ExactOptions | GradientOptions | MinimalPixelSetOptions | None = None,
) -> "Estimate":
    """How long :func:`fast_sis` with the same arguments would take, without running it (docs: guides/formats.md,
    Estimates): an :class:`~overinterp_fast.runtime.estimate.Estimate` (the rows it computes, the seconds on this
    device, ``.line()``), with the engine, path and batch size chosen as the call would choose them and one call at
    that batch size timed where nothing was measured, however short the job. The model runs on the images once
    (their predictions) and on a few timed batches of candidates. ``show_progress`` aside, the arguments are
    :func:`fast_sis`'s.
    """
    with runinfo.collecting():
        d = _data(images, target, baselines, feature_mask, False)
        job = _method_job(model, d, threshold, method, collection, batch_size, outputs, engine, options)
        return job._estimate_only(d)


@renamed_keywords(mask_value="baselines", progress="show_progress")
def responsibility(
    model,
    images: torch.Tensor,
    *,
    iterations: int = _O.iterations,
    seed: int = _O.seed,
    depth: int = _O.depth,
    min_box: int = _O.min_box,
    criterion: str = _O.criterion,
    monotone: bool | None = _O.monotone,
    target: int | torch.Tensor | None = None,
    baselines: float | torch.Tensor | None = None,
    threshold: float | list[float] | torch.Tensor | None = None,
    outputs: str = _R.outputs,
    batch_size: int | None = _R.batch_size,
    show_progress: bool | None = None,
    engine: str = _R.engine,
) -> list[ResponsibilityMap]:
    """Causal responsibility maps (ReX's algorithm; docs: algorithms.md, Causal responsibility and minimal pixel
    sets): the function form of :class:`~overinterp_fast.attr.Responsibility`. Black box.

    Args:
        model: torch model, callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or :class:`OnnxModel`.
        images: [N, C, H, W], normalized as the model expects.
        iterations, seed, depth, min_box, criterion, monotone:
            :class:`~overinterp_fast.attr.options.ResponsibilityOptions` (ReX-faithful: ``iterations=20``).
        target, baselines, threshold, outputs, batch_size, show_progress, engine: as :func:`fast_sis`.

    Returns:
        One :class:`ResponsibilityMap` per image: ``map`` float64 [H, W] (the sum over iterations of
        log(per-iteration map); rank pixels by it) and the ``queries`` used.
    """
    options = ResponsibilityOptions(iterations, seed, depth, min_box, criterion, monotone)
    run = RunOptions(criterion_threshold(threshold, criterion, "responsibility"), outputs, engine, batch_size)
    maps = Responsibility.from_options(model, run, options, name="responsibility")
    return maps._results(_data(images, target, baselines, None, show_progress))


@renamed_keywords(mask_value="baselines", features="feature_mask")
def sufficient_subset(
    model,
    images: torch.Tensor,
    ranking: torch.Tensor,
    threshold: float | list[float] | torch.Tensor | None = None,
    *,
    criterion: str = _S.criterion,
    step: int = _S.step,
    refine: bool | str = _S.refine,
    refine_budget: int | str | None = _S.refine_budget,
    target: int | torch.Tensor | None = None,
    baselines: float | torch.Tensor | None = None,
    feature_mask: torch.Tensor | None = None,
    outputs: str = _R.outputs,
    batch_size: int | None = _R.batch_size,
    engine: str = _R.engine,
) -> list[SISResult]:
    """Turn any ranking into a sufficient set (batched FindSIS; docs: algorithms.md, Sufficient subsets of a
    ranking): the function form of :class:`~overinterp_fast.attr.SufficientSubset`.

    Args:
        model, images, threshold, target, baselines, feature_mask, outputs, batch_size, engine: as :func:`fast_sis`.
        ranking: scores per feature, higher = kept first: [N, p], [N, *grid], or an attribution of the images'
            shape [N, *D], reduced to the sum over each feature's elements.
        criterion, step, refine, refine_budget: :class:`~overinterp_fast.attr.options.SubsetOptions`.

    Returns:
        One :class:`SISResult` per image: ``order`` the features by descending score, ``values`` their scores,
        ``sis`` the set (None if even all features fail), ``sis_score`` = f on it.
    """
    options = SubsetOptions(criterion, step, refine, refine_budget)
    run = RunOptions(criterion_threshold(threshold, criterion, "sufficient_subset"), outputs, engine, batch_size)
    subset = SufficientSubset.from_options(model, run, options)
    return subset._results(_data(images, target, baselines, feature_mask, False), ranking)
