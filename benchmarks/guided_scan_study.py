"""Does the guided prefix search find the scan's first passing prefix? On the model, for many rankings.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python bench_responsibility.py --keep /tmp/rexkeep   # ReX's maps
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python guided_scan_study.py --rex-dir /tmp/rexkeep   # about 6 min, 2 cores

ReX's extraction tries the prefixes of its ranking in steps of 10 pixels and keeps the first that passes
(top-1 = target). fast_sis's default extraction finds that first passing prefix with the margin-guided
search of overinterp_fast/guided.py instead of trying every size. This script runs both on EfficientNet-Lite0
(bench_responsibility.py's kept ONNX file) and the 7 photos, for the rankings of

- ReX's own maps (``map{i}`` of rex{seed}.npz: 20 descents; pixels ranked one by one, as ReX does),
- our maps: the defaults (8 monotone descents) and 4 real + 9 gated + 100 virtual descents, seeds 0, 20, 40,
  each ranked square by square (fast_sis's default ``block``) and pixel by pixel,

and reports per ranking whether the guided search returned the scan's answer, the sizes, and the forward
passes: the guided search's (the empty prefix included) against the scan's (one per size up to the answer,
what ReX spends; fast_sis's batched scan spends a few more, past the answer). Every answer of both is a
passing prefix by construction; the script checks the guided answer's predecessor fails.
Writes benchmarks/results/guided_scan_study_cpu.json.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import overinterp_fast as of
from overinterp_fast.methods.blocks import block_positions
from overinterp_fast.methods.guided import guided_first_prefix
from overinterp_fast.methods.prefix import first_passing_prefix
from overinterp_fast.methods.responsibility import ranking_positions

from common import write_results
from rex_map_extraction import rex_maps
from window_study import Study


def margin(r, f, top1, m):
    return m


def compare(study: Study, label: str, pos: torch.Tensor, step: int = 10) -> list[dict]:
    """The scan and the guided search over the rankings ``pos`` (int64 [n, H*W], one per photo)."""
    n, p = study.n, study.p
    images = list(range(n))
    sizes = [list(range(step, p, step)) + [p] for _ in images]
    passes = lambda r, f, top1: bool(top1)  # noqa: E731
    scan = first_passing_prefix(study.ev, pos, images, sizes, passes)
    guided, queries = guided_first_prefix(study.ev, pos, images, sizes, passes, margin)
    rows = []
    for i in images:
        s, g = scan[i], guided[i]
        before_fails = None
        if g is not None and g[0] > 0:  # the guided answer's predecessor, checked on the model
            f, top1 = study.ev(pos[i:i + 1] < sizes[i][g[0] - 1], torch.tensor([i]), torch.tensor([0]),
                               torch.tensor([-1]))
            before_fails = not bool(top1[0])
        rows.append({"ranking": label, "photo": study.names[i], "scan_size": None if s is None else sizes[i][s[0]],
                     "guided_size": None if g is None else sizes[i][g[0]],
                     "same": (s is None and g is None) or (s is not None and g is not None and s[0] == g[0]),
                     "scan_queries": len(sizes[i]) if s is None else s[0] + 1, "guided_queries": queries[i],
                     "predecessor_fails": before_fails})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rex-dir", required=True, help="bench_responsibility.py --keep folder (ONNX file, rex*.npz)")
    ap.add_argument("--rex-seeds", type=int, nargs="*", default=[0, 20, 40])
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 20, 40], help="seeds of our maps")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/guided_scan_study_cpu.json")
    args = ap.parse_args()
    study = Study(args.rex_dir, args.rex_seeds, expected_rows=0)
    one = torch.ones(study.n, study.p, dtype=torch.bool)
    rankings = [(f"ReX seed {s}, pixels", ranking_positions(m, one))
                for s, m in zip(args.rex_seeds, rex_maps(args.rex_dir, args.rex_seeds, study.n))]
    settings = {"defaults": dict(iterations=8, monotone=True),
                "4 real + 9 gated + 100 virtual": dict(iterations=4, monotone=True, gated_iterations=9,
                                                       virtual_iterations=100)}
    for name, kw in settings.items():
        for seed in args.seeds:
            maps = of.responsibility(study.s.fn.model, study.s.prep.images, seed=seed, progress=False, **kw)
            m = torch.stack([r.map.flatten() for r in maps])
            rankings.append((f"ours, {name}, seed {seed}, squares",
                             block_positions(m, one, study.h, study.w, study.block)[0]))
            rankings.append((f"ours, {name}, seed {seed}, pixels", ranking_positions(m, one)))
    rows = []
    for label, pos in rankings:
        part = compare(study, label, pos)
        rows += part
        print(f"{label}: same answer {sum(r['same'] for r in part)}/{len(part)}, queries guided "
              f"{[r['guided_queries'] for r in part]} scan {[r['scan_queries'] for r in part]}", flush=True)
    same = sum(r["same"] for r in rows)
    print(f"all: the scan's answer in {same} of {len(rows)}; predecessor fails in "
          f"{sum(r['predecessor_fails'] is not False for r in rows)} of {len(rows)}; median forward passes: guided "
          f"{statistics.median(r['guided_queries'] for r in rows)}, scan {statistics.median(r['scan_queries'] for r in rows)}")
    for r in rows:
        if not r["same"]:
            print(f"  differs: {r['ranking']}, {r['photo']}: scan {r['scan_size']}, guided {r['guided_size']}")
    print(f"wrote {write_results('guided_scan_study', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
