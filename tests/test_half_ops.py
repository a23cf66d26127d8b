"""float16 and bfloat16 storage in the pointwise, activation, reduction, softmax, normalization
and pooling operators: 16-bit tensors in and out, float32 inside (no cl_khr_fp16 needed, so
these run on PoCL and NVIDIA alike). Each operator against torch in float64 on the 16-bit inputs'
exact values, forward and gradient, outputs from a pool poisoned with 16-bit NaN, odd shapes,
and the refusals (integer tensors, mixed types torch refuses) as DTypeError.

Tolerances: a pointwise result is the float32 value rounded once to the 16-bit type, so it is
within one unit in the last place of the exact value (float16 2**-10 relative, bfloat16 2**-7);
reductions and normalizations add float32 accumulation and their rounded 16-bit terms, and are
checked against the largest reference magnitude (normwise) with a few units more.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import program

from conftest import assert_repeats_build_nothing

F = dp.functional

DTYPES = [dp.float16, dp.bfloat16]
IDS = ["float16", "bfloat16"]
# One unit in the last place, relative: 10 and 7 stored mantissa bits.
ULP = {np.dtype(np.float16): 2.0 ** -10, dp.bfloat16: 2.0 ** -7}
# The spacing of the subnormals (float16's below 2**-14 are 2**-24 apart).
SUBNORMAL = {np.dtype(np.float16): 2.0 ** -24, dp.bfloat16: 2.0 ** -133}


def ulp(dtype):
    return ULP[np.dtype(dtype)]


def poison(ctx, elements):
    """Leave buffers of all-ones bits (NaN as float32, float16 and bfloat16 alike) in the
    context's pool, so that an output the operator allocates from it starts as NaN in every
    element and an element it never writes fails the check."""
    held = [dp.Tensor.empty(ctx, (max(1, elements),), np.int32).fill_(-1) for _ in range(2)]
    ctx.queue.finish()
    del held


def t16(ctx, array, dtype, requires_grad=False):
    """A 16-bit tensor of ``array`` (rounded to nearest even) and the float64 torch tensor of
    the values it holds exactly."""
    t = dp.Tensor.from_numpy(ctx, np.asarray(array, np.float32), dtype=dtype,
                             requires_grad=requires_grad)
    ref = torch.tensor(t.numpy().astype(np.float64), requires_grad=requires_grad)
    return t, ref


def values(t):
    """A tensor's values as float64 (a bfloat16 tensor's numpy() is float32 already)."""
    return t.numpy().astype(np.float64)


def check_elementwise(out, ref, dtype, ulps=1.0, floor=1e-6):
    """Every element within ``ulps`` units in the last place of the reference (relative), or
    ``floor`` times the largest reference magnitude where the reference is near zero."""
    assert out.dtype == np.dtype(dtype) or out.dtype is dtype, (out.dtype, dtype)
    got = values(out)
    want = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), f"{(~np.isfinite(got)).sum()} non-finite outputs"
    bound = np.maximum(ulps * ulp(dtype) * (np.abs(want) + floor * np.abs(want).max()),
                       ulps * SUBNORMAL[np.dtype(dtype)])
    bad = np.abs(got - want) > bound
    assert not bad.any(), (f"{bad.sum()} elements off, first at "
                           f"{tuple(int(i) for i in np.argwhere(bad)[0])}: "
                           f"{got[bad][0]} vs {want[bad][0]}")


def check_normwise(out, ref, dtype, ulps=4.0, tol_dtype=None):
    """The largest error within ``ulps`` units in the last place (of ``tol_dtype``, default
    ``dtype``, the output's type) of the largest reference magnitude (sums and
    normalizations: float32 accumulation of rounded 16-bit terms)."""
    assert out.dtype == np.dtype(dtype) or out.dtype is dtype, (out.dtype, dtype)
    dtype = tol_dtype or dtype
    got = values(out)
    want = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    assert got.shape == want.shape
    assert np.isfinite(got).all(), f"{(~np.isfinite(got)).sum()} non-finite outputs"
    err = np.abs(got - want).max() if got.size else 0.0
    assert err <= ulps * ulp(dtype) * max(np.abs(want).max(), 1e-30), \
        f"error {err:.3e} vs largest magnitude {np.abs(want).max():.3e}"


def backward_both(ctx, out, ref_out, dtype, rng):
    """Backpropagate the same random 16-bit gradient through ours and torch's."""
    g, g_ref = t16(ctx, rng.uniform(-1, 1, out.shape), dtype)
    poison(ctx, 4 * out.size + 64)
    out.backward(g)
    ref_out.backward(g_ref)


# ---- arithmetic ----------------------------------------------------------------------------

BINARY = [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div),
          ("maximum", torch.maximum), ("minimum", torch.minimum)]
SHAPES = [((7,), (7,)), ((3, 5, 7), (5, 1)), ((1, 9), (4, 1)), ((2, 3, 4, 5), ())]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op,torch_op", BINARY, ids=[n for n, _ in BINARY])
def test_binary(ctx, rng, dtype, shapes, op, torch_op):
    a, a_ref = t16(ctx, rng.uniform(-2, 2, shapes[0]), dtype, True)
    b, b_ref = t16(ctx, rng.uniform(0.5, 2, shapes[1]) * rng.choice([-1, 1], shapes[1]),
                   dtype, True)
    poison(ctx, 4 * a.size * 4 + 64)
    out = getattr(F, op)(a, b)
    ref = torch_op(a_ref, b_ref)
    check_elementwise(out, ref, dtype)
    backward_both(ctx, out, ref, dtype, rng)
    assert a.grad.dtype == a.dtype and b.grad.dtype == b.dtype
    # A gradient is one rounded product (or quotient chain), summed in float32 where broadcast.
    check_normwise(a.grad, a_ref.grad, dtype, 4)
    check_normwise(b.grad, b_ref.grad, dtype, 8)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_binary_with_a_number(ctx, rng, dtype):
    """A Python number with a 16-bit tensor: a 16-bit result (torch's promotion), the number
    kept in float32 inside the kernel."""
    a, a_ref = t16(ctx, rng.uniform(-3, 3, (5, 11)), dtype, True)
    cases = [(lambda x: F.mul(x, 2.5), lambda x: x * 2.5),
             (lambda x: F.sub(1.0, x), lambda x: 1.0 - x),
             (lambda x: F.div(x, 3.0), lambda x: x / 3.0),
             (lambda x: F.add(x, 0.1), lambda x: x + 0.1),
             (lambda x: F.maximum(x, 0.5), lambda x: torch.clamp(x, min=0.5)),
             (lambda x: x * 3, lambda x: x * 3)]
    for ours, theirs in cases:
        poison(ctx, 4 * a.size + 64)
        out = ours(a)
        check_elementwise(out, theirs(a_ref), dtype)
    out = F.div(F.sub(1.0, a), 3.0)
    ref = (1.0 - a_ref) / 3.0
    backward_both(ctx, out, ref, dtype, rng)
    check_elementwise(a.grad, a_ref.grad, dtype, 2)


def test_mixed_16bit_and_float32(ctx, rng):
    """torch's promotion: float16 or bfloat16 with float32 is float32, float16 with bfloat16 is
    float32; each operand's gradient comes back in its own type."""
    h, h_ref = t16(ctx, rng.uniform(-2, 2, (4, 6)), dp.float16, True)
    bf, bf_ref = t16(ctx, rng.uniform(-2, 2, (6,)), dp.bfloat16, True)
    f_np = rng.uniform(-2, 2, (4, 6)).astype(np.float32)
    f = dp.Tensor.from_numpy(ctx, f_np, requires_grad=True)
    f_ref = torch.tensor(f_np.astype(np.float64), requires_grad=True)
    out = F.add(F.mul(h, f), F.mul(bf, h))
    assert out.dtype == np.float32
    ref = h_ref * f_ref + bf_ref * h_ref
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert h.grad.dtype == np.float16 and bf.grad.dtype is dp.bfloat16
    assert f.grad.dtype == np.float32
    # h's gradient: two float32 products, each rounded to float16, then added in float16
    # (terms that may cancel: normwise).
    check_normwise(h.grad, h_ref.grad, dp.float16, 2)
    check_normwise(bf.grad, bf_ref.grad, dp.bfloat16, 1)
    np.testing.assert_allclose(f.grad.numpy(), f_ref.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_rounding_is_to_nearest_even(ctx):
    """Results are rounded once, to nearest even: 1 + 2**-11 (a tie in float16) stays 1,
    1 + 3 * 2**-11 goes up to 1 + 2**-9; bfloat16 likewise at 2**-8."""
    for dtype, half_ulp in ((dp.float16, 2.0 ** -11), (dp.bfloat16, 2.0 ** -8)):
        one = dp.Tensor.from_numpy(ctx, np.ones(3, np.float32), dtype=dtype)
        out = F.add(one, dp.Tensor.from_numpy(ctx, np.array([1, 3, 1.5], np.float32) * half_ulp,
                                              dtype=dtype))
        np.testing.assert_array_equal(out.numpy(), [1.0, 1.0 + 4 * half_ulp, 1.0 + 2 * half_ulp])


# ---- activations ---------------------------------------------------------------------------

ACTIVATIONS = [
    ("relu", {}), ("relu6", {}), ("leaky_relu", {"negative_slope": 0.1}), ("elu", {}),
    ("gelu", {}), ("gelu", {"approximate": "tanh"}), ("silu", {}), ("sigmoid", {}),
    ("tanh", {}), ("hardswish", {}), ("hardsigmoid", {}), ("hardtanh", {}), ("abs", {}),
    ("softplus", {}), ("softplus", {"beta": 2.0, "threshold": 5.0}), ("mish", {}),
    ("selu", {}), ("celu", {"alpha": 0.7}), ("logsigmoid", {}), ("softsign", {}),
    ("softshrink", {"lambd": 0.25}), ("hardshrink", {"lambd": 0.375}), ("tanhshrink", {}),
]
TORCH_ONLY = {"abs": torch.abs, "sigmoid": torch.sigmoid, "tanh": torch.tanh}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name,kwargs", ACTIVATIONS,
                         ids=[n + "".join(f"-{v}" for v in k.values()) for n, k in ACTIVATIONS])
def test_activation(ctx, rng, dtype, name, kwargs):
    x, x_ref = t16(ctx, rng.uniform(-4, 4, (3, 37)), dtype, True)
    poison(ctx, 4 * x.size + 64)
    out = getattr(F, name)(x, **kwargs)
    ref = TORCH_ONLY[name](x_ref) if name in TORCH_ONLY else getattr(TF, name)(x_ref, **kwargs)
    # Statements whose float32 evaluation cancels (tanhshrink, gelu's tails) are checked
    # against the largest magnitude where the result is near zero.
    check_elementwise(out, ref, dtype, 1.0, floor=1e-3)
    backward_both(ctx, out, ref, dtype, rng)
    assert x.grad.dtype == x.dtype
    check_elementwise(x.grad, x_ref.grad, dtype, 1.0, floor=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_activation_repeated_call_builds_nothing(ctx, rng, dtype):
    x, _ = t16(ctx, rng.uniform(-1, 1, (5, 8)), dtype)
    F.silu(x)
    before = dict(program.stats)
    F.silu(x)
    F.silu(t16(ctx, rng.uniform(-1, 1, (5, 8)), dtype)[0])
    assert dict(program.stats) == before


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(1027,), (6, 16), (5, 9, 3)], ids=str)
def test_pointwise_solvers_forced(ctx, rng, dtype, shape):
    """The scalar and the vector solvers (vload_halfN / vstore_halfN_rte, bfloat16 as ushortN)
    give the same, correctly rounded results, tails included."""
    from dlprim_py.ops.pointwise import PointwiseKernel
    k = PointwiseKernel("half_scale_add", [("a", dtype), ("b", np.float32)], [("y", dtype)],
                        "y = a * 1.5f + b;")
    a, a_ref = t16(ctx, rng.uniform(-2, 2, shape), dtype)
    b_np = rng.uniform(-2, 2, shape[-1:]).astype(np.float32)
    b = dp.Tensor.from_numpy(ctx, b_np)
    want = a_ref * 1.5 + torch.tensor(b_np.astype(np.float64))
    results = []
    for algorithm in ("scalar", "vector"):
        y = dp.Tensor.empty(ctx, shape, dtype)
        y.fill_(np.nan)
        k([a, b], [y], algorithm=algorithm)
        check_elementwise(y, want, dtype, 0.5 + 1e-3)
        results.append(y.bits() if dtype is dp.bfloat16 else y.numpy().view(np.uint16))
    np.testing.assert_array_equal(results[0], results[1])


def test_float32_kernels_keep_their_source(ctx):
    """The 16-bit path adds nothing to a float32 kernel's source: no bfloat16 helpers, no
    vload_half."""
    from dlprim_py.ops.pointwise import PointwiseKernel
    k = PointwiseKernel("t", [("a", np.float32)], [("y", np.float32)], "y = a;")
    source = program.render("pointwise", **k.template_params(1, "int", 4, 2, (True,)))
    assert "bf16" not in source and "vload_half" not in source and "float4" in source
    k16 = PointwiseKernel("t", [("a", dp.bfloat16)], [("y", np.float16)], "y = a;")
    source = program.render("pointwise", **k16.template_params(1, "int", 4, 2, (True,)))
    assert "bf16_to_float" in source and "vstore_half4_rte" in source


# ---- reductions ----------------------------------------------------------------------------

REDUCTIONS = [((7,), None), ((4, 1000), 1), ((3, 5, 7), (0, 2)), ((33, 17), 0),
              ((6000,), None), ((2, 3, 301), -1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape,dim", REDUCTIONS, ids=lambda v: str(v))
def test_reductions(ctx, rng, dtype, shape, dim):
    """sum, mean and amax of 16-bit tensors: float32 accumulation, the result rounded to the
    input's type (torch's result type); their gradients in that type."""
    for ours, theirs, ulps in ((F.sum, torch.sum, 4), (F.mean, torch.mean, 4),
                               (F.amax, torch.amax, 0)):
        x, x_ref = t16(ctx, rng.uniform(0.25, 2, shape) * rng.choice([-1, 1], shape), dtype,
                       True)
        poison(ctx, 4 * x.size + 64)
        out = ours(x, dim)
        if dim is None:
            ref = theirs(x_ref) if theirs is not torch.amax else torch.amax(x_ref)
        else:
            ref = theirs(x_ref, dim)
        if ulps:
            # Against the sum of magnitudes: the terms are exact, the accumulation float32.
            scale = torch.sum(x_ref.detach().abs(), dim) if dim is not None else \
                torch.sum(x_ref.detach().abs())
            if theirs is torch.mean:
                scale = scale / (x.size / max(out.size, 1))
            err = np.abs(values(out) - ref.detach().numpy())
            assert out.dtype == x.dtype
            assert (err <= ulp(dtype) * (np.abs(ref.detach().numpy()) + 1e-2 * scale.numpy())).all()
        else:
            np.testing.assert_array_equal(values(out), ref.detach().numpy())
        backward_both(ctx, out, ref, dtype, rng)
        assert x.grad.dtype == x.dtype
        check_elementwise(x.grad, x_ref.grad, dtype, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_broadcast_gradient_sums_in_float32(ctx, rng, dtype):
    """A broadcast operand's gradient of 4000 terms: summed in float32 and rounded once, so
    exact to a unit where a 16-bit running sum would be far off."""
    a, a_ref = t16(ctx, rng.uniform(-1, 1, (4000, 3)), dtype, True)
    b, b_ref = t16(ctx, rng.uniform(-1, 1, (3,)), dtype, True)
    out = F.add(a, b)
    ref = a_ref + b_ref
    ones, ones_ref = t16(ctx, np.ones((4000, 3)), dtype)
    out.backward(ones)
    ref.backward(ones_ref)
    check_elementwise(b.grad, b_ref.grad, dtype, 0.5)


# ---- refusals ------------------------------------------------------------------------------

def test_bad_input(ctx):
    h = dp.Tensor.from_numpy(ctx, np.ones((2, 3), np.float32), dtype=dp.float16)
    i = dp.Tensor.from_numpy(ctx, np.ones((2, 3), np.int32))
    for call in (lambda: F.add(h, i), lambda: F.mul(i, h), lambda: F.relu(i),
                 lambda: F.gelu(i), lambda: F.mish(i), lambda: F.mean(i), lambda: F.amax(i),
                 lambda: F.softplus(i)):
        with pytest.raises(dp.DTypeError):
            call()
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.relu(np.ones(3, np.float16))


# ---- softmax -------------------------------------------------------------------------------

SOFTMAX_CASES = [((5, 37), 1, None, None), ((3, 7, 5), 1, None, None),
                 ((3, 7, 5), 1, "column", None), ((2, 3000), 1, "row", 0),
                 ((2, 3000), -1, "row", None), ((4, 64), -1, None, None), ((9,), 0, None, None)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim,variant,cached", SOFTMAX_CASES, ids=lambda v: str(v))
def test_softmax(ctx, rng, dtype, log, shape, dim, variant, cached):
    """Every solver (row cached and streaming, column) on 16-bit storage: computed in float32,
    rounded once; the backward from the stored 16-bit output, as torch's."""
    x, x_ref = t16(ctx, rng.uniform(-6, 6, shape), dtype, True)
    poison(ctx, 4 * x.size + 64)
    fn = F.log_softmax if log else F.softmax
    out = fn(x, dim, variant=variant, cached=cached)
    ref = (torch.log_softmax if log else torch.softmax)(x_ref, dim)
    check_elementwise(out, ref, dtype, 1.0, floor=1e-3)
    g, _ = t16(ctx, rng.uniform(-1, 1, shape), dtype)
    poison(ctx, 4 * x.size + 64)
    out.backward(g)
    assert x.grad.dtype == x.dtype
    # The reference from the stored (rounded) output, as the kernel and torch's 16-bit
    # backward take it: then one rounding of a float32 value.
    y = torch.tensor(values(out))
    g = torch.tensor(values(g))
    if log:
        want = g - torch.exp(y) * g.sum(dim, keepdim=True)
    else:
        want = y * (g - (g * y).sum(dim, keepdim=True))
    check_elementwise(x.grad, want, dtype, 1.0, floor=1e-3)


def t16_at(ctx, array, dtype, offset, requires_grad=False):
    """``t16`` for a tensor that starts ``offset`` elements into its buffer (what a view of a
    larger tensor gives the kernels), the elements before it random."""
    array = np.asarray(array, np.float32)
    head = np.linspace(-1.0, 1.0, offset, dtype=np.float32) if offset else np.zeros(0, np.float32)
    backing = dp.Tensor.from_numpy(ctx, np.concatenate([head, array.ravel()]), dtype=dtype)
    t = dp.Tensor(ctx, backing.buffer, array.shape, dtype, offset=offset * 2,
                  requires_grad=requires_grad)
    ref = torch.tensor(values(t), requires_grad=requires_grad)
    return t, ref


# (shape, x's offset, the gradient's offset, cached, the forward's vector width, the
# backward's): four 16-bit values per access where the rows are whole vectors and every offset
# a multiple of 4, scalar accesses otherwise.
SOFTMAX_VECTOR_CASES = [((6, 256), 0, 0, None, 4, 4),      # short rows sharing a work-group
                        ((2, 2048), 0, 0, None, 4, 4),     # 8 elements per item held
                        ((3, 1000), 0, 0, 0, 4, 4),        # streaming (four vectors a step)
                        ((5, 68), 4, 0, None, 4, 4),       # an aligned view
                        ((5, 68), 0, 2, None, 4, 1),       # the gradient misaligned
                        ((5, 68), 2, 0, None, 1, 1),       # the input misaligned
                        ((4, 39), 0, 0, None, 1, 1),       # rows not whole vectors
                        ((3, 1002), 0, 0, 0, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,x_off,g_off,cached,vector,backward_vector",
                         SOFTMAX_VECTOR_CASES, ids=lambda v: str(v))
def test_softmax_vector_paths(ctx, rng, dtype, log, shape, x_off, g_off, cached, vector,
                              backward_vector):
    """The row solver's 16-bit vector accesses (forward and backward) and their scalar
    fallbacks, on rows and views that take each, against float64."""
    from dlprim_py.ops import softmax as sm
    size = shape[-1]
    total = int(np.prod(shape))
    for width, aligned in ((vector, x_off % 4 == 0), (backward_vector, g_off % 4 == 0)):
        plan = sm._plan(ctx, log, size, 1, total, None, cached, aligned and x_off % 4 == 0,
                        dtype)
        assert plan.vector == width
    x, x_ref = t16_at(ctx, rng.uniform(-6, 6, shape), dtype, x_off, True)
    poison(ctx, 4 * total + 64)
    out = (F.log_softmax if log else F.softmax)(x, -1, cached=cached)
    ref = (torch.log_softmax if log else torch.softmax)(x_ref, -1)
    check_elementwise(out, ref, dtype, 1.0, floor=1e-3)
    g, _ = t16_at(ctx, rng.uniform(-1, 1, shape), dtype, g_off)
    poison(ctx, 4 * total + 64)
    out.backward(g)
    y, gv = torch.tensor(values(out)), torch.tensor(values(g))
    if log:
        want = gv - torch.exp(y) * gv.sum(-1, keepdim=True)
    else:
        want = y * (gv - (gv * y).sum(-1, keepdim=True))
    check_elementwise(x.grad, want, dtype, 1.0, floor=1e-3)
    # The backward on given tensors, dx at an offset of its own.
    for dx_off in (4, 3):
        dx, _ = t16_at(ctx, np.full(shape, np.nan, np.float32), dtype, dx_off)
        sm.softmax_backward(out, g, -1, log=log, dx=dx)
        check_elementwise(dx, want, dtype, 1.0, floor=1e-3)


def test_softmax_16bit_refuses_float32_options(ctx):
    """Prefetch and cache hints move float4 (inline PTX or local float4 copies): asking for
    them on 16-bit storage is a clear error, not a silent float32 access."""
    from dlprim_py.ops import softmax as sm
    for options in ({"prefetch": 1}, {"hints": (".nc", ".cs")}, {"backward_hints": (".cs", ".cs")}):
        with pytest.raises(dp.UnsupportedError, match="16-bit"):
            sm.SoftmaxPlan(ctx, False, 1024, 1, 4096, "row", None, True, options=options,
                           dtype=dp.float16)


def test_softmax_dtype_argument_casts_first(ctx, rng):
    """torch's ``dtype=``: a float16 input cast to float32 first, the gradient back in
    float16."""
    x, x_ref = t16(ctx, rng.uniform(-3, 3, (4, 9)), dp.float16, True)
    out = F.softmax(x, 1, dtype=np.float32)
    assert out.dtype == np.float32
    ref = torch.softmax(x_ref, 1)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-7)
    F.sum(F.mul(out, out)).backward()
    torch.sum(ref * ref).backward()
    assert x.grad.dtype == np.float16
    check_elementwise(x.grad, x_ref.grad, dp.float16, 1, floor=1e-3)
    with pytest.raises(dp.DTypeError):
        F.softmax(x, 1, dtype=np.int32)
    with pytest.raises(dp.DTypeError):
        F.log_softmax(dp.Tensor.from_numpy(ctx, np.ones((2, 3), np.int32)), 1)


# ---- pooling -------------------------------------------------------------------------------

POOLS = [("max_pool2d", (3,), dict(stride=2, padding=1), (2, 3, 9, 11)),
         ("max_pool2d", (2,), dict(ceil_mode=True), (3, 7, 5)),
         ("avg_pool2d", (3,), dict(stride=2, padding=1), (2, 3, 9, 11)),
         ("avg_pool2d", (3,), dict(stride=2, padding=1, count_include_pad=False), (1, 2, 7, 6)),
         ("adaptive_avg_pool2d", ((3, 2),), {}, (2, 3, 9, 11)),
         ("adaptive_avg_pool2d", (1,), {}, (2, 5, 13, 7)),          # the plane solver
         ("adaptive_max_pool2d", (1,), {}, (2, 5, 13, 7)),
         ("adaptive_max_pool2d", ((4, 3),), {}, (2, 3, 9, 11)),
         ("max_pool1d", (2,), {}, (2, 3, 9)),
         ("avg_pool3d", (2,), {}, (2, 3, 5, 6, 7))]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name,args,kwargs,shape", POOLS,
                         ids=[f"{p[0]}-{k}" for k, p in enumerate(POOLS)])
def test_pooling(ctx, rng, dtype, name, args, kwargs, shape):
    """Max pooling picks a stored value (exact); averages sum in float32 and round once; the
    backward sums the windows' gradients in float32 and rounds once."""
    x, x_ref = t16(ctx, rng.uniform(-2, 2, shape), dtype, True)
    poison(ctx, 4 * x.size + 64)
    out = getattr(F, name)(x, *args, **kwargs)
    ref = getattr(TF, name)(x_ref, *args, **kwargs)
    if "max" in name:
        np.testing.assert_array_equal(values(out), ref.detach().numpy())
    else:
        check_normwise(out, ref, dtype, 1)
    backward_both(ctx, out, ref, dtype, rng)
    assert x.grad.dtype == x.dtype
    check_normwise(x.grad, x_ref.grad, dtype, 1)


def test_pool_operator_refuses_mixed_types(ctx):
    pool = dp.ops.pool.Pool(ctx, "max", kernel_size=2)
    x = dp.Tensor.from_numpy(ctx, np.ones((1, 1, 4, 4), np.float32), dtype=dp.float16)
    with pytest.raises(dp.DTypeError, match="one dtype"):
        pool.forward(x, dp.Tensor.empty(ctx, (1, 1, 2, 2)))
    with pytest.raises(dp.DTypeError, match="float16"):
        pool.forward(dp.Tensor.empty(ctx, (1, 1, 4, 4), np.int32), dp.Tensor.empty(ctx, (1, 1, 2, 2)))


# ---- normalization -------------------------------------------------------------------------

def _norm_case(name, x, w, b):
    """(ours, torch's) calls of a normalization with its affine operands."""
    if name == "layer_norm":
        return (lambda: F.layer_norm(x[0], x[0].shape[-1:], w[0], b[0]),
                lambda: TF.layer_norm(x[1], x[1].shape[-1:], w[1], b[1]))
    if name == "rms_norm":
        return (lambda: F.rms_norm(x[0], x[0].shape[-1:], w[0]),
                lambda: TF.rms_norm(x[1], x[1].shape[-1:], w[1]))
    if name == "group_norm":
        return (lambda: F.group_norm(x[0], 2, w[0], b[0]),
                lambda: TF.group_norm(x[1], 2, w[1], b[1]))
    if name == "instance_norm":
        return (lambda: F.instance_norm(x[0], weight=w[0], bias=b[0]),
                lambda: TF.instance_norm(x[1], weight=w[1], bias=b[1]))
    raise AssertionError(name)


NORMS = [("layer_norm", (3, 5, 37)), ("layer_norm", (2, 1000)), ("rms_norm", (3, 5, 37)),
         ("rms_norm", (7, 300)), ("group_norm", (3, 6, 5, 7)),
         ("group_norm", (1, 4, 40, 40)),     # few long rows: float32 would take "split"
         ("instance_norm", (2, 4, 5, 3))]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", ["same", "float32"])
@pytest.mark.parametrize("name,shape", NORMS, ids=[f"{n}-{s}" for n, s in NORMS])
def test_row_norms(ctx, rng, dtype, affine, name, shape):
    """layer_norm, rms_norm, group_norm and instance_norm of 16-bit inputs with weights of the
    input's type or float32: the result in the input's type, each gradient in its tensor's."""
    wdt = dtype if affine == "same" else dp.float32
    channels = shape[-1] if name in ("layer_norm", "rms_norm") else shape[1]
    x = t16(ctx, rng.uniform(-2, 3, shape), dtype, True)
    w = t16(ctx, rng.uniform(0.5, 1.5, (channels,)), wdt, True)
    b = t16(ctx, rng.uniform(-1, 1, (channels,)), wdt, True)
    ours, theirs = _norm_case(name, x, w, b)
    poison(ctx, 4 * x[0].size + 64)
    out = ours()
    ref = theirs()
    check_normwise(out, ref, dtype, 2)
    backward_both(ctx, out, ref, dtype, rng)
    assert x[0].grad.dtype == dtype
    check_normwise(x[0].grad, x[1].grad, dtype, 4)
    for t in (w, b) if name != "rms_norm" else (w,):
        assert t[0].grad.dtype == wdt
        # float32 weights' gradients are float32 sums of rounded 16-bit terms.
        check_normwise(t[0].grad, t[1].grad, wdt, 2, tol_dtype=dtype)


# (name, shape, x's offset, the weights' offset, the gradient's offset, the forward's
# vector width, the backward's): four elements per access where D is a multiple of 4, every
# data offset too, and the weights of four elements are consecutive and aligned (layer norm)
# or one (group norm with S a multiple of 4).
ROW_VECTOR_CASES = [("layer_norm", (3, 64), 0, 0, 0, 4, 4),
                    ("layer_norm", (2, 3, 1028), 4, 8, 0, 4, 4),    # aligned views
                    ("layer_norm", (4, 64), 0, 0, 6, 4, 1),         # the gradient misaligned
                    ("layer_norm", (4, 64), 2, 0, 0, 1, 1),         # the input misaligned
                    ("layer_norm", (4, 64), 0, 2, 0, 1, 1),         # the weights misaligned
                    ("layer_norm", (5, 66), 0, 0, 0, 1, 1),         # D not a multiple of 4
                    ("group_norm", (2, 4, 8, 4), 0, 1, 0, 4, 4),    # S = 32: one weight per 4
                    ("group_norm", (3, 6, 2, 2), 4, 0, 4, 4, 4),    # S = 4
                    ("group_norm", (2, 4, 6, 3), 0, 0, 0, 1, 1),    # S = 18
                    ("group_norm", (2, 4, 4), 0, 0, 2, 4, 1)]       # rows of 2 vectors


@pytest.mark.parametrize("algo", ["rows", None], ids=["rows", "ruled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", ["same", "float32", "none"])
@pytest.mark.parametrize("name,shape,x_off,w_off,g_off,vector,backward_vector", ROW_VECTOR_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}-{c[4]}" for c in ROW_VECTOR_CASES])
def test_row_norm_vector_paths(ctx, rng, monkeypatch, algo, dtype, affine, name, shape, x_off,
                               w_off, g_off, vector, backward_vector):
    """The 16-bit row kernels' four-element accesses and their scalar fallbacks (rows, views
    and weight layouts that take each), forward and every gradient against float64: the
    "rows" kernels forced, and as ruled (aligned layer norm then runs "rows4", its rows in
    registers; a misaligned gradient its backward through the rows kernels)."""
    from dlprim_py.ops import norm
    if algo:
        monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
        dp.config.reload()
    layer = name == "layer_norm"
    channels = shape[-1] if layer else shape[1]
    G = 1 if layer else 2
    D = shape[-1] if layer else int(np.prod(shape[1:])) // G
    S = 1 if layer else int(np.prod(shape[2:]))
    Cg = D if layer else channels // G
    wdt = dtype if affine == "same" else dp.float32
    x = t16_at(ctx, rng.uniform(-2, 3, shape), dtype, x_off, True)
    if affine == "none":
        w = b = (None, None)
    elif wdt == dp.float32:
        def at(array, offset):
            backing = dp.Tensor.from_numpy(ctx, np.concatenate(
                [np.ones(offset, np.float32), np.asarray(array, np.float32)]))
            t = dp.Tensor(ctx, backing.buffer, (channels,), offset=4 * offset,
                          requires_grad=True)
            return t, torch.tensor(t.numpy().astype(np.float64), requires_grad=True)
        w = at(rng.uniform(0.5, 1.5, channels), w_off)
        b = at(rng.uniform(-1, 1, channels), w_off)
    else:
        w = t16_at(ctx, rng.uniform(0.5, 1.5, (channels,)), wdt, w_off, True)
        b = t16_at(ctx, rng.uniform(-1, 1, (channels,)), wdt, w_off, True)
    g = t16_at(ctx, rng.uniform(-1, 1, shape), dtype, g_off)
    width = norm.row_vector_width(D, G, Cg, S, (x[0],), (w[0], b[0]))
    backward_width = norm.row_vector_width(D, G, Cg, S, (x[0], g[0]), (w[0], b[0]))
    if affine == "none" and S == 1 and x_off % 4 == 0 and D % 4 == 0:
        assert (width, backward_width) == (4, 4 if g_off % 4 == 0 else 1)
    else:
        assert (width, backward_width) == (vector, backward_vector)
    _check_norm(ctx, name, x, w, b, dtype, wdt,
                lambda out, ref: (out.backward(g[0]), ref.backward(g[1])))


def _check_norm(ctx, name, x, w, b, dtype, wdt, backward):
    """The norm ``name`` of the 16-bit pair ``x`` with the pairs ``w`` and ``b`` ((None, None):
    none) against float64, its outputs poisoned first: the result, then after
    ``backward(out, ref)`` every gradient, each in its tensor's type."""
    ours, theirs = _norm_case(name, x, w, b)
    poison(ctx, 4 * x[0].size + 64)
    out = ours()
    ref = theirs()
    assert out.dtype == dtype
    check_normwise(out, ref, dtype, 2)
    poison(ctx, 4 * x[0].size + 64)
    backward(out, ref)
    assert x[0].grad.dtype == dtype
    check_normwise(x[0].grad, x[1].grad, dtype, 4)
    if w[0] is not None:
        for t in (w, b) if name != "rms_norm" else (w,):
            assert t[0].grad.dtype == wdt
            check_normwise(t[0].grad, t[1].grad, wdt, 2, tol_dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("stats", ["same", "float32"])
def test_batch_norm(ctx, rng, dtype, stats):
    """Training (batch statistics, running statistics updated in place in their own type) and
    inference, forward and backward."""
    sdt = dtype if stats == "same" else dp.float32
    x = t16(ctx, rng.uniform(-2, 3, (4, 3, 5, 5)), dtype, True)
    w = t16(ctx, rng.uniform(0.5, 1.5, (3,)), dtype, True)
    b = t16(ctx, rng.uniform(-1, 1, (3,)), dtype, True)
    rm = dp.Tensor.from_numpy(ctx, np.zeros(3, np.float32), dtype=sdt)
    rv = dp.Tensor.from_numpy(ctx, np.ones(3, np.float32), dtype=sdt)
    rm_ref, rv_ref = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    poison(ctx, 4 * x[0].size + 64)
    out = F.batch_norm(x[0], rm, rv, w[0], b[0], training=True)
    ref = TF.batch_norm(x[1], rm_ref, rv_ref, w[1], b[1], training=True)
    check_normwise(out, ref, dtype, 2)
    assert rm.dtype == np.dtype(sdt) or rm.dtype is sdt
    # float32 statistics of rounded 16-bit values: within the input type's unit.
    check_normwise(rm, rm_ref, sdt, 1, tol_dtype=dtype)
    check_normwise(rv, rv_ref, sdt, 1, tol_dtype=dtype)
    backward_both(ctx, out, ref, dtype, rng)
    for t in (x, w, b):
        assert t[0].grad.dtype == dtype
        check_normwise(t[0].grad, t[1].grad, dtype, 4)
    # Inference with the (rounded) running statistics as they are stored.
    out = F.batch_norm(x[0], rm, rv, w[0], b[0], training=False)
    ref = TF.batch_norm(x[1], torch.tensor(values(rm)), torch.tensor(values(rv)), w[1], b[1],
                        training=False)
    check_normwise(out, ref, dtype, 2)


# (shape, x's offset, the gradient's offset, forced DLPRIM_NORM_ALGO, the training forward's
# vector width, the backward's): four elements per access where S and the offsets allow.
BATCH_NORM_CASES = [((4, 3, 4, 4), 0, 0, None, 4, 4),
                    ((4, 3, 4, 4), 0, 0, "groups_scalar", 1, 1),
                    ((3, 5, 5, 5), 0, 0, None, 1, 1),           # S = 25
                    ((4, 3, 8), 4, 2, None, 4, 1),              # the gradient misaligned
                    ((4, 3, 8), 2, 0, None, 1, 1),              # the input misaligned
                    ((2, 2, 300), 0, 4, None, 4, 4),            # several items per row
                    ((16, 6), 0, 0, None, 1, 1),                # S = 1
                    ((9, 5), 1, 3, "columns", 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", ["same", "float32", "none"])
@pytest.mark.parametrize("shape,x_off,g_off,algo,vector,backward_vector", BATCH_NORM_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in BATCH_NORM_CASES])
def test_batch_norm_in_kernels(ctx, rng, monkeypatch, dtype, affine, shape, x_off, g_off, algo,
                               vector, backward_vector):
    """16-bit batch norm in the kernels, the four-element accesses and the scalar ones (S,
    views, forced reductions), training then inference, forward, running statistics (the
    affine operands' type, float32 without them) and every gradient against float64."""
    from dlprim_py.ops import norm
    if algo is not None:
        monkeypatch.setenv("DLPRIM_NORM_ALGO", algo)
        dp.config.reload()
    C = shape[1]
    N, S = shape[0], int(np.prod(shape[2:]))
    wdt = dtype if affine == "same" else dp.float32
    x = t16_at(ctx, rng.uniform(-2, 3, shape), dtype, x_off, True)
    g = t16_at(ctx, rng.uniform(-1, 1, shape), dtype, g_off)
    if affine == "none":
        w = b = (None, None)
    else:
        w = t16(ctx, rng.uniform(0.5, 1.5, (C,)), wdt, True)
        b = t16(ctx, rng.uniform(-1, 1, (C,)), wdt, True)
    rm = dp.Tensor.from_numpy(ctx, rng.uniform(-1, 1, C).astype(np.float32), dtype=wdt)
    rv = dp.Tensor.from_numpy(ctx, rng.uniform(0.5, 2, C).astype(np.float32), dtype=wdt)
    rm_ref, rv_ref = torch.tensor(values(rm)), torch.tensor(values(rv))
    y = dp.Tensor.empty(ctx, shape, dtype)
    for operands, want in (((x[0], y), vector), ((g[0], x[0], y), backward_vector)):
        mode = "stats" if len(operands) == 2 else "grad"
        sums = norm.prepared_sums(ctx, mode, N, C, S, operands[:1 + (mode == "grad")],
                                  storage=dtype)
        assert norm.batch_apply_geometry(ctx, sums, N, C, S, *operands)[0] == want
    poison(ctx, 4 * x[0].size + 64)
    out = F.batch_norm(x[0], rm, rv, w[0], b[0], training=True, momentum=0.3)
    ref = TF.batch_norm(x[1], rm_ref, rv_ref, w[1], b[1], training=True, momentum=0.3)
    check_normwise(out, ref, dtype, 2)
    check_normwise(rm, rm_ref, wdt, 1, tol_dtype=dtype)
    check_normwise(rv, rv_ref, wdt, 1, tol_dtype=dtype)
    poison(ctx, 4 * x[0].size + 64)
    out.backward(g[0])
    ref.backward(g[1])
    for t in (x, w, b) if affine != "none" else (x,):
        check_normwise(t[0].grad, t[1].grad, t[0].dtype, 4, tol_dtype=dtype)
        t[0].grad = None
        t[1].grad = None
    # Inference with the running statistics as stored.
    poison(ctx, 4 * x[0].size + 64)
    out = F.batch_norm(x[0], rm, rv, w[0], b[0], training=False)
    ref = TF.batch_norm(x[1], torch.tensor(values(rm)), torch.tensor(values(rv)), w[1], b[1],
                        training=False)
    check_normwise(out, ref, dtype, 2)
    poison(ctx, 4 * x[0].size + 64)
    out.backward(g[0])
    ref.backward(g[1])
    for t in (x, w, b) if affine != "none" else (x,):
        check_normwise(t[0].grad, t[1].grad, t[0].dtype, 4, tol_dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_batch_norm_mixed_operand_types(ctx, rng, dtype):
    """A 16-bit weight with a float32 bias, and running statistics of two types (through
    float32): the results and gradients in each tensor's type."""
    shape = (3, 4, 2, 4)
    x = t16(ctx, rng.uniform(-2, 3, shape), dtype, True)
    w = t16(ctx, rng.uniform(0.5, 1.5, (4,)), dtype, True)
    b = t16(ctx, rng.uniform(-1, 1, (4,)), dp.float32, True)
    rm = dp.Tensor.from_numpy(ctx, np.zeros(4, np.float32), dtype=dtype)
    rv = dp.Tensor.from_numpy(ctx, np.ones(4, np.float32))
    rm_ref, rv_ref = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    poison(ctx, 4 * x[0].size + 64)
    out = F.batch_norm(x[0], rm, rv, w[0], b[0], training=True)
    ref = TF.batch_norm(x[1], rm_ref, rv_ref, w[1], b[1], training=True)
    check_normwise(out, ref, dtype, 2)
    check_normwise(rm, rm_ref, dtype, 1)
    check_normwise(rv, rv_ref, dp.float32, 1, tol_dtype=dtype)
    backward_both(ctx, out, ref, dtype, rng)
    for t in (x, w, b):
        check_normwise(t[0].grad, t[1].grad, t[0].dtype, 4, tol_dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_layer_norm_without_affine(ctx, rng, dtype):
    x = t16(ctx, rng.uniform(-2, 3, (4, 3, 33)), dtype, True)
    out = F.layer_norm(x[0], (3, 33))
    ref = TF.layer_norm(x[1], (3, 33))
    check_normwise(out, ref, dtype, 2)
    backward_both(ctx, out, ref, dtype, rng)
    check_normwise(x[0].grad, x[1].grad, dtype, 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("stats", ["same", "float32"])
def test_instance_norm_running_statistics(ctx, rng, dtype, stats):
    sdt = dtype if stats == "same" else dp.float32
    x = t16(ctx, rng.uniform(-2, 3, (3, 4, 6, 5)), dtype, True)
    rm = dp.Tensor.from_numpy(ctx, np.zeros(4, np.float32), dtype=sdt)
    rv = dp.Tensor.from_numpy(ctx, np.ones(4, np.float32), dtype=sdt)
    rm_ref, rv_ref = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    out = F.instance_norm(x[0], rm, rv, momentum=0.2)
    ref = TF.instance_norm(x[1], rm_ref, rv_ref, momentum=0.2)
    check_normwise(out, ref, dtype, 2)
    check_normwise(rm, rm_ref, sdt, 1, tol_dtype=dtype)
    check_normwise(rv, rv_ref, sdt, 1, tol_dtype=dtype)
    backward_both(ctx, out, ref, dtype, rng)
    check_normwise(x[0].grad, x[1].grad, dtype, 4)


def test_norm_refusals(ctx):
    h = dp.Tensor.from_numpy(ctx, np.ones((2, 3, 4), np.float32), dtype=dp.float16)
    bf = dp.Tensor.from_numpy(ctx, np.ones((4,), np.float32), dtype=dp.bfloat16)
    i = dp.Tensor.from_numpy(ctx, np.ones((2, 3, 4), np.int32))
    with pytest.raises(dp.DTypeError):
        F.layer_norm(h, (4,), bf)           # a bfloat16 weight for a float16 input
    with pytest.raises(dp.DTypeError):
        F.rms_norm(h, (4,), bf)
    with pytest.raises(dp.DTypeError):
        F.rms_norm(i, (4,))
    with pytest.raises(dp.DTypeError):
        F.layer_norm(i, (4,))
    with pytest.raises(dp.DTypeError):
        F.batch_norm(h, None, None, training=True, weight=bf[:3])
    with pytest.raises(dp.DTypeError, match="one dtype"):
        F.group_norm(h, 3, dp.Tensor.from_numpy(ctx, np.ones(3, np.float32), dtype=dp.float16),
                     dp.Tensor.from_numpy(ctx, np.ones(3, np.float32)))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", ["same", "float32", "none"])
@pytest.mark.parametrize("shape", [(3, 64), (5, 768), (2, 3, 1028), (4, 12)])
def test_layer_norm_rows4(ctx, rng, monkeypatch, dtype, affine, shape):
    """layer_norm of 16-bit inputs with "rows4" forced (rows held in registers as float4, one
    rounding on store): forward and every gradient against float64, outputs poisoned."""
    from dlprim_py.ops import norm
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "rows4")
    dp.config.reload()
    D = shape[-1]
    assert norm.row_algorithm(ctx, int(np.prod(shape)) // D, D, False, True).name == "rows4"
    wdt = dtype if affine == "same" else dp.float32
    x = t16(ctx, rng.uniform(-2, 3, shape), dtype, True)
    if affine == "none":
        w = b = (None, None)
    else:
        w = t16(ctx, rng.uniform(0.5, 1.5, (D,)), wdt, True)
        b = t16(ctx, rng.uniform(-1, 1, (D,)), wdt, True)
    _check_norm(ctx, "layer_norm", x, w, b, dtype, wdt,
                lambda out, ref: backward_both(ctx, out, ref, dtype, rng))


def _weight_at(ctx, array, wdt, offset):
    """The pair of a weight of ``array`` in ``wdt`` (float32 or 16-bit) starting ``offset``
    elements into its buffer, and its float64 torch tensor."""
    if wdt != dp.float32:
        return t16_at(ctx, array, wdt, offset, True)
    backing = dp.Tensor.from_numpy(ctx, np.concatenate(
        [np.ones(offset, np.float32), np.asarray(array, np.float32)]))
    t = dp.Tensor(ctx, backing.buffer, np.shape(array), offset=4 * offset, requires_grad=True)
    return t, torch.tensor(t.numpy().astype(np.float64), requires_grad=True)


# (shape, x's offset, the weight's offset, the gradient's offset), in elements.
RMS_CASES = [((3, 64), 0, 0, 0),
             ((5, 768), 0, 0, 0),          # rows4: a group of 64, 3 float4s each
             ((2, 3, 1028), 4, 8, 0),      # aligned views
             ((4, 12), 0, 0, 6),           # the gradient misaligned
             ((4, 64), 2, 0, 0),           # the input misaligned
             ((4, 64), 0, 2, 0),           # the weight misaligned
             ((5, 66), 0, 0, 0),           # rows not a multiple of 4
             ((3, 5, 37), 1, 3, 5)]        # every operand misaligned


@pytest.mark.parametrize("algo", ["rows", "rows4", None], ids=["rows", "rows4", "ruled"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("affine", ["same", "float32", "none"])
@pytest.mark.parametrize("shape,x_off,w_off,g_off", RMS_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in RMS_CASES])
def test_rms_norm_rows(ctx, rng, monkeypatch, algo, dtype, affine, shape, x_off, w_off, g_off):
    """rms_norm of 16-bit inputs on the row kernels' uncentred variant, each algorithm forced
    and as ruled, four elements per access and scalar: forward and every gradient against
    float64, outputs poisoned. Rows that "rows4" cannot take (a length or an offset not a
    multiple of 4) run the rows kernels, as 16-bit layer_norm's do, even with rows4 forced."""
    from dlprim_py.ops import norm
    if algo:
        monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
        dp.config.reload()
    D = shape[-1]
    wdt = dtype if affine == "same" else dp.float32
    aligned = D % 4 == 0 and x_off % 4 == 0 and (affine == "none" or w_off % 4 == 0)
    if aligned:
        chosen = norm.row_algorithm(ctx, int(np.prod(shape)) // D, D, False, True, rms=True)
        assert chosen.name == (algo or chosen.name)
    x = t16_at(ctx, rng.uniform(-1, 2, shape), dtype, x_off, True)
    w = (None, None) if affine == "none" else _weight_at(ctx, rng.uniform(0.5, 1.5, (D,)), wdt,
                                                         w_off)
    g = t16_at(ctx, rng.uniform(-1, 1, shape), dtype, g_off)
    _check_norm(ctx, "rms_norm", x, w, (None, None), dtype, wdt,
                lambda out, ref: (out.backward(g[0]), ref.backward(g[1])))


@pytest.mark.parametrize("algo", ["rows", "rows4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rms_norm_repeated_calls_build_nothing(ctx, rng, monkeypatch, algo, dtype):
    """After a first call, 16-bit rms_norm forward and backward (weights of the input's type,
    float32, none) render, build and create nothing, with each algorithm forced."""
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    x = t16(ctx, rng.uniform(-1, 2, (6, 32)), dtype, True)[0]
    weights = [t16(ctx, rng.uniform(0.5, 1.5, (32,)), wdt, True)[0]
               for wdt in (dtype, dp.float32)] + [None]
    g = t16(ctx, rng.uniform(-1, 1, (6, 32)), dtype)[0]

    def run():
        for w in weights:
            F.rms_norm(x, (32,), w).backward(g)
        x.grad = None
        for w in weights[:2]:
            w.grad = None

    assert_repeats_build_nothing(ctx, run)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_where_masked_fill_and_tests_on_16bit(ctx, rng, dtype):
    """where, masked_fill and the non-finite tests on 16-bit storage, on any device (values
    loaded into float and stored back exactly, a number rounded once as torch converts it):
    results in the tensor's type against torch's, the gradients through where."""
    tdt = torch.float16 if dtype == dp.float16 else torch.bfloat16
    a = rng.uniform(-3, 3, (4, 5)).astype(np.float32)
    a[0, 0], a[1, 2], a[2, 3] = np.nan, np.inf, -np.inf
    b = rng.uniform(-3, 3, (5,)).astype(np.float32)
    cond = rng.random((4, 5)) > 0.5
    A = dp.Tensor.from_numpy(ctx, a, dtype=dtype)
    B = dp.Tensor.from_numpy(ctx, b, dtype=dtype)
    C = dp.Tensor.from_numpy(ctx, cond)
    ta, tb = torch.tensor(a).to(tdt), torch.tensor(b).to(tdt)
    tc = torch.tensor(cond)

    def same(ours, ref):
        assert ours.dtype == dtype
        np.testing.assert_array_equal(values(ours), ref.double().numpy())

    same(F.where(C, A, B), torch.where(tc, ta, tb))
    same(F.where(C, A, 0.1), torch.where(tc, ta, torch.tensor(0.1, dtype=tdt)))
    same(F.masked_fill(A, C, -0.3), ta.masked_fill(tc, -0.3))
    same(F.masked_fill(A, C, float("-inf")), ta.masked_fill(tc, float("-inf")))
    for name in ("isnan", "isinf", "isposinf", "isneginf", "isfinite"):
        np.testing.assert_array_equal(getattr(F, name)(A).numpy(),
                                      getattr(torch, name)(ta).numpy())
    # Gradients: the chosen elements', summed over the broadcast dimension for b.
    x = dp.Tensor.from_numpy(ctx, np.nan_to_num(a), dtype=dtype, requires_grad=True)
    y = dp.Tensor.from_numpy(ctx, b, dtype=dtype, requires_grad=True)
    g = rng.uniform(-1, 1, (4, 5)).astype(np.float32)
    F.where(C, x, y).backward(dp.Tensor.from_numpy(ctx, g, dtype=dtype))
    tx = torch.tensor(np.nan_to_num(a), dtype=torch.float64, requires_grad=True)
    ty = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    torch.where(tc, tx, ty).backward(torch.tensor(g).to(tdt).double())
    assert x.grad.dtype == dtype and y.grad.dtype == dtype
    np.testing.assert_array_equal(values(x.grad), tx.grad.to(tdt).double().numpy())
    # y's: a float32 sum over the broadcast rows of 16-bit values, rounded once.
    np.testing.assert_allclose(values(y.grad), ty.grad.numpy(), rtol=2 * ulp(dtype), atol=1e-6)
    # float16 with bfloat16: float32, as torch promotes them.
    other = dp.bfloat16 if dtype == dp.float16 else dp.float16
    mixed = F.where(C, A, dp.Tensor.from_numpy(ctx, b, dtype=other))
    assert mixed.dtype == dp.float32
