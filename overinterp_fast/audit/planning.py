"""What a stored audit will do and how long it will take, said before its first chunk; ``audit --dry-run`` says it
and stops, computing nothing.

    plan = plan_audit({"net": model}, src, "out/cifar", AuditConfig(method="exact"), StoreOptions(chunk_size=64))
    print(plan.text())       # images, chunks, method, device, batch shape, and the estimate of the whole audit

The estimate covers every image the audit has left (its committed chunks are skipped), every model, on this
device, with the chunks dealt over the ranks. It is made of the methods' own estimates
(:meth:`~overinterp_fast.attr.ExactSIS.estimate` and the other classes': the rows a chunk computes, and the time of a
call at the audit's batch size, timed once on the first chunk left), plus what a chunk does besides: every model's
predictions (timed on that chunk) and its commit, and the final merge and report. Rows are exact (exact SIS: p (p + 1)
/ 2 candidates per image and round; a collection's later rounds add theirs, which the estimate leaves out).
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import time
from dataclasses import dataclass, field
from typing import Mapping

import torch

from ..api import estimate_sis
from ..runtime import estimate as estimates
from . import store
from .config import AuditConfig
from .runner import explain_options, predict, thresholds_for
from .sources import ImageSource

# What a chunk costs besides its SIS, and the end of the audit, measured on 2 CPU cores (docs: audit.md, the
# estimate): a chunk's commit (two Parquet parts, flushed) and work folder, per chunk; the final merge (sis.parquet)
# and report (its plots), once, plus their time per image.
CHUNK_FIXED_S = 0.15
FINAL_FIXED_S = 3.0
FINAL_PER_IMAGE_S = 0.002


@dataclass
class ModelPlan:
    """One model's part of the estimate: its method's estimate of the first chunk left (None: nothing left), the
    seconds of its predictions on that chunk, and its seconds over every chunk left (on one rank)."""

    name: str
    chunk: estimates.Estimate | None
    predict_s: float
    seconds: float


@dataclass
class AuditPlan:
    """A stored audit, planned: what it computes and how long it will take (see the module docstring).

    Attributes:
        folder: the audit folder. images: the audit's images; shape: one image's [C, H, W]; features: p.
        chunk_size, chunks: the chunks; committed: those committed already. world: the ranks.
        method, threshold, threshold_mode, collection: what every model computes. batch_size, channels_last: the
        calls' batch size and format (fixed when the audit starts). device: where it runs, in words.
        models: each model's part. seconds: the estimate of the whole audit left (wall time).
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
    seconds: float = 0.0

    @property
    def left_chunks(self) -> int:
        return self.chunks - self.committed

    def line(self) -> str:
        """The estimate in one line, as said before the first chunk."""
        if not self.left_images:
            return f"audit of {self.images:,} images: every chunk is committed; what is left is the final merge"
        done = f" ({self.images - self.left_images:,} committed)" if self.committed else ""
        ranks = f" on each of {self.world} ranks" if self.world > 1 else ""
        rows = sum(m.chunk.rows for m in self.models if m.chunk is not None)
        unit = next((m.chunk.unit for m in self.models if m.chunk is not None), "rows")
        per_image = rows / max(1, self._first_chunk_images())
        return (f"audit of {self.left_images:,} image{'s' if self.left_images > 1 else ''}{done} x "
                f"{len(self.models)} model{'s' if len(self.models) > 1 else ''}, {self.method} SIS: "
                f"{per_image:,.0f} {unit} per image, {estimates.about(self.seconds)} on {self.device}{ranks} "
                f"({self._per_image()} per image)")

    def _first_chunk_images(self) -> int:
        return min(self.chunk_size, self.left_images)

    def _per_image(self) -> str:
        spent = sum(m.seconds for m in self.models) / max(1, self.left_images)
        return estimates.duration(spent)

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
            what = "nothing left" if m.chunk is None else f"{m.chunk.line()}; every chunk left: " \
                                                          f"{estimates.about(m.seconds)}"
            lines.append(f"model {m.name}: {what}")
        lines.append(f"estimate: {self.line()}")
        return "\n".join(lines)


def chunk_seconds(seconds: float, images: int, chunk_images: int) -> float:
    """``seconds`` of a chunk of ``chunk_images`` images scaled to ``images`` images (rows grow with images)."""
    return seconds * images / max(1, chunk_images)


def plan_audit(models: Mapping[str, object], source: ImageSource, out: str, config: AuditConfig,
               chunk_size: int, committed: set[int], device: torch.device, world: int = 1) -> AuditPlan:
    """The plan of a stored audit of ``models`` (the ensemble included, on ``device``, with the configuration it
    runs with: method resolved, batch size fixed) on ``source`` into ``out``, whose ``committed`` chunks are
    skipped, over ``world`` ranks; its estimate times the first chunk left (see the module docstring)."""
    ranges = store.chunk_ranges(len(source), chunk_size)
    left = [c for c in range(len(ranges)) if c not in committed]
    left_images = sum(ranges[c][1] - ranges[c][0] for c in left)
    first = source[0]["x"]
    shape = list(first.shape)
    plan = AuditPlan(out, len(source), shape, shape[-1] * shape[-2], chunk_size, len(ranges),
                     len(ranges) - len(left), left_images, world, config.method, config.threshold,
                     config.threshold_mode, config.collection, config.batch_size, bool(config.channels_last),
                     estimates.device_name(device))
    if not left:
        plan.models = [ModelPlan(n, None, 0.0, 0.0) for n in models]
        plan.seconds = FINAL_FIXED_S + FINAL_PER_IMAGE_S * len(source)
        return plan
    a, b = ranges[left[0]]
    x = torch.stack([source[i]["x"] for i in range(a, b)]).to(device)
    # the chunks one rank computes, at most: round robin over the ranks
    per_rank = [ranges[c][1] - ranges[c][0] for c in left[::world]]
    for name, model in models.items():
        t0 = time.perf_counter()
        _, f0 = predict(model, x)
        predict_s = time.perf_counter() - t0
        taus = thresholds_for(f0, config.threshold, config.threshold_mode)
        est = chunk_estimate(model, x, taus, config)
        one = est.seconds + predict_s
        plan.models.append(ModelPlan(name, est, predict_s, sum(chunk_seconds(one, n, b - a) for n in per_rank)))
    plan.seconds = (sum(m.seconds for m in plan.models) + CHUNK_FIXED_S * len(per_rank) + FINAL_FIXED_S
                    + FINAL_PER_IMAGE_S * len(source))
    return plan


def chunk_estimate(model, images: torch.Tensor, taus: list[float], config: AuditConfig) -> estimates.Estimate:
    """The method's estimate of one chunk ``images`` [n, C, H, W] as the audit runs it (:func:`explain_options`:
    its engine and options), without running it (:func:`overinterp_fast.estimate_sis`)."""
    engine, options = explain_options(model, images, config, None)
    return estimate_sis(model, images, taus, method=config.method, collection=config.collection,
                        baselines=config.baselines, batch_size=config.batch_size, engine=engine, options=options)


__all__ = ["AuditPlan", "ModelPlan", "chunk_estimate", "plan_audit"]
