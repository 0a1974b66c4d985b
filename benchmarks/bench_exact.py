"""Exact SIS: fast_sis against the in-package reference and against the floor, in one run.

floor = the bare forward passes (and softmax) of the same number of candidates,
in batches of the size fast_sis used, on candidate-like inputs built once
(masked copies of the images, common.candidate_like_batch; no masking work, no
bookkeeping, no scheduling).

    .venv/bin/python benchmarks/bench_exact.py            # CPU table, writes benchmarks/results/exact_cpu.json
    .venv/bin/python benchmarks/bench_exact.py --device cuda

Method: timings on shared 2-core machines vary by about 30% from run to run, so
the three contenders are run in interleaved rounds (order rotated each round)
and the table reports the minimum time of each and the ratios of those minima.

Configs (sized for 2 CPU cores; on a GPU use --images and --full):
  cnn16-px     small CNN, 16x16, one feature per pixel (p = 256)
  cnn32-2x2    small CNN, 32x32, 2x2 patches (p = 256)
  resnet20-4x4 ResNet-20, 32x32, 4x4 patches (p = 64)
  cnn32-px     small CNN, 32x32, pixels (p = 1024; --full only: minutes per run on 2 cores)
  resnet20-px  ResNet-20, 32x32, pixels (p = 1024; --full only)
"""
from __future__ import annotations

import argparse
import math

import torch

import overinterp_fast as of
from overinterp_fast.batching import auto_batch_size

from common import CONFIGS, candidate_like_batch, make_case, patch_map, timed, write_results

DEFAULT = ["cnn16-px", "cnn32-2x2", "resnet20-4x4"]


def floor_run(model, x: torch.Tensor, candidates: int) -> None:
    """The forward passes fast_sis cannot avoid: ``candidates`` inputs in batches of ``batch = len(x)``."""
    batch = x.shape[0]
    with torch.inference_mode():
        for _ in range(candidates // batch):
            torch.softmax(model(x), 1)
        if candidates % batch:
            torch.softmax(model(x[: candidates % batch]), 1)


def run_config(name, n_images, device, rounds, skip_reference=False):
    model, images, features, p = make_case(name, n_images, device)
    n, size = images.shape[0], images.shape[-1]
    candidates = n * p * (p + 1) // 2
    batch = auto_batch_size(images, candidates)
    floor_batch = candidate_like_batch(images, features, batch)
    with torch.inference_mode():  # warm-up: kernels, allocator
        of.fast_sis(model, images[:1], 0.5, features=patch_map(size, 8), progress=False)
    contenders = {
        "fast": lambda: of.fast_sis(model, images, 0.5, features=features, progress=False),
        "floor": lambda: floor_run(model, floor_batch, candidates),
    }
    if not skip_reference:
        contenders["reference"] = lambda: of.reference.sis(model, images, 0.5, features=features)
    times = {k: [] for k in contenders}
    outputs = {}
    names = list(contenders)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t, outputs[k] = timed(contenders[k], device)
            times[k].append(t)
    best = {k: min(v) for k, v in times.items()}
    row = {
        "config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
        "batch_size": batch, "rounds": rounds, "times_s": times,
        "fast_s": best["fast"], "floor_s": best["floor"], "fast_over_floor": best["fast"] / best["floor"],
        "fast_candidates_per_s": candidates / best["fast"], "floor_candidates_per_s": candidates / best["floor"],
    }
    if not skip_reference:
        row.update(reference_s=best["reference"], speedup_vs_reference=best["reference"] / best["fast"],
                   same_order=all(torch.equal(a.order, b.order) for a, b in zip(outputs["fast"], outputs["reference"])))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=None, choices=list(CONFIGS))
    ap.add_argument("--full", action="store_true", help="also the 32x32 pixel-feature configs")
    ap.add_argument("--images", type=int, default=None, help="images per config (default: per config)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; minima are reported (default 3)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/exact_<device>.json)")
    args = ap.parse_args()
    device = torch.device(args.device)
    names = args.configs or (DEFAULT + (["cnn32-px", "resnet20-px"] if args.full else []))
    rows = []
    head = f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'B':>6}{'fast s':>9}{'floor s':>9}{'ref s':>9}{'fast/floor':>11}{'ref/fast':>9}{'cand/s':>9}"
    print(head)
    for name in names:
        row = run_config(name, args.images, device, args.rounds, args.no_reference)
        rows.append(row)
        print(f"{name:<14}{row['images']:>3}{row['features']:>6}{row['candidates']:>9}{row['batch_size']:>6}"
              f"{row['fast_s']:>9.2f}{row['floor_s']:>9.2f}{row.get('reference_s', math.nan):>9.2f}"
              f"{row['fast_over_floor']:>11.3f}{row.get('speedup_vs_reference', math.nan):>9.2f}"
              f"{row['fast_candidates_per_s']:>9.0f}", flush=True)
    out = write_results("exact", device, rows, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
