"""Reference SIS: a plain transcription of google-research's sufficient_input_subsets/sis.py.

One image at a time; at every backward-selection step all candidate inputs of
that step are built on the host (CPU tensors) as one batch, moved to the model's
device and scored. It exists so tests and benchmarks can compare the fast engine
with the reference semantics of SPEC.md section 1. It is not slowed on purpose: it
simply has no packing across images and steps and no fused kernels.

Differences from sis.py, both in SPEC.md: ties and the FindSIS edge case. When
the fully masked input already reaches the threshold, sis.py skips the last
masked feature and keeps scanning; here (as in fast_sis) the SIS is empty.
"""
from __future__ import annotations

import torch

from .batching import ChunkRunner
from .findsis import sis_score
from .inputs import check_threshold, prepare
from .model import ModelFn, check_finite_scores, initial_predictions
from .results import SISResult, first_with_collection


def _score_batches(fn: ModelFn, inputs: torch.Tensor, target: int, device, batch_size: int | None) -> torch.Tensor:
    chunk = inputs.shape[0] if batch_size is None else batch_size
    out = []
    for s in range(0, inputs.shape[0], chunk):
        x = inputs[s : s + chunk].to(device)
        t = torch.full((x.shape[0],), target, dtype=torch.int64, device=device)
        out.append(fn.score(x, t).cpu())
    values = torch.cat(out)
    check_finite_scores(torch.isfinite(values).all())
    return values


def backselect(fn, x, baseline, feature_map, present, target, device, batch_size=None):
    """BackSelect: list of (feature, value) in masking order.

    x, baseline: [*D] on the CPU; feature_map: int64 [*D]; present: bool [p]
    (the features still present). value = f after masking that feature.
    """
    stack = []
    current = present.clone()
    while bool(current.any()):
        idxs = torch.nonzero(current).flatten()  # ascending feature ids
        masks = current.repeat(idxs.numel(), 1)
        masks[torch.arange(idxs.numel()), idxs] = False
        element_present = masks[:, feature_map]  # [r, *D]
        inputs = torch.where(element_present, x, baseline)
        values = _score_batches(fn, inputs, target, device, batch_size)
        best = int(torch.argmax(values))  # first maximum: the lowest feature id
        stack.append((int(idxs[best]), float(values[best])))
        current = masks[best]
    return stack


def find_sis_from_backselect(stack, threshold):
    """FindSIS: scan from the last masked feature until a value reaches the threshold."""
    sis = []
    for idx, value in reversed(stack):
        if value >= threshold:
            break
        sis.append(idx)
    return sis


def sis(
    model,
    images: torch.Tensor,
    threshold: float = 0.9,
    *,
    target=None,
    mask_value=0.0,
    features=None,
    collection: bool = False,
    batch_size: int | None = None,
    outputs: str = "logits",
) -> list[SISResult]:
    """Reference SIS with the same arguments and result type as :func:`overinterp_fast.fast_sis`."""
    prep = prepare(images, features=features, mask_value=mask_value)
    thresholds = check_threshold(threshold, prep.images.shape[0])
    fn = ModelFn(model, outputs=outputs, device=prep.images.device)
    fn.check_compatible(prep.images)
    device = prep.images.device
    fm = prep.feature_map.cpu()
    p = prep.num_features
    results = []
    with torch.inference_mode():
        for i in range(prep.images.shape[0]):
            tau = thresholds[i]
            x = prep.images[i].cpu()
            baseline = prep.baseline[i if prep.baseline.shape[0] > 1 else 0].cpu()
            t = None if target is None else torch.as_tensor(target).expand(prep.images.shape[0])[i]
            targets, _ = initial_predictions(fn, prep.images[i : i + 1], t, ChunkRunner(1, device))
            cls = int(targets[0])
            present = torch.ones(p, dtype=torch.bool)
            rounds = []
            while bool(present.any()):
                current = torch.where(present[fm], x, baseline)
                score = float(_score_batches(fn, current.unsqueeze(0), cls, device, None)[0])
                if rounds and score < tau:
                    break
                stack = backselect(fn, x, baseline, fm, present, cls, device, batch_size)
                order = torch.tensor([s[0] for s in stack], dtype=torch.int64)
                values = torch.tensor([s[1] for s in stack], dtype=torch.float64)
                found = None
                if score >= tau:
                    found = torch.tensor(find_sis_from_backselect(stack, tau), dtype=torch.int64)
                rounds.append(
                    SISResult(
                        order=order,
                        values=values,
                        sis=found,
                        mask=None if found is None else prep.feature_mask(found),
                        target=cls,
                        score=score,
                        threshold=tau,
                        sis_score=None if found is None else sis_score(values, score, found.numel()),
                    )
                )
                if not collection or found is None or found.numel() == 0:
                    break
                present[found] = False  # mask the SIS; the next round runs on the rest
            results.append(first_with_collection(rounds, collection))
    return results


def _gradient_step(fn, x, base, feature_map, mask, target):
    """f and df/dM for one image under feature mask ``mask`` ([p], 1 = masked)."""
    m = mask.clone().requires_grad_(True)
    with torch.enable_grad():
        me = m[feature_map]
        xm = x * (1 - me) + base * me
        f = fn.probabilities(fn.forward(xm.unsqueeze(0)))[0, target]
        (g,) = torch.autograd.grad(f, m)
    return float(f.detach()), g.detach().cpu().numpy()


def gradient_sis(
    model,
    images: torch.Tensor,
    threshold: float = 0.9,
    *,
    k: int = 100,
    target=None,
    mask_value=0.0,
    features=None,
    collection: bool = False,
    outputs: str = "logits",
) -> list[SISResult]:
    """The paper's Batched Gradient BackSelect / FindSIS / SIScollection loop, transcribed plainly.

    One image at a time; one backward pass per block of k features; FindSIS pops
    blocks one at a time (one forward pass per pop). Ties in the gradient go to
    the lowest feature id (the paper's code added random noise instead). Same
    arguments and result type as ``fast_sis(..., method="gradient")``.
    """
    import numpy as np

    prep = prepare(images, features=features, mask_value=mask_value)
    thresholds = check_threshold(threshold, prep.images.shape[0])
    fn = ModelFn(model, outputs=outputs, device=prep.images.device)
    fn.check_compatible(prep.images)
    device = prep.images.device
    fm = prep.feature_map
    p = prep.num_features
    results = []
    for i in range(prep.images.shape[0]):
        tau = thresholds[i]
        x = prep.images[i]
        base = prep.baseline[i if prep.baseline.shape[0] > 1 else 0]
        with torch.no_grad():
            t = None if target is None else torch.as_tensor(target).expand(prep.images.shape[0])[i]
            targets, _ = initial_predictions(fn, prep.images[i : i + 1], t, ChunkRunner(1, device))
        cls = int(targets[0])

        def f_of(present_features):
            with torch.no_grad():
                keep = present_features.to(device)[fm]
                return float(fn.score(torch.where(keep, x, base).unsqueeze(0), torch.tensor([cls], device=device))[0])

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
                f, g = _gradient_step(fn, x, base, fm, mask, cls)
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
                    sis=found, mask=None if found is None else prep.feature_mask(found), target=cls, score=score,
                    threshold=tau, blocks=torch.tensor(blocks, dtype=torch.int64), sis_score=found_score,
                )
            )
            if not collection or found is None or found.numel() == 0 or found.numel() == len(order):
                break
            present[found] = False
        results.append(first_with_collection(rounds, collection))
    return results


def responsibility(
    model,
    images: torch.Tensor,
    *,
    iterations: int = 20,
    depth: int = 10,
    min_box: int = 10,
    seed: int = 0,
    mask_value=0.0,
    outputs: str = "logits",
) -> list[tuple[torch.Tensor, int]]:
    """The ReX descent (SPEC.md section 3a) transcribed plainly: one image, one iteration, one box at a time.

    Each active box's 14 mutants are painted with slicing and scored in one call;
    the per-iteration map starts at ones and gets 1/k (float64) on each kept
    quadrant of every mutant predicted as the target; the result is the sum over
    iterations of log(map), the ranking key ``of.responsibility`` returns. Criterion:
    top-1 class equals the original. Boxes are drawn as in the fast path (one
    ``numpy.random.default_rng(seed + iteration)`` per descent, row then column of
    each split point), so both give the same map.

    Returns:
        per image (float64 [H, W], mutants evaluated: 14 per split box, duplicates included).
    """
    from .responsibility import SUBSETS, _area, _split, check_responsibility_options
    import numpy as np

    check_responsibility_options(iterations, depth, min_box, seed)
    prep = prepare(images, mask_value=mask_value)
    fn = ModelFn(model, outputs=outputs, device=prep.images.device)
    fn.check_compatible(prep.images)
    out = []
    for i in range(prep.images.shape[0]):
        x = prep.images[i]
        base = prep.baseline[i if prep.baseline.shape[0] > 1 else 0]
        h, w = x.shape[-2:]
        with torch.no_grad():
            target = int(fn.forward(x[None]).argmax(1)[0])
        total = torch.zeros(h, w, dtype=torch.float64)
        queries = 0
        for t in range(iterations):
            rng = np.random.default_rng(seed + t)
            resp = torch.ones(h, w, dtype=torch.float64)
            active = [(0, 0, h, w)]
            for _ in range(depth):
                mutants = []  # (kept quadrants, keep mask)
                for b, box in enumerate(active):
                    if _area(box) < min_box:
                        continue
                    quads = _split(box, rng)
                    static = active[:b] + active[b + 1 :]
                    for subset in SUBSETS:
                        kept = [quads[c] for c in subset]
                        keep = torch.zeros(h, w, dtype=torch.bool)
                        for y0, x0, y1, x1 in kept + static:
                            keep[y0:y1, x0:x1] = True
                        mutants.append((kept, keep))
                if not mutants:
                    break
                keeps = torch.stack([k for _, k in mutants]).to(x.device)
                with torch.no_grad():
                    top1 = (fn.forward(torch.where(keeps[:, None], x, base)).argmax(1) == target).tolist()
                queries += len(mutants)
                ok = [j for j in range(len(mutants)) if top1[j]]
                if not ok:
                    break
                for j in ok:
                    kept = mutants[j][0]
                    for y0, x0, y1, x1 in kept:
                        resp[y0:y1, x0:x1] += 1.0 / len(kept)
                best = min(ok, key=lambda j: (int(mutants[j][1].sum()), j))
                active = [q for q in mutants[best][0] if _area(q) > 0]
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
    """Input reduction by beam search (SPEC.md section 4), transcribed plainly: one sequence, one beam member
    at a time. Self-contained: it uses none of overinterp_fast.text.

    ``model(ids int64 [B, T], attention_mask bool [B, T]) -> logits [B, K]``; ``sequences``: 1-D int64 tensors.
    Each member's candidates (all equally long) form one unpadded batch. Gradient importance hooks ``embedding``.
    Duplicate children keep their highest f (SPEC: duplicates are dropped; identical inputs score the same).

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
