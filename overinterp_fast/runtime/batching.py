"""Batch sizes and candidate evaluation that backs off on out-of-memory errors."""
from __future__ import annotations

import bisect
import functools
import warnings
from typing import Callable

import numpy as np
import torch

from ..ops import kernels as _ops
from ..ops.pure import check_ranges
from .inputs import Prepared
from .model import ModelFn

# CPU: about this many input elements per forward call (measured on small CNNs
# and ResNet-20: throughput peaks at 2^16..2^18 elements; larger batches spill
# the caches and run up to 1.7x slower per sample).
_CPU_ELEMENTS_PER_BATCH = 1 << 17
# CUDA: a guess at activation bytes per input byte; out-of-memory errors correct it.
_CUDA_ACTIVATION_FACTOR = 48


def auto_batch_size(images: torch.Tensor, total_candidates: int) -> int:
    """Candidates per forward call when the user gives none.

    On CUDA this is a guess from the device's free memory (cudaMemGetInfo: memory held
    by torch's cache or by ONNX Runtime's arena counts as used); an out-of-memory error,
    torch's or ONNX Runtime's, halves it (ChunkRunner).
    """
    per_sample = images[0].numel()
    if images.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(images.device)
        budget = 0.5 * free / (per_sample * images.element_size() * _CUDA_ACTIVATION_FACTOR)
        size = int(min(max(budget, 64), 32768))
    else:
        size = int(min(max(_CPU_ELEMENTS_PER_BATCH // per_sample, 16), 4096))
    return max(1, min(size, total_candidates))


def check_batch_size(batch_size) -> int | None:
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    return batch_size


# Batch shapes per chunk: a call is padded to the next multiple of ceil(chunk / BUCKETS) rows (see bucket_sizes).
BUCKETS = 8


@functools.lru_cache(maxsize=64)
def bucket_sizes(chunk: int) -> tuple[int, ...]:
    """The batch shapes a forward call may take under a chunk of ``chunk`` rows, ascending: the multiples of the
    granule g = ceil(chunk / BUCKETS) below ``chunk``, and ``chunk`` itself (for 300, g = 38: 38, 76, ..., 266,
    300). At most BUCKETS shapes, whatever the job: on a GPU each is one captured graph, made once per model and
    image shape (methods.exact_step), so their number is what a job's captures cost."""
    g = -(-chunk // BUCKETS)
    return tuple(sorted(set(range(g, chunk, g)) | {chunk}))


def bucket(rows: int, chunk: int) -> int:
    """The batch shape a forward call of ``rows`` rows is padded to: the smallest of :func:`bucket_sizes` that
    holds it, or below the smallest (the granule g) the next power of two (a small call, such as a check of a few
    sets, is padded by less than its own size, not up to g); ``rows`` itself beyond ``chunk``.

    Fixed shapes let cuDNN, oneDNN and CUDA graphs plan once per shape instead of once per call: on 2 CPU cores,
    backward selection's ragged calls (288, 286, 284, ... rows) ran about 2x slower than the same rows padded to
    fixed shapes. Exact SIS's steps take :func:`bucket_sizes` alone (methods.exact_step: at most BUCKETS shapes
    per job, tails under g padded to g). A call of at least g rows is padded by less than g rows: backward
    selection's calls that do not fill a chunk are its steps' tails (an image's last candidates of a step, or the
    steps of images that all fit one call), spread over (0, chunk], which padding to multiples of g lengthens by
    about g / 2 each; a job whose steps fill the chunk runs about 1 + 1 / (2 BUCKETS) times its own rows or less.
    A job whose whole step fits a fraction of one chunk (one small image under a large chunk) pads its calls by up
    to g rows each."""
    if rows >= chunk:
        return rows
    sizes = bucket_sizes(chunk)
    if rows < sizes[0]:
        return power_of_two_ceil(rows)
    return sizes[bisect.bisect_left(sizes, rows)]


def step_bucket(rows: int, chunk: int) -> int:
    """The batch shape exact SIS's step loop pads a batch of ``rows`` rows to: the smallest of :func:`bucket_sizes`
    that holds it (below the smallest, the smallest: the loop keeps to those shapes alone; ``rows`` itself beyond
    ``chunk``). What ``ops.schedule_window`` does with the sizes it is given."""
    if rows >= chunk:
        return rows
    sizes = bucket_sizes(chunk)
    return sizes[bisect.bisect_left(sizes, rows)]


def largest_bucket(rows: int, chunk: int) -> int:
    """The largest of :func:`bucket_sizes` (``chunk``) that is at most ``rows`` (the smallest where none is): the
    size of full calls when a job is given fewer rows per call than the chunk its shapes were made for."""
    sizes = bucket_sizes(chunk)
    k = bisect.bisect_right(sizes, rows)
    return sizes[max(k - 1, 0)]


# The "ladder" policy (responsibility maps and minimal pixel sets): batch shapes are powers of two, at most this
# many, the largest ``top`` (see ladder_sizes). Exact SIS and the gradient method keep the buckets above.
LADDER_RUNGS = 8


def power_of_two_floor(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (max(1, int(n)).bit_length() - 1)


def power_of_two_ceil(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def ladder_sizes(top: int) -> tuple[int, ...]:
    """The batch shapes of the ladder policy under a largest shape ``top`` (a power of two), ascending:
    top / 2^j for j < LADDER_RUNGS, at least 1 (for 2048: 16, 32, ..., 2048; for 16: 1, 2, 4, 8, 16)."""
    return tuple(sorted({max(1, top >> j) for j in range(LADDER_RUNGS)}))


def ladder(rows: int, top: int) -> int:
    """The batch shape a call of ``rows`` rows is padded to under the ladder policy: the smallest of
    :func:`ladder_sizes` that holds it (``rows`` itself beyond ``top``). The shapes do not depend on the job: every
    job of a model with the same ``top`` uses the same few, so their cuDNN plans and CUDA graphs are made once per
    model; a call is padded by less than its own size (by less than top / 2^(LADDER_RUNGS - 1) rows below the
    smallest)."""
    if rows >= top:
        return rows
    return max(ladder_sizes(top)[0], power_of_two_ceil(rows))


class ChunkRunner:
    """Runs work over [0, total) in chunks of at most ``chunk`` items, concatenating the results.

    On an out-of-memory error (torch's, or ONNX Runtime's, which OnnxModel raises as
    torch.OutOfMemoryError) the chunk is halved and the same items are run again, so
    the result is that of the same items; the smaller chunk is kept for later calls.
    One item that still does not fit raises a clear error.
    """

    def __init__(self, chunk: int, device: torch.device):
        self.chunk = chunk
        self.device = device

    def bucket(self, rows: int) -> int:
        """The shape a forward call of ``rows`` rows is padded to under the current chunk (see :func:`bucket`)."""
        return bucket(rows, self.chunk)

    def run(self, total: int, work: Callable[[slice], torch.Tensor | tuple | None]) -> torch.Tensor | tuple | None:
        """Concatenate ``work(slice)`` over [0, total); work may return a tuple of tensors, or None (work done for
        its effects: then None)."""
        parts = []
        start = 0
        while start < total:
            n = min(self.chunk, total - start)
            try:
                parts.append(work(slice(start, start + n)))
            except torch.OutOfMemoryError as exc:
                if n == 1:
                    raise torch.OutOfMemoryError(
                        "out of memory evaluating a single candidate; the model does not fit beside the "
                        f"images on {self.device}: {exc}"
                    ) from exc
                self.chunk = max(1, n // 2)
                warnings.warn(f"out of memory at {n} candidates per forward call; retrying with {self.chunk}")
                # Leaving the except block drops the exception and its traceback, whose frames hold
                # the failed batch's tensors; only then can empty_cache() give their memory back.
            else:
                start += n
                continue
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        if len(parts) == 1 or parts[0] is None:
            return parts[0]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(col) for col in zip(*parts))
        return torch.cat(parts)


def check_candidates(prep: Prepared, image, row=None, feature=None, rows: int = 0) -> None:
    """``mask_apply``'s index check of candidates, with its error: ``image`` in [0, N), ``row`` in [0, ``rows``),
    ``feature`` in [-1, p) (each int64 [B]: a tensor, an array or a list; None: not checked).

    On host values nothing waits for the device: the batch loops build their indices on the host, check them
    here before the upload, and call the evaluator with ``check_indices=False``. On a CUDA tensor it is one
    read.
    """
    checks = []
    for values, hi, lo, what in ((image, prep.images.shape[0], 0, "cand_image"), (row, rows, 0, "cand_row"),
                                 (feature, prep.num_features, -1, "cand_feature")):
        if values is not None:
            t = values.reshape(-1) if isinstance(values, torch.Tensor) else np.asarray(values, np.int64).reshape(-1)
            checks.append((t, lo, hi, what))
    check_ranges("mask_apply", checks)


class CandidateEvaluator:
    """Builds candidates with the fused mask-apply kernel and scores them, chunked by a ChunkRunner.

    ``measure(x, targets)`` says what is computed per candidate (default: f,
    float64 [B]; e.g. ``fn.score_and_top1`` for (f, top-1 correct)). The candidates' indices are checked once
    per call (one device synchronisation on CUDA), not per chunk. ``check_indices=False``, here or per call,
    skips that check: only for callers whose indices were checked when they were made (the exact SIS step
    loop; the loops that build them on the host and pass them through :func:`check_candidates` first).
    """

    def __init__(self, fn: ModelFn, prep: Prepared, targets: torch.Tensor, runner: ChunkRunner,
                 measure: Callable | None = None, check_indices: bool = True):
        self.fn = fn
        self.prep = prep
        self.targets = targets
        self.runner = runner
        self.measure = measure or fn.score
        self.check_indices = check_indices

    def measuring(self, measure: Callable) -> "CandidateEvaluator":
        """The same candidates, scored by ``measure`` instead (e.g. ``fn.score_top1_margin``)."""
        return CandidateEvaluator(self.fn, self.prep, self.targets, self.runner, measure=measure,
                                  check_indices=self.check_indices)

    def padded_rows(self, rows: int) -> int:
        """The rows one call of ``rows`` candidates (at most the runner's chunk) is padded to for the model's fixed
        batch shapes: a caller that builds its index lists on the host can pad them there (repeats of the last
        candidate; the scores of those rows are then dropped) and spare the call the device-side padding."""
        pad_to = self.fn.pad_to
        return pad_to(rows) if pad_to is not None and 0 < rows <= self.runner.chunk else rows

    def __call__(
        self, present: torch.Tensor, image: torch.Tensor, row: torch.Tensor, feature: torch.Tensor,
        check_indices: bool | None = None,
    ) -> torch.Tensor:
        """``measure`` of each candidate (default f, float64 [B]) on the images' device (see ``_ops.mask_apply``).

        ``check_indices``: None for the evaluator's own setting; False only for indices already checked.
        """
        p = self.prep
        if self.check_indices if check_indices is None else check_indices:
            check_candidates(p, image, row, feature, present.shape[0])

        def work(sl: slice) -> torch.Tensor:
            whole = sl.start == 0 and sl.stop == image.shape[0]  # one chunk (the usual call): no views to make
            img, r, feat = (image, row, feature) if whole else (image[sl], row[sl], feature[sl])
            n = img.shape[0]
            m = self.padded_rows(n)  # a chunk never exceeds the runner's chunk size
            if m > n:  # the model's fixed batch shape: pad the candidate list (repeats of the last candidate), so
                # that mask_apply writes the padded batch itself and the forward pass copies nothing
                img, r, feat = (torch.cat([t, t[-1:].expand(m - n)]) for t in (img, r, feat))
            x = _ops.mask_apply(p.images, p.baseline, p.feature_map, present, img, r, feat, False)
            out = self.measure(x, self.targets.index_select(0, img))
            if m == n:
                return out
            return tuple(t[:n] for t in out) if isinstance(out, tuple) else out[:n]

        return self.runner.run(image.shape[0], work)
