"""Every operator of dp.onnx on tiny one- or few-node graphs built with onnx.helper, against
onnxruntime on seeded random data; the load-time rewrites (folding, fusion), the planner
(shape arithmetic on the host, dynamic batch, replay that builds nothing) and the error paths
(unsupported operator or attribute, bad files, wrong inputs)."""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import program

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from onnx_util import assert_matches, ort_run  # noqa: E402

F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    """ONNX bytes of a graph: ``inputs`` / ``outputs`` are (name, shape) (float32; a shape may
    hold strings for symbolic dimensions, None for an unknown output shape)."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F32, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v), name=k) for k, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _check(ctx, data, feeds, rtol=1e-5):
    model = dp.onnx.load(data, ctx)
    ours = model.run(feeds)
    ref = ort_run(data, feeds)
    assert list(ours) == list(ref)
    for name in ref:
        assert_matches(ours[name], ref[name], rtol, what=name)
    return model


def _rand(rng, *shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, shape).astype(np.float32)


def _unary_case(ctx, rng, op, shape=(2, 3, 4, 5), opset=17, **attrs):
    data = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", shape)], [("y", None)],
                  opset=opset)
    return _check(ctx, data, {"x": _rand(rng, *shape, low=-4, high=4)})


# ---- activations ---------------------------------------------------------------------------------

@pytest.mark.parametrize("op,attrs", [
    ("Relu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {}),
    ("Elu", {"alpha": 0.7}), ("HardSwish", {}), ("HardSigmoid", {}),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
    ("Identity", {}), ("Dropout", {})])
def test_activation(ctx, rng, op, attrs):
    _unary_case(ctx, rng, op, opset=20 if op == "Gelu" else 17, **attrs)


@pytest.mark.parametrize("bounds", [(0.0, 6.0), (-1.0, 1.5), (0.0, None), (None, 0.5), (0.5, None)])
def test_clip(ctx, rng, bounds):
    lo, hi = bounds
    inits, names = {}, ["x"]
    names.append("lo" if lo is not None else "")
    names.append("hi" if hi is not None else "")
    if lo is not None:
        inits["lo"] = np.array(lo, np.float32)
    if hi is not None:
        inits["hi"] = np.array(hi, np.float32)
    while names[-1] == "":
        names.pop()
    data = _model([helper.make_node("Clip", names, ["y"])], [("x", (2, 3, 4))], [("y", None)],
                  inits)
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4, low=-8, high=8)})


def test_clip_opset_10_attributes(ctx, rng):
    data = _model([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25)],
                  [("x", (3, 4))], [("y", None)], opset=10)
    _check(ctx, data, {"x": _rand(rng, 3, 4)})


@pytest.mark.parametrize("op,opset", [("Softmax", 13), ("LogSoftmax", 13), ("Softmax", 11),
                                      ("LogSoftmax", 11)])
@pytest.mark.parametrize("axis", [1, -1])
def test_softmax(ctx, rng, op, opset, axis):
    _unary_case(ctx, rng, op, shape=(2, 3, 5), opset=opset, axis=axis)


# ---- convolutions and normalisation ---------------------------------------------------------------

@pytest.mark.parametrize("attrs,wshape", [
    ({"pads": [1, 1, 1, 1]}, (6, 4, 3, 3)),
    ({"strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 2, 1]}, (6, 4, 3, 3)),
    ({"group": 4, "pads": [1, 1, 1, 1]}, (8, 1, 3, 3)),
    ({"group": 2}, (6, 2, 1, 1)),
    ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (6, 4, 3, 3)),
    ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (6, 4, 2, 2)),
    ({"auto_pad": "VALID"}, (6, 4, 3, 2)),
    ({"pads": [0, 1, 2, 1]}, (6, 4, 3, 3)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv(ctx, rng, attrs, wshape, bias):
    inits = {"w": _rand(rng, *wshape)}
    names = ["x", "w"]
    if bias:
        inits["b"] = _rand(rng, wshape[0])
        names.append("b")
    data = _model([helper.make_node("Conv", names, ["y"], **attrs)], [("x", (2, 4, 9, 8))],
                  [("y", None)], inits)
    _check(ctx, data, {"x": _rand(rng, 2, 4, 9, 8)})


def test_conv_1d(ctx, rng):
    data = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], strides=[2])],
                  [("x", (2, 4, 11))], [("y", None)],
                  {"w": _rand(rng, 5, 4, 3), "b": _rand(rng, 5)})
    _check(ctx, data, {"x": _rand(rng, 2, 4, 11)})


def test_conv_transpose(ctx, rng):
    data = _model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                                    pads=[1, 1, 1, 1], output_padding=[1, 1])],
                  [("x", (2, 4, 5, 6))], [("y", None)],
                  {"w": _rand(rng, 4, 3, 3, 3), "b": _rand(rng, 3)})
    _check(ctx, data, {"x": _rand(rng, 2, 4, 5, 6)})


def _bn_inits(rng, c, prefix="bn"):
    return {f"{prefix}_s": _rand(rng, c, low=0.5, high=1.5), f"{prefix}_b": _rand(rng, c),
            f"{prefix}_m": _rand(rng, c), f"{prefix}_v": _rand(rng, c, low=0.5, high=1.5)}


def test_batch_normalization_alone(ctx, rng):
    inits = _bn_inits(rng, 3)
    data = _model([helper.make_node("BatchNormalization", ["x"] + list(inits), ["y"],
                                    epsilon=1e-3)], [("x", (2, 3, 4, 5))], [("y", None)], inits)
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4, 5)})


def test_conv_batchnorm_relu_add_fused(ctx, rng):
    """Conv -> BN -> Add(residual) -> Relu plans as one convolution launch with the BN folded
    into its weights and the Add and Relu in its epilogue; BN -> Relu as one launch."""
    inits = {"w": _rand(rng, 4, 4, 3, 3), **_bn_inits(rng, 4), **_bn_inits(rng, 4, "bn2")}
    nodes = [helper.make_node("BatchNormalization", ["x", "bn2_s", "bn2_b", "bn2_m", "bn2_v"],
                              ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    data = _model(nodes, [("x", (2, 4, 6, 6))], [("y", None)], inits)
    model = _check(ctx, data, {"x": _rand(rng, 2, 4, 6, 6)})
    ops = [n.op for n in model.graph.nodes]
    assert ops == ["BatchNormalization", "Conv"], ops
    conv = model.graph.nodes[1]
    assert set(conv.fused) >= {"batch_norm", "residual", "activation"}
    assert model.launch_count == 2


def test_conv_silu_fused(ctx, rng):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    data = _model(nodes, [("x", (2, 3, 5, 5))], [("y", None)], {"w": _rand(rng, 4, 3, 1, 1)})
    model = _check(ctx, data, {"x": _rand(rng, 2, 3, 5, 5)})
    assert [n.op for n in model.graph.nodes] == ["Conv"]


def test_residual_add_that_broadcasts_is_not_fused_wrongly(ctx, rng):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Add", ["c", "z"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    data = _model(nodes, [("x", (2, 3, 5, 5)), ("z", (1, 4, 1, 1))], [("y", None)],
                  {"w": _rand(rng, 4, 3, 1, 1)})
    _check(ctx, data, {"x": _rand(rng, 2, 3, 5, 5), "z": _rand(rng, 1, 4, 1, 1)})


# ---- pooling ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [2, 2], "pads": [0, 0, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                     "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "pads": [0, 0, 1, 1], "count_include_pad": 1}),
])
def test_pool(ctx, rng, op, attrs):
    _unary_case(ctx, rng, op, shape=(2, 3, 9, 8), **attrs)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(ctx, rng, op):
    _unary_case(ctx, rng, op, shape=(2, 3, 5, 4))


# ---- matrix products ----------------------------------------------------------------------------

@pytest.mark.parametrize("attrs,cshape", [
    ({"transB": 1}, (5,)), ({}, (1, 5)), ({"alpha": 0.5, "beta": 2.0, "transA": 1}, (3, 5)),
    ({"transB": 1}, None), ({"beta": 0.5}, (3, 1)), ({}, ())])
def test_gemm(ctx, rng, attrs, cshape):
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    a_shape = (4, 3) if ta else (3, 4)
    b_shape = (5, 4) if tb else (4, 5)
    inits = {"b": _rand(rng, *b_shape)}
    names = ["a", "b"]
    if cshape is not None:
        inits["c"] = _rand(rng, *cshape)
        names.append("c")
    data = _model([helper.make_node("Gemm", names, ["y"], **attrs)], [("a", a_shape)],
                  [("y", None)], inits)
    _check(ctx, data, {"a": _rand(rng, *a_shape)})


def test_gemm_relu_fused(ctx, rng):
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transB=1),
             helper.make_node("Relu", ["g"], ["y"])]
    data = _model(nodes, [("a", (3, 4))], [("y", None)],
                  {"b": _rand(rng, 5, 4), "c": _rand(rng, 5)})
    model = _check(ctx, data, {"a": _rand(rng, 3, 4)})
    assert [n.op for n in model.graph.nodes] == ["Gemm"]


@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                                             ((2, 3, 4), (2, 4, 5)), ((4,), (4, 5)),
                                             ((2, 3, 4), (4,)), ((2, 1, 3, 4), (2, 4, 2))])
def test_matmul(ctx, rng, a_shape, b_shape):
    data = _model([helper.make_node("MatMul", ["a", "b"], ["y"])], [("a", a_shape),
                                                                     ("b", b_shape)],
                  [("y", None)])
    _check(ctx, data, {"a": _rand(rng, *a_shape), "b": _rand(rng, *b_shape)})


# ---- pointwise arithmetic ----------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("b_shape,const", [((2, 3, 4), False), ((3, 1), False), ((), True),
                                           ((1, 4), True)])
def test_binary(ctx, rng, op, b_shape, const):
    b = _rand(rng, *b_shape, low=0.5, high=2.0)
    if const:
        data = _model([helper.make_node(op, ["b", "a"], ["y"])], [("a", (2, 3, 4))],
                      [("y", None)], {"b": b})
        _check(ctx, data, {"a": _rand(rng, 2, 3, 4)})
    else:
        data = _model([helper.make_node(op, ["a", "b"], ["y"])],
                      [("a", (2, 3, 4)), ("b", b_shape)], [("y", None)])
        _check(ctx, data, {"a": _rand(rng, 2, 3, 4), "b": b})


# ---- reductions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes,keepdims", [([2, 3], 1), ([1], 0), (None, 1)])
def test_reduce(ctx, rng, op, opset, axes, keepdims):
    axes_as_input = opset >= 18 or op == "ReduceSum"
    inits, names, attrs = {}, ["x"], {"keepdims": keepdims}
    if axes is not None:
        if axes_as_input:
            inits["axes"] = np.array(axes, np.int64)
            names.append("axes")
        else:
            attrs["axes"] = axes
    data = _model([helper.make_node(op, names, ["y"], **attrs)], [("x", (2, 3, 4, 5))],
                  [("y", None)], inits, opset=opset)
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4, 5)})


# ---- shapes and data movement --------------------------------------------------------------------

def test_concat_split_slice(ctx, rng):
    nodes = [helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Split", ["c", "sizes"], ["s0", "s1"], axis=1),
             helper.make_node("Slice", ["s1", "starts", "ends", "axes"], ["y1"]),
             helper.make_node("Split", ["a"], ["p0", "p1"], axis=2)]
    data = _model(nodes, [("a", (2, 3, 4)), ("b", (2, 5, 4))],
                  [("s0", None), ("y1", None), ("p0", None), ("p1", None)],
                  {"sizes": np.array([2, 6], np.int64), "starts": np.array([1, -3], np.int64),
                   "ends": np.array([100, -1], np.int64), "axes": np.array([1, 2], np.int64)})
    _check(ctx, data, {"a": _rand(rng, 2, 3, 4), "b": _rand(rng, 2, 5, 4)})


def test_split_opset_11_attribute_and_slice_opset_9(ctx, rng):
    nodes = [helper.make_node("Split", ["a"], ["p0", "p1"], axis=1, split=[1, 2]),
             helper.make_node("Slice", ["p1"], ["y"], starts=[0, 1], ends=[1, 3], axes=[0, 2])]
    data = _model(nodes, [("a", (2, 3, 4))], [("p0", None), ("y", None)], opset=9)
    _check(ctx, data, {"a": _rand(rng, 2, 3, 4)})


@pytest.mark.parametrize("indices", [np.array(1), np.array([2, 0]), np.array([[0, 1], [3, -1]])])
@pytest.mark.parametrize("axis", [0, 1])
def test_gather(ctx, rng, indices, axis):
    data = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
                  [("x", (4, 4, 3))], [("y", None)], {"i": indices.astype(np.int64)})
    _check(ctx, data, {"x": _rand(rng, 4, 4, 3)})


def test_flatten_reshape_transpose_squeeze_unsqueeze(ctx, rng):
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=2),
             helper.make_node("Reshape", ["f", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
             helper.make_node("Unsqueeze", ["t", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["s"]),
             helper.make_node("Transpose", ["s"], ["y"])]
    data = _model(nodes, [("x", (2, 3, 4, 5))], [("y", None)],
                  {"shape": np.array([0, -1, 4], np.int64), "ax": np.array([1, -1], np.int64)})
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4, 5)})


def test_squeeze_unsqueeze_opset_11_attributes(ctx, rng):
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
             helper.make_node("Squeeze", ["u"], ["y"], axes=[0])]
    data = _model(nodes, [("x", (2, 3, 4))], [("y", None)], opset=11)
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(ctx, rng, mode):
    inits = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}
    names = ["x", "pads"]
    if mode == "constant":
        inits["value"] = np.array(1.5, np.float32)
        names.append("value")
    data = _model([helper.make_node("Pad", names, ["y"], mode=mode)], [("x", (2, 3, 4, 5))],
                  [("y", None)], inits)
    _check(ctx, data, {"x": _rand(rng, 2, 3, 4, 5)})


def test_shape_arithmetic_is_folded_on_the_host(ctx, rng):
    """x.view(x.size(0), 2, -1) written as Shape -> Gather -> Unsqueeze -> Concat -> Reshape,
    Cast and arithmetic on the shape, as the TorchScript exporter writes it: nothing of it runs
    on the device, and a dynamic batch is planned per shape."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["nf"], ["n2"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["n2", "ax0"], ["n1"]),
             helper.make_node("Mul", ["two", "one"], ["two1"]),
             helper.make_node("Concat", ["n1", "two1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "ax0": np.array([0], np.int64),
             "two": np.array([2], np.int64), "one": np.array([1], np.int64),
             "minus1": np.array([-1], np.int64)}
    data = _model(nodes, [("x", ("batch", 4, 3))], [("y", None)], inits)
    for batch in (2, 3):
        model = _check(ctx, data, {"x": _rand(rng, batch, 4, 3)})
        assert model.launch_count == 0
    assert model.inputs[0].shape == ("batch", 4, 3)


def test_cast_on_device(ctx, rng):
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
             helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)]
    data = _model(nodes, [("x", (3, 4))], [("y", None)])
    _check(ctx, data, {"x": _rand(rng, 3, 4, low=-5, high=5)})


def test_constant_folding(ctx, rng):
    """Constant subgraphs (a Constant node, arithmetic on initializers) fold at load."""
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                 np.array([0.5, 2.0, -1.0], np.float32))),
             helper.make_node("Mul", ["k", "w"], ["kw"]),
             helper.make_node("Add", ["x", "kw"], ["y"])]
    data = _model(nodes, [("x", (2, 3))], [("y", None)], {"w": _rand(rng, 3)})
    model = _check(ctx, data, {"x": _rand(rng, 2, 3)})
    assert [n.op for n in model.graph.nodes] == ["Add"]


# ---- Resize ----------------------------------------------------------------------------------------

def _resize_case(ctx, rng, attrs, scales=None, sizes=None, shape=(1, 2, 5, 6)):
    inits = {"roi": np.array([], np.float32)}
    names = ["x", "roi"]
    if scales is not None:
        inits["scales"] = np.array(scales, np.float32)
        names.append("scales")
    else:
        names.append("")
        inits["sizes"] = np.array(sizes, np.int64)
        names.append("sizes")
    data = _model([helper.make_node("Resize", names, ["y"], **attrs)], [("x", shape)],
                  [("y", None)], inits, opset=13)
    return _check(ctx, data, {"x": _rand(rng, *shape)})


@pytest.mark.parametrize("attrs,scales,sizes", [
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
      "nearest_mode": "floor"}, [1, 1, 2, 2], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
      "nearest_mode": "floor"}, None, [1, 2, 10, 3]),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 2, 2], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     [1, 2, 7, 9]),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 7, 4]),
])
def test_resize_exact_cases(ctx, rng, attrs, scales, sizes):
    _resize_case(ctx, rng, attrs, scales, sizes)


_OTHER_RESIZE = [
    ({"mode": "nearest"}, [1, 1, 2, 1.5], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
      "nearest_mode": "round_prefer_ceil"}, None, [1, 2, 7, 9]),
    ({"mode": "nearest", "coordinate_transformation_mode": "align_corners",
      "nearest_mode": "ceil"}, None, [1, 2, 3, 11]),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
      "nearest_mode": "round_prefer_floor"}, [1, 1, 0.6, 1.7], None),
    ({"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, None,
     [1, 2, 8, 4]),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 1.5, 2], None),
    ({"mode": "cubic"}, [1, 1, 2, 2], None),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1,
      "coordinate_transformation_mode": "align_corners"}, None, [1, 2, 4, 9]),
]


@pytest.mark.parametrize("attrs,scales,sizes", _OTHER_RESIZE)
def test_resize_other_modes(ctx, rng, attrs, scales, sizes):
    _resize_case(ctx, rng, attrs, scales, sizes)


def test_resize_refuses_tf_crop_and_resize(ctx, rng):
    with pytest.raises(dp.UnsupportedError, match=r"Resize node .*opset 13.*tf_crop_and_resize"):
        _resize_case(ctx, rng, {"mode": "linear",
                                "coordinate_transformation_mode": "tf_crop_and_resize"},
                     [1, 1, 2, 2])


# ---- the engine ------------------------------------------------------------------------------

def _small_net(rng):
    inits = {"w1": _rand(rng, 6, 3, 3, 3), "b1": _rand(rng, 6), "w2": _rand(rng, 6, 6, 3, 3),
             **_bn_inits(rng, 6), "fc": _rand(rng, 4, 6), "fcb": _rand(rng, 4)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "bn_s", "bn_b", "bn_m", "bn_v"],
                              ["n2"]),
             helper.make_node("Add", ["n2", "r1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r2"]),
             helper.make_node("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Concat", ["p", "p"], ["cc"], axis=1),
             helper.make_node("GlobalAveragePool", ["cc"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Slice", ["f", "s0", "s6", "s1"], ["fs"]),
             helper.make_node("Gemm", ["fs", "fc", "fcb"], ["y"], transB=1)]
    inits.update({"s0": np.array([0], np.int64), "s6": np.array([6], np.int64),
                  "s1": np.array([1], np.int64)})
    return _model(nodes, [("x", ("N", 3, 8, 8))], [("y", ("N", 4))], inits)


def test_replay_builds_nothing_and_matches(ctx, rng):
    data = _small_net(rng)
    model = dp.onnx.load(data, ctx)
    x = _rand(rng, 2, 3, 8, 8)
    first = model.run({"x": x})["y"]
    assert_matches(first, ort_run(data, {"x": x})["y"], 1e-5)
    before = dict(program.stats)
    x2 = _rand(rng, 2, 3, 8, 8)
    xt = dp.Tensor.from_numpy(ctx, x2)
    y1 = model(xt)
    y2 = model(xt)
    ctx.synchronize()
    assert dict(program.stats) == before
    assert y1.buffer.int_ptr != y2.buffer.int_ptr
    ref = ort_run(data, {"x": x2})["y"]
    assert_matches(y1.numpy(), ref, 1e-5)
    assert_matches(y2.numpy(), ref, 1e-5)


def test_dynamic_batch_planned_once_per_shape(ctx, rng):
    data = _small_net(rng)
    model = dp.onnx.load(data, ctx)
    assert model.inputs[0].shape == ("N", 3, 8, 8)
    assert model.inputs[0].dtype == np.float32
    assert model.output_names == ["y"]
    results = {}
    for batch in (1, 3, 1, 3):
        x = _rand(rng, batch, 3, 8, 8)
        out = model.run({"x": x})["y"]
        assert_matches(out, ort_run(data, {"x": x})["y"], 1e-5, what=f"batch {batch}")
        results[batch] = model.memory_bytes
    assert len(model._plans) == 2
    assert results[3] > results[1] > 0


def test_memory_is_shared_by_liveness(ctx, rng):
    """A chain of eight convolutions needs two activation buffers, not eight."""
    inits, nodes, prev = {}, [], "x"
    for k in range(8):
        inits[f"w{k}"] = _rand(rng, 4, 4, 3, 3) * 0.3
        nodes.append(helper.make_node("Conv", [prev, f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        prev = f"r{k}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    data = _model(nodes, [("x", (2, 4, 16, 16))], [("y", None)], inits)
    model = _check(ctx, data, {"x": _rand(rng, 2, 4, 16, 16)})
    activation = 2 * 4 * 16 * 16 * 4
    assert model.memory_bytes <= 4 * activation, model.memory_bytes
    assert model.launch_count == 8


def _dense_block(rng, batch=2):
    """A DenseNet-style block: each layer reads the concatenation of every earlier feature."""
    inits, nodes, feats = {}, [], ["x"]
    for k in range(5):
        cin = 4 + 2 * k
        inits[f"w{k}"] = _rand(rng, 2, cin, 3, 3) * 0.3
        nodes.append(helper.make_node("Concat", list(feats), [f"cat{k}"], axis=1))
        nodes.append(helper.make_node("Relu", [f"cat{k}"], [f"r{k}"]))
        nodes.append(helper.make_node("Conv", [f"r{k}", f"w{k}"], [f"f{k}"], pads=[1, 1, 1, 1]))
        feats.append(f"f{k}")
    nodes.append(helper.make_node("Concat", list(feats), ["y"], axis=1))
    return _model(nodes, [("x", (batch, 4, 12, 12))], [("y", None)], inits)


def test_dense_block_memory(ctx, rng):
    """A dense block's growing concatenations share allocations: far less than their sum;
    memory_parts adds up to memory_bytes."""
    model = _check(ctx, _dense_block(rng), {"x": _rand(rng, 2, 4, 12, 12)})
    parts = model.memory_parts
    assert set(parts) == {"intermediates", "scratch", "workspace", "outputs"}
    assert sum(parts.values()) == model.memory_bytes
    every = sum(2 * 2 * (4 + 2 * k) * 12 * 12 * 4 for k in range(5))
    assert 0 < parts["intermediates"] < every / 2


@pytest.mark.parametrize("batch", [1, 2])
def test_dense_block_concatenations_share_one_buffer(ctx, rng, batch):
    """At batch 1 the block's concatenations are prefixes of one buffer that each feature is
    copied into once (6 copies: the input and five features) instead of one copy per input per
    concatenation (2 + 3 + ... + 6 = 20, the first, single-input one being its input); at
    batch 2 (prefixes are not contiguous) each is made on its own. Right either way."""
    data = _dense_block(rng, batch)
    model = _check(ctx, data, {"x": _rand(rng, batch, 4, 12, 12)})
    assert any("family" in n.fused for n in model.graph.nodes)
    copies = model.launch_count - 10          # five ReLUs and five convolutions
    assert copies == (6 if batch == 1 else 2 + 3 + 4 + 5 + 6), model.launch_count


def test_shared_slots_are_sized_by_the_largest_first():
    """Largest first, best fit: a small buffer goes into a free slot and never grows it; lives
    that overlap never share a slot."""
    from dlprim_py.onnx import engine
    # a (big) 0-1, b 1-2, c (small) 2-3, d 0-3.
    sizes = {"a": 1000, "b": 600, "c": 300, "d": 100}
    first = {"a": 0, "b": 1, "c": 2, "d": 0}
    last = {"a": 1, "b": 2, "c": 3, "d": 3}
    slot_of, slot_size = engine._shared_slots(sizes, first, last)
    assert slot_of["c"] == slot_of["a"] and slot_size == [1000, 600, 100]
    for p in sizes:
        for q in sizes:
            if p < q and slot_of[p] == slot_of[q]:
                assert last[p] < first[q] or last[q] < first[p]
    # Ordered by start instead, c would have opened or grown a slot; here the slots hold
    # exactly the three buffers that live at once at the peak (launch 1: a, b, d).
    assert sum(slot_size) == 1700


def test_call_with_tensors(ctx, rng):
    data = _small_net(rng)
    model = dp.onnx.load(data, ctx)
    x = _rand(rng, 2, 3, 8, 8)
    y = model(dp.Tensor.from_numpy(ctx, x))
    assert isinstance(y, dp.Tensor) and y.shape == (2, 4)
    assert_matches(y.numpy(), ort_run(data, {"x": x})["y"], 1e-5)


def test_load_from_path_and_model_proto(ctx, rng, tmp_path):
    data = _small_net(rng)
    path = tmp_path / "net.onnx"
    path.write_bytes(data)
    x = _rand(rng, 1, 3, 8, 8)
    ref = ort_run(data, {"x": x})["y"]
    for source in (str(path), path, onnx.load_from_string(data)):
        assert_matches(dp.onnx.load(source, ctx).run({"x": x})["y"], ref, 1e-5)


# ---- errors ----------------------------------------------------------------------------------------

def test_unsupported_op_names_op_node_and_opset(ctx):
    data = _model([helper.make_node("Relu", ["x"], ["r"]),
                   helper.make_node("Det", ["r"], ["y"], name="the_det")],
                  [("x", (3, 3))], [("y", None)], opset=15)
    with pytest.raises(dp.UnsupportedError, match=r"Det node 'the_det' \(opset 15\)"):
        dp.onnx.load(data, ctx)


@pytest.mark.parametrize("node,what", [
    (helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap", name="p"), r"Pad node 'p'.*mode"),
    (helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], name="mp"),
     r"MaxPool node 'mp'.*Indices"),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], storage_order=1, name="mp"),
     r"MaxPool node 'mp'.*storage_order"),
    (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="bogus", name="rs"),
     r"Resize node 'rs'.*mode"),
])
def test_unsupported_attribute(ctx, node, what):
    data = _model([node], [("x", (1, 2, 4, 4))], [(o, None) for o in node.output],
                  {"pads": np.zeros(8, np.int64), "scales": np.ones(4, np.float32)}, opset=17)
    with pytest.raises(dp.UnsupportedError, match=what):
        dp.onnx.load(data, ctx)


def test_data_dependent_shape_is_unsupported(ctx, rng):
    nodes = [helper.make_node("Cast", ["s"], ["si"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "si"], ["y"], name="rs")]
    data = _model(nodes, [("x", (2, 6)), ("s", (2,))], [("y", None)])
    model = dp.onnx.load(data, ctx)
    with pytest.raises(dp.UnsupportedError, match=r"Reshape node 'rs' \(opset 17\).*shape"):
        model.run({"x": _rand(rng, 2, 6), "s": np.array([3, 4], np.float32)})


def test_bad_files_name_the_file(ctx, rng, tmp_path):
    data = _small_net(rng)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(dp.ModelFileError, match="truncated.onnx"):
        dp.onnx.load(str(truncated), ctx)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffnot a model at all" * 10)
    with pytest.raises(dp.ModelFileError, match="garbage.onnx"):
        dp.onnx.load(garbage, ctx)
    with pytest.raises(dp.ModelFileError, match="missing.onnx"):
        dp.onnx.load(tmp_path / "missing.onnx", ctx)
    with pytest.raises(dp.ModelFileError, match="bytes"):
        dp.onnx.load(data[:40], ctx)
    with pytest.raises(dp.ModelFileError):
        dp.onnx.load(12, ctx)


def test_wrong_inputs(ctx, rng):
    model = dp.onnx.load(_small_net(rng), ctx)
    with pytest.raises(dp.ShapeError, match="missing"):
        model.run({})
    with pytest.raises(dp.ShapeError, match="unknown"):
        model.run({"x": _rand(rng, 1, 3, 8, 8), "z": 1})
    with pytest.raises(dp.ShapeError, match="'x'"):
        model.run({"x": _rand(rng, 1, 4, 8, 8)})
    with pytest.raises(dp.DTypeError, match="'x'"):
        model.run({"x": np.zeros((1, 3, 8, 8), np.int32)})
    with pytest.raises(dp.DTypeError, match="dp.Tensor.from_numpy"):
        model(_rand(rng, 1, 3, 8, 8))
    with pytest.raises(dp.ShapeError, match="1 input"):
        model()


def test_unused_nodes_are_pruned(ctx, rng):
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sigmoid", ["x"], ["unused"])]
    data = _model(nodes, [("x", (2, 3))], [("y", None)])
    model = _check(ctx, data, {"x": _rand(rng, 2, 3)})
    assert [n.op for n in model.graph.nodes] == ["Relu"]


def test_dlprim_run(ctx, rng, tmp_path, capsys):
    from dlprim_py.onnx.cli import main
    path = tmp_path / "net.onnx"
    path.write_bytes(_small_net(rng))
    x = tmp_path / "x.npy"
    np.save(x, _rand(rng, 2, 3, 8, 8))
    assert main([str(path), "--batch", "3", "--check", "--bench", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "input  x: (3, 3, 8, 8)" in out and "output y: (3, 4)" in out
    assert "time per batch" in out and "check y: max |ours - onnxruntime|" in out
    assert "intermediates" in out and "workspace" in out
    assert main([str(path), "--input", str(x), "--check"]) == 0
    assert "input  x: (2, 3, 8, 8)" in capsys.readouterr().out
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"nonsense")
    assert main([str(bad)]) == 2
    assert "bad.onnx" in capsys.readouterr().err


def test_bench_suite_lists_its_cases(capsys):
    from dlprim_py.bench import main
    assert main(["--suite", "onnx", "--list", "--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "onnx: resnet18 n1 64x64" in out and "onnx: mobilenet_v2 n1 64x64" in out


@pytest.mark.parametrize("batch", [1, 2])
def test_concat_of_convolutions_in_place(ctx, rng, batch):
    """Concat of convolutions only it reads: at batch 1 they write into slices of its output
    (one launch each, no copy); at batch 2 the slices are not contiguous and they are copied."""
    inits = {"w1": _rand(rng, 4, 3, 1, 1), "w2": _rand(rng, 5, 3, 3, 3), "b2": _rand(rng, 5)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["r1", "c2"], ["cat"], axis=1),
             helper.make_node("Sigmoid", ["cat"], ["y"])]
    data = _model(nodes, [("x", ("N", 3, 6, 6))], [("y", None)], inits)
    model = _check(ctx, data, {"x": _rand(rng, batch, 3, 6, 6)})
    assert [n.op for n in model.graph.nodes] == ["Concat", "Sigmoid"]
    if batch == 1:
        assert model.launch_count == 3
    x = _rand(rng, batch, 3, 6, 6)
    assert_matches(model.run({"x": x})["y"], ort_run(data, {"x": x})["y"], 1e-5, "replayed")
