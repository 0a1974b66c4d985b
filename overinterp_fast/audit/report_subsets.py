"""What the report (:mod:`overinterp_fast.audit.report`) shows of classes and of the 5% pixel subsets, computed
from the record alone (no model is called):

- per model and class (the true class where every label is known, else the class the model predicted): the images,
  the accuracy on the full images, how many have a SIS and its median size, the mean f(x) and, for
  backward-selection methods (own-subset columns, :mod:`overinterp_fast.audit.own_subsets`), the mean confidence on
  the 5% backward-selection subsets and the accuracy there (:func:`class_stats`);
- a gallery of images beside their 5% subset (the kept pixels in colour, framed on small images, the rest grey), a
  few per class (:func:`gallery_figure`).
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import textwrap
from dataclasses import dataclass

import numpy as np

from .metrics import correctness, subset_mask
from .plotting import pyplot, show_panel, sis_panels
from .records import AuditRecord, ModelRecord

GALLERY_PER_CLASS = 2  # images per class in the subsets' gallery
GALLERY_MOST = 20  # images in it at most
GALLERY_COLUMNS = 4  # (image, subset) pairs per row of its figure


def has_subsets(record: AuditRecord) -> bool:
    """Whether a model of the record kept its own-subset columns (the subsets section is shown)."""
    return any(m.subset_columns is not None for m in record.models)


def image_classes(record: AuditRecord, model: ModelRecord) -> tuple[np.ndarray, str]:
    """(int64 [N]: each image's class for the per-class tables, what it is): the true labels when every label is
    known, else the model's predictions."""
    if all(lab is not None for lab in record.labels):
        return np.asarray(record.labels, dtype=np.int64), "true class"
    return np.asarray(model.predictions, dtype=np.int64), "predicted class"


def _mean(values: np.ndarray) -> float | None:
    return float(np.mean(values)) if values.size else None


@dataclass
class ClassStats:
    """One class of one model (see :func:`class_stats`); None where not defined (no labels, no SIS, no own-subset
    columns)."""

    name: str
    images: int
    accuracy: float | None
    with_sis: int
    median_sis: float | None
    mean_score: float
    subset_confidence: float | None
    subset_accuracy: float | None


def class_stats(record: AuditRecord, model: ModelRecord) -> list[ClassStats]:
    """Per class of :func:`image_classes`, in class order: the images, the accuracy on the full images (None
    without every label), the images with a SIS and its median size (a fraction of the features), the mean f(x)
    and, with own-subset columns, the mean confidence on the 5% backward-selection subsets and the accuracy there
    (against the labels, else the full-image predictions)."""
    classes, _ = image_classes(record, model)
    correct = correctness(record, model)
    known = all(c is not None for c in correct)
    reference = classes if known else np.asarray(model.predictions, dtype=np.int64)
    cols = model.subset_columns
    out = []
    for c in sorted(set(classes.tolist())):
        idx = np.flatnonzero(classes == c)
        sis = np.array([model.results[i].fraction for i in idx if model.results[i].sis is not None], dtype=float)
        out.append(ClassStats(
            record.class_name(c), int(idx.size), _mean(np.array([correct[i] for i in idx], dtype=float)) if known
            else None, int(sis.size), float(np.median(sis)) if sis.size else None,
            float(np.mean([model.results[i].score for i in idx])),
            None if cols is None else _mean(cols["backselect_score"][idx]),
            None if cols is None else _mean((cols["backselect_class"][idx] == reference[idx]).astype(float))))
    return out


def gallery_images(record: AuditRecord, model: ModelRecord, per_class: int = GALLERY_PER_CLASS,
                   most: int = GALLERY_MOST) -> list[int]:
    """The images of the subsets' gallery: the first ``per_class`` images of each class (:func:`image_classes`)
    whose order lies on its display's pixel grid, in class order, at most ``most``."""
    classes, _ = image_classes(record, model)
    chosen = []
    for c in sorted(set(classes.tolist())):
        mine = [i for i in np.flatnonzero(classes == c)
                if model.results[i].order.numel() == int(np.prod(record.displays[i].shape[:2]))]
        chosen += mine[:per_class]
    return [int(i) for i in chosen[:most]]


def _short(text: str, width: int) -> str:
    return textwrap.shorten(text, width, placeholder=".")


def subset_title(record: AuditRecord, target: int, cols: dict | None, i: int, fraction: float) -> str:
    """The title over image ``i``'s subset: "5%: f=0.97" (the model's confidence there in ``target``, the class it
    predicted on the full image), or "5%: dog, f=0.12" when it predicts another class there."""
    if cols is None:
        return f"{fraction:.0%} subset"
    said = int(cols["backselect_class"][i])
    other = "" if said == int(target) else f"{_short(record.class_name(said), 9)}, "
    return f"{fraction:.0%}: {other}f={cols['backselect_score'][i]:.2f}"


FRAMED_SIDE = 16  # kept pixels are framed in red on grids up to this side (on larger ones a frame hides the pixel)


def framed(shape: tuple[int, ...]) -> bool:
    """Whether the gallery frames the kept pixels of a grid of ``shape`` (H, W)."""
    return max(shape[:2]) <= FRAMED_SIDE


def _outline(ax, mask: np.ndarray) -> None:
    """A thin red frame around each kept pixel of ``mask`` (bool [H, W]) on an image panel."""
    from matplotlib.patches import Rectangle

    for y, x in zip(*np.nonzero(mask)):
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="tab:red", linewidth=0.7))


def gallery_figure(record: AuditRecord, model: ModelRecord, indices: list[int], fraction: float):
    """A matplotlib figure: each image beside its ``fraction`` backward-selection subset (kept pixels in colour,
    framed in red on small grids (:func:`framed`), the rest grey), titled with its class and what the model says on
    the subset; None without images."""
    if not indices:
        return None
    cols = model.subset_columns
    plt = pyplot()
    rows = -(-len(indices) // GALLERY_COLUMNS)
    ratios = [r for _ in range(GALLERY_COLUMNS) for r in (1.0, 1.0, 0.3)][:-1]  # a gap between the pairs
    fig = plt.figure(figsize=(1.5 * sum(ratios), 1.75 * rows))
    grid = fig.add_gridspec(rows, len(ratios), width_ratios=ratios, wspace=0.06, hspace=0.35)
    classes, _ = image_classes(record, model)
    for j, i in enumerate(indices):
        display, r = record.displays[i], model.results[i]
        mask = subset_mask(r.order, display.shape[:2], fraction).numpy()
        norm, _, alone = sis_panels(display, mask)
        row, col = divmod(j, GALLERY_COLUMNS)
        a, b = fig.add_subplot(grid[row, 3 * col]), fig.add_subplot(grid[row, 3 * col + 1])
        show_panel(a, norm, _short(record.class_name(int(classes[i])), 16), fontsize=8)
        show_panel(b, alone, subset_title(record, r.target, cols, i, fraction), fontsize=8)
        if framed(mask.shape):
            _outline(b, mask)
    return fig
