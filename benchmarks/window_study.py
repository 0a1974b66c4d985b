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
share of windows that meet each target (ReX's bar from the same ReX sets).
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
from overinterp_fast.api import REFINE_BUDGET, _engine, _evaluators, _passes, _setup, _slack
from overinterp_fast.audit.stats import dice
from overinterp_fast.methods.blocks import auto_block
from overinterp_fast.methods.extraction import extract_sets
from overinterp_fast.runtime.model import initial_predictions
from overinterp_fast.methods.responsibility import MutantCache, descend
from overinterp_fast.zoo.imagenet import PHOTOS, load_photos

from bench_responsibility import mean_pairwise_dice
from common import write_results


def rex_sets(rex_dir: str, seeds: list[int], n: int) -> list[list[np.ndarray]]:
    """ReX's MPS masks per photo, one per seed (rex{seed}.npz, written by bench_responsibility.py)."""
    arrays = [np.load(os.path.join(rex_dir, f"rex{s}.npz")) for s in seeds]
    return [[a[f"mps{i}"].astype(bool) for a in arrays] for i in range(n)]


class Study:
    """EfficientNet-Lite0 (bench_responsibility.py's kept ONNX file) on the 7 photos, ReX's sets as the bar, and
    the judgement of one run of ours as bench_responsibility.py makes it."""

    def __init__(self, rex_dir: str, rex_seeds: list[int], expected_rows: int):
        torch.set_grad_enabled(False)
        images, self.names, _ = load_photos(224, list(PHOTOS))
        self.n, _, self.h, self.w = images.shape
        n, self.p = self.n, self.h * self.w
        self.rex = rex_sets(rex_dir, rex_seeds, n)
        self.rex_size = statistics.median(statistics.median(int(m.sum()) for m in ms) for ms in self.rex) / self.p
        self.rex_dice = statistics.median(mean_pairwise_dice(ms) for ms in self.rex)
        self.s = _setup(of.OnnxModel(os.path.join(rex_dir, "efficientnet_lite0.onnx")), images, 0.5, None, 0.0,
                        "logits", None, "responsibility")
        self.passes = _passes("top1", self.s.thresholds)
        self.targets, self.scores0 = initial_predictions(self.s.fn, self.s.prep.images, None, self.s.runner)
        eng = _engine(self.s, "auto", self.targets, max_rows=n * 14 * 2, expected_rows=n * expected_rows,
                      measure_fn="score_and_top1")
        self.ev, _ = _evaluators(self.s, eng, self.targets)
        self.present = torch.ones(n, self.p, dtype=torch.bool)
        self.block = auto_block(self.h, self.w)

    def judge(self, score: torch.Tensor, descent_queries: list[int], guided: bool = False, **extraction) -> dict:
        """One run: its map ``score`` (float64 [n, H*W]) extracted as fast_sis's defaults did before the guided
        search (the square scan; ``guided``: as they do now, ``prefix_search="guided"``), or with the given
        ``extract_sets`` options; per photo the MPS fraction, the queries (descent + extraction + pruning) and
        the mean Dice to ReX's sets, and their medians over photos; ``oracle_dice``: the same Dice for the ranking
        the extraction used, cut at each ReX set's size (:func:`oracle_size_dice`)."""
        opts = {"refine": True, "refine_budget": REFINE_BUDGET, "refine_scan": 10, "block": self.block, **extraction}
        if guided:
            opts["guide"] = _slack("top1", self.s.thresholds)
        found = extract_sets(self.ev, self.s.prep, self.targets, self.scores0, lambda present: (score, None),
                             self.passes, 10, False, self.s.thresholds, **opts)
        sizes = [r.size / self.p for r in found]
        qs = [q + r.extraction_queries + (r.refine_queries or 0) for q, r in zip(descent_queries, found)]
        ds = [statistics.mean(dice(r.mask.numpy(), m) for m in rex) for r, rex in zip(found, self.rex)]
        oracle = oracle_size_dice([r.order for r in found], self.rex, self.h, self.w)
        return {"size": statistics.median(sizes), "queries": statistics.median(qs), "dice": statistics.median(ds),
                "oracle_dice": statistics.median(oracle), "sizes": sizes, "photo_queries": qs, "dices": ds,
                "oracle_dices": oracle}

    def summary(self, runs: list[dict]) -> dict:
        """Mean and standard error over independent runs of their medians, and the share meeting each target."""
        k = len(runs)
        agg = {key: (statistics.mean(x[key] for x in runs),
                     statistics.stdev(x[key] for x in runs) / k ** 0.5 if k > 1 else float("nan"))
               for key in ("size", "queries", "dice", "oracle_dice")}
        return {"runs": runs, "mean_se": agg, "rex_median_mps_fraction": self.rex_size,
                "rex_seed_to_seed_dice": self.rex_dice,
                "share_size_met": sum(x["size"] <= self.rex_size for x in runs) / k,
                "share_dice_met": sum(x["dice"] >= self.rex_dice for x in runs) / k}


def oracle_size_dice(orders: list[torch.Tensor], rex: list[list[np.ndarray]], h: int, w: int,
                     skip: int | None = None) -> list[float]:
    """Per photo, the mean Dice to ReX's sets of a ranking cut at each ReX set's own size: ``orders[i]`` (int64,
    features most responsible first) cut to the top ``|rex[i][t]|`` features, against ``rex[i][t]`` (t != ``skip``).
    How well a ranking agrees with ReX's sets when its extraction is given ReX's set size: its agreement apart from
    where a prefix search stops."""
    out = []
    for order, masks in zip(orders, rex):
        ds = []
        for t, m in enumerate(masks):
            if t == skip:
                continue
            top = np.zeros(h * w, dtype=bool)
            top[order[: int(m.sum())].numpy()] = True
            ds.append(dice(top.reshape(h, w), m))
        out.append(statistics.mean(ds))
    return out


def describe(label: str, row: dict) -> str:
    """One printed line for a summary row."""
    m = row["mean_se"]
    return (f"{label}: {len(row['runs']):>2} runs, MPS {100 * m['size'][0]:5.2f}% ± {100 * m['size'][1]:.2f} "
            f"(<= ReX in {row['share_size_met']:.0%}), queries {m['queries'][0]:5.0f} ± {m['queries'][1]:.0f}, "
            f"Dice to ReX {m['dice'][0]:.3f} ± {m['dice'][1]:.3f} (>= ReX's in {row['share_dice_met']:.0%}), "
            f"at ReX's sizes {m['oracle_dice'][0]:.3f} ± {m['oracle_dice'][1]:.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--seed", type=int, default=1000, help="first seed of our descents")
    ap.add_argument("--iterations", type=int, default=60, help="descents recorded per photo and mode")
    ap.add_argument("--windows", type=int, nargs="*", default=[6, 8, 10, 12, 20], help="run lengths T")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/window_study_cpu.json")
    args = ap.parse_args()

    study = Study(args.rex_dir, args.rex_seeds, expected_rows=14 * 6 * args.iterations)
    n, h, w, p = study.n, study.h, study.w, study.p
    print(f"ReX ({len(args.rex_seeds)} seeds): median MPS {100 * study.rex_size:.2f}%, seed-to-seed Dice "
          f"{study.rex_dice:.3f}", flush=True)

    all_rows = []
    for monotone in (False, True):
        logs = torch.zeros(args.iterations, n, h, w, dtype=torch.float64)
        queries = np.zeros((args.iterations, n), dtype=int)
        for t in range(args.iterations):
            lg, q = descend(study.ev, study.s.prep, study.present, study.passes, [(i, args.seed + t) for i in range(n)],
                            10, 10, MutantCache(), progress=False, monotone=monotone)
            logs[t], queries[t] = lg, q
        for T in args.windows:
            per = []
            for o in range(args.iterations // T):
                score = logs[o * T:(o + 1) * T].sum(0).view(n, p)
                per.append(study.judge(score, queries[o * T:(o + 1) * T].sum(0).tolist()))
            row = {"iterations": T, "monotone": monotone, **study.summary(per)}
            all_rows.append(row)
            print(describe(f"monotone={monotone!s:<5} T={T:<3}", row), flush=True)
    path = write_results("window_study", "cpu", all_rows, args.out)
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
