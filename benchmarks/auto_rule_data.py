"""Data for choosing iterations="auto"'s stopping rule: how the minimal pixel set settles.

    PYTHONPATH=. .venv/bin/python benchmarks/auto_rule_data.py              # 7 photos, seed 0 (about 16 min, 2 cores)
    PYTHONPATH=. .venv/bin/python benchmarks/auto_rule_data.py --seeds 0 1 --photos chelsea rocket
    PYTHONPATH=. .venv/bin/python benchmarks/auto_rule_data.py --replay benchmarks/results/auto_rule_cpu.json

EfficientNet-Lite0 (ONNX, as bench_responsibility.py) on the bundled photos. Per photo and seed,
20 iterations of the descent (iteration t uses seed + t, one mutant cache for all of them, as
iterations="auto" runs them). After the iterations in AT, three extractions of the accumulated
ranking: "rex_step10" (ReX's: the first passing prefix in steps of 10, scanned up to REX_CAP
steps; None when none passes there), "boundary" (exponential search from 10, then bisection:
refine="boundary") and "geometric" (the first passing size of 10, 11, 12, ... x1.1). Recorded:
the descent's queries (cumulative, after the cache), each extraction's queries and size, the Dice
of each set with its own 20-iteration set and with the 20-iteration ReX-extraction set, and after
every iteration the query-free stability signals: the Dice of the top-K ranked pixels with those
of the iteration before, for K = 1%, 2.5%, 5% and 10% of the pixels.

Then every rule of a grid is replayed on these records (no model call): a rule stops an image
after iteration t once t >= m and the signal has been >= d for r iterations in a row (t rounded
up to the next iteration in AT); its cost is the descent's queries up to t plus the extraction's;
its quality is its set's size and Dice against the 20-iteration sets. Fixed iteration counts are
listed too. Writes benchmarks/results/auto_rule_cpu.json (rows: the records; rules: the replay).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch

import overinterp_fast as of
from overinterp_fast.api import _engine, _evaluators, _passes, _setup
from overinterp_fast.runtime.model import initial_predictions
from overinterp_fast.methods.extraction import CountingEvaluator
from overinterp_fast.methods.prefix import boundary_prefix, first_passing_prefix
from overinterp_fast.methods.responsibility import MutantCache, _dice, descend, ranking_positions
from overinterp_fast.zoo.imagenet import PHOTOS, load_efficientnet_lite, load_photos

from common import RESULTS, write_results

T = 20


REX_CAP = 1000  # ReX's extraction is scanned up to 1000 steps of 10 pixels (20% of 224x224)
RATIO = 1.1  # the geometric scan's ratio
AT = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16, 20)  # iterations after which the sets are extracted
FRACTIONS = (0.01, 0.025, 0.05, 0.1)  # top-K stability signals: K as a fraction of the pixels


def geometric_sizes(count: int, ratio: float = RATIO) -> list[int]:
    """10, 11, 12, ... growing by ``ratio`` (at least 1 pixel per step), up to ``count`` included."""
    out, k = [], 10.0
    while int(k) < count:
        if not out or int(k) > out[-1]:
            out.append(int(k))
        k = max(k * ratio, out[-1] + 1)
    return out + [count]


def record(onnx_path, images, seed, progress, save=None):
    """Per image: per iteration t, the ranking's sets under three extractions and the stability signals."""
    n, _, h, w = images.shape
    p = h * w
    s = _setup(of.OnnxModel(onnx_path), images, 0.5, None, 0.0, "logits", None, "responsibility")
    passes = _passes("top1", s.thresholds)
    rex_sizes = [list(range(10, 10 * REX_CAP + 1, 10))] * n
    geo_sizes = [geometric_sizes(p)] * n
    ext = ("boundary", "rex_step10", "geometric")
    with torch.inference_mode():
        targets, _ = initial_predictions(s.fn, s.prep.images, None, s.runner)
        eng = _engine(s, "auto", targets, max_rows=n * 14, expected_rows=n * T * 14 * 6, measure_fn="score_and_top1")
        evaluator, _ = _evaluators(s, eng, targets)
        present = torch.ones(n, p, dtype=torch.bool)
        cache = MutantCache()
        total = torch.zeros(n, h, w, dtype=torch.float64)
        recs = [{"target": int(targets[i]), "descent_queries_cum": [], **{f"{e}_pixels": [] for e in ext},
                 **{f"{e}_queries": [] for e in ext}} for i in range(n)]
        sets = {e: [[] for _ in range(n)] for e in ext}
        ranks = []
        cum = [0] * n
        t0 = time.perf_counter()
        for t in range(T):
            logs, q = descend(evaluator, s.prep, present, passes, [(i, seed + t) for i in range(n)], 10, 10, cache)
            total += logs
            pos = ranking_positions(total.view(n, -1), present)
            ranks.append(pos.to(torch.int32))
            if t + 1 not in AT:
                for i in range(n):
                    cum[i] += q[i]
                    recs[i]["descent_queries_cum"].append(cum[i])
                    for e in ext:
                        recs[i][f"{e}_pixels"].append(None)
                        recs[i][f"{e}_queries"].append(None)
                        sets[e][i].append(None)
                continue
            counted = CountingEvaluator(evaluator, n)
            hb, qb = boundary_prefix(evaluator, pos, list(range(n)), [p] * n, lambda r, f, t1: passes(r, f, t1))
            before = list(counted.counts)
            hr = first_passing_prefix(counted, pos, list(range(n)), rex_sizes, lambda r, f, t1: passes(r, f, t1))
            qr = [c - b for c, b in zip(counted.counts, before)]
            before = list(counted.counts)
            hg = first_passing_prefix(counted, pos, list(range(n)), geo_sizes, lambda r, f, t1: passes(r, f, t1))
            qg = [c - b for c, b in zip(counted.counts, before)]
            for i in range(n):
                cum[i] += q[i]
                recs[i]["descent_queries_cum"].append(cum[i])
                for e, k, qq in (("boundary", hb[i] and hb[i][0], qb[i]),
                                 ("rex_step10", hr[i] and rex_sizes[i][hr[i][0]], qr[i]),
                                 ("geometric", hg[i] and geo_sizes[i][hg[i][0]], qg[i])):
                    recs[i][f"{e}_pixels"].append(k)
                    recs[i][f"{e}_queries"].append(qq)
                    sets[e][i].append(None if k is None else pos[i] < k)
            if progress:
                print(f"seed {seed} iteration {t + 1}: boundary {[r['boundary_pixels'][-1] for r in recs]}, "
                      f"rex {[r['rex_step10_pixels'][-1] for r in recs]}, geo {[r['geometric_pixels'][-1] for r in recs]}"
                      f", {time.perf_counter() - t0:.0f} s", flush=True)
    if save:
        np.savez_compressed(save, ranks=torch.stack(ranks).numpy())
    d = lambda a, b: None if a is None or b is None else round(_dice(a, b), 4)  # noqa: E731
    for i in range(n):
        rec = recs[i]
        for e in ext:
            rec[f"{e}_dice_prev"] = [None] + [d(sets[e][i][t], sets[e][i][t - 1]) for t in range(1, T)]
            rec[f"{e}_dice_final"] = [d(sets[e][i][t], sets[e][i][-1]) for t in range(T)]
            rec[f"{e}_dice_rex20"] = [d(sets[e][i][t], sets["rex_step10"][i][-1]) for t in range(T)]
        for fr in FRACTIONS:
            k = int(fr * p)
            rec[f"top{fr}_dice_prev"] = [None] + [d(ranks[t][i] < k, ranks[t - 1][i] < k) for t in range(1, T)]
    return recs


EXTRACTIONS = ("boundary", "rex_step10", "geometric")


def replay(recs, signal, m, r, d):
    """Per record, under a rule "stop after iteration t once t >= m and ``signal`` >= d for r iterations in a
    row" (20 at most; t rounded up to the next iteration in AT, where the sets were extracted): the stop,
    and per extraction its queries (descent up to t + the extraction), size and Dice to the 20-iteration
    ReX extraction's set (rex20) and to its own 20-iteration set."""
    res = []
    for rec in recs:
        sig = rec[signal] if signal else [None] * T
        calm, stop = 0, T
        for t in range(T):  # t: 0-based index of iteration t + 1
            calm = calm + 1 if sig[t] is not None and sig[t] >= d else 0
            if t + 1 >= m and calm >= r:
                stop = t + 1
                break
        if not signal:
            stop = m
        stop = next(a for a in AT if a >= stop)
        j = stop - 1
        row = {"photo": rec["photo"], "stop": stop}
        rex20 = rec["rex_step10_pixels"][-1]
        for e in EXTRACTIONS:
            k = rec[f"{e}_pixels"][j]
            row[e] = {"queries": rec["descent_queries_cum"][j] + rec[f"{e}_queries"][j], "pixels": k,
                      "size_to_rex20": None if k is None or rex20 is None else k / rex20,
                      "dice_rex20": rec[f"{e}_dice_rex20"][j], "dice_own20": rec[f"{e}_dice_final"][j]}
        res.append(row)
    return res


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(res):
    out = {"median_stop": _med(x["stop"] for x in res), "max_stop": max(x["stop"] for x in res)}
    for e in EXTRACTIONS:
        out[e] = {k: _med(x[e][k] for x in res) for k in ("queries", "size_to_rex20", "dice_rex20", "dice_own20")}
        out[e]["min_dice_rex20"] = min((x[e]["dice_rex20"] for x in res if x[e]["dice_rex20"] is not None),
                                       default=None)
    return out


def analyze(runs):
    """Every rule of a grid, and fixed iteration counts, replayed on the records."""
    signals = [f"top{fr}_dice_prev" for fr in FRACTIONS]
    rules = [{"rule": "fixed", "iterations": t, **summarize(replay(runs, None, t, 0, 0))} for t in AT]
    for sig in signals:
        for m in (2, 3, 4, 6, 8, 10):
            for r in (1, 2, 3, 4):
                for d in (0.8, 0.85, 0.9, 0.95):
                    rules.append({"rule": "stable", "signal": sig, "min_iterations": m, "patience": r,
                                  "min_dice": d, **summarize(replay(runs, sig, m, r, d))})
    return rules


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", nargs="*", default=list(PHOTOS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--out", default=os.path.join(RESULTS, "auto_rule_cpu.json"))
    ap.add_argument("--save", default=None, help="save every iteration's ranking to SAVE<seed>.npz")
    ap.add_argument("--replay", default=None, help="no model call: replay the rules on the rows of a results JSON")
    args = ap.parse_args()
    if args.replay:  # the recorded rows stay as they are (environment, command, date of the recording)
        with open(args.replay) as fh:
            doc = json.load(fh)
        doc["rules"] = analyze(doc["rows"])
        path = args.out
    else:
        runs = _record_all(args)
        path = write_results("auto_rule", torch.device("cpu"), runs, args.out)
        with open(path) as fh:
            doc = json.load(fh)
        doc.update(rules=analyze(runs), photos=args.photos, seeds=args.seeds,
                   model="EfficientNet-Lite0 ONNX, 224x224, top-1 criterion, depth 10, min box 10")
    for x in doc["rules"][: len(AT)]:
        print(x)
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path}")


def _record_all(args) -> list[dict]:
    images, names, _ = load_photos(224, args.photos)
    model = load_efficientnet_lite(0)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = of.export_onnx(model, os.path.join(tmp, "efficientnet_lite0.onnx"), images[:2])
        for seed in args.seeds:
            t0 = time.perf_counter()
            recs = record(onnx_path, images, seed, True, args.save and f"{args.save}{seed}.npz")
            for name, rec in zip(names, recs):
                rec.update(photo=name, seed=seed)
            runs += recs
            print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return runs


if __name__ == "__main__":
    main()
