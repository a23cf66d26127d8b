"""2-D pooling against torch (float64): forward, indices and gradients; the operator API on
poisoned outputs; bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py.ops.pool import Pool2d
from conftest import assert_close, poisoned, random

TF = torch.nn.functional


def _run(ctx, rng, shape, ours, theirs):
    data = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    y, ref = ours(x), theirs(t)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("shape,kwargs", [
    ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 2, 8, 8), dict(kernel_size=2)),
    ((2, 1, 10, 7), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(2, 3))),
    ((1, 3, 7, 6), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ((3, 5, 5), dict(kernel_size=3, stride=1, padding=1)),
    ((1, 1, 1, 1), dict(kernel_size=1)),
])
def test_max_pool2d(ctx, rng, shape, kwargs):
    _run(ctx, rng, shape, lambda x: F.max_pool2d(x, **kwargs), lambda t: TF.max_pool2d(t, **kwargs))


def test_max_pool2d_indices_and_ties(ctx, rng):
    # Ties: torch keeps the first maximum of each window; its indices are h*W + w.
    data = rng.integers(0, 3, size=(2, 2, 7, 9)).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, data)
    y, idx = F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True)
    ref, ref_idx = TF.max_pool2d(torch.tensor(data), 3, stride=2, padding=1, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ref.numpy())
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


@pytest.mark.parametrize("shape,kwargs", [
    ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 3, 9, 11), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ((1, 2, 7, 6), dict(kernel_size=(3, 2), stride=2, padding=(1, 1), ceil_mode=True)),
    ((1, 2, 7, 6), dict(kernel_size=(3, 2), stride=2, padding=(1, 1), ceil_mode=True,
                        count_include_pad=False)),
    ((1, 2, 6, 6), dict(kernel_size=2, divisor_override=3)),
    ((4, 5, 5), dict(kernel_size=5)),
])
def test_avg_pool2d(ctx, rng, shape, kwargs):
    _run(ctx, rng, shape, lambda x: F.avg_pool2d(x, **kwargs), lambda t: TF.avg_pool2d(t, **kwargs))


@pytest.mark.parametrize("shape,size", [((2, 3, 8, 12), 1), ((2, 3, 8, 12), (4, 3)),
                                        ((1, 2, 7, 10), (3, 4)), ((1, 2, 3, 5), (7, 6)),
                                        ((2, 3, 9, 4), (None, 2))])
@pytest.mark.parametrize("method", ["avg", "max"])
def test_adaptive(ctx, rng, method, shape, size):
    ours = F.adaptive_avg_pool2d if method == "avg" else F.adaptive_max_pool2d
    theirs = TF.adaptive_avg_pool2d if method == "avg" else TF.adaptive_max_pool2d
    _run(ctx, rng, shape, lambda x: ours(x, size), lambda t: theirs(t, size))


def test_adaptive_max_indices(ctx, rng):
    data = random(rng, (2, 3, 7, 10))
    y, idx = F.adaptive_max_pool2d(dp.Tensor.from_numpy(ctx, data), (3, 4), return_indices=True)
    _, ref_idx = TF.adaptive_max_pool2d(torch.tensor(data), (3, 4), return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


def _poisoned_at(ctx, shape, offset_elements):
    """A NaN-filled output that starts ``offset_elements`` into its buffer."""
    backing = poisoned(ctx, (offset_elements + int(np.prod(shape)),))
    return dp.Tensor(ctx, backing.buffer, shape, offset=offset_elements * 4)


@pytest.mark.parametrize("method", ["max", "avg"])
def test_operator_on_poisoned_outputs_at_offsets(ctx, rng, method):
    op = Pool2d(ctx, method, kernel_size=3, stride=2, padding=1)
    data = random(rng, (2, 3, 9, 8))
    backing = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, 7), data.ravel()]))
    x = dp.Tensor(ctx, backing.buffer, data.shape, offset=7 * 4)
    y = _poisoned_at(ctx, op.output_shape(x.shape), 5)
    indices = dp.Tensor.empty(ctx, y.shape, np.int64) if method == "max" else None
    op.forward(x, y, indices)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    ref = (TF.max_pool2d if method == "max" else TF.avg_pool2d)(t, 3, 2, 1)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, y.shape)
    dx = _poisoned_at(ctx, x.shape, 3)
    op.backward(dp.Tensor.from_numpy(ctx, grad), dx, indices)
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(dx.numpy(), t.grad.numpy())


def test_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 5, 5)))
    with pytest.raises(dp.ShapeError, match="at most half"):
        F.max_pool2d(x, 3, padding=2)
    with pytest.raises(dp.ShapeError, match=r"\(N, C, H, W\)"):
        F.avg_pool2d(dp.Tensor.from_numpy(ctx, random(rng, (5, 5))), 2)
    with pytest.raises(dp.ShapeError, match="empty output"):
        F.max_pool2d(x, 7)
    with pytest.raises(dp.ShapeError, match="positive"):
        F.max_pool2d(x, 2, stride=0)
    with pytest.raises(dp.ShapeError, match="output_size"):
        F.adaptive_avg_pool2d(x, (-1, 2))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.avg_pool2d(dp.Tensor.from_numpy(ctx, np.ones((1, 1, 4, 4), np.int32)), 2)
    op = Pool2d(ctx, "max", kernel_size=2)
    with pytest.raises(dp.ShapeError, match="must have shape"):
        op.forward(x, dp.Tensor.empty(ctx, (2, 3, 3, 3)))
    with pytest.raises(dp.ShapeError, match="needs the indices"):
        op.backward(dp.Tensor.empty(ctx, (2, 3, 2, 2)), dp.Tensor.empty(ctx, x.shape))


def test_random_configurations(ctx, rng):
    """Seeded random shapes and window settings, forward and gradient, max and avg."""
    for _ in range(12):
        kh, kw = (int(k) for k in rng.integers(1, 5, size=2))
        sh, sw = (int(s) for s in rng.integers(1, 4, size=2))
        dh, dw = (int(d) for d in rng.integers(1, 3, size=2))
        ph, pw = int(rng.integers(0, kh // 2 + 1)), int(rng.integers(0, kw // 2 + 1))
        H = int(rng.integers((kh - 1) * dh + 1, 14))
        W = int(rng.integers((kw - 1) * dw + 1, 14))
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), H, W)
        ceil_mode = bool(rng.integers(0, 2))
        kwargs = dict(kernel_size=(kh, kw), stride=(sh, sw), padding=(ph, pw), ceil_mode=ceil_mode)
        _run(ctx, rng, shape, lambda x: F.max_pool2d(x, dilation=(dh, dw), **kwargs),
             lambda t: TF.max_pool2d(t, dilation=(dh, dw), **kwargs))
        include = bool(rng.integers(0, 2))
        _run(ctx, rng, shape, lambda x: F.avg_pool2d(x, count_include_pad=include, **kwargs),
             lambda t: TF.avg_pool2d(t, count_include_pad=include, **kwargs))


def test_command_log(ctx, rng, monkeypatch, capsys):
    """DLPRIM_LOG_CMD=1 prints the dlprim-driver command that reproduces the call."""
    monkeypatch.setenv("DLPRIM_LOG_CMD", "1")
    dp.config.reload()
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 9, 8)))
    F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)
    F.adaptive_max_pool2d(x, (2, None))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("DLPRIM_LOG_CMD")]
    assert lines == [
        "DLPRIM_LOG_CMD: dlprim-driver pool -n 2 -c 3 -H 9 -W 8 -y 3 -x 3 -u 2 -v 2 -p 1 -q 1 "
        "--dilation_h 1 --dilation_w 1 --ceil_mode 0 --divisor 0 -m avg -F 1 -t 1",
        "DLPRIM_LOG_CMD: dlprim-driver pool -n 2 -c 3 -H 9 -W 8 --adaptive 2x8 -m max -F 1 -t 1"]


@pytest.mark.parametrize("algo", ["window", "plane"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 7), (1, 3, 40, 31), (2, 1, 1, 1), (37, 2, 3)])
def test_global_pooling_forced_algorithm(ctx, rng, monkeypatch, algo, shape):
    """Windows covering the whole plane, each algorithm on its own: avg (and with a divisor),
    max with its indices, adaptive to 1x1; plane counts that do not fill the last work group."""
    monkeypatch.setenv("DLPRIM_POOL_ALGO", algo)
    dp.config.reload()
    H, W = shape[-2:]
    _run(ctx, rng, shape, lambda x: F.avg_pool2d(x, (H, W)), lambda t: TF.avg_pool2d(t, (H, W)))
    _run(ctx, rng, shape, lambda x: F.avg_pool2d(x, (H, W), divisor_override=3),
         lambda t: TF.avg_pool2d(t, (H, W), divisor_override=3))
    _run(ctx, rng, shape, lambda x: F.max_pool2d(x, (H, W)), lambda t: TF.max_pool2d(t, (H, W)))
    _run(ctx, rng, shape, lambda x: F.adaptive_avg_pool2d(x, 1), lambda t: TF.adaptive_avg_pool2d(t, 1))
    # Ties and NaN: torch keeps the first maximum, and the last NaN over any number.
    data = rng.integers(0, 3, size=shape).astype(np.float32)
    data.reshape(-1, H * W)[::3, 0] = np.nan
    data.reshape(-1, H * W)[::3, -1] = np.nan
    y, idx = F.adaptive_max_pool2d(dp.Tensor.from_numpy(ctx, data), 1, return_indices=True)
    ref, ref_idx = TF.adaptive_max_pool2d(torch.tensor(data), 1, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ref.numpy())
    np.testing.assert_array_equal(idx.numpy(), ref_idx.numpy())


def test_float_sizes_are_refused_after_an_int_call(ctx, rng):
    """The operator memo once took kernel_size 2.0 for the operator built for 2 (2.0 == 2)."""
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 4, 4)))
    F.max_pool2d(x, 2)
    F.avg_pool2d(x, (2, 2), stride=1)
    for call in (lambda: F.max_pool2d(x, 2.0), lambda: F.avg_pool2d(x, (2, 2), stride=1.0),
                 lambda: F.adaptive_avg_pool2d(x, 2.5), lambda: F.adaptive_max_pool2d(x, 1.0)):
        with pytest.raises(dp.ShapeError, match="int"):
            call()


@pytest.mark.parametrize("output_size", [0, (0, 2), (3, 0)])
def test_adaptive_output_size_zero(ctx, rng, output_size):
    """torch gives an empty output (once refused); the input gradient is then zero."""
    a = random(rng, (2, 3, 5, 4))
    for ours, theirs in ((F.adaptive_avg_pool2d, TF.adaptive_avg_pool2d),
                         (F.adaptive_max_pool2d, TF.adaptive_max_pool2d)):
        x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
        y = ours(x, output_size)
        assert y.shape == tuple(theirs(torch.from_numpy(a), output_size).shape)
        F.sum(y).backward()
        assert np.array_equal(x.grad.numpy(), np.zeros_like(a))
