"""GEMM's stream-K schedule (rule option ``stream_k``) against numpy float64.

PoCL's CPU device has two compute units here, so ``stream_k`` s gives 2 s slots: the shapes
below leave a last wave that the schedule splits along K, with work-groups whose range ends
inside a tile, strictly inside one, or on a tile's end. Every case runs twice on a poisoned C
(the flags must be zero again after a launch and the sums come in a fixed order: the same
bits), and the flags are read back.
"""
import numpy as np
import pyopencl as cl
import pytest

import dlprim_py as dp
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import Fold, GemmPlan, stream_k_schedule

from conftest import assert_close, poisoned, random
from test_gemm import operands, reference, tiled

# Vector loads and stores (32 x 32 tiles); scalar loads with one local-memory stage (the
# folded operands' case).
VECTOR = tiled(32, 32, 16, 4, 4, 4, 4, 1, 4)
SCALAR = tiled(16, 16, 8, 2, 2, 2, 0, 0, 1)


def flags_of(ctx, plan):
    groups = plan.stream_k[1]
    _, flags = gemm_ops._stream_k_space(ctx, groups, plan.params["tile_m"] * plan.params["tile_n"])
    host = np.empty(groups, np.int32)
    cl.enqueue_copy(ctx.queue, host, flags, is_blocking=True)
    return host


def run_twice(ctx, plan, C, shape):
    """Two launches, C poisoned before each; the results of both."""
    outs = []
    for _ in range(2):
        cl.enqueue_fill_buffer(ctx.queue, C.buffer, np.float32(np.nan), 0, C.nbytes)
        plan.enqueue()
        outs.append(C.numpy().reshape(shape))
    return outs


# (M, N, K, stream_k): tiles past the last whole wave shared along K (K of at least
# STREAM_K_MIN_TILE_ITERATIONS tile depths), K not a multiple of the tile's depth, edge tiles;
# ranges shorter than a tile (groups strictly inside a tile).
CASES = [(100, 100, 1100, 3), (64, 96, 1030, 5), (130, 70, 1500, 1), (45, 150, 1333, 2)]


def test_stream_k_random_shapes(ctx, rng):
    for M, N, K, per_unit in CASES:
        a, b = operands(rng, M, N, K, False, False)
        A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
        C = poisoned(ctx, (M, N))
        plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N,
                        params=dict(VECTOR, stream_k=per_unit))
        assert plan.stream_k is not None, (M, N, K, per_unit)
        first, second = run_twice(ctx, plan, C, (M, N))
        assert_close(first, reference(a, b, False, False))
        assert np.array_equal(first, second)
        assert not flags_of(ctx, plan).any()


def test_stream_k_epilogue_and_transposes(ctx, rng):
    M, N, K = 70, 100, 1040
    for trans_a, trans_b in ((True, True),):
        a, b = operands(rng, M, N, K, trans_a, trans_b)
        c = random(rng, (M, N))
        bias = random(rng, N)
        A, B, Bias = (dp.Tensor.from_numpy(ctx, x) for x in (a, b, bias))
        C = dp.Tensor.from_numpy(ctx, c)
        plan = GemmPlan(ctx, M, N, K, A.buffer, 0, a.shape[1], B.buffer, 0, b.shape[1],
                        C.buffer, 0, N, trans_a=trans_a, trans_b=trans_b, alpha=-0.75,
                        beta=1.5, bias_buf=Bias.buffer, activation="relu",
                        params=dict(VECTOR, stream_k=4))
        assert plan.stream_k is not None
        plan.enqueue()
        assert_close(C.numpy(), reference(a, b, trans_a, trans_b, -0.75, 1.5, c, bias, "n",
                                          "relu"))
        assert not flags_of(ctx, plan).any()


def test_stream_k_folded_convolution_operands(ctx, rng):
    """A 1x1 convolution's GEMM: y (K x n*P) = w (K x C) @ x (C x n*P), x and y folded."""
    n, channels, out_channels, P = 3, 520, 36, 50
    w = random(rng, (out_channels, channels))
    x = random(rng, (n, channels, P))
    scale = random(rng, out_channels)
    W, X, S = (dp.Tensor.from_numpy(ctx, t) for t in (w, x, scale))
    Y = poisoned(ctx, (n, out_channels, P))
    plan = GemmPlan(ctx, out_channels, n * P, channels, W.buffer, 0, channels, X.buffer, 0, P,
                    Y.buffer, 0, P, fold_b=Fold(P, channels * P),
                    fold_c=Fold(P, out_channels * P), order="conv", scale_buf=S.buffer,
                    scale_per="m", params=dict(SCALAR, stream_k=4))
    assert plan.stream_k is not None
    first, second = run_twice(ctx, plan, Y, (n, out_channels, P))
    ref = np.einsum("kc,ncp->nkp", w.astype(np.float64), x) * scale[None, :, None]
    assert_close(first, ref)
    assert np.array_equal(first, second)


def test_stream_k_schedule():
    class Info:
        compute_units = 132

    rule = dict(tiled(128, 128, 16, 8, 8, 4, 4, 1, 1), stream_k=2)
    # 1024 tiles on 264 slots: 3 whole waves, the 232 tiles left shared by 264 groups.
    assert stream_k_schedule(rule, Info, 4096, 4096, 4096) == (232, 264)
    # Whole waves (2 x 264 tiles), no option, a short K: the plain schedule.
    assert stream_k_schedule(rule, Info, 128 * 24, 128 * 22, 4096) is None
    assert stream_k_schedule(dict(rule, stream_k=0), Info, 4096, 4096, 4096) is None
    assert stream_k_schedule(rule, Info, 4096, 4096, 16 * 63) is None
    assert stream_k_schedule(rule, Info, 4096, 4096, 16 * 64) == (232, 264)
    # One tile past a whole wave: a group per slot all the same, ranges of 4 K steps at least.
    assert stream_k_schedule(rule, Info, 128 * 265, 128, 16 * 64) == (1, 16)


def test_stream_k_plain_where_it_does_not_apply(ctx, rng):
    """A batch, or a split along K: the plain schedule (the option is a rule's hint)."""
    M, N, K = 64, 96, 200
    a, b = operands(rng, M, N, K, False, False, batch=2)
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (2, M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N, batch=2,
                    stride_a=M * K, stride_b=K * N, stride_c=M * N,
                    params=dict(VECTOR, stream_k=5))
    assert plan.stream_k is None
    plan.enqueue()
    assert_close(C.numpy(), reference(a, b, False, False))
    C = poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N,
                    params=dict(VECTOR, stream_k=5, split_k=2))
    assert plan.stream_k is None and plan.algorithm == "splitk"
    plan.enqueue()
    assert_close(C.numpy(), reference(a[0], b[0], False, False))


def test_stream_k_option_problems(ctx):
    mf = cl.mem_flags
    buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, 4 * 64 * 64)
    for bad, match in ((-1, "stream_k must be an int"), ("2", "stream_k must be an int"),
                       (True, "stream_k must be an int")):
        with pytest.raises(dp.UnsupportedError, match=match):
            GemmPlan(ctx, 64, 64, 64, buf, 0, 64, buf, 0, 64, buf, 0, 64,
                     params=dict(VECTOR, stream_k=bad))
    with pytest.raises(dp.UnsupportedError, match="tile_group 1 and pipeline 0"):
        GemmPlan(ctx, 64, 64, 64, buf, 0, 64, buf, 0, 64, buf, 0, 64,
                 params=dict(VECTOR, stream_k=2, tile_group=2))
