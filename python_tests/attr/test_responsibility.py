"""Responsibility (overinterp_fast/attr/responsibility.py): the maps of of.responsibility and of the reference
transcription of ReX's descents, and the attribution broadcast over channels."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import Responsibility
from overinterp_fast.methods import reference
from helpers import fake_terminal, make_cnn, make_images, whole_message


def test_compute_maps_equals_the_reference_and_the_function_form():
    model = make_cnn(2, torch.float32, h=12, w=12)
    x = make_images(2, h=12, w=12, seed=4, dtype=torch.float32)
    got = Responsibility(model, iterations=3, seed=2, min_box=4).compute_maps(x)
    plain = reference.responsibility(model, x, iterations=3, seed=2, min_box=4)
    same = of.responsibility(model, x, iterations=3, seed=2, min_box=4)
    for a, (ref_map, _), b in zip(got, plain, same):
        torch.testing.assert_close(a.map, ref_map, rtol=0, atol=1e-12)
        assert torch.equal(a.map, b.map) and a.queries == b.queries and a.iterations == 3
    assert any(bool((m.map != m.map.flatten()[0]).any()) for m in got), "flat maps test nothing"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attribute_is_the_map_broadcast_over_channels(dtype):
    model, x = make_cnn(0, dtype, h=12, w=12), make_images(2, h=12, w=12, dtype=dtype)
    resp = Responsibility(model, iterations=2, min_box=4)
    got = resp.attribute(x, target=[1, 2], baselines=0.25)
    assert got.shape == x.shape and got.dtype == dtype
    maps = resp.compute_maps(x, target=[1, 2], baselines=0.25)
    assert [m.target for m in maps] == [1, 2]
    for a, m in zip(got, maps):
        assert torch.equal(a, m.map.to(dtype).expand(3, 12, 12))


def test_options_defaults_and_refusals():
    model, x = make_cnn(0), make_images(1)
    assert Responsibility(model).options == of.ResponsibilityOptions(8, 0, 10, 10, "top1", None)
    for option in ("refine", "block", "k", "incremental", "collection", "gated_iterations"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            Responsibility(model, **{option: 1})
    with pytest.raises(ValueError, match=whole_message(
            "Responsibility works on images [N, C, H, W] with the default pixel features (feature_mask=None)")):
        Responsibility(model).compute_maps(x, feature_mask=torch.arange(25).view(5, 5) // 5)
    with pytest.raises(ValueError, match=whole_message("criterion must be one of ('top1', 'threshold'), got 'top5'")):
        Responsibility(model, criterion="top5")


def test_threshold_criterion_uses_the_threshold():
    model, x = make_cnn(1, h=12, w=12), make_images(1, h=12, w=12)
    low = Responsibility(model, iterations=2, min_box=4, criterion="threshold", threshold=0.0).compute_maps(x)
    high = Responsibility(model, iterations=2, min_box=4, criterion="threshold", threshold=1.0).compute_maps(x)
    assert bool((low[0].map != high[0].map).any())
    assert bool((high[0].map == 0).all())  # nothing passes f >= 1: no descent adds to the map


@pytest.mark.parametrize("show", [True, False])
def test_show_progress_draws_a_bar(monkeypatch, show):
    tty = fake_terminal(monkeypatch)
    Responsibility(make_cnn(0), iterations=1, min_box=4).compute_maps(make_images(1), show_progress=show)
    if show:
        assert tty.last_line().startswith("responsibility:") and "level" in tty.last_line()
    else:
        assert "".join(tty.text) == ""
