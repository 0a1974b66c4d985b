"""How much one run of the default minimal-pixel-set search varies, and what monotone descents cost in quality.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python bench_responsibility.py --keep /tmp/rexkeep   # ReX's sets
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python window_study.py --rex-dir /tmp/rexkeep      # about 8 min, 2 cores

bench_responsibility.py compares one run of ours (per seed) with ReX. On 7 photos one run is noisy:
this script measures by how much. It records ``--iterations`` descents per photo (iteration t
seeded ``--seed`` + t, a fresh mutant cache per iteration so that every window pays its own
queries), with monotone=False (every mutant scored, as ReX) and with monotone=True, on
EfficientNet-Lite0 (the ONNX file bench_responsibility.py kept). Then every disjoint window of T
consecutive iterations is one independent run with ``iterations=T``: its map is the window's sum,
extracted as fast_sis's defaults do (square ranking, square scan, pixel-exact boundary,
refine_budget="auto"). Per window, as bench_responsibility.py: the median over photos of the MPS
size, of the queries (descent + extraction + pruning) and of the Dice to ReX's sets (mean over
ReX's seeds). Printed: the mean and standard error of these medians over the windows, and the
share of windows that meet each target of issue 14 (ReX's bar from the same ReX sets).
Writes benchmarks/results/window_study_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np
import torch

import overinterp_fast as of
from overinterp_fast.api import REFINE_BUDGET, _engine, _evaluators, _passes, _setup
from overinterp_fast.audit.stats import dice
from overinterp_fast.blocks import auto_block
from overinterp_fast.extraction import extract_sets
from overinterp_fast.model import initial_predictions
from overinterp_fast.responsibility import MutantCache, descend
from overinterp_fast.zoo.imagenet import PHOTOS, load_photos

from bench_responsibility import mean_pairwise_dice
from common import write_results


def rex_sets(rex_dir: str, seeds: list[int], n: int) -> list[list[np.ndarray]]:
    """ReX's MPS masks per photo, one per seed (rex{seed}.npz, written by bench_responsibility.py)."""
    arrays = [np.load(os.path.join(rex_dir, f"rex{s}.npz")) for s in seeds]
    return [[a[f"mps{i}"].astype(bool) for a in arrays] for i in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--seed", type=int, default=1000, help="first seed of our descents")
    ap.add_argument("--iterations", type=int, default=60, help="descents recorded per photo and mode")
    ap.add_argument("--windows", type=int, nargs="*", default=[6, 8, 10, 12, 20], help="run lengths T")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/window_study_cpu.json")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    images, names, _ = load_photos(224, list(PHOTOS))
    n, _, h, w = images.shape
    p = h * w
    rex = rex_sets(args.rex_dir, args.rex_seeds, n)
    rex_size = statistics.median(statistics.median(int(m.sum()) for m in ms) for ms in rex) / p
    rex_dice = statistics.median(mean_pairwise_dice(ms) for ms in rex)
    s = _setup(of.OnnxModel(os.path.join(args.rex_dir, "efficientnet_lite0.onnx")), images, 0.5, None, 0.0,
               "logits", None, "responsibility")
    passes = _passes("top1", s.thresholds)
    targets, scores0 = initial_predictions(s.fn, s.prep.images, None, s.runner)
    eng = _engine(s, "auto", targets, max_rows=n * 14 * 2, expected_rows=n * 14 * 6 * args.iterations,
                  measure_fn="score_and_top1")
    ev, _ = _evaluators(s, eng, targets)
    present = torch.ones(n, p, dtype=torch.bool)
    block = auto_block(h, w)
    print(f"ReX ({len(args.rex_seeds)} seeds): median MPS {100 * rex_size:.2f}%, seed-to-seed Dice {rex_dice:.3f}",
          flush=True)

    all_rows = []
    for monotone in (False, True):
        logs = torch.zeros(args.iterations, n, h, w, dtype=torch.float64)
        queries = np.zeros((args.iterations, n), dtype=int)
        for t in range(args.iterations):
            lg, q = descend(ev, s.prep, present, passes, [(i, args.seed + t) for i in range(n)], 10, 10,
                            MutantCache(), progress=False, monotone=monotone)
            logs[t], queries[t] = lg, q
        for T in args.windows:
            per = []
            for o in range(args.iterations // T):
                score = logs[o * T:(o + 1) * T].sum(0).view(n, p)
                # fast_sis's own extraction with its defaults, on the window's map
                found = extract_sets(ev, s.prep, targets, scores0, lambda present, score=score: (score, None),
                                     passes, 10, False, s.thresholds, refine=True, refine_budget=REFINE_BUDGET,
                                     refine_scan=10, block=block)
                sizes, qs, ds = [], [], []
                for i, r in enumerate(found):
                    sizes.append(r.size / p)
                    qs.append(int(queries[o * T:(o + 1) * T, i].sum()) + r.extraction_queries + r.refine_queries)
                    ds.append(statistics.mean(dice(r.mask.numpy(), m) for m in rex[i]))
                per.append({"size": statistics.median(sizes), "queries": statistics.median(qs),
                            "dice": statistics.median(ds)})
            k = len(per)
            agg = {key: (statistics.mean(x[key] for x in per),
                         statistics.stdev(x[key] for x in per) / k ** 0.5 if k > 1 else float("nan"))
                   for key in ("size", "queries", "dice")}
            row = {"iterations": T, "monotone": monotone, "windows": per, "mean_se": agg,
                   "rex_median_mps_fraction": rex_size, "rex_seed_to_seed_dice": rex_dice,
                   "share_size_met": sum(x["size"] <= rex_size for x in per) / k,
                   "share_dice_met": sum(x["dice"] >= rex_dice for x in per) / k}
            all_rows.append(row)
            print(f"monotone={monotone!s:<5} T={T:<3} windows {k:>2}: MPS {100 * agg['size'][0]:5.2f}% "
                  f"± {100 * agg['size'][1]:.2f} (<= ReX in {row['share_size_met']:.0%}), queries "
                  f"{agg['queries'][0]:5.0f} ± {agg['queries'][1]:.0f}, Dice to ReX {agg['dice'][0]:.3f} "
                  f"± {agg['dice'][1]:.3f} (>= ReX's in {row['share_dice_met']:.0%})", flush=True)
    path = write_results("window_study", "cpu", all_rows, args.out)
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
