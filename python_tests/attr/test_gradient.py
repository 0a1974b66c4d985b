"""GradientSIS (overinterp_fast/attr/gradient.py): the attribution, and the same sets as fast_sis and the
reference transcription of batched-gradient SIS."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import GradientSIS
from overinterp_fast.methods import reference
from helpers import assert_same_lists, assert_same_result, fake_terminal, make_cnn, make_images, whole_message


def test_attribute_is_the_masking_order_as_scores_of_the_inputs_shape():
    model, x = make_cnn(0), make_images(2)
    sis = GradientSIS(model, threshold=0.3, k=4)
    got = sis.attribute(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    for a, r in zip(got, sis.find_sis(x)):
        scores = a[1].flatten()
        assert torch.equal(a[0], a[2]) and torch.equal(a[0], a[1])
        assert torch.argsort(scores, descending=True).tolist() == r.order.flip(0).tolist()
        assert sorted(scores.tolist()) == [float(t) for t in range(1, 26)]


@pytest.mark.parametrize("k, collection", [(3, False), (7, True)])
def test_find_sis_equals_fast_sis_and_the_reference(k, collection):
    model, x = make_cnn(1), make_images(3, seed=4)
    got = GradientSIS(model, threshold=0.3, k=k, collection=collection).find_sis(x, target=[0, 1, 2])
    ref = reference.gradient_sis(model, x, 0.3, k=k, collection=collection, target=torch.tensor([0, 1, 2]))
    assert_same_lists(got, ref, assert_same_result, collection)
    fast = of.fast_sis(model, x, 0.3, method="gradient", collection=collection, target=torch.tensor([0, 1, 2]),
                       options=of.GradientOptions(k=k))
    assert_same_lists(got, fast, assert_same_result, collection)


def test_baselines_and_feature_mask():
    model, x = make_cnn(2), make_images(2, seed=3)
    cols = torch.arange(25).view(5, 5) % 5
    got = GradientSIS(model, threshold=0.3, k=2).find_sis(x, baselines=0.5, feature_mask=cols[None, None])
    assert_same_lists(got, reference.gradient_sis(model, x, 0.3, k=2, baselines=0.5, feature_mask=cols),
                      assert_same_result)


def test_another_method_s_option_is_refused_by_python():
    model = make_cnn(0)
    for option in ("incremental", "engine", "iterations", "refine", "step"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            GradientSIS(model, **{option: 1})
    with pytest.raises(ValueError, match=whole_message(
            "k (features masked per gradient step) must be a positive int, got 0")):
        GradientSIS(model, k=0)
    with pytest.raises(ValueError, match=whole_message("autocast must be 'auto', None, 'bf16' or 'fp16', got 'int8'")):
        GradientSIS(model, autocast="int8")


@pytest.mark.parametrize("show", [True, False])
def test_show_progress_draws_a_bar(monkeypatch, show):
    tty = fake_terminal(monkeypatch)
    GradientSIS(make_cnn(0), threshold=0.3, k=5).find_sis(make_images(1), show_progress=show)
    if show:
        assert tty.last_line().startswith("gradient SIS: 100%")
        frames = [f for f in "".join(tty.text).replace("\r", "\n").splitlines() if f.strip()]
        # every frame drawn has the total (no empty bar of unknown length first): 5 x 5 pixels, 5 a step
        assert frames and all("/5 [" in f for f in frames), frames
    else:
        assert "".join(tty.text) == ""
