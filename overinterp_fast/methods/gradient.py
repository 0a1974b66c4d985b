"""Batched-gradient SIS (Carter et al. 2021, section S5; docs: algorithms.md, Batched-gradient SIS) for large images.

BackSelect: the mask M over features (1 = masked) enters the model as
x * (1 - M) + baseline * M. Each step takes one backward pass for all images of
a round together (the gradient of the sum of their target probabilities with
respect to M), and masks, per image, the k present features with the largest
gradient (ties: lowest feature id, by a stable sort). About p / k steps per round.

FindSIS: the candidate sets are "only the last j blocks present", j = 0, 1, ...;
the SIS is the first that reaches the threshold. Instead of one forward pass per
pop, prefixes are evaluated in growing chunks (8, 16, 32, ... per image), packed
across images into batches built by the fused mask_apply kernel; the first
success in ascending j is the answer popping one block at a time would give.
These evaluations run in the images' dtype without autocast, so every SIS is
verified in full precision: ``sis_score`` = f(x_S) >= threshold.
"""
from __future__ import annotations

import contextlib

import torch
from tqdm.auto import tqdm

from ..runtime.batching import CandidateEvaluator, ChunkRunner
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, check_finite_scores
from .prefix import first_passing_prefix
from .results import SISResult, first_with_collection

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def check_autocast(autocast) -> torch.dtype | None:
    if autocast is None or autocast is False:
        return None
    if isinstance(autocast, torch.dtype) and autocast in (torch.bfloat16, torch.float16):
        return autocast
    if isinstance(autocast, str) and autocast in AUTOCAST_DTYPES:
        return AUTOCAST_DTYPES[autocast]
    raise ValueError(f"autocast must be None, 'bf16' or 'fp16', got {autocast!r}")


def check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (features masked per gradient step) must be a positive int, got {k!r}")
    return k


def top_k_present(g: torch.Tensor, present: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest ``g`` among ``present`` features per row, ties to the lowest id.

    Args:
        g: [n, p] finite gradients; present: bool [n, p]; k <= p.

    Returns:
        int64 [n, k], in descending order of g (then ascending id); entries past a
        row's number of present features are arbitrary absent features.

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
    fn: ModelFn, prep: Prepared, targets: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
    autocast: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """f and df/dM for images ``rows`` under feature masks ``mask`` ([n, p], 1 = masked).

    Returns (float64 [n], [n, p] in the images' dtype).
    """
    x = prep.images[rows]
    base = prep.baseline[rows] if prep.baseline.shape[0] > 1 else prep.baseline
    m = mask.detach().clone().requires_grad_(True)
    ctx = torch.autocast(x.device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with torch.enable_grad():
        me = m[:, prep.feature_map]  # [n, *D]
        xm = x * (1 - me) + base * me
        with ctx:
            out = fn.forward(xm)
        probs = fn.probabilities(out.float() if autocast is not None else out)
        f = probs.gather(1, targets[rows].view(-1, 1)).view(-1)
        (g,) = torch.autograd.grad(f.sum(), m)
    return f.detach().double(), g.detach()


class _Round:
    """One round (BackSelect + FindSIS) of one image, host side."""

    __slots__ = ("image", "order", "blocks", "values", "score")

    def __init__(self, image: int, score: float):
        self.image = image
        self.order: list[torch.Tensor] = []
        self.blocks = [0]
        self.values: list[float] = []
        self.score = score


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
) -> list[SISResult]:
    """Batched-gradient SIS of every image; see :func:`overinterp_fast.fast_sis`."""
    images = prep.images
    dev = images.device
    n, p = images.shape[0], prep.num_features
    targets_host = targets.tolist()
    grad_runner = ChunkRunner(n, dev)  # images per backward pass; halves on out-of-memory
    evaluator = CandidateEvaluator(fn, prep, targets, runner, measure=fn.score_and_top1)
    present = torch.ones((n, p), dtype=torch.bool, device=dev)  # each image's R for its current round
    rounds: list[list[SISResult]] = [[] for _ in range(n)]
    scores = scores0.tolist()
    active = list(range(n))
    bar = tqdm(total=0, unit="step", desc="gradient SIS", disable=None if progress is None else not progress)
    while active:
        state = [_Round(i, scores[i]) for i in active]
        _backselect(fn, prep, targets, present, state, k, grad_runner, autocast, bar)
        verified = _find_sis(evaluator, state, thresholds, p)
        next_active, candidates = [], []
        for st in state:
            i = st.image
            m = st.blocks[-1]
            order = torch.cat(st.order) if st.order else torch.zeros(0, dtype=torch.int64)
            sis, sis_score = None, None
            tau = thresholds[i]
            if st.score >= tau and st.image in verified:
                start, sis_score = verified[st.image]
                sis = order[start:].flip(0).clone()
            rounds[i].append(
                SISResult(
                    order=order, values=torch.tensor(st.values, dtype=torch.float64), sis=sis,
                    mask=None if sis is None else prep.feature_mask(sis), target=targets_host[i], score=st.score,
                    threshold=tau, blocks=torch.tensor(st.blocks, dtype=torch.int64), sis_score=sis_score,
                )
            )
            if collection and sis is not None and 0 < sis.numel() < m:
                present[i, sis.to(dev)] = False
                candidates.append(i)
        if candidates:  # f of each input with its SIS masked decides whether another round runs
            rows = torch.tensor(candidates, device=dev)
            f, _ = evaluator(present, rows, rows, torch.full_like(rows, -1))
            check_finite_scores(torch.isfinite(f).all())
            for i, s in zip(candidates, f.tolist()):
                if s >= thresholds[i]:
                    scores[i] = s
                    next_active.append(i)
        active = next_active
    bar.close()
    return [first_with_collection(r, collection) for r in rounds]


def _backselect(fn, prep, targets, present, state, k, grad_runner, autocast, bar) -> None:
    """Mask the round's features block by block, all images of the round in one backward pass per step."""
    dev = prep.images.device
    rows = torch.tensor([st.image for st in state], device=dev)
    pres = present[rows].clone()  # [A, p]
    mask = (~pres).to(prep.images.dtype)
    counts = pres.sum(1).tolist()
    nb_max = max((c + k - 1) // k for c in counts)
    bar.total += nb_max
    bar.refresh()
    first_values = True
    while True:
        live = [a for a, c in enumerate(counts) if c > 0]
        if not live:
            break
        live_t = torch.tensor(live, device=dev)
        f, g = grad_runner.run(
            len(live),
            lambda sl: score_and_gradient(fn, prep, targets, mask[live_t[sl]], rows[live_t[sl]], autocast),
        )
        if not bool(torch.isfinite(g).all() & torch.isfinite(f).all()):
            raise FloatingPointError("the model's score or its gradient with respect to the mask is NaN or inf")
        # f before this step = f after the previous block (the round's own score before the first)
        if not first_values:
            for a, v in zip(live, f.tolist()):
                state[a].values.append(v)
        first_values = False
        idx = top_k_present(g, pres[live_t], min(k, pres.shape[1]))
        take = [min(k, counts[a]) for a in live]
        valid = torch.arange(idx.shape[1], device=dev).view(1, -1) < torch.tensor(take, device=dev).view(-1, 1)
        r = live_t.view(-1, 1).expand_as(idx)[valid]
        feats = idx[valid]
        mask[r, feats] = 1
        pres[r, feats] = False
        chosen = idx.cpu()
        for j, a in enumerate(live):
            st = state[a]
            st.order.append(chosen[j, : take[j]])
            st.blocks.append(st.blocks[-1] + take[j])
            counts[a] -= take[j]
        bar.update(1)
    # f with every feature masked: the value after each image's last block
    with torch.no_grad():
        f_all = grad_runner.run(len(state), lambda sl: _score_masked(fn, prep, targets, rows[sl]))
    for a, v in enumerate(f_all.tolist()):
        state[a].values.append(v)


def _score_masked(fn, prep, targets, rows) -> torch.Tensor:
    """f of the fully masked input (the baseline) of each image in ``rows``."""
    base = prep.baseline[rows] if prep.baseline.shape[0] > 1 else prep.baseline.expand(rows.numel(), *prep.baseline.shape[1:])
    return fn.score(base.contiguous(), targets[rows])


def _find_sis(evaluator, state, thresholds, p) -> dict[int, tuple[int, float]]:
    """Per image with f >= threshold: (start in order, f(x_S)) of the smallest passing suffix of blocks.

    Prefix j = the last j blocks present, j = 0 .. nb (see prefix.first_passing_prefix).
    """
    rows = [a for a, st in enumerate(state) if st.score >= thresholds[st.image]]
    if not rows:
        return {}
    dev = evaluator.prep.images.device
    pos = torch.full((len(rows), p), p, dtype=torch.int64)
    sizes = []
    for r, a in enumerate(rows):
        st = state[a]
        order = torch.cat(st.order)
        m, nb = st.blocks[-1], len(st.blocks) - 1
        pos[r, order] = torch.arange(m - 1, -1, -1)  # last masked first
        sizes.append([m - st.blocks[nb - j] for j in range(nb + 1)])
    images = [state[a].image for a in rows]
    hits = first_passing_prefix(evaluator, pos.to(dev), images, sizes,
                                lambda r, f, top1: f >= thresholds[images[r]])
    found = {}
    for r, a in enumerate(rows):
        if hits[r] is not None:
            j, f = hits[r]
            st = state[a]
            found[st.image] = (st.blocks[len(st.blocks) - 1 - j], f)
    return found
