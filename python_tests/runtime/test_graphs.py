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
    plain = lambda x: x  # noqa: E731  (a plain callable: kept too, weakly)
    assert graphs.for_model(plain) is graphs.for_model(plain)


def test_graphs_do_not_keep_their_model_alive():
    import gc
    import weakref

    model = Calls().eval()
    kept = graphs.for_model(model)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and kept.model is None


def test_a_model_that_cannot_be_weakly_referenced_gets_graphs_for_one_job():
    class Slotted:
        __slots__ = ()

        def __call__(self, x):
            return x

    model = Slotted()
    first = graphs.for_model(model)
    assert first.model is model and graphs.for_model(model) is not first


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


class _Counter:
    """A step of fixed tensors: ``state`` [2] float64, state[0] += 1 and state[1] = 2 * state[1] + state[0]."""

    def __init__(self):
        self.state = torch.tensor([0.0, 1.0], dtype=torch.float64)

    def step(self):
        self.state[0].add_(1)
        self.state[1].mul_(2).add_(self.state[0])


def _eager_states(calls):
    c = _Counter()
    for _ in range(calls):
        c.step()
    return c.state.tolist()


class _Played:
    """A stand-in for a captured graph: ``replay()`` runs ``play``."""

    def __init__(self, play):
        self.play = play

    def replay(self):
        self.play()


class _OnTheCpu(graphs.GraphedStep):
    """GraphedStep with graphs wanted on the CPU and a capture that returns ``made(step)`` (or raises it)."""

    def __init__(self, step, state, made, **kw):
        super().__init__(step, state, "cpu", **kw)
        self.wanted = kw.get("calls") is None or kw["calls"] >= self.warmup + 1 + graphs.STEP_MIN_REPLAYS
        if self.family is not None:
            self.wanted = self.wanted and self.family.on
        self.made = made

    def _capture(self):
        if isinstance(self.made, Exception):
            raise self.made
        return self.made(self.step)


def test_steps_off_the_gpu_run_eagerly():
    c = _Counter()
    g = graphs.GraphedStep(c.step, [c.state], "cpu")
    for _ in range(6):
        g()
    assert c.state.tolist() == _eager_states(6)
    assert (g.eager, g.replays, g.graphed, g.failed, g.wanted) == (6, 0, False, None, False)
    family = graphs.StepGraphs("cpu")
    assert not family.on and family.mode == "eager"


def test_a_step_is_captured_only_when_graphs_are_on_and_it_has_calls_left(monkeypatch):
    step = lambda: None  # noqa: E731  (never called: nothing here runs a step)
    need = graphs.STEP_WARMUP_CALLS + 1 + graphs.STEP_MIN_REPLAYS
    assert graphs.GraphedStep(step, [], "cuda", calls=need).wanted
    assert graphs.GraphedStep(step, [], "cuda").wanted  # calls unknown
    assert not graphs.GraphedStep(step, [], "cuda", calls=need - 1).wanted
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    assert not graphs.GraphedStep(step, [], "cuda", calls=need).wanted
    assert not graphs.StepGraphs("cuda").on


def test_replays_follow_the_warm_up_and_a_checked_capture():
    from overinterp_fast.runtime import sync

    c = _Counter()
    g = _OnTheCpu(c.step, [c.state], lambda step: _Played(step))
    with sync.counting() as reads:
        for _ in range(7):
            g()
    assert c.state.tolist() == _eager_states(7)
    # 2 warm-ups, the check's eager step (the replay before it is undone), then 4 replays
    assert (g.eager, g.replays, g.graphed, g.failed) == (3, 4, True, None)
    assert reads.by_label == {"graph check": 1}


def test_a_capture_that_fails_falls_back_with_one_line(caplog):
    c = _Counter()
    g = _OnTheCpu(c.step, [c.state], RuntimeError("operation not permitted when stream is capturing\nmore"))
    with caplog.at_level(logging.WARNING, logger="overinterp_fast"):
        for _ in range(6):
            g()
    assert c.state.tolist() == _eager_states(6)
    assert g.failed == "RuntimeError: operation not permitted when stream is capturing"
    assert (g.eager, g.replays, g.graphed) == (6, 0, False)
    lines = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert lines == ["CUDA graph of this step off (RuntimeError: operation not permitted when stream is capturing); "
                     "running it eagerly"]


def test_a_replay_that_differs_from_the_eager_step_is_refused():
    c = _Counter()

    def twice(step):  # a wrong graph: two steps per replay
        return _Played(lambda: (step(), step()))

    g = _OnTheCpu(c.step, [c.state], twice)
    for _ in range(6):
        g()
    assert c.state.tolist() == _eager_states(6)
    assert g.failed == "a replay differs from the eager step" and not g.graphed and g.replays == 0


def test_a_loop_turns_graphs_off_after_one_failed_capture(caplog, monkeypatch):
    family = graphs.StepGraphs("cpu")
    family.on = True  # as on a GPU
    first, second = _Counter(), _Counter()
    with caplog.at_level(logging.WARNING, logger="overinterp_fast"):
        a = _OnTheCpu(first.step, [first.state], ValueError("no"), family=family)
        family.steps.append(a)
        for _ in range(5):
            a()
        b = _OnTheCpu(second.step, [second.state], lambda step: _Played(step), family=family)
        for _ in range(5):
            b()
    assert family.failed == "ValueError: no" and b.failed == "ValueError: no"
    assert first.state.tolist() == second.state.tolist() == _eager_states(5)
    assert b.replays == 0 and family.mode == "eager"
    assert len([r for r in caplog.records if "CUDA graph" in r.getMessage()]) == 1
    family.release()
    assert family.steps == []
