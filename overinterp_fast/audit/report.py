"""A self-contained HTML report of an audit: what a person reads to judge whether models overinterpret.

    from overinterp_fast.audit.report import build_report, rebuild_report
    build_report(record, "audit/report.html")   # from an AuditRecord in memory
    rebuild_report("audit")                     # from a folder written by save_audit, nothing recomputed

One HTML file, every figure embedded as a base64 PNG (matplotlib, Agg backend), no
external CSS, scripts or URLs: it can be mailed, archived or opened offline.
Sections (``<section id=...>``): summary, images, sis-sizes, classes, subsets (only when a model kept
its own pixel subsets' predictions), heatmaps, location, comparison, and transfer (only when the record has a
transfer table); the classes and subsets sections show :mod:`overinterp_fast.audit.report_subsets`' figures.
Statistics come from :mod:`overinterp_fast.audit.stats`; nothing is recomputed from the models.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import base64
import html
import io
import json
import math
import os
import re
import textwrap
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .plotting import PANEL_TITLES, pyplot, show_panel, sis_panels
from ..methods.results import SISResult, score_text
from .records import AuditRecord, ModelRecord
from .store import REPORT_FILE
from .config import GALLERY
from .metrics import (
    BORDER,
    SUBSET_FRACTION,
    border_fractions,
    border_share,
    common_grid,
    correctness,
    grid_shape,
    inside_fractions,
    on_grid,
    sis_fractions,
    subset_mask,
)
from .stats import (
    bonferroni,
    dice,
    friedman,
    hausdorff,
    heatmap,
    kruskal_wallis,
    mean_ci,
    sis_size_curve,
)
from . import report_subsets
from .subsets import BACKWARD_METHODS

CURVE_POINTS = 20
DPI = 80
NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?%?$|^n/a$|^\[.*%\]$")  # cells right-aligned (not "2.14.1")

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;max-width:1120px;margin:1.5em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{border-bottom:2px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
h3{margin:1.2em 0 .3em}h4{margin:.2em 0}
nav a{margin-right:1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
img{max-width:100%;height:auto}
.card{display:flex;flex-wrap:wrap;gap:1em;align-items:center;margin:.4em 0 .8em;padding:.5em;
border:1px solid #e3e3e3;border-radius:4px}
.card .facts{width:330px}.card ul{margin:0;padding-left:1.2em}
.headline{background:#f7f7fb;border-left:4px solid #6a6ab0;padding:.6em 1em}
.note{color:#666;font-size:.92em}
.partial{background:#fff4e5;border-left:4px solid #e08a00;padding:.6em 1em}
"""

# ----------------------------------------------------------------------------------------------
# HTML and figure helpers


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(float(x))


def _num(x: float | None, spec: str = ".3g") -> str:
    """A number for a table; "n/a" for None, NaN and inf."""
    return format(float(x), spec) if _finite(x) else "n/a"


def _score(f: float | None, tau: float) -> str:
    """A score f for the gallery: four decimals, more where they would round it onto 0, 1 or tau
    (:func:`~overinterp_fast.methods.results.score_text`); "n/a" when not finite."""
    return score_text(f, tau, fixed=True) if _finite(f) else "n/a"


def _pct(x: float | None, digits: int = 1) -> str:
    """A fraction in [0, 1] as a percentage ("n/a" when not finite)."""
    return f"{100 * float(x):.{digits}f}%" if _finite(x) else "n/a"


def fraction_ci(values) -> tuple[float, float, float]:
    """:func:`mean_ci` of fractions, the interval clipped to [0, 1] (the t interval of few values can leave it)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # identical values: scipy warns, the CI is NaN
        warnings.simplefilter("ignore")
        mean, low, high = mean_ci(values)
    return mean, (max(0.0, low) if _finite(low) else low), (min(1.0, high) if _finite(high) else high)


def _ci(low: float, high: float) -> str:
    return f"[{_pct(low)}, {_pct(high)}]" if _finite(low) and _finite(high) else "n/a"


def _p(text: str, cls: str | None = None) -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<p{attr}>{_esc(text)}</p>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], numbers: bool = True) -> str:
    """An HTML table; every cell escaped, numbers (and "12.3%", "n/a", CIs) right-aligned unless ``numbers`` is
    False (a table of text, such as versions: every cell left-aligned)."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{_esc(c)}</td>' if numbers and (isinstance(c, (int, float)) or NUMBER.match(str(c)))
            else f"<td>{_esc(c)}</td>" for c in row
        ) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{_esc(sid)}">\n<h2>{_esc(title)}</h2>\n{body}\n</section>'


def _png_uri(fig) -> str:
    """Render a matplotlib figure to a ``data:image/png;base64,...`` URI and close it."""
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _img(uri: str, alt: str) -> str:
    return f'<img src="{uri}" alt="{_esc(alt)}">'


def _name_ticks(ax, names: Sequence[str]) -> None:
    """Model names as x tick labels at 0..n-1, wrapped so that long names do not overlap."""
    ax.set_xticks(range(len(names)), [textwrap.fill(n, 16) for n in names], fontsize=9)
    ax.set_xlim(-0.6, len(names) - 0.4)


def _json(x: Any) -> str:
    return x if isinstance(x, str) else json.dumps(x, sort_keys=True, default=str)


# ----------------------------------------------------------------------------------------------
# What the sections compute (from the record only)


def safe_test(test: Callable[[Sequence[Sequence[float]]], tuple[float, float]],
              groups: Sequence[Sequence[float]], min_groups: int = 2, min_values: int = 1) -> tuple[float, float] | str:
    """(statistic, p) of a scipy-based test, or the reason it is n/a (too few groups or values, all identical, ...)."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    if len(groups) < min_groups:
        return f"n/a: needs {min_groups} groups"
    if any(g.size < min_values for g in groups):
        return "n/a: a group has no values" if min_values == 1 else f"n/a: needs {min_values} values per group"
    values = np.concatenate(groups)
    if np.all(values == values[0]):
        return "n/a: all values identical"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            stat, p = test(groups)
    except (ValueError, ZeroDivisionError) as e:
        return f"n/a: {e}"
    if not (math.isfinite(stat) and math.isfinite(p)):
        return "n/a: not defined for these values"
    return stat, p


def _test_cells(res: tuple[float, float] | str) -> list[str]:
    return [_num(res[0]), _num(res[1])] if isinstance(res, tuple) else [res, "n/a"]


def curve_thresholds(models: Sequence[ModelRecord], points: int = CURVE_POINTS) -> np.ndarray:
    """float [points]: thresholds for the SIS-size curve, from min(0.5, lowest tau used) to min(0.99, highest f(x))."""
    results = [r for m in models for r in m.results]
    low = max(0.0, min([0.5] + [r.threshold for r in results if _finite(r.threshold)]))
    high = min([0.99] + [max([r.score for r in results if _finite(r.score)], default=0.99)])
    return np.linspace(low, high, points) if high > low else np.array([low])


def is_exact(model: ModelRecord) -> bool:
    """Exact backward selection: one value per feature (what :func:`sis_size_curve` needs)."""
    return model.method == "exact" and all(r.blocks is None for r in model.results)


# ----------------------------------------------------------------------------------------------
# Sections


def headline(record: AuditRecord, model: ModelRecord) -> str:
    """One plain-language sentence on a model: how many SIS, how large, where they lie, how often it is right."""
    n = len(model.results)
    fr = sis_fractions(model)
    unit = "pixels" if common_grid(record, model) else "features"
    parts = [f"{model.name} ({model.method}): {fr.size} of {n} images reach f(x) >= tau and have a SIS"]
    if fr.size:
        parts.append(f"median SIS: {_pct(float(np.median(fr)))} of the {unit}")
    inside = border_fractions(record, model)
    if np.isfinite(inside).any():
        m, share = float(np.nanmean(inside)), border_share(record)
        lean = ("more than the border's share of the area: the SIS lean on the image's edges (often background)"
                if m > share else "no more than the border's share of the area")
        parts.append(f"on average {_pct(m)} of SIS pixels lie in the outer {BORDER:.0%} border, "
                     f"which is {_pct(share)} of the image, {lean}")
    known = [c for c in correctness(record, model) if c is not None]
    if known:
        parts.append(f"{sum(known)} of {len(known)} labelled images are classified correctly")
    if model.subsets:
        acc, f = model.subsets["accuracy"], _pct(model.subsets["fraction"], 0)
        parts.append(f"on its own {f} backward-selection subsets its accuracy is {_pct(acc['backselect'])}, on "
                     f"random {f} {_pct(acc['random'])} (against {model.subsets['reference']})")
    return "; ".join(parts) + "."


def summary_section(record: AuditRecord) -> str:
    models = _table(
        ["model", "method", "seconds", "images with SIS", "options"],
        [[m.name, m.method, _num(m.seconds, ".2f"), f"{sis_fractions(m).size} of {len(m.results)}", _json(m.options)]
         for m in record.models],
    )
    meta = _table(["", "value"], [[k, _json(v)] for k, v in record.meta.items()], numbers=False) if record.meta else ""
    known = sum(lab is not None for lab in record.labels)
    facts = _p(f"{len(record.image_names)} images ({known} with a known label), {len(record.models)} model(s).")
    reading = "".join(_p(headline(record, m)) for m in record.models)
    return _section("summary", "Summary", f'{facts}<div class="headline">{reading}</div>'
                    f"<h3>Models</h3>{models}" + (f"<h3>Run</h3>{meta}" if meta else ""))


def image_figure(display: np.ndarray, mask: torch.Tensor | np.ndarray | None, panels: bool) -> str:
    """PNG data URI: the three panels of :func:`sis_panels` (``panels``) or only the image."""
    plt = pyplot()
    views = sis_panels(display, None if mask is None else np.asarray(mask, dtype=bool))
    views = views if panels else views[:1]
    fig, axes = plt.subplots(1, len(views), figsize=(2.3 * len(views), 2.5), squeeze=False)
    for ax, view, title in zip(axes[0], views, PANEL_TITLES):
        show_panel(ax, view, title)
    fig.tight_layout()
    return _png_uri(fig)


def result_facts(record: AuditRecord, r: SISResult, label: int | None, display: np.ndarray) -> list[str]:
    """Plain-text lines on one image's result (prediction, scores, SIS size, collection, grid)."""
    verdict = "" if label is None else (" (correct)" if int(r.target) == int(label) else " (wrong)")
    facts = [f"predicted: {record.class_name(r.target)}{verdict}",
             f"f(x) = {_score(r.score, r.threshold)}, tau = {_num(r.threshold, '.4f')}"]
    if r.sis is None:
        return facts + ["no SIS: f(x) < tau"]
    if r.sis_score is not None:
        facts.append(f"f(SIS) = {_score(r.sis_score, r.threshold)}")
    facts.append(f"SIS: {r.size} of {r.order.numel()} features ({_pct(r.fraction, 2)})")
    if r.size == 0:
        facts.append("empty SIS: the fully masked image already reaches tau")
    if r.collection is not None:
        facts.append(f"{len(r.collection)} disjoint SIS")
    if not on_grid(r, display):
        facts.append(f"SIS over a feature grid of shape {list(r.mask.shape)}, not the image's "
                     f"{'x'.join(map(str, grid_shape(display)))} pixels: overlay skipped")
    return facts


def gallery_sample(record: AuditRecord, n: int = GALLERY, seed: int = 0) -> list[tuple[int, list[str]]]:
    """The images the gallery shows: (image index, why it is shown), by index; every image when there are
    at most ``n``.

    Otherwise up to ``n`` images taken in turn from these lists, skipping images already taken: per model
    the smallest SIS (as a fraction), the largest SIS and the wrong predictions (labels known), then a
    random permutation of all images (``seed``)."""
    total = len(record.image_names)
    if n >= total:
        return [(i, []) for i in range(total)]
    lists: list[tuple[str, list[int]]] = []
    for m in record.models:
        with_sis = sorted((r.fraction, i) for i, r in enumerate(m.results) if r.sis is not None)
        lists.append((f"smallest SIS of {m.name}", [i for _, i in with_sis]))
        lists.append((f"largest SIS of {m.name}", [i for _, i in sorted(with_sis, key=lambda t: (-t[0], t[1]))]))
        lists.append((f"wrong prediction of {m.name}", [i for i, c in enumerate(correctness(record, m)) if c is False]))
    lists.append(("random sample", [int(i) for i in np.random.default_rng(seed).permutation(total)]))
    chosen: dict[int, list[str]] = {}
    cursors = [0] * len(lists)
    while len(chosen) < n:
        took = False
        for j, (why, lst) in enumerate(lists):
            while cursors[j] < len(lst) and lst[cursors[j]] in chosen:
                cursors[j] += 1
            if cursors[j] < len(lst) and len(chosen) < n:
                chosen[lst[cursors[j]]] = [why]
                took = True
        if not took:
            break
    return sorted(chosen.items())


def images_section(record: AuditRecord, gallery: int = GALLERY, seed: int = 0) -> str:
    sample = gallery_sample(record, gallery, seed)
    parts = []
    if len(sample) < len(record.image_names):
        parts.append(_p(f"A sample of {len(sample)} of the {len(record.image_names)} images: per model the "
                        "smallest and largest SIS and wrong predictions, then a seeded random few. The statistics "
                        "and plots below cover every image; sis.parquet has every row.", "note"))
    for i, why in sample:
        name, display, label = record.image_names[i], record.displays[i], record.labels[i]
        truth = "unknown" if label is None else record.class_name(label)
        shown = f"; shown as: {', '.join(why)}" if why else ""
        parts.append(f"<h3>{_esc(name)}</h3>" + _p(f"true label: {truth}{shown}"))
        for m in record.models:
            r = m.results[i]
            uri = image_figure(display, r.mask if on_grid(r, display) else None, on_grid(r, display))
            items = "".join(f"<li>{_esc(f)}</li>" for f in result_facts(record, r, label, display))
            parts.append(f'<div class="card"><div class="facts"><h4>{_esc(m.name)}</h4><ul>{items}</ul></div>'
                         f'{_img(uri, f"{name}, {m.name}")}</div>')
    return _section("images", "Images and their SIS", "\n".join(parts))


def _size_rows(record: AuditRecord, m: ModelRecord) -> list[list[Any]]:
    """Rows of the SIS-size table for one model: all images, and split by correctness when labels are known."""
    correct = correctness(record, m)
    groups = [("all images", [True] * len(m.results))]
    if any(c is not None for c in correct):
        groups += [("correctly classified", [c is True for c in correct]),
                   ("wrongly classified", [c is False for c in correct])]
    rows = []
    for group, keep in groups:
        fr = np.array([r.fraction for r, k in zip(m.results, keep) if k and r.sis is not None], dtype=float)
        mean, low, high = fraction_ci(fr)
        rows.append([m.name, group, sum(keep), fr.size, _pct(np.median(fr) if fr.size else None, 2),
                     _pct(mean, 2), _ci(low, high)])
    return rows


def size_box_figure(models: Sequence[ModelRecord]) -> str | None:
    """PNG data URI: box plot with the points of the SIS fractions (%) per model; None when no model has a SIS."""
    data = [100 * sis_fractions(m) for m in models]
    if not any(d.size for d in data):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(models) + 2), 3.6))
    pos = [i for i, d in enumerate(data) if d.size]
    ax.boxplot([data[i] for i in pos], positions=pos, widths=0.5, showfliers=False)
    rng = np.random.default_rng(0)
    for i in pos:
        ax.scatter(i + rng.uniform(-0.12, 0.12, data[i].size), data[i], s=14, alpha=0.7, color="tab:red", zorder=3)
    _name_ticks(ax, [m.name for m in models])
    ax.set_ylabel("SIS size (% of features)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _png_uri(fig)


def size_curve_figure(models: Sequence[ModelRecord]) -> str | None:
    """PNG data URI: mean SIS fraction (%) vs threshold with the 95% CI band, for exact models; None when empty."""
    models = [m for m in models if is_exact(m)]
    if not models:
        return None
    thresholds = curve_thresholds(models)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    drawn = False
    for m in models:
        curve = sis_size_curve(m.results, thresholds)  # [N, T], NaN without SIS
        stats_ = np.array([fraction_ci(curve[:, j]) for j in range(len(thresholds))])  # [T, 3]
        if not np.isfinite(stats_[:, 0]).any():
            continue
        drawn = True
        line, = ax.plot(thresholds, 100 * stats_[:, 0], marker="o", ms=3, label=m.name)
        ax.fill_between(thresholds, 100 * stats_[:, 1], 100 * stats_[:, 2], color=line.get_color(), alpha=0.2)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("threshold tau")
    ax.set_ylabel("SIS size (% of features)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png_uri(fig)


def sizes_section(record: AuditRecord) -> str:
    rows = [row for m in record.models for row in _size_rows(record, m)]
    body = [_p("SIS size as a fraction of the features the model saw; only images with f(x) >= tau have a SIS. "
               "Small SIS that still reach tau are what overinterpretation looks like."),
            _table(["model", "group", "images", "with SIS", "median", "mean", "95% CI of the mean"], rows)]
    box = size_box_figure(record.models)
    body.append(_img(box, "SIS sizes per model") if box else _p("No model has a SIS: nothing to plot.", "note"))
    curve = size_curve_figure(record.models)
    if curve:
        body.append(_p("Exact SIS size as the threshold varies (from the stored backward selection, no model calls): "
                       "mean over the images with f(x) >= tau, shaded 95% CI; images drop out as tau passes f(x)."))
        body.append(_img(curve, "SIS size vs threshold"))
    return _section("sis-sizes", "SIS sizes", "\n".join(body))


def _heat_axes(fig, ax, values: np.ndarray, title: str) -> None:
    im = ax.imshow(values, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(title, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).set_label("fraction of images", fontsize=8)


def heatmap_figure(model: ModelRecord, shape: tuple[int, int]) -> str | None:
    """PNG data URI: how often each pixel is in the SIS and (backward methods) in the last 5%; None when empty."""
    panels = []
    sis_masks = [r.mask for r in model.results if r.mask is not None]
    if sis_masks:
        panels.append((heatmap(sis_masks).numpy(), f"in the SIS ({len(sis_masks)} images)"))
    if model.method in BACKWARD_METHODS:
        subsets = [subset_mask(r.order, shape) for r in model.results]
        subsets = [s for s in subsets if s is not None]
        if subsets:
            panels.append((heatmap(subsets).numpy(),
                           f"in the last {SUBSET_FRACTION:.0%} of backward selection ({len(subsets)} images)"))
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.3), squeeze=False)
    for ax, (values, title) in zip(axes[0], panels):
        _heat_axes(fig, ax, values, title)
    fig.tight_layout()
    return _png_uri(fig)


def heatmaps_section(record: AuditRecord) -> str:
    body = [_p("How often each pixel belongs to a model's SIS and, for backward selection (exact, gradient), to its "
               f"last {SUBSET_FRACTION:.0%}, the pixel subsets that suffice for a confident, often correct "
               "prediction. Bright edges and corners would mean the model decides from the border.")]
    for m in record.models:
        shape = common_grid(record, m)
        uri = heatmap_figure(m, shape) if shape else None
        if uri:
            body.append(f"<h3>{_esc(m.name)}</h3>" + _img(uri, f"heatmaps of {m.name}"))
        else:
            why = "no SIS" if shape else "the images or the masks do not share one pixel grid"
            body.append(f"<h3>{_esc(m.name)}</h3>" + _p(f"No heatmap: {why}.", "note"))
    return _section("heatmaps", "Where the SIS lie", "\n".join(body))


def location_figure(record: AuditRecord) -> str | None:
    """PNG data URI: mean % of SIS pixels in the border per model (95% CI) against the border's area share."""
    stats_ = [fraction_ci(border_fractions(record, m)) for m in record.models]
    if not any(_finite(s[0]) for s in stats_):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(record.models) + 2), 3.6))
    means = np.array([100 * s[0] for s in stats_])
    err = np.array([[100 * (s[0] - s[1]), 100 * (s[2] - s[0])] if _finite(s[1]) else [0, 0] for s in stats_]).T
    ax.bar(range(len(stats_)), np.nan_to_num(means), yerr=err, capsize=4, color="tab:blue", alpha=0.8)
    ax.axhline(100 * border_share(record), color="tab:red", ls="--", label="border's share of the area")
    _name_ticks(ax, [m.name for m in record.models])
    ax.set_ylabel(f"% of SIS pixels in the {BORDER:.0%} border")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return _png_uri(fig)


def location_section(record: AuditRecord) -> str:
    share = border_share(record)
    rows = []
    for m in record.models:
        inside = border_fractions(record, m)
        mean, low, high = fraction_ci(inside)
        ratio = mean / share if _finite(mean) and share > 0 else None
        rows.append([m.name, int(np.isfinite(inside).sum()), _pct(mean), _ci(low, high), _pct(share),
                     _num(ratio, ".2f")])
    body = [_p(f"The border is the outer {BORDER:.0%} of each side of the image. If SIS pixels fell anywhere, "
               "their share in the border would match the border's share of the area (ratio 1); well above 1 means "
               "the model is satisfied by edge pixels, typically background: overinterpretation."),
            _table(["model", "images with a non-empty SIS on the pixel grid", "mean % of SIS pixels in the border",
                    "95% CI", "border's share of the area", "ratio"], rows)]
    uri = location_figure(record)
    body.append(_img(uri, "SIS pixels in the border") if uri
                else _p("No SIS on the pixel grid: nothing to plot.", "note"))
    return _section("location", "Border or object?", "\n".join(body))


def object_section(record: AuditRecord) -> str:
    """SIS pixels inside the given object masks, and foreground/background noise sensitivity (RFS, iRFS)."""
    objects = [np.asarray(o, dtype=bool) for o in record.object_masks]
    share = float(np.mean([o.mean() for o in objects]))
    rows = []
    for m in record.models:
        inside = inside_fractions(record, m, objects)
        mean, low, high = fraction_ci(inside)
        sens = m.sensitivity or {}
        rows.append([m.name, int(np.isfinite(inside).sum()), _pct(mean), _ci(low, high), _pct(share),
                     _pct(sens.get("a_fg")), _pct(sens.get("a_bg")), _num(sens.get("rfs"), ".3f"),
                     _num(sens.get("irfs"), ".3f")])
    reference = next((m.sensitivity.get("reference") for m in record.models if m.sensitivity), "unknown")
    sigma = next((m.sensitivity.get("sigma") for m in record.models if m.sensitivity), None)
    body = [_p("Object masks were given. Left: the mean share of SIS pixels inside the object against the object's "
               "share of the area (Carter et al. 2021 found ImageNet SIS mostly outside the object). Right: accuracy with "
               f"Gaussian noise (sigma {sigma} of the pixel range [0, 1]) on only the foreground (a_fg) or "
               f"only the background (a_bg), measured against {reference}; RFS = (a_bg - a_fg) / "
               "(2 min(a, 1 - a)) and iRFS (the same with true-class probabilities) lie in [-1, 1]: above 0, "
               "the model depends more on the object than on the background (Moayeri et al. 2022)."),
            _table(["model", "images with a non-empty SIS", "mean % of SIS pixels in the object", "95% CI",
                    "object's share of the area", "a_fg", "a_bg", "RFS", "iRFS"], rows)]
    return _section("object", "Object or background?", "\n".join(body))


def pair_overlap(a: ModelRecord, b: ModelRecord) -> tuple[int, float, float]:
    """(images where both have a SIS of the same shape, mean Dice, mean Hausdorff in pixels).

    The Hausdorff distance is averaged over the pairs of non-empty [H, W] masks only."""
    dices, dists = [], []
    for ra, rb in zip(a.results, b.results):
        if ra.mask is None or rb.mask is None or ra.mask.shape != rb.mask.shape:
            continue
        dices.append(dice(ra.mask.numpy(), rb.mask.numpy()))
        if ra.mask.dim() == 2 and ra.size and rb.size:
            dists.append(hausdorff(ra.mask.numpy(), rb.mask.numpy()))
    mean = lambda v: float(np.mean(v)) if v else float("nan")  # noqa: E731
    return len(dices), mean(dices), mean(dists)


def matched_fractions(models: Sequence[ModelRecord]) -> np.ndarray:
    """float [n_models, n_matched]: SIS fractions on the images where every model has a SIS."""
    keep = [i for i in range(len(models[0].results)) if all(m.results[i].sis is not None for m in models)]
    return np.array([[m.results[i].fraction for i in keep] for m in models], dtype=float).reshape(len(models), -1)


def comparison_section(record: AuditRecord) -> str:
    models = record.models
    if len(models) < 2:
        return _section("comparison", "Comparing the models", _p("One model: nothing to compare."))
    pairs = [(a, b) for i, a in enumerate(models) for b in models[i + 1:]]
    tests = [safe_test(kruskal_wallis, [sis_fractions(a), sis_fractions(b)]) for a, b in pairs]
    ps = [t[1] for t in tests if isinstance(t, tuple)]
    corrected = iter(bonferroni(ps))
    rows = []
    for (a, b), t in zip(pairs, tests):
        n, d, h = pair_overlap(a, b)
        rows.append([a.name, b.name, n, _num(d, ".3f"), _num(h, ".2f"), *_test_cells(t),
                     _num(next(corrected)) if isinstance(t, tuple) else "n/a"])
    body = [_p("Dice: overlap of two models' SIS on the same image (1: identical, 0: disjoint); Hausdorff: the "
               "largest distance in pixels from a pixel of one SIS to the other. Kruskal-Wallis compares the SIS "
               f"sizes; Bonferroni corrects its p-values for the {len(pairs)} pair(s)."),
            _table(["model A", "model B", "images where both have a SIS", "mean Dice", "mean Hausdorff (px)",
                    "Kruskal-Wallis H", "p", "p (Bonferroni)"], rows)]
    overall = safe_test(kruskal_wallis, [sis_fractions(m) for m in models])
    tests_rows = [["Kruskal-Wallis, all models (independent groups)", sum(sis_fractions(m).size for m in models),
                   *_test_cells(overall)]]
    if len(models) >= 3:
        matched = matched_fractions(models)
        tests_rows.append(["Friedman, images where every model has a SIS (matched)", matched.shape[1],
                           *_test_cells(safe_test(friedman, list(matched), min_groups=3, min_values=2))])
    body.append(_table(["test on SIS sizes", "values", "statistic", "p"], tests_rows))
    return _section("comparison", "Comparing the models", "\n".join(body))


def transfer_section(record: AuditRecord) -> str:
    t = record.transfer
    acc = t.get("accuracy", [])
    rows = [[name] + [_pct(v) for v in row] for name, row in zip(t.get("rows", []), acc)]
    body = [_p(f"Accuracy of each column's model on the pixel subsets (the last {_pct(t.get('fraction'), 0)} of "
               f"backward selection) of each row's model, measured against {t.get('reference', 'unknown')}. "
               "High accuracy on another model's subsets: the subsets carry signal that transfers between models."),
            _table(["subsets from \u2193 / evaluated by \u2192"] + list(t.get("cols", [])), rows)]
    return _section("transfer", "Do the subsets transfer?", "\n".join(body))


def classes_section(record: AuditRecord) -> str:
    """Per model and class: :func:`~overinterp_fast.audit.report_subsets.class_stats`."""
    body = [_p("Per class: the images, the model's accuracy on the full images, the images with a SIS and its median "
               "size (as a fraction of the features), the mean f(x) and, for backward selection, the mean confidence "
               "(the probability of the class predicted on the full image) on the 5% backward-selection subsets and "
               "the accuracy there. A class whose subsets keep a high confidence from few pixels is one the model "
               "may overinterpret.")]
    for m in record.models:
        _, what = report_subsets.image_classes(record, m)
        header = [what, "images", "accuracy", "with SIS", "median SIS", "mean f(x)"]
        own = m.subset_columns is not None
        if own:
            f = _pct((m.subsets or {}).get("fraction"), 0)
            header += [f"mean confidence on its {f} subsets", f"accuracy on its {f} subsets"]
        rows = [[c.name, c.images, _pct(c.accuracy), c.with_sis, _pct(c.median_sis, 2), _num(c.mean_score, ".3f")]
                + ([_num(c.subset_confidence, ".3f"), _pct(c.subset_accuracy)] if own else [])
                for c in report_subsets.class_stats(record, m)]
        body.append(f"<h3>{_esc(m.name)}</h3>" + _table(header, rows))
    return _section("classes", "Per class", "\n".join(body))


def subsets_section(record: AuditRecord) -> str:
    """Each model on its own pixel subsets (``ModelRecord.subsets``), and the gallery of images beside them."""
    rows = [[m.name, m.subsets["images"], m.subsets["reference"], *(_pct(m.subsets["accuracy"][k]) for k in
             ("full", "backselect", "random")), *(_num(m.subsets["confidence"][k], ".3f") for k in
                                                  ("backselect", "random"))] for m in record.models if m.subsets]
    f = _pct(next((m.subsets["fraction"] for m in record.models if m.subsets), SUBSET_FRACTION), 0)
    body = [_p(f"Each model on its own pixel subsets: the image with only the last {f} of its backward-selection order "
               f"present (the pixels it needs least to lose), and with as many pixels drawn at random, the rest at the "
               f"baseline. A model that keeps its accuracy and confidence on {f} of the pixels it chose, and not on "
               "random ones, decides from sparse patterns a person cannot see: overinterpretation (Carter et al. "
               "2021, Table 1). 'overinterp-fast retrain' trains new models on these subsets."),
            _table(["model", "images", "measured against", "accuracy on full images", f"accuracy on its {f} subsets",
                    f"accuracy on random {f}", f"mean confidence on its {f}", f"mean confidence on random {f}"], rows)]
    for m in record.models:
        if m.subset_columns is None:
            continue
        fraction = (m.subsets or {}).get("fraction", SUBSET_FRACTION)
        shown = report_subsets.gallery_images(record, m)
        fig = report_subsets.gallery_figure(record, m, shown, fraction)
        if fig is not None:
            body.append(f"<h3>{_esc(m.name)}</h3>" + _p(
                f"{len(shown)} images, up to {report_subsets.GALLERY_PER_CLASS} per class, each beside its "
                f"{_pct(fraction, 0)} backward-selection subset (in colour"
                + (", framed in red" if shown and report_subsets.framed(record.displays[shown[0]].shape) else "")
                + "; the rest grey), titled with f, the model's confidence on the subset in the class it predicted on "
                "the full image, and the class it predicts there when that is another.", "note") + _img(_png_uri(fig), f"pixel subsets, {m.name}"))
    return _section("subsets", f"The {f} pixel subsets", "\n".join(body))


# (section id, link text, renderer); "transfer" and "object" only when the record has a transfer table,
# resp. object masks, "subsets" only when a model kept its own-subset columns
SECTIONS: list[tuple[str, str, Callable[[AuditRecord], str]]] = [
    ("summary", "Summary", summary_section), ("images", "Images", images_section),
    ("sis-sizes", "SIS sizes", sizes_section), ("classes", "Classes", classes_section),
    ("subsets", "5% subsets", subsets_section), ("heatmaps", "Heatmaps", heatmaps_section),
    ("location", "Border", location_section), ("object", "Object", object_section),
    ("comparison", "Comparison", comparison_section),
    ("transfer", "Transfer", transfer_section),
]


def render_report(record: AuditRecord, gallery: int = GALLERY, seed: int = 0) -> str:
    """The report as one HTML string (what :func:`build_report` writes); the images section shows
    :func:`gallery_sample` (``gallery`` images, ``seed``)."""
    sections = [(sid, name, images_section(record, gallery, seed) if sid == "images" else render(record))
                for sid, name, render in SECTIONS
                if (sid != "transfer" or record.transfer is not None)
                and (sid != "subsets" or report_subsets.has_subsets(record))
                and (sid != "object" or record.object_masks is not None)]
    nav = "<nav>" + "".join(f'<a href="#{sid}">{_esc(name)}</a>' for sid, name, _ in sections) + "</nav>"
    partial = "" if not record.partial else (f'<p class="partial" id="partial"><strong>Partial audit:</strong> '
                                             f"{_esc(record.partial)}. Every figure and statistic covers these "
                                             f"images only.</p>\n")
    title = record.title + (" (partial)" if record.partial else "")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>{_esc(title)}</h1>\n{partial}{nav}\n" + "\n".join(body for _, _, body in sections)
            + "\n</body>\n</html>\n")


def build_report(record: AuditRecord, path: str, gallery: int = GALLERY, seed: int = 0) -> str:
    """Write the self-contained HTML report of ``record`` to ``path`` (folders created); returns ``path``.

    The gallery shows ``gallery`` images (:func:`gallery_sample`); statistics and plots cover all."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    text = render_report(record, gallery, seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def rebuild_report(folder: str, path: str | None = None, gallery: int = GALLERY, seed: int = 0) -> str:
    """Rebuild the report of an audit folder written by :func:`save_audit` or a stored audit (default:
    ``folder/report.html``); of an audit not complete yet, the images it has finished, marked as partial
    (:func:`~overinterp_fast.audit.partial.load_partial`)."""
    from .partial import load_partial

    return build_report(load_partial(folder), path or os.path.join(folder, REPORT_FILE), gallery, seed)
