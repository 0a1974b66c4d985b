"""Is it the map or the extraction? fast_sis's extraction applied to ReX's own maps.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python bench_responsibility.py --keep /tmp/rexkeep   # ReX's maps and sets
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python rex_map_extraction.py --rex-dir /tmp/rexkeep   # about 3 min, 2 cores

Issue 14 asks for minimal pixel sets no larger than ReX's (median over photos of the median over
ReX's seeds) that agree with ReX's as well as ReX's seeds agree with each other. Our sets come from
our maps (fewer descents) *and* our extraction (squares of 8 pixels ranked by their mean, scanned one
square at a time over the first ``S`` squares and then in steps of 10%, a pixel-exact boundary
inside the last step) where ReX scans pixels in steps of 10. This script takes our map out of the
question: it extracts sets from ReX's own maps (``map{i}`` of rex{seed}.npz, ReX's 20 descents)
exactly as fast_sis's defaults do, for several ``S``, and judges them as bench_responsibility.py
judges ours: the size statistic of the issue (per photo the median over ReX's seeds, then the median
over photos) and the Dice of each set to the sets of ReX's *other* seeds (per photo the mean over
pairs, then the median over photos), beside ReX's own extraction of the same maps.
Writes benchmarks/results/rex_map_extraction_cpu.json.
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import torch

import overinterp_fast.extraction as extraction_module
from overinterp_fast.api import REFINE_BUDGET
from overinterp_fast.audit.stats import dice
from overinterp_fast.blocks import SCAN_SQUARES, scan_sizes
from overinterp_fast.extraction import extract_sets

from common import write_results
from window_study import Study


def rex_maps(rex_dir: str, seeds: list[int], n: int) -> list[torch.Tensor]:
    """Per ReX seed, its maps of the n photos: float64 [n, H*W]."""
    out = []
    for s in seeds:
        a = np.load(os.path.join(rex_dir, f"rex{s}.npz"))
        out.append(torch.stack([torch.from_numpy(a[f"map{i}"].astype(np.float64)).flatten() for i in range(n)]))
    return out


def extract(study: Study, score: torch.Tensor, squares: int | None, pixel_step: int | None = None) -> list:
    """fast_sis's default extraction of ``score`` (float64 [n, H*W]), the scan one square at a time over the first
    ``squares`` squares; or (``pixel_step``) the pixels ranked one by one (no squares), scanned in steps of
    ``pixel_step`` pixels, with the pixel-exact boundary inside the last step."""
    if pixel_step is not None:
        opts = {"refine_scan": pixel_step, "block": None}
    else:
        opts = {"refine_scan": 10, "block": study.block}
        extraction_module.scan_sizes = lambda ends: scan_sizes(ends, squares=squares)
    try:
        return extract_sets(study.ev, study.s.prep, study.targets, study.scores0, lambda present: (score, None),
                            study.passes, 10, False, study.s.thresholds, refine=True, refine_budget=REFINE_BUDGET,
                            **opts)
    finally:
        extraction_module.scan_sizes = scan_sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--squares", type=int, nargs="*", default=[SCAN_SQUARES, 96, 128, 1000],
                    help="scan one square at a time over this many first squares (fast_sis: blocks.SCAN_SQUARES)")
    ap.add_argument("--pixel-steps", type=int, nargs="*", default=[64],
                    help="also: pixels ranked one by one, scanned in steps of this many pixels")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/rex_map_extraction_cpu.json")
    args = ap.parse_args()
    study = Study(args.rex_dir, args.rex_seeds, expected_rows=0)
    maps = rex_maps(args.rex_dir, args.rex_seeds, study.n)
    k = len(args.rex_seeds)
    own = [[float(study.rex[i][s].mean()) for s in range(k)] for i in range(study.n)]
    print(f"ReX's extraction of its maps: median MPS {100 * study.rex_size:.2f}%, seed-to-seed Dice "
          f"{study.rex_dice:.3f}", flush=True)
    rows = [{"extraction": "ReX (pixels, steps of 10)", "median_mps_fraction": study.rex_size,
             "dice_to_other_rex_seeds": study.rex_dice, "sizes_by_photo_and_seed": own}]
    for squares, step in [(q, None) for q in args.squares] + [(None, t) for t in args.pixel_steps]:
        label = f"{squares} squares one by one" if step is None else f"pixels, steps of {step}"
        sizes = [[0.0] * k for _ in range(study.n)]
        dices = [[] for _ in range(study.n)]
        queries = []
        for s in range(k):
            for i, r in enumerate(extract(study, maps[s], squares, step)):
                sizes[i][s] = r.size / study.p
                queries.append(r.extraction_queries + (r.refine_queries or 0))
                dices[i] += [dice(r.mask.numpy(), study.rex[i][t]) for t in range(k) if t != s]
        row = {"extraction": f"ours, {label}", "squares": squares, "pixel_step": step,
               "median_mps_fraction": statistics.median(statistics.median(v) for v in sizes),
               "mean_of_per_seed_medians": statistics.mean(statistics.median(sizes[i][s] for i in range(study.n))
                                                           for s in range(k)),
               "dice_to_other_rex_seeds": statistics.median(statistics.mean(d) for d in dices),
               "median_extraction_queries": statistics.median(queries), "mean_extraction_queries":
                   statistics.mean(queries), "sizes_by_photo_and_seed": sizes}
        rows.append(row)
        print(f"ours, {label}: median MPS {100 * row['median_mps_fraction']:.2f}% "
              f"(per seed, mean of medians {100 * row['mean_of_per_seed_medians']:.2f}%), Dice to ReX's other seeds "
              f"{row['dice_to_other_rex_seeds']:.3f}, extraction queries median {row['median_extraction_queries']:.0f} "
              f"mean {row['mean_extraction_queries']:.0f}", flush=True)
    print(f"wrote {write_results('rex_map_extraction', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
