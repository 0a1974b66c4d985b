"""runtime.model_state: one state per model, one rule for staleness, and nothing kept alive.

A method's call keeps things for its model (format, calibration, engines, plans, dense steps, graphs). These tests
hold the rule that says when they are stale, and that a model the user deletes is freed with all of it: after any
method's call, a weak reference to the model dies at ``gc.collect()``.
"""
import gc
import weakref

import pytest
import torch

import overinterp_fast as of
from overinterp_fast.runtime import model_state
from overinterp_fast.runtime.model import Ensemble
from helpers import make_cnn, make_images, tiny_cnn


def _kept(model, kind="top", key="k"):
    state = model_state.state_of(model)
    return None if state is None else state.get(kind, key)


def test_a_value_is_kept_while_the_model_stays_the_same():
    model = make_cnn(0)
    model_state.state_of(model).put("top", "k", 7)
    assert _kept(model) == 7
    assert model_state.state_of(model) is model_state.state_of(model)


@pytest.mark.parametrize("change", ["in place", "replaced", "train", "dtype", "autocast"])
def test_any_change_the_stamp_covers_drops_the_state(change):
    model = make_cnn(0)
    model_state.state_of(model).put("top", "k", 7)
    if change == "in place":
        with torch.no_grad():
            model.conv1.weight.mul_(1.0)  # same values: the version counter still moves
    elif change == "replaced":
        model.conv1.weight = torch.nn.Parameter(model.conv1.weight.detach().clone())
    elif change == "train":
        model.train()
    elif change == "dtype":
        model.float()
    if change == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _kept(model) is None  # an outer autocast changes what a kept step computes
        assert _kept(model) is None  # and back: the state made under autocast is stale too
    else:
        assert _kept(model) is None


def test_a_derived_copy_shares_its_origin_state_weakly():
    model = make_cnn(0)
    state = model_state.state_of(model)
    copy = model_state.adopt(make_cnn(1), state)
    assert model_state.state_of(copy) is state
    with torch.no_grad():
        model.conv1.weight.add_(1.0)
    fresh = model_state.state_of(model)
    assert fresh is not state
    del state
    gc.collect()
    assert model_state.state_of(copy) is None  # the origin's old state went: nothing is kept for the copy


def test_an_ensemble_keeps_its_state_with_its_first_member_per_set_of_members():
    a, b, c = make_cnn(0), make_cnn(1), make_cnn(2)
    model_state.state_of(Ensemble([a, b])).put("top", "k", 1)
    assert _kept(Ensemble([a, b])) == 1  # a new Ensemble object of the same members
    assert _kept(Ensemble([a, c])) is None
    assert _kept(a) is None  # the member's own state is another
    ref = weakref.ref(b)
    del b
    gc.collect()
    assert ref() is None  # the first member's state does not keep the other members alive


def test_a_model_that_cannot_be_weakly_referenced_keeps_nothing():
    class Slotted:
        __slots__ = ()

        def __call__(self, x):
            return x.flatten(1)

    assert model_state.state_of(Slotted()) is None


class Untraceable(torch.nn.Module):
    """A CNN with data-dependent control flow: torch.fx cannot trace it, so incremental inference steps aside (and
    the reason is kept in the model's state)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        y = self.conv(x)
        if y.sum() > 1e9:
            y = 2 * y
        return self.head(y.flatten(1))


def _freed(run, make=lambda: tiny_cnn(3).double()) -> bool:
    """Run ``run(model)`` on a fresh model, drop it, and tell whether it was freed."""
    model = make()
    ref = weakref.ref(model)
    run(model)
    del model
    gc.collect()
    return ref() is None


_IMAGES = make_images(2, h=8, w=8, seed=4)


@pytest.mark.parametrize("method", ["exact dense", "exact incremental", "exact untraceable", "exact channels_last",
                                    "gradient", "minimal pixel sets", "ensemble"])
def test_a_deleted_model_is_freed_after_any_method(method):
    before = model_state.kept_models()

    def run(model):
        if method == "exact dense":
            of.ExactSIS(model, threshold=0.2, incremental=False).find_sis(_IMAGES)
        elif method in ("exact incremental", "exact untraceable"):
            of.ExactSIS(model, threshold=0.2, incremental=None if method == "exact untraceable" else True
                        ).find_sis(_IMAGES)
        elif method == "exact channels_last":
            of.ExactSIS(model.float(), threshold=0.2, incremental=False, channels_last=True).find_sis(_IMAGES.float())
        elif method == "gradient":
            of.GradientSIS(model, threshold=0.2).find_sis(_IMAGES)
        elif method == "minimal pixel sets":
            of.MinimalPixelSet(model).find_sis(_IMAGES)
        else:
            of.fast_sis([model, tiny_cnn(4).double()], _IMAGES, 0.2)
        assert model_state.kept_models() > before  # the call did keep something for the model

    make = (lambda: Untraceable().double().eval()) if method == "exact untraceable" else (lambda: tiny_cnn(3).double())
    assert _freed(run, make)
    assert model_state.kept_models() == before
