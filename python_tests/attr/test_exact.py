"""ExactSIS (overinterp_fast/attr/exact.py): Captum's argument forms, the attribution, and the same sets as
fast_sis and the reference transcription."""
import re

import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import ExactSIS
from overinterp_fast.methods import reference
from helpers import assert_same_lists, assert_same_result, fake_terminal, make_cnn, make_images, whole_message


def _same(a, b, collection=False):
    assert_same_lists(a, b, assert_same_result, collection)


def _tau(model, x):
    """A threshold some images pass and some do not."""
    with torch.no_grad():
        top = torch.softmax(model(x), 1).max(1).values.sort().values
    return float(top[0] + top[1]) / 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attribute_is_the_masking_order_as_scores_of_the_inputs_shape(dtype):
    model, x = make_cnn(0, dtype), make_images(3, dtype=dtype)
    sis = ExactSIS(model, threshold=0.5)
    got = sis.attribute(x)
    assert got.shape == x.shape and got.dtype == dtype and got.device == x.device
    results = sis.find_sis(x)
    for a, r in zip(got, results):
        assert torch.equal(a[0], a[1]) and torch.equal(a[0], a[2])  # every channel of a pixel: its score
        scores = a[0].flatten()
        # the t-th masked (1-based) scores t: descending scores give the order back from the last masked
        assert scores.tolist() == [float(r.order.tolist().index(j) + 1) for j in range(25)]
        assert torch.argsort(scores, descending=True).tolist() == r.order.flip(0).tolist()


def test_attribute_of_a_feature_mask_gives_every_element_its_feature_s_score():
    model, x = make_cnn(1), make_images(2)
    patches = (torch.arange(5).view(-1, 1) // 2) * 3 + torch.arange(5).view(1, -1) // 2  # 9 patches of 5 x 5
    got = ExactSIS(model, threshold=0.5).attribute(x, feature_mask=patches)
    (r0, r1) = of.fast_sis(model, x, 0.5, feature_mask=patches)
    for a, r in zip(got, (r0, r1)):
        want = torch.zeros(9, dtype=torch.float64)
        want[r.order] = torch.arange(1, 10, dtype=torch.float64)
        assert torch.equal(a, want[patches].expand(3, 5, 5))


@pytest.mark.parametrize("collection", [False, True])
def test_find_sis_equals_fast_sis_and_the_reference(collection):
    model, x = make_cnn(2), make_images(4, seed=5)
    tau = _tau(model, x)
    got = ExactSIS(model, threshold=tau, collection=collection).find_sis(x)
    _same(got, reference.sis(model, x, tau, collection=collection), collection)
    _same(got, of.fast_sis(model, x, tau, collection=collection), collection)
    assert any(r.sis is None for r in got) and any(r.sis is not None for r in got)


def test_target_forms_as_captum_takes_them():
    logits, x = make_cnn(0), make_images(3)

    def model(t):  # probabilities, as outputs="probabilities" says
        return torch.softmax(logits(t), 1)

    sis = ExactSIS(model, threshold=0.2, outputs="probabilities")
    want = reference.sis(model, x, 0.2, target=torch.tensor([1, 3, 3]), outputs="probabilities")
    for target in ([1, 3, 3], torch.tensor([1, 3, 3])):
        _same(sis.find_sis(x, target=target), want)
    _same(sis.find_sis(x, target=3), reference.sis(model, x, 0.2, target=3, outputs="probabilities"))
    _same(sis.find_sis(x, target=torch.tensor(3)), reference.sis(model, x, 0.2, target=3, outputs="probabilities"))
    with pytest.raises(ValueError, match=whole_message(
            "target must be None, an int, or one int per example (a list or an int64 tensor [N]); tuple targets "
            "(indices into a multi-dimensional output) are not supported, got (1, 2)")):
        sis.find_sis(x, target=(1, 2))
    with pytest.raises(ValueError, match=re.escape("got [1, 2.5, 3]")):
        sis.find_sis(x, target=[1, 2.5, 3])
    with pytest.raises(ValueError, match="target classes must lie in"):
        sis.find_sis(x, target=[1, 3, 99])


def test_baselines_forms_as_captum_takes_them():
    model, x = make_cnn(3), make_images(2, seed=7)
    tau = _tau(model, x)
    sis = ExactSIS(model, threshold=tau)
    _same(sis.find_sis(x), reference.sis(model, x, tau, baselines=0.0))
    _same(sis.find_sis(x, baselines=None), reference.sis(model, x, tau, baselines=0.0))
    per_channel = torch.tensor([0.5, -0.25, 1.0], dtype=torch.float64)
    per_image = torch.randn(2, 3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for baselines in (0.25, per_channel, per_image[0], per_image[:1], per_image):
        _same(sis.find_sis(x, baselines=baselines), reference.sis(model, x, tau, baselines=baselines))
    with pytest.raises(TypeError, match=whole_message(
            "baselines must be None, a number or one tensor; tuples of baselines (several input tensors) are not "
            "supported")):
        sis.find_sis(x, baselines=(per_image,))


def test_feature_mask_forms_as_captum_takes_them():
    """Captum's feature_mask is broadcastable to the inputs, commonly [1, *D] or [1, 1, H, W] (FeatureAblation's
    convention); [N, *D] is taken when every example has the same map."""
    model, x = make_cnn(4), make_images(3, seed=2)
    rows = torch.arange(25).view(5, 5) // 5
    want = reference.sis(model, x, 0.3, feature_mask=rows)
    sis = ExactSIS(model, threshold=0.3)
    for mask in (rows, rows[None], rows[None, None], rows.expand(3, 5, 5), rows.expand(3, 3, 5, 5)):
        _same(sis.find_sis(x, feature_mask=mask), want)
    differ = rows.expand(3, 3, 5, 5).clone()
    differ[1] = rows.t()
    with pytest.raises(ValueError, match=whole_message(
            "feature_mask must be the same for every example (one map [*D] or [1, *D] for the batch); per-example "
            "feature masks are not supported")):
        sis.find_sis(x, feature_mask=differ)
    with pytest.raises(TypeError, match="tuples of masks"):
        sis.find_sis(x, feature_mask=(rows,))
    with pytest.raises(TypeError, match=whole_message(
            "inputs must be one tensor [N, *D]: multiple input tensors (a tuple of 2) are not supported; give the "
            "one tensor to explain as inputs and the others as additional_forward_args (passed to the model, never "
            "masked), or concatenate them into one tensor that a wrapper of the model splits")):
        sis.find_sis((x, x))
    with pytest.raises(TypeError, match=r"^inputs must be one tensor \[N, \*D\]: multiple input tensors \(a list of "
                                        r"1\) are not supported; "):
        sis.attribute([x])


def test_another_method_s_option_is_refused_by_python():
    model = make_cnn(0)
    for option in ("k", "iterations", "refine", "virtual_iterations", "step"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            ExactSIS(model, **{option: 1})
    with pytest.raises(ValueError, match=whole_message("incremental must be None, True or False, got 1")):
        ExactSIS(model, incremental=1)
    with pytest.raises(ValueError, match=whole_message(
            "incremental=True runs the torch model; engine must be 'auto' or 'torch', got 'compile'")):
        ExactSIS(model, incremental=True, engine="compile")
    with pytest.raises(ValueError, match="engine must be one of"):
        ExactSIS(model, engine="cuda")


@pytest.mark.parametrize("show", [True, False])
def test_show_progress_draws_a_bar_and_false_draws_none_even_on_a_terminal(monkeypatch, show):
    model, x = make_cnn(0), make_images(1)
    tty = fake_terminal(monkeypatch)
    ExactSIS(model, threshold=0.5).find_sis(x, show_progress=show)
    tty.assert_finished_bar(show, "exact SIS", 25 * 26 // 2, "cand")
    for bad in (None, 1, "yes"):
        with pytest.raises(ValueError, match=whole_message(f"show_progress must be True or False, got {bad!r}")):
            ExactSIS(model).find_sis(x, show_progress=bad)
