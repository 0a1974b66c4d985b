"""torch's CPU threads for the length of a run (the command line's ``--threads``)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def check_threads(threads: int | None) -> int | None:
    """``threads`` when it is None or a positive int; else a one-line ValueError naming it."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    return threads


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)`` (None: as it is), and restore the count after.

    Each process sets its own: under torchrun, every rank that runs the block (which sets OMP_NUM_THREADS=1 for
    its processes unless told otherwise) computes with ``threads`` threads."""
    check_threads(threads)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
