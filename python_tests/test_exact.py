"""fast_sis (exact) against the in-package reference transcription of sis.py."""
import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast import reference

from conftest import assert_same_lists, assert_sets_sufficient, cuda, make_cnn, make_images


def assert_same_result(a, b, exact_values=True):
    assert a.target == b.target
    assert torch.equal(a.order, b.order)
    if exact_values:
        torch.testing.assert_close(a.values, b.values, rtol=1e-12, atol=0)
    assert (a.sis is None) == (b.sis is None)
    if a.sis is not None:
        assert torch.equal(a.sis, b.sis)
        assert torch.equal(a.mask, b.mask)
        assert a.sis_score == pytest.approx(b.sis_score, rel=1e-12)
    assert a.score == pytest.approx(b.score, rel=1e-12)
    assert a.threshold == b.threshold


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
            # the SIS is the tail of the order after the last value that reaches tau (SPEC.md FindSIS)
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


class OOMAbove(nn.Module):
    """Raises torch.OutOfMemoryError on batches larger than `limit`, like a GPU that is full."""

    def __init__(self, model, limit):
        super().__init__()
        self.model, self.limit, self.ooms = model, limit, 0

    def forward(self, x):
        if x.shape[0] > self.limit:
            self.ooms += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.model(x)


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
    fast = of.fast_sis(model, images, 0.3, features=patches, mask_value=mv, collection=True)
    ref = reference.sis(model, images, 0.3, features=patches, mask_value=mv, collection=True)
    assert_same(fast, ref, collection=True)
    assert fast[0].order.shape == (9,) and (fast[0].mask is None or fast[0].mask.shape == (9,))
    assert assert_sets_sufficient(model, images, fast, baseline=mv, features=patches) >= 1


def test_per_image_baseline_and_given_target(cnn64, images64):
    baseline = torch.randn(images64.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    target = torch.tensor([0, 1, 2, 3])
    fast = of.fast_sis(cnn64, images64, 0.1, mask_value=baseline, target=target)
    ref = reference.sis(cnn64, images64, 0.1, mask_value=baseline, target=target)
    assert_same(fast, ref)
    assert [r.target for r in fast] == [0, 1, 2, 3]
    assert assert_sets_sufficient(cnn64, images64, fast, baseline=baseline) >= 1


def test_probability_outputs_and_ensembles(cnn64, images64):
    probs = nn.Sequential(cnn64, nn.Softmax(dim=1)).eval()
    assert_same(of.fast_sis(probs, images64, 0.3, outputs="probabilities"), of.fast_sis(cnn64, images64, 0.3))
    other = make_cnn(8)

    def mean_of_logits(x):  # the ensemble by hand (SPEC.md section 0)
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
