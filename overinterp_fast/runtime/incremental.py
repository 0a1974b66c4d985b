"""Incremental inference for exact SIS (docs: algorithms.md, Incremental inference; after Krypton, Nakandala et al. 2019).

Every candidate of a backward-selection step differs from the step's current input in
one feature. The current input of each image is run once (the *base run*) and every
activation is kept. A candidate then recomputes, layer by layer, only the window of
each map that the masked feature can reach, reading the rest from the stored
activations through the ``patch_gather`` kernel. Windows have one size per layer for
all candidates (the largest reach over all features, shifted inside the map), so a
batch of candidates from any images and steps runs as plain batched tensor ops.

The model graph comes from ``torch.fx``. Per node of the graph:

- *window ops* (Conv2d of any stride, padding, dilation and groups, timm's Conv2dSame,
  MaxPool2d, AvgPool2d, strided slicing ``x[:, :, ::s, ::s]``) gather their input
  region (the output window grown by kernel, stride, padding and dilation; outside
  the map the op's own padding value) and run the op without padding on it;
- *pointwise ops* (BatchNorm in eval mode, activations, arithmetic with constants,
  channel padding) run on the window as it is;
- *merges* (sums and products of same-size maps, ``cat`` along channels) gather
  their inputs on the hull of their windows;
- *global average pooling* adds the change inside the window to the stored mean;
- anything else is *dense*: its inputs are written back into full maps and it runs
  on them, and so does everything after it that depends on it.

Each node also keeps, per candidate, the box where its values can differ from the
stored ones (the feature's reach) and whether they do: ``patch_gather`` reports when
every patch value it reads equals the stored one. A change that dies out (the feature
already equals the mask value; an activation clips it) then stops there, and a
candidate whose change died scores exactly the base run's f of its image.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from ..ops import kernels as _ops
from ..ops.pure import check_ranges
from . import model_state, runinfo
from .inputs import Prepared
from .model import ModelFn
from .schedule import upload

logger = logging.getLogger(__name__)

# incremental=None: plans whose estimated work per candidate (multiply-adds) exceeds this fraction of a
# dense forward pass are not considered; the others are timed against the dense engine (engines.py).
AUTO_MEASURE_MAX_COST_RATIO = 1.0
# Where nothing is timed (a job too small to calibrate, or the user's batch_size), the estimate decides:
# on below this fraction.
AUTO_MAX_COST_RATIO = 0.5
# Images whose activations the timing probe stores (its rows cycle through them).
_PROBE_IMAGES = 8
# Candidate-state elements per call (CPU); the batch holds this many / the largest state.
_ELEMENTS_PER_CALL = 1 << 20
# The input windows of every feature are kept as tables up to this many elements (else gathered per call).
_INPUT_WINDOW_ELEMENTS = 1 << 22

_POINTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.SiLU, nn.Sigmoid, nn.Hardswish, nn.Hardsigmoid, nn.GELU, nn.Tanh, nn.LeakyReLU,
    nn.Hardtanh, nn.ELU, nn.Mish, nn.Softplus, nn.Identity, nn.Dropout, nn.Dropout2d,
)
_POINTWISE_FUNCTIONS = {
    torch.relu, F.relu, F.relu6, torch.sigmoid, F.sigmoid, F.silu, F.hardswish, F.hardsigmoid, F.gelu, torch.tanh,
    F.tanh, F.leaky_relu, F.hardtanh, F.elu, F.mish, F.softplus, torch.clamp, torch.clip, F.dropout,
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg,
    torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.exp, torch.square,
}
_POINTWISE_METHODS = {
    "relu", "sigmoid", "tanh", "clamp", "clip", "add", "sub", "mul", "div", "neg", "exp", "square",
    "contiguous", "clone", "float", "double", "half", "to",
}
_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub, torch.mul, torch.div,
           "add", "sub", "mul", "div"}
_INPLACE = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.itruediv: operator.truediv}
_METADATA_ATTRS = {"ndim", "dtype", "device", "is_cuda"}


class _Tracer(fx.Tracer):
    """symbolic_trace, with timm's TF-"same" padded layers kept whole (their padding depends on the input size)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return type(m).__name__ in ("Conv2dSame",) or super().is_leaf_module(m, qualname)


def trace(model: nn.Module) -> fx.GraphModule:
    """The model's fx graph (raises whatever fx raises when it cannot be traced)."""
    return fx.GraphModule(model, _Tracer().trace(model))


# ---------------------------------------------------------------------------------------------
# Geometry: per feature, the box of each map whose values can change, and the window holding it.


@dataclass
class Geometry:
    """Where a map can change, per feature.

    height, width: the map. wh, ww: the window size (the same for every candidate).
    table: int64 [p + 1, 6]: (start_y, start_x, y0, x0, y1, x1): the window's top-left and
    the box (half-open) where the feature can change the map; row p is "no feature" (empty box).
    """

    height: int
    width: int
    wh: int
    ww: int
    table: torch.Tensor

    @property
    def full(self) -> bool:
        return self.wh == self.height and self.ww == self.width


def _geometry(box: torch.Tensor, height: int, width: int) -> Geometry:
    """Window geometry from the boxes [p, 4] (y0, x0, y1, x1) where each feature can change a map."""
    box = box.clone()
    box[:, 0::2] = box[:, 0::2].clamp(0, height)
    box[:, 1::2] = box[:, 1::2].clamp(0, width)
    empty = (box[:, 2] <= box[:, 0]) | (box[:, 3] <= box[:, 1])
    box[empty] = 0
    wh = max(1, int((box[:, 2] - box[:, 0]).max()))
    ww = max(1, int((box[:, 3] - box[:, 1]).max()))
    start = torch.stack([box[:, 0].clamp(max=height - wh), box[:, 1].clamp(max=width - ww)], 1)
    table = torch.cat([start, box], 1)
    table = torch.cat([table, torch.zeros(1, 6, dtype=torch.int64)])  # row p: no feature
    return Geometry(height, width, wh, ww, table)


def _boxes(g: Geometry) -> torch.Tensor:
    return g.table[:-1, 2:]


def _grow(box: torch.Tensor, k, s, d, pad, out_h: int, out_w: int) -> torch.Tensor:
    """Output positions whose receptive field meets each input box: o*s - pad + j*d in [a, b) for some j < k."""
    out = torch.empty_like(box)
    for dim in (0, 1):
        a, b = box[:, dim], box[:, dim + 2]
        reach = (k[dim] - 1) * d[dim]
        lo = torch.div(a + pad[dim] - reach + s[dim] - 1, s[dim], rounding_mode="floor")
        hi = torch.div(b - 1 + pad[dim], s[dim], rounding_mode="floor") + 1
        out[:, dim], out[:, dim + 2] = lo, hi
    empty = (box[:, 2] <= box[:, 0]) | (box[:, 3] <= box[:, 1])
    out[empty] = 0
    return out


def _hull(boxes: list[torch.Tensor]) -> torch.Tensor:
    lo = torch.stack([b[:, :2] for b in boxes]).amin(0)
    hi = torch.stack([b[:, 2:] for b in boxes]).amax(0)
    return torch.cat([lo, hi], 1)


def feature_boxes(feature_map: torch.Tensor, p: int) -> torch.Tensor:
    """int64 [p, 4]: the bounding box (y0, x0, y1, x1), half-open, of each feature of a [C, H, W] map."""
    c, h, w = feature_map.shape
    fm = feature_map.reshape(-1).cpu()
    ys = torch.arange(h).view(1, h, 1).expand(c, h, w).reshape(-1)
    xs = torch.arange(w).view(1, 1, w).expand(c, h, w).reshape(-1)
    out = torch.empty(p, 4, dtype=torch.int64)
    for col, (v, how, add) in enumerate(((ys, "amin", 0), (xs, "amin", 0), (ys, "amax", 1), (xs, "amax", 1))):
        init = torch.full((p,), h * w if how == "amin" else -1, dtype=torch.int64)
        out[:, col] = init.scatter_reduce(0, fm, v, how, include_self=True) + add
    return out


# ---------------------------------------------------------------------------------------------
# The plan: each input-dependent node of the graph, classified.


@dataclass
class _Step:
    node: fx.Node
    kind: str  # "input", "window", "pointwise", "alias", "merge", "gap", "dense"
    fn: Callable | None = None  # window: f(region) -> out window; others: the node's callable
    geo: Geometry | None = None  # spatial outputs
    k: tuple = (1, 1)
    s: tuple = (1, 1)
    d: tuple = (1, 1)
    pad: tuple = (0, 0)
    pad_value: float = 0.0
    conv: nn.Conv2d | None = None  # window steps that are convolutions
    cost: float = 0.0  # multiply-adds per candidate (estimate)
    dense_cost: float = 0.0  # the same in a dense forward pass


def _call(node: fx.Node, gm: fx.GraphModule, modules: dict) -> Callable:
    """The node's computation as f(*args, **kwargs), with in-place variants replaced by out-of-place ones."""
    if node.op == "call_module":
        return modules[node.target]
    if node.op == "call_function":
        return _INPLACE.get(node.target, node.target)
    if node.op == "call_method":
        name = node.target
        if name.endswith("_") and not name.endswith("__"):
            name = name[:-1]
        return lambda obj, *a, **kw: getattr(obj, name)(*a, **kw)
    raise AssertionError(node.op)


def _kwargs(node: fx.Node) -> dict:
    kw = dict(node.kwargs)
    if kw.get("inplace"):
        kw["inplace"] = False
    return kw


def _out_of_place(mod: nn.Module) -> nn.Module:
    if getattr(mod, "inplace", False):
        mod = copy.copy(mod)
        mod.inplace = False
    return mod


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _same_pad(size: int, k: int, s: int, d: int) -> int:
    """Top/left padding of TF "same" convolution (timm's pad_same)."""
    return max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0) // 2


def _window_op(mod_or_node, target, args, in_shape) -> dict | None:
    """Window-op parameters of a call (None if it is not one we can window)."""
    if isinstance(target, nn.Conv2d):
        m = target
        if m.padding_mode != "zeros":
            return None
        k, s, d = _pair(m.kernel_size), _pair(m.stride), _pair(m.dilation)
        if type(m).__name__ == "Conv2dSame":
            pad = tuple(_same_pad(in_shape[2 + i], k[i], s[i], d[i]) for i in (0, 1))
        elif isinstance(m.padding, str):
            if m.padding == "valid":
                pad = (0, 0)
            else:  # "same" (stride 1): torch pads total d*(k-1), the smaller half on the left/top
                pad = tuple(d[i] * (k[i] - 1) // 2 for i in (0, 1))
        else:
            pad = _pair(m.padding)
        fn = lambda x, m=m: F.conv2d(x, m.weight, m.bias, m.stride, 0, m.dilation, m.groups)  # noqa: E731
        cost = m.in_channels // m.groups * m.out_channels * k[0] * k[1]
        return dict(fn=fn, k=k, s=s, d=d, pad=pad, pad_value=0.0, unit_cost=cost, conv=m)
    if isinstance(target, (nn.MaxPool2d, nn.AvgPool2d)):
        m = target
        if m.ceil_mode or getattr(m, "return_indices", False):
            return None
        k = _pair(m.kernel_size)
        s = _pair(m.stride if m.stride is not None else m.kernel_size)
        pad = _pair(m.padding)
        if isinstance(m, nn.MaxPool2d):
            d = _pair(m.dilation)
            fn = lambda x, m=m, k=k, s=s, d=d: F.max_pool2d(x, k, s, 0, d)  # noqa: E731
            return dict(fn=fn, k=k, s=s, d=d, pad=pad, pad_value=-math.inf, unit_cost=k[0] * k[1])
        if pad != (0, 0) and not m.count_include_pad:
            return None
        fn = lambda x, m=m, k=k, s=s: F.avg_pool2d(x, k, s, 0, False, True, m.divisor_override)  # noqa: E731
        return dict(fn=fn, k=k, s=s, d=(1, 1), pad=pad, pad_value=0.0, unit_cost=k[0] * k[1])
    if target is operator.getitem and len(args) == 2 and isinstance(args[1], tuple) and len(args[1]) == 4:
        idx = args[1]
        if not all(isinstance(i, slice) for i in idx) or idx[0] != slice(None):
            return None
        steps = []
        for sl in idx[2:]:
            if sl.start not in (None, 0) or sl.stop is not None or (sl.step or 1) < 1:
                return None
            steps.append(sl.step or 1)
        ch = idx[1]
        fn = lambda x, ch=ch, sy=steps[0], sx=steps[1]: x[:, ch, ::sy, ::sx]  # noqa: E731
        return dict(fn=fn, k=(1, 1), s=tuple(steps), d=(1, 1), pad=(0, 0), pad_value=0.0, unit_cost=0)
    return None


def _is_gap(target, args, kwargs, in_shape) -> bool:
    """Global average pooling over H and W."""
    if isinstance(target, nn.AdaptiveAvgPool2d):
        return _pair(target.output_size) == (1, 1)
    if target is F.adaptive_avg_pool2d:
        size = args[1] if len(args) > 1 else kwargs.get("output_size")
        return size is not None and _pair(size) == (1, 1)
    if target in (torch.mean, "mean"):
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is None or isinstance(dim, int) or kwargs.get("dtype") is not None:
            return False
        return sorted(d % 4 for d in dim) == [2, 3]
    return False


def _const_ok(v) -> bool:
    """A constant that is the same at every position of a map (so pointwise ops can run on windows)."""
    if not isinstance(v, torch.Tensor):
        return True
    if v.numel() == 1:
        return True
    return v.dim() >= 3 and v.shape[-1] == 1 and v.shape[-2] == 1 and (v.dim() < 4 or v.shape[0] == 1)


class IncrementalPlan:
    """A model traced and classified for incremental evaluation of single-feature candidates.

    Built by :func:`plan`; ``cost_ratio`` estimates a candidate's work against a dense forward pass.
    """

    def __init__(self, gm: fx.GraphModule, steps: list[_Step], calls: dict, consts: dict, output: fx.Node,
                 input_geo: Geometry, last_use: dict, cost_ratio: float, state_elems: int, device):
        self.gm = gm
        self.geo = {st.node: st.geo for st in steps if st.geo is not None}
        # the node's full computation (base runs); constants' nodes return their value
        self.calls = _CallsWithConsts(calls, consts)
        self.steps = steps
        self.consts = consts
        self.output = output
        self.input_geo = input_geo
        self.last_use = last_use
        self.cost_ratio = cost_ratio
        self.state_elems = state_elems
        # every node's table side by side, and each window op's region origin (its window's start times the
        # stride, less the padding): a call gathers one row per candidate for all of them (table_cols: node ->
        # first column of its 6; region_cols: window node -> first column of its 2)
        parts, at = [], 0
        self.table_cols: dict[fx.Node, int] = {}
        self.region_cols: dict[fx.Node, int] = {}
        for st in steps:
            if st.geo is None:
                continue
            parts.append(st.geo.table)
            self.table_cols[st.node], at = at, at + 6
            if st.kind == "window":
                start = st.geo.table[:, :2]
                parts.append(start * torch.tensor(st.s) - torch.tensor(st.pad))
                self.region_cols[st.node], at = at, at + 2
        self.table_all = torch.cat(parts, 1).contiguous().to(device)

    def batch_size(self) -> int:
        """Candidates per call: a budget of candidate-state elements over the largest state of one candidate."""
        return int(min(max(_ELEMENTS_PER_CALL // max(self.state_elems, 1), 16), 4096))

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for st in self.steps:
            kinds[st.kind] = kinds.get(st.kind, 0) + 1
        first_dense = next((st.node.name for st in self.steps if st.kind == "dense"), None)
        return (f"incremental plan: {kinds}, estimated work {self.cost_ratio:.2f}x a dense pass, "
                f"dense from {first_dense!r}")


def _run_graph(gm: fx.GraphModule, x: torch.Tensor, calls: dict, keep: Callable[[fx.Node], bool]) -> tuple[Any, dict]:
    """Run the graph on x node by node; returns (output, {node: value} for nodes where keep(node))."""
    env: dict[fx.Node, Any] = {}
    kept = {}
    out = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = x
        elif node.op == "get_attr":
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            env[node] = obj
        elif node.op == "output":
            out = fx.node.map_arg(node.args[0], lambda n: env[n])
            break
        else:
            args = fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = fx.node.map_arg(_kwargs(node), lambda n: env[n])
            env[node] = calls[node](*args, **kwargs)
        if keep(node):
            kept[node] = env[node]
    return out, kept


class NotIncremental(Exception):
    """The model cannot be evaluated incrementally; the message says why."""


def plan(fn: ModelFn, prep: Prepared) -> IncrementalPlan:
    """Trace ``fn.model`` and build the incremental plan for these inputs; raises NotIncremental with the reason."""
    images = prep.images
    gm, nodes, x0, output = _traced(fn.model, images)
    modules = {name: _out_of_place(m) for name, m in gm.named_modules()}
    calls = {n: _call(n, gm, modules) for n in nodes if n.op in ("call_module", "call_function", "call_method")}

    # Trial run on one image: shapes, and the values of nodes that do not depend on the input.
    try:
        with torch.inference_mode():
            out, values = _run_graph(gm, images[:1], calls, keep=lambda n: True)
    except Exception as exc:  # e.g. an exported program's guard on the batch size: the dense path says it plainly
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise NotIncremental(f"the traced model fails on one image ({type(exc).__name__}: {first})") from None
    dependent = {x0}
    for n in nodes:
        if n.op not in ("placeholder", "get_attr", "output") and any(a in dependent for a in n.all_input_nodes):
            dependent.add(n)

    consts = {n: v for n, v in values.items() if n not in dependent}
    planner = _Planner(values, dependent, consts, calls, modules)
    input_geo = _geometry(feature_boxes(prep.feature_map, prep.num_features), images.shape[2], images.shape[3])
    planner.kind[x0], planner.geo[x0] = "input", input_geo
    planner.steps.append(_Step(x0, "input", geo=input_geo))
    planner.state_elems = images.shape[1] * input_geo.wh * input_geo.ww
    for n in nodes:
        if n not in dependent or n.op == "placeholder":
            continue
        step = planner.classify(n)
        if step is not None:
            planner.add(step)

    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise NotIncremental("the model's output is not a [B, K] tensor")
    steps = planner.steps
    _fold_batch_norms(steps, values, dependent, consts, modules)
    last_use: dict[fx.Node, int] = {}
    for i, st in enumerate(steps):
        for a in st.node.all_input_nodes:
            last_use[a] = i
    ratio = planner.inc_total / max(planner.dense_total, 1.0)
    return IncrementalPlan(gm, steps, calls, consts, output.args[0], input_geo, last_use, ratio,
                           planner.state_elems, images.device)


def _traced(model, images: torch.Tensor) -> tuple[fx.GraphModule, list[fx.Node], fx.Node, fx.Node]:
    """The model traced for images [N, C, H, W]: (graph module, its nodes, its one input, its output node);
    raises NotIncremental where it cannot be."""
    if images.dim() != 4:
        raise NotIncremental(f"inputs must be images [N, C, H, W], got {images.dim()}-D")
    if not isinstance(model, nn.Module):
        raise NotIncremental(f"the model is a {type(model).__name__}, not a torch.nn.Module")
    try:
        gm = trace(model)
    except Exception as exc:  # fx raises many kinds of errors on untraceable code
        raise NotIncremental(f"torch.fx cannot trace the model ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise NotIncremental(f"the traced model has {len(placeholders)} inputs; one is needed")
    output = next(n for n in nodes if n.op == "output")
    if not isinstance(output.args[0], fx.Node):
        raise NotIncremental("the model's output is not a single tensor")
    return gm, nodes, placeholders[0], output


@dataclass
class _Node:
    """An input-dependent node being classified, with its values on the trial image."""

    node: fx.Node
    val: Any
    dep_args: list[fx.Node]  # its inputs that depend on the input
    target: Any  # what it calls (a module, a function, or a method's name)
    args: Any  # its arguments' values
    kwargs: dict
    others_const: bool  # its other inputs are the same at every position of a map (batch norm's vectors allowed)


@dataclass
class _Planner:
    """What :func:`plan` knows while it classifies the nodes in graph order: the trial run's ``values``, the
    ``dependent`` nodes, the ``consts`` (values of the others, and metadata), each classified node's kind and
    geometry, the steps so far, their costs and the largest candidate state."""

    values: dict
    dependent: set
    consts: dict
    calls: dict
    modules: dict
    kind: dict = field(default_factory=dict)
    geo: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    state_elems: int = 0
    dense_total: float = 0.0
    inc_total: float = 0.0

    def spatial(self, n) -> bool:
        return self.kind.get(n) in ("input", "window", "pointwise", "alias", "merge")

    def add(self, step: _Step) -> None:
        n = step.node
        self.kind[n] = step.kind
        if step.geo is not None:
            self.geo[n] = step.geo
        self.steps.append(step)
        self.dense_total += step.dense_cost
        self.inc_total += step.cost

    def classify(self, n: fx.Node) -> _Step | None:
        """The step of input-dependent node ``n``; None where its value is the same for every candidate
        (it goes to ``consts``)."""
        values, dependent = self.values, self.dependent
        val = values[n]
        dep_args = [a for a in n.all_input_nodes if a in dependent]
        target = self.modules[n.target] if n.op == "call_module" else (
            _INPLACE.get(n.target, n.target) if n.op == "call_function" else n.target.rstrip("_"))
        arg_vals = fx.node.map_arg(n.args, lambda a: values[a])
        kw_vals = fx.node.map_arg(_kwargs(n), lambda a: values[a])
        # per-channel vectors of batch norm are fine; other constants must not vary over a map
        others_const = target is F.batch_norm or all(
            _const_ok(values[a]) for a in n.all_input_nodes if a not in dependent)
        step = None
        # metadata of a map that is the same for every candidate
        if (n.op == "call_function" and n.target is getattr and n.args[1] in _METADATA_ATTRS) or (
                n.op == "call_method" and n.target == "dim"):
            self.consts[n] = val
            return None
        if all(a in self.consts or a not in dependent for a in n.all_input_nodes) and not isinstance(val, torch.Tensor):
            self.consts[n] = val  # asserts and comparisons on metadata
            return None
        c = _Node(n, val, dep_args, target, arg_vals, kw_vals, others_const)
        if isinstance(val, torch.Tensor) and all(self.spatial(a) for a in dep_args) and dep_args:
            step = self._spatial_step(c)
        return step if step is not None else self._dense_step(c)

    def _spatial_step(self, c: _Node) -> _Step | None:
        """The step of a tensor node whose input-dependent inputs are all maps; None: it runs dense."""
        n, val, dep_args, target = c.node, c.val, c.dep_args, c.target
        in_shape = tuple(self.values[dep_args[0]].shape)
        if len(dep_args) == 1 and val.dim() == 4:
            w = _window_op(n, target, c.args, in_shape)
            if w is not None and n.op == "call_function" and n.target is not operator.getitem:
                w = None
            if w is not None:
                return self._window_step(c, w, in_shape)
            if (c.others_const and tuple(val.shape[2:]) == in_shape[2:] and in_shape[0] == val.shape[0] and (
                    isinstance(target, (*_POINTWISE_MODULES, nn.BatchNorm2d)) or target in _POINTWISE_FUNCTIONS
                    or target in _POINTWISE_METHODS or target is F.batch_norm
                    or (target is F.pad and _channel_pad(c.args, c.kwargs)))):
                if isinstance(target, nn.BatchNorm2d) and (target.training or target.running_mean is None):
                    return None
                if target is F.batch_norm and (c.args[5] if len(c.args) > 5 else c.kwargs.get("training")):
                    return None
                g = self.geo[dep_args[0]]
                # identities (and dropout in eval mode) pass the window on
                alias = isinstance(target, (nn.Identity, nn.Dropout, nn.Dropout2d)) and not target.training
                step = _Step(n, "alias" if alias else "pointwise", fn=self.calls[n], geo=g)
                step.cost = step.dense_cost = 0.0
                return step
            if _is_gap(target, c.args, c.kwargs, in_shape):
                return self._gap_step(c, in_shape)
            return None
        if len(dep_args) >= 2 and val.dim() == 4 and c.others_const:
            return self._merge_step(c)
        if len(dep_args) == 1 and _is_gap(target, c.args, c.kwargs, in_shape):
            return self._gap_step(c, in_shape)
        return None

    def _window_step(self, c: _Node, w: dict, in_shape: tuple) -> _Step:
        """A window op (convolution, pooling, strided slice): its output window grows from its input's."""
        val = c.val
        g_in = self.geo[c.dep_args[0]]
        box = _grow(_boxes(g_in), w["k"], w["s"], w["d"], w["pad"], val.shape[2], val.shape[3])
        g = _geometry(box, val.shape[2], val.shape[3])
        step = _Step(c.node, "window", fn=w["fn"], geo=g, k=w["k"], s=w["s"], d=w["d"], pad=w["pad"],
                     pad_value=w["pad_value"], conv=w.get("conv"))
        step.cost = w["unit_cost"] * g.wh * g.ww + val.shape[1] * g.wh * g.ww
        step.dense_cost = w["unit_cost"] * val.shape[2] * val.shape[3]
        reg = ((g.wh - 1) * w["s"][0] + (w["k"][0] - 1) * w["d"][0] + 1) * (
            (g.ww - 1) * w["s"][1] + (w["k"][1] - 1) * w["d"][1] + 1)
        step.cost += 2 * in_shape[1] * reg  # the gather
        self.state_elems = max(self.state_elems, in_shape[1] * reg, val[0].numel() * g.wh * g.ww // (
            val.shape[2] * val.shape[3]))
        return step

    def _gap_step(self, c: _Node, in_shape: tuple) -> _Step:
        """Global average pooling: the stored mean plus the window's change."""
        step = _Step(c.node, "gap", fn=self.calls[c.node])
        g = self.geo[c.dep_args[0]]
        step.cost = 4 * in_shape[1] * g.wh * g.ww
        return step

    def _merge_step(self, c: _Node) -> _Step | None:
        """Maps of the same size combined (a channel concatenation or a binary op): the hull of their windows;
        None where they are not such maps."""
        val, values = c.val, self.values
        shapes = [tuple(values[a].shape) for a in c.dep_args]
        is_cat = c.target in (torch.cat, torch.concat) and _cat_dim(c.args, c.kwargs) in (1, -3)
        same_map = all(len(sh) == 4 and sh[0] == val.shape[0] and sh[2:] == tuple(val.shape[2:])
                       for sh in shapes)
        if not (same_map and (is_cat or (c.target in _BINARY and all(sh == tuple(val.shape) for sh in shapes)))):
            return None
        box = _hull([_boxes(self.geo[a]) for a in c.dep_args])
        g = _geometry(box, val.shape[2], val.shape[3])
        step = _Step(c.node, "merge", fn=self.calls[c.node], geo=g)
        step.cost = sum(2 * values[a].shape[1] for a in c.dep_args) * g.wh * g.ww
        return step

    def _dense_step(self, c: _Node) -> _Step:
        """A node run densely on every candidate; its windowed inputs are written back into full maps."""
        val = c.val
        step = _Step(c.node, "dense", fn=self.calls[c.node])
        step.cost = step.dense_cost = _dense_cost(c.target, val)
        if isinstance(val, torch.Tensor) and val.dim() >= 1:
            self.state_elems = max(self.state_elems, val[0].numel())
        for a in c.dep_args:  # written back into full maps
            if self.spatial(a) and isinstance(self.values[a], torch.Tensor):
                step.cost += 2 * self.values[a][0].numel()
        return step


_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")


def _bn_params(node: fx.Node, modules: dict, consts: dict):
    """(mean, var, weight, bias, eps) of an eval-mode batch norm node, or None."""
    if node.op == "call_module":
        m = modules[node.target]
        if isinstance(m, nn.BatchNorm2d) and not m.training and m.running_mean is not None:
            return m.running_mean, m.running_var, m.weight, m.bias, m.eps
        return None
    if node.op == "call_function" and node.target is F.batch_norm:
        bound = dict(zip(_BN_ARGS, node.args))
        bound.update(node.kwargs)
        val = {k: (consts[v] if isinstance(v, fx.Node) else v) for k, v in bound.items() if k != "input"}
        if val.get("training", False):
            return None
        return val["running_mean"], val["running_var"], val.get("weight"), val.get("bias"), val.get("eps", 1e-5)
    return None


def _fold_batch_norms(steps: list[_Step], values: dict, dependent: set, consts: dict, modules: dict) -> None:
    """A batch norm right after a windowed convolution (its only reader) is folded into the convolution's
    window computation: one op less per layer; the batch norm step then passes the window on ("alias")."""
    by_node = {st.node: st for st in steps}
    for st in steps:
        if st.kind != "pointwise":
            continue
        params = _bn_params(st.node, modules, consts)
        if params is None:
            continue
        (src,) = [a for a in st.node.all_input_nodes if a in dependent] or [None]
        conv_step = by_node.get(src)
        if conv_step is None or conv_step.kind != "window" or conv_step.conv is None:
            continue
        readers = [u for u in src.users if u in dependent and u not in consts]
        if readers != [st.node]:
            continue
        mean, var, weight, bias, eps = params
        m = conv_step.conv
        scale = torch.rsqrt(var + eps) * (weight if weight is not None else 1.0)
        w = m.weight * scale.view(-1, 1, 1, 1)
        b = (m.bias if m.bias is not None else torch.zeros_like(mean)) - mean
        b = b * scale + (bias if bias is not None else 0.0)
        conv_step.fn = lambda x, m=m, w=w, b=b: F.conv2d(x, w, b, m.stride, 0, m.dilation, m.groups)  # noqa: E731
        st.kind = "alias"


def _channel_pad(args, kwargs) -> bool:
    """F.pad that pads only the channel dimension of a 4-D map, in any mode (each position is padded on its
    own, so a window pads as the whole map does). torch.fx passes ``pad`` second, the mode by keyword."""
    pad = args[1] if len(args) > 1 else kwargs.get("pad")
    return len(pad) == 6 and tuple(pad[:4]) == (0, 0, 0, 0)


def _cat_dim(args, kwargs) -> int:
    return args[1] if len(args) > 1 else kwargs.get("dim", 0)


def _dense_cost(target, val) -> float:
    """Multiply-adds of a node run densely (convolutions and linear layers; other ops count their outputs)."""
    if isinstance(target, nn.Conv2d) and isinstance(val, torch.Tensor):
        k = target.kernel_size
        return target.in_channels // target.groups * target.out_channels * k[0] * k[1] * val.shape[2] * val.shape[3]
    if isinstance(target, nn.Linear):
        return target.in_features * target.out_features
    if isinstance(val, torch.Tensor) and val.dim() >= 1:
        return float(val[0].numel())
    return 0.0


# ---------------------------------------------------------------------------------------------
# Evaluation.


@dataclass
class _Win:
    """A map of a batch of candidates: its window (the rest is stored) and whether it differs from the stored map."""

    patch: torch.Tensor  # [B, C, wh, ww]
    chg: torch.Tensor  # bool [B]


@dataclass
class _Dense:
    value: Any  # per candidate, e.g. [B, ...]
    chg: torch.Tensor  # bool [B]


class IncrementalEngine:
    """Scores single-feature candidates of the current inputs incrementally; see the module docstring.

    ``base(rows, x)`` runs the current inputs x [R, C, H, W] of rows ``rows`` and stores
    their activations; ``score(rows, features, targets)`` scores candidates (row b with
    feature ``features[b]`` also masked; -1: none) as float64 [B]. Neither reads anything from the device,
    except ``score``'s index check (``check_indices=True``, one read per call), which callers whose indices were
    checked where they were made turn off.
    """

    def __init__(self, pl: IncrementalPlan, fn: ModelFn, prep: Prepared, n_rows: int):
        self.pl = pl
        self.fn = fn
        self.prep = prep
        self.p = prep.num_features
        self.stored: dict[fx.Node, torch.Tensor] = {}
        self.n_rows = n_rows
        self.base_scores = None
        self._keep = {st.node for st in pl.steps if st.kind in ("input", "window", "pointwise", "alias", "merge",
                                                                  "gap")}
        self.fm = prep.feature_map.unsqueeze(0)  # [1, C, H, W] int64: gathered like a map
        self.baseline = prep.baseline
        if prep.images.is_contiguous(memory_format=torch.channels_last) and not prep.images.is_contiguous():
            self.fm = self.fm.contiguous(memory_format=torch.channels_last)
        self.input_windows = self._input_windows(pl, prep)

    def _input_windows(self, pl: IncrementalPlan, prep: Prepared) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per feature (row p: none), where the feature lies in its input window (bool [p + 1, C, wh, ww]) and the
        baseline there (the baseline's dtype), when the baseline is shared by every image and the tables stay
        small; else None (both are gathered per call)."""
        if self.baseline.shape[0] != 1:
            return None
        g, c = pl.input_geo, prep.images.shape[1]
        if (self.p + 1) * c * g.wh * g.ww > _INPUT_WINDOW_ELEMENTS:
            return None
        start = g.table[:, :2].to(prep.images.device)
        feats = torch.arange(self.p + 1, device=start.device)
        first, none = torch.zeros_like(feats), start.new_zeros(self.p + 1, 4)
        window = lambda src: _ops.patch_gather(src, first, None, start, none, start, g.wh, g.ww, 0.0, False)[0]  # noqa: E731
        return window(self.fm) == feats.view(-1, 1, 1, 1), window(self.baseline)

    # -- base run
    def base(self, rows: torch.Tensor, x: torch.Tensor, targets: torch.Tensor, every_row: bool = False) -> None:
        """Run the current inputs x [R, *D] of ``rows`` and store their activations and f. ``every_row``: the
        caller knows that ``rows`` is 0, 1, ..., n_rows - 1 in order; the outputs then become the stored maps,
        without a copy."""
        out, kept = _run_graph(self.pl.gm, x, self.pl.calls, keep=lambda n: n in self._keep)
        out = self.fn.check_output(out, x.shape[0], x.device)
        f = self.fn.probabilities(out).gather(1, targets.view(-1, 1)).view(-1).double()
        for node, v in kept.items():
            if every_row:  # this run's own output (ops run out of place): kept as the stored map; a later
                # partial run writes its rows into it, with values consistent with every view of it
                self.stored[node] = v
            else:
                if node not in self.stored:
                    self.stored[node] = v.new_zeros((self.n_rows, *v.shape[1:])).contiguous(
                        memory_format=_format(v))
                self.stored[node][rows] = v
        if every_row:
            self.base_scores = f
            return
        if self.base_scores is None:
            self.base_scores = torch.zeros(self.n_rows, dtype=torch.float64, device=x.device)
        self.base_scores[rows] = f

    # -- candidates
    def check(self, rows: torch.Tensor, features: torch.Tensor) -> None:
        """The range check of :meth:`score`'s indices (one device read on CUDA)."""
        check_ranges("incremental score", [(rows, 0, self.n_rows, "row"), (features, -1, self.p, "feature")])

    def score(self, rows: torch.Tensor, features: torch.Tensor, targets: torch.Tensor,
              check_indices: bool = True) -> torch.Tensor:
        pl, p = self.pl, self.p
        if check_indices:  # once here: every gather below reads rows of the stored maps by these indices
            self.check(rows, features)
        fidx = torch.where(features < 0, torch.full_like(features, p), features)
        tab = pl.table_all.index_select(0, fidx)  # one gather for every node's window and region
        run = _ScoreRun(self, rows, features, fidx, {node: tab[:, c: c + 6] for node, c in pl.table_cols.items()},
                        {node: tab[:, c: c + 2] for node, c in pl.region_cols.items()})
        for i, st in enumerate(pl.steps):
            node = st.node
            run.states[node] = _STEP_RUNS.get(st.kind, _ScoreRun.dense)(run, st)
            for a in node.all_input_nodes:  # free what no later step reads
                if pl.last_use.get(a) == i and a is not pl.output:
                    run.states.pop(a, None)
                    run.dense_maps.pop(a, None)
        out_state = run.states[pl.output]
        out = run.full(pl.output) if isinstance(out_state, _Win) else out_state.value
        out = self.fn.check_output(out, rows.shape[0], rows.device)
        f = self.fn.probabilities(out).gather(1, targets.view(-1, 1)).view(-1).double()
        return torch.where(out_state.chg, f, self.base_scores[rows])


@dataclass
class _ScoreRun:
    """One :meth:`IncrementalEngine.score` call while its steps run: the candidates (``rows`` [B] with
    ``features`` [B] also masked), each node's window box per candidate (``boxes``: int64 [B, 4]), the
    state of each live node (``_Win`` or ``_Dense``) and full maps already written back."""

    engine: IncrementalEngine
    rows: torch.Tensor
    features: torch.Tensor
    fidx: torch.Tensor  # the features' table rows (p: none)
    boxes: dict
    regions: dict  # window node -> int64 [B, 2]: the origin of the input region its window reads
    states: dict = field(default_factory=dict)
    dense_maps: dict = field(default_factory=dict)

    def valid(self, node, chg):
        return self.boxes[node][:, 2:] * chg.view(-1, 1)

    def gather(self, node, origin, h, w, pad_value=0.0, with_patch=True):
        st = self.states[node]
        return _ops.patch_gather(self.engine.stored[node], self.rows, st.patch if with_patch else None,
                                 self.boxes[node][:, :2], self.valid(node, st.chg), origin, h, w, pad_value, False)

    def full(self, node):
        """The map of ``node`` per candidate: its window written back over the stored map."""
        if node not in self.dense_maps:
            h, w = self.engine.stored[node].shape[2:]
            self.dense_maps[node] = self.gather(node, torch.zeros_like(self.boxes[node][:, :2]), h, w)[0]
        return self.dense_maps[node]

    def value_of(self, a):
        consts = self.engine.pl.consts
        if a in consts:
            return consts[a]
        s = self.states[a]
        if isinstance(s, _Win):
            return self.full(a)
        return s.value

    def _only_input(self, node):
        (a,) = [x for x in node.all_input_nodes if x not in self.engine.pl.consts]
        return a

    def input(self, st: _Step) -> _Win:
        """The input's window with the candidate's feature replaced by the baseline."""
        eng, rows, node, g = self.engine, self.rows, st.node, st.geo
        origin = self.boxes[node][:, :2]
        # the indices were checked in score() (rows) or are zeros: no per-gather checks
        x, _ = _ops.patch_gather(eng.stored[node], rows, None, origin, origin.new_zeros(len(rows), 4),
                                 origin, g.wh, g.ww, 0.0, False)
        if eng.input_windows is not None:  # the feature's place and the baseline there, from the per-feature table
            inside, bl = (t.index_select(0, self.fidx) for t in eng.input_windows)
            return _Win(torch.where(inside, bl, x), self.features >= 0)
        zeros = torch.zeros_like(rows)
        b_rows = rows if eng.baseline.shape[0] > 1 else zeros
        bl, _ = _ops.patch_gather(eng.baseline, b_rows, None, origin, origin.new_zeros(len(rows), 4),
                                  origin, g.wh, g.ww, 0.0, False)
        fmw, _ = _ops.patch_gather(eng.fm, zeros, None, origin, origin.new_zeros(len(rows), 4), origin,
                                   g.wh, g.ww, 0.0, False)
        patch = torch.where(fmw == self.features.view(-1, 1, 1, 1), bl, x)
        return _Win(patch, self.features >= 0)

    def window(self, st: _Step) -> _Win:
        """A window op run on the region of its input that its output window reads."""
        node, g = st.node, st.geo
        a = self._only_input(node)
        origin = self.regions[node]  # from the plan's table: no arithmetic per call
        rh = (g.wh - 1) * st.s[0] + (st.k[0] - 1) * st.d[0] + 1
        rw = (g.ww - 1) * st.s[1] + (st.k[1] - 1) * st.d[1] + 1
        region, chg = self.gather(a, origin, rh, rw, st.pad_value)
        out = st.fn(region)
        if tuple(out.shape[2:]) != (g.wh, g.ww):  # the region must give exactly the window
            raise AssertionError(f"{node.name}: window {tuple(out.shape[2:])}, planned {(g.wh, g.ww)}")
        return _Win(out, chg)

    def alias(self, st: _Step):
        return self.states[self._only_input(st.node)]

    def pointwise(self, st: _Step) -> _Win:
        node, consts, states = st.node, self.engine.pl.consts, self.states
        a_in = [x for x in node.all_input_nodes if x not in consts]
        args = fx.node.map_arg(node.args, lambda x: consts[x] if x in consts else states[x].patch)
        kwargs = fx.node.map_arg(_kwargs(node), lambda x: consts[x] if x in consts else states[x].patch)
        return _Win(st.fn(*args, **kwargs), states[a_in[0]].chg)

    def merge(self, st: _Step) -> _Win:
        """Inputs gathered over the hull window, then combined."""
        node, g, consts = st.node, st.geo, self.engine.pl.consts
        origin = self.boxes[node][:, :2]
        gathered, chg = {}, None
        for a in node.all_input_nodes:
            if a in consts:
                continue
            gathered[a], c = self.gather(a, origin, g.wh, g.ww)
            chg = c if chg is None else chg | c
        args = fx.node.map_arg(node.args, lambda x: consts[x] if x in consts else gathered[x])
        kwargs = fx.node.map_arg(_kwargs(node), lambda x: consts[x] if x in consts else gathered[x])
        return _Win(st.fn(*args, **kwargs), chg)

    def gap(self, st: _Step) -> _Dense:
        """Global average pooling: the stored mean plus the window's change over the map's size."""
        node, eng = st.node, self.engine
        a = self._only_input(node)
        h, w = eng.stored[a].shape[2:]
        g_in = eng.pl.geo[a]
        origin = self.boxes[a][:, :2]
        new, chg = self.gather(a, origin, g_in.wh, g_in.ww)
        old, _ = self.gather(a, origin, g_in.wh, g_in.ww, with_patch=False)
        delta = (new - old).sum((2, 3)) / (h * w)
        base = eng.stored[node][self.rows]
        return _Dense(base + delta.view(base.shape), chg)

    def dense(self, st: _Step) -> _Dense:
        """The node run on full values (windows written back into full maps)."""
        node, consts = st.node, self.engine.pl.consts
        chg = None
        for a in node.all_input_nodes:
            if a in consts:
                continue
            c = self.states[a].chg
            chg = c if chg is None else chg | c
        args = fx.node.map_arg(node.args, self.value_of)
        kwargs = fx.node.map_arg(_kwargs(node), self.value_of)
        return _Dense(st.fn(*args, **kwargs), chg)


# how score() runs each kind of step (any other kind: dense)
_STEP_RUNS = {"input": _ScoreRun.input, "window": _ScoreRun.window, "alias": _ScoreRun.alias,
              "pointwise": _ScoreRun.pointwise, "merge": _ScoreRun.merge, "gap": _ScoreRun.gap}


class _CallsWithConsts(dict):
    """calls for _run_graph: a node's callable (constants' nodes are recomputed; they are cheap and exact)."""

    def __init__(self, calls, consts):
        super().__init__(calls)
        self.consts = consts

    def __missing__(self, node):
        value = self.consts[node]
        return lambda *a, **k: value


def _format(v: torch.Tensor) -> torch.memory_format:
    if v.dim() == 4 and not v.is_contiguous() and v.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


class IncrementalEvaluator:
    """Drop-in for batching.CandidateEvaluator in exact SIS: scores candidates incrementally.

    The stored activations of image i belong to ``present[i]``; when a batch reaches an
    image whose ``present`` row changed since (a step finished, a new round began), the
    image's current input is run again first.
    """

    takes_starts = True  # the exact loop passes ``starts`` (see __call__)

    def __init__(self, pl: IncrementalPlan, fn: ModelFn, prep: Prepared, targets: torch.Tensor, runner):
        n, p = prep.images.shape[0], prep.num_features
        self.engine = IncrementalEngine(pl, fn, prep, n)
        self.prep = prep
        self.targets = targets
        self.runner = runner
        self.snapshot = torch.zeros((n, p), dtype=torch.bool, device=prep.images.device)
        self.fresh = torch.zeros(n, dtype=torch.bool, device=prep.images.device)

    def _refresh(self, present: torch.Tensor, image: torch.Tensor, starts: Sequence[int] | None) -> None:
        """Run the current inputs of the images whose ``present`` row changed since their last base run: ``starts``
        where the caller knows them (no device read), else found by comparing with a snapshot (reads the device)."""
        p = self.prep
        if starts is not None:
            if len(starts) == 0:
                return
            (stale,) = upload(image.device, starts)
            count = stale.shape[0]
        else:
            imgs = torch.unique(image)
            stale = imgs[~self.fresh[imgs] | (present[imgs] != self.snapshot[imgs]).any(1)]
            count = stale.numel()
            if count == 0:
                return
        x = _ops.mask_apply(p.images, p.baseline, p.feature_map, present, stale, stale, torch.full_like(stale, -1),
                            starts is None)
        n = present.shape[0]
        # every image, in order, in one chunk: the run's outputs become the stored maps (no copy)
        whole = starts is not None and count == n and count <= self.runner.chunk and list(starts) == list(range(n))
        self.runner.run(count, lambda sl: self.engine.base(stale[sl], x[sl], self.targets[stale[sl]],
                                                           every_row=whole and sl.stop - sl.start == n))
        self.snapshot[stale] = present[stale]
        self.fresh.index_fill_(0, stale, True)  # x[idx] = True would copy a host scalar: a wait on CUDA

    def __call__(self, present: torch.Tensor, image: torch.Tensor, row: torch.Tensor,
                 feature: torch.Tensor, starts: Sequence[int] | None = None) -> torch.Tensor:
        """f of each candidate, float64 [B]; ``row`` must equal ``image`` (one present row per image).

        ``starts`` (distinct host ints), from the exact loop: the images whose ``present`` row changed since they
        were last scored (their step or round begins in this call). With it, nothing is read from the device and the indices
        are not checked again (the loop checked them where it made them); without it, the changed images are
        found on the device and the indices checked, each costing a device read.
        """
        if starts is None:  # once for the call, not per chunk, and before the refresh indexes by ``image``
            self.engine.check(image, feature)
        self._refresh(present, image, starts)

        def work(sl: slice) -> torch.Tensor:
            return self.engine.score(image[sl], feature[sl], self.targets[image[sl]], False)

        return self.runner.run(image.shape[0], work)


def _plan_key(prep: Prepared) -> tuple:
    """What a plan depends on besides the model (whose weights, modes and tensors' addresses its state's stamp
    covers, runtime.model_state: a plan holds values computed from the weights): the images' shape, dtype, device
    and layout, and the feature map."""
    images, fm = prep.images, prep.feature_map
    return (tuple(images.shape[1:]), images.dtype, images.device, images.is_contiguous(), prep.num_features,
            hashlib.sha1(fm.detach().cpu().contiguous().numpy().tobytes()).hexdigest())


def cached_plan(fn: ModelFn, prep: Prepared) -> IncrementalPlan:
    """:func:`plan`, kept in the model's state (runtime.model_state) per images' shape and feature map (a trace and
    a trial run take tens of milliseconds: as long as a whole small job on a GPU). A model that cannot be planned
    raises NotIncremental again, from the state."""
    model = fn.model
    state = model_state.state_of(model) if isinstance(model, nn.Module) else None
    if state is None:
        return plan(fn, prep)
    key = _plan_key(prep)
    made = state.get("plan", key)
    if made is None:
        try:
            made = plan(fn, prep)
        except NotIncremental as exc:
            made = str(exc)  # the reason, not the exception: its traceback's frames would keep the model alive
        state.put("plan", key, made)
    if isinstance(made, str):
        raise NotIncremental(made)
    return made


def choose(fn: ModelFn, prep: Prepared, incremental: bool | None) -> IncrementalPlan | None:
    """The plan to use or to time, or None for the dense path.

    incremental=True: the plan (a clear error when the model cannot be traced); False: None;
    None (auto): the plan where the model traces and its estimated work is at most
    AUTO_MEASURE_MAX_COST_RATIO of a dense pass (the caller then times it against the dense
    engine, see engines.incremental_pays), else None.
    """
    if incremental is False:
        return None
    if incremental is None and (fn.model is None or not isinstance(fn.model, nn.Module) or prep.images.dim() != 4):
        return None  # ONNX models, callables, text: dense, nothing to say
    try:
        pl = cached_plan(fn, prep)
    except NotIncremental as exc:
        if incremental:
            raise ValueError(f"incremental=True, but {exc}") from None
        # auto: a speed path that does not apply to this model steps aside; the run's info says why
        logger.info("incremental inference off, dense candidates instead: %s", exc)
        runinfo.note("incremental", f"off: {exc}")
        return None
    if incremental is None and pl.cost_ratio > AUTO_MEASURE_MAX_COST_RATIO:
        logger.info("incremental inference off (estimated %.2fx the work of a dense pass)",
                    pl.cost_ratio)
        runinfo.note("incremental", f"off: estimated {pl.cost_ratio:.2f}x the work of a dense pass")
        return None
    logger.debug(pl.summary())
    return pl


def probe(pl: IncrementalPlan, fn: ModelFn, prep: Prepared, targets: torch.Tensor) -> Callable[[int], None]:
    """probe(b): score b single-feature candidates incrementally (for calibration.measure).

    The first step's candidates of up to _PROBE_IMAGES images (their activations stored
    on the first call): row j masks feature (j * 7919) mod p of image j mod n, so the rows spread
    over the map as a step's do (windows at the border are clipped, inside they are whole).
    """
    n = min(prep.images.shape[0], _PROBE_IMAGES)
    dev = prep.images.device
    p = prep.num_features
    engine: list[IncrementalEngine] = []  # built on the first call: a calibration may not measure at all

    def run(b: int) -> None:
        if not engine:
            engine.append(IncrementalEngine(pl, fn, prep, n))
            engine[0].base(torch.arange(n, device=dev), prep.images[:n], targets[:n])
        j = torch.arange(b, device=dev)
        image = j % n
        engine[0].score(image, (j * 7919) % p, targets[image], False)[:1].cpu()  # synchronise (CUDA)

    return run
