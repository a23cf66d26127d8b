"""16-bit tensors: dp.float16 / dp.bfloat16 storage, casts between them and float32 without
cl_khr_fp16, and GEMM / linear on them (float32 sums) through the "small" solver (any device),
the "mma" kernel emulated fragment for fragment (any device) and, where an NVIDIA GPU of
compute capability 8.0 or later is present, the m16n8k16 tensor-core kernel itself.

Tolerances. The reference is the float64 product of the 16-bit-rounded inputs, so the only
errors are the float32 sums and the rounding of a 16-bit result. With ``scale`` the largest
sum_k |a_ik| |b_kj|: a float32 C is within 1e-4 * scale (float32 sums of K <= 300 terms stay
near 2^-24 * K * scale; tensor cores' float32 accumulation a little coarser); a 16-bit C is
further within one half-unit in the last place of the reference, 2^-11 |ref| for float16
(~1e-3 relative) and 2^-8 |ref| for bfloat16 (~1e-2 relative, 4e-3 exactly). A wrong or missing
term (~ scale / K) fails both.
"""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import dtypes, program
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import GemmPlan, GemmProblem

from conftest import random
from test_gemm_tf32 import fake_context, has_mma

HALF_TYPES = (dp.float16, dp.bfloat16)
# Small parameter sets of the mma kernel for 16-bit operands that build in seconds on PoCL,
# emulated: 4 warps of 16 x 16, and 2 warps of 32 x 16 with two 16-deep steps per slice.
EMULATED16 = {"solver": "mma", "tile_m": 32, "tile_n": 32, "tile_k": 32, "warps_m": 2,
              "warps_n": 2, "stages": 2, "emulate": 1}
EMULATED16_DEEP = {"solver": "mma", "tile_m": 64, "tile_n": 16, "tile_k": 32, "warps_m": 2,
                   "warps_n": 1, "stages": 3, "emulate": 1}
SMALL = {"solver": "small", "small_m": 8, "small_n": 16}
# The tensor-core kernel: the shipped default and a small one (NVIDIA, cc >= 8.0 only).
REAL16 = dict(gemm_ops.DEFAULT_MMA16)
REAL16_SMALL = {"solver": "mma", "tile_m": 64, "tile_n": 32, "tile_k": 32, "warps_m": 2,
                "warps_n": 2, "stages": 3}
MODES = {"small": SMALL, "emulated": EMULATED16, "emulated_deep": EMULATED16_DEEP,
         "mma": REAL16, "mma_small": REAL16_SMALL}


def params_of(ctx, mode):
    if mode.startswith("mma") and not has_mma(ctx):
        pytest.skip("the tensor-core kernel needs an NVIDIA GPU of compute capability 8.0+")
    return dict(MODES[mode])


def rounded(values, dtype):
    """float64 of ``values`` rounded to ``dtype`` as the library stores it."""
    if dtype is dp.bfloat16:
        return dtypes.bfloat16_to_float32(dtypes.to_bfloat16_bits(values)).astype(np.float64)
    return np.asarray(values, np.float32).astype(dtype).astype(np.float64)


def poisoned16(ctx, shape, dtype):
    t = dp.Tensor.empty(ctx, shape, dtype)
    t.fill_(np.nan)
    return t


def check_product(out, ref, scale, c_dtype):
    """``out`` within the module docstring's bound of ``ref``."""
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all(), "unwritten or non-finite outputs"
    ulp = {dp.float32: 0.0, dp.float16: 2.0 ** -11, dp.bfloat16: 2.0 ** -8}[c_dtype]
    bound = 1e-4 * scale + ulp * np.abs(ref)
    worst = np.unravel_index(np.argmax(np.abs(out - ref) - bound), ref.shape)
    assert np.all(np.abs(out - ref) <= bound), \
        f"at {worst}: {out[worst]} vs {ref[worst]} (bound {bound[worst]})"


# ---- storage and casts ----------------------------------------------------------------------

# float32 values and their bfloat16 bits rounded to nearest even (written out by hand).
BF16_CASES = [
    (1.0, 0x3F80), (-2.0, 0xC000),
    (1.0 + 2.0 ** -8, 0x3F80),              # tie between 0x3F80 and 0x3F81: even, down
    (1.0 + 3 * 2.0 ** -8, 0x3F82),          # tie between 0x3F81 and 0x3F82: even, up
    (1.0 + 2.0 ** -8 + 2.0 ** -20, 0x3F81),  # just above the tie: up
    (np.inf, 0x7F80), (-np.inf, 0xFF80),
    ((2 - 2.0 ** -7) * 2.0 ** 127, 0x7F7F),  # the largest bfloat16
    (3.4e38, 0x7F80),                       # rounds past it: infinity
    (0.0, 0x0000), (-0.0, 0x8000),
    (1e-40, 0x0001),                        # a float32 subnormal: bfloat16's smallest
]


def test_bfloat16_dtype():
    assert dp.bfloat16 is dtypes.bfloat16 and dp.bfloat16.itemsize == 2
    assert dp.bfloat16 != np.dtype(np.uint16) and dtypes.as_dtype("bfloat16") is dp.bfloat16
    assert dtypes.name(dp.bfloat16) == "bfloat16"
    with pytest.raises(dp.DTypeError):
        dtypes.as_dtype(np.uint16)


def test_host_bfloat16_rounding():
    values = np.array([v for v, _ in BF16_CASES], np.float32)
    bits = dtypes.to_bfloat16_bits(values).view(np.uint16)
    assert [hex(b) for b in bits] == [hex(b) for _, b in BF16_CASES]
    nan = dtypes.to_bfloat16_bits(np.array([np.nan, -np.nan], np.float32))
    assert np.isnan(dtypes.bfloat16_to_float32(nan)).all()
    assert np.signbit(dtypes.bfloat16_to_float32(nan)).tolist() == [False, True]


@pytest.mark.parametrize("via", ["device", "from_numpy"])
def test_float32_to_bfloat16_rounds_to_nearest_even(ctx, via):
    values = np.array([v for v, _ in BF16_CASES] + [np.nan, -np.nan], np.float32)
    if via == "device":
        t = dp.Tensor.from_numpy(ctx, values).to(dp.bfloat16)
    else:
        t = dp.Tensor.from_numpy(ctx, values, dtype=dp.bfloat16)
    assert t.dtype is dp.bfloat16 and t.shape == values.shape
    bits = t.bits().view(np.uint16)
    assert [hex(b) for b in bits[:-2]] == [hex(b) for _, b in BF16_CASES]
    back = t.numpy()
    assert back.dtype == np.float32
    assert np.isnan(back[-2:]).all() and np.signbit(back[-2:]).tolist() == [False, True]


def test_casts_without_fp16_extension(ctx, rng):
    """float32 <-> float16 <-> bfloat16 on any device (the kernels use no cl_khr_fp16):
    float16 as numpy rounds, bfloat16 as the host rounding, the way back exact."""
    x = np.concatenate([random(rng, (300,), -70000, 70000), random(rng, (300,), -1, 1),
                        np.array([np.inf, -np.inf, np.nan, 65504, 65520, 1e-7, -0.0],
                                 np.float32)])
    t = dp.Tensor.from_numpy(ctx, x)
    half = t.to(dp.float16)
    with np.errstate(over="ignore"):
        expected_half = x.astype(np.float16)
    np.testing.assert_array_equal(half.numpy().view(np.uint16)[~np.isnan(x)],
                                  expected_half.view(np.uint16)[~np.isnan(x)])
    assert np.isnan(half.numpy()[np.isnan(x)]).all()
    bf = t.to(dp.bfloat16)
    np.testing.assert_array_equal(bf.bits().view(np.uint16),
                                  dtypes.to_bfloat16_bits(x).view(np.uint16))
    np.testing.assert_array_equal(half.float().numpy(), expected_half.astype(np.float32))
    np.testing.assert_array_equal(bf.float().numpy(), dtypes.bfloat16_to_float32(bf.bits()))
    # float16 -> bfloat16: one rounding of the (exact) float32 value; and back.
    # (NaN payloads may differ: NaN stays NaN.)
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(half.to(dp.bfloat16).bits().view(np.uint16)[ok],
                                  dtypes.to_bfloat16_bits(expected_half.astype(np.float32))
                                  .view(np.uint16)[ok])
    assert np.isnan(half.to(dp.bfloat16).numpy()[~ok]).all()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(
            bf.to(dp.float16).numpy().view(np.uint16)[~np.isnan(x)],
            dtypes.bfloat16_to_float32(bf.bits()).astype(np.float16).view(np.uint16)[~np.isnan(x)])
    assert bf.bfloat16() is bf and half.half() is half


def test_casts_to_and_from_integers_go_through_float32(ctx):
    x = dp.Tensor.from_numpy(ctx, np.array([-3, 0, 7, 300], np.int32))
    assert x.to(dp.bfloat16).numpy().tolist() == [-3.0, 0.0, 7.0, 300.0]
    back = dp.Tensor.from_numpy(ctx, np.array([-3.7, 2.5, 1e9], np.float32), dtype=dp.bfloat16)
    assert back.to(dp.int32).numpy().tolist()[:2] == [-3, 2]
    assert dp.Tensor.from_numpy(ctx, np.array([1, 0], np.bool_)).to(dp.float16).numpy().tolist() \
        == [1.0, 0.0]


def test_fill_and_repr(ctx):
    t = dp.Tensor.full(ctx, (3,), 1.00390625, dp.bfloat16)
    assert t.bits().view(np.uint16).tolist() == [0x3F80] * 3
    assert "dtype=bfloat16" in repr(t)
    z = dp.Tensor.zeros(ctx, (2, 2), dp.float16)
    assert z.numpy().tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_ml_dtypes_arrays_are_read_where_installed(ctx):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.5, -2.25, 3.0], np.float32)
    t = dp.Tensor.from_numpy(ctx, values.astype(ml_dtypes.bfloat16))
    assert t.dtype is dp.bfloat16 and t.numpy().tolist() == [1.5, -2.25, 3.0]


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
def test_ops_without_16bit_support_raise(ctx, dtype):
    t = dp.Tensor.from_numpy(ctx, np.ones((4, 4), np.float32), dtype=dtype)
    # Pointwise, activation, reduction, softmax, normalization and pooling operators take
    # 16-bit storage (tests/test_half_ops.py); these do not yet.
    name = "bfloat16" if dtype is dp.bfloat16 else "float16"
    with pytest.raises(dp.DTypeError, match=name):
        dp.functional.norm(t)
    with pytest.raises(dp.DTypeError, match=name):
        dp.functional.glu(t)
    with pytest.raises(dp.DlprimError):
        dp.functional.cumsum(t, 1)
    with pytest.raises(dp.DTypeError):
        dp.functional.conv_transpose2d(t.reshape(1, 1, 4, 4), t.reshape(1, 1, 4, 4))


# ---- GEMM ---------------------------------------------------------------------------------

def run_gemm(ctx, rng, dtype, params, M, N, K, trans_a=False, trans_b=False, batch=1,
             c_dtype=dp.float32, alpha=1.0, beta=0.0, bias_per=None, offsets=(0, 0),
             activation=None):
    """One GemmPlan on random 16-bit operands (at element ``offsets`` in their buffers),
    checked against float64 (module docstring)."""
    a_shape = (batch, K, M) if trans_a else (batch, M, K)
    b_shape = (batch, N, K) if trans_b else (batch, K, N)
    a = random(rng, a_shape)
    b = random(rng, b_shape)
    a_off, b_off = offsets
    A = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, (a_off,)), a.ravel()]),
                             dtype=dtype)
    B = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, (b_off,)), b.ravel()]),
                             dtype=dtype)
    a64, b64 = rounded(a, dtype), rounded(b, dtype)
    op_a = a64.transpose(0, 2, 1) if trans_a else a64
    op_b = b64.transpose(0, 2, 1) if trans_b else b64
    ref = alpha * (op_a @ op_b)
    scale = abs(alpha) * np.max(np.abs(op_a) @ np.abs(op_b))
    if beta:
        c0 = random(rng, (batch, M, N))
        C = dp.Tensor.from_numpy(ctx, c0, dtype=c_dtype)
        ref = ref + beta * rounded(c0, c_dtype)
        scale += abs(beta)
    else:
        C = poisoned16(ctx, (batch, M, N), c_dtype)
    bias = None
    if bias_per:
        bias_host = random(rng, (N if bias_per == "n" else M,))
        bias = dp.Tensor.from_numpy(ctx, bias_host, dtype=c_dtype)
        b_ref = rounded(bias_host, c_dtype)
        ref = ref + (b_ref[None, None, :] if bias_per == "n" else b_ref[None, :, None])
        scale += 1.0
    if activation == "relu":
        ref = np.maximum(ref, 0.0)
    plan = GemmPlan(ctx, M, N, K, A.buffer, a_off, M if trans_a else K, B.buffer, b_off,
                    K if trans_b else N, C.buffer, 0, N, trans_a=trans_a, trans_b=trans_b,
                    alpha=alpha, beta=beta, bias_buf=None if bias is None else bias.buffer,
                    bias_per=bias_per or "n", activation=activation, batch=batch,
                    stride_a=a.size // batch if batch > 1 else 0,
                    stride_b=b.size // batch if batch > 1 else 0, stride_c=M * N, dtype=dtype,
                    c_dtype=c_dtype, params=params)
    plan.enqueue()
    check_product(C.numpy(), ref, scale, c_dtype)
    return plan


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["small", "emulated", "mma"])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_gemm_every_layout(ctx, rng, dtype, mode, trans_a, trans_b):
    """Ragged sizes (no dimension a multiple of a tile), every transpose."""
    plan = run_gemm(ctx, rng, dtype, params_of(ctx, mode), 45, 37, 83, bool(trans_a),
                    bool(trans_b))
    assert plan.algorithm == MODES[mode]["solver"]


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["emulated_deep", "mma_small", "mma"])
def test_gemm_batch_and_aligned_copies(ctx, rng, dtype, mode):
    """A batch of matrices whose rows start on 16-byte boundaries (16-byte copies), slices of
    two 16-deep steps, several tiles along M and N, K longer than the stages."""
    plan = run_gemm(ctx, rng, dtype, params_of(ctx, mode), 128, 48, 160, batch=3)
    assert plan.config.global_vec == 8


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["emulated_deep", "mma_small"])
def test_gemm_copy_width_per_operand(ctx, rng, dtype, mode):
    """A on 16-byte boundaries, B three elements off them: A's slices copied 8 values at a
    time, B's one value at a time, in the same kernel."""
    plan = run_gemm(ctx, rng, dtype, params_of(ctx, mode), 128, 48, 160, batch=2,
                    offsets=(0, 3))
    assert (plan.config.global_vec, plan.config.global_vec_b) == (8, 1)


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["small", "emulated", "mma"])
def test_gemm_epilogue_and_16bit_output(ctx, rng, dtype, mode):
    """alpha, beta, a bias per row or column and an activation, into a 16-bit C (beta reads
    it, the result is rounded to it) and into a float32 C, with operands at odd offsets (rows
    off 16-byte boundaries: element copies)."""
    params = params_of(ctx, mode)
    run_gemm(ctx, rng, dtype, params, 33, 40, 50, trans_b=True, c_dtype=dtype, alpha=0.5,
             beta=-1.5, bias_per="n", offsets=(3, 5), activation="relu")
    plan = run_gemm(ctx, rng, dtype, params, 40, 24, 64, c_dtype=dp.float32, alpha=2.0,
                    beta=0.25, bias_per="m", offsets=(1, 0))
    if mode != "small":
        assert plan.config.global_vec == 1


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
def test_tensor_api(ctx, rng, dtype):
    """dp.gemm (a 16-bit result by default, as torch.matmul; float32 on request), gemm_batched,
    ``@`` and F.linear with a bias on 16-bit tensors; a repeated call builds nothing."""
    a, b = random(rng, (20, 30)), random(rng, (30, 12))
    A, B = dp.Tensor.from_numpy(ctx, a, dtype=dtype), dp.Tensor.from_numpy(ctx, b, dtype=dtype)
    ref = rounded(a, dtype) @ rounded(b, dtype)
    scale = np.max(np.abs(rounded(a, dtype)) @ np.abs(rounded(b, dtype)))
    out = dp.gemm(A, B)
    assert out.dtype is dtype
    check_product(out.numpy(), ref, scale, dtype)
    wide = dp.gemm(A, B, out_dtype=dp.float32)
    assert wide.dtype == np.float32
    check_product(wide.numpy(), ref, scale, dp.float32)
    check_product((A @ B).numpy(), ref, scale, dtype)
    check_product(dp.gemm_batched(A.reshape(1, 20, 30), B.reshape(1, 30, 12)).numpy()[0],
                  ref, scale, dtype)
    weight = dp.Tensor.from_numpy(ctx, np.ascontiguousarray(b.T), dtype=dtype)
    bias_host = random(rng, (12,))
    bias = dp.Tensor.from_numpy(ctx, bias_host, dtype=dtype)
    y = dp.functional.linear(A, weight, bias)
    assert y.dtype is dtype and y.shape == (20, 12)
    check_product(y.numpy(), ref + rounded(bias_host, dtype), scale + 1, dtype)
    builds = program.stats["builds"] if "builds" in program.stats else None
    kernels = program.stats["kernels"]
    dp.gemm(A, B, c=out)
    dp.functional.linear(A, weight, bias)
    assert program.stats["kernels"] == kernels
    if builds is not None:
        assert program.stats["builds"] == builds


def test_bad_input(ctx, rng):
    a = random(rng, (8, 8))
    h = dp.Tensor.from_numpy(ctx, a, dtype=dp.float16)
    bf = dp.Tensor.from_numpy(ctx, a, dtype=dp.bfloat16)
    f = dp.Tensor.from_numpy(ctx, a)
    with pytest.raises(dp.DTypeError, match="same dtype"):
        dp.gemm(h, bf)
    with pytest.raises(dp.DTypeError, match="same dtype"):
        dp.gemm(f, h)
    with pytest.raises(dp.DTypeError):
        dp.gemm(h, h, c=dp.Tensor.empty(ctx, (8, 8), dp.bfloat16))
    with pytest.raises(dp.DTypeError):
        dp.gemm(h, h, bias=dp.Tensor.empty(ctx, (8,), dp.float32))
    with pytest.raises(dp.DTypeError):
        dp.gemm(h, h, out_dtype=dp.int32)
    with pytest.raises(dp.DTypeError, match="input's dtype"):
        dp.functional.linear(h, bf)
    for name in ("tiled", "splitk"):
        with pytest.raises(dp.UnsupportedError, match="float32 operands only"):
            dp.gemm(h, h, algorithm=name)
    with pytest.raises(dp.UnsupportedError, match="32-bit operands"):
        GemmPlan(ctx, 8, 8, 8, h.buffer, 0, 8, h.buffer, 0, 8, f.buffer, 0, 8, dtype=dp.float16,
                 params=dict(EMULATED16, ab_bits=32))
    with pytest.raises(dp.DTypeError, match="input's dtype"):
        dp.functional.linear(h.requires_grad_(), f)
    with pytest.raises(dp.UnsupportedError, match="epilogue order"):
        GemmPlan(ctx, 8, 8, 8, h.buffer, 0, 8, h.buffer, 0, 8, f.buffer, 0, 8,
                 dtype=dp.float16, order="conv")
    for folds in ({"fold_a": gemm_ops.Fold(4, 8)}, {"fold_b": gemm_ops.Fold(4, 8)},
                  {"fold_c": gemm_ops.Fold(4, 8)}):
        with pytest.raises(dp.UnsupportedError, match="without folds"):
            GemmPlan(ctx, 8, 8, 8, h.buffer, 0, 8, h.buffer, 0, 8, f.buffer, 0, 8,
                     dtype=dp.float16, params=EMULATED16, **folds)
    with pytest.raises(dp.ShapeError):
        GemmPlan(ctx, 8, 8, 9, h.buffer, 0, 9, h.buffer, 0, 8, f.buffer, 0, 8,
                 dtype=dp.float16)


# ---- gradients ------------------------------------------------------------------------------

@pytest.fixture
def gemm16_mode(monkeypatch):
    """``set(mode)``: 16-bit GEMMs planned from now on in this test take that mode's parameters
    (float32 ones the engine's); returns the list of the 16-bit problems planned, to show
    that they were planned here (not replayed from another test's plans)."""
    planned = []

    def set_mode(mode):
        original = gemm_ops.select_params

        def select(ctx, M, N, K, batch=1, algorithm=None, tf32=False, dtype="float32",
                   c_dtype="float32", trans_a=False, trans_b=False):
            if dtype == "float32":
                return original(ctx, M, N, K, batch, algorithm, tf32, dtype, c_dtype, trans_a,
                                trans_b)
            planned.append((M, N, K))
            return dict(MODES[mode])
        monkeypatch.setattr(gemm_ops, "select_params", select)
        return planned
    return set_mode


def linear_refs(x, w, b, g):
    """float64 y, dx, dw, db of linear and the scales of their bounds (module docstring)."""
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    y = x2 @ w.T + b
    return ((y.reshape(g.shape), (np.abs(x2) @ np.abs(w).T + np.abs(b)).max()),
            ((g2 @ w).reshape(x.shape), (np.abs(g2) @ np.abs(w)).max()),
            (g2.T @ x2, (np.abs(g2).T @ np.abs(x2)).max()),
            (g2.sum(0), np.abs(g2).sum(0).max()))


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("mode", ["small", "emulated", "mma"])
def test_linear_gradients(ctx, rng, gemm16_mode, dtype, mode):
    """F.linear on 16-bit operands (a 3-d input, ragged sizes): 16-bit gradients to input,
    weight (GEMMs on the transposes in place) and bias (a column sum), summed in float32."""
    params_of(ctx, mode)
    planned = gemm16_mode(mode)
    sizes = {"small": (3, 7, 45, 37), "emulated": (2, 9, 43, 35), "mma": (4, 33, 130, 72)}
    lead, rows, inf, outf = sizes[mode]
    x0, w0, b0 = random(rng, (lead, rows, inf)), random(rng, (outf, inf)), random(rng, (outf,))
    g0 = random(rng, (lead, rows, outf))
    x = dp.Tensor.from_numpy(ctx, x0, dtype=dtype).requires_grad_()
    w = dp.Tensor.from_numpy(ctx, w0, dtype=dtype).requires_grad_()
    b = dp.Tensor.from_numpy(ctx, b0, dtype=dtype).requires_grad_()
    y = dp.functional.linear(x, w, b)
    y.backward(dp.Tensor.from_numpy(ctx, g0, dtype=dtype))
    refs = linear_refs(*(rounded(v, dtype) for v in (x0, w0, b0, g0)))
    for got, (ref, scale) in zip((y, x.grad, w.grad, b.grad), refs):
        assert got.dtype is dtype
        check_product(got.numpy(), ref, scale, dtype)
    if mode != "mma":
        # The forward's and the two matrix gradients' GEMMs were planned with this mode's
        # parameters (the bias gradient is a column sum).
        assert len(planned) == 3


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=["float16", "bfloat16"])
def test_matmul_gradients_and_a_float32_gradient(ctx, rng, gemm16_mode, dtype):
    """``a @ b`` with gradients on 16-bit matrices (da = g b^T, db = a^T g, no transposed
    copy); a float32 gradient given for a 16-bit output is rounded to its type first; an empty
    batch gives zero weight and bias gradients."""
    planned = gemm16_mode("emulated")
    a0, b0, g0 = random(rng, (19, 26)), random(rng, (26, 11)), random(rng, (19, 11))
    a = dp.Tensor.from_numpy(ctx, a0, dtype=dtype).requires_grad_()
    b = dp.Tensor.from_numpy(ctx, b0, dtype=dtype).requires_grad_()
    out = a @ b
    assert out.dtype is dtype
    out.backward(dp.Tensor.from_numpy(ctx, g0))      # float32
    a64, b64, g64 = (rounded(v, dtype) for v in (a0, b0, g0))
    check_product(out.numpy(), a64 @ b64, (np.abs(a64) @ np.abs(b64)).max(), dtype)
    assert a.grad.dtype is dtype and b.grad.dtype is dtype
    check_product(a.grad.numpy(), g64 @ b64.T, (np.abs(g64) @ np.abs(b64).T).max(), dtype)
    check_product(b.grad.numpy(), a64.T @ g64, (np.abs(a64).T @ np.abs(g64)).max(), dtype)
    assert len(planned) == 3

    x = dp.Tensor.from_numpy(ctx, np.zeros((0, 5), np.float32), dtype=dtype).requires_grad_()
    w = dp.Tensor.from_numpy(ctx, random(rng, (3, 5)), dtype=dtype).requires_grad_()
    bias = dp.Tensor.from_numpy(ctx, random(rng, (3,)), dtype=dtype).requires_grad_()
    y = dp.functional.linear(x, w, bias)
    y.backward(dp.Tensor.empty(ctx, (0, 3), dtype))
    assert w.grad.dtype is dtype and w.grad.numpy().tolist() == [[0.0] * 5] * 3
    assert bias.grad.numpy().tolist() == [0.0] * 3


# ---- choosing -----------------------------------------------------------------------------

def test_problem_key_and_features():
    p = GemmProblem(8, 8, 8, 1, False, "bfloat16", "float32")
    assert p.key() == "gemm-m8-n8-k8-b1-bfloat16-cfloat32"
    assert p.features()["ab16"] == 1 and GemmProblem(8, 8, 8).features()["ab16"] == 0
    assert GemmProblem(8, 8, 8).key() == "gemm-m8-n8-k8-b1"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_choice_on_an_nvidia_gpu_and_elsewhere(dtype):
    """On an NVIDIA GPU of cc >= 8.0 a large 16-bit GEMM takes the mma solver with 16-bit
    parameters (TF32 switch off), a tiny one the small kernel; a pre-Ampere GPU and other
    devices take the small kernel; the float32 rules' TF32 parameters never serve it."""
    ctx = fake_context()
    params = gemm_ops.select_params(ctx, 2048, 2048, 2048, dtype=dtype)
    assert params["solver"] == "mma" and params["ab_bits"] == 16 and params["tile_k"] % 16 == 0
    assert gemm_ops.select_params(ctx, 8, 8, 8, dtype=dtype)["solver"] == "small"
    forced = gemm_ops.FAMILY.solver("mma").forced(
        ctx, GemmProblem(300, 300, 300, 1, False, dtype))
    assert forced["ab_bits"] == 16
    assert gemm_ops.select_params(ctx, 2048, 2048, 2048, tf32=True)["solver"] == "mma"
    assert "ab_bits" not in gemm_ops.select_params(ctx, 2048, 2048, 2048, tf32=True)
    old = fake_context(architecture="nvidia:sm_75")
    assert gemm_ops.select_params(old, 2048, 2048, 2048, dtype=dtype)["solver"] == "small"
    amd = fake_context(vendor="amd", name="gfx", architecture="gfx90a")
    assert gemm_ops.select_params(amd, 2048, 2048, 2048, dtype=dtype)["solver"] == "small"


def test_local_memory_of_16bit_parameters():
    """The shipped 16-bit tiles fit the 48 KiB NVIDIA's OpenCL gives a work-group."""
    assert gemm_ops.mma_local_bytes(gemm_ops.DEFAULT_MMA16) <= 49152
    assert gemm_ops.params_problem(gemm_ops.DEFAULT_MMA16, fake_context().info) is None
    assert "staged" in gemm_ops.params_problem(dict(gemm_ops.DEFAULT_MMA16, staged=1),
                                               fake_context().info)
    assert "multiple of 16" in gemm_ops.params_problem(dict(gemm_ops.DEFAULT_MMA16, tile_k=8),
                                                       fake_context().info)
