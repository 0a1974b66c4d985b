"""audit/distributed.py checked with torch.distributed and torch.cuda replaced by recorders: what each rank
reads from torchrun's environment, which device it computes on (the CUDA choices too, with no GPU), when the
gloo group is created, waited on and destroyed. audit/test_stream.py runs real two-rank audits.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import datetime
import pytest
import torch
import torch.distributed as dist
from overinterp_fast.audit import distributed


@pytest.fixture
def fake_dist(monkeypatch):
    calls = []
    state = {"initialized": False}
    monkeypatch.setattr(dist, "is_initialized", lambda: state["initialized"])
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout: calls.append(("init", backend, timeout)))
    monkeypatch.setattr(dist, "barrier", lambda: calls.append(("barrier",)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy",)))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return calls, state


@pytest.fixture
def fake_cuda(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: chosen.append(dev))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    return chosen


@pytest.mark.mutation
def test_one_process_without_torchrun(fake_dist):
    calls, _ = fake_dist
    r = distributed.setup()
    assert (r.rank, r.world, r.local_rank, r.device, r.owns_group) == (0, 1, 0, torch.device("cpu"), False)
    assert r.is_main and calls == []
    distributed.barrier(r)
    distributed.teardown(r)
    assert calls == []
    assert distributed.Ranks() == r  # the defaults are a one-process job on the CPU


@pytest.mark.mutation
def test_a_rank_of_torchrun_joins_a_gloo_group(fake_dist, monkeypatch):
    calls, state = fake_dist
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    r = distributed.setup("cpu")
    assert (r.rank, r.world, r.local_rank, r.device, r.owns_group) == (2, 3, 1, torch.device("cpu"), True)
    assert not r.is_main
    assert calls == [("init", "gloo", datetime.timedelta(days=7))]
    state["initialized"] = True
    distributed.barrier(r)
    distributed.teardown(r)
    assert calls[1:] == [("barrier",), ("destroy",)]
    # a group someone else created is used, not created, and not destroyed
    again = distributed.setup("cpu")
    assert again.owns_group is False and len(calls) == 3
    distributed.teardown(again)
    distributed.barrier(again)
    assert calls[3:] == [("barrier",)]
    # rank 0 is the main one
    monkeypatch.setenv("RANK", "0")
    assert distributed.setup().is_main


@pytest.mark.mutation
def test_no_barrier_or_teardown_without_a_group(fake_dist, monkeypatch):
    calls, state = fake_dist
    distributed.barrier(distributed.Ranks(0, 2, 0))  # several ranks but no group: nothing to wait on
    distributed.teardown(distributed.Ranks(0, 2, 0, owns_group=True))
    state["initialized"] = True
    distributed.barrier(distributed.Ranks(0, 1, 0))  # one rank: nothing to wait for
    distributed.teardown(distributed.Ranks(0, 2, 0, owns_group=False))
    assert calls == []


@pytest.mark.mutation
def test_two_ranks_are_a_job(fake_dist, fake_cuda, monkeypatch):
    calls, state = fake_dist
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    r = distributed.setup("cuda")
    assert r.owns_group and r.device == torch.device("cuda", 1) and calls[0][0] == "init"
    state["initialized"] = True
    distributed.barrier(r)
    assert calls[-1] == ("barrier",)


@pytest.mark.mutation
def test_world_of_one_never_creates_a_group(fake_dist, monkeypatch):
    calls, _ = fake_dist
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert distributed.setup().owns_group is False and calls == []


@pytest.mark.mutation
def test_cuda_device_per_rank(fake_dist, fake_cuda, monkeypatch):
    calls, _ = fake_dist
    # one process: the current CUDA device
    r = distributed.setup("cuda")
    assert r.device == torch.device("cuda", 5) and fake_cuda == [torch.device("cuda", 5)]
    # several ranks: cuda:LOCAL_RANK
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "2")
    r = distributed.setup(torch.device("cuda"))
    assert r.device == torch.device("cuda", 2) and fake_cuda[-1] == torch.device("cuda", 2)
    # a device with an index is kept as given
    r = distributed.setup("cuda:1")
    assert r.device == torch.device("cuda", 1) and fake_cuda[-1] == torch.device("cuda", 1)
    # the CPU never touches CUDA
    distributed.setup("cpu")
    assert len(fake_cuda) == 3
