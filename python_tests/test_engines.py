"""Forward engines: ONNX Runtime gives the torch SIS, un-exportable models fall back with one line,
every set is checked on the user's model (and repaired where a stand-in engine is optimistic), bad names fail."""

import warnings

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast import engines
from overinterp_fast.model import ModelFn

from conftest import make_cnn, make_images

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


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
                 lambda e: of.responsibility(model, images, engine=e),
                 lambda e: of.sufficient_subset(model, images, torch.rand(1, 5, 5), 0.5, engine=e)):
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
    s_t = of.sufficient_subset(model, images, ranking, 0.3, engine="torch")
    s_o = of.sufficient_subset(model, images, ranking, 0.3, engine="onnxruntime")
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
    res = of.sufficient_subset(model, images, ranking, 0.6, target=target, engine="onnxruntime")
    want = of.sufficient_subset(model, images, ranking, 0.6, target=target, engine="torch")
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
    from overinterp_fast.inputs import prepare
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
