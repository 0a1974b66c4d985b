"""How a photo becomes a model input: a resize and a centre crop, then ``(x / 255 - mean) / std``.

    prep = Preprocessing(224)                     # shorter side to 224 (PIL bicubic), centre crop 224 x 224
    prep = from_timm(timm_model)                  # timm's data config: e.g. resize to 256, crop 224
    prep = from_torchvision(weights)              # the weights' transforms(): resize_size, crop_size
    prep = from_image_processor(processor)        # a transformers image processor's resize and crop
    display = prep.crop(photo)    # uint8 [S, S, 3] (or [S, S]): the image as the model sees it, before normalizing
    x = prep(photo)               # float32 [C, S, S]: normalize(display, mean, std)
    prep.describe()               # JSON-ready: library, size, resize, crop_pct, interpolation, crop mode, mean, std

:class:`Preprocessing` is the plain transform: folders and datasets get it when the model does not say how its
inputs were made (files, ``--size``), and the bundled photos of the demos and benchmarks keep it
(:func:`overinterp_fast.zoo.imagenet.load_photos`). :class:`LibraryTransform` runs a library's own
evaluation geometry: the Resize and CenterCrop of timm's ``create_transform`` (from the model's
``resolve_model_data_config``), of torchvision's weights' ``transforms()``, or a transformers image processor
with its rescaling and normalization turned off. Either way the normalization is :func:`~.imagenet.normalize`,
so the display and the model input always describe the same pixels, and object masks are cropped by the
same geometry. Both are deterministic and picklable (DataLoader workers run them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..util.optional import load
from .imagenet import MEAN, STD, center_crop, normalize


def _values(v) -> float | tuple[float, ...]:
    """A number, or one per channel as a tuple (hashable, and equal however it was given)."""
    if isinstance(v, torch.Tensor):
        v = v.flatten().tolist()
    if isinstance(v, (list, tuple, np.ndarray)):
        v = tuple(float(x) for x in v)
        return v[0] if len(v) == 1 else v
    return float(v)


def _plain(v) -> float | list[float]:
    """mean or std for JSON: one number when every channel has the same, else the list."""
    flat = [v] if isinstance(v, float) else list(v)
    return flat[0] if len(set(flat)) == 1 else flat


@dataclass(frozen=True)
class Preprocessing:
    """The plain transform: shorter side to ``size`` (PIL bicubic, long side rounded), centre crop
    ``size x size``, then ``(x / 255 - mean) / std``.

    Attributes:
        size: side S of the square model input.
        mean, std: a number or one per channel (tuples, however given).
    """

    size: int
    mean: float | tuple[float, ...] = MEAN
    std: float | tuple[float, ...] = STD

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, (int, np.integer)) or self.size < 1:
            raise ValueError(f"the input size must be a positive integer, got {self.size!r}")
        object.__setattr__(self, "size", int(self.size))
        object.__setattr__(self, "mean", _values(self.mean))
        object.__setattr__(self, "std", _values(self.std))

    def crop(self, photo: np.ndarray) -> np.ndarray:
        """uint8 [H, W, 3] (or [H, W]) -> uint8 [S, S, 3] (or [S, S]): the photo as the model sees it."""
        photo = np.asarray(photo)
        if photo.shape[:2] == (self.size, self.size):
            return np.array(photo)
        return center_crop(photo, self.size)

    def normalize(self, display: np.ndarray) -> torch.Tensor:
        """uint8 [S, S, C] (or [S, S]: C = 1), a cropped photo -> float32 [C, S, S]: ``(x / 255 - mean) / std``."""
        return normalize(display, self.mean, self.std)

    def __call__(self, photo: np.ndarray) -> torch.Tensor:
        """uint8 [H, W, 3] (or [H, W]) -> float32 [C, S, S]: the cropped photo, normalized."""
        return self.normalize(self.crop(photo))

    def details(self) -> dict:
        """How the crop is made, apart from size, mean and std."""
        return {"library": "overinterp_fast", "resize": self.size, "crop_pct": 1.0, "interpolation": "bicubic",
                "crop_mode": "center"}

    def describe(self) -> dict:
        """JSON-ready: library, size, resize (the shorter side before the crop), crop_pct, interpolation,
        crop_mode, mean and std; what an audit records."""
        return {"size": self.size, **self.details(), "mean": _plain(self.mean), "std": _plain(self.std)}

    def with_values(self, size: int | None = None, mean=None, std=None) -> "Preprocessing":
        """The same transform with another size (the crop fraction kept), mean or std (None: unchanged)."""
        from dataclasses import replace

        changes = {k: v for k, v in (("size", size), ("mean", mean), ("std", std)) if v is not None}
        return replace(self, **changes) if changes else self

    def __repr__(self) -> str:
        d = self.describe()

        def short(v):
            return f"{v:.4g}" if isinstance(v, float) else "[" + ", ".join(f"{x:.4g}" for x in v) + "]"

        return (f"{type(self).__name__}({d['library']}: resize {d['resize']}, crop {self.size}, "
                f"{d['interpolation']}, mean {short(d['mean'])}, std {short(d['std'])})")


@dataclass(frozen=True, repr=False)
class LibraryTransform(Preprocessing):
    """A library's evaluation geometry (``geometry``: PIL image -> PIL image or array [S, S(, C)] / [C, S, S]),
    then ``(x / 255 - mean) / std``. Built by :func:`from_timm`, :func:`from_torchvision` and
    :func:`from_image_processor`; ``info`` is what :meth:`describe` reports besides size, mean and std.

    ``timm_config``: the timm data config it was made from, so that another size can be made the same way
    (None for the other libraries, whose transform fixes the size).
    """

    geometry: Callable | None = None
    info: dict = field(default_factory=dict)
    timm_config: dict | None = None

    def crop(self, photo: np.ndarray) -> np.ndarray:
        Image = load("PIL.Image", "audit", "a library's transform")

        out = np.asarray(self.geometry(Image.fromarray(np.asarray(photo))))
        if out.ndim == 3 and out.shape[0] in (1, 3) and out.shape[-1] not in (1, 3):
            out = out.transpose(1, 2, 0)  # channels first (an image processor's pixel values)
        if out.ndim == 3 and out.shape[-1] == 1:
            out = out[..., 0]
        if out.dtype != np.uint8:
            out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
        if out.shape[:2] != (self.size, self.size):
            raise ValueError(f"the {self.info.get('library')} transform gave a {out.shape[0]} x {out.shape[1]} image, "
                             f"not {self.size} x {self.size}")
        return out

    def details(self) -> dict:
        return dict(self.info)

    def with_values(self, size: int | None = None, mean=None, std=None) -> "Preprocessing":
        from dataclasses import replace

        out = self
        if size is not None and size != self.size:
            if self.timm_config is None:
                raise ValueError(f"the {self.info.get('library')} transform fixes the input size "
                                 f"({self.size}); it cannot be changed to {size}")
            channels = self.timm_config["input_size"][0]
            out = from_timm_config({**self.timm_config, "input_size": (channels, int(size), int(size))})
        changes = {k: v for k, v in (("mean", mean), ("std", std)) if v is not None}
        return replace(out, **changes) if changes else out


def as_preprocessing(size: int | Preprocessing | None, mean=None, std=None) -> Preprocessing:
    """``size`` when it is a :class:`Preprocessing` already (then mean and std must be None), else the plain
    transform of that size with ``mean`` and ``std`` (None: 0.5, TF-Lite's)."""
    if isinstance(size, Preprocessing):
        if mean is not None or std is not None:
            raise ValueError("give mean and std in the Preprocessing, not beside it")
        return size
    if size is None:
        raise ValueError("the input size is not known: give --size")
    return Preprocessing(size, MEAN if mean is None else mean, STD if std is None else std)


def _square(side, what: str) -> int:
    sides = [int(s) for s in (side if isinstance(side, (list, tuple)) else [side])]
    if len(set(sides)) != 1:
        raise ValueError(f"{what} makes {' x '.join(map(str, sides))} inputs; an audit needs square ones")
    return sides[0]


def from_timm_config(config: dict) -> LibraryTransform:
    """The evaluation transform of a timm data config ({"input_size": (C, H, W), "interpolation", "mean", "std",
    "crop_pct", "crop_mode"}): the geometry of ``timm.data.create_transform(**config)``, which timm builds from
    torchvision's Resize and CenterCrop (or its own for crop_mode "border")."""
    create_transform = load("timm.data", "hub", "a timm transform").create_transform

    pipeline = create_transform(**config, is_training=False, use_prefetcher=True)  # no ToTensor, no Normalize
    steps = list(pipeline.transforms)
    if not steps or type(steps[-1]).__name__ != "MaybePILToTensor":
        raise ValueError(f"unexpected timm transform {pipeline!r}")
    size = _square(config["input_size"][1:], "the timm data config")
    resize = next((getattr(s, "size", None) for s in steps if type(s).__name__ in ("Resize", "ResizeKeepRatio")),
                  None)
    resize = resize[0] if isinstance(resize, (list, tuple)) and len(set(resize)) == 1 else resize
    transforms = load("torchvision.transforms", "audit", "a timm transform")

    info = {"library": "timm", "resize": list(resize) if isinstance(resize, (list, tuple)) else resize,
            "crop_pct": config.get("crop_pct"), "interpolation": config.get("interpolation"),
            "crop_mode": config.get("crop_mode") or "center"}
    return LibraryTransform(size, config["mean"], config["std"], geometry=transforms.Compose(steps[:-1]), info=info,
                            timm_config=dict(config))


def from_timm(model: torch.nn.Module) -> LibraryTransform:
    """The model's own evaluation transform: ``timm.data.resolve_model_data_config(model)`` (size, crop_pct,
    interpolation, mean, std from its pretrained config), made as ``timm.data.create_transform`` makes it."""
    timm_data = load("timm.data", "hub", "a timm model's transform")
    return from_timm_config(timm_data.resolve_model_data_config(model))


def from_torchvision(weights) -> LibraryTransform:
    """The transform of a torchvision weights enum (``weights.transforms()``, an ``ImageClassification``):
    Resize to ``resize_size`` with its interpolation and antialias, CenterCrop to ``crop_size``, its mean and std."""
    transforms = load("torchvision.transforms", "audit", "a torchvision transform")

    t = weights.transforms()
    for attr in ("resize_size", "crop_size", "interpolation", "mean", "std"):
        if not hasattr(t, attr):
            raise ValueError(f"{weights}: its transforms() is {type(t).__name__}, not an image classification "
                             f"transform (resize, crop, normalize)")
    size = _square(t.crop_size * 2 if len(t.crop_size) == 1 else t.crop_size, str(weights))
    geometry = transforms.Compose([transforms.Resize(t.resize_size, interpolation=t.interpolation,
                                                     antialias=t.antialias),
                                   transforms.CenterCrop(t.crop_size)])
    resize = t.resize_size[0] if len(t.resize_size) == 1 else list(t.resize_size)
    info = {"library": "torchvision", "weights": str(weights), "resize": resize,
            "crop_pct": round(size / resize, 4) if isinstance(resize, int) else None,
            "interpolation": t.interpolation.value, "crop_mode": "center"}
    return LibraryTransform(size, t.mean, t.std, geometry=geometry, info=info)


class _ProcessorGeometry:
    """A transformers image processor without its rescaling and normalization: PIL image -> uint8 [C, S, S]."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, image):
        out = self.processor(images=image, do_rescale=False, do_normalize=False, return_tensors="np")
        return np.asarray(out["pixel_values"])[0]


def from_image_processor(processor) -> LibraryTransform:
    """The transform of a transformers image processor (e.g. ``AutoImageProcessor.from_pretrained(...)``): its own
    resize and crop (run with ``do_rescale=False, do_normalize=False``), then its ``image_mean`` and ``image_std``.

    The input side is measured on a 300 x 400 image; a processor that gives non-square inputs is refused, and so is
    one that rescales by another factor than 1 / 255."""
    name = type(processor).__name__
    if getattr(processor, "do_rescale", True) and not math.isclose(getattr(processor, "rescale_factor", 1 / 255),
                                                                    1 / 255):
        raise ValueError(f"{name} rescales pixels by {processor.rescale_factor}, not 1/255")
    geometry = _ProcessorGeometry(processor)
    Image = load("PIL.Image", "audit", "an image processor's transform")

    probe = np.asarray(geometry(Image.new("RGB", (400, 300))))
    size = _square(list(probe.shape[-2:]), name)
    normalizes = getattr(processor, "do_normalize", True)
    mean = processor.image_mean if normalizes else 0.0
    std = processor.image_std if normalizes else 1.0
    resample = getattr(processor, "resample", None)
    try:
        interpolation = Image.Resampling(int(resample)).name.lower()
    except (TypeError, ValueError):
        interpolation = None if resample is None else str(resample)
    size_spec = getattr(processor, "size", None)
    size_spec = {k: v for k, v in dict(size_spec).items() if v is not None} if size_spec is not None else None
    crop = getattr(processor, "crop_size", None) if getattr(processor, "do_center_crop", False) else None
    crop = {k: v for k, v in dict(crop).items() if v is not None} if crop is not None else None
    info = {"library": "transformers", "processor": name, "resize": size_spec, "crop_size": crop,
            "crop_pct": getattr(processor, "crop_pct", None), "interpolation": interpolation, "crop_mode": None}
    return LibraryTransform(size, mean, std, geometry=geometry, info=info)
