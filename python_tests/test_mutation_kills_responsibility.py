"""Hand-built expectations for responsibility.py's small helpers (added for mutmut survivors; see TESTING.md).

Every expected value is written out by hand here; nothing is computed with the module under test.
"""
import re

import pytest
import torch

from overinterp_fast.responsibility import SUBSETS, _area, _dice, _split, check_responsibility_options, ranking_positions


def _b(*bits):
    return torch.tensor([bool(v) for v in bits])


def test_dice_by_hand():
    # |a| = 2, |b| = 2, |a & b| = 1, |a | b| = 3: Dice = 2 * 1 / 4
    assert _dice(_b(1, 1, 0, 0), _b(1, 0, 1, 0)) == 0.5
    # |a| = 3, |b| = 1, overlap 1: 2 / 4 (a difference of sizes, 2, would give 1.0)
    assert _dice(_b(1, 1, 1, 0), _b(1, 0, 0, 0)) == 0.5
    # one pixel in a only: total 1, overlap 0 -> 0.0
    assert _dice(_b(1, 0), _b(0, 0)) == 0.0
    # disjoint: 0.0; identical: 1.0
    assert _dice(_b(1, 0, 0), _b(0, 1, 0)) == 0.0
    assert _dice(_b(0, 1, 1), _b(0, 1, 1)) == 1.0
    # both empty: 1.0 by definition (no division by zero)
    assert _dice(_b(0, 0, 0), _b(0, 0, 0)) == 1.0


def test_subsets_are_the_14_nonempty_proper_subsets_in_bit_order():
    assert SUBSETS == [[0], [1], [0, 1], [2], [0, 2], [1, 2], [0, 1, 2], [3], [0, 3], [1, 3], [0, 1, 3],
                       [2, 3], [0, 2, 3], [1, 2, 3]]


class _FixedRng:
    """integers(lo, hi) returns the queued values, checking the requested ranges."""

    def __init__(self, *calls):
        self.calls = list(calls)

    def integers(self, lo, hi):
        (elo, ehi), v = self.calls.pop(0)
        assert (lo, hi) == (elo, ehi)
        return v


def test_split_and_area_by_hand():
    # box rows 2..7, cols 1..9; split at row 4 (drawn from [2, 8)), col 6 (drawn from [1, 10))
    quads = _split((2, 1, 7, 9), _FixedRng(((2, 8), 4), ((1, 10), 6)))
    assert quads == [(2, 1, 4, 6), (2, 6, 4, 9), (4, 1, 7, 6), (4, 6, 7, 9)]
    assert [_area(q) for q in quads] == [10, 6, 15, 9]
    assert _area((3, 3, 3, 8)) == 0 and _area((5, 2, 3, 4)) == 0 and _area((0, 5, 2, 1)) == 0
    assert _area((0, 0, 1, 1)) == 1


def test_ranking_positions_by_hand():
    scores = torch.tensor([[0.5, 2.0, 0.5, -1.0, 3.0],
                           [1.0, 1.0, 1.0, 1.0, 1.0]])
    present = _b(1, 1, 1, 1, 1, 1, 0, 1, 0, 1).view(2, 5)
    pos = ranking_positions(scores, present)
    # row 0: 4 (3.0), 1 (2.0), then the tie 0.5: higher index first -> 2, 0; then 3
    assert pos.tolist()[0] == [3, 1, 2, 4, 0]
    # row 1: all equal; present 0, 2, 4: higher index first -> 4, 2, 0; absent ones at p = 5
    assert pos.tolist()[1] == [2, 5, 1, 5, 0]
    assert pos.dtype == torch.int64


@pytest.mark.parametrize("args, message", [
    ((0, 10, 10, 0), "iterations must be an int >= 1, got 0"),
    ((True, 10, 10, 0), "iterations must be an int >= 1, got True"),
    ((2.0, 10, 10, 0), "iterations must be an int >= 1, got 2.0"),
    ((1, 0, 10, 0), "depth must be an int >= 1, got 0"),
    ((1, 1, 0, 0), "min_box must be an int >= 1, got 0"),
    ((1, 1, 1, 1.5), "seed must be an int, got 1.5"),
    ((1, 1, 1, False), "seed must be an int, got False"),
])
def test_option_errors_whole_message(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        check_responsibility_options(*args)
    check_responsibility_options(1, 1, 1, -3)  # the smallest valid values pass
