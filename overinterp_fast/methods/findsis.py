"""FindSIS over a backward-selection result."""
from __future__ import annotations

import numpy as np
import torch


def sis_start(values, threshold: float) -> int:
    """Where the SIS starts in the masking order: 1 + the last t with ``values[t] >= threshold`` (0 when none).

    Args:
        values: [m] (a tensor or a numpy array), ``values[t]`` = f with only ``order[t+1:]`` present.
    """
    passing = np.flatnonzero(_host(values) >= threshold)
    return 0 if passing.size == 0 else int(passing[-1]) + 1


def sis_starts(values: np.ndarray, lengths: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """:func:`sis_start` of many rounds at once: row k's values are ``values[k, :lengths[k]]``.

    Args:
        values: float [K, M]; lengths: int [K] (at most M); thresholds: float [K].

    Returns:
        int64 [K]: 1 + the last t < lengths[k] with ``values[k, t] >= thresholds[k]``, 0 when none.
    """
    m = values.shape[1]
    passing = (values >= np.asarray(thresholds, dtype=np.float64)[:, None]) & (np.arange(m) < lengths[:, None])
    last = m - np.argmax(passing[:, ::-1], axis=1)  # 1 + the last passing t (m - 0 when only t = m - 1 passes)
    return np.where(passing.any(1), last, 0).astype(np.int64)


def find_sis(order, values, threshold: float) -> torch.Tensor:
    """The SIS of a backward selection, last-masked first.

    Args:
        order: int64 [m], features in masking order (a tensor or a numpy array).
        values: [m], ``values[t]`` = f with only ``order[t+1:]`` present.
        threshold: tau.

    Returns:
        int64 [k] on the CPU: ``order[t+1:]`` reversed for the largest t with
        ``values[t] >= threshold``; all of ``order`` reversed when no value
        reaches it; empty when the fully masked input (``values[-1]``) passes.
        (The reference sis.py skips the last-masked feature in that case; we
        return the empty SIS, as docs/algorithms.md, Exact SIS, says.) The caller checks the
        precondition f(x) >= threshold.
    """
    if order.shape != values.shape or len(order.shape) != 1:
        raise ValueError("order and values must be 1-D and of the same length")
    # on the host, in numpy: the loops call it once per image and round, and each torch op there is a dispatch
    return torch.from_numpy(_host(order)[sis_start(values, threshold):][::-1].copy())


def sis_score(values, score: float, sis_size: int) -> float:
    """f with only the SIS present, read off a backward selection: the value just
    before the SIS's first feature was masked (``score``, f of the whole input,
    when the SIS is every feature)."""
    start = len(values) - sis_size
    return float(_host(values)[start - 1]) if start > 0 else float(score)


def _host(t) -> np.ndarray:
    """A numpy array as it is; a CPU tensor's numpy view; a copy from another device."""
    if isinstance(t, np.ndarray):
        return t
    t = t.detach()
    return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
