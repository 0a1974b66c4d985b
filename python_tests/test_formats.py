"""Every method on every model format the docs name (docs: guides/formats.md): an nn.Module, a pickled module, a
TorchScript module (scripted and traced), a torch.export program (.pt2), a state dict loaded into a library's
architecture (``timm:NAME=PATH``), and ONNX for the black-box methods. One test per (format, method).

A torch format computes what its nn.Module computes, so every method gives the module's results; a speed path
that cannot apply to a format steps aside, and the run's info says so. An ONNX model (ONNX Runtime's kernels)
gives sets that pass on the module too; the gradient method refuses it in one line.
"""
import importlib.util
import logging
import warnings

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.attr import ExactSIS, GradientSIS, MinimalPixelSet, Responsibility, SufficientSubset
from overinterp_fast.zoo.models import load_model

X = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3))
PATCHES = (torch.arange(6).view(6, 1) // 2) * 3 + torch.arange(6).view(1, 6) // 2  # 9 patches of 2 x 2
RANKING = torch.randn(2, 36, generator=torch.Generator().manual_seed(4))
TORCH_FORMATS = ["module", "pickled", "script", "trace", "export", "state_dict"]
METHODS = ["exact", "gradient", "responsibility", "minimal", "subset"]


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(6 * 36, 4)).eval()


def _timm_net() -> nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False).eval()


@pytest.fixture(scope="module")
def formats(tmp_path_factory):
    """format -> (the model in that format, the nn.Module it computes)."""
    tmp = tmp_path_factory.mktemp("formats")
    net = small_cnn()
    torch.save(net, tmp / "whole.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's deprecation of TorchScript
        torch.jit.save(torch.jit.script(net), str(tmp / "scripted.ts"))
        torch.jit.save(torch.jit.trace(net, X), str(tmp / "traced.ts"))
    program = torch.export.export(net, (X,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, str(tmp / "prog.pt2"))
    timm_net = _timm_net()
    torch.save(timm_net.state_dict(), tmp / "weights.pth")
    out = {
        "module": (net, net),
        "pickled": (load_model(str(tmp / "whole.pt")).model, net),
        "script": (load_model(str(tmp / "scripted.ts")).model, net),
        "trace": (load_model(str(tmp / "traced.ts")).model, net),
        "export": (torch.export.load(str(tmp / "prog.pt2")).module(), net),  # as a Python user loads it
        "state_dict": (load_model(f"timm:test_resnet={tmp / 'weights.pth'}").model, timm_net),
    }
    if importlib.util.find_spec("onnx") is not None:
        of.export_onnx(net, str(tmp / "net.onnx"), X, dynamo=False)
        out["onnx"] = (str(tmp / "net.onnx"), net)
    return out


def run(method: str, model):
    """One method on X, its options small (a few hundred rows)."""
    if method == "exact":
        return ExactSIS(model, threshold=0.3).find_sis(X, feature_mask=PATCHES)
    if method == "gradient":
        return GradientSIS(model, threshold=0.3, k=12).find_sis(X)
    if method == "responsibility":
        return Responsibility(model, iterations=2).compute_maps(X)
    if method == "minimal":
        return MinimalPixelSet(model, iterations=2).find_sis(X)
    return SufficientSubset(model, threshold=0.3).find_sis(X, RANKING)


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        if hasattr(w, "map"):
            assert torch.equal(g.map, w.map) and g.queries == w.queries and g.target == w.target
        else:
            assert g.target == w.target and g.order.tolist() == w.order.tolist()
            assert (g.sis is None) == (w.sis is None) and (g.sis is None or g.sis.tolist() == w.sis.tolist())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("fmt", TORCH_FORMATS)
def test_every_method_runs_on_every_torch_format_as_on_its_module(formats, fmt, method, caplog):
    model, module = formats[fmt]
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="overinterp_fast"):
        warnings.simplefilter("error")  # no warning: a speed path that does not apply steps aside silently
        got = run(method, model)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("overinterp_fast")] == []
    _same(got, run(method, module))
    assert all(isinstance(r.info, of.methods.results.RunInfo) for r in got)
    if method == "gradient":
        channels_last = got[0].info["channels_last"]
        if fmt in ("script", "trace"):
            assert channels_last == "off: a TorchScript module, whose weights cannot be swapped for laid-out copies"
        else:
            assert channels_last == "on"
    if method == "exact" and fmt in ("script", "trace"):
        assert got[0].info["incremental"].startswith("off: torch.fx cannot trace the model")


@pytest.mark.parametrize("method", METHODS)
def test_every_black_box_method_runs_on_onnx_and_gradient_refuses_it(formats, method):
    pytest.importorskip("onnxruntime")
    if "onnx" not in formats:
        pytest.skip("needs onnx")
    path, module = formats["onnx"]
    if method == "gradient":
        with pytest.raises(ValueError, match=r"^method='gradient' needs gradients, and ONNX Runtime has no autograd; "
                                             r"on ONNX models use a black-box method: 'exact', 'responsibility'$"):
            run(method, path)
        return
    got, want = run(method, path), run(method, module)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.target == w.target
        if method == "responsibility":
            assert g.map.shape == (6, 6) and g.queries > 0
            continue
        assert g.engine == "onnxruntime" and (g.sis is None) == (w.sis is None)
        if g.sis is not None and method == "exact":  # the set passes on the module too (float noise aside)
            keep = torch.zeros(9, dtype=torch.bool)
            keep[g.sis] = True
            with torch.no_grad():
                f = torch.softmax(module((X[i] * keep[PATCHES])[None]), 1)[0, g.target]
            assert float(f) >= 0.3 - 1e-5


def test_gradient_channels_last_on_a_torchscript_module(formats):
    """channels_last=True on a TorchScript module: the inputs only (its weights cannot be swapped), the same sets."""
    model, module = formats["script"]
    got = GradientSIS(model, threshold=0.3, k=12, channels_last=True).find_sis(X)
    assert got[0].info["channels_last"] == ("inputs only: a TorchScript module, whose weights "
                                            "cannot be swapped for laid-out copies")
    _same(got, GradientSIS(module, threshold=0.3, k=12).find_sis(X))


def test_an_export_with_a_fixed_batch_size_is_named_in_one_line(tmp_path):
    torch.export.save(torch.export.export(small_cnn(), (X,)), str(tmp_path / "fixed.pt2"))  # batch 2 only
    fixed = torch.export.load(str(tmp_path / "fixed.pt2")).module()
    with pytest.raises(ValueError, match=r"^the torch\.export program refuses a batch of \d+ rows \(Guard failed: "
                                         r"input\.size\(\)\[0\] == 2\); export it with a dynamic batch dimension: "):
        ExactSIS(fixed, threshold=0.3).find_sis(X)
