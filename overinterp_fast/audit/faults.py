"""Storage faults of an audit folder, in one line: a full disk, a read-only folder, a folder removed meanwhile.

    with writing(out, chunks=12):
        store.commit_chunk(out, c, images, results)

An ``OSError`` of such a fault inside the block (from Python, pyarrow or matplotlib) becomes a
:class:`~overinterp_fast.errors.StorageFault`: one line that names the folder, says what happened and how to go
on. A stored audit loses nothing to it: every chunk committed before the fault stays whole (a commit is an atomic
rename), the failed write leaves no partial file, and the same command resumes from the last committed chunk
once the folder can be written again (or starts anew where the folder was removed). Other errors pass unchanged,
so the block must hold writes to the folder only: an unreadable input image is not a storage fault.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import errno
import os
from contextlib import contextmanager
from typing import Iterator

from ..errors import StorageFault
from . import store

FULL = (errno.ENOSPC, errno.EDQUOT)
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def storage_fault(folder: str, exc: OSError, existed: bool, chunks: int | None = None) -> StorageFault | None:
    """The one-line fault for ``exc``, raised while writing ``folder`` (which ``existed`` before the writes
    began); None when ``exc`` is not a storage fault of the folder. ``chunks``: the audit's number of chunks
    (a stored audit, which the same command resumes), None for results written in one piece."""
    code = exc.errno
    if existed and not os.path.isdir(folder):
        reason = "removed"
    elif code in FULL:
        reason = "full"
    elif code in READ_ONLY:
        reason = "read-only"
    elif code == errno.ENOENT and not os.path.isdir(folder):
        reason = "removed"
    else:
        return None
    return StorageFault(_message(folder, reason, exc, chunks), folder, reason, code)


def _message(folder: str, reason: str, exc: OSError, chunks: int | None) -> str:
    if reason == "removed":
        again = "to start the audit again" if chunks is not None else "to write them again"
        return f"{folder} was removed while being written; rerun the same command {again}"
    what = ("no space is left on its device" if reason == "full"
            else f"it cannot be written ({os.strerror(exc.errno)})")
    fix = ("free some space (or move the folder to a larger disk)" if reason == "full"
           else "make it writable (or copy it to a writable place and give that folder)")
    if chunks is None:
        return f"{folder}: {what}; {fix} and rerun the same command"
    kept = len(store.committed_chunks(folder))
    return (f"{folder}: {what}; the {kept} of {chunks} chunks committed so far are kept: {fix} and rerun the same "
            f"command, which resumes the audit")


@contextmanager
def writing(folder: str, chunks: int | None = None) -> Iterator[None]:
    """The block writes ``folder``: its storage faults become one-line
    :class:`~overinterp_fast.errors.StorageFault` errors (see :func:`storage_fault`); other errors pass."""
    existed = os.path.isdir(folder)
    try:
        yield
    except StorageFault:
        raise
    except OSError as exc:
        fault = storage_fault(folder, exc, existed, chunks)
        if fault is None:
            raise
        raise fault from exc
