"""cumsum, sort and topk (dlprim_py/ops/scan.py) against torch on the CPU in float64 on seeded
data: every path (one chunk / several, rows / columns; one tile / several rows per tile /
the whole bitonic network; topk by tile rounds and by a full sort), ties and NaN, gradients,
refusals, empty tensors, repeated calls building nothing."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import program

from conftest import assert_close, random
from test_indexing import backward_check, poison_pool, ref, t_


def ties(rng, shape, nan=True):
    """float32 values with many ties (halves in [-10, 10)) and, with ``nan``, some NaNs."""
    x = (rng.integers(-20, 20, shape) / 2).astype(np.float32)
    if nan and x.size:
        x.reshape(-1)[rng.random(x.size) < 0.05] = np.nan
    return x


# ---- cumsum ----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((3, 7), 1), ((2, 5000), -1), ((6, 4, 3), 1),
                                       ((5, 3), 0), ((), 0)])
def test_cumsum_and_its_gradient(ctx, rng, shape, dim):
    x = random(rng, shape)
    X, XR = t_(ctx, x, True), ref(x, True)
    poison_pool(ctx)
    out = F.cumsum(X, dim)
    out_ref = torch.cumsum(XR, dim)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])


def test_cumsum_dtypes(ctx, rng):
    ints = rng.integers(-1000, 1000, (3, 3000))
    for array in (ints, ints.astype(np.int32), ints > 0):
        got = t_(ctx, array).cumsum(1)
        assert got.dtype == dp.int64
        np.testing.assert_array_equal(got.numpy(), torch.cumsum(torch.tensor(array), 1).numpy())
    as_float = F.cumsum(t_(ctx, ints), 0, dtype=dp.float32)
    assert as_float.dtype == dp.float32
    np.testing.assert_array_equal(as_float.numpy(), np.cumsum(ints, 0).astype(np.float32))
    with pytest.raises(dp.DTypeError, match="dtype"):
        F.cumsum(t_(ctx, ints), 0, dtype=dp.int32)
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.cumsum(t_(ctx, ints), 2)


# ---- sort ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((4, 9), 1), ((3, 300), -1), ((50, 3), 0), ((1, 1), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_torchs_stable_sort(ctx, rng, shape, dim, descending):
    """Values exactly, and indices exactly as torch's stable sort gives them, with ties and
    NaN; rows of one tile, several rows per tile, and the whole bitonic network (300 > the
    tile on PoCL)."""
    x = ties(rng, shape)
    poison_pool(ctx)
    values, indices = F.sort(t_(ctx, x), dim, descending=descending)
    want = torch.sort(torch.tensor(x), dim=dim, descending=descending, stable=True)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    assert indices.dtype == dp.int64


def test_sort_integers_gradient_and_method(ctx, rng):
    x = rng.integers(-50, 50, (3, 200))
    result = t_(ctx, x).sort(-1, descending=True, stable=True)
    want = torch.sort(torch.tensor(x), descending=True, stable=True)
    np.testing.assert_array_equal(result.values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(result.indices.numpy(), want.indices.numpy())
    f = random(rng, (4, 6))
    X, XR = t_(ctx, f, True), ref(f, True)
    out = F.sort(X, 0).values
    backward_check(ctx, rng, out, torch.sort(XR, 0).values, [(X, XR)])


# ---- topk ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,k,dim", [((3, 20), 4, 1), ((2, 1000), 5, -1),
                                         ((2, 300), 100, 1), ((40, 3), 2, 0), ((5, 7), 0, 1)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(ctx, rng, shape, k, dim, largest):
    """Values exactly with ties and NaN; indices point at the values; distinct values give
    torch's indices. 1000 entries take the tile rounds, k = 100 the full sort (on PoCL)."""
    x = ties(rng, shape)
    poison_pool(ctx)
    values, indices = F.topk(t_(ctx, x), k, dim, largest=largest)
    want = torch.topk(torch.tensor(x), k, dim, largest=largest)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(np.take_along_axis(x, indices.numpy(), dim), values.numpy())
    distinct = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32)
    values, indices = t_(ctx, distinct).topk(k, dim, largest)
    want = torch.topk(torch.tensor(distinct), k, dim, largest)
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


def test_topk_gradient_and_refusals(ctx, rng):
    x = random(rng, (3, 40))
    X, XR = t_(ctx, x, True), ref(x, True)
    out = F.topk(X, 5).values
    backward_check(ctx, rng, out, torch.topk(XR, 5).values, [(X, XR)])
    with pytest.raises(dp.ShapeError, match="k"):
        F.topk(X, 41)
    with pytest.raises(dp.DTypeError, match="float32, int32 and int64"):
        F.topk(t_(ctx, x > 0), 1)
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.sort(x)


def test_empty(ctx):
    x = t_(ctx, np.zeros((3, 0), np.float32))
    assert F.sort(x, 1).values.shape == (3, 0)
    assert F.topk(x, 0).indices.shape == (3, 0)
    assert F.cumsum(x, 1).shape == (3, 0)
    assert F.sort(t_(ctx, np.zeros((0, 4), np.float32)), 1).values.shape == (0, 4)


def test_repeated_calls_build_nothing(ctx, rng):
    x = t_(ctx, random(rng, (3, 300)), True)

    def run():
        y = F.cumsum(x, 1).sum() + F.sort(x, 1, descending=True).values.sum() + \
            F.topk(x, 3).values.sum() + F.topk(x, 100).values.sum()
        y.backward()
        x.grad = None

    run()
    before = dict(program.stats)
    run()
    run()
    ctx.synchronize()
    assert dict(program.stats) == before
