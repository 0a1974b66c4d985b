"""Batched-gradient SIS (Carter et al. 2021, section S5; docs: algorithms.md, Batched-gradient SIS) for large images.

BackSelect: the mask M over features (1 = masked) enters the model as
x * (1 - M) + baseline * M. Each step takes one backward pass for all images of
a round together (the gradient of the sum of their target probabilities with
respect to M), and masks, per image, the k present features with the largest
gradient (ties: lowest feature id). About p / k steps per round.

The step loop never waits for the device: each image's number of steps, ceil(count / k), is known on the host
in advance, and the selection, the masks, the masking order, the values of f and the finiteness check stay on the
device, written by index into tensors made once per round. The host reads them once per round, in one
:func:`~overinterp_fast.runtime.sync.to_host` call.

FindSIS: the candidate sets are "only the last j blocks present", j = 0, 1, ...;
the SIS is the first that reaches the threshold. Instead of one forward pass per
pop, prefixes are evaluated in growing chunks, packed across images and prefix sizes
into batches built by the fused mask_apply kernel
(:func:`~overinterp_fast.methods.prefix.first_passing_prefix`); the first
success in ascending j is the answer popping one block at a time would give.
These evaluations run on the user's model in the images' dtype and memory format, without autocast, so every SIS
is verified in full precision: ``sis_score`` = f(x_S) >= threshold.

The gradient steps may run faster than that: under autocast (bf16 by default on CUDA and on CPUs with bf16
hardware) and on channels_last
inputs (by default for 4-D inputs of a torch model; see :class:`ChannelsLastModel`).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from ..runtime import runinfo
from ..runtime.batching import CandidateEvaluator, ChunkRunner, check_candidates
from ..runtime.estimate import progress_bar
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores, model_memory_format
from ..runtime.schedule import upload
from ..runtime.sync import to_host
from .prefix import first_passing_prefix
from .results import SISResult, first_with_collection

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


class ChannelsLastModel:
    """Calls a model on channels_last inputs, with channels_last copies of its 4-D parameters.

    The copies are made once (detached: no gradient reaches the model's weights) and passed for each call by
    ``torch.func.functional_call``, which swaps them into the module for the call's duration only; the model's
    own parameters are never converted. Parameters already channels_last are not copied.

    Args:
        model: an nn.Module or a callable [B, C, H, W] -> [B, K] (a callable gets channels_last inputs only).
    """

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor]):
        self.model = model
        self.weights: dict[str, torch.Tensor] = {}
        if isinstance(model, nn.Module):
            for name, t in model.named_parameters():
                if t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
                    self.weights[name] = t.detach().contiguous(memory_format=torch.channels_last)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        if not self.weights:
            return self.model(x)
        return torch.func.functional_call(self.model, self.weights, (x,), strict=False)


def weights_swappable(model) -> str | None:
    """None when ``torch.func.functional_call`` can run ``model`` with other weights (what
    :class:`ChannelsLastModel` does with its channels_last copies); else why not: a TorchScript module (scripted
    or traced), or a module holding one, whose parameters the stateless API cannot swap."""
    if not isinstance(model, nn.Module):
        return "the model is not an nn.Module"
    if any(isinstance(m, torch.jit.ScriptModule) for m in model.modules()):
        return "a TorchScript module, whose weights torch.func.functional_call cannot swap"
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


def score_and_gradient(
    fn: ModelFn, x: torch.Tensor, base: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
    expand: MaskExpander, autocast: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """f and df/dM of images ``x`` under feature masks ``mask``.

    Args:
        x: [n, *D] images; base: [1, *D] or [n, *D] baselines; targets: int64 [n];
        mask: [n, p] (1 = masked) in the images' dtype; expand: feature masks to element masks.
        autocast: the dtype of the model's forward pass under autocast, or None.

    Returns:
        (float64 [n], [n, p] in the images' dtype), on the images' device; only the gradient with respect to
        the mask is computed (not the model's weights').
    """
    m = mask.detach().clone().requires_grad_(True)
    ctx = torch.autocast(x.device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with torch.enable_grad():
        me = expand(m)
        xm = x * (1 - me) + base * me
        with ctx:
            out = fn.forward(xm)
        probs = fn.probabilities(out.float() if autocast is not None else out)
        f = probs.gather(1, targets.view(-1, 1)).view(-1)
        (g,) = torch.autograd.grad(f.sum(), m)
    return f.detach().double(), g.detach()


@dataclass
class Selection:
    """One round of BackSelect for images ``rows`` (A of them), on the device.

    Attributes:
        order: int64 [A, nb_max, w] (w = min(k, p)): block t of image a is ``order[a, t, :size]``; flattened,
            ``order[a].view(-1)[:count_a]`` is the masking order (entries past count_a are unused).
        values: float64 [A, nb_max]: ``values[a, t]`` = f before step t (t < the image's steps).
        masked: float64 [A]: f with every feature masked.
        finite: 0-d bool: every f and gradient of the round was finite.
    """

    order: torch.Tensor
    values: torch.Tensor
    masked: torch.Tensor
    finite: torch.Tensor


def _backselect(fn: ModelFn, gfn: ModelFn, prep: Prepared, targets: torch.Tensor, present: torch.Tensor,
                images: list[int], counts: list[int], k: int, grad_runner: ChunkRunner, autocast: torch.dtype | None,
                expand: MaskExpander, bar: tqdm) -> Selection:
    """Mask the round's features block by block, all images of the round in one backward pass per step.

    Args:
        fn: the user's model (f of the fully masked inputs); gfn: the model of the gradient steps.
        present: bool [N, p], each image's features present at the start of its round.
        images: the round's images; counts: their numbers of present features (> 0), known on the host.

    No host read and no wait for the device: image a takes ceil(counts[a] / k) steps, so the rows of each step
    are known in advance; each step writes its selection into the round's tensors by index.
    """
    dev, dtype = prep.images.device, prep.images.dtype
    A, p = len(images), prep.num_features
    w = min(k, p)
    steps = [-(-c // k) for c in counts]
    nb_max = max(steps)
    (rows,) = upload(dev, images)
    pres = present.index_select(0, rows)  # [A, p]
    mask = (~pres).to(dtype)
    x = prep.images.index_select(0, rows)
    base = prep.baseline.index_select(0, rows) if prep.baseline.shape[0] > 1 else prep.baseline
    if isinstance(gfn.model, ChannelsLastModel):  # masked inputs are made channels_last, not converted each step
        x, base = (t.contiguous(memory_format=torch.channels_last) for t in (x, base))
    tg = targets.index_select(0, rows)
    order = torch.zeros((A, nb_max, w), dtype=torch.int64, device=dev)
    values = torch.zeros((A, nb_max), dtype=torch.float64, device=dev)
    finite = torch.ones((), dtype=torch.bool, device=dev)
    sub, xs, bs, ts = None, x, base, tg  # the step's rows (None: all A) and their inputs
    for t in range(nb_max):
        now = [a for a in range(A) if steps[a] > t]
        if len(now) < (A if sub is None else sub.numel()):  # images out of steps: gather the rest once
            (sub,) = upload(dev, now)
            xs, ts = x.index_select(0, sub), tg.index_select(0, sub)
            bs = base.index_select(0, sub) if base.shape[0] > 1 else base
        ms = mask if sub is None else mask.index_select(0, sub)
        f, g = grad_runner.run(
            len(now),
            lambda sl: score_and_gradient(gfn, xs[sl], bs[sl] if bs.shape[0] > 1 else bs, ts[sl], ms[sl], expand,
                                          autocast),
        )
        finite &= torch.isfinite(g).all() & torch.isfinite(f).all()
        ps = pres if sub is None else pres.index_select(0, sub)
        # [L, w]; past a row's present count come absent features, which are masked already: no-op to mask again
        idx = top_k_present(g, ps, w)
        if sub is None:
            mask.scatter_(1, idx, 1.0)
            pres.scatter_(1, idx, False)
            values[:, t] = f
            order[:, t] = idx
        else:
            mask.index_copy_(0, sub, ms.scatter(1, idx, 1.0))
            pres.index_copy_(0, sub, ps.scatter(1, idx, False))
            values.select(1, t).index_copy_(0, sub, f)
            order.select(1, t).index_copy_(0, sub, idx)
        bar.update(1)
    with torch.no_grad():  # f with every feature masked: the value after each image's last block
        masked = grad_runner.run(A, lambda sl: _score_masked(fn, prep, tg[sl], rows[sl]))
    return Selection(order, values, masked, finite)


def _score_masked(fn: ModelFn, prep: Prepared, targets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """f of the fully masked input (the baseline) of each image in ``rows`` (targets: theirs, [n])."""
    if prep.baseline.shape[0] > 1:
        base = prep.baseline.index_select(0, rows)
    else:
        base = prep.baseline.expand(rows.numel(), *prep.baseline.shape[1:]).contiguous()
    return fn.score(base, targets)


@dataclass
class _Round:
    """One round of one image on the host: its masking order (int64 [m]), block offsets, values, score."""

    image: int
    order: torch.Tensor
    blocks: list[int]
    values: list[float]
    score: float


def _rounds(sel: Selection, images: list[int], counts: list[int], k: int, scores: list[float]) -> list[_Round]:
    """The round's selection read to the host (one :func:`to_host`), per image; raises on a non-finite value."""
    order, values, masked, finite = to_host(sel.order, sel.values, sel.masked, sel.finite, label="round")
    if not bool(finite):
        raise FloatingPointError(NON_FINITE)
    out = []
    for a, (i, c) in enumerate(zip(images, counts)):
        nb = -(-c // k)
        blocks = [min(b * k, c) for b in range(nb + 1)]
        vals = values[a, 1:nb].tolist() + [float(masked[a])]
        out.append(_Round(i, order[a].reshape(-1)[:c].clone(), blocks, vals, scores[i]))
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
    chunk of prefixes) and, with a collection, one per round for f of the rest.
    """
    images = prep.images
    dev = images.device
    n, p = images.shape[0], prep.num_features
    gfn = gradient_model(fn, images, channels_last)
    lead, broadcast = MaskExpander.probe(prep.feature_map, p)
    scores_t, targets_t, broadcast = to_host(scores0, targets, broadcast, label="start")
    scores, targets_host = scores_t.tolist(), targets_t.tolist()
    expand = MaskExpander(prep.feature_map, lead if bool(broadcast) else None)
    grad_runner = ChunkRunner(n, dev)  # images per backward pass; halves on out-of-memory
    evaluator = CandidateEvaluator(fn, prep, targets, runner, measure=fn.score_and_top1)
    present = torch.ones((n, p), dtype=torch.bool, device=dev)  # each image's R for its current round
    counts = [p] * n  # features present per image, kept on the host
    rounds: list[list[SISResult]] = [[] for _ in range(n)]
    active = list(range(n))
    bar = progress_bar(tqdm, total=-(-p // k), unit="step", desc="gradient SIS",
                       disable=None if progress is None else not progress)
    first = True
    while active:
        cs = [counts[i] for i in active]
        if not first:  # the bar starts with the first round's steps; each later round adds its own
            bar.total += -(-max(cs) // k)
            bar.refresh()
        first = False
        sel = _backselect(fn, gfn, prep, targets, present, active, cs, k, grad_runner, autocast, expand, bar)
        state = _rounds(sel, active, cs, k, scores)
        verified = _find_sis(evaluator, state, thresholds, p)
        candidates, drop_rows, drop_features = [], [], []
        for st in state:
            i = st.image
            sis, sis_score = None, None
            tau = thresholds[i]
            if i in verified:
                start, sis_score = verified[i]
                sis = st.order[start:].flip(0).clone()
            rounds[i].append(
                SISResult(
                    order=st.order, values=torch.tensor(st.values, dtype=torch.float64), sis=sis,
                    mask=None if sis is None else prep.feature_mask(sis), target=targets_host[i], score=st.score,
                    threshold=tau, blocks=torch.tensor(st.blocks, dtype=torch.int64), sis_score=sis_score,
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
    pos = torch.full((len(rows), p), p, dtype=torch.int64)
    sizes = []
    for r, st in enumerate(rows):
        m, nb = st.blocks[-1], len(st.blocks) - 1
        pos[r, st.order] = torch.arange(m - 1, -1, -1)  # last masked first
        sizes.append([m - st.blocks[nb - j] for j in range(nb + 1)])
    images = [st.image for st in rows]
    (flat,) = upload(dev, pos.numpy())
    with torch.no_grad():
        hits = first_passing_prefix(evaluator, flat.view(len(rows), p), images, sizes,
                                    lambda r, f, top1: f >= thresholds[images[r]])
    found = {}
    for st, hit in zip(rows, hits):
        if hit is not None:
            j, f = hit
            found[st.image] = (st.blocks[len(st.blocks) - 1 - j], f)
    return found
