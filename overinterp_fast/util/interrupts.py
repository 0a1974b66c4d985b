"""Ctrl-C and SIGTERM as one exception, held back where a long loop can first save its work.

    with interrupts.caught():            # SIGINT and SIGTERM raise Interrupted (a KeyboardInterrupt)
        with interrupts.deferred():      # ... or, in here, wait for the loop to take them
            while work:
                step()
                pending = interrupts.take()
                if pending is not None:
                    save()
                    raise pending

Inside :func:`caught`, SIGINT (Ctrl-C) and SIGTERM (``kill``, ``timeout``, a batch scheduler's preemption)
raise :class:`~overinterp_fast.errors.Interrupted` naming the signal, so that ``finally`` blocks run (a lock is
released, a status written) whichever signal stopped the process: Python's default for SIGTERM ends the process
without running any. Inside :func:`deferred` the first signal is only noted, and the loop takes it at a point where
its state is whole (:func:`take`), saves, and raises it; a second signal raises at once. Handlers are installed
in the main thread only (Python delivers signals there); elsewhere both blocks change nothing. SIGKILL cannot be
caught: what survives it is what was saved before.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from ..errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    """The handlers' shared state: how many :func:`caught` blocks are open, how many :func:`deferred` ones, and
    the signal noted in one (None: none)."""

    caught = 0
    deferring = 0
    pending: Interrupted | None = None


def _handler(signum, frame) -> None:
    exc = Interrupted(signal.Signals(signum).name)
    if _State.deferring and _State.pending is None:
        _State.pending = exc  # the loop saves its state, then raises it
        return
    _State.pending = None
    raise exc


@contextmanager
def caught() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`~overinterp_fast.errors.Interrupted` inside the block (main thread only;
    the previous handlers are put back after it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        signal.signal(s, _handler)
    _State.caught += 1
    try:
        yield
    finally:
        _State.caught -= 1
        for s, h in before.items():
            signal.signal(s, h)
        if not _State.caught:
            _State.pending = None


@contextmanager
def deferred() -> Iterator[None]:
    """Inside :func:`caught`: the block's first signal is noted for :func:`take` instead of raised (a second one
    raises at once). A signal noted and not taken is raised when the block ends."""
    if not _State.caught or threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.deferring += 1
    try:
        yield
    finally:
        _State.deferring -= 1
    if not _State.deferring:
        left = take()
        if left is not None:
            raise left


def take() -> Interrupted | None:
    """The signal noted inside :func:`deferred` (cleared), or None."""
    exc, _State.pending = _State.pending, None
    return exc


__all__ = ["Interrupted", "SIGNALS", "caught", "deferred", "take"]
