"""How much should the virtual descents count?

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python virtual_weight_study.py --rex-dir /tmp/rexkeep   # ~12 min

fast_sis(virtual_iterations=V) adds V virtual descents' log maps to the real ones with weight 1. Here the
map is real + A x virtual for several (V, A), from the same real descents and the same virtual ones per
run (run r: the default 8 real descents seeded ``--seed`` + 100 r + t, one mutant cache; the virtual
descents of add_virtual_descents with that seed), each judged as window_study.py judges a run (median
over the 7 photos of MPS size, queries and Dice to ReX's sets). Printed: means over runs, and the paired
difference to A = 0 (the defaults) with its standard error.
Writes benchmarks/results/virtual_weight_study_cpu.json.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from overinterp_fast.methods.responsibility import MutantCache, compute_responsibility
from overinterp_fast.experimental.surrogate import add_virtual_descents

from common import write_results
from window_study import Study


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--seed", type=int, default=7000)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--configs", nargs="*", default=["40:0", "40:0.05", "40:0.1", "40:0.2", "10:0.4", "40:1"],
                    help="V:A, virtual descents and their weight")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    configs = [(int(v), float(a)) for v, a in (c.split(":") for c in args.configs)]
    if (configs[0][1]) != 0:
        raise SystemExit("the first config is the baseline of the paired differences: give it weight 0")
    study = Study(args.rex_dir, [0, 20, 40], expected_rows=14 * 6 * args.iterations)
    torch.set_grad_enabled(False)
    res: dict[tuple[int, float], list[dict]] = {c: [] for c in configs}
    for r in range(args.runs):
        seed = args.seed + 100 * r
        cache = MutantCache()
        logs, q = compute_responsibility(study.ev, study.s.prep, study.present, study.passes, args.iterations, 10,
                                         10, seed, False, True, cache)
        virtual = {v: add_virtual_descents(logs, cache, study.ev.runner, study.s.prep, study.present, study.passes, v,
                                           10, 10, seed) - logs for v in sorted({v for v, _ in configs})}
        for v, a in configs:
            one = study.judge((logs + a * virtual[v]).view(study.n, study.p), q)
            res[v, a].append(one)
            print(f"run {r} V={v} A={a}: MPS {100 * one['size']:5.2f}%, queries {one['queries']:.0f}, "
                  f"Dice {one['dice']:.3f}", flush=True)
    se = lambda z: statistics.stdev(z) / len(z) ** 0.5 if len(z) > 1 else float("nan")  # noqa: E731
    rows = []
    for (v, a), got in res.items():
        dd = [x["dice"] - y["dice"] for x, y in zip(got, res[configs[0]])]
        ds = [x["size"] - y["size"] for x, y in zip(got, res[configs[0]])]
        row = {"virtual_iterations": v, "weight": a, **study.summary(got), "paired_dice": (statistics.mean(dd), se(dd)),
               "paired_size": (statistics.mean(ds), se(ds))}
        rows.append(row)
        m = row["mean_se"]
        print(f"V={v} A={a}: MPS {100 * m['size'][0]:5.2f}% ± {100 * m['size'][1]:.2f}, queries {m['queries'][0]:.0f}, "
              f"Dice {m['dice'][0]:.3f} ± {m['dice'][1]:.3f}; paired Dice {row['paired_dice'][0]:+.3f} ± "
              f"{row['paired_dice'][1]:.3f}, paired MPS {100 * row['paired_size'][0]:+.2f} ± "
              f"{100 * row['paired_size'][1]:.2f} pt", flush=True)
    print(f"wrote {write_results('virtual_weight_study', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
