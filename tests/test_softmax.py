"""softmax / log_softmax over any dim, every variant forced, against torch CPU float64."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py.ops.softmax import softmax_backward

from conftest import assert_close, poisoned, random

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
    # torch's dtype argument: float32, the only one there is here, or None.
    assert F.log_softmax(x, 1, dtype=np.float32).shape == (3, 4)
    for f in (F.softmax, F.log_softmax):
        with pytest.raises(dp.DTypeError, match="dtype must be float32.*float64"):
            f(x, 1, dtype=np.float64)


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
def test_row_vector_loads(ctx, rng, tuning_rules, vector, cached):
    """The row forward with float4 loads and stores, or scalar ones: rows of 1000 and 200
    (registers: several rows per work-group, the last group part empty, groups looping over
    rows) and 5000 (most registers), a row start off a vector boundary (scalar then), -inf
    entries inside a vector."""
    from dlprim_py.ops import softmax as S
    tuning_rules("softmax", [{"when": {}, "params": {"solver": "row", "vector": vector}}])
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


# Every kernel option of the row variant forced on its own (SoftmaxPlan's options, see
# softmax._choices); the inline-PTX ones (warp shuffles, cache hints, cp.async) run on NVIDIA only,
# their portable forms everywhere.
PORTABLE_OPTIONS = [
    dict(reduce="tree"),
    dict(recompute=True),
    dict(prefetch=1, groups_per_unit=1),
    dict(prefetch=2, groups_per_unit=1, recompute=True),
    dict(backward_hold="dy"),
    dict(backward_hold="both"),
]
NVIDIA_OPTIONS = [
    dict(reduce="warp"),
    dict(reduce="warp", hints=(".nc.L2::256B", ".cs"), backward_hints=(".cs", ".cs")),
    dict(reduce="warp", prefetch=2, groups_per_unit=2, recompute=True),
    dict(reduce="warp", prefetch=1, groups_per_unit=1, backward_hold="dy"),
]


def _option_id(options):
    return "-".join(f"{k}={v}" for k, v in options.items())


@pytest.mark.parametrize("options", PORTABLE_OPTIONS + NVIDIA_OPTIONS,
                         ids=[_option_id(o) for o in PORTABLE_OPTIONS + NVIDIA_OPTIONS])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_kernel_options(ctx, rng, options, log):
    """Rows held in registers by a whole work-group (one row per group, groups looping over
    rows with a small cap), -inf entries, a row of only -inf, poisoned outputs."""
    from dlprim_py.ops.softmax import SoftmaxPlan, _CACHE_STEPS
    if options in NVIDIA_OPTIONS and ctx.info.vendor != "nvidia":
        with pytest.raises(dp.UnsupportedError, match="NVIDIA"):
            SoftmaxPlan(ctx, log, 5000, 1, 5000, "row", None, True, options=options)
        return
    shape = (7, 5000)
    group = SoftmaxPlan(ctx, log, shape[1], 1, 5000, "row").group_size
    cached = next(c for c in _CACHE_STEPS if c * group >= shape[1])
    plan = SoftmaxPlan(ctx, log, shape[1], 1, 7 * 5000, "row", cached, True, options=options)
    assert plan.row_items == plan.group_size
    a = random(rng, shape, -40, 40)
    a[0, 1:9] = -np.inf
    a[3, :] = -np.inf
    g = random(rng, shape)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    ref = (torch.log_softmax if log else torch.softmax)(t, 1)
    ref_grad = torch.autograd.grad(ref[[0, 1, 2, 4, 5, 6]], t, torch.tensor(g[[0, 1, 2, 4, 5, 6]].astype(np.float64)))[0]
    x = dp.Tensor.from_numpy(ctx, a)
    y = poisoned(ctx, shape)
    plan.forward(x, y, 7, 5000, 1)
    out = y.numpy()
    ref = ref.detach().numpy()
    assert np.isnan(out[3]).all()
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), finite)
    assert_close(out[finite], ref[finite])
    # The backward on the rows that have a gradient (torch's is NaN on the row of -inf).
    rows = [0, 1, 2, 4, 5, 6]
    y = dp.Tensor.from_numpy(ctx, np.ascontiguousarray(ref[rows]).astype(np.float32))
    dy = dp.Tensor.from_numpy(ctx, np.ascontiguousarray(g[rows]))
    dx = poisoned(ctx, (6, 5000))
    plan.backward(y, dy, dx, 6, 5000, 1)
    got = dx.numpy()
    expected = ref_grad.numpy()[rows]
    if log:  # log_softmax's y is -inf on the masked entries; its gradient there is dy
        assert np.isfinite(got).all()
    assert_close(got, expected)


def test_bad_kernel_options(ctx):
    from dlprim_py.ops.softmax import SoftmaxPlan
    # (options, row length, cached, message): rows of 300 share a group, and prefetch needs one
    # row per group; 32 elements per item are 8 vectors, fewer than 9.
    cases = [(dict(backward_hold="y"), 5000, None, "backward_hold"),
             (dict(reduce="ring"), 5000, None, "reduce"),
             (dict(groups_per_unit=0), 5000, None, "groups_per_unit"),
             (dict(unroll=2), 5000, None, "unknown"),
             (dict(prefetch=9), 5000, 32, "prefetch"),
             (dict(prefetch=1), 300, None, "prefetch")]
    for options, size, cached, match in cases:
        with pytest.raises(dp.UnsupportedError, match=match):
            SoftmaxPlan(ctx, False, size, 1, 5000, "row", cached, True, options=options)


def test_backward_unaligned_gradient(ctx, rng):
    """A gradient at an offset that is no multiple of 4 takes the kernel without vector
    accesses; softmax_backward writes into a given dx at any offset."""
    shape = (3, 2000)
    a, g = random(rng, shape, -5, 5), random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = F.softmax(x, 1)
    big = dp.Tensor.from_numpy(ctx, np.concatenate([[0.0], g.ravel()]).astype(np.float32))
    g_odd = dp.Tensor(ctx, big.buffer, shape, offset=4)
    y.backward(g_odd)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    torch.softmax(t, 1).backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), t.grad.numpy())
    out = dp.Tensor.from_numpy(ctx, np.full(a.size + 3, np.nan, np.float32))
    dx = dp.Tensor(ctx, out.buffer, shape, offset=12)
    softmax_backward(y.detach(), g_odd, 1, dx=dx)
    assert_close(dx.numpy(), t.grad.numpy())
