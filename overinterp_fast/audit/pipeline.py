"""The overinterpretation pipeline of Carter et al. 2021 (as their code's README runs it) on sklearn's real digits.

Train on full images; run exact backward selection on every train and test image
with that model; keep each image's last 5% (its most sufficient pixels) and mask
the rest; train new models on those subsets and on random 5% subsets, one per seed;
evaluate each on both kinds of test subsets. Table 1's shape, in minutes on a CPU;
the seeds, the runs and their spread are :mod:`overinterp_fast.audit.retraining`'s, which
runs the same experiment on the pixel-subset files of a stored audit (CIFAR-10).
"""
from __future__ import annotations

from ..util.optional import require

require("audit", "the audit")  # before any of its modules: one line when the extra is missing

import dataclasses
import time
from typing import Sequence

import torch

from ..api import fast_sis
from ..runtime.renames import renamed_keywords
from ..zoo.digits import accuracy, load_digits, train_digits_cnn
from .retraining import KINDS, format_table, kind_label, run_rows, seeded_runs  # noqa: F401  (format_table: here too)
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
    seeds: Sequence[int] | None = None,
) -> dict:
    """Run the pipeline; returns {"rows": [...], "seconds": ..., ...}.

    Rows (model trained on -> evaluated on, accuracy): full -> full, its 5% backward-selection subsets and
    random 5% subsets (the model of ``seed``); then 5% backward selection and 5% random, each evaluated on both,
    one new model per seed of ``seeds`` (None: ``seed`` alone), with the spread over the seeds
    (:func:`~overinterp_fast.audit.retraining.spread`: mean as "accuracy", "std", "min", "max", "ci95", "runs").
    The random pixels are drawn once, from ``seed``: every new model trains on the same subsets. n_train /
    n_test cap the images used (None: all).
    """
    seeds = (seed,) if seeds is None else tuple(seeds)
    if not seeds:
        raise ValueError("seeds: give at least one")
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
    train_x = {"backselect": bs_train, "random": rnd_train}
    test_x = {"full": data.x_test, "backselect": bs_test, "random": rnd_test}
    rows = [{"trained_on": "full images", "evaluated_on": kind_label(kind, fraction),
             "accuracy": accuracy(model, test_x[kind], data.y_test)} for kind in ("full", *KINDS)]
    runs = seeded_runs(lambda kind, s: train_digits_cnn(dataclasses.replace(data, x_train=train_x[kind]),
                                                        epochs=epochs, seed=s),
                       lambda m, kind: accuracy(m, test_x[kind], data.y_test), seeds)
    pixels = bs_train[0].numel()
    kept = pixel_subsets(data.x_train[:1], res_train[:1], fraction)[1].sum().item()
    return {
        "dataset": "sklearn digits (8x8)", "train_images": len(data.y_train), "test_images": len(data.y_test),
        "pixels_kept": int(kept), "pixels": int(pixels), "fraction": fraction, "seeds": list(seeds),
        "rows": rows + run_rows(runs, fraction),
        "seconds": {"train": t_train - t0, "backward_selection": t_bs - t_train, "total": time.perf_counter() - t0},
    }
