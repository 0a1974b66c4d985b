"""Image sources for audits: folders (flat or ImageFolder), the bundled photos, CIFAR-10/100 batches, and any
map-style dataset (a ``torch.utils.data.Dataset``, a torchvision dataset, a Hugging Face ``datasets.Dataset``).

Every source is a ``torch.utils.data.Dataset`` whose item ``i`` is one image ready for a model::

    src = open_images("photos/", size=224)                       # flat folder, or class subfolders
    src = open_images(dataset="cifar10", data_dir="data", split="test", size=32)
    src = from_dataset(torchvision.datasets.CIFAR10("data", train=False), 32)   # or a datasets.Dataset
    src = open_images("photos/", loaded.preprocessing)          # the model's own preprocessing (timm, ...)
    src = src.subset(select_range(len(src), "100:200", limit=50))
    item = src[0]   # {"index", "x": float32 [C, S, S], "display": uint8 [S, S(, 3)], "label", "object"}

Decoding, resizing, cropping and normalizing happen in ``__getitem__``, so a ``DataLoader`` with worker
processes does them in parallel and only a chunk of images is in memory at a time. The source's
:class:`~overinterp_fast.zoo.preprocessing.Preprocessing` says how: the plain transform by default (shorter side
to ``size``, PIL bicubic, then a centre crop, then ``(x / 255 - mean) / std``), or a model's own (timm's data
config, torchvision's weights' transforms, a transformers image processor). The same item always gives the
same pixels, so a stored audit resumes exactly.

- A folder whose subfolders hold the images is read as torchvision's ImageFolder: the classes
  are the subfolder names in sorted order (class i = the i-th name; hidden folders, whose names start
  with ".", such as .ipynb_checkpoints, are not classes), the images sorted within each class;
  an image's name is its path inside the folder without the extension ("cat/0001"). A flat
  folder is read as before: files sorted by name, labels from ``labels_file`` ({name: class}).
- ``dataset="cifar10"`` (or ``"cifar100"``) reads the python batches that
  ``torchvision.datasets.CIFAR10(root, download=True)`` stores under ``root/cifar-10-batches-py``
  (``data_batch_1..5`` = train, ``test_batch`` = test; ``batches.meta`` names the classes); ``split="all"`` is
  the train images followed by the test images (CIFAR-10's 60,000), named ``train/00000`` ... ``test/09999``.
  ``data_dir`` is that root or the batches folder itself. The files are read directly, with
  the same pickle format torchvision uses, because torchvision also checks their MD5 sums,
  which files written for a test (or a shard of the data) do not have.
- :func:`from_dataset` takes any map-style dataset whose items are ``(image, label)`` pairs, dicts
  (``{"image": ..., "label": ...}``, as Hugging Face datasets give them) or bare images; an image is a PIL
  image, a uint8 array or tensor, or a float tensor of pixels in [0, 1] (``ToTensor()``'s). The audit
  preprocesses it, so give the dataset without a ``Normalize`` transform.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from ..zoo.preprocessing import Preprocessing, as_preprocessing

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


@dataclass(repr=False)
class ImageSource(torch.utils.data.Dataset):
    """Images for a model, one per item (see the module docstring).

    Attributes:
        names: one per image; labels: true class per image where known (None: unknown).
        preprocessing: how a photo becomes the model's input (its size, crop, interpolation, mean and std); a
            number is the plain transform of that size.
        grey: load as one channel (L) instead of RGB.
        classes: class names by index where the source has them (ImageFolder, CIFAR, datasets), else None.
        description: what the source is, for the record and for the configuration of a stored audit.
        object_dir: a folder of object masks named like the images (nonzero = object), or None.
        indices: the positions of this source's images in the full source (after a subset).
    """

    names: list[str]
    labels: list[int | None]
    preprocessing: Preprocessing
    grey: bool = False
    classes: list[str] | None = None
    description: dict = field(default_factory=dict)
    object_dir: str | None = None
    indices: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.preprocessing, Preprocessing):
            self.preprocessing = as_preprocessing(self.preprocessing)  # a size: the plain transform
        if self.indices is None:
            self.indices = np.arange(len(self.names))

    @property
    def size(self) -> int:
        """Side S of the model inputs [C, S, S]."""
        return self.preprocessing.size

    @property
    def mean(self):
        return self.preprocessing.mean

    @property
    def std(self):
        return self.preprocessing.std

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        what = self.description.get("source", "images")
        where = self.description.get("path") or self.description.get("type")
        known = sum(lab is not None for lab in self.image_labels)
        classes = "" if self.classes is None else f", {len(self.classes)} classes"
        subset = "" if len(self) == len(self.names) else f" of {len(self.names)}"
        return (f"{type(self).__name__}({what}{'' if where is None else f' {where!r}'}: {len(self)} images{subset}"
                f"{classes}, {known} labelled{', grey' if self.grey else ''}; {self.preprocessing!r})")

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
        return self.preprocessing.crop(photo)

    def __getitem__(self, i: int) -> dict:
        display = self.display(i)
        obj = None
        if self.object_dir is not None:
            obj = torch.from_numpy(object_mask(self.object_dir, self.names[self.indices[i]], self.preprocessing))
        return {"index": int(i), "x": self.preprocessing.normalize(display), "display": display,
                "label": self.labels[self.indices[i]], "object": obj}


def _copy(src: ImageSource) -> ImageSource:
    import copy

    return copy.copy(src)


@dataclass(repr=False)
class FileImages(ImageSource):
    """Images read from files (paths in the order of ``names``)."""

    paths: list[str] = field(default_factory=list)

    def photo(self, i: int) -> np.ndarray:
        return read_image(self.paths[i], self.grey)


@dataclass(repr=False)
class ArrayImages(ImageSource):
    """Images held as uint8 arrays (the bundled photos, CIFAR batches): ``arrays[i]`` is [H, W, 3]."""

    arrays: Sequence[np.ndarray] | np.ndarray = ()

    def photo(self, i: int) -> np.ndarray:
        return np.asarray(self.arrays[i])


@dataclass(repr=False)
class DatasetImages(ImageSource):
    """Images of a map-style dataset (see :func:`from_dataset`): item ``i`` of ``dataset`` holds image ``i``."""

    dataset: Any = None
    image_key: str | None = None

    def photo(self, i: int) -> np.ndarray:
        image = _item_image(self.dataset[int(i)], self.image_key, int(i))
        return photo_array(image, int(i), rgb=not self.grey)


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


def open_folder(folder: str, size: int | Preprocessing, mean=None, std=None, grey: bool = False,
                labels_file: str | None = None) -> FileImages:
    """A flat folder of images, or an ImageFolder (class subfolders) when it has subfolders and no images itself.

    ``size``: the side of the plain transform (with ``mean`` and ``std``, default 0.5), or a
    :class:`~overinterp_fast.zoo.preprocessing.Preprocessing` (then without mean and std)."""
    prep = as_preprocessing(size, mean, std)
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
        names = file_names(paths, folder)
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
    return FileImages(names, labels, prep, grey, classes, desc, paths=paths)


def open_bundled(size: int | Preprocessing, mean=None, std=None, grey: bool = False) -> ArrayImages:
    """The photos bundled with scikit-image and scikit-learn (``size``, ``mean``, ``std`` as for
    :func:`open_folder`)."""
    from ..zoo.imagenet import PHOTOS

    names = list(PHOTOS)
    return ArrayImages(names, [None] * len(names), as_preprocessing(size, mean, std), grey,
                       description={"source": "bundled"}, arrays=[PHOTOS[n]() for n in names])


SPLIT_ALL = "all"  # a dataset's splits in the order of its DATASETS entry (train, then test)


def open_dataset(name: str, data_dir: str, split: str = "test", size: int | Preprocessing | None = None, mean=None,
                 std=None, grey: bool = False) -> ArrayImages:
    """CIFAR-10 or CIFAR-100 python batches under ``data_dir`` (see the module docstring; ``size`` None: 32);
    ``split`` "train", "test" or "all" (train then test)."""
    prep = as_preprocessing(32 if size is None else size, mean, std)
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; have {sorted(DATASETS)}")
    sub, splits, meta_file, label_key, names_key = DATASETS[name]
    if split not in splits and split != SPLIT_ALL:
        raise ValueError(f"{name} has the splits {sorted(splits)} (and {SPLIT_ALL!r}: all of them), not {split!r}")
    root = data_dir if os.path.isfile(os.path.join(data_dir, meta_file)) else os.path.join(data_dir, sub)
    parts = list(splits) if split == SPLIT_ALL else [split]
    files = [(part, os.path.join(root, f)) for part in parts for f in splits[part]]
    missing = [f for f in [f for _, f in files] + [os.path.join(root, meta_file)] if not os.path.isfile(f)]
    if missing:
        raise FileNotFoundError(f"{name}: {missing[0]!r} not found; --data-dir must hold {sub}/ as "
                                f"torchvision.datasets.{name.upper()}(root, download=True) "
                                f"writes it")
    meta_path = os.path.join(root, meta_file)
    classes = [_text(c) for c in _entry(_unpickle(meta_path), names_key, meta_path)]
    data, labels, names, seen = [], [], [], dict.fromkeys(parts, 0)
    for part, f in files:
        images, new = _batch(_unpickle(f), label_key, f, len(classes), meta_file)
        data.append(images)
        names += [f"{part}/{seen[part] + i:05d}" for i in range(len(new))]  # numbered across a split's files
        seen[part] += len(new)
        labels += new
    arrays = np.concatenate(data).transpose(0, 2, 3, 1)  # [N, 32, 32, 3], as torchvision's .data
    desc = {"source": name, "path": os.path.abspath(root), "split": split}
    return ArrayImages(names, labels, prep, grey, classes, desc, arrays=arrays)


CIFAR_PIXELS = 3 * 32 * 32  # one image of a CIFAR python batch: a row of 3,072 bytes, channel by channel


def _text(value) -> str:
    """A key or class name of a CIFAR pickle as str: bytes (a batch pickled with its str as bytes, as
    ``pickle.load(f, encoding="bytes")`` gives the originals) decode as Latin-1, torchvision's encoding."""
    return value.decode("latin1") if isinstance(value, bytes) else str(value)


def _unpickle(path: str) -> dict:
    """A CIFAR python batch or meta file: a dict, its keys as str (str or bytes in the file); one-line ValueError
    for anything else."""
    with open(path, "rb") as fh:
        try:
            entry = pickle.load(fh, encoding="latin1")
        except Exception as exc:  # noqa: BLE001  (any unpickling failure: not a CIFAR batch)
            raise ValueError(f"cannot read {path!r} as a CIFAR python batch: {exc}") from None
    if not isinstance(entry, dict):
        raise ValueError(f"cannot read {path!r} as a CIFAR python batch: it holds a {type(entry).__name__}, not a "
                         f"dict")
    return {_text(k) if isinstance(k, (str, bytes)) else k: v for k, v in entry.items()}


def _entry(entry: dict, key: str, path: str):
    """``entry[key]``, or a one-line ValueError naming the file and the keys it has."""
    if key not in entry:
        have = ", ".join(repr(k) for k in entry) or "none"
        raise ValueError(f"{path!r} has no {key!r} entry (its keys: {have}), so it is not a CIFAR python batch")
    return entry[key]


def _batch(entry: dict, label_key: str, path: str, classes: int, meta_file: str) -> tuple[np.ndarray, list[int]]:
    """The images (uint8 [n, 3, 32, 32]) and labels of one CIFAR batch file, checked before any is used: the data
    whole rows of 3,072 bytes, one label per image, each a class index in [0, ``classes``) (the classes the meta
    file names). Each fault is one ValueError naming the file."""
    data = np.asarray(_entry(entry, "data", path))
    if data.dtype.kind not in "ui" or data.size % CIFAR_PIXELS or (data.size and (data.min() < 0 or data.max() > 255)):
        raise ValueError(f"{path!r}: its 'data' must be uint8 rows of {CIFAR_PIXELS} values (3 x 32 x 32 pixels); "
                         f"it is {data.dtype} of shape {list(data.shape)}")
    images = data.astype(np.uint8).reshape(-1, 3, 32, 32)
    raw = _entry(entry, label_key, path)
    try:
        labels = np.asarray(raw)
        if labels.ndim != 1 or not (labels.dtype.kind in "ui" or labels.size == 0):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{path!r}: its {label_key!r} must be a list of class indices") from None
    if len(labels) != len(images):
        raise ValueError(f"{path!r} holds {len(images)} images and {len(labels)} labels ({label_key!r}): one "
                         f"label per image is needed")
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{path!r}: the label {int(labels[i])} of image {i} is not a class: {meta_file} names "
                         f"{classes} classes (0 to {classes - 1}); {bad.size} label{'s' * (bad.size > 1)} out of "
                         f"range")
    return images, [int(v) for v in labels]


def open_images(source: str | None = None, size: int | Preprocessing | None = None, mean=None, std=None,
                grey: bool = False, labels_file: str | None = None, *, dataset: str | None = None,
                data_dir: str | None = None, split: str = "test", object_dir: str | None = None) -> ImageSource:
    """The image source the command line names: ``source`` (a folder or "bundled") or ``dataset`` in ``data_dir``.

    ``size``: the side of the plain transform (with ``mean`` and ``std``, default 0.5), or a
    :class:`~overinterp_fast.zoo.preprocessing.Preprocessing` such as a loaded model's (then without mean and std).
    """
    if dataset is not None:
        if data_dir is None:
            raise ValueError(f"--dataset {dataset} needs --data-dir")
        src = open_dataset(dataset, data_dir, split, size, mean, std, grey)
        if labels_file is not None:
            raise ValueError("--labels applies to a flat folder; a dataset brings its labels")
    else:
        size = as_preprocessing(size, mean, std)
        mean = std = None
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


def object_mask(folder: str, name: str, size: int | Preprocessing) -> np.ndarray:
    """bool [S, S]: ``folder/<name>.<ext>`` (nonzero = object), cropped as the images are (``size``: the plain
    transform's side, or the source's preprocessing)."""
    base = os.path.join(folder, name)
    path = next((base + e for e in IMAGE_EXTENSIONS + tuple(e.upper() for e in IMAGE_EXTENSIONS)
                 if os.path.isfile(base + e)), None)
    if path is None:
        raise ValueError(f"no object mask in {folder!r} for {name!r}")
    m = read_image(path, grey=True)
    return as_preprocessing(size).crop(np.where(m > 0, 255, 0).astype(np.uint8)) > 127


# ---------------------------------------------------------------------------------------------- any dataset

IMAGE_KEYS = ("image", "img")
LABEL_KEYS = ("label", "labels")


def _is_hf_dataset(dataset) -> bool:
    return type(dataset).__module__.split(".")[0] == "datasets"


def _pick_key(keys: Sequence[str], given: str | None, candidates: tuple[str, ...], what: str,
              required: bool) -> str | None:
    """The dict key that holds the image (or label): ``given``, else the one of ``candidates`` present."""
    if given is not None:
        if given not in keys:
            raise ValueError(f"the dataset's items have no {given!r} key; they have {sorted(keys)}")
        return given
    found = [k for k in candidates if k in keys]
    if not found and required:
        raise ValueError(f"no {what} among the dataset's keys {sorted(keys)}; name it with {what}_key=")
    return found[0] if found else None


def _item_image(item, image_key: str | None, i: int):
    """The image of one dataset item: a dict's ``image_key`` entry, a pair's first element, or the item itself."""
    if isinstance(item, dict):
        return item[image_key]
    if isinstance(item, (tuple, list)):
        if not item:
            raise ValueError(f"dataset item {i} is empty")
        return item[0]
    return item


def _item_label(item, label_key: str | None, i: int) -> int | None:
    """The label of one dataset item (None where it has none, or a negative one: unlabelled)."""
    if isinstance(item, dict):
        value = None if label_key is None else item.get(label_key)
    elif isinstance(item, (tuple, list)):
        value = item[1] if len(item) > 1 else None
    else:
        value = None
    return _label(value, i)


def _label(value, i: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"dataset item {i}: its label is a tensor of shape {list(value.shape)}, not a class index")
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"dataset item {i}: its label {value!r} is not a class index")
    return None if value < 0 else int(value)


def photo_array(image, i: int = 0, rgb: bool = True) -> np.ndarray:
    """One dataset image as uint8 [H, W, 3] (``rgb``) or as it is, [H, W] for one channel.

    Takes a PIL image, a numpy array [H, W(, C)] or a torch tensor [C, H, W] / [H, W]: uint8 as it is, floats
    as pixels in [0, 1] (``ToTensor()``'s), scaled by 255 and rounded; anything else raises a one-line
    ValueError naming item ``i``."""
    from PIL import Image

    if isinstance(image, Image.Image):
        image = image if image.mode in ("RGB", "L") else image.convert("RGB")
        out = np.asarray(image)
    else:
        if isinstance(image, torch.Tensor):
            t = image.detach().cpu()
            if t.dim() == 3 and t.shape[0] in (1, 3):
                t = t.permute(1, 2, 0)
            out = t.numpy()
        elif isinstance(image, np.ndarray):
            out = image
        else:
            raise ValueError(f"dataset item {i}: its image is a {type(image).__name__}, not a PIL image, "
                             f"an array or a tensor")
        if out.ndim == 3 and out.shape[-1] == 1:
            out = out[..., 0]
        if not (out.ndim == 2 or (out.ndim == 3 and out.shape[-1] == 3)):
            raise ValueError(f"dataset item {i}: an image of shape {list(out.shape)}; expected [C, H, W] "
                             f"(tensors) or [H, W, C] (arrays) with C = 1 or 3")
        if out.dtype != np.uint8:
            if out.dtype.kind != "f":
                raise ValueError(f"dataset item {i}: {out.dtype} pixels; expected uint8, or floats in [0, 1]")
            if out.size and (not np.isfinite(out).all() or out.min() < 0 or out.max() > 1):
                raise ValueError(f"dataset item {i}: its image holds values outside [0, 1] (a Normalize "
                                 f"transform?); give the dataset without normalization: the audit normalizes "
                                 f"as the model's preprocessing says")
            out = np.rint(out.astype(np.float64) * 255).astype(np.uint8)
    if rgb and out.ndim == 2:
        out = np.repeat(out[..., None], 3, axis=-1)  # as PIL's convert("RGB") of a grey image
    return np.ascontiguousarray(out)


def _dataset_labels(dataset, label_key: str | None, first) -> list[int | None]:
    """Every item's label: a Hugging Face dataset's label column, a torchvision dataset's ``targets``, or (any
    other dataset) each item read once."""
    n = len(dataset)
    if _is_hf_dataset(dataset):
        if label_key is None:
            return [None] * n
        return [_label(v, i) for i, v in enumerate(dataset[label_key])]
    targets = getattr(dataset, "targets", None)
    if targets is not None and len(targets) == n and not isinstance(first, dict):
        return [_label(v, i) for i, v in enumerate(targets)]
    return [_item_label(first if i == 0 else dataset[i], label_key, i) for i in range(n)]


def _dataset_classes(dataset, label_key: str | None) -> list[str] | None:
    """Class names: a Hugging Face ClassLabel's names, or a torchvision dataset's ``classes``."""
    if _is_hf_dataset(dataset):
        feature = getattr(dataset, "features", {}).get(label_key) if label_key is not None else None
        names = getattr(feature, "names", None)
        return [str(c) for c in names] if names else None
    classes = getattr(dataset, "classes", None)
    if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
        return list(classes)
    return None


def file_names(paths: Sequence[str], root: str) -> list[str]:
    """The names of image files under ``root``: each path relative to it, without the extension, with "/" between
    folders (an ImageFolder's ``cat/1``)."""
    return [os.path.splitext(os.path.relpath(p, root))[0].replace(os.sep, "/") for p in paths]


def _dataset_names(dataset, n: int) -> list[str]:
    """Default names of a dataset's items: its files' names (:func:`file_names`) where it lists them under a root
    (torchvision's ImageFolder and DatasetFolder: ``samples`` and ``root``), else the positions, zero-padded."""
    samples, root = getattr(dataset, "samples", None), getattr(dataset, "root", None)
    if isinstance(root, (str, os.PathLike)) and isinstance(samples, Sequence) and len(samples) == n and all(
            isinstance(s, (tuple, list)) and s and isinstance(s[0], (str, os.PathLike)) for s in samples):
        return file_names([os.fspath(s[0]) for s in samples], os.fspath(root))
    return [f"{i:0{len(str(n - 1))}d}" for i in range(n)]


def from_dataset(dataset, size: int | Preprocessing | None = None, mean=None, std=None, grey: bool = False, *,
                 image_key: str | None = None, label_key: str | None = None,
                 names: Sequence[str] | None = None) -> DatasetImages:
    """Any map-style dataset as an audit source: a ``torch.utils.data.Dataset``, a torchvision dataset or a
    Hugging Face ``datasets.Dataset`` (one split).

    Args:
        dataset: ``len(dataset)`` items, ``dataset[i]`` an ``(image, label)`` pair, a dict (``image_key`` and
            ``label_key``; default "image" or "img", and "label" or "labels") or a bare image. An image is a PIL
            image, a uint8 array [H, W(, C)] or tensor [C, H, W], or floats in [0, 1] (``ToTensor()``'s); labels
            are class indices (negative or missing: unknown). Leave normalization out of the dataset's transform.
        size: the side of the plain transform (with ``mean`` and ``std``, default 0.5), or a
            :class:`~overinterp_fast.zoo.preprocessing.Preprocessing` such as a loaded model's; None: the first
            image's side when it is square (CIFAR-sized data as it is).
        names: one per item (default: for a torchvision ImageFolder or DatasetFolder, each file's path under its
            root without the extension, ``cat/1``, as the command line names a folder's images; else the
            positions, zero-padded).

    Labels are read up front: a Hugging Face dataset's label column, a torchvision dataset's ``targets``, else
    every item once. Class names come from a ClassLabel feature or a ``classes`` attribute.
    """
    if _is_hf_dataset(dataset) and not hasattr(dataset, "features") and hasattr(dataset, "keys"):
        raise ValueError(f"a DatasetDict holds several splits ({', '.join(dataset.keys())}); give one, e.g. "
                         f"dataset[{next(iter(dataset.keys()))!r}]")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise TypeError(f"a {type(dataset).__name__} is not a map-style dataset (len and indexing); an iterable "
                        f"dataset cannot be split into resumable chunks")
    n = len(dataset)
    if n == 0:
        raise ValueError("the dataset is empty")
    first = dataset[0]
    keys = list(first) if isinstance(first, dict) else []
    if isinstance(first, dict):
        image_key = _pick_key(keys, image_key, IMAGE_KEYS, "image", True)
        label_key = _pick_key(keys, label_key, LABEL_KEYS, "label", False)
    elif image_key is not None or label_key is not None:
        raise ValueError(f"image_key and label_key name the keys of dict items; item 0 is a {type(first).__name__}")
    shape = photo_array(_item_image(first, image_key, 0), 0).shape  # the first image, checked now, not mid-audit
    if size is None:
        if shape[0] != shape[1]:
            raise ValueError(f"the dataset's first image is {shape[0]} x {shape[1]}: give size")
        size = shape[0]
    prep = as_preprocessing(size, mean, std)
    names = _dataset_names(dataset, n) if names is None else [str(v) for v in names]
    if len(names) != n:
        raise ValueError(f"{len(names)} names for {n} items")
    desc = {"source": "dataset", "type": f"{type(dataset).__module__}.{type(dataset).__qualname__}", "n": n}
    root = getattr(dataset, "root", None)
    if isinstance(root, (str, os.PathLike)):
        desc["path"] = os.path.abspath(root)
    fingerprint = getattr(dataset, "_fingerprint", None)  # a Hugging Face dataset's content hash
    if isinstance(fingerprint, str):
        desc["fingerprint"] = fingerprint
    return DatasetImages(names, _dataset_labels(dataset, label_key, first), prep, grey,
                         _dataset_classes(dataset, label_key), desc, dataset=dataset, image_key=image_key)
