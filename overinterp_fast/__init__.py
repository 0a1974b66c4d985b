"""overinterp_fast: fast Sufficient Input Subsets (SIS) for catching classifiers that overinterpret.

    import overinterp_fast as of
    res = of.fast_sis(model, images, threshold=0.9)
    res[0].sis, res[0].order, res[0].values, res[0].mask

    sis = of.ExactSIS(model, threshold=0.9)          # Captum-shaped: .find_sis(inputs), .attribute(inputs)

The layers, from the bottom: :mod:`.ops` (kernels and their pure-PyTorch versions), :mod:`.runtime`
(inputs, the model wrapper, ONNX Runtime, engines, batch sizes), :mod:`.methods` (the algorithms),
then the public API (this module and :mod:`.attr`), :mod:`.audit`, :mod:`.text` and :mod:`.cli`.
"""
from . import errors, ops
from .errors import ConfigMismatch, FolderLocked, MissingDependency, StorageFault
from .ops import ops_info
from .api import fast_sis, responsibility, sufficient_subset
from .attr import (ExactOptions, ExactSIS, GradientOptions, GradientSIS, MinimalPixelSet, MinimalPixelSetOptions,
                   Responsibility, ResponsibilityOptions, SubsetOptions, SufficientSubset)
from .methods import reference
from .methods.findsis import find_sis
from .methods.results import SISResult
from .runtime.model import Ensemble
from .runtime.onnx import OnnxModel, export_onnx
from . import text
from .text import input_reduction

__all__ = ["fast_sis", "responsibility", "sufficient_subset", "find_sis", "Ensemble", "OnnxModel", "export_onnx",
           "SISResult", "ops", "ops_info", "reference", "text", "input_reduction", "ExactSIS", "GradientSIS",
           "Responsibility", "MinimalPixelSet", "SufficientSubset", "ExactOptions", "GradientOptions",
           "ResponsibilityOptions", "MinimalPixelSetOptions", "SubsetOptions",
           "errors", "FolderLocked", "ConfigMismatch", "StorageFault", "MissingDependency"]
__version__ = "0.1.0"
