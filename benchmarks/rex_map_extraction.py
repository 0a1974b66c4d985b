"""Is it the map or the extraction? fast_sis's extraction applied to ReX's own maps.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python bench_responsibility.py --keep /tmp/rexkeep   # ReX's maps and sets
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python rex_map_extraction.py --rex-dir /tmp/rexkeep   # about 3 min, 2 cores

The targets ask for minimal pixel sets no larger than ReX's (median over photos of the median over
ReX's seeds) that agree with ReX's as well as ReX's seeds agree with each other. Our sets come from
our maps (fewer descents) *and* our extraction (squares of 8 pixels ranked by their mean, scanned one
square at a time over the first ``S`` squares and then in steps of 10%, a pixel-exact boundary
inside the last step) where ReX scans pixels in steps of 10. This script takes our map out of the
question: it extracts sets from ReX's own maps (``map{i}`` of rex{seed}.npz, ReX's 20 descents)
exactly as fast_sis's defaults do, for several ``S``, and judges them as bench_responsibility.py
judges ours: the size statistic of the issue (per photo the median over ReX's seeds, then the median
over photos) and the Dice of each set to the sets of ReX's *other* seeds (per photo the mean over
pairs, then the median over photos), beside ReX's own extraction of the same maps.

``--pooled``: how far can a better map go? Each seed's set is also judged against the map summed over
ReX's *other* seeds (40 descents, half the noise of one run's), extracted by the guided search: if the
Dice bar (ReX's seed-to-seed agreement) measured map noise, such a map would clear it.
``--consensus B ...``: can the extraction itself be made less noisy? Each seed's map is extracted by the guided
search over several rankings (pixels, ``None``, and squares of each size B), and per photo the *medoid* of these sets
is kept (the set with the largest summed Dice to the others: the most typical one, not a lucky narrow window); it
costs the sum of their extraction queries.
Writes benchmarks/results/rex_map_extraction_cpu.json.
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import torch

import overinterp_fast.methods.extraction as extraction_module
from overinterp_fast.api import REFINE_BUDGET, _slack
from overinterp_fast.audit.stats import dice
from overinterp_fast.methods.blocks import SCAN_SQUARES, scan_sizes
from overinterp_fast.methods.extraction import extract_sets

from bench_responsibility import mean_pairwise_dice
from common import write_results
from window_study import Study


def rex_maps(rex_dir: str, seeds: list[int], n: int) -> list[torch.Tensor]:
    """Per ReX seed, its maps of the n photos: float64 [n, H*W]."""
    out = []
    for s in seeds:
        a = np.load(os.path.join(rex_dir, f"rex{s}.npz"))
        out.append(torch.stack([torch.from_numpy(a[f"map{i}"].astype(np.float64)).flatten() for i in range(n)]))
    return out


def extract(study: Study, score: torch.Tensor, squares: int | None, pixel_step: int | None = None,
            guided: str | None = None, block: int | None = None) -> list:
    """The square scan of fast_sis's defaults before the guided search, applied to ``score`` (float64 [n, H*W]),
    one square at a time over the first ``squares`` squares; or (``pixel_step``) the pixels ranked one by one (no
    squares), scanned in steps of ``pixel_step`` pixels, with the pixel-exact boundary inside the last step; or
    (``guided`` "squares": fast_sis's defaults now, "pixels": the pixels ranked one by one) the first prefix in
    steps of 10 pixels that passes, found by the guided search (``prefix_search="guided"``); with ``block``, squares
    of that size instead of fast_sis's."""
    if guided is not None:
        opts = {"refine_scan": 10, "block": (block or study.block) if guided == "squares" else None,
                "guide": _slack("top1", study.s.thresholds)}
    elif pixel_step is not None:
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


def judged(sizes: list[list[float]], dices: list[list[float]], queries: list[int]) -> dict:
    """The figures of one extraction: ``sizes[i]`` photo i's set fractions (one per map), ``dices[i]`` its Dice
    to the ReX sets it is judged against, ``queries`` every set's extraction queries. Sizes as the targets take
    ReX's (per photo the median, then the median over photos), Dice per photo the mean, then the median."""
    per_photo = [statistics.mean(d) for d in dices]
    k = len(sizes[0])
    return {"median_mps_fraction": statistics.median(statistics.median(v) for v in sizes),
            "mean_of_per_seed_medians": statistics.mean(statistics.median(v[s] for v in sizes) for s in range(k)),
            "dice_to_other_rex_seeds": statistics.median(per_photo),
            "mean_dice_over_photos": statistics.mean(per_photo),
            "dice_by_photo": per_photo, "median_extraction_queries": statistics.median(queries),
            "mean_extraction_queries": statistics.mean(queries), "sizes_by_photo_and_seed": sizes}


def medoid(masks: list[np.ndarray]) -> int:
    """The index of the set with the largest summed Dice to the others (ties: the first)."""
    score = [sum(dice(a, b) for j, b in enumerate(masks) if j != i) for i, a in enumerate(masks)]
    return score.index(max(score))


def consensus_row(study: Study, maps: list[torch.Tensor], blocks: list[int | None]) -> dict:
    """Per seed's map and photo, the medoid of the guided search's sets over the rankings ``blocks`` (None: pixels;
    B: squares of B pixels), judged as :func:`main` judges one extraction against ReX's other seeds."""
    k = len(maps)
    sizes = [[] for _ in range(study.n)]
    dices = [[] for _ in range(study.n)]
    queries, picked = [], []
    for s in range(k):
        found = [extract(study, maps[s], None, guided="pixels" if b is None else "squares", block=b) for b in blocks]
        for i in range(study.n):
            masks = [f[i].mask.numpy() for f in found]
            j = medoid(masks)
            picked.append(blocks[j])
            sizes[i].append(found[j][i].size / study.p)
            queries.append(sum(f[i].extraction_queries + (f[i].refine_queries or 0) for f in found))
            dices[i] += [dice(masks[j], study.rex[i][t]) for t in range(k) if t != s]
    row = {"extraction": f"ours, medoid of the guided search over {blocks} (None: pixels)", "maps": "single",
           "consensus_blocks": blocks, "picked": picked, **judged(sizes, dices, queries)}
    print(f"ours, medoid over {blocks}: median MPS {100 * row['median_mps_fraction']:.2f}%, Dice to ReX's other "
          f"seeds {row['dice_to_other_rex_seeds']:.3f} (mean over photos {row['mean_dice_over_photos']:.3f}), "
          f"extraction queries median {row['median_extraction_queries']:.0f}", flush=True)
    return row


def consensus_block(text: str) -> int | None:
    """--consensus's B: "none" (the pixels ranked one by one) or squares of an int B >= 2 pixels."""
    if text == "none":
        return None
    try:
        b = int(text)
    except ValueError:
        b = 0
    if b < 2:
        raise argparse.ArgumentTypeError(f"a ranking is 'none' (pixels) or a square size >= 2, got {text!r}")
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--squares", type=int, nargs="*", default=[SCAN_SQUARES, 96, 128, 1000],
                    help="scan one square at a time over this many first squares (fast_sis: blocks.SCAN_SQUARES)")
    ap.add_argument("--pixel-steps", type=int, nargs="*", default=[64],
                    help="also: pixels ranked one by one, scanned in steps of this many pixels")
    ap.add_argument("--guided", nargs="*", choices=["squares", "pixels"], default=["squares", "pixels"],
                    help="also: the guided search (fast_sis's default prefix_search) on the square ranking "
                         "(fast_sis's defaults) and on the pixels ranked one by one")
    ap.add_argument("--pooled", action="store_true",
                    help="also: each seed's set against the map pooled (summed) over ReX's other seeds, extracted "
                         "by the guided searches: a map with less noise than one run of ReX's")
    ap.add_argument("--consensus", nargs="*", type=consensus_block, default=None, metavar="B",
                    help="also: per photo the medoid of the guided search's sets over the pixel ranking ('none') "
                         "and squares of each size B (e.g. none 2 4 8 16)")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/rex_map_extraction_cpu.json")
    args = ap.parse_args()
    study = Study(args.rex_dir, args.rex_seeds, expected_rows=0)
    maps = rex_maps(args.rex_dir, args.rex_seeds, study.n)
    k = len(args.rex_seeds)
    own = [[float(study.rex[i][s].mean()) for s in range(k)] for i in range(study.n)]
    rex_pairs = [mean_pairwise_dice(ms) for ms in study.rex]
    print(f"ReX's extraction of its maps: median MPS {100 * study.rex_size:.2f}%, seed-to-seed Dice "
          f"{study.rex_dice:.3f} (mean over photos {statistics.mean(rex_pairs):.3f})", flush=True)
    rows = [{"extraction": "ReX (pixels, steps of 10)", "median_mps_fraction": study.rex_size,
             "dice_to_other_rex_seeds": study.rex_dice, "mean_dice_over_photos": statistics.mean(rex_pairs),
             "dice_by_photo": rex_pairs, "sizes_by_photo_and_seed": own}]
    plan = ([(f"{q} squares one by one", "single", {"squares": q}) for q in args.squares]
            + [(f"pixels, steps of {t}", "single", {"squares": None, "pixel_step": t}) for t in args.pixel_steps]
            + [(f"{g}, guided search", mode, {"squares": None, "guided": g})
               for mode in (("single", "pooled") if args.pooled else ("single",)) for g in args.guided])
    if args.consensus:
        rows.append(consensus_row(study, maps, args.consensus))
    for label, mode, opts in plan:
        sizes = [[] for _ in range(study.n)]
        dices = [[] for _ in range(study.n)]
        queries = []
        for s in range(k):
            others = [t for t in range(k) if t != s]
            if mode == "single":  # seed s's map, against the other seeds' sets
                found = extract(study, maps[s], **opts)
                against = others
            else:  # the other seeds' maps summed, against seed s's set
                found = extract(study, sum(maps[t] for t in others), **opts)
                against = [s]
            for i, r in enumerate(found):
                sizes[i].append(r.size / study.p)
                queries.append(r.extraction_queries + (r.refine_queries or 0))
                dices[i] += [dice(r.mask.numpy(), study.rex[i][t]) for t in against]
        row = {"extraction": f"ours, {label}", "maps": mode, **opts, **judged(sizes, dices, queries)}
        rows.append(row)
        which = "each seed's map" if mode == "single" else "the other seeds' maps pooled"
        print(f"ours, {label} ({which}): median MPS "
              f"{100 * row['median_mps_fraction']:.2f}% (per seed, mean of medians "
              f"{100 * row['mean_of_per_seed_medians']:.2f}%), Dice to ReX's other seeds "
              f"{row['dice_to_other_rex_seeds']:.3f} (mean over photos {row['mean_dice_over_photos']:.3f}), "
              f"extraction queries median {row['median_extraction_queries']:.0f} "
              f"mean {row['mean_extraction_queries']:.0f}", flush=True)
    print(f"wrote {write_results('rex_map_extraction', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
