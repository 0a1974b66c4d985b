"""Shared pieces of the benchmark scripts: the one adapter to the library's short path, configurations,
interleaved timing, the bare forward-pass floor, the machine and versions, and the results files.

Every benchmark calls ``fast_sis`` through :func:`explain` only, so that a change of the library's keywords is
one edit here. The benchmarks use only the public API: the floor is built from plain torch masking
(:func:`candidate_like_batch`) and the batch sizes fast_sis ran are read from outside, with a forward pre-hook
on the model (:class:`RowRecorder`).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from typing import Callable

import torch

import overinterp_fast as of
from overinterp_fast.runtime import graphs, model_state
from overinterp_fast.audit import provenance
from overinterp_fast.zoo.cifar import ResNet20, SmallCNN

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

# ---- the adapter: the only place the benchmarks call fast_sis ----

# fast_sis's own keywords; every other keyword given to explain() is an option of the method
# (exact: incremental; gradient: k, autocast; responsibility: iterations, seed, refine, refine_budget, block,
# monotone, criterion, prefix_search)
OPTIONS = {"exact": of.attr.ExactOptions, "gradient": of.attr.GradientOptions,
           "responsibility": of.attr.MinimalPixelSetOptions}
COMMON_KEYWORDS = frozenset({"target", "baselines", "feature_mask", "collection", "batch_size", "outputs",
                             "show_progress", "engine"})


def explain(model, images: torch.Tensor, threshold: float | None = None, *, method: str = "exact", **keywords) -> list:
    """``fast_sis(model, images, threshold, method=method, ...)`` with progress off unless asked (threshold None:
    0.9 where the method has one; the top-1 criterion has none).

    ``keywords`` mixes fast_sis's own keywords (COMMON_KEYWORDS) and the method's options; they are
    split here: the method's options go to fast_sis as ``options=<the method's options class>(**method_options)``.

    Returns:
        list[SISResult], one per image of ``images`` [N, *D].
    """
    common = {k: v for k, v in keywords.items() if k in COMMON_KEYWORDS}
    method_options = {k: v for k, v in keywords.items() if k not in COMMON_KEYWORDS}
    common.setdefault("show_progress", False)
    options = OPTIONS[method](**method_options) if method_options else None
    return of.fast_sis(model, images, threshold, method=method, options=options, **common)


# ---- configurations ----

CONFIGS = {
    # name: (model factory, image size, patch size, default number of images)
    "cnn8-px": (lambda: SmallCNN(8), 8, 1, 2),  # seconds: for smoke runs
    "cnn16-px": (lambda: SmallCNN(16), 16, 1, 2),
    "cnn32-2x2": (lambda: SmallCNN(32), 32, 2, 1),
    "resnet20-4x4": (ResNet20, 32, 4, 4),
    "cnn32-px": (lambda: SmallCNN(32), 32, 1, 1),
    "resnet20-px": (ResNet20, 32, 1, 1),
    "effnet-32x32": (lambda: _efficientnet_lite0(), 224, 32, 1),
    # the stride-2 CNN (StrideCNN) where forward passes are cheap: 2 images of 12x12 (p = 144), 1 of 24x24
    "stride12-px": (lambda: StrideCNN(), 12, 1, 2),
    "stride24-px": (lambda: StrideCNN(), 24, 1, 1),
    # the loop's own cost: a near-free model (one linear layer on 1-channel images), 64 images of 8x8 (p = 64)
    # and one of 24x24 (p = 576); a fifth entry is the images' channels (default 3)
    "linear8-px": (lambda: NearFree(64), 8, 1, 64, 1),
    "linear24-px": (lambda: NearFree(576), 24, 1, 1, 1),
    # ImageNet scale: Inception-v3 (random weights), 8x8-pixel patches; 299x299 -> 38x38 = 1,444 features and
    # 1,043,290 candidates (a GPU's job); 75x75 (Inception-v3's smallest input) -> 10x10 = 100 features, the
    # same code path at a size two CPU cores finish in about a minute
    "inception-299-8x8": (lambda: _inception_v3(), 299, 8, 1),
    "inception-75-8x8": (lambda: _inception_v3(), 75, 8, 1),
}


class NearFree(torch.nn.Module):
    """A model whose forward pass costs next to nothing: one linear layer on the flattened 1-channel image, 10
    classes, logits x 5 (confident enough for SIS at tau = 0.5)."""

    def __init__(self, inputs: int, classes: int = 10):
        super().__init__()
        self.linear = torch.nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 5 * self.linear(x.flatten(1))


class StrideCNN(torch.nn.Module):
    """3x3 convolutions with padding 1, no biases: 3->16, 16->32 (stride 2), 32->64 (stride 2), each followed by
    ReLU; global average pooling; a linear layer to 10 classes; logits x 20 (confident enough for SIS)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        conv = lambda cin, cout, stride: torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)  # noqa: E731
        self.net = torch.nn.Sequential(
            conv(3, 16, 1), torch.nn.ReLU(), conv(16, 32, 2), torch.nn.ReLU(), conv(32, 64, 2), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, classes, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 20 * self.net(x)


def _inception_v3():
    from torchvision.models import inception_v3

    return inception_v3(weights=None, aux_logits=False, init_weights=True)


def _efficientnet_lite0():
    from overinterp_fast.zoo.imagenet import load_efficientnet_lite

    return load_efficientnet_lite(0)


def patch_map(size: int, patch: int) -> torch.Tensor | None:
    """Feature map int64 [size, size] of square patches, the last row and column of patches cut short where
    ``patch`` does not divide ``size`` (None for pixels)."""
    if patch == 1:
        return None
    r = torch.arange(size) // patch
    return r.view(-1, 1) * -(-size // patch) + r.view(1, -1)


def make_case(name: str, n_images: int | None, device, dtype=torch.float32):
    """(model, images [N, C, S, S], features [S, S] or None, p) for a configuration, seeded."""
    factory, size, patch, default_n, *rest = CONFIGS[name]
    channels = rest[0] if rest else 3
    n = n_images or default_n
    torch.manual_seed(0)
    model = factory().to(device=device, dtype=dtype).eval()
    images = torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(1),
                         dtype=dtype).to(device)
    return model, images, patch_map(size, patch), (-(-size // patch)) ** 2


# ---- the bare forward passes ----

def candidate_like_batch(images: torch.Tensor, features: torch.Tensor | None, batch: int, seed: int = 0) -> torch.Tensor:
    """A batch [batch, *D] of inputs like backward selection's candidates, built once for floor timings.

    Row b is image b % N with a random present-set (each feature present with probability u_b,
    u_b uniform in [0, 1]: candidates range from almost whole to almost empty) and the rest at 0.
    Not one repeated image: on the CPU a batch of identical rows runs about 25% faster (ReLU and
    max-pool branch prediction), which would flatter the floor.
    """
    n, (h, w) = images.shape[0], images.shape[-2:]
    fmap = (torch.arange(h * w).view(h, w) if features is None else features).to(images.device)
    p = int(fmap.max()) + 1
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(batch, 1, generator=g)
    present = (torch.rand(batch, p, generator=g) < u).to(images.device)
    keep = present[:, fmap.flatten()].view(batch, 1, h, w)
    return torch.where(keep, images[torch.arange(batch) % n], torch.zeros((), dtype=images.dtype, device=images.device))


def ceiling(model: Callable, images: torch.Tensor, features: torch.Tensor | None, sizes: list[int], device,
            min_s: float = 0.2, min_calls: int = 3) -> dict[int, float]:
    """The model's bare rate: {batch size: rows per second of plain forward passes and softmax} on candidate-like
    inputs (:func:`candidate_like_batch`, built once at the largest size), per size one untimed call, then calls
    until ``min_s`` seconds and ``min_calls`` calls have passed. A size that runs out of memory ends the sweep."""
    x = candidate_like_batch(images, features, max(sizes))
    rates = {}
    for b in sorted(sizes):
        try:
            floor_run(model, x, [b])
            sync(device)
            calls, t0 = 0, time.perf_counter()
            while calls < min_calls or time.perf_counter() - t0 < min_s:
                floor_run(model, x, [b])
                calls += 1
            sync(device)
            rates[b] = b * calls / (time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            break
    return rates


def batches(rows: int, batch: int) -> list[int]:
    """``rows`` split into calls of ``batch`` rows (the last one shorter)."""
    return [batch] * (rows // batch) + ([rows % batch] if rows % batch else [])


def floor_run(model: Callable, x: torch.Tensor, calls: list[int]) -> None:
    """The forward passes (and softmax) that cannot be avoided: one call of ``x[:r]`` per r in ``calls``."""
    with torch.inference_mode():
        for r in calls:
            torch.softmax(model(x[:r]), 1)


class RowRecorder:
    """Records the rows of every forward call of a torch module (a forward pre-hook), inside a ``with``.

    Observes the batches fast_sis gives the model from outside; the model is not wrapped, so what the
    library decides about it does not change. Calls of a copy the library made of the model for a job (its
    channels_last or low-precision copy, which shares the model's kept state) are the model's calls too: the
    hook is a global one (``torch.nn.modules.module.register_module_forward_pre_hook``) that keeps the model's
    and its copies' calls, so a copy made before or during the ``with`` holds no hook of its own afterwards.
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.rows: list[int] = []
        self._handle = None

    def _hook(self, module, args):
        if args and torch.is_tensor(args[0]) and model_state.made_from(module, self.module):
            self.rows.append(int(args[0].shape[0]))

    def __enter__(self) -> "RowRecorder":
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()

    def largest(self) -> int | None:
        """The most rows in one call (the batch size, when the job filled one), None when nothing was called."""
        return max(self.rows) if self.rows else None


@contextlib.contextmanager
def graphs_off():
    """CUDA graphs off inside the ``with`` (OVERINTERP_FAST_CUDA_GRAPHS=0), restored after."""
    saved = os.environ.get(graphs.ENV_VAR)
    os.environ[graphs.ENV_VAR] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(graphs.ENV_VAR, None)
        else:
            os.environ[graphs.ENV_VAR] = saved


def eager_rows(model: torch.nn.Module, fn: Callable):
    """(rows of every forward call ``fn()`` makes of ``model``, fn's result), recorded with CUDA graphs off.

    A replayed CUDA graph runs the model's kernels without calling the module, so its hooks miss every replayed
    call: a floor recorded with graphs on counts only the calls made while graphs were captured. With graphs off
    every call reaches the module (same batches, same results; only slower on a GPU).
    """
    with graphs_off(), RowRecorder(model) as rec:
        res = fn()
    return rec.rows, res


def same_sis(a: list, b: list) -> bool:
    """Two lists of SISResult with the same SIS (or both none) for every image."""
    return len(a) == len(b) and all(
        (x.sis is None) == (y.sis is None) and (x.sis is None or torch.equal(x.sis.cpu(), y.sis.cpu()))
        for x, y in zip(a, b))


# ---- timing ----

def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable, device):
    """(seconds, result) of fn(), synchronising the device around it."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def interleaved(contenders: dict[str, Callable], rounds: int, device, label: str = "",
                on_result: Callable | None = None) -> tuple[dict, dict]:
    """Each contender once per round, the order rotated every round (timings on shared machines drift).

    ``on_result(name, round, seconds, result)``, when given, runs after each run (e.g. to save what was measured).
    Returns (times: name -> [seconds per round], outputs: name -> the last result).
    """
    names = list(contenders)
    times = {k: [] for k in names}
    outputs = {}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t, outputs[k] = timed(contenders[k], device)
            times[k].append(t)
            print(f"  {label} round {r} {k:<14} {t:9.3f} s", file=sys.stderr, flush=True)
            if on_result is not None:
                on_result(k, r, t, outputs[k])
    return times, outputs


def fresh_process(code: str, *argv: str, env: dict | None = None) -> tuple[dict, float]:
    """Run ``code`` in a fresh Python (the benchmarks folder and the repository importable) and parse the JSON
    of its last output line. Returns (that record, the process's wall time in seconds)."""
    path = os.pathsep.join([HERE, ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"fresh process failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1]), wall


# ---- machine, versions, results ----

def machine(device) -> dict:
    """CPU model and flags, cores, torch threads, and the GPU of ``device`` when it is one."""
    info = {"cpu": platform.processor() or platform.machine(), "arch": platform.machine(),
            "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        with open("/proc/cpuinfo") as fh:
            lines = fh.read().splitlines()
        info["cpu"] = next(l.split(":", 1)[1].strip() for l in lines if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in lines if l.startswith("flags"))
        info["cpu_bf16"] = sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile", "amx_fp16"))
    except (OSError, StopIteration):
        pass
    if hasattr(os, "sched_getaffinity"):
        info["usable_cores"] = len(os.sched_getaffinity(0))
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def versions(device) -> dict:
    """python, torch, overinterp_fast (and whether its compiled ops loaded), CUDA, onnxruntime
    (:func:`overinterp_fast.audit.provenance.versions`)."""
    return provenance.versions(device)


def source_commit() -> str:
    """The full hash of the code measured, with ``-dirty`` when tracked code differs from it
    (:func:`overinterp_fast.audit.provenance.source_commit`: ``$OVERINTERP_FAST_COMMIT`` where set, as on a copy of
    the tree without its ``.git``). Read once per process, at the first write: a run records the code it started
    with."""
    return provenance.source_commit()


def results_path(name: str, device) -> str:
    """benchmarks/results/<name>-<device type>.json"""
    return os.path.join(RESULTS, f"{name}-{torch.device(device).type}.json")


def write_results(name: str, device, rows: list[dict], out: str | None = None, **extra) -> str:
    """Write {benchmark, commit, device, machine, versions, command, date, rows, **extra} to ``out`` (default
    results_path)."""
    path = out or results_path(name, device)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {"benchmark": name, "commit": source_commit(), "device": str(device), "machine": machine(device), "versions": versions(device),
           "command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d"), "rows": rows, **extra}
    extra_versions = doc.pop("extra_versions", None)
    if extra_versions:
        doc["versions"].update(extra_versions)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    return path
