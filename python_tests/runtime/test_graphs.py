"""runtime.graphs: CUDA graphs of the forward pass, one per batch shape, with an eager fallback."""
import logging

import pytest
import torch

from overinterp_fast.runtime import graphs
from helpers import cuda, make_cnn, make_images


class Calls(torch.nn.Module):
    """A small CNN that counts its Python-level calls (a replayed graph makes none)."""

    def __init__(self, sync=False):
        super().__init__()
        self.net = make_cnn(0).float()
        self.calls, self.sync = 0, sync

    def forward(self, x):
        self.calls += 1
        out = self.net(x)
        if self.sync:
            out = out * float(out.abs().max())  # a host read: cannot be captured
        return out


def test_on_the_cpu_the_model_runs_as_it_is():
    model = Calls().eval()
    g = graphs.GraphedForward(model)
    x = make_images(3).float()
    with torch.no_grad():
        assert torch.equal(g(x), model.net(x))
    assert model.calls == 1 and g.graphs == {} and g.failed is None


def test_graphs_are_kept_per_model_while_its_tensors_stay_put():
    model = Calls().eval()
    first = graphs.for_model(model)
    assert graphs.for_model(model) is first
    model.double()  # new parameter tensors: the old graphs would read freed memory
    assert graphs.for_model(model) is not first
    assert graphs.for_model(lambda x: x) is not None  # a plain callable is accepted too


def test_the_switch(monkeypatch):
    for value, on in (("0", False), ("off", False), ("false", False), ("1", True)):
        monkeypatch.setenv(graphs.ENV_VAR, value)
        assert graphs.enabled() is on
    monkeypatch.delenv(graphs.ENV_VAR)
    assert graphs.enabled()


@cuda
def test_replays_equal_eager_and_run_no_python():
    model = Calls().cuda().eval()
    g = graphs.GraphedForward(model)
    seen = set()
    with torch.inference_mode():
        for rows in (4, 8, 4, 8, 4):
            x = make_images(rows, seed=rows).float().cuda()
            before = model.calls
            got = g(x)
            assert model.calls - before == (0 if rows in seen else 4)  # 2 warm-ups, the capture, the eager check
            seen.add(rows)
            torch.testing.assert_close(got, model.net(x), rtol=1e-5, atol=1e-5)
    assert len(g.graphs) == 2 and g.failed is None


@cuda
def test_a_model_that_reads_the_host_falls_back_with_one_line(caplog):
    model = Calls(sync=True).cuda().eval()
    g = graphs.GraphedForward(model)
    x = make_images(4).float().cuda()
    with caplog.at_level(logging.WARNING, logger="overinterp_fast"), torch.inference_mode():
        out = g(x)
        out2 = g(x)
    assert g.failed is not None and g.graphs == {}
    assert len([r for r in caplog.records if "CUDA graphs off" in r.getMessage()]) == 1
    with torch.inference_mode():
        want = model(x)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(out2, want)


@cuda
def test_fast_sis_with_graphs_equals_without(monkeypatch):
    import overinterp_fast as of

    model = make_cnn(1).float().cuda().eval()
    images = make_images(3, seed=5).float().cuda()
    with_graphs = of.fast_sis(model, images, 0.3, collection=True)
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    without = of.fast_sis(model, images, 0.3, collection=True)
    for a, b in zip(with_graphs, without):
        assert (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert a.sis.tolist() == b.sis.tolist()
