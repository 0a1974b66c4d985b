"""An audit as one table: a row per (model, image), for pandas, polars, DuckDB or Spark.

    table = audit_table(record)                   # pyarrow.Table
    write_table(record, "out/audit/sis.parquet")  # save_audit writes it as well
    pandas.read_parquet("out/audit/sis.parquet")

Columns (null where a value does not exist: no label, no SIS, no object masks):

=================  ========  ==============================================================
model, method      string    the model's name; "exact", "gradient" or "responsibility"
image              string    the image's name
image_index        int32     its position in the audit
label, label_name  int64     the true class where known, and its name
target, ...name    int64     the model's class on the full image, and its name
correct            bool      target == label (null without a label)
score              float64   f(x) for the target on the full image
threshold          float64   tau
sis_size           int64     features in the (first) SIS
sis_fraction       float64   sis_size / features
sis_score          float64   f on the SIS alone (the verification pass)
collection_size    int32     disjoint SIS found (1 without collection=True; 0 without SIS)
queries            int64     forward passes of the ranking's maps (responsibility), else null
total_queries      int64     every forward pass of the set: maps, extraction, pruning (responsibility)
size_before_refine int64     refine=True: the boundary prefix's size before pruning, else null
minimal            bool      refine=True: the set is certified 1-minimal (False: not fully pruned)
border_fraction    float64   share of the SIS pixels in the outer 10% border (pixel SIS only)
object_fraction    float64   share of the SIS pixels on the object (with object masks)
=================  ========  ==============================================================
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import os

import numpy as np

from ..methods.results_io import arrow_type, result_fields
from .metrics import border_fractions, correctness, inside_fractions
from .records import AuditRecord
from .store import TABLE_FILE


def _nullable(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(v) else float(v) for v in values]


def _schema():
    """Column name -> Arrow type, in table order."""
    import pyarrow as pa

    string, f64, i64, i32 = pa.string(), pa.float64(), pa.int64(), pa.int32()
    per_result = {k: arrow_type(k) for k in _RESULT_COLUMNS}  # the columns every SISResult table shares
    return {"model": string, "method": string, "image": string, "image_index": i32, "label": i64,
            "label_name": string, "target": i64, "target_name": string, "correct": pa.bool_(),
            **{k: v for k, v in per_result.items() if k != "target"}, "border_fraction": f64, "object_fraction": f64}


# the columns of overinterp_fast.methods.results_io.result_fields that the table keeps, in table order
_RESULT_COLUMNS = ("target", "score", "threshold", "sis_size", "sis_fraction", "sis_score", "collection_size",
                   "queries", "total_queries", "size_before_refine", "minimal")


def audit_table(record: AuditRecord, first_index: int = 0):
    """The audit as a ``pyarrow.Table``, one row per (model, image), models in order, then images.

    ``first_index``: the audit position of the record's first image (a chunk's table)."""
    import pyarrow as pa

    schema = _schema()
    cols: dict[str, list] = {k: [] for k in schema}
    n = len(record.image_names)
    for m in record.models:
        border = _nullable(border_fractions(record, m))
        objects = ([None] * n if record.object_masks is None
                   else _nullable(inside_fractions(record, m, record.object_masks)))
        for i, (r, right) in enumerate(zip(m.results, correctness(record, m))):
            label = record.labels[i]
            cols["model"].append(m.name)
            cols["method"].append(m.method)
            cols["image"].append(record.image_names[i])
            cols["image_index"].append(first_index + i)
            cols["label"].append(label)
            cols["label_name"].append(None if label is None else record.class_name(label))
            cols["target_name"].append(record.class_name(r.target))
            cols["correct"].append(right)
            fields = result_fields(r)
            for k in _RESULT_COLUMNS:
                cols[k].append(fields[k])
            cols["border_fraction"].append(border[i])
            cols["object_fraction"].append(objects[i])
    return pa.table({k: pa.array(v, type=schema[k]) for k, v in cols.items()})


def table_schema():
    """The ``pyarrow.Schema`` of :func:`audit_table` (for writing the table chunk by chunk)."""
    import pyarrow as pa

    return pa.schema(list(_schema().items()))


def write_table(record: AuditRecord, path: str) -> str:
    """Write :func:`audit_table` as Parquet to ``path`` (a file, or a folder to hold ``sis.parquet``)."""
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        path = os.path.join(path, TABLE_FILE)
    pq.write_table(audit_table(record), path)
    return path
