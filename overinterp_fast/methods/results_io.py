"""SISResult lists out: an Arrow table or a pandas DataFrame with one row per image, and masks in a .npz file.

    table = sis_table(results)                 # pyarrow.Table: image, target, score, threshold, sis_size, ...
    frame = sis_frame(results)                 # the same rows as a pandas.DataFrame (pyarrow's to_pandas)
    table = sis_table(results, lists=True)     # + order, values, sis, mask (flattened) and mask_shape lists
    save_masks("masks.npz", results)           # bool [N, H, W] masks, has_sis, target, score, threshold
    masks = load_masks("masks.npz")            # one bool tensor [H, W] per image, None where there is no SIS

Columns of :func:`sis_table` (null where a value does not exist: no SIS, a count the method does not keep):

====================  ========  ============================================================================
image                 int64     the result's position in the list
target                int64     the class whose probability is f
score                 float64   f on the full image (the round's start)
threshold             float64   tau
features              int64     features present at the start (the length of ``order``)
sis_size              int64     features in the (first) SIS
sis_fraction          float64   sis_size / features
sis_score             float64   f on the SIS alone (the verification pass)
collection_size       int32     disjoint SIS found (1 without collection=True; 0 without SIS)
queries               int64     forward passes of the ranking's maps (responsibility)
extraction_queries    int64     forward passes of the prefix search (sufficient_subset, responsibility)
refine_queries        int64     forward passes of the pruning (refine=True)
total_queries         int64     the three together
size_before_refine    int64     refine=True: the boundary prefix's size before pruning
minimal               bool      refine=True: certified 1-minimal
rescored              int64     exact SIS with a lower score_dtype: candidates scored again
engine                string    what scored the candidates ("torch", "onnxruntime", "compile")
====================  ========  ============================================================================

With ``lists=True``: ``order`` and ``sis`` (int64 lists), ``values`` (float64 list), ``mask`` (bool list, the
mask flattened in row-major order) and ``mask_shape`` (int64 list); null without a SIS (or, for order and
values, never). The audit's ``sis.parquet`` (:mod:`overinterp_fast.audit.table`) takes its per-result columns
from :func:`result_fields`.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch

from ..util.files import atomic_write, make_parent
from ..util.optional import load
from .results import SISResult

RESULT_TYPES = {  # column -> Arrow type name (pyarrow is imported when a table is made)
    "target": "int64", "score": "float64", "threshold": "float64", "features": "int64", "sis_size": "int64",
    "sis_fraction": "float64", "sis_score": "float64", "collection_size": "int32", "queries": "int64",
    "extraction_queries": "int64", "refine_queries": "int64", "total_queries": "int64",
    "size_before_refine": "int64", "minimal": "bool_", "rescored": "int64", "engine": "string",
}


def _pyarrow(what: str):
    """pyarrow, or :class:`~overinterp_fast.errors.MissingDependency` naming the extra that installs it."""
    return load("pyarrow", "audit", what)


def arrow_type(name: str):
    """The pyarrow type of a column of :data:`RESULT_TYPES`."""
    pa = _pyarrow("an Arrow table of results")

    return getattr(pa, RESULT_TYPES[name])()


def result_fields(r: SISResult) -> dict:
    """One result's scalar columns (:data:`RESULT_TYPES`), as Python values (None where absent)."""
    return {
        "target": int(r.target), "score": float(r.score), "threshold": float(r.threshold),
        "features": int(r.order.numel()), "sis_size": r.size, "sis_fraction": r.fraction,
        "sis_score": None if r.sis_score is None else float(r.sis_score),
        "collection_size": 0 if r.sis is None else len(r.collection or [r]), "queries": r.queries,
        "extraction_queries": r.extraction_queries, "refine_queries": r.refine_queries,
        "total_queries": r.total_queries, "size_before_refine": r.size_before_refine, "minimal": r.minimal,
        "rescored": r.rescored, "engine": r.engine,
    }


def list_array(arrays: Sequence[np.ndarray | None], value_type):
    """An Arrow large-list array from per-row numpy arrays (None: a null row), built from offsets without a copy
    per row."""
    pa = _pyarrow("an Arrow table of results")

    lengths = np.array([0 if a is None else len(a) for a in arrays], dtype=np.int64)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = [a for a in arrays if a is not None]
    flat = np.concatenate(present) if present else np.zeros(0)
    values = pa.array(flat.astype(value_type.to_pandas_dtype(), copy=False), type=value_type)
    mask = pa.array([a is None for a in arrays], type=pa.bool_())
    return pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values, mask=mask)


def _check_results(results) -> list[SISResult]:
    results = list(results)
    bad = next((type(r).__name__ for r in results if not isinstance(r, SISResult)), None)
    if bad is not None:
        raise TypeError(f"expected a list of SISResult, got a {bad} in it")
    return results


def _np(t: torch.Tensor | None, dtype=None) -> np.ndarray | None:
    return None if t is None else t.detach().cpu().reshape(-1).numpy().astype(dtype, copy=False)


def sis_table(results: Sequence[SISResult], lists: bool = False):
    """The results as a ``pyarrow.Table``, one row per result in order (columns: the module docstring).

    Args:
        results: SISResult per image, e.g. what :func:`overinterp_fast.fast_sis` returns.
        lists: add the order, values, SIS and the mask (flattened, with its shape) as list columns.

    Needs pyarrow (the ``audit`` extra; without it, :class:`~overinterp_fast.errors.MissingDependency`).
    """
    pa = _pyarrow("sis_table")

    results = _check_results(results)
    rows = [result_fields(r) for r in results]
    cols = {"image": pa.array(np.arange(len(results), dtype=np.int64))}
    for name in RESULT_TYPES:
        cols[name] = pa.array([row[name] for row in rows], type=arrow_type(name))
    if lists:
        i64, f64 = pa.int64(), pa.float64()
        cols["order"] = list_array([_np(r.order) for r in results], i64)
        cols["values"] = list_array([_np(r.values) for r in results], f64)
        cols["sis"] = list_array([_np(r.sis) for r in results], i64)
        cols["mask"] = list_array([_np(r.mask, bool) for r in results], pa.bool_())
        cols["mask_shape"] = list_array([None if r.mask is None else np.array(r.mask.shape, np.int64)
                                         for r in results], i64)
    return pa.table(cols)


def sis_frame(results: Sequence[SISResult], lists: bool = False):
    """:func:`sis_table` as a ``pandas.DataFrame`` (pyarrow's ``to_pandas``, as ``pandas.read_parquet`` reads the
    audit's table: an integer column with nulls becomes float with NaN, list columns numpy arrays); needs pandas
    (the ``data`` extra) and pyarrow (``audit``): without them, :class:`~overinterp_fast.errors.MissingDependency`
    naming the extra."""
    load("pandas", "data", "sis_frame")
    _pyarrow("sis_frame")
    return sis_table(results, lists).to_pandas()


def save_masks(path: str | os.PathLike, results: Sequence[SISResult]) -> str:
    """Write every result's mask to a compressed ``.npz`` file; returns its path (``.npz`` added when missing).
    Missing folders of the path are created; the file is written whole or not at all
    (:func:`~overinterp_fast.util.files.atomic_write`).

    Arrays: ``masks`` bool [N, *grid] (all False where an image has no SIS), ``has_sis`` bool [N], ``target``
    int64 [N], ``score`` and ``threshold`` float64 [N]. Every mask must have the same shape (the results of one
    batch of images do); with no SIS at all, ``masks`` is [N, 0]."""
    results = _check_results(results)
    shapes = {tuple(r.mask.shape) for r in results if r.mask is not None}
    if len(shapes) > 1:
        raise ValueError(f"the masks have different shapes {sorted(shapes)}; save the results of each shape apart")
    shape = shapes.pop() if shapes else (0,)
    masks = np.zeros((len(results), *shape), dtype=bool)
    for i, r in enumerate(results):
        if r.mask is not None:
            masks[i] = r.mask.detach().cpu().numpy()
    arrays = {"masks": masks, "has_sis": np.array([r.mask is not None for r in results], dtype=bool),
              "target": np.array([r.target for r in results], dtype=np.int64),
              "score": np.array([r.score for r in results], dtype=np.float64),
              "threshold": np.array([r.threshold for r in results], dtype=np.float64)}
    path = os.fspath(path)
    path = path if path.endswith(".npz") else path + ".npz"

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: numpy adds no ".npz" to the temporary name
            np.savez_compressed(fh, **arrays)

    make_parent(path)
    atomic_write(path, write)
    return path


def load_masks(path: str | os.PathLike) -> list[torch.Tensor | None]:
    """The masks :func:`save_masks` wrote: one bool tensor per image (None where it had no SIS)."""
    with np.load(os.fspath(path)) as data:
        missing = {"masks", "has_sis"} - set(data.files)
        if missing:
            raise ValueError(f"{os.fspath(path)!r} holds no SIS masks (no {', '.join(sorted(missing))}); "
                             f"write it with save_masks")
        masks, has = data["masks"], data["has_sis"]
    return [torch.from_numpy(np.array(m, dtype=bool)) if h else None for m, h in zip(masks, has)]
