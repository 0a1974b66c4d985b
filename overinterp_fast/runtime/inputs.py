"""Validation of user inputs and their conversion to what the engines consume."""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

import numpy as np
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Prepared:
    """Images and masking description, validated and on the images' device.

    Attributes:
        images: [N, *D] floating tensor (the user's, memory format kept).
        baseline: [1, *D] or [N, *D], images' dtype: the value of masked elements.
        feature_map: int64 [*D], feature id in [0, p) of every element.
        num_features: p.
        grid_shape: shape of a result's ``mask`` ((H, W) for default pixel features).
    """

    images: torch.Tensor
    baseline: torch.Tensor
    feature_map: torch.Tensor
    num_features: int
    grid_shape: tuple[int, ...]

    def feature_mask(self, features: torch.Tensor | np.ndarray) -> torch.Tensor:
        """bool mask over the feature grid, True on ``features`` (int64 [k]: a tensor, or a numpy array of the
        host's), on the device of ``features`` (the CPU for an array)."""
        if isinstance(features, np.ndarray) or features.device.type == "cpu":  # numpy: no op for the host's results
            host = np.zeros(self.num_features, dtype=bool)
            host[features if isinstance(features, np.ndarray) else features.numpy()] = True
            return torch.from_numpy(host).reshape(self.grid_shape)
        mask = features.new_zeros(self.num_features, dtype=torch.bool)
        mask[features] = True
        return mask.view(self.grid_shape)

    def feature_masks(self, order: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
        """:meth:`feature_mask` of many feature lists at once, on the host: row k is True on
        ``order[k, begin[k]:end[k]]`` (int64 [K, M]; begin, end int [K]). Returns bool [K, *grid_shape]."""
        k, m = order.shape
        pos = np.arange(m)
        rows, cols = np.nonzero((pos >= begin[:, None]) & (pos < end[:, None]))
        masks = np.zeros((k, self.num_features), dtype=bool)
        masks[rows, order[rows, cols]] = True
        return masks.reshape(k, *self.grid_shape)


def check_images(images) -> torch.Tensor:
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor of shape [N, *D], got {type(images).__name__}")
    if images.dim() < 2:
        raise ValueError(
            f"images must have a batch dimension, shape [N, *D] (images: [N, C, H, W]); got shape "
            f"{tuple(images.shape)}. For one image use images.unsqueeze(0)."
        )
    if images.shape[0] == 0:
        raise ValueError("images is an empty batch (N = 0)")
    if images[0].numel() == 0:
        raise ValueError(f"images have no elements per example: shape {tuple(images.shape)}")
    if images.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"images must be floating point ({', '.join(map(str, FLOAT_DTYPES))}), got {images.dtype}; "
            "convert and normalize them as the model expects, e.g. images.float()"
        )
    bad = ~torch.isfinite(images)
    if bool(bad.any()):
        idx = sorted({int(i) for i in bad.flatten(1).any(1).nonzero().flatten()[:5]})
        raise ValueError(f"images contain NaN or inf (first examples affected: {idx})")
    return images


def _unit_interval(value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"threshold must be a number in [0, 1], got {value!r}")
    value = float(value)
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ValueError(f"threshold must lie in [0, 1], got {value}")
    return value


def check_threshold(threshold, n: int) -> list[float]:
    """One threshold per image: a number for all, or a sequence / 1-D tensor of n numbers, each in [0, 1]."""
    if isinstance(threshold, torch.Tensor):
        if threshold.dim() == 0:
            threshold = threshold.item()
        elif threshold.dim() == 1:
            threshold = threshold.tolist()
        else:
            raise ValueError(f"threshold must be a number or one per image [N], got shape {tuple(threshold.shape)}")
    if isinstance(threshold, (list, tuple)):
        if len(threshold) != n:
            raise ValueError(f"threshold must be a number or have one entry per image ({n}), got {len(threshold)}")
        return [_unit_interval(t) for t in threshold]
    return [_unit_interval(threshold)] * n


def default_feature_map(element_shape: tuple[int, ...]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """One feature per pixel over all channels for [C, H, W]; one per element otherwise."""
    if len(element_shape) == 3:
        c, h, w = element_shape
        return torch.arange(h * w).view(1, h, w).expand(c, h, w), (h, w)
    n = math.prod(element_shape)
    return torch.arange(n).view(element_shape), tuple(element_shape)


def check_feature_map(features, element_shape: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    if not isinstance(features, torch.Tensor):
        raise TypeError("feature_mask must be an integer tensor (a feature id per input element) or None")
    if features.dtype.is_floating_point or features.dtype.is_complex or features.dtype == torch.bool:
        raise TypeError(f"feature_mask must be an integer tensor, got {features.dtype}")
    if features.dim() == len(element_shape) + 1 and features.shape[0] == 1:
        features = features[0]  # a [1, *D] map shared by the batch, as Captum allows
    try:
        fm = torch.broadcast_to(features, element_shape)
    except RuntimeError:
        raise ValueError(
            f"feature_mask of shape {tuple(features.shape)} does not fit one example of shape {element_shape}; "
            "it must be broadcastable to it (e.g. [H, W] for [C, H, W] images)"
        ) from None
    fm = fm.to(torch.int64)
    ids = torch.unique(fm)
    p = int(ids.numel())
    if int(ids[0]) != 0 or int(ids[-1]) != p - 1:
        raise ValueError(
            f"feature ids must be exactly 0..p-1 with every id used; found {p} distinct ids from "
            f"{int(ids[0])} to {int(ids[-1])} (relabel with torch.unique(feature_mask, return_inverse=True)[1])"
        )
    return fm, p


def check_mask_value(mask_value, images: torch.Tensor) -> torch.Tensor:
    """Baseline [1, *D] or [N, *D] in the images' dtype, device and memory format."""
    element_shape = tuple(images.shape[1:])
    if isinstance(mask_value, Real) and not isinstance(mask_value, bool):
        if not math.isfinite(float(mask_value)):
            raise ValueError(f"baselines must be finite, got {mask_value}")
        return torch.full((1, *element_shape), float(mask_value), dtype=images.dtype, device=images.device)
    if not isinstance(mask_value, torch.Tensor):
        raise TypeError("baselines must be a number, a per-channel tensor [C], or a baseline tensor")
    mv = mask_value.to(device=images.device, dtype=images.dtype)
    if not bool(torch.isfinite(mv).all()):
        raise ValueError("baselines contains NaN or inf")
    if mv.dim() == 1 and len(element_shape) == 3 and mv.numel() == element_shape[0]:
        mv = mv.view(-1, 1, 1)  # per-channel value
    if mv.dim() == len(element_shape) + 1 and mv.shape[0] == images.shape[0] and mv.shape[0] != 1:
        if tuple(mv.shape) != tuple(images.shape):
            raise ValueError(f"a per-image baseline must have the images' shape {tuple(images.shape)}")
        baseline = mv
    else:
        if mv.dim() == len(element_shape) + 1 and mv.shape[0] == 1:
            mv = mv[0]
        try:
            baseline = torch.broadcast_to(mv, element_shape).unsqueeze(0)
        except RuntimeError:
            raise ValueError(
                f"baselines of shape {tuple(mask_value.shape)} fits neither one channel value per channel, "
                f"nor an example {element_shape}, nor the batch {tuple(images.shape)}"
            ) from None
    if images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last):
        return baseline.contiguous(memory_format=torch.channels_last)
    return baseline.contiguous()


def prepare(images, features=None, mask_value=0.0) -> Prepared:
    images = check_images(images)
    element_shape = tuple(images.shape[1:])
    if features is None:
        fm, grid = default_feature_map(element_shape)
        p = math.prod(grid)
    else:
        fm, p = check_feature_map(features, element_shape)
        grid = (p,)
    fm = fm.to(images.device).contiguous()
    baseline = check_mask_value(mask_value, images)
    return Prepared(images=images, baseline=baseline, feature_map=fm, num_features=p, grid_shape=grid)
