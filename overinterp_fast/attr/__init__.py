"""Captum-shaped classes: built from the model and the method's options, called with the data.

    from overinterp_fast.attr import ExactSIS, SufficientSubset
    sis = ExactSIS(model, threshold=0.9)
    results = sis.find_sis(images, target=None, baselines=None, feature_mask=None)   # list[SISResult]
    scores = sis.attribute(images)                                                    # images' shape and dtype

Every class takes ``inputs`` [N, *D], ``target`` (None, an int, or one per example), ``baselines`` (None = 0, a
number, per channel [C], or a tensor [*D], [1, *D], [N, *D]) and ``feature_mask`` (None = pixels, or an integer
map broadcastable to [*D], ids 0..p-1) in Captum's forms. The options of each method are in
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
