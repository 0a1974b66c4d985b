"""Models by name (zoo/hub.py, through cli/loading.py's ``--model`` forms): timm, torchvision and transformers,
loaded by the libraries' own code from a local file or from the library's cache, never downloaded.

Every model here is built without pretrained weights (timm ``pretrained=False``, torchvision ``weights=None``,
transformers from a small config) and saved where the library looks: a file, the Hugging Face cache layout
(``models--ORG--NAME/snapshots/REVISION/FILE`` with ``refs/main``) in a temporary folder, or the torch hub
folder (``<hub dir>/checkpoints/<file name of the weights' URL>``). The expected logits are the saved model's own.
"""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from helpers import block_module

from overinterp_fast.cli import loading, main
from overinterp_fast.zoo import hub

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    """Empty Hugging Face and torch hub caches under tmp_path (nothing of the machine's)."""
    import huggingface_hub.constants as hf_constants

    hf, th = tmp_path / "hf-cache", tmp_path / "torch-hub"
    hf.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(hf))
    old = torch.hub.get_dir()
    torch.hub.set_dir(str(th))
    yield hf, th
    torch.hub.set_dir(old)


def _timm_net():
    import timm

    torch.manual_seed(0)
    return timm.create_model("test_resnet", pretrained=False).eval()


def test_timm_from_a_local_file(tmp_path, empty_caches):
    net = _timm_net()
    torch.save(net.state_dict(), tmp_path / "w.pth")
    got = loading.load_model(f"timm:test_resnet={tmp_path / 'w.pth'}", "cpu")
    assert got.name == "test_resnet" and got.differentiable and not got.model.training
    with torch.no_grad():
        torch.testing.assert_close(got.model(X), net(X), rtol=0, atol=0)
    # test_resnet's pretrained config (timm/test_resnet.r160_in1k): 160 x 160, crop_pct 0.95, bilinear, mean and
    # std 0.5 -> shorter side floor(160 / 0.95) = 168, then the centre crop
    assert got.preprocessing.describe() == {
        "size": 160, "library": "timm", "resize": 168, "crop_pct": 0.95, "interpolation": "bilinear",
        "crop_mode": "center", "mean": 0.5, "std": 0.5}
    assert (got.size, got.mean) == (160, (0.5, 0.5, 0.5))


def test_timm_from_the_hugging_face_cache(empty_caches):
    """timm/test_resnet.r160_in1k's model.safetensors where hf_hub_download would have left it."""
    from safetensors.torch import save_file

    hf, _ = empty_caches
    net = _timm_net()
    repo = hf / "models--timm--test_resnet.r160_in1k"
    revision = "0123456789abcdef0123456789abcdef01234567"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(repo / "snapshots" / revision / "model.safetensors"))
    model, prep = hub.load_timm("test_resnet")
    with torch.no_grad():
        torch.testing.assert_close(model(X), net(X), rtol=0, atol=0)
    assert prep.size == 160


def test_timm_without_weights_or_with_the_wrong_file(tmp_path, empty_caches):
    hf, _ = empty_caches
    with pytest.raises(ValueError, match=r"^timm:test_resnet: its weights are neither in the Hugging Face cache "
                                         r"\(timm/test_resnet\.r160_in1k: model\.safetensors, pytorch_model\.bin\); "
                                         r"fetch them once with timm\.create_model\('test_resnet', pretrained=True\) "
                                         r"where there is internet, or give a file: timm:test_resnet=PATH$"):
        loading.load_model("timm:test_resnet")
    torch.save({"w": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"^timm:test_resnet: cannot load '.*other\.pth': RuntimeError: Error\(s\) "
                                         r"in loading state_dict for ResNet: Missing key"):
        loading.load_model(f"timm:test_resnet={tmp_path / 'other.pth'}")
    with pytest.raises(FileNotFoundError, match=r"^timm:test_resnet: weights file 'nowhere\.pth' not found$"):
        loading.load_model("timm:test_resnet=nowhere.pth")
    with pytest.raises(ValueError, match=r"^timm has no model 'no_such_net'"):
        loading.load_model("timm:no_such_net")
    with pytest.raises(ValueError, match=r"^timm:test_resnet\.nosuchtag: Invalid pretrained tag \(nosuchtag\)"):
        loading.load_model("timm:test_resnet.nosuchtag")
    for bad in ("timm:", "timm:test_resnet="):
        with pytest.raises(ValueError, match=r"^--model timm:.*: expected timm:NAME or timm:NAME=WEIGHTS_FILE$"):
            loading.load_model(bad)


def test_torchvision_from_the_hub_cache_and_from_a_file(tmp_path, empty_caches):
    """mobilenet_v3_small's DEFAULT weights live at <hub dir>/checkpoints/mobilenet_v3_small-047dcff4.pth."""
    from torchvision.models import get_model

    _, th = empty_caches
    torch.manual_seed(0)
    net = get_model("mobilenet_v3_small", weights=None).eval()
    with pytest.raises(ValueError, match=r"^torchvision:mobilenet_v3_small: its weights "
                                         r"MobileNet_V3_Small_Weights\.IMAGENET1K_V1 are not in the torch hub cache "
                                         r"\(.*torch-hub/checkpoints/mobilenet_v3_small-047dcff4\.pth\); fetch them "
                                         r"once with torchvision\.models\.get_model\('mobilenet_v3_small', "
                                         r"weights='DEFAULT'\) where there is internet, or give a file: "
                                         r"torchvision:mobilenet_v3_small=PATH$"):
        loading.load_model("torchvision:mobilenet_v3_small")
    (th / "checkpoints").mkdir(parents=True)
    torch.save(net.state_dict(), th / "checkpoints" / "mobilenet_v3_small-047dcff4.pth")
    for spec in ("torchvision:mobilenet_v3_small",
                 f"torchvision:mobilenet_v3_small={th / 'checkpoints' / 'mobilenet_v3_small-047dcff4.pth'}"):
        got = loading.load_model(spec)
        assert got.name == "mobilenet_v3_small" and not got.model.training
        with torch.no_grad():
            torch.testing.assert_close(got.model(X), net(X), rtol=0, atol=0)
        assert got.preprocessing.describe() == {
            "size": 224, "library": "torchvision", "weights": "MobileNet_V3_Small_Weights.IMAGENET1K_V1",
            "resize": 256, "crop_pct": 0.875, "interpolation": "bilinear", "crop_mode": "center",
            "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    torch.save({"w": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"^torchvision:mobilenet_v3_small: cannot load '.*other\.pth': "
                                         r"RuntimeError: Error\(s\) in loading state_dict for MobileNetV3: "):
        loading.load_model(f"torchvision:mobilenet_v3_small={tmp_path / 'other.pth'}")
    with pytest.raises(ValueError, match=r"^torchvision has no classification model 'nonet'"):
        loading.load_model("torchvision:nonet")


def _tiny_vit(folder, labels=3):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32, num_labels=labels)
    net = ViTForImageClassification(config).eval()
    net.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5, 0.4, 0.3],
                      image_std=[0.2, 0.25, 0.5]).save_pretrained(folder)
    return net


def test_transformers_from_a_saved_folder(tmp_path, empty_caches):
    net = _tiny_vit(tmp_path / "vit")
    got = loading.load_model(f"hf:{tmp_path / 'vit'}")
    assert got.name == "vit" and got.differentiable and not got.model.training
    with torch.no_grad():
        torch.testing.assert_close(got.model(X), net(pixel_values=X).logits, rtol=0, atol=0)
    d = got.preprocessing.describe()
    assert (d["size"], d["library"], d["processor"], d["mean"], d["std"]) == (
        32, "transformers", "ViTImageProcessor", [0.5, 0.4, 0.3], [0.2, 0.25, 0.5])
    with pytest.raises(ValueError, match=r"^hf:.*nowhere: no image classifier and image processor in this Hugging "
                                         r"Face cache entry \(nothing is downloaded"):
        loading.load_model(f"hf:{tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match=r"^hf:someone/some-vit: no image classifier"):
        loading.load_model("hf:someone/some-vit")  # not in the (empty) cache: refused, not fetched
    with pytest.raises(ValueError, match=r"^--model hf:x=y: give the model's folder or Hub id, without =PATH$"):
        loading.load_model("hf:x=y")


def test_sis_command_on_a_transformers_model(tmp_path, empty_caches, capsys):
    """The whole path: --model hf:FOLDER, its processor's preprocessing on a folder of photos, SIS, results.json."""
    _tiny_vit(tmp_path / "vit", labels=2)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(photos / f"p{i}.png")
    code = main(["sis", "--model", f"hf:{tmp_path / 'vit'}", "--images", str(photos), "--method", "gradient",
                 "--k", "256", "--threshold", "0.5", "--quiet", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    prep = doc["meta"]["preprocessing"]
    assert (prep["library"], prep["size"], prep["mean"]) == ("transformers", 32, [0.5, 0.4, 0.3])
    assert doc["meta"]["overinterp_fast"] == "0.1.0"
    assert os.path.isfile(tmp_path / "out" / "sis.png")


@pytest.mark.parametrize("spec, module, extra", [("timm:resnet18", "timm", "hub"),
                                                 ("hf:org/net", "transformers", "hub"),
                                                 ("torchvision:resnet18", "torchvision", "audit")])
def test_a_missing_library_is_named_with_its_extra(monkeypatch, spec, module, extra):
    from overinterp_fast.errors import MissingDependency

    block_module(monkeypatch, module)
    with pytest.raises(MissingDependency) as err:
        loading.load_model(spec)
    assert str(err.value) == f"{spec} needs {module}, which is not installed: pip install 'overinterp-fast[{extra}]'"
    assert err.value.extra == extra
