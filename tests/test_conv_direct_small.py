"""The direct forward for RGB stems ("direct_small") against PyTorch CPU in float64, forced on its
own with one and two output pixels per work item: odd widths (the last pixel pair half
outside), strides, dilation, output channels not a multiple of 4, the fused epilogue in NHWC at
offsets, and the problems it refuses."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import algorithms, selection
from dlprim_py.ops.conv.problem import make_problem
from conftest import assert_close, poisoned, random

# (n, c, h, w, k, r, pad, stride, dilation)
CASES = [(2, 3, 11, 13, 10, 3, 1, 2, 1), (1, 3, 15, 9, 6, 7, 3, 2, 1), (2, 1, 8, 7, 4, 3, 2, 1, 2)]


@pytest.mark.parametrize("pixels,cases", [(1, CASES), (2, CASES[:1])])
def test_direct_small_forward(ctx, rng, pixels, cases):
    algo = algorithms.DirectSmall(pixels)
    for n, c, h, wd, k, r, pad, stride, dil in cases:
        x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, r, r))
        ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=pad,
                       stride=stride, dilation=dil).numpy()
        problem = make_problem(x.shape, w.shape, dp.ConvolutionDesc(pad, stride, dil))
        assert algo.applies(ctx, problem, "forward")
        y = poisoned(ctx, ref.shape)
        algo.run(ctx, problem, "forward", dp.Tensor.from_numpy(ctx, x),
                 dp.Tensor.from_numpy(ctx, w), y, algorithms.EpilogueArgs())
        assert_close(y.numpy(), ref)


def test_direct_small_epilogue_nhwc_offsets(ctx, rng):
    n, c, h, wd, k = 2, 3, 9, 10, 6
    x, w = random(rng, (n, c, h, wd)), random(rng, (k, c, 3, 3))
    conv_y = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1,
                      stride=2).numpy()
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    z, y_old = random(rng, conv_y.shape), random(rng, conv_y.shape)
    ref = np.maximum(0.5 * conv_y * scale[None, :, None, None] + shift[None, :, None, None] + z,
                     0) + 2.0 * y_old
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731

    def at_offset(a, pad=5):
        flat = np.concatenate([random(rng, (pad,)), a.ravel()])
        return dp.Tensor(ctx, dp.Tensor.from_numpy(ctx, flat).buffer, a.shape, offset=pad * 4)

    conv = dp.Convolution(ctx, dp.TensorDesc((n, h, wd, c)), dp.TensorDesc((k, 3, 3, c)),
                          dp.ConvolutionDesc(1, 2), layout="NHWC")
    assert "direct_small" in conv.algorithms("forward")
    Y = at_offset(nhwc(y_old))
    conv.forward(at_offset(nhwc(x)), at_offset(nhwc(w)), Y, alpha=0.5, beta=2.0,
                 activation="relu", scale=at_offset(scale), shift=at_offset(shift),
                 residual=at_offset(nhwc(z)), algo="direct_small")
    assert_close(Y.numpy(), nhwc(ref))


def test_direct_small_refuses(ctx):
    algo = selection.algorithm("direct_small")
    many_channels = make_problem((1, 8, 9, 9), (4, 8, 3, 3), dp.ConvolutionDesc(1, 1))
    many_outputs = make_problem((1, 3, 9, 9), (65, 3, 3, 3), dp.ConvolutionDesc(1, 1))
    grouped = make_problem((1, 4, 9, 9), (4, 2, 3, 3), dp.ConvolutionDesc(1, 1, 1, 2))
    stem = make_problem((1, 3, 9, 9), (64, 3, 7, 7), dp.ConvolutionDesc(3, 2))
    for p in (many_channels, many_outputs, grouped):
        assert not algo.applies(ctx, p, "forward")
    assert algo.applies(ctx, stem, "forward") == (ctx.info.local_mem_size >= 147 * 64 * 4 + 1024)
    assert not algo.applies(ctx, stem, "backward_data")
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 8, 9, 9)), dp.TensorDesc((4, 8, 3, 3)),
                          dp.ConvolutionDesc(1, 1))
    with pytest.raises(dp.UnsupportedError):
        conv.forward(dp.Tensor.zeros(ctx, (1, 8, 9, 9)), dp.Tensor.zeros(ctx, (4, 8, 3, 3)),
                     poisoned(ctx, (1, 4, 9, 9)), algo="direct_small")
