"""softmax / log_softmax over any dim, every variant forced, against torch CPU float64."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py.ops.softmax import softmax_backward

from conftest import assert_close, random

F = dp.functional

VARIANTS = [("row", None), ("row", 0), ("column", None)]   # registers, streaming, per-item


@pytest.mark.parametrize("variant, cached", VARIANTS, ids=["row-registers", "row-streaming", "column"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((4, 37), 1), ((3, 5, 7), 1), ((3, 5, 7), 0), ((2, 1100), -1),
                                        ((1,), 0), ((6, 1), 1)])
def test_forward_and_gradient(ctx, rng, variant, cached, log, shape, dim):
    # Large logits: without max subtraction exp would overflow.
    a = random(rng, shape, -60.0, 60.0)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    ours = F.log_softmax if log else F.softmax
    y = ours(x, dim, variant=variant, cached=cached)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    ref = (torch.log_softmax if log else torch.softmax)(t, dim)
    assert_close(y.numpy(), ref.detach().numpy())
    g = random(rng, shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), t.grad.numpy())


def test_long_rows_cached_forward_streaming_backward(ctx, rng):
    """Rows long enough for the most registers per item: the backward streams instead."""
    a = random(rng, (2, 5000), -30, 30)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = F.log_softmax(x, 1)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    ref = torch.log_softmax(t, 1)
    assert_close(y.numpy(), ref.detach().numpy())
    g = random(rng, a.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), t.grad.numpy())


def test_default_choice_and_backward_api(ctx, rng):
    a = random(rng, (3, 300), -5, 5)
    x = dp.Tensor.from_numpy(ctx, a)
    y = F.softmax(x, 1)
    ref = torch.softmax(torch.tensor(a, dtype=torch.float64), 1)
    assert_close(y.numpy(), ref.numpy())
    g = random(rng, a.shape)
    dx = softmax_backward(y, dp.Tensor.from_numpy(ctx, g), 1)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    torch.softmax(t, 1).backward(torch.tensor(g.astype(np.float64)))
    assert_close(dx.numpy(), t.grad.numpy())


def test_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (3, 4))
    with pytest.raises(dp.ShapeError, match="dim is required"):
        F.softmax(x)
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.log_softmax(x, 2)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.softmax(dp.Tensor.zeros(ctx, (3,), np.int32), 0)
    with pytest.raises(dp.UnsupportedError, match="variant"):
        F.softmax(x, 1, variant="warp")
    with pytest.raises(dp.UnsupportedError, match="cannot hold"):
        F.softmax(dp.Tensor.zeros(ctx, (2, 5000)), 1, cached=2)
    with pytest.raises(dp.ShapeError, match="dy"):
        softmax_backward(x, dp.Tensor.zeros(ctx, (4, 3)), 1)


@pytest.mark.parametrize("variant, cached", VARIANTS, ids=["row-registers", "row-streaming", "column"])
def test_masked_rows(ctx, rng, variant, cached):
    """-inf entries (masks) give 0 (softmax) and -inf (log_softmax); an item of the group may
    hold nothing but -inf, and a row of only -inf is NaN, as in torch."""
    a = random(rng, (3, 600), -5, 5)
    a[0, 100:] = -np.inf
    a[1, ::3] = -np.inf
    a[2, :] = -np.inf
    x = dp.Tensor.from_numpy(ctx, a)
    t = torch.tensor(a.astype(np.float64))
    for ours, theirs in ((F.softmax, torch.softmax), (F.log_softmax, torch.log_softmax)):
        out = ours(x, 1, variant=variant, cached=cached).numpy()
        ref = theirs(t, 1).numpy()
        assert np.isnan(out[2]).all() and np.isnan(ref[2]).all()
        assert np.array_equal(np.isneginf(out[:2]), np.isneginf(ref[:2]))
        finite = np.isfinite(ref[:2])
        assert_close(out[:2][finite], ref[:2][finite])


@pytest.mark.parametrize("vector", [4, 1])
@pytest.mark.parametrize("cached", [None, 0], ids=["registers", "streaming"])
def test_row_vector_loads(ctx, rng, monkeypatch, vector, cached):
    """The row forward with float4 loads and stores, or scalar ones: rows of 1000 and 200
    (registers: several rows per work-group, the last group part empty, groups looping over
    rows) and 5000 (most registers), a row start off a vector boundary (scalar then), -inf
    entries inside a vector."""
    from dlprim_py.ops import softmax as S
    monkeypatch.setattr(S, "VECTOR", vector)
    for shape in ((3, 1000), (301, 200), (2, 5000)):
        a = random(rng, shape, -20, 20)
        a[0, 1:7] = -np.inf
        t = torch.tensor(a.astype(np.float64))
        big = dp.Tensor.from_numpy(ctx, np.concatenate([[0.0], a.ravel()]).astype(np.float32))
        for offset in (0, 1):
            x = dp.Tensor.from_numpy(ctx, a) if offset == 0 else dp.Tensor(ctx, big.buffer, shape, offset=4)
            plan = S._plan(ctx, False, shape[1], 1, a.size, "row", cached, offset == 0)
            assert plan.vector == (vector if offset == 0 else 1)
            for ours, theirs in ((F.softmax, torch.softmax), (F.log_softmax, torch.log_softmax)):
                out = ours(x, 1, variant="row", cached=cached).numpy()
                ref = theirs(t, 1).numpy()
                assert np.array_equal(np.isfinite(out), np.isfinite(ref))
                assert_close(out[np.isfinite(ref)], ref[np.isfinite(ref)])
