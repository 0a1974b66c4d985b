"""Exact SIS: fast_sis against the in-package reference and against the floor, in one run.

floor = the bare forward passes (and softmax) of the same number of candidates,
in batches of the size fast_sis used, on candidate-like inputs built once
(masked copies of the images, common.candidate_like_batch; no masking work, no
bookkeeping, no scheduling).

    .venv/bin/python benchmarks/bench_exact.py            # CPU table, writes benchmarks/results/exact_cpu.json
    .venv/bin/python benchmarks/bench_exact.py --device cuda
    .venv/bin/python benchmarks/bench_exact.py --cold     # the cold single-image case (one small image, from a fresh process)

Engines: "fast" is fast_sis with default options (engine="auto", calibrated batch
size, incremental=None: incremental inference where the plan estimates it pays);
"incr" forces incremental=True (docs: algorithms.md, Incremental inference); "torch" and "ort" force dense
engine="torch" (incremental=False) and engine="onnxruntime" (the ONNX
export is cached per process, so it is paid in the warm-up). Every contender's
SIS is compared with the reference's.

Cold (--cold): each run is a fresh Python process (import, model, one image,
one call), as a user runs it; contenders interleaved, minima over rounds. The
case: one 3x24x24 float32 image, the small CNN with three
convolutions, pixel features (p = 576, 166,176 candidates); contenders: default
options, batch_size=75 (the size the former fixed element budget chose),
batch_size=576 (one call per step), engine="onnxruntime", and the in-package
reference. Reported: the call's time inside the process and the process's wall
time, and ratios of minima.

Method: timings on shared 2-core machines vary by about 30% from run to run, so
the three contenders are run in interleaved rounds (order rotated each round)
and the table reports the minimum time of each and the ratios of those minima.

Configs (sized for 2 CPU cores; on a GPU use --images and --full):
  cnn16-px     small CNN, 16x16, one feature per pixel (p = 256)
  cnn32-2x2    small CNN, 32x32, 2x2 patches (p = 256)
  resnet20-4x4 ResNet-20, 32x32, 4x4 patches (p = 64)
  cnn32-px     small CNN, 32x32, pixels (p = 1024; --full only: minutes per run on 2 cores)
  resnet20-px  ResNet-20, 32x32, pixels (p = 1024; --full only)
  effnet-32x32 EfficientNet-Lite0 (ImageNet weights), 224x224, 32x32 patches (p = 49; --full only)

Incremental inference, the maintainers' command on a quiet machine
(about 10 minutes on 2 cores; pixel configs are one image, 525k candidates at 32x32):
    .venv/bin/python benchmarks/bench_exact.py --configs cnn16-px cnn32-px resnet20-px effnet-32x32 \
        --no-engines --rounds 2
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time

import torch

import overinterp_fast as of
from overinterp_fast.runtime import calibration

from common import CONFIGS, candidate_like_batch, make_case, patch_map, timed, write_results

DEFAULT = ["cnn16-px", "cnn32-2x2", "resnet20-4x4"]


def floor_run(model, x: torch.Tensor, candidates: int) -> None:
    """The forward passes fast_sis cannot avoid: ``candidates`` inputs in batches of ``batch = len(x)``."""
    batch = x.shape[0]
    with torch.inference_mode():
        for _ in range(candidates // batch):
            torch.softmax(model(x), 1)
        if candidates % batch:
            torch.softmax(model(x[: candidates % batch]), 1)


def dense_batch_size(model, images, features) -> int:
    """The batch size fast_sis's dense torch engine runs this job at (its calibration, cached), without a run."""
    from overinterp_fast.api import _engine, _setup
    from overinterp_fast.runtime.model import initial_predictions
    s = _setup(model, images, 0.5, features, 0.0, "logits", None, "exact")
    n, p = s.prep.images.shape[0], s.prep.num_features
    with torch.inference_mode():  # fast_sis's own steps for method="exact" with engine="torch"
        targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
        eng = _engine(s, "torch", targets, max_rows=n * p, expected_rows=n * p * (p + 1) // 2, exact_shape=(n, p))
    return eng.batch_size


class _Decisions(logging.Handler):
    """Collects overinterp_fast's 'incremental inference on/off (...)' lines: which path auto took."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "incremental inference" in msg:
            self.lines.append(msg)


def run_config(name, n_images, device, rounds, skip_reference=False, engines=True, skip=(), warmup=True):
    model, images, features, p = make_case(name, n_images, device)
    n, size = images.shape[0], images.shape[-1]
    candidates = n * p * (p + 1) // 2
    contenders = {"fast": lambda: of.fast_sis(model, images, 0.5, features=features, progress=False)}
    contenders["incr"] = lambda: of.fast_sis(model, images, 0.5, features=features, progress=False,
                                             incremental=True)
    if engines:
        contenders["torch"] = lambda: of.fast_sis(model, images, 0.5, features=features, progress=False,
                                                  engine="torch", incremental=False)
        contenders["ort"] = lambda: of.fast_sis(model, images, 0.5, features=features, progress=False,
                                                engine="onnxruntime")
    for k in skip:
        contenders.pop(k, None)
    decisions = _Decisions()
    log = logging.getLogger("overinterp_fast")
    log.addHandler(decisions)
    log.setLevel(logging.INFO)
    engine_used = {}
    if warmup:  # kernels, allocator, calibration, the ONNX export (skip on configs that take minutes per run)
        with torch.inference_mode():
            warm = {k: f() for k, f in contenders.items()}
        engine_used = {k: r[0].engine for k, r in warm.items()}
    batch = dense_batch_size(model, images, features)  # what the dense torch engine runs at
    floor_batch = candidate_like_batch(images, features, batch)
    contenders["floor"] = lambda: floor_run(model, floor_batch, candidates)
    if not skip_reference:
        contenders["reference"] = lambda: of.reference.sis(model, images, 0.5, features=features)
    times = {k: [] for k in contenders}
    outputs = {}
    names = list(contenders)
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t, outputs[k] = timed(contenders[k], device)
            times[k].append(t)
            print(f"  {name} round {r} {k:<10} {t:9.2f} s", file=sys.stderr, flush=True)
    best = {k: min(v) for k, v in times.items()}
    log.removeHandler(decisions)
    engine_used = engine_used or {k: outputs[k][0].engine for k in outputs if k not in ("floor", "reference")}
    row = {
        "config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
        "batch_size": batch, "rounds": rounds, "times_s": times, "engine_used": engine_used,
        "auto_decisions": sorted(set(decisions.lines)), "warmup": warmup,
        "fast_s": best["fast"], "floor_s": best["floor"], "fast_over_floor": best["fast"] / best["floor"],
        "fast_candidates_per_s": candidates / best["fast"], "floor_candidates_per_s": candidates / best["floor"],
    }
    for k in ("torch", "ort", "incr"):
        if k in best:
            row[f"{k}_s"] = best[k]
            row[f"{k}_over_floor"] = best[k] / best["floor"]
    if not skip_reference:
        ref = outputs["reference"]
        row.update(reference_s=best["reference"], speedup_vs_reference=best["reference"] / best["fast"],
                   same_order=all(torch.equal(a.order, b.order) for a, b in zip(outputs["fast"], ref)))
        if "incr" in best:
            row["incr_speedup_vs_reference"] = best["reference"] / best["incr"]
        for k in ("fast", "torch", "ort", "incr"):
            if k in outputs:
                row[f"{k}_same_sis_as_reference"] = all(
                    (a.sis is None) == (b.sis is None) and (a.sis is None or torch.equal(a.sis, b.sis))
                    for a, b in zip(outputs[k], ref))
        if "ort" in best:
            row["ort_speedup_vs_reference"] = best["reference"] / best["ort"]
    return row


# ---- the cold single-image case: one fresh process per run ----

COLD_CONTENDERS = {
    # name: the call, in the child (model, image bound there)
    "default": "of.fast_sis(model, x, TAU, progress=False)",
    "batch75": "of.fast_sis(model, x, TAU, progress=False, batch_size=75)",
    "batch576": "of.fast_sis(model, x, TAU, progress=False, batch_size=576)",
    "onnxruntime": "of.fast_sis(model, x, TAU, progress=False, engine='onnxruntime')",
    "reference": "of.reference.sis(model, x, TAU)",
}

COLD_CHILD = """
import time
t0 = time.perf_counter()
import json, torch
import overinterp_fast as of
from overinterp_fast.runtime import calibration
from overinterp_fast.zoo.cifar import SmallCNN
torch.manual_seed(0)
model = SmallCNN({size}).eval().to("{device}")
x = torch.randn(1, 3, {size}, {size}, generator=torch.Generator().manual_seed(1)).to("{device}")
TAU = {tau}
t1 = time.perf_counter()
res = {call}
t2 = time.perf_counter()
cal = calibration.LAST[0] if calibration.LAST else None
print(json.dumps({{"call_s": t2 - t1, "process_s": t2 - t0, "import_s": t1 - t0,
                  "engine": "reference" if {is_ref} else res[0].engine,
                  "batch_size": None if cal is None else cal.batch_size,
                  "calibration_s": None if cal is None else cal.spent_s,
                  "sis": None if res[0].sis is None else res[0].sis.tolist()}}))
"""


def run_cold(size: int, rounds: int, names: list[str], tau: float, device: str = "cpu") -> dict:
    """Each contender ``rounds`` times, each run a fresh process; order rotated per round."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")]))
    runs = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            code = COLD_CHILD.format(size=size, tau=tau, call=COLD_CONTENDERS[k], is_ref=k == "reference",
                                    device=device)
            t = time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            rec["wall_s"] = time.perf_counter() - t
            runs[k].append(rec)
            print(f"  round {r} {k:<12} call {rec['call_s']:7.2f} s  process {rec['process_s']:7.2f} s  "
                  f"B={rec['batch_size']} engine={rec['engine']}", flush=True)
    best = {k: min(x["call_s"] for x in v) for k, v in runs.items()}
    best_process = {k: min(x["process_s"] for x in v) for k, v in runs.items()}
    sis = {k: v[0]["sis"] for k, v in runs.items()}
    row = {"config": f"cold-cnn{size}-px-1", "device": device, "size": size, "images": 1, "features": size * size,
           "candidates": size * size * (size * size + 1) // 2, "threshold": tau, "rounds": rounds, "runs": runs,
           "call_s": best, "process_s": best_process,
           "same_sis": {k: sis[k] == sis.get("reference", sis[k]) for k in sis}}
    for base in ("reference", "batch576", "batch75"):
        if base in best:
            row[f"over_{base}"] = {k: best[k] / best[base] for k in best}
    return row


def main_cold(args):
    names = args.cold_contenders or list(COLD_CONTENDERS)
    print(f"cold single-image case: SmallCNN, 1 x 3 x {args.cold_size}^2, pixels, tau {args.tau}, "
          f"{args.rounds} rounds, fresh process per run, {args.device}")
    row = run_cold(args.cold_size, args.rounds, names, args.tau, args.device)
    print(f"{'contender':<13}{'call s':>9}{'process s':>11}{'/reference':>12}{'/batch576':>11}{'same SIS':>10}")
    for k in names:
        print(f"{k:<13}{row['call_s'][k]:>9.2f}{row['process_s'][k]:>11.2f}"
              f"{row.get('over_reference', {}).get(k, math.nan):>12.3f}"
              f"{row.get('over_batch576', {}).get(k, math.nan):>11.3f}{str(row['same_sis'][k]):>10}")
    out = write_results("exact_cold", args.device, [row], args.out)
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=None, choices=list(CONFIGS))
    ap.add_argument("--full", action="store_true", help="also the 32x32 pixel-feature configs")
    ap.add_argument("--images", type=int, default=None, help="images per config (default: per config)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; minima are reported (default 3)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--no-engines", action="store_true", help="skip the engine='torch'/'onnxruntime' columns")
    ap.add_argument("--skip", nargs="*", default=(), choices=["incr"],
                    help="contenders not to time (e.g. incr: on long configs where the default runs incrementally)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no untimed first run of each contender (configs of minutes per run; the first timed "
                         "round then includes calibration, as a user's first call does)")
    ap.add_argument("--cold", action="store_true", help="the cold single-image case instead (fresh process per run)")
    ap.add_argument("--cold-size", type=int, default=24, help="--cold: image side (default 24)")
    ap.add_argument("--cold-contenders", nargs="*", default=None, choices=list(COLD_CONTENDERS))
    ap.add_argument("--tau", type=float, default=0.5, help="--cold: threshold (default 0.5)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/exact_<device>.json)")
    args = ap.parse_args()
    if args.cold:
        main_cold(args)
        return
    device = torch.device(args.device)
    names = args.configs or (DEFAULT + (["cnn32-px", "resnet20-px", "effnet-32x32"] if args.full else []))
    rows = []
    head = (f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'B':>6}{'fast s':>9}{'incr s':>9}{'torch s':>9}{'ort s':>9}"
            f"{'floor s':>9}{'ref s':>9}{'fast/floor':>11}{'incr/floor':>11}{'ort/floor':>10}{'ref/fast':>9}"
            f"{'ref/incr':>9}{'ref/ort':>8}{'incr SIS':>9}{'engine':>13}")
    print(head)
    for name in names:
        row = run_config(name, args.images, device, args.rounds, args.no_reference, not args.no_engines, args.skip,
                         not args.no_warmup)
        rows.append(row)
        print(f"{name:<14}{row['images']:>3}{row['features']:>6}{row['candidates']:>9}{row['batch_size']:>6}"
              f"{row['fast_s']:>9.2f}{row.get('incr_s', math.nan):>9.2f}{row.get('torch_s', math.nan):>9.2f}"
              f"{row.get('ort_s', math.nan):>9.2f}{row['floor_s']:>9.2f}{row.get('reference_s', math.nan):>9.2f}"
              f"{row['fast_over_floor']:>11.3f}{row.get('incr_over_floor', math.nan):>11.3f}{row.get('ort_over_floor', math.nan):>10.3f}"
              f"{row.get('speedup_vs_reference', math.nan):>9.2f}{row.get('incr_speedup_vs_reference', math.nan):>9.2f}"
              f"{row.get('ort_speedup_vs_reference', math.nan):>8.2f}"
              f"{str(row.get('incr_same_sis_as_reference', '-')):>9}{row['engine_used']['fast']:>13}", flush=True)
        for line in row["auto_decisions"]:
            print(f"  auto: {line}", flush=True)
    out = write_results("exact", device, rows, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
