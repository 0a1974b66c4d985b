"""Shared test helpers: the planted models and images, hand-built checks of sets, exact message patterns,
a fake terminal for progress bars, and a stand-in evaluator driven by a rule. Imported as ``from helpers import ...``
(pytest puts python_tests/ on the path; see pyproject.toml)."""
import pickle
import re

import numpy as np

import pytest
import torch
from torch import nn

from overinterp_fast.runtime import job
from overinterp_fast.runtime.batching import CandidateEvaluator
from overinterp_fast.runtime.model import initial_predictions


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


def cnn64():
    return make_cnn(0, torch.float64)


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


def kept_input(image, result, baseline=0.0, features=None):
    """x_S built by hand: ``image`` [*D] with only the features of ``result.sis`` present.

    The SIS's own ids (not its mask) decide what is kept; the mask must agree with them.
    Default features: one per pixel over all channels for [C, H, W], one per element otherwise.
    """
    shape = image.shape
    if features is not None:
        fmap = features.expand(shape).to(torch.int64)
    elif image.dim() == 3:
        fmap = (torch.arange(shape[1] * shape[2]).view(1, shape[1], shape[2])).expand(shape)
    else:
        fmap = torch.arange(image.numel()).view(shape)
    ids = result.sis.tolist()
    assert len(set(ids)) == len(ids), "a feature appears twice in the set"
    assert sorted(result.mask.flatten().nonzero().flatten().tolist()) == sorted(ids), "mask and sis disagree"
    keep = torch.zeros(shape, dtype=torch.bool)
    for j in ids:
        keep |= fmap == j
    b = torch.as_tensor(baseline, dtype=image.dtype)
    if b.dim() == 1 and image.dim() == 3 and b.numel() == shape[0]:
        b = b.view(-1, 1, 1)
    return torch.where(keep, image, b)


def assert_sets_sufficient(model, images, results, *, criterion="threshold", baseline=0.0, features=None,
                           outputs="logits", rel=1e-9):
    """Every set of every image and every collection round, checked by its own forward pass.

    criterion "threshold": f(x_S) >= the result's threshold and ``sis_score`` is that f (to ``rel``);
    "top1": the model's top-1 class on x_S is the result's target. Collection rounds are disjoint.
    Returns the number of sets checked.
    """
    checked = 0
    assert len(results) == images.shape[0]
    for i, r in enumerate(results):
        rounds = r.collection if r.collection is not None else ([r] if r.sis is not None else [])
        if r.collection is not None and r.sis is not None:
            assert rounds and rounds[0] is r
        seen = set()
        for c in rounds:
            assert c.sis is not None
            ids = set(c.sis.tolist())
            assert seen.isdisjoint(ids), f"image {i}: collection rounds overlap"
            seen |= ids
            b = baseline[i] if isinstance(baseline, torch.Tensor) and baseline.dim() == images.dim() else baseline
            x = kept_input(images[i], c, b, features)
            with torch.no_grad():
                out = model(x[None])
                probs = out if outputs == "probabilities" else torch.softmax(out, 1)
            f = float(probs[0, c.target])
            if criterion == "threshold":
                assert f >= c.threshold, f"image {i}: f(x_S) = {f} < tau = {c.threshold}"
            else:
                assert int(out[0].argmax()) == c.target, f"image {i}: x_S does not restore the top-1 class"
            if c.sis_score is not None:
                assert c.sis_score == pytest.approx(f, rel=rel, abs=1e-12), f"image {i}: sis_score is not f(x_S)"
            checked += 1
    return checked


def whole_message(msg: str) -> str:
    """A ``pytest.raises(match=...)`` pattern that matches exactly ``msg`` (anchored, escaped)."""
    return "^" + re.escape(msg) + "$"


class FakeTerminal:
    """A stderr stand-in that says it is a terminal, so tqdm's disable=None shows the bar."""

    def __init__(self):
        self.text: list[str] = []

    def write(self, s):
        self.text.append(s)

    def flush(self):
        pass

    def isatty(self):
        return True

    def last_line(self) -> str:
        """The last line drawn ('' when nothing was)."""
        lines = "".join(self.text).replace("\r", "\n").strip().splitlines()
        return lines[-1] if lines else ""

    def assert_finished_bar(self, shown: bool, label: str, total: int, unit: str) -> None:
        """A bar that ran to the end: nothing drawn when not ``shown``; else the last line is "``label``: 100%",
        "| ``total``/``total`` [" and a rate in ``unit`` (per second or seconds per unit)."""
        if not shown:
            assert "".join(self.text) == ""
            return
        last = self.last_line()
        assert last.startswith(f"{label}: 100%") and f"| {total}/{total} [" in last, last
        assert f"{unit}/s" in last or f"s/{unit}" in last, last


def fake_terminal(monkeypatch) -> FakeTerminal:
    """sys.stderr replaced by a FakeTerminal for the rest of the test (call it in the test's body: pytest's
    output capture sets sys.stderr again between a fixture's set-up and the test)."""
    import sys

    tty = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", tty)
    return tty


def top1(row, f, t):
    """The top-1 criterion as the prefix searches and the pruning take it: ``passes(row, f, top1)``."""
    return bool(t)


class RuleEvaluator:
    """A stand-in CandidateEvaluator whose scores come from a rule written in the test.

    ``evaluator(present [R, p], image [C], row [C], feature [C])`` scores candidate c as the set
    ``present[row[c]]`` without ``feature[c]`` (-1: none; as ``_ops.mask_apply``) of image ``image[c]``:
    ``rule(image, frozenset of feature ids) -> (f, top1)`` or ``(f, top1, margin)``.
    ``seen`` lists (image, number of present features) per candidate, in order; ``sets`` the sets.
    ``measuring(fn.score_top1_margin)`` (what the guided prefix search asks for) gives the same evaluator
    returning (f, top1, margin), recording into the same ``seen``.
    """

    def __init__(self, rule, device="cpu", margins=False):
        from types import SimpleNamespace

        self.rule = rule
        self.margins = margins
        self.seen: list[tuple[int, int]] = []
        self.sets: list[tuple[int, list[int]]] = []
        self.prep = SimpleNamespace(images=torch.zeros(1, device=device))
        self.runner = SimpleNamespace(chunk=None)  # read by nothing here; wrappers must pass it on
        self.fn = SimpleNamespace(score_top1_margin="score_top1_margin")

    def measuring(self, measure):
        assert measure == "score_top1_margin"
        other = RuleEvaluator(self.rule, margins=True)
        other.seen, other.sets, other.prep = self.seen, self.sets, self.prep
        return other

    def __call__(self, present, image, row, feature):
        assert present.dtype == torch.bool and present.dim() == 2, "mask_apply takes bool [R, p] rows"
        f, t, m = [], [], []
        for i, r, drop in zip(image.tolist(), row.tolist(), feature.tolist()):
            ids = frozenset(torch.nonzero(present[r]).flatten().tolist()) - {drop}
            self.seen.append((i, len(ids)))
            self.sets.append((i, sorted(ids)))
            out = self.rule(i, ids)
            f.append(out[0])
            t.append(out[1])
            m.append(out[2] if len(out) > 2 else float("nan"))
        f, t = torch.tensor(f, dtype=torch.float64), torch.tensor(t, dtype=torch.bool)
        return (f, t, torch.tensor(m, dtype=torch.float64)) if self.margins else (f, t)

    def count(self, image: int) -> int:
        return sum(1 for i, _ in self.seen if i == image)


def responsibility_evaluator(model, images):
    s = job.setup(model, images, 0.9, None, 0.0, "logits", None, "responsibility")
    targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
    return CandidateEvaluator(s.fn, s.prep, targets, s.runner, measure=s.fn.score_and_top1), s.prep


class PatchReader(nn.Module):
    """Two classes; class 0 wins when the patch's channel-0 sum reaches ``need`` of its full value.

    Reads nothing outside the patch, so every pixel outside it is irrelevant.
    """

    def __init__(self, rows: slice, cols: slice, need: float = 0.3):
        super().__init__()
        self.rows, self.cols, self.need = rows, cols, need

    def forward(self, x):
        patch = x[:, 0, self.rows, self.cols].flatten(1)
        s = patch.sum(1) - self.need * patch.shape[1]
        return torch.stack([s, torch.zeros_like(s)], 1)


def top1_on(model, image, keep):
    """Plain forward pass: the model's top-1 class on ``image`` with only ``keep`` ([H, W]) present."""
    with torch.no_grad():
        return int(model(torch.where(keep, image, torch.zeros(()))[None]).argmax(1))


def tiny_cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(24, 5)
    ).eval()


def assert_same_result(a, b, exact_values=True):
    assert a.target == b.target
    assert torch.equal(a.order, b.order)
    if exact_values:
        torch.testing.assert_close(a.values, b.values, rtol=1e-12, atol=0)
    assert (a.sis is None) == (b.sis is None)
    if a.sis is not None:
        assert torch.equal(a.sis, b.sis)
        assert torch.equal(a.mask, b.mask)
        assert a.sis_score == pytest.approx(b.sis_score, rel=1e-12)
    assert a.score == pytest.approx(b.score, rel=1e-12)
    assert a.threshold == b.threshold


def seeded(model, seed=0, dtype=torch.float64):
    """Weights and batch-norm statistics drawn from a seed (non-trivial batch norms), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            m.weight.data = torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5
            if m.bias is not None:
                m.bias.data = torch.randn(m.bias.shape, generator=g) * 0.1
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.3, 0.3, generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.uniform_(-0.2, 0.2, generator=g)
    return model.to(dtype).eval()


def kinds(pl) -> dict:
    """{node name: kind} of an incremental plan."""
    return {st.node.name: st.kind for st in pl.steps}


def write_cifar(root, n: int, seed: int = 0) -> np.ndarray:
    """A CIFAR-10 test batch in torchvision's layout (pickled dict, data uint8 [n, 3072]); returns the data."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({"batch_label": "testing batch 1 of 1", "data": data, "labels": [i % 10 for i in range(n)],
                     "filenames": [f"f{i}.png" for i in range(n)]}, fh, protocol=2)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": n}, fh, protocol=2)
    return data


def assert_one_minimal(model, image, mask, target):
    """The set passes, and removing any single pixel of it breaks the criterion (checked one by one)."""
    assert top1_on(model, image, mask) == target
    for y, x in mask.nonzero().tolist():
        smaller = mask.clone()
        smaller[y, x] = False
        assert top1_on(model, image, smaller) != target, f"pixel ({y}, {x}) can be removed"


class OOMAbove(nn.Module):
    """Raises torch.OutOfMemoryError on batches larger than `limit`, like a GPU that is full."""

    def __init__(self, model, limit):
        super().__init__()
        self.model, self.limit, self.ooms = model, limit, 0

    def forward(self, x):
        if x.shape[0] > self.limit:
            self.ooms += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.model(x)
