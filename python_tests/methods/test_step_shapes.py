"""The steps' batch shapes and CUDA graphs, as a CPU sees them.

On a GPU each batch shape of the exact loop is one captured graph, and a capture costs warm-up calls, a device
wait and memory. These tests hold, on the CPU's stand-in count (runtime.graphs: the captures a GPU would make, by
the same rule), what the first GPU run depends on: a few shapes per job, captured once per model and image shape,
reused by a later job with another number of images; padding that adds little to backward selection's own rows;
the gradient method's steps captured once per shape per job. Every result is also the reference transcription's.
"""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.methods import reference
from overinterp_fast.runtime import graphs, model_state

MAX_SHAPES = 8  # batch shapes (and so captures) an exact job may take
MAX_PADDING = 1.15  # rows the steps run over backward selection's own


class NearFree(torch.nn.Module):
    """One linear layer on the flattened 1-channel image (the loop benchmark's near-free model), float64."""

    def __init__(self, side: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(side * side, 10).double()

    def forward(self, x):
        return 5 * self.linear(x.flatten(1))


def _images(n, side, seed):
    return torch.randn(n, 1, side, side, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _sets(results):
    return [None if r.sis is None else r.sis.tolist() for r in results]


@pytest.mark.parametrize("side, first, second", [(8, 64, 50), (16, 1, 3)])
def test_a_second_job_with_another_number_of_images_adds_no_shape(side, first, second):
    model = NearFree(side).eval()
    jobs = []
    for n, seed in ((first, 1), (second, 2)):
        images = _images(n, side, seed)
        results = of.ExactSIS(model, threshold=0.5, incremental=False).find_sis(images)
        # exact, whatever the shapes (an image's SIS is its own: the reference on a few of them)
        assert _sets(results[:3]) == _sets(reference.sis(model, images[:3], 0.5))
        steps = results[0].info.steps
        p = side * side
        assert steps.graphs == "stand-in" and steps.rows >= n * p * (p + 1) // 2
        jobs.append(steps)
    one, two = jobs
    assert 1 <= len(one.shapes) <= MAX_SHAPES and set(two.shapes) <= set(one.shapes)
    assert 1 <= one.captures <= MAX_SHAPES and two.captures == 0  # the first job's graphs serve the second
    assert one.replays > 0 and two.replays > 0
    for steps, n in zip(jobs, (first, second)):
        own = n * (side * side) * (side * side + 1) // 2
        assert steps.rows <= MAX_PADDING * own


def test_graphs_off_count_nothing(monkeypatch):
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    model = NearFree(8).eval()
    results = of.ExactSIS(model, threshold=0.5, incremental=False).find_sis(_images(4, 8, 1))
    steps = results[0].info.steps
    assert steps.graphs == "off" and steps.captures == steps.replays == 0 and len(steps.shapes) >= 1


def test_a_kept_step_serves_the_next_job_and_a_larger_one_replaces_it():
    from overinterp_fast.methods.exact_step import MIN_CAPACITY

    model = NearFree(8).eval()
    exact = of.ExactSIS(model, threshold=0.5, incremental=False, batch_size=256)
    exact.find_sis(_images(2, 8, 1))
    (kept,) = model_state.state_of(model).table("step").values()
    assert kept.fn is None and kept.capacity >= MIN_CAPACITY  # kept without the model, with room for more images
    exact.find_sis(_images(3, 8, 2))
    assert list(model_state.state_of(model).table("step").values()) == [kept]
    results = exact.find_sis(_images(kept.capacity + 1, 8, 3))
    (bigger,) = model_state.state_of(model).table("step").values()
    assert bigger is not kept and bigger.capacity > kept.capacity
    assert results[0].info.steps.captures >= 1  # new buffers: their graphs are captured anew


def test_gradient_steps_are_captured_once_per_shape_per_job():
    from helpers import make_cnn, make_images

    model = make_cnn(0, h=8, w=8)
    images = make_images(4, h=8, w=8, seed=3)
    results = of.GradientSIS(model, threshold=0.3, k=2, collection=True).find_sis(images)
    steps = results[0].info.steps
    rounds = max(len(r.collection or [r]) for r in results)
    assert rounds >= 3  # later rounds of one image step the same slice: a capture per round would show
    assert steps.graphs == "stand-in" and 1 <= steps.captures <= len(steps.shapes) < rounds + 1
    assert steps.replays > 0


def test_an_onnx_runtime_model_is_never_captured():
    from helpers import make_cnn, make_images

    model = make_cnn(0, torch.float32)
    images = make_images(2, seed=3, dtype=torch.float32)
    results = of.ExactSIS(model, threshold=0.3, engine="onnxruntime").find_sis(images)
    steps = results[0].info.steps
    assert results[0].engine == "onnxruntime"
    assert steps.graphs == "off" and steps.captures == steps.replays == 0
