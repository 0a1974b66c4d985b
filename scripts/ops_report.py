"""Which implementation each op uses (ops_info, self-checks included), and the kernels against the pure-PyTorch
ops end to end: every method on a small seeded CNN, once with the kernels and once with OVERINTERP_FAST_OPS=torch,
must give identical results.

    python scripts/ops_report.py --device cuda --out ops_report.json     (exit status 1 on any difference)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

import overinterp_fast as of

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from common import machine, source_commit, versions  # noqa: E402

ENV_VAR = of.ops.ENV_VAR  # OVERINTERP_FAST_OPS: "torch" runs the pure-PyTorch ops


def small_cnn(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 12 * 12, 5)).double().eval().to(device)


def run_methods(model: nn.Module, images: torch.Tensor) -> dict:
    """Every method on ``images`` [N, 3, 12, 12]: {method: [(order, sis) per image]}. The one place this script calls
    the library's short path (method options as options objects)."""
    res = {
        "exact": of.fast_sis(model, images, 0.5, collection=True),
        "gradient": of.fast_sis(model, images, 0.5, method="gradient", options=of.attr.GradientOptions(k=20)),
        "responsibility": of.fast_sis(model, images, method="responsibility", options=of.attr.MinimalPixelSetOptions(iterations=4)),
    }
    return {name: [(r.order.tolist(), None if r.sis is None else r.sis.tolist()) for r in rs]
            for name, rs in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    os.environ.pop(ENV_VAR, None)
    info = of.ops_info(["cpu", str(device)] if device.type != "cpu" else ["cpu"])
    print("op                   device   impl    why")
    print(*info, sep="\n")
    model = small_cnn(device)
    images = torch.randn(3, 3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device)
    kernels = run_methods(model, images)
    os.environ[ENV_VAR] = "torch"
    try:
        pure = run_methods(model, images)
    finally:
        os.environ.pop(ENV_VAR)
    same = {name: kernels[name] == pure[name] for name in kernels}
    print("kernels == pure-PyTorch ops, end to end:", same)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"commit": source_commit(), "device": str(device), "machine": machine(device),
                       "versions": versions(device), "command": " ".join(["python"] + sys.argv),
                       "ops_info": [vars(r) for r in info], "identical": same}, f, indent=1)
    return 0 if all(same.values()) and all(r.implementation == "kernel" for r in info) else 1


if __name__ == "__main__":
    sys.exit(main())
