"""ONNX Runtime backend: any black-box method runs on an ONNX model as on a torch model.

``OnnxModel`` is a callable [B, *D] -> [B, K] over torch tensors, so the engines
use it exactly like a torch model. On the CPU, inputs reach ONNX Runtime as
zero-copy NumPy views of the torch tensors and outputs come back zero-copy
(bfloat16, which NumPy lacks, is bound by pointer instead). On CUDA, inputs and
outputs are bound by IOBinding to torch CUDA tensors (the candidate batches never
leave the GPU). ONNX Runtime runs on its own stream, so every run first waits for
torch's current stream on the input's device (the kernels that wrote the batch),
and ORT has finished with its outputs when the run returns. Output buffers take
the dtype of the session's output. An allocation failure inside ONNX Runtime is
raised as ``torch.OutOfMemoryError``, so the batch-halving back-off applies.
Models whose batch dimension is fixed are fed in chunks of that size, the last
chunk padded with copies of its last row, and the padding's outputs dropped.
"""
from __future__ import annotations

import os
import warnings
from typing import Sequence

import numpy as np
import torch

from ..util.optional import load
from .model_files import not_onnx_message

# ONNX element types -> (torch dtype, onnx.TensorProto element type), for the tensors we bind.
_ORT_TYPES = {
    "tensor(float)": (torch.float32, 1),
    "tensor(double)": (torch.float64, 11),
    "tensor(float16)": (torch.float16, 10),
    "tensor(bfloat16)": (torch.bfloat16, 16),
}
_ONNX_ELEMENT = {dtype: code for dtype, code in _ORT_TYPES.values()}
# Substrings of ONNX Runtime's errors when an allocation fails (its BFC arena, CUDA, the CPU allocator).
_ALLOCATION_FAILURES = ("failed to allocate memory", "out of memory", "bad_alloc", "cudaerrormemoryallocation")


def _wait_for_torch_stream(device: torch.device) -> None:
    """Block until the work queued on torch's current stream of ``device`` is done (no-op off CUDA).

    ONNX Runtime runs on a stream of its own that does not wait for torch's: without
    this it could read a candidate batch before ``mask_apply`` has written it.
    """
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _ort_call(fn, *args):
    """Call into ONNX Runtime; its allocation failures become torch.OutOfMemoryError (the back-off's signal)."""
    try:
        return fn(*args)
    except Exception as exc:  # onnxruntime raises its own exception types
        text = str(exc)
        if any(s in text.lower() for s in _ALLOCATION_FAILURES):
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise torch.OutOfMemoryError(f"ONNX Runtime could not allocate memory: {first}") from exc
        raise


def _import_ort():
    """onnxruntime, or MissingDependency naming the onnx extra (onnxruntime-gpu >= 1.27 serves CUDA as well)."""
    return load("onnxruntime", "onnx", "the ONNX backend")


class OnnxModel:
    """An ONNX model run by ONNX Runtime, called like a torch model on torch tensors.

    Args:
        model: path to a ``.onnx`` file, or an ``onnxruntime.InferenceSession``.
        providers: ONNX Runtime execution providers for a path (default: CUDA
            when the images will be on a GPU and the provider is available, else CPU).
            Ignored for a session.
        input_name, output_name: which input and output to use when the model has
            several (a model with several inputs is refused: the others would need values).
        device: where inputs will live ("cpu" or "cuda[:i]"); chooses the default provider.
        session_options: ``onnxruntime.SessionOptions`` for a path (default: ORT's,
            with intra-op thread spinning off, so its threads leave the cores to
            the torch work between runs).

    Calling it with a [B, *D] tensor returns the output [B, K] as a torch tensor
    on the input's device. The session is created once and reused.
    """

    def __init__(
        self,
        model,
        providers: Sequence | None = None,
        *,
        input_name: str | None = None,
        output_name: str | None = None,
        device: str | torch.device = "cpu",
        session_options=None,
    ):
        if isinstance(model, (str, os.PathLike)):  # checked before onnxruntime is needed: a torch file is named
            path = os.fspath(model)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no ONNX model at {path!r}")
            message = not_onnx_message(path)
            if message is not None:
                raise ValueError(message)
        ort = _import_ort()
        self.device = torch.device(device)
        if isinstance(model, ort.InferenceSession):
            self.session = model
            self.path = None
        else:
            path = os.fspath(model)
            if providers is None:
                providers = self._default_providers(ort)
            if session_options is None:
                # ORT's intra-op threads spin after each run by default and then starve the
                # torch ops between runs (mask building, softmax): 1.8x slower end to end here.
                session_options = ort.SessionOptions()
                session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                self.session = ort.InferenceSession(path, sess_options=session_options, providers=list(providers))
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ValueError(f"{path!r} could not be loaded as an ONNX model: {exc}") from exc
            self.path = path
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.input = self._pick(inputs, input_name, "input", refuse_several=True)
        self.output = self._pick(outputs, output_name, "output", refuse_several=False)
        if self.input.type not in _ORT_TYPES:
            raise TypeError(f"the ONNX model's input {self.input.name!r} is {self.input.type}; a float tensor is needed")
        if self.output.type not in _ORT_TYPES:
            raise TypeError(f"the ONNX model's output {self.output.name!r} is {self.output.type}; SIS needs float "
                            "scores (logits or probabilities)")
        self.dtype = _ORT_TYPES[self.input.type][0]
        self.out_dtype = _ORT_TYPES[self.output.type][0]
        self.input_shape = list(self.input.shape)  # ints for fixed dims, str/None for dynamic ones
        batch_dim = self.input_shape[0] if self.input_shape else None
        self.fixed_batch = batch_dim if isinstance(batch_dim, int) and batch_dim > 0 else None
        self.providers = self.session.get_providers()
        self._known_classes: int | None = None  # learned on the first CUDA run when the output shape is dynamic

    def _default_providers(self, ort) -> list:
        available = ort.get_available_providers()
        if self.device.type == "cuda" and "CUDAExecutionProvider" in available:
            return [self._cuda_provider(), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def _cuda_provider(self):
        # No user_compute_stream: each run orders the streams itself (_wait_for_torch_stream).
        # kSameAsRequested: the arena grows by what is needed, not by powers of two, so it takes
        # no more of the memory the automatic batch size counts on than the batches need.
        return ("CUDAExecutionProvider",
                {"device_id": self.device.index or 0, "arena_extend_strategy": "kSameAsRequested"})

    @staticmethod
    def _pick(args, name, kind, refuse_several):
        names = [a.name for a in args]
        if name is not None:
            if name not in names:
                raise ValueError(f"the ONNX model has no {kind} named {name!r}; its {kind}s are {names}")
            return args[names.index(name)]
        if len(args) == 1:
            return args[0]
        if refuse_several:
            raise ValueError(f"the ONNX model has {len(args)} {kind}s {names}; SIS needs a model with one image {kind}")
        raise ValueError(f"the ONNX model has {len(args)} {kind}s {names}; say which holds the logits with {kind}_name=")

    def describe(self) -> str:
        return (f"ONNX model {self.path or '(session)'}: input {self.input.name!r} {self.input.type} "
                f"{self.input_shape}, output {self.output.name!r}, providers {self.providers}")

    def check_compatible(self, images: torch.Tensor) -> None:
        """Clear errors when the images do not fit the model's declared input."""
        if images.dtype != self.dtype:
            raise TypeError(
                f"the ONNX model's input {self.input.name!r} is {self.input.type} ({self.dtype}) but the images are "
                f"{images.dtype}; convert the images (e.g. images.to({self.dtype}))"
            )
        if len(self.input_shape) == images.dim() + 1:
            raise ValueError(
                f"images must have a batch dimension: pass images[None] (the ONNX model's input "
                f"{self.input.name!r} is {self.input_shape}, the images have shape {tuple(images.shape)})"
            )
        if len(self.input_shape) != images.dim():
            raise ValueError(
                f"the ONNX model's input {self.input.name!r} has rank {len(self.input_shape)} {self.input_shape}, "
                f"the images have rank {images.dim()} {tuple(images.shape)}"
            )
        for axis, (want, got) in enumerate(zip(self.input_shape[1:], images.shape[1:]), start=1):
            if isinstance(want, int) and want > 0 and want != got:
                raise ValueError(
                    f"the ONNX model's input {self.input.name!r} expects size {want} on axis {axis} "
                    f"({self.input_shape}); the images have shape {tuple(images.shape)}"
                )
        if images.device.type == "cuda" and "CUDAExecutionProvider" not in self.providers:
            warnings.warn(
                "images are on CUDA but the ONNX session runs on "
                f"{self.providers}; every batch is copied to the host (install onnxruntime-gpu >= 1.27)"
            )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            raise TypeError(f"the ONNX model takes {self.dtype}, got {x.dtype}")
        if self.fixed_batch is None:
            return self._run(x)
        b = self.fixed_batch
        outs = []
        for s in range(0, x.shape[0], b):
            chunk = x[s : s + b]
            n = chunk.shape[0]
            if n < b:  # pad with copies of the last row; their outputs are dropped
                chunk = torch.cat([chunk, chunk[-1:].expand(b - n, *chunk.shape[1:])])
            outs.append(self._run(chunk)[:n])
        return torch.cat(outs)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.device.type == "cuda" and "CUDAExecutionProvider" in self.providers:
            return self._run_bound(x)
        if x.device.type != "cpu":  # the session runs on the CPU: copy there and back
            return self._run(x.cpu()).to(x.device)
        if torch.bfloat16 in (self.dtype, self.out_dtype):  # NumPy has no bfloat16: bind the memory
            return self._run_bound(x)
        (out,) = _ort_call(self.session.run, [self.output.name], {self.input.name: x.detach().numpy()})
        return torch.from_numpy(np.ascontiguousarray(out))

    def _run_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Run on x's memory through IOBinding (CUDA, or the CPU for bfloat16), output in the session's dtype."""
        kind, index = x.device.type, x.device.index or 0
        binding = self.session.io_binding()
        binding.bind_input(self.input.name, kind, index, _ONNX_ELEMENT[x.dtype], list(x.shape), x.data_ptr())
        if self._classes() is None:
            # Unknown number of classes (dynamic output shape): one run with ORT's own buffer learns it.
            binding.bind_output(self.output.name, kind, index)
            _wait_for_torch_stream(x.device)
            _ort_call(self.session.run_with_iobinding, binding)
            shape = list(binding.get_outputs()[0].shape())
            if len(shape) != 2 or shape[0] != x.shape[0]:
                raise ValueError(f"the ONNX model's output {self.output.name!r} has shape {shape} for a batch of "
                                 f"{x.shape[0]}; it must be [B, K]")
            self._known_classes = shape[1]
            binding.clear_binding_outputs()
        out = torch.empty((x.shape[0], self._classes()), dtype=self.out_dtype, device=x.device)
        binding.bind_output(self.output.name, kind, index, _ONNX_ELEMENT[out.dtype], list(out.shape), out.data_ptr())
        _wait_for_torch_stream(x.device)  # on every run: the batch in x was written on torch's stream
        _ort_call(self.session.run_with_iobinding, binding)
        binding.synchronize_outputs()  # ORT's stream is done with out before torch reads it
        return out

    def _classes(self) -> int | None:
        shape = list(self.output.shape)
        if len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0:
            return shape[1]
        return self._known_classes


def export_onnx(
    model: torch.nn.Module,
    path: str | os.PathLike,
    example: torch.Tensor,
    *,
    opset_version: int | None = None,
    check: bool = True,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    dynamo: bool = True,
) -> str:
    """Export a torch classifier to ONNX with a dynamic batch dimension and check it.

    Args:
        model: module in eval mode mapping [B, *D] to logits [B, K].
        path: where to write the ``.onnx`` file (weights inline).
        example: an input batch [B, *D] used to trace the model.
        check: run the exported model with ONNX Runtime (CPU) at batch size
            B + 1 and compare with the torch model (``rtol``, ``atol``).
        dynamo: use torch.export (the default); False uses the TorchScript exporter,
            about 10x faster to export (under a second for small nets on 2 cores)
            but for fewer models (used by ``engine="auto"``).

    Returns:
        The path written. Raises ValueError when the check fails.
    """
    onnx = load("onnx", "onnx", "export_onnx")
    path = os.fspath(path)
    if model.training:
        raise ValueError("export the model in eval mode (model.eval())")
    if dynamo:
        batch = torch.export.Dim("batch", min=1, max=1 << 20)
        onnx_program = torch.onnx.export(
            model,
            (example,),
            dynamic_shapes=({0: batch},),
            input_names=["input"],
            output_names=["logits"],
            opset_version=opset_version,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        onnx_program.save(path, external_data=False)
    else:
        torch.onnx.export(model, (example,), path, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=opset_version, dynamo=False)
    onnx.checker.check_model(path)
    if check:
        n = example.shape[0] + 1
        probe = torch.cat([example, example[:1].flip(-1)])[:n]
        with torch.inference_mode():
            want = model(probe)
        got = OnnxModel(path, providers=["CPUExecutionProvider"])(probe.cpu()).to(want.device)
        if got.shape != want.shape or not torch.allclose(got, want.to(got.dtype), rtol=rtol, atol=atol):
            err = (got - want).abs().max().item() if got.shape == want.shape else f"shape {tuple(got.shape)}"
            raise ValueError(f"the exported model differs from the torch model at batch size {n}: max error {err}")
    return path
