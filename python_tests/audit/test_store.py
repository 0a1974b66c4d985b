"""The audit store's pieces one by one (audit/store.py): the crash hook, the Arrow tables of results
and images written and read back, the folder's parts, documents and configurations. Expectations are built by
hand; audit/test_stream.py runs the same store end to end (resume, SIGKILL, torchrun).

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import json
import os
import signal
import threading
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from overinterp_fast.audit import store
from overinterp_fast.methods.results import SISResult


class Killed(BaseException):
    """Stands in for the SIGKILL of the crash hook (a BaseException, as a process's death runs no cleanup)."""


@pytest.mark.mutation
def test_crash_hook_kills_only_at_its_chunk_and_stage(monkeypatch):
    kills = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.delenv(store.CRASH_ENV, raising=False)
    store._crash_hook(3, "images")
    monkeypatch.setenv(store.CRASH_ENV, "")
    store._crash_hook(3, "images")
    assert kills == []
    monkeypatch.setenv(store.CRASH_ENV, "3:images")
    for chunk, stage in ((3, "written"), (2, "images"), (33, "images"), (3, "images")):
        store._crash_hook(chunk, stage)
    assert kills == [(os.getpid(), signal.SIGKILL)]


@pytest.mark.mutation
@pytest.mark.parametrize("stage,parts", [
    ("images", ["c000004.images.parquet"]),
    ("written", ["c000004.images.parquet", f"c000004.results.parquet.tmp-{os.getpid()}-{threading.get_native_id()}"]),
    ("committed", ["c000004.images.parquet", "c000004.results.parquet"]),
])
def test_commit_chunk_leaves_whole_parts_at_every_stage(tmp_path, monkeypatch, stage, parts):
    def die(pid, sig):
        raise Killed

    monkeypatch.setattr(os, "kill", die)
    monkeypatch.setenv(store.CRASH_ENV, f"4:{stage}")
    images = pa.table({"image_index": pa.array([8, 9], pa.int64())})
    results = pa.table({"image_index": pa.array([8, 9], pa.int64())})
    with pytest.raises(Killed):
        store.commit_chunk(str(tmp_path), 4, images, results)
    assert sorted(os.listdir(tmp_path / "parts")) == parts
    assert store.committed_chunks(str(tmp_path)) == ({4} if stage == "committed" else set())
    assert store.remove_temporaries(str(tmp_path)) == (stage == "written")
    monkeypatch.delenv(store.CRASH_ENV)
    store.commit_chunk(str(tmp_path), 4, images, results)  # a resumed commit overwrites what is left
    assert sorted(os.listdir(tmp_path / "parts")) == ["c000004.images.parquet", "c000004.results.parquet"]
    assert pq.read_table(store.part_path(str(tmp_path), 4, "results")).equals(results)


def _result(order, values, sis, target, score, threshold, blocks=None, sis_score=None, queries=None, shape=None):
    t = torch.tensor
    mask = None
    if sis is not None:
        mask = torch.zeros(int(np.prod(shape)), dtype=torch.bool)
        mask[t(sis, dtype=torch.int64)] = True
        mask = mask.view(shape)
    return SISResult(order=t(order, dtype=torch.int64), values=t(values, dtype=torch.float64),
                     sis=None if sis is None else t(sis, dtype=torch.int64), mask=mask, target=target, score=score,
                     threshold=threshold, blocks=None if blocks is None else t(blocks, dtype=torch.int64),
                     sis_score=sis_score, queries=queries)


def _models():
    """Two models of two images (indices 7 and 5): collections with and without the result first, no SIS, an
    empty SIS, gradient blocks, queries."""
    a7 = _result([3, 1, 0, 2], [0.9, 0.8, 0.5, 0.1], [2, 0], 4, 0.95, 0.5, sis_score=0.55, shape=(2, 2))
    a7b = _result([1, 3], [0.6, 0.2], [3], 4, 0.6, 0.5, sis_score=0.52, shape=(2, 2))
    a7.collection = [a7, a7b]
    a5 = _result([0, 1, 2, 3], [0.3, 0.2, 0.1, 0.0], None, 1, 0.4, 0.5, shape=(2, 2))
    a5.collection = []
    b7 = _result([2, 0, 1, 3], [0.7, 0.6], [], 0, 0.8, 0.25, blocks=[0, 2, 4], sis_score=0.3, queries=11,
                 shape=(4,))
    b5 = _result([0, 2, 1, 3], [0.4, 0.3], [1, 3], 2, 0.9, 0.25, blocks=[0, 2, 4], sis_score=0.35, queries=7,
                 shape=(4,))
    other = _result([0, 1], [0.5, 0.4], [1], 2, 0.5, 0.25, sis_score=0.4, shape=(4,))
    # refined minimal pixel sets: b7's pruning certified it 1-minimal, b5's ran out of budget
    b7.extraction_queries, b7.refine_queries, b7.size_before_refine, b7.minimal = 6, 9, 3, True
    b5.extraction_queries, b5.refine_queries, b5.size_before_refine, b5.minimal = 4, 0, 2, False
    b5.collection = [other]  # a collection that does not start with the result itself
    return [[a7, a5], [b7, b5]]


SENS = [{"fg_correct": torch.tensor([True, False]), "bg_correct": torch.tensor([False, True]),
         "p_fg": torch.tensor([0.25, 0.5], dtype=torch.float64), "p_bg": torch.tensor([0.75, 0.125],
                                                                                     dtype=torch.float64)}, None]


def assert_same_result(a, b):
    assert torch.equal(a.order, b.order) and a.order.dtype == torch.int64
    assert torch.equal(a.values, b.values) and a.values.dtype == torch.float64
    assert (a.sis is None) == (b.sis is None) and (a.sis is None or torch.equal(a.sis, b.sis))
    assert (a.mask is None) == (b.mask is None) and (a.mask is None or torch.equal(a.mask, b.mask))
    assert (a.blocks is None) == (b.blocks is None) and (a.blocks is None or torch.equal(a.blocks, b.blocks))
    assert (a.target, a.score, a.threshold, a.sis_score, a.queries) == (b.target, b.score, b.threshold,
                                                                         b.sis_score, b.queries)
    assert (a.extraction_queries, a.refine_queries, a.size_before_refine) == (
        b.extraction_queries, b.refine_queries, b.size_before_refine)
    assert a.minimal is b.minimal
    assert type(a.target) is int and type(a.score) is float and type(a.threshold) is float


@pytest.mark.mutation
def test_results_table_rows_by_hand_and_read_back():
    models = _models()
    table = store.results_table(models, [7, 5], SENS, meta={"seconds": [1.5, 2.0]})
    col = lambda k: table.column(k).to_pylist()  # noqa: E731
    # model 0: image 7 (2 rounds), image 5 (1 round, an empty collection); model 1: image 7, image 5 (+1 round)
    assert col("model_index") == [0, 0, 0, 1, 1, 1] and col("image_index") == [7, 7, 5, 7, 5, 5]
    assert col("round") == [0, 1, 0, 0, 0, 1]
    assert col("collection") == [2, None, 0, None, 1, None]
    assert col("first_in_collection") == [True, None, False, False, False, None]
    assert col("target") == [4, 4, 1, 0, 2, 2] and col("score") == [0.95, 0.6, 0.4, 0.8, 0.9, 0.5]
    assert col("threshold") == [0.5, 0.5, 0.5, 0.25, 0.25, 0.25]
    assert col("order") == [[3, 1, 0, 2], [1, 3], [0, 1, 2, 3], [2, 0, 1, 3], [0, 2, 1, 3], [0, 1]]
    assert col("values")[1] == [0.6, 0.2]
    assert col("sis") == [[2, 0], [3], None, [], [1, 3], [1]]
    assert col("mask_shape") == [[2, 2], [2, 2], None, [4], [4], [4]]
    assert col("blocks") == [None, None, None, [0, 2, 4], [0, 2, 4], None]
    assert col("sis_score") == [0.55, 0.52, None, 0.3, 0.35, 0.4]
    assert col("queries") == [None, None, None, 11, 7, None]
    assert col("extraction_queries") == [None, None, None, 6, 4, None]
    assert col("refine_queries") == [None, None, None, 9, 0, None]
    assert col("size_before_refine") == [None, None, None, 3, 2, None]
    assert col("minimal") == [None, None, None, True, False, None]
    assert col("fg_correct") == [True, None, False, None, None, None]
    assert col("bg_correct") == [False, None, True, None, None, None]
    assert col("p_fg") == [0.25, None, 0.5, None, None, None] and col("p_bg") == [0.75, None, 0.125, None, None, None]
    want_types = {"model_index": pa.int32(), "image_index": pa.int64(), "round": pa.int32(), "target": pa.int64(),
                  "score": pa.float64(), "threshold": pa.float64(), "order": pa.large_list(pa.int64()),
                  "values": pa.large_list(pa.float64()), "sis": pa.large_list(pa.int64()),
                  "mask_shape": pa.large_list(pa.int64()), "blocks": pa.large_list(pa.int64()),
                  "sis_score": pa.float64(), "queries": pa.int64(), "collection": pa.int32(),
                  "first_in_collection": pa.bool_(), "fg_correct": pa.bool_(), "bg_correct": pa.bool_(),
                  "p_fg": pa.float64(), "p_bg": pa.float64(), "extraction_queries": pa.int64(),
                  "refine_queries": pa.int64(), "size_before_refine": pa.int64(), "minimal": pa.bool_(),
                  "backselect_class": pa.int64(), "backselect_score": pa.float64(), "random_class": pa.int64(),
                  "random_score": pa.float64()}
    assert {f.name: f.type for f in table.schema} == want_types
    assert col("backselect_class") == [None] * 6 and col("random_score") == [None] * 6  # not given: null
    assert json.loads(table.schema.metadata[b"overinterp_fast"]) == {"seconds": [1.5, 2.0]}
    assert json.loads(store.results_table(models, [7, 5]).schema.metadata[b"overinterp_fast"]) == {}

    indices, back, sens = store.results_from_table(table, 2)
    assert indices == [5, 7]  # image order
    for m, want in enumerate(models):
        for got, w in zip(back[m], want[::-1]):
            assert_same_result(got, w)
            assert (got.collection is None) == (w.collection is None)
            if w.collection is not None:
                assert len(got.collection) == len(w.collection)
                for gc, wc in zip(got.collection, w.collection):
                    assert_same_result(gc, wc)
    a7, a5 = back[0][1], back[0][0]
    assert a7.collection[0] is a7 and a5.collection == []
    assert back[1][0].collection[0] is not back[1][0]
    assert sens[1] is None
    assert sens[0]["fg_correct"].tolist() == [False, True] and sens[0]["fg_correct"].dtype == bool
    assert sens[0]["bg_correct"].tolist() == [True, False] and sens[0]["bg_correct"].dtype == bool
    assert sens[0]["p_fg"].tolist() == [0.5, 0.25] and sens[0]["p_bg"].tolist() == [0.125, 0.75]
    assert sens[0]["p_fg"].dtype == np.float64 and sens[0]["p_bg"].dtype == np.float64
    assert store.results_from_table(store.results_table([], []), 0) == ([], [], [])
    # through a Parquet file: the list columns come back as chunked arrays
    (one,) = store.results_from_table(pa.concat_tables([table.slice(0, 2), table.slice(2)]), 2)[1][0][1:]
    assert_same_result(one, models[0][0])


def test_own_subset_columns_round_trip_beside_the_sensitivity():
    """Model 0 has both groups of per-image columns, model 1 the own-subset ones only: round 0 rows carry them, the
    later rounds of a collection null; read back per group, in image order, with their dtypes."""
    models = _models()
    own = {"backselect_class": np.array([3, 1]), "backselect_score": np.array([0.875, 0.25]),
           "random_class": np.array([0, 2]), "random_score": np.array([0.125, 0.5])}
    table = store.results_table(models, [7, 5], [{**SENS[0], **own}, own])
    col = lambda k: table.column(k).to_pylist()  # noqa: E731
    assert col("round") == [0, 1, 0, 0, 0, 1]
    assert col("backselect_class") == [3, None, 1, 3, 1, None]
    assert col("random_score") == [0.125, None, 0.5, 0.125, 0.5, None]
    indices, _, cols = store.results_from_table(table, 2)
    assert indices == [5, 7]
    assert set(cols[0]) == {"fg_correct", "bg_correct", "p_fg", "p_bg", "backselect_class", "backselect_score",
                            "random_class", "random_score"}
    assert set(cols[1]) == {"backselect_class", "backselect_score", "random_class", "random_score"}
    for c in cols:
        assert c["backselect_class"].tolist() == [1, 3] and c["backselect_class"].dtype == np.int64
        assert c["backselect_score"].tolist() == [0.25, 0.875] and c["backselect_score"].dtype == np.float64
        assert c["random_class"].tolist() == [2, 0] and c["random_score"].tolist() == [0.5, 0.125]
    assert cols[0]["fg_correct"].tolist() == [False, True]
    # a part written before the own-subset columns were stored: the sensitivity alone comes back
    old = table.drop_columns(list(store.OWN_SUBSET_COLUMNS))
    _, _, cols = store.results_from_table(old, 2)
    assert set(cols[0]) == {"fg_correct", "bg_correct", "p_fg", "p_bg"} and cols[1] is None


@pytest.mark.mutation
def test_list_columns_with_nulls_and_no_values():
    arr = store._list_array([np.array([1.5, 2.5]), None, np.zeros(0), np.array([4.0])], pa.float64())
    assert arr.type == pa.large_list(pa.float64())
    assert arr.to_pylist() == [[1.5, 2.5], None, [], [4.0]]
    back = store._lists(pa.chunked_array([arr.slice(0, 2), arr.slice(2)]))
    assert [None if b is None else b.tolist() for b in back] == [[1.5, 2.5], None, [], [4.0]]
    empty = store._list_array([None, None], pa.int64())
    assert empty.to_pylist() == [None, None] and empty.type == pa.large_list(pa.int64())
    assert store._lists(empty) == [None, None]
    ints = store._list_array([np.array([3, 1], dtype=np.int32)], pa.int64())
    assert ints.values.type == pa.int64() and ints.to_pylist() == [[3, 1]]


@pytest.mark.mutation
def test_images_table_by_hand_and_read_back():
    rgb = np.arange(2 * 3 * 3, dtype=np.int64).reshape(2, 3, 3) * 7  # not uint8 yet: stored as uint8
    gray = np.full((3, 3), 200, dtype=np.uint8)
    obj_a = np.array([[1, 0, 1], [0, 0, 1]], dtype=np.int64)  # 6 bits: not a whole byte
    obj_b = np.eye(3, dtype=bool)
    t = store.images_table([4, 5], ["a.png", "b.png"], [3, None], [rgb, gray], [obj_a, obj_b])
    assert t.column("image_index").to_pylist() == [4, 5] and t.column("image_index").type == pa.int64()
    assert t.column("name").to_pylist() == ["a.png", "b.png"] and t.column("label").to_pylist() == [3, None]
    assert t.column("label").type == pa.int64() and t.column("display").type == pa.binary()
    assert t.column("display").to_pylist()[0] == rgb.astype(np.uint8).tobytes()
    assert t.column("display_shape").to_pylist() == [[2, 3, 3], [3, 3]]
    assert t.column("object_mask").to_pylist() == [bytes([0b10100100]), bytes([0b10001000, 0b10000000])]
    back = store.images_from_table(t)
    assert (back.indices, back.names, back.labels) == ([4, 5], ["a.png", "b.png"], [3, None])
    assert back.displays[0].dtype == np.uint8 and np.array_equal(back.displays[0], rgb)
    assert np.array_equal(back.displays[1], gray)
    assert [o.tolist() for o in back.object_masks] == [obj_a.astype(bool).tolist(), obj_b.tolist()]
    plain = store.images_from_table(store.images_table([1], ["c"], [0], [gray]))
    assert plain.object_masks is None and t.column("object_mask").type == pa.binary()
    assert store.images_table([1], ["c"], [0], [gray]).column("object_mask").to_pylist() == [None]
    assert store.images_from_table(store.images_table([], [], [], [])).object_masks is None


@pytest.mark.mutation
def test_folder_parts_chunks_and_metadata(tmp_path):
    folder = str(tmp_path)
    assert store.part_path(folder, 12, "images") == os.path.join(folder, "parts", "c000012.images.parquet")
    assert store.part_path(folder, 1234567, "results").endswith(os.path.join("parts", "c1234567.results.parquet"))
    assert store.committed_chunks(folder) == set()  # no parts folder
    os.makedirs(tmp_path / "parts")
    for f in ("c000001.results.parquet", "c000002.images.parquet", "c000003.results.parquet.tmp-5",
              "c12.results.parquet", "xc000004.results.parquet", "c0000005.results.parquet", "c000006.results.parquetx"):
        (tmp_path / "parts" / f).write_text("")
    assert store.committed_chunks(folder) == {1, 5}
    (tmp_path / "junk.tmp-9").write_text("")
    (tmp_path / "keep.json").write_text("")
    assert store.remove_temporaries(folder) == 2
    assert sorted(os.listdir(tmp_path)) == ["keep.json", "parts"]
    assert "c000003.results.parquet.tmp-5" not in os.listdir(tmp_path / "parts")
    assert store.remove_temporaries(str(tmp_path / "none")) == 0


@pytest.mark.mutation
def test_read_chunk_and_chunk_meta(tmp_path):
    folder = str(tmp_path)
    models = _models()
    images = store.images_table([5, 7], ["five", "seven"], [1, 2], [np.zeros((2, 2), np.uint8)] * 2)
    store.commit_chunk(folder, 0, images, store.results_table(models, [7, 5], SENS, meta={"transfer": [[1]]}))
    imgs, per_model, sens, meta = store.read_chunk(folder, 0, 2)
    assert imgs.indices == [5, 7] and imgs.names == ["five", "seven"] and meta == {"transfer": [[1]]}
    assert_same_result(per_model[1][0], models[1][1]) and sens[1] is None and sens[0]["p_fg"].tolist() == [0.5, 0.25]
    assert store.chunk_meta(folder, 0) == {"transfer": [[1]]}
    bad = store.images_table([5, 8], ["five", "eight"], [1, 2], [np.zeros((2, 2), np.uint8)] * 2)
    store.commit_chunk(folder, 1, bad, store.results_table(models, [7, 5]))
    with pytest.raises(ValueError, match=rf"^{folder}: chunk 1's results and images parts cover different images$"):
        store.read_chunk(folder, 1, 2)
    bare = store.results_table(models, [7, 5]).replace_schema_metadata(None)  # no metadata at all
    store.commit_chunk(folder, 2, images, bare)
    assert store.read_chunk(folder, 2, 2)[3] == {} and store.chunk_meta(folder, 2) == {}


@pytest.mark.mutation
def test_documents_configurations_and_resume(tmp_path):
    folder = str(tmp_path)
    assert store.read_doc(folder) is None and store.check_resumable(folder, {"a": 1}) is None
    path = os.path.join(folder, "results.json")
    store.write_json(path, {"format_version": 1, "config": {}})
    with pytest.raises(ValueError, match=rf"^{path} has format_version 1; this overinterp_fast reads 2$"):
        store.read_doc(folder)
    store.write_json(path, {"config": {}})
    with pytest.raises(ValueError, match=r"has format_version None; this"):
        store.read_doc(folder)
    doc = {"format_version": store.FORMAT_VERSION, "config": {"size": [8, 8], "tau": 0.5, "models": ["a"]}}
    store.write_json(path, doc)
    assert store.read_doc(folder) == doc
    assert store.check_resumable(folder, {"size": (8, 8), "tau": 0.5, "models": ("a",)}) == doc  # tuples = lists
    with pytest.raises(ValueError, match=rf"^{folder!r} holds an audit with another configuration: tau is 0.5 "
                                         r"there, 0.6 here; rerun with --restart to start over, or choose another "
                                         r"--out$"):
        store.check_resumable(folder, {"size": [8, 8], "tau": 0.6, "models": ["a"]})
    store.write_json(path, {"format_version": store.FORMAT_VERSION})  # no configuration stored: all differ
    with pytest.raises(ValueError, match=r"configuration: tau is None there, 0.5 here; rerun"):
        store.check_resumable(folder, {"tau": 0.5})


@pytest.mark.mutation
def test_config_difference_names_the_first_key_and_counts_the_rest():
    assert store.config_difference({"a": 1, "b": [2]}, {"b": [2], "a": 1}) is None
    assert store.config_difference({}, {}) is None
    assert store.config_difference({"a": 1}, {"a": 2}) == "a is 1 there, 2 here"
    assert store.config_difference({"a": "x"}, {"a": "y"}) == "a is 'x' there, 'y' here"
    assert store.config_difference({"a": 1, "gone": 3}, {"a": 1}) == "gone is 3 there, None here"
    assert store.config_difference({"a": 1, "b": 2, "old": 0}, {"b": 3, "a": 4, "c": 5}) == (
        "b is 2 there, 3 here (and 3 more: a, c, old)")
    assert store.config_difference({"a": 1, "b": 1}, {"a": 2, "b": 2}) == "a is 1 there, 2 here (and 1 more: b)"


@pytest.mark.mutation
def test_clear_chunk_ranges_and_share(tmp_path):
    folder = str(tmp_path)
    os.makedirs(tmp_path / "parts")
    (tmp_path / "parts" / "c000000.results.parquet").write_text("")
    for f in ("results.json", "sis.parquet", "report.html", "notes.txt"):
        (tmp_path / f).write_text("x")
    store.clear(folder)
    assert os.listdir(tmp_path) == ["notes.txt"]
    store.clear(folder)  # nothing left to remove: no error
    assert store.chunk_ranges(7, 3) == [(0, 3), (3, 6), (6, 7)]
    assert store.chunk_ranges(6, 3) == [(0, 3), (3, 6)]
    assert store.chunk_ranges(2, 1) == [(0, 1), (1, 2)] and store.chunk_ranges(0, 4) == []
    with pytest.raises(ValueError, match=r"^chunk size must be a positive integer, got 0$"):
        store.chunk_ranges(5, 0)
    assert store.share({5, 1, 3, 2}, 0, 2) == [1, 3] and store.share([5, 1, 3, 2], 1, 2) == [2, 5]
    assert store.share([4, 0, 2], 0, 1) == [0, 2, 4] and store.share([4, 0, 2], 2, 3) == [4]


@pytest.mark.mutation
def test_column_types_hold_without_values_and_configurations_with_paths(tmp_path):
    types = {"image_index": pa.int64(), "name": pa.string(), "label": pa.int64(), "display": pa.binary(),
             "display_shape": pa.large_list(pa.int64()), "object_mask": pa.binary()}
    for t in (store.images_table([], [], [], []), store.images_table([3], ["x"], [None], [np.zeros((1, 1), np.uint8)])):
        assert {f.name: f.type for f in t.schema} == types  # not inferred (an empty or all-null column is null)
    folder = str(tmp_path)
    doc = {"format_version": store.FORMAT_VERSION, "config": {"source": str(tmp_path / "images")}}
    store.write_json(os.path.join(folder, "results.json"), doc)
    assert store.check_resumable(folder, {"source": tmp_path / "images"}) == doc  # a Path compares as its text


@pytest.mark.mutation
def test_object_masks_of_any_dtype_come_back_bool():
    mask = np.array([[0.0, 1.0], [1.0, 0.0]])  # a float mask: packed as its truth values
    t = store.images_table([0], ["a"], [1], [np.zeros((2, 2, 3), np.uint8)], [mask])
    (back,) = store.images_from_table(t).object_masks
    assert back.dtype == bool and back.tolist() == [[False, True], [True, False]]


@pytest.mark.mutation
def test_single_round_collection_and_sensitivity_of_a_later_model_read_back():
    r = _result([1, 0], [0.7, 0.2], [0], 3, 0.9, 0.5, sis_score=0.7, shape=(2,))
    r.collection = [r]  # a collection of one round: the result itself
    s = _result([0, 1], [0.6, 0.1], [1, 0], 3, 0.8, 0.5, sis_score=0.8, shape=(2,))
    sens = [None, {"fg_correct": torch.tensor([True]), "bg_correct": torch.tensor([True]),
                   "p_fg": torch.tensor([0.5], dtype=torch.float64), "p_bg": torch.tensor([0.25], dtype=torch.float64)}]
    table = store.results_table([[r], [s]], [4], sens)
    assert table.column("first_in_collection").to_pylist() == [True, False]
    assert table.column("collection").to_pylist() == [1, None]
    _, (a, b), back_sens = store.results_from_table(table, 2)
    assert a[0].collection == [a[0]] and b[0].collection is None
    assert a[0].mask.dtype == torch.bool and a[0].mask.tolist() == [True, False]
    assert back_sens[0] is None and back_sens[1]["p_bg"].tolist() == [0.25]


@pytest.mark.mutation
def test_parts_written_before_the_refinement_columns_read_back_with_them_none():
    """A results part of an older overinterp_fast has no extraction_queries, refine_queries, size_before_refine
    or minimal column: it reads back, those fields None, everything else as written."""
    models = _models()
    table = store.results_table(models, [7, 5], SENS)
    old = table.drop_columns(["extraction_queries", "refine_queries", "size_before_refine", "minimal"])
    _, back, _ = store.results_from_table(old, 2)
    b7 = back[1][1]
    assert b7.queries == 11 and b7.sis_score == 0.3
    assert (b7.extraction_queries, b7.refine_queries, b7.size_before_refine, b7.minimal) == (None, None, None, None)
