"""Audits at dataset scale: streamed, committed chunk by chunk, resumable, sharded across torchrun ranks.

    src = open_images(dataset="cifar10", data_dir="data", size=32)
    run = run_stored_audit({"net": model}, src, "out/cifar", AuditConfig(method="exact"),
                           StoreOptions(chunk_size=64, identity={"models": ["net.pt2"]}))

What it does (docs: algorithms.md, Durable and sharded audits):

1. The images are split into fixed chunks of ``chunk_size`` (by position: chunk c holds images
   [c * chunk_size, (c + 1) * chunk_size)). The chunk is the unit of work, of batching and of commit.
2. Rank 0 checks the folder: a new audit writes ``results.json`` with the configuration; an audit
   with the same configuration continues; another configuration is refused (one line naming the
   difference) unless ``restart``. Temporary files of a killed commit are removed. While the audit runs,
   the folder's lock (:mod:`overinterp_fast.audit.lock`) refuses a second audit there.
3. Rank 0 says the estimate of the whole audit left (:mod:`overinterp_fast.audit.planning`: exact SIS times the
   first chunk's own first seconds, kept as that chunk's work).
4. Every rank takes its share (round robin) of the chunks not yet committed, streams their images
   through a ``DataLoader`` (worker processes decode, crop and normalize), runs every model on each
   chunk and commits it (:func:`overinterp_fast.audit.store.commit_chunk`). Only the chunks in
   flight are in memory. Until its commit, a chunk keeps its finished images as they finish and exact SIS's
   state every few minutes (:mod:`overinterp_fast.audit.work`); Ctrl-C and SIGTERM save it, mark results.json
   "interrupted" and raise :class:`~overinterp_fast.errors.Interrupted` saying what is kept.
5. Rank 0 shows one progress bar for all ranks (committed parts counted on the shared folder),
   waits for every rank (barrier), then aggregates the parts into ``results.json`` (seconds,
   transfer table, noise sensitivity), writes ``sis.parquet`` chunk by chunk, and the report.

Results do not depend on the world size or on resumes: the same chunks give the same batches (within a chunk, a
continued exact SIS state scores the batches the uninterrupted run would).
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import Interrupted
from ..runtime import estimate as estimates
from ..util import interrupts
from ..zoo.preprocessing import Preprocessing
from .sources import ImageSource, collate
from . import lock, planning, store, work
from .checks import CHECK_ROWS, check_source
from .config import AuditConfig, RunOptions, StoreOptions, check_type
from .distributed import Ranks, barrier, from_main, setup, teardown
from .faults import writing
from .persist import chunk_record, iter_chunks, load_audit, model_entries
from .records import AuditRecord, ModelRecord
from .own_subsets import concat_columns, merge_columns, split_columns, subset_summary
from .subset_files import SubsetFiles
from .subsets import BACKWARD_METHODS
from .runner import (
    _plain,
    audit_chunk,
    check_method,
    fixed_engine,
    reference_name,
    resolve_method,
    run_info,
    sensitivity_summary,
    transfer_summary,
    wants_transfer,
    with_ensemble,
)

logger = logging.getLogger(__name__)


@dataclass
class StoredAudit:
    """What a call of :func:`run_stored_audit` did.

    Attributes:
        folder: the audit folder. chunks: chunks in the audit; skipped: committed before this call;
        computed: chunks this rank computed. ranks: the job's layout.
        record: on rank 0 with ``load=True``, the complete audit read back; else None.
        commit_seconds: this rank's time writing parts (the cost of durability while computing);
        finalize_seconds: rank 0's merge (results.json aggregates and sis.parquet), 0 on other ranks.
        subsets: the pixel-subset files rank 0 wrote (paths relative to the folder; ``StoreOptions.pixel_subsets``).
        estimate: the estimate rank 0 said before its first chunk (:mod:`.planning`), None where nothing was left.
    """

    folder: str
    chunks: int
    skipped: int
    computed: int
    ranks: Ranks
    record: AuditRecord | None = None
    commit_seconds: float = 0.0
    finalize_seconds: float = 0.0
    subsets: list[str] = field(default_factory=list)
    estimate: str | None = None


def source_digest(source: ImageSource) -> str:
    """SHA-1 of the images' names and labels: a changed folder or selection makes another configuration."""
    h = hashlib.sha1()
    for name, label in zip(source.image_names, source.image_labels):
        h.update(f"{name}\t{label}\n".encode())
    return h.hexdigest()


def audit_config(source: ImageSource, models: Mapping[str, object], config: AuditConfig, chunk_size: int,
                 device: torch.device, extra: dict | None) -> dict:
    """Everything that fixes the results of a stored audit, as JSON-ready values: ``config`` (its batch size
    as the audit runs it), the images and their preprocessing (size, mean, std, and how the crop is made: the
    library, resize, crop_pct, interpolation, crop mode), ``chunk_size``, the device type, and the caller's
    ``extra`` entries."""
    method = config.method
    result = {
        "models": list(models), "method": method, "threshold": config.threshold,
        "threshold_mode": config.threshold_mode, "k": config.k if method == "gradient" else None,
        "autocast": config.autocast, "collection": config.collection, "ensemble": config.ensemble,
        "transfer": config.transfer, "fraction": config.fraction,
        "baselines": _plain(0.0 if config.baselines is None else config.baselines),
        "images": source.description, "n_images": len(source),
        "images_digest": source_digest(source), "size": source.size, "mean": _plain(source.mean),
        "std": _plain(source.std), "preprocessing": source.preprocessing.details(), "grey": source.grey,
        "object_masks": source.object_dir,
        "noise_sigma": _plain(config.noise_sigma) if source.object_dir else None, "chunk_size": chunk_size,
        "device_type": device.type, "batch_size": config.batch_size, "seed": config.seed,
        "score_dtype": config.score_dtype if method == "exact" else None,
        "channels_last": bool(config.channels_last) if method == "exact" else False,
        "outputs": config.outputs,
    }
    result.update(extra or {})
    return store._jsonable(result)


def device_settings(models: Mapping[str, object], source: ImageSource, config: AuditConfig, chunk_size: int,
                    ranks: Ranks, stored: dict | None) -> AuditConfig:
    """``config`` with the batch size (and, for exact SIS, the memory format) the stored audit runs at, fixed when
    it starts so that results do not depend on timing: the caller's; else what ``stored`` (the folder's stored
    configuration: a resume) holds; else, for exact SIS on a GPU, what exact SIS chooses on the first chunk of the
    first model (its calibration and the format's measurement, :meth:`~overinterp_fast.attr.ExactSIS.choices`),
    measured by rank 0 and given to every rank; else the CPU default for the input shape (:func:`fixed_batch_size`),
    with exact SIS's format measured the same way at that batch size (the caller's format where given)."""
    stored = stored or {}
    batch, cl = config.batch_size, config.channels_last
    if batch is None and stored.get("batch_size") is not None:
        batch = stored["batch_size"]
        cl = stored.get("channels_last", False) if cl is None else cl
    exact = config.method == "exact"
    if batch is None:
        on_gpu = exact and ranks.device.type == "cuda"
        fixed = None if on_gpu else fixed_batch_size(source, chunk_size)  # None: exact SIS calibrates it
        if exact and (on_gpu or cl is None):  # on a CPU, the format alone (measured at the fixed size)
            batch, cl = from_main(ranks, measure_settings(models, source, config, chunk_size, ranks.device, cl, fixed)
                                  if ranks.is_main else None)
        else:
            batch = fixed
    return replace(config, batch_size=batch, channels_last=bool(cl) if exact else False)


def measure_settings(models: Mapping[str, object], source: ImageSource, config: AuditConfig, chunk_size: int,
                     device: torch.device, channels_last: bool | None,
                     batch_size: int | None = None) -> tuple[int, bool]:
    """(batch size, channels_last) that exact SIS chooses for the first model on the first chunk's images on
    ``device`` (:meth:`~overinterp_fast.attr.ExactSIS.choices`; ``channels_last`` None: measured too; ``batch_size``
    given: kept, and the format measured at it)."""
    from ..attr import ExactSIS

    name = next(iter(models))
    x = torch.stack([source[i]["x"] for i in range(min(chunk_size, len(source)))]).to(device)
    choice = ExactSIS(_to(models[name], device), outputs=config.outputs, engine=fixed_engine(models[name]),
                      batch_size=batch_size, score_dtype=config.exact_options().score_dtype,
                      channels_last=channels_last).choices(x)
    return choice.batch_size, choice.channels_last


def fixed_batch_size(source: ImageSource, chunk_size: int) -> int:
    """Candidates per forward call for a stored audit without --batch-size: the CPU default for the input
    shape (:func:`overinterp_fast.runtime.batching.auto_batch_size`), the same on every machine and rank."""
    from ..runtime.batching import auto_batch_size

    shape = source[0]["x"].shape
    return auto_batch_size(torch.empty(1, *shape), total_candidates=chunk_size * shape[-1] * shape[-2])


def _committed_images(folder: str, ranges: list[tuple[int, int]]) -> int:
    return sum(ranges[c][1] - ranges[c][0] for c in store.committed_chunks(folder) if c < len(ranges))


class _Progress:
    """Rank 0's bar over all ranks: jobs (model, image) committed to the folder, and those finished in the chunk
    this rank computes (``in_flight``: a callable counting them, or None), images per hour since this run started,
    and the time left at that rate; until a job is done, the time left is the audit's estimate (``estimate_s``,
    seconds from the start of this run, less the time spent), or "-" without one (or once it is spent).

    A thread counts the committed parts once a second, so the bar moves with the other ranks too."""

    def __init__(self, folder, ranges, n_models, enabled, every: float = 1.0, estimate_s: float | None = None):
        self.folder, self.ranges, self.n_models, self.every = folder, ranges, n_models, every
        self.estimate_s = estimate_s
        self.in_flight: Callable[[], int] | None = None
        total = ranges[-1][1] if ranges else 0
        self.start_images = _committed_images(folder, ranges)
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total * n_models, initial=self.start_images * n_models, unit="job", desc="audit",
                        disable=not enabled, dynamic_ncols=True, smoothing=0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        if not self.bar.disable:
            self.thread.start()

    def update(self) -> None:
        count = self.in_flight
        jobs = _committed_images(self.folder, self.ranges) * self.n_models + (0 if count is None else count())
        done = jobs / self.n_models  # images
        elapsed = max(1e-9, time.perf_counter() - self.t0)
        rate = (done - self.start_images) / elapsed  # images per second
        total = self.ranges[-1][1] if self.ranges else 0
        if rate > 0:
            left = tqdm.format_interval((total - done) / rate)
        elif self.estimate_s is not None and self.estimate_s > elapsed:
            left = tqdm.format_interval(self.estimate_s - elapsed)
        else:
            left = "-"
        self.bar.n = jobs
        self.bar.set_postfix_str(f"{3600 * rate:,.0f} images/h, {left} left", refresh=False)
        self.bar.refresh()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.update()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        if not self.bar.disable:
            self.update()
        self.bar.close()


def run_stored_audit(
    models: Mapping[str, object],
    source: ImageSource,
    out: str,
    config: AuditConfig | None = None,
    storage: StoreOptions | None = None,
    run: RunOptions | None = None,
    *,
    ranks: Ranks | None = None,
) -> StoredAudit:
    """Audit ``models`` on every image of ``source`` into the durable folder ``out`` (see the module docstring).

    Args:
        models: name -> model on the CPU (moved to this rank's device); ``source``: the images.
        config: what the audit computes (:class:`~overinterp_fast.audit.config.AuditConfig`, as for
            :func:`overinterp_fast.audit.run_audit`); with ``storage.chunk_size`` and ``storage.identity`` it is
            the stored configuration that a rerun must match to continue.
        storage: chunks, loader workers, restart, device, report and gallery
            (:class:`~overinterp_fast.audit.config.StoreOptions`).
        run: title, metadata, class names and rank 0's progress bar
            (:class:`~overinterp_fast.audit.config.RunOptions`).
        ranks: the torchrun layout when the caller joined the job already (:func:`.distributed.setup`).

    While it writes, the folder holds a lock (:mod:`overinterp_fast.audit.lock`): a second audit writing to
    the same folder is refused with one line; the ranks of one torchrun job share it.

    Raises:
        FolderLocked: another audit writes ``out`` (:mod:`overinterp_fast.errors`; a ValueError).
        ConfigMismatch: ``out`` holds an audit with another configuration, and not ``storage.restart``.
        StorageFault: ``out`` filled its disk, could not be written or was removed while the audit ran
            (:mod:`overinterp_fast.audit.faults`); the chunks committed before stay, and the same call resumes.
    """
    config = check_type(config, AuditConfig, "config")
    storage = check_type(storage, StoreOptions, "storage")
    run = check_type(run, RunOptions, "run")
    own = ranks is None
    ranks = setup(storage.device) if own else ranks
    try:
        return _run(models, source, out, ranks, config, storage, run)
    finally:
        if own:
            teardown(ranks)


def plan_stored_audit(models: Mapping[str, object], source: ImageSource, out: str, config: AuditConfig | None = None,
                      storage: StoreOptions | None = None, *, ranks: Ranks | None = None) -> planning.AuditPlan | None:
    """What :func:`run_stored_audit` with the same arguments would do, and the estimate of the whole audit, without
    computing or writing anything (``audit --dry-run``): on rank 0 an
    :class:`~overinterp_fast.audit.planning.AuditPlan` (``.text()``), None on the other ranks. The batch size and
    format are fixed as the run would fix them, a folder of another configuration is refused as the run refuses
    it, and its committed chunks are left out of the estimate."""
    config = check_type(config, AuditConfig, "config")
    storage = check_type(storage, StoreOptions, "storage")
    own = ranks is None
    ranks = setup(storage.device) if own else ranks
    try:
        plan = _plan(models, source, out, config, storage, ranks, "")
        committed: set[int] = set()
        if not storage.restart:
            _check_there(out, plan)
            committed = store.committed_chunks(out)
        if not ranks.is_main:
            return None
        return planning.plan_audit(plan.models, source, out, plan.config, storage.chunk_size, committed,
                                   ranks.device, ranks.world, storage.report, storage.gallery)
    finally:
        if own:
            teardown(ranks)


def interrupted(out: str, ranges: list[tuple[int, int]], n_models: int, ranks: Ranks,
                exc: KeyboardInterrupt) -> Interrupted:
    """The audit in ``out`` stopped on ``exc`` (Ctrl-C or SIGTERM): rank 0 marks results.json "interrupted"
    (where it says "running"), and the exception to raise says what the folder keeps."""
    sig, kept = getattr(exc, "signal", "SIGINT"), "what it committed"
    try:
        kept = work.kept(out, ranges, n_models)
        doc = store.read_doc(out) if ranks.is_main else None
        if doc is not None and doc.get("status") == "running":
            store.write_json(os.path.join(out, store.RESULTS_FILE), dict(doc, status="interrupted"))
    except (OSError, ValueError) as err:  # a folder that cannot be read or written: the interruption still says so
        logger.warning("%s: %s", out, err)
    return Interrupted(sig, out, kept)


@dataclass
class _Plan:
    """A stored audit, decided: the models (ensemble included, on this rank's device), the configuration as
    it runs (engine and batch size fixed), the stored configuration and document, the chunks, and the stored
    entries that older folders lack (``recorded_later``, with the value they had)."""

    models: dict
    config: AuditConfig
    stored: dict
    doc: dict
    ranges: list[tuple[int, int]]
    recorded_later: dict


def _plan(models: Mapping[str, object], source: ImageSource, out: str, config: AuditConfig, storage: StoreOptions,
          ranks: Ranks, title: str) -> _Plan:
    if len(source) == 0:
        raise ValueError("no images to audit")
    if not models:
        raise ValueError("no models to audit")
    config = replace(config, method=resolve_method(config.method, (source.size, source.size), list(models.values())))
    check_method(config.method, (source.size, source.size))
    models = {n: _to(m, ranks.device) for n, m in models.items()}
    # every model against the source (channels, classes, labels, what its outputs are), before anything is measured,
    # computed or written
    check_source(models, source, config.outputs, ranks.device, min(CHECK_ROWS, storage.chunk_size))
    # Calibrated batch sizes, formats and engine="auto" are chosen by timing, which would make results depend on the
    # machine and the moment; a stored audit fixes them: the engine by the model's type (runner.fixed_engine), the
    # batch size and format when it starts (given, stored, measured once on a GPU, or a function of the chunk's
    # shape), kept in its configuration.
    there = None if storage.restart else store.read_doc(out)
    config = device_settings(models, source, config, storage.chunk_size, ranks,
                             None if there is None else there.get("config"))
    models = with_ensemble(models, config.ensemble)
    stored = audit_config(source, models, config, storage.chunk_size, ranks.device, storage.identity)
    doc = {"format_version": store.FORMAT_VERSION, "status": "running", "config": stored, "n_images": len(source),
           "chunk_size": storage.chunk_size, "title": title, "command": storage.command,
           "models": [{"name": n, "method": config.method, "options": config.model_options()} for n in models]}
    # folders written before the preprocessing was recorded used the plain transform
    older = {"preprocessing": Preprocessing(source.size).details()}
    return _Plan(models, config, stored, store._jsonable(doc), store.chunk_ranges(len(source), storage.chunk_size),
                 older)


# Stored configurations written by earlier versions: keys renamed since (old -> new), and keys added since with the
# value those versions ran with, so that their audits continue.
RENAMED_KEYS = {"mask_value": "baselines"}
ADDED_KEYS = {"seed": 0, "score_dtype": None, "channels_last": False, "outputs": "logits"}


def as_stored_there(config: dict, stored: dict | None) -> dict:
    """``config`` (a stored configuration as this version writes it) in the names of ``stored`` (the folder's,
    None: no audit there): a key renamed since takes its old name where the folder has the old name, and a key
    added since is left out where the folder lacks it and ``config`` holds the value earlier versions ran with."""
    if stored is None:
        return config
    out = dict(config)
    for old, new in RENAMED_KEYS.items():
        if old in stored and new not in stored and new in out:
            out[old] = out.pop(new)
    for key, value in ADDED_KEYS.items():
        if key not in stored and key in out and out[key] == value:
            del out[key]
    return out


def _check_there(out: str, plan: _Plan) -> None:
    """Refuse a folder that holds an audit of another configuration (ConfigMismatch, one line)."""
    there = store.read_doc(out)
    store.check_resumable(out, as_stored_there(plan.stored, None if there is None else there.get("config", {})),
                          plan.recorded_later)


def _open_folder(out: str, plan: _Plan, restart: bool, ranks: Ranks) -> None:
    """Refuse another configuration (every rank alike), then on rank 0: clear on restart, remove a killed
    commit's temporaries and the work folders of committed chunks, and write the running document when the folder
    holds no running audit."""
    if not restart:
        _check_there(out, plan)
    if ranks.is_main:
        os.makedirs(out, exist_ok=True)
        if restart:
            store.clear(out)
        store.remove_temporaries(out)
        work.tidy(out)
        old = store.read_doc(out)
        if old is None or old.get("status") != "running":
            store.write_json(os.path.join(out, store.RESULTS_FILE), plan.doc)
    barrier(ranks)


def _run(models, source: ImageSource, out: str, ranks: Ranks, config: AuditConfig, storage: StoreOptions,
         run: RunOptions) -> StoredAudit:
    with interrupts.caught():  # Ctrl-C and SIGTERM: work kept, status "interrupted", the lock released
        plan = _plan(models, source, out, config, storage, ranks, run.title)
        with writing(out, len(plan.ranges)):
            held = _lock(out, ranks)
        try:
            with writing(out, len(plan.ranges)):
                _open_folder(out, plan, storage.restart, ranks)
            pending = [c for c in range(len(plan.ranges)) if c not in store.committed_chunks(out)]
            mine = store.share(pending, ranks.rank, ranks.world)
            said = _announce(plan, source, out, pending, ranks, storage, run)
            committing = _compute(out, source, plan, mine, storage, ranks, run,
                                  None if said is None else said.seconds)
            done = StoredAudit(out, len(plan.ranges), len(plan.ranges) - len(pending), len(mine), ranks,
                               commit_seconds=committing, estimate=None if said is None else said.line())
            if ranks.is_main:
                with writing(out, len(plan.ranges)):
                    _finish(done, source, plan, storage, run)
            return done
        except KeyboardInterrupt as exc:
            raise interrupted(out, plan.ranges, len(plan.models), ranks, exc) from None
        finally:
            if held is not None:
                lock.release(out, held)


def _announce(plan: _Plan, source: ImageSource, out: str, pending: list[int], ranks: Ranks,
              storage: StoreOptions, run: RunOptions) -> planning.AuditPlan | None:
    """Rank 0, before the first chunk: the plan and estimate of the whole audit left (:mod:`.planning`; its trial of
    the first chunk is that chunk's own work, kept), said in one line; None on the other ranks and when nothing is
    left. Above a minute the line is said whatever the log level (logged at INFO by
    :mod:`overinterp_fast.runtime.estimate`'s logger, which the command line prints), as a long run says its own;
    below, it is logged at INFO here (``-v``)."""
    if not ranks.is_main or not pending:
        return None
    committed = set(range(len(plan.ranges))) - set(pending)
    batch = collate([source[i] for i in range(*plan.ranges[pending[0]])])
    first = _chunk_work(out, pending[0], batch, plan, storage, run)
    first.start(_images_table(source, batch))
    audit_plan = planning.plan_audit(plan.models, source, out, plan.config, storage.chunk_size, committed,
                                     ranks.device, ranks.world, storage.report, storage.gallery, first)
    # a long audit says it whatever the log level (the command line prints the estimates' logger), as a long run does
    (estimates.logger if audit_plan.seconds > estimates.LONG_RUN_S else logger).info(audit_plan.line())
    return audit_plan


def _chunk_work(out: str, chunk: int, batch: dict, plan: _Plan, storage: StoreOptions,
                run: RunOptions) -> work.ChunkWork:
    return work.ChunkWork(out, chunk, list(batch["index"]), len(plan.ranges), plan.config.method == "exact",
                          storage.checkpoint_every, run.class_name)


def _images_table(source: ImageSource, batch: dict):
    """A chunk's images part (store.images_table) from its batch (sources.collate)."""
    objects = batch["objects"]
    return store.images_table(batch["index"], [source.image_names[i] for i in batch["index"]], batch["labels"],
                              batch["displays"], None if objects is None else list(objects.cpu().numpy()))


def _lock(out: str, ranks: Ranks) -> lock.Writer | None:
    """Rank 0 takes the folder's lock (returned; None on the other ranks); every rank raises
    :class:`~overinterp_fast.errors.FolderLocked` alike when rank 0 could not take it."""
    held, failure, error = None, None, None
    if ranks.is_main:
        try:
            held = lock.acquire(out, lock.job_id())
        except Exception as exc:  # every rank must learn that rank 0 stops, whatever stopped it
            failure, error = exc, str(exc)
    error = from_main(ranks, error)
    if failure is not None:
        raise failure
    if error is not None:
        raise lock.FolderLocked(error, out)
    return held


def _compute(out: str, source: ImageSource, plan: _Plan, mine: list[int], storage: StoreOptions, ranks: Ranks,
             run: RunOptions, estimate_s: float | None = None) -> float:
    """Compute and commit this rank's chunks ``mine`` (each model's finished images kept as they finish, and exact
    SIS's state every ``storage.checkpoint_every`` seconds: :mod:`overinterp_fast.audit.work`), then wait for every
    rank; returns the seconds spent committing."""
    known = all(lab is not None for lab in source.image_labels)
    shown = ranks.is_main and (_isatty() if run.show_progress is None else bool(run.show_progress))
    bar = _Progress(out, plan.ranges, len(plan.models), enabled=shown, estimate_s=estimate_s)
    loader = torch.utils.data.DataLoader(source, batch_sampler=[list(range(*plan.ranges[c])) for c in mine],
                                         num_workers=storage.workers, collate_fn=collate)
    committing = 0.0
    try:
        for c, batch in zip(mine, loader):
            x = batch["x"].to(ranks.device)
            objects = None if batch["objects"] is None else batch["objects"].to(ranks.device)
            images = _images_table(source, batch)
            kept = _chunk_work(out, c, batch, plan, storage, run)
            kept.start(images)
            bar.in_flight = kept.jobs_done
            # the methods' bars (candidates within the chunk, their rate and time left) under the audit's; their
            # estimates were said for the whole audit
            with estimates.said_before(leave=False):
                done = audit_chunk(plan.models, x, batch["labels"], known, plan.config, engine=None, progress=shown,
                                   object_masks=objects, indices=batch["index"], keep=kept.model, models_bar=False)
            names = {str(k): run.class_name(k) for k in sorted({int(r.target) for res in done.results for r in res}
                                                               | {int(v) for v in batch["labels"] if v is not None})}
            own = done.subsets or [None] * len(done.results)
            columns = [merge_columns(s, o) for s, o in zip(done.sensitivity, own)]
            results = store.results_table(done.results, batch["index"], columns,
                                          meta={"chunk": c, "seconds": done.seconds, "transfer": done.transfer,
                                                "rank": ranks.rank, "world": ranks.world,
                                                "threads": torch.get_num_threads(), "class_names": names})
            bar.in_flight = None
            t0 = time.perf_counter()
            with writing(out, len(plan.ranges)):
                store.commit_chunk(out, c, images, results)
                kept.remove()
            committing += time.perf_counter() - t0
            del x, objects, done, images, results, batch
        barrier(ranks)
    finally:
        bar.close()
    return committing


def _finish(done: StoredAudit, source: ImageSource, plan: _Plan, storage: StoreOptions, run: RunOptions) -> None:
    """Rank 0, every rank finished: check every chunk is there, aggregate (results.json, sis.parquet), read the
    audit back and write the report as ``storage`` asks."""
    out, ranks = done.folder, done.ranks
    missing = len(plan.ranges) - len(store.committed_chunks(out))
    if missing:
        raise RuntimeError(f"{missing} chunks are not in {out!r} after every rank finished: with several "
                           f"nodes, --out must be on a file system they all share")
    info = run_info(ranks.device, f"{len(source)} x [{_channels(source)}, {source.size}, {source.size}] float32",
                    run.meta)
    info.update({"chunks": len(plan.ranges), "chunk size": storage.chunk_size, "world size": ranks.world})
    if done.estimate:
        info["estimate"] = done.estimate  # this call's, of what it had left
    info.setdefault("preprocessing", source.preprocessing.describe())
    known = all(lab is not None for lab in source.image_labels)
    subsets = None
    if storage.pixel_subsets and plan.config.method in BACKWARD_METHODS:
        subsets = SubsetFiles([m["name"] for m in plan.doc["models"]], source.description.get("split"),
                              plan.config.fraction, plan.config.seed, source.mean, source.std,
                              _plain(0.0 if plan.config.baselines is None else plan.config.baselines))
    t0 = time.perf_counter()
    done.subsets = finalize(out, plan.doc, run.class_name, info, plan.config, known, subsets)
    done.finalize_seconds = time.perf_counter() - t0
    if storage.report or storage.load:
        done.record = load_audit(out)
    if storage.report:
        from .report import build_report

        build_report(done.record, os.path.join(out, store.REPORT_FILE), gallery=storage.gallery)


def _isatty() -> bool:
    import sys

    return sys.stderr.isatty()


def _to(model, device: torch.device):
    return model.to(device) if isinstance(model, torch.nn.Module) else model


def _channels(source: ImageSource) -> int:
    return int(source[0]["x"].shape[0])


def finalize(out: str, doc: dict, class_name: Callable[[int], str], info: dict, config: AuditConfig,
             known: bool, subsets: SubsetFiles | None = None) -> list[str]:
    """Aggregate the committed parts: results.json (complete), and sis.parquet written chunk by chunk; with
    ``subsets``, the pixel-subset datasets (:mod:`overinterp_fast.audit.subset_files`) gathered in the same pass.
    Returns the subset files written (relative to ``out``)."""
    import pyarrow.parquet as pq

    from .table import audit_table, table_schema

    n_models = len(doc["models"])
    seconds = np.zeros(n_models)
    counts = None
    sens: list[list[dict]] = [[] for _ in range(n_models)]
    own: list[list[dict | None]] = [[] for _ in range(n_models)]
    targets: list[list[int]] = [[] for _ in range(n_models)]
    labels: list[int | None] = []
    class_names: dict[int, str] = {}

    def write_table(tmp: str) -> None:  # sis.parquet, chunk by chunk, summing the chunks' aggregates meanwhile
        nonlocal seconds, counts
        with pq.ParquetWriter(tmp, table_schema()) as writer:
            for images, per_model, chunk_sens, meta in iter_chunks(out, doc):
                seconds += np.asarray(meta["seconds"])
                if meta.get("transfer") is not None:
                    c = np.asarray(meta["transfer"], dtype=np.int64)
                    counts = c if counts is None else counts + c
                labels.extend(images.labels)
                for acc, own_acc, tgt, s, res in zip(sens, own, targets, chunk_sens, per_model):
                    s, o = split_columns(s)
                    if s is not None:
                        acc.append(s)
                    own_acc.append(o)
                    tgt.extend(int(r.target) for r in res)
                classes = {int(r.target) for res in per_model for r in res} | {int(v) for v in images.labels
                                                                                 if v is not None}
                names = {c: class_name(c) for c in sorted(classes)}
                class_names.update(names)
                writer.write_table(audit_table(chunk_record(doc, images, per_model, names), images.indices[0]))
                if subsets is not None:
                    subsets.add(images, per_model, [split_columns(s)[1] for s in chunk_sens])

    store.atomic_write(os.path.join(out, store.TABLE_FILE), write_table)
    written = [] if subsets is None else [os.path.relpath(f, out) for f in subsets.write(out)]
    n = doc["n_images"]
    ref = reference_name(known)
    models = [ModelRecord(m["name"], m["method"], [], float(s), m["options"]) for m, s in zip(doc["models"], seconds)]
    for m, cols, own_cols, tgt in zip(models, sens, own, targets):
        if cols:
            merged = {k: np.concatenate([c[k] for c in cols]) for k in cols[0]}
            m.sensitivity = sensitivity_summary(merged, _plain(config.noise_sigma), ref)
        own_cols = concat_columns(own_cols)
        if own_cols is not None:
            m.subsets = subset_summary(own_cols, tgt, labels, config.fraction)
    names = [m["name"] for m in doc["models"]]
    transfer = None
    if counts is not None and wants_transfer(config.transfer, n_models, config.method):
        transfer = transfer_summary(counts.tolist(), n, names, config.fraction, ref)
    final = dict(doc, status="complete", class_names={str(k): v for k, v in sorted(class_names.items())},
                 models=model_entries(models), transfer=transfer, meta=info,
                 object_masks=doc["config"].get("object_masks") is not None)
    if written:
        final["subsets"] = written
    store.write_json(os.path.join(out, store.RESULTS_FILE), store._jsonable(final))
    return written
