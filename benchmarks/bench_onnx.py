"""The ONNX Runtime path against the torch path: exact SIS of the same model on the same images.

    .venv/bin/python benchmarks/bench_onnx.py                 # CPU execution provider vs torch CPU
    .venv/bin/python benchmarks/bench_onnx.py --device cuda   # also CUDA EP with IOBinding vs host copies

The model is exported with overinterp_fast.export_onnx (dynamic batch). Both paths
use the same candidate batches (fast_sis's packing and batch size); the table also
gives each backend's bare forward-pass floor on those batch sizes.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

import overinterp_fast as of
from overinterp_fast.methods.results import same_sis
from overinterp_fast.runtime.batching import auto_batch_size

from common import candidate_like_batch, make_case, timed, write_results


class HostCopies:
    """An OnnxModel called through host memory: what IOBinding avoids (CUDA only)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(x.cpu()).to(x.device)


def floor(fn, x, candidates, device):
    """``candidates`` forward passes of ``fn`` in batches of len(x) (x: common.candidate_like_batch)."""
    batch = x.shape[0]
    with torch.inference_mode():
        fn(x)

        def run():
            for _ in range(candidates // batch):
                fn(x)
            if candidates % batch:
                fn(x[: candidates % batch])

        return timed(run, device)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=["cnn16-px", "resnet20-4x4"])
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    print(f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'torch s':>9}{'onnx s':>9}{'onnx/torch':>11}"
          f"{'torch floor':>12}{'onnx floor':>11}{'same SIS':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            model, images, features, p = make_case(name, args.images, device)
            n = images.shape[0]
            candidates = n * p * (p + 1) // 2
            batch = auto_batch_size(images, candidates)
            floor_batch = candidate_like_batch(images, features, batch)
            path = of.export_onnx(model.cpu(), os.path.join(tmp, f"{name}.onnx"), images[:2].cpu())
            model.to(device)
            onnx_model = of.OnnxModel(path, device=device)
            run = lambda m: of.fast_sis(m, images, 0.5, features=features, batch_size=batch, progress=False)
            t_torch, res_t = timed(lambda: run(model), device)
            t_onnx, res_o = timed(lambda: run(onnx_model), device)
            same = same_sis(res_t, res_o)
            row = {"config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
                   "batch_size": batch, "torch_s": t_torch, "onnx_s": t_onnx, "onnx_over_torch": t_onnx / t_torch,
                   "torch_floor_s": floor(model, floor_batch, candidates, device),
                   "onnx_floor_s": floor(onnx_model, floor_batch, candidates, device), "same_sis": same,
                   "providers": onnx_model.providers}
            if device.type == "cuda" and "CUDAExecutionProvider" in onnx_model.providers:
                row["onnx_host_copies_s"] = timed(lambda: run(HostCopies(onnx_model)), device)[0]
            rows.append(row)
            print(f"{name:<14}{n:>3}{p:>6}{candidates:>9}{t_torch:>9.2f}{t_onnx:>9.2f}{t_onnx / t_torch:>11.3f}"
                  f"{row['torch_floor_s']:>12.2f}{row['onnx_floor_s']:>11.2f}{str(same):>9}", flush=True)
    print(f"wrote {write_results('onnx', device, rows, args.out)}")


if __name__ == "__main__":
    main()
