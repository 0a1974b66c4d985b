"""pytest-benchmark versions of the exact-SIS comparison (small sizes): `pytest benchmarks/`."""
import pytest
import torch

import overinterp_fast as of
from overinterp_fast.zoo.cifar import SmallCNN


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    model = SmallCNN(8).eval()
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    return model, images


def test_fast_sis(benchmark, case):
    model, images = case
    benchmark.pedantic(lambda: of.fast_sis(model, images, 0.5, progress=False), rounds=3, iterations=1)


def test_reference_sis(benchmark, case):
    model, images = case
    benchmark.pedantic(lambda: of.reference.sis(model, images, 0.5), rounds=3, iterations=1)
