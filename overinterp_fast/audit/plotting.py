"""Figures a person can look at (matplotlib): one result (:func:`plot_sis`), and the headless figures of the
command line and the report."""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import numpy as np

from ..methods.results import score_text

PANEL_TITLES = ("image", "SIS (red)", "SIS alone")


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sis_panels(image, mask, baseline=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three views of one image's SIS, each scaled to [0, 1].

    Args:
        image: [H, W] or [H, W, 3] array in any display range (min-max scaled here).
        mask: bool [H, W], True on the SIS; None: no SIS (the overlay and the
            SIS-alone panel then show nothing of it).
        baseline: what a pixel outside the SIS shows in the SIS-alone panel: None for mid-grey, or an array
            of the image's shape in the image's units (scaled as the image is, then clipped to [0, 1]).

    Returns:
        (norm, overlay, alone): norm is the image scaled to [0, 1] ([H, W] or
        [H, W, 3]); overlay float [H, W, 3] is the darkened grayscale image with the
        SIS in red; alone float [H, W, 3] is the baseline (gray) except the SIS's pixels in colour.
    """
    img = np.asarray(image, dtype=float)
    lo, hi = float(img.min()), float(img.max())
    norm = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    gray = norm if norm.ndim == 2 else norm.mean(-1)
    overlay = np.stack([gray] * 3, -1) * 0.6
    if baseline is None:
        alone = np.full(gray.shape + (3,), 0.5) if norm.ndim == 2 else np.full(norm.shape, 0.5)
    else:
        base = np.asarray(baseline, dtype=float)
        if base.shape != img.shape:
            raise ValueError(f"the baseline has shape {list(base.shape)}; the image {list(img.shape)}")
        base = np.clip((base - lo) / (hi - lo) if hi > lo else np.zeros_like(base), 0.0, 1.0)
        alone = np.stack([base] * 3, -1) if base.ndim == 2 else base
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        overlay[mask] = [1.0, 0.1, 0.1]
        alone[mask] = (np.stack([norm] * 3, -1) if norm.ndim == 2 else norm)[mask]
    return norm, overlay, alone


def show_panel(ax, panel: np.ndarray, title: str | None = None, cmap: str = "gray", fontsize: float = 9) -> None:
    """Draw one panel in [0, 1] ([H, W] with ``cmap`` or [H, W, 3]) on ``ax``, without ticks."""
    ax.imshow(panel, cmap=cmap if panel.ndim == 2 else None, interpolation="nearest", vmin=0, vmax=1)
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title, fontsize=fontsize)


def sis_figure(images, masks, titles, path, cmap="gray", dpi=120):
    """One row per image: the original, the SIS over it (red), and the SIS alone.

    images: list of [H, W] or [H, W, 3] arrays in display range; masks: list of
    bool [H, W] arrays (None: no SIS); titles: one string per row.
    """
    plt = pyplot()
    n = len(images)
    fig, axes = plt.subplots(n, 3, figsize=(6.6, 2.2 * n), squeeze=False)
    for row, (img, mask, title) in enumerate(zip(images, masks, titles)):
        for col, panel in enumerate(sis_panels(img, mask)):
            show_panel(axes[row, col], panel, PANEL_TITLES[col] if row == 0 else None, cmap)
        axes[row, 0].set_ylabel(title, fontsize=8, rotation=0, ha="right", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _hwc(image, what: str) -> np.ndarray:
    """An image as a person sees it: [H, W] or [H, W, 3] from an array or tensor [H, W], [H, W, C] or [C, H, W]
    (C = 1 or 3; a one-channel image becomes [H, W])."""
    import torch

    if isinstance(image, torch.Tensor):
        arr = image.detach().cpu().float().numpy()
        if arr.ndim == 3 and arr.shape[0] in (1, 3):
            arr = arr.transpose(1, 2, 0)  # tensors are channels first
    else:
        arr = np.asarray(image)
        if arr.ndim == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
            arr = arr.transpose(1, 2, 0)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[..., 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] == 3)):
        raise ValueError(f"{what} must be [H, W], [H, W, 3] or [C, H, W] with C = 1 or 3, got {list(arr.shape)}")
    return arr


def plot_sis(result, image, ax=None, *, baseline=None):
    """Draw one :class:`~overinterp_fast.SISResult` with matplotlib: the image, and its SIS alone on the baseline
    (every pixel outside the SIS shown as the baseline: mid-grey by default).

    Args:
        result: a result with a pixel mask [H, W] (the default pixel features), e.g. ``fast_sis(...)[0]``.
        image: the image: [H, W], [H, W, 3] or [C, H, W] (a tensor: channels first), in any range (min-max
            scaled for display), e.g. the model input itself or the uint8 display of an audit.
        ax: None: a new figure with two axes (image, SIS alone); one matplotlib Axes: the SIS alone on it; a
            pair of Axes: both panels.
        baseline: what a pixel outside the SIS shows: None for mid-grey, or an image like ``image`` in the same
            units (e.g. the masked input).

    Returns:
        The list of Axes drawn on ([image, SIS] or [SIS]).
    """
    from ..methods.results import SISResult

    if not isinstance(result, SISResult):
        raise TypeError(f"plot_sis draws one SISResult, got {type(result).__name__}")
    img = _hwc(image, "image")
    base = None if baseline is None else _hwc(baseline, "baseline")
    mask = None if result.mask is None else result.mask.detach().cpu().numpy()
    if mask is not None and mask.shape != img.shape[:2]:
        raise ValueError(f"plot_sis needs a pixel mask on the image's grid {list(img.shape[:2])}; this result's "
                         f"mask is {list(mask.shape)}")
    norm, _, alone = sis_panels(img, mask, base)
    if ax is None:
        import matplotlib.pyplot as plt

        _, axes = plt.subplots(1, 2, figsize=(6.0, 3.2))
        axes = list(axes)
    else:
        axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
        if len(axes) not in (1, 2):
            raise ValueError(f"ax: one Axes (the SIS) or two (image, SIS), got {len(axes)}")
    tau = result.threshold

    def num(v: float) -> str:  # two decimals, more where they would round f onto 0, 1 or tau
        return score_text(v, tau, digits=2, fixed=True)

    if result.sis is None:
        sis_title = f"no SIS: f(x) {num(result.score)} < tau {num(tau)}"
    else:
        verified = "" if result.sis_score is None else f", f(SIS) {num(result.sis_score)}"
        sis_title = f"SIS: {result.size} px ({result.fraction:.1%}){verified}"
    if len(axes) == 2:
        show_panel(axes[0], norm, f"class {result.target}: f(x) {num(result.score)}")
    show_panel(axes[-1], alone, sis_title)
    return axes
