"""The audit toolkit: pixel-subset datasets and the statistics of papers 000, 002 and 004.

    from overinterp_fast import audit
    subset_images, masks = audit.pixel_subsets(images, results, fraction=0.05)
    train = audit.load_pixel_subsets("out/cifar/subsets/net/train.npz").inputs("backselect")   # a stored audit's
    data = audit.PixelSubsetDataset("out/cifar/subsets/net/train.npz", "backselect")   # a torch Dataset of them
    table1 = audit.retrain("out/cifar", audit.RetrainOptions(arch="resnet20", seeds=(0, 1, 2)))   # Table 1
    audit.heatmap([r.mask for r in results]); audit.dice(a, b); audit.rfs(a_fg, a_bg)
    record = audit.run_audit({"a": model_a, "b": model_b}, images, names, displays,
                             audit.AuditConfig(method="gradient"))
    audit.save_audit(record, "out/audit"); audit.build_report(record, "out/audit/report.html")
    source = audit.from_dataset(torchvision_or_hf_dataset, loaded_model.preprocessing)   # for run_stored_audit
    audit.plot_sis(record.models[0].results[0], record.displays[0])

It needs the ``audit`` extra (``pip install 'overinterp-fast[audit]'``: torchvision, pillow, matplotlib, pyarrow,
scipy); without it, using any of its functions or importing any of its modules raises one line saying so
(:class:`~overinterp_fast.errors.MissingDependency`). Its options (``AuditConfig``, ``StoreOptions``,
``RunOptions``, ``RetrainOptions``, in :mod:`.config`) and its errors import without it: the command line reads its
defaults there.
"""
from typing import TYPE_CHECKING

from ..errors import ConfigMismatch, FolderLocked, StorageFault
from .config import AuditConfig, RetrainOptions, RunOptions, StoreOptions

if TYPE_CHECKING:  # what __getattr__ gives, for type checkers and the API docs
    from .persist import load_audit, save_audit
    from .pipeline import digits_pipeline, format_table
    from .plotting import plot_sis
    from .records import AuditRecord, ModelRecord
    from .report import build_report, rebuild_report
    from .runner import run_audit, thresholds_for, transfer_table
    from .sources import from_dataset, open_images, select_range
    from .stats import (bonferroni, dice, fraction_inside, friedman, hausdorff, heatmap, iou, irfs, kruskal_wallis,
                        mean_ci, noise_sensitivity, rfs, sis_size_curve)
    from .retraining import retrain
    from .subset_dataset import PixelSubsetDataset
    from .subset_files import load_pixel_subsets
    from .subsets import keep_last, pixel_subsets, random_subsets
    from .table import audit_table, write_table

# everything else loads on first use, once the extra is known to be there
_LAZY = {
    "stats": ("bonferroni", "dice", "fraction_inside", "friedman", "hausdorff", "heatmap", "iou", "irfs",
              "kruskal_wallis", "mean_ci", "noise_sensitivity", "rfs", "sis_size_curve"),
    "pipeline": ("digits_pipeline", "format_table"),
    "plotting": ("plot_sis",),
    "sources": ("from_dataset", "open_images", "select_range"),
    "persist": ("load_audit", "save_audit"),
    "records": ("AuditRecord", "ModelRecord"),
    "report": ("build_report", "rebuild_report"),
    "runner": ("run_audit", "thresholds_for", "transfer_table"),
    "table": ("audit_table", "write_table"),
    "subsets": ("keep_last", "pixel_subsets", "random_subsets"),
    "subset_files": ("load_pixel_subsets",),
    "subset_dataset": ("PixelSubsetDataset",),
    "retraining": ("retrain",),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [  # a literal list: the API docs read it without running the package
    "bonferroni", "dice", "fraction_inside", "friedman", "hausdorff", "heatmap", "iou", "irfs", "kruskal_wallis",
    "mean_ci", "noise_sensitivity", "rfs", "sis_size_curve", "digits_pipeline", "format_table", "plot_sis",
    "from_dataset", "open_images", "select_range", "load_audit", "save_audit", "AuditRecord", "ModelRecord",
    "build_report", "rebuild_report", "run_audit", "thresholds_for", "transfer_table", "audit_table", "write_table",
    "keep_last", "pixel_subsets", "random_subsets", "load_pixel_subsets", "PixelSubsetDataset", "retrain",
    "RetrainOptions",
    "AuditConfig", "RunOptions", "StoreOptions", "FolderLocked", "ConfigMismatch", "StorageFault",
]
assert set(__all__) == set(_WHERE) | {"AuditConfig", "RetrainOptions", "RunOptions", "StoreOptions", "FolderLocked",
                                      "ConfigMismatch", "StorageFault"}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from ..util.optional import require

    require("audit", "the audit")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
