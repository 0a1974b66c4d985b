"""The audit's saved results (save_audit / load_audit) and its HTML report, on tiny seeded CNNs."""
import base64
import dataclasses
import json
import math
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.audit import kruskal_wallis, friedman, fraction_inside, pixel_subsets
from overinterp_fast.audit.records import RESULTS_FILE, AuditRecord, ModelRecord, load_audit, save_audit
from overinterp_fast.audit.table import TABLE_FILE
from overinterp_fast.audit.report import (
    border_fractions,
    border_mask,
    build_report,
    rebuild_report,
    safe_test,
)
from overinterp_fast.plotting import sis_figure, sis_panels

from conftest import make_cnn, make_images

N, H, W = 4, 8, 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLASS_NAMES = {0: "tabby <cat>", 1: "dog & co", 2: "espresso", 3: "missile", 4: "four"}
ALL_SECTIONS = ["summary", "images", "sis-sizes", "heatmaps", "location", "comparison", "transfer"]


# ---------------------------------------------------------------------------------------------- building records


def _thresholds(model, x, no_sis: int, relative: float = 0.8) -> torch.Tensor:
    """``relative`` f(x) per image, except image ``no_sis``: halfway between f(x) and 1, so that it gets no SIS."""
    with torch.no_grad():
        f = torch.softmax(model(x), 1).max(1).values
    tau = relative * f
    tau[no_sis] = (1 + f[no_sis]) / 2
    return tau


def _displays(x: torch.Tensor) -> list[np.ndarray]:
    """uint8 [H, W, 3] per image of [N, 3, H, W]."""
    out = []
    for im in x:
        im = im.permute(1, 2, 0)
        out.append(((im - im.min()) / (im.max() - im.min()) * 255).round().to(torch.uint8).numpy())
    return out


def _transfer(models: dict, x: torch.Tensor, results: dict) -> dict:
    """Model B's agreement with its own full-image predictions on model A's 5% pixel subsets."""
    names = list(models)
    with torch.no_grad():
        full = {b: models[b](x).argmax(1) for b in names}
        acc = []
        for a in names:
            subsets, _ = pixel_subsets(x, results[a], 0.05)
            acc.append([float((models[b](subsets).argmax(1) == full[b]).double().mean()) for b in names])
    return {"fraction": 0.05, "rows": names, "cols": names, "accuracy": acc, "reference": "full-image predictions"}


@pytest.fixture(scope="module")
def runs():
    """Three tiny CNNs' SIS on 4 images of 3x8x8 (image 3 of model A and image 2 of model C get none)."""
    x = make_images(N, 3, H, W, seed=5)
    nets = {"cnn A": make_cnn(0, channels=3, h=H, w=W), "cnn B": make_cnn(2, channels=3, h=H, w=W),
            "cnn C": make_cnn(3, channels=3, h=H, w=W)}
    res = {
        "cnn A": of.fast_sis(nets["cnn A"], x, _thresholds(nets["cnn A"], x, 3, 0.6), collection=True, progress=False),
        "cnn B": of.fast_sis(nets["cnn B"], x, _thresholds(nets["cnn B"], x, 0), method="gradient", k=8,
                             progress=False),
        "cnn C": of.fast_sis(nets["cnn C"], x, _thresholds(nets["cnn C"], x, 2), progress=False),
    }
    return x, nets, res


def _record(runs, names: list[str], transfer: bool) -> AuditRecord:
    x, nets, res = runs
    methods = {"cnn A": "exact", "cnn B": "gradient", "cnn C": "exact"}
    a = res["cnn A"]
    labels = [a[0].target, (a[1].target + 1) % 5, None, None]  # image 0 right, image 1 wrong for model A
    return AuditRecord(
        title="Tiny <audit> & test",
        image_names=["img<0>", "img 1", "img&2", "img 3"],
        displays=_displays(x),
        labels=labels,
        class_names=dict(CLASS_NAMES),
        models=[ModelRecord(n, methods[n], res[n], seconds=0.5 + i, options={"k": 8, "note": "<b>x</b>"})
                for i, n in enumerate(names)],
        transfer=_transfer({n: nets[n] for n in names}, x, {n: res[n] for n in names}) if transfer else None,
        meta={"torch": torch.__version__, "device": "cpu", "command": "pytest test_report.py"},
    )


@pytest.fixture(scope="module")
def three(runs) -> AuditRecord:
    return _record(runs, ["cnn A", "cnn B", "cnn C"], transfer=True)


@pytest.fixture(scope="module")
def single(runs) -> AuditRecord:
    return _record(runs, ["cnn A"], transfer=False)


@pytest.fixture(scope="module")
def three_report(three, tmp_path_factory) -> str:
    """The path of the three-model record's report (built once for the module)."""
    return build_report(three, str(tmp_path_factory.mktemp("report") / "sub" / "report.html"))


@pytest.fixture(scope="module")
def single_report(single, tmp_path_factory) -> str:
    return build_report(single, str(tmp_path_factory.mktemp("single") / "report.html"))


# ---------------------------------------------------------------------------------------------- parsing a report


class Report(HTMLParser):
    """Section ids in order, per section its <img> sources, <h2> count and text; every href/src; all text."""

    def __init__(self, text: str):
        super().__init__()
        self.ids, self.imgs, self.h2, self.texts, self.links, self.all_text = [], {}, {}, {}, [], []
        self.current = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [v for k, v in attrs.items() if k in ("href", "src") and v is not None]
        if tag == "section":
            self.current = attrs["id"]
            self.ids.append(self.current)
            self.imgs[self.current], self.h2[self.current], self.texts[self.current] = [], 0, []
        elif tag == "img":
            assert self.current is not None, "an image outside every section"
            self.imgs[self.current].append(attrs["src"])
        elif tag == "h2" and self.current is not None:
            self.h2[self.current] += 1

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None

    def handle_data(self, data):
        self.all_text.append(data)
        if self.current is not None:
            self.texts[self.current].append(data)

    def text(self, section: str | None = None) -> str:
        return " ".join(self.all_text if section is None else self.texts[section])


def _parse(path: str) -> tuple[Report, str]:
    with open(path, encoding="utf-8") as fh:
        raw = fh.read()
    return Report(raw), raw


def _without_data_uris(raw: str) -> str:
    return "".join(part.split('"', 1)[-1] for part in raw.split("data:image/png;base64,"))


def _no_sis_pairs(record: AuditRecord) -> int:
    return sum(r.sis is None for m in record.models for r in m.results)


# ---------------------------------------------------------------------------------------------- save / load


def _assert_same_result(a, b):
    assert b.target == a.target and b.threshold == pytest.approx(a.threshold, abs=0, rel=0)
    assert (math.isnan(a.score) and math.isnan(b.score)) or b.score == a.score
    np.testing.assert_array_equal(b.order.numpy(), a.order.numpy())
    np.testing.assert_array_equal(b.values.numpy(), a.values.double().numpy())  # NaN equal to NaN
    for name in ("sis", "mask", "blocks"):
        va, vb = getattr(a, name), getattr(b, name)
        assert (va is None) == (vb is None), name
        if va is not None:
            assert vb.shape == va.shape and torch.equal(vb, va), name
    assert b.sis_score == a.sis_score
    assert (a.collection is None) == (b.collection is None)
    if a.collection:  # an image without SIS has an empty collection
        assert len(b.collection) == len(a.collection) and b.collection[0] is b
        for ca, cb in zip(a.collection[1:], b.collection[1:]):
            _assert_same_result(ca, cb)


def test_save_load_round_trip_keeps_everything(three, tmp_path):
    # NaNs (a score, a value, the seconds) become JSON null and come back as NaN
    m0 = three.models[0]
    odd = dataclasses.replace(m0.results[3], score=float("nan"), values=m0.results[3].values.clone())
    odd.values[2] = float("nan")
    models = [dataclasses.replace(m0, results=m0.results[:3] + [odd], seconds=float("nan"))] + three.models[1:]
    record = dataclasses.replace(three, models=models)
    assert any(r.collection is not None and len(r.collection) > 1 for r in m0.results), "no collection to check"
    assert any(r.blocks is not None for r in three.models[1].results), "no gradient blocks to check"

    save_audit(record, str(tmp_path))
    back = load_audit(str(tmp_path))
    assert back.title == record.title and back.image_names == record.image_names and back.labels == record.labels
    assert back.class_names == record.class_names and back.transfer == record.transfer and back.meta == record.meta
    for da, db in zip(record.displays, back.displays):
        assert db.dtype == np.uint8 and np.array_equal(da, db)
    assert math.isnan(back.models[0].seconds) and back.models[1].seconds == record.models[1].seconds
    for ma, mb in zip(record.models, back.models):
        assert (mb.name, mb.method, mb.options) == (ma.name, ma.method, ma.options)
        for ra, rb in zip(ma.results, mb.results):
            _assert_same_result(ra, rb)
    assert math.isnan(back.models[0].results[3].score) and math.isnan(float(back.models[0].results[3].values[2]))


def test_parquet_table_has_a_row_per_model_and_image(three, tmp_path):
    import pyarrow.parquet as pq

    save_audit(three, str(tmp_path))
    table = pq.read_table(tmp_path / TABLE_FILE).to_pylist()
    assert len(table) == len(three.models) * N
    rows = iter(table)
    for m in three.models:
        border = border_fractions(three, m)
        for i, r in enumerate(m.results):
            row = next(rows)
            assert (row["model"], row["method"], row["image"], row["image_index"]) == (
                m.name, m.method, three.image_names[i], i)
            assert row["target"] == r.target and row["target_name"] == CLASS_NAMES[r.target]
            assert row["label"] == three.labels[i]
            assert row["correct"] == (None if three.labels[i] is None else r.target == three.labels[i])
            assert row["score"] == r.score and row["threshold"] == r.threshold
            if r.sis is None:
                assert row["sis_size"] is None and row["sis_fraction"] is None and row["collection_size"] == 0
            else:
                assert row["sis_size"] == r.sis.numel() and row["sis_fraction"] == r.sis.numel() / H / W
                assert row["sis_score"] == r.sis_score and row["collection_size"] == len(r.collection or [r])
            assert row["border_fraction"] == (None if math.isnan(border[i]) else border[i])
            assert row["object_fraction"] is None  # no object masks in this record
            # exact SIS: no query counts and no refinement (the responsibility columns: test_audit_cli.py)
            assert (row["queries"], row["total_queries"], row["size_before_refine"], row["minimal"]) == (
                None, None, None, None)
    a = [row for row in table if row["model"] == "cnn A"]
    assert [row["correct"] for row in a] == [True, False, None, None]
    assert a[3]["sis_size"] is None, "model A has no SIS on image 3"
    assert any(row["collection_size"] > 1 for row in a), "no collection counted"


def test_load_audit_rejects_other_versions_and_missing_folders(three, tmp_path):
    save_audit(three, str(tmp_path / "a"))
    path = tmp_path / "a" / RESULTS_FILE
    doc = json.loads(path.read_text())
    doc["format_version"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="format_version"):
        load_audit(str(tmp_path / "a"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        load_audit(str(tmp_path / "empty"))


# ---------------------------------------------------------------------------------------------- the report


def _check_self_contained(report: Report, raw: str) -> None:
    srcs = [s for imgs in report.imgs.values() for s in imgs]
    assert srcs, "no images"
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1], validate=True).startswith(PNG_MAGIC)
    assert all(link.startswith(("data:image/png;base64,", "#")) for link in report.links)
    rest = _without_data_uris(raw).lower()
    assert "http" not in rest and "file:" not in rest and "<script" not in rest


def test_report_three_models_with_transfer(three, three_report):
    assert three_report.endswith("sub/report.html")
    report, raw = _parse(three_report)
    _check_self_contained(report, raw)
    assert report.ids == ALL_SECTIONS
    assert all(report.h2[s] == 1 for s in report.ids)
    n_models = len(three.models)
    counts = {s: len(report.imgs[s]) for s in report.ids}
    # one figure per image and model; sizes: box plot + exact curve; one heatmap figure per model; one border plot
    assert counts == {"summary": 0, "images": N * n_models, "sis-sizes": 2, "heatmaps": n_models, "location": 1,
                      "comparison": 0, "transfer": 0}

    text = report.text()
    assert three.title in text and "<b>x</b>" in text  # escaped in the HTML, read back verbatim
    assert "img&lt;0&gt;" in raw and "img<0>" not in raw and "tabby <cat>" not in raw
    for name in three.image_names:
        assert name in report.text("images")
    predicted = {three.class_name(r.target) for m in three.models for r in m.results}
    for name in predicted | {three.class_name(lab) for lab in three.labels if lab is not None}:
        assert name in report.text("images")
    assert "(correct)" in text and "(wrong)" in text
    assert report.text("images").count("no SIS: f(x) < tau") == _no_sis_pairs(three) >= 2
    assert "disjoint SIS" in report.text("images")
    for m in three.models:
        assert m.name in report.text("summary") and m.name in report.text("comparison")
    assert "correctly classified" in report.text("sis-sizes") and "wrongly classified" in report.text("sis-sizes")
    assert "Friedman" in report.text("comparison") and "Bonferroni" in report.text("comparison")
    acc = three.transfer["accuracy"][0][1]
    assert f"{100 * acc:.1f}%" in report.text("transfer") and "full-image predictions" in report.text("transfer")


def test_report_single_model(single, single_report):
    report, raw = _parse(single_report)
    _check_self_contained(report, raw)
    assert report.ids == [s for s in ALL_SECTIONS if s != "transfer"]
    assert "One model: nothing to compare." in report.text("comparison")
    assert len(report.imgs["images"]) == N and len(report.imgs["comparison"]) == 0
    assert report.text("images").count("no SIS: f(x) < tau") == _no_sis_pairs(single) == 1


def test_rebuild_report_from_saved_folder(three, three_report, tmp_path):
    first, _ = _parse(three_report)
    save_audit(three, str(tmp_path / "audit"))
    path = rebuild_report(str(tmp_path / "audit"))
    assert path == str(tmp_path / "audit" / "report.html")
    again, raw = _parse(path)
    _check_self_contained(again, raw)
    assert again.ids == first.ids
    assert {s: len(v) for s, v in again.imgs.items()} == {s: len(v) for s, v in first.imgs.items()}
    assert again.text() == first.text()


def test_report_with_a_custom_feature_map_skips_overlays(runs, tmp_path):
    x, nets, _ = runs
    patches = (torch.arange(H).view(H, 1) // 2) * (W // 2) + torch.arange(W).view(1, W) // 2  # 4x4 patches of 2x2
    res = of.fast_sis(nets["cnn A"], x, _thresholds(nets["cnn A"], x, 3), features=patches, progress=False)
    assert all(r.mask is None or r.mask.shape == (16,) for r in res)
    record = AuditRecord("patches", [f"p{i}" for i in range(N)], _displays(x), [None] * N, {},
                         [ModelRecord("patchy", "exact", res)])
    report, raw = _parse(build_report(record, str(tmp_path / "r.html")))
    _check_self_contained(report, raw)
    with_sis = sum(r.sis is not None for r in res)
    assert report.text("images").count("overlay skipped") == with_sis >= 1
    assert len(report.imgs["images"]) == N  # the original only, no overlay panels
    widths = [_png_size(src)[0] for src in report.imgs["images"]]
    assert max(widths) < 1.5 * min(widths)  # every figure is one panel wide
    assert "No heatmap" in report.text("heatmaps") and len(report.imgs["heatmaps"]) == 0
    assert len(report.imgs["location"]) == 0


def _png_size(src: str) -> tuple[int, int]:
    data = base64.b64decode(src.split(",", 1)[1])
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_three_panel_figures_are_wider_than_the_original_alone(single, single_report):
    report, _ = _parse(single_report)
    widths = [_png_size(src)[0] for src in report.imgs["images"]]
    no_sis = [i for i, r in enumerate(single.models[0].results) if r.sis is None]
    assert len(no_sis) == 1
    lone = widths[no_sis[0]]
    assert all(w > 2 * lone for i, w in enumerate(widths) if i not in no_sis)


def test_identical_models_give_n_a_not_a_crash(runs, tmp_path):
    x, _, res = runs
    r = res["cnn A"][0]
    record = AuditRecord("same", ["only"], _displays(x[:1]), [None], {},
                         [ModelRecord(n, "exact", [r]) for n in ("one", "two")])
    report, _ = _parse(build_report(record, str(tmp_path / "r.html")))
    comparison = report.text("comparison")
    assert "all values identical" in comparison and "1.000" in comparison  # Dice of a SIS with itself


def test_safe_test_guards():
    assert isinstance(safe_test(kruskal_wallis, [[1.0, 2.0], [3.0, 4.0]]), tuple)
    assert safe_test(kruskal_wallis, [[0.1, 0.1], [0.1]]) == "n/a: all values identical"
    assert safe_test(kruskal_wallis, [[0.1, 0.2], []]).startswith("n/a")
    assert safe_test(friedman, [[0.1, 0.2], [0.3, 0.1]], min_groups=3).startswith("n/a")
    assert safe_test(friedman, [[0.1], [0.3], [0.2]], min_groups=3, min_values=2).startswith("n/a")
    stat, p = safe_test(friedman, [[0.1, 0.2, 0.3], [0.3, 0.1, 0.2], [0.2, 0.3, 0.4]], min_groups=3)
    assert 0 <= p <= 1 and math.isfinite(stat)


def test_border_mask_and_fractions(single):
    b = border_mask((10, 10))
    assert b.sum() == 100 - 8 * 8 and not b[1:9, 1:9].any() and b[0].all() and b[:, -1].all()
    wide = border_mask((224, 224))
    assert wide.mean() == pytest.approx(1 - (224 - 44) ** 2 / 224 ** 2)
    got = border_fractions(single, single.models[0])
    for r, g in zip(single.models[0].results, got):
        if r.sis is None or r.size == 0:
            assert math.isnan(g)
        else:
            assert g == fraction_inside(r.mask.numpy(), border_mask((H, W)))


def test_sis_panels_and_figure(tmp_path):
    img = np.arange(12, dtype=np.uint8).reshape(2, 2, 3) * 20
    mask = np.array([[True, False], [False, False]])
    norm, overlay, alone = sis_panels(img, mask)
    assert norm.min() == 0 and norm.max() == 1 and norm.shape == (2, 2, 3)
    assert overlay[0, 0].tolist() == [1.0, 0.1, 0.1] and np.allclose(overlay[1, 1], 0.6 * norm[1, 1].mean())
    assert np.array_equal(alone[0, 0], norm[0, 0]) and (alone[1, 1] == 0.5).all()
    _, overlay_none, alone_none = sis_panels(img[..., 0], None)
    assert (alone_none == 0.5).all() and overlay_none.shape == (2, 2, 3)
    sis_figure([img, img[..., 0]], [mask, None], ["a", "b"], str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs the chromium binary")
def test_report_renders_in_headless_chromium(three_report, tmp_path):
    html_path = three_report
    shot = tmp_path / "shot.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,2400", f"file://{html_path}"], timeout=90, capture_output=True)
    assert shot.exists()
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (2400, 1200) and pixels[..., :3].var() > 0
