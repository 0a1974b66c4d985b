"""Command line: `overinterp-fast` (or `python -m overinterp_fast`)."""
from __future__ import annotations

import argparse
import sys

from ..errors import MissingDependency, StorageFault


def _unit_interval(text: str) -> float:
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {v}")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


DATASETS = ("cifar10", "cifar100")


def _add_model_and_images(p: argparse.ArgumentParser, several: bool) -> None:
    p.add_argument("--model", action="append" if several else "store", required=True,
                   help="efficientnet-lite0/1/2, or a .onnx, .pt2 (torch.export) or .pt (TorchScript) file"
                   + ("; repeat to compare models" if several else ""))
    p.add_argument("--images", default=None,
                   help="a folder of images (class subfolders: labels in torchvision ImageFolder order), or "
                        "'bundled' (photos from scikit-image and sklearn; default)")
    p.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                   help="a dataset's python batches in --data-dir (as torchvision downloads them) instead of --images")
    p.add_argument("--data-dir", default=None, help="folder holding the --dataset files (e.g. cifar-10-batches-py/)")
    p.add_argument("--split", choices=("test", "train"), default="test", help="--dataset split (default: test)")
    p.add_argument("--labels", default=None, help="JSON file {image name: true class index} (flat folders)")
    p.add_argument("--class-names", default=None, help="text file with one class name per line")
    p.add_argument("--select", default=None, help="images A:B (positions, Python slice bounds), e.g. 0:1000")
    p.add_argument("--limit", type=_positive, default=None, help="use the first N images (after --select)")
    p.add_argument("--size", type=_positive, default=None,
                   help="input side (default: the model's, e.g. 224 for efficientnet-lite0)")
    p.add_argument("--mean", type=_floats, default=None, help="normalization mean, one or per channel (default 0.5)")
    p.add_argument("--std", type=_floats, default=None, help="normalization std, one or per channel (default 0.5)")
    p.add_argument("--grey", action="store_true", help="load images as one channel")
    p.add_argument("--method", choices=("exact", "gradient", "responsibility"), default="gradient",
                   help="SIS method (default gradient; exact for small images; responsibility for ONNX models)")
    p.add_argument("--threshold", type=_unit_interval, default=0.9, help="tau (default: 0.9)")
    p.add_argument("--threshold-mode", choices=("auto", "absolute", "relative"), default="auto",
                   help="auto (default): tau where f(x) >= tau, else tau * f(x); relative: tau * f(x)")
    p.add_argument("--k", type=_positive, default=None, help="features per gradient step (default 100 on CUDA, 500 on CPU)")
    p.add_argument("--collection", action="store_true", help="find every disjoint SIS")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="overinterp-fast", description="Fast Sufficient Input Subsets (SIS).")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the embedded default: exact SIS on digits, then an audit report of "
                          "EfficientNet-Lite0 on bundled photos")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--images", type=_positive, default=12, help="test digits to explain (default: 12)")
    demo.add_argument("--threshold", type=_unit_interval, default=0.9, help="tau (default: 0.9)")
    demo.add_argument("--no-reference", action="store_true", help="skip the timing against the reference")
    demo.add_argument("--no-imagenet", action="store_true", help="skip the EfficientNet-Lite0 part")
    demo.add_argument("--no-text", action="store_true",
                      help="skip the text part (input reduction of the Rotten Tomatoes word CNN)")
    demo.add_argument("--k", type=_positive, default=None,
                      help="features per gradient step for the ImageNet part (default: 500 on CPU, 100 on CUDA)")
    demo.add_argument("--device", default="cpu", help="device for the ImageNet part (default: cpu)")
    sis = sub.add_parser("sis", help="SIS of one model on a folder of images: results.json and a figure")
    _add_model_and_images(sis, several=False)
    audit = sub.add_parser("audit", help="audit one or more models (and compare them): results and an HTML report")
    _add_model_and_images(audit, several=True)
    audit.add_argument("--ensemble", action="store_true", help="also audit the mean-of-logits ensemble of the models")
    audit.add_argument("--fraction", type=_unit_interval, default=0.05,
                       help="pixel-subset fraction for the transfer table (default 0.05)")
    audit.add_argument("--title", default="Overinterpretation audit")
    audit.add_argument("--object-masks", default=None,
                       help="folder of object masks named like the images (nonzero = object): adds SIS pixels in "
                            "the object and foreground/background noise sensitivity (RFS, iRFS)")
    audit.add_argument("--noise-sigma", type=float, default=0.1,
                       help="std of the Gaussian noise for --object-masks, in pixel units [0, 1] (default 0.1)")
    audit.add_argument("--chunk-size", type=_positive, default=64,
                       help="images per chunk: the unit of batching, commit and sharding; part of the "
                            "configuration (default 64)")
    audit.add_argument("--batch-size", type=_positive, default=None,
                       help="candidates per forward call (default: fixed by the input shape, so that results do not "
                            "depend on timing; part of the configuration)")
    audit.add_argument("--workers", type=int, default=2, help="image-loading worker processes per rank (default 2)")
    audit.add_argument("--restart", action="store_true", help="discard the audit in --out and start over")
    audit.add_argument("--gallery", type=int, default=24,
                       help="images shown with their SIS in the report (default 24); statistics cover all")
    report = sub.add_parser("report", help="rebuild report.html from a results folder, without recomputing")
    report.add_argument("folder", help="a folder written by 'audit', 'sis' or 'demo'")
    report.add_argument("--out", default=None, help="HTML path (default: FOLDER/report.html)")
    report.add_argument("--gallery", type=int, default=24, help="images shown with their SIS (default 24)")
    red = sub.add_parser("reduce", help="input reduction of a text classifier (Feng et al. 2018): reductions.parquet "
                         "and an HTML page")
    red.add_argument("--model", default="bundled",
                     help="'bundled' (the Rotten Tomatoes word CNN, trained once and cached) or a file written by "
                          "overinterp_fast.zoo.text.save_text_model")
    red.add_argument("--text", default="bundled",
                     help="'bundled' (held-out Rotten Tomatoes snippets) or a UTF-8 file with one text per line")
    red.add_argument("--limit", type=_positive, default=None,
                     help="use the first N texts (default: all; 200 for --text bundled)")
    red.add_argument("--beam-size", type=_positive, default=5, help="maximum beam size k (default 5; 1 = greedy)")
    red.add_argument("--importance", choices=("leave_one_out", "gradient"), default="leave_one_out")
    red.add_argument("--out", required=True, help="output folder")
    red.add_argument("--quiet", action="store_true", help="no progress bars")
    pipe = sub.add_parser("digits-pipeline",
                          help="the pixel-subset experiment of Carter et al. 2021 on real digits (train on 5%% subsets)")
    pipe.add_argument("--fraction", type=_unit_interval, default=0.05, help="pixels kept (default 0.05)")
    pipe.add_argument("--train", type=_positive, default=None, help="training images to use (default: all)")
    pipe.add_argument("--test", type=_positive, default=None, help="test images to use (default: all)")
    pipe.add_argument("--epochs", type=_positive, default=15)
    pipe.add_argument("--out", default=None, help="write the result as JSON here")
    return parser


def _prepare(args, several: bool, device):
    """Models, image source (selected), class namer, k, and (mean, std) as the arguments say."""
    import torch

    from ..audit.sources import open_images, select_range
    from .loading import class_namer, first_line, load_model
    from ..runtime.model import ModelFn

    specs = args.model if several else [args.model]
    loaded = [load_model(s, device) for s in specs]
    names = [m.name for m in loaded]
    if len(set(names)) != len(names):
        raise ValueError(f"two models share a name: {names}")
    if args.method == "gradient":
        for m in loaded:
            if not m.differentiable:
                raise ValueError(f"{m.name}: method 'gradient' needs a torch model (ONNX Runtime has no gradients); "
                                 f"use --method responsibility or exact")
    if args.dataset is not None and args.images is not None:
        raise ValueError("give --images or --dataset, not both")
    size = args.size or next((m.size for m in loaded if m.size), None)
    if size is None and args.dataset is None:
        raise ValueError("the input size is not known from the model: give --size")
    mean = args.mean or next((m.mean for m in loaded if m.mean is not None), 0.5)
    std = args.std or next((m.std for m in loaded if m.std is not None), 0.5)
    source = open_images(args.images, size, mean, std, args.grey, args.labels, dataset=args.dataset,
                         data_dir=args.data_dir, split=args.split, object_dir=getattr(args, "object_masks", None))
    source = source.subset(select_range(len(source), args.select, args.limit))
    x = source[0]["x"][None].to(device)
    with torch.no_grad():
        try:
            num_classes = int(ModelFn(loaded[0].model, device=x.device).forward(x).shape[1])
        except (RuntimeError, AssertionError) as exc:  # a channel or size mismatch (exported graphs assert)
            raise ValueError(f"{loaded[0].name} fails on an input of shape {list(x.shape)} "
                             f"(check --size, --grey): {first_line(exc)}") from None
    k = args.k or (100 if x.device.type == "cuda" else 500)
    return loaded, source, class_namer(num_classes, args.class_names, source.classes), k, (mean, std)


def _noise_units(args, mean, std):
    """--noise-sigma in pixel units -> the model's input units: (sigma, value range), or {} without masks."""
    import torch

    if not getattr(args, "object_masks", None):
        return {}
    if args.noise_sigma <= 0:
        raise ValueError("--noise-sigma must be above 0")
    # x_norm = (x - mean) / std, valid pixels in [0, 1]
    m, s = (torch.as_tensor(v, dtype=torch.float32).reshape(-1, 1, 1) for v in (mean, std))
    return {"noise_sigma": args.noise_sigma / s, "value_range": ((0 - m) / s, (1 - m) / s)}


def _audit_config(args, k: int, noise: dict):
    """The AuditConfig the arguments ask for: the method's options, and the audit command's own (--ensemble,
    --fraction, --batch-size) where the command has them; ``noise``: :func:`_noise_units`'s."""
    from ..audit.config import AuditConfig

    own = {name: getattr(args, name) for name in ("ensemble", "fraction", "batch_size") if hasattr(args, name)}
    return AuditConfig(method=args.method, threshold=args.threshold, threshold_mode=args.threshold_mode, k=k,
                       collection=args.collection, **own, **noise)


def _run_sis(args):
    """The ``sis`` command: one model, in memory; returns the AuditRecord."""
    import numpy as np
    import torch

    from ..audit.config import RunOptions
    from ..audit.runner import run_audit

    _check_device(args.device)
    loaded, source, namer, k, _ = _prepare(args, False, torch.device(args.device))
    items = [source[i] for i in range(len(source))]
    x = torch.stack([it["x"] for it in items]).to(args.device)
    run = RunOptions(class_name=namer, title="SIS", progress=False if args.quiet else None,
                     meta={"models": [args.model], "image source": source.description})
    return run_audit({m.name: m.model for m in loaded}, x, source.image_names,
                     np.stack([it["display"] for it in items]), _audit_config(args, k, {}), run,
                     labels=source.image_labels)


def _run_audit(args):
    """The ``audit`` command: streamed into the durable store in --out, resumable, sharded under torchrun."""
    from ..audit.config import RunOptions, StoreOptions
    from ..audit.distributed import setup, teardown
    from ..audit.stream import run_stored_audit

    _check_device(args.device)
    ranks = setup(args.device)
    try:
        loaded, source, namer, k, (mean, std) = _prepare(args, True, ranks.device)
        storage = StoreOptions(chunk_size=args.chunk_size, restart=args.restart, workers=args.workers,
                               identity={"model_files": args.model, "class_names": args.class_names},
                               gallery=args.gallery)
        run = RunOptions(class_name=namer, title=args.title, progress=False if args.quiet else None,
                         meta={"models": args.model, "image source": source.description})
        return run_stored_audit({m.name: m.model for m in loaded}, source, args.out,
                                _audit_config(args, k, _noise_units(args, mean, std)), storage, run, ranks=ranks)
    finally:
        teardown(ranks)


def _check_device(device: str) -> None:
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device: {device!r} is not a device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is available here")


def _print_table(record, most: int = 60) -> None:
    rows = len(record.models) * len(record.image_names)
    if rows > most:
        for m in record.models:
            with_sis = [r.fraction for r in m.results if r.sis is not None]
            median = f"{sorted(with_sis)[len(with_sis) // 2]:.1%}" if with_sis else "-"
            print(f"{m.name}: {len(with_sis)} of {len(m.results)} images have a SIS; median size {median}")
        return
    print(f"{'model':<20} {'image':<14} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS':>7} {'of image':>9}")
    for m in record.models:
        for name, r in zip(record.image_names, m.results):
            size = "-" if r.sis is None else str(r.size)
            frac = "-" if r.sis is None else f"{r.fraction:.1%}"
            print(f"{m.name[:20]:<20} {name[:14]:<14} {record.class_name(r.target)[:22]:<22} {r.score:>6.3f} "
                  f"{r.threshold:>6.3f} {size:>7} {frac:>9}")


def _sis_png(record, path: str) -> str:
    """One row per image (original, SIS over it, SIS alone) for the record's single model."""
    from ..audit.metrics import on_grid
    from ..audit.plotting import sis_figure

    (m,) = record.models
    masks = [r.mask.numpy() if on_grid(r, d) else None for r, d in zip(m.results, record.displays)]
    titles = [f"{n}\n{record.class_name(r.target)[:18]}\nf={r.score:.2f} tau={r.threshold:.2f}"
              + ("" if r.sis is None else f"\nSIS {r.fraction:.1%}") for n, r in zip(record.image_names, m.results)]
    sis_figure(list(record.displays), masks, titles, path)
    return path


def main(argv: list[str] | None = None) -> int:
    import os

    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run_demo

            _check_device(args.device)
            run_demo(args.out, n_images=args.images, threshold=args.threshold,
                     compare_reference=not args.no_reference, imagenet=not args.no_imagenet, k=args.k, text=not args.no_text,
                     device=args.device)
        elif args.command == "sis":
            from ..audit.faults import writing
            from ..audit.persist import save_audit

            record = _run_sis(args)
            _print_table(record)
            with writing(args.out):
                print(f"wrote {save_audit(record, args.out)}")
                print(f"wrote {_sis_png(record, os.path.join(args.out, 'sis.png'))}")
        elif args.command == "audit":
            run = _run_audit(args)
            if run.ranks.is_main:
                _print_table(run.record)
                print(f"{run.chunks} chunks: {run.skipped} already committed, {run.computed} computed by rank 0 "
                      f"of {run.ranks.world}")
                for f in ("results.json", "sis.parquet", "report.html"):
                    print(f"wrote {os.path.join(args.out, f)}")
        elif args.command == "report":
            from ..audit.faults import writing
            from ..audit.report import rebuild_report

            with writing(os.path.dirname(os.path.abspath(args.out)) if args.out else args.folder):
                print(f"wrote {rebuild_report(args.folder, args.out, gallery=args.gallery)}")
        elif args.command == "reduce":
            from ..text.job import run_reduce

            limit = args.limit if args.limit is not None or args.text != "bundled" else 200
            s = run_reduce(args.model, args.text, args.out, beam_size=args.beam_size, importance=args.importance,
                           limit=limit, progress=False if args.quiet else None)
            print(f"{s['sequences']} texts in {s['seconds']:.1f} s: mean length {s['mean_length']:.1f} -> "
                  f"{s['mean_reduced_length']:.1f} tokens (median {s['median_length']:g} -> "
                  f"{s['median_reduced_length']:g}); {s['share_more_confident']:.0%} of the reductions are more "
                  f"confident than the originals")
            print(f"wrote {s['reductions']} and {s['report']}")
        elif args.command == "digits-pipeline":
            import json

            from ..audit.pipeline import digits_pipeline, format_table

            if args.fraction == 0:
                raise ValueError("--fraction must be above 0")
            result = digits_pipeline(args.fraction, args.train, args.test, args.epochs)
            print(format_table(result))
            print(f"{result['pixels_kept']} of {result['pixels']} pixels kept; {result['seconds']['total']:.1f} s")
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump(result, fh, indent=1)
    except (ValueError, TypeError, FileNotFoundError, FloatingPointError, StorageFault, MissingDependency) as exc:
        print(f"overinterp-fast: error: {exc}", file=sys.stderr)
        return 2
    return 0
