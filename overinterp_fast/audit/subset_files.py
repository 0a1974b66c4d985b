"""The pixel-subset datasets of a stored audit, as files (paper 000, Table 1; docs: reproducing.md).

A stored audit of a backward-selection method (exact or gradient SIS) with ``StoreOptions.pixel_subsets`` writes, when it
completes, one file per model and split::

    subsets/<model>/<split>.npz

Each holds the split's images in audit order: ``names`` (str [N]), ``labels`` (int64 [N], -1 where unknown),
``targets`` (int64 [N], the class the model's f scored), ``photos`` (uint8 [N, H, W, C] or [N, H, W]: the images as
cropped, before normalization), ``order`` (int16 or int32 [N, p]: the backward-selection order of every pixel, the
first round), ``backselect`` (bool [N, H, W]: the last ceil(fraction p) pixels of the order, 52 of 1,024 for
CIFAR-10 at 5%), ``random`` (bool [N, H, W]: as many pixels uniformly at random, drawn per image from the audit's
seed and the image's position, so the same whatever the chunks, ranks or resumes), and the scalars ``mean``,
``std`` (the normalization, per channel), ``mask_value`` (float64 [1] or [C]: what a masked pixel becomes in the
model's input space, 0 unless the audit's baselines say otherwise), ``fraction``, ``seed``, ``model`` and ``split``;
and what the audited model says on each subset (:mod:`overinterp_fast.audit.own_subsets`): ``backselect_class``,
``random_class`` (int64 [N], its class there) and ``backselect_score``, ``random_score`` (float64 [N], its
probability there of ``targets``), absent from files of audits that did not keep them.

A dataset's split is the part of an image's name before its first "/" (``train/00012``) where the source is a
dataset's split ``all``; the split's own name for one split; ``images`` for other sources.
:func:`load_pixel_subsets` reads a file back and builds the model inputs of either subset.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..methods.results import SISResult
from ..util.files import atomic_write
from ..zoo.imagenet import normalize
from .store import OWN_SUBSET_COLUMNS, ChunkImages
from .subsets import _apply, keep_last

SUBSETS_DIR = "subsets"
WHICH = ("backselect", "random", "full")  # the inputs a file builds: either subset, or the whole images


def split_of(name: str, source_split: str | None) -> str:
    """The split an image belongs to: the prefix of its name for a dataset's split "all", else that split's name,
    else "images" (see the module docstring)."""
    if source_split == "all":
        return name.split("/", 1)[0]
    return source_split or "images"


def random_keep(p: int, k: int, seed: int, index: int) -> np.ndarray:
    """bool [p]: ``k`` features drawn uniformly without replacement for image ``index`` (its position in the
    audit), from its own generator seeded by (``seed``, ``index``)."""
    keep = np.zeros(p, dtype=bool)
    keep[np.random.default_rng((seed, index)).permutation(p)[:k]] = True
    return keep


class SubsetFiles:
    """Gathers the pixel-subset datasets chunk by chunk (:meth:`add`, in image order) and writes them
    (:meth:`write`).

    Args:
        models: the models' names, in the audit's order. source_split: the source's split (None for other
            sources). fraction: the share of pixels kept. seed: the random baseline's seed.
        mean, std: the images' normalization. mask_value: what a masked pixel becomes (a number, or one per
            channel).
    """

    def __init__(self, models: list[str], source_split: str | None, fraction: float, seed: int, mean, std,
                 mask_value: float):
        self.models, self.source_split = models, source_split
        self.fraction, self.seed = fraction, seed
        self.mask_value = np.atleast_1d(np.asarray(mask_value, dtype=np.float64))
        self.mean = np.atleast_1d(np.asarray(mean, dtype=np.float32))
        self.std = np.atleast_1d(np.asarray(std, dtype=np.float32))
        self.parts: dict[tuple[str, str], dict[str, list]] = {}

    def add(self, images: ChunkImages, per_model: list[list[SISResult]],
            own: list[dict | None] | None = None) -> None:
        """One chunk's images and each model's results for them; ``own``: per model its own-subset columns for them
        (:mod:`overinterp_fast.audit.own_subsets`), or None where not kept (a file holds them when every chunk
        of its split had them)."""
        own = [None] * len(self.models) if own is None else own
        for model, results, cols in zip(self.models, per_model, own):
            for j, (idx, name, label, photo, r) in enumerate(zip(images.indices, images.names, images.labels,
                                                                 images.displays, results)):
                grid = photo.shape[:2]
                p = int(np.prod(grid))
                order = r.order.numpy()
                if order.size != p:
                    raise ValueError(f"{name}: an order of {order.size} features for {p} pixels; pixel-subset "
                                     f"datasets need the first round of backward selection over every pixel")
                kept = np.zeros(p, dtype=bool)
                kept[keep_last(r.order, self.fraction).numpy()] = True
                k = int(kept.sum())
                rows = self.parts.setdefault((model, split_of(name, self.source_split)),
                                             {key: [] for key in ("names", "labels", "targets", "photos", "order",
                                                                  "backselect", "random", *OWN_SUBSET_COLUMNS)})
                rows["names"].append(name)
                rows["labels"].append(-1 if label is None else int(label))
                rows["targets"].append(int(r.target))
                rows["photos"].append(photo)
                rows["order"].append(order.astype(np.int16 if p <= np.iinfo(np.int16).max else np.int32))
                rows["backselect"].append(kept.reshape(grid))
                rows["random"].append(random_keep(p, k, self.seed, int(idx)).reshape(grid))
                for key in OWN_SUBSET_COLUMNS:
                    rows[key].append(None if cols is None else cols[key][j])

    def write(self, folder: str) -> list[str]:
        """Write ``subsets/<model>/<split>.npz`` under ``folder`` (each atomically); returns the paths."""
        paths = []
        for (model, split), rows in sorted(self.parts.items()):
            own = {key: rows[key] for key in OWN_SUBSET_COLUMNS}
            arrays = {key: np.stack(v) if key not in ("names",) else np.asarray(v, dtype=str)
                      for key, v in rows.items() if key not in own}
            if all(v is not None for values in own.values() for v in values):
                arrays.update({key: np.asarray(own[key], dtype=t) for key, t in OWN_SUBSET_COLUMNS.items()})
            arrays["labels"] = np.asarray(rows["labels"], dtype=np.int64)
            arrays["targets"] = np.asarray(rows["targets"], dtype=np.int64)
            arrays.update(mean=self.mean, std=self.std, mask_value=self.mask_value,
                          fraction=np.float64(self.fraction), seed=np.int64(self.seed), model=np.str_(model),
                          split=np.str_(split))
            path = os.path.join(folder, SUBSETS_DIR, safe_name(model), f"{split}.npz")
            os.makedirs(os.path.dirname(path), exist_ok=True)

            def save(tmp: str, arrays=arrays) -> None:
                with open(tmp, "wb") as fh:  # a file object: np.savez would add ".npz" to the temporary name
                    np.savez(fh, **arrays)

            atomic_write(path, save)
            paths.append(path)
        return paths


def subset_file(path: str, split: str, model: str | None = None) -> str:
    """The file of one split: ``path`` is a folder holding ``<split>.npz`` (``subsets/<model>/``), or an audit folder
    whose ``subsets/`` holds it for ``model`` (None: its only model). One-line FileNotFoundError or ValueError
    naming what is missing."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path!r} is not a folder: give an audit folder (written with --pixel-subsets) or "
                                f"its subsets/<model> folder")
    folder = path
    root = os.path.join(path, SUBSETS_DIR)
    if os.path.isdir(root) and not os.path.isfile(os.path.join(path, f"{split}.npz")):
        have = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        if model is not None:
            folder = os.path.join(root, safe_name(model))
            if not os.path.isdir(folder):
                raise ValueError(f"{path!r} has no pixel subsets of model {model!r}; it has {', '.join(have)}")
        elif len(have) == 1:
            folder = os.path.join(root, have[0])
        else:
            raise ValueError(f"{path!r} has pixel subsets of {len(have)} models ({', '.join(have)}): name one "
                             f"(--subsets-of)")
    file = os.path.join(folder, f"{split}.npz")
    if not os.path.isfile(file):
        there = sorted(x[:-4] for x in os.listdir(folder) if x.endswith(".npz")) if os.path.isdir(folder) else []
        raise FileNotFoundError(f"no {split} split in {folder!r} (it holds {', '.join(there) or 'no split'}); "
                                f"the audit needs --split all, or both splits audited into it")
    return file


def safe_name(model: str) -> str:
    """A model's name as a folder name: characters other than letters, digits, '-', '_' and '.' become '_'."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in model)


@dataclass
class PixelSubsets:
    """One split's pixel-subset datasets of one model, read back by :func:`load_pixel_subsets` (the arrays of the
    module docstring)."""

    names: np.ndarray
    labels: np.ndarray
    targets: np.ndarray
    photos: np.ndarray
    order: np.ndarray
    backselect: np.ndarray
    random: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    mask_value: np.ndarray
    fraction: float
    seed: int
    model: str
    split: str
    backselect_class: np.ndarray | None = None
    backselect_score: np.ndarray | None = None
    random_class: np.ndarray | None = None
    random_score: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    def inputs(self, which: str = "backselect", indices: Sequence[int] | None = None) -> torch.Tensor:
        """The model inputs of one subset, float32 [N, C, H, W] (N = ``len(indices)``; None: every image): each
        photo normalized, with only the pixels of ``which`` ("backselect", "random", or "full" for every pixel)
        present and the others at ``mask_value``."""
        if which not in WHICH:
            raise ValueError(f"which must be 'backselect', 'random' or 'full', got {which!r}")
        rows = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        if rows.size == 0:
            raise ValueError("no images to build inputs of")
        x = torch.stack([normalize(self.photos[i], self.mean, self.std) for i in rows])
        if which == "full":
            return x
        keep = torch.from_numpy(getattr(self, which)[rows].reshape(len(rows), -1))
        value = float(self.mask_value[0]) if self.mask_value.size == 1 else torch.from_numpy(self.mask_value).float()
        return _apply(x, keep, value, None)


def load_pixel_subsets(path: str) -> PixelSubsets:
    """A ``subsets/<model>/<split>.npz`` file that a stored audit wrote (see the module docstring)."""
    with np.load(path, allow_pickle=False) as f:
        return PixelSubsets(names=f["names"], labels=f["labels"], targets=f["targets"], photos=f["photos"],
                            order=f["order"], backselect=f["backselect"], random=f["random"], mean=f["mean"],
                            std=f["std"], mask_value=f["mask_value"], fraction=float(f["fraction"]),
                            seed=int(f["seed"]), model=str(f["model"]), split=str(f["split"]),
                            **{key: f[key] for key in OWN_SUBSET_COLUMNS if key in f.files})
