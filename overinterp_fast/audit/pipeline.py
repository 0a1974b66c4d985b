"""The overinterpretation pipeline of Carter et al. 2021 (as their code's README runs it) on sklearn's real digits.

Train on full images; run exact backward selection on every train and test image
with that model; keep each image's last 5% (its most sufficient pixels) and mask
the rest; train a new model on those subsets and another on random 5% subsets;
evaluate each on the matching test subsets. Table 1's shape, in minutes on a CPU.
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import dataclasses
import time

import torch

from ..api import fast_sis
from ..runtime.renames import renamed_keywords
from ..zoo.digits import accuracy, load_digits, train_digits_cnn
from .subsets import pixel_subsets, random_subsets


from .config import EPOCHS, FRACTION  # noqa: E402  (the pipeline's defaults)


@renamed_keywords(progress="show_progress")
def digits_pipeline(
    fraction: float = FRACTION,
    n_train: int | None = None,
    n_test: int | None = None,
    epochs: int = EPOCHS,
    seed: int = 0,
    show_progress: bool | None = None,
) -> dict:
    """Run the pipeline; returns {"rows": [...], "seconds": ..., ...}.

    Rows (model trained on -> evaluated on, accuracy): full -> full; full -> its
    5% backward-selection subsets; 5% backward selection -> 5% backward selection;
    5% random -> 5% random. n_train / n_test cap the images used (None: all).
    """
    t0 = time.perf_counter()
    data = load_digits(seed=seed)
    data = dataclasses.replace(
        data, x_train=data.x_train[:n_train], y_train=data.y_train[:n_train],
        x_test=data.x_test[:n_test], y_test=data.y_test[:n_test], raw_test=data.raw_test[:n_test],
    )
    model = train_digits_cnn(data, epochs=epochs, seed=seed)
    t_train = time.perf_counter()
    # Backward selection does not depend on the threshold; 0.9 only decides which images also get an SIS.
    with torch.no_grad():
        res_train = fast_sis(model, data.x_train, 0.9, show_progress=show_progress)
        res_test = fast_sis(model, data.x_test, 0.9, show_progress=show_progress)
    t_bs = time.perf_counter()
    bs_train, _ = pixel_subsets(data.x_train, res_train, fraction)
    bs_test, _ = pixel_subsets(data.x_test, res_test, fraction)
    rnd_train, _ = random_subsets(data.x_train, fraction, seed=seed)
    rnd_test, _ = random_subsets(data.x_test, fraction, seed=seed + 1)
    model_bs = train_digits_cnn(dataclasses.replace(data, x_train=bs_train), epochs=epochs, seed=seed)
    model_rnd = train_digits_cnn(dataclasses.replace(data, x_train=rnd_train), epochs=epochs, seed=seed)
    pixels = bs_train[0].numel()
    kept = pixel_subsets(data.x_train[:1], res_train[:1], fraction)[1].sum().item()
    rows = [
        {"trained_on": "full images", "evaluated_on": "full images", "accuracy": accuracy(model, data.x_test, data.y_test)},
        {"trained_on": "full images", "evaluated_on": f"its {fraction:.0%} backward-selection subsets",
         "accuracy": accuracy(model, bs_test, data.y_test)},
        {"trained_on": f"{fraction:.0%} backward-selection subsets", "evaluated_on": "the same kind",
         "accuracy": accuracy(model_bs, bs_test, data.y_test)},
        {"trained_on": f"{fraction:.0%} random subsets", "evaluated_on": "the same kind",
         "accuracy": accuracy(model_rnd, rnd_test, data.y_test)},
    ]
    return {
        "dataset": "sklearn digits (8x8)", "train_images": len(data.y_train), "test_images": len(data.y_test),
        "pixels_kept": int(kept), "pixels": int(pixels), "fraction": fraction, "rows": rows,
        "seconds": {"train": t_train - t0, "backward_selection": t_bs - t_train, "total": time.perf_counter() - t0},
    }


def format_table(result: dict) -> str:
    lines = [f"{'trained on':<34} {'evaluated on':<40} {'accuracy':>8}"]
    for r in result["rows"]:
        lines.append(f"{r['trained_on']:<34} {r['evaluated_on']:<40} {r['accuracy']:>8.3f}")
    return "\n".join(lines)
