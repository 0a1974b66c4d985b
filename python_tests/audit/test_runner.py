"""The audit job's pieces (audit/runner.py) checked by hand: per-image thresholds, predictions in batches, the
ensemble, the exact-SIS size guard, the options and engines recorded, transfer counts against labels, the
sensitivity summary and run_audit's argument checks. cli/test_cli.py runs whole audits.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import math
import os
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.attr.options import GradientOptions
from overinterp_fast.audit import runner
from overinterp_fast.audit.config import AuditConfig, RunOptions
from overinterp_fast.audit.records import ModelRecord
from overinterp_fast.runtime.model import Ensemble
from overinterp_fast.methods.results import SISResult
from helpers import whole_message


class Fixed(nn.Module):
    """Logits that are the image's first pixel of each channel, scaled: a model whose answer is known."""

    def forward(self, x):
        return 5 * x[:, :, 0, 0]


class ByMean(nn.Module):
    """Class 1 when the mean of the image is positive, else class 0 (logits +-4)."""

    def forward(self, x):
        m = x.flatten(1).mean(1, keepdim=True)
        s = torch.where(m > 0, torch.ones_like(m), -torch.ones_like(m))
        return torch.cat([-4 * s, 4 * s], 1)


@pytest.mark.mutation
def test_thresholds_for_every_mode_by_hand():
    f = torch.tensor([0.95, 0.9, 0.5, 0.2], dtype=torch.float64)
    assert runner.thresholds_for(f, 0.9, "absolute") == [0.9] * 4
    assert runner.thresholds_for(f, 0.9, "relative") == pytest.approx([0.855, 0.81, 0.45, 0.18])
    # auto: tau where f >= tau (0.9 itself included), else tau * f
    assert runner.thresholds_for(f, 0.9, "auto") == pytest.approx([0.9, 0.9, 0.45, 0.18])
    assert runner.thresholds_for(torch.zeros(0), 0.5, "auto") == []
    with pytest.raises(ValueError, match=whole_message(
            "threshold mode must be one of ('absolute', 'relative', 'auto'), got 'fixed'")):
        runner.thresholds_for(f, 0.9, "fixed")
    with pytest.raises(ValueError, match="threshold"):
        runner.thresholds_for(f, 1.5, "absolute")


@pytest.mark.mutation
def test_predict_in_batches_returns_top1_and_its_probability_on_the_cpu():
    x = torch.randn(7, 3, 2, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    probs = torch.softmax(5 * x[:, :, 0, 0], 1)
    for batch in (1, 3, 7, 64):
        top, p = runner.predict(Fixed().eval(), x, batch_size=batch)
        assert top.dtype == torch.int64 and p.dtype == torch.float64 and top.device.type == "cpu"
        assert top.tolist() == probs.argmax(1).tolist()
        torch.testing.assert_close(p, probs.max(1).values, rtol=1e-12, atol=0)
    bad = x.clone()
    bad[4, 0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        runner.predict(Fixed().eval(), bad, batch_size=3)


@pytest.mark.mutation
def test_plain_json_values():
    assert runner._plain(0.25) == 0.25 and isinstance(runner._plain(0.25), float)
    assert runner._plain(0.1) == 0.1 and runner._plain([0.1, 0.3]) == [0.1, 0.3]  # float64: no float32 rounding
    assert runner._plain(torch.full((3, 1, 1), 0.5)) == 0.5  # one value repeated: a number
    assert runner._plain(torch.tensor([[0.1], [0.2], [0.1]])) == pytest.approx([0.1, 0.2, 0.1])


@pytest.mark.mutation
def test_ensemble_only_when_asked_and_two_or_more():
    a, b = Fixed().eval(), ByMean().eval()
    assert runner.with_ensemble({"a": a}, True) == {"a": a}
    assert runner.with_ensemble({"a": a, "b": b}, False) == {"a": a, "b": b}
    both = runner.with_ensemble({"a": a, "b": b}, True)
    assert list(both) == ["a", "b", "ensemble (mean logits)"] and both["a"] is a and both["b"] is b
    ens = both["ensemble (mean logits)"]
    assert isinstance(ens, Ensemble)
    x = torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ens(x), (a(x) + b(x)) / 2)


@pytest.mark.mutation
def test_exact_sis_size_guard_at_the_limit():
    runner.check_method("exact", (1, 3, 64, 64))  # 4,096 pixels: allowed
    runner.check_method("exact", (1, 3, 1, 4096))
    for method in ("gradient", "responsibility"):
        runner.check_method(method, (1, 3, 224, 224))
    with pytest.raises(ValueError, match=whole_message(
            "exact SIS over 4160 pixels needs about 8.65e+06 forward passes per image; use method 'gradient' "
            "(torch models) or 'responsibility', or smaller images")):
        runner.check_method("exact", (1, 3, 64, 65))


@pytest.mark.mutation
def test_model_options_engines_and_transfer_rule(tmp_path):
    assert AuditConfig("exact", 0.9, "auto", k=100, autocast=None, baselines=0.0).model_options() == {
        "threshold": 0.9, "threshold_mode": "auto", "baselines": 0.0}
    assert AuditConfig("gradient", 0.8, "relative", k=16, autocast="bf16", baselines=0.5).model_options() == {
        "threshold": 0.8, "threshold_mode": "relative", "baselines": 0.5, "k": 16, "autocast": "bf16"}
    assert runner.fixed_engine(Fixed().eval()) == "torch"
    from overinterp_fast import export_onnx
    from overinterp_fast.runtime.onnx import OnnxModel

    path = export_onnx(Fixed().eval().float(), str(tmp_path / "m.onnx"), torch.randn(2, 3, 4, 4))
    assert runner.fixed_engine(OnnxModel(path)) == "onnxruntime"
    assert runner.wants_transfer(True, 2, "exact") and runner.wants_transfer(True, 3, "gradient")
    assert not runner.wants_transfer(False, 2, "exact")
    assert not runner.wants_transfer(True, 1, "exact")
    assert not runner.wants_transfer(True, 2, "responsibility")  # no backward-selection order to cut
    assert runner.reference_name(True) == "labels" and runner.reference_name(False) == "full-image predictions"


def test_method_auto_resolves_by_image_size_and_gradients(tmp_path, caplog):
    """"auto": exact up to 32 x 32 = 1024 pixels; above, gradient when every model has gradients, else
    responsibility (an ONNX model, its path, or an ensemble holding one); the other methods as given."""
    import logging

    from overinterp_fast import Ensemble, export_onnx
    from overinterp_fast.runtime.onnx import OnnxModel

    torch_model = Fixed().eval()
    path = export_onnx(Fixed().eval().float(), str(tmp_path / "m.onnx"), torch.randn(2, 3, 4, 4))
    onnx = OnnxModel(path)
    assert runner.resolve_method("auto", (1, 3, 32, 32), [torch_model, onnx]) == "exact"
    assert runner.resolve_method("auto", (3, 16, 64), [onnx]) == "exact"  # 1024 pixels
    assert runner.resolve_method("auto", (3, 33, 32), [torch_model]) == "gradient"  # 1056 pixels
    assert runner.resolve_method("auto", (3, 224, 224), [torch_model, torch_model]) == "gradient"
    for without in (onnx, path, Ensemble([torch_model, onnx])):
        assert runner.resolve_method("auto", (3, 224, 224), [torch_model, without]) == "responsibility"
    assert runner.resolve_method("auto", (3, 224, 224), [Ensemble([torch_model, Fixed()])]) == "gradient"
    for method in ("exact", "gradient", "responsibility"):
        assert runner.resolve_method(method, (3, 224, 224), [onnx]) == method
    with pytest.raises(ValueError, match="^method must be one of \\('auto', 'exact', 'gradient', 'responsibility'\\), "
                       "got 'fast'$"):
        runner.resolve_method("fast", (3, 8, 8), [torch_model])
    with caplog.at_level(logging.INFO, logger="overinterp_fast"):
        runner.resolve_method("auto", (3, 40, 40), [onnx])
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("overinterp_fast")] == [
        ("overinterp_fast.methods.choice", "method 'auto' runs 'responsibility': 1600 features (more than 1024, "
                                           "and a model without gradients)")]


def _order_result(order: list[int]) -> SISResult:
    return SISResult(order=torch.tensor(order), values=torch.zeros(len(order)), target=0, score=1.0, threshold=0.5,
                     sis=None, mask=None)


class ByLast(nn.Module):
    """Class 1 when the last pixel of the first channel is positive, else class 0 (logits +-4)."""

    def forward(self, x):
        v = x[:, :1, -1, -1]
        s = torch.where(v > 0, torch.ones_like(v), -torch.ones_like(v))
        return torch.cat([-4 * s, 4 * s], 1)


@pytest.mark.mutation
def test_transfer_counts_and_table_against_labels_by_hand():
    """Images 2x2, one channel; each model's subset keeps the last ceil(0.25 * 4) = 1 pixel of its order."""
    x = torch.tensor([[[[1.0, -3.0], [2.0, 5.0]]], [[[-1.0, 4.0], [-6.0, 2.0]]], [[[3.0, 3.0], [-2.0, -2.0]]]])
    models = {"mean": ByMean().eval(), "last": ByLast().eval()}
    # model "mean"'s order ends at pixel 3, model "last"'s at pixel 0
    results = [[_order_result([0, 1, 2, 3])] * 3, [_order_result([3, 2, 1, 0])] * 3]
    labels = torch.tensor([1, 1, 0])
    reference = {"mean": labels, "last": labels}
    # "mean"'s subsets keep pixel 3 (5, 2, -2): ByMean and ByLast both say 1, 1, 0: 3 right each.
    # "last"'s keep pixel 0 (1, -1, 3), pixel 3 masked to 0: ByMean 1, 0, 1 (1 right), ByLast 0, 0, 0 (1 right)
    counts = runner.transfer_counts(models, results, x, reference, 0.25, 0.0)
    assert counts == [[3, 3], [1, 1]]  # row A = whose subsets, column B = which model classifies them
    records = [ModelRecord("mean", "exact", results[0]), ModelRecord("last", "exact", results[1])]
    table = runner.transfer_table(models, records, x, reference, 0.25, 0.0)
    assert table == {"fraction": 0.25, "rows": ["mean", "last"], "cols": ["mean", "last"],
                     "accuracy": [[1.0, 1.0], [1 / 3, 1 / 3]], "reference": "labels"}
    other = runner.transfer_table(models, records[::-1], x, reference, 0.25, 0.0, reference_name="own")
    assert other["rows"] == ["last", "mean"] and other["cols"] == ["mean", "last"]
    assert other["accuracy"] == [[1 / 3, 1 / 3], [1.0, 1.0]] and other["reference"] == "own"
    # masked to 9 instead: "mean"'s subsets [9, 9, 9, v]: ByMean 1, 1, 1 (2 right), ByLast 1, 1, 0 (3);
    # "last"'s [v, 9, 9, 9]: both say 1, 1, 1 (2 right each)
    assert runner.transfer_counts(models, results, x, reference, 0.25, 9.0) == [[2, 3], [2, 2]]
    # the reference of each column is its own: ByLast against all-ones
    own = {"mean": labels, "last": torch.ones(3, dtype=torch.int64)}
    assert runner.transfer_counts(models, results, x, own, 0.25, 0.0) == [[3, 2], [1, 0]]


@pytest.mark.mutation
def test_transfer_and_sensitivity_summaries_by_hand():
    s = runner.transfer_summary([[3, 1], [0, 4]], 4, ["a", "b"], 0.05, "labels")
    assert s == {"fraction": 0.05, "rows": ["a", "b"], "cols": ["a", "b"], "accuracy": [[0.75, 0.25], [0.0, 1.0]],
                 "reference": "labels"}
    cols = {"fg_correct": np.array([True, False, False, False]), "bg_correct": np.array([True, True, True, False]),
            "p_fg": np.array([0.5, 0.1, 0.2, 0.2]), "p_bg": np.array([0.9, 0.8, 0.6, 0.3])}
    out = runner.sensitivity_summary(cols, 0.25, "full-image predictions")
    # a_fg 0.25, a_bg 0.75: mean 0.5, RFS = 0.5 / (2 * 0.5) = 0.5; p_fg 0.25, p_bg 0.65: mean 0.45,
    # iRFS = 0.4 / (2 * 0.45)
    assert out["sigma"] == 0.25 and out["reference"] == "full-image predictions"
    assert out["a_fg"] == 0.25 and out["a_bg"] == 0.75 and out["rfs"] == pytest.approx(0.5)
    assert out["irfs"] == pytest.approx(0.4 / 0.9)


@pytest.mark.mutation
def test_run_audit_argument_checks():
    x = torch.zeros(2, 3, 4, 4)
    displays = [np.zeros((4, 4, 3), np.uint8)] * 2
    model = {"m": ByMean().eval()}
    cases = [
        (dict(image_names=["a"]), "2 images, 1 names and 2 displays"),
        (dict(displays=displays[:1]), "2 images, 2 names and 1 displays"),
        (dict(labels=[1]), "2 images and 1 labels"),
        (dict(models={}), "no models to audit"),
        (dict(object_masks=np.zeros((2, 4, 5), bool)), "object masks must be [N, H, W] = [2, 4, 4], got [2, 4, 5]"),
    ]
    for change, message in cases:
        kw = dict(models=model, images=x, image_names=["a", "b"], displays=displays)
        kw.update(change)
        with pytest.raises(ValueError, match=whole_message(message)):
            runner.run_audit(**kw, run=RunOptions(show_progress=False))


@pytest.mark.mutation
def test_run_audit_with_labels_records_the_label_reference_and_classes():
    """Two known labels: accuracies and transfer against the labels; class names cover labels and predictions."""
    x = torch.stack([torch.full((1, 2, 2), 2.0), torch.full((1, 2, 2), -2.0)])
    x[0, 0, 0, 0] = -1.0
    displays = np.zeros((2, 2, 2), np.uint8)
    rec = runner.run_audit({"a": ByMean().eval(), "b": ByMean().eval()}, x, ["p", "q"], displays,
                           AuditConfig(threshold=0.5, method="exact", fraction=0.25),
                           RunOptions(class_name=lambda c: f"c{c}", title="T", meta={"source": "hand"},
                                      show_progress=False), labels=[1, 1])
    assert rec.title == "T" and rec.image_names == ["p", "q"] and rec.labels == [1, 1]
    assert rec.class_names == {0: "c0", 1: "c1"}  # predictions 1 and 0, labels 1
    assert rec.transfer["reference"] == "labels" and rec.transfer["rows"] == ["a", "b"]
    assert rec.meta["source"] == "hand" and rec.meta["images"] == "2 x [1, 2, 2] torch.float32"
    assert rec.meta["device"] == "cpu" and rec.meta["torch"] == torch.__version__
    for m in rec.models:
        assert m.options == {"threshold": 0.5, "threshold_mode": "auto", "baselines": 0.0}
        assert m.method == "exact" and len(m.results) == 2 and m.seconds >= 0 and m.sensitivity is None
        assert m.predictions == [1, 0]
    # image 0's SIS under ByMean: the fewest pixels whose mean stays positive with the rest at 0: one pixel of 2
    assert rec.models[0].results[0].sis is not None and len(rec.models[0].results[0].sis) == 1
    # the 25% subset of image 0 keeps its last-ranked pixel (a 2: class 1), image 1's a -2 (class 0); against the
    # labels (1, 1) at most image 0 is right
    assert all(0 <= v <= 0.5 for row in rec.transfer["accuracy"] for v in row)
    assert not math.isnan(rec.transfer["accuracy"][0][0])


@pytest.mark.mutation
def test_audit_progress_bar_per_model(monkeypatch):
    """progress=True: a bar named "audit" counting models, with the model's name; False: nothing; None: only on a
    terminal (fast_sis's own bars follow the same switch)."""
    from helpers import fake_terminal

    x = torch.stack([torch.full((1, 2, 2), 2.0), torch.full((1, 2, 2), -2.0)])
    displays = np.zeros((2, 2, 2), np.uint8)

    def run(progress):
        tty = fake_terminal(monkeypatch)
        runner.run_audit({"first": ByMean().eval(), "second": ByLast().eval()}, x, ["p", "q"], displays,
                         AuditConfig(threshold=0.5, transfer=False), RunOptions(show_progress=progress))
        return "".join(tty.text)

    shown = run(True)
    assert "audit: 100%" in shown and "2/2" in shown and "model/s" in shown and "second" in shown
    assert run(False) == ""
    assert "audit: 100%" in run(None)  # the fake stderr says it is a terminal


@pytest.mark.mutation
def test_audit_chunk_passes_every_option_on(monkeypatch):
    """fast_sis and noise_sensitivity replaced by recorders: what each model's work is asked for, by hand."""
    import time

    calls, sens = [], []

    def fake_sis(model, images, taus, **kw):
        calls.append((model, taus, kw))
        return [_order_result([0, 1, 2, 3]) for _ in range(images.shape[0])]

    def fake_sensitivity(model, images, masks, truth, sigma, low, high, seed, outputs):
        assert outputs == "logits"
        sens.append((truth.tolist(), float(sigma), None if low is None else float(low),
                     None if high is None else float(high), seed))
        n = images.shape[0]
        return {"correct_fg": torch.ones(n, dtype=torch.bool), "correct_bg": torch.zeros(n, dtype=torch.bool),
                "p_fg": torch.full((n,), 0.75), "p_bg": torch.full((n,), 0.25)}

    monkeypatch.setattr(runner, "fast_sis", fake_sis)
    monkeypatch.setattr(runner, "noise_sensitivity", fake_sensitivity)
    x = torch.stack([torch.full((1, 2, 2), 2.0), torch.full((1, 2, 2), -2.0)])  # ByMean: classes 1, 0
    masks = torch.ones(2, 2, 2, dtype=torch.bool)
    models = {"m": ByMean().eval()}
    config = AuditConfig(threshold=0.9, threshold_mode="absolute", method="gradient", k=7, collection=True,
                         transfer=False, fraction=0.25, baselines=0.5, autocast="bf16", batch_size=5, noise_sigma=0.3,
                         value_range=(-1.0, 1.0), seed=3)
    t0 = time.perf_counter()
    done = runner.audit_chunk(models, x, [0, 0], True, config, engine=None, progress=False, object_masks=masks)
    wall = time.perf_counter() - t0
    ((model, taus, kw),) = calls
    assert model is models["m"] and taus == [0.9, 0.9]
    assert kw == {"method": "gradient", "collection": True, "baselines": 0.5, "batch_size": 5, "engine": "torch",
                  "show_progress": False, "options": GradientOptions(k=7, autocast="bf16"),
                  "outputs": "logits"}  # engine None: fixed_engine's
    assert 0 <= done.seconds[0] <= wall and done.transfer is None
    # known labels: the truth is the labels, not the predictions; sigma 0.3 of the pixel range, which spans
    # 1 - (-1) = 2 in the images' units: 0.6 there, clipped to [-1, 1]; the audit's seed
    assert sens == [([0, 0], pytest.approx(0.6), -1.0, 1.0, 3)]
    assert done.sensitivity[0]["fg_correct"].tolist() == [True, True]
    calls.clear(), sens.clear()
    runner.audit_chunk(models, x, [None, None], False, replace(config, value_range=None), engine="onnxruntime",
                       progress=False, object_masks=masks)
    assert calls[0][2]["engine"] == "onnxruntime"
    # unknown labels: each model's own predictions; no value range: the images are in pixel units, no clipping
    assert sens == [([1, 0], pytest.approx(0.3), None, None, 3)]


@pytest.mark.mutation
def test_run_audit_defaults_and_what_it_passes_on(monkeypatch):
    """audit_chunk replaced by a recorder: run_audit's documented defaults reach it, and its results become the
    record (options, sensitivity with the noise sigma, transfer with the fraction)."""
    seen = []

    def fake_chunk(models, images, labels, known, config, **kw):
        seen.append(dict(vars(config), **kw))
        del seen[-1]["ensemble"]  # the ensemble is in ``models`` already
        n = images.shape[0]
        sens = {"fg_correct": np.ones(n, bool), "bg_correct": np.zeros(n, bool), "p_fg": np.full(n, 0.5),
                "p_bg": np.full(n, 0.5)}
        return runner.ChunkResult([[_order_result([0, 1, 2, 3])] * n for _ in models], [0.0] * len(models),
                                  [sens if kw["object_masks"] is not None else None for _ in models],
                                  [[n] * len(models) for _ in models])

    monkeypatch.setattr(runner, "audit_chunk", fake_chunk)
    x = torch.zeros(2, 1, 2, 2)
    displays = np.zeros((2, 2, 2), np.uint8)
    rec = runner.run_audit({"a": ByMean().eval(), "b": ByLast().eval()}, x, ["p", "q"], displays)
    # method "auto" on 2 x 2 images: exact
    assert seen[0] == {"threshold": 0.9, "threshold_mode": "auto", "method": "exact", "k": 100, "collection": False,
                       "transfer": True, "fraction": 0.05, "baselines": None, "autocast": None, "batch_size": None,
                       "engine": "auto", "progress": None, "object_masks": None, "noise_sigma": 0.1,
                       "value_range": None, "seed": 0, "score_dtype": None, "channels_last": None,
                       "outputs": "logits"}
    assert rec.title == "Overinterpretation audit" and rec.transfer["fraction"] == 0.05
    assert rec.models[0].options == {"threshold": 0.9, "threshold_mode": "auto", "baselines": 0.0}
    masks = np.ones((2, 2, 2), bool)
    rec = runner.run_audit({"a": ByMean().eval(), "b": ByLast().eval()}, x, ["p", "q"], displays,
                           AuditConfig(threshold=0.7, threshold_mode="relative", method="gradient", k=9,
                                       collection=True, fraction=0.5, baselines=0.25, autocast="fp16", batch_size=4,
                                       noise_sigma=0.125, value_range=(0.0, 1.0)),
                           RunOptions(show_progress=False), object_masks=masks)
    kw = seen[1]
    assert torch.equal(kw.pop("object_masks"), torch.ones(2, 2, 2, dtype=torch.bool))
    assert kw == {"threshold": 0.7, "threshold_mode": "relative", "method": "gradient", "k": 9, "collection": True,
                  "transfer": True, "fraction": 0.5, "baselines": 0.25, "autocast": "fp16", "batch_size": 4,
                  "engine": "auto", "progress": False, "noise_sigma": 0.125, "value_range": (0.0, 1.0), "seed": 0,
                  "score_dtype": None, "channels_last": None, "outputs": "logits"}
    assert rec.models[1].options == {"threshold": 0.7, "threshold_mode": "relative", "baselines": 0.25, "k": 9,
                                     "autocast": "fp16"}
    assert rec.models[0].method == "gradient" and rec.models[0].sensitivity["sigma"] == 0.125
    assert rec.models[0].sensitivity["reference"] == "full-image predictions"
    assert rec.transfer["fraction"] == 0.5 and rec.transfer["accuracy"] == [[1.0, 1.0], [1.0, 1.0]]


@pytest.mark.mutation
def test_command_line_names_the_program_not_its_file(monkeypatch):
    assert runner.command_line(["/opt/venv/bin/overinterp-fast", "audit", "--model", "my net.pt2", "--out", "o"]) \
        == "overinterp-fast audit --model 'my net.pt2' --out o"
    assert runner.command_line(["/work/src/overinterp_fast/__main__.py", "audit", "--quiet"]) \
        == "python -m overinterp_fast audit --quiet"
    assert runner.command_line(["overinterp-fast"]) == "overinterp-fast" and runner.command_line([]) == ""
    monkeypatch.setattr(sys, "argv", [os.path.join(os.sep, "usr", "lib", "overinterp_fast", "__main__.py"), "sis",
                                      "--model", "efficientnet-lite0"])
    assert runner.run_info("cpu", "1 image", None)["command"] == \
        "python -m overinterp_fast sis --model efficientnet-lite0"


def test_run_info_fields(monkeypatch):
    import platform

    import re

    import overinterp_fast.ops as ops
    from overinterp_fast.ops import OpInfo

    monkeypatch.setattr(sys, "argv", ["overinterp-fast", "audit", "--quiet"])
    asked = []
    monkeypatch.setattr(ops, "ops_info", lambda devices: asked.append(devices) or [
        OpInfo("mask_apply", "cpu", "kernel", "compiled cpu kernel"), OpInfo("rect_fill", "cpu", "torch", "forced")])
    info = runner.run_info("cpu", "2 images", {"extra": 1, "device": "overridden"})
    assert set(info) == {"date", "command", "device", "overinterp_fast", "torch", "python", "machine", "ops",
                         "images", "extra"}
    assert info["ops"] == {"mask_apply": "kernel (compiled cpu kernel)", "rect_fill": "torch (forced)"}
    assert asked == [["cpu"]]  # the ops of the device the audit ran on
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "setup.py")) as fh:  # the version the package is built with
        assert info["overinterp_fast"] == re.search(r'version="([^"]+)"', fh.read()).group(1)
    assert info["command"] == "overinterp-fast audit --quiet" and info["device"] == "overridden"
    assert info["python"] == platform.python_version() and info["machine"] == platform.machine()
    assert info["images"] == "2 images" and info["torch"] == torch.__version__ and len(info["date"]) == 19
    assert runner.run_info(torch.device("cpu"), "x", None)["device"] == "cpu"


@pytest.mark.mutation
def test_stored_audit_engine_for_onnx_models_is_onnxruntime(monkeypatch, tmp_path):
    """engine=None (the stored audit's): fixed_engine of each model, so an ONNX model runs on ONNX Runtime."""
    from overinterp_fast import export_onnx
    from overinterp_fast.runtime.onnx import OnnxModel

    engines_seen = []
    monkeypatch.setattr(runner, "fast_sis", lambda model, images, taus, **kw: engines_seen.append(kw["engine"])
                        or [_order_result([0, 1, 2, 3])] * images.shape[0])
    x = torch.stack([torch.full((1, 2, 2), 2.0), torch.full((1, 2, 2), -2.0)])
    onnx = OnnxModel(export_onnx(ByMean().eval(), str(tmp_path / "m.onnx"), x))
    runner.audit_chunk({"onnx": onnx, "torch": ByMean().eval()}, x, [0, 1], True,
                       AuditConfig(threshold=0.5, transfer=False), engine=None, progress=False, object_masks=None)
    assert engines_seen == ["onnxruntime", "torch"]


def test_the_audits_seed_reaches_the_responsibility_method_and_the_noise(monkeypatch):
    calls, seeds = [], []
    monkeypatch.setattr(runner, "fast_sis", lambda model, images, taus, **kw: calls.append(kw) or [
        _order_result([0, 1, 2, 3]) for _ in range(images.shape[0])])
    monkeypatch.setattr(runner, "noise_sensitivity", lambda *a, seed, outputs: seeds.append(seed) or {
        "correct_fg": torch.ones(2, dtype=torch.bool), "correct_bg": torch.ones(2, dtype=torch.bool),
        "p_fg": torch.ones(2), "p_bg": torch.ones(2)})
    x = torch.zeros(2, 1, 2, 2)
    masks = torch.ones(2, 2, 2, dtype=torch.bool)
    config = AuditConfig(method="responsibility", seed=5, transfer=False)
    runner.audit_chunk({"m": ByMean().eval()}, x, [0, 0], True, config, engine="torch", progress=False,
                       object_masks=masks)
    assert calls[0]["options"] == of.MinimalPixelSetOptions(seed=5) and seeds == [5]


@pytest.mark.parametrize("sigma, value_range, expect", [
    (0.1, None, (0.1, None, None)),  # the images are in pixel units: as given, not clipped
    (0.1, (0.0, 1.0), (0.1, 0.0, 1.0)),
    (0.2, (-1.0, 1.0), (0.4, -1.0, 1.0)),  # (x - 0.5) / 0.5: the pixel range spans 2
    (0.1, (-0.485 / 0.229, (1 - 0.485) / 0.229), (0.1 / 0.229, -0.485 / 0.229, (1 - 0.485) / 0.229)),
])
def test_noise_in_pixel_units_becomes_the_images_units(sigma, value_range, expect):
    got = runner.noise_in_image_units(sigma, value_range)
    assert [None if v is None else pytest.approx(float(v), rel=1e-6) for v in got] == list(expect)
