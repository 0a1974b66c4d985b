"""A torch model file given where a model path goes (an ONNX model): one line that says what the file is and which
loader reads it, before onnxruntime is needed (runtime/model_files.py, runtime/onnx.py)."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.errors import MissingDependency
from overinterp_fast.runtime import onnx as runtime_onnx
from overinterp_fast.runtime.model_files import EXPORTED, PICKLED, TORCHSCRIPT, torch_file_kind
from overinterp_fast.zoo.models import load_model
from helpers import make_cnn, make_images, whole_message

LOADER = "overinterp_fast.zoo.models.load_model"


def _save(kind: str, path) -> str:
    """A model file of ``kind`` at ``path``, written by torch's own writers."""
    model, x = make_cnn(0), make_images(2)
    if kind == "torchscript":
        torch.jit.save(torch.jit.trace(model, x), str(path))
    elif kind == "export":
        torch.export.save(torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},)),
                          str(path))
    elif kind == "module":
        torch.save(model, path)
    elif kind == "state dict":
        torch.save(model.state_dict(), path)
    else:  # torch.save's format before its zip archives: a bare pickle
        torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False)
    return str(path)


FILES = [("torchscript", "cnn.ts", "a TorchScript archive (torch.jit.save)"),
         ("torchscript", "cnn.pt", "a TorchScript archive (torch.jit.save)"),
         ("export", "cnn.pt2", "a torch.export program (torch.export.save)"),
         ("module", "cnn.pt", "a torch.save file (a pickled model or a state dict)"),
         ("state dict", "weights.pth", "a torch.save file (a pickled model or a state dict)"),
         ("legacy", "weights.pt", "a torch.save file (a pickled model or a state dict)")]


@pytest.mark.parametrize("kind, name, what", FILES)
def test_a_torch_file_given_as_a_path_says_what_it_is_and_points_to_load_model(kind, name, what, tmp_path):
    path = _save(kind, tmp_path / name)
    want = whole_message(f"{path!r} is {what}, and a model given by its path must be an ONNX file: load this one "
                         f"with {LOADER}({path!r}).model and pass the module")
    x = make_images(2)
    for method, tau in (("exact", 0.5), ("responsibility", None)):  # the top-1 criterion has no threshold
        with pytest.raises(ValueError, match=want):
            of.fast_sis(path, x, tau, method=method)
    with pytest.raises(ValueError, match=want):
        of.ExactSIS(path).find_sis(x)


def test_the_loader_it_points_to_reads_it(tmp_path):
    """The advice works: load_model of the named file gives a module that fast_sis takes."""
    x = make_images(1)
    for kind, name in (("torchscript", "cnn.ts"), ("export", "cnn.pt2"), ("module", "cnn.pt")):
        model = load_model(_save(kind, tmp_path / name)).model
        assert torch.allclose(model(x), make_cnn(0)(x))
    assert of.fast_sis(model, x, 0.5)[0].order.numel() == 25


def test_a_torch_file_under_another_name_is_to_be_renamed(tmp_path):
    path = _save("torchscript", tmp_path / "cnn.onnx")
    with pytest.raises(ValueError, match=whole_message(
            f"{path!r} is a TorchScript archive (torch.jit.save), and a model given by its path must be an ONNX "
            f"file: give this one a .ts, .pt, .pth name, then load it with {LOADER}(path).model (the suffix chooses "
            f"the reader, as for the command line's --model)")):
        of.fast_sis(path, make_images(1), 0.5)


def test_the_file_is_named_before_onnxruntime_is_needed(monkeypatch, tmp_path):
    path = _save("torchscript", tmp_path / "cnn.ts")

    def missing():
        raise MissingDependency("the ONNX backend needs onnxruntime, which is not installed")

    monkeypatch.setattr(runtime_onnx, "_import_ort", missing)
    with pytest.raises(ValueError, match=r"^'.*cnn\.ts' is a TorchScript archive \(torch\.jit\.save\), and a "):
        of.fast_sis(path, make_images(1), 0.5)


def test_torch_file_kind_reads_the_contents_not_the_name(tmp_path):
    assert torch_file_kind(_save("torchscript", tmp_path / "a.bin")) is TORCHSCRIPT
    assert torch_file_kind(_save("export", tmp_path / "b.bin")) is EXPORTED
    assert torch_file_kind(_save("module", tmp_path / "c.bin")) is PICKLED
    assert torch_file_kind(_save("legacy", tmp_path / "d.bin")) is PICKLED
    notes = tmp_path / "notes.ts"
    notes.write_text("not a model")
    assert torch_file_kind(notes) is None
    assert torch_file_kind(tmp_path / "missing.ts") is None
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    assert torch_file_kind(tmp_path / "m.onnx") is None
