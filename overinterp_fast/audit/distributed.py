"""Ranks of a torchrun job (or a single process): who runs which chunks, on which device, and barriers.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK. With more than one process the group uses the
gloo backend for its barriers only (no tensors are exchanged: every rank writes its own parts to
the shared output folder; rank 0 tells the others whether it got the folder's lock), so CPU ranks and GPU ranks coordinate alike; each GPU rank computes on
cuda:LOCAL_RANK.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import datetime
import os
from dataclasses import dataclass

import torch

BARRIER_TIMEOUT = datetime.timedelta(days=7)  # ranks wait for the slowest one at the end of an audit


@dataclass
class Ranks:
    """This process's place in the job: rank, world size, local rank, and the device it computes on."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``device`` as a torch.device; "auto": "cuda" when a CUDA GPU is available, else "cpu"."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def setup(device: str | torch.device = "auto") -> Ranks:
    """Join the torchrun job described by the environment (a one-process job without it).

    ``device``: "auto" (:func:`resolve_device`), "cpu" or "cuda"; with several ranks "cuda" means
    cuda:LOCAL_RANK."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local if world > 1 else torch.cuda.current_device())
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
        owns = True
    return Ranks(rank, world, local, dev, owns)


def barrier(ranks: Ranks) -> None:
    import torch.distributed as dist

    if ranks.world > 1 and dist.is_initialized():
        dist.barrier()


def from_main(ranks: Ranks, value):
    """Rank 0's ``value`` on every rank (a broadcast over the job's group; ``value`` itself without one)."""
    import torch.distributed as dist

    if ranks.world > 1 and dist.is_initialized():
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return value


def teardown(ranks: Ranks) -> None:
    import torch.distributed as dist

    if ranks.owns_group and dist.is_initialized():
        dist.destroy_process_group()
