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

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Batch:
    """The candidate slots of one batch: ``image``, ``slot`` and the tag of each slot's segment, ``tag`` (int64 [B]),
    and the segments whose last slot it holds, in queue order: their images ``done_image`` and tags ``done_tag``
    (int64 [D])."""

    image: np.ndarray
    slot: np.ndarray
    done_image: np.ndarray
    done_tag: np.ndarray
    tag: np.ndarray

    def __len__(self) -> int:
        return int(self.image.shape[0])

    @property
    def completed(self) -> list[tuple[int, int]]:
        """(image, tag) of the completed segments, as host ints."""
        return list(zip(self.done_image.tolist(), self.done_tag.tolist()))


_EMPTY = np.zeros(0, np.int64)


class CandidateQueue:
    """FIFO of segments, kept as arrays: a batch is taken, and the next steps of many images are queued, with a
    few numpy operations whatever the number of images. With ``images`` and ``slots``, every segment pushed must
    lie in [0, images) x [0, slots): the indices the batches carry are checked here, where they are made, so the
    ops that read them need not."""

    def __init__(self, images: int | None = None, slots: int | None = None, capacity: int = 64) -> None:
        self._images, self._slots = images, slots
        self._seg = np.zeros((4, max(1, capacity)), np.int64)  # rows: image, start, stop, tag
        self._head = self._tail = 0

    def push(self, image: int, start: int, stop: int, tag: int) -> None:
        """Queue slots [start, stop) of ``image``, tagged ``tag``."""
        self.push_many([image], [start], [stop], [tag])

    def push_many(self, images, starts, stops, tags) -> None:
        """Queue one segment per entry, in order: int64 [S] each (arrays, lists or scalars that broadcast)."""
        image = np.asarray(images, np.int64).reshape(-1)
        seg = np.empty((4, image.size), np.int64)
        seg[0] = image
        seg[1], seg[2], seg[3] = starts, stops, tags
        if not image.size:
            return
        if (seg[2] <= seg[1]).any():
            raise ValueError("a segment needs at least one slot")
        if self._images is not None and (image.min() < 0 or image.max() >= self._images):
            bad = int(image[(image < 0) | (image >= self._images)][0])
            raise IndexError(f"image {bad} out of range [0, {self._images})")
        if self._slots is not None and (seg[1].min() < 0 or seg[2].max() > self._slots):
            k = int(np.flatnonzero((seg[1] < 0) | (seg[2] > self._slots))[0])
            raise IndexError(f"slots [{seg[1, k]}, {seg[2, k]}) out of range [0, {self._slots})")
        self._reserve(image.size)
        self._seg[:, self._tail: self._tail + image.size] = seg
        self._tail += image.size

    def _reserve(self, n: int) -> None:
        """Room for n more segments at the tail: slide the live ones to the front, or grow."""
        cap = self._seg.shape[1]
        if self._tail + n <= cap:
            return
        live = self._tail - self._head
        if live + n > cap // 2:
            grown = np.zeros((4, max(2 * cap, 2 * (live + n))), np.int64)
            grown[:, :live] = self._seg[:, self._head: self._tail]
            self._seg = grown
        else:
            self._seg[:, :live] = self._seg[:, self._head: self._tail]
        self._head, self._tail = 0, live

    def __bool__(self) -> bool:
        return self._tail > self._head

    def segments(self) -> np.ndarray:
        """The queued segments, int64 [4, S] (image, start, stop, tag) in order (a view: copy to keep)."""
        return self._seg[:, self._head: self._tail]

    def replace(self, segments: np.ndarray) -> None:
        """Queue exactly ``segments`` (int64 [4, S], as :meth:`segments` gives them), in order: what is left after
        a window of batches was taken elsewhere (ops.schedule_window)."""
        self._head = self._tail = 0
        self.push_many(*segments)

    def pending(self) -> int:
        seg = self._seg[:, self._head: self._tail]
        return int((seg[2] - seg[1]).sum())

    def take(self, batch_size: int) -> Batch:
        """The next ``batch_size`` slots (fewer when fewer are queued), splitting the last segment if needed."""
        h = self._head
        m = min(self._tail - h, max(batch_size, 0))  # every segment has a slot: at most batch_size are touched
        if m == 0:
            return Batch(_EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
        image0, start0, stop0, tag0 = self._seg[:, h].tolist()
        if stop0 - start0 >= batch_size or m == 1:  # the first segment alone fills the batch (or is all there is)
            taken = min(batch_size, stop0 - start0)
            slot = np.arange(start0, start0 + taken, dtype=np.int64)
            image = np.full(taken, image0, np.int64)
            tags = np.full(taken, tag0, np.int64)
            if taken < stop0 - start0:  # it goes on in the next batch
                self._seg[1, h] += taken
                return Batch(image, slot, _EMPTY, _EMPTY, tags)
            self._head = h + 1
            if self._head == self._tail:
                self._head = self._tail = 0
            return Batch(image, slot, np.array([image0], np.int64), np.array([tag0], np.int64), tags)
        image, start, stop, tag = self._seg[:, h: h + m]
        size = stop - start
        ends = np.cumsum(size)
        k = min(int(np.searchsorted(ends, batch_size)), m - 1)  # the last segment touched
        lens = size[: k + 1].copy()
        taken = min(batch_size, int(ends[k]))
        lens[k] -= int(ends[k]) - taken
        done = k + 1 if lens[k] == size[k] else k
        first = np.repeat(start[: k + 1] - (np.cumsum(lens) - lens), lens)
        slot = np.arange(taken, dtype=np.int64) + first
        batch = Batch(np.repeat(image[: k + 1], lens), slot, image[:done].copy(), tag[:done].copy(),
                      np.repeat(tag[: k + 1], lens))
        if done == k:  # the last segment goes on in the next batch
            self._seg[1, h + k] += lens[k]
        self._head = h + done
        if self._head == self._tail:
            self._head = self._tail = 0
        return batch


def upload(device: torch.device, *parts) -> tuple[torch.Tensor, ...]:
    """Host index lists or arrays -> int64 [len(part)] tensors on ``device``, in one transfer.

    The batch loops build their index lists on the host at every step. A copy from pageable host memory to a
    GPU makes the host wait until every kernel queued before it has run, so one copy per list stalled each
    step several times (seen on an H100: exact SIS ran 3.5-10.5x slower than its bare forward passes).
    Here all parts travel in one pinned, non-blocking copy on the current stream, which orders it before
    the kernels that read it; the caching host allocator keeps the pinned block until the copy is done. On
    the CPU each part is a tensor of its own (a copy: the caller may change its arrays afterwards).
    """
    if device.type == "cpu":  # nothing to transfer: each part becomes a tensor over a copy of its own
        return tuple(torch.from_numpy(np.array(part.numpy() if torch.is_tensor(part) else part,
                                                dtype=np.int64).reshape(-1)) for part in parts)
    arrays = [np.asarray(part, dtype=np.int64).reshape(-1) for part in parts]
    sizes = [a.size for a in arrays]
    if device.type == "cuda":  # written straight into pinned memory (the caching host allocator's)
        host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)
        if arrays:
            np.concatenate(arrays, out=host.numpy())
        flat = host.to(device, non_blocking=True)
    else:
        flat = torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros(0, np.int64)).to(device)
    return torch.split(flat, sizes)

