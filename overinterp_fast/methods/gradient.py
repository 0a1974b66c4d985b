"""Batched-gradient SIS (Carter et al. 2021, section S5; docs: algorithms.md, Batched-gradient SIS) for large images.

BackSelect: the mask M over features (1 = masked) enters the model as lerp(x, baseline, M) (x where M = 0, the
baseline where M = 1). Each step takes one backward pass for all images of a round together (the gradient of each
image's target probability with respect to its M), and masks, per image, the k present features with the largest
gradient (ties: lowest feature id). About p / k steps per round.

The step loop never waits for the device: each image's number of steps, ceil(count / k), is known on the host
in advance, and a step is one function of fixed tensors (:class:`RoundSteps`): the masked inputs, the forward and
backward pass, the ranking (a stable sort of the gradient plus a penalty of -inf on masked features) and the
records (mask, penalty, place in the masking order, f) written by one scatter. On a GPU it is captured once per
round as a CUDA graph and replayed for the round's steps (:class:`~overinterp_fast.runtime.graphs.GraphedStep`);
elsewhere, or where the capture fails, the same function runs eagerly (the run's ``info.step`` says which).
The host reads the records once per round, in one :func:`~overinterp_fast.runtime.sync.to_host` call.

FindSIS: the candidate sets are "only the last j blocks present", j = 0, 1, ...;
the SIS is the first that reaches the threshold. Instead of one forward pass per
pop, prefixes are evaluated in growing chunks, packed across images and prefix sizes
into batches built by the fused mask_apply kernel
(:func:`~overinterp_fast.methods.prefix.first_passing_prefix`); the first
success in ascending j is the answer popping one block at a time would give.
These evaluations run on the user's model in the images' dtype and memory format, without autocast, so every SIS
is verified in full precision: ``sis_score`` = f(x_S) >= threshold.

The gradient steps may run faster than that: under autocast (bf16 by default on CUDA and on CPUs with bf16
hardware) and on channels_last inputs (by default for 4-D inputs of a torch model; see :class:`ChannelsLastModel`),
with the model's weights laid out and cast for them once per job (:class:`LaidOutWeights`).
"""
from __future__ import annotations

import collections
import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..runtime import runinfo
from ..runtime.batching import CandidateEvaluator, ChunkRunner, check_candidates
from ..runtime.estimate import progress_bar
from ..runtime.graphs import GraphedStep, StepGraphs
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores, model_memory_format
from ..runtime.schedule import upload
from ..runtime.sync import to_host
from .prefix import first_passing_prefix
from .results import RunInfo, SISResult, StepCounts, first_with_collection

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
NON_FINITE = "the model's score or its gradient with respect to the mask is NaN or inf"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX), where bf16 convolutions and matrix
    products run faster than float32 ones."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these queries: assume not
        return False


def check_autocast(autocast, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> torch.dtype | None:
    """The dtype the gradient steps run in under autocast on ``device``, or None for no autocast.

    ``autocast``: "auto", None or False (none), "bf16"/"bfloat16"/torch.bfloat16 or "fp16"/"float16"/torch.float16.
    Anything else is a ValueError. "auto" is bf16 for float32 images (``dtype``) on a CUDA device that supports
    it or on a CPU with bf16 hardware (:func:`cpu_has_bf16`), none elsewhere.
    """
    if autocast is None or autocast is False:
        return None
    if isinstance(autocast, str) and autocast == "auto":
        device = torch.device(device)
        if dtype != torch.float32:
            return None
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
        return torch.bfloat16 if device.type == "cpu" and cpu_has_bf16() else None
    if isinstance(autocast, torch.dtype) and autocast in (torch.bfloat16, torch.float16):
        return autocast
    if isinstance(autocast, str) and autocast in AUTOCAST_DTYPES:
        return AUTOCAST_DTYPES[autocast]
    raise ValueError(f"autocast must be 'auto', None, 'bf16' or 'fp16', got {autocast!r}")


def check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (features masked per gradient step) must be a positive int, got {k!r}")
    return k


# Modules whose weight and bias autocast casts to its lower precision in every forward call (conv and linear are
# on its lower-precision lists on CUDA and CPU): their copies are cast once per job instead (:class:`LaidOutWeights`)
CAST_ONCE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)


class LaidOutWeights:
    """Copies of a model's parameters in the layout and dtype its gradient steps run fastest in, made once and put
    in the model's place (``module._parameters``) for a block of calls, then put back.

    Copied: 4-D parameters not stored channels_last (with ``channels_last``), and the weight and bias of each
    convolution and linear layer (exactly the classes of ``CAST_ONCE``, a parameter held by that layer alone) cast
    to ``cast`` (the autocast dtype: autocast would cast them to it in every call, and with copies already in it,
    it casts nothing). The copies are detached (no gradient reaches the model's weights) and made on the first
    :meth:`installed` block; the model's own parameters are never converted, and are back in place when the
    outermost block ends.

    Args:
        model: an nn.Module. channels_last: copy 4-D parameters channels_last. cast: a floating dtype or None.
    """

    def __init__(self, model: nn.Module, channels_last: bool, cast: torch.dtype | None = None):
        self.model, self.channels_last, self.cast = model, channels_last, cast
        self.slots: list[tuple[dict, str, nn.Parameter, nn.Parameter]] | None = None
        self.depth = 0

    def _copies(self) -> list[tuple[dict, str, nn.Parameter, nn.Parameter]]:
        """(the owning module's parameter dict, name, own parameter, copy) of every parameter that changes."""
        held = collections.Counter(id(t) for m in self.model.modules() for t in m._parameters.values()
                                   if t is not None)
        made: dict[int, nn.Parameter | None] = {}
        slots = []
        for m in self.model.modules():
            castable = self.cast is not None and type(m) in CAST_ONCE
            for name, t in m._parameters.items():
                if t is None:
                    continue
                if id(t) not in made:
                    new, changed = t.detach(), False
                    if self.channels_last and t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
                        new, changed = new.contiguous(memory_format=torch.channels_last), True
                    if castable and held[id(t)] == 1 and t.is_floating_point() and t.dtype != self.cast:
                        new, changed = new.to(self.cast), True
                    made[id(t)] = nn.Parameter(new, requires_grad=False) if changed else None
                if made[id(t)] is not None:
                    slots.append((m._parameters, name, t, made[id(t)]))
        return slots

    @contextlib.contextmanager
    def installed(self):
        """The copies in the model's place while the block runs (blocks nest; the outermost puts them back)."""
        if self.depth == 0:
            if self.slots is None:
                self.slots = self._copies()
            for params, name, _, copy in self.slots:
                params[name] = copy
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                for params, name, own, _ in self.slots:
                    params[name] = own


class LaidOutModel:
    """Calls a model with its parameters laid out once for the gradient steps (:class:`LaidOutWeights`): the
    copies are put in place for the length of a :meth:`installed` block (one round of steps), or of each call
    made outside one; nothing is converted per call. A callable that is not an nn.Module is called as it is.

    Args:
        model: an nn.Module or a callable [B, *D] -> [B, K].
        cast: the autocast dtype of the steps (its conv and linear weights are copied in it), or None.
    """

    channels_last = False

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor], cast: torch.dtype | None = None):
        self.model = model
        self.cast = cast
        self.weights = (LaidOutWeights(model, self.channels_last, cast)
                        if isinstance(model, nn.Module) and not isinstance(model, torch.jit.ScriptModule) else None)

    def installed(self):
        """A block in which the copies stay in the model's place."""
        return self.weights.installed() if self.weights is not None else contextlib.nullcontext()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.installed():
            return self.model(x)


class ChannelsLastModel(LaidOutModel):
    """Calls a model on channels_last inputs, with channels_last copies of its 4-D parameters.

    The copies are made once (detached: no gradient reaches the model's weights) and put in the model's place
    for a block of calls (:meth:`installed`: the gradient steps of a round), not per call; the model's own
    parameters are never converted. Parameters already channels_last are not copied.

    Args:
        model: an nn.Module or a callable [B, C, H, W] -> [B, K] (a callable gets channels_last inputs only).
        cast: as :class:`LaidOutModel`.
    """

    channels_last = True


def step_model(model: Callable[[torch.Tensor], torch.Tensor], autocast: torch.dtype | None
               ) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the gradient steps call: ``model`` (the gradient model's, :func:`gradient_model`) with its weights
    laid out and cast once for the job: a :class:`ChannelsLastModel` keeps its layout and gains the autocast
    copies; an nn.Module under autocast gets its conv and linear weights cast once (:class:`LaidOutModel`); a
    callable is called as it is."""
    if isinstance(model, ChannelsLastModel):
        return ChannelsLastModel(model.model, cast=autocast)
    if autocast is not None and isinstance(model, nn.Module) and not isinstance(model, torch.jit.ScriptModule):
        return LaidOutModel(model, cast=autocast)
    return model


def weights_swappable(model) -> str | None:
    """None when the gradient steps can put laid-out copies of ``model``'s weights in its place
    (:class:`LaidOutWeights`: channels_last and autocast copies); else why not: a TorchScript module (scripted
    or traced), or a module holding one, whose compiled code reads its own parameters."""
    if not isinstance(model, nn.Module):
        return "the model is not an nn.Module"
    if any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
        return "a TorchScript module, whose weights cannot be swapped for laid-out copies"
    return None


def gradient_model(fn: ModelFn, images: torch.Tensor, channels_last: bool | None) -> ModelFn:
    """The model the gradient steps call: ``fn``, or ``fn``'s model through :class:`ChannelsLastModel`. The
    decision and its reason go to the run's info (``channels_last``, :mod:`~overinterp_fast.runtime.runinfo`).

    Args:
        images: [N, *D]; channels_last applies to 4-D images only.
        channels_last: True: channels_last for 4-D images (inputs only, the weights as they are, where the
            weights cannot be swapped: :func:`weights_swappable`). False: never. None (auto): for 4-D images that
            are not float64 (the dtype of exactness checks) when the model is an nn.Module whose weights can be
            swapped, with a 4-D parameter (a convolution) not stored channels_last; it steps aside silently
            otherwise.
    """
    if images.dim() != 4 or channels_last is False:
        runinfo.note("channels_last", "off: " + ("channels_last=False" if channels_last is False
                                                 else "the inputs are not 4-D"))
        return fn
    model = fn.model
    why_not = weights_swappable(model)
    if channels_last is None:
        convs = why_not is None and any(t.dim() == 4 for t in model.parameters())
        if images.dtype == torch.float64 or not convs or model_memory_format(model) == torch.channels_last:
            why = ("float64 inputs" if images.dtype == torch.float64 else why_not if why_not is not None
                   else "no convolution weights" if not convs else "the weights are channels_last already")
            runinfo.note("channels_last", f"off: {why}")
            return fn
    if why_not is not None and isinstance(model, nn.Module):  # channels_last=True: the inputs only
        runinfo.note("channels_last", f"inputs only: {why_not}")
        return ModelFn(ChannelsLastModel(model.__call__), outputs=fn.outputs)
    runinfo.note("channels_last", "on")
    return ModelFn(ChannelsLastModel(model), outputs=fn.outputs)


class MaskExpander:
    """Feature masks [n, p] -> element masks (broadcastable to [n, *D]), differentiable.

    Where the feature map is ``arange(p)`` over the trailing dimensions D[lead:], repeated over the leading ones
    (the default pixel features of [C, H, W] images: lead = 1; one feature per element: lead = 0), the element
    mask is a broadcast view [n, 1, ..., 1, *D[lead:]] (no copy; its gradient sums over the leading
    dimensions). Any other map gathers with ``index_select``.
    """

    def __init__(self, feature_map: torch.Tensor, lead: int | None):
        self.shape = tuple(feature_map.shape)
        self.lead = lead
        self.flat = feature_map.reshape(-1)

    @staticmethod
    def probe(feature_map: torch.Tensor, p: int) -> tuple[int | None, torch.Tensor]:
        """(lead, 0-d bool tensor on the map's device: the map is arange(p) over D[lead:]); (None, False) when no
        trailing dimensions hold exactly p elements. Read the flag (with :func:`to_host`) to build the expander."""
        shape = tuple(feature_map.shape)
        for lead in range(len(shape) + 1):
            if math.prod(shape[lead:]) == p:
                want = torch.arange(p, device=feature_map.device).view(shape[lead:])
                return lead, (feature_map == want).all()
        return None, torch.zeros((), dtype=torch.bool)

    def __call__(self, m: torch.Tensor) -> torch.Tensor:
        n = m.shape[0]
        if self.lead is not None:
            return m.view(n, *([1] * self.lead), *self.shape[self.lead:])
        return m.index_select(1, self.flat).view(n, *self.shape)


def top_k_present(g: torch.Tensor, present: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest ``g`` among ``present`` features per row, ties to the lowest id.

    Args:
        g: [n, p] finite gradients; present: bool [n, p]; k <= p.

    Returns:
        int64 [n, k], in descending order of g (then ascending id); entries past a
        row's number of present features are absent features (distinct, in no particular order).

    For float16/bfloat16/float32 gradients each (gradient, id) pair becomes one
    unique int64 key (the gradient's bits mapped to an order-preserving unsigned
    integer, then the inverted id), so a plain ``topk`` is deterministic and
    avoids sorting all p entries. float64 gradients use a stable sort.
    """
    n, p = g.shape
    if g.dtype == torch.float64 or p >= 1 << 31:
        key = torch.where(present, g, torch.full_like(g, -torch.inf))
        return torch.sort(key, dim=1, descending=True, stable=True).indices[:, :k]
    bits = (g.float() + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits < 0, (~bits) & 0xFFFFFFFF, bits | 0x80000000)  # monotone in g, in [0, 2^32)
    ids = torch.arange(p, device=g.device)
    key = (ordered << 31) | (p - 1 - ids)
    key = torch.where(present, key, torch.full_like(key, -1))
    return torch.topk(key, k, dim=1, largest=True, sorted=True).indices


# The channels of a round's feature records (:class:`RoundSteps`)
MASK, PEN, RANK, F = range(4)


def records_dtype(dtype: torch.dtype, features: int) -> torch.dtype:
    """The dtype of a round's feature records: the images' (float32 or float64) where it holds every rank
    (0 .. ``features`` - 1) exactly, else float32 or float64."""
    exact32 = features <= 1 << 24
    if dtype == torch.float64 or (dtype == torch.float32 and exact32):
        return dtype
    return torch.float32 if exact32 else torch.float64


class RoundSteps:
    """The rounds of BackSelect of one job, each as one step function of fixed tensors, for up to ``capacity`` images
    (A of them in a round, :meth:`load`).

    A step, for the rows of a slice: the masked inputs ``lerp(x, baseline, M)`` (M: the feature mask, 1 = masked,
    broadcast to the elements), the model's forward and backward pass (the gradient of each row's f with respect
    to its M), then the ranking and the bookkeeping on the device: key = gradient + PEN (PEN = +0.0 present,
    -inf masked), a stable descending sort (ties: the lowest id), and one scatter that writes the w = min(k, p)
    features ranked first: M = 1, PEN = -inf, RANK = their places in the round's masking order (t w + j), F = f
    before the step (NaN where the step's f or gradient is not finite). Every step of a slice has the same shapes,
    reads and writes only the buffers below, and waits for nothing: on a GPU it is captured once and replayed
    (:class:`~overinterp_fast.runtime.graphs.GraphedStep`); elsewhere it runs eagerly, as the same function. The
    buffers are the job's, not a round's: a later round loads its rows into them (:meth:`load`), so a slice's step
    captured in one round is replayed in the next.

    Each row has w dummy features first (ids 0 .. w-1, always masked): at a row's last step, with fewer than w
    features left, the sort fills the w places with them (masked features tie at -inf and go by id), so every
    step writes w places and no real feature's records are written twice.

    Buffers: ``rec`` [capacity, w + p, 4] (M, PEN, RANK, F per feature; the leaf of the gradient), ``src``
    [capacity, w, 4] (what a step writes: 1, -inf, t w + j: the step counter, advanced by w per step; f), the inputs
    ``x`` [capacity, *D] and ``base`` ([1, *D] or [capacity, *D]) and ``targets`` [capacity, 1]. The step's other
    tensors are made and freed within it (inside a captured graph, in its memory pool).
    """

    def __init__(self, model, outputs: str, x: torch.Tensor, base: torch.Tensor, capacity: int, p: int, k: int,
                 autocast: torch.dtype | None, expand: MaskExpander):
        dev, dtype = x.device, x.dtype
        w = min(k, p)
        self.model, self.outputs, self.autocast, self.expand = model, outputs, autocast, expand
        self.w, self.p, self.rows = w, p, 0
        fmt = torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
            and not x.is_contiguous() else torch.contiguous_format
        self.x = torch.empty((capacity, *x.shape[1:]), dtype=dtype, device=dev).contiguous(memory_format=fmt)
        self.base = torch.empty((capacity if base.shape[0] > 1 else 1, *base.shape[1:]), dtype=base.dtype,
                                device=dev).contiguous(memory_format=fmt)
        self.targets = torch.empty((capacity, 1), dtype=torch.int64, device=dev)
        rdt = records_dtype(dtype, w + p)
        self.cast_mask = rdt != dtype  # the mask reaches the model in the images' dtype
        # per feature (M, PEN, RANK, F): masked features and the dummies (1, -inf, +inf, 0), present ones
        # (+0.0, +0.0, +inf, 0); what a step writes (1, -inf, t w + j, f)
        self.init = torch.tensor([[1.0, -torch.inf, torch.inf, 0.0], [0.0, 0.0, torch.inf, 0.0],
                                  [1.0, -torch.inf, 0.0, 0.0]],
                                 dtype=rdt, pin_memory=dev.type == "cuda").to(dev, non_blocking=True)  # no wait
        self.rec = torch.empty((capacity, w + p, 4), dtype=rdt, device=dev)
        self.src = torch.empty((capacity, w, 4), dtype=rdt, device=dev)
        self.ranks = torch.arange(w, device=dev, dtype=rdt)
        self.zeros = torch.zeros((capacity, w), dtype=torch.float64, device=dev)
        self.wide: torch.Tensor | None = None  # float64 records of f, where f is wider than ``rec`` (made once)

    def load(self, x: torch.Tensor, base: torch.Tensor, targets: torch.Tensor, present: torch.Tensor) -> None:
        """A round's A rows: their inputs x [A, *D], baselines ([1, *D] or [A, *D]), targets [A] and present
        features bool [A, p], written into the first A rows of the buffers (nothing waits for the device)."""
        a, w = present.shape[0], self.w
        self.rows = a
        self.x[:a].copy_(x)
        self.base[:base.shape[0]].copy_(base)
        self.targets[:a].copy_(targets.view(-1, 1))
        rec = self.rec[:a]
        rec[:, :w].copy_(self.init[0])
        torch.where(present.unsqueeze(-1), self.init[1], self.init[0], out=rec[:, w:])
        src = self.src[:a]
        src.copy_(self.init[2])
        src[..., RANK].add_(self.ranks)

    def step(self, sl: slice) -> tuple[Callable[[], None], list[torch.Tensor]]:
        """(the step function of rows ``sl``, the tensors it changes)."""
        leaf = self.rec[sl].detach().requires_grad_(True)  # shares rec's memory: the steps write rec
        x, tg, src, zeros = self.x[sl], self.targets[sl], self.src[sl], self.zeros[sl]
        base = self.base[sl] if self.base.shape[0] > 1 else self.base
        n, w, dev = x.shape[0], self.w, x.device
        fit = self.outputs == "logits"
        ctx = (lambda: torch.autocast(dev.type, dtype=self.autocast)) if self.autocast is not None else (
            contextlib.nullcontext)
        ones: list[torch.Tensor] = []  # d(f)/d(f) for autograd, made by the first call (an eager one)
        rows = (sl.start, sl.stop)

        def step() -> None:
            with torch.enable_grad():
                m = leaf[:, w:, MASK]
                me = self.expand(m.to(x.dtype) if self.cast_mask else m)
                xm = torch.lerp(x, base, me)
                with ctx():
                    out = self.model(xm)
                out = ModelFn.check_output(out, n, dev)
                if self.autocast is not None:
                    out = out.float()
                f = (torch.softmax(out, 1) if fit else out).gather(1, tg)
                if not ones:
                    ones.append(torch.ones_like(f))
                (g,) = torch.autograd.grad(f, leaf, grad_outputs=ones[0])
            with torch.no_grad():
                g = g[..., MASK]
                gs = torch.sum(g, 1, keepdim=True, dtype=torch.float64)  # finite exactly when every entry is
                if self.wide is None and f.dtype == torch.float64 and self.rec.dtype != torch.float64:
                    self.wide = torch.zeros(self.rec.shape[:2], dtype=torch.float64, device=dev)  # f kept exact
                wide = None if self.wide is None else self.wide[rows[0]:rows[1]]
                # f, or NaN where f or the gradient is not finite (f + 0 * sum: inf * 0 is NaN)
                fsrc = torch.addcmul(f, gs, zeros) if wide is not None else torch.addcmul(f, gs, zeros,
                                                                                          out=src[..., F])
                key = g + leaf[..., PEN]
                top = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :w]
                leaf.scatter_(1, top.unsqueeze(-1).expand(n, w, 4), src)
                if wide is not None:
                    wide.scatter_(1, top, fsrc)
                src[..., RANK].add_(w)

        return step, [self.rec[sl], src] + ([] if self.wide is None else [self.wide[sl]])

    def selection(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(order int64 [A, p]: each row's features in the order masked this round, then the others; f before
        each step [A, ceil(p / w)]: ``f[a, t]`` before step t of row a, NaN where it or that step's gradient was not
        finite), on the device."""
        w, a = self.w, self.rows
        rec = self.rec[:a].detach()
        order = torch.argsort(rec[:, w:, RANK], dim=1, stable=True)
        f = (rec[:, w:, F] if self.wide is None else self.wide[:a, w:]).gather(1, order[:, ::w])
        return order, f


def _score_masked(fn: ModelFn, prep: Prepared, targets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """f of the fully masked input (the baseline) of each image in ``rows`` (targets: theirs, [n])."""
    if prep.baseline.shape[0] > 1:
        base = prep.baseline.index_select(0, rows)
    else:
        base = prep.baseline.expand(rows.numel(), *prep.baseline.shape[1:]).contiguous()
    return fn.score(base, targets)


class JobSteps:
    """The gradient steps of one job: its :class:`RoundSteps` buffers (made by the first round, for every image of
    the job), the steps made so far per slice of rows, and their :class:`~overinterp_fast.runtime.graphs.StepGraphs`.
    A slice's step is made, and on a GPU captured, once per job: a later round with the same slice replays it.

    Attributes:
        family: the job's step graphs (``captures``, ``replays``; on a CPU, those a GPU would make).
        shapes: the distinct slice sizes (images per backward pass) the steps ran.
    """

    def __init__(self, device: torch.device):
        self.family = StepGraphs(device)
        self.state: RoundSteps | None = None
        self.made: dict[tuple[int, int], GraphedStep] = {}
        self.shapes: set[int] = set()

    def round(self, smodel, outputs: str, x: torch.Tensor, base: torch.Tensor, targets: torch.Tensor,
              present: torch.Tensor, capacity: int, k: int, autocast: torch.dtype | None,
              expand: MaskExpander) -> RoundSteps:
        """The job's :class:`RoundSteps` (made by the first round) with this round's rows loaded."""
        if self.state is None:
            self.state = RoundSteps(smodel, outputs, x, base, capacity, present.shape[1], k, autocast, expand)
        self.state.load(x, base, targets, present)
        return self.state

    def run(self, sl: slice, calls: int, chunk: int) -> None:
        """One step of rows ``sl`` (``calls``: the calls of it this round will make, counting this one; ``chunk``:
        the most rows a step takes now)."""
        key = (sl.start, sl.stop)
        g = self.made.get(key)
        if g is None:  # a new slice: a new number of images stepping, or a chunk halved by an out-of-memory error
            for ab in [ab for ab in self.made if ab[1] - ab[0] > chunk]:
                self.made.pop(ab).graph = None  # wider than a chunk now: never replayed again, its memory can go
            g = self.made[key] = self.family.step(*self.state.step(sl), calls=calls)
            self.shapes.add(sl.stop - sl.start)
        g()

    def counts(self) -> StepCounts:
        """The job's step shapes, captures and replays (StepCounts)."""
        f = self.family
        return StepCounts(shapes=tuple(sorted(self.shapes)), captures=f.captures, replays=f.replays,
                          graphs="cuda" if f.on else ("stand-in" if f.counting else "off"))

    def release(self) -> None:
        """Drop the steps, their graphs and pool, and the buffers."""
        self.made.clear()
        self.family.release()
        self.state = None


def _backselect(fn: ModelFn, smodel, prep: Prepared, targets: torch.Tensor, present: torch.Tensor,
                images: list[int], counts: list[int], k: int, grad_runner: ChunkRunner, autocast: torch.dtype | None,
                expand: MaskExpander, bar: tqdm, job: JobSteps, grow_bar: bool = True
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Mask the round's features block by block, all images of the round in one backward pass per step.

    Args:
        fn: the user's model (f of the fully masked inputs); smodel: what the gradient steps call (:func:`step_model`).
        present: bool [N, p], each image's features present at the start of its round.
        images: the round's images; counts: their numbers of present features (> 0), known on the host.
        job: the job's steps (:class:`JobSteps`: buffers and graphs made once per job).

    Returns:
        (order int64 [A, p], f before each step [A, nb_max] and f with every feature masked float64 [A], on the
        device; the round's rows in the order of these tensors: positions in ``images``).

    No host read and no wait for the device: image a takes ceil(counts[a] / k) steps, known in advance. The rows
    go in descending order of their steps, so the images still stepping are always the first L rows: a run of
    steps with the same L is one step function of fixed shapes (:class:`RoundSteps`), captured once per job on a
    GPU.
    """
    dev = prep.images.device
    steps = [-(-c // k) for c in counts]
    perm = sorted(range(len(images)), key=lambda a: -steps[a])  # stable: ties keep their order
    (rows,) = upload(dev, [images[a] for a in perm])
    x = prep.images.index_select(0, rows)
    base = prep.baseline.index_select(0, rows) if prep.baseline.shape[0] > 1 else prep.baseline
    if isinstance(smodel, ChannelsLastModel):  # masked inputs are made channels_last, not converted each step
        x, base = (t.contiguous(memory_format=torch.channels_last) for t in (x, base))
    tg = targets.index_select(0, rows)
    state = job.round(smodel, fn.outputs, x, base, tg, present.index_select(0, rows), present.shape[0], k, autocast,
                      expand)
    ordered = [steps[a] for a in perm]
    if grow_bar:  # a later round: its steps join the bar (the first round's are its total from the start)
        bar.total += ordered[0]
        bar.refresh()
    t = 0
    installed = smodel.installed() if isinstance(smodel, LaidOutModel) else contextlib.nullcontext()
    with installed:
        while t < ordered[0]:
            live = sum(s > t for s in ordered)  # rows [0, live) step now
            until = min(s for s in ordered if s > t)
            for u in range(t, until):
                grad_runner.run(live, lambda sl: job.run(sl, until - u, grad_runner.chunk))
                bar.update(1)
            t = until
    order, f = state.selection()
    with torch.no_grad():  # f with every feature masked: the value after each image's last block
        masked = grad_runner.run(len(images), lambda sl: _score_masked(fn, prep, tg[sl], rows[sl]))
    return order, f, masked, perm


@dataclass
class _Round:
    """One round of one image on the host: its masking order (int64 [m]), block offsets, values, score."""

    image: int
    order: torch.Tensor
    blocks: list[int]
    values: list[float]
    score: float


def _rounds(order: torch.Tensor, f: torch.Tensor, masked: torch.Tensor, perm: list[int], images: list[int],
            counts: list[int], k: int, scores: list[float]) -> list[_Round]:
    """The round's selection read to the host (one :func:`to_host`), per image in ``images``' order; raises on a
    non-finite f or gradient."""
    order, f, masked = to_host(order, f, masked, label="round")
    order, f, masked = order.numpy(), f.numpy(), masked.tolist()  # host bookkeeping in numpy: no op per image
    out: list[_Round | None] = [None] * len(images)
    for r, a in enumerate(perm):
        i, c = images[a], counts[a]
        nb = -(-c // k)
        if not np.isfinite(f[r, :nb]).all():
            raise FloatingPointError(NON_FINITE)
        blocks = [min(b * k, c) for b in range(nb + 1)]
        out[a] = _Round(i, torch.from_numpy(order[r, :c].copy()), blocks, f[r, 1:nb].tolist() + [masked[r]],
                        scores[i])
    return out


def gradient_sis(
    fn: ModelFn,
    prep: Prepared,
    targets: torch.Tensor,
    scores0: torch.Tensor,
    thresholds: list[float],
    collection: bool,
    k: int,
    runner: ChunkRunner,
    autocast: torch.dtype | None,
    progress: bool | None,
    channels_last: bool | None = None,
) -> list[SISResult]:
    """Batched-gradient SIS of every image; see :func:`overinterp_fast.fast_sis`.

    Args:
        fn: the user's model; prep: images [N, *D], baseline, features (p of them).
        targets: int64 [N]; scores0: float64 [N], f of each image.
        autocast: the gradient steps' autocast dtype (:func:`check_autocast`), or None.
        channels_last: the gradient steps' memory format (:func:`gradient_model`).

    Host reads, each one :func:`to_host` call: one at the start, one per round of BackSelect, FindSIS's (one per
    chunk of prefixes) and, with a collection, one per round for f of the rest; on a GPU, one more per captured
    step (its check, :class:`~overinterp_fast.runtime.graphs.GraphedStep`).
    """
    images = prep.images
    dev = images.device
    n, p = images.shape[0], prep.num_features
    smodel = step_model(gradient_model(fn, images, channels_last).model, autocast)
    lead, broadcast = MaskExpander.probe(prep.feature_map, p)
    scores_t, targets_t, broadcast = to_host(scores0, targets, broadcast, label="start")
    scores, targets_host = scores_t.tolist(), targets_t.tolist()
    expand = MaskExpander(prep.feature_map, lead if bool(broadcast) else None)
    grad_runner = ChunkRunner(n, dev)  # images per backward pass; halves on out-of-memory
    job = JobSteps(dev)
    evaluator = CandidateEvaluator(fn, prep, targets, runner, measure=fn.score_and_top1)
    present = torch.ones((n, p), dtype=torch.bool, device=dev)  # each image's R for its current round
    counts = [p] * n  # features present per image, kept on the host
    rounds: list[list[SISResult]] = [[] for _ in range(n)]
    active = list(range(n))
    bar = progress_bar(tqdm, total=-(-p // k), unit="step", desc="gradient SIS",
                       disable=None if progress is None else not progress)
    info = RunInfo(step="eager")  # the call's, on every result: "cuda-graph" once a round's steps replayed a graph
    first = True
    while active:
        cs = [counts[i] for i in active]
        order, f, masked, perm = _backselect(fn, smodel, prep, targets, present, active, cs, k, grad_runner,
                                             autocast, expand, bar, job, grow_bar=not first)
        first = False
        if job.family.on and job.family.replays:
            info.step = "cuda-graph"
        state = _rounds(order, f, masked, perm, active, cs, k, scores)
        verified = _find_sis(evaluator, state, thresholds, p)
        candidates, drop_rows, drop_features = [], [], []
        for st in state:
            i = st.image
            sis, sis_score = None, None
            tau = thresholds[i]
            if i in verified:
                start, sis_score = verified[i]
                sis = torch.from_numpy(st.order.numpy()[start:][::-1].copy())
            rounds[i].append(
                SISResult(
                    order=st.order, values=torch.tensor(st.values, dtype=torch.float64), sis=sis,
                    mask=None if sis is None else prep.feature_mask(sis), target=targets_host[i], score=st.score,
                    threshold=tau, blocks=torch.tensor(st.blocks, dtype=torch.int64), sis_score=sis_score,
                    info=info,
                )
            )
            if collection and sis is not None and 0 < sis.numel() < st.blocks[-1]:
                counts[i] -= sis.numel()
                drop_rows += [i] * sis.numel()
                drop_features += sis.tolist()
                candidates.append(i)
        active = []
        if candidates:  # f of each input with its SIS masked decides whether another round runs
            check_candidates(evaluator.prep, candidates, candidates, rows=present.shape[0])  # host: no device wait
            rows, r, c = upload(dev, candidates, drop_rows, drop_features)
            present.index_put_((r, c), torch.zeros((), dtype=torch.bool, device=dev))  # mask each SIS
            with torch.no_grad():
                f, _ = evaluator(present, rows, rows, torch.full_like(rows, -1), check_indices=False)
            f, finite = to_host(f, torch.isfinite(f).all(), label="rest")
            check_finite_scores(finite)
            for i, s in zip(candidates, f.tolist()):
                if s >= thresholds[i]:
                    scores[i] = s
                    active.append(i)
    bar.close()
    info.steps = job.counts()
    job.release()
    return [first_with_collection(r, collection) for r in rounds]


def _find_sis(evaluator: CandidateEvaluator, state: list[_Round], thresholds: list[float],
              p: int) -> dict[int, tuple[int, float]]:
    """Per image with f >= threshold: (start in order, f(x_S)) of the smallest passing suffix of blocks.

    Prefix j = the last j blocks present, j = 0 .. nb, all images' prefixes scored together in chunks
    (:func:`~overinterp_fast.methods.prefix.first_passing_prefix`).
    """
    rows = [st for st in state if st.score >= thresholds[st.image]]
    if not rows:
        return {}
    dev = evaluator.prep.images.device
    pos = np.full((len(rows), p), p, dtype=np.int64)  # host bookkeeping in numpy: no op per image
    sizes = []
    for r, st in enumerate(rows):
        m, nb = st.blocks[-1], len(st.blocks) - 1
        pos[r, st.order.numpy()] = np.arange(m - 1, -1, -1)  # last masked first
        sizes.append([m - st.blocks[nb - j] for j in range(nb + 1)])
    images = [st.image for st in rows]
    (flat,) = upload(dev, pos)
    with torch.no_grad():
        hits = first_passing_prefix(evaluator, flat.view(len(rows), p), images, sizes,
                                    lambda r, f, top1: f >= thresholds[images[r]])
    found = {}
    for st, hit in zip(rows, hits):
        if hit is not None:
            j, f = hit
            found[st.image] = (st.blocks[len(st.blocks) - 1 - j], f)
    return found
