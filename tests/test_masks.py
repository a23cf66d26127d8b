"""Bool tensors (masks): the dtype, comparisons, logical operators, any/all/sum of masks and the
casts, against numpy on seeded data; refusals; repeated calls building nothing."""
import numpy as np
import pyopencl as cl
import pytest

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import program

from conftest import random

OPS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
       "gt": np.greater, "ge": np.greater_equal}
SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
# What the comparison with the operands swapped is (2 < t is t > 2).
SWAPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
POISON = 0xA5


def ties(rng, shape, nan=True):
    """float32 data with many equal values (a few distinct halves) and, with ``nan``, NaNs."""
    x = (rng.integers(-3, 4, size=shape) / 2).astype(np.float32)
    if nan and x.size:
        x.reshape(-1)[rng.random(x.size) < 0.15] = np.nan
    return x


def raw(t):
    """The bytes of a bool tensor as uint8 (a kernel must write 0 or 1, nothing else)."""
    out = np.empty(t.shape, np.uint8)
    if out.size:
        cl.enqueue_copy(t.ctx.queue, out, t.buffer, src_offset=t.offset, is_blocking=True)
    return out


def poisoned_mask(ctx, shape):
    """A bool tensor whose bytes are POISON (neither 0 nor 1)."""
    t = dp.Tensor.empty(ctx, shape, dp.bool)
    if t.size:
        cl.enqueue_copy(ctx.queue, t.buffer, np.full(t.size, POISON, np.uint8),
                        dst_offset=t.offset, is_blocking=True)
    return t


def check_mask(t, ref):
    """``t`` is a bool tensor of ``ref``'s shape holding exactly ``ref`` as 0/1 bytes."""
    assert t.dtype == dp.bool and t.shape == ref.shape
    assert not t.requires_grad and t.grad_fn is None
    np.testing.assert_array_equal(raw(t), ref.astype(np.uint8))


def t_(ctx, array, **kwargs):
    return dp.Tensor.from_numpy(ctx, array, **kwargs)


@pytest.fixture(params=[None, "scalar"])
def algorithm(request, monkeypatch):
    """The pointwise solver the tuning rules choose ("vector" where it applies), and "scalar"
    forced."""
    if request.param is not None:
        monkeypatch.setenv("DLPRIM_POINTWISE_ALGO", request.param)
    dp.config.reload()
    return request.param


# ---- the dtype ---------------------------------------------------------------------------

def test_bool_dtype_round_trips(ctx, rng):
    assert dp.bool == np.dtype(np.bool_) and dp.bool_ is dp.bool
    a = rng.random((3, 5)) < 0.5
    t = t_(ctx, a)
    assert t.dtype == dp.bool and t.nbytes == 15
    out = t.numpy()
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(np.asarray(t), a)
    assert t.tolist() == a.tolist()
    assert t[1, 2].item() is bool(a[1, 2])
    assert "dtype=bool" in repr(t) and "True" in repr(t)
    assert dp.Tensor.full(ctx, (4,), True, dp.bool).numpy().all()
    assert not dp.Tensor.zeros(ctx, (4,), bool).numpy().any()
    assert dp.Tensor.empty(ctx, (2,), np.bool_).dtype == dp.bool
    filled = dp.Tensor.empty(ctx, (3,), dp.bool).fill_(np.True_)
    np.testing.assert_array_equal(raw(filled), [1, 1, 1])
    with pytest.raises(dp.DTypeError, match="floating point"):
        t_(ctx, a, requires_grad=True)


def test_bool_tensors_move_like_others(ctx, rng):
    """Views and copies (reshape, indexing, permute, cat, pad, narrow) work on masks."""
    a = rng.random((2, 3, 4)) < 0.5
    t = t_(ctx, a)
    np.testing.assert_array_equal(t.reshape(6, 4).numpy(), a.reshape(6, 4))
    np.testing.assert_array_equal(t[1].numpy(), a[1])
    np.testing.assert_array_equal(t[:, 1:3].numpy(), a[:, 1:3])
    np.testing.assert_array_equal(F.permute(t, (2, 0, 1)).numpy(), a.transpose(2, 0, 1))
    np.testing.assert_array_equal(F.cat([t, t], dim=2).numpy(), np.concatenate([a, a], axis=2))
    np.testing.assert_array_equal(F.pad(t, (1, 2)).numpy(), np.pad(a, ((0, 0), (0, 0), (1, 2))))
    np.testing.assert_array_equal(F.narrow(t, 2, 1, 2).numpy(), a[:, :, 1:3])
    np.testing.assert_array_equal(t.clone().numpy(), a)


# ---- comparisons -------------------------------------------------------------------------

@pytest.mark.parametrize("a_shape, b_shape", [
    ((37,), (37,)),                # one dimension: vector groups and a tail
    ((3, 5, 8), (5, 1)),           # broadcast
    ((1, 8), (6, 1)),              # both broadcast
    ((4, 1, 3), ()),               # a 0-d tensor
    ((0, 3), (1, 3)),              # empty
])
def test_comparison_matches_numpy(ctx, rng, algorithm, a_shape, b_shape):
    a, b = ties(rng, a_shape), ties(rng, b_shape)
    ta, tb = t_(ctx, a, requires_grad=True), t_(ctx, b)
    for op, reference in OPS.items():
        ref = reference(a, b)
        check_mask(getattr(F, op)(ta, tb), ref)
        check_mask(eval(f"ta {SYMBOLS[op]} tb"), ref)
        out = poisoned_mask(ctx, ref.shape)
        assert getattr(F, op)(ta, tb, out=out) is out
        check_mask(out, ref)


def test_nan_compares_as_torch(ctx):
    x = t_(ctx, np.array([np.nan, 1.0, np.nan], np.float32))
    y = t_(ctx, np.array([np.nan, np.nan, 2.0], np.float32))
    check_mask(x == x, np.array([False, True, False]))
    check_mask(x != x, np.array([True, False, True]))
    for result in (x < y, x <= y, x > y, x >= y, x < 5.0, x >= -np.inf):
        assert not result.numpy()[[0, 2]].any()
    check_mask(x == float("nan"), np.zeros(3, bool))
    check_mask(x != float("nan"), np.ones(3, bool))


@pytest.mark.parametrize("number", [0.5, -1, 2, 0, float("inf"), np.float32(1.5), np.int64(-1)])
def test_comparison_with_a_number_on_either_side(ctx, rng, number):
    a = ties(rng, (5, 7))
    ta = t_(ctx, a)
    for op, reference in OPS.items():
        ref = reference(a, np.float32(number))
        check_mask(getattr(F, op)(ta, number), ref)
        check_mask(eval(f"ta {SYMBOLS[op]} number"), ref)
        # Reflected: Python makes number < ta ta > number; the functional form takes it as is.
        check_mask(eval(f"number {SYMBOLS[op]} ta"), reference(np.float32(number), a))
        check_mask(getattr(F, op)(number, ta), reference(np.float32(number), a))
        check_mask(getattr(F, SWAPPED[op])(number, ta), ref)


def _promoted(a, b):
    """torch's dtype for comparing numpy arrays ``a`` and ``b`` (bool < int < float)."""
    kind = {"b": 0, "i": 1, "f": 2}
    if kind[a.dtype.kind] != kind[b.dtype.kind]:
        return (a if kind[a.dtype.kind] > kind[b.dtype.kind] else b).dtype
    return max(a.dtype, b.dtype, key=lambda d: d.itemsize)


@pytest.mark.parametrize("a_dtype, b_dtype", [
    (np.int32, np.int32), (np.int64, np.int64), (np.bool_, np.bool_), (np.int32, np.int64),
    (np.int64, np.float32), (np.bool_, np.float32), (np.bool_, np.int32), (np.float32, np.int32),
])
@pytest.mark.parametrize("op", ["eq", "lt"])
def test_comparison_promotes_dtypes_as_torch(ctx, rng, op, a_dtype, b_dtype):
    a = rng.integers(-2, 3, size=(4, 6)).astype(a_dtype)
    b = rng.integers(-2, 3, size=(6,)).astype(b_dtype)
    if a_dtype is np.int64:
        a[0, 0] = 2 ** 40 + 1          # exact in int64, rounds in float32
    if b_dtype is np.float32:
        b[0] = 2.0 ** 40
    common = _promoted(a, b)
    ref = OPS[op](a.astype(common), b.astype(common))
    check_mask(getattr(F, op)(t_(ctx, a), t_(ctx, b)), ref)


def test_comparison_of_integers_with_numbers(ctx, rng):
    i = rng.integers(-3, 4, size=(17,)).astype(np.int32)
    ti = t_(ctx, i)
    check_mask(ti < 0.5, i < 0.5)                    # an int tensor and a float: in float32
    check_mask(ti >= 2, i >= 2)
    check_mask(ti < 2 ** 40, np.ones(17, bool))    # exact: torch would refuse the number
    check_mask(ti == -(2 ** 40), np.zeros(17, bool))
    big = t_(ctx, np.array([2 ** 40 + 1, -5, 2 ** 62], np.int64))
    check_mask(big == 2 ** 40 + 1, np.array([True, False, False]))
    check_mask(big > 2 ** 62 - 1, np.array([False, False, True]))
    m = t_(ctx, np.array([True, False, True]))
    check_mask(m == True, np.array([True, False, True]))  # noqa: E712
    check_mask(m == 1, np.array([True, False, True]))
    check_mask(m == 2, np.zeros(3, bool))
    check_mask(m < 0.5, np.array([False, True, False]))
    check_mask(1 > m, np.array([False, True, False]))
    with pytest.raises(dp.DTypeError, match="int64"):
        ti < 2 ** 70


def test_comparisons_record_no_gradient(ctx, rng):
    x = t_(ctx, random(rng, (3, 4)), requires_grad=True)
    y = t_(ctx, random(rng, (4,)), requires_grad=True)
    for result in (x < y, x == 0.5, 0.5 > x, F.ge(x, y), F.logical_and(x, y), F.logical_not(x),
                   x.bool(), x.any(), x.all(), (x > 0).sum()):
        assert not result.requires_grad and result.grad_fn is None
    # A mask used as a weight: the gradient flows through the float operand only.
    loss = F.sum(x * (x > 0).float())
    loss.backward()
    np.testing.assert_array_equal(x.grad.numpy(), (x.numpy() > 0).astype(np.float32))


def test_comparison_refusals(ctx, rng):
    x = t_(ctx, random(rng, (3, 4)))
    with pytest.raises(dp.ShapeError, match="broadcast"):
        x < t_(ctx, random(rng, (5,)))
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.eq(x, x, out=dp.Tensor.empty(ctx, (4, 3), dp.bool))
    with pytest.raises(dp.DTypeError, match="bool"):
        F.eq(x, x, out=dp.Tensor.empty(ctx, (3, 4)))
    with pytest.raises(dp.DTypeError, match="from_numpy"):
        x == np.zeros((3, 4), np.float32)
    with pytest.raises(dp.DTypeError, match="from_numpy"):
        np.zeros((3, 4), np.float32) < x
    with pytest.raises(dp.DTypeError, match="Tensors or numbers"):
        F.lt(x, "1")
    with pytest.raises(dp.DTypeError, match="at least one operand"):
        F.eq(1.0, 2.0)
    with pytest.raises(TypeError):
        x < "1"
    with pytest.raises(TypeError):
        x < None
    # == and != with something that is no operand are Python's identity answers, as torch's.
    assert (x == None) is False and (x != "x") is True  # noqa: E711


@pytest.mark.parametrize("dtype", [dp.float16, dp.bfloat16])
def test_16bit_comparisons_on_any_device(ctx, dtype):
    """16-bit tensors compare as floats (no cl_khr_fp16 needed); a number rounds to the
    tensor's type first, as in torch."""
    h = dp.Tensor.from_numpy(ctx, np.array([0.1, np.nan, 2.0], np.float32), dtype=dtype)
    check_mask(h == 0.1, np.array([True, False, False]))     # the number rounds to 16 bits
    check_mask(0.1 == h, np.array([True, False, False]))
    check_mask(h != 0.1, np.array([False, True, True]))
    check_mask(h < t_(ctx, np.array([1.0, 1.0, 3.0], np.float32)), np.array([True, False, True]))
    check_mask(h >= h, np.array([True, False, True]))
    check_mask(F.logical_not(h), np.array([False, False, False]))
    check_mask(h.any(), np.array(True))
    z = dp.Tensor.from_numpy(ctx, np.array([0.0, -0.0, 1.0], np.float32), dtype=dtype)
    check_mask(F.logical_not(z), np.array([True, True, False]))
    check_mask(z.all(), np.array(False))


def test_operands_of_two_contexts_are_refused(ctx, rng):
    other = dp.Context(dp.devices()[0][0])
    x = t_(ctx, random(rng, (4,)))
    y = t_(other, random(rng, (4,)))
    with pytest.raises(dp.DeviceError, match="different OpenCL contexts"):
        x == y
    with pytest.raises(dp.DeviceError, match="different OpenCL contexts"):
        F.logical_or(x, y)
    with pytest.raises(dp.DeviceError, match="different OpenCL contexts"):
        F.lt(x, 0.0, out=dp.Tensor.empty(other, (4,), dp.bool))
    with pytest.raises(dp.DeviceError, match="different OpenCL contexts"):
        (x > 0) & (y > 0)


# ---- logical operators -------------------------------------------------------------------

LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or,
           "logical_xor": np.logical_xor}


@pytest.mark.parametrize("a_dtype, b_dtype", [
    (np.bool_, np.bool_), (np.float32, np.float32), (np.int32, np.bool_), (np.int64, np.float32),
])
def test_logical_operators_match_numpy(ctx, rng, a_dtype, b_dtype):
    a = ties(rng, (4, 5, 6), nan=a_dtype is np.float32)
    b = ties(rng, (5, 1), nan=b_dtype is np.float32)
    if a_dtype is not np.float32:
        a = np.nan_to_num(a).astype(a_dtype)
    if b_dtype is not np.float32:
        b = np.nan_to_num(b).astype(b_dtype)
    ta, tb = t_(ctx, a), t_(ctx, b)
    # NaN is nonzero: True, as in torch (and numpy).
    ops = LOGICAL if a_dtype is np.bool_ else {"logical_xor": np.logical_xor}
    for op, reference in ops.items():
        check_mask(getattr(F, op)(ta, tb), reference(a, b))
        out = poisoned_mask(ctx, (4, 5, 6))
        check_mask(getattr(F, op)(ta, tb, out=out), reference(a, b))
        if a_dtype is b_dtype:
            for number in (True, False, 0, 2.5, np.nan):
                check_mask(getattr(F, op)(ta, number), reference(a, number))
                check_mask(getattr(F, op)(number, tb), reference(number, b))


@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int32, np.int64])
def test_logical_not_matches_numpy(ctx, rng, dtype):
    a = ties(rng, (7, 9), nan=dtype is np.float32)
    if dtype is not np.float32:
        a = np.nan_to_num(a).astype(dtype)
    check_mask(F.logical_not(t_(ctx, a)), np.logical_not(a))
    out = poisoned_mask(ctx, a.shape)
    assert F.logical_not(t_(ctx, a), out=out) is out
    check_mask(out, np.logical_not(a))


def test_mask_operators(ctx, rng):
    a, b = rng.random((3, 8)) < 0.5, rng.random((8,)) < 0.5
    ta, tb = t_(ctx, a), t_(ctx, b)
    check_mask(~ta, ~a)
    check_mask(ta & tb, a & b)
    check_mask(ta | tb, a | b)
    check_mask(ta ^ tb, a ^ b)
    check_mask(ta & True, a)
    check_mask(False | ta, a)
    check_mask(np.True_ ^ ta, ~a)
    check_mask(~(ta & ~tb) | (ta ^ tb), ~(a & ~b) | (a ^ b))


def test_mask_operators_refuse_other_dtypes(ctx, rng):
    x = t_(ctx, random(rng, (4,)))
    i = t_(ctx, np.arange(4, dtype=np.int32))
    m = x > 0
    with pytest.raises(dp.DTypeError, match="bool tensor"):
        ~x
    with pytest.raises(dp.DTypeError, match="bool tensor"):
        ~i
    with pytest.raises(dp.DTypeError, match="int32 tensor"):
        i & i
    with pytest.raises(dp.DTypeError, match="float32 tensor"):
        m | x
    with pytest.raises(dp.DTypeError, match="the number 1"):
        m & 1
    with pytest.raises(dp.DTypeError, match="from_numpy"):
        m ^ np.ones(4, bool)
    with pytest.raises(TypeError):
        m & "x"


# ---- reductions of masks -----------------------------------------------------------------

@pytest.mark.parametrize("shape, dim, keepdim", [
    ((3, 1000), 1, False),         # long rows: vector loads, several chunks
    ((3, 1000), 0, True),
    ((4, 5, 6), (0, 2), False),
    ((4, 5, 6), None, False),
    ((100003,), None, False),      # one output from many chunks
    ((0, 4), 0, False),            # over nothing: any False, all True, sum 0
    ((4, 0), 0, True),
])
def test_any_all_sum_of_masks(ctx, rng, shape, dim, keepdim):
    # Rows that are all True and all False, so that any and all differ somewhere.
    a = rng.random(shape) < 0.5
    if a.ndim == 2 and a.shape[0] >= 3:
        a[0], a[1] = True, False
    t = t_(ctx, a)
    axis = dim if dim is None or isinstance(dim, int) else tuple(dim)
    check_mask(t.any(dim, keepdim), np.any(a, axis=axis, keepdims=keepdim))
    check_mask(F.all(t, dim, keepdim), np.all(a, axis=axis, keepdims=keepdim))
    count = t.sum(dim, keepdim)
    assert count.dtype == dp.int64 and not count.requires_grad
    np.testing.assert_array_equal(count.numpy(), np.sum(a, axis=axis, keepdims=keepdim))
    np.testing.assert_array_equal(F.sum(t, dim, keepdim).numpy(),
                                  np.sum(a, axis=axis, keepdims=keepdim))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_any_all_sum_of_numbers(ctx, rng, dtype):
    a = ties(rng, (6, 40), nan=dtype is np.float32)
    if dtype is not np.float32:
        a = np.nan_to_num(a).astype(dtype)
    a[0] = 0
    a[1] = 1
    t = t_(ctx, a)
    check_mask(t.any(1), np.any(a, axis=1))          # NaN counts as nonzero
    check_mask(t.all(1), np.all(a, axis=1))
    check_mask(F.any(t), np.any(a))
    if dtype is not np.float32:
        s = t.sum(0)
        assert s.dtype == dp.int64
        np.testing.assert_array_equal(s.numpy(), a.sum(axis=0, dtype=np.int64))


def test_reductions_refuse_what_they_do_not_compute(ctx, rng):
    m = t_(ctx, rng.random((3, 4)) < 0.5)
    for call in (lambda: m.mean(), lambda: F.amax(m), lambda: m.max(), lambda: m.argmax(),
                 lambda: F.norm(m)):
        with pytest.raises(dp.DTypeError, match="bool"):
            call()
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.any(np.ones(3, bool))
    with pytest.raises(dp.ShapeError):
        m.any(2)


# ---- casts -------------------------------------------------------------------------------

DTYPES = [np.float32, np.int32, np.int64, np.bool_]


def _reference_cast(a, dtype):
    if dtype is np.bool_:
        return a != 0
    if a.dtype.kind == "f" and np.dtype(dtype).kind == "i":
        return np.trunc(a).astype(dtype)
    return a.astype(dtype)


@pytest.mark.parametrize("source", DTYPES)
@pytest.mark.parametrize("target", DTYPES)
def test_casts_match_numpy(ctx, rng, source, target):
    a = (rng.integers(-4, 5, size=(5, 9)) * rng.choice([0.75, 1.0], size=(5, 9)))
    a = a.astype(source) if source is not np.bool_ else a > 0
    t = t_(ctx, a)
    out = t.to(target)
    if source is target:
        assert out is t
    assert out.dtype == np.dtype(target) and out.shape == a.shape
    ref = _reference_cast(a, target)
    if target is np.bool_:
        check_mask(out, ref)
    else:
        np.testing.assert_array_equal(out.numpy(), ref)


def test_cast_methods_and_edge_values(ctx):
    x = t_(ctx, np.array([1.7, -1.7, np.nan, np.inf, -np.inf, 3e9, -0.0, 1e-30], np.float32))
    check_mask(x.bool(), np.array([True, True, True, True, True, True, False, True]))
    i = x.int()
    assert i.dtype == dp.int32
    # Toward zero; NaN to 0; out of range saturated (defined on every device).
    np.testing.assert_array_equal(i.numpy(), [1, -1, 0, 2 ** 31 - 1, -2 ** 31, 2 ** 31 - 1, 0, 0])
    np.testing.assert_array_equal(x.long().numpy(),
                                  [1, -1, 0, 2 ** 63 - 1, -2 ** 63, 3000000000, 0, 0])
    big = t_(ctx, np.array([2 ** 40 + 3, -(2 ** 33) - 1, 16777217], np.int64))
    np.testing.assert_array_equal(big.int().numpy(),
                                  np.array([2 ** 40 + 3, -(2 ** 33) - 1, 16777217]).astype(np.int32))
    np.testing.assert_array_equal(big.float().numpy(), np.array([2 ** 40, -(2 ** 33), 16777216],
                                                                np.float32))
    m = t_(ctx, np.array([True, False]))
    assert m.float().dtype == dp.float32 and m.float().numpy().tolist() == [1.0, 0.0]
    assert m.long().numpy().tolist() == [1, 0] and m.bool() is m
    assert t_(ctx, np.zeros((0, 3), np.float32)).bool().shape == (0, 3)
    with pytest.raises(dp.DTypeError, match="not supported"):
        x.to(np.float64)
    with pytest.raises(dp.DTypeError, match="not a dtype"):
        x.to("no such type")


def test_bool_and_one_element_tensors(ctx, rng):
    """A one-element tensor has a truth value; a larger one's is ambiguous (ShapeError), as in
    torch; tensors stay hashable by identity."""
    x = t_(ctx, np.array([1.0, 2.0, 3.0], np.float32))
    assert bool(x[1:2] == 2.0) and not bool(x[0:1] == 2.0)
    assert (x > 0).all() and not (x > 2).all() and (x > 2).any()
    with pytest.raises(dp.ShapeError, match="ambiguous"):
        bool(x == x)
    with pytest.raises(dp.ShapeError, match="ambiguous"):
        bool(dp.Tensor.empty(ctx, (0,)))
    y = x.clone()
    table = {x: "x", y: "y"}
    assert table[x] == "x" and table[y] == "y" and len({x, y, x}) == 2
    assert hash(x) != hash(y) and x in [x] and x in {x}


# ---- operators that take no bool -----------------------------------------------------------

def _refusals(ctx):
    m4 = t_(ctx, np.ones((2, 3, 4, 4), bool))
    m2 = t_(ctx, np.ones((3, 4), bool))
    w = t_(ctx, np.ones((3, 3, 3, 3), np.float32))
    target = t_(ctx, np.array([0, 1, 2]))
    return {
        "add": lambda: m2 + m2, "add_number": lambda: m2 + 1.0, "mul": lambda: m2 * m2,
        "neg": lambda: -m2, "rsub": lambda: 1.0 - m2, "maximum": lambda: F.maximum(m2, m2),
        "relu": lambda: F.relu(m2), "sigmoid": lambda: F.sigmoid(m2), "abs": lambda: F.abs(m2),
        "softmax": lambda: F.softmax(m2, 1), "log_softmax": lambda: F.log_softmax(m2, 1),
        "cross_entropy": lambda: F.cross_entropy(m2, target),
        "mse_loss": lambda: F.mse_loss(m2, m2), "dropout": lambda: F.dropout(m2, 0.5),
        "conv2d": lambda: F.conv2d(m4, w), "max_pool2d": lambda: F.max_pool2d(m4, 2),
        "avg_pool2d": lambda: F.avg_pool2d(m4, 2),
        "batch_norm": lambda: F.batch_norm(m4, None, None, training=True),
        "layer_norm": lambda: F.layer_norm(m4, (4,)),
        "interpolate": lambda: F.interpolate(m4, scale_factor=2),
        "linear": lambda: F.linear(m2, t_(ctx, np.ones((5, 4), np.float32))),
        "gemm": lambda: dp.gemm(m2, t_(ctx, np.ones((4, 5), bool))),
        "matmul": lambda: m2 @ t_(ctx, np.ones((4, 5), bool)),
        "mean": lambda: F.mean(m2), "amax": lambda: F.amax(m2),
        "requires_grad": lambda: m2.requires_grad_(),
    }


REFUSALS = ("add", "add_number", "mul", "neg", "rsub", "maximum", "relu", "sigmoid", "abs",
            "softmax", "log_softmax", "cross_entropy", "mse_loss", "dropout", "conv2d",
            "max_pool2d", "avg_pool2d", "batch_norm", "layer_norm", "interpolate", "linear",
            "gemm", "matmul", "mean", "amax", "requires_grad")


@pytest.mark.parametrize("name", REFUSALS)
def test_operators_refuse_bool_input(ctx, name):
    with pytest.raises(dp.DTypeError, match="bool"):
        _refusals(ctx)[name]()


# ---- the hot path ------------------------------------------------------------------------

def _mask_cases(ctx, rng):
    x = t_(ctx, ties(rng, (4, 6, 8)), requires_grad=True)
    y = t_(ctx, ties(rng, (6, 1)))
    i = t_(ctx, rng.integers(-3, 4, size=(6, 8)).astype(np.int64))
    m = x > 0
    return {
        "compare": lambda: (x == y, x != x, F.lt(x, y), x <= 0.5, 1 > x, F.ge(2, x), i < 2,
                            i == x),
        "logical": lambda: (F.logical_and(x, y), F.logical_or(m, True), F.logical_xor(i, m),
                            F.logical_not(x)),
        "operators": lambda: (~m, m & (y > 0), m | True, False ^ m),
        "reductions": lambda: (m.any(), m.all(1), m.sum(), F.sum(m, (0, 2)), i.sum(1)),
        "casts": lambda: (x.bool(), m.float(), i.int(), x.long(), m.to(dp.int64)),
    }


@pytest.mark.parametrize("name", ["compare", "logical", "operators", "reductions", "casts"])
def test_repeated_call_builds_nothing(ctx, rng, name):
    """After one call (which builds), repeated calls render, build and create nothing."""
    run = _mask_cases(ctx, rng)[name]
    run()
    before = dict(program.stats)
    run()
    run()
    ctx.synchronize()
    assert dict(program.stats) == before, f"{name}: {before} -> {dict(program.stats)}"


def test_numerics_checks_pass_masks(ctx, monkeypatch):
    """DLPRIM_CHECK_NUMERICS checks floating point outputs: a mask from NaN inputs passes."""
    monkeypatch.setenv("DLPRIM_CHECK_NUMERICS", "1")
    dp.config.reload()
    try:
        x = t_(ctx, np.array([np.nan, 1.0], np.float32))
        check_mask(F.eq(x, x), np.array([False, True]))
        check_mask(F.any(x), np.array(True))
    finally:
        monkeypatch.delenv("DLPRIM_CHECK_NUMERICS")
        dp.config.reload()
