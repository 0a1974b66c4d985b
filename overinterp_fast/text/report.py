"""What a person reads about input reduction: reductions.parquet and a self-contained HTML page.

The page (the view of Feng et al. 2018): each sentence with its kept words highlighted and the confidences before and after,
and the summary: mean length before and after, the share of reductions more confident than the original, and
the distribution of confidences (an embedded PNG). No external CSS, scripts or URLs.
"""
from __future__ import annotations

import os
import statistics
from typing import Sequence

from ..audit.report import CSS, _esc, _img, _png_uri, _section, _table
from ..audit.plotting import pyplot
from .reduction import InputReduction
from ..util.optional import load

REDUCTIONS_FILE = "reductions.parquet"
REPORT_FILE = "report.html"
TEXT_CSS = """
.sent{margin:.35em 0;padding:.35em .6em;border:1px solid #e3e3e3;border-radius:4px}
.sent .kept{background:#ffe066;font-weight:600;padding:0 .15em;border-radius:2px}
.sent .gone{color:#aaa}
.sent .conf{color:#555;font-size:.9em;margin-left:.6em;font-variant-numeric:tabular-nums}
"""


def summarize(results: Sequence[InputReduction]) -> dict:
    """Paper 003's numbers: lengths before/after (mean, median), share more confident, mean confidences."""
    before = [r.original_length for r in results]
    after = [r.length for r in results]
    return {
        "sequences": len(results),
        "mean_length": statistics.fmean(before),
        "mean_reduced_length": statistics.fmean(after),
        "median_length": statistics.median(before),
        "median_reduced_length": statistics.median(after),
        "share_more_confident": statistics.fmean(r.confidence > r.original_confidence for r in results),
        "mean_original_confidence": statistics.fmean(r.original_confidence for r in results),
        "mean_reduced_confidence": statistics.fmean(r.confidence for r in results),
    }


def reduction_table(tokens: Sequence[Sequence[str]], results: Sequence[InputReduction],
                    class_names: Sequence[str] | None = None, labels: Sequence[int] | None = None):
    """One row per sequence (a pyarrow Table); ``tokens``: each sequence's words, as the model's ids."""
    pa = load("pyarrow", "audit", "the reduction table")

    def name(c):
        return class_names[c] if class_names is not None else str(c)

    kept = [r.kept.tolist() for r in results]
    return pa.table({
        "index": pa.array(range(len(results)), pa.int64()),
        "text": [" ".join(t) for t in tokens],
        "reduced_text": [" ".join(t[i] for i in k) for t, k in zip(tokens, kept)],
        "length": pa.array([r.original_length for r in results], pa.int64()),
        "reduced_length": pa.array([r.length for r in results], pa.int64()),
        "kept": pa.array(kept, pa.list_(pa.int64())),
        "target": pa.array([r.target for r in results], pa.int64()),
        "target_name": [name(r.target) for r in results],
        "label": pa.array(list(labels) if labels is not None else [None] * len(results), pa.int64()),
        "original_confidence": pa.array([r.original_confidence for r in results], pa.float64()),
        "confidence": pa.array([r.confidence for r in results], pa.float64()),
        "more_confident": pa.array([r.confidence > r.original_confidence for r in results], pa.bool_()),
        "beam_members": pa.array([len(r.beam) for r in results], pa.int64()),
        "steps": pa.array([r.steps for r in results], pa.int64()),
        "queries": pa.array([r.queries for r in results], pa.int64()),
    })


def _confidence_figure(results: Sequence[InputReduction]) -> str:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
    bins = [i / 20 for i in range(21)]
    a.hist([r.original_confidence for r in results], bins=bins, alpha=0.6, label="original input")
    a.hist([r.confidence for r in results], bins=bins, alpha=0.6, label="reduced input")
    a.set_xlabel("confidence f_y (softmax probability of the predicted class)")
    a.set_ylabel("sequences")
    a.legend(loc="upper left")
    lengths = [r.original_length for r in results]
    reduced = [r.length for r in results]
    top = max(lengths)
    b.hist([lengths, reduced], bins=range(1, top + 2), label=["original", "reduced"])
    b.set_xlabel("length (tokens)")
    b.set_ylabel("sequences")
    b.legend()
    fig.tight_layout()
    return _png_uri(fig)


def _sentence(tokens: Sequence[str], r: InputReduction, class_names) -> str:
    kept = set(r.kept.tolist())
    words = " ".join(f'<span class="{"kept" if i in kept else "gone"}">{_esc(t)}</span>' for i, t in enumerate(tokens))
    name = class_names[r.target] if class_names is not None else str(r.target)
    return (f'<div class="sent">{words}<span class="conf">{_esc(name)}: {r.original_confidence:.3f} &rarr; '
            f'{r.confidence:.3f} ({r.original_length} &rarr; {r.length} tokens)</span></div>')


def build_text_report(tokens: Sequence[Sequence[str]], results: Sequence[InputReduction], path: str, *,
                      title: str = "Input reduction", class_names: Sequence[str] | None = None,
                      meta: dict | None = None, max_sentences: int = 200) -> str:
    """Write the HTML page to ``path``; returns the path."""
    s = summarize(results)
    facts = [
        ["sequences", s["sequences"]],
        ["mean length before / after (tokens)", f"{s['mean_length']:.2f} / {s['mean_reduced_length']:.2f}"],
        ["median length before / after", f"{s['median_length']:g} / {s['median_reduced_length']:g}"],
        ["reductions more confident than the original", f"{100 * s['share_more_confident']:.1f}%"],
        ["mean confidence before / after", f"{s['mean_original_confidence']:.3f} / {s['mean_reduced_confidence']:.3f}"],
    ] + [[k, v] for k, v in (meta or {}).items()]
    headline = (f"<p class=\"headline\">After input reduction the model keeps its prediction on "
                f"{s['mean_reduced_length']:.1f} tokens on average (from {s['mean_length']:.1f}); "
                f"{100 * s['share_more_confident']:.0f}% of the reduced inputs are more confident than the "
                f"originals (Feng et al. 2018: models stay confident on nonsense).</p>")
    shown = list(zip(tokens, results))[:max_sentences]
    sentences = "\n".join(_sentence(t, r, class_names) for t, r in shown)
    note = ("" if len(results) <= max_sentences else
            f"<p class=\"note\">The first {max_sentences} of {len(results)} sequences; all are in "
            f"{REDUCTIONS_FILE}.</p>")
    body = (headline + _section("summary", "Summary", _table(["quantity", "value"], facts))
            + _section("confidence", "Confidence and length",
                       _img(_confidence_figure(results), "histograms of confidence and length before and after"))
            + _section("sentences", "Sentences (kept words highlighted)", note + sentences))
    page = ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(title)}</title>\n<style>{CSS}{TEXT_CSS}</style>\n</head>\n<body>\n"
            f"<h1>{_esc(title)}</h1>\n{body}\n</body>\n</html>\n")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(page)
    return path


def write_reductions(out_dir: str, tokens, results, *, class_names=None, labels=None, title="Input reduction",
                     meta: dict | None = None) -> tuple[str, str]:
    """reductions.parquet and report.html in ``out_dir``; returns both paths."""
    pq = load("pyarrow.parquet", "audit", "the reduction report")

    os.makedirs(out_dir, exist_ok=True)
    table_path = os.path.join(out_dir, REDUCTIONS_FILE)
    pq.write_table(reduction_table(tokens, results, class_names, labels), table_path)
    page = build_text_report(tokens, results, os.path.join(out_dir, REPORT_FILE), title=title,
                             class_names=class_names, meta=meta)
    return table_path, page
