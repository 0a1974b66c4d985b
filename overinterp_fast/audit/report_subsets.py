"""The report's sections on classes and on the 5% pixel subsets (:mod:`overinterp_fast.audit.report` shows them).

- **Per class** (``<section id="classes">``): per model and class (the true class where every label is known,
  else the class the model predicted), the images, the accuracy on the full images, how many have a SIS and its
  median size, and for backward-selection methods the mean confidence on the 5% backward-selection subsets and
  the accuracy there.
- **The 5% pixel subsets** (``<section id="subsets">``, when a model kept its own-subset columns,
  :mod:`overinterp_fast.audit.own_subsets`): per model its accuracy on the full images, on its own 5%
  backward-selection subsets and on random 5% (Carter et al. 2021, Table 1's first rows), the mean confidence
  on each, and a gallery of images beside their 5% subset (the kept pixels in colour, the rest grey), a few per
  class.

Built from the record alone, as the rest of the report; no model is called.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import textwrap
from typing import Any

import numpy as np

from . import report as html
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


def class_rows(record: AuditRecord, model: ModelRecord) -> list[list[Any]]:
    """Per class of :func:`image_classes`, in class order: class name, images, accuracy on the full images (n/a
    without labels), images with a SIS, median SIS size, mean f(x) and, with own-subset columns, the mean
    confidence on the 5% backward-selection subsets and the accuracy there (against the labels, else the
    full-image prediction)."""
    classes, _ = image_classes(record, model)
    correct = correctness(record, model)
    known = all(c is not None for c in correct)
    reference = classes if known else np.asarray(model.predictions, dtype=np.int64)
    cols = model.subset_columns
    rows = []
    for c in sorted(set(classes.tolist())):
        idx = np.flatnonzero(classes == c)
        sis = np.array([model.results[i].fraction for i in idx if model.results[i].sis is not None], dtype=float)
        row = [record.class_name(c), idx.size,
               html._pct(_mean(np.array([correct[i] for i in idx], dtype=float))) if known else "n/a",
               sis.size, html._pct(float(np.median(sis)) if sis.size else None, 2),
               html._num(_mean(np.array([model.results[i].score for i in idx], dtype=float)), ".3f")]
        if cols is not None:
            row += [html._num(_mean(cols["backselect_score"][idx]), ".3f"),
                    html._pct(_mean((cols["backselect_class"][idx] == reference[idx]).astype(float)))]
        rows.append(row)
    return rows


def classes_section(record: AuditRecord) -> str:
    body = [html._p("Per class: the images, the model's accuracy on the full images, the images with a SIS and "
                    "its median size (as a fraction of the features), the mean f(x) and, for backward selection, "
                    "the mean confidence (the probability of the class predicted on the full image) on the 5% "
                    "backward-selection subsets and the accuracy there. A class whose subsets keep a high "
                    "confidence from few pixels is one the model may overinterpret.")]
    for m in record.models:
        _, what = image_classes(record, m)
        header = [what, "images", "accuracy", "with SIS", "median SIS", "mean f(x)"]
        if m.subset_columns is not None:
            fraction = html._pct((m.subsets or {}).get("fraction"), 0)
            header += [f"mean confidence on its {fraction} subsets", f"accuracy on its {fraction} subsets"]
        body.append(f"<h3>{html._esc(m.name)}</h3>" + html._table(header, class_rows(record, m)))
    return html._section("classes", "Per class", "\n".join(body))


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


def _outline(ax, mask: np.ndarray) -> None:
    """A thin red frame around each kept pixel of ``mask`` (bool [H, W]) on an image panel."""
    from matplotlib.patches import Rectangle

    width = min(0.7, 12.0 / max(mask.shape))  # thinner on larger grids, where a pixel is smaller
    for y, x in zip(*np.nonzero(mask)):
        ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="tab:red", linewidth=width))


def gallery_figure(record: AuditRecord, model: ModelRecord, indices: list[int], fraction: float) -> str | None:
    """PNG data URI: each image beside its ``fraction`` backward-selection subset (kept pixels in colour and framed
    in red, the rest grey), titled with its class and what the model says on the subset; None without images."""
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
        _outline(b, mask)
    return html._png_uri(fig)


def subsets_section(record: AuditRecord) -> str:
    rows = []
    for m in record.models:
        s = m.subsets
        if s is None:
            continue
        acc, conf = s["accuracy"], s["confidence"]
        rows.append([m.name, s["images"], s["reference"], html._pct(acc["full"]), html._pct(acc["backselect"]),
                     html._pct(acc["random"]), html._num(conf["backselect"], ".3f"), html._num(conf["random"], ".3f")])
    fraction = next((m.subsets["fraction"] for m in record.models if m.subsets), 0.05)
    f = html._pct(fraction, 0)
    body = [html._p(f"Each model on its own pixel subsets: the image with only the last {f} of its backward-selection "
                    f"order present (the pixels it needs least to lose), and with as many pixels drawn at random, the "
                    f"rest at the baseline. A model that keeps its accuracy and confidence on {f} of the pixels it "
                    "chose, and not on random ones, decides from sparse patterns a person cannot see: "
                    "overinterpretation (Carter et al. 2021, Table 1). 'overinterp-fast retrain' trains new models "
                    "on these subsets."),
            html._table(["model", "images", "measured against", "accuracy on full images",
                         f"accuracy on its {f} subsets", f"accuracy on random {f}", f"mean confidence on its {f}",
                         f"mean confidence on random {f}"], rows)]
    for m in record.models:
        if m.subset_columns is None:
            continue
        m_fraction = (m.subsets or {}).get("fraction", fraction)
        shown = gallery_images(record, m)
        uri = gallery_figure(record, m, shown, m_fraction)
        if uri:
            body.append(f"<h3>{html._esc(m.name)}</h3>"
                        + html._p(f"{len(shown)} images, up to {GALLERY_PER_CLASS} per class, each beside its "
                                  f"{html._pct(m_fraction, 0)} backward-selection subset (in colour, framed in red; "
                                  "the rest grey), "
                                  "titled with f, the model's confidence on the subset in the class it predicted on "
                                  "the full image, and the class it predicts there when that is another.", "note")
                        + html._img(uri, f"images and their pixel subsets, {m.name}"))
    return html._section("subsets", f"The {f} pixel subsets", "\n".join(body))
