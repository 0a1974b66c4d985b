"""The main job on an embedded default: exact SIS of a digits CNN on real handwritten digits."""
from __future__ import annotations

import json
import os
import time

import torch

from .api import fast_sis
from .plotting import sis_figure
from .reference import sis as reference_sis
from .results import same_sis
from .zoo.digits import accuracy, load_digits, train_digits_cnn


def run_demo(out_dir: str = "out/demo", n_images: int = 12, threshold: float = 0.9, compare_reference: bool = True,
             progress: bool | None = None) -> dict:
    """Train the digits CNN, run exact SIS (with collections) on test digits, write a figure and JSON.

    Returns the summary that is also written to ``out_dir/summary.json``.
    """
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    data = load_digits()
    model = train_digits_cnn(data)
    train_s = time.perf_counter() - t0
    acc = accuracy(model, data.x_test, data.y_test)
    print(f"digits CNN trained in {train_s:.1f} s: test accuracy {acc:.3f} on {len(data.y_test)} real scans")

    x, y = data.x_test[:n_images], data.y_test[:n_images]
    t0 = time.perf_counter()
    res = fast_sis(model, x, threshold, collection=True, progress=progress)
    fast_s = time.perf_counter() - t0
    summary = {
        "model": "DigitsCNN trained on sklearn digits (8x8, 64 pixel features)",
        "test_accuracy": acc,
        "threshold": threshold,
        "images": n_images,
        "fast_sis_seconds": fast_s,
        "per_image": [],
    }
    print(f"exact SIS with collections for {n_images} digits at tau={threshold}: {fast_s:.2f} s")
    if compare_reference:
        t0 = time.perf_counter()
        ref = reference_sis(model, x, threshold, collection=True)
        ref_s = time.perf_counter() - t0
        same = same_sis(res, ref)
        summary.update(reference_seconds=ref_s, speedup_vs_reference=ref_s / fast_s, same_sis_as_reference=same)
        print(f"reference (sis.py transcription): {ref_s:.2f} s -> {ref_s / fast_s:.1f}x faster, same SIS: {same}")

    titles, masks = [], []
    print(f"{'#':>3} {'label':>5} {'pred':>4} {'conf':>6} {'SIS':>4} {'frac':>6} {'#SIS':>4}")
    for i, r in enumerate(res):
        size = r.size
        frac = r.fraction
        n_sis = len(r.collection)
        print(f"{i:>3} {int(y[i]):>5} {r.target:>4} {r.score:>6.3f} {str(size):>4} "
              f"{'-' if frac is None else f'{frac:.1%}':>6} {n_sis:>4}")
        titles.append(f"label {int(y[i])}\npred {r.target} ({r.score:.2f})\nSIS {size if size is not None else '-'}/64")
        masks.append(None if r.mask is None else r.mask.numpy())
        summary["per_image"].append(
            {
                "label": int(y[i]),
                "target": r.target,
                "score": r.score,
                "order": r.order.tolist(),
                "values": r.values.tolist(),
                "sis": None if r.sis is None else r.sis.tolist(),
                "collection": [c.sis.tolist() for c in r.collection],
            }
        )
    fig_path = os.path.join(out_dir, "digits_sis.png")
    sis_figure([img.numpy() for img in data.raw_test[:n_images]], masks, titles, fig_path)
    sizes = [r.size for r in res if r.size is not None]
    if sizes:
        summary["median_sis_fraction"] = float(torch.tensor(sizes, dtype=torch.float64).median() / 64)
        print(f"median SIS: {summary['median_sis_fraction']:.1%} of the pixels")
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(f"wrote {fig_path} and {os.path.join(out_dir, 'summary.json')}")
    return summary
