"""The pointwise / broadcast kernel generator, and ``binary`` (two operands, no gradient).
The arithmetic operators with gradients (``add`` ... ``minimum``) are ``ops/arithmetic.py``,
which stands above this module and ``reduce`` (a broadcast operand's gradient is a sum).

``PointwiseKernel`` turns a C statement over named inputs, outputs and scalars into a kernel
(``kernels/pointwise.cl.mako``) that walks the output index space with numpy broadcasting.
Sizes and strides are run-time arguments: one compile serves every shape of the same rank
(after merging contiguous dimensions), index width, access width (scalar, or four elements per
access where the operands' layout allows) and loop (a grid-stride loop only where the launch is
capped below one work item per access, see ``Launch``). A call lays out a shape once (a plan per operand
shapes and offsets) and then only enqueues, through a ``BoundKernel`` that sets the arguments that
changed since the last call: Python's work and clSetKernelArg were most of a call's cost.
"""
import math
from dataclasses import dataclass
from threading import get_ident
import weakref
from typing import NamedTuple, Optional

import numpy as np

from .. import config, program, solver, tuning
from .. import launch as _launch
from ..context import check_same_context
from ..dtypes import as_dtype, bfloat16, cl_name, float32, is_float16_type, name as dtype_name
from ..errors import DTypeError, ShapeError
from ..launch import (BoundKernel, WorkSize, current, enqueue_bound, enqueue_kernel,
                      native_handle)
from ..tensor import Tensor, output_like

_INT32_LIMIT = 2 ** 31 - 1


class Launch(NamedTuple):
    """How a pointwise variant's work items cover the index space.

    ``unroll``: accesses per work item and loop step; ``interleave``: where they lie, "grid" (one
    global size apart) or "block" (one work-group size apart: a work-group's accesses are
    consecutive); ``group_size``: work items per work-group; ``groups_per_unit``: the grid cap,
    at most this many work-groups per compute unit and a grid-stride loop over the rest (None:
    enough work-groups for one step, and a kernel without the loop).
    """
    unroll: int
    interleave: str
    group_size: int
    groups_per_unit: Optional[int]


def broadcast_shapes(*shapes):
    """numpy's broadcast of ``shapes``; ShapeError when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for k in range(ndim):
        size = 1
        for s in shapes:
            dim = s[k - ndim + len(s)] if k - ndim + len(s) >= 0 else 1
            if dim != 1:
                if size not in (1, dim):
                    raise ShapeError(f"shapes {' and '.join(str(tuple(x)) for x in shapes)} "
                                     f"do not broadcast (dimension {k}: {size} vs {dim})")
                size = dim
        result.append(size)
    return tuple(result)


def broadcast_strides(shape, out_shape):
    """Element strides of a dense ``shape`` seen through ``out_shape`` (0 where broadcast)."""
    strides = [0] * len(out_shape)
    step = 1
    for k in range(1, len(shape) + 1):
        size = shape[-k]
        if size != 1:
            strides[-k] = step
        step *= size
    return strides


def merge_dimensions(out_shape, operand_strides):
    """Drop size-1 dimensions and merge neighbours that are contiguous for every operand.

    Returns ``(sizes, strides_per_operand)`` with at least one dimension.
    """
    keep = [k for k, s in enumerate(out_shape) if s != 1]
    return merge_contiguous([out_shape[k] for k in keep], [[st[k] for k in keep] for st in operand_strides])


def merge_contiguous(sizes, operand_strides):
    """Merge neighbouring dimensions that are contiguous for every operand.

    Returns ``(sizes, strides_per_operand)`` with at least one dimension.
    """
    sizes = list(sizes)
    strides = [list(st) for st in operand_strides]
    k = len(sizes) - 2
    while k >= 0:
        if all(st[k] == st[k + 1] * sizes[k + 1] for st in strides):
            sizes[k] *= sizes[k + 1]
            del sizes[k + 1]
            for st in strides:
                st[k] = st[k + 1]
                del st[k + 1]
        k -= 1
    if not sizes:
        return [1], [[0] for _ in strides]
    return sizes, strides


def launch_size(ctx, total, group=256, per_item=1, groups_per_unit=64):
    """(global, local) sizes for a grid-stride loop over ``total`` items, ``per_item`` of them
    per work item and loop step, with at most ``groups_per_unit`` groups per compute unit on a
    GPU (None: one group per ``group * per_item`` items, no loop)."""
    group = min(group, ctx.info.max_work_group_size)
    groups = max(1, math.ceil(total / (group * per_item)))
    if ctx.info.is_cpu:
        groups = min(groups, ctx.info.compute_units * 4)
    elif groups_per_unit is not None:
        groups = min(groups, ctx.info.compute_units * groups_per_unit)
    return (groups * group,), (group,)


def group_size(ctx, cap=256):
    """The largest power-of-two work-group size up to ``cap`` that the device allows (the
    tree reductions of pooling, batch norm and reduce halve it step by step)."""
    return 1 << (min(cap, ctx.info.max_work_group_size).bit_length() - 1)


@dataclass(frozen=True)
class PointwiseProblem:
    """A pointwise call after merging dimensions: its ``elements``, merged ``ndim``, and which
    inputs the vector solver would read vector-wide (``vector_inputs``, None where it does not
    apply to the operands' layout)."""
    elements: int
    ndim: int
    vector_inputs: Optional[tuple]

    def key(self):
        wide = "-" if self.vector_inputs is None else "".join(map(str, map(int, self.vector_inputs)))
        return f"pointwise-n{self.elements}-d{self.ndim}-v{wide}"

    def features(self):
        return {"elements": self.elements, "ndim": self.ndim,
                "vectorizable": int(self.vector_inputs is not None)}


class ScalarSolver(solver.Solver):
    """An element per access, for any layout."""
    name = "scalar"


class VectorSolver(solver.Solver):
    """VECTOR consecutive elements per access, where the operands' layout keeps them aligned
    (``PointwiseKernel.vector_layout``)."""
    name = "vector"

    def applies(self, ctx, problem):
        return problem.vector_inputs is not None


FAMILY = solver.register(solver.Family("pointwise", (ScalarSolver(), VectorSolver()),
                                       title="pointwise algorithm"))
ALGORITHMS = tuple(FAMILY.solvers)


class PointwiseKernel:
    """A generated pointwise kernel: ``outputs = f(inputs, scalars)`` with broadcasting.

    ``inputs``/``outputs``/``scalars``: sequences of (name, dtype); ``statement``: C code that
    assigns every output, e.g. ``"y = max(x, (float)0);"``.

    Two variants of the same kernel: "vector" moves VECTOR consecutive elements of each operand
    as one access (16 bytes for float; VECTOR16 elements, 16 bytes too, where every operand is
    16 bits wide, or VECTOR where a layout keeps only those aligned), and applies where every
    operand is contiguous or broadcast along the innermost dimension with offsets and strides
    that keep those accesses aligned; "scalar" applies everywhere. These are the "pointwise"
    family's solvers
    (``dlprim_py.solver``): a call's plan takes the one the rules of ``tuning_db/pointwise.json``
    choose ("vector" where it applies), or the one ``algorithm`` or DLPRIM_POINTWISE_ALGO
    forces. The launches below are class attributes so that a subclass can measure others.
    """

    # The launches (scalar; vector width, its launch in one dimension and in more): None takes
    # the device's rule (tuning_db/pointwise_launch.json, with the measurements behind it); a
    # subclass may fix them to measure others.
    SCALAR_LAUNCH = None
    VECTOR = None
    # Elements per access (2, 4 or 8) of a kernel whose operands are all 16 bits wide (float16,
    # bfloat16): None takes the rule's "vector16" (as many bytes per access as VECTOR float32
    # elements).
    VECTOR16 = None
    VECTOR_LAUNCH = None
    VECTOR_LAUNCH_ND = None
    # None: 32-bit index arithmetic wherever every index fits; "long" forces 64-bit.
    INDEX_T = None

    def __init__(self, name, inputs, outputs, statement, scalars=(), preamble=""):
        self.name = name
        self.inputs = [(n, as_dtype(t)) for n, t in inputs]
        self.outputs = [(n, as_dtype(t)) for n, t in outputs]
        self.scalars = [(n, np.dtype(t)) for n, t in scalars]
        self.statement = statement
        self.preamble = preamble
        self._operand_count = len(self.inputs) + len(self.outputs)
        self._input_count = len(self.inputs)
        # Every operand 16 bits wide: the vector variant may move more elements per access.
        self._narrow = all(t.itemsize == 2 for _, t in self.inputs + self.outputs)
        # ctx -> {(ndim, index_t, vector, unroll, vector_inputs): kernel}: a call looks its kernel
        # up without re-keying the program cache (whose key freezes every template parameter).
        self._kernels = weakref.WeakKeyDictionary()

    def launches(self, ctx):
        """(scalar launch, vector width, vector launch in one dimension, in more) on ``ctx``:
        the class's where it fixes them, else the device's rule."""
        shipped = _launches(ctx)
        return tuple(shipped[k] if mine is None else mine
                     for k, mine in enumerate((self.SCALAR_LAUNCH, self.VECTOR,
                                               self.VECTOR_LAUNCH, self.VECTOR_LAUNCH_ND)))

    def vector_widths(self, ctx):
        """The vector variant's elements per access on ``ctx``, widest first: the rule's
        "vector16" (or VECTOR16) and then VECTOR for a kernel whose operands are all 16 bits
        wide, VECTOR alone for others. A call takes the first whose alignment its operands'
        layout keeps."""
        vector = self.launches(ctx)[1]
        if not self._narrow:
            return (vector,)
        wide = _launches(ctx)[4] if self.VECTOR16 is None else self.VECTOR16
        return tuple(dict.fromkeys(v for v in (wide, vector) if v > 1)) or (vector,)

    def _kernel(self, ctx, ndim, index_t, vector=1, unroll=None, vector_inputs=(), interleave="grid",
                grid_stride=True):
        unroll = self.launches(ctx)[0].unroll if unroll is None else unroll
        per_ctx = self._kernels.get(ctx)
        if per_ctx is None:
            per_ctx = self._kernels[ctx] = {}
        key = (ndim, index_t, vector, unroll, vector_inputs, interleave, grid_stride)
        kernel = per_ctx.get(key)
        if kernel is None:
            kernel = per_ctx[key] = self._build(ctx, ndim, index_t, vector, unroll, vector_inputs,
                                                interleave, grid_stride)
        return kernel

    def template_params(self, ndim, index_t, vector, unroll, vector_inputs=(), interleave="grid",
                        grid_stride=True):
        """The parameters of ``kernels/pointwise.cl.mako`` for one variant of this kernel."""
        params = dict(
            name=self.name, ndim=ndim, unroll=unroll,
            index_t=index_t, vector=vector, vector_inputs=list(vector_inputs),
            statement=self.statement, preamble=self.preamble,
            inputs=[(n, template_type(t)) for n, t in self.inputs],
            outputs=[(n, template_type(t)) for n, t in self.outputs],
            scalars=[(n, _scalar_cl_name(t)) for n, t in self.scalars],
        )
        # Only where they differ from the template's defaults.
        if interleave != "grid":
            params["interleave"] = interleave
        if not grid_stride:
            params["grid_stride"] = False
        return params

    def _build(self, ctx, ndim, index_t, vector, unroll, vector_inputs=(), interleave="grid",
               grid_stride=True):
        params = self.template_params(ndim, index_t, vector, unroll, vector_inputs, interleave,
                                      grid_stride)
        return program.kernel(ctx, "pointwise", self.name, params)

    def vector_layout(self, sizes, strides, inputs, outputs, v=None):
        """Which inputs the vector variant reads ``v``-wide (default: this kernel's vector
        width on the outputs' device; a tuple of bools), or None where the variant does not
        apply to these merged ``sizes``/``strides`` and operands."""
        if v is None:
            v = self.launches(outputs[0].ctx)[1]
        if v <= 1 or math.prod(sizes) < v or (len(sizes) > 1 and sizes[-1] % v):
            return None
        if any(t.offset_elements % v for t in outputs):
            return None
        wide = []
        for t, st in zip(inputs, strides):
            if st[-1] == 0:
                wide.append(False)
            elif st[-1] == 1 and t.offset_elements % v == 0 and all(s % v == 0 for s in st[:-1]):
                wide.append(True)
            else:
                return None
        return tuple(wide)

    def __call__(self, inputs, outputs, scalars=(), algorithm=None):
        """Enqueue over ``outputs`` (dense, all one shape), broadcasting ``inputs`` to it.

        ``algorithm``: "scalar" or "vector" to force a solver ("vector" falls back to "scalar"
        where it does not apply); default DLPRIM_POINTWISE_ALGO (an error where the forced
        solver does not apply), else the tuning rules ("vector" where it applies).
        """
        operands = [*inputs, *outputs]
        if len(inputs) != self._input_count or not operands:
            raise ShapeError(f"{self.name}: expected {len(self.inputs)} inputs and "
                             f"{len(self.outputs)} outputs")
        # The outputs' count is tested where there is no plan: a key made of another count of
        # operands has another length than every key that has one.
        ctx = operands[0].ctx
        if ctx.thread != get_ident():
            ctx.check_thread()
        # Everything but the buffers and the scalars' values follows from this key (with the
        # forced solver and the tuning databases' generation): validate and lay out a call once,
        # then only bind the buffers and scalars and enqueue (the host's time per call is what a
        # small operator costs). The operands' fields go in flat for one or two operands, the
        # usual counts (the kernel fixes the count, so the two forms never meet), and the
        # context check rides on the same pass.
        forced = config.switches().forced.get("pointwise")
        if len(operands) == 2:
            a, b = operands
            if b.ctx is not ctx:
                check_same_context(*operands)
            key = (self, algorithm, forced, tuning.generation, a.shape, a.offset, a.dtype,
                   b.shape, b.offset, b.dtype)
        else:
            for t in operands:
                if t.ctx is not ctx:
                    check_same_context(*operands)
            key = (self, algorithm, forced, tuning.generation,
                   *[(t.shape, t.offset, t.dtype) for t in operands])
        plan = ctx.plans.hit(key)
        if plan is None:
            plan = ctx.plans.get(key)
        if plan is None:
            if len(operands) != self._operand_count:
                raise ShapeError(f"{self.name}: expected {len(self.inputs)} inputs and "
                                 f"{len(self.outputs)} outputs")
            for (n, dt), t in zip(self.inputs + self.outputs, operands):
                if t.dtype != dt:
                    raise DTypeError(f"{self.name}: {n} must be {dt}, got {t.dtype}")
            plan = ctx.plans.put(key, self._plan(ctx, inputs, outputs, algorithm))
        if plan is _EMPTY:
            return
        kernel, work, queue_handle, buffer_slots, scalar_slots, native_args = plan
        # BoundKernel.set_buffer inlined (every call of every pointwise op passes here).
        kernel.owner = None
        bound = kernel._bound
        for index, t in zip(buffer_slots, operands):
            handle = t.handle
            if bound[index] != handle:
                kernel.kernel.set_arg(index, t.buffer)
                bound[index] = handle
        if scalars:
            # BoundKernel.set's first test inlined: a call passes its constants (alpha = 1.0,
            # say) as the same objects every time.
            last = kernel._scalars
            for (index, kind), value in zip(scalar_slots, scalars):
                if value is not last[index]:
                    kernel.set(index, value, kind)
        if not _launch._recordings_open or current() is None:
            # enqueue_kernel inlined: the native enqueue, else PyOpenCL's.
            native = _launch._clEnqueueNDRangeKernel
            if native is None or _launch._collecting or native(*native_args):
                enqueue_kernel(ctx.queue, queue_handle, kernel, work)
        else:
            enqueue_bound(ctx.queue, kernel, work.global_size, work.local_size,
                          buffers=[(i, t.buffer) for i, t in zip(buffer_slots, operands)])

    def _plan(self, ctx, inputs, outputs, algorithm):
        """Validate the operands' shapes and choose the kernel, its launch and its static
        arguments: (kernel with them set, WorkSize, the queue's native handle, argument index of
        each operand's buffer, (argument index, numpy type) of each scalar, the native
        enqueue's arguments), or _EMPTY when there is nothing to compute."""
        out_shape = outputs[0].shape
        for t in outputs:
            if t.shape != out_shape:
                raise ShapeError(f"{self.name}: outputs must share one shape, got {t.shape} and {out_shape}")
        if broadcast_shapes(out_shape, *(t.shape for t in inputs)) != out_shape:
            raise ShapeError(f"{self.name}: inputs {[t.shape for t in inputs]} do not broadcast "
                             f"to the output shape {out_shape}")
        if algorithm is not None:
            FAMILY.solver(algorithm)
        total = math.prod(out_shape)
        if total == 0:
            return _EMPTY
        in_strides = [broadcast_strides(t.shape, out_shape) for t in inputs]
        sizes, strides = merge_dimensions(out_shape, in_strides + [broadcast_strides(out_shape, out_shape)])
        strides = strides[:len(inputs)]
        scalar_launch, _, vector_launch, vector_launch_nd = self.launches(ctx)
        vector_width, layout = 1, None
        for vector_width in self.vector_widths(ctx):
            layout = self.vector_layout(sizes, strides, inputs, outputs, vector_width)
            if layout is not None:
                break
        problem = PointwiseProblem(total, len(sizes), layout)
        if algorithm == "vector" and problem.vector_inputs is None:
            algorithm = "scalar"   # the keyword's contract: vector where it applies
        chosen = solver.select(ctx, "pointwise", problem, forced=algorithm).name
        wide = problem.vector_inputs if chosen == "vector" else None
        if wide is None:
            vector, launch, groups, tail = 1, scalar_launch, total, None
        else:
            # The innermost dimension and the inputs' strides along it count in groups of the
            # vector width.
            vector = vector_width
            launch = vector_launch if len(sizes) == 1 else vector_launch_nd
            groups, tail = total // vector, total % vector
            sizes = sizes[:-1] + [sizes[-1] // vector]
            strides = [st[:-1] + [st[-1] * vector] for st in strides]
        unroll = launch.unroll
        gsize, lsize = launch_size(ctx, groups, group=launch.group_size, per_item=unroll,
                                   groups_per_unit=launch.groups_per_unit)
        # With one access per item both layouts are one: no second kernel to build.
        interleave = launch.interleave if unroll > 1 else "grid"
        # Without a loop where one step of the launch covers every group.
        grid_stride = gsize[0] * unroll < groups
        # The loop forms base + unroll * global size (in groups) before comparing it with total.
        largest = max([(groups + unroll * gsize[0]) * vector + gsize[0]] +
                      [t.offset_elements + t.size for t in list(inputs) + list(outputs)])
        index_t = "int" if largest < _INT32_LIMIT and self.INDEX_T != "long" else "long"
        index_np = np.int32 if index_t == "int" else np.int64
        # A kernel object of the plan's own: its arguments stay set between calls.
        shared = self._kernel(ctx, len(sizes), index_t, vector, unroll, wide or (), interleave,
                              grid_stride)
        kernel = BoundKernel(program.new_kernel(shared.program, shared.function_name))
        # The arguments: sizes, then per operand its buffer, offset (and an input's strides),
        # then the scalars, then the tail. Everything but buffers and scalars is set here once.
        args = [index_np(groups)] + [index_np(s) for s in sizes]
        buffer_slots = []
        for t, st in zip(list(inputs) + list(outputs), strides + [[]] * len(outputs)):
            buffer_slots.append(len(args))
            args += [t.buffer, index_np(t.offset_elements)] + [index_np(s) for s in st]
        scalar_slots = []
        for _, dt in self.scalars:
            scalar_slots.append((len(args), dt.type))
            args.append(dt.type(0))
        if tail is not None:
            args.append(index_np(tail))
        kernel.set_all(args)
        work = WorkSize(gsize, lsize)
        queue_handle = native_handle(ctx.queue)
        return (kernel, work, queue_handle, tuple(buffer_slots), tuple(scalar_slots),
                (queue_handle, kernel.handle) + work.native)


# A plan for an empty output: nothing to enqueue.
_EMPTY = object()


def _launches(ctx):
    """The device's rule of ``tuning_db/pointwise_launch.json``: (scalar launch, vector width,
    vector launch in one dimension, in more, vector width of all-16-bit kernels)."""
    rule = solver.device_params(ctx, "pointwise_launch")
    return (Launch(**rule["scalar"]), rule["vector"], Launch(**rule["vector_launch"]),
            Launch(**rule["vector_launch_nd"]), rule.get("vector16", rule["vector"]))


def template_type(dtype):
    """An operand's type for ``kernels/pointwise.cl.mako``: its OpenCL C name, or "half" /
    "bfloat16" for the 16-bit floating point storage types, which the template loads into and
    stores from float (no cl_khr_fp16 needed, one rounding per store)."""
    return "bfloat16" if dtype is bfloat16 else cl_name(dtype)


def is_floating(dtype):
    """Whether ``dtype`` is one of the floating point types operators compute on (float32,
    float16, bfloat16)."""
    return dtype == float32 or is_float16_type(dtype)


def promote_floats(a, b):
    """torch's promotion of two floating point dtypes: the same type stays; float32 with a
    16-bit type is float32, and float16 with bfloat16 (neither holds the other) float32."""
    return a if a == b else float32


def compute_dtype(dtype):
    """The type a kernel computes a ``dtype`` operand in, and passes its scalars as: float32
    for the 16-bit storage types."""
    return float32 if is_float16_type(dtype) else dtype


def _scalar_cl_name(dtype):
    return {np.dtype(np.float32): "float", np.dtype(np.int32): "int", np.dtype(np.int64): "long",
            np.dtype(np.uint32): "uint"}[np.dtype(dtype)]


_fill_kernels = {}


def fill_kernel(dtype):
    """The pointwise kernel that sets every element of its output to a scalar, for tensors of
    ``dtype`` (None for a dtype scalars cannot have: float16 and the 8/16-bit integers)."""
    dtype = np.dtype(dtype)
    kernel = _fill_kernels.get(dtype)
    if kernel is None and dtype not in _fill_kernels:
        try:
            _scalar_cl_name(dtype)
        except KeyError:
            _fill_kernels[dtype] = None
            return None
        kernel = _fill_kernels[dtype] = PointwiseKernel(
            f"fill_{dtype.name}", [], [("y", dtype)], "y = value;", scalars=[("value", dtype)])
    return kernel


# ---- arithmetic with broadcasting --------------------------------------------------------

_BINARY = {
    "add": "y = a + b;",
    "sub": "y = a - b;",
    "mul": "y = a * b;",
    "div": "y = a / b;",
    "div_trunc": "y = trunc(a / b);",
    # torch's floor division of floats: from fmod, so that the quotient is the floor of the
    # exact a / b (floor(a / b) may round up past it), rounded to the nearest integer.
    "div_floor": "if (b == 0) { y = a / b; } else {"
                 " float m = fmod(a, b); float d = (a - m) / b;"
                 " if (m != 0 && ((b < 0) != (m < 0))) d -= 1;"
                 " float f = floor(d); if (d - f > 0.5f) f += 1;"
                 " y = d != 0 ? f : copysign(0.0f, a / b); }",
    "maximum": "y = (a != a || b != b) ? (a + b) : max(a, b);",
    "minimum": "y = (a != a || b != b) ? (a + b) : min(a, b);",
}


def _binary_kernel(op, dtype, a_scalar, b_scalar, a_dtype=None, b_dtype=None):
    """The kernel of ``op`` with a ``dtype`` result; an operand is a tensor of ``a_dtype`` /
    ``b_dtype`` (default ``dtype``), or a scalar (passed in the type the kernel computes in)."""
    a_dtype = dtype if a_dtype is None else a_dtype
    b_dtype = dtype if b_dtype is None else b_dtype
    cache_key = (op, dtype, a_scalar, b_scalar, a_dtype, b_dtype)
    k = _binary_kernels.get(cache_key)
    if k is None:
        inputs = [(n, t) for n, t, is_scalar in (("a", a_dtype, a_scalar), ("b", b_dtype, b_scalar))
                  if not is_scalar]
        scalars = [(n, compute_dtype(dtype)) for n, is_scalar in (("a", a_scalar), ("b", b_scalar))
                   if is_scalar]
        k = _binary_kernels[cache_key] = PointwiseKernel(
            f"{op}_{'s' if a_scalar else 't'}{'s' if b_scalar else 't'}", inputs, [("y", dtype)],
            _BINARY[op], scalars=scalars)
        if dtype == np.float32 and a_dtype == dtype and b_dtype == dtype \
                and not (a_scalar or b_scalar):
            _float32_tensors[op] = k
    return k


_binary_kernels = {}
# op -> the kernel of two float32 tensors (the residual add's), looked up by op alone.
_float32_tensors = {}
_FLOAT32 = np.dtype(np.float32)


def binary(op, a, b):
    """``op`` ("add", "sub", "mul", "div", "maximum", "minimum") of two tensors (numpy
    broadcasting) or a tensor and a Python number. No gradient is recorded.

    Floating point tensors only: float32, float16, bfloat16, promoted as torch does (one type
    stays; float32 with a 16-bit type, or float16 with bfloat16, gives float32); a number takes
    the tensor's type. 16-bit operands compute in float32 and the result is rounded once (to
    nearest even), on any device (no cl_khr_fp16 needed)."""
    if a.__class__ is Tensor and a.dtype is _FLOAT32:
        # The common cases first: float32 tensors of one shape, or one with a number (the
        # kernel's call checks the context; the dtype says no float16 rules apply).
        if b.__class__ is Tensor and b.shape == a.shape and b.dtype is _FLOAT32:
            out = output_like(a)
            kernel = _float32_tensors.get(op) or _binary_kernel(op, _FLOAT32, False, False)
            kernel([a, b], [out])
            return out
        if b.__class__ in (int, float):
            out = output_like(a)
            _binary_kernel(op, _FLOAT32, False, True)([a], [out], [b])
            return out
    a_scalar = not isinstance(a, Tensor)
    b_scalar = not isinstance(b, Tensor)
    if a_scalar and b_scalar:
        raise DTypeError(f"{op}: at least one operand must be a Tensor")
    ref = b if a_scalar else a
    for x in (a, b):
        if not isinstance(x, Tensor) and not isinstance(x, (int, float, np.number)):
            hint = "; make a tensor with dp.Tensor.from_numpy(array)" \
                if type(x).__module__ == "numpy" else ""
            raise DTypeError(f"{op}: operands must be Tensors or numbers, got "
                             f"{type(x).__name__}{hint}")
        if isinstance(x, Tensor) and not is_floating(x.dtype):
            raise DTypeError(f"{op}: only floating point tensors (float32, float16, bfloat16) "
                             f"are supported, got {dtype_name(x.dtype)}")
    dtype = ref.dtype if a_scalar or b_scalar else promote_floats(a.dtype, b.dtype)
    shapes = [x.shape for x in (a, b) if isinstance(x, Tensor)]
    check_same_context(*(x for x in (a, b) if isinstance(x, Tensor)))
    out = Tensor.empty(ref.ctx, broadcast_shapes(*shapes), dtype)
    kernel = _binary_kernel(op, dtype, a_scalar, b_scalar,
                            None if a_scalar else a.dtype, None if b_scalar else b.dtype)
    kernel([x for x in (a, b) if isinstance(x, Tensor)], [out],
           [x for x in (a, b) if not isinstance(x, Tensor)])
    return out


_convert_kernels = {}


def convert(x, dtype):
    """``x`` as a new dense tensor of the floating point ``dtype`` (float32, float16,
    bfloat16), rounded to nearest even where it narrows; no gradient. The reductions and
    normalizations of 16-bit tensors accumulate in float32 and round their results with it."""
    dtype = as_dtype(dtype)
    key = (x.dtype, dtype)
    kernel = _convert_kernels.get(key)
    if kernel is None:
        kernel = _convert_kernels[key] = PointwiseKernel(
            f"convert_{template_type(x.dtype)}_{template_type(dtype)}", [("x", x.dtype)],
            [("y", dtype)], "y = x;")
    out = Tensor.empty(x.ctx, x.shape, dtype)
    kernel([x], [out])
    return out
