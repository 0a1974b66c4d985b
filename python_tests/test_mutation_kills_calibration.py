"""The batch-size measurement traced call by call (calibration.py; see TESTING.md).

test_calibration.py checks what the measurement chooses; these tests pin how it gets there, worked by
hand from the docstrings: which sizes are probed in which order, where the budget stops the ladder,
which sizes are timed again, what an out-of-memory error does, and the schedule's arithmetic. The fake
clock starts at 1000 s and the probe costs whole seconds (16 rows: 3 s, 32: 4 s, 64: 6 s, 128: 10 s),
so every comparison with the budget is exact.
"""
import pytest
import torch

from overinterp_fast import calibration
from overinterp_fast.calibration import (LADDER, JOB_CALL_OVERHEAD_S, calibrate, choose, exact_calls,
                                         exact_job_time, ladder, measure)

from test_calibration import FakeClock, fresh_cache  # noqa: F401  (autouse: a clean calibration cache)

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


def test_the_whole_ladder_then_the_two_best_per_row_again():
    """Each size: one untimed call, then 2 timed (the default repeats). Elapsed after 16: 9 s; the prediction
    for 32 is 9 + 3 calls x 3 s x 32/16 = 27; ... after 128: 69 s. Per row 128 (10/128) and 64 (6/64) are the
    two best, timed once more."""
    times, calls = run(1000.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3 + [128, 64]
    assert times == COST


def test_a_prediction_equal_to_the_budget_still_runs():
    """Budget 75: 128 is predicted from its nearest measured size, 64: 39 + 3 x 6 x 2 = 75, not over 75, so it
    runs (69 s); 128 is timed again (79 s); then 79 > 75 stops the re-timing before 64."""
    times, calls = run(75.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 4
    assert times == COST


def test_a_prediction_over_the_budget_ends_the_ladder():
    """Budget 70: 128 predicted at 75 > 70 is not run; 64 and 32 (the two best per row measured) again."""
    times, calls = run(70.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [64, 32]
    assert times == {16: 3.0, 32: 4.0, 64: 6.0}


def test_re_timing_stops_only_past_the_budget():
    """Budget 79: 128 runs (75 <= 79), is timed again at 69 s (to 79 s); 79 is not past 79, so 64 too."""
    times, calls = run(79.0)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3 + [128, 64]
    assert times == COST


def test_the_budget_shrinks_to_a_fraction_of_the_predicted_job():
    """budget_fraction 0.25 of a 3,200-row job at the best cost per row so far: 150 s after 16 (3/16 per row),
    100 after 32, 75 after 64, so 128 (predicted 75) runs; then 62.5 (10/128 per row), and at 69 s nothing is
    timed again."""
    times, calls = run(1000.0, expected_rows=3200, budget_fraction=0.25)
    assert calls == [16] * 3 + [32] * 3 + [64] * 3 + [128] * 3
    assert times == COST


def test_start_runs_up_from_the_first_size_at_or_above_it_then_down():
    """start=64: 64, 128, then 32 (predicted from 64, its nearest: 48 + 3 x 6 x 32/64 = 57) and 16."""
    times, calls = run(1000.0, start=64)
    assert calls == [64] * 3 + [128] * 3 + [32] * 3 + [16] * 3 + [128, 64]
    assert times == COST
    # start above every size: the largest first, then down
    times, calls = run(1000.0, start=500)
    assert calls == [128] * 3 + [64] * 3 + [32] * 3 + [16] * 3 + [128, 64]
    assert times == COST


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


def test_ladder_caps():
    assert ladder(100, upper=5000) == [16, 32, 64, 100]  # the job's rows cap it, whatever the upper bound
    assert ladder(10_000) == list(LADDER) and LADDER[-1] == 4096  # never past the ladder's top


def test_exact_calls_and_job_time_by_hand():
    # 3 images, 2 features: steps of 3 x 2 = 6 and 3 x 1 = 3 rows; at 4 per call: 2 + 1 calls
    assert exact_calls(4, 3, 2) == 3
    # one measured size (16 rows, 1 s): no intercept to fit, so JOB_CALL_OVERHEAD_S per call; 1 image, 2 features:
    # calls of 2 and 1 rows, 2/16 + 1/16 s by the line through 0
    assert exact_job_time({16: 1.0}, 16, 1, 2) == pytest.approx(3 / 16 + 2 * JOB_CALL_OVERHEAD_S, rel=1e-12)


def test_choose_needs_both_images_and_features_for_the_schedule():
    times = {16: 1.0, 32: 1.5, 64: 2.6}
    assert choose(times, images=3) == choose(times) == choose(times, features=5)
    with pytest.raises(ValueError, match="no measured batch sizes to choose from"):
        choose({})


def test_a_calibration_read_from_disk_spent_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(calibration.CACHE_DIR_ENV, str(tmp_path))
    clock = clock_at_1000({16: 0.002, 20: 0.003}.get)
    kw = dict(max_rows=20, expected_rows=10**6, fallback=7, timer=clock.timer, disk=calibration.disk_key("m", 2))
    first = calibrate(("k",), clock.probe, **kw)
    assert first.source == "measured" and first.spent_s > 0
    calibration.clear_cache()
    again = calibrate(("k",), clock.probe, **kw)
    assert again.source == "cached" and again.spent_s == 0.0
