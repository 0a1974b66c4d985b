"""Virtual and gated descents: ReX descents on a surrogate of the model's criterion (opt-in).

The real descents of a ranking score a few hundred mutants per image (kept in the
:class:`~overinterp_fast.methods.responsibility.MutantCache`). Per image, a logistic model on
the fraction of each cell of a ``grid`` x ``grid`` partition of the image that a mutant
keeps is fitted to whether the mutant passed (L2 penalty ``l2`` on the weights, not on
the intercept: scikit-learn's ``LogisticRegression(C=1 / l2)``, fitted here by
Newton's method, all images at once). Then ``iterations`` more descents run on it, as
ReX's descent runs on the model (every mutant "scored", nothing skipped), with no
forward pass of the model, and their log maps are added to the real ones. The map is
then an estimate of ReX's map, not ReX's map: the surrogate errs on some mutants.
Every set extracted from the ranking is still checked on the model itself.

Gated descents (:func:`add_gated_descents`, ``gated_iterations``, opt-in) sit between the two: real
descents in which a surrogate refitted before each answers the mutants it is sure of
(:class:`GatedEvaluator`, margin :data:`GATE_MARGIN`) and the model the others. Its answers go to
``MutantCache.guessed``: they are no query, and no fit learns from them.

Speed: the virtual descents never paint a mutant. ``descend`` hands the surrogate the
rectangles a mutant shows (:meth:`Surrogate.score_rectangles`). The logistic model is linear in
the cells' shares, so a mutant's weighted sum is the sum over its pixels of each pixel's share of
its cell's weight (:meth:`Surrogate.pixel_weights`): four lookups per rectangle in a summed-area
table of those. The fit needs every cell's share (:func:`rect_cell_fractions`: four lookups per
rectangle and cell in a table of the pixels present). ``descend`` sums the virtual descents' log
maps image by image as it paints them (``per_image``), never holding one map per descent.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.batching import ChunkRunner
from ..runtime.inputs import Prepared
from .mutant_memory import remembered_responsibility
from ..methods.responsibility import (DescentPlan, MutantCache, RankingHook, compute_responsibility, descend,
                                      score_painted_rows)

GRID = 14  # cells per side: 16 x 16 pixels at 224 x 224
L2 = 1.0
RECT_CHUNK = 4096  # mutants scored from their rectangles at once (memory: two summed-area tables of their images)


def cell_bounds(size: int, grid: int) -> list[int]:
    """The cells' edges along one side: floor(i * size / grid) for i = 0..grid (cells of size / grid pixels
    where grid divides size; else some one pixel wider)."""
    return [i * size // grid for i in range(grid + 1)]


def _integral(x: torch.Tensor) -> torch.Tensor:
    """[B, H, W] -> [B, H+1, W+1] summed-area table (entry (y, x): the sum of x[:, :y, :x]); int64 for a bool or
    integer x, x's dtype for a floating one."""
    x = x if x.is_floating_point() else x.long()
    return torch.nn.functional.pad(x.cumsum(1).cumsum(2), (1, 0, 1, 0))


def _box_sums(table: torch.Tensor, img, y0, x0, y1, x1) -> torch.Tensor:
    """The sums over the boxes [y0, y1) x [x0, x1) of images ``img`` from their summed-area tables ``table``
    ([N, H+1, W+1], :func:`_integral`): four lookups per box; the int64 index tensors broadcast together."""
    return table[img, y1, x1] - table[img, y0, x1] - table[img, y1, x0] + table[img, y0, x0]


def _cells(h: int, w: int, grid: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row edges int64 [grid+1], column edges int64 [grid+1], cell areas int64 [grid, grid], at least 1)."""
    ys = torch.tensor(cell_bounds(h, grid), device=device)
    xs = torch.tensor(cell_bounds(w, grid), device=device)
    return ys, xs, ((ys[1:] - ys[:-1]).view(-1, 1) * (xs[1:] - xs[:-1]).view(1, -1)).clamp(min=1)


def cell_fractions(keep: torch.Tensor, h: int, w: int, grid: int) -> torch.Tensor:
    """The fraction of each cell (:func:`cell_bounds`) kept: bool [m, H*W] -> float64 [m, grid*grid]."""
    table = _integral(keep.view(-1, h, w))
    ys, xs, area = _cells(h, w, grid, keep.device)
    y0, y1, x0, x1 = ys[:-1].view(1, -1, 1), ys[1:].view(1, -1, 1), xs[:-1].view(1, 1, -1), xs[1:].view(1, 1, -1)
    counts = _box_sums(table, torch.arange(table.shape[0], device=keep.device).view(-1, 1, 1), y0, x0, y1, x1)
    return (counts.double() / area).flatten(1)


def rect_cell_fractions(rects: torch.Tensor, owner: torch.Tensor, images: torch.Tensor, table: torch.Tensor,
                        h: int, w: int, grid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cell_fractions` of mutants given as disjoint rectangles, without painting them.

    rects: int64 [R, 4] (y0, x0, y1, x1); owner: int64 [R], the mutant of each, in [0, m); images: int64 [m],
    each mutant's image; table: int64 [N, H+1, W+1], :func:`_integral` of the pixels present per image.
    Returns (float64 [m, grid*grid] the fraction of each cell kept and present, int64 [m] pixels kept and present).
    """
    dev = table.device
    m = images.shape[0]
    ys, xs, area = _cells(h, w, grid, dev)
    y0, x0, y1, x1 = rects.to(dev).unbind(1)
    img = images.to(dev)[owner.to(dev)]
    # each rectangle cut by each cell row and column (empty cuts have Y1 == Y0 or X1 == X0)
    cy0 = torch.maximum(y0.view(-1, 1), ys[:-1].view(1, -1))
    cy1 = torch.maximum(torch.minimum(y1.view(-1, 1), ys[1:].view(1, -1)), cy0)
    cx0 = torch.maximum(x0.view(-1, 1), xs[:-1].view(1, -1))
    cx1 = torch.maximum(torch.minimum(x1.view(-1, 1), xs[1:].view(1, -1)), cx0)
    rows, cols = (-1, grid, 1), (-1, 1, grid)  # [R, grid, grid]: each rectangle's cut by each cell
    counts = _box_sums(table, img.view(-1, 1, 1), cy0.view(rows), cx0.view(cols), cy1.view(rows), cx1.view(cols))
    own = owner.to(dev)
    fractions = torch.zeros(m, grid * grid, dtype=torch.float64, device=dev).index_add_(
        0, own, (counts.double() / area).view(-1, grid * grid))
    kept = torch.zeros(m, dtype=torch.int64, device=dev).index_add_(0, own, counts.sum((1, 2)))
    return fractions, kept


@dataclass
class Surrogate:
    """Per image, a logistic model of "the mutant passes" on :func:`cell_fractions`.

    Attributes:
        weight: float64 [N, grid*grid]; bias: float64 [N]; constant: per image None (fitted) or the one
            outcome all its mutants had (the model then predicts it for every mutant).
        grid: cells per side. runner: the ChunkRunner the descents paint their mutants with.
        accuracy: per image, the share of its scored mutants the model gets right (nan: none scored).
    """

    weight: torch.Tensor
    bias: torch.Tensor
    constant: list[bool | None]
    grid: int
    h: int
    w: int
    runner: ChunkRunner
    accuracy: list[float]

    def predict(self, x: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        """Probability of passing, float64 [m], from cell fractions ``x`` (float64 [m, grid*grid]) of images
        ``img`` (int64 [m])."""
        x, img = x.to(self.weight.device), img.to(self.weight.device)
        return self._probability((x * self.weight[img]).sum(1), img)

    def _probability(self, z: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        """float64 [m]: sigmoid(z + bias) of the mutants' images ``img`` (int64 [m]), from their weighted cell
        fractions z (float64 [m]); an image's ``constant`` where it has one."""
        prob = torch.sigmoid(z + self.bias[img])
        for i, c in enumerate(self.constant):
            if c is not None:
                prob = torch.where(img == i, torch.tensor(float(c), dtype=prob.dtype, device=prob.device), prob)
        return prob

    def pixel_weights(self, images: torch.Tensor) -> torch.Tensor:
        """float64 [k, H, W]: each pixel's share of its cell's weight (weight / cell area) for the images
        ``images`` (int64 [k]), so that a mutant's weighted cell fractions are the sum of these over the
        pixels it keeps."""
        ys, xs, area = _cells(self.h, self.w, self.grid, self.weight.device)
        row = torch.bucketize(torch.arange(self.h, device=ys.device), ys[1:], right=True)  # each pixel's cell row
        col = torch.bucketize(torch.arange(self.w, device=xs.device), xs[1:], right=True)
        cell = (row.view(-1, 1) * self.grid + col.view(1, -1)).flatten()  # [H*W]
        per_pixel = self.weight[images.to(self.weight.device)] / area.flatten().to(self.weight.dtype)
        return per_pixel[:, cell].view(-1, self.h, self.w)

    def __call__(self, keep: torch.Tensor, image: torch.Tensor, row: torch.Tensor, feature: torch.Tensor):
        """The evaluator interface: (probability of passing float64 [m], predicted to pass bool [m]) for the
        mutants ``keep`` (bool [m, H*W]) of ``image`` (int64 [m]); ``row``, ``feature`` unused."""
        prob = self.predict(cell_fractions(keep, self.h, self.w, self.grid), image)
        return prob.to(keep.device), (prob > 0.5).to(keep.device)

    def score_rectangles(self, rects: torch.Tensor, owner: torch.Tensor, images: torch.Tensor,
                         present: torch.Tensor) -> torch.Tensor:
        """Score mutants given as rectangles, without painting them (what
        :func:`~overinterp_fast.methods.responsibility.descend` asks of an evaluator that has this method).

        rects: int64 [R, 4] (y0, x0, y1, x1), disjoint within a mutant; owner: int64 [R], non-decreasing, the
        mutant of each in [0, m); images: int64 [m]; present: bool [N, H*W], the pixels a mutant may keep.
        Returns float64 [m, 4]: probability of passing, predicted to pass (0 or 1), pixels kept, and 0 (the
        model was not asked: no query).
        """
        m = images.shape[0]
        dev = self.weight.device
        owner, images = owner.to(dev), images.to(dev)
        starts = torch.searchsorted(owner, torch.arange(0, m + RECT_CHUNK, RECT_CHUNK, device=dev)).tolist()
        out = []
        for k, a in enumerate(range(0, m, RECT_CHUNK)):
            b = min(a + RECT_CHUNK, m)
            r0, r1 = starts[k], starts[k + 1]
            # the weighted fractions z = sum over kept pixels of pixel_weights, and the pixels kept, off summed-area
            # tables of the chunk's images (a weighted table and a count table): four lookups per rectangle
            used, local = torch.unique(images[a:b], return_inverse=True)
            keep = present.to(dev)[used].view(-1, self.h, self.w)
            corners = rects[r0:r1].to(dev).unbind(1)  # y0, x0, y1, x1
            own = owner[r0:r1] - a
            img = local[own]
            z = torch.zeros(b - a, dtype=torch.float64, device=dev).index_add_(
                0, own, _box_sums(_integral(self.pixel_weights(used) * keep), img, *corners))
            kept = torch.zeros(b - a, dtype=torch.int64, device=dev).index_add_(
                0, own, _box_sums(_integral(keep), img, *corners))
            prob = self._probability(z, images[a:b])
            out.append(torch.stack([prob, (prob > 0.5).double(), kept.double(), torch.zeros_like(prob)], 1))
        return torch.cat(out) if out else torch.zeros(0, 4, dtype=torch.float64, device=dev)


def mutant_features(cache: MutantCache, present: torch.Tensor, passes, n: int, h: int, w: int,
                    grid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mutants of ``cache`` (keys (image, rectangles...)) the model scored (not those in ``cache.guessed``),
    image by image, as the fit sees them, on the host:
    (float64 [m, grid*grid] the share of each cell kept and ``present`` (bool [N, H*W]), float64 [m] the label
    ``passes(image, f, top1)`` (1: passes), int64 [m] the image)."""
    by_image: list[list[tuple]] = [[] for _ in range(n)]
    for key, (f, top1, _) in cache.scores.items():
        if key not in cache.guessed:  # the model's answers only, not a surrogate's
            by_image[key[0]].append((key[1:], bool(passes(key[0], f, top1))))
    rects, owner_r, images, label = [], [], [], []
    for i, rows in enumerate(by_image):
        for shown, y in rows:
            rects.extend(shown)
            owner_r.extend([len(images)] * len(shown))
            images.append(i)
            label.append(y)
    cpu = torch.device("cpu")  # the fit runs on the host, whatever torch's default device
    img = torch.tensor(images, dtype=torch.int64, device=cpu)
    x, _ = rect_cell_fractions(torch.tensor(rects, dtype=torch.int64, device=cpu).view(-1, 4),
                               torch.tensor(owner_r, dtype=torch.int64, device=cpu), img,
                               _integral(present.view(n, h, w)).cpu(), h, w, grid)
    return x, torch.tensor(label, dtype=torch.float64, device=cpu), img


def outcome_constants(y: torch.Tensor, img: torch.Tensor, n: int) -> list[bool | None]:
    """Per image, None where its mutants (labels ``y`` [m] of images ``img`` [m]) both pass and fail, else the
    one outcome they had (no mutant: False): there is nothing to separate, and the surrogate predicts it."""
    constant: list[bool | None] = [None] * n
    for i in range(n):
        outcomes = {bool(v) for v in y[img == i].tolist()}
        if len(outcomes) <= 1:  # all passed, all failed, or none scored (taken as failing)
            constant[i] = outcomes.pop() if outcomes else False
    return constant


def fit_surrogate(cache: MutantCache, present: torch.Tensor, passes, n: int, h: int, w: int, runner: ChunkRunner,
                  grid: int = GRID, l2: float = L2) -> Surrogate:
    """Fit :class:`Surrogate` to the mutants of ``cache`` (keys (image, rectangles...)): each mutant keeps its
    rectangles' pixels that are ``present`` (bool [N, H*W]); its label is ``passes(image, f, top1)``."""
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be an int >= 1, got {grid!r}")
    if not l2 > 0:
        raise ValueError(f"l2 must be > 0, got {l2!r}")
    x, y, img = mutant_features(cache, present, passes, n, h, w, grid)
    constant = outcome_constants(y, img, n)
    accuracy = [float("nan")] * n
    weight = torch.zeros(n, grid * grid, dtype=torch.float64, device=x.device)
    bias = torch.zeros(n, dtype=torch.float64, device=x.device)
    if len(y):
        _fit(weight, bias, x, y, img, constant, l2)
    surrogate = Surrogate(weight.to(present.device), bias.to(present.device), constant, grid, h, w, runner, accuracy)
    if len(y):
        right = ((surrogate.predict(x, img) > 0.5) == y.to(surrogate.weight.device).bool()).cpu()
        for i in range(n):
            sel = img == i
            if sel.any():
                accuracy[i] = float(right[sel].double().mean())
    return surrogate


NEWTON_STEPS = 100  # at most; an L2-penalised logistic fit converges in about 10
FIT_CHUNK = 64  # images fitted at once (memory: about FIT_CHUNK x mutants per image x grid^2 x 8 bytes)


def _fit(weight, bias, x, y, img, constant, l2) -> None:
    """L2-penalized logistic regression of every fitted image at once (independent problems), by Newton's
    method with step halving: features x [m, d], labels y [m], image img [m]; images with a ``constant``
    are left out. Fills ``weight`` [N, d] and ``bias`` [N] in place.

    The objective is strictly convex (penalty l2 > 0 on the weights), so Newton's method converges to its
    one minimum in a few steps of a (d+1) x (d+1) solve per image. (torch.optim.LBFGS reached the same
    minimum, but the first one of a process imports torch._dynamo: about 1.2 s.)
    """
    fitted = [i for i, c in enumerate(constant) if c is None]
    for a in range(0, len(fitted), FIT_CHUNK):
        chunk = torch.tensor(fitted[a:a + FIT_CHUNK], dtype=torch.int64, device=img.device)
        sel = torch.isin(img, chunk)
        if sel.any():
            row = torch.searchsorted(chunk, img[sel])
            v = logistic_newton(x[sel], y[sel], row, len(chunk), ridge(x.shape[1], l2, x.device))
            weight[chunk] = v[:, :-1].to(weight.dtype)
            bias[chunk] = v[:, -1].to(bias.dtype)


def ridge(d: int, l2: float, device=None) -> torch.Tensor:
    """The penalty matrix of :func:`logistic_newton` for an L2 penalty ``l2`` on d weights, none on the intercept:
    float64 [d+1, d+1] on ``device`` (None: the CPU)."""
    pen = torch.full((d + 1,), float(l2), dtype=torch.float64, device=device or torch.device("cpu"))
    pen[d] = 0.0
    return torch.diag(pen)


def logistic_newton(x, y, row, k, penalty) -> torch.Tensor:
    """k independent penalised logistic regressions: mutant j (features x [m, d], label y [m]) belongs to problem
    ``row[j]`` (int64 [m], every problem in [0, k) has mutants); each problem minimises its binary cross-entropy
    plus v' penalty v / 2 (``penalty`` float64 [d+1, d+1], positive semi-definite, positive definite on the
    weights; the last row and column are the intercept's). Returns float64 [k, d+1]: the weights and (last)
    the intercept of each."""
    d, dev = x.shape[1], x.device
    order = torch.argsort(row, stable=True)
    counts = torch.bincount(row, minlength=k)
    col = torch.arange(len(row), device=dev) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    # padded per problem with rows of zeros (the intercept's column too): they add a constant to the objective
    # and nothing to its gradient or curvature
    xs = torch.zeros(k, int(counts.max()), d + 1, dtype=torch.float64, device=dev)  # column d: 1, the intercept's
    ys = torch.zeros(k, xs.shape[1], dtype=torch.float64, device=dev)
    xs[row[order], col] = torch.cat([x[order], torch.ones(len(row), 1, dtype=torch.float64, device=dev)], 1)
    ys[row[order], col] = y[order]
    pen = penalty.to(dev, torch.float64)

    def objective(v):  # [k, d+1] -> [k]
        z = torch.einsum("kmd,kd->km", xs, v)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(z, ys, reduction="none")
        return bce.sum(1) + 0.5 * ((v @ pen) * v).sum(1)

    v = torch.zeros(k, d + 1, dtype=torch.float64, device=dev)
    cur = objective(v)
    for _ in range(NEWTON_STEPS):
        prob = torch.sigmoid(torch.einsum("kmd,kd->km", xs, v))
        grad = torch.einsum("kmd,km->kd", xs, prob - ys) + v @ pen
        curv = prob * (1 - prob)
        hess = torch.einsum("kmd,km,kme->kde", xs, curv, xs) + pen + 1e-12 * torch.eye(d + 1, dtype=torch.float64, device=dev)
        # the Hessian is symmetric positive definite (the penalty on the weights, the intercept's curvature)
        step = torch.cholesky_solve(grad.unsqueeze(2), torch.linalg.cholesky(hess)).squeeze(2)
        t = torch.ones(k, 1, dtype=torch.float64, device=dev)
        new = objective(v - t * step)
        for _ in range(40):  # halve the step where it does not decrease the objective
            worse = new > cur
            if not worse.any():
                break
            t = torch.where(worse.unsqueeze(1), t / 2, t)
            new = torch.where(worse, objective(v - t * step), new)
        better = new <= cur
        v = torch.where(better.unsqueeze(1), v - t * step, v)
        done = (cur - torch.where(better, new, cur)) <= 1e-12 * cur.abs().clamp(min=1.0)
        cur = torch.where(better, new, cur)
        if bool(done.all()):
            break
    return v


def virtual_descents(surrogate: Surrogate, prep: Prepared, present: torch.Tensor, images: list[int], iterations: int,
                     depth: int, min_box: int, seed: int) -> torch.Tensor:
    """ReX's descents on the surrogate: float64 [N, H, W], the sum over ``iterations`` descents of each image in
    ``images`` (seeds seed + t) of their log maps (zeros for the other images). No forward pass of the model."""
    logs, _ = descend(surrogate, prep, present, lambda i, f, top1: bool(top1),
                      [(i, seed + t) for i in images for t in range(iterations)], depth, min_box, MutantCache(),
                      progress=False, monotone=False, per_image=True)
    return logs


SEED_OFFSET = 1_000_000  # virtual descent t of a ranking seeded s draws its splits with seed s + SEED_OFFSET + t


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def check_virtual_iterations(virtual_iterations) -> None:
    _check_count("virtual_iterations", virtual_iterations)


def add_virtual_descents(maps: torch.Tensor, cache: MutantCache, runner: ChunkRunner, prep: Prepared,
                         present: torch.Tensor, passes, iterations: int, depth: int, min_box: int,
                         seed: int) -> torch.Tensor:
    """``maps`` (float64 [N, H, W], the real descents' summed log maps, whose mutants ``cache`` holds) plus
    ``iterations`` virtual descents per image with pixels ``present`` (bool [N, H*W]) on a surrogate fitted
    to those mutants (:func:`fit_surrogate`, :func:`virtual_descents`). ``iterations=0``: ``maps`` itself."""
    if iterations == 0:
        return maps
    n, _, h, w = prep.images.shape
    surrogate = fit_surrogate(cache, present, passes, n, h, w, runner)
    images = [i for i in range(n) if bool(present[i].any())]
    return maps + virtual_descents(surrogate, prep, present, images, iterations, depth, min_box,
                                   seed + SEED_OFFSET).to(maps.device)


GATE_MARGIN = 0.05  # a gated descent asks the model where the surrogate's probability lies in (m, 1 - m)


class GatedEvaluator:
    """The evaluator of a gated descent: the surrogate answers the mutants it is sure of, the model the others.

    A mutant whose predicted probability of passing (:meth:`Surrogate.score_rectangles`) is at most ``margin``
    or at least 1 - ``margin`` takes the surrogate's answer, at no query; every other mutant, and every
    mutant of an image whose surrogate is a constant (all its mutants had one outcome: nothing was learnt),
    is painted and scored on ``evaluator`` (the model's).
    """

    def __init__(self, evaluator, surrogate: Surrogate, margin: float = GATE_MARGIN):
        if not 0 <= margin <= 0.5:
            raise ValueError(f"margin must be in [0, 0.5], got {margin!r}")
        self.evaluator, self.surrogate, self.margin = evaluator, surrogate, margin
        self.runner = evaluator.runner

    def score_rectangles(self, rects: torch.Tensor, owner: torch.Tensor, images: torch.Tensor,
                         present: torch.Tensor) -> torch.Tensor:
        """As :meth:`Surrogate.score_rectangles` (float64 [m, 4]), but the model's f, top-1 and pixels kept
        (fourth column 1: a query) for the mutants the surrogate is unsure of."""
        out = self.surrogate.score_rectangles(rects, owner, images, present).to(images.device)
        prob = out[:, 0]
        fitted = torch.tensor([c is None for c in self.surrogate.constant], device=images.device)[images]
        ask = ((prob > self.margin) & (prob < 1 - self.margin)) | ~fitted
        if bool(ask.any()):
            asked = ask.nonzero().flatten()
            scored = score_painted_rows(self.evaluator, rects, owner, images, asked, present, self.surrogate.h,
                                        self.surrogate.w)
            out[asked] = torch.cat([scored.to(out.device), torch.ones(len(asked), 1, dtype=out.dtype,
                                                                      device=out.device)], 1)
        return out


def add_gated_descents(maps: torch.Tensor, queries: list[int], cache: MutantCache, evaluator, prep: Prepared,
                       present: torch.Tensor, passes, iterations: int, first_seed: int, depth: int, min_box: int,
                       monotone: bool, margin: float = GATE_MARGIN) -> tuple[torch.Tensor, list[int]]:
    """``iterations`` more descents per image (seeds first_seed + t), each on a :class:`GatedEvaluator` whose
    surrogate is fitted (:func:`fit_surrogate`) to every mutant the model has scored so far (``cache``, which
    the descents share). Returns (``maps`` float64 [N, H, W] plus their log maps, ``queries`` plus the model's
    queries per image)."""
    n, _, h, w = prep.images.shape
    queries = list(queries)
    for t in range(iterations):
        surrogate = fit_surrogate(cache, present, passes, n, h, w, evaluator.runner)
        logs, q = compute_responsibility(GatedEvaluator(evaluator, surrogate, margin), prep, present, passes, 1,
                                         depth, min_box, first_seed + t, False, monotone=monotone, cache=cache)
        maps = maps + logs.to(maps.device)
        queries = [a + b for a, b in zip(queries, q)]
    return maps, queries


def check_gated_iterations(gated_iterations, iterations: int | str) -> None:
    """gated_iterations: an int >= 0, and 0 unless ``iterations`` is an int (gated descents follow a fixed number
    of real ones)."""
    _check_count("gated_iterations", gated_iterations)
    if gated_iterations and iterations == "auto":
        raise ValueError('gated_iterations needs an int number of iterations, not iterations="auto"')


def research_hook(virtual_iterations: int = 0, gated_iterations: int = 0,
                  monotone_memory: bool = False) -> RankingHook:
    """The :class:`~overinterp_fast.methods.responsibility.RankingHook` of the research options, for
    :func:`~overinterp_fast.methods.responsibility.ranking_maps`: the real descents (an int number of iterations)
    run with the mutant memory (``monotone_memory``:
    :func:`~overinterp_fast.experimental.mutant_memory.remembered_responsibility`), then ``gated_iterations`` gated
    ones (an int number of iterations only, see :func:`check_gated_iterations`: :func:`add_gated_descents`, seeds
    seed + iterations + t), then ``virtual_iterations`` virtual ones (:func:`add_virtual_descents`)."""

    def after(maps, queries, cache, evaluator, prep, present, passes, plan: DescentPlan):
        if plan.iterations != "auto":  # gated_iterations is 0 with "auto" (check_gated_iterations)
            maps, queries = add_gated_descents(maps, queries, cache, evaluator, prep, present, passes,
                                               gated_iterations, plan.seed + plan.iterations, plan.depth,
                                               plan.min_box, plan.monotone)
        maps = add_virtual_descents(maps, cache, evaluator.runner, prep, present, passes, virtual_iterations,
                                    plan.depth, plan.min_box, plan.seed)
        return maps, queries

    return RankingHook(descents=remembered_responsibility if monotone_memory else None, after=after)
