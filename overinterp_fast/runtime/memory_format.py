"""The memory format a job's model runs in: channels_last where it is measured faster.

A convolution runs on a GPU's tensor cores in NHWC (channels_last): cuDNN converts NCHW inputs and weights around
each convolution otherwise, which costs more the smaller the network (ResNet-20's 16 to 64 channels). On a CPU
oneDNN's NHWC convolutions gain as much for small networks (on 2 AMD EPYC cores a call of 256 candidate rows took
0.54-0.75 of its NCHW time for the digits CNN, the small CNNs and ResNet-20, 0.91-0.94 for the stride-2 CNN and
EfficientNet-Lite0) and may lose elsewhere. So the choice is measured: a job's forward call at its batch size, on
candidate-like rows (:func:`overinterp_fast.runtime.calibration.candidate_probe`), in the images' format and in
channels_last, in interleaved rounds; channels_last is kept when its best call is at least ``GAIN`` faster. Like
a calibrated batch size, a choice made by timing can differ between runs where the two formats are close, and
with it the last bits of the scores (a near-tie of float32 scores may then break the other way); a run that must
not depend on timing passes ``channels_last`` (and ``batch_size``). A model whose channels_last copy fails to run
(e.g. one that calls ``.view`` on a convolution's output) keeps its format, and the run's info says why.

The user's model is never converted: a job that runs channels_last scores candidates with a copy of the model whose
4-D weights are stored channels_last (:func:`channels_last_copy`), fed channels_last candidates. The copy computes
the same function as the model, up to the floating-point noise a change of batch size also makes.

Both are kept in the model's state (runtime.model_state: until a weight of the model is replaced or changed in place,
its modes change, or the model is freed): the copy, so that a later job runs the same copy, and with it the dense
step kept for it (methods.exact_step), and the measured choice per input shape, dtype, device, batch size and thread
count (:func:`clear_cache` forgets both). The copy refers to the model's state weakly (model_state.adopt): what jobs
keep for the copy is kept with the model.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import time

import torch
from torch import nn

from . import model_state, runinfo
from .calibration import candidate_probe
from .inputs import Prepared
from .model import Ensemble, ModelFn, model_memory_format

logger = logging.getLogger(__name__)

GAIN = 0.05  # channels_last is kept when its call is at least this much faster
ROUNDS = 3  # timed calls per format (after one warm-up call each), interleaved; the minimum counts


def clear_cache() -> None:
    """Forget the channels_last copies and the measured choices."""
    model_state.clear(("copy", "format"))


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
    baseline): what a job runs channels_last (the model given is not converted). The copy is made once per model and
    kept while the model's weights and modes (train or eval) stay the same."""
    state = model_state.state_of(fn.model)
    model = None if state is None else state.get("copy", "channels_last")
    if model is None:
        model = model_state.adopt(copy.deepcopy(fn.model).to(memory_format=torch.channels_last), state)
        if state is not None:
            state.put("copy", "channels_last", model)
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
    probes = {"given": candidate_probe(fn.unfixed().score, prep, targets), "channels_last": candidate_probe(cl_fn.unfixed().score, cl_prep,
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

    ``option``: True or False (the caller's), or None: measured (:func:`measure_formats`, once per model, input
    shape, dtype, device, batch size and thread count in a process) where :func:`convertible`, kept when at least
    ``GAIN`` faster, on a GPU or a CPU; never where not convertible, nor where the copy fails to run (the run's info
    says why). True where not convertible is refused with one line.
    """
    if option is True and not convertible(fn, prep.images):
        raise ValueError("channels_last=True needs 4-D images that are not float64 and a torch model with "
                         "convolutions not stored channels_last already")
    if option is not None:
        return option, {}
    if not convertible(fn, prep.images):
        return False, {}
    images = prep.images
    key = (tuple(images.shape[1:]), images.dtype, str(images.device), batch_size, torch.get_num_threads())
    state = model_state.state_of(fn.model)
    times = None if state is None else state.get("format", key)
    if times is None:
        try:
            times = measure_formats(fn, prep, batch_size)
        except Exception as exc:  # a model that cannot run channels_last (its own errors: any type)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            times = {"failed": f"{type(exc).__name__}: {first}"}
        if state is not None:
            state.put("format", key, times)
    if "failed" in times:
        logger.info("channels_last off: the channels_last copy failed (%s)", times["failed"])
        runinfo.note("channels_last", f"off: the channels_last copy failed ({times['failed']})")
        return False, {}
    pays = channels_last_pays(times)
    logger.info("channels_last %s: %.3g ms against %.3g ms per call of %d rows", "on" if pays else "off",
                1e3 * times["channels_last"], 1e3 * times["given"], batch_size)
    return pays, times
