"""interpolate against torch (float64): every mode (nearest, nearest-exact, linear, bilinear,
bicubic, trilinear, area, antialiased bilinear and bicubic) on 1 to 3 spatial axes, with and
without align_corners, up- and downsampling, non-integer ratios, sizes of 1, scale factors with and without
recompute_scale_factor; forward and gradients, outputs poisoned. resize against onnxruntime
(one-node Resize models, opsets 13 and 19) for every mode and attribute combination."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import program
from dlprim_py.bench.ops import poison_pool
from dlprim_py.ops.interpolate import resize
from conftest import assert_close, random

TF = torch.nn.functional


def _check_against_torch(ctx, rng, shape, kwargs):
    """F.interpolate's output and input gradient against torch's in float64, with the
    memory pool poisoned (NaN) before each so that an element never written fails."""
    data = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    ref = TF.interpolate(t, **kwargs)
    poison_pool(ctx, max(ref.numel(), 1) * 4)
    y = F.interpolate(x, **kwargs)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    poison_pool(ctx, x.size * 4)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    assert_close(x.grad.numpy(), t.grad.numpy())


CASES = [
    # nearest, 1 to 3 spatial axes; the float32 step of torch's nearest_idx.
    ((2, 3, 5, 7), dict(size=(9, 4), mode="nearest")),
    ((1, 2, 4, 6), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 5, 5), dict(scale_factor=1.7, mode="nearest")),
    ((1, 2, 5, 5), dict(scale_factor=1.7, mode="nearest", recompute_scale_factor=True)),
    ((2, 3, 7), dict(size=3, mode="nearest")),
    ((1, 2, 3, 5, 4), dict(size=(7, 2, 4), mode="nearest")),
    ((1, 2, 3, 5, 4), dict(scale_factor=(1.5, 0.6, 2.6), mode="nearest")),
    # nearest-exact.
    ((2, 3, 5, 7), dict(size=(9, 4), mode="nearest-exact")),
    ((1, 2, 5, 6), dict(scale_factor=(1.7, 0.45), mode="nearest-exact")),
    ((2, 2, 9), dict(size=4, mode="nearest-exact")),
    ((1, 2, 3, 5, 4), dict(size=(1, 8, 3), mode="nearest-exact")),
    # linear and bilinear.
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bilinear", align_corners=False)),
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bilinear", align_corners=True)),
    ((1, 2, 6, 4), dict(scale_factor=(0.5, 2.5), mode="bilinear")),
    ((1, 2, 6, 4), dict(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)),
    ((1, 1, 1, 1), dict(size=(3, 2), mode="bilinear", align_corners=True)),
    ((1, 1, 4, 3), dict(size=(1, 1), mode="bilinear", align_corners=True)),
    ((2, 3, 6), dict(size=11, mode="linear", align_corners=False)),
    ((2, 3, 6), dict(size=4, mode="linear", align_corners=True)),
    ((1, 2, 7), dict(scale_factor=0.6, mode="linear")),
    # bicubic: -0.75, taps clamped at the borders, up and down, sizes of 1.
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bicubic")),
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bicubic", align_corners=True)),
    ((1, 2, 8, 6), dict(size=(3, 13), mode="bicubic", align_corners=False)),
    ((1, 2, 6, 5), dict(scale_factor=(1.7, 0.6), mode="bicubic")),
    ((1, 2, 6, 5), dict(scale_factor=(1.7, 0.6), mode="bicubic", align_corners=True)),
    ((1, 2, 6, 5), dict(scale_factor=2.5, mode="bicubic", recompute_scale_factor=True)),
    ((1, 1, 1, 2), dict(size=(3, 1), mode="bicubic")),
    ((1, 1, 1, 2), dict(size=(3, 1), mode="bicubic", align_corners=True)),
    # trilinear.
    ((1, 2, 3, 5, 4), dict(size=(7, 2, 4), mode="trilinear")),
    ((1, 2, 3, 5, 4), dict(size=(7, 2, 4), mode="trilinear", align_corners=True)),
    ((2, 1, 4, 3, 5), dict(scale_factor=(0.5, 1.7, 2), mode="trilinear")),
    ((1, 1, 1, 2, 3), dict(size=(2, 1, 5), mode="trilinear", align_corners=True)),
    # antialias (bilinear, bicubic): the filter widened where the output shrinks, normalised.
    ((2, 3, 9, 7), dict(size=(4, 3), mode="bilinear", antialias=True)),
    ((2, 3, 9, 7), dict(size=(4, 11), mode="bicubic", antialias=True)),
    ((2, 3, 9, 7), dict(size=(4, 11), mode="bicubic", antialias=True, align_corners=True)),
    ((1, 2, 16, 13), dict(scale_factor=(0.3, 0.45), mode="bilinear", antialias=True)),
    ((1, 2, 5, 4), dict(size=(1, 1), mode="bicubic", antialias=True)),
    # area: adaptive average pooling, divisible or not, up and down, 1 to 3 axes.
    ((2, 3, 8, 6), dict(size=(3, 4), mode="area")),
    ((1, 2, 7, 5), dict(size=(3, 9), mode="area")),
    ((2, 2, 11), dict(size=4, mode="area")),
    ((1, 2, 5, 7, 3), dict(size=(2, 3, 5), mode="area")),
    ((1, 2, 5, 7), dict(scale_factor=0.6, mode="area")),
]


@pytest.mark.parametrize("shape,kwargs", CASES, ids=[f"{k['mode']}-{i}" for i, (_, k)
                                                     in enumerate(CASES)])
def test_interpolate(ctx, rng, shape, kwargs):
    _check_against_torch(ctx, rng, shape, kwargs)


@pytest.mark.parametrize("name,shape,kwargs", [
    ("upsample_nearest", (2, 3, 5, 4), dict(size=(7, 9))),
    ("upsample_nearest", (1, 2, 5), dict(scale_factor=2)),
    ("upsample_bilinear", (2, 3, 5, 4), dict(size=(7, 3))),
    ("upsample_bilinear", (1, 2, 3, 4), dict(scale_factor=2))])
def test_deprecated_upsample_wrappers(ctx, rng, name, shape, kwargs):
    """upsample_nearest / upsample_bilinear (align_corners=True) against torch's, float64."""
    import warnings
    data = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = getattr(TF, name)(t, **kwargs)
    poison_pool(ctx, max(ref.numel(), 1) * 4)
    y = getattr(F, name)(x, **kwargs)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    assert_close(x.grad.numpy(), t.grad.numpy())

@pytest.mark.parametrize("mode,spatial", [("nearest", 1), ("nearest", 2), ("nearest", 3),
                                          ("nearest-exact", 2), ("nearest-exact", 3),
                                          ("bilinear", 2), ("bicubic", 2), ("trilinear", 3),
                                          ("area", 1), ("area", 2), ("area", 3),
                                          ("bilinear-antialias", 2), ("bicubic-antialias", 2)])
def test_random_sizes(ctx, rng, mode, spatial):
    """Seeded random input and output sizes in both directions (by size or by factor), each
    mode, with gradients."""
    mode, antialias = mode.split("-antialias")[0], mode.endswith("-antialias")
    for _ in range(3):
        shape = (1, int(rng.integers(1, 3))) + tuple(int(rng.integers(1, 9 if antialias else 7))
                                                     for _ in range(spatial))
        kwargs = dict(mode=mode, antialias=antialias)
        if mode in ("bilinear", "bicubic", "trilinear"):
            kwargs["align_corners"] = bool(rng.integers(0, 2))
        if rng.integers(0, 2):
            kwargs["size"] = tuple(int(rng.integers(1, 10)) for _ in range(spatial))
        else:
            kwargs["scale_factor"] = tuple(float(rng.choice([0.5, 0.75, 1.3, 1.5, 2.0, 2.6]))
                                           for _ in range(spatial))
            if any(int(s * f) < 1 for s, f in zip(shape[2:], kwargs["scale_factor"])):
                continue
        _check_against_torch(ctx, rng, shape, kwargs)


def test_bad_input(ctx, rng):
    def t(*shape):
        return dp.Tensor.from_numpy(ctx, random(rng, shape))

    x = t(1, 2, 4, 4)
    with pytest.raises(dp.ShapeError, match="exactly one"):
        F.interpolate(x)
    with pytest.raises(dp.ShapeError, match="exactly one"):
        F.interpolate(x, size=2, scale_factor=2)
    for mode in ("nearest", "nearest-exact", "area"):
        with pytest.raises(dp.ShapeError, match="align_corners"):
            F.interpolate(x, size=2, mode=mode, align_corners=False)
    with pytest.raises(dp.ShapeError, match="3-d"):
        F.interpolate(x, size=2, mode="linear")
    with pytest.raises(dp.ShapeError, match="5-d"):
        F.interpolate(x, size=2, mode="trilinear")
    with pytest.raises(dp.ShapeError, match="4-d"):
        F.interpolate(t(1, 2, 5), size=2, mode="bicubic")
    with pytest.raises(dp.ShapeError, match="4-d"):
        F.interpolate(t(1, 2, 5, 5, 5), size=2, mode="bilinear")
    with pytest.raises(dp.ShapeError, match="3-d or 4-d or 5-d"):
        F.interpolate(t(2, 5), size=2)
    with pytest.raises(dp.ShapeError, match="3-d or 4-d or 5-d"):
        F.interpolate(t(1, 1, 2, 2, 2, 2), size=2, mode="area")
    with pytest.raises(dp.UnsupportedError, match="mode"):
        F.interpolate(x, size=2, mode="cubic")
    with pytest.raises(dp.ShapeError, match="antialias"):
        F.interpolate(x, size=2, mode="nearest", antialias=True)
    with pytest.raises(dp.ShapeError, match="antialias"):
        F.interpolate(t(1, 2, 3, 3, 3), size=2, mode="trilinear", antialias=True)
    with pytest.raises(dp.ShapeError, match="recompute_scale_factor"):
        F.interpolate(x, size=2, recompute_scale_factor=True)
    with pytest.raises(dp.ShapeError, match=">= 1"):
        F.interpolate(x, size=(0, 2))
    with pytest.raises(dp.ShapeError, match="2 ints"):
        F.interpolate(x, size=(2, 2, 2))
    with pytest.raises(dp.ShapeError, match="2 ints"):
        F.interpolate(x, size=(2.5, 2))
    with pytest.raises(dp.ShapeError, match="3 positive"):
        F.interpolate(t(1, 1, 2, 2, 2), scale_factor=(2, 2))
    with pytest.raises(dp.ShapeError, match="positive"):
        F.interpolate(x, scale_factor=-1.5)
    with pytest.raises(dp.ShapeError, match="empty output"):
        F.interpolate(x, scale_factor=0.1)
    with pytest.raises(dp.ShapeError, match=">= 1"):
        F.interpolate(dp.Tensor.from_numpy(ctx, np.ones((1, 1, 0, 2), np.float32)), size=3)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.interpolate(dp.Tensor.from_numpy(ctx, np.ones((1, 1, 2, 2), np.int32)), size=3)
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.interpolate(np.ones((1, 1, 2, 2), np.float32), size=3)
    # What torch refuses, it refuses too (the same cases, same class of error).
    for kwargs in (dict(size=2, mode="nearest", align_corners=True),
                   dict(size=2, scale_factor=2), dict(size=2, recompute_scale_factor=True),
                   dict(size=2, mode="linear")):
        with pytest.raises(ValueError if "linear" not in kwargs.values() else
                           NotImplementedError):
            TF.interpolate(torch.zeros(1, 2, 4, 4), **kwargs)


def test_area_to_an_empty_output(ctx, rng):
    """"area" (adaptive pooling) gives an empty output for size 0 as torch does, and a zero
    gradient; the other modes refuse it, as torch does."""
    data = random(rng, (1, 2, 7, 3))
    for size, scale in (((0, 2), None), (None, 0.25)):
        x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
        y = F.interpolate(x, size, scale, mode="area")
        assert y.shape == tuple(TF.interpolate(torch.zeros(1, 2, 7, 3), size, scale,
                                               mode="area").shape)
        y.backward(dp.Tensor.empty(ctx, y.shape))
        np.testing.assert_array_equal(x.grad.numpy(), np.zeros_like(data))
        with pytest.raises(dp.ShapeError):
            F.interpolate(x, size, scale, mode="nearest")


def test_empty_batch(ctx):
    x = dp.Tensor.from_numpy(ctx, np.ones((0, 2, 3, 3), np.float32))
    assert F.interpolate(x, size=(5, 4), mode="bicubic").shape == (0, 2, 5, 4)


def test_offsets_and_views(ctx, rng):
    """An input that starts inside its buffer (a view) reads from its offset."""
    data = random(rng, (3, 2, 5, 4))
    whole = dp.Tensor.from_numpy(ctx, data)
    view = whole[1:]
    assert view.offset_elements > 0
    y = F.interpolate(view, size=(7, 3), mode="bicubic")
    ref = TF.interpolate(torch.tensor(data[1:], dtype=torch.float64), size=(7, 3), mode="bicubic")
    assert_close(y.numpy(), ref.numpy())


def _counts():
    return dict(program.stats)


def test_repeated_calls_build_nothing(ctx, rng):
    """Every mode, forward and backward: after a first call, more calls with the same shapes
    (and with other data) render, build and create nothing; calls on new sizes of a mode seen
    before build nothing either (the sizes are run-time arguments and tables)."""
    grads = {}

    def run(x, **kwargs):
        y = F.interpolate(x, **kwargs)
        if y.shape not in grads:   # made before counting (a fill of a new shape builds)
            grads[y.shape] = dp.Tensor.from_numpy(ctx, random(rng, y.shape))
        y.backward(grads[y.shape])
        x.grad = None   # accumulating into a gradient is another operation

    modes = [((1, 2, 5, 4), dict(mode="nearest")), ((1, 2, 5, 4), dict(mode="nearest-exact")),
             ((1, 2, 5), dict(mode="linear")), ((1, 2, 5, 4), dict(mode="bilinear")),
             ((1, 2, 5, 4), dict(mode="bicubic")), ((1, 2, 3, 5, 4), dict(mode="trilinear")),
             ((1, 2, 5, 4), dict(mode="area")),
             ((1, 2, 5, 4), dict(mode="bicubic", antialias=True))]
    for shape, kwargs in modes:
        spatial = len(shape) - 2
        x = dp.Tensor.from_numpy(ctx, random(rng, shape), requires_grad=True)
        for size in (3, 7, 2):
            grads[(1, shape[1]) + (size,) * spatial] = dp.Tensor.from_numpy(
                ctx, random(rng, (1, shape[1]) + (size,) * spatial))
        run(x, size=(3,) * spatial, **kwargs)
        ctx.synchronize()
        before = _counts()
        for size in (3, 7, 2):
            run(x, size=(size,) * spatial, **kwargs)
        x2 = dp.Tensor.from_numpy(ctx, random(rng, shape), requires_grad=True)
        run(x2, size=(3,) * spatial, **kwargs)
        ctx.synchronize()
        assert _counts() == before, f"{kwargs}: {before} -> {_counts()}"
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 5, 4)), requires_grad=True)
    for mode in ("nearest", "linear", "cubic"):
        resize(x, (7, 3), mode=mode)
        before = _counts()
        for size in ((7, 3), (2, 9)):
            resize(x, size, mode=mode, coordinate_transformation_mode="align_corners")
        assert _counts() == before, f"resize {mode}: {before} -> {_counts()}"


# ---- resize against onnxruntime -----------------------------------------------------------

def _session(opset, shape, nodes, sizes=None, scales=None):
    """An onnxruntime session of one model with a Resize node per attribute dictionary in
    ``nodes`` (all reading X, output Y<i>), on ``sizes`` or on ``scales``."""
    import onnxruntime
    from onnx import TensorProto, helper
    onnxruntime.set_default_logger_severity(3)
    inits = [helper.make_tensor("roi", TensorProto.FLOAT, [0], [])]
    if scales is not None:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1] + list(scales)))
        inputs = ["X", "roi", "scales"]
    else:
        inits += [helper.make_tensor("scales", TensorProto.FLOAT, [0], []),
                  helper.make_tensor("sizes", TensorProto.INT64, [4], list(shape[:2]) + list(sizes))]
        inputs = ["X", "roi", "scales", "sizes"]
    graph = helper.make_graph(
        [helper.make_node("Resize", inputs, [f"Y{i}"], **attrs) for i, attrs in enumerate(nodes)],
        "resize", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(f"Y{i}", TensorProto.FLOAT, None) for i in range(len(nodes))],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])


COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                    "asymmetric", "tf_half_pixel_for_nn")
# Shape, then sizes or scales: up by non-integer ratios, down, mixed, by scales (whose output
# sizes are not scale * input exactly), to one element, unchanged.
RESIZE_SHAPES = [((1, 2, 5, 7), (9, 3), None), ((2, 1, 9, 6), (4, 13), None),
                 ((1, 2, 5, 7), None, (2.5, 0.75)), ((1, 1, 6, 4), (1, 1), None),
                 ((1, 1, 4, 3), (4, 3), None)]


def _attribute_sets(mode):
    if mode == "nearest":
        return [dict(nearest_mode=m) for m in ("round_prefer_floor", "round_prefer_ceil",
                                               "floor", "ceil")]
    if mode == "cubic":
        return [dict(cubic_coeff_a=a, exclude_outside=e) for a in (-0.75, -0.5) for e in (0, 1)]
    return [{}]


@pytest.mark.parametrize("opset", [13, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_matches_onnxruntime(ctx, rng, opset, mode):
    """Every coordinate transformation (half_pixel_symmetric from opset 19), rounding mode,
    cubic coefficient and exclude_outside, on sizes and on scales, against onnxruntime."""
    pytest.importorskip("onnxruntime")
    nodes = [dict(mode=mode, coordinate_transformation_mode=ctm, **attrs)
             for ctm in COORDINATE_MODES if ctm != "half_pixel_symmetric" or opset >= 19
             for attrs in _attribute_sets(mode)]
    first = _attribute_sets(mode)[0]
    for i, (shape, sizes, scales) in enumerate(RESIZE_SHAPES):
        data = random(rng, shape)
        refs = _session(opset, shape, nodes, sizes, scales).run(None, {"X": data})
        x = dp.Tensor.from_numpy(ctx, data)
        for attrs, ref in zip(nodes, refs):
            if i >= 3 and any(attrs.get(k) != v for k, v in first.items()):
                continue   # to one element, unchanged: the first rounding or cubic set will do
            kwargs = dict(attrs, exclude_outside=bool(attrs.get("exclude_outside", 0)))
            poison_pool(ctx, ref.size * 4)
            y = resize(x, ref.shape[2:], scales=scales, **kwargs)
            assert y.shape == ref.shape
            # Nearest picks elements: exact. The others: float32 sums.
            if mode == "nearest":
                np.testing.assert_array_equal(y.numpy(), ref,
                                              err_msg=f"{shape} {sizes} {scales} {attrs}")
            else:
                assert_close(y.numpy(), ref)


def test_resize_gradient_is_the_transpose(ctx, rng):
    """resize's backward is the adjoint of its forward: <resize(x), g> = <x, dx(g)>."""
    data = random(rng, (1, 2, 5, 6))
    for mode, ctm in (("nearest", "asymmetric"), ("linear", "half_pixel"),
                      ("cubic", "pytorch_half_pixel")):
        x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
        y = resize(x, (8, 4), mode=mode, coordinate_transformation_mode=ctm,
                   exclude_outside=mode == "cubic")
        grad = random(rng, y.shape)
        y.backward(dp.Tensor.from_numpy(ctx, grad))
        forward = float(np.sum(y.numpy().astype(np.float64) * grad))
        backward = float(np.sum(data.astype(np.float64) * x.grad.numpy()))
        assert abs(forward - backward) <= 1e-5 * max(1.0, abs(forward))


def test_resize_agrees_with_torch(ctx, rng):
    """pytorch_half_pixel and align_corners are torch's bilinear and bicubic coordinates."""
    data = random(rng, (2, 3, 5, 7))
    x = dp.Tensor.from_numpy(ctx, data)
    t = torch.tensor(data, dtype=torch.float64)
    for onnx_mode, torch_mode in (("linear", "bilinear"), ("cubic", "bicubic")):
        for ctm, align in (("pytorch_half_pixel", False), ("align_corners", True)):
            y = resize(x, (9, 4), mode=onnx_mode, coordinate_transformation_mode=ctm)
            assert_close(y.numpy(), TF.interpolate(t, size=(9, 4), mode=torch_mode,
                                                   align_corners=align).numpy())


def test_resize_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 4, 4)))
    for attribute, value in (("mode", "area"), ("coordinate_transformation_mode",
                                                "tf_crop_and_resize"),
                             ("coordinate_transformation_mode", "bogus"),
                             ("nearest_mode", "round")):
        with pytest.raises(dp.UnsupportedError, match=f"{attribute} '{value}'"):
            resize(x, (3, 3), **{attribute: value})
    with pytest.raises(dp.UnsupportedError, match="N and C"):
        resize(x, (2, 2, 3, 3))
    with pytest.raises(dp.UnsupportedError, match="N and C"):
        resize(x, (3, 3), scales=(1.0, 2.0, 0.75, 0.75))
    assert resize(x, (1, 2, 3, 3), scales=(1.0, 1.0, 0.75, 0.75)).shape == (1, 2, 3, 3)
    with pytest.raises(dp.ShapeError, match="out_size"):
        resize(x, (3, 0))
    with pytest.raises(dp.ShapeError, match="out_size"):
        resize(x, 3)
    with pytest.raises(dp.ShapeError, match="scales"):
        resize(x, (3, 3), scales=(0.75, -1.0))
    with pytest.raises(dp.ShapeError, match="4-d"):
        resize(dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 4))), (3, 3))
    with pytest.raises(dp.DTypeError, match="float32"):
        resize(dp.Tensor.from_numpy(ctx, np.ones((1, 1, 2, 2), np.int32)), (3, 3))
    with pytest.raises(dp.ShapeError, match="cubic_coeff_a"):
        resize(x, (3, 3), mode="cubic", cubic_coeff_a="a")
