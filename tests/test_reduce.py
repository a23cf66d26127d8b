"""The broadcast + reduce generator and the reductions, against torch CPU float64."""
import zlib

import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py.ops import reduce as R
from dlprim_py.ops.reduce import ReduceKernel

from conftest import assert_close, assert_repeats_build_nothing, poisoned, random

F = dp.functional


def _torch(a, requires_grad=False):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


# ---- the generator -----------------------------------------------------------------------

WEIGHTED = ReduceKernel("test_weighted_sum_sq", [("x", np.float32), ("w", np.float32)],
                        [("y", np.float32)], "float d = x * w; y = d * d;", "sum",
                        finalize="acc_y = acc_y * scale;", scalars=[("scale", np.float32)])


@pytest.mark.parametrize("variant", ["group", "item"])
@pytest.mark.parametrize("x_shape, w_shape, out_shape", [
    ((5, 7, 9), (7, 1), (1, 7, 1)),          # reduce outer and inner, weight broadcast
    ((33, 3), (1, 3), (3,)),                 # outermost, output aligned to the right
    ((2, 3, 4, 5), (3, 1, 5), (2, 1, 4, 1)), # alternating kept and reduced
    ((1,), (1,), (1,)),                      # one element
    ((6, 1, 5), (1, 4, 1), (1,)),            # everything, broadcast on both sides
    ((300, 257), (257,), (1, 257)),          # several chunks of partials
])
def test_generator_against_numpy(ctx, rng, variant, x_shape, w_shape, out_shape):
    x, w = random(rng, x_shape), random(rng, w_shape)
    out = poisoned(ctx, out_shape)
    WEIGHTED([dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w)], [out], [0.5],
             variant=variant)
    full = np.broadcast_shapes(x_shape, w_shape)
    aligned = (1,) * (len(full) - len(out_shape)) + out_shape
    axes = tuple(k for k in range(len(full)) if aligned[k] == 1)
    d = x.astype(np.float64) * w
    ref = 0.5 * (d * d).sum(axis=axes, keepdims=True).reshape(out_shape)
    assert_close(out.numpy(), ref)


def test_generator_axes_and_offsets(ctx, rng):
    """Reduced axes given explicitly; operands at non-zero offsets inside larger buffers."""
    x = random(rng, (4, 6, 5))
    big = dp.Tensor.from_numpy(ctx, random(rng, 4 * 6 * 5 + 7))
    xt = dp.Tensor(ctx, big.buffer, x.shape, offset=7 * 4)
    xt.copy_(dp.Tensor.from_numpy(ctx, x))
    w = dp.Tensor.full(ctx, (1,), 2.0)
    out_big = poisoned(ctx, (4 * 5 + 3,))
    out = dp.Tensor(ctx, out_big.buffer, (4, 5), offset=3 * 4)
    WEIGHTED([xt, w], [out], [1.0], axes=(1,))
    assert_close(out.numpy(), ((2 * x.astype(np.float64)) ** 2).sum(axis=1))
    assert np.isnan(out_big.numpy()[:3]).all(), "wrote before the output's offset"


def test_generator_empty_reduction_gives_the_identity(ctx):
    out = poisoned(ctx, (3,))
    WEIGHTED([dp.Tensor.empty(ctx, (0, 3)), dp.Tensor.zeros(ctx, (3,))], [out], [1.0])
    assert out.numpy().tolist() == [0.0, 0.0, 0.0]


def test_generator_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (4, 5))
    w = dp.Tensor.zeros(ctx, (5,))
    with pytest.raises(dp.ShapeError, match="does not fit"):
        WEIGHTED([x, w], [dp.Tensor.empty(ctx, (3,))], [1.0])
    with pytest.raises(dp.ShapeError, match="broadcast"):
        WEIGHTED([x, dp.Tensor.zeros(ctx, (3,))], [dp.Tensor.empty(ctx, (1,))], [1.0])
    with pytest.raises(dp.DTypeError, match="float32"):
        WEIGHTED([x, dp.Tensor.zeros(ctx, (5,), np.int32)], [dp.Tensor.empty(ctx, (1,))], [1.0])
    with pytest.raises(dp.ShapeError, match="axes"):
        WEIGHTED([x, w], [dp.Tensor.empty(ctx, (4, 5))], [1.0], axes=(1,))
    with pytest.raises(dp.ShapeError, match="scalars"):
        WEIGHTED([x, w], [dp.Tensor.empty(ctx, (1,))], [])
    with pytest.raises(dp.UnsupportedError, match="variant"):
        WEIGHTED([x, w], [dp.Tensor.empty(ctx, (1,))], [1.0], variant="warp")
    with pytest.raises(dp.ShapeError, match="identity"):
        ReduceKernel("bad", [("x", np.float32)], [("y", np.float32)], "y = x;", "acc_y *= y;")


# ---- sum, mean, amax, amin, norm with gradients ---------------------------------------------

CASES = [((5, 7, 9), 1, False), ((5, 7, 9), (0, 2), True), ((3, 65), None, False),
         ((65, 3), 0, True), ((1,), 0, False), ((), None, False), ((2, 3, 4, 5), (1, -1), False),
         ((4, 5), (), False)]

REDUCTIONS = {
    "sum": (lambda x, d, k: F.sum(x, d, k), lambda t, d, k: t.sum(dim=d, keepdim=k)),
    "mean": (lambda x, d, k: F.mean(x, d, k), lambda t, d, k: t.mean(dim=d, keepdim=k)),
    "amax": (lambda x, d, k: F.amax(x, d, k), lambda t, d, k: t.amax(dim=() if d is None else d, keepdim=k)),
    "amin": (lambda x, d, k: F.amin(x, d, k), lambda t, d, k: t.amin(dim=() if d is None else d, keepdim=k)),
    "norm2": (lambda x, d, k: F.norm(x, 2, d, k), lambda t, d, k: torch.linalg.vector_norm(t, 2, d, k)),
    "norm1": (lambda x, d, k: F.norm(x, 1, d, k), lambda t, d, k: torch.linalg.vector_norm(t, 1, d, k)),
    "norm3": (lambda x, d, k: F.norm(x, 3, d, k), lambda t, d, k: torch.linalg.vector_norm(t, 3, d, k)),
    "norminf": (lambda x, d, k: F.norm(x, float("inf"), d, k), lambda t, d, k: torch.linalg.vector_norm(t, float("inf"), d, k)),
    # a negative order: (sum |x|^p)^(1/p), its gradient by torch's formula
    "norm-1.5": (lambda x, d, k: F.norm(x, -1.5, d, k), lambda t, d, k: torch.linalg.vector_norm(t, -1.5, d, k)),
}


# Every case for sum and amax; two for the others, whose kernels differ only in the map and
# finalize code (each case costs a compile per kernel on PoCL).
PAIRS = ([("sum", *case) for case in CASES] + [("amax", *case) for case in CASES[:5]]
         + [(op, *case) for op in REDUCTIONS if op not in ("sum", "amax") for case in (CASES[0], CASES[3])])


@pytest.mark.parametrize("op, shape, dim, keepdim", PAIRS)
def test_reduction_forward_and_gradient(ctx, rng, op, shape, dim, keepdim):
    ours, theirs = REDUCTIONS[op]
    a = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = ours(x, dim, keepdim)
    t = _torch(a, True)
    ref = theirs(t, dim, keepdim)
    assert y.shape == tuple(ref.shape), f"{y.shape} vs {tuple(ref.shape)}"
    assert_close(y.numpy(), ref.detach().numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("unroll", [1, 3, 8])
@pytest.mark.parametrize("variant", ["group", "item"])
def test_each_variant_with_partials(ctx, rng, variant, unroll, monkeypatch, tuning_rules):
    """Both variants forced, each with one, three (chunks not a multiple of it) and eight
    accumulator sets, with enough elements that partial results are reduced again."""
    monkeypatch.setenv("DLPRIM_REDUCE_ALGO", variant)
    dp.config.reload()
    tuning_rules("reduce", [{"when": {}, "params": {"solver": name, "unroll": unroll, "set_chunk": 4}}
                            for name in ("group", "item")])
    a = random(rng, (40, 1100))
    x = dp.Tensor.from_numpy(ctx, a)
    for dim in (0, None):
        assert_close(F.sum(x, dim).numpy(), a.astype(np.float64).sum(axis=dim))
    assert np.array_equal(F.argmax(x, 1).numpy(), a.argmax(axis=1))
    # Two reduced dimensions that do not merge: the index walks both.
    b = random(rng, (6, 40, 50))
    assert_close(F.sum(dp.Tensor.from_numpy(ctx, b), (0, 2)).numpy(), b.astype(np.float64).sum(axis=(0, 2)))
    ties = rng.integers(0, 3, size=(7, 300)).astype(np.float32)
    assert np.array_equal(F.argmin(dp.Tensor.from_numpy(ctx, ties), 1).numpy(), ties.argmin(axis=1))


def test_amax_gradient_is_shared_among_ties(ctx):
    a = np.array([[1, 3, 3], [2, 2, 0]], np.float32)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    F.amax(x, 1).backward(dp.Tensor.from_numpy(ctx, np.array([1, 4], np.float32)))
    t = _torch(a, True)
    t.amax(1).backward(torch.tensor([1.0, 4.0], dtype=torch.float64))
    assert np.array_equal(x.grad.numpy(), t.grad.numpy())


def test_nan_propagates_through_amax_amin(ctx):
    a = np.array([[1, np.nan, 3], [2, 5, 0]], np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    assert np.array_equal(F.amax(x, 1).numpy(), [np.nan, 5], equal_nan=True)
    assert np.array_equal(F.amin(x, 1).numpy(), [np.nan, 0], equal_nan=True)


# ---- argmax / argmin ---------------------------------------------------------------------

@pytest.mark.parametrize("shape, dim, keepdim", [((5, 7, 9), 1, False), ((5, 7, 9), -1, True),
                                                 ((4, 33), None, False), ((1,), 0, False)])
def test_argmax_argmin(ctx, rng, shape, dim, keepdim):
    # Few distinct values, so ties are frequent: the lowest index wins, as in torch.
    a = rng.integers(0, 4, size=shape).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    t = torch.tensor(a)
    for ours, theirs in ((F.argmax, torch.argmax), (F.argmin, torch.argmin)):
        out = ours(x, dim, keepdim)
        ref = theirs(t, dim=dim, keepdim=keepdim)
        assert out.dtype == np.int64
        assert np.array_equal(out.numpy(), ref.numpy())


def test_argmax_nan_counts_as_largest(ctx):
    a = np.array([[1, np.nan, 3, np.nan], [2, 5, 0, 5]], np.float32)
    out = F.argmax(dp.Tensor.from_numpy(ctx, a), 1).numpy()
    assert np.array_equal(out, torch.argmax(torch.tensor(a), 1).numpy())


@pytest.mark.parametrize("variant", ["group", "item"])
def test_argmax_argmin_rows_of_infinities(ctx, variant, monkeypatch):
    """A row of -inf (argmax) or +inf (argmin) gives index 0, as in torch, through the
    in-order fold, the sets' merge and the tree; a late NaN still wins."""
    monkeypatch.setenv("DLPRIM_REDUCE_ALGO", variant)
    dp.config.reload()
    a = np.full((3, 1000), -np.inf, np.float32)
    a[1, 700] = 1.0
    a[2, 999] = np.nan
    for ours, theirs, b in ((F.argmax, torch.argmax, a), (F.argmin, torch.argmin, -a)):
        out = ours(dp.Tensor.from_numpy(ctx, b), 1).numpy()
        assert out.tolist() == [0, 700, 999]
        assert np.array_equal(out, theirs(torch.tensor(b), 1).numpy())


@pytest.mark.parametrize("sets, segment", [(1, None), (2, 32), (4, 64)])
def test_argmax_argmin_nan_ties_and_infinities_through_vector_sets(ctx, rng, sets, segment, tuning_rules):
    """Rows of 4096 through float4 loads with 1, 2 or 4 accumulator sets per item and 256 (a
    whole group), 32 or 64 items per row: NaNs (the first one wins), ties of the extreme value
    (the first one wins), rows of infinities, and the whole tensor at once; against torch."""
    a = rng.integers(-3, 4, size=(9, 4096)).astype(np.float32)
    a[1, [5, 700, 4000]] = np.nan
    a[2, [4095, 3]] = np.nan
    a[3] = -np.inf
    a[4] = np.inf
    a[5, 2048:] = 7.0
    x = dp.Tensor.from_numpy(ctx, a)
    t = torch.tensor(a)
    tuning_rules("reduce", [{"when": {"exact_fold": 1},
                             "params": {"solver": "group", "vector_unroll": sets, "max_segment": segment}}])
    for name, ours, theirs in (("argmax", F.argmax, torch.argmax), ("argmin", F.argmin, torch.argmin)):
        plan = R._arg_kernel(name).describe([x], [dp.Tensor.empty(ctx, (9, 1))], axes=1)
        assert plan[:3] == ("group", segment or 256, 4)
        assert np.array_equal(ours(x, 1).numpy(), theirs(t, 1).numpy())
        assert int(ours(x).numpy()) == int(theirs(t))


# ---- reductions of everything: the partials combined by the last group or a second launch --

@pytest.mark.parametrize("mode", ["last_group", "launch"])
def test_everything_partials_modes(ctx, rng, mode, monkeypatch, tuning_rules):
    """Each way of combining the chunks' partial results of a reduction to one value, forced,
    with many chunks (short sets): sums with and without a finalize, argmax/argmin with ties
    across chunks, into an output inside a larger buffer; called twice (the group count must be
    back at zero for the second launch)."""
    monkeypatch.setenv("DLPRIM_REDUCE_PARTIALS_ALGO", mode)
    dp.config.reload()
    a = random(rng, (600, 1024))
    # The largest and the smallest value twice each, in different chunks.
    a[3, 7] = a[400, 1000] = 5.0
    a[5, 9] = a[500, 3] = -5.0
    first_max, first_min = 3 * 1024 + 7, 5 * 1024 + 9
    out_big = poisoned(ctx, (5,))
    out = dp.Tensor(ctx, out_big.buffer, (), offset=4)
    # More chunks than items in a group: the last group's items fold several partials each.
    x = dp.Tensor.from_numpy(ctx, a)
    # The chunk count follows the device's compute units: the shortest sets that keep it within
    # what the last group folds (group size x set_chunk) on this device.
    for set_chunk in (2, 4, 8):
        # argmax/argmin load with half the sets per item: twice as long sets give them the
        # sum's chunks.
        tuning_rules("reduce", [
            {"when": {"exact_fold": 1}, "params": {"solver": "group", "set_chunk": 2 * set_chunk}},
            {"when": {}, "params": {"solver": "group", "set_chunk": set_chunk}}])
        try:
            variant, _, _, chunks, partials = R._sum_kernel().describe([x], [out])
        except dp.UnsupportedError:
            continue   # forced, the last group cannot fold that many partials
        if (variant, partials) == ("group", mode) and chunks > 256:
            break
    assert (variant, partials) == ("group", mode) and chunks > 256
    # The second call (other data) runs only right if the first left the group count at zero.
    for sign in (1.0, -1.0):
        b = sign * a
        x = dp.Tensor.from_numpy(ctx, b)
        d = b.astype(np.float64)
        out.fill_(np.nan)
        R._sum_kernel()([x], [out])
        assert_close(out.numpy(), d.sum())
        assert np.isnan(out_big.numpy()[[0, 2, 3, 4]]).all(), "wrote outside the output"
        assert_close(F.mean(x).numpy(), d.mean())
        assert_close(F.norm(x).numpy(), np.sqrt((d * d).sum()))
        assert int(F.argmax(x).numpy()) == (first_max if sign > 0 else first_min)
        assert int(F.argmin(x).numpy()) == (first_min if sign > 0 else first_max)
    # Past set_chunk partials per item the last group would fold too long a run: two launches
    # (forced, the last group does not apply).
    tuning_rules("reduce", [{"when": {}, "params": {"solver": "group", "set_chunk": 1}}])
    if mode == "last_group":
        with pytest.raises(dp.UnsupportedError, match="last_group does not apply"):
            R._sum_kernel().describe([x], [out])
        monkeypatch.delenv("DLPRIM_REDUCE_PARTIALS_ALGO")
        dp.config.reload()
    assert R._sum_kernel().describe([x], [out])[4] == "launch"


def test_bad_partials_mode(ctx, monkeypatch):
    monkeypatch.setenv("DLPRIM_REDUCE_PARTIALS_ALGO", "tree")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="partials mode must be one of"):
        F.sum(dp.Tensor.zeros(ctx, (3, 4)))


# ---- large reductions stay accurate ------------------------------------------------------

def test_large_sum_and_norm_are_accurate(ctx):
    """10^7 elements: a running float sum would be off by ~1e-4 relative; partials keep it to
    float32 rounding of the result."""
    n = 10_000_000
    a = np.random.default_rng(7).uniform(0.0, 1.0, n).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    ref = a.astype(np.float64).sum()
    assert abs(float(F.sum(x).numpy()) - ref) / ref < 2e-7
    ref_mean = ref / n
    assert abs(float(F.mean(x).numpy()) - ref_mean) / ref_mean < 2e-7
    ref_norm = np.sqrt((a.astype(np.float64) ** 2).sum())
    assert abs(float(F.norm(x).numpy()) - ref_norm) / ref_norm < 2e-7


# ---- sum_to_shape, maximum, minimum ------------------------------------------------------

# Rows x columns: one chunk; several chunks of a 4-wide and a ragged last block; rows not on
# 16-byte boundaries (element by element); chunks that the rows' length forces (up to 2048
# rows a chunk), past 16 of them (lanes of the fold adding two each).
COLUMN_CASES = [(2, 2, 0), (5, 3, 1), (70, 33, 0), (300, 64, 4), (1000, 130, 0), (513, 68, 2),
                (5000, 7, 3), (20000, 5, 0), (40000, 3, 1)]


def _column_case(ctx, rng, R_, C, off):
    """(x viewed as R x C at element offset ``off`` in a larger buffer, its float64 column sums,
    an output of C elements inside a poisoned buffer and that buffer)."""
    a = random(rng, R_ * C + off + 3, -1, 2)
    big = dp.Tensor.from_numpy(ctx, a)
    x = dp.Tensor(ctx, big.buffer, (R_, C), offset=4 * off)
    out_big = poisoned(ctx, (C + 2,))
    out = dp.Tensor(ctx, out_big.buffer, (C,), offset=4)
    return x, a[off:off + R_ * C].reshape(R_, C).astype(np.float64).sum(axis=0), out, out_big


def _columns(ctx, x, out, kernel="sum"):
    """``kernel`` (sum, amax or the squares' root) over the rows of x into out, the columns
    solver forced."""
    k = {"sum": R._sum_kernel, "amax": lambda: R._extremum_kernel("max"),
         "norm2": lambda: R.ReduceKernel("columns_norm2", [("x", np.float32)],
                                         [("y", np.float32)], "y = x * x;", "sum",
                                         finalize="acc_y = sqrt(acc_y) + (float)reduce_size;")}[kernel]()
    k([x], [out], variant="columns")
    return k


@pytest.mark.parametrize("mode", ["last_group", "launch"])
@pytest.mark.parametrize("R_,C,off", COLUMN_CASES)
def test_columns_solver(ctx, rng, monkeypatch, mode, R_, C, off):
    """The columns solver against float64 with each way of combining the chunks forced: every
    output written, nothing beside it; called again on other data (a block's count of finished
    chunks must be back at zero), building nothing."""
    monkeypatch.setenv("DLPRIM_REDUCE_PARTIALS_ALGO", mode)
    dp.config.reload()
    x, ref, out, out_big = _column_case(ctx, rng, R_, C, off)
    k = _columns(ctx, x, out)
    assert k.describe([x], [out], variant="columns")[0] == "columns"
    assert_close(out.numpy(), ref)
    assert np.isnan(out_big.numpy()[[0, C + 1]]).all(), "wrote outside the output"
    y, ref2, _, _ = _column_case(ctx, rng, R_, C, off)
    out.fill_(np.nan)
    assert_repeats_build_nothing(ctx, lambda: _columns(ctx, y, out))
    assert_close(out.numpy(), ref2)


@pytest.mark.parametrize("mode", ["last_group", "launch"])
@pytest.mark.parametrize("R_,C,off", [(5, 3, 1), (1000, 130, 0), (40000, 3, 1)])
def test_columns_solver_statements(ctx, rng, monkeypatch, mode, R_, C, off):
    """The kernel's own statements in the columns form: a max (its identity, not zero, in the
    ragged block; a NaN that wins) and a map with a finalize that reads reduce_size."""
    monkeypatch.setenv("DLPRIM_REDUCE_PARTIALS_ALGO", mode)
    dp.config.reload()
    x, _, out, out_big = _column_case(ctx, rng, R_, C, off)
    a = x.numpy().astype(np.float64)
    _columns(ctx, x, out, "amax")
    assert np.array_equal(out.numpy(), a.max(axis=0))
    _columns(ctx, x, out, "norm2")
    assert_close(out.numpy(), np.sqrt((a * a).sum(axis=0)) + R_)
    assert np.isnan(out_big.numpy()[[0, C + 1]]).all(), "wrote outside the output"
    b = -np.abs(random(rng, (R_, C))) - 1         # every value below the zeros past C
    b[R_ // 2, C - 1] = np.nan
    y = dp.Tensor.from_numpy(ctx, b)
    _columns(ctx, y, out, "amax")
    assert np.array_equal(out.numpy(), b.max(axis=0), equal_nan=True)


def test_columns_modes_give_the_same_bits(ctx, rng, monkeypatch):
    x, _, out, _ = _column_case(ctx, rng, 3000, 200, 0)
    results = []
    for mode in ("last_group", "launch"):
        monkeypatch.setenv("DLPRIM_REDUCE_PARTIALS_ALGO", mode)
        dp.config.reload()
        _columns(ctx, x, out)
        results.append(out.numpy())
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("grad_shape, shape", [((6, 5, 40), (40,)), ((6, 5, 40), (1, 5, 40)),
                                               ((130, 9), (9,))])
def test_sum_to_shape_over_leading_dims_takes_the_columns_solver(ctx, rng, monkeypatch,
                                                                 grad_shape, shape):
    """A gradient summed over its leading dimensions (a bias gradient) is the columns solver's
    by the shipped rules, and the item solver's where that is forced: the same values."""
    g = random(rng, grad_shape)
    ref = g.astype(np.float64).reshape(-1, int(np.prod(shape))).sum(axis=0).reshape(shape)
    calls = []
    enqueue = R._ColumnsLaunch.enqueue
    monkeypatch.setattr(R._ColumnsLaunch, "enqueue",
                        lambda self, *a: (calls.append(a), enqueue(self, *a))[1])
    out = R.sum_to_shape(dp.Tensor.from_numpy(ctx, g), shape)
    assert out.shape == shape and len(calls) == 1
    assert_close(out.numpy(), ref)
    monkeypatch.setenv("DLPRIM_REDUCE_ALGO", "item")
    dp.config.reload()
    out = R.sum_to_shape(dp.Tensor.from_numpy(ctx, g), shape)
    assert len(calls) == 1
    assert_close(out.numpy(), ref)


@pytest.mark.parametrize("shape, dim", [((50, 40), 0), ((3, 50, 40), (0, 1)), ((50, 40), None)])
def test_functional_reductions_over_leading_dims_take_the_columns_solver(ctx, rng, monkeypatch,
                                                                        shape, dim):
    """sum, mean, amax, amin and norm over the leading dimensions of a float32 tensor: the
    columns solver (one launch each; dim None keeps nothing, so not there), their values and
    gradients against torch."""
    calls = []
    enqueue = R._ColumnsLaunch.enqueue
    monkeypatch.setattr(R._ColumnsLaunch, "enqueue",
                        lambda self, *a: (calls.append(a), enqueue(self, *a))[1])
    a = random(rng, shape)
    for ours, theirs in ((F.sum, torch.sum), (F.mean, torch.mean), (F.amax, torch.amax),
                         (F.amin, torch.amin), (lambda x, d: F.norm(x, 2, d),
                                                lambda t, d: torch.linalg.vector_norm(t, 2, d))):
        x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
        t = _torch(a, True)
        y = ours(x, dim)
        ref = theirs(t, dim) if dim is not None else theirs(t, tuple(range(len(shape))))
        assert_close(y.numpy(), ref.detach().numpy())
        g = random(rng, y.shape)
        y.backward(dp.Tensor.from_numpy(ctx, g))
        ref.backward(torch.tensor(g.astype(np.float64)))
        assert_close(x.grad.numpy(), t.grad.numpy())
    assert len(calls) == (0 if dim is None else 5)


@pytest.mark.parametrize("dtype", [np.float32, "float16"])
def test_partials_pass_takes_the_columns_solver(ctx, rng, monkeypatch, dtype):
    """Long rows cut into chunks: the chunks' partials (chunks x outputs, row-major) are the
    columns solver's problem, whose finalize sees the whole reduction's size (a mean), and
    whose kernel is the partials kernel's (a 16-bit input's partials are float32)."""
    calls = []
    enqueue = R._ColumnsLaunch.enqueue
    monkeypatch.setattr(R._ColumnsLaunch, "enqueue",
                        lambda self, *a: (calls.append(a), enqueue(self, *a))[1])
    a = random(rng, (3, 600000))
    x = dp.Tensor.from_numpy(ctx, a, dtype=None if dtype is np.float32 else dp.float16)
    ref = x.numpy().astype(np.float64)
    for ours, theirs in ((F.mean, np.mean), (F.sum, np.sum), (F.amax, np.max)):
        got = ours(x, 1).numpy().astype(np.float64)
        assert_close(got, theirs(ref, axis=1), tol=1e-6 if dtype is np.float32 else 2e-3)
    assert len(calls) == 3


def test_columns_solver_refuses_what_it_does_not_apply_to(ctx, rng):
    """Forced where it does not apply: kept leading dimensions, two inputs, an index
    accumulator, an int64 one, a single row; the generic solvers still serve them."""
    x = dp.Tensor.from_numpy(ctx, random(rng, (40, 30)))
    one = dp.Tensor.from_numpy(ctx, random(rng, (1, 30)))
    with pytest.raises(dp.UnsupportedError, match="columns does not apply"):
        R._sum_kernel()([x], [dp.Tensor.empty(ctx, (40, 1))], variant="columns")
    weighted = R.ReduceKernel("weighted", [("x", np.float32), ("w", np.float32)],
                              [("y", np.float32)], "y = x * w;", "sum")
    with pytest.raises(dp.UnsupportedError, match="columns does not apply"):
        weighted([x, x], [dp.Tensor.empty(ctx, (30,))], variant="columns")
    with pytest.raises(dp.UnsupportedError, match="columns does not apply"):
        R._arg_kernel("argmax")([x], [dp.Tensor.empty(ctx, (30,)),
                                      dp.Tensor.empty(ctx, (30,), np.int64)], variant="columns")
    ints = dp.Tensor.from_numpy(ctx, rng.integers(0, 9, (40, 30)).astype(np.int32))
    with pytest.raises(dp.UnsupportedError, match="columns does not apply"):
        R._integer_sum_kernel(ints.dtype)([ints], [dp.Tensor.empty(ctx, (30,), np.int64)],
                                          variant="columns")
    with pytest.raises(dp.UnsupportedError, match="columns does not apply"):
        R._sum_kernel()([one], [dp.Tensor.empty(ctx, (30,))], variant="columns")
    b = ints.numpy()
    assert np.array_equal(F.sum(ints, 0).numpy(), b.sum(axis=0))
    assert np.array_equal(F.argmax(x, 0).numpy(), x.numpy().argmax(axis=0))


@pytest.mark.parametrize("grad_shape, shape", [((4, 5, 6), (5, 1)), ((4, 5, 6), (4, 1, 6)),
                                               ((3, 4), ()), ((3, 4), (3, 4)), ((7,), (1,))])
def test_sum_to_shape(ctx, rng, grad_shape, shape):
    g = random(rng, grad_shape)
    out = R.sum_to_shape(dp.Tensor.from_numpy(ctx, g), shape)
    lead = len(grad_shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + k for k, s in enumerate(shape) if s == 1 and grad_shape[lead + k] != 1)
    ref = g.astype(np.float64).sum(axis=axes, keepdims=True).reshape(shape)
    assert out.shape == tuple(shape)
    assert_close(out.numpy(), ref)
    with pytest.raises(dp.ShapeError):
        R.sum_to_shape(dp.Tensor.from_numpy(ctx, g), (2,) + tuple(grad_shape))


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("a_shape, b_shape", [((3, 1, 2), (1, 4, 1)), ((1,), (6,)), ((5,), None)])
def test_maximum_minimum(ctx, rng, op, a_shape, b_shape):
    # Values on a coarse grid so that ties (gradient split in half) occur.
    a = rng.integers(-2, 3, size=a_shape).astype(np.float32)
    b = rng.integers(-2, 3, size=b_shape).astype(np.float32) if b_shape else 0.5
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = dp.Tensor.from_numpy(ctx, b, requires_grad=True) if b_shape else b
    out = getattr(F, op)(x, y)
    ta = _torch(a, True)
    tb = _torch(b, True) if b_shape else torch.tensor(b, dtype=torch.float64)
    ref = getattr(torch, op)(ta, tb)
    assert_close(out.numpy(), ref.detach().numpy())
    g = random(rng, out.shape)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), ta.grad.numpy())
    if b_shape:
        assert_close(y.grad.numpy(), tb.grad.numpy())


# ---- bad input ---------------------------------------------------------------------------

def test_reductions_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (3, 4))
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.sum(x, 2)
    with pytest.raises(dp.ShapeError, match="more than once"):
        F.mean(x, (1, -1))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.argmax(dp.Tensor.empty(ctx, (3,), np.float16))
    with pytest.raises(dp.DTypeError, match="float16"):
        F.mean(dp.Tensor.empty(ctx, (3,), np.int32))
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.amax(np.zeros(3, np.float32))
    with pytest.raises(dp.ShapeError, match="dim must be an int"):
        F.argmax(x, (0, 1))
    with pytest.raises(dp.ShapeError, match="empty"):
        F.amax(dp.Tensor.zeros(ctx, (0, 3)), 0)
    with pytest.raises(dp.UnsupportedError, match="p must"):
        F.norm(x, float("nan"))
    with pytest.raises(dp.UnsupportedError, match="p must"):
        F.norm(x, "nuc")
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.maximum(x, dp.Tensor.zeros(ctx, (5,)))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_arithmetic_gradients_fold_through_sum_to_shape(ctx, rng, op):
    """The arithmetic operators' backward sums broadcast gradients back with sum_to_shape."""
    a, b = random(rng, (3, 1, 5)), random(rng, (4, 1), 0.5, 1.5)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    out = getattr(F, op)(x, y)
    ta, tb = _torch(a, True), _torch(b, True)
    ref = getattr(torch, op)(ta, tb)
    assert_close(out.numpy(), ref.detach().numpy())
    g = random(rng, out.shape)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), ta.grad.numpy())
    assert_close(y.grad.numpy(), tb.grad.numpy())


# ---- random shapes and dims ----------------------------------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@st.composite
def shape_and_dims(draw):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=3)))
    dims = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    return shape, tuple(dims) if dims else None, draw(st.booleans())


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shape_and_dims())
def test_random_shapes_sum_and_amax(ctx, case):
    shape, dims, keepdim = case
    # crc32 of the repr, not hash(): hash(None) differs between processes, so the data would too.
    seed = zlib.crc32(repr((shape, dims)).encode())
    a = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    t = _torch(a, True)
    torch_dims = dims if dims is not None else tuple(range(len(shape)))
    for ours, ref in ((F.sum(x, dims, keepdim), t.sum(dim=torch_dims, keepdim=keepdim)),
                      (F.amax(x, dims, keepdim), t.amax(dim=torch_dims, keepdim=keepdim))):
        assert ours.shape == tuple(ref.shape)
        assert_close(ours.numpy(), ref.detach().numpy())


# ---- vector loads and several units per work-group ----------------------------------------

@pytest.mark.parametrize("vector", [4, 1])
@pytest.mark.parametrize("segment", [None, 1, 4, 256])
def test_vector_loads_and_segments(ctx, rng, vector, segment, tuning_rules):
    """The group variant with float4 loads or scalar ones, and 1, 4 or 256 items per unit (or
    the choice by length): rows of 1000 and 4096, everything, an output inside a larger
    buffer, argmax's index through the vector lanes."""
    tuning_rules("reduce", [{"when": {}, "params": {"solver": "group", "vector": vector,
                                                    "segment": segment}}])
    for shape, dim in (((37, 1000), -1), ((3, 4096), 1), ((5, 2048), None)):
        a = random(rng, shape)
        x = dp.Tensor.from_numpy(ctx, a)
        out = poisoned(ctx, np.sum(a, axis=dim).shape)
        R._sum_kernel()([x], [out], axes=dim)
        assert_close(out.numpy(), a.astype(np.float64).sum(axis=dim))
        assert R._sum_kernel().describe([x], [out], axes=dim)[2] == vector
        assert np.array_equal(F.argmax(x, dim).numpy(), a.argmax(axis=dim))


def test_vector_loads_need_aligned_offsets(ctx, rng):
    """An input that starts off a vector boundary is reduced with scalar loads."""
    a = random(rng, 4 * 1000 + 1)
    big = dp.Tensor.from_numpy(ctx, a)
    x = dp.Tensor(ctx, big.buffer, (4, 1000), offset=4)
    out = poisoned(ctx, (4,))
    R._sum_kernel()([x], [out], axes=1)
    assert R._sum_kernel().describe([x], [out], axes=1)[2] == 1
    assert_close(out.numpy(), a[1:].reshape(4, 1000).astype(np.float64).sum(axis=1))
    aligned = dp.Tensor(ctx, big.buffer, (4, 1000), offset=0)
    assert R._sum_kernel().describe([aligned], [out], axes=1)[2] == 4


def test_short_rows_share_a_group(ctx, rng):
    """Rows of 49 (7x7 planes): several per work-group, scalar loads (49 is no multiple of 4)."""
    a = random(rng, (6, 20, 7, 7))
    x = dp.Tensor.from_numpy(ctx, a)
    out = F.sum(x, (2, 3))
    assert R._sum_kernel().describe([x], [R._view(out, (6, 20, 1, 1))])[:3] == ("group", 4, 1)
    assert_close(out.numpy(), a.astype(np.float64).sum(axis=(2, 3)))


def test_arg_and_infinity_norm_of_empty_tensors_follow_torch(ctx):
    """Only a reduction over an empty dimension is refused (argmax, the infinity norms and the
    norms of negative order, which have no identity); non-empty rows of an empty
    tensor give an empty result (once refused for any empty input)."""
    empty = dp.Tensor.zeros(ctx, (0, 3))
    for dim, keepdim, shape in ((1, False, (0,)), (-1, True, (0, 1))):
        index = F.argmax(empty, dim, keepdim)
        assert index.shape == shape and index.dtype == np.int64
        assert F.argmin(empty, dim, keepdim).shape == shape
        for p in (np.inf, -np.inf, -1.0):
            assert F.norm(empty, p, dim, keepdim).shape == shape
    for call in (lambda: F.argmax(empty, 0), lambda: F.argmax(empty),
                 lambda: F.norm(empty, np.inf, 0), lambda: F.norm(empty, -np.inf),
                 lambda: F.norm(empty, -0.5, 0)):
        with pytest.raises(dp.ShapeError, match="empty dimension"):
            call()


def test_dim_types_are_checked_after_a_valid_call(ctx):
    """The shape memo once took dim=True or (1.0,) for the dim=1 it had seen."""
    x = dp.Tensor.zeros(ctx, (3, 4))
    F.sum(x, 1)
    F.sum(x, (1,))
    for dim in (True, (1.0,), (True,)):
        with pytest.raises(dp.ShapeError, match="dim"):
            F.sum(x, dim)
