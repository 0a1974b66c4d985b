"""Minimal pixel sets that are minimal (refine=True), fewer queries (iterations="auto"), chunked rect_fill.

Hand-built expectations for minimal.py's pruning: a stand-in evaluator (helpers.RuleEvaluator) scores each candidate
with a rule written here and records every candidate set; a wrapper records how many candidates each call (each
round) held. The expected candidate sets, rounds, results and query counts below were traced by hand from the
algorithm as minimal.py's docstring states it: a greedy pass in the given order; adaptive blocks (a passing block
doubles B, a failing one halves it, and a failing block resets W to 1); at B = 1, W single removals side by side
(the first passing one is taken, W doubles while all fail; a taken single sets B = 2, W = 1); each pass starts at
B = W = 1; after a pass, the kept features whose failing removal was seen before a later removal are tested again,
until a pass removes nothing; one batch per round across all rows; a per-row budget. Nothing here is computed with
the module under test.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import math
import warnings

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.ops import kernels as _ops
from overinterp_fast.methods.minimal import prune_to_minimal
from overinterp_fast.methods.prefix import boundary_prefix
from overinterp_fast.methods.responsibility import (AUTO_DICE, AUTO_MIN_ITERATIONS, AUTO_PATIENCE, AUTO_TOP_FRACTION,
                                                    MutantCache, auto_responsibility, compute_responsibility, descend,
                                                    ranking_positions)
from helpers import PatchReader, RuleEvaluator, assert_one_minimal, make_cnn, make_images, responsibility_evaluator
from helpers import top1, top1_on








@pytest.mark.parametrize("rows,cols", [
    (slice(4, 12), slice(14, 22)),  # 8 x 8 in the middle
    (slice(0, 5), slice(0, 5)),  # 5 x 5 in a corner
    (slice(18, 24), slice(20, 32)),  # 6 x 12 at the bottom right edge
    (slice(10, 13), slice(3, 6)),  # 3 x 3, smaller than ReX's 10-pixel steps
])
def test_planted_patch_mps_is_inside_and_one_minimal(rows, cols):
    model = PatchReader(rows, cols).eval()
    g = torch.Generator().manual_seed(rows.start * 31 + cols.start)
    x = 0.5 + torch.rand(3, 3, 24, 32, generator=g)
    res = of.fast_sis(model, x, method="responsibility")  # the defaults: iterations=8, monotone, refine=True, refine_budget="auto" (these sets are small: pruned fully)
    inside = torch.zeros(24, 32, dtype=torch.bool)
    inside[rows, cols] = True
    for img, r in zip(x, res):
        assert r.sis is not None and r.target == 0
        assert (r.mask & inside).sum() >= 0.95 * r.mask.sum()
        assert_one_minimal(model, img, r.mask, r.target)
        assert r.minimal is True  # the default budget covers these small sets
        assert r.size <= r.size_before_refine and r.refine_queries > 0 and r.extraction_queries > 0
        assert r.total_queries == r.queries + r.extraction_queries + r.refine_queries


def test_refine_false_is_rex_extraction_and_refine_true_shrinks_it():
    model = PatchReader(slice(4, 12), slice(14, 22)).eval()
    x = 0.5 + torch.rand(2, 3, 24, 32, generator=torch.Generator().manual_seed(5))
    rex = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=6, refine=False))
    ours = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=6))
    for img, a, b in zip(x, rex, ours):
        assert a.size % 10 == 0 and a.size_before_refine is None and a.refine_queries is None
        assert torch.equal(a.order, b.order)  # the same ranking
        assert b.size < a.size
        assert_one_minimal(model, img, b.mask, b.target)


def test_refine_budget_stops_the_pruning_and_says_so():
    """A large planted patch: certifying 1-minimality takes more queries than a small budget allows. With the
    budget the set still passes, is no larger than the boundary prefix and is marked not minimal; without a
    budget it is 1-minimal (checked pixel by pixel) and marked so."""
    rows, cols = slice(2, 14), slice(4, 20)
    model = PatchReader(rows, cols, need=0.5).eval()
    x = 0.5 + torch.rand(2, 3, 16, 24, generator=torch.Generator().manual_seed(11))
    kw = dict(method="responsibility")
    capped = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=3, refine_budget=7))
    free = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=3, refine_budget=None))
    none = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=3, refine_budget=0))
    boundary = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=3, refine="boundary"))
    for img, c, f, z, b in zip(x, capped, free, none, boundary):
        assert b.minimal is None and f.size > 7  # more pixels than the capped run may test
        assert c.minimal is False and c.refine_queries <= 7 and top1_on(model, img, c.mask) == c.target
        assert c.size <= c.size_before_refine == b.size
        assert z.minimal is False and z.refine_queries == 0 and torch.equal(z.mask, b.mask)
        assert f.minimal is True and f.refine_queries > 7
        assert_one_minimal(model, img, f.mask, f.target)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="refine_budget"):
            of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=3, refine_budget=bad))


class CountWindows(nn.Module):
    """Class 0 wins when the number of unmasked pixels lies in [30, 40) or is at least 200: a criterion far
    from monotone in the prefix size, whatever the ranking."""

    def forward(self, x):
        c = (x[:, 0] != 0).flatten(1).sum(1)
        s = (((c >= 30) & (c < 40)) | (c >= 200)).float() * 2 - 1
        # a third class far behind: the margins stay +-1, and the rows are not probabilities
        return torch.stack([s, torch.zeros_like(s), torch.full_like(s, -10.0)], 1)


def test_refine_true_scans_in_steps_of_ten_like_rex_then_bisects():
    """refine=True finds the first passing window in steps of 10 (ReX's extraction; here sizes 30..39) and the
    exact boundary inside the last step (30); an exponential search (refine="boundary") jumps over that window
    (10, 20, 40, 80, 160 fail, 320 passes) and bisects down to 200."""
    model = CountWindows().eval()
    x = 0.5 + torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    kw = dict(method="responsibility")
    scanned = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine_budget=0,
                                                                            prefix_search="scan"))
    # the default: prefix_search="guided"
    guided = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine_budget=0))
    rex = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine=False))
    jump = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine="boundary"))
    for s, g, r, j in zip(scanned, guided, rex, jump):
        assert r.size == 30 and s.size_before_refine == s.size == 30 and j.size == 200
        assert torch.equal(s.sis, s.order[:30]) and s.minimal is False
        assert g.size_before_refine == g.size == 30 and torch.equal(g.sis, s.sis)
        # the guided search (margins +-1; sizes 10..250, 256: indices 0..25, the coarse scan only the last):
        # 0 px and 256 (passes); 130; 60 and 190 (sigma^2 = 3 * 4 / 26: (-1, 12) crosses with p = 0.72); 30 (passes),
        # 90, 160, 220; then below 30: 10, 20. 11 queries, and the bisection of (20, 30] as above
        assert g.extraction_queries == 11 + 4
        # the scan: sizes 10, 20 (first round of 2 on a CPU), then 30, 40, 50, 60 (a round of 4); the bisection
        # of (20, 30]: 25, 27, 28, 29 (all fail)
        assert s.extraction_queries == 6 + 4
    pruned = of.fast_sis(model, x, **kw, options=of.MinimalPixelSetOptions(iterations=2, refine_budget=None))
    for img, r in zip(x, pruned):
        assert r.size == 30 and r.minimal is True  # every single removal leaves 29 pixels: fails
        assert_one_minimal(model, img, r.mask, r.target)


def test_refine_boundary_is_the_exact_boundary_prefix():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    res = of.fast_sis(model, images, method="responsibility", options=of.MinimalPixelSetOptions(iterations=3,
                                                                                                refine="boundary"))
    for img, r in zip(images, res):
        k = r.size
        assert k == r.size_before_refine and r.refine_queries == 0 and torch.equal(r.sis, r.order[:k])
        prefix = lambda m: torch.isin(torch.arange(144), r.order[:m]).view(12, 12)  # noqa: E731
        assert top1_on(model, img, prefix(k)) == r.target
        assert k == 1 or top1_on(model, img, prefix(k - 1)) != r.target
    with pytest.raises(ValueError, match="refine"):
        of.fast_sis(model, images, method="responsibility", options=of.MinimalPixelSetOptions(refine="prune"))


def test_refine_on_a_cnn_is_one_minimal_whatever_the_batching():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(4, h=12, w=12, seed=4, dtype=torch.float32)
    res = of.fast_sis(model, images, method="responsibility", options=of.MinimalPixelSetOptions(iterations=4))
    again = of.fast_sis(model, images, method="responsibility", batch_size=5,
                        options=of.MinimalPixelSetOptions(iterations=4))
    for img, r, s in zip(images, res, again):
        assert_one_minimal(model, img, r.mask, r.target)
        assert torch.equal(r.mask, s.mask)


def test_sufficient_subset_refine_threshold_criterion():
    model = make_cnn(1)
    images = make_images(3, seed=9)
    ranking = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        f = torch.softmax(model(images), 1).max(1).values
    tau = (0.8 * f).tolist()
    res = of.sufficient_subset(model, images, ranking, tau, refine=True)
    for i, r in enumerate(res):
        def f_on(keep):
            with torch.no_grad():
                return float(torch.softmax(model(torch.where(keep, images[i], 0.0)[None]), 1)[0, r.target])
        assert f_on(r.mask) >= tau[i] and abs(f_on(r.mask) - r.sis_score) < 1e-12
        for y, x in r.mask.nonzero().tolist():
            smaller = r.mask.clone()
            smaller[y, x] = False
            assert f_on(smaller) < tau[i]
    with pytest.raises(ValueError, match="refine"):
        of.sufficient_subset(model, images, ranking, tau, refine=1)


def test_boundary_search_is_a_sequential_boundary():
    """On a ranking, the boundary k passes and k - 1 fails (plain forward passes); with a monotone
    criterion (a model that sums evidence) it is the first passing prefix of a one-by-one scan."""
    torch.manual_seed(0)
    for model, images in [
        (PatchReader(slice(0, 12), slice(0, 16), need=0.37).eval(), 0.5 + torch.rand(3, 3, 12, 16)),
        (make_cnn(3, torch.float32, h=12, w=16), make_images(3, h=12, w=16, seed=2, dtype=torch.float32)),
    ]:
        with torch.inference_mode():
            ev, prep = responsibility_evaluator(model, images)
            scores = torch.randn(3, 12 * 16)
            present = torch.ones(3, 12 * 16, dtype=torch.bool)
            pos = ranking_positions(scores, present)
            hits, q = boundary_prefix(ev, pos, [0, 1, 2], [192] * 3, lambda r, f, t: bool(t))
        for i, (k, _) in enumerate(hits):
            target = int(model(images[i : i + 1]).argmax())
            prefix = lambda m: (pos[i] < m).view(12, 16)  # noqa: E731
            assert top1_on(model, images[i], prefix(k)) == target
            assert k == 1 or top1_on(model, images[i], prefix(k - 1)) != target
            assert q[i] <= 2 * (192).bit_length() + 2
            if isinstance(model, PatchReader):
                first = next(m for m in range(1, 193) if top1_on(model, images[i], prefix(m)) == target)
                assert k == first


def test_auto_iterations_stop_by_the_documented_rule_and_are_deterministic():
    """The stop of every image, recomputed by hand from fixed-iteration maps: after iteration t >= m, once
    the top fraction (ceil) of the ranking has kept Dice >= d with the iteration before for r iterations in a
    row (the documented constants)."""
    model = PatchReader(slice(4, 8), slice(6, 12)).eval()
    x = 0.5 + torch.rand(3, 3, 12, 16, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, x)
        present = torch.ones(3, 12 * 16, dtype=torch.bool)
        passes = top1
        maps, q, info = auto_responsibility(ev, prep, present, passes, 10, 10, 0, False)
        again, q2, _ = auto_responsibility(ev, prep, present, passes, 10, 10, 0, False)
        last = max(info.iterations)  # the hand check below needs no more iterations than this
        fixed = [compute_responsibility(ev, prep, present, passes, t, 10, 10, 0, False) for t in range(1, last + 1)]
    assert torch.equal(maps, again) and q == q2
    k = math.ceil(AUTO_TOP_FRACTION * 192)
    for i in range(3):
        tops = [(ranking_positions(m.view(3, -1), present)[i] < k) for m, _ in fixed]
        calm, want = 0, 20
        for t in range(1, last):
            both = (tops[t] & tops[t - 1]).sum().item()
            calm = calm + 1 if 2 * both / (2 * k) >= AUTO_DICE else 0
            if t + 1 >= AUTO_MIN_ITERATIONS and calm >= AUTO_PATIENCE:
                want = t + 1
                break
        assert info.iterations[i] == want
        # the auto map is the fixed-iteration map of as many iterations; the cache across iterations only saves
        torch.testing.assert_close(maps[i], fixed[want - 1][0][i], rtol=0, atol=1e-12)
        assert q[i] <= fixed[want - 1][1][i]
    assert min(info.iterations) < 20  # the rule stops an image early here


def test_mutant_cache_scores_a_repeated_descent_once():
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(2, h=12, w=12, seed=4, dtype=torch.float32)
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, images)
        present = torch.ones(2, 144, dtype=torch.bool)
        passes = top1
        cache = MutantCache()
        one, q1 = descend(ev, prep, present, passes, [(0, 7), (1, 7)], 10, 4, cache)
        two, q2 = descend(ev, prep, present, passes, [(0, 7), (1, 7), (1, 7)], 10, 4, cache)
    assert q2 == [0, 0] and cache.hits > 0  # the same descents again: every mutant came from the cache
    assert torch.equal(two[:2], one) and torch.equal(two[2], one[1])


def test_descend_sums_the_maps_of_each_image(monkeypatch):
    """per_image: each descent's log map is added to its image's map, in descent order (the maps of one row per
    descent, summed by hand); an image with no descent stays zero; the sum is the same when the runner paints one
    map at a time (its chunks); no descent at all gives zeros of every image."""
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(4, h=12, w=12, seed=5, dtype=torch.float32)
    descents = [(3, 1), (0, 1), (3, 2), (0, 3), (1, 4)]
    with torch.inference_mode():
        ev, prep = responsibility_evaluator(model, images)
        present = torch.ones(4, 144, dtype=torch.bool)
        passes = top1
        each, q_each = descend(ev, prep, present, passes, descents, 10, 4, MutantCache())
        summed, q_sum = descend(ev, prep, present, passes, descents, 10, 4, MutantCache(), per_image=True)
        none, q_none = descend(ev, prep, present, passes, [], 10, 4, MutantCache(), per_image=True)
        monkeypatch.setattr(ev.runner, "chunk", 1)
        chunked, _ = descend(ev, prep, present, passes, descents, 10, 4, MutantCache(), per_image=True)
    assert each.shape == (5, 12, 12) and summed.shape == (4, 12, 12) and q_sum == q_each
    want = torch.zeros(4, 12, 12, dtype=torch.float64)
    for d, (i, _) in enumerate(descents):
        want[i] = want[i] + each[d]
    assert bool(each.ne(0).any(2).any(1).all())  # every descent left a map, so every image named is non-zero
    torch.testing.assert_close(summed, want, rtol=0, atol=0)
    torch.testing.assert_close(chunked, want, rtol=0, atol=0)
    assert summed[2].eq(0).all()
    assert none.shape == (4, 12, 12) and none.eq(0).all() and q_none == [0] * 4

def test_rect_fill_is_chunked_under_the_out_of_memory_back_off(monkeypatch):
    """rect_fill never paints more maps than the batch size at once; out-of-memory errors halve the
    chunk and the maps stay the same."""
    model = make_cnn(2, torch.float32, h=12, w=12)
    images = make_images(3, h=12, w=12, seed=4, dtype=torch.float32)
    want = of.responsibility(model, images, iterations=4, seed=1, min_box=4)
    real = _ops.rect_fill
    sizes = []

    def small_only(rects, owner, weights, n, h, w, check_indices=True):
        sizes.append(n)
        if n > 3:
            raise torch.OutOfMemoryError("planted")
        return real(rects, owner, weights, n, h, w, check_indices)

    monkeypatch.setattr(_ops, "rect_fill", small_only)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = of.responsibility(model, images, iterations=4, seed=1, min_box=4, batch_size=16)
    assert any("out of memory" in str(w.message) for w in caught)
    assert max(sizes) == 16  # one chunk of the runner's size, not the whole level
    failed = [i for i, n in enumerate(sizes) if n > 3]
    assert all(n <= 3 for n in sizes[failed[-1] + 1 :])  # the halved chunk is kept
    for a, b in zip(want, got):
        assert torch.equal(a.map, b.map) and a.queries == b.queries


# ----------------------------------------------------------------------------------------------------
# Hand-built expectations for minimal.py's pruning (added for mutmut survivors; see docs/notes/mutation-testing.md).
# ----------------------------------------------------------------------------------------------------


class Rounds(RuleEvaluator):
    """RuleEvaluator that also records the number of candidates of every call (one call per round)."""

    def __init__(self, rule):
        super().__init__(rule)
        self.calls: list[int] = []

    def __call__(self, present, image, row, feature, **kw):
        self.calls.append(int(image.numel()))
        return super().__call__(present, image, row, feature, **kw)


def needs(essential):
    """Passes (top-1) while every feature of ``essential`` is present; f = present features / 100."""
    return lambda ids: (len(ids) / 100, set(essential) <= ids)


def staleness(ids):
    """Not monotone: 3 must stay, and 0 may go only once 1 has gone (0 absent and 1 present fails)."""
    return len(ids) / 100, 3 in ids and (0 in ids or 1 not in ids)


# case A: blocks that pass, double, fail and halve, then widening singles (p = 13)
A_ESSENTIAL = {1, 8, 9, 10, 11, 12}
A_ORDER = [0, 2, 3, 4, 5, 6, 7, 1, 8, 9, 10, 11, 12]
A_SETS = [  # every candidate, in order, traced by hand (S: the set at that point)
    set(range(1, 13)),  # single: remove 0 (passes; B = 2)
    {1} | set(range(4, 13)),  # block [2, 3] (passes; B = 4)
    {1, 8, 9, 10, 11, 12},  # block [4, 5, 6, 7] (passes; B = 8)
    set(),  # block [1, 8, 9, 10, 11, 12] (fails; B = 4)
    {11, 12},  # block [1, 8, 9, 10] (fails; B = 2)
    {9, 10, 11, 12},  # block [1, 8] (fails; B = 1)
    {8, 9, 10, 11, 12},  # single: remove 1 (fails; W = 2)
    {1, 9, 10, 11, 12}, {1, 8, 10, 11, 12},  # singles: remove 8, 9 (fail; W = 4)
    {1, 8, 9, 11, 12}, {1, 8, 9, 10, 12}, {1, 8, 9, 10, 11},  # singles: remove 10, 11, 12 (fail); pass over
]
A_CALLS = [1, 1, 1, 1, 1, 1, 1, 2, 3]

# case B: a kept feature (0) whose removal failed becomes removable after a later removal (1): a second pass
B_ORDER = [0, 1, 2, 3]
B_SETS = [
    {1, 2, 3},  # single: remove 0 (fails: 1 present; W = 2)
    {0, 2, 3}, {0, 1, 3},  # singles: remove 1 (passes, taken: B = 2), remove 2 (evaluated beside it, not taken)
    {0},  # block [2, 3] (fails; B = 1)
    {0, 3},  # single: remove 2 (passes; B = 2)
    {0},  # block [3] (fails; B = 1)
    {0},  # single: remove 3 (fails). End of pass 1: 0 failed before two removals: tested again
    {3},  # pass 2, B = W = 1: single: remove 0 (passes)
    set(),  # pass 3: 3 failed before that removal: remove 3 (fails). Pass 4 has nothing to test.
]
B_CALLS = [1, 2, 1, 1, 1, 1, 1, 1]

# case C: known_failing = 0 (not queried), one removal in pass 1, then 0 is tested again and goes
C_START, C_ORDER = {0, 1, 3}, [0, 1, 3]
C_SETS = [{0, 3}, {0}, {0}, {3}, set()]  # remove 1 (passes), block [3], single 3 (fail); pass 2: 0 (passes); 3
C_CALLS = [1, 1, 1, 1, 1]

# case E: the first single of a window fails and the second passes (hit at 1); its successor is a block
E_ESSENTIAL, E_ORDER = {0, 1}, [0, 1, 2, 3]
E_SETS = [{1, 2, 3}, {0, 2, 3}, {0, 1, 3}, {0, 1}, {1}, {0}]  # 0; 1 and 2 (2 taken); block [3]; pass 2: 0; 1
E_CALLS = [1, 2, 1, 1, 1]

# case F: as E, but the single taken at 1 is the last removal: the f returned is that candidate's
F_ORDER = [0, 1, 2]
F_SETS = [{1, 2}, {0, 2}, {0, 1}, {1}, {0}]  # 0; 1 and 2 (2 taken); pass 2: 0; 1
F_CALLS = [1, 2, 1, 1]


def as_threshold(rule):
    """The same sets pass, told by f >= 1 (f = 1 + present / 100 on a passing set) while top-1 says the opposite."""
    def scored(ids):
        f, ok = rule(ids)
        return f + ok, not ok
    return scored


def run(rules, starts, orders, scores, known=None, budget=None, p=13, criterion="top1"):
    """prune_to_minimal on rows whose image i has rule ``rules[i]``; returns (result, evaluator).
    criterion "threshold": each rule through :func:`as_threshold`, passing on f >= 1."""
    if criterion == "threshold":
        rules = [as_threshold(rule) for rule in rules]
    ev = Rounds(lambda i, ids: rules[i](ids))
    sets = torch.zeros(len(starts), p, dtype=torch.bool)
    for r, s in enumerate(starts):
        sets[r, sorted(s)] = True
    passes = top1 if criterion == "top1" else (lambda r, f, t: f >= 1.0)
    out = prune_to_minimal(ev, sets, orders, list(range(len(starts))), scores, passes, known, budget)
    return out, ev


def sets_of(ev, image):
    return [set(ids) for i, ids in ev.sets if i == image]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_one_row_traces_blocks_and_widening_singles():
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL)], [set(range(13))], [A_ORDER], [0.13])
    assert sets_of(ev, 0) == A_SETS
    assert ev.calls == A_CALLS
    assert set(torch.nonzero(pruned[0]).flatten().tolist()) == A_ESSENTIAL
    assert f == [pytest.approx(0.06)] and q == [12] and cert == [True]


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("criterion", ["top1", "threshold"])
def test_rows_prune_together_one_batch_per_round(criterion):
    """Cases A, B, C, E and F in one call: each row's candidates are its own trace, every round is one call holding
    each active row's candidates, and the rounds are as many as the longest row needs. Passing told by the top-1
    or by f (each candidate's own f: the f returned is the last removal's)."""
    rules = [needs(A_ESSENTIAL), staleness, staleness, needs(E_ESSENTIAL), needs(E_ESSENTIAL)]
    starts = [set(range(13)), set(B_ORDER), C_START, set(E_ORDER), set(F_ORDER)]
    extra = 1.0 if criterion == "threshold" else 0.0
    (pruned, f, q, cert), ev = run(rules, starts, [A_ORDER, B_ORDER, C_ORDER, E_ORDER, F_ORDER],
                                   [extra + x for x in (0.13, 0.04, 0.03, 0.04, 0.03)],
                                   known=[None, None, 0, None, None], criterion=criterion)
    assert [sets_of(ev, i) for i in range(5)] == [A_SETS, B_SETS, C_SETS, E_SETS, F_SETS]
    traces = [A_CALLS, B_CALLS, C_CALLS, E_CALLS, F_CALLS]
    assert ev.calls == [sum(t[k] for t in traces if k < len(t)) for k in range(max(map(len, traces)))]
    assert [set(torch.nonzero(row).flatten().tolist()) for row in pruned] == [A_ESSENTIAL, {3}, {3}, E_ESSENTIAL,
                                                                             E_ESSENTIAL]
    assert f == [pytest.approx(extra + x) for x in (0.06, 0.01, 0.01, 0.02, 0.02)]
    assert q == [12, 9, 5, 6, 5] and cert == [True] * 5


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_nothing_removable_keeps_the_given_score():
    (pruned, f, q, cert), ev = run([needs({3})], [{3}], [[3]], [0.77])
    assert sets_of(ev, 0) == [set()] and f == [0.77] and q == [1] and cert == [True]
    assert pruned[0].tolist() == [i == 3 for i in range(13)]


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_single_width_is_capped_at_32_on_the_cpu():
    """100 features, all needed: widths 1, 2, 4, 8, 16, 32, then capped at 32 (and the 5 left)."""
    (pruned, f, q, cert), ev = run([needs(set(range(100)))], [set(range(100))], [list(range(100))], [1.0], p=100)
    assert ev.calls == [1, 2, 4, 8, 16, 32, 32, 5]
    assert q == [100] and cert == [True] and bool(pruned[0].all())


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("budget, kept, queries, calls", [
    (5, {1, 8, 9, 10, 11, 12}, 5, [1, 1, 1, 1, 1]),  # stops before the block [1, 8]
    (8, {1, 8, 9, 10, 11, 12}, 8, [1, 1, 1, 1, 1, 1, 1, 1]),  # one query left: a window of 1, not 2
    (12, {1, 8, 9, 10, 11, 12}, 12, A_CALLS),
])
def test_budget_is_spent_exactly_and_not_certified_short_of_the_end(budget, kept, queries, calls):
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL)], [set(range(13))], [A_ORDER], [0.13], budget=budget)
    assert ev.calls == calls and q == [queries]
    assert set(torch.nonzero(pruned[0]).flatten().tolist()) == kept
    assert cert == [budget == 12]  # 12 queries finish case A; with fewer the pass is cut short


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_a_row_out_of_budget_does_not_hold_back_the_rows_after_it():
    """Budget 5: case A (first) runs out in round 6, the round in which case C (after it) ends its last pass with
    nothing left to test: C is still certified."""
    (pruned, f, q, cert), ev = run([needs(A_ESSENTIAL), staleness], [set(range(13)), C_START], [A_ORDER, C_ORDER],
                                   [0.13, 0.03], known=[None, 0], budget=5)
    assert q == [5, 5] and cert == [False, True]
    assert set(torch.nonzero(pruned[1]).flatten().tolist()) == {3}


@pytest.mark.timeout(30)
def test_pruning_reads_once_to_start_and_once_per_round():
    """Cases A, B, C, E and F in one call (test_rows_prune_together_one_batch_per_round): 9 rounds, the longest
    trace's (A's). The host reads the given sets once and each round's answers once, however many rows and
    candidates the round holds; the ends of passes (B, C, E, F start second passes) read nothing more: the host
    keeps its own copy of the sets."""
    from overinterp_fast.runtime import sync

    rules = [needs(A_ESSENTIAL), staleness, staleness, needs(E_ESSENTIAL), needs(E_ESSENTIAL)]
    starts = [set(range(13)), set(B_ORDER), C_START, set(E_ORDER), set(F_ORDER)]
    with sync.counting() as reads:
        (pruned, _, q, _), ev = run(rules, starts, [A_ORDER, B_ORDER, C_ORDER, E_ORDER, F_ORDER],
                                    [0.13, 0.04, 0.03, 0.04, 0.03], known=[None, None, 0, None, None])
    assert len(ev.calls) == len(A_CALLS) == 9 and q == [12, 9, 5, 6, 5]
    assert reads.by_label == {"pruning start": 1, "pruning": 9}
    assert reads.tensors == 1 + 2 * 9  # each round: f and top-1 (whether every f is finite: seen on the host)
