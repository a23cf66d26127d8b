"""The tape: gradients through the arithmetic operators, accumulation, no_grad, bad calls."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from conftest import assert_close, random


def _torch(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def test_gradients_match_torch_and_accumulate_on_reuse(ctx, rng):
    a, b = random(rng, (3, 4)), random(rng, (3, 4), low=0.5, high=1.5)
    ta = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    tb = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    # a is used three times: its gradient is the sum of three paths.
    out = (ta * tb + ta / tb - ta) * 2.0
    g = random(rng, (3, 4))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ra, rb = _torch(a), _torch(b)
    ((ra * rb + ra / rb - ra) * 2.0).backward(torch.tensor(g, dtype=torch.float64))
    assert_close(ta.grad.numpy(), ra.grad.numpy())
    assert_close(tb.grad.numpy(), rb.grad.numpy())


def test_grad_accumulates_across_backward_calls(ctx, rng):
    a = random(rng, (5,))
    t = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    g = dp.Tensor.from_numpy(ctx, np.ones(5, np.float32))
    (t * 3.0).backward(g)
    (t * 2.0).backward(g)
    assert_close(t.grad.numpy(), np.full(5, 5.0))
    t.zero_grad()
    assert t.grad is None


def test_scalar_backward_without_grad(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (1,)), requires_grad=True)
    (t * 4.0).backward()
    assert_close(t.grad.numpy(), np.array([4.0]))


def test_backward_through_reshape(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (2, 6)), requires_grad=True)
    out = t.reshape(3, 4) * 2.0
    out.backward(dp.Tensor.full(ctx, (3, 4), 1.0))
    assert t.grad.shape == (2, 6)
    assert_close(t.grad.numpy(), np.full((2, 6), 2.0))


def test_no_grad_records_nothing(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (3,)), requires_grad=True)
    with dp.no_grad():
        out = t * 2.0
    assert not out.requires_grad and out.grad_fn is None
    with pytest.raises(dp.ShapeError, match="does not require grad"):
        out.backward(dp.Tensor.full(ctx, (3,), 1.0))


def test_backward_bad_calls(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (3,)), requires_grad=True)
    out = t * 2.0
    with pytest.raises(dp.ShapeError, match="one-element"):
        out.backward()
    with pytest.raises(dp.ShapeError, match="shape"):
        out.backward(dp.Tensor.full(ctx, (4,), 1.0))
    with pytest.raises(dp.DTypeError):
        dp.Tensor.from_numpy(ctx, np.arange(3), requires_grad=True)


def test_detach_cuts_the_graph(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (3,)), requires_grad=True)
    d = (t * 2.0).detach()
    assert not d.requires_grad and d.grad_fn is None


def test_second_backward_raises_unless_the_graph_is_retained(ctx, rng):
    """As torch: a backward frees the graph's saved tensors; a second one through it raises
    GraphError (and changes no gradient) unless the first was given retain_graph=True, which
    lets the second add the same gradients again."""
    import dlprim_py.functional as F
    x_np = random(rng, (3, 5))
    x = dp.Tensor.from_numpy(ctx, x_np, requires_grad=True)
    loss = F.sum(F.relu(x * 2.0))
    loss.backward()
    expected = np.where(x_np > 0, 2.0, 0.0)
    assert_close(x.grad.numpy(), expected)
    with pytest.raises(dp.GraphError, match="retain_graph=True"):
        loss.backward()
    assert_close(x.grad.numpy(), expected)

    x.grad = None
    loss = F.sum(F.relu(x * 2.0))
    loss.backward(retain_graph=True)
    loss.backward()
    assert_close(x.grad.numpy(), 2 * expected)
    with pytest.raises(dp.GraphError):
        loss.backward()

    # A leaf has no graph: its backward adds its gradient each time, as torch's.
    leaf = dp.Tensor.from_numpy(ctx, random(rng, (4,)), requires_grad=True)
    ones = dp.Tensor.full(ctx, (4,), 1.0)
    leaf.backward(ones)
    leaf.backward(ones)
    assert_close(leaf.grad.numpy(), np.full(4, 2.0))
