"""Low precision that stays exact: exact SIS's candidates scored in a lower dtype, its decisions taken in the full one
(docs: algorithms.md, Low precision that stays exact).

The full dtype is the images' (and the model's). A copy of the model in ``score_dtype`` (bfloat16 or float16) scores
every candidate of a step; the K candidates with the largest low-precision scores (ties: the lowest feature id) are
scored again in the full dtype, and the step's argmax (ties: the lowest feature id) is taken over those full-dtype
scores only. That argmax is the full-dtype run's when no other candidate can reach it: with m a bound on
``|f_low - f_full|``, the (K+1)-th largest low score plus m must lie strictly below both the best full score and the
best low score (then every candidate within m of the step's best low score was re-scored), and every re-scored
candidate's error must be at most m. A step that fails this check is "unsafe".

m is measured once per job on real candidates (the whole first step of the first images, best candidate included):
``SAFETY_FACTOR`` times the largest error seen, and at least ``2 * eps(score_dtype) * max |f|``. Whenever a
re-scored candidate's error exceeds m / 2, m is measured again from that step's re-scored candidates (it only grows).

K is sized from that measurement: twice the most candidates of a sampled step within m of its best, at least
``RESCORE_MIN``; a step of r candidates re-scores min(K, r) of them, so a round re-scores about 2 K / p of its
candidates (:func:`rescored_share`). K is not scaled down with r: near-ties at the low dtype's resolution do not
thin out as features leave (on CNNs at 16 x 16 pixels they grow denser), and a smaller K only made more steps
unsafe. Where the measurement predicts that more than ``MAX_SHARE`` of a round's candidates would be re-scored, the
low dtype cannot pay and every step runs in the full dtype (K = p: the plain path's work, with the measurement's cost
on top); :meth:`LowPrecision.summary` says so.

Everything per step runs on the device, with shapes the host knows in advance (K per image), so the step loop still
reads nothing: the first unsafe step of each image's round is kept on the device and read where the round ends (the
read the round needs anyway). A round with an unsafe step is run again from that step in the full dtype, and K grows
(``RESCORE_GROWTH``) for the steps that follow. The stored values are the chosen candidates' full-dtype scores, so
FindSIS compares full-dtype values with tau.
"""
from __future__ import annotations

import copy
import dataclasses
import logging

import numpy as np
import torch
from torch import nn

from ..runtime.batching import CandidateEvaluator, ChunkRunner
from ..runtime.inputs import Prepared
from ..runtime.model import Ensemble, ModelFn
from ..runtime.onnx import OnnxModel
from .gradient import top_k_present

logger = logging.getLogger(__name__)

SCORE_DTYPES = (torch.bfloat16, torch.float16)  # what candidates may be scored in, below the images' dtype
# m = SAFETY_FACTOR x the largest |f_low - f_full| measured (at least 4: the bound must hold on candidates the
# measurement never saw, with room for the spread between models, shapes and steps)
SAFETY_FACTOR = 4.0
SAMPLE_CANDIDATES = 1024  # the measurement: whole first steps of the first images, up to this many (one at least)
RESCORE_MIN = 8  # K: the fewest candidates re-scored per step
RESCORE_GROWTH = 4  # K is multiplied by this after a round had an unsafe step
# The first step's measurement predicts that more than this share of a round's candidates would be scored in the
# full dtype again: the low dtype cannot pay (each candidate would cost a low and, for most, a full forward pass),
# so every step runs in the full dtype (K = p), as the plain path does.
MAX_SHARE = 0.5


def check_score_dtype(score_dtype) -> None:
    """score_dtype: None, torch.bfloat16 or torch.float16 (or torch.float32 / torch.float64, which must then be the
    images' dtype: checked by :func:`resolve_score_dtype`)."""
    allowed = SCORE_DTYPES + (torch.float32, torch.float64)
    if score_dtype is not None and not (isinstance(score_dtype, torch.dtype) and score_dtype in allowed):
        raise ValueError(f"score_dtype must be None, torch.bfloat16 or torch.float16 (or the images' dtype), "
                         f"got {score_dtype!r}")


def resolve_score_dtype(score_dtype: torch.dtype | None, images_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype candidates are scored in first, or None for the plain path (None, or the images' own dtype)."""
    check_score_dtype(score_dtype)
    if score_dtype is None or score_dtype == images_dtype:
        return None
    if score_dtype not in SCORE_DTYPES:
        raise ValueError(f"score_dtype must be torch.bfloat16, torch.float16, None or the images' dtype "
                         f"({images_dtype}), got {score_dtype}")
    return score_dtype


class _Upcast(nn.Module):
    """``model`` (in a low dtype) with its outputs in float32, so that the softmax of f adds no low-dtype rounding."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).float()


def low_precision_fn(fn: ModelFn, dtype: torch.dtype, channels_last: bool = False) -> ModelFn:
    """f of a copy of ``fn``'s torch model converted to ``dtype`` (inputs [B, *D] in ``dtype``; f float64 [B]);
    with ``channels_last``, the copy's 4-D weights are stored channels_last (its inputs should be too)."""
    model = fn.model
    if isinstance(model, OnnxModel):
        raise ValueError("score_dtype scores candidates in a copy of the torch model converted to score_dtype; "
                         "ONNX models are not supported (leave score_dtype None)")
    members = model._callables if isinstance(model, Ensemble) else [model]
    if not all(isinstance(m, nn.Module) for m in members):
        raise ValueError(f"score_dtype needs a torch.nn.Module (a copy of it is converted to score_dtype), got "
                         f"{type(next(m for m in members if not isinstance(m, nn.Module))).__name__}")
    low = copy.deepcopy(model).to(dtype)
    if channels_last:
        low = low.to(memory_format=torch.channels_last)
    return ModelFn(_Upcast(low), outputs=fn.outputs)


def rescored_share(k: int, p: int) -> float:
    """The share of a round's p (p + 1) / 2 candidates scored in the full dtype when a step of r candidates
    re-scores min(k, r) of them: (k p - k (k - 1) / 2) / (p (p + 1) / 2), about 2 k / p for k << p (k <= p)."""
    return (k * p - k * (k - 1) / 2) / (p * (p + 1) / 2)


@dataclasses.dataclass
class _Picked:
    """The low-precision side of one step of S images: what :meth:`LowPrecision.settle` needs.

    ``feature`` int64 [S, p] (``remaining[rows, :p]``, -1 past a row's count), ``low`` float64 [S, p] (the
    low-precision scores by slot), ``top_low`` float32 [S, kk] (the kk largest low scores, ties to the lowest id),
    ``rescored`` int64 [R] (the re-scored features), ``rescore`` (K of this step)."""

    feature: torch.Tensor
    low: torch.Tensor
    top_low: torch.Tensor
    rescored: torch.Tensor
    rescore: int


class LowPrecision:
    """The low-precision scoring of one exact SIS job and its margin (see the module docstring).

    Attributes:
        dtype: the low dtype. evaluator: scores candidates in it (f float64 [B]).
        margin: float64 [] on the images' device: m. rescore: K, the candidates re-scored per step (host).
        predicted_share: the share of a round's candidates the first measurement predicts re-scored (None before
            :meth:`start`). declined: True when that share was above MAX_SHARE (then K = p).
        channels_last: the low copy's weights and inputs are stored channels_last.
    """

    def __init__(self, fn: ModelFn, prep: Prepared, targets: torch.Tensor, runner: ChunkRunner, dtype: torch.dtype,
                 channels_last: bool = False):
        fmt = torch.channels_last if channels_last else torch.preserve_format
        low_prep = dataclasses.replace(prep, images=prep.images.to(dtype, memory_format=fmt),
                                       baseline=prep.baseline.to(dtype, memory_format=fmt))
        self.dtype = dtype
        self.channels_last = channels_last
        self.evaluator = CandidateEvaluator(low_precision_fn(fn, dtype, channels_last), low_prep, targets, runner,
                                            check_indices=False)
        self.margin = prep.images.new_full((), torch.inf, dtype=torch.float64)
        self.rescore = RESCORE_MIN
        self.predicted_share: float | None = None
        self.declined = False

    def measure(self, full, present: torch.Tensor) -> torch.Tensor:
        """Set m from the whole first step of the first images, scored by ``full`` (the full-dtype evaluator) and in
        the low dtype. ``present``: bool [N, p], every feature present.

        Returns:
            float64 [2] on the device: m and the most candidates of one sampled step whose low score lies within m
            of that step's best (what :meth:`start` sizes K from; read with the run's first read).
        """
        n, p = present.shape
        images = min(n, max(1, SAMPLE_CANDIDATES // p))
        dev = present.device
        image = torch.arange(images, device=dev).repeat_interleave(p)
        feature = torch.arange(p, device=dev).repeat(images)
        f_full = full(present, image, image, feature)
        f_low = self.evaluator(present, image, image, feature)
        err = (f_low - f_full).abs().max()
        floor = 2 * torch.finfo(self.dtype).eps * f_full.abs().max()
        m = torch.maximum(SAFETY_FACTOR * err, floor)
        self.margin = torch.where(torch.isfinite(m), m, torch.inf)  # NaN: nothing is provably decided
        low = f_low.view(images, p)
        within = (low >= low.max(1, keepdim=True).values - self.margin).sum(1).max()
        return torch.stack([self.margin, within.double()])

    def start(self, measured: list[float], p: int) -> None:
        """K from :meth:`measure`'s (m, within), read on the host: twice the most candidates within m of a sampled
        step's best, in [RESCORE_MIN, p]; p (every step in the full dtype) where the share of a round's candidates
        it would re-score (:func:`rescored_share`) exceeds MAX_SHARE."""
        k = min(p, max(RESCORE_MIN, 2 * int(measured[1])))
        self.predicted_share = rescored_share(k, p)
        self.declined = self.predicted_share > MAX_SHARE
        self.rescore = p if self.declined else k
        logger.info("score_dtype=%s: m = %.3g, K = %d of p = %d (%.1f%% of the candidates re-scored)%s", self.dtype,
                    measured[0], k, p, 100 * self.predicted_share,
                    "; more than %d%%: every step in the full dtype" % (100 * MAX_SHARE) if self.declined else "")

    def grow(self, p: int) -> None:
        """A step was unsafe: re-score more candidates per step from now on (K x RESCORE_GROWTH, at most p)."""
        self.rescore = min(p, self.rescore * RESCORE_GROWTH)
        logger.info("score_dtype=%s: a step was unsafe, K = %d", self.dtype, self.rescore)

    def per_step(self, counts) -> np.ndarray:
        """The candidates re-scored in steps of ``counts`` candidates (int64 [S]): min(K, r). A step with r <= K is
        a full-dtype step."""
        return np.minimum(self.rescore, np.asarray(counts, dtype=np.int64))

    def plan(self, counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Host lists of the re-scored candidates of S images completing a low-precision step with ``counts``
        features: (pos int64 [R], the image's index in the S; rank int64 [R], 0 for its best low score), min(K, count)
        per image (:meth:`per_step`)."""
        k = self.per_step(counts)
        pos = np.repeat(np.arange(k.size, dtype=np.int64), k)
        start = np.repeat(np.cumsum(k) - k, k)
        return pos, np.arange(pos.size, dtype=np.int64) - start

    def summary(self) -> dict:
        """What the run's info records of the low dtype: dtype, K (for p features), m, the predicted share and
        whether the low dtype was declined (m is read from the device: call it after the run)."""
        return {"score_dtype": str(self.dtype).replace("torch.", ""), "rescore_k": int(self.rescore),
                "margin": float(self.margin), "predicted_share": self.predicted_share, "declined": self.declined,
                "channels_last": self.channels_last}

    def pick(self, scores: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, rank: torch.Tensor,
             present: torch.Tensor, remaining: torch.Tensor) -> _Picked:
        """The features to re-score for the steps of images ``rows`` (int64 [S]) whose low scores ``scores`` (float64
        [N, p + 1], by slot of ``remaining``) holds: rank ``rank`` of image ``pos`` (int64 [R], :meth:`plan`)."""
        p = present.shape[1]
        feature = remaining[rows, :p]
        valid = feature >= 0
        low = scores[rows, :p]
        by_feature = low.new_full((rows.shape[0], p + 1), -torch.inf, dtype=torch.float32)
        by_feature.scatter_(1, torch.where(valid, feature, p), low.float())  # f_low is float32 (_Upcast)
        by_feature = by_feature[:, :p]
        top = top_k_present(by_feature, present[rows], min(self.rescore + 1, p))  # ties: the lowest id
        return _Picked(feature, low, by_feature.gather(1, top), top[pos, rank], self.rescore)

    def settle(self, picked: _Picked, f: torch.Tensor, scores: torch.Tensor, rows: torch.Tensor,
               counts: torch.Tensor, steps: torch.Tensor, pos: torch.Tensor, rank: torch.Tensor,
               unsafe_step: torch.Tensor) -> None:
        """With the full-dtype scores ``f`` (float64 [R]) of the picked features: write the rows of ``scores`` that
        backselect_update reads (the re-scored candidates' full scores, -inf elsewhere: they cannot win), record in
        ``unsafe_step`` (int64 [N]) each image's first step that failed the check, and measure m again where a
        re-scored error exceeds m / 2. ``counts``, ``steps``: int64 [S], the rows' candidates and step index."""
        s, p = picked.feature.shape
        valid = picked.feature >= 0
        by_feature = f.new_full((s, p + 1), -torch.inf)
        by_feature[pos, picked.rescored] = f
        scores[rows, :p] = by_feature.gather(1, torch.where(valid, picked.feature, p))
        best_full = by_feature.max(1).values
        err = (picked.top_low[pos, rank].double() - f).abs()  # [R]
        row_err = f.new_zeros(picked.top_low.shape).index_put_((pos, rank), err).amax(1)  # NaN propagates
        k, m = picked.rescore, self.margin
        rest = counts > k  # rows with candidates that were not re-scored
        if picked.top_low.shape[1] > k:
            next_low = picked.top_low[:, k].double()
        else:  # K >= p: every candidate was re-scored
            next_low = torch.full_like(best_full, -torch.inf)
        decided = (next_low + m < torch.minimum(picked.top_low[:, 0].double(), best_full)) & (row_err <= m)
        decided &= (picked.low.isfinite() | ~valid).all(1)
        unsafe = rest & ~decided
        unsafe_step[rows] = torch.where(unsafe, torch.minimum(unsafe_step[rows], steps), unsafe_step[rows])
        if err.numel():
            worst = err.max()
            self.margin = torch.where(worst > m / 2, torch.maximum(m, SAFETY_FACTOR * worst), m)
