"""runtime/memory_format.py: which jobs may run channels_last, the copy they run, and when the measurement keeps it; exact
SIS through the channels_last copy gives the contiguous model's results, and each result records the choice."""
import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.runtime import memory_format as layout
from overinterp_fast.runtime.inputs import prepare
from overinterp_fast.runtime.model import ModelFn
from helpers import make_cnn, make_images, whole_message


def test_convertible_needs_4d_non_float64_images_and_a_module_with_convolutions():
    cnn32, x32 = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    assert layout.convertible(ModelFn(cnn32), x32)
    assert layout.convertible(ModelFn([cnn32, make_cnn(1, torch.float32)]), x32)  # an ensemble of modules
    assert not layout.convertible(ModelFn(make_cnn(0)), make_images(2))  # float64: the exactness checks' dtype
    assert not layout.convertible(ModelFn(cnn32), x32.flatten(2))  # 3-D inputs
    assert not layout.convertible(ModelFn(lambda t: cnn32(t)), x32)  # a plain callable: nothing to convert
    assert not layout.convertible(ModelFn(nn.Sequential(nn.Flatten(), nn.Linear(75, 5))), x32)  # no convolution
    stored = make_cnn(0, torch.float32).to(memory_format=torch.channels_last)
    assert not layout.convertible(ModelFn(stored), x32)  # channels_last already


def test_the_copy_is_channels_last_and_the_model_given_is_untouched():
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    fn, prep = ModelFn(model, outputs="logits"), prepare(x, mask_value=0.5)
    cl_fn, cl_prep = layout.channels_last_copy(fn, prep)
    assert cl_fn.model is not model and cl_fn.outputs == "logits"
    assert cl_fn.model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert not cl_fn.model.conv1.weight.is_contiguous()
    assert model.conv1.weight.is_contiguous()  # the user's model keeps its format
    for t in (cl_prep.images, cl_prep.baseline):
        assert t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    assert torch.equal(cl_prep.images, prep.images) and torch.equal(cl_prep.baseline, prep.baseline)
    assert cl_prep.feature_map is prep.feature_map and cl_prep.num_features == prep.num_features


def test_channels_last_is_kept_when_at_least_gain_faster():
    assert layout.GAIN == 0.05
    assert layout.channels_last_pays({"given": 1.0, "channels_last": 0.95})
    assert not layout.channels_last_pays({"given": 1.0, "channels_last": 0.96})
    assert not layout.channels_last_pays({"given": 1.0, "channels_last": 1.5})


def test_true_and_false_are_not_measured_and_true_is_checked(monkeypatch):
    monkeypatch.setattr(layout, "measure_formats", lambda *a, **k: pytest.fail("measured"))
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    fn, prep = ModelFn(model), prepare(x)
    assert layout.choose_channels_last(True, fn, prep, 16) == (True, {})
    assert layout.choose_channels_last(False, fn, prep, 16) == (False, {})
    assert layout.choose_channels_last(None, ModelFn(make_cnn(0)), prepare(make_images(2)), 16) == (False, {})
    with pytest.raises(ValueError, match=whole_message(
            "channels_last=True needs 4-D images that are not float64 and a torch model with convolutions not "
            "stored channels_last already")):
        layout.choose_channels_last(True, ModelFn(make_cnn(0)), prepare(make_images(2)), 16)


@pytest.mark.parametrize("cl, want", [(0.95, True), (0.96, False)])
def test_auto_measures_on_a_cpu_once_per_model_and_shape(monkeypatch, cl, want):
    calls = []

    def fake(fn, prep, batch_size):
        calls.append((fn.model, tuple(prep.images.shape), batch_size))
        return {"given": 1.0, "channels_last": cl}

    monkeypatch.setattr(layout, "measure_formats", fake)
    layout.clear_cache()
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    assert layout.choose_channels_last(None, ModelFn(model), prepare(x), 16) == (want, {"given": 1.0,
                                                                                       "channels_last": cl})
    assert layout.choose_channels_last(None, ModelFn(model), prepare(x), 16)[0] == want  # kept
    assert len(calls) == 1
    layout.choose_channels_last(None, ModelFn(model), prepare(x), 32)  # another batch size
    layout.choose_channels_last(None, ModelFn(model), prepare(make_images(2, h=6, dtype=torch.float32)), 16)
    with torch.no_grad():
        model.conv1.weight.mul_(2)  # changed in place: measured again
    layout.choose_channels_last(None, ModelFn(model), prepare(x), 16)
    assert len(calls) == 4


def test_a_model_that_fails_channels_last_keeps_its_format_and_says_why():
    class Viewing(nn.Module):  # .view on a convolution's output: fails on channels_last activations
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.head = nn.Linear(4 * 5 * 5, 3)

        def forward(self, x):
            y = self.conv(x)
            return 4 * self.head(y.view(y.shape[0], -1))

    layout.clear_cache()
    model, x = Viewing().eval(), make_images(2, dtype=torch.float32)
    with pytest.raises(RuntimeError):  # the premise: the channels_last copy cannot run
        layout.channels_last_copy(ModelFn(model), prepare(x))[0].model(
            x.contiguous(memory_format=torch.channels_last))
    assert layout.choose_channels_last(None, ModelFn(model), prepare(x), 8) == (False, {})
    got = of.fast_sis(model, x, 0.5, engine="torch", options=of.ExactOptions(incremental=False))
    want = of.fast_sis(model, x, 0.5, engine="torch", options=of.ExactOptions(incremental=False,
                                                                               channels_last=False))
    assert not got[0].info.channels_last
    assert got[0].info["channels_last"].startswith("off: the channels_last copy failed (RuntimeError: view size")
    for a, b in zip(got, want):
        assert torch.equal(a.order, b.order)


def test_the_copy_is_kept_until_a_weight_or_mode_changes():
    layout.clear_cache()
    model, x = make_cnn(0, torch.float32), make_images(2, dtype=torch.float32)
    fn, prep = ModelFn(model), prepare(x)
    first = layout.channels_last_copy(fn, prep)[0].model
    assert layout.channels_last_copy(fn, prep)[0].model is first
    with torch.no_grad():
        model.conv1.weight.add_(1)
    second = layout.channels_last_copy(fn, prep)[0].model
    assert second is not first and torch.equal(second.conv1.weight, model.conv1.weight)
    model.train()
    third = layout.channels_last_copy(fn, prep)[0].model
    assert third is not second and third.training


def test_measure_formats_times_both_formats_interleaved_after_a_warm_up(monkeypatch):
    model, x = make_cnn(0, torch.float32), make_images(3, dtype=torch.float32)
    seen = []
    real = layout.candidate_probe

    def probe(measure_fn, prep, targets):
        fmt = "channels_last" if not prep.images.is_contiguous() else "given"
        run = real(measure_fn, prep, targets)
        return lambda b: seen.append((fmt, b)) or run(b)

    monkeypatch.setattr(layout, "candidate_probe", probe)
    ticks = iter(range(100))
    times = layout.measure_formats(ModelFn(model), prepare(x), 7, rounds=2, timer=lambda: next(ticks))
    assert seen == [("given", 7), ("channels_last", 7)] * 3  # one untimed call each, then 2 interleaved rounds
    assert times == {"given": 1, "channels_last": 1}  # the fake clock ticks once per timed call


def test_exact_sis_through_the_channels_last_copy_equals_the_model_s_and_says_so():
    model, x = make_cnn(3, torch.float32), make_images(2, seed=5, dtype=torch.float32)
    want = of.fast_sis(model, x, 0.3, engine="torch", batch_size=13,
                       options=of.ExactOptions(incremental=False, channels_last=False))
    got = of.fast_sis(model, x, 0.3, engine="torch", batch_size=13,
                      options=of.ExactOptions(incremental=False, channels_last=True))
    for a, b in zip(got, want):
        assert torch.equal(a.order, b.order) and (a.sis is None) == (b.sis is None)
        assert a.sis is None or torch.equal(a.sis, b.sis)
        torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-7)
    assert got[0].info is got[1].info and got[0].info.channels_last and not want[0].info.channels_last
    assert (got[0].info.batch_size, got[0].info.batch_source) == (13, "user")
    assert model.conv1.weight.is_contiguous()
    with pytest.raises(ValueError, match=whole_message(
            "channels_last=True runs a copy of the torch model; engine must be 'auto' or 'torch', got "
            "'onnxruntime'")):
        of.ExactSIS(model, engine="onnxruntime", channels_last=True)
