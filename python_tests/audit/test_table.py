"""The audit's one-table view (audit/table.py) on a record written by hand: every column's value and Arrow type,
label names, the responsibility columns, and the schema the stored audit writes chunk by chunk.
test_report.py checks the exact-SIS columns of a computed audit.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import pytest
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.audit.table import audit_table, table_schema, write_table
from overinterp_fast.methods.results import SISResult

TYPES = {"model": pa.string(), "method": pa.string(), "image": pa.string(), "image_index": pa.int32(),
         "label": pa.int64(), "label_name": pa.string(), "target": pa.int64(), "target_name": pa.string(),
         "correct": pa.bool_(), "score": pa.float64(), "threshold": pa.float64(), "sis_size": pa.int64(),
         "sis_fraction": pa.float64(), "sis_score": pa.float64(), "collection_size": pa.int32(),
         "queries": pa.int64(), "total_queries": pa.int64(), "size_before_refine": pa.int64(),
         "minimal": pa.bool_(), "border_fraction": pa.float64(), "object_fraction": pa.float64()}


def result(sis, target, **kw) -> SISResult:
    """A 10 x 10 pixel result whose SIS is ``sis`` (pixel ids) or None."""
    mask = None
    if sis is not None:
        mask = torch.zeros(10, 10, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(100), values=torch.zeros(100), target=target, score=0.75, threshold=0.5,
                     sis=None if sis is None else torch.tensor(sis), mask=mask, **kw)


def record() -> AuditRecord:
    displays = [np.zeros((10, 10, 3), np.uint8)] * 3
    # pixel 0 is a corner (border), 55 the centre: a border fraction of 1/2; pixel 19 (row 1, column 9) is on the border too
    resp = [result([0, 55], 2, queries=400, extraction_queries=60, refine_queries=7, size_before_refine=5,
                   minimal=True, sis_score=0.9),
            result([19], 5, queries=300, extraction_queries=20, minimal=False, sis_score=0.6),
            result(None, 1, queries=100)]
    objects = [np.zeros((10, 10), bool) for _ in range(3)]
    objects[0][5, 5] = True  # pixel 55
    return AuditRecord("t", ["a", "b", "c"], displays, [2, None, 7], {2: "two", 5: "five", 7: "seven"},
                       [ModelRecord("m", "responsibility", resp)], object_masks=objects)


@pytest.mark.mutation
def test_table_columns_types_and_values_by_hand(tmp_path):
    table = audit_table(record(), first_index=10)
    assert table.schema == table_schema() == pa.schema(list(TYPES.items()))
    rows = table.to_pylist()
    assert [(r["image"], r["image_index"], r["label"], r["label_name"]) for r in rows] == [
        ("a", 10, 2, "two"), ("b", 11, None, None), ("c", 12, 7, "seven")]
    assert [(r["target"], r["target_name"], r["correct"]) for r in rows] == [
        (2, "two", True), (5, "five", None), (1, "1", False)]
    assert [(r["queries"], r["total_queries"], r["size_before_refine"], r["minimal"]) for r in rows] == [
        (400, 467, 5, True), (300, 320, None, False), (100, 100, None, None)]
    assert [(r["sis_size"], r["sis_fraction"], r["sis_score"], r["collection_size"]) for r in rows] == [
        (2, 0.02, 0.9, 1), (1, 0.01, 0.6, 1), (None, None, None, 0)]
    assert [(r["border_fraction"], r["object_fraction"]) for r in rows] == [(0.5, 0.5), (1.0, 0.0), (None, None)]
    assert all((r["model"], r["method"], r["score"], r["threshold"]) == ("m", "responsibility", 0.75, 0.5)
               for r in rows)
    path = write_table(record(), str(tmp_path))  # a folder: sis.parquet inside
    assert path == str(tmp_path / "sis.parquet")
    back = pq.read_table(path)
    assert back.schema.equals(pa.schema(list(TYPES.items()))) and back.to_pylist()[0]["image_index"] == 0
    assert write_table(record(), str(tmp_path / "x.parquet")) == str(tmp_path / "x.parquet")
