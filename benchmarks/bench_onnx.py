"""The ONNX Runtime path against the torch path: exact SIS of the same model on the same images.

    python benchmarks/bench_onnx.py                 # CPU execution provider vs torch CPU -> results/onnx-cpu.json
    python benchmarks/bench_onnx.py --device cuda   # also CUDA EP with IOBinding vs host copies (onnxruntime-gpu)

The model is exported with overinterp_fast.export_onnx (dynamic batch). Both paths run
fast_sis with the same batch size (the largest call of a first torch run, read with a
forward pre-hook), so they see the same candidate batches; each backend's bare forward
passes (the floor: the same number of candidates in calls of that size, on
candidate-like inputs built once) are timed beside them. All contenders run in
interleaved rounds (order rotated); minima are reported.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from common import (CONFIGS, RowRecorder, batches, candidate_like_batch, explain, floor_run, interleaved, make_case,  # noqa: E402
                    same_sis, write_results)


class HostCopies:
    """An OnnxModel called through host memory: what IOBinding avoids (CUDA only)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(x.cpu()).to(x.device)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=["cnn16-px", "resnet20-4x4"], choices=list(CONFIGS))
    ap.add_argument("--images", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; minima are reported (default 3)")
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
            with RowRecorder(model) as rec:  # also the warm-up of the torch path
                explain(model, images, 0.5, feature_mask=features, engine="torch", incremental=False)
            batch = rec.largest()
            floor_batch = candidate_like_batch(images, features, batch)
            path = of.export_onnx(model.cpu(), os.path.join(tmp, f"{name}.onnx"), images[:2].cpu())
            model.to(device)
            onnx_model = of.OnnxModel(path, device=device)
            run = lambda m, **kw: (lambda: explain(m, images, 0.5, feature_mask=features,  # noqa: E731
                                                   batch_size=batch, incremental=False, **kw))
            contenders = {"torch": run(model, engine="torch"), "onnx": run(onnx_model),
                          "torch_floor": lambda: floor_run(model, floor_batch, batches(candidates, batch)),
                          "onnx_floor": lambda: floor_run(onnx_model, floor_batch, batches(candidates, batch))}
            if device.type == "cuda" and "CUDAExecutionProvider" in onnx_model.providers:
                contenders["onnx_host_copies"] = run(HostCopies(onnx_model))
            run(onnx_model)()  # the ONNX session's warm-up
            times, out = interleaved(contenders, args.rounds, device, name)
            best = {k: min(v) for k, v in times.items()}
            same = same_sis(out["torch"], out["onnx"])
            row = {"config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
                   "batch_size": batch, "rounds": args.rounds, "times_s": times, "torch_s": best["torch"],
                   "onnx_s": best["onnx"], "onnx_over_torch": best["onnx"] / best["torch"],
                   "torch_floor_s": best["torch_floor"], "onnx_floor_s": best["onnx_floor"],
                   "torch_over_floor": best["torch"] / best["torch_floor"],
                   "onnx_over_floor": best["onnx"] / best["onnx_floor"], "same_sis": same,
                   "engine_used": out["onnx"][0].engine, "providers": onnx_model.providers}
            if "onnx_host_copies" in best:
                row["onnx_host_copies_s"] = best["onnx_host_copies"]
            rows.append(row)
            print(f"{name:<14}{n:>3}{p:>6}{candidates:>9}{best['torch']:>9.2f}{best['onnx']:>9.2f}"
                  f"{row['onnx_over_torch']:>11.3f}{row['torch_floor_s']:>12.2f}{row['onnx_floor_s']:>11.2f}"
                  f"{str(same):>9}", flush=True)
    print(f"wrote {write_results('onnx', device, rows, args.out)}")


if __name__ == "__main__":
    main()
