"""The command line's commands checked piece by piece: ``_prepare`` on real model files and an image folder (every
check and default written out), and ``_run_sis``, ``_run_audit``, ``_sis_png`` and ``main`` with recorders in place
of the jobs they start (run_audit, run_stored_audit, run_demo, rebuild_report, run_reduce, digits_pipeline), so that
every option the user gives is seen arriving. test_audit_cli.py, test_demo.py and test_text_zoo.py run the commands
whole."""
import json
import os
import types

import numpy as np
import pytest
import torch

import overinterp_fast as of
from overinterp_fast import cli
from overinterp_fast.audit import distributed, records, stream
from overinterp_fast.audit import runner as audit_runner
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.results import SISResult

from test_audit_cli import image_folder, model_files  # noqa: F401  (fixtures shared with those tests)


@pytest.fixture(scope="module")
def files(tmp_path_factory, model_files, image_folder):
    """test_audit_cli.py's two model files (torch.export and ONNX, 5 classes) and folder of 3 photos (12 x 10), and
    two class-names files."""
    root = tmp_path_factory.mktemp("cli")
    (root / "names.txt").write_text("zero\none\ntwo\nthree\nfour\n")
    (root / "three.txt").write_text("zero\none\ntwo\n")
    return {"a": model_files["a"], "b": model_files["b"], "images": str(image_folder),
            "names": str(root / "names.txt"), "three": str(root / "three.txt"), "root": root}


def _args(*argv):
    return cli.build_parser().parse_args(list(argv))


def _audit_args(files, *more):
    return _args("audit", "--model", files["a"], "--model", files["b"], "--images", files["images"], "--size", "8",
                 "--out", str(files["root"] / "out"), "--method", "exact", *more)


# ---------------------------------------------------------------------------------------------- _prepare


def test_prepare_models_source_namer_k_and_normalization(files):
    loaded, source, namer, k, (mean, std) = cli._prepare(_audit_args(files), True, torch.device("cpu"))
    assert [m.name for m in loaded] == ["a", "b"] and len(source) == 3 and source.size == 8
    assert source.image_names == ["img0", "img1", "img2"]
    assert k == 500  # the CPU default (100 on CUDA)
    assert (mean, std) == (0.5, 0.5)  # nothing known from the models: mid-grey
    assert namer(3) == "3"  # 5 classes, no names: the index
    x = source[0]["x"]
    assert x.shape == (3, 8, 8) and float(x.min()) >= -1.0 and float(x.max()) <= 1.0  # (pixel - 0.5) / 0.5
    loaded, source, namer, k, (mean, std) = cli._prepare(
        _audit_args(files, "--k", "7", "--mean", "0.25", "--std", "0.125", "--class-names", files["names"],
                    "--limit", "2"), True, torch.device("cpu"))
    assert k == 7 and (mean, std) == ([0.25], [0.125]) and namer(3) == "three" and len(source) == 2
    _, source, _, _, _ = cli._prepare(_audit_args(files, "--select", "1:3"), True, torch.device("cpu"))
    assert source.image_names == ["img1", "img2"]
    _, source, _, _, _ = cli._prepare(_audit_args(files, "--limit", "1"), True, "cpu")  # one image is enough
    assert len(source) == 1
    # the size from the ONNX file's fixed input, when not given
    _, source, _, _, _ = cli._prepare(_args("audit", "--model", files["b"], "--images", files["images"], "--out", "o",
                                            "--method", "exact"), True, "cpu")
    assert source.size == 8
    # labels, object masks
    labels = files["root"] / "labels.json"
    labels.write_text(json.dumps({"img0": 3, "img1": 1, "img2": 4}))
    masks = files["root"] / "masks"
    masks.mkdir(exist_ok=True)
    from PIL import Image

    for i in range(3):
        Image.fromarray(np.full((12, 10), 255, np.uint8)).save(masks / f"img{i}.png")
    _, source, _, _, _ = cli._prepare(_audit_args(files, "--labels", str(labels), "--object-masks", str(masks)),
                                      True, "cpu")
    assert source.image_labels == [3, 1, 4] and source.object_dir == str(masks)
    assert source[0]["object"] is not None and bool(source[0]["object"].all())

    one = _args("sis", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o",
                "--method", "exact")
    loaded, source, _, _, _ = cli._prepare(one, False, torch.device("cpu"))
    assert [m.name for m in loaded] == ["a"]


def test_prepare_names_classes_after_the_folders(files, tmp_path):
    from PIL import Image

    for i, cls in enumerate(["ant", "bee", "cat", "dog", "eel"]):  # 5 folders for the 5-class models
        (tmp_path / cls).mkdir()
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(tmp_path / cls / "x.png")
    _, source, namer, _, _ = cli._prepare(_args("audit", "--model", files["a"], "--images", str(tmp_path), "--size",
                                                "8", "--out", "o", "--method", "exact"), True, "cpu")
    assert source.image_labels == [0, 1, 2, 3, 4] and namer(2) == "cat"


def test_prepare_reads_cifar_batches(files, tmp_path):
    from test_stored_audit import write_cifar

    data = write_cifar(tmp_path, 4)
    args = _args("audit", "--model", files["a"], "--dataset", "cifar10", "--data-dir", str(tmp_path), "--split",
                 "test", "--size", "8", "--out", "o", "--method", "exact")
    _, source, namer, _, _ = cli._prepare(args, True, "cpu")
    assert len(source) == 4 and source.image_labels == [0, 1, 2, 3] and source.classes[:2] == ["class0", "class1"]
    assert source[0]["display"].shape == (8, 8, 3) and data.shape == (4, 3072)
    with pytest.raises((ValueError, FileNotFoundError)):  # there is no training batch in this folder
        cli._prepare(_args("audit", "--model", files["a"], "--dataset", "cifar10", "--data-dir", str(tmp_path),
                           "--split", "train", "--size", "8", "--out", "o", "--method", "exact"), True, "cpu")


def test_prepare_reports_the_models_first_error_line(files, monkeypatch):
    import overinterp_fast.loading as loading

    def failing(message, kind=RuntimeError):
        def model(x):
            raise kind(message)
        return loading.LoadedModel(model, "m")

    for model, shown in ((failing("bad channels\nsecond line\n"), "bad channels"),
                         (failing("   "), "RuntimeError"), (failing("", AssertionError), "AssertionError")):
        monkeypatch.setattr(loading, "load_model", lambda spec, device, model=model: model)
        with pytest.raises(ValueError) as err:
            cli._prepare(_args("sis", "--model", "x", "--images", files["images"], "--size", "8", "--out", "o",
                               "--method", "exact"), False, "cpu")
        assert str(err.value) == f"m fails on an input of shape [1, 3, 8, 8] (check --size, --grey): {shown}"


def test_prepare_errors_are_whole_sentences(files):
    with pytest.raises(ValueError, match="^two models share a name: \\['a', 'a'\\]$"):
        cli._prepare(_args("audit", "--model", files["a"], "--model", files["a"], "--images", files["images"],
                           "--size", "8", "--out", "o", "--method", "exact"), True, "cpu")
    with pytest.raises(ValueError) as err:
        cli._prepare(_args("audit", "--model", files["a"], "--model", files["b"], "--images", files["images"],
                           "--size", "8", "--out", "o"), True, "cpu")  # the default method is gradient
    assert str(err.value) == ("b: method 'gradient' needs a torch model (ONNX Runtime has no gradients); use "
                              "--method responsibility or exact")
    cli._prepare(_args("audit", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o"),
                 True, "cpu")  # gradient on a torch model: fine
    with pytest.raises(ValueError, match="^give --images or --dataset, not both$"):
        cli._prepare(_audit_args(files, "--dataset", "cifar10"), True, "cpu")
    with pytest.raises(ValueError, match="^the input size is not known from the model: give --size$"):
        cli._prepare(_args("audit", "--model", files["a"], "--images", files["images"], "--out", "o",
                           "--method", "exact"), True, "cpu")
    with pytest.raises(ValueError) as err:
        cli._prepare(_audit_args(files, "--grey"), True, "cpu")
    assert str(err.value).startswith("a fails on an input of shape [1, 1, 8, 8] (check --size, --grey): ")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="has 3 class names; the model has 5 classes"):
        cli._prepare(_audit_args(files, "--class-names", files["three"]), True, "cpu")


# ---------------------------------------------------------------------------------------------- _run_sis


def test_run_sis_passes_every_option_to_run_audit(files, monkeypatch):
    seen = {}
    monkeypatch.setattr(audit_runner, "run_audit", lambda models, x, names, displays, **kw: seen.update(
        models=models, x=x, names=names, displays=displays, **kw) or "the record")
    args = _args("sis", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o",
                 "--method", "exact", "--threshold", "0.7", "--threshold-mode", "relative", "--k", "9",
                 "--collection", "--quiet", "--limit", "2")
    assert cli._run_sis(args) == "the record"
    assert list(seen["models"]) == ["a"] and seen["x"].shape == (2, 3, 8, 8) and seen["x"].dtype == torch.float32
    assert seen["names"] == ["img0", "img1"] and seen["displays"].shape == (2, 8, 8, 3)
    assert seen["displays"].dtype == np.uint8 and seen["labels"] == [None, None]
    assert (seen["threshold"], seen["threshold_mode"], seen["method"], seen["k"]) == (0.7, "relative", "exact", 9)
    assert seen["collection"] is True and seen["progress"] is False and seen["title"] == "SIS"
    assert seen["class_name"](2) == "2"
    src = of.datasets.open_images(files["images"], 8, 0.5, 0.5)
    assert seen["meta"] == {"models": [files["a"]], "image source": src.description}
    torch.testing.assert_close(seen["x"][1], src[1]["x"], rtol=0, atol=0)
    cli._run_sis(_args("sis", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o"))
    assert seen["progress"] is None and seen["collection"] is False and seen["method"] == "gradient"
    assert seen["threshold"] == 0.9 and seen["threshold_mode"] == "auto" and seen["k"] == 500


# ---------------------------------------------------------------------------------------------- _run_audit


def test_run_audit_passes_every_option_and_tears_down(files, monkeypatch):
    seen, events = {}, []
    ranks = distributed.Ranks()
    monkeypatch.setattr(distributed, "setup", lambda device: events.append(("setup", device)) or ranks)
    monkeypatch.setattr(distributed, "teardown", lambda r: events.append(("teardown", r)))
    monkeypatch.setattr(stream, "run_stored_audit", lambda models, source, out, **kw: seen.update(
        models=models, source=source, out=out, **kw) or "the run")
    out = str(files["root"] / "audit-out")
    args = _audit_args(files, "--out", out, "--chunk-size", "5", "--restart", "--workers", "0", "--batch-size", "11",
                       "--threshold", "0.6", "--threshold-mode", "absolute", "--k", "3", "--collection", "--ensemble",
                       "--fraction", "0.1", "--quiet", "--title", "T", "--gallery", "4", "--class-names",
                       files["names"])
    assert cli._run_audit(args) == "the run"
    assert events == [("setup", "cpu"), ("teardown", ranks)]
    assert list(seen["models"]) == ["a", "b"] and len(seen["source"]) == 3 and seen["out"] == out
    assert seen["ranks"] is ranks
    assert seen["config"] == {"model_files": [files["a"], files["b"]], "class_names": files["names"]}
    assert (seen["chunk_size"], seen["restart"], seen["workers"], seen["batch_size"]) == (5, True, 0, 11)
    assert (seen["threshold"], seen["threshold_mode"], seen["method"], seen["k"]) == (0.6, "absolute", "exact", 3)
    assert seen["collection"] is True and seen["ensemble"] is True and seen["fraction"] == 0.1
    assert seen["progress"] is False and seen["title"] == "T" and seen["gallery"] == 4
    assert seen["class_name"](1) == "one"
    assert seen["meta"] == {"models": [files["a"], files["b"]], "image source": seen["source"].description}
    assert "noise_sigma" not in seen and "value_range" not in seen  # no object masks: no noise test
    # the defaults; and the group is left even when the job fails
    monkeypatch.setattr(stream, "run_stored_audit", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli._run_audit(_audit_args(files))
    assert events[-1] == ("teardown", ranks)
    with pytest.raises(ValueError, match="^give --images or --dataset, not both$"):
        cli._run_audit(_audit_args(files, "--dataset", "cifar10"))
    assert events[-1] == ("teardown", ranks) and len(events) == 6


def test_run_audit_defaults_and_noise_units(files, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(stream, "run_stored_audit", lambda models, source, out, **kw: seen.update(kw) or "run")
    masks = tmp_path / "masks"
    masks.mkdir()
    from PIL import Image

    for i in range(3):
        Image.fromarray(np.full((12, 10), 255, np.uint8)).save(masks / f"img{i}.png")
    cli._run_audit(_audit_args(files, "--object-masks", str(masks), "--noise-sigma", "0.2"))
    assert (seen["chunk_size"], seen["restart"], seen["workers"], seen["batch_size"]) == (64, False, 2, None)
    assert seen["ensemble"] is False and seen["fraction"] == 0.05 and seen["progress"] is None
    assert seen["title"] == "Overinterpretation audit" and seen["gallery"] == 24 and seen["k"] == 500
    assert seen["config"]["class_names"] is None
    # sigma 0.2 of the pixel range is 0.4 in inputs normalized by (x - 0.5) / 0.5; valid inputs lie in [-1, 1]
    torch.testing.assert_close(seen["noise_sigma"].flatten(), torch.tensor([0.4]))
    lo, hi = seen["value_range"]
    torch.testing.assert_close(lo.flatten(), torch.tensor([-1.0]))
    torch.testing.assert_close(hi.flatten(), torch.tensor([1.0]))


# ---------------------------------------------------------------------------------------------- _sis_png


def _result(sis, grid=(4, 5), score=0.25, threshold=0.125, target=1):
    mask = torch.zeros(grid, dtype=torch.bool)
    if sis is not None:
        mask.view(-1)[torch.tensor(sis)] = True
    return SISResult(order=torch.arange(20), values=torch.zeros(20), target=target, score=score,
                     threshold=threshold, sis=None if sis is None else torch.tensor(sis),
                     mask=None if sis is None else mask)


def test_sis_png_rows(monkeypatch, tmp_path):
    drawn = {}
    import overinterp_fast.plotting as plotting

    monkeypatch.setattr(plotting, "sis_figure", lambda images, masks, titles, path: drawn.update(
        images=images, masks=masks, titles=titles, path=path))
    displays = [np.zeros((4, 5), np.uint8), np.ones((4, 5, 3), np.uint8), np.zeros((2, 2), np.uint8)]
    results = [_result([0, 1]), _result(None, target=2), _result([3])]  # the third mask is not on its grid
    rec = AuditRecord("t", ["first", "second", "third"], displays, [None] * 3,
                      {1: "a class name longer than eighteen", 2: "two"}, [ModelRecord("m", "exact", results)])
    path = str(tmp_path / "s.png")
    assert cli._sis_png(rec, path) == path and drawn["path"] == path
    assert drawn["images"] == displays
    assert drawn["masks"][0].tolist() == results[0].mask.numpy().tolist() and drawn["masks"][1] is None
    assert drawn["masks"][2] is None
    assert drawn["titles"] == ["first\na class name longe\nf=0.25 tau=0.12\nSIS 10.0%",
                               "second\ntwo\nf=0.25 tau=0.12", "third\na class name longe\nf=0.25 tau=0.12\nSIS 5.0%"]


# ---------------------------------------------------------------------------------------------- main


def test_main_demo_passes_its_options(monkeypatch):
    import overinterp_fast.demo as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: seen.append({"out": out, **kw}))
    assert cli.main(["demo"]) == 0
    assert seen[-1] == {"out": "out/demo", "n_images": 12, "threshold": 0.9, "compare_reference": True,
                        "imagenet": True, "k": None, "text": True, "device": "cpu"}
    assert cli.main(["demo", "--out", "d", "--images", "3", "--threshold", "0.5", "--no-reference", "--no-imagenet",
                     "--no-text", "--k", "40"]) == 0
    assert seen[-1] == {"out": "d", "n_images": 3, "threshold": 0.5, "compare_reference": False,
                        "imagenet": False, "k": 40, "text": False, "device": "cpu"}


def test_main_sis_prints_and_writes(monkeypatch, capsys, tmp_path):
    rec = AuditRecord("t", ["x"], [np.zeros((4, 5), np.uint8)], [None], {1: "one"},
                      [ModelRecord("m", "exact", [_result([0])])])
    monkeypatch.setattr(cli, "_run_sis", lambda args: rec)
    saved = []
    monkeypatch.setattr(records, "save_audit", lambda record, out: saved.append((record, out)) or f"{out}/r.json")
    monkeypatch.setattr(cli, "_sis_png", lambda record, path: f"png at {path}" if record is rec else "another")
    out = str(tmp_path / "o")
    assert cli.main(["sis", "--model", "m", "--out", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"wrote {out}/r.json", f"wrote png at {os.path.join(out, 'sis.png')}"]
    assert lines[0].startswith("model") and lines[1].startswith("m ")  # the table first
    assert saved == [(rec, out)]


def test_main_audit_prints_on_rank_0_only(monkeypatch, capsys):
    rec = AuditRecord("t", ["x"], [np.zeros((4, 5), np.uint8)], [None], {1: "one"},
                      [ModelRecord("m", "exact", [_result([0])])])
    run = types.SimpleNamespace(ranks=distributed.Ranks(0, 3, 0), record=rec, chunks=5, skipped=2, computed=1)
    monkeypatch.setattr(cli, "_run_audit", lambda args: run if args.out == "the-out" else None)
    assert cli.main(["audit", "--model", "m", "--out", "the-out"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-4:] == ["5 chunks: 2 already committed, 1 computed by rank 0 of 3",
                          f"wrote {os.path.join('the-out', 'results.json')}",
                          f"wrote {os.path.join('the-out', 'sis.parquet')}",
                          f"wrote {os.path.join('the-out', 'report.html')}"]
    assert lines[0].startswith("model")
    run.ranks = distributed.Ranks(1, 3, 1)
    assert cli.main(["audit", "--model", "m", "--out", "the-out"]) == 0
    assert capsys.readouterr().out == ""


def test_main_report_reduce_and_pipeline(monkeypatch, capsys, tmp_path):
    import overinterp_fast.audit.pipeline as pipeline
    import overinterp_fast.audit.report as report
    import overinterp_fast.text.job as job

    calls = []
    monkeypatch.setattr(report, "rebuild_report", lambda folder, out, gallery: calls.append(
        ("report", folder, out, gallery)) or "page.html")
    assert cli.main(["report", "f"]) == 0 and calls[-1] == ("report", "f", None, 24)
    assert capsys.readouterr().out == "wrote page.html\n"
    assert cli.main(["report", "f", "--out", "p.html", "--gallery", "3"]) == 0
    assert calls[-1] == ("report", "f", "p.html", 3)
    capsys.readouterr()

    summary = {"sequences": 3, "seconds": 1.25, "mean_length": 10.0, "mean_reduced_length": 2.5, "median_length": 9,
               "median_reduced_length": 2, "share_more_confident": 0.5, "reductions": "r.parquet",
               "report": "r.html"}
    monkeypatch.setattr(job, "run_reduce", lambda model, text, out, **kw: calls.append(
        ("reduce", model, text, out, kw)) or summary)
    assert cli.main(["reduce", "--out", "o"]) == 0
    assert calls[-1] == ("reduce", "bundled", "bundled", "o", {"beam_size": 5, "importance": "leave_one_out",
                                                                 "limit": 200, "progress": None})
    assert capsys.readouterr().out.splitlines() == [
        "3 texts in 1.2 s: mean length 10.0 -> 2.5 tokens (median 9 -> 2); 50% of the reductions are more "
        "confident than the originals", "wrote r.parquet and r.html"]
    cli.main(["reduce", "--out", "o", "--text", "mine.csv", "--model", "m.pt", "--beam-size", "2", "--importance",
              "gradient", "--quiet"])
    assert calls[-1] == ("reduce", "m.pt", "mine.csv", "o", {"beam_size": 2, "importance": "gradient", "limit": None,
                                                              "progress": False})
    cli.main(["reduce", "--out", "o", "--limit", "7"])
    assert calls[-1][4]["limit"] == 7
    capsys.readouterr()

    result = {"rows": [{"trained_on": "a", "evaluated_on": "b", "accuracy": 0.5}], "pixels_kept": 4, "pixels": 64,
              "seconds": {"total": 2.25}}
    monkeypatch.setattr(pipeline, "digits_pipeline", lambda *a: calls.append(("pipeline", a)) or result)
    out = tmp_path / "p.json"
    assert cli.main(["digits-pipeline", "--fraction", "0.1", "--train", "20", "--test", "10", "--epochs", "3",
                     "--out", str(out)]) == 0
    assert calls[-1] == ("pipeline", (0.1, 20, 10, 3))
    printed = capsys.readouterr().out.splitlines()
    assert printed == pipeline.format_table(result).splitlines() + ["4 of 64 pixels kept; 2.2 s"]
    assert json.loads(out.read_text()) == result
    assert cli.main(["digits-pipeline"]) == 0 and calls[-1] == ("pipeline", (0.05, None, None, 15))
    assert cli.main(["digits-pipeline", "--fraction", "1"]) == 0 and calls[-1] == ("pipeline", (1.0, None, None, 15))


def test_main_bench_returns_the_scripts_exit_code(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_bench", lambda name, args: seen.append((name, args)) or 5)
    assert cli.main(["bench", "exact", "--", "--rounds", "2"]) == 5
    assert seen == [("exact", ["--rounds", "2"])]
