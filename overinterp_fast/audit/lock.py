"""One writer per audit folder: while a stored audit writes a folder, a second audit is refused there.

The lock is ``writer.lock`` in the folder, held with :mod:`filelock` (``flock`` on POSIX, also over NFS): the
operating system releases it when its process ends, however it ends (a SIGKILL, an out-of-memory kill, a node
that dies: an NFS server drops a dead client's locks when its lease runs out). So a killed audit never leaves a
folder locked, a reused process id means nothing, and no lock is judged stale by guesswork. The lock file
itself stays in the folder (an empty file; removing it does not release anything).

Beside it, ``writer.json`` says who holds the lock, for the refusal's message: the pid and host of the process,
when it took the lock, and its job: ``TORCHELASTIC_RUN_ID`` under torchrun (the same on every rank of one job,
and again when torchrun restarts the job's workers), else an id of that process alone. It is written after the
lock is taken and removed when it is released; one left behind by a killed audit is only information.

Rank 0 takes and releases the lock; the other ranks of its job share the folder and follow rank 0's verdict, so
every rank goes on or stops alike. A second audit is refused at once, with one line
(:class:`~overinterp_fast.errors.FolderLocked`), except one of the job that holds the lock: torchrun restarted
the job's workers, whose old rank 0 is on its way out, so the new one waits for its lock (up to
``JOB_WAIT_S`` seconds). It waits too (up to ``CHILDREN_WAIT_S``) when the recorded holder ran on this host and
is gone: processes it forked (DataLoader workers) share its lock until they notice and exit. ``restart`` does
not take a lock over: it discards the results of a finished or abandoned audit, not a running one.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import datetime
import logging
import os
import socket
import uuid
from dataclasses import asdict, dataclass

from ..errors import FolderLocked
from ..util.files import read_json, write_json

LOCK_FILE = "writer.lock"
HOLDER_FILE = "writer.json"
JOB_ENV = "TORCHELASTIC_RUN_ID"
JOB_WAIT_S = 120.0  # how long a restarted torchrun job waits for the lock of its own previous workers
CHILDREN_WAIT_S = 15.0  # how long to wait for the lock of a killed holder's children (DataLoader workers)

log = logging.getLogger(__name__)

__all__ = ["FolderLocked", "Holder", "Writer", "acquire", "release", "read_holder", "job_id", "refusal"]


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: process id, host name, start time (ISO 8601, seconds) and job id."""

    pid: int
    host: str
    since: str
    job: str


@dataclass
class Writer:
    """A lock held by this process: who it says holds it (``holder``) and the :mod:`filelock` lock itself."""

    holder: Holder
    lock: object


def job_id() -> str:
    """This process's job: torchrun's run id (shared by the ranks of one job), else a new id of its own."""
    return os.environ.get(JOB_ENV) or f"process-{uuid.uuid4().hex}"


def lock_path(folder: str) -> str:
    return os.path.join(folder, LOCK_FILE)


def holder_path(folder: str) -> str:
    return os.path.join(folder, HOLDER_FILE)


def read_holder(folder: str) -> Holder | None:
    """Who holds (or last held) the folder's lock, from ``writer.json``; None when there is none or it cannot be
    read as one."""
    doc = read_json(holder_path(folder))
    try:
        return Holder(**doc) if isinstance(doc, dict) else None
    except TypeError:
        return None


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (only to decide whether to wait, never to take a lock)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def refusal(folder: str, held: Holder | None) -> str:
    """The one-line error for a folder whose lock another audit holds (``held``: who, None when not known)."""
    who = ("its holder is not recorded" if held is None
           else f"pid {held.pid} on host {held.host} since {held.since}")
    return (f"{folder} is being written by another audit ({who}); wait for it to finish, or give another "
            f"output folder")


def acquire(folder: str, job: str) -> Writer:
    """Take the lock of ``folder`` (created if missing) for this process and ``job``.

    Raises :class:`~overinterp_fast.errors.FolderLocked` when another audit holds it; waits up to
    ``JOB_WAIT_S`` seconds when the holder is of the same ``job`` (see the module)."""
    from filelock import FileLock, Timeout

    os.makedirs(folder, exist_ok=True)
    lock = FileLock(lock_path(folder), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        held = read_holder(folder)
        if held is not None and held.job == job:
            wait, why = JOB_WAIT_S, f"of this job ({job})"
        elif held is not None and held.host == socket.gethostname() and not _alive(held.pid):
            wait, why = CHILDREN_WAIT_S, "whose process is gone (processes it started still hold the lock)"
        else:
            raise FolderLocked(refusal(folder, held), folder) from None
        log.warning("%s: waiting up to %g s for the lock of pid %s on host %s, %s", folder, wait, held.pid,
                    held.host, why)
        try:
            lock.acquire(timeout=wait)
        except Timeout:
            raise FolderLocked(refusal(folder, read_holder(folder)), folder) from None
    try:
        left = read_holder(folder)
        if left is not None:
            log.warning("%s: the previous audit there (pid %s on host %s since %s) ended without releasing it",
                        folder, left.pid, left.host, left.since)
        me = Holder(os.getpid(), socket.gethostname(),
                    datetime.datetime.now().astimezone().isoformat(timespec="seconds"), job)
        write_json(holder_path(folder), asdict(me))
    except BaseException:
        lock.release()
        raise
    return Writer(me, lock)


def release(folder: str, writer: Writer) -> None:
    """Release the lock and remove ``writer.json``. Never raises for the folder's sake: a folder that was
    removed, or became read-only, while the audit ran is reported by the write that failed, not here."""
    try:
        if read_holder(folder) == writer.holder:
            os.remove(holder_path(folder))
    except OSError:
        pass
    finally:
        writer.lock.release()
