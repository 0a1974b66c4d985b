"""The ONNX Runtime backend: same SIS as the torch model, fixed batch dimensions, clear errors."""

import pytest
import torch
from torch import nn

import overinterp_fast as of
from overinterp_fast.onnx_backend import OnnxModel, export_onnx

from conftest import assert_sets_sufficient, cuda, make_cnn, make_images

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def cnn32():
    return make_cnn(5, torch.float32)


@pytest.fixture(scope="module")
def onnx_path(cnn32, tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "cnn.onnx"
    return export_onnx(cnn32, path, make_images(2, dtype=torch.float32))


def test_export_has_dynamic_batch_and_matches(cnn32, onnx_path):
    m = OnnxModel(onnx_path)
    assert m.fixed_batch is None and m.dtype == torch.float32
    x = make_images(7, seed=3, dtype=torch.float32)
    torch.testing.assert_close(m(x), cnn32(x).detach(), rtol=1e-4, atol=1e-5)


def assert_same_up_to_near_ties(a_res, b_res, model, images, tol=1e-5):
    for i, (a, b) in enumerate(zip(a_res, b_res)):
        assert a.target == b.target
        assert (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert torch.equal(a.sis, b.sis), f"image {i}"
        diff = (a.order != b.order).nonzero()
        if diff.numel():
            t = int(diff[0])
            present = torch.ones(a.order.numel(), dtype=torch.bool)
            present[b.order[:t]] = False
            vals = []
            for feat in (int(a.order[t]), int(b.order[t])):
                keep = present.clone()
                keep[feat] = False
                x = torch.where(keep.view(images.shape[-2:]), images[i], torch.zeros(()))
                vals.append(float(torch.softmax(model(x[None]), 1)[0, a.target]))
            assert abs(vals[0] - vals[1]) <= tol, f"image {i}: divergence at step {t} is no near-tie: {vals}"


def test_onnx_and_torch_give_the_same_sis(cnn32, onnx_path):
    images = make_images(6, seed=7, dtype=torch.float32)
    tau = 0.3
    with torch.no_grad():
        via_torch = of.fast_sis(cnn32, images, tau, collection=True)
        via_path = of.fast_sis(onnx_path, images, tau, collection=True)
        via_model = of.fast_sis(OnnxModel(onnx_path, providers=["CPUExecutionProvider"]), images, tau)
        assert_same_up_to_near_ties(via_torch, via_path, cnn32, images)
        assert_same_up_to_near_ties(via_torch, via_model, cnn32, images)
    assert any(r.sis is not None and r.sis.numel() > 0 for r in via_path)
    for a, b in zip(via_torch, via_path):
        assert len(a.collection) == len(b.collection)


def test_session_and_reference_accept_onnx(onnx_path):
    sess = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    images = make_images(2, seed=8, dtype=torch.float32)
    fast = of.fast_sis(sess, images, 0.3)
    ref = of.reference.sis(onnx_path, images, 0.3)
    for a, b in zip(fast, ref):
        assert (a.sis is None) == (b.sis is None)
        if a.sis is not None:
            assert torch.equal(a.sis, b.sis)
    assert any(r.sis is not None for r in fast)

    def run(x):  # the session by hand
        return torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])

    assert_sets_sufficient(run, images, fast, rel=1e-5)


def fixed_batch_model(path, batch, model):
    torch.onnx.export(model, (make_images(batch, dtype=torch.float32),), path, dynamo=True, external_data=False,
                      input_names=["input"], output_names=["logits"]).save(path, external_data=False)
    return path


def test_fixed_batch_dimension_is_chunked_and_padded(cnn32, tmp_path):
    path = fixed_batch_model(str(tmp_path / "fixed.onnx"), 4, cnn32)
    m = OnnxModel(path)
    assert m.fixed_batch == 4
    x = make_images(7, seed=2, dtype=torch.float32)  # 4 + 3 (padded)
    torch.testing.assert_close(m(x), cnn32(x).detach(), rtol=1e-4, atol=1e-5)
    images = make_images(3, seed=4, dtype=torch.float32)
    a = of.fast_sis(cnn32, images, 0.3, batch_size=10)
    b = of.fast_sis(path, images, 0.3, batch_size=10)
    with torch.no_grad():
        assert_same_up_to_near_ties(a, b, cnn32, images)


def test_bad_onnx_inputs(onnx_path, tmp_path):
    images = make_images(2, dtype=torch.float32)
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_text("this is not a model")
    with pytest.raises(ValueError, match="could not be loaded as an ONNX model"):
        of.fast_sis(str(not_onnx), images, 0.5)
    with pytest.raises(FileNotFoundError, match="no ONNX model"):
        of.fast_sis(str(tmp_path / "missing.onnx"), images, 0.5)
    with pytest.raises(TypeError, match="tensor\\(float\\)"):
        of.fast_sis(onnx_path, images.double(), 0.5)
    with pytest.raises(ValueError, match="rank"):
        of.fast_sis(onnx_path, images.flatten(1), 0.5)
    with pytest.raises(ValueError, match="expects size 5 on axis 2"):
        of.fast_sis(onnx_path, make_images(2, h=6, dtype=torch.float32), 0.5)


class TwoOutputs(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        y = self.inner(x)
        return y, 2 * y


class TwoInputs(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, z):
        return self.inner(x + z)


def test_several_outputs_need_a_name_and_several_inputs_are_refused(cnn32, tmp_path):
    x = make_images(2, dtype=torch.float32)
    p2 = str(tmp_path / "two_out.onnx")
    torch.onnx.export(TwoOutputs(cnn32).eval(), (x,), dynamo=True, external_data=False,
                      input_names=["input"], output_names=["a", "b"]).save(p2, external_data=False)
    with pytest.raises(ValueError, match="2 outputs .*output_name="):
        OnnxModel(p2)
    with torch.no_grad():
        logits = cnn32(x)
    # each name gives its own output: "a" the logits, "b" twice them
    torch.testing.assert_close(OnnxModel(p2, output_name="a")(x), logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(OnnxModel(p2, output_name="b")(x), 2 * logits, rtol=1e-4, atol=1e-5)
    a = of.fast_sis(OnnxModel(p2, output_name="a"), x, 0.3)
    b = of.fast_sis(OnnxModel(p2, output_name="b"), x, 0.3)
    with torch.no_grad():
        assert_same_up_to_near_ties(a, of.fast_sis(cnn32, x, 0.3), cnn32, x)
        doubled = lambda t: 2 * cnn32(t)  # noqa: E731
        assert_same_up_to_near_ties(b, of.fast_sis(doubled, x, 0.3), doubled, x)
    assert [r.score for r in b] != pytest.approx([r.score for r in a], rel=1e-3)  # softmax(2z) is sharper
    pi = str(tmp_path / "two_in.onnx")
    torch.onnx.export(TwoInputs(cnn32).eval(), (x, x), dynamo=True, external_data=False,
                      input_names=["x", "z"]).save(pi, external_data=False)
    with pytest.raises(ValueError, match="2 inputs"):
        OnnxModel(pi)


def test_non_finite_onnx_outputs(tmp_path):
    class Log(nn.Module):
        def forward(self, x):
            s = x.flatten(1).sum(1, keepdim=True)
            return torch.cat([torch.log(s - 3.0), torch.zeros_like(s)], 1)  # NaN once most is masked

    x = torch.rand(2, 1, 3, 3) + 0.5
    path = export_onnx(Log().eval(), tmp_path / "log.onnx", x)
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        of.fast_sis(path, x, 0.1)


@cuda
def test_cuda_provider_binds_gpu_tensors(cnn32, onnx_path):
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime-gpu is not installed")
    m = OnnxModel(onnx_path, device="cuda")
    assert "CUDAExecutionProvider" in m.providers
    x = make_images(5, dtype=torch.float32).cuda()
    out = m(x)
    assert out.is_cuda
    torch.testing.assert_close(out, cnn32.cuda()(x).detach(), rtol=1e-4, atol=1e-5)
    images = make_images(3, seed=4, dtype=torch.float32)
    a = of.fast_sis(cnn32.cpu(), images, 0.3)
    b = of.fast_sis(m, images.cuda(), 0.3)
    with torch.no_grad():
        assert_same_up_to_near_ties(a, b, cnn32.cpu(), images)


def test_gradient_method_on_onnx_names_the_black_box_methods(onnx_path):
    with pytest.raises(ValueError, match="no autograd.*'exact'"):
        of.fast_sis(onnx_path, make_images(2, dtype=torch.float32), 0.5, method="gradient")


def test_responsibility_runs_on_onnx(cnn32, onnx_path):
    images = make_images(2, seed=6, dtype=torch.float32)
    res = of.fast_sis(onnx_path, images, method="responsibility", iterations=4)
    assert assert_sets_sufficient(cnn32, images, res, criterion="top1", rel=1e-4) == 2  # restores the top-1 class
    maps = of.responsibility(OnnxModel(onnx_path), images, iterations=4)
    assert all(m.queries > 0 for m in maps)


# ------------------------------------------- the CUDA path's logic, run on the CPU through IOBinding


class LoggingSession:
    """Wraps a real InferenceSession; logs run calls; can fail like ORT does when out of memory."""

    def __init__(self, session, log, fail_above=None, error=None):
        self._session, self.log, self.fail_above, self.error = session, log, fail_above, error

    def __getattr__(self, name):
        return getattr(self._session, name)

    def run(self, outputs, feeds):
        self.log.append("run")
        (x,) = feeds.values()
        if self.fail_above is not None and x.shape[0] > self.fail_above:
            raise self.error
        return self._session.run(outputs, feeds)

    def run_with_iobinding(self, binding):
        self.log.append("run")
        return self._session.run_with_iobinding(binding)


def test_every_bound_run_first_waits_for_torch_stream(cnn32, onnx_path, monkeypatch):
    """ORT runs on its own stream: each run (not only the first) must wait for the stream that wrote x."""
    from overinterp_fast import onnx_backend

    log = []
    monkeypatch.setattr(onnx_backend, "_wait_for_torch_stream", lambda device: log.append(("wait", str(device))))
    m = OnnxModel(onnx_path)
    m.session = LoggingSession(m.session, log)
    x = make_images(5, seed=3, dtype=torch.float32)
    outs = [m._run_bound(x[:3]), m._run_bound(x[3:])]
    assert log == [("wait", "cpu"), "run", ("wait", "cpu"), "run"]
    torch.testing.assert_close(torch.cat(outs), cnn32(x).detach(), rtol=1e-4, atol=1e-5)
    log.clear()
    m._known_classes = None
    m.output = type("Dynamic", (), {"name": m.output.name, "shape": ["batch", "classes"]})()
    out = m._run_bound(x)  # unknown class count: a first run learns it, then the bound run
    assert log == [("wait", "cpu"), "run", ("wait", "cpu"), "run"] and m._known_classes == 5
    torch.testing.assert_close(out, cnn32(x).detach(), rtol=1e-4, atol=1e-5)


def test_waiting_for_torch_stream_uses_the_tensors_device(monkeypatch):
    from overinterp_fast import onnx_backend

    log = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            log.append(("synchronize", str(self.device)))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream(device))
    onnx_backend._wait_for_torch_stream(torch.device("cuda", 1))
    onnx_backend._wait_for_torch_stream(torch.device("cpu"))
    assert log == [("synchronize", "cuda:1")]


def cast_matmul_model(path, in_type, out_type, weight):
    """x [N, 4] of in_type -> Cast(float) -> MatMul(weight [4, 3]) -> Cast(out_type) -> [N, 3]."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["xf", "w"], ["yf"]),
             helper.make_node("Cast", ["yf"], ["y"], to=out_type)]
    graph = helper.make_graph(nodes, "cast_matmul", [helper.make_tensor_value_info("x", in_type, ["N", 4])],
                              [helper.make_tensor_value_info("y", out_type, ["N", 3])],
                              [numpy_helper.from_array(weight.numpy(), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("in_dtype,out_dtype", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                                (torch.float32, torch.bfloat16)])
def test_output_dtype_comes_from_the_session_and_bfloat16_runs(tmp_path, in_dtype, out_dtype):
    from onnx import TensorProto

    code = {torch.float16: TensorProto.FLOAT16, torch.float32: TensorProto.FLOAT,
            torch.bfloat16: TensorProto.BFLOAT16}
    w = torch.tensor([[1.0, 0, -1], [0, 2, 0], [0.5, 0, 1], [0, -1, 0]])
    path = cast_matmul_model(str(tmp_path / "m.onnx"), code[in_dtype], code[out_dtype], w)
    m = OnnxModel(path)
    assert (m.dtype, m.out_dtype) == (in_dtype, out_dtype)
    x = torch.tensor([[1.0, 2, 3, 4], [0.5, -1, 0, 2]]).to(in_dtype)
    want = (x.float() @ w).to(out_dtype)
    for out in (m(x), m._run_bound(x)):  # the CPU path, and the IOBinding path CUDA takes
        assert out.dtype == out_dtype and torch.equal(out, want)
    res = of.fast_sis(m, torch.rand(2, 4).to(in_dtype), 0.4)
    assert all(r.order.numel() == 4 for r in res)


def test_onnx_runtime_out_of_memory_halves_the_batch(cnn32, onnx_path):
    from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

    images = make_images(3, seed=4, dtype=torch.float32)
    log = []
    m = OnnxModel(onnx_path)
    m.session = LoggingSession(m.session, log, fail_above=4, error=RuntimeException(
        "Non-zero status code returned while running Conv node. Status Message: bfc_arena.cc:376 "
        "onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 4096"))
    with pytest.warns(UserWarning) as caught:
        got = of.fast_sis(m, images, 0.3, batch_size=16)
    assert [str(w.message) for w in caught][:2] == [
        "out of memory at 16 candidates per forward call; retrying with 8",
        "out of memory at 8 candidates per forward call; retrying with 4"]
    with torch.no_grad():
        assert_same_up_to_near_ties(of.fast_sis(cnn32, images, 0.3), got, cnn32, images)
    other = OnnxModel(onnx_path)
    other.session = LoggingSession(other.session, [], fail_above=0, error=RuntimeException("Invalid rank for input"))
    with pytest.raises(RuntimeException, match="Invalid rank"):  # other errors pass through unchanged
        other(images)


def test_single_onnx_image_without_batch_dimension(onnx_path):
    with pytest.raises(ValueError, match=r"images must have a batch dimension: pass images\[None\]"):
        of.fast_sis(onnx_path, make_images(1, dtype=torch.float32)[0], 0.5)
