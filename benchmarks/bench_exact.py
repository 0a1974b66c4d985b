"""Exact SIS: fast_sis against the in-package reference and against the floor, in one run.

floor = the bare forward passes of the same number of candidates, in batches of
the size fast_sis used, on inputs built once (no masking, no bookkeeping).

    .venv/bin/python benchmarks/bench_exact.py            # CPU table, writes benchmarks/results/
    .venv/bin/python benchmarks/bench_exact.py --device cuda

Configs (CPU, 2 cores, sized to finish in minutes):
  cnn16-px     small CNN, 16x16, one feature per pixel (p = 256)
  cnn32-2x2    small CNN, 32x32, 2x2 patches (p = 256)
  resnet20-4x4 ResNet-20, 32x32, 4x4 patches (p = 64)
  cnn32-px     small CNN, 32x32, pixels (p = 1024; --full only: about 4 min per run on 2 cores)
  resnet20-px  ResNet-20, 32x32, pixels (p = 1024; --full only)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time

import torch

import overinterp_fast as of
from overinterp_fast.batching import auto_batch_size
from overinterp_fast.zoo.cifar import ResNet20, SmallCNN

CONFIGS = {
    # name: (model factory, image size, patch size, default images)
    "cnn16-px": (lambda: SmallCNN(16), 16, 1, 4),
    "cnn32-2x2": (lambda: SmallCNN(32), 32, 2, 2),
    "resnet20-4x4": (ResNet20, 32, 4, 4),
    "cnn32-px": (lambda: SmallCNN(32), 32, 1, 1),
    "resnet20-px": (ResNet20, 32, 1, 1),
}
DEFAULT = ["cnn16-px", "cnn32-2x2", "resnet20-4x4"]


def patch_map(size: int, patch: int) -> torch.Tensor | None:
    if patch == 1:
        return None
    r = torch.arange(size) // patch
    return r.view(-1, 1) * (size // patch) + r.view(1, -1)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    t = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t, out


def floor_time(model, images, candidates: int, batch: int, device) -> float:
    x = images[:1].expand(batch, *images.shape[1:]).contiguous() + 0.01 * torch.randn(
        batch, *images.shape[1:], device=device, dtype=images.dtype
    )
    tail = candidates % batch
    with torch.inference_mode():
        model(x)  # warm-up

        def run():
            for _ in range(candidates // batch):
                torch.softmax(model(x), 1)
            if tail:
                torch.softmax(model(x[:tail]), 1)

        return timed(run, device)[0]


def run_config(name, n_images, device, skip_reference=False):
    factory, size, patch, default_n = CONFIGS[name]
    n = n_images or default_n
    torch.manual_seed(0)
    model = factory().to(device).eval()
    images = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
    features = patch_map(size, patch)
    p = (size // patch) ** 2
    candidates = n * p * (p + 1) // 2
    batch = auto_batch_size(images, candidates)
    with torch.inference_mode():  # warm-up: kernels, allocator
        of.fast_sis(model, images[:1], 0.5, features=patch_map(size, 8) if size >= 16 else None, progress=False)
    t_fast, res = timed(lambda: of.fast_sis(model, images, 0.5, features=features, progress=False), device)
    t_floor = floor_time(model, images, candidates, batch, device)
    row = {
        "config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
        "batch_size": batch, "fast_s": t_fast, "floor_s": t_floor, "fast_over_floor": t_fast / t_floor,
        "fast_candidates_per_s": candidates / t_fast, "floor_candidates_per_s": candidates / t_floor,
    }
    if not skip_reference:
        t_ref, ref = timed(lambda: of.reference.sis(model, images, 0.5, features=features), device)
        row.update(reference_s=t_ref, speedup_vs_reference=t_ref / t_fast,
                   same_order=all(torch.equal(a.order, b.order) for a, b in zip(res, ref)))
    return row


def environment(device):
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
           "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            env["cpu"] = next(l.split(":", 1)[1].strip() for l in fh if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=None, choices=list(CONFIGS))
    ap.add_argument("--full", action="store_true", help="also the 32x32 pixel-feature configs")
    ap.add_argument("--images", type=int, default=None, help="images per config (default: per config)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/exact_<device>.json)")
    args = ap.parse_args()
    device = torch.device(args.device)
    names = args.configs or (DEFAULT + (["cnn32-px", "resnet20-px"] if args.full else []))
    rows = []
    head = f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'B':>6}{'fast s':>9}{'floor s':>9}{'ref s':>9}{'fast/floor':>11}{'ref/fast':>9}{'cand/s':>9}"
    print(head)
    for name in names:
        row = run_config(name, args.images, device, args.no_reference)
        rows.append(row)
        print(f"{name:<14}{row['images']:>3}{row['features']:>6}{row['candidates']:>9}{row['batch_size']:>6}"
              f"{row['fast_s']:>9.2f}{row['floor_s']:>9.2f}{row.get('reference_s', math.nan):>9.2f}"
              f"{row['fast_over_floor']:>11.3f}{row.get('speedup_vs_reference', math.nan):>9.2f}"
              f"{row['fast_candidates_per_s']:>9.0f}", flush=True)
    out = args.out or os.path.join(os.path.dirname(__file__), "results", f"exact_{device.type}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"benchmark": "exact SIS", "environment": environment(device),
                   "command": "python benchmarks/bench_exact.py " + " ".join(os.sys.argv[1:]), "rows": rows}, fh, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
