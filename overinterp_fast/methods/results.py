"""Result types."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def score_text(value: float, *against: float, digits: int = 4, fixed: bool = False) -> str:
    """``value`` (a score f) with ``digits`` significant digits (``fixed``: decimals), or as many more as it takes
    for the text to keep its order against 0, 1 and each of ``against`` (e.g. the threshold): 0.999998 is
    "0.999998", never "1", and 0.89996 against tau 0.9 is "0.89996", never "0.9"."""
    value = float(value)
    marks = (0.0, 1.0, *(float(a) for a in against))
    kind = "f" if fixed else "g"

    def side(v: float, a: float) -> int:
        return (v > a) - (v < a)

    text = f"{value:.{digits}{kind}}"
    while digits < 17 and any(side(float(text), a) != side(value, a) for a in marks):
        digits += 1
        text = f"{value:.{digits}{kind}}"
    return text


@dataclass
class StepCounts:
    """The steps of one call: what a GPU captures and replays, and the shapes and rows that decide it.

    Attributes:
        shapes: the distinct batch shapes the steps ran, ascending (exact SIS: rows per forward call; the
            gradient method: images per backward pass).
        rows: exact SIS: the rows the steps ran, padding included (``RunInfo.candidates`` are the rows backward
            selection needs); the gradient method: 0.
        captures: CUDA graphs the call captured; replays: replays it ran. With ``graphs="stand-in"`` (a CPU),
            those a GPU would capture and replay for the same call, counted by the same rule
            (:class:`~overinterp_fast.runtime.graphs.StepGraphs`).
        graphs: "cuda" (graphs captured on a GPU), "stand-in" (counted on a CPU) or "off" (graphs disabled, or an
            ONNX Runtime model: never captured).
    """

    shapes: tuple[int, ...] = ()
    rows: int = 0
    captures: int = 0
    replays: int = 0
    graphs: str = "off"


@dataclass
class RunInfo:
    """How one call ran: shared by the results of the call (``SISResult.info``, ``ResponsibilityMap.info``).

    ``info["channels_last"]`` (``in``, ``get``) reads :attr:`decisions`; ``step`` is exact and gradient SIS's, the
    other attributes exact SIS's.

    Attributes:
        decisions: what the run decided and why, one line per decision, e.g. ``{"channels_last": "off: a TorchScript
            module (...)", "estimate": "..."}``: a speed path that stepped aside for this model, the method
            ``method="auto"`` chose, the estimate of a long run (:mod:`overinterp_fast.runtime.runinfo`).
        engine: what scored the candidates ("torch", "onnxruntime", "compile"), or "incremental".
        batch_size: candidates per forward call. batch_source: how it was chosen: "user" (given), "measured" (timed
            on this device: the calibration of docs/guides/exact.md), "cached" (a calibration measured before),
            "fallback" (a job too small to time: the element budget's size).
        channels_last: the candidates ran through a channels_last copy of the model (measured faster on this
            device, or asked for).
        call_s: {batch size: seconds of one forward call} as the calibration measured them ({} where nothing was
            timed); ``rows_per_s`` gives the rates.
        layout_s: {"given", "channels_last": seconds of one call at ``batch_size``} where the format was measured.
        candidates: the candidate evaluations of the call's rounds (m (m + 1) / 2 for a round of m features).
        rescored: of those, the ones scored again in the images' dtype after ``score_dtype`` (0 without it).
        low: with ``score_dtype``: the low dtype, K (candidates re-scored per step), the margin m, the share the
            first measurement predicted, whether the low dtype was declined, its format
            (:meth:`~overinterp_fast.methods.low_precision.LowPrecision.summary`); None without it.
        step: what ran the backward-selection steps. Exact SIS: "cuda-graph" (each batch one captured CUDA graph),
            "fused" (each batch three fused ops around the forward pass), "incremental" (incremental inference),
            "low-precision" (``score_dtype``) or "evaluator" (chunked forward passes, after an out-of-memory
            error). Batched-gradient SIS: "cuda-graph" (a round's steps replayed a captured graph, on a GPU) or
            "eager" (on a CPU, with graphs off, or where the capture failed: a logged line says why).
        steps: the batch shapes, rows and CUDA graphs of the call's steps (:class:`StepCounts`; exact SIS's dense
            steps and batched-gradient SIS's), or None.
    """

    engine: str = ""
    batch_size: int = 0
    batch_source: str = ""
    channels_last: bool = False
    call_s: dict = field(default_factory=dict)
    layout_s: dict = field(default_factory=dict)
    candidates: int = 0
    rescored: int = 0
    low: dict | None = None
    step: str = ""
    decisions: dict[str, str] = field(default_factory=dict)
    steps: "StepCounts | None" = None

    def __getitem__(self, key: str) -> str:
        return self.decisions[key]

    def __contains__(self, key: object) -> bool:
        return key in self.decisions

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.decisions.get(key, default)

    @property
    def rows_per_s(self) -> dict:
        """{batch size: candidate rows per second} of the calibration's calls."""
        return {b: b / t for b, t in self.call_s.items() if t > 0}

    @property
    def rescored_share(self) -> float:
        """rescored / candidates (0 for an empty job)."""
        return self.rescored / self.candidates if self.candidates else 0.0


@dataclass(repr=False)
class SISResult:
    """One image's SIS (one round of backward selection and FindSIS).

    Attributes:
        order: int64 [m], feature ids in the order backward selection masked them
            (m = features present at the start of the round; a pixel's id is row * W + col).
        values: float64 [m], ``values[t]`` = f with only ``order[t+1:]`` present
            (the last entry: everything masked). For method="gradient": one per
            block, see ``blocks``.
        sis: int64 [k], the SIS, last-masked first; empty when the fully masked
            input already reaches the threshold; None when f(x) < threshold.
        mask: bool over the feature grid ([H, W] for the default pixel features,
            the input's element shape for other default maps, [p] for a custom
            feature map), True on the SIS; None when ``sis`` is None.
        target: the class whose probability is f.
        blocks: for method="gradient", int64 [nb + 1] offsets into ``order``: block b
            is ``order[blocks[b]:blocks[b+1]]`` and ``values[b]`` is f after masking
            blocks 0..b. None for exact SIS (every feature is its own step).
        sis_score: f with only the SIS present (for "gradient", evaluated in the
            images' dtype even when the selection ran under autocast); None without SIS.
        queries: for method="responsibility", the forward passes its maps took (the descent).
        extraction_queries: for ``sufficient_subset`` and method="responsibility", the forward
            passes of the prefix search (refine=False: steps of 10; refine=True: the boundary search).
        size_before_refine: with refine=True, the boundary prefix size before pruning (None otherwise).
        refine_queries: with refine=True, the forward passes the pruning took (None otherwise).
        minimal: with refine=True, True when the set is certified 1-minimal (the pruning
            saw every kept feature's removal fail), False when the pruning ran out of its
            query budget first (the set passes and is no larger than the boundary prefix,
            but a single feature may still be removable); None otherwise.
        score: f of the input this round started from (for round 1: the unmasked image).
        threshold: the threshold used.
        collection: with ``collection=True``, every disjoint SIS of the image in the
            order found (this result is the first); otherwise None.
        engine: what scored the candidates: "torch" (the model as given), "onnxruntime"
            or "compile". With another engine than "torch" on a torch model, ``sis`` and
            ``sis_score`` come from a check on the user's own model (docs: guides/exact.md, How it is fast).
        rescored: for exact SIS, the candidates of this round scored in the images' dtype after a lower
            ``score_dtype`` (each step's best few, and every candidate of the steps run again in the images'
            dtype after a step whose decision the low scores could not prove); 0 without ``score_dtype``
            (docs: algorithms.md, Low precision that stays exact). None for the other methods.
        info: how the call ran (:class:`RunInfo`), the same object for every result of the call: what the run
            decided and why (``info["channels_last"]``, ``info["estimate"]``, ...), and for exact SIS the engine,
            the batch size and how it was chosen, the memory format, what ran the steps, the candidates scored and
            re-scored. None for results not made by a run (read back from files, say).
    """

    order: torch.Tensor
    values: torch.Tensor
    sis: torch.Tensor | None
    mask: torch.Tensor | None
    target: int
    score: float
    threshold: float
    collection: list["SISResult"] | None = field(default=None)
    blocks: torch.Tensor | None = field(default=None)
    sis_score: float | None = field(default=None)
    queries: int | None = field(default=None)
    engine: str = field(default="torch")
    extraction_queries: int | None = field(default=None)
    size_before_refine: int | None = field(default=None)
    refine_queries: int | None = field(default=None)
    minimal: bool | None = field(default=None)
    rescored: int | None = field(default=None)
    info: RunInfo | None = field(default=None, compare=False)  # how the call ran, not what it found

    @property
    def total_queries(self) -> int | None:
        """Forward passes of the ranking, extraction and refinement together (None where not counted)."""
        parts = [q for q in (self.queries, self.extraction_queries, self.refine_queries) if q is not None]
        return sum(parts) if parts else None

    @property
    def size(self) -> int | None:
        """Number of features in the SIS (None when there is none)."""
        return None if self.sis is None else int(self.sis.numel())

    @property
    def fraction(self) -> float | None:
        """SIS size as a fraction of the features this round started with."""
        if self.sis is None:
            return None
        return self.sis.numel() / max(1, self.order.numel())

    def __repr__(self) -> str:
        extra = "" if self.collection is None else f", collection={len(self.collection)} SIS"
        return (
            f"SISResult(target={self.target}, score={score_text(self.score, self.threshold)}, "
            f"threshold={self.threshold}, "
            f"features={self.order.numel()}, sis_size={self.size}{extra})"
        )

    def _repr_html_(self) -> str:
        """A small table for notebooks (and the mask as a picture when it is a pixel grid [H, W])."""
        import html

        size = "none (f(x) < tau)" if self.sis is None else f"{self.size} of {self.order.numel()} ({self.fraction:.1%})"
        rows = [("target", self.target), ("f(x)", score_text(self.score, self.threshold)),
                ("tau", f"{self.threshold:.4g}"), ("SIS", size)]
        if self.sis_score is not None:
            rows.append(("f(SIS)", score_text(self.sis_score, self.threshold)))
        if self.collection is not None:
            rows.append(("disjoint SIS", len(self.collection)))
        if self.total_queries is not None:
            rows.append(("forward passes", self.total_queries))
        if self.minimal is not None:
            rows.append(("1-minimal", "certified" if self.minimal else "not certified"))
        cells = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                        for k, v in rows)
        picture = _mask_png(self.mask)
        img = "" if picture is None else (f"<td style='vertical-align:top;padding-left:1em'><img alt='SIS mask' "
                                          f"src='data:image/png;base64,{picture}'/></td>")
        return f"<table><tr><td><table><caption>SISResult</caption>{cells}</table></td>{img}</tr></table>"


def _mask_png(mask: torch.Tensor | None, least: int = 96) -> str | None:
    """A [H, W] mask as a base64 PNG, white on the SIS and scaled up to at least ``least`` pixels a side (nearest);
    None for other masks, or without Pillow."""
    if mask is None or mask.dim() != 2:
        return None
    try:
        from PIL import Image
    except ImportError:
        return None
    import base64
    import io

    h, w = mask.shape
    scale = max(1, -(-least // max(1, min(h, w))))
    picture = Image.fromarray(mask.detach().cpu().numpy().astype("uint8") * 255)
    buf = io.BytesIO()
    picture.resize((w * scale, h * scale), Image.NEAREST).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def first_with_collection(rounds: list[SISResult], collection: bool) -> SISResult:
    """An image's result: its first round, carrying (with ``collection``) every round that found a SIS."""
    first = rounds[0]
    if collection:
        first.collection = [r for r in rounds if r.sis is not None]
    return first


def same_sis(a: list[SISResult], b: list[SISResult]) -> bool:
    """True when two result lists have the same SIS (or both none) for every image."""
    return len(a) == len(b) and all(
        (x.sis is None) == (y.sis is None) and (x.sis is None or torch.equal(x.sis, y.sis)) for x, y in zip(a, b)
    )
