"""
"""
import numpy as np
import pytest
from overinterp_fast.methods.findsis import find_sis, sis_starts
from overinterp_fast.runtime.schedule import CandidateQueue, upload
from overinterp_fast.methods import reference
import torch
from helpers import cuda


def test_queue_fills_batches_and_reports_completions():
    q = CandidateQueue()
    q.push(0, 0, 5, tag=0)
    q.push(1, 0, 3, tag=0)
    b = q.take(4)
    assert b.image.tolist() == [0, 0, 0, 0] and b.slot.tolist() == [0, 1, 2, 3] and b.completed == []
    b = q.take(4)
    assert b.image.tolist() == [0, 1, 1, 1] and b.slot.tolist() == [4, 0, 1, 2]
    assert b.completed == [(0, 0), (1, 0)]
    assert not q
    with pytest.raises(ValueError, match="^a segment needs at least one slot$"):
        q.push(0, 3, 3, 0)


def test_queue_splits_a_segment_over_many_batches_and_counts_pending():
    q = CandidateQueue()
    q.push(2, 1, 11, tag=7)  # slots 1..10
    q.push(5, 4, 6, tag=8)
    assert q.pending() == 12
    got = []
    for _ in range(3):
        b = q.take(3)
        assert len(b) == 3 and b.image.dtype == np.int64 and b.slot.dtype == np.int64
        got.append(b.slot.tolist())
    assert got == [[1, 2, 3], [4, 5, 6], [7, 8, 9]] and q.pending() == 3
    b = q.take(3)
    assert b.image.tolist() == [2, 5, 5] and b.slot.tolist() == [10, 4, 5] and b.completed == [(2, 7), (5, 8)]
    empty = q.take(3)  # nothing queued: an empty batch
    assert len(empty) == 0 and empty.completed == [] and empty.slot.shape == (0,) and empty.image.shape == (0,)
    assert empty.image.dtype == np.int64 and empty.slot.dtype == np.int64 and q.pending() == 0


def test_queue_is_fifo_across_images():
    q = CandidateQueue()
    for i in range(3):
        q.push(i, 0, 2, 0)
    q.push(0, 9, 10, 1)
    b = q.take(100)
    assert b.image.tolist() == [0, 0, 1, 1, 2, 2, 0] and b.slot[-1] == 9
    assert b.completed == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert q.pending() == 0


@pytest.mark.parametrize("seed", range(20))
def test_queue_matches_a_slot_by_slot_fifo(seed):
    """Random pushes (single and many, some before each take) and takes of random sizes, against a plain list of
    (image, slot, tag, last slot?) entries consumed from the front; also the growth and sliding of the arrays
    (capacity 1)."""
    g = np.random.default_rng(seed)
    q = CandidateQueue(images=50, slots=40, capacity=1)
    fifo = []
    for _ in range(60):
        segs = [(int(g.integers(0, 50)), *sorted(g.choice(41, 2, replace=False).tolist()), int(g.integers(0, 3)))
                for _ in range(int(g.integers(0, 6)))]
        if segs and g.random() < 0.5:
            q.push_many(*(np.array(c) for c in zip(*segs)))
        else:
            for sgm in segs:
                q.push(*sgm)
        for i, a, b, t in segs:
            fifo += [(i, j, t, j == b - 1) for j in range(a, b)]
        assert q.pending() == len(fifo) and bool(q) == bool(fifo)
        size = int(g.integers(1, 30))
        batch = q.take(size)
        want, fifo = fifo[:size], fifo[size:]
        assert batch.image.tolist() == [w[0] for w in want] and batch.slot.tolist() == [w[1] for w in want]
        assert batch.completed == [(w[0], w[2]) for w in want if w[3]]
        assert batch.image.dtype == np.int64 and batch.slot.dtype == np.int64


def test_queue_push_many_checks_every_segment():
    q = CandidateQueue(images=3, slots=5)
    with pytest.raises(ValueError, match="^a segment needs at least one slot$"):
        q.push_many([0, 1], [0, 2], [1, 2], [0, 0])
    with pytest.raises(IndexError, match=r"^image 3 out of range \[0, 3\)$"):
        q.push_many([0, 3], [0, 0], [1, 1], [0, 0])
    with pytest.raises(IndexError, match=r"^slots \[4, 6\) out of range \[0, 5\)$"):
        q.push_many([0, 1], [0, 4], [1, 6], [0, 0])
    assert not q  # nothing of a refused call was queued
    q.push_many(np.array([2, 1]), 0, np.array([2, 1]), 9)  # scalars broadcast
    assert q.take(10).completed == [(2, 9), (1, 9)]


@pytest.mark.parametrize("seed", range(30))
def test_find_sis_matches_reference_loop(seed):
    g = np.random.default_rng(seed)
    m = int(g.integers(1, 12))
    order = torch.from_numpy(g.permutation(m))
    values = torch.from_numpy(g.random(m))
    tau = float(g.random())
    want = reference.find_sis_from_backselect(list(zip(order.tolist(), values.tolist())), tau)
    assert find_sis(order, values, tau).tolist() == want


def test_find_sis_edge_cases():
    order = torch.tensor([4, 2, 0, 1, 3])
    # fully masked input passes: empty SIS (sis.py would skip feature 3 and go on)
    assert find_sis(order, torch.tensor([0.1, 0.2, 0.1, 0.3, 0.95]), 0.9).tolist() == []
    # nothing passes: every feature, last-masked first
    assert find_sis(order, torch.tensor([0.5, 0.4, 0.3, 0.2, 0.1]), 0.9).tolist() == [3, 1, 0, 2, 4]
    # stop at the first value (from the end) reaching tau; that feature is not taken
    assert find_sis(order, torch.tensor([0.99, 0.95, 0.91, 0.5, 0.1]), 0.9).tolist() == [3, 1]


@pytest.mark.parametrize("seed", range(10))
def test_find_sis_of_many_rounds_at_once_matches_the_reference_loop(seed):
    """sis_starts over rows of different lengths (padding past each length that would pass), values at tau,
    NaN, none passing and the last one passing: each row's SIS is the reference's."""
    g = np.random.default_rng(seed)
    k, width = 12, 9
    lengths = g.integers(1, width + 1, k)
    values = np.round(g.random((k, width)), 1)  # coarse: values equal to tau
    values[0, :] = np.nan
    values[1, : lengths[1]] = 0.0
    values[2, lengths[2] - 1] = 1.0
    values[np.arange(width)[None, :] >= lengths[:, None]] = 1.0  # padding that would pass
    order = np.stack([g.permutation(width) for _ in range(k)])
    tau = np.round(g.random(k), 1)
    starts = sis_starts(values, lengths, tau)
    for r in range(k):
        m = lengths[r]
        want = reference.find_sis_from_backselect(list(zip(order[r, :m].tolist(), values[r, :m].tolist())), tau[r])
        assert order[r, starts[r]:m][::-1].tolist() == want


def test_upload_gives_each_part_as_an_int64_tensor():
    parts = upload(torch.device("cpu"), np.array([3, 1, 4]), [], [1, 5], (9,))
    assert [t.tolist() for t in parts] == [[3, 1, 4], [], [1, 5], [9]]
    assert all(t.dtype == torch.int64 and t.device.type == "cpu" for t in parts)
    # on the CPU nothing is transferred: each part is a copy of its own, which later changes to the caller's
    # arrays leave alone
    src = np.array([3, 1, 4])
    (t,) = upload(torch.device("cpu"), src)
    src[0] = 7
    assert t.tolist() == [3, 1, 4]
    assert upload(torch.device("cpu")) == ()


@cuda
def test_upload_to_cuda_copies_without_waiting_for_the_gpu():
    dev = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        parts = upload(dev, np.arange(5), [7, 8])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [t.device.type for t in parts] == ["cuda", "cuda"]
    assert [t.tolist() for t in parts] == [[0, 1, 2, 3, 4], [7, 8]]


@pytest.mark.mutation
def test_upload_flattens_each_part_into_int64():
    a, b, c = upload(torch.device("cpu"), [[1, 2], [3, 4]], np.array([5], dtype=np.int32), [])
    assert (a.tolist(), b.tolist(), c.tolist()) == ([1, 2, 3, 4], [5], [])
    assert [t.dtype for t in (a, b, c)] == [torch.int64] * 3
    assert upload(torch.device("cpu")) == ()
    (m,) = upload(torch.device("meta"), [1, 2])  # any other device: one copy there
    assert m.device.type == "meta" and m.dtype == torch.int64 and tuple(m.shape) == (2,)
