"""The exact SIS step loop's schedule windows and its fused step.

The schedule of a round needs no device value: a step of an image with r features present has r candidates, so
which slots every batch holds, and which steps it completes, follow from the candidate counts and the batch size
alone. :class:`StepSchedule` makes the schedule of many batches at once on the host (``ops.schedule_window``: one
compiled call per window), and :class:`DenseStep` runs each batch as three ops around the model's forward pass:
``exact_candidates`` writes the batch's candidates into a buffer of the batch's shape, the model scores them, and
``exact_scores`` writes the scores and finishes the steps the batch completes (``backselect_update``'s step). On a
CUDA device the whole step of each batch shape is one CUDA graph: the host copies the batch's schedule block into the
graph's input and replays it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ..ops import kernels as _ops
from ..runtime import graphs
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn
from ..runtime.schedule import CandidateQueue, upload

STEP, SCORE, LOW = 0, 1, 2  # segment tags: a full-dtype step, the score of a round's input, a low-precision step
BLOCK_ROWS = 6  # rows of a batch's schedule block: image, slot, done row, done count, done step, tag
WINDOW_SLOTS = 1 << 18  # a window's blocks hold at most about this many rows (6 int64 each: 12 MB)


@dataclass
class Window:
    """The schedule of consecutive batches of the exact SIS step loop (``ops.schedule_window``).

    ``records`` (int64, CPU): each batch's block [6, Bp] one after the other: row 0 the images of its candidates,
    row 1 their slots (image * stride + j; -1 for the padding rows up to the batch shape Bp), rows 2-4 the steps it
    completes (row, candidate count, step index; row -1 past them), row 5 each candidate's segment tag.
    ``batches`` int64 [W, 5]: (offset of the block in records, Bp, candidates, first completion, completions).
    ``done`` int64 [D, 5]: (batch, image, tag, count, step before it) of each completed segment, in queue order.
    """

    records: torch.Tensor
    batches: np.ndarray
    done: np.ndarray

    def __len__(self) -> int:
        return int(self.batches.shape[0])

    def blocks(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per batch (its block [6, Bp], the view [3, d] of the steps it completes) on ``device``, after one upload
        of the whole window."""
        (records,) = upload(device, self.records) if device.type != "cpu" else (self.records,)
        out = []
        for offset, bp, _, _, d in self.batches.tolist():
            block = records[offset: offset + BLOCK_ROWS * bp].view(BLOCK_ROWS, bp)
            out.append((block, block[2:5, :d]))
        return out

    def batch(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Batch k on the host: (image, slot as flat indices, tag) of its candidates (int64 [n], no padding) and
        its completed segments (int64 [D, 5] rows of ``done``)."""
        offset, bp, n, d0, dn = self.batches[k].tolist()
        block = self.records[offset: offset + BLOCK_ROWS * bp].view(BLOCK_ROWS, bp).numpy()
        return block[0, :n], block[1, :n], block[5, :n], self.done[d0: d0 + dn]

    def ended(self) -> np.ndarray:
        """Images whose round ended in this window (a step completed with one candidate), in completion order."""
        d = self.done
        return d[(d[:, 2] != SCORE) & (d[:, 3] == 1), 1]

    def scored(self) -> np.ndarray:
        """Images whose new round's input was scored in this window, in completion order."""
        d = self.done
        return d[d[:, 2] == SCORE, 1]


class StepSchedule:
    """The exact SIS step loop's queue, and each image's candidate count and step index (host arrays shared with
    the loop's bookkeeping), advanced a window of batches at a time by ``ops.schedule_window``.

    Args:
        count, step: int64 [N] arrays, updated in place as windows are taken.
        full: bool [N] (low precision: the images whose steps run in the full dtype).
        stride: slots per image (p + 1).
        sizes: the batch shapes, ascending (a batch is padded to the smallest that holds it); empty: no padding.
    """

    def __init__(self, count: np.ndarray, step: np.ndarray, full: np.ndarray, stride: int, sizes=()):
        n = count.shape[0]
        self.queue = CandidateQueue(images=n, slots=stride, capacity=n)
        self.count, self.step, self.full = count, step, full
        self._tensors = tuple(torch.from_numpy(a) for a in (count, step, full))  # the same memory
        self.stride = stride
        self.sizes = torch.tensor(sorted(sizes), dtype=torch.int64, device="cpu")

    def __bool__(self) -> bool:
        return bool(self.queue)

    def window(self, batch_size: int, *, rescore: int = 0, stop_at_round_end: bool = False,
               max_batches: int | None = None) -> Window:
        """The next batches: until a round's input is scored (or, with ``stop_at_round_end``, a round ends), the
        queue runs dry, or ``max_batches`` (default: about WINDOW_SLOTS rows)."""
        if max_batches is None:
            max_batches = max(1, WINDOW_SLOTS // max(1, batch_size))
        segs = torch.from_numpy(np.ascontiguousarray(self.queue.segments()))
        records, batches, done, left = _ops.schedule_window(
            segs, *self._tensors, self.sizes, batch_size, self.stride, rescore, stop_at_round_end, max_batches)
        self.queue.replace(left.numpy())
        return Window(records, batches.numpy(), done.numpy())


@dataclass
class StepTables:
    """The exact loop's device state a step reads and writes (see methods/exact.py's ``_ExactRun``): per image the
    compact list of present features ``remaining`` int64 [N, p + 1], ``present`` bool [N, p], ``order`` int64 [N, p],
    ``values`` float64 [N, p], the step's ``scores`` float64 [N, p + 1], and ``total`` float64 [] (NaN once a score
    was not finite)."""

    remaining: torch.Tensor
    present: torch.Tensor
    order: torch.Tensor
    values: torch.Tensor
    scores: torch.Tensor
    total: torch.Tensor

    @classmethod
    def new(cls, like: torch.Tensor, n: int, p: int) -> "StepTables":
        """Tables for n images of p features on ``like``'s device, every feature present (:meth:`reset`)."""
        t = cls(like.new_empty((n, p + 1), dtype=torch.int64), like.new_empty((n, p), dtype=torch.bool),
                like.new_empty((n, p), dtype=torch.int64), like.new_empty((n, p), dtype=torch.float64),
                like.new_empty((n, p + 1), dtype=torch.float64), like.new_empty((), dtype=torch.float64))
        t.reset()
        return t

    def reset(self) -> None:
        """Every feature present (in id order in ``remaining``, -1 past them and in column p), nothing masked yet,
        in place: a job reusing the tables of an earlier one (and the CUDA graphs that read them)."""
        p = self.present.shape[1]
        self.remaining.fill_(-1)
        self.remaining[:, :p] = torch.arange(p, device=self.remaining.device)
        self.present.fill_(True)
        self.order.fill_(-1)
        self.values.zero_()
        self.scores.zero_()
        self.total.zero_()


class DenseStep:
    """One batch of the step loop on the dense path: ``exact_candidates``, the model, its probabilities and
    ``exact_scores``; on CUDA, each batch shape's step one captured graph
    (:class:`~overinterp_fast.runtime.graphs.GraphedStep`: its first calls run eagerly, the next is captured and
    checked against an eager step from the same state, the later ones replay; a capture that fails runs every step
    eagerly from then on, with one logged line).

    The step reads the job's images, baseline, feature map and targets from buffers of its own, and the job's state
    from its :class:`StepTables`: a later job of the same model and shapes takes the same object (:meth:`for_job`),
    copies its inputs into the buffers, and replays the graphs captured before (the first job of a shape pays the
    warm-up and capture, the later ones none).

    Args:
        fn: the model (its forward pass runs on the batch's fixed shape: the schedule pads to ``fn.pad_to``'s
            sizes).
        prep: the images, baseline and feature map.
        use_graphs: capture each batch shape's step as a CUDA graph (CUDA only; default: runtime.graphs.enabled()).

    Attributes:
        t: the job's state. path: "cuda-graph" once a captured step replayed, else "fused".
        memo: whether ``exact_candidates`` keeps its row memo (the CPU, inputs of at least MEMO_MIN_ELEMS
            elements): ``held`` int64 [3, rows] per batch shape, ``snap`` bool [N, p] and ``version`` int64 [N]
            (see ``ops.exact_candidates``); rows that hold their image's candidate are patched, not rewritten.
    """

    def __init__(self, fn: ModelFn, prep: Prepared, use_graphs: bool | None = None):
        self.fn = fn
        images = prep.images
        dev = images.device
        n, p = images.shape[0], prep.num_features
        # the job's inputs, copied in by load(): the captured steps read them here
        self.images = torch.empty_like(images, memory_format=_ops_format(images))
        self.baseline = torch.empty_like(prep.baseline, memory_format=_ops_format(prep.baseline))
        self.feature_map = torch.empty_like(prep.feature_map)
        self.targets = images.new_empty((n,), dtype=torch.int64)
        self.t = StepTables.new(images, n, p)
        self.family = graphs.StepGraphs(dev)
        if use_graphs is not None:
            self.family.on = dev.type == "cuda" and use_graphs
        self.buffers: dict[int, torch.Tensor] = {}
        # On the CPU, the row memo of exact_candidates (ops.exact_candidates): per buffer what each row holds, per
        # image its snapshot. A batch whose rows line up with the buffer's previous batch (one image's consecutive
        # steps) is patched where the present features changed, not rewritten.
        self.memo = dev.type == "cpu" and images[0].numel() >= MEMO_MIN_ELEMS
        self.held: dict[int, torch.Tensor] = {}
        self.snap = torch.zeros((n, p), dtype=torch.bool) if self.memo else None
        self.version = torch.zeros((n,), dtype=torch.int64) if self.memo else None
        self.steps: dict[int, tuple[graphs.GraphedStep, torch.Tensor]] = {}  # per batch shape: its step, its input
        # the ops' implementations, chosen once (not looked up per call)
        self._candidates = _ops.implementation("exact_candidates", dev)
        self._scores = _ops.implementation("exact_scores", dev)
        self._checked: set[int] = set()  # batch shapes whose model output was checked
        self._key: tuple | None = None

    @classmethod
    def for_job(cls, fn: ModelFn, prep: Prepared, targets: torch.Tensor, sizes=()) -> "DenseStep":
        """The dense step of a job, its inputs loaded and its tables reset: one kept from an earlier job of the same
        model (its tensors where they were), the same images' shape, dtype, device and layout, baseline shape,
        features and batch shapes, or a new one. Give it back with :meth:`release` when the job ends (a job
        running meanwhile on another thread makes its own)."""
        key = _job_key(fn, prep, sizes)
        step = None
        try:
            kept = _kept.get(fn.model)
        except TypeError:  # a model that cannot be weakly referenced: a step for this job only
            kept, key = None, None
        if kept is not None and key is not None:
            step = kept.pop(key, None)
        if step is None:
            step = cls(fn, prep)
        step.fn, step._key = fn, key
        step.load(prep, targets)
        return step

    def load(self, prep: Prepared, targets: torch.Tensor) -> None:
        """Copy the job's inputs into the step's buffers and reset its tables."""
        self.images.copy_(prep.images)
        self.baseline.copy_(prep.baseline)
        self.feature_map.copy_(prep.feature_map)
        self.targets.copy_(targets)
        self.t.reset()
        for held in self.held.values():  # new images: no row holds a candidate of them
            held[0].fill_(-1)

    def release(self) -> None:
        """Keep this step (its buffers, tables and graphs) for the model's next job of the same shapes."""
        if self._key is None:
            return
        try:
            kept = _kept.setdefault(self.fn.model, {})
        except TypeError:
            return
        kept[self._key] = self
        while len(kept) > KEPT_PER_MODEL:  # the oldest shapes go first
            kept.pop(next(iter(kept)))

    @property
    def path(self) -> str:
        return "cuda-graph" if self.family.replays else "fused"

    def buffer(self, rows: int) -> torch.Tensor:
        """The candidates' buffer of a batch shape, [rows, *D] in the images' memory format (kept: written anew by
        every batch of that shape)."""
        out = self.buffers.get(rows)
        if out is None:
            images = self.images
            with torch.inference_mode(False):  # a normal tensor: its version counter shows a model's writes
                out = self.buffers[rows] = torch.empty((rows, *images.shape[1:]), dtype=images.dtype,
                                                       device=images.device).contiguous(
                    memory_format=_ops_format(images))
            if self.memo:
                self.held[rows] = torch.full((3, rows), -1, dtype=torch.int64)
        return out

    def eager(self, block: torch.Tensor, done: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The step of one batch (its block [6, Bp] and completed steps [3, d]); returns the model's output.

        The batch is already padded to its shape, so the model is called as it is (``fn.run``), after a first call
        of each shape through ``fn.forward`` (its output checked for shape, dtype and device)."""
        t, fn = self.t, self.fn
        rows = out.shape[0]
        held = self.held.get(rows) if self.memo else None
        memo = () if held is None else (held, self.snap, self.version)
        self._candidates(self.images, self.baseline, self.feature_map, t.present, t.remaining, block, out, False,
                         *memo)
        written = out._version
        if rows in self._checked:
            y = fn.run(out)
        else:  # the first call of a shape: ModelFn.forward's checks and its errors (e.g. a fixed-batch export)
            y = fn.forward(out)
            self._checked.add(rows)
        if held is not None and out._version != written:  # the model wrote into its input: rewrite every row
            held[0].fill_(-1)
        self._scores(fn.probabilities(y), self.targets, block, done, t.scores, t.total, t.remaining, t.present,
                     t.order, t.values, False)
        return y

    def __call__(self, block: torch.Tensor, done: torch.Tensor) -> None:
        bp = block.shape[1]
        if not self.family.on:
            self.eager(block, done, self.buffer(bp))
            return
        g = self.steps.get(bp)
        if g is None:  # the shape's step reads its block from a buffer of its own: the graph's input
            static, out, t = torch.empty_like(block), self.buffer(bp), self.t
            step = self.family.step(lambda: self.eager(static, static[2:5], out),
                                    [out, t.scores, t.total, t.remaining, t.present, t.order, t.values])
            g = self.steps[bp] = (step, static)
        g[1].copy_(block)  # the block, its completed steps padded with row -1 up to Bp
        g[0]()


# Inputs of fewer elements are rewritten whole: patching a row costs about as much as copying this many elements
MEMO_MIN_ELEMS = 256
KEPT_PER_MODEL = 2  # a model's dense steps kept between jobs (the most recent shapes)
_kept: "weakref.WeakKeyDictionary[object, dict[tuple, DenseStep]]" = weakref.WeakKeyDictionary()


def _job_key(fn: ModelFn, prep: Prepared, sizes) -> tuple:
    """What a kept dense step depends on: the images' shape, dtype, device and layout, the baseline's shape, the
    features, the batch shapes, the model's outputs kind, where its tensors are (its graphs read them there), and
    whether graphs are on."""
    images = prep.images
    return (tuple(images.shape), images.dtype, images.device, _ops_format(images), tuple(prep.baseline.shape),
            prep.num_features, tuple(sizes), fn.outputs, graphs._where(fn.model), graphs.enabled())


def _ops_format(images: torch.Tensor) -> torch.memory_format:
    """The memory format the candidate ops write in: the images' own (channels_last kept)."""
    from ..ops.pure import is_channels_last

    return torch.channels_last if is_channels_last(images) else torch.contiguous_format
