"""Counts of the aten ops a job dispatches outside its model: how a CPU shows what a GPU would wait for.

On a GPU every op a loop dispatches from Python is a kernel launch, and each launch costs the host a few
microseconds whatever the op's size. A loop whose forward calls are each surrounded by many small ops runs at the
speed of its host, not of the GPU. The same ops are dispatched on the CPU, so counting them there tells, without a
GPU, how much host work a method adds around each forward call.

:func:`counting_ops` counts every aten op dispatched while its block runs (a ``TorchDispatchMode``) and tells the
model's own ops from the others: an op runs inside the model while one of the model's forward calls is under way
(forward hooks), or while autograd's engine runs a backward node of the model's graph. It also records each
forward call's batch shape::

    with counting_ops(model) as ops:
        fast_sis(model, images, 0.9)
    print(ops.outside_per_call, ops.shapes)

Replayed CUDA graphs dispatch no aten op and call no hook: count on the CPU, or with graphs off.
"""
from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import model_state

# Ops that only describe tensors (no kernel on any device): not counted
_FREE = frozenset({"detach", "alias", "view", "_unsafe_view", "t", "expand", "unsqueeze", "squeeze", "permute",
                   "transpose", "slice", "select", "as_strided", "split", "split_with_sizes", "unbind", "narrow",
                   "_reshape_alias", "reshape", "lift_fresh", "sym_size", "sym_stride", "sym_numel", "is_same_size",
                   "sym_storage_offset", "dim", "size", "stride", "numel", "is_contiguous",
                   "resolve_conj", "resolve_neg"})  # (these two return their input unless a lazy bit is set)


@dataclass
class OpCounts:
    """What :func:`counting_ops` saw.

    Attributes:
        outside: aten ops dispatched outside the model's forward calls and backward passes (views excluded).
        inside: aten ops of the model's own forward calls and of the backward passes through its graph.
        forward_calls: calls of the model's forward (each a batch).
        rows: rows of all forward calls together.
        shapes: the distinct input shapes of the forward calls.
        by_op: ``outside`` by op name (for finding what to remove).
    """

    outside: int = 0
    inside: int = 0
    forward_calls: int = 0
    rows: int = 0
    shapes: set = field(default_factory=set)
    by_op: collections.Counter = field(default_factory=collections.Counter)

    @property
    def outside_per_call(self) -> float:
        """Ops outside the model per forward call (inf when the model was never called)."""
        return self.outside / self.forward_calls if self.forward_calls else float("inf")


class _Counter(TorchDispatchMode):
    def __init__(self, counts: OpCounts, depth: list):
        super().__init__()
        self.counts, self.depth = counts, depth

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in _FREE:
            if self.depth[0] > 0 or torch._C._current_autograd_node() is not None:
                self.counts.inside += 1
            else:
                self.counts.outside += 1
                self.counts.by_op[name] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting_ops(model: torch.nn.Module):
    """Count the aten ops dispatched in this thread while the block runs, inside and outside ``model``.

    Args:
        model: the ``torch.nn.Module`` whose forward calls (hooks) and backward nodes count as its own, and so do
            those of a copy made of it for the job (:func:`~overinterp_fast.runtime.model_state.made_from`).

    Yields:
        :class:`OpCounts`, filled when the block ends.
    """
    counts, depth, entered = OpCounts(), [0], []  # entered: the calls of the model (or its copies) under way

    def enter(module, args):
        if not model_state.made_from(module, model):
            return
        entered.append(module)
        depth[0] += 1
        if depth[0] == 1:
            counts.forward_calls += 1
            if args and torch.is_tensor(args[0]):
                counts.rows += int(args[0].shape[0])
                counts.shapes.add(tuple(args[0].shape))

    def leave(module, args, out):
        if entered and entered[-1] is module:  # the call enter() counted ends (checked once, at its start)
            entered.pop()
            depth[0] -= 1

    # global hooks: the calls of a copy made of the model for the job (its channels_last copy) are the model's too
    hooks = torch.nn.modules.module
    handles = [hooks.register_module_forward_pre_hook(enter), hooks.register_module_forward_hook(leave,
                                                                                                 always_call=True)]
    try:
        with _Counter(counts, depth):
            yield counts
    finally:
        for h in handles:
            h.remove()
