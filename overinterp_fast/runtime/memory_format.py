"""The memory format a job's model runs in: channels_last where it is measured faster.

A convolution runs on a GPU's tensor cores in NHWC (channels_last): cuDNN converts NCHW inputs and weights around
each convolution otherwise, which costs more the smaller the network (ResNet-20's 16 to 64 channels). On a CPU
oneDNN may gain or lose. So the choice is measured: a job's forward call at its batch size, on candidate-like rows
(:func:`overinterp_fast.runtime.calibration.candidate_probe`), in the images' format and in channels_last, in
interleaved rounds; channels_last is kept when its best call is at least ``GAIN`` faster.

The user's model is never converted: a job that runs channels_last scores candidates with a copy of the model whose
4-D weights are stored channels_last (:func:`channels_last_copy`), fed channels_last candidates. The copy computes
the same function as the model, up to the floating-point noise a change of batch size also makes.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import time

import torch
from torch import nn

from .calibration import candidate_probe
from .inputs import Prepared
from .model import Ensemble, ModelFn, model_memory_format

logger = logging.getLogger(__name__)

GAIN = 0.05  # channels_last is kept when its call is at least this much faster
ROUNDS = 3  # timed calls per format (after one warm-up call each), interleaved; the minimum counts


def convertible(fn: ModelFn, images: torch.Tensor) -> bool:
    """Whether channels_last can apply: 4-D images that are not float64 (the dtype of exactness checks) and a torch
    module (or an ensemble of them) with a 4-D parameter (a convolution) not stored channels_last already."""
    model = fn.model
    members = model._callables if isinstance(model, Ensemble) else [model]
    if images.dim() != 4 or images.dtype == torch.float64 or not all(isinstance(m, nn.Module) for m in members):
        return False
    convs = any(t.dim() == 4 for t in model.parameters())
    return convs and model_memory_format(model) != torch.channels_last


def channels_last_copy(fn: ModelFn, prep: Prepared) -> tuple[ModelFn, Prepared]:
    """(f of a copy of ``fn``'s model with its 4-D weights channels_last, ``prep`` with channels_last images and
    baseline): what a job runs channels_last (the model given is not converted)."""
    model = copy.deepcopy(fn.model).to(memory_format=torch.channels_last)
    cl = torch.channels_last
    prep = dataclasses.replace(prep, images=prep.images.contiguous(memory_format=cl),
                               baseline=prep.baseline.contiguous(memory_format=cl))
    return ModelFn(model, outputs=fn.outputs), prep


def measure_formats(fn: ModelFn, prep: Prepared, batch_size: int, rounds: int = ROUNDS,
                    timer=time.perf_counter) -> dict[str, float]:
    """Seconds of the best of ``rounds`` forward calls of ``batch_size`` candidate-like rows (f of class 0), in the
    images' format ("given") and channels_last ("channels_last"), interleaved after one untimed call each."""
    targets = torch.zeros(prep.images.shape[0], dtype=torch.int64, device=prep.images.device)
    cl_fn, cl_prep = channels_last_copy(fn, prep)
    probes = {"given": candidate_probe(fn.score, prep, targets), "channels_last": candidate_probe(cl_fn.score, cl_prep,
                                                                                                  targets)}
    best = {}
    with torch.inference_mode():
        for probe in probes.values():
            probe(batch_size)
        for _ in range(rounds):
            for name, probe in probes.items():
                t0 = timer()
                probe(batch_size)
                best[name] = min(best.get(name, float("inf")), timer() - t0)
    return best


def channels_last_pays(times: dict[str, float]) -> bool:
    """From :func:`measure_formats`' seconds: channels_last's call at most (1 - GAIN) times the given format's."""
    return times["channels_last"] <= (1 - GAIN) * times["given"]


def choose_channels_last(option: bool | None, fn: ModelFn, prep: Prepared, batch_size: int) -> tuple[bool, dict]:
    """Whether a job runs channels_last, and the measured call times ({} where nothing was timed).

    ``option``: True or False (the caller's), or None: measured (:func:`measure_formats`) on a CUDA device where
    :func:`convertible`, kept when at least ``GAIN`` faster; never on a CPU (where the format would change results by
    timing, from run to run) nor where not convertible. True where not convertible is refused with one line.
    """
    if option is True and not convertible(fn, prep.images):
        raise ValueError("channels_last=True needs 4-D images that are not float64 and a torch model with "
                         "convolutions not stored channels_last already")
    if option is not None:
        return option, {}
    if prep.images.device.type != "cuda" or not convertible(fn, prep.images):
        return False, {}
    times = measure_formats(fn, prep, batch_size)
    pays = channels_last_pays(times)
    logger.info("channels_last %s: %.3g ms against %.3g ms per call of %d rows", "on" if pays else "off",
                1e3 * times["channels_last"], 1e3 * times["given"], batch_size)
    return pays, times
