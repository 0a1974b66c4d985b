"""Captum-shaped classes: built from the model and the method's options, called with the data.

    from overinterp_fast.attr import ExactSIS, SufficientSubset
    sis = ExactSIS(model, threshold=0.9)
    results = sis.find_sis(images)                                 # list[SISResult]
    results = sis.find_sis(images, 0.0, 3)                         # Captum's order: baselines 0.0, target 3
    scores = sis.attribute(images, baselines=0.0, target=labels)   # images' shape and dtype

Every class takes the data-side arguments in Captum's names and in the positional order of Captum's perturbation
methods (``FeatureAblation.attribute(inputs, baselines=None, target=None, additional_forward_args=None,
feature_mask=None, ...)``): ``inputs`` [N, *D], one tensor (below); ``baselines`` (None = 0, a number, per channel [C], or a tensor
[*D], [1, *D], [N, *D]); ``target`` (None, an int, or one per example); ``additional_forward_args`` (passed to the
model after the inputs, ``model(x, *args)``: one argument or a tuple; a tensor holds one row per example, [N, ...],
and the examples then run one at a time; torch models and callables only, an ONNX model is refused in one line);
``feature_mask`` (None = pixels, or an integer map broadcastable to [*D], ids 0..p-1); ``show_progress`` by
keyword. :class:`SufficientSubset` takes its ``ranking`` after ``inputs``, then the same.

**One input tensor.** Captum also takes a tuple of input tensors (a model with several inputs); these classes do
not: a tuple or list of inputs (and a tuple of baselines or feature masks) is refused with a one-line TypeError
that says what to do instead. Give the tensor to explain as ``inputs`` and the others as
``additional_forward_args`` (passed to the model, never masked), or concatenate them into one tensor that a
wrapper of the model splits (the features then span both).

**The order before.** Up to overinterp_fast 0.1 the target came second (``find_sis(inputs, target, baselines,
feature_mask)``). A call written in that order never silently means something else now: an integer in the second
place (a target then, a baseline now) is refused with a one-line TypeError that says to give ``target=`` (or
``baselines=``) by keyword; ``find_sis(inputs, None, 3)`` (an integer baseline then, a target now) and an integer
tensor in the fourth place (the feature_mask then, ``additional_forward_args`` now) run Captum's meaning with a
FutureWarning. Keywords are unaffected. The keywords' names before (``mask_value``, ``features``, ``progress``)
work with a FutureWarning, as in :func:`overinterp_fast.fast_sis`.

Every result carries the run's ``info``: what the run decided and why (a speed path that stepped aside for this
model, the estimate; docs: guides/formats.md). The options of each method are in
:mod:`overinterp_fast.attr.options` (the single source of their defaults).
"""
from .exact import ExactSIS
from .gradient import GradientSIS
from .minimal import MinimalPixelSet
from .options import (ExactOptions, GradientOptions, MinimalPixelSetOptions, ResponsibilityOptions, RunOptions,
                      SubsetOptions)
from .responsibility import Responsibility
from .subset import SufficientSubset

__all__ = ["ExactSIS", "GradientSIS", "Responsibility", "MinimalPixelSet", "SufficientSubset", "ExactOptions",
           "GradientOptions", "ResponsibilityOptions", "MinimalPixelSetOptions", "SubsetOptions", "RunOptions"]
