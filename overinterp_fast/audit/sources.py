"""Image sources for audits: folders (flat or ImageFolder), the bundled photos, CIFAR-10/100 batches.

Every source is a ``torch.utils.data.Dataset`` whose item ``i`` is one image ready for a model::

    src = open_images("photos/", size=224)                       # flat folder, or class subfolders
    src = open_images(dataset="cifar10", data_dir="data", split="test", size=32)
    src = src.subset(select_range(len(src), "100:200", limit=50))
    item = src[0]   # {"index", "x": float32 [C, S, S], "display": uint8 [S, S(, 3)], "label", "object"}

Decoding, resizing (shorter side, PIL bicubic, then a centre crop) and normalizing
(``(x / 255 - mean) / std``) happen in ``__getitem__``, so a ``DataLoader`` with worker
processes does them in parallel and only a chunk of images is in memory at a time.

- A folder whose subfolders hold the images is read as torchvision's ImageFolder: the classes
  are the subfolder names in sorted order (class i = the i-th name; hidden folders, whose names start
  with ".", such as .ipynb_checkpoints, are not classes), the images sorted within each class;
  an image's name is its path inside the folder without the extension ("cat/0001"). A flat
  folder is read as before: files sorted by name, labels from ``labels_file`` ({name: class}).
- ``dataset="cifar10"`` (or ``"cifar100"``) reads the python batches that
  ``torchvision.datasets.CIFAR10(root, download=True)`` stores under ``root/cifar-10-batches-py``
  (``data_batch_1..5`` = train, ``test_batch`` = test; ``batches.meta`` names the classes).
  ``data_dir`` is that root or the batches folder itself. The files are read directly, with
  the same pickle format torchvision uses, because torchvision also checks their MD5 sums,
  which files written for a test (or a shard of the data) do not have.
"""
from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..zoo.imagenet import MEAN, STD, center_crop, normalize

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
DATASETS = {
    # name: (folder under the root, {split: batch files}, meta file, label key, class-names key)
    "cifar10": ("cifar-10-batches-py", {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
                "batches.meta", "labels", "label_names"),
    "cifar100": ("cifar-100-python", {"train": ["train"], "test": ["test"]}, "meta", "fine_labels",
                 "fine_label_names"),
}


def read_image(path: str, grey: bool = False) -> np.ndarray:
    """An image file as uint8 [H, W, 3] RGB (or [H, W] with ``grey``); one-line ValueError when unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("L" if grey else "RGB"))
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"cannot read image {path!r}: {exc}") from None


def to_grey(photo: np.ndarray) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(photo).convert("L"))


@dataclass
class ImageSource(torch.utils.data.Dataset):
    """Images for a model, one per item (see the module docstring).

    Attributes:
        names: one per image; labels: true class per image where known (None: unknown).
        classes: class names by index where the source has them (ImageFolder, CIFAR), else None.
        size, mean, std, grey: the preprocessing. description: what the source is, for the record
            and for the configuration of a stored audit.
        object_dir: a folder of object masks named like the images (nonzero = object), or None.
        indices: the positions of this source's images in the full source (after a subset).
    """

    names: list[str]
    labels: list[int | None]
    size: int
    mean: object = MEAN
    std: object = STD
    grey: bool = False
    classes: list[str] | None = None
    description: dict = field(default_factory=dict)
    object_dir: str | None = None
    indices: np.ndarray | None = None

    def __post_init__(self):
        if self.indices is None:
            self.indices = np.arange(len(self.names))

    def __len__(self) -> int:
        return len(self.indices)

    def photo(self, i: int) -> np.ndarray:
        """uint8 [H, W, 3] (or [H, W]) photo number ``i`` of the full source."""
        raise NotImplementedError

    def subset(self, positions: Sequence[int]) -> "ImageSource":
        """The images at ``positions`` (of this source), in that order."""
        positions = np.asarray(positions, dtype=np.int64)
        out = _copy(self)
        out.indices = self.indices[positions]
        return out

    @property
    def image_names(self) -> list[str]:
        return [self.names[i] for i in self.indices]

    @property
    def image_labels(self) -> list[int | None]:
        return [self.labels[i] for i in self.indices]

    def display(self, i: int) -> np.ndarray:
        photo = self.photo(int(self.indices[i]))
        if self.grey and photo.ndim == 3:
            photo = to_grey(photo)
        if photo.shape[:2] == (self.size, self.size):
            return np.array(photo)
        return center_crop(photo, self.size)

    def __getitem__(self, i: int) -> dict:
        display = self.display(i)
        obj = None
        if self.object_dir is not None:
            obj = torch.from_numpy(object_mask(self.object_dir, self.names[self.indices[i]], self.size))
        return {"index": int(i), "x": normalize(display, self.mean, self.std), "display": display,
                "label": self.labels[self.indices[i]], "object": obj}


def _copy(src: ImageSource) -> ImageSource:
    import copy

    return copy.copy(src)


@dataclass
class FileImages(ImageSource):
    """Images read from files (paths in the order of ``names``)."""

    paths: list[str] = field(default_factory=list)

    def photo(self, i: int) -> np.ndarray:
        return read_image(self.paths[i], self.grey)


@dataclass
class ArrayImages(ImageSource):
    """Images held as uint8 arrays (the bundled photos, CIFAR batches): ``arrays[i]`` is [H, W, 3]."""

    arrays: Sequence[np.ndarray] | np.ndarray = ()

    def photo(self, i: int) -> np.ndarray:
        return np.asarray(self.arrays[i])


def collate(items: list[dict]) -> dict:
    """A chunk from items: x [n, C, S, S], displays (list), labels (list), indices (list), objects [n, S, S] or None."""
    objects = [it["object"] for it in items]
    return {"index": [it["index"] for it in items], "x": torch.stack([it["x"] for it in items]),
            "displays": [it["display"] for it in items], "labels": [it["label"] for it in items],
            "objects": None if objects[0] is None else torch.stack(objects)}


def select_range(n: int, select: str | None = None, limit: int | None = None) -> range:
    """Positions 0..n-1 kept by ``select`` ("A:B", Python slice bounds, either may be empty) then ``limit`` (the first N)."""
    keep = range(n)
    if select is not None:
        parts = select.split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            a, b = (int(p) if p.strip() else None for p in parts)
        except ValueError:
            raise ValueError(f"--select must be A:B (e.g. 100:200, :500, 1000:), got {select!r}") from None
        keep = keep[slice(a, b)]
    if limit is not None:
        keep = keep[:limit]
    if len(keep) == 0:
        raise ValueError(f"no images selected (of {n}; select {select!r}, limit {limit})")
    return keep


def _image_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(IMAGE_EXTENSIONS)
                  and os.path.isfile(os.path.join(folder, f)))


def _class_folders(folder: str) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def open_folder(folder: str, size: int, mean=MEAN, std=STD, grey: bool = False,
                labels_file: str | None = None) -> FileImages:
    """A flat folder of images, or an ImageFolder (class subfolders) when it has subfolders and no images itself."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"images: {folder!r} is not a folder (or 'bundled')")
    flat = _image_files(folder)
    classes = None if flat else _class_folders(folder)
    if classes:
        from torchvision.datasets.folder import make_dataset  # ImageFolder's layout, with our extensions

        try:
            samples = make_dataset(folder, {c: i for i, c in enumerate(classes)}, extensions=IMAGE_EXTENSIONS)
        except FileNotFoundError as exc:  # a class folder without images
            raise ValueError(f"{folder!r}: {str(exc).splitlines()[0]}") from None
        paths = [p for p, _ in samples]
        labels: list[int | None] = [int(c) for _, c in samples]
        names = [os.path.splitext(os.path.relpath(p, folder))[0].replace(os.sep, "/") for p in paths]
        if labels_file is not None:
            raise ValueError("--labels applies to a flat folder; an ImageFolder's labels are its class folders")
        kind = "ImageFolder"
    else:
        if not flat:
            raise ValueError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {folder!r}")
        paths = [os.path.join(folder, f) for f in flat]
        names = [os.path.splitext(f)[0] for f in flat]
        labels = read_labels(labels_file, names)
        kind = "folder"
    desc = {"source": kind, "path": os.path.abspath(folder), "labels_file": labels_file}
    return FileImages(names, labels, size, mean, std, grey, classes, desc, paths=paths)


def open_bundled(size: int, mean=MEAN, std=STD, grey: bool = False) -> ArrayImages:
    from ..zoo.imagenet import PHOTOS

    names = list(PHOTOS)
    return ArrayImages(names, [None] * len(names), size, mean, std, grey, description={"source": "bundled"},
                       arrays=[PHOTOS[n]() for n in names])


def open_dataset(name: str, data_dir: str, split: str = "test", size: int | None = None, mean=MEAN, std=STD,
                 grey: bool = False) -> ArrayImages:
    """CIFAR-10 or CIFAR-100 python batches under ``data_dir`` (see the module docstring)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; have {sorted(DATASETS)}")
    sub, splits, meta_file, label_key, names_key = DATASETS[name]
    if split not in splits:
        raise ValueError(f"{name} has the splits {sorted(splits)}, not {split!r}")
    root = data_dir if os.path.isfile(os.path.join(data_dir, meta_file)) else os.path.join(data_dir, sub)
    files = [os.path.join(root, f) for f in splits[split]]
    missing = [f for f in files + [os.path.join(root, meta_file)] if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{name}: {missing[0]!r} not found; --data-dir must hold {sub}/ as "
                                f"torchvision.datasets.{name.upper()}(root, download=True) "
                                f"writes it")
    data, labels = [], []
    for f in files:
        entry = _unpickle(f)
        data.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels += [int(v) for v in entry[label_key]]
    arrays = np.concatenate(data).transpose(0, 2, 3, 1)  # [N, 32, 32, 3], as torchvision's .data
    classes = [str(c) for c in _unpickle(os.path.join(root, meta_file))[names_key]]
    names = [f"{split}/{i:05d}" for i in range(len(labels))]
    desc = {"source": name, "path": os.path.abspath(root), "split": split}
    return ArrayImages(names, labels, size or 32, mean, std, grey, classes, desc, arrays=arrays)


def _unpickle(path: str) -> dict:
    with open(path, "rb") as fh:
        try:
            return pickle.load(fh, encoding="latin1")
        except Exception as exc:  # noqa: BLE001  (any unpickling failure: not a CIFAR batch)
            raise ValueError(f"cannot read {path!r} as a CIFAR python batch: {exc}") from None


def open_images(source: str | None = None, size: int | None = None, mean=MEAN, std=STD, grey: bool = False,
                labels_file: str | None = None, *, dataset: str | None = None, data_dir: str | None = None,
                split: str = "test", object_dir: str | None = None) -> ImageSource:
    """The image source the command line names: ``source`` (a folder or "bundled") or ``dataset`` in ``data_dir``."""
    if dataset is not None:
        if data_dir is None:
            raise ValueError(f"--dataset {dataset} needs --data-dir")
        src = open_dataset(dataset, data_dir, split, size, mean, std, grey)
        if labels_file is not None:
            raise ValueError("--labels applies to a flat folder; a dataset brings its labels")
    else:
        if size is None:
            raise ValueError("the input size is not known: give --size")
        src = open_bundled(size, mean, std, grey) if source in (None, "bundled") else \
            open_folder(source, size, mean, std, grey, labels_file)
    if object_dir is not None:
        if not os.path.isdir(object_dir):
            raise FileNotFoundError(f"object masks: {object_dir!r} is not a folder")
        src.object_dir = object_dir
    return src


def read_labels(path: str | None, names: list[str]) -> list[int | None]:
    """Labels from a JSON file {image name (with or without its image extension): class index}; None where absent.

    A key as written names an image before the same key without its extension: {"a.jpg": 1} labels the image
    named "a.jpg" (the file a.jpg.png) if there is one, else the image "a" (the file a.jpg).
    """
    if path is None:
        return [None] * len(names)
    with open(path) as fh:
        table = json.load(fh)
    if not isinstance(table, dict):
        raise ValueError(f"labels file {path!r} must hold a JSON object {{image name: class index}}")
    # a key names an image with or without its image extension; a key as written wins ("a.jpg" names the file
    # a.jpg.png before a.jpg), and a name may hold dots of its own ("img.001" is the file img.001.png)
    stripped = {os.path.splitext(k)[0]: v for k, v in table.items()
                if os.path.splitext(k)[1].lower() in IMAGE_EXTENSIONS}
    table = {**stripped, **table}
    out = []
    for n in names:
        v = table.get(n)
        if v is not None and not (isinstance(v, int) and v >= 0):
            raise ValueError(f"labels file {path!r}: label of {n!r} must be a class index >= 0, got {v!r}")
        out.append(v)
    return out


def object_mask(folder: str, name: str, size: int) -> np.ndarray:
    """bool [size, size]: ``folder/<name>.<ext>`` (nonzero = object), cropped as the images are."""
    base = os.path.join(folder, name)
    path = next((base + e for e in IMAGE_EXTENSIONS + tuple(e.upper() for e in IMAGE_EXTENSIONS)
                 if os.path.isfile(base + e)), None)
    if path is None:
        raise ValueError(f"no object mask in {folder!r} for {name!r}")
    m = read_image(path, grey=True)
    return center_crop(np.where(m > 0, 255, 0).astype(np.uint8), size) > 127
