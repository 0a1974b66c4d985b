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
    # integer scores rank the same way (absent features are set below every score, in float64)
    ints = ranking_positions(torch.tensor([[3, 1, 3, 2]]), _b(1, 1, 1, 0).view(1, 4))
    assert ints.tolist() == [[1, 2, 0, 4]]


@pytest.mark.parametrize("args, message", [
    ((0, 10, 10, 0), "iterations must be an int >= 1, got 0"),
    ((True, 10, 10, 0), "iterations must be an int >= 1, got True"),
    ((2.0, 10, 10, 0), "iterations must be an int >= 1, got 2.0"),
    ((1, 0, 10, 0), "depth must be an int >= 1, got 0"),
    ((1, 1, 0, 0), "min_box must be an int >= 1, got 0"),
    ((1, 1, 1, 1.5), "seed must be an int >= 0, got 1.5"),
    ((1, 1, 1, False), "seed must be an int >= 0, got False"),
    ((1, 1, 1, -1), "seed must be an int >= 0, got -1"),
])
def test_option_errors_whole_message(args, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        check_responsibility_options(*args)
    check_responsibility_options(1, 1, 1, 0)  # the smallest valid values pass


# ---------------------------------------------------------------------------------------------------------
# descend / compute_responsibility / auto_responsibility on 4x4 and 8x8 planted models.
# Split points are scripted (a stand-in for numpy's default_rng), so every map below is written out by hand
# from SPEC.md section 3a: the per-iteration map starts at 1; each mutant predicted as the target adds 1/k to
# each of its k kept quadrants; the passing mutant of the smallest unmasked area (ties: the first) is refined.

import math  # noqa: E402

import numpy as np  # noqa: E402

import overinterp_fast as of  # noqa: E402
from overinterp_fast import api  # noqa: E402
from overinterp_fast.batching import CandidateEvaluator  # noqa: E402
from overinterp_fast.model import initial_predictions  # noqa: E402
from overinterp_fast.responsibility import (AUTO_DICE, AUTO_MAX_ITERATIONS, AUTO_MIN_ITERATIONS,  # noqa: E402
                                            AUTO_PATIENCE, AUTO_TOP_FRACTION, MutantCache, auto_responsibility,
                                            compute_responsibility, descend)

from conftest import fake_terminal  # noqa: E402


class _Pixels(torch.nn.Module):
    """Two logits: [sum of the given (row, col) pixels of channel 0 - 0.5, 0]. On an image of ones, class 0
    (the target) wins exactly when one of the pixels is kept."""

    def __init__(self, *pixels):
        super().__init__()
        self.pixels = pixels

    def forward(self, x):
        s = sum(x[:, 0, r, c] for r, c in self.pixels) - 0.5
        return torch.stack([s, torch.zeros_like(s)], 1)


class _ScriptedRng:
    """integers(lo, hi) returns the queued split coordinates (row, col, row, col, ...), checking each range."""

    def __init__(self, points):
        self.values = [v for p in points for v in p]

    def integers(self, lo, hi):
        v = self.values.pop(0)
        assert lo <= v < hi
        return v


def _script(monkeypatch, by_seed):
    """np.random.default_rng(seed) -> the scripted splits of that seed (an unknown seed fails the test)."""
    monkeypatch.setattr(np.random, "default_rng", lambda s: _ScriptedRng(by_seed[s]))


def _evaluator(model, images):
    s = api._setup(model, images, 0.9, None, 0.0, "logits", None, "responsibility")
    targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
    return CandidateEvaluator(s.fn, s.prep, targets, s.runner, measure=s.fn.score_and_top1), s.prep


def _top1(i, f, t):
    return bool(t)


def _blocks(h, w, *blocks):
    """float64 [h, w] of log(value) per block ((y0, x0, y1, x1), value); later blocks overwrite earlier."""
    out = torch.zeros(h, w, dtype=torch.float64)
    for (y0, x0, y1, x1), v in blocks:
        out[y0:y1, x0:x1] = math.log(v)
    return out


# quadrant 0 of a 4x4 split at (2, 2) holds pixel (0, 0). Mutants keeping it: [0], [0,1], [0,2], [0,1,2], [0,3],
# [0,1,3], [0,2,3]: quadrant 0 gets 1 + 3 * 1/2 + 3 * 1/3 = 3.5, every other quadrant 1/2 + 1/3 + 1/3 = 7/6.
_HALF = 1 + 3.5  # the kept quadrant's per-iteration value
_REST = 1 + 7 / 6  # each other quadrant's


@pytest.mark.timeout(30)
@pytest.mark.parametrize("depth, min_box, levels", [(10, 4, 2), (1, 4, 1), (2, 4, 2), (10, 5, 1), (10, 2, 2),
                                                     (2, 1, 2)])
def test_descend_by_hand_on_a_4x4_image(monkeypatch, depth, min_box, levels):
    """Level 1 splits the image at (2, 2) and refines [0] (area 4, the smallest passing); level 2 splits that
    2x2 box at (1, 1) and refines pixel (0, 0) (area 1 < min_box: the descent ends). min_box 5 or depth 1
    stop after level 1; depth 2 with min_box 1 stops after level 2 (a third level would split pixel (0, 0),
    and the scripted splits have none left: the test fails)."""
    _script(monkeypatch, {7: [(2, 2), (1, 1)]})
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        cache = MutantCache()
        logs, queries = descend(ev, prep, torch.ones(1, 16, dtype=torch.bool), _top1, [(0, 7)], depth, min_box, cache)
    if levels == 1:
        want = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF))
    else:  # level 2 adds 3.5 to pixel (0, 0) and 7/6 to the other three pixels of the 2x2 box
        want = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
    assert logs.shape == (1, 4, 4) and logs.dtype == torch.float64
    torch.testing.assert_close(logs[0], want, rtol=0, atol=1e-12)
    assert queries == [14 * levels] and cache.hits == 0
    assert len(cache.scores) == 14 * levels
    # the cached entry of the whole-image-but-quadrant-3 mutant: f = 1 - 0.5 (softmax of [0.5, 0]), top-1, 12 pixels
    key = (0, (0, 0, 2, 2), (0, 2, 2, 4), (2, 0, 4, 2))
    f, top1, area = cache.scores[key]
    assert f == pytest.approx(1 / (1 + math.exp(-0.5)), abs=1e-12) and top1 is True and area == 12
    f, top1, area = cache.scores[(0, (2, 2, 4, 4))]  # quadrant 3 alone: class 1 wins
    assert f == pytest.approx(1 / (1 + math.exp(0.5)), abs=1e-12) and top1 is False and area == 4


@pytest.mark.timeout(30)
def test_descend_empty_quadrants_share_passes_and_images_count_their_own_queries(monkeypatch):
    """Image 1 splits at (0, 2): quadrants 0 and 1 are empty, so the 14 mutants show only 4 distinct rectangle
    sets ({}, {q2}, {q3}, {q2, q3}): 4 queries. Its weights still divide by k counting the empty quadrants.
    The same descents again with the same cache: no query, every mutant a cache hit."""
    _script(monkeypatch, {0: [(2, 2)], 1: [(0, 2)]})
    x = torch.ones(2, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(2, 16, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        cache = MutantCache()
        logs, queries = descend(ev, prep, present, _top1, [(0, 0), (1, 1)], 1, 4, cache)
        assert queries == [14, 4] and cache.hits == 0 and len(cache.scores) == 18
        _script(monkeypatch, {0: [(2, 2)], 1: [(0, 2)]})
        again, q2 = descend(ev, prep, present, _top1, [(1, 1), (0, 0)], 1, 4, cache)
    assert q2 == [0, 0] and cache.hits == 28
    torch.testing.assert_close(logs[0], _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF)), rtol=0, atol=1e-12)
    # columns 0-1 (quadrant 2) are kept by [2], [0,2], [1,2], [0,1,2], [2,3], [0,2,3], [1,2,3]: the same 3.5 and 7/6
    torch.testing.assert_close(logs[1], _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 4, 2), _HALF)), rtol=0, atol=1e-12)
    assert torch.equal(again[0], logs[1]) and torch.equal(again[1], logs[0])


@pytest.mark.timeout(30)
def test_descend_areas_count_only_present_pixels(monkeypatch):
    """Pixels (0, 0) and (3, 3) each make class 0 win. Level 1 at (2, 2): [0] and [3] pass with 4 pixels each;
    with pixel (3, 2) not present, [3] has 3 and is refined (all present: the tie goes to [0], the first)."""
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(1, 16, dtype=torch.bool)
    present[0, 3 * 4 + 2] = False
    # level 1: quadrants 0 and 3 get 3.5 each; 1 and 2 get 1/2 + 1/3 + 1/2 + 1/3 + 1/3 = 2 ([1] and [1,2] fail)
    level1 = [((0, 0, 4, 4), 3.0), ((0, 0, 2, 2), _HALF), ((2, 2, 4, 4), _HALF)]
    model = _Pixels((0, 0), (3, 3)).eval()
    with torch.inference_mode():
        ev, prep = _evaluator(model, x)
        _script(monkeypatch, {3: [(2, 2), (3, 3)]})
        logs, queries = descend(ev, prep, present, _top1, [(0, 3)], 10, 4, MutantCache())
        want = _blocks(4, 4, *level1, ((2, 2, 4, 4), _HALF + 7 / 6), ((3, 3, 4, 4), _HALF + 3.5))
        torch.testing.assert_close(logs[0], want, rtol=0, atol=1e-12)
        assert queries == [28]
        _script(monkeypatch, {3: [(2, 2), (1, 1)]})
        logs, queries = descend(ev, prep, torch.ones(1, 16, dtype=torch.bool), _top1, [(0, 3)], 10, 4, MutantCache())
        want = _blocks(4, 4, *level1, ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
        torch.testing.assert_close(logs[0], want, rtol=0, atol=1e-12)
        # pixel (0, 0) not present: no mutant passes, the descent ends at level 1 with the map all log(1)
        _script(monkeypatch, {3: [(2, 2)]})
        gone = torch.ones(1, 16, dtype=torch.bool)
        gone[0, 0] = False
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        logs, queries = descend(ev, prep, gone, _top1, [(0, 3)], 10, 4, MutantCache())
    assert queries == [14] and torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.timeout(30)
def test_descend_with_threshold_passes_still_credits_the_top1_mutants(monkeypatch):
    """passes(image, f, top1) picks the mutants that count as passing (here f >= 0.99, which none reaches: the
    descent stops after level 1 and credits nothing); with passes = f > 0.5 every top-1 mutant passes."""
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    seen = []

    def strict(i, f, t):
        seen.append((i, round(f, 6), t))
        return f >= 0.99

    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        _script(monkeypatch, {0: [(2, 2), (1, 1)]})
        logs, queries = descend(ev, prep, torch.ones(1, 16, dtype=torch.bool), strict, [(0, 0)], 10, 4, MutantCache())
    assert queries == [14] and torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))
    p = round(1 / (1 + math.exp(-0.5)), 6)
    assert sorted(seen) == sorted([(0, p, True)] * 7 + [(0, round(1 - p, 6), False)] * 7)


@pytest.mark.timeout(30)
def test_compute_responsibility_sums_iterations_seeded_seed_plus_t(monkeypatch):
    """Two images, iterations 2 from seed 5: descents seeded 5 and 6 (split at (2, 2), then at (0, 2)); the
    map is the sum of both iterations' logs; queries 14 + 4 per image (no mutant repeats across them)."""
    _script(monkeypatch, {5: [(2, 2)], 6: [(0, 2)]})
    x = torch.ones(2, 1, 4, 4, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        maps, queries = compute_responsibility(ev, prep, torch.ones(2, 16, dtype=torch.bool), _top1, 2, 1, 4, 5,
                                               False)
    want = (_blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF))
            + _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 4, 2), _HALF)))
    assert maps.shape == (2, 4, 4) and queries == [18, 18]
    for i in range(2):
        torch.testing.assert_close(maps[i], want, rtol=0, atol=1e-12)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("progress, shown", [(True, True), (False, False), (None, True)])
def test_responsibility_progress_bars(monkeypatch, progress, shown):
    """compute_responsibility: one bar of levels (total: depth; this descent runs 2); auto_responsibility: one
    bar of iterations (total: max_iterations), and no bar per descent inside it."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(3)})
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(1, 16, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        tty = fake_terminal(monkeypatch)
        compute_responsibility(ev, prep, present, _top1, 1, 10, 4, 0, progress)
        text = "".join(tty.text)
        if shown:
            last = tty.last_line()
            assert last.startswith("responsibility:  20%") and " 2/10 [" in last
            assert "level/s" in last or "s/level" in last
        else:
            assert text == ""
        tty.text.clear()
        _, _, info = auto_responsibility(ev, prep, present, _top1, 10, 4, 0, progress, patience=1, min_iterations=1,
                                         max_iterations=5)
    assert info.iterations == [2]
    if shown:
        last = tty.last_line()
        assert last.startswith("responsibility:  40%") and " 2/5 [" in last
        assert "iteration/s" in last or "s/iteration" in last
        assert "level" not in "".join(tty.text)
    else:
        assert "".join(tty.text) == ""


def _hand_ranking_top(score: torch.Tensor, present: torch.Tensor, k: int) -> set:
    """The k top-ranked present features: descending score, ties to the higher index."""
    ids = [j for j in range(score.numel()) if present[j]]
    ids.sort(key=lambda j: (-float(score[j]), -j))
    return set(ids[:k])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("params", [
    {},
    {"patience": 1, "min_dice": 0.8, "max_iterations": 9, "top_fraction": 0.1, "min_iterations": 2},
    {"patience": 3, "min_dice": 0.5, "max_iterations": 12, "top_fraction": 0.05, "min_iterations": 4},
    # K = 1 (at least 1 top pixel); seed 11 is one where K = 2 would stop both images an iteration earlier
    {"patience": 1, "min_dice": 0.5, "max_iterations": 10, "top_fraction": 0.01, "min_iterations": 2, "seed": 11},
])
def test_auto_iterations_follow_the_rule_on_reference_maps(params):
    """Each image's stop, recomputed by hand from the plain transcription's per-iteration maps
    (``overinterp_fast.reference.responsibility``, one iteration seeded seed + t at a time): K = ceil(top_fraction
    x present pixels) top-ranked pixels; Dice with the iteration before; stop after iteration t >= min_iterations
    once it was >= min_dice for `patience` iterations in a row, or after max_iterations. Image 2 has no present
    pixel: no iteration, a zero map."""
    model = _Pixels((2, 3), (5, 5), (6, 1)).eval()
    x = 0.2 + torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[:, 0, 2, 3] = x[:, 0, 5, 5] = x[:, 0, 6, 1] = 0.3
    patience = params.get("patience", AUTO_PATIENCE)
    min_dice = params.get("min_dice", AUTO_DICE)
    max_it = params.get("max_iterations", AUTO_MAX_ITERATIONS)
    frac = params.get("top_fraction", AUTO_TOP_FRACTION)
    min_it = params.get("min_iterations", AUTO_MIN_ITERATIONS)
    present = torch.ones(3, 64, dtype=torch.bool)
    present[1, :5] = False  # 59 present pixels (none of them read by the model)
    present[2] = False
    params = dict(params)
    seed = params.pop("seed", 3)
    with torch.inference_mode():
        ev, prep = _evaluator(model, x)
        maps, queries, info = auto_responsibility(ev, prep, present, _top1, 10, 4, seed, False, **params)
    per_iteration = [of.reference.responsibility(model, x[:2], iterations=1, depth=10, min_box=4, seed=seed + t)
                     for t in range(max_it)]
    assert maps.shape == (3, 8, 8) and maps.dtype == torch.float64
    for i in range(2):
        k = max(1, math.ceil(int(present[i].sum()) * frac))
        total = torch.zeros(8, 8, dtype=torch.float64)
        last, calm, want, ref_queries = None, 0, max_it, 0
        for t in range(max_it):
            total = total + per_iteration[t][i][0]
            ref_queries += per_iteration[t][i][1]
            top = _hand_ranking_top(total.flatten(), present[i], k)
            if last is not None:
                calm = calm + 1 if 2 * len(top & last) / (2 * k) >= min_dice else 0
            last = top
            if t + 1 >= min_it and calm >= patience:
                want = t + 1
                break
        assert info.iterations[i] == want, (i, params)
        torch.testing.assert_close(maps[i], total, rtol=0, atol=1e-12)
        assert 0 < queries[i] <= ref_queries
    assert info.iterations[2] == 0 and queries[2] == 0 and torch.equal(maps[2], torch.zeros(8, 8, dtype=torch.float64))
    assert info.cache_hits > 0


@pytest.mark.timeout(30)
def test_auto_stops_at_min_iterations_and_counts_cache_hits(monkeypatch):
    """Every iteration splits the same way: identical maps, Dice 1 from iteration 2 on; the stop comes at
    max(min_iterations, patience + 1); every later iteration's 28 mutants are cache hits, queries stay 28."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(40, 60)})
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(1, 16, dtype=torch.bool)
    one = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        for kw, runs in [({}, 6), ({"min_iterations": 1, "patience": 1}, 2), ({"min_iterations": 1, "patience": 3}, 4),
                         ({"min_iterations": 3, "patience": 1}, 3), ({"min_iterations": 8, "max_iterations": 5}, 5),
                         ({"min_dice": 1.0}, 6)]:  # Dice exactly 1.0 counts as calm (>=)
            maps, queries, info = auto_responsibility(ev, prep, present, _top1, 10, 4, 40, False, **kw)
            assert info.iterations == [runs], kw
            assert queries == [28] and info.cache_hits == 28 * (runs - 1)
            torch.testing.assert_close(maps[0], runs * one, rtol=0, atol=1e-12)


def test_descend_of_no_descents_is_an_empty_stack_of_maps():
    x = torch.ones(2, 1, 4, 5, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        logs, queries = descend(ev, prep, torch.ones(2, 20, dtype=torch.bool), _top1, [], 10, 4, MutantCache())
    assert logs.shape == (0, 4, 5) and logs.dtype == torch.float64 and queries == [0, 0]


def test_reference_checks_its_options_with_the_same_messages():
    from conftest import make_cnn, make_images

    from overinterp_fast import reference
    model, x = make_cnn(0), make_images(1)
    for kw, message in (({"seed": -1}, "seed must be an int >= 0, got -1"),
                        ({"seed": 1.0}, "seed must be an int >= 0, got 1.0"),
                        ({"iterations": 0}, "iterations must be an int >= 1, got 0"),
                        ({"depth": True}, "depth must be an int >= 1, got True"),
                        ({"min_box": 0}, "min_box must be an int >= 1, got 0")):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            reference.responsibility(model, x, **kw)
