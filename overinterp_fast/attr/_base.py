"""What every :mod:`overinterp_fast.attr` class shares: Captum's argument forms and positional order turned into
the runtime's, per-example ``additional_forward_args``, the run's info, and results turned into attributions of
the inputs' shape.

The data-side arguments follow Captum's perturbation methods (``FeatureAblation.attribute(inputs, baselines=None,
target=None, additional_forward_args=None, feature_mask=None, ...)``). Before this order the target came second;
a call written in that order that would now mean something else is refused (an integer second argument: it was a
target) or warned (docs: api/attr.md, The order before).
"""
from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass, replace
from numbers import Integral
from typing import Callable, ClassVar

import torch

from ..methods.results import RunInfo, SISResult
from ..runtime import job, runinfo
from ..runtime.inputs import check_feature_map, check_threshold, default_feature_map
from ..runtime.job import check_flag
from ..runtime.model import ExtraArgs, is_onnx
from ..runtime.renames import REMOVED_IN, moved_keywords
from .options import RunOptions

# the data-side keywords' names before they took Captum's (accepted with a FutureWarning for one release)
DATA_RENAMES = {"mask_value": "baselines", "features": "feature_mask", "progress": "show_progress"}
CAPTUM_ORDER = "inputs, baselines, target, additional_forward_args, feature_mask"


def check_inputs(inputs, name: str = "inputs") -> None:
    """inputs: one tensor [N, *D]. Captum's tuples of inputs (a tuple or list of tensors) are refused with a
    one-line TypeError that says what to do instead (anything else that is no tensor is named where the inputs are
    checked); ``name``: what the message calls the argument."""
    if isinstance(inputs, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError(f"{name} must be one tensor [N, *D]: multiple input tensors (a {type(inputs).__name__} of "
                        f"{len(inputs)}) are not supported; give the one tensor to explain as {name} and the others "
                        f"as additional_forward_args (passed to the model, never masked), or concatenate them into "
                        f"one tensor that a wrapper of the model splits")


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
    if (isinstance(target, float) or (isinstance(target, torch.Tensor) and target.is_floating_point())):
        shown = target if isinstance(target, float) else f"a {target.dtype} tensor"
        raise TypeError(f"target must be None, an int, or one int per example (a list or an int64 tensor [N]), got "
                        f"{shown} (positional arguments follow Captum: {CAPTUM_ORDER})")
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


def captum_forward_args(args, inputs) -> tuple:
    """Captum's ``additional_forward_args`` as a tuple passed to the model after the inputs: None is (); a tuple
    as it is; anything else one argument. A tensor among them holds one value per example (first dimension N,
    the inputs' batch), as Captum requires."""
    if args is None:
        return ()
    args = args if isinstance(args, tuple) else (args,)
    n = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() >= 1 else None
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and n is not None and (a.dim() == 0 or a.shape[0] != n):
            raise ValueError(f"additional_forward_args[{i}] of shape {tuple(a.shape)} must have one row per example "
                             f"(first dimension {n}, as the inputs'), as Captum takes them")
    return args


def _integral(value) -> bool:
    """An int (not a bool), an integer tensor, or a list of ints: what a target is."""
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    if isinstance(value, list):
        return bool(value) and all(_integral(v) for v in value)
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_positional_order(where: str, args: tuple, kwargs: dict) -> None:
    """Positional data-side arguments (after ``inputs``, and after ``ranking`` for SufficientSubset) are Captum's:
    baselines, target, additional_forward_args, feature_mask. The order before took the target first; where a
    call written in that order would now mean something else:

    - an integer second argument (a target before; a baseline now) is refused: give ``target=`` by keyword (or a
      float baseline, ``3.0``);
    - ``(inputs, None, integer)`` (a default target and an integer baseline before; a target now) warns (a list
      of ints was no baseline: no warning);
    - an integer tensor in the fourth place (the feature_mask before; additional_forward_args now) warns, unless
      feature_mask is given by keyword.
    """
    if args and _integral(args[0]):
        raise TypeError(f"{where}: the argument after the inputs is baselines, as in Captum ({CAPTUM_ORDER}); an "
                        f"integer there was the target before overinterp_fast {REMOVED_IN}: give target= by "
                        f"keyword (or baselines= by keyword, or a float baseline)")
    if len(args) >= 2 and args[0] is None and _integral(args[1]) and not isinstance(args[1], list):
        warnings.warn(f"{where}: the third positional argument is the target, as in Captum ({CAPTUM_ORDER}); "
                      f"before overinterp_fast {REMOVED_IN} it was baselines: give target= or baselines= by keyword",
                      FutureWarning, stacklevel=3)
    if len(args) >= 3 and isinstance(args[2], torch.Tensor) and _integral(args[2]) and "feature_mask" not in kwargs:
        warnings.warn(f"{where}: the fourth positional argument is additional_forward_args, as in Captum "
                      f"({CAPTUM_ORDER}); before overinterp_fast {REMOVED_IN} it was feature_mask: give "
                      f"feature_mask= by keyword", FutureWarning, stacklevel=3)


def captum_call(skip: int = 0) -> Callable:
    """Decorator of the classes' data-side methods: Captum's positional order checked
    (:func:`check_positional_order`, ``skip`` positional arguments after ``inputs`` not data-side: the ranking)
    and the data-side keywords' old names accepted with a FutureWarning (:data:`DATA_RENAMES`), as
    :func:`overinterp_fast.fast_sis` accepts them."""

    def decorate(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters
        renames = {old: new for old, new in DATA_RENAMES.items() if new in params}

        @functools.wraps(fn)
        def wrapper(self, inputs, *args, **kwargs):
            where = f"{type(self).__name__}.{fn.__name__}()"
            if not renames.keys().isdisjoint(kwargs):  # the warning points at the caller's line
                kwargs = moved_keywords(where, kwargs, renames, stacklevel=2)
            check_positional_order(where, args[skip:], kwargs)
            return fn(self, inputs, *args, **kwargs)

        wrapper.renamed_keywords = dict(renames)
        return wrapper

    return decorate


@dataclass(frozen=True)
class Data:
    """One call's data-side arguments in the runtime's forms.

    Attributes:
        images: the inputs [N, *D]. target: None, an int, or int64 [N]. mask_value: the baseline (a number or a
        tensor). features: None or the feature map. progress: show a progress bar (None: on a terminal).
        args: ``additional_forward_args`` as a tuple (tensors [N, ...]). threshold: None (the run's), or this
        call's. example: None, or the position of the one example of a call split per example
        (:meth:`one_example`).
    """

    images: torch.Tensor
    target: object = None
    mask_value: object = 0.0
    features: torch.Tensor | None = None
    progress: bool | None = None
    args: tuple = ()
    threshold: float | None = None
    example: int | None = None

    def per_example(self) -> bool:
        """Whether the call runs example by example: ``args`` hold per-example tensors of more than one example
        (a candidate batch mixes examples, and the model takes one value of each argument per row)."""
        return (any(isinstance(a, torch.Tensor) for a in self.args) and isinstance(self.images, torch.Tensor)
                and self.images.dim() >= 1 and self.images.shape[0] > 1)

    def one_example(self, i: int, threshold: float) -> "Data":
        """The call for example ``i`` alone (its target, baseline, arguments' rows and threshold)."""
        n = self.images.shape[0]

        def row(v):
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n and (
                    v is not self.mask_value or v.dim() == self.images.dim()):
                return v[i:i + 1]
            return v

        return replace(self, images=self.images[i:i + 1], target=row(self.target), mask_value=row(self.mask_value),
                       args=tuple(row(a) for a in self.args), threshold=threshold, example=i)


def captum_data(inputs, baselines, target, additional_forward_args, feature_mask, show_progress,
                name: str = "inputs") -> Data:
    """Captum's data-side arguments as the runtime's (:class:`Data`), checked: what the classes' methods and the
    function forms (:func:`overinterp_fast.fast_sis`, ...) pass to a job; ``name``: what error messages call the
    inputs (the function forms say ``images``)."""
    check_inputs(inputs, name)
    return Data(inputs, captum_target(target), captum_baselines(baselines), captum_feature_mask(feature_mask, inputs),
                show_progress, captum_forward_args(additional_forward_args, inputs))


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
    """Base of the classes: a model and its options; the data-side arguments in Captum's names and order.

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

    def _model(self, args: tuple):
        """The model a job calls: ``forward_func``, or with ``additional_forward_args`` an
        :class:`~overinterp_fast.runtime.model.ExtraArgs` of it (torch models and callables only)."""
        if not args:
            return self.forward_func
        if is_onnx(self.forward_func):
            raise ValueError(f"{self.name}: additional_forward_args need a torch model or a callable; an ONNX model "
                             f"takes the inputs alone")
        if isinstance(self.forward_func, (list, tuple)):
            raise ValueError(f"{self.name}: additional_forward_args are not passed to an ensemble (a list of "
                             f"models); wrap the members in one callable that takes them")
        return ExtraArgs(self.forward_func, args)

    def _setup(self, d: Data, method: str) -> "job.Setup":
        """The validated job (:func:`overinterp_fast.runtime.job.setup`) of the call ``d`` with this object's run
        options; ``method`` names what the inputs are checked for ("exact" for any black-box forward job)."""
        run = self.run
        threshold = run.threshold if d.threshold is None else d.threshold
        return job.setup(self._model(d.args), d.images, threshold, d.features, d.mask_value, run.outputs,
                         run.batch_size, method)

    def _data(self, inputs, baselines, target, additional_forward_args, feature_mask, show_progress) -> Data:
        """Captum's data-side arguments as the runtime's (:func:`captum_data`)."""
        return captum_data(inputs, baselines, target, additional_forward_args, feature_mask, show_progress)

    def _each(self, d: Data, work: Callable[[Data], list]) -> list:
        """``work(d)`` (a list, one entry per example) with the run's info attached to each entry; example by
        example where ``d`` needs it (:meth:`Data.per_example`)."""
        with runinfo.collecting() as info:
            if d.per_example():
                thresholds = check_threshold(self.run.threshold, d.images.shape[0])
                runinfo.note("examples", "one at a time: additional_forward_args hold one value per example")
                out = [r for i, t in enumerate(thresholds) for r in work(d.one_example(i, t))]
            else:
                out = work(d)
        shared = RunInfo(decisions=dict(info))  # the call's info, where the method made none of its own
        for r in out:
            if not hasattr(r, "info"):
                continue
            if isinstance(r.info, RunInfo):  # exact SIS's (one object per call): it takes the decisions too
                r.info.decisions.update(info)
            else:
                r.info = shared
        return out


class SetAttribution(SISAttribution):
    """Base of the classes that find one sufficient set per example by ranking the features: ExactSIS,
    GradientSIS and MinimalPixelSet. Subclasses implement ``_run(d: Data) -> list[SISResult]`` (the runtime's
    argument forms) and say whether their ``order`` is a masking order (``masking_order``)."""

    masking_order: ClassVar[bool] = True

    def _run(self, d: Data) -> list[SISResult]:
        raise NotImplementedError

    def _results(self, d: Data) -> list[SISResult]:
        """:meth:`_run`, example by example where needed, with the run's info (:meth:`SISAttribution._each`)."""
        return self._each(d, self._run)

    def _estimate_only(self, d: Data):
        """The call ``d``'s estimate, without running it (subclasses)."""
        raise NotImplementedError

    def estimate(self, inputs: torch.Tensor, baselines=None, target=None, feature_mask=None):
        """How long :meth:`find_sis` on ``inputs`` would take, without running it: the run's own estimate
        (:class:`~overinterp_fast.runtime.estimate.Estimate`: rows, seconds on this device, its line), with the
        engine, path and batch size chosen as the call would choose them, and one call at that batch size timed
        where nothing was measured (also for a short job). The model runs on the inputs once (the predictions) and
        on a few timed batches. What a stored audit's estimate is made of (:mod:`overinterp_fast.audit.planning`).
        The arguments are :meth:`find_sis`'s."""
        return self._estimate_only(self._data(inputs, baselines, target, None, feature_mask, False))

    @captum_call()
    def find_sis(self, inputs: torch.Tensor, baselines=None, target=None, additional_forward_args=None,
                 feature_mask=None, *, show_progress: bool = False) -> list[SISResult]:
        """One sufficient set per example.

        Args (Captum's names and positional order, as its perturbation methods'):
            inputs: [N, *D] floating tensor ([N, C, H, W] for images), normalized as the model expects.
            baselines: what masked elements become: None (0), a number, per channel [C], or a tensor [*D],
                [1, *D] or [N, *D]. (An integer here, given by position, is refused: it was the target in the
                order before; see the class's module.)
            target: None (the predicted class), an int, or one per example (a list of ints or int64 [N]).
            additional_forward_args: passed to the model after the inputs, ``model(x, *args)``: one argument or a
                tuple; a tensor holds one row per example ([N, ...]; the examples then run one at a time).
                Torch models and callables only.
            feature_mask: None (one feature per pixel across channels for [N, C, H, W], else per element) or an
                integer map broadcastable to [*D] (or [N, *D], the same for every example), ids 0..p-1.
            show_progress: show a progress bar.

        Returns:
            One :class:`~overinterp_fast.SISResult` per example (tensors on the CPU); ``info`` says what the run
            decided and why.

        The keywords ``mask_value``, ``features`` and ``progress`` (the names before) still work, with a
        FutureWarning.
        """
        d = self._data(inputs, baselines, target, additional_forward_args, feature_mask,
                       check_show_progress(show_progress))
        return self._results(d)

    @captum_call()
    def attribute(self, inputs: torch.Tensor, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, *, show_progress: bool = False) -> torch.Tensor:
        """The ranking as scores, a tensor of ``inputs``' shape [N, *D] and dtype: sorting a feature's scores,
        descending, gives ``find_sis``'s order (see the class); every element carries its feature's score;
        features never ranked score 0. The arguments are :meth:`find_sis`'s. (Scores count up to the number of
        features: a float16 or bfloat16 input rounds them above 2048 or 256.)"""
        d = self._data(inputs, baselines, target, additional_forward_args, feature_mask,
                       check_show_progress(show_progress))
        results = self._results(d)
        fm = element_features(inputs, d.features)
        return spread(order_scores(results, int(fm.max()) + 1, self.masking_order), inputs, fm)
