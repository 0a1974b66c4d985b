"""Command line: `overinterp-fast` (or `python -m overinterp_fast`)."""
from __future__ import annotations

import argparse
import sys


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="overinterp-fast", description="Fast Sufficient Input Subsets (SIS).")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="exact SIS of a digits CNN trained on the fly (the embedded default)")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--images", type=_positive, default=12, help="test digits to explain (default: 12)")
    demo.add_argument("--threshold", type=_unit_interval, default=0.9, help="tau (default: 0.9)")
    demo.add_argument("--no-reference", action="store_true", help="skip the timing against the reference")
    demo.add_argument("--no-imagenet", action="store_true", help="skip the EfficientNet-Lite0 part")
    demo.add_argument("--k", type=_positive, default=None,
                      help="features per gradient step for the ImageNet part (default: 500 on CPU, 100 on CUDA)")
    demo.add_argument("--device", default="cpu", help="device for the ImageNet part (default: cpu)")
    pipe = sub.add_parser("digits-pipeline",
                          help="paper 000's pixel-subset experiment on real digits (train on 5%% subsets)")
    pipe.add_argument("--fraction", type=_unit_interval, default=0.05, help="pixels kept (default 0.05)")
    pipe.add_argument("--train", type=_positive, default=None, help="training images to use (default: all)")
    pipe.add_argument("--test", type=_positive, default=None, help="test images to use (default: all)")
    pipe.add_argument("--epochs", type=_positive, default=15)
    pipe.add_argument("--out", default=None, help="write the result as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from .demo import run_demo

            run_demo(args.out, n_images=args.images, threshold=args.threshold,
                     compare_reference=not args.no_reference, imagenet=not args.no_imagenet, k=args.k,
                     device=args.device)
        elif args.command == "digits-pipeline":
            import json

            from .audit.pipeline import digits_pipeline, format_table

            if args.fraction == 0:
                raise ValueError("--fraction must be above 0")
            result = digits_pipeline(args.fraction, args.train, args.test, args.epochs)
            print(format_table(result))
            print(f"{result['pixels_kept']} of {result['pixels']} pixels kept; {result['seconds']['total']:.1f} s")
            if args.out:
                with open(args.out, "w") as fh:
                    json.dump(result, fh, indent=1)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"overinterp-fast: error: {exc}", file=sys.stderr)
        return 2
    return 0
