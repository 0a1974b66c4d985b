"""Exact SIS with ``score_dtype`` (overinterp_fast/methods/low_precision.py): candidates scored in bfloat16 first, the
result still the full dtype's.

The planted models are dyadic (``Dyadic``: f is a sum of weights of the features present, inputs all ones), so every
full-dtype value, tie and set is worked out by hand with exact fractions; their near-ties lie below bfloat16's
resolution, so that a run scored in bfloat16 alone (``naive_bf16`` below, written out here) decides them otherwise.
"""
import copy
from fractions import Fraction

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.attr import exact as attr_exact
from overinterp_fast.methods import exact, low_precision, reference
from overinterp_fast.runtime import sync
from helpers import Dyadic, assert_same_lists, assert_same_result, make_cnn, make_images, whole_message

BF16 = of.ExactOptions(score_dtype=torch.bfloat16)
DELTA = 2.0 ** -16  # below half a bfloat16 ulp of every base weight here: bfloat16 drops it


def pair_weights(pairs: int, unit: float) -> list[float]:
    """Features 2k and 2k + 1 weigh (k + 1) * unit + DELTA and (k + 1) * unit: a near-tie per pair, the lower id
    the heavier (so the full dtype masks 2k + 1 first, and bfloat16, seeing a tie, masks 2k first)."""
    return [w for k in range(pairs) for w in ((k + 1) * unit + DELTA, (k + 1) * unit)]


def ones(p: int, side: int) -> torch.Tensor:
    return torch.ones(1, 1, side, p // side, dtype=torch.float64)


def naive_bf16(model: nn.Module, x: torch.Tensor, tau: float) -> tuple[list[int], list[float], list[int]]:
    """Backward selection and FindSIS with every score in bfloat16 (a copy of the model; no re-scoring): (order,
    values, sis) of image 0, class 0, pixel features of a [1, 1, H, W] input."""
    low = copy.deepcopy(model).to(torch.bfloat16)
    p = x[0].numel()
    present, order, values = set(range(p)), [], []
    with torch.no_grad():
        while present:
            best = None
            for r in sorted(present):  # ascending ids: the first of equal scores wins
                keep = torch.tensor([j in present and j != r for j in range(p)]).view(x.shape)
                f = float(low(torch.where(keep, x, 0).to(torch.bfloat16))[0, 0])
                if best is None or f > best[1]:
                    best = (r, f)
            order.append(best[0])
            values.append(best[1])
            present.remove(best[0])
    last = max(t for t in range(p) if values[t] >= tau)
    return order, values, order[last + 1:][::-1]


def by_hand(weights: list[float]) -> tuple[list[int], list[Fraction]]:
    """The full-dtype backward selection of a dyadic model on ones: the lightest feature goes first (ties: the
    lowest id); values[t] is the weight of what is left."""
    order = sorted(range(len(weights)), key=lambda j: (Fraction(weights[j]), j))
    left = [sum(Fraction(weights[j]) for j in order[t + 1:]) for t in range(len(order))]
    return order, left


def same(a, b, collection=False):
    assert_same_lists(a, b, assert_same_result, collection)


MAX_SHARE = low_precision.MAX_SHARE  # the module's, for the tests of the decline


@pytest.fixture(autouse=True)
def never_declined(monkeypatch):
    """The planted models here have p <= 64 features, where a K of RESCORE_MIN alone re-scores more than
    MAX_SHARE of a round and the low dtype would be declined: the tests of the mechanism keep it on (the tests of
    the decline set MAX_SHARE back)."""
    monkeypatch.setattr(low_precision, "MAX_SHARE", 1.0)


# ----------------------------------------------------------------------------------------------------
# near-ties and a value at tau
# ----------------------------------------------------------------------------------------------------

W16 = pair_weights(8, 1 / 128)  # 16 features (a 4 x 4 image)
TAU16 = W16[14] + W16[15]  # = f of the last pair alone: 1/8 + DELTA, which bfloat16 rounds to 1/8 < tau


def test_near_ties_and_a_value_at_tau_naive_bf16_is_wrong_score_dtype_is_exact():
    model, x = Dyadic(W16).eval(), ones(16, 4)
    order, left = by_hand(W16)
    assert order == [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14]
    assert left[13] == Fraction(TAU16) and left[14] < Fraction(TAU16)  # FindSIS stops at t = 13: SIS {14, 15}

    n_order, n_values, n_sis = naive_bf16(model, x, TAU16)
    assert n_order == list(range(16))  # every pair a tie in bfloat16: the lower id first
    assert n_values[13] == 0.125 < TAU16 and n_sis == [15, 14, 13]  # the value at tau falls below it

    for opts in (BF16, None):  # score_dtype=bfloat16 and the plain run: the hand-built answer
        (r,) = of.fast_sis(model, x, TAU16, outputs="probabilities", batch_size=7, options=opts)
        assert r.order.tolist() == order and r.order.tolist() != n_order
        assert [Fraction(v) for v in r.values.tolist()] == left  # full-dtype values, exactly
        assert r.sis.tolist() == [14, 15] and r.sis_score == TAU16 and r.sis.tolist() != n_sis
    (ref,) = reference.sis(model, x, TAU16, outputs="probabilities")
    (r,) = of.fast_sis(model, x, TAU16, outputs="probabilities", batch_size=7, options=BF16)
    same([r], [ref])
    # m: the floor 2 * eps(bf16) * max f (about 0.0087) beats 4 x the measured error (8 DELTA); within m of the first
    # step's best lie pairs 0 and 1: K = max(8, 2 * 4) = 8. Steps with 16..9 features run in bfloat16, each
    # re-scoring 8 (the 9th best is 4/128 below the best: every step is decided); the last 8 steps run in full.
    assert r.rescored == 8 * 8


def test_float16_and_collections_equal_the_full_run():
    model, x = Dyadic(W16).eval(), ones(16, 4)
    want = of.fast_sis(model, x, 0.25, outputs="probabilities", collection=True, batch_size=5)
    assert len(want[0].collection) >= 2
    for dtype in (torch.bfloat16, torch.float16):
        got = of.fast_sis(model, x, 0.25, outputs="probabilities", collection=True, batch_size=5,
                          options=of.ExactOptions(score_dtype=dtype))
        same(got, want, collection=True)
        assert got[0].rescored > 0


# ----------------------------------------------------------------------------------------------------
# random small CNNs
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rescore_min", [2, low_precision.RESCORE_MIN])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_cnns_equal_the_plain_run(monkeypatch, seed, rescore_min):
    monkeypatch.setattr(low_precision, "RESCORE_MIN", rescore_min)  # 2: more steps in bfloat16
    model, x = make_cnn(seed), make_images(3, seed=seed + 30)
    with torch.no_grad():
        top = torch.softmax(model(x), 1).max(1).values.sort().values
    tau = float(top[0] + top[1]) / 2  # some images pass, some do not
    want = of.fast_sis(model, x, tau, collection=True, batch_size=23)
    got = of.fast_sis(model, x, tau, collection=True, batch_size=23, options=BF16)
    same(got, want, collection=True)
    assert sum(c.rescored for r in got for c in [r, *r.collection]) > 0
    assert all(c.rescored == 0 for r in want for c in [r, *r.collection])


@pytest.mark.parametrize("seed", [4, 5])
def test_float32_cnns_same_order_and_sets(seed):
    model, x = make_cnn(seed, torch.float32), make_images(3, seed=seed, dtype=torch.float32)
    want = of.fast_sis(model, x, 0.3, batch_size=40)
    got = of.fast_sis(model, x, 0.3, batch_size=40, options=BF16)
    for a, b in zip(got, want):
        assert torch.equal(a.order, b.order) and torch.equal(a.values, b.values)
        assert (a.sis is None and b.sis is None) or torch.equal(a.sis, b.sis)


# ----------------------------------------------------------------------------------------------------
# the plain path, the re-scored count
# ----------------------------------------------------------------------------------------------------

def test_none_or_the_images_dtype_is_the_plain_path(monkeypatch):
    model, x = make_cnn(0), make_images(2)
    with_low = of.fast_sis(model, x, 0.3, collection=True, options=BF16)
    assert with_low[0].rescored > 0

    def refuse(*a, **k):
        raise AssertionError("no low-precision scoring on the plain path")

    monkeypatch.setattr(attr_exact, "LowPrecision", refuse)
    for opts in (None, of.ExactOptions(score_dtype=torch.float64)):
        got = of.fast_sis(model, x, 0.3, collection=True, options=opts)
        assert all(c.rescored == 0 for r in got for c in [r, *r.collection])
        same(got, with_low, collection=True)
    (r,) = reference.sis(model, x[:1], 0.3)
    assert r.rescored is None  # other producers of results leave it unset


# ----------------------------------------------------------------------------------------------------
# an unsafe step: the round runs again from it in the full dtype
# ----------------------------------------------------------------------------------------------------

class LowBias(nn.Module):
    """A dyadic model that adds ``bonus`` to f while feature ``j`` is present, but only in a low dtype: its
    bfloat16 copy ranks "mask j" (the full dtype's best first step) far down."""

    def __init__(self, weights, j, bonus):
        super().__init__()
        self.inner, self.j, self.bonus = Dyadic(weights), j, bonus

    def forward(self, x):
        out = self.inner(x)
        if x.dtype == torch.float64:
            return out
        s = out[:, 0] + self.bonus * x.flatten(1)[:, self.j]
        return torch.stack([s, 1 - s], 1)


def test_an_unsafe_step_runs_again_in_full_and_m_is_measured_again(monkeypatch):
    weights = [(k + 1) / 4096 for k in range(64)]
    weights[5] = 1 / 8192  # the lightest: the full dtype masks feature 5 first
    model, x = LowBias(weights, j=5, bonus=1 / 16).eval(), ones(64, 8)
    made, redone = [], []
    measure, redo = low_precision.LowPrecision.measure, exact._ExactRun.redo

    def tiny_margin(self, full, present):
        assert measure(self, full, present)[1] > 1  # the honest m (4 x the bonus) holds more
        made.append(self)
        self.margin = torch.full_like(self.margin, 1e-30)  # as if the measurement had seen no error:
        return torch.tensor([1e-30, 1.0], dtype=torch.float64)  # only each step's best within m

    monkeypatch.setattr(low_precision.LowPrecision, "measure", tiny_margin)
    monkeypatch.setattr(exact._ExactRun, "redo", lambda run, i, rest, t: redone.append(t) or redo(run, i, rest, t))
    with sync.counting() as reads:
        (r,) = of.fast_sis(model, x, 0.5, outputs="probabilities", batch_size=6, options=BF16)
    order, left = by_hand(weights)
    assert order[0] == 5 and r.order.tolist() == order and [Fraction(v) for v in r.values.tolist()] == left
    assert redone == [0]  # the first step was already unsafe: the whole round again, in full
    # the round ended twice (once in bfloat16, once in full: K grew to 32 < 64, but the rest of an unsafe round
    # runs in full, so it cannot fail again)
    assert reads.by_label["round end"] == 2
    # re-scored: K (= 8: within the tiny m only each step's best) per bfloat16 step (counts 64..9), then every
    # candidate of the 64 steps run again
    assert r.rescored == 8 * 56 + 64 * 65 // 2
    (low,) = made
    assert float(low.margin) >= 4 * (1 / 16 - 1e-12)  # m measured again from the re-scored errors (the bonus)
    assert low.rescore == 32  # K grew (x 4)


class NanInBf16(nn.Module):
    """make_cnn(0), but its bfloat16 copy returns NaN for every third candidate."""

    def __init__(self):
        super().__init__()
        self.inner = make_cnn(0)

    def forward(self, x):
        out = self.inner(x)
        if x.dtype == torch.bfloat16:
            out = out.clone()
            out[::3] = torch.nan
        return out


class InfInBf16(nn.Module):
    """A dyadic model whose low-dtype copy scores -inf once features 5 and 6 (the two lightest) are both masked:
    the full dtype's best candidate of the second step ranks last in bfloat16 (the first step, where m is measured,
    sees no -inf)."""

    def __init__(self, weights):
        super().__init__()
        self.inner = Dyadic(weights)

    def forward(self, x):
        out = self.inner(x)
        if x.dtype == torch.float64:
            return out
        gone = (x.flatten(1)[:, 5] == 0) & (x.flatten(1)[:, 6] == 0)
        s = torch.where(gone, -torch.inf, out[:, 0])
        return torch.stack([s, 1 - s], 1)


def test_a_non_finite_low_score_makes_its_step_unsafe():
    weights = [(k + 1) / 128 for k in range(16)]  # f > 1/2: class 0 is the target
    weights[5], weights[6] = 1 / 1024, 1 / 512
    (r,) = of.fast_sis(InfInBf16(weights).eval(), ones(16, 4), 0.5, outputs="probabilities", batch_size=5,
                       options=BF16)
    order, left = by_hand(weights)
    assert order[:2] == [5, 6] and r.order.tolist() == order and [Fraction(v) for v in r.values.tolist()] == left


def test_non_finite_low_scores_are_not_trusted_nor_raised():
    model, x = NanInBf16().eval(), make_images(2)
    want = of.fast_sis(model.inner, x, 0.3, collection=True)
    got = of.fast_sis(model, x, 0.3, collection=True, options=BF16)
    same(got, want, collection=True)


# ----------------------------------------------------------------------------------------------------
# no read of the device per step
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pairs,side,unit", [(8, 4, 1 / 128), (18, 6, 1 / 512)])
def test_reads_per_round_do_not_grow_with_p(pairs, side, unit):
    """One image, one round: the start, the round's end and the end, whatever p (16 or 36) and however many of
    its steps run in bfloat16."""
    w = pair_weights(pairs, unit)
    with sync.counting() as reads:
        (r,) = of.fast_sis(Dyadic(w).eval(), ones(2 * pairs, side), 0.2, outputs="probabilities", batch_size=9,
                           options=BF16)
    assert r.order.tolist() == by_hand(w)[0] and r.rescored > 0
    assert reads.by_label == {"start": 1, "round end": 1, "end": 1}


# ----------------------------------------------------------------------------------------------------
# what is refused
# ----------------------------------------------------------------------------------------------------

def test_refusals_are_one_line_errors(tmp_path):
    model, x = make_cnn(0), make_images(2)
    with pytest.raises(ValueError, match=whole_message(
            "score_dtype must be torch.bfloat16, torch.float16, None or the images' dtype (torch.float64), got "
            "torch.float32")):
        of.fast_sis(model, x, options=of.ExactOptions(score_dtype=torch.float32))
    with pytest.raises(ValueError, match=whole_message(
            "score_dtype is not combined with incremental=True (incremental inference runs in the images' dtype); "
            "leave incremental None or False")):
        of.ExactSIS(model, score_dtype=torch.bfloat16, incremental=True)
    with pytest.raises(ValueError, match=whole_message(
            "score_dtype runs a copy of the torch model; engine must be 'auto' or 'torch', got 'onnxruntime'")):
        of.fast_sis(model, x, engine="onnxruntime", options=BF16)
    with pytest.raises(ValueError, match="^score_dtype needs a torch.nn.Module .*, got function$"):
        of.fast_sis(lambda t: model(t), x, options=BF16)
    m32, x32 = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    path = str(tmp_path / "m.onnx")
    of.export_onnx(m32, path, x32)
    with pytest.raises(ValueError, match="^score_dtype scores candidates in a copy of the torch model .* ONNX models "
                                         r"are not supported \(leave score_dtype None\)$"):
        of.fast_sis(path, x32, options=BF16)


# ----------------------------------------------------------------------------------------------------
# one step's pick and check, on tensors built by hand
# ----------------------------------------------------------------------------------------------------

def bare(rescore: int, margin: float) -> low_precision.LowPrecision:
    """A LowPrecision without a model: K and m only (what pick and settle read)."""
    low = object.__new__(low_precision.LowPrecision)
    low.dtype, low.rescore, low.margin = torch.bfloat16, rescore, torch.tensor(margin, dtype=torch.float64)
    low.p = 5  # one_step's image
    return low


def one_step(low, count: int, low_scores: list[float], full: list[float]):
    """Image 0 of p = 5 with ``count`` features at slots [3, 0, 4, 1][:count] (feature 2 absent), low scores by
    slot, and the full scores of the re-scored features: (re-scored features, scores row, unsafe step)."""
    p, feats = 5, [3, 0, 4, 1][:count]
    remaining = torch.full((1, p + 1), -1, dtype=torch.int64)
    remaining[0, :count] = torch.tensor(feats)
    present = torch.zeros(1, p, dtype=torch.bool)
    present[0, feats] = True
    scores = torch.full((1, p + 1), 7.0, dtype=torch.float64)  # stale values past the count must not matter
    scores[0, :count] = torch.tensor(low_scores, dtype=torch.float64)
    rows, counts, steps = torch.tensor([0]), torch.tensor([count]), torch.tensor([2])
    pos, rank = (torch.from_numpy(a) for a in low.plan([count]))
    picked = low.pick(scores, rows, pos, rank, present, remaining)
    unsafe_step = torch.tensor([p])
    low.settle(picked, torch.tensor(full, dtype=torch.float64), scores, rows, counts, steps, pos, rank, unsafe_step)
    return picked.rescored.tolist(), scores[0].tolist(), int(unsafe_step[0])


def test_pick_ties_to_the_lowest_id_and_settle_writes_full_scores_only_for_the_re_scored():
    # low by feature: f3 0.5, f0 0.5 (a tie: f0 first), f4 0.25, f1 0.375. K = 2: f0 and f3 re-scored; the third
    # best low score (f1, 0.375) + m = 0.385 < min(best low 0.5, best full 0.46), errors 0.05 and 0.04 > m: unsafe
    low = bare(2, 0.01)
    rescored, row, unsafe = one_step(low, 4, [0.5, 0.5, 0.25, 0.375], [0.45, 0.46])
    assert rescored == [0, 3]
    assert row == [0.46, 0.45, -torch.inf, -torch.inf, -torch.inf, 7.0]  # by slot: f3, f0, f4, f1, none, input
    assert unsafe == 2  # the error alone made it unsafe
    assert float(low.margin) == pytest.approx(4 * 0.05)  # measured again: 0.05 > m / 2


LOW4 = [0.5, 0.5, 0.25, 0.375]  # by slot: f3, f0, f4, f1 (dyadic: every comparison below is exact)


@pytest.mark.parametrize("count,margin,low_scores,full,unsafe,margin_after", [
    # decided (0.375 + 1/64 < 0.4921875, errors <= m); an error of 1/64 > m / 2: m = 4/64
    (4, 1 / 64, LOW4, [0.5 - 1 / 128, 0.5 - 1 / 64], 5, 1 / 16),
    # 0.375 + 1/8 >= the best full score 0.46875: unsafe; the error 1/16 is not above m / 2: m kept
    (4, 1 / 8, LOW4, [0.5 - 1 / 16, 0.5 - 1 / 32], 2, 1 / 8),
    (4, 1 / 4, LOW4, [0.5, 0.5], 2, 1 / 4),  # 0.375 + 1/4 >= the best low score 0.5: unsafe
    (3, 1 / 8, LOW4[:3], [0.5, 0.5], 5, 1 / 8),  # count = K + 1: f4 not re-scored, 0.25 + 1/8 < 0.5: decided
    (3, 1 / 4, LOW4[:3], [0.5, 0.5], 2, 1 / 4),  # 0.25 + 1/4 = 0.5 is not strictly below: unsafe
    # the best full score 0.625 is above 0.25 + 1/4, the best low score 0.5 is not: f4 might lie within m of the
    # step's best, and was not re-scored: unsafe
    (3, 1 / 4, LOW4[:3], [0.625, 0.625], 2, 1 / 4),
    (2, 1 / 4, LOW4[:2], [0.25, 0.25], 5, 1.0),  # count = K: all re-scored, decided whatever the errors
    (4, 1 / 64, [0.5, 0.5, -torch.inf, 0.375], [0.5 - 1 / 128, 0.5 - 1 / 64], 2, 1 / 16),  # a non-finite score
])
def test_settle_check(count, margin, low_scores, full, unsafe, margin_after):
    low = bare(2, margin)
    assert one_step(low, count, low_scores, full)[2] == unsafe
    assert float(low.margin) == margin_after


# ----------------------------------------------------------------------------------------------------
# ResNet-20 (the CIFAR-10 workload's model) in float32, bfloat16 for real on the CPU; the decline; the run's info
# ----------------------------------------------------------------------------------------------------

def resnet20_case(n=1, side=8, head=1.0):
    """The zoo's ResNet-20 (seed 0, random weights, its last layer's weights times ``head``, float32) and ``n``
    CIFAR-shaped images of ``side`` x ``side``."""
    from overinterp_fast.zoo.cifar import ResNet20

    torch.manual_seed(0)
    model = ResNet20().eval()
    with torch.no_grad():
        model.fc.weight *= head
    return model, make_images(n, h=side, w=side, seed=7, dtype=torch.float32)


@pytest.mark.timeout(120)  # under a load of 8 on 2 cores each case took about 30 s (2 s on a quiet machine)
@pytest.mark.parametrize("channels_last,rescore_min", [(False, 1), (True, low_precision.RESCORE_MIN)])
def test_resnet20_in_bfloat16_gives_float32_s_orders_values_and_sets(monkeypatch, channels_last, rescore_min):
    """A head 10x sharper: f 0.19; K from the first step (at least ``rescore_min``: 1 lets bfloat16 decide alone
    wherever the check allows); steps that fail the check run again in float32 and K grows (on this model bfloat16
    cannot decide most steps). The results are float32's all the same."""
    monkeypatch.setattr(low_precision, "RESCORE_MIN", rescore_min)
    model, x = resnet20_case(head=10.0)
    with torch.no_grad():
        # every image has a SIS (in either format: channels_last moves f in its last bits)
        tau = float(torch.softmax(model(x), 1).max(1).values.min()) * (1 - 1e-6)
    plain = of.ExactOptions(incremental=False, channels_last=channels_last)  # the same format for the full dtype
    want = of.fast_sis(model, x, tau, engine="torch", batch_size=96, options=plain)
    got = of.fast_sis(model, x, tau, engine="torch", batch_size=96,
                      options=of.ExactOptions(score_dtype=torch.bfloat16, channels_last=channels_last))
    for a, b in zip(got, want):
        assert torch.equal(a.order, b.order) and torch.equal(a.values, b.values) and torch.equal(a.sis, b.sis)
    info = got[0].info
    assert info.low["channels_last"] is channels_last and info.low["score_dtype"] == "bfloat16"
    assert not info.low["declined"] and info.rescored > 0 and info.candidates == 64 * 65 // 2
    assert info.rescored == sum(r.rescored for r in got)
    assert want[0].info.rescored == 0 and want[0].info.low is None


def test_rescored_share_by_hand():
    assert low_precision.rescored_share(8, 256) == (8 * 256 - 28) / (256 * 257 / 2)  # steps of 8..1: all of them
    assert low_precision.rescored_share(64, 64) == 1.0
    assert low_precision.rescored_share(1, 4) == 4 / 10


@pytest.mark.timeout(120)  # as the test above
def test_the_low_dtype_is_declined_where_the_first_step_predicts_it_cannot_pay(monkeypatch):
    """A ResNet-20 of random weights is near-uniform (f about 0.11): every candidate of the first step lies within m
    in bfloat16, K = p, all of a round would be re-scored; every step then runs in float32, with the plain run's
    results, and the low copy scores the measured step only."""
    monkeypatch.setattr(low_precision, "MAX_SHARE", MAX_SHARE)
    model, x = resnet20_case()
    low_rows = []

    class Counting(low_precision.CandidateEvaluator):  # the low copy's evaluator, counting its rows
        def __call__(self, present, image, row, feature, check_indices=None):
            low_rows.append(len(image))
            return super().__call__(present, image, row, feature, check_indices)

    monkeypatch.setattr(low_precision, "CandidateEvaluator", Counting)
    got = of.fast_sis(model, x, 0.1, engine="torch", batch_size=96, options=BF16)
    want = of.fast_sis(model, x, 0.1, engine="torch", batch_size=96, options=of.ExactOptions(incremental=False))
    assert [(r.order.tolist(), r.values.tolist()) for r in got] == [(r.order.tolist(), r.values.tolist()) for r in want]
    low = got[0].info.low
    assert low["declined"] and low["rescore_k"] == 64 and low["predicted_share"] == 1.0 > MAX_SHARE
    assert got[0].info.rescored == 0
    assert low_rows == [64]  # the measurement: the whole first step; nothing after it
