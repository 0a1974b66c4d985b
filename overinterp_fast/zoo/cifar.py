"""CIFAR-size architectures (32x32 inputs): a small CNN and ResNet-20 (He et al. 2016, option A shortcuts)."""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv(3->16) - conv(16->32) - pool - conv(32->32) - pool - linear, for [N, 3, S, S] inputs."""

    def __init__(self, size: int = 32, classes: int = 10, channels: int = 3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * (size // 4) ** 2, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x
        if self.stride != 1 or self.pad:
            short = x[:, :, :: self.stride, :: self.stride]
            short = nn.functional.pad(short, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return torch.relu(out + short)


class ResNet20(nn.Module):
    """ResNet-20 for CIFAR-10: 3 stages of 3 basic blocks (16, 32, 64 channels), 0.27M parameters."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(3):
                layers.append(_Block(cin, cout, stride if b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x)))
        x = self.layers(x)
        return self.fc(x.mean(dim=(2, 3)))
