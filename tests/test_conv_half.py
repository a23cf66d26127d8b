"""float16 / bfloat16 convolution: the "gemm16" and "im2col_gemm16" algorithms
(``ops/conv/gemm16.py``), forward, data gradient and filter gradient, through the GEMM engine's
16-bit kernels: the portable "small" kernel and the tensor-core "mma" kernel emulated fragment
for fragment ("emulate": 1 parameters, any device), and where an NVIDIA GPU of compute
capability 8.0 or later is present the engine's own choice (the real m16n8k16 kernel).

Tolerances (as tests/test_gemm_half.py's). The reference is the float64 convolution of the
16-bit values themselves, so the only errors are the float32 sums and the rounding of a 16-bit
result: with ``scale`` the same convolution of the absolute values (the largest sum of
|products| an output has), every output is within 1e-4 * scale + ulp * |ref|, ulp 2^-11 for
float16 and 2^-8 for bfloat16 (a half-unit in the last place of the result); im2col_gemm16's
forward with beta != 0 rounds twice (the product, then the sum with beta * y), so its bound
adds the half-unit of the product. A missing or doubled term (~ scale / taps) fails it.
"""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py import program
from dlprim_py.ops.conv import ConvolutionDesc, Convolution, selection
from dlprim_py.tensor import TensorDesc

from conftest import random
from test_gemm_half import EMULATED16, HALF_TYPES, SMALL, rounded
from test_gemm_tf32 import has_mma

IDS = ["float16", "bfloat16"]
ULP = {dp.float16: 2.0 ** -11, dp.bfloat16: 2.0 ** -8}
# GEMM parameters per mode: None, the engine's choice (the small kernel on a CPU, the
# tensor-core kernel on an NVIDIA GPU of compute capability 8.0 and later).
MODES = {"small": SMALL, "emulated": EMULATED16, "engine": None}


@pytest.fixture
def mode_params(ctx, monkeypatch):
    """``set(mode)``: both 16-bit algorithms run their GEMMs with that mode's parameters for
    the test."""
    def set_mode(mode):
        for name in ("gemm16", "im2col_gemm16"):
            monkeypatch.setattr(selection.ALGORITHMS[name], "gemm_params", MODES[mode])
    return set_mode


def tensor16(ctx, values, dtype):
    return dp.Tensor.from_numpy(ctx, values, dtype=dtype)


def poisoned(ctx, shape, dtype):
    t = dp.Tensor.empty(ctx, shape, dtype)
    t.fill_(np.nan)
    return t


def f64(t):
    return torch.from_numpy(t.numpy().astype(np.float64))


def check(out, ref, scale, dtype, rounded_before=0):
    """``out`` within the module docstring's bound of ``ref``; ``rounded_before``: a value
    rounded to 16 bits on the way (its half-unit is added to the bound)."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape
    assert np.isfinite(out).all(), "unwritten or non-finite outputs"
    bound = 1e-4 * np.asarray(scale, np.float64) \
        + ULP[dtype] * (np.abs(ref) + np.abs(np.asarray(rounded_before, np.float64)))
    err = np.abs(out - ref)
    worst = np.unravel_index(np.argmax(err - bound), ref.shape)
    assert np.all(err <= bound), f"at {worst}: {out[worst]} vs {ref[worst]} (bound {bound[worst]})"


GEOMETRIES = {
    # name: (n, c, h, w, k, r, s, pad, stride, dilation, groups)
    "3x3_pad": (2, 5, 9, 7, 6, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "odd_stride_dilation": (3, 4, 11, 10, 5, 3, 2, (2, 1), (2, 3), (2, 1), 1),
    "groups": (2, 6, 7, 8, 9, 3, 3, (1, 0), (1, 2), (1, 1), 3),
    "depthwise": (2, 4, 6, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),
    "1x1": (3, 7, 5, 6, 9, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    "1x1_groups": (2, 6, 4, 5, 4, 1, 1, (0, 0), (1, 1), (1, 1), 2),
    "1x1_stride": (2, 5, 7, 7, 3, 1, 1, (0, 0), (2, 2), (1, 1), 1),
    "stem_7x7": (1, 3, 17, 15, 8, 7, 7, (3, 3), (2, 2), (1, 1), 1),
}


def make(ctx, rng, dtype, geometry):
    n, c, h, w, k, r, s, pad, stride, dil, groups = GEOMETRIES[geometry]
    conv = Convolution(ctx, TensorDesc((n, c, h, w), dtype),
                       TensorDesc((k, c // groups, r, s), dtype),
                       ConvolutionDesc(pad, stride, dil, groups), prebuild=False)
    x = tensor16(ctx, random(rng, (n, c, h, w)), dtype)
    wt = tensor16(ctx, random(rng, (k, c // groups, r, s)), dtype)
    args = dict(stride=stride, padding=pad, dilation=dil, groups=groups)
    return conv, x, wt, args


def algorithms_for(geometry):
    return ["gemm16", "im2col_gemm16"] if geometry.startswith("1x1") and "stride" not in geometry \
        else ["im2col_gemm16"]


CASES = [(g, a) for g in GEOMETRIES for a in algorithms_for(g)]


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("mode", ["small", "emulated"])
@pytest.mark.parametrize("geometry,algo", CASES, ids=[f"{g}-{a}" for g, a in CASES])
def test_every_direction(ctx, rng, mode_params, dtype, mode, geometry, algo):
    """Forward (with a bias), data gradient and filter gradient of each algorithm forced, into
    poisoned outputs, against float64."""
    mode_params(mode)
    conv, x, wt, args = make(ctx, rng, dtype, geometry)
    p = conv.problem
    bias = tensor16(ctx, random(rng, (p.k,)), dtype)
    X, W, B = f64(x), f64(wt), f64(bias)
    F = torch.nn.functional
    y = poisoned(ctx, p.y_shape, dtype)
    conv.forward(x, wt, y, bias=bias, algo=algo)
    check(y.numpy(), F.conv2d(X, W, B, **args), F.conv2d(X.abs(), W.abs(), B.abs(), **args),
          dtype)
    y = poisoned(ctx, p.y_shape, dtype)    # without a bias: the groups in one batch
    conv.forward(x, wt, y, algo=algo)
    check(y.numpy(), F.conv2d(X, W, **args), F.conv2d(X.abs(), W.abs(), **args), dtype)

    dy = tensor16(ctx, random(rng, p.y_shape), dtype)
    DY = f64(dy)
    dx = poisoned(ctx, p.x_shape, dtype)
    conv.backward_data(dy, wt, dx, algo=algo)
    ref = torch.nn.grad.conv2d_input(X.shape, W, DY, **args)
    check(dx.numpy(), ref, torch.nn.grad.conv2d_input(X.shape, W.abs(), DY.abs(), **args), dtype)

    dw = poisoned(ctx, p.w_shape, dtype)
    conv.backward_filter(dy, x, dw, algo=algo)
    ref = torch.nn.grad.conv2d_weight(X, W.shape, DY, **args)
    check(dw.numpy(), ref, torch.nn.grad.conv2d_weight(X.abs(), W.shape, DY.abs(), **args), dtype)

    db = poisoned(ctx, (p.k,), dtype)
    conv.backward_bias(dy, db)
    check(db.numpy(), DY.sum((0, 2, 3)), DY.abs().sum((0, 2, 3)), dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("geometry,algo", [("3x3_pad", "im2col_gemm16"), ("1x1", "gemm16"),
                                           ("1x1", "im2col_gemm16")])
def test_alpha_beta_and_activation(ctx, rng, mode_params, dtype, geometry, algo):
    """dst = alpha * result + beta * dst in every direction (beta reads the 16-bit dst), and a
    fused relu (before beta, as the convolution's epilogue)."""
    mode_params("emulated")
    conv, x, wt, args = make(ctx, rng, dtype, geometry)
    p = conv.problem
    X, W = f64(x), f64(wt)
    F = torch.nn.functional
    alpha, beta = 0.75, -0.5
    y0 = random(rng, p.y_shape)
    y = tensor16(ctx, y0, dtype)
    Y0 = torch.from_numpy(rounded(y0, dtype))
    act = "relu" if algo == "im2col_gemm16" else None
    conv.forward(x, wt, y, alpha=alpha, beta=beta, activation=act, algo=algo)
    ref = alpha * F.conv2d(X, W, **args)
    if act:
        ref = torch.relu(ref)
    check(y.numpy(), ref + beta * Y0, alpha * F.conv2d(X.abs(), W.abs(), **args) + abs(beta),
          dtype, rounded_before=ref if algo == "im2col_gemm16" else 0)

    dy = tensor16(ctx, random(rng, p.y_shape), dtype)
    DY = f64(dy)
    x0 = random(rng, p.x_shape)
    dx = tensor16(ctx, x0, dtype)
    conv.backward_data(dy, wt, dx, alpha=alpha, beta=beta, algo=algo)
    ref = alpha * torch.nn.grad.conv2d_input(X.shape, W, DY, **args) \
        + beta * torch.from_numpy(rounded(x0, dtype))
    check(dx.numpy(), ref,
          alpha * torch.nn.grad.conv2d_input(X.shape, W.abs(), DY.abs(), **args) + abs(beta),
          dtype)

    w0 = random(rng, p.w_shape)
    dw = tensor16(ctx, w0, dtype)
    conv.backward_filter(dy, x, dw, alpha=alpha, beta=beta, algo=algo)
    ref = alpha * torch.nn.grad.conv2d_weight(X, W.shape, DY, **args) \
        + beta * torch.from_numpy(rounded(w0, dtype))
    check(dw.numpy(), ref,
          alpha * torch.nn.grad.conv2d_weight(X.abs(), W.shape, DY.abs(), **args) + abs(beta),
          dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("kernel", [1, 3])
def test_functional_autograd(ctx, rng, dtype, kernel):
    """F.conv2d on 16-bit tensors (the algorithm the library chooses, the engine's GEMM): a
    16-bit output, 16-bit gradients to input, weight and bias; a repeated call (forward and
    backward) creates no kernel."""
    n, c, h, w, k = 2, 6, 7, 9, 8
    x0, w0, b0 = random(rng, (n, c, h, w)), random(rng, (k, c, kernel, kernel)), random(rng, (k,))
    pad = kernel // 2

    def step():
        x = tensor16(ctx, x0, dtype).requires_grad_()
        wt = tensor16(ctx, w0, dtype).requires_grad_()
        b = tensor16(ctx, b0, dtype).requires_grad_()
        y = dp.functional.conv2d(x, wt, b, padding=pad)
        g = tensor16(ctx, np.linspace(-1, 1, np.prod(y.shape), dtype=np.float32)
                     .reshape(y.shape), dtype)
        y.backward(g)
        return x, wt, b, y, g

    x, wt, b, y, g = step()
    assert y.dtype is dtype and x.grad.dtype is dtype and wt.grad.dtype is dtype \
        and b.grad.dtype is dtype
    X, W, B, G = (f64(t).requires_grad_() for t in (x, wt, b, g))
    Y = torch.nn.functional.conv2d(X, W, B, padding=pad)
    Y.backward(G.detach())
    F = torch.nn.functional
    check(y.numpy(), Y.detach(), F.conv2d(X.abs(), W.abs(), B.abs(), padding=pad).detach(), dtype)
    check(x.grad.numpy(), X.grad,
          torch.nn.grad.conv2d_input(X.shape, W.abs(), G.abs(), padding=pad).detach(), dtype)
    check(wt.grad.numpy(), W.grad,
          torch.nn.grad.conv2d_weight(X.abs(), W.shape, G.abs(), padding=pad).detach(), dtype)
    check(b.grad.numpy(), B.grad, G.detach().abs().sum((0, 2, 3)), dtype)
    kernels = program.stats["kernels"]
    step()
    assert program.stats["kernels"] == kernels


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
def test_nn_module_and_conv1d(ctx, rng, dtype):
    """nn.Conv2d converted with .half() / .bfloat16() runs on 16-bit input (forward and
    backward; the parameters stay the same objects); conv1d goes through conv2d."""
    m = dp.nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1, ctx=ctx)
    weight = m.weight
    w_ref = rounded(m.weight.numpy(), dtype)
    b_ref = rounded(m.bias.numpy(), dtype)
    (m.half() if dtype is dp.float16 else m.bfloat16())
    assert m.weight is weight and m.weight.dtype is dtype and m.bias.dtype is dtype
    np.testing.assert_array_equal(m.weight.numpy(), w_ref)
    x0 = random(rng, (2, 3, 9, 8))
    x = tensor16(ctx, x0, dtype)
    y = m(x)
    assert y.dtype is dtype
    X, W, B = torch.from_numpy(rounded(x0, dtype)), torch.from_numpy(w_ref), torch.from_numpy(b_ref)
    F = torch.nn.functional
    check(y.numpy(), F.conv2d(X, W, B, stride=2, padding=1),
          F.conv2d(X.abs(), W.abs(), B.abs(), stride=2, padding=1), dtype)
    y.backward(dp.Tensor.full(ctx, y.shape, 1.0, dtype))
    assert m.weight.grad.dtype is dtype
    per_channel = np.prod(y.shape) // 4   # n * Ho * Wo ones per output channel
    check(m.bias.grad.numpy(), np.full(4, per_channel), np.full(4, per_channel), dtype)
    assert m.float().weight.dtype == np.float32

    x1 = random(rng, (2, 4, 13))
    w1 = random(rng, (6, 2, 3))
    y1 = dp.functional.conv1d(tensor16(ctx, x1, dtype), tensor16(ctx, w1, dtype), padding=1,
                              groups=2)
    X1, W1 = torch.from_numpy(rounded(x1, dtype)), torch.from_numpy(rounded(w1, dtype))
    check(y1.numpy(), F.conv1d(X1, W1, padding=1, groups=2),
          F.conv1d(X1.abs(), W1.abs(), padding=1, groups=2), dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("mode", ["small", "emulated"])
def test_batch_in_parts(ctx, rng, mode_params, dtype, mode, monkeypatch):
    """A workspace limit below the whole batch's columns: forward, data gradient and filter
    gradient run on parts of the batch (the filter gradient summed over them in float32, with
    alpha and beta applied once)."""
    mode_params(mode)
    monkeypatch.setenv("DLPRIM_WORKSPACE_LIMIT", "0.01")
    dp.config.reload()
    conv = Convolution(ctx, TensorDesc((5, 8, 12, 12), dtype), TensorDesc((8, 8, 3, 3), dtype),
                       ConvolutionDesc(1), prebuild=False)
    from dlprim_py.ops.conv.algorithms import batch_chunk
    chunk, _ = batch_chunk(ctx, selection.ALGORITHMS["im2col_gemm16"], conv.problem, "forward")
    assert chunk < 5
    x0, w0 = random(rng, (5, 8, 12, 12)), random(rng, (8, 8, 3, 3))
    x, wt = tensor16(ctx, x0, dtype), tensor16(ctx, w0, dtype)
    y = poisoned(ctx, conv.problem.y_shape, dtype)
    conv.forward(x, wt, y, algo="im2col_gemm16")
    X, W = torch.from_numpy(rounded(x0, dtype)), torch.from_numpy(rounded(w0, dtype))
    F = torch.nn.functional
    check(y.numpy(), F.conv2d(X, W, padding=1), F.conv2d(X.abs(), W.abs(), padding=1), dtype)
    dx = poisoned(ctx, conv.problem.x_shape, dtype)
    conv.backward_data(y, wt, dx, algo="im2col_gemm16")
    Y = torch.from_numpy(y.numpy().astype(np.float64))
    check(dx.numpy(), torch.nn.grad.conv2d_input(X.shape, W, Y, padding=1),
          torch.nn.grad.conv2d_input(X.shape, W.abs(), Y.abs(), padding=1), dtype)
    algo = selection.ALGORITHMS["im2col_gemm16"]
    assert algo.filter_chunk(conv.problem) < 5
    w1 = random(rng, (8, 8, 3, 3))
    dw = tensor16(ctx, w1, dtype)
    conv.backward_filter(y, x, dw, alpha=2.0, beta=-1.0, algo="im2col_gemm16")
    check(dw.numpy(), 2 * torch.nn.grad.conv2d_weight(X, W.shape, Y, padding=1)
          - torch.from_numpy(rounded(w1, dtype)),
          2 * torch.nn.grad.conv2d_weight(X.abs(), W.shape, Y.abs(), padding=1) + 1, dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
def test_engine_choice_on_gpu(ctx, rng, dtype, monkeypatch):
    """On an NVIDIA GPU of compute capability 8.0+ the engine's own choice (the real m16n8k16
    kernel) on a ResNet-like layer, every direction."""
    if not has_mma(ctx):
        pytest.skip("the tensor-core kernel needs an NVIDIA GPU of compute capability 8.0+")
    from dlprim_py.ops import gemm as gemm_ops
    ran = []

    class Recorded(gemm_ops.GemmPlan):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            ran.append(self.algorithm)
    monkeypatch.setattr(gemm_ops, "GemmPlan", Recorded)
    conv = Convolution(ctx, TensorDesc((4, 64, 28, 28), dtype), TensorDesc((64, 64, 3, 3), dtype),
                       ConvolutionDesc(1), prebuild=False)
    x = tensor16(ctx, random(rng, (4, 64, 28, 28)), dtype)
    wt = tensor16(ctx, random(rng, (64, 64, 3, 3)), dtype)
    X, W = f64(x), f64(wt)
    F = torch.nn.functional
    y = poisoned(ctx, conv.problem.y_shape, dtype)
    conv.forward(x, wt, y)
    check(y.numpy(), F.conv2d(X, W, padding=1), F.conv2d(X.abs(), W.abs(), padding=1), dtype)
    dy = tensor16(ctx, random(rng, conv.problem.y_shape), dtype)
    DY = f64(dy)
    dx = poisoned(ctx, conv.problem.x_shape, dtype)
    conv.backward_data(dy, wt, dx)
    check(dx.numpy(), torch.nn.grad.conv2d_input(X.shape, W, DY, padding=1),
          torch.nn.grad.conv2d_input(X.shape, W.abs(), DY.abs(), padding=1), dtype)
    dw = poisoned(ctx, conv.problem.w_shape, dtype)
    conv.backward_filter(dy, x, dw)
    check(dw.numpy(), torch.nn.grad.conv2d_weight(X, W.shape, DY, padding=1),
          torch.nn.grad.conv2d_weight(X.abs(), W.shape, DY.abs(), padding=1), dtype)
    # On the tensor cores: one GEMM forward, one for the data gradient, and the filter
    # gradient's 3136 pixels (5 output tiles) split in chunks of 1048: two whole ones as one
    # GEMM batch, the rest on its own.
    assert ran == ["mma"] * 4, ran


# ---- choosing and refusing ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
def test_algorithms_listed_and_chosen(ctx, dtype):
    """16-bit problems list (and choose) the 16-bit algorithms only, float32 ones never list
    them."""
    def conv_of(dt, r):
        return Convolution(ctx, TensorDesc((2, 8, 6, 6), dt), TensorDesc((8, 8, r, r), dt),
                           ConvolutionDesc(r // 2), prebuild=False)
    for direction in ("forward", "backward_data", "backward_filter"):
        assert conv_of(dtype, 1).algorithms(direction) == ["gemm16", "im2col_gemm16"]
        assert conv_of(dtype, 3).algorithms(direction) == ["im2col_gemm16"]
        assert conv_of(dtype, 3)._choose(direction) == "im2col_gemm16"
        for r in (1, 3):
            names = conv_of(dp.float32, r).algorithms(direction)
            assert "gemm16" not in names and "im2col_gemm16" not in names
    assert conv_of(dtype, 1).problem.key("forward").endswith(
        f"-NCHW-{'float16' if dtype is dp.float16 else 'bfloat16'}-forward")


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
def test_bad_input(ctx, rng, dtype):
    other = dp.bfloat16 if dtype is dp.float16 else dp.float16
    x = tensor16(ctx, random(rng, (1, 4, 5, 5)), dtype)
    w = tensor16(ctx, random(rng, (2, 4, 3, 3)), dtype)
    F = dp.functional
    with pytest.raises(dp.DTypeError, match="weight"):
        F.conv2d(x, tensor16(ctx, random(rng, (2, 4, 3, 3)), other))
    with pytest.raises(dp.DTypeError, match="weight"):
        F.conv2d(x, dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 3, 3))))
    with pytest.raises(dp.DTypeError, match="weight"):
        F.conv2d(dp.Tensor.from_numpy(ctx, random(rng, (1, 4, 5, 5))), w)
    with pytest.raises(dp.DTypeError, match="bias"):
        F.conv2d(x, w, dp.Tensor.from_numpy(ctx, random(rng, (2,))))
    with pytest.raises(dp.DTypeError):
        F.conv2d(dp.Tensor.from_numpy(ctx, np.ones((1, 4, 5, 5), np.int32)),
                 dp.Tensor.from_numpy(ctx, np.ones((2, 4, 3, 3), np.int32)))
    with pytest.raises(dp.UnsupportedError, match="NCHW"):
        F.conv2d(tensor16(ctx, random(rng, (1, 5, 5, 4)), dtype),
                 tensor16(ctx, random(rng, (2, 3, 3, 4)), dtype), layout="NHWC")
    with pytest.raises(dp.DTypeError):
        F.conv_transpose2d(x, tensor16(ctx, random(rng, (4, 2, 3, 3)), dtype))
    with pytest.raises(dp.ShapeError):
        F.conv2d(x, tensor16(ctx, random(rng, (2, 3, 3, 3)), dtype))
    conv = Convolution(ctx, TensorDesc((1, 4, 5, 5), dtype), TensorDesc((2, 4, 3, 3), dtype),
                       ConvolutionDesc(1), prebuild=False)
    y = dp.Tensor.empty(ctx, conv.problem.y_shape, dtype)
    for algo in ("winograd", "direct", "implicit_gemm", "im2col_gemm", "gemm16"):
        with pytest.raises(dp.UnsupportedError, match="does not apply"):
            conv.forward(x, w, y, algo=algo)
    with pytest.raises(dp.DTypeError, match="y must be"):
        conv.forward(x, w, dp.Tensor.empty(ctx, conv.problem.y_shape))
    scale = tensor16(ctx, np.ones(2, np.float32), dtype)
    with pytest.raises(dp.UnsupportedError, match="bias and an activation only"):
        conv.forward(x, w, y, scale=scale)
    conv1 = Convolution(ctx, TensorDesc((1, 4, 5, 5), dtype), TensorDesc((2, 4, 1, 1), dtype),
                        ConvolutionDesc(0), prebuild=False)
    with pytest.raises(dp.UnsupportedError, match="beta"):
        conv1.forward(x, tensor16(ctx, random(rng, (2, 4, 1, 1)), dtype),
                      dp.Tensor.empty(ctx, conv1.problem.y_shape, dtype), beta=1.0,
                      activation="relu", algo="gemm16")
    f32 = Convolution(ctx, TensorDesc((1, 4, 5, 5)), TensorDesc((2, 4, 1, 1)),
                      ConvolutionDesc(0), prebuild=False)
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        f32.forward(dp.Tensor.from_numpy(ctx, random(rng, (1, 4, 5, 5))),
                    dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 1, 1))),
                    dp.Tensor.empty(ctx, f32.problem.y_shape), algo="gemm16")


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
def test_find_mode_times_the_16bit_algorithms(ctx, dtype):
    """Find mode's measurement runs both 16-bit algorithms of a 1x1 problem on 16-bit scratch
    tensors, in every direction."""
    conv = Convolution(ctx, TensorDesc((2, 8, 6, 6), dtype), TensorDesc((8, 8, 1, 1), dtype),
                       ConvolutionDesc(0), prebuild=False)
    for direction in ("forward", "backward_data", "backward_filter"):
        winner, times = selection.measure(ctx, conv.problem, direction)
        assert set(times) == {"gemm16", "im2col_gemm16"} and winner in times
        assert all(t > 0 for t in times.values())


def at_offset(ctx, values, dtype, offset):
    """``values`` as a view ``offset`` elements into a larger 16-bit buffer (rows off 16-byte
    boundaries: the tensor-core kernel's element-wise copies)."""
    flat = np.concatenate([random(np.random.default_rng(offset), (offset,)), values.ravel()])
    return tensor16(ctx, flat, dtype)[offset:].reshape(values.shape)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("algo", ["gemm16", "im2col_gemm16"])
def test_tensors_at_odd_offsets(ctx, rng, mode_params, dtype, algo):
    """Every operand a view at an odd element offset of its buffer, in every direction, on the
    emulated tensor-core GEMM."""
    mode_params("emulated")
    n, c, h, w, k = 2, 6, 5, 7, 10
    x0, w0, b0 = random(rng, (n, c, h, w)), random(rng, (k, c, 1, 1)), random(rng, (k,))
    dy0 = random(rng, (n, k, h, w))
    x, wt, b, dy = (at_offset(ctx, v, dtype, off)
                    for v, off in ((x0, 3), (w0, 5), (b0, 1), (dy0, 7)))
    conv = Convolution(ctx, TensorDesc(x.shape, dtype), TensorDesc(wt.shape, dtype),
                       ConvolutionDesc(0), prebuild=False)
    X, W, B, DY = (torch.from_numpy(rounded(v, dtype)) for v in (x0, w0, b0, dy0))
    F = torch.nn.functional
    y = at_offset(ctx, np.full((n, k, h, w), np.nan, np.float32), dtype, 9)
    conv.forward(x, wt, y, bias=b, algo=algo)
    check(y.numpy(), F.conv2d(X, W, B), F.conv2d(X.abs(), W.abs(), B.abs()), dtype)
    dx = at_offset(ctx, np.full((n, c, h, w), np.nan, np.float32), dtype, 11)
    conv.backward_data(dy, wt, dx, algo=algo)
    check(dx.numpy(), torch.nn.grad.conv2d_input(X.shape, W, DY),
          torch.nn.grad.conv2d_input(X.shape, W.abs(), DY.abs()), dtype)
    dw = at_offset(ctx, np.full((k, c, 1, 1), np.nan, np.float32), dtype, 13)
    conv.backward_filter(dy, x, dw, algo=algo)
    check(dw.numpy(), torch.nn.grad.conv2d_weight(X, W.shape, DY),
          torch.nn.grad.conv2d_weight(X.abs(), W.shape, DY.abs()), dtype)
    db = at_offset(ctx, np.full((k,), np.nan, np.float32), dtype, 3)
    conv.backward_bias(dy, db)
    check(db.numpy(), DY.sum((0, 2, 3)), DY.abs().sum((0, 2, 3)), dtype)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("mode", ["small", "emulated"])
@pytest.mark.parametrize("algo", ["im2col_gemm16", "gemm16"])
def test_filter_gradient_split_along_pixels(ctx, rng, mode_params, dtype, mode, algo,
                                            monkeypatch):
    """A filter gradient whose K (the batch's pixels) is split into chunks (as on a GPU for
    few output tiles): whole chunks as one GEMM batch, the rest on its own, the float32 slots
    added and rounded once with alpha and beta, against float64."""
    from dlprim_py.ops.conv.gemm16 import Gemm16
    mode_params(mode)
    monkeypatch.setattr(Gemm16, "_filter_splits", staticmethod(lambda ctx, p: 3))
    r, pad = (3, 1) if algo == "im2col_gemm16" else (1, 0)
    conv = Convolution(ctx, TensorDesc((3, 5, 9, 9), dtype), TensorDesc((6, 5, r, r), dtype),
                       ConvolutionDesc(pad), prebuild=False)
    x0, y0, w1 = random(rng, (3, 5, 9, 9)), random(rng, (3, 6, 9, 9)), random(rng, (6, 5, r, r))
    x, y, dw = tensor16(ctx, x0, dtype), tensor16(ctx, y0, dtype), tensor16(ctx, w1, dtype)
    conv.backward_filter(y, x, dw, alpha=2.0, beta=-1.0, algo=algo)   # 243 pixels: 88 + 88 + 67
    X, Y = (torch.from_numpy(rounded(a, dtype)) for a in (x0, y0))
    check(dw.numpy(), 2 * torch.nn.grad.conv2d_weight(X, (6, 5, r, r), Y, padding=pad)
          - torch.from_numpy(rounded(w1, dtype)),
          2 * torch.nn.grad.conv2d_weight(X.abs(), (6, 5, r, r), Y.abs(), padding=pad) + 1,
          dtype)


def test_filter_split_rule():
    """GPUs split a filter gradient's pixels where its GEMM has fewer 128 x 128 output tiles
    than compute units (about two work-groups per unit, chunks of 1024+, partial sums within 64 MiB);
    CPUs and grouped convolutions do not."""
    import types
    from dlprim_py.ops.conv.gemm16 import Gemm16
    from dlprim_py.ops.conv.problem import make_problem
    gpu = types.SimpleNamespace(info=types.SimpleNamespace(is_gpu=True, compute_units=132))
    cpu = types.SimpleNamespace(info=types.SimpleNamespace(is_gpu=False, compute_units=2))

    def splits(ctx, c, k, h, r, groups=1):
        p = make_problem((64, c, h, h), (k, c // groups, r, r),
                         ConvolutionDesc(padding=r // 2, groups=groups), dtype="float16")
        return Gemm16._filter_splits(ctx, p)
    assert splits(gpu, 64, 64, 56, 1) == 196          # one tile: chunks of 1024 pixels
    assert splits(gpu, 256, 256, 14, 3) == 8          # 36 tiles
    assert splits(gpu, 512, 512, 7, 3) == 1           # 144 tiles fill the device
    assert splits(cpu, 64, 64, 56, 1) == 1
    assert splits(gpu, 64, 64, 56, 3, groups=2) == 1


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=IDS)
@pytest.mark.parametrize("mode", ["small", "emulated"])
def test_filter_gradient_in_parts_split_along_pixels(ctx, rng, mode_params, dtype, mode,
                                                     monkeypatch):
    """A filter gradient in parts of the batch (workspace limit), each part split along its
    pixels into the same float32 slots (the last part shorter: fewer slots, added into the
    first ones), against float64 with alpha and beta."""
    from dlprim_py.ops.conv.gemm16 import Gemm16
    mode_params(mode)
    # Parts of 2, 2 and 1 images (288, 288, 144 pixels): chunks of 96 pixels, three slots
    # for the whole parts, two for the last (96 + 48).
    monkeypatch.setattr(Gemm16, "filter_chunk", lambda self, problem: 2)
    monkeypatch.setattr(Gemm16, "_filter_splits", staticmethod(lambda ctx, p: 3))
    written = []
    split_gemms = Gemm16._split_gemms
    monkeypatch.setattr(Gemm16, "_split_gemms",
                        lambda self, *a, **k: written.append(split_gemms(self, *a, **k)) or
                        written[-1])
    conv = Convolution(ctx, TensorDesc((5, 8, 12, 12), dtype), TensorDesc((8, 8, 3, 3), dtype),
                       ConvolutionDesc(1), prebuild=False)
    x0, y0, w1 = random(rng, (5, 8, 12, 12)), random(rng, (5, 8, 12, 12)), random(rng, (8, 8, 3, 3))
    x, y, dw = tensor16(ctx, x0, dtype), tensor16(ctx, y0, dtype), tensor16(ctx, w1, dtype)
    conv.backward_filter(y, x, dw, alpha=2.0, beta=-1.0, algo="im2col_gemm16")
    assert written == [3, 3, 2]
    X, Y = (torch.from_numpy(rounded(a, dtype)) for a in (x0, y0))
    check(dw.numpy(), 2 * torch.nn.grad.conv2d_weight(X, (8, 8, 3, 3), Y, padding=1)
          - torch.from_numpy(rounded(w1, dtype)),
          2 * torch.nn.grad.conv2d_weight(X.abs(), (8, 8, 3, 3), Y.abs(), padding=1) + 1, dtype)
