"""The cold case of virtual descents: fast_sis(method="responsibility", virtual_iterations=V) in a fresh process
on one photo, for each V, in interleaved rounds (minimum over rounds).

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python cold_virtual.py --onnx /tmp/rexkeep/efficientnet_lite0.onnx
    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python cold_virtual.py --onnx ... --sweep 8 4,g9,v100 --baseline /old

``--onnx``: EfficientNet-Lite0 as an ONNX file (bench_responsibility.py --keep writes one). ``--sweep``: instead
of ``--virtual``, option sets in bench_responsibility.py's ``--sweep`` syntax (``K[,full][,gG][,vV]``).
``--baseline PATH``: also, in the same rounds, the overinterp_fast at PATH (e.g. a checkout of an older commit)
with the last option set (the largest V).
Writes benchmarks/results/cold_virtual_cpu.json.
"""
from __future__ import annotations

import argparse

from bench_responsibility import OPTION_KEYS, cold_case, describe_options, sweep_point
from common import write_results


def label(opts: tuple) -> str:
    d = dict(opts)
    return describe_options(d) if "iterations" in d else f"virtual_iterations={d['virtual_iterations']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--photo", default="chelsea")
    ap.add_argument("--virtual", type=int, nargs="*", default=[0, 40])
    ap.add_argument("--sweep", nargs="*", default=None, metavar="SPEC",
                    help="option sets instead of --virtual (bench_responsibility.py --sweep syntax)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="PYTHONPATH of an overinterp_fast to compare with")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    points = ([tuple(sweep_point(spec).items()) for spec in args.sweep] if args.sweep is not None
              else [(("virtual_iterations", v),) for v in sorted(args.virtual)])
    plan = [("this checkout", None, opts) for opts in points]
    if args.baseline:
        plan.append((f"baseline {args.baseline}", args.baseline, points[-1]))
    runs: dict[tuple, list[dict]] = {key: [] for key in plan}
    for r in range(args.rounds):
        for key in plan:
            one = cold_case(args.onnx, args.photo, pythonpath=key[1], **dict(key[2]))
            runs[key].append(one)
            print(f"round {r} {key[0]}, {label(key[2])}: {one['call_s']:.2f} s in fast_sis, "
                  f"{one['process_s']:.2f} s in all, {one['queries']} queries, MPS {one['mps_pixels']} pixels",
                  flush=True)
    rows = [{"code": code, **dict(opts), "min_call_s": min(x["call_s"] for x in got),
             "min_process_s": min(x["process_s"] for x in got), "runs": got} for (code, _, opts), got in runs.items()]
    for row in rows:
        print(f"{row['code']}, {label(tuple((k, row[k]) for k in row if k in OPTION_KEYS))}: min {row['min_call_s']:.2f} s in "
              f"fast_sis, {row['min_process_s']:.2f} s in all")
    print(f"wrote {write_results('cold_virtual', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
