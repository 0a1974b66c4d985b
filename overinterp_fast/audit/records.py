"""Machine-readable audit results: what a report is built from (the data only; :mod:`.persist` saves a record
as an audit folder and reads it back, so it can be rebuilt without recomputing).

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

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..methods.results import SISResult


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
        subsets: for a backward-selection method over the pixels, the model on its own pixel subsets
            (:func:`~overinterp_fast.audit.own_subsets.subset_summary`: accuracy on the full images, on the 5%
            backward-selection subsets and on random 5%, mean confidence on each); else None.
        subset_columns: the per-image columns that summary is made of ({"backselect_class", "backselect_score",
            "random_class", "random_score"}: int64 / float64 [N], :mod:`~overinterp_fast.audit.own_subsets`), or
            None.
    """

    name: str
    method: str
    results: list[SISResult]
    seconds: float = float("nan")
    options: dict[str, Any] = field(default_factory=dict)
    sensitivity: dict[str, Any] | None = None
    subsets: dict[str, Any] | None = None
    subset_columns: dict[str, np.ndarray] | None = None

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
        partial: for an audit read back before it completed (:mod:`overinterp_fast.audit.partial`), what it covers,
            e.g. "12 of 60 images"; None for a complete one.
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
    partial: str | None = None

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
        part = f", partial: {self.partial}" if self.partial else ""
        return (f"AuditRecord({self.title!r}: {len(self.image_names)} images ({known} labelled), "
                f"models {[m.name for m in self.models]}{''.join(', ' + e for e in extras)}{part})")

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


