"""The audit's saved results (save_audit / load_audit) and its HTML report, on tiny seeded CNNs.

audit/report.py's computing helpers by hand (the numbers a reader of the report takes away): the formatting of
numbers and intervals, tables, the border band, the 5% subsets, where SIS pixels lie, the guarded tests, the curve's
thresholds, pairwise overlap and the headline sentence. The tests above build whole reports.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
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
from overinterp_fast.audit.persist import load_audit, save_audit
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.audit.store import RESULTS_FILE
from overinterp_fast.audit.table import TABLE_FILE
from overinterp_fast.audit.metrics import border_fractions, border_mask
from overinterp_fast.audit.report import (
    build_report,
    rebuild_report,
    safe_test,
)
from overinterp_fast.audit.plotting import sis_figure, sis_panels
from helpers import make_cnn, make_images
from scipy import stats
from overinterp_fast.audit import metrics, report
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.methods.results import SISResult

N, H, W = 4, 8, 8
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CLASS_NAMES = {0: "tabby <cat>", 1: "dog & co", 2: "espresso", 3: "missile", 4: "four"}
ALL_SECTIONS = ["summary", "images", "sis-sizes", "classes", "heatmaps", "location", "comparison", "transfer"]


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
        "cnn A": of.fast_sis(nets["cnn A"], x, _thresholds(nets["cnn A"], x, 3, 0.6), collection=True,
                             show_progress=False),
        "cnn B": of.fast_sis(nets["cnn B"], x, _thresholds(nets["cnn B"], x, 0), method="gradient", show_progress=False,
                             options=of.GradientOptions(k=8)),
        "cnn C": of.fast_sis(nets["cnn C"], x, _thresholds(nets["cnn C"], x, 2), show_progress=False),
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


# the first test of the module's ``runs`` fixture (SIS of three CNNs, built once), so not marked slow: deselecting
# it would move the fixture's cost to the next test; measured 72 s wall (13 s CPU) at a load average of about 11,
# 7 s at 5
@pytest.mark.timeout(120)
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
            # exact SIS: no query counts and no refinement (the responsibility columns: cli/test_cli.py)
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
    assert counts == {"summary": 0, "images": N * n_models, "sis-sizes": 2, "classes": 0, "heatmaps": n_models,
                      "location": 1, "comparison": 0, "transfer": 0}

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
    res = of.fast_sis(nets["cnn A"], x, _thresholds(nets["cnn A"], x, 3), feature_mask=patches, show_progress=False)
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


# ----------------------------------------------------------------------------------------------------
# audit/report.py's computing helpers by hand (the numbers a reader of the report takes away): the formatting of
# ----------------------------------------------------------------------------------------------------


def _r(sis, grid=(10, 10), target=1, score=0.9, threshold=0.5, blocks=None, order=None):
    p = grid[0] * grid[1]
    mask = None
    if sis is not None:
        mask = torch.zeros(grid, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(p) if order is None else order, values=torch.zeros(p), target=target,
                     score=score, threshold=threshold, sis=None if sis is None else torch.tensor(sis), mask=mask,
                     blocks=blocks)


def _small_record(results_by_model, labels=None, grid=(10, 10), methods=None):
    n = len(next(iter(results_by_model.values())))
    models = [ModelRecord(name, (methods or {}).get(name, "exact"), res) for name, res in results_by_model.items()]
    return AuditRecord("t", [f"i{k}" for k in range(n)], [np.zeros(grid, np.uint8)] * n, labels or [None] * n,
                       {1: "one", 2: "two"}, models)


@pytest.mark.mutation
def test_number_and_percent_formatting():
    assert report._esc('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert report._finite(0.0) and report._finite(-3) and not report._finite(None)
    assert not report._finite(float("nan")) and not report._finite(float("inf"))
    assert report._num(1234.5) == "1.23e+03" and report._num(0.12345) == "0.123" and report._num(2, ".2f") == "2.00"
    assert report._num(None) == "n/a" and report._num(float("nan")) == "n/a" and report._num(float("-inf")) == "n/a"
    assert report._pct(0.1234) == "12.3%" and report._pct(1) == "100.0%" and report._pct(0.5, 0) == "50%"
    assert report._pct(None) == "n/a" and report._pct(float("nan")) == "n/a"
    assert report._ci(0.1, 0.25) == "[10.0%, 25.0%]"
    assert report._ci(float("nan"), 0.2) == "n/a" and report._ci(0.1, None) == "n/a"


@pytest.mark.mutation
def test_fraction_ci_is_the_t_interval_clipped_to_the_unit_interval():
    v = [0.1, 0.2, 0.6]
    m, lo, hi = report.fraction_ci(v)
    t_lo, t_hi = stats.t.interval(0.95, 2, loc=0.3, scale=stats.sem(v))
    assert m == pytest.approx(0.3) and t_lo < 0 and t_hi < 1
    assert lo == 0.0 and hi == pytest.approx(t_hi)  # clipped below at 0
    m, lo, hi = report.fraction_ci([0.9, 0.95, 0.85])
    t_lo, t_hi = stats.t.interval(0.95, 2, loc=0.9, scale=stats.sem([0.9, 0.95, 0.85]))
    assert t_hi > 1 and hi == 1.0 and lo == pytest.approx(t_lo) and t_lo > 0  # clipped above at 1
    m, lo, hi = report.fraction_ci([0.3])  # one value: no interval
    assert m == 0.3 and math.isnan(lo) and math.isnan(hi)
    m, lo, hi = report.fraction_ci([0.2, 0.2])  # identical values: NaN, no warning raised
    assert m == pytest.approx(0.2)
    m, lo, hi = report.fraction_ci([0.4, 0.45, 0.5])  # inside [0, 1]: unchanged
    assert (lo, hi) == pytest.approx(stats.t.interval(0.95, 2, loc=0.45, scale=stats.sem([0.4, 0.45, 0.5])))
    assert 0 < lo < hi < 1


@pytest.mark.mutation
def test_html_pieces():
    assert report._p("a < b") == "<p>a &lt; b</p>" and report._p("x", "note") == '<p class="note">x</p>'
    assert report._section("s<", "T&", "body") == '<section id="s&lt;">\n<h2>T&amp;</h2>\nbody\n</section>'
    html = report._table(["a", "b<"], [[1, "x"], ["12.5%", "n/a"], ["[1.0%, 2.0%]", "-3e-05"], [2.5, "word 1"]])
    assert html == ("<table><thead><tr><th>a</th><th>b&lt;</th></tr></thead><tbody>"
                    '<tr><td class="num">1</td><td>x</td></tr>'
                    '<tr><td class="num">12.5%</td><td class="num">n/a</td></tr>'
                    '<tr><td class="num">[1.0%, 2.0%]</td><td class="num">-3e-05</td></tr>'
                    '<tr><td class="num">2.5</td><td>word 1</td></tr></tbody></table>')
    assert report._json("text") == "text" and report._json({"b": 1, "a": (2,)}) == '{"a": [2], "b": 1}'
    assert report._json({"device": torch.device("cpu")}) == '{"device": "cpu"}'  # anything else as its str


def test_the_run_table_is_text_and_versions_are_no_numbers():
    """Versions, the command and the other facts of the run read as text (left-aligned); "2.14.1" is no number
    anywhere."""
    record = dataclasses.replace(_small_record({"m": [_r([1, 2])]}), meta={
        "overinterp_fast": "0.1.0", "torch": "2.14.1+cu130", "python": "3.12", "seed": 0,
        "command": "overinterp-fast audit --model net.pt2"})
    run = report.summary_section(record).split("<h3>Run</h3>")[1]
    for cell in ("0.1.0", "2.14.1+cu130", "3.12", "0", "overinterp-fast audit --model net.pt2"):
        assert f"<td>{cell}</td>" in run
    assert 'class="num"' not in run
    assert report._table(["v"], [["2.14.1"], ["1.5"], [".5"], ["3."], ["1.2.3e4"], ["1..2"]]) == (
        "<table><thead><tr><th>v</th></tr></thead><tbody><tr><td>2.14.1</td></tr>"
        '<tr><td class="num">1.5</td></tr><tr><td class="num">.5</td></tr><tr><td class="num">3.</td></tr>'
        "<tr><td>1.2.3e4</td></tr><tr><td>1..2</td></tr></tbody></table>")
    assert report._table(["n"], [[1.5]], numbers=False) == "<table><thead><tr><th>n</th></tr></thead><tbody>" \
        "<tr><td>1.5</td></tr></tbody></table>"


@pytest.mark.mutation
def test_border_mask_by_hand():
    m = metrics.border_mask((10, 10))  # 10% of 10: a band one pixel wide
    assert m.sum() == 100 - 64 and not m[1:9, 1:9].any() and m[0].all() and m[:, 9].all()
    m = metrics.border_mask((20, 10), 0.2)  # 4 rows and 2 columns
    assert m.sum() == 200 - 12 * 6 and not m[4:16, 2:8].any() and m[3, 5] and m[4, 1]
    m = metrics.border_mask((3, 4), 0.01)  # at least one pixel wide
    assert m.sum() == 12 - 2 and not m[1, 1] and not m[1, 2]
    assert metrics.border_mask((10, 10)).dtype == bool


@pytest.mark.mutation
def test_subset_mask_and_grids():
    order = torch.tensor([3, 0, 1, 2])  # the last 5% of 4: one feature, id 2
    assert metrics.subset_mask(order, (2, 2)).tolist() == [[False, False], [True, False]]
    assert metrics.subset_mask(order, (2, 2), 0.5).tolist() == [[False, True], [True, False]]  # ids 1 and 2
    assert metrics.subset_mask(order, (3, 2)) is None  # not on that grid
    assert metrics.grid_shape(np.zeros((4, 5, 3))) == (4, 5) and metrics.grid_shape(np.zeros((4, 5))) == (4, 5)
    r = _r([0], grid=(4, 5))
    assert metrics.on_grid(r, np.zeros((4, 5, 3))) and not metrics.on_grid(r, np.zeros((5, 4)))
    assert not metrics.on_grid(_r(None, grid=(4, 5)), np.zeros((4, 5)))
    rec = _small_record({"m": [_r([0]), _r(None)]})
    assert metrics.common_grid(rec, rec.models[0]) == (10, 10)
    rec.displays[1] = np.zeros((8, 10), np.uint8)
    assert metrics.common_grid(rec, rec.models[0]) is None  # two grids
    rec = _small_record({"m": [_r([0], grid=(5, 20)), _r([1])]})
    assert metrics.common_grid(rec, rec.models[0]) is None  # a mask off the grid


@pytest.mark.mutation
def test_fractions_correctness_and_border_by_hand():
    # image 0: 4 pixels, 3 in the border band; image 1: no SIS; image 2: 2 pixels, none in the band
    rec = _small_record({"m": [_r([0, 1, 9, 55]), _r(None, target=2), _r([44, 45], target=2)]}, labels=[1, None, 1])
    m = rec.models[0]
    assert metrics.sis_fractions(m).tolist() == [0.04, 0.02]
    assert metrics.correctness(rec, m) == [True, None, False]
    b = metrics.border_fractions(rec, m)
    assert b[0] == 0.75 and math.isnan(b[1]) and b[2] == 0.0
    regions = [np.ones((10, 10), bool), np.ones((10, 10), bool), np.eye(10, dtype=bool)]
    inside = metrics.inside_fractions(rec, m, regions)
    assert inside[0] == 1.0 and math.isnan(inside[1]) and inside[2] == 0.5  # pixel 44 is (4, 4): on the diagonal
    assert metrics.border_share(rec) == pytest.approx(0.36)
    rec.displays = [np.zeros((10, 10), np.uint8), np.zeros((10, 10), np.uint8), np.zeros((15, 15), np.uint8)]
    # 15 x 15: bands of round(1.5) = 2 pixels, an inner 11 x 11
    assert metrics.border_share(rec) == pytest.approx((0.36 + 0.36 + (225 - 121) / 225) / 3)
    # another band width: 20% of 10 is 2 pixels
    rec2 = _small_record({"m": [_r([0, 11, 22, 55])]})
    wide = metrics.border_fractions(rec2, rec2.models[0], 0.2)
    assert wide[0] == 0.5  # pixels 0 and 11 ((1, 1)) lie in the band; 22 ((2, 2)) and 55 do not
    assert metrics.border_share(_small_record({"m": [_r([0])]}), 0.2) == pytest.approx(0.64)
    empty = _small_record({"m": [_r([])]})  # an empty SIS has no pixels to place
    assert math.isnan(metrics.border_fractions(empty, empty.models[0])[0])


@pytest.mark.mutation
def test_safe_test_reasons():
    kw = report.kruskal_wallis
    assert report.safe_test(kw, [[1, 2]]) == "n/a: needs 2 groups"
    assert report.safe_test(kw, [[1, 2], [3]], min_groups=3) == "n/a: needs 3 groups"
    assert report.safe_test(kw, [[1, 2], []]) == "n/a: a group has no values"
    assert report.safe_test(kw, [[1, 2], [3]], min_values=2) == "n/a: needs 2 values per group"
    assert report.safe_test(kw, [[1, 1], [1]]) == "n/a: all values identical"
    stat, p = report.safe_test(kw, [[1, 2, 3], [4, 5, 6]])
    want = stats.kruskal([1, 2, 3], [4, 5, 6])
    assert (stat, p) == pytest.approx((want.statistic, want.pvalue))
    assert report.safe_test(lambda g: (_ for _ in ()).throw(ValueError("bad")), [[1], [2]]) == "n/a: bad"
    assert report.safe_test(lambda g: 1 / 0, [[1], [2]]) == "n/a: division by zero"
    assert report.safe_test(lambda g: (float("nan"), 0.5), [[1], [2]]) == "n/a: not defined for these values"
    assert report.safe_test(lambda g: (1.0, float("inf")), [[1], [2]]) == "n/a: not defined for these values"
    assert report._test_cells((1.23456, 0.5)) == ["1.23", "0.5"]
    assert report._test_cells("n/a: why") == ["n/a: why", "n/a"]


@pytest.mark.mutation
def test_curve_thresholds_and_exactness():
    models = [ModelRecord("a", "exact", [_r([0], score=0.8, threshold=0.3), _r([1], score=0.95, threshold=0.6)])]
    t = report.curve_thresholds(models, points=5)
    assert t.tolist() == pytest.approx(np.linspace(0.3, 0.95, 5).tolist())  # lowest tau to highest f(x)
    models = [ModelRecord("a", "exact", [_r([0], score=0.999, threshold=0.7)])]
    assert report.curve_thresholds(models, 3).tolist() == pytest.approx([0.5, 0.745, 0.99])  # capped: 0.5, 0.99
    models = [ModelRecord("a", "exact", [_r([0], score=0.4, threshold=0.6)])]
    assert report.curve_thresholds(models).tolist() == [0.5]  # f(x) below 0.5: one point, the low end
    assert len(report.curve_thresholds([ModelRecord("a", "exact", [_r([0])])])) == 20  # CURVE_POINTS
    nan_scores = [ModelRecord("a", "exact", [_r([0], score=float("nan"), threshold=0.2)])]
    assert report.curve_thresholds(nan_scores, 3).tolist() == pytest.approx([0.2, 0.595, 0.99])  # up to 0.99
    flat = [ModelRecord("a", "exact", [_r([0], score=0.5, threshold=0.5)])]
    assert report.curve_thresholds(flat).tolist() == [0.5]  # one point, not 20 equal ones
    assert report.is_exact(ModelRecord("a", "exact", [_r([0])]))
    assert not report.is_exact(ModelRecord("a", "gradient", [_r([0])]))
    assert not report.is_exact(ModelRecord("a", "exact", [_r([0], blocks=torch.tensor([0, 50, 100]))]))


@pytest.mark.mutation
def test_pair_overlap_and_matched_fractions():
    a = ModelRecord("a", "exact", [_r([0, 1]), _r([5]), _r(None), _r([], grid=(10, 10))])
    b = ModelRecord("b", "exact", [_r([1, 2]), _r([5], grid=(5, 20)), _r([3]), _r([7])])
    n, d, h = report.pair_overlap(a, b)
    # image 0: Dice 2 x 1 / 4 = 0.5, Hausdorff 1 pixel; image 1: other shapes; image 2: no SIS in a;
    # image 3: Dice of an empty and a 1-pixel set is 0, no Hausdorff (empty)
    assert n == 2 and d == pytest.approx(0.25) and h == pytest.approx(1.0)
    n, d, h = report.pair_overlap(ModelRecord("x", "exact", [_r(None)]), ModelRecord("y", "exact", [_r([1])]))
    assert n == 0 and math.isnan(d) and math.isnan(h)
    fr = report.matched_fractions([a, b])
    assert fr.tolist() == [[0.02, 0.01, 0.0], [0.02, 0.01, 0.01]]  # images 0, 1 and 3 (2: no SIS in a)
    assert report.matched_fractions([ModelRecord("x", "exact", [_r(None)])]).shape == (1, 0)


@pytest.mark.mutation
def test_headline_sentences():
    rec = _small_record({"m": [_r([0, 1, 9, 55]), _r(None, target=2), _r([44, 45], target=2)]}, labels=[1, None, 1])
    assert report.headline(rec, rec.models[0]) == (
        "m (exact): 2 of 3 images reach f(x) >= tau and have a SIS; median SIS: 3.0% of the pixels; on average "
        "37.5% of SIS pixels lie in the outer 10% border, which is 36.0% of the image, more than the border's share "
        "of the area: the SIS lean on the image's edges (often background); 1 of 2 labelled images are classified "
        "correctly.")
    rec = _small_record({"g": [_r([44]), _r([45])]}, methods={"g": "gradient"})
    assert report.headline(rec, rec.models[0]) == (
        "g (gradient): 2 of 2 images reach f(x) >= tau and have a SIS; median SIS: 1.0% of the pixels; on average "
        "0.0% of SIS pixels lie in the outer 10% border, which is 36.0% of the image, no more than the border's "
        "share of the area.")
    # exactly the border's share (9 of 25 SIS pixels, 36%): "no more than"
    band = [0, 1, 2, 3, 4, 5, 6, 7, 8] + [k for k in range(11, 89) if 1 <= k % 10 <= 8][:16]
    rec = _small_record({"e": [_r(band)]})
    assert report.border_fractions(rec, rec.models[0])[0] == pytest.approx(0.36)
    assert "which is 36.0% of the image, no more than the border's share of the area" in report.headline(
        rec, rec.models[0])
    rec = _small_record({"n": [_r(None)]})
    assert report.headline(rec, rec.models[0]) == "n (exact): 0 of 1 images reach f(x) >= tau and have a SIS."
    rec = _small_record({"f": [_r([3], grid=(2, 50))]})  # masks off the display grid: features, no border figure
    assert report.headline(rec, rec.models[0]) == (
        "f (exact): 1 of 1 images reach f(x) >= tau and have a SIS; median SIS: 1.0% of the features.")
