"""1-D and 3-D pooling (max, avg, adaptive) against torch (float64): forward, indices and
gradients, batched and unbatched; the operator on poisoned outputs; bad input."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py.ops.pool import Pool
from conftest import assert_close, poisoned, random

TF = torch.nn.functional


def _run(ctx, rng, shape, ours, theirs):
    data = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    y, ref = ours(x), theirs(t)
    if isinstance(ref, tuple):
        (y, idx), (ref, ref_idx) = y, ref
        np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("name,shape,kwargs", [
    ("max_pool1d", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1)),
    ("max_pool1d", (3, 10), dict(kernel_size=3, dilation=2, ceil_mode=True, return_indices=True)),
    ("avg_pool1d", (2, 3, 11), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    ("avg_pool1d", (3, 9), dict(kernel_size=3, padding=1, count_include_pad=False)),
    ("max_pool3d", (2, 2, 5, 6, 7), dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 0),
                                         dilation=(2, 1, 1), return_indices=True)),
    ("max_pool3d", (2, 5, 5, 6), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("avg_pool3d", (2, 2, 5, 6, 7), dict(kernel_size=3, stride=2, padding=1)),
    ("avg_pool3d", (1, 2, 5, 6, 7), dict(kernel_size=(2, 3, 2), stride=2, padding=(1, 1, 0),
                                         ceil_mode=True, count_include_pad=False)),
    ("avg_pool3d", (2, 4, 4, 4), dict(kernel_size=2, divisor_override=3)),
    ("avg_pool3d", (1, 2, 4, 5, 4), dict(kernel_size=(2, 2, 3), stride=(2, 2, 1),
                                         divisor_override=-2)),    # torch takes any non-zero
])
def test_pool(ctx, rng, name, shape, kwargs):
    _run(ctx, rng, shape, lambda x: getattr(F, name)(x, **kwargs),
         lambda t: getattr(TF, name)(t, **kwargs))


@pytest.mark.parametrize("name,shape,size", [
    ("adaptive_avg_pool1d", (2, 3, 10), 4), ("adaptive_avg_pool1d", (3, 5), 7),
    ("adaptive_max_pool1d", (2, 3, 10), 3),
    ("adaptive_avg_pool3d", (2, 2, 5, 7, 6), (2, 3, None)),
    ("adaptive_avg_pool3d", (2, 5, 4, 3), 1),
    ("adaptive_max_pool3d", (2, 2, 5, 7, 6), (3, 2, 4)),
])
def test_adaptive(ctx, rng, name, shape, size):
    _run(ctx, rng, shape, lambda x: getattr(F, name)(x, size),
         lambda t: getattr(TF, name)(t, size))
    if "max" in name:
        _run(ctx, rng, shape, lambda x: getattr(F, name)(x, size, return_indices=True),
             lambda t: getattr(TF, name)(t, size, return_indices=True))


@pytest.mark.parametrize("algo", ["window", "plane"])
def test_global_pooling_3d_forced_algorithm(ctx, rng, monkeypatch, algo):
    monkeypatch.setenv("DLPRIM_POOL_ALGO", algo)
    dp.config.reload()
    shape = (3, 2, 3, 4, 5)
    _run(ctx, rng, shape, lambda x: F.adaptive_max_pool3d(x, 1, return_indices=True),
         lambda t: TF.adaptive_max_pool3d(t, 1, return_indices=True))
    _run(ctx, rng, shape, lambda x: F.avg_pool3d(x, (3, 4, 5)),
         lambda t: TF.avg_pool3d(t, (3, 4, 5)))
    _run(ctx, rng, (4, 9), lambda x: F.adaptive_avg_pool1d(x, 1),
         lambda t: TF.adaptive_avg_pool1d(t, 1))


@pytest.mark.parametrize("method", ["max", "avg"])
def test_operator_on_poisoned_outputs(ctx, rng, method):
    op = Pool(ctx, method, kernel_size=(2, 3, 3), stride=2, padding=1, dims=3)
    data = random(rng, (2, 3, 4, 6, 5))
    x = dp.Tensor.from_numpy(ctx, data)
    y = poisoned(ctx, op.output_shape(x.shape))
    indices = dp.Tensor.empty(ctx, y.shape, np.int64) if method == "max" else None
    op.forward(x, y, indices)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    ref = (TF.max_pool3d if method == "max" else TF.avg_pool3d)(t, (2, 3, 3), 2, 1)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, y.shape)
    dx = poisoned(ctx, x.shape)
    op.backward(dp.Tensor.from_numpy(ctx, grad), dx, indices)
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(dx.numpy(), t.grad.numpy())


def test_bad_input(ctx, rng):
    x3 = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 5)))
    x5 = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 4, 4, 4)))
    with pytest.raises(dp.ShapeError, match=r"\(N, C, L\)"):
        F.max_pool1d(x5, 2)
    with pytest.raises(dp.ShapeError, match=r"\(N, C, D, H, W\)"):
        F.avg_pool3d(x3, 2)
    with pytest.raises(dp.ShapeError, match="3 ints"):
        F.max_pool3d(x5, (2, 2))
    with pytest.raises(dp.ShapeError, match="at most half"):
        F.max_pool1d(x3, 2, padding=2)
    with pytest.raises(dp.ShapeError, match="empty output"):
        F.avg_pool3d(x5, 5)
    with pytest.raises(dp.ShapeError, match="output_size"):
        F.adaptive_avg_pool3d(x5, (1, 2))
    with pytest.raises(dp.ShapeError, match="non-zero"):
        F.avg_pool3d(x5, 2, divisor_override=0)
    with pytest.raises(dp.UnsupportedError, match="1, 2 or 3"):
        Pool(ctx, "max", kernel_size=2, dims=4)


@pytest.mark.parametrize("dims, shape, kwargs, output_size", [
    (1, (2, 3, 9), dict(kernel_size=2), None),
    (1, (3, 10), dict(kernel_size=3, stride=2, padding=1), (10,)),
    (2, (2, 3, 6, 7), dict(kernel_size=2), (2, 3, 6, 7)),
    (2, (3, 5, 6), dict(kernel_size=3, stride=2, padding=1), (5, 6)),
    (3, (1, 2, 4, 6, 4), dict(kernel_size=2), None),
    (3, (2, 5, 4, 3), dict(kernel_size=(2, 1, 3), stride=(2, 1, 2)), (5, 4, 4))])
def test_max_unpool_against_torch(ctx, rng, dims, shape, kwargs, output_size):
    """max_unpool of max_pool's values and indices, forward and gradient, float64 torch."""
    a = random(rng, shape)
    pool, unpool = f"max_pool{dims}d", f"max_unpool{dims}d"
    values, idx = getattr(TF, pool)(torch.tensor(a, dtype=torch.float64), return_indices=True,
                                    **kwargs)
    ours_values, ours_idx = getattr(F, pool)(dp.Tensor.from_numpy(ctx, a), return_indices=True,
                                             **kwargs)
    np.testing.assert_array_equal(ours_idx.numpy(), idx.numpy())
    v = values.numpy().astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, v, requires_grad=True)
    xr = torch.tensor(v, dtype=torch.float64, requires_grad=True)
    y = getattr(F, unpool)(x, ours_idx, output_size=output_size, **kwargs)
    yr = getattr(TF, unpool)(xr, idx, output_size=output_size, **kwargs)
    assert y.shape == tuple(yr.shape)
    assert_close(y.numpy(), yr.detach().numpy())
    g = random(rng, yr.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yr.backward(torch.tensor(g, dtype=torch.float64))
    assert_close(x.grad.numpy(), xr.grad.numpy())


def test_max_unpool_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 3, 3)))
    idx = dp.Tensor.from_numpy(ctx, np.zeros((1, 2, 3, 3), np.int64))
    with pytest.raises(dp.DTypeError, match="int64"):
        F.max_unpool2d(x, dp.Tensor.from_numpy(ctx, np.zeros((1, 2, 3, 3), np.int32)), 2)
    with pytest.raises(dp.ShapeError, match="input's shape"):
        F.max_unpool2d(x, dp.Tensor.from_numpy(ctx, np.zeros((1, 2, 3, 2), np.int64)), 2)
    with pytest.raises(dp.ShapeError, match="within a stride"):
        F.max_unpool2d(x, idx, 2, output_size=(9, 6))
    with pytest.raises(dp.ShapeError, match="dimensions"):
        F.max_unpool3d(x[0], idx[0], 2)


def test_max_unpool_repeated_calls_build_nothing(ctx, rng):
    from dlprim_py import program
    a = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 6, 4)))
    values, idx = F.max_pool2d(a, 2, return_indices=True)
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 6, 4)))

    def run():
        x = values.detach().requires_grad_(True)
        F.max_unpool2d(x, idx, 2).backward(g)

    run()
    ctx.synchronize()
    before = dict(program.stats)
    run()
    run()
    ctx.synchronize()
    assert dict(program.stats) == before
