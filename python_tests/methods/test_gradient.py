"""Batched-gradient SIS (method="gradient") against the plain transcription of the paper's loop.
"""
import os

import pytest
import torch
import overinterp_fast as of
from overinterp_fast.methods import reference
from helpers import assert_same_lists, assert_same_result, assert_sets_sufficient, fake_terminal, make_cnn
from helpers import cuda, make_images, OOMAbove


def assert_same(res_a, res_b, collection=False):
    """Every result (and round) equal to the other's, blocks included; values and scores to 1e-10."""
    compare = lambda a, b: assert_same_result(a, b, rel=1e-10, atol=1e-12, blocks=True)  # noqa: E731
    assert_same_lists(res_a, res_b, compare, collection)


@pytest.mark.parametrize("seed,k", [(0, 3), (1, 4), (2, 7)])
def test_float64_equals_transcription(seed, k):
    model = make_cnn(seed)
    images = make_images(5, seed=seed + 30)
    with torch.no_grad():
        top = torch.softmax(model(images), 1).max(1).values.sort().values
    tau = float(top[1] + top[2]) / 2
    fast = of.fast_sis(model, images, tau, method="gradient", batch_size=7, options=of.GradientOptions(k=k))
    ref = reference.gradient_sis(model, images, tau, k=k)
    assert_same(fast, ref)
    assert any(r.sis is None for r in fast) and any(r.sis is not None and r.sis.numel() > 0 for r in fast)
    assert assert_sets_sufficient(model, images, fast) == sum(r.sis is not None for r in fast)
    for r in fast:
        assert sorted(r.order.tolist()) == list(range(25))
        assert r.blocks[0] == 0 and r.blocks[-1] == 25 and r.values.numel() == r.blocks.numel() - 1
        assert (r.blocks.diff()[:-1] == k).all() and 1 <= r.blocks.diff()[-1] <= k


def test_float64_collection_equals_transcription():
    model = make_cnn(3)
    images = make_images(4, seed=41)
    fast = of.fast_sis(model, images, 0.25, method="gradient", collection=True, options=of.GradientOptions(k=2))
    ref = reference.gradient_sis(model, images, 0.25, k=2, collection=True)
    assert_same(fast, ref, collection=True)
    assert max(len(r.collection) for r in fast) >= 2
    assert assert_sets_sufficient(model, images, fast) == sum(len(r.collection) for r in fast)


def test_every_sis_is_verified_on_many_images():
    from overinterp_fast.zoo.digits import load_digits, train_digits_cnn

    data = load_digits()
    model = train_digits_cnn(data, epochs=3)
    images = data.x_test[:60]
    res = of.fast_sis(model, images, 0.9, method="gradient", collection=True, options=of.GradientOptions(k=4))
    # every round of every image, each by its own forward pass
    checked = assert_sets_sufficient(model, images, res, rel=1e-5)
    assert checked == sum(len(r.collection) for r in res) and checked >= 50


def test_autocast_sis_still_verified_in_full_precision():
    model = make_cnn(1, torch.float32, h=6, w=6)
    images = make_images(6, h=6, w=6, seed=5, dtype=torch.float32)
    res = of.fast_sis(model, images, 0.3, method="gradient", options=of.GradientOptions(k=3, autocast="bf16"))
    assert any(r.sis is not None for r in res)
    assert assert_sets_sufficient(model, images, res, rel=1e-5) == sum(r.sis is not None for r in res)


def test_patch_features_and_packing_invariance():
    model = make_cnn(4, h=6, w=6)
    images = make_images(3, h=6, w=6, seed=3)
    patches = (torch.arange(6).view(6, 1) // 2) * 3 + torch.arange(6).view(1, 6) // 2
    together = of.fast_sis(model, images, 0.3, method="gradient", feature_mask=patches, collection=True,
                           options=of.GradientOptions(k=2))
    assert_same(together, reference.gradient_sis(model, images, 0.3, k=2, feature_mask=patches, collection=True), True)
    assert assert_sets_sufficient(model, images, together, features=patches) >= 3
    for i in range(3):
        alone = of.fast_sis(model, images[i : i + 1], 0.3, method="gradient", feature_mask=patches, collection=True,
                            options=of.GradientOptions(k=2))
        assert_same([together[i]], alone, collection=True)


def test_out_of_memory_in_backward_backs_off(cnn64, images64):
    want = of.fast_sis(cnn64, images64, 0.3, method="gradient", options=of.GradientOptions(k=5))
    flaky = OOMAbove(cnn64, limit=2).eval()
    with pytest.warns(UserWarning, match="out of memory"):
        got = of.fast_sis(flaky, images64, 0.3, method="gradient", batch_size=8, options=of.GradientOptions(k=5))
    assert_same(got, want)


def test_gradient_options_are_checked(cnn64, images64):
    with pytest.raises(ValueError, match="k \\(features masked"):
        of.fast_sis(cnn64, images64, 0.3, method="gradient", options=of.GradientOptions(k=0))
    with pytest.raises(ValueError, match="autocast"):
        of.fast_sis(cnn64, images64, 0.3, method="gradient", options=of.GradientOptions(autocast="int8"))


def test_user_model_gradients_untouched(cnn64, images64):
    of.fast_sis(cnn64, images64, 0.3, method="gradient", options=of.GradientOptions(k=5))
    reference.gradient_sis(cnn64, images64[:1], 0.3, k=5)
    assert all(p.grad is None for p in cnn64.parameters())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_top_k_present_matches_stable_sort(dtype):
    from overinterp_fast.methods.gradient import top_k_present

    g_ = torch.Generator().manual_seed(0)
    for trial in range(20):
        n, p, k = 4, 97, int(torch.randint(1, 30, (1,), generator=g_))
        g = (torch.randint(-4, 5, (n, p), generator=g_).float() / 4).to(dtype)  # many exact ties
        g[0, :10] = -0.0  # signed zeros tie with +0.0
        g[1, 5:9] = torch.tensor([1e-30, -1e-30, 3.0e38, -3.0e38]).to(dtype)
        present = torch.rand(n, p, generator=g_) > 0.3
        got = top_k_present(g, present, k)
        key = torch.where(present, g.double(), torch.full((n, p), -torch.inf, dtype=torch.float64))
        want = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :k]
        counts = present.sum(1)
        for row in range(n):
            m = min(k, int(counts[row]))
            assert got[row, :m].tolist() == want[row, :m].tolist(), (trial, row)
            # past the present features: distinct absent ones (the loop masks them again, a no-op)
            rest = got[row, m:].tolist()
            assert len(set(rest)) == len(rest) and not any(present[row, rest].tolist()), (trial, row)


def test_per_image_thresholds_gradient(cnn64, images64):
    with torch.no_grad():
        f = torch.softmax(cnn64(images64), 1).max(1).values
    rel = 0.8 * f
    fast = of.fast_sis(cnn64, images64, rel, method="gradient", collection=True, options=of.GradientOptions(k=4))
    assert_same(fast, reference.gradient_sis(cnn64, images64, rel, k=4, collection=True), collection=True)
    assert all(r.sis is not None and r.sis_score >= r.threshold for r in fast)
    assert assert_sets_sufficient(cnn64, images64, fast) == sum(len(r.collection) for r in fast)


def test_per_image_baselines_equal_transcription():
    """A baseline per image ([N, *D]) is indexed by the rows of each round, also when only some images go on."""
    model = make_cnn(1, h=4, w=4)
    images = make_images(2, h=4, w=4, seed=11)
    base = make_images(2, h=4, w=4, seed=12) * 0.5
    fast = of.fast_sis(model, images, 0.3, method="gradient", baselines=base, collection=True,
                       options=of.GradientOptions(k=3))
    ref = reference.gradient_sis(model, images, 0.3, k=3, baselines=base, collection=True)
    assert_same(fast, ref, collection=True)
    assert len(fast[0].collection) != len(fast[1].collection)  # a round with one of the two images
    assert assert_sets_sufficient(model, images, fast, baseline=base) == sum(len(r.collection) for r in fast)


class _AutocastRecorder(torch.nn.Module):
    """Logits = bias (weights 0): records, per call, (x requires grad, autocast enabled, autocast dtype)."""

    def __init__(self, p, bias):
        super().__init__()
        self.lin = torch.nn.Linear(p, 2)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.bias.copy_(torch.tensor(bias))
        self.calls = []

    def forward(self, x):
        self.calls.append((x.requires_grad, torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.lin(x)


def _cpu_flags() -> set:
    if not os.path.exists("/proc/cpuinfo"):
        return set()
    with open("/proc/cpuinfo") as fh:
        return {f for line in fh if line.startswith("flags") for f in line.split(":", 1)[1].split()}


# what autocast="auto" means for float32 images on this CPU: bf16 where it has bf16 hardware
AUTO_ON_THIS_CPU = torch.bfloat16 if _cpu_flags() & {"avx512_bf16", "amx_bf16"} else None


@pytest.mark.parametrize("autocast,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16), (None, None),
                                            ("auto", AUTO_ON_THIS_CPU)])
def test_autocast_applies_to_the_backward_passes_only(autocast, dtype):
    model = _AutocastRecorder(4, [0.3, 0.0]).eval()
    (r,) = of.fast_sis(model, torch.ones(1, 4), 0.5, method="gradient", options=of.GradientOptions(k=1,
                                                                                                   autocast=autocast))
    backward = [c for c in model.calls if c[0]]
    assert len(backward) == 4  # one gradient step per feature (k=1)
    assert all(c[1] == (dtype is not None) for c in backward)
    if dtype is not None:
        assert all(c[2] == dtype for c in backward)
    assert not any(c[1] for c in model.calls if not c[0])  # FindSIS and the fully masked input: full precision
    # f during BackSelect: softmax taken in float32 of the logits rounded to the autocast dtype
    bias0 = torch.tensor(0.3).to(dtype or torch.float32).float()
    want = float(torch.softmax(torch.stack([bias0, torch.tensor(0.0)]), 0)[0])
    assert r.values[:-1].tolist() == pytest.approx([want] * 3, abs=1e-7)
    assert r.order.tolist() == [0, 1, 2, 3]  # all gradients 0: ties to the lowest id


@pytest.mark.parametrize("progress,shown", [(True, True), (False, False), (None, True)])
def test_gradient_progress_bar(monkeypatch, progress, shown):
    tty = fake_terminal(monkeypatch)
    of.fast_sis(_AutocastRecorder(5, [2.0, 0.0]).eval(), torch.ones(1, 5), 0.5, method="gradient",
                show_progress=progress, options=of.GradientOptions(k=2))  # logits, not probabilities
    if not shown:
        assert "".join(tty.text) == ""
        return
    last = tty.last_line()
    assert last.startswith("gradient SIS: 100%") and " 3/3 [" in last  # ceil(5 / 2) steps
    assert "step/s" in last or "s/step" in last
    tty.text.clear()  # two rounds (see the next test): 4 steps, then 1; the total grows with each round
    of.fast_sis(_all_but_one_first, torch.ones(1, 4), 0.5, method="gradient", outputs="probabilities", collection=True,
                show_progress=progress, options=of.GradientOptions(k=1))
    assert " 5/5 [" in tty.last_line()


def _all_but_one_first(x):
    """Probabilities [f, 1 - f] with f = 0.75 x1 x2 x3 + 0.5 x0 (1 - x1 x2 x3), for x [N, 4]."""
    p = x[:, 1] * x[:, 2] * x[:, 3]
    f = 0.75 * p + 0.5 * x[:, 0] * (1 - p)
    return torch.stack([f, 1 - f], 1)


@pytest.mark.timeout(30)
def test_collection_goes_on_after_a_set_of_all_but_one_feature():
    # f = 0.75 x1 x2 x3 + 0.5 x0 (1 - x1 x2 x3): masking x0 first costs nothing (df/dx0 = 0 at x = 1), then
    # x1, x2, x3 tie. The first SIS is {1, 2, 3} (3 of the round's 4 features); x0 alone still gives 0.5 = tau,
    # so a second round runs on it and finds {0}.
    model = _all_but_one_first

    for run in (of.fast_sis, reference.gradient_sis):
        (r,) = run(model, torch.ones(1, 4), 0.5, method="gradient", outputs="probabilities", collection=True,
                   options=of.GradientOptions(k=1)) if run is of.fast_sis else run(model, torch.ones(1, 4), 0.5, k=1,
                                                                     outputs="probabilities", collection=True)
        assert r.order.tolist() == [0, 1, 2, 3]
        assert [c.sis.tolist() for c in r.collection] == [[3, 2, 1], [0]]
        assert [c.score for c in r.collection] == [0.75, 0.5] and [c.sis_score for c in r.collection] == [0.75, 0.5]


def test_non_finite_score_with_a_finite_gradient_is_refused():
    # f = 0.75 with all 4 features present, NaN as soon as one is masked; the gradient is 0 (finite) throughout
    def model(x):
        full = x.sum(1) > 3.5
        f = torch.where(full, 0.75 + 0 * x.sum(1), torch.full_like(x[:, 0], float("nan")))
        return torch.stack([f, 1 - f], 1)

    with pytest.raises(FloatingPointError, match=r"^the model's score or its gradient with respect to the mask is "
                                                 r"NaN or inf$"):
        of.fast_sis(model, torch.ones(1, 4), 0.5, method="gradient", outputs="probabilities",
                    options=of.GradientOptions(k=1))


def test_autocast_and_k_options_by_hand():
    from overinterp_fast.methods.gradient import check_autocast, check_k

    for off in (None, False):
        assert check_autocast(off) is None
    for name, dtype in (("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("fp16", torch.float16),
                        ("float16", torch.float16), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16)):
        assert check_autocast(name) is dtype
    for bad in (True, torch.float32, torch.float64, "int8", 16):
        with pytest.raises(ValueError, match=rf"^autocast must be 'auto', None, 'bf16' or 'fp16', got {bad!r}$"):
            check_autocast(bad)
    assert check_k(1) == 1 and check_k(7) == 7
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(ValueError, match=rf"^k \(features masked per gradient step\) must be a positive int, "
                                             rf"got {bad!r}$"):
            check_k(bad)


def test_top_k_present_order_by_hand():
    from overinterp_fast.methods.gradient import top_k_present

    all_present = torch.ones(1, 4, dtype=torch.bool)
    # float64 keeps differences float32 cannot hold: 1 + 1e-12 > 1
    g64 = torch.tensor([[1.0, 1.0 + 1e-12, -2.0, 1.0]], dtype=torch.float64)
    assert top_k_present(g64, all_present, 4).tolist() == [[1, 0, 3, 2]]
    # float32: neighbouring floats (one unit in the last place apart) stay ordered, positive and negative
    up, down = float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))), -1.0
    g32 = torch.tensor([[1.0, up, down, float(torch.nextafter(torch.tensor(down), torch.tensor(0.0)))]])
    assert top_k_present(g32, all_present, 4).tolist() == [[1, 0, 3, 2]]
    # only negative gradients, all distinct: descending order of g, whatever the ids
    neg = torch.tensor([[-3.0, -0.5, -2.0, -0.25, -1.0]])
    present = torch.tensor([[True, True, True, False, True]])
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert top_k_present(neg.to(dtype), present, 4).tolist() == [[1, 4, 2, 0]], dtype


def test_a_set_that_fails_its_own_verification_is_not_reported():
    # f = 0.6 on batches of 2 rows (the initial pass and the backward passes of the 2 images), 0.5 on any other
    # batch (FindSIS's packed candidates): even the full input fails when verified, so no SIS is reported
    def model(x):
        f = torch.full_like(x[:, 0], 0.6 if x.shape[0] == 2 else 0.5) + 0 * x.sum(1)
        return torch.stack([f, 1 - f], 1)

    res = of.fast_sis(model, torch.ones(2, 4), 0.55, method="gradient", outputs="probabilities",
                      options=of.GradientOptions(k=1))
    assert [r.score for r in res] == pytest.approx([0.6, 0.6]) and [r.sis for r in res] == [None, None]


def test_images_that_run_out_of_steps_first_leave_the_others_unchanged():
    # second rounds of 3 images with 22, 24 and 24 features (k = 2): 11, 12 and 12 steps, so the last step
    # runs on two of the round's three images
    model = make_cnn(0)
    images = make_images(4, seed=50)
    with torch.no_grad():
        tau = 0.5 * torch.softmax(model(images), 1).max(1).values
    fast = of.fast_sis(model, images, tau, method="gradient", collection=True, options=of.GradientOptions(k=2))
    steps = sorted(r.collection[1].blocks.numel() - 1 for r in fast if len(r.collection) > 1)
    assert steps == [11, 12, 12]
    assert_same(fast, reference.gradient_sis(model, images, tau, k=2, collection=True), collection=True)
    assert assert_sets_sufficient(model, images, fast) == sum(len(r.collection) for r in fast)


def _either_of_the_first_two(x):
    """Probabilities [f, 1 - f] with f = 0.9 (x0 + x1 - x0 x1) (0.9 when x0 or x1 is 1), for x [N, p]."""
    f = 0.9 * (x[:, 0] + x[:, 1] - x[:, 0] * x[:, 1])
    return torch.stack([f, 1 - f], 1)


@pytest.mark.parametrize("p", [6, 20])
def test_host_reads_per_round_do_not_grow_with_the_steps(p):
    # Round 1: every gradient is 0 (x0 and x1 each cover for the other): ties go to the lowest id, so feature 0
    # goes first; then only masking x1 costs (df/dM1 = -0.9): it goes last. FindSIS: {1} (0.9 >= 0.85). Round 2
    # (without feature 1): 0 goes last, SIS {0}; the rest (neither 0 nor 1) scores 0 < tau: no third round.
    from overinterp_fast.runtime import sync

    with sync.counting() as reads:
        res = of.fast_sis(_either_of_the_first_two, torch.ones(2, p), 0.85, method="gradient",
                          outputs="probabilities", collection=True, options=of.GradientOptions(k=1))
    for r in res:
        assert [c.order.tolist() for c in r.collection] == [[0, *range(2, p), 1], [*range(2, p), 0]]
        assert [c.sis.tolist() for c in r.collection] == [[1], [0]]
        assert r.values.tolist() == pytest.approx([0.9] * (p - 1) + [0.0])
    # 2p - 1 steps, the same reads: one at the start, then per round the selection, FindSIS's one chunk of
    # prefixes (on a CPU: j = 0, 1) and f of the input without the round's SIS
    assert reads.by_label == {"start": 1, "round": 2, "prefixes": 2, "rest": 2}
    assert reads.count == 7


@cuda
def test_backselect_never_waits_for_the_gpu(monkeypatch):
    from overinterp_fast.methods import gradient

    strict = gradient._backselect

    def no_sync(*args, **kwargs):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
        try:
            return strict(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(gradient, "_backselect", no_sync)
    model = make_cnn(0).cuda()
    images = make_images(4, seed=50).cuda()
    with torch.no_grad():
        tau = 0.5 * torch.softmax(model(images), 1).max(1).values
    fast = of.fast_sis(model, images, tau, method="gradient", collection=True, options=of.GradientOptions(k=2))
    ref = reference.gradient_sis(model, images, tau, k=2, collection=True)
    assert_same(fast, ref, collection=True)
    # float32 with the defaults on CUDA: bf16 autocast, channels_last gradient steps
    model32, images32 = make_cnn(1, torch.float32).cuda(), make_images(6, seed=5, dtype=torch.float32).cuda()
    res = of.fast_sis(model32, images32, 0.3, method="gradient", collection=True, options=of.GradientOptions(k=3))
    assert any(r.sis is not None for r in res)
    assert assert_sets_sufficient(model32.cpu(), images32.cpu(), res, rel=1e-5) == sum(
        len(r.collection) for r in res)


@cuda
def test_autocast_auto_is_bf16_on_cuda():
    from overinterp_fast.methods.gradient import check_autocast

    want = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    assert check_autocast("auto", "cuda") is want and check_autocast("auto", torch.device("cuda", 0)) is want


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads the CPU's flags from /proc/cpuinfo")
def test_autocast_auto_on_the_cpu_is_bf16_only_with_bf16_hardware():
    from overinterp_fast.methods.gradient import check_autocast

    want = AUTO_ON_THIS_CPU
    assert check_autocast("auto") is want and check_autocast("auto", torch.device("cpu")) is want
    assert check_autocast("bf16", "cpu") is torch.bfloat16  # explicit values hold everywhere


@pytest.mark.parametrize("hardware", [False, True])
def test_autocast_auto_follows_the_cpu_and_the_images_dtype(monkeypatch, hardware):
    from overinterp_fast.methods import gradient

    monkeypatch.setattr(gradient, "cpu_has_bf16", lambda: hardware)
    assert gradient.check_autocast("auto", "cpu") is (torch.bfloat16 if hardware else None)
    # float64 (and low-precision) images keep their dtype: autocast would cut float64 to bf16
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        assert gradient.check_autocast("auto", "cpu", dtype) is None
    assert gradient.check_autocast(None, "cpu") is None and gradient.check_autocast(False, "cpu") is None


class _FormatRecorder(torch.nn.Module):
    """A conv and a linear head; records per call (x requires grad: a gradient step, x channels_last, the conv
    weight channels_last)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 5 * 5, 3)
        self.calls = []

    def forward(self, x):
        cl = torch.channels_last
        self.calls.append((x.requires_grad, x.is_contiguous(memory_format=cl) and not x.is_contiguous(),
                           self.conv.weight.is_contiguous(memory_format=cl) and not self.conv.weight.is_contiguous()))
        return self.head(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.parametrize("channels_last,dtype,used", [(None, torch.float32, True), (False, torch.float32, False),
                                                      (None, torch.float64, False), (True, torch.float64, True)])
def test_channels_last_gradient_steps_leave_the_model_alone(channels_last, dtype, used):
    model = _FormatRecorder().to(dtype).eval()
    weight = model.conv.weight
    before = {name: (t.data_ptr(), t.stride()) for name, t in model.named_parameters()}
    res = of.fast_sis(model, make_images(2, seed=3, dtype=dtype), 0.3, method="gradient",
                      options=of.GradientOptions(k=5, channels_last=channels_last))
    backward = [c for c in model.calls if c[0]]
    assert len(backward) == 5  # 25 pixels, k = 5: one call per step for both images
    assert all(c[1:] == (used, used) for c in backward)
    assert not any(c[1] or c[2] for c in model.calls if not c[0])  # FindSIS and checks: the model as given
    assert model.conv.weight is weight and weight.grad is None
    assert {name: (t.data_ptr(), t.stride()) for name, t in model.named_parameters()} == before
    assert assert_sets_sufficient(model, make_images(2, seed=3, dtype=dtype), res, rel=1e-5) == sum(
        r.sis is not None for r in res)


@pytest.mark.parametrize("seed,k", [(0, 3), (3, 2)])
def test_channels_last_float64_equals_transcription(seed, k):
    model = make_cnn(seed)
    images = make_images(5, seed=seed + 30)
    fast = of.fast_sis(model, images, 0.3, method="gradient", collection=True,
                       options=of.GradientOptions(k=k, channels_last=True))
    assert_same(fast, reference.gradient_sis(model, images, 0.3, k=k, collection=True), collection=True)


def test_mask_expander_views_pixel_maps_and_gathers_others():
    from overinterp_fast.methods.gradient import MaskExpander

    pixels = torch.arange(6).view(1, 2, 3).expand(3, 2, 3)
    patches = torch.tensor([[0, 0, 1], [2, 2, 1]]).expand(3, 2, 3)
    flipped = torch.arange(6).flip(0).view(2, 3).expand(3, 2, 3)
    cases = [(pixels, 6, 1, True), (torch.arange(4), 4, 0, True), (patches, 3, 2, False), (flipped, 6, 1, False),
             (torch.tensor([[0, 0, 1], [1, 0, 1]]), 2, None, False)]
    for fmap, p, lead, broadcast in cases:
        got_lead, flag = MaskExpander.probe(fmap, p)
        assert (got_lead, bool(flag)) == (lead, broadcast)
        expand = MaskExpander(fmap.contiguous(), lead if broadcast else None)
        m = torch.rand(2, p, dtype=torch.float64, requires_grad=True)
        out = expand(m)
        assert out.dim() == 1 + fmap.dim() and torch.equal(out.expand(2, *fmap.shape), m.detach()[:, fmap])
        weights = torch.rand(2, *fmap.shape, dtype=torch.float64)
        (g,) = torch.autograd.grad((out * weights).sum(), m)
        want = torch.zeros(2, p, dtype=torch.float64)
        for j, f in enumerate(fmap.flatten().tolist()):  # each element's weight goes to its feature
            want[:, f] += weights.flatten(1)[:, j]
        assert torch.allclose(g, want, rtol=1e-15, atol=0)


def _one_conv(size, classes=10):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(),
                               torch.nn.Linear(4 * size * size, classes)).eval()


def test_a_gradient_step_dispatches_at_most_nine_ops_outside_the_model():
    from overinterp_fast.methods.gradient import MaskExpander, RoundSteps
    from overinterp_fast.runtime.opcount import counting_ops

    model = _one_conv(8)
    x = make_images(3, h=8, w=8, seed=2, dtype=torch.float32)
    present = torch.ones(3, 64, dtype=torch.bool)
    present[1, :5] = False
    expand = MaskExpander(torch.arange(64).view(1, 8, 8).expand(3, 8, 8), 1)
    state = RoundSteps(model, "logits", x, torch.zeros(1, 3, 8, 8), 3, 64, 4, None, expand)
    state.load(x, torch.zeros(1, 3, 8, 8), torch.tensor([0, 3, 7]), present)
    step, changed = state.step(slice(0, 3))
    step()  # the first call also makes its autograd seed
    with counting_ops(model) as ops:
        step()
    assert ops.forward_calls == 1
    # lerp, softmax, gather, the gradient's sum, f's record, key, sort, scatter, the step counter
    assert ops.outside <= 9, dict(ops.by_op)
    assert changed[0].data_ptr() == state.rec.data_ptr()


def test_glue_ops_per_forward_call_and_no_read_inside_a_round():
    # one conv layer, 8 images of 3 x 32 x 32, k = 16: 64 gradient steps (bench_gradient.py's proxies run the same
    # at 64 x 64, k = 64)
    from overinterp_fast.runtime import sync
    from overinterp_fast.runtime.opcount import counting_ops

    model = _one_conv(32)
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tau = (0.9 * torch.softmax(model(x), 1).max(1).values).tolist()
    with counting_ops(model) as ops, sync.counting() as reads:
        res = of.fast_sis(model, x, tau, method="gradient", options=of.GradientOptions(k=16, autocast=None))
    assert all(r.sis is not None and r.sis.numel() > 0 for r in res)
    assert ops.outside_per_call <= 10, (ops.outside, ops.forward_calls, ops.by_op.most_common(12))
    assert set(reads.by_label) == {"start", "round", "prefixes"} and reads.by_label["round"] == 1
    assert all(r.info.step == "eager" for r in res)


class _Tied(torch.nn.Module):
    """A conv, a linear head and an embedding-like table tied to the head's weight (read by an elementwise op)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 5 * 5, 3)
        self.other = torch.nn.Linear(4 * 5 * 5, 3)
        self.other.weight = self.head.weight  # held by two layers: not cast

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.head(h) + 0.0 * self.other.weight.sum()


def test_weights_are_laid_out_and_cast_once_and_put_back():
    from overinterp_fast.methods.gradient import LaidOutWeights

    model = _Tied().eval()
    own = {name: (t, t.data_ptr(), t.stride(), t.dtype) for name, t in model.named_parameters(remove_duplicate=False)}
    weights = LaidOutWeights(model, channels_last=True, cast=torch.bfloat16)
    with weights.installed():
        inside = dict(model.named_parameters(remove_duplicate=False))
        conv_w = inside["conv.weight"]
        assert conv_w.dtype == torch.bfloat16 and conv_w.is_contiguous(memory_format=torch.channels_last)
        assert inside["conv.bias"].dtype == torch.bfloat16 and not conv_w.requires_grad
        assert inside["head.bias"].dtype == torch.bfloat16
        assert inside["head.weight"] is own["head.weight"][0]  # tied: left alone
        with weights.installed():  # blocks nest
            pass
        assert model.conv.weight is conv_w
    assert {name: (t, t.data_ptr(), t.stride(), t.dtype) for name, t in model.named_parameters(
        remove_duplicate=False)} == own
    with weights.installed():  # the copies are made once
        assert model.conv.weight is conv_w


def test_a_model_returning_wider_scores_keeps_its_values_exact():
    # float32 images, float64 probabilities: f is recorded in float64 beside the float32 records
    weights = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125], dtype=torch.float64)

    def model(x):
        s = (x.double() * weights).sum(1) / 3.0
        return torch.stack([s, 1 - s], 1)

    x = torch.ones(2, 5)
    x[1, 0] = 0.5
    fast = of.fast_sis(model, x, 0.3, method="gradient", outputs="probabilities", collection=True,
                       options=of.GradientOptions(k=2, autocast=None))
    ref = reference.gradient_sis(model, x, 0.3, k=2, outputs="probabilities", collection=True)
    assert_same(fast, ref, collection=True)
    assert fast[0].values.tolist() == ref[0].values.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_images_rank_in_their_own_dtype(dtype):
    model = make_cnn(2, dtype, h=6, w=6)
    images = make_images(3, h=6, w=6, seed=4, dtype=dtype)
    res = of.fast_sis(model, images, 0.3, method="gradient", collection=True, options=of.GradientOptions(k=4))
    assert any(r.sis is not None for r in res)
    assert assert_sets_sufficient(model.double(), images.double(), res, rel=1e-2) >= 1
    for r in res:
        assert sorted(r.order.tolist()) == list(range(36))


def _equal_rounds(a, b):
    for x, y in zip(a, b):
        for u, v in zip(x.collection or [x], y.collection or [y]):
            assert u.order.tolist() == v.order.tolist() and u.blocks.tolist() == v.blocks.tolist()
            assert torch.allclose(u.values, v.values, rtol=1e-5, atol=1e-7)
            assert (u.sis is None) == (v.sis is None) and (u.sis is None or u.sis.tolist() == v.sis.tolist())


@cuda
@pytest.mark.parametrize("autocast", [None, "bf16"])
def test_captured_gradient_steps_equal_eager_ones_and_read_once_per_capture(monkeypatch, autocast):
    from overinterp_fast.runtime import graphs, sync

    model = make_cnn(1, torch.float32, h=6, w=6).cuda()
    images = make_images(4, h=6, w=6, seed=5, dtype=torch.float32).cuda()
    opts = of.GradientOptions(k=2, autocast=autocast)  # 18 steps in the first round
    of.fast_sis(model, images, 0.3, method="gradient", options=opts)  # cuDNN plans, kernels
    with sync.counting() as reads:
        graphed = of.fast_sis(model, images, 0.3, method="gradient", collection=True, options=opts)
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    with sync.counting() as eager_reads:
        eager = of.fast_sis(model, images, 0.3, method="gradient", collection=True, options=opts)
    _equal_rounds(graphed, eager)
    assert graphed[0].info.step == "cuda-graph" and all(r.info.step == "eager" for r in eager)
    # besides the eager run's reads, one check per captured step function, nothing else
    extra = dict(reads.by_label)
    checks = extra.pop("graph check")
    assert 1 <= checks <= sum(len(r.collection) for r in graphed) and extra == eager_reads.by_label


class _ReadsTheHost(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = make_cnn(1, torch.float32, h=6, w=6)

    def forward(self, x):
        out = self.net(x)
        return out + 0.0 * float(out.detach().abs().max())  # a host read: no capture can hold it


@cuda
def test_a_step_that_cannot_be_captured_runs_eagerly_with_the_same_results(monkeypatch, caplog):
    import logging
    from overinterp_fast.runtime import graphs

    model = _ReadsTheHost().cuda().eval()
    images = make_images(3, h=6, w=6, seed=5, dtype=torch.float32).cuda()
    opts = of.GradientOptions(k=2, autocast=None)
    with caplog.at_level(logging.WARNING, logger="overinterp_fast"):
        got = of.fast_sis(model, images, 0.3, method="gradient", options=opts)
    assert [r.info.step for r in got] == ["eager"] * 3
    assert len([r for r in caplog.records if "CUDA graphs of these steps off" in r.getMessage()]) == 1
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    _equal_rounds(got, of.fast_sis(model, images, 0.3, method="gradient", options=opts))
