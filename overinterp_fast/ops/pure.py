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
    of each and requires equal results and equal in-place updates. ``host_only``: the op works on the host's
    tensors whatever device a job runs on (its kernel is the CPU's alone; its cases are CPU tensors).
    """

    name: str
    fn: Callable
    sample: Callable[[torch.device, torch.Generator], list[list]]
    host_only: bool = False


PURE_OPS: dict[str, PureOp] = {}


def pure_op(name: str, sample: Callable[[torch.device, torch.Generator], list[list]], host_only: bool = False):
    """Register ``fn`` as the pure version of ``overinterp_fast::<name>`` (``host_only``: see :class:`PureOp`)."""

    def register(fn: Callable) -> Callable:
        PURE_OPS[name] = PureOp(name, fn, sample, host_only)
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


# ------------------------------------------------------- the exact SIS step


def _step_state(g: torch.Generator, n: int, p: int) -> tuple[torch.Tensor, ...]:
    """(remaining [n, p + 1], present [n, p], counts [n]): each image's present features, compact in remaining."""
    remaining = torch.full((n, p + 1), -1, dtype=torch.int64)
    present = torch.zeros(n, p, dtype=torch.bool)
    counts = torch.zeros(n, dtype=torch.int64)
    for i in range(n):
        k = int(torch.randint(1, p + 1, (1,), generator=g))
        ids = torch.randperm(p, generator=g)[:k]
        remaining[i, :k] = ids
        present[i, ids] = True
        counts[i] = k
    return remaining, present, counts


def _sample_exact_candidates(device: torch.device, g: torch.Generator) -> list[list]:
    cases = []
    for dtype, per_image, channels_last, memo in ((torch.float32, True, False, False),
                                                  (torch.float16, False, True, False),
                                                  (torch.float32, False, False, True)):
        n, c, h, w, p, b = 3, 2, 4, 5, 7, 11
        base = torch.randn(n, c, h, w, generator=g).to(dtype)
        baseline = torch.randn(n if per_image else 1, c, h, w, generator=g).to(dtype)
        out = torch.zeros(b, c, h, w, dtype=dtype)
        if channels_last:
            base, out = (t.contiguous(memory_format=torch.channels_last) for t in (base, out))
        fm = torch.randint(0, p, (c, h, w), generator=g)
        remaining, present, counts = _step_state(g, n, p)
        image = torch.randint(0, n, (b,), generator=g)
        slot = image * (p + 1) + (torch.rand(b, generator=g) * (counts[image] + 1)).long()  # slot p: nothing masked
        slot[-3:] = -1  # padding rows
        sched = torch.stack([image, slot, torch.zeros_like(image)])
        case = [base, baseline, fm, present, remaining, sched, out]
        if memo:  # a memo describing nothing yet (held rows unknown), one image's snapshot already current
            snap = torch.zeros(n, p, dtype=torch.bool)
            snap[0] = present[0]
            case += [False, torch.full((3, b), -1, dtype=torch.int64), snap, torch.arange(n) * 3]
        cases.append([t.to(device) if isinstance(t, torch.Tensor) else t for t in case])
    return cases


def _slot_features(remaining: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """remaining.view(-1)[slot] where slot >= 0, -1 (nothing masked) for padding rows (slot < 0)."""
    flat = remaining.reshape(-1)
    return torch.where(slot >= 0, flat.index_select(0, slot.clamp(min=0)), torch.full_like(slot, -1))


def _check_row_memo(op: str, held, snap, version, present: torch.Tensor, rows: int) -> bool:
    """Whether the row memo was given (csrc/exact_step.h's check_row_memo: the same one-line errors)."""
    given = [t is not None for t in (held, snap, version)]
    if not any(given):
        return False
    _check(all(given), f"{op}: held, snap and version go together (all three or none)")
    n, p = present.shape
    _check(held.dtype == torch.int64 and held.dim() == 2 and tuple(held.shape) == (3, rows) and held.is_contiguous(),
           f"{op}: held must be a contiguous int64 [3, {rows}] tensor, got {list(held.shape)} {held.dtype}")
    _check(snap.dtype == torch.bool and snap.dim() == 2 and tuple(snap.shape) == (n, p) and snap.is_contiguous(),
           f"{op}: snap must be a contiguous bool [{n}, {p}] tensor, got {list(snap.shape)} {snap.dtype}")
    _check(version.dtype == torch.int64 and version.dim() == 1 and version.shape[0] == n and version.is_contiguous(),
           f"{op}: version must be a contiguous int64 [{n}] tensor, got {list(version.shape)} {version.dtype}")
    for t in (held, snap, version):
        _check(t.device == present.device, f"{op}: all tensors must be on {present.device}, found one on {t.device}")
    return True


def _update_row_memo(image, feature, present, held, snap, version) -> None:
    """The row memo's update (csrc/exact_step.h's update_row_memo), with no host read."""
    if image.numel() == 0:
        return
    now = present.index_select(0, image)
    changed = now.ne(snap.index_select(0, image)).any(1)
    version.index_put_((image,), version.index_select(0, image) + changed.long())  # an image's rows agree
    snap.index_put_((image,), now)
    held[0].copy_(image)
    held[1].copy_(feature)
    held[2].copy_(version.index_select(0, image))


@pure_op("exact_candidates", _sample_exact_candidates)
def exact_candidates(base, baseline, feature_map, present, remaining, sched, out, check_indices: bool = True,
                     held=None, snap=None, version=None) -> None:
    """The candidates of one batch of the exact step loop into ``out`` [B, *D] (see ``ops.exact_candidates``).
    Every row is written; the row memo (held, snap, version), when given, is updated as the kernels update it."""
    op = "exact_candidates"
    _check(sched.dtype == torch.int64 and sched.dim() == 2 and sched.shape[0] >= 2
           and (sched.shape[1] <= 1 or sched.stride(1) == 1),
           f"{op}: sched must be an int64 [2, B] tensor with contiguous rows, got {list(sched.shape)} {sched.dtype}")
    _check(present.shape[0] == base.shape[0],
           f"{op}: present must have one row per image, got {list(present.shape)} for {base.shape[0]} images")
    _check(remaining.dtype == torch.int64 and remaining.dim() == 2 and remaining.shape[0] == base.shape[0]
           and remaining.shape[1] >= present.shape[1] and remaining.is_contiguous(),
           f"{op}: remaining must be a contiguous int64 [N, S >= p] tensor, got {list(remaining.shape)}")
    image, slot = sched[0], sched[1]
    if check_indices:
        check_ranges(op, [(image, 0, base.shape[0], "image"), (slot, -1, remaining.numel(), "slot"),
                          (feature_map, 0, present.shape[1], "feature_map id")])
        check_ranges(op, [(_slot_features(remaining, slot), -1, present.shape[1], "slot feature")])
    with_memo = _check_row_memo(op, held, snap, version, present, sched.shape[1])
    feature = _slot_features(remaining, slot)
    cand = mask_apply(base, baseline, feature_map, present, image, image, feature, False)
    fmt = torch.channels_last if is_channels_last(base) else torch.contiguous_format
    _check(out.shape == cand.shape and out.dtype == base.dtype and out.device == base.device
           and out.is_contiguous(memory_format=fmt),
           f"out must be {list(cand.shape)} {base.dtype} on {base.device} in base's memory format; got "
           f"{list(out.shape)} {out.dtype} on {out.device}")
    if with_memo:
        _update_row_memo(image, feature, present, held, snap, version)
    out.copy_(cand)


def _sample_exact_scores(device: torch.device, g: torch.Generator) -> list[list]:
    cases = []
    for dtype, pad in ((torch.float32, 3), (torch.float64, 0), (torch.float32, 99)):
        n, p, b, k = 5, 9, 12, 4
        remaining, present, counts = _step_state(g, n, p)
        scores = torch.randint(0, 3, (n, p + 1), generator=g).double() / 2  # coarse: exact ties
        probs = torch.softmax(torch.randn(b, k, generator=g), 1).to(dtype)
        image = torch.randint(0, n, (b,), generator=g)
        slot = image * (p + 1) + (torch.rand(b, generator=g) * (counts[image] + 1)).long()
        slot[b - min(pad, b):] = -1  # padding rows (all of them in the last case)
        rows = torch.randperm(n, generator=g)[:3]
        done = torch.stack([rows, counts[rows], torch.randint(0, p, (3,), generator=g)])
        if pad:
            done = torch.cat([done, torch.tensor([[-1, -1], [1, 1], [0, 0]])], 1)  # padding entries
        if pad == 99:
            done[0] = -1
        args = [probs, torch.randint(0, k, (n,), generator=g), torch.stack([image, slot]), done, scores,
                torch.zeros((), dtype=torch.float64), remaining, present, torch.full((n, p), -1, dtype=torch.int64),
                torch.zeros(n, p, dtype=torch.float64)]
        cases.append([a.to(device) for a in args])
    return cases


def _last_valid(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(any entry valid: bool [], the index of the last valid entry: int64 [1], 0 when none), with no host read."""
    idx = torch.arange(valid.shape[0], device=valid.device)
    return valid.any(), torch.where(valid, idx, torch.zeros_like(idx)).amax(0, keepdim=True)


def _like_last(t: torch.Tensor, valid: torch.Tensor, some: torch.Tensor, last: torch.Tensor, fill) -> torch.Tensor:
    """t where valid, else t's last valid entry (or ``fill`` when none is valid): a skipped entry repeats a kept one."""
    return torch.where(valid, t, torch.where(some, t.index_select(0, last), fill))


@pure_op("exact_scores", _sample_exact_scores)
def exact_scores(probs, targets, sched, done, scores, total, remaining, present, order, values,
                 check_indices: bool = True) -> None:
    """The scores of one batch of the exact step loop and the steps it completes (see ``ops.exact_scores``).

    No host read, also with padding rows and entries: a skipped entry is written as a copy of a kept one, or (when
    none is kept) as what its row already holds.
    """
    op = "exact_scores"
    for t, rows, name in ((sched, 2, "sched"), (done, 3, "done")):
        _check(t.dtype == torch.int64 and t.dim() == 2 and t.shape[0] >= rows and (t.shape[1] <= 1 or t.stride(1) == 1),
               f"{op}: {name} must be an int64 [{rows}, B] tensor with contiguous rows, got {list(t.shape)} {t.dtype}")
    _check(done.shape[0] == 3, f"{op}: done must be int64 [3, D] (row, count, step), got {list(done.shape)}")
    _check(probs.dim() == 2 and probs.is_floating_point() and probs.shape[0] == sched.shape[1] and probs.shape[1] >= 1,
           f"{op}: probs must be a floating [B, K] tensor with B = {sched.shape[1]} (the schedule's rows), got "
           f"{list(probs.shape)} {probs.dtype}")
    n = scores.shape[0]
    _check(targets.dtype == torch.int64 and targets.dim() == 1 and targets.shape[0] == n,
           f"{op}: targets must be int64 [N] with N = {n}, got {list(targets.shape)}")
    _check(total.dtype == torch.float64 and total.numel() == 1, f"{op}: total must be a float64 scalar")
    image, slot = sched[0], sched[1]
    rows, counts, steps = done[0], done[1], done[2]
    if check_indices:
        s, p = scores.shape[1], present.shape[1]
        check_ranges(op, [(image, 0, n, "image"), (slot, -1, scores.numel(), "slot"), (rows, -1, n, "row"),
                          (counts, 1, min(s, p) + 1, "count"), (steps, 0, order.shape[1], "step"),
                          (targets, 0, probs.shape[1], "target")])
    # the scores: padding rows write what the last real row writes (or, with none, scores[0] back)
    f = probs.gather(1, targets.index_select(0, image).view(-1, 1)).view(-1).double()
    valid = slot >= 0
    flat = scores.view(-1)
    if slot.numel():
        some, last = _last_valid(valid)
        idx = _like_last(slot, valid, some, last, torch.zeros_like(slot))
        flat.index_copy_(0, idx, _like_last(f, valid, some, last, flat[:1]))
    total.add_(torch.where(valid, f * 0, torch.zeros_like(f)).sum())
    # the steps: each entry's row state is computed from the rows as they were, then written back whole
    valid = rows >= 0
    if rows.numel() == 0:
        return
    some, last = _last_valid(valid)
    rows_, counts_, steps_ = (_like_last(t, valid, some, last, torch.full_like(t, fill))
                              for t, fill in ((rows, 0), (counts, 1), (steps, 0)))
    tables = [remaining, present, order, values]
    before = [t.index_select(0, rows_) for t in tables]
    after = [t.clone() for t in before]
    sc = scores.index_select(0, rows_)
    k = torch.arange(rows_.shape[0], device=rows_.device)
    backselect_update(sc, k, counts_, steps_, *after, check_indices=False)
    for t, old, new in zip(tables, before, after):
        t.index_copy_(0, rows_, torch.where(some, new, old))


def _sample_schedule_window(device: torch.device, g: torch.Generator) -> list[list]:
    cases = []
    for batch_size, rescore, stop, max_batches in ((8, 2, False, 6), (5, 0, True, 4), (64, 3, False, 1)):
        n, p = 6, 7
        count = torch.randint(1, p + 1, (n,), generator=g)
        step = torch.randint(0, 3, (n,), generator=g)
        score = torch.rand(n, generator=g) < 0.3
        tag = torch.where(score, 1, torch.where(torch.rand(n, generator=g) < 0.5, 2, 0))
        start = torch.where(score, p, 0)
        stop_ = torch.where(score, p + 1, count)
        segments = torch.stack([torch.randperm(n, generator=g), start, stop_, tag])
        segments[1:, :] = segments[1:, segments[0]]  # each image's own segment
        full = torch.rand(n, generator=g) < 0.3
        cases.append([segments, count, step, full, torch.tensor([1, 2, 4, 8]), batch_size, p + 1, rescore, stop,
                      max_batches])
    return cases


@pure_op("schedule_window", _sample_schedule_window, host_only=True)
def schedule_window(segments, count, step, full, sizes, batch_size: int, stride: int, rescore: int,
                    stop_at_round_end: bool, max_batches: int) -> tuple[torch.Tensor, ...]:
    """The exact step loop's schedule for up to ``max_batches`` batches (see csrc/cpu/schedule_window_kernel.cpp
    and ``ops.schedule_window``): the batches taken from a :class:`~overinterp_fast.runtime.schedule.CandidateQueue`
    one at a time, with numpy."""
    import numpy as np

    from ..runtime.schedule import CandidateQueue

    op = "schedule_window"
    _check(segments.dtype == torch.int64 and segments.dim() == 2 and segments.shape[0] == 4,
           f"{op}: segments must be int64 [4, S] (image, start, stop, tag), got {list(segments.shape)}")
    _check(count.dtype == torch.int64 and count.dim() == 1 and count.is_contiguous() and step.dtype == torch.int64
           and step.shape == count.shape and step.is_contiguous(), f"{op}: count and step must be contiguous int64 [N]")
    _check(full.dtype == torch.bool and full.shape == count.shape, f"{op}: full must be bool [N]")
    _check(sizes.dtype == torch.int64 and sizes.dim() == 1, f"{op}: sizes must be int64 [Z]")
    _check(all(t.device.type == "cpu" for t in (segments, count, step, full, sizes)),
           f"{op}: every tensor must be on the CPU (the schedule is the host's)")
    _check(batch_size >= 1 and stride >= 1 and rescore >= 0 and max_batches >= 1,
           f"{op}: batch_size, stride and max_batches must be >= 1 and rescore >= 0")
    n = count.shape[0]
    cnt, stp, fl, sz, seg = count.numpy(), step.numpy(), full.numpy(), sizes.numpy(), segments.numpy()
    for k in range(seg.shape[1]):  # the kernel's checks, in its order and words
        image, start, stop, tag = seg[:, k].tolist()
        _check(0 <= image < n, f"{op}: segment image {image} out of range [0, {n})")
        _check(0 <= start < stop <= stride, f"{op}: segment slots [{start}, {stop}) out of range [0, {stride})")
        _check(tag in (0, 1, 2), f"{op}: segment tag {tag} unknown")
    queue = CandidateQueue(images=n, slots=stride, capacity=max(1, seg.shape[1]))
    queue.push_many(*seg)
    blocks, batches, done = [], [], []
    offset = 0
    for w in range(max_batches):
        if not queue:
            break
        batch = queue.take(batch_size)
        first_done, stop, steps, going = len(done), False, [], ([], [])
        for i, tag in batch.completed:
            done.append([w, i, tag, int(cnt[i]), int(stp[i])])
            if tag == 1:  # a new round's input: the host decides what follows
                stop = True
                continue
            _check(cnt[i] >= 1, f"{op}: image {i} completes a step with no candidate left")
            steps.append([i, int(cnt[i]), int(stp[i])])
            cnt[i] -= 1
            stp[i] += 1
            if cnt[i] > 0:
                going[0 if tag == 0 else 1].append(i)
            elif stop_at_round_end:
                stop = True
        for i in going[0] + going[1]:
            queue.push(i, 0, int(cnt[i]), 2 if rescore > 0 and not fl[i] and cnt[i] > rescore else 0)
        m = len(batch)
        fit = int(np.searchsorted(sz, m))
        bp = int(sz[fit]) if fit < len(sz) else m
        block = np.empty((6, bp), np.int64)
        pad = bp - m
        block[0] = np.concatenate([batch.image, np.repeat(batch.image[-1:], pad)])
        block[1] = np.concatenate([batch.image * stride + batch.slot, np.full(pad, -1)])
        block[2:5] = np.array([[-1], [1], [0]], np.int64)
        if steps:
            block[2:5, :len(steps)] = np.array(steps, np.int64).T
        block[5] = np.concatenate([batch.tag, np.full(pad, -1)])
        batches.append([offset, bp, m, first_done, len(done) - first_done])
        blocks.append(block.reshape(-1))
        offset += block.size
        if stop:
            break
    left = queue.segments()
    as_tensor = lambda rows, shape: torch.tensor(rows, dtype=torch.int64, device="cpu").reshape(shape)  # noqa: E731
    return (torch.from_numpy(np.concatenate(blocks) if blocks else np.zeros(0, np.int64)),
            as_tensor(batches, (len(batches), 5)), as_tensor(done, (len(done), 5)), torch.from_numpy(left.copy()))
