"""zoo/digits.py and zoo/cifar.py checked by hand: the digits split and normalization against sklearn's own
arrays, the training loop's batches, accuracy, the architectures' parameter counts and ResNet-20's zero-padded
shortcut.

Every test here is marked ``mutation``: each was written for a survivor of a mutation run (mutmut) and pins,
with its expectation worked out by hand, a detail that the behavioural tests let through.
"""
import pytest
import torch
from torch import nn
from overinterp_fast.zoo import cifar, digits
from helpers import recording_adam


@pytest.mark.mutation
def test_load_digits_split_and_normalization():
    from sklearn.datasets import load_digits as sk

    raw = torch.tensor(sk().images, dtype=torch.float32)
    d = digits.load_digits()
    assert (len(d.y_test), len(d.y_train)) == (449, 1348)  # round(0.25 x 1797) = 449 test scans
    assert d.x_train.shape == (1348, 1, 8, 8) and d.x_test.shape == (449, 1, 8, 8) and d.raw_test.shape == (449, 8, 8)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    # the normalization is the training images' own: mean 0 and std 1 on them
    assert float(d.x_train.mean()) == pytest.approx(0.0, abs=1e-5)
    assert float(d.x_train.std()) == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(d.x_test[:, 0] * d.std + d.mean, d.raw_test / 16.0, rtol=0, atol=1e-6)
    # the raw scans are sklearn's, and train and test are disjoint and cover them all
    rows = {tuple(r.flatten().tolist()) for r in raw}
    assert all(tuple(r.flatten().tolist()) in rows for r in d.raw_test)
    # mean and std of the training pixels, from sklearn's sums minus the test scans' (float64)
    all16, test16 = raw.double() / 16, d.raw_test.double() / 16
    n = 1348 * 64
    mean = (all16.sum() - test16.sum()) / n
    var = ((all16 ** 2).sum() - (test16 ** 2).sum() - n * mean ** 2) / (n - 1)
    assert d.mean == pytest.approx(float(mean), abs=1e-6) and d.std == pytest.approx(float(var.sqrt()), abs=1e-6)
    assert sorted(d.y_train.tolist() + d.y_test.tolist()) == sorted(sk().target.tolist())
    # a seeded split: the same seed gives the same split, another seed another; test_fraction sizes the test set
    assert torch.equal(digits.load_digits(seed=0).y_test, d.y_test)
    other = digits.load_digits(seed=1)
    assert not torch.equal(other.y_test, d.y_test) and len(other.y_test) == 449
    assert len(digits.load_digits(test_fraction=0.1).y_test) == 180  # round(179.7)


@pytest.mark.mutation
def test_digits_cnn_shape_and_parameters():
    m = digits.DigitsCNN()
    assert m(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    # conv 1->16 (160), conv 16->32 (4,640), linear 32 x 4 x 4 -> 10 (5,130)
    assert sum(p.numel() for p in m.parameters()) == 160 + 4640 + 5130
    assert sum(p.numel() for p in digits.DigitsCNN(width=4).parameters()) == 40 + 296 + 1290


@pytest.mark.mutation
def test_train_digits_cnn_batches_and_determinism(monkeypatch):
    d = digits.load_digits()
    small = digits.DigitsData(d.x_train[:130], d.y_train[:130], d.x_test, d.y_test, d.raw_test, d.mean, d.std)
    batches = []
    real = nn.functional.cross_entropy

    def recording(logits, y):
        batches.append(y.clone())
        return real(logits, y)

    monkeypatch.setattr(nn.functional, "cross_entropy", recording)
    m = digits.train_digits_cnn(small, epochs=2, seed=3)
    assert not m.training and isinstance(m, digits.DigitsCNN)
    assert [len(b) for b in batches] == [64, 64, 2, 64, 64, 2]  # batch 64, every image once per epoch
    for epoch in (batches[:3], batches[3:]):
        assert sorted(torch.cat(epoch).tolist()) == sorted(small.y_train.tolist())
    assert not torch.equal(torch.cat(batches[:3]), torch.cat(batches[3:]))  # reshuffled every epoch
    again = digits.train_digits_cnn(small, epochs=2, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), again.state_dict().values()))
    other = digits.train_digits_cnn(small, epochs=2, seed=4)
    assert not torch.equal(m.head.weight, other.head.weight)
    torch.manual_seed(3)
    untrained = digits.DigitsCNN(8)
    zero = digits.train_digits_cnn(small, epochs=0, seed=3, width=8)
    assert all(torch.equal(a, b) for a, b in zip(untrained.state_dict().values(), zero.state_dict().values()))
    # the learning rate is used: a tiny one barely moves the weights, the default moves them more
    slow = digits.train_digits_cnn(small, epochs=1, seed=3, lr=1e-7)
    fast = digits.train_digits_cnn(small, epochs=1, seed=3)
    torch.manual_seed(3)
    start = digits.DigitsCNN()
    assert (slow.head.weight - start.head.weight).abs().max() < 1e-5
    assert (fast.head.weight - start.head.weight).abs().max() > 1e-3


@pytest.mark.mutation
def test_accuracy_by_hand():
    class Fixed(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :3]

    x = torch.tensor([[3.0, 1, 2], [0, 5, 1], [1, 0, 9], [2, 8, 0]]).view(4, 1, 1, 3)
    assert digits.accuracy(Fixed(), x, torch.tensor([0, 1, 1, 0])) == 0.5
    assert digits.accuracy(Fixed(), x, torch.tensor([0, 1, 2, 1])) == 1.0
    assert isinstance(digits.accuracy(Fixed(), x, torch.tensor([0, 1, 2, 1])), float)


@pytest.mark.mutation
def test_cifar_small_cnn_by_hand():
    m = cifar.SmallCNN()
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    # 3->16 (448), 16->32 (4,640), 32->32 (9,248), linear 32 x 8 x 8 -> 10 (20,490)
    assert sum(p.numel() for p in m.parameters()) == 448 + 4640 + 9248 + 20490
    m = cifar.SmallCNN(size=16, classes=4, channels=1)
    assert m(torch.zeros(1, 1, 16, 16)).shape == (1, 4)
    assert sum(p.numel() for p in m.parameters()) == 160 + 4640 + 9248 + (32 * 16 * 4 + 4)


@pytest.mark.mutation
def test_resnet20_parameters_and_shape():
    m = cifar.ResNet20().eval()
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    # stem 432 + 32; stage 1: 3 x (2 x 2,304 + 64); stage 2: 4,608 + 9,216 + 128, then 2 x (2 x 9,216 + 128);
    # stage 3: 18,432 + 36,864 + 256, then 2 x (2 x 36,864 + 256); head 650: 269,722 (the paper's 0.27M)
    assert sum(p.numel() for p in m.parameters()) == 269_722
    assert cifar.ResNet20(classes=3)(torch.zeros(1, 3, 32, 32)).shape == (1, 3)
    strides = [b.stride for b in m.layers]
    assert strides == [1, 1, 1, 2, 1, 1, 2, 1, 1]


def _zero_block(cin, cout, stride):
    b = cifar._Block(cin, cout, stride).eval()
    with torch.no_grad():
        b.conv1.weight.zero_()
        b.conv2.weight.zero_()
    return b  # the residual branch is 0 (batch norm's shift is 0): the block is relu(shortcut)


@pytest.mark.mutation
def test_block_shortcut_pads_channels_and_subsamples():
    x = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    out = _zero_block(3, 8, 1)(x)  # 5 new channels: 2 zero channels before, 3 after
    assert out.shape == (1, 8, 4, 4)
    assert (out[:, :2] == 0).all() and (out[:, 5:] == 0).all()
    torch.testing.assert_close(out[:, 2:5], torch.relu(x), rtol=0, atol=0)
    out = _zero_block(3, 3, 2)(x)  # same channels, stride 2: every second row and column
    torch.testing.assert_close(out, torch.relu(x[:, :, ::2, ::2]), rtol=0, atol=0)
    out = _zero_block(3, 3, 1)(x)  # identity shortcut
    torch.testing.assert_close(out, torch.relu(x), rtol=0, atol=0)
    out = _zero_block(2, 6, 2)(x[:, :2])
    assert out.shape == (1, 6, 2, 2) and (out[:, :2] == 0).all() and (out[:, 4:] == 0).all()
    torch.testing.assert_close(out[:, 2:4], torch.relu(x[:, :2, ::2, ::2]), rtol=0, atol=0)


@pytest.mark.mutation
def test_digits_cnn_layers():
    m = digits.DigitsCNN()
    assert [type(layer) for layer in m.features] == [nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.MaxPool2d]
    assert m.features[0].padding == (1, 1) and m.features[2].padding == (1, 1) and m.features[4].kernel_size == 2


@pytest.mark.mutation
def test_train_digits_cnn_defaults(monkeypatch):
    losses = []
    adam = recording_adam(monkeypatch)
    real = nn.functional.cross_entropy
    monkeypatch.setattr(nn.functional, "cross_entropy", lambda logits, y: losses.append(len(y)) or real(logits, y))
    d = digits.load_digits()
    small = digits.DigitsData(d.x_train[:10], d.y_train[:10], d.x_test, d.y_test, d.raw_test, d.mean, d.std)
    m = digits.train_digits_cnn(small)
    assert adam == [{"lr": 3e-3}] and losses == [10] * 15  # 15 epochs of one batch
    assert sum(p.numel() for p in m.parameters()) == 160 + 4640 + 5130  # width 16
    seeded = digits.train_digits_cnn(small, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), seeded.state_dict().values()))


def _shapes(model, x):
    """Output shape of every direct child layer (SmallCNN's net, ResNet-20's stem and blocks) on ``x``."""
    shapes = []
    layers = list(model.net) if hasattr(model, "net") else [model.conv, *model.layers]
    hooks = [m.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape))) for m in layers]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return shapes


@pytest.mark.mutation
def test_cifar_layers_keep_their_sizes():
    m = cifar.SmallCNN()
    assert [type(layer) for layer in m.net] == [nn.Conv2d, nn.ReLU, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Conv2d,
                                                nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Linear]
    assert _shapes(m, torch.zeros(1, 3, 32, 32)) == [
        (1, 16, 32, 32), (1, 16, 32, 32), (1, 32, 32, 32), (1, 32, 32, 32), (1, 32, 16, 16), (1, 32, 16, 16),
        (1, 32, 16, 16), (1, 32, 8, 8), (1, 2048), (1, 10)]
    r = cifar.ResNet20().eval()
    # the stem keeps 32 x 32; stages of 16, 32 and 64 channels at 32, 16 and 8 pixels
    assert _shapes(r, torch.zeros(1, 3, 32, 32)) == [(1, 16, 32, 32)] + [(1, 16, 32, 32)] * 3 + \
        [(1, 32, 16, 16)] * 3 + [(1, 64, 8, 8)] * 3
