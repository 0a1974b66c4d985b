"""The durable audit store: one folder, committed chunk by chunk, that a crashed or sharded run continues.

Layout of an audit folder::

    results.json                       configuration (what fixes every result), status, and once the
                                       audit is complete its metadata and aggregates (transfer table,
                                       noise sensitivity, seconds per model, class names)
    parts/c000012.images.parquet       chunk 12's images: index, name, label, display (uint8 bytes),
                                       object mask (packed bits)
    parts/c000012.results.parquet      chunk 12's results: a row per (model, image, SIS round) with the
                                       order, values, blocks and SIS as Arrow int64/float64 lists;
                                       chunk aggregates (seconds, transfer counts) in its key-value metadata
    parts/c000013.work/                a chunk in progress: its finished images and exact SIS's state
                                       (:mod:`overinterp_fast.audit.work`), removed by its commit
    sis.parquet                        one row per (model, image), written when the audit completes
    report.html

Why Parquet part files (and not SQLite or DuckDB): a chunk is written once and never updated, so
the store needs atomic appends, not transactions. A part is written under a temporary name, flushed
to disk (fsync) and renamed into place; rename is atomic on POSIX file systems, so a part either
exists whole or not at all, whatever the moment of a kill. The chunk's results part is renamed last:
it is the commit. Every rank of a torchrun job writes its own parts into the shared folder with no
lock and no database server (SQLite locking is unreliable on NFS and Lustre, DuckDB allows one
writer process). Arrow list columns store a 299x299 order (89,401 int64) as 700 KB of binary
column data; pyarrow, pandas, polars and DuckDB read the parts directly.

Chunk grouping is fixed by the configuration (``chunk_size``): chunk c holds images
[c * chunk_size, (c + 1) * chunk_size). Float32 results depend on which images share a batch,
so the same chunks give bit-identical results whatever the world size or how often the run resumed.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import json
import os
import re
import shutil
import signal
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..errors import ConfigMismatch
from ..methods.results import SISResult
from ..methods.results_io import list_array as _list_array
from ..util.files import TEMP_MARK, atomic_write, write_json  # noqa: F401  (write_json: store.write_json)

FORMAT_VERSION = 2
RESULTS_FILE = "results.json"
PARTS_DIR = "parts"
TABLE_FILE = "sis.parquet"
REPORT_FILE = "report.html"
CRASH_ENV = "OVERINTERP_FAST_CRASH_AT"  # test hook: "<chunk>:<stage>" kills this process there (SIGKILL)
COMMIT_STAGES = ("written", "images", "committed")
_PART = re.compile(r"^c(\d{6,})\.results\.parquet$")


# ----------------------------------------------------------------------------------------------
# Commits


def _crash_hook(chunk: int, stage: str) -> None:
    """Test hook: with ``OVERINTERP_FAST_CRASH_AT=<chunk>:<stage>``, die by SIGKILL at that point of a commit."""
    spec = os.environ.get(CRASH_ENV)
    if spec and spec == f"{chunk}:{stage}":
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------
# Results <-> Arrow columns


def _lists(column) -> list[np.ndarray | None]:
    """Inverse of :func:`_list_array` on a (chunked) column: per row a numpy array, or None."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy()
    values = arr.values.to_numpy(zero_copy_only=False)
    nulls = arr.is_null().to_numpy(zero_copy_only=False)
    return [None if nulls[i] else values[offsets[i]:offsets[i + 1]] for i in range(len(arr))]


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().cpu().numpy()


def _result_schema():
    import pyarrow as pa

    i32, i64, f64, b = pa.int32(), pa.int64(), pa.float64(), pa.bool_()
    return {"model_index": i32, "image_index": i64, "round": i32, "target": i64, "score": f64, "threshold": f64,
            "order": pa.large_list(i64), "values": pa.large_list(f64), "sis": pa.large_list(i64),
            "mask_shape": pa.large_list(i64), "blocks": pa.large_list(i64), "sis_score": f64, "queries": i64,
            "collection": i32, "first_in_collection": b, "fg_correct": b, "bg_correct": b, "p_fg": f64, "p_bg": f64,
            **{k: i64 for k in _COUNTS}, "minimal": b,
            **{k: i64 if np.dtype(t).kind == "i" else f64 for k, t in OWN_SUBSET_COLUMNS.items()}}


# method="responsibility" and refined sets: SISResult's query counts and refinement fields, null where unset.
# Parts written before these columns existed read back with them None.
_COUNTS = ("extraction_queries", "refine_queries", "size_before_refine")
# Per-image columns of round 0, null where not computed: the noise sensitivity (with object masks) and the model on
# its own pixel subsets (backward-selection methods; parts written before these were stored read back without them).
SENSITIVITY_COLUMNS = {"fg_correct": bool, "bg_correct": bool, "p_fg": float, "p_bg": float}
OWN_SUBSET_COLUMNS = {"backselect_class": np.int64, "backselect_score": np.float64, "random_class": np.int64,
                      "random_score": np.float64}
_PER_IMAGE = {**SENSITIVITY_COLUMNS, **OWN_SUBSET_COLUMNS}


def results_table(per_model: Sequence[Sequence[SISResult]], image_indices: Sequence[int],
                  sensitivity: Sequence[dict | None] | None = None, meta: dict | None = None):
    """A chunk's results as a ``pyarrow.Table``: a row per (model, image, SIS round).

    Round 0 is the image's result; its ``collection`` column holds ``len(result.collection)``
    (null without a collection) and ``first_in_collection`` whether ``collection[0]`` is the result
    itself. Rounds 1, 2, ... are the other members of the collection, in order.
    ``sensitivity[m]``: the model's per-image columns or None: {"fg_correct", "bg_correct" bool [n], "p_fg",
    "p_bg" float [n]} (noise sensitivity, with object masks) and/or the own-subset columns {"backselect_class",
    "backselect_score", "random_class", "random_score"} (:mod:`overinterp_fast.audit.own_subsets`).
    ``meta`` (JSON) goes into the table's metadata.
    """
    import pyarrow as pa

    schema = _result_schema()
    rows: dict[str, list] = {k: [] for k in schema}
    for m, results in enumerate(per_model):
        sens = None if sensitivity is None else sensitivity[m]
        for j, (idx, r) in enumerate(zip(image_indices, results)):
            coll = r.collection
            first = coll is not None and len(coll) > 0 and coll[0] is r
            rounds = [r] + ([] if coll is None else [c for c in coll if c is not r])
            for k, c in enumerate(rounds):
                rows["model_index"].append(m)
                rows["image_index"].append(int(idx))
                rows["round"].append(k)
                rows["target"].append(int(c.target))
                rows["score"].append(float(c.score))
                rows["threshold"].append(float(c.threshold))
                rows["order"].append(_np(c.order))
                rows["values"].append(_np(c.values))
                rows["sis"].append(_np(c.sis))
                rows["mask_shape"].append(None if c.mask is None else np.array(c.mask.shape, dtype=np.int64))
                rows["blocks"].append(_np(c.blocks))
                rows["sis_score"].append(None if c.sis_score is None else float(c.sis_score))
                rows["queries"].append(c.queries)
                for key in (*_COUNTS, "minimal"):
                    rows[key].append(getattr(c, key))
                top = k == 0
                rows["collection"].append(len(coll) if top and coll is not None else None)
                rows["first_in_collection"].append(first if top else None)
                for key in _PER_IMAGE:
                    rows[key].append(None if sens is None or not top or key not in sens else sens[key][j].item())
    cols = {}
    for k, t in schema.items():
        cols[k] = _list_array(rows[k], t.value_type) if pa.types.is_large_list(t) else pa.array(rows[k], type=t)
    table = pa.table(cols)
    return table.replace_schema_metadata({"overinterp_fast": json.dumps(meta or {})})


def _result(row: dict, lists: dict[str, np.ndarray | None]) -> SISResult:
    sis = None if lists["sis"] is None else torch.from_numpy(lists["sis"].copy())
    mask = None
    if lists["mask_shape"] is not None:
        shape = [int(s) for s in lists["mask_shape"]]
        mask = torch.zeros(int(np.prod(shape)), dtype=torch.bool)
        mask[sis] = True
        mask = mask.view(shape)
    return SISResult(order=torch.from_numpy(lists["order"].copy()), values=torch.from_numpy(lists["values"].copy()),
                     sis=sis, mask=mask, target=int(row["target"]), score=float(row["score"]),
                     threshold=float(row["threshold"]),
                     blocks=None if lists["blocks"] is None else torch.from_numpy(lists["blocks"].copy()),
                     sis_score=row["sis_score"], queries=row["queries"],
                     **{k: row.get(k) for k in (*_COUNTS, "minimal")})


def results_from_table(table, n_models: int) -> tuple[list[int], list[list[SISResult]], list[dict | None]]:
    """Inverse of :func:`results_table`: (image indices, per model its results in image order, per model
    the per-image columns or None: the sensitivity columns and the own-subset columns, each group where stored)."""
    scalar = table.drop_columns(["order", "values", "sis", "mask_shape", "blocks"]).to_pydict()
    lists = {k: _lists(table.column(k)) for k in ("order", "values", "sis", "mask_shape", "blocks")}
    per_model: list[dict[int, SISResult]] = [dict() for _ in range(n_models)]
    extra: dict[tuple[int, int], list[SISResult]] = {}
    meta: dict[tuple[int, int], tuple] = {}
    sens_rows: list[dict[int, dict]] = [dict() for _ in range(n_models)]
    for i in range(table.num_rows):
        row = {k: v[i] for k, v in scalar.items()}
        r = _result(row, {k: v[i] for k, v in lists.items()})
        key = (row["model_index"], row["image_index"])
        if row["round"] == 0:
            per_model[key[0]][key[1]] = r
            meta[key] = (row["collection"], row["first_in_collection"])
            sens_rows[key[0]][key[1]] = {k: row.get(k) for k in _PER_IMAGE}
        else:
            extra.setdefault(key, []).append(r)  # rows are written in round order
    for (m, idx), (size, first) in meta.items():
        if size is not None:
            r = per_model[m][idx]
            r.collection = ([r] if first else []) + extra.get((m, idx), [])
    indices = sorted(per_model[0]) if per_model else []
    results = [[d[i] for i in indices] for d in per_model]
    sens = []
    for d in sens_rows:
        cols = {}
        for group in (SENSITIVITY_COLUMNS, OWN_SUBSET_COLUMNS):  # a group where every image of the chunk has it
            if indices and all(d[i][k] is not None for i in indices for k in group):
                cols.update({k: np.array([d[i][k] for i in indices], dtype=t) for k, t in group.items()})
        sens.append(cols or None)
    return indices, results, sens


def images_table(indices: Sequence[int], names: Sequence[str], labels: Sequence[int | None],
                 displays: Sequence[np.ndarray], object_masks: Sequence[np.ndarray] | None = None):
    """A chunk's images as a ``pyarrow.Table``: index, name, label, the display (uint8 bytes and shape)
    and the object mask (packed bits, same grid) where given."""
    import pyarrow as pa

    displays = [np.ascontiguousarray(d, dtype=np.uint8) for d in displays]
    return pa.table({
        "image_index": pa.array([int(i) for i in indices], type=pa.int64()),
        "name": pa.array(list(names), type=pa.string()),
        "label": pa.array([None if lab is None else int(lab) for lab in labels], type=pa.int64()),
        "display": pa.array([d.tobytes() for d in displays], type=pa.binary()),
        "display_shape": _list_array([np.array(d.shape, np.int64) for d in displays], pa.int64()),
        "object_mask": pa.array(
            [None] * len(displays) if object_masks is None
            else [np.packbits(np.asarray(o, dtype=bool).ravel()).tobytes() for o in object_masks],
            type=pa.binary()),
    })


@dataclass
class ChunkImages:
    """A chunk's images read back: indices, names, labels, displays and object masks (None without)."""

    indices: list[int]
    names: list[str]
    labels: list[int | None]
    displays: list[np.ndarray]
    object_masks: list[np.ndarray] | None


def images_from_table(table) -> ChunkImages:
    d = table.drop_columns(["display_shape"]).to_pydict()
    shapes = _lists(table.column("display_shape"))
    displays = [np.frombuffer(b, dtype=np.uint8).reshape(tuple(int(s) for s in shp)) for b, shp in
                zip(d["display"], shapes)]
    objects = None
    if d["object_mask"] and d["object_mask"][0] is not None:
        objects = [np.unpackbits(np.frombuffer(b, np.uint8), count=int(np.prod(x.shape[:2]))).astype(bool)
                   .reshape(x.shape[:2]) for b, x in zip(d["object_mask"], displays)]
    return ChunkImages(d["image_index"], d["name"], d["label"], displays, objects)


# ----------------------------------------------------------------------------------------------
# The folder


def part_path(folder: str, chunk: int, kind: str) -> str:
    return os.path.join(folder, PARTS_DIR, f"c{chunk:06d}.{kind}.parquet")


def commit_chunk(folder: str, chunk: int, images, results) -> None:
    """Commit one chunk: write its images part, then its results part (the commit), each atomically.

    A kill at any moment leaves either no results part (the chunk is redone on resume; a stray
    images part or temporary file is overwritten or removed) or a complete one. ``folder`` must exist: when it
    was removed meanwhile, the commit fails (FileNotFoundError) instead of starting a new folder without the
    audit's configuration."""
    import pyarrow.parquet as pq

    try:
        os.mkdir(os.path.join(folder, PARTS_DIR))  # in the folder, which must exist: a removed one is not made again
    except FileExistsError:
        pass
    atomic_write(part_path(folder, chunk, "images"), lambda tmp: pq.write_table(images, tmp))
    _crash_hook(chunk, "images")

    def write_results(tmp):
        pq.write_table(results, tmp)
        _crash_hook(chunk, "written")

    atomic_write(part_path(folder, chunk, "results"), write_results)
    _crash_hook(chunk, "committed")


def committed_chunks(folder: str) -> set[int]:
    """The chunks whose results part exists (committed)."""
    try:
        names = os.listdir(os.path.join(folder, PARTS_DIR))
    except (FileNotFoundError, NotADirectoryError):  # no chunk yet, or the folder was removed
        return set()
    return {int(m.group(1)) for f in names if (m := _PART.match(f))}


def read_chunk(folder: str, chunk: int, n_models: int):
    """(ChunkImages, per-model results, per-model sensitivity columns, chunk metadata) of a committed chunk."""
    import pyarrow.parquet as pq

    results = pq.read_table(part_path(folder, chunk, "results"))
    images = images_from_table(pq.read_table(part_path(folder, chunk, "images")))
    indices, per_model, sens = results_from_table(results, n_models)
    if indices != images.indices:
        raise ValueError(f"{folder}: chunk {chunk}'s results and images parts cover different images")
    meta = json.loads((results.schema.metadata or {}).get(b"overinterp_fast", b"{}"))
    return images, per_model, sens, meta


def chunk_meta(folder: str, chunk: int) -> dict:
    """A committed chunk's metadata (seconds per model, transfer counts), without reading its rows."""
    import pyarrow.parquet as pq

    md = pq.read_schema(part_path(folder, chunk, "results")).metadata or {}
    return json.loads(md.get(b"overinterp_fast", b"{}"))


def read_doc(folder: str) -> dict | None:
    path = os.path.join(folder, RESULTS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        doc = json.load(fh)
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {version!r}; this overinterp_fast reads {FORMAT_VERSION}")
    return doc


def differing_keys(old: dict, new: dict) -> list[str]:
    """The entries in which two configurations differ: ``new``'s keys in order, then those only ``old`` has."""
    return [k for k in list(new) + [k for k in old if k not in new] if old.get(k) != new.get(k)]


def config_difference(old: dict, new: dict) -> str | None:
    """None when two configurations agree, else one line naming what differs."""
    keys = differing_keys(old, new)
    if not keys:
        return None
    k = keys[0]
    more = f" (and {len(keys) - 1} more: {', '.join(keys[1:])})" if len(keys) > 1 else ""
    return f"{k} is {old.get(k)!r} there, {new.get(k)!r} here{more}"


def check_resumable(folder: str, config: dict, recorded_later: dict | None = None) -> dict | None:
    """The stored document when ``folder`` holds an audit with ``config`` (None: no audit there yet).

    ``recorded_later``: entries that folders written before they were recorded lack, with the value such a
    folder had. Raises :class:`~overinterp_fast.errors.ConfigMismatch` (a ValueError), one line, when it holds
    another configuration."""
    doc = read_doc(folder)
    if doc is None:
        return None
    old, new = _jsonable({**(recorded_later or {}), **doc.get("config", {})}), _jsonable(config)
    diff = config_difference(old, new)
    if diff:
        raise ConfigMismatch(f"{folder!r} holds an audit with another configuration: {diff}; rerun with --restart "
                             f"to start over, or choose another --out", folder, differing_keys(old, new)[0])
    return doc


def _jsonable(x: Any) -> Any:
    """What ``x`` becomes after a JSON round trip (tuples become lists), so configurations compare alike."""
    return json.loads(json.dumps(x, default=str))


def clear(folder: str) -> None:
    """Remove what an audit wrote into ``folder`` (parts, results, table, report); other files stay."""
    shutil.rmtree(os.path.join(folder, PARTS_DIR), ignore_errors=True)
    for f in (RESULTS_FILE, TABLE_FILE, REPORT_FILE):
        if os.path.exists(os.path.join(folder, f)):
            os.remove(os.path.join(folder, f))


def remove_temporaries(folder: str) -> int:
    """Delete the temporary files a killed commit left (``*.tmp-<pid>-<thread>``); returns how many."""
    parts = os.path.join(folder, PARTS_DIR)
    gone = 0
    for base in (folder, parts):
        if os.path.isdir(base):
            for f in os.listdir(base):
                if TEMP_MARK in f:
                    os.remove(os.path.join(base, f))
                    gone += 1
    return gone


def chunk_ranges(n_images: int, chunk_size: int) -> list[tuple[int, int]]:
    """[start, stop) of every chunk: fixed by (n_images, chunk_size) only."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be a positive integer, got {chunk_size}")
    return [(s, min(s + chunk_size, n_images)) for s in range(0, n_images, chunk_size)]


def share(pending: Iterable[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s chunks out of the pending ones (sorted), round robin: deterministic for a store state."""
    return sorted(pending)[rank::world]
