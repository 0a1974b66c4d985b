"""Retraining on the pixel subsets (Carter et al. 2021, Table 1): new models trained from scratch on the 5%
backward-selection subsets and on random 5% subsets, each tested on both, over several seeds.

    from overinterp_fast.audit import RetrainOptions
    from overinterp_fast.audit.retraining import format_table, retrain
    result = retrain("out/cifar", RetrainOptions(arch="resnet20", seeds=(0, 1, 2, 3, 4)), out="out/retrain.json")
    print(format_table(result))

``retrain`` reads the pixel-subset files of a stored audit (``audit --pixel-subsets``: ``subsets/<model>/train.npz``
and ``test.npz``, :mod:`overinterp_fast.audit.subset_files`) through
:class:`~overinterp_fast.audit.subset_dataset.PixelSubsetDataset`. For every seed and each subset kind it trains a
new model of ``arch`` (:func:`overinterp_fast.zoo.architectures.architecture`: the zoo's by name, ``timm:NAME``,
``torchvision:NAME``; no weights are loaded) on the training split's subsets (true labels, Adam, no augmentation,
as the paper trains its subset models without it), and measures its accuracy on the test split's backward-selection
and random subsets. The rows are the paper's:

- the audited model (from the test file alone): full images, its own 5% backward-selection subsets and random 5%
  (where the audit kept what the model says on them, :mod:`overinterp_fast.audit.own_subsets`);
- trained on 5% backward selection / on 5% random, evaluated on each: the mean over the seeds, the standard
  deviation (ddof 1), the min and max, the 95% t interval of the mean (scipy) and every run.

A run is deterministic given its seed (:func:`overinterp_fast.zoo.training.fit`). With ``out``, the results JSON is
written after every run (``"status": "running"``, then ``"complete"``); a rerun with the same files and settings
continues from the runs it holds (more seeds add runs), another configuration is refused in one line unless
``restart``. The JSON carries the package's usual provenance: ``commit``, ``versions``, ``device``, ``threads``,
``command`` and ``date``.

:func:`seeded_runs`, :func:`spread` and :func:`format_table` are shared with the digits pipeline
(:func:`overinterp_fast.audit.pipeline.digits_pipeline`), which runs the same experiment on sklearn's digits.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import datetime
import hashlib
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ..util.files import read_json, write_json
from .provenance import source_commit, versions
from ..zoo.architectures import architecture
from ..zoo.training import evaluate, fit, steps_per_epoch
from .stats import mean_ci
from .store import config_difference
from .config import RetrainOptions
from .subset_dataset import PixelSubsetDataset
from .subset_files import PixelSubsets, load_pixel_subsets, subset_file

KINDS = ("backselect", "random")  # what a new model is trained on, and evaluated on
AUDITED = "full images (the audited model)"


def kind_label(kind: str, fraction: float) -> str:
    """How the tables name a kind of input: "full images", "5% backward-selection subsets", "5% random subsets"."""
    if kind == "full":
        return "full images"
    return f"{fraction:.0%} {'backward-selection' if kind == 'backselect' else 'random'} subsets"


# ----------------------------------------------------------------------------------------------
# Runs over seeds, and their spread (shared with the digits pipeline)


@dataclass
class Run:
    """One trained model: what it was trained on, its seed, its accuracy on each kind of test input, and the
    seconds it took (training and evaluation)."""

    trained_on: str
    seed: int
    accuracy: dict[str, float]
    seconds: float = float("nan")


def seeded_runs(train: Callable[[str, int], nn.Module], evaluate_on: Callable[[nn.Module, str], float],
                seeds: Sequence[int], kinds: Sequence[str] = KINDS, evaluated_on: Sequence[str] = KINDS,
                done: Sequence[Run] = (), on_run: Callable[[Run], None] | None = None) -> list[Run]:
    """For every seed, then every kind: ``train(kind, seed)`` a model and ``evaluate_on(model, e)`` it on each
    ``e`` of ``evaluated_on``. Runs in ``done`` (same kind and seed) are kept, not run again; ``on_run`` is told
    of every new one. Returns the runs in (seed, kind) order."""
    have = {(r.trained_on, r.seed): r for r in done}
    runs = []
    for seed in seeds:
        for kind in kinds:
            run = have.get((kind, seed))
            if run is None:
                t0 = time.perf_counter()
                model = train(kind, seed)
                run = Run(kind, seed, {e: float(evaluate_on(model, e)) for e in evaluated_on},
                          time.perf_counter() - t0)
                if on_run is not None:
                    on_run(run)
            runs.append(run)
    return runs


def spread(values: Sequence[float]) -> dict:
    """Accuracies of several runs: {"accuracy": the mean, "std": the sample standard deviation (ddof 1; None for
    one run), "min", "max", "ci95": the 95% t interval of the mean (scipy.stats; None for one run), "runs"}."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("no runs to summarize")
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # identical values: scipy warns, the interval is NaN
        warnings.simplefilter("ignore")
        mean, low, high = mean_ci(v)
    several = v.size > 1
    ci = [low, high] if several and math.isfinite(low) else ([mean, mean] if several else None)
    return {"accuracy": float(mean), "std": float(v.std(ddof=1)) if several else None, "min": float(v.min()),
            "max": float(v.max()), "ci95": ci, "runs": [float(x) for x in v]}


def run_rows(runs: Sequence[Run], fraction: float, kinds: Sequence[str] = KINDS,
             evaluated_on: Sequence[str] = KINDS) -> list[dict]:
    """The table's rows of trained models: per (kind trained on, kind evaluated on) the :func:`spread` of the
    runs' accuracies, in seed order, with the seeds."""
    rows = []
    for kind in kinds:
        mine = [r for r in runs if r.trained_on == kind]
        for e in evaluated_on:
            rows.append({"trained_on": kind_label(kind, fraction), "evaluated_on": kind_label(e, fraction),
                         **spread([r.accuracy[e] for r in mine]), "seeds": [r.seed for r in mine]})
    return rows


def format_table(result: dict) -> str:
    """The rows of ``result`` as a text table: trained on, evaluated on, accuracy; rows of several runs add
    "± std [min, max] (n runs)"."""
    lines = [f"{'trained on':<34} {'evaluated on':<40} {'accuracy':>8}"]
    for r in result["rows"]:
        line = f"{r['trained_on']:<34} {r['evaluated_on']:<40} {r['accuracy']:>8.3f}"
        if len(r.get("runs", ())) > 1:
            line += f" ± {r['std']:.3f} [{r['min']:.3f}, {r['max']:.3f}] ({len(r['runs'])} runs)"
        lines.append(line)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The pixel-subset files


def subset_files(path: str, model: str | None = None, train_split: str = "train",
                 test_split: str = "test") -> tuple[str, str]:
    """(training file, test file) of an audit folder or of one ``subsets/<model>/`` folder
    (:func:`~overinterp_fast.audit.subset_files.subset_file` of each split)."""
    return subset_file(path, train_split, model), subset_file(path, test_split, model)


def file_digest(path: str) -> str:
    """SHA-1 of a file's bytes: a changed subset file makes another configuration."""
    h = hashlib.sha1()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def audited_rows(test: PixelSubsetDataset, fraction: float) -> list[dict]:
    """The audited model's rows, from the test file: its accuracy on the full images and, where the audit kept
    them, on its own backward-selection and random subsets (against the dataset's labels)."""
    s, labels = test.subsets, test.labels.numpy()
    rows = [("full", s.targets)] + [(k, getattr(s, f"{k}_class")) for k in KINDS
                                    if getattr(s, f"{k}_class") is not None]
    return [{"trained_on": AUDITED, "evaluated_on": kind_label(k, fraction),
             "accuracy": float(np.mean(np.asarray(pred) == labels))} for k, pred in rows]


def _classes(train: PixelSubsets, test: PixelSubsets, given: int | None, target: str) -> int:
    key = "labels" if target == "labels" else "targets"
    largest = int(max(getattr(train, key).max(), getattr(test, key).max()))
    if given is None:
        return max(2, largest + 1)
    if largest >= given:
        raise ValueError(f"--classes {given}: the files hold class {largest}")
    return given


def _check_pair(train: PixelSubsets, test: PixelSubsets) -> None:
    if train.photos.shape[1:] != test.photos.shape[1:]:
        raise ValueError(f"the training images are {list(train.photos.shape[1:])}, the test images "
                         f"{list(test.photos.shape[1:])}")
    if train.fraction != test.fraction or train.model != test.model:
        raise ValueError(f"the files come from different audits: model {train.model!r} at {train.fraction:g} "
                         f"and {test.model!r} at {test.fraction:g}")


# ----------------------------------------------------------------------------------------------
# The experiment


@dataclass
class _Job:
    """What :func:`retrain` runs: the datasets, the builder and the JSON document as it grows."""

    train: dict[str, PixelSubsetDataset]
    test: dict[str, PixelSubsetDataset]
    build: Callable[[], nn.Module]
    device: torch.device
    doc: dict
    runs: list[Run] = field(default_factory=list)


def _device(name: str) -> torch.device:
    from .distributed import resolve_device

    try:
        dev = resolve_device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a device (auto, cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: no CUDA GPU is available here")
    return dev


def _prepare(path: str, options: RetrainOptions, model: str | None, splits: tuple[str, str]) -> _Job:
    train_file, test_file = subset_files(path, model, *splits)
    train_s, test_s = load_pixel_subsets(train_file), load_pixel_subsets(test_file)
    _check_pair(train_s, test_s)
    train = {k: PixelSubsetDataset(train_s, k, options.target) for k in KINDS}
    test = {k: PixelSubsetDataset(test_s, k, options.target) for k in KINDS}
    ds = train["backselect"]
    classes = _classes(train_s, test_s, options.classes, options.target)
    build = architecture(options.arch, ds.channels, ds.size, classes)
    device = _device(options.device)
    config = {"arch": options.arch, "epochs": options.epochs, "batch_size": options.batch_size, "lr": options.lr,
              "weight_decay": options.weight_decay, "target": options.target, "classes": classes,
              "device_type": device.type, "model": train_s.model, "fraction": train_s.fraction,
              "train_digest": file_digest(train_file), "test_digest": file_digest(test_file)}
    pixels = ds.size * ds.size
    doc = {"experiment": "retrain", "status": "running", "config": config, "seeds": list(options.seeds),
           "data": {"train": os.path.abspath(train_file), "test": os.path.abspath(test_file),
                    "train_images": len(ds), "test_images": len(test["backselect"]), "channels": ds.channels,
                    "size": ds.size, "pixels": pixels, "pixels_kept": int(train_s.backselect[0].sum())}}
    return _Job(train, test, build, device, doc)


def _provenance(device: torch.device) -> dict:
    return {"commit": source_commit(), "versions": versions(device), "device": str(device),
            "threads": torch.get_num_threads(), "command": " ".join(sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _resumed(out: str | None, config: dict, restart: bool) -> list[Run]:
    """The runs a results file at ``out`` holds for ``config`` (none without one, or with ``restart``); one-line
    ValueError when it holds another configuration."""
    if out is None or restart or not os.path.exists(out):
        return []
    doc = read_json(out)
    if not isinstance(doc, dict) or doc.get("experiment") != "retrain" or not isinstance(doc.get("config"), dict):
        raise ValueError(f"{out!r} exists and is not a retraining results file; choose another --out")
    diff = config_difference(doc["config"], config)
    if diff:
        raise ValueError(f"{out!r} holds runs of another configuration: {diff}; give --restart to start over, or "
                         f"another --out")
    return [Run(**r) for r in doc.get("runs", [])]


def retrain(path: str, options: RetrainOptions | None = None, out: str | None = None, *, model: str | None = None,
            splits: tuple[str, str] = ("train", "test"), restart: bool = False,
            show_progress: bool | None = None) -> dict:
    """Train ``options.arch`` on each subset kind of ``path``'s training split, for every seed, and test on the
    test split's (see the module docstring).

    Args:
        path: an audit folder written with ``--pixel-subsets`` (``model``: which audited model's subsets, when it
            holds several), or one ``subsets/<model>/`` folder.
        options: :class:`RetrainOptions` (None: the defaults).
        out: the results JSON, written after every run and continued by a rerun (None: nothing written).
        splits: the (training, test) splits' file names.
        restart: discard the runs ``out`` holds.
        show_progress: a bar over every epoch of every run (None: on a terminal).

    Returns:
        The results document: ``rows`` (the table: trained on, evaluated on, accuracy and its spread), ``runs``
        (every model: kind, seed, accuracies, seconds), ``config`` (what a rerun must match to continue: the
        training settings and the files' SHA-1), ``data`` (the files and their images), ``seconds`` and the
        provenance.
    """
    options = RetrainOptions() if options is None else options
    t0 = time.perf_counter()
    job = _prepare(path, options, model, splits)
    fraction = job.doc["config"]["fraction"]
    done = [r for r in _resumed(out, job.doc["config"], restart) if r.seed in options.seeds]
    pending = len(options.seeds) * len(KINDS) - len({(r.trained_on, r.seed) for r in done})
    training = options.training(job.device)
    steps = options.epochs * steps_per_epoch(len(job.train["backselect"]), options.batch_size)
    bar = tqdm(total=pending * steps, desc="retrain", unit="step", dynamic_ncols=True,
               disable=None if show_progress is None else not show_progress)
    job.runs = list(done)

    def write(status: str) -> dict:
        runs = sorted(job.runs, key=lambda r: (options.seeds.index(r.seed), KINDS.index(r.trained_on)))
        complete = status == "complete"
        doc = dict(job.doc, status=status, **_provenance(job.device), runs=[asdict(r) for r in runs],
                   rows=(audited_rows(job.test["backselect"], fraction) + run_rows(runs, fraction)) if complete
                   else [], seconds={"total": time.perf_counter() - t0,
                                     "runs": float(sum(r.seconds for r in runs if math.isfinite(r.seconds)))})
        if out is not None:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            write_json(out, doc)
        return doc

    def train(kind: str, seed: int) -> nn.Module:
        bar.set_postfix_str(f"{kind}, seed {seed}")
        return fit(job.build, job.train[kind], training, seed=seed, on_step=bar.update)

    def test(model: nn.Module, kind: str) -> float:
        return evaluate(model, job.test[kind], options.batch_size, job.device, options.workers)

    def recorded(run: Run) -> None:
        job.runs.append(run)
        write("running")

    try:
        seeded_runs(train, test, options.seeds, done=done, on_run=recorded)
    finally:
        bar.close()
    return write("complete")
