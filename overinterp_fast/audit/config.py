"""What an audit computes, how it is shown, and how a stored audit runs: three options objects.

    config = AuditConfig(method="gradient", threshold=0.9, k=100, ensemble=True)
    record = run_audit(models, images, names, displays, config, RunOptions(title="My audit"))
    run = run_stored_audit(models, source, "out/audit", config, StoreOptions(chunk_size=64, workers=4))

:class:`AuditConfig` fixes the results (a stored audit keeps it in results.json: a rerun with other values is
refused), :class:`RunOptions` only how the audit is labelled and shown, :class:`StoreOptions` how a stored audit
is chunked, loaded and written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

DEFAULT_CHUNK = 64
GALLERY = 24  # images shown with their SIS in the report by default; statistics and plots cover every image


@dataclass(frozen=True)
class AuditConfig:
    """What fixes an audit's results.

    Attributes:
        method: "exact", "gradient" or "responsibility" (:func:`overinterp_fast.fast_sis`'s).
        threshold, threshold_mode: tau and how it applies per image (see
            :func:`overinterp_fast.audit.runner.thresholds_for`), decided per model from its own f(x).
        k, autocast: the gradient method's features per step and autocast dtype.
        collection: find every disjoint SIS.
        mask_value: what a masked pixel holds (a number, or a tensor fast_sis takes as ``mask_value``).
        batch_size: candidates per forward call (None: fast_sis's own choice in memory; a stored audit fixes
            one from the chunk's shape, so that results do not depend on timing).
        ensemble: with two or more models, add their mean-of-logits ensemble as one more model.
        transfer, fraction: with two or more models and a backward-selection method, measure every model's
            accuracy on every model's ``fraction`` pixel subsets (against the labels when all are known, else
            against each evaluated model's full-image prediction).
        noise_sigma, value_range: with object masks, the foreground/background noise sensitivity: Gaussian
            noise of standard deviation ``noise_sigma`` (in the images' units; a number or [C, 1, 1]) on only
            the object or only the background, clipped to ``value_range`` (low, high) when given.
    """

    method: str = "exact"
    threshold: float = 0.9
    threshold_mode: str = "auto"
    k: int = 100
    autocast: str | None = None
    collection: bool = False
    mask_value: float | torch.Tensor = 0.0
    batch_size: int | None = None
    ensemble: bool = False
    transfer: bool = True
    fraction: float = 0.05
    noise_sigma: float | torch.Tensor = 0.25
    value_range: tuple | None = None

    def model_options(self) -> dict:
        """The options a model's SIS ran with, as the record lists them."""
        options = {"threshold": self.threshold, "threshold_mode": self.threshold_mode, "mask_value": self.mask_value}
        if self.method == "gradient":
            options.update(k=self.k, autocast=self.autocast)
        return options


@dataclass(frozen=True)
class RunOptions:
    """How an audit is labelled and shown; nothing here changes a result.

    Attributes:
        class_name: class index -> name, for the report.
        title: the report's heading.
        meta: facts added to the run's metadata (model files, image source, ...).
        progress: progress bars (None: on a terminal only).
    """

    class_name: Callable[[int], str] = str
    title: str = "Overinterpretation audit"
    meta: dict | None = None
    progress: bool | None = None


@dataclass(frozen=True)
class StoreOptions:
    """How a stored audit (:func:`overinterp_fast.audit.stream.run_stored_audit`) runs.

    Attributes:
        chunk_size: images per chunk: the unit of batching, commit and sharding; part of the configuration.
        restart: discard what the folder holds and start over.
        workers: DataLoader worker processes per rank (0: load in this process).
        device: "cpu" or "cuda" (cuda:LOCAL_RANK under torchrun), when the audit sets up its own ranks.
        identity: what identifies the models (e.g. their files) and anything else that fixes results; merged
            into the stored configuration, which a resume must match.
        report, gallery: rank 0 writes ``report.html`` with a gallery of ``gallery`` images.
        load: rank 0 reads the complete audit back into ``StoredAudit.record``.
    """

    chunk_size: int = DEFAULT_CHUNK
    restart: bool = False
    workers: int = 2
    device: str | torch.device = "cpu"
    identity: dict | None = None
    report: bool = True
    gallery: int = GALLERY
    load: bool = True


def check_type(value, cls: type, name: str):
    """``value``, or ``cls()`` for None; a one-line TypeError for anything else."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be of type {cls.__name__} (or None for the defaults), got {type(value).__name__}")
    return value
