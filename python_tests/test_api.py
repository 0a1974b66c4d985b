"""Bad input gets a clear error, never a wrong answer.

The public entry points' wiring (api.py) checked by hand: the argument checks with their whole messages, the
criteria and slack functions, the row estimates, and, with recorders in place of the engine choice and the
algorithms, every option fast_sis, responsibility and sufficient_subset pass on. A wrong option passed on (a
depth of 9, the wrong seed, a monotone rule, the guide dropped) changes what a user gets without raising; the
result-level tests (methods/test_responsibility.py, methods/test_exact.py, ...) see some of these, these
tests see each one.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the behavioural tests above let through, with every expectation worked out by hand.
"""
import dataclasses

import pytest
import torch
from torch import nn
import overinterp_fast as of
from helpers import make_cnn, make_images
import math
from overinterp_fast import api
from overinterp_fast.attr import exact as attr_exact, gradient as attr_gradient, minimal as attr_minimal
from overinterp_fast.attr import responsibility as attr_resp, subset as attr_subset
from overinterp_fast.runtime import job
from overinterp_fast.runtime.batching import CandidateEvaluator
from overinterp_fast.runtime.engines import Engine
from overinterp_fast.runtime.model import ModelFn
from overinterp_fast.methods.extraction import ExtractionConfig
from overinterp_fast.methods.responsibility import DescentPlan, ResponsibilityMap
from helpers import make_cnn, make_images, whole_message


@pytest.fixture
def model():
    return make_cnn(0)


@pytest.fixture
def x():
    return make_images(2)


def test_wrong_rank_and_empty(model, x):
    with pytest.raises(ValueError, match="batch dimension"):
        of.fast_sis(model, torch.randn(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="empty batch"):
        of.fast_sis(model, x[:0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        of.fast_sis(model, x.numpy())


def test_single_image_without_batch_dimension(model, x):
    for method in ("exact", "gradient", "responsibility"):
        with pytest.raises(ValueError, match=r"images must have a batch dimension: pass images\[None\]"):
            of.fast_sis(model, x[0], None if method == "responsibility" else 0.5, method=method)
    with pytest.raises(ValueError, match=r"images must have a batch dimension: pass images\[None\]"):
        of.responsibility(model, x[0])
    # a model that fails for another reason keeps its own reason (the probe is not fooled), in one line
    with pytest.raises(ValueError, match=whole_message("the model fails on the inputs, shape [2, 4, 5, 5]: its first "
                                                       "layer, Conv2d 'conv1', takes 3 channels; the inputs have 4")):
        of.fast_sis(model, make_images(2, c=4), 0.5)
    with pytest.raises(ValueError, match=whole_message("the model fails on the inputs, shape [4, 5, 5]: its first "
                                                       "layer, Conv2d 'conv1', takes inputs [N, C, H, W] of 3 "
                                                       "channels")):
        of.fast_sis(model, make_images(2, c=4)[0], 0.5)  # not one sample of 3 channels either


def test_non_float_and_non_finite(model, x):
    with pytest.raises(TypeError, match="floating point"):
        of.fast_sis(model, (x * 10).to(torch.int64))
    bad = x.clone()
    bad[1, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or inf \(first examples affected: \[1\]\)"):
        of.fast_sis(model, bad)
    bad[1, 0, 2, 2] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        of.fast_sis(model, bad)


@pytest.mark.parametrize("tau", [-0.1, 1.5, float("nan")])
def test_threshold_outside_unit_interval(model, x, tau):
    with pytest.raises(ValueError, match=r"threshold must lie in \[0, 1\]"):
        of.fast_sis(model, x, tau)


def test_threshold_type(model, x):
    with pytest.raises(TypeError, match="threshold"):
        of.fast_sis(model, x, "0.9")
    with pytest.raises(ValueError, match="one entry per image"):
        of.fast_sis(model, x, [0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        of.fast_sis(model, x, torch.tensor([0.5, 1.5]))


def test_feature_map_that_does_not_fit(model, x):
    with pytest.raises(ValueError, match="does not fit"):
        of.fast_sis(model, x, 0.5, feature_mask=torch.zeros(4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="0..p-1"):
        of.fast_sis(model, x, 0.5, feature_mask=torch.arange(25).view(5, 5) + 1)
    with pytest.raises(TypeError, match="integer"):
        of.fast_sis(model, x, 0.5, feature_mask=torch.zeros(5, 5))


def test_bad_mask_value(model, x):
    with pytest.raises(ValueError, match="finite"):
        of.fast_sis(model, x, 0.5, baselines=float("nan"))
    with pytest.raises(ValueError, match="fits neither"):
        of.fast_sis(model, x, 0.5, baselines=torch.zeros(4, dtype=torch.float64))


def test_model_returning_wrong_shape(x):
    class Flat(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:1]

    with pytest.raises(ValueError, match=r"\[B, K\]"):
        of.fast_sis(Flat().eval(), x, 0.5)
    with pytest.raises(TypeError, match="tensor"):
        of.fast_sis(lambda t: t.sum().item(), x, 0.5)


def test_model_dtype_device_and_mode(model, x):
    with pytest.raises(TypeError, match="float32 but images are torch.float64|images are torch.float64"):
        of.fast_sis(model.float(), x, 0.5)
    train = make_cnn(0).train()
    with pytest.raises(ValueError, match="training mode"):
        of.fast_sis(train, x, 0.5)
    meta = make_cnn(0).to("meta")
    with pytest.raises(ValueError, match="different devices"):
        of.fast_sis(meta, x, 0.5)


def test_non_finite_model_scores(x):
    class NaNWhenMasked(nn.Module):
        def forward(self, t):
            s = t.flatten(1).sum(1)
            nan = torch.where(t.flatten(1).eq(0).any(1), torch.full_like(s, float("nan")), s)
            return torch.stack([nan, torch.zeros_like(s)], 1)

    with pytest.raises(FloatingPointError, match="NaN or inf"):
        of.fast_sis(NaNWhenMasked().eval(), x.abs() + 1, 0.1)


def test_bad_options(model, x):
    with pytest.raises(ValueError, match="batch_size"):
        of.fast_sis(model, x, 0.5, batch_size=0)
    with pytest.raises(ValueError, match="method"):
        of.fast_sis(model, x, 0.5, method="magic")
    with pytest.raises(ValueError, match="outputs"):
        of.fast_sis(model, x, 0.5, outputs="logprobs")
    with pytest.raises(ValueError, match="target classes"):
        of.fast_sis(model, x, 0.5, target=99)
    with pytest.raises(ValueError, match="one entry per image"):
        of.fast_sis(model, x, 0.5, target=torch.tensor([0, 1, 2]))


# ----------------------------------------------------------------------------------------------------
# The public entry points' wiring (api.py) checked by hand: the argument checks with their whole messages, the
# ----------------------------------------------------------------------------------------------------

SENTINEL = ["the algorithm's result"]


# ---------------------------------------------------------------- small functions, by hand

@pytest.mark.mutation
def test_responsibility_rows_by_hand():
    # 14 mutants per active box and descent, about 6 levels; "auto": one descent per image at a time, ~13 of them
    assert attr_resp.responsibility_rows(3, 8) == (3 * 8 * 14, 3 * 8 * 14 * 6)
    assert attr_resp.responsibility_rows(1, 20) == (280, 1680)
    assert attr_resp.responsibility_rows(3, "auto") == (42, 3 * 13 * 14 * 6)


@pytest.mark.mutation
def test_passes_top1_and_threshold():
    top1 = job.passes("top1", [0.5, 0.9])
    assert top1(0, 0.0, True) is True and top1(1, 1.0, False) is False
    assert top1(0, 0.0, torch.tensor(True)) is True  # a bool, whatever the top-1 flag's type
    thr = job.passes("threshold", [0.5, 0.9])
    assert thr(0, 0.5, False) and not thr(0, 0.49, True)  # f >= tau, the top-1 flag unused
    assert thr(1, 0.9, False) and not thr(1, 0.89, True)  # the image's own threshold
    with pytest.raises(ValueError, match=whole_message("criterion must be one of ('top1', 'threshold'), got 'TOP1'")):
        job.passes("TOP1", [0.5])


@pytest.mark.mutation
def test_slack_top1_is_the_margin_and_threshold_the_log_ratio():
    top1 = job.slack("top1", [0.5])
    assert top1(0, 0.01, False, -2.5) == -2.5 and top1(0, 0.99, True, 1.75) == 1.75
    thr = job.slack("threshold", [0.5, 0.2])
    assert thr(0, 0.25, True, 9.0) == pytest.approx(math.log(0.25) - math.log(0.5), abs=1e-15)
    assert thr(1, 0.4, False, -9.0) == pytest.approx(math.log(2.0), abs=1e-15)
    assert thr(0, 0.5, False, 0.0) == 0.0  # passing exactly at tau: slack 0, not negative
    # f = 0 (or tau = 0) stays finite: log is taken of at least 1e-300
    assert thr(0, 0.0, False, 0.0) == pytest.approx(math.log(1e-300) - math.log(0.5), rel=1e-12)
    assert job.slack("threshold", [0.0])(0, 0.0, False, 0.0) == 0.0
    assert job.slack("threshold", [0.0])(0, 1e-300, False, 0.0) == 0.0
    assert job.slack("threshold", [0.0])(0, 1.0, False, 0.0) == pytest.approx(-math.log(1e-300), rel=1e-12)


@pytest.mark.mutation
def test_check_prefix_search_messages():
    for ok in ("guided", "scan"):
        job.check_prefix_search(ok)
    for bad in ("Guided", "", None, ("guided",), 1):
        with pytest.raises(ValueError, match=whole_message(
                f"prefix_search must be one of ('guided', 'scan'), got {bad!r}")):
            job.check_prefix_search(bad)


@pytest.mark.mutation
def test_check_flag_takes_only_the_three_objects():
    for ok in (True, False):
        job.check_flag("monotone", ok, none=False)
        job.check_flag("monotone", ok, none=True)
    job.check_flag("incremental", None, none=True)
    with pytest.raises(ValueError, match=whole_message("monotone must be True or False, got None")):
        job.check_flag("monotone", None, none=False)
    for bad in (1, 0, "True"):
        with pytest.raises(ValueError, match=whole_message(f"monotone must be None, True or False, got {bad!r}")):
            job.check_flag("monotone", bad, none=True)
        with pytest.raises(ValueError, match=whole_message(f"flag must be True or False, got {bad!r}")):
            job.check_flag("flag", bad, none=False)


@pytest.mark.mutation
def test_check_refine_and_its_budget():
    for ok in (True, False, "boundary"):
        job.check_refine(ok)
    for bad in (1, 0, "Boundary", None, "auto"):
        with pytest.raises(ValueError, match=whole_message(f"refine must be True, False or 'boundary', got {bad!r}")):
            job.check_refine(bad)
    for ok in (None, "auto", 0, 1, 500):
        job.check_refine(True, ok)
    for bad in (-1, True, False, 1.5, "Auto", "none"):
        with pytest.raises(ValueError, match=whole_message(
                f"refine_budget must be 'auto', an int >= 0 or None, got {bad!r}")):
            job.check_refine(True, bad)


@pytest.mark.mutation
def test_check_pixels_messages():
    model, x = make_cnn(0), make_images(2)
    msg = "responsibility works on images [N, C, H, W] with the default pixel features (feature_mask=None)"
    patches = torch.arange(25).view(5, 5) // 5  # 5 features, not pixels
    s = job.setup(model, x, 0.5, patches, 0.0, "logits", 4, "exact")
    with pytest.raises(ValueError, match=whole_message(msg)):
        job.check_pixels(s, "responsibility")
    job.check_pixels(job.setup(model, x, 0.5, None, 0.0, "logits", 4, "exact"), "x")
    with pytest.raises(ValueError, match=whole_message(msg)):  # a feature map, even one id per pixel, is not pixels
        job.check_pixels(job.setup(model, x, 0.5, torch.arange(25).view(5, 5), 0.0, "logits", 4, "exact"),
                          "responsibility")
    flat = job.setup(lambda v: v[:, :3] * 4, torch.randn(2, 6, dtype=torch.float64), 0.5, None, 0.0, "logits", 4,
                      "exact")
    with pytest.raises(ValueError, match=whole_message("what " + msg[len("responsibility "):])):
        job.check_pixels(flat, "what")
    with pytest.raises(ValueError, match=whole_message(
            'method="responsibility" ' + msg[len("responsibility "):] + "; images must have a batch dimension: "
            "pass images[None]")):
        of.fast_sis(lambda v: v.flatten(1)[:, :3], x[0], method="responsibility")


# ---------------------------------------------------------------- _setup

@pytest.mark.mutation
def test_setup_batch_size_device_and_runner(monkeypatch):
    model, x = make_cnn(0), make_images(2)
    seen = []
    monkeypatch.setattr(job, "auto_batch_size", lambda images, total_candidates: seen.append(
        (images.shape, total_candidates)) or 11)
    s = job.setup(model, x, [0.5, 0.6], None, 0.0, "probabilities", None, "exact")
    assert seen == [(x.shape, 2 * 25)]  # every candidate of the job: images x features
    assert s.runner.chunk == 11 and s.runner.device == x.device and s.batch_size is None
    assert s.thresholds == [0.5, 0.6] and s.fn.outputs == "probabilities" and s.fn.model is model
    s = job.setup(model, x, 0.5, None, 0.0, "logits", 5, "exact")
    assert len(seen) == 1 and s.runner.chunk == 5 and s.batch_size == 5  # the user's size: no guess
    assert s.fn.outputs == "logits"
    with pytest.raises(ValueError, match="batch_size"):
        job.setup(model, x, 0.5, None, 0.0, "logits", 0, "exact")


@pytest.mark.mutation
def test_setup_keeps_channels_last_for_a_channels_last_model():
    model, x = make_cnn(0).to(memory_format=torch.channels_last), make_images(2)
    s = job.setup(model, x, 0.5, None, 0.0, "logits", 4, "exact")
    assert s.prep.images.is_contiguous(memory_format=torch.channels_last)
    s = job.setup(make_cnn(0), x, 0.5, None, 0.0, "logits", 4, "exact")
    assert s.prep.images.is_contiguous() and not s.prep.images.is_contiguous(memory_format=torch.channels_last)
    # not 4-d: left as it is
    s = job.setup(model, x.flatten(1), 0.5, None, 0.0, "logits", 4, "exact")
    assert s.prep.images.dim() == 2


@pytest.mark.mutation
def test_setup_refuses_gradients_on_onnx(tmp_path):
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    path = str(tmp_path / "m.onnx")
    of.export_onnx(model, path, x)
    onnx = of.OnnxModel(path)
    for method in ("exact", "responsibility"):
        job.setup(onnx, x, 0.5, None, 0.0, "logits", 4, method)
    with pytest.raises(ValueError, match=whole_message(
            "method='gradient' needs gradients, and ONNX Runtime has no autograd; on ONNX models use a black-box "
            "method: 'exact', 'responsibility'")):
        job.setup(onnx, x, 0.5, None, 0.0, "logits", 4, "gradient")


# ---------------------------------------------------------------- recorders

class Recorder:
    """Stands in for select_engine, ranking_maps, extract_sets, exact_sis and gradient_sis where the attr classes
    call them, and records calls (a config object's or plan's fields as entries of the record)."""

    def __init__(self, monkeypatch, batch=7, verify=False):
        self.engines, self.maps, self.extracts, self.exacts, self.gradients = [], [], [], [], []
        self.batch, self.verify = batch, verify
        monkeypatch.setattr(job, "select_engine", self.select_engine)
        for module, name in ((attr_resp, "ranking_maps"), (attr_minimal, "ranking_maps"),
                             (attr_minimal, "extract_sets"), (attr_subset, "extract_sets"),
                             (attr_exact, "exact_sis"), (attr_gradient, "gradient_sis")):
            monkeypatch.setattr(module, name, getattr(self, name))
        # exact SIS's results get the call's info: none to give to the SENTINEL the stand-in returns
        monkeypatch.setattr(attr_exact, "with_info", lambda results, *a, **k: results)

    def select_engine(self, engine, user, prep, targets, **kw):
        self.engines.append({"engine": engine, "user": user, "prep": prep, "targets": targets, **kw})
        fn = ModelFn(user.model, outputs=user.outputs) if self.verify else user
        return Engine("onnxruntime" if self.verify else "torch", fn, self.batch, None, self.verify)

    def ranking_maps(self, evaluator, prep, present, passes, plan):
        assert type(plan) is DescentPlan
        self.maps.append({"evaluator": evaluator, "prep": prep, "present": present, "passes": passes,
                          "args": (plan.iterations, plan.depth, plan.min_box, plan.seed, plan.progress,
                                   plan.monotone), "hook": plan.hook})
        n, _, h, w = prep.images.shape
        maps = torch.arange(n * h * w, dtype=torch.float64).view(n, h, w)
        return maps, [100 + i for i in range(n)]

    def extract_sets(self, evaluator, prep, targets, scores0, thresholds, rank_fn, passes, config):
        assert type(config) is ExtractionConfig
        present = torch.ones(prep.images.shape[0], prep.num_features, dtype=torch.bool)
        self.extracts.append({"evaluator": evaluator, "prep": prep, "targets": targets, "scores0": scores0,
                              "ranked": rank_fn(present), "passes": passes, "thresholds": thresholds,
                              **{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}})
        return SENTINEL

    def exact_sis(self, fn, prep, targets, scores0, **kw):
        self.exacts.append({"fn": fn, "prep": prep, "targets": targets, "scores0": scores0, **kw})
        return SENTINEL

    def gradient_sis(self, fn, prep, targets, scores0, **kw):
        self.gradients.append({"fn": fn, "prep": prep, "targets": targets, "scores0": scores0, **kw})
        return SENTINEL


def _check_evaluator(ev, fn_model, prep, targets, chunk=7):
    """A CandidateEvaluator on ``prep`` scoring (f, top-1) of ``targets`` with ``fn_model``, ``chunk`` rows a call."""
    assert isinstance(ev, CandidateEvaluator) and ev.fn.model is fn_model and ev.prep is prep
    assert ev.targets.tolist() == targets and ev.runner.chunk == chunk and ev.measure == ev.fn.score_and_top1


def _scores0(model, x, targets):
    with torch.no_grad():
        return torch.softmax(model(x), 1)[torch.arange(len(targets)), targets].double()


def _top(model, x):
    with torch.no_grad():
        return model(x).argmax(1).tolist()


@pytest.mark.mutation
def test_fast_sis_responsibility_passes_every_option(monkeypatch):
    rec = Recorder(monkeypatch)
    model, x = make_cnn(0, h=56, w=112), make_images(2, h=56, w=112)
    out = of.fast_sis(model, x, method="responsibility", show_progress=False, collection=True,
                      options=of.MinimalPixelSetOptions(iterations=5, seed=17, refine_budget=40))
    assert out is SENTINEL
    (eng,) = rec.engines
    assert eng["targets"].tolist() == _top(model, x) and eng["prep"] is rec.maps[0]["prep"]
    assert eng["prep"] is rec.extracts[0]["prep"] and torch.equal(eng["prep"].images, x)
    assert bool((eng["prep"].baseline == 0).all())  # mask_value 0 by default
    # the engine's batch size (7) rounded down to a power of two: the ladder's shapes (runtime.batching.ladder)
    _check_evaluator(rec.extracts[0]["evaluator"], model, eng["prep"], _top(model, x), chunk=4)
    assert eng["engine"] == "auto" and eng["batch_size"] is None and eng["measure_fn"] == "score_and_top1"
    assert (eng["max_rows"], eng["expected_rows"]) == (2 * 5 * 14, 2 * 5 * 14 * 6)
    assert eng["exact_shape"] is None and eng["rival_s"] is None
    (m,) = rec.maps
    # iterations, depth 10, min_box 10 (ReX's), seed, progress, monotone (None and refine=True: on); no research hook
    assert m["args"] == (5, 10, 10, 17, False, True) and m["hook"] is None
    assert m["present"].shape == (2, 56 * 112) and bool(m["present"].all())
    (e,) = rec.extracts
    assert e["evaluator"] is m["evaluator"] and e["evaluator"].runner.chunk == 4
    assert e["evaluator"].measure == e["evaluator"].fn.score_and_top1
    assert e["targets"].tolist() == _top(model, x)
    probs = torch.softmax(model(x), 1).max(1).values
    torch.testing.assert_close(e["scores0"].cpu().double(), probs.detach(), rtol=1e-12, atol=0)
    scores, queries = e["ranked"]
    assert scores.shape == (2, 56 * 112) and scores[1, 3].item() == 56 * 112 + 3 and queries == [100, 101]
    assert e["step"] == 10 and e["collection"] is True and e["thresholds"] == [0.9, 0.9]  # the top-1 criterion's: none given
    assert e["verifier"] is None and e["engine"] == "torch"
    assert e["refine"] is True and e["refine_budget"] == 40 and e["refine_scan"] == 10
    assert e["block"] == 3  # "auto": about a 28 x 28 grid, sqrt(56 * 112 / 784) = 2.83
    # criterion None: ReX's top-1 criterion, and the guide is the margin
    assert e["passes"](0, 0.0, True) is True and e["passes"](0, 1.0, False) is False
    assert m["passes"] is e["passes"]
    assert e["guide"](0, 0.1, False, -3.25) == -3.25


@pytest.mark.mutation
def test_fast_sis_responsibility_criterion_block_scan_and_monotone(monkeypatch):
    rec = Recorder(monkeypatch, verify=True)
    model, x = make_cnn(0), make_images(2)
    of.fast_sis(model, x, [0.3, 0.6], method="responsibility", engine="onnxruntime", batch_size=4,
                target=torch.tensor([3, 1]), baselines=0.5,
                options=of.MinimalPixelSetOptions(criterion="threshold", block=2, prefix_search="scan",
                                                  refine="boundary", monotone=False))
    assert rec.engines[0]["targets"].tolist() == [3, 1] and rec.extracts[0]["targets"].tolist() == [3, 1]
    torch.testing.assert_close(rec.extracts[0]["scores0"].double(), _scores0(model, x, [3, 1]), rtol=1e-12, atol=0)
    assert bool((rec.extracts[0]["prep"].baseline == 0.5).all())
    _check_evaluator(rec.extracts[0]["verifier"], model, rec.extracts[0]["prep"], [3, 1])
    assert rec.engines[0]["engine"] == "onnxruntime" and rec.engines[0]["batch_size"] == 4
    (m,), (e,) = rec.maps, rec.extracts
    assert m["args"] == (8, 10, 10, 0, None, False) and m["hook"] is None  # the defaults: 8 iterations, seed 0
    assert e["block"] == 2 and e["guide"] is None and e["refine"] == "boundary"
    assert e["refine_budget"] == "auto"
    assert e["passes"](1, 0.6, False) and not e["passes"](1, 0.59, True) and e["passes"](0, 0.3, False)
    # the engine is not the user's model: every set is checked on the user's model
    assert e["engine"] == "onnxruntime" and isinstance(e["verifier"], CandidateEvaluator)
    assert e["verifier"].fn.model is model and e["verifier"].fn is not e["evaluator"].fn
    assert e["verifier"].measure == e["verifier"].fn.score_and_top1 and e["verifier"].runner.chunk == 7


@pytest.mark.mutation
@pytest.mark.parametrize("refine, monotone, skip", [
    (True, None, True), ("boundary", None, True), (False, None, False),
    (True, False, False), (False, True, True), ("boundary", False, False)])
def test_fast_sis_monotone_default_follows_refine(monkeypatch, refine, monotone, skip):
    rec = Recorder(monkeypatch)
    of.fast_sis(make_cnn(0), make_images(1), method="responsibility",
                options=of.MinimalPixelSetOptions(refine=refine, monotone=monotone, iterations=20))
    assert rec.maps[0]["args"][5] is skip and rec.maps[0]["args"][0] == 20


@pytest.mark.mutation
def test_fast_sis_responsibility_threshold_guide_and_auto_rows(monkeypatch):
    rec = Recorder(monkeypatch)
    of.fast_sis(make_cnn(0), make_images(3), 0.4, method="responsibility",
                options=of.MinimalPixelSetOptions(criterion="threshold", iterations="auto"))
    assert (rec.engines[0]["max_rows"], rec.engines[0]["expected_rows"]) == (42, 3 * 13 * 14 * 6)
    assert rec.maps[0]["args"][0] == "auto"
    assert rec.extracts[0]["guide"](2, 0.2, True, 5.0) == pytest.approx(math.log(0.5), abs=1e-15)
    assert rec.extracts[0]["block"] == 1  # 5 x 5: pixel by pixel


@pytest.mark.mutation
def test_responsibility_passes_every_option(monkeypatch):
    rec = Recorder(monkeypatch)
    model, x = make_cnn(0), make_images(2)
    got = of.responsibility(model, x, iterations=3, seed=9, depth=4, min_box=2, show_progress=False, monotone=True,
                            criterion="threshold", threshold=0.25, batch_size=6, engine="torch")
    (eng,), (m,) = rec.engines, rec.maps
    assert eng["engine"] == "torch" and eng["batch_size"] == 6 and eng["measure_fn"] == "score_and_top1"
    assert (eng["max_rows"], eng["expected_rows"]) == (2 * 3 * 14, 2 * 3 * 14 * 6)
    assert m["args"] == (3, 4, 2, 9, False, True) and m["hook"] is None
    # the engine's 7 under the ladder's top: the user's 6 rounded down to a power of two
    assert m["evaluator"].runner.chunk == 4 and m["evaluator"].measure == m["evaluator"].fn.score_and_top1
    assert m["passes"](0, 0.25, False) and not m["passes"](1, 0.24, True)
    assert m["present"].shape == (2, 25) and m["present"].dtype == torch.bool and bool(m["present"].all())
    assert eng["targets"].tolist() == _top(model, x) and eng["prep"] is m["prep"]
    assert bool((m["prep"].baseline == 0).all())
    _check_evaluator(m["evaluator"], model, m["prep"], _top(model, x), chunk=4)
    assert [type(r) for r in got] == [ResponsibilityMap] * 2
    top = _top(model, x)
    for i, r in enumerate(got):
        assert r.map.shape == (5, 5) and r.map.device.type == "cpu"
        assert r.map.flatten().tolist() == list(range(25 * i, 25 * i + 25))
        assert r.queries == 100 + i and r.target == top[i] and isinstance(r.target, int) and r.iterations == 3
    # the defaults: 8 iterations, depth 10, min_box 10, seed 0, every mutant scored (monotone None: off for plain
    # maps), top-1 criterion
    of.responsibility(model, x, target=torch.tensor([1, 2]), baselines=0.25)
    assert rec.maps[1]["args"] == (8, 10, 10, 0, None, False) and rec.maps[1]["hook"] is None
    assert rec.engines[1]["targets"].tolist() == [1, 2] and bool((rec.maps[1]["prep"].baseline == 0.25).all())
    assert rec.maps[1]["passes"](0, 0.0, True) is True and rec.maps[1]["passes"](0, 1.0, False) is False
    assert rec.engines[1]["engine"] == "auto" and rec.engines[1]["batch_size"] is None
    assert [r.target for r in of.responsibility(model, x, target=torch.tensor([1, 2]))] == [1, 2]
    of.responsibility(model, x, iterations=2, monotone=None)
    assert rec.maps[3]["args"] == (2, 10, 10, 0, None, False)


@pytest.mark.mutation
def test_responsibility_argument_checks():
    model, x = make_cnn(0), make_images(1)
    with pytest.raises(ValueError, match=whole_message("monotone must be None, True or False, got 1")):
        of.responsibility(model, x, monotone=1)
    with pytest.raises(ValueError, match="engine must be one of"):
        of.responsibility(model, x, engine="gpu")
    for research in ("virtual_iterations", "gated_iterations", "monotone_memory"):  # in experimental only
        with pytest.raises(TypeError, match=research):
            of.responsibility(model, x, **{research: 1})
    with pytest.raises(ValueError, match="criterion must be one of"):
        of.responsibility(model, x, criterion="top5")
    with pytest.raises(ValueError, match=whole_message(
            "responsibility works on images [N, C, H, W] with the default pixel features (feature_mask=None)")):
        of.responsibility(lambda v: v[:, :3], x.flatten(1))
    with pytest.raises(ValueError, match="iterations"):
        of.responsibility(model, x, iterations=0)


@pytest.mark.mutation
def test_sufficient_subset_passes_every_option(monkeypatch):
    rec = Recorder(monkeypatch)
    model, x = make_cnn(0), make_images(2)
    ranking = torch.arange(50, dtype=torch.float32).view(2, 5, 5)
    out = of.sufficient_subset(model, x, ranking, [0.2, 0.3], step=3, refine=True, refine_budget=None)
    assert out is SENTINEL
    (eng,), (e,) = rec.engines, rec.extracts
    assert eng["targets"].tolist() == _top(model, x) == e["targets"].tolist() and eng["batch_size"] is None
    assert eng["prep"] is e["prep"] and bool((e["prep"].baseline == 0).all())
    torch.testing.assert_close(e["scores0"].double(), _scores0(model, x, _top(model, x)), rtol=1e-12, atol=0)
    _check_evaluator(e["evaluator"], model, e["prep"], _top(model, x))
    rounds = 9  # ceil(25 / 3)
    assert eng["engine"] == "auto" and eng["measure_fn"] == "score_and_top1"
    assert (eng["max_rows"], eng["expected_rows"]) == (2 * rounds, 2 * rounds)
    scores, queries = e["ranked"]
    assert scores.dtype == torch.float64 and scores.shape == (2, 25) and queries is None
    assert scores.flatten().tolist() == list(range(50))
    assert e["step"] == 3 and e["collection"] is False and e["thresholds"] == [0.2, 0.3]
    assert e["refine_scan"] is None
    assert e["refine"] is True and e["refine_budget"] is None and e["engine"] == "torch" and e["verifier"] is None
    assert e["evaluator"].runner.chunk == 7 and e["evaluator"].measure == e["evaluator"].fn.score_and_top1
    # the default criterion is the SIS one (f >= tau), not top-1
    assert e["passes"](1, 0.3, False) and not e["passes"](1, 0.29, True)
    assert e["guide"] is None and e["block"] is None
    # defaults: refine=True (as MinimalPixelSet), budget "auto", step 1; rounds capped at 64, batches at 32
    big = make_images(1, h=10, w=10)
    of.sufficient_subset(make_cnn(0, h=10, w=10), big, torch.randn(1, 100), criterion="top1")
    assert (rec.engines[1]["max_rows"], rec.engines[1]["expected_rows"]) == (32, 64)
    assert rec.extracts[1]["step"] == 1 and rec.extracts[1]["refine"] is True
    assert rec.extracts[1]["refine_budget"] == "auto" and rec.extracts[1]["thresholds"] == [0.9]
    assert rec.extracts[1]["passes"](0, 0.0, True) is True
    of.sufficient_subset(make_cnn(0, h=10, w=10), big, torch.randn(1, 100), 0.5, step=4)
    assert (rec.engines[2]["max_rows"], rec.engines[2]["expected_rows"]) == (25, 25)
    of.sufficient_subset(make_cnn(0, h=10, w=10), big, torch.randn(1, 100), 0.5, step=100)
    assert (rec.engines[3]["max_rows"], rec.engines[3]["expected_rows"]) == (1, 1)  # one prefix: one row


@pytest.mark.mutation
def test_sufficient_subset_features_target_batch_and_verifier(monkeypatch):
    rec = Recorder(monkeypatch, verify=True)
    model, x = make_cnn(0), make_images(2)
    patches = torch.arange(25).view(5, 5) // 5  # 5 features (rows)
    of.sufficient_subset(model, x, torch.randn(2, 5), 0.5, feature_mask=patches, target=torch.tensor([4, 0]),
                         batch_size=3, baselines=0.75)
    (eng,), (e,) = rec.engines, rec.extracts
    assert e["ranked"][0].shape == (2, 5) and e["prep"].num_features == 5
    assert eng["batch_size"] == 3 and eng["targets"].tolist() == [4, 0] == e["targets"].tolist()
    assert bool((e["prep"].baseline == 0.75).all())
    torch.testing.assert_close(e["scores0"].double(), _scores0(model, x, [4, 0]), rtol=1e-12, atol=0)
    assert e["engine"] == "onnxruntime"
    _check_evaluator(e["verifier"], model, e["prep"], [4, 0])
    assert e["evaluator"].fn is not e["verifier"].fn


@pytest.mark.mutation
def test_black_box_entry_points_take_onnx_models(monkeypatch, tmp_path):
    rec = Recorder(monkeypatch)
    monkeypatch.setattr(attr_exact, "choose_incremental", lambda fn, prep, incremental: None)
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    path = str(tmp_path / "m.onnx")
    of.export_onnx(model, path, x)
    of.responsibility(path, x, iterations=1)
    of.sufficient_subset(path, x, torch.randn(2, 25))
    of.fast_sis(path, x, method="responsibility", options=of.MinimalPixelSetOptions(iterations=1))
    of.fast_sis(path, x)
    assert len(rec.maps) == 2 and len(rec.extracts) == 2 and len(rec.exacts) == 1
    for not_a_tensor in (x.numpy(), x.tolist()):  # a clear error (the ONNX session is made on the CPU first)
        with pytest.raises(TypeError, match="torch.Tensor"):
            of.fast_sis(path, not_a_tensor)


@pytest.mark.mutation
def test_sufficient_subset_argument_checks():
    model, x = make_cnn(0), make_images(2)
    r = torch.randn(2, 25)
    for bad in (0, -3, 1.5, True, "10"):
        with pytest.raises(ValueError, match=whole_message(f"step must be a positive int, got {bad!r}")):
            of.sufficient_subset(model, x, r, step=bad)
    for bad in (torch.randn(3, 25), torch.randn(2, 24), torch.randn(2, 5, 6), r.numpy()):
        with pytest.raises(ValueError, match=whole_message("ranking must be a tensor [N, *grid] with 25 scores per "
                                                           "image, or an attribution of the inputs' shape "
                                                           "[2, 3, 5, 5]")):
            of.sufficient_subset(model, x, bad)
    for v in (float("nan"), float("inf"), -float("inf")):
        bad = r.clone()
        bad[1, 7] = v
        with pytest.raises(ValueError, match=whole_message("ranking contains NaN or inf")):
            of.sufficient_subset(model, x, bad)
    with pytest.raises(ValueError, match="refine must be"):
        of.sufficient_subset(model, x, r, refine="yes")
    with pytest.raises(ValueError, match="refine_budget must be"):
        of.sufficient_subset(model, x, r, refine_budget=-1)
    with pytest.raises(ValueError, match="engine must be one of"):
        of.sufficient_subset(model, x, r, engine="tensorrt")


@pytest.mark.mutation
def test_fast_sis_gradient_passes_every_option(monkeypatch):
    rec = Recorder(monkeypatch)
    model, x = make_cnn(0), make_images(3)
    out = of.fast_sis(model, x, [0.1, 0.2, 0.3], method="gradient", collection=True, show_progress=False,
                      options=of.GradientOptions(k=4, autocast="bf16"))
    assert out is SENTINEL
    (eng,), (g,) = rec.engines, rec.gradients
    assert eng["engine"] == "torch" and eng["measure_fn"] == "score_and_top1"
    assert (eng["max_rows"], eng["expected_rows"]) == (3 * 32, 3 * (7 + 1))  # ceil(25 / 4) = 7 steps + 1
    assert g["fn"].model is model and g["thresholds"] == [0.1, 0.2, 0.3] and g["collection"] is True
    assert g["prep"] is eng["prep"] and torch.equal(g["prep"].images, x)
    assert eng["targets"].tolist() == _top(model, x)
    assert g["k"] == 4 and g["autocast"] is torch.bfloat16 and g["progress"] is False
    assert g["runner"].chunk == 7 and g["targets"].tolist() == _top(model, x)
    probs = torch.softmax(model(x), 1).max(1).values.detach()
    torch.testing.assert_close(g["scores0"].double(), probs, rtol=1e-12, atol=0)
    of.fast_sis(model, x, method="gradient", target=2, engine="torch")
    assert rec.gradients[1]["targets"].tolist() == [2, 2, 2] and rec.engines[1]["targets"].tolist() == [2, 2, 2]
    torch.testing.assert_close(rec.gradients[1]["scores0"].double(), _scores0(model, x, [2, 2, 2]), rtol=1e-12,
                               atol=0)
    assert rec.gradients[1]["k"] == 100 and rec.gradients[1]["autocast"] is None
    assert rec.gradients[1]["collection"] is False and rec.gradients[1]["progress"] is None
    assert rec.gradients[1]["thresholds"] == [0.9] * 3  # the default threshold
    assert rec.engines[1]["expected_rows"] == 3 * (1 + 1)
    with pytest.raises(ValueError, match=whole_message("k (features masked per gradient step) must be a positive int, got 0")):
        of.fast_sis(model, x, method="gradient", options=of.GradientOptions(k=0))


@pytest.mark.mutation
def test_fast_sis_exact_dense_path_passes_every_option(monkeypatch):
    rec = Recorder(monkeypatch, verify=True)
    monkeypatch.setattr(attr_exact, "choose_incremental", lambda fn, prep, incremental: None)
    model, x = make_cnn(0), make_images(2)
    out = of.fast_sis(model, x, 0.35, collection=True, show_progress=False, engine="onnxruntime")
    assert out is SENTINEL
    (eng,), (e,) = rec.engines, rec.exacts
    assert eng["engine"] == "onnxruntime" and eng["measure_fn"] == "score"
    assert (eng["max_rows"], eng["expected_rows"]) == (2 * 25, 2 * 25 * 26 // 2)
    assert eng["exact_shape"] == (2, 25) and eng["rival_s"] is None and type(eng["expected_rows"]) is int
    assert e["fn"] is not e["verifier"].fn and e["verifier"].fn.model is model
    assert e["prep"] is eng["prep"] and e["targets"].tolist() == _top(model, x) == eng["targets"].tolist()
    torch.testing.assert_close(e["scores0"].double(), _scores0(model, x, _top(model, x)), rtol=1e-12, atol=0)
    _check_evaluator(e["verifier"], model, e["prep"], _top(model, x))
    assert e["verifier"].measure == e["verifier"].fn.score_and_top1
    assert e["batch_size"] == 7 and e["engine"] == "onnxruntime" and e["collection"] is True
    assert e["thresholds"] == [0.35, 0.35] and e["progress"] is False and e["runner"].chunk == 7
    assert "evaluator" not in e
    rec.verify = False
    of.fast_sis(model, x, 0.35, target=torch.tensor([2, 4]))
    assert rec.exacts[1]["targets"].tolist() == [2, 4] and rec.engines[1]["targets"].tolist() == [2, 4]
    assert rec.exacts[1]["verifier"] is None and rec.exacts[1]["engine"] == "torch"
    assert rec.exacts[1]["fn"].model is model and rec.exacts[1]["collection"] is False


class _Cal:
    def __init__(self, batch_size, times):
        self.batch_size, self.times = batch_size, times


def _incremental_stubs(monkeypatch, rec, pays):
    calls = {}
    plan = object()
    monkeypatch.setattr(attr_exact, "choose_incremental", lambda fn, prep, incremental: calls.setdefault(
        "choose", []).append(incremental) or plan)

    def calibration(pl, fn, prep, targets, *, batch_size, exact_shape):
        calls["calibration"] = (pl, batch_size, exact_shape)
        calls["calibration_args"] = (fn, prep, targets)
        return _Cal(3, {3: 0.01})

    def job_time(times, batch, n, p):
        calls["job_time"] = (times, batch, n, p)
        return 42.0

    def small_job(pl, fn, prep, targets, icl, eng, shape, first_pass_s):
        calls["small_job"] = (pl, icl.batch_size, eng.batch_size, shape, first_pass_s)
        calls["small_job_args"] = (fn, prep, targets)
        return _Cal(5, {5: 0.01}), eng

    def pays_fn(pl, icl, eng, shape):
        calls["pays"] = (pl, icl.batch_size, eng.batch_size, shape)
        return pays

    class FakeIncremental:
        def __init__(self, pl, fn, prep, targets, runner):
            calls["evaluator"] = (pl, fn.model, runner.chunk)
            calls["evaluator_args"] = (prep, targets)

    monkeypatch.setattr(attr_exact, "incremental_calibration", calibration)
    monkeypatch.setattr(attr_exact, "exact_job_time", job_time)
    monkeypatch.setattr(attr_exact, "time_small_job", small_job)
    monkeypatch.setattr(attr_exact, "incremental_pays", pays_fn)
    monkeypatch.setattr(attr_exact, "IncrementalEvaluator", FakeIncremental)
    return calls, plan


@pytest.mark.mutation
@pytest.mark.parametrize("pays", [True, False])
def test_fast_sis_exact_incremental_auto(monkeypatch, pays):
    rec = Recorder(monkeypatch)
    calls, plan = _incremental_stubs(monkeypatch, rec, pays)
    model, x = make_cnn(0), make_images(2)
    of.fast_sis(model, x, 0.5, batch_size=9, collection=True, show_progress=False)
    assert calls["choose"] == [None]
    top = _top(model, x)
    for key in ("calibration_args", "small_job_args"):
        fn, prep, targets = calls[key]
        assert fn.model is model and prep is rec.engines[0]["prep"] and targets.tolist() == top
    assert calls["calibration"] == (plan, 9, (2, 25))
    assert calls["job_time"] == ({3: 0.01}, 3, 2, 25)
    (eng,) = rec.engines  # the dense engine is chosen once, with the incremental path's predicted time as rival
    assert eng["rival_s"] == 42.0 and eng["exact_shape"] == (2, 25) and eng["batch_size"] == 9
    assert eng["targets"].tolist() == _top(model, x) and type(eng["expected_rows"]) is int
    assert (eng["max_rows"], eng["expected_rows"]) == (50, 2 * 25 * 26 // 2)
    pl, _, _, shape, first_pass_s = calls["small_job"]
    assert pl is plan and shape == (2, 25) and 0 < first_pass_s < 60
    assert calls["pays"] == (plan, 5, 7, (2, 25))  # the calibration time_small_job returned
    (e,) = rec.exacts
    assert e["prep"] is rec.engines[0]["prep"] and e["targets"].tolist() == top and e["thresholds"] == [0.5, 0.5]
    assert e["collection"] is True and e["progress"] is False
    torch.testing.assert_close(e["scores0"].double(), _scores0(model, x, top), rtol=1e-12, atol=0)
    if pays:
        prep, targets = calls["evaluator_args"]
        assert prep is e["prep"] and targets.tolist() == top
        assert calls["evaluator"] == (plan, model, 5) and e["batch_size"] == 5 and e["engine"] == "torch"
        assert e["runner"].chunk == 5 and e["fn"].model is model and "verifier" not in e
    else:
        assert "evaluator" not in calls and "evaluator" not in e and e["batch_size"] == 7


@pytest.mark.mutation
def test_fast_sis_exact_incremental_forced_and_untimed(monkeypatch):
    rec = Recorder(monkeypatch)
    calls, plan = _incremental_stubs(monkeypatch, rec, pays=False)
    model, x = make_cnn(0), make_images(2)
    of.fast_sis(model, x, 0.5, options=of.ExactOptions(incremental=True))
    # forced: no dense engine, no timing, no vote
    assert calls["choose"] == [True] and rec.engines == [] and "pays" not in calls and "small_job" not in calls
    assert calls["calibration"] == (plan, None, (2, 25))
    assert calls["evaluator"] == (plan, model, 3) and rec.exacts[0]["batch_size"] == 3
    of.fast_sis(model, x, 0.5, engine="torch", options=of.ExactOptions(incremental=True))  # torch: allowed
    assert calls["choose"] == [True, True]
    # another engine named: the incremental path is not considered (False), the dense engine is used
    monkeypatch.setattr(attr_exact, "exact_job_time", lambda *a: pytest.fail("not timed"))
    calls.clear()
    monkeypatch.setattr(attr_exact, "choose_incremental", lambda fn, prep, incremental: calls.setdefault(
        "choose", []).append(incremental) or None)
    of.fast_sis(model, x, 0.5, engine="compile")
    assert calls["choose"] == [False] and rec.engines[-1]["engine"] == "compile"
    of.fast_sis(model, x, 0.5, engine="torch", options=of.ExactOptions(incremental=False))
    assert calls["choose"] == [False, False]
    of.fast_sis(model, x, 0.5, engine="torch")
    assert calls["choose"] == [False, False, None]


@pytest.mark.mutation
def test_fast_sis_rival_is_none_without_incremental_times(monkeypatch):
    rec = Recorder(monkeypatch)
    calls, plan = _incremental_stubs(monkeypatch, rec, pays=False)
    monkeypatch.setattr(attr_exact, "incremental_calibration", lambda *a, **k: _Cal(3, {}))
    monkeypatch.setattr(attr_exact, "exact_job_time", lambda *a: pytest.fail("no times: nothing to predict from"))
    of.fast_sis(make_cnn(0), make_images(1), 0.5)
    assert rec.engines[0]["rival_s"] is None


@pytest.mark.mutation
def test_fast_sis_argument_messages():
    model, x = make_cnn(0), make_images(1)
    with pytest.raises(ValueError, match=whole_message(
            "method must be one of ('auto', 'exact', 'gradient', 'responsibility'), got 'rex'")):
        of.fast_sis(model, x, method="rex")
    for bad in (1, 0, "auto"):
        with pytest.raises(ValueError, match=whole_message(f"incremental must be None, True or False, got {bad!r}")):
            of.fast_sis(model, x, options=of.ExactOptions(incremental=bad))
    for engine in ("onnxruntime", "compile"):
        with pytest.raises(ValueError, match=whole_message(
                f"incremental=True runs the torch model; engine must be 'auto' or 'torch', got {engine!r}")):
            of.fast_sis(model, x, engine=engine, options=of.ExactOptions(incremental=True))
        with pytest.raises(ValueError, match=whole_message(
                "method='gradient' needs the torch model's gradients; engine must be 'auto' or 'torch', "
                f"got {engine!r}")):
            of.fast_sis(model, x, method="gradient", engine=engine)
    with pytest.raises(ValueError, match="block must be"):
        of.MinimalPixelSetOptions(block=0)
    with pytest.raises(ValueError, match="prefix_search must be one of"):
        of.MinimalPixelSetOptions(prefix_search="binary")
    with pytest.raises(ValueError, match="refine must be"):
        of.MinimalPixelSetOptions(refine=None)
    with pytest.raises(ValueError, match="refine_budget must be"):
        of.MinimalPixelSetOptions(refine_budget=-1)
    with pytest.raises(ValueError, match="monotone must be None, True or False"):
        of.MinimalPixelSetOptions(monotone=1)
    with pytest.raises(ValueError, match="iterations"):
        of.MinimalPixelSetOptions(iterations=0)
    with pytest.raises(ValueError, match=whole_message("seed must be an int >= 0, got -1")):
        of.MinimalPixelSetOptions(seed=-1)  # before any model work, not numpy's error mid-job
    with pytest.raises(ValueError, match=whole_message("seed must be an int >= 0, got -1")):
        of.responsibility(model, x, seed=-1)
    with pytest.raises(ValueError, match="autocast"):
        of.GradientOptions(autocast="int8")
    with pytest.raises(ValueError, match="engine must be one of"):
        of.fast_sis(model, x, engine="cuda")


@pytest.mark.mutation
@pytest.mark.parametrize("method, wanted, given", [
    ("exact", "ExactOptions", of.GradientOptions()), ("gradient", "GradientOptions", of.ExactOptions()),
    ("responsibility", "MinimalPixelSetOptions", of.ResponsibilityOptions()),
    ("exact", "ExactOptions", {"incremental": True})])
def test_fast_sis_refuses_another_method_s_options(method, wanted, given):
    with pytest.raises(ValueError, match=whole_message(
            f"options for method={method!r} must be {wanted} (or None), got {type(given).__name__}")):
        of.fast_sis(make_cnn(0), make_images(1), method=method, options=given)


@pytest.mark.mutation
@pytest.mark.parametrize("old", ["k", "autocast", "iterations", "seed", "criterion", "refine", "refine_budget",
                                 "block", "prefix_search", "monotone", "incremental", "virtual_iterations",
                                 "gated_iterations", "monotone_memory"])
def test_fast_sis_refuses_the_old_keywords(old):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        of.fast_sis(make_cnn(0), make_images(1), **{old: 1})


def test_fast_sis_takes_at_most_six_keyword_arguments_beside_captum_s():
    """The method's options live in its options object: beside Captum's data-side keywords, at most six."""
    import inspect
    captum = {"target", "baselines", "additional_forward_args", "feature_mask", "show_progress"}
    keywords = [name for name, p in inspect.signature(of.fast_sis).parameters.items()
                if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert captum <= set(keywords) and len(set(keywords) - captum) <= 6


class _Scaled(nn.Module):
    """A CNN called as model(x, scale, shift): its logits times a per-image scale [N, 1], plus a shift (one number
    for every image)."""

    def __init__(self):
        super().__init__()
        self.net = make_cnn(3)

    def forward(self, x, scale, shift=0.0):
        return self.net(x) * scale + shift


def test_fast_sis_passes_additional_forward_args_to_the_model_as_the_classes_do():
    """Each image's result is the reference's on a model that closes over that image's row of the arguments."""
    from helpers import assert_same_result

    model, x = _Scaled().eval(), make_images(2, seed=4)
    scales = torch.tensor([[0.2], [1.5]], dtype=torch.float64)
    got = of.fast_sis(model, x, 0.5, additional_forward_args=(scales, 0.25))
    for i in range(2):
        alone = lambda t, s=scales[i:i + 1]: model(t, s.expand(t.shape[0], 1), 0.25)  # noqa: E731
        assert_same_result(got[i], of.reference.sis(alone, x[i:i + 1], 0.5)[0], rel=1e-9)
    assert got[0].info["examples"] == "one at a time: additional_forward_args hold one value per example"
    one = of.fast_sis(model, x[1:], 0.5, additional_forward_args=scales[1:], method="auto")  # one argument
    assert_same_result(one[0], of.reference.sis(lambda t: model(t, scales[1:].expand(t.shape[0], 1)), x[1:], 0.5)[0],
                       rel=1e-9)
    with pytest.raises(ValueError, match=whole_message(
            "additional_forward_args[0] of shape (3, 1) must have one row per example (first dimension 2, as the "
            "inputs'), as Captum takes them")):
        of.fast_sis(model, x, additional_forward_args=torch.ones(3, 1))
    with pytest.raises(ValueError, match=whole_message(
            'method="exact": additional_forward_args need a torch model or a callable; an ONNX model takes the '
            "inputs alone")):
        of.fast_sis("model.onnx", x, additional_forward_args=scales)
    with pytest.raises(ValueError, match=r'^method="gradient": additional_forward_args are not passed to an '):
        of.fast_sis([model, model], x, method="gradient", additional_forward_args=scales)


def test_fast_sis_refuses_several_input_tensors_in_one_line_that_says_what_to_do():
    model, x = make_cnn(0), make_images(2)
    for method in ("exact", "auto"):
        with pytest.raises(TypeError, match=whole_message(
                "images must be one tensor [N, *D]: multiple input tensors (a tuple of 2) are not supported; give the "
                "one tensor to explain as images and the others as additional_forward_args (passed to the model, "
                "never masked), or concatenate them into one tensor that a wrapper of the model splits")):
            of.fast_sis(model, (x, x), method=method)
