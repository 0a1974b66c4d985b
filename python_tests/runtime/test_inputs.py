"""inputs.py checked function by function: every expectation is written out by hand.

Every test here is marked ``mutation``: written for the mutants of a mutation run (mutmut) that the older tests
(which go through fast_sis and match messages by a fragment) let survive: error messages are matched whole
(anchored), boundaries of every check are probed from both sides, and the Prepared fields are compared element
by element.
"""
from fractions import Fraction
import numpy as np
import pytest
import torch
from overinterp_fast.runtime import inputs
from helpers import whole_message as whole


# ---------------------------------------------------------------------------- check_images
@pytest.mark.mutation
def test_check_images_messages_and_boundaries():
    with pytest.raises(TypeError, match=whole("images must be a torch.Tensor of shape [N, *D], got ndarray")):
        inputs.check_images(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=whole(
        "images must have a batch dimension, shape [N, *D] (images: [N, C, H, W]); got shape (5,). "
        "For one image use images.unsqueeze(0).")):
        inputs.check_images(torch.zeros(5))
    with pytest.raises(ValueError, match=whole("images is an empty batch (N = 0)")):
        inputs.check_images(torch.zeros(0, 3))
    with pytest.raises(ValueError, match=whole("images have no elements per example: shape (2, 0)")):
        inputs.check_images(torch.zeros(2, 0))
    with pytest.raises(TypeError, match=whole(
        "images must be floating point (torch.float16, torch.bfloat16, torch.float32, torch.float64), "
        "got torch.int64; convert and normalize them as the model expects, e.g. images.float()")):
        inputs.check_images(torch.zeros(2, 3, dtype=torch.int64))
    # two dimensions is the smallest accepted rank; one example is a batch; every float dtype passes
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = torch.zeros(1, 1, dtype=dtype)
        assert inputs.check_images(x) is x


@pytest.mark.mutation
def test_check_images_names_the_first_five_bad_examples():
    x = torch.zeros(9, 2, 2)
    for i in (8, 1, 3, 4, 6, 7):  # six bad examples: only the first five are named, sorted
        x[i, 1, 0] = float("inf") if i % 2 else float("nan")
    with pytest.raises(ValueError, match=whole("images contain NaN or inf (first examples affected: [1, 3, 4, 6, 7])")):
        inputs.check_images(x)
    y = torch.zeros(3, 2)
    y[2, 1] = -float("inf")
    with pytest.raises(ValueError, match=whole("images contain NaN or inf (first examples affected: [2])")):
        inputs.check_images(y)


# ---------------------------------------------------------------------------- thresholds
@pytest.mark.mutation
def test_unit_interval_bounds_types_and_messages():
    assert inputs._unit_interval(0) == 0.0 and type(inputs._unit_interval(0)) is float
    assert inputs._unit_interval(1) == 1.0 and type(inputs._unit_interval(1)) is float
    assert inputs._unit_interval(Fraction(1, 4)) == 0.25 and type(inputs._unit_interval(Fraction(1, 4))) is float
    assert inputs._unit_interval(np.float32(0.5)) == 0.5
    for bad in (True, False):
        with pytest.raises(TypeError, match=whole(f"threshold must be a number in [0, 1], got {bad!r}")):
            inputs._unit_interval(bad)
    with pytest.raises(TypeError, match=whole("threshold must be a number in [0, 1], got '0.5'")):
        inputs._unit_interval("0.5")
    with pytest.raises(TypeError, match=whole("threshold must be a number in [0, 1], got None")):
        inputs._unit_interval(None)
    for bad, shown in ((-1e-12, "-1e-12"), (1.0000001, "1.0000001"), (float("nan"), "nan"), (2, "2.0")):
        with pytest.raises(ValueError, match=whole(f"threshold must lie in [0, 1], got {shown}")):
            inputs._unit_interval(bad)


@pytest.mark.mutation
def test_check_threshold_forms():
    assert inputs.check_threshold(0.25, 3) == [0.25, 0.25, 0.25]
    assert inputs.check_threshold(torch.tensor(0.5), 2) == [0.5, 0.5]
    assert inputs.check_threshold(torch.tensor([0.0, 1.0], dtype=torch.float64), 2) == [0.0, 1.0]
    assert inputs.check_threshold([0.125, 1], 2) == [0.125, 1.0]
    assert inputs.check_threshold((0.75,), 1) == [0.75]
    with pytest.raises(ValueError, match=whole("threshold must be a number or one per image [N], got shape (2, 1)")):
        inputs.check_threshold(torch.zeros(2, 1), 2)
    with pytest.raises(ValueError, match=whole(
        "threshold must be a number or have one entry per image (2), got 3")):
        inputs.check_threshold([0.5, 0.5, 0.5], 2)
    with pytest.raises(ValueError, match=whole(
        "threshold must be a number or have one entry per image (3), got 2")):
        inputs.check_threshold((0.5, 0.5), 3)
    with pytest.raises(ValueError, match=whole("threshold must lie in [0, 1], got 1.5")):
        inputs.check_threshold(torch.tensor([0.5, 1.5]), 2)


# ---------------------------------------------------------------------------- feature maps
@pytest.mark.mutation
def test_default_feature_map_by_hand():
    fm, grid = inputs.default_feature_map((2, 2, 3))  # [C, H, W]: one feature per pixel
    assert grid == (2, 3)
    assert fm.tolist() == [[[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [3, 4, 5]]]
    fm, grid = inputs.default_feature_map((2, 3))  # [L, E]: one feature per element
    assert grid == (2, 3) and type(grid) is tuple
    assert fm.tolist() == [[0, 1, 2], [3, 4, 5]]
    fm, grid = inputs.default_feature_map((2, 1, 1, 2))  # 4-D example: per element
    assert grid == (2, 1, 1, 2)
    assert fm.flatten().tolist() == [0, 1, 2, 3]
    fm, grid = inputs.default_feature_map((4,))
    assert grid == (4,) and fm.tolist() == [0, 1, 2, 3]


@pytest.mark.mutation
def test_check_feature_map_messages():
    shape = (2, 2, 3)
    with pytest.raises(TypeError, match=whole(
        "feature_mask must be an integer tensor (a feature id per input element) or None")):
        inputs.check_feature_map([[0, 1]], shape)
    for dtype in (torch.float32, torch.complex64, torch.bool):
        with pytest.raises(TypeError, match=whole(f"feature_mask must be an integer tensor, got {dtype}")):
            inputs.check_feature_map(torch.zeros(2, 3, dtype=dtype), shape)
    with pytest.raises(ValueError, match=whole(
        "feature_mask of shape (4, 4) does not fit one example of shape (2, 2, 3); "
        "it must be broadcastable to it (e.g. [H, W] for [C, H, W] images)")):
        inputs.check_feature_map(torch.zeros(4, 4, dtype=torch.int64), shape)
    with pytest.raises(ValueError, match=whole(
        "feature ids must be exactly 0..p-1 with every id used; found 2 distinct ids from 0 to 2 "
        "(relabel with torch.unique(feature_mask, return_inverse=True)[1])")):
        inputs.check_feature_map(torch.tensor([[0, 2, 2], [0, 0, 2]]), shape)
    with pytest.raises(ValueError, match=whole(
        "feature ids must be exactly 0..p-1 with every id used; found 3 distinct ids from 1 to 3 "
        "(relabel with torch.unique(feature_mask, return_inverse=True)[1])")):
        inputs.check_feature_map(torch.tensor([[1, 2, 3], [1, 2, 3]]), shape)


@pytest.mark.mutation
def test_check_feature_map_forms():
    shape = (2, 2, 3)
    hw = torch.tensor([[0, 0, 1], [2, 1, 0]], dtype=torch.int32)
    expected = [[[0, 0, 1], [2, 1, 0]]] * 2
    fm, p = inputs.check_feature_map(hw, shape)  # [H, W] broadcast over channels
    assert p == 3 and fm.dtype == torch.int64 and fm.tolist() == expected
    fm, p = inputs.check_feature_map(hw[None], shape)  # [1, H, W]: broadcast too
    assert p == 3 and fm.tolist() == expected
    full = torch.tensor([[[1, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 1]]], dtype=torch.uint8)
    fm, p = inputs.check_feature_map(full, shape)  # one per element, [*D]
    assert p == 2 and fm.dtype == torch.int64 and fm.tolist() == full.tolist()
    fm, p = inputs.check_feature_map(full[None], shape)  # [1, *D], shared by the batch (Captum)
    assert p == 2 and fm.tolist() == full.tolist()
    fm, p = inputs.check_feature_map(torch.zeros(1, dtype=torch.int64), shape)  # one feature for all
    assert p == 1 and fm.shape == shape and not fm.any()
    fm, p = inputs.check_feature_map(torch.tensor(0), shape)  # a 0-d map too
    assert p == 1 and fm.shape == shape and not fm.any()
    # a [1, ...] map that is not [1, *D] is broadcast as it is (not its first index taken)
    fm, p = inputs.check_feature_map(torch.tensor([[0, 1, 2]]), shape)
    assert p == 3 and fm.tolist() == [[[0, 1, 2]] * 2] * 2
    fm, p = inputs.check_feature_map(torch.tensor([[[[0, 1, 2], [3, 4, 5]]]]), (1, 2, 3))
    assert p == 6 and fm.tolist() == [[[0, 1, 2], [3, 4, 5]]]


# ---------------------------------------------------------------------------- mask values
@pytest.mark.mutation
def test_check_mask_value_numbers():
    x = torch.zeros(2, 3, 2, 2, dtype=torch.float32)
    b = inputs.check_mask_value(-2, x)
    assert b.shape == (1, 3, 2, 2) and b.dtype == torch.float32 and bool((b == -2).all())
    b = inputs.check_mask_value(Fraction(1, 2), x.double())
    assert b.dtype == torch.float64 and bool((b == 0.5).all())
    b = inputs.check_mask_value(np.float64(0.25), torch.zeros(3, 4, dtype=torch.float16))
    assert b.shape == (1, 4) and b.dtype == torch.float16 and b.tolist() == [[0.25] * 4]
    # a number becomes a baseline on the images' device (meta: a second device on any machine)
    b = inputs.check_mask_value(3, torch.zeros(2, 3, device="meta"))
    assert b.device.type == "meta" and b.shape == (1, 3)
    for bad in (float("inf"), float("nan"), -float("inf")):
        with pytest.raises(ValueError, match=whole(f"baselines must be finite, got {bad}")):
            inputs.check_mask_value(bad, x)
    with pytest.raises(TypeError, match=whole(
        "baselines must be a number, a per-channel tensor [C], or a baseline tensor")):
        inputs.check_mask_value(True, x)
    with pytest.raises(TypeError, match=whole(
        "baselines must be a number, a per-channel tensor [C], or a baseline tensor")):
        inputs.check_mask_value([0.0, 1.0, 2.0], x)


@pytest.mark.mutation
def test_check_mask_value_tensors():
    x = torch.zeros(2, 3, 2, 2, dtype=torch.float64)
    # per channel [C]: a float32 and an integer tensor are converted to the images' dtype
    b = inputs.check_mask_value(torch.tensor([1, 2, 3]), x)
    assert b.shape == (1, 3, 2, 2) and b.dtype == torch.float64
    assert b[0, :, 1, 0].tolist() == [1.0, 2.0, 3.0] and b[0, 2].tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert b.is_contiguous()
    # per element [*D] and [1, *D]
    d = torch.arange(12, dtype=torch.float32).view(3, 2, 2)
    for mv in (d, d[None]):
        b = inputs.check_mask_value(mv, x)
        assert b.shape == (1, 3, 2, 2) and b.dtype == torch.float64 and b[0].tolist() == d.tolist()
    # a [H, W] plane broadcast over channels
    b = inputs.check_mask_value(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), x)
    assert b.shape == (1, 3, 2, 2) and b[0, 1].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    # per image [N, *D]
    per = torch.arange(24, dtype=torch.float64).view(2, 3, 2, 2)
    b = inputs.check_mask_value(per, x)
    assert b.shape == (2, 3, 2, 2) and b.tolist() == per.tolist()
    # N = 1: a [1, *D] baseline is the one image's baseline
    b = inputs.check_mask_value(per[:1], x[:1])
    assert b.shape == (1, 3, 2, 2) and b.tolist() == per[:1].tolist()
    # N = 1 and a [1, C, 1, 1] baseline: broadcast over the pixels
    b = inputs.check_mask_value(torch.tensor([1.0, 2.0, 3.0]).view(1, 3, 1, 1), x[:1])
    assert b.shape == (1, 3, 2, 2) and b[0, :, 1, 1].tolist() == [1.0, 2.0, 3.0]
    # a per-image baseline of one-channel images [N, 1, H, W]
    one = torch.arange(8, dtype=torch.float64).view(2, 1, 2, 2)
    b = inputs.check_mask_value(one, torch.zeros(2, 1, 2, 2, dtype=torch.float64))
    assert b.shape == (2, 1, 2, 2) and b.tolist() == one.tolist()
    # not per channel when the images are not [C, H, W]: a [E] vector broadcast over [L, E]
    b = inputs.check_mask_value(torch.tensor([5.0, 6.0, 7.0]), torch.zeros(2, 2, 3))
    assert b.shape == (1, 2, 3) and b.tolist() == [[[5.0, 6.0, 7.0], [5.0, 6.0, 7.0]]]
    # a [C] vector whose length is not C is broadcast over the last axis (W)
    b = inputs.check_mask_value(torch.tensor([8.0, 9.0]), x)
    assert b[0, 2].tolist() == [[8.0, 9.0], [8.0, 9.0]]


@pytest.mark.mutation
def test_check_mask_value_tensor_errors():
    x = torch.zeros(2, 3, 2, 2, dtype=torch.float64)
    for bad in (float("nan"), float("inf")):
        mv = torch.zeros(3)
        mv[1] = bad
        with pytest.raises(ValueError, match=whole("baselines contains NaN or inf")):
            inputs.check_mask_value(mv, x)
    with pytest.raises(ValueError, match=whole("a per-image baseline must have the images' shape (2, 3, 2, 2)")):
        inputs.check_mask_value(torch.zeros(2, 3, 1, 2), x)
    with pytest.raises(ValueError, match=whole(
        "baselines of shape (4,) fits neither one channel value per channel, "
        "nor an example (3, 2, 2), nor the batch (2, 3, 2, 2)")):
        inputs.check_mask_value(torch.zeros(4), x)
    with pytest.raises(ValueError, match=whole(
        "baselines of shape (3, 3, 2, 2) fits neither one channel value per channel, "
        "nor an example (3, 2, 2), nor the batch (2, 3, 2, 2)")):
        inputs.check_mask_value(torch.zeros(3, 3, 2, 2), x)


@pytest.mark.mutation
def test_check_mask_value_follows_channels_last_images():
    x = torch.zeros(2, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    for mv in (torch.tensor([1.0, 2.0, 3.0]), torch.ones(2, 3, 2, 2), torch.ones(3, 2, 2)):
        b = inputs.check_mask_value(mv, x)
        assert b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
    # a per-channel view is made contiguous for contiguous images
    b = inputs.check_mask_value(torch.ones(2, 3, 2, 2).contiguous(memory_format=torch.channels_last), x.contiguous())
    assert b.is_contiguous()
    # a 3-D batch is never channels_last
    b = inputs.check_mask_value(torch.tensor([1.0, 2.0]).expand(3, 2), torch.zeros(2, 3, 2))
    assert b.is_contiguous() and b.shape == (1, 3, 2)


# ---------------------------------------------------------------------------- prepare
@pytest.mark.mutation
def test_prepare_default_and_given_features():
    x = torch.arange(24, dtype=torch.float64).view(2, 3, 2, 2)
    prep = inputs.prepare(x)
    assert prep.images is x and prep.num_features == 4 and prep.grid_shape == (2, 2)
    assert prep.feature_map.is_contiguous() and prep.feature_map.dtype == torch.int64
    assert prep.feature_map.tolist() == [[[0, 1], [2, 3]]] * 3
    assert prep.baseline.shape == (1, 3, 2, 2) and not prep.baseline.any()
    assert prep.feature_mask(torch.tensor([3, 0])).tolist() == [[True, False], [False, True]]
    assert prep.feature_mask(torch.tensor([1])).dtype == torch.bool
    assert prep.feature_mask(torch.tensor([], dtype=torch.int64)).tolist() == [[False, False], [False, False]]

    prep = inputs.prepare(x, features=torch.tensor([[0, 1], [1, 0]]), mask_value=torch.tensor([1.0, 2.0, 3.0]))
    assert prep.num_features == 2 and prep.grid_shape == (2,)
    assert prep.feature_map.is_contiguous() and prep.feature_map.tolist() == [[[0, 1], [1, 0]]] * 3
    assert prep.baseline[0, :, 0, 1].tolist() == [1.0, 2.0, 3.0]
    assert prep.feature_mask(torch.tensor([1])).tolist() == [False, True]

    seq = torch.ones(3, 4, 2)  # [N, L, E]: one feature per element
    prep = inputs.prepare(seq, mask_value=7)
    assert prep.num_features == 8 and prep.grid_shape == (4, 2)
    assert prep.feature_map.flatten().tolist() == list(range(8))
    assert prep.baseline.shape == (1, 4, 2) and bool((prep.baseline == 7).all())
    assert prep.feature_mask(torch.tensor([7])).tolist() == [[False, False]] * 3 + [[False, True]]
