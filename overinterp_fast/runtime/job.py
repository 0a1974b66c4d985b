"""One job's set-up, shared by every public entry point (the :mod:`overinterp_fast.attr` classes and the function
forms in :mod:`overinterp_fast.api`): the model wrapper and prepared inputs, the engine and batch size, the
evaluators, the pass criteria, and the checks of the options they share."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from . import graphs, model_state
from .batching import (CandidateEvaluator, ChunkRunner, auto_batch_size, check_batch_size, ladder,
                       power_of_two_ceil, power_of_two_floor)
from .engines import Engine, select_engine
from .inputs import Prepared, check_threshold, prepare
from .model import ModelFn, model_memory_format
from .onnx import OnnxModel

BLACK_BOX_METHODS = ("exact", "responsibility")  # forward passes only: these run on ONNX models too
CRITERIA = ("top1", "threshold")
PREFIX_SEARCHES = ("guided", "scan")
REFINE = (True, False, "boundary")
# The batch shapes of each method's forward calls: the ladder (batching.ladder: a few powers of two, the same for
# every job of a model) for responsibility maps and minimal pixel sets, whose jobs make many small calls of every
# size; the others pad to their runner's buckets (batching.bucket).
LADDER_METHODS = ("responsibility",)


@dataclass
class Setup:
    """A job's validated pieces.

    Attributes:
        fn: the user's model, wrapped. prep: the prepared images [N, *D], baseline and features.
        thresholds: one per image. runner: runs chunks of rows with out-of-memory back-off.
        batch_size: the user's, or None (chosen by calibration, see :func:`choose_engine`).
        top: the largest batch shape of the ladder policy (:data:`LADDER_METHODS`), or None (buckets).
    """

    fn: ModelFn
    prep: Prepared
    thresholds: list[float]
    runner: ChunkRunner
    batch_size: int | None
    top: int | None = None


def setup(model, images, threshold, features, mask_value, outputs, batch_size, method) -> Setup:
    """Validate the common arguments; build the model wrapper and prepared inputs.

    Args:
        model: torch model, callable, ``.onnx`` path, ``onnxruntime.InferenceSession`` or OnnxModel.
        images: [N, *D] floating tensor. threshold: a number in [0, 1] or one per image.
        features: None or an integer feature map broadcastable to [*D]. mask_value: the baseline.
        outputs: "logits" or "probabilities". batch_size: None or an int >= 1.
        method: "exact", "gradient" or "responsibility" (only the black-box ones run on ONNX models).
    """
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
    top = ladder_top(fn, prep, batch_size) if method in LADDER_METHODS else None
    if top is not None:
        first = min(power_of_two_floor(first), top)
    runner = ChunkRunner(first, prep.images.device)
    fixed_shapes(fn, runner, top)
    return Setup(fn, prep, thresholds, runner, batch_size, top)



def ladder_top(fn: ModelFn, prep: Prepared, batch_size: int | None) -> int:
    """The largest batch shape of a ladder job (batching.ladder_sizes): the user's batch size rounded down to a
    power of two; else the size auto_batch_size gives a job of any length (the element budget on a CPU, the free
    memory on a GPU), rounded down, decided by the model's first job on images of this shape, dtype and device
    and kept for its later jobs, so that every job of the model takes the same few shapes."""
    if batch_size is not None:
        return power_of_two_floor(batch_size)
    images = prep.images
    key = (tuple(images.shape[1:]), images.dtype, str(images.device))
    state = model_state.state_of(fn.model)  # the model's state keeps it ({(element shape, dtype, device): top})
    tops = {} if state is None else state.table("top")
    if key not in tops:
        tops[key] = power_of_two_floor(auto_batch_size(images, 1 << 30))
    return tops[key]


def fixed_shapes(fn: ModelFn, runner: ChunkRunner, top: int | None = None) -> None:
    """Pad ``fn``'s forward calls to a few batch shapes, except on ONNX Runtime, whose sessions do not plan per
    shape (and are never captured): the runner's buckets (batching.bucket), or with ``top`` the ladder under it
    (batching.ladder); replay each shape's forward pass as a CUDA graph (runtime.graphs; on a CPU, the graphs'
    stand-in counts the captures a GPU would make), kept in the model's state."""
    if isinstance(fn.model, OnnxModel):
        fn.pad_to = None
        return
    fn.pad_to = runner.bucket if top is None else functools.partial(ladder, top=top)
    if graphs.enabled() and not isinstance(fn.run, graphs.GraphedForward):
        fn.run = graphs.for_model(fn.model)


def choose_engine(s: Setup, engine: str, targets: torch.Tensor, *, max_rows: int, expected_rows: int,
                  measure_fn: str = "score", exact_shape: tuple[int, int] | None = None,
                  rival_s: float | None = None) -> Engine:
    """The engine and batch size for a job (engines.select_engine); the runner takes that batch size."""
    eng = select_engine(engine, s.fn, s.prep, targets, batch_size=s.batch_size, max_rows=max(1, max_rows),
                        expected_rows=expected_rows, measure_fn=measure_fn, exact_shape=exact_shape,
                        rival_s=rival_s, max_batch=s.top)
    s.runner.chunk = eng.batch_size
    if s.top is not None and eng.name != "onnxruntime":  # the ladder's shapes, full calls on its top
        s.runner.chunk = min(power_of_two_floor(eng.batch_size), s.top)
    elif s.top is not None:  # ONNX Runtime's batches: the user's model (the verifier) pads under them
        fixed_shapes(s.fn, s.runner, max(s.top, power_of_two_ceil(eng.batch_size)))
    fixed_shapes(eng.fn, s.runner, s.top)
    return eng


def verifier(s: Setup, eng: Engine, targets: torch.Tensor) -> CandidateEvaluator | None:
    """The user's model's evaluator of (f, top-1) for checking sets, or None where the engine runs that model."""
    return CandidateEvaluator(s.fn, s.prep, targets, s.runner, measure=s.fn.score_and_top1) if eng.verify else None


def evaluators(s: Setup, eng: Engine, targets: torch.Tensor) -> tuple[CandidateEvaluator, CandidateEvaluator | None]:
    """(the engine's evaluator of (f, top-1), :func:`verifier`)."""
    evaluator = CandidateEvaluator(eng.fn, s.prep, targets, s.runner, measure=eng.fn.score_and_top1)
    return evaluator, verifier(s, eng, targets)


def check_criterion(criterion) -> None:
    """criterion: "top1" (ReX's) or "threshold" (f >= tau)."""
    if not isinstance(criterion, str) or criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")


def passes(criterion: str, thresholds: list[float]):
    """passes(image, f, top1): the ReX criterion (top-1 is the target) or the SIS one (f >= tau)."""
    check_criterion(criterion)
    if criterion == "top1":
        return lambda i, f, top1: bool(top1)
    return lambda i, f, top1: f >= thresholds[i]


def slack(criterion: str, thresholds: list[float]):
    """slack(image, f, top1, margin): how far a prefix is from passing, positive when it passes; what guides
    prefix_search="guided". top1: the margin (the target's log-odds against the strongest other class);
    threshold: log f - log tau."""
    if criterion == "top1":
        return lambda i, f, top1, margin: margin
    return lambda i, f, top1, margin: math.log(max(f, 1e-300)) - math.log(max(thresholds[i], 1e-300))


def check_prefix_search(prefix_search) -> None:
    """prefix_search: "guided" or "scan"."""
    if not isinstance(prefix_search, str) or prefix_search not in PREFIX_SEARCHES:
        raise ValueError(f"prefix_search must be one of {PREFIX_SEARCHES}, got {prefix_search!r}")


def check_flag(name: str, value, none: bool) -> None:
    """``value`` must be True or False (or None, with ``none``): the objects themselves, not 1 or 0."""
    allowed = (None, True, False) if none else (True, False)
    if not any(value is v for v in allowed):
        names = "None, True or False" if none else "True or False"
        raise ValueError(f"{name} must be {names}, got {value!r}")


def check_refine(refine, budget=None) -> None:
    """refine: True, False or "boundary"; budget: "auto", an int >= 0 or None."""
    if not any(refine is r or (isinstance(refine, str) and refine == r) for r in REFINE):
        raise ValueError(f"refine must be True, False or 'boundary', got {refine!r}")
    if budget is not None and not (isinstance(budget, str) and budget == "auto") and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise ValueError(f"refine_budget must be 'auto', an int >= 0 or None, got {budget!r}")


def check_step(step) -> None:
    """step: an int >= 1."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"step must be a positive int, got {step!r}")


def check_pixels(s: Setup, what: str) -> None:
    """The job's features must be the default pixels of images [N, C, H, W] (``what`` names the caller)."""
    if s.prep.images.dim() != 4 or s.prep.grid_shape != tuple(s.prep.images.shape[-2:]):
        hint = "; images must have a batch dimension: pass images[None]" if s.prep.images.dim() == 3 else ""
        raise ValueError(f"{what} works on images [N, C, H, W] with the default pixel features "
                         f"(feature_mask=None){hint}")
