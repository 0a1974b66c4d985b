"""The package's own exceptions: errors a caller can tell apart (and catch) by class.

Each subclasses the built-in exception that the same error raised before it existed, so code written against
the built-in keeps working: ``except ValueError`` still catches a locked folder or a configuration mismatch.
Every message is one line that says what happened and what to do.

=====================  ===========  ==========================================================================
class                  subclass of  raised when
=====================  ===========  ==========================================================================
``FolderLocked``       ValueError   another audit writes the audit folder (its holder named)
``ConfigMismatch``     ValueError   the audit folder holds an audit with another configuration
``StorageFault``       OSError      writing the audit folder failed: disk full, read-only, or folder removed
``MissingDependency``  ImportError  an optional dependency is not installed (the extra that installs it named)
``Interrupted``        KeyboardInt  Ctrl-C or SIGTERM stopped an audit (what it kept, and how to resume, said)
=====================  ===========  ==========================================================================
"""
from __future__ import annotations


class FolderLocked(ValueError):
    """Another audit writes the folder: the message names its process, host and start, and what to do.

    Attributes:
        folder: the audit folder.
    """

    def __init__(self, message: str, folder: str | None = None):
        super().__init__(message)
        self.folder = folder


class ConfigMismatch(ValueError):
    """The audit folder holds an audit with another configuration (the message names the first difference).

    Attributes:
        folder: the audit folder. key: the first configuration entry that differs.
    """

    def __init__(self, message: str, folder: str | None = None, key: str | None = None):
        super().__init__(message)
        self.folder, self.key = folder, key


class StorageFault(OSError):
    """Writing the audit folder failed: the disk is full, the folder is read-only, or it was removed while the
    audit ran. What was committed before the fault is kept; the message says how to go on (for a stored audit:
    rerun the same command, which resumes).

    Attributes:
        folder: the folder being written. reason: "full", "read-only" or "removed".
        errno: the operating system's error number of the failed write.
    """

    def __init__(self, message: str, folder: str | None = None, reason: str | None = None, errno: int | None = None):
        super().__init__(message)
        self.folder, self.reason, self.errno = folder, reason, errno


class MissingDependency(ImportError):
    """An optional dependency is not installed: the message names it and the extra that installs it
    (``pip install 'overinterp-fast[audit]'``).

    Attributes:
        extra: the extra (e.g. "audit"). missing: the import names that are not installed.
    """

    def __init__(self, message: str, extra: str | None = None, missing: tuple[str, ...] = ()):
        super().__init__(message, name=missing[0] if missing else None)
        self.extra, self.missing = extra, missing


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped the run (:mod:`overinterp_fast.util.interrupts`). A KeyboardInterrupt,
    so that code which stops on Ctrl-C stops on it alike, and ``except Exception`` does not swallow it.

    Attributes:
        signal: "SIGINT" or "SIGTERM". folder: for a stored audit, its folder (else None). kept: for a stored audit,
            what the folder keeps, in words (else "").
    """

    def __init__(self, signal: str, folder: str | None = None, kept: str = ""):
        where = f": {folder} keeps {kept}; the same call resumes it" if folder is not None else ""
        super().__init__(f"interrupted by {signal}{where}")
        self.signal, self.folder, self.kept = signal, folder, kept

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by the signal: 128 + its number (130 for SIGINT, 143 for
        SIGTERM)."""
        import signal as _signal

        return 128 + int(getattr(_signal, self.signal))


__all__ = ["FolderLocked", "ConfigMismatch", "StorageFault", "MissingDependency", "Interrupted"]
