"""A pixel-subset file as a ``torch.utils.data.Dataset``: what a new model trains and is tested on (Carter et al.
2021, Table 1).

    from overinterp_fast.audit import PixelSubsetDataset
    train = PixelSubsetDataset("out/cifar/subsets/resnet20/train.npz", "backselect")   # or "random", "full"
    test = PixelSubsetDataset("out/cifar", "random", split="test")    # an audit folder: its (only) model's test split
    x, y = train[0]              # float32 [3, 32, 32]: only the 52 kept pixels, the rest at the baseline; int64 label
    loader = torch.utils.data.DataLoader(train, batch_size=128, shuffle=True)

An item is one image of the file (:mod:`overinterp_fast.audit.subset_files`) normalized as the audit normalized
it, with only the pixels of its subset present (``which``: "backselect", the last 5% of its backward-selection
order; "random", as many pixels drawn at random; "full", every pixel) and the others at the audit's baseline
(the baseline: 0, the mean colour, after the usual normalization), and its label: the true class
(``target="labels"``, what the paper trains on) or the class the audited model predicted on the whole image
(``target="predictions"``). A batch is built in one call (``__getitems__``, which a DataLoader uses): the
images normalized and masked together.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import os
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .config import TARGETS
from .subset_files import WHICH, PixelSubsets, load_pixel_subsets, subset_file


class PixelSubsetDataset(Dataset):
    """(image float32 [C, H, W], label int64) pairs of one pixel-subset file (see the module docstring).

    Args:
        subsets: a ``subsets/<model>/<split>.npz`` path, the :class:`PixelSubsets` read from one, or a folder with
            ``split``: an audit folder written with ``--pixel-subsets`` (``model``: whose subsets, when it audited
            several) or one ``subsets/<model>/`` folder
            (:func:`~overinterp_fast.audit.subset_files.subset_file`).
        which: "backselect" (default), "random" or "full".
        target: "labels" (default: the true classes; a file with unknown labels, -1, is refused) or
            "predictions" (the audited model's classes on the whole images).
        split, model: with a folder, the split ("train", "test", ...) and the audited model.

    Attributes:
        subsets: the file's arrays. which, target: as given. labels: int64 [N], the labels the items carry.
        channels, size: the images' channels and side (C, and H = W).
    """

    def __init__(self, subsets: PixelSubsets | str | os.PathLike, which: str = "backselect",
                 target: str = "labels", split: str | None = None, model: str | None = None):
        if which not in WHICH:
            raise ValueError(f"which must be one of {WHICH}, got {which!r}")
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        if not isinstance(subsets, PixelSubsets):
            path = os.fspath(subsets)
            if os.path.isdir(path):
                if split is None:
                    raise ValueError(f"{path!r} is a folder: give the split to read (split='train', 'test', ...)")
                path = subset_file(path, split, model)
            elif not os.path.isfile(path):
                raise FileNotFoundError(f"no pixel-subset file {path!r} (an audit with --pixel-subsets writes "
                                        f"OUT/subsets/<model>/<split>.npz)")
            subsets = load_pixel_subsets(path)
        if len(subsets) == 0:
            raise ValueError(f"the pixel-subset file of {subsets.model!r}, split {subsets.split!r}, holds no images")
        labels = subsets.labels if target == "labels" else subsets.targets
        if target == "labels" and bool((labels < 0).any()):
            raise ValueError(f"{int((labels < 0).sum())} images of split {subsets.split!r} have no known label; "
                             f"train on target='predictions' (the audited model's classes) instead")
        self.subsets, self.which, self.target = subsets, which, target
        self.labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
        photo = subsets.photos[0]
        self.channels = 1 if photo.ndim == 2 else int(photo.shape[-1])
        self.size = int(photo.shape[0])
        if photo.shape[0] != photo.shape[1]:
            raise ValueError(f"the images are {photo.shape[0]} x {photo.shape[1]} pixels; training takes square "
                             f"images")

    def __len__(self) -> int:
        return len(self.subsets)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The items at ``indices``, built together (one normalization and one masking for the batch)."""
        rows = [int(i) for i in indices]
        n = len(self)
        bad = [i for i in rows if not -n <= i < n]
        if bad:
            raise IndexError(f"index {bad[0]} is out of range for {n} images")
        x = self.subsets.inputs(self.which, rows)
        return list(zip(x, self.labels[rows]))

    def __repr__(self) -> str:
        return (f"PixelSubsetDataset({self.subsets.model!r}, split {self.subsets.split!r}, {self.which}: "
                f"{len(self)} images of {self.channels} x {self.size} x {self.size}, {self.target})")
