"""Warm A/B of fast_sis(method="responsibility") on the 7 photos: this checkout against another overinterp_fast.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python warm_ab.py --onnx /tmp/rexkeep/efficientnet_lite0.onnx --baseline /old

Each round runs one fresh process per code (interleaved); a process explains the 7 photos once to warm up, then
``--reps`` more times, and reports its fastest call. Minima over rounds, and the ratio, are printed; the sets of the
two codes are compared (they must be the same: a change of speed only). ``--sweep SPEC``: the options, in
bench_responsibility.py's --sweep syntax (default: the defaults, iterations=8). Writes
benchmarks/results/warm_ab_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench_responsibility import sweep_point
from common import write_results

WARM = """
import json, time, torch, overinterp_fast as of
from overinterp_fast.zoo.imagenet import load_photos
x, _, _ = load_photos(224)
m = of.OnnxModel({onnx!r})
of.fast_sis(m, x, method="responsibility", progress=False{kw})
best = float("inf")
for _ in range({reps}):
    t = time.perf_counter()
    r = of.fast_sis(m, x, method="responsibility", progress=False{kw})
    best = min(best, time.perf_counter() - t)
print(json.dumps({{"best_s": best, "sizes": [int(v.size) for v in r], "queries": [int(v.total_queries) for v in r]}}))
"""


def run(onnx: str, pythonpath: str, reps: int, options: dict) -> dict:
    kw = "".join(f", {k}={v!r}" for k, v in options.items())
    out = subprocess.run([sys.executable, "-c", WARM.format(onnx=onnx, reps=reps, kw=kw)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": pythonpath})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--baseline", required=True, help="PYTHONPATH of the overinterp_fast to compare with")
    ap.add_argument("--sweep", default="8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    options = sweep_point(args.sweep)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    codes = {"this checkout": here, f"baseline {args.baseline}": args.baseline}
    runs: dict[str, list[dict]] = {c: [] for c in codes}
    for r in range(args.rounds):
        for code, path in codes.items():
            runs[code].append(run(args.onnx, path, args.reps, options))
            print(f"round {r} {code}: {runs[code][-1]['best_s'] / 7:.3f} s per image", flush=True)
    rows = [{"code": code, "options": options, "min_s_per_image": min(x["best_s"] for x in got) / 7, "runs": got}
            for code, got in runs.items()]
    same = all(a["sizes"] == b["sizes"] and a["queries"] == b["queries"] for a, b in zip(*runs.values()))
    print(f"this checkout {rows[0]['min_s_per_image']:.3f} s per image, baseline {rows[1]['min_s_per_image']:.3f} s "
          f"-> {rows[1]['min_s_per_image'] / rows[0]['min_s_per_image']:.3f}x; same sets and queries: {same}")
    print(f"wrote {write_results('warm_ab', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
