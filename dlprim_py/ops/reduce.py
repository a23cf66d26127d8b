"""The broadcast + reduce kernel generator and the reductions built on it.

``ReduceKernel`` turns C statements into a kernel (``kernels/reduce.cl.mako``) that broadcasts
its inputs to one index space, maps every element to one value per accumulator, and folds those
values over the reduced dimensions: ``y = sum(x * x)`` over some axes is one kernel, with no
temporary. Sizes and strides are run-time arguments, so one compile serves every shape with the
same number of (merged) kept and reduced dimensions, variant and index width.

Three solvers of the "reduce" family (``dlprim_py.solver``, ``DLPRIM_REDUCE_ALGO`` or
``variant=`` forces one): "group", the items of a work-group walking the reduced dimensions
(chosen where the innermost reduced run is contiguous), "item", a work item per output
walking them (coalesced across outputs), and "columns", for one float32 input reduced over
its leading dimensions with the trailing ones kept, by a kernel of one float32 accumulator
(``sum(x, 0)``, ``mean``, ``amax``, a bias gradient: kernels/reduce_columns.cl.mako,
work-groups of 64 columns by a chunk of rows, float4 loads, the chunks combined by the last
work-group of each block or by a second launch, as the "reduce_partials" family says; one
launch where "item" takes two). Their tuning values are data, read when a plan is built:
the rules of ``tuning_db/reduce.json`` (device -> architecture -> vendor -> default, each with
the measurement behind it) that name the solver. Each work item keeps ``unroll`` independent
accumulator sets and loads that many elements before folding any, so several loads per item are
in flight (the kernels are bound by memory latency otherwise). When the reduced run is
contiguous and whole vectors fit, the group solver loads float4 (``vector``, ``vector_unroll``
sets); short reductions share a work-group (``segment`` items per output). A call like an
earlier one (same shapes, dtypes, offsets, switches) skips validation and planning: its launch,
with the shape arguments bound, is kept.

Accuracy: no sequential float sum is longer than ``set_chunk`` (per accumulator set, at most
``LONGEST_FOLD``); longer reductions are cut into chunks whose partial results are reduced again,
as a tree: by a second launch, or, for a reduction of everything to one value, by the work-group
that finishes last in the same launch (the "reduce_partials" family's solvers "last_group" and
"launch", ``DLPRIM_REDUCE_PARTIALS_ALGO``), in a fixed order either way. argmax and argmin, whose
fold is exact, keep their index in the kernel's index type and may put fewer items on each
output (the ``exact_fold`` rule's ``max_segment``).

The functional reductions (``sum``, ``mean``, ``amax``, ``amin``, ``argmax``, ``argmin``,
``norm``, ``any``, ``all``) take torch's arguments (``dim`` an int, a sequence of ints or None;
``keepdim``) and record their backward on the tape. ``sum`` of a bool, int32 or int64 tensor is
int64 (a mask's count of True), ``any`` and ``all`` of any dtype are bool, as torch's.
``sum_to_shape`` folds a broadcast gradient back to the shape of an operand (a linear
layer's bias gradient: the columns solver's problem).
"""
import math
from dataclasses import dataclass
from threading import get_ident

import numpy as np

from .. import autograd, config, program, solver, tuning
from ..context import check_same_context
from ..dtypes import as_dtype, bool_, cl_name, float32, is_float16_type, name as dtype_name
from ..errors import DTypeError, DlprimError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor
from ..launch import BoundKernel, current
from .pointwise import (PointwiseKernel, _scalar_cl_name, binary, broadcast_shapes,
                        broadcast_strides, convert, is_floating, merge_contiguous, template_type)

_INT32_LIMIT = 2 ** 31 - 1

# The longest sequential float fold per accumulator set that a tuning rule may ask for
# (``set_chunk``): an accuracy bound, not a tuning choice. Past it the rounding of a running sum
# grows (10^7 uniform values folded 64 at a time, then as a tree, stay within float32 rounding of
# the float64 sum; tests/test_reduce.py::test_large_sum_and_norm_are_accurate).
LONGEST_FOLD = 64


@dataclass(frozen=True)
class ReduceProblem:
    """One reduction, after merging: the kept and reduced sizes, each operand's (kept strides,
    reduced strides), and whether the kernel's fold is exact (argmax: a tuning rule may give it
    fewer items per output)."""
    kept_sizes: tuple
    red_sizes: tuple
    strides: tuple
    exact_fold: bool = False
    columns: bool = False

    def key(self):
        strides = ";".join(f"{','.join(map(str, k))}/{','.join(map(str, r))}" for k, r in self.strides)
        return (f"reduce-k{'x'.join(map(str, self.kept_sizes))}-r{'x'.join(map(str, self.red_sizes))}"
                f"-s{strides}-e{int(self.exact_fold)}-c{int(self.columns)}")

    def features(self):
        return {"kept_size": math.prod(self.kept_sizes), "reduce_size": math.prod(self.red_sizes),
                "reduced_dims": len(self.red_sizes),
                "inner_contiguous": int(bool(self.red_sizes) and self.strides[0][1][-1] == 1),
                "exact_fold": int(self.exact_fold), "columns": int(self.columns)}


class GroupSolver(solver.Solver):
    """The items of a work-group (or ``segment`` of them) walk one output's reduced dimensions:
    coalesced where the innermost reduced run is contiguous."""
    name = "group"


class ItemSolver(solver.Solver):
    """A work item per output (and chunk) walks its reduced dimensions: coalesced across
    neighbouring outputs."""
    name = "item"


# Rows the columns solver takes: at most 1024 chunks (64 per lane of the fold) of at most 2048
# rows (64 per lane and set).
COLUMN_ROWS_LIMIT = 1024 * 2048


class ColumnsSolver(solver.Solver):
    """One float32 input reduced over its leading dimensions, the trailing ones kept (a bias
    gradient): work-groups of 64 columns by a chunk of rows, float4 loads, the chunks combined
    by the last work-group of each block or by a second launch
    (kernels/reduce_columns.cl.mako)."""
    name = "columns"

    def applies(self, ctx, problem):
        return (problem.columns and ctx.info.max_work_group_size >= 256
                and 2 <= problem.red_sizes[0] <= COLUMN_ROWS_LIMIT)


@dataclass(frozen=True)
class PartialsProblem:
    """How a reduction of everything to one value (or the columns solver) combines its ``chunks``
    partial results, with work-groups of ``group_size`` items folding runs of at most
    ``set_chunk``."""
    chunks: int
    group_size: int
    set_chunk: int

    def key(self):
        return f"reduce_partials-c{self.chunks}-g{self.group_size}-s{self.set_chunk}"

    def features(self):
        return {"chunks": self.chunks, "group_size": self.group_size, "set_chunk": self.set_chunk}


class LastGroupSolver(solver.Solver):
    """The work-group that finishes last folds the partials in the same launch (behind a
    device-wide fence): where it folds at most ``set_chunk`` of them per item."""
    name = "last_group"

    def applies(self, ctx, problem):
        return problem.chunks <= problem.group_size * problem.set_chunk


class LaunchSolver(solver.Solver):
    """A second launch reduces the partials."""
    name = "launch"


class _NamedFamily(solver.Family):
    """A family whose unknown solver names are refused as the module always refused them."""

    def solver(self, name):
        try:
            return self.solvers[name]
        except KeyError:
            raise UnsupportedError(f"{self.title} must be one of {tuple(self.solvers)}, "
                                   f"got {name!r}") from None


FAMILY = solver.register(_NamedFamily("reduce", (GroupSolver(), ItemSolver(), ColumnsSolver()),
                                      title="reduce variant"))
PARTIALS_FAMILY = solver.register(_NamedFamily("reduce_partials",
                                               (LastGroupSolver(), LaunchSolver()),
                                               title="reduce partials mode"))
VARIANTS = tuple(FAMILY.solvers)
PARTIALS_MODES = tuple(PARTIALS_FAMILY.solvers)

_PRESETS = {
    "sum": ("acc_{n} += {n};", {np.dtype(np.float32): "0.0f", np.dtype(np.int64): "0", np.dtype(np.int32): "0"}),
    # NaN wins, as in torch.amax.
    "max": ("acc_{n} = (acc_{n} != acc_{n} || {n} <= acc_{n}) ? acc_{n} : {n};",
            {np.dtype(np.float32): "-INFINITY"}),
    "min": ("acc_{n} = (acc_{n} != acc_{n} || {n} >= acc_{n}) ? acc_{n} : {n};",
            {np.dtype(np.float32): "INFINITY"}),
}


class ReduceKernel:
    """A generated broadcast + reduce kernel.

    ``inputs``, ``outputs``, ``scalars``: sequences of (name, dtype). Each output is an
    accumulator of its dtype. ``map_statement``: C code that assigns every output name from the
    inputs (and may read ``ridx``, the flat index over the reduced dimensions, and ``oidx``, the
    output's flat index). ``combine``: "sum", "max" or "min" for every output, or C code that
    folds the values ``<name>`` into ``acc_<name>``, associative and commutative, with
    ``identity`` a dict name -> C expression. ``finalize``: C code run on ``acc_<name>`` once,
    with ``reduce_size`` (the number of elements reduced per output) and the scalars in scope.
    ``fold``: C code like ``combine`` for folding one element into an accumulator set, which
    sees its elements (and a partials pass its chunks) in increasing ``ridx``; defaults to
    ``combine``. ``index_accumulators``: names of outputs whose accumulator is the kernel's
    index type (32-bit when every index fits) and converted to the output's dtype only when
    written, e.g. argmax's int64 index; their identity may use INDEX_MAX. ``exact_fold``: the
    fold is exact (argmax), so the tuning rules for ``exact_fold`` apply: with ``max_segment``
    at most that many items per output when there are several outputs, chunks stay as long as
    with whole groups, an item folds longer runs than ``set_chunk``, and several outputs share a
    group's tree. ``vector_unroll`` (accumulator sets per item with vector loads) and
    ``max_segment`` given here override the tuning rules for this kernel (measurements).
    """

    def __init__(self, name, inputs, outputs, map_statement, combine="sum", identity=None,
                 finalize="", scalars=(), preamble="", fold=None, index_accumulators=(),
                 vector_unroll=None, max_segment=None, exact_fold=False):
        self.name = name
        self.inputs = [(n, as_dtype(t)) for n, t in inputs]
        self.outputs = [(n, as_dtype(t)) for n, t in outputs]
        self.scalars = [(n, np.dtype(t)) for n, t in scalars]
        names = [n for n, _ in self.inputs + self.outputs + self.scalars]
        if len(set(names)) != len(names):
            raise ShapeError(f"{name}: input, output and scalar names must differ, got {names}")
        if combine in _PRESETS:
            statement, identities = _PRESETS[combine]
            self.combine = " ".join(statement.format(n=n) for n, _ in self.outputs)
            self.identity = {}
            for n, t in self.outputs:
                if t not in identities:
                    raise DTypeError(f"{name}: no {combine} identity for a {t} output")
                self.identity[n] = identities[t]
        else:
            self.combine = combine
            self.identity = dict(identity or {})
            missing = [n for n, _ in self.outputs if n not in self.identity]
            if missing:
                raise ShapeError(f"{name}: a custom combine needs an identity for {missing}")
        self.map_statement = map_statement
        self.fold = fold or self.combine
        self.finalize = finalize
        self.preamble = preamble
        self.index_accumulators = tuple(index_accumulators)
        self.vector_unroll = vector_unroll
        self.max_segment = max_segment
        self.exact_fold = bool(exact_fold)
        # The columns solver's kernel takes one float32 input into one float32 accumulator.
        self.columns_form = (len(self.inputs) == 1 and len(self.outputs) == 1
                             and self.inputs[0][1] == float32 and self.outputs[0][1] == float32
                             and not self.scalars and not self.index_accumulators
                             and not self.exact_fold)
        self._partials_kernel = None

    def _accumulators(self, index_t):
        return [(n, index_t if n in self.index_accumulators else cl_name(t), self.identity[n], cl_name(t))
                for n, t in self.outputs]

    def _build(self, ctx, variant, group_size, unroll, kept_ndim, red_ndim, index_t, apply_finalize,
               vector=1, last_group=False):
        params = dict(
            name=self.name, variant=variant, group_size=group_size, vector=vector,
            unroll=unroll, kept_ndim=kept_ndim, red_ndim=red_ndim, index_t=index_t,
            inputs=[(n, template_type(t)) for n, t in self.inputs],
            accumulators=self._accumulators(index_t),
            scalars=[(n, _scalar_cl_name(t)) for n, t in self.scalars],
            map_statement=self.map_statement, combine=self.combine, fold=self.fold,
            finalize=self.finalize, apply_finalize=apply_finalize, preamble=self.preamble,
            last_group=last_group, device_fence=_device_fence(ctx) if last_group else "")
        return program.build(ctx, "reduce", params)

    def partials_kernel(self):
        """The kernel that reduces this kernel's partial results (same combine and finalize)."""
        if self._partials_kernel is None:
            inputs = [(f"partial_{n}", t) for n, t in self.outputs]
            self._partials_kernel = ReduceKernel(
                f"{self.name}_partials", inputs, self.outputs,
                " ".join(f"{n} = partial_{n};" for n, _ in self.outputs),
                self.combine, self.identity, self.finalize, self.scalars, self.preamble, self.fold,
                self.index_accumulators)
        return self._partials_kernel

    def __call__(self, inputs, outputs, scalars=(), axes=None, variant=None):
        """Enqueue: reduce ``inputs`` (broadcast together to a full shape) into ``outputs``.

        The reduced axes are ``axes`` of the full shape (ints, negative allowed) when given; the
        outputs' shape is then the full shape with those axes removed or set to 1. Without
        ``axes`` the outputs' shape, aligned to the right of the full shape, says it: every
        dimension where it is 1 and the full shape is not is reduced. All outputs share one
        shape and are dense. ``variant``: force the solver "group" or "item" (else
        ``DLPRIM_REDUCE_ALGO``, else the tuning rules).
        """
        # A call like an earlier one (same shapes, dtypes, offsets, context, switches) was
        # validated then: it only binds its buffers and enqueues.
        try:
            ctx = inputs[0].ctx
            if ctx.thread != get_ident():
                ctx.check_thread()
            key = (self, tuple([(t.shape, t.dtype, t.offset) for t in inputs]),
                   tuple([(t.shape, t.dtype, t.offset) for t in outputs]), len(scalars),
                   axes if axes is None or isinstance(axes, int) else tuple(axes), variant,
                   switches(), self.vector_unroll, self.max_segment)
            launch = ctx.plans.get(key)
            if launch is None:
                raise KeyError(key)
            if not all(t.ctx is ctx for t in outputs) or not all(t.ctx is ctx for t in inputs):
                raise KeyError(key)
        except (KeyError, TypeError, AttributeError, IndexError):
            launch = self._prepare(inputs, outputs, scalars, axes, variant)
        if launch is not None:
            launch.enqueue(inputs, outputs, scalars)

    def _prepare(self, inputs, outputs, scalars, axes, variant):
        """Validate a call and find (or make) its launch; None when the output is empty."""
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise ShapeError(f"{self.name}: expected {len(self.inputs)} inputs and "
                             f"{len(self.outputs)} outputs, got {len(inputs)} and {len(outputs)}")
        if len(scalars) != len(self.scalars):
            raise ShapeError(f"{self.name}: expected {len(self.scalars)} scalars, got {len(scalars)}")
        for (n, dt), t in zip(self.inputs + self.outputs, list(inputs) + list(outputs)):
            if not isinstance(t, Tensor):
                raise not_a_tensor(f"{self.name}: {n}", t)
            if t.dtype != dt:
                raise DTypeError(f"{self.name}: {n} must be {dt}, got {t.dtype}")
        ctx = check_same_context(*inputs, *outputs)
        out_shape = outputs[0].shape
        for t in outputs:
            if t.shape != out_shape:
                raise ShapeError(f"{self.name}: outputs must share one shape, got {t.shape} and {out_shape}")
        axes_key = axes if axes is None or isinstance(axes, int) else tuple(axes)
        key = (self, tuple([(t.shape, t.dtype, t.offset) for t in inputs]),
               tuple([(t.shape, t.dtype, t.offset) for t in outputs]), len(scalars), axes_key,
               variant, switches(), self.vector_unroll, self.max_segment)
        launch = ctx.plans.get(key)
        if launch is not None:
            return launch
        full = broadcast_shapes(*(t.shape for t in inputs))
        reduced = _reduced_mask(self.name, full, out_shape, axes)
        plan = _plan(ctx, full, reduced, [broadcast_strides(t.shape, full) for t in inputs], variant,
                     self)
        reduce_size = math.prod(s for s, r in zip(full, reduced) if r)
        largest = max(t.offset_elements + t.size for t in list(inputs) + list(outputs))
        if plan is None:
            return None
        aligned = all(t.offset_elements % plan.vector == 0 for t in inputs)
        return ctx.plans.put(key, _launch(self, ctx, plan, aligned, largest, reduce_size))

    def describe(self, inputs, outputs, axes=None, variant=None):
        """(solver, segment, vector, chunks, partials) that a call with these tensors runs, for
        benchmarks and tests (partials: "last_group", "launch", or None for one chunk); None
        when the output is empty."""
        full = broadcast_shapes(*(t.shape for t in inputs))
        reduced = _reduced_mask(self.name, full, outputs[0].shape, axes)
        plan = _plan(inputs[0].ctx, full, reduced, [broadcast_strides(t.shape, full) for t in inputs], variant,
                     self)
        if plan is None:
            return None
        aligned = all(t.offset_elements % plan.vector == 0 for t in inputs)
        partials = None if plan.chunks == 1 else ("last_group" if plan.last_group else "launch")
        return plan.variant, plan.segment, plan.vector if aligned else 1, plan.chunks, partials


class _Launch:
    """One reduction problem, ready to enqueue: its kernels with the shape arguments bound once
    (own kernel objects, so that nothing else rebinds them), the partials buffer, and the launch
    that reduces the partials (or, for a last-group combine, the count of finished groups).
    A call sets only the buffers, offsets and scalars."""

    def __init__(self, reduce_kernel, ctx, plan, aligned, largest, reduce_size):
        kept_total, red_total = math.prod(plan.kept_sizes), math.prod(plan.red_sizes)
        units = kept_total * plan.chunks
        self.ctx = ctx
        self.vector = plan.vector if aligned else 1
        # Indices the kernel forms: units (and a group's slots past them), reduced indices up
        # to a step past the end, element offsets inside each buffer (``largest``).
        biggest = max(units + plan.max_group_size,
                      red_total + plan.chunk_len + plan.max_group_size * 4 * plan.unroll,
                      reduce_size, largest)
        index_t = "int" if biggest < _INT32_LIMIT // 2 else "long"
        self.index = index = np.int32 if index_t == "int" else np.int64
        group_size = plan.group_size
        self.final = plan.chunks == 1
        self.last_group = plan.last_group and not self.final
        built = reduce_kernel._build(ctx, plan.variant, group_size, plan.unroll, len(plan.kept_sizes),
                                     len(plan.red_sizes), index_t, self.final, self.vector,
                                     self.last_group)
        self.kernel = BoundKernel(built.kernel(reduce_kernel.name, fresh=True))
        args = [index(v) for v in (kept_total, red_total, plan.chunk_len, plan.chunks, reduce_size)]
        args.append(np.int32(plan.segment.bit_length() - 1))
        args += [index(s) for s in plan.kept_sizes] + [index(s) for s in plan.red_sizes]
        self.input_slots = []
        for kept_st, red_st in plan.strides:
            self.input_slots.append(len(args))
            args += [None, None] + [index(s) for s in kept_st] + [index(s) for s in red_st]
        self.output_slots = []
        for _ in reduce_kernel.outputs:
            self.output_slots.append(len(args))
            args += [None, None]
        self.final_slots = []
        self.partials = self.sub_launch = None
        if not self.final:
            # Owned by this launch and reused: calls on the context's in-order queue never
            # overlap, so one buffer serves them all.
            self.partials = [Tensor.empty(ctx, (plan.chunks, kept_total), dt) for _, dt in reduce_kernel.outputs]
        if self.last_group:
            for _ in reduce_kernel.outputs:
                self.final_slots.append(len(args))
                args += [None, None]
            # Zero between launches: the last group to finish sets it back.
            self.done_count = Tensor.zeros(ctx, (1,), np.int32)
            self.done_slot = len(args)
            args.append(self.done_count.buffer)
        self.scalar_slots = list(range(len(args), len(args) + len(reduce_kernel.scalars)))
        self.scalar_types = [dt.type for _, dt in reduce_kernel.scalars]
        for k, value in enumerate(args):
            if value is not None:
                self.kernel.set(k, value)
        cap = ctx.info.compute_units * (4 if ctx.info.is_cpu else 64)
        if plan.variant == "group":
            groups = min(math.ceil(units / (group_size // plan.segment)), cap)
        else:
            groups = min(math.ceil(units / group_size), cap)
        self.global_size, self.local_size = (groups * group_size,), (group_size,)
        if not self.final and not self.last_group:
            partials_kernel = reduce_kernel.partials_kernel()
            sub_plan = _plan(ctx, (plan.chunks, kept_total), (True, False),
                             [[kept_total, 1]] * len(self.partials), None, partials_kernel)
            # The partials are (chunks, kept_total), row-major: the columns solver's problem
            # where the partials kernel has its form.
            self.sub_launch = _launch(partials_kernel, ctx, sub_plan, True, units, reduce_size)

    def enqueue(self, inputs, outputs, scalars):
        # Only what changed is set: offsets and scalars by value, buffers by handle (pooled
        # buffers often come back with the same one).
        kernel, index = self.kernel, self.index
        for slot, t in zip(self.input_slots, inputs):
            kernel.set(slot, t.buffer)
            kernel.set(slot + 1, t.offset_elements, index)
        targets = outputs if self.final else self.partials
        for slot, t in zip(self.output_slots, targets):
            kernel.set(slot, t.buffer)
            kernel.set(slot + 1, t.offset_elements, index)
        for slot, t in zip(self.final_slots, outputs):
            kernel.set(slot, t.buffer)
            kernel.set(slot + 1, t.offset_elements, index)
        for slot, kind, value in zip(self.scalar_slots, self.scalar_types, scalars):
            kernel.set(slot, value, kind)
        buffers = None
        if current() is not None:
            # What a recording needs to replay this launch on other buffers.
            buffers = [(slot, t.buffer) for slots, tensors in
                       ((self.input_slots, inputs), (self.output_slots, targets),
                        (self.final_slots, outputs)) for slot, t in zip(slots, tensors)]
            if self.last_group:
                buffers.append((self.done_slot, self.done_count.buffer))
        kernel.enqueue(self.ctx.queue, self.global_size, self.local_size, buffers)
        if self.sub_launch is not None:
            self.sub_launch.enqueue(self.partials, outputs, scalars)


def _launch(reduce_kernel, ctx, plan, aligned, largest, reduce_size):
    """The launch that runs ``plan``: the columns solver's, or the generic kernels'."""
    if plan.variant == "columns":
        return _ColumnsLaunch(reduce_kernel, ctx, plan, aligned, reduce_size)
    return _Launch(reduce_kernel, ctx, plan, aligned, largest, reduce_size)


def _pow2_floor(n):
    return 1 << (int(n).bit_length() - 1)


def _reduced_mask(name, full, out_shape, axes):
    """Which dimensions of ``full`` are reduced, checking ``out_shape`` against them."""
    ndim = len(full)
    if axes is not None:
        axes = normalize_dims(axes, ndim, name)
        reduced = tuple(k in axes for k in range(ndim))
        keep = tuple(full[k] for k in range(ndim) if not reduced[k])
        keep_dims = tuple(1 if reduced[k] else full[k] for k in range(ndim))
        if tuple(out_shape) not in (keep, keep_dims):
            raise ShapeError(f"{name}: reducing axes {sorted(axes)} of {full} gives {keep} or "
                             f"{keep_dims}, but the output has shape {tuple(out_shape)}")
        return reduced
    if len(out_shape) > ndim:
        raise ShapeError(f"{name}: output shape {tuple(out_shape)} has more dimensions than the "
                         f"inputs' broadcast shape {full}")
    aligned = (1,) * (ndim - len(out_shape)) + tuple(out_shape)
    for k in range(ndim):
        if aligned[k] not in (1, full[k]):
            raise ShapeError(f"{name}: output shape {tuple(out_shape)} does not fit the inputs' "
                             f"broadcast shape {full} (dimension {k}: {aligned[k]} vs {full[k]})")
    return tuple(aligned[k] == 1 and full[k] != 1 for k in range(ndim))


class _Plan:
    """How one reduction problem is cut: merged kept and reduced sizes, per-operand (kept
    strides, reduced strides), the solver's name (``variant``), chunks and their length,
    accumulator sets per item, items per unit (``segment``, "group"), the widest vector load the
    shapes allow, the work-group size (and the tuned one, which bounds the index range)."""

    def __init__(self, kept_sizes, red_sizes, strides, variant, chunks, chunk_len, unroll, segment,
                 vector, last_group=False, group_size=256, max_group_size=256):
        self.kept_sizes, self.red_sizes, self.strides = kept_sizes, red_sizes, strides
        self.variant, self.chunks, self.chunk_len, self.unroll = variant, chunks, chunk_len, unroll
        self.segment, self.vector, self.last_group = segment, vector, last_group
        self.group_size, self.max_group_size = group_size, max_group_size


def switches():
    """What every reduction's launch depends on besides its operands and the kernel: the forced
    solvers and the tuning databases' generation. Part of every launch key, and of the key of a
    plan that records reductions."""
    forced = config.switches().forced
    return forced.get("reduce"), forced.get("reduce_partials"), tuning.generation


def _plan(ctx, full, reduced, operand_strides, variant, kernel):
    """The ``_Plan`` of a problem, or None when the output is empty. ``variant``: a solver the
    caller forces; ``kernel``: the ReduceKernel (its fold, and tuning values of its own).
    Made on a launch's first call: the solver and its tuning values are chosen here."""
    kept = [k for k in range(len(full)) if not reduced[k] and full[k] != 1]
    red = [k for k in range(len(full)) if reduced[k] and full[k] != 1]
    if math.prod(full[k] for k in kept) == 0:
        return None
    kept_sizes, kept_strides = merge_contiguous([full[k] for k in kept], [[st[k] for k in kept] for st in operand_strides])
    red_sizes, red_strides = merge_contiguous([full[k] for k in red], [[st[k] for k in red] for st in operand_strides])
    strides = tuple((tuple(k), tuple(r)) for k, r in zip(kept_strides, red_strides))
    problem = ReduceProblem(tuple(kept_sizes), tuple(red_sizes), strides, kernel.exact_fold,
                            kernel.columns_form and len(kept_sizes) == 1 and len(red_sizes) == 1
                            and strides == (((1,), (kept_sizes[0],)),))
    # A forced partials mode is checked here even where the problem has one chunk.
    forced_partials = config.switches().forced.get("reduce_partials")
    if forced_partials:
        PARTIALS_FAMILY.solver(forced_partials)
    chosen = solver.select(ctx, "reduce", problem, forced=variant)
    params = solver.tunables(ctx, "reduce", problem, chosen.name)
    for name in ("vector_unroll", "max_segment"):
        if getattr(kernel, name) is not None:
            params[name] = getattr(kernel, name)
    key = ("reduce_plan", problem, chosen.name, tuple(sorted(params.items())), forced_partials,
           tuning.generation)
    plan = ctx.plans.get(key)
    if plan is None:
        make = _make_columns_plan if chosen.name == "columns" else _make_plan
        plan = ctx.plans.put(key, make(ctx, problem, chosen.name, params))
    return plan


def _tunable(params, name, solver_name):
    try:
        return params[name]
    except KeyError:
        raise DlprimError(f"the reduce tuning rules give the {solver_name} solver no {name!r}; "
                          f"dlprim_py/tuning_db/reduce.json has a default for each") from None


def _make_plan(ctx, problem, variant, params):
    kept_sizes, red_sizes = list(problem.kept_sizes), list(problem.red_sizes)
    kept_strides = [list(k) for k, _ in problem.strides]
    red_strides = [list(r) for _, r in problem.strides]
    kept_total, red_total = math.prod(kept_sizes), math.prod(red_sizes)
    get = lambda name: _tunable(params, name, variant)  # noqa: E731
    set_chunk, unroll, tuned_group = get("set_chunk"), get("unroll"), get("group_size")
    if not 1 <= set_chunk <= LONGEST_FOLD:
        raise DlprimError(f"reduce tuning: set_chunk={set_chunk} is outside 1..{LONGEST_FOLD} "
                          f"(LONGEST_FOLD bounds the rounding of a sequential sum)")
    group_size = min(tuned_group, _pow2_floor(ctx.info.max_work_group_size))
    vector = 1
    if variant == "group":
        parallel_target = ctx.info.compute_units * (
            4 if ctx.info.is_cpu else get("all_groups_per_cu" if kept_total == 1 else "groups_per_cu"))
        widest, segment_forced = get("vector"), get("segment")
        # Vector loads: one reduced run of stride 1 in every operand, whole vectors per chunk,
        # and kept strides that keep every unit's start on a vector boundary.
        if (widest > 1 and len(red_sizes) == 1 and red_total % widest == 0
                and all(st[0] == 1 for st in red_strides)
                and all(s % widest == 0 for st in kept_strides for s in st)):
            vector = widest
            unroll = min(unroll, get("vector_unroll"))
        # A forced segment bounds the items per unit, and so the chunk (set_chunk per set).
        per_chunk = min(segment_forced or group_size, group_size) * set_chunk * unroll
        chunks = math.ceil(red_total / per_chunk)
        if kept_total * chunks < parallel_target and red_total >= 4 * per_chunk:
            # Few outputs of long reductions: cut finer so that every compute unit has a group,
            # while each item still folds at least a few elements. (Short ones are not worth
            # another launch.)
            chunks = max(chunks, min(math.ceil(parallel_target / kept_total),
                                     math.ceil(red_total / (group_size * 4))))
    else:
        item_chunk = set_chunk * unroll
        chunks = math.ceil(red_total / item_chunk)
        # About item_waves waves of resident items (2048 per GPU compute unit): with unroll loads
        # each in flight that saturates memory, and the partials pass after it stays short (it
        # walks `chunks` rows per item).
        items_target = int(ctx.info.compute_units * (4 * group_size if ctx.info.is_cpu
                                                     else 2048 * get("item_waves")))
        if kept_total * chunks < items_target and red_total >= 4 * item_chunk:
            chunks = max(chunks, min(math.ceil(items_target / kept_total),
                                     math.ceil(red_total / 16)))
    chunks = max(1, chunks)
    # An empty reduction is one chunk that folds nothing: the outputs get the identity.
    chunk_len = max(1, math.ceil(red_total / chunks))
    if vector > 1:
        chunk_len = math.ceil(chunk_len / vector) * vector
    chunks = max(1, math.ceil(red_total / chunk_len))
    segment = 1
    if variant == "group":
        # Enough items per unit that each gets about one full step of loads; short reductions
        # share a group.
        segment = segment_forced or _pow2_floor(max(1, min(group_size, chunk_len // (vector * unroll))))
        segment = min(segment, group_size)
        max_segment = get("max_segment")
        if max_segment and not segment_forced and kept_total > 1:
            segment = min(segment, _pow2_floor(max_segment))
    last_group = False
    if variant == "group" and kept_total == 1 and chunks > 1:
        # One launch where the last group to finish folds at most set_chunk partials per item
        # (the reduce_partials family's choice), else a second launch.
        partials = solver.select(ctx, "reduce_partials", PartialsProblem(chunks, group_size, set_chunk))
        last_group = partials.name == "last_group"
    strides = list(zip(kept_strides, red_strides))
    return _Plan(kept_sizes, red_sizes, strides, variant, chunks, chunk_len, unroll, segment, vector,
                 last_group, group_size, max(tuned_group, group_size))


def _make_columns_plan(ctx, problem, variant, params):
    """The columns solver's cut of R rows by C columns: about ``groups_per_cu`` work-groups per
    compute unit on a GPU (one on a CPU), each of 64 columns by a chunk of rows; no sequential
    fold longer than LONGEST_FOLD (rows per lane and set, chunks per lane of the fold)."""
    (C,), (R,) = problem.kept_sizes, problem.red_sizes
    blocks = -(-C // 64)
    per_unit = _tunable(params, "groups_per_cu", variant) if ctx.info.is_gpu else 1
    chunks = max(1, min(-(-ctx.info.compute_units * per_unit // blocks), -(-R // 64)))
    chunks = max(chunks, -(-R // (32 * LONGEST_FOLD)))
    chunk_rows = -(-R // chunks)
    chunks = -(-R // chunk_rows)
    last_group = chunks > 1 and solver.select(
        ctx, "reduce_partials", PartialsProblem(chunks, 256, LONGEST_FOLD)).name == "last_group"
    return _Plan(problem.kept_sizes, problem.red_sizes, problem.strides, variant, chunks,
                 chunk_rows, 1, 1, 4 if C % 4 == 0 else 1, last_group)


def _device_fence(ctx):
    """A device-wide fence for the last-group combine (see the template's device_fence)."""
    if ctx.info.vendor == "nvidia":
        return 'asm volatile("membar.gl;" ::: "memory");'
    return "mem_fence(CLK_GLOBAL_MEM_FENCE);"


def normalize_dims(dim, ndim, name="reduce"):
    """A sorted tuple of distinct non-negative axes from an int, a sequence or None (= all)."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
        dim = (int(dim),)
    try:
        dims = tuple(dim)
    except TypeError:
        raise ShapeError(f"{name}: dim must be an int, a sequence of ints or None, got {dim!r}") from None
    result = []
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise ShapeError(f"{name}: dim entries must be ints, got {dim!r}")
        lo = -max(ndim, 1)
        if not lo <= d < max(ndim, 1):
            raise ShapeError(f"{name}: dim {d} is out of range for a {ndim}-d tensor "
                             f"(expected {lo}..{max(ndim, 1) - 1})")
        d = int(d) % max(ndim, 1)
        if d in result:
            raise ShapeError(f"{name}: dim {d} appears more than once in {dim!r}")
        result.append(d)
    if ndim == 0:
        return ()
    return tuple(sorted(result))


# ---- the reductions ----------------------------------------------------------------------

_kernels = {}


def _kernel(key, factory):
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = factory()
    return k


def _sum_kernel(dtype=float32):
    """The sum of a floating point input into float32 (a 16-bit input's result is rounded to
    its type afterwards, ``_reduce``)."""
    key = "sum" if dtype == float32 else ("sum", dtype)
    return _kernel(key, lambda: ReduceKernel("reduce_sum", [("x", dtype)], [("y", np.float32)],
                                             "y = x;", "sum"))


def _view(t, shape):
    """The same memory with another shape, off the tape."""
    return Tensor(t.ctx, t.buffer, shape, t.dtype, offset=t.offset)


def _check_float(x, name, storage16=False):
    """DTypeError unless ``x`` is a float32 tensor, or with ``storage16`` a float16 / bfloat16
    one (read in float32, the result accumulated in float32 and rounded to its type once)."""
    if not isinstance(x, Tensor):
        raise not_a_tensor(f"{name}: input", x)
    if x.dtype != np.float32 and not (storage16 and is_floating(x.dtype)):
        if storage16:
            raise DTypeError(f"{name}: only float32, float16 and bfloat16 tensors are "
                             f"supported, got {dtype_name(x.dtype)}")
        raise DTypeError(f"{name}: only float32 tensors are supported, got {dtype_name(x.dtype)}")


_shape_memo = {}


def _shapes(x, dim, keepdim, name):
    """(axes, kept-dims shape, result shape) of reducing ``x`` over ``dim``; an empty ``dim``
    means every dimension, as in torch. Memoized (a bad ``dim`` raises and is not kept)."""
    try:
        # Types are in the key: True == 1 and 1.0 == 1 must not find the shapes of dim=1.
        if dim is None or type(dim) is int:
            key = (x.shape, dim, bool(keepdim), name)
        else:
            dims = tuple(dim)
            key = (x.shape, dims, tuple(type(d) for d in dims), bool(keepdim), name)
        return _shape_memo[key]
    except (KeyError, TypeError):
        pass
    result = _compute_shapes(x, dim, keepdim, name)
    if len(_shape_memo) > 4096:
        _shape_memo.clear()
    try:
        _shape_memo[key] = result
    except (TypeError, UnboundLocalError):
        pass
    return result


def _compute_shapes(x, dim, keepdim, name):
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None
    axes = normalize_dims(dim, x.ndim, name)
    keep_dims = tuple(1 if k in axes else s for k, s in enumerate(x.shape))
    result = keep_dims if keepdim else tuple(s for k, s in enumerate(x.shape) if k not in axes)
    return axes, keep_dims, result


# The reductions with a value over nothing (an empty dimension), and that value.
_EMPTY_VALUES = {"sum": 0, "norm": 0, "any": 0, "all": 1}


def _reduce(kernel, x, dim, keepdim, name, extra_inputs=(), scalars=()):
    axes, keep_dims, result = _shapes(x, dim, keepdim, name)
    if x.size == 0 and math.prod(keep_dims) != 0 and name not in _EMPTY_VALUES:
        raise ShapeError(f"{name}: cannot reduce an empty dimension of a {x.shape} tensor")
    out = Tensor.empty(x.ctx, result, kernel.outputs[0][1])
    if x.size == 0:
        out.fill_(_EMPTY_VALUES[name])
    else:
        kernel([x, *extra_inputs], [_view(out, keep_dims)], scalars)
    if is_float16_type(x.dtype) and out.dtype == float32:
        # Accumulated in float32, rounded to the input's type once (torch's result type).
        out = convert(out, x.dtype)
    return out, keep_dims


_expand_kernel = None


def expand(g, shape):
    """``g`` broadcast to ``shape`` (a new dense tensor), off the tape."""
    global _expand_kernel
    if g.dtype != float32:
        kernel = _kernel(("expand", g.dtype), lambda: PointwiseKernel(
            "expand", [("g", g.dtype)], [("y", g.dtype)], "y = g;"))
    else:
        if _expand_kernel is None:
            _expand_kernel = PointwiseKernel("expand", [("g", np.float32)], [("y", np.float32)],
                                             "y = g;")
        kernel = _expand_kernel
    out = Tensor.empty(g.ctx, shape, g.dtype)
    kernel([g], [out])
    return out


def sum_to_shape(grad, shape):
    """Sum ``grad`` over the dimensions that broadcasting expanded to reach ``grad.shape``,
    giving a dense tensor of ``shape`` (which must broadcast to ``grad.shape``). A float32
    gradient summed over its leading dimensions only (a linear layer's bias gradient) is the
    columns solver's problem."""
    shape = tuple(shape)
    if broadcast_shapes(shape, grad.shape) != grad.shape:
        raise ShapeError(f"sum_to_shape: {shape} does not broadcast to {grad.shape}")
    if is_float16_type(grad.dtype):
        # Summed in float32, rounded to the gradient's type once.
        out = Tensor.empty(grad.ctx, shape, float32)
        if grad.size == 0:
            out.fill_(0)
        elif out.size:
            _sum_kernel(grad.dtype)([grad], [out])
        return convert(out, grad.dtype)
    out = Tensor.empty(grad.ctx, shape, grad.dtype)
    if grad.size == 0:
        out.fill_(0)
        return out
    if out.size:
        _sum_kernel()([grad], [out])
    return out


class _ColumnsLaunch:
    """The columns solver's launch of a ReduceKernel for one problem: its kernels with the
    sizes bound, the chunk partials, the count of finished chunks per block (last group) or the
    fold launch. A call sets only the buffers and offsets. ``reduce_size``: what the finalize
    statement sees (the rows, or the whole reduction whose partials they are)."""

    def __init__(self, reduce_kernel, ctx, plan, aligned, reduce_size):
        self.ctx = ctx
        (C,), (R,) = plan.kept_sizes, plan.red_sizes
        chunks, blocks = plan.chunks, -(-C // 64)
        (x_name, _), (y_name, _) = reduce_kernel.inputs[0], reduce_kernel.outputs[0]
        built = program.build(ctx, "reduce_columns", {
            "name": reduce_kernel.name, "VEC": plan.vector if aligned else 1,
            "LAST_GROUP": int(plan.last_group),
            "FENCE": _device_fence(ctx) if plan.last_group else "",
            "input": x_name, "output": y_name, "identity": reduce_kernel.identity[y_name],
            "map_statement": reduce_kernel.map_statement, "fold": reduce_kernel.fold,
            "combine": reduce_kernel.combine, "finalize": reduce_kernel.finalize,
            "preamble": reduce_kernel.preamble})
        self.kernel = BoundKernel(built.kernel(f"{reduce_kernel.name}_columns", fresh=True))
        i32 = np.int32
        self.partials = Tensor.empty(ctx, (chunks, C), float32) if chunks > 1 else None
        scratch = self.partials.buffer if chunks > 1 else None
        args = [i32(R), i32(C), i32(plan.chunk_len), i32(chunks), None, None, scratch, None, None,
                np.int64(reduce_size)]
        self.done = None
        if plan.last_group:
            # Zero between launches: the last group of each block sets its count back.
            self.done = Tensor.zeros(ctx, (blocks,), np.int32)
            args.append(self.done.buffer)
        for k, value in enumerate(args):
            if k not in (4, 5, 7, 8):       # the operands: set per call
                self.kernel.set(k, value)   # (partials None: a null pointer, never read)
        self.size = ((blocks * 256, chunks), (256, 1))
        self.fold = None
        if chunks > 1 and not plan.last_group:
            self.fold = BoundKernel(built.kernel(f"{reduce_kernel.name}_columns_fold", fresh=True))
            for k, value in enumerate([i32(C), i32(chunks), scratch, None, None,
                                       np.int64(reduce_size)]):
                if value is not None:
                    self.fold.set(k, value)

    def enqueue(self, inputs, outputs, scalars):
        (x,), (out,) = inputs, outputs
        kernel = self.kernel
        kernel.set(4, x.buffer)
        kernel.set(5, x.offset_elements, np.int64)
        kernel.set(7, out.buffer)
        kernel.set(8, out.offset_elements, np.int64)
        buffers = None
        if current() is not None:
            # What a recording needs to replay this launch on other buffers.
            buffers = [(4, x.buffer), (7, out.buffer)] + \
                ([(6, self.partials.buffer)] if self.partials is not None else []) + \
                ([(10, self.done.buffer)] if self.done is not None else [])
        kernel.enqueue(self.ctx.queue, *self.size, buffers)
        if self.fold is not None:
            fold = self.fold
            fold.set(3, out.buffer)
            fold.set(4, out.offset_elements, np.int64)
            fold.enqueue(self.ctx.queue, (self.size[0][0],), (256,),
                         [(2, self.partials.buffer), (3, out.buffer)] if buffers else None)


# The dtypes whose sum is int64, as torch's (bool counts its True elements).
_INTEGER_SUMS = (np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.int64))


def _integer_sum_kernel(dtype):
    return _kernel(("sum", dtype), lambda: ReduceKernel(
        f"reduce_sum_{dtype.name}", [("x", dtype)], [("y", np.int64)], "y = (long)x;", "sum"))


def sum(x, dim=None, keepdim=False):  # noqa: A001 - torch's name
    """torch.sum: ``x`` summed over ``dim`` (int, ints, or None for all): float32 to float32,
    with its gradient; bool, int32 and int64 to int64 (a mask's count of True elements)."""
    if isinstance(x, Tensor) and x.dtype in _INTEGER_SUMS:
        return _reduce(_integer_sum_kernel(x.dtype), x, dim, keepdim, "sum")[0]
    if isinstance(x, Tensor) and not is_floating(x.dtype):
        raise DTypeError(f"sum: float32, float16, bfloat16, bool, int32 and int64 tensors are "
                         f"supported, got {dtype_name(x.dtype)}")
    _check_float(x, "sum", storage16=True)
    out, keep_dims = _reduce(_sum_kernel(x.dtype), x, dim, keepdim, "sum")
    shape = x.shape
    return autograd.record(out, (x,), lambda g: (expand(_view(g, keep_dims), shape),), "sum")


def mean(x, dim=None, keepdim=False):
    """torch.mean over ``dim``; NaN for an empty reduction."""
    _check_float(x, "mean", storage16=True)
    dtype = x.dtype
    kernel = _kernel("mean" if dtype == float32 else ("mean", dtype), lambda: ReduceKernel(
        "reduce_mean", [("x", dtype)], [("y", np.float32)], "y = x;", "sum",
        finalize="acc_y = acc_y / (float)reduce_size;"))
    axes, keep_dims, _ = _shapes(x, dim, keepdim, "mean")
    count = math.prod(x.shape[k] for k in axes)
    if count == 0:
        out = Tensor.full(x.ctx, _shapes(x, dim, keepdim, "mean")[2], np.nan, dtype)
    else:
        out, keep_dims = _reduce(kernel, x, dim, keepdim, "mean")
    shape = x.shape

    def backward(g):
        return (expand(_view(binary("mul", g, 1.0 / max(count, 1)), keep_dims), shape),)

    return autograd.record(out, (x,), backward, "mean")


# any and all: the elements' truth values (nonzero, NaN included) folded by | or &.
_TRUTH_FOLDS = {"any": ("acc_y = acc_y | y;", "0"), "all": ("acc_y = acc_y & y;", "1")}
_TRUTH_DTYPES = (np.dtype(np.bool_), np.dtype(np.int32), np.dtype(np.int64),
                 np.dtype(np.float32), np.dtype(np.float16), as_dtype("bfloat16"))


def _truth_reduce(x, dim, keepdim, kind):
    if not isinstance(x, Tensor):
        raise not_a_tensor(f"{kind}: input", x)
    if x.dtype not in _TRUTH_DTYPES:
        raise DTypeError(f"{kind}: unsupported dtype {dtype_name(x.dtype)}")
    combine, identity = _TRUTH_FOLDS[kind]
    # A 16-bit input is a float in the kernel (no cl_khr_fp16 needed).
    zero = "float" if is_float16_type(x.dtype) else cl_name(x.dtype)
    kernel = _kernel((kind, x.dtype), lambda: ReduceKernel(
        f"reduce_{kind}_{template_type(x.dtype)}", [("x", x.dtype)], [("y", bool_)],
        f"y = (x != ({zero})0);", combine, {"y": identity}))
    return _reduce(kernel, x, dim, keepdim, kind)[0]


# any_ and all_: functional exports them as any and all (here they would hide the builtins
# this module uses).
def any_(x, dim=None, keepdim=False):
    """torch.any: a bool tensor, True where some element of ``x`` over ``dim`` (int, ints, or
    None for all) is nonzero (NaN included); False over nothing. No gradient."""
    return _truth_reduce(x, dim, keepdim, "any")


def all_(x, dim=None, keepdim=False):
    """torch.all: a bool tensor, True where every element of ``x`` over ``dim`` (int, ints, or
    None for all) is nonzero (NaN included); True over nothing. No gradient."""
    return _truth_reduce(x, dim, keepdim, "all")


def _extremum_kernel(kind, dtype=float32):
    # The extreme of 16-bit values is one of them: float32's result converts back exactly.
    return _kernel(kind if dtype == float32 else (kind, dtype), lambda: ReduceKernel(
        f"reduce_{kind}", [("x", dtype)], [("y", np.float32)], "y = x;", kind))


def _extremum_backward(x, out, keep_dims, g):
    """torch's gradient of amax/amin: shared evenly among the elements equal to the result
    (``x``, ``out``, ``g`` of one floating point type, the gradient of that type)."""
    dt = x.dtype
    suffix = "" if dt == float32 else f"_{dtype_name(dt)}"
    count_kernel = _kernel("count_equal" + suffix, lambda: ReduceKernel(
        "reduce_count_equal", [("x", dt), ("m", dt)], [("n", np.float32)],
        "n = (x == m) ? 1.0f : 0.0f;", "sum"))
    spread_kernel = _kernel("spread_equal" + suffix, lambda: PointwiseKernel(
        "spread_equal", [("x", dt), ("m", dt), ("g", dt), ("n", np.float32)],
        [("dx", dt)], "dx = (x == m) ? g / n : 0.0f;"))
    m = _view(out, keep_dims)
    n = Tensor.empty(x.ctx, keep_dims)
    count_kernel([x, m], [n])
    dx = Tensor.empty(x.ctx, x.shape, dt)
    spread_kernel([x, m, _view(g, keep_dims), n], [dx])
    return dx


def amax(x, dim=None, keepdim=False):
    """torch.amax over ``dim`` (None or () for all); NaN propagates."""
    return _extremum(x, dim, keepdim, "max")


def amin(x, dim=None, keepdim=False):
    """torch.amin over ``dim`` (None or () for all); NaN propagates."""
    return _extremum(x, dim, keepdim, "min")


def _extremum(x, dim, keepdim, kind):
    name = "a" + kind
    _check_float(x, name, storage16=True)
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        dim = None
    out, keep_dims = _reduce(_extremum_kernel(kind, x.dtype), x, dim, keepdim, name)
    # Detached views: the closure must not hold out, whose grad_fn holds the closure.
    source, result = x.detach(), out.detach()
    return autograd.record(out, (x,), lambda g: (_extremum_backward(source, result, keep_dims, g),),
                           name)


# Ties go to the lowest index and NaN counts as the extreme (torch's rule); `take` decides
# whether the value v at index i replaces the accumulated (acc_v, acc_i).
_ARG_COMBINE = """
    bool take = (v != v) ? (acc_v == acc_v || i < acc_i)
                         : (acc_v == acc_v && (v {cmp} acc_v || (v == acc_v && i < acc_i)));
    if (take) {{ acc_v = v; acc_i = i; }}
"""


# Folding elements in increasing index order, a later element wins only when strictly more
# extreme, or as the first NaN, or as the first of all (a row of infinities): "not {le} acc"
# holds when v is more extreme or either is NaN, and a NaN accumulator keeps its place. Bitwise
# operators and selects, no branches. The index accumulator is the kernel's index type (32-bit
# where indices fit), int64 only when written.
_ARG_FOLD = """
    const bool take = (!(v {le} acc_v) & (acc_v == acc_v)) | (acc_i == INDEX_MAX);
    acc_v = take ? v : acc_v;
    acc_i = take ? i : acc_i;
"""
def _arg_kernel(kind):
    # Its sets per item and items per output are the exact_fold rule's (tuning_db/reduce.json).
    cmp, le, ident = (">", "<=", "-INFINITY") if kind == "argmax" else ("<", ">=", "INFINITY")
    return _kernel(kind, lambda: ReduceKernel(
        f"reduce_{kind}", [("x", np.float32)], [("v", np.float32), ("i", np.int64)],
        "v = x; i = ridx;", _ARG_COMBINE.format(cmp=cmp), {"v": ident, "i": "INDEX_MAX"},
        fold=_ARG_FOLD.format(le=le), index_accumulators=("i",), exact_fold=True))


def argmax(x, dim=None, keepdim=False):
    """torch.argmax: int64 index of the largest element along ``dim`` (an int), or of the
    flattened tensor when ``dim`` is None (then keepdim gives all-ones dims)."""
    return _arg(x, dim, keepdim, "argmax")


def argmin(x, dim=None, keepdim=False):
    """torch.argmin, like ``argmax``."""
    return _arg(x, dim, keepdim, "argmin")


def _arg(x, dim, keepdim, name):
    _check_float(x, name)
    if dim is not None and not (isinstance(dim, (int, np.integer)) and not isinstance(dim, bool)):
        raise ShapeError(f"{name}: dim must be an int or None, got {dim!r}")
    axes, keep_dims, result = _shapes(x, dim, keepdim, name)
    # torch refuses only an empty reduction; an empty result of non-empty rows is fine.
    if math.prod(x.shape[k] for k in axes) == 0:
        raise ShapeError(f"{name}: cannot take {name} over an empty dimension of a {x.shape} "
                         f"tensor (dim={dim!r})")
    index = Tensor.empty(x.ctx, result, np.int64)
    if index.size == 0:
        return index
    values = Tensor.empty(x.ctx, keep_dims)
    _arg_kernel(name)([x], [values, _view(index, keep_dims)])
    return index


def norm(x, p="fro", dim=None, keepdim=False):
    """torch.norm / torch.linalg.vector_norm: the p-norm over ``dim`` for p in "fro" (= 2),
    any finite p (a negative one: ``(sum |x|^p)^(1/p)``, 0 where an element is 0), inf, -inf
    or 0 (the count of non-zeros). Over an empty dimension the norms of negative order and
    -inf have no identity and are refused, as torch's."""
    _check_float(x, "norm")
    if p == "fro":
        p = 2.0
    if isinstance(p, str) or not isinstance(p, (int, float, np.number)) or isinstance(p, bool):
        raise UnsupportedError(f"norm: p must be 'fro' or a number, got {p!r}")
    p = float(p)
    if math.isnan(p):
        raise UnsupportedError(f"norm: p must be a number, got {p}")
    if p == math.inf or p == -math.inf:
        kind = "max" if p > 0 else "min"
        kernel = _kernel(f"norm_{kind}", lambda: ReduceKernel(
            f"reduce_norm_{kind}", [("x", np.float32)], [("y", np.float32)], "y = fabs(x);", kind))
        scalars = ()
    elif p == 2.0:
        kernel = _kernel("norm2", lambda: ReduceKernel(
            "reduce_norm2", [("x", np.float32)], [("y", np.float32)], "y = x * x;", "sum",
            finalize="acc_y = sqrt(acc_y);"))
        scalars = ()
    elif p == 1.0:
        kernel = _kernel("norm1", lambda: ReduceKernel(
            "reduce_norm1", [("x", np.float32)], [("y", np.float32)], "y = fabs(x);", "sum"))
        scalars = ()
    elif p == 0.0:
        kernel = _kernel("norm0", lambda: ReduceKernel(
            "reduce_norm0", [("x", np.float32)], [("y", np.float32)], "y = (x != 0.0f) ? 1.0f : 0.0f;", "sum"))
        scalars = ()
    else:
        kernel = _kernel("normp", lambda: ReduceKernel(
            "reduce_normp", [("x", np.float32)], [("y", np.float32)], "y = pow(fabs(x), p);", "sum",
            finalize="acc_y = pow(acc_y, 1.0f / p);", scalars=[("p", np.float32)]))
        scalars = (p,)
    if (p < 0 or p == math.inf) and math.prod(
            x.shape[k] for k in _shapes(x, dim, keepdim, "norm")[0]) == 0:
        raise ShapeError(f"norm: the {p} norm over an empty dimension of a {x.shape} tensor "
                         f"(dim={dim!r}) has no identity")
    out, keep_dims = _reduce(kernel, x, dim, keepdim, "norm", scalars=scalars)
    # Detached views: the closure must not hold out, whose grad_fn holds the closure.
    source, result = x.detach(), out.detach()

    def backward(g):
        if p == 0.0:
            return (Tensor.zeros(g.ctx, source.shape),)
        if p in (math.inf, -math.inf):
            # Like amax of |x|: the gradient is shared among the extreme elements, signed.
            absx = Tensor.empty(source.ctx, source.shape)
            _abs_kernel()([source], [absx])
            spread = _extremum_backward(absx, result, keep_dims, g)
            dx = Tensor.empty(source.ctx, source.shape)
            _kernel("sign_mul", lambda: PointwiseKernel(
                "sign_mul", [("x", np.float32), ("s", np.float32)], [("dx", np.float32)],
                "dx = (x > 0.0f) ? s : ((x < 0.0f) ? -s : 0.0f);"))([source, spread], [dx])
            return (dx,)
        dx = Tensor.empty(source.ctx, source.shape)
        # d||x||_p / dx = sign(x) |x|^(p-1) / ||x||^(p-1); 0 where the norm is 0 (torch's choice).
        _kernel("normp_backward", lambda: PointwiseKernel(
            "normp_backward", [("x", np.float32), ("n", np.float32), ("g", np.float32)],
            [("dx", np.float32)],
            "float s = (x > 0.0f) ? 1.0f : ((x < 0.0f) ? -1.0f : 0.0f);"
            "if (p == 1.0f) dx = s * g;"
            "else if (n == 0.0f) dx = 0.0f;"
            "else if (p == 2.0f) dx = x / n * g;"
            "else dx = s * pow(fabs(x) / n, p - 1.0f) * g;",
            scalars=[("p", np.float32)]))([source, _view(result, keep_dims), _view(g, keep_dims)], [dx], [p])
        return (dx,)

    return autograd.record(out, (x,), backward, "norm")


def _abs_kernel():
    return _kernel("abs", lambda: PointwiseKernel("abs_value", [("x", np.float32)], [("y", np.float32)],
                                                  "y = fabs(x);"))
