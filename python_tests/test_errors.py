"""Bad input gets a clear error, never a wrong answer."""
import pytest
import torch
from torch import nn

import overinterp_fast as of

from conftest import make_cnn, make_images


@pytest.fixture
def model():
    return make_cnn(0)


@pytest.fixture
def x():
    return make_images(2)


def test_wrong_rank_and_empty(model, x):
    with pytest.raises(ValueError, match="batch dimension"):
        of.fast_sis(model, torch.randn(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="empty batch"):
        of.fast_sis(model, x[:0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        of.fast_sis(model, x.numpy())


def test_single_image_without_batch_dimension(model, x):
    for method in ("exact", "gradient", "responsibility"):
        with pytest.raises(ValueError, match=r"images must have a batch dimension: pass images\[None\]"):
            of.fast_sis(model, x[0], 0.5, method=method)
    with pytest.raises(ValueError, match=r"images must have a batch dimension: pass images\[None\]"):
        of.responsibility(model, x[0])
    # a model that fails for another reason keeps its own error (the probe is not fooled)
    with pytest.raises(RuntimeError, match="expected input.* to have 3 channels"):
        of.fast_sis(model, make_images(2, c=4), 0.5)
    with pytest.raises(RuntimeError) as err:
        of.fast_sis(model, make_images(2, c=4)[0], 0.5)
    assert "batch dimension" not in str(err.value)


def test_non_float_and_non_finite(model, x):
    with pytest.raises(TypeError, match="floating point"):
        of.fast_sis(model, (x * 10).to(torch.int64))
    bad = x.clone()
    bad[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or inf \(first examples affected: \[1\]\)"):
        of.fast_sis(model, bad)
    bad[1, 0, 2, 2] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        of.fast_sis(model, bad)


@pytest.mark.parametrize("tau", [-0.1, 1.5, float("nan")])
def test_threshold_outside_unit_interval(model, x, tau):
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        of.fast_sis(model, x, tau)


def test_threshold_type(model, x):
    with pytest.raises(TypeError, match="threshold"):
        of.fast_sis(model, x, "0.9")
    with pytest.raises(ValueError, match="one entry per image"):
        of.fast_sis(model, x, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        of.fast_sis(model, x, torch.tensor([0.5, 1.5]))


def test_feature_map_that_does_not_fit(model, x):
    with pytest.raises(ValueError, match="does not fit"):
        of.fast_sis(model, x, 0.5, features=torch.zeros(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="0..p-1"):
        of.fast_sis(model, x, 0.5, features=torch.arange(25).view(5, 5) + 1)
    with pytest.raises(TypeError, match="integer"):
        of.fast_sis(model, x, 0.5, features=torch.zeros(5, 5))


def test_bad_mask_value(model, x):
    with pytest.raises(ValueError, match="finite"):
        of.fast_sis(model, x, 0.5, mask_value=float("nan"))
    with pytest.raises(ValueError, match="fits neither"):
        of.fast_sis(model, x, 0.5, mask_value=torch.zeros(4, dtype=torch.float64))


def test_model_returning_wrong_shape(x):
    class Flat(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:1]

    with pytest.raises(ValueError, match=r"\[B, K\]"):
        of.fast_sis(Flat().eval(), x, 0.5)
    with pytest.raises(TypeError, match="tensor"):
        of.fast_sis(lambda t: t.sum().item(), x, 0.5)


def test_model_dtype_device_and_mode(model, x):
    with pytest.raises(TypeError, match="float32 but images are torch.float64|images are torch.float64"):
        of.fast_sis(model.float(), x, 0.5)
    train = make_cnn(0).train()
    with pytest.raises(ValueError, match="training mode"):
        of.fast_sis(train, x, 0.5)
    meta = make_cnn(0).to("meta")
    with pytest.raises(ValueError, match="different devices"):
        of.fast_sis(meta, x, 0.5)


def test_non_finite_model_scores(x):
    class NaNWhenMasked(nn.Module):
        def forward(self, t):
            s = t.flatten(1).sum(1)
            nan = torch.where(t.flatten(1).eq(0).any(1), torch.full_like(s, float("nan")), s)
            return torch.stack([nan, torch.zeros_like(s)], 1)

    with pytest.raises(FloatingPointError, match="NaN or inf"):
        of.fast_sis(NaNWhenMasked().eval(), x.abs() + 1, 0.1)


def test_bad_options(model, x):
    with pytest.raises(ValueError, match="batch_size"):
        of.fast_sis(model, x, 0.5, batch_size=0)
    with pytest.raises(ValueError, match="method"):
        of.fast_sis(model, x, 0.5, method="magic")
    with pytest.raises(ValueError, match="outputs"):
        of.fast_sis(model, x, 0.5, outputs="logprobs")
    with pytest.raises(ValueError, match="target classes"):
        of.fast_sis(model, x, 0.5, target=99)
    with pytest.raises(ValueError, match="one entry per image"):
        of.fast_sis(model, x, 0.5, target=torch.tensor([0, 1, 2]))
