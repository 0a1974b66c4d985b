"""What every Captum-shaped class shares (attr/_base.py): Captum's positional order, the old order refused or
warned where it would change meaning, the renamed keywords as fast_sis takes them, additional_forward_args passed
to the model, and the run's info."""
import inspect
import warnings

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.attr import ExactSIS, GradientSIS, MinimalPixelSet, Responsibility, SufficientSubset
from helpers import assert_same_lists, assert_same_result, make_cnn, make_images, whole_message

CAPTUM = ("inputs", "baselines", "target", "additional_forward_args", "feature_mask")
DATA_METHODS = [(ExactSIS, "find_sis"), (ExactSIS, "attribute"), (GradientSIS, "find_sis"),
                (GradientSIS, "attribute"), (MinimalPixelSet, "find_sis"), (MinimalPixelSet, "attribute"),
                (Responsibility, "compute_maps"), (Responsibility, "attribute")]


def _same(a, b):
    assert_same_lists(a, b, assert_same_result, False)


def test_positional_order_is_captums_perturbation_methods():
    captum_attr = pytest.importorskip("captum.attr")
    for captum_class in (captum_attr.FeatureAblation, captum_attr.ShapleyValueSampling, captum_attr.KernelShap):
        assert tuple(inspect.signature(captum_class.attribute).parameters)[1:6] == CAPTUM
    for cls, name in DATA_METHODS:
        assert tuple(inspect.signature(getattr(cls, name)).parameters)[1:6] == CAPTUM, (cls, name)
    for name in ("find_sis", "attribute"):  # the ranking first, then Captum's
        assert tuple(inspect.signature(getattr(SufficientSubset, name)).parameters)[1:7] == (
            "inputs", "ranking", *CAPTUM[1:])


def test_a_captum_positional_call_means_what_it_means_in_captum():
    model, x = make_cnn(0), make_images(2)
    sis = ExactSIS(model, threshold=0.5)
    want = sis.find_sis(x, baselines=0.5, target=1)
    _same(sis.find_sis(x, 0.5, 1), want)
    assert all(r.target == 1 for r in want)
    scores = sis.attribute(x, 0.0, 3)  # a float baseline and a target: the call that failed on the target's dtype
    assert torch.equal(scores, sis.attribute(x, baselines=0.0, target=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a list of ints was never a baseline: nothing changed meaning
        _same(sis.find_sis(x, None, [2, 4]), sis.find_sis(x, target=[2, 4]))
    maps = Responsibility(model, iterations=2).compute_maps(x, 0.25, 2)
    assert [m.target for m in maps] == [2, 2]
    # an integer baseline by keyword is a baseline: attribute passes it on as one, not as a positional integer
    heat = Responsibility(model, iterations=2).attribute(x, baselines=1, target=2)
    assert torch.equal(heat, Responsibility(model, iterations=2).attribute(x, 1.0, 2))


@pytest.mark.parametrize("cls, name", DATA_METHODS)
def test_an_integer_second_argument_the_target_of_the_old_order_is_refused(cls, name):
    model, x = make_cnn(0), make_images(1)
    method = getattr(cls(model), name)
    for old_target in (3, torch.tensor([3]), [3]):
        with pytest.raises(TypeError, match=whole_message(
                f"{cls.__name__}.{name}(): the argument after the inputs is baselines, as in Captum (inputs, "
                f"baselines, target, additional_forward_args, feature_mask); an integer there was the target before "
                f"overinterp_fast 0.2: give target= by keyword (or baselines= by keyword, or a float baseline)")):
            method(x, old_target)
    with pytest.raises(TypeError, match=r"^SufficientSubset\.find_sis\(\): the argument after the inputs is "):
        SufficientSubset(model).find_sis(x, torch.zeros(1, 25), 3)


def test_the_old_orders_other_calls_that_would_change_meaning_warn():
    model, x = make_cnn(0), make_images(1)
    sis = ExactSIS(model, threshold=0.5)
    with pytest.warns(FutureWarning, match=r"^ExactSIS\.find_sis\(\): the third positional argument is the target, "
                                           r"as in Captum .*; before overinterp_fast 0\.2 it was baselines"):
        got = sis.find_sis(x, None, 2)  # the order before: target None, baselines 2
    assert got[0].target == 2
    rows = torch.arange(5).view(5, 1).expand(5, 5)
    with pytest.warns(FutureWarning, match=r"the fourth positional argument is additional_forward_args, as in "
                                           r"Captum .*; before overinterp_fast 0\.2 it was feature_mask"):
        with pytest.raises(ValueError, match=r"^additional_forward_args\[0\] of shape \(5, 5\) must have one row "):
            sis.find_sis(x, 0.0, 1, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sis.find_sis(x, 0.0, 1, None, rows)  # Captum's order in full: no warning
        sis.find_sis(x, None, None, feature_mask=rows)


def test_float_targets_say_the_order_is_captums():
    model, x = make_cnn(0), make_images(1)
    with pytest.raises(TypeError, match=r"^target must be None, an int, or one int per example \(a list or an int64 "
                                        r"tensor \[N\]\), got 0\.5 \(positional arguments follow Captum: inputs, "
                                        r"baselines, target, additional_forward_args, feature_mask\)$"):
        ExactSIS(model).find_sis(x, 0.0, 0.5)


@pytest.mark.parametrize("cls, name", DATA_METHODS)
def test_the_classes_take_the_old_keyword_names_as_fast_sis_does(cls, name):
    model, x = make_cnn(0), make_images(1)
    kw = {"iterations": 2} if cls in (MinimalPixelSet, Responsibility) else {}
    obj = cls(model, **kw)
    with pytest.warns(FutureWarning, match=rf"^{cls.__name__}\.{name}\(\): 'mask_value' is now 'baselines'; the "
                                           rf"name 'mask_value' will be removed") as seen:
        old = getattr(obj, name)(x, mask_value=0.5)
    assert [w.filename for w in seen if "mask_value" in str(w.message)] == [__file__]  # the caller's line
    new = getattr(obj, name)(x, baselines=0.5)
    if isinstance(new, torch.Tensor):
        assert torch.equal(old, new)
    else:
        assert [getattr(r, "order", getattr(r, "map", None)).tolist() for r in old] == \
            [getattr(r, "order", getattr(r, "map", None)).tolist() for r in new]
    with pytest.warns(FutureWarning, match="'progress' is now 'show_progress'"):
        getattr(obj, name)(x, progress=False)
    with pytest.raises(TypeError, match="got both 'mask_value' and 'baselines'"):
        getattr(obj, name)(x, mask_value=0.5, baselines=0.5)
    with pytest.warns(FutureWarning, match="'features' is now 'feature_mask'"):
        if cls in (MinimalPixelSet, Responsibility):  # pixels only: the map is taken, then refused
            with pytest.raises(ValueError, match="with the default pixel features"):
                getattr(obj, name)(x, features=torch.arange(25).view(5, 5) // 5)
        else:
            getattr(obj, name)(x, features=torch.arange(25).view(5, 5) // 5)


class Scaled(nn.Module):
    """A CNN called as model(x, scale, shift): the logits times a per-example scale [N, 1], plus a shift (a number
    shared by every example)."""

    def __init__(self):
        super().__init__()
        self.net = make_cnn(3)

    def forward(self, x, scale, shift=0.0):
        return self.net(x) * scale + shift


def _scales():
    return torch.tensor([[0.2], [1.5]], dtype=torch.float64)


@pytest.mark.parametrize("cls, kw", [(ExactSIS, {}), (GradientSIS, {"k": 4}), (MinimalPixelSet, {"iterations": 2}),
                                     (Responsibility, {"iterations": 2})])
def test_additional_forward_args_reach_the_model_with_each_examples_row(cls, kw):
    """Each example's result equals that of a model closing over its own row of the arguments."""
    model, x, scales = Scaled().eval(), make_images(2, seed=4), _scales()
    obj = cls(model, **kw)
    run = obj.compute_maps if cls is Responsibility else obj.find_sis
    got = run(x, None, None, (scales, 0.25))
    for i in range(2):
        alone = cls(lambda t, s=scales[i:i + 1]: model(t, s.expand(t.shape[0], 1), 0.25), **kw)
        want = (alone.compute_maps if cls is Responsibility else alone.find_sis)(x[i:i + 1])
        if cls is Responsibility:
            assert torch.equal(got[i].map, want[0].map) and got[i].queries == want[0].queries
        else:
            _same(got[i:i + 1], want)
    assert got[0].info["examples"] == "one at a time: additional_forward_args hold one value per example"
    one = run(x[:1], additional_forward_args=scales[:1])  # one example: one run, the row expanded per batch
    assert "examples" not in one[0].info


def test_additional_forward_args_with_a_ranking_and_their_errors():
    model, x, scales = Scaled().eval(), make_images(2, seed=4), _scales()
    ranking = torch.randn(2, 25, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = SufficientSubset(model, threshold=0.5).find_sis(x, ranking, additional_forward_args=scales)
    for i in range(2):
        want = SufficientSubset(lambda t, s=scales[i:i + 1]: model(t, s.expand(t.shape[0], 1)),
                                threshold=0.5).find_sis(x[i:i + 1], ranking[i:i + 1])
        _same(got[i:i + 1], want)
    with pytest.raises(ValueError, match=whole_message(
            "additional_forward_args[0] of shape (3, 1) must have one row per example (first dimension 2, as the "
            "inputs'), as Captum takes them")):
        ExactSIS(model).find_sis(x, additional_forward_args=torch.ones(3, 1))
    with pytest.raises(ValueError, match=whole_message(
            "ExactSIS: additional_forward_args need a torch model or a callable; an ONNX model takes the inputs "
            "alone")):
        ExactSIS("model.onnx").find_sis(x, additional_forward_args=scales)
    with pytest.raises(ValueError, match=r"^GradientSIS: additional_forward_args are not passed to an ensemble"):
        GradientSIS([model, model]).find_sis(x, additional_forward_args=scales)


def test_fast_sis_auto_is_the_audits_rule():
    """method="auto": exact SIS up to 1,024 features, gradient SIS above for a torch model; the choice in info."""
    from overinterp_fast.audit.runner import resolve_method
    from overinterp_fast.methods.choice import AUTO_EXACT_FEATURES

    model, x = make_cnn(0), make_images(2)
    got = of.fast_sis(model, x, 0.5, method="auto")
    _same(got, of.fast_sis(model, x, 0.5, method="exact"))
    assert got[0].info["method"] == "exact (auto: 25 features, at most 1024)"
    big = make_images(1, h=33, w=33)  # 1,089 pixels
    net = make_cnn(0, h=33, w=33)
    assert resolve_method("auto", big.shape, [net]) == "gradient" and 33 * 33 > AUTO_EXACT_FEATURES
    auto = of.fast_sis(net, big, 0.5, method="auto", options=of.GradientOptions(k=64))
    _same(auto, of.fast_sis(net, big, 0.5, method="gradient", options=of.GradientOptions(k=64)))
    assert auto[0].info["method"] == "gradient (auto: 1089 features, more than 1024)"
    rows = torch.arange(33).view(33, 1).expand(33, 33)  # 33 features: exact, whatever the pixels
    assert of.fast_sis(net, big, 0.5, method="auto", feature_mask=rows)[0].info["method"].startswith("exact")
