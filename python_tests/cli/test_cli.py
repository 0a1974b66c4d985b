"""The audit job and its command line: loading models and images, run_audit, transfer, ensembles, subcommands.

The command line's small pieces by hand: argument types, parser defaults, the noise units of --object-masks,
--device checks, the printed table and main's one-line errors. The tests above, cli/test_demo.py and
zoo/test_text.py run the commands whole.

The command line's commands checked piece by piece: ``_prepare`` on real model files and an image folder (every
check and default written out), and ``_run_sis``, ``_run_audit``, ``_sis_png`` and ``main`` with recorders in place
of the jobs they start (run_audit, run_stored_audit, run_demo, rebuild_report, run_reduce, digits_pipeline), so that
every option the user gives is seen arriving.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import json
import os
import warnings
import numpy as np
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.audit.persist import load_audit
from overinterp_fast.audit.store import TABLE_FILE
from overinterp_fast.methods import reference
from overinterp_fast.audit.config import AuditConfig, RunOptions
from overinterp_fast.audit.runner import run_audit, thresholds_for
from overinterp_fast.cli import main
from overinterp_fast.cli.loading import class_namer, load_images, load_model
from helpers import assert_sets_sufficient
import argparse
import sys
import types
from overinterp_fast import cli
from overinterp_fast.audit.records import AuditRecord, ModelRecord
from overinterp_fast.methods.results import SISResult
from overinterp_fast.audit import distributed, persist, stream
from overinterp_fast.audit import runner as audit_runner
from helpers import tiny_cnn  # noqa: F811

SIDE = 8




@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    from PIL import Image

    folder = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    (folder / "notes.txt").write_text("not an image")
    return folder


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    a, b = tiny_cnn(1), tiny_cnn(2)
    example = torch.zeros(2, 3, SIDE, SIDE)
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(a, (example,), dynamic_shapes=({0: batch},)), str(folder / "a.pt2"))
    of.export_onnx(b, str(folder / "b.onnx"), example)
    torch.save(a.state_dict(), str(folder / "state.pt"))
    torch.save(a, str(folder / "whole.pt"))
    return {"a": str(folder / "a.pt2"), "b": str(folder / "b.onnx"), "state": str(folder / "state.pt"),
            "whole": str(folder / "whole.pt"), "modules": (a, b)}


def test_thresholds_for_modes():
    f = torch.tensor([0.95, 0.5])
    assert thresholds_for(f, 0.9, "absolute") == [0.9, 0.9]
    assert thresholds_for(f, 0.9, "relative") == pytest.approx([0.855, 0.45])
    assert thresholds_for(f, 0.9, "auto") == pytest.approx([0.9, 0.45])
    with pytest.raises(ValueError, match="threshold mode"):
        thresholds_for(f, 0.9, "loose")
    with pytest.raises(ValueError, match="threshold"):
        thresholds_for(f, 1.5, "auto")


def test_load_images_folder_crop_normalize_and_labels(image_folder, tmp_path):
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"img0.png": 3, "img2": 1}))
    imgs = load_images(str(image_folder), SIDE, mean=[0.5, 0.4, 0.3], std=0.25, labels=str(labels))
    assert imgs.names == ["img0", "img1", "img2"] and imgs.labels == [3, None, 1]
    assert imgs.x.shape == (3, 3, SIDE, SIDE) and imgs.displays.shape == (3, SIDE, SIDE, 3)
    expect = (torch.from_numpy(imgs.displays[1]).permute(2, 0, 1).float() / 255 - torch.tensor([0.5, 0.4, 0.3]).view(3, 1, 1)) / 0.25
    torch.testing.assert_close(imgs.x[1], expect)
    grey = load_images(str(image_folder), SIDE, grey=True, limit=2)
    assert grey.x.shape == (2, 1, SIDE, SIDE) and grey.displays.shape == (2, SIDE, SIDE)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"img0": "cat"}))
    with pytest.raises(ValueError, match="class index"):
        load_images(str(image_folder), SIDE, labels=str(bad))
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_images(str(tmp_path / "missing"), SIDE)
    with pytest.raises(ValueError, match="no images"):
        load_images(str(tmp_path), SIDE)


def test_load_model_files(model_files):
    a, b = model_files["modules"]
    x = torch.randn(3, 3, SIDE, SIDE)
    exported = load_model(model_files["a"])
    torch.testing.assert_close(exported.model(x), a(x))
    whole = load_model(model_files["whole"])
    assert whole.name == "whole" and not whole.model.training
    torch.testing.assert_close(whole.model(x), a(x))
    onnx = load_model(model_files["b"])
    assert not onnx.differentiable and onnx.name == "b"
    torch.testing.assert_close(onnx.model(x), b(x), atol=1e-5, rtol=1e-4)
    with warnings.catch_warnings():  # TorchScript is deprecated, still supported
        warnings.simplefilter("ignore", FutureWarning)
        path = os.path.join(os.path.dirname(model_files["a"]), "script.pt")
        torch.jit.save(torch.jit.trace(a, x), path)
        scripted = load_model(path)
        torch.testing.assert_close(scripted.model(x), a(x))
    with pytest.raises(ValueError, match="state dict"):
        load_model(model_files["state"])
    with pytest.raises(FileNotFoundError, match="zoo name"):
        load_model("no/such/model.onnx")
    with pytest.raises(ValueError, match="unknown zoo model"):
        load_model("efficientnet-lite7")


def test_class_namer(tmp_path):
    assert class_namer(5)(3) == "3"
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    assert class_namer(2, str(names))(1) == "dog"
    with pytest.raises(ValueError, match="2 class names"):
        class_namer(5, str(names))


@pytest.mark.slow  # three audits of the photo folder (two models, an ensemble, transfer)
@pytest.mark.timeout(300)  # measured 120 s wall (20 s CPU) on 2 shared cores at a load average of about 11, 52 s at 5
def test_run_audit_ensemble_and_transfer(image_folder):
    a, b = tiny_cnn(1), tiny_cnn(2)
    imgs = load_images(str(image_folder), SIDE)
    rec = run_audit({"a": a, "b": b}, imgs.x, imgs.names, imgs.displays,
                    AuditConfig(method="exact", threshold=0.5, ensemble=True), RunOptions(show_progress=False))
    assert [m.name for m in rec.models] == ["a", "b", "ensemble (mean logits)"]
    # each model's results are the reference SIS with its own per-image thresholds ("auto": tau where
    # f(x) >= tau, else tau * f(x)); the ensemble is the mean of the logits, written out here
    def ens(x):
        return (a(x) + b(x)) / 2

    for m, model in zip(rec.models, (a, b, ens)):
        with torch.no_grad():
            f0 = torch.softmax(model(imgs.x), 1).max(1).values.tolist()
        taus = [0.5 if f >= 0.5 else 0.5 * f for f in f0]
        expect = reference.sis(model, imgs.x, taus)
        for got, want in zip(m.results, expect):
            assert got.threshold == pytest.approx(want.threshold, rel=1e-6) and got.target == want.target
            assert got.sis is not None and got.sis.tolist() == want.sis.tolist()
        assert assert_sets_sufficient(model, imgs.x, m.results, rel=1e-5) == 3
    t = rec.transfer
    assert t["rows"] == t["cols"] == ["a", "b", "ensemble (mean logits)"] and t["reference"] == "full-image predictions"
    # transfer[A][B]: B's agreement on A's 5% subsets (the last ceil(0.05 * 64) = 4 pixels of A's
    # backward-selection order), recomputed by hand
    models = (a, b, ens)
    with torch.no_grad():
        for i, ra in enumerate(rec.models):
            keep = torch.zeros(3, 1, SIDE, SIDE, dtype=torch.bool)
            for n, r in enumerate(ra.results):
                for pix in r.order[-4:].tolist():
                    keep[n, 0, pix // SIDE, pix % SIDE] = True
            subsets = torch.where(keep, imgs.x, torch.zeros(()))
            for j, mb in enumerate(models):
                agree = (mb(subsets).argmax(1) == mb(imgs.x).argmax(1)).double().mean().item()
                assert t["accuracy"][i][j] == pytest.approx(agree), (i, j)
    assert set(rec.class_names) == {r.target for m in rec.models for r in m.results}


def test_run_audit_refuses_exact_on_large_images():
    x = torch.zeros(1, 3, 80, 80)
    with pytest.raises(ValueError, match="gradient"):
        run_audit({"m": tiny_cnn(0)}, x, ["z"], [np.zeros((80, 80, 3), np.uint8)], AuditConfig(method="exact"))


@pytest.mark.slow  # audits through the command line with an ONNX and a TorchScript model, then the report
@pytest.mark.timeout(180)  # measured 55 s wall (8 s CPU) on 2 shared cores at a load average of about 11, 8 s at 5
def test_cli_audit_onnx_and_torchscript_then_report(image_folder, model_files, tmp_path, capsys):
    out = tmp_path / "audit"
    argv = ["audit", "--model", model_files["a"], "--model", model_files["b"], "--images", str(image_folder),
            "--size", str(SIDE), "--method", "exact", "--threshold", "0.5", "--ensemble", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "report.html" in printed and "img2" in printed
    rec = load_audit(str(out))
    assert [m.name for m in rec.models] == ["a", "b", "ensemble (mean logits)"]
    assert rec.transfer is not None and len(rec.transfer["accuracy"]) == 3
    html = (out / "report.html").read_text()
    assert "img0" in html and "data:image/png;base64," in html
    os.remove(out / "report.html")
    assert main(["report", str(out)]) == 0
    assert (out / "report.html").stat().st_size > 1000


def test_cli_auto_on_a_torchscript_model_runs_gradient_sis_quietly(image_folder, tmp_path, capsys, recwarn):
    """Above 32 x 32 pixels "auto" is gradient SIS; on a TorchScript file it runs (channels_last steps aside),
    without torch's TorchScript deprecation warning or a log line about incremental inference."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(tiny_cnn(1)), str(tmp_path / "tiny.ts"))
    out = tmp_path / "sis"
    assert main(["sis", "--model", str(tmp_path / "tiny.ts"), "--images", str(image_folder), "--size", "40",
                 "--quiet", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "WARNING" not in err and "deprecated" not in err, err
    assert not [w for w in recwarn if "torch.jit" in str(w.message)]
    rec = load_audit(str(out))
    assert rec.models[0].method == "gradient" and len(rec.models[0].results) == 3


def test_cli_sis_writes_results_and_figure(image_folder, model_files, tmp_path):
    out = tmp_path / "sis"
    assert main(["sis", "--model", model_files["b"], "--images", str(image_folder), "--size", str(SIDE),
                 "--method", "responsibility", "--quiet", "--out", str(out)]) == 0
    rec = load_audit(str(out))
    assert rec.models[0].method == "responsibility" and (out / "sis.png").stat().st_size > 1000
    assert all(r.sis is not None and r.queries > 0 for r in rec.models[0].results)
    # the refinement's record survives the store: boundary search and pruning counted, sets certified or not
    import pyarrow.parquet as pq
    rows = pq.read_table(out / TABLE_FILE).to_pylist()
    for r, row in zip(rec.models[0].results, rows):
        assert r.extraction_queries > 0 and r.refine_queries is not None and r.minimal in (True, False)
        assert r.size <= r.size_before_refine
        assert row["total_queries"] == r.queries + r.extraction_queries + r.refine_queries
        assert row["minimal"] is r.minimal and row["size_before_refine"] == r.size_before_refine
    # ReX criterion: the MPS alone restores the top-1 class of model b (the ONNX file's torch module)
    x = load_images(str(image_folder), SIDE).x
    assert assert_sets_sufficient(model_files["modules"][1], x, rec.models[0].results, criterion="top1",
                                  rel=1e-4) == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sis", "--model", "MODEL_B", "--method", "gradient"], "needs a torch model"),
        (["sis", "--model", "MODEL_A"], "give --size"),
        (["sis", "--model", "MODEL_A", "--size", "8", "--images", "/no/such/folder"], "not a folder"),
        (["report", "/no/such/folder"], "not an audit folder"),
        (["audit", "--model", "MODEL_A", "--model", "MODEL_A", "--size", "8"], "share a name"),
        (["sis", "--model", "MODEL_A", "--size", "8", "--grey"], "the model fails on the inputs, shape [3, 1, 8, 8]"),
        (["sis", "--model", "MODEL_A", "--size", "8", "--device", "gpu7"], "is not a device"),
    ],
)
def test_cli_errors_are_one_line(argv, message, model_files, image_folder, tmp_path, capsys):
    argv = [{"MODEL_A": model_files["a"], "MODEL_B": model_files["b"]}.get(a, a) for a in argv]
    if argv[0] != "report":
        argv += ["--out", str(tmp_path / "o")]
        if "--images" not in argv:
            argv += ["--images", str(image_folder)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


class LeftHalfModel(nn.Module):
    """Class 1 when the left half is bright (mean above 0.8): it looks only at the object (the left half)."""

    def forward(self, x):
        left = x[:, :, :, : x.shape[-1] // 2].mean((1, 2, 3)) - 0.8
        return torch.stack([-8 * left, 8 * left], 1)


def test_run_audit_object_masks_sensitivity_and_report(tmp_path):
    from overinterp_fast.audit import build_report, load_audit, save_audit

    torch.manual_seed(0)
    x = torch.rand(4, 3, SIDE, SIDE) * 0.2 + 0.4
    x[:, :, :, : SIDE // 2] += 0.5  # a bright object on the left: class 1
    objects = torch.zeros(4, SIDE, SIDE, dtype=torch.bool)
    objects[:, :, : SIDE // 2] = True
    displays = [(d.permute(1, 2, 0).clamp(0, 1) * 255).to(torch.uint8).numpy() for d in x]
    rec = run_audit({"left": LeftHalfModel().eval()}, x, list("abcd"), displays,
                    AuditConfig(method="exact", threshold=0.9, noise_sigma=1.0, value_range=(0.0, 1.0)),
                    RunOptions(show_progress=False), labels=[1, 1, 1, 1], object_masks=objects)
    (m,) = rec.models
    s = m.sensitivity
    # noise on the background changes nothing; on the (clipped) object it darkens it below 0.8
    assert s["a_bg"] == 1.0 and s["a_fg"] < 0.5 and s["rfs"] > 0.5 and s["reference"] == "labels"
    for r in m.results:  # the SIS lies inside the object
        assert r.sis is not None and bool(objects[0].flatten()[r.sis].all())
    save_audit(rec, str(tmp_path))
    back = load_audit(str(tmp_path))
    assert back.models[0].sensitivity == s and np.array_equal(back.object_masks[2], objects[2].numpy())
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "sis.parquet").to_pylist()
    assert [r["object_fraction"] for r in rows] == [1.0] * 4 and all(r["correct"] for r in rows)
    html = open(build_report(back, str(tmp_path / "r.html"))).read()
    assert 'id="object"' in html and "100.0%" in html  # every SIS pixel inside the object
    with pytest.raises(ValueError, match="object masks"):
        run_audit({"left": LeftHalfModel()}, x, list("abcd"), displays, object_masks=objects[:, :4])


def test_cli_audit_object_masks(image_folder, model_files, tmp_path):
    from PIL import Image

    masks = tmp_path / "masks"
    masks.mkdir()
    for i in range(3):
        m = np.zeros((12, 10), np.uint8)
        m[3:9, 2:8] = 255
        Image.fromarray(m).save(masks / f"img{i}.png")
    out = tmp_path / "audit"
    assert main(["audit", "--model", model_files["a"], "--images", str(image_folder), "--size", str(SIDE),
                 "--method", "exact", "--threshold", "0.5", "--object-masks", str(masks), "--quiet",
                 "--out", str(out)]) == 0
    rec = load_audit(str(out))
    assert rec.object_masks[0].shape == (SIDE, SIDE) and rec.object_masks[0].any() and not rec.object_masks[0].all()
    assert rec.models[0].sensitivity["sigma"] == pytest.approx(0.1)  # the default, in pixel units as given
    assert 'id="object"' in (out / "report.html").read_text()
    (masks / "img2.png").unlink()
    assert main(["audit", "--model", model_files["a"], "--images", str(image_folder), "--size", str(SIDE),
                 "--method", "exact", "--object-masks", str(masks), "--quiet", "--out", str(out)]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_cuda_without_gpu_is_one_line(capsys):
    assert main(["sis", "--model", "efficientnet-lite0", "--device", "cuda", "--out", "unused"]) == 2
    assert capsys.readouterr().err.strip() == "overinterp-fast: error: --device cuda: no CUDA GPU is available here"


# ----------------------------------------------------------------------------------------------------
# The command line's small pieces by hand: argument types, parser defaults, the noise units of --object-masks,
# ----------------------------------------------------------------------------------------------------


@pytest.mark.mutation
def test_argument_types():
    assert cli._unit_interval("0") == 0.0 and cli._unit_interval("1") == 1.0 and cli._unit_interval("0.25") == 0.25
    for bad, shown in (("1.5", "1.5"), ("-0.01", "-0.01")):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must lie in \[0, 1\], got {shown}$"):
            cli._unit_interval(bad)
    assert cli._positive("1") == 1 and cli._positive("12") == 12
    for bad in ("0", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be a positive integer, got {bad}$"):
            cli._positive(bad)
    assert cli._floats("0.5") == [0.5] and cli._floats("0.485,0.456,0.406") == [0.485, 0.456, 0.406]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected numbers separated by commas, got '0\.5;1'$"):
        cli._floats("0.5;1")


@pytest.mark.mutation
def test_parser_defaults():
    p = cli.build_parser()
    a = p.parse_args(["audit", "--model", "m.onnx", "--model", "n.onnx", "--out", "o"])
    assert a.model == ["m.onnx", "n.onnx"] and a.method == "auto" and a.threshold == 0.9
    assert a.threshold_mode == "auto" and a.fraction == 0.05 and a.chunk_size == 64 and a.noise_sigma == 0.1
    assert a.workers == 2 and a.gallery == 24 and a.device == "auto" and a.split == "test" and a.k == 100
    assert a.seed == 0 and a.resume is None and a.verbose == 0 and a.log_level is None
    assert a.images is None and a.batch_size is None and not a.restart and not a.ensemble and not a.quiet
    assert a.title == "Overinterpretation audit" and p.prog == "overinterp-fast"
    s = p.parse_args(["sis", "--model", "m.onnx", "--out", "o", "--mean", "0.1,0.2,0.3", "--limit", "5"])
    assert s.model == "m.onnx" and s.mean == [0.1, 0.2, 0.3] and s.limit == 5 and s.std is None
    d = p.parse_args(["demo"])
    assert (d.out, d.images, d.threshold, d.no_reference, d.no_imagenet, d.no_text, d.k, d.device) == \
        ("out/demo", 12, 0.9, False, False, False, None, "auto")
    r = p.parse_args(["reduce", "--out", "o"])
    assert (r.model, r.text, r.limit, r.beam_size, r.importance) == ("bundled", "bundled", None, 5, "leave_one_out")
    g = p.parse_args(["digits-pipeline"])
    assert (g.fraction, g.train, g.test, g.epochs, g.out) == (0.05, None, None, 15, None)
    rep = p.parse_args(["report", "folder"])
    assert rep.folder == "folder" and rep.out is None and rep.gallery == 24


@pytest.mark.mutation
def test_noise_units_follow_the_normalization():
    args = types.SimpleNamespace(object_masks=None, noise_sigma=0.1)
    assert cli._noise_units(args, 0.5, 0.5) == {}
    args = types.SimpleNamespace(object_masks="masks/", noise_sigma=0.1)
    out = cli._noise_units(args, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    assert out["noise_sigma"] == 0.1  # pixel units, as AuditConfig takes it
    low, high = out["value_range"]  # what the pixel values 0 and 1 are in the model's units
    torch.testing.assert_close(low, -mean / std)
    torch.testing.assert_close(high, (1 - mean) / std)
    one = cli._noise_units(args, 0.5, 0.25)
    assert one["noise_sigma"] == 0.1 and one["value_range"][0].shape == (1, 1, 1)
    assert float(one["value_range"][0]) == -2.0 and float(one["value_range"][1]) == 2.0
    for sigma in (0.0, -0.1):
        with pytest.raises(ValueError, match="^--noise-sigma must be above 0$"):
            cli._noise_units(types.SimpleNamespace(object_masks="m", noise_sigma=sigma), 0.5, 0.5)


@pytest.mark.mutation
def test_device_checks(monkeypatch):
    assert cli._check_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^--device: 'gpu0' is not a device \(auto, cpu, cuda, cuda:1, \.\.\.\)$"):
        cli._check_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for dev in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="^--device cuda: no CUDA GPU is available here$"):
            cli._check_device(dev)
    assert cli._check_device("auto") == torch.device("cpu")  # auto: the CPU without a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli._check_device("cuda:1") == torch.device("cuda:1")
    assert cli._check_device("auto") == torch.device("cuda")  # auto: the GPU when there is one


def _result(sis, target=1, score=0.987, threshold=0.9):
    mask = None
    if sis is not None:
        mask = torch.zeros(4, 5, dtype=torch.bool)
        mask.view(-1)[torch.tensor(sis, dtype=torch.long)] = True
    return SISResult(order=torch.arange(20), values=torch.zeros(20), target=target, score=score, threshold=threshold,
                     sis=None if sis is None else torch.tensor(sis), mask=mask)


def _record(models: dict[str, list]) -> AuditRecord:
    n = len(next(iter(models.values())))
    return AuditRecord("t", [f"image-with-a-long-name-{i}" for i in range(n)], [np.zeros((4, 5), np.uint8)] * n,
                       [None] * n, {1: "a class name longer than twenty-two", 2: "two"},
                       [ModelRecord(name, "exact", res) for name, res in models.items()])


@pytest.mark.mutation
def test_print_table_rows_and_summary(capsys):
    rec = _record({"a model name longer than twenty": [_result([0, 1, 2]), _result(None, target=2, score=0.5)]})
    cli._print_table(rec)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{'model':<20} {'image':<14} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS':>7} "
                        f"{'of image':>9}")
    # columns of 20, 14, 22, 6, 6, 7 and 9 characters, one space apart; long names cut
    assert lines[1] == " ".join(["a model name longer ", "image-with-a-l", "a class name longer th", " 0.987", " 0.900",
                                 "      3", "    15.0%"])
    assert lines[2] == " ".join(["a model name longer ", "image-with-a-l", "two" + " " * 19, " 0.500", " 0.900",
                                 "      -", "        -"])
    assert len(lines) == 3
    # more rows than ``most``: one summary line per model (the median of the sizes with a SIS)
    rec = _record({"m": [_result([0]), _result([0, 1, 2, 3]), _result([0, 1]), _result(None), _result([0, 1, 2])],
                   "none": [_result(None)] * 5})
    cli._print_table(rec, most=9)  # 10 rows; sizes 5%, 10%, 15%, 20%: the upper median
    assert capsys.readouterr().out.splitlines() == ["m: 4 of 5 images have a SIS; median size 15.0%",
                                                    "none: 0 of 5 images have a SIS; median size -"]
    cli._print_table(rec, most=10)
    assert len(capsys.readouterr().out.splitlines()) == 11  # the header and 10 rows
    # the default: a table up to 60 rows
    rec = _record({"m": [_result([0])] * 30, "n": [_result([0])] * 30})
    cli._print_table(rec)
    assert len(capsys.readouterr().out.splitlines()) == 61
    rec = _record({"m": [_result([0])] * 61})
    cli._print_table(rec)
    assert capsys.readouterr().out.splitlines() == ["m: 61 of 61 images have a SIS; median size 5.0%"]


@pytest.mark.mutation
def test_main_errors_are_one_line_with_exit_code_2(monkeypatch, capsys):
    for exc in (ValueError("bad value"), TypeError("bad type"), FileNotFoundError("no file"),
                FloatingPointError("nan")):
        def boom(args, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "_run_sis", boom)
        assert cli.main(["sis", "--model", "m", "--out", "o"]) == 2
        assert capsys.readouterr().err == f"overinterp-fast: error: {exc}\n"
    monkeypatch.setattr(cli, "_run_sis", lambda args: (_ for _ in ()).throw(KeyError("k")))
    with pytest.raises(KeyError):  # a bug is not dressed up as a user error
        cli.main(["sis", "--model", "m", "--out", "o"])
    assert cli.main(["digits-pipeline", "--fraction", "0"]) == 2
    assert capsys.readouterr().err == "overinterp-fast: error: --fraction must be above 0\n"


def _rejects(argv) -> bool:
    try:
        cli.parse_args(argv)
    except SystemExit as exc:
        return exc.code == 2
    return False


@pytest.mark.mutation
def test_parser_choices_types_and_required_options(capsys):
    """Every choice the README names is accepted and spelt exactly; numbers come back as numbers; --model and
    --out are required where the README says so."""
    base = {"sis": ["sis", "--model", "m", "--out", "o"], "audit": ["audit", "--model", "m", "--out", "o"]}
    choices = {"--method": ("auto", "exact", "gradient", "responsibility"),
               "--threshold-mode": ("auto", "absolute", "relative"),
               "--dataset": ("cifar10", "cifar100"), "--split": ("test", "train")}
    for cmd, argv in base.items():
        p = cli.build_parser()
        for opt, values in choices.items():
            dest = opt[2:].replace("-", "_")
            for v in values:
                assert getattr(p.parse_args(argv + [opt, v]), dest) == v, (cmd, opt, v)
            assert _rejects(argv + [opt, values[0].upper()]) and _rejects(argv + [opt, "other"]), (cmd, opt)
        a = p.parse_args(argv + ["--size", "32", "--k", "64", "--threshold", "0.5", "--select", "0:10",
                                 "--labels", "l.json", "--class-names", "c.txt", "--data-dir", "d", "--grey",
                                 "--collection", "--quiet", "--device", "cuda:1", "--std", "0.25"])
        assert (a.size, a.k, a.threshold, a.select, a.labels, a.class_names, a.data_dir) == \
            (32, 64, 0.5, "0:10", "l.json", "c.txt", "d")
        assert a.grey and a.collection and a.quiet and a.device == "cuda:1" and a.std == [0.25]
        assert _rejects([cmd, "--out", "o"]) and _rejects([cmd, "--model", "m"])  # both required
        assert _rejects(argv + ["--size", "0"]) and _rejects(argv + ["--limit", "x"])
    assert not hasattr(cli.build_parser().parse_args(base["sis"]), "ensemble")  # audit's options only
    a = cli.build_parser().parse_args(base["audit"] + ["--ensemble", "--restart", "--fraction", "0.1", "--title", "T",
                                                       "--object-masks", "om", "--noise-sigma", "0.2",
                                                       "--chunk-size", "8", "--batch-size", "3", "--workers", "0",
                                                       "--gallery", "5"])
    assert a.ensemble and a.restart and (a.fraction, a.title, a.object_masks, a.noise_sigma) == (0.1, "T", "om", 0.2)
    assert (a.chunk_size, a.batch_size, a.workers, a.gallery) == (8, 3, 0, 5)
    r = cli.build_parser().parse_args(["reduce", "--out", "o", "--model", "m.pt", "--text", "t.txt", "--limit", "3",
                                       "--beam-size", "1", "--importance", "gradient", "--quiet"])
    assert (r.model, r.text, r.limit, r.beam_size, r.importance, r.quiet) == ("m.pt", "t.txt", 3, 1, "gradient", True)
    assert _rejects(["reduce", "--out", "o", "--importance", "attention"]) and _rejects(["reduce"])
    assert cli.build_parser().parse_args(["reduce", "--out", "o", "--importance", "leave_one_out"]).importance == \
        "leave_one_out"
    assert _rejects(["bench", "exact"]) and _rejects([])
    d = cli.build_parser().parse_args(["demo", "--out", "x", "--images", "3", "--threshold", "0.5", "--no-reference",
                                       "--no-imagenet", "--no-text", "--k", "9", "--device", "cuda"])
    assert (d.out, d.images, d.threshold, d.no_reference, d.no_imagenet, d.no_text, d.k, d.device) == \
        ("x", 3, 0.5, True, True, True, 9, "cuda")
    g = cli.build_parser().parse_args(["digits-pipeline", "--fraction", "0.1", "--train", "60", "--test", "30",
                                       "--epochs", "2", "--out", "r.json"])
    assert (g.fraction, g.train, g.test, g.epochs, g.out) == (0.1, 60, 30, 2, "r.json")
    rep = cli.build_parser().parse_args(["report", "f", "--out", "r.html", "--gallery", "3"])
    assert (rep.folder, rep.out, rep.gallery) == ("f", "r.html", 3)
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------------
# The command line's commands checked piece by piece: ``_prepare`` on real model files and an image folder (every
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory, model_files, image_folder):
    """The two model files of ``model_files`` (torch.export and ONNX, 5 classes), the folder of 3 photos (12 x 10)
    of ``image_folder``, and two class-names files."""
    root = tmp_path_factory.mktemp("cli")
    (root / "names.txt").write_text("zero\none\ntwo\nthree\nfour\n")
    (root / "three.txt").write_text("zero\none\ntwo\n")
    return {"a": model_files["a"], "b": model_files["b"], "images": str(image_folder),
            "names": str(root / "names.txt"), "three": str(root / "three.txt"), "root": root}


# the plain transform at --size 8: shorter side to 8 (bicubic), centre crop, (x / 255 - 0.5) / 0.5
PLAIN_8 = {"size": 8, "library": "overinterp_fast", "resize": 8, "crop_pct": 1.0, "interpolation": "bicubic",
           "crop_mode": "center", "mean": 0.5, "std": 0.5}


def _args(*argv):
    return cli.build_parser().parse_args(list(argv))


def _audit_args(files, *more):
    return _args("audit", "--model", files["a"], "--model", files["b"], "--images", files["images"], "--size", "8",
                 "--out", str(files["root"] / "out"), "--method", "exact", *more)


# ---------------------------------------------------------------------------------------------- _prepare


@pytest.mark.mutation
def test_prepare_models_source_namer_k_and_normalization(files):
    loaded, source, namer, k, (mean, std) = cli._prepare(_audit_args(files), True, torch.device("cpu"))
    assert [m.name for m in loaded] == ["a", "b"] and len(source) == 3 and source.size == 8
    assert source.image_names == ["img0", "img1", "img2"]
    assert k == 100  # AuditConfig's, on every device
    assert (mean, std) == (0.5, 0.5)  # nothing known from the models: mid-grey
    assert namer(3) == "3"  # 5 classes, no names: the index
    x = source[0]["x"]
    assert x.shape == (3, 8, 8) and float(x.min()) >= -1.0 and float(x.max()) <= 1.0  # (pixel - 0.5) / 0.5
    loaded, source, namer, k, (mean, std) = cli._prepare(
        _audit_args(files, "--k", "7", "--mean", "0.25", "--std", "0.125", "--class-names", files["names"],
                    "--limit", "2"), True, torch.device("cpu"))
    assert k == 7 and (mean, std) == (0.25, 0.125) and namer(3) == "three" and len(source) == 2
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


@pytest.mark.mutation
def test_prepare_names_classes_after_the_folders(files, tmp_path):
    from PIL import Image

    for i, cls in enumerate(["ant", "bee", "cat", "dog", "eel"]):  # 5 folders for the 5-class models
        (tmp_path / cls).mkdir()
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(tmp_path / cls / "x.png")
    _, source, namer, _, _ = cli._prepare(_args("audit", "--model", files["a"], "--images", str(tmp_path), "--size",
                                                "8", "--out", "o", "--method", "exact"), True, "cpu")
    assert source.image_labels == [0, 1, 2, 3, 4] and namer(2) == "cat"


@pytest.mark.mutation
def test_prepare_reads_cifar_batches(files, tmp_path):
    from helpers import write_cifar

    data = write_cifar(tmp_path, 4)
    args = _args("audit", "--model", files["a"], "--dataset", "cifar10", "--data-dir", str(tmp_path), "--split",
                 "test", "--size", "8", "--out", "o", "--method", "exact")
    with pytest.raises(ValueError, match=r"^model 'a' has 5 outputs, and the image source \(cifar10\) has 10 "
                                         r"classes"):  # a CIFAR-10 model is needed
        cli._prepare(args, True, "cpu")
    torch.manual_seed(0)
    ten = torch.nn.Sequential(torch.nn.Conv2d(3, 2, 3), torch.nn.Flatten(), torch.nn.Linear(72, 10))
    torch.save(ten.eval(), tmp_path / "ten.pt")
    args.model = [str(tmp_path / "ten.pt")]
    _, source, namer, _, _ = cli._prepare(args, True, "cpu")
    assert len(source) == 4 and source.image_labels == [0, 1, 2, 3] and source.classes[:2] == ["class0", "class1"]
    assert namer(9) == "class9"  # the dataset's names, as many as the model's classes
    assert source[0]["display"].shape == (8, 8, 3) and data.shape == (4, 3072)
    with pytest.raises((ValueError, FileNotFoundError)):  # there is no training batch in this folder
        cli._prepare(_args("audit", "--model", files["a"], "--dataset", "cifar10", "--data-dir", str(tmp_path),
                           "--split", "train", "--size", "8", "--out", "o", "--method", "exact"), True, "cpu")


@pytest.mark.mutation
def test_prepare_reports_the_models_first_error_line(files, monkeypatch):
    import overinterp_fast.cli.loading as loading

    def failing(message, kind=RuntimeError):
        def model(x):
            raise kind(message)
        return loading.LoadedModel(model, "m")

    for model, shown in ((failing("bad channels\nsecond line\n"), "RuntimeError: bad channels"),
                         (failing("   "), "RuntimeError"), (failing("", AssertionError), "AssertionError")):
        monkeypatch.setattr(loading, "load_model", lambda spec, device, model=model: model)
        with pytest.raises(ValueError) as err:
            cli._prepare(_args("sis", "--model", "x", "--images", files["images"], "--size", "8", "--out", "o",
                               "--method", "exact"), False, "cpu")
        assert str(err.value) == (f"model 'm': the model fails on the inputs, shape [3, 3, 8, 8]: {shown} (check "
                                  f"--size, --grey)")


@pytest.mark.mutation
def test_prepare_errors_are_whole_sentences(files):
    with pytest.raises(ValueError, match="^two models share a name: \\['a', 'a'\\]$"):
        cli._prepare(_args("audit", "--model", files["a"], "--model", files["a"], "--images", files["images"],
                           "--size", "8", "--out", "o", "--method", "exact"), True, "cpu")
    with pytest.raises(ValueError) as err:
        cli._prepare(_args("audit", "--model", files["a"], "--model", files["b"], "--images", files["images"],
                           "--size", "8", "--out", "o", "--method", "gradient"), True, "cpu")
    assert str(err.value) == ("b: method 'gradient' needs a torch model (ONNX Runtime has no gradients); use "
                              "--method responsibility or exact")
    cli._prepare(_args("audit", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o",
                       "--method", "gradient"), True, "cpu")  # gradient on a torch model: fine
    cli._prepare(_args("audit", "--model", files["a"], "--model", files["b"], "--images", files["images"],
                       "--size", "8", "--out", "o"), True, "cpu")  # the default, auto, picks a method that fits
    with pytest.raises(ValueError, match="^give --images or --dataset, not both$"):
        cli._prepare(_audit_args(files, "--dataset", "cifar10"), True, "cpu")
    with pytest.raises(ValueError, match="^the input size is not known from the model: give --size$"):
        cli._prepare(_args("audit", "--model", files["a"], "--images", files["images"], "--out", "o",
                           "--method", "exact"), True, "cpu")
    with pytest.raises(ValueError) as err:
        cli._prepare(_audit_args(files, "--grey"), True, "cpu")
    assert str(err.value).startswith("model 'a': the model fails on the inputs, shape [3, 1, 8, 8]: ")
    assert str(err.value).endswith(" (check --size, --grey)")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="has 3 class names; the model has 5 classes"):
        cli._prepare(_audit_args(files, "--class-names", files["three"]), True, "cpu")


# ---------------------------------------------------------------------------------------------- _run_sis


@pytest.mark.mutation
def test_run_sis_passes_every_option_to_run_audit(files, monkeypatch):
    seen = {}
    monkeypatch.setattr(audit_runner, "run_audit", lambda models, x, names, displays, config, run, **kw: seen.update(
        models=models, x=x, names=names, displays=displays, **vars(config), **vars(run), **kw) or "the record")
    args = _args("sis", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o",
                 "--method", "exact", "--threshold", "0.7", "--threshold-mode", "relative", "--k", "9",
                 "--collection", "--quiet", "--limit", "2")
    assert cli._run_sis(args) == "the record"
    assert list(seen["models"]) == ["a"] and seen["x"].shape == (2, 3, 8, 8) and seen["x"].dtype == torch.float32
    assert seen["names"] == ["img0", "img1"] and seen["displays"].shape == (2, 8, 8, 3)
    assert seen["displays"].dtype == np.uint8 and seen["labels"] == [None, None]
    assert (seen["threshold"], seen["threshold_mode"], seen["method"], seen["k"]) == (0.7, "relative", "exact", 9)
    assert seen["collection"] is True and seen["show_progress"] is False and seen["title"] == "SIS"
    assert seen["class_name"](2) == "2" and seen["seed"] == 0
    src = of.audit.sources.open_images(files["images"], 8, 0.5, 0.5)
    assert seen["meta"] == {"models": [files["a"]], "image source": src.description, "preprocessing": PLAIN_8,
                            "seed": 0}
    torch.testing.assert_close(seen["x"][1], src[1]["x"], rtol=0, atol=0)
    cli._run_sis(_args("sis", "--model", files["a"], "--images", files["images"], "--size", "8", "--out", "o",
                       "--seed", "5"))
    assert seen["show_progress"] is None and seen["collection"] is False and seen["method"] == "auto"
    assert seen["threshold"] == 0.9 and seen["threshold_mode"] == "auto" and seen["k"] == 100
    assert seen["seed"] == 5 and seen["meta"]["seed"] == 5


# ---------------------------------------------------------------------------------------------- _run_audit


@pytest.mark.mutation
def test_run_audit_passes_every_option_and_tears_down(files, monkeypatch):
    seen, events = {}, []
    ranks = distributed.Ranks()
    monkeypatch.setattr(distributed, "setup", lambda device: events.append(("setup", device)) or ranks)
    monkeypatch.setattr(distributed, "teardown", lambda r: events.append(("teardown", r)))
    monkeypatch.setattr(stream, "run_stored_audit", lambda models, source, out, config, storage, run, **kw: seen.update(
        models=models, source=source, out=out, **vars(config), **vars(storage), **vars(run), **kw) or "the run")
    out = str(files["root"] / "audit-out")
    args = _audit_args(files, "--out", out, "--chunk-size", "5", "--restart", "--workers", "0", "--batch-size", "11",
                       "--threshold", "0.6", "--threshold-mode", "absolute", "--k", "3", "--collection", "--ensemble",
                       "--fraction", "0.1", "--quiet", "--title", "T", "--gallery", "4", "--class-names",
                       files["names"])
    assert cli._run_audit(args) == "the run"
    assert events == [("setup", "auto"), ("teardown", ranks)]
    assert list(seen["models"]) == ["a", "b"] and len(seen["source"]) == 3 and seen["out"] == out
    assert seen["ranks"] is ranks
    assert seen["identity"] == {"model_files": [files["a"], files["b"]], "class_names": files["names"]}
    # the command line, for --resume: every option that fixes results, paths absolute
    command = seen["command"]
    assert command["model"] == [os.path.abspath(files["a"]), os.path.abspath(files["b"])]
    assert command["images"] == os.path.abspath(files["images"]) and command["class_names"] == files["names"]
    assert (command["chunk_size"], command["batch_size"], command["k"], command["method"]) == (5, 11, 3, "exact")
    assert (command["title"], command["workers"], command["gallery"]) == ("T", 0, 4)
    assert not {"out", "restart", "quiet", "resume", "verbose", "log_level", "command"} & set(command)
    assert (seen["chunk_size"], seen["restart"], seen["workers"], seen["batch_size"]) == (5, True, 0, 11)
    assert (seen["threshold"], seen["threshold_mode"], seen["method"], seen["k"]) == (0.6, "absolute", "exact", 3)
    assert seen["collection"] is True and seen["ensemble"] is True and seen["fraction"] == 0.1
    assert seen["show_progress"] is False and seen["title"] == "T" and seen["gallery"] == 4
    assert seen["class_name"](1) == "one"
    assert seen["meta"] == {"models": [files["a"], files["b"]], "image source": seen["source"].description,
                            "preprocessing": PLAIN_8, "seed": 0}
    assert seen["noise_sigma"] == 0.1 and seen["value_range"] is None  # no object masks: the defaults, unused
    # the defaults; and the group is left even when the job fails
    monkeypatch.setattr(stream, "run_stored_audit", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli._run_audit(_audit_args(files))
    assert events[-1] == ("teardown", ranks)
    with pytest.raises(ValueError, match="^give --images or --dataset, not both$"):
        cli._run_audit(_audit_args(files, "--dataset", "cifar10"))
    assert events[-1] == ("teardown", ranks) and len(events) == 6


@pytest.mark.mutation
def test_run_audit_defaults_and_noise_units(files, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(stream, "run_stored_audit", lambda models, source, out, config, storage, run, **kw: seen.update(
        **vars(config), **vars(storage), **vars(run), **kw) or "run")
    masks = tmp_path / "masks"
    masks.mkdir()
    from PIL import Image

    for i in range(3):
        Image.fromarray(np.full((12, 10), 255, np.uint8)).save(masks / f"img{i}.png")
    cli._run_audit(_audit_args(files, "--object-masks", str(masks), "--noise-sigma", "0.2"))
    assert (seen["chunk_size"], seen["restart"], seen["workers"], seen["batch_size"]) == (64, False, 2, None)
    assert seen["ensemble"] is False and seen["fraction"] == 0.05 and seen["show_progress"] is None
    assert seen["title"] == "Overinterpretation audit" and seen["gallery"] == 24 and seen["k"] == 100
    assert seen["identity"]["class_names"] is None and seen["seed"] == 0
    # sigma in pixel units, as given; the pixel values 0 and 1 are -1 and 1 in inputs normalized by (x - 0.5) / 0.5
    assert seen["noise_sigma"] == 0.2
    lo, hi = seen["value_range"]
    torch.testing.assert_close(lo.flatten(), torch.tensor([-1.0]))
    torch.testing.assert_close(hi.flatten(), torch.tensor([1.0]))


# ---------------------------------------------------------------------------------------------- _sis_png


def _command_result(sis, grid=(4, 5), score=0.25, threshold=0.125, target=1):
    mask = torch.zeros(grid, dtype=torch.bool)
    if sis is not None:
        mask.view(-1)[torch.tensor(sis)] = True
    return SISResult(order=torch.arange(20), values=torch.zeros(20), target=target, score=score,
                     threshold=threshold, sis=None if sis is None else torch.tensor(sis),
                     mask=None if sis is None else mask)


@pytest.mark.mutation
def test_sis_png_rows(monkeypatch, tmp_path):
    drawn = {}
    import overinterp_fast.audit.plotting as plotting

    monkeypatch.setattr(plotting, "sis_figure", lambda images, masks, titles, path: drawn.update(
        images=images, masks=masks, titles=titles, path=path))
    displays = [np.zeros((4, 5), np.uint8), np.ones((4, 5, 3), np.uint8), np.zeros((2, 2), np.uint8)]
    results = [_command_result([0, 1]), _command_result(None, target=2), _command_result([3])]  # the third mask is not on its grid
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


@pytest.mark.mutation
def test_main_demo_passes_its_options(monkeypatch):
    import overinterp_fast.cli.demo as demo

    seen = []
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: seen.append({"out": out, **kw}))
    assert cli.main(["demo"]) == 0
    assert seen[-1] == {"out": "out/demo", "n_images": 12, "threshold": 0.9, "compare_reference": True,
                        "imagenet": True, "k": None, "text": True, "device": "auto"}
    assert cli.main(["demo", "--out", "d", "--images", "3", "--threshold", "0.5", "--no-reference", "--no-imagenet",
                     "--no-text", "--k", "40"]) == 0
    assert seen[-1] == {"out": "d", "n_images": 3, "threshold": 0.5, "compare_reference": False,
                        "imagenet": False, "k": 40, "text": False, "device": "auto"}


@pytest.mark.mutation
def test_main_sis_prints_and_writes(monkeypatch, capsys, tmp_path):
    rec = AuditRecord("t", ["x"], [np.zeros((4, 5), np.uint8)], [None], {1: "one"},
                      [ModelRecord("m", "exact", [_command_result([0])])])
    monkeypatch.setattr(cli, "_run_sis", lambda args: rec)
    saved = []
    monkeypatch.setattr(persist, "save_audit", lambda record, out: saved.append((record, out)) or f"{out}/r.json")
    monkeypatch.setattr(cli, "_sis_png", lambda record, path: f"png at {path}" if record is rec else "another")
    out = str(tmp_path / "o")
    assert cli.main(["sis", "--model", "m", "--out", out]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"wrote {out}/r.json", f"wrote png at {os.path.join(out, 'sis.png')}"]
    assert lines[0].startswith("model") and lines[1].startswith("m ")  # the table first
    assert saved == [(rec, out)]


@pytest.mark.mutation
def test_main_audit_prints_on_rank_0_only(monkeypatch, capsys):
    rec = AuditRecord("t", ["x"], [np.zeros((4, 5), np.uint8)], [None], {1: "one"},
                      [ModelRecord("m", "exact", [_command_result([0])])])
    run = types.SimpleNamespace(ranks=distributed.Ranks(0, 3, 0), record=rec, chunks=5, skipped=2, computed=1,
                                subsets=[])
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


@pytest.mark.mutation
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
                                                                 "limit": 200, "show_progress": None})
    assert capsys.readouterr().out.splitlines() == [
        "3 texts in 1.2 s: mean length 10.0 -> 2.5 tokens (median 9 -> 2); 50% of the reductions are more "
        "confident than the originals", "wrote r.parquet and r.html"]
    cli.main(["reduce", "--out", "o", "--text", "mine.csv", "--model", "m.pt", "--beam-size", "2", "--importance",
              "gradient", "--quiet"])
    assert calls[-1] == ("reduce", "m.pt", "mine.csv", "o", {"beam_size": 2, "importance": "gradient", "limit": None,
                                                              "show_progress": False})
    cli.main(["reduce", "--out", "o", "--limit", "7"])
    assert calls[-1][4]["limit"] == 7
    capsys.readouterr()

    result = {"rows": [{"trained_on": "a", "evaluated_on": "b", "accuracy": 0.5}], "pixels_kept": 4, "pixels": 64,
              "seconds": {"total": 2.25}}
    monkeypatch.setattr(pipeline, "digits_pipeline", lambda *a, **k: calls.append(("pipeline", a, k)) or result)
    out = tmp_path / "p.json"
    assert cli.main(["digits-pipeline", "--fraction", "0.1", "--train", "20", "--test", "10", "--epochs", "3",
                     "--out", str(out)]) == 0
    assert calls[-1] == ("pipeline", (0.1, 20, 10, 3), {"seeds": None})
    printed = capsys.readouterr().out.splitlines()
    assert printed == pipeline.format_table(result).splitlines() + ["4 of 64 pixels kept; 2.2 s"]
    assert json.loads(out.read_text()) == result
    assert cli.main(["digits-pipeline"]) == 0 and calls[-1] == ("pipeline", (0.05, None, None, 15), {"seeds": None})
    assert cli.main(["digits-pipeline", "--fraction", "1"]) == 0
    assert calls[-1] == ("pipeline", (1.0, None, None, 15), {"seeds": None})
    assert cli.main(["digits-pipeline", "--seeds", "3,1"]) == 0
    assert calls[-1] == ("pipeline", (0.05, None, None, 15), {"seeds": (3, 1)})





# ---------------------------------------------------------------------------------------------- files that are not models


@pytest.mark.parametrize("command, suffix, expected", [
    ("reduce", ".txt", "{path} is not a text model written by save_text_model"),
    ("reduce", ".pt", "{path} is not a text model written by save_text_model"),
    ("sis", ".pt", "model file '{path}' cannot be read as a TorchScript archive or a pickled torch model: "),
    ("sis", ".pt2", "model file '{path}' cannot be read as a torch.export program (torch.export.save): "),
    ("sis", ".onnx", "model file '{path}' cannot be read as an ONNX model: "),
])
def test_a_file_that_is_not_a_model_is_one_line(command, suffix, expected, image_folder, tmp_path, capsys):
    """A text file given as --model: one line naming the file and what it should hold, no traceback."""
    path = tmp_path / f"notes{suffix}"
    path.write_text("these are my notes, not a model\nsecond line\n")
    argv = [command, "--model", str(path), "--out", str(tmp_path / "o")]
    argv += ["--text", str(path)] if command == "reduce" else ["--images", str(image_folder), "--size", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("overinterp-fast: error: " + expected.format(path=path))
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_torch_file_named_onnx_is_named_in_one_line(image_folder, tmp_path, capsys):
    """A TorchScript archive under an .onnx name: one line that says what it is and how to load it."""
    path = tmp_path / "cnn.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's deprecation of TorchScript
        torch.jit.save(torch.jit.script(tiny_cnn(1)), str(path))
    argv = ["sis", "--model", str(path), "--out", str(tmp_path / "o"), "--images", str(image_folder), "--size", "8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"overinterp-fast: error: model file '{path}' cannot be read as an ONNX model: ValueError: "
                   f"'{path}' is a TorchScript archive (torch.jit.save), and a model given by its path must be an "
                   f"ONNX file: give this one a .ts, .pt, .pth name, then load it with "
                   f"overinterp_fast.zoo.models.load_model(path).model (the suffix chooses the reader, as for the "
                   f"command line's --model)\n")


def test_a_pickle_that_is_not_a_model_is_named(tmp_path):
    path = tmp_path / "numbers.pt"
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match=f"^'{path}' holds a list, not a torch model$"):
        load_model(str(path))
