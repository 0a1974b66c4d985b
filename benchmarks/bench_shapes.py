"""Shape-stable batches: does padding batches to a few sizes pay?

Exact SIS sends the model a new batch size at almost every call when few images
are in flight: with two images of 144 pixels and B = 288 the calls have 288, 286,
284, ... rows. oneDNN (and cuDNN) set up per shape, and CUDA graphs need fixed
shapes. This replays the batch sizes exact SIS's scheduler actually sends
(schedule.CandidateQueue, the same packing) as bare forward passes on
candidate-like inputs, under three policies:

  ragged   the sizes as sent (what fast_sis does);
  bucket   each call padded up to the next size in {16, 32, 64, 128, 256, 384, 512, ..., B}
           (calibration.LADDER), the padding's outputs dropped;
  fixed    every call padded to B.

Contenders are interleaved (order rotated per round) and minima over rounds are
reported, with the ratio to ragged (< 1: padding pays). A subsample of the
calls (every ``--stride``-th) keeps the run short.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_shapes.py            # CPU, writes results/shapes_cpu.json
"""
from __future__ import annotations

import argparse

import torch

from overinterp_fast.runtime.calibration import LADDER
from overinterp_fast.runtime.schedule import CandidateQueue
from overinterp_fast.zoo.cifar import ResNet20, SmallCNN

from common import candidate_like_batch, patch_map, timed, write_results

CASES = {
    # name: (model factory, image size, patch, images N, batch B)
    "cnn12-2img-B288": (lambda: SmallCNN(12), 12, 1, 2, 288),  # the replay of the cold case
    "cnn24-1img-B576": (lambda: SmallCNN(24), 24, 1, 1, 576),
    "cnn24-1img-B256": (lambda: SmallCNN(24), 24, 1, 1, 256),
    "resnet20-4x4-4img-B256": (ResNet20, 32, 4, 4, 256),
}


def schedule_sizes(n: int, p: int, batch: int) -> list[int]:
    """Rows per call that exact SIS's queue sends for N images of p features (one round, no collection)."""
    q, counts, sizes = CandidateQueue(), [p] * n, []
    for i in range(n):
        q.push(i, 0, p, 0)
    while q:
        b = q.take(batch)
        sizes.append(len(b))
        for i, _ in b.completed:
            counts[i] -= 1
            if counts[i]:
                q.push(i, 0, counts[i], 0)
    return sizes


def bucket(r: int, batch: int) -> int:
    return next((b for b in LADDER if r <= b < batch), batch)


def run_case(name: str, rounds: int, stride: int) -> dict:
    factory, size, patch, n, batch = CASES[name]
    torch.manual_seed(0)
    model = factory().eval()
    images = torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))
    p = (size // patch) ** 2
    sizes = schedule_sizes(n, p, batch)[::stride]
    x = candidate_like_batch(images, patch_map(size, patch), batch)
    policies = {
        "ragged": sizes,
        "bucket": [bucket(r, batch) for r in sizes],
        "fixed": [batch] * len(sizes),
    }

    def replay(seq):
        with torch.inference_mode():
            for r in seq:
                model(x[:r])

    with torch.inference_mode():
        model(x)
    times = {k: [] for k in policies}
    names = list(policies)
    for rnd in range(rounds):
        for k in names[rnd % len(names):] + names[: rnd % len(names)]:
            t, _ = timed(lambda: replay(policies[k]), "cpu")
            times[k].append(t)
    best = {k: min(v) for k, v in times.items()}
    return {"case": name, "images": n, "features": p, "batch_size": batch, "calls": len(sizes), "stride": stride,
            "rows": {k: sum(v) for k, v in policies.items()}, "distinct_shapes": {k: len(set(v)) for k, v in policies.items()},
            "times_s": times, "best_s": best, "over_ragged": {k: best[k] / best["ragged"] for k in best}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stride", type=int, default=8, help="replay every stride-th call (default 8)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print(f"{'case':<24}{'calls':>6}{'ragged s':>10}{'bucket s':>10}{'fixed s':>9}{'bucket/ragged':>15}{'fixed/ragged':>14}")
    rows = []
    for name in args.cases:
        row = run_case(name, args.rounds, args.stride)
        rows.append(row)
        b, o = row["best_s"], row["over_ragged"]
        print(f"{name:<24}{row['calls']:>6}{b['ragged']:>10.3f}{b['bucket']:>10.3f}{b['fixed']:>9.3f}"
              f"{o['bucket']:>15.3f}{o['fixed']:>14.3f}", flush=True)
    print(f"wrote {write_results('shapes', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
