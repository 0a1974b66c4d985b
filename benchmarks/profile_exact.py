"""Where exact SIS's time goes: torch.profiler over one default fast_sis call, grouped by operator.

    cd benchmarks && ../.venv/bin/python profile_exact.py --configs cnn16-px effnet-32x32
    ../.venv/bin/python profile_exact.py --configs resnet20-px --step   # one step's candidates only (525k in full)

Prints, per config, the share of self CPU time of the top operators (the model's own
convolutions and activations, the package's ops: mask_apply, patch_gather,
backselect_update, ...) and writes benchmarks/results/profile_exact_cpu.json.
--step profiles one backward-selection step of the first image instead of the
whole call: the candidates scored the way the default would score them
(incrementally when auto picks it, else dense), for configs too long to profile whole.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import overinterp_fast as of
from common import CONFIGS, make_case, write_results


def _table(prof, top: int, wall_s: float) -> list[dict]:
    """Top operators by self time (on the calling thread), as shares of the wall time; the rest of the
    wall time ran outside torch operators (an ONNX Runtime session's run, Python, scheduling)."""
    ev = prof.key_averages()
    inside = sum(e.self_cpu_time_total for e in ev) / 1e6
    rows = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:top]
    out = [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / 1e6 / wall_s,
            "calls": e.count} for e in rows]
    out.append({"op": "(outside torch operators: ONNX Runtime, Python)", "self_cpu_ms": max(0.0, wall_s - inside) * 1e3,
                "share": max(0.0, wall_s - inside) / wall_s, "calls": 0})
    return out


def _step(model, images, features):
    """One step's candidates of image 0 (p of them), scored as the default path would."""
    from overinterp_fast.runtime import incremental
    from overinterp_fast.api import _setup
    from overinterp_fast.runtime.batching import CandidateEvaluator
    from overinterp_fast.runtime.engines import incremental_calibration, incremental_pays, select_engine
    from overinterp_fast.runtime.model import initial_predictions
    s = _setup(model, images[:1], 0.5, features, 0.0, "logits", None, "exact")
    n, p = 1, s.prep.num_features
    with torch.inference_mode():
        targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
        eng = select_engine("auto", s.fn, s.prep, targets, batch_size=None, max_rows=p,
                            expected_rows=p * (p + 1) // 2, exact_shape=(n, p))
        pl = incremental.choose(s.fn, s.prep, None)
        present = torch.ones(1, p, dtype=torch.bool)
        image = torch.zeros(p, dtype=torch.int64)
        feature = torch.arange(p)
        if pl is not None:
            icl = incremental_calibration(pl, s.fn, s.prep, targets, batch_size=None, exact_shape=(n, p))
            if incremental_pays(pl, icl, eng, (n, p)):
                s.runner.chunk = icl.batch_size
                ev = incremental.IncrementalEvaluator(pl, s.fn, s.prep, targets, s.runner)
                return "incremental", lambda: ev(present, image, image, feature)
        s.runner.chunk = eng.batch_size
        ev = CandidateEvaluator(eng.fn, s.prep, targets, s.runner)
        return eng.name, lambda: ev(present, image, image, feature)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cnn16-px", "effnet-32x32"], choices=list(CONFIGS))
    ap.add_argument("--step", action="store_true", help="profile one step's candidates, not the whole call")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    rows = []
    for name in args.configs:
        model, images, features, p = make_case(name, None, "cpu")
        if args.step:
            path, run = _step(model, images, features)
        else:
            path = "fast_sis default"
            of.fast_sis(model, images, 0.5, features=features, progress=False)  # warm: calibration, kernels

            def run():
                return of.fast_sis(model, images, 0.5, features=features, progress=False)
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            run()
            wall = time.perf_counter() - t0
        table = _table(prof, args.top, wall)
        rows.append({"config": name, "step_only": args.step, "path": path, "wall_s": wall, "top": table})
        print(f"{name} ({'one step, ' if args.step else ''}{path}, {wall:.2f} s under the profiler):")
        for r in table:
            print(f"  {r['share']:6.1%} {r['self_cpu_ms']:10.1f} ms {r['calls']:7d}x  {r['op']}")
    print(f"wrote {write_results('profile_exact', 'cpu', rows, args.out)}")


if __name__ == "__main__":
    main()
