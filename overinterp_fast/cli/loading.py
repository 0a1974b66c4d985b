"""Models and images from the command line.

Models (``load_model``, :class:`LoadedModel`): the library's :mod:`overinterp_fast.zoo.models` (zoo names,
``timm:``/``torchvision:``/``hf:`` names, ONNX, ``.pt2``, TorchScript and pickled torch files), imported here for
the command line and for code written against this module before.

Images (``load_images``, all in memory): a folder of PNG/JPEG/BMP/TIFF/WebP files (sorted by
name; class subfolders give labels as torchvision's ImageFolder), or ``bundled`` for the photos
that ship with scikit-image and scikit-learn. Each is preprocessed as the model's
:class:`~overinterp_fast.zoo.preprocessing.Preprocessing` says (by default: resized, shorter side, and
center-cropped to ``size``, then normalized ``(x / 255 - mean) / std``). :mod:`overinterp_fast.audit.sources`
streams them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..audit.sources import object_mask, open_images, select_range
from ..zoo.models import LIBRARIES, ZOO_PREFIX, LoadedModel, first_line, load_model  # noqa: F401  (re-exported)
from ..zoo.preprocessing import Preprocessing, as_preprocessing


def common_preprocessing(loaded: list[LoadedModel], size: int | None = None, mean=None,
                         std=None) -> Preprocessing:
    """The one preprocessing for the images of every model in ``loaded``: the models' own where they say (they
    must agree), with ``size``, ``mean`` or ``std`` given in its place (a crop fraction is kept); the plain
    transform of ``size`` (else a model's known side) where no model says. One-line ValueError when models
    expect different preprocessing and no size settles it, or when nothing tells the size."""
    own = [(m.name, m.preprocessing) for m in loaded if m.preprocessing is not None]
    if own:
        first_name, first = own[0]
        if size is None:
            for name, prep in own[1:]:
                if prep.describe() != first.describe():
                    raise ValueError(f"{first_name} and {name} expect different preprocessing ({first!r} and "
                                     f"{prep!r}); give --size (and --mean, --std) to use one for both")
        return first.with_values(size, mean, std)
    size = size or next((m.size for m in loaded if m.size), None)
    if size is None:
        raise ValueError("the input size is not known from the model: give --size")
    return as_preprocessing(size, mean, std)


@dataclass
class LoadedImages:
    """Images ready for a model, and as a person sees them.

    Attributes:
        x: float32 [N, C, size, size], normalized.
        displays: uint8 [N, size, size, 3] (or [N, size, size] grey): the same crops before normalizing.
        names: one per image (file name without extension, or the bundled photo's name).
        labels: true class per image where known (from a labels file), else None.
    """

    x: torch.Tensor
    displays: np.ndarray
    names: list[str]
    labels: list[int | None]


def load_images(source: str, size: int | Preprocessing, mean=None, std=None, grey: bool = False,
                labels: str | None = None, limit: int | None = None) -> LoadedImages:
    """Images from a folder (flat or class subfolders) or ``bundled``, all in memory; see
    :mod:`overinterp_fast.audit.sources` (which streams them instead).

    Args:
        source: a folder of images, or "bundled".
        size: side of the square crops (mean, std: numbers or one per channel, default 0.5), or a
            :class:`~overinterp_fast.zoo.preprocessing.Preprocessing` (a loaded model's).
        grey: load as one channel (L) instead of RGB.
        labels: optional JSON file mapping file names (with or without extension) to class indices.
        limit: keep the first ``limit`` images.
    """
    src = open_images(source, size, mean, std, grey, labels)
    src = src.subset(select_range(len(src), None, limit))
    items = [src[i] for i in range(len(src))]
    return LoadedImages(torch.stack([it["x"] for it in items]), np.stack([it["display"] for it in items]),
                        src.image_names, src.image_labels)


def class_namer(num_classes: int, names_file: str | None = None, classes: list[str] | None = None):
    """index -> name: from a text file (one name per line), ImageNet names for 1000 classes, the source's
    classes (ImageFolder folders, CIFAR names) when there are as many, else the index."""
    if names_file is not None:
        with open(names_file) as fh:
            names = [line.strip() for line in fh if line.strip()]
        if len(names) != num_classes:
            raise ValueError(f"{names_file!r} has {len(names)} class names; the model has {num_classes} classes")
        return names.__getitem__
    if num_classes == 1000:
        from ..zoo.imagenet import imagenet_label

        return imagenet_label
    if classes is not None and len(classes) == num_classes:
        return list(classes).__getitem__
    return str


def load_object_masks(folder: str, names: list[str], size: int | Preprocessing) -> np.ndarray:
    """Object masks for the images ``names``: ``folder/<name>.png`` (any image file; nonzero = object).

    Cropped exactly as the images are (``size``: the plain transform's side, shorter side to ``size`` and a center
    crop, or the images' preprocessing). Returns bool [N, S, S].
    """
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"object masks: {folder!r} is not a folder")
    return np.stack([object_mask(folder, n, size) for n in names])
