"""overinterp_fast: fast Sufficient Input Subsets (SIS) for catching classifiers that overinterpret.

    import overinterp_fast as of
    res = of.fast_sis(model, images, threshold=0.9)
    res[0].sis, res[0].order, res[0].values, res[0].mask

See README.md and SPEC.md for the algorithms and their exact semantics.
"""
from . import _ops as ops
from . import ops_torch
from ._ops import ops_info
from . import reference
from .api import fast_sis, responsibility, sufficient_subset
from .findsis import find_sis
from .model import Ensemble
from .onnx_backend import OnnxModel, export_onnx
from .results import SISResult
from . import text
from .text import input_reduction

__all__ = ["fast_sis", "responsibility", "sufficient_subset", "find_sis", "Ensemble", "OnnxModel", "export_onnx", "SISResult", "ops", "ops_info", "ops_torch", "reference", "text", "input_reduction"]
__version__ = "0.1.0"
