"""TF32 GEMM: the math-mode switch (dp.backends.allow_tf32, ctx.allow_tf32), the "mma" solver's
applicability and forcing, its kernel's addressing through the emulated mma (any device), and the
tensor-core kernel itself against float64 where an NVIDIA GPU of compute capability 8.0 or later
is present."""
import math
import types

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import backends, program, solver
from dlprim_py.context import PlanCache
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import Fold, GemmPlan, GemmProblem

from conftest import assert_close, poisoned, random

# A small parameter set of the mma kernel (2 warps, 16 x 16 accumulators each) that builds in
# seconds on PoCL, emulated.
EMULATED = {"solver": "mma", "tile_m": 32, "tile_n": 16, "tile_k": 16, "warps_m": 2,
            "warps_n": 1, "stages": 2, "emulate": 1}
H200 = {"name": "NVIDIA H200", "vendor": "nvidia", "architecture": "nvidia:sm_90",
        "platform_name": "NVIDIA CUDA", "max_work_group_size": 1024, "local_mem_size": 49152,
        "is_gpu": True, "compute_units": 132, "extensions": ["cl_nv_device_attribute_query"]}


def fake_context(**fields):
    """What choosing reads of a context: the device's facts and the memo and plan caches."""
    facts = dict(H200, **fields)
    info = types.SimpleNamespace(**dict(facts, extensions=frozenset(facts["extensions"])))
    return types.SimpleNamespace(info=info, memo={}, plans=PlanCache(), allow_tf32=None)


def has_mma(ctx):
    return gemm_ops.mma_device_problem(ctx.info) is None


@pytest.fixture
def tf32_off(ctx, monkeypatch):
    """The switches as a user finds them, restored after the test."""
    monkeypatch.setattr(backends, "allow_tf32", False)
    monkeypatch.setattr(ctx, "allow_tf32", None)


def tf32_round(x):
    """float64 of x rounded to TF32 as cvt.rna.tf32.f32 does (nearest, ties away from 0)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def tf32_bound(a, b):
    """TF32 keeps 10 mantissa bits: each operand within 2^-11 relative, a product within about
    2^-10, a sum of K products of random sign within about 2^-10 * sqrt(K) * max|a| * max|b|.
    torch documents ~1e-3 relative for TF32; 3e-3 * sqrt(K) leaves a factor of 3 over the
    estimate and stays far under an indexing error (a wrong or missing term is ~ max|a||b|)."""
    K = a.shape[-1]
    return 3e-3 * math.sqrt(K) * float(np.abs(a).max()) * float(np.abs(b).max())


# ---- the switch -----------------------------------------------------------------------------

def test_switch_defaults_and_override(ctx, tf32_off, monkeypatch):
    assert backends.allow_tf32 is False and dp.backends is backends
    assert ctx.allow_tf32 is None and not backends.tf32_allowed(ctx)
    monkeypatch.setattr(backends, "allow_tf32", True)
    assert backends.tf32_allowed(ctx)
    ctx.allow_tf32 = False
    assert not backends.tf32_allowed(ctx)
    monkeypatch.setattr(backends, "allow_tf32", False)
    ctx.allow_tf32 = True
    assert backends.tf32_allowed(ctx)


def test_switch_is_part_of_the_plan_key(ctx, rng, tf32_off, monkeypatch):
    """Toggling the switch makes (or finds) the plan of the other mode at the next call; a
    repeated call in either mode builds no program and creates no kernel object."""
    M, N, K = 40, 24, 36
    a, b = random(rng, (M, K)), random(rng, (K, N))
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (M, N))
    dp.gemm(A, B, c=C)
    plans = len(ctx.plans)
    selected = gemm_ops.select_params(ctx, M, N, K)
    builds, kernels = [], []
    real_build = program.build_source
    real_kernel = program.new_kernel
    monkeypatch.setattr(program, "build_source",
                        lambda *args, **kw: builds.append(args) or real_build(*args, **kw))
    monkeypatch.setattr(program, "new_kernel",
                        lambda *args, **kw: kernels.append(args) or real_kernel(*args, **kw))
    dp.gemm(A, B, c=C)
    assert len(ctx.plans) == plans and not kernels
    monkeypatch.setattr(backends, "allow_tf32", True)
    dp.gemm(A, B, c=C)
    assert len(ctx.plans) > plans, "a TF32 call must not reuse the float32 plan"
    with_tf32 = len(ctx.plans)
    made = len(kernels)
    for _ in range(3):
        dp.gemm(A, B, c=C)
    assert len(ctx.plans) == with_tf32 and len(kernels) == made
    ctx.allow_tf32 = False       # the context's override: back to the float32 plan
    dp.gemm(A, B, c=C)
    assert len(ctx.plans) == with_tf32 and len(kernels) == made
    if not has_mma(ctx):
        # Nothing applies in TF32 here: both plans run the same float32 program.
        assert not builds
    assert gemm_ops.select_params(ctx, M, N, K) == selected
    assert_close(C.numpy(), a.astype(np.float64) @ b.astype(np.float64))


def test_problem_key_and_features():
    assert GemmProblem(8, 8, 8).key() == "gemm-m8-n8-k8-b1"
    assert GemmProblem(8, 8, 8, 1, True).key() == "gemm-m8-n8-k8-b1-tf32"
    assert GemmProblem(8, 8, 8).features()["tf32"] == 0
    assert GemmProblem(8, 8, 8, tf32=True).features()["tf32"] == 1
    assert gemm_ops.features(8, 8, 8)["tf32"] == 0


# ---- applicability, choice, forcing -------------------------------------------------------

def test_mma_is_listed_and_applies_only_with_tf32_on_nvidia_sm80(ctx):
    assert "mma" in gemm_ops.ALGORITHMS and "mma" in solver.family("gemm").solvers
    fam = gemm_ops.FAMILY
    # This device: applicable with TF32 allowed only where it has the tensor-core kernel
    # (never on PoCL), never with TF32 off.
    assert ("mma" in fam.applicable(ctx, GemmProblem(512, 512, 512, 1, True))) == has_mma(ctx)
    assert "mma" not in fam.applicable(ctx, GemmProblem(512, 512, 512))
    h200 = fake_context()
    assert "mma" in fam.applicable(h200, GemmProblem(1024, 1024, 1024, 1, True))
    assert "mma" not in fam.applicable(h200, GemmProblem(1024, 1024, 1024))
    for fields, why in (({"architecture": "nvidia:sm_75"}, "compute capability 8.0 or later, "
                         "the device has 7.5"),
                        ({"vendor": "amd", "architecture": "amd:gfx90a"}, "NVIDIA GPUs only"),
                        ({"architecture": None}, "does not report")):
        other = fake_context(**fields)
        assert "mma" not in fam.applicable(other, GemmProblem(1024, 1024, 1024, 1, True))
        assert why in fam.solver("mma").refusal(other, GemmProblem(64, 64, 64, 1, True))


def test_mma_chosen_by_default_where_it_pays_on_the_h200():
    h200 = fake_context()
    assert gemm_ops.select_params(h200, 4096, 4096, 4096, tf32=True)["solver"] == "mma"
    narrow = gemm_ops.select_params(h200, 200704, 64, 256, tf32=True)
    assert narrow["solver"] == "mma" and narrow["tile_n"] == 64
    assert gemm_ops.select_params(h200, 1024, 1024, 1024, tf32=True)["tile_n"] == 64
    assert gemm_ops.select_params(h200, 8192, 8192, 8192, tf32=True)["warps_n"] == 2
    # Small problems and TF32 off keep the float32 kernels.
    assert gemm_ops.select_params(h200, 64, 64, 64, tf32=True)["solver"] != "mma"
    assert gemm_ops.select_params(h200, 4096, 4096, 4096)["solver"] == "tiled"
    # A pre-Ampere NVIDIA device skips the rule and keeps float32.
    turing = fake_context(name="Tesla T4", architecture="nvidia:sm_75")
    assert gemm_ops.select_params(turing, 4096, 4096, 4096, tf32=True)["solver"] != "mma"


def test_forcing_mma_where_it_does_not_apply(ctx, rng, tf32_off, monkeypatch):
    A = dp.Tensor.from_numpy(ctx, random(rng, (16, 16)))
    with pytest.raises(dp.UnsupportedError, match="GEMM algorithm 'mma' does not apply to "
                                                  "gemm-m16-n16-k16-b1: TF32 is not allowed"):
        dp.gemm(A, A, algorithm="mma")
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "mma")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_GEMM_ALGO=mma does not apply"):
        dp.gemm(A, A)
    monkeypatch.delenv("DLPRIM_GEMM_ALGO")
    dp.config.reload()
    if has_mma(ctx):
        pytest.skip("the device runs the mma kernel (test_mma_kernel_against_float64)")
    ctx.allow_tf32 = True
    with pytest.raises(dp.UnsupportedError, match="GEMM algorithm 'mma' does not apply to "
                                                  "gemm-m16-n16-k16-b1-tf32: mma.sync runs"):
        dp.gemm(A, A, algorithm="mma")
    # The kernel's own parameters, not emulated, are refused the same way.
    params = dict(gemm_ops.DEFAULT_MMA)
    assert "mma.sync" in gemm_ops.params_problem(params, ctx.info)
    with pytest.raises(dp.UnsupportedError, match="do not run here"):
        GemmPlan(ctx, 16, 16, 16, A.buffer, 0, 16, A.buffer, 0, 16, A.buffer, 0, 16,
                 params=params)


def test_mma_parameter_checks():
    info = fake_context().info
    good = dict(gemm_ops.DEFAULT_MMA)
    assert gemm_ops.params_problem(good, info) is None
    assert gemm_ops.mma_local_bytes(good) <= 49152
    for change, why in (({"tile_k": 12}, "powers of two"), ({"tile_n": 16}, "whole mma tiles"),
                        ({"stages": 5}, "stages must be"),
                        ({"tile_m": 256, "stages": 3}, "local memory"),
                        ({"warps_m": 8, "warps_n": 8}, "work-items"),
                        ({"emulate": 2}, "emulate must"), ({"round": "rz"}, "round must"),
                        ({"staged": 1, "stages": 3}, "staged slices take 2 stages"),
                        ({"stage_mn": 1}, "takes staged slices"),
                        ({"stage_mn": 2, "staged": 1}, "stage_mn must be")):
        assert why in gemm_ops.params_problem(dict(good, **change), info), change
    assert "lack" in gemm_ops.params_problem({"solver": "mma"}, info)
    # 256 x 128 tiles 16 deep fit 48 KiB only with both slices M (N) contiguous.
    wide = dict(good, tile_m=256, tile_n=128, warps_m=4, warps_n=2, staged=1, round="int")
    assert "local memory" in gemm_ops.params_problem(dict(wide, tile_k=16), info) or \
        gemm_ops.mma_local_bytes(dict(wide, tile_k=16)) > 49152
    assert gemm_ops.params_problem(dict(wide, tile_k=8, stage_mn=1), info) is None


def test_allow_tf32_off_nvidia_keeps_float32(ctx, rng, tf32_off, monkeypatch):
    """With TF32 allowed on a device without the mma kernel, results are float32's."""
    if has_mma(ctx):
        pytest.skip("the device runs the mma kernel")
    monkeypatch.setattr(backends, "allow_tf32", True)
    for M, N, K, ta, tb in ((300, 260, 70, False, False), (33, 65, 129, True, True)):
        a = random(rng, (K, M) if ta else (M, K))
        b = random(rng, (N, K) if tb else (K, N))
        out = dp.gemm(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                      trans_a=ta, trans_b=tb)
        ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        assert_close(out.numpy(), ref)


# ---- the kernel's addressing, emulated (any device) ---------------------------------------

def _run(ctx, rng, M, N, K, ta, tb, params, batch=1, pad=0, offset=0, beta=0.0, bias=False,
         activation=None):
    """A GEMM with the mma kernel of ``params``: leading dimensions ``pad`` past the rows,
    operands ``offset`` elements into their buffers, ``batch`` strided products. Returns the
    output and op(A), op(B) (float32) and C's initial value."""
    a_rows, a_cols = (K, M) if ta else (M, K)
    b_rows, b_cols = (N, K) if tb else (K, N)
    lda, ldb, ldc = a_cols + pad, b_cols + pad, N + pad
    sa, sb, sc = a_rows * lda + pad, b_rows * ldb + pad, M * ldc + pad
    a_store = random(rng, (offset + batch * sa,))
    b_store = random(rng, (offset + batch * sb,))
    c0 = random(rng, (offset + batch * sc,))
    bias_v = random(rng, (N,))
    A, B = dp.Tensor.from_numpy(ctx, a_store), dp.Tensor.from_numpy(ctx, b_store)
    C = dp.Tensor.from_numpy(ctx, c0 if beta else np.full_like(c0, np.nan))
    Bias = dp.Tensor.from_numpy(ctx, bias_v)
    plan = GemmPlan(ctx, M, N, K, A.buffer, offset, lda, B.buffer, offset, ldb, C.buffer, offset,
                    ldc, trans_a=ta, trans_b=tb, batch=batch, stride_a=sa, stride_b=sb,
                    stride_c=sc, beta=beta, bias_buf=Bias.buffer if bias else None,
                    activation=activation, params=params)
    assert plan.algorithm == "mma"
    plan.enqueue()
    out = C.numpy()

    def view(store, rows, cols, ld, stride, n):
        return np.stack([store[offset + i * stride: offset + i * stride + rows * ld]
                         .reshape(rows, ld)[:, :cols] for i in range(n)])
    a = view(a_store, a_rows, a_cols, lda, sa, batch)
    b = view(b_store, b_rows, b_cols, ldb, sb, batch)
    c = view(out, M, N, ldc, sc, batch)
    cin = view(c0, M, N, ldc, sc, batch)
    a = np.swapaxes(a, 1, 2) if ta else a
    b = np.swapaxes(b, 1, 2) if tb else b
    # Elements of C's buffer between rows and batches are not written.
    gaps = np.ones(out.shape, bool)
    for i in range(batch):
        for r in range(M):
            start = offset + i * sc + r * ldc
            gaps[start:start + N] = False
    assert np.isnan(out[gaps]).all() if not beta else np.array_equal(out[gaps], c0[gaps])
    return c, a, b, cin, (bias_v if bias else None)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_emulated_mma_every_layout(ctx, rng, ta, tb):
    """The mma kernel's addressing, with the mma computed through local memory: ragged edges
    (M, N, K not multiples of the tiles, unaligned rows: 4-byte copies) and whole tiles
    (16-byte copies), against float64 of the TF32-rounded operands (what the tensor cores
    compute, up to the order of the sums) and within TF32's bound of the float64 product."""
    for M, N, K in ((37, 45, 29), (64, 32, 48)):
        c, a, b, _, _ = _run(ctx, rng, M, N, K, ta, tb, EMULATED)
        assert_close(c, tf32_round(a) @ tf32_round(b))
        assert np.abs(c - a.astype(np.float64) @ b.astype(np.float64)).max() <= tf32_bound(a, b)


@pytest.mark.parametrize("ta,tb", [(False, False), (True, True)])
def test_emulated_mma_split_k(ctx, rng, ta, tb):
    """K in chunks (work-groups of their own, raw sums into a workspace, the epilogue applied
    by gemm_splitk_reduce): a chunk count that leaves a short last chunk, one longer than K
    (one pass), batches with beta, bias and an activation."""
    for M, N, K, split in ((37, 45, 77, 3), (40, 33, 12, 4)):
        c, a, b, _, _ = _run(ctx, rng, M, N, K, ta, tb, dict(EMULATED, split_k=split))
        assert_close(c, tf32_round(a) @ tf32_round(b))
    c, a, b, cin, bias = _run(ctx, rng, 33, 40, 70, ta, tb, dict(EMULATED, split_k=2),
                              batch=2, pad=3, offset=5, beta=0.5, bias=True, activation="relu")
    assert_close(c, np.maximum(tf32_round(a) @ tf32_round(b) + 0.5 * cin + bias, 0))


def test_emulated_mma_split_k_plan(ctx, rng):
    """A split mma plan says what it runs and holds its workspace; 16-bit parameters refuse
    a split."""
    M, N, K = 20, 24, 64
    A, B = dp.Tensor.from_numpy(ctx, random(rng, (M, K))), dp.Tensor.from_numpy(ctx, random(rng, (K, N)))
    C = poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N,
                    allow_tf32=True, params=dict(EMULATED, split_k=4))
    assert plan.algorithm == "mma" and plan.splits == 4 and plan.workspace is not None
    assert "split_k 1" in gemm_ops.params_problem(dict(gemm_ops.DEFAULT_MMA16, split_k=2),
                                                   ctx.info)


def test_emulated_mma_strides_batches_epilogue(ctx, rng):
    """Offsets, padded leading dimensions and batch strides; beta, bias and activation; three
    stages and several warps along N."""
    c, a, b, cin, bias = _run(ctx, rng, 33, 40, 40, False, True, EMULATED, batch=3, pad=3,
                              offset=5, beta=0.5, bias=True, activation="relu")
    ref = np.maximum(tf32_round(a) @ tf32_round(b) + 0.5 * cin + bias, 0)   # torch's addmm order
    assert_close(c, ref)
    params = dict(EMULATED, tile_m=16, tile_n=32, warps_m=1, warps_n=2, stages=3)
    c, a, b, _, _ = _run(ctx, rng, 20, 70, 60, True, False, params, batch=2, pad=4, offset=8)
    assert_close(c, tf32_round(a) @ tf32_round(b))


@pytest.mark.parametrize("ta,tb,stage_mn", [(False, False, 0), (True, True, 0),
                                             (False, False, 1), (True, False, 1),
                                             (False, True, 1), (True, True, 1)])
def test_emulated_mma_staged_slices(ctx, rng, ta, tb, stage_mn):
    """Slices rounded once on their way through registers (staged), ragged and whole tiles,
    with the float2 stores of C (even leading dimension) and without (odd); with stage_mn
    both slices stored M (N) contiguous, a K-contiguous operand transposed on its way."""
    params = dict(EMULATED, staged=1, stage_mn=stage_mn)
    for M, N, K, pad in ((37, 45, 29, 0), (64, 32, 48, 0), (64, 32, 48, 1)):
        c, a, b, _, _ = _run(ctx, rng, M, N, K, ta, tb, params, pad=pad)
        assert_close(c, tf32_round(a) @ tf32_round(b))
    c, a, b, cin, bias = _run(ctx, rng, 64, 32, 48, ta, tb, params, beta=0.5, bias=True,
                              activation="relu")
    assert_close(c, np.maximum(tf32_round(a) @ tf32_round(b) + 0.5 * cin + bias, 0))


# (n, c, k, h, w, stride) of the folded tests.
FOLDED_SHAPES = ((2, 12, 20, 5, 7, 1), (3, 16, 40, 4, 4, 1), (2, 16, 24, 7, 9, 2))


@pytest.mark.parametrize("params,shapes", [
    (EMULATED, FOLDED_SHAPES), (dict(EMULATED, staged=1), FOLDED_SHAPES),
    (dict(EMULATED, staged=1, stage_mn=1), FOLDED_SHAPES),
    (dict(EMULATED, tile_m=16, tile_n=64, warps_m=1), FOLDED_SHAPES[1:2]),
    (dict(EMULATED, tile_m=16, tile_n=8, tile_k=64, warps_m=1), FOLDED_SHAPES[2:])],
    ids=["copies", "staged", "staged-mn", "n-column-per-copy", "k-column-per-copy"])
def test_emulated_mma_folded_operands(ctx, rng, params, shapes):
    """Folded operands, as a 1x1 convolution folds its NCHW tensors: forward (B folded along
    N, densely or strided; C folded), data gradient (trans_a, B and C folded) and filter
    gradient (A folded along K, B transposed and folded along K, densely or strided), with
    16-byte copies (positions multiples of 4) and 4-byte ones (ragged), against float64 of the
    TF32-rounded operands. One warp with slices 64 wide along N (along K): a work-item's copies
    of B (of A, B transposed) lie in columns of their own, each with its folded offset, not in
    one shared column."""
    for n, c, k, h, w, stride in shapes:
        ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
        P = ho * wo
        x, wt = random(rng, (n, c, h, w)), random(rng, (k, c))
        X, W = dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, wt)
        x_fold = Fold(h * w, c * h * w) if stride == 1 else \
            Fold(P, c * h * w, wo, stride * w, stride)
        xs = tf32_round(x[:, :, ::stride, ::stride])
        Y = poisoned(ctx, (n, k, ho, wo))
        plan = GemmPlan(ctx, k, n * P, c, W.buffer, 0, c, X.buffer, 0, h * w, Y.buffer, 0, P,
                        fold_b=x_fold, fold_c=Fold(P, k * P), params=params)
        assert plan.algorithm == "mma"
        plan.enqueue()
        assert_close(Y.numpy(), np.einsum("kc,nchw->nkhw", tf32_round(wt), xs))
        dy = random(rng, (n, k, ho, wo))
        DY = dp.Tensor.from_numpy(ctx, dy)
        if stride == 1:
            DX = poisoned(ctx, (n, c, h, w))
            GemmPlan(ctx, c, n * h * w, k, W.buffer, 0, c, DY.buffer, 0, h * w, DX.buffer, 0,
                     h * w, trans_a=True, fold_b=Fold(h * w, k * h * w),
                     fold_c=Fold(h * w, c * h * w), params=params).enqueue()
            assert_close(DX.numpy(), np.einsum("kc,nkhw->nchw", tf32_round(wt),
                                               tf32_round(dy)))
        DW = poisoned(ctx, (k, c))
        GemmPlan(ctx, k, c, n * P, DY.buffer, 0, P, X.buffer, 0, h * w, DW.buffer, 0, c,
                 trans_b=True, fold_a=Fold(P, k * P), fold_b=x_fold, params=params).enqueue()
        assert_close(DW.numpy(), np.einsum("nkhw,nchw->kc", tf32_round(dy), xs))


# ---- the tensor-core kernel (NVIDIA, compute capability 8.0 and later) ---------------------

@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_mma_kernel_against_float64(ctx, rng, ta, tb, tf32_off, monkeypatch):
    if not has_mma(ctx):
        pytest.skip(f"no TF32 mma here: {gemm_ops.mma_device_problem(ctx.info)}")
    monkeypatch.setattr(backends, "allow_tf32", True)
    # The default and the parameters of the shipped NVIDIA rules (tuning_db/gemm.json).
    variants = (gemm_ops.DEFAULT_MMA,
                dict(gemm_ops.DEFAULT_MMA, tile_n=64, warps_n=1, staged=1, round="int"),
                dict(gemm_ops.DEFAULT_MMA, tile_n=64, warps_m=4, warps_n=1, staged=1,
                     round="int"),
                dict(gemm_ops.DEFAULT_MMA, warps_n=2, staged=1, round="int", tile_group=4),
                dict(gemm_ops.DEFAULT_MMA, tile_m=256, tile_k=8, warps_m=4, warps_n=2,
                     staged=1, stage_mn=1, round="int"))
    for M, N, K in ((300, 260, 70), (128, 128, 64), (1000, 64, 333), (77, 513, 1031)):
        for params in variants:
            c, a, b, _, _ = _run(ctx, rng, M, N, K, ta, tb, dict(params))
            err = np.abs(c - a.astype(np.float64) @ b.astype(np.float64)).max()
            assert err <= tf32_bound(a, b), (M, N, K, params, err)
            # TF32 indeed: the error is TF32's, not float32's (which lands near 1e-6 here).
            assert_close(c, tf32_round(a) @ tf32_round(b), tol=1e-5)
    # Strides, batches, epilogue, and the public calls with the default choice.
    for pad, offset in ((3, 5), (0, 0)):    # scalar and float2 stores of C
        c, a, b, cin, bias = _run(ctx, rng, 130, 256, 96, ta, tb, dict(gemm_ops.DEFAULT_MMA),
                                  batch=3, pad=pad, offset=offset, beta=0.5, bias=True,
                                  activation="relu")
        assert_close(c, np.maximum(tf32_round(a) @ tf32_round(b) + 0.5 * cin + bias, 0),
                     tol=1e-5)
    a = random(rng, (4, 512, 384))
    b = random(rng, (4, 384, 640))
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                          algorithm="mma").numpy()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(out - ref).max() <= tf32_bound(a, b)
    assert gemm_ops.select_params(ctx, 512, 640, 384, 4, tf32=True)["solver"] == "mma"


def test_mma_emulation_matches_the_tensor_cores(ctx, rng):
    """On a device with tensor cores, the emulated kernel and the PTX one give the same sums
    (to float32 rounding of the order of the sums)."""
    if not has_mma(ctx):
        pytest.skip(f"no TF32 mma here: {gemm_ops.mma_device_problem(ctx.info)}")
    hw = dict(EMULATED, emulate=0)
    for ta, tb in ((False, False), (True, True)):
        c1, a, b, _, _ = _run(ctx, np.random.default_rng(1), 37, 45, 29, ta, tb, EMULATED)
        c2, _, _, _, _ = _run(ctx, np.random.default_rng(1), 37, 45, 29, ta, tb, hw)
        assert_close(c2, c1.astype(np.float64))


def test_long_k_splits_in_the_mma_kernel():
    """A TF32 GEMM with few output tiles and a long K (a 1x1 convolution's filter gradient:
    K = batch x pixels) splits K in the mma kernel itself, as the tiled solver's rule says;
    emulated and 16-bit parameters are left alone."""
    from dlprim_py.ops.gemm import _split_long_k

    class Info:
        is_gpu, compute_units = True, 132
        name, vendor = "a GPU", "nvidia"

    params = dict(gemm_ops.DEFAULT_MMA)   # 128 x 128 tiles of 8 warps
    split = _split_long_k(params, Info, 64, 256, 64 * 3136, 1)
    # 2 tiles of 256 work-items: 4 groups per unit wanted, chunks of at least 1024.
    assert split["solver"] == "mma" and split["split_k"] == 196
    assert _split_long_k(params, Info, 64, 256, 512, 1).get("split_k", 1) == 1       # short K
    assert _split_long_k(params, Info, 4096, 4096, 1 << 16, 1).get("split_k", 1) == 1  # tiles
    assert "split_k" not in _split_long_k(dict(EMULATED), Info, 64, 256, 64 * 3136, 1)
    assert "split_k" not in _split_long_k(dict(gemm_ops.DEFAULT_MMA16), Info, 64, 256,
                                          64 * 3136, 1)
