"""conv2d / conv_transpose2d with layout="NHWC" through the functional API and its autograd tape,
against torch float64 on permuted tensors; bad layouts and shapes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp

from conftest import assert_close, random

TO_NHWC = (0, 2, 3, 1)     # (N, C, H, W) -> (N, H, W, C); the weight (K, C/g, R, S) likewise
TO_NCHW = (0, 3, 1, 2)


def leaf(ctx, a):
    return dp.Tensor.from_numpy(ctx, np.ascontiguousarray(a), requires_grad=True)


def torch_leaf(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("c, k, groups, kwargs", [
    (6, 4, 2, dict(stride=(1, 2), padding=1, dilation=(2, 1))),   # grouped, mixed geometry
    (5, 5, 5, dict(stride=2, padding=1)),                         # depthwise stride 2
    (3, 4, 1, dict(padding="same")),                              # 'same' reads R, S of NHWC
])
def test_conv2d_nhwc_forward_and_gradients(ctx, rng, c, k, groups, kwargs):
    x = random(rng, (2, c, 7, 8))
    w = random(rng, (k, c // groups, 3, 3))
    b = random(rng, (k,))
    X, W, B = leaf(ctx, x.transpose(TO_NHWC)), leaf(ctx, w.transpose(TO_NHWC)), leaf(ctx, b)
    y = dp.functional.conv2d(X, W, B, groups=groups, layout="NHWC", **kwargs)
    xt, wt, bt = torch_leaf(x), torch_leaf(w), torch_leaf(b)
    yt = F.conv2d(xt, wt, bt, groups=groups, **kwargs)
    assert y.shape == tuple(yt.permute(*TO_NHWC).shape)
    assert_close(y.numpy(), yt.detach().permute(*TO_NHWC).numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yt.backward(torch.tensor(g.transpose(TO_NCHW), dtype=torch.float64))
    assert_close(X.grad.numpy(), xt.grad.permute(*TO_NHWC).numpy())
    assert_close(W.grad.numpy(), wt.grad.permute(*TO_NHWC).numpy())
    assert_close(B.grad.numpy(), bt.grad.numpy())


def test_conv_transpose2d_nhwc_forward_and_gradients(ctx, rng):
    cin, cout, groups = 4, 6, 2
    x = random(rng, (2, cin, 5, 6))
    w = random(rng, (cin, cout // groups, 3, 3))     # torch: (Cin, Cout/g, R, S)
    b = random(rng, (cout,))
    kwargs = dict(stride=2, padding=1, output_padding=1, groups=groups)
    X, W, B = leaf(ctx, x.transpose(TO_NHWC)), leaf(ctx, w.transpose(TO_NHWC)), leaf(ctx, b)
    y = dp.functional.conv_transpose2d(X, W, B, layout="NHWC", **kwargs)
    xt, wt, bt = torch_leaf(x), torch_leaf(w), torch_leaf(b)
    yt = F.conv_transpose2d(xt, wt, bt, **kwargs)
    assert_close(y.numpy(), yt.detach().permute(*TO_NHWC).numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yt.backward(torch.tensor(g.transpose(TO_NCHW), dtype=torch.float64))
    assert_close(X.grad.numpy(), xt.grad.permute(*TO_NHWC).numpy())
    assert_close(W.grad.numpy(), wt.grad.permute(*TO_NHWC).numpy())
    assert_close(B.grad.numpy(), bt.grad.numpy())


def test_nhwc_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 5, 5, 4)))
    w = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 3, 4)))
    with pytest.raises(dp.UnsupportedError, match="layout must be 'NCHW' or 'NHWC', got 'CHWN'"):
        dp.functional.conv2d(x, w, layout="CHWN")
    with pytest.raises(dp.UnsupportedError, match="layout"):
        dp.functional.conv_transpose2d(x, w, layout="nhwc")
    # An NCHW-shaped weight (K, C, R, S) under NHWC: 3 channels per group expected, 4 come.
    w_nchw = dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 3, 3)))
    with pytest.raises(dp.ShapeError, match="channels"):
        dp.functional.conv2d(x, w_nchw, layout="NHWC")
    with pytest.raises(dp.ShapeError, match=r"rank 4 or 3 \(N, H, W, C\) or \(H, W, C\)"):
        dp.functional.conv2d(x.reshape(25, 4), w, layout="NHWC")
    # Unbatched (H, W, C) is a batch of one.
    unbatched = dp.functional.conv2d(x.reshape(5, 5, 4), w, layout="NHWC")
    np.testing.assert_array_equal(unbatched.numpy(),
                                  dp.functional.conv2d(x, w, layout="NHWC").numpy()[0])
    with pytest.raises(dp.ShapeError, match=r"rank 4 \(Cin, R, S, Cout/groups\)"):
        dp.functional.conv_transpose2d(x, w.reshape(2, 9, 4), layout="NHWC")
