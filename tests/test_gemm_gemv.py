"""The GEMM family's "gemv" solver (kernels/gemm_gemv.cl.mako): products with M or N at most 8,
every transpose (the matrix's rows or its columns contiguous), the epilogue, splits along K,
float4 and element reads, batches, 16-bit storage and folded operands, each against numpy in
float64 on poisoned outputs; and that the shipped rules give matrix-vector products to it."""
import json
import os
import types

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py.context import PlanCache
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import GemmPlan

from conftest import assert_close, assert_repeats_build_nothing, poisoned, random

F = dp.functional
GEMV = dict(gemm_ops.DEFAULT_GEMV)


def _run(ctx, rng, M, N, K, trans_a, trans_b, params, a_off=0, alpha=1.0, beta=0.0,
         bias_per=None, activation=None):
    """op(A) @ op(B) through a plan of ``params`` against float64; A ``a_off`` elements into its
    buffer. Returns the plan."""
    a = random(rng, (K, M) if trans_a else (M, K))
    b = random(rng, (N, K) if trans_b else (K, N))
    A = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, (a_off,)), a.reshape(-1)]))
    B = dp.Tensor.from_numpy(ctx, b)
    c0 = random(rng, (M, N))
    C = dp.Tensor.from_numpy(ctx, c0) if beta else poisoned(ctx, (M, N))
    ref = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b) * alpha
    ref += beta * c0
    bias = None
    if bias_per:
        bias_np = random(rng, (N if bias_per == "n" else M,))
        bias = dp.Tensor.from_numpy(ctx, bias_np)
        ref += bias_np if bias_per == "n" else bias_np[:, None]
    if activation == "relu":
        ref = np.maximum(ref, 0)
    plan = GemmPlan(ctx, M, N, K, A.buffer, a_off, a.shape[1], B.buffer, 0, b.shape[1],
                    C.buffer, 0, N, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta,
                    bias_buf=None if bias is None else bias.buffer,
                    bias_per=bias_per or "n", activation=activation, params=params)
    plan.enqueue()
    assert plan.algorithm == "gemv"
    assert_close(C.numpy(), ref)
    return plan


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("M, N, K", [(1, 37, 53), (45, 1, 61), (1, 64, 256), (128, 1, 512),
                                     (1, 1, 77), (3, 64, 256), (40, 8, 96),
                                     (8, 37, 53), (7, 4, 33)])
def test_every_form(ctx, rng, M, N, K, trans_a, trans_b):
    plan = _run(ctx, rng, M, N, K, trans_a, trans_b, GEMV)
    # The matrix (op(A) where N <= M) read as float4 wherever its layout allows: offsets 0
    # here, so where its leading dimension is a multiple of 4; along its rows the vectors too
    # where each is contiguous (a row of the other operand, or a dense single vector).
    w_is_a = N <= M
    vectors = N if w_is_a else M
    rows = not trans_a if w_is_a else trans_b
    ld = (M if trans_a else K) if w_is_a else (K if trans_b else N)
    x_ld = (N if trans_b else K) if w_is_a else (M if trans_a else K)
    x_rows = (trans_b if w_is_a else not trans_a) or vectors == 1
    vec = ld % 4 == 0
    x_vec = vec and rows and x_rows and (vectors == 1 or x_ld % 4 == 0)
    assert (plan.config.global_vec, plan.config.global_vec_b) == (4 if vec else 1,
                                                                  4 if x_vec else 1)
    assert plan.config.gemv_vectors == vectors


@pytest.mark.parametrize("params", [
    dict(GEMV, split_k=3),                      # split along K, reduced by gemm_splitk_reduce
    {"solver": "gemv", "lanes": 5, "group": 2},  # lanes not a power of two
    {"solver": "gemv", "lanes": 64, "group": 1},
    {"solver": "gemv", "lanes": 1, "group": 16, "split_k": 7}])
@pytest.mark.parametrize("M, N, trans_a, trans_b", [(1, 70, False, True), (1, 70, False, False),
                                                    (66, 1, False, False), (66, 1, True, False)])
def test_shapes_of_the_work(ctx, rng, params, M, N, trans_a, trans_b):
    plan = _run(ctx, rng, M, N, 301, trans_a, trans_b, params)
    if params.get("split_k"):
        assert plan.splits == params["split_k"]


@pytest.mark.parametrize("M, N, trans_a, trans_b", [(1, 48, False, True), (48, 1, True, False)])
def test_epilogue_and_unaligned_operands(ctx, rng, M, N, trans_a, trans_b):
    """alpha, beta, a bias along either dimension and an activation, through one pass and
    through a split; an operand at an offset that is not a whole float4 reads elements."""
    for params in (GEMV, dict(GEMV, split_k=4)):
        for bias_per in ("n", "m"):
            _run(ctx, rng, M, N, 96, trans_a, trans_b, params, alpha=0.7, beta=0.3,
                 bias_per=bias_per, activation="relu")
    plan = _run(ctx, rng, M, N, 96, trans_a, trans_b, GEMV, a_off=1)
    # A misaligned: read element by element, as the matrix (N == 1) or as the vector.
    assert (plan.config.global_vec, plan.config.global_vec_b) == ((1, 1) if N == 1 else (4, 1))
    plan = _run(ctx, rng, M, N, 96, trans_a, trans_b, GEMV, a_off=4)
    assert plan.config.global_vec == 4


def test_the_split_fills_the_device(ctx, rng):
    """Without split_k, a long K is split where the outputs alone leave work-items idle."""
    plan = _run(ctx, rng, 1, 8, 20000, False, True, GEMV)
    items = 8 * GEMV["lanes"]
    wanted = gemm_ops.GemvSolver.ITEMS_PER_UNIT * ctx.info.compute_units
    assert plan.splits == min(wanted // items, 20000 // (GEMV["lanes"] * 4 * 8))
    assert plan.splits > 1


def test_batched(ctx, rng):
    """A batch of matrix-vector products: batch strides, and one vector broadcast (stride 0)."""
    batch, N, K = 3, 40, 72
    a, b = random(rng, (batch, 1, K)), random(rng, (batch, N, K))
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                          trans_b=True)
    assert_close(out.numpy(), a.astype(np.float64) @ np.swapaxes(b, 1, 2))
    x, W = random(rng, (5, 1, 64)), random(rng, (5, 64, 1))
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, W))
    assert_close(out.numpy(), x.astype(np.float64) @ W)


@pytest.mark.parametrize("dtype", [dp.float16, dp.bfloat16], ids=["float16", "bfloat16"])
def test_16bit_operands(ctx, rng, dtype):
    """16-bit storage read element by element, summed in float32, rounded once."""
    x, W = random(rng, (1, 200)), random(rng, (96, 200))
    X = dp.Tensor.from_numpy(ctx, x, dtype=dtype)
    Wt = dp.Tensor.from_numpy(ctx, W, dtype=dtype)
    out = dp.gemm(X, Wt, trans_b=True)
    assert out.dtype is dtype
    ref = X.to(dp.float32).numpy().astype(np.float64) @ Wt.to(dp.float32).numpy().T
    tol = 1e-2 if dtype is dp.bfloat16 else 2e-3
    assert np.abs(out.to(dp.float32).numpy() - ref).max() <= tol * np.abs(ref).max()


def test_linear_of_one_row_and_its_gradients(ctx, rng):
    """F.linear on one token (M == 1): the forward and the input's gradient are
    matrix-vector products."""
    torch = pytest.importorskip("torch")
    x, w, b = random(rng, (1, 96)), random(rng, (40, 96)), random(rng, (40,))
    X, Wt, Bt = (dp.Tensor.from_numpy(ctx, v, requires_grad=True) for v in (x, w, b))
    y = F.linear(X, Wt, Bt)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.linear(tx, tw, tb)
    assert_close(y.numpy(), ty.detach().numpy())
    g = random(rng, (1, 40))
    y.backward(dp.Tensor.from_numpy(ctx, g))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    for ours, theirs in ((X, tx), (Wt, tw), (Bt, tb)):
        assert_close(ours.grad.numpy(), theirs.grad.numpy())


def test_folded_operands_of_a_1x1_convolution(ctx, rng):
    """A 1x1 convolution with one output channel (M == 1, the image folded into N) and one
    over a single pixel (N == 1): folded operands, read element by element."""
    torch = pytest.importorskip("torch")
    for x_shape, w_shape in (((2, 8, 5, 7), (1, 8, 1, 1)), ((1, 24, 1, 1), (10, 24, 1, 1))):
        x, w = random(rng, x_shape), random(rng, w_shape)
        out = F.conv2d(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w))
        ref = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64),
                                         torch.tensor(w, dtype=torch.float64))
        assert_close(out.numpy(), ref.numpy())


def test_repeats_build_nothing(ctx, rng):
    x, W = (dp.Tensor.from_numpy(ctx, random(rng, s)) for s in ((1, 128), (64, 128)))
    assert_repeats_build_nothing(ctx, lambda: dp.gemm(x, W, trans_b=True))


def test_rules_give_vectors_to_gemv():
    """Every shipped entry (the H200's, each vendor's, the default) gives M or N of 1 to gemv,
    and of at most 8 in a product of at least 262144 multiply-adds where the vectors are
    contiguous along K or the matrix's columns are; nothing else. Forced, gemv is refused past
    8 vectors."""
    table = os.path.join(os.path.dirname(__file__), "data", "gemm_selection.json")
    with open(table, encoding="utf-8") as f:
        devices = json.load(f)["devices"]
    for fields in devices.values():
        info = types.SimpleNamespace(**dict(fields, extensions=frozenset(fields["extensions"])))
        fake = types.SimpleNamespace(info=info, memo={}, plans=PlanCache())
        def solver(M, N, K, ta=False, tb=False):
            return gemm_ops.select_params(fake, M, N, K, trans_a=ta, trans_b=tb)["solver"]
        for ta in (False, True):
            for tb in (False, True):
                for M, N, K in ((1, 4096, 4096), (4096, 1, 4096), (1, 7, 3), (1, 1, 100000)):
                    assert solver(M, N, K, ta, tb) == "gemv", (fields, M, N, ta, tb)
                # A few vectors: where they are contiguous along K or the matrix's columns are.
                assert (solver(8, 4096, 4096, ta, tb) == "gemv") == (not ta or not tb)
                assert (solver(4096, 3, 4096, ta, tb) == "gemv") == (ta or tb)
                for M, N, K in ((9, 4096, 4096), (4, 4, 4), (8, 64, 64)):
                    assert solver(M, N, K, ta, tb) != "gemv", (fields, M, N, ta, tb)
        with pytest.raises(dp.UnsupportedError, match="needs M or N at most 8"):
            gemm_ops.select_params(fake, 9, 9, 2, algorithm="gemv")
