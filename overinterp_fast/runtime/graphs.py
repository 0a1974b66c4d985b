"""CUDA graphs of a model's forward pass, one per batch shape.

A small model's forward pass on a GPU is a few hundred short kernels, and launching them from Python takes longer
than running them. A CUDA graph records the launches of one call once and replays them with one launch. Forward
calls take a few fixed batch shapes (runtime.batching.bucket), so one graph per shape covers a whole job.

A graph is captured on the second call of each shape (a shape called once runs eagerly): two warm-up calls on a
side stream (cuDNN and the allocator settle), the capture, then one replay compared with an eager call on the same
input. Any error in the capture, or a replay that differs from the eager output by more than float noise, turns
graphs off for that model with one logged line; the calls then run eagerly, with the same results. Graphs are not
used when autograd records (the gradient method's backward passes) or for inputs that are not on a CUDA device;
there (graphs enabled) the same objects count the captures and replays a GPU would make, so that a CPU shows them.

Why not torch's own: ``torch.cuda.make_graphed_callables`` captures one sample shape per callable and a backward
graph with it (it is made for training steps), and ``torch.compile(mode="reduce-overhead")`` compiles the model
first (seconds to minutes per model, again per new shape) where a capture takes milliseconds. Both would keep the
same per-shape pools; what they would save is the few lines of capture and check below.

The graphs of a model are kept between jobs in the model's state (:func:`for_model`, runtime.model_state) while its
parameters and buffers stay where they are: a graph reads them by address, so moving or replacing a tensor of the
model makes new graphs. A :class:`GraphedForward` refers to its model weakly: the model's graphs go with it.

Loops whose every step has the same shapes (the batched-gradient steps of a round) capture the whole step instead:
:class:`GraphedStep` takes a step function of fixed tensors, runs its first calls eagerly, captures it, checks one
replay against an eager step from the same state, and replays it for the remaining calls; a capture that fails or
a replay that differs turns that step's graph off with one logged line, and its calls run eagerly.

``OVERINTERP_FAST_CUDA_GRAPHS=0`` turns graphs off everywhere.
"""
from __future__ import annotations

import logging
import os
import weakref
from typing import Callable, Sequence

import torch

from .sync import sanctioned_wait, to_host

log = logging.getLogger(__name__)
ENV_VAR = "OVERINTERP_FAST_CUDA_GRAPHS"
MAX_GRAPHS = 32  # shapes beyond this many run eagerly
CAPTURE_AT_CALL = 2  # a forward shape is captured at its second call: a shape called once is never captured
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

    A shape is captured at its second call (:data:`CAPTURE_AT_CALL`): a shape called once in a job (the images'
    own forward pass, a check of one set) runs eagerly and costs no capture. Off a CUDA device, and where autograd
    records, every call runs the model eagerly; on a CPU (graphs enabled) the object is the captures' stand-in: it
    counts the captures and replays a GPU would make for the same calls, by the same rule.

    Args:
        model: an eval-mode ``torch.nn.Module`` (or callable) on a CUDA device, [B, *D] -> [B, K]; held weakly
            (the object is kept in the model's state, runtime.model_state, and must not keep the model alive).

    Attributes:
        failed: None while graphs are in use, else why they were turned off (one line).
        captures, replays: graphs captured and replays run so far (on the stand-in: those a GPU would make).
    """

    def __init__(self, model):
        try:  # kept in the model's state (runtime.model_state): it must not keep the model alive
            self._model = weakref.ref(model)
        except TypeError:
            self._model = lambda: model  # noqa: E731  (not weakly referenceable: kept for one job only)
        self.graphs: dict[tuple, _Graph] = {}
        self.calls: dict[tuple, int] = {}  # per shape: its calls so far
        self.failed: str | None = None
        self.captures = self.replays = 0
        self._pool = None  # one memory pool shared by the graphs of this model

    @property
    def model(self):
        """The model (None once it was freed)."""
        return self._model()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.failed is not None or torch.is_grad_enabled() or (
                x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return self.model(x)
        # inference mode apart: its static input could not be written outside it (and the other way round)
        key = (tuple(x.shape), x.stride(), x.dtype, x.device, torch.is_inference_mode_enabled())
        g = self.graphs.get(key)
        if g is None:
            calls = self.calls[key] = self.calls.get(key, 0) + 1
            if calls < CAPTURE_AT_CALL or len(self.calls) > MAX_GRAPHS:
                return self.model(x)
            if x.device.type != "cuda":  # the stand-in: a GPU captures at this call, and replays at every later one
                if calls == CAPTURE_AT_CALL:
                    self.captures += 1
                else:
                    self.replays += 1
                return self.model(x)
            g = self._capture(x, key)
            if g is None:
                return self.model(x)
            self.captures += 1
        g.inp.copy_(x)
        g.graph.replay()
        self.replays += 1
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


def for_model(model) -> GraphedForward:
    """The :class:`GraphedForward` of ``model``, kept in its state (runtime.model_state: while its tensors stay where
    they are, which its graphs read, and its weights, modes and the autocast state stay the same)."""
    from . import model_state

    state = model_state.state_of(model)
    if state is None:  # nothing kept for this model: graphs for this job only
        return GraphedForward(model)
    return state.get("graphs", "forward", lambda: GraphedForward(model))


STEP_WARMUP_CALLS = 2  # eager calls of a step before its capture (cuDNN, cuBLAS and the allocator settle)
STEP_MIN_REPLAYS = 2  # a step is captured only when at least this many calls are left to replay after its check


def _first_line(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class _CapturedStep:
    """A captured step: ``replay()`` runs it again (the graph's own launch)."""

    __slots__ = ("graph",)

    def __init__(self, graph):
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()


def same_state(replayed: Sequence[torch.Tensor], eager: Sequence[torch.Tensor]) -> torch.Tensor:
    """0-d bool tensor on the tensors' device: every pair equal, floating ones up to float noise (NaN equal to NaN,
    relative and absolute tolerance 1e-5; 1e-3 for 16-bit floats), others exactly. The default check of
    :class:`GraphedStep`."""
    flags = []
    for a, b in zip(replayed, eager):
        if a.is_floating_point():
            tol = 1e-3 if a.dtype in (torch.float16, torch.bfloat16) else 1e-5
            flags.append(torch.isclose(a.float(), b.float(), rtol=tol, atol=tol, equal_nan=True).all())
        else:
            flags.append(torch.eq(a, b).all())
    return torch.stack(flags).all()


class StepGraphs:
    """The :class:`GraphedStep` objects of one loop (one job): they share a memory pool (they replay one after
    another, never at once), and the first capture that fails turns graphs off for every later step of the loop,
    with one logged line.

    Off a CUDA device (while :func:`enabled`), the steps run eagerly and the family is the captures' stand-in: it
    counts the captures and replays a GPU would make, by the same rule (a step's capture at its call
    ``warmup + 1`` where it has calls enough left, a replay at each later call; none after a failure), so that a
    CPU shows how many graphs a job would capture.

    Args:
        device: where the loop's buffers live (graphs only on a CUDA device, and only while :func:`enabled`).

    Attributes:
        on: steps are captured (a CUDA device, graphs enabled). counting: the CPU's stand-in counts (not ``on``,
            graphs enabled).
        failed: None, or why graphs were turned off (one line).
        captures, replays: graphs captured and replays run by every step made here, so far (on the stand-in:
            those a GPU would make).
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.on = self.device.type == "cuda" and enabled()
        self.counting = self.device.type != "cuda" and enabled()
        self.failed: str | None = None
        self.pool = None
        self.steps: list[GraphedStep] = []
        self.captures = 0
        self.replays = 0

    @property
    def mode(self) -> str:
        """"cuda graph" when any step replayed from a graph, else "eager"."""
        return "cuda graph" if self.on and self.replays else "eager"

    def step(self, step: Callable[[], object], state: Sequence[torch.Tensor], calls: int | None = None,
             check: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], torch.Tensor] | None = None
             ) -> "GraphedStep":
        """A :class:`GraphedStep` of ``step`` in this loop (``calls``: how many calls the caller will make)."""
        g = GraphedStep(step, state, self.device, calls=calls, check=check or same_state, family=self)
        self.steps.append(g)
        return g

    def turned_off(self, why: str) -> None:
        """A step's capture failed: graphs off for the rest of the loop (logged once)."""
        if self.failed is None:
            self.failed = why
            log.warning("CUDA graphs of these steps off (%s); running them eagerly", why)

    def release(self) -> None:
        """Drop every step's graph and the family's memory pool (their memory goes back to the allocator once
        nothing references it; later steps capture into a new pool)."""
        with sanctioned_wait():  # destroying a graph is not a wait of the loop it served
            for s in self.steps:
                s.graph = None
            self.steps.clear()
            self.pool = None


class GraphedStep:
    """``step()``, a function of fixed tensors, run as one CUDA graph: captured once, replayed on later calls.

    ``step`` must only read and write tensors that outlive it (its static buffers: inputs the caller writes into
    before a call, the state it updates in place, the outputs it writes), never wait for a device value (no
    ``.item()``, ``bool(t)``, ``nonzero`` or shapes that depend on data), and do the same work whatever the buffers
    hold: what changes from call to call lives in the buffers (a step counter is a device tensor). Then one replay
    does what one eager call does, with one launch instead of one per op.

    The first ``warmup`` calls run ``step`` eagerly on a side stream (each is a real step: the state advances).
    The next call captures ``step`` (the capture runs nothing), replays it, and checks the result against an eager
    call of ``step`` from the same state (the ``state`` tensors saved before the replay and restored after it;
    ``check(replayed, eager)`` -> 0-d bool tensor, one read, default :func:`same_state`); the eager result is kept.
    Later calls replay. An error in the capture or the replay, or a replay that the check rejects, turns the graph
    off with one logged line (``failed`` says why; in a :class:`StepGraphs`, for every later step of the loop too);
    every call then runs ``step`` eagerly, with the same results. An error of the eager step itself (an
    out-of-memory error, say) is raised as it is. A step is not captured when fewer than ``STEP_MIN_REPLAYS`` calls
    would be left to replay (``calls``: how many the caller will make; None: unknown), when graphs are disabled
    (:func:`enabled`), or off a CUDA device: every call is then eager, on the current stream.

    Args:
        step: the step function (no arguments; its return value is ignored).
        state: every tensor ``step`` changes (saved and compared around the check).
        device: where the buffers live.
        calls: the calls the caller will make, or None.
        warmup: eager calls before the capture.
        check: compares the replayed state with the eager one.
        family: the :class:`StepGraphs` of the loop (shared pool, graphs off after one failure), or None.

    Attributes:
        replays: calls that replayed the graph. eager: calls that ran ``step`` eagerly (warm-ups and the check's
            eager step included). failed: None, or why the graph was turned off (one line).
    """

    def __init__(self, step: Callable[[], object], state: Sequence[torch.Tensor], device: torch.device | str, *,
                 calls: int | None = None, warmup: int = STEP_WARMUP_CALLS,
                 check: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], torch.Tensor] = same_state,
                 family: StepGraphs | None = None):
        self.step, self.state, self.device = step, list(state), torch.device(device)
        self.warmup, self.check, self.family = warmup, check, family
        self.graph: _CapturedStep | None = None
        self.failed: str | None = family.failed if family is not None else None
        self.replays = self.eager = self.calls = self.captures = 0
        on = family.on if family is not None else (self.device.type == "cuda" and enabled())
        worth = calls is None or calls >= warmup + 1 + STEP_MIN_REPLAYS
        self.wanted = on and worth
        self.counted = not on and worth and family is not None and family.counting  # the CPU's stand-in
        self.unchecked = False  # primed (captured before its first call), the check still to come

    @property
    def graphed(self) -> bool:
        """True once the step replays from a graph."""
        return self.graph is not None

    def __call__(self) -> None:
        self.calls += 1
        if self.unchecked:  # primed: the first call checks the graph
            self.unchecked = False
            graph, self.graph = self.graph, None
            self._capture_and_check(graph)
        elif self.graph is not None:
            self.graph.replay()
            self._count(replays=1)
        elif not self.wanted or self.failed is not None:
            self._eager()
            if self.counted:  # the stand-in: what a GPU would have done at this call
                if self.calls == self.warmup + 1:
                    self._count(captures=1)
                elif self.calls > self.warmup + 1:
                    self._count(replays=1)
        elif self.calls <= self.warmup:
            self._eager(side_stream=self.device.type == "cuda")
        else:
            self._capture_and_check()

    def _count(self, captures: int = 0, replays: int = 0) -> None:
        self.captures += captures
        self.replays += replays
        if self.family is not None:
            self.family.captures += captures
            self.family.replays += replays

    def _eager(self, side_stream: bool = False) -> None:
        self.eager += 1
        if not side_stream:
            self.step()
            return
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self.step()
        current.wait_stream(side)

    def _capture(self) -> _CapturedStep:
        """The CUDA graph of one call of ``step`` (nothing runs while it is recorded)."""
        graph = torch.cuda.CUDAGraph()
        pool = None if self.family is None else self.family.pool
        with torch.cuda.graph(graph, pool=pool):
            self.step()
        if self.family is not None and self.family.pool is None:
            self.family.pool = graph.pool()
        return _CapturedStep(graph)

    def _off(self, why: BaseException | str) -> None:
        self.failed = _first_line(why)
        self.graph = None
        if self.family is not None:
            self.family.turned_off(self.failed)
        else:
            log.warning("CUDA graph of this step off (%s); running it eagerly", self.failed)

    def prime(self, warm: Callable[[], object]) -> None:
        """Capture the step now, before its first call: ``warm()`` (a call of the step's own ops that leaves the
        state as it is, e.g. a batch of padding rows) runs ``warmup`` times on a side stream, then the step is
        captured (nothing runs). The first call replays it and checks it against an eager step from the same state,
        as a capture at a later call does; every later call replays. Where the step would not be captured
        (graphs off, too few calls) nothing happens; on the CPU's stand-in the capture is counted. A failure turns
        the graph off with one logged line, and the calls run eagerly."""
        if self.graph is not None or self.calls or self.failed is not None:
            return
        if self.counted:
            self._count(captures=1)
            self.calls = self.warmup + 1  # as captured: the next call is the check's, a replay on a GPU
            return
        if not self.wanted:
            return
        with sanctioned_wait():  # priming waits for the device once: not a wait of the loop served
            try:
                if self.device.type == "cuda":  # warm-ups on a side stream, as a capture's are
                    current = torch.cuda.current_stream(self.device)
                    side = torch.cuda.Stream(self.device)
                    side.wait_stream(current)
                    with torch.cuda.stream(side):
                        for _ in range(self.warmup):
                            warm()
                    current.wait_stream(side)
                else:
                    for _ in range(self.warmup):
                        warm()
                self.graph = self._capture()
            except Exception as exc:  # whatever breaks a capture, the eager step gives the same results
                self._off(exc)
                return
        self._count(captures=1)
        self.unchecked = True
        self.calls = self.warmup

    def _capture_and_check(self, graph: _CapturedStep | None = None) -> None:
        """This call's step: captured (unless ``graph`` was, by :meth:`prime`), replayed, checked against an eager
        step from the same state (whose result is kept); where the capture or the replay fails, the graph is off
        and the step runs eagerly."""
        saved = None
        with sanctioned_wait():  # capturing and checking wait for the device once: not waits of the loop served
            try:
                captured = graph is None
                graph = graph or self._capture()
                saved = [t.clone() for t in self.state]
                graph.replay()
                replayed = [t.clone() for t in self.state]
            except Exception as exc:  # whatever breaks a capture, the eager step gives the same results
                self._off(exc)
                if saved is not None:
                    for t, s in zip(self.state, saved):
                        t.copy_(s)
                self._eager()
                return
            for t, s in zip(self.state, saved):
                t.copy_(s)
            self._eager()
            (same,) = to_host(self.check(replayed, self.state), label="graph check")
        self._count(captures=int(captured), replays=int(not captured))
        if not bool(same):
            self._off("a replay differs from the eager step")
            return
        self.graph = graph
