"""Virtual descents: more ReX descents on a surrogate of the model's criterion, at no query (opt-in).

The real descents of a ranking score a few hundred mutants per image (kept in the
:class:`~overinterp_fast.responsibility.MutantCache`). Per image, a logistic model on
the fraction of each cell of a ``grid`` x ``grid`` partition of the image that a mutant
keeps is fitted to whether the mutant passed (L2 penalty ``l2`` on the weights, not on
the intercept: scikit-learn's ``LogisticRegression(C=1 / l2)``, fitted here with
torch's L-BFGS, all images at once). Then ``iterations`` more descents run on it, as
ReX's descent runs on the model (every mutant "scored", nothing skipped), with no
forward pass of the model, and their log maps are added to the real ones. The map is
then an estimate of ReX's map, not ReX's map: the surrogate errs on some mutants.
Every set extracted from the ranking is still checked on the model itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .batching import ChunkRunner
from .inputs import Prepared
from .responsibility import MutantCache, descend

GRID = 14  # cells per side: 16 x 16 pixels at 224 x 224
L2 = 1.0


def cell_fractions(keep: torch.Tensor, h: int, w: int, grid: int) -> torch.Tensor:
    """The fraction of each cell of a grid x grid partition kept: bool [m, H*W] -> float64 [m, grid*grid]
    (``torch.nn.functional.adaptive_avg_pool2d``'s cells)."""
    return torch.nn.functional.adaptive_avg_pool2d(keep.view(-1, 1, h, w).double(), grid).flatten(1)


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

    def __call__(self, keep: torch.Tensor, image: torch.Tensor, row: torch.Tensor, feature: torch.Tensor):
        """The evaluator interface of :func:`~overinterp_fast.responsibility.descend`: (probability of
        passing float64 [m], predicted to pass bool [m]) for the mutants ``keep`` (bool [m, H*W]) of
        ``image`` (int64 [m]); ``row``, ``feature`` unused."""
        x = cell_fractions(keep, self.h, self.w, self.grid).to(self.weight.device)
        img = image.to(self.weight.device)
        prob = torch.sigmoid((x * self.weight[img]).sum(1) + self.bias[img])
        for i, c in enumerate(self.constant):
            if c is not None:
                prob = torch.where(img == i, torch.tensor(float(c), dtype=prob.dtype, device=prob.device), prob)
        return prob.to(keep.device), (prob > 0.5).to(keep.device)


def fit_surrogate(cache: MutantCache, present: torch.Tensor, passes, n: int, h: int, w: int, runner: ChunkRunner,
                  grid: int = GRID, l2: float = L2) -> Surrogate:
    """Fit :class:`Surrogate` to the mutants of ``cache`` (keys (image, rectangles...)): each mutant keeps its
    rectangles' pixels that are ``present`` (bool [N, H*W]); its label is ``passes(image, f, top1)``."""
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be an int >= 1, got {grid!r}")
    if not l2 > 0:
        raise ValueError(f"l2 must be > 0, got {l2!r}")
    d = grid * grid
    by_image: list[list[tuple]] = [[] for _ in range(n)]
    for key, (f, top1, _) in cache.scores.items():
        by_image[key[0]].append((key[1:], bool(passes(key[0], f, top1))))
    feats, labels, owner = [], [], []
    for i, rows in enumerate(by_image):
        if not rows:
            continue
        keep = torch.zeros(len(rows), h, w, dtype=torch.bool)
        for j, (rects, _) in enumerate(rows):
            for y0, x0, y1, x1 in rects:
                keep[j, y0:y1, x0:x1] = True
        keep = keep.view(len(rows), -1) & present[i].cpu()
        feats.append(cell_fractions(keep, h, w, grid))
        labels.append(torch.tensor([y for _, y in rows], dtype=torch.float64))
        owner.append(torch.full((len(rows),), i, dtype=torch.int64))
    constant: list[bool | None] = [None] * n
    for i, rows in enumerate(by_image):
        ys = {y for _, y in rows}
        if len(ys) <= 1:  # nothing to separate: all passed, all failed, or none scored (taken as failing)
            constant[i] = ys.pop() if ys else False
    accuracy = [float("nan")] * n
    with torch.inference_mode(False), torch.enable_grad():  # fast_sis runs under inference mode
        weight = torch.zeros(n, d, dtype=torch.float64, requires_grad=True)
        bias = torch.zeros(n, dtype=torch.float64, requires_grad=True)
        if feats:
            _fit(weight, bias, [f.clone() for f in feats], [y.clone() for y in labels], [o.clone() for o in owner],
                 constant, l2)
    if feats:
        x_all, y_all, img_all = torch.cat(feats), torch.cat(labels).bool(), torch.cat(owner)
        pred = torch.sigmoid((x_all * weight.detach()[img_all]).sum(1) + bias.detach()[img_all]) > 0.5
        for i in range(n):
            sel = img_all == i
            if sel.any():
                p_i = pred[sel] if constant[i] is None else torch.full_like(pred[sel], bool(constant[i]))
                accuracy[i] = float((p_i == y_all[sel]).double().mean())
    return Surrogate(weight.detach(), bias.detach(), constant, grid, h, w, runner, accuracy)


def _fit(weight, bias, feats, labels, owner, constant, l2) -> None:
    """L2-penalized logistic regression of every fitted image at once (independent problems, one sum)."""
    x, y, img = torch.cat(feats), torch.cat(labels), torch.cat(owner)
    fitted = torch.tensor([c is None for c in constant])[img]
    x, y, img = x[fitted], y[fitted], img[fitted]
    if not len(y):
        return
    opt = torch.optim.LBFGS([weight, bias], lr=1, max_iter=500, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        z = (x * weight[img]).sum(1) + bias[img]
        value = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum")
        value = value + 0.5 * l2 * (weight ** 2).sum()
        value.backward()
        return value

    opt.step(loss)


def virtual_descents(surrogate: Surrogate, prep: Prepared, present: torch.Tensor, images: list[int], iterations: int,
                     depth: int, min_box: int, seed: int) -> torch.Tensor:
    """ReX's descents on the surrogate: float64 [N, H, W], the sum over ``iterations`` descents of each image in
    ``images`` (seeds seed + t) of their log maps (zeros for the other images). No forward pass of the model."""
    n, _, h, w = prep.images.shape
    out = torch.zeros(n, h, w, dtype=torch.float64, device=prep.images.device)
    if not images or iterations == 0:
        return out
    logs, _ = descend(surrogate, prep, present, lambda i, f, top1: bool(top1),
                      [(i, seed + t) for i in images for t in range(iterations)], depth, min_box, MutantCache(),
                      progress=False, monotone=False)
    out[torch.tensor(images, device=out.device)] = logs.view(len(images), iterations, h, w).sum(1).to(out.device)
    return out


SEED_OFFSET = 1_000_000  # virtual descent t of a ranking seeded s draws its splits with seed s + SEED_OFFSET + t


def check_virtual_iterations(virtual_iterations) -> None:
    if isinstance(virtual_iterations, bool) or not isinstance(virtual_iterations, int) or virtual_iterations < 0:
        raise ValueError(f"virtual_iterations must be an int >= 0, got {virtual_iterations!r}")


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
