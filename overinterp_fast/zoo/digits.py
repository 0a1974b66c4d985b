"""sklearn's handwritten digits (1,797 real 8x8 scans) and a small CNN trained on them in seconds."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

from ..util import optional
from .training import TrainOptions, fit


@dataclass
class DigitsData:
    """Normalized digits: pixel / 16, minus the training mean, over the training std.

    A masked pixel (0 after normalization) is the mean training pixel.
    x_*: float32 [n, 1, 8, 8]; y_*: int64 [n]; raw_*: the 0..16 scans [n, 8, 8].
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    raw_test: torch.Tensor
    mean: float
    std: float


def load_digits(test_fraction: float = 0.25, seed: int = 0) -> DigitsData:
    d = optional.load("sklearn.datasets", "demo", "the digits").load_digits()
    raw = torch.tensor(d.images, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    x = raw / 16.0
    mean, std = float(x[train].mean()), float(x[train].std())
    x = ((x - mean) / std).unsqueeze(1)
    return DigitsData(x[train], y[train], x[test], y[test], raw[test], mean, std)


class DigitsCNN(nn.Module):
    """Two conv layers and a linear head for [N, 1, 8, 8] digits."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def train_digits_cnn(
    data: DigitsData, epochs: int = 15, seed: int = 0, width: int = 16, lr: float = 3e-3
) -> DigitsCNN:
    """Adam on cross-entropy, batch 64, seeded (:func:`overinterp_fast.zoo.training.fit`): about 98% test accuracy
    in a few seconds on a CPU."""
    return fit(lambda: DigitsCNN(width), TensorDataset(data.x_train, data.y_train),
               TrainOptions(epochs=epochs, batch_size=64, lr=lr), seed=seed)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(1) == y).float().mean())
