"""SISResult lists out (methods/results_io.py): the Arrow table and the pandas frame, row by row against results
written by hand, the list columns, the .npz masks and back, and the notebook view of one result."""
import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

import overinterp_fast as of
from overinterp_fast.methods.results import SISResult


def _results():
    """Three images on a 2 x 3 grid: a SIS {5, 1} found by exact SIS, none (f(x) < tau), and a refined minimal set."""
    order = torch.tensor([0, 2, 3, 4, 1, 5])
    values = torch.tensor([0.9, 0.85, 0.8, 0.7, 0.6, 0.1], dtype=torch.float64)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    mask.view(-1)[torch.tensor([5, 1])] = True
    found = SISResult(order=order, values=values, sis=torch.tensor([5, 1]), mask=mask, target=3, score=0.95,
                      threshold=0.9, sis_score=0.92)
    none = SISResult(order=order, values=values, sis=None, mask=None, target=0, score=0.4, threshold=0.9)
    refined_mask = torch.zeros(2, 3, dtype=torch.bool)
    refined_mask[1, 2] = True
    refined = SISResult(order=order.flip(0), values=values, sis=torch.tensor([5]), mask=refined_mask, target=1,
                        score=0.99, threshold=0.5, sis_score=0.7, queries=40, extraction_queries=6,
                        refine_queries=2, size_before_refine=3, minimal=True, engine="onnxruntime")
    found.collection = [found]
    return [found, none, refined]


def test_table_one_row_per_image_by_hand():
    table = of.sis_table(_results())
    rows = table.to_pylist()
    assert table.column_names == ["image", "target", "score", "threshold", "features", "sis_size", "sis_fraction",
                                  "sis_score", "collection_size", "queries", "extraction_queries", "refine_queries",
                                  "total_queries", "size_before_refine", "minimal", "rescored", "engine"]
    assert rows[0] == {"image": 0, "target": 3, "score": 0.95, "threshold": 0.9, "features": 6, "sis_size": 2,
                       "sis_fraction": 2 / 6, "sis_score": 0.92, "collection_size": 1, "queries": None,
                       "extraction_queries": None, "refine_queries": None, "total_queries": None,
                       "size_before_refine": None, "minimal": None, "rescored": None, "engine": "torch"}
    assert rows[1]["sis_size"] is None and rows[1]["sis_fraction"] is None and rows[1]["collection_size"] == 0
    assert (rows[2]["queries"], rows[2]["extraction_queries"], rows[2]["refine_queries"],
            rows[2]["total_queries"]) == (40, 6, 2, 48)
    assert (rows[2]["size_before_refine"], rows[2]["minimal"], rows[2]["engine"]) == (3, True, "onnxruntime")
    assert str(table.schema.field("collection_size").type) == "int32" and table.num_rows == 3
    assert of.sis_table([]).num_rows == 0
    with pytest.raises(TypeError, match=r"^expected a list of SISResult, got a dict in it$"):
        of.sis_table([{}])


def test_list_columns_hold_order_values_sis_and_the_flat_mask():
    rows = of.sis_table(_results(), lists=True).to_pylist()
    assert rows[0]["order"] == [0, 2, 3, 4, 1, 5] and rows[2]["order"] == [5, 1, 4, 3, 2, 0]
    assert rows[0]["values"] == pytest.approx([0.9, 0.85, 0.8, 0.7, 0.6, 0.1])
    assert rows[0]["sis"] == [5, 1] and rows[1]["sis"] is None and rows[1]["mask"] is None
    assert rows[0]["mask"] == [False, True, False, False, False, True] and rows[0]["mask_shape"] == [2, 3]
    assert rows[2]["mask"] == [False, False, False, False, False, True]


def test_pandas_frame_has_the_same_rows():
    pd = pytest.importorskip("pandas")
    frame = of.sis_frame(_results())
    assert isinstance(frame, pd.DataFrame) and list(frame["target"]) == [3, 0, 1]
    assert frame["sis_size"].tolist()[0] == 2 and np.isnan(frame["sis_size"].tolist()[1])  # null: NaN, as read_parquet
    assert frame.loc[2, "engine"] == "onnxruntime"
    assert of.sis_frame(_results(), lists=True).loc[0, "sis"].tolist() == [5, 1]


def test_masks_to_npz_and_back(tmp_path):
    path = of.save_masks(tmp_path / "m", _results())
    assert path == str(tmp_path / "m.npz")
    with np.load(path) as data:
        assert data["masks"].shape == (3, 2, 3) and data["masks"].dtype == bool
        assert data["has_sis"].tolist() == [True, False, True] and data["target"].tolist() == [3, 0, 1]
        assert data["score"].tolist() == [0.95, 0.4, 0.99] and data["threshold"].tolist() == [0.9, 0.9, 0.5]
        assert not data["masks"][1].any()
    back = of.load_masks(path)
    assert back[0].tolist() == [[False, True, False], [False, False, True]] and back[1] is None
    assert back[2].tolist() == [[False, False, False], [False, False, True]] and back[0].dtype == torch.bool
    nothing = of.save_masks(tmp_path / "none.npz", [_results()[1]])
    assert of.load_masks(nothing) == [None]
    odd = _results()
    odd[2].mask = torch.zeros(6, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"^the masks have different shapes \[\(2, 3\), \(6,\)\]"):
        of.save_masks(tmp_path / "odd.npz", odd)
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match=r"holds no SIS masks \(no has_sis, masks\); write it with save_masks$"):
        of.load_masks(tmp_path / "other.npz")


def test_save_masks_makes_the_folders_and_writes_whole_or_not_at_all(tmp_path, monkeypatch):
    path = of.save_masks(tmp_path / "out" / "run 1" / "masks.npz", _results())
    assert path == str(tmp_path / "out" / "run 1" / "masks.npz")
    assert of.load_masks(path)[0].tolist() == [[False, True, False], [False, False, True]]
    assert of.save_masks(str(tmp_path / "other" / "m"), _results()) == str(tmp_path / "other" / "m.npz")
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["m.npz"]  # no temporary file left

    def full_disk(file, **arrays):
        file.write(b"PK")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        of.save_masks(tmp_path / "other" / "m.npz", _results()[:1])
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["m.npz"]
    monkeypatch.undo()
    assert len(of.load_masks(tmp_path / "other" / "m.npz")) == 3  # the file before the failed write, whole


def test_notebook_view_of_one_result():
    found, none, refined = _results()
    page = found._repr_html_()
    assert "<th style='text-align:left'>SIS</th><td>2 of 6 (33.3%)</td>" in page and "<td>0.92</td>" in page
    assert "<th style='text-align:left'>disjoint SIS</th><td>1</td>" in page
    encoded = page.split("base64,")[1].split("'")[0]
    picture = np.asarray(Image.open(io.BytesIO(base64.b64decode(encoded))))
    # 2 x 3 scaled by ceil(96 / 2) = 48 (nearest): white on the SIS pixels (0, 1) and (1, 2)
    assert picture.shape == (96, 144)
    assert picture[0, 48] == 255 and picture[95, 143] == 255 and picture[0, 0] == 0 and picture[95, 0] == 0
    assert "none (f(x) &lt; tau)" in none._repr_html_() and "base64" not in none._repr_html_()
    assert "<td>48</td>" in refined._repr_html_() and "certified" in refined._repr_html_()
