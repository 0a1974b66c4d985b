"""Ranking pixels block by block: the extraction's granularity for minimal pixel sets.

A responsibility map ranks single pixels, but its fine structure is noise: after a
few iterations two pixels of one 8x8 square at 224x224 differ mostly by which
random boxes happened to split between them. Ranking squares of ``block`` x
``block`` pixels by their mean score (and the pixels inside a square by their
own score) keeps each square's pixels together in the ranking. A prefix search
then steps one square at a time (about k / block^2 queries for a set of k pixels,
against k / 10 for ReX's steps of 10), and a pixel-exact boundary is found
inside the last square. See README.md, "Minimal pixel sets".
"""
from __future__ import annotations

import math

import torch

from ..runtime.sync import to_host
from .ranking import order_positions

AUTO_GRID = 784  # block="auto": squares of side round(sqrt(H W / 784)), i.e. about a 28 x 28 grid (8 at 224 x 224)
SCAN_SQUARES = 64  # the scan steps one square at a time over the first 64 squares of the ranking ...
SCAN_RATIO = 1.1  # ... then by square ends at least 1.1 times the last size tried


def auto_block(h: int, w: int) -> int:
    """The default block side for an H x W image: 1 below about 40 x 40, 8 at 224 x 224."""
    return max(1, round(math.sqrt(h * w / AUTO_GRID)))


def check_block(block) -> None:
    if not (isinstance(block, str) and block == "auto") and (
            isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be 'auto' or an int >= 1, got {block!r}")


def block_positions(
    scores: torch.Tensor, present: torch.Tensor, h: int, w: int, block: int
) -> tuple[torch.Tensor, list[list[int]], torch.Tensor]:
    """Rank pixels square by square.

    Squares are the ``block`` x ``block`` tiles of the H x W grid (smaller at the right and
    bottom edges when ``block`` does not divide H or W). A square's score is the mean score of
    its present pixels, rounded to 9 decimals. Squares rank by descending score (equal scores: the higher square index
    first, squares numbered row-major); inside a square, pixels rank by descending score (equal
    scores: the higher pixel index first). With ``block=1`` the ranking is that of
    :func:`~overinterp_fast.methods.ranking.ranking_positions`.

    Args:
        scores: float [n, H*W]. present: bool [n, H*W] (absent pixels rank last, at position H*W).
        block: the square's side in pixels.

    Returns:
        (int64 [n, H*W] every pixel's position; per row the prefix sizes that end a square
        (ascending, the last one the row's present count; squares without a present pixel
        are skipped); float64 [n, H*W] the score each pixel is ranked by: its square's mean).
    """
    n, p = scores.shape
    if p != h * w:
        raise ValueError(f"scores have {p} features per row, not H*W = {h * w}")
    dev = scores.device
    bh, bw = -(-h // block), -(-w // block)
    pad = (0, bw * block - w, 0, bh * block - h)
    s = torch.nn.functional.pad(torch.where(present, scores.double(), 0.0).view(n, h, w), pad)
    c = torch.nn.functional.pad(present.view(n, h, w).double(), pad)
    sums = s.view(n, bh, block, bw, block).sum((2, 4)).view(n, -1)
    counts = c.view(n, bh, block, bw, block).sum((2, 4)).view(n, -1)
    # rounded to 9 decimals: squares whose sums are equal up to the order of the additions tie
    mean = torch.where(counts > 0, torch.round(sums / counts.clamp(min=1), decimals=9), -torch.inf)  # [n, bh * bw]
    ys = torch.arange(h, device=dev).view(-1, 1) // block
    xs = torch.arange(w, device=dev).view(1, -1) // block
    square = (ys * bw + xs).view(-1)  # [p] the square of every pixel
    key = torch.where(present, mean[:, square], -torch.inf)
    pixel = torch.where(present, scores.double(), -torch.inf)
    # least significant key first, each sort stable: pixel index (higher first), pixel score,
    # square index (higher first), square score
    order = torch.arange(p - 1, -1, -1, device=dev).expand(n, p)
    order = order.gather(1, torch.sort(pixel.gather(1, order), dim=1, descending=True, stable=True).indices)
    order = order.gather(1, torch.sort(square[order], dim=1, descending=True, stable=True).indices)
    order = order.gather(1, torch.sort(key.gather(1, order), dim=1, descending=True, stable=True).indices)
    pos = order_positions(order, present)
    squares = mean.shape[1]
    by_square = squares - 1 - torch.sort(mean.flip(1), dim=1, descending=True, stable=True).indices
    ends = counts.gather(1, by_square).long()
    (ends,) = to_host(ends, label="square ends")
    sizes = [[int(v) for v, e in zip(row.cumsum(0).tolist(), row.tolist()) if e > 0] for row in ends]
    return pos, sizes, torch.where(present, key, torch.zeros((), dtype=key.dtype, device=dev))


def scan_sizes(ends: list[int], squares: int = SCAN_SQUARES, ratio: float = SCAN_RATIO) -> list[int]:
    """The prefix sizes a scan tries, from the square ends of one row (ascending).

    Every end over the first ``squares`` squares (where minimal pixel sets lie: 64 squares
    are 8% of a 28 x 28 grid), then only ends of at least ``ratio`` times the last size kept,
    and always the last end (the whole row): about k / block^2 queries for a set of k pixels
    within the first 64 squares, and about 26 more up to the whole image, instead of one per
    square. The criterion is not monotone, so a passing window of the tail can be stepped over:
    the set found is then larger than the first passing prefix of squares.
    """
    out = list(ends[:squares])
    for e in ends[squares:]:
        if e >= ratio * out[-1] or e == ends[-1]:
            out.append(e)
    return out
