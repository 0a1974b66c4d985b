"""The cold case of virtual descents: fast_sis(method="responsibility", virtual_iterations=V) in a fresh process
on one photo, for each V, in interleaved rounds (minimum over rounds). Issue 14.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python cold_virtual.py --onnx /tmp/rexkeep/efficientnet_lite0.onnx

``--onnx``: EfficientNet-Lite0 as an ONNX file (bench_responsibility.py --keep writes one). ``--baseline PATH``:
also, in the same rounds, the overinterp_fast at PATH (e.g. a checkout of an older commit) with the largest V.
Writes benchmarks/results/cold_virtual_cpu.json.
"""
from __future__ import annotations

import argparse

from bench_responsibility import cold_case
from common import write_results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--photo", default="chelsea")
    ap.add_argument("--virtual", type=int, nargs="*", default=[0, 40])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="PYTHONPATH of an overinterp_fast to compare with")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    plan = [("this checkout", None, v) for v in args.virtual]
    if args.baseline:
        plan.append((f"baseline {args.baseline}", args.baseline, max(args.virtual)))
    runs: dict[tuple, list[dict]] = {key: [] for key in plan}
    for r in range(args.rounds):
        for key in plan:
            one = cold_case(args.onnx, args.photo, pythonpath=key[1], virtual_iterations=key[2])
            runs[key].append(one)
            print(f"round {r} {key[0]}, virtual_iterations={key[2]}: {one['call_s']:.2f} s in fast_sis, "
                  f"{one['process_s']:.2f} s in all, {one['queries']} queries, MPS {one['mps_pixels']} pixels",
                  flush=True)
    rows = [{"code": label, "virtual_iterations": v, "min_call_s": min(x["call_s"] for x in got),
             "min_process_s": min(x["process_s"] for x in got), "runs": got} for (label, _, v), got in runs.items()]
    for row in rows:
        print(f"{row['code']}, virtual_iterations={row['virtual_iterations']}: min {row['min_call_s']:.2f} s in "
              f"fast_sis, {row['min_process_s']:.2f} s in all")
    print(f"wrote {write_results('cold_virtual', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
