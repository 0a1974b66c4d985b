"""Figures a person can look at (matplotlib, headless)."""
from __future__ import annotations

import numpy as np

PANEL_TITLES = ("image", "SIS (red)", "SIS alone")


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def sis_panels(image, mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three views of one image's SIS, each scaled to [0, 1].

    Args:
        image: [H, W] or [H, W, 3] array in any display range (min-max scaled here).
        mask: bool [H, W], True on the SIS; None: no SIS (the overlay and the
            SIS-alone panel then show nothing of it).

    Returns:
        (norm, overlay, alone): norm is the image scaled to [0, 1] ([H, W] or
        [H, W, 3]); overlay float [H, W, 3] is the darkened grayscale image with the
        SIS in red; alone float [H, W, 3] is gray except the SIS's pixels in colour.
    """
    img = np.asarray(image, dtype=float)
    lo, hi = float(img.min()), float(img.max())
    norm = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
    gray = norm if norm.ndim == 2 else norm.mean(-1)
    overlay = np.stack([gray] * 3, -1) * 0.6
    alone = np.full(gray.shape + (3,), 0.5) if norm.ndim == 2 else np.full(norm.shape, 0.5)
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
