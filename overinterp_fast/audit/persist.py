"""An :class:`~overinterp_fast.audit.records.AuditRecord` saved as an audit folder and read back.

    save_audit(record, "out/audit")        # results.json, parts/, sis.parquet
    record = load_audit("out/audit")       # also reads a folder a stored audit (run_stored_audit) completed

The folder's layout is :mod:`overinterp_fast.audit.store`'s (see :mod:`overinterp_fast.audit.records` for what
each file holds); ``format_version`` guards against reading a future layout silently.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import math
import os

from ..methods.results import SISResult
from . import store
from .own_subsets import concat_columns, split_columns
from .records import AuditRecord, ModelRecord
from .store import FORMAT_VERSION, RESULTS_FILE
from .table import write_table


def _float(x: float | None) -> float | None:
    """JSON has no NaN or inf: they become None."""
    return None if x is None or not math.isfinite(x) else float(x)


def model_entries(models: list[ModelRecord]) -> list[dict]:
    """The models as results.json lists them (name, method, seconds, options, sensitivity, and ``subsets``: the
    model on its own pixel subsets, :func:`~overinterp_fast.audit.own_subsets.subset_summary`, or null)."""
    return [{"name": m.name, "method": m.method, "seconds": _float(m.seconds), "options": m.options,
             "sensitivity": m.sensitivity, "subsets": m.subsets} for m in models]


def complete_doc(record: AuditRecord, config: dict, chunk_size: int) -> dict:
    """results.json of a complete audit: configuration, metadata and aggregates (no per-image arrays)."""
    return {
        "format_version": FORMAT_VERSION, "status": "complete", "config": config,
        "n_images": len(record.image_names), "chunk_size": chunk_size, "title": record.title,
        "class_names": {str(k): v for k, v in sorted(record.class_names.items())},
        "models": model_entries(record.models), "transfer": record.transfer, "meta": record.meta,
        "object_masks": record.object_masks is not None,
    }


def save_audit(record: AuditRecord, folder: str, config: dict | None = None) -> str:
    """Write an in-memory record as an audit folder (results.json, one part per chunk of images,
    sis.parquet), replacing an audit already there; returns the JSON's path."""
    os.makedirs(folder, exist_ok=True)
    store.clear(folder)
    n = len(record.image_names)
    store.commit_chunk(folder, 0, store.images_table(range(n), record.image_names, record.labels,
                                                       record.displays, record.object_masks),
                       store.results_table([m.results for m in record.models], range(n),
                                           [m.subset_columns for m in record.models]))
    path = os.path.join(folder, RESULTS_FILE)
    store.write_json(path, complete_doc(record, config or {"source": "an in-memory AuditRecord"}, max(1, n)))
    write_table(record, folder)
    return path


def chunk_record(doc: dict, chunk: store.ChunkImages, per_model: list[list[SISResult]],
                 class_names: dict[int, str]) -> AuditRecord:
    """The AuditRecord of one chunk's images (aggregates left out): what per-chunk tables are built from."""
    models = [ModelRecord(name=m["name"], method=m["method"], results=res, options=m.get("options", {}))
              for m, res in zip(doc["models"], per_model)]
    return AuditRecord(doc.get("title", ""), chunk.names, chunk.displays, chunk.labels, class_names, models,
                       object_masks=chunk.object_masks)


def iter_chunks(folder: str, doc: dict):
    """Yield (ChunkImages, per-model results, per-model sensitivity columns, chunk metadata) for every
    committed chunk in image order; raises when the committed chunks do not cover the audit's images."""
    n_models = len(doc["models"])
    expected = 0
    for c in sorted(store.committed_chunks(folder)):
        images, per_model, sens, meta = store.read_chunk(folder, c, n_models)
        if images.indices[:1] != [expected]:
            raise ValueError(f"{folder!r}: chunk {c} starts at image {images.indices[:1]}, expected {expected}")
        expected = images.indices[-1] + 1
        yield images, per_model, sens, meta
    if expected != doc["n_images"]:
        raise ValueError(f"{folder!r}: the committed chunks cover {expected} of {doc['n_images']} images")


def load_audit(folder: str) -> AuditRecord:
    """Read a complete audit folder (written by :func:`save_audit` or a stored audit run) back into memory."""
    doc = store.read_doc(folder)
    if doc is None:
        raise FileNotFoundError(f"no {RESULTS_FILE} in {folder!r}: not an audit folder")
    if doc.get("status") != "complete":
        done = len(store.committed_chunks(folder))
        raise ValueError(f"the audit in {folder!r} is not complete ({done} chunks committed); rerun the same "
                         f"command to continue it")
    names, labels, displays, objects = [], [], [], []
    results: list[list[SISResult]] = [[] for _ in doc["models"]]
    own: list[list[dict | None]] = [[] for _ in doc["models"]]
    for images, per_model, columns, _ in iter_chunks(folder, doc):
        names += images.names
        labels += images.labels
        displays += images.displays
        objects += images.object_masks or []
        for acc, res, own_acc, cols in zip(results, per_model, own, columns):
            acc += res
            own_acc.append(split_columns(cols)[1])
    return AuditRecord(
        title=doc["title"], image_names=names, displays=displays, labels=labels,
        class_names={int(k): v for k, v in doc["class_names"].items()},
        models=[ModelRecord(name=m["name"], method=m["method"], results=res,
                            seconds=math.nan if m["seconds"] is None else m["seconds"], options=m["options"],
                            sensitivity=m.get("sensitivity"), subsets=m.get("subsets"),
                            subset_columns=concat_columns(cols))
                for m, res, cols in zip(doc["models"], results, own)],
        transfer=doc["transfer"], meta=doc["meta"], object_masks=objects if doc.get("object_masks") else None,
    )
