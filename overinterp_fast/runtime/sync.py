"""Every read of device values by the host, in one counted function.

A read of a CUDA tensor by the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``) makes the host wait
until every kernel queued before it has run. In a loop of short steps, one such wait per step leaves the GPU idle
between steps, and the loop runs at the speed of the host. So the step loops (exact SIS, batched-gradient SIS)
read device values only through :func:`to_host`, once per round, and tests count the calls: a read added inside a
step shows as a count that grows with the number of features.

Example::

    with counting() as reads:
        fast_sis(model, images, 0.9)
    print(reads.count)
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

import torch

_local = threading.local()


@dataclass
class HostReads:
    """How many times :func:`to_host` ran (``count``) and how many tensors it moved (``tensors``), per label."""

    count: int = 0
    tensors: int = 0
    by_label: dict[str, int] = field(default_factory=dict)


def _counters() -> list[HostReads]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextlib.contextmanager
def counting():
    """Count the calls of :func:`to_host` in this thread while the block runs (nested blocks each count)."""
    reads = HostReads()
    stack = _counters()
    stack.append(reads)
    try:
        yield reads
    finally:
        stack.remove(reads)


def reading() -> bool:
    """True while :func:`to_host` is copying (tests tell its reads from stray ones by this)."""
    return getattr(_local, "inside", False)


def to_host(*tensors: torch.Tensor, label: str = "") -> tuple[torch.Tensor, ...]:
    """CPU copies of ``tensors``, with one wait for the device at most.

    Args:
        tensors: tensors on any devices (CPU tensors are returned as they are).
        label: what the read is for (counted per label by :func:`counting`).

    Returns:
        One CPU tensor per input, same shapes and dtypes. From CUDA the copies go into pinned memory without
        blocking, and the host waits once for the current stream of each device involved.
    """
    for reads in _counters():
        reads.count += 1
        reads.tensors += len(tensors)
        reads.by_label[label] = reads.by_label.get(label, 0) + 1
    _local.inside = True
    # This is the one sanctioned wait of the loops: under torch.cuda.set_sync_debug_mode("error") (tests of the
    # loops) it must not count as a stray synchronisation.
    try:
        with sanctioned_wait():
            return _copy_to_host(tensors)
    finally:
        _local.inside = False


@contextlib.contextmanager
def sanctioned_wait():
    """Inside, ``torch.cuda.set_sync_debug_mode`` is off (restored after): for the few waits that are meant,
    :func:`to_host` and the kernels' one-off self-checks, which a user's "warn" or "error" mode must not flag or
    break."""
    debug = torch.cuda.get_sync_debug_mode() if torch.cuda.is_available() else 0
    if debug:
        torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        if debug:
            torch.cuda.set_sync_debug_mode(debug)


def _copy_to_host(tensors) -> tuple[torch.Tensor, ...]:
    out, streams = [], {}
    for t in tensors:
        if t.device.type == "cpu":
            out.append(t)
        elif t.device.type == "cuda":
            host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            host.copy_(t, non_blocking=True)
            out.append(host)
            streams.setdefault(t.device, torch.cuda.current_stream(t.device))
        else:
            out.append(t.cpu())
    for stream in streams.values():
        stream.synchronize()
    return tuple(out)
