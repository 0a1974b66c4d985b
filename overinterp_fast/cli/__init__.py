"""Command line: `overinterp-fast` (or `python -m overinterp_fast`).

Every default of the commands is read from the options objects it fills (:class:`~overinterp_fast.audit.AuditConfig`,
:class:`~overinterp_fast.audit.StoreOptions`, :class:`~overinterp_fast.audit.RunOptions`, the method options of
:mod:`overinterp_fast.attr.options`) or from the constants of the function it calls, never typed again here
(docs: conventions.md). ``audit`` stores its options in the audit folder, and ``audit --resume OUT`` reads them back.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from ..attr.options import RunOptions as _MethodRun
from ..audit.config import METHODS, SCORE_DTYPES, AuditConfig, StoreOptions
from ..audit.config import RunOptions as _AuditRun

_A, _S, _T = AuditConfig, StoreOptions, _AuditRun  # the defaults' single source
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# What an audit folder stores of the command line for --resume: every option but these (the invocation's own), and
# of the stored ones, those that may take other values on --resume (the stored configuration still checks the
# device type).
NOT_STORED = frozenset({"command", "out", "resume", "restart", "quiet", "verbose", "log_level", "given",
                        "resumed_identity", "threads", "dry_run"})
FREE_ON_RESUME = frozenset({"workers", "title", "gallery", "device", "pixel_subsets", "checkpoint_every"})
PATH_OPTIONS = frozenset({"images", "data_dir", "labels", "class_names", "object_masks"})
from ..errors import Interrupted, MissingDependency, StorageFault
from ..util.command import PROG, resume_command


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors (a malformed argument, a missing option) end in the one line every error of
    the command line ends in, ``overinterp-fast: error: ...`` (after the usage), whichever command they are of."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{PROG}: error: {message}\n")


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


def _nonnegative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {v}")
    return v


def _seconds(text: str) -> float:
    v = float(text)
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return v


DATASETS = ("cifar10", "cifar100")


def _add_model_and_images(p: argparse.ArgumentParser, several: bool) -> None:
    from ..audit.config import AUTO_EXACT_FEATURES, THRESHOLD_MODES
    from ..runtime.model import OUTPUT_KINDS

    side = int(AUTO_EXACT_FEATURES ** 0.5)
    p.add_argument("--model", action="append" if several else "store", required=not several, default=None,
                   help="efficientnet-lite0/1/2; timm:NAME, torchvision:NAME (=PATH: weights from a file) or hf:NAME "
                        "(a transformers image classifier), with the library's own preprocessing and weights from "
                        "its cache (never downloaded); or a .onnx, .pt2 (torch.export) or .pt (TorchScript) file"
                   + ("; repeat to compare models" if several else ""))
    p.add_argument("--images", default=None,
                   help="a folder of images (class subfolders: labels in torchvision ImageFolder order), or "
                        "'bundled' (photos from scikit-image and sklearn; default)")
    p.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                   help="a dataset's python batches in --data-dir (as torchvision downloads them) instead of --images")
    p.add_argument("--data-dir", default=None, help="folder holding the --dataset files (e.g. cifar-10-batches-py/)")
    p.add_argument("--split", choices=("test", "train", "all"), default="test",
                   help="--dataset split: test, train, or all (train then test: CIFAR-10's 60,000; default: test)")
    p.add_argument("--labels", default=None, help="JSON file {image name: true class index} (flat folders)")
    p.add_argument("--class-names", default=None, help="text file with one class name per line")
    p.add_argument("--select", default=None, help="images A:B (positions, Python slice bounds), e.g. 0:1000")
    p.add_argument("--limit", type=_positive, default=None, help="use the first N images (after --select)")
    p.add_argument("--size", type=_positive, default=None,
                   help="input side (default: the model's, e.g. 224 for efficientnet-lite0, after resizing to 256 as "
                        "its timm data config says)")
    p.add_argument("--mean", type=_floats, default=None, help="normalization mean, one or per channel (default 0.5)")
    p.add_argument("--std", type=_floats, default=None, help="normalization std, one or per channel (default 0.5)")
    p.add_argument("--grey", action="store_true", help="load images as one channel")
    p.add_argument("--method", choices=METHODS, default=_A.method,
                   help=f"SIS method (default {_A.method}: exact up to {side}x{side} pixels, else gradient, or "
                        f"responsibility when a model is an ONNX file)")
    p.add_argument("--threshold", type=_unit_interval, default=_A.threshold, help=f"tau (default: {_A.threshold})")
    p.add_argument("--threshold-mode", choices=THRESHOLD_MODES, default=_A.threshold_mode,
                   help=f"tau per image: auto: tau where f(x) >= tau, else tau * f(x); absolute: tau; relative: "
                        f"tau * f(x) (default: {_A.threshold_mode})")
    p.add_argument("--outputs", choices=OUTPUT_KINDS, default=_A.outputs,
                   help=f"what the models return: logits (f is their softmax) or probabilities (a model that ends in a "
                        f"softmax); checked on the first images (default: {_A.outputs})")
    p.add_argument("--k", type=_positive, default=_A.k,
                   help=f"features per gradient step (default {_A.k}; larger is faster and coarser)")
    p.add_argument("--collection", action="store_true", default=_A.collection, help="find every disjoint SIS")
    p.add_argument("--device", default=_S.device,
                   help=f"auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N (default: "
                        f"{_S.device})")
    p.add_argument("--seed", type=_nonnegative, default=_A.seed,
                   help=f"seeds the run: torch, numpy and random, the responsibility method's descents and the "
                        f"noise of --object-masks; recorded with the results (default {_A.seed})")
    p.add_argument("--out", required=not several, default=None, help="output folder")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    return values


def _logging_options(top: bool) -> argparse.ArgumentParser:
    """-v/--verbose and --log-level, for the top level and (``top`` False: defaults left unset, so that an option
    given before the command is kept) for every command."""
    p = Parser(add_help=False)
    unset = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument("-v", "--verbose", action="count", **({"default": 0} if top else unset),
                   help="log the library's decisions: -v info, -vv debug (default: warnings only)")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, **({"default": None} if top else unset),
                   help="the log level, instead of -v (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    return p


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..audit.config import EPOCHS, FRACTION
    from ..text.reduction import BEAM_SIZE, IMPORTANCE, IMPORTANCES
    from .retrain import add_retrain_parser, add_threads, seeds_type

    parser = Parser(prog=PROG, description="Fast Sufficient Input Subsets (SIS).",
                    parents=[_logging_options(top=True)])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    common = [_logging_options(top=False)]
    demo = sub.add_parser("demo", parents=common, help="the embedded default: exact SIS on digits, then an audit "
                          "report of EfficientNet-Lite0 on bundled photos")
    demo.add_argument("--out", default="out/demo", help="output folder (default: out/demo)")
    demo.add_argument("--images", type=_positive, default=12, help="test digits to explain (default: 12)")
    demo.add_argument("--threshold", type=_unit_interval, default=_MethodRun.threshold,
                      help=f"tau (default: {_MethodRun.threshold})")
    demo.add_argument("--no-reference", action="store_true", help="skip the timing against the reference")
    demo.add_argument("--no-imagenet", action="store_true", help="skip the EfficientNet-Lite0 part")
    demo.add_argument("--no-text", action="store_true",
                      help="skip the text part (input reduction of the Rotten Tomatoes word CNN)")
    demo.add_argument("--k", type=_positive, default=None,
                      help="features per gradient step for the ImageNet part (default: 500 on CPU, 100 on CUDA)")
    demo.add_argument("--device", default=_S.device,
                      help=f"device for the ImageNet part: auto, cpu or cuda (default: {_S.device})")
    sis = sub.add_parser("sis", parents=common, help="SIS of one model on a folder of images: results.json and a "
                         "figure")
    _add_model_and_images(sis, several=False)
    audit = sub.add_parser("audit", parents=common,
                           help="audit one or more models (and compare them): results and an HTML report")
    _add_model_and_images(audit, several=True)
    audit.add_argument("--resume", default=None, metavar="OUT",
                       help="continue the audit in OUT with the configuration stored there (no other options "
                            "needed; options that differ from the stored ones are refused)")
    audit.add_argument("--ensemble", action="store_true", default=_A.ensemble,
                       help="also audit the mean-of-logits ensemble of the models")
    audit.add_argument("--fraction", type=_unit_interval, default=_A.fraction,
                       help=f"pixel-subset fraction for the transfer table (default {_A.fraction})")
    audit.add_argument("--title", default=_T.title, help=f"the report's heading (default: {_T.title!r})")
    audit.add_argument("--object-masks", default=None,
                       help="folder of object masks named like the images (nonzero = object): adds SIS pixels in "
                            "the object and foreground/background noise sensitivity (RFS, iRFS)")
    audit.add_argument("--noise-sigma", type=float, default=_A.noise_sigma,
                       help=f"std of the Gaussian noise for --object-masks, in pixel units (a fraction of the pixel "
                            f"range [0, 1], whatever the normalization; default {_A.noise_sigma})")
    audit.add_argument("--chunk-size", type=_positive, default=_S.chunk_size,
                       help=f"images per chunk: the unit of batching, commit and sharding; part of the "
                            f"configuration (default {_S.chunk_size})")
    audit.add_argument("--batch-size", type=_positive, default=_A.batch_size,
                       help="candidates per forward call (default: fixed by the input shape, so that results do not "
                            "depend on timing; part of the configuration)")
    audit.add_argument("--workers", type=int, default=_S.workers,
                       help=f"image-loading worker processes per rank (default {_S.workers})")
    audit.add_argument("--restart", action="store_true", default=_S.restart,
                       help="discard the audit in --out and start over")
    audit.add_argument("--gallery", type=int, default=_S.gallery,
                       help=f"images shown with their SIS in the report (default {_S.gallery}); statistics cover all")
    audit.add_argument("--pixel-subsets", action="store_true", default=_S.pixel_subsets,
                       help="exact or gradient SIS: when the audit completes, also write the pixel-subset datasets, "
                            "OUT/subsets/<model>/<split>.npz: per image its backward-selection order, the last "
                            "--fraction of it and as many random pixels (docs: reproducing.md)")
    audit.add_argument("--checkpoint-every", type=_seconds, default=_S.checkpoint_every, metavar="SECONDS",
                       help=f"exact SIS: save each chunk's backward selection at least this often, besides as each "
                            f"image finishes; an interruption loses at most this much work (default "
                            f"{_S.checkpoint_every:g})")
    audit.add_argument("--dry-run", action="store_true",
                       help="print the plan (images, chunks, method, device, batch size) and the estimate of the "
                            "whole audit, then stop: nothing is computed or written")
    audit.add_argument("--score-dtype", choices=sorted(SCORE_DTYPES), default=_A.score_dtype,
                       help="exact SIS: score candidates in this dtype first, again in float32 where it cannot "
                            "decide (the results are float32's; part of the configuration)")
    audit.add_argument("--channels-last", type=_auto_on_off, default=_A.channels_last, metavar="{auto,on,off}",
                       help="exact SIS: score candidates through a channels_last copy of the model (on), not (off), "
                            "or measure which is faster when the audit starts (auto, the default; part of the "
                            "configuration: a resumed audit keeps the first choice, but two audits may choose "
                            "differently where the formats are close, and their float32 last bits with it)")
    add_threads(audit)
    report = sub.add_parser("report", parents=common,
                            help="rebuild report.html from a results folder, without recomputing")
    report.add_argument("folder", help="a folder written by 'audit', 'sis' or 'demo'")
    report.add_argument("--out", default=None, help="HTML path (default: FOLDER/report.html)")
    report.add_argument("--gallery", type=int, default=_S.gallery,
                        help=f"images shown with their SIS (default {_S.gallery})")
    red = sub.add_parser("reduce", parents=common, help="input reduction of a text classifier (Feng et al. 2018): "
                         "reductions.parquet and an HTML page")
    red.add_argument("--model", default="bundled",
                     help="'bundled' (the Rotten Tomatoes word CNN, trained once and cached) or a file written by "
                          "overinterp_fast.zoo.text.save_text_model")
    red.add_argument("--text", default="bundled",
                     help="'bundled' (held-out Rotten Tomatoes snippets) or a UTF-8 file with one text per line")
    red.add_argument("--limit", type=_positive, default=None,
                     help="use the first N texts (default: all; 200 for --text bundled)")
    red.add_argument("--beam-size", type=_positive, default=BEAM_SIZE,
                     help=f"maximum beam size k (default {BEAM_SIZE}; 1 = greedy)")
    red.add_argument("--importance", choices=IMPORTANCES, default=IMPORTANCE,
                     help=f"how members are ranked (default {IMPORTANCE})")
    red.add_argument("--out", required=True, help="output folder")
    red.add_argument("--quiet", action="store_true", help="no progress bars")
    pipe = sub.add_parser("digits-pipeline", parents=common,
                          help="the pixel-subset experiment of Carter et al. 2021 on real digits (train on 5%% subsets)")
    pipe.add_argument("--fraction", type=_unit_interval, default=FRACTION, help=f"pixels kept (default {FRACTION})")
    pipe.add_argument("--train", type=_positive, default=None, help="training images to use (default: all)")
    pipe.add_argument("--test", type=_positive, default=None, help="test images to use (default: all)")
    pipe.add_argument("--epochs", type=_positive, default=EPOCHS, help=f"training epochs (default {EPOCHS})")
    pipe.add_argument("--seeds", type=seeds_type, default=None,
                      help="train the subset models once per seed, e.g. 0,1,2,3,4: mean, std and min-max over them "
                           "(default: the one seed 0)")
    pipe.add_argument("--out", default=None, help="write the result as JSON here")
    retrain = add_retrain_parser(sub, common)
    parser.commands = {"demo": demo, "sis": sis, "audit": audit, "report": report, "reduce": red,
                       "digits-pipeline": pipe, "retrain": retrain}
    return parser


def _given(argv: list[str]) -> set[str]:
    """The options (argparse dests) that ``argv`` gives explicitly, defaults aside."""
    parser = build_parser()
    for sub in (parser, *parser.commands.values()):
        for action in sub._actions:
            if action.dest not in ("help", "version", "command"):
                action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (argparse's usage and exit status 2 on a malformed one). ``audit`` needs
    --model and --out, or --resume OUT alone."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.given = _given(argv)
    if args.command == "audit" and args.resume is None:
        missing = [flag for flag, value in (("--model", args.model), ("--out", args.out)) if value is None]
        if missing:
            parser.commands["audit"].error(f"the following arguments are required: {', '.join(missing)} "
                                           f"(or --resume OUT)")
    return args


def _prepare(args, several: bool, device):
    """Models, image source (selected), class namer, k, and (mean, std) as the arguments say."""
    from ..audit.checks import check_source
    from ..audit.sources import open_images, select_range
    from .loading import class_namer, common_preprocessing, load_model

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
    if args.dataset is not None and args.size is None and not any(m.size for m in loaded):
        size, mean, std = None, args.mean, args.std  # the dataset's own side (32 for CIFAR)
    else:
        size, mean, std = common_preprocessing(loaded, args.size, args.mean, args.std), None, None
    source = open_images(args.images, size, mean, std, args.grey, args.labels, dataset=args.dataset,
                         data_dir=args.data_dir, split=args.split, object_dir=getattr(args, "object_masks", None))
    source = source.subset(select_range(len(source), args.select, args.limit))
    # every model against the images before any work: channels (exported graphs assert), classes, labels, outputs
    num_classes = check_source({m.name: m.model for m in loaded}, source, args.outputs, device,
                               hint=" (check --size, --grey)")
    k = args.k
    return loaded, source, class_namer(num_classes, args.class_names, source.classes), k, (source.mean, source.std)


def _noise_units(args, mean, std):
    """With --object-masks: --noise-sigma (pixel units, as AuditConfig takes it) and the value range of a pixel in
    the model's input units, (low, high) = ((0 - mean) / std, (1 - mean) / std); {} without masks."""
    import torch

    if not getattr(args, "object_masks", None):
        return {}
    if args.noise_sigma <= 0:
        raise ValueError("--noise-sigma must be above 0")
    # x_norm = (x - mean) / std, valid pixels in [0, 1]
    m, s = (torch.as_tensor(v, dtype=torch.float32).reshape(-1, 1, 1) for v in (mean, std))
    return {"noise_sigma": args.noise_sigma, "value_range": ((0 - m) / s, (1 - m) / s)}


def _auto_on_off(text: str) -> bool | None:
    """--channels-last: "auto" -> None (measured), "on" -> True, "off" -> False."""
    choices = {"auto": None, "on": True, "off": False}
    if text not in choices:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from 'auto', 'on', 'off')")
    return choices[text]


def _audit_config(args, k: int, noise: dict):
    """The AuditConfig the arguments ask for: the method's options, and the audit command's own (--ensemble,
    --fraction, --batch-size) where the command has them; ``noise``: :func:`_noise_units`'s."""
    from ..audit.config import AuditConfig

    own = {name: getattr(args, name) for name in ("ensemble", "fraction", "batch_size", "score_dtype", "outputs")
           if hasattr(args, name)}
    if getattr(args, "channels_last", None) is not None:
        own["channels_last"] = args.channels_last
    return AuditConfig(method=args.method, threshold=args.threshold, threshold_mode=args.threshold_mode, k=k,
                       collection=args.collection, seed=args.seed, **own, **noise)


def seed_everything(seed: int) -> None:
    """Seed every generator a run may draw from: Python's ``random``, numpy's global one and torch's (CPU and
    every CUDA device). The audit's own random draws take ``AuditConfig.seed`` besides."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _run_sis(args):
    """The ``sis`` command: one model, in memory; returns the AuditRecord."""
    import numpy as np
    import torch

    from ..audit.config import RunOptions
    from ..audit.runner import run_audit

    device = _check_device(args.device)
    seed_everything(args.seed)
    loaded, source, namer, k, _ = _prepare(args, False, device)
    items = [source[i] for i in range(len(source))]
    x = torch.stack([it["x"] for it in items]).to(device)
    run = RunOptions(class_name=namer, title="SIS", show_progress=False if args.quiet else None,
                     meta={"models": [args.model], "image source": source.description,
                           "preprocessing": source.preprocessing.describe(), "seed": args.seed})
    return run_audit({m.name: m.model for m in loaded}, x, source.image_names,
                     np.stack([it["display"] for it in items]), _audit_config(args, k, {}), run,
                     labels=source.image_labels)


def _stored_value(dest: str, value):
    """An audit option as its folder stores it for --resume: paths made absolute (a zoo name stays a name)."""
    if value is None:
        return None
    if dest == "model":
        return [os.path.abspath(m) if os.path.exists(m) else m for m in value]
    if dest in PATH_OPTIONS and not (dest == "images" and value == "bundled"):
        return os.path.abspath(value)
    return value


def _stored_command(args) -> dict:
    """What the audit folder stores of the command line: every option of ``audit`` that fixes the results (or its
    defaults), so that ``audit --resume OUT`` reruns it alone."""
    return {dest: _stored_value(dest, value) for dest, value in sorted(vars(args).items()) if dest not in NOT_STORED}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _resume(args):
    """``args`` of ``audit --resume OUT``: the options stored in OUT, and those given here that are free to
    change (--workers, --title, --gallery, --device: the stored device type is checked when the audit opens the
    folder). One-line ValueError when OUT holds no stored configuration or a given option differs from it."""
    from ..audit import store

    folder = args.resume
    if args.restart:
        raise ValueError("--resume continues the audit stored in its folder and --restart starts over: give one")
    if not os.path.isdir(folder):
        raise ValueError(f"--resume: {folder!r} is not a folder")
    doc = store.read_doc(folder)
    if doc is None:
        raise ValueError(f"--resume: {folder!r} holds no stored audit configuration ({store.RESULTS_FILE}); start "
                         f"the audit with --model ... --out {folder}")
    command = doc.get("command")
    if not isinstance(command, dict):
        raise ValueError(f"--resume: the audit in {folder!r} was stored without its command line (by an earlier "
                         f"version); rerun its full command with --out {folder}")
    given = getattr(args, "given", set())
    if "out" in given and os.path.abspath(args.out) != os.path.abspath(folder):
        raise ValueError(f"--resume {folder}: --out {args.out} is another folder; leave --out out")
    for dest in sorted(given & set(command) - FREE_ON_RESUME):
        mine = _stored_value(dest, getattr(args, dest))
        if mine != command[dest]:
            raise ValueError(f"--resume {folder}: {_flag(dest)} is {mine!r} here, {command[dest]!r} in the stored "
                             f"configuration; leave it out to continue the audit, or start over with --restart "
                             f"and the full command")
    for dest, value in command.items():
        if dest not in given or dest not in FREE_ON_RESUME:
            setattr(args, dest, value)
    args.out = folder
    config = doc.get("config", {})
    args.resumed_identity = {k: config[k] for k in ("model_files", "class_names") if k in config}
    return args


def _run_audit(args):
    """The ``audit`` command: streamed into the durable store in --out, resumable, sharded under torchrun; with
    --dry-run, its plan (:class:`~overinterp_fast.audit.planning.AuditPlan`), nothing computed."""
    from ..audit.config import RunOptions, StoreOptions
    from ..audit.distributed import setup, teardown
    from ..audit.stream import plan_stored_audit, run_stored_audit

    if getattr(args, "resume", None) is not None:
        args = _resume(args)
    _check_device(args.device)
    seed_everything(args.seed)
    ranks = setup(args.device)
    try:
        loaded, source, namer, k, (mean, std) = _prepare(args, True, ranks.device)
        identity = {"model_files": args.model, "class_names": args.class_names}
        identity.update(getattr(args, "resumed_identity", {}))  # the stored names of the files, as first given
        storage = StoreOptions(chunk_size=args.chunk_size, restart=args.restart, workers=args.workers,
                               identity=identity, gallery=args.gallery, command=_stored_command(args),
                               pixel_subsets=args.pixel_subsets, checkpoint_every=args.checkpoint_every)
        run = RunOptions(class_name=namer, title=args.title, show_progress=False if args.quiet else None,
                         meta={"models": args.model, "image source": source.description,
                               "preprocessing": source.preprocessing.describe(), "seed": args.seed})
        config = _audit_config(args, k, _noise_units(args, mean, std))
        models = {m.name: m.model for m in loaded}
        if getattr(args, "dry_run", False):
            return plan_stored_audit(models, source, args.out, config, storage, ranks=ranks)
        return run_stored_audit(models, source, args.out, config, storage, run, ranks=ranks)
    finally:
        teardown(ranks)


def _check_device(device: str):
    """The torch.device ``device`` names ("auto": a CUDA GPU when there is one, else the CPU); one-line
    ValueError for a name that is not a device or a GPU that is not there."""
    import torch

    from ..audit.distributed import resolve_device

    try:
        dev = resolve_device(device)
    except RuntimeError:
        raise ValueError(f"--device: {device!r} is not a device (auto, cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is available here")
    return dev


def _print_table(record, most: int = 60) -> None:
    rows = len(record.models) * len(record.image_names)
    if rows > most:
        for m in record.models:
            with_sis = [r.fraction for r in m.results if r.sis is not None]
            median = f"{sorted(with_sis)[len(with_sis) // 2]:.1%}" if with_sis else "-"
            print(f"{m.name}: {len(with_sis)} of {len(m.results)} images have a SIS; median size {median}")
        return
    from ..methods.results import score_text

    print(f"{'model':<20} {'image':<14} {'prediction':<22} {'f(x)':>6} {'tau':>6} {'SIS':>7} {'of image':>9}")
    for m in record.models:
        for name, r in zip(record.image_names, m.results):
            size = "-" if r.sis is None else str(r.size)
            frac = "-" if r.sis is None else f"{r.fraction:.1%}"
            score = score_text(r.score, r.threshold, digits=3, fixed=True)  # never rounded onto 1 or tau
            print(f"{m.name[:20]:<20} {name[:14]:<14} {record.class_name(r.target)[:22]:<22} {score:>6} "
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


def log_level(args) -> int:
    """The level the arguments ask for: --log-level, else WARNING lowered by one step per -v (INFO, DEBUG)."""
    if getattr(args, "log_level", None):
        return getattr(logging, args.log_level)
    return max(logging.DEBUG, logging.WARNING - 10 * getattr(args, "verbose", 0))


@contextlib.contextmanager
def logging_to_stderr(level: int):
    """The package's log records at ``level`` and above go to stderr (one line each: level, logger, message) for
    the duration of a command, and the estimate of a long run (:mod:`overinterp_fast.runtime.estimate`, logged at
    INFO) as ``overinterp-fast: <estimate>`` at any level; the loggers' levels and handlers are restored after."""
    from ..runtime.estimate import logger as estimates  # a long run's estimate, printed whatever the level

    logger = logging.getLogger("overinterp_fast")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(lambda record: record.name != estimates.name)
    said = logging.StreamHandler(sys.stderr)
    said.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    before, estimates_before = logger.level, estimates.level
    logger.addHandler(handler)
    estimates.addHandler(said)
    logger.setLevel(level)
    estimates.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        estimates.removeHandler(said)
        logger.setLevel(before)
        estimates.setLevel(estimates_before)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with logging_to_stderr(log_level(args)):
        try:
            _command(args)
        except (ValueError, TypeError, FileNotFoundError, FloatingPointError, StorageFault, MissingDependency) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in an audit: one line, what is kept, how to resume
            if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for the job
                print(f"{PROG}: {interrupted_line(exc)}", file=sys.stderr)
            return exc.exit_status if isinstance(exc, Interrupted) else 130
    return 0


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """What an interrupted command says: the signal, and for an audit what its folder keeps and the command that
    resumes it."""
    if not isinstance(exc, Interrupted):
        return "interrupted"
    if exc.folder is None:
        return f"interrupted by {exc.signal}"
    again = resume_command(exc.folder)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        again = f"the same torchrun command (or with {resume_command(exc.folder)})"
    return f"interrupted by {exc.signal}: {exc.folder} keeps {exc.kept}; resume with: {again}"


def _command(args) -> None:
    """Run the command ``args`` names."""
    if args.command == "demo":
        from .demo import run_demo

        _check_device(args.device)
        run_demo(args.out, n_images=args.images, threshold=args.threshold, compare_reference=not args.no_reference,
                 imagenet=not args.no_imagenet, k=args.k, text=not args.no_text, device=args.device)
    elif args.command == "sis":
        from ..audit.faults import writing
        from ..audit.persist import save_audit

        record = _run_sis(args)
        _print_table(record)
        with writing(args.out):
            print(f"wrote {save_audit(record, args.out)}")
            print(f"wrote {_sis_png(record, os.path.join(args.out, 'sis.png'))}")
    elif args.command == "audit":
        from ..util.threads import torch_threads

        with torch_threads(args.threads):
            run = _run_audit(args)
        if getattr(args, "dry_run", False):
            if run is not None:  # rank 0's plan
                print(run.text())
                print("dry run: nothing was computed or written")
            return
        if run.ranks.is_main:
            _print_table(run.record)
            print(f"{run.chunks} chunks: {run.skipped} already committed, {run.computed} computed by rank 0 "
                  f"of {run.ranks.world}")
            for f in ("results.json", "sis.parquet", "report.html", *run.subsets):
                print(f"wrote {os.path.join(args.out, f)}")
    elif args.command == "report":
        from ..audit.faults import writing
        from ..audit.partial import partial_note
        from ..audit.report import rebuild_report

        with writing(os.path.dirname(os.path.abspath(args.out)) if args.out else args.folder):
            path = rebuild_report(args.folder, args.out, gallery=args.gallery)
        partial = partial_note(args.folder)
        print(f"wrote {path}" + (f" ({partial})" if partial else ""))
    elif args.command == "reduce":
        from ..text.job import run_reduce

        limit = args.limit if args.limit is not None or args.text != "bundled" else 200
        s = run_reduce(args.model, args.text, args.out, beam_size=args.beam_size, importance=args.importance,
                       limit=limit, show_progress=False if args.quiet else None)
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
        result = digits_pipeline(args.fraction, args.train, args.test, args.epochs, seeds=args.seeds)
        print(format_table(result))
        print(f"{result['pixels_kept']} of {result['pixels']} pixels kept; {result['seconds']['total']:.1f} s")
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(result, fh, indent=1)
    elif args.command == "retrain":
        from .retrain import run_retrain

        run_retrain(args)
