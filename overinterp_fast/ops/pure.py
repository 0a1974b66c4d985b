"""Pure-PyTorch versions of every compiled op: the safety net, on any device.

Each function here computes exactly what its kernel in csrc/ computes (same
arguments, same results bit for bit, same one-line RuntimeError on bad indices),
with plain tensor ops. ``overinterp_fast.ops.kernels`` uses them when the compiled
extension is missing, when ``OVERINTERP_FAST_OPS=torch`` is set, or when a
kernel fails its self-check on a device (see ``overinterp_fast.ops_info()``).

Adding an op: write its pure version here, decorate it with ``@pure_op(name,
sample)`` where ``sample(device, generator)`` builds a few small random argument
lists for the self-check, and route its wrapper in ``_ops.py`` through
``_ops.call(name, ...)``. ``python_tests/ops/test_ops.py`` checks that every op of the
extension has an entry here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class PureOp:
    """An op's pure-PyTorch version and the small random cases its kernel is checked on.

    ``sample(device, generator)`` returns a list of argument lists (valid inputs,
    tensors on ``device``); the self-check runs kernel and pure version on copies
    of each and requires equal results and equal in-place updates.
    """

    name: str
    fn: Callable
    sample: Callable[[torch.device, torch.Generator], list[list]]


PURE_OPS: dict[str, PureOp] = {}


def pure_op(name: str, sample: Callable[[torch.device, torch.Generator], list[list]]):
    """Register ``fn`` as the pure version of ``overinterp_fast::<name>``."""

    def register(fn: Callable) -> Callable:
        PURE_OPS[name] = PureOp(name, fn, sample)
        return fn

    return register


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def check_ranges(op: str, checks: Sequence[tuple[torch.Tensor | np.ndarray, int, int, str]]) -> None:
    """Each (values, lo, hi, what): every value in [lo, hi), else csrc/check.h's RuntimeError (one transfer).
    ``values``: a tensor, or a numpy array of host values (checked by numpy: no op dispatched)."""
    checks = [c for c in checks if (c[0].size if isinstance(c[0], np.ndarray) else c[0].numel()) > 0]
    if not checks:
        return
    if all(isinstance(c[0], np.ndarray) for c in checks):
        bounds = [(int(c[0].min()), int(c[0].max())) for c in checks]
    else:
        checks = [(torch.from_numpy(c[0]), *c[1:]) if isinstance(c[0], np.ndarray) else c for c in checks]
        bounds = torch.stack([torch.stack(torch.aminmax(c[0])) for c in checks]).tolist()
    for (_, lo, hi, what), (vmin, vmax) in zip(checks, bounds):
        _check(vmin >= lo, f"{op}: {what} {vmin} out of range [{lo}, {hi})")
        _check(vmax < hi, f"{op}: {what} {vmax} out of range [{lo}, {hi})")


def is_channels_last(t: torch.Tensor) -> bool:
    return t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------- mask_apply


def _sample_mask_apply(device: torch.device, g: torch.Generator) -> list[list]:
    cases = []
    for dtype, per_image, channels_last in ((torch.float32, True, False), (torch.float16, False, True)):
        n, c, h, w, p, r, b = 3, 2, 5, 6, 9, 4, 13
        base = torch.randn(n, c, h, w, generator=g).to(dtype)
        baseline = torch.randn(n if per_image else 1, c, h, w, generator=g).to(dtype)
        if channels_last:
            base = base.contiguous(memory_format=torch.channels_last)
        fm = torch.randint(0, p, (c, h, w), generator=g)
        present = torch.rand(r, p, generator=g) > 0.4
        args = [base, baseline, fm, present, torch.randint(0, n, (b,), generator=g),
                torch.randint(0, r, (b,), generator=g), torch.randint(-1, p, (b,), generator=g)]
        cases.append([a.to(device) for a in args])
    return cases


@pure_op("mask_apply", _sample_mask_apply)
def mask_apply(base, baseline, feature_map, present, cand_image, cand_row, cand_feature,
               check_indices: bool = True) -> torch.Tensor:
    """out[b] = base[cand_image[b]] where present[cand_row[b], fm] and fm != cand_feature[b], else baseline.

    Shapes as ``overinterp_fast.ops.mask_apply``: base [N, *D], baseline [1 or N, *D],
    feature_map int64 [*D], present bool [R, p], candidates int64 [B]; returns [B, *D]
    in base's dtype and memory format.
    """
    _check(base.dim() >= 2, f"mask_apply: base must be [N, *D], got {list(base.shape)}")
    _check(base.is_floating_point(), f"mask_apply: base must be floating point, got {base.dtype}")
    _check(baseline.dtype == base.dtype,
           f"mask_apply: baseline dtype {baseline.dtype} differs from base dtype {base.dtype}")
    _check(baseline.dim() == base.dim() and baseline.shape[1:] == base.shape[1:]
           and baseline.shape[0] in (1, base.shape[0]),
           f"mask_apply: baseline must be [1, *D] or [N, *D] with base [N, *D]; got {list(baseline.shape)} "
           f"and {list(base.shape)}")
    _check(feature_map.dtype == torch.int64, "mask_apply: feature_map must be int64")
    _check(feature_map.shape == base.shape[1:],
           f"mask_apply: feature_map must be [*D] = {list(base.shape[1:])}, got {list(feature_map.shape)}")
    _check(present.dtype == torch.bool and present.dim() == 2, "mask_apply: present must be a bool [R, p] tensor")
    for t in (cand_image, cand_row, cand_feature):
        _check(t.dtype == torch.int64 and t.dim() == 1, "mask_apply: candidate lists must be int64 [B]")
        _check(t.shape[0] == cand_image.shape[0], "mask_apply: candidate lists differ in length")
    for t in (baseline, feature_map, present, cand_image, cand_row, cand_feature):
        _check(t.device == base.device, f"mask_apply: all tensors must be on {base.device}, found one on {t.device}")
    p = present.shape[1]
    if check_indices:
        check_ranges("mask_apply", [(cand_image, 0, base.shape[0], "cand_image"), (cand_row, 0, present.shape[0], "cand_row"),
                                    (cand_feature, -1, p, "cand_feature"), (feature_map, 0, p, "feature_map id")])
    lead = (-1,) + (1,) * feature_map.dim()
    keep = present[cand_row][:, feature_map] & (feature_map.unsqueeze(0) != cand_feature.view(lead))  # [B, *D]
    fill = baseline[cand_image] if baseline.shape[0] > 1 else baseline.expand(cand_image.shape[0], *base.shape[1:])
    out = torch.where(keep, base[cand_image], fill)
    fmt = torch.channels_last if is_channels_last(base) else torch.contiguous_format
    return out.contiguous(memory_format=fmt)


# --------------------------------------------------------- backselect_update


def _sample_backselect_update(device: torch.device, g: torch.Generator) -> list[list]:
    n, p = 6, 11
    remaining = torch.full((n, p + 1), -1, dtype=torch.int64)
    present = torch.zeros(n, p, dtype=torch.bool)
    counts = []
    for i in range(n):
        k = int(torch.randint(1, p + 1, (1,), generator=g))
        ids = torch.randperm(p, generator=g)[:k]
        remaining[i, :k] = ids
        present[i, ids] = True
        counts.append(k)
    scores = torch.randint(0, 3, (n, p + 1), generator=g).double() / 2  # coarse: exact ties
    rows = torch.randperm(n, generator=g)[:4]
    args = [scores, rows, torch.tensor(counts)[rows], torch.randint(0, p, (4,), generator=g), remaining, present,
            torch.full((n, p), -1, dtype=torch.int64), torch.zeros(n, p, dtype=torch.float64)]
    return [[a.to(device) for a in args]]


@pure_op("backselect_update", _sample_backselect_update)
def backselect_update(scores, rows, counts, steps, remaining, present, order, values,
                      check_indices: bool = True) -> None:
    """One backward-selection step per row in ``rows``, in place (see ``overinterp_fast.ops.backselect_update``).

    Largest ``scores[row, :count]`` wins, ties to the lowest feature id; the feature is
    written to order/values at ``steps``, cleared in ``present`` and removed from
    ``remaining`` (the last scored entry moves into its slot). With NaN scores some
    scored feature is picked, as by the kernels (which one is unspecified; the
    engines raise on non-finite scores).
    """
    _check(scores.dtype == torch.float64 and scores.dim() == 2 and scores.is_contiguous(),
           "backselect_update: scores must be a contiguous float64 [N, P] tensor")
    _check(remaining.dtype == torch.int64 and remaining.shape == scores.shape and remaining.is_contiguous(),
           "backselect_update: remaining must be a contiguous int64 tensor shaped like scores")
    _check(present.dtype == torch.bool and present.dim() == 2 and present.shape[0] == scores.shape[0]
           and present.is_contiguous(), "backselect_update: present must be a contiguous bool [N, p] tensor")
    _check(order.dtype == torch.int64 and order.dim() == 2 and order.shape[0] == scores.shape[0]
           and order.is_contiguous(), "backselect_update: order must be a contiguous int64 [N, m] tensor")
    _check(values.dtype == torch.float64 and values.shape == order.shape and values.is_contiguous(),
           "backselect_update: values must be a contiguous float64 tensor shaped like order")
    _check(present.shape[1] <= scores.shape[1], "backselect_update: scores needs at least p columns")
    for t in (rows, counts, steps):
        _check(t.dtype == torch.int64 and t.dim() == 1 and t.shape[0] == rows.shape[0],
               "backselect_update: rows, counts and steps must be int64 [K]")
    for t in (rows, counts, steps, remaining, present, order, values):
        _check(t.device == scores.device, f"backselect_update: all tensors must be on {scores.device}")
    s, p = scores.shape[1], present.shape[1]
    if check_indices:
        check_ranges("backselect_update", [(rows, 0, scores.shape[0], "row"), (counts, 1, min(s, p) + 1, "count"),
                                           (steps, 0, order.shape[1], "step")])
    if rows.numel() == 0:
        return
    slots = remaining[rows]  # [K, S]
    scored = torch.arange(s, device=rows.device).unsqueeze(0) < counts.unsqueeze(1)
    if check_indices:
        check_ranges("backselect_update", [(slots.masked_fill(~scored, 0), 0, p, "remaining feature")])
    cand = scores[rows]
    cand = cand.masked_fill(~scored | cand.isnan(), -torch.inf)  # NaN: some scored feature (the engines raise)
    best_score = cand.max(1, keepdim=True).values
    tied = scored & (cand == best_score)
    feature = slots.masked_fill(~tied, torch.iinfo(torch.int64).max).min(1).values  # ties: lowest feature id
    slot = (tied & (slots == feature.unsqueeze(1))).to(torch.int8).argmax(1)
    order[rows, steps] = feature
    values[rows, steps] = scores[rows, slot]
    present[rows, feature] = False
    last = counts - 1
    remaining[rows, slot] = remaining[rows, last]
    remaining[rows, last] = -1


# ----------------------------------------------------------------- rect_fill


def _sample_rect_fill(device: torch.device, g: torch.Generator) -> list[list]:
    n, h, w, r = 4, 9, 11, 60
    rects = torch.randint(-2, 14, (r, 4), generator=g)  # some clipped, some empty or inverted
    args = [rects, torch.randint(0, n, (r,), generator=g), torch.randint(-5, 9, (r,), generator=g)]
    return [[a.to(device) for a in args] + [n, h, w]]


@pure_op("rect_fill", _sample_rect_fill)
def rect_fill(rects, owner, weights, n: int, height: int, width: int, check_indices: bool = True) -> torch.Tensor:
    """int64 [n, height, width]: out[o, y, x] = sum of weights of owner o's rectangles covering (y, x).

    rects int64 [R, 4] (y0, x0, y1, x1) half-open, clipped to the image; owner, weights int64 [R].
    """
    _check(rects.dtype == torch.int64 and rects.dim() == 2 and rects.shape[1] == 4,
           "rect_fill: rects must be int64 [R, 4] (y0, x0, y1, x1)")
    _check(owner.dtype == torch.int64 and owner.dim() == 1 and owner.shape[0] == rects.shape[0],
           "rect_fill: owner must be int64 [R]")
    _check(weights.dtype == torch.int64 and weights.dim() == 1 and weights.shape[0] == rects.shape[0],
           "rect_fill: weights must be int64 [R]")
    _check(n >= 0 and height >= 0 and width >= 0, "rect_fill: n, height and width must be >= 0")
    _check(owner.device == rects.device and weights.device == rects.device,
           "rect_fill: all tensors must be on one device")
    if check_indices:
        check_ranges("rect_fill", [(owner, 0, n, "owner")])
    diff = torch.zeros(n, height + 1, width + 1, dtype=torch.int64, device=rects.device)
    y0, x0, y1, x1 = (rects[:, k].clamp(0, lim) for k, lim in enumerate((height, width, height, width)))
    ok = (y0 < y1) & (x0 < x1)
    o, w = owner[ok], weights[ok]
    y0, x0, y1, x1 = y0[ok], x0[ok], y1[ok], x1[ok]
    for ys, xs, sign in ((y0, x0, 1), (y0, x1, -1), (y1, x0, -1), (y1, x1, 1)):
        diff.index_put_((o, ys, xs), sign * w, accumulate=True)  # integers: exact in any order
    return diff.cumsum(2).cumsum(1)[:, :height, :width].contiguous()


# -------------------------------------------------------------- patch_gather


def _sample_patch_gather(device: torch.device, g: torch.Generator) -> list[list]:
    cases = []
    for channels_last, with_patch in ((False, True), (True, True), (False, False)):
        n, c, hh, ww, b, ph, pw = 3, 4, 7, 6, 9, 3, 4
        stored = torch.randn(n, c, hh, ww, generator=g, dtype=torch.float64)
        image = torch.randint(0, n, (b,), generator=g)
        origin = torch.stack([torch.randint(-1, hh - 1, (b,), generator=g),
                              torch.randint(-2, ww - 2, (b,), generator=g)], 1)
        patch = stored[image][:, :, :ph, :pw] + (torch.rand(b, c, ph, pw, generator=g) < 0.3).double()
        lo = origin + torch.randint(-1, 2, (b, 2), generator=g)
        valid = torch.cat([lo, lo + torch.randint(0, 5, (b, 2), generator=g)], 1)
        region = origin + torch.randint(-2, 2, (b, 2), generator=g)
        if channels_last:
            stored = stored.contiguous(memory_format=torch.channels_last)
        if not with_patch:
            patch = stored.new_empty((0, c, 0, 0))
        cases.append([stored.to(device), image.to(device), patch.to(device), origin.to(device), valid.to(device),
                      region.to(device), 4, 5, -math.inf if channels_last else 0.0])
    return cases


@pure_op("patch_gather", _sample_patch_gather)
def patch_gather(stored, image, patch, patch_origin, valid, region_origin, height: int, width: int,
                 pad_value: float, check_indices: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of stored maps with each candidate's patch laid over them (see overinterp_fast.ops.kernels.patch_gather).

    out[b, :, i, j] at map position (y, x) = region_origin[b] + (i, j): pad_value outside the map;
    patch[b, :, y - py, x - px] inside valid[b] and the patch at patch_origin[b]; stored[image[b], :, y, x]
    elsewhere. changed[b]: some patch value read differs from the stored value under it.
    """
    _check(stored.dim() == 4, f"patch_gather: stored must be [N, C, H, W], got {list(stored.shape)}")
    _check(patch.dim() == 4 and patch.dtype == stored.dtype,
           f"patch_gather: patch must be a [B, C, h, w] tensor of stored's dtype {stored.dtype}")
    _check(image.dtype == torch.int64 and image.dim() == 1, "patch_gather: image must be int64 [B]")
    b = image.shape[0]
    _check(patch.shape[1] == stored.shape[1] and (patch.shape[0] == b or patch.numel() == 0),
           f"patch_gather: patch must be [B, C, h, w] with B = {b} and C = {stored.shape[1]}, got {list(patch.shape)}")
    _check(patch_origin.dtype == torch.int64 and tuple(patch_origin.shape) == (b, 2),
           "patch_gather: patch_origin must be int64 [B, 2]")
    _check(region_origin.dtype == torch.int64 and tuple(region_origin.shape) == (b, 2),
           "patch_gather: region_origin must be int64 [B, 2]")
    _check(valid.dtype == torch.int64 and tuple(valid.shape) == (b, 4),
           "patch_gather: valid must be int64 [B, 4] (y0, x0, y1, x1)")
    _check(height >= 0 and width >= 0, f"patch_gather: region size must be non-negative, got {height}x{width}")
    if check_indices:
        check_ranges("patch_gather", [(image, 0, stored.shape[0], "image")])
    dev = stored.device
    _, c, hh, ww = stored.shape
    ys = region_origin[:, 0:1] + torch.arange(height, device=dev)  # [B, h]
    xs = region_origin[:, 1:2] + torch.arange(width, device=dev)  # [B, w]
    inside = ((ys >= 0) & (ys < hh)).unsqueeze(2) & ((xs >= 0) & (xs < ww)).unsqueeze(1)  # [B, h, w]
    yc, xc = ys.clamp(0, hh - 1), xs.clamp(0, ww - 1)
    idx_b = image.view(-1, 1, 1)
    s = stored.permute(0, 2, 3, 1)[idx_b, yc.unsqueeze(2), xc.unsqueeze(1)]  # [B, h, w, C]
    out = s
    changed = torch.zeros(b, dtype=torch.bool, device=dev)
    if patch.numel() > 0:
        ph, pw = patch.shape[2:]
        py, px = patch_origin[:, 0:1], patch_origin[:, 1:2]
        vy0, vy1 = torch.maximum(valid[:, 0:1], py), torch.minimum(valid[:, 2:3], py + ph)
        vx0, vx1 = torch.maximum(valid[:, 1:2], px), torch.minimum(valid[:, 3:4], px + pw)
        use = (((ys >= vy0) & (ys < vy1)).unsqueeze(2) & ((xs >= vx0) & (xs < vx1)).unsqueeze(1)) & inside
        pv = patch.permute(0, 2, 3, 1)[torch.arange(b, device=dev).view(-1, 1, 1),
                                        (ys - py).clamp(0, ph - 1).unsqueeze(2), (xs - px).clamp(0, pw - 1).unsqueeze(1)]
        use = use.unsqueeze(3)
        out = torch.where(use, pv, s)
        changed = (use & ~(pv == s)).flatten(1).any(1)
    out = torch.where(inside.unsqueeze(3), out, torch.full((), pad_value, dtype=stored.dtype, device=dev))
    fmt = torch.channels_last if is_channels_last(stored) else torch.contiguous_format
    return out.permute(0, 3, 1, 2).contiguous(memory_format=fmt), changed
