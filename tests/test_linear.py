"""linear against torch (float64): leading shapes, odd sizes, one element, with and without
bias, operands at buffer offsets; forward and gradients; bad input."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from conftest import assert_close, random


def _at_offset(ctx, rng, data, offset):
    backing = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, offset), data.ravel()]))
    return dp.Tensor(ctx, backing.buffer, data.shape, offset=offset * 4).requires_grad_(True)


@pytest.mark.parametrize("x_shape,out_features,with_bias", [
    ((7, 13), 5, True), ((2, 3, 17), 33, True), ((1, 1), 1, True), ((9,), 4, False)])
def test_linear(ctx, rng, x_shape, out_features, with_bias):
    in_features = x_shape[-1]
    x_data, w_data = random(rng, x_shape), random(rng, (out_features, in_features))
    b_data = random(rng, (out_features,)) if with_bias else None
    x = _at_offset(ctx, rng, x_data, 3)
    w = _at_offset(ctx, rng, w_data, 5)
    b = _at_offset(ctx, rng, b_data, 1) if with_bias else None
    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x_data, w_data))
    tb = torch.tensor(b_data, dtype=torch.float64, requires_grad=True) if with_bias else None
    y = F.linear(x, w, b)
    ref = torch.nn.functional.linear(tx, tw, tb)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(x.grad.numpy(), tx.grad.numpy())
    assert_close(w.grad.numpy(), tw.grad.numpy())
    if with_bias:
        assert_close(b.grad.numpy(), tb.grad.numpy())


@pytest.mark.parametrize("x_shape, w_shape", [((3, 0), (4, 0)), ((2, 3, 5), (0, 5)),
                                              ((0, 5), (4, 5)), ((0, 0), (2, 0))])
@pytest.mark.parametrize("with_bias", [True, False])
def test_empty_weight(ctx, rng, x_shape, w_shape, with_bias):
    """No input or no output features: the bias broadcast (or zeros), zero gradients for the
    input and the weight, the summed output gradient for the bias; torch's values and shapes."""
    x, w, b = random(rng, x_shape), random(rng, w_shape), random(rng, w_shape[:1])
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (x, w, b)]
    theirs = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x, w, b)]
    y = F.linear(ours[0], ours[1], ours[2] if with_bias else None)
    r = torch.nn.functional.linear(theirs[0], theirs[1], theirs[2] if with_bias else None)
    assert y.shape == tuple(r.shape)
    assert_close(y.numpy(), r.detach().numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    r.backward(torch.tensor(g.astype(np.float64)))
    for mine, ref in zip(ours if with_bias else ours[:2], theirs):
        assert mine.grad.shape == mine.shape
        assert_close(mine.grad.numpy(), ref.grad.numpy())
    if not with_bias:
        assert ours[2].grad is None


def test_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 6)))
    w = dp.Tensor.from_numpy(ctx, random(rng, (3, 6)))
    with pytest.raises(dp.ShapeError, match="in_features = 6"):
        F.linear(dp.Tensor.from_numpy(ctx, random(rng, (4, 5))), w)
    with pytest.raises(dp.ShapeError, match=r"bias must have shape \(3,\)"):
        F.linear(x, w, dp.Tensor.from_numpy(ctx, random(rng, (4,))))
    with pytest.raises(dp.ShapeError, match="out_features, in_features"):
        F.linear(x, dp.Tensor.from_numpy(ctx, random(rng, (1, 3, 6))))
    # Forms torch accepts: documented limitations (once ShapeError).
    with pytest.raises(dp.UnsupportedError, match="1-d weight"):
        F.linear(x, dp.Tensor.from_numpy(ctx, random(rng, (6,))))
    for shape in ((), (1,)):
        with pytest.raises(dp.UnsupportedError, match="broadcast"):
            F.linear(x, w, dp.Tensor.from_numpy(ctx, random(rng, shape)))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.linear(dp.Tensor.from_numpy(ctx, np.ones((4, 6), np.int32)), w)
