"""What a stored audit will do and how long it will take, said before its first chunk; ``audit --dry-run`` says it
and stops, writing nothing.

    plan = plan_audit({"net": model}, src, "out/cifar", AuditConfig(method="exact", batch_size=42), 64, set(),
                      torch.device("cpu"))
    print(plan.text())       # images, chunks, method, device, batch shape, and the estimate of the whole audit

The estimate covers every image the audit has left (its committed chunks are skipped), every model, on this
device, with the chunks dealt over the ranks (the rank with the most chunks sets the time), and the final merge and
report. It is measured, not guessed:

- exact SIS: each model runs the first chunk left for :data:`TRIAL_S` seconds (or to its end), as the audit runs
  it, and longer, up to :data:`TRIAL_SHARE` of the audit it predicts (at most :data:`TRIAL_MAX_S`); the time of a
  chunk is its set-up and first window as they took, then the rest of its candidates (p (p + 1) / 2 per image) at
  the rate of the windows after. In a real run that work is the chunk's own, saved as its
  state (:mod:`overinterp_fast.audit.work`) and continued, so the estimate costs nothing; a dry run saves nothing.
  A collection's later rounds add candidates the estimate leaves out.
- the other methods: their own estimate (:func:`overinterp_fast.estimate_sis`: their rows at the time of one timed
  call), plus the time it took to make (their set-up on a chunk).
- every chunk: each model's predictions (timed on the first chunk left) and the commit (:data:`CHUNK_FIXED_S`).
- the end: sis.parquet (:data:`FINAL_PER_IMAGE_S` per image) and the report, its figures at the time of one
  figure drawn here (:func:`report_seconds`).
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import time
from dataclasses import dataclass, field, replace
from typing import Mapping

import numpy as np
import torch

from ..api import estimate_sis
from ..methods import exact_state
from ..methods.choice import has_gradients
from ..runtime import estimate as estimates
from . import store
from .config import GALLERY, AuditConfig
from .runner import explain, explain_options, predict, thresholds_for
from .sources import ImageSource
from .work import ChunkWork, finished_results

# What the estimate does not time, measured on 2 CPU cores: a chunk's commit (two Parquet parts, flushed) and work
# folder, and the final merge (sis.parquet) per image.
CHUNK_FIXED_S = 0.1
FINAL_PER_IMAGE_S = 0.002
# exact SIS: the first chunk left runs at least TRIAL_S seconds (or to its end) for the estimate, and on up to
# TRIAL_SHARE of the audit it predicts, at most TRIAL_MAX_S: a rate that changes as the run warms up (incremental
# inference meets new shapes for minutes) is measured longer where the audit is long enough to afford it
TRIAL_S, TRIAL_SHARE, TRIAL_MAX_S = 2.0, 0.05, 30.0
TRIAL_WINDOW_S = 0.25  # ... in windows of about this long, each one measurement
# The report's figures besides the gallery's (one per gallery image and model): the SIS-size box and curve and the
# border figure, and a heatmap per model, each counted as this many gallery figures (they are larger).
REPORT_FIGURES, REPORT_FIGURE_WEIGHT = 3, 2


@dataclass
class ModelPlan:
    """One model's part of the estimate.

    Attributes:
        name: the model. chunk: its method's estimate of a full chunk (seconds: the set-up included); None where
            nothing is left. predict_s: its predictions on a chunk. left_s: what is left of the first chunk (0 where
            a real run's trial finished it). seconds: every chunk left of the rank with the most.
    """

    name: str
    chunk: estimates.Estimate | None
    predict_s: float
    left_s: float
    seconds: float


@dataclass
class AuditPlan:
    """A stored audit, planned: what it computes and how long it will take (see the module docstring).

    Attributes:
        folder: the audit folder. images: the audit's images; shape: one image's [C, H, W]; features: p.
        chunk_size, chunks: the chunks; committed: those committed already; left_images: the images left.
        world: the ranks. method, threshold, threshold_mode, collection: what every model computes.
        batch_size, channels_last: the calls' batch size and format (fixed when the audit starts).
        device: where it runs, in words. models: each model's part. final_s: the final merge and report.
        seconds: the estimate of the whole audit left (wall time, from now).
    """

    folder: str
    images: int
    shape: list[int]
    features: int
    chunk_size: int
    chunks: int
    committed: int
    left_images: int
    world: int
    method: str
    threshold: float
    threshold_mode: str
    collection: bool
    batch_size: int | None
    channels_last: bool
    device: str
    models: list[ModelPlan] = field(default_factory=list)
    final_s: float = 0.0
    seconds: float = 0.0

    @property
    def left_chunks(self) -> int:
        return self.chunks - self.committed

    def line(self) -> str:
        """The estimate in one line, as said before the first chunk."""
        if not self.left_images:
            return (f"audit of {self.images:,} images: every chunk is committed; the final merge and report "
                    f"{estimates.about(self.seconds)}")
        done = f" ({self.images - self.left_images:,} committed before)" if self.committed else ""
        ranks = f", {self.world} ranks" if self.world > 1 else ""
        per_image = [m.chunk.seconds / min(self.chunk_size, self.left_images) for m in self.models if m.chunk]
        return (f"audit of {self.left_images:,} image{'s' if self.left_images > 1 else ''}{done} x "
                f"{len(self.models)} model{'s' if len(self.models) > 1 else ''} ({self.method} SIS, "
                f"{self.left_chunks:,} chunk{'s' if self.left_chunks > 1 else ''}{ranks}): "
                f"{estimates.about(self.seconds)} on {self.device}, "
                f"{estimates.duration(sum(per_image))} per image")

    def text(self) -> str:
        """The plan, line by line: what ``audit --dry-run`` prints."""
        tau = f"{self.threshold:g} ({self.threshold_mode})"
        lines = [
            f"folder: {self.folder}",
            f"images: {self.images:,} x {self.shape} ({self.features:,} features); {self.left_images:,} left",
            f"chunks: {self.chunks:,} of {self.chunk_size} images; {self.committed:,} committed, "
            f"{self.left_chunks:,} to compute" + (f" over {self.world} ranks" if self.world > 1 else ""),
            f"method: {self.method}, threshold {tau}" + (", with collections" if self.collection else ""),
            f"device: {self.device}; batch: {self.batch_size or 'chosen per chunk'} candidates per call"
            + (", channels_last" if self.channels_last else ""),
        ]
        for m in self.models:
            what = ("nothing left" if m.chunk is None else
                    f"a chunk: {m.chunk.line()}; every chunk left: {estimates.about(m.seconds)}")
            lines.append(f"model {m.name}: {what}")
        lines.append(f"merge and report: {estimates.about(self.final_s)}")
        lines.append(f"estimate: {self.line()}")
        return "\n".join(lines)


def plan_audit(models: Mapping[str, object], source: ImageSource, out: str, config: AuditConfig,
               chunk_size: int, committed: set[int], device: torch.device, world: int = 1, report: bool = True,
               gallery: int = GALLERY, first: ChunkWork | None = None) -> AuditPlan:
    """The plan of a stored audit of ``models`` (the ensemble included, on ``device``, with the configuration it
    runs with: method resolved, batch size fixed) on ``source`` into ``out``, whose ``committed`` chunks are
    skipped, over ``world`` ranks, with its report (``gallery`` images) where ``report``. ``first``: the work
    folder of the first chunk left, where the trial's work is kept (None: a dry run keeps nothing). See the module
    docstring."""
    ranges = store.chunk_ranges(len(source), chunk_size)
    left = [c for c in range(len(ranges)) if c not in committed]
    left_images = sum(ranges[c][1] - ranges[c][0] for c in left)
    shape = list(source[0]["x"].shape)
    plan = AuditPlan(out, len(source), shape, shape[-1] * shape[-2], chunk_size, len(ranges),
                     len(ranges) - len(left), left_images, world, config.method, config.threshold,
                     config.threshold_mode, config.collection, config.batch_size, bool(config.channels_last),
                     estimates.device_name(device))
    plan.final_s = FINAL_PER_IMAGE_S * len(source) + (
        report_seconds(source[0]["display"].shape, len(source), len(models), gallery) if report else 0.0)
    if not left:
        plan.models = [ModelPlan(n, None, 0.0, 0.0, 0.0) for n in models]
        plan.seconds = plan.final_s
        return plan
    a, b = ranges[left[0]]
    x = torch.stack([source[i]["x"] for i in range(a, b)]).to(device)
    # the chunks of rank 0, which has the most (round robin): the first chunk left, then every world-th one
    later = [ranges[c][1] - ranges[c][0] for c in left[world::world]]
    for m, (name, model) in enumerate(models.items()):
        t0 = time.perf_counter()
        _, f0 = predict(model, x, outputs=config.outputs)
        predict_s = time.perf_counter() - t0
        taus = thresholds_for(f0, config.threshold, config.threshold_mode)
        est, left_s = chunk_estimate(model, x, taus, config, None if first is None else (first, m),
                                     (b - a + sum(later)) / (b - a))
        one = est.seconds + predict_s
        seconds = predict_s + left_s + sum(one * n / (b - a) for n in later)  # rows grow with the images
        plan.models.append(ModelPlan(name, est, predict_s, left_s, seconds))
    plan.seconds = sum(m.seconds for m in plan.models) + CHUNK_FIXED_S * (1 + len(later)) + plan.final_s
    return plan


def chunk_estimate(model, images: torch.Tensor, taus: list[float], config: AuditConfig,
                   kept: tuple[ChunkWork, int] | None = None, scale: float = 1.0) -> tuple[estimates.Estimate, float]:
    """(the estimate of one model's SIS of a chunk ``images`` [n, C, H, W] as the audit runs it, set-up included;
    the seconds left of this chunk's own SIS). Exact SIS: the chunk's own first seconds, timed (:func:`trial`;
    ``scale``: the audit's work in such chunks), its work kept in ``kept`` (the chunk's work folder and the model's
    position) where given; the other methods: their own estimate (:func:`overinterp_fast.estimate_sis`) and the
    time it took to make."""
    if config.method == "exact":
        n, p = images.shape[0], images.shape[-1] * images.shape[-2]
        rows = estimates.exact_rows(n, p)
        full, left = trial(model, images, taus, config, rows, kept, scale=scale)
        return estimates.exact_estimate(n, p, full, images.device, full / rows, has_gradients(model)), left
    engine, options, threshold = explain_options(model, images, taus, config, None)
    t0 = time.perf_counter()
    est = estimate_sis(model, images, threshold, method=config.method, collection=config.collection,
                       baselines=config.baselines, batch_size=config.batch_size, outputs=config.outputs,
                       engine=engine, options=options)
    est = replace(est, seconds=est.seconds + time.perf_counter() - t0)
    return est, est.seconds


@dataclass
class _Clock:
    """A trial's clock (:class:`~overinterp_fast.methods.exact_state.Checkpoints`' ``clock``, called once when the
    loop starts and once after each window): the time and the candidates scored then. ``over()`` once three marks
    span ``limit`` seconds and :data:`TRIAL_SHARE` of the audit they predict (``scale`` chunks of ``rows``
    candidates, the call having started at ``t0``), or :data:`TRIAL_MAX_S`."""

    limit: float
    rows: int
    scale: float
    t0: float = 0.0
    checkpoints: exact_state.Checkpoints | None = None
    marks: list[tuple[float, int]] = field(default_factory=list)

    def __call__(self) -> float:
        now = time.perf_counter()
        self.marks.append((now, self.checkpoints.scored))
        return now

    def over(self) -> bool:
        if len(self.marks) < 3:
            return False
        spent = self.marks[-1][0] - self.marks[0][0]
        return spent >= self.limit and (spent >= TRIAL_MAX_S or spent >= TRIAL_SHARE * self.full() * self.scale)

    def _rate(self) -> float:
        """Candidates per second, past the first window."""
        (t1, s1), (tn, sn) = self.marks[1], self.marks[-1]
        return max((sn - s1) / max(tn - t1, 1e-9), 1e-9)

    def full(self) -> float:
        """A chunk's seconds: the set-up and first window as they took, the rest at the rate of the windows after
        (the marks: the loop's start, with the candidates a continued state had scored before; the first window's
        end; the last window's end)."""
        (start, before), (t1, s1) = self.marks[0], self.marks[1]
        return (start - self.t0) + (t1 - start) + (self.rows - (s1 - before)) / self._rate()

    def left(self) -> float:
        """What is left of this chunk after the trial: the set-up again, and its candidates not scored yet."""
        return (self.marks[0][0] - self.t0) + (self.rows - self.marks[-1][1]) / self._rate()


def trial(model, images: torch.Tensor, taus: list[float], config: AuditConfig, rows: int,
          kept: tuple[ChunkWork, int] | None = None, limit: float | None = None,
          scale: float = 1.0) -> tuple[float, float]:
    """(seconds of one model's exact SIS of a chunk ``images`` of ``rows`` candidates, the seconds left of this
    chunk's), from its own first seconds: the run as the audit makes it (:func:`explain`), stopped at the first
    window past ``limit`` (None: :data:`TRIAL_S`) and :data:`TRIAL_SHARE` of the audit predicted (``scale``: the
    audit's work in chunks like this one), at most :data:`TRIAL_MAX_S`, its state saved in ``kept`` (the chunk's
    work folder, model position) or nowhere. A chunk takes its set-up and first window as they took, then its
    other candidates at the rate of the windows after; a run that ends within the trial takes its time. A model
    whose results on the chunk are kept already takes the seconds they took, and nothing is left."""
    if kept is not None:
        done, meta = finished_results(kept[0].folder, kept[0].chunk, kept[1])
        if done and all(i in done for i in kept[0].indices):
            return float(meta.get("seconds", 0.0)), 0.0
    clock = _Clock(TRIAL_S if limit is None else limit, rows, scale)
    c = (exact_state.Checkpoints("", every=1e18, write=lambda path, fill: None) if kept is None
         else kept[0].checkpoints(kept[1]))
    # windows of TRIAL_WINDOW_S at most (one batch each where the checkpoints ask for that: --checkpoint-every 0)
    c.clock, c.stop, c.window_s, clock.checkpoints = clock, clock.over, min(c.window_s, TRIAL_WINDOW_S), c
    clock.t0 = t0 = time.perf_counter()
    try:
        with exact_state.saving(c), estimates.said_before():  # the trial's own estimate is not said
            explain(model, images, taus, config, None, False)
        full = time.perf_counter() - t0 + c.earlier  # the whole chunk ran (and what ran of it before)
        return full, 0.0 if kept is not None else full
    except exact_state.Stopped:
        pass
    full = clock.full()
    return full, clock.left() if kept is not None else full  # a real run continues what the trial did


def report_seconds(display_shape: tuple, images: int, models: int, gallery: int) -> float:
    """Seconds of the report of ``images`` images (displays of ``display_shape``) and ``models`` models: its figures
    (the gallery's, one per shown image and model, and :data:`REPORT_FIGURES` plus one per model, weighed
    :data:`REPORT_FIGURE_WEIGHT`) at the time of one gallery figure, drawn twice here: the second is timed (the
    first pays the plotting library's start, here rather than in the report)."""
    from .report import image_figure

    display = np.zeros(display_shape, np.uint8)
    mask = np.zeros(display_shape[:2], bool)
    image_figure(display, mask, True)
    t0 = time.perf_counter()
    image_figure(display, mask, True)
    figure_s = time.perf_counter() - t0
    return (min(images, gallery) * models + REPORT_FIGURE_WEIGHT * (REPORT_FIGURES + models)) * figure_s


__all__ = ["AuditPlan", "ModelPlan", "chunk_estimate", "plan_audit", "report_seconds", "trial"]
