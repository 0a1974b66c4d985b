"""overinterp_fast: fast Sufficient Input Subsets (SIS) for catching classifiers that overinterpret.

    import overinterp_fast as of
    res = of.fast_sis(model, images, threshold=0.9)
    res[0].sis, res[0].order, res[0].values, res[0].mask

    sis = of.ExactSIS(model, threshold=0.9)          # Captum-shaped: .find_sis(inputs), .attribute(inputs)
    of.sis_table(res); of.sis_frame(res)             # one row per image: pyarrow.Table, pandas.DataFrame
    of.save_masks("masks.npz", res); of.plot_sis(res[0], images[0])

The layers, from the bottom: :mod:`.ops` (kernels and their pure-PyTorch versions), :mod:`.runtime`
(inputs, the model wrapper, ONNX Runtime, engines, batch sizes), :mod:`.methods` (the algorithms),
then the public API (this module and :mod:`.attr`), :mod:`.audit`, :mod:`.text` and :mod:`.cli`.
"""
import logging

from . import errors, ops
from .errors import ConfigMismatch, FolderLocked, Interrupted, MissingDependency, StorageFault
from .ops import ops_info
from .api import estimate_sis, fast_sis, responsibility, sufficient_subset
from .attr import (ExactOptions, ExactSIS, GradientOptions, GradientSIS, MinimalPixelSet, MinimalPixelSetOptions,
                   Responsibility, ResponsibilityOptions, SubsetOptions, SufficientSubset)
from .methods import reference
from .methods.findsis import find_sis
from .methods.results import SISResult
from .methods.results_io import load_masks, save_masks, sis_frame, sis_table
from .runtime.model import Ensemble
from .runtime.onnx import OnnxModel, export_onnx
from . import text
from .text import input_reduction

__all__ = ["fast_sis", "estimate_sis", "responsibility", "sufficient_subset", "find_sis", "Ensemble", "OnnxModel",
           "export_onnx", "SISResult", "ops", "ops_info", "reference", "text", "input_reduction", "ExactSIS", "GradientSIS",
           "Responsibility", "MinimalPixelSet", "SufficientSubset", "ExactOptions", "GradientOptions",
           "ResponsibilityOptions", "MinimalPixelSetOptions", "SubsetOptions",
           "errors", "FolderLocked", "ConfigMismatch", "StorageFault", "MissingDependency", "Interrupted"]
__all__ += ["sis_table", "sis_frame", "save_masks", "load_masks", "plot_sis"]
__version__ = "0.1.0"

# Library logging: every module logs to logging.getLogger(__name__), under this package's logger; nothing is shown
# unless the application configures logging (the command line does: -v, --log-level). docs: conventions.md.
logging.getLogger(__name__).addHandler(logging.NullHandler())

def __getattr__(name: str):
    """``plot_sis`` on first use (matplotlib and the audit package load only then)."""
    if name == "plot_sis":
        from .audit.plotting import plot_sis

        return plot_sis
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
