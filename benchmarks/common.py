"""Shared pieces of the benchmark scripts: configurations, timing, environment, results files."""
from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch

from overinterp_fast.zoo.cifar import ResNet20, SmallCNN

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

CONFIGS = {
    # name: (model factory, image size, patch size, default number of images)
    "cnn16-px": (lambda: SmallCNN(16), 16, 1, 2),
    "cnn32-2x2": (lambda: SmallCNN(32), 32, 2, 1),
    "resnet20-4x4": (ResNet20, 32, 4, 4),
    "cnn32-px": (lambda: SmallCNN(32), 32, 1, 1),
    "resnet20-px": (ResNet20, 32, 1, 1),
    "effnet-32x32": (lambda: _efficientnet_lite0(), 224, 32, 1),
}


def _efficientnet_lite0():
    from overinterp_fast.zoo.imagenet import load_efficientnet_lite

    return load_efficientnet_lite(0)


def patch_map(size: int, patch: int) -> torch.Tensor | None:
    """Feature map of square patches (None for pixels)."""
    if patch == 1:
        return None
    r = torch.arange(size) // patch
    return r.view(-1, 1) * (size // patch) + r.view(1, -1)


def make_case(name: str, n_images: int | None, device, dtype=torch.float32):
    """(model, images, features, p) for a configuration, seeded."""
    factory, size, patch, default_n = CONFIGS[name]
    n = n_images or default_n
    torch.manual_seed(0)
    model = factory().to(device=device, dtype=dtype).eval()
    images = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    return model, images, patch_map(size, patch), (size // patch) ** 2


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


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    """(seconds, result) of fn(), synchronising the device around it."""
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def environment(device) -> dict:
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "cpu": platform.processor(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        with open("/proc/cpuinfo") as fh:
            info = fh.read().splitlines()
        env["cpu"] = next(l.split(":", 1)[1].strip() for l in info if l.startswith("model name"))
        flags = next(l.split(":", 1)[1].split() for l in info if l.startswith("flags"))
        env["cpu_bf16"] = sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile", "amx_fp16"))
    except (OSError, StopIteration):
        pass
    if torch.device(device).type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return env


def write_results(name: str, device, rows: list[dict], out: str | None = None) -> str:
    path = out or os.path.join(RESULTS, f"{name}_{torch.device(device).type}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"benchmark": name, "environment": environment(device),
                   "command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d"),
                   "rows": rows}, fh, indent=1)
    return path
