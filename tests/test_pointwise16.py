"""The pointwise generator's vector variant on 16-bit storage (float16, bfloat16): a kernel
whose operands are all 16 bits wide moves 8 elements (16 bytes) per access, as aligned 32-bit
words converted in registers, falls back to 4 elements where the layout keeps only 8-byte
alignment and to one element at a time where it keeps less; every width forced on its own.

Results are checked bit for bit where the reference can round as the kernel does (a float32
product or sum rounded once to the 16-bit type, numpy's float16 conversion and
``to_bfloat16_bits``), else within one unit in the last place of a float64 reference (the
activations, forward and gradient); outputs are views into NaN-filled buffers whose elements
around the view must stay untouched.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import program
from dlprim_py.dtypes import bfloat16_to_float32, to_bfloat16_bits
from dlprim_py.ops import activation_ops
from dlprim_py.activation import ActivationDesc
from dlprim_py.ops.pointwise import PointwiseKernel

F = dp.functional

DTYPES = [dp.float16, dp.bfloat16]
IDS = ["float16", "bfloat16"]
ULP = {np.dtype(np.float16): 2.0 ** -10, dp.bfloat16: 2.0 ** -7}
SUBNORMAL = {np.dtype(np.float16): 2.0 ** -24, dp.bfloat16: 2.0 ** -133}
# All-ones bits: NaN in float16 and bfloat16 alike.
POISON = 0xFFFF


def to_bits(values, dtype):
    """float32 ``values`` rounded to nearest even to ``dtype``, as uint16 bit patterns."""
    values = np.asarray(values, np.float32)
    if dtype is dp.bfloat16:
        return to_bfloat16_bits(values).view(np.uint16)
    with np.errstate(over="ignore"):
        return values.astype(np.float16).view(np.uint16)


def to_float32(bits, dtype):
    """uint16 bit patterns of ``dtype`` as float32, exactly."""
    if dtype is dp.bfloat16:
        return bfloat16_to_float32(bits)
    return bits.view(np.float16).astype(np.float32)


def special_values(rng, n, dtype):
    """``n`` 16-bit values: random normals across several binades, with zeros of both signs,
    subnormals, the largest finite values, infinities and a NaN at random places."""
    values = (rng.standard_normal(n) * np.exp2(rng.integers(-6, 6, n))).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6e-8, -3e-6,
                         1e-40 if dtype is dp.bfloat16 else 5e-5, 3e38], np.float32)
    places = rng.choice(n, size=min(n, len(specials)), replace=False)
    values[places] = specials[:len(places)]
    return to_bits(values, dtype)


class Backing:
    """A buffer of 16-bit elements holding ``bits`` at element ``offset``, POISON around them;
    ``view(shape)`` is the tensor at that offset."""

    def __init__(self, ctx, bits, dtype, offset, after=9, fill=None):
        self.ctx, self.dtype, self.offset = ctx, dtype, offset
        self.size = bits.size
        data = np.full(offset + bits.size + after, POISON, np.uint16)
        data[offset:offset + bits.size] = bits.ravel() if fill is None else fill
        self.initial = data.copy()
        self.tensor = dp.Tensor.from_numpy(ctx, data.view(np.float16 if dtype is not dp.bfloat16
                                                           else dp.bfloat16))

    def view(self, shape, requires_grad=False):
        return dp.Tensor.from_buffer(self.ctx, self.tensor.buffer, shape, self.dtype,
                                     offset=self.tensor.offset + 2 * self.offset,
                                     requires_grad=requires_grad)

    def read(self):
        """The view's bits; asserts that the elements around it are unchanged."""
        data = self.tensor.bits().view(np.uint16)
        around = np.ones(data.size, bool)
        around[self.offset:self.offset + self.size] = False
        assert np.array_equal(data[around], self.initial[around]), "an element outside the view changed"
        return data[self.offset:self.offset + self.size]


def assert_same_bits(got, want):
    """Equal bit patterns, NaN for NaN (the payload may differ)."""
    got, want = np.asarray(got, np.uint16).ravel(), np.asarray(want, np.uint16).ravel()
    assert got.shape == want.shape
    bad = got != want
    assert not bad.any(), (f"{bad.sum()} of {got.size} elements differ, first at "
                           f"{int(np.argwhere(bad)[0][0])}: {got[bad][0]:#06x} vs {want[bad][0]:#06x}")


def same_or_nan(got, want, dtype):
    """``assert_same_bits`` where both are NaN counts as equal."""
    got, want = np.asarray(got, np.uint16).ravel(), np.asarray(want, np.uint16).ravel()
    nan = np.isnan(to_float32(got, dtype)) & np.isnan(to_float32(want, dtype))
    assert_same_bits(np.where(nan, 0, got), np.where(nan, 0, want))


def wide_kernel(dtype, width):
    """y = x * s and z = x + b on ``dtype`` tensors, ``width`` elements per vector access (the
    rule's VECTOR, 4 on the shipped rule, where the layout keeps only that alignment)."""
    class Forced(PointwiseKernel):
        VECTOR16 = width
    return Forced(f"scale_and_add16_{width}", [("x", dtype), ("b", dtype)],
                  [("y", dtype), ("z", dtype)], "y = x * s; z = x + b;", scalars=[("s", np.float32)])


def built_widths(kernel, ctx):
    return {key[2] for key in kernel._kernels.get(ctx, {})}


# (x's shape, b's shape, offsets of x, b, y and z in elements, the width that runs: "w" for the
# forced width, 4, or 1 for the scalar variant)
LAYOUTS = [
    ((16 * 13 + 15,), None, (0, 0, 0, 0), "w"),            # one dimension, a tail
    ((16 * 13 + 15,), None, (16, 32, 48, 16), "w"),        # at offsets that keep the width
    ((3, 16 * 5), (3, 1), (0, 0, 0, 0), "w"),              # b broadcast along rows
    ((3, 16 * 5), (16 * 5,), (0, 16, 0, 32), "w"),         # b a row repeated
    ((16 * 9 + 5,), None, (4, 0, 0, 0), 4),                # x's offset a multiple of 4 only
    ((6, 36), (36,), (0, 0, 0, 0), 4),                     # an inner size a multiple of 4 only
    ((16 * 3 + 1,), None, (0, 0, 4, 0), 4),                # an output's offset a multiple of 4
    ((77,), None, (3, 0, 0, 0), 1),                        # an odd offset: one element at a time
    ((5, 7), (5, 1), (0, 0, 0, 0), 1),                     # an odd inner size
]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("width", [2, 8])
@pytest.mark.parametrize("shape,b_shape,offsets,runs", LAYOUTS, ids=lambda v: str(v))
def test_widths_forced_and_fallbacks(ctx, rng, dtype, width, shape, b_shape, offsets, runs):
    """Each vector width of all-16-bit kernels forced, on layouts that take it, fall back to
    4 elements, or to the scalar variant: bit for bit the float32 result rounded once,
    specials (subnormals, infinities, NaN, overflow) included, nothing written outside the
    outputs."""
    b_shape = shape if b_shape is None else b_shape
    kernel = wide_kernel(dtype, width)
    n, nb = int(np.prod(shape)), int(np.prod(b_shape))
    x_off, b_off, y_off, z_off = offsets
    x_bits, b_bits = special_values(rng, n, dtype), special_values(rng, nb, dtype)
    x = Backing(ctx, x_bits, dtype, x_off)
    b = Backing(ctx, b_bits, dtype, b_off)
    y = Backing(ctx, x_bits, dtype, y_off, fill=POISON)
    z = Backing(ctx, x_bits, dtype, z_off, fill=POISON)
    scale = np.float32(0.3)
    kernel([x.view(shape), b.view(b_shape)], [y.view(shape), z.view(shape)], [scale])
    x32 = to_float32(x_bits, dtype).reshape(shape)
    b32 = to_float32(b_bits, dtype).reshape(b_shape)
    with np.errstate(over="ignore", invalid="ignore"):
        same_or_nan(y.read(), to_bits(x32 * scale, dtype), dtype)
        same_or_nan(z.read(), to_bits(x32 + b32, dtype), dtype)
    # Where only 4 elements keep their alignment, the forced width 2 still does.
    expected = {"w": width, 4: min(width, 4), 1: 1}[runs]
    assert built_widths(kernel, ctx) == {expected}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_widths_of_a_kernel(ctx, dtype):
    """8 then 4 elements per access where every operand is 16 bits wide; float32 kernels and
    kernels that mix 16-bit with float32 operands keep the rule's 4."""
    all16 = PointwiseKernel("widths_all16", [("x", dtype)], [("y", dtype)], "y = x;")
    mixed = PointwiseKernel("widths_mixed", [("x", dtype)], [("y", np.float32)], "y = x;")
    f32 = PointwiseKernel("widths_f32", [("x", np.float32)], [("y", np.float32)], "y = x;")
    assert all16.vector_widths(ctx) == (8, 4)
    assert mixed.vector_widths(ctx) == (4,) and f32.vector_widths(ctx) == (4,)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_wide_source_moves_aligned_words(ctx, dtype):
    """The 16-bit vector variant reads and writes its operands as 16-byte words (no
    vload_halfN / vloadN on global memory, which assume only 2-byte alignment); a float32
    kernel's source has none of it."""
    k16 = PointwiseKernel("words16", [("x", dtype)], [("y", dtype)], "y = x;")
    source = program.render("pointwise", **k16.template_params(1, "int", 8, 2, (True,)))
    assert "*(__global const uint4 *)p" in source and "*(__global uint4 *)p = " in source
    assert "vload8(" not in source and "vstore8(" not in source
    assert "vload_half8(0, x_buf" not in source and "vstore_half8_rte(y_vec" not in source
    f32 = PointwiseKernel("words32", [("x", np.float32)], [("y", np.float32)], "y = x;")
    source = program.render("pointwise", **f32.template_params(1, "int", 4, 2, (True,)))
    assert "uint4" not in source and "_x4(" not in source and "half" not in source.split("#endif", 1)[1]


def t16_at(ctx, array, dtype, offset, requires_grad=False):
    """A 16-bit tensor of ``array`` (rounded) starting ``offset`` elements into its buffer, and
    the float64 torch tensor of its values."""
    bits = to_bits(array, dtype)
    backing = Backing(ctx, bits, dtype, offset)
    t = backing.view(np.shape(array), requires_grad)
    ref = torch.tensor(to_float32(bits, dtype).astype(np.float64).reshape(np.shape(array)),
                       requires_grad=requires_grad)
    return t, ref


def check_ulp(out, ref, dtype, floor=1e-3):
    """Within one unit in the last place of the float64 reference (relative), or ``floor``
    times its largest magnitude where it is near zero."""
    got = out.numpy().astype(np.float64)
    want = ref.detach().numpy()
    assert np.isfinite(got).all(), f"{(~np.isfinite(got)).sum()} non-finite outputs"
    bound = np.maximum(ULP[np.dtype(dtype)] * (np.abs(want) + floor * np.abs(want).max()),
                       SUBNORMAL[np.dtype(dtype)])
    bad = np.abs(got - want) > bound
    assert not bad.any(), f"{bad.sum()} elements off, first {got[bad][0]} vs {want[bad][0]}"


def poison_pool(ctx, elements):
    """NaN bits in the context's pool, so that outputs allocated from it start as NaN."""
    held = [dp.Tensor.empty(ctx, (max(1, elements),), np.int32).fill_(-1) for _ in range(3)]
    ctx.queue.finish()
    del held


# (shape, x's offset, the width the forward runs): dense tensors are one dimension to the
# kernel, any size with a tail of up to 7 elements; an offset decides the width.
ACTIVATION_CASES = [((3, 40), 0, 8), ((1029,), 0, 8), ((1029,), 8, 8), ((7, 9), 0, 8),
                    ((1027,), 4, 4), ((5, 12), 12, 4), ((203,), 3, 1), ((64,), 2, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("name", ["gelu", "silu"])
@pytest.mark.parametrize("algo", [None, "scalar", "vector"], ids=["ruled", "scalar", "vector"])
def test_activations(ctx, rng, monkeypatch, dtype, name, algo):
    """gelu and silu, forward and gradient, on 16-bit tensors whose layouts take 8, 4 and one
    element per access: as ruled, with the scalar solver forced, and with the vector solver
    forced (a clear error where no width applies)."""
    if algo is not None:
        monkeypatch.setenv("DLPRIM_POINTWISE_ALGO", algo)
        dp.config.reload()
    desc = ActivationDesc(name)
    kernels = (activation_ops.forward_kernel(desc, False, dtype),
               activation_ops.backward_kernel(desc, False, dtype))
    before = [built_widths(k, ctx) for k in kernels]
    for shape, offset, width in ACTIVATION_CASES:
        x, x_ref = t16_at(ctx, rng.uniform(-4, 4, shape), dtype, offset, requires_grad=True)
        poison_pool(ctx, 2 * x.size + 64)
        if algo == "vector" and width == 1:
            with pytest.raises(dp.UnsupportedError, match="vector does not apply"):
                getattr(F, name)(x)
            continue
        out = getattr(F, name)(x)
        ref = getattr(TF, name)(x_ref)
        check_ulp(out, ref, dtype)
        g, g_ref = t16_at(ctx, rng.uniform(-1, 1, shape), dtype, 0)
        poison_pool(ctx, 2 * x.size + 64)
        out.backward(g)
        ref.backward(g_ref)
        check_ulp(x.grad, x_ref.grad, dtype)
    widths = set().union(*(built_widths(k, ctx) - seen for k, seen in zip(kernels, before)))
    if algo == "scalar":
        assert widths <= {1}
    elif algo == "vector":
        assert widths <= {8, 4}
    # Builds are memoized per kernel: widths built by an earlier test are not built again.
    assert all(built_widths(k, ctx) >= ({1} if algo == "scalar" else {8, 4}) for k in kernels)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("op,torch_op", [("add", torch.add), ("mul", torch.mul),
                                         ("sub", torch.sub), ("div", torch.div)])
def test_binary(ctx, rng, dtype, op, torch_op):
    """Arithmetic of two 16-bit tensors at sizes and offsets that take 8, 4 and one element per
    access, broadcasts included, with gradients: within one unit in the last place of float64
    (the result is the float32 value rounded once)."""
    cases = [((1030,), (1030,), 0, 0), ((4, 24), (24,), 8, 0), ((4, 24), (4, 1), 0, 0),
             ((1030,), (1030,), 4, 12), ((6, 20), (6, 20), 0, 0), ((61,), (61,), 1, 0)]
    for a_shape, b_shape, a_off, b_off in cases:
        a, a_ref = t16_at(ctx, rng.uniform(-2, 2, a_shape), dtype, a_off, True)
        b, b_ref = t16_at(ctx, rng.uniform(0.5, 2, b_shape) * rng.choice([-1, 1], b_shape),
                          dtype, b_off, True)
        poison_pool(ctx, 2 * a.size + 64)
        out = getattr(F, op)(a, b)
        ref = torch_op(a_ref, b_ref)
        check_ulp(out, ref, dtype, floor=1e-6)
        g, g_ref = t16_at(ctx, rng.uniform(-1, 1, out.shape), dtype, 0)
        poison_pool(ctx, 4 * a.size + 64)
        out.backward(g)
        ref.backward(g_ref)
        # A gradient is a rounded product or quotient chain, summed in float32 where
        # broadcast: a few units of its largest magnitude.
        for t, t_ref in ((a, a_ref), (b, b_ref)):
            got, want = t.grad.numpy().astype(np.float64), t_ref.grad.numpy()
            assert np.abs(got - want).max() <= 8 * ULP[np.dtype(dtype)] * np.abs(want).max()


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_repeated_calls_build_nothing(ctx, rng, dtype):
    """A repeated 16-bit activation, its gradient and a binary op on the vector variants (8
    and 4 elements) and the scalar one render, build and create no kernel."""
    def calls():
        for shape, offset in (((1029,), 0), ((1027,), 4), ((77,), 3)):
            x, _ = t16_at(ctx, rng.uniform(-2, 2, shape), dtype, offset, requires_grad=True)
            y = F.gelu(x)
            y.backward(t16_at(ctx, rng.uniform(-1, 1, shape), dtype, 0)[0])
            F.mul(x.detach(), t16_at(ctx, rng.uniform(-1, 1, shape), dtype, 0)[0])
        ctx.queue.finish()
    calls()
    before = dict(program.stats)
    calls()
    assert dict(program.stats) == before
