"""The explicit-GEMM convolution ("im2col_gemm") against PyTorch CPU in float64, forced on its
own: forward with the fused epilogue and backward data, strides, dilation, padding, the 7x7
stride-2 stem shape class, NHWC, offsets; bad workspaces and problems it does not take."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import selection
from dlprim_py.ops.conv.problem import make_problem
from conftest import assert_close, poisoned, random


def refs(x, w, dy, pad, stride, dil):
    X = torch.from_numpy(x).double()
    W = torch.from_numpy(w).double()
    y = F.conv2d(X, W, padding=pad, stride=stride, dilation=dil).numpy()
    dx = torch.nn.grad.conv2d_input(x.shape, W, torch.from_numpy(dy).double(), padding=pad,
                                    stride=stride, dilation=dil).numpy()
    return y, dx


def out_shape(x, w, pad, stride, dil):
    n, _, h, wd = x.shape
    k, _, r, s = w.shape
    return (n, k, (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1,
            (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1)


# (n, c, h, w, k, r, s, pad, stride, dilation)
CASES = [
    (2, 5, 11, 9, 6, 3, 3, (1, 1), (2, 2), (1, 1)),     # 3x3 stride 2, odd sizes
    (1, 3, 17, 17, 4, 7, 7, (3, 3), (2, 2), (1, 1)),    # RGB 7x7 stride 2 stem
    (2, 4, 8, 10, 3, 3, 2, (0, 1), (1, 3), (2, 1)),     # rectangular, dilated, uneven strides
]


@pytest.mark.parametrize("case", CASES)
def test_im2col_gemm_forward_and_backward_data(ctx, rng, case):
    n, c, h, wd, k, r, s, pad, stride, dil = case
    x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, r, s))
    dy = random(rng, out_shape(x, w, pad, stride, dil))
    y_ref, dx_ref = refs(x, w, dy, pad, stride, dil)
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(w.shape),
                          dp.ConvolutionDesc(pad, stride, dil))
    assert "im2col_gemm" in conv.algorithms("forward")
    assert "im2col_gemm" in conv.algorithms("backward_data")
    assert "im2col_gemm" not in conv.algorithms("backward_filter")
    X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
    y = poisoned(ctx, y_ref.shape)
    conv.forward(X, W, y, algo="im2col_gemm")
    assert_close(y.numpy(), y_ref)
    dx = poisoned(ctx, x.shape)
    conv.backward_data(DY, W, dx, algo="im2col_gemm")
    assert_close(dx.numpy(), dx_ref)


def test_im2col_gemm_epilogue_nhwc_offsets(ctx, rng):
    """y = relu(alpha * conv * scale + shift + z) + beta * y_old in NHWC with every tensor at an
    offset; backward data with alpha and beta; a second call reuses the bound GEMM."""
    n, c, h, wd, k, pad, stride = 2, 3, 9, 8, 5, (1, 1), (2, 2)
    x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, 3, 3))
    dy = random(rng, out_shape(x, w, pad, stride, (1, 1)))
    y_conv, dx_ref = refs(x, w, dy, pad, stride, (1, 1))
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    z, y_old, dx_old = random(rng, y_conv.shape), random(rng, y_conv.shape), random(rng, x.shape)
    alpha, beta = 1.5, -0.5
    y_ref = np.maximum(alpha * y_conv * scale[None, :, None, None] + shift[None, :, None, None]
                       + z, 0) + beta * y_old
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731

    def at_offset(a, pad=7):
        flat = np.concatenate([random(rng, (pad,)), a.ravel()])
        return dp.Tensor(ctx, dp.Tensor.from_numpy(ctx, flat).buffer, a.shape, offset=pad * 4)

    conv = dp.Convolution(ctx, dp.TensorDesc((n, h, wd, c)), dp.TensorDesc((k, 3, 3, c)),
                          dp.ConvolutionDesc(pad, stride), layout="NHWC")
    W = at_offset(nhwc(w))
    for _ in range(2):
        Y = at_offset(nhwc(y_old))
        conv.forward(at_offset(nhwc(x)), W, Y, alpha=alpha, beta=beta, activation="relu",
                     scale=at_offset(scale), shift=at_offset(shift), residual=at_offset(nhwc(z)),
                     algo="im2col_gemm")
        assert_close(Y.numpy(), nhwc(y_ref))
    DX = at_offset(nhwc(dx_old))
    conv.backward_data(at_offset(nhwc(dy)), W, DX, alpha=0.5, beta=1.0, algo="im2col_gemm")
    assert_close(DX.numpy(), nhwc(0.5 * dx_ref + dx_old))


def test_im2col_gemm_refuses(ctx, rng):
    algo = selection.algorithm("im2col_gemm")
    grouped = make_problem((1, 4, 6, 6), (4, 2, 3, 3), dp.ConvolutionDesc(1, 1, 1, 2))
    one = make_problem((1, 4, 6, 6), (4, 4, 1, 1), dp.ConvolutionDesc(0, 1))
    assert not algo.applies(ctx, grouped, "forward")
    assert not algo.applies(ctx, one, "forward")
    p = make_problem((1, 2, 5, 5), (3, 2, 3, 3), dp.ConvolutionDesc(1, 2))
    assert not algo.applies(ctx, p, "backward_filter")
    assert algo.workspace_size(ctx, p, "forward") == 4 * (2 * 9 + 3) * 9
    x, w = (dp.Tensor.from_numpy(ctx, random(rng, s)) for s in ((1, 2, 5, 5), (3, 2, 3, 3)))
    with pytest.raises(dp.ShapeError, match="im2col_gemm forward needs a workspace of 756"):
        algo.run(ctx, p, "forward", x, w, poisoned(ctx, (1, 3, 3, 3)),
                 selection.EpilogueArgs(), workspace=dp.Tensor.empty(ctx, (10,)))
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 4, 6, 6)), dp.TensorDesc((4, 2, 3, 3)),
                          dp.ConvolutionDesc(1, 1, 1, 2))
    with pytest.raises(dp.UnsupportedError):
        conv.forward(dp.Tensor.from_numpy(ctx, random(rng, (1, 4, 6, 6))),
                     dp.Tensor.from_numpy(ctx, random(rng, (4, 2, 3, 3))),
                     poisoned(ctx, (1, 4, 6, 6)), algo="im2col_gemm")
