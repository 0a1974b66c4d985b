"""audit/stream.py's small pieces by hand: the images' digest, the stored configuration, the fixed batch size, the
count of committed images and rank 0's progress bar. test_stored_audit.py runs whole stored audits (resumes,
SIGKILL, two ranks)."""
import hashlib
import os
import time

import numpy as np
import pytest
import torch

from overinterp_fast.audit import store, stream
from overinterp_fast.datasets import ImageSource

from conftest import fake_terminal


class Squares(ImageSource):
    """Flat grey photos: photo i is a 6 x 6 RGB image of value 10 i."""

    def photo(self, i):
        return np.full((6, 6, 3), 10 * i, dtype=np.uint8)


def _source(n=5, labels=None, **kw):
    return Squares([f"im{i}" for i in range(n)], labels or [i % 3 for i in range(n)], 6,
                   description={"kind": "squares", "n": n}, **kw)


def test_source_digest_by_hand():
    src = _source(3, labels=[2, None, 0])
    want = hashlib.sha1("im0\t2\nim1\tNone\nim2\t0\n".encode()).hexdigest()
    assert stream.source_digest(src) == want
    assert stream.source_digest(src.subset([2, 0])) == hashlib.sha1("im2\t0\nim0\t2\n".encode()).hexdigest()
    assert stream.source_digest(_source(3, labels=[2, 1, 0])) != want  # a label changed: another configuration


def test_audit_config_every_field():
    src = _source(4, mean=(0.5, 0.25, 0.125), std=0.5)
    kw = dict(method="gradient", threshold=0.9, threshold_mode="auto", k=50, collection=False, ensemble=True,
              transfer=True, fraction=0.05, mask_value=torch.tensor([0.0, 0.0]), autocast="bf16", batch_size=32,
              noise_sigma=torch.tensor([0.25, 0.25, 0.25]), chunk_size=2, device=torch.device("cpu"),
              extra={"model_files": ("a.onnx",), "chunk_size": 2})
    cfg = stream.audit_config(src, {"a": 1, "b": 2}, **kw)
    assert cfg == {
        "models": ["a", "b"], "method": "gradient", "threshold": 0.9, "threshold_mode": "auto", "k": 50,
        "autocast": "bf16", "collection": False, "ensemble": True, "transfer": True, "fraction": 0.05,
        "mask_value": 0.0, "images": {"kind": "squares", "n": 4}, "n_images": 4,
        "images_digest": stream.source_digest(src), "size": 6, "mean": [0.5, 0.25, 0.125], "std": 0.5,
        "grey": False, "object_masks": None, "noise_sigma": None, "chunk_size": 2, "device_type": "cpu",
        "batch_size": 32, "model_files": ["a.onnx"]}  # the caller's extra entries merged in, as JSON (lists)
    # k matters only for the gradient method; the noise only with object masks
    cfg = stream.audit_config(_source(4, object_dir="/masks"), {"a": 1}, **dict(kw, method="exact", extra=None))
    assert cfg["k"] is None and cfg["noise_sigma"] == 0.25 and cfg["object_masks"] == "/masks"
    assert "model_files" not in cfg and cfg["n_images"] == 4
    cfg = stream.audit_config(_source(4, object_dir="/m"), {"a": 1},
                              **dict(kw, noise_sigma=torch.tensor([0.1, 0.2, 0.3]), device=torch.device("meta")))
    assert cfg["noise_sigma"] == pytest.approx([0.1, 0.2, 0.3]) and cfg["device_type"] == "meta"


def test_fixed_batch_size_is_the_cpu_default_for_the_chunk(monkeypatch):
    import overinterp_fast.batching as batching

    seen = []
    monkeypatch.setattr(batching, "auto_batch_size", lambda images, total_candidates: seen.append(
        (tuple(images.shape), images.device.type, total_candidates)) or 77)
    assert stream.fixed_batch_size(_source(3), 4) == 77
    assert seen == [((1, 3, 6, 6), "cpu", 4 * 6 * 6)]  # one image's shape; the chunk's candidates
    assert stream.fixed_batch_size(_source(1), 2) == 77 and seen[-1][2] == 2 * 36  # a single image is enough


def _commit(folder, chunk):
    os.makedirs(os.path.join(folder, store.PARTS_DIR), exist_ok=True)
    open(store.part_path(folder, chunk, "results"), "w").close()


def test_committed_images_counts_the_committed_chunks(tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(7, 3)  # (0, 3), (3, 6), (6, 7)
    assert stream._committed_images(folder, ranges) == 0
    _commit(folder, 2)
    assert stream._committed_images(folder, ranges) == 1
    _commit(folder, 0)
    assert stream._committed_images(folder, ranges) == 4
    _commit(folder, 5)  # a chunk past the ranges (another chunk size's part) is not counted
    assert stream._committed_images(folder, ranges) == 4


def test_progress_bar_counts_jobs_from_the_folder(monkeypatch, tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(7, 3)
    _commit(folder, 0)
    terminal = fake_terminal(monkeypatch)
    bar = stream._Progress(folder, ranges, 2, enabled=True, every=0.01)
    assert bar.bar.total == 14 and bar.bar.n == 6 and bar.start_images == 3  # 7 images x 2 models; 3 x 2 done
    assert bar.thread.is_alive() and bar.thread.daemon  # never keeps a crashed job's process alive
    assert bar.bar.smoothing == 0.1 and callable(bar.bar.dynamic_ncols)  # follows the terminal's width
    _commit(folder, 1)
    deadline = time.time() + 10
    while bar.bar.n != 12 and time.time() < deadline:  # the thread sees the other ranks' commits
        time.sleep(0.01)
    assert bar.bar.n == 12
    _commit(folder, 2)
    bar.close()
    assert not bar.thread.is_alive() and bar.bar.n == 14
    last = terminal.last_line()
    assert last.startswith("audit: 100%") and "14/14" in last and "images/s" in last
    assert "job/s" in last or "s/job" in last
    # disabled (another rank, or --quiet): no thread, no output
    terminal.text.clear()
    off = stream._Progress(folder, ranges, 2, enabled=False)
    assert not off.thread.is_alive() and off.every == 1.0  # counts once a second by default
    off.close()
    assert "".join(terminal.text) == ""
    empty = stream._Progress(folder, [], 1, enabled=False)
    assert empty.bar.total == 0
    empty.close()


def test_progress_rate_is_images_per_second_since_the_start(monkeypatch, tmp_path):
    folder = str(tmp_path)
    ranges = store.chunk_ranges(6, 2)
    _commit(folder, 0)
    bar = stream._Progress(folder, ranges, 3, enabled=False)
    posted = []
    monkeypatch.setattr(bar.bar, "set_postfix_str", lambda s, refresh: posted.append((s, refresh)))
    monkeypatch.setattr(bar.bar, "refresh", lambda: posted.append("refresh"))
    clock = iter([bar.t0 + 0.5])
    monkeypatch.setattr(stream.time, "perf_counter", lambda: next(clock))
    _commit(folder, 1)
    _commit(folder, 2)
    bar.update()
    assert posted == [("8.00 images/s", False), "refresh"]  # 4 new images in half a second
    assert bar.bar.n == 18
    bar.stop.set()
