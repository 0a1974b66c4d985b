"""Audit statistics against hand-checked small cases; pixel subsets.
"""
import math
import warnings
import numpy as np
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast import audit
from overinterp_fast.methods.results import SISResult
from helpers import make_cnn, make_images


def test_keep_last_counts():
    assert audit.keep_last(torch.arange(1024)).tolist() == list(range(972, 1024))  # 52 of 1024 at 5%
    assert audit.keep_last(torch.arange(100)).numel() == 5
    assert audit.keep_last(torch.tensor([4, 2, 0]), 0.5).tolist() == [2, 0]
    with pytest.raises(ValueError):
        audit.keep_last(torch.arange(10), 0.0)


def test_pixel_and_random_subsets():
    model = make_cnn(0)
    images = make_images(3)
    res = of.fast_sis(model, images, 0.5)
    sub, keep = audit.pixel_subsets(images, res, fraction=0.1)
    assert keep.sum(1).tolist() == [3, 3, 3]  # ceil(0.1 * 25)
    for i, r in enumerate(res):
        kept = r.order[-3:]
        assert set(keep[i].nonzero().flatten().tolist()) == set(kept.tolist())
        want = torch.where(keep[i].view(5, 5), images[i], torch.zeros((), dtype=images.dtype))
        assert torch.equal(sub[i], want)
    rnd, rkeep = audit.random_subsets(images, fraction=0.1, seed=1)
    assert rkeep.sum(1).tolist() == [3, 3, 3]
    assert torch.equal(audit.random_subsets(images, 0.1, seed=1)[1], rkeep)
    assert not torch.equal(audit.random_subsets(images, 0.1, seed=2)[1], rkeep)


def test_sis_size_curve_from_order_and_values():
    r = SISResult(order=torch.tensor([3, 1, 0, 2]), values=torch.tensor([0.95, 0.6, 0.5, 0.1], dtype=torch.float64),
                  sis=None, mask=None, target=0, score=0.99, threshold=0.9)
    curve = audit.sis_size_curve([r], [0.9, 0.55, 0.05, 0.999])
    assert curve[0, :3].tolist() == [0.75, 0.5, 0.0] and math.isnan(curve[0, 3])


def test_mean_ci_t_interval():
    m, lo, hi = audit.mean_ci([1.0, 2.0, 3.0, float("nan")])
    half = 4.302652729911275 * (1.0 / math.sqrt(3))  # t(0.975, 2) * sem
    assert m == 2.0 and lo == pytest.approx(2 - half) and hi == pytest.approx(2 + half)


def test_heatmap_dice_iou_hausdorff_inside():
    a = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    b = torch.tensor([[0, 1, 0], [0, 1, 0]], dtype=torch.bool)
    assert audit.heatmap([a, b, None]).tolist() == [[0.5, 1.0, 0.0], [0.0, 0.5, 0.0]]
    assert audit.dice(a, b) == 0.5 and audit.iou(a, b) == pytest.approx(1 / 3)
    p = np.zeros((5, 5), bool)
    q = np.zeros((5, 5), bool)
    p[0, 0] = True
    q[0, 3] = q[4, 0] = True
    assert audit.hausdorff(p, q) == 4.0 and audit.hausdorff(q, p) == 4.0  # directed: 3 one way, 4 the other
    assert audit.fraction_inside(a, b) == 0.5
    with pytest.raises(ValueError):
        audit.hausdorff(p, np.zeros((5, 5), bool))


def test_kruskal_friedman_bonferroni():
    h, pv = audit.kruskal_wallis([[1, 2, 3], [4, 5, 6]])
    assert h == pytest.approx(12 / 42 * (36 / 3 + 225 / 3) - 21) and pv == pytest.approx(0.0495, abs=1e-3)
    chi2, _ = audit.friedman([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]])
    assert chi2 == pytest.approx(12 / (4 * 3 * 4) * (16 + 64 + 144) - 3 * 4 * 4)  # = 8
    assert audit.bonferroni([0.01, 0.2, 0.5]) == pytest.approx([0.03, 0.6, 1.0])


def test_rfs():
    assert audit.rfs(0.2, 0.8) == pytest.approx(0.6)
    assert audit.rfs(0.9, 0.9) == 0.0
    assert audit.rfs(0.8, 0.2) == pytest.approx(-0.6)
    assert math.isnan(audit.rfs(1.0, 1.0))


class ForegroundOnly(nn.Module):
    """Predicts class 0 when the mean of the centre 4x4 is positive: only the foreground matters."""

    def forward(self, x):
        s = x[:, :, 2:6, 2:6].mean((1, 2, 3))
        return torch.stack([8 * s, torch.zeros_like(s)], 1)


def test_noise_sensitivity_of_a_foreground_model():
    images = torch.full((64, 1, 8, 8), 0.3)
    masks = torch.zeros(64, 8, 8, dtype=torch.bool)
    masks[:, 2:6, 2:6] = True
    labels = torch.zeros(64, dtype=torch.int64)
    out = audit.noise_sensitivity(ForegroundOnly().eval(), images, masks, labels, sigma=2.0, seed=0)
    assert out["a_bg"] == 1.0 and out["a_fg"] < 0.8
    assert out["rfs"] > 0.2 and out["irfs"] > 0
    assert out["p_fg"].shape == (64,)


@pytest.mark.slow  # the digits pipeline end to end: trains 3 CNNs, exact SIS on 160 images
@pytest.mark.timeout(600)  # 3.4 s quiet; 40 s wall at a load average of 5, 60 s (13 s CPU) at 11, 345 s at 19
def test_digits_pipeline_end_to_end_on_a_tiny_budget():
    from overinterp_fast.audit.pipeline import digits_pipeline, format_table

    r = digits_pipeline(n_train=120, n_test=40, epochs=10, show_progress=False, seeds=(0, 1, 2))
    rows = {(row["trained_on"], row["evaluated_on"]): row for row in r["rows"]}
    bs_kind, rnd_kind = "5% backward-selection subsets", "5% random subsets"
    full = rows[("full images", "full images")]["accuracy"]
    own = rows[("full images", bs_kind)]["accuracy"]
    bs = rows[(bs_kind, bs_kind)]["runs"]
    rnd = rows[(rnd_kind, rnd_kind)]["runs"]
    assert r["pixels_kept"] == 4 and r["train_images"] == 120 and r["test_images"] == 40 and full > 0.8
    # the paper's finding: the full model still classifies its own last-5% subsets (keeping the first
    # 5% instead gives about 0.05 here, and 0.45 after retraining)
    assert own > 0.7, f"full model on its 5% backward-selection subsets: {own:.2f}"
    assert own > rows[("full images", rnd_kind)]["accuracy"] + 0.3
    # and new models learn from them: every seed's model on the backward-selection subsets beats every seed's
    # model on random 5% by a wide margin
    assert len(bs) == len(rnd) == 3 and min(bs) > max(rnd) + 0.3, f"backward-selection {bs} vs random {rnd}"
    assert "(3 runs)" in format_table(r)


def test_statistics_edge_cases_by_hand():
    # sis_size_curve: f(x) exactly tau still has a SIS; gradient results (blocks) are refused
    r = SISResult(order=torch.tensor([1, 0]), values=torch.tensor([0.5, 0.25], dtype=torch.float64),
                  sis=None, mask=None, target=0, score=0.75, threshold=0.75)
    assert audit.sis_size_curve([r], [0.75, 0.5, 0.25]).tolist() == [[1.0, 0.5, 0.0]]
    assert math.isnan(audit.sis_size_curve([r], [0.76])[0, 0])
    r.blocks = torch.tensor([0, 2])
    with pytest.raises(ValueError, match=r"^sis_size_curve needs exact-SIS results \(one value per feature\)$"):
        audit.sis_size_curve([r], [0.5])
    # mean_ci: empty, one value, another confidence level
    empty = audit.mean_ci([float("nan")])
    assert len(empty) == 3 and all(math.isnan(v) for v in empty)
    m, lo, hi = audit.mean_ci([2.5])
    assert m == 2.5 and math.isnan(lo) and math.isnan(hi)
    m, lo, hi = audit.mean_ci([1.0, 3.0], confidence=0.5)
    assert m == 2.0 and hi - m == pytest.approx(1.0 * 1.0)  # t(0.75, 1) = 1, sem = 1
    # heatmap of nothing; dice and iou of two empty sets; fraction inside of an empty set
    with pytest.raises(ValueError, match="^no masks to aggregate$"):
        audit.heatmap([None])
    e = np.zeros((2, 2), bool)
    assert audit.dice(e, e) == 1.0 and audit.iou(e, e) == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty set is answered without dividing 0 by 0
        assert math.isnan(audit.fraction_inside(e, ~e))
    full = np.ones((2, 2), bool)
    assert audit.dice(full, e) == 0.0 and audit.iou(full, e) == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        audit.dice(e, np.zeros((3, 2), bool))
    with pytest.raises(ValueError, match="^the Hausdorff distance needs two non-empty pixel sets$"):
        audit.hausdorff(e, full)
    # masks given as integers count as sets of their non-zero pixels
    assert audit.dice(np.array([[1, 2]]), full[:1]) == 1.0 and audit.dice(full[:1], np.array([[1, 2]])) == 1.0
    assert audit.hausdorff(full, full) == 0.0
    assert audit.bonferroni([]) == [] and audit.bonferroni([0.2]) == [0.2]
    assert audit.rfs(0.0, 0.5) == pytest.approx(1.0) and math.isnan(audit.rfs(0.0, 0.0))
    assert audit.irfs(0.2, 0.8) == pytest.approx(0.6)


def test_noise_sensitivity_clips_to_the_valid_range():
    images = torch.full((16, 1, 8, 8), 0.3)
    masks = torch.zeros(16, 8, 8, dtype=torch.bool)
    masks[:, 2:6, 2:6] = True
    labels = torch.zeros(16, dtype=torch.int64)
    model = ForegroundOnly().eval()
    # clipped to [0.3, 1]: the noise can only raise the foreground mean, so class 0 always stays right
    out = audit.noise_sensitivity(model, images, masks, labels, sigma=2.0, low=0.3, high=1.0, seed=0)
    assert out["a_fg"] == 1.0 and out["a_bg"] == 1.0 and math.isnan(out["rfs"])
    assert out["correct_fg"].dtype == torch.bool and out["correct_fg"].all()
    # p_fg by hand: foreground mean m of the clipped noisy centre, p = softmax([8 m, 0])[0]
    g = torch.Generator().manual_seed(0)
    noisy = (images + 2.0 * torch.randn(images.shape, generator=g)).clamp(0.3, 1.0)
    m = noisy[:, :, 2:6, 2:6].mean((1, 2, 3))
    torch.testing.assert_close(out["p_fg"], torch.sigmoid(8 * m).double())
    torch.testing.assert_close(out["p_bg"], torch.full((16,), float(torch.sigmoid(torch.tensor(2.4)))).double())
    assert out["irfs"] == pytest.approx(audit.rfs(float(out["p_fg"].mean()), float(out["p_bg"].mean())))
    only_high = audit.noise_sensitivity(model, images, masks, labels, sigma=2.0, high=0.3, seed=0)
    capped = (images + 2.0 * torch.randn(images.shape, generator=torch.Generator().manual_seed(0))).clamp(max=0.3)
    torch.testing.assert_close(only_high["p_fg"], torch.sigmoid(8 * capped[:, :, 2:6, 2:6].mean((1, 2, 3))).double())


def test_pixel_and_random_subsets_options_by_hand():
    g = torch.Generator().manual_seed(3)
    images = torch.rand(2, 3, 4, 4, generator=g, dtype=torch.float64) + 1  # N = 2, C = 3: shapes not confused
    mv = torch.tensor([-1.0, -2.0, -3.0], dtype=torch.float64)
    # default pixel features: the default fraction 0.05 keeps ceil(0.8) = 1 of 16 pixels, the last masked
    orders = [torch.arange(16), torch.arange(16).flip(0)]
    res = [SISResult(order=o, values=torch.zeros(16, dtype=torch.float64), sis=None, mask=None, target=0,
                     score=0.0, threshold=0.5) for o in orders]
    sub, keep = audit.pixel_subsets(images, res, baselines=mv)
    assert [k.nonzero().flatten().tolist() for k in keep] == [[15], [0]]
    want = mv.view(1, 3, 1, 1).expand(2, 3, 4, 4).clone()
    want[0, :, 3, 3] = images[0, :, 3, 3]
    want[1, :, 0, 0] = images[1, :, 0, 0]
    assert torch.equal(sub, want)
    # a 2x2 grid of 2x2 patches; fraction 0.5 keeps the last 2 patches of each order
    patches = (torch.arange(4).view(4, 1) // 2) * 2 + torch.arange(4).view(1, 4) // 2
    pres = [SISResult(order=o, values=torch.zeros(4, dtype=torch.float64), sis=None, mask=None, target=0,
                      score=0.0, threshold=0.5) for o in (torch.tensor([3, 2, 1, 0]), torch.tensor([0, 2, 1, 3]))]
    sub, keep = audit.pixel_subsets(images, pres, 0.5, baselines=mv, feature_mask=patches)
    assert keep.tolist() == [[True, True, False, False], [False, True, False, True]]
    for i in range(2):
        kept = keep[i][patches]  # [4, 4]
        assert torch.equal(sub[i], torch.where(kept, images[i], mv.view(3, 1, 1)))
    assert torch.equal(audit.keep_last(torch.tensor([5, 6, 7]), 1.0), torch.tensor([5, 6, 7]))
    from overinterp_fast.audit.subsets import keep_last_mask

    assert keep_last_mask(torch.arange(40).flip(0)).nonzero().flatten().tolist() == [0, 1]  # default 5%
    with pytest.raises(ValueError, match=r"^fraction must lie in \(0, 1\], got 1.5$"):
        audit.keep_last(torch.arange(4), 1.5)
    with pytest.raises(ValueError, match="^1 results for 2 images$"):
        audit.pixel_subsets(images, res[:1])
    with pytest.raises(ValueError, match=r"^every result must cover all features \(use the first round"):
        audit.pixel_subsets(images, [res[0], pres[0]])
    # random subsets: the defaults (5%, seed 0, mask value 0) and the options, by hand
    sub, keep = audit.random_subsets(images)
    assert keep.shape == (2, 16) and sub.shape == images.shape
    gen = torch.Generator().manual_seed(0)
    for i in range(2):
        assert keep[i].nonzero().flatten().tolist() == sorted(torch.randperm(16, generator=gen)[:1].tolist())
        assert torch.equal(sub[i], torch.where(keep[i].view(4, 4), images[i], torch.zeros((), dtype=torch.float64)))
    sub, keep = audit.random_subsets(images, 0.5, seed=4, baselines=mv, feature_mask=patches)
    gen = torch.Generator().manual_seed(4)
    for i in range(2):
        assert keep[i].nonzero().flatten().tolist() == sorted(torch.randperm(4, generator=gen)[:2].tolist())
        assert torch.equal(sub[i], torch.where(keep[i][patches], images[i], mv.view(3, 1, 1)))
