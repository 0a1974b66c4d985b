"""runtime.sync.to_host: the one counted way the loops read device values."""
import pytest
import torch

from overinterp_fast.runtime import sync
from helpers import cuda


def test_to_host_counts_calls_tensors_and_labels_in_nested_blocks():
    a, b = torch.arange(3), torch.ones(2, dtype=torch.bool)
    with sync.counting() as outer:
        sync.to_host(a, b, label="x")
        with sync.counting() as inner:
            sync.to_host(a, label="y")
        sync.to_host(label="x")
    assert (outer.count, outer.tensors, outer.by_label) == (3, 3, {"x": 2, "y": 1})
    assert (inner.count, inner.tensors, inner.by_label) == (1, 1, {"y": 1})
    sync.to_host(a)  # outside every block: counted nowhere
    assert outer.count == 3 and inner.count == 1


def test_to_host_returns_cpu_tensors_as_they_are():
    a = torch.arange(6).view(2, 3)
    (out,) = sync.to_host(a)
    assert out is a


def test_reading_is_true_only_inside_to_host(monkeypatch):
    seen = []
    t = torch.zeros(2, device="meta")
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self: seen.append(sync.reading()) or torch.zeros(2))
    assert not sync.reading()
    (out,) = sync.to_host(t)  # a device that is neither CPU nor CUDA: moved with .cpu()
    assert seen == [True] and not sync.reading() and out.device.type == "cpu"


@cuda
def test_to_host_from_cuda_is_pinned_and_allowed_under_sync_debug_errors():
    t = torch.arange(5, device="cuda") * 2
    torch.cuda.set_sync_debug_mode("error")
    try:
        (out,) = sync.to_host(t)
        with pytest.raises(RuntimeError):
            t.sum().item()  # any other read is an error in this mode
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.device.type == "cpu" and out.is_pinned() and out.tolist() == [0, 2, 4, 6, 8]
