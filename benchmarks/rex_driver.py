"""Runs ReX (rex-xai 0.4.1) on PNG images and measures it: run INSIDE the ReX virtual environment.

    benchmarks/.rex-venv/bin/python benchmarks/rex_driver.py --model m.onnx --config rex.toml \
        --out results.json img1.png img2.png ...

Called by bench_responsibility.py; it imports nothing from overinterp_fast (the
ReX environment has its own numpy 1.26 / onnxruntime / torch). It drives ReX the
way its `rex` command does (rex_wrapper.main -> explanation -> _explanation),
with the configuration read from a rex.toml by ReX's own load_config, and adds
only measurement:

- every onnxruntime InferenceSession.run call is counted (calls and input rows:
  one row = one model query), split into the responsibility phase
  (calculate_responsibility), the extraction phase (Explanation.extract) and
  the rest (the prediction of the target on the unmasked image);
- wall time of the whole per-image call and of the two phases;
- the ONNX session creation plus one warm-up run, timed once, before the images.

Writes a JSON file (per image: target, confidence, queries, calls, times, MPS
size) and beside it an .npz with each image's responsibility map, MPS mask and
the model input ReX built (so the caller can check the preprocessing).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime as ort

COUNT = {"phase": "other", "rows": {}, "calls": {}}
_run = ort.InferenceSession.run


def _counting_run(self, output_names, input_feed, run_options=None):
    rows = int(next(iter(input_feed.values())).shape[0])
    p = COUNT["phase"]
    COUNT["rows"][p] = COUNT["rows"].get(p, 0) + rows
    COUNT["calls"][p] = COUNT["calls"].get(p, 0) + 1
    return _run(self, output_names, input_feed, run_options)


ort.InferenceSession.run = _counting_run  # before ReX creates its session

import torch as tt  # noqa: E402

import rex_xai.explanation.rex as rex  # noqa: E402
from rex_xai.explanation.explanation import Explanation  # noqa: E402
from rex_xai.input.config import load_config, validate_args  # noqa: E402
from rex_xai.utils._utils import get_device  # noqa: E402
from rex_xai.utils.logger import logger, set_log_level  # noqa: E402

TIMES: dict[str, float] = {}


def _phase(name, fn):
    def wrapped(*a, **k):
        COUNT["phase"] = name
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            TIMES[name] = TIMES.get(name, 0.0) + time.perf_counter() - t
            COUNT["phase"] = "other"

    return wrapped


rex.calculate_responsibility = _phase("responsibility", rex.calculate_responsibility)
Explanation.extract = _phase("extraction", Explanation.extract)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", required=True, help="rex.toml")
    ap.add_argument("--out", required=True, help="JSON file to write (and an .npz beside it)")
    ap.add_argument("images", nargs="+")
    a = ap.parse_args()

    args = load_config(a.config)  # ReX's own parser of rex.toml, as `rex -c rex.toml`
    args.model = a.model
    args.path = a.images[0]
    args.progress_bar = False
    validate_args(args)
    set_log_level(args.verbosity, logger)
    device = get_device(args.gpu)

    t = time.perf_counter()
    prediction_func, model_shape = rex.get_prediction_func_from_args(args)
    session_s = time.perf_counter() - t
    # one warm-up run (ONNX Runtime allocates its arenas on the first run), not counted as a query
    shape = [1 if not isinstance(d, int) else d for d in model_shape]
    t = time.perf_counter()
    COUNT["phase"] = "warmup"
    prediction_func(tt.zeros(shape), None)
    COUNT["phase"] = "other"
    warmup_s = time.perf_counter() - t

    rows, arrays = [], {}
    for i, path in enumerate(a.images):
        COUNT["rows"].clear()
        COUNT["calls"].clear()
        TIMES.clear()
        args.path = path
        t = time.perf_counter()
        exp = rex._explanation(args, model_shape, prediction_func, device, None)
        total_s = time.perf_counter() - t
        mask = exp.sufficiency_mask.detach().cpu().numpy()  # bool, the model input's shape [1, 3, H, W]
        if mask.ndim == 4:
            mask = mask[0]
        pixel_mask = mask.any(0) if exp.data.model_order == "first" else mask.any(-1)
        target = exp.data.target
        rows.append({
            "path": path,
            "target": int(target.classification),
            "confidence": float(target.confidence),
            "time_s": total_s,
            "responsibility_s": TIMES.get("responsibility", 0.0),
            "extraction_s": TIMES.get("extraction", 0.0),
            "queries": COUNT["rows"].get("responsibility", 0),
            "calls": COUNT["calls"].get("responsibility", 0),
            "extraction_queries": COUNT["rows"].get("extraction", 0),
            "extraction_calls": COUNT["calls"].get("extraction", 0),
            "other_queries": COUNT["rows"].get("other", 0),
            "mps_pixels": int(pixel_mask.sum()),
            "pixels": int(pixel_mask.size),
            "mps_confidence": None if exp.sufficiency_confidence is None else float(exp.sufficiency_confidence),
            "run_stats": {k: float(v) for k, v in exp.run_stats.items()},
        })
        arrays[f"map{i}"] = np.asarray(exp.target_map.detach().cpu().numpy(), dtype=np.float32)
        arrays[f"mps{i}"] = pixel_mask
        arrays[f"input{i}"] = exp.data.data.detach().cpu().numpy()
        print(f"rex: {path}: {total_s:.1f} s, {rows[-1]['queries']} queries, MPS {rows[-1]['mps_pixels']} px",
              flush=True)

    settings = {k: (v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v))
                for k, v in vars(args).items() if not k.startswith("_") and k not in ("script",)}
    with open(a.out, "w") as fh:
        json.dump({"session_s": session_s, "warmup_s": warmup_s, "device": str(device), "settings": settings, "rows": rows,
                   "versions": {"rex-xai": _version("rex-xai"), "onnxruntime": ort.__version__,
                                "torch": tt.__version__, "numpy": np.__version__}}, fh, indent=1)
    np.savez_compressed(a.out[: -len(".json")] + ".npz" if a.out.endswith(".json") else a.out + ".npz", **arrays)


def _version(dist):
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
