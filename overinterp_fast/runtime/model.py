"""The score under test, f: a model's probability for a target class, with checks."""
from __future__ import annotations

import copy
import math
import os
from typing import Callable, Sequence

import torch
from torch import nn

OUTPUT_KINDS = ("logits", "probabilities")


def _is_onnx(model) -> bool:
    """A path to an .onnx file or an onnxruntime.InferenceSession."""
    if isinstance(model, (str, os.PathLike)):
        return True  # only ONNX files are accepted as paths; OnnxModel says so if it is not one
    return type(model).__name__ == "InferenceSession" and type(model).__module__.startswith("onnxruntime")


def is_onnx(model) -> bool:
    """An ONNX model in any form a job takes: a path to an .onnx file, an onnxruntime.InferenceSession or an
    :class:`~overinterp_fast.runtime.onnx.OnnxModel`."""
    from .onnx import OnnxModel

    return _is_onnx(model) or isinstance(model, OnnxModel)


def weights_fingerprint(model: nn.Module) -> tuple:
    """Changes when a parameter or buffer of ``model`` is replaced or modified in place (an inference tensor, made
    under ``torch.inference_mode``, has no version counter: only its replacement shows)."""
    return tuple((t.data_ptr(), 0 if t.is_inference() else t._version)
                 for t in list(model.parameters()) + list(model.buffers()))


class Ensemble(nn.Module):
    """Mean of the members' logits (the ensembles of Carter et al. 2021). Members share input and classes."""

    def __init__(self, members: Sequence[Callable[[torch.Tensor], torch.Tensor]]):
        super().__init__()
        if len(members) == 0:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList([m for m in members if isinstance(m, nn.Module)])
        self._callables = list(members)
        # Mirror the members' mode without changing it (train() would propagate).
        mode = any(m.training for m in self.members)
        self.training = self.members.training = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x) for m in self._callables]).mean(0)


class OutputShapeError(ValueError):
    """The model returned a tensor that is not [B, K] (one score per class for each of the batch's B rows): the
    one-line message names the shape it returned.

    Attributes:
        batch: B, the rows of the call. shape: the shape of what the model returned.
    """

    def __init__(self, batch: int, shape: tuple[int, ...]):
        hint = ""
        if shape == (batch,):
            hint = ("; a model with one score per example must return one per class (e.g. two logits [B, 2] for a "
                    "binary classifier)")
        elif len(shape) == 3 and shape[0] == batch and shape[2] == 1:
            hint = "; drop its last dimension (out.squeeze(-1))"
        super().__init__(f"the model must map a batch [B, *D] to scores [B, K] (K classes); for B = {batch} it "
                         f"returned shape {tuple(shape)}{hint}")
        self.batch, self.shape = batch, shape


def first_line(exc: BaseException) -> str:
    """An exception's message, first line only (its type's name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def error_text(exc: BaseException) -> str:
    """An exception in one line: its type's name and the first line of its message ("RuntimeError: ..."), or the
    name alone when the message is empty."""
    text = first_line(exc)
    return text if text == type(exc).__name__ else f"{type(exc).__name__}: {text}"


class ExtraArgs:
    """``model(x, *args)`` for a batch x of any size B, as Captum's ``additional_forward_args`` are passed: a tensor
    of ``args`` holds one example's value (first dimension 1) and is expanded to B rows; anything else is passed as
    it is.

    Not an ``nn.Module``: the speed paths that rebuild a model from its one input (ONNX export, incremental
    inference, channels_last weights) step aside; the model inside is checked as the model itself is.
    """

    def __init__(self, model: Callable, args: tuple):
        self.model, self.args = model, tuple(args)

    def __call__(self, x: torch.Tensor):
        b = x.shape[0]
        return self.model(x, *(a.expand(b, *a.shape[1:]) if isinstance(a, torch.Tensor) else a for a in self.args))

    def check_compatible(self, images: torch.Tensor) -> None:
        """The model's own checks (training mode, device, dtype), and the tensors of ``args`` on the images'
        device."""
        ModelFn(self.model).check_compatible(images)
        for i, a in enumerate(self.args):
            if isinstance(a, torch.Tensor) and a.device != images.device:
                raise ValueError(f"additional_forward_args[{i}] is on {a.device}, the inputs on {images.device}")


def is_exported(model) -> bool:
    """Whether ``model`` is the module of a ``torch.export`` program (``torch.export.load(path).module()``): its
    train/eval behaviour was fixed when it was exported, so its modules' ``training`` flags mean nothing (and it
    refuses ``.eval()``)."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    stateful = getattr(getattr(torch.export, "_unlift", None), "_StatefulGraphModule", None)
    return (stateful is not None and isinstance(model, stateful)) or hasattr(model, "_in_spec")


def check_targets(target, n: int, k: int, predicted: torch.Tensor, unit: str = "image") -> torch.Tensor:
    """Target class per input: ``target`` (an int or one per input, [N]) checked against ``k`` classes,
    or ``predicted`` (int64 [N]) when it is None. Returns int64 [N] on predicted's device."""
    if target is None:
        return predicted
    t = torch.as_tensor(target)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise TypeError(f"target must be an int or an integer tensor, got {t.dtype}")
    t = t.to(torch.int64).expand(n) if t.dim() == 0 else t.to(torch.int64)
    if t.shape != (n,):
        raise ValueError(f"target must be an int or have one entry per {unit} ({n}), got shape {tuple(t.shape)}")
    if bool(((t < 0) | (t >= k)).any()):
        raise ValueError(f"target classes must lie in [0, {k}) for a model with {k} outputs")
    return t.to(predicted.device)


class ModelFn:
    """Wraps a model as the SIS score f.

    ``model``: an nn.Module or callable [B, *D] -> [B, K]; a list/tuple of them
    (an :class:`Ensemble`); a path to an ``.onnx`` file or an
    ``onnxruntime.InferenceSession`` (run by :class:`~overinterp_fast.runtime.onnx.OnnxModel`
    with the default provider for ``device``).

    ``outputs="logits"`` (default): f = softmax(output)[target], computed in the
    output's dtype. ``outputs="probabilities"``: the output is already a
    probability per class. A list or tuple of models is an :class:`Ensemble`.
    """

    def __init__(self, model, outputs: str = "logits", device: torch.device | str = "cpu"):
        if isinstance(model, (list, tuple)):
            model = Ensemble(model)
        elif _is_onnx(model):
            from .onnx import OnnxModel

            model = OnnxModel(model, device=device)
        if not callable(model):
            raise TypeError(f"model must be a torch.nn.Module or a callable, got {type(model).__name__}")
        if outputs not in OUTPUT_KINDS:
            raise ValueError(f"outputs must be one of {OUTPUT_KINDS}, got {outputs!r}")
        self.model = model
        self.outputs = outputs
        # rows -> the batch shape to pad a call to (runtime.batching.bucket); None: calls run as they come
        self.pad_to: Callable[[int], int] | None = None
        self.run = model  # what forward calls: the model, or a runtime.graphs.GraphedForward of it

    def check_compatible(self, images: torch.Tensor) -> None:
        """Clear errors for a model in training mode or on another device/dtype than the images."""
        model = self.model
        if hasattr(model, "check_compatible"):  # OnnxModel
            model.check_compatible(images)
            return
        if not isinstance(model, nn.Module):
            return
        if any(m.training for m in model.modules()) and not is_exported(model):
            raise ValueError(
                "model is in training mode; call model.eval() first (dropout and batch norm in training "
                "mode make f depend on which candidates share a batch)"
            )
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.device != images.device:
                raise ValueError(
                    f"model and images are on different devices: model parameter {name!r} is on "
                    f"{t.device}, images are on {images.device}"
                )
            if t.is_floating_point() and t.dtype != images.dtype:
                raise TypeError(
                    f"model parameter {name!r} is {t.dtype} but images are {images.dtype}; computation runs "
                    f"in the images' dtype, so convert one of them (e.g. model.to({images.dtype}))"
                )

    def forward(self, x: torch.Tensor, fixed: bool = True) -> torch.Tensor:
        """Model output [B, K] for x [B, *D], checked for shape, dtype and device.

        With ``pad_to`` set, x is padded to ``pad_to(B)`` rows (copies of its last row) and the extra outputs are
        dropped, so the model sees a few fixed batch shapes (each row's output is its own: a model in eval mode
        computes rows independently, up to the floating-point noise of the batch size it runs at).
        ``fixed=False``: a call made once (the images' own pass), run on the model as it is, unpadded and never
        captured as a CUDA graph.
        """
        if not fixed:
            return self.checked(self.model, x)
        n = x.shape[0]
        m = self.pad_to(n) if self.pad_to is not None and n > 0 else n
        if m == n:
            return self.checked(self.run, x)
        return self.checked(self.run, pad_rows(x, m))[:n]

    def unfixed(self) -> "ModelFn":
        """This f with the model as it is: no padding to fixed shapes and no CUDA graphs (timing probes: their
        sizes are the ones timed, and a GPU captures no graph for sizes a job may never run)."""
        plain = copy.copy(self)
        plain.pad_to, plain.run = None, self.model
        return plain

    def checked(self, run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``run(x)`` (the model, or what stands for it) checked as :meth:`forward` checks its output, for a batch x
        already at its shape."""
        try:
            return self.check_output(run(x), x.shape[0], x.device)
        except AssertionError as exc:  # an exported program's guard on its batch size (dimension 0)
            if is_exported(self.model) and "Guard failed" in str(exc) and "size()[0]" in str(exc):
                raise ValueError(f"the torch.export program refuses a batch of {x.shape[0]} rows "
                                 f"({first_line(exc)}); export it with a dynamic batch dimension: "
                                 f"torch.export.export(model, (x,), dynamic_shapes=({{0: torch.export.Dim('batch')}},))"
                                 ) from None
            raise

    @staticmethod
    def check_output(out, batch: int, device: torch.device) -> torch.Tensor:
        """``out`` if it is a floating [batch, K] tensor on ``device``, else a clear error."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"model must return a tensor of logits [B, K], got {type(out).__name__}")
        if out.dim() != 2 or out.shape[0] != batch:
            raise OutputShapeError(batch, tuple(out.shape))
        if out.shape[1] < 1:
            raise ValueError("model returned zero classes")
        if not out.is_floating_point():
            raise TypeError(f"model must return floating-point scores, got {out.dtype}")
        if out.device != device:
            raise ValueError(f"model returned its output on {out.device} for input on {device}")
        return out

    def probabilities(self, out: torch.Tensor) -> torch.Tensor:
        return torch.softmax(out, dim=-1) if self.outputs == "logits" else out

    def score_and_top1(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(f float64 [B], bool [B]: the top-1 class is the target)."""
        out = self.forward(x)
        probs = self.probabilities(out)
        return probs.gather(1, target.view(-1, 1)).view(-1).double(), out.argmax(1) == target

    def score_top1_margin(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
        """(f float64 [B], bool [B]: the top-1 class is the target, margin float64 [B]: the target's log-odds
        against the strongest other class, log p_target - max over other classes of log p: positive when the
        target is the top-1 class. With ``outputs="logits"`` that is the logit difference; with one class, +inf.)"""
        out = self.forward(x)
        probs = self.probabilities(out)
        logp = out.double() if self.outputs == "logits" else probs.double().clamp(min=1e-300).log()
        t = logp.gather(1, target.view(-1, 1)).view(-1)
        other = logp.scatter(1, target.view(-1, 1), -torch.inf).amax(1)
        return probs.gather(1, target.view(-1, 1)).view(-1).double(), out.argmax(1) == target, t - other

    def score(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """f for each row of x: float64 [B]. Non-finite values are left for the caller to report."""
        probs = self.probabilities(self.forward(x))
        return probs.gather(1, target.view(-1, 1)).view(-1).double()


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [B, *D] followed by copies of its last row up to [rows, *D] (rows >= B >= 1), in x's memory format."""
    n = x.shape[0]
    fmt = torch.channels_last if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
        and not x.is_contiguous() else torch.contiguous_format
    out = x.new_empty((rows, *x.shape[1:])).contiguous(memory_format=fmt)
    out[:n] = x
    out[n:] = x[n - 1:n]
    return out


def model_memory_format(model) -> torch.memory_format:
    """torch.channels_last when an nn.Module's first 4-D parameter (a conv weight) is stored channels_last,
    else torch.contiguous_format (also for callables and ONNX models)."""
    if isinstance(model, nn.Module):
        for t in model.parameters():
            if t.dim() == 4:
                if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
                    return torch.channels_last
                break
    return torch.contiguous_format


def check_finite_scores(all_finite: torch.Tensor | bool) -> None:
    """Raise when a model score was NaN or inf (``all_finite``: a bool, or a 0-d bool tensor)."""
    if not bool(all_finite):
        raise FloatingPointError(
            "the model produced NaN or inf scores on masked inputs; check the model and the mask value"
        )


def check_finite_host(scores: torch.Tensor) -> None:
    """:func:`check_finite_scores` of scores already read to the host (a CPU tensor), checked in numpy: no op on
    the device, no wait."""
    check_finite_scores(all(math.isfinite(v) for v in scores.reshape(-1).tolist()))


def _is_one_unbatched_sample(fn: ModelFn, images: torch.Tensor) -> bool:
    """True when the model maps two copies of ``images`` stacked, [2, *images.shape], to [2, K]:
    ``images`` is then one sample that lacks its batch dimension.

    Asked only after the model failed on ``images`` as a batch, so a model that accepts
    the batch is never second-guessed; two copies keep a model whose output
    ignores the batch size (always [1, K]) from passing the probe, and one copy ([1, *images.shape] -> [1, K]) a
    model that drops the batch dimension of a single row (``out.squeeze()``: [1, K] -> [K]).
    """
    try:
        two = fn.model(images[None].expand(2, *images.shape))
        one = fn.model(images[None])
    except Exception:
        return False
    return all(isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == rows and out.shape[1] >= 1
               for out, rows in ((two, 2), (one, 1)))


def first_layer(model) -> tuple[str, nn.Module] | None:
    """(name, module) of the first ``nn.Conv1d``/``Conv2d``/``Conv3d`` or ``nn.Linear`` of an nn.Module, in the
    order of its modules (an :class:`ExtraArgs`' model's); None for callables, ONNX models and models without one.
    Lazy layers, whose sizes are not known before their first call, are skipped."""
    model = model.model if isinstance(model, ExtraArgs) else model
    if not isinstance(model, nn.Module):
        return None
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
                return None
            return name or type(m).__name__, m
    return None


def layer_mismatch(model, images: torch.Tensor) -> str | None:
    """What the first layer of ``model`` (:func:`first_layer`) says the inputs [N, *D] lack, or None where it
    cannot be read or agrees: a convolution's ``in_channels`` against the channels of D, a linear layer's
    ``in_features`` against D's last size and its number of elements."""
    found = first_layer(model)
    if found is None or images.dim() < 2:
        return None
    name, layer = found
    kind = type(layer).__name__
    if isinstance(layer, nn.Linear):
        have = math.prod(images.shape[1:])
        if layer.in_features in (images.shape[-1], have):
            return None
        return f"its first layer, {kind} {name!r}, takes {layer.in_features} input features; an input holds {have}"
    dims = len(layer.kernel_size)
    have = images.shape[1] if images.dim() == dims + 2 else None
    if have == layer.in_channels:
        return None
    if have is None:
        spatial = {1: "L", 2: "H, W", 3: "D, H, W"}[dims]
        return f"its first layer, {kind} {name!r}, takes inputs [N, C, {spatial}] of {layer.in_channels} channels"
    return f"its first layer, {kind} {name!r}, takes {layer.in_channels} channels; the inputs have {have}"


def model_failure(fn: ModelFn, images: torch.Tensor, exc: BaseException, rows: int) -> ValueError:
    """The one-line error of a model that fails on the first forward pass of the inputs [N, *D], naming the
    inputs' shape as given: what its first layer takes (:func:`layer_mismatch`) where that is readable and
    differs; else the model's own error on a call of the inputs as they are (up to ``rows`` of them), not on the
    padded batch that failed, whose shape is the library's."""
    why = layer_mismatch(fn.model, images)
    if why is None:
        m = min(rows, images.shape[0])
        try:
            fn.model(images[:m])
            why = error_text(exc)
        except Exception as again:  # noqa: BLE001  (the model's own error, of any type)
            why = error_text(again)
        if m < images.shape[0]:
            why += f" (on the first {m} inputs)"
    return ValueError(f"the model fails on the inputs, shape {list(images.shape)}: {why}")


PROBABILITY_SLACK = 1e-5  # at least; twice the output dtype's epsilon where that is more (float16, bfloat16)


def check_output_kind(out: torch.Tensor, outputs: str) -> None:
    """Refuse, in one line, a model output [N, K] on real inputs that contradicts ``outputs``: with "logits", rows
    that are probabilities already (every value in [0, 1], each row summing to 1: a model that ends in a softmax,
    whose f would be the softmax of probabilities); with "probabilities", values outside [0, 1]. One class
    (K = 1) is never refused: its softmax is 1 whatever the output."""
    if out.dim() != 2 or out.shape[0] == 0 or out.shape[1] < 2:
        return
    slack = max(PROBABILITY_SLACK, 2 * torch.finfo(out.dtype).eps)
    x = out.detach().double()
    inside = bool(((x >= -slack) & (x <= 1 + slack)).all())
    if outputs == "logits" and inside and bool(((x.sum(1) - 1).abs() <= slack).all()):
        raise ValueError(
            f"the model's outputs are probabilities already (on the {x.shape[0]} input{'s' * (x.shape[0] > 1)} "
            f"every row lies in [0, 1] and sums to 1: a final softmax?), and outputs='logits' would take their "
            f"softmax again; pass outputs='probabilities' (--outputs probabilities), or the model without its "
            f"softmax")
    if outputs == "probabilities" and not inside:
        raise ValueError(
            f"outputs='probabilities', but the model's outputs on the inputs lie in [{float(x.min()):.4g}, "
            f"{float(x.max()):.4g}], not in [0, 1] (logits?); pass outputs='logits' (the default), or a model that "
            f"returns probabilities")


def initial_predictions(fn: ModelFn, images: torch.Tensor, target, runner) -> tuple[torch.Tensor, torch.Tensor]:
    """Target class per image (given, or the argmax of the output) and f(x): (int64 [N], float64 [N]).

    ``runner`` is a :class:`overinterp_fast.runtime.batching.ChunkRunner` (chunking with out-of-memory back-off).
    The first forward pass of every job, before any candidate: a model that fails on the inputs (a wrong channel
    count, ...) is one line naming their shape (:func:`model_failure`), and outputs that contradict
    ``fn.outputs`` are refused (:func:`check_output_kind`).
    """
    n = images.shape[0]
    try:
        outs = runner.run(n, lambda sl: fn.forward(images[sl], fixed=False))  # once per job: no fixed shape
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        if _is_one_unbatched_sample(fn, images):
            raise ValueError(
                f"images must have a batch dimension: pass images[None] (got shape {tuple(images.shape)}, "
                f"which the model rejects as a batch but accepts as one sample)"
            ) from exc
        if isinstance(exc, (RuntimeError, AssertionError)):  # the model's own failure (ours are ValueErrors)
            raise model_failure(fn, images, exc, runner.chunk) from None
        raise
    if not bool(torch.isfinite(outs).all()):
        raise FloatingPointError("the model's output on the unmasked images contains NaN or inf")
    check_output_kind(outs, fn.outputs)
    targets = check_targets(target, n, outs.shape[1], outs.argmax(dim=1))
    probs = fn.probabilities(outs)
    scores = probs.gather(1, targets.view(-1, 1)).view(-1).double()
    return targets.contiguous(), scores
