"""The ops (compiled kernels or their pure-PyTorch versions), their fake implementations, and thin wrappers.

The schemas live in csrc/ops.cpp; CPU and CUDA kernels are registered per
dispatch key in csrc/cpu and csrc/cuda; overinterp_fast/ops/pure.py holds a
pure-PyTorch version of every op. Each call picks, per op and device:

- the pure version when ``OVERINTERP_FAST_OPS=torch`` is set, when the compiled
  extension could not be loaded (one warning at import), or when the extension
  has no kernel for the device (one warning);
- on the first use on each CUDA device, each kernel runs a few small random cases
  against its pure version (milliseconds); on a mismatch or an error it warns once
  and the pure version is used on that device from then on;
- the kernel otherwise.

``ops_info()`` (also ``overinterp_fast.ops_info``) says which one each op uses, and why.
"""
from __future__ import annotations

import functools
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from ..runtime.sync import sanctioned_wait
from .pure import PURE_OPS, is_channels_last

ENV_VAR = "OVERINTERP_FAST_OPS"
MODES = ("auto", "torch")  # auto (default): kernels, self-checked on CUDA; torch: pure versions everywhere
SELF_CHECK_DEVICE_TYPES = {"cuda"}  # the kernels never run elsewhere before the self-check; tests add "cpu"
_SELF_CHECK_SEED = 20260501

try:
    from .. import _C  # noqa: F401  (loading the library registers the ops)

    LOAD_ERROR: str | None = None
except ImportError as exc:
    LOAD_ERROR = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    warnings.warn(
        f"overinterp_fast's compiled extension could not be loaded ({LOAD_ERROR}); using the pure-PyTorch ops "
        "(same results, slower). Build it with `pip install --no-build-isolation -e .` or ./scripts/test.",
        RuntimeWarning,
        stacklevel=2,
    )


def extension_loaded() -> bool:
    """True when the compiled extension (overinterp_fast._C) is loaded."""
    return LOAD_ERROR is None


def extension_ops() -> list[str]:
    """Names of the ops the loaded extension defines (empty when it is not loaded)."""
    return list(_op_names())


@functools.lru_cache(maxsize=1)
def _op_names() -> tuple[str, ...]:
    """The overinterp_fast ops the dispatcher knows, listed once (a scan of every registered op, about 3 ms): the
    extension is loaded, or not, when this module is imported."""
    prefix = "overinterp_fast::"
    return tuple(sorted(n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)))


def _defines(name: str) -> bool:
    """True when the loaded extension defines op ``name`` (an extension built from older sources may not)."""
    return extension_loaded() and name in extension_ops()


def _has_kernel(name: str, device_type: str) -> bool:
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return (key is not None and _defines(name)
            and torch._C._dispatch_has_kernel_for_dispatch_key(f"overinterp_fast::{name}", key))


def has_cuda_kernels() -> bool:
    """True when the extension is loaded and was built with its CUDA kernels."""
    return _has_kernel("mask_apply", "cuda")


def kernel(name: str) -> Callable:
    """The compiled op itself (no fallback, no self-check): ``torch.ops.overinterp_fast.<name>``."""
    if not extension_loaded():
        raise RuntimeError(f"overinterp_fast's compiled extension is not loaded: {LOAD_ERROR}")
    return getattr(torch.ops.overinterp_fast, name)


@dataclass(frozen=True)
class OpInfo:
    """Which implementation an op uses on a device: ``implementation`` is "kernel" or "torch"."""

    op: str
    device: str
    implementation: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op:<20} {self.device:<8} {self.implementation:<7} {self.reason}"


def mode() -> str:
    """The value of OVERINTERP_FAST_OPS ("auto" when unset)."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENV_VAR} must be one of {MODES} (or unset), got {os.environ[ENV_VAR]!r}")
    return value


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):  # ops returning several tensors
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if a is None or b is None:
        return a is None and b is None
    return (a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            and (a.numel() <= 1 or a.stride() == b.stride()) and torch.equal(a, b))


def self_check(name: str, device: torch.device | str) -> str | None:
    """Run the kernel of ``name`` on its sample cases on ``device`` against the pure version.

    Returns None when results (and in-place updates) are identical, else a one-line
    description of the mismatch or of the error the kernel raised.
    """
    device = torch.device(device)
    spec = PURE_OPS[name]
    fn = kernel(name)
    try:
        with sanctioned_wait():  # a one-off wait, also under a user's torch.cuda.set_sync_debug_mode
            return _compare_samples(spec, fn, device)
    except Exception as exc:  # a launch error, an illegal address, ...: whatever it is, the kernel is not used
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {first}"


def _compare_samples(spec, fn: Callable, device: torch.device) -> str | None:
    """None when ``fn`` gives the pure version's results and in-place updates on every sample case, else what
    differs first."""
    clone = lambda args: [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731
    for i, case in enumerate(spec.sample(device, torch.Generator().manual_seed(_SELF_CHECK_SEED))):
        got_args, want_args = clone(case), clone(case)
        got = fn(*got_args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # launch and execution errors surface here
        want = spec.fn(*want_args)
        if not _same(got, want):
            return f"case {i}: the result differs from the pure-PyTorch version"
        for k, (a, b) in enumerate(zip(got_args, want_args)):
            if isinstance(a, torch.Tensor) and not _same(a, b):
                return f"case {i}: argument {k} is updated differently from the pure-PyTorch version"
    return None


_lock = threading.Lock()
_choices: dict[tuple, tuple[OpInfo, Callable]] = {}  # (op, device, setting) -> (why, implementation)


def _choose(name: str, device: torch.device) -> tuple[OpInfo, Callable]:
    """(why, implementation) of op ``name`` on ``device``, decided once per (op, device, mode)."""
    where = str(device)
    key = (name, where, mode())
    choice = _choices.get(key)
    if choice is not None:
        return choice
    with _lock:
        choice = _choices.get(key)
        if choice is not None:
            return choice
        pure = PURE_OPS[name].fn
        if key[2] == "torch":
            choice = OpInfo(name, where, "torch", f"{ENV_VAR}=torch"), pure
        elif not extension_loaded():
            choice = OpInfo(name, where, "torch", f"the compiled extension could not be loaded: {LOAD_ERROR}"), pure
        elif not _defines(name):
            choice = OpInfo(name, where, "torch", "the loaded extension does not define it (built from "
                            "older sources: rebuild with ./scripts/test)"), pure
            warnings.warn(f"the compiled extension does not define {name} (built from older "
                          "sources?); using its pure-PyTorch version (same results, slower)",
                          RuntimeWarning, stacklevel=4)
        elif not _has_kernel(name, device.type):
            choice = OpInfo(name, where, "torch", f"the extension has no {device.type} kernel"), pure
            warnings.warn(f"no compiled {device.type} kernel for {name}; using its "
                          "pure-PyTorch version (same results, slower)", RuntimeWarning, stacklevel=4)
        elif device.type in SELF_CHECK_DEVICE_TYPES:
            problem = self_check(name, device)
            if problem is None:
                choice = OpInfo(name, where, "kernel", f"passed its self-check on {where}"), kernel(name)
            else:
                choice = OpInfo(name, where, "torch", f"failed its self-check on {where}: {problem}"), pure
                warnings.warn(f"the {name} kernel failed its self-check on {where} ({problem}); "
                              "using its pure-PyTorch version there (same results, slower)",
                              RuntimeWarning, stacklevel=4)
        else:
            choice = OpInfo(name, where, "kernel", f"compiled {device.type} kernel"), kernel(name)
        _choices[key] = choice
        return choice


def implementation(name: str, device: torch.device) -> Callable:
    """The implementation :func:`call` runs for op ``name`` on ``device`` under the current setting (chosen, and
    self-checked, once): for loops that call an op many times on one device and skip the per-call lookup."""
    return _choose(name, torch.device(device))[1]


def call(name: str, *args):
    """Run op ``name`` with the implementation chosen for the device of its first argument."""
    device = args[0].device
    # the per-call path: one lookup keyed by the device object and the raw setting (no string formatting);
    # _choose decides (and self-checks) once per op, device and setting
    key = (name, device, os.environ.get(ENV_VAR))
    choice = _choices.get(key)
    if choice is None:
        choice = _choices[key] = _choose(name, device)
    return choice[1](*args)


def ops_info(devices=None) -> list[OpInfo]:
    """Which implementation each op uses on each device, and why.

    Args:
        devices: devices to report (default: the CPU and every visible CUDA device).
            Reporting a CUDA device runs its self-checks if they have not run yet. An op that works on the
            host's tensors whatever the job's device (``schedule_window``) has a CPU row only.

    Returns:
        One :class:`OpInfo` per (op, device); ``print(*ops_info(), sep="\n")`` shows a table.
    """
    if devices is None:
        devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [_choose(name, torch.device(d))[0] for d in devices for name in sorted(PURE_OPS)
            if torch.device(d).type == "cpu" or not PURE_OPS[name].host_only]  # host-only ops: the CPU's row


def _register_fakes() -> None:
    """Fake (meta) implementations for torch.compile / export, for the ops the loaded extension defines."""

    def register_fake(qualname: str):
        if _defines(qualname.split("::")[1]):
            return torch.library.register_fake(qualname)
        return lambda fn: fn

    @register_fake("overinterp_fast::mask_apply")
    def _mask_apply_fake(base, baseline, feature_map, present, cand_image, cand_row, cand_feature,
                         check_indices=True):
        torch._check(base.dim() >= 2)
        torch._check(feature_map.shape == base.shape[1:])
        torch._check(cand_image.shape == cand_row.shape == cand_feature.shape)
        shape = (cand_image.shape[0], *base.shape[1:])
        fmt = torch.channels_last if is_channels_last(base) else torch.contiguous_format
        return base.new_empty(shape).contiguous(memory_format=fmt)

    @register_fake("overinterp_fast::backselect_update")
    def _backselect_update_fake(scores, rows, counts, steps, remaining, present, order, values, check_indices=True):
        torch._check(rows.shape == counts.shape == steps.shape)
        return None

    @register_fake("overinterp_fast::rect_fill")
    def _rect_fill_fake(rects, owner, weights, n, height, width, check_indices=True):
        torch._check(rects.dim() == 2 and rects.shape[1] == 4)
        return rects.new_empty((n, height, width))

    @register_fake("overinterp_fast::patch_gather")
    def _patch_gather_fake(stored, image, patch, patch_origin, valid, region_origin, height, width, pad_value,
                           check_indices=True):
        torch._check(stored.dim() == 4 and patch.dim() == 4)
        torch._check(image.dim() == 1)
        fmt = torch.channels_last if is_channels_last(stored) else torch.contiguous_format
        out = stored.new_empty((image.shape[0], stored.shape[1], height, width)).contiguous(memory_format=fmt)
        return out, stored.new_empty((image.shape[0],), dtype=torch.bool)


    @register_fake("overinterp_fast::exact_candidates")
    def _exact_candidates_fake(base, baseline, feature_map, present, remaining, sched, out, check_indices=True,
                               held=None, snap=None, version=None):
        torch._check(sched.dim() == 2 and out.shape[0] == sched.shape[1])
        return None

    @register_fake("overinterp_fast::exact_scores")
    def _exact_scores_fake(probs, targets, sched, done, scores, total, remaining, present, order, values,
                           check_indices=True):
        torch._check(probs.shape[0] == sched.shape[1])
        return None

    @register_fake("overinterp_fast::schedule_window")
    def _schedule_window_fake(segments, count, step, full, sizes, batch_size, stride, rescore, stop_at_round_end,
                              max_batches):
        ctx = torch.library.get_ctx()
        records, windows, done, left = (ctx.new_dynamic_size() for _ in range(4))
        return (segments.new_empty((records,)), segments.new_empty((windows, 5)), segments.new_empty((done, 5)),
                segments.new_empty((4, left)))


if extension_loaded():
    _register_fakes()


def patch_gather(
    stored: torch.Tensor,
    image: torch.Tensor,
    patch: torch.Tensor | None,
    patch_origin: torch.Tensor,
    valid: torch.Tensor,
    region_origin: torch.Tensor,
    height: int,
    width: int,
    pad_value: float = 0.0,
    check_indices: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of stored activation maps with each candidate's recomputed patch laid over them.

    Args:
        stored: [N, C, H, W] activations of the N current inputs (any dtype; channels_last kept).
        image: int64 [B], the row of ``stored`` under candidate b.
        patch: [B, C, ph, pw] recomputed values, or None (read ``stored`` only).
        patch_origin: int64 [B, 2], map position (y, x) of ``patch[b, :, 0, 0]``.
        valid: int64 [B, 4], box (y0, x0, y1, x1), half-open, where the patch is used
            (intersected with the patch's extent; an empty box reads ``stored`` only).
        region_origin: int64 [B, 2], map position of the region's top-left (may lie outside the map).
        height, width: region size.
        pad_value: the value outside the map (a convolution's zero padding, -inf for max pooling).
        check_indices: check ``image`` on the host first (one device synchronisation per call on CUDA); False
            only where the indices were checked when they were made (incremental inference in the exact loop).

    Returns:
        (out [B, C, height, width] in stored's memory format,
         changed bool [B]: some patch value read differs from the stored value under it).
    """
    if patch is None:
        patch = stored.new_empty((0, stored.shape[1], 0, 0))
    return call("patch_gather", stored, image, patch, patch_origin, valid, region_origin, height, width,
                float(pad_value), check_indices)


def rect_fill(
    rects: torch.Tensor, owner: torch.Tensor, weights: torch.Tensor, n: int, height: int, width: int,
    check_indices: bool = True,
) -> torch.Tensor:
    """Weighted coverage of unions of rectangles, exactly (2D difference arrays and prefix sums).

    Args:
        rects: int64 [R, 4], (y0, x0, y1, x1) half-open, clipped to [0, height] x [0, width].
        owner: int64 [R] in [0, n): the map each rectangle is painted into.
        weights: int64 [R].
        check_indices: check ``owner`` on the host first (one device synchronisation per call on CUDA); False
            only where the owners were checked when they were made.

    Returns:
        int64 [n, height, width]: ``out[o, y, x]`` = sum of the weights of owner o's
        rectangles that cover (y, x).
    """
    return call("rect_fill", rects, owner, weights, n, height, width, check_indices)


def mask_apply(
    base: torch.Tensor,
    baseline: torch.Tensor,
    feature_map: torch.Tensor,
    present: torch.Tensor,
    cand_image: torch.Tensor,
    cand_row: torch.Tensor,
    cand_feature: torch.Tensor,
    check_indices: bool = True,
) -> torch.Tensor:
    """Write a batch of masked candidates in one pass.

    Args:
        base: [N, *D] floating images (any float dtype; channels_last kept).
        baseline: [1, *D] or [N, *D], same dtype: what a masked element becomes.
        feature_map: int64 [*D], feature id in [0, p) of every element.
        present: bool [R, p], rows of present features.
        cand_image, cand_row, cand_feature: int64 [B]. Candidate b starts from
            image ``cand_image[b]`` with the features of ``present[cand_row[b]]``
            and additionally masks feature ``cand_feature[b]`` (-1: none).
        check_indices: check every index on the host first (one device synchronisation per call on CUDA).
            False only where the indices were checked when they were made (the exact SIS step loop).

    Returns:
        [B, *D] tensor in base's dtype and memory format.
    """
    return call("mask_apply", base, baseline, feature_map, present, cand_image, cand_row, cand_feature, check_indices)


def backselect_update(
    scores: torch.Tensor,
    rows: torch.Tensor,
    counts: torch.Tensor,
    steps: torch.Tensor,
    remaining: torch.Tensor,
    present: torch.Tensor,
    order: torch.Tensor,
    values: torch.Tensor,
    check_indices: bool = True,
) -> None:
    """Finish one backward-selection step for each row in ``rows``, in place.

    Args:
        scores: float64 [N, S]: ``scores[i, j]`` is f after masking ``remaining[i, j]``.
        rows, counts, steps: int64 [K], distinct rows; ``counts[k]`` candidates
            (``remaining[rows[k], :counts[k]]``) are scored; ``steps[k]`` is the
            position in order/values to write.
        remaining: int64 [N, S], compact lists of present feature ids (-1 past the end).
        present: bool [N, p]; order: int64 [N, m]; values: float64 [N, m].
        check_indices: as in :func:`mask_apply`.

    Picks the largest score, ties to the lowest feature id; writes order/values,
    clears the feature in ``present`` and removes it from ``remaining`` (the last
    entry moves into its slot).
    """
    call("backselect_update", scores, rows, counts, steps, remaining, present, order, values, check_indices)


def exact_candidates(
    base: torch.Tensor,
    baseline: torch.Tensor,
    feature_map: torch.Tensor,
    present: torch.Tensor,
    remaining: torch.Tensor,
    sched: torch.Tensor,
    out: torch.Tensor,
    check_indices: bool = True,
    held: torch.Tensor | None = None,
    snap: torch.Tensor | None = None,
    version: torch.Tensor | None = None,
) -> None:
    """Write the candidates of one batch of the exact SIS step loop into ``out``.

    Args:
        base, baseline, feature_map: as in :func:`mask_apply` (images [N, *D]).
        present: bool [N, p], each image's present features (candidate b uses row ``sched[0, b]``).
        remaining: int64 [N, S], each image's present features as a compact list (-1 past the end).
        sched: int64 [>= 2, B] with contiguous rows: ``sched[0, b]`` the image, ``sched[1, b]`` the slot in the
            flat ``remaining`` (candidate b masks ``remaining.view(-1)[sched[1, b]]``; -1 in that table masks
            nothing); a slot < 0 is a padding row (the image's current input).
        out: [B, *D] in base's dtype, device and memory format, overwritten.
        check_indices: as in :func:`mask_apply`.
        held, snap, version: the row memo, all three or none: what each row of ``out`` holds, so that a kernel
            may rewrite only the elements that changed since the row was written (the CPU kernel does; on a step
            loop whose batches line up with the previous ones, a row changes in a few features). ``held`` int64
            [3, B]: per row the image, the removed feature (-1: none) and the image's snapshot version it was
            written from (image -1: unknown content); ``snap`` bool [N, p]: per image the present row of its
            latest snapshot; ``version`` int64 [N]. Every implementation updates them alike: an image of the
            batch whose present row differs from ``snap`` gets ``version + 1`` and ``snap`` = its present row;
            ``held[:, b]`` = (image, removed feature, the image's version). Start with ``held[0] = -1``, keep the
            images and baseline unchanged while it is in use, and reset ``held[0]`` to -1 when anything else
            writes into ``out``.
    """
    call("exact_candidates", base, baseline, feature_map, present, remaining, sched, out, check_indices, held, snap,
         version)


def exact_scores(
    probs: torch.Tensor,
    targets: torch.Tensor,
    sched: torch.Tensor,
    done: torch.Tensor,
    scores: torch.Tensor,
    total: torch.Tensor,
    remaining: torch.Tensor,
    present: torch.Tensor,
    order: torch.Tensor,
    values: torch.Tensor,
    check_indices: bool = True,
) -> None:
    """Record one batch's scores and finish the backward-selection steps it completes, in place.

    Args:
        probs: floating [B, K], the batch's class probabilities.
        targets: int64 [N], each image's target class.
        sched: int64 [>= 2, B] as in :func:`exact_candidates`: f[b] = ``probs[b, targets[sched[0, b]]]`` (as float64)
            is written to ``scores.view(-1)[sched[1, b]]`` (padding rows, slot < 0, are skipped).
        done: int64 [3, D] with contiguous rows: (row, count, step) of each step the batch completes, as in
            :func:`backselect_update`; entries with row < 0 are padding (skipped).
        scores: float64 [N, S]; total: float64 scalar, made NaN once a written f is not finite (0 otherwise).
        remaining, present, order, values: as in :func:`backselect_update`.
        check_indices: as in :func:`mask_apply`.
    """
    call("exact_scores", probs, targets, sched, done, scores, total, remaining, present, order, values, check_indices)


def schedule_window(
    segments: torch.Tensor,
    count: torch.Tensor,
    step: torch.Tensor,
    full: torch.Tensor,
    sizes: torch.Tensor,
    batch_size: int,
    stride: int,
    rescore: int,
    stop_at_round_end: bool,
    max_batches: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact SIS step loop's schedule for up to ``max_batches`` batches, on the host.

    Args:
        segments: int64 [4, S], the queue (image, start slot, stop slot, tag: 0 a step, 1 a round's input, 2 a
            low-precision step), in order.
        count, step: int64 [N], each image's candidate count and step index, advanced in place.
        full: bool [N], images whose steps run in the full dtype (see ``rescore``).
        sizes: int64 [Z] ascending, the batch shapes (a batch of r rows is padded to the smallest that holds it).
        batch_size: slots per batch; stride: slots per image row (p + 1); rescore: K of low precision (0: none), a
            step with more than K candidates of an image not ``full`` is tagged 2; stop_at_round_end: end the
            window after a batch in which a round ends; max_batches: at most this many batches.

    Returns:
        (records int64 [sum 6 * Bp]: each batch's block [6, Bp] (image, slot, done row, count, step, tag),
        batches int64 [W, 5]: (offset into records, Bp, rows, first completion, completions),
        done int64 [D, 5]: (batch, image, tag, count, step before it) of each completed segment in queue order,
        the segments left int64 [4, S']).
    """
    return call("schedule_window", segments, count, step, full, sizes, batch_size, stride, rescore,
                stop_at_round_end, max_batches)
