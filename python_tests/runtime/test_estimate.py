"""Estimates before long runs (runtime/estimate.py): rows counted exactly, times from the calibration's call times
by hand-checked arithmetic (a fake clock), one line logged and printed above a minute, the faster method named,
and the progress bar's time left from the same estimate. Tests never assert timings of this machine."""
import hashlib
import logging
import os

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.runtime import estimate, runinfo
from overinterp_fast.runtime.calibration import Calibration
from helpers import fake_terminal, make_cnn, make_images


class RowRecorder(nn.Module):
    """A near-free model (one linear layer) that records a digest of every row it computes."""

    def __init__(self, features: int):
        super().__init__()
        torch.manual_seed(0)
        self.head = nn.Linear(features, 3).double()
        self.rows: list[bytes] = []

    def forward(self, x):
        self.rows += [hashlib.sha1(r.numpy().tobytes()).digest() for r in x.detach().reshape(x.shape[0], -1)]
        return 20 * self.head(x.flatten(1))


def test_exact_sis_computes_the_estimated_rows_exactly():
    """N images of p features: N p (p + 1) / 2 distinct candidates in the first round, besides the N images."""
    n, p = 3, 12
    model = RowRecorder(p).eval()
    x, base = torch.randn(2, n, 1, 3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    # a baseline per image: every image's fully masked candidate is its own row
    of.fast_sis(model, x, 0.0, baselines=base, options=of.ExactOptions(incremental=False), engine="torch")
    assert len(set(model.rows)) == n + n * p * (p + 1) // 2 == n + estimate.exact_rows(n, p)
    assert estimate.exact_rows(2, 1024) == 1_049_600 and estimate.exact_rows(1, 1024) == 524_800


def test_gradient_steps_and_rows():
    assert estimate.gradient_steps(1024, 100) == 11 and estimate.gradient_steps(1000, 100) == 10
    rows, seconds = estimate.gradient(2, 1024, 100, 0.01)
    # 11 steps of 2 rows, 3 forward rows each, and at most 12 prefixes per image for FindSIS
    assert rows == 22 and seconds == pytest.approx(0.01 * (22 * 3 + 2 * 12))


class FakeClock:
    """Time that passes only when a probe runs: ``per_row`` seconds per row, plus ``per_call`` per call."""

    def __init__(self, per_row: float, per_call: float = 0.0):
        self.now, self.per_row, self.per_call, self.calls = 0.0, per_row, per_call, []

    def __call__(self) -> float:
        return self.now

    def probe(self, b: int) -> None:
        self.calls.append(b)
        self.now += self.per_call + self.per_row * b


def test_a_timed_estimate_is_the_schedules_arithmetic_on_the_measured_call_times():
    clock = FakeClock(per_row=1e-3)
    # no calibration, and the first pass (0.1 s per image) predicts 12 rows x 0.1 s: too short to time
    assert estimate.timed(None, clock.probe, 1, 12, 0.2, 2, timer=clock) is None and clock.calls == []
    # a long prediction (1e6 rows at 0.1 s): one size timed, one untimed call and two timed ones
    cal = estimate.timed(None, clock.probe, 1, 1_000_000, 0.2, 2, timer=clock)
    assert cal.times == {1: pytest.approx(1e-3)} and cal.batch_size == 1 and clock.calls[:3] == [1, 1, 1]
    # 2 images of 3 features at one row per call: 2 x (3 + 2 + 1) = 12 calls of 1 ms, plus the job's own 0.3 ms
    # a call (calibration.JOB_CALL_OVERHEAD_S: a single measured size shows no fixed cost of its own)
    assert estimate.exact_seconds(cal, 99.0, 2, 3) == pytest.approx(12 * (1e-3 + 3e-4))
    # a calibration that measured wins over the first pass; without one, every row at the first pass's time
    assert estimate.timed(cal, clock.probe, 1, 1_000_000, 0.2, 2, timer=clock) is cal
    assert estimate.exact_seconds(None, 0.5, 2, 3) == pytest.approx(12 * 0.25)
    assert estimate.row_seconds(cal, 0.5, 2) == pytest.approx(1e-3) and estimate.row_seconds(None, 0.5, 2) == 0.25
    incr = Calibration(1, {1: 2e-3})
    # incremental: its calls (12 x (2 + 0.3) ms) and a base run of the 2 images per step (3 steps, 2 ms each)
    assert estimate.incremental_seconds(incr, cal, 2, 3) == pytest.approx(12 * 2.3e-3 + 3 * 2e-3)


def test_the_line_and_the_faster_method():
    est = estimate.exact_estimate(2, 1024, 340.0, torch.device("cpu"), 1e-4, gradients=True)
    threads = torch.get_num_threads()
    assert est.long and est.line() == (
        f"exact SIS of 2 images x 1,024 features: 1,049,600 forward rows, about 5.7 min on this CPU ({threads} "
        f"threads); faster: method 'gradient', 11 gradient steps per image, under 0.1 s")
    assert estimate.exact_estimate(1, 16, 0.5, torch.device("cpu"), 1e-4, gradients=False).line() == (
        f"exact SIS of 1 image x 16 features: 136 forward rows, about 0.5 s on this CPU ({threads} threads)")
    # no faster method for a model without gradients, nor where gradient SIS would not save half
    assert estimate.exact_estimate(2, 1024, 340.0, torch.device("cpu"), 1e-4, gradients=False).faster is None
    assert estimate.exact_estimate(1, 4, 1e-3, torch.device("cpu"), 1e-3, gradients=True).faster is None
    assert [estimate.duration(s) for s in (0.04, 4.24, 45.4, 367.0, 9000.0)] == ["0.04 s", "4.2 s", "45 s",
                                                                                 "6.1 min", "2.5 h"]


def test_long_runs_are_logged_every_run_notes_its_estimate(caplog):
    long = estimate.Estimate("a run", 10, "forward rows", estimate.LONG_RUN_S + 1, "here")
    short = estimate.Estimate("a run", 10, "forward rows", estimate.LONG_RUN_S - 1, "here")
    with caplog.at_level(logging.INFO, logger="overinterp_fast"), runinfo.collecting() as info:
        with estimate.announced(short):
            pass
        assert caplog.records == [] and info["estimate"] == short.line()
        with estimate.announced(long):
            pass
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("overinterp_fast.runtime.estimate", "INFO", long.line())]


def test_fast_sis_logs_the_estimate_of_a_long_run(monkeypatch, caplog):
    monkeypatch.setattr(estimate, "LONG_RUN_S", 0.0)  # every run is long
    model, x = make_cnn(0), make_images(1)
    with caplog.at_level(logging.INFO, logger="overinterp_fast.runtime.estimate"):
        res = of.fast_sis(model, x, 0.5)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("exact SIS of 1 image x 25 features: 325 forward rows, ") and res[0].info["estimate"] == line
    res = of.fast_sis(model, x, 0.5, method="gradient", options=of.GradientOptions(k=5))
    assert res[0].info["estimate"].startswith("gradient SIS of 1 image x 25 features, k=5: 5 gradient rows, ")
    res = of.fast_sis(model, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=2))
    assert res[0].info["estimate"].startswith("responsibility maps of 1 image x 25 pixels, 2 iterations: ")


def test_the_command_line_prints_the_estimate_of_a_long_run(monkeypatch, capsys, tmp_path):
    from overinterp_fast.cli import logging_to_stderr

    monkeypatch.setattr(estimate, "LONG_RUN_S", 0.0)
    with logging_to_stderr(logging.ERROR):  # printed whatever the level, once, as the command line's own line
        of.fast_sis(make_cnn(0), make_images(1), 0.5)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("overinterp-fast: exact SIS of 1 image x 25 features: "), lines
    with logging_to_stderr(logging.INFO):
        of.fast_sis(make_cnn(0), make_images(1), 0.5)
    said = [line for line in capsys.readouterr().err.splitlines() if "exact SIS of" in line]
    assert len(said) == 1 and said[0].startswith("overinterp-fast: exact SIS")


def test_the_bars_time_left_is_the_estimate_then_the_measured_rate():
    bar = estimate.EstimatedBar(total=100, seconds=50.0, disable=True)
    assert bar.time_left(0, 100, 0.0) == 50.0  # nothing done: the estimate
    assert bar.time_left(40, 100, 3.0) == pytest.approx(30.0)  # before 10% of 50 s: the estimate, scaled
    assert bar.time_left(40, 100, 8.0) == pytest.approx(12.0)  # then the rate so far: 60 left at 5 per second
    assert bar.time_left(100, 100, 60.0) == 0.0


def test_days_from_48_hours():
    assert [estimate.duration(h * 3600) for h in (47.9, 48, 7966.3)] == ["47.9 h", "2.0 d", "331.9 d"]


def test_a_bar_that_continues_a_saved_run_counts_its_rate_from_there():
    bar = estimate.EstimatedBar(total=100, initial=40, seconds=50.0, file=open(os.devnull, "w"))
    assert bar.time_left(40, 100, 0.0) == 30.0  # nothing done here: the whole run's estimate, for 60 of 100
    assert bar.time_left(70, 100, 8.0) == pytest.approx(8.0)  # 30 done in 8 s: 30 left at 3.75 per second
    bar.close()
    with estimate.said_before(leave=False):  # a caller's bar options reach the runs' bars
        inner = estimate.progress_bar(total=3, disable=True)
    assert inner.leave is False


def test_the_exact_bar_shows_the_estimates_time_left(monkeypatch):
    fixed = estimate.Estimate("a run", 325, "forward rows", 3725.0, "here")
    monkeypatch.setattr(estimate, "exact_estimate", lambda *args, **kwargs: fixed)
    tty = fake_terminal(monkeypatch)
    of.fast_sis(make_cnn(0), make_images(1), 0.5, show_progress=True)
    first = "".join(tty.text).replace("\r", "\n").strip().splitlines()[0]
    assert "0/325 [00:00<1:02:05" in first, first  # 3725 s before anything is done
