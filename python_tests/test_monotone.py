"""descend(monotone=True): the mutants none of whose supersets passed are taken as failing without a query.

Expected maps and query counts are worked out by hand on 4x4 images with scripted split points; the
ReX-faithful descent (monotone=False) is the reference on random splits of a model whose criterion is
monotone in the pixels kept.
"""
import math

import pytest
import torch

import overinterp_fast as of
from overinterp_fast.responsibility import (_ROUNDS, SUBSETS, SUPERSETS, MutantCache, auto_responsibility,
                                            compute_responsibility, descend)

from test_minimal_sets import PatchReader
from test_mutation_kills_responsibility import _HALF, _REST, _blocks, _evaluator, _Pixels, _script, _top1


class _Signed(torch.nn.Module):
    """Two logits: [sum of weight * pixel over the given ((row, col), weight) + bonus * the product of the
    ``together`` pixels - 0.5, 0] (channel 0)."""

    def __init__(self, *terms, together=(), bonus=0.0):
        super().__init__()
        self.terms, self.together, self.bonus = terms, together, bonus

    def forward(self, x):
        s = sum(wt * x[:, 0, r, c] for (r, c), wt in self.terms) - 0.5
        if self.together:
            s = s + self.bonus * math.prod(x[:, 0, r, c] for r, c in self.together)
        return torch.stack([s, torch.zeros_like(s)], 1)


def _run(model, monotone, seeds, depth=1, min_box=4, present=None, side=4):
    x = torch.ones(1, 1, side, side, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(model.eval(), x)
        cache = MutantCache()
        logs, queries = descend(ev, prep, torch.ones(1, side * side, dtype=torch.bool) if present is None else present,
                                _top1, [(0, s) for s in seeds], depth, min_box, cache, monotone=monotone)
    return logs, queries, cache


def test_supersets_and_rounds_by_hand():
    # SUBSETS in bit order: [0] [1] [0,1] [2] [0,2] [1,2] [0,1,2] [3] [0,3] [1,3] [0,1,3] [2,3] [0,2,3] [1,2,3]
    assert _ROUNDS == [[6, 10, 12, 13], [2, 4, 5, 8, 9, 11], [0, 1, 3, 7]]
    assert SUPERSETS[0] == [2, 4, 6, 8, 10, 12]  # [0] is in [0,1] [0,2] [0,1,2] [0,3] [0,1,3] [0,2,3]
    assert SUPERSETS[5] == [6, 13]  # [1,2] is in [0,1,2] and [1,2,3]
    assert all(SUPERSETS[k] == [] for k in (6, 10, 12, 13))  # the triples: none
    assert sum(len(u) for u in SUPERSETS) == 4 * 6 + 6 * 2


@pytest.mark.timeout(30)
def test_nothing_passes_costs_the_four_triples_only(monkeypatch):
    """Pixel (0, 0), the only one that makes class 0 win, is not present: no triple passes, so no pair or single
    quadrant is scored: 4 queries instead of 14, and the same empty map."""
    gone = torch.ones(1, 16, dtype=torch.bool)
    gone[0, 0] = False
    for monotone, want in ((False, 14), (True, 4)):
        _script(monkeypatch, {3: [(2, 2)]})
        logs, queries, cache = _run(_Pixels((0, 0)), monotone, [3], depth=10, present=gone)
        assert queries == [want] and len(cache.scores) == want
        assert cache.level_queries == [want]  # the first level has no pass: the descent ends there
        assert torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.timeout(30)
def test_and_model_skips_the_one_pair_whose_triples_both_failed(monkeypatch):
    """Class 0 needs pixels (0, 0) and (3, 3) (quadrants 0 and 3 of the split at (2, 2)): the triples [0,1,3] and
    [0,2,3] pass, [0,1,2] and [1,2,3] fail; the pair [1,2] has only failing supersets and is skipped. Every single
    quadrant has a passing triple above it and is scored: 13 queries. [1,2] would have failed: the same map,
    every quadrant credited by the mutants that keep 0 and 3: [0,3] (1/2 each), [0,1,3] and [0,2,3] (1/3 each)."""
    model = _Signed(((0, 0), 0.4), ((3, 3), 0.4))  # both kept: 0.3 > 0; one: -0.1
    maps = {}
    for monotone, want in ((False, 14), (True, 13)):
        _script(monkeypatch, {1: [(2, 2)]})
        logs, queries, cache = _run(model, monotone, [1])
        assert queries == [want]
        assert ((0, (0, 2, 2, 4), (2, 0, 4, 2)) in cache.scores) is not monotone  # the mutant [1,2]
        maps[monotone] = logs[0]
    q03 = 1 + 1 / 2 + 2 / 3  # quadrants 0 and 3: [0,3], [0,1,3], [0,2,3]
    q12 = 1 + 1 / 3  # quadrant 1 ([0,1,3]) and quadrant 2 ([0,2,3])
    want = _blocks(4, 4, ((0, 0, 4, 4), q12), ((0, 0, 2, 2), q03), ((2, 2, 4, 4), q03))
    torch.testing.assert_close(maps[True], want, rtol=0, atol=1e-12)
    torch.testing.assert_close(maps[False], want, rtol=0, atol=1e-12)


@pytest.mark.timeout(30)
def test_a_pass_below_failing_supersets_is_missed(monkeypatch):
    """Of the 14 mutants, class 0 (the class of the whole image) wins only when quadrant 0 is kept alone: pixel
    (0, 0) counts +1, the pixels (0, 3), (3, 0) and (3, 3) of quadrants 1, 2, 3 count -2 each and +6 when all
    three are kept. Every triple fails, so monotone=True scores nothing else (4 queries) and the level has no
    pass: an empty map. ReX's descent scores all 14 and credits quadrant 0 (1/1: per-iteration value 2)."""
    others = ((0, 3), (3, 0), (3, 3))
    model = _Signed(((0, 0), 1.0), *((o, -2.0) for o in others), together=others, bonus=6.0)
    _script(monkeypatch, {5: [(2, 2)]})
    logs, queries, _ = _run(model, False, [5])
    assert queries == [14]
    torch.testing.assert_close(logs[0], _blocks(4, 4, ((0, 0, 4, 4), 1.0), ((0, 0, 2, 2), 2.0)), rtol=0, atol=1e-12)
    _script(monkeypatch, {5: [(2, 2)]})
    logs, queries, _ = _run(model, True, [5])
    assert queries == [4] and torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.timeout(30)
def test_two_levels_by_hand_keep_rex_map_and_tie_break(monkeypatch):
    """_Pixels((0, 0)) is monotone: every mutant keeping quadrant 0 passes, so each single quadrant has a passing
    superset and all 14 are scored, at both levels; the map is ReX's (worked out in
    test_descend_by_hand_on_a_4x4_image), and the refined mutant is [0] although the rounds score it last."""
    _script(monkeypatch, {7: [(2, 2), (1, 1)]})
    logs, queries, cache = _run(_Pixels((0, 0)), True, [7], depth=10)
    want = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
    torch.testing.assert_close(logs[0], want, rtol=0, atol=1e-12)
    # level 1: the 14 mutants of the 4x4 split; level 2: the 14 of the 2x2 box (0, 0, 2, 2) split at (1, 1)
    # (its single-pixel quadrants: min_box 4 stops the descent there, the pixel box has area 1)
    assert queries == [28] and cache.level_queries == [14, 14]


@pytest.mark.timeout(30)
def test_ties_of_the_smallest_pass_go_to_rex_order_not_round_order(monkeypatch):
    """6x6 split at (4, 4): quadrant areas 16, 8, 8, 4. Class 0 wins with pixel (0, 0) (quadrant 0, +0.6) or with
    both (0, 5) and (5, 0) (quadrants 1 and 2, +0.3 each); so [0] and [1,2] both pass with 16 pixels, the
    smallest. ReX takes the first in subset order, [0] (the rounds score [1,2] first): level 2 splits the one
    box (0, 0, 4, 4) at (2, 2), as the script has it, and the maps of both modes are equal."""
    model = _Signed(((0, 0), 0.6), ((0, 5), 0.3), ((5, 0), 0.3))
    maps = {}
    for monotone in (False, True):
        _script(monkeypatch, {2: [(4, 4), (2, 2)]})
        logs, queries, _ = _run(model, monotone, [2], depth=2, side=6)
        maps[monotone] = logs[0]
    # level 1 credits quadrant 0 by [0] (1), [0,1] [0,2] [0,3] (1/2), [0,1,2] [0,1,3] [0,2,3] (1/3)
    assert maps[False][0, 0] > maps[False][5, 5]
    torch.testing.assert_close(maps[True], maps[False], rtol=0, atol=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [0, 11])
def test_monotone_criterion_gives_rex_maps_with_fewer_queries(seed):
    """On a monotone criterion (class 0 wins while 40% of a 6x5 patch is kept) the maps of random descents
    equal ReX's exactly, for fewer or as many queries per image (a level whose triples all fail costs 4, not
    14); in all, strictly fewer."""
    model = PatchReader(slice(3, 9), slice(2, 7), need=0.4).eval()
    x = torch.ones(3, 1, 12, 12, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(model, x)
        present = torch.ones(3, 144, dtype=torch.bool)
        rex, q_rex = compute_responsibility(ev, prep, present, _top1, 4, 10, 2, seed, False)
        ours, q_ours = compute_responsibility(ev, prep, present, _top1, 4, 10, 2, seed, False, monotone=True)
    assert torch.equal(rex, ours)
    assert all(a <= b for a, b in zip(q_ours, q_rex)) and sum(q_ours) < sum(q_rex)


@pytest.mark.timeout(120)
def test_fast_sis_turns_monotone_on_except_for_rex_extraction():
    """The default (monotone=None) is on with refine=True and off with refine=False; the maps of
    responsibility() with the same switch give the same queries."""
    model = PatchReader(slice(3, 9), slice(2, 7), need=0.4).eval()
    x = 0.5 + torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    on, = of.responsibility(model, x, iterations=3, seed=4, monotone=True)
    off, = of.responsibility(model, x, iterations=3, seed=4)
    assert on.queries < off.queries
    r, = of.fast_sis(model, x, method="responsibility", iterations=3, seed=4)
    assert r.queries == on.queries
    r, = of.fast_sis(model, x, method="responsibility", iterations=3, seed=4, refine=False)
    assert r.queries == off.queries
    r, = of.fast_sis(model, x, method="responsibility", iterations=3, seed=4, refine=False, monotone=True)
    assert r.queries == on.queries
    r, = of.fast_sis(model, x, method="responsibility", iterations=3, seed=4, monotone=False)
    assert r.queries == off.queries
    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="monotone must be None, True or False"):
            of.fast_sis(model, x, method="responsibility", monotone=bad)
    with pytest.raises(ValueError, match="monotone must be True or False"):
        of.responsibility(model, x, monotone=None)
    assert math.isfinite(float(on.map.sum()))


@pytest.mark.timeout(30)
def test_every_mutant_is_scored_unless_asked(monkeypatch):
    """descend, compute_responsibility and auto_responsibility score all 14 mutants by default (ReX); with
    monotone=True a level where nothing passes (pixel (0, 0), the only one that counts, not present) costs 4."""
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    gone = torch.ones(1, 16, dtype=torch.bool)
    gone[0, 0] = False
    with torch.inference_mode():
        ev, prep = _evaluator(_Pixels((0, 0)).eval(), x)
        for kw, want in (({}, 14), ({"monotone": True}, 4)):
            _script(monkeypatch, {0: [(2, 2)]})
            _, q = compute_responsibility(ev, prep, gone, _top1, 1, 10, 4, 0, False, **kw)
            assert q == [want]
            _script(monkeypatch, {0: [(2, 2)]})
            _, q, info = auto_responsibility(ev, prep, gone, _top1, 10, 4, 0, False, max_iterations=1,
                                             min_iterations=1, **kw)
            assert q == [want] and info.iterations == [1]
            _script(monkeypatch, {0: [(2, 2)]})
            _, q = descend(ev, prep, gone, _top1, [(0, 0)], 10, 4, MutantCache(), False, **kw)
            assert q == [want]


@pytest.mark.timeout(60)
def test_level_queries_add_up_across_descents_sharing_a_cache():
    """MutantCache.level_queries counts the scored mutants by level, summed over the descents (images,
    iterations) that share the cache, as auto_responsibility shares it: in all, the queries of every call."""
    model = PatchReader(slice(3, 9), slice(2, 7), need=0.4).eval()
    x = torch.ones(2, 1, 12, 12, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = _evaluator(model, x)
        present = torch.ones(2, 144, dtype=torch.bool)
        cache = MutantCache()
        _, q1 = descend(ev, prep, present, _top1, [(0, 1), (1, 1)], 3, 2, cache, monotone=True)
        first = list(cache.level_queries)
        _, q2 = descend(ev, prep, present, _top1, [(0, 2), (1, 2)], 3, 2, cache, monotone=True)
    assert sum(first) == sum(q1) and sum(cache.level_queries) == sum(q1) + sum(q2)
    given = MutantCache()
    with torch.inference_mode():
        _, q3 = compute_responsibility(ev, prep, present, _top1, 2, 3, 2, 1, False, True, given)
    assert sum(q3) > 0 and sum(given.level_queries) == sum(q3) and len(given.scores) == sum(q3)  # the cache given
    assert 1 <= len(first) <= 3 and len(cache.level_queries) <= 3  # depth 3
    assert first[0] >= 2 * 4  # level 0: at least the 4 triples of each image's whole-image split
    assert all(a >= b for a, b in zip(cache.level_queries, first + [0] * 3))
