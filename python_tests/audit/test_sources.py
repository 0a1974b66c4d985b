"""The image sources one piece at a time (audit/sources.py): file decoding, range selection, flat folders and
ImageFolders, CIFAR-10/100 python batches, labels files, object masks, crops and collation. Every expectation is
built by hand from the files the test writes (PIL and numpy), never from the code under test; audit/test_stream.py
and cli/test_cli.py run the same sources end to end.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import json
import os
import pickle
import numpy as np
import pytest
import torch
from PIL import Image
from overinterp_fast.audit import sources as ds
from overinterp_fast.zoo.imagenet import PHOTOS
from overinterp_fast.zoo.preprocessing import Preprocessing

RNG = np.random.default_rng(7)


def save(path, array) -> np.ndarray:
    Image.fromarray(array).save(path)
    return array


def rgb(h, w) -> np.ndarray:
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def normalized(display: np.ndarray, mean, std) -> torch.Tensor:
    """(x / 255 - mean) / std, channels first, written out here."""
    x = torch.from_numpy(display.astype(np.float32) / 255.0)
    x = x[None] if x.ndim == 2 else x.permute(2, 0, 1)
    return (x - torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)) / torch.tensor(
        std, dtype=torch.float32).view(-1, 1, 1)


# ---------------------------------------------------------------------------------------------- files


@pytest.mark.mutation
def test_read_image_rgb_grey_and_unreadable(tmp_path):
    photo = save(tmp_path / "a.png", rgb(5, 7))
    assert np.array_equal(ds.read_image(str(tmp_path / "a.png")), photo)
    grey = ds.read_image(str(tmp_path / "a.png"), grey=True)
    expect = np.asarray(Image.fromarray(photo).convert("L"))
    assert grey.shape == (5, 7) and np.array_equal(grey, expect)
    assert np.array_equal(ds.to_grey(photo), expect)
    (tmp_path / "b.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"^cannot read image '.*b\.png'"):
        ds.read_image(str(tmp_path / "b.png"))
    with pytest.raises(ValueError, match="cannot read image"):
        ds.read_image(str(tmp_path / "missing.png"))


@pytest.mark.mutation
def test_select_range_bounds_limits_and_messages():
    assert ds.select_range(5) == range(5)
    assert ds.select_range(10, None, 3) == range(3)
    assert ds.select_range(10, " 2 : 7 ", 2) == range(2, 4)  # spaces around the bounds are fine
    assert ds.select_range(10, "-3:") == range(7, 10)  # Python slice bounds
    assert ds.select_range(10, ":", None) == range(10)
    assert ds.select_range(10, "4:", 100) == range(4, 10)
    with pytest.raises(ValueError, match=r"^--select must be A:B \(e\.g\. 100:200, :500, 1000:\), got '1-2'$"):
        ds.select_range(10, "1-2")
    with pytest.raises(ValueError, match=r"^no images selected \(of 10; select '7:3', limit None\)$"):
        ds.select_range(10, "7:3")
    with pytest.raises(ValueError, match=r"^no images selected \(of 4; select None, limit 0\)$"):
        ds.select_range(4, None, 0)


# ---------------------------------------------------------------------------------------------- folders


@pytest.mark.mutation
def test_flat_folder_files_names_labels_and_description(tmp_path):
    folder = tmp_path / "flat"
    folder.mkdir()
    b = save(folder / "b.PNG", rgb(12, 10))  # extensions match in any case
    a = save(folder / "a.jpg.png", rgb(10, 10))
    (folder / "notes.txt").write_text("not an image")
    (folder / "sub.png").mkdir()  # a folder named like an image is not one
    (tmp_path / "labels.json").write_text(json.dumps({"b.PNG": 4, "a.jpg": 2, "zz": 1}))
    src = ds.open_images(str(folder), 8, labels_file=str(tmp_path / "labels.json"))
    assert isinstance(src, ds.FileImages) and src.paths == [str(folder / "a.jpg.png"), str(folder / "b.PNG")]
    assert src.image_names == ["a.jpg", "b"] and src.image_labels == [2, 4] and src.classes is None
    assert src.description == {"source": "folder", "path": os.path.abspath(folder),
                               "labels_file": str(tmp_path / "labels.json")}
    assert np.array_equal(src.photo(1), b) and np.array_equal(src.photo(0), a)
    assert len(src) == 2 and src.size == 8 and not src.grey


@pytest.mark.mutation
def test_image_folder_skips_hidden_folders_and_rejects_empty_classes(tmp_path):
    root = tmp_path / "tree"
    for cls in ("x", "y", ".cache"):
        (root / cls).mkdir(parents=True)
    save(root / "x" / "1.png", rgb(8, 8))
    save(root / "y" / "0.jpeg", rgb(8, 8))
    save(root / ".cache" / "0.png", rgb(8, 8))
    src = ds.open_images(str(root), 8)
    assert src.classes == ["x", "y"] and src.image_names == ["x/1", "y/0"] and src.image_labels == [0, 1]
    assert src.description == {"source": "ImageFolder", "path": os.path.abspath(root), "labels_file": None}
    (root / "z").mkdir()  # a class folder with no images
    with pytest.raises(ValueError, match=r"^'.*tree': Found no valid file for the classes z"):
        ds.open_images(str(root), 8)


@pytest.mark.mutation
def test_folder_errors(tmp_path):
    save(tmp_path / "a.png", rgb(8, 8))
    with pytest.raises(FileNotFoundError, match=r"^images: '.*a\.png' is not a folder \(or 'bundled'\)$"):
        ds.open_folder(str(tmp_path / "a.png"), 8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^no images \(\.png, \.jpg, .*\) in '.*empty'$"):
        ds.open_folder(str(tmp_path / "empty"), 8)
    with pytest.raises(ValueError, match=r"^the input size is not known: give --size$"):
        ds.open_images(str(tmp_path))


@pytest.mark.mutation
def test_labels_file_rules(tmp_path):
    path = tmp_path / "labels.json"
    assert ds.read_labels(None, ["a", "b"]) == [None, None]
    path.write_text(json.dumps({"a.png": 0, "b": None, "c.001.JPG": 5, "d.001": 6, "e.txt": 7, "f.png": 8,
                                "f": 9}))
    names = ["a", "b", "c.001", "d.001", "d", "e", "e.txt", "f", "f.png"]
    assert ds.read_labels(str(path), names) == [0, None, 5, 6, None, None, 7, 9, 8]
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match=r"must hold a JSON object \{image name: class index\}$"):
        ds.read_labels(str(path), ["a"])
    for bad in (-1, 1.0, "3"):
        path.write_text(json.dumps({"a": bad}))
        with pytest.raises(ValueError, match=rf"label of 'a' must be a class index >= 0, got {bad!r}$"):
            ds.read_labels(str(path), ["a"])


# ---------------------------------------------------------------------------------------------- items


@pytest.mark.mutation
def test_items_crop_normalize_grey_and_subsets(tmp_path):
    big = save(tmp_path / "big.png", rgb(12, 18))  # shorter side 12 -> 8: resized, then cropped
    exact = save(tmp_path / "exact.png", rgb(8, 8))  # already the size: used as is
    src = ds.open_images(str(tmp_path), 8, mean=[0.1, 0.2, 0.3], std=[0.5, 0.25, 2.0])
    resized = np.asarray(Image.fromarray(big).resize((12, 8), Image.BICUBIC))
    assert np.array_equal(src.display(0), resized[:, 2:10])
    item = src[1]
    assert item["index"] == 1 and item["label"] is None and item["object"] is None
    assert np.array_equal(item["display"], exact)
    torch.testing.assert_close(item["x"], normalized(exact, [0.1, 0.2, 0.3], [0.5, 0.25, 2.0]))
    shown = src.display(1)
    shown[:] = 0  # a copy: the source's photo is untouched
    assert np.array_equal(src.display(1), exact)
    grey = ds.open_images(str(tmp_path), 8, mean=0.5, std=0.5, grey=True)
    g = grey[1]
    expect = np.asarray(Image.fromarray(exact).convert("L"))
    assert np.array_equal(g["display"], expect) and g["x"].shape == (1, 8, 8)
    torch.testing.assert_close(g["x"], normalized(expect, [0.5], [0.5]))
    # a subset of a subset keeps positions in the full source
    sub = src.subset([1, 0]).subset([1])
    assert sub.image_names == ["big"] and list(sub.indices) == [0] and len(sub) == 1
    assert np.array_equal(sub[0]["display"], src.display(0)) and sub[0]["index"] == 0
    assert src.image_names == ["big", "exact"]  # the original is unchanged


@pytest.mark.mutation
def test_array_images_grey_of_an_rgb_photo_and_ignores_grey_when_already_grey():
    photos = np.stack([rgb(8, 8), rgb(8, 8)])
    src = ds.ArrayImages(["p", "q"], [3, None], Preprocessing(8, 0.0, 1.0), True, arrays=photos)
    assert np.array_equal(src.display(0), np.asarray(Image.fromarray(photos[0]).convert("L")))
    assert src.image_labels == [3, None] and list(src.indices) == [0, 1]
    flat = ds.ArrayImages(["p"], [None], Preprocessing(8, 0.0, 1.0), True, arrays=[photos[0][..., 0]])
    assert np.array_equal(flat.display(0), photos[0][..., 0])


@pytest.mark.mutation
def test_object_masks_in_items_any_extension_and_errors(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    save(images / "cat.png", rgb(8, 8))
    save(images / "dog.png", rgb(8, 8))
    m = np.zeros((8, 8), np.uint8)
    m[2:5, 1:3] = 1  # nonzero = object, however dark
    save(masks / "cat.PNG", m)
    m2 = np.zeros((16, 16), np.uint8)
    m2[:8] = 200
    save(masks / "dog.bmp", m2)
    src = ds.open_images(str(images), 8, object_dir=str(masks))
    assert src.object_dir == str(masks)
    cat, dog = src[0], src[1]
    assert cat["object"].dtype == torch.bool and torch.equal(cat["object"], torch.from_numpy(m > 0))
    expect = np.zeros((8, 8), bool)
    expect[:4] = True  # 16 -> 8: the top half
    assert torch.equal(dog["object"], torch.from_numpy(expect))
    chunk = ds.collate([cat, dog])
    assert chunk["index"] == [0, 1] and chunk["x"].shape == (2, 3, 8, 8) and chunk["labels"] == [None, None]
    assert torch.equal(chunk["objects"], torch.stack([cat["object"], dog["object"]]))
    assert len(chunk["displays"]) == 2 and np.array_equal(chunk["displays"][1], dog["display"])
    assert ds.collate([ds.open_images(str(images), 8)[0]])["objects"] is None
    with pytest.raises(ValueError, match=r"^no object mask in '.*masks' for 'bird'$"):
        ds.object_mask(str(masks), "bird", 8)
    with pytest.raises(FileNotFoundError, match=r"^object masks: '.*nowhere' is not a folder$"):
        ds.open_images(str(images), 8, object_dir=str(tmp_path / "nowhere"))


@pytest.mark.mutation
def test_bundled_photos():
    src = ds.open_images("bundled", 16)
    assert src.image_names == list(PHOTOS) and src.image_labels == [None] * len(PHOTOS)
    assert src.description == {"source": "bundled"} and src[0]["x"].shape == (3, 16, 16)
    assert ds.open_images(None, 16).image_names == list(PHOTOS)


# ---------------------------------------------------------------------------------------------- CIFAR


def write_batches(folder, files: dict, meta_file: str, meta: dict):
    folder.mkdir(parents=True, exist_ok=True)
    for name, entry in files.items():
        with open(folder / name, "wb") as fh:
            pickle.dump(entry, fh, protocol=2)
    with open(folder / meta_file, "wb") as fh:
        pickle.dump(meta, fh, protocol=2)


@pytest.mark.mutation
def test_cifar10_train_split_joins_the_five_batches_in_order(tmp_path):
    data = [RNG.integers(0, 256, (2, 3072), dtype=np.uint8) for _ in range(5)]
    files = {f"data_batch_{i + 1}": {"data": d, "labels": [i, 9 - i]} for i, d in enumerate(data)}
    files["test_batch"] = {"data": data[0][:1], "labels": [7]}
    folder = tmp_path / "cifar-10-batches-py"
    write_batches(folder, files, "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    src = ds.open_images(dataset="cifar10", data_dir=str(tmp_path), split="train", size=16, mean=0.0, std=1.0)
    assert isinstance(src, ds.ArrayImages) and len(src) == 10 and src.size == 16
    assert src.image_labels == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5]
    assert src.image_names[:3] == ["train/00000", "train/00001", "train/00002"]
    assert src.classes == [f"c{i}" for i in range(10)]
    assert src.description == {"source": "cifar10", "path": os.path.abspath(folder), "split": "train"}
    photo = data[3][1].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(src.photo(7), photo)
    assert np.array_equal(src[7]["display"], np.asarray(Image.fromarray(photo).resize((16, 16), Image.BICUBIC)))
    # the batches folder itself as data_dir; the test split by default, at 32 pixels
    test = ds.open_images(dataset="cifar10", data_dir=str(folder))
    assert test.image_labels == [7] and test.size == 32 and test.image_names == ["test/00000"]
    assert test.description["split"] == "test"


@pytest.mark.mutation
def test_cifar100_fine_labels(tmp_path):
    data = RNG.integers(0, 256, (3, 3072), dtype=np.uint8)
    entry = {"data": data, "fine_labels": [11, 0, 99], "coarse_labels": [1, 2, 3]}
    write_batches(tmp_path / "cifar-100-python", {"test": entry, "train": entry}, "meta",
                  {"fine_label_names": [f"f{i}" for i in range(100)], "coarse_label_names": ["x"] * 20})
    src = ds.open_images(dataset="cifar100", data_dir=str(tmp_path))
    assert src.image_labels == [11, 0, 99] and src.classes[99] == "f99" and len(src.classes) == 100
    assert np.array_equal(src.photo(2), data[2].reshape(3, 32, 32).transpose(1, 2, 0))


@pytest.mark.mutation
def test_dataset_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^unknown dataset 'mnist'; have \['cifar10', 'cifar100'\]$"):
        ds.open_images(dataset="mnist", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^cifar10 has the splits \['test', 'train'\] \(and 'all': all of them\), "
                                         r"not 'val'$"):
        ds.open_images(dataset="cifar10", data_dir=str(tmp_path), split="val")
    with pytest.raises(ValueError, match=r"^--dataset cifar10 needs --data-dir$"):
        ds.open_images(dataset="cifar10")
    folder = tmp_path / "cifar-10-batches-py"
    write_batches(folder, {"test_batch": {"data": np.zeros((1, 3072), np.uint8), "labels": [0]}}, "batches.meta",
                  {"label_names": ["a"]})
    with pytest.raises(ValueError, match=r"^--labels applies to a flat folder; a dataset brings its labels$"):
        ds.open_images(dataset="cifar10", data_dir=str(tmp_path), labels_file="x.json")
    os.remove(folder / "batches.meta")
    with pytest.raises(FileNotFoundError, match=r"^cifar10: '.*batches\.meta' not found; --data-dir must hold "
                                                r"cifar-10-batches-py/ as torchvision\.datasets\.CIFAR10"):
        ds.open_images(dataset="cifar10", data_dir=str(tmp_path))
    (folder / "batches.meta").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"^cannot read '.*batches\.meta' as a CIFAR python batch: "):
        ds.open_images(dataset="cifar10", data_dir=str(tmp_path))


@pytest.mark.mutation
def test_direct_calls_default_to_rgb_and_the_test_split(tmp_path):
    save(tmp_path / "a.png", rgb(8, 8))
    assert ds.open_folder(str(tmp_path), 8)[0]["x"].shape == (3, 8, 8)
    assert ds.open_bundled(8)[0]["x"].shape == (3, 8, 8)
    data = RNG.integers(0, 256, (2, 3072), dtype=np.uint8)
    write_batches(tmp_path / "cifar-10-batches-py", {"test_batch": {"data": data, "labels": [1, 2]}},
                  "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    src = ds.open_dataset("cifar10", str(tmp_path))
    assert src.image_labels == [1, 2] and src[0]["x"].shape == (3, 32, 32)


@pytest.mark.mutation
def test_grey_reaches_every_source(tmp_path):
    data = RNG.integers(0, 256, (1, 3072), dtype=np.uint8)
    write_batches(tmp_path / "cifar-10-batches-py", {"test_batch": {"data": data, "labels": [1]}},
                  "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    photo = data[0].reshape(3, 32, 32).transpose(1, 2, 0)
    for src in (ds.open_images(dataset="cifar10", data_dir=str(tmp_path), grey=True),
                ds.open_dataset("cifar10", str(tmp_path), grey=True)):
        item = src[0]
        assert item["x"].shape == (1, 32, 32) and src.grey
        assert np.array_equal(item["display"], np.asarray(Image.fromarray(photo).convert("L")))
    for src in (ds.open_images("bundled", 8, grey=True), ds.open_bundled(8, grey=True)):
        assert src.grey and src[0]["x"].shape == (1, 8, 8) and src[0]["display"].shape == (8, 8)


@pytest.mark.mutation
def test_python2_batches_decode_as_latin1(tmp_path):
    """The CIFAR batches were pickled by Python 2: their str are bytes, which decode as Latin-1 (torchvision's
    encoding). A meta file written here by hand with Python 2 opcodes (SHORT_BINSTRING) and a non-ASCII name."""
    data = RNG.integers(0, 256, (1, 3072), dtype=np.uint8)
    folder = tmp_path / "cifar-10-batches-py"
    write_batches(folder, {"test_batch": {"data": data, "labels": [0]}}, "batches.meta", {})

    def binstring(b: bytes) -> bytes:
        return b"U" + bytes([len(b)]) + b

    meta = (b"\x80\x02}" + binstring(b"label_names") + b"](" + binstring(b"caf\xe9") + binstring(b"dog")
            + b"es.")
    (folder / "batches.meta").write_bytes(meta)
    assert ds.open_images(dataset="cifar10", data_dir=str(tmp_path)).classes == ["caf\u00e9", "dog"]


@pytest.mark.mutation
def test_labels_refused_for_an_image_folder(tmp_path):
    (tmp_path / "c").mkdir()
    save(tmp_path / "c" / "a.png", rgb(8, 8))
    with pytest.raises(ValueError, match=r"^--labels applies to a flat folder; an ImageFolder's labels are its "
                                         r"class folders$"):
        ds.open_images(str(tmp_path), 8, labels_file="labels.json")


# ---------------------------------------------------------------------------------------------- any dataset


def test_torch_dataset_of_float_and_uint8_tensors():
    """ToTensor-style floats in [0, 1] become round(255 x) pixels; uint8 tensors [C, H, W] are the pixels; the size
    is the first image's side (square); names are the zero-padded positions; labels from the pairs."""
    floats = torch.rand(11, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 0, 2, 1, 0, 2, 1, 0, 2, 1, -1])  # -1: unlabelled
    src = ds.from_dataset(torch.utils.data.TensorDataset(floats, labels), mean=0.25, std=0.5)
    want = np.rint(floats[3].permute(1, 2, 0).numpy().astype(np.float64) * 255).astype(np.uint8)
    item = src[3]
    assert np.array_equal(item["display"], want) and item["label"] == 1 and src.size == 6
    torch.testing.assert_close(item["x"], normalized(want, [0.25], [0.5]), rtol=0, atol=0)
    assert src.image_names[:3] == ["00", "01", "02"] and src.image_labels[-2:] == [1, None]
    assert src.classes is None and src.description == {"source": "dataset", "n": 11,
                                                         "type": "torch.utils.data.dataset.TensorDataset"}
    assert repr(src) == ("DatasetImages(dataset 'torch.utils.data.dataset.TensorDataset': 11 images, 10 labelled; "
                         "Preprocessing(overinterp_fast: resize 6, crop 6, bicubic, mean 0.25, std 0.5))")
    part = src.subset([10, 3])
    assert np.array_equal(part[1]["display"], want) and "2 images of 11" in repr(part)
    pixels = torch.from_numpy(rgb(6, 6)).permute(2, 0, 1).contiguous()
    src = ds.from_dataset([(pixels, 4)], 6)  # any sequence with len and indexing will do
    assert np.array_equal(src[0]["display"], pixels.permute(1, 2, 0).numpy()) and src.image_labels == [4]


class Folderish(torch.utils.data.Dataset):
    """A torchvision-style dataset: (PIL image, class) pairs, ``targets`` and ``classes``; counts item reads."""

    classes = ["cat", "dog"]

    def __init__(self, photos, targets):
        self.photos, self.targets, self.reads = photos, targets, 0

    def __len__(self):
        return len(self.photos)

    def __getitem__(self, i):
        self.reads += 1
        return Image.fromarray(self.photos[i]), self.targets[i]


def test_torchvision_style_dataset_labels_from_targets_and_a_crop():
    """10 x 12 photos at size 8: shorter side 10 -> 8, long side round(12 * 0.8) = 10 (bicubic), columns 1..9."""
    photos = [rgb(10, 12) for _ in range(3)]
    data = Folderish(photos, [1, 0, 1])
    src = ds.from_dataset(data, 8)
    assert data.reads == 1  # only the first item, for its keys; the labels came from targets
    assert src.image_labels == [1, 0, 1] and src.classes == ["cat", "dog"]
    want = np.asarray(Image.fromarray(photos[2]).resize((10, 8), Image.BICUBIC))[:, 1:9]
    assert np.array_equal(src[2]["display"], want)
    grey = ds.from_dataset(data, 8, grey=True)[2]["display"]  # converted to L before the crop, as files are
    want = np.asarray(Image.fromarray(photos[2]).convert("L").resize((10, 8), Image.BICUBIC))[:, 1:9]
    assert np.array_equal(grey, want)
    mono = ds.from_dataset([(np.full((4, 4), 9, np.uint8), 0)])  # one channel, an RGB model: repeated, as PIL does
    assert np.array_equal(mono[0]["display"], np.full((4, 4, 3), 9, np.uint8))
    assert ds.from_dataset([(np.full((4, 4, 1), 9, np.uint8), 0)], grey=True)[0]["display"].shape == (4, 4)
    with pytest.raises(ValueError, match=r"^the dataset's first image is 10 x 12: give size$"):
        ds.from_dataset(data)


def test_torchvision_image_folder_names_its_images_as_the_command_line_does(tmp_path):
    from torchvision.datasets import ImageFolder

    root = tmp_path / "tree"
    for cls, files in (("cat", ("1.png", "2.png")), ("dog", ("1.jpeg",))):
        (root / cls).mkdir(parents=True)
        for f in files:
            save(root / cls / f, rgb(8, 8))
    src = ds.from_dataset(ImageFolder(str(root)), 8)
    assert src.image_names == ["cat/1", "cat/2", "dog/1"] == ds.open_images(str(root), 8).image_names
    assert src.image_labels == [0, 0, 1]
    assert ds.from_dataset(ImageFolder(str(root)), 8, names=["a", "b", "c"]).image_names == ["a", "b", "c"]


def test_hugging_face_dataset_dicts_class_label_and_unlabelled():
    datasets = pytest.importorskip("datasets")
    photos = [rgb(8, 8) for _ in range(3)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    hf = datasets.Dataset.from_dict({"image": [Image.fromarray(p) for p in photos], "label": [2, -1, 0]},
                                    features=features)
    src = ds.from_dataset(hf, 8)
    assert src.image_labels == [2, None, 0] and src.classes == ["a", "b", "c"] and src.image_names == ["0", "1", "2"]
    assert np.array_equal(src[1]["display"], photos[1])
    assert src.description["fingerprint"] == hf._fingerprint and src.description["type"].startswith("datasets.")
    other = datasets.Dataset.from_dict({"img": [Image.fromarray(p) for p in photos], "fine": [5, 6, 7]})
    src = ds.from_dataset(other, 8, label_key="fine", names=["x", "y", "z"])
    assert src.image_labels == [5, 6, 7] and src.classes is None and src.image_names == ["x", "y", "z"]
    assert np.array_equal(src[2]["display"], photos[2])  # "img" found as the image column
    assert ds.from_dataset(other, 8).image_labels == [None] * 3  # no label column named: unlabelled
    with pytest.raises(ValueError, match=r"^a DatasetDict holds several splits \(train, test\); give one, e\.g\. "
                                         r"dataset\['train'\]$"):
        ds.from_dataset(datasets.DatasetDict({"train": hf, "test": hf}), 8)
    with pytest.raises(ValueError, match=r"^the dataset's items have no 'picture' key; they have "
                                         r"\['image', 'label'\]$"):
        ds.from_dataset(hf, 8, image_key="picture")
    no_image = datasets.Dataset.from_dict({"pixels": [1], "label": [0]})
    with pytest.raises(ValueError, match=r"^no image among the dataset's keys \['label', 'pixels'\]; name it with "
                                         r"image_key=$"):
        ds.from_dataset(no_image, 8)


def test_dataset_items_the_audit_cannot_use():
    normalized_floats = torch.utils.data.TensorDataset(torch.full((2, 3, 4, 4), -0.5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"^dataset item 0: its image holds values outside \[0, 1\] \(a Normalize "
                                         r"transform\?\); give the dataset without normalization"):
        ds.from_dataset(normalized_floats)
    with pytest.raises(ValueError, match=r"^dataset item 0: int64 pixels; expected uint8, or floats in \[0, 1\]$"):
        ds.from_dataset([(np.zeros((4, 4, 3), np.int64), 0)])
    with pytest.raises(ValueError, match=r"^dataset item 0: an image of shape \[4, 4, 2\]"):
        ds.from_dataset([(np.zeros((4, 4, 2), np.uint8), 0)])
    with pytest.raises(ValueError, match=r"^dataset item 0: its image is a str, not a PIL image"):
        ds.from_dataset([("photo.png", 0)], 4)
    with pytest.raises(ValueError, match=r"^dataset item 1: its label 0\.5 is not a class index$"):
        ds.from_dataset([(np.zeros((4, 4, 3), np.uint8), 0), (np.zeros((4, 4, 3), np.uint8), 0.5)])
    with pytest.raises(ValueError, match=r"^the dataset is empty$"):
        ds.from_dataset([], 4)
    with pytest.raises(ValueError, match=r"^2 names for 1 items$"):
        ds.from_dataset([(np.zeros((4, 4, 3), np.uint8), 0)], names=["a", "b"])
    with pytest.raises(ValueError, match=r"^image_key and label_key name the keys of dict items; item 0 is a tuple$"):
        ds.from_dataset([(np.zeros((4, 4, 3), np.uint8), 0)], image_key="image")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield np.zeros((4, 4, 3), np.uint8), 0

    with pytest.raises(TypeError, match=r"^a Stream is not a map-style dataset \(len and indexing\)"):
        ds.from_dataset(Stream(), 4)


def test_source_reprs_say_what_and_how_many(tmp_path):
    for i in range(3):
        save(tmp_path / f"{i}.png", rgb(5, 5))
    src = ds.open_images(str(tmp_path), 4)
    assert repr(src) == (f"FileImages(folder {str(tmp_path)!r}: 3 images, 0 labelled; Preprocessing(overinterp_fast: "
                         f"resize 4, crop 4, bicubic, mean 0.5, std 0.5))")
    assert repr(ds.open_images("bundled", 8, grey=True).subset([0])).startswith(
        "ArrayImages(bundled: 1 images of 7, 0 labelled, grey; ")
