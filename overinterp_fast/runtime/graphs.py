"""CUDA graphs of a model's forward pass, one per batch shape.

A small model's forward pass on a GPU is a few hundred short kernels, and launching them from Python takes longer
than running them. A CUDA graph records the launches of one call once and replays them with one launch. Forward
calls take a few fixed batch shapes (runtime.batching.bucket), so one graph per shape covers a whole job.

A graph is captured on the first call of each shape: two warm-up calls on a side stream (cuDNN and the allocator
settle), the capture, then one replay compared with an eager call on the same input. Any error in the capture, or a
replay that differs from the eager output by more than float noise, turns graphs off for that model with one
logged line; the calls then run eagerly, with the same results. Graphs are not used when autograd records (the
gradient method's backward passes) or for inputs that are not on a CUDA device.

The graphs of a model are kept between jobs (:func:`for_model`) while its parameters and buffers stay where they
are: a graph reads them by address, so moving or replacing a tensor of the model makes new graphs.

``OVERINTERP_FAST_CUDA_GRAPHS=0`` turns graphs off everywhere.
"""
from __future__ import annotations

import logging
import os
import weakref

import torch

from .sync import to_host

log = logging.getLogger(__name__)
ENV_VAR = "OVERINTERP_FAST_CUDA_GRAPHS"
MAX_GRAPHS = 32  # shapes beyond this many run eagerly
_WARMUP_CALLS = 2


def enabled() -> bool:
    """False when OVERINTERP_FAST_CUDA_GRAPHS is set to 0 (or "false", "off", "no")."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "off", "no")


class _Graph:
    __slots__ = ("graph", "inp", "out")

    def __init__(self, graph: torch.cuda.CUDAGraph, inp: torch.Tensor, out: torch.Tensor):
        self.graph, self.inp, self.out = graph, inp, out


class GraphedForward:
    """``model(x)`` through one CUDA graph per input shape (see the module docstring).

    Args:
        model: an eval-mode ``torch.nn.Module`` (or callable) on a CUDA device, [B, *D] -> [B, K].

    Attributes:
        failed: None while graphs are in use, else why they were turned off (one line).
    """

    def __init__(self, model):
        self.model = model
        self.graphs: dict[tuple, _Graph] = {}
        self.failed: str | None = None
        self._pool = None  # one memory pool shared by the graphs of this model

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (self.failed is not None or x.device.type != "cuda" or torch.is_grad_enabled()
                or torch.cuda.is_current_stream_capturing()):
            return self.model(x)
        # inference mode apart: its static input could not be written outside it (and the other way round)
        key = (tuple(x.shape), x.stride(), x.dtype, x.device, torch.is_inference_mode_enabled())
        g = self.graphs.get(key)
        if g is None:
            if len(self.graphs) >= MAX_GRAPHS:
                return self.model(x)
            g = self._capture(x, key)
            if g is None:
                return self.model(x)
        g.inp.copy_(x)
        g.graph.replay()
        return g.out.clone()  # the next replay overwrites g.out

    def _capture(self, x: torch.Tensor, key: tuple) -> _Graph | None:
        """Capture and check the graph of shape ``key``; None (and graphs off for this model) where that fails."""
        debug = torch.cuda.get_sync_debug_mode()
        if debug:  # capturing waits for the device once per shape: not a wait of the loops it serves
            torch.cuda.set_sync_debug_mode(0)
        try:
            inp = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            inp.copy_(x)
            side = torch.cuda.Stream(x.device)
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_CALLS):
                    self.model(inp)
            torch.cuda.current_stream(x.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.model(inp)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"the model returned {type(out).__name__}, not a tensor")
            self._pool = graph.pool()
            inp.copy_(x)
            graph.replay()
            eager = self.model(x)
            tol = 1e-3 if out.dtype in (torch.float16, torch.bfloat16) else 1e-5
            (same,) = to_host(torch.isclose(out.float(), eager.float(), rtol=tol, atol=tol).all(), label="graph check")
            if not bool(same):
                raise RuntimeError("a replay differs from the eager forward pass")
        except Exception as exc:  # whatever breaks a capture, the eager path gives the same results
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.failed = f"{type(exc).__name__}: {first}"
            self.graphs.clear()
            log.warning("CUDA graphs off for this model (%s); running it eagerly", self.failed)
            return None
        finally:
            if debug:
                torch.cuda.set_sync_debug_mode(debug)
        g = _Graph(graph, inp, out)
        self.graphs[key] = g
        return g


_cache: "weakref.WeakKeyDictionary[object, tuple[tuple, GraphedForward]]" = weakref.WeakKeyDictionary()


def _where(model) -> tuple:
    """Addresses of the model's parameters and buffers (what its graphs read)."""
    if not isinstance(model, torch.nn.Module):
        return ()
    return tuple(t.data_ptr() for t in model.parameters()) + tuple(t.data_ptr() for t in model.buffers())


def for_model(model) -> GraphedForward:
    """The :class:`GraphedForward` of ``model``, kept while its tensors stay at the same addresses."""
    where = _where(model)
    try:
        hit = _cache.get(model)
    except TypeError:  # not weakly referenceable: graphs for this job only
        return GraphedForward(model)
    if hit is not None and hit[0] == where:
        return hit[1]
    graphed = GraphedForward(model)
    _cache[model] = (where, graphed)
    return graphed
