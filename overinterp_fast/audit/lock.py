"""One writer per audit folder: while a stored audit writes a folder, a second audit is refused there.

The lock is the file ``writer.lock`` in the folder (JSON): the pid and host of the process holding it, when it
took it, and its job: ``TORCHELASTIC_RUN_ID`` under torchrun (the same on every rank of one job, and again when
torchrun restarts the job's workers), else an id of that process alone. Rank 0 takes and releases the lock; the
other ranks of its job share the folder and follow rank 0's verdict, so every rank goes on or stops alike.

A lock already there is taken over, with one logged line, when it is stale:

- it belongs to this job (torchrun restarted the workers after a failure), or
- it was written on this host and its process is gone (an audit killed before it could release the lock).

A lock of another job on another host is always refused: its process cannot be checked from here. Remove
the lock file by hand once that process is gone. ``restart`` does not take a lock over: it discards the results
of a finished or abandoned audit, not a running one.

The lock is released when the audit ends, normally or with an exception; a killed process leaves it behind,
and the next run on the same host takes it over.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass

LOCK_FILE = "writer.lock"
JOB_ENV = "TORCHELASTIC_RUN_ID"

log = logging.getLogger(__name__)


class FolderLocked(ValueError):
    """Another audit writes the folder (the message is one line: who, since when, and what to do)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: process id, host name, start time (ISO 8601, seconds) and job id."""

    pid: int
    host: str
    since: str
    job: str


def job_id() -> str:
    """This process's job: torchrun's run id (shared by the ranks of one job), else a new id of its own."""
    return os.environ.get(JOB_ENV) or f"process-{uuid.uuid4().hex}"


def lock_path(folder: str) -> str:
    return os.path.join(folder, LOCK_FILE)


def read_holder(folder: str) -> Holder | None:
    """The lock's holder; None when there is no lock or it cannot be read as one."""
    try:
        with open(lock_path(folder), encoding="utf-8") as fh:
            return Holder(**json.load(fh))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_reason(held: Holder, me: Holder) -> str | None:
    """Why ``held``'s lock may be taken over by ``me`` (None: it may not)."""
    if held.job == me.job:
        return f"it belongs to this job ({me.job})"
    if held.host == me.host and not process_alive(held.pid):
        return f"its process {held.pid} is gone"
    return None


def refusal(folder: str, held: Holder | None) -> str:
    """The one-line error for a folder whose lock ``held`` (None: unreadable) is not this audit's."""
    path = lock_path(folder)
    if held is None:
        return (f"{folder} is being written by another audit (its lock {path} cannot be read); wait for it, or "
                f"remove {path} if no audit writes there")
    return (f"{folder} is being written by another audit (pid {held.pid} on host {held.host} since {held.since}); "
            f"wait for it, or remove {path} if that process is gone")


def acquire(folder: str, job: str) -> Holder:
    """Take the lock of ``folder`` (created if missing) for this process and ``job``; returns the holder written.

    Raises :class:`FolderLocked` when another audit holds it (a stale lock is taken over, see the module)."""
    os.makedirs(folder, exist_ok=True)
    me = Holder(os.getpid(), socket.gethostname(),
                datetime.datetime.now().astimezone().isoformat(timespec="seconds"), job)
    path = lock_path(folder)
    for _ in range(3):
        if _create(path, me):
            return me
        held = read_holder(folder)
        if held is None and not os.path.exists(path):
            continue  # released meanwhile
        reason = None if held is None else stale_reason(held, me)
        if reason is None:
            raise FolderLocked(refusal(folder, held))
        if read_holder(folder) == held:  # still the lock just judged, not one another process took meanwhile
            log.warning("%s: taking over the lock of pid %s on host %s since %s: %s", folder, held.pid, held.host,
                        held.since, reason)
            _remove(path)
    raise FolderLocked(refusal(folder, read_holder(folder)))


def release(folder: str, me: Holder) -> None:
    """Remove the lock if it is still ``me``'s (a lock taken over meanwhile stays)."""
    if read_holder(folder) == me:
        _remove(lock_path(folder))


def _create(path: str, me: Holder) -> bool:
    """Write the lock whole or not at all: a private file, then a hard link that fails when a lock exists."""
    tmp = f"{path}.new-{me.pid}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(asdict(me), fh)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: create exclusively, then write
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(asdict(me), fh)
        return True
    finally:
        os.remove(tmp)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
