"""MinimalPixelSet (overinterp_fast/attr/minimal.py): the ranking is ReX's map (the reference transcription's),
the attribution gives it back, and the sets are fast_sis(method="responsibility")'s."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.attr import MinimalPixelSet
from overinterp_fast.methods import reference
from helpers import PatchReader, assert_same_lists, assert_same_result, fake_terminal, top1_on, whole_message


def _x(n=2):
    return 0.5 + torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


MODEL = PatchReader(slice(3, 9), slice(2, 7), need=0.4)


def test_order_is_the_reference_map_s_ranking_and_the_set_restores_the_top1_class():
    model, x = MODEL.eval(), _x()
    # monotone=False and pixel blocks: the ranking is the map of ReX's descents (depth 10, boxes of 10 pixels)
    got = MinimalPixelSet(model, iterations=3, seed=1, monotone=False, block=1).find_sis(x)
    plain = reference.responsibility(model, x, iterations=3, seed=1)
    for r, (ref_map, _), img in zip(got, plain, x):
        flat = ref_map.flatten().tolist()
        want = sorted(range(256), key=lambda j: (-flat[j], -j))  # descending; ties: the higher index first
        assert r.order.tolist() == want
        torch.testing.assert_close(r.values, ref_map.flatten()[r.order], rtol=0, atol=1e-12)
        assert r.sis is not None and top1_on(model, img, r.mask) == r.target


def test_attribute_gives_the_ranking_back():
    model, x = MODEL.eval(), _x()
    mps = MinimalPixelSet(model, iterations=2)
    got = mps.attribute(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    for a, r in zip(got, mps.find_sis(x)):
        assert torch.equal(a[0], a[2])
        scores = a[0].flatten()
        assert torch.argsort(scores, descending=True, stable=True).tolist() == r.order.tolist()
        assert scores[r.order[0]] == 256 and scores[r.order[-1]] == 1


@pytest.mark.parametrize("options", [dict(), dict(iterations=3, refine=False), dict(criterion="threshold",
                                                                                     prefix_search="scan", block=2)])
def test_find_sis_equals_fast_sis(options):
    model, x = MODEL.eval(), _x()
    tau = {"threshold": 0.4} if options.get("criterion") == "threshold" else {}  # top-1 has no threshold
    got = MinimalPixelSet(model, **tau, collection=True, **options).find_sis(x, baselines=0.25)
    fast = of.fast_sis(model, x, tau.get("threshold"), method="responsibility", baselines=0.25, collection=True,
                       options=of.MinimalPixelSetOptions(**options))
    assert_same_lists(got, fast, assert_same_result, collection=True)
    assert all(a.total_queries == b.total_queries and a.minimal == b.minimal for a, b in zip(got, fast))


def test_another_method_s_option_is_refused():
    model = MODEL.eval()
    for option in ("depth", "min_box", "k", "incremental", "step", "virtual_iterations", "monotone_memory"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
            MinimalPixelSet(model, **{option: 1})
    with pytest.raises(ValueError, match=whole_message("block must be 'auto' or an int >= 1, got 0")):
        MinimalPixelSet(model, block=0)
    with pytest.raises(ValueError, match=whole_message(
            "MinimalPixelSet works on images [N, C, H, W] with the default pixel features (feature_mask=None)")):
        MinimalPixelSet(model).find_sis(_x(1), feature_mask=torch.arange(256).view(16, 16) // 16)


@pytest.mark.parametrize("show", [True, False])
def test_show_progress_draws_a_bar(monkeypatch, show):
    tty = fake_terminal(monkeypatch)
    MinimalPixelSet(MODEL.eval(), iterations=1).find_sis(_x(1), show_progress=show)
    if show:
        assert "responsibility:" in "".join(tty.text).replace("\r", "\n")
    else:
        assert "".join(tty.text) == ""


def test_a_job_takes_a_few_fixed_shapes_and_a_second_job_adds_none():
    """Every forward call of a minimal pixel set job is padded to one of the ladder's shapes (at most 8, the same
    for every job of the model), so cuDNN plans and CUDA graphs are made once per model, not per job or seed."""
    from helpers import tiny_cnn
    from overinterp_fast.runtime.batching import ladder_sizes
    from overinterp_fast.runtime.opcount import counting_ops
    from overinterp_fast.zoo.imagenet import load_photos

    model = tiny_cnn(0)
    x, _, _ = load_photos(32, ["chelsea", "coffee", "astronaut"])
    with counting_ops(model) as first:
        of.fast_sis(model, x[:1], method="responsibility", engine="torch")
    with counting_ops(model) as second:
        res = of.fast_sis(model, x[1:], method="responsibility", engine="torch", options=of.MinimalPixelSetOptions(
            seed=7))
    rows = lambda ops: {s[0] for s in ops.shapes}  # noqa: E731
    # 3 x 32 x 32 images: 2^17 elements make 42 rows, so the ladder's top is 32
    assert rows(first) == set(ladder_sizes(32)) == {1, 2, 4, 8, 16, 32}
    assert rows(second) <= rows(first) and len(first.shapes) <= 8
    assert all(r.mask is not None for r in res)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_each_shape_is_captured_once_per_model_not_per_seed(monkeypatch):
    from helpers import tiny_cnn
    from overinterp_fast.runtime import graphs
    from overinterp_fast.runtime.batching import LADDER_RUNGS
    from overinterp_fast.zoo.imagenet import load_photos

    model = tiny_cnn(0).cuda()
    x, _, _ = load_photos(32, ["chelsea", "coffee", "astronaut"])
    x = x.cuda()
    first = of.fast_sis(model, x[:1], method="responsibility", engine="torch")
    captured = dict(graphs.for_model(model).graphs)
    assert 1 <= len(captured) <= LADDER_RUNGS
    later = of.fast_sis(model, x[1:], method="responsibility", engine="torch",
                        options=of.MinimalPixelSetOptions(seed=7))
    again = graphs.for_model(model).graphs
    assert set(again) == set(captured) and all(again[k] is captured[k] for k in captured)  # nothing new
    monkeypatch.setenv(graphs.ENV_VAR, "0")  # the same sets without graphs
    for got, want in ((first, of.fast_sis(model, x[:1], method="responsibility", engine="torch")),
                      (later, of.fast_sis(model, x[1:], method="responsibility", engine="torch",
                                          options=of.MinimalPixelSetOptions(seed=7)))):
        assert [r.mask.tolist() for r in got] == [r.mask.tolist() for r in want]
