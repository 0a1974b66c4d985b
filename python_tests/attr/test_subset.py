"""SufficientSubset (overinterp_fast/attr/subset.py): rankings [N, p], [N, *grid] and attributions of the inputs'
shape (Captum's, reduced to per-feature sums), and the sets of sufficient_subset."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import SufficientSubset
from helpers import assert_same_lists, assert_same_result, make_cnn, make_images, whole_message

captum_attr = pytest.importorskip("captum.attr")


def _f(model, x, target, keep, baseline=0.0):
    """f(x_S) by hand: softmax probability of ``target`` with only the pixels ``keep`` (bool [H, W]) kept."""
    with torch.no_grad():
        kept = torch.where(keep, x, torch.as_tensor(baseline, dtype=x.dtype))
        return float(torch.softmax(model(kept[None]), 1)[0, target])


def test_the_first_passing_prefix_by_hand_and_the_function_form():
    model, x = make_cnn(0), make_images(2, seed=3)
    ranking = torch.randn(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sub = SufficientSubset(model, threshold=0.3, refine=False)
    got = sub.find_sis(x, ranking)
    assert_same_lists(got, of.sufficient_subset(model, x, ranking, 0.3, refine=False), assert_same_result)
    for r, img, rank in zip(got, x, ranking):
        order = sorted(range(25), key=lambda j: (-float(rank.flatten()[j]), -j))
        assert r.order.tolist() == order
        size = next(k for k in range(1, 26) if _f(model, img, r.target, torch.isin(
            torch.arange(25), torch.tensor(order[:k])).view(5, 5)) >= 0.3)
        assert r.sis.tolist() == order[:size]


def test_refine_default_prunes_to_a_one_minimal_set():
    model, x = make_cnn(1), make_images(1, seed=2)
    (r,) = SufficientSubset(model, threshold=0.3).find_sis(x, torch.arange(25.0).view(1, 25))
    keep = r.mask.clone()
    assert _f(model, x[0], r.target, keep) >= 0.3 and r.minimal is True
    for j in r.sis.tolist():  # removing any one feature breaks the criterion
        keep[j // 5, j % 5] = False
        assert _f(model, x[0], r.target, keep) < 0.3
        keep[j // 5, j % 5] = True


@pytest.mark.parametrize("method", ["IntegratedGradients", "Saliency"])
def test_a_captum_attribution_and_feature_mask_reduce_to_per_feature_sums(method):
    model, x = make_cnn(2), make_images(2, seed=5)
    patches = (torch.arange(5).view(-1, 1) // 2) * 3 + torch.arange(5).view(1, -1) // 2  # 9 patches
    attr = getattr(captum_attr, method)(model).attribute(x, target=1)
    assert attr.shape == x.shape
    sums = torch.stack([torch.stack([attr[i][:, patches == j].sum() for j in range(9)]) for i in range(2)])
    sub = SufficientSubset(model, threshold=0.1, refine=False)
    got = sub.find_sis(x, attr, target=1, feature_mask=patches[None, None])
    want = sub.find_sis(x, sums, target=1, feature_mask=patches)
    assert_same_lists(got, want, assert_same_result)
    assert all(r.sis is not None for r in got)
    # without a feature mask: pixels, the sum over each pixel's channels
    assert_same_lists(sub.find_sis(x, attr, target=1), sub.find_sis(x, attr.sum(1), target=1), assert_same_result)


def test_feature_ablation_s_feature_mask_convention():
    """Captum's FeatureAblation takes the same feature_mask ([1, 1, H, W] here); its attribution, constant on each
    feature, ranks the features as its per-feature value times the feature's size."""
    model, x = make_cnn(3), make_images(1, seed=6)
    rows = torch.arange(25).view(5, 5) // 5
    fa = captum_attr.FeatureAblation(model).attribute(x, target=2, feature_mask=rows[None, None])
    per_row = fa[0, 0, :, 0]
    got = SufficientSubset(model, threshold=0.05, refine=False).find_sis(x, fa, target=2, feature_mask=rows[None, None])
    assert got[0].values.tolist() == pytest.approx((per_row * 15).sort(descending=True).values.tolist(), rel=1e-12)


def test_attribute_is_the_set_over_the_inputs_shape():
    model, x = make_cnn(0), make_images(2)
    ranking = torch.randn(2, 25, generator=torch.Generator().manual_seed(4))
    sub = SufficientSubset(model, threshold=0.3)
    got = sub.attribute(x, ranking)
    assert got.shape == x.shape and got.dtype == x.dtype
    for a, r in zip(got, sub.find_sis(x, ranking)):
        want = torch.zeros(5, 5, dtype=x.dtype) if r.sis is None else r.mask.to(x.dtype)
        assert torch.equal(a, want.expand(3, 5, 5))


def test_rankings_and_options_refused():
    model, x = make_cnn(0), make_images(2)
    sub = SufficientSubset(model)
    for bad in (torch.randn(2, 24), torch.randn(2, 3, 5, 4), x.numpy()):
        with pytest.raises(ValueError, match=whole_message(
                "ranking must be a tensor [N, *grid] with 25 scores per image, or an attribution of the inputs' "
                "shape [2, 3, 5, 5]")):
            sub.find_sis(x, bad)
    nan = x.clone()
    nan[0, 1, 2, 2] = float("nan")
    with pytest.raises(ValueError, match=whole_message("ranking contains NaN or inf")):
        sub.find_sis(x, nan)
    for option in ("iterations", "block", "k", "collection", "incremental"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            SufficientSubset(model, **{option: 1})
    with pytest.raises(ValueError, match=whole_message("step must be a positive int, got 0")):
        SufficientSubset(model, step=0)
