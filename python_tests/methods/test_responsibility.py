"""Causal responsibility maps and minimal pixel sets (method="responsibility").

descend(monotone=True): the mutants none of whose supersets passed are taken as failing without a query.

Expected maps and query counts are worked out by hand on 4x4 images with scripted split points; the
ReX-faithful descent (monotone=False) is the reference on random splits of a model whose criterion is
monotone in the pixels kept.

Hand-built expectations for responsibility.py's small helpers.

Every expected value is written out by hand here; nothing is computed with the module under test.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import pytest
import torch
from torch import nn
import overinterp_fast as of
from helpers import assert_sets_sufficient, make_cnn, make_images
import math
from overinterp_fast.methods.responsibility import (_ROUNDS, SUBSETS, SUPERSETS, MutantCache, auto_responsibility,
                                            compute_responsibility, descend)
import re
from overinterp_fast.methods.responsibility import SUBSETS, _area, _dice, _split, check_responsibility_options, ranking_positions


class PatchModel(nn.Module):
    """Class 0 wins when at least ~30% of a known patch's evidence is present; nothing else matters."""

    def __init__(self, rows=slice(4, 12), cols=slice(14, 22)):
        super().__init__()
        self.rows, self.cols = rows, cols

    def forward(self, x):
        patch = x[:, 0, self.rows, self.cols]
        s = patch.flatten(1).sum(1) - 0.3 * patch[0].numel()
        return torch.stack([s, torch.zeros_like(s)], 1)


def patch_images(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 0.5 + torch.rand(n, 3, 24, 32, generator=g)


def test_planted_evidence_mps_inside_the_patch():
    model = PatchModel().eval()
    x = patch_images()
    res = of.fast_sis(model, x, method="responsibility",
                      options=of.MinimalPixelSetOptions(iterations=20, refine=False))  # ReX's settings
    inside = torch.zeros(24, 32, dtype=torch.bool)
    inside[model.rows, model.cols] = True
    for r in res:
        assert r.sis is not None and r.mask.any()
        assert not (r.mask & ~inside).any(), "MPS pixels outside the planted patch"
        assert r.queries > 0 and r.order.numel() == 24 * 32


def test_every_mps_restores_the_top1_class():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(4, h=12, w=12, seed=4, dtype=torch.float32)
    res = of.fast_sis(model, images, method="responsibility", collection=True,
                      options=of.MinimalPixelSetOptions(iterations=5, refine=False))
    assert assert_sets_sufficient(model, images, res, criterion="top1", rel=1e-5) == sum(len(r.collection) for r in res)
    for r in res:
        for c in r.collection:  # steps of 10 pixels, or all that the round had
            assert c.sis.numel() % 10 == 0 or c.sis.numel() == c.order.numel()


def test_deterministic_for_a_seed_and_batching_invariant():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    a = of.responsibility(model, images, iterations=4, seed=3)
    b = of.responsibility(model, images, iterations=4, seed=3, batch_size=7)
    c = of.responsibility(model, images, iterations=4, seed=4)
    alone = of.responsibility(model, images[1:2], iterations=4, seed=3)
    for x, y in zip(a, b):
        assert torch.equal(x.map, y.map) and x.queries == y.queries
    assert torch.equal(alone[0].map, a[1].map)
    assert any(not torch.equal(x.map, y.map) for x, y in zip(a, c))
    assert all(m.map.shape == (12, 12) and m.map.dtype == torch.float64 for m in a)


def test_batched_descent_equals_the_plain_transcription():
    """All iterations of all images in one batch per level (duplicate mutants scored once) give
    the map of ReX's loop run one image, one iteration, one box at a time."""
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    fast = of.responsibility(model, images, iterations=6, seed=2, min_box=4)
    plain = of.reference.responsibility(model, images, iterations=6, seed=2, min_box=4)
    for a, (ref_map, ref_queries) in zip(fast, plain):
        torch.testing.assert_close(a.map, ref_map, rtol=0, atol=1e-12)
        assert 0 < a.queries <= ref_queries
    assert sum(a.queries for a in fast) < sum(q for _, q in plain), "no duplicate mutant was shared"
    assert any(bool((m.map != m.map.flatten()[0]).any()) for m in fast), "flat maps test nothing"
    with pytest.raises(ValueError, match="iterations"):
        of.reference.responsibility(model, images, iterations=0)


def test_tiny_image_below_the_minimum_box():
    x = 0.5 + torch.rand(2, 1, 3, 3)
    model = PatchModel(slice(0, 3), slice(0, 3)).eval()
    maps = of.responsibility(model, x, iterations=20)
    assert all(m.queries == 0 and torch.equal(m.map, torch.zeros(3, 3, dtype=torch.float64)) for m in maps)
    res = of.fast_sis(model, x, method="responsibility")
    assert all(r.sis is not None for r in res)


def test_mps_that_needs_the_whole_image():
    class AllPixels(nn.Module):
        def forward(self, t):
            s = t.flatten(1).sum(1)
            full = 3 * 12 * 12 * 1.0
            return torch.stack([s - (full - 0.5), torch.zeros_like(s)], 1)

    x = torch.ones(1, 3, 12, 12)
    res = of.fast_sis(AllPixels().eval(), x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3))
    assert res[0].sis.numel() == 144 and res[0].mask.all()


def test_collection_gives_disjoint_sets():
    model = PatchModel().eval()
    x = patch_images(2)
    res = of.fast_sis(model, x, method="responsibility", collection=True,
                      options=of.MinimalPixelSetOptions(iterations=5))
    for r in res:
        assert len(r.collection) >= 2
        seen = torch.zeros(24, 32, dtype=torch.bool)
        for c in r.collection:
            assert not (c.mask & seen).any()
            assert c.order.numel() == 24 * 32 - int(seen.sum())  # each round ranks only what is left
            seen |= c.mask
    assert assert_sets_sufficient(model, x, res, criterion="top1", rel=1e-5) == sum(len(r.collection) for r in res)


def test_threshold_criterion_and_bad_options():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(2, h=12, w=12, seed=4, dtype=torch.float32)
    with torch.no_grad():
        f = torch.softmax(model(images), 1).max(1).values
    res = of.fast_sis(model, images, 0.9 * f, method="responsibility",
                      options=of.MinimalPixelSetOptions(criterion="threshold", iterations=3))
    assert all(r.sis_score >= r.threshold for r in res)
    assert assert_sets_sufficient(model, images, res, rel=1e-5) == 2
    with pytest.raises(ValueError, match="criterion"):
        of.fast_sis(model, images, method="responsibility", options=of.MinimalPixelSetOptions(criterion="top5"))
    with pytest.raises(ValueError, match="iterations"):
        of.responsibility(model, images, iterations=0)
    with pytest.raises(ValueError, match="default pixel features"):
        of.fast_sis(model, images, method="responsibility", feature_mask=torch.zeros(12, 12, dtype=torch.int64))


def test_sufficient_subset_equals_a_sequential_scan():
    model = make_cnn(1)
    images = make_images(3, seed=9)
    g = torch.Generator().manual_seed(0)
    ranking = torch.randint(0, 5, (3, 5, 5), generator=g).double()  # ties: higher pixel index first
    with torch.no_grad():
        f = torch.softmax(model(images), 1).max(1).values
    tau = (0.9 * f).tolist()
    res = of.sufficient_subset(model, images, ranking, tau, refine=False)
    for i, r in enumerate(res):
        keys = [(-float(ranking[i].flatten()[j]), -j) for j in range(25)]
        order = [j for _, j in sorted(zip(keys, range(25)))]
        assert r.order.tolist() == order
        want = None
        for size in range(1, 26):
            keep = torch.zeros(25, dtype=torch.bool)
            keep[order[:size]] = True
            x = torch.where(keep.view(5, 5), images[i], torch.zeros((), dtype=images.dtype))
            with torch.no_grad():
                if float(torch.softmax(model(x[None]), 1)[0, r.target]) >= tau[i]:
                    want = order[:size]
                    break
        assert r.sis.tolist() == want


# ----------------------------------------------------------------------------------------------------
# descend(monotone=True): the mutants none of whose supersets passed are taken as failing without a query.
# ----------------------------------------------------------------------------------------------------


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
        ev, prep = responsibility_evaluator(model.eval(), x)
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
        ev, prep = responsibility_evaluator(model, x)
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
    r, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, seed=4))
    assert r.queries == on.queries
    r, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, seed=4,
                                                                                          refine=False))
    assert r.queries == off.queries
    r, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, seed=4,
                                                                                          refine=False, monotone=True))
    assert r.queries == on.queries
    r, = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3, seed=4,
                                                                                          monotone=False))
    assert r.queries == off.queries
    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="monotone must be None, True or False"):
            of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(monotone=bad))
    # plain maps: monotone=None ("auto") is off, as ReX (one default per option name)
    auto, = of.responsibility(model, x, iterations=3, seed=4, monotone=None)
    assert auto.queries == off.queries and torch.equal(auto.map, off.map)
    with pytest.raises(ValueError, match="monotone must be None, True or False"):
        of.responsibility(model, x, monotone=1, iterations=20)
    assert math.isfinite(float(on.map.sum()))


@pytest.mark.timeout(30)
def test_every_mutant_is_scored_unless_asked(monkeypatch):
    """descend, compute_responsibility and auto_responsibility score all 14 mutants by default (ReX); with
    monotone=True a level where nothing passes (pixel (0, 0), the only one that counts, not present) costs 4."""
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    gone = torch.ones(1, 16, dtype=torch.bool)
    gone[0, 0] = False
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
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
        ev, prep = responsibility_evaluator(model, x)
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


# ----------------------------------------------------------------------------------------------------
# Hand-built expectations for responsibility.py's small helpers (added for mutmut survivors; see docs/notes/mutation-testing.md).
# ----------------------------------------------------------------------------------------------------


def _b(*bits):
    return torch.tensor([bool(v) for v in bits])


@pytest.mark.mutation
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


@pytest.mark.mutation
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


@pytest.mark.mutation
def test_split_and_area_by_hand():
    # box rows 2..7, cols 1..9; split at row 4 (drawn from [2, 8)), col 6 (drawn from [1, 10))
    quads = _split((2, 1, 7, 9), _FixedRng(((2, 8), 4), ((1, 10), 6)))
    assert quads == [(2, 1, 4, 6), (2, 6, 4, 9), (4, 1, 7, 6), (4, 6, 7, 9)]
    assert [_area(q) for q in quads] == [10, 6, 15, 9]
    assert _area((3, 3, 3, 8)) == 0 and _area((5, 2, 3, 4)) == 0 and _area((0, 5, 2, 1)) == 0
    assert _area((0, 0, 1, 1)) == 1


@pytest.mark.mutation
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


@pytest.mark.mutation
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
# from the algorithm (docs: algorithms.md, Causal responsibility and minimal pixel sets):
# the per-iteration map starts at 1; each mutant predicted as the target adds 1/k to
# each of its k kept quadrants; the passing mutant of the smallest unmasked area (ties: the first) is refined.

import math  # noqa: E402

import numpy as np  # noqa: E402

import overinterp_fast as of  # noqa: E402
from overinterp_fast import api  # noqa: E402
from overinterp_fast.runtime.batching import CandidateEvaluator  # noqa: E402
from overinterp_fast.runtime.model import initial_predictions  # noqa: E402
from overinterp_fast.methods.responsibility import (AUTO_DICE, AUTO_MAX_ITERATIONS, AUTO_MIN_ITERATIONS,  # noqa: E402
                                            AUTO_PATIENCE, AUTO_TOP_FRACTION, MutantCache, auto_responsibility,
                                            compute_responsibility, descend)

from helpers import fake_terminal  # noqa: E402
from helpers import PatchReader, responsibility_evaluator, top1 as _top1  # noqa: F811


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


@pytest.mark.mutation
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
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
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


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_descend_empty_quadrants_share_passes_and_images_count_their_own_queries(monkeypatch):
    """Image 1 splits at (0, 2): quadrants 0 and 1 are empty, so the 14 mutants show only 4 distinct rectangle
    sets ({}, {q2}, {q3}, {q2, q3}): 4 queries, 10 hits. Its weights still divide by k counting the empty
    quadrants. The same descents again with the same cache: no query, every mutant a cache hit."""
    _script(monkeypatch, {0: [(2, 2)], 1: [(0, 2)]})
    x = torch.ones(2, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(2, 16, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        cache = MutantCache()
        logs, queries = descend(ev, prep, present, _top1, [(0, 0), (1, 1)], 1, 4, cache)
        assert queries == [14, 4] and cache.hits == 10 and len(cache.scores) == 18  # 10 shared passes
        _script(monkeypatch, {0: [(2, 2)], 1: [(0, 2)]})
        again, q2 = descend(ev, prep, present, _top1, [(1, 1), (0, 0)], 1, 4, cache)
    assert q2 == [0, 0] and cache.hits == 10 + 28
    torch.testing.assert_close(logs[0], _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF)), rtol=0, atol=1e-12)
    # columns 0-1 (quadrant 2) are kept by [2], [0,2], [1,2], [0,1,2], [2,3], [0,2,3], [1,2,3]: the same 3.5 and 7/6
    torch.testing.assert_close(logs[1], _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 4, 2), _HALF)), rtol=0, atol=1e-12)
    assert torch.equal(again[0], logs[1]) and torch.equal(again[1], logs[0])


@pytest.mark.mutation
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
        ev, prep = responsibility_evaluator(model, x)
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
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        logs, queries = descend(ev, prep, gone, _top1, [(0, 3)], 10, 4, MutantCache())
    assert queries == [14] and torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))


@pytest.mark.mutation
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
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        _script(monkeypatch, {0: [(2, 2), (1, 1)]})
        logs, queries = descend(ev, prep, torch.ones(1, 16, dtype=torch.bool), strict, [(0, 0)], 10, 4, MutantCache())
    assert queries == [14] and torch.equal(logs[0], torch.zeros(4, 4, dtype=torch.float64))
    p = round(1 / (1 + math.exp(-0.5)), 6)
    assert sorted(seen) == sorted([(0, p, True)] * 7 + [(0, round(1 - p, 6), False)] * 7)


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_compute_responsibility_sums_iterations_seeded_seed_plus_t(monkeypatch):
    """Two images, iterations 2 from seed 5: descents seeded 5 and 6 (split at (2, 2), then at (0, 2)); the
    map is the sum of both iterations' logs; queries 14 + 4 per image (no mutant repeats across them)."""
    _script(monkeypatch, {5: [(2, 2)], 6: [(0, 2)]})
    x = torch.ones(2, 1, 4, 4, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        maps, queries = compute_responsibility(ev, prep, torch.ones(2, 16, dtype=torch.bool), _top1, 2, 1, 4, 5,
                                               False)
    want = (_blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF))
            + _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 4, 2), _HALF)))
    assert maps.shape == (2, 4, 4) and queries == [18, 18]
    for i in range(2):
        torch.testing.assert_close(maps[i], want, rtol=0, atol=1e-12)


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("progress, shown", [(True, True), (False, False), (None, True)])
def test_responsibility_progress_bars(monkeypatch, progress, shown):
    """compute_responsibility: one bar of levels (total: depth; this descent runs 2); auto_responsibility: one
    bar of iterations (total: max_iterations), and no bar per descent inside it."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(3)})
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(1, 16, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
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


@pytest.mark.mutation
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
    (``overinterp_fast.methods.reference.responsibility``, one iteration seeded seed + t at a time): K = ceil(top_fraction
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
        ev, prep = responsibility_evaluator(model, x)
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


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_auto_stops_at_min_iterations_and_counts_cache_hits(monkeypatch):
    """Every iteration splits the same way: identical maps, Dice 1 from iteration 2 on; the stop comes at
    max(min_iterations, patience + 1); every later iteration's 28 mutants are cache hits, queries stay 28."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(40, 60)})
    x = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    present = torch.ones(1, 16, dtype=torch.bool)
    one = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        for kw, runs in [({}, 6), ({"min_iterations": 1, "patience": 1}, 2), ({"min_iterations": 1, "patience": 3}, 4),
                         ({"min_iterations": 3, "patience": 1}, 3), ({"min_iterations": 8, "max_iterations": 5}, 5),
                         ({"min_dice": 1.0}, 6)]:  # Dice exactly 1.0 counts as calm (>=)
            maps, queries, info = auto_responsibility(ev, prep, present, _top1, 10, 4, 40, False, **kw)
            assert info.iterations == [runs], kw
            assert queries == [28] and info.cache_hits == 28 * (runs - 1)
            torch.testing.assert_close(maps[0], runs * one, rtol=0, atol=1e-12)


@pytest.mark.mutation
def test_descend_of_no_descents_is_an_empty_stack_of_maps():
    x = torch.ones(2, 1, 4, 5, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        logs, queries = descend(ev, prep, torch.ones(2, 20, dtype=torch.bool), _top1, [], 10, 4, MutantCache())
    assert logs.shape == (0, 4, 5) and logs.dtype == torch.float64 and queries == [0, 0]


@pytest.mark.mutation
def test_reference_checks_its_options_with_the_same_messages():
    from helpers import make_cnn, make_images

    from overinterp_fast.methods import reference
    model, x = make_cnn(0), make_images(1)
    for kw, message in (({"seed": -1}, "seed must be an int >= 0, got -1"),
                        ({"seed": 1.0}, "seed must be an int >= 0, got 1.0"),
                        ({"iterations": 0}, "iterations must be an int >= 1, got 0"),
                        ({"depth": True}, "depth must be an int >= 1, got True"),
                        ({"min_box": 0}, "min_box must be an int >= 1, got 0")):
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            reference.responsibility(model, x, **kw)


# ----------------------------------------------------------------------------------------------------
# Host reads: the descents read device values only through runtime.sync.to_host, once per scoring round (one
# round per level; three with monotone=True: triples, pairs, single quadrants), however many mutants the round has.
# ----------------------------------------------------------------------------------------------------

from overinterp_fast.runtime import sync  # noqa: E402
from helpers import strict_sync, sync_errors  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("monotone, per_level", [(False, 1), (True, 3)])
@pytest.mark.parametrize("images, seeds", [(1, [7]), (3, [7, 8])])
def test_descent_reads_once_per_round_however_many_mutants(monkeypatch, monotone, per_level, images, seeds):
    """Every descent splits at (2, 2), then its quadrant 0 at (1, 1) (test_descend_by_hand_on_a_4x4_image): two
    levels of 14 mutants per image, each scored (every subset has a superset keeping pixel (0, 0), which passes).
    One descent or six (3 images x 2 seeds, 42 mutants per level): the same reads, the round's scores once per
    round: 2 levels x 1 round, or x 3 rounds with monotone=True. Nothing else is read."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in seeds})
    x = torch.ones(images, 1, 4, 4, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        with sync.counting() as reads:
            logs, queries = descend(ev, prep, torch.ones(images, 16, dtype=torch.bool), _top1,
                                    [(i, s) for i in range(images) for s in seeds], 10, 4, MutantCache(),
                                    monotone=monotone)
    assert queries == [28] * images  # a second seed of an image repeats its mutants: cache hits, no query
    assert reads.by_label == {"mutants": 2 * per_level} and reads.count == 2 * per_level
    assert reads.tensors == 2 * per_level  # one tensor per read: the round's scores [m, 3]
    want = _blocks(4, 4, ((0, 0, 4, 4), _REST), ((0, 0, 2, 2), _HALF + 7 / 6), ((0, 0, 1, 1), _HALF + 3.5))
    for d in range(len(logs)):
        torch.testing.assert_close(logs[d], want, rtol=0, atol=1e-12)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kw, runs, blocks", [({}, 6, 1), ({"min_dice": 1.5}, 20, 8),
                                              ({"min_dice": 1.5, "patience": 3, "max_iterations": 13}, 13, 4)])
def test_auto_reads_once_to_start_and_once_per_block(monkeypatch, kw, runs, blocks):
    """iterations="auto" with the same splits every iteration (test_auto_stops_at_min_iterations_and_counts_cache_hits).
    The iterations that cannot stop an image run together: the first 6 (min_iterations; patience 2 needs 3), then
    `patience` at a time while no Dice is calm (min_dice above 1): 6, 8, ..., 20 (8 blocks), or 6, 9, 12, 13 (the
    last cut at max_iterations). Reads: the allowed pixels once, the Dice of every image once per block, and the
    mutants' scores of the 2 levels of the first block (the later ones are all cache hits: nothing to read)."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(40, 60)})
    x = torch.ones(2, 1, 4, 4, dtype=torch.float64)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), x)
        with sync.counting() as reads:
            _, queries, info = auto_responsibility(ev, prep, torch.ones(2, 16, dtype=torch.bool), _top1, 10, 4, 40,
                                                   False, **kw)
    assert info.iterations == [runs, runs] and queries == [28, 28] and info.cache_hits == 2 * 28 * (runs - 1)
    assert reads.by_label == {"auto start": 1, "auto stop": blocks, "mutants": 2}


def test_auto_groups_keep_each_block_of_log_maps_under_the_budget(monkeypatch):
    """Images join a group while its log maps (need x pixels x 8 bytes) fit AUTO_BLOCK_BYTES; an image over it
    alone still gets a group of its own."""
    from overinterp_fast.methods import responsibility as resp

    need = {0: 6, 3: 2, 5: 1, 7: 30}  # 480, 160, 80 and 2400 bytes at 10 pixels
    monkeypatch.setattr(resp, "AUTO_BLOCK_BYTES", 720)
    assert resp._auto_groups([0, 3, 5, 7], need, 10) == [[0, 3, 5], [7]]  # 720 fits exactly
    monkeypatch.setattr(resp, "AUTO_BLOCK_BYTES", 719)
    assert resp._auto_groups([0, 3, 5, 7], need, 10) == [[0, 3], [5], [7]]
    assert resp._auto_groups([5, 3], need, 10) == [[5, 3]]
    assert resp._auto_groups([], need, 10) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("budget", [1, 6 * 12 * 16 * 8 - 1])
def test_auto_in_groups_equals_auto_in_one_group(monkeypatch, budget):
    """With a budget too small for any two images' log maps (1 byte), or for one image's first six (12 x 16
    float64 maps, less a byte), images descend in groups of their own: the same maps, queries and stops as
    all images together, and as each image run alone; one Dice read per block and group, so with 1 byte as
    many as the single-image runs read together."""
    from overinterp_fast.methods import responsibility as resp

    model = PatchReader(slice(4, 8), slice(6, 12)).eval()
    x = 0.5 + torch.rand(3, 3, 12, 16, generator=torch.Generator().manual_seed(2))
    present = torch.ones(3, 12 * 16, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
        with sync.counting() as together:
            want = auto_responsibility(ev, prep, present, _top1, 10, 10, 0, False)
        monkeypatch.setattr(resp, "AUTO_BLOCK_BYTES", budget)
        with sync.counting() as apart:
            got = auto_responsibility(ev, prep, present, _top1, 10, 10, 0, False)
        alone_reads = 0
        for i in range(3):
            ev_i, prep_i = responsibility_evaluator(model, x[i:i + 1])
            with sync.counting() as reads:
                maps, q, info = auto_responsibility(ev_i, prep_i, present[i:i + 1], _top1, 10, 10, 0, False)
            alone_reads += reads.by_label["auto stop"]
            assert torch.equal(maps[0], want[0][i]) and q == [want[1][i]] and info.iterations == [want[2].iterations[i]]
    assert torch.equal(got[0], want[0]) and got[1] == want[1] and got[2].iterations == want[2].iterations
    assert len(set(want[2].iterations)) > 1  # the images stop at different iterations
    assert apart.by_label["auto stop"] > together.by_label["auto stop"] and together.by_label["auto stop"] > 1
    if budget == 1:
        assert apart.by_label["auto stop"] == alone_reads


@pytest.mark.timeout(30)
def test_auto_runs_an_image_with_a_single_allowed_pixel(monkeypatch):
    """An image with one allowed pixel descends (K = 1 top pixel, Dice 1 from the second iteration on: it stops
    at 6); one with none does not."""
    _script(monkeypatch, {s: [(2, 2), (1, 1)] for s in range(40, 60)})
    present = torch.zeros(2, 16, dtype=torch.bool)
    present[0, 0] = True
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(_Pixels((0, 0)).eval(), torch.ones(2, 1, 4, 4, dtype=torch.float64))
        maps, queries, info = auto_responsibility(ev, prep, present, _top1, 10, 4, 40, False)
    assert info.iterations == [6, 0] and queries[0] > 0 == queries[1] and maps[0].abs().sum() > 0 == maps[1].abs().sum()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("monotone", [False, True])
def test_descents_wait_for_the_device_only_in_to_host_and_the_ops_checks(monkeypatch, device, monotone):
    """On CUDA, with torch.cuda.set_sync_debug_mode("error"), any call that waits for the GPU raises, except the
    reads through to_host: random descents of 3 images x 4 iterations run through, with the maps and queries of
    the CPU. The paintings (rect_fill) and the candidates (mask_apply) are checked on the host, where they are
    made, and wait for nothing; reads at most 3 per level (depth 10), far fewer than the mutants (counted on a
    second run: the first captures the CUDA graphs of its batch shapes, each checked with one read)."""
    model = PatchReader(slice(3, 9), slice(2, 7), need=0.4).eval()
    x = torch.ones(3, 1, 12, 12, dtype=torch.float64)
    present = torch.ones(3, 144, dtype=torch.bool)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
        want, want_q = compute_responsibility(ev, prep, present, _top1, 4, 10, 2, 5, False, monotone)
        ev, prep = responsibility_evaluator(model.to(device), x.to(device))
        present = present.to(device)
        # once first: on CUDA each new batch shape captures a CUDA graph, checked with one read (runtime.graphs)
        compute_responsibility(ev, prep, present, _top1, 4, 10, 2, 5, False, monotone)
        calls = strict_sync(monkeypatch, device)
        with sync_errors(device):
            maps, queries = compute_responsibility(ev, prep, present, _top1, 4, 10, 2, 5, False, monotone)
    assert maps.device.type == device and queries == want_q
    torch.testing.assert_close(maps.cpu(), want, rtol=0, atol=1e-12)
    assert 0 < calls.count("to_host") <= (3 if monotone else 1) * 10 < sum(queries)
    assert set(calls) == {"to_host"}  # the mutants' images are checked on the host, before their upload


@pytest.mark.parametrize("owner", [[0, 3], [-1, 0]])
def test_paintings_check_their_owners_on_the_host(owner):
    """The paintings skip rect_fill's own owner check: _rect_cover checks the owners where it groups them, with
    the op's error, so a bad owner still never reaches the kernel."""
    from overinterp_fast.methods.responsibility import _rect_cover
    from overinterp_fast.runtime.batching import ChunkRunner

    runner = ChunkRunner(4, torch.device("cpu"))
    bad = min(owner) if min(owner) < 0 else max(owner)
    with pytest.raises(RuntimeError, match=rf"rect_fill: owner {bad} out of range \[0, 3\)"):
        _rect_cover(runner, [(0, 0, 1, 1), (1, 1, 2, 2)], owner, None, 3, 4, 4, torch.device("cpu"),
                    lambda sl, cover: cover)
    got = _rect_cover(runner, [(0, 0, 1, 1), (1, 1, 2, 2)], [2, 0], None, 3, 4, 4, torch.device("cpu"),
                      lambda sl, cover: cover)
    maps = torch.cat(got)
    assert maps.shape == (3, 4, 4) and maps[2, 0, 0] == 1 and maps[0, 1, 1] == 1 and int(maps.sum()) == 2


@pytest.mark.parametrize("images", [[0, 2], [-1, 1]])
def test_mutants_images_are_checked_before_any_painting(images):
    """The painted mutants' images skip mask_apply's own check: the descent checks them on the host before their
    upload (_score_keys), score_painted once per call on a tensor, both with the op's error."""
    from overinterp_fast.methods.responsibility import _score_keys, score_painted

    with torch.inference_mode():
        ev, prep = responsibility_evaluator(PatchReader(slice(0, 2), slice(0, 2), need=0.5).eval(),
                                            torch.ones(2, 1, 4, 4, dtype=torch.float64))
    present = torch.ones(2, 16, dtype=torch.bool)
    rects, owner = [(0, 0, 2, 2), (1, 1, 3, 3)], [0, 1]
    bad = min(images) if min(images) < 0 else max(images)
    message = rf"mask_apply: cand_image {bad} out of range \[0, 2\)"
    cache = MutantCache()
    with pytest.raises(RuntimeError, match=message):
        _score_keys(ev, rects, owner, images, [("a",), ("b",)], present, cache, 4, 4, torch.device("cpu"))
    with pytest.raises(RuntimeError, match=message):
        score_painted(ev, rects, owner, torch.tensor(images), present, 4, 4)
    assert cache.scores == {}
    _score_keys(ev, rects, owner, [1, 0], [("a",), ("b",)], present, cache, 4, 4, torch.device("cpu"))
    assert [cache.scores[k][2] for k in (("a",), ("b",))] == [4, 4]  # pixels kept by each mutant
