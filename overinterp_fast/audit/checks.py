"""The checks of an audit's inputs, made before any work: every model against the images (one forward pass of the
first images: what the model takes, how many classes it has, whether its outputs are what ``outputs`` says) and
against the source (its classes and labels). Each refusal is one ValueError (or TypeError) naming the model and
the input at fault; nothing is computed, written or committed before them.

    classes = check_source({"net": model}, source, "logits")        # the number of classes, K
    check_models({"net": model}, images[:64], "logits", labels=labels, names=names)
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ..runtime.model import ModelFn, check_output_kind, model_failure

CHECK_ROWS = 64  # the images of the checking forward pass (the first ones): a stored audit's first chunk at most


def _named(name: str, exc: Exception) -> Exception:
    """``exc`` (a ValueError or TypeError) as the same kind of error with the model's name in front."""
    return (TypeError if isinstance(exc, TypeError) else ValueError)(f"model {name!r}: {exc}")


@torch.no_grad()
def model_classes(name: str, model, images: torch.Tensor, outputs: str, hint: str = "") -> int:
    """K, the number of classes of ``model`` (called ``name``), from one forward pass of ``images`` [n, *D] (on
    the model's device and in its dtype, in eval mode: :meth:`~overinterp_fast.runtime.model.ModelFn.check_compatible`),
    after checking that the model runs on them (a failure is one line naming their shape, and what the model's
    first layer takes where it can be read; ``hint`` is added to it) and that its outputs are ``outputs``'
    kind (:func:`~overinterp_fast.runtime.model.check_output_kind`)."""
    fn = ModelFn(model, outputs=outputs, device=images.device)
    try:
        fn.check_compatible(images)
        try:
            out = fn.forward(images)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, AssertionError) as exc:  # the model's own failure (ours are ValueErrors)
            raise ValueError(f"{model_failure(fn, images, exc, images.shape[0])}{hint}") from None
        if not bool(torch.isfinite(out).all()):
            raise FloatingPointError(f"model {name!r}: its output on the images contains NaN or inf")
        check_output_kind(out, outputs)
    except (ValueError, TypeError) as exc:
        raise _named(name, exc) from None
    return int(out.shape[1])


def check_models(models: Mapping[str, object], images: torch.Tensor, outputs: str, *,
                 labels: Sequence[int | None] | None = None, names: Sequence[str] | None = None,
                 classes: Sequence[str] | None = None, source: str = "the images", hint: str = "",
                 subset_hint: str = "") -> int:
    """Check every model of an audit on ``images`` [n, *D] (the first images, :data:`CHECK_ROWS` suffice) before
    any work; returns their number of classes K.

    Refused, each in one line: a model that fails on the images or whose outputs are not ``outputs``
    (:func:`model_classes`); models with different numbers of classes; a model whose K is not the number of
    ``classes`` the source names (``source`` says which source: a CIFAR-10 model for CIFAR-10, else the class
    names, the report's true classes and the accuracies would be another model's; ``subset_hint`` is added to
    that line); a label (of all the audit's ``labels``, ``names`` naming their images) that is not one of the K
    classes.
    """
    ks = {name: model_classes(name, m, images, outputs, hint) for name, m in models.items()}
    (first, k), *rest = ks.items()
    for name, other in rest:
        if other != k:
            raise ValueError(f"model {first!r} has {k} outputs and model {name!r} {other}: the models of one audit "
                             f"share their classes")
    if classes is not None and len(classes) != k:
        shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
        raise ValueError(f"model {first!r} has {k} outputs, and {source} has {len(classes)} classes ({shown}): a "
                         f"model of the source's classes is needed (output j for its class j){subset_hint}")
    for i, label in enumerate(labels or ()):
        if label is not None and not 0 <= label < k:
            image = f"{names[i]!r}" if names is not None else f"{i}"
            raise ValueError(f"the label {label} of image {image} is not a class of model {first!r}, which has "
                             f"{k} outputs (classes 0 to {k - 1})")
    return k


def check_source(models: Mapping[str, object], source, outputs: str, device: torch.device | str = "cpu",
                 rows: int = CHECK_ROWS, hint: str = "") -> int:
    """:func:`check_models` of an :class:`~overinterp_fast.audit.sources.ImageSource`: its first ``rows``
    images on ``device``, all its labels and names, its classes where it names them."""
    n = min(rows, len(source))
    images = torch.stack([source[i]["x"] for i in range(n)]).to(device)
    what = source.description.get("source", "the image source")
    subset = ("; for photos of some of the model's classes, give a flat folder and --labels (the model's class "
              "indices)") if what == "ImageFolder" else ""
    return check_models(models, images, outputs, labels=source.image_labels, names=source.image_names,
                        classes=source.classes, source=f"the image source ({what})", hint=hint, subset_hint=subset)
