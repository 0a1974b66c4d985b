"""Image classifiers by name from timm, torchvision and transformers, with each library's own preprocessing.

    model, prep = load_timm("resnet50.a1_in1k")            # weights from the Hugging Face or torch hub cache
    model, prep = load_timm("resnet50", "weights.pth")     # or from a local file
    model, prep = load_torchvision("resnet50")             # the DEFAULT weights, from the torch hub cache
    model, prep = load_transformers("google/vit-base-patch16-224")   # the HF cache, or a saved folder

Nothing is downloaded: weights come from a local file or from the library's own cache, where an earlier
``timm.create_model(name, pretrained=True)``, ``torchvision.models.get_model(name, weights="DEFAULT")`` or
``from_pretrained(name)`` with internet access left them. When they are not there, a one-line ValueError says
where they were looked for. The models are built and loaded by the libraries' own code (timm's
``create_model`` with its pretrained-weights loader, torchvision's ``get_model``, transformers'
``from_pretrained``); the preprocessing is the model's own (:mod:`overinterp_fast.zoo.preprocessing`).
Each loader returns the model in eval mode on the CPU and its :class:`~.preprocessing.LibraryTransform`.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

import torch
from torch import nn

from ..util.optional import load
from .preprocessing import LibraryTransform, from_image_processor, from_timm, from_torchvision


def _first_line(exc: BaseException, most: int = 300) -> str:
    """An exception's message on one line: its first line, and the next one when the first only introduces it
    (torch's "Error(s) in loading state_dict for ResNet:"), cut at ``most`` characters."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = " ".join(lines[:2]) if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return text if len(text) <= most else text[:most - 3] + "..."


def torch_hub_file(url: str) -> str:
    """Where ``torch.hub.load_state_dict_from_url(url)`` keeps its download: ``<hub dir>/checkpoints/<file name>``."""
    return os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(urlparse(url).path))


def _timm_cached_file(cfg: dict) -> tuple[str | None, list[str]]:
    """(the cached weights file of a timm pretrained config or None, the places looked at)."""
    looked = []
    hub_id = cfg.get("hf_hub_id")
    if hub_id:
        try_to_load_from_cache = load("huggingface_hub", "hub", "timm's weights cache").try_to_load_from_cache
        repo, _, revision = hub_id.partition("@")
        filename = cfg.get("hf_hub_filename")
        names = [filename] if filename else ["model.safetensors", "pytorch_model.bin"]  # as timm tries them
        looked.append(f"the Hugging Face cache ({repo}: {', '.join(names)})")
        for name in names:
            path = try_to_load_from_cache(repo, name, revision=revision or None)
            if isinstance(path, str):
                return path, looked
    url = cfg.get("url")
    if url:
        path = torch_hub_file(url)
        looked.append(f"the torch hub cache ({path})")
        if os.path.isfile(path):
            return path, looked
    return None, looked


def load_timm(name: str, weights: str | None = None) -> tuple[nn.Module, LibraryTransform]:
    """timm model ``name`` (an architecture, or ``architecture.tag`` for one set of its weights) with its
    pretrained weights from ``weights`` (a local state-dict or safetensors file) or timm's caches, and the
    transform of its data config (``timm.data.resolve_model_data_config``)."""
    timm = load("timm", "hub", f"timm:{name}")

    if not timm.is_model(name):
        raise ValueError(f"timm has no model {name!r} (timm.list_models() lists them)")
    if weights is None:
        try:
            cfg = timm.models.get_pretrained_cfg(name)
        except RuntimeError as exc:  # an unknown tag
            raise ValueError(f"timm:{name}: {_first_line(exc)}") from None
        if cfg is None:
            raise ValueError(f"timm:{name} has no pretrained weights; give a file: timm:{name}=PATH")
        weights, looked = _timm_cached_file(cfg.to_dict())
        if weights is None:
            raise ValueError(f"timm:{name}: its weights are neither in {' nor in '.join(looked)}; fetch them once with "
                             f"timm.create_model({name!r}, pretrained=True) where there is internet, or give a "
                             f"file: timm:{name}=PATH")
    elif not os.path.isfile(weights):
        raise FileNotFoundError(f"timm:{name}: weights file {weights!r} not found")
    try:
        model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": weights})
    except (RuntimeError, ValueError, OSError, KeyError) as exc:  # a file of other weights or not a state dict
        raise ValueError(f"timm:{name}: cannot load {weights!r}: {type(exc).__name__}: {_first_line(exc)}") from None
    model.eval()
    return model, from_timm(model)


def load_torchvision(name: str, weights: str | None = None) -> tuple[nn.Module, LibraryTransform]:
    """torchvision classification model ``name`` with its DEFAULT weights (from the torch hub cache) or the state
    dict in the file ``weights`` (for the architecture ``get_model(name, weights=None)`` builds), and the DEFAULT
    weights' transforms (``weights.transforms()``: resize, centre crop, mean and std)."""
    models = load("torchvision.models", "audit", f"torchvision:{name}")

    if name not in models.list_models(module=models):
        raise ValueError(f"torchvision has no classification model {name!r} "
                         f"(torchvision.models.list_models() lists them)")
    default = models.get_model_weights(name).DEFAULT
    if weights is None:
        cached = torch_hub_file(default.url)
        if not os.path.isfile(cached):
            raise ValueError(f"torchvision:{name}: its weights {default} are not in the torch hub cache ({cached}); "
                             f"fetch them once with torchvision.models.get_model({name!r}, weights='DEFAULT') where "
                             f"there is internet, or give a file: torchvision:{name}=PATH")
        model = models.get_model(name, weights=default)  # loads the cached file; nothing to download
    else:
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"torchvision:{name}: weights file {weights!r} not found")
        model = models.get_model(name, weights=None)
        try:
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        except Exception as exc:  # torch.load and load_state_dict fail their own ways on another file
            raise ValueError(f"torchvision:{name}: cannot load {weights!r}: {type(exc).__name__}: "
                             f"{_first_line(exc)}") from None
    model.eval()
    return model, from_torchvision(default)


class ImageClassifierLogits(nn.Module):
    """A transformers image classifier as a plain module: pixel values [B, C, S, S] -> logits [B, K]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def load_transformers(name: str) -> tuple[nn.Module, LibraryTransform]:
    """transformers image classifier ``name`` (a Hub id in the Hugging Face cache, or a folder written by
    ``save_pretrained``), through ``AutoModelForImageClassification`` and ``AutoImageProcessor`` with
    ``local_files_only=True``; the model returns logits (:class:`ImageClassifierLogits`), the transform is the
    image processor's."""
    transformers = load("transformers", "hub", f"hf:{name}")
    AutoImageProcessor, AutoModelForImageClassification = (transformers.AutoImageProcessor,
                                                            transformers.AutoModelForImageClassification)

    try:
        processor = AutoImageProcessor.from_pretrained(name, local_files_only=True)
        model = AutoModelForImageClassification.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        where = "folder" if os.path.isdir(name) else "Hugging Face cache entry"
        raise ValueError(f"hf:{name}: no image classifier and image processor in this {where} (nothing is "
                         f"downloaded: fetch it once with from_pretrained where there is internet): "
                         f"{_first_line(exc)}") from None
    return ImageClassifierLogits(model).eval(), from_image_processor(processor)
