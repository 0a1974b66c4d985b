"""fast_sis (exact) against the in-package reference transcription of sis.py.

exact_sis called directly on planted dyadic models: every order, value, set, score and round (and the progress bar's
totals) written out by hand. The model outputs probabilities that are sums of dyadic weights of {0, 1} inputs, so
every f is exact in float64 and every tie is exact (the lowest feature id is masked first).

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import contextlib

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.runtime import model_state
from overinterp_fast.methods import exact, exact_step, reference
from overinterp_fast.runtime.batching import CandidateEvaluator, ChunkRunner
from overinterp_fast.runtime.inputs import prepare
from overinterp_fast.runtime.model import ModelFn
from helpers import Dyadic, OOMAbove, assert_same_lists, assert_same_result, assert_sets_sufficient, cuda, sync_errors
from helpers import make_cnn, make_images


def assert_same(res_a, res_b, collection=False):
    assert_same_lists(res_a, res_b, assert_same_result, collection)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float64_equals_reference(seed):
    model = make_cnn(seed)
    images = make_images(5, seed=seed + 10)
    with torch.no_grad():
        scores = torch.softmax(model(images), 1).max(1).values
    top = scores.sort().values
    tau = float(top[1] + top[2]) / 2  # some images pass, some do not; none sits at tau
    fast = of.fast_sis(model, images, tau, batch_size=64)
    ref = reference.sis(model, images, tau)
    assert_same(fast, ref)
    assert any(r.sis is None for r in fast) and any(r.sis is not None and r.sis.numel() > 0 for r in fast)
    for r, f in zip(fast, scores.tolist()):
        assert r.order.shape == (25,) and r.values.shape == (25,) and r.values.dtype == torch.float64
        assert sorted(r.order.tolist()) == list(range(25))
        assert r.score == pytest.approx(f, rel=1e-12) and r.threshold == tau
        if r.sis is None:
            assert f < tau and r.mask is None and r.sis_score is None
        else:
            assert f >= tau and r.mask.shape == (5, 5) and r.mask.dtype == torch.bool
            # the SIS is the tail of the order after the last value that reaches tau (docs: algorithms.md, Exact SIS, FindSIS)
            last = max([t for t in range(25) if r.values[t] >= tau], default=-1)
            assert r.sis.tolist() == r.order[last + 1 :].flip(0).tolist()
    assert assert_sets_sufficient(model, images, fast) == sum(r.sis is not None for r in fast)


@pytest.mark.parametrize("seed", [0, 3])
def test_float64_collection_equals_reference(seed):
    model = make_cnn(seed)
    images = make_images(4, seed=seed + 20)
    tau = 0.25
    fast = of.fast_sis(model, images, tau, collection=True, batch_size=50)
    ref = reference.sis(model, images, tau, collection=True)
    assert_same(fast, ref, collection=True)
    assert max(len(r.collection) for r in fast) >= 2, "the case should exercise several rounds"
    for r in fast:
        if r.sis is None:
            assert r.collection == []
            continue
        seen = set()
        for c in r.collection:  # each round runs on what the earlier rounds left
            assert c.score >= tau and sorted(c.order.tolist()) == sorted(set(range(25)) - seen)
            seen |= set(c.sis.tolist())
    assert assert_sets_sufficient(model, images, fast) >= 5  # disjoint, each sufficient alone


def test_float32_sis_equal_and_divergence_only_at_near_ties():
    model = make_cnn(5, torch.float32)
    images = make_images(6, seed=7, dtype=torch.float32)
    tau = 0.3
    fast = of.fast_sis(model, images, tau, batch_size=40)
    ref = reference.sis(model, images, tau)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert torch.equal(a.sis, b.sis)
        diff = (a.order != b.order).nonzero()
        if diff.numel():
            t = int(diff[0])
            present = torch.ones(25, dtype=torch.bool)
            present[b.order[:t]] = False
            pair = []
            for feat in (int(a.order[t]), int(b.order[t])):
                keep = present.clone()
                keep[feat] = False
                x = torch.where(keep.view(5, 5), images[i], torch.zeros(()))
                pair.append(float(torch.softmax(model(x[None]), 1)[0, b.target]))
            assert abs(pair[0] - pair[1]) <= 1e-6, f"image {i}: divergence at step {t} is no near-tie: {pair}"


def test_packing_invariance(cnn64, images64):
    together = of.fast_sis(cnn64, images64, 0.3, collection=True, batch_size=37)
    for i in range(images64.shape[0]):
        alone = of.fast_sis(cnn64, images64[i : i + 1], 0.3, collection=True, batch_size=25)
        assert_same([together[i]], alone, collection=True)


def test_batch_size_invariance(cnn64, images64):
    a = of.fast_sis(cnn64, images64, 0.3, batch_size=1)
    b = of.fast_sis(cnn64, images64, 0.3, batch_size=10_000)
    c = of.fast_sis(cnn64, images64, 0.3)  # automatic
    assert_same(a, b)
    assert_same(a, c)




def test_out_of_memory_backs_off_with_same_answer(cnn64, images64):
    want = of.fast_sis(cnn64, images64, 0.3, batch_size=64)
    flaky = OOMAbove(cnn64, limit=10).eval()
    with pytest.warns(UserWarning, match="out of memory"):
        got = of.fast_sis(flaky, images64[:, :, :, :], 0.3, batch_size=64)
    assert flaky.ooms >= 1
    assert_same(got, want)
    with pytest.raises(torch.OutOfMemoryError, match="single candidate"):
        of.fast_sis(OOMAbove(cnn64, limit=0).eval(), images64, 0.3, batch_size=4)


def test_patch_features_and_channel_mask_value():
    model = make_cnn(4, h=6, w=6)
    images = make_images(3, h=6, w=6, seed=3)
    patches = (torch.arange(6).view(6, 1) // 2) * 3 + torch.arange(6).view(1, 6) // 2  # 3x3 grid of 2x2 patches
    mv = torch.tensor([0.5, -0.25, 0.1], dtype=torch.float64)
    fast = of.fast_sis(model, images, 0.3, feature_mask=patches, baselines=mv, collection=True)
    ref = reference.sis(model, images, 0.3, feature_mask=patches, baselines=mv, collection=True)
    assert_same(fast, ref, collection=True)
    assert fast[0].order.shape == (9,) and (fast[0].mask is None or fast[0].mask.shape == (9,))
    assert assert_sets_sufficient(model, images, fast, baseline=mv, features=patches) >= 1


def test_per_image_baseline_and_given_target(cnn64, images64):
    baseline = torch.randn(images64.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    target = torch.tensor([0, 1, 2, 3])
    fast = of.fast_sis(cnn64, images64, 0.1, baselines=baseline, target=target)
    ref = reference.sis(cnn64, images64, 0.1, baselines=baseline, target=target)
    assert_same(fast, ref)
    assert [r.target for r in fast] == [0, 1, 2, 3]
    assert assert_sets_sufficient(cnn64, images64, fast, baseline=baseline) >= 1


def test_probability_outputs_and_ensembles(cnn64, images64):
    probs = nn.Sequential(cnn64, nn.Softmax(dim=1)).eval()
    assert_same(of.fast_sis(probs, images64, 0.3, outputs="probabilities"), of.fast_sis(cnn64, images64, 0.3))
    other = make_cnn(8)

    def mean_of_logits(x):  # the ensemble by hand (docs: algorithms.md, Terms)
        return (cnn64(x) + other(x)) / 2

    fast = of.fast_sis([cnn64, other], images64, 0.3, collection=True)
    assert_same(fast, reference.sis(mean_of_logits, images64, 0.3, collection=True), collection=True)
    assert assert_sets_sufficient(mean_of_logits, images64, fast) >= 4
    with torch.no_grad():
        assert torch.equal(of.Ensemble([cnn64, other])(images64), mean_of_logits(images64))


def test_channels_last_images(cnn64, images64):
    cl = images64.contiguous(memory_format=torch.channels_last)
    assert_same(of.fast_sis(cnn64, cl, 0.3), of.fast_sis(cnn64, images64, 0.3))


class FormatRecorder(nn.Module):
    """Wraps a model and records whether each batch it is given is channels_last."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.formats = []

    def forward(self, x):
        self.formats.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return self.model(x)


def test_candidate_batches_follow_a_channels_last_model(cnn64, images64):
    rec = FormatRecorder(make_cnn(0).to(memory_format=torch.channels_last)).eval()
    fast = of.fast_sis(rec, images64, 0.3)  # NCHW images, channels_last model
    assert rec.formats and all(rec.formats)
    assert_same(fast, reference.sis(cnn64, images64, 0.3))
    plain = FormatRecorder(cnn64).eval()
    of.fast_sis(plain, images64, 0.3)
    assert plain.formats and not any(plain.formats)


def test_vector_inputs():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3)).double().eval()
    x = torch.randn(3, 12, dtype=torch.float64)
    fast = of.fast_sis(mlp, x, 0.4, collection=True)
    assert_same(fast, reference.sis(mlp, x, 0.4, collection=True), collection=True)
    assert fast[0].order.shape == (12,)
    assert assert_sets_sufficient(mlp, x, fast) >= 2


class SumModel(nn.Module):
    """Two classes; logit of class 0 = scale * (sum of inputs) + bias."""

    def __init__(self, bias=0.0, scale=1.0):
        super().__init__()
        self.bias, self.scale = bias, scale

    def forward(self, x):
        s = self.scale * x.flatten(1).sum(1) + self.bias
        return torch.stack([s, torch.zeros_like(s)], 1)


def test_empty_sis_when_fully_masked_input_passes():
    x = torch.rand(2, 1, 3, 3, dtype=torch.float64)
    res = of.fast_sis(SumModel(bias=5.0).eval(), x, 0.9, collection=True)
    for r in res:
        assert r.sis is not None and r.sis.numel() == 0 and r.values[-1] >= 0.9
        assert len(r.collection) == 1 and not r.mask.any()
    assert_same(res, reference.sis(SumModel(bias=5.0).eval(), x, 0.9, collection=True), collection=True)


def test_sis_is_every_feature_when_nothing_smaller_suffices():
    x = 0.5 + torch.rand(1, 1, 3, 3, dtype=torch.float64)
    model = SumModel(bias=-2.0).eval()
    tau = float(torch.softmax(model(x), 1)[0, 0])  # any masked feature lowers f below f(x)
    res = of.fast_sis(model, x, tau, collection=True)
    assert res[0].sis.numel() == 9 and res[0].mask.all() and len(res[0].collection) == 1


def test_unconfident_images_get_none_and_others_still_answer(cnn64, images64):
    with torch.no_grad():
        scores = torch.softmax(cnn64(images64), 1).max(1).values
    tau = float(scores.sort().values[1] + 1e-9)
    res = of.fast_sis(cnn64, images64, tau, collection=True)
    for r, s in zip(res, scores.tolist()):
        assert (r.sis is None) == (s < tau)
        assert r.order.numel() == 25
        if r.sis is None:
            assert r.mask is None and r.collection == []


def test_sis_is_sufficient(cnn64, images64):
    assert assert_sets_sufficient(cnn64, images64, of.fast_sis(cnn64, images64, 0.3, collection=True)) >= 4


@cuda
def test_cuda_equals_cpu():
    model = make_cnn(0)
    images = make_images(5)
    cpu = of.fast_sis(model, images, 0.3, collection=True)
    gpu = of.fast_sis(model.cuda(), images.cuda(), 0.3, collection=True)
    assert_same(gpu, cpu, collection=True)


def test_per_image_thresholds(cnn64, images64):
    with torch.no_grad():
        f = torch.softmax(cnn64(images64), 1).max(1).values
    rel = (0.8 * f).tolist()  # relative thresholds: every image has an SIS
    fast = of.fast_sis(cnn64, images64, rel, collection=True)
    assert_same(fast, reference.sis(cnn64, images64, rel, collection=True), collection=True)
    assert all(r.sis is not None for r in fast)
    assert [r.threshold for r in fast] == pytest.approx(rel)
    assert assert_sets_sufficient(cnn64, images64, fast) >= 4
    for i in range(images64.shape[0]):  # same as each image alone with its scalar threshold
        assert_same([fast[i]], of.fast_sis(cnn64, images64[i : i + 1], rel[i], collection=True), collection=True)


# ----------------------------------------------------------------------------------------------------
# exact_sis called directly on planted dyadic models: every order, value, set, score and round
# ----------------------------------------------------------------------------------------------------

W = [0.25, 0.125, 0.25, 0.125, 0.125, 0.125]  # six features (a 2 x 3 image), summing to 1


class Bar:
    """Records what exact_sis tells its progress bar."""

    made = []

    def __init__(self, total, **kw):
        self.total, self.kw, self.n, self.first_total, self.closed = total, kw, 0, total, False
        Bar.made.append(self)

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def run(model, x, thresholds, collection, batch_size, monkeypatch, progress=None, stand_in=None, chunk=1000,
        default_device=None, strict=False):
    Bar.made = []
    monkeypatch.setattr(exact, "tqdm", Bar)
    user = ModelFn(model, outputs="probabilities")
    fn = ModelFn(stand_in, outputs="probabilities") if stand_in is not None else user
    prep = prepare(x)
    with torch.no_grad():
        f0 = user.forward(x)
    targets = f0.argmax(1)
    scores0 = f0.gather(1, targets[:, None]).flatten().double()
    runner = ChunkRunner(chunk, x.device)
    verifier = None
    if stand_in is not None:
        verifier = CandidateEvaluator(user, prep, targets, runner, measure=user.score_and_top1)
    # default_device: torch's default device while exact_sis runs (only exact_sis: the setup above is the caller's)
    # strict: exact_sis (only exact_sis) under torch.cuda.set_sync_debug_mode("error")
    with contextlib.nullcontext() if default_device is None else torch.device(default_device):
        with sync_errors(x.device) if strict else contextlib.nullcontext():
            res = exact.exact_sis(fn, prep, targets, scores0, thresholds, collection, batch_size, runner, progress,
                                  verifier=verifier, engine="planted")
    return res, Bar.made[0]


def images(*rows):
    return torch.tensor(rows, dtype=torch.float64).view(len(rows), 1, 2, 3)


FULL = (1, 1, 1, 1, 1, 1)
HALF = (1, 1, 1, 1, 0, 0)  # f = 0.75


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size,chunk", [(1, 1000), (4, 3), (1000, 1000)])
def test_collections_of_three_images_by_hand(monkeypatch, batch_size, chunk):
    x = images(FULL, HALF, FULL)
    res, bar = run(Dyadic(W), x, [0.375, 0.8, 0.5], True, batch_size, monkeypatch, chunk=chunk)
    a, b, c = res
    # image 0, round 1 from f = 1: the 0.125 pixels go first (ties: lowest id), then 0 and 2
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2]
    assert a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert a.sis.tolist() == [2, 0] and a.sis_score == 0.5 and a.score == 1.0
    assert a.mask.tolist() == [[True, False, True], [False, False, False]]
    assert (a.target, a.threshold, a.engine) == (0, 0.375, "planted")
    # round 2 on {1, 3, 4, 5} from f = 0.5; round 3 on {1} starts at 0.125 < tau: not recorded
    assert len(a.collection) == 2 and a.collection[0] is a
    r2 = a.collection[1]
    assert r2.order.tolist() == [1, 3, 4, 5] and r2.values.tolist() == [0.375, 0.25, 0.125, 0.0]
    assert r2.sis.tolist() == [5, 4, 3] and r2.sis_score == 0.375 and r2.score == 0.5
    assert r2.mask.tolist() == [[False, False, False], [True, True, True]]
    assert (r2.target, r2.threshold, r2.engine) == (0, 0.375, "planted")
    # image 1: f = 0.75 < 0.8, one round (backward selection still runs), no set, no collection
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2]
    assert b.values.tolist() == [0.75, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert b.sis is None and b.mask is None and b.sis_score is None and b.score == 0.75
    assert b.collection == []
    # image 2, tau 0.5: round 2 from f = 0.5 needs all four features (the SIS is the whole round): stop
    assert c.sis.tolist() == [2, 0] and c.sis_score == 0.5
    assert len(c.collection) == 2
    assert c.collection[1].sis.tolist() == [5, 4, 3, 1] and c.collection[1].sis_score == 0.5
    assert c.collection[1].values.tolist() == [0.375, 0.25, 0.125, 0.0]
    # the bar: 3 x 21 candidates in round 1; image 0: 1 + 10 (round 2), 1 (round 3's score, which
    # then fails); image 2: 1 + 10. It ends at its total, with every candidate counted once.
    assert bar.first_total == 63 and bar.total == 63 + 11 + 1 + 11 and bar.n == bar.total and bar.closed
    assert type(bar.first_total) is int and type(bar.total) is int  # a count of candidates, not 63.0
    assert bar.kw == {"unit": "cand", "desc": "exact SIS", "disable": None, "initial": 0}  # a fresh run: from 0


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_without_collection_and_progress_flags(monkeypatch):
    x = images(FULL, HALF)
    res, bar = run(Dyadic(W), x, [0.375, 0.5], False, 7, monkeypatch, progress=True)
    assert [r.sis.tolist() for r in res] == [[2, 0], [2, 0]]
    assert res[1].order.tolist() == [4, 5, 1, 3, 0, 2] and res[1].sis_score == 0.5
    assert all(r.collection is None for r in res)
    assert bar.total == 42 and bar.n == 42 and bar.kw["disable"] is False
    _, bar = run(Dyadic(W), x, [0.375, 0.5], False, 7, monkeypatch, progress=False)
    assert bar.kw["disable"] is True


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_empty_sis_and_tau_zero_stop_the_collection(monkeypatch):
    # bias 0.5: the fully masked input already passes tau = 0.5: the SIS is empty, one round
    (r,), _ = run(Dyadic([0.125] * 6, bias=0.25), images(FULL), [0.25], True, 5, monkeypatch)
    assert r.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.375, 0.25]
    assert r.sis.tolist() == [] and r.sis_score == 0.25 and len(r.collection) == 1
    assert r.mask.tolist() == [[False] * 3] * 2


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_a_set_failing_on_the_users_model_is_repaired(monkeypatch):
    # the stand-in adds 0.25 to f: its round-1 SIS {2, 0} (f 0.5 on the user's model) fails tau 0.6;
    # FindSIS goes on, last masked first: {2, 0, 5} gives 0.625 on the user's model.
    # Round 2 on {1, 3, 4}: the stand-in starts at 0.625 >= tau and takes all three, but on the user's
    # model they give 0.375: no set, and the collection stops there.
    (r,), bar = run(Dyadic(W), images(FULL), [0.6], True, 3, monkeypatch, stand_in=Dyadic(W, bias=0.25))
    assert r.order.tolist() == [1, 3, 4, 5, 0, 2]
    assert r.values.tolist() == [1.125, 1.0, 0.875, 0.75, 0.5, 0.25]  # the stand-in's values
    assert r.sis.tolist() == [2, 0, 5] and r.sis_score == 0.625
    assert r.mask.tolist() == [[True, False, True], [False, False, True]]
    assert len(r.collection) == 1
    assert bar.total == 21 + 1 + 6 and bar.n == bar.total


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_a_set_passing_on_the_users_model_is_kept(monkeypatch):
    # tau 0.5: the stand-in's {2, 0} gives exactly 0.5 on the user's model: kept, with the user's f;
    # round 2 on {1, 3, 4, 5}: the stand-in's {5, 4, 3} gives 0.375 on the user's model, so one more
    # (feature 1): 0.5, the whole round.
    (r,), _ = run(Dyadic(W), images(FULL), [0.5], True, 2, monkeypatch, stand_in=Dyadic(W, bias=0.25))
    assert r.sis.tolist() == [2, 0] and r.sis_score == 0.5
    assert [c.sis.tolist() for c in r.collection] == [[2, 0], [5, 4, 3, 1]]
    assert [c.sis_score for c in r.collection] == [0.5, 0.5]
    assert [c.score for c in r.collection] == [1.0, 0.75]  # round 2's start is the stand-in's f


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("collection", [False, True])
def test_non_finite_scores_raise(monkeypatch, collection):
    # NaN for f = 0.625 only: three candidates of round 1's third step, in a middle batch of four;
    # the steps after it are finite again, so the flag must remember the NaN
    with pytest.raises(FloatingPointError, match="NaN or inf scores on masked inputs"):
        run(Dyadic(W, nan_at=0.625), images(FULL), [0.375], collection, 4, monkeypatch)
    (r,), _ = run(Dyadic(W, nan_at=0.3), images(FULL), [0.375], collection, 4, monkeypatch)
    assert r.sis.tolist() == [2, 0]  # the planted model is finite when 0.3 never occurs


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_default_engine_name_and_evaluator(monkeypatch):
    # no engine, no evaluator: the CandidateEvaluator of fn, reported as "torch"
    monkeypatch.setattr(exact, "tqdm", Bar)
    fn = ModelFn(Dyadic(W), outputs="probabilities")
    x = images(FULL)
    prep = prepare(x)
    (r,) = exact.exact_sis(fn, prep, torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64), [0.375],
                           False, 3, ChunkRunner(100, x.device), None)
    assert r.engine == "torch" and r.sis.tolist() == [2, 0] and r.target == 0


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_a_pessimistic_stand_ins_set_is_kept_not_shrunk(monkeypatch):
    # the stand-in subtracts 0.25: its SIS {2, 0, 5} (0.375 there) gives 0.625 on the user's model, so it
    # is kept as it is, although {2, 0} would pass there too (the check only ever adds features).
    # Round 2 on {1, 3, 4} starts at 0.125 on the stand-in: below tau, its 3 + 2 + 1 candidates are
    # taken off the bar.
    (r,), bar = run(Dyadic(W), images(FULL), [0.375], True, 5, monkeypatch, stand_in=Dyadic(W, bias=-0.25))
    assert r.values.tolist() == [0.625, 0.5, 0.375, 0.25, 0.0, -0.25]
    assert r.sis.tolist() == [2, 0, 5] and r.sis_score == 0.625 and len(r.collection) == 1
    assert bar.total == 21 + 1 and bar.n == bar.total and type(bar.total) is int


@pytest.mark.mutation
@pytest.mark.timeout(30)
@pytest.mark.parametrize("batch_size,chunk", [(4, 3), (1000, 1000)])
def test_every_tensor_is_made_on_the_images_device_not_torchs_default(monkeypatch, batch_size, chunk):
    """CPU images while torch's default device is ``meta`` (as a user's ``torch.set_default_device("cuda")``
    would be): a tensor that exact_sis made on the default device instead of the images' one holds no data, so
    reading it or mixing it with the CPU state fails. The answer is the hand-built one of the test above."""
    x = images(FULL, HALF, FULL)
    res, bar = run(Dyadic(W), x, [0.375, 0.8, 0.5], True, batch_size, monkeypatch, chunk=chunk,
                   default_device="meta")
    a, b, c = res
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2] and a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert [r.sis.tolist() for r in a.collection] == [[2, 0], [5, 4, 3]]
    assert [r.order.tolist() for r in a.collection] == [[1, 3, 4, 5, 0, 2], [1, 3, 4, 5]]
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2] and b.sis is None and b.collection == []
    assert [r.sis.tolist() for r in c.collection] == [[2, 0], [5, 4, 3, 1]]
    assert a.collection[1].mask.tolist() == [[False, False, False], [True, True, True]]
    tensors = [t for r in (a, b, c) for s in [r, *r.collection] for t in (s.order, s.values, s.sis, s.mask)
               if t is not None]
    assert {t.device.type for t in tensors} == {"cpu"}
    assert bar.total == 63 + 11 + 1 + 11 and bar.n == bar.total


@pytest.mark.mutation
@pytest.mark.timeout(30)
def test_float32_images_are_scored_in_float64(monkeypatch):
    """float32 images and model: the scores and values held inside stay float64 whatever the images' dtype (the
    update kernel takes float64 only). Every f here is a dyadic sum, exact in float32 too: the hand-built answer
    of the float64 test."""
    x = images(FULL, HALF, FULL).float()
    res, bar = run(Dyadic(W).float(), x, [0.375, 0.8, 0.5], True, 4, monkeypatch, chunk=3)
    a, b, c = res
    assert a.values.dtype == torch.float64
    assert a.order.tolist() == [1, 3, 4, 5, 0, 2] and a.values.tolist() == [0.875, 0.75, 0.625, 0.5, 0.25, 0.0]
    assert [r.sis.tolist() for r in a.collection] == [[2, 0], [5, 4, 3]]
    assert b.order.tolist() == [4, 5, 1, 3, 0, 2] and b.sis is None
    assert [r.sis.tolist() for r in c.collection] == [[2, 0], [5, 4, 3, 1]]


# ------------------------------------------------------------------ host reads of the step loop

W12 = [w / 2 for w in W for _ in range(2)]  # the same six weights, each split over two features: 12 features
_SYNCING_OPS = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item", "masked_select", "unique",
                "_unique2", "unique_dim", "unique_consecutive")


class _SyncingOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ops that make the host wait for a GPU (a scalar read, nonzero, ...), by name."""

    def __init__(self, seen, paused):
        super().__init__()
        self.seen, self.paused = seen, paused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in _SYNCING_OPS and not self.paused:  # paused: a list, non-empty at round boundaries
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _watch_steps(monkeypatch, check_evaluator=None) -> list[str]:
    """From now on in the test, every exact-loop step runs under :class:`_SyncingOps` (except where rounds end or
    start: the loop reads there through to_host and works on the host), the evaluator's steps and the fused dense
    steps alike; ``check_evaluator(evaluator)`` runs first in each evaluator step (a dense step fails it: it gets
    None). Returns the list of syncing ops seen inside the steps."""
    seen, paused = [], []
    step, dense = exact._ExactRun.step, exact_step.DenseStep.__call__

    def watched(self, evaluator, window, k):
        if check_evaluator is not None:
            check_evaluator(evaluator)
        with _SyncingOps(seen, paused):
            return step(self, evaluator, window, k)

    def watched_dense(self, block, done):
        if check_evaluator is not None:
            check_evaluator(None)
        with _SyncingOps(seen, paused):
            return dense(self, block, done)

    def boundary(method):  # where rounds end or start the loop reads (through to_host) and works on the host
        def call(self, ids):
            paused.append(1)
            try:
                return method(self, ids)
            finally:
                paused.pop()
        return call

    monkeypatch.setattr(exact._ExactRun, "step", watched)
    monkeypatch.setattr(exact_step.DenseStep, "__call__", watched_dense)
    monkeypatch.setattr(exact._ExactRun, "finish_rounds", boundary(exact._ExactRun.finish_rounds))
    monkeypatch.setattr(exact._ExactRun, "start_rounds", boundary(exact._ExactRun.start_rounds))
    return seen


def _reads(monkeypatch, x, weights, batch_size):
    """(host reads, ops that would wait for a GPU inside the steps, rounds, backward-selection steps, results) of
    one exact_sis collection."""
    seen = _watch_steps(monkeypatch)
    with of.runtime.sync.counting() as reads:
        res, _ = run(Dyadic(weights), x, [0.375, 0.8, 0.5], True, batch_size, monkeypatch)
    done = [s for r in res for s in (r.collection or [r])]  # every round run
    return reads, seen, len(done), sum(s.order.numel() for s in done), res


@pytest.mark.parametrize("batch_size", [1, 5, 1000])
def test_host_reads_per_round_not_per_step(monkeypatch, batch_size):
    """Three images, collections of several rounds, at p = 6 and p = 12: the loop reads the device only through
    to_host, at most once at the start, once at the end, and once per round that ends or starts, however many
    steps the rounds take; inside a step no op that waits for a GPU runs at all."""
    import overinterp_fast.runtime.sync  # noqa: F401  (of.runtime.sync)

    small = _reads(monkeypatch, images(FULL, HALF, FULL), W, batch_size)
    x12 = torch.tensor([[1.0] * 12, [1.0] * 8 + [0.0] * 4, [1.0] * 12], dtype=torch.float64).view(3, 1, 2, 6)
    large = _reads(monkeypatch, x12, W12, batch_size)
    for reads, seen, rounds, steps, res in (small, large):
        assert seen == []
        assert set(reads.by_label) <= {"start", "round end", "round start", "end"}
        assert reads.by_label["start"] == 1 and reads.by_label["end"] == 1
        assert reads.count <= 2 + 2 * rounds
    assert large[3] > 2 + 2 * large[2]  # one read per backward-selection step could not fit under the bound
    # the p = 6 answer is the hand-built one of the tests above
    a = small[4][0]
    assert [r.sis.tolist() for r in a.collection] == [[2, 0], [5, 4, 3]]


def _incremental_reads(monkeypatch, model, x, threshold, batch_size, collection=True):
    """(host reads by label, ops that would wait for a GPU inside the steps, results) of fast_sis with
    incremental=True: the evaluator is incremental inference, whose base runs the loop schedules from the host."""
    def incremental(evaluator):  # the incremental evaluator, not the dense one
        assert getattr(evaluator, "takes_starts", False)

    seen = _watch_steps(monkeypatch, incremental)
    with of.runtime.sync.counting() as reads:
        res = of.fast_sis(model, x, threshold, batch_size=batch_size, engine="torch", collection=collection,
                          options=of.ExactOptions(incremental=True))
    return reads, seen, res


@pytest.mark.parametrize("batch_size", [7, 1000])
def test_incremental_steps_read_nothing_from_the_device_and_equal_the_reference(monkeypatch, batch_size):
    """With incremental inference the loop still never waits inside a step: the images whose inputs changed (a
    step or a round begins) are named by the host's schedule, not found on the device, and the gathers skip their
    index checks. Collections of several rounds on 2 images; the answer is the reference's."""
    import overinterp_fast.runtime.sync  # noqa: F401  (of.runtime.sync)

    # conv (positive weights), ReLU, global average pooling, a linear layer: on positive images a few pixels
    # keep class 0 above 0.8, so each image's collection has many rounds (6 and 8), each a new input
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 2, bias=False)).double().eval()
    with torch.no_grad():
        model[0].weight.copy_(torch.rand(4, 1, 3, 3))
        model[4].weight.copy_(torch.tensor([[1.0] * 4, [0.0] * 4]))
    x = torch.rand(2, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.5
    reads, seen, res = _incremental_reads(monkeypatch, model, x, 0.8, batch_size)
    assert seen == []
    assert set(reads.by_label) <= {"start", "round end", "round start", "end"}
    rounds = sum(len(r.collection) or 1 for r in res)
    assert [len(r.collection) for r in res] == [6, 8]
    assert reads.by_label["start"] == 1 and reads.by_label["end"] == 1 and reads.count <= 2 + 2 * rounds
    assert_same_lists(res, reference.sis(model, x, 0.8, collection=True), assert_same_result, True)


@cuda
def test_step_loop_never_waits_for_the_gpu(monkeypatch):
    """On a GPU the whole loop runs under torch.cuda.set_sync_debug_mode("error"): any synchronising op outside
    to_host raises. The answer is the hand-built one."""
    x, model = images(FULL, HALF, FULL).cuda(), Dyadic(W).cuda()
    res, _ = run(model, x, [0.375, 0.8, 0.5], True, 4, monkeypatch, chunk=3, strict=True)
    assert [r.sis.tolist() for r in res[0].collection] == [[2, 0], [5, 4, 3]]
    assert [r.sis.tolist() for r in res[2].collection] == [[2, 0], [5, 4, 3, 1]]


@cuda
def test_incremental_step_loop_never_waits_for_the_gpu(monkeypatch):
    """Incremental inference on a GPU, each step under torch.cuda.set_sync_debug_mode("error") (the set-up and
    calibration read the device by design; the round boundaries read through to_host); the answer is the
    reference's."""
    model, x = make_cnn(0).cuda(), make_images(2, seed=3).cuda()
    step = exact._ExactRun.step

    def strict(self, evaluator, window, k):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(self, evaluator, window, k)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(exact._ExactRun, "step", strict)
    res = of.fast_sis(model, x, 0.2, batch_size=7, engine="torch", options=of.ExactOptions(incremental=True))
    want = reference.sis(make_cnn(0), make_images(2, seed=3), 0.2)
    for r, w in zip(res, want):
        assert r.order.tolist() == w.order.tolist() and r.values.tolist() == pytest.approx(w.values.tolist())
        assert (r.sis is None) == (w.sis is None) and (r.sis is None or r.sis.tolist() == w.sis.tolist())


def test_many_images_run_in_lockstep_and_fill_every_batch():
    """16 images of 25 pixels, batch_size 64: 16 * 325 = 5,200 candidates. Run one image after another, the
    steps (25, 24, ..., 1 candidates) would make 400 model calls of ragged sizes; in lockstep the steps of all
    images share batches, so the calls are 81 full batches of 64 plus at most a few short tails."""
    model = make_cnn(2)
    rows = []
    model.register_forward_pre_hook(lambda m, a: rows.append(a[0].shape[0]))
    images = make_images(16, seed=4)
    res = of.fast_sis(model, images, 0.0, batch_size=64, engine="torch", options=of.ExactOptions(incremental=False))
    steps = rows[1:]  # after the unmasked images' own pass
    assert sum(r.order.numel() for r in res) == 16 * 25
    assert steps.count(64) >= 5200 // 64 - 2 and len(steps) <= 5200 // 64 + 6


# ------------------------------------------------------------------ the host's work per forward call


@pytest.mark.parametrize("n,size", [(1, 16), (64, 8)])
def test_at_most_five_ops_outside_the_model_per_forward_call(n, size):
    """With a near-free model (one linear layer), the whole fast_sis call (set-up, schedule, rounds, FindSIS)
    dispatches at most 5 aten ops outside the model per forward call (views not counted): each batch is
    exact_candidates, the model, its softmax and exact_scores. The batch shapes are the runner's few buckets, the
    reads the start's, the rounds' ends and the end's. A second call of the same job counts (the first one's engine
    choice is cached)."""
    from overinterp_fast.runtime.opcount import counting_ops

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(size * size, 10)).eval()
    x = torch.randn(n, 1, size, size, generator=torch.Generator().manual_seed(1))
    dense = of.ExactOptions(incremental=False)  # every candidate through the model (auto may time incremental in)
    of.fast_sis(model, x, 0.5, show_progress=False, options=dense, engine="torch")
    with counting_ops(model) as ops, of.runtime.sync.counting() as reads:
        res = of.fast_sis(model, x, 0.5, show_progress=False, options=dense, engine="torch")
    p = size * size
    assert ops.rows >= n * p * (p + 1) // 2  # every candidate went through the model
    if of.ops.mode() == "auto":  # the compiled kernels (the pure versions are many ops each)
        assert ops.outside_per_call <= 5, ops.by_op.most_common(8)
        assert {"exact_candidates", "exact_scores"} <= set(ops.by_op) and "mask_apply" not in ops.by_op
    assert len(ops.shapes) <= 24  # the buckets of one chunk size, the set-up's calls
    assert set(reads.by_label) <= {"start", "round end", "end"} and reads.by_label["round end"] <= n
    assert {r.info.step for r in res} == {"fused"}
    want = of.fast_sis(model, x, 0.5, show_progress=False, options=dense, engine="torch",
                       batch_size=300)  # other batches: the same orders
    assert all(torch.equal(a.order, b.order) for a, b in zip(res, want))


# ------------------------------------------------------------------ the row memo (CPU): rows patched, not rewritten


def _memo_from(monkeypatch, least: int) -> None:
    """The row memo on for inputs of at least ``least`` elements, in dense steps made from here on (none kept)."""
    monkeypatch.setattr(exact_step, "MEMO_MIN_ELEMS", least)
    model_state.clear(("step",))


def _memo_steps(monkeypatch) -> list:
    """Record the dense steps of the next runs (to see whether their row memo was on)."""
    made = []
    original = exact_step.DenseStep.__init__

    def init(self, *a, **kw):
        original(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(exact_step.DenseStep, "__init__", init)
    return made


@pytest.mark.parametrize("case", ["collection", "per-image baseline", "channels_last float32", "patches"])
def test_patched_candidates_give_the_references_answers(monkeypatch, case):
    """With the row memo on for every input size, the dense step patches the rows that line up with the previous
    batch: the same orders, values and SIS as the reference, through several rounds, per-image baselines,
    channels_last float32 images and multi-pixel features; one image alone (every batch lines up) and several."""
    _memo_from(monkeypatch, 0)
    made = _memo_steps(monkeypatch)
    dense = of.ExactOptions(incremental=False)
    model, images = make_cnn(3), make_images(3, seed=7)
    kw, ref_kw, tau = {}, {}, 0.25
    baselines = torch.randn(images.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    if case == "patches":
        model, images = make_cnn(4, h=6, w=6), make_images(2, h=6, w=6, seed=3)
        kw["feature_mask"] = ref_kw["feature_mask"] = (torch.arange(6).view(6, 1) // 2) * 3 + torch.arange(6) // 2
        tau = 0.3
    for x in (images[:1], images):
        if case == "per-image baseline":
            kw["baselines"] = ref_kw["baselines"] = baselines[: x.shape[0]]
        fast_x = x.float().contiguous(memory_format=torch.channels_last) if "channels_last" in case else x
        fast_model = make_cnn(3, dtype=torch.float32) if "channels_last" in case else model
        got = of.fast_sis(fast_model, fast_x, tau, collection=True, options=dense, engine="torch", batch_size=40,
                          show_progress=False, **kw)
        if "channels_last" in case:  # float32: against the same run with every row written whole
            _memo_from(monkeypatch, 10 ** 9)
            want = of.fast_sis(fast_model, fast_x, tau, collection=True, options=dense, engine="torch",
                               batch_size=40, show_progress=False, **kw)
            _memo_from(monkeypatch, 0)
        else:
            want = reference.sis(model, x, tau, collection=True, **ref_kw)
        assert_same(got, want, collection=True)
        assert {r.info.step for r in got} == {"fused"}
    assert made and made[0].memo and int(made[0].version.max()) > 2
    if case in ("collection", "patches"):  # rounds after the first: present features come back
        assert max(len(r.collection) for r in got) >= 2


def test_the_row_memo_is_on_for_inputs_of_many_elements(monkeypatch):
    """Inputs of at least MEMO_MIN_ELEMS elements take the memo by default (3 x 10 x 10 pixels here, 25 features of
    2 x 2), smaller ones do not; both give the reference's answers."""
    _memo_from(monkeypatch, exact_step.MEMO_MIN_ELEMS)
    made = _memo_steps(monkeypatch)
    model, images = make_cnn(5, h=10, w=10), make_images(2, h=10, w=10, seed=5)
    patches = (torch.arange(10).view(10, 1) // 2) * 5 + torch.arange(10) // 2
    dense = of.ExactOptions(incremental=False)
    got = of.fast_sis(model, images, 0.2, feature_mask=patches, collection=True, options=dense, engine="torch",
                      show_progress=False)
    assert_same(got, reference.sis(model, images, 0.2, feature_mask=patches, collection=True), collection=True)
    other = make_images(2, h=10, w=10, seed=6)  # a later job of the same shapes takes the kept step and its buffers
    again = of.fast_sis(model, other, 0.2, feature_mask=patches, options=dense, engine="torch", show_progress=False)
    assert_same(again, reference.sis(model, other, 0.2, feature_mask=patches))
    small = of.fast_sis(make_cnn(3), make_images(1), 0.2, options=dense, engine="torch", show_progress=False)
    assert_same(small, reference.sis(make_cnn(3), make_images(1), 0.2))
    assert [d.memo for d in made] == [True, False] and 3 * 10 * 10 >= exact_step.MEMO_MIN_ELEMS > 3 * 5 * 5


def test_a_kept_step_forgets_what_its_rows_held(monkeypatch):
    """A later job takes the kept dense step with other images: loading them marks every row unknown (a row whose
    image's present features came back to the same set would otherwise be patched over the old image)."""
    from types import SimpleNamespace

    _memo_from(monkeypatch, 0)
    made = _memo_steps(monkeypatch)
    of.fast_sis(make_cnn(3), make_images(1, seed=7), 0.25, collection=True, engine="torch",
                options=of.ExactOptions(incremental=False), show_progress=False)
    step = made[0]
    assert step.memo and any(bool((h[0] >= 0).any()) for h in step.held.values())
    prep = SimpleNamespace(images=step.images + 1, baseline=step.baseline, feature_map=step.feature_map)
    with torch.inference_mode():  # as fast_sis loads a job
        step.load(prep, step.targets.clone())
    assert all(bool((h[0] == -1).all()) for h in step.held.values())


class DoublesItsInput(nn.Module):
    """A model that writes into its input (x *= 2) before scoring it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x.mul_(2))


def test_a_model_that_writes_into_its_input_gets_every_row_rewritten(monkeypatch):
    """The candidates buffer is the model's input: a model that changes it in place leaves rows that no longer
    hold their candidates, and the dense step writes every row again (the buffer's version counter shows the
    write). The answers are those of the same run with every row written whole."""
    made = _memo_steps(monkeypatch)
    model, x = DoublesItsInput(make_cnn(6)).eval(), make_images(1, seed=8)
    runs = []
    for least in (0, 10 ** 9):  # the memo on, then off
        _memo_from(monkeypatch, least)
        runs.append(of.fast_sis(model, x.clone(), 0.2, collection=True, options=of.ExactOptions(incremental=False),
                                engine="torch", batch_size=30, show_progress=False))
    assert [d.memo for d in made] == [True, False]
    assert_same(*runs, collection=True)


@cuda
def test_captured_steps_equal_the_eager_ones_cuda(monkeypatch):
    """On a GPU each batch shape's whole step (candidates, forward pass, softmax, scores and steps) is one CUDA
    graph: the same orders, values and SIS as with graphs off, with collections (rounds that start and end between
    windows); the results say which path ran; the captured steps never make the host wait."""
    model, x = make_cnn(0).cuda(), make_images(3, seed=5).cuda()
    kw = dict(collection=True, show_progress=False, engine="torch", batch_size=32,
              options=of.ExactOptions(incremental=False))
    monkeypatch.setenv("OVERINTERP_FAST_CUDA_GRAPHS", "0")
    eager = of.fast_sis(model, x, 0.3, **kw)
    monkeypatch.delenv("OVERINTERP_FAST_CUDA_GRAPHS")
    call = exact_step.DenseStep.__call__

    def strict(self, block, done):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return call(self, block, done)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(exact_step.DenseStep, "__call__", strict)
    graphed = of.fast_sis(model, x, 0.3, **kw)
    assert {r.info.step for r in eager} == {"fused"} and {r.info.step for r in graphed} == {"cuda-graph"}
    for a, b in zip(graphed, eager):
        for ra, rb in zip([a, *(a.collection or [])[1:]], [b, *(b.collection or [])[1:]]):
            assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
            assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))


def test_the_captured_step_reads_each_batch_from_its_own_input(monkeypatch):
    """The graph path's wiring, on the CPU: a capture whose 'replay' runs the captured function again (what a CUDA
    graph does: the same ops on the same buffers) stands in for torch.cuda.graph. Each batch's index block must
    reach the shape's input buffer before its replay, and the check and the replays must leave the state as eager
    steps do: the same orders, values and SIS as the fused steps, with collections (windows that stop and start)."""
    from overinterp_fast.runtime import graphs

    class Played:
        def __init__(self, step):
            self.replay = step

    class OnTheCpu(graphs.GraphedStep):
        def __init__(self, step, state, device, **kw):
            super().__init__(step, state, device, **kw)
            self.wanted = True

        def _capture(self):
            captured.append(id(self))
            return Played(self.step)

    class On(graphs.StepGraphs):
        def __init__(self, device):
            super().__init__(device)
            self.on = True

    captured = []
    model, x = make_cnn(0), make_images(3, seed=5)
    kw = dict(collection=True, show_progress=False, engine="torch", batch_size=16,
              options=of.ExactOptions(incremental=False))
    fused = of.fast_sis(model, x, 0.3, **kw)
    monkeypatch.setattr(graphs, "GraphedStep", OnTheCpu)
    monkeypatch.setattr(graphs, "StepGraphs", On)
    model_state.clear(("step",))  # not the first call's (graphs off) step
    replayed = of.fast_sis(model, x, 0.3, **kw)
    first = len(captured)
    again = of.fast_sis(model, x, 0.3, **kw)  # the kept step: its graphs replay, no shape is captured again
    # shapes the first job captured replay in the second (only shapes it ran too few times to capture are new)
    assert first > 0 and len(set(captured)) == len(captured) and len(captured) - first < first
    assert all(torch.equal(a.order, b.order) for a, b in zip(again, replayed))
    assert {r.info.step for r in fused} == {"fused"} and {r.info.step for r in replayed} == {"cuda-graph"}
    for a, b in zip(replayed, fused):
        assert len(a.collection) == len(b.collection) > 1
        for ra, rb in zip(a.collection, b.collection):
            assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
            assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))
