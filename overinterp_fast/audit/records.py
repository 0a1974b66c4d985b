"""Machine-readable audit results: what a report is built from, saved so it can be rebuilt without recomputing.

An audit folder holds

- ``results.json``: the run's metadata, the images (names, labels), and per model
  its per-image results (target, score, threshold, SIS, order, values, blocks, SIS
  score, collection) and the transfer table;
- ``images.npz``: the images as shown to a person (uint8, [H, W] or [H, W, 3]),
  one array per image, keyed ``image<i>``;
- ``sis.parquet``: one row per (model, image) with the per-image facts (class,
  correctness, SIS size and fraction, border and object shares), for data-frame
  tools; :mod:`overinterp_fast.audit.table` documents its columns. It is derived:
  ``load_audit`` reads only the JSON and the images.

The format is plain JSON (lists of ints and floats), readable from any language;
``format_version`` guards against reading a future layout silently.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..results import SISResult

FORMAT_VERSION = 1
RESULTS_FILE = "results.json"
IMAGES_FILE = "images.npz"


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
            summary: {"sigma", "a_fg", "a_bg", "rfs", "irfs"} (accuracies against ``reference``).
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


def _float(x: float | None) -> float | None:
    """JSON has no NaN or inf: they become None."""
    return None if x is None or not math.isfinite(x) else float(x)


def _ints(t: torch.Tensor | None) -> list[int] | None:
    return None if t is None else [int(v) for v in t.tolist()]


def result_to_dict(r: SISResult) -> dict:
    """A result as JSON-ready lists (the mask is stored by its shape; it is True exactly on ``sis``)."""
    d = {
        "target": int(r.target),
        "score": _float(r.score),
        "threshold": _float(r.threshold),
        "order": _ints(r.order),
        "values": [_float(v) for v in r.values.tolist()],
        "sis": _ints(r.sis),
        "mask_shape": None if r.mask is None else list(r.mask.shape),
        "blocks": _ints(r.blocks),
        "sis_score": _float(r.sis_score),
        "queries": r.queries,
    }
    if r.collection is not None:
        # the first SIS of a collection is the result itself: stored as null
        d["collection"] = [None if c is r else result_to_dict(c) for c in r.collection]
    return d


def result_from_dict(d: dict) -> SISResult:
    """Inverse of :func:`result_to_dict`."""
    sis = None if d["sis"] is None else torch.tensor(d["sis"], dtype=torch.int64)
    mask = None
    if d["mask_shape"] is not None:
        mask = torch.zeros(math.prod(d["mask_shape"]), dtype=torch.bool)
        mask[sis] = True
        mask = mask.view(d["mask_shape"])
    r = SISResult(
        order=torch.tensor(d["order"], dtype=torch.int64),
        values=torch.tensor([math.nan if v is None else v for v in d["values"]], dtype=torch.float64),
        sis=sis,
        mask=mask,
        target=d["target"],
        score=math.nan if d["score"] is None else d["score"],
        threshold=math.nan if d["threshold"] is None else d["threshold"],
        blocks=None if d["blocks"] is None else torch.tensor(d["blocks"], dtype=torch.int64),
        sis_score=d["sis_score"],
        queries=d["queries"],
    )
    if "collection" in d:
        r.collection = [r if c is None else result_from_dict(c) for c in d["collection"]]
    return r


def save_audit(record: AuditRecord, folder: str) -> str:
    """Write ``results.json``, ``images.npz`` and ``sis.parquet`` into ``folder`` (created); returns the JSON's path."""
    from .table import write_table  # table builds on the report's helpers, which import this module

    os.makedirs(folder, exist_ok=True)
    doc = {
        "format_version": FORMAT_VERSION,
        "title": record.title,
        "images": [{"name": n, "label": None if lab is None else int(lab)}
                   for n, lab in zip(record.image_names, record.labels)],
        "class_names": {str(k): v for k, v in sorted(record.class_names.items())},
        "models": [
            {"name": m.name, "method": m.method, "seconds": _float(m.seconds), "options": m.options,
             "results": [result_to_dict(r) for r in m.results], "sensitivity": m.sensitivity}
            for m in record.models
        ],
        "transfer": record.transfer,
        "meta": record.meta,
        "object_masks": record.object_masks is not None,
    }
    path = os.path.join(folder, RESULTS_FILE)
    with open(path, "w") as fh:
        json.dump(doc, fh)
    arrays = {f"image{i}": np.asarray(d, dtype=np.uint8) for i, d in enumerate(record.displays)}
    for i, m in enumerate(record.object_masks or []):
        arrays[f"object{i}"] = np.asarray(m, dtype=bool)
    np.savez_compressed(os.path.join(folder, IMAGES_FILE), **arrays)
    write_table(record, folder)
    return path


def load_audit(folder: str) -> AuditRecord:
    """Read an audit folder written by :func:`save_audit`."""
    path = os.path.join(folder, RESULTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {RESULTS_FILE} in {folder!r}: not an audit folder")
    with open(path) as fh:
        doc = json.load(fh)
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {version!r}; this overinterp_fast reads {FORMAT_VERSION}")
    with np.load(os.path.join(folder, IMAGES_FILE)) as npz:
        displays = [npz[f"image{i}"] for i in range(len(doc["images"]))]
        objects = [npz[f"object{i}"] for i in range(len(doc["images"]))] if doc.get("object_masks") else None
    return AuditRecord(
        title=doc["title"],
        image_names=[im["name"] for im in doc["images"]],
        displays=displays,
        labels=[im["label"] for im in doc["images"]],
        class_names={int(k): v for k, v in doc["class_names"].items()},
        models=[
            ModelRecord(name=m["name"], method=m["method"],
                        results=[result_from_dict(r) for r in m["results"]],
                        seconds=math.nan if m["seconds"] is None else m["seconds"], options=m["options"],
                        sensitivity=m.get("sensitivity"))
            for m in doc["models"]
        ],
        transfer=doc["transfer"],
        meta=doc["meta"],
        object_masks=objects,
    )
