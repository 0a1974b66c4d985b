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
    """A small CNN that counts, inside its own forward pass, the rows it computed (hooks or none): ``rows`` its own,
    ``RowCounting.total`` those of every instance, copies made of it (a channels_last copy) included."""

    total = 0

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                                 nn.Linear(16, 5))
        self.rows = 0

    def forward(self, x):
        if not isinstance(x, torch.fx.Proxy):  # not while incremental inference traces the model
            self.rows += x.shape[0]
            RowCounting.total += x.shape[0]
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
    start = RowCounting.total
    rows, res = recorded_calls(model, images, None)
    assert sum(rows) == RowCounting.total - start > 0  # the model's calls and its channels_last copy's
    assert len(res) == 1


def test_cifar_figures_and_projections_by_hand():
    """bench_cifar's derived figures: rates, the share of the ceiling, the re-scored share, and projections from
    the faster run whose SIS equal float32's (labelled as projections of the measured images)."""
    from bench_cifar import summarize

    row = {"candidates": 1000, "images": 2, "side": 16, "ceiling_rows_per_s": 400.0, "float32_s": 5.0}
    out = summarize(row)
    assert out["rows_per_s"] == 200.0 and out["fraction_of_ceiling"] == 0.5 and out["projected_from"] == "float32"
    assert out["images_per_hour"] == pytest.approx(1440.0)  # 2.5 s per image
    assert out["projected_hours_10000"] == pytest.approx(10_000 * 2.5 / 3600)
    assert out["projected_hours_60000"] == pytest.approx(60_000 * 2.5 / 3600)
    assert out["projection"].startswith("projection: 2 measured images of 16x16 (float32)")
    row.update(bf16_s=4.0, bf16_info={"rescored": 50, "candidates": 1000}, same_sis_as_float32=True)
    out = summarize(row)
    assert out["bf16_rows_per_s"] == 250.0 and out["bf16_over_float32"] == 1.25 and out["rescored_share"] == 0.05
    assert out["projected_from"] == "bf16" and out["projected_hours_10000"] == pytest.approx(10_000 * 2.0 / 3600)
    row["same_sis_as_float32"] = False  # a faster run with other SIS is never the projection's
    assert summarize(row)["projected_from"] == "float32"


def test_ceiling_times_each_size_and_stops_at_out_of_memory():
    from common import ceiling

    sizes_run = []

    def model(x):
        if x.shape[0] > 8:
            raise torch.OutOfMemoryError("too large")
        sizes_run.append(x.shape[0])
        return torch.zeros(x.shape[0], 3)

    rates = ceiling(model, torch.zeros(2, 3, 4, 4), None, [8, 4, 16, 32], "cpu", min_s=0.0, min_calls=2)
    assert sorted(rates) == [4, 8] and all(r > 0 for r in rates.values())
    assert sizes_run == [4] * 3 + [8] * 3  # one untimed call, then the timed ones, per size


def test_the_pytest_benchmark_cases_stay_outside_the_suite_and_their_baseline_covers_them():
    """``pytest python_tests`` (the suite's only test path) never collects benchmarks/; the stored baseline that
    ``--benchmark-compare`` checks holds every case of benchmarks/test_bench_*.py."""
    import ast
    import glob
    import json
    import tomllib

    root = os.path.dirname(BENCH)
    with open(os.path.join(root, "pyproject.toml"), "rb") as fh:
        assert tomllib.load(fh)["tool"]["pytest"]["ini_options"]["testpaths"] == ["python_tests"]
    cases = set()
    for path in sorted(glob.glob(os.path.join(BENCH, "test_bench_*.py"))):
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                params = [d for d in node.decorator_list if isinstance(d, ast.Call) and ast.unparse(d.func)
                          == "pytest.mark.parametrize"]
                values = ast.literal_eval(params[0].args[1]) if params else [None]
                cases |= {node.name if v is None else f"{node.name}[{v}]" for v in values}
    assert {"test_mask_apply", "test_backselect_update", "test_rect_fill", "test_patch_gather",
            "test_exact_loop[linear8-px]", "test_exact_loop[linear24-px]"} <= cases
    (baseline,) = glob.glob(os.path.join(BENCH, "baseline", "*", "*.json"))
    with open(baseline) as fh:
        assert {b["name"] for b in json.load(fh)["benchmarks"]} == cases


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
    # the ladder's shapes (runtime.batching.ladder): powers of two, at most 8, the same for the model's second job
    assert len(first["batch_shapes"]) <= 8 and second["new_batch_shapes"] == 0
    assert all(b & (b - 1) == 0 for b in first["batch_shapes"] + second["batch_shapes"])


def test_bench_estimate_reads_the_announced_estimate_and_times_the_run_after_it():
    """bench_estimate records the estimate each run announces (not one it makes itself), the time from the
    announcement to the run's end (within the whole call's), and their ratio; the library's announced is restored."""
    import bench_estimate
    from overinterp_fast.runtime import estimate

    import time

    real = estimate.announced
    t0 = time.perf_counter()
    row = bench_estimate.run_config("cnn8-px", 1)
    elapsed = time.perf_counter() - t0
    assert estimate.announced is real
    (run,) = row["runs"]
    assert row["images"] == 2 and row["features"] == 64
    assert run["line"].startswith("exact SIS of 2 images x 64 features: 4,160 forward rows")  # 2 x 64 x 65 / 2
    assert 0 < run["measured_s"] <= run["call_s"] <= elapsed and run["estimate_s"] > 0


def test_exact_loop_cost_splits_the_step_kernels_from_the_host(monkeypatch):
    """The loop's cost per call is split into the step kernels' own time (their profiler self time) and the host's
    rest: 2 ms of host work planted in every step is not in the kernels' share."""
    import time

    from bench_exact import STEP_KERNELS, run_loop_cost
    from overinterp_fast.methods.exact_step import DenseStep

    plain = run_loop_cost("linear8-px", 4, "cpu", rounds=1, warmup=False)
    assert set(plain["kernels_us_per_call"]) == set(STEP_KERNELS)
    assert all(v > 0 for v in plain["kernels_us_per_call"].values())  # both kernels ran once per batch
    real = DenseStep.__call__

    def slow(self, block, done):
        time.sleep(0.002)
        real(self, block, done)

    monkeypatch.setattr(DenseStep, "__call__", slow)
    planted = run_loop_cost("linear8-px", 4, "cpu", rounds=1, warmup=False)
    # the kernels' share is their own time alone: the 2 ms a call of host work planted around them is not in it
    # (the host's share is the loop's time less theirs; a loop time taken on a loaded machine is too noisy to test)
    assert 0 < sum(planted["kernels_us_per_call"].values()) < 1000


def test_responsibility_against_an_earlier_run_uses_its_side_by_side_rounds(tmp_path):
    """--against sets ReX's side-by-side time (never its cached one) against ours now on the same photos and seeds,
    and says whether ours still finds that run's sets and queries."""
    from bench_responsibility import against_recorded, recorded_timing

    rows = [{"photo": "a", "ours_mps_pixels_by_seed": [10, 12], "ours_queries_by_seed": [100, 90]},
            {"photo": "b", "ours_mps_pixels_by_seed": [5, 6], "ours_queries_by_seed": [80, 70]}]
    timing = [{"seed": 40, "photos": ["a", "b"], "rex_s": 30.0, "ours_s": 6.0, "ratio": 5.0}]
    old = {"commit": "f" * 40, "date": "2026-11-28", "rows": [dict(r) for r in rows],
           "summary": {"rex_seeds": [0, 20], "rex_time_per_image_s": 99.0, "rex_median_queries": 400.0,
                       "steadiness": {"timing_rounds": timing}}}
    path = str(tmp_path / "old.json")
    again = [{**t, "ours_now_s": 5.0} for t in recorded_timing(old, path)]
    a = against_recorded(old, path, rows, {"seeds": [0, 20], "ours_median_queries": 100.0}, again)
    side = a["side_by_side"]
    assert side["rex_s_per_image"] == 15.0 and side["ours_now_s_per_image"] == 2.5
    assert side["ratio"] == 6.0 and side["ratio_then"] == 5.0 and a["query_ratio"] == 4.0
    assert a["same_mps_as_recorded"] and a["same_queries_as_recorded"]
    changed = [dict(rows[0]), {**rows[1], "ours_mps_pixels_by_seed": [5, 7]}]
    assert not against_recorded(old, path, changed, {"seeds": [0, 20], "ours_median_queries": 100.0},
                                again)["same_mps_as_recorded"]
    with pytest.raises(SystemExit, match="another set of photos or seeds"):
        against_recorded(old, path, rows, {"seeds": [0, 40], "ours_median_queries": 100.0}, again)
    old["summary"]["steadiness"]["timing_rounds"] = []
    with pytest.raises(SystemExit, match="no side-by-side timing rounds"):
        recorded_timing(old, path)


def test_gradient_step_ceiling_times_one_image_as_given_and_the_batch_through_the_steps_model():
    """The float32 step ceiling times the transcription's step shape (one image, the model as given) and the
    batch through the model the defaults' steps call (channels_last for a conv model), per image."""
    from bench_gradient import small_cnn_case, step_ceiling

    model, images, _ = small_cnn_case(3, "cpu")
    calls = []
    model.register_forward_pre_hook(lambda m, args: calls.append((args[0].shape[0], args[0].is_contiguous(
        memory_format=torch.channels_last) and not args[0].is_contiguous())))
    c = step_ceiling(model, images, rounds=2)
    assert c["channels_last_steps"] is True
    assert sorted(set(calls)) == [(1, False), (3, True)] and len(calls) == 2 * 3  # a warm-up and two rounds each
    assert c["ceiling"] == c["transcription_step_s"] / c["batched_step_s_per_image"] > 0


def test_shapes_probe_counts_graphs_turned_off_and_frees_the_model():
    """bench_shapes' probe of two successive jobs: the second adds no step shape and captures nothing, every job
    is timed, a warning that turns a graph off is counted, and the model is freed once the probe deletes it."""
    import logging

    import bench_shapes

    row = bench_shapes.exact_pair("linear8-px", 4, 3)
    first, second = row["jobs"]
    assert first["captures"] == len(first["step_shapes"]) > 0 and second["captures"] == 0
    assert second["new_step_shapes"] == 0 and first["seconds"] > 0 and second["seconds"] > 0
    assert first["graphs_off"] == [] and second["graphs_off"] == []
    assert row["model_freed"] is True
    off = bench_shapes._GraphsOff()
    log = logging.getLogger("overinterp_fast.runtime.graphs")
    log.addHandler(off)
    try:
        log.warning("CUDA graph of this step off (%s); running it eagerly", "a replay differs from the eager step")
        log.warning("something else")
    finally:
        log.removeHandler(off)
    assert off.lines == ["CUDA graph of this step off (a replay differs from the eager step); running it eagerly"]
