"""The audit record and its folder (audit/records.py, audit/persist.py) by hand: the record's checks, class names,
results.json's fields, a save/load round trip of a record written by hand (NaN seconds, object masks, sensitivity), several
committed chunks read back in order, and the errors of a folder that is not a complete audit.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import json
import math
import os
import numpy as np
import pytest
import torch
from overinterp_fast.audit import persist, store
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.methods.results import SISResult
from helpers import whole_message


def _result(sis, target, score=0.75):
    mask = None
    if sis is not None:
        mask = torch.zeros(3, 4, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(12), values=torch.linspace(0, 1, 12, dtype=torch.float64), target=target,
                     score=score, threshold=0.5, sis=None if sis is None else torch.tensor(sis), mask=mask)


def _record(n=3, objects=True) -> AuditRecord:
    displays = [np.full((3, 4, 3), 10 * i, np.uint8) for i in range(n)]
    masks = [np.eye(3, 4, dtype=bool) for _ in range(n)] if objects else None
    a = ModelRecord("a", "exact", [_result([i, 11], i % 2) for i in range(n)], seconds=1.5,
                    options={"threshold": 0.5}, sensitivity={"sigma": 0.1, "rfs": 0.25})
    b = ModelRecord("b", "gradient", [_result(None, 1, 0.25) for _ in range(n)])  # seconds NaN by default
    return AuditRecord("T", [f"img{i}" for i in range(n)], displays, [1, None, 0][:n], {0: "zero", 1: "one"},
                       [a, b], transfer={"fraction": 0.05, "rows": ["a", "b"], "cols": ["a", "b"],
                                         "accuracy": [[1.0, 0.5], [0.0, 1.0]], "reference": "labels"},
                       meta={"device": "cpu"}, object_masks=masks)


@pytest.mark.mutation
def test_record_checks_and_class_names():
    rec = _record()
    assert rec.class_name(None) == "-" and rec.class_name(1) == "one" and rec.class_name(7) == "7"
    assert rec.class_name(np.int64(0)) == "zero"
    assert rec.models[0].predictions == [0, 1, 0] and math.isnan(rec.models[1].seconds)
    cases = [
        (dict(object_masks=[np.zeros((3, 4), bool)] * 2), "2 object masks for 3 images"),
        (dict(displays=[np.zeros((3, 4), np.uint8)] * 2), "3 image names, 2 displays and 3 labels"),
        (dict(labels=[1]), "3 image names, 3 displays and 1 labels"),
        (dict(models=[ModelRecord("short", "exact", [_result(None, 0)])]), "model 'short' has 1 results for 3 images"),
    ]
    for change, message in cases:
        kw = dict(title="T", image_names=rec.image_names, displays=rec.displays, labels=rec.labels,
                  class_names=rec.class_names, models=rec.models)
        kw.update(change)
        with pytest.raises(ValueError, match=whole_message(message)):
            AuditRecord(**kw)


@pytest.mark.mutation
def test_results_json_fields():
    rec = _record()
    assert persist._float(None) is None and persist._float(math.nan) is None and persist._float(math.inf) is None
    assert persist._float(-math.inf) is None and persist._float(2) == 2.0 and isinstance(persist._float(2), float)
    rec.models[1].subsets = {"fraction": 0.05, "accuracy": {"backselect": 0.5}}
    assert persist.model_entries(rec.models) == [
        {"name": "a", "method": "exact", "seconds": 1.5, "options": {"threshold": 0.5},
         "sensitivity": {"sigma": 0.1, "rfs": 0.25}, "subsets": None},
        {"name": "b", "method": "gradient", "seconds": None, "options": {}, "sensitivity": None,
         "subsets": {"fraction": 0.05, "accuracy": {"backselect": 0.5}}}]
    doc = persist.complete_doc(rec, {"source": "x"}, 2)
    assert doc == {"format_version": store.FORMAT_VERSION, "status": "complete", "config": {"source": "x"},
                   "n_images": 3, "chunk_size": 2, "title": "T", "class_names": {"0": "zero", "1": "one"},
                   "models": persist.model_entries(rec.models), "transfer": rec.transfer, "meta": {"device": "cpu"},
                   "object_masks": True}
    assert persist.complete_doc(_record(objects=False), {}, 1)["object_masks"] is False
    assert list(persist.complete_doc(AuditRecord("t", [], [], [], {2: "b", 0: "a"}, []), {}, 1)["class_names"]) == \
        ["0", "2"]


def _same_results(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.target == w.target and g.score == pytest.approx(w.score) and (g.sis is None) == (w.sis is None)
        if w.sis is not None:
            assert sorted(g.sis.tolist()) == sorted(w.sis.tolist())
        assert g.order.tolist() == w.order.tolist()


@pytest.mark.mutation
def test_save_and_load_round_trip(tmp_path):
    rec = _record()
    own = {"backselect_class": np.array([2, 0, 1]), "backselect_score": np.array([0.5, 0.25, 0.75]),
           "random_class": np.array([1, 1, 0]), "random_score": np.array([0.125, 0.0, 1.0])}
    rec.models[0].subset_columns, rec.models[0].subsets = own, {"fraction": 0.05, "images": 3}
    folder = str(tmp_path / "audit")
    path = persist.save_audit(rec, folder)
    assert path == os.path.join(folder, "results.json")
    doc = json.load(open(path))
    assert doc["config"] == {"source": "an in-memory AuditRecord"} and doc["chunk_size"] == 3
    assert os.path.isfile(os.path.join(folder, "sis.parquet"))
    back = persist.load_audit(folder)
    assert back.title == "T" and back.image_names == ["img0", "img1", "img2"] and back.labels == [1, None, 0]
    assert back.class_names == {0: "zero", 1: "one"} and back.transfer == rec.transfer and back.meta == rec.meta
    assert [d.tolist() for d in back.displays] == [d.tolist() for d in rec.displays]
    assert [m.tolist() for m in back.object_masks] == [m.tolist() for m in rec.object_masks]
    assert [m.name for m in back.models] == ["a", "b"] and [m.method for m in back.models] == ["exact", "gradient"]
    assert back.models[0].seconds == 1.5 and math.isnan(back.models[1].seconds)
    assert back.models[0].options == {"threshold": 0.5} and back.models[0].sensitivity == {"sigma": 0.1, "rfs": 0.25}
    assert back.models[1].sensitivity is None
    # the model on its own pixel subsets: the summary from results.json, the columns from the parts
    assert back.models[0].subsets == {"fraction": 0.05, "images": 3} and back.models[1].subsets is None
    assert {k: v.tolist() for k, v in back.models[0].subset_columns.items()} == {
        "backselect_class": [2, 0, 1], "backselect_score": [0.5, 0.25, 0.75], "random_class": [1, 1, 0],
        "random_score": [0.125, 0.0, 1.0]}
    assert back.models[1].subset_columns is None
    for m, w in zip(back.models, rec.models):
        _same_results(m.results, w.results)
    # saved again with a configuration and without masks: replaces the first
    persist.save_audit(_record(2, objects=False), folder, config={"source": "again"})
    again = persist.load_audit(folder)
    assert again.object_masks is None and len(again.image_names) == 2
    assert json.load(open(path))["config"] == {"source": "again"}
    # an empty record keeps a chunk size of 1
    persist.save_audit(AuditRecord("e", [], [], [], {}, []), str(tmp_path / "empty"))
    assert json.load(open(tmp_path / "empty" / "results.json"))["chunk_size"] == 1


def _write_chunks(folder, rec, bounds):
    """Commit rec's images in chunks [a, b) (chunk ids in order) and a complete results.json."""
    os.makedirs(folder, exist_ok=True)
    for c, (a, b) in enumerate(bounds):
        idx = range(a, b)
        masks = None if rec.object_masks is None else rec.object_masks[a:b]
        store.commit_chunk(folder, c, store.images_table(idx, rec.image_names[a:b], rec.labels[a:b],
                                                         rec.displays[a:b], masks),
                           store.results_table([m.results[a:b] for m in rec.models], idx))
    doc = persist.complete_doc(rec, {}, 2)
    store.write_json(os.path.join(folder, "results.json"), doc)
    return doc


@pytest.mark.mutation
def test_chunks_are_read_in_order_and_must_cover_the_images(tmp_path):
    rec = _record(3)
    rec.object_masks = [np.eye(3, 4, k=i, dtype=bool) for i in range(3)]  # one mask per image, all different
    folder = str(tmp_path / "a")
    doc = _write_chunks(folder, rec, [(0, 2), (2, 3)])
    got = list(persist.iter_chunks(folder, doc))
    assert [c[0].indices for c in got] == [[0, 1], [2]] and [c[0].names for c in got] == [["img0", "img1"], ["img2"]]
    back = persist.load_audit(folder)
    assert back.image_names == rec.image_names and back.labels == [1, None, 0]
    assert [m.tolist() for m in back.object_masks] == [m.tolist() for m in rec.object_masks]  # every chunk's
    _same_results(back.models[0].results, rec.models[0].results)
    rec = _record(3, objects=False)
    # one image short: the last chunk missing
    short = str(tmp_path / "short")
    doc = _write_chunks(short, rec, [(0, 2)])
    with pytest.raises(ValueError, match=whole_message(f"{short!r}: the committed chunks cover 2 of 3 images")):
        list(persist.iter_chunks(short, doc))
    # a gap: the first chunk's results part removed (chunk 0 not committed), so chunk 1 comes first
    gap = str(tmp_path / "gap")
    doc = _write_chunks(gap, rec, [(0, 1), (1, 3)])
    os.remove(store.part_path(gap, 0, "results"))
    assert store.committed_chunks(gap) == {1}
    with pytest.raises(ValueError, match=whole_message(f"{gap!r}: chunk 1 starts at image [1], expected 0")):
        list(persist.iter_chunks(gap, doc))


@pytest.mark.mutation
def test_load_audit_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=whole_message(
            f"no results.json in {str(tmp_path)!r}: not an audit folder")):
        persist.load_audit(str(tmp_path))
    rec = _record(3, objects=False)
    folder = str(tmp_path / "partial")
    doc = _write_chunks(folder, rec, [(0, 2)])
    store.write_json(os.path.join(folder, "results.json"), dict(doc, status="running"))
    with pytest.raises(ValueError, match=whole_message(
            f"the audit in {folder!r} is not complete (1 chunks committed); rerun the same command to continue it")):
        persist.load_audit(folder)


@pytest.mark.mutation
def test_chunk_record_of_one_chunk(tmp_path):
    rec = _record(3)
    folder = str(tmp_path / "c")
    doc = _write_chunks(folder, rec, [(0, 2), (2, 3)])
    (images, per_model, _, _), _ = list(persist.iter_chunks(folder, doc))
    part = persist.chunk_record(doc, images, per_model, {0: "zero"})
    assert part.title == "T" and part.image_names == ["img0", "img1"] and part.labels == [1, None]
    assert [m.name for m in part.models] == ["a", "b"] and [m.method for m in part.models] == ["exact", "gradient"]
    assert part.models[0].options == {"threshold": 0.5} and part.models[1].options == {}
    assert part.class_names == {0: "zero"} and len(part.object_masks) == 2
    assert [d.tolist() for d in part.displays] == [d.tolist() for d in rec.displays[:2]]
    _same_results(part.models[0].results, rec.models[0].results[:2])
    # an older results.json without a title or options: an empty title, empty options
    bare = dict(doc, models=[{"name": m["name"], "method": m["method"]} for m in doc["models"]])
    del bare["title"]
    part = persist.chunk_record(bare, images, per_model, {})
    assert part.title == "" and [m.options for m in part.models] == [{}, {}]


def test_short_reprs_and_the_notebook_table():
    rec = _record()
    assert repr(rec) == "AuditRecord('T': 3 images (2 labelled), models ['a', 'b'], transfer, object masks)"
    # a: SIS [i, 11] of 12 features for every image: 2/12 = 16.7%; b: no SIS, seconds NaN
    assert repr(rec.models[0]) == "ModelRecord('a', exact: 3 of 3 images with a SIS, median SIS 16.7%, 1.5 s)"
    assert repr(rec.models[1]) == "ModelRecord('b', gradient: 0 of 3 images with a SIS, nan s)"
    page = rec._repr_html_()
    assert page.startswith("<table><caption>T: 3 images</caption>")
    assert "<tr><td>a</td><td>exact</td><td>3 of 3</td><td>16.7%</td><td>1.5</td></tr>" in page
    assert "<tr><td>b</td><td>gradient</td><td>0 of 3</td><td>-</td><td>nan</td></tr>" in page
    plain = AuditRecord("x<y", ["i"], [np.zeros((3, 4), np.uint8)], [None], {}, [])
    assert repr(plain) == "AuditRecord('x<y': 1 images (0 labelled), models [])" and "x&lt;y" in plain._repr_html_()
