"""What every :mod:`overinterp_fast.attr` class shares: Captum's argument forms turned into the runtime's, and
results turned into attributions of the inputs' shape."""
from __future__ import annotations

from numbers import Integral, Real
from typing import ClassVar

import torch

from ..methods.results import SISResult
from ..runtime.inputs import check_feature_map, default_feature_map
from ..runtime import job
from ..runtime.job import check_flag
from .options import RunOptions


def check_inputs(inputs) -> None:
    """inputs: one tensor [N, *D] (Captum's tuples of inputs are refused with a one-line error)."""
    if isinstance(inputs, (tuple, list)):
        raise TypeError("inputs must be one tensor [N, *D]; tuples of inputs (several input tensors) are not "
                        "supported")


def captum_target(target):
    """Captum's ``target`` as the runtime takes it: None (the predicted class), an int, or one int per example (a
    list of ints or an integer tensor [N]). A tuple (Captum's index into a multi-dimensional output) is refused."""
    if isinstance(target, tuple):
        raise ValueError(f"target must be None, an int, or one int per example (a list or an int64 tensor [N]); "
                         f"tuple targets (indices into a multi-dimensional output) are not supported, got {target!r}")
    if isinstance(target, list):
        if not all(isinstance(t, Integral) and not isinstance(t, bool) for t in target):
            raise ValueError(f"target must be None, an int, or one int per example (a list or an int64 tensor "
                             f"[N]), got {target!r}")
        return torch.tensor(target, dtype=torch.int64)
    return target


def captum_baselines(baselines):
    """Captum's ``baselines`` as the runtime's ``mask_value``: None is 0; a number, a per-channel tensor [C] or a
    tensor [*D], [1, *D] or [N, *D] as they are (checked when the job is prepared)."""
    if baselines is None:
        return 0.0
    if isinstance(baselines, (tuple, list)):
        raise TypeError("baselines must be None, a number or one tensor; tuples of baselines (several input "
                        "tensors) are not supported")
    return baselines


def captum_feature_mask(feature_mask, inputs: torch.Tensor):
    """Captum's ``feature_mask`` as the runtime's ``features``: None (pixels), or an integer map broadcastable to
    [*D], or [N, *D] when it is the same for every example (the runtime takes one map for the batch)."""
    if isinstance(feature_mask, (tuple, list)):
        raise TypeError("feature_mask must be None or one integer tensor; tuples of masks (several input "
                        "tensors) are not supported")
    if not isinstance(feature_mask, torch.Tensor) or not isinstance(inputs, torch.Tensor):
        return feature_mask  # None, or a wrong type the runtime's check names
    if feature_mask.dim() == inputs.dim() and feature_mask.shape[0] > 1:
        if not bool((feature_mask == feature_mask[:1]).all()):
            raise ValueError("feature_mask must be the same for every example (one map [*D] or [1, *D] for the "
                             "batch); per-example feature masks are not supported")
        return feature_mask[0]
    return feature_mask


def check_show_progress(show_progress) -> bool:
    """show_progress: True or False."""
    check_flag("show_progress", show_progress, none=False)
    return show_progress


def element_features(inputs: torch.Tensor, features) -> torch.Tensor:
    """The feature id of every element of one example: int64 [*D] on the inputs' device (``features`` None: the
    default pixels, one per pixel across channels for [C, H, W] examples, else one per element)."""
    shape = tuple(inputs.shape[1:])
    fm = default_feature_map(shape)[0] if features is None else check_feature_map(features, shape)[0]
    return fm.to(inputs.device)


def spread(per_feature: torch.Tensor, inputs: torch.Tensor, fm: torch.Tensor) -> torch.Tensor:
    """Feature scores [N, p] spread over the inputs by the feature map ``fm`` (int64 [*D],
    :func:`element_features`): every element carries its feature's score; a tensor of the inputs' shape [N, *D]
    and dtype."""
    per_feature = per_feature.to(inputs.device)
    return per_feature[:, fm.reshape(-1)].reshape(inputs.shape).to(inputs.dtype)


def order_scores(results: list[SISResult], p: int, masking_order: bool) -> torch.Tensor:
    """An order per image as scores, float64 [N, p]: sorting the scores, descending, gives the order back.

    ``masking_order`` True (backward selection): feature ``order[t - 1]`` (the t-th masked) scores t, so the last
    masked ranks first. False (a ranking, most important first): ``order[j]`` scores m - j (m = ``len(order)``).
    Features not in the order score 0."""
    out = torch.zeros(len(results), p, dtype=torch.float64)
    for i, r in enumerate(results):
        m = r.order.numel()
        steps = torch.arange(1, m + 1, dtype=torch.float64)
        out[i, r.order.cpu()] = steps if masking_order else steps.flip(0)
    return out


class SISAttribution:
    """Base of the classes: a model and its options; the data-side arguments in Captum's names.

    Attributes:
        forward_func: the model: a torch module or callable [B, *D] -> [B, K], an ``.onnx`` path, an
            ``onnxruntime.InferenceSession`` or an OnnxModel.
        run: the :class:`~overinterp_fast.attr.options.RunOptions` (threshold, outputs, engine, ...).
        options: the method's options object.
    """

    options_class: ClassVar[type]
    name: str  # what error messages call the caller (the class, or fast_sis's method=...)

    def __init__(self, forward_func, run: RunOptions, options) -> None:
        self.forward_func, self.run, self.options = forward_func, run, options
        self.name = type(self).__name__
        self._check()

    @classmethod
    def from_options(cls, forward_func, run: RunOptions, options=None, name: str | None = None):
        """The class built from options objects (``options`` None: the defaults); ``name``: what error messages
        call the caller (None: the class name)."""
        options = cls.options_class() if options is None else options
        if not isinstance(options, cls.options_class):
            raise ValueError(f"options of {cls.__name__} must be {cls.options_class.__name__}, got "
                             f"{type(options).__name__}")
        obj = cls.__new__(cls)
        SISAttribution.__init__(obj, forward_func, run, options)
        obj.name = name or cls.__name__
        return obj

    def _check(self) -> None:
        """Checks between the run options and the method's (none by default)."""

    def _setup(self, images, features, mask_value, method: str) -> "job.Setup":
        """The validated job (:func:`overinterp_fast.runtime.job.setup`) of ``images`` with this object's run
        options; ``method`` names what the inputs are checked for ("exact" for any black-box forward job)."""
        run = self.run
        return job.setup(self.forward_func, images, run.threshold, features, mask_value, run.outputs,
                         run.batch_size, method)

    def _captum(self, inputs, target, baselines, feature_mask, show_progress) -> tuple:
        """Captum's data-side arguments as the runtime's: (target, mask_value, features, progress)."""
        check_inputs(inputs)
        return (captum_target(target), captum_baselines(baselines), captum_feature_mask(feature_mask, inputs),
                check_show_progress(show_progress))


class SetAttribution(SISAttribution):
    """Base of the classes that find one sufficient set per example by ranking the features: ExactSIS,
    GradientSIS and MinimalPixelSet. Subclasses implement ``_run(images, target, mask_value, features,
    progress) -> list[SISResult]`` (the runtime's argument forms) and say whether their ``order`` is a masking
    order (``masking_order``)."""

    masking_order: ClassVar[bool] = True

    def _run(self, images, target, mask_value, features, progress) -> list[SISResult]:
        raise NotImplementedError

    def find_sis(self, inputs: torch.Tensor, target=None, baselines=None, feature_mask=None, *,
                 show_progress: bool = False) -> list[SISResult]:
        """One sufficient set per example.

        Args:
            inputs: [N, *D] floating tensor ([N, C, H, W] for images), normalized as the model expects.
            target: None (the predicted class), an int, or one per example (a list of ints or int64 [N]).
            baselines: what masked elements become: None (0), a number, per channel [C], or a tensor [*D],
                [1, *D] or [N, *D].
            feature_mask: None (one feature per pixel across channels for [N, C, H, W], else per element) or an
                integer map broadcastable to [*D] (or [N, *D], the same for every example), ids 0..p-1.
            show_progress: show a progress bar.

        Returns:
            One :class:`~overinterp_fast.SISResult` per example (tensors on the CPU).
        """
        return self._run(inputs, *self._captum(inputs, target, baselines, feature_mask, show_progress))

    def attribute(self, inputs: torch.Tensor, target=None, baselines=None, feature_mask=None, *,
                  show_progress: bool = False) -> torch.Tensor:
        """The ranking as scores, a tensor of ``inputs``' shape [N, *D] and dtype: sorting a feature's scores,
        descending, gives ``find_sis``'s order (see the class); every element carries its feature's score;
        features never ranked score 0. The arguments are :meth:`find_sis`'s. (Scores count up to the number of
        features: a float16 or bfloat16 input rounds them above 2048 or 256.)"""
        target, mask_value, features, progress = self._captum(inputs, target, baselines, feature_mask, show_progress)
        results = self._run(inputs, target, mask_value, features, progress)
        fm = element_features(inputs, features)
        return spread(order_scores(results, int(fm.max()) + 1, self.masking_order), inputs, fm)
