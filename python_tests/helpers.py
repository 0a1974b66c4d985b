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
    """A small CNN for [N, C, H, W] inputs (two 3 x 3 convolutions and a linear head, no pooling) whose decision
    depends on where evidence lies, so that the order in which features are masked matters.

    Without biases the all-zero (fully masked) input scores 1/classes for every class, so the empty set is never
    sufficient; ``scale`` sharpens the softmax so that real inputs are confident and SIS exist at tau near 0.9.
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
    """SmallCNN drawn from ``seed`` (torch's global generator), in ``dtype`` and eval mode: the standard planted
    model of the method tests, so that every order, value and set can be compared with the reference
    transcriptions in float64."""
    torch.manual_seed(seed)
    return SmallCNN(**kw).to(dtype).eval()


def make_images(n, c=3, h=5, w=5, seed=1, dtype=torch.float64):
    """``n`` standard-normal images [n, c, h, w] from their own generator (the global one is left alone)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, h, w, generator=g, dtype=dtype)


def cnn64():
    """The ``cnn64`` fixture's model: make_cnn(0) in float64."""
    return make_cnn(0, torch.float64)


def images64():
    """The ``images64`` fixture's images: four 3 x 5 x 5 float64 images for cnn64."""
    return make_images(4)


def tiny_cnn(seed: int, classes: int = 5) -> nn.Module:
    """A seeded CNN of ``classes`` outputs (5 by default; a labelled source's own number where it names classes,
    which an audit checks) for [N, 3, H, W] images of any size (global average pooling to 2 x 2, with biases).

    Plants nothing in particular: a real, small convolutional model that torch.export and ONNX export and
    that the stored audits and the CLI can load from a file, cheap enough for end-to-end runs.
    """
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(24, classes)
    ).eval()


class Calls(nn.Module):
    """``model`` (in eval mode) that keeps the input of every call it gets."""

    def __init__(self, model):
        super().__init__()
        self.model, self.inputs = model, []
        self.eval()

    def forward(self, x):
        self.inputs.append(x.detach().clone())
        return self.model(x)

    def saw_only(self, x):
        """Whether every call's input was made of ``x``'s images alone, unmasked: no candidate was scored."""
        return all(any(torch.equal(row, img) for img in x) for t in self.inputs for row in t.reshape(-1, *x.shape[1:]))


def export_tiny_cnn(path, side: int, seed: int = 3, classes: int = 5) -> str:
    """tiny_cnn(seed, classes) saved with torch.export at ``path`` (a .pt2 file for inputs [B, 3, side, side], B
    dynamic), as the command line loads a model file; returns the path as a string."""
    batch = torch.export.Dim("batch")
    torch.export.save(torch.export.export(tiny_cnn(seed, classes), (torch.zeros(2, 3, side, side),),
                                          dynamic_shapes=({0: batch},)), str(path))
    return str(path)


def seeded(model, seed=0, dtype=torch.float64):
    """``model`` with its weights and batch-norm statistics drawn from ``seed``, in ``dtype`` and eval mode.

    Plants non-trivial batch norms (means, variances and affine terms away from 0 and 1), which a freshly built
    model lacks, so that incremental inference must fold them exactly to match the plain forward pass.
    """
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


class PatchReader(nn.Module):
    """Two classes; class 0 wins when the patch's channel-0 sum reaches ``need`` of its full value.

    Plants known evidence: it reads nothing outside the patch ``[rows, cols]``, so every pixel outside it is
    irrelevant, and on an image of ones its criterion is monotone in the pixels kept; responsibility maps and
    minimal pixel sets must stay inside the patch.
    """

    def __init__(self, rows: slice, cols: slice, need: float = 0.3):
        super().__init__()
        self.rows, self.cols, self.need = rows, cols, need

    def forward(self, x):
        patch = x[:, 0, self.rows, self.cols].flatten(1)
        s = patch.sum(1) - self.need * patch.shape[1]
        return torch.stack([s, torch.zeros_like(s)], 1)


class Dyadic(nn.Module):
    """Two classes, already probabilities: class 0 gets ``bias + sum_j w_j x_j``, class 1 the rest.

    Plants a score that is exact arithmetic: with dyadic weights (sums of powers of 1/2) and inputs in {0, 1},
    every output is exact in float64, so every order, value, set and tie of a search can be worked out by hand.
    ``nan_at``: the score is NaN where it would equal this value (to plant a model that fails on some sets).
    """

    def __init__(self, weights, bias=0.0, nan_at=None):
        super().__init__()
        self.register_buffer("w", torch.as_tensor(weights, dtype=torch.float64).flatten())
        self.bias = bias
        self.nan_at = nan_at

    def forward(self, x):
        s = self.bias + (x.flatten(1) * self.w).sum(1)
        if self.nan_at is not None:
            s = torch.where(s == self.nan_at, torch.full_like(s, float("nan")), s)
        return torch.stack([s, 1 - s], 1)


class LinearDigits(nn.Module):
    """A seeded linear classifier of 8 x 8 digits (64 inputs, 10 logits) standing in for the trained digits CNN.

    ``scale`` sharpens the logits so that its SIS exist at the thresholds the pipelines use; ``seed`` is kept on
    the model, so a test can tell which training call made it.
    """

    def __init__(self, seed=0, scale=8.0):
        super().__init__()
        torch.manual_seed(seed)
        self.head = nn.Linear(64, 10)
        self.seed = seed
        self.scale = scale

    def forward(self, x):
        return self.scale * self.head(x.flatten(1))


class OOMAbove(nn.Module):
    """Wraps ``model``; raises torch.OutOfMemoryError on batches larger than ``limit``, like a GPU that is
    full, and counts the refusals in ``ooms`` (to test that the batch size backs off and the answer is the
    same)."""

    def __init__(self, model, limit):
        super().__init__()
        self.model, self.limit, self.ooms = model, limit, 0

    def forward(self, x):
        if x.shape[0] > self.limit:
            self.ooms += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.model(x)


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
        # any image and feature id passes the callers' index checks (check_candidates); only the device is read
        self.prep = SimpleNamespace(images=torch.zeros(1, device=device).expand(1 << 30), num_features=1 << 30)
        self.runner = SimpleNamespace(chunk=None)  # read by nothing here; wrappers must pass it on
        self.fn = SimpleNamespace(score_top1_margin="score_top1_margin")

    def measuring(self, measure):
        assert measure == "score_top1_margin"
        other = RuleEvaluator(self.rule, margins=True)
        other.seen, other.sets, other.prep = self.seen, self.sets, self.prep
        return other

    def __call__(self, present, image, row, feature, check_indices=None):
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
    """The CandidateEvaluator (score and top-1, targets = the model's top-1 classes) and prepared inputs that the
    responsibility method builds for ``model`` on ``images``, for calling its descents directly."""
    s = job.setup(model, images, 0.9, None, 0.0, "logits", None, "responsibility")
    targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
    return CandidateEvaluator(s.fn, s.prep, targets, s.runner, measure=s.fn.score_and_top1), s.prep


def top1_on(model, image, keep):
    """Plain forward pass: the model's top-1 class on ``image`` with only ``keep`` ([H, W]) present."""
    with torch.no_grad():
        return int(model(torch.where(keep, image, torch.zeros(()))[None]).argmax(1))


def assert_same_result(a, b, exact_values=True, rel=1e-12, atol=0.0, blocks=False):
    """Two SISResults agree: the same target, order (and ``blocks`` when asked), set, mask and threshold; the
    scores to ``rel`` and, with ``exact_values``, the backward-selection values to ``rel`` and ``atol``."""
    assert a.target == b.target
    assert torch.equal(a.order, b.order)
    if blocks:
        assert torch.equal(a.blocks, b.blocks)
    if exact_values:
        torch.testing.assert_close(a.values, b.values, rtol=rel, atol=atol)
    assert (a.sis is None) == (b.sis is None)
    if a.sis is not None:
        assert torch.equal(a.sis, b.sis)
        assert torch.equal(a.mask, b.mask)
        assert a.sis_score == pytest.approx(b.sis_score, rel=rel)
    assert a.score == pytest.approx(b.score, rel=rel)
    assert a.threshold == b.threshold


def kinds(pl) -> dict:
    """{node name: kind} of an incremental plan."""
    return {st.node.name: st.kind for st in pl.steps}


def recording_adam(monkeypatch) -> list[dict]:
    """torch.optim.Adam replaced, for the rest of the test, by a subclass that records the keyword arguments of
    every construction (in order) into the list returned; a positional learning rate fails the comparison."""
    made: list[dict] = []

    class RecordingAdam(torch.optim.Adam):
        def __init__(self, params, **kw):
            made.append(kw)
            super().__init__(params, **kw)

    monkeypatch.setattr(torch.optim, "Adam", RecordingAdam)
    return made


def write_cifar(root, n: int, seed: int = 0, train: tuple[int, ...] = ()) -> np.ndarray:
    """A CIFAR-10 test batch in torchvision's layout (pickled dict, data uint8 [n, 3072]); returns the data. With
    ``train`` (five counts), also the training batches data_batch_1..5 of that many images each (labels (i + 3) %
    10 within each file, data drawn after the test batch's from the same generator)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({"batch_label": "testing batch 1 of 1", "data": data, "labels": [i % 10 for i in range(n)],
                     "filenames": [f"f{i}.png" for i in range(n)]}, fh, protocol=2)
    for b, count in enumerate(train, start=1):
        with open(folder / f"data_batch_{b}", "wb") as fh:
            pickle.dump({"batch_label": f"training batch {b} of 5", "labels": [(i + 3) % 10 for i in range(count)],
                         "data": rng.integers(0, 256, (count, 3072), dtype=np.uint8)}, fh, protocol=2)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({"label_names": [f"class{i}" for i in range(10)], "num_cases_per_batch": n}, fh, protocol=2)
    return data


def run_cli(argv, crash=None, torchrun=0, timeout=120):
    """``python -m overinterp_fast ARGV`` in a subprocess with one thread (or under ``torchrun`` with that many
    processes); ``crash``: the commit hook's "<chunk>:<stage>" (audit.store.CRASH_ENV). Returns the finished
    process (stdout and stderr captured as text)."""
    import os
    import subprocess
    import sys

    from overinterp_fast.audit import store

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(store.CRASH_ENV, None)
    if crash:
        env[store.CRASH_ENV] = crash
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun}"]
                if torchrun else [sys.executable])
    return subprocess.run(launcher + ["-m", "overinterp_fast", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_minimal(model, image, mask, target):
    """The set passes, and removing any single pixel of it breaks the criterion (checked one by one)."""
    assert top1_on(model, image, mask) == target
    for y, x in mask.nonzero().tolist():
        smaller = mask.clone()
        smaller[y, x] = False
        assert top1_on(model, image, smaller) != target, f"pixel ({y}, {x}) can be removed"


def strict_sync(monkeypatch, device) -> list[str]:
    """From now on in the test, the ways the library may make the host wait for a CUDA ``device`` are let
    through and listed: ``runtime.sync.to_host`` (the counted reads, wherever a module imported it), the
    ``rect_fill`` and ``mask_apply`` ops called with their index checks on (``check_indices=True``: one wait per
    call; calls with the checks off are neither listed nor let through), and ``runtime.batching.check_candidates``
    called on tensors (one wait; on host lists and arrays it waits for nothing and is not listed). Returns the
    list of those calls by name ("to_host", "rect_fill", "mask_apply", "check_candidates"), in order. With
    :func:`sync_errors` around a block, any other synchronising call there raises. On the CPU the calls are
    listed all the same."""
    import sys

    from overinterp_fast.ops import kernels
    from overinterp_fast.runtime import batching, sync

    calls: list[str] = []
    cuda = torch.device(device).type == "cuda"

    check_arg = {"rect_fill": 6, "mask_apply": 7}  # position of check_indices

    def let_through(name, fn):
        def run(*args, **kwargs):
            if name in check_arg:
                k = check_arg[name]
                if not kwargs.get("check_indices", args[k] if len(args) > k else True):
                    return fn(*args, **kwargs)  # no check, no wait: not let through
            if name == "check_candidates" and not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values())):
                return fn(*args, **kwargs)  # host values: no wait, not let through
            calls.append(name)
            if not cuda:
                return fn(*args, **kwargs)
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("default")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)
        return run

    for fn_name, owner in (("to_host", sync), ("check_candidates", batching)):
        fn = getattr(owner, fn_name)
        wrapped = let_through(fn_name, fn)
        for name, module in list(sys.modules.items()):
            if name.startswith("overinterp_fast.") and getattr(module, fn_name, None) is fn:
                monkeypatch.setattr(module, fn_name, wrapped)
    for op in ("rect_fill", "mask_apply"):
        monkeypatch.setattr(kernels, op, let_through(op, getattr(kernels, op)))
    return calls


class sync_errors:
    """``with sync_errors(device):`` any call that makes the host wait for a CUDA ``device`` raises in the block
    (torch.cuda.set_sync_debug_mode("error")), but those :func:`strict_sync` lets through; on the CPU, nothing."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        return False


# ---- independent references of the ops (python_tests/ops)


def mask_apply_ref(base, baseline, fm, present, img, row, feat):
    """Element by element, in Python loops: independent of both implementations."""
    out = torch.empty(img.numel(), *base.shape[1:], dtype=base.dtype)
    fm_flat = fm.reshape(-1).tolist()
    for b, (i, r, f) in enumerate(zip(img.tolist(), row.tolist(), feat.tolist())):
        src = base[i].reshape(-1)
        fill = baseline[i if baseline.shape[0] > 1 else 0].reshape(-1)
        dst = out[b].view(-1)
        for e, fid in enumerate(fm_flat):
            dst[e] = src[e] if bool(present[r, fid]) and fid != f else fill[e]
    return out


def backselect_update_ref(scores, rows, counts, steps, remaining, present, order, values):
    for i, count, step in zip(rows.tolist(), counts.tolist(), steps.tolist()):
        cand = [(-scores[i, j].item(), remaining[i, j].item(), j) for j in range(count)]
        _, feature, slot = min(cand)
        order[i, step] = feature
        values[i, step] = scores[i, slot]
        present[i, feature] = False
        remaining[i, slot] = remaining[i, count - 1]
        remaining[i, count - 1] = -1


def block_module(monkeypatch, name: str) -> None:
    """Make ``name`` and its submodules unimportable for the rest of the test, as when its distribution is not
    installed (``sys.modules[...] = None``; submodules an earlier test imported are blocked too)."""
    import sys

    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")] + [name]:
        monkeypatch.setitem(sys.modules, key, None)
