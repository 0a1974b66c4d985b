"""Machine-readable audit results: what a report is built from, saved so it can be rebuilt without recomputing.

An audit folder is the durable store of :mod:`overinterp_fast.audit.store`:

- ``results.json``: the configuration, the run's metadata and the aggregates (per
  model its method, options, seconds and noise sensitivity; the transfer table;
  class names);
- ``parts/``: per chunk of images, a Parquet part with the images (names, labels,
  displays as uint8, object masks) and one with the per-image results (target,
  score, threshold, order, values, blocks, SIS, SIS score, collection) in binary
  Arrow columns;
- ``sis.parquet``: one row per (model, image) with the per-image facts (class,
  correctness, SIS size and fraction, border and object shares), for data-frame
  tools; :mod:`overinterp_fast.audit.table` documents its columns. It is derived:
  ``load_audit`` reads only results.json and the parts.

``format_version`` guards against reading a future layout silently.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..methods.results import SISResult
from . import store
from .store import FORMAT_VERSION, RESULTS_FILE  # noqa: F401  (re-exported)
from .table import write_table


@dataclass
class ModelRecord:
    """One model's SIS for every image of an audit.

    Attributes:
        name: how the report names the model.
        method: "exact", "gradient" or "responsibility".
        results: one :class:`SISResult` per image (collections included when computed).
        seconds: wall time of the SIS computation.
        options: the options it ran with (k, threshold mode, ...), for the record.
        sensitivity: with object masks, :func:`~overinterp_fast.audit.stats.noise_sensitivity`'s
            summary: {"sigma" (pixel units), "a_fg", "a_bg", "rfs", "irfs"} (accuracies against ``reference``).
    """

    name: str
    method: str
    results: list[SISResult]
    seconds: float = float("nan")
    options: dict[str, Any] = field(default_factory=dict)
    sensitivity: dict[str, Any] | None = None

    @property
    def predictions(self) -> list[int]:
        return [r.target for r in self.results]

    def __repr__(self) -> str:
        found = [r.fraction for r in self.results if r.sis is not None]
        median = "" if not found else f", median SIS {float(np.median(found)):.1%}"
        return (f"ModelRecord({self.name!r}, {self.method}: {len(found)} of {len(self.results)} images with a SIS"
                f"{median}, {self.seconds:.3g} s)")


@dataclass
class AuditRecord:
    """Everything a report shows.

    Attributes:
        title: the report's heading.
        image_names: one name per image.
        displays: the images as a person sees them: uint8 arrays [H, W] or [H, W, 3],
            on the same pixel grid as the SIS masks.
        labels: the true class of each image where known (None: unknown).
        class_names: names of the classes that occur (predicted or true), by index.
        models: one :class:`ModelRecord` per model (an ensemble is one more model).
        transfer: optional table of model B's accuracy on model A's pixel subsets:
            {"fraction": f, "rows": [A names], "cols": [B names], "accuracy": [[...]],
            "reference": "labels" | "full-image predictions"}.
        meta: free-form facts (versions, device, date, command line, timings).
        object_masks: bool [H, W] per image, True on the object, where given (None: no masks).
    """

    title: str
    image_names: list[str]
    displays: list[np.ndarray]
    labels: list[int | None]
    class_names: dict[int, str]
    models: list[ModelRecord]
    transfer: dict | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    object_masks: list[np.ndarray] | None = None

    def __post_init__(self):
        n = len(self.image_names)
        if self.object_masks is not None and len(self.object_masks) != n:
            raise ValueError(f"{len(self.object_masks)} object masks for {n} images")
        if len(self.displays) != n or len(self.labels) != n:
            raise ValueError(f"{n} image names, {len(self.displays)} displays and {len(self.labels)} labels")
        for m in self.models:
            if len(m.results) != n:
                raise ValueError(f"model {m.name!r} has {len(m.results)} results for {n} images")

    def class_name(self, index: int | None) -> str:
        if index is None:
            return "-"
        return self.class_names.get(int(index), str(int(index)))

    def __repr__(self) -> str:
        known = sum(lab is not None for lab in self.labels)
        extras = [s for s, on in (("transfer", self.transfer is not None),
                                  ("object masks", self.object_masks is not None)) if on]
        return (f"AuditRecord({self.title!r}: {len(self.image_names)} images ({known} labelled), "
                f"models {[m.name for m in self.models]}{''.join(', ' + e for e in extras)})")

    def _repr_html_(self) -> str:
        """Per model, for notebooks: method, images with a SIS, median SIS size, seconds."""
        import html

        rows = []
        for m in self.models:
            found = [r.fraction for r in m.results if r.sis is not None]
            median = "-" if not found else f"{float(np.median(found)):.1%}"
            cells = (m.name, m.method, f"{len(found)} of {len(m.results)}", median, f"{m.seconds:.3g}")
            rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        head = "".join(f"<th>{h}</th>" for h in ("model", "method", "with a SIS", "median SIS", "seconds"))
        return (f"<table><caption>{html.escape(self.title)}: {len(self.image_names)} images</caption>"
                f"<tr>{head}</tr>{''.join(rows)}</table>")


def _float(x: float | None) -> float | None:
    """JSON has no NaN or inf: they become None."""
    return None if x is None or not math.isfinite(x) else float(x)


def model_entries(models: list[ModelRecord]) -> list[dict]:
    """The models as results.json lists them (name, method, seconds, options, sensitivity)."""
    return [{"name": m.name, "method": m.method, "seconds": _float(m.seconds), "options": m.options,
             "sensitivity": m.sensitivity} for m in models]


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
                       store.results_table([m.results for m in record.models], range(n)))
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
    for images, per_model, _, _ in iter_chunks(folder, doc):
        names += images.names
        labels += images.labels
        displays += images.displays
        objects += images.object_masks or []
        for acc, res in zip(results, per_model):
            acc += res
    return AuditRecord(
        title=doc["title"], image_names=names, displays=displays, labels=labels,
        class_names={int(k): v for k, v in doc["class_names"].items()},
        models=[ModelRecord(name=m["name"], method=m["method"], results=res,
                            seconds=math.nan if m["seconds"] is None else m["seconds"], options=m["options"],
                            sensitivity=m.get("sensitivity")) for m, res in zip(doc["models"], results)],
        transfer=doc["transfer"], meta=doc["meta"], object_masks=objects if doc.get("object_masks") else None,
    )
