"""The audit toolkit: pixel-subset datasets and the statistics of papers 000, 002 and 004.

    from overinterp_fast import audit
    subset_images, masks = audit.pixel_subsets(images, results, fraction=0.05)
    audit.heatmap([r.mask for r in results]); audit.dice(a, b); audit.rfs(a_fg, a_bg)
    record = audit.run_audit({"a": model_a, "b": model_b}, images, names, displays,
                             audit.AuditConfig(method="gradient"))
    audit.save_audit(record, "out/audit"); audit.build_report(record, "out/audit/report.html")

It needs the ``audit`` extra (``pip install 'overinterp-fast[audit]'``: torchvision, pillow, matplotlib, pyarrow,
scipy); without it, importing any of its modules raises one line saying so
(:class:`~overinterp_fast.errors.MissingDependency`).
"""
from ..util.optional import require

require("audit", "the audit")

from .stats import (
    bonferroni,
    dice,
    fraction_inside,
    friedman,
    hausdorff,
    heatmap,
    iou,
    irfs,
    kruskal_wallis,
    mean_ci,
    noise_sensitivity,
    rfs,
    sis_size_curve,
)
from ..errors import ConfigMismatch, FolderLocked, StorageFault
from .config import AuditConfig, RunOptions, StoreOptions
from .pipeline import digits_pipeline, format_table
from .persist import load_audit, save_audit
from .records import AuditRecord, ModelRecord
from .report import build_report, rebuild_report
from .runner import run_audit, thresholds_for, transfer_table
from .table import audit_table, write_table
from .subsets import keep_last, pixel_subsets, random_subsets

__all__ = [
    "bonferroni", "dice", "fraction_inside", "friedman", "hausdorff", "heatmap", "iou", "irfs", "kruskal_wallis",
    "mean_ci", "noise_sensitivity", "digits_pipeline", "format_table", "rfs", "sis_size_curve", "keep_last",
    "pixel_subsets", "random_subsets", "AuditRecord", "ModelRecord", "load_audit", "save_audit", "build_report",
    "rebuild_report", "AuditConfig", "RunOptions", "StoreOptions", "run_audit", "thresholds_for", "transfer_table", "audit_table", "write_table",
    "FolderLocked", "ConfigMismatch", "StorageFault",
]
