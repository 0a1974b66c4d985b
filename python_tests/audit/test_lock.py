"""The audit folder's lock: a second writer refused with one whole line, stale locks taken over, the lock released
after a run and after a crash. test_stream.py's SIGKILL tests resume over the lock a killed writer leaves, and its
two-rank test shares the folder between the ranks of one torchrun job."""
import json
import logging
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from overinterp_fast.audit import lock, runner
from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
from overinterp_fast.audit.sources import ImageSource
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.cli import main
from helpers import tiny_cnn


class Squares(ImageSource):
    """Flat grey photos: photo i is an 8 x 8 RGB image of value 20 i."""

    def photo(self, i):
        return np.full((8, 8, 3), 20 * i, dtype=np.uint8)


def _audit(out):
    src = Squares([f"im{i}" for i in range(3)], [0, 1, 2], 8, description={"kind": "squares"})
    return run_stored_audit({"net": tiny_cnn(3)}, src, str(out), AuditConfig(method="exact", threshold=0.5),
                            StoreOptions(chunk_size=2, workers=0, report=False), RunOptions(show_progress=False))


def _write_lock(folder, pid, host, job="another job", since="2024-05-01T10:00:00+00:00"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "writer.lock"), "w") as fh:
        json.dump({"pid": pid, "host": host, "since": since, "job": job}, fh)


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid names no process now
    return p.pid


def test_a_second_writer_is_refused_with_one_whole_line(tmp_path):
    out = tmp_path / "audit"
    first = lock.acquire(str(out), "job A")  # a running audit of this process, another job
    assert first.pid == os.getpid() and first.host == socket.gethostname() and first.job == "job A"
    want = (f"{out} is being written by another audit (pid {os.getpid()} on host {socket.gethostname()} since "
            f"{first.since}); wait for it, or remove {out / 'writer.lock'} if that process is gone")
    with pytest.raises(lock.FolderLocked) as err:
        _audit(out)
    assert str(err.value) == want
    assert lock.read_holder(str(out)) == first  # the refused writer leaves the first one's lock alone
    assert not os.path.exists(out / "results.json")  # and writes nothing
    lock.release(str(out), first)
    assert not os.path.exists(out / "writer.lock")


def test_the_command_line_says_it_in_one_line(tmp_path, capsys, image_folder_8):
    out = tmp_path / "audit"
    _write_lock(str(out), os.getpid(), socket.gethostname())
    code = main(["audit", "--model", image_folder_8["model"], "--images", image_folder_8["images"], "--size", "8",
                 "--method", "exact", "--workers", "0", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"overinterp-fast: error: {out} is being written by another audit (pid {os.getpid()} on host "
                   f"{socket.gethostname()} since 2024-05-01T10:00:00+00:00); wait for it, or remove "
                   f"{out / 'writer.lock'} if that process is gone\n")


@pytest.fixture
def image_folder_8(tmp_path):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for i in range(2):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(images / f"img{i}.png")
    path = tmp_path / "net.pt2"
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(tiny_cnn(3), (torch.zeros(2, 3, 8, 8),), dynamic_shapes=({0: batch},)),
                      str(path))
    return {"images": str(images), "model": str(path)}


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_one_line(tmp_path, caplog):
    out = tmp_path / "audit"
    pid = _dead_pid()
    _write_lock(str(out), pid, socket.gethostname())
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.audit.lock"):
        run = _audit(out)
    assert run.computed == 2 and run.record is not None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"{out}: taking over the lock of pid {pid} on host {socket.gethostname()} since "
                    f"2024-05-01T10:00:00+00:00: its process {pid} is gone")
    assert not os.path.exists(out / "writer.lock")  # released at the end


def test_another_hosts_lock_is_refused_unless_it_is_this_jobs(tmp_path, monkeypatch):
    out = tmp_path / "audit"
    _write_lock(str(out), _dead_pid(), "elsewhere.example", job="torchrun-1")
    monkeypatch.delenv(lock.JOB_ENV, raising=False)
    with pytest.raises(lock.FolderLocked, match="on host elsewhere.example since"):
        _audit(out)  # a dead pid tells nothing about another host's process
    monkeypatch.setenv(lock.JOB_ENV, "torchrun-1")  # torchrun restarted the same job: its lock
    assert _audit(out).computed == 2
    assert not os.path.exists(out / "writer.lock")


def test_an_unreadable_lock_is_refused(tmp_path):
    out = tmp_path / "audit"
    out.mkdir()
    (out / "writer.lock").write_text("")
    with pytest.raises(lock.FolderLocked) as err:
        _audit(out)
    assert str(err.value) == (f"{out} is being written by another audit (its lock {out / 'writer.lock'} cannot be "
                              f"read); wait for it, or remove {out / 'writer.lock'} if no audit writes there")


def test_the_lock_is_released_after_a_crash(tmp_path, monkeypatch):
    out = tmp_path / "audit"
    held = []

    def crash(*args, **kw):
        held.append(lock.read_holder(str(out)))
        raise RuntimeError("boom")

    monkeypatch.setattr(runner, "fast_sis", crash)
    with pytest.raises(RuntimeError, match="boom"):
        _audit(out)
    assert held[0].pid == os.getpid() and held[0].job.startswith("process-")  # held while computing
    assert not os.path.exists(out / "writer.lock")
    monkeypatch.undo()
    assert _audit(out).computed == 2  # and the folder is free again


def test_process_alive_and_job_id(monkeypatch):
    assert lock.process_alive(os.getpid()) and not lock.process_alive(_dead_pid())
    monkeypatch.setenv(lock.JOB_ENV, "run-7")
    assert lock.job_id() == "run-7"
    monkeypatch.delenv(lock.JOB_ENV)
    assert lock.job_id() != lock.job_id()  # without torchrun: one job per process (and per call)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads the process state from /proc")
def test_a_zombie_counts_as_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        import time

        deadline = time.time() + 30
        while time.time() < deadline:  # exited, not reaped: a zombie
            with open(f"/proc/{p.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert not lock.process_alive(p.pid)
    finally:
        p.wait()


def test_release_leaves_a_lock_taken_over_meanwhile(tmp_path):
    folder = str(tmp_path)
    mine = lock.acquire(folder, "job A")
    _write_lock(folder, 1, "elsewhere.example")  # someone removed ours and took the folder
    lock.release(folder, mine)
    assert lock.read_holder(folder).host == "elsewhere.example"
