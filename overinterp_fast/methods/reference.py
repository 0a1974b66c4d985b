"""Self-contained references: plain transcriptions of the algorithms as docs/algorithms.md states them
(Exact SIS, Batched-gradient SIS, Causal responsibility and minimal pixel sets).

These are the expectations the tests compare the fast engines with, so they share
no logic with the modules they check: nothing here is imported from findsis,
batching, inputs, model, onnx_backend, responsibility, extraction or results'
helpers (``SISResult`` is used only as the container both return). Everything,
from building x_S and the score f to FindSIS and the collection loop, is written
again here, one image at a time, in the simplest way that follows the spec:

- :func:`sis`: google-research's sufficient_input_subsets/sis.py (BackSelect,
  FindSIS, SIS collection). At every backward-selection step all candidates of
  the step are built on the host as one batch and scored. Differences from sis.py,
  both stated in docs/algorithms.md: ties go to the lowest feature id, and when the fully masked
  input already reaches the threshold the SIS is empty (sis.py skips the last
  masked feature and keeps scanning).
- :func:`gradient_sis`: the paper's Batched Gradient BackSelect / FindSIS loop.
- :func:`responsibility`: the ReX descent, one image, iteration and box at a time.

Models: an ``nn.Module`` or callable [B, *D] -> [B, K]; a list or tuple of them
(f on the mean of their logits); or a path to an ``.onnx`` file (run with
onnxruntime's CPU provider). ``outputs="probabilities"``: the model's outputs are
f's probabilities already; otherwise f = softmax(output)[target].
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch

from ..runtime.renames import renamed_keywords  # the old keyword names, as the public functions take them
from ..util.optional import load
from .results import SISResult  # the result container only


# ----------------------------------------------------------------------------------------------
# Shared plain helpers (the spec's terms, written once for the references below)


def _as_callable(model):
    """A callable [B, *D] -> [B, K] for a module, a list of modules (mean of logits) or an ONNX path."""
    if isinstance(model, (list, tuple)):
        members = list(model)
        return lambda x: torch.stack([m(x) for m in members]).mean(0)
    if isinstance(model, (str, os.PathLike)) or type(model).__name__ == "InferenceSession":
        ort = load("onnxruntime", "onnx", "the reference on an ONNX model")
        sess = model if not isinstance(model, (str, os.PathLike)) else ort.InferenceSession(
            os.fspath(model), providers=["CPUExecutionProvider"]
        )
        name = sess.get_inputs()[0].name

        def run(x):
            out = sess.run(None, {name: x.detach().cpu().numpy()})[0]
            return torch.from_numpy(np.ascontiguousarray(out)).to(x.device)

        return run
    return model


def _f(model, outputs: str, x: torch.Tensor, target: int) -> torch.Tensor:
    """f of every row of x ([B, *D]) for class ``target``: float64 [B]."""
    out = model(x)
    probs = out if outputs == "probabilities" else torch.softmax(out, dim=1)
    values = probs[:, target].double()
    if not bool(torch.isfinite(values).all()):
        raise FloatingPointError("the model produced NaN or inf scores on masked inputs")
    return values


def _problem(images, features, mask_value):
    """(feature map int64 [*D], p, grid shape of a result mask, baselines [N, *D]) from the user's options
    (``feature_mask`` and ``baselines``).

    Default features: one per pixel over all channels for [C, H, W] examples, one per
    element otherwise; a custom map is broadcast to one example's shape. The mask value:
    None (0), a number, one value per channel ([C]), a baseline for one example or one per image.
    """
    mask_value = 0.0 if mask_value is None else mask_value
    if not isinstance(images, torch.Tensor) or images.dim() < 2 or not images.is_floating_point():
        raise ValueError("images must be a floating tensor [N, *D]")
    n, shape = images.shape[0], tuple(images.shape[1:])
    if features is None:
        if len(shape) == 3:
            fmap = torch.arange(shape[1] * shape[2]).view(1, shape[1], shape[2]).expand(shape)
            grid = (shape[1], shape[2])
        else:
            fmap = torch.arange(math.prod(shape)).view(shape)
            grid = shape
    else:
        f = features[0] if features.dim() == len(shape) + 1 else features
        fmap = f.expand(shape).to(torch.int64)
        grid = (int(fmap.max()) + 1,)
    p = int(fmap.max()) + 1
    if isinstance(mask_value, torch.Tensor):
        mv = mask_value.to(dtype=images.dtype, device=images.device)
        if mv.dim() == 1 and len(shape) == 3 and mv.numel() == shape[0]:
            mv = mv.view(-1, 1, 1)
        if mv.dim() == len(shape) + 1:
            base = mv.expand(n, *shape) if mv.shape[0] == 1 else mv
        else:
            base = mv.expand(shape).unsqueeze(0).expand(n, *shape)
    else:
        base = torch.full((n, *shape), float(mask_value), dtype=images.dtype, device=images.device)
    return fmap.to(images.device), p, grid, base


def _thresholds(threshold, n: int) -> list[float]:
    if isinstance(threshold, torch.Tensor):
        threshold = threshold.tolist()
    if isinstance(threshold, (list, tuple)):
        if len(threshold) != n:
            raise ValueError("one threshold per image")
        return [float(t) for t in threshold]
    return [float(threshold)] * n


def _target(model, x: torch.Tensor, target, i: int) -> int:
    """The given target of image i, or the argmax of the model's output on the unmasked image."""
    if target is None:
        return int(model(x.unsqueeze(0))[0].argmax())
    t = torch.as_tensor(target)
    return int(t) if t.dim() == 0 else int(t[i])


def _mask(found: torch.Tensor, p: int, grid) -> torch.Tensor:
    m = torch.zeros(p, dtype=torch.bool)
    m[found] = True
    return m.view(grid)


def _with_collection(rounds: list[SISResult], collection: bool) -> SISResult:
    first = rounds[0]
    if collection:
        first.collection = [r for r in rounds if r.sis is not None]
    return first


# ----------------------------------------------------------------------------------------------
# Exact SIS (docs: algorithms.md, Exact SIS)


def backselect(model, x, baseline, feature_map, present, target, batch_size=None, outputs="logits"):
    """BackSelect: list of (feature, value) in masking order.

    x, baseline: [*D]; feature_map: int64 [*D]; present: bool [p] (the features
    still present). value = f after masking that feature. Each step scores all its
    candidates (in chunks of ``batch_size``) and keeps the first maximum: the lowest
    feature id.
    """
    stack = []
    current = present.clone()
    while bool(current.any()):
        idxs = torch.nonzero(current).flatten()  # ascending feature ids
        masks = current.repeat(idxs.numel(), 1)  # candidate c masks idxs[c]
        masks[torch.arange(idxs.numel()), idxs] = False
        inputs = torch.where(masks.to(x.device)[:, feature_map], x, baseline)
        chunk = inputs.shape[0] if batch_size is None else batch_size
        values = torch.cat([_f(model, outputs, inputs[s : s + chunk], target) for s in range(0, inputs.shape[0], chunk)])
        best = int(torch.argmax(values))  # the first maximum: the lowest feature id
        stack.append((int(idxs[best]), float(values[best])))
        current[idxs[best]] = False
    return stack


def find_sis_from_backselect(stack, threshold):
    """FindSIS: scan from the last masked feature until a value reaches the threshold."""
    sis = []
    for idx, value in reversed(stack):
        if value >= threshold:
            break
        sis.append(idx)
    return sis


@renamed_keywords(mask_value="baselines", features="feature_mask")
def sis(
    model,
    images: torch.Tensor,
    threshold: float = 0.9,
    *,
    target=None,
    baselines=None,
    feature_mask=None,
    collection: bool = False,
    batch_size: int | None = None,
    outputs: str = "logits",
) -> list[SISResult]:
    """Reference SIS with the same arguments and result type as :func:`overinterp_fast.fast_sis`.

    ``sis_score`` is f of x_S from its own forward pass (not read off the values).
    """
    model = _as_callable(model)
    fmap, p, grid, base = _problem(images, feature_mask, baselines)
    taus = _thresholds(threshold, images.shape[0])
    results = []
    with torch.inference_mode():
        for i in range(images.shape[0]):
            tau, x, b = taus[i], images[i], base[i]
            cls = _target(model, x, target, i)

            def f_of(present):
                return float(_f(model, outputs, torch.where(present.to(x.device)[fmap], x, b).unsqueeze(0), cls)[0])

            present = torch.ones(p, dtype=torch.bool)
            rounds = []
            while bool(present.any()):
                score = f_of(present)
                if rounds and score < tau:
                    break
                stack = backselect(model, x, b, fmap, present, cls, batch_size, outputs)
                found = None
                if score >= tau:
                    found = torch.tensor(find_sis_from_backselect(stack, tau), dtype=torch.int64)
                found_present = None
                if found is not None:
                    found_present = torch.zeros(p, dtype=torch.bool)
                    found_present[found] = True
                rounds.append(
                    SISResult(
                        order=torch.tensor([s[0] for s in stack], dtype=torch.int64),
                        values=torch.tensor([s[1] for s in stack], dtype=torch.float64),
                        sis=found,
                        mask=None if found is None else _mask(found, p, grid),
                        target=cls,
                        score=score,
                        threshold=tau,
                        sis_score=None if found is None else f_of(found_present),
                    )
                )
                if not collection or found is None or found.numel() == 0:
                    break
                present[found] = False  # mask the SIS; the next round runs on the rest
            results.append(_with_collection(rounds, collection))
    return results


# ----------------------------------------------------------------------------------------------
# Batched-gradient SIS (docs: algorithms.md, Batched-gradient SIS)


def _gradient_step(model, outputs, x, base, feature_map, mask, target):
    """f and df/dM for one image under feature mask ``mask`` ([p], 1 = masked)."""
    m = mask.clone().requires_grad_(True)
    with torch.enable_grad():
        me = m[feature_map]
        xm = x * (1 - me) + base * me
        out = model(xm.unsqueeze(0))
        probs = out if outputs == "probabilities" else torch.softmax(out, dim=1)
        f = probs[0, target]
        (g,) = torch.autograd.grad(f, m)
    return float(f.detach()), g.detach().cpu().numpy()


@renamed_keywords(mask_value="baselines", features="feature_mask")
def gradient_sis(
    model,
    images: torch.Tensor,
    threshold: float = 0.9,
    *,
    k: int = 100,
    target=None,
    baselines=None,
    feature_mask=None,
    collection: bool = False,
    outputs: str = "logits",
) -> list[SISResult]:
    """The paper's Batched Gradient BackSelect / FindSIS / SIScollection loop, transcribed plainly.

    One image at a time; one backward pass per block of k features; FindSIS pops
    blocks one at a time (one forward pass per pop). Ties in the gradient go to
    the lowest feature id (the paper's code added random noise instead). Same
    arguments and result type as ``fast_sis(..., method="gradient")``.
    """
    model = _as_callable(model)
    fmap, p, grid, base_all = _problem(images, feature_mask, baselines)
    taus = _thresholds(threshold, images.shape[0])
    device = images.device
    results = []
    for i in range(images.shape[0]):
        tau, x, base = taus[i], images[i], base_all[i]
        with torch.no_grad():
            cls = _target(model, x, target, i)

        def f_of(present_features):
            with torch.no_grad():
                keep = present_features.to(device)[fmap]
                return float(_f(model, outputs, torch.where(keep, x, base).unsqueeze(0), cls)[0])

        present = torch.ones(p, dtype=torch.bool)
        rounds = []
        while bool(present.any()):
            score = f_of(present)
            if rounds and score < tau:
                break
            # BackSelect with blocks of k
            mask = (~present).to(x.dtype).to(device)
            pres = present.clone()
            order, blocks, values = [], [0], []
            while bool(pres.any()):
                f, g = _gradient_step(model, outputs, x, base, fmap, mask, cls)
                if order:
                    values.append(f)
                cand = np.nonzero(pres.numpy())[0]
                best = cand[np.argsort(-g[cand], kind="stable")][:k]
                mask[torch.from_numpy(best).to(device)] = 1
                pres[torch.from_numpy(best)] = False
                order.extend(best.tolist())
                blocks.append(len(order))
            values.append(f_of(torch.zeros(p, dtype=torch.bool)))
            # FindSIS: from everything masked, unmask blocks last-masked first
            found, found_score = None, None
            if score >= tau:
                nb = len(blocks) - 1
                for j in range(nb + 1):
                    suffix = order[blocks[nb - j]:]
                    keep = torch.zeros(p, dtype=torch.bool)
                    keep[suffix] = True
                    v = f_of(keep)
                    if v >= tau:
                        found, found_score = torch.tensor(suffix[::-1], dtype=torch.int64), v
                        break
            rounds.append(
                SISResult(
                    order=torch.tensor(order, dtype=torch.int64), values=torch.tensor(values, dtype=torch.float64),
                    sis=found, mask=None if found is None else _mask(found, p, grid), target=cls, score=score,
                    threshold=tau, blocks=torch.tensor(blocks, dtype=torch.int64), sis_score=found_score,
                )
            )
            if not collection or found is None or found.numel() == 0 or found.numel() == len(order):
                break
            present[found] = False
        results.append(_with_collection(rounds, collection))
    return results


# ----------------------------------------------------------------------------------------------
# Causal responsibility (docs: algorithms.md, Causal responsibility and minimal pixel sets)

# the 14 non-empty proper subsets of the 4 quadrants, in the order of their bit masks 1..14
_QUADRANT_SUBSETS = [[q for q in range(4) if mask & (1 << q)] for mask in range(1, 15)]


def _box_area(box) -> int:
    y0, x0, y1, x1 = box
    return max(0, y1 - y0) * max(0, x1 - x0)


def _quadrants(box, rng) -> list[tuple[int, int, int, int]]:
    """Split a box at one uniformly random point (row, then column; ends included): 4 quadrants."""
    y0, x0, y1, x1 = box
    ys = int(rng.integers(y0, y1 + 1))
    xs = int(rng.integers(x0, x1 + 1))
    return [(y0, x0, ys, xs), (y0, xs, ys, x1), (ys, x0, y1, xs), (ys, xs, y1, x1)]


@renamed_keywords(mask_value="baselines")
def responsibility(
    model,
    images: torch.Tensor,
    *,
    iterations: int = 20,
    depth: int = 10,
    min_box: int = 10,
    seed: int = 0,
    baselines=None,
    outputs: str = "logits",
) -> list[tuple[torch.Tensor, int]]:
    """The ReX descent transcribed plainly: one image, one iteration, one box at a time.

    (docs: algorithms.md, Causal responsibility and minimal pixel sets)

    Each active box's 14 mutants are painted with slicing and scored in one call;
    the per-iteration map starts at ones and gets 1/k (float64) on each kept
    quadrant of every mutant predicted as the target; the result is the sum over
    iterations of log(map), the ranking key ``of.responsibility`` returns. Criterion:
    top-1 class equals the original. Boxes are drawn as in the fast path (one
    ``numpy.random.default_rng(seed + iteration)`` per descent, row then column of
    each split point), so both give the same map. Ties between passing mutants of
    equal area go to the first built (boxes in order, subsets by bit mask).

    Returns:
        per image (float64 [H, W], mutants evaluated: 14 per split box, duplicates included).
    """
    for name, v, lo in (("iterations", iterations, 1), ("depth", depth, 1), ("min_box", min_box, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:  # numpy's generators take seeds >= 0
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    model = _as_callable(model)
    _, _, _, base_all = _problem(images, None, baselines)
    out = []
    for i in range(images.shape[0]):
        x, base = images[i], base_all[i]
        h, w = x.shape[-2:]
        with torch.no_grad():
            target = int(model(x[None]).argmax(1)[0])
        total = torch.zeros(h, w, dtype=torch.float64)
        queries = 0
        for t in range(iterations):
            rng = np.random.default_rng(seed + t)
            resp = torch.ones(h, w, dtype=torch.float64)
            active = [(0, 0, h, w)]
            for _ in range(depth):
                mutants = []  # (kept quadrants, keep mask)
                for b, box in enumerate(active):
                    if _box_area(box) < min_box:
                        continue
                    quads = _quadrants(box, rng)
                    static = active[:b] + active[b + 1 :]
                    for subset in _QUADRANT_SUBSETS:
                        kept = [quads[c] for c in subset]
                        keep = torch.zeros(h, w, dtype=torch.bool)
                        for y0, x0, y1, x1 in kept + static:
                            keep[y0:y1, x0:x1] = True
                        mutants.append((kept, keep))
                if not mutants:
                    break
                keeps = torch.stack([k for _, k in mutants]).to(x.device)
                with torch.no_grad():
                    top1 = (model(torch.where(keeps[:, None], x, base)).argmax(1) == target).tolist()
                queries += len(mutants)
                ok = [j for j in range(len(mutants)) if top1[j]]
                if not ok:
                    break
                for j in ok:
                    kept = mutants[j][0]
                    for y0, x0, y1, x1 in kept:
                        resp[y0:y1, x0:x1] += 1.0 / len(kept)
                best = min(ok, key=lambda j: (int(mutants[j][1].sum()), j))
                active = [q for q in mutants[best][0] if _box_area(q) > 0]
            total += resp.log()
        out.append((total, queries))
    return out


def input_reduction(
    model,
    sequences: list[torch.Tensor],
    *,
    beam_size: int = 5,
    importance: str = "leave_one_out",
    target: int | list[int] | None = None,
    embedding: torch.nn.Module | None = None,
) -> list[dict]:
    """Input reduction by beam search (docs: algorithms.md, Input reduction), transcribed plainly: one sequence, one beam member
    at a time. Self-contained: it uses none of overinterp_fast.text.

    ``model(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, K]``; ``sequences``: 1-D int64 tensors.
    Each member's candidates (all equally long) form one unpadded batch. Gradient importance hooks ``embedding``.
    Duplicate children keep their highest f (the algorithm drops duplicates; identical inputs score the same).

    Returns:
        per sequence a dict: kept (list of ascending positions), confidence, original_confidence, target,
        beam (list of (kept tuple, f), best first), steps, queries.
    """
    dev = next(model.parameters()).device if isinstance(model, torch.nn.Module) else torch.device("cpu")

    def run(x, rows):
        ids = torch.tensor([[x[i] for i in r] for r in rows], dtype=torch.int64, device=dev)
        return ids, torch.ones(ids.shape, dtype=torch.bool, device=dev)

    def scores(x, rows, y):
        ids, mask = run(x, rows)
        with torch.no_grad():
            out = model(ids, mask)
        f = torch.softmax(out, dim=1)[:, y].double()
        return f.tolist(), (out.argmax(1) == y).tolist()

    def gradient(x, row, y):
        grabbed = []

        def hook(module, args, out):
            e = out.detach().requires_grad_(True)
            grabbed.append(e)
            return e

        handle = embedding.register_forward_hook(hook)
        try:
            ids, mask = run(x, [row])
            with torch.enable_grad():
                f = torch.softmax(model(ids, mask), dim=1)[0, y]
                (g,) = torch.autograd.grad(f, grabbed[0])
        finally:
            handle.remove()
        return (grabbed[0].detach()[0] * g[0]).sum(-1).double().tolist()

    results = []
    for s, seq in enumerate(sequences):
        x = seq.tolist()
        full = tuple(range(len(x)))
        ids, mask = run(x, [full])
        with torch.no_grad():
            out = model(ids, mask)
        if target is None:
            y = int(out.argmax(1)[0])
        else:
            y = int(target if isinstance(target, int) else target[s])
        f0 = float(torch.softmax(out, dim=1)[0, y].double())
        queries, steps = 1, 0
        beam = [(full, f0)]
        while True:
            pool = []
            for kept, fb in beam:
                n = len(kept)
                if n < 2:
                    continue
                kb = max(1, min(beam_size, n - 3))
                children = [kept[:i] + kept[i + 1 :] for i in range(n)]
                if importance == "leave_one_out":
                    f, ok = scores(x, children, y)
                    queries += n
                    imp = [fb - f[i] for i in range(n)]
                    chosen = sorted(range(n), key=lambda i: (imp[i], kept[i]))[:kb]
                    pool += [(children[i], f[i]) for i in chosen if ok[i]]
                else:
                    imp = gradient(x, kept, y)
                    queries += 1
                    chosen = sorted(range(n), key=lambda i: (imp[i], kept[i]))[:kb]
                    f, ok = scores(x, [children[i] for i in chosen], y)
                    queries += kb
                    pool += [(children[i], f[j]) for j, i in enumerate(chosen) if ok[j]]
            if not pool:
                break
            best = {}
            for kept, f in pool:
                if kept not in best or f > best[kept]:
                    best[kept] = f
            beam = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:beam_size]
            steps += 1
        results.append(dict(kept=list(beam[0][0]), confidence=beam[0][1], original_confidence=f0, target=y,
                            beam=beam, steps=steps, queries=queries))
    return results
