"""Planning ahead in dp.onnx: the programs a new input shape needs are gathered by walks that
build nothing and built concurrently (``DLPRIM_BUILD_THREADS``, ``program.BuildAhead``). The
plan must be the one that building one program at a time gives: the same programs, each built
once, the same launches and memory, outputs that match onnxruntime; and a build that fails
raises the KernelBuildError it raises one at a time."""
import re
import threading

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import program

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torchvision = pytest.importorskip("torchvision")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_util import assert_matches, export, ort_run  # noqa: E402


def _resnet18():
    return export("resnet18", lambda: torchvision.models.resnet18(num_classes=10), 32)


def _plan(data, x):
    """(model, outputs, {(source, options): builds}) of a fresh context planning ``data``."""
    ctx = dp.Context()
    model = dp.onnx.load(data, ctx)
    out = model.run({"x": x})
    return ctx, model, out


def test_concurrent_plan_builds_each_program_once(monkeypatch, tmp_path):
    """An empty cache folder and two threads: the first two builds meet at a barrier, which
    they pass only if they run at once; every program is built once, and a plan made one build
    at a time afterwards (from the binaries the first left) has the same programs, launches,
    memory and outputs."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", "2")
    data = _resnet18()
    # Batch 2, then 4: the same programs serve both (at batch 1 the classifier's GEMM is a
    # matrix-vector product, which another solver computes).
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    barrier = threading.Barrier(2, timeout=120)
    built, lock, meet = [], threading.Lock(), [2]
    inner = program.build_source

    def counted(ctx, source, options=(), label="<source>"):
        with lock:
            built.append((source, tuple(options), threading.get_ident()))
            first_two = meet[0] > 0
            meet[0] -= 1
        if first_two:
            barrier.wait()   # BrokenBarrierError (the test fails) unless two builds overlap
        return inner(ctx, source, options, label)

    monkeypatch.setattr(program, "build_source", counted)
    before = program.stats["builds"]
    ctx, model, out = _plan(data, x)
    assert len(built) >= 2
    assert len({(s, o) for s, o, _ in built}) == len(built), "a program was built twice"
    assert len({t for _, _, t in built}) >= 2
    assert program.stats["builds"] - before == len(built) == len(ctx.programs)
    assert all(not p.from_cache for p in ctx.programs.values())
    ref = ort_run(data, {"x": x})
    assert_matches(out["y"], ref["y"], what="resnet18, built concurrently")

    monkeypatch.setenv("DLPRIM_BUILD_THREADS", "1")
    built.clear()
    serial_ctx, serial, serial_out = _plan(data, x)
    assert set(serial_ctx.programs) == set(ctx.programs)
    assert all(p.from_cache for p in serial_ctx.programs.values())
    assert len(built) == len(ctx.programs)
    assert serial.launch_count == model.launch_count
    assert serial.memory_parts == model.memory_parts
    assert serial.weight_bytes == model.weight_bytes
    np.testing.assert_array_equal(serial_out["y"], out["y"])

    # The planned shape replays without a build; a new shape plans ahead with nothing to build.
    before = dict(program.stats)
    x2 = np.concatenate([x, x[:, :, ::-1].copy()])
    assert_matches(model.run({"x": x2})["y"], ort_run(data, {"x": x2})["y"], what="batch 4")
    assert_matches(model.run({"x": x})["y"], ref["y"], what="replayed")
    assert program.stats["renders"] == before["renders"]


def _conv_pool_model():
    """Conv -> Relu -> MaxPool -> Conv -> Add: several programs, one of them a pooling one."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.2
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "p1"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _failing_pool(monkeypatch):
    """Renders of the pooling template get a line the compiler rejects."""
    inner = program.render

    def render(template, **params):
        source = inner(template, **params)
        if template.startswith("pool"):
            source += "\nthis_is_not_opencl_c;\n"
        return source

    monkeypatch.setattr(program, "render", render)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_build_error_while_planning_ahead(monkeypatch, tmp_path, threads):
    """A program that does not compile raises the library's KernelBuildError with the
    compiler's message, concurrently as one at a time, and the model still plans once the
    template renders again."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", threads)
    _failing_pool(monkeypatch)
    data = _conv_pool_model()
    x = np.random.default_rng(6).standard_normal((1, 3, 12, 12)).astype(np.float32)
    ctx = dp.Context()
    model = dp.onnx.load(data, ctx)
    with pytest.raises(dp.KernelBuildError) as info:
        model.run({"x": x})
    message = str(info.value)
    assert "OpenCL build of pool" in message and "this_is_not_opencl_c" in message
    assert ">>" in message
    monkeypatch.undo()
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", threads)
    assert_matches(model.run({"x": x})["y"], ort_run(data, {"x": x})["y"], what="after the error")


def test_build_error_message_is_the_serial_one(monkeypatch, tmp_path):
    """The same message, word for word, whether programs are built ahead or one at a time."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    _failing_pool(monkeypatch)
    data = _conv_pool_model()
    x = np.ones((1, 3, 12, 12), np.float32)
    messages = {}
    for threads in ("2", "1"):
        monkeypatch.setenv("DLPRIM_BUILD_THREADS", threads)
        model = dp.onnx.load(data, dp.Context())
        with pytest.raises(dp.KernelBuildError) as info:
            model.run({"x": x})
        # PoCL names the file it compiles at random.
        messages[threads] = re.sub(r"tempfile_\w+", "tempfile", str(info.value))
    assert messages["1"] == messages["2"]


def test_find_mode_plans_ahead(monkeypatch, tmp_path):
    """With DLPRIM_FIND_MODE=find, the candidates that find times are gathered and built ahead
    too, and the plan matches onnxruntime and a one-at-a-time plan's choices."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DLPRIM_FIND_MODE", "find")
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", "2")
    dp.config.reload()
    data = _conv_pool_model()
    x = np.random.default_rng(7).standard_normal((1, 3, 12, 12)).astype(np.float32)
    ctx = dp.Context()
    before = program.stats["builds"]
    model = dp.onnx.load(data, ctx)
    out = model.run({"x": x})["y"]
    assert_matches(out, ort_run(data, {"x": x})["y"], what="find mode")
    # Every candidate that was timed was built once, and nothing the walk for real did not ask
    # for: the find-db now answers, so a one-at-a-time plan builds nothing new.
    assert program.stats["builds"] - before == len(ctx.programs)
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", "1")
    serial = dp.onnx.load(data, ctx)
    before = program.stats["builds"]
    np.testing.assert_array_equal(serial.run({"x": x})["y"], out)
    assert program.stats["builds"] == before
    assert serial.launch_count == model.launch_count


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_build_threads_raises(monkeypatch, value):
    monkeypatch.setenv("DLPRIM_BUILD_THREADS", value)
    with pytest.raises(dp.ShapeError, match="DLPRIM_BUILD_THREADS"):
        dp.config.build_threads()


def test_value_shapes_guess_static_shapes():
    """Shape inference on the model without its weights, at the input shape given."""
    from dlprim_py.onnx.graph import Graph
    graph = Graph(_conv_pool_model())
    shapes = graph.value_shapes({"x": (2, 3, 12, 12)})
    assert shapes["c1"] == ((2, 8, 12, 12), np.dtype(np.float32))
    assert shapes["y"] == ((2, 8, 6, 6), np.dtype(np.float32))
