"""The audit job: SIS of one or more models (and their ensemble) on a set of images, plus transfer.

    record = run_audit({"lite0": m0, "lite1": m1}, x, names, displays, AuditConfig(method="gradient", ensemble=True))
    save_audit(record, "out/audit"); build_report(record, "out/audit/report.html")

The work on one chunk of images (:func:`audit_chunk`) is shared by the in-memory ``run_audit``
(one chunk: every image) and the durable, sharded audit of :mod:`overinterp_fast.audit.stream`
(fixed chunks, committed one by one); both aggregate with the same functions.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import datetime
import logging
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..api import fast_sis
from ..methods import choice
from ..attr.options import GradientOptions, MinimalPixelSetOptions
from ..runtime.inputs import check_threshold
from ..runtime.memory_format import convertible
from ..runtime.model import Ensemble, ModelFn
from .config import AUTO_EXACT_FEATURES, THRESHOLD_MODES  # noqa: F401  (runner.THRESHOLD_MODES)
from .config import METHODS as AUDIT_METHODS
from .checks import CHECK_ROWS, check_models
from .config import AuditConfig, RunOptions, check_type
from .records import AuditRecord, ModelRecord
from .stats import irfs, noise_sensitivity, rfs
from .own_subsets import class_probabilities, subset_columns, subset_summary
from .subsets import BACKWARD_METHODS, pixel_subsets

logger = logging.getLogger(__name__)
EXACT_FEATURE_LIMIT = 4096  # exact SIS is refused above this many pixels (64 x 64)


@torch.no_grad()
def predict(model, x: torch.Tensor, batch_size: int = 64,
            outputs: str = "logits") -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 class int64 [N], its probability float64 [N]) of ``model`` on ``x`` [N, *D], in batches; outputs
    that contradict ``outputs`` ("logits" or "probabilities") are refused
    (:func:`~overinterp_fast.runtime.model.check_output_kind`)."""
    top = class_probabilities(model, x, batch_size, outputs).max(1)
    return top.indices.cpu(), top.values.double().cpu()


def _plain(v) -> float | list[float]:
    """A number or tensor as JSON: a float when it holds one value (or one repeated), else a flat list."""
    flat = torch.as_tensor(v, dtype=torch.float64).flatten()
    distinct = flat.unique()
    return float(distinct[0]) if distinct.numel() == 1 else flat.tolist()


def thresholds_for(scores: torch.Tensor, threshold: float, mode: str) -> list[float]:
    """Per-image tau from f(x) [N]: "absolute" tau; "relative" tau * f(x); "auto" tau where f(x) >= tau,
    else tau * f(x) (so every image gets a SIS while confident images keep the absolute threshold)."""
    if mode not in THRESHOLD_MODES:
        raise ValueError(f"threshold mode must be one of {THRESHOLD_MODES}, got {mode!r}")
    (threshold,) = check_threshold(threshold, 1)
    f = [float(v) for v in scores]
    if mode == "absolute":
        return [threshold] * len(f)
    if mode == "relative":
        return [threshold * v for v in f]
    return [threshold if v >= threshold else threshold * v for v in f]


ENSEMBLE_NAME = "ensemble (mean logits)"


def with_ensemble(models: Mapping[str, object], ensemble: bool) -> dict[str, object]:
    """The models, plus their mean-of-logits ensemble as one more model when asked and there are two or more."""
    models = dict(models)
    if ensemble and len(models) >= 2:
        models[ENSEMBLE_NAME] = Ensemble(list(models.values()))
    return models


def resolve_method(method: str, shape: Sequence[int], models: Sequence[object] = ()) -> str:
    """The method an audit runs: ``method`` itself, or for "auto" the one that fits images [.., H, W] of H * W
    pixels (:func:`overinterp_fast.methods.choice.resolve_method`, fast_sis's rule): exact SIS up to
    AUTO_EXACT_FEATURES pixels, else batched-gradient SIS when every model has gradients, else minimal pixel sets
    ("responsibility", black box)."""
    if method not in AUDIT_METHODS:
        raise ValueError(f"method must be one of {AUDIT_METHODS}, got {method!r}")
    return choice.resolve_method(method, shape[-1] * shape[-2], models)


def check_method(method: str, shape: Sequence[int]) -> None:
    """Refuse exact SIS over more than EXACT_FEATURE_LIMIT pixels, with the reason (images [.., H, W])."""
    p = shape[-1] * shape[-2]
    if method == "exact" and p > EXACT_FEATURE_LIMIT:
        raise ValueError(
            f"exact SIS over {p} pixels needs about {p * (p + 1) // 2:.2e} forward passes per image; use "
            f"method 'gradient' (torch models) or 'responsibility', or smaller images"
        )


def fixed_engine(model) -> str:
    """The engine a model runs on when results must not depend on timing: ONNX Runtime for ONNX models,
    else the torch model as given (engine="auto" may export a torch model to ONNX when that measures faster)."""
    from ..runtime.onnx import OnnxModel

    return "onnxruntime" if isinstance(model, OnnxModel) else "torch"


@dataclass
class ChunkResult:
    """Every model's work on one chunk of images.

    Attributes:
        results: per model, one SISResult per image of the chunk.
        seconds: per model, wall time of its SIS computation.
        sensitivity: per model (with object masks) {"fg_correct", "bg_correct": bool [n],
            "p_fg", "p_bg": float [n]}, else None.
        transfer: with a transfer table, counts [A][B] of the chunk's images that model B classifies
            as its reference class on model A's pixel subsets; else None.
        subsets: per model (backward-selection methods over the pixels) its own-subset columns
            (:mod:`overinterp_fast.audit.own_subsets`: class and confidence on its 5% backward-selection subsets
            and on random 5%, int64 / float64 [n]), else None.
    """

    results: list[list]
    seconds: list[float]
    sensitivity: list[dict | None]
    transfer: list[list[int]] | None
    subsets: list[dict | None] | None = None


def wants_transfer(transfer: bool, n_models: int, method: str) -> bool:
    return transfer and n_models >= 2 and method in BACKWARD_METHODS


def audit_chunk(models: Mapping[str, object], images: torch.Tensor, labels: Sequence[int | None], known: bool,
                config: AuditConfig, *, engine: str | None, progress: bool | None,
                object_masks: torch.Tensor | None, indices: Sequence[int] | None = None,
                keep: Callable[[int, Callable[[], list]], tuple[list, float]] | None = None,
                models_bar: bool = True) -> ChunkResult:
    """Run every model (the ensemble included, if wanted) on one chunk ``images`` [n, C, H, W].

    ``known``: accuracies are measured against the labels (all known) rather than each model's own
    full-image prediction. ``engine``: :func:`fast_sis`'s, or None for :func:`fixed_engine` per model (never
    chosen by timing). ``object_masks``: bool [n, H, W] or None (no noise sensitivity). ``config`` says
    what each model computes (its ``ensemble`` is the caller's: ``models`` holds the ensemble already).
    ``indices``: the images' positions in the audit (None: 0..n-1), which seed their random pixel subsets.
    ``keep(m, compute)``: model m's (results, seconds), from ``compute()`` or from what an earlier run kept (a
    stored audit's :meth:`~overinterp_fast.audit.work.ChunkWork.model`); None: ``compute()``, timed.
    ``progress`` shows the methods' bars, and with ``models_bar`` one over the models.
    """
    results, seconds, sens, predictions = [], [], [], {}
    bar = tqdm(models.items(), desc="audit", unit="model",
               disable=(None if progress is None else not progress) if models_bar else True)
    for name, model in bar:
        bar.set_postfix_str(name)
        predictions[name], f0 = predict(model, images, outputs=config.outputs)
        taus = thresholds_for(f0, config.threshold, config.threshold_mode)
        t0 = time.perf_counter()

        def compute(model=model, taus=taus) -> list:
            return explain(model, images, taus, config, engine, progress)

        if keep is None:
            results.append(compute())
            seconds.append(time.perf_counter() - t0)
        else:
            got, spent = keep(len(results), compute)
            results.append(got)
            seconds.append(spent)
        if object_masks is None:
            sens.append(None)
            continue
        truth = torch.tensor(labels) if known else predictions[name]
        sens.append(_sensitivity(model, images, object_masks, truth, config))
    counts = None
    if wants_transfer(config.transfer, len(models), config.method):
        reference = {b: torch.tensor(labels) if known else predictions[b] for b in models}
        counts = transfer_counts(models, results, images, reference, config.fraction, config.baselines,
                                 config.outputs)
    own = None
    if config.method in BACKWARD_METHODS:
        where = range(images.shape[0]) if indices is None else indices
        own = [subset_columns(model, images, res, where, config.fraction, config.baselines, config.seed,
                              config.outputs)
               for model, res in zip(models.values(), results)]
    return ChunkResult(results, seconds, sens, counts, own)


def explain(model, images: torch.Tensor, taus: list[float], config: AuditConfig, engine: str | None,
            progress: bool | None) -> list:
    """:func:`fast_sis` of one model on a chunk [n, C, H, W] with the audit's options: one SISResult per image
    (``engine`` None: :func:`fixed_engine`). Minimal pixel sets ("responsibility") restore the top-1 class, a
    criterion without a threshold: they run without one, and their results record the audit's tau as every
    method's do."""
    engine, options, threshold = explain_options(model, images, taus, config, engine)
    results = fast_sis(model, images, threshold, method=config.method, collection=config.collection,
                       baselines=config.baselines, batch_size=config.batch_size, outputs=config.outputs,
                       engine=engine, show_progress=progress, options=options)
    if threshold is None:
        for r, tau in zip(results, taus):
            for c in [r, *(r.collection or [])]:
                c.threshold = tau
    return results


def explain_options(model, images: torch.Tensor, taus: list[float], config: AuditConfig,
                    engine: str | None) -> tuple[str, object, list[float] | None]:
    """(engine, method options, threshold) of :func:`explain` (and of its estimate): ``engine`` None:
    :func:`fixed_engine`; the threshold ``taus``, or None for minimal pixel sets (their top-1 criterion)."""
    options, threshold = None, taus
    engine = fixed_engine(model) if engine is None else engine
    if config.method == "exact":
        options = config.exact_options()
        if options.channels_last and not (engine in ("auto", "torch") and convertible(ModelFn(model), images)):
            # the audit's format, chosen on its first model, applies where it can: not to ONNX models, nor to
            # models without convolutions
            options = replace(options, channels_last=False)
    elif config.method == "gradient":
        options = GradientOptions(k=config.k, autocast=config.autocast)
    elif config.method == "responsibility":
        options, threshold = MinimalPixelSetOptions(seed=config.seed), None
    return engine, options, threshold


def _sensitivity(model, images: torch.Tensor, object_masks: torch.Tensor, truth: torch.Tensor,
                 config: AuditConfig) -> dict:
    """Per image of the chunk {"fg_correct", "bg_correct": bool [n], "p_fg", "p_bg": float [n]} against ``truth``,
    with noise of ``config.noise_sigma`` pixel units (see :class:`~overinterp_fast.audit.config.AuditConfig`)."""
    sigma, low, high = noise_in_image_units(config.noise_sigma, config.value_range, images.device)
    ns = noise_sensitivity(model, images, object_masks, truth.to(images.device), sigma, low, high, seed=config.seed,
                           outputs=config.outputs)
    return {"fg_correct": ns["correct_fg"].numpy(), "bg_correct": ns["correct_bg"].numpy(),
            "p_fg": ns["p_fg"].numpy(), "p_bg": ns["p_bg"].numpy()}


def noise_in_image_units(noise_sigma, value_range, device=None) -> tuple:
    """(sigma, low, high) in the images' units from ``noise_sigma`` in pixel units and ``value_range`` (the images'
    values of the pixel values 0 and 1, or None: the images are in pixel units, not clipped)."""
    if value_range is None:
        return noise_sigma, None, None
    low, high = (torch.as_tensor(v, dtype=torch.float32, device=device) for v in value_range)
    return torch.as_tensor(noise_sigma, dtype=torch.float32, device=device) * (high - low), low, high


def transfer_counts(models: Mapping[str, object], results: Sequence[Sequence], images: torch.Tensor,
                    reference: Mapping[str, torch.Tensor], fraction: float, baselines,
                    outputs: str = "logits") -> list[list[int]]:
    """counts [A][B]: the images that model B classifies as ``reference[B]`` (int64 [N]) on the pixel subsets
    (last ``fraction`` of backward selection) of ``results[A]`` (one SISResult per image of ``images``)."""
    counts = []
    for res in results:
        subsets, _ = pixel_subsets(images, res, fraction, baselines)
        counts.append([int((predict(models[b], subsets, outputs=outputs)[0] == reference[b]).sum())
                       for b in models])
    return counts


def sensitivity_summary(cols: dict, sigma, reference: str) -> dict:
    """The record's noise-sensitivity summary from per-image columns (all images of the audit)."""
    a_fg, a_bg = float(np.mean(cols["fg_correct"])), float(np.mean(cols["bg_correct"]))
    return {"sigma": sigma, "a_fg": a_fg, "a_bg": a_bg, "rfs": rfs(a_fg, a_bg),
            "irfs": irfs(float(np.mean(cols["p_fg"])), float(np.mean(cols["p_bg"]))), "reference": reference}


def transfer_summary(counts, n: int, names: Sequence[str], fraction: float, reference: str) -> dict:
    """The ``AuditRecord.transfer`` dict from counts [A][B] over ``n`` images (rows: A, cols: B)."""
    return {"fraction": fraction, "rows": list(names), "cols": list(names),
            "accuracy": [[c / n for c in row] for row in counts], "reference": reference}


def transfer_table(models: Mapping[str, object], records: Sequence[ModelRecord], images: torch.Tensor,
                   reference: dict[str, torch.Tensor], fraction: float, baselines=None,
                   reference_name: str = "labels", outputs: str = "logits") -> dict:
    """Accuracy of every model B on the pixel subsets (last ``fraction`` of backward selection) of every model A.

    ``reference[B]``: int64 [N] the classes B is scored against (true labels, or B's own full-image
    predictions; ``reference_name`` says which). Returns the ``AuditRecord.transfer`` dict (rows: A, cols: B).
    """
    counts = transfer_counts(models, [rec.results for rec in records], images, reference, fraction, baselines,
                             outputs)
    out = transfer_summary(counts, images.shape[0], list(models), fraction, reference_name)
    out["rows"] = [r.name for r in records]
    return out


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command line as it was typed, from ``argv`` (default ``sys.argv``): the program by its name, not its
    file's path (``overinterp-fast audit ...``; a package's ``__main__.py`` as ``python -m overinterp_fast audit
    ...``), then the arguments, quoted where a shell needs it."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return ""
    program = os.path.basename(argv[0])
    if program == "__main__.py":
        program = f"python -m {os.path.basename(os.path.dirname(os.path.abspath(argv[0])))}"
    return " ".join([program, *map(shlex.quote, argv[1:])])


def run_info(device, images_desc: str, meta: dict | None) -> dict:
    """The run's metadata for the report: date, command line, device, versions (overinterp_fast, torch, Python),
    which implementation each op used on the device (:func:`overinterp_fast.ops.ops_info`), images."""
    from .. import __version__
    from ..ops import ops_info

    info = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": command_line(),
        "device": str(device),
        "overinterp_fast": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "ops": {op.op: f"{op.implementation} ({op.reason})" for op in ops_info([device])},
        "images": images_desc,
    }
    info.update(meta or {})
    return info


def reference_name(known: bool) -> str:
    return "labels" if known else "full-image predictions"


def run_audit(
    models: Mapping[str, object],
    images: torch.Tensor,
    image_names: Sequence[str],
    displays: Sequence[np.ndarray] | np.ndarray,
    config: AuditConfig | None = None,
    run: RunOptions | None = None,
    *,
    labels: Sequence[int | None] | None = None,
    object_masks: torch.Tensor | np.ndarray | None = None,
) -> AuditRecord:
    """SIS of every model on ``images``, in memory, gathered into an :class:`AuditRecord` for the report.

    Args:
        models: name -> model (torch module or callable [B, *D] -> logits [B, K], or an OnnxModel).
        images: [N, C, H, W], normalized for the models; displays: N uint8 [H, W(, 3)] arrays as a
            person sees them; image_names: N names; labels: N true classes (None where unknown).
        config: what the audit computes (:class:`~overinterp_fast.audit.config.AuditConfig`; None: the
            defaults). Its method options go to :func:`fast_sis`; accuracies are measured against the labels
            when all are known, else against each model's own full-image prediction.
        run: title, metadata, class names and progress bars (:class:`~overinterp_fast.audit.config.RunOptions`).
        object_masks: bool [N, H, W], True on each image's object (optional). With them, every model gets
            foreground/background noise sensitivity (RFS, iRFS) with
            ``config.noise_sigma`` and ``config.value_range``, and the report adds the fraction of SIS pixels
            inside the object.

    For audits that do not fit in memory, that must survive a crash or run on several GPUs, see
    :func:`overinterp_fast.audit.stream.run_stored_audit`.
    """
    config = check_type(config, AuditConfig, "config")
    run = check_type(run, RunOptions, "run")
    n = images.shape[0]
    labels = _check_images(images, image_names, displays, labels)
    if not models:
        raise ValueError("no models to audit")
    config = replace(config, method=resolve_method(config.method, images.shape, list(models.values())))
    check_method(config.method, images.shape)
    if object_masks is not None:
        object_masks = torch.as_tensor(np.asarray(object_masks)).bool()
        if tuple(object_masks.shape) != (n, *images.shape[-2:]):
            raise ValueError(f"object masks must be [N, H, W] = {[n, *images.shape[-2:]]}, "
                             f"got {list(object_masks.shape)}")
    check_models(models, images[:CHECK_ROWS], config.outputs, labels=labels, names=image_names)  # before any work
    models = with_ensemble(models, config.ensemble)
    # what accuracies are measured against: the labels when all are known, else each model's own prediction
    known = all(lab is not None for lab in labels)
    chunk = audit_chunk(models, images, labels, known, config, engine="auto", progress=run.show_progress,
                        object_masks=object_masks)
    records = []
    own = chunk.subsets or [None] * len(models)
    for name, results, seconds, sens, cols in zip(models, chunk.results, chunk.seconds, chunk.sensitivity, own):
        record = ModelRecord(name, config.method, results, seconds, config.model_options())
        if sens is not None:
            record.sensitivity = sensitivity_summary(sens, _plain(config.noise_sigma), reference_name(known))
        if cols is not None:
            record.subset_columns = cols
            record.subsets = subset_summary(cols, record.predictions, labels, config.fraction)
        records.append(record)
    table = None if chunk.transfer is None else transfer_summary(chunk.transfer, n, list(models), config.fraction,
                                                                  reference_name(known))
    classes = {int(c) for r in records for c in r.predictions} | {int(c) for c in labels if c is not None}
    info = run_info(images.device, f"{n} x {list(images.shape[1:])} {images.dtype}", run.meta)
    return AuditRecord(run.title, list(image_names), [np.asarray(d) for d in displays], labels,
                       {c: run.class_name(c) for c in sorted(classes)}, records, table, info,
                       None if object_masks is None else [m.numpy() for m in object_masks])


def _check_images(images: torch.Tensor, image_names: Sequence[str], displays, labels) -> list[int | None]:
    """The labels as a list (None: all unknown), after checking that names, displays and labels match ``images``."""
    n = images.shape[0]
    if len(image_names) != n or len(displays) != n:
        raise ValueError(f"{n} images, {len(image_names)} names and {len(displays)} displays")
    labels = [None] * n if labels is None else list(labels)
    if len(labels) != n:
        raise ValueError(f"{n} images and {len(labels)} labels")
    return labels
