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
from ..runtime import graphs, model_state
from ..runtime.batching import power_of_two_ceil
from ..runtime.inputs import Prepared
from ..runtime.model import ModelFn, is_onnx
from ..runtime.schedule import CandidateQueue, upload

STEP, SCORE, LOW = 0, 1, 2  # segment tags: a full-dtype step, the score of a round's input, a low-precision step
BLOCK_ROWS = 6  # rows of a batch's schedule block: image, slot, done row, done count, done step, tag
WINDOW_SLOTS = 1 << 18  # a window's blocks hold at most about this many rows (6 int64 each: 12 MB)


def window_batches(batch_size: int) -> int:
    """Batches of ``batch_size`` rows in a window of about :data:`WINDOW_SLOTS` rows (at least one)."""
    return max(1, WINDOW_SLOTS // max(1, batch_size))


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
            max_batches = window_batches(batch_size)
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

    def head(self, n: int) -> "StepTables":
        """The tables of the first n images (views of the same memory; ``total`` shared)."""
        return StepTables(self.remaining[:n], self.present[:n], self.order[:n], self.values[:n], self.scores[:n],
                          self.total)

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
    eagerly from then on, with one logged line). The captured step calls the model itself, never a graph of its
    forward pass: one graph per shape. An ONNX Runtime model is never captured (its session waits for the host).

    The step reads the job's images, baseline, feature map and targets from buffers of its own, sized for
    ``capacity`` images, and the job's state from its :class:`StepTables` (the first N rows of each are the job's,
    :attr:`t`): a later job of the same model, image shape and batch shapes with at most ``capacity`` images takes
    the same object (:meth:`for_job`), copies its inputs into the buffers, and replays the graphs captured before
    (the first job of a shape pays the warm-up and capture, the later ones none). The kept step holds no reference
    to the model: :meth:`release` drops it, :meth:`for_job` gives it the next job's.

    Args:
        fn: the model (its forward pass runs on the batch's fixed shape: the schedule pads to ``fn.pad_to``'s
            sizes).
        prep: the images, baseline and feature map.
        capacity: images the buffers hold (at least the job's N).
        use_graphs: capture each batch shape's step as a CUDA graph (CUDA only; default: runtime.graphs.enabled()).

    Attributes:
        t: the job's state (views of the first N rows of ``tables``). path: "cuda-graph" once a captured step
            replayed, else "fused". family: the steps' :class:`~overinterp_fast.runtime.graphs.StepGraphs` (its
            ``captures`` and ``replays`` count over every job the step served; on a CPU, those a GPU would make).
        memo: whether ``exact_candidates`` keeps its row memo (the CPU, inputs of at least MEMO_MIN_ELEMS
            elements): ``held`` int64 [3, rows] per batch shape, ``snap`` bool [capacity, p] and ``version`` int64
            [capacity] (see ``ops.exact_candidates``); rows that hold their image's candidate are patched, not
            rewritten.
    """

    def __init__(self, fn: ModelFn, prep: Prepared, capacity: int | None = None, use_graphs: bool | None = None):
        self.fn: ModelFn | None = fn
        images = prep.images
        dev = images.device
        n, p = images.shape[0], prep.num_features
        cap = self.capacity = max(n, capacity or n)
        # the job's inputs, copied in by load(): the captured steps read them here
        fmt = _ops_format(images)
        self.images = torch.empty((cap, *images.shape[1:]), dtype=images.dtype, device=dev)
        self.images = self.images.contiguous(memory_format=fmt)
        base = prep.baseline
        self.baseline = torch.empty((cap if base.shape[0] > 1 else 1, *base.shape[1:]), dtype=base.dtype, device=dev)
        self.baseline = self.baseline.contiguous(memory_format=_ops_format(base))
        self.feature_map = torch.empty_like(prep.feature_map)
        self.targets = images.new_empty((cap,), dtype=torch.int64)
        self.tables = StepTables.new(images, cap, p)
        self.t = self.tables
        self.family = graphs.StepGraphs(dev)
        if use_graphs is not None:
            self.family.on = dev.type == "cuda" and use_graphs
        if is_onnx(fn.model):  # ONNX Runtime waits for the host inside a run: never captured
            self.family.on = self.family.counting = False
        self.buffers: dict[int, torch.Tensor] = {}
        # On the CPU, the row memo of exact_candidates (ops.exact_candidates): per buffer what each row holds, per
        # image its snapshot. A batch whose rows line up with the buffer's previous batch (one image's consecutive
        # steps) is patched where the present features changed, not rewritten.
        self.memo = dev.type == "cpu" and images[0].numel() >= MEMO_MIN_ELEMS
        self.held: dict[int, torch.Tensor] = {}
        self.snap = torch.zeros((cap, p), dtype=torch.bool) if self.memo else None
        self.version = torch.zeros((cap,), dtype=torch.int64) if self.memo else None
        self.steps: dict[int, tuple[graphs.GraphedStep, torch.Tensor]] = {}  # per batch shape: its step, its input
        # the ops' implementations, chosen once (not looked up per call)
        self._candidates = _ops.implementation("exact_candidates", dev)
        self._scores = _ops.implementation("exact_scores", dev)
        self._checked: set[int] = set()  # batch shapes whose model output was checked
        self._key: tuple | None = None
        self._state = None  # the model's state (runtime.model_state) the step goes back to, weakly

    @classmethod
    def for_job(cls, fn: ModelFn, prep: Prepared, targets: torch.Tensor, sizes=()) -> "DenseStep":
        """The dense step of a job, its inputs loaded and its tables reset: one kept in the model's state
        (runtime.model_state) from an earlier job of the same model, image shape, dtype, device and layout,
        baseline kind, features and batch shapes, with room for this job's images; else a new one, with room for
        at least MIN_CAPACITY images (so that later jobs of a few more images reuse it). Give it back with
        :meth:`release` when the job ends (a job running meanwhile on another thread makes its own)."""
        key = _job_key(fn, prep, sizes)
        n = prep.images.shape[0]
        state = model_state.state_of(fn.model)
        step = None
        if state is not None:
            step = state.pop("step", key)
            if step is not None and step.capacity < n:  # too small for this job: a larger one replaces it
                step = None
        if step is None:
            step = cls(fn, prep, capacity=power_of_two_ceil(max(n, MIN_CAPACITY)))
        step.fn, step._key = fn, key
        step._state = None if state is None else weakref.ref(state)
        step.load(prep, targets)
        return step

    def load(self, prep: Prepared, targets: torch.Tensor) -> None:
        """Copy the job's inputs into the first N rows of the step's buffers and reset its tables; :attr:`t` views
        those N rows."""
        n = prep.images.shape[0]
        self.images[:n].copy_(prep.images)
        self.baseline[:prep.baseline.shape[0]].copy_(prep.baseline)
        self.feature_map.copy_(prep.feature_map)
        self.targets[:n].copy_(targets)
        self.tables.reset()
        self.t = self.tables.head(n)
        for held in self.held.values():  # new images: no row holds a candidate of them
            held[0].fill_(-1)
        self._job = (self.family.captures, self.family.replays)

    def job_counts(self) -> tuple[int, int]:
        """(graphs captured, replays) since the job's :meth:`load` (on a CPU: those a GPU would make)."""
        return self.family.captures - self._job[0], self.family.replays - self._job[1]

    def release(self) -> None:
        """Keep this step (its buffers, tables and graphs) in the model's state for the model's next job of the same
        shapes, without the model."""
        self.fn = None  # the state must not keep the model alive
        state = None if self._state is None else self._state()
        self._state = None
        if self._key is None or state is None:
            return
        kept = state.table("step")
        kept[self._key] = self
        while len(kept) > KEPT_PER_MODEL:  # the oldest shapes go first
            kept.pop(next(iter(kept)))

    @property
    def path(self) -> str:
        return "cuda-graph" if self.family.replays and self.family.on else "fused"

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

        The batch is already padded to its shape, so the model is called as it is: the model itself where the step
        is captured (or counted, on a CPU), else ``fn.run``; the first call of each shape's output is checked for shape, dtype and device
        (``ModelFn.forward``'s checks and its errors, e.g. a fixed-batch export)."""
        t, fn = self.tables, self.fn
        rows = out.shape[0]
        held = self.held.get(rows) if self.memo else None
        memo = () if held is None else (held, self.snap, self.version)
        self._candidates(self.images, self.baseline, self.feature_map, t.present, t.remaining, block, out, False,
                         *memo)
        written = out._version
        # the step's own graph, or its stand-in on a CPU, calls the model itself: never a graph of its forward pass
        run = fn.model if self.family.on or self.family.counting else fn.run
        if rows in self._checked:
            y = run(out)
        else:
            y = fn.checked(run, out)
            self._checked.add(rows)
        if held is not None and out._version != written:  # the model wrote into its input: rewrite every row
            held[0].fill_(-1)
        self._scores(fn.probabilities(y), self.targets, block, done, t.scores, t.total, t.remaining, t.present,
                     t.order, t.values, False)
        return y

    def _step(self, bp: int) -> tuple[graphs.GraphedStep, torch.Tensor]:
        """The step of batch shape ``bp`` and its input block (the graph's input), made at its first use."""
        g = self.steps.get(bp)
        if g is None:  # the shape's step reads its block from a buffer of its own: the graph's input
            static, out, t = self.images.new_empty((BLOCK_ROWS, bp), dtype=torch.int64), self.buffer(bp), self.tables
            step = self.family.step(lambda: self.eager(static, static[2:5], out),
                                    [out, t.scores, t.total, t.remaining, t.present, t.order, t.values])
            g = self.steps[bp] = (step, static)
        return g

    def prime(self, sizes) -> None:
        """Capture the step of every batch shape in ``sizes`` now (on a CPU, count the captures a GPU would make),
        so that a later job of the model and image shape captures none, whichever shapes it meets. Each is warmed
        up with a batch of padding rows (the first image's current input, no candidate, no step completed: its
        state stays as it is) and checked at its first real batch (:meth:`GraphedStep.prime`)."""
        if not (self.family.on or self.family.counting):
            return
        for bp in sizes:
            step, static = self._step(bp)
            if step.calls or step.graph is not None:
                continue
            static.copy_(_padding_block(bp, static.device))
            step.prime(lambda: self.eager(static, static[2:5], self.buffer(bp)))

    def __call__(self, block: torch.Tensor, done: torch.Tensor) -> None:
        bp = block.shape[1]
        if not (self.family.on or self.family.counting):
            self.eager(block, done, self.buffer(bp))
            return
        step, static = self._step(bp)
        static.copy_(block)  # the block, its completed steps padded with row -1 up to Bp
        step()


def _padding_block(bp: int, device: torch.device) -> torch.Tensor:
    """A schedule block [6, Bp] of padding rows only (as ops.schedule_window pads a batch): image 0, no slot, no
    step completed (row -1, count 1, step 0), no tag. Its step writes the image's current input into every row,
    runs the model and changes no state."""
    block = torch.tensor([[0], [-1], [-1], [1], [0], [-1]], dtype=torch.int64).expand(BLOCK_ROWS, bp)
    return block.contiguous().to(device)


# Inputs of fewer elements are rewritten whole: patching a row costs about as much as copying this many elements
MEMO_MIN_ELEMS = 256
KEPT_PER_MODEL = 2  # a model's dense steps kept between jobs (the most recent shapes)
MIN_CAPACITY = 16  # images a new dense step has room for, at least (then powers of two)


def _job_key(fn: ModelFn, prep: Prepared, sizes) -> tuple:
    """What a kept dense step depends on besides the model (whose tensors' addresses, weights, modes and the
    autocast state its state's stamp covers, runtime.model_state): the shape of one image, the images' dtype,
    device and layout, whether the baseline is per image and its shape, the features, the batch shapes, the
    model's outputs kind, and whether graphs are on. Not the number of images: a step has room for several."""
    images, base = prep.images, prep.baseline
    return (tuple(images.shape[1:]), images.dtype, images.device, _ops_format(images), base.shape[0] > 1,
            tuple(base.shape[1:]), _ops_format(base), prep.num_features, tuple(sizes), fn.outputs,
            graphs.enabled())


def _ops_format(images: torch.Tensor) -> torch.memory_format:
    """The memory format the candidate ops write in: the images' own (channels_last kept)."""
    from ..ops.pure import is_channels_last

    return torch.channels_last if is_channels_last(images) else torch.contiguous_format
