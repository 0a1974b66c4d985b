import pytest
import torch
from torch import nn


class SmallCNN(nn.Module):
    """A seeded CNN for [N, C, H, W] inputs whose decision depends on where evidence lies.

    Without biases the all-zero (fully masked) input scores 1/classes for every
    class; `scale` sharpens the softmax so that real inputs are confident.
    """

    def __init__(self, channels=3, classes=5, width=8, scale=16.0, h=5, w=5):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.head = nn.Linear(width * h * w, classes, bias=False)
        self.scale = scale

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.scale * self.head(x.flatten(1))


def make_cnn(seed=0, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    return SmallCNN(**kw).to(dtype).eval()


def make_images(n, c=3, h=5, w=5, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g, dtype=dtype)


@pytest.fixture
def cnn64():
    return make_cnn(0, torch.float64)


@pytest.fixture
def images64():
    return make_images(4)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def assert_same_lists(res_a, res_b, compare, collection=False):
    """compare(a, b) on every image's result and, with collection, on every round of it."""
    assert len(res_a) == len(res_b)
    for a, b in zip(res_a, res_b):
        compare(a, b)
        if collection:
            assert len(a.collection) == len(b.collection)
            for ca, cb in zip(a.collection, b.collection):
                compare(ca, cb)
