"""The audit job and its command line: loading models and images, run_audit, transfer, ensembles, subcommands."""
import json
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.audit.records import load_audit
from overinterp_fast.audit.store import TABLE_FILE
from overinterp_fast import reference
from overinterp_fast.audit.runner import run_audit, thresholds_for
from overinterp_fast.cli import main
from overinterp_fast.loading import class_namer, load_images, load_model

from conftest import assert_sets_sufficient

SIDE = 8


def tiny_cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(24, 5)
    ).eval()


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


def test_run_audit_ensemble_and_transfer(image_folder):
    a, b = tiny_cnn(1), tiny_cnn(2)
    imgs = load_images(str(image_folder), SIDE)
    rec = run_audit({"a": a, "b": b}, imgs.x, imgs.names, imgs.displays, method="exact", threshold=0.5,
                    ensemble=True, progress=False)
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
        run_audit({"m": tiny_cnn(0)}, x, ["z"], [np.zeros((80, 80, 3), np.uint8)], method="exact")


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
        (["sis", "--model", "MODEL_A", "--size", "8", "--grey"], "fails on an input of shape [1, 1, 8, 8]"),
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


def test_cli_bench_runs_the_script(capsys):
    assert main(["bench", "exact", "--", "--help"]) == 0


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
    rec = run_audit({"left": LeftHalfModel().eval()}, x, list("abcd"), displays, labels=[1, 1, 1, 1],
                    method="exact", threshold=0.9, object_masks=objects, noise_sigma=1.0, value_range=(0.0, 1.0), progress=False)
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
    assert rec.models[0].sensitivity["sigma"] == pytest.approx(0.2)  # 0.1 pixel units / std 0.5
    assert 'id="object"' in (out / "report.html").read_text()
    (masks / "img2.png").unlink()
    assert main(["audit", "--model", model_files["a"], "--images", str(image_folder), "--size", str(SIDE),
                 "--method", "exact", "--object-masks", str(masks), "--quiet", "--out", str(out)]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_cuda_without_gpu_is_one_line(capsys):
    assert main(["sis", "--model", "efficientnet-lite0", "--device", "cuda", "--out", "unused"]) == 2
    assert capsys.readouterr().err.strip() == "overinterp-fast: error: --device cuda: no CUDA GPU is available here"
