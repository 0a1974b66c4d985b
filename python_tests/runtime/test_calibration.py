"""Batch size by measurement (runtime/calibration.py): the choice from given timings, the measurement loop with a
fake clock, the cache, the small-job fallback, and that a user's batch_size wins. No test asserts a real timing.

The batch-size measurement traced call by call: where the tests above check what the measurement chooses, the tests
after them pin how it gets there, worked by hand from the docstrings: which sizes are probed in which order, where
the budget stops the ladder, which sizes are timed again, what an out-of-memory error does, and the schedule's
arithmetic. The fake clock starts at 1000 s and the probe costs whole seconds (16 rows: 3 s, 32: 4 s, 64: 6 s,
128: 10 s), so every comparison with the budget is exact.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import pytest
import torch
import overinterp_fast as of
from overinterp_fast.runtime import calibration, model_state
from overinterp_fast.runtime.calibration import (Calibration, calibrate, call_time, choose, exact_calls, exact_schedule_time,
                                         ladder, measure, per_call_overhead)
from helpers import make_cnn, make_images
from overinterp_fast.runtime.calibration import (LADDER, JOB_CALL_OVERHEAD_S, calibrate, choose, exact_calls,
                                         exact_job_time, ladder, measure)


@pytest.fixture(autouse=True)
def fresh_cache():
    calibration.clear_cache()
    yield
    calibration.clear_cache()


class FakeClock:
    """A timer that only moves when a probe 'runs': probe(b) costs cost(b) seconds."""

    def __init__(self, cost, slow_once=None):
        self.now = 0.0
        self.cost = cost
        self.calls = []
        self.slow_once = dict(slow_once or {})  # size -> extra seconds on its first timed call

    def timer(self):
        return self.now

    def probe(self, b):
        self.calls.append(b)
        extra = self.slow_once.pop(b) if b in self.slow_once and self.calls.count(b) == 2 else 0.0
        self.now += self.cost(b) + extra


def test_per_call_overhead():
    assert per_call_overhead({16: 2.0, 32: 3.0, 64: 5.0}) == pytest.approx(1.0)  # t = 1 + b / 16
    assert per_call_overhead({16: 1.0, 32: 3.0}) == 0.0  # intercept -1, clipped
    assert per_call_overhead({16: 1.0}) == 0.0


def test_choose_least_time_per_row():
    # no fixed cost (the fit's intercept is negative): per row 0.1, 0.1, 0.2; the tie goes to the larger
    assert choose({16: 1.6, 32: 3.2, 64: 12.8}) == 32
    # t = 1 + b / 16 (fixed cost 1 per call, counted twice): per row (t + 1) / b = 0.19, 0.125, 0.094
    assert choose({16: 2.0, 32: 3.0, 64: 5.0}) == 64
    # per row 0.0625 at 16 and 0.078 at 32 (more than 10% worse); sizes under 16 never chosen over 16
    assert choose({1: 0.001, 16: 1.0, 32: 2.5}) == 16
    assert choose({1: 0.001, 16: 1.0, 32: 2.5}, images=1, features=40) == 16
    # ...unless nothing larger was measured
    assert choose({1: 0.5}) == 1
    # within 10% of the best the larger size wins: 0.100 vs 0.105 per row
    assert choose({16: 1.6, 32: 3.36}) == 32


def test_call_time_interpolates_through_zero():
    # one size: no fixed cost known, the line through 0
    t = call_time({16: 1.6})
    assert t([0, 8, 16, 32]).tolist() == pytest.approx([0.0, 0.8, 1.6, 3.2])
    # two sizes whose line has a negative intercept: through 0 below the smallest
    t = call_time({16: 1.6, 32: 3.6})
    assert t([0, 8, 16, 24, 32, 64]).tolist() == pytest.approx([0.0, 0.8, 1.6, 2.6, 3.6, 7.2])


def test_call_time_below_the_smallest_size_starts_from_the_fixed_cost():
    # t = 1.2 + 0.025 b: the fixed cost 1.2 s at r -> 0, then the line to (16, 1.6); 0 rows cost nothing
    t = call_time({16: 1.6, 32: 2.0})
    assert t([0, 1, 8, 16, 24, 32, 64]).tolist() == pytest.approx([0.0, 1.225, 1.4, 1.6, 1.8, 2.0, 4.0])


def test_exact_schedule_time_by_hand():
    # one image, p = 3: steps of 3, 2, 1 candidates.
    times = {1: 1.0, 2: 1.5}
    # B = 2: batches [2, 1], [2], [1] -> 1.5 + 1.0 + 1.5 + 1.0
    assert exact_schedule_time(times, 2, images=1, features=3) == pytest.approx(5.0)
    # B = 1: six calls of one row
    assert exact_schedule_time(times, 1, images=1, features=3) == pytest.approx(6.0)
    assert exact_calls(2, 1, 3) == 4 and exact_calls(1, 1, 3) == 6 and exact_calls(3, 1, 3) == 3
    assert choose(times, images=1, features=3) == 2
    # two images, p = 2: levels of 4 and 2 rows; B = 2: 2 + 1 full batches
    assert exact_schedule_time(times, 2, images=2, features=2) == pytest.approx(4.5)


def test_exact_schedule_time_counts_the_padded_rows():
    # one image, p = 40, B = 32 (granule 4: shapes 4, 8, ..., 32): steps of 40..33 rows are a full call and a tail
    # of 8..1 rows, padded to 8, 8, 8, 8, 4, 4, 4, 4; steps of 32..1 rows are one call each, padded to the next
    # multiple of 4 (1, 2, 3 to 4: the step loop keeps to its shapes).
    per_row = {32: 32.0}  # one second per row, through zero
    tails = [8, 8, 8, 8, 4, 4, 4, 4]
    calls = [-(-r // 4) * 4 for r in range(1, 33)]
    assert exact_schedule_time(per_row, 32, images=1, features=40) == pytest.approx(8 * 32 + sum(tails) + sum(calls))


def test_exact_choice_accounts_for_tails():
    # Per row 64 and 384 cost the same (1 ms), so without a job the larger wins (the throughput's knee). But a job
    # of one image with 65 features never fills 384 rows: every step is one call, padded to 384's granule of 48
    # rows (48 or 96 rows for 1..65 candidates), where 64 runs full calls and tails padded to multiples of 8.
    times = {1: 0.05, 64: 0.064, 384: 0.384}
    assert choose(times) == 384
    t64 = exact_schedule_time(times, 64, 1, 65)
    t384 = exact_schedule_time(times, 384, 1, 65)
    assert t64 < t384
    assert choose(times, images=1, features=65) == 64


def test_ladder():
    assert ladder(100) == [16, 32, 64, 100]
    assert ladder(64) == [16, 32, 64]
    assert ladder(10_000, upper=300) == [16, 32, 64, 128, 256, 300]
    assert ladder(10) == [10] and ladder(1) == [1]


def test_measure_picks_cheapest_with_fake_clock_and_ignores_one_slow_call():
    # 64 rows is cheapest per row, but its first timed call is slowed by 1 s (a noisy neighbour).
    cost = {1: 0.01, 16: 0.08, 32: 0.15, 64: 0.2, 128: 0.7}
    clock = FakeClock(cost.get, slow_once={64: 1.0})
    times = measure(clock.probe, [1, 16, 32, 64, 128], expected_rows=10**9, repeats=2, budget_s=100.0,
                    timer=clock.timer)
    assert choose(times) == 64
    assert times[64] == pytest.approx(0.2)
    # each size: one untimed call and two timed ones; then the two best once more
    assert clock.calls[:3] == [1, 1, 1] and clock.calls.count(64) == 4 and clock.calls.count(128) == 3


def test_measure_stops_at_the_budget():
    clock = FakeClock(lambda b: 0.1 * b)
    times = measure(clock.probe, [1, 16, 32, 64], expected_rows=10**9, budget_s=1.0, timer=clock.timer)
    assert sorted(times) == [1]  # 1 row: 0.3 s spent; 16 rows would take about 4.8 s more
    assert set(clock.calls) == {1}
    # a small job lowers the budget below budget_s: 5% of 200 rows * 0.1 s = 1 s
    clock = FakeClock(lambda b: 0.1)
    times = measure(clock.probe, [1, 16, 32, 64], expected_rows=200, budget_s=10.0, timer=clock.timer)
    assert sorted(times) == [1]


def test_calibrate_caches_and_falls_back_for_small_jobs():
    clock = FakeClock({16: 0.002, 20: 0.003}.get)
    kw = dict(max_rows=20, expected_rows=10**6, fallback=7, timer=clock.timer)
    cal = calibrate(("k",), clock.probe, **kw)
    assert cal.source == "measured" and cal.batch_size == 16 and set(cal.times) == {16, 20}
    n_calls = len(clock.calls)
    again = calibrate(("k",), clock.probe, **kw)
    assert again.source == "cached" and again.batch_size == 16 and len(clock.calls) == n_calls
    small = calibrate(("other",), clock.probe, max_rows=20, expected_rows=100, fallback=7, timer=clock.timer)
    assert small.source == "fallback" and small.batch_size == 7 and len(clock.calls) == n_calls
    assert calibrate(None, clock.probe, max_rows=5, expected_rows=100, fallback=7).batch_size == 5


def test_calibrate_falls_back_when_the_budget_reaches_no_usable_size(monkeypatch):
    monkeypatch.setattr(calibration, "LADDER", (4, 16))
    clock = FakeClock(lambda b: 1.0 * b)  # 4 rows: 12 s spent; 16 rows would take 48 s more
    cal = calibrate(None, clock.probe, max_rows=4096, expected_rows=10**9, fallback=2, timer=clock.timer)
    assert cal.source == "fallback" and cal.batch_size == 2 and set(cal.times) == {4}  # not a row-by-row job


def test_measure_starts_at_the_fallback_size():
    clock = FakeClock(lambda b: 0.01 * b)  # 3 calls of 64 rows: 1.92 s; the budget (1 s) then stops
    times = measure(clock.probe, [16, 32, 64, 128], expected_rows=10**9, start=50, budget_s=1.0, timer=clock.timer)
    # ...but a second point is always taken: the largest size at most half the first (32), for the intercept
    assert clock.calls[0] == 64 and sorted(times) == [32, 64]
    assert clock.calls == [64, 64, 64, 32, 32, 32]
    clock = FakeClock(lambda b: 0.001 * b)
    times = measure(clock.probe, [16, 32, 64, 128], expected_rows=10**9, start=50, budget_s=10.0, timer=clock.timer)
    order = list(dict.fromkeys(clock.calls))
    assert order == [64, 128, 32, 16] and sorted(times) == [16, 32, 64, 128]


def test_calibrate_respects_upper_bound():
    clock = FakeClock(lambda b: 0.001 * (b ** 0.5))  # larger is always cheaper per row
    cal = calibrate(None, clock.probe, max_rows=4096, expected_rows=10**9, fallback=7, upper=100, timer=clock.timer)
    assert max(clock.calls) == 100 and cal.batch_size == 100


class Recorder(torch.nn.Module):
    """Records the batch sizes the model is called with (dense path: incremental=False, no fx tracing)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.sizes = []

    def forward(self, x):
        self.sizes.append(x.shape[0])
        return self.inner(x)


@pytest.fixture
def job(monkeypatch):
    """4 images of 5x5 pixels (4 * 25 * 26 / 2 = 1300 candidates), calibrated: MIN_ROWS lowered for the test."""
    monkeypatch.setattr(calibration, "MIN_ROWS", 1000)
    model = Recorder(make_cnn(0, torch.float64)).eval()
    return model, make_images(4, seed=3)


def test_fast_sis_uses_the_calibrated_batch_size(monkeypatch, job):
    model, images = job
    fake = {16: 1.1, 32: 1.2, 64: 1.3, 100: 1.4}  # cheapest per row: 100 = N p (one level per call)
    calls = []
    monkeypatch.setattr(calibration, "measure", lambda probe, sizes, **kw: calls.append(list(sizes)) or
                        {b: fake[b] for b in sizes})
    want = of.reference.sis(model.inner, images, 0.3)
    res = of.fast_sis(model, images, 0.3, engine="torch", options=of.ExactOptions(incremental=False))
    assert calls == [[16, 32, 64, 100]]
    assert max(model.sizes) == 100
    assert [r.size and r.sis.tolist() for r in res] == [r.size and r.sis.tolist() for r in want]
    model.sizes.clear()
    of.fast_sis(model, images, 0.3, engine="torch",
                options=of.ExactOptions(incremental=False))  # cached: no second measurement
    assert len(calls) == 1 and max(model.sizes) == 100
    calibration.clear_cache()
    fake.update({32: 0.2, 64: 5.0, 100: 8.0})  # calls of 32 rows now far cheaper than larger ones
    model.sizes.clear()
    of.fast_sis(model, images, 0.3, engine="torch", options=of.ExactOptions(incremental=False))
    assert max(model.sizes[1:]) == 32


def test_user_batch_size_wins(monkeypatch, job):
    model, images = job
    monkeypatch.setattr(calibration, "measure", lambda *a, **k: pytest.fail("calibrated despite batch_size"))
    of.fast_sis(model, images, 0.3, batch_size=24, engine="torch", options=of.ExactOptions(incremental=False))
    assert max(model.sizes[1:]) == 24  # the first call: the unmasked images


def test_calibration_measures_real_candidates(job):
    model, images = job
    res = of.fast_sis(model, images, 0.3, engine="torch", options=of.ExactOptions(incremental=False))
    cals = list(model_state.state_of(model).table("calibration").values())  # kept with the model
    assert len(cals) == 1 and cals[0].source == "measured" and cals[0].batch_size in cals[0].times
    assert all(t > 0 for t in cals[0].times.values()) and cals[0].batch_size >= calibration.MIN_CHOICE
    assert max(model.sizes[1:]) <= 100 and len(res) == 4


def test_disk_cache_is_opt_in_and_survives_the_process_cache(monkeypatch, tmp_path):
    clock = FakeClock({16: 0.002, 20: 0.003}.get)
    kw = dict(max_rows=20, expected_rows=10**6, fallback=7, timer=clock.timer, disk=calibration.disk_key("m", 1))
    monkeypatch.delenv(calibration.CACHE_DIR_ENV, raising=False)
    calibrate(("k",), clock.probe, **kw)
    assert not list(tmp_path.iterdir())  # no directory set: nothing written
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path))
    calibration.clear_cache()
    first = calibrate(("k",), clock.probe, **kw)
    assert first.source == "measured" and (tmp_path / "calibration.json").is_file()
    calibration.clear_cache()  # a new process: only the disk remains
    n_calls = len(clock.calls)
    again = calibrate(("k",), clock.probe, **kw)
    assert again.source == "cached" and again.batch_size == first.batch_size and len(clock.calls) == n_calls
    assert again.times == first.times
    (tmp_path / "calibration.json").write_text("{not json")  # a broken file is ignored, then replaced
    calibration.clear_cache()
    assert calibrate(("k",), clock.probe, **kw).source == "measured"
    calibration.clear_cache()
    assert calibrate(("k",), clock.probe, **kw).source == "cached"


def test_disk_cache_keeps_every_writers_entries(monkeypatch, tmp_path):
    """Writers storing at once (threads, each with its own lock file descriptor, as processes would) keep each
    other's entries: the cache is read, merged and written under its lock."""
    import json
    import threading

    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path))

    def store(t):
        for i in range(20):
            calibration._disk_store(f"{t}-{i}", Calibration(16 + i, {16: 0.5, 32: 0.25}, "measured", 0.1))

    threads = [threading.Thread(target=store, args=(t,)) for t in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    data = json.load(open(tmp_path / "calibration.json"))
    assert sorted(data) == sorted(f"{t}-{i}" for t in range(5) for i in range(20))
    assert data["3-7"] == {"batch_size": 23, "times": {"16": 0.5, "32": 0.25}}


def test_disk_cache_skips_a_write_it_cannot_lock(monkeypatch, tmp_path):
    from filelock import FileLock

    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(calibration, "DISK_LOCK_S", 0.2)
    other = FileLock(str(tmp_path / "calibration.json.lock"), timeout=0)
    other.acquire()  # another process writes the cache, and for too long
    try:
        calibration._disk_store("k", Calibration(8, {8: 1.0}, "measured", 0.1))  # waits 0.2 s, then skips
    finally:
        other.release()
    assert not (tmp_path / "calibration.json").exists()
    calibration._disk_store("k", Calibration(8, {8: 1.0}, "measured", 0.1))
    assert calibration._disk_load("k").batch_size == 8


def test_disk_key_ignores_weights_but_not_structure(monkeypatch, tmp_path):
    from overinterp_fast.runtime.engines import _structure
    a, b = make_cnn(0, torch.float64), make_cnn(1, torch.float64)
    c = make_cnn(0, torch.float64, width=4)
    assert _structure(a) == _structure(b) != _structure(c)
    assert _structure(lambda x: x) is None


# ----------------------------------------------------------------------------------------------------
# The batch-size measurement traced call by call (calibration.py; see docs/notes/mutation-testing.md).
# ----------------------------------------------------------------------------------------------------

COST = {16: 3.0, 32: 4.0, 64: 6.0, 128: 10.0}  # also the times measure returns when every size is measured
SIZES = [16, 32, 64, 128]


def clock_at_1000(cost=COST.get):
    clock = FakeClock(cost)
    clock.now = 1000.0
    return clock


def run(budget_s, expected_rows=10**9, **kw):
    clock = clock_at_1000(kw.pop("cost", COST.get))
    times = measure(clock.probe, kw.pop("sizes", SIZES), expected_rows=expected_rows, budget_s=budget_s,
                    timer=clock.timer, **kw)
    return times, clock.calls


@pytest.mark.mutation
def test_the_whole_ladder_then_the_two_best_per_row_again():
    """Each size: one untimed call, then 2 timed (the default repeats). Elapsed after 16: 9 s; the prediction
    for 32 is 9 + 3 calls x 3 s x 32/16 = 27; ... after 128: 69 s. Per row 128 (10/128) and 64 (6/64) are the
    two best, timed once more."""
    times, calls = run(1000.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3 + [128, 64]
    assert times == COST


@pytest.mark.mutation
def test_a_prediction_equal_to_the_budget_still_runs():
    """Budget 75: 128 is predicted from its nearest measured size, 64: 39 + 3 x 6 x 2 = 75, not over 75, so it
    runs (69 s); 128 is timed again (79 s); then 79 > 75 stops the re-timing before 64."""
    times, calls = run(75.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 4
    assert times == COST


@pytest.mark.mutation
def test_a_prediction_over_the_budget_ends_the_ladder():
    """Budget 70: 128 predicted at 75 > 70 is not run; 64 and 32 (the two best per row measured) again."""
    times, calls = run(70.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [64, 32]
    assert times == {16: 3.0, 32: 4.0, 64: 6.0}


@pytest.mark.mutation
def test_re_timing_stops_only_past_the_budget():
    """Budget 79: 128 runs (75 <= 79), is timed again at 69 s (to 79 s); 79 is not past 79, so 64 too."""
    times, calls = run(79.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3 + [128, 64]
    assert times == COST


@pytest.mark.mutation
def test_the_budget_shrinks_to_a_fraction_of_the_predicted_job():
    """budget_fraction 0.25 of a 3,200-row job at the best cost per row so far: 150 s after 16 (3/16 per row),
    100 after 32, 75 after 64, so 128 (predicted 75) runs; then 62.5 (10/128 per row), and at 69 s nothing is
    timed again."""
    times, calls = run(1000.0, expected_rows=3200, budget_fraction=0.25)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3
    assert times == COST


@pytest.mark.mutation
def test_start_runs_up_from_the_first_size_at_or_above_it_then_down():
    """start=64: 64, 128, then 32 (predicted from 64, its nearest: 48 + 3 x 6 x 32/64 = 57) and 16."""
    times, calls = run(1000.0, start=64)
    assert calls == [64] * 3 + [128] * 3 + [32] * 3 + [16] * 3 + [128, 64]
    assert times == COST
    # start above every size: the largest first, then down
    times, calls = run(1000.0, start=500)
    assert calls == [128] * 3 + [64] * 3 + [32] * 3 + [16] * 3 + [128, 64]
    assert times == COST


@pytest.mark.mutation
def test_out_of_memory_ends_the_ladder_and_keeps_what_was_measured():
    def cost(b):
        if b == 128:
            raise torch.OutOfMemoryError("128 rows do not fit")
        return COST[b]

    times, calls = run(1000.0, cost=cost)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] + [64, 32]
    assert times == {16: 3.0, 32: 4.0, 64: 6.0}

    def first_fails(b):
        raise torch.OutOfMemoryError("nothing fits")

    with pytest.raises(torch.OutOfMemoryError):
        run(1000.0, cost=first_fails)


@pytest.mark.mutation
def test_ladder_caps():
    assert ladder(100, upper=5000) == [16, 32, 64, 100]  # the job's rows cap it, whatever the upper bound
    assert ladder(10_000) == [b for b in LADDER if b < 4096] + [4096]  # a CPU (no upper bound): at most 4096
    assert ladder(10**6, upper=10**6) == list(LADDER) and LADDER[-1] == 32768  # a GPU: never past the top
    assert ladder(10**6, upper=20_000) == [b for b in LADDER if b < 20_000] + [20_000]


@pytest.mark.mutation
def test_exact_calls_and_job_time_by_hand():
    # 3 images, 2 features: steps of 3 x 2 = 6 and 3 x 1 = 3 rows; at 4 per call: 2 + 1 calls
    assert exact_calls(4, 3, 2) == 3
    # one measured size (16 rows, 1 s): no intercept to fit, so JOB_CALL_OVERHEAD_S per call; 1 image, 2 features:
    # calls of 2 and 1 rows, both run as 2 (the smallest of 16's shapes 2, 4, ..., 16): 2/16 + 2/16 s by the line
    # through 0
    assert exact_job_time({16: 1.0}, 16, 1, 2) == pytest.approx(4 / 16 + 2 * JOB_CALL_OVERHEAD_S, rel=1e-12)


@pytest.mark.mutation
def test_choose_needs_both_images_and_features_for_the_schedule():
    times = {16: 1.0, 32: 1.5, 64: 2.6}
    assert choose(times, images=3) == choose(times) == choose(times, features=5)
    with pytest.raises(ValueError, match="no measured batch sizes to choose from"):
        choose({})


@pytest.mark.mutation
def test_a_calibration_read_from_disk_spent_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path))
    clock = clock_at_1000({16: 0.002, 20: 0.003}.get)
    kw = dict(max_rows=20, expected_rows=10**6, fallback=7, timer=clock.timer, disk=calibration.disk_key("m", 2))
    first = calibrate(("k",), clock.probe, **kw)
    assert first.source == "measured" and first.spent_s > 0
    calibration.clear_cache()
    again = calibrate(("k",), clock.probe, **kw)
    assert again.source == "cached" and again.spent_s == 0.0
