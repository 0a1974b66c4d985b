"""Durable files: written whole or not at all (atomic replace, flushed to disk), and JSON files that several
processes update without losing each other's entries (read-merge-write under a file lock).

    atomic_write("out/model.pt", lambda tmp: torch.save(state, tmp))   # in a folder that exists
    make_parent("out/masks.npz")                                         # the folder made first, where missing
    update_json("cache/calibration.json", lambda data: data.update({key: entry}))

A file is written under a temporary name in its own folder (``<name>.tmp-<pid>-<thread>``), flushed to disk (fsync) and
renamed into place; the rename is atomic on POSIX file systems, and the folder is flushed after it so that the
new name survives a power cut. A write that fails (a full disk, an exception in ``write``) removes its
temporary file; a killed process leaves it, and :data:`TEMP_MARK` lets the owner of the folder find it.
The locks are :mod:`filelock`'s (``flock`` on POSIX): the operating system releases them when their process
ends, however it ends.
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

TEMP_MARK = ".tmp-"  # in the name of every temporary file of atomic_write


def temporary_name(path: str) -> str:
    """Where :func:`atomic_write` writes ``path`` before renaming it: a name of this process and thread alone."""
    return f"{path}{TEMP_MARK}{os.getpid()}-{threading.get_native_id()}"


def fsync_dir(folder: str) -> None:
    """Flush a folder's entries (a rename in it) to disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_parent(path: str | os.PathLike) -> None:
    """Create the folder ``path`` goes in, with its parents, where missing (a writer's ``out/masks.npz``)."""
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> None:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a temporary file next to it, which is flushed to
    disk and renamed to ``path`` (replacing a file there). When ``write`` or the flush fails, the temporary file
    is removed and the error raised; ``path`` is then as it was."""
    path = os.fspath(path)
    tmp = temporary_name(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except Exception:  # a failed write; a killed process (or Ctrl-C) leaves its temporary file to the folder's owner
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_json(path: str | os.PathLike, doc: Any) -> None:
    """:func:`atomic_write` of ``doc`` as JSON (values JSON cannot hold are written as their ``str``)."""

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, default=str)

    atomic_write(path, dump)


def read_json(path: str | os.PathLike, default: Any = None) -> Any:
    """The JSON in ``path``; ``default`` when there is no such file or it is not JSON."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return default


@contextmanager
def locked(path: str | os.PathLike, timeout: float = -1) -> Iterator[None]:
    """Hold the lock file ``path`` (created if missing; kept afterwards) for the block.

    ``timeout``: seconds to wait for another holder (-1: as long as it takes); past it, ``filelock.Timeout``
    (a ``TimeoutError``)."""
    from filelock import FileLock

    with FileLock(os.fspath(path), timeout=timeout):
        yield


def update_json(path: str | os.PathLike, change: Callable[[dict], Any], timeout: float = -1) -> dict:
    """Read the JSON object in ``path`` (an empty one when the file is missing or not an object), let
    ``change`` modify it in place, and write it back atomically, all under the lock ``<path>.lock``: processes
    updating the same file at once each see the others' entries. Returns the object written."""
    path = os.fspath(path)
    with locked(f"{path}.lock", timeout):
        data = read_json(path, {})
        if not isinstance(data, dict):
            data = {}
        change(data)
        write_json(path, data)
    return data
