"""The estimate a run states before it starts, against the time it then takes: exact SIS with default options.

    python benchmarks/bench_estimate.py                                   # CPU -> results/estimate-cpu.json
    python benchmarks/bench_estimate.py --configs cnn16-px stride24-px --runs 2

For each configuration (common.CONFIGS) the same call runs ``--runs`` times in one process: the first is a user's
first call (its engine choice, calibrations and format measurement come before the estimate and are not part of
it), the later ones find those kept. Each run records the estimate's seconds (read from the estimate the run
announces, runtime.estimate.announced), the time from the announcement to the end of the run (what the estimate
predicts), the whole call's time, and the ratio measured / estimated. The target: every ratio within [0.5, 2].
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import CONFIGS, explain, make_case, write_results  # noqa: E402

from overinterp_fast.runtime import estimate  # noqa: E402

DEFAULT = ["cnn16-px", "cnn32-2x2", "resnet20-4x4", "stride12-px", "stride24-px"]


class Announcements:
    """Wraps runtime.estimate.announced: each announced estimate with the clock at its announcement and at the end
    of its block."""

    def __init__(self):
        self.seen: list[dict] = []
        self._real = estimate.announced

    def __enter__(self):
        real = self._real

        @contextlib.contextmanager
        def announced(est):
            record = {"estimate_s": est.seconds, "rows": est.rows, "line": est.line(), "start": time.perf_counter()}
            self.seen.append(record)
            with real(est) as inner:
                try:
                    yield inner
                finally:
                    record["end"] = time.perf_counter()

        estimate.announced = announced
        return self

    def __exit__(self, *exc):
        estimate.announced = self._real


def run_config(name: str, runs: int) -> dict:
    model, images, features, p = make_case(name, None, "cpu")
    row = {"config": name, "images": images.shape[0], "features": p, "runs": []}
    for i in range(runs):
        with Announcements() as seen:
            t0 = time.perf_counter()
            res = explain(model, images, 0.9, feature_mask=features)
            call_s = time.perf_counter() - t0
        (record,) = seen.seen
        measured = record["end"] - record["start"]
        info = res[0].info
        run = {"estimate_s": record["estimate_s"], "measured_s": measured, "call_s": call_s,
               "ratio": measured / record["estimate_s"], "line": record["line"], "engine": info.engine,
               "step": info.step, "channels_last": info.channels_last, "batch_size": info.batch_size}
        row["runs"].append(run)
        print(f"{name:14s} run {i}: estimate {record['estimate_s']:7.2f} s  measured {measured:7.2f} s  "
              f"ratio {run['ratio']:.2f}  (call {call_s:.2f} s; {info.engine}, {info.step}, "
              f"channels_last {info.channels_last})", flush=True)
    row["worst_ratio"] = max((r["ratio"] for r in row["runs"]), key=lambda r: max(r, 1 / r))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=DEFAULT, choices=list(CONFIGS))
    ap.add_argument("--runs", type=int, default=2, help="calls per configuration in one process (default 2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = [run_config(name, args.runs) for name in args.configs]
    within = all(0.5 <= r["ratio"] <= 2.0 for row in rows for r in row["runs"])
    print(f"every estimate within 2x of its run: {within}")
    print("wrote", write_results("estimate", "cpu", rows, args.out, within_2x=within))


if __name__ == "__main__":
    main()
