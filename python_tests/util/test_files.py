"""Durable files (util/files.py): the atomic write (names, flush, rename, no trace of a failed write, a real full
disk), and JSON updates under a lock that concurrent writers do not lose entries to."""
import errno
import json
import os
import threading
import time

import pytest
from filelock import FileLock

from overinterp_fast.util import files
from mounts import tmpfs


def test_atomic_write_names_flushes_and_renames(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen, synced = [], []
    monkeypatch.setattr(files, "fsync_dir", synced.append)

    def write(tmp):
        seen.append(tmp)
        with open(tmp, "w") as fh:
            fh.write("payload")

    files.atomic_write("out.txt", write)  # a relative path: the folder synced is its absolute parent
    assert seen == [f"out.txt.tmp-{os.getpid()}-{threading.get_native_id()}"] and synced == [str(tmp_path)]
    assert open("out.txt").read() == "payload" and sorted(os.listdir()) == ["out.txt"]
    monkeypatch.undo()
    files.fsync_dir(str(tmp_path))  # the real one opens and closes the folder
    files.write_json(str(tmp_path / "doc.json"), {"a": (1, 2), "b": tmp_path})  # default=str for the path
    assert json.load(open(tmp_path / "doc.json")) == {"a": [1, 2], "b": str(tmp_path)}
    assert sorted(os.listdir(tmp_path)) == ["doc.json", "out.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "doc.json"
    files.write_json(path, {"old": 1})

    def half(tmp):
        with open(tmp, "w") as fh:
            fh.write('{"new":')
        raise RuntimeError("stopped halfway")

    with pytest.raises(RuntimeError, match="stopped halfway"):
        files.atomic_write(path, half)
    assert json.load(open(path)) == {"old": 1} and os.listdir(tmp_path) == ["doc.json"]


def test_a_full_disk_fails_the_write_and_frees_its_space(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as disk:
        files.write_json(os.path.join(disk, "small.json"), {"a": 1})
        with pytest.raises(OSError) as err:
            files.write_json(os.path.join(disk, "big.json"), {"x": "y" * 200_000})
        assert err.value.errno == errno.ENOSPC
        assert os.listdir(disk) == ["small.json"]  # the partial temporary file is gone: its space is free again
        files.write_json(os.path.join(disk, "next.json"), {"b": 2})
        assert json.load(open(os.path.join(disk, "next.json"))) == {"b": 2}


def test_read_json_defaults(tmp_path):
    assert files.read_json(tmp_path / "none.json", {}) == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert files.read_json(tmp_path / "bad.json") is None
    (tmp_path / "good.json").write_text('{"k": [1]}')
    assert files.read_json(tmp_path / "good.json") == {"k": [1]}


def test_update_json_merges_and_starts_over_from_a_broken_file(tmp_path):
    path = tmp_path / "cache.json"
    assert files.update_json(path, lambda d: d.update(a=1)) == {"a": 1}
    assert files.update_json(path, lambda d: d.update(b=2)) == {"a": 1, "b": 2}
    assert json.load(open(path)) == {"a": 1, "b": 2}
    path.write_text("[1, 2]")  # not an object
    assert files.update_json(path, lambda d: d.update(c=3)) == {"c": 3}
    path.write_text("{broken")
    assert files.update_json(path, lambda d: d.update(d=4)) == {"d": 4}
    assert sorted(os.listdir(tmp_path)) == ["cache.json", "cache.json.lock"]


def test_update_json_waits_for_the_lock(tmp_path):
    """Another holder of ``<path>.lock`` (a lock of its own, as another process would hold): the update waits for
    it, then merges what the holder wrote meanwhile."""
    path = tmp_path / "cache.json"
    holder = FileLock(str(path) + ".lock", timeout=0)
    holder.acquire()
    t = threading.Thread(target=files.update_json, args=(path, lambda d: d.update(waiter=1)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and not path.exists()  # still waiting, nothing written
    files.write_json(path, {"holder": 1})
    holder.release()
    t.join(30)
    assert json.load(open(path)) == {"holder": 1, "waiter": 1}
    holder.acquire()
    try:
        with pytest.raises(TimeoutError):
            files.update_json(path, lambda d: d.update(late=1), timeout=0.2)
    finally:
        holder.release()
    assert json.load(open(path)) == {"holder": 1, "waiter": 1}


def test_concurrent_updates_lose_no_entry(tmp_path):
    """Six writers, 25 entries each, at once: all 150 are in the file (without the lock about 30 survive)."""
    path = tmp_path / "cache.json"

    def work(t):
        for i in range(25):
            files.update_json(path, lambda d: d.update({f"{t}-{i}": i}))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(json.load(open(path))) == sorted(f"{t}-{i}" for t in range(6) for i in range(25))
