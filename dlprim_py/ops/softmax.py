"""softmax and log_softmax over any dimension, forward and backward (kernels/softmax.cl.mako).

The input is seen as (outer, size, inner) around the softmax dimension. Two solvers of the
"softmax" family (``dlprim_py.solver``), chosen when a plan is built by the rules of
``tuning_db/softmax.json``:

* ``row``: a work-group per row, items striding along it; rows up to ``group_size * 32`` keep
  their elements in registers between the max and the sum (one read of the input), longer ones
  stream twice with an online (max, sum) pass. Chosen when the dimension is the innermost.
* ``column``: a work item per row, coalesced across neighbouring rows when inner > 1.

``DLPRIM_SOFTMAX_ALGO`` or ``variant=`` forces one; ``cached=0`` forces streaming. The row
solver loads and stores float4 when the rows are whole vectors and aligned (its tuning value
``vector``; on float16 / bfloat16 storage four 16-bit values per access, converted to float4,
and a scalar fallback for odd rows or offsets); then
forward rows held in registers take about 16 elements per item, so short rows share a
work-group. The backward holds y and dy in registers for rows up to ``group_size * 16``, dy
alone (reading y twice, the second time from L2) up to ``group_size * 32``.

On NVIDIA, rows that fill a 1024-item group take the options measured fastest on an H200
(``_choices``): reductions by warp shuffles, asynchronous copies of the next row into local
memory, cache hints (inline PTX, kernels/memory_access.cl.mako).
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, logcmd, program, solver, tuning
from ..context import check_same_context
from ..dtypes import as_dtype, float32, is_float16_type, name as dtype_name
from ..errors import DTypeError, DlprimError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor
from ..launch import BoundKernel
from .pointwise import is_floating, template_type

_CACHE_STEPS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class SoftmaxProblem:
    """A softmax over ``size`` elements ``inner`` apart (the input seen as (outer, size,
    inner)); ``aligned``: every operand's offset allows vector accesses."""
    size: int
    inner: int
    aligned: bool = True

    def key(self):
        return f"softmax-s{self.size}-i{self.inner}-a{int(self.aligned)}"

    def features(self):
        return {"size": self.size, "inner": self.inner, "aligned": int(self.aligned)}


class RowSolver(solver.Solver):
    """A work-group per row, items striding along it."""
    name = "row"


class ColumnSolver(solver.Solver):
    """A work item per row, coalesced across neighbouring rows when inner > 1."""
    name = "column"


FAMILY = solver.register(solver.Family("softmax", (RowSolver(), ColumnSolver()),
                                       title="softmax variant"))
VARIANTS = tuple(FAMILY.solvers)


def choose_variant(inner, variant=None, *, ctx=None, size=1):
    """The solver's name for a softmax whose reduced dim (of ``size``) has ``inner`` elements
    after it: ``variant`` if given, else DLPRIM_SOFTMAX_ALGO, else the tuning rules of ``ctx``'s
    device (default: this thread's default context): "row" for the last dim, "column"
    otherwise."""
    if ctx is None:
        from ..context import default_context
        ctx = default_context()
    return solver.select(ctx, "softmax", SoftmaxProblem(size, inner), forced=variant).name


class SoftmaxPlan:
    """The kernels for one (solver, log, group size, cached, index width): both directions."""

    def __init__(self, ctx, log, size, inner, total, variant=None, cached=None, aligned=True,
                 options=None, dtype=float32):
        """``variant`` forces a solver; ``options`` (for measurements and tests) overrides the
        device's choices (``_choices``). ``dtype``: the tensors' type; float16 and bfloat16
        are storage (computed in float32), with the float32 plan's vector width (4 elements,
        8 bytes, per access where the rows and offsets allow it) but no prefetch and no cache
        hints (inline PTX moving float4)."""
        problem = SoftmaxProblem(size, inner, bool(aligned))
        variant = solver.select(ctx, "softmax", problem, forced=variant).name
        widest = solver.tunables(ctx, "softmax", problem, variant).get("vector", 1)
        storage16 = is_float16_type(dtype)
        if storage16:
            given = {k: v for k, v in (options or {}).items()
                     if k in ("prefetch", "hints", "backward_hints") and v}
            if given:
                raise UnsupportedError(f"softmax: {sorted(given)} are for float32 (16-bit "
                                       f"storage has no prefetch or cache hints)")
            options = {**(options or {}), "prefetch": 0, "hints": None, "backward_hints": None}
        if widest not in (1, 2, 4):
            raise DlprimError(f"softmax tuning: vector must be 1, 2 or 4 (a divisor of "
                              f"ALIGNMENT), got {widest!r}")
        cached_given = cached
        limit = ctx.info.max_work_group_size
        group_size = 1024 if size >= 4096 and limit >= 1024 and not ctx.info.is_cpu else 256
        group_size = min(group_size, 1 << (limit.bit_length() - 1))
        if variant == "column":
            cached = 0
        elif cached is None:
            need = math.ceil(size / group_size)
            cached = next((c for c in _CACHE_STEPS if c >= need), 0)
        elif cached not in (0,) + _CACHE_STEPS or cached * group_size < size and cached:
            raise UnsupportedError(f"softmax: cached={cached} cannot hold a row of {size} "
                                   f"with {group_size} items")
        # 16-byte loads and stores along the row (forward; 8 bytes on 16-bit storage): whole
        # vectors per row, aligned.
        vector = widest if (variant == "row" and inner == 1 and size % widest == 0 and aligned
                            and widest > 1) else 1
        row_items = group_size
        if vector > 1 and cached and cached_given is None:
            # Short rows share a group: about 16 elements per item, at least 32 items per row.
            row_items = min(group_size, max(32, 1 << max(0, math.ceil(size / 16) - 1).bit_length()))
            need = math.ceil(size / row_items)
            cached = next(c for c in _CACHE_STEPS if c >= need)
        if vector > 1 and 0 < cached < vector:
            cached = vector
        # The backward holds a row per group: one or two values per element (y and dy, or dy
        # alone, reading y twice). Two values beyond 16 per item would spill registers (a
        # 1024-item group leaves 64 registers per item on NVIDIA), one beyond 32 too.
        backward_vector = vector
        need = math.ceil(size / group_size) if variant == "row" else 0
        cached_backward = next((c for c in _CACHE_STEPS if c >= max(need, backward_vector)), 0)
        if variant != "row" or cached_given == 0:
            cached_backward = 0
        backward_hold = "both"
        if cached_backward > 16 and backward_vector > 1:
            backward_hold = "dy"
        elif cached_backward > 16:
            cached_backward = 0   # the scalar kernel holds both values: it streams instead
        choice = _choices(ctx, variant, vector, cached, row_items, group_size, backward_hold, options)
        prefetch = choice["prefetch"]
        self.variant, self.group_size, self.cached = variant, group_size, cached
        self.index_t = "int" if total + group_size * max(cached, 1) * max(inner, 1) < 2 ** 31 - 1 else "long"
        self.vector, self.row_items = vector, row_items
        params = dict(variant=variant, log=bool(log), group_size=group_size, cached=cached,
                      cached_backward=cached_backward, vector=vector, row_items=row_items,
                      index_t=self.index_t, backward_vector=backward_vector,
                      reduce=choice["reduce"], backward_hold=choice["backward_hold"],
                      prefetch=prefetch, async_ptx=ctx.info.vendor == "nvidia" and prefetch > 0,
                      recompute=bool(choice["recompute"]) and not log,
                      hints=choice["hints"], backward_hints=choice["backward_hints"])
        if storage16:
            params["dtype"] = template_type(dtype)
        self.params = params
        self.groups_per_unit = choice["groups_per_unit"]
        built = program.build(ctx, "softmax", params)
        # Own kernel objects whose arguments are set only when they changed (setting a scalar
        # argument costs tens of microseconds on some drivers).
        self.forward_kernel = BoundKernel(built.kernel("softmax_forward", fresh=True))
        self.backward_kernel = BoundKernel(built.kernel("softmax_backward", fresh=True))
        self.ctx = ctx

    def _launch(self, kernel, rows, size, inner, *buffers):
        index = np.int32 if self.index_t == "int" else np.int64
        for slot, value in enumerate((rows, size, inner)):
            kernel.set(slot, value, index)
        for k, t in enumerate(buffers):
            kernel.set(3 + 2 * k, t.buffer)
            kernel.set(4 + 2 * k, t.offset_elements, index)
        info = self.ctx.info
        cap = info.compute_units * self.groups_per_unit
        if self.variant == "row":
            per_group = self.group_size // self.row_items if kernel is self.forward_kernel else 1
            groups = min(math.ceil(rows / per_group), cap)
        else:
            groups = min(math.ceil(rows / self.group_size), cap)
        kernel.enqueue(self.ctx.queue, (groups * self.group_size,), (self.group_size,))

    def forward(self, x, y, outer, size, inner):
        self._launch(self.forward_kernel, outer * inner, size, inner, x, y)

    def backward(self, y, dy, dx, outer, size, inner):
        self._launch(self.backward_kernel, outer * inner, size, inner, y, dy, dx)


def _choices(ctx, variant, vector, cached, row_items, group_size, backward_hold, options):
    """The kernel options for the device, overridden by ``options``; UnsupportedError for a
    combination the kernels do not have. Keys: the template parameters "reduce", "hints",
    "backward_hints", "backward_hold", "prefetch" and "recompute" (kernels/softmax.cl.mako),
    and "groups_per_unit" (the launch's cap: work-groups per compute unit, looping over rows)."""
    nvidia = ctx.info.vendor == "nvidia"
    features = {"variant": variant, "vector": vector, "cached": int(cached or 0),
                "row_items": row_items, "group_size": group_size,
                "gpu": int(ctx.info.is_gpu), "cpu": int(ctx.info.is_cpu)}
    choice = tuning.merged_params(ctx.info, "softmax_kernel", features)
    choice["backward_hold"] = backward_hold
    for key in ("hints", "backward_hints"):
        if choice.get(key) is not None:
            choice[key] = tuple(choice[key])
    unknown = set(options or {}) - set(choice)
    if unknown:
        raise UnsupportedError(f"softmax: unknown options {sorted(unknown)}; known: {sorted(choice)}")
    choice.update(options or {})
    if choice["reduce"] not in ("tree", "warp"):
        raise UnsupportedError(f"softmax: reduce must be 'tree' or 'warp', got {choice['reduce']!r}")
    if choice["reduce"] == "warp" and not (variant == "row" and row_items >= 32):
        raise UnsupportedError("softmax: warp reductions need the row variant with rows of at "
                               "least 32 items")
    if not nvidia and (choice["reduce"] == "warp" or choice["hints"] or choice["backward_hints"]):
        raise UnsupportedError("softmax: warp reductions and cache hints are inline PTX, for "
                               f"NVIDIA devices only (this is {ctx.info.vendor})")
    prefetch = choice["prefetch"]
    if prefetch and not (vector > 1 and cached and row_items == group_size and variant == "row"
                         and 0 < prefetch <= cached // vector):
        raise UnsupportedError(f"softmax: prefetch={prefetch} needs the row variant with vector "
                               f"accesses, one row per work-group and at most "
                               f"{cached // max(vector, 1)} vectors per item")
    local_bytes = prefetch * group_size * 16 + 8 * group_size
    if prefetch and local_bytes > ctx.info.local_mem_size:
        raise UnsupportedError(f"softmax: prefetch={prefetch} needs {local_bytes} bytes of local "
                               f"memory, the device has {ctx.info.local_mem_size}")
    if choice["backward_hold"] not in ("both", "dy"):
        raise UnsupportedError(f"softmax: backward_hold must be 'both' or 'dy', got "
                               f"{choice['backward_hold']!r}")
    if not (isinstance(choice["groups_per_unit"], int) and choice["groups_per_unit"] >= 1):
        raise UnsupportedError(f"softmax: groups_per_unit must be a positive int, got "
                               f"{choice['groups_per_unit']!r}")
    return choice


def _geometry(x, dim, name):
    if not isinstance(x, Tensor):
        raise not_a_tensor(f"{name}: input", x)
    if not is_floating(x.dtype):
        raise DTypeError(f"{name}: only float32, float16 and bfloat16 are supported, got "
                         f"{dtype_name(x.dtype)}")
    if dim is None:
        raise ShapeError(f"{name}: dim is required (an int)")
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise ShapeError(f"{name}: dim must be an int, got {dim!r}")
    ndim = max(x.ndim, 1)
    if not -ndim <= dim < ndim:
        raise ShapeError(f"{name}: dim {dim} is out of range for a {x.ndim}-d tensor "
                         f"(expected {-ndim}..{ndim - 1})")
    shape = x.shape or (1,)
    dim %= ndim
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def _plan(ctx, log, size, inner, total, variant, cached, aligned=True, dtype=float32):
    # The forced solver and the tuning databases' generation: the plan's solver and vector
    # width follow from them.
    key = ("softmax_plan", log, variant, cached, size, inner, total >= 2 ** 30, aligned,
           config.switches().forced.get("softmax"), tuning.generation, dtype)
    plan = ctx.plans.get(key)
    if plan is None:
        plan = ctx.plans.put(key, SoftmaxPlan(ctx, log, size, inner, total, variant, cached,
                                              aligned, dtype=dtype))
    return plan


# Tensors whose offsets are a multiple of this many elements are "aligned": the widest vector
# a tuning rule may give the row solver (16 bytes of float32).
ALIGNMENT = 4


def _aligned(*tensors):
    """Whether every tensor's offset allows vector accesses (of up to ALIGNMENT elements)."""
    return all(t.offset_elements % ALIGNMENT == 0 for t in tensors)


def _log_softmax_call(outer, size, inner, log, forward):
    """The ``dlprim-driver softmax`` command of this call (DLPRIM_LOG_CMD=1): (outer, size,
    inner) as N, C, H of MIOpen's channel mode, which reduces over C for each (n, h)."""
    if not config.log_cmd():
        return
    logcmd.log_command("softmax", {"n": outer, "c": size, "H": inner, "W": 1,
                                   "a": 2 if log else 1, "m": 1, "F": int(forward)})


def _softmax(x, dim, log, variant, cached, name):
    outer, size, inner = _geometry(x, dim, name)
    dtype = x.dtype
    y = Tensor.empty(x.ctx, x.shape, dtype)
    if x.size == 0:
        return y
    plan = _plan(x.ctx, log, size, inner, x.size, variant, cached, _aligned(x), dtype)
    _log_softmax_call(outer, size, inner, log, True)
    plan.forward(x, y, outer, size, inner)
    saved = y.detach()

    def backward(g):
        if g.dtype != dtype:
            # The kernels read dy as y's type (a gradient given in another type).
            from .pointwise import convert
            g = convert(g, dtype)
        dx = Tensor.empty(g.ctx, g.shape, dtype)
        _log_softmax_call(outer, size, inner, log, False)
        # y and dx start at offset 0; a gradient at an unaligned offset takes the plan
        # without vector accesses.
        backward_plan = plan if _aligned(g) else _plan(g.ctx, log, size, inner, g.size, variant,
                                                       cached, False, dtype)
        backward_plan.backward(saved, g, dx, outer, size, inner)
        return (dx,)

    return autograd.record(y, (x,), backward, name)


def _cast_to_result_dtype(x, dtype, name):
    """torch's ``dtype`` argument: the input cast to it first (with its gradient), a floating
    point type (float32, float16, bfloat16)."""
    if dtype is None:
        return x
    try:
        dt = as_dtype(dtype)
    except DTypeError:
        dt = None
    if dt is None or not is_floating(dt):
        raise DTypeError(f"{name}: dtype must be float32, float16, bfloat16 (or None), got "
                         f"{dtype!r}")
    if isinstance(x, Tensor) and is_floating(x.dtype) and x.dtype != dt:
        from .masks import cast
        return cast(x, dt)
    return x


def softmax(x, dim=None, *, dtype=None, variant=None, cached=None):
    """torch.nn.functional.softmax over ``dim``: float32, float16 or bfloat16 in, the same
    type and shape out, max-subtracted; 16-bit inputs are computed in float32 and rounded once.
    ``dtype``: None or a floating point type the input is cast to first (as torch's)."""
    x = _cast_to_result_dtype(x, dtype, "softmax")
    return _softmax(x, dim, False, variant, cached, "softmax")


def log_softmax(x, dim=None, *, dtype=None, variant=None, cached=None):
    """torch.nn.functional.log_softmax over ``dim``: x - max - log(sum(exp(x - max))), with
    ``softmax``'s types. ``dtype``: None or a floating point type the input is cast to first."""
    x = _cast_to_result_dtype(x, dtype, "log_softmax")
    return _softmax(x, dim, True, variant, cached, "log_softmax")


def softmax_backward(y, dy, dim, log=False, dx=None):
    """The backward on given tensors: dx from the forward's output ``y`` and its gradient ``dy``
    (one shape and floating point type: float32, float16 or bfloat16); writes into ``dx`` when
    given. Returns dx."""
    outer, size, inner = _geometry(y, dim, "softmax_backward")
    check_same_context(y, dy, dx)
    for t, what in ((dy, "dy"), (dx, "dx")):
        if t is not None and (t.shape != y.shape or t.dtype != y.dtype):
            raise ShapeError(f"softmax_backward: {what} must be {dtype_name(y.dtype)} of shape "
                             f"{y.shape}, got {dtype_name(t.dtype)} {t.shape}")
    dx = dx if dx is not None else Tensor.empty(y.ctx, y.shape, y.dtype)
    _log_softmax_call(outer, size, inner, log, False)
    if y.size:
        _plan(y.ctx, log, size, inner, y.size, None, None, _aligned(y, dy, dx), y.dtype).backward(
            y, dy, dx, outer, size, inner)
    return dx
