"""Inputs checked before any work, in the Python API: a model that ends in a softmax (outputs="logits" refused,
outputs="probabilities" its own f), the converse, a wrong channel count (one line naming the shape given, never
the padded batch's), and a threshold given with the top-1 criterion; each before any model call on a candidate."""
import re

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.attr import ExactSIS, GradientSIS, MinimalPixelSet, Responsibility, SufficientSubset
from overinterp_fast.runtime.model import check_output_kind, layer_mismatch
from helpers import Calls, assert_sets_sufficient, whole_message

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def net(classes=5, channels=3, seed=0):
    """A seeded CNN for [N, channels, H, W] images of any size (its first layer: conv '0')."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(channels, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                         nn.Linear(24, classes)).eval()


def images(n=2, c=3, side=4, seed=1):
    return torch.randn(n, c, side, side, generator=torch.Generator().manual_seed(seed))


SOFTMAX = ("the model's outputs are probabilities already (on the 2 inputs every row lies in [0, 1] and sums to 1: "
           "a final softmax?), and outputs='logits' would take their softmax again; pass outputs='probabilities' "
           "(--outputs probabilities), or the model without its softmax")


# ---------------------------------------------------------------------------------------------- outputs

@pytest.mark.parametrize("run", [
    lambda m, x: ExactSIS(m).find_sis(x),
    lambda m, x: of.fast_sis(m, x),
    lambda m, x: of.fast_sis(m, x, method="gradient"),
    lambda m, x: MinimalPixelSet(m).find_sis(x),
    lambda m, x: of.responsibility(m, x),
    lambda m, x: SufficientSubset(m).find_sis(x, torch.rand(2, 16)),
], ids=["ExactSIS", "fast_sis", "gradient", "MinimalPixelSet", "responsibility", "SufficientSubset"])
def test_a_softmax_ending_model_is_refused_after_its_first_pass_alone(run):
    """Every method: one line, and the model called once, on the images (their first pass), before any
    candidate (exact SIS measured its memory format on candidate batches before it took the first pass)."""
    model, x = Calls(nn.Sequential(net(), nn.Softmax(1))), images()
    with pytest.raises(ValueError, match=whole_message(SOFTMAX)):
        run(model, x)
    assert len(model.inputs) == 1 and model.saw_only(x)


def test_outputs_probabilities_takes_a_softmax_model_as_it_is():
    """f(x) of the softmax-ending model with outputs="probabilities" is its own output (by hand: the logits' model's
    softmax), where outputs="logits" took the softmax twice (the 0.153 against 0.536 of a ResNet-20)."""
    x = images()
    with torch.no_grad():
        want = torch.softmax(net()(x), 1).max(1)
    got = ExactSIS(nn.Sequential(net(), nn.Softmax(1)).eval(), outputs="probabilities", threshold=0.3).find_sis(x)
    assert [r.target for r in got] == want.indices.tolist()
    assert [r.score for r in got] == pytest.approx(want.values.double().tolist(), rel=1e-6)


def test_outputs_probabilities_refuses_logits():
    with pytest.raises(ValueError, match=r"^outputs='probabilities', but the model's outputs on the inputs lie in "
                                         r"\[-?[0-9.]+, -?[0-9.]+\], not in \[0, 1\] \(logits\?\); pass "
                                         r"outputs='logits' \(the default\), or a model that returns probabilities$"):
        of.fast_sis(net(), images(), outputs="probabilities")


def test_check_output_kind_by_hand():
    probs = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    with pytest.raises(ValueError, match="^the model's outputs are probabilities already"):
        check_output_kind(probs, "logits")
    check_output_kind(probs, "probabilities")
    check_output_kind(torch.tensor([[0.25, 0.70], [1.0, 0.0]]), "logits")   # a row summing to 0.95: logits
    check_output_kind(torch.tensor([[0.25, 0.75], [1.0, 0.5]]), "logits")   # one row not a distribution
    check_output_kind(torch.tensor([[1.0], [1.0]]), "logits")                # one class: its softmax is 1 anyway
    check_output_kind(torch.tensor([[0.5, 0.5 + 5e-6]]), "probabilities")   # rounding: within 1e-5
    with pytest.raises(ValueError, match="^the model's outputs are probabilities already"):
        check_output_kind(torch.tensor([[0.5, 0.5 + 5e-6]]), "logits")
    # a bfloat16 softmax sums to 1 only to its own precision (2 ** -7 here), and is still refused
    low = torch.tensor([[0.1, 0.2, 0.3, 0.4 + 2 ** -7]], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^the model's outputs are probabilities already"):
        check_output_kind(low, "logits")
    check_output_kind(torch.tensor([[0.1, 0.2, 0.3, 0.4 + 2 ** -5]], dtype=torch.bfloat16), "logits")
    with pytest.raises(ValueError, match=r"^outputs='probabilities', but the model's outputs on the inputs lie in "
                                         r"\[-0\.5, 1\.5\]"):
        check_output_kind(torch.tensor([[-0.5, 1.5]]), "probabilities")


# ---------------------------------------------------------------------------------------------- channels

CHANNELS = ("the model fails on the inputs, shape [2, 1, 8, 8]: its first layer, Conv2d 'model.0', takes 3 channels; "
            "the inputs have 1")


@pytest.mark.parametrize("run", [
    lambda m, x: ExactSIS(m).find_sis(x),
    lambda m, x: of.fast_sis(m, x),
    lambda m, x: MinimalPixelSet(m).find_sis(x),
    lambda m, x: of.fast_sis(m, x, method="responsibility"),
], ids=["ExactSIS", "fast_sis", "MinimalPixelSet", "fast_sis-responsibility"])
def test_a_wrong_channel_count_is_one_line_naming_the_shape_given(run):
    """The first layer's channels against the images' (minimal pixel sets pad their first call to 16 rows: the
    padded shape [16, 1, 8, 8] is never named)."""
    model, x = Calls(net()), images(c=1, side=8)
    with pytest.raises(ValueError, match=whole_message(CHANNELS)):
        run(model, x)
    assert model.inputs and model.saw_only(x)


def test_a_model_whose_first_layer_cannot_be_read_names_the_shape_given():
    """A callable (no modules to read): the model's own error, from a call of the inputs as given (not of the
    padded batch that failed), in one line."""
    inner = net()

    def model(x):
        return inner(x)

    with pytest.raises(ValueError) as info:
        MinimalPixelSet(model).find_sis(images(c=1, side=8))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the model fails on the inputs, shape [2, 1, 8, 8]: RuntimeError: ")
    shapes = re.findall(r"\[(\d+), 1, 8, 8\]", message)
    assert shapes and set(shapes) == {"2"}  # torch's own message names the 2 rows given, never 16


def test_layer_mismatch_reads_convolutions_and_linear_layers():
    assert layer_mismatch(net(), images()) is None
    assert layer_mismatch(net(), images(c=4)) == "its first layer, Conv2d '0', takes 3 channels; the inputs have 4"
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(48, 3))
    assert layer_mismatch(mlp, images()) is None                  # 3 x 4 x 4 = 48 elements per input
    assert layer_mismatch(mlp, images(c=1)) == ("its first layer, Linear '1', takes 48 input features; an input "
                                                "holds 16")
    assert layer_mismatch(nn.Linear(4, 3), images()) is None      # on the last dimension
    assert layer_mismatch(lambda x: x, images()) is None          # nothing to read
    assert layer_mismatch(nn.Sequential(nn.LazyConv2d(4, 3)), images()) is None
    assert layer_mismatch(net(), torch.randn(2, 16)) == ("its first layer, Conv2d '0', takes inputs [N, C, H, W] of "
                                                         "3 channels")


def test_the_images_without_a_batch_dimension_keep_their_own_message():
    with pytest.raises(ValueError, match=r"^images must have a batch dimension: pass images\[None\]"):
        ExactSIS(net()).find_sis(images(n=1)[0])


# ---------------------------------------------------------------------------------------------- criterion

TOP1 = ("{where}: a threshold applies with criterion='threshold' (f(x_S) >= tau); the criterion is 'top1' (the set "
        "restores the top-1 class, as ReX), which has no threshold: give {switch} with it, or leave threshold out")


def test_a_threshold_with_the_top1_criterion_is_refused():
    """MinimalPixelSet(model, threshold=0.5) found top-1 sets with f(x_S) = 0.382 and reported threshold 0.5."""
    model = net()
    for cls in (MinimalPixelSet, Responsibility):
        with pytest.raises(ValueError, match=whole_message(TOP1.format(where=cls.__name__,
                                                                       switch="criterion='threshold'"))):
            cls(model, threshold=0.5)
        cls(model)                                  # top-1, no threshold
        cls(model, criterion="threshold")           # tau 0.9
    with pytest.raises(ValueError, match=whole_message(TOP1.format(where="SufficientSubset",
                                                                   switch="criterion='threshold'"))):
        SufficientSubset(model, threshold=0.5, criterion="top1")
    switch = "options=MinimalPixelSetOptions(criterion='threshold')"
    with pytest.raises(ValueError, match=whole_message(TOP1.format(where='method="responsibility"', switch=switch))):
        of.fast_sis(model, images(), 0.5, method="responsibility")
    with pytest.raises(ValueError, match=whole_message(TOP1.format(where='method="responsibility"', switch=switch))):
        of.fast_sis(model, images(), 0.5, method="responsibility", options=of.MinimalPixelSetOptions(iterations=2))
    with pytest.raises(ValueError, match=whole_message(TOP1.format(where="responsibility",
                                                                   switch="criterion='threshold'"))):
        of.responsibility(model, images(), threshold=0.5)


def test_the_threshold_criterion_keeps_its_threshold():
    """With criterion="threshold" every set reaches its threshold, checked by its own forward pass."""
    model, x = net(seed=2), images(n=2, side=8, seed=3)
    with torch.no_grad():
        f = torch.softmax(model(x), 1).max(1).values
    tau = float(f.min()) * 0.8
    sets = MinimalPixelSet(model, criterion="threshold", threshold=tau, iterations=2).find_sis(x)
    assert [r.threshold for r in sets] == [tau, tau]
    assert assert_sets_sufficient(model, x, sets) == 2
    same = of.fast_sis(model, x, tau, method="responsibility",
                       options=of.MinimalPixelSetOptions(criterion="threshold", iterations=2))
    assert [r.sis.tolist() for r in same] == [r.sis.tolist() for r in sets]


def test_methods_without_a_criterion_keep_the_default_threshold():
    model, x = net(), images()
    assert [r.threshold for r in of.fast_sis(model, x)] == [0.9, 0.9]
    assert [r.threshold for r in GradientSIS(model).find_sis(x)] == [0.9, 0.9]
    assert [r.threshold for r in MinimalPixelSet(model, iterations=2).find_sis(x)] == [0.9, 0.9]
