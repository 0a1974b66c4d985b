"""An audit read back before it completes (running, interrupted or killed): its committed chunks and the images
its chunks in progress finished, for a report clearly marked as partial.

    record = load_partial("out/cifar")     # an AuditRecord; record.partial == "12 of 60 images (...)"
    build_report(record, "out/cifar/report.html")

A complete audit reads back whole (:func:`~overinterp_fast.audit.persist.load_audit`). Otherwise the record holds
every image of the committed chunks and, of the chunks in progress (:mod:`overinterp_fast.audit.work`), the images
every model has finished, in image order; what the final merge adds (the transfer table, noise sensitivity) is left
out, and ``record.partial`` says how many of the audit's images it covers.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import math
import os

import pyarrow.parquet as pq

from ..util.command import resume_command
from . import store, work
from .persist import load_audit
from .records import AuditRecord, ModelRecord
from .store import RESULTS_FILE


def _doc(folder: str) -> dict:
    doc = store.read_doc(folder)
    if doc is None:
        raise FileNotFoundError(f"no {RESULTS_FILE} in {folder!r}: not an audit folder")
    return doc


def load_partial(folder: str) -> AuditRecord:
    """The audit in ``folder`` as far as it got (see the module docstring); a complete audit whole. One-line
    ValueError when not one image has finished yet."""
    doc = _doc(folder)
    if doc.get("status") == "complete":
        return load_audit(folder)
    n_models = len(doc["models"])
    rows: dict[int, tuple] = {}  # image index -> (name, label, display, object mask, per-model result)
    seconds = [0.0] * n_models
    class_names: dict[int, str] = {}
    committed = store.committed_chunks(folder)
    for c in sorted(committed):
        images, per_model, _, meta = store.read_chunk(folder, c, n_models)
        for m, s in enumerate(meta.get("seconds") or []):
            seconds[m] += s or 0.0
        class_names.update({int(k): v for k, v in (meta.get("class_names") or {}).items()})
        for j, i in enumerate(images.indices):
            rows[i] = (images.names[j], images.labels[j], images.displays[j],
                       None if images.object_masks is None else images.object_masks[j], [r[j] for r in per_model])
    in_progress = 0
    for c in work.chunks_in_progress(folder):
        if c in committed:
            continue
        done = [work.finished_results(folder, c, m) for m in range(n_models)]
        finished = set.intersection(*(set(d) for d, _ in done)) if done else set()
        path = os.path.join(work.work_dir(folder, c), work.IMAGES_FILE)
        if not finished or not os.path.exists(path):
            continue
        images = store.images_from_table(pq.read_table(path))
        for m, (_, meta) in enumerate(done):
            seconds[m] += meta.get("seconds", 0.0)
            class_names.update({int(k): v for k, v in (meta.get("class_names") or {}).items()})
        for j, i in enumerate(images.indices):
            if i in finished:
                rows[i] = (images.names[j], images.labels[j], images.displays[j],
                           None if images.object_masks is None else images.object_masks[j], [d[i] for d, _ in done])
                in_progress += 1
    if not rows:
        raise ValueError(f"the audit in {folder!r} has no finished image yet ({doc.get('status')}); rerun the same "
                         f"command to continue it")
    order = sorted(rows)
    names, labels, displays, objects, results = zip(*(rows[i] for i in order))
    has_objects = all(o is not None for o in objects) and bool(doc.get("config", {}).get("object_masks"))
    models = [ModelRecord(name=m["name"], method=m["method"], results=[r[k] for r in results],
                          seconds=seconds[k] if seconds[k] else math.nan, options=m.get("options", {}))
              for k, m in enumerate(doc["models"])]
    return AuditRecord(title=doc.get("title", ""), image_names=list(names), displays=list(displays),
                       labels=list(labels), class_names=class_names, models=models, transfer=None,
                       meta=_meta(folder, doc),
                       object_masks=list(objects) if has_objects else None,
                       partial=_covered(doc, len(order), len(committed), in_progress))


def _meta(folder: str, doc: dict) -> dict:
    """The report's run table of a partial audit: its status, the command that resumes it (an audit started by the
    command line, which stores its options), and the options it was started with."""
    meta = {"status": doc.get("status")}
    stored = doc.get("command")
    if stored:
        meta["resume with"] = resume_command(folder)
        meta["options"] = stored
    return meta


def _covered(doc: dict, shown: int, committed: int, in_progress: int) -> str:
    """What a partial record covers, in words."""
    chunks = len(store.chunk_ranges(doc["n_images"], doc["chunk_size"]))
    more = f", and {in_progress} images finished in chunks in progress" if in_progress else ""
    return (f"{shown} of {doc['n_images']} images ({committed} of {chunks} chunks committed{more}; the audit is "
            f"{doc.get('status')})")


def partial_note(folder: str) -> str | None:
    """What the report of ``folder`` covers when the audit is not complete ("a partial audit: 12 of 60 images
    ..."), else None; None too for a folder that is not a stored audit's."""
    try:
        doc = store.read_doc(folder)
    except ValueError:
        return None
    if doc is None or doc.get("status") == "complete" or "chunk_size" not in doc:
        return None
    n_models = len(doc["models"])
    committed = store.committed_chunks(folder)
    ranges = store.chunk_ranges(doc["n_images"], doc["chunk_size"])
    images = sum(b - a for c, (a, b) in enumerate(ranges) if c in committed)
    more = sum(len(work.in_progress(folder, c, n_models).done()) for c in work.chunks_in_progress(folder)
               if c not in committed)
    return f"a partial audit: {_covered(doc, images + more, len(committed), more)}"


__all__ = ["load_partial", "partial_note"]
