"""The margin-guided search for the first passing prefix (guided.py), checked against hand-derived query
sequences, a simulation of Brownian bridges, and the plain scan (prefix.first_passing_prefix) on random walks.
"""
import math
import numpy as np
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.methods.guided import crossing_probability, guided_first_prefix
from overinterp_fast.runtime.model import ModelFn
from overinterp_fast.methods.prefix import first_passing_prefix
from helpers import RuleEvaluator, make_cnn, make_images, top1
from helpers import top1_on


def by_count(curves):
    """rule: image i's prefix of c features has slack curves[i](c); passes when it is > 0; f = 0.5 + slack / 100."""
    def rule(i, ids):
        m = curves[i](len(ids))
        return 0.5 + m / 100, m > 0, m
    return rule


def identity_positions(rows, p):
    return torch.arange(p).repeat(rows, 1)


def margin(r, f, t, m):
    return m


@pytest.mark.parametrize("sa,sb,steps,sigma2", [(-1.0, -1.0, 10, 0.1), (-0.5, -1.0, 8, 0.1), (-0.3, -2.0, 40, 0.02)])
def test_crossing_probability_matches_simulated_brownian_bridges(sa, sb, steps, sigma2):
    """The reflection principle's exp(-2 a b / (sigma^2 T)), against the share of 4000 simulated bridges (1000
    increments each) whose maximum reaches 0."""
    rng = np.random.default_rng(0)
    t = 1000
    walk = np.cumsum(rng.normal(0, math.sqrt(sigma2 * steps / t), (4000, t)), axis=1)
    s = np.arange(1, t + 1) / t
    bridge = sa + walk - s * walk[:, -1:] + s * (sb - sa)
    share = float((bridge.max(1) >= 0).mean())
    assert crossing_probability(sa, sb, steps, sigma2) == pytest.approx(share, abs=0.025)


def test_crossing_probability_at_the_edges():
    assert crossing_probability(-1.0, 0.0, 5, 1.0) == 1.0  # an end at 0: the crossing is certain
    assert crossing_probability(0.5, -2.0, 5, 1.0) == 1.0  # a passing end counts as 0
    assert crossing_probability(-1.0, -1.0, 5, 0.0) == 0.0  # no variance: a flat line never crosses
    assert crossing_probability(-1.0, -2.0, 4, 0.5) == pytest.approx(math.exp(-2.0))
    assert crossing_probability(-1.0, 0.5, 10, 1.0) == 1.0  # the other end passing counts as 0 too
    assert crossing_probability(0.0, -1.0, 4, 0.0) == 1.0  # an end at 0 is certain even with no variance


def test_guided_search_follows_the_hand_derived_rounds():
    """Sizes 10..100 (indices 0..9), grid 4 (ratio 0.1 adds nothing this low), safety 2, eps 0.05: coarse indices
    3, 7, 9, two per round at first on a CPU, then 4.
    Image 0, slack by count: 0: -3, 20: -3, 40: -3, 50: -1, 60: -0.5, 70: +0.5, 80: +1.
      round 1: the empty prefix, 40, 80 -> 80 passes.
      round 2: sigma^2 = 2 (0^2 + 4^2) / 8 = 4; (-1, 3): exp(-2*9/(4*4)) = 0.32 > 0.05 -> 20; (3, 7) ends at the
               earliest pass -> 60.
      round 3: sigma^2 = 2 (0 + 0 + 2.5^2 + 1.5^2) / 8 = 2.125; (-1, 1), (1, 3): exp(-18/4.25) = 0.014, not tried;
               (3, 5): exp(-2*3*0.5/4.25) = 0.49 -> 50; (5, 7) -> 70, which passes.
      round 4: (5, 6) is one step; (-1, 1), (1, 3): sigma^2 = 2 * 5.25 / 7 = 1.5, exp(-6): done. Answer: 70.
    Image 1 never passes (slack -5): 0, 40, 80, then the last size 100; all slacks equal: sigma^2 = 0, done."""
    curve0 = {0: -3, 20: -3, 40: -3, 50: -1, 60: -0.5, 70: 0.5, 80: 1}
    ev = RuleEvaluator(by_count({0: lambda c: curve0[c], 1: lambda c: -5.0}))
    sizes = [list(range(10, 101, 10))] * 2
    found, queries = guided_first_prefix(ev, identity_positions(2, 100), [0, 1], sizes, top1, margin, grid=4,
                                         safety=2.0, eps=0.05)
    assert [s for i, s in ev.seen if i == 0] == [0, 40, 80, 20, 60, 50, 70]
    assert [s for i, s in ev.seen if i == 1] == [0, 40, 80, 100]
    assert ev.seen[:8] == [(0, 0), (0, 40), (0, 80), (1, 0), (1, 40), (1, 80), (0, 20), (0, 60)]
    assert found == [(6, 0.505), None] and queries == [7, 4]


def test_a_narrow_window_near_zero_is_found_and_a_deep_one_is_not():
    """Slack -2 with one passing size (2050) where the slack climbs to -0.1 around it, and a broad window from 3000
    on: the search finds 2050. With the same narrow window at 1050 amid slack -5 (no sign of it in the slacks
    around), the interval is not tried: the answer is the broad window's first size, 3000, still passing and
    with a failing predecessor."""
    def near(c):
        return 0.5 if c == 2050 else 1.0 if c >= 3000 else -0.1 if 1800 <= c <= 2300 else -2.0

    def deep(c):
        return 0.5 if c == 1050 else 1.0 if c >= 3000 else -5.0

    ev = RuleEvaluator(by_count({0: near, 1: deep}))
    sizes = [list(range(10, 5001, 10))] * 2
    found, queries = guided_first_prefix(ev, identity_positions(2, 5000), [0, 1], sizes, top1, margin)
    assert found == [(204, 0.505), (299, 0.51)]
    assert max(queries) < 100  # the scan tries 205 and 300 sizes
    plain = first_passing_prefix(RuleEvaluator(by_count({0: near, 1: deep})), identity_positions(2, 5000), [0, 1],
                                 sizes, top1)
    assert [h[0] for h in plain] == [204, 104]


def test_guided_search_agrees_with_the_scan_on_random_walks():
    """Random walks (slack per step of 10 features: N(0.02, 0.25^2) from -3 or less; 56 of the 60 pass within
    600 steps): the search returns the scan's first passing size in at least 95% of the walks that pass, never
    a failing size, always with a failing predecessor, and with a median of less than a third of the scan's
    queries."""
    rng = np.random.default_rng(7)
    n, walks = 600, 60
    steps = rng.normal(0.02, 0.25, (walks, n + 1))
    curves = {i: np.concatenate([[-3.0 - rng.random()], -3.0 + np.cumsum(steps[i, 1:])]) for i in range(walks)}
    rule = by_count({i: (lambda c, w=curves[i]: float(w[c // 10])) for i in range(walks)})
    sizes = [list(range(10, 10 * n + 1, 10))] * walks
    pos = identity_positions(walks, 10 * n)
    found, queries = guided_first_prefix(RuleEvaluator(rule), pos, list(range(walks)), sizes, top1, margin)
    scan_ev = RuleEvaluator(rule)
    plain = first_passing_prefix(scan_ev, pos, list(range(walks)), sizes, top1)
    same = 0
    for i in range(walks):
        w = curves[i]
        assert (found[i] is None) == (plain[i] is None)
        if found[i] is None:
            continue
        k = found[i][0]
        assert w[k + 1] > 0 and (k == 0 or w[k] <= 0), "the answer passes and its predecessor fails"
        assert k >= plain[i][0]
        same += k == plain[i][0]
    passing = sum(h is not None for h in plain)
    assert passing >= 50 and same >= 0.95 * passing
    scan_queries = [scan_ev.count(i) for i in range(walks)]
    assert np.median(queries) < np.median(scan_queries) / 3


def test_guided_search_checks_its_constants_and_handles_empty_rows():
    ev = RuleEvaluator(by_count({0: lambda c: 1.0}))
    found, queries = guided_first_prefix(ev, identity_positions(1, 10), [0], [[]], top1, margin)
    assert found == [None] and queries == [0] and ev.seen == []
    for bad in (dict(grid=0), dict(safety=0.0), dict(eps=0.0), dict(eps=1.0), dict(ratio=-0.1)):
        with pytest.raises(ValueError, match="grid"):
            guided_first_prefix(ev, identity_positions(1, 10), [0], [[10]], top1, margin, **bad)
    # a single size: tried with the empty prefix; the answer is index 0
    found, queries = guided_first_prefix(ev, identity_positions(1, 10), [0], [[10]], top1, margin)
    assert found == [(0, 0.51)] and queries == [2]


def test_score_top1_margin_is_the_log_odds_against_the_strongest_other_class():
    logits = torch.tensor([[2.0, 0.5, 1.0], [0.0, 3.0, -1.0]])
    fn = ModelFn(lambda x: logits[: x.shape[0]])
    f, t, m = fn.score_top1_margin(torch.zeros(2, 1), torch.tensor([0, 0]))
    assert m.tolist() == [1.0, -3.0] and t.tolist() == [True, False]
    assert f.tolist() == pytest.approx(torch.softmax(logits, 1)[:, 0].tolist())
    probs = torch.tensor([[0.5, 0.25, 0.25], [0.125, 0.5, 0.375]], dtype=torch.float64)
    fp = ModelFn(lambda x: probs[: x.shape[0]], outputs="probabilities")
    f, t, m = fp.score_top1_margin(torch.zeros(2, 1), torch.tensor([0, 2]))
    assert m.tolist() == pytest.approx([math.log(2.0), math.log(0.75)]) and f.tolist() == [0.5, 0.375]
    one = ModelFn(lambda x: torch.ones(x.shape[0], 1))
    assert one.score_top1_margin(torch.zeros(1, 1), torch.tensor([0]))[2].tolist() == [math.inf]


def test_fast_sis_prefix_search_options():
    """The default (guided) and the scan give sets that pass on the model, for both criteria; a bad value is an
    error."""
    model = make_cnn(3, torch.float32, h=16, w=16)
    images = make_images(3, h=16, w=16, seed=11, dtype=torch.float32)
    kw = dict(method="responsibility")
    for ps in ("guided", "scan"):
        opts = of.MinimalPixelSetOptions(iterations=3, prefix_search=ps)
        for r, img in zip(of.fast_sis(model, images, **kw, options=opts), images):
            assert r.sis is not None and top1_on(model, img, r.mask) == r.target
        opts = of.MinimalPixelSetOptions(iterations=3, criterion="threshold", prefix_search=ps)
        for r, img in zip(of.fast_sis(model, images, 0.3, **kw, options=opts), images):
            if r.sis is not None:
                with torch.no_grad():
                    f = torch.softmax(model(torch.where(r.mask, img, torch.zeros(()))[None]), 1)[0, r.target]
                assert f >= 0.3
    for bad in ("full", None, 1):
        with pytest.raises(ValueError, match="prefix_search"):
            of.fast_sis(model, images, **kw, options=of.MinimalPixelSetOptions(iterations=3, prefix_search=bad))


def test_the_earliest_pass_is_bracketed_even_when_its_slack_disagrees():
    """A criterion that passes from 50 features on while the slack stays at -1 everywhere (no variance): the
    interval below the earliest passing size is still bisected down to one step (80, then 60, then 50), so the
    answer's predecessor (40) is known to fail."""
    ev = RuleEvaluator(lambda i, ids: (0.5, len(ids) >= 50, -1.0))
    found, queries = guided_first_prefix(ev, identity_positions(1, 100), [0], [list(range(10, 101, 10))], top1,
                                         margin, grid=4)
    assert [s for _, s in ev.seen] == [0, 40, 80, 60, 50] and found == [(4, 0.5)] and queries == [5]
    # grid 3 (coarse indices 2, 5, 8, 9): 60 passes; (2, 5) is bisected at 3 (40: fails), then (3, 5) at 4 (50)
    ev = RuleEvaluator(lambda i, ids: (0.5, len(ids) >= 50, -1.0))
    found, queries = guided_first_prefix(ev, identity_positions(1, 100), [0], [list(range(10, 101, 10))], top1,
                                         margin, grid=3)
    assert [s for _, s in ev.seen] == [0, 30, 60, 40, 50] and found == [(4, 0.5)] and queries == [5]


def test_the_coarse_scan_steps_by_32_sizes_then_by_a_tenth():
    """Sizes 10..10000 that all fail with one slack (nothing to bisect): the coarse scan alone, steps of 32 sizes
    (320 features) up to 3200, then of a tenth of the index below (index 319 + 32 = 351, + 35 = 386, + 38 = 424,
    ...), and the whole ranking last."""
    ev = RuleEvaluator(by_count({0: lambda c: -5.0}))
    found, queries = guided_first_prefix(ev, identity_positions(1, 10000), [0], [list(range(10, 10001, 10))], top1,
                                         margin)
    assert [s for _, s in ev.seen] == [0, *range(320, 3201, 320), 3520, 3870, 4250, 4670, 5130, 5640, 6200, 6820,
                                       7500, 8250, 9070, 9970, 10000]
    assert found == [None] and queries == [24]


def test_the_slack_of_each_criterion():
    """What guides fast_sis's search: the margin for top-1; log f - log tau for a threshold (0 exactly at f = tau)."""
    from overinterp_fast.runtime.job import slack as _slack

    assert _slack("top1", [0.9])(0, 0.2, False, -1.5) == -1.5
    tau = _slack("threshold", [0.25, 0.5])
    assert tau(0, 0.5, False, 9.0) == pytest.approx(math.log(2.0)) and tau(1, 0.5, True, 9.0) == 0.0
    assert tau(1, 0.0, False, 0.0) < -600  # f = 0: very far, not -inf


def test_the_coarse_scan_ends_at_the_last_size_once():
    """Where the grid lands on the last index or one before it (all sizes fail with one slack: no bisection)."""
    for n, seen in ((32, [0, 320]), (33, [0, 320, 330])):
        ev = RuleEvaluator(by_count({0: lambda c: -5.0}))
        found, queries = guided_first_prefix(ev, identity_positions(1, 10 * n), [0], [list(range(10, 10 * n + 1, 10))],
                                             top1, margin)
        assert [c for _, c in ev.seen] == seen and found == [None] and queries == [len(seen)]


def test_grid_1_ratio_steps_and_the_first_size_is_tried_at_its_size():
    """grid 1, ratio 0.5, sizes 10..200 (indices 0..19), all failing: the coarse indices step by max(1, int(0.5 (k +
    1))): 0, 1, 2, 3, 5, 8, 12, 18, then the last, 19. Then a criterion passing from 10 features: index 0 (10
    features, not the empty prefix) is the answer, and the slack is given the evaluator's f and top-1."""
    sizes = [list(range(10, 201, 10))]
    ev = RuleEvaluator(by_count({0: lambda c: -5.0}))
    found, queries = guided_first_prefix(ev, identity_positions(1, 200), [0], sizes, top1, margin, grid=1, ratio=0.5)
    assert [c for _, c in ev.seen] == [0, 10, 20, 30, 40, 60, 90, 130, 190, 200] and found == [None]
    calls = []

    def spy(r, f, t, m):
        calls.append((r, f, t))
        return m

    ev = RuleEvaluator(lambda i, ids: (0.5 + len(ids) / 1000, len(ids) >= 10, len(ids) - 9.5))
    found, queries = guided_first_prefix(ev, identity_positions(1, 200), [0], sizes, top1, spy, grid=1, ratio=0.0,
                                         safety=0.5)
    assert found == [(0, 0.51)] and [c for _, c in ev.seen] == [0, 10, 20] and queries == [3]
    assert calls == [(0, 0.5, False), (0, 0.51, True), (0, 0.52, True)]


def test_the_coarse_rounds_grow_from_the_first_chunk_to_the_device_cap(monkeypatch):
    """First round: the empty prefix and FIRST_CHUNK coarse sizes; then the chunk doubles up to COARSE_CHUNK (on the
    CPU 2, then 4; patched: 1, then 2, 4, 8). Sizes 10..1000, grid 4 (coarse indices 3, 7, ..., 51, then steps of a tenth: 56,
    61, 67, ...); the criterion passes from 400 features (index 39, the 10th coarse size) with one slack everywhere.
    Rounds: [0, 40], [80, 120], [160 .. 280], [320 .. 620] (400 passes; the rest of the round is spent); then the
    interval (360, 400) is bisected: 380, then 390, both failing."""
    import overinterp_fast.methods.guided as guided

    # the defaults on the CPU first: 2, then 4 per round ([0, 40, 80], [120 .. 240], [280 .. 400]): nothing spent
    ev = RuleEvaluator(lambda i, ids: (0.5, len(ids) >= 400, -1.0))
    found, queries = guided_first_prefix(ev, identity_positions(1, 1000), [0], [list(range(10, 1001, 10))], top1,
                                         margin, grid=4)
    assert [c for _, c in ev.seen] == [0, 40, 80, 120, 160, 200, 240, 280, 320, 360, 400, 380, 390]
    assert found == [(39, 0.5)] and queries == [13]
    monkeypatch.setattr(guided, "FIRST_CHUNK", {"cpu": 1})
    monkeypatch.setattr(guided, "COARSE_CHUNK", {"cpu": 8})
    ev = RuleEvaluator(lambda i, ids: (0.5, len(ids) >= 400, -1.0))
    found, queries = guided_first_prefix(ev, identity_positions(1, 1000), [0], [list(range(10, 1001, 10))], top1,
                                         margin, grid=4)
    assert [c for _, c in ev.seen] == [0, 40, 80, 120, 160, 200, 240, 280, 320, 360, 400, 440, 480, 520, 570, 620,
                                       380, 390]
    assert found == [(39, 0.5)] and queries == [18]
