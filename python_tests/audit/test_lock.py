"""The audit folder's lock (filelock): a second writer refused with one whole line, a killed writer's lock gone
with its process, a leftover record (a reused pid, another host) locking nothing, the same torchrun job waiting
for its own lock, and the lock released after a run and after a crash. test_stream.py's SIGKILL tests resume
after killed writers, and its two-rank test shares the folder between the ranks of one torchrun job."""
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from filelock import FileLock

import overinterp_fast as of
from overinterp_fast.audit import lock, runner
from overinterp_fast.audit.config import AuditConfig, RunOptions, StoreOptions
from overinterp_fast.audit.sources import ImageSource
from overinterp_fast.audit.stream import run_stored_audit
from overinterp_fast.cli import main
from helpers import tiny_cnn


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Squares(ImageSource):
    """Flat grey photos: photo i is an 8 x 8 RGB image of value 20 i."""

    def photo(self, i):
        return np.full((8, 8, 3), 20 * i, dtype=np.uint8)


def _audit(out):
    src = Squares([f"im{i}" for i in range(3)], [0, 1, 2], 8, description={"kind": "squares"})
    return run_stored_audit({"net": tiny_cnn(3)}, src, str(out), AuditConfig(method="exact", threshold=0.5),
                            StoreOptions(chunk_size=2, workers=0, report=False), RunOptions(show_progress=False))


def _record(folder):
    """writer.json as written (read here with json, not with the code under test)."""
    with open(os.path.join(folder, "writer.json")) as fh:
        return json.load(fh)


def _write_record(folder, pid, host, job="another job", since="2024-05-01T10:00:00+00:00"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "writer.json"), "w") as fh:
        json.dump({"pid": pid, "host": host, "since": since, "job": job}, fh)


# Another audit's side of the lock, as lock.py keeps it (flock on writer.lock, which is what filelock takes on
# POSIX; the holder in writer.json), in a process that starts in a fraction of a second (no torch): it holds the
# lock until its stdin closes. With a third argument it forks a child that shares the lock until the same stdin
# closes (as the DataLoader workers of an audit do with filelock 3, which leaves the descriptor to the child).
HOLD = """import fcntl, json, os, socket, sys
folder, job = sys.argv[1], sys.argv[2]
os.makedirs(folder, exist_ok=True)
fd = os.open(os.path.join(folder, "writer.lock"), os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
with open(os.path.join(folder, "writer.json"), "w") as fh:
    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "since": "2024-05-01T10:00:00+00:00",
               "job": job}, fh)
if len(sys.argv) > 3 and os.fork() == 0:
    sys.stdin.read()
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
os.remove(os.path.join(folder, "writer.json"))
fcntl.flock(fd, fcntl.LOCK_UN)
"""


def _holder(folder, job="another job", child=False):
    """Another process that takes the folder's lock and holds it until its stdin closes."""
    extra = ["child"] if child else []
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), job, *extra], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n", p.stderr.read()
    return p


class _OnWait(logging.Handler):
    """Runs ``action`` when lock.py logs that it waits for a lock: the holder ends while the audit waits."""

    def __init__(self, action):
        super().__init__()
        self.action = action

    def emit(self, record):
        if "waiting up to" in record.getMessage():
            self.action()


@contextlib.contextmanager
def _released_once_waiting(action):
    handler = _OnWait(action)
    logger = logging.getLogger("overinterp_fast.audit.lock")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def test_a_second_writer_is_refused_with_one_whole_line(tmp_path):
    out = tmp_path / "audit"
    p = _holder(out)
    try:
        rec = _record(str(out))
        assert (rec["pid"], rec["host"], rec["job"]) == (p.pid, socket.gethostname(), "another job")
        with pytest.raises(of.errors.FolderLocked) as err:
            _audit(out)
        assert str(err.value) == (f"{out} is being written by another audit (pid {p.pid} on host "
                                  f"{socket.gethostname()} since 2024-05-01T10:00:00+00:00); wait for it to "
                                  f"finish, or give another output folder")
        assert isinstance(err.value, ValueError) and err.value.folder == str(out)
        assert _record(str(out)) == rec  # the refused writer leaves the holder's record alone
        assert not os.path.exists(out / "results.json")  # and writes nothing
    finally:
        p.stdin.close()
        p.wait()
    assert not os.path.exists(out / "writer.json")  # released by its holder
    assert _audit(out).computed == 2  # and the folder is free


def test_the_command_line_says_it_in_one_line(tmp_path, capsys, image_folder_8):
    out = tmp_path / "audit"
    held = lock.acquire(str(out), "job A")  # a lock of its own (another file descriptor), as another process
    try:
        code = main(["audit", "--model", image_folder_8["model"], "--images", image_folder_8["images"], "--size",
                     "8", "--method", "exact", "--workers", "0", "--quiet", "--out", str(out)])
    finally:
        lock.release(str(out), held)
    err = capsys.readouterr().err
    assert code == 2
    assert err == (f"overinterp-fast: error: {out} is being written by another audit (pid {os.getpid()} on host "
                   f"{socket.gethostname()} since {held.holder.since}); wait for it to finish, or give another "
                   f"output folder\n")


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


def test_a_killed_writers_lock_goes_with_its_process(tmp_path, caplog):
    out = tmp_path / "audit"
    p = _holder(out)
    since = _record(str(out))["since"]
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert _record(str(out))["pid"] == p.pid  # its record stays behind
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.audit.lock"):
        run = _audit(out)
    assert run.computed == 2 and run.record is not None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"{out}: the previous audit there (pid {p.pid} on host {socket.gethostname()} since {since}) "
                    f"ended without releasing it")
    assert not os.path.exists(out / "writer.json")


def test_a_killed_writers_children_are_waited_for(tmp_path, caplog):
    """The writer is killed, but a process it forked still holds the lock for a moment: the next audit waits for it
    (the recorded holder ran here and is gone), then runs."""
    out = tmp_path / "audit"
    p = _holder(out, child=True)
    p.send_signal(signal.SIGKILL)
    p.wait()
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.audit.lock"), _released_once_waiting(p.stdin.close):
        assert _audit(out).computed == 2  # the child exits once the audit waits for it
    assert caplog.records[0].getMessage() == (
        f"{out}: waiting up to {lock.CHILDREN_WAIT_S:g} s for the lock of pid {p.pid} on host {socket.gethostname()}, "
        f"whose process is gone (processes it started still hold the lock)")


@pytest.mark.parametrize("host", ["this host", "elsewhere.example"])
def test_a_leftover_record_locks_nothing(tmp_path, host):
    """A record naming a live process (this one: a pid reused since) or a process on another host, with no lock
    held: the folder is free (a pid and host check would refuse both)."""
    out = tmp_path / "audit"
    _write_record(str(out), os.getpid(), socket.gethostname() if host == "this host" else host)
    assert _audit(out).computed == 2
    assert not os.path.exists(out / "writer.json")


def test_an_unrecorded_holder_is_refused(tmp_path):
    out = tmp_path / "audit"
    out.mkdir()
    other = FileLock(str(out / "writer.lock"), timeout=0)
    other.acquire()
    try:
        with pytest.raises(lock.FolderLocked) as err:
            _audit(out)
    finally:
        other.release()
    assert str(err.value) == (f"{out} is being written by another audit (its holder is not recorded); wait for it "
                              f"to finish, or give another output folder")


def test_the_same_torchrun_job_waits_for_its_own_lock(tmp_path, monkeypatch, caplog):
    """torchrun restarted the job's workers: the new rank 0 waits for the old one's lock; another job does not."""
    out = tmp_path / "audit"
    old = _holder(out, "torchrun-1")
    monkeypatch.delenv(lock.JOB_ENV, raising=False)
    t0 = time.perf_counter()
    with pytest.raises(lock.FolderLocked):
        _audit(out)  # another job: refused at once
    assert time.perf_counter() - t0 < 30
    monkeypatch.setenv(lock.JOB_ENV, "torchrun-1")
    with caplog.at_level(logging.WARNING, logger="overinterp_fast.audit.lock"), _released_once_waiting(old.stdin.close):
        run = _audit(out)  # the old rank 0 ends while the new one waits
    assert run.computed == 2
    old.wait()
    assert caplog.records[0].getMessage() == (f"{out}: waiting up to {lock.JOB_WAIT_S:g} s for the lock of pid "
                                              f"{old.pid} on host {socket.gethostname()}, of this job "
                                              f"(torchrun-1)")
    stuck = lock.acquire(str(out), "torchrun-1")
    monkeypatch.setattr(lock, "JOB_WAIT_S", 0.3)
    try:
        with pytest.raises(lock.FolderLocked, match=f"pid {os.getpid()} on host"):
            _audit(out)  # the same job, but the lock is not released in time
    finally:
        lock.release(str(out), stuck)


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
    assert not os.path.exists(out / "writer.json")
    probe = FileLock(str(out / "writer.lock"), timeout=0)
    probe.acquire()  # free: taken at once
    probe.release()
    monkeypatch.undo()
    assert _audit(out).computed == 2


def test_release_survives_a_removed_folder(tmp_path):
    folder = tmp_path / "gone"
    mine = lock.acquire(str(folder), "job A")
    for f in os.listdir(folder):
        os.remove(folder / f)
    folder.rmdir()
    lock.release(str(folder), mine)  # no error: the failed write reports the removal, not the release
    again = lock.acquire(str(folder), "job B")
    lock.release(str(folder), again)


def test_job_id(monkeypatch):
    monkeypatch.setenv(lock.JOB_ENV, "run-7")
    assert lock.job_id() == "run-7"
    monkeypatch.delenv(lock.JOB_ENV)
    assert lock.job_id() != lock.job_id()  # without torchrun: one job per process (and per call)


def test_read_holder_of_a_broken_record(tmp_path):
    assert lock.read_holder(str(tmp_path)) is None
    (tmp_path / "writer.json").write_text("")
    assert lock.read_holder(str(tmp_path)) is None
    (tmp_path / "writer.json").write_text('{"pid": 1}')
    assert lock.read_holder(str(tmp_path)) is None
    _write_record(str(tmp_path), 5, "h", job="j", since="s")
    assert lock.read_holder(str(tmp_path)) == lock.Holder(5, "h", "s", "j")
