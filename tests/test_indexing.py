"""Indexing and selection (dlprim_py/ops/indexing.py) against torch on the CPU in float64, on
seeded data with duplicate indices: forward, gradients through the tape, both index_add
solvers forced, out-of-range indices, refusals, empty tensors, repeated calls building
nothing."""
import numpy as np
import pyopencl as cl
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import program

from conftest import assert_close, assert_repeats_build_nothing, random

TF = torch.nn.functional


def t_(ctx, array, grad=False):
    return dp.Tensor.from_numpy(ctx, np.array(array, order="C"), requires_grad=grad)


def ref(array, grad=False):
    a = torch.tensor(array)
    if a.dtype == torch.float32:
        a = a.double()
    return a.requires_grad_(grad)


def poison_pool(ctx, nbytes=(8, 64, 256, 1024, 4096, 16384)):
    """Leave blocks full of 0xFF bytes (NaN as float, -1 as int) in the memory pool, so that an
    output the next call takes from it fails where a kernel does not write it."""
    held = []
    for n in nbytes:
        for _ in range(4):
            t = dp.Tensor.empty(ctx, (n,), np.uint8 if False else dp.bool)
            cl.enqueue_fill_buffer(ctx.queue, t.buffer, np.uint8(0xFF), t.offset, n)
            held.append(t)
    ctx.synchronize()
    del held


def backward_check(ctx, rng, out, out_ref, leaves):
    """Backpropagate the same random gradient through both and compare the leaves'."""
    g = random(rng, out.shape)
    out.backward(t_(ctx, g))
    out_ref.backward(torch.tensor(g, dtype=torch.float64))
    for mine, theirs in leaves:
        assert_close(mine.grad.numpy(), theirs.grad.numpy())


@pytest.fixture(params=["sorted", "loop"])
def index_add_algo(request, monkeypatch):
    monkeypatch.setenv("DLPRIM_INDEX_ADD_ALGO", request.param)
    dp.config.reload()
    return request.param


# ---- gather / scatter / scatter_add ----------------------------------------------------------

@pytest.mark.parametrize("shape,dim,index_shape", [
    ((3, 5, 4), 1, (3, 7, 4)), ((3, 5, 4), -1, (2, 5, 6)), ((6, 4), 0, (9, 3)), ((5,), 0, (8,)),
    # along the last dimension, rows of a multiple of 4 (four outputs per work item)
    ((3, 5, 9), -1, (2, 5, 8)), ((2, 9), 1, (2, 12))])
def test_gather_and_its_gradient(ctx, rng, shape, dim, index_shape):
    x = random(rng, shape)
    index = rng.integers(0, shape[dim], index_shape)     # duplicates, a smaller index
    poison_pool(ctx)
    X, XR = t_(ctx, x, True), ref(x, True)
    out = F.gather(X, dim, t_(ctx, index))
    out_ref = torch.gather(XR, dim, torch.tensor(index))
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])


def test_gather_other_dtypes_and_method(ctx, rng):
    x = rng.integers(-9, 9, (4, 6)).astype(np.int64)
    index = rng.integers(0, 6, (4, 3))
    out = t_(ctx, x).gather(1, t_(ctx, index))
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, index, 1))
    index = rng.integers(0, 6, (4, 8))      # four per work item
    out = t_(ctx, x).gather(1, t_(ctx, index))
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, index, 1))


@pytest.mark.parametrize("dim", [0, -1])
def test_scatter_src_and_value(ctx, rng, dim):
    shape = (5, 6)
    x, src = random(rng, shape), random(rng, (6, 7))
    # Distinct targets along dim (torch leaves duplicates unspecified).
    if dim == 0:
        index = np.stack([rng.permutation(5)[:4] for _ in range(5)], axis=1)    # (4, 5)
    else:
        index = np.stack([rng.permutation(6)[:5] for _ in range(4)], axis=0)    # (4, 5)
    poison_pool(ctx)
    larger = F.scatter(t_(ctx, x), dim, t_(ctx, index), t_(ctx, src))     # src larger than index
    assert_close(larger.numpy(), torch.scatter(ref(x), dim, torch.tensor(index),
                                               ref(src)).numpy())
    src = src[:4, :5]      # torch's backward takes a src of index's shape only
    X, S, XR, SR = t_(ctx, x, True), t_(ctx, src, True), ref(x, True), ref(src, True)
    out = F.scatter(X, dim, t_(ctx, index), S)
    out_ref = torch.scatter(XR, dim, torch.tensor(index), SR)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR), (S, SR)])
    filled = X.scatter(dim, t_(ctx, index), value=2.5)
    assert_close(filled.numpy(), torch.scatter(ref(x), dim, torch.tensor(index), 2.5).numpy())


def test_scatter_add_duplicates_and_gradient(ctx, rng):
    x, src = random(rng, (4, 5, 3)), random(rng, (4, 8, 2))
    index = rng.integers(0, 5, (4, 8, 2))     # narrower than x in the last dimension
    X, S, XR, SR = t_(ctx, x, True), t_(ctx, src, True), ref(x, True), ref(src, True)
    poison_pool(ctx)
    out = F.scatter_add(X, 1, t_(ctx, index), S)
    out_ref = torch.scatter_add(XR, 1, torch.tensor(index), SR)
    assert_close(out.numpy(), out_ref.detach().numpy())
    again = F.scatter_add(X, 1, t_(ctx, index), S)
    np.testing.assert_array_equal(out.numpy(), again.numpy())    # deterministic
    backward_check(ctx, rng, out, out_ref, [(X, XR), (S, SR)])


# ---- index_select / index_add ------------------------------------------------------------------

@pytest.mark.parametrize("shape,dim", [((7, 5, 3), 0), ((4, 6, 2), -2), ((3, 40), 1),
                                       # rows of a multiple of 4 (4-vectors per work item)
                                       ((5, 3, 8), 1), ((9, 12), 0)])
def test_index_select_and_its_gradient(ctx, rng, index_add_algo, shape, dim):
    x = random(rng, shape)
    index = rng.integers(0, shape[dim], 45)
    X, XR = t_(ctx, x, True), ref(x, True)
    poison_pool(ctx)
    out = F.index_select(X, dim, t_(ctx, index))
    out_ref = torch.index_select(XR, dim, torch.tensor(index))
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])


def _at_offset(ctx, array, offset):
    """``array`` as a tensor ``offset`` elements into a larger buffer (a view), the elements
    before it garbage."""
    flat = np.concatenate([np.full(offset, 7, array.dtype), array.reshape(-1)])
    base = dp.Tensor.from_numpy(ctx, flat)
    return dp.Tensor(ctx, base.buffer, array.shape, base.dtype,
                     offset=base.offset + offset * array.dtype.itemsize)


@pytest.mark.parametrize("offset", [0, 1, 2, 4])
def test_vector_paths_at_any_offset(ctx, rng, offset):
    """gather along the last dimension and index_select / embedding of rows of a multiple of 4
    move aligned 4-vectors: operands at offsets that are not whole vectors take the scalar
    kernel, with the same results."""
    x = random(rng, (6, 12))
    index = rng.integers(0, 12, (6, 8))
    poison_pool(ctx)
    out = F.gather(_at_offset(ctx, x, offset), 1, _at_offset(ctx, index, offset))
    np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, index, 1))
    rows = rng.integers(0, 6, 9)
    poison_pool(ctx)
    out = F.index_select(_at_offset(ctx, x, offset), 0, _at_offset(ctx, rows, offset))
    np.testing.assert_array_equal(out.numpy(), x[rows])
    out = F.embedding(_at_offset(ctx, rows, offset), _at_offset(ctx, x, offset))
    np.testing.assert_array_equal(out.numpy(), x[rows])


def test_gather_scatter_take_int32_indices(ctx, rng):
    """int32 indices, as torch takes them: gather (twice: the int64 replay is not taken by an
    int32 index), scatter, scatter_add, with gather's gradient."""
    x, src = random(rng, (10, 5)), random(rng, (5, 5))
    # No index repeated in a column: scatter's result is then defined.
    index = np.stack([rng.permutation(10)[:5] for _ in range(5)], 1).astype(np.int32)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ti, ts = torch.tensor(index), torch.tensor(src, dtype=torch.float64)
    for _ in range(2):
        ours = t_(ctx, x, grad=True)
        out = F.gather(ours, 0, t_(ctx, index))
        ref = torch.gather(tx, 0, ti)
        np.testing.assert_array_equal(out.numpy(), ref.detach().numpy().astype(np.float32))
    tx.grad = None
    backward_check(ctx, rng, out, ref, [(ours, tx)])
    assert_close(F.scatter(t_(ctx, x), 0, t_(ctx, index), t_(ctx, src)).numpy(),
                 torch.scatter(tx.detach(), 0, ti, ts).numpy())
    assert_close(F.scatter_add(t_(ctx, x), 0, t_(ctx, index), t_(ctx, src)).numpy(),
                 torch.scatter_add(tx.detach(), 0, ti, ts).numpy())


def test_index_select_int32_index(ctx, rng):
    x = random(rng, (6, 3))
    index = np.array([5, 0, 0, 2], np.int32)
    out = t_(ctx, x).index_select(0, t_(ctx, index))
    np.testing.assert_array_equal(out.numpy(), x[index])


@pytest.mark.parametrize("alpha", [1, -0.5])
def test_index_add_and_its_gradient(ctx, rng, index_add_algo, alpha):
    x, src = random(rng, (3, 8, 2)), random(rng, (3, 50, 2))
    index = rng.integers(0, 8, 50)
    X, S, XR, SR = t_(ctx, x, True), t_(ctx, src, True), ref(x, True), ref(src, True)
    poison_pool(ctx)
    out = F.index_add(X, 1, t_(ctx, index), S, alpha=alpha)
    out_ref = torch.index_add(XR, 1, torch.tensor(index), SR, alpha=alpha)
    assert_close(out.numpy(), out_ref.detach().numpy())
    np.testing.assert_array_equal(out.numpy(), X.index_add(1, t_(ctx, index), S,
                                                           alpha=alpha).numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR), (S, SR)])


def test_index_add_integers(ctx, rng, index_add_algo):
    x, src = rng.integers(-5, 5, (6,)), rng.integers(-5, 5, (40,))
    index = rng.integers(0, 6, 40)
    out = F.index_add(t_(ctx, x), 0, t_(ctx, index), t_(ctx, src), alpha=2)
    expected = x.copy()
    np.add.at(expected, index, 2 * src)
    np.testing.assert_array_equal(out.numpy(), expected)



@pytest.mark.parametrize("index", [[0], 0])
def test_index_select_and_index_add_on_a_0d_input(ctx, rng, index):
    """torch treats a 0-d input as one element along dim 0; the results stay 0-d."""
    x, src = random(rng, ()), random(rng, ())
    I, IR = t_(ctx, np.array(index, dtype=np.int64)), torch.tensor(index)
    X, XR = t_(ctx, x, True), ref(x, True)
    out, out_ref = F.index_select(X, 0, I), torch.index_select(XR, 0, IR)
    assert out.shape == ()
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])
    X, XR = t_(ctx, x, True), ref(x, True)
    S, SR = t_(ctx, src, True), ref(src, True)
    out, out_ref = F.index_add(X, 0, I, S, alpha=-2), torch.index_add(XR, 0, IR, SR, alpha=-2)
    assert out.shape == ()
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR), (S, SR)])
    with pytest.raises(dp.ShapeError, match="exactly 1 value"):
        F.index_select(X, 0, t_(ctx, np.array([0, 0])))
    with pytest.raises(dp.ShapeError, match="exactly 1 value"):
        F.index_add(X, 0, t_(ctx, np.array([0, 0])), t_(ctx, random(rng, (2,))))

# ---- where / masked_fill / tests --------------------------------------------------------------

def test_where_broadcasts_promotes_and_differentiates(ctx, rng):
    c = rng.random((3, 1, 4)) > 0.5
    a, b = random(rng, (3, 5, 4)), random(rng, (5, 1))
    A, B, AR, BR = t_(ctx, a, True), t_(ctx, b, True), ref(a, True), ref(b, True)
    poison_pool(ctx)
    out = F.where(t_(ctx, c), A, B)
    out_ref = torch.where(torch.tensor(c), AR, BR)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(A, AR), (B, BR)])
    assert_close(F.where(t_(ctx, c), 0.5, A).numpy(), np.where(c, 0.5, a))
    ints = F.where(t_(ctx, c), t_(ctx, np.arange(4)), 2.5)
    assert ints.dtype == dp.float32
    np.testing.assert_array_equal(ints.numpy(), np.where(c, np.arange(4), 2.5))
    longs = F.where(t_(ctx, c), t_(ctx, np.arange(4)), -1)
    assert longs.dtype == dp.int64
    np.testing.assert_array_equal(A.where(t_(ctx, c), 0.0).numpy(), np.where(c, a, 0))
    with pytest.raises(dp.UnsupportedError, match="where\\(condition\\)"):
        F.where(t_(ctx, c))
    with pytest.raises(dp.DTypeError, match="bool"):
        F.where(t_(ctx, c.astype(np.float32)), A, B)


def test_masked_fill(ctx, rng):
    x = random(rng, (4, 5))
    mask = rng.random((1, 5)) > 0.5
    X, XR = t_(ctx, x, True), ref(x, True)
    out = X.masked_fill(t_(ctx, mask), -1e9)
    out_ref = XR.masked_fill(torch.tensor(mask), -1e9)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR)])
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.masked_fill(X, t_(ctx, rng.random((4, 5, 2)) > 0.5), 0.0)
    with pytest.raises(dp.DTypeError, match="bool"):
        F.masked_fill(X, t_(ctx, mask.astype(np.int64)), 0.0)


@pytest.mark.parametrize("shape,mask_shape", [((4, 5), (1, 5)), ((), ())])
@pytest.mark.parametrize("input_grad", [True, False])
def test_masked_fill_a_tensor_value_gets_its_gradient(ctx, rng, shape, mask_shape, input_grad):
    """The value's gradient is the sum of the output's gradient where the mask is True."""
    x, v = random(rng, shape), random(rng, ())
    mask = np.ones(mask_shape, bool) if not mask_shape else rng.random(mask_shape) > 0.5
    X, XR = t_(ctx, x, input_grad), ref(x, input_grad)
    V, VR = t_(ctx, v, True), ref(v, True)
    out = F.masked_fill(X, t_(ctx, mask), V)
    out_ref = XR.masked_fill(torch.tensor(mask), VR)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(X, XR), (V, VR)] if input_grad else [(V, VR)])


def test_nonfinite_tests(ctx):
    x = np.array([1.0, np.nan, np.inf, -np.inf, -0.0, 3e38], np.float32)
    X = t_(ctx, x)
    for name in ("isnan", "isinf", "isposinf", "isneginf", "isfinite"):
        np.testing.assert_array_equal(getattr(F, name)(X).numpy(),
                                      getattr(torch, name)(torch.tensor(x)).numpy(), name)
        ints = getattr(F, name)(t_(ctx, np.arange(3)))
        assert ints.dtype == dp.bool
        np.testing.assert_array_equal(ints.numpy(), getattr(torch, name)(torch.arange(3)).numpy())


def test_isin_and_count_nonzero(ctx, rng):
    x = rng.integers(0, 10, (4, 6))
    test = np.array([3, 7, 7, 0])
    for invert in (False, True):
        np.testing.assert_array_equal(
            F.isin(t_(ctx, x), t_(ctx, test), invert=invert).numpy(),
            torch.isin(torch.tensor(x), torch.tensor(test), invert=invert).numpy())
    np.testing.assert_array_equal(F.isin(t_(ctx, x), 3).numpy(), x == 3)
    np.testing.assert_array_equal(F.isin(t_(ctx, x.astype(np.float32)), t_(ctx, test)).numpy(),
                                  np.isin(x, test))
    f = np.where(rng.random((3, 5)) > 0.5, random(rng, (3, 5)), 0).astype(np.float32)
    for dim in (None, 0, -1, (0, 1)):
        got = F.count_nonzero(t_(ctx, f), dim)
        want = torch.count_nonzero(torch.tensor(f), dim)
        assert got.dtype == dp.int64
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("diagonal", [0, -1, 2])
def test_tril_triu(ctx, rng, diagonal):
    x = random(rng, (2, 4, 5))
    for name in ("tril", "triu"):
        X, XR = t_(ctx, x, True), ref(x, True)
        out = getattr(F, name)(X, diagonal)
        out_ref = getattr(torch, name)(XR, diagonal)
        np.testing.assert_array_equal(out.numpy(), out_ref.detach().numpy().astype(np.float32))
        backward_check(ctx, rng, out, out_ref, [(X, XR)])
    with pytest.raises(dp.ShapeError, match="2 dimensions"):
        F.tril(t_(ctx, x[0, 0]))


def test_arange_linspace(ctx):
    cases = [((5,), {}), ((2, 9, 3), {}), ((1.0, 2.0, 0.25), {}), ((5, -3, -2), {}),
             ((0, 1, 0.1), {}), ((3,), {"dtype": dp.float32})]
    for args, kwargs in cases:
        got = dp.arange(*args, ctx=ctx, **kwargs)
        torch_kwargs = {"dtype": {dp.float32: torch.float32, dp.int64: torch.int64}[
            kwargs["dtype"]]} if kwargs else {}
        want = torch.arange(*args, **torch_kwargs).numpy()
        assert got.dtype == want.dtype and got.shape == want.shape, args
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    # A fractional range into int64: ceil(6.5) = 7 elements from the start truncated, as torch
    # 2.14 gives it (2.11 gave 6), spelled out so that the check does not depend on the
    # installed torch.
    got = dp.arange(-2.5, 4, dtype=dp.int64, ctx=ctx)
    assert got.dtype == np.int64 and got.numpy().tolist() == [-2, -1, 0, 1, 2, 3, 4]
    for args in ((0, 1, 5), (-3.0, 7.5, 11), (2, 2, 1), (1, 0, 0), (0, 10, 7),
                 (-2, -3, 1), (4.3, 50, 1)):  # one step is [start]
        np.testing.assert_allclose(F.linspace(*args, ctx=ctx).numpy(),
                                   torch.linspace(*args).numpy(), rtol=1e-6, atol=1e-6)
    assert dp.Tensor.arange(ctx, 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(dp.ShapeError, match="step"):
        dp.arange(0, 5, 0, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="direction"):
        dp.arange(5, 0, 1, ctx=ctx)
    with pytest.raises(dp.ShapeError, match="steps"):
        dp.linspace(0, 1, -1, ctx=ctx)


def test_arange_takes_bools_and_linspace_0d_tensors(ctx):
    """As torch: True and False count as 1 and 0 in arange; linspace's start and end may be
    0-d tensors (read back), a longer tensor is refused."""
    for args in ((True, True), (True, 5, True), (False, 3)):
        got, want = dp.arange(*args, ctx=ctx), torch.arange(*args)
        assert got.dtype == np.int64 and got.numpy().tolist() == want.tolist(), args
    start = dp.Tensor.from_numpy(ctx, np.array(-3, np.int64))
    end = dp.Tensor.from_numpy(ctx, np.array(4.5, np.float32))
    np.testing.assert_allclose(F.linspace(start, end, 7, ctx=ctx).numpy(),
                               torch.linspace(torch.tensor(-3), torch.tensor(4.5), 7).numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(F.linspace(0.5, end, 3, ctx=ctx).numpy(), [0.5, 2.5, 4.5])
    with pytest.raises(dp.ShapeError, match="0-d tensor"):
        F.linspace(dp.Tensor.from_numpy(ctx, np.zeros(2, np.float32)), 1, 3, ctx=ctx)


# ---- embedding / embedding_bag / one_hot ------------------------------------------------------

@pytest.mark.parametrize("padding_idx,width", [(None, 5), (3, 5), (-1, 5), (None, 8)])
def test_embedding_and_its_gradient(ctx, rng, index_add_algo, padding_idx, width):
    w = random(rng, (12, width))
    index = rng.integers(0, 12, (4, 9))
    W, WR = t_(ctx, w, True), ref(w, True)
    poison_pool(ctx)
    out = F.embedding(t_(ctx, index), W, padding_idx=padding_idx)
    out_ref = TF.embedding(torch.tensor(index), WR, padding_idx=padding_idx)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(W, WR)])


def test_embedding_max_norm_renorms_the_weight(ctx, rng):
    w = random(rng, (10, 6), -2, 2)
    index = np.array([[1, 4, 4], [9, 1, 0]])
    for norm_type in (2.0, 1.0):
        W, WR = t_(ctx, w), torch.tensor(w)
        out = F.embedding(t_(ctx, index), W, max_norm=1.5, norm_type=norm_type)
        out_ref = TF.embedding(torch.tensor(index), WR, max_norm=1.5, norm_type=norm_type)
        assert_close(out.numpy(), out_ref.numpy())
        assert_close(W.numpy(), WR.numpy())


def test_embedding_refusals(ctx, rng):
    W = t_(ctx, random(rng, (5, 3)))
    index = t_(ctx, np.array([0, 1]))
    with pytest.raises(dp.UnsupportedError, match="scale_grad_by_freq"):
        F.embedding(index, W, scale_grad_by_freq=True)
    with pytest.raises(dp.UnsupportedError, match="sparse"):
        F.embedding(index, W, sparse=True)
    with pytest.raises(dp.DTypeError, match="int64"):
        F.embedding(t_(ctx, np.array([0.0], np.float32)), W)
    with pytest.raises(dp.ShapeError, match="padding_idx"):
        F.embedding(index, W, padding_idx=5)
    with pytest.raises(dp.ShapeError, match="2-d"):
        F.embedding(index, t_(ctx, random(rng, (5,))))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_offsets(ctx, rng, index_add_algo, mode):
    w = random(rng, (15, 4))
    index = rng.integers(0, 15, 20)
    offsets = np.array([0, 3, 3, 11, 19])          # an empty bag
    W, WR = t_(ctx, w, True), ref(w, True)
    for include_last, padding_idx in ((False, None), (True, 2)):
        W.grad, WR.grad = None, None
        poison_pool(ctx)
        out = F.embedding_bag(t_(ctx, index), W, t_(ctx, offsets), mode=mode,
                              include_last_offset=include_last, padding_idx=padding_idx)
        out_ref = TF.embedding_bag(torch.tensor(index), WR, torch.tensor(offsets), mode=mode,
                                   include_last_offset=include_last, padding_idx=padding_idx)
        assert_close(out.numpy(), out_ref.detach().numpy())
        backward_check(ctx, rng, out, out_ref, [(W, WR)])


def test_embedding_bag_2d_and_per_sample_weights(ctx, rng):
    w = random(rng, (9, 3))
    index = rng.integers(0, 9, (4, 5))
    psw = random(rng, (4, 5))
    W, WR = t_(ctx, w, True), ref(w, True)
    P, PR = t_(ctx, psw, True), ref(psw, True)
    out = F.embedding_bag(t_(ctx, index), W, mode="sum", per_sample_weights=P, padding_idx=4)
    out_ref = TF.embedding_bag(torch.tensor(index), WR, mode="sum", per_sample_weights=PR,
                               padding_idx=4)
    assert_close(out.numpy(), out_ref.detach().numpy())
    backward_check(ctx, rng, out, out_ref, [(W, WR), (P, PR)])
    flat, offsets = index.reshape(-1), np.array([0, 2, 2, 9])
    P, PR = t_(ctx, psw.reshape(-1), True), ref(psw.reshape(-1), True)
    out = F.embedding_bag(t_(ctx, flat), t_(ctx, w), t_(ctx, offsets), mode="sum",
                          per_sample_weights=P)
    out_ref = TF.embedding_bag(torch.tensor(flat), ref(w), torch.tensor(offsets), mode="sum",
                               per_sample_weights=PR)
    backward_check(ctx, rng, out, out_ref, [(P, PR)])
    with pytest.raises(dp.UnsupportedError, match="mode='sum'"):
        F.embedding_bag(t_(ctx, index), W, mode="mean", per_sample_weights=t_(ctx, psw))
    with pytest.raises(dp.ShapeError, match="offsets"):
        F.embedding_bag(t_(ctx, index[0]), W)
    with pytest.raises(dp.UnsupportedError, match="mode"):
        F.embedding_bag(t_(ctx, index), W, mode="median")


def test_one_hot(ctx, rng):
    index = rng.integers(0, 6, (3, 4))
    for classes in (-1, 8):
        np.testing.assert_array_equal(F.one_hot(t_(ctx, index), classes).numpy(),
                                      TF.one_hot(torch.tensor(index), classes).numpy())
    with pytest.raises(dp.ShapeError, match="empty"):
        F.one_hot(t_(ctx, np.zeros(0, np.int64)))


# ---- out of range, refusals, empty tensors --------------------------------------------------------

def test_out_of_range_indices_raise_at_the_next_synchronization(ctx, rng):
    x = t_(ctx, random(rng, (3, 4)))
    bad = t_(ctx, np.array([[0, 4, 1, -1]] * 3))
    calls = [lambda: F.gather(x, 1, bad), lambda: F.index_select(x, 0, t_(ctx, np.array([3]))),
             lambda: F.embedding(t_(ctx, np.array([7])), x),
             lambda: F.scatter_add(x, 1, bad, x), lambda: F.scatter(x, 1, bad, x),
             lambda: F.index_add(x, 0, t_(ctx, np.array([0, -2, 1])), t_(ctx, random(rng, (3, 4)))),
             lambda: F.one_hot(t_(ctx, np.array([0, 5])), 3)]
    for call in calls:
        out = call()
        with pytest.raises(dp.ShapeError, match="out of range"):
            out.numpy()
        out.numpy()       # reported once


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_repeated_embedding_backward_replays_its_plan(ctx, rng, padding_idx):
    """The weight gradient's launches (zero fill, index sort, sorted adds) replay on a repeated
    backward: new indices, gradients and a poisoned pool give the right sums (duplicates
    included), the padding row zero, and no program is built."""
    table = random(rng, (40, 12))
    W = t_(ctx, table)
    W.requires_grad_(True)
    for step in range(3):
        idx = rng.integers(0, 40, (5, 7))
        idx[0, :3] = 3                                  # duplicates, and the padding row
        g = random(rng, (5, 7, 12))
        before = dict(program.stats)
        poison_pool(ctx)
        W.grad = None
        F.embedding(t_(ctx, idx), W, padding_idx=padding_idx).backward(t_(ctx, g))
        ref = np.zeros((40, 12))
        np.add.at(ref, idx.reshape(-1), g.reshape(-1, 12).astype(np.float64))
        if padding_idx is not None:
            ref[padding_idx] = 0
        assert_close(W.grad.numpy(), ref)
        if step:
            assert dict(program.stats) == before


def test_first_indexing_plan_does_not_reset_the_range_flag(rng):
    """The context's range flag is made on the first indexing call, outside the plan that call
    records: a replay launches the selection alone, and an error set by another call before it
    is still raised at the next synchronization."""
    from dlprim_py import launch
    ctx = dp.Context()                        # no flag yet
    x = t_(ctx, random(rng, (6, 4)))
    idx = t_(ctx, np.array([1, 5, 0]))
    F.embedding(idx, x)                       # records the plan, makes the flag
    with launch.kernel_events() as events:
        out = F.embedding(idx, x)
    ctx.queue.finish()
    assert len(events) == 1
    np.testing.assert_array_equal(out.numpy(), x.numpy()[[1, 5, 0]])
    F.gather(x, 1, t_(ctx, np.array([[0, 4, 1, 2]] * 6)))    # sets the flag
    F.embedding(idx, x)                       # a replay: must leave it set
    with pytest.raises(dp.ShapeError, match="out of range"):
        out.numpy()


def test_repeated_gather_replays_its_launch(ctx, rng):
    """A gather that repeats an earlier call's shapes, dtypes, offsets and dim replays that
    call's launch: on other data, each result right, with the gradient; an index out of range
    in a replayed call still raises at the next synchronization; an input larger than the index
    (narrowed first) and a new offset are calls of their own."""
    from dlprim_py import launch
    for _ in range(3):
        x = random(rng, (5, 12))
        index = rng.integers(0, 12, (5, 8))
        X, XR = t_(ctx, x, True), ref(x, True)
        out = F.gather(X, -1, t_(ctx, index))
        np.testing.assert_array_equal(out.numpy(), np.take_along_axis(x, index, -1))
        backward_check(ctx, rng, out, torch.gather(XR, -1, torch.from_numpy(index)), [(X, XR)])
    # The first call of a shape records the plan: its repeats build and create nothing.
    Y = t_(ctx, random(rng, (3, 7)), True)
    J = t_(ctx, rng.integers(0, 7, (3, 5)))
    G = t_(ctx, np.ones((3, 5), np.float32))

    def run():
        F.gather(Y, 1, J).backward(G)
        Y.grad = None

    assert_repeats_build_nothing(ctx, run)
    X = t_(ctx, random(rng, (5, 12)))
    I = t_(ctx, rng.integers(0, 12, (5, 8)))
    F.gather(X, -1, I)
    with launch.kernel_events() as events:
        F.gather(X, -1, I)
    ctx.queue.finish()
    assert len(events) == 1
    bad = rng.integers(0, 12, (5, 8))
    bad[2, 3] = 12
    out = F.gather(X, -1, t_(ctx, bad))
    with pytest.raises(dp.ShapeError, match="out of range"):
        out.numpy()
    wide = random(rng, (7, 12))
    np.testing.assert_array_equal(F.gather(t_(ctx, wide), 1, I).numpy(),
                                  np.take_along_axis(wide[:5], I.numpy(), 1))
    whole = random(rng, (5 * 12 + 3,))
    base = t_(ctx, whole)
    shifted = dp.Tensor(ctx, base.buffer, (5, 12), dtype=base.dtype, offset=base.offset + 4 * 3)
    np.testing.assert_array_equal(F.gather(shifted, 1, I).numpy(),
                                  np.take_along_axis(whole[3:].reshape(5, 12), I.numpy(), 1))


def test_refusals(ctx, rng):
    x = t_(ctx, random(rng, (3, 4)))
    index = t_(ctx, np.array([[0, 1]]))
    with pytest.raises(dp.DTypeError, match="int64"):
        F.gather(x, 1, t_(ctx, np.array([[0, 1]], np.float32)))
    with pytest.raises(dp.ShapeError, match="dimensions"):
        F.gather(x, 1, t_(ctx, np.array([0, 1])))
    with pytest.raises(dp.ShapeError, match="larger"):
        F.gather(x, 1, t_(ctx, np.zeros((4, 1), np.int64)))
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.gather(x, 2, index)
    with pytest.raises(dp.UnsupportedError, match="reduce"):
        F.scatter(x, 1, index, x, reduce="add")
    with pytest.raises(dp.DTypeError, match="dtype"):
        F.scatter_add(x, 1, index, t_(ctx, np.zeros((3, 4), np.int64)))
    with pytest.raises(dp.ShapeError, match="vector"):
        F.index_select(x, 0, index)
    with pytest.raises(dp.ShapeError, match="source must have shape"):
        F.index_add(x, 0, t_(ctx, np.array([0, 1])), x)
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.gather(np.zeros((3, 4)), 1, index)


def test_empty_tensors(ctx, rng):
    x = t_(ctx, random(rng, (3, 4)))
    empty_index = t_(ctx, np.zeros((3, 0), np.int64))
    assert F.gather(x, 1, empty_index).shape == (3, 0)
    assert F.index_select(x, 1, t_(ctx, np.zeros(0, np.int64))).shape == (3, 0)
    np.testing.assert_array_equal(F.scatter_add(x, 1, empty_index, x).numpy(), x.numpy())
    assert F.embedding(t_(ctx, np.zeros((2, 0), np.int64)), x).shape == (2, 0, 4)
    assert F.tril(t_(ctx, np.zeros((0, 3), np.float32))).shape == (0, 3)
    assert dp.arange(0, ctx=ctx).shape == (0,)


# ---- repeated calls ------------------------------------------------------------------------------

def test_repeated_calls_build_nothing(ctx, rng, index_add_algo):
    x = t_(ctx, random(rng, (4, 6)), True)
    w = t_(ctx, random(rng, (10, 3)), True)
    index = t_(ctx, rng.integers(0, 6, (4, 6)))
    vec = t_(ctx, rng.integers(0, 4, 40))
    words = t_(ctx, rng.integers(0, 10, (3, 4)))
    mask = t_(ctx, rng.random((4, 6)) > 0.5)

    def run():
        y = (F.gather(x, 1, index) + F.scatter_add(x, 1, index, x) + F.scatter(x, 1, index, 1.0)
             + F.where(mask, x, 0.0) + F.masked_fill(x, mask, 2.0) + F.triu(x, 1))
        z = F.index_select(x, 0, vec).sum() + F.embedding(words, w).sum() + \
            F.embedding_bag(words, w, mode="mean").sum()
        (y.sum() + z).backward()
        F.isin(index, vec), F.isnan(x), F.count_nonzero(x, 1), F.one_hot(vec, 4)
        dp.arange(7, ctx=ctx), dp.linspace(0, 1, 5, ctx=ctx)
        x.grad = w.grad = None

    assert_repeats_build_nothing(ctx, run)


def test_a_user_rule_chooses_the_index_add_solver(ctx, rng, tuning_rules):
    """The rules choose "loop" for a short index and "sorted" otherwise; a rule of a user
    database for this device overrides them, and "sorted" forced where it is chosen anyway
    gives the same numbers."""
    from dlprim_py.ops.indexing import _index_add_algorithm
    assert _index_add_algorithm(ctx, 8, 5, 3, None) == "loop"
    assert _index_add_algorithm(ctx, 100, 5, 3, None) == "sorted"
    tuning_rules("index_add", [{"when": {}, "params": {"solver": "loop"}}])
    dp.config.reload()
    assert _index_add_algorithm(ctx, 100, 5, 3, None) == "loop"
    x, src, index = random(rng, (5, 3)), random(rng, (100, 3)), rng.integers(0, 5, 100)
    looped = F.index_add(t_(ctx, x), 0, t_(ctx, index), t_(ctx, src)).numpy()
    assert _index_add_algorithm(ctx, 100, 5, 3, "sorted") == "sorted"
    expected = x.astype(np.float64)
    np.add.at(expected, index, src)
    assert_close(looped, expected)


def test_repeated_selections_replay_their_plan(ctx, rng, monkeypatch):
    """A repeated index_select / embedding with the same shapes, dtypes and offsets replays the
    first call's launch with only its buffers bound: new tables, new indices and outputs from a
    poisoned pool all give the right rows, an out-of-range index still raises at the next
    synchronization, and arguments the first call refused are refused again."""
    from dlprim_py.ops import indexing as ix
    for _ in range(3):
        table = random(rng, (50, 7))
        idx = rng.integers(0, 50, (4, 9))
        W, I = t_(ctx, table), t_(ctx, idx)
        poison_pool(ctx)
        np.testing.assert_array_equal(F.embedding(I, W).numpy(), table[idx])
        poison_pool(ctx)
        flat = t_(ctx, idx.reshape(-1))
        np.testing.assert_array_equal(F.index_select(W, 0, flat).numpy(), table[idx.reshape(-1)])
        np.testing.assert_array_equal(F.index_select(W, 1, t_(ctx, np.array([6, 0, 6]))).numpy(),
                                      table[:, [6, 0, 6]])
    # Repeated calls check nothing again and build nothing.
    checked = []
    monkeypatch.setattr(ix, "_check_weight", lambda *a: checked.append(a))
    monkeypatch.setattr(ix, "_check_vector_index", lambda *a: checked.append(a))
    before = dict(program.stats)
    F.embedding(I, W), F.index_select(W, 0, flat)
    assert dict(program.stats) == before and not checked
    monkeypatch.undo()
    bad = t_(ctx, np.full((4, 9), 50))
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.embedding(bad, W).numpy()
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.index_select(W, 0, t_(ctx, np.full(36, -1))).numpy()
    F.embedding(I, W, padding_idx=1)
    with pytest.raises(dp.DTypeError, match="padding_idx"):
        F.embedding(I, W, padding_idx=True)
    F.index_select(W, 1, t_(ctx, np.array([6, 0, 6])))
    with pytest.raises(dp.ShapeError, match="dim must be an int"):
        F.index_select(W, True, t_(ctx, np.array([6, 0, 6])))
    # int32 indices take the checked path on every call (converted first).
    np.testing.assert_array_equal(F.embedding(t_(ctx, idx.astype(np.int32)), W).numpy(),
                                  table[idx])
