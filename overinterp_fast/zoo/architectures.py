"""Architectures by name, untrained, for training from scratch (the pixel-subset retraining).

    build = architecture("resnet20", channels=3, size=32, classes=10)   # a builder: build() -> a new nn.Module
    build = architecture("timm:resnet18", 3, 32, 10)                    # timm.create_model(..., pretrained=False)
    build = architecture("torchvision:vgg16_bn", 3, 32, 10)             # torchvision get_model(..., weights=None)

The names:

- the zoo's: ``resnet20`` (:class:`~overinterp_fast.zoo.cifar.ResNet20`, three channels), ``small-cnn``
  (:class:`~overinterp_fast.zoo.cifar.SmallCNN`, any channels and side) and ``digits-cnn``
  (:class:`~overinterp_fast.zoo.digits.DigitsCNN`, one channel of 8 x 8);
- ``timm:NAME``: any timm architecture, with ``num_classes`` and ``in_chans`` set (the ``hub`` extra);
- ``torchvision:NAME``: any torchvision classification architecture, with ``num_classes`` set (three channels).

No weights are loaded or downloaded: every model starts from its library's own random initialization.
:func:`architecture` builds the model once and runs it on two blank images, so a name that does not fit the
images (channels, side, classes) fails there, in one line, before any training.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..runtime.model import first_line
from ..util.optional import load

ZOO_ARCHITECTURES = ("resnet20", "small-cnn", "digits-cnn")
LIBRARIES = ("timm", "torchvision")


def _zoo(name: str, channels: int, size: int, classes: int) -> Callable[[], nn.Module]:
    from .cifar import ResNet20, SmallCNN
    from .digits import DigitsCNN

    if name == "resnet20":
        if channels != 3:
            raise ValueError(f"resnet20 takes 3 channels; these images have {channels}")
        return lambda: ResNet20(classes)
    if name == "small-cnn":
        if size < 4:
            raise ValueError(f"small-cnn needs images of 4 x 4 pixels or more; these are {size} x {size}")
        return lambda: SmallCNN(size, classes, channels)
    if (channels, size, classes) != (1, 8, 10):
        raise ValueError(f"digits-cnn takes one channel of 8 x 8 pixels and 10 classes; these images have "
                         f"{channels} channel(s) of {size} x {size} pixels and {classes} classes")
    return DigitsCNN


def _library(library: str, name: str, channels: int, classes: int) -> Callable[[], nn.Module]:
    if library == "timm":
        timm = load("timm", "hub", f"timm:{name}")
        if not timm.is_model(name):
            raise ValueError(f"timm has no architecture {name!r} (timm.list_models() lists them)")
        return lambda: timm.create_model(name, pretrained=False, num_classes=classes, in_chans=channels)
    models = load("torchvision.models", "audit", f"torchvision:{name}")
    if name not in models.list_models(module=models):
        raise ValueError(f"torchvision has no classification architecture {name!r} "
                         f"(torchvision.models.list_models() lists them)")
    if channels != 3:
        raise ValueError(f"torchvision:{name} takes 3 channels; these images have {channels}")
    return lambda: models.get_model(name, weights=None, num_classes=classes)


def architecture(spec: str, channels: int, size: int, classes: int) -> Callable[[], nn.Module]:
    """A builder of ``spec``'s untrained model for images [C = ``channels``, ``size``, ``size``] and ``classes``
    classes (see the module docstring). One-line ValueError for an unknown name or one that does not fit the
    images; :class:`~overinterp_fast.errors.MissingDependency` when its library is not installed."""
    library, sep, name = spec.partition(":")
    if sep and library in LIBRARIES and name:
        build = _library(library, name, channels, classes)
    elif spec in ZOO_ARCHITECTURES:
        build = _zoo(spec, channels, size, classes)
    else:
        raise ValueError(f"unknown architecture {spec!r}: the zoo has {', '.join(ZOO_ARCHITECTURES)}; or "
                         f"timm:NAME, torchvision:NAME")
    model = build().eval()
    try:
        with torch.no_grad():
            out = model(torch.zeros(2, channels, size, size))
    except Exception as exc:  # each library fails its own way on an input it cannot take
        raise ValueError(f"{spec} fails on images of {channels} x {size} x {size}: {type(exc).__name__}: "
                         f"{first_line(exc)}") from None
    if tuple(out.shape) != (2, classes):
        raise ValueError(f"{spec} gives outputs of shape {list(out.shape[1:])} per image, not {classes} class "
                         f"scores")
    return build
