"""How a photo becomes a model input (zoo/preprocessing.py): the plain transform, and the libraries' own.

Expectations come from PIL and numpy written out here, or from the libraries' complete pipelines (timm's
``create_transform`` with its ToTensor and Normalize, torchvision's ``weights.transforms()``, a transformers image
processor called as usual), never from the code under test.
"""
import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from overinterp_fast.zoo import preprocessing as pp

RNG = np.random.default_rng(3)
PHOTO = RNG.integers(0, 256, (30, 45, 3), dtype=np.uint8)  # H 30, W 45


def by_hand(display: np.ndarray, mean, std) -> torch.Tensor:
    x = torch.from_numpy(display.astype(np.float32) / 255.0)
    x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)
    return (x - torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)) / torch.tensor(
        std, dtype=torch.float32).view(-1, 1, 1)


def test_plain_transform_shorter_side_then_centre_crop():
    """Shorter side 30 -> 20: the long side round(45 * 20 / 30) = 30, PIL bicubic; the crop starts (30 - 20) // 2 = 5
    from the left."""
    prep = pp.Preprocessing(20, mean=[0.5, 0.25, 0.125], std=0.5)
    want = np.asarray(Image.fromarray(PHOTO).resize((30, 20), Image.BICUBIC))[:, 5:25]
    assert np.array_equal(prep.crop(PHOTO), want)
    torch.testing.assert_close(prep(PHOTO), by_hand(want, [0.5, 0.25, 0.125], 0.5), rtol=0, atol=0)
    square = PHOTO[:20, :20]
    assert np.array_equal(prep.crop(square), square)  # already S x S: as it is
    assert prep.describe() == {"size": 20, "library": "overinterp_fast", "resize": 20, "crop_pct": 1.0,
                               "interpolation": "bicubic", "crop_mode": "center", "mean": [0.5, 0.25, 0.125],
                               "std": 0.5}
    assert prep.mean == (0.5, 0.25, 0.125) and pp.Preprocessing(8, [0.2]).mean == 0.2  # lists become tuples
    assert pp.Preprocessing(8, (0.5, 0.5, 0.5)).describe()["mean"] == 0.5  # one value repeated: one number
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match=r"^the input size must be a positive integer"):
            pp.Preprocessing(bad)


def test_as_preprocessing_builds_the_plain_one_or_passes_one_through():
    prep = pp.Preprocessing(8, 0.1, 0.2)
    assert pp.as_preprocessing(prep) is prep
    assert pp.as_preprocessing(8) == pp.Preprocessing(8, 0.5, 0.5)  # TF-Lite's defaults
    assert pp.as_preprocessing(8, 0.0, 1.0) == pp.Preprocessing(8, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"^give mean and std in the Preprocessing, not beside it$"):
        pp.as_preprocessing(prep, mean=0.3)
    with pytest.raises(ValueError, match=r"^the input size is not known: give --size$"):
        pp.as_preprocessing(None)


@pytest.mark.parametrize("variant, side, crop_pct, resize", [(0, 224, 0.875, 256), (1, 240, 0.882, 272),
                                                             (2, 260, 0.89, 292)])
def test_timm_data_config_of_the_zoo_architectures(variant, side, crop_pct, resize):
    """tf_efficientnet_lite0/1/2 are evaluated with a centre crop: the shorter side to floor(S / crop_pct), then
    S x S. A 300 x 451 photo: the long side int(resize * 451 / 300) (torchvision truncates), the crop at
    round((resized - S) / 2). Equal, bit for bit, to timm's own pipeline (ToTensor, Normalize included)."""
    import timm

    model = timm.create_model(f"tf_efficientnet_lite{variant}", pretrained=False)
    prep = pp.from_timm(model)
    assert prep.describe() == {"size": side, "library": "timm", "resize": resize, "crop_pct": crop_pct,
                               "interpolation": "bicubic", "crop_mode": "center", "mean": 0.5, "std": 0.5}
    assert resize == math.floor(side / crop_pct)
    photo = np.random.default_rng(variant).integers(0, 256, (300, 451, 3), dtype=np.uint8)
    long = int(resize * 451 / 300)
    top, left = int(round((resize - side) / 2)), int(round((long - side) / 2))
    want = np.asarray(Image.fromarray(photo).resize((long, resize), Image.BICUBIC))[top:top + side,
                                                                                     left:left + side]
    assert np.array_equal(prep.crop(photo), want)
    timm_x = timm.data.create_transform(**timm.data.resolve_model_data_config(model))(Image.fromarray(photo))
    torch.testing.assert_close(prep(photo), timm_x, rtol=0, atol=0)


def test_timm_size_change_keeps_the_crop_fraction_and_pickles():
    import timm

    prep = pp.from_timm(timm.create_model("tf_efficientnet_lite0", pretrained=False))
    other = prep.with_values(size=240)
    # the crop fraction kept: floor(240 / 0.875) = 274
    assert (other.size, other.describe()["resize"], other.describe()["crop_pct"]) == (240, 274, 0.875)
    assert prep.with_values(mean=0.0, std=1.0).describe()["mean"] == 0.0 and prep.with_values().size == 224
    back = pickle.loads(pickle.dumps(prep))  # DataLoader workers may receive it pickled
    torch.testing.assert_close(back(PHOTO), prep(PHOTO), rtol=0, atol=0)


def test_torchvision_weights_transforms():
    """ResNet18's DEFAULT weights (no download: only the enum's transforms): resize 256 (bilinear), crop 224,
    ImageNet mean and std; equal to weights.transforms() on the same photo."""
    from torchvision.models import get_model_weights

    weights = get_model_weights("resnet18").DEFAULT
    prep = pp.from_torchvision(weights)
    assert prep.describe() == {"size": 224, "library": "torchvision", "weights": "ResNet18_Weights.IMAGENET1K_V1",
                               "resize": 256, "crop_pct": 0.875, "interpolation": "bilinear", "crop_mode": "center",
                               "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    photo = np.random.default_rng(1).integers(0, 256, (260, 300, 3), dtype=np.uint8)
    torch.testing.assert_close(prep(photo), weights.transforms()(Image.fromarray(photo)), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"^the torchvision transform fixes the input size \(224\); it cannot be "
                                         r"changed to 200$"):
        prep.with_values(size=200)
    # a one-channel photo stays one channel: shorter side 260 -> 256, long side int(256 * 300 / 260) = 295
    # (bilinear), crop at round(32 / 2) = 16 and round(71 / 2) = 36
    want = np.asarray(Image.fromarray(photo[..., 0]).resize((295, 256), Image.BILINEAR))[16:240, 36:260]
    assert np.array_equal(prep.crop(photo[..., 0]), want)


def _processor_dir(tmp_path, processor):
    folder = tmp_path / type(processor).__name__
    processor.save_pretrained(folder)
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(folder, local_files_only=True)


@pytest.mark.parametrize("make", ["vit", "convnext"])
def test_image_processor_geometry_and_normalization(tmp_path, make):
    """ViT: both sides to 24 (no crop); ConvNeXt below 384: shortest edge to int(24 / 0.875) = 27, crop 24. The
    model input equals the processor's own pixel_values (its rescale and normalize fused: float32 rounding)."""
    from transformers import ConvNextImageProcessor, ViTImageProcessor

    if make == "vit":
        proc = _processor_dir(tmp_path, ViTImageProcessor(size={"height": 24, "width": 24}, image_mean=[0.4] * 3,
                                                          image_std=[0.2] * 3))
    else:
        proc = _processor_dir(tmp_path, ConvNextImageProcessor(size={"shortest_edge": 24}, crop_pct=0.875))
    prep = pp.from_image_processor(proc)
    d = prep.describe()
    assert d["size"] == 24 and d["library"] == "transformers" and d["processor"] == type(proc).__name__
    assert (d["mean"], d["std"]) == ((0.4, 0.2) if make == "vit" else (0.5, 0.5))
    assert d["interpolation"] == ("bilinear" if make == "vit" else "bicubic")
    if make == "convnext":
        assert d["crop_pct"] == 0.875 and d["resize"] == {"shortest_edge": 24}
    want = proc(images=Image.fromarray(PHOTO), return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(prep(PHOTO), want, rtol=0, atol=1e-6)
    display = prep.crop(PHOTO)
    assert display.dtype == np.uint8 and display.shape == (24, 24, 3)


def test_image_processors_that_cannot_feed_an_audit(tmp_path):
    from transformers import ViTImageProcessor

    wide = _processor_dir(tmp_path, ViTImageProcessor(size={"height": 24, "width": 36}))
    with pytest.raises(ValueError, match=r"^ViTImageProcessor makes 24 x 36 inputs; an audit needs square ones$"):
        pp.from_image_processor(wide)
    odd = ViTImageProcessor(size={"height": 24, "width": 24}, rescale_factor=1 / 127.5)
    with pytest.raises(ValueError, match=r"^ViTImageProcessor rescales pixels by 0\.00784"):
        pp.from_image_processor(odd)
