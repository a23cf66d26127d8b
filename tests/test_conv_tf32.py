"""TF32 convolutions: the algorithms whose GEMM runs on the tensor-core kernel of ops/gemm.py
("gemm_tf32" for 1x1, "winograd_tf32", "im2col_gemm_tf32"), each forced in every direction it
has, against float64 within TF32's bound; the choice (only where TF32 is allowed on a device
with TF32 mma, float32 unchanged otherwise); the public paths (dp.functional, fusion plans,
the ONNX engine) following the switch.

On an NVIDIA GPU of compute capability 8.0 or later the tensor-core kernels run; elsewhere the
``tf32_on`` fixture turns DLPRIM_TF32_EMULATE on, which runs the same kernels' fragments and
TF32 rounding in portable OpenCL."""
import math

import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py import backends, config
from dlprim_py.ops.conv import Convolution, ConvolutionDesc
from dlprim_py.ops.conv import selection
from dlprim_py.ops.gemm import mma_device_problem
from dlprim_py.tensor import TensorDesc

from conftest import assert_close, poisoned, random
from test_gemm_tf32 import fake_context, tf32_round

F = dp.functional


def real_mma(ctx):
    return mma_device_problem(ctx.info) is None


@pytest.fixture
def tf32_off(ctx, monkeypatch):
    """The switches as a user finds them (TF32 off), restored after the test."""
    monkeypatch.setattr(backends, "allow_tf32", False)
    monkeypatch.setattr(ctx, "allow_tf32", None)
    monkeypatch.delenv("DLPRIM_TF32_EMULATE", raising=False)
    config.reload()


@pytest.fixture
def tf32_on(ctx, tf32_off, monkeypatch):
    """TF32 allowed on the context; emulated mma kernels where the device has none."""
    ctx.allow_tf32 = True
    if not real_mma(ctx):
        monkeypatch.setenv("DLPRIM_TF32_EMULATE", "1")
        config.reload()


def tf32_bound(reduction, a, b):
    """test_gemm_tf32's bound for a sum of ``reduction`` products of operands as large as
    ``a``'s and ``b``'s (3e-3 * sqrt(K) * max|a| * max|b|: TF32's 2^-11 per operand with a
    factor of 3 to spare, far under one missing or wrong term)."""
    return 3e-3 * math.sqrt(reduction) * float(np.abs(a).max()) * float(np.abs(b).max())


def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x)).double()


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


class Case:
    """A convolution problem with NCHW data (x, w, dy) and its float64 results (torch)."""

    def __init__(self, rng, n, c, h, w, k, r, s, pad=0, stride=1):
        self.shape = (n, c, h, w, k, r, s, pad, stride)
        self.x = random(rng, (n, c, h, w))
        self.w = random(rng, (k, c, r, s))
        self.pad, self.stride, self.k, self.c, self.r, self.s = pad, stride, k, c, r, s
        xt, wt = _t(self.x).requires_grad_(), _t(self.w).requires_grad_()
        y = torch.nn.functional.conv2d(xt, wt, padding=pad, stride=stride)
        self.y = y.detach().numpy()
        self.dy = random(rng, self.y.shape)
        y.backward(_t(self.dy))
        self.dx, self.dw = xt.grad.numpy(), wt.grad.numpy()
        self.n, self.ho, self.wo = n, self.y.shape[2], self.y.shape[3]

    def convolution(self, ctx, layout):
        x_shape = self.x.shape if layout == "NCHW" else nhwc(self.x).shape
        w_shape = self.w.shape if layout == "NCHW" else nhwc(self.w).shape
        return Convolution(ctx, TensorDesc(x_shape), TensorDesc(w_shape),
                           ConvolutionDesc(padding=self.pad, stride=self.stride), layout,
                           prebuild=False)

    def bound(self, direction):
        if direction == "forward":
            return tf32_bound(self.c * self.r * self.s, self.x, self.w)
        if direction == "backward_data":
            return tf32_bound(self.k * self.r * self.s, self.dy, self.w)
        return tf32_bound(self.n * self.ho * self.wo, self.dy, self.x)


def run_direction(ctx, case, layout, direction, algo):
    """The direction's result on ``algo`` (NCHW numpy), its output poisoned first, and the
    float64 reference."""
    conv = case.convolution(ctx, layout)
    store = (lambda a: a) if layout == "NCHW" else nhwc
    load = (lambda a: a) if layout == "NCHW" else nchw
    T = lambda a: dp.Tensor.from_numpy(ctx, store(a))  # noqa: E731
    if direction == "forward":
        out = poisoned(ctx, store(case.y).shape)
        conv.forward(T(case.x), T(case.w), out, algo=algo)
        ref = case.y
    elif direction == "backward_data":
        out = poisoned(ctx, store(case.x).shape)
        conv.backward_data(T(case.dy), T(case.w), out, algo=algo)
        ref = case.dx
    else:
        out = poisoned(ctx, store(case.w).shape)
        conv.backward_filter(T(case.dy), T(case.x), out, algo=algo)
        ref = case.dw
    return load(out.numpy()), ref


def check(ctx, case, layout, direction, algo, factor=1.0):
    out, ref = run_direction(ctx, case, layout, direction, algo)
    assert np.isfinite(out).all(), (algo, direction, case.shape, "unwritten outputs")
    err = float(np.abs(out - ref).max())
    assert err <= factor * case.bound(direction), (algo, direction, layout, case.shape, err)
    return out, ref


# ---- 1x1: gemm_tf32 ------------------------------------------------------------------------

# (n, c, h, w, k, stride): ragged sizes (odd pixel counts: 4-byte copies and scalar stores),
# multiples of 4 (16-byte copies, float2 stores), stride 2 (strided fold / gather).
SHAPES_1X1 = [(2, 12, 5, 7, 20, 1), (3, 16, 4, 4, 40, 1), (2, 16, 7, 9, 24, 2),
              (1, 36, 8, 8, 33, 2)]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", SHAPES_1X1, ids=lambda s: "x".join(map(str, s)))
def test_gemm_tf32_every_direction(ctx, rng, tf32_on, layout, shape):
    n, c, h, w, k, stride = shape
    case = Case(rng, n, c, h, w, k, 1, 1, stride=stride)
    conv = case.convolution(ctx, layout)
    for direction in ("forward", "backward_data", "backward_filter"):
        if "gemm_tf32" not in conv.algorithms(direction):
            # NHWC's strided filter gradient is the float32 family's too ("gemm" refuses it).
            assert "gemm" not in conv.algorithms(direction)
            continue
        out, ref = check(ctx, case, layout, direction, "gemm_tf32")
        if direction == "forward":
            # TF32 indeed: float64 of the rounded operands, to float32's sums.
            xs = case.x[:, :, ::stride, ::stride]
            assert_close(out, np.einsum("kc,nchw->nkhw", tf32_round(case.w[:, :, 0, 0]),
                                        tf32_round(xs)))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gemm_tf32_epilogue(ctx, rng, tf32_on, layout):
    """The forward's whole epilogue on the TF32 kernel: alpha, scale and shift per channel, a
    residual, an activation and beta (the output read back), ragged and whole tiles."""
    for n, c, h, w, k in ((2, 24, 5, 7, 20), (2, 32, 8, 8, 64)):
        case = Case(rng, n, c, h, w, k, 1, 1)
        conv = case.convolution(ctx, layout)
        scale, shift = random(rng, (k,)), random(rng, (k,))
        z, y0 = random(rng, case.y.shape), random(rng, case.y.shape)
        store = (lambda a: a) if layout == "NCHW" else nhwc
        T = lambda a: dp.Tensor.from_numpy(ctx, store(a))  # noqa: E731
        y = T(y0)
        conv.forward(T(case.x), T(case.w), y, alpha=0.5, beta=0.25, activation="relu",
                     scale=dp.Tensor.from_numpy(ctx, scale),
                     shift=dp.Tensor.from_numpy(ctx, shift), residual=T(z),
                     residual_alpha=0.75, algo="gemm_tf32")
        out = y.numpy() if layout == "NCHW" else nchw(y.numpy())
        ch = (None, slice(None), None, None)
        ref = np.maximum(0.5 * case.y * scale[ch] + shift[ch] + 0.75 * z, 0) + 0.25 * y0
        assert np.abs(out - ref).max() <= 0.5 * float(np.abs(scale).max()) * case.bound(
            "forward") + 1e-5


def test_gemm_tf32_per_position_affine_and_chain(ctx, rng, tf32_on):
    """Scale and shift per output position (NCHW), and a fusion plan's batch-norm chain."""
    case = Case(rng, 2, 20, 6, 5, 12, 1, 1)
    conv = case.convolution(ctx, "NCHW")
    scale, shift = random(rng, case.y.shape[1:]), random(rng, case.y.shape[1:])
    y = poisoned(ctx, case.y.shape)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    conv.forward(T(case.x), T(case.w), y, scale=T(scale), shift=T(shift), activation="tanh",
                 algo="gemm_tf32")
    ref = np.tanh(case.y * scale + shift)
    assert np.abs(y.numpy() - ref).max() <= case.bound("forward")


# ---- 3x3 and larger: winograd_tf32, im2col_gemm_tf32 -----------------------------------------

@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_winograd_tf32_every_direction(ctx, rng, tf32_on, layout):
    """F(2x2) with TF32 channel GEMMs: odd map sizes (partial tiles), padding 0 and 1. Its
    transforms scale TF32's rounding by about 2 against the column GEMM (the bound keeps its
    factor of 3 over that)."""
    for n, c, h, w, k, pad in ((2, 12, 9, 7, 20, 1), (1, 16, 6, 6, 8, 0)):
        case = Case(rng, n, c, h, w, k, 3, 3, pad=pad)
        for direction in ("forward", "backward_data", "backward_filter"):
            check(ctx, case, layout, direction, "winograd_tf32", factor=2.0)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_im2col_gemm_tf32(ctx, rng, tf32_on, layout):
    """The column GEMM in TF32: 3x3 stride 2 and 5x5 padding 2, forward and data gradient."""
    for n, c, h, w, k, r, pad, stride in ((2, 12, 9, 11, 20, 3, 1, 2),
                                          (1, 6, 8, 7, 16, 5, 2, 1)):
        case = Case(rng, n, c, h, w, k, r, r, pad=pad, stride=stride)
        for direction in ("forward", "backward_data"):
            check(ctx, case, layout, direction, "im2col_gemm_tf32")
        conv = case.convolution(ctx, layout)
        assert "im2col_gemm_tf32" not in conv.algorithms("backward_filter")


# ---- the switch and the choice ------------------------------------------------------------

TF32_NAMES = ("gemm_tf32", "winograd_tf32", "im2col_gemm_tf32")


def test_tf32_algorithms_are_registered_and_flagged():
    for name in TF32_NAMES:
        assert selection.algorithm(name).tf32
        assert name.endswith("_tf32")
    assert not any(a.tf32 for n, a in selection.ALGORITHMS.items() if n not in TF32_NAMES)


def test_tf32_off_changes_nothing(ctx, rng, tf32_off, monkeypatch):
    """With TF32 not allowed no TF32 algorithm applies or is chosen (even with emulation on),
    results are float32's, and forcing one is an error that says why."""
    monkeypatch.setenv("DLPRIM_TF32_EMULATE", "1")
    config.reload()
    case = Case(rng, 2, 16, 6, 6, 24, 1, 1)
    conv = case.convolution(ctx, "NCHW")
    for direction in ("forward", "backward_data", "backward_filter"):
        names = conv.algorithms(direction)
        assert not any(n.endswith("_tf32") for n in names), names
        assert not selection.choose(ctx, conv.problem, direction).endswith("_tf32")
    y = F.conv2d(dp.Tensor.from_numpy(ctx, case.x), dp.Tensor.from_numpy(ctx, case.w))
    assert_close(y.numpy(), case.y)
    with pytest.raises(dp.UnsupportedError, match="'gemm_tf32' does not apply to .*TF32 is "
                                                  "not allowed"):
        run_direction(ctx, case, "NCHW", "forward", "gemm_tf32")
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "gemm_tf32")
    config.reload()
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_CONV_ALGO=gemm_tf32 does not apply"):
        F.conv2d(dp.Tensor.from_numpy(ctx, case.x), dp.Tensor.from_numpy(ctx, case.w))


def test_tf32_allowed_without_tensor_cores_falls_back(ctx, rng, tf32_off):
    """TF32 allowed on a device without TF32 mma (and no emulation): float32 algorithms and
    results, as torch falls back; forcing a TF32 algorithm says why it cannot run."""
    if real_mma(ctx):
        pytest.skip("the device has TF32 tensor cores")
    ctx.allow_tf32 = True
    case = Case(rng, 2, 16, 6, 6, 24, 1, 1)
    conv = case.convolution(ctx, "NCHW")
    assert not any(n.endswith("_tf32") for n in conv.algorithms("forward"))
    y = F.conv2d(dp.Tensor.from_numpy(ctx, case.x), dp.Tensor.from_numpy(ctx, case.w))
    assert_close(y.numpy(), case.y)
    with pytest.raises(dp.UnsupportedError, match="'gemm_tf32' does not apply to .*NVIDIA"):
        run_direction(ctx, case, "NCHW", "forward", "gemm_tf32")


def _problem(c, h, k, r, stride=1, n=64):
    from dlprim_py.ops.conv.problem import make_problem
    return make_problem((n, c, h, h), (k, c, r, r),
                        ConvolutionDesc(padding=r // 2, stride=stride))


def test_choice_on_an_h200_and_elsewhere(monkeypatch):
    """On a (described) H200 with TF32 allowed the TF32 algorithms come first for ResNet-50's
    layers forward and backward data; for filter gradients gemm_tf32 (its long K split in the
    mma kernel) comes first at 28 x 28 and less or strided, last at 56 x 56 (where float32 was
    faster), and winograd_tf32 last; with TF32 off, on a pre-Ampere GPU or on another vendor's,
    none applies."""
    monkeypatch.setattr(backends, "allow_tf32", False)
    monkeypatch.delenv("DLPRIM_TF32_EMULATE", raising=False)
    config.reload()
    expect = {(64, 56, 256, 1, 1): "gemm_tf32", (256, 56, 64, 1, 1): "gemm_tf32",
              (512, 28, 1024, 1, 2): "gemm_tf32", (1024, 14, 256, 1, 1): "gemm_tf32",
              (64, 56, 64, 3, 1): "winograd_tf32",
              (512, 7, 512, 3, 1): "winograd_tf32", (128, 56, 128, 3, 2): "im2col_gemm_tf32"}
    for fields, tf32 in (({}, True), ({}, False), ({"architecture": "nvidia:sm_75"}, True),
                         ({"vendor": "amd", "architecture": "amd:gfx90a"}, True)):
        device = fake_context(max_alloc_size=1 << 36, **fields)
        device.allow_tf32 = tf32
        on = tf32 and not fields
        for (c, h, k, r, stride), name in expect.items():
            p = _problem(c, h, k, r, stride)
            for direction in ("forward", "backward_data", "backward_filter"):
                names = selection.applicable(device, p, direction)
                chosen = selection.choose(device, p, direction)
                has = any(n.endswith("_tf32") for n in names)
                if not on:
                    assert not has and not chosen.endswith("_tf32"), (fields, tf32, names)
                    continue
                split_first = name == "gemm_tf32" and (h <= 28 or stride > 1)
                if name in names and direction == "backward_filter" and not split_first:
                    assert names[-1] == name and not chosen.endswith("_tf32"), (p, names)
                elif name in names:
                    assert chosen == name and names[0] == name, (p, direction, names)
                else:
                    assert direction == "backward_filter" and name == "im2col_gemm_tf32"
    # The task says whether TF32 applies; its key keeps the find-db records apart.
    p = _problem(64, 56, 64, 3)
    device = fake_context(max_alloc_size=1 << 36)
    device.allow_tf32 = True
    task = selection.task(device, p, "forward")
    assert task.tf32 and task.key() == p.key("forward") + "-tf32"
    assert task.features()["tf32"] == 1
    device.allow_tf32 = False
    assert selection.task(device, p, "forward").key() == p.key("forward")


def test_forcing_through_the_environment(ctx, rng, tf32_on, monkeypatch):
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "gemm_tf32")
    config.reload()
    case = Case(rng, 2, 16, 5, 5, 12, 1, 1)
    y = F.conv2d(dp.Tensor.from_numpy(ctx, case.x), dp.Tensor.from_numpy(ctx, case.w))
    assert_close(y.numpy(), np.einsum("kc,nchw->nkhw", tf32_round(case.w[:, :, 0, 0]),
                                      tf32_round(case.x)))


def _is_tf32(out, x, w, ref64):
    """Whether a 1x1 result is TF32's (float64 of the rounded operands to float32's error)
    rather than float32's (the float64 product to float32's error)."""
    tf32 = np.einsum("kc,nchw->nkhw", tf32_round(w), tf32_round(x))
    err_tf32 = np.abs(out - tf32).max()
    err_f32 = np.abs(out - ref64).max()
    assert min(err_tf32, err_f32) < 1e-4, (err_tf32, err_f32)
    return err_tf32 < err_f32


def test_functional_follows_the_switch(ctx, rng, tf32_on):
    """F.conv2d and its gradients in TF32 when allowed, float32 when the context's switch is
    turned off again, without stale plans either way; repeated calls build nothing."""
    case = Case(rng, 2, 48, 6, 6, 32, 1, 1)
    x = dp.Tensor.from_numpy(ctx, case.x).requires_grad_()
    w = dp.Tensor.from_numpy(ctx, case.w).requires_grad_()
    w2 = case.w[:, :, 0, 0]
    for allowed in (True, False, True):
        ctx.allow_tf32 = allowed
        y = F.conv2d(x, w)
        assert _is_tf32(y.numpy(), case.x, w2, case.y) == allowed
        y.backward(dp.Tensor.from_numpy(ctx, case.dy))
        assert np.abs(w.grad.numpy() - case.dw).max() <= case.bound("backward_filter")
        assert np.abs(x.grad.numpy() - case.dx).max() <= case.bound("backward_data")
        x.grad = w.grad = None


def test_fusion_plan_and_onnx_engine_use_tf32(ctx, rng, tf32_on):
    """conv_bias_activation (the ONNX engine's convolution) and an ONNX model run their 1x1
    convolutions in TF32 when it is allowed, in float32 when not."""
    from dlprim_py.fusion import conv_bias_activation
    case = Case(rng, 2, 48, 6, 6, 32, 1, 1)
    bias = random(rng, (32,))
    w2 = case.w[:, :, 0, 0]
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for allowed in (True, False):
        ctx.allow_tf32 = allowed
        y = conv_bias_activation(T(case.x), T(case.w), T(bias), activation=None)
        assert _is_tf32(y.numpy() - bias[None, :, None, None], case.x, w2, case.y) == allowed
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1])], "conv1x1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(case.x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(case.w, "w")])
    model = dp.onnx.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                         ctx)
    for allowed in (True, False, True):
        ctx.allow_tf32 = allowed
        out = model.run({"x": case.x})["y"]
        assert _is_tf32(out, case.x, w2, case.y) == allowed
