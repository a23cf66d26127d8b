"""Winograd F(4x4, 3x3) ("winograd_f4x4") against PyTorch CPU in float64, forced on its own:
forward with the fused epilogue, backward data, backward filter (F(3x3, 4x4)), ragged output
sizes (tiles that overhang the output), every padding it takes, NHWC, offsets; its transform
matrices checked exactly."""
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import selection, winograd
from dlprim_py.ops.conv.problem import make_problem
from conftest import assert_close, error_metric, poisoned, random

# Measured on PoCL with these shapes: F(4x4) error metric about 1e-7, F(2x2) about 3e-8.
F4_TOL = 1e-6


def conv_ref(x, w, pad):
    return F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(),
                    padding=pad).numpy()


def data_grad_ref(dy, w, x_shape, pad):
    return torch.nn.grad.conv2d_input(x_shape, torch.from_numpy(w).double(),
                                      torch.from_numpy(dy).double(), padding=pad).numpy()


@pytest.mark.parametrize("points,m,r", [((0, 1, -1, 2, -2), 4, 3), (winograd.F4X4_POINTS, 4, 3),
                                        (winograd.F4X4_POINTS, 3, 4)])
def test_cook_toom_matrices_compute_correlation(points, m, r):
    """y = A^T [(G g G^T) * (B^T d B)] A equals the m x m correlation of a 6x6 tile with an
    r x r filter exactly (Fractions)."""
    at, g, bt = winograd.cook_toom(points, m, r)
    rng = np.random.default_rng(1)
    d = [[Fraction(int(v)) for v in row] for row in rng.integers(-9, 9, (6, 6))]
    f = [[Fraction(int(v)) for v in row] for row in rng.integers(-9, 9, (r, r))]

    def mul(a, b):
        return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]
                for i in range(len(a))]

    def t(a):
        return [list(r) for r in zip(*a)]

    u, v = mul(mul(g, f), t(g)), mul(mul(bt, d), t(bt))
    y = mul(mul(at, [[u[i][j] * v[i][j] for j in range(6)] for i in range(6)]), t(at))
    want = [[sum(d[i + a][j + b] * f[a][b] for a in range(r) for b in range(r))
             for j in range(m)] for i in range(m)]
    assert y == want
    with pytest.raises(ValueError, match="distinct"):
        winograd.cook_toom((0, 1, 1, 2, -2), 4)


def test_f4x4_is_registered_and_applies(ctx):
    algo = selection.algorithm("winograd_f4x4")
    assert algo.output_tile == 4 and algo.elements == 36
    p = make_problem((2, 8, 9, 9), (5, 8, 3, 3), dp.ConvolutionDesc(1, 1))
    for direction in ("forward", "backward_data", "backward_filter"):
        assert algo.applies(ctx, p, direction)
    for desc in (dp.ConvolutionDesc(1, 2), dp.ConvolutionDesc(1, 1, 2), dp.ConvolutionDesc(3, 1)):
        assert not algo.applies(ctx, make_problem((2, 8, 9, 9), (5, 8, 3, 3), desc), "forward")
    p5 = make_problem((2, 8, 9, 9), (5, 8, 5, 5), dp.ConvolutionDesc(1, 1))
    assert not algo.applies(ctx, p5, "forward")


# (n, c, h, w, k, pad): output sizes 9 (ragged: 3 tiles, the last overhangs by 3), 4 (one tile)
# and 7x10 with pad 0 and 2; channel counts not multiples of any GEMM tile.
CASES = [(2, 5, 9, 9, 7, 1), (1, 3, 4, 4, 6, 1), (2, 4, 9, 12, 3, 0), (1, 6, 5, 8, 4, 2)]


@pytest.mark.parametrize("case", CASES)
def test_f4x4_forward_and_backward_data(ctx, rng, case):
    n, c, h, wd, k, pad = case
    x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, 3, 3))
    y_ref = conv_ref(x, w, pad)
    dy = random(rng, y_ref.shape)
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(w.shape),
                          dp.ConvolutionDesc(pad, 1))
    assert "winograd_f4x4" in conv.algorithms("forward")
    X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
    y = poisoned(ctx, y_ref.shape)
    conv.forward(X, W, y, algo="winograd_f4x4")
    assert error_metric(y.numpy(), y_ref) < F4_TOL
    assert_close(y.numpy(), y_ref, tol=F4_TOL)
    dx = poisoned(ctx, x.shape)
    conv.backward_data(DY, W, dx, algo="winograd_f4x4")
    assert_close(dx.numpy(), data_grad_ref(dy, w, x.shape, pad), tol=F4_TOL)
    dw = poisoned(ctx, w.shape)
    conv.backward_filter(DY, X, dw, algo="winograd_f4x4")
    dw_ref = torch.nn.grad.conv2d_weight(torch.from_numpy(x).double(), w.shape,
                                         torch.from_numpy(dy).double(), padding=pad).numpy()
    assert_close(dw.numpy(), dw_ref, tol=F4_TOL)


def test_f4x4_epilogue_nhwc_offsets(ctx, rng):
    """y = relu(alpha * conv * scale + shift + z) + beta * y_old in NHWC, every tensor at an
    element offset; backward data with alpha/beta."""
    n, c, h, wd, k = 2, 4, 10, 7, 5
    x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, 3, 3))
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    conv_y = conv_ref(x, w, 1)
    z, y_old = random(rng, conv_y.shape), random(rng, conv_y.shape)
    alpha, beta = 0.75, 0.5
    ref = np.maximum(alpha * conv_y * scale[None, :, None, None] + shift[None, :, None, None]
                     + z, 0) + beta * y_old
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731

    def at_offset(a, pad=3):
        flat = np.concatenate([random(rng, (pad,)), a.ravel()])
        buf = dp.Tensor.from_numpy(ctx, flat)
        return dp.Tensor(ctx, buf.buffer, a.shape, offset=pad * 4)

    conv = dp.Convolution(ctx, dp.TensorDesc((n, h, wd, c)), dp.TensorDesc((k, 3, 3, c)),
                          dp.ConvolutionDesc(1, 1), layout="NHWC")
    X, W = at_offset(nhwc(x)), at_offset(nhwc(w))
    Y = at_offset(nhwc(y_old))
    conv.forward(X, W, Y, alpha=alpha, beta=beta, activation="relu", algo="winograd_f4x4",
                 scale=at_offset(scale), shift=at_offset(shift), residual=at_offset(nhwc(z)))
    assert_close(Y.numpy(), nhwc(ref), tol=F4_TOL)
    dy, dx_old = random(rng, conv_y.shape), random(rng, x.shape)
    DX = at_offset(nhwc(dx_old))
    conv.backward_data(at_offset(nhwc(dy)), W, DX, alpha=-2.0, beta=1.0, algo="winograd_f4x4")
    assert_close(DX.numpy(), nhwc(-2.0 * data_grad_ref(dy, w, x.shape, 1) + dx_old),
                 tol=F4_TOL)


def test_f4x4_workspace_errors(ctx, rng):
    algo = selection.algorithm("winograd_f4x4")
    p = make_problem((1, 3, 6, 6), (2, 3, 3, 3), dp.ConvolutionDesc(1, 1))
    tiles = 1 * 2 * 2
    assert algo.workspace_size(ctx, p, "forward") == 4 * 36 * (2 * 3 + 3 * tiles + 2 * tiles)
    x, w = (dp.Tensor.from_numpy(ctx, random(rng, s)) for s in ((1, 3, 6, 6), (2, 3, 3, 3)))
    small = dp.Tensor.empty(ctx, (8,))
    with pytest.raises(dp.ShapeError, match="winograd_f4x4 forward needs a workspace"):
        algo.run(ctx, p, "forward", x, w, poisoned(ctx, (1, 2, 6, 6)),
                 selection.EpilogueArgs(), workspace=small)
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 3, 6, 6)), dp.TensorDesc((2, 3, 3, 3)),
                          dp.ConvolutionDesc(1, 2))
    with pytest.raises(dp.UnsupportedError):
        conv.forward(x, w, poisoned(ctx, conv.output_desc.shape), algo="winograd_f4x4")


def test_convolutions_share_the_context_workspace(rng):
    """Every convolution of a context works in one workspace, grown to the largest need: a
    small layer, a larger one (the workspace grows), then the small one again (its replay gets
    the new buffer) all stay right, and the larger call leaves one buffer for both. (A context
    of its own: the session's workspace has grown to other tests' needs.)"""
    ctx = dp.Context()
    small = ((1, 3, 6, 6), (2, 3, 3, 3))
    large = ((2, 8, 12, 12), (6, 8, 3, 3))
    convs, data = [], []
    for xs, ws in (small, large):
        convs.append(dp.Convolution(ctx, dp.TensorDesc(xs), dp.TensorDesc(ws),
                                    dp.ConvolutionDesc(1, 1)))
        x, w = random(rng, xs), random(rng, ws)
        data.append((x, w, dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w)))

    def run(i):
        x, w, X, W = data[i]
        y = poisoned(ctx, convs[i].output_desc.shape)
        convs[i].forward(X, W, y, algo="winograd_f4x4")
        assert_close(y.numpy(), conv_ref(x, w, 1), tol=F4_TOL)

    run(0)
    first = ctx.workspace(0)
    run(1)
    grown = ctx.workspace(0)
    assert grown.nbytes >= convs[1].workspace_size("winograd_f4x4") > first.nbytes
    run(0)
    assert ctx.workspace(0) is grown
