"""The ``retrain`` command (new models trained on an audit's pixel subsets: Carter et al. 2021, Table 1), and the
``--threads`` and ``--seeds`` options the experiment commands share.

    overinterp-fast retrain out/cifar --arch resnet20 --seeds 0,1,2,3,4 --threads 8

Every default is :class:`~overinterp_fast.audit.config.RetrainOptions`' (read here, never typed again).
"""
from __future__ import annotations

import argparse
import os

from ..audit.config import TARGETS, RetrainOptions


def positive_int(text: str) -> int:
    """A positive integer (``--threads``, ``--epochs``, ...); argparse prints the one-line error otherwise."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def seeds_type(text: str) -> tuple[int, ...]:
    """``--seeds``: integers >= 0, separated by commas, all different."""
    try:
        seeds = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected different integers >= 0, got {text!r}")
    return seeds


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch's CPU threads for this run (each process of a torchrun job; default: torch's own, "
                        "OMP_NUM_THREADS where set)")


def add_retrain_parser(sub, parents: list) -> argparse.ArgumentParser:
    """The ``retrain`` command's parser."""
    from ..zoo.architectures import ZOO_ARCHITECTURES

    o = RetrainOptions
    p = sub.add_parser("retrain", parents=parents,
                       help="train new models on an audit's 5%% pixel subsets and on random 5%%, test on each, over "
                            "several seeds (the paper's Table 1): a JSON and a table")
    p.add_argument("folder", help="an audit folder written with --pixel-subsets (train and test splits), or its "
                                  "subsets/<model> folder")
    p.add_argument("--subsets-of", default=None, metavar="MODEL",
                   help="the audited model whose subsets to train on, when the audit has several")
    p.add_argument("--arch", default=o.arch,
                   help=f"the architecture, trained from scratch: {', '.join(ZOO_ARCHITECTURES)}, timm:NAME or "
                        f"torchvision:NAME (default {o.arch})")
    p.add_argument("--seeds", type=seeds_type, default=o.seeds,
                   help=f"one model per seed and subset kind (default {','.join(map(str, o.seeds))})")
    p.add_argument("--epochs", type=positive_int, default=o.epochs, help=f"training epochs (default {o.epochs})")
    p.add_argument("--batch-size", type=positive_int, default=o.batch_size,
                   help=f"images per step (default {o.batch_size})")
    p.add_argument("--lr", type=float, default=o.lr, help=f"Adam's learning rate (default {o.lr:g})")
    p.add_argument("--weight-decay", type=float, default=o.weight_decay,
                   help=f"Adam's weight decay (default {o.weight_decay:g})")
    p.add_argument("--classes", type=positive_int, default=o.classes,
                   help="the number of classes (default: the largest label, plus one)")
    p.add_argument("--target", choices=TARGETS, default=o.target,
                   help=f"train on the true labels or the audited model's predictions (default {o.target})")
    p.add_argument("--train-split", default="train", help="the training split's file name (default train)")
    p.add_argument("--test-split", default="test", help="the test split's file name (default test)")
    p.add_argument("--device", default=o.device,
                   help=f"auto (a CUDA GPU when there is one), cpu, cuda or cuda:N (default {o.device})")
    p.add_argument("--workers", type=int, default=o.workers,
                   help=f"processes that build the batches (default {o.workers}); the results do not depend on it")
    add_threads(p)
    p.add_argument("--out", default=None,
                   help="the results JSON (default FOLDER/retrain-<arch>.json); the table goes beside it (.txt). A "
                        "rerun with the same settings continues from the runs it holds")
    p.add_argument("--restart", action="store_true", help="discard the runs the results file holds")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def default_out(folder: str, arch: str) -> str:
    """FOLDER/retrain-<arch>.json, the architecture's name made a file name."""
    from ..audit.subset_files import safe_name

    return os.path.join(folder, f"retrain-{safe_name(arch)}.json")


def run_retrain(args) -> None:
    """The ``retrain`` command: train, print the table, write the JSON and the table beside it."""
    from ..audit.retraining import format_table, retrain
    from ..util.threads import torch_threads

    options = RetrainOptions(arch=args.arch, seeds=args.seeds, epochs=args.epochs, batch_size=args.batch_size,
                             lr=args.lr, weight_decay=args.weight_decay, device=args.device, workers=args.workers,
                             classes=args.classes, target=args.target)
    out = args.out or default_out(args.folder, args.arch)
    with torch_threads(args.threads):
        result = retrain(args.folder, options, out, model=args.subsets_of, splits=(args.train_split, args.test_split),
                         restart=args.restart, show_progress=False if args.quiet else None)
    table = format_table(result)
    print(table)
    d = result["data"]
    print(f"{result['config']['arch']} on {d['pixels_kept']} of {d['pixels']} pixels, {d['train_images']} training "
          f"and {d['test_images']} test images, seeds {','.join(map(str, result['seeds']))}; "
          f"{result['seconds']['total']:.1f} s")
    text = os.path.splitext(out)[0] + ".txt"
    with open(text, "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    print(f"wrote {out}")
    print(f"wrote {text}")
