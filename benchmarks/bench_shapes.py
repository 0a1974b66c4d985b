"""What a GPU would capture, counted on a CPU: batch shapes, captures and padded rows of two successive jobs.

    python benchmarks/bench_shapes.py            # both pairs of jobs -> results/shapes-cpu.json

Each pair runs two exact SIS jobs of one model, the second with another number of images (64 then 50 images of
1x8x8, one then three of 1x24x24, the loop benchmark's near-free model in float32), with default options on the
torch engine (the captured path: "auto" may take ONNX Runtime for a float32 job on a CPU, whose calls are neither
padded nor captured). Per job:
the batch shapes of its steps, the captures and replays the CPU's stand-in counts (the graphs a GPU would capture
and replay, by the same rule: runtime.graphs), the rows the steps ran against backward selection's own, and every
forward shape the model saw (a forward hook, with graphs off: one more run of the same job; the first is the images'
own pass, which runs as it is). Then the gradient
method on a small CNN with a collection of several rounds: its step shapes and captures.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overinterp_fast as of  # noqa: E402
from overinterp_fast.runtime import graphs  # noqa: E402
from common import graphs_off, make_case, write_results  # noqa: E402

PAIRS = (("linear8-px", 64, 50), ("linear24-px", 1, 3))


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


def exact_pair(name: str, first: int, second: int) -> dict:
    model, images, features, p = make_case(name, max(first, second), torch.device("cpu"))
    jobs = []
    for n in (first, second):
        x = images[:n]
        res = of.fast_sis(model, x, 0.5, feature_mask=features, show_progress=False, engine="torch")
        steps = res[0].info.steps
        own = n * p * (p + 1) // 2
        jobs.append({"images": n, "batch_size": res[0].info.batch_size, "batch_source": res[0].info.batch_source,
                     "step_shapes": list(steps.shapes), "captures": steps.captures, "replays": steps.replays,
                     "graphs": steps.graphs, "rows": steps.rows, "own_rows": own, "rows_over_own": steps.rows / own})
    jobs[1]["new_step_shapes"] = len(set(jobs[1]["step_shapes"]) - set(jobs[0]["step_shapes"]))
    # the forward shapes, with graphs off (a hook does not see a replay): both jobs again, on the same model (its
    # kept batch size: no calibration's probes among them)
    for job, n in zip(jobs, (first, second)):
        job["forward_shapes"] = forward_shapes(model, images[:n], features)
    return {"config": name, "features": p, "jobs": jobs}


def gradient_job() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 5, bias=False)).double().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(16)
    images = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    res = of.GradientSIS(model, threshold=0.3, k=2, collection=True).find_sis(images)
    steps = res[0].info.steps
    return {"config": "gradient, a small CNN, 4 images of 3x8x8, k=2, collection", "step_shapes": list(steps.shapes),
            "captures": steps.captures, "replays": steps.replays, "graphs": steps.graphs,
            "rounds": max(len(r.collection or [r]) for r in res)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="the results JSON (default benchmarks/results/shapes-cpu.json)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not graphs.enabled():
        raise SystemExit("graphs are disabled (OVERINTERP_FAST_CUDA_GRAPHS): the stand-in counts nothing")
    rows = [exact_pair(*pair) for pair in PAIRS]
    for row in rows:
        for j in row["jobs"]:
            print(f"{row['config']:<12} {j['images']:>3} images: batch {j['batch_size']} ({j['batch_source']}), "
                  f"{len(j['step_shapes'])} step shapes, {j.get('new_step_shapes', '-')} new, captures {j['captures']}, "
                  f"replays {j['replays']}, rows {j['rows_over_own']:.3f}x own, forward shapes {j['forward_shapes']}")
    grad = gradient_job()
    print(f"gradient: {grad['rounds']} rounds, step shapes {grad['step_shapes']}, captures {grad['captures']}, "
          f"replays {grad['replays']}")
    if not args.no_write:
        print("wrote", write_results("shapes", "cpu", rows, out=args.out, gradient=grad))
    return {"rows": rows, "gradient": grad}


if __name__ == "__main__":
    main()
