"""The benchmarks' floors count every forward row a method ran.

A replayed CUDA graph runs a model's kernels without calling the module, so a forward hook misses it. Here a
graph's replay is played on the CPU by a forward call that skips the module's hooks (``module.forward``), wherever
graphs are enabled: the rows a benchmark records must still be every row the model computed.
"""
import os
import sys

import pytest
import torch
from torch import nn

from overinterp_fast.runtime import graphs, job

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)


class RowCounting(nn.Module):
    """A small CNN that counts, inside its own forward pass, the rows it computed (hooks or none)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                 nn.Linear(16, 5))
        self.rows = 0

    def forward(self, x):
        if not isinstance(x, torch.fx.Proxy):  # not while incremental inference traces the model
            self.rows += x.shape[0]
        return self.net(x)


@pytest.fixture
def replays(monkeypatch):
    """Wherever graphs are enabled, the model's calls bypass its hooks, as a graph's replay does."""
    real = job.fixed_shapes

    def fixed_shapes(fn, runner, *policy):
        real(fn, runner, *policy)
        if graphs.enabled() and isinstance(fn.model, nn.Module):
            fn.run = fn.model.forward

    monkeypatch.setattr(job, "fixed_shapes", fixed_shapes)
    monkeypatch.delenv(graphs.ENV_VAR, raising=False)


def _computed_rows(model, fn):
    """fn wrapped to note the rows the model computed in each of its runs."""
    runs = []

    def wrapped():
        start = model.rows
        out = fn()
        runs.append(model.rows - start)
        return out

    return wrapped, runs


def test_responsibility_floor_counts_replayed_calls(replays):
    from bench_responsibility import Counted
    from common import explain

    model = RowCounting().eval()
    images = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    fn, runs = _computed_rows(model, lambda: explain(model, images, method="responsibility", seed=0,
                                                     iterations=2))
    t, res, rows = Counted(model, "cpu", graph_replays=True).run(fn)
    assert runs[0] > 0 and len(res) == 2
    assert sum(rows) == runs[0]  # every row of the timed run, replayed or not
    assert sum(rows) >= sum(r.total_queries for r in res)  # each query is a row (padding adds more)
    # the hooks of the timed run alone see none of the replayed calls: what the floor used to count
    _, _, hooked = Counted(model, "cpu", graph_replays=False).run(
        lambda: explain(model, images, method="responsibility", seed=0, iterations=2))
    assert sum(hooked) < runs[0]


def test_exact_recorded_calls_count_replayed_calls(replays):
    from bench_exact import recorded_calls

    model = RowCounting().eval()
    images = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    start = model.rows
    rows, res = recorded_calls(model, images, None)
    assert sum(rows) == model.rows - start > 0
    assert len(res) == 1


def test_gradient_proxies_count_the_step_and_the_job():
    from bench_gradient import job_proxies, small_cnn_case, step_proxies

    model, images, _ = small_cnn_case(2, "cpu")
    step = step_proxies(model, images, 100, steps=1)
    assert step["ops_per_step"] <= 9 and step["host_ms_per_step_meta"] > 0 and step["host_ms_model_meta"] > 0
    job = job_proxies(size=16, n=4, k=16)  # 16 steps
    assert job["forward_calls"] >= job["steps"] == 16
    assert set(job["reads_by_label"]) == {"start", "round", "prefixes"} and job["reads_by_label"]["round"] == 1
    assert job["ops_per_forward_call"] <= 12  # 9 per step, the job's set-up and FindSIS spread over 16 steps


def test_responsibility_proxies_count_two_jobs():
    from bench_responsibility import proxies

    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    px = proxies(images, 0, iterations=2)
    first, second = px["jobs"]
    assert first["photos"] == second["photos"] == 1
    assert len(first["batch_shapes"]) <= 8 and second["new_batch_shapes"] == len(
        set(second["batch_shapes"]) - set(first["batch_shapes"]))
    assert first["rounds"] == sum(first["reads_by_label"].values())
    assert first["ops_per_round"] == first["ops_outside"] / first["rounds"]
