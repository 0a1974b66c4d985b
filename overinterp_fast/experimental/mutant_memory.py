"""Monotone inference across descents: a remembered mutant answers later ones without a query (opt-in).

``monotone=True`` already assumes, within one split, that passing is monotone in the pixels a
mutant keeps (a mutant none of whose scored supersets passed is taken as failing). This module
applies the same assumption *between* splits, levels and descents of one image. Every mutant the
model scored is remembered as a pixel mask: per image the minimal passing ones and the maximal
failing ones (:class:`MutantMemory`). A later mutant that keeps every pixel of a remembered pass is
taken as passing, and one that keeps no pixel outside a remembered fail as failing, with no query
(:class:`RememberingEvaluator`; such answers go to ``MutantCache.guessed``, like a surrogate's, so
no surrogate fit learns from them).

For the memory to fill before it is used, the descents run in waves (:func:`remembered_responsibility`):
wave t holds descent t (seed + t) of every image. On a criterion that is monotone in the pixels
kept the map is the one the same descents give without the memory; the top-1 class of a real
model is not monotone, and on EfficientNet-Lite0 about 12% of the inferred answers were wrong
(docs: notes/measurements.md, "Monotone inference across descents"). The map is then an
estimate of ReX's, not ReX's; every set extracted from it is still checked on the model.

Measured (7 photos, EfficientNet-Lite0, 6 runs): 8 remembered descents, then 9 gated and 100
virtual ones (:mod:`overinterp_fast.experimental.surrogate`) agree with ReX's minimal pixel sets at a Dice of
0.581 +- 0.011 (ReX with itself: 0.552) for 536 queries per image (ReX: 2,310), with sets
larger than ReX's (median 13.3% of the image against 11.6%).
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..ops import kernels as _ops
from ..runtime.inputs import Prepared
from ..methods.responsibility import MutantCache, compute_responsibility, score_painted_rows, select_mutants


def check_monotone_memory(monotone_memory: bool, iterations: int | str, criterion: str) -> None:
    """monotone_memory=True (a bool, checked by the caller) needs an int number of iterations (the waves) and the
    "top1" criterion (a remembered answer has no f to compare with a threshold)."""
    if monotone_memory and iterations == "auto":
        raise ValueError('monotone_memory needs an int number of iterations, not iterations="auto"')
    if monotone_memory and criterion != "top1":
        raise ValueError(f'monotone_memory needs criterion="top1" (a remembered answer has no f to compare with a '
                         f'threshold), got {criterion!r}')


class MutantMemory:
    """Per image, the masks of the minimal passing and the maximal failing mutants scored.

    Masks are float32 [k, P] (1: the pixel is kept), so containment is one matrix product: a mask
    A lies inside B when A @ (1 - B).T is 0 (exact: at most P < 2^24 products of 0 and 1).
    """

    def __init__(self, n: int):
        self.passing: list[torch.Tensor | None] = [None] * n
        self.failing: list[torch.Tensor | None] = [None] * n

    def infer(self, image: int, masks: torch.Tensor) -> torch.Tensor:
        """The remembered answers for mutants ``masks`` (float32 [m, P]) of ``image``: int8 [m], 1 = keeps every
        pixel of a remembered pass, 0 = keeps no pixel outside a remembered fail (and no pass), -1 = unknown."""
        out = torch.full((masks.shape[0],), -1, dtype=torch.int8, device=masks.device)
        passing, failing = self.passing[image], self.failing[image]
        if passing is not None:
            out[((passing @ (1 - masks).T) == 0).any(0)] = 1
        if failing is not None:
            inside = (((1 - failing) @ masks.T) == 0).any(0)
            out[inside & (out == -1)] = 0
        return out

    def add(self, image: int, mask: torch.Tensor, passed: bool) -> None:
        """Remember a scored mutant (``mask`` float32 [P]): a pass unless it contains a remembered one (then the
        remembered passes that contain it are dropped); a fail unless a remembered one contains it (then the
        remembered fails inside it are dropped)."""
        row = mask[None]
        if passed:
            old = self.passing[image]
            if old is not None and ((old @ (1 - row).T) == 0).any():
                return
            self.passing[image] = row if old is None else torch.cat([old[((row @ (1 - old).T) != 0)[0]], row])
        else:
            old = self.failing[image]
            if old is not None and (((1 - old) @ row.T) == 0).any():
                return
            self.failing[image] = row if old is None else torch.cat([old[(((1 - row) @ old.T) != 0)[0]], row])


class RememberingEvaluator:
    """An evaluator for :func:`~overinterp_fast.methods.responsibility.descend` that answers from a
    :class:`MutantMemory` where it can and asks ``evaluator`` (the model's) the rest, remembering the answers.

    ``passes(image, f, top1)`` is the criterion; it must read ``top1`` only (the "top1" criterion): a remembered
    answer has no f (NaN).
    """

    def __init__(self, evaluator, memory: MutantMemory, passes, h: int, w: int):
        self.evaluator, self.memory, self.passes, self.h, self.w = evaluator, memory, passes, h, w
        self.runner = evaluator.runner

    def score_rectangles(self, rects: torch.Tensor, owner: torch.Tensor, images: torch.Tensor,
                         present: torch.Tensor) -> torch.Tensor:
        """Score mutants given as rectangles (int64 [R, 4] of mutant ``owner`` int64 [R] in [0, m), of images
        int64 [m]; ``present`` bool [N, H*W] the pixels they may keep). Returns float64 [m, 4]: f (NaN where
        remembered), top-1 is the target (0 or 1; remembered: the inferred answer), pixels kept, and 1 where
        the model was asked (a query), 0 where the memory answered."""
        dev = images.device
        m = images.shape[0]
        verdict = torch.full((m,), -1, dtype=torch.int8, device=dev)
        kept = torch.zeros(m, dtype=torch.float64, device=dev)
        pending: dict[int, torch.Tensor] = {}  # mutant -> its mask, for the mutants the model is asked
        for i in images.unique().tolist():  # image by image: one image's masks in memory at a time
            rows = (images == i).nonzero().flatten()
            sub_rects, sub_owner = select_mutants(rects, owner, m, rows)
            cover = _ops.rect_fill(sub_rects, sub_owner, torch.ones_like(sub_owner), len(rows), self.h, self.w)
            masks = ((cover.view(len(rows), -1) > 0) & present[i]).float()
            known = self.memory.infer(i, masks)
            verdict[rows] = known
            kept[rows] = masks.sum(1).double()
            for j, mask, answer in zip(rows.tolist(), masks, known.tolist()):
                if answer < 0:
                    pending[j] = mask
        out = torch.stack([torch.full((m,), float("nan"), dtype=torch.float64, device=dev), verdict.double(), kept,
                           torch.zeros(m, dtype=torch.float64, device=dev)], 1)
        asked = (verdict < 0).nonzero().flatten()
        if len(asked):
            scored = score_painted_rows(self.evaluator, rects, owner, images, asked, present, self.h, self.w)
            out[asked] = torch.cat([scored.to(dev), torch.ones(len(asked), 1, dtype=out.dtype, device=dev)], 1)
            for j, (f, top1) in zip(asked.tolist(), scored[:, :2].tolist()):  # mutant by mutant, in order
                image = int(images[j])
                self.memory.add(image, pending[j], bool(self.passes(image, f, bool(top1))))
        return out


def remembered_responsibility(evaluator, prep: Prepared, present: torch.Tensor, passes, iterations: int, depth: int,
                              min_box: int, seed: int, progress: bool | None, monotone: bool, cache: MutantCache,
                              scorer: RememberingEvaluator | None = None) -> tuple[torch.Tensor, list[int]]:
    """``iterations`` descents per image (seeds seed + t) in waves, wave t holding descent t of every image, all
    scored through one :class:`MutantMemory` (see the module). ``cache``: the mutant cache the waves share.
    ``scorer``: the remembering evaluator to use (None: a new one over ``evaluator`` with an empty memory).
    Returns (float64 [N, H, W] the summed log maps, the model's queries per image)."""
    n, _, h, w = prep.images.shape
    scorer = RememberingEvaluator(evaluator, MutantMemory(n), passes, h, w) if scorer is None else scorer
    maps = torch.zeros(n, h, w, dtype=torch.float64, device=prep.images.device)
    queries = [0] * n
    for t in tqdm(range(iterations), unit="descent", desc="responsibility",
                  disable=None if progress is None else not progress):
        logs, q = compute_responsibility(scorer, prep, present, passes, 1, depth, min_box, seed + t, False,
                                         monotone=monotone, cache=cache)
        maps += logs.to(maps.device)
        queries = [a + b for a, b in zip(queries, q)]
    return maps, queries
