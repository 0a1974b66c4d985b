"""Training a classifier from scratch, seeded: the one loop behind the digits CNN and the pixel-subset retraining.

    model = fit(lambda: SmallCNN(size=32), dataset, TrainOptions(epochs=30, batch_size=128, lr=1e-3), seed=0)
    acc = evaluate(model, test_dataset)

``dataset`` is any map-style ``torch.utils.data.Dataset`` of (image float32 [C, H, W], label int64) pairs:
a ``TensorDataset`` or :class:`~overinterp_fast.audit.subset_dataset.PixelSubsetDataset` (whose batches are built
in one call, ``__getitems__``). Adam on cross-entropy, no augmentation. The seed fixes the initial weights
(``torch.manual_seed`` right before ``build()``) and the order of the images in every epoch (its own generator),
so that a run is the same given its seed, on the same device and thread count: on a GPU, cuDNN's deterministic
kernels are asked for while it trains.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


@dataclass(frozen=True)
class TrainOptions:
    """How :func:`fit` trains.

    Attributes:
        epochs: passes over the training set.
        batch_size: images per step (the last batch of an epoch holds the rest).
        lr, weight_decay: Adam's.
        device: where the model trains and is evaluated ("cpu", "cuda", "cuda:1"; resolved by the caller).
        workers: DataLoader worker processes that build the batches (0: in this process); the batches are the
            same whatever the number.
    """

    epochs: int = 15
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    device: str | torch.device = "cpu"
    workers: int = 0

    def __post_init__(self):
        for name, least in (("epochs", 0), ("batch_size", 1)):  # 0 epochs: the seeded, untrained model
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                word = "an integer >= 0" if least == 0 else "a positive integer"
                raise ValueError(f"{name} must be {word}, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be above 0, got {self.lr!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be 0 or more, got {self.weight_decay!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {self.workers!r}")


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Batches in one epoch over ``n`` images: ceil(n / batch_size)."""
    return -(-n // batch_size)


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """On a GPU, cuDNN's deterministic kernels and no autotuning for the block (restored after); nothing on a CPU,
    whose kernels are deterministic for a thread count. torch's deterministic-algorithms mode is set with
    ``warn_only``: an op without a deterministic kernel warns instead of failing the run."""
    if torch.device(device).type != "cuda":
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[0], before[1]
        torch.use_deterministic_algorithms(before[2], warn_only=before[3])


def _loader(data: Dataset, batches: list[list[int]], workers: int) -> DataLoader:
    return DataLoader(data, batch_sampler=batches, num_workers=workers)


def fit(build: Callable[[], nn.Module], data: Dataset, options: TrainOptions | None = None, seed: int = 0,
        on_step: Callable[[], None] | None = None) -> nn.Module:
    """Train ``build()`` (a new, untrained model) on ``data`` and return it in eval mode.

    Args:
        build: makes the model; called once, right after ``torch.manual_seed(seed)``.
        data: (image [C, H, W], label) pairs; every epoch visits them in a permutation drawn from a generator
            seeded with ``seed``, in batches of ``options.batch_size``.
        options: :class:`TrainOptions` (None: the defaults).
        on_step: called after every optimizer step (a progress bar's update).

    Raises:
        FloatingPointError: the loss of an epoch is not finite (a learning rate too high, say), naming the epoch.
    """
    options = TrainOptions() if options is None else options
    device = torch.device(options.device)
    n = len(data)
    if n == 0:
        raise ValueError("no training images")
    torch.manual_seed(seed)
    model = build().to(device)
    decay = {"weight_decay": options.weight_decay} if options.weight_decay else {}  # Adam's own default else
    opt = torch.optim.Adam(model.parameters(), lr=options.lr, **decay)
    g = torch.Generator().manual_seed(seed)
    model.train()
    with deterministic(device):
        for epoch in range(options.epochs):
            perm = torch.randperm(n, generator=g).tolist()
            batches = [perm[s:s + options.batch_size] for s in range(0, n, options.batch_size)]
            total = torch.zeros((), device=device)
            for x, y in _loader(data, batches, options.workers):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += loss.detach()
                if on_step is not None:
                    on_step()
            if not bool(torch.isfinite(total)):  # once an epoch: a check per step would wait for the GPU each time
                raise FloatingPointError(f"the training loss is not finite in epoch {epoch + 1}: lower the "
                                         f"learning rate (lr {options.lr})")
    return model.eval()


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, batch_size: int = 256, device: str | torch.device = "cpu",
             workers: int = 0) -> float:
    """Top-1 accuracy of ``model`` (in eval mode) on ``data``'s (image, label) pairs, in batches on ``device``."""
    device = torch.device(device)
    n = len(data)
    if n == 0:
        raise ValueError("no images to evaluate on")
    batches = [list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    correct = 0
    for x, y in _loader(data, batches, workers):
        correct += int((model(x.to(device)).argmax(1).cpu() == y).sum())
    return correct / n
