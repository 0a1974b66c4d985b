"""The public entry point: fast_sis."""
from __future__ import annotations

from typing import Callable

import torch

from .batching import ChunkRunner, auto_batch_size, check_batch_size
from .exact import exact_sis
from .gradient import check_autocast, check_k, gradient_sis
from .inputs import check_threshold, prepare
from .model import ModelFn, initial_predictions
from .onnx_backend import OnnxModel
from .results import SISResult

METHODS = ("exact", "gradient")
BLACK_BOX_METHODS = ("exact",)  # forward passes only: these run on ONNX models too


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
        batch_size: candidates per forward call (None: chosen from the input
            size and, on CUDA, free memory; out-of-memory errors shrink it).
        outputs: "logits" (f = softmax probability) or "probabilities".
        progress: show a progress bar (None: only on a terminal).
        k: method="gradient": features masked per gradient step (default 100).
        autocast: method="gradient": None, "bf16" or "fp16" for the gradient
            steps; FindSIS and every SIS's verification run in the images' dtype.

    Returns:
        A list with one :class:`SISResult` per image (tensors on the CPU).
        Images with f(x) < threshold get ``sis=None`` (their backward-selection
        ``order``/``values`` are still computed); the others are unaffected.

    For method="gradient", ``values`` has one entry per block and ``blocks``
    gives the block offsets into ``order``; every SIS is verified by a forward
    pass in full precision (``sis_score`` >= threshold).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    batch_size = check_batch_size(batch_size)
    if method == "gradient":
        k = check_k(k)
        autocast_dtype = check_autocast(autocast)
    prep = prepare(images, features=features, mask_value=mask_value)
    thresholds = check_threshold(threshold, prep.images.shape[0])
    fn = ModelFn(model, outputs=outputs, device=prep.images.device)
    if method not in BLACK_BOX_METHODS and isinstance(fn.model, OnnxModel):
        raise ValueError(
            f"method={method!r} needs gradients, and ONNX Runtime has no autograd; on ONNX models use a "
            f"black-box method: {', '.join(repr(m) for m in BLACK_BOX_METHODS)}"
        )
    fn.check_compatible(prep.images)
    p = prep.num_features
    n = prep.images.shape[0]
    if batch_size is None:
        batch_size = auto_batch_size(prep.images, total_candidates=n * p)
    runner = ChunkRunner(batch_size, prep.images.device)
    if method == "gradient":
        with torch.no_grad():
            targets, scores0 = initial_predictions(fn, prep.images, target, runner)
        return gradient_sis(fn, prep, targets, scores0, thresholds=thresholds, collection=collection, k=k,
                            runner=runner, autocast=autocast_dtype, progress=progress)
    with torch.inference_mode():
        targets, scores0 = initial_predictions(fn, prep.images, target, runner)
        return exact_sis(
            fn,
            prep,
            targets,
            scores0,
            thresholds=thresholds,
            collection=collection,
            batch_size=batch_size,
            runner=runner,
            progress=progress,
        )
