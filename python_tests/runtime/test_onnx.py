"""The ONNX Runtime backend: same SIS as the torch model, fixed batch dimensions, clear errors.
"""
import os
import warnings
import pytest
import torch
from torch import nn
import overinterp_fast as of
from overinterp_fast.runtime.onnx import OnnxModel, export_onnx
from helpers import assert_sets_sufficient, cuda, make_cnn, make_images

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
    res = of.fast_sis(onnx_path, images, method="responsibility", options=of.MinimalPixelSetOptions(iterations=4))
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
    from overinterp_fast.runtime import onnx as onnx_backend

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
    from overinterp_fast.runtime import onnx as onnx_backend

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


# ------------------------------------------- hand-built ONNX graphs: fast, exact, no torch export


def graph_model(path, nodes, inputs, outputs, weights=()):
    """Save an ONNX graph built with onnx.helper: inputs/outputs are (name, element type, shape) triples."""
    from onnx import helper, numpy_helper

    graph = helper.make_graph(nodes, "hand_built", [helper.make_tensor_value_info(*a) for a in inputs],
                              [helper.make_tensor_value_info(*a) for a in outputs],
                              [numpy_helper.from_array(w.numpy(), name) for name, w in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return str(path)


W43 = torch.tensor([[1.0, 0, -1], [0, 2, 0], [0.5, 0, 1], [0, -1, 0]])  # x [N, 4] @ W43 = logits [N, 3]


def matmul_model(path, in_shape=("N", 4), out_shape=("N", 3)):
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    return graph_model(path, [helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", f, list(in_shape))],
                       [("y", f, list(out_shape))], [("w", W43)])


def test_hand_built_model_attributes_describe_and_session_options(tmp_path):
    import pathlib

    path = matmul_model(tmp_path / "m.onnx")
    m = OnnxModel(pathlib.Path(path))  # a PathLike
    assert m.path == path and m.device == torch.device("cpu") and m.fixed_batch is None
    assert (m.input.name, m.output.name, m.dtype, m.out_dtype) == ("x", "y", torch.float32, torch.float32)
    assert m.input_shape == ["N", 4] and m._known_classes is None and m._classes() == 3
    assert m.providers == ["CPUExecutionProvider"]
    # the default options turn ORT's intra-op spinning off
    assert m.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert m.describe() == (f"ONNX model {path}: input 'x' tensor(float) ['N', 4], output 'y', "
                            "providers ['CPUExecutionProvider']")
    x = torch.tensor([[1.0, 2, 3, 4], [0.5, -1, 0, 2]])
    assert torch.equal(m(x), x @ W43)
    assert torch.equal(m(x.t().contiguous().t()), x @ W43)  # a non-contiguous view of the same values
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    m2 = OnnxModel(path, ("CPUExecutionProvider",), session_options=opts)  # a tuple of providers, own options
    assert m2.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(Exception):  # not set: the user's options are taken as given
        m2.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    s = OnnxModel(sess, device="cuda:1")
    assert s.session is sess and s.path is None and s.device == torch.device("cuda", 1)
    assert s.describe().startswith("ONNX model (session): input 'x'")


def test_default_and_cuda_providers_by_hand(tmp_path):
    import types

    m = OnnxModel(matmul_model(tmp_path / "m.onnx"))
    both = types.SimpleNamespace(get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    cpu_only = types.SimpleNamespace(get_available_providers=lambda: ["CPUExecutionProvider"])
    assert m._default_providers(both) == ["CPUExecutionProvider"]  # cpu images
    for device, index in (("cuda:1", 1), ("cuda", 0)):
        m.device = torch.device(device)
        assert m._default_providers(both) == [
            ("CUDAExecutionProvider", {"device_id": index, "arena_extend_strategy": "kSameAsRequested"}),
            "CPUExecutionProvider"]
        assert m._default_providers(cpu_only) == ["CPUExecutionProvider"]


def test_fixed_batch_of_a_hand_built_model_is_chunked_and_padded(tmp_path):
    m = OnnxModel(matmul_model(tmp_path / "m.onnx", in_shape=(4, 4), out_shape=(4, 3)))
    assert m.fixed_batch == 4 and m.input_shape == [4, 4]
    x = torch.arange(36, dtype=torch.float32).view(9, 4) - 17
    for n in (1, 3, 4, 8, 9):  # under, at, and over the fixed size, exact multiples or not
        got = m(x[:n])
        assert got.shape == (n, 3) and torch.equal(got, x[:n] @ W43), n
    with pytest.raises(TypeError, match=r"^the ONNX model takes torch.float32, got torch.float64$"):
        m(x.double())
    assert OnnxModel(matmul_model(tmp_path / "d.onnx", in_shape=(None, 4))).fixed_batch is None


def test_pick_and_type_errors_of_hand_built_models(tmp_path):
    from onnx import TensorProto, helper

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    two_out = graph_model(tmp_path / "two_out.onnx", [helper.make_node("MatMul", ["x", "w"], ["a"]),
                                                      helper.make_node("Add", ["a", "a"], ["b"])],
                          [("x", f, ["N", 4])], [("a", f, ["N", 3]), ("b", f, ["N", 3])], [("w", W43)])
    with pytest.raises(ValueError, match=r"^the ONNX model has 2 outputs \['a', 'b'\]; say which holds the "
                                         r"logits with output_name=$"):
        OnnxModel(two_out)
    x = torch.tensor([[1.0, 2, 3, 4]])
    assert torch.equal(OnnxModel(two_out, output_name="b")(x), 2 * (x @ W43))
    assert torch.equal(OnnxModel(two_out, output_name="a", input_name="x")(x), x @ W43)
    with pytest.raises(ValueError, match=r"^the ONNX model has no output named 'c'; its outputs are \['a', 'b'\]$"):
        OnnxModel(two_out, output_name="c")
    with pytest.raises(ValueError, match=r"^the ONNX model has no input named 'z'; its inputs are \['x'\]$"):
        OnnxModel(two_out, input_name="z", output_name="a")
    two_in = graph_model(tmp_path / "two_in.onnx", [helper.make_node("Add", ["x", "z"], ["y"])],
                         [("x", f, ["N", 3]), ("z", f, ["N", 3])], [("y", f, ["N", 3])])
    with pytest.raises(ValueError, match=r"^the ONNX model has 2 inputs \['x', 'z'\]; SIS needs a model with one "
                                         r"image input$"):
        OnnxModel(two_in)
    int_in = graph_model(tmp_path / "int_in.onnx", [helper.make_node("Cast", ["x"], ["y"], to=f)],
                         [("x", i64, ["N", 3])], [("y", f, ["N", 3])])
    with pytest.raises(TypeError, match=r"^the ONNX model's input 'x' is tensor\(int64\); a float tensor is needed$"):
        OnnxModel(int_in)
    int_out = graph_model(tmp_path / "int_out.onnx", [helper.make_node("Cast", ["x"], ["y"], to=i64)],
                          [("x", f, ["N", 3])], [("y", i64, ["N", 3])])
    with pytest.raises(TypeError, match=r"^the ONNX model's output 'y' is tensor\(int64\); SIS needs float scores "
                                        r"\(logits or probabilities\)$"):
        OnnxModel(int_out)
    missing = str(tmp_path / "missing.onnx")
    with pytest.raises(FileNotFoundError, match=rf"^no ONNX model at {missing!r}$"):
        OnnxModel(missing)
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    with pytest.raises(ValueError, match=rf"^{str(bad)!r} could not be loaded as an ONNX model: ") as caught:
        OnnxModel(bad)
    assert caught.value.__cause__ is not None


def test_check_compatible_messages_by_hand(tmp_path):
    from onnx import TensorProto

    m = OnnxModel(matmul_model(tmp_path / "m.onnx", in_shape=("N", 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cpu images on a cpu session: no warning
        m.check_compatible(torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"^the ONNX model's input 'x' is tensor\(float\) \(torch.float32\) but the "
                                        r"images are torch.float64; convert the images \(e.g. "
                                        r"images.to\(torch.float32\)\)$"):
        m.check_compatible(torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"^images must have a batch dimension: pass images\[None\] \(the ONNX "
                                         r"model's input 'x' is \['N', 4\], the images have shape \(4,\)\)$"):
        m.check_compatible(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^the ONNX model's input 'x' has rank 2 \['N', 4\], the images have "
                                         r"rank 3 \(2, 4, 1\)$"):
        m.check_compatible(torch.zeros(2, 4, 1))
    with pytest.raises(ValueError, match=r"^the ONNX model's input 'x' expects size 4 on axis 1 \(\['N', 4\]\); "
                                         r"the images have shape \(2, 5\)$"):
        m.check_compatible(torch.zeros(2, 5))
    graph_model(tmp_path / "c.onnx", [onnx.helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)],
                [("x", TensorProto.FLOAT, [3, "C", 2, None])], [("y", TensorProto.FLOAT, [])])
    cube = OnnxModel(str(tmp_path / "c.onnx"))
    cube.check_compatible(torch.zeros(5, 7, 2, 9))  # the batch and the dynamic axes take any size
    with pytest.raises(ValueError, match=r"expects size 2 on axis 2 \(\[3, 'C', 2, None\]\)"):
        cube.check_compatible(torch.zeros(3, 7, 3, 9))


def test_onnx_runtime_errors_by_hand(monkeypatch):
    import sys

    from overinterp_fast.runtime import onnx as onnx_backend

    assert onnx_backend._ort_call(lambda a, b: a - b, 5, 2) == 3
    for text in ("Failed to allocate memory for requested buffer", "CUDA error: OUT OF MEMORY",
                 "std::bad_alloc", "cudaErrorMemoryAllocation: whatever"):
        def fail(text=text):
            raise RuntimeError(f"  {text}\nsecond line")

        with pytest.raises(torch.OutOfMemoryError) as caught:
            onnx_backend._ort_call(fail)
        assert str(caught.value) == f"ONNX Runtime could not allocate memory: {text}"
        assert isinstance(caught.value.__cause__, RuntimeError)
    other = RuntimeError("Invalid rank for input")

    def fail_other():
        raise other

    with pytest.raises(RuntimeError) as caught:
        onnx_backend._ort_call(fail_other)
    assert caught.value is other
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # not importable, as when it is not installed
    with pytest.raises(ImportError, match=r"^the ONNX backend needs onnxruntime, which is not installed: "
                                          r"pip install 'overinterp-fast\[onnx\]'$") as caught:
        onnx_backend._import_ort()
    assert isinstance(caught.value.__cause__, ImportError) and caught.value.extra == "onnx"


def test_bound_run_learns_the_class_count_and_checks_the_output_shape(tmp_path):
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    dyn = OnnxModel(matmul_model(tmp_path / "dyn.onnx"))
    for shape in (["N", "K"], ["N", 0], ["N"], ["N", 3, 1]):  # a class count only from [B, K > 0]
        dyn.output = type("Declared", (), {"name": "y", "shape": shape})()
        assert dyn._classes() is None, shape
    x = torch.tensor([[1.0, 2, 3, 4], [0.5, -1, 0, 2]])
    got = dyn._run_bound(x.t().contiguous().t().contiguous())
    assert dyn._known_classes == 3 and dyn._classes() == 3 and torch.equal(got, x @ W43)
    assert torch.equal(dyn._run_bound(x[:1]), x[:1] @ W43)  # known now: one bound run
    flat = graph_model(tmp_path / "flat.onnx", [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                       [("x", f, ["N", 4])], [("y", f, ["N"])], [("axes", torch.tensor([1]))])
    with pytest.raises(ValueError, match=r"^the ONNX model's output 'y' has shape \[2\] for a batch of 2; "
                                         r"it must be \[B, K\]$"):
        OnnxModel(flat)._run_bound(x)
    transposed = graph_model(tmp_path / "t.onnx", [helper.make_node("MatMul", ["x", "w"], ["a"]),
                                                   helper.make_node("Transpose", ["a"], ["y"], perm=[1, 0])],
                             [("x", f, ["N", 4])], [("y", f, ["K", "N"])], [("w", W43)])
    with pytest.raises(ValueError, match=r"has shape \[3, 2\] for a batch of 2; it must be \[B, K\]$"):
        OnnxModel(transposed)._run_bound(x)


class _ExportsDifferently(nn.Module):
    """x @ W43 in torch; while traced for export, ``shift`` is added or the last logit dropped."""

    def __init__(self, shift=0.0, drop=False):
        super().__init__()
        self.shift, self.drop = shift, drop

    def forward(self, x):
        y = x @ W43
        if torch.jit.is_tracing() or torch.compiler.is_exporting():
            y = y[:, :2] if self.drop else y + self.shift
        return y


def test_export_onnx_checks_the_export_at_batch_size_plus_one(tmp_path):
    example = torch.tensor([[1.0, 2, 3, 1], [2, 1, 0, 0]])  # logits [2.5, 3, 2], [2, 2, -2]; probe [2, 5, 1]
    path = export_onnx(_ExportsDifferently().eval(), tmp_path / "same.onnx", example, dynamo=False)
    assert path == str(tmp_path / "same.onnx")
    m = OnnxModel(path)
    assert (m.input.name, m.output.name, m.fixed_batch, m._classes()) == ("input", "logits", None, 3)
    assert (m.input_shape, list(m.output.shape)) == (["batch", 4], ["batch", 3])
    path13 = export_onnx(_ExportsDifferently().eval(), tmp_path / "op13.onnx", example, dynamo=False, opset_version=13)
    assert [o.version for o in onnx.load(path13).opset_import if o.domain == ""] == [13]
    x = torch.arange(20, dtype=torch.float32).view(5, 4)
    torch.testing.assert_close(m(x), x @ W43)
    shifted = _ExportsDifferently(shift=0.01).eval()  # off by 1e-2, over 1e-4 * |y| + 1e-5
    with pytest.raises(ValueError, match=r"^the exported model differs from the torch model at batch size 3: "
                                         r"max error 0.0(099|100)"):
        export_onnx(shifted, tmp_path / "shifted.onnx", example, dynamo=False)
    export_onnx(shifted, tmp_path / "loose.onnx", example, dynamo=False, rtol=0.1)
    export_onnx(shifted, tmp_path / "abs.onnx", example, dynamo=False, atol=0.02)
    export_onnx(shifted, tmp_path / "unchecked.onnx", example, dynamo=False, check=False)
    with pytest.raises(ValueError, match=r"^the exported model differs from the torch model at batch size 3: "
                                         r"max error shape \(3, 2\)$"):
        export_onnx(_ExportsDifferently(drop=True).eval(), tmp_path / "drop.onnx", example, dynamo=False)
    with pytest.raises(ValueError, match=r"^export the model in eval mode \(model.eval\(\)\)$"):
        export_onnx(_ExportsDifferently().train(), tmp_path / "train.onnx", example, dynamo=False)


def test_export_onnx_default_uses_torch_export(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 256), nn.Linear(256, 3)).eval()  # 4 KB of weights: over ONNX's
    path = export_onnx(model, tmp_path / "dyn.onnx", torch.rand(2, 4), opset_version=18)  # external-data limit
    assert os.listdir(tmp_path) == ["dyn.onnx"]  # weights inline: no external data file
    assert capsys.readouterr().out == ""  # verbose=False: the exporter prints nothing
    assert [o.version for o in onnx.load(path).opset_import if o.domain == ""] == [18]
    m = OnnxModel(path)
    assert (m.input.name, m.output.name, m.fixed_batch, m.input_shape) == ("input", "logits", None, ["batch", 4])
    for n in (1, 5):  # the batch dimension is dynamic
        x = torch.arange(4 * n, dtype=torch.float32).view(n, 4)
        with torch.no_grad():
            torch.testing.assert_close(m(x), model(x), rtol=1e-4, atol=1e-5)


def test_declared_sizes_and_the_cuda_copy_warning_by_hand(tmp_path):
    import types

    m = OnnxModel(matmul_model(tmp_path / "m.onnx"))
    m.input_shape = ["N", 0, 1, "T"]  # 0 (unknown) takes any size; 1 is a real size
    m.check_compatible(torch.zeros(2, 5, 1, 3))
    with pytest.raises(ValueError, match=r"^the ONNX model's input 'x' expects size 1 on axis 2 "):
        m.check_compatible(torch.zeros(2, 5, 3, 3))
    for shape, classes in ((["N", 1], 1), (["N", 3], 3)):
        m.output = type("Declared", (), {"name": "y", "shape": shape})()
        assert m._classes() == classes
    # images on CUDA (only their attributes are read) with a CPU-only session: one warning, said whole
    m = OnnxModel(matmul_model(tmp_path / "m.onnx"))
    on_gpu = types.SimpleNamespace(dtype=torch.float32, dim=lambda: 2, shape=torch.Size([2, 4]),
                                   device=torch.device("cuda", 0))
    with pytest.warns(UserWarning) as caught:
        m.check_compatible(on_gpu)
    assert [str(w.message) for w in caught] == [
        "images are on CUDA but the ONNX session runs on ['CPUExecutionProvider']; every batch is copied to the "
        "host (install onnxruntime-gpu >= 1.27)"]
    m.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.check_compatible(on_gpu)


class _TracedDifferently(nn.Module):
    """x @ W43, plus 0.01 only while traced by the TorchScript exporter."""

    def forward(self, x):
        y = x @ W43
        return y + 0.01 if torch.jit.is_tracing() else y


def test_export_onnx_default_is_torch_export_not_torchscript(tmp_path):
    example = torch.tensor([[1.0, 2, 3, 1], [2, 1, 0, 0]])
    export_onnx(_TracedDifferently().eval(), tmp_path / "dyn.onnx", example)  # torch.export: no shift
    with pytest.raises(ValueError, match="differs from the torch model"):  # the TorchScript exporter: shifted
        export_onnx(_TracedDifferently().eval(), tmp_path / "ts.onnx", example, dynamo=False)


class _SwapsRowsWhenTraced(nn.Module):
    """x [B, 2, 3] -> [B, 1]: 0 in torch; while traced, relu(sum of row 1 - sum of row 0) of each sample."""

    def forward(self, x):
        y = 0 * x.sum((1, 2))[:, None]
        if torch.jit.is_tracing():
            y = y + torch.relu(x[:, 1].sum(1) - x[:, 0].sum(1))[:, None]
        return y


def test_export_check_probe_flips_the_last_axis_on_the_cpu_provider_plus_one(tmp_path):
    # every example sample has its row 0 heavier than row 1: the export agrees with torch on it, and on it
    # flipped along the last axis (the probe); flipped along axis 1 it would not
    example = torch.tensor([[[3.0, 2, 1], [0, 1, 0]], [[1.0, 1, 1], [1, 0, 1]]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_onnx(_SwapsRowsWhenTraced().eval(), tmp_path / "rows.onnx", example, dynamo=False)
    assert not [w for w in caught if issubclass(w.category, UserWarning)]  # a provider ORT knows
    with pytest.raises(ValueError, match="max error 5.0"):  # the check does see the traced difference
        export_onnx(_SwapsRowsWhenTraced().eval(), tmp_path / "swapped.onnx", example.flip(1), dynamo=False)


def test_run_dispatch_for_cuda_images_by_hand(tmp_path):
    """Which path a batch takes: bound to the GPU session, copied to the host and back, or run on the CPU."""
    log = []
    host = torch.tensor([[1.0, 2, 3, 4]])

    class OnCuda:  # a batch on CUDA, as far as _run reads it
        device, dtype = torch.device("cuda", 0), torch.float32

        def contiguous(self):
            return self

        def cpu(self):
            log.append("to host")
            return host

    class Back:
        def to(self, device):
            log.append(("back to", device))
            return "result"

    m = OnnxModel(matmul_model(tmp_path / "m.onnx"))
    m._run_bound = lambda x: log.append(("bound", x)) or "bound result"
    x = OnCuda()
    m.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert m._run(x) == "bound result" and log == [("bound", x)]
    assert torch.equal(m._run(host), host @ W43) and len(log) == 1  # CPU batches run on the CPU, unbound
    log.clear()
    m.providers = ["CPUExecutionProvider"]
    inner = m._run
    m._run = lambda t: inner(t) if t is x else (log.append(("run", t)) or Back())
    assert inner(x) == "result"
    assert log == ["to host", ("run", host), ("back to", torch.device("cuda", 0))]


def test_fixed_batch_of_one_zero_or_none_by_hand(tmp_path):
    from onnx import TensorProto, helper

    one = OnnxModel(matmul_model(tmp_path / "one.onnx", in_shape=(1, 4), out_shape=(1, 3)))
    x = torch.tensor([[1.0, 2, 3, 4], [0.5, -1, 0, 2], [2, 0, 0, 1]])
    assert one.fixed_batch == 1 and torch.equal(one(x), x @ W43)  # three runs of one row
    assert OnnxModel(matmul_model(tmp_path / "zero.onnx", in_shape=(0, 4), out_shape=(0, 3))).fixed_batch is None
    f = TensorProto.FLOAT
    scalar = graph_model(tmp_path / "scalar.onnx", [helper.make_node("Mul", ["x", "w"], ["y"])], [("x", f, [])],
                         [("y", f, [1, 3])], [("w", torch.ones(1, 3))])
    m = OnnxModel(scalar)
    assert m.input_shape == [] and m.fixed_batch is None
