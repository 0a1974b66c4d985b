"""The public entry points: fast_sis, responsibility, sufficient_subset."""
from __future__ import annotations

import math
import time
from typing import Callable

import torch

from dataclasses import dataclass

from .runtime.batching import CandidateEvaluator, ChunkRunner, auto_batch_size, check_batch_size
from .runtime.calibration import exact_job_time
from .runtime.engines import (Engine, check_engine, incremental_calibration, incremental_pays, select_engine,
                      time_small_job)
from .methods.exact import exact_sis
from .runtime.incremental import IncrementalEvaluator
from .runtime.incremental import choose as choose_incremental
from .methods.extraction import extract_sets
from .methods.gradient import check_autocast, check_k, gradient_sis
from .methods.blocks import auto_block, check_block
from .runtime.inputs import Prepared, check_threshold, prepare
from .runtime.model import ModelFn, initial_predictions, model_memory_format
from .runtime.onnx import OnnxModel
from .methods.responsibility import ResponsibilityMap, check_responsibility_options
from .experimental.mutant_memory import check_monotone_memory
from .experimental.surrogate import check_gated_iterations, check_virtual_iterations, ranking_maps
from .methods.results import SISResult

METHODS = ("exact", "gradient", "responsibility")
BLACK_BOX_METHODS = ("exact", "responsibility")  # forward passes only: these run on ONNX models too
CRITERIA = ("top1", "threshold")


@dataclass
class _Setup:
    fn: ModelFn
    prep: Prepared
    thresholds: list[float]
    runner: ChunkRunner
    batch_size: int | None  # the user's, or None (chosen by calibration, see _engine)


def _setup(model, images, threshold, features, mask_value, outputs, batch_size, method) -> _Setup:
    """Validate the common arguments; build the model wrapper and prepared inputs."""
    batch_size = check_batch_size(batch_size)
    fn = ModelFn(model, outputs=outputs, device=images.device if isinstance(images, torch.Tensor) else "cpu")
    if (isinstance(images, torch.Tensor) and images.dim() == 4
            and model_memory_format(fn.model) == torch.channels_last):
        # candidate batches follow the model's memory format (mask_apply writes channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    prep = prepare(images, features=features, mask_value=mask_value)
    thresholds = check_threshold(threshold, prep.images.shape[0])
    if method not in BLACK_BOX_METHODS and isinstance(fn.model, OnnxModel):
        raise ValueError(
            f"method={method!r} needs gradients, and ONNX Runtime has no autograd; on ONNX models use a "
            f"black-box method: {', '.join(repr(m) for m in BLACK_BOX_METHODS)}"
        )
    fn.check_compatible(prep.images)
    first = batch_size or auto_batch_size(prep.images, total_candidates=prep.images.shape[0] * prep.num_features)
    return _Setup(fn, prep, thresholds, ChunkRunner(first, prep.images.device), batch_size)


def _engine(s: _Setup, engine: str, targets: torch.Tensor, *, max_rows: int, expected_rows: int,
            measure_fn: str = "score", exact_shape: tuple[int, int] | None = None,
            rival_s: float | None = None) -> Engine:
    """The engine and batch size for a job (engines.select_engine); the runner takes that batch size."""
    eng = select_engine(engine, s.fn, s.prep, targets, batch_size=s.batch_size, max_rows=max(1, max_rows),
                        expected_rows=expected_rows, measure_fn=measure_fn, exact_shape=exact_shape,
                        rival_s=rival_s)
    s.runner.chunk = eng.batch_size
    return eng


def _evaluators(s: _Setup, eng: Engine, targets: torch.Tensor) -> tuple[CandidateEvaluator, CandidateEvaluator | None]:
    """(the engine's evaluator of (f, top-1), the user's model's for checking sets, or None when they are one)."""
    evaluator = CandidateEvaluator(eng.fn, s.prep, targets, s.runner, measure=eng.fn.score_and_top1)
    verifier = CandidateEvaluator(s.fn, s.prep, targets, s.runner, measure=s.fn.score_and_top1) if eng.verify else None
    return evaluator, verifier


def _responsibility_rows(n: int, iterations: int | str) -> tuple[int, int]:
    """(largest batch, total rows) of responsibility maps: 14 mutants per active box and descent, about 6 levels
    (iterations="auto": one descent per image at a time, about 13 iterations on EfficientNet-Lite0)."""
    if iterations == "auto":
        return n * 14, n * 13 * 14 * 6
    return n * iterations * 14, n * iterations * 14 * 6


def _passes(criterion: str, thresholds: list[float]):
    """passes(image, f, top1): the ReX criterion (top-1 is the target) or the SIS one (f >= tau)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if criterion == "top1":
        return lambda i, f, top1: bool(top1)
    return lambda i, f, top1: f >= thresholds[i]


def _slack(criterion: str, thresholds: list[float]):
    """slack(image, f, top1, margin): how far a prefix is from passing, positive when it passes; what guides
    prefix_search="guided". top1: the margin (the target's log-odds against the strongest other class);
    threshold: log f - log tau."""
    if criterion == "top1":
        return lambda i, f, top1, margin: margin
    return lambda i, f, top1, margin: math.log(max(f, 1e-300)) - math.log(max(thresholds[i], 1e-300))


PREFIX_SEARCHES = ("guided", "scan")


def check_prefix_search(prefix_search) -> None:
    if not isinstance(prefix_search, str) or prefix_search not in PREFIX_SEARCHES:
        raise ValueError(f"prefix_search must be one of {PREFIX_SEARCHES}, got {prefix_search!r}")


REFINE = (True, False, "boundary")
REFINE_BUDGET = "auto"  # refine=True: prune sets of up to AUTO_PRUNE_FEATURES features fully, larger ones not
ITERATIONS = 8  # method="responsibility": descents per image by default (see README, minimal pixel sets)


def _check_flag(name: str, value, none: bool) -> None:
    """``value`` must be True or False (or None, with ``none``): the objects themselves, not 1 or 0."""
    allowed = (None, True, False) if none else (True, False)
    if not any(value is v for v in allowed):
        names = "None, True or False" if none else "True or False"
        raise ValueError(f"{name} must be {names}, got {value!r}")


def _check_refine(refine, budget=None) -> None:
    if not any(refine is r or (isinstance(refine, str) and refine == r) for r in REFINE):
        raise ValueError(f"refine must be True, False or 'boundary', got {refine!r}")
    if budget is not None and not (isinstance(budget, str) and budget == "auto") and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise ValueError(f"refine_budget must be 'auto', an int >= 0 or None, got {budget!r}")


def _check_pixels(s: _Setup, what: str) -> None:
    if s.prep.images.dim() != 4 or s.prep.grid_shape != tuple(s.prep.images.shape[-2:]):
        hint = "; images must have a batch dimension: pass images[None]" if s.prep.images.dim() == 3 else ""
        raise ValueError(f"{what} works on images [N, C, H, W] with the default pixel features (features=None){hint}")


def responsibility(
    model,
    images: torch.Tensor,
    *,
    iterations: int = 20,
    seed: int = 0,
    depth: int = 10,
    min_box: int = 10,
    target: int | torch.Tensor | None = None,
    mask_value: float | torch.Tensor = 0.0,
    criterion: str = "top1",
    threshold: float | list[float] | torch.Tensor = 0.9,
    outputs: str = "logits",
    batch_size: int | None = None,
    progress: bool | None = None,
    engine: str = "auto",
    monotone: bool = False,
    virtual_iterations: int = 0,
    gated_iterations: int = 0,
    monotone_memory: bool = False,
) -> list[ResponsibilityMap]:
    """Causal responsibility maps (paper 002, ReX 0.4.1's algorithm; SPEC.md section 3a). Black box.

    Args:
        model: torch model, callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or :class:`OnnxModel`.
        images: [N, C, H, W], normalized as the model expects.
        iterations: independent random descents per image (seeded by seed + i, ``seed`` an int >= 0), run
            together.
        depth: levels per descent at most. min_box: boxes with a smaller area (pixels) are not split.
        criterion: a mutant passes when its top-1 class is the target ("top1", ReX's)
            or when f >= threshold ("threshold").
        batch_size: mutants per forward call (None: calibrated, see README "Batch size").
        engine: "auto", "torch", "onnxruntime" or "compile" (see README "Engines").
        monotone: False (default): score every mutant, as ReX. True: skip the mutants none of
            whose supersets passed (see :func:`~overinterp_fast.methods.responsibility.descend`).
        virtual_iterations: after the real descents, this many more per image on a surrogate of the
            criterion fitted to the mutants they scored, at no query, their log maps added
            (:mod:`overinterp_fast.experimental.surrogate`; the map is then an estimate of ReX's). 0 (default): none.
        gated_iterations: after the ``iterations`` real descents, this many more per image (seeds
            seed + iterations + t) in which a surrogate refitted to every mutant scored so far answers
            the mutants it is sure of and the model only the others
            (:func:`~overinterp_fast.experimental.surrogate.add_gated_descents`; an estimate of ReX's map). 0 (default): none.
        monotone_memory: False (default). True (``criterion="top1"`` only): the ``iterations`` real descents
            run in waves, and a mutant that keeps every pixel of a mutant that passed before (same image), or
            no pixel outside one that failed, takes that answer without a query
            (:mod:`overinterp_fast.experimental.mutant_memory`; an estimate of ReX's map: the criterion is not monotone).

    Returns:
        One :class:`ResponsibilityMap` per image: ``map`` float64 [H, W] (the sum over
        iterations of log(per-iteration map); rank pixels by it) and the ``queries`` used.
    """
    check_responsibility_options(iterations, depth, min_box, seed)
    _check_flag("monotone", monotone, none=False)
    check_virtual_iterations(virtual_iterations)
    check_gated_iterations(gated_iterations, iterations)
    _check_flag("monotone_memory", monotone_memory, none=False)
    check_monotone_memory(monotone_memory, iterations, criterion)
    check_engine(engine)
    s = _setup(model, images, threshold, None, mask_value, outputs, batch_size, "responsibility")
    _check_pixels(s, "responsibility")
    passes = _passes(criterion, s.thresholds)
    with torch.inference_mode():
        targets, _ = initial_predictions(s.fn, s.prep.images, target, s.runner)
        n, p = s.prep.images.shape[0], s.prep.num_features
        max_rows, expected = _responsibility_rows(n, iterations)
        eng = _engine(s, engine, targets, max_rows=max_rows, expected_rows=expected, measure_fn="score_and_top1")
        evaluator, _ = _evaluators(s, eng, targets)
        present = torch.ones((n, p), dtype=torch.bool, device=s.prep.images.device)
        maps, queries = ranking_maps(evaluator, s.prep, present, passes, iterations, depth, min_box, seed, progress,
                                     monotone, virtual_iterations, gated_iterations, monotone_memory)
    return [ResponsibilityMap(maps[i].cpu(), queries[i], int(targets[i]), iterations) for i in range(n)]


def sufficient_subset(
    model,
    images: torch.Tensor,
    ranking: torch.Tensor,
    threshold: float | list[float] | torch.Tensor = 0.9,
    *,
    criterion: str = "threshold",
    step: int = 1,
    target: int | torch.Tensor | None = None,
    mask_value: float | torch.Tensor = 0.0,
    features: torch.Tensor | None = None,
    outputs: str = "logits",
    batch_size: int | None = None,
    engine: str = "auto",
    refine: bool | str = False,
    refine_budget: int | str | None = REFINE_BUDGET,
) -> list[SISResult]:
    """Turn any ranking (saliency map, gradients, responsibility) into a sufficient set: batched FindSIS.

    Args:
        ranking: scores per feature, [N, *grid] or [N, p]; higher = kept first
            (ties: the higher feature id first, as ReX).
        criterion: "threshold" (f >= threshold, the SIS criterion) or "top1"
            (the top-1 class is the target, ReX's).
        step: prefix sizes step, step*2, ..., p (ReX uses 10).
        engine: "auto", "torch", "onnxruntime" or "compile" (see README "Engines"); every
            set is checked on the user's model.
        refine: False: the first passing prefix in steps of ``step``. True: a feature-exact
            boundary prefix (exponential search and bisection, about 2 log2(size) queries;
            ``step`` unused), pruned to a 1-minimal set (removing any one feature breaks
            the criterion; ``size_before_refine``, ``refine_queries`` report it).
            "boundary": the feature-exact boundary prefix only (no pruning).
        refine_budget: refine=True: the most pruning queries per image (None: no limit; "auto",
            the default: no limit for sets of up to 256 features, no pruning of larger ones).
            ``SISResult.minimal`` is True when the set is certified 1-minimal, False when
            the budget ran out first (the set passes and is smaller, but not certified).

    Returns:
        One :class:`SISResult` per image: ``order`` the features by descending
        score, ``values`` their scores, ``sis`` the first passing prefix (None if
        even all features fail), ``sis_score`` = f on it.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be a positive int, got {step!r}")
    check_engine(engine)
    _check_refine(refine, refine_budget)
    s = _setup(model, images, threshold, features, mask_value, outputs, batch_size, "exact")
    n, p = s.prep.images.shape[0], s.prep.num_features
    if not isinstance(ranking, torch.Tensor) or ranking.shape[0] != n or ranking[0].numel() != p:
        raise ValueError(f"ranking must be a tensor [N, *grid] with {p} scores per image")
    scores = ranking.detach().reshape(n, p).to(s.prep.images.device, torch.float64)
    if not bool(torch.isfinite(scores).all()):
        raise ValueError("ranking contains NaN or inf")
    passes = _passes(criterion, s.thresholds)
    with torch.inference_mode():
        targets, scores0 = initial_predictions(s.fn, s.prep.images, target, s.runner)
        rounds = min(-(-p // step), 64)
        eng = _engine(s, engine, targets, max_rows=n * min(rounds, 32), expected_rows=n * rounds,
                      measure_fn="score_and_top1")
        evaluator, verifier = _evaluators(s, eng, targets)
        return extract_sets(evaluator, s.prep, targets, scores0, lambda present: (scores, None), passes, step,
                            False, s.thresholds, verifier=verifier, engine=eng.name, refine=refine,
                            refine_budget=refine_budget)


def fast_sis(
    model: torch.nn.Module | Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    threshold: float | list[float] | torch.Tensor = 0.9,
    *,
    method: str = "exact",
    target: int | torch.Tensor | None = None,
    mask_value: float | torch.Tensor = 0.0,
    features: torch.Tensor | None = None,
    collection: bool = False,
    batch_size: int | None = None,
    outputs: str = "logits",
    progress: bool | None = None,
    k: int = 100,
    autocast: str | torch.dtype | None = None,
    criterion: str | None = None,
    iterations: int | str = ITERATIONS,
    seed: int = 0,
    engine: str = "auto",
    refine: bool | str = True,
    refine_budget: int | str | None = REFINE_BUDGET,
    incremental: bool | None = None,
    block: int | str = "auto",
    monotone: bool | None = None,
    virtual_iterations: int = 0,
    gated_iterations: int = 0,
    prefix_search: str = "guided",
    monotone_memory: bool = False,
) -> list[SISResult]:
    """Sufficient Input Subsets of every image (SPEC.md sections 1 and 2).

    Args:
        model: ``torch.nn.Module`` (in eval mode) or callable mapping [B, *D] to
            logits [B, K]; a list of models is an ensemble (mean of logits).
        images: [N, *D] floating tensor ([N, C, H, W] for images), already
            normalized as the model expects. Computation runs in its dtype and on
            its device; channels_last is kept for the candidate batches.
        threshold: tau in [0, 1]: the SIS keeps f >= tau. A number, or one per
            image (a sequence or tensor [N]; e.g. 0.9 * f(x) for relative thresholds).
        method: "exact" (backward selection over every feature, p(p+1)/2
            forward passes per image) or "gradient" (batched-gradient SIS for
            large images, paper 000 section S5: about p / k backward passes per
            image, all images of a batch in one; needs a torch model).
        target: class whose probability is f; None = the class predicted on the
            unmasked image. An int, or one per image (int64 [N]).
        mask_value: what masked elements become: a number (default 0, the
            dataset mean after normalization), one value per channel ([C]), or
            a baseline tensor ([*D], [1, *D] or [N, *D]).
        features: None = one feature per pixel across channels ([C, H, W]
            inputs; id = row * W + col) or per element (other shapes); or an
            integer feature map broadcastable to [*D] with ids 0..p-1 (patches,
            superpixels, tokens), as Captum's ``feature_mask``.
        collection: also find every further disjoint SIS (SPEC.md section 1).
        batch_size: candidates per forward call (None: chosen by a short timed
            calibration per model and input shape, cached for the process; on CUDA
            bounded by free memory; out-of-memory errors shrink it).
        outputs: "logits" (f = softmax probability) or "probabilities".
        progress: show a progress bar (None: only on a terminal).
        k: method="gradient": features masked per gradient step (default 100).
        autocast: method="gradient": None, "bf16" or "fp16" for the gradient
            steps; FindSIS and every SIS's verification run in the images' dtype.
        criterion: method="responsibility": "top1" (default, ReX's: the minimal
            pixel set restores the top-1 class; ``threshold`` is then unused) or
            "threshold" (f >= threshold).
        iterations, seed: method="responsibility": descents per image and their seed (an int >= 0).
            An int runs that many (default 8: about 450 queries per image at 224x224 with
            ``monotone``, a quarter of ReX's 20; see README.md "Minimal pixel sets" for the
            measured trade-off between iterations, queries and agreement with ReX). "auto": stop
            an image's descents once its top-ranked pixels have settled (see
            :func:`~overinterp_fast.methods.responsibility.auto_responsibility`; median 13).
        monotone: method="responsibility": score the mutants of each split in three rounds
            (3 quadrants kept, then 2, then 1) and take a mutant none of whose scored
            supersets passed as failing, without a query (see
            :func:`~overinterp_fast.methods.responsibility.descend`): about 30% fewer descent
            queries for the same maps where passing is monotone in the pixels kept (on
            EfficientNet-Lite0, 1.3% of the passing mutants were missed). None (default):
            on, except with refine=False (ReX's algorithm scores every mutant).
        virtual_iterations: method="responsibility": after the real descents, this many more
            per image on a surrogate of the criterion (a logistic model per image on the share
            of each cell of a 14x14 grid kept, fitted to the mutants the real descents scored),
            at no query; the ranking adds their log maps (:mod:`overinterp_fast.experimental.surrogate`).
            0 (default): none. The sets are extracted and checked on the model as always.
        gated_iterations: method="responsibility" with an int ``iterations``: after the real
            descents, this many more per image (seeds seed + iterations + t) in which the surrogate,
            refitted before each to every mutant the model has scored, answers the mutants it is sure
            of (probability of passing at most 0.05 or at least 0.95) and the model the others
            (:func:`~overinterp_fast.experimental.surrogate.add_gated_descents`): descents at about half the
            queries, whose maps estimate ReX's. 0 (default): none. Measured in README.md ("Gated
            descents"): with ``iterations=4, gated_iterations=9, virtual_iterations=100`` the same
            queries as the defaults and more agreement with ReX, at about 1.3x the time.
        block: method="responsibility" with refine=True or "boundary": rank the pixels
            square by square, squares of ``block`` x ``block`` pixels by their mean
            responsibility (:func:`~overinterp_fast.methods.blocks.block_positions`), and scan
            the ranking one square at a time (where a square holds 10 pixels or more)
            before the pixel-exact boundary. "auto" (default): about a 28x28 grid
            (8 at 224x224, 1 below about 40x40); 1: pixel by pixel. ReX's extraction
            (refine=False) always ranks pixels.
        engine: what scores the candidates of method="exact"/"responsibility":
            "auto" (default: torch, or ONNX Runtime where the job is long enough and
            it is measured faster), "torch", "onnxruntime" (export once, cached) or
            "compile" (torch.compile). Every SIS is checked on the user's model
            (f(x_S) >= tau; where it fails, FindSIS goes on until one passes);
            ``SISResult.engine`` says which engine scored the candidates.
            method="gradient" runs torch ("auto" or "torch" only).
        refine: method="responsibility": True (default): a pixel-exact boundary prefix of
            the ranking, pruned towards a 1-minimal set (removing any one pixel breaks the
            criterion). Certifying 1-minimality costs at least one query per pixel of the
            result, so the pruning stops after ``refine_budget`` queries per image (None: no
            limit; "auto", the default: sets of up to 256 pixels are pruned without limit, larger
            ones are not pruned: at 224x224, where sets hold thousands of pixels, certifying
            costs more than the whole search); ``SISResult.minimal`` says whether the set is certified
            1-minimal (True) or the budget ran out first (False). "boundary": the
            pixel-exact boundary prefix only (about 2 log2(size) queries; not 1-minimal).
            False: ReX's extraction (the first passing prefix in steps of 10).
            ReX-faithful: ``iterations=20, refine=False``.
        prefix_search: method="responsibility" with refine=True: how the boundary's last step is
            found. "guided" (default): the first prefix of the ranking, in steps of 10 pixels, that
            passes (ReX's extraction of this ranking), found from the margin of a few tried prefixes
            (:mod:`~overinterp_fast.methods.guided`: every 32nd size, then bisection only where the margin says
            a passing size may lie; a median of 95 queries at 224x224, where the scan costs 547; on
            105 rankings of EfficientNet-Lite0 it returned the scan's answer in 104; a miss gives a
            later passing prefix, never a failing one). "scan": the square scan
            (one square at a time over the first 64 squares, then steps of 10%; ``block``), which
            steps over narrow passing windows and gives larger sets.
        monotone_memory: method="responsibility" with an int ``iterations`` and the "top1" criterion:
            the real descents run in waves (descent t of every image in wave t), and a mutant that
            keeps every pixel of a mutant of its image that passed before, or no pixel outside one
            that failed, takes that answer without a query (:mod:`overinterp_fast.experimental.mutant_memory`).
            False (default). Measured in README.md ("Monotone memory"): about 12% of those answers
            are wrong on EfficientNet-Lite0, so the map estimates ReX's; with ``iterations=8,
            gated_iterations=9, virtual_iterations=100`` the sets agree with ReX's better than ReX's
            own seeds do (Dice 0.58 against 0.55) for about 1/4 of ReX's queries, but are larger
            than ReX's (median 13.3% of the image against 11.6%).
        incremental: method="exact": score each candidate by recomputing only the
            part of each layer its masked feature reaches (SPEC.md section 7; the
            model is traced with torch.fx; runs on the torch model, so it takes the
            place of ``engine``). None (default): where the model traces and timing
            predicts the job runs faster than on the dense engine (plans estimated at
            more than a dense pass are not timed; jobs too small to time, or with the
            user's ``batch_size``, go by the estimate: at most half a dense pass),
            unless ``engine`` names another engine; True: always (a clear error when
            the model cannot be traced); False: never.

    Returns:
        A list with one :class:`SISResult` per image (tensors on the CPU).
        Images with f(x) < threshold get ``sis=None`` (their backward-selection
        ``order``/``values`` are still computed); the others are unaffected.

    For method="gradient", ``values`` has one entry per block and ``blocks``
    gives the block offsets into ``order``; every SIS is verified by a forward
    pass in full precision (``sis_score`` >= threshold). For
    method="responsibility", ``order`` ranks the pixels by responsibility,
    ``values`` holds it, ``sis``/``mask`` is the minimal pixel set, ``queries``,
    ``extraction_queries`` and ``refine_queries`` the forward passes of the maps, of the
    prefix search and of the pruning, ``size_before_refine`` the prefix size before it,
    ``minimal`` whether the pruning certified the set 1-minimal.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "gradient":
        k = check_k(k)
        autocast_dtype = check_autocast(autocast)
    if method == "responsibility":
        check_responsibility_options(1 if iterations == "auto" else iterations, 10, 10, seed)
        _check_refine(refine, refine_budget)
        check_block(block)
        _check_flag("monotone", monotone, none=True)
        check_virtual_iterations(virtual_iterations)
        check_gated_iterations(gated_iterations, iterations)
        check_prefix_search(prefix_search)
        _check_flag("monotone_memory", monotone_memory, none=False)
        check_monotone_memory(monotone_memory, iterations, criterion or "top1")
    check_engine(engine)
    _check_flag("incremental", incremental, none=True)
    if incremental and engine not in ("auto", "torch"):
        raise ValueError(f"incremental=True runs the torch model; engine must be 'auto' or 'torch', got {engine!r}")
    if method == "gradient" and engine not in ("auto", "torch"):
        raise ValueError(f"method='gradient' needs the torch model's gradients; engine must be 'auto' or 'torch', "
                         f"got {engine!r}")
    s = _setup(model, images, threshold, features, mask_value, outputs, batch_size, method)
    fn, prep, thresholds, runner = s.fn, s.prep, s.thresholds, s.runner
    n, p = prep.images.shape[0], prep.num_features
    if method == "gradient":
        with torch.no_grad():
            targets, scores0 = initial_predictions(fn, prep.images, target, runner)
            # FindSIS's prefix batches: calibrated like the others (small jobs keep the fallback size)
            _engine(s, "torch", targets, max_rows=n * 32, expected_rows=n * (-(-p // k) + 1),
                    measure_fn="score_and_top1")
        return gradient_sis(fn, prep, targets, scores0, thresholds=thresholds, collection=collection, k=k,
                            runner=runner, autocast=autocast_dtype, progress=progress)
    if method == "responsibility":
        _check_pixels(s, 'method="responsibility"')
        passes = _passes(criterion or "top1", thresholds)
        with torch.inference_mode():
            targets, scores0 = initial_predictions(fn, prep.images, target, runner)
            max_rows, expected = _responsibility_rows(n, iterations)
            eng = _engine(s, engine, targets, max_rows=max_rows, expected_rows=expected, measure_fn="score_and_top1")
            evaluator, verifier = _evaluators(s, eng, targets)

            skip = refine is not False if monotone is None else monotone

            def rank(present):
                maps, queries = ranking_maps(evaluator, prep, present, passes, iterations, 10, 10, seed, progress,
                                             skip, virtual_iterations, gated_iterations, monotone_memory)
                return maps.view(maps.shape[0], -1), queries

            side = auto_block(*prep.images.shape[-2:]) if block == "auto" else block
            return extract_sets(evaluator, prep, targets, scores0, rank, passes, 10, collection, thresholds,
                                verifier=verifier, engine=eng.name, refine=refine, refine_budget=refine_budget,
                                refine_scan=10, block=side,
                                guide=_slack(criterion or "top1", thresholds) if prefix_search == "guided" else None)
    with torch.inference_mode():
        t0 = time.perf_counter()
        targets, scores0 = initial_predictions(fn, prep.images, target, runner)
        first_pass_s = time.perf_counter() - t0
        pl = choose_incremental(fn, prep, incremental if engine in ("auto", "torch") else False)
        eng = None
        if pl is not None:
            icl = incremental_calibration(pl, fn, prep, targets, batch_size=s.batch_size, exact_shape=(n, p))
            if incremental is None:  # auto: time it against the dense engine (no ONNX export when it is short)
                rival = exact_job_time(icl.times, icl.batch_size, n, p) if icl.times else None
                eng = _engine(s, engine, targets, max_rows=n * p, expected_rows=n * p * (p + 1) // 2,
                              exact_shape=(n, p), rival_s=rival)
                icl, eng = time_small_job(pl, fn, prep, targets, icl, eng, (n, p), first_pass_s)
            if eng is None or incremental_pays(pl, icl, eng, (n, p)):
                runner.chunk = icl.batch_size
                return exact_sis(fn, prep, targets, scores0, thresholds=thresholds, collection=collection,
                                 batch_size=runner.chunk, runner=runner, progress=progress, engine="torch",
                                 evaluator=IncrementalEvaluator(pl, fn, prep, targets, runner))
        if eng is None:
            eng = _engine(s, engine, targets, max_rows=n * p, expected_rows=n * p * (p + 1) // 2, exact_shape=(n, p))
        return exact_sis(
            eng.fn,
            prep,
            targets,
            scores0,
            thresholds=thresholds,
            collection=collection,
            batch_size=eng.batch_size,
            runner=runner,
            progress=progress,
            verifier=CandidateEvaluator(fn, prep, targets, runner, measure=fn.score_and_top1) if eng.verify else None,
            engine=eng.name,
        )
