"""What a run decided and why: its info, one line per decision, kept with its results.

A speed path that cannot apply to a model steps aside without a warning (a TorchScript module's weights cannot be
swapped for channels_last copies; a model torch.fx cannot trace gets no incremental inference), and says so here::

    with collecting() as info:            # the public entry points open one per run
        results = run(...)                # deep down: note("channels_last", "off: a TorchScript module ...")
    info  # {"channels_last": "off: a TorchScript module, whose weights cannot be swapped for laid-out copies"}

:attr:`~overinterp_fast.SISResult.info` (and ``ResponsibilityMap.info``) hold the run's info. Outside a
``collecting`` block, :func:`note` only logs (at DEBUG).
"""
from __future__ import annotations

import contextlib
import logging
from contextvars import ContextVar
from typing import Iterator

logger = logging.getLogger(__name__)
_CURRENT: ContextVar[dict[str, str] | None] = ContextVar("overinterp_fast_run_info", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, str]]:
    """The info of the run inside the block: {decision: one line}. A block inside another (a run split into
    parts) adds to the outer one's info."""
    outer = _CURRENT.get()
    info: dict[str, str] = {} if outer is None else outer
    token = _CURRENT.set(info)
    try:
        yield info
    finally:
        _CURRENT.reset(token)


def note(key: str, text: str) -> None:
    """Record a decision of the current run (``key``: what was decided, e.g. "channels_last"; ``text``: one line,
    the choice and why). Logged at DEBUG as well."""
    logger.debug("%s: %s", key, text)
    info = _CURRENT.get()
    if info is not None:
        info[key] = text
