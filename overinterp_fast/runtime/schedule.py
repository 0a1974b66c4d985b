"""Host-side schedule that packs candidates of many images into full batches.

Every image has at most one backward-selection step in flight. A step of image i
with r features present is a segment of r candidate slots (i, j), j < r: slot j
masks ``remaining[i, j]``. Segments wait in one FIFO queue; each batch takes the
next ``batch_size`` slots, splitting a segment across batches when needed. When
a batch holds the last slot of a step, that image's next step is queued behind
everything else. Candidate counts are known on the host (a step with r features
has r candidates), so the schedule needs no device synchronisation and depends
only on the counts and the batch size: it is deterministic.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Segment:
    image: int
    start: int  # first slot
    stop: int  # one past the last slot
    tag: int  # what the slots are (e.g. a step or a score evaluation); returned on completion


@dataclass
class Batch:
    image: np.ndarray  # int64 [B]
    slot: np.ndarray  # int64 [B]
    completed: list[tuple[int, int]]  # (image, tag) of the segments whose last slot is in this batch

    def __len__(self) -> int:
        return int(self.image.shape[0])


class CandidateQueue:
    """FIFO of segments. With ``images`` and ``slots``, every segment pushed must lie in [0, images) x [0, slots):
    the indices the batches carry are checked here, where they are made, so the ops that read them need not."""

    def __init__(self, images: int | None = None, slots: int | None = None) -> None:
        self._queue: deque[Segment] = deque()
        self._images, self._slots = images, slots

    def push(self, image: int, start: int, stop: int, tag: int) -> None:
        if stop <= start:
            raise ValueError("a segment needs at least one slot")
        if self._images is not None and not 0 <= image < self._images:
            raise IndexError(f"image {image} out of range [0, {self._images})")
        if self._slots is not None and not (0 <= start and stop <= self._slots):
            raise IndexError(f"slots [{start}, {stop}) out of range [0, {self._slots})")
        self._queue.append(Segment(image, start, stop, tag))

    def __bool__(self) -> bool:
        return bool(self._queue)

    def pending(self) -> int:
        return sum(s.stop - s.start for s in self._queue)

    def take(self, batch_size: int) -> Batch:
        images, slots, completed = [], [], []
        room = batch_size
        while room > 0 and self._queue:
            seg = self._queue[0]
            n = min(room, seg.stop - seg.start)
            images.append(np.full(n, seg.image, dtype=np.int64))
            slots.append(np.arange(seg.start, seg.start + n, dtype=np.int64))
            room -= n
            if seg.start + n == seg.stop:
                self._queue.popleft()
                completed.append((seg.image, seg.tag))
            else:
                seg.start += n
        if not images:
            return Batch(np.zeros(0, np.int64), np.zeros(0, np.int64), [])
        return Batch(np.concatenate(images), np.concatenate(slots), completed)


def upload(device: torch.device, *parts) -> tuple[torch.Tensor, ...]:
    """Host index lists or arrays -> int64 [len(part)] tensors on ``device``, in one transfer.

    The batch loops build their index lists on the host at every step. A copy from pageable host memory to a
    GPU makes the host wait until every kernel queued before it has run, so one copy per list stalled each
    step several times (seen on an H100: exact SIS ran 3.5-10.5x slower than its bare forward passes).
    Here all parts travel in one pinned, non-blocking copy on the current stream, which orders it before
    the kernels that read it; the caching host allocator keeps the pinned block until the copy is done. On
    the CPU the parts are views of one new tensor.
    """
    arrays = [np.asarray(part, dtype=np.int64).reshape(-1) for part in parts]
    flat = torch.from_numpy(np.concatenate(arrays)) if arrays else torch.zeros(0, dtype=torch.int64)
    if device.type == "cuda":
        flat = flat.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        flat = flat.to(device)
    return torch.split(flat, [a.size for a in arrays])
