"""The options dataclasses (overinterp_fast/attr/options.py): the defaults (one value per option name), frozen,
checked when made, and the single source of the classes' and the function forms' defaults."""
import dataclasses
import inspect

import pytest
import torch

import overinterp_fast as of
from overinterp_fast import attr
from overinterp_fast.attr.options import RunOptions
from helpers import make_cnn, make_images, whole_message

DEFAULTS = {
    of.ExactOptions: dict(incremental=None, score_dtype=None, channels_last=None),
    of.GradientOptions: dict(k=100, autocast="auto", channels_last=None),
    of.ResponsibilityOptions: dict(iterations=8, seed=0, depth=10, min_box=10, criterion="top1", monotone=None),
    of.MinimalPixelSetOptions: dict(iterations=8, seed=0, criterion="top1", monotone=None, refine=True,
                                    refine_budget="auto", block="auto", prefix_search="guided"),
    of.SubsetOptions: dict(criterion="threshold", step=1, refine=True, refine_budget="auto"),
    RunOptions: dict(threshold=0.9, outputs="logits", engine="auto", batch_size=None, collection=False),
}
CLASSES = {of.ExactSIS: of.ExactOptions, of.GradientSIS: of.GradientOptions, of.Responsibility:
           of.ResponsibilityOptions, of.MinimalPixelSet: of.MinimalPixelSetOptions,
           of.SufficientSubset: of.SubsetOptions}


@pytest.mark.parametrize("cls", list(DEFAULTS))
def test_defaults_and_frozen(cls):
    opts = cls()
    assert dataclasses.asdict(opts) == DEFAULTS[cls]
    name = next(iter(DEFAULTS[cls]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(opts, name, 1)


@pytest.mark.parametrize("cls", list(CLASSES))
def test_every_class_takes_its_options_as_keywords_with_the_same_defaults(cls):
    params = inspect.signature(cls).parameters
    # a method with a pass criterion takes threshold=None: RunOptions' where its criterion has one, refused with
    # "top1", which has none
    run = {**DEFAULTS[RunOptions], **({"threshold": None} if "criterion" in DEFAULTS[CLASSES[cls]] else {})}
    for name, value in {**DEFAULTS[CLASSES[cls]], **run}.items():
        if name in params:
            assert params[name].default == value and params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert set(DEFAULTS[CLASSES[cls]]) <= set(params)
    assert cls(make_cnn(0)).options == CLASSES[cls]()


def test_the_function_forms_share_the_defaults():
    for fn, cls in ((of.responsibility, of.ResponsibilityOptions), (of.sufficient_subset, of.SubsetOptions)):
        params = inspect.signature(fn).parameters
        assert {n: params[n].default for n in DEFAULTS[cls]} == DEFAULTS[cls]
    params = inspect.signature(of.fast_sis).parameters
    assert params["threshold"].default is None and params["engine"].default == "auto"
    assert params["options"].default is None
    assert [r.threshold for r in of.fast_sis(make_cnn(0), make_images(1))] == [RunOptions.threshold]


@pytest.mark.parametrize("make, message", [
    (lambda: of.ExactOptions(incremental="auto"), "incremental must be None, True or False, got 'auto'"),
    (lambda: of.ExactOptions(score_dtype="bf16"),
     "score_dtype must be None, torch.bfloat16 or torch.float16 (or the images' dtype), got 'bf16'"),
    (lambda: of.ExactOptions(score_dtype=torch.int8),
     "score_dtype must be None, torch.bfloat16 or torch.float16 (or the images' dtype), got torch.int8"),
    (lambda: of.ExactOptions(channels_last=1), "channels_last must be None, True or False, got 1"),
    (lambda: of.GradientOptions(k=True), "k (features masked per gradient step) must be a positive int, got True"),
    (lambda: of.ResponsibilityOptions(depth=0), "depth must be an int >= 1, got 0"),
    (lambda: of.ResponsibilityOptions(iterations="auto"), "iterations must be an int >= 1, got 'auto'"),
    (lambda: of.ResponsibilityOptions(monotone=0), "monotone must be None, True or False, got 0"),
    (lambda: of.MinimalPixelSetOptions(refine="yes"), "refine must be True, False or 'boundary', got 'yes'"),
    (lambda: of.MinimalPixelSetOptions(refine_budget=-1), "refine_budget must be 'auto', an int >= 0 or None, got -1"),
    (lambda: of.MinimalPixelSetOptions(prefix_search="binary"),
     "prefix_search must be one of ('guided', 'scan'), got 'binary'"),
    (lambda: of.MinimalPixelSetOptions(criterion=None), "criterion must be one of ('top1', 'threshold'), got None"),
    (lambda: of.SubsetOptions(step=1.5), "step must be a positive int, got 1.5"),
    (lambda: RunOptions(engine="gpu"), None),
])
def test_bad_values_are_one_line_errors(make, message):
    with pytest.raises(ValueError) as err:
        make()
    assert "\n" not in str(err.value)
    if message is not None:
        assert str(err.value) == message
    else:
        assert str(err.value).startswith("engine must be one of")


def test_auto_iterations_is_a_minimal_pixel_set_option():
    assert of.MinimalPixelSetOptions(iterations="auto").iterations == "auto"


def test_from_options_refuses_another_class_s_options():
    with pytest.raises(ValueError,
                       match=whole_message("options of ExactSIS must be ExactOptions, got GradientOptions")):
        attr.ExactSIS.from_options(make_cnn(0), RunOptions(), of.GradientOptions())


def test_fast_sis_with_options_equals_the_class():
    model, x = make_cnn(0), make_images(2)
    a = of.fast_sis(model, x, 0.3, method="gradient", options=of.GradientOptions(k=3))
    b = of.GradientSIS(model, threshold=0.3, k=3).find_sis(x)
    assert [r.order.tolist() for r in a] == [r.order.tolist() for r in b]
