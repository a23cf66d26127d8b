"""The pointwise / broadcast generator and the arithmetic operators on it."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from conftest import assert_close, poisoned, random
from dlprim_py.ops.pointwise import (Launch, PointwiseKernel, broadcast_shapes, broadcast_strides,
                                     merge_dimensions)

SCALE_SHIFT = PointwiseKernel(
    "scale_shift_pair", inputs=[("x", np.float32), ("b", np.float32)],
    outputs=[("y", np.float32), ("z", np.float32)],
    statement="y = s * x + b; z = x > b ? x : b;", scalars=[("s", np.float32)])


@pytest.mark.parametrize("algorithm", ["scalar", "vector"])
@pytest.mark.parametrize("x_shape, b_shape", [
    ((7,), (7,)),                 # same shape, one merged dimension (vector: a tail of 3)
    ((5, 33), (5, 33)),           # one merged dimension of 165: vector groups and a tail of 1
    ((3, 5, 7), (5, 1)),          # broadcast in the middle
    ((3, 5, 7), (1,)),            # scalar-like tensor
    ((1, 1), (4, 6)),             # the input broadcasts, not the other
    ((2, 3, 4, 5, 6), (3, 1, 5, 1)),
    ((), ()),                     # 0-d
    ((6, 5, 8), (5, 8)),          # vector: both inputs contiguous along the inner dimension
    ((6, 5, 8), (6, 5, 1)),       # vector: b has stride 0 along the inner dimension
    ((37, 4), (1, 4)),            # vector: rows of one group, b broadcast over the rows
])
def test_generator_broadcasts_like_numpy(ctx, rng, x_shape, b_shape, algorithm):
    x, b = random(rng, x_shape), random(rng, b_shape)
    out_shape = np.broadcast_shapes(x_shape, b_shape)
    y, z = poisoned(ctx, out_shape), poisoned(ctx, out_shape)
    SCALE_SHIFT([dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, b)], [y, z], [1.5],
                algorithm=algorithm)
    x64, b64 = x.astype(np.float64), b.astype(np.float64)
    assert_close(y.numpy(), 1.5 * x64 + b64)
    assert_close(z.numpy(), np.maximum(x64, b64))


def test_generator_respects_offsets(ctx, rng):
    """Operands that are views at non-zero offsets of one buffer."""
    data = random(rng, 64)
    whole = dp.Tensor.from_numpy(ctx, data)
    x = dp.Tensor.from_buffer(ctx, whole.buffer, (4, 5), offset=whole.offset + 4 * 3)
    b = dp.Tensor.from_buffer(ctx, whole.buffer, (5,), offset=whole.offset + 4 * 40)
    y, z = poisoned(ctx, (4, 5)), poisoned(ctx, (4, 5))
    SCALE_SHIFT([x, b], [y, z], [2.0])
    assert_close(y.numpy(), 2.0 * data[3:23].reshape(4, 5).astype(np.float64) + data[40:45])


def _layout(x, b, out_shape):
    """The vector layout the generator picks for operands x, b and an output of out_shape."""
    shape = tuple(out_shape)
    sizes, strides = merge_dimensions(shape, [broadcast_strides(t.shape, shape) for t in (x, b)])
    return SCALE_SHIFT.vector_layout(sizes, strides, [x, b], [x])


def test_vector_variant_applies_where_accesses_stay_aligned(ctx, rng):
    """The cases above do run the vector variant; misaligned offsets or strides do not."""
    data = dp.Tensor.from_numpy(ctx, random(rng, 64))
    dense = dp.Tensor.from_buffer(ctx, data.buffer, (2, 8), offset=data.offset + 4 * 4)
    assert _layout(dense, dense, (2, 8)) == (True, True)
    column = dp.Tensor.from_buffer(ctx, data.buffer, (2, 1), offset=data.offset + 4 * 1)
    assert _layout(dense, column, (2, 8)) == (True, False)
    shifted = dp.Tensor.from_buffer(ctx, data.buffer, (2, 8), offset=data.offset + 4 * 2)
    assert _layout(shifted, dense, (2, 8)) is None          # offset not a multiple of 4
    rows = dp.Tensor.from_buffer(ctx, data.buffer, (3, 6), offset=data.offset)
    assert _layout(rows, rows, (3, 6)) == (True, True)      # merges into 18 elements: a tail of 2
    narrow = dp.Tensor.from_buffer(ctx, data.buffer, (6,), offset=data.offset)
    assert _layout(narrow, narrow, (3, 6)) is None          # inner size 6 is not a multiple of 4


@pytest.mark.parametrize("algorithm", ["scalar", "vector"])
def test_generator_misaligned_views_and_accumulate(ctx, rng, algorithm):
    """Views at offsets that are and are not multiples of 4, and a statement that reads the old
    output through i: every element is right whichever variant runs."""
    accumulate = PointwiseKernel("accumulate_scaled", [("x", np.float32)], [("y", np.float32)],
                                 "y = y_buf[y_off + i] + s * x;", scalars=[("s", np.float32)])
    data = random(rng, 200)
    old = random(rng, 200)
    whole = dp.Tensor.from_numpy(ctx, data)
    for x_at, y_at, n in ((0, 0, 101), (4, 8, 64), (3, 0, 65), (8, 5, 33)):
        out = dp.Tensor.from_numpy(ctx, old)
        x = dp.Tensor.from_buffer(ctx, whole.buffer, (n,), offset=whole.offset + 4 * x_at)
        y = dp.Tensor.from_buffer(ctx, out.buffer, (n,), offset=out.offset + 4 * y_at)
        accumulate([x], [y], [0.5], algorithm=algorithm)
        expected = old.astype(np.float64)
        expected[y_at:y_at + n] += 0.5 * data[x_at:x_at + n]
        assert_close(out.numpy(), expected)


@pytest.mark.parametrize("interleave, vector, unroll, group_size, index_t", [
    ("block", 4, 2, 64, None),     # a work-group's accesses consecutive (PyTorch's layout)
    ("block", 4, 3, 32, "long"),   # an odd unroll, 64-bit indices
    ("grid", 8, 1, 128, None),     # two 16-byte accesses per element group
])
def test_vector_launch_configurations(ctx, rng, interleave, vector, unroll, group_size, index_t):
    """Each launch layout of the vector variant, forced on its own: a one-dimensional index space
    at an offset with a tail, long (several grid-stride steps on a CPU's capped grid) and short
    (two work-groups, no loop), and a broadcast over two dimensions."""
    class Configured(PointwiseKernel):
        VECTOR, INDEX_T = vector, index_t
        VECTOR_LAUNCH = VECTOR_LAUNCH_ND = Launch(unroll, interleave, group_size, groups_per_unit=2)
    kernel = Configured(f"scale_shift_{interleave}_{vector}_{unroll}", SCALE_SHIFT.inputs,
                        SCALE_SHIFT.outputs, SCALE_SHIFT.statement, SCALE_SHIFT.scalars)
    # Long enough to loop on the capped grid whatever the device's compute units (the CPU's cap
    # is four work-groups per unit, this kernel's two per unit elsewhere).
    cap = ctx.info.compute_units * (4 if ctx.info.is_cpu else 2)
    n = max(8 * 1024, 2 * cap * group_size * unroll * vector) + vector * 37 + 3
    data = random(rng, n + 4 * vector)
    whole = dp.Tensor.from_numpy(ctx, data)
    x = dp.Tensor.from_buffer(ctx, whole.buffer, (n,), offset=whole.offset + 4 * vector)
    b = dp.Tensor.from_buffer(ctx, whole.buffer, (n,), offset=whole.offset + 4 * 2 * vector)
    cases = [(x, b, data[vector:vector + n], data[2 * vector:2 * vector + n])]
    short = vector * group_size * unroll + vector * 5 + 1
    cases.append((dp.Tensor.from_buffer(ctx, whole.buffer, (short,), offset=whole.offset + 4 * 3 * vector),
                  dp.Tensor.from_buffer(ctx, whole.buffer, (short,), offset=whole.offset),
                  data[3 * vector:3 * vector + short], data[:short]))
    rows, cols = random(rng, (37, vector * 29)), random(rng, (vector * 29,))
    cases.append((dp.Tensor.from_numpy(ctx, rows), dp.Tensor.from_numpy(ctx, cols), rows, cols))
    for tx, tb, hx, hb in cases:
        y, z = poisoned(ctx, tx.shape), poisoned(ctx, tx.shape)
        kernel([tx, tb], [y, z], [0.75], algorithm="vector")
        x64, b64 = hx.astype(np.float64), hb.astype(np.float64)
        assert_close(y.numpy(), 0.75 * x64 + b64)
        assert_close(z.numpy(), np.maximum(x64, b64))
    built = list(kernel._kernels[ctx])
    assert {key[:3] for key in built} == {(1, index_t or "int", vector), (2, index_t or "int", vector)}
    assert {key[3] for key in built} == {unroll} and {key[5] for key in built} == {interleave}
    if ctx.info.is_cpu:
        # The CPU's grid is capped at four work-groups per core: the long case loops, the short
        # one does not.
        assert {key[6] for key in built if key[0] == 1} == {True, False}


def test_repeated_calls_rebind_only_what_changed(ctx, rng):
    """Plans keep their kernel's arguments between calls: calls on other shapes, buffers and
    scalar values in between (also one that differs from the last only in the sign of zero)
    must each see their own arguments."""
    kernel = PointwiseKernel("scaled_copy", [("x", np.float32)], [("y", np.float32)], "y = s * x;",
                             scalars=[("s", np.float32)])
    a, b, c = random(rng, (8, 4)), random(rng, (8, 4)), random(rng, (3, 5))
    ta, tb, tc = (dp.Tensor.from_numpy(ctx, v) for v in (a, b, c))
    for source, host, scale in ((ta, a, 2.0), (tc, c, 3.0), (tb, b, 2.0), (ta, a, -1.5),
                                (tc, c, 0.0), (tc, c, -0.0), (ta, a, 2.0)):
        out = poisoned(ctx, host.shape)
        kernel([source], [out], [scale])
        got = out.numpy()
        assert_close(got, scale * host.astype(np.float64))
        assert np.array_equal(np.signbit(got), np.signbit(np.float32(scale) * host))


def test_bound_kernel_is_not_disturbed_by_the_shared_one(ctx, rng):
    from dlprim_py import program
    from dlprim_py.launch import bind
    params = dict(name="bound_probe", ndim=1, unroll=1, vector=1, vector_inputs=[], index_t="int",
                  statement="y = x + 1.0f;", preamble="", inputs=[("x", "float")],
                  outputs=[("y", "float")], scalars=[])
    shared = program.kernel(ctx, "pointwise", "bound_probe", params)
    assert bind(shared) is bind(shared)
    x = dp.Tensor.from_numpy(ctx, random(rng, 5))
    other = dp.Tensor.from_numpy(ctx, random(rng, 7))
    y, z = poisoned(ctx, (5,)), poisoned(ctx, (7,))
    args = (np.int32(5), np.int32(5), x.buffer, np.int32(0), np.int32(1), y.buffer, np.int32(0))
    bind(shared)(ctx.queue, (64,), (64,), *args)
    shared(ctx.queue, (64,), (64,), np.int32(7), np.int32(7), other.buffer, np.int32(0), np.int32(1),
           z.buffer, np.int32(0))
    y.fill_(np.nan)
    bind(shared)(ctx.queue, (64,), (64,), *args)
    assert_close(y.numpy(), x.numpy().astype(np.float64) + 1)
    assert_close(z.numpy(), other.numpy().astype(np.float64) + 1)


def test_generator_rejects_unknown_algorithm(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4,)))
    with pytest.raises(dp.UnsupportedError, match="scalar, vector"):
        SCALE_SHIFT([x, x], [poisoned(ctx, (4,)), poisoned(ctx, (4,))], [1.0], algorithm="wide")


def test_generator_rejects_bad_operands(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (3, 4)))
    with pytest.raises(dp.ShapeError, match="broadcast"):
        SCALE_SHIFT([x, dp.Tensor.from_numpy(ctx, random(rng, (3,)))],
                    [poisoned(ctx, (3, 4)), poisoned(ctx, (3, 4))], [1.0])
    with pytest.raises(dp.ShapeError, match="expected 2 inputs"):
        SCALE_SHIFT([x], [poisoned(ctx, (3, 4)), poisoned(ctx, (3, 4))], [1.0])
    with pytest.raises(dp.DTypeError):
        SCALE_SHIFT([x, dp.Tensor.from_numpy(ctx, np.ones((3, 4), np.int32))],
                    [poisoned(ctx, (3, 4)), poisoned(ctx, (3, 4))], [1.0])
    with pytest.raises(dp.ShapeError, match="one shape"):
        SCALE_SHIFT([x, x], [poisoned(ctx, (3, 4)), poisoned(ctx, (4, 3))], [1.0])


def test_wrong_operand_counts_are_refused_after_a_planned_call(ctx, rng):
    """A repeated call tests only the inputs' count before its plan lookup; a call with
    another count of outputs must still fail, not find a plan made for other operands."""
    relu = dp.functional.relu
    x = dp.Tensor.from_numpy(ctx, random(rng, (3, 4)))
    relu(x)
    relu(x)   # planned
    from dlprim_py.ops.activation_ops import _torch_entry
    forward = _torch_entry("relu")[1][0]
    y = poisoned(ctx, (3, 4))
    for inputs, outputs in (([x], [y, y]), ([x, y], []), ([x], []), ([], [])):
        with pytest.raises(dp.ShapeError, match="expected 1 inputs and 1 outputs"):
            forward(inputs, outputs, (1.0, 0.0))
    forward([x], [y], (1.0, 0.0))
    np.testing.assert_array_equal(y.numpy(), np.maximum(x.numpy(), 0))


def test_merge_dimensions():
    # Dense operands merge into one dimension; a broadcast one keeps the split.
    assert merge_dimensions((2, 3, 4), [[12, 4, 1], [12, 4, 1]]) == ([24], [[1], [1]])
    assert merge_dimensions((2, 3, 4), [[0, 4, 1], [12, 4, 1]]) == ([2, 12], [[0, 1], [12, 1]])
    assert merge_dimensions((1, 1), [[0, 0]]) == ([1], [[0]])


def test_broadcast_shapes():
    assert broadcast_shapes((3, 1), (4,)) == (3, 4)
    assert broadcast_shapes((), (2, 2)) == (2, 2)
    with pytest.raises(dp.ShapeError, match="do not broadcast"):
        broadcast_shapes((3,), (4,))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_functional_arithmetic_with_gradients(ctx, rng, op):
    a, b = random(rng, (2, 3, 4)), random(rng, (3, 1), low=0.5, high=2.0)
    ta = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    tb = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    out = getattr(dp.functional, op)(ta, tb)
    ra = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    rb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    ref = getattr(torch, op)(ra, rb)
    assert_close(out.numpy(), ref.detach().numpy())
    g = random(rng, ref.shape)
    ref.backward(torch.tensor(g, dtype=torch.float64))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    assert_close(ta.grad.numpy(), ra.grad.numpy())
    assert_close(tb.grad.numpy(), rb.grad.numpy())


@pytest.mark.parametrize("op", ["add", "sub"])
def test_add_sub_alpha_scales_the_second_operand_and_its_gradient(ctx, rng, op):
    a, b = random(rng, (3, 4)), random(rng, (4,))
    ta = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    tb = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    out = getattr(dp.functional, op)(ta, tb, alpha=-2.5)
    ra = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    rb = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    ref = getattr(torch, op)(ra, rb, alpha=-2.5)
    assert_close(out.numpy(), ref.detach().numpy())
    g = random(rng, ref.shape)
    ref.backward(torch.tensor(g, dtype=torch.float64))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    assert_close(ta.grad.numpy(), ra.grad.numpy())
    assert_close(tb.grad.numpy(), rb.grad.numpy())
    number = getattr(dp.functional, op)(ta, 2.0, alpha=3)
    assert_close(number.numpy(), getattr(torch, op)(ra, 2.0, alpha=3).detach().numpy())


def test_div_refuses_unknown_rounding_modes(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (3,)))
    assert_close(dp.functional.div(a, 2.0, rounding_mode=None).numpy(), a.numpy() / 2)
    for mode in ("round", "TRUNC", 1):
        with pytest.raises(dp.UnsupportedError, match="rounding_mode must be None, 'trunc' or"):
            dp.functional.div(a, 2.0, rounding_mode=mode)


def test_arithmetic_bad_input(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (3,)))
    with pytest.raises(dp.DTypeError):
        dp.functional.add(a, "x")
    with pytest.raises(dp.DTypeError):
        dp.functional.add(a, dp.Tensor.from_numpy(ctx, np.ones(3, np.int32)))
    with pytest.raises(dp.ShapeError):
        dp.functional.mul(a, dp.Tensor.from_numpy(ctx, random(rng, (4,))))


def test_float16_arithmetic_without_the_extension(ctx):
    """float16 once failed with a compiler error (no cl_khr_fp16) or, with a number, KeyError;
    it is storage now (computed in float32), on any device, numbers included
    (tests/test_half_ops.py checks the values)."""
    h = dp.Tensor.from_numpy(ctx, np.full((2, 3), 1.5, np.float16))
    assert dp.functional.add(h, h).numpy().tolist() == [[3.0] * 3] * 2
    y = dp.functional.mul(h, 2.0)
    assert y.dtype == np.float16 and y.numpy().tolist() == [[3.0] * 3] * 2
    assert dp.functional.maximum(2.0, h).numpy().tolist() == [[2.0] * 3] * 2
