"""``method="auto"``: the method a job runs, from its number of features and its models; one rule for
:func:`overinterp_fast.fast_sis` and the audits (docs: guides/formats.md).

Exact SIS up to :data:`AUTO_EXACT_FEATURES` features (it checks every candidate: the definition), else
batched-gradient SIS where every model has gradients (:func:`has_gradients`), else minimal pixel sets
("responsibility", black box) for images with pixel features, else exact SIS.
"""
from __future__ import annotations

import logging
import os
from typing import Sequence

from ..runtime import runinfo
from ..runtime.model import Ensemble
from ..runtime.onnx import OnnxModel

logger = logging.getLogger(__name__)
AUTO_EXACT_FEATURES = 1024  # method="auto": exact SIS up to this many features (32 x 32 pixels, CIFAR)
METHODS = ("exact", "gradient", "responsibility")  # what "auto" resolves to


def has_gradients(model) -> bool:
    """Whether ``model`` is a torch model (or callable) that gradients flow through: not an ONNX model (a path,
    an ``onnxruntime.InferenceSession`` or an OnnxModel), nor an ensemble (or list) holding one."""
    if isinstance(model, (list, tuple)):
        return all(has_gradients(m) for m in model)
    if isinstance(model, Ensemble):
        return all(has_gradients(m) for m in model._callables)
    if isinstance(model, (str, os.PathLike, OnnxModel)):
        return False
    return type(model).__name__ != "InferenceSession"


def resolve_method(method: str, features: int, models: Sequence[object] = (), pixels: bool = True) -> str:
    """The method to run: ``method`` itself, or for "auto" the one that fits ``features`` features and
    ``models`` (see the module docstring; ``pixels``: the features are the pixels of images [N, C, H, W], which
    minimal pixel sets need). The choice and its reason are logged (INFO) and noted in the run's info."""
    if method != "auto":
        return method
    if features <= AUTO_EXACT_FEATURES:
        chosen, why = "exact", f"at most {AUTO_EXACT_FEATURES}"
    elif all(has_gradients(m) for m in models):
        chosen, why = "gradient", f"more than {AUTO_EXACT_FEATURES}"
    elif pixels:
        chosen, why = "responsibility", f"more than {AUTO_EXACT_FEATURES}, and a model without gradients"
    else:
        chosen, why = "exact", f"more than {AUTO_EXACT_FEATURES}, but no gradients and no pixel features"
    logger.info("method 'auto' runs %r: %d features (%s)", chosen, features, why)
    runinfo.note("method", f"{chosen} (auto: {features} features, {why})")
    return chosen
