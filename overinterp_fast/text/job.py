"""The `overinterp-fast reduce` job: a text model, texts, input reduction, reductions.parquet and report.html."""
from __future__ import annotations

import os
import time

from ..zoo.text import LABELS, TextModel, bundled_text_model, load_text_data, load_text_model, tokenize
from .reduction import BEAM_SIZE, IMPORTANCE, input_reduction
from .report import summarize, write_reductions


def load_model_spec(spec: str, show_progress: bool | None = None) -> TextModel:
    """"bundled" (the Rotten Tomatoes word CNN, trained once and cached) or a path written by save_text_model."""
    return bundled_text_model(show_progress=show_progress) if spec == "bundled" else load_text_model(spec)


def load_texts(spec: str, limit: int | None) -> tuple[list[list[str]], list[int] | None]:
    """"bundled": held-out Rotten Tomatoes snippets (with labels); else a UTF-8 file, one text per line."""
    if spec == "bundled":
        data = load_text_data()
        n = len(data.tokens_test) if limit is None else min(limit, len(data.tokens_test))
        return data.tokens_test[:n], data.y_test[:n].tolist()
    if not os.path.isfile(spec):
        raise FileNotFoundError(f"no text file at {spec} (one text per line, or 'bundled')")
    with open(spec, encoding="utf-8") as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    if limit is not None:
        lines = lines[:limit]
    tokens = [tokenize(t) for t in lines]
    empty = [i + 1 for i, t in enumerate(tokens) if not t]
    if empty:
        raise ValueError(f"{spec}: text(s) {empty[:5]} have no words")
    if not tokens:
        raise ValueError(f"{spec} has no texts")
    return tokens, None


def run_reduce(model_spec: str, text_spec: str, out_dir: str, *, beam_size: int = BEAM_SIZE,
               importance: str = IMPORTANCE, limit: int | None = None, show_progress: bool | None = None) -> dict:
    """Run input reduction on the texts and write ``out_dir``/reductions.parquet and report.html; return the summary."""
    tm = load_model_spec(model_spec, show_progress)
    tokens, labels = load_texts(text_spec, limit)
    seqs = [tm.vocab.encode(t) for t in tokens]
    t0 = time.perf_counter()
    results = input_reduction(tm.model, seqs, beam_size=beam_size, importance=importance, show_progress=show_progress)
    seconds = time.perf_counter() - t0
    # what the model saw: words outside the vocabulary are <unk>
    seen = [tm.vocab.decode(s) for s in seqs]
    meta = {"model": "bundled word CNN (Rotten Tomatoes snippets)" if model_spec == "bundled" else model_spec,
            "held-out accuracy of the model": f"{tm.test_accuracy:.3f}",
            "texts": "held-out Rotten Tomatoes snippets" if text_spec == "bundled" else text_spec,
            "beam size, importance": f"{beam_size}, {importance}",
            "time": f"{seconds:.1f} s"}
    table, page = write_reductions(out_dir, seen, results, class_names=LABELS, labels=labels,
                                   title="Input reduction (Feng et al. 2018)", meta=meta)
    summary = summarize(results)
    summary.update(seconds=seconds, reductions=table, report=page, test_accuracy=tm.test_accuracy,
                   examples=[{"text": " ".join(t), "reduced": " ".join(t[i] for i in r.kept.tolist()),
                              "class": LABELS[r.target], "confidence": [r.original_confidence, r.confidence]}
                             for t, r in list(zip(seen, results))[:5]])
    return summary
