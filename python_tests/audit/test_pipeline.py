"""audit/pipeline.py (Table 1 of Carter et al. 2021, on digits) with the training and the accuracy replaced by recorders:
which images each model is trained and evaluated on, with which seeds and epochs, the subsets' pixels by hand,
the rows' wording and the printed table. test_demo.py runs the real pipeline end to end.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import math
import time
import pytest
import torch
from overinterp_fast.audit import pipeline
from overinterp_fast.zoo.digits import load_digits
from helpers import LinearDigits


def _by_hand_subset(x: torch.Tensor, order: torch.Tensor, kept: int) -> torch.Tensor:
    """x [1, 8, 8] with only the last ``kept`` features of ``order`` present (0 elsewhere: the mean pixel)."""
    keep = torch.zeros(64, dtype=torch.bool)
    keep[order[-kept:]] = True
    return torch.where(keep.view(1, 8, 8), x, torch.zeros_like(x))


@pytest.mark.mutation
def test_pipeline_trains_and_evaluates_on_the_right_images(monkeypatch):
    trained, evaluated, loads = [], [], []

    def fake_load(seed):
        loads.append(seed)
        return load_digits(seed=seed)

    def fake_train(data, epochs, seed):
        trained.append({"x": data.x_train, "y": data.y_train, "epochs": epochs, "seed": seed})
        return LinearDigits(100 + len(trained), scale=4.0).eval()

    def fake_accuracy(model, x, y):
        evaluated.append((model, x, y))
        return 0.125 * len(evaluated)

    sis_calls = []
    real_sis = pipeline.fast_sis

    def fake_sis(model, x, threshold, **kw):
        sis_calls.append((x, threshold, kw))
        return real_sis(model, x, threshold, **kw)

    monkeypatch.setattr(pipeline, "load_digits", fake_load)
    monkeypatch.setattr(pipeline, "train_digits_cnn", fake_train)
    monkeypatch.setattr(pipeline, "accuracy", fake_accuracy)
    monkeypatch.setattr(pipeline, "fast_sis", fake_sis)
    t0 = time.perf_counter()
    out = pipeline.digits_pipeline(fraction=0.1, n_train=5, n_test=3, epochs=4, seed=7, show_progress=False,
                                   seeds=(7, 9))
    wall = time.perf_counter() - t0
    full = load_digits(seed=7)
    x_tr, y_tr, x_te, y_te = full.x_train[:5], full.y_train[:5], full.x_test[:3], full.y_test[:3]
    assert loads == [7]
    # backward selection of every training and test image with the full model, at tau 0.9, progress passed on
    assert [(len(x), tau, kw) for x, tau, kw in sis_calls] == [(5, 0.9, {"show_progress": False}),
                                                               (3, 0.9, {"show_progress": False})]
    # the full model (seed 7), then per seed of `seeds` one on the backward-selection subsets and one on random
    assert [(t["epochs"], t["seed"]) for t in trained] == [(4, 7), (4, 7), (4, 7), (4, 9), (4, 9)]
    assert all(torch.equal(t["y"], y_tr) for t in trained)
    assert torch.equal(trained[0]["x"], x_tr)
    # the backward-selection subsets: the last ceil(0.1 * 64) = 7 pixels of each image's exact order
    import overinterp_fast as of
    first = LinearDigits(101, scale=4.0).eval()
    orders_tr = [r.order for r in of.fast_sis(first, x_tr, 0.9)]
    orders_te = [r.order for r in of.fast_sis(first, x_te, 0.9)]
    bs_tr = torch.stack([_by_hand_subset(x, o, 7) for x, o in zip(x_tr, orders_tr)])
    bs_te = torch.stack([_by_hand_subset(x, o, 7) for x, o in zip(x_te, orders_te)])
    torch.testing.assert_close(trained[1]["x"], bs_tr, rtol=0, atol=0)
    torch.testing.assert_close(trained[3]["x"], bs_tr, rtol=0, atol=0)  # every seed trains on the same subsets
    torch.testing.assert_close(trained[4]["x"], trained[2]["x"], rtol=0, atol=0)  # the random ones too
    # random subsets: 7 pixels per image, the training ones seeded 7, the test ones 8 (not the same pixels)
    from overinterp_fast.audit.subsets import random_subsets
    rnd_tr = trained[2]["x"]
    torch.testing.assert_close(rnd_tr, random_subsets(x_tr, 0.1, seed=7)[0], rtol=0, atol=0)  # the run's seed
    kept_tr = (rnd_tr != 0).flatten(1).sum(1)
    assert kept_tr.tolist() == [7] * 5 and not torch.equal(rnd_tr != 0, bs_tr != 0)
    assert torch.equal(rnd_tr, torch.where(rnd_tr != 0, x_tr, rnd_tr))
    # the full model on full, backward-selection and random test images; then each new model on both subsets
    models = [m for m, _, _ in evaluated]
    assert [m.seed for m in models] == [101, 101, 101, 102, 102, 103, 103, 104, 104, 105, 105]
    xs = [x for _, x, _ in evaluated]
    assert torch.equal(xs[0], x_te)
    rnd_te = xs[2]
    torch.testing.assert_close(rnd_te, random_subsets(x_te, 0.1, seed=8)[0], rtol=0, atol=0)  # seed + 1
    assert (rnd_te != 0).flatten(1).sum(1).tolist() == [7] * 3
    assert not torch.equal(rnd_te != 0, rnd_tr[:3] != 0)  # seed + 1: other pixels than the training draw
    for k in (1, 3, 5, 7, 9):
        torch.testing.assert_close(xs[k], bs_te, rtol=0, atol=0)
    for k in (4, 6, 8, 10):
        torch.testing.assert_close(xs[k], rnd_te, rtol=0, atol=0)
    assert all(torch.equal(y, y_te) for _, _, y in evaluated)
    # accuracies 0.125, 0.25, ... in the order evaluated: per (trained on, evaluated on) the two seeds' runs, their
    # mean, sample std (two runs 0.5 apart: 0.5 / sqrt(2)), min, max and 95% t interval (t(0.975, 1) = 12.7062)
    t1 = 12.706204736174698

    def two(a, b):
        m, sd = (a + b) / 2, abs(b - a) / math.sqrt(2)
        return {"accuracy": m, "std": sd, "min": min(a, b), "max": max(a, b), "runs": [a, b], "seeds": [7, 9],
                "ci95": [m - t1 * sd / math.sqrt(2), m + t1 * sd / math.sqrt(2)]}

    want = [
        {"trained_on": "full images", "evaluated_on": "full images", "accuracy": 0.125},
        {"trained_on": "full images", "evaluated_on": "10% backward-selection subsets", "accuracy": 0.25},
        {"trained_on": "full images", "evaluated_on": "10% random subsets", "accuracy": 0.375},
        {"trained_on": "10% backward-selection subsets", "evaluated_on": "10% backward-selection subsets",
         **two(0.5, 1.0)},
        {"trained_on": "10% backward-selection subsets", "evaluated_on": "10% random subsets", **two(0.625, 1.125)},
        {"trained_on": "10% random subsets", "evaluated_on": "10% backward-selection subsets", **two(0.75, 1.25)},
        {"trained_on": "10% random subsets", "evaluated_on": "10% random subsets", **two(0.875, 1.375)},
    ]
    assert [set(r) for r in out["rows"]] == [set(w) for w in want]
    for got, w in zip(out["rows"], want):
        for key, value in w.items():
            assert got[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-12)), key
    assert out["seeds"] == [7, 9]
    assert (out["dataset"], out["train_images"], out["test_images"]) == ("sklearn digits (8x8)", 5, 3)
    assert (out["pixels_kept"], out["pixels"], out["fraction"]) == (7, 64, 0.1)
    assert isinstance(out["pixels_kept"], int) and isinstance(out["pixels"], int)
    s = out["seconds"]
    assert set(s) == {"train", "backward_selection", "total"}
    assert 0 <= s["train"] and 0 < s["backward_selection"] and s["total"] >= s["train"] + s["backward_selection"]
    assert s["total"] <= wall


@pytest.mark.mutation
def test_pipeline_defaults(monkeypatch):
    seen = {}

    def fake_load(seed):
        seen["seed"] = seed
        return load_digits()

    monkeypatch.setattr(pipeline, "load_digits", fake_load)

    def stop(data, epochs, seed):
        seen.update(epochs=epochs, train_seed=seed, n=len(data.y_train), n_test=len(data.y_test))
        raise RuntimeError("stop here")

    monkeypatch.setattr(pipeline, "train_digits_cnn", stop)
    with pytest.raises(RuntimeError, match="stop here"):
        pipeline.digits_pipeline()
    full = load_digits()
    assert seen == {"seed": 0, "epochs": 15, "train_seed": 0, "n": len(full.y_train), "n_test": len(full.y_test)}


@pytest.mark.mutation
def test_pipeline_default_fraction_is_five_percent(monkeypatch):
    monkeypatch.setattr(pipeline, "train_digits_cnn", lambda data, epochs, seed: LinearDigits(seed, scale=4.0).eval())
    shown = []
    real_sis = pipeline.fast_sis
    monkeypatch.setattr(pipeline, "fast_sis", lambda model, x, tau, show_progress: shown.append(show_progress) or
                        real_sis(model, x, tau, show_progress=False))
    pipeline.digits_pipeline(n_train=2, n_test=2, epochs=1, show_progress=True)
    assert shown == [True, True]
    shown.clear()
    out = pipeline.digits_pipeline(n_train=2, n_test=2, epochs=1)
    assert shown == [None, None]  # the default: a bar only on a terminal
    assert out["fraction"] == 0.05 and out["pixels_kept"] == math.ceil(0.05 * 64) == 4
    assert out["rows"][1]["evaluated_on"] == "5% backward-selection subsets"
    assert out["seeds"] == [0] and out["rows"][3]["runs"] == [out["rows"][3]["accuracy"]]  # one seed: the run's own
    assert out["rows"][3]["std"] is None and out["rows"][3]["ci95"] is None


@pytest.mark.mutation
def test_format_table_by_hand():
    result = {"rows": [{"trained_on": "full images", "evaluated_on": "full images", "accuracy": 0.98765},
                       {"trained_on": "a", "evaluated_on": "b", "accuracy": 0.1}]}
    assert pipeline.format_table(result) == "\n".join([
        "trained on" + " " * 25 + "evaluated on" + " " * 29 + "accuracy",
        "full images" + " " * 24 + "full images" + " " * 30 + "   0.988",
        "a" + " " * 34 + "b" + " " * 40 + "   0.100"])
    assert pipeline.format_table({"rows": []}) == f"{'trained on':<34} {'evaluated on':<40} {'accuracy':>8}"
