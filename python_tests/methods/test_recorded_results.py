"""Minimal pixel sets, responsibility maps and batched-gradient SIS against results recorded from an earlier
version of the code (data/recorded_results.npz): changes that only make the methods faster (fewer batch shapes,
captured steps, fewer ops) must leave every set, query count, order and value as it was.

The models and images are float64 (float noise cannot move a decision) except for one float32 gradient case, whose
selection runs the float32 path. Regenerate only on purpose (a change of results, explained in its commit):
``python python_tests/methods/test_recorded_results.py``.
"""
import os
import sys

import numpy as np
import pytest
import torch

import overinterp_fast as of

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import make_cnn, make_images, tiny_cnn  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "recorded_results.npz")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _photos():
    from overinterp_fast.zoo.imagenet import load_photos

    x, _, _ = load_photos(32, ["chelsea", "coffee"])
    return x.double()


def _relative(model, x, share=0.9):
    with torch.no_grad():
        return (share * torch.softmax(model(x), 1).max(1).values).tolist()


def minimal_cases():
    """name -> (model, images, fast_sis keywords) of the minimal pixel set cases."""
    model = tiny_cnn(0).double()
    x = _photos()
    M = of.MinimalPixelSetOptions
    return {
        "defaults": (model, x, dict(options=M())),
        "threshold_seed3": (model, x, dict(threshold=_relative(model, x), options=M(seed=3, criterion="threshold"))),
        "auto_boundary": (model, x, dict(options=M(iterations="auto", refine="boundary", seed=1))),
        "rex_collection": (model, x, dict(collection=True, options=M(iterations=4, refine=False, seed=2))),
    }


def gradient_cases():
    """name -> (model, images, fast_sis keywords) of the batched-gradient cases."""
    G = of.GradientOptions
    m64, x64 = make_cnn(2, h=8, w=8), make_images(3, h=8, w=8, seed=7)
    m32, x32 = make_cnn(5, torch.float32, h=8, w=8), make_images(3, h=8, w=8, seed=8, dtype=torch.float32)
    base = make_images(3, h=8, w=8, seed=9) * 0.5
    return {
        "float64_collection": (m64, x64, dict(threshold=_relative(m64, x64, 0.6), collection=True,
                                              options=G(k=5))),
        "float64_baselines": (m64, x64, dict(threshold=_relative(m64, x64, 0.6), baselines=base, collection=True,
                                             options=G(k=3))),
        "float32_plain": (m32, x32, dict(threshold=_relative(m32, x32, 0.9), collection=True,
                                         options=G(k=3, autocast=None))),
    }


def _flatten(results):
    """Every round of every result, in order (the collection's rounds where there is one)."""
    return [c for r in results for c in (r.collection if r.collection else [r])]


def minimal_record(results) -> dict:
    rounds = _flatten(results)
    masks = np.stack([np.zeros((32, 32), bool) if c.mask is None else c.mask.numpy() for c in rounds])
    return {"masks": masks, "has_set": np.array([c.mask is not None for c in rounds]),
            "counts": np.array([[-1 if v is None else int(v) for v in (c.queries, c.extraction_queries,
                                                                          c.refine_queries, c.minimal)]
                                for c in rounds]),
            "per_image": np.array([len(r.collection) if r.collection else 1 for r in results])}


def gradient_record(results) -> dict:
    rounds = _flatten(results)
    return {"orders": np.concatenate([c.order.numpy() for c in rounds]),
            "lengths": np.array([c.order.numel() for c in rounds]),
            "values": np.concatenate([c.values.numpy() for c in rounds]),
            "sis": np.concatenate([np.array([], np.int64) if c.sis is None else c.sis.numpy() for c in rounds]),
            "sis_lengths": np.array([-1 if c.sis is None else c.sis.numel() for c in rounds])}


def maps_record() -> dict:
    maps = of.responsibility(tiny_cnn(0).double(), _photos(), iterations=4, seed=5, engine="torch")
    return {"maps": np.stack([m.map.numpy() for m in maps]), "queries": np.array([m.queries for m in maps])}


def record_all() -> dict:
    out = {}
    for name, (model, x, kw) in minimal_cases().items():
        res = of.fast_sis(model, x, method="responsibility", engine="torch", **kw)
        out.update({f"minimal/{name}/{k}": v for k, v in minimal_record(res).items()})
    for name, (model, x, kw) in gradient_cases().items():
        res = of.fast_sis(model, x, method="gradient", **kw)
        out.update({f"gradient/{name}/{k}": v for k, v in gradient_record(res).items()})
    out.update({f"maps/{k}": v for k, v in maps_record().items()})
    return out


@pytest.fixture(scope="module")
def recorded():
    with np.load(DATA) as data:
        return dict(data)


@pytest.mark.parametrize("name", list(minimal_cases()))
def test_minimal_pixel_sets_and_queries_are_as_recorded(recorded, name):
    model, x, kw = minimal_cases()[name]
    got = minimal_record(of.fast_sis(model, x, method="responsibility", engine="torch", **kw))
    for key, value in got.items():
        np.testing.assert_array_equal(value, recorded[f"minimal/{name}/{key}"], err_msg=f"{name}: {key}")


@pytest.mark.parametrize("name", list(gradient_cases()))
def test_gradient_sis_is_as_recorded(recorded, name):
    model, x, kw = gradient_cases()[name]
    got = gradient_record(of.fast_sis(model, x, method="gradient", **kw))
    for key in ("orders", "lengths", "sis", "sis_lengths"):
        np.testing.assert_array_equal(got[key], recorded[f"gradient/{name}/{key}"], err_msg=f"{name}: {key}")
    np.testing.assert_allclose(got["values"], recorded[f"gradient/{name}/values"], rtol=1e-12, atol=0)


def test_responsibility_maps_are_as_recorded(recorded):
    got = maps_record()
    np.testing.assert_array_equal(got["maps"], recorded["maps/maps"])
    np.testing.assert_array_equal(got["queries"], recorded["maps/queries"])


if __name__ == "__main__":
    torch.set_num_threads(1)
    os.makedirs(os.path.dirname(DATA), exist_ok=True)
    np.savez_compressed(DATA, **record_all())
    print(f"wrote {DATA}")
