"""What a GPU would capture, counted on a CPU: batch shapes, captures and padded rows of two successive jobs.

    python benchmarks/bench_shapes.py                  # both pairs of jobs -> results/shapes-cpu.json
    python benchmarks/bench_shapes.py --device cuda    # the same on a GPU: real captures -> results/shapes-cuda.json

Each pair runs two exact SIS jobs of one model, the second with another number of images (64 then 50 images of
1x8x8, one then three of 1x24x24, the loop benchmark's near-free model in float32), with default options on the
torch engine (the captured path: "auto" may take ONNX Runtime for a float32 job on a CPU, whose calls are neither
padded nor captured). Per job:
the batch shapes of its steps, the captures and replays the CPU's stand-in counts (the graphs a GPU would capture
and replay, by the same rule: runtime.graphs), the rows the steps ran against backward selection's own, and every
forward shape the model saw (a forward hook, with graphs off: one more run of the same job; the first is the images'
own pass, which runs as it is). Then the gradient
method on a small CNN with a collection of several rounds: its step shapes and captures. Also per job: its
seconds (the device synchronized), and the graphs turned off during it (a failed capture, or a replay that differed
from the eager step: each logs one warning, counted here); per pair: whether the model is freed once deleted
(a weak reference after ``gc.collect()``), and on a GPU the memory still allocated then.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
import weakref

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from overinterp_fast.runtime import graphs  # noqa: E402
from common import graphs_off, make_case, write_results  # noqa: E402

PAIRS = (("linear8-px", 64, 50), ("linear24-px", 1, 3))


class _GraphsOff(logging.Handler):
    """Counts the warnings that turn a graph off (runtime.graphs: "... off (why); running ... eagerly")."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if "eagerly" in msg:
            self.lines.append(msg)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def forward_shapes(model, images, features) -> list[int]:
    """The batch sizes the model's forward calls took in one more run of the job, graphs off."""
    seen = set()
    handle = model.register_forward_pre_hook(lambda m, a: seen.add(a[0].shape[0]))
    try:
        with graphs_off():
            of.fast_sis(model, images, 0.5, feature_mask=features, show_progress=False, engine="torch")
    finally:
        handle.remove()
    return sorted(seen)


def exact_pair(name: str, first: int, second: int, device="cpu") -> dict:
    model, images, features, p = make_case(name, max(first, second), torch.device(device))
    jobs = []
    off = _GraphsOff()
    log = logging.getLogger("overinterp_fast")
    log.addHandler(off)
    try:
        for n in (first, second):
            x = images[:n]
            before = len(off.lines)
            _sync(device)
            t0 = time.perf_counter()
            res = of.fast_sis(model, x, 0.5, feature_mask=features, show_progress=False, engine="torch")
            _sync(device)
            seconds = time.perf_counter() - t0
            steps = res[0].info.steps
            own = n * p * (p + 1) // 2
            jobs.append({"images": n, "batch_size": res[0].info.batch_size, "batch_source": res[0].info.batch_source,
                         "step_shapes": list(steps.shapes), "captures": steps.captures, "replays": steps.replays,
                         "graphs": steps.graphs, "rows": steps.rows, "own_rows": own, "rows_over_own": steps.rows / own,
                         "seconds": seconds, "graphs_off": off.lines[before:]})
    finally:
        log.removeHandler(off)
    jobs[1]["new_step_shapes"] = len(set(jobs[1]["step_shapes"]) - set(jobs[0]["step_shapes"]))
    # the forward shapes, with graphs off (a hook does not see a replay): both jobs again, on the same model (its
    # kept batch size: no calibration's probes among them)
    for job, n in zip(jobs, (first, second)):
        job["forward_shapes"] = forward_shapes(model, images[:n], features)
    ref = weakref.ref(model)
    del model, res
    gc.collect()
    freed = {"model_freed": ref() is None}
    if torch.device(device).type == "cuda":
        del images, x
        gc.collect()
        freed["cuda_allocated_after_MB"] = torch.cuda.memory_allocated(device) / 2**20
    return {"config": name, "features": p, "jobs": jobs, **freed}


def gradient_job(device="cpu") -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 5, bias=False)).double().eval().to(device)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(16)
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(device)
    res = of.GradientSIS(model, threshold=0.3, k=2, collection=True).find_sis(images)
    steps = res[0].info.steps
    return {"config": "gradient, a small CNN, 4 images of 3x8x8, k=2, collection", "step_shapes": list(steps.shapes),
            "captures": steps.captures, "replays": steps.replays, "graphs": steps.graphs,
            "rounds": max(len(r.collection or [r]) for r in res)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu (the stand-in counts) or cuda (real captures)")
    ap.add_argument("--out", default=None, help="the results JSON (default benchmarks/results/shapes-<device>.json)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not graphs.enabled():
        raise SystemExit("graphs are disabled (OVERINTERP_FAST_CUDA_GRAPHS): the stand-in counts nothing")
    rows = [exact_pair(*pair, device=args.device) for pair in PAIRS]
    for row in rows:
        for j in row["jobs"]:
            print(f"{row['config']:<12} {j['images']:>3} images: batch {j['batch_size']} ({j['batch_source']}), "
                  f"{len(j['step_shapes'])} step shapes, {j.get('new_step_shapes', '-')} new, captures {j['captures']}, "
                  f"replays {j['replays']}, rows {j['rows_over_own']:.3f}x own, {j['seconds']:.2f} s, "
                  f"graphs off {len(j['graphs_off'])}, forward shapes {j['forward_shapes']}")
        print(f"{row['config']:<12} model freed once deleted: {row['model_freed']}"
              + (f", CUDA memory still allocated {row['cuda_allocated_after_MB']:.1f} MB"
                 if "cuda_allocated_after_MB" in row else ""))
    grad = gradient_job(args.device)
    print(f"gradient: {grad['rounds']} rounds, step shapes {grad['step_shapes']}, captures {grad['captures']}, "
          f"replays {grad['replays']}")
    if not args.no_write:
        print("wrote", write_results("shapes", torch.device(args.device).type, rows, out=args.out, gradient=grad))
    return {"rows": rows, "gradient": grad}


if __name__ == "__main__":
    main()
