"""model.py checked function by function, with expectations written out by hand.

Every test here is marked ``mutation``: written for the mutants of a mutation run (mutmut) that the older tests
(through fast_sis, messages matched by a fragment) let survive: messages are matched whole, the ensemble mean
and the softmax are computed on planted constant outputs, and each check is probed on both sides of its
condition.
"""
import math
import pathlib
import pytest
import torch
from torch import nn
from overinterp_fast.runtime import model as M
from overinterp_fast.runtime.batching import ChunkRunner
from helpers import whole_message as whole


class Const(nn.Module):
    """Returns the same row of logits for every input row (float64)."""

    def __init__(self, row):
        super().__init__()
        self.register_buffer("row", torch.tensor(row, dtype=torch.float64))

    def forward(self, x):
        return self.row.expand(x.shape[0], -1).clone()


# ---------------------------------------------------------------------------- _is_onnx, Ensemble
@pytest.mark.mutation
def test_is_onnx():
    assert M._is_onnx("model.onnx") and M._is_onnx(pathlib.Path("m.onnx"))
    assert not M._is_onnx(nn.Linear(2, 2)) and not M._is_onnx(lambda x: x)
    ort_session = type("InferenceSession", (), {"__module__": "onnxruntime.capi.session"})()
    other_module = type("InferenceSession", (), {"__module__": "myruntime.session"})()
    other_name = type("Session", (), {"__module__": "onnxruntime.capi.session"})()
    assert M._is_onnx(ort_session)
    assert not M._is_onnx(other_module) and not M._is_onnx(other_name)


@pytest.mark.mutation
def test_ensemble_is_the_mean_of_its_members_and_mirrors_their_mode():
    with pytest.raises(ValueError, match=whole("an ensemble needs at least one member")):
        M.Ensemble([])
    a, b = Const([1.0, 0.0]).eval(), Const([2.0, 4.0]).eval()
    plain = lambda x: torch.tensor([[6.0, -1.0]], dtype=torch.float64).expand(x.shape[0], 2)  # noqa: E731
    ens = M.Ensemble([a, plain, b])
    assert list(ens.members) == [a, b]  # only modules are registered; the callable is still called
    out = ens(torch.zeros(2, 1))
    assert out.tolist() == [[3.0, 1.0], [3.0, 1.0]]  # (1 + 6 + 2) / 3, (0 - 1 + 4) / 3
    assert ens.training is False and ens.members.training is False
    a.train()
    ens = M.Ensemble([a, b])
    assert ens.training is True and ens.members.training is True
    assert a.training and not b.training  # the members' own modes are left alone
    assert M.Ensemble([plain]).training is False  # no module at all: eval


# ---------------------------------------------------------------------------- check_targets
@pytest.mark.mutation
def test_check_targets():
    pred = torch.tensor([4, 0, 2])
    assert M.check_targets(None, 3, 5, pred) is pred
    t = M.check_targets(1, 3, 5, pred)
    assert t.dtype == torch.int64 and t.tolist() == [1, 1, 1]
    t = M.check_targets(torch.tensor(2, dtype=torch.int16), 3, 5, pred)  # a 0-d int16 target: int64 [N]
    assert t.dtype == torch.int64 and t.tolist() == [2, 2, 2]
    t = M.check_targets([1, 2, 3], 3, 5, pred.to("meta"))  # on the predictions' device
    assert t.device.type == "meta" and t.dtype == torch.int64
    t = M.check_targets([0, 4, 2], 3, 5, pred)
    assert t.dtype == torch.int64 and t.tolist() == [0, 4, 2]
    t = M.check_targets(torch.tensor([3, 1, 0], dtype=torch.int32), 3, 5, pred)
    assert t.dtype == torch.int64 and t.tolist() == [3, 1, 0]
    for bad, dtype in ((1.0, torch.float32), (torch.tensor([1.0, 0, 0], dtype=torch.float64), torch.float64),
                       (True, torch.bool)):
        with pytest.raises(TypeError, match=whole(f"target must be an int or an integer tensor, got {dtype}")):
            M.check_targets(bad, 3, 5, pred)
    with pytest.raises(ValueError, match=whole("target must be an int or have one entry per image (3), got shape (2,)")):
        M.check_targets([1, 2], 3, 5, pred)
    with pytest.raises(ValueError, match=whole(
        "target must be an int or have one entry per sequence (3), got shape (3, 1)")):
        M.check_targets([[1], [2], [3]], 3, 5, pred, unit="sequence")
    for bad in (5, -1, [0, 5, 0], [0, 0, -1]):
        with pytest.raises(ValueError, match=whole("target classes must lie in [0, 5) for a model with 5 outputs")):
            M.check_targets(bad, 3, 5, pred)
    assert M.check_targets([0, 4, 0], 3, 5, pred).tolist() == [0, 4, 0]  # both ends of [0, k)


# ---------------------------------------------------------------------------- ModelFn
@pytest.mark.mutation
def test_model_fn_construction():
    fn = M.ModelFn([Const([0.0, 1.0]), Const([2.0, 1.0])])
    assert isinstance(fn.model, M.Ensemble) and fn.outputs == "logits"
    fn = M.ModelFn((Const([0.0, 1.0]),), outputs="probabilities")
    assert isinstance(fn.model, M.Ensemble) and fn.outputs == "probabilities"
    c = Const([0.0])
    assert M.ModelFn(c).model is c
    with pytest.raises(TypeError, match=whole("model must be a torch.nn.Module or a callable, got int")):
        M.ModelFn(3)
    with pytest.raises(ValueError, match=whole(
        "outputs must be one of ('logits', 'probabilities'), got 'logprobs'")):
        M.ModelFn(c, outputs="logprobs")


@pytest.mark.mutation
def test_onnx_files_become_onnx_models(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from overinterp_fast.runtime.onnx import OnnxModel

    # an identity graph [n, 2] -> [n, 2], written by hand
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    path = tmp_path / "identity.onnx"
    onnx.save(proto, str(path))
    for given in (str(path), path):
        fn = M.ModelFn(given)
        assert isinstance(fn.model, OnnxModel) and fn.model.device == torch.device("cpu")
        assert fn.forward(torch.tensor([[0.25, -1.0]])).tolist() == [[0.25, -1.0]]
    # the device is passed on (meta: a second device on any machine)
    assert M.ModelFn(str(path), device="meta").model.device == torch.device("meta")


@pytest.mark.mutation
def test_check_compatible():
    x = torch.zeros(2, 3, dtype=torch.float64)
    net = nn.Sequential(nn.Linear(3, 2), nn.Sequential(nn.Identity(), nn.Dropout())).double().eval()
    M.ModelFn(net).check_compatible(x)
    net[1][1].train()  # one submodule in training mode is enough
    with pytest.raises(ValueError, match=whole(
        "model is in training mode; call model.eval() first (dropout and batch norm in training "
        "mode make f depend on which candidates share a batch)")):
        M.ModelFn(net).check_compatible(x)
    with pytest.raises(TypeError, match=whole(
        "model parameter '0.weight' is torch.float32 but images are torch.float64; computation runs "
        "in the images' dtype, so convert one of them (e.g. model.to(torch.float64))")):
        M.ModelFn(nn.Sequential(nn.Linear(3, 2)).eval()).check_compatible(x)
    # a floating buffer is checked too, an integer one is not
    buf = Const([0.0, 1.0]).eval()
    with pytest.raises(TypeError, match=whole(
        "model parameter 'row' is torch.float64 but images are torch.float32; computation runs "
        "in the images' dtype, so convert one of them (e.g. model.to(torch.float32))")):
        M.ModelFn(buf).check_compatible(x.float())
    counted = nn.Linear(3, 2).double().eval()
    counted.register_buffer("calls", torch.zeros((), dtype=torch.int64))
    M.ModelFn(counted).check_compatible(x)
    meta = nn.Linear(3, 2).double().to("meta").eval()
    with pytest.raises(ValueError, match=whole(
        "model and images are on different devices: model parameter 'weight' is on meta, images are on cpu")):
        M.ModelFn(meta).check_compatible(x)
    M.ModelFn(lambda t: t).check_compatible(x)  # a plain callable: nothing to check

    seen = []

    class Backend:
        def __call__(self, t):
            return t

        def check_compatible(self, images):
            seen.append(images)
            raise RuntimeError("backend says no")

    with pytest.raises(RuntimeError, match="backend says no"):
        M.ModelFn(Backend()).check_compatible(x)
    assert seen[0] is x


@pytest.mark.mutation
def test_check_output_messages():
    cpu = torch.device("cpu")
    out = torch.zeros(3, 2)
    assert M.ModelFn.check_output(out, 3, cpu) is out
    assert M.ModelFn.check_output(torch.zeros(1, 1), 1, cpu).shape == (1, 1)  # one class is enough
    with pytest.raises(TypeError, match=whole("model must return a tensor of logits [B, K], got list")):
        M.ModelFn.check_output([[0.0]], 1, cpu)
    start = "the model must map a batch [B, *D] to scores [B, K] (K classes); for B = 3 it returned shape"
    for bad, said in ((torch.zeros(3), "(3,); a model with one score per example must return one per class (e.g. two "
                                       "logits [B, 2] for a binary classifier)"),
                      (torch.zeros(2, 2), "(2, 2)"), (torch.zeros(3, 2, 1), "(3, 2, 1); drop its last dimension "
                                                                            "(out.squeeze(-1))")):
        with pytest.raises(M.OutputShapeError, match=whole(f"{start} {said}")):
            M.ModelFn.check_output(bad, 3, cpu)
    with pytest.raises(ValueError, match=whole("model returned zero classes")):
        M.ModelFn.check_output(torch.zeros(3, 0), 3, cpu)
    with pytest.raises(TypeError, match=whole("model must return floating-point scores, got torch.int64")):
        M.ModelFn.check_output(torch.zeros(3, 2, dtype=torch.int64), 3, cpu)
    with pytest.raises(ValueError, match=whole("model returned its output on meta for input on cpu")):
        M.ModelFn.check_output(torch.zeros(3, 2, device="meta"), 3, cpu)
    # forward passes the batch size and device of its input
    fn = M.ModelFn(lambda t: torch.zeros(t.shape[0] + 1, 2))
    with pytest.raises(ValueError, match=r"for B = 2 it returned shape \(3, 2\)$"):
        fn.forward(torch.zeros(2, 4))


@pytest.mark.mutation
def test_scores_and_top1_by_hand():
    # logits log(1), log(2), log(5): softmax = (1/8, 2/8, 5/8)
    logits = [0.0, math.log(2.0), math.log(5.0)]
    fn = M.ModelFn(Const(logits))
    x = torch.zeros(3, 1, dtype=torch.float64)
    target = torch.tensor([0, 1, 2])
    f, top1 = fn.score_and_top1(x, target)
    assert f.dtype == torch.float64 and f.shape == (3,)
    assert f.tolist() == pytest.approx([1 / 8, 2 / 8, 5 / 8], abs=1e-15)
    assert top1.tolist() == [False, False, True]
    assert fn.score(x, target).tolist() == pytest.approx([1 / 8, 2 / 8, 5 / 8], abs=1e-15)
    out = fn.forward(x)
    assert fn.probabilities(out)[0].tolist() == pytest.approx([1 / 8, 2 / 8, 5 / 8], abs=1e-15)
    # probabilities are used as they are (no softmax), and the output's argmax decides top-1
    probs = M.ModelFn(Const([0.5, 0.25, 0.25]), outputs="probabilities")
    f, top1 = probs.score_and_top1(x, torch.tensor([0, 1, 2]))
    assert f.tolist() == [0.5, 0.25, 0.25] and top1.tolist() == [True, False, False]
    assert probs.score(x, torch.tensor([2, 2, 0])).tolist() == [0.25, 0.25, 0.5]
    p = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    assert probs.probabilities(p) is p
    # float32 model outputs come back as float64
    f32 = M.ModelFn(lambda t: torch.tensor([[0.75, 0.25]]).expand(t.shape[0], 2), outputs="probabilities")
    assert f32.score(torch.zeros(2, 1), torch.tensor([0, 1])).dtype == torch.float64


# ---------------------------------------------------------------------------- helpers
@pytest.mark.mutation
def test_model_memory_format():
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    assert M.model_memory_format(conv) == torch.contiguous_format
    assert M.model_memory_format(conv.to(memory_format=torch.channels_last)) == torch.channels_last
    # only the first 4-D parameter decides
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    mixed[2].to(memory_format=torch.channels_last)
    assert M.model_memory_format(mixed) == torch.contiguous_format
    mixed[1].to(memory_format=torch.channels_last)
    assert M.model_memory_format(mixed) == torch.channels_last
    # a 1x1 conv with one input channel is contiguous in both formats: contiguous
    one = nn.Conv2d(1, 4, 1).to(memory_format=torch.channels_last)
    assert M.model_memory_format(one) == torch.contiguous_format
    assert M.model_memory_format(nn.Linear(2, 2)) == torch.contiguous_format
    assert M.model_memory_format(lambda t: t) == torch.contiguous_format


@pytest.mark.mutation
def test_check_finite_scores():
    M.check_finite_scores(True)
    M.check_finite_scores(torch.tensor(True))
    for bad in (False, torch.tensor(False)):
        with pytest.raises(FloatingPointError, match=whole(
            "the model produced NaN or inf scores on masked inputs; check the model and the mask value")):
            M.check_finite_scores(bad)


@pytest.mark.mutation
def test_is_one_unbatched_sample():
    img = torch.zeros(3, 4)
    seen = []

    def rows(t):
        seen.append(tuple(t.shape))
        return torch.zeros(t.shape[0], 2)

    assert M._is_one_unbatched_sample(M.ModelFn(rows), img)
    assert seen == [(2, 3, 4), (1, 3, 4)]
    assert M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(t.shape[0], 1)), img)
    # [2, K] for two copies but [K] for one: the model squeezes a batch of one, the images may be a batch
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(t.shape[0], 2).squeeze(0)), img)
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(1, 2)), img)  # ignores the batch
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(t.shape[0])), img)
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(t.shape[0], 0)), img)
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: [[0.0, 1.0]] * t.shape[0]), img)
    assert not M._is_one_unbatched_sample(M.ModelFn(lambda t: torch.zeros(t.shape[0], 2, 1)), img)

    def boom(t):
        raise RuntimeError("no")

    assert not M._is_one_unbatched_sample(M.ModelFn(boom), img)


@pytest.mark.mutation
def test_initial_predictions_by_hand():
    calls = []

    def model(t):  # row i of the batch gets logits (0, log 3) if t[i, 0] > 0 else (log 3, 0)
        calls.append(t.shape[0])
        log3 = torch.tensor(math.log(3.0), dtype=torch.float64)
        a = torch.where(t[:, 0] > 0, torch.zeros((), dtype=torch.float64), log3)
        return torch.stack([a, log3 - a], 1)

    x = torch.tensor([[1.0], [-1.0], [2.0]], dtype=torch.float64)
    fn = M.ModelFn(model)
    targets, scores = M.initial_predictions(fn, x, None, ChunkRunner(2, torch.device("cpu")))
    assert calls == [2, 1]  # chunked by the runner
    assert targets.tolist() == [1, 0, 1] and targets.dtype == torch.int64
    assert scores.dtype == torch.float64 and scores.tolist() == pytest.approx([0.75] * 3, abs=1e-15)
    targets, scores = M.initial_predictions(fn, x, 0, ChunkRunner(8, torch.device("cpu")))
    assert targets.tolist() == [0, 0, 0] and scores.tolist() == pytest.approx([0.25, 0.75, 0.25], abs=1e-15)
    with pytest.raises(ValueError, match=whole("target classes must lie in [0, 2) for a model with 2 outputs")):
        M.initial_predictions(fn, x, 2, ChunkRunner(8, torch.device("cpu")))


@pytest.mark.mutation
def test_initial_predictions_errors():
    runner = ChunkRunner(8, torch.device("cpu"))
    nan = M.ModelFn(lambda t: torch.full((t.shape[0], 2), float("nan")))
    with pytest.raises(FloatingPointError, match=whole(
        "the model's output on the unmasked images contains NaN or inf")):
        M.initial_predictions(nan, torch.zeros(2, 1), None, runner)
    one_inf = M.ModelFn(lambda t: torch.cat([torch.zeros(t.shape[0] - 1, 2), torch.full((1, 2), float("inf"))]))
    with pytest.raises(FloatingPointError):
        M.initial_predictions(one_inf, torch.zeros(3, 1), None, runner)

    def wants_rank3(t):
        if t.dim() != 3:
            raise RuntimeError("expected a 3-D batch")
        return torch.zeros(t.shape[0], 2)

    with pytest.raises(ValueError, match=whole(
        "images must have a batch dimension: pass images[None] (got shape (4, 5), "
        "which the model rejects as a batch but accepts as one sample)")) as err:
        M.initial_predictions(M.ModelFn(wants_rank3), torch.zeros(4, 5), None, runner)
    assert isinstance(err.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match=whole(  # not one sample either: the model's error in one line, the shape given
            "the model fails on the inputs, shape [4, 5, 6, 7]: RuntimeError: expected a 3-D batch")):
        M.initial_predictions(M.ModelFn(wants_rank3), torch.zeros(4, 5, 6, 7), None, runner)

    # a model that returns [B] (one score per example), or squeezes a batch of one to [K]: its output shape is named,
    # not a missing batch dimension of the images
    lin = torch.nn.Linear(12, 3)
    per_example = M.ModelFn(lambda t: lin(t.flatten(1))[:, 0])
    for n in (1, 2):
        with pytest.raises(M.OutputShapeError, match=rf"for B = {n} it returned shape \({n},\); a model with one"):
            M.initial_predictions(per_example, torch.zeros(n, 3, 2, 2), None, runner)
    squeezed = M.ModelFn(lambda t: lin(t.flatten(1)).squeeze())
    with pytest.raises(M.OutputShapeError, match=whole(
            "the model must map a batch [B, *D] to scores [B, K] (K classes); for B = 1 it returned shape (3,)")):
        M.initial_predictions(squeezed, torch.zeros(1, 3, 2, 2), None, runner)

    def oom(t):
        raise torch.OutOfMemoryError("planted")

    with pytest.raises(torch.OutOfMemoryError, match="single candidate"):  # the runner's own message
        M.initial_predictions(M.ModelFn(oom), torch.zeros(1, 2), None, runner)


def test_f_keeps_torch_softmax_because_cheaper_formulas_change_its_last_bits():
    """f is torch's softmax of the logits, picked at the target: what the reference transcription computes, bit for
    bit. Cheaper ways to the same probability (exp of the shifted logits over their sum, or torch's softmax along
    the other dimension of the transposed logits, whose kernel vectorizes across rows) round differently in some
    rows: a float32 score then differs in its last bits, and a near-tie between candidates can break the other
    way. So the exact loop keeps torch.softmax (at 10 classes it costs more per row than the rest of the step's
    ops; docs: the measurement notes)."""
    logits = 5 * torch.randn(4096, 10, generator=torch.Generator().manual_seed(0))
    from overinterp_fast.runtime.model import ModelFn

    f = ModelFn(torch.nn.Identity()).probabilities(logits)
    assert torch.equal(f, torch.softmax(logits, 1))
    shifted = (logits - logits.amax(1, keepdim=True)).exp()
    for other in (shifted / shifted.sum(1, keepdim=True), torch.softmax(logits.t().contiguous(), 0).t()):
        torch.testing.assert_close(other, f, rtol=1e-6, atol=1e-7)  # the same probabilities up to rounding
        assert not torch.equal(other, f)  # but not the same bits
