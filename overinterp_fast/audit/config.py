"""What an audit computes, how it is shown, and how a stored audit runs: three options objects (and a fourth, how
new models are trained on an audit's pixel subsets: :class:`RetrainOptions`).

    config = AuditConfig(method="gradient", threshold=0.9, k=100, ensemble=True)   # method="auto": by image size
    record = run_audit(models, images, names, displays, config, RunOptions(title="My audit"))
    run = run_stored_audit(models, source, "out/audit", config, StoreOptions(chunk_size=64, workers=4))

:class:`AuditConfig` fixes the results (a stored audit keeps it in results.json: a rerun with other values is
refused), :class:`RunOptions` only how the audit is labelled and shown, :class:`StoreOptions` how a stored audit
is chunked, loaded and written. Their defaults are the command line's (``overinterp-fast audit`` reads them from
here), and the method options' defaults are :mod:`overinterp_fast.attr.options`' (docs: conventions.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..attr.options import ExactOptions, GradientOptions, MinimalPixelSetOptions
from ..methods.choice import AUTO_EXACT_FEATURES  # noqa: F401  (method="auto": exact SIS up to this many pixels)
from ..methods.exact_state import DEFAULT_EVERY_S as CHECKPOINT_EVERY_S  # exact SIS's state at least this often
from ..methods.exact_state import check_interval
from ..attr.options import RunOptions as _MethodRun
from ..runtime.model import OUTPUT_KINDS
from ..runtime.renames import renamed_attribute, renamed_keywords

# Defaults and choices the command line shows in its help, here where they import without the audit extra.
THRESHOLD_MODES = ("absolute", "relative", "auto")
FRACTION, EPOCHS = 0.05, 15  # the digits pipeline's defaults (the paper's 5% subsets)

_R, _G, _M = _MethodRun, GradientOptions, MinimalPixelSetOptions  # the method defaults' single source
METHODS = ("auto", "exact", "gradient", "responsibility")
DEFAULT_CHUNK = 64
SCORE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}  # AuditConfig.score_dtype: names, as JSON
GALLERY = 24  # images shown with their SIS in the report by default; statistics and plots cover every image
TARGETS = ("labels", "predictions")  # a model trained on pixel subsets learns the true classes or the audited model's


@dataclass(frozen=True)
class AuditConfig:
    """What fixes an audit's results.

    Attributes:
        method: "exact", "gradient" or "responsibility" (:func:`overinterp_fast.fast_sis`'s), or "auto" (default):
            exact SIS up to :data:`~overinterp_fast.audit.config.AUTO_EXACT_FEATURES` pixels (32 x 32), else
            batched-gradient SIS, or minimal pixel sets ("responsibility") when a model has no gradients (ONNX);
            see :func:`~overinterp_fast.audit.runner.resolve_method`. The record and a stored audit's
            configuration hold the method it resolved to.
        threshold, threshold_mode: tau and how it applies per image (see
            :func:`overinterp_fast.audit.runner.thresholds_for`), decided per model from its own f(x).
        k, autocast: the gradient method's features per step and autocast dtype (autocast None: the ranking in
            the images' dtype, so that results do not depend on the machine's bf16 support; the functions'
            default is "auto").
        collection: find every disjoint SIS.
        baselines: what a masked pixel holds: None (0), a number, or a tensor fast_sis takes as ``baselines``.
        batch_size: candidates per forward call (None: fast_sis's own choice in memory; a stored audit fixes
            one from the chunk's shape, so that results do not depend on timing).
        ensemble: with two or more models, add their mean-of-logits ensemble as one more model.
        transfer, fraction: with two or more models and a backward-selection method, measure every model's
            accuracy on every model's ``fraction`` pixel subsets (against the labels when all are known, else
            against each evaluated model's full-image prediction).
        noise_sigma, value_range: with object masks, the foreground/background noise sensitivity: Gaussian
            noise on only the object or only the background. ``noise_sigma`` is its standard deviation in pixel
            units (a fraction of the pixel range [0, 1]; default 0.1). ``value_range`` (low, high): what the
            pixel values 0 and 1 are in the images' units (numbers or per channel [C, 1, 1]; for images
            normalized as (x - mean) / std, low = -mean / std and high = (1 - mean) / std): the noise is
            ``noise_sigma * (high - low)`` in the images' units, clipped to [low, high]. None: the images are
            in pixel units (the noise is ``noise_sigma``), not clipped.
        seed: the seed of what an audit draws at random: the responsibility method's descents
            (:class:`~overinterp_fast.attr.options.MinimalPixelSetOptions`' ``seed``), the noise of the noise
            sensitivity and the random baseline of the pixel-subset datasets.
        score_dtype: exact SIS: None, "bfloat16" or "float16": candidates scored in that dtype first, the results
            the images' dtype's (:class:`~overinterp_fast.attr.options.ExactOptions`' ``score_dtype``).
        channels_last: exact SIS: the candidates through a channels_last copy of the model (True), not (False), or
            None: :func:`overinterp_fast.fast_sis`'s choice in memory (measured on a GPU); a stored audit fixes it
            when it starts (measured on a GPU with the batch size, see
            :func:`overinterp_fast.audit.stream.run_stored_audit`).
        outputs: what the models return: "logits" (default; f is their softmax) or "probabilities" (a model that
            ends in a softmax). Checked on each model's first forward pass before any work: a model whose outputs
            contradict it is refused with one line (:func:`overinterp_fast.runtime.model.check_output_kind`).

    ``mask_value`` (the name of ``baselines`` before) still works, with a FutureWarning.
    """

    method: str = "auto"
    threshold: float = _R.threshold
    threshold_mode: str = "auto"
    k: int = _G.k
    autocast: str | None = None
    collection: bool = _R.collection
    baselines: float | torch.Tensor | None = None
    batch_size: int | None = _R.batch_size
    ensemble: bool = False
    transfer: bool = True
    fraction: float = 0.05
    noise_sigma: float | torch.Tensor = 0.1
    value_range: tuple | None = None
    seed: int = _M.seed
    score_dtype: str | None = None
    channels_last: bool | None = None
    outputs: str = _R.outputs

    mask_value = renamed_attribute("mask_value", "baselines", "AuditConfig")

    def __post_init__(self):
        if self.outputs not in OUTPUT_KINDS:
            raise ValueError(f"outputs must be one of {OUTPUT_KINDS}, got {self.outputs!r}")
        if self.score_dtype is not None and self.score_dtype not in SCORE_DTYPES:
            raise ValueError(f"score_dtype must be None or one of {tuple(SCORE_DTYPES)}, got {self.score_dtype!r}")

    def exact_options(self) -> ExactOptions:
        """exact SIS's options for this audit: its score_dtype and channels_last (incremental: fast_sis's choice)."""
        return ExactOptions(score_dtype=None if self.score_dtype is None else SCORE_DTYPES[self.score_dtype],
                            channels_last=self.channels_last)

    def model_options(self) -> dict:
        """The options a model's SIS ran with, as the record lists them."""
        options = {"threshold": self.threshold, "threshold_mode": self.threshold_mode,
                   "baselines": 0.0 if self.baselines is None else self.baselines}
        if self.method == "exact" and self.score_dtype is not None:
            options.update(score_dtype=self.score_dtype)
        if self.method == "gradient":
            options.update(k=self.k, autocast=self.autocast)
        if self.method == "responsibility":
            options.update(seed=self.seed)
        if self.outputs != _R.outputs:
            options.update(outputs=self.outputs)
        return options


@dataclass(frozen=True)
class RunOptions:
    """How an audit is labelled and shown; nothing here changes a result.

    Attributes:
        class_name: class index -> name, for the report.
        title: the report's heading.
        meta: facts added to the run's metadata (model files, image source, ...).
        show_progress: progress bars (None: on a terminal only).

    ``progress`` (the name of ``show_progress`` before) still works, with a FutureWarning.
    """

    class_name: Callable[[int], str] = str
    title: str = "Overinterpretation audit"
    meta: dict | None = None
    show_progress: bool | None = None

    progress = renamed_attribute("progress", "show_progress", "RunOptions")


@dataclass(frozen=True)
class StoreOptions:
    """How a stored audit (:func:`overinterp_fast.audit.stream.run_stored_audit`) runs.

    Attributes:
        chunk_size: images per chunk: the unit of batching, commit and sharding; part of the configuration.
        restart: discard what the folder holds and start over.
        workers: DataLoader worker processes per rank (0: load in this process).
        device: "auto" (default: "cuda" when a GPU is available, else "cpu"), "cpu" or "cuda" (cuda:LOCAL_RANK
            under torchrun), when the audit sets up its own ranks.
        identity: what identifies the models (e.g. their files) and anything else that fixes results; merged
            into the stored configuration, which a resume must match.
        report, gallery: rank 0 writes ``report.html`` with a gallery of ``gallery`` images.
        load: rank 0 reads the complete audit back into ``StoredAudit.record``.
        command: the command line's options (name -> JSON value) that started the audit, stored in
            results.json beside the configuration (not compared on a rerun): ``overinterp-fast audit --resume
            OUT`` reads them back.
        pixel_subsets: with a backward-selection method (exact, gradient), rank 0 also writes the pixel-subset datasets
            when the audit completes: ``subsets/<model>/<split>.npz`` (:mod:`overinterp_fast.audit.subset_files`).
        checkpoint_every: exact SIS saves each chunk's state at least this often (seconds), besides as soon as an
            image finishes (:mod:`overinterp_fast.audit.work`): an interruption loses at most this much work.
    """

    chunk_size: int = DEFAULT_CHUNK
    restart: bool = False
    workers: int = 2
    device: str | torch.device = "auto"
    identity: dict | None = None
    report: bool = True
    gallery: int = GALLERY
    load: bool = True
    command: dict | None = None
    pixel_subsets: bool = False
    checkpoint_every: float = CHECKPOINT_EVERY_S

    def __post_init__(self):
        check_interval(self.checkpoint_every, "checkpoint_every")


AuditConfig.__init__ = renamed_keywords(mask_value="baselines")(AuditConfig.__init__)
RunOptions.__init__ = renamed_keywords(progress="show_progress")(RunOptions.__init__)


def check_type(value, cls: type, name: str):
    """``value``, or ``cls()`` for None; a one-line TypeError for anything else."""
    if value is None:
        return cls()
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be of type {cls.__name__} (or None for the defaults), got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class RetrainOptions:
    """How :func:`~overinterp_fast.audit.retraining.retrain` trains new models on pixel subsets (the ``retrain``
    command's defaults).

    Attributes:
        arch: the architecture (:func:`~overinterp_fast.zoo.architectures.architecture`): "resnet20", "small-cnn",
            "digits-cnn", "timm:NAME" or "torchvision:NAME"; trained from scratch.
        seeds: one run per seed and subset kind (the paper's five by default).
        epochs, batch_size, lr, weight_decay: Adam's training (:class:`~overinterp_fast.zoo.training.TrainOptions`).
        device: "auto" (a CUDA GPU when there is one), "cpu", "cuda" or "cuda:N".
        workers: DataLoader processes that build the batches (the same batches whatever the number).
        classes: the number of classes (None: the largest label of the two files, plus one).
        target: "labels" (the true classes, as the paper) or "predictions" (the audited model's).
    """

    arch: str = "resnet20"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.0
    device: str = "auto"
    workers: int = 0
    classes: int | None = None
    target: str = "labels"

    def __post_init__(self):
        seeds = tuple(self.seeds)
        if not seeds:
            raise ValueError("seeds: give at least one")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
            raise ValueError(f"seeds must be integers >= 0, got {list(seeds)}")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must differ, got {list(seeds)}")
        object.__setattr__(self, "seeds", seeds)
        if self.classes is not None and (isinstance(self.classes, bool) or not isinstance(self.classes, int)
                                         or self.classes < 2):
            raise ValueError(f"classes must be an integer of 2 or more, got {self.classes!r}")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        self.training()  # epochs, batch size, lr, weight decay and workers checked there

    def training(self, device: str | torch.device = "cpu"):
        """The :class:`~overinterp_fast.zoo.training.TrainOptions` of one run on ``device``."""
        from ..zoo.training import TrainOptions

        return TrainOptions(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                            weight_decay=self.weight_decay, device=device, workers=self.workers)
