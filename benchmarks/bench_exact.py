"""Exact SIS: fast_sis against the in-package reference and against the bare forward passes, in one run.

    python benchmarks/bench_exact.py                       # CPU: 3 configs + the cold case -> results/exact-cpu.json
    python benchmarks/bench_exact.py --device cuda         # -> results/exact-cuda.json
    python benchmarks/bench_exact.py --no-cold             # the configs only
    python benchmarks/bench_exact.py --cold-only           # the cold case only
    python benchmarks/bench_exact.py --score-dtype bf16 --configs resnet20-4x4 cnn16-px
                                                           # score_dtype against the images' dtype
                                                           # -> results/exact-score-dtype-cpu.json

Contenders, per config, in interleaved rounds (the order rotated each round; minima reported):
  fast       fast_sis with default options (engine="auto", calibrated batch size, incremental=None:
             incremental inference where the plan estimates it pays)
  incr       incremental=True
  torch      engine="torch", incremental=False (dense: every candidate a full forward pass)
  ort        engine="onnxruntime" (the ONNX export is cached per process, so it is paid in the warm-up)
  floor      the bare forward passes (and softmax) of the same number of candidates, in calls of the largest
             batch the dense engine ran (read with a forward pre-hook), on candidate-like inputs built once
             (masked copies of the images: no masking work, no bookkeeping, no scheduling), the model as given
  floor_cl   where the default run scored its candidates with a channels_last copy of the model: the same passes
             through such a copy (``fast_over_floor_cl``: the loop's own overhead over what that run computed)
  reference  overinterp_fast.reference.sis, the plain transcription
Every contender's SIS is compared with the reference's.

--score-dtype bf16|fp16 times, per config, in interleaved rounds (minima reported), one row per config:
  full       engine="torch", incremental=False: every candidate in the images' dtype (float32)
  low        the same with score_dtype (candidates first in bfloat16/float16, the best few again in float32)
and checks that both give the same orders, values and SIS; ``rescored_fraction`` is the share of the candidates
scored again in float32, ``low_log`` the measured margin m and the re-scored K per step. ``forward_low_over_full``:
the bare forward passes of a copy of the model in score_dtype over those in float32 (candidate-like batches at the
dense batch size): the most score_dtype can save here. The CPU's bfloat16 support (avx512_bf16, amx_bf16) is in
the file's "machine".

The cold case: each run a fresh Python process (import, model, one image, one call), as a user runs
it; one 3x24x24 float32 image, the small CNN, pixel features (p = 576, 166,176 candidates);
contenders: default options, batch_size=75, batch_size=576 (one call per step),
engine="onnxruntime", and the reference. Reported: the call's time in the process and the process's
time, minima over rounds, ratios of minima.

The loop's own cost (linear8-px, linear24-px): fast_sis with default options on a near-free model (one linear layer)
against the bare forward passes of exactly its calls (rows recorded with a forward pre-hook, replayed at the same
batch sizes); reported per forward call and per image-step (one backward-selection step of one image), and per
forward call split into the step kernels' own time (exact_candidates and exact_scores: their self time in one more
run under torch.profiler, dispatch included; on a GPU that work runs on the device) and the host's rest:
    python benchmarks/bench_exact.py --configs linear8-px linear24-px --rounds 5 --no-cold

Configs (sized for 2 CPU cores; on a GPU use --images and --full):
  cnn8-px      small CNN, 8x8, pixels (p = 64; a smoke run of seconds)
  cnn16-px     small CNN, 16x16, one feature per pixel (p = 256)
  cnn32-2x2    small CNN, 32x32, 2x2 patches (p = 256)
  resnet20-4x4 ResNet-20, 32x32, 4x4 patches (p = 64)
  cnn32-px     small CNN, 32x32, pixels (p = 1024; --full only: minutes per run on 2 cores)
  resnet20-px  ResNet-20, 32x32, pixels (p = 1024; --full only)
  effnet-32x32 EfficientNet-Lite0 (ImageNet weights), 224x224, 32x32 patches (p = 49; --full only)
  linear8-px   the near-free model, 64 images of 1x8x8, pixels (p = 64): the loop's cost
  linear24-px  the near-free model, 1 image of 1x24x24, pixels (p = 576): the loop's cost

Incremental inference on long configs (about 10 minutes on 2 cores):
    python benchmarks/bench_exact.py --configs cnn16-px cnn32-px resnet20-px effnet-32x32 --no-engines --rounds 2
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from common import (CONFIGS, batches, candidate_like_batch, eager_rows, explain, floor_run, fresh_process,  # noqa: E402
                    graphs_off, interleaved, make_case, same_sis, write_results)

DEFAULT = ["cnn16-px", "cnn32-2x2", "resnet20-4x4"]
DENSE = {"engine": "torch", "incremental": False}


class _Decisions(logging.Handler):
    """Collects overinterp_fast's log lines that contain ``needle`` (default: 'incremental inference on/off
    (...)': which path auto took)."""

    def __init__(self, needle: str = "incremental inference"):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.needle = needle

    def emit(self, record):
        msg = record.getMessage()
        if self.needle in msg:
            self.lines.append(msg)


def dense_batch_size(model, images, features) -> tuple[int, bool]:
    """(the rows per call of fast_sis's dense torch engine on this job: the largest call of one recorded run,
    whether that run scored its candidates with a channels_last copy of the model).

    After the warm-up the calibration is cached and every call is the job's; with --no-warmup this run also
    holds the calibration's timing calls, at most the job's rows per step each. The calls of a channels_last copy
    of the model are recorded too (:class:`~common.RowRecorder`).
    """
    rows, res = eager_rows(model, lambda: explain(model, images, 0.5, feature_mask=features, **DENSE))
    info = res[0].info
    return (max(rows) if rows else info.batch_size), bool(info.channels_last)


def contenders_for(model, images, features, engines: bool, skip) -> dict:
    run = lambda **kw: (lambda: explain(model, images, 0.5, feature_mask=features, **kw))  # noqa: E731
    contenders = {"fast": run(), "incr": run(incremental=True)}
    if engines:
        contenders.update(torch=run(**DENSE), ort=run(engine="onnxruntime"))
    for k in skip:
        contenders.pop(k, None)
    return contenders


def run_config(name, n_images, device, rounds, skip_reference=False, engines=True, skip=(), warmup=True) -> dict:
    model, images, features, p = make_case(name, n_images, device)
    n = images.shape[0]
    candidates = n * p * (p + 1) // 2
    contenders = contenders_for(model, images, features, engines, skip)
    decisions = _Decisions()
    log = logging.getLogger("overinterp_fast")
    log.addHandler(decisions)
    log.setLevel(logging.INFO)
    engine_used = {}
    if warmup:  # kernels, allocator, calibration, the ONNX export (skip on configs that take minutes per run)
        warm = {k: f() for k, f in contenders.items()}
        engine_used = {k: r[0].engine for k, r in warm.items()}
    batch, channels_last = dense_batch_size(model, images, features)
    floor_batch = candidate_like_batch(images, features, batch)
    contenders["floor"] = lambda: floor_run(model, floor_batch, batches(candidates, batch))
    if channels_last:  # the same passes through a channels_last copy, as the default runs make them
        cl = torch.channels_last
        cl_model, cl_batch = copy.deepcopy(model).to(memory_format=cl), floor_batch.contiguous(memory_format=cl)
        contenders["floor_cl"] = lambda: floor_run(cl_model, cl_batch, batches(candidates, batch))
    if not skip_reference:
        contenders["reference"] = lambda: of.reference.sis(model, images, 0.5, feature_mask=features)
    times, outputs = interleaved(contenders, rounds, device, name)
    log.removeHandler(decisions)
    best = {k: min(v) for k, v in times.items()}
    engine_used = engine_used or {k: outputs[k][0].engine for k in outputs
                                  if k not in ("floor", "floor_cl", "reference")}
    row = {
        "config": name, "device": str(device), "images": n, "features": p, "candidates": candidates,
        "batch_size": batch, "rounds": rounds, "times_s": times, "engine_used": engine_used,
        "auto_decisions": sorted(set(decisions.lines)), "warmup": warmup,
        "fast_s": best["fast"], "floor_s": best["floor"], "fast_over_floor": best["fast"] / best["floor"],
        "fast_candidates_per_s": candidates / best["fast"], "floor_candidates_per_s": candidates / best["floor"],
        "channels_last": channels_last,
    }
    if "floor_cl" in best:
        row.update(floor_cl_s=best["floor_cl"], fast_over_floor_cl=best["fast"] / best["floor_cl"])
    for k in ("torch", "ort", "incr"):
        if k in best:
            row[f"{k}_s"] = best[k]
            row[f"{k}_over_floor"] = best[k] / best["floor"]
    if not skip_reference:
        ref = outputs["reference"]
        row.update(reference_s=best["reference"], speedup_vs_reference=best["reference"] / best["fast"],
                   same_order=all(torch.equal(a.order.cpu(), b.order.cpu()) for a, b in zip(outputs["fast"], ref)))
        for k in ("incr", "ort"):
            if k in best:
                row[f"{k}_speedup_vs_reference"] = best["reference"] / best[k]
        for k in ("fast", "torch", "ort", "incr"):
            if k in outputs:
                row[f"{k}_same_sis_as_reference"] = same_sis(outputs[k], ref)
    return row


# ---- the loop's own cost ----

LOOP_CONFIGS = ("linear8-px", "linear24-px")


def recorded_calls(model, images, features) -> tuple[list[int], list]:
    """(rows of every forward call of fast_sis's default run, its results): recorded with CUDA graphs off, whose
    replays do not call the module's hooks."""
    return eager_rows(model, lambda: explain(model, images, 0.5, feature_mask=features))


def run_loop_cost(name, n_images, device, rounds, warmup=True) -> dict:
    """One row: fast_sis with default options on a near-free model against the bare forward passes (and softmax)
    of exactly its calls, replayed at the same batch sizes on candidate-like inputs. The difference is the loop's
    own cost: building the candidates, the schedule, the bookkeeping and the reads."""
    model, images, features, p = make_case(name, n_images, device)
    fast = lambda: explain(model, images, 0.5, feature_mask=features)  # noqa: E731
    if warmup:
        fast()
    calls, res = recorded_calls(model, images, features)
    x = candidate_like_batch(images, features, max(calls))
    contenders = {"fast": fast, "floor": lambda: floor_run(model, x, calls)}
    times, outputs = interleaved(contenders, rounds, device, name)
    best = {k: min(v) for k, v in times.items()}
    steps = sum(r.order.numel() for r in outputs["fast"])  # one backward-selection step of one image each
    loop = best["fast"] - best["floor"]
    proxies = host_proxies(model, fast)
    kernels = kernel_seconds(fast)
    return {"config": name, "case": "loop_cost", "device": str(device), "images": images.shape[0], "features": p,
            "candidates": images.shape[0] * p * (p + 1) // 2, "rounds": rounds, "times_s": times,
            "fast_s": best["fast"], "floor_s": best["floor"], "fast_over_floor": best["fast"] / best["floor"],
            "calls": len(calls), "rows": sum(calls), "image_steps": steps,
            "loop_us_per_call": 1e6 * loop / len(calls), "loop_us_per_image_step": 1e6 * loop / steps,
            "kernels_us_per_call": {k: 1e6 * v / len(calls) for k, v in kernels.items()},
            "host_us_per_call": 1e6 * (loop - sum(kernels.values())) / len(calls),
            "engine_used": {"fast": res[0].engine}, "step": res[0].info.step, **proxies}


def host_proxies(model, fast) -> dict:
    """What a CPU shows of the host's work per forward call, from one more run with CUDA graphs off (a replay
    dispatches no op and calls no hook): aten ops dispatched outside the model per forward call (views not
    counted), the distinct batch shapes, and the host's reads of device values by label."""
    from overinterp_fast.runtime.opcount import counting_ops
    from overinterp_fast.runtime.sync import counting

    with graphs_off(), counting_ops(model) as ops, counting() as reads:
        fast()
    return {"ops_outside_per_call": ops.outside_per_call, "ops_outside": ops.outside,
            "forward_calls": ops.forward_calls, "batch_shapes": len(ops.shapes),
            "ops_outside_by_op": dict(ops.by_op.most_common(12)), "reads_by_label": dict(reads.by_label)}


STEP_KERNELS = ("exact_candidates", "exact_scores")  # the fused step's ops around the model


def kernel_seconds(fast) -> dict[str, float]:
    """{op: seconds} of the step kernels' own work in one run of ``fast`` under torch.profiler (their self CPU
    time: the work, argument checks and dispatch; the profiler's own cost per event is not in it). On a GPU that is
    their launches only, and a replayed CUDA graph dispatches none: there the host's share is the whole loop."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fast()
    by_name = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    return {k: by_name.get(f"overinterp_fast::{k}", 0.0) / 1e6 for k in STEP_KERNELS}


def print_loop_cost(row: dict) -> None:
    print(f"{row['config']:<14}{row['images']:>3}{row['features']:>6}{row['calls']:>7}{row['rows']:>9}"
          f"{row['image_steps']:>8}{row['fast_s']:>9.3f}{row['floor_s']:>9.3f}{row['fast_over_floor']:>8.2f}"
          f"{row['loop_us_per_call']:>11.0f}{sum(row['kernels_us_per_call'].values()):>9.0f}"
          f"{row['host_us_per_call']:>8.0f}{row['loop_us_per_image_step']:>11.1f}"
          f"{row['ops_outside_per_call']:>9.1f}{row['batch_shapes']:>8}", flush=True)


LOOP_HEAD = (f"{'config':<14}{'N':>3}{'p':>6}{'calls':>7}{'rows':>9}{'steps':>8}{'fast s':>9}{'floor s':>9}"
             f"{'f/floor':>8}{'us/call':>11}{'kernels':>9}{'host':>8}{'us/step':>11}{'ops/call':>9}{'shapes':>8}")


# ---- score_dtype against the images' dtype ----

SCORE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run_score_dtype(name, n_images, device, rounds, score_dtype: str, warmup=True) -> dict:
    """One row: the dense torch path in float32 against the same path with ``score_dtype``."""
    model, images, features, p = make_case(name, n_images, device)
    n = images.shape[0]
    candidates = n * p * (p + 1) // 2
    dtype = SCORE_DTYPES[score_dtype]
    contenders = {"full": lambda: explain(model, images, 0.5, feature_mask=features, **DENSE),
                  "low": lambda: explain(model, images, 0.5, feature_mask=features, **DENSE,
                                         score_dtype=dtype)}
    log, decisions = logging.getLogger("overinterp_fast"), _Decisions("score_dtype")
    log.addHandler(decisions)
    log.setLevel(logging.INFO)
    if warmup:
        for f in contenders.values():
            f()
    batch, _ = dense_batch_size(model, images, features)
    x = candidate_like_batch(images, features, batch)
    low_model, x_low = copy.deepcopy(model).to(dtype), x.to(dtype)
    calls = batches(min(candidates, 16 * batch), batch)  # a sample of the job's calls
    contenders["forward_full"] = lambda: floor_run(model, x, calls)
    contenders["forward_low"] = lambda: floor_run(low_model, x_low, calls)
    times, outputs = interleaved(contenders, rounds, device, name)
    log.removeHandler(decisions)
    best = {k: min(v) for k, v in times.items()}
    full, low = outputs["full"], outputs["low"]
    rescored = sum(r.rescored for r in low)
    return {
        "config": name, "case": "score_dtype", "device": str(device), "score_dtype": score_dtype, "images": n,
        "features": p, "candidates": candidates, "rounds": rounds, "times_s": times, "full_s": best["full"],
        "low_s": best["low"], "low_over_full": best["low"] / best["full"], "rescored": rescored,
        "rescored_fraction": rescored / candidates, "low_log": decisions.lines[-3:], "batch_size": batch,
        "forward_rows": sum(calls), "forward_low_over_full": best["forward_low"] / best["forward_full"],
        "same_order_and_values": all(torch.equal(a.order, b.order) and torch.equal(a.values, b.values)
                                     for a, b in zip(low, full)),
        "same_sis": same_sis(low, full),
    }


def print_score_dtype(row: dict) -> None:
    print(f"{row['config']:<14}{row['images']:>3}{row['features']:>6}{row['candidates']:>9}{row['full_s']:>9.2f}"
          f"{row['low_s']:>9.2f}{row['low_over_full']:>10.3f}{row['rescored_fraction']:>11.3f}"
          f"{str(row['same_order_and_values']):>8}{str(row['same_sis']):>6}{row['forward_low_over_full']:>10.3f}",
          flush=True)
    for line in row["low_log"]:
        print(f"  {line}", flush=True)


# ---- the cold single-image case: one fresh process per run ----

COLD_CONTENDERS = {
    # name: explain()'s keywords (None: the reference)
    "default": {},
    "batch75": {"batch_size": 75},
    "batch576": {"batch_size": 576},
    "onnxruntime": {"engine": "onnxruntime"},
    "reference": None,
}

COLD_CHILD = """
import time, sys
t0 = time.perf_counter()
import json, torch
import overinterp_fast as of
from overinterp_fast.zoo.cifar import SmallCNN
from common import RowRecorder, explain
size, tau, device, keywords = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
torch.manual_seed(0)
model = SmallCNN(size).eval().to(device)
x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)).to(device)
t1 = time.perf_counter()
with RowRecorder(model) as rec:
    res = of.reference.sis(model, x, tau) if keywords is None else explain(model, x, tau, **keywords)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t2 = time.perf_counter()
print(json.dumps({"call_s": t2 - t1, "process_s": t2 - t0, "import_s": t1 - t0,
                  "engine": "reference" if keywords is None else res[0].engine,
                  "largest_call": rec.largest(),
                  "sis": None if res[0].sis is None else res[0].sis.tolist()}))
"""


def run_cold(size: int, rounds: int, names: list[str], tau: float, device: str = "cpu") -> dict:
    """Each contender ``rounds`` times, each run a fresh process; order rotated per round."""
    runs = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            rec, wall = fresh_process(COLD_CHILD, str(size), str(tau), device, json.dumps(COLD_CONTENDERS[k]))
            rec["wall_s"] = wall
            runs[k].append(rec)
            print(f"  cold round {r} {k:<12} call {rec['call_s']:7.2f} s  process {rec['process_s']:7.2f} s  "
                  f"B={rec['largest_call']} engine={rec['engine']}", file=sys.stderr, flush=True)
    best = {k: min(x["call_s"] for x in v) for k, v in runs.items()}
    best_process = {k: min(x["process_s"] for x in v) for k, v in runs.items()}
    sis = {k: v[0]["sis"] for k, v in runs.items()}
    row = {"config": f"cold-cnn{size}-px-1", "case": "cold", "device": device, "size": size, "images": 1,
           "features": size * size, "candidates": size * size * (size * size + 1) // 2, "threshold": tau,
           "rounds": rounds, "runs": runs, "call_s": best, "process_s": best_process,
           "same_sis": {k: sis[k] == sis.get("reference", sis[k]) for k in sis}}
    for base in ("reference", "batch576", "batch75"):
        if base in best:
            row[f"over_{base}"] = {k: best[k] / best[base] for k in best}
    return row


def print_cold(row: dict) -> None:
    print(f"cold: SmallCNN, 1 x 3 x {row['size']}^2, pixels, tau {row['threshold']}, {row['rounds']} rounds, "
          f"a fresh process per run, {row['device']}")
    print(f"{'contender':<13}{'call s':>9}{'process s':>11}{'/reference':>12}{'/batch576':>11}{'same SIS':>10}")
    for k in row["call_s"]:
        print(f"{k:<13}{row['call_s'][k]:>9.2f}{row['process_s'][k]:>11.2f}"
              f"{row.get('over_reference', {}).get(k, math.nan):>12.3f}"
              f"{row.get('over_batch576', {}).get(k, math.nan):>11.3f}{str(row['same_sis'][k]):>10}")


def print_config(row: dict) -> None:
    g = row.get
    print(f"{row['config']:<14}{row['images']:>3}{row['features']:>6}{row['candidates']:>9}{row['batch_size']:>6}"
          f"{row['fast_s']:>9.2f}{g('incr_s', math.nan):>9.2f}{g('torch_s', math.nan):>9.2f}"
          f"{g('ort_s', math.nan):>9.2f}{row['floor_s']:>9.2f}{g('reference_s', math.nan):>9.2f}"
          f"{row['fast_over_floor']:>11.3f}{g('incr_over_floor', math.nan):>11.3f}{g('ort_over_floor', math.nan):>10.3f}"
          f"{g('speedup_vs_reference', math.nan):>9.2f}{g('incr_speedup_vs_reference', math.nan):>9.2f}"
          f"{g('ort_speedup_vs_reference', math.nan):>8.2f}"
          f"{str(g('fast_same_sis_as_reference', '-')):>9}{row['engine_used'].get('fast', '-'):>13}", flush=True)
    if "floor_cl" in row.get("times_s", {}):
        print(f"  channels_last: floor through a channels_last copy {row['floor_cl_s']:.2f} s, "
              f"fast / that floor {row['fast_over_floor_cl']:.3f}", flush=True)
    for line in row["auto_decisions"]:
        print(f"  auto: {line}", flush=True)


HEAD = (f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'B':>6}{'fast s':>9}{'incr s':>9}{'torch s':>9}{'ort s':>9}"
        f"{'floor s':>9}{'ref s':>9}{'fast/floor':>11}{'incr/floor':>11}{'ort/floor':>10}{'ref/fast':>9}"
        f"{'ref/incr':>9}{'ref/ort':>8}{'same SIS':>9}{'engine':>13}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=None, choices=list(CONFIGS))
    ap.add_argument("--full", action="store_true", help="also the 32x32 pixel-feature configs")
    ap.add_argument("--images", type=int, default=None, help="images per config (default: per config)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; minima are reported (default 3)")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--no-engines", action="store_true", help="skip the engine='torch'/'onnxruntime' contenders")
    ap.add_argument("--skip", nargs="*", default=(), choices=["incr"],
                    help="contenders not to time (e.g. incr: on long configs where the default runs incrementally)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="no untimed first run of each contender (configs of minutes per run; the first timed "
                         "round then includes calibration, as a user's first call does)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold single-image case")
    ap.add_argument("--cold-only", action="store_true", help="only the cold single-image case")
    ap.add_argument("--cold-size", type=int, default=24, help="cold case: image side (default 24)")
    ap.add_argument("--cold-rounds", type=int, default=None, help="cold case: rounds (default --rounds)")
    ap.add_argument("--cold-contenders", nargs="*", default=None, choices=list(COLD_CONTENDERS))
    ap.add_argument("--tau", type=float, default=0.5, help="cold case: threshold (default 0.5)")
    ap.add_argument("--score-dtype", default=None, choices=list(SCORE_DTYPES),
                    help="time score_dtype against the images' dtype on the configs (nothing else runs)")
    ap.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/exact-<device>.json)")
    args = ap.parse_args()
    device = torch.device(args.device)
    rows = []
    if args.score_dtype:
        print(f"{'config':<14}{'N':>3}{'p':>6}{'cands':>9}{'full s':>9}{'low s':>9}{'low/full':>10}"
              f"{'rescored':>11}{'same':>8}{'SIS':>6}{'fwd l/f':>10}")
        for name in args.configs or DEFAULT:
            rows.append(run_score_dtype(name, args.images, device, args.rounds, args.score_dtype,
                                        not args.no_warmup))
            print_score_dtype(rows[-1])
            write_results("exact-score-dtype", device, rows, args.out)
        print(f"wrote {write_results('exact-score-dtype', device, rows, args.out)}")
        return
    if not args.cold_only:
        names = args.configs or (DEFAULT + (["cnn32-px", "resnet20-px", "effnet-32x32"] if args.full else []))
        for name in names:
            if name in LOOP_CONFIGS:
                print(LOOP_HEAD)
                rows.append(run_loop_cost(name, args.images, device, args.rounds, not args.no_warmup))
                print_loop_cost(rows[-1])
            else:
                print(HEAD)
                rows.append(run_config(name, args.images, device, args.rounds, args.no_reference,
                                       not args.no_engines, args.skip, not args.no_warmup))
                print_config(rows[-1])
            write_results("exact", device, rows, args.out)  # a run stopped later keeps the rows measured
    if not args.no_cold:
        rows.append(run_cold(args.cold_size, args.cold_rounds or args.rounds,
                             args.cold_contenders or list(COLD_CONTENDERS), args.tau, args.device))
        print_cold(rows[-1])
    print(f"wrote {write_results('exact', device, rows, args.out)}")


if __name__ == "__main__":
    main()
