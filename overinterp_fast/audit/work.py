"""A chunk's work in progress: what an audit keeps of a chunk before it is committed, so that an interruption
loses at most one image's work, or a few minutes of it (docs: audit.md, Interruptions).

Layout, beside the committed parts::

    parts/c000012.work/images.parquet        the chunk's images (as the committed images part), written when
                                             the chunk starts
    parts/c000012.work/m000.results.parquet  model 0's finished images (rows as a results part's, for that model
                                             alone), rewritten whole as more of them finish; its metadata holds
                                             the model's seconds so far and the chunk's class names
    parts/c000012.work/m000.state.pt         model 0's exact SIS state (:mod:`overinterp_fast.methods.exact_state`),
                                             saved every few minutes and as images finish

A model whose finished images cover the chunk is not run again; exact SIS continues its saved state, with the
uninterrupted run's results. Every file is written whole or not at all (written, flushed, renamed), inside the
folder, which must exist (a folder removed meanwhile is not made again). The chunk's commit removes its work
folder; a commit killed before that leaves it to the next run, which removes the work folders of committed chunks
when it opens the folder.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..methods import exact_state
from ..methods.results import SISResult
from ..util.files import TEMP_MARK, atomic_write
from . import store
from .faults import writing

WORK = ".work"
IMAGES_FILE = "images.parquet"
_WORK_DIR = re.compile(r"^c(\d{6,})\.work$")
_MODEL_FILE = re.compile(r"^m(\d{3,})\.results\.parquet$")


def work_dir(folder: str, chunk: int) -> str:
    """The work folder of ``chunk`` (see the module docstring)."""
    return os.path.join(folder, store.PARTS_DIR, f"c{chunk:06d}{WORK}")


def results_path(folder: str, chunk: int, model: int) -> str:
    return os.path.join(work_dir(folder, chunk), f"m{model:03d}.results.parquet")


def state_path(folder: str, chunk: int, model: int) -> str:
    return os.path.join(work_dir(folder, chunk), f"m{model:03d}.state.pt")


def chunks_in_progress(folder: str) -> list[int]:
    """The chunks with a work folder, sorted."""
    try:
        names = os.listdir(os.path.join(folder, store.PARTS_DIR))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for f in names if (m := _WORK_DIR.match(f)))


def tidy(folder: str) -> int:
    """Remove the work folders of committed chunks and the temporary files a killed write left in the others;
    returns how many entries went."""
    committed, gone = store.committed_chunks(folder), 0
    for c in chunks_in_progress(folder):
        where = work_dir(folder, c)
        if c in committed:
            shutil.rmtree(where, ignore_errors=True)
            gone += 1
            continue
        for f in os.listdir(where):
            if TEMP_MARK in f:
                os.remove(os.path.join(where, f))
                gone += 1
    return gone


def finished_results(folder: str, chunk: int, model: int) -> tuple[dict[int, SISResult], dict]:
    """Model ``model``'s finished images of ``chunk``: ({image index: result}, the file's metadata); ({}, {})
    where none is kept."""
    import pyarrow.parquet as pq

    path = results_path(folder, chunk, model)
    if not os.path.exists(path):
        return {}, {}
    table = pq.read_table(path)
    indices, (results,), _ = store.results_from_table(table, 1)
    meta = json.loads((table.schema.metadata or {}).get(b"overinterp_fast", b"{}"))
    return dict(zip(indices, results)), meta


@dataclass
class InProgress:
    """What a chunk in progress keeps: its images' indices (None: its images part is not written yet), per model
    the image indices finished, and per model the share of exact SIS's candidates its saved state had scored."""

    chunk: int
    indices: list[int] | None
    finished: list[set[int]]
    saved: list[float | None]

    def done(self) -> set[int]:
        """The images finished by every model."""
        return set.intersection(*self.finished) if self.finished else set()


def in_progress(folder: str, chunk: int, n_models: int) -> InProgress:
    """Read what ``chunk``'s work folder keeps (see :class:`InProgress`)."""
    import pyarrow.parquet as pq

    images = os.path.join(work_dir(folder, chunk), IMAGES_FILE)
    indices = (pq.read_table(images, columns=["image_index"]).column(0).to_pylist() if os.path.exists(images)
               else None)
    finished, saved = [], []
    for m in range(n_models):
        path = results_path(folder, chunk, m)
        finished.append(set(pq.read_table(path, columns=["image_index"]).column(0).to_pylist())
                        if os.path.exists(path) else set())
        saved.append(_state_share(state_path(folder, chunk, m)))
    return InProgress(chunk, indices, finished, saved)


def _state_share(path: str) -> float | None:
    """The share of the candidates a saved exact SIS state had scored (None: no state)."""
    import torch

    if not os.path.exists(path):
        return None
    try:
        n, total = torch.load(path, map_location="cpu", weights_only=True)["bar"]
    except Exception:  # a state this version cannot read: it is not counted
        return None
    return n / total if total else 1.0


def kept(folder: str, ranges: Sequence[tuple[int, int]], n_models: int) -> str:
    """What ``folder`` keeps, in words: the committed chunks and images, and the chunks in progress (their images
    finished by every model and how far their saved exact SIS states had got)."""
    committed = store.committed_chunks(folder)
    images = sum(ranges[c][1] - ranges[c][0] for c in committed if c < len(ranges))
    total = ranges[-1][1] if ranges else 0
    text = f"{len(committed)} of {len(ranges)} chunks committed ({images} of {total} images)"
    more = []
    for c in chunks_in_progress(folder):
        if c in committed or c >= len(ranges):
            continue
        w = in_progress(folder, c, n_models)
        size = ranges[c][1] - ranges[c][0]
        what = f"chunk {c}: {len(w.done())} of {size} images finished"
        shares = [s for s in w.saved if s is not None]
        if shares and len(w.done()) < size:
            share = min(shares)  # one decimal below 10%: a long image's first minutes show
            what += f", exact SIS saved at {share:.1%}" if share < 0.1 else f", exact SIS saved at {share:.0%}"
        more.append(what)
    return text + (f", and work in progress ({'; '.join(more)})" if more else "")


@dataclass
class ChunkWork:
    """One chunk's work in progress while it is computed (see the module docstring).

    Args:
        folder: the audit folder. chunk: the chunk. indices: its images' indices, in order.
        chunks: the audit's chunks (for the one-line storage faults).
        exact: the method is exact SIS (its state is saved).
        every: seconds between two saves of exact SIS's state at most.
        class_name: class index -> name, kept with the finished images (a partial report names the classes).
    """

    folder: str
    chunk: int
    indices: list[int]
    chunks: int
    exact: bool
    every: float = exact_state.DEFAULT_EVERY_S
    class_name: Callable[[int], str] = str
    finished: dict[int, dict[int, SISResult]] = field(default_factory=dict)

    def start(self, images) -> None:
        """Make the work folder and write the chunk's images there (once)."""
        import pyarrow.parquet as pq

        with writing(self.folder, self.chunks):
            for d in (os.path.join(self.folder, store.PARTS_DIR), work_dir(self.folder, self.chunk)):
                try:  # in the folder, which must exist: a removed one is not made again
                    os.mkdir(d)
                except FileExistsError:
                    pass
            path = os.path.join(work_dir(self.folder, self.chunk), IMAGES_FILE)
            if not os.path.exists(path):
                atomic_write(path, lambda tmp: pq.write_table(images, tmp))

    def jobs_done(self) -> int:
        """(model, image) pairs finished in this chunk so far."""
        return sum(len(d) for d in self.finished.values())

    def model(self, m: int, compute: Callable[[], list[SISResult]]) -> tuple[list[SISResult], float]:
        """Model ``m``'s results on the chunk and their seconds (every run's): read back where its finished images
        cover the chunk, else ``compute()`` (exact SIS continuing its saved state, its finished images kept as they
        finish)."""
        done, meta = finished_results(self.folder, self.chunk, m)
        self.finished[m] = done
        before = float(meta.get("seconds", 0.0))
        if all(i in done for i in self.indices):
            return [done[i] for i in self.indices], before
        t0 = time.perf_counter()
        if not self.exact:
            results = compute()
            seconds = before + time.perf_counter() - t0
        else:
            keep = self.checkpoints(m)
            with exact_state.saving(keep):
                results = compute()
            seconds = keep.earlier + time.perf_counter() - t0
        self._store(m, dict(zip(self.indices, results)), seconds)
        return results, seconds

    def checkpoints(self, m: int) -> exact_state.Checkpoints:
        """Exact SIS's saving for model ``m`` on this chunk: its state file, every ``every`` seconds, its finished
        images stored as they finish; windows of a quarter of the interval at most (one batch each at 0), so that
        a signal is taken within that."""
        t0 = time.perf_counter()
        return exact_state.Checkpoints(state_path(self.folder, self.chunk, m), self.every,
                                       on_images=lambda new: self._keep(m, new, t0), write=self._write,
                                       window_s=min(exact_state.WINDOW_S, self.every / 4))

    def _keep(self, m: int, new: dict[int, SISResult], t0: float) -> None:
        """Exact SIS finished images ``new`` (by position in the chunk): store them with the ones before."""
        done = self.finished.setdefault(m, {})
        done.update({self.indices[i]: r for i, r in new.items()})
        c = exact_state.current()
        self._store(m, done, (0.0 if c is None else c.earlier) + time.perf_counter() - t0)

    def _store(self, m: int, done: dict[int, SISResult], seconds: float) -> None:
        import pyarrow.parquet as pq

        self.finished[m] = dict(done)
        order = [i for i in self.indices if i in done]
        results = [done[i] for i in order]
        names = {str(c): self.class_name(c) for c in sorted({int(r.target) for r in results})}
        table = store.results_table([results], order, meta={"seconds": seconds, "class_names": names})
        self._write(results_path(self.folder, self.chunk, m), lambda tmp: pq.write_table(table, tmp))

    def _write(self, path: str, fill: Callable[[str], None]) -> None:
        with writing(self.folder, self.chunks):
            atomic_write(path, fill)

    def remove(self) -> None:
        """The chunk is committed: its work folder goes."""
        shutil.rmtree(work_dir(self.folder, self.chunk), ignore_errors=True)
