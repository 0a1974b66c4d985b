"""PixelSubsetDataset (audit/subset_dataset.py) over a pixel-subset file written by hand: every item's pixels worked
out from the photo, the normalization and the masks, the labels it carries, batches through a DataLoader, and the
one-line errors of bad input."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from overinterp_fast.audit import PixelSubsetDataset
from overinterp_fast.audit.subset_files import load_pixel_subsets
from helpers import whole_message

MEAN, STD = [0.5, 0.25, 0.0], [0.5, 0.25, 1.0]


def write_file(path, labels=(2, -1, 0), targets=(1, 1, 0), mask_value=(0.0,)):
    """Three 2 x 2 RGB photos; image i's pixel (r, c) channel k is 10 * i + 4 * r + 2 * c + k (out of 255).
    backselect keeps pixel (0, 1) of image 0, (1, 0) of image 1, (1, 1) of image 2; random keeps (0, 0) of each."""
    photos = np.zeros((3, 2, 2, 3), np.uint8)
    for i in range(3):
        for r in range(2):
            for c in range(2):
                photos[i, r, c] = [10 * i + 4 * r + 2 * c + k for k in range(3)]
    backselect = np.zeros((3, 2, 2), bool)
    backselect[0, 0, 1] = backselect[1, 1, 0] = backselect[2, 1, 1] = True
    random = np.zeros((3, 2, 2), bool)
    random[:, 0, 0] = True
    np.savez(path, names=np.array(["a", "b", "c"]), labels=np.array(labels, np.int64),
             targets=np.array(targets, np.int64), photos=photos, order=np.zeros((3, 4), np.int16),
             backselect=backselect, random=random, mean=np.array(MEAN, np.float32), std=np.array(STD, np.float32),
             mask_value=np.array(mask_value, np.float64), fraction=np.float64(0.25), seed=np.int64(0),
             model=np.str_("net"), split=np.str_("train"))
    return str(path)


def by_hand(i, r, c):
    """Image i's pixel (r, c) normalized: (v / 255 - mean) / std per channel."""
    return [((10 * i + 4 * r + 2 * c + k) / 255 - MEAN[k]) / STD[k] for k in range(3)]


def test_items_keep_their_subset_and_the_rest_is_the_baseline(tmp_path):
    path = write_file(tmp_path / "train.npz", labels=(2, 1, 0))
    ds = PixelSubsetDataset(path, "backselect")
    assert len(ds) == 3 and (ds.channels, ds.size) == (3, 2)
    kept = {0: (0, 1), 1: (1, 0), 2: (1, 1)}
    for i in range(3):
        x, y = ds[i]
        assert x.dtype == torch.float32 and x.shape == (3, 2, 2) and y.dtype == torch.int64
        assert int(y) == (2, 1, 0)[i]
        for r in range(2):
            for c in range(2):
                want = by_hand(i, r, c) if (r, c) == kept[i] else [0.0, 0.0, 0.0]
                assert x[:, r, c].tolist() == pytest.approx(want, rel=1e-6, abs=1e-7), (i, r, c)
    x, _ = PixelSubsetDataset(path, "random")[1]
    assert x[:, 0, 0].tolist() == pytest.approx(by_hand(1, 0, 0), rel=1e-6) and x[:, 1:, :].abs().sum() == 0
    assert x[:, 0, 1].abs().sum() == 0
    x, _ = PixelSubsetDataset(path, "full")[2]
    assert x[:, 1, 0].tolist() == pytest.approx(by_hand(2, 1, 0), rel=1e-6)
    assert "PixelSubsetDataset('net', split 'train', backselect: 3 images of 3 x 2 x 2, labels)" == repr(ds)


def test_a_per_channel_baseline_and_the_predictions_as_labels(tmp_path):
    path = write_file(tmp_path / "f.npz", mask_value=(-1.0, 0.5, 2.0))
    ds = PixelSubsetDataset(load_pixel_subsets(path), "backselect", target="predictions")
    x, y = ds[0]
    assert int(y) == 1 and ds.labels.tolist() == [1, 1, 0]
    assert x[:, 0, 0].tolist() == [-1.0, 0.5, 2.0] and x[:, 1, 1].tolist() == [-1.0, 0.5, 2.0]
    assert x[:, 0, 1].tolist() == pytest.approx(by_hand(0, 0, 1), rel=1e-6)


def test_batches_are_the_items_stacked(tmp_path):
    ds = PixelSubsetDataset(write_file(tmp_path / "f.npz", labels=(2, 1, 0)), "random")
    batches = list(DataLoader(ds, batch_size=2))
    assert [b[0].shape for b in batches] == [(2, 3, 2, 2), (1, 3, 2, 2)]
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    assert torch.equal(x, torch.stack([ds[i][0] for i in range(3)])) and y.tolist() == [2, 1, 0]
    many = ds.__getitems__([2, 0, 2, -1])
    assert [int(t) for _, t in many] == [0, 2, 0, 0] and torch.equal(many[0][0], many[3][0])


def test_bad_input_is_one_line(tmp_path):
    path = write_file(tmp_path / "f.npz")
    with pytest.raises(ValueError, match=whole_message(
            "1 images of split 'train' have no known label; train on target='predictions' (the audited model's "
            "classes) instead")):
        PixelSubsetDataset(path)
    ok = PixelSubsetDataset(path, target="predictions")
    with pytest.raises(ValueError, match=whole_message(
            "which must be one of ('backselect', 'random', 'full'), got 'first'")):
        PixelSubsetDataset(path, "first", target="predictions")
    with pytest.raises(ValueError, match=whole_message("target must be one of ('labels', 'predictions'), got 'x'")):
        PixelSubsetDataset(path, target="x")
    with pytest.raises(FileNotFoundError, match="no pixel-subset file"):
        PixelSubsetDataset(str(tmp_path / "missing.npz"))
    with pytest.raises(IndexError, match=whole_message("index 3 is out of range for 3 images")):
        ok[3]
    with pytest.raises(ValueError, match="no images to build inputs of"):
        ok.subsets.inputs("random", [])
