"""Forward engines (runtime/engines.py): ONNX Runtime gives the torch SIS, un-exportable models fall back with one line,
every set is checked on the user's model (and repaired where a stand-in engine is optimistic), bad names fail.

engines.py's decisions checked piece by piece: what each calibration is asked for, when incremental scoring is
predicted to pay, when a small job is timed, the compiled model's check, the export cache and its keys. Both
scoring paths give the same SIS (runtime/test_incremental.py and the tests above), so a wrong decision here only
costs time; these tests pin the decisions themselves, with the timings and probes replaced by recorders.

Tests marked ``mutation`` were written for survivors of a mutation run (mutmut): they pin details that the
behavioural tests above let through, with every expectation worked out by hand.
"""
import warnings
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.runtime import model_state
from overinterp_fast.runtime import engines
from overinterp_fast.runtime.model import ModelFn
from helpers import make_cnn, make_images
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
import dataclasses
import logging
import os
import types
from overinterp_fast.runtime import calibration, runinfo
from overinterp_fast.runtime import incremental
from overinterp_fast.runtime.calibration import Calibration
from overinterp_fast.runtime.inputs import prepare
from helpers import make_cnn, make_images, whole_message


@pytest.fixture(autouse=True)
def fresh_caches():
    engines.clear_cache()
    yield
    engines.clear_cache()


def f_user(model, image, keep, target):
    """f on the user's model of the image with only ``keep`` (bool [H, W]) present: from first principles."""
    x = torch.where(keep, image, torch.zeros((), dtype=image.dtype))
    with torch.no_grad():
        return float(torch.softmax(model(x[None]), 1)[0, target])


def test_bad_engine_names():
    model, images = make_cnn(0, torch.float32), make_images(1, dtype=torch.float32)
    for call in (lambda e: of.fast_sis(model, images, 0.5, engine=e),
                 lambda e: of.responsibility(model, images, engine=e, iterations=20),
                 lambda e: of.sufficient_subset(model, images, torch.rand(1, 5, 5), 0.5, engine=e, refine=False)):
        with pytest.raises(ValueError, match="engine must be one of"):
            call("ort")
        with pytest.raises(ValueError, match="engine must be one of"):
            call(None)
    with pytest.raises(ValueError, match="gradient"):
        of.fast_sis(model, images, 0.5, method="gradient", engine="onnxruntime")


def test_onnxruntime_engine_gives_the_torch_sis():
    model, images = make_cnn(5, torch.float32), make_images(4, seed=7, dtype=torch.float32)
    via_torch = of.fast_sis(model, images, 0.3, engine="torch")
    via_ort = of.fast_sis(model, images, 0.3, engine="onnxruntime")
    assert [r.engine for r in via_torch] == ["torch"] * 4 and [r.engine for r in via_ort] == ["onnxruntime"] * 4
    for a, b, x in zip(via_torch, via_ort, images):
        assert a.target == b.target and (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert torch.equal(a.sis, b.sis)
            keep = torch.zeros(25, dtype=torch.bool)
            keep[b.sis] = True
            assert b.sis_score == pytest.approx(f_user(model, x, keep.view(5, 5), b.target), rel=1e-6)
            assert b.sis_score >= 0.3
        torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-6)


def test_onnxruntime_engine_for_responsibility_and_sufficient_subset():
    model, images = make_cnn(5, torch.float32), make_images(2, seed=7, dtype=torch.float32)
    a = of.responsibility(model, images, iterations=3, engine="torch")
    b = of.responsibility(model, images, iterations=3, engine="onnxruntime")
    for x, y in zip(a, b):
        torch.testing.assert_close(x.map, y.map)
    ranking = torch.rand(2, 5, 5, generator=torch.Generator().manual_seed(0))
    s_t = of.sufficient_subset(model, images, ranking, 0.3, engine="torch", refine=False)
    s_o = of.sufficient_subset(model, images, ranking, 0.3, engine="onnxruntime", refine=False)
    assert [r.size for r in s_t] == [r.size for r in s_o] and {r.engine for r in s_o} == {"onnxruntime"}


class Unexportable(nn.Module):
    """A CNN followed by an op the ONNX exporter does not know (special.zeta; here a no-op)."""

    def __init__(self):
        super().__init__()
        self.inner = make_cnn(5, torch.float32)

    def forward(self, x):
        y = self.inner(x)
        return y + 0 * torch.special.zeta(torch.full_like(y, 2.0), torch.ones_like(y))


def test_unexportable_model_falls_back_with_one_line():
    model, images = Unexportable().eval(), make_images(2, seed=7, dtype=torch.float32)
    with pytest.warns(UserWarning) as record:
        res = of.fast_sis(model, images, 0.3, engine="onnxruntime")
    msgs = [str(w.message) for w in record if "engine" in str(w.message)]
    assert len(msgs) == 1 and "\n" not in msgs[0] and "running the torch model" in msgs[0], msgs
    assert {r.engine for r in res} == {"torch"}
    want = of.fast_sis(model, images, 0.3, engine="torch")
    assert [r.sis.tolist() for r in res] == [r.sis.tolist() for r in want]


def test_plain_callable_falls_back():
    net = make_cnn(5, torch.float32)
    with pytest.warns(UserWarning, match="not a torch.nn.Module"):
        res = of.fast_sis(lambda x: net(x), make_images(1, dtype=torch.float32), 0.3, engine="onnxruntime")
    assert res[0].engine == "torch"


def test_torch_engine_on_an_onnx_model_is_refused(tmp_path):
    model = make_cnn(5, torch.float32)
    path = of.export_onnx(model, tmp_path / "m.onnx", make_images(2, dtype=torch.float32), dynamo=False)
    with pytest.raises(ValueError, match="needs a torch model"):
        of.fast_sis(path, make_images(1, dtype=torch.float32), 0.3, engine="torch")
    res = of.fast_sis(path, make_images(1, dtype=torch.float32), 0.3)  # auto on ONNX: onnxruntime
    assert res[0].engine == "onnxruntime"


class Optimistic(nn.Module):
    """The user's model with every class-``target`` logit raised by ``bump``: a stand-in whose f is too high."""

    def __init__(self, inner, bump):
        super().__init__()
        self.inner, self.bump = inner, bump

    def forward(self, x):
        out = self.inner(x).clone()
        out[:, self.target] += self.bump
        return out


def confident_images(model, n, seed=11):
    """n images on which ``model`` is most confident in one shared class (the most common argmax), and that class."""
    pool = make_images(60, seed=seed)
    with torch.no_grad():
        probs = torch.softmax(model(pool), 1)
    target = int(torch.mode(probs.argmax(1)).values)
    best = probs[:, target].argsort(descending=True)[:n]
    return pool[best], target


def _optimistic_engine(monkeypatch, model, target, bump=0.7):
    stand_in = Optimistic(model, bump).eval()
    stand_in.target = target

    real = engines._build

    def build(name, user, images):
        if name != "onnxruntime":
            return real(name, user, images)
        return ModelFn(stand_in, outputs=user.outputs)

    monkeypatch.setattr(engines, "_build", build)
    return stand_in


def test_sis_failing_on_the_user_model_is_repaired(monkeypatch):
    model = make_cnn(3, torch.float64)
    images, target = confident_images(model, 4)  # one target class, so one stand-in serves all images
    tau = 0.6
    stand_in = _optimistic_engine(monkeypatch, model, target)
    res = of.fast_sis(model, images, tau, target=target, engine="onnxruntime")
    # what the stand-in alone would return (its own FindSIS, no check on the user's model)
    alone = of.fast_sis(stand_in, images, tau, target=target, engine="torch")
    repaired = 0
    for i, (r, a) in enumerate(zip(res, alone)):
        assert r.engine == "onnxruntime"
        assert torch.equal(r.order, a.order)  # the stand-in scored the backward selection
        assert r.score >= tau and a.sis is not None  # the test needs the precondition on both models
        # FindSIS continued on the user's model: the smallest set, last-masked first, of at least
        # the stand-in's size that passes on the user's model
        keep_first = r.order.flip(0)
        want, want_f = None, None
        for k in range(a.sis.numel(), keep_first.numel() + 1):
            keep = torch.zeros(25, dtype=torch.bool)
            keep[keep_first[:k]] = True
            f = f_user(model, images[i], keep.view(5, 5), target)
            if f >= tau:
                want, want_f = keep_first[:k], f
                break
        if want is None:
            assert r.sis is None
            continue
        assert torch.equal(r.sis, want), i
        assert r.sis_score == pytest.approx(want_f, rel=1e-12) and r.sis_score >= tau
        repaired += r.sis.numel() > a.sis.numel()
    assert repaired >= 1  # the stand-in's sets did fail on the user's model somewhere


def test_sufficient_subset_repair(monkeypatch):
    model = make_cnn(3, torch.float64)
    images, target = confident_images(model, 3)
    _optimistic_engine(monkeypatch, model, target)
    ranking = torch.rand(3, 5, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = of.sufficient_subset(model, images, ranking, 0.6, target=target, engine="onnxruntime", refine=False)
    want = of.sufficient_subset(model, images, ranking, 0.6, target=target, engine="torch", refine=False)
    # FindSIS over a ranking with step 1 on the user's model: the repaired sets are exactly its sets
    assert [r.size for r in res] == [w.size for w in want]
    for r, w in zip(res, want):
        assert (r.sis_score is None) == (w.sis_score is None)
        if w.sis_score is not None:
            assert r.sis_score == pytest.approx(w.sis_score, rel=1e-12)


def test_compile_failure_falls_back(monkeypatch):
    def broken(model):
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    model, images = make_cnn(5, torch.float32), make_images(1, dtype=torch.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = of.fast_sis(model, images, 0.3, engine="compile")
    msgs = [str(w.message) for w in record if "engine" in str(w.message)]
    assert len(msgs) == 1 and "no compiler here" in msgs[0] and "\n" not in msgs[0]
    assert res[0].engine == "torch"


def test_auto_exports_to_onnx_only_when_torch_and_the_rival_path_are_both_long(monkeypatch):
    """select_engine's rival_s (exact SIS's predicted incremental time): a short rival means no export."""
    from overinterp_fast.runtime.inputs import prepare
    model = make_cnn(0).float()
    prep = prepare(make_images(2, dtype=torch.float32))
    targets = torch.zeros(2, dtype=torch.int64)
    built = []
    real = engines._build

    def build(name, user, images):
        built.append(name)
        return real(name, user, images)

    monkeypatch.setattr(engines, "_build", build)
    monkeypatch.setattr(engines, "_job_seconds", lambda cal, rows: 100.0)  # torch predicted long
    at = engines.AUTO_MIN_JOB_S
    for rival, exports in ((None, True), (at, True), (at * 0.99, False), (0.5, False)):
        built.clear()
        eng = engines.select_engine("auto", ModelFn(model), prep, targets, batch_size=None, max_rows=50,
                                    expected_rows=500, exact_shape=(2, 25), rival_s=rival)
        assert ("onnxruntime" in built) == exports, (rival, built)
        assert eng.name in ("torch", "onnxruntime")


# ----------------------------------------------------------------------------------------------------
# engines.py's decisions checked piece by piece: what each calibration is asked for, when incremental scoring is
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fresh_engine_and_calibration_caches():
    engines.clear_cache()
    calibration.clear_cache()
    yield
    engines.clear_cache()
    calibration.clear_cache()


def _job(n=2, dtype=torch.float32):
    model = make_cnn(0, dtype)
    prep = prepare(make_images(n, dtype=dtype))
    return model, ModelFn(model), prep, torch.zeros(n, dtype=torch.int64)


def _plan(ratio=0.3, batch=96):
    return types.SimpleNamespace(cost_ratio=ratio, batch_size=lambda: batch)


def _engine(name="torch", times=None, source="measured", batch=64):
    cal = None if source is None else Calibration(batch, dict(times or {}), source, 0.0)
    return engines.Engine(name, object(), batch, cal, verify=False)


# ---------- incremental_pays


@pytest.mark.mutation
def test_incremental_pays_by_the_plan_estimate_when_nothing_was_timed(caplog):
    caplog.set_level(logging.INFO, logger="overinterp_fast.runtime.engines")
    at = incremental.AUTO_MAX_COST_RATIO
    timed = {16: 0.01, 64: 0.03}
    for incr_times, dense in (({}, _engine(times=timed)),                      # incremental not timed
                              (timed, _engine(source=None)),                   # the user's batch size
                              (timed, _engine(times={}, source="fallback"))):  # the dense side not timed
        incr = Calibration(32, dict(incr_times), "measured" if incr_times else "fallback", 0.0)
        assert engines.incremental_pays(_plan(at), incr, dense, (2, 25)) is True
        assert engines.incremental_pays(_plan(at * 1.001), incr, dense, (2, 25)) is False
        assert engines.incremental_pays(_plan(0.0), incr, dense, (2, 25)) is True
    messages = {r.getMessage() for r in caplog.records}
    assert "incremental inference on (estimated 0.50x the work of a dense pass)" in messages
    assert "incremental inference off (estimated 0.50x the work of a dense pass)" in messages


@pytest.mark.mutation
def test_incremental_pays_by_timing_includes_the_base_runs(caplog):
    """Timed on both sides: the incremental job's calls plus one dense pass of the N images per step (p steps)
    against the dense job's calls, each at its own batch size; incremental must win by INCREMENTAL_MARGIN."""
    caplog.set_level(logging.INFO, logger="overinterp_fast.runtime.engines")
    n, p = 3, 40
    dense_times = {16: 0.016, 64: 0.064, 256: 0.256}  # 1 ms a row
    dense = _engine(times=dense_times, batch=256)
    t_dense = calibration.exact_job_time(dense_times, 256, n, p)
    base = 0.003 * p  # n = 3 rows per step at 1 ms a row (call_time interpolates linearly through 0)
    # incremental per-row cost chosen so that its calls take t_dense / INCREMENTAL_MARGIN - base, -+ 1%
    target = t_dense / engines.INCREMENTAL_MARGIN - base
    for scale, pays in ((0.99, True), (1.01, False)):
        lo, hi = 0.0, 1e-2
        for _ in range(60):  # bisect the per-row cost whose calls take scale * (t_dense - base)
            mid = (lo + hi) / 2
            times = {16: 16 * mid, 64: 64 * mid, 256: 256 * mid}
            if calibration.exact_job_time(times, 256, n, p) < scale * target:
                lo = mid
            else:
                hi = mid
        incr = Calibration(256, {16: 16 * lo, 64: 64 * lo, 256: 256 * lo}, "measured", 0.0)
        assert engines.incremental_pays(_plan(0.0 if not pays else 9.0), incr, dense, (n, p)) is pays
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all(m.endswith(" s dense, torch)") for m in messages)
    assert messages[0].startswith("incremental inference on (timed: predicted ")
    assert messages[1].startswith("incremental inference off (timed: predicted ")


# ---------- dense_is_short


def test_a_short_dense_job_leaves_incremental_out_and_says_so():
    """The dense calibration's prediction of the job (calibration.exact_job_time) against INCREMENTAL_MIN_JOB_S;
    an untimed engine is never short."""
    n, p = 2, 30
    unit = {16: 0.016, 64: 0.064}  # 1 ms a row
    seconds = calibration.exact_job_time(unit, 64, n, p)
    at = engines.INCREMENTAL_MIN_JOB_S / seconds  # scale of the row cost whose job takes exactly the bar
    with runinfo.collecting() as info:
        assert engines.dense_is_short(_engine(times={b: t * at * 0.99 for b, t in unit.items()}), (n, p))
    assert info["incremental"].startswith("off: the dense job is predicted at 0.99 s, under 1 s (torch)")
    assert not engines.dense_is_short(_engine(times={b: t * at * 1.01 for b, t in unit.items()}), (n, p))
    assert not engines.dense_is_short(_engine(times={}), (n, p))
    assert not engines.dense_is_short(_engine(source=None), (n, p))


# ---------- time_small_job


@pytest.mark.mutation
def test_time_small_job_times_both_paths_only_when_both_are_untimed_and_the_job_is_long(monkeypatch):
    model, user, prep, targets = _job(3)
    n, p = 3, 25
    rows = n * p * (p + 1) // 2  # 975
    calls = []
    pl = _plan()

    def fake_measure(probe, sizes, *, expected_rows, repeats):
        calls.append((probe, list(sizes), expected_rows, repeats))
        return {sizes[0]: 0.5 if probe == "dense probe" else 0.25}

    monkeypatch.setattr(engines, "measure", fake_measure)
    # the dense probe: f of the user's model as it is (unpadded, no graphs: the sizes timed are the sizes run)
    monkeypatch.setattr(engines, "candidate_probe", lambda fn, pr, tg: "dense probe" if (
        fn.__func__ is ModelFn.score and fn.__self__.model is user.model and fn.__self__.pad_to is None) else None)
    monkeypatch.setattr(engines.incremental, "probe",
                        lambda *a: "incremental probe" if a == (pl, user, prep, targets) else None)
    dense = engines.Engine("torch", user, 48, Calibration(48, {}, "fallback", 0.0), verify=False)
    incr = Calibration(96, {}, "fallback", 0.0)
    long_s = engines.SMALL_JOB_TIMING_S * n / rows  # the first pass's time at which the job is predicted long
    got_incr, got_dense = engines.time_small_job(pl, user, prep, targets, incr, dense, (n, p), long_s)
    assert calls == [("dense probe", [48], rows, 1), ("incremental probe", [96], rows, 1)]
    assert got_incr == Calibration(96, {96: 0.25}, "measured", 0.0)
    assert got_dense == dataclasses.replace(dense, calibration=Calibration(48, {48: 0.5}, "measured", 0.0))
    assert got_dense.fn is user and got_dense.batch_size == 48
    # unchanged: a job predicted shorter, or either side already timed, or the user's batch size
    calls.clear()
    for args in ((incr, dense, long_s * 0.99),
                 (Calibration(96, {96: 0.1}, "measured", 0.0), dense, long_s * 10),
                 (incr, dataclasses.replace(dense, calibration=Calibration(48, {48: 1.0}, "cached", 0.0)), 1.0),
                 (incr, dataclasses.replace(dense, calibration=None), 1.0)):
        out = engines.time_small_job(_plan(), user, prep, targets, args[0], args[1], (n, p), args[2])
        assert out[0] is args[0] and out[1] is args[1]
    assert calls == []
    # no images: the prediction divides by max(n, 1), so the first pass's time counts whole
    calls.clear()
    engines.time_small_job(pl, user, prep, targets, incr, dense, (0, p), 1.0)
    assert calls == []  # 0 rows
    one = engines.SMALL_JOB_TIMING_S / (p * (p + 1) // 2)
    engines.time_small_job(pl, user, prep, targets, incr, dense, (1, p), one)
    assert len(calls) == 2


# ---------- what each calibration is asked for


@pytest.mark.mutation
def test_incremental_calibration_asks_for_the_exact_job(monkeypatch):
    model, user, prep, targets = _job()
    seen = {}

    def fake_calibrate(key, probe, **kw):
        seen.update(key=key, probe=probe, **kw)
        return Calibration(77, {77: 0.1}, "measured", 0.0)

    monkeypatch.setattr(engines, "calibrate", fake_calibrate)
    monkeypatch.setattr(engines.incremental, "probe", lambda pl, fn, pr, tg: ("probe", pl.cost_ratio, fn, tg))
    pl = _plan(0.25, batch=123)
    assert engines.incremental_calibration(pl, user, prep, targets, batch_size=40, exact_shape=(2, 25)) == \
        Calibration(40, {}, "user", 0.0)
    assert seen == {}  # the user's size is not timed
    cal = engines.incremental_calibration(pl, user, prep, targets, batch_size=None, exact_shape=(2, 25))
    assert cal == Calibration(77, {77: 0.1}, "measured", 0.0)
    key, disk = engines._calibration_keys(user, prep, "incremental", "score", 50, (2, 25))
    assert seen == {"key": key, "probe": ("probe", 0.25, user, targets), "max_rows": 50,
                    "expected_rows": 2 * 25 * 26 // 2, "fallback": 123, "images": 2, "features": 25, "disk": disk,
                    "cache": model_state.state_of(model).table("calibration")}
    assert seen["cache"] is model_state.state_of(model).table("calibration")  # kept with the model
    assert key[1:3] == ("incremental", "score")


@pytest.mark.mutation
def test_dense_calibration_asks_for_the_job(monkeypatch):
    model, user, prep, targets = _job(3)
    seen = {}

    def fake_calibrate(key, probe, **kw):
        seen.update(key=key, probe=probe, **kw)
        return Calibration(8, {}, "fallback", 0.0)

    monkeypatch.setattr(engines, "calibrate", fake_calibrate)
    monkeypatch.setattr(engines, "candidate_probe",
                        lambda fn, pr, tg: ("probe", fn.__func__.__name__, fn.__self__.model, fn.__self__.pad_to, tg))
    monkeypatch.setattr(engines, "auto_batch_size", lambda images, total: ("auto", total))
    engines._calibrate("torch", user, user, prep, targets, "score_and_top1", 30, 900, (3, 25))
    key, disk = engines._calibration_keys(user, prep, "torch", "score_and_top1", 30, (3, 25))
    assert seen == {"key": key, "probe": ("probe", "score_and_top1", model, None, targets), "max_rows": 30,
                    "expected_rows": 900, "fallback": ("auto", 30), "upper": None, "images": 3, "features": 25,
                    "disk": disk, "cache": model_state.state_of(model).table("calibration")}
    seen.clear()
    engines._calibrate("torch", user, user, prep, targets, "score", 30, 900, None)
    assert seen["images"] is None and seen["features"] is None and seen["probe"][1] == "score"


@pytest.mark.mutation
def test_calibration_keys_name_what_the_speed_depends_on(tmp_path):
    model, user, prep, targets = _job()
    key, disk = engines._calibration_keys(user, prep, "torch", "score", 50, (2, 25))
    assert key == ("state", "torch", "score", (3, 5, 5), torch.float32, "cpu", True, torch.get_num_threads(), 50,
                   (2, 25))  # "state": the model's own state keeps it (runtime.model_state), not the process
    assert disk == calibration.disk_key(engines._structure(model), *key[1:])
    key2, _ = engines._calibration_keys(user, prep, "torch", "score", 50, None)
    assert key2[-1] is None and key2[:-1] == key[:-1]
    cl = prepare(make_images(2, dtype=torch.float32).contiguous(memory_format=torch.channels_last))
    assert engines._calibration_keys(user, cl, "torch", "score", 50, None)[0][6] is False
    # a plain callable: nothing identifies it across processes, so no disk key
    fn = ModelFn(lambda x: model(x))
    assert engines._calibration_keys(fn, prep, "torch", "score", 50, None)[1] is None
    # an ONNX file: its path is the key
    from overinterp_fast import export_onnx
    from overinterp_fast.runtime.onnx import OnnxModel

    path = export_onnx(model, str(tmp_path / "m.onnx"), make_images(2, dtype=torch.float32))
    onnx = OnnxModel(path)
    okey, odisk = engines._calibration_keys(ModelFn(onnx), prep, "onnxruntime", "score", 50, None)
    assert okey[0] == path and odisk is not None
    import os

    assert engines._structure(onnx) == f"onnx:{path}:{os.path.getsize(path)}:{onnx.input_shape}"


@pytest.mark.mutation
def test_structure_changes_with_layers_and_shapes_not_with_values():
    a, b = make_cnn(0, torch.float32), make_cnn(1, torch.float32)
    assert engines._structure(a) == engines._structure(b)  # same layers and shapes, other weights
    wide = make_cnn(0, torch.float32, width=4)
    assert engines._structure(wide) != engines._structure(a)
    assert engines._structure(a.double()) != engines._structure(make_cnn(0, torch.float32))
    assert engines._structure(a).startswith("helpers.SmallCNN:")
    assert engines._structure(lambda x: x) is None


@pytest.mark.mutation
def test_job_seconds_takes_the_cheapest_measured_row():
    cal = Calibration(64, {16: 0.032, 64: 0.064, 256: 0.512}, "measured", 0.0)
    assert engines._job_seconds(cal, 1000) == pytest.approx(1.0)  # 1 ms a row at 64
    assert engines._job_seconds(Calibration(64, {}, "fallback", 0.0), 1000) == 0.0


# ---------- the engine cache and the compiled model's check


@pytest.mark.mutation
def test_built_engines_go_when_the_weights_change_in_place_or_are_replaced(monkeypatch):
    """A built engine is kept in the model's state, whose stamp follows in-place changes, replacements and
    buffers: a changed model gets a new build."""
    model, user, prep, targets = _job()
    monkeypatch.setattr(engines, "_export", lambda m, example, device: nn.Identity())  # a stand-in export
    first = engines._build("onnxruntime", user, prep.images)
    assert engines._build("onnxruntime", user, prep.images) is first
    with torch.no_grad():
        model.conv1.weight.add_(0.0)  # in place: the version counter moves
    moved = engines._build("onnxruntime", user, prep.images)
    assert moved is not first
    model.head.weight = nn.Parameter(model.head.weight.detach().clone())
    assert engines._build("onnxruntime", user, prep.images) is not moved
    bn = nn.BatchNorm1d(3).eval()
    stamp = model_state.stamp(bn)
    bn.running_mean.fill_(1.0)  # buffers count too
    assert model_state.stamp(bn) != stamp


@pytest.mark.mutation
def test_exports_are_cached_per_model_shape_and_weights(monkeypatch):
    model, user, prep, targets = _job()
    exports = []
    real = engines._export

    def counting(m, example, device):
        exports.append(tuple(example.shape))
        return real(m, example, device)

    monkeypatch.setattr(engines, "_export", counting)
    first = engines._build("onnxruntime", user, prep.images)
    assert engines._build("onnxruntime", user, prep.images) is first and exports == [(2, 3, 5, 5)]
    assert first.outputs == user.outputs and type(first.model).__name__ == "OnnxModel"
    # another batch of the same image shape: the same export (the key is the shape of one image)
    assert engines._build("onnxruntime", user, make_images(5, dtype=torch.float32)) is first
    with torch.no_grad():
        model.head.weight.mul_(2)  # other weights
    again = engines._build("onnxruntime", user, prep.images)
    assert again is not first and exports == [(2, 3, 5, 5), (2, 3, 5, 5)]
    x = prep.images
    torch.testing.assert_close(again.forward(x), model(x), rtol=1e-4, atol=1e-5)  # the new weights
    engines.clear_cache()
    engines._build("onnxruntime", user, prep.images)
    assert len(exports) == 3


@pytest.mark.mutation
def test_an_unavailable_engine_is_remembered_with_a_short_reason(monkeypatch):
    model, user, prep, targets = _job()
    tries = []

    def failing(m, example, device):
        tries.append(1)
        raise RuntimeError("x" * 300 + "\nsecond line")

    monkeypatch.setattr(engines, "_export", failing)
    for _ in range(2):
        with pytest.raises(engines.EngineUnavailable) as err:
            engines._build("onnxruntime", user, prep.images)
        assert str(err.value) == "RuntimeError: " + "x" * 200
    assert tries == [1]  # the failure is cached like a success

    def silent(m, example, device):
        raise ValueError("")

    monkeypatch.setattr(engines, "_export", silent)
    with pytest.raises(engines.EngineUnavailable, match=whole_message("ValueError: ValueError")):
        engines._build("onnxruntime", user, make_images(1, h=7, w=7, dtype=torch.float32))
    with pytest.raises(engines.EngineUnavailable, match="is not a torch.nn.Module"):
        engines._build("onnxruntime", ModelFn(lambda x: model(x)), prep.images)


@pytest.mark.mutation
def test_compiled_model_must_match_the_model(monkeypatch):
    x32 = make_images(2, dtype=torch.float32)
    x64 = make_images(2)

    class Off(nn.Module):
        def __init__(self, inner, eps):
            super().__init__()
            self.inner, self.eps = inner, eps

        def forward(self, x):
            return self.inner(x) + self.eps

    for dtype, x, ok, bad in ((torch.float32, x32, 5e-5, 5e-3), (torch.float64, x64, 5e-11, 5e-7)):
        model = make_cnn(0, dtype)
        for eps, passes in ((ok, True), (bad, False)):
            monkeypatch.setattr(torch, "compile", lambda m, eps=eps: Off(m, eps))
            if passes:
                compiled = engines._compile(model, x)
                # a copy is compiled: the engine is kept in the model's state and must not keep the model alive
                assert isinstance(compiled, Off) and compiled.inner is not model
                assert all(torch.equal(a, b) for a, b in zip(compiled.inner.parameters(), model.parameters()))
            else:
                with pytest.raises(ValueError, match=r"the compiled model differs from the model: max error "
                                   + f"{eps:.3g}".replace("+", r"\+")):
                    engines._compile(model, x)


# ---------- select_engine with the timings replaced


class _Recorder:
    """Stands in for engines._calibrate, engines.measure and the ONNX export: fixed times per engine."""

    def __init__(self, monkeypatch, user: ModelFn, per_row: dict, fail_export: bool = False):
        self.per_row, self.calibrated, self.measured, self.built = per_row, [], [], []
        real = engines._build

        def build(name, user, images):
            self.built.append(name)
            if name == "onnxruntime" and not isinstance(user.model, engines.OnnxModel):
                if fail_export:
                    raise engines.EngineUnavailable("RuntimeError: no exporter")
                return ModelFn(lambda x, m=user.model: m(x))  # a stand-in: any fn that is not the user's
            return real(name, user, images)

        def calibrate(name, fn, user, prep, targets, measure_fn, max_rows, expected_rows, exact_shape):
            self.calibrated.append((name, measure_fn, max_rows, expected_rows, exact_shape))
            t = self.per_row.get(name)
            return Calibration(32, {} if t is None else {32: 32 * t}, "measured" if t else "fallback", 0.0)

        def measure(probe, sizes, *, expected_rows):  # probe: the engine's name, from candidate_probe below
            self.measured.append((probe, list(sizes), expected_rows))
            return {sizes[0]: sizes[0] * self.per_row[probe]}

        monkeypatch.setattr(engines, "_build", build)
        monkeypatch.setattr(engines, "_calibrate", calibrate)
        monkeypatch.setattr(engines, "measure", measure)
        # the probe of a bound method of the user's ModelFn times torch; any other, the stand-in
        def probe(fn, prep, targets):
            self.probed.append((prep, targets))
            return "torch" if fn.__self__.model is user.model else "onnxruntime"

        self.probed = []
        monkeypatch.setattr(engines, "candidate_probe", probe)


@pytest.mark.mutation
def test_auto_keeps_the_engine_with_the_lower_predicted_job_time(monkeypatch):
    model, user, prep, targets = _job()
    rows = 20_000  # 20 s at 1 ms a row: long enough to weigh ONNX Runtime
    for ort_per_row, chosen in ((0.5e-3, "onnxruntime"), (1e-3, "torch"), (2e-3, "torch"), (None, "torch")):
        rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": ort_per_row})
        eng = engines.select_engine("auto", user, prep, targets, batch_size=None, max_rows=500, expected_rows=rows,
                                    measure_fn="score_and_top1", exact_shape=(2, 25))
        assert rec.built == ["torch", "onnxruntime"]
        assert rec.calibrated == [("torch", "score_and_top1", 500, rows, (2, 25)),
                                  ("onnxruntime", "score_and_top1", 500, rows, (2, 25))]
        assert eng.name == chosen and (eng.fn is user) == (chosen == "torch") and eng.verify == (chosen != "torch")
        assert eng.batch_size == 32 and eng.calibration is not None
        assert eng.calibration.times == ({32: 32 * ort_per_row} if chosen == "onnxruntime" else {32: 32e-3})


@pytest.mark.mutation
def test_onnx_runtime_is_weighed_only_for_auto_float32_torch_modules_on_long_jobs(monkeypatch):
    model, user, prep, targets = _job()
    cases = [("torch", user, prep, 20_000),                          # the user named the engine
             ("auto", user, prep, 9_000),                            # 9 s at 1 ms a row: too short
             ("auto", ModelFn(lambda x: model(x)), prep, 20_000)]    # a plain callable
    for engine, fn, pr, rows in cases:
        rec = _Recorder(monkeypatch, fn, {"torch": 1e-3, "onnxruntime": 1e-6})
        eng = engines.select_engine(engine, fn, pr, targets, batch_size=None, max_rows=500, expected_rows=rows)
        assert "onnxruntime" not in rec.built and eng.name == "torch", (engine, rows)
    model64, user64, prep64, _ = _job(dtype=torch.float64)  # float64: ORT's CPU kernels are not the point
    rec = _Recorder(monkeypatch, user64, {"torch": 1e-3, "onnxruntime": 1e-6})
    engines.select_engine("auto", user64, prep64, targets, batch_size=None, max_rows=500, expected_rows=20_000)
    assert rec.built == ["torch"]
    rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 1e-6})  # exactly AUTO_MIN_JOB_S: weighed
    rows = int(engines.AUTO_MIN_JOB_S / 1e-3)
    assert engines.select_engine("auto", user, prep, targets, batch_size=None, max_rows=500,
                                 expected_rows=rows).name == "onnxruntime"


@pytest.mark.mutation
def test_the_users_batch_size_is_kept_and_timed_only_to_compare_engines(monkeypatch):
    model, user, prep, targets = _job()
    rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 0.5e-3})
    eng = engines.select_engine("auto", user, prep, targets, batch_size=40, max_rows=500, expected_rows=20_000)
    assert rec.calibrated == [] and rec.measured == [("torch", [40], 20_000), ("onnxruntime", [40], 20_000)]
    assert all(pr is prep and tg is targets for pr, tg in rec.probed) and len(rec.probed) == 2
    assert eng.name == "onnxruntime" and eng.batch_size == 40 and eng.calibration is None and eng.verify
    # exactly calibration.MIN_ROWS rows: timed (4 s at 1 ms a row: too short to export)
    rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 0.5e-3})
    eng = engines.select_engine("auto", user, prep, targets, batch_size=40, max_rows=500,
                                expected_rows=calibration.MIN_ROWS)
    assert rec.measured == [("torch", [40], calibration.MIN_ROWS)] and eng.name == "torch"
    # a job under calibration.MIN_ROWS rows is not timed at all: torch, the user's size
    rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 0.5e-3})
    eng = engines.select_engine("auto", user, prep, targets, batch_size=40, max_rows=500,
                                expected_rows=calibration.MIN_ROWS - 1)
    assert rec.measured == [] and eng.name == "torch" and eng.batch_size == 40 and eng.calibration is None
    # an engine the user named: their size, untimed
    rec = _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 0.5e-3})
    eng = engines.select_engine("torch", user, prep, targets, batch_size=40, max_rows=500, expected_rows=20_000)
    assert rec.measured == [] and eng.name == "torch" and eng.calibration is None and not eng.verify


@pytest.mark.mutation
def test_a_failed_export_under_auto_steps_aside_and_keeps_torch(monkeypatch, caplog):
    """Under "auto" the export is a speed path: where it fails, torch runs without a warning; the log (INFO) and
    the run's info say why."""
    import warnings

    from overinterp_fast.runtime import runinfo

    model, user, prep, targets = _job()
    _Recorder(monkeypatch, user, {"torch": 1e-3, "onnxruntime": 1e-6}, fail_export=True)
    with warnings.catch_warnings(), runinfo.collecting() as info, caplog.at_level("INFO", "overinterp_fast"):
        warnings.simplefilter("error")
        eng = engines.select_engine("auto", user, prep, targets, batch_size=None, max_rows=500, expected_rows=20_000)
    assert [r.getMessage() for r in caplog.records if r.name == "overinterp_fast.runtime.engines"] == [
        "engine='auto': the ONNX export failed (RuntimeError: no exporter); running the torch model"]
    assert info["engine"] == "torch: the ONNX export failed (RuntimeError: no exporter)"
    assert eng.name == "torch" and eng.fn is user


@pytest.mark.mutation
def test_engine_errors_on_an_onnx_model_are_exact(tmp_path):
    from overinterp_fast import export_onnx
    from overinterp_fast.runtime.onnx import OnnxModel

    model = make_cnn(0, torch.float32)
    path = export_onnx(model, str(tmp_path / "m.onnx"), make_images(2, dtype=torch.float32))
    user = ModelFn(OnnxModel(path))
    x = make_images(2, dtype=torch.float32)
    for name in ("torch", "compile"):
        with pytest.raises(ValueError, match=whole_message(
                f"engine={name!r} needs a torch model; this one is ONNX (use engine='auto' or 'onnxruntime')")):
            engines._build(name, user, x)
    assert engines._build("onnxruntime", user, x) is user
    with pytest.raises(engines.EngineUnavailable, match=whole_message("function is not a torch.nn.Module")):
        engines._build("compile", ModelFn(lambda t: model(t)), x)
    import onnxruntime as ort

    session = OnnxModel(ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    assert engines._structure(session) == f"onnx:None::{session.input_shape}"


@pytest.mark.mutation
def test_exports_go_to_one_private_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engines, "_TMP", None)
    model = make_cnn(0, torch.float32)
    x = make_images(2, dtype=torch.float32)
    a = engines._export(model, x, torch.device("cpu"))
    b = engines._export(model, x, torch.device("cpu"))
    folder = os.path.dirname(a.path)
    assert os.path.dirname(b.path) == folder and os.path.basename(folder).startswith("overinterp_fast_onnx_")
    assert [os.path.basename(a.path), os.path.basename(b.path)] == [f"model_{id(model):x}_0.onnx",
                                                                   f"model_{id(model):x}_1.onnx"]
    assert os.listdir(tmp_path) == []  # nothing written where the user runs


@pytest.mark.mutation
def test_built_engines_keep_the_outputs_kind_and_are_keyed_by_channels(monkeypatch):
    """A model that reads probabilities keeps outputs="probabilities" on every engine; a compiled model is the
    one torch.compile returned (here a stand-in); an export is per image shape, channels included."""

    class Probs(nn.Module):
        def forward(self, x):
            return torch.softmax(8 * x.mean((2, 3)), 1)  # any channel count: one class per channel

    model = Probs().eval()
    user = ModelFn(model, outputs="probabilities")
    x3 = make_images(2, dtype=torch.float32)
    compiled = []

    def fake_compile(m):
        compiled.append(m)
        return nn.Sequential(m).eval()

    monkeypatch.setattr(torch, "compile", fake_compile)
    built = engines._build("compile", user, x3)
    assert len(compiled) == 1 and type(compiled[0]) is Probs and compiled[0] is not model  # a copy
    assert isinstance(built.model, nn.Sequential) and built.model[0] is compiled[0]
    assert built.outputs == "probabilities"
    ort3 = engines._build("onnxruntime", user, x3)
    assert ort3.outputs == "probabilities"
    torch.testing.assert_close(ort3.score(x3, torch.zeros(2, dtype=torch.int64)),
                               user.score(x3, torch.zeros(2, dtype=torch.int64)), rtol=1e-4, atol=1e-6)
    x1 = make_images(2, c=1, dtype=torch.float32)
    ort1 = engines._build("onnxruntime", user, x1)  # other channels, same height and width: another export
    assert ort1 is not ort3
    torch.testing.assert_close(ort1.forward(x1), model(x1), rtol=1e-4, atol=1e-6)
