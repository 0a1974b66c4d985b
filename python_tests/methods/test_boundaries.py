"""Boundaries with exact, hand-computed expectations: f exactly equal to tau, exact ties, empty sets,
a single feature, an image already at the mask value, the all-masked input that already passes.

The models output probabilities that are sums of dyadic weights (exact in float64), so every value
below is known exactly and no comparison depends on rounding.
"""
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.methods import reference
from overinterp_fast.methods.findsis import find_sis, sis_score
from helpers import Dyadic, assert_sets_sufficient


def ones(n, h, w):
    return torch.ones(n, 1, h, w, dtype=torch.float64)


EXACT_AND_REFERENCE = [
    lambda m, x, tau, **kw: of.fast_sis(m, x, tau, outputs="probabilities", **kw),
    lambda m, x, tau, **kw: reference.sis(m, x, tau, outputs="probabilities", **kw),
]
GRADIENT_AND_REFERENCE = [
    lambda m, x, tau, k, **kw: of.fast_sis(m, x, tau, method="gradient", outputs="probabilities",
                                           options=of.GradientOptions(k=k), **kw),
    lambda m, x, tau, k, **kw: reference.gradient_sis(m, x, tau, k=k, outputs="probabilities", **kw),
]


@pytest.mark.parametrize("run", EXACT_AND_REFERENCE, ids=["fast", "reference"])
def test_exact_f_equal_to_tau_stops_findsis(run):
    # f(x) = 0.9375; masking the lightest pixel first: 0.875, 0.75, 0.5, 0.0
    model = Dyadic([0.5, 0.25, 0.125, 0.0625]).eval()
    (r,) = run(model, ones(1, 2, 2), 0.75)
    assert r.order.tolist() == [3, 2, 1, 0]
    assert r.values.tolist() == [0.875, 0.75, 0.5, 0.0]
    assert r.score == 0.9375 and r.target == 0
    assert r.sis.tolist() == [0, 1], "f = tau exactly must stop FindSIS (>=, not >)"
    assert r.sis_score == 0.75
    assert r.mask.tolist() == [[True, True], [False, False]]


@pytest.mark.parametrize("run", GRADIENT_AND_REFERENCE, ids=["fast", "reference"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_gradient_f_equal_to_tau_stops_findsis(run, k):
    model = Dyadic([0.5, 0.25, 0.125, 0.0625]).eval()
    (r,) = run(model, ones(1, 2, 2), 0.75, k)
    assert r.order.tolist() == [3, 2, 1, 0]  # df/dM_j = -w_j: the lightest first
    assert r.blocks.tolist() == list(range(0, 4, k)) + [4]
    after = [0.875, 0.75, 0.5, 0.0]  # f after masking the first t features
    assert r.values.tolist() == [after[b - 1] for b in r.blocks.tolist()[1:]]
    want = {1: [0, 1], 2: [0, 1], 3: [0, 1, 2, 3]}[k]  # blocks are unmasked whole, last-masked first
    assert r.sis.tolist() == want
    assert r.sis_score == {1: 0.75, 2: 0.75, 3: 0.9375}[k]


@pytest.mark.timeout(30)  # a collection that never ends fails here in seconds
@pytest.mark.parametrize("run", EXACT_AND_REFERENCE, ids=["fast", "reference"])
def test_exact_ties_and_a_collection_round_starting_at_tau(run):
    # every pixel weighs 0.25: all candidates of a step tie, the lowest id is masked first
    model = Dyadic([0.25] * 4).eval()
    (r,) = run(model, ones(1, 2, 2), 0.5, collection=True)
    assert r.order.tolist() == [0, 1, 2, 3] and r.values.tolist() == [0.75, 0.5, 0.25, 0.0]
    assert [c.sis.tolist() for c in r.collection] == [[3, 2], [1, 0]]
    # the second round starts from f = 0.5 = tau exactly: it runs (>=), on features 0 and 1 only
    assert [c.score for c in r.collection] == [1.0, 0.5]
    assert r.collection[1].order.tolist() == [0, 1] and r.collection[1].values.tolist() == [0.25, 0.0]
    assert [c.sis_score for c in r.collection] == [0.5, 0.5]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("run", GRADIENT_AND_REFERENCE, ids=["fast", "reference"])
def test_gradient_ties_and_a_collection_round_starting_at_tau(run):
    model = Dyadic([0.25] * 4).eval()
    (r,) = run(model, ones(1, 2, 2), 0.5, 1, collection=True)
    assert r.order.tolist() == [0, 1, 2, 3]  # equal gradients: the lowest id first
    assert [c.sis.tolist() for c in r.collection] == [[3, 2], [1, 0]]
    assert [c.score for c in r.collection] == [1.0, 0.5]


def test_sufficient_subset_at_tau_and_ranking_ties():
    model = Dyadic([0.5, 0.25, 0.125, 0.0625]).eval()
    x = ones(2, 2, 2)
    ranking = torch.tensor([[4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    res = of.sufficient_subset(model, x, ranking, 0.75, outputs="probabilities", refine=False)
    assert res[0].order.tolist() == [0, 1, 2, 3]
    assert res[0].sis.tolist() == [0, 1] and res[0].sis_score == 0.75  # 0.5 + 0.25 = tau exactly
    assert res[1].order.tolist() == [3, 2, 1, 0]  # equal scores: the higher index first
    assert res[1].sis.tolist() == [3, 2, 1, 0] and res[1].sis_score == 0.9375  # 0.0625+0.125+0.25 < 0.75
    step2 = of.sufficient_subset(model, x, ranking, 0.75, outputs="probabilities", step=3, refine=False)
    assert step2[0].sis.tolist() == [0, 1, 2]  # sizes 3, 4: the first size that passes
    none = of.sufficient_subset(model, x, ranking, 1.0, outputs="probabilities", refine=False)
    assert all(r.sis is None for r in none)  # even all features (0.9375) stay below tau


@pytest.mark.parametrize("method", ["exact", "gradient", "reference", "reference-gradient"])
def test_all_masked_input_passes_gives_one_empty_set(method):
    # constant f = 0.75 = tau: the fully masked input already passes, so the SIS is empty
    model = Dyadic([0.0] * 9, bias=0.75).eval()
    x = torch.rand(2, 1, 3, 3, dtype=torch.float64)
    run = {
        "exact": lambda: of.fast_sis(model, x, 0.75, outputs="probabilities", collection=True),
        "gradient": lambda: of.fast_sis(model, x, 0.75, method="gradient", outputs="probabilities", collection=True,
                                        options=of.GradientOptions(k=4)),
        "reference": lambda: reference.sis(model, x, 0.75, outputs="probabilities", collection=True),
        "reference-gradient": lambda: reference.gradient_sis(model, x, 0.75, k=4, outputs="probabilities",
                                                             collection=True),
    }[method]
    for r in run():
        assert r.sis.tolist() == [] and not r.mask.any() and r.sis_score == 0.75
        assert len(r.collection) == 1 and r.collection[0] is r
        assert r.order.tolist() == list(range(9))  # every candidate ties: ascending ids


@pytest.mark.parametrize("method", ["exact", "gradient"])
def test_a_single_feature(method):
    model = Dyadic([1.0]).eval()
    x = ones(1, 1, 1)
    opts = of.GradientOptions(k=5) if method == "gradient" else None
    (r,) = of.fast_sis(model, x, 1.0, method=method, outputs="probabilities", collection=True, options=opts)
    assert r.order.tolist() == [0] and r.values.tolist() == [0.0]
    assert r.sis.tolist() == [0] and r.sis_score == 1.0 and r.mask.tolist() == [[True]]
    assert len(r.collection) == 1
    (unconfident,) = of.fast_sis(Dyadic([0.5]).eval(), x, 0.75, method=method, outputs="probabilities", options=opts)
    assert unconfident.sis is None and unconfident.mask is None and unconfident.score == 0.5


def test_a_single_feature_responsibility():
    model = Dyadic([1.0]).eval()
    (r,) = of.fast_sis(model, ones(1, 1, 1), method="responsibility", outputs="probabilities")
    assert r.sis.tolist() == [0] and r.sis_score == 1.0  # the whole (one-pixel) image
    (m,) = of.responsibility(model, ones(1, 1, 1), outputs="probabilities", iterations=20)
    assert m.queries == 0 and m.map.tolist() == [[0.0]]  # below the minimum box: no descent


@pytest.mark.parametrize("method", ["exact", "gradient"])
def test_image_already_at_the_mask_value(method):
    model = Dyadic([0.25] * 4, bias=0.5).eval()
    opts = of.GradientOptions(k=3) if method == "gradient" else None
    for x, mv, f in ((torch.zeros(1, 1, 2, 2, dtype=torch.float64), 0.0, 0.5),
                     (torch.full((1, 1, 2, 2), 0.25, dtype=torch.float64), torch.full((1, 1, 2, 2), 0.25), 0.75)):
        (r,) = of.fast_sis(model, x, f, method=method, baselines=mv, outputs="probabilities", options=opts)
        # masking changes nothing: f stays f(x) = tau at every step, so the fully masked input passes
        assert r.score == f and set(r.values.tolist()) == {f}
        assert r.sis.tolist() == [] and r.order.tolist() == [0, 1, 2, 3]
    (r,) = of.fast_sis(model, torch.zeros(1, 1, 2, 2, dtype=torch.float64), 0.6, method=method,
                       outputs="probabilities", options=opts)
    assert r.sis is None and r.values.tolist() == [0.5] * r.values.numel()


def test_find_sis_boundaries_by_hand():
    order = torch.tensor([3, 1, 0, 2])
    values = torch.tensor([0.9, 0.5, 0.9, 0.1], dtype=torch.float64)
    assert find_sis(order, values, 0.9).tolist() == [2]  # values[2] == tau stops the scan
    assert find_sis(order, values, 0.9000001).tolist() == [2, 0, 1, 3]  # nothing reaches tau: all
    assert find_sis(order, values, 0.1).tolist() == []  # the fully masked value reaches tau
    assert find_sis(order[:1], values[:1], 0.95).tolist() == [3]
    assert find_sis(order[:0], values[:0], 0.5).tolist() == []
    with pytest.raises(ValueError, match="^order and values must be 1-D and of the same length$"):
        find_sis(order, values[:3], 0.5)
    with pytest.raises(ValueError, match="^order and values must be 1-D and of the same length$"):
        find_sis(order.view(2, 2), values.view(2, 2), 0.5)


def test_sis_score_reads_the_value_before_the_sis():
    values = torch.tensor([0.95, 0.5, 0.4, 0.1], dtype=torch.float64)
    assert sis_score(values, 0.99, 0) == 0.1  # empty SIS: everything masked
    assert sis_score(values, 0.99, 1) == 0.4
    assert sis_score(values, 0.99, 3) == 0.95  # all but the first masked feature
    assert sis_score(values, 0.99, 4) == 0.99  # every feature: f of the whole input


def test_every_set_of_every_round_is_sufficient_on_the_planted_models():
    model = Dyadic([0.25] * 4).eval()
    x = ones(1, 2, 2)
    for res in (of.fast_sis(model, x, 0.5, outputs="probabilities", collection=True),
                of.fast_sis(model, x, 0.5, method="gradient", outputs="probabilities", collection=True,
                            options=of.GradientOptions(k=1))):
        assert assert_sets_sufficient(model, x, res, outputs="probabilities") == 2


class Counting(nn.Module):
    """Vectors [B, 100] of ones; class 0 gets (features present + 0.25) / 101 (never 0.5); counts the rows."""

    def __init__(self):
        super().__init__()
        self.rows = 0

    def forward(self, x):
        self.rows += x.shape[0]
        s = (x.sum(1) + 0.25) / 101
        return torch.stack([s, 1 - s], 1)


@pytest.mark.parametrize("criterion,size", [("threshold", 91), ("top1", 51)])
def test_first_passing_prefix_chunks_and_criteria(criterion, size):
    # sizes 1..100; on a CPU the prefixes are tried in chunks of 2, 4, 8, 16, 32, 32 (prefix.py), so the
    # answer at size 91 (index 90) costs 2+4+8+16+32+32 = 94 candidates, as does size 51 (index 50: 62)
    model = Counting().eval()
    x = torch.ones(1, 100, dtype=torch.float64)
    ranking = -torch.arange(100.0)[None]  # feature 0 first
    tau = 0.9 if criterion == "threshold" else None  # the top-1 criterion has no threshold
    (r,) = of.sufficient_subset(model, x, ranking, tau, criterion=criterion, outputs="probabilities", batch_size=1000,
                                refine=False)
    assert r.sis.tolist() == list(range(size))
    assert r.sis_score == pytest.approx((size + 0.25) / 101, rel=1e-15)
    assert model.rows == 1 + {91: 94, 51: 62}[size]  # the unmasked input, then the candidates
