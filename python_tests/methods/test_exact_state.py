"""Exact SIS saved between windows and continued (methods/exact_state.py): the rerun's results are the
uninterrupted run's, bit for bit, on every path (dense, incremental, with collections, low precision).

The interruptions are real: a SIGINT sent to this process from inside the run (the checkpoints' clock, called
after every window) under ``interrupts.caught()``, which the run answers by saving its state and raising; or an
exception from the same place before the state is saved (a kill: the work since the last save is lost).
"""
import logging
import os
import signal

import numpy as np
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.errors import Interrupted
from overinterp_fast.methods import exact_state
from overinterp_fast.util import interrupts
from helpers import make_cnn, make_images, tiny_cnn

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, SIDE, BATCH = 3, 6, 20  # 36 features: 666 candidates per image and round, 20 per call


@pytest.fixture(scope="module")
def model():
    return tiny_cnn(3)


@pytest.fixture(scope="module")
def images():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, SIDE, SIDE, generator=g)


PATHS = {  # what ran the steps (SISResult.info.step): the options that choose it
    "fused": dict(options=of.ExactOptions(incremental=False)),
    "incremental": dict(options=of.ExactOptions(incremental=True)),
    "fused, collection": dict(options=of.ExactOptions(incremental=False), collection=True),
    "low-precision": dict(options=of.ExactOptions(score_dtype=torch.bfloat16)),
}


def run(model, images, how, checkpoints=None, threshold=0.5):
    kw = dict(method="exact", engine="torch", batch_size=BATCH, **PATHS[how])
    if checkpoints is None:
        return of.fast_sis(model, images, threshold, **kw)
    with exact_state.saving(checkpoints):
        return of.fast_sis(model, images, threshold, **kw)


def assert_same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert torch.equal(ra.order, rb.order) and torch.equal(ra.values, rb.values)
        assert (ra.sis is None) == (rb.sis is None) and (ra.sis is None or torch.equal(ra.sis, rb.sis))
        assert (ra.target, ra.score, ra.threshold, ra.sis_score) == (rb.target, rb.score, rb.threshold, rb.sis_score)
        assert ra.rescored == rb.rescored  # low precision: the same candidates scored again in full
        assert (ra.collection is None) == (rb.collection is None)
        for ca, cb in zip(ra.collection or [], rb.collection or [], strict=True):
            assert torch.equal(ca.order, cb.order) and torch.equal(ca.values, cb.values)
            assert (ca.sis is None and cb.sis is None) or torch.equal(ca.sis, cb.sis)


class Clock:
    """The checkpoints' clock (called once when the run starts and once after every window): at its call number
    ``at`` it runs ``action``; ``now`` moves by ``step`` per call."""

    def __init__(self, at=None, action=None, step=0.0):
        self.calls, self.at, self.action, self.now, self.step = 0, at, action, 0.0, step

    def __call__(self):
        self.calls += 1
        self.now += self.step
        if self.calls == self.at:
            self.action()
        return self.now


def sigint():
    os.kill(os.getpid(), signal.SIGINT)


def crash():
    raise RuntimeError("killed")


@pytest.mark.parametrize("how", list(PATHS))
def test_interrupted_runs_continue_with_the_uninterrupted_results(model, images, how, tmp_path, monkeypatch):
    from overinterp_fast.methods import low_precision

    # low precision kept on for these few features (as its own tests do), K small: many steps in bfloat16
    monkeypatch.setattr(low_precision, "MAX_SHARE", 1.0)
    monkeypatch.setattr(low_precision, "RESCORE_MIN", 2)
    if how == "low-precision":  # the low precision tests' planted CNN (float64), on which bfloat16 decides steps
        model, images = make_cnn(0), make_images(3, seed=30)
    reference = run(model, images, how)
    if how == "low-precision":
        assert not reference[0].info.low["declined"] and sum(r.rescored for r in reference) > 0
    assert reference[0].info.step == how.split(",")[0]  # the path the options chose
    path = str(tmp_path / "state.pt")
    stops = 0
    for at in (3, 9, 27):  # three interruptions, each continued by the next run
        told = {}
        c = exact_state.Checkpoints(path, every=1e9, on_images=told.update, clock=Clock(at, sigint), window_s=0.0)
        with interrupts.caught():
            with pytest.raises(Interrupted) as err:
                run(model, images, how, c)
        stops += 1
        assert err.value.signal == "SIGINT" and c.saves >= 1 and c.restored == (stops > 1)
        assert os.path.exists(path)
    c = exact_state.Checkpoints(path, every=1e9, window_s=0.0)
    out = run(model, images, how, c)
    assert c.restored
    assert_same(out, reference)
    # nothing was scored twice: the continued runs scored, together, the uninterrupted run's candidates
    once = exact_state.Checkpoints(str(tmp_path / "once.pt"), every=1e9, window_s=0.0)
    run(model, images, how, once)
    assert c.scored == once.scored and not once.restored


def test_the_cpu_row_memo_path_continues_too(model, tmp_path):
    """Inputs of at least MEMO_MIN_ELEMS elements keep exact_candidates' row memo on the CPU (rows that held their
    image's candidate are patched): a continued run starts with no row held, and writes the same batches."""
    from overinterp_fast.methods import exact_step

    x = torch.randn(1, 3, 10, 10, generator=torch.Generator().manual_seed(2))
    assert x[0].numel() >= exact_step.MEMO_MIN_ELEMS
    reference = run(model, x, "fused")
    path = str(tmp_path / "state.pt")
    for at in (4, 40):
        c = exact_state.Checkpoints(path, every=1e9, clock=Clock(at, sigint), window_s=0.0)
        with interrupts.caught(), pytest.raises(Interrupted):
            run(model, x, "fused", c)
    c = exact_state.Checkpoints(path, every=1e9, window_s=0.0)
    assert_same(run(model, x, "fused", c), reference)
    assert c.restored


def test_a_kill_loses_the_work_since_the_last_save_and_nothing_else(model, images, tmp_path):
    reference = run(model, images, "fused, collection")
    path = str(tmp_path / "state.pt")
    c = exact_state.Checkpoints(path, every=3.0, clock=Clock(20, crash, step=1.0), window_s=0.0)
    with pytest.raises(RuntimeError, match="killed"):
        run(model, images, "fused, collection", c)
    saves = c.saves
    assert saves == 6  # saved when due: at calls 4, 7, ..., 19 of the clock (3 s apart); call 20 died before one
    saved = torch.load(path, weights_only=True)["bar"][0]
    again = exact_state.Checkpoints(path, every=1e9, window_s=0.0)
    out = run(model, images, "fused, collection", again)
    assert again.restored and 0 < saved < N * 666
    assert_same(out, reference)


def test_finished_images_are_told_once_before_the_state_that_holds_them(model, images, tmp_path):
    path = str(tmp_path / "state.pt")
    reference = run(model, images, "fused, collection", threshold=0.3)
    told, saves_when_told = [], []

    def tell(new):
        told.append(new)
        saves_when_told.append(c.saves)

    c = exact_state.Checkpoints(path, every=1e9, on_images=tell, window_s=0.0)
    out = run(model, images, "fused, collection", c, threshold=0.3)
    assert_same(out, reference)
    images_told = [i for d in told for i in d]
    assert sorted(images_told) == list(range(N))  # each image once
    for d in told:
        for i, r in d.items():
            assert r is out[i]  # the final result, its collection included
    # every call is followed by a save holding those images (no other save: `every` is never due)
    assert saves_when_told == list(range(len(told))) and c.saves == len(told)
    # a rerun from the final state tells nothing again and computes nothing
    told.clear()
    again = exact_state.Checkpoints(path, every=1e9, on_images=tell, window_s=0.0)
    assert_same(run(model, images, "fused, collection", again, threshold=0.3), reference)
    assert again.restored and told == [] and again.saves == 0


def test_a_state_saved_for_another_job_is_not_used(model, images, tmp_path, caplog):
    path = str(tmp_path / "state.pt")
    c = exact_state.Checkpoints(path, every=1e9, clock=Clock(5, sigint), window_s=0.0)
    with interrupts.caught(), pytest.raises(Interrupted):
        run(model, images, "fused", c, threshold=0.5)
    other = exact_state.Checkpoints(path, every=1e9, window_s=0.0)
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.methods.exact_state"):
        out = run(model, images, "fused", other, threshold=0.6)
    assert not other.restored and "saved for another exact SIS job; starting over" in caplog.text
    assert_same(out, run(model, images, "fused", threshold=0.6))
    open(path, "wb").write(b"not a state")
    broken = exact_state.Checkpoints(path, every=1e9, window_s=0.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.methods.exact_state"):
        out = run(model, images, "fused", broken, threshold=0.6)
    assert not broken.restored and "not a saved exact SIS state" in caplog.text


def test_windows_start_with_one_batch_then_last_about_window_s():
    c = exact_state.Checkpoints("unused", window_s=2.0)
    keep = exact_state.Keeper.__new__(exact_state.Keeper)
    keep.c = c
    assert keep.window_batches(4096) == 1  # nothing measured yet
    c._batch_s = 0.25
    assert keep.window_batches(4096) == 8  # 2 s of 0.25 s batches
    assert keep.window_batches(5) == 5  # never more than the schedule's own window
    c._batch_s = 10.0
    assert keep.window_batches(4096) == 1


def test_the_interval_is_checked():
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match="every must be a number of seconds >= 0"):
            exact_state.Checkpoints("x", every=bad)


def test_a_second_signal_is_raised_at_once_and_a_noted_one_when_the_block_ends():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts.caught():
        with pytest.raises(Interrupted):
            with interrupts.deferred():
                sigint()  # noted
                assert interrupts._State.pending is not None
                with pytest.raises(Interrupted) as second:
                    os.kill(os.getpid(), signal.SIGTERM)  # raised at once
                assert second.value.signal == "SIGTERM"
                sigint()  # noted again; the block ends and raises it
        with pytest.raises(Interrupted) as direct:
            os.kill(os.getpid(), signal.SIGTERM)  # outside deferred(): at once
        assert direct.value.signal == "SIGTERM" and direct.value.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_the_saved_state_holds_the_loop_s_tables_and_queue(model, images, tmp_path):
    path = str(tmp_path / "state.pt")
    c = exact_state.Checkpoints(path, every=0.0, clock=Clock(4, sigint), window_s=0.0)
    with interrupts.caught(), pytest.raises(Interrupted):
        run(model, images, "fused", c)
    saved = torch.load(path, weights_only=True)
    p = SIDE * SIDE
    assert saved["tables"]["present"].shape == (N, p) and saved["tables"]["remaining"].shape == (N, p + 1)
    assert saved["key"]["images"] == N and saved["key"]["features"] == p and saved["key"]["batch_size"] == BATCH
    # 3 windows of one batch each (20 candidates) were scored before the signal was taken: 60 candidates, all of
    # image 0's first step (36) and 24 of image 1's
    assert saved["bar"] == [60, N * p * (p + 1) // 2]
    present = saved["tables"]["present"].sum(1).tolist()
    assert present == [p - 1, p, p]  # image 0 lost one feature; the others are mid-step or waiting
    queue = saved["queue"].numpy()
    assert queue[0].tolist() == [1, 2, 0] and queue[1].tolist() == [24, 0, 0]  # image 1 goes on at slot 24
    assert np.array_equal(saved["host"]["step"].numpy(), [1, 0, 0])
