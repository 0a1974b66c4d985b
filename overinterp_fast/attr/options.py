"""The options of every method: one frozen dataclass per method, checked when made, the single source of the
defaults (the :mod:`overinterp_fast.attr` classes and :func:`overinterp_fast.fast_sis` take their defaults from
here). A bad value is a one-line ValueError naming the option.

    opts = MinimalPixelSetOptions(iterations=20, refine=False)   # ReX's extraction
    of.fast_sis(model, images, method="responsibility", options=opts)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..methods.blocks import check_block
from ..methods.gradient import check_autocast, check_k
from ..methods.low_precision import check_score_dtype
from ..methods.responsibility import check_responsibility_options
from ..runtime.engines import check_engine
from ..runtime.job import check_criterion, check_flag, check_prefix_search, check_refine, check_step


@dataclass(frozen=True)
class RunOptions:
    """What every method shares: the threshold, the model's outputs, the engine, the batch size, collections.

    Attributes:
        threshold: tau in [0, 1] (a number, or one per image: a sequence or tensor [N]).
        outputs: "logits" (f = softmax probability) or "probabilities".
        engine: "auto", "torch", "onnxruntime" or "compile" (docs: guides/exact.md).
        batch_size: candidates per forward call (None: calibrated).
        collection: also find every further disjoint set.
    """

    threshold: float | list[float] | torch.Tensor = 0.9
    outputs: str = "logits"
    engine: str = "auto"
    batch_size: int | None = None
    collection: bool = False

    def __post_init__(self):
        check_engine(self.engine)


def criterion_threshold(threshold, criterion: str, where: str, switch: str = "criterion='threshold'"):
    """The threshold of a run whose sets pass by ``criterion``: ``threshold``, or :class:`RunOptions`' default
    where it is None (not given). A threshold given with criterion "top1" is refused in one line: that criterion
    (a set passes when it restores the model's top-1 class, ReX's) has no threshold, so the value would be
    ignored; the caller gives criterion="threshold" with it (``switch`` says how), or leaves it out. (``where``
    names the caller.)"""
    if threshold is None:
        return RunOptions.threshold
    if isinstance(criterion, str) and criterion == "top1":
        raise ValueError(f"{where}: a threshold applies with criterion='threshold' (f(x_S) >= tau); the criterion "
                         f"is 'top1' (the set restores the top-1 class, as ReX), which has no threshold: give "
                         f"{switch} with it, or leave threshold out")
    return threshold


@dataclass(frozen=True)
class ExactOptions:
    """Options of exact SIS (docs: algorithms.md, Exact SIS).

    Attributes:
        incremental: score each candidate by recomputing only the part of each layer its masked feature reaches
            (docs: algorithms.md, Incremental inference; runs the torch model, so it takes the place of the
            engine). None: where the model traces and timing predicts it is faster (not tried where the dense job
            is predicted under a second); True: always; False: never.
        score_dtype: None, or torch.bfloat16 / torch.float16: score every candidate first in a copy of the torch
            model in that dtype, and again in the images' dtype only those whose low score lies near the step's best
            (docs: algorithms.md, Low precision that stays exact). The result is the one of the images' dtype:
            the same order, values, sets and collection; ``SISResult.rescored`` counts the candidates scored twice.
            The images' own dtype (or None) is the plain path. It runs the torch model (engine "auto" or "torch";
            not on ONNX models) without incremental inference (incremental=True is refused with it).
        channels_last: run the candidates through a copy of the torch model with its convolution weights stored
            channels_last (the model given is not converted). None (auto, default): where one call at the job's
            batch size measures at least 5% faster so, on a GPU or a CPU, for 4-D images that are not float64 (a
            model whose copy fails to run keeps its format). True: always (4-D images, a torch model with
            convolutions); False: never. With ``score_dtype``
            it applies to the low-precision copy, measured on that copy. ``SISResult.info`` records the choice.
    """

    incremental: bool | None = None
    score_dtype: torch.dtype | None = None
    channels_last: bool | None = None

    def __post_init__(self):
        check_flag("incremental", self.incremental, none=True)
        check_score_dtype(self.score_dtype)
        check_flag("channels_last", self.channels_last, none=True)


@dataclass(frozen=True)
class GradientOptions:
    """Options of batched-gradient SIS (docs: algorithms.md, Batched-gradient SIS).

    Only the gradient steps (BackSelect's backward passes) change with ``autocast`` and ``channels_last``: FindSIS
    and every SIS's check run the model as given, in the images' dtype, so every SIS returned passes
    f(x_S) >= threshold in full precision whatever these options are.

    Attributes:
        k: features masked per gradient step (an int >= 1).
        autocast: the gradient steps' mixed precision: "auto" (default: bf16 for float32 images on a CUDA device
            that supports it or on a CPU with bf16 hardware, AVX512-BF16 or AMX; none elsewhere), None or False
            (none: the float32 ranking), "bf16" or "fp16".
        channels_last: the gradient steps' memory format for 4-D inputs. None (auto, default): channels_last
            when the model is an nn.Module with convolution weights not stored channels_last and the images are
            not float64; True: channels_last for any 4-D input; False: the inputs' own format. The model is not
            converted: its 4-D weights are copied once in channels_last (and, under autocast, its conv and linear
            weights once in the autocast dtype) and put in its place for each round of gradient steps, then put
            back (:class:`~overinterp_fast.methods.gradient.ChannelsLastModel`,
            :class:`~overinterp_fast.methods.gradient.LaidOutWeights`).
    """

    k: int = 100
    autocast: str | torch.dtype | None = "auto"
    channels_last: bool | None = None

    def __post_init__(self):
        check_k(self.k)
        check_autocast(self.autocast)
        check_flag("channels_last", self.channels_last, none=True)


@dataclass(frozen=True)
class ResponsibilityOptions:
    """Options of causal responsibility maps (ReX's algorithm; docs: algorithms.md, Causal responsibility and
    minimal pixel sets).

    Attributes:
        iterations: independent random descents per image (seeds seed + t), run together (an int >= 1).
        seed: the first descent's seed (an int >= 0).
        depth: levels per descent at most. min_box: boxes with a smaller area (pixels) are not split.
        criterion: a mutant passes when its top-1 class is the target ("top1", ReX's) or when f >= threshold
            ("threshold").
        monotone: True: skip the mutants none of whose supersets passed (see
            :func:`~overinterp_fast.methods.responsibility.descend`). None ("auto"): off for plain maps, as
            ReX. False: every mutant is scored.
    """

    iterations: int = 8
    seed: int = 0
    depth: int = 10
    min_box: int = 10
    criterion: str = "top1"
    monotone: bool | None = None

    def __post_init__(self):
        check_responsibility_options(self.iterations, self.depth, self.min_box, self.seed)
        check_flag("monotone", self.monotone, none=True)
        check_criterion(self.criterion)


@dataclass(frozen=True)
class MinimalPixelSetOptions:
    """Options of minimal pixel sets: a responsibility ranking (depth 10, boxes of 10 pixels, as ReX) and a
    sufficient set extracted from it (docs: algorithms.md, Causal responsibility and minimal pixel sets).

    Attributes:
        iterations: descents per image (an int >= 1), or "auto": stop an image's descents once its top-ranked
            pixels have settled (:func:`~overinterp_fast.methods.responsibility.auto_responsibility`).
        seed: the first descent's seed (an int >= 0).
        criterion: "top1" (ReX's: the set restores the top-1 class) or "threshold" (f >= threshold).
        monotone: see :class:`ResponsibilityOptions`; None ("auto"): on, except with refine=False (ReX's
            algorithm scores every mutant).
        refine: True: a pixel-exact boundary prefix pruned towards a 1-minimal set; "boundary": the boundary
            prefix only; False: ReX's extraction (the first passing prefix in steps of 10).
        refine_budget: the most pruning queries per image (None: no limit; "auto": sets of up to 256 pixels are
            pruned without limit, larger ones are not pruned).
        block: rank the pixels square by square, squares of ``block`` x ``block`` pixels ("auto": about a
            28 x 28 grid; 1: pixel by pixel); refine=True or "boundary" only.
        prefix_search: "guided" (the first passing prefix in steps of 10, found from the margins of a few tried
            prefixes) or "scan" (one square at a time).
    """

    iterations: int | str = 8
    seed: int = 0
    criterion: str = "top1"
    monotone: bool | None = None
    refine: bool | str = True
    refine_budget: int | str | None = "auto"
    block: int | str = "auto"
    prefix_search: str = "guided"

    def __post_init__(self):
        check_responsibility_options(1 if self.iterations == "auto" else self.iterations, 10, 10, self.seed)
        check_refine(self.refine, self.refine_budget)
        check_block(self.block)
        check_flag("monotone", self.monotone, none=True)
        check_prefix_search(self.prefix_search)
        check_criterion(self.criterion)


@dataclass(frozen=True)
class SubsetOptions:
    """Options of sufficient subsets of a ranking (docs: algorithms.md, Sufficient subsets of a ranking).

    Attributes:
        criterion: "threshold" (f >= threshold: the sets are SIS) or "top1" (the top-1 class is the target).
        step: refine=False: prefix sizes step, step*2, ..., p (ReX uses 10).
        refine: True: a feature-exact boundary prefix pruned to a 1-minimal set; "boundary": the boundary prefix
            only; False: the first passing prefix in steps of ``step``.
        refine_budget: see :class:`MinimalPixelSetOptions`.
    """

    criterion: str = "threshold"
    step: int = 1
    refine: bool | str = True
    refine_budget: int | str | None = "auto"

    def __post_init__(self):
        check_step(self.step)
        check_refine(self.refine, self.refine_budget)
        check_criterion(self.criterion)
