"""What a job keeps for its model between calls, in one place, under one rule.

A job measures and builds things about its model that later jobs of the same model reuse: the memory format it
runs best in and its channels_last copy, calibrated batch sizes and the largest batch shapes, exported or compiled
engines, incremental-inference plans, and the exact loop's dense steps with their buffers and CUDA graphs. All of
it lives in the model's :class:`ModelState`, one per model, found by :func:`state_of`.

One rule says when a state is stale: its :func:`stamp` (every parameter's and buffer's address, version counter
and dtype, each module's train/eval flag, and the autocast state of the CPU and CUDA) differs from the model's
now. A stale state is dropped whole, with everything in it, and the model starts a new one. So moving, replacing
or changing a weight in place, ``model.train()``, ``model.half()`` or an outer ``torch.autocast`` never reuses a
graph, a plan or a copy made for the model as it was.

Nothing here keeps a model alive. The registry holds the model weakly (:class:`weakref.WeakKeyDictionary`), and
nothing a state holds refers to the model: a kept dense step drops its model when its job ends, a graphed forward
pass refers to its model weakly, a compiled engine compiles a copy. When the user deletes the model, its state and
all it holds are freed with it.

Derived models share their origin's state: a channels_last copy or a low-precision copy made for a job carries a
weak reference to the state of the model it was made from (:func:`adopt`), so what a job keeps for the copy is
kept with the user's model, and dies with it. An ensemble built from a list of models (a new object in every
call) keeps its state with its first member, per set of members.

Models that cannot be weakly referenced (some callables) keep nothing: :func:`state_of` returns None and every
job measures and builds anew.
"""
from __future__ import annotations

import weakref
from typing import Callable, Hashable, TypeVar

import torch
from torch import nn

T = TypeVar("T")

_STATE_ATTR = "_overinterp_fast_state"  # on a derived model: a weak reference to its origin's ModelState
KINDS = ("copy", "format", "top", "exact_top", "engine", "plan", "step", "graphs", "calibration", "small_job")


class ModelState:
    """What is kept for one model (see the module docstring): per kind (:data:`KINDS`), a table of values by key.

    Attributes:
        stamp: the model's :func:`stamp` when the state was made.
        tables: kind -> {key: value}.
    """

    __slots__ = ("stamp", "tables", "scopes", "__weakref__")

    def __init__(self, stamp: tuple):
        self.stamp = stamp
        self.tables: dict[str, dict] = {}
        self.scopes: dict[tuple, ModelState] = {}  # an ensemble's state, per set of members (kept by its first)

    def table(self, kind: str) -> dict:
        """The table of ``kind`` (made empty where missing)."""
        if kind not in KINDS:
            raise KeyError(f"unknown kind of kept state {kind!r}; one of {KINDS}")
        t = self.tables.get(kind)
        if t is None:
            t = self.tables[kind] = {}
        return t

    def get(self, kind: str, key: Hashable, make: Callable[[], T] | None = None) -> T | None:
        """The value of ``kind`` under ``key``; where missing, ``make()`` is kept and returned (None without
        ``make``)."""
        t = self.table(kind)
        if key in t:
            return t[key]
        if make is None:
            return None
        value = t[key] = make()
        return value

    def put(self, kind: str, key: Hashable, value: T) -> T:
        self.table(kind)[key] = value
        return value

    def pop(self, kind: str, key: Hashable):
        return self.table(kind).pop(key, None)

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values()) + sum(len(s) for s in self.scopes.values())


_states: "weakref.WeakKeyDictionary[object, ModelState]" = weakref.WeakKeyDictionary()


def _tensors(model) -> list[torch.Tensor]:
    return list(model.parameters()) + list(model.buffers()) if isinstance(model, nn.Module) else []


def autocast_state() -> tuple:
    """Whether autocast is on, and its dtype, for the CPU and CUDA: an outer ``torch.autocast`` changes what a kept
    graph or step would compute."""
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda"))


def stamp(model) -> tuple:
    """What a model's kept state depends on: its parameters' and buffers' addresses, version counters (every
    in-place change bumps them; an inference tensor has none, its replacement shows) and dtypes, its modules'
    train/eval flags, and the autocast state. For a model that is not a torch module: the autocast state (and an
    ONNX model's file)."""
    if isinstance(model, nn.Module):
        tensors = tuple((t.data_ptr(), 0 if t.is_inference() else t._version, t.dtype) for t in _tensors(model))
        modes = tuple(m.training for m in model.modules())
        return tensors, modes, autocast_state()
    return (getattr(model, "path", None),), autocast_state()


def _owner(model) -> tuple[object, tuple | None]:
    """(the object the state is kept with, the scope within its state): an ensemble's is its first member module,
    per set of members; any other model's is itself."""
    from .model import Ensemble

    if isinstance(model, Ensemble) and model._callables and isinstance(model._callables[0], nn.Module):
        return model._callables[0], ("ensemble", tuple(id(m) for m in model._callables))
    return model, None


def state_of(model) -> ModelState | None:
    """The model's :class:`ModelState`, made anew where missing or stale (:func:`stamp`); None where nothing can be
    kept for it (a model that cannot be weakly referenced). A derived model (:func:`adopt`) gives its origin's
    state while that lives, else None."""
    ref = getattr(model, _STATE_ATTR, None) if isinstance(model, nn.Module) else None
    if ref is not None:
        return ref()
    owner, scope = _owner(model)
    now = stamp(model)
    try:
        state = _states.get(owner)
    except TypeError:  # not weakly referenceable
        return None
    if scope is None:
        if state is None or state.stamp != now:
            try:
                state = _states[owner] = ModelState(now)
            except TypeError:
                return None
        return state
    if state is None:  # the first member's own state (stamped as the member) holds the ensemble's
        state = _states[owner] = ModelState(stamp(owner))
    scoped = state.scopes.get(scope)
    if scoped is None or scoped.stamp != now:
        scoped = state.scopes[scope] = ModelState(now)
    return scoped


def adopt(derived: nn.Module, state: ModelState | None) -> nn.Module:
    """Mark ``derived`` (a copy made from a model for a job) as sharing ``state``, weakly: what is kept for it is
    kept with the origin's state, and goes when that state goes. Returns ``derived``."""
    if state is not None and isinstance(derived, nn.Module):
        object.__setattr__(derived, _STATE_ATTR, weakref.ref(state))
    return derived


def made_from(module, model) -> bool:
    """Whether ``module`` is ``model`` or a copy made of it for a job (:func:`adopt`: its channels_last or
    low-precision copy): what observes a model's calls from outside (a row count, an op count) counts the copy's
    calls as the model's."""
    if module is model:
        return True
    ref = getattr(module, _STATE_ATTR, None) if isinstance(module, nn.Module) else None
    state = None if ref is None else ref()
    return state is not None and state is state_of(model)


def forget(model) -> None:
    """Drop everything kept for ``model``."""
    owner, scope = _owner(model)
    try:
        if scope is None:
            _states.pop(owner, None)
        elif owner in _states:
            _states[owner].scopes.pop(scope, None)
    except TypeError:
        pass


def clear(kinds: tuple[str, ...] | None = None) -> None:
    """Forget what every model keeps (``kinds``: only those kinds)."""
    if kinds is None:
        _states.clear()
        return
    for state in list(_states.values()):
        for s in (state, *state.scopes.values()):
            for kind in kinds:
                s.tables.pop(kind, None)


def kept_models() -> int:
    """How many models keep a state now (for tests: the registry forgets a model that was freed)."""
    return len(_states)
