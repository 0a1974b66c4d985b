"""ChunkRunner's out-of-memory back-off: halving, the same items re-run, memory released in the right order."""
import weakref

import pytest
import torch

from overinterp_fast.batching import ChunkRunner


def test_empty_cache_runs_after_the_failed_batch_is_released(monkeypatch):
    """Inside the except block the traceback still holds the failed batch; empty_cache must come after it."""
    failed, at_empty_cache = [], []

    def work(sl):
        batch = torch.arange(sl.start, sl.stop)
        if batch.numel() > 2:
            failed.append(weakref.ref(batch))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: at_empty_cache.append([r() is None for r in failed]))
    runner = ChunkRunner(8, torch.device("cuda"))  # no GPU needed: work never touches one
    with pytest.warns(UserWarning) as caught:
        out = runner.run(7, work)
    assert [str(w.message) for w in caught] == ["out of memory at 7 candidates per forward call; retrying with 3",
                                                 "out of memory at 3 candidates per forward call; retrying with 1"]
    assert torch.equal(out, torch.arange(7)) and runner.chunk == 1
    assert at_empty_cache == [[True], [True, True]]  # after each failure, every failed batch already freed


def test_one_item_that_does_not_fit_raises():
    def work(sl):
        raise torch.OutOfMemoryError("out of memory")

    with pytest.warns(UserWarning), pytest.raises(torch.OutOfMemoryError, match="single candidate"):
        ChunkRunner(2, torch.device("cpu")).run(3, work)
