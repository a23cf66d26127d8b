"""GEMM tiled-kernel options: pipelined slice copies (``pipeline``, cp.async on NVIDIA, plain
copies elsewhere), the work-item layout in runs of 32 (``lanes_n``) and the grouped tile order
(``tile_group``), each forced through ``params`` and compared with numpy float64 on poisoned
outputs. Few parameter sets: each is a compile on PoCL. The PTX path is rendered here and
checked on NVIDIA by benchmarks/gemm_probe.py (every transpose, edge shapes)."""
import dataclasses

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import Fold, GemmConfig, GemmPlan, kernel_source, params_problem

from conftest import assert_close, poisoned, random


def tiled(tm, tn, tk, wm, wn, vec, pad, gvec, **extra):
    return dict({"kernel": "tiled", "tile_m": tm, "tile_n": tn, "tile_k": tk, "wpt_m": wm,
                 "wpt_n": wn, "vec": vec, "pad": pad, "double_buffer": 1, "split_k": 1,
                 "global_vec": gvec}, **extra)


# Three stages, 16-byte copies of B, element copies of A into its transposed stage; 8 x 8
# work-items in 4 x 8 runs; tiles walked three rows at a time.
PIPELINE3 = tiled(32, 32, 16, 4, 4, 4, 4, 4, pipeline=3, lanes_n=4, tile_group=3)
# Two stages, 8-byte copies of a transposed A, element copies of a transposed B, split K; the
# kernel without its work-group size declaration (as built for a register cap on NVIDIA).
PIPELINE2 = tiled(16, 16, 8, 2, 2, 2, 2, 2, pipeline=2, split_k=3, reqd_size=0)


def reference(a, b, trans_a=False, trans_b=False):
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    b64 = b.astype(np.float64).T if trans_b else b.astype(np.float64)
    return a64 @ b64


def run(ctx, params, a, b, M, N, K, trans_a=False, trans_b=False):
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, a.shape[1], B.buffer, 0, b.shape[1], C.buffer, 0,
                    N, trans_a=trans_a, trans_b=trans_b, params=params)
    plan.enqueue()
    return C.numpy(), plan


def test_pipeline_three_stages(ctx, rng):
    # Whole tiles (the unguarded copies), edges in M, N and K, K shorter than one slice and
    # longer than the stages, and three rows of tiles (one whole group of the tile order).
    for M, N, K in ((64, 64, 64), (100, 72, 36), (8, 4, 4), (96, 96, 200), (33, 40, 20)):
        a, b = random(rng, (M, K)), random(rng, (K, N))
        out, plan = run(ctx, PIPELINE3, a, b, M, N, K)
        # cp.async where the device has it (NVIDIA, compute capability 8.0+), plain copies else.
        assert plan.config.global_vec == 4
        assert plan.config.nv_async == int(gemm_ops._has_cp_async(ctx))
        assert_close(out, reference(a, b))


def test_pipeline_two_stages_transposed_split(ctx, rng):
    for M, N, K in ((38, 46, 30), (16, 16, 96), (2, 50, 74)):
        a, b = random(rng, (K, M)), random(rng, (N, K))
        out, plan = run(ctx, PIPELINE2, a, b, M, N, K, trans_a=True, trans_b=True)
        assert plan.algorithm == "splitk" and plan.config.global_vec == 2
        assert plan.config.reqd_size == 0
        assert_close(out, reference(a, b, True, True))


def test_pipeline_folded_operands(ctx, rng):
    """A folded along K as a strided sample (offsets computed at every copy), B folded along N
    (offsets computed once), through the pipelined copies."""
    M, K, N = 12, 24, 30
    fold_a = Fold(12, 40, width=3, row_step=8, col_step=2)   # 4 x 3 samples per 40 elements
    fold_b = Fold(10, 16)                                   # 3 images of 10 columns, 16 apart
    lda, ldb = 2, 48
    a_store = random(rng, (M - 1) * lda + fold_a.max_offset(K) + 1)
    b_store = random(rng, (K - 1) * ldb + fold_b.max_offset(N) + 1)
    a = np.array([[a_store[m * lda + fold_a.offset(k)] for k in range(K)] for m in range(M)])
    b = np.array([[b_store[k * ldb + fold_b.offset(n)] for n in range(N)] for k in range(K)])
    A, B = dp.Tensor.from_numpy(ctx, a_store), dp.Tensor.from_numpy(ctx, b_store)
    C = poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, lda, B.buffer, 0, ldb, C.buffer, 0, N,
                    fold_a=fold_a, fold_b=fold_b, params=dict(PIPELINE3, global_vec=1))
    plan.enqueue()
    assert_close(C.numpy(), reference(a, b))


def test_cp_async_rendering():
    """The NVIDIA path renders cp.async copies, a commit per slice and a wait for all but
    PIPELINE - 2 groups; the portable path renders none of them."""
    derived = GemmConfig(global_vec=4, c_vec=4, nv_async=1)
    source = kernel_source(PIPELINE3, derived)
    assert "cp.async.cg.shared.global [%0], [%1], 16;" in source
    assert "COPY_WAIT(1);" in source and source.count("COPY_COMMIT();") == 3
    plain = kernel_source(PIPELINE3, dataclasses.replace(derived, nv_async=0))
    assert "asm volatile" not in plain and "COPY_WAIT(1);" in plain
    assert "reqd_work_group_size(NTHREADS, 1, 1)" in plain
    undeclared = kernel_source(PIPELINE3, dataclasses.replace(derived, reqd_size=0))
    assert "reqd_work_group_size(NTHREADS" not in undeclared

def test_option_problems(ctx):
    assert params_problem(PIPELINE3, ctx.info) is None
    assert "pipeline" in params_problem(dict(PIPELINE3, pipeline=5), ctx.info)
    assert "lanes_n" in params_problem(dict(PIPELINE3, lanes_n=3), ctx.info)
    assert "lanes_n" in params_problem(dict(PIPELINE3, lanes_n=16), ctx.info)  # 16 x 2 runs
    assert "tile_group" in params_problem(dict(PIPELINE3, tile_group=0), ctx.info)
    # Three 128 x 128 x 16 stages need 50 KiB of local memory.
    big = tiled(128, 128, 16, 8, 8, 4, 4, 4, pipeline=3)
    assert "local memory" in (params_problem(big, type("Info", (), {
        "max_work_group_size": 1024, "local_mem_size": 48 * 1024})) or "")
    buf = dp.Tensor.from_numpy(ctx, np.ones(64, np.float32)).buffer
    with pytest.raises(dp.UnsupportedError, match="pipeline must be"):
        GemmPlan(ctx, 4, 4, 4, buf, 0, 4, buf, 0, 4, buf, 0, 4,
                 params=dict(PIPELINE3, pipeline=1))
