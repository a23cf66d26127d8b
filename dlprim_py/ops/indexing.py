"""Indexing and selection with torch's semantics, forward and backward: ``gather``,
``scatter``, ``scatter_add``, ``index_select``, ``index_add``, ``where``, ``masked_fill``,
``isnan`` / ``isinf`` / ``isneginf`` / ``isposinf`` / ``isfinite``, ``isin``,
``count_nonzero``, ``tril`` / ``triu``, the factories ``arange`` / ``linspace``, ``embedding``,
``embedding_bag`` and ``one_hot`` (kernels/indexing.cl.mako; the elementwise ones over the
pointwise generator).

Indices are int64 tensors, as torch's (``index_select`` and ``embedding`` also take int32,
converted). An index outside its dimension is never used for an access: the kernels skip it,
and the context raises ShapeError naming it at its next synchronizing call (``Tensor.numpy()``,
``Context.synchronize()``), as a device-side assert reaches the host at the next
synchronization; the call itself does not wait.

Sums over duplicate indices are deterministic: ``scatter_add`` (and ``gather``'s backward) sum
each output element's contributions in index order, one work item per output element;
``index_add`` (and the backwards of ``index_select``, ``embedding`` and ``embedding_bag``) have
two solvers, the "index_add" family: "loop" (the same per-output loop, O(D * L) work) and
"sorted" (the index sorted stably with ``dlprim_py.ops.scan.sort``, then each run of equal
indices summed in position order by one work item: O(L log^2 L)); ``DLPRIM_INDEX_ADD_ALGO``
forces one. Repeated calls on seen shapes build nothing: kernels are kept in the context's
plan cache, one compile per kernel, element type and index width.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, program, solver, tuning
from ..context import check_same_context, default_context, Context
from ..dtypes import as_dtype, bool_, cl_name, float16, float32, int32, int64
from ..errors import DeviceError, DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import bind, run_planned_on
from ..tensor import Tensor, _checked
from . import masks, reduce, tensor_ops
from .arithmetic import reduce_to_shape
from .pointwise import PointwiseKernel, broadcast_shapes, compute_dtype, launch_size, template_type

_INT32_LIMIT = 2 ** 31 - 1
_SCALAR_TYPES = {float32: np.float32, float16: np.float16, int32: np.int32, int64: np.int64,
                 bool_: np.uint8}


# ---- kernels, launches and the range flag ---------------------------------------------------

def _kernel(ctx, name, dtype, index_t):
    """The bound kernel ``name`` of kernels/indexing.cl.mako for ``dtype`` and ``index_t``,
    kept in the context's plan cache (a repeated call builds and creates nothing)."""
    key = ("indexing", name, dtype, index_t)
    kernel = ctx.plans.get(key)
    if kernel is None:
        kernel = ctx.plans.put(key, bind(program.kernel(
            ctx, "indexing", name, dict(dtype=cl_name(dtype), index_t=index_t))))
    return kernel


# (numpy type, Python int) -> the numpy scalar passed for it: the same object on every call,
# so that a bound kernel recognises an unchanged argument by identity and sets nothing.
_scalars = {}


def scalar(kind, value):
    """``kind(value)`` for an int ``value``, one object per (kind, value) (bounded)."""
    key = (kind, value)
    s = _scalars.get(key)
    if s is None:
        if len(_scalars) > 65536:
            _scalars.clear()
        s = _scalars[key] = kind(value)
    return s


def _run(ctx, name, dtype, total, extent, *args):
    """Enqueue kernel ``name`` over ``total`` items (a grid-stride loop); ``extent``: the
    largest index it computes (32-bit arithmetic below 2^31). Python ints among ``args`` are
    passed in the index type; numpy scalars and buffers as they are."""
    if total <= 0:
        return
    index_t, ix = ("int", np.int32) if extent < _INT32_LIMIT else ("long", np.int64)
    key = ("indexing_launch", total, ctx.info.compute_units)
    launch = ctx.plans.get(key)
    if launch is None:
        launch = ctx.plans.put(key, launch_size(ctx, total))
    _kernel(ctx, name, dtype, index_t)(ctx.queue, launch[0], launch[1],
                                       *[scalar(ix, a) if a.__class__ is int else a
                                         for a in args])


def range_flag(ctx):
    """The context's int64[3] flag (set, bad index, size) that the kernels write on an index
    out of range; checked at the next synchronizing call."""
    # Kept outside any recording: a plan recorded by the first indexing call would otherwise
    # zero the flag on every replay, dropping an error another call had set.
    flag = ctx.kept_tensor("index_range_flag", lambda: Tensor.zeros(ctx, (3,), int64))
    ctx.defer_check("index_range", _raise_on_flag)
    return flag.buffer


def _raise_on_flag(ctx):
    flag = ctx.memo["index_range_flag"]
    host = np.empty(3, np.int64)
    import pyopencl as cl
    cl.enqueue_copy(ctx.queue, host, flag.buffer, src_offset=flag.offset, is_blocking=True)
    if host[0]:
        flag.fill_(0)
        raise ShapeError(f"index {int(host[1])} is out of range for a dimension of size "
                         f"{int(host[2])} (expected 0..{int(host[2]) - 1}); raised at the first "
                         f"synchronizing call after the indexing call that read it")


# ---- argument checks ------------------------------------------------------------------------

def _tensor(x, what):
    if not isinstance(x, Tensor):
        raise not_a_tensor(what, x)
    return x


def _index(index, what, allow_int32=False):
    _tensor(index, what)
    if index.dtype == int32 and allow_int32:
        return masks.cast(index, int64)
    if index.dtype != int64:
        raise DTypeError(f"{what} must be an int64 tensor (dp.int64)"
                         f"{' or int32' if allow_int32 else ''}, got {index.dtype}")
    return index


def _dim(dim, ndim, what):
    return tensor_ops.normalise_dim(dim, ndim, what)


def _split(shape, dim):
    """(O, D, I) of ``shape`` around ``dim``."""
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def _fit(x, shape, dim, what, skip_dim=True):
    """``x`` narrowed (a copy, with its gradient) to ``shape`` in every dimension but ``dim``
    (and in ``dim`` too where ``skip_dim`` is False)."""
    for d, (have, want) in enumerate(zip(x.shape, shape)):
        if (d != dim or not skip_dim) and have != want:
            x = tensor_ops.narrow(x, d, 0, want)
    return x


def _as_1d(x):
    return x.reshape((1,)) if x.ndim == 0 else x


# ---- gather / scatter / scatter_add -------------------------------------------------------------

def _check_index_shape(name, input, dim, index, src=None):
    if index.ndim != input.ndim and not (index.ndim <= 1 and input.ndim <= 1):
        raise ShapeError(f"{name}: index must have as many dimensions as input ({input.ndim}), "
                         f"got {index.ndim}")
    ishape, xshape = _as_1d(index).shape, _as_1d(input).shape
    for d, (i, x) in enumerate(zip(ishape, xshape)):
        if d != dim and i > x:
            raise ShapeError(f"{name}: index {index.shape} is larger than input {input.shape} "
                             f"in dimension {d}")
    if src is not None:
        if src.ndim != index.ndim and not (src.ndim <= 1 and index.ndim <= 1):
            raise ShapeError(f"{name}: src must have as many dimensions as index "
                             f"({index.ndim}), got {src.ndim}")
        for d, (i, s) in enumerate(zip(ishape, _as_1d(src).shape)):
            if i > s:
                raise ShapeError(f"{name}: index {index.shape} is larger than src {src.shape} "
                                 f"in dimension {d}")


def _gather_into(y, x, dim, index):
    """y (index's shape, dense) = x gathered along ``dim`` (x fits index outside ``dim``)."""
    O, L, I = _split(_as_1d(index).shape, dim)
    D = _as_1d(x).shape[dim]
    ctx = x.ctx
    extent = max(O * L * I, x.offset_elements + x.size, index.offset_elements + index.size)
    if I == 1 and L % 4 == 0 and index.offset_elements % 4 == 0 and y.offset_elements % 4 == 0:
        # Along the last dimension: four outputs per item, the index and the output read and
        # written as aligned vectors (kernels/indexing.cl.mako).
        _run(ctx, "gather_last4", x.dtype, O * L // 4, extent, O * L // 4, L,
             scalar(np.int64, D), x.buffer, x.offset_elements, index.buffer,
             index.offset_elements, y.buffer, y.offset_elements, range_flag(ctx))
        return
    _run(ctx, "gather_dim", x.dtype, O * L * I, extent, O * L * I, L, I, scalar(np.int64, D),
         x.buffer, x.offset_elements, index.buffer, index.offset_elements, L * I, I, 1,
         y.buffer, y.offset_elements, range_flag(ctx))


def gather(input, dim, index, *, sparse_grad=False):
    """torch.gather: ``out[i][j][k] = input[i][index[i][j][k]][k]`` along ``dim`` (here 1).

    ``index``: int64 (or int32, as torch takes it), as many dimensions as ``input``, no larger
    than it outside ``dim``; the output has its shape. Any dtype; the gradient (float) is the
    scatter_add of the output's gradient into zeros, deterministic with duplicate indices.
    """
    key = None
    if input.__class__ is Tensor and index.__class__ is Tensor and not sparse_grad \
            and index.dtype == int64:
        # A call whose arguments match an earlier checked call's replays its launch (as
        # index_select's, below): the checks and the launch's arguments cost more host time
        # than the kernel of a small gather.
        key = ("gather", input.shape, input.dtype, input.offset, index.shape, index.dtype,
               index.offset, dim, dim.__class__)
        checked = input.ctx.plans.get(key)
        if checked is not None:
            ctx, dim, x = input.ctx, checked, input
            out = Tensor.empty(ctx, index.shape, input.dtype)
            ctx.defer_check("index_range", _raise_on_flag)
            run_planned_on(ctx, key, (x, index, out), _gather_into, None, (out, x, dim, index))
            return _gather_result(out, x, dim, index)
    _tensor(input, "gather: input")
    index = _index(index, "gather: index", allow_int32=True)
    check_same_context(input, index)
    if sparse_grad:
        raise UnsupportedError("gather: sparse_grad=True is not supported (dense gradients only)")
    dim = _dim(dim, input.ndim, "gather")
    _check_index_shape("gather", input, dim, index)
    x = _fit(input, _as_1d(index).shape, dim, "gather") if input.ndim else input
    out = Tensor.empty(input.ctx, index.shape, input.dtype)
    if index.size:
        if _as_1d(input).shape[dim] == 0:
            raise ShapeError(f"gather: index into an empty dimension {dim} of input "
                             f"{input.shape}")
        if key is not None and x is input:
            # Covered by the key (shapes, dtypes, offsets, dim): this call records the plan
            # that later calls replay, skipping the checks.
            run_planned_on(x.ctx, key, (x, index, out), _gather_into, None, (out, x, dim, index))
            input.ctx.plans.put(key, dim)
        else:
            _gather_into(out, x, dim, index)
    return _gather_result(out, x, dim, index)


def _gather_result(out, x, dim, index):
    """gather's result, with its gradient recorded where ``x`` needs one."""
    if not autograd.needs_grad(x):
        return out
    shape = x.shape
    index = index.detach()

    def backward(g):
        return (_scatter_add_new(Tensor.zeros(g.ctx, shape, g.dtype), dim, index, g),)

    return autograd.record(out, (x,), backward, "gather")


def _scatter_add_new(y, dim, index, src, alpha=1):
    """y (dense, a fresh tensor of index's shape outside ``dim``) += the scatter_add of src
    (fitted to index) along dim."""
    if not index.size:
        return y
    O, L, I = _split(_as_1d(index).shape, dim)
    D = _as_1d(y).shape[dim]
    if D == 0:
        raise ShapeError(f"scatter_add: index into an empty dimension {dim}")
    ctx = y.ctx
    total = O * D * I
    _run(ctx, "scatter_add_loop", y.dtype, total,
         max(total, y.offset_elements + y.size, src.offset_elements + src.size,
             index.offset_elements + index.size),
         total, D, I, L, src.buffer, src.offset_elements, index.buffer, index.offset_elements,
         L * I, I, 1, y.buffer, y.offset_elements, _SCALAR_TYPES[y.dtype](alpha),
         range_flag(ctx))
    return y


def _region(out, index, dim):
    """(the part of ``out`` that ``index`` covers outside ``dim``, its shape): ``out`` itself
    where the index spans it, else a copy to scatter into and write back (``_write_back``)."""
    shape = list(_as_1d(index).shape)
    shape[dim] = _as_1d(out).shape[dim]
    shape = tuple(shape)
    if shape == _as_1d(out).shape:
        return out, None
    with autograd.no_grad():
        return _fit(out.detach(), shape, dim, "scatter"), shape


def _write_back(out, region, shape):
    if shape is not None and region.size:
        tensor_ops.strided_copy(out.ctx, shape, out.dtype, region.buffer, region.offset_elements,
                                tensor_ops.dense_strides(shape), out.buffer, out.offset_elements,
                                tensor_ops.dense_strides(_as_1d(out).shape))


def _prepare_scatter(name, input, dim, index, src):
    _tensor(input, f"{name}: input")
    index = _index(index, f"{name}: index", allow_int32=True)
    dim = _dim(dim, input.ndim, name)
    if isinstance(src, Tensor):
        check_same_context(input, index, src)
        if src.dtype != input.dtype:
            raise DTypeError(f"{name}: src must have input's dtype {input.dtype}, got "
                             f"{src.dtype}")
        _check_index_shape(name, input, dim, index, src)
        src = _fit(src, _as_1d(index).shape, dim, name, skip_dim=False) if src.ndim else src
    else:
        check_same_context(input, index)
        _check_index_shape(name, input, dim, index)
    if index.size and _as_1d(input).shape[dim] == 0:
        raise ShapeError(f"{name}: index into an empty dimension {dim} of input {input.shape}")
    return index, dim, src


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """torch.scatter: a copy of ``input`` with ``out[i][index[i][j][k]][k] = src[i][j][k]``
    along ``dim`` (here 1), or ``= value`` for a number ``value`` (or a number ``src``).

    Where ``index`` names one element twice, one of the writes wins, as torch leaves it
    unspecified. ``reduce`` other than None is not supported (use scatter_add). Gradients:
    ``input``'s is the output's with the written elements zeroed; ``src``'s is the gather of
    the output's at ``index``.
    """
    if reduce is not None:
        raise UnsupportedError(f"scatter: reduce={reduce!r} is not supported; use "
                               f"scatter_add for 'add'")
    if src is None and value is None:
        raise ShapeError("scatter: give src (a tensor or a number) or value")
    if src is not None and value is not None:
        raise ShapeError("scatter: give src or value, not both")
    if src is None:
        src = value
    if not isinstance(src, Tensor) and masks.scalar_kind(src) is None:
        raise DTypeError(f"scatter: src must be a Tensor or a number, got {type(src).__name__}")
    index, dim, src_fit = _prepare_scatter("scatter", input, dim, index, src)
    out = input.clone()
    tensor_src = isinstance(src, Tensor)
    if index.size:
        O, L, I = _split(_as_1d(index).shape, dim)
        D = _as_1d(input).shape[dim]
        ctx = input.ctx
        number = _SCALAR_TYPES[input.dtype](0 if tensor_src else src)
        target, shape = _region(out, index, dim)
        source = src_fit if tensor_src else target
        _run(ctx, "scatter_dim", input.dtype, O * L * I,
             max(O * D * I, source.offset_elements + source.size,
                 index.offset_elements + index.size, target.offset_elements + target.size),
             O * L * I, L, I, scalar(np.int64, D), source.buffer,
             source.offset_elements if tensor_src else 0, number, scalar(np.int32, not tensor_src),
             index.buffer, index.offset_elements, target.buffer, target.offset_elements,
             range_flag(ctx))
        _write_back(out, target, shape)
    inputs = (input, src_fit) if tensor_src else (input,)
    if not autograd.needs_grad(*inputs):
        return out
    index = index.detach()

    def backward(g):
        grad_input = scatter(g, dim, index, 0)
        if not tensor_src:
            return (grad_input,)
        return grad_input, gather(g, dim, index)

    return autograd.record(out, inputs, backward, "scatter")


def scatter_add(input, dim, index, src):
    """torch.scatter_add: a copy of ``input`` with ``out[i][index[i][j][k]][k] +=
    src[i][j][k]`` along ``dim`` (here 1); every element's contributions are summed in index
    order, so duplicates give the same result on every run. Gradients: ``input``'s is the
    output's; ``src``'s the gather of it at ``index``."""
    if not isinstance(src, Tensor):
        raise not_a_tensor("scatter_add: src", src)
    if input.dtype == bool_ if isinstance(input, Tensor) else False:
        raise DTypeError("scatter_add: bool tensors cannot be added")
    index, dim, src_fit = _prepare_scatter("scatter_add", input, dim, index, src)
    out = input.clone()
    target, shape = _region(out, index, dim)
    _write_back(out, _scatter_add_new(target, dim, index, src_fit), shape)
    if not autograd.needs_grad(input, src_fit):
        return out
    index = index.detach()
    return autograd.record(out, (input, src_fit), lambda g: (g, gather(g, dim, index)),
                           "scatter_add")


# ---- index_select / index_add -------------------------------------------------------------------

@dataclass(frozen=True)
class IndexAddProblem:
    """An index_add of ``length`` index entries into a dimension of ``size``, ``columns``
    elements (the other dimensions) per entry."""
    length: int
    size: int
    columns: int

    def key(self):
        return f"index_add-l{self.length}-d{self.size}-c{self.columns}"

    def features(self):
        return {"length": self.length, "size": self.size, "columns": self.columns}


class LoopSolver(solver.Solver):
    """One work item per output element, summing the entries that name it in index order."""
    name = "loop"


class SortedSolver(solver.Solver):
    """The index sorted stably, then each run of equal entries summed by one work item."""
    name = "sorted"


FAMILY = solver.register(solver.Family("index_add", (SortedSolver(), LoopSolver()),
                                       title="index_add algorithm"))
INDEX_ADD_ALGORITHMS = tuple(FAMILY.solvers)


def _index_add_algorithm(ctx, L, D, I, forced):
    key = ("index_add_choice", L, D, I, forced, config.switches().forced.get("index_add"),
           tuning.generation)
    name = ctx.plans.get(key)
    if name is None:
        name = ctx.plans.put(key, solver.select(ctx, "index_add", IndexAddProblem(L, D, I),
                                                forced=forced).name)
    return name


def _index_add_into(y, dim, index, src, alpha, algorithm=None):
    """y (dense) += alpha * src (dense, y's shape with ``len(index)`` along dim) added at
    ``index`` (1-d int64) along ``dim``; deterministic."""
    L = index.size
    if not L:
        return y
    O, D, I = _split(_as_1d(y).shape, dim)
    if D == 0:
        raise ShapeError(f"index_add: index into an empty dimension {dim}")
    ctx = y.ctx
    alpha = _SCALAR_TYPES[y.dtype](alpha)
    extent = max(O * max(D, L) * I, y.offset_elements + y.size, src.offset_elements + src.size,
                 index.offset_elements + index.size)
    if _index_add_algorithm(ctx, L, D, I, algorithm) == "loop":
        _run(ctx, "scatter_add_loop", y.dtype, O * D * I, extent,
             O * D * I, D, I, L, src.buffer, src.offset_elements, index.buffer,
             index.offset_elements, 0, 1, 0, y.buffer, y.offset_elements, alpha, range_flag(ctx))
        return y
    from .scan import sort
    with autograd.no_grad():
        keys, perm = sort(index.reshape((L,)), stable=True)
    _run(ctx, "index_add_sorted", y.dtype, O * L * I, extent,
         O * L * I, L, I, scalar(np.int64, D), keys.buffer, perm.buffer, src.buffer,
         src.offset_elements, y.buffer, y.offset_elements, alpha, range_flag(ctx))
    return y


def _check_vector_index(name, index):
    if index.ndim > 1:
        raise ShapeError(f"{name}: index must be a vector (0 or 1 dimensions), got shape "
                         f"{index.shape}")


def _check_scalar_index(name, input, index):
    if input.ndim == 0 and index.size != 1:
        raise ShapeError(f"{name}: the index into a 0-d input must have exactly 1 value, got "
                         f"{index.size}")


def _select(input, dim, index, plan_key=None):
    """index_select's result (checked arguments, no gradient recorded). ``plan_key``: the
    launch goes through the plan of that key (``run_planned_on``; it must hold the shapes,
    dtypes and offsets of ``input`` and ``index``)."""
    shape = list(_as_1d(input).shape)
    D = shape[dim]
    shape[dim] = index.size
    # torch treats a 0-d input as one element along dim 0 and keeps the result 0-d
    _check_scalar_index("index_select", input, index)
    out_shape = tuple(shape) if input.ndim else ()
    out = Tensor.empty(input.ctx, out_shape, input.dtype)
    if out.size:
        if D == 0:
            raise ShapeError(f"index_select: index into an empty dimension {dim} of input "
                             f"{input.shape}")
        if plan_key is None:
            _select_into(input, dim, index, out)
        else:
            run_planned_on(input.ctx, plan_key, (input, index, out), _select_into, None,
                           (input, dim, index, out))
    return out


def _select_into(input, dim, index, out):
    """out = input's entries ``index`` along ``dim`` (one launch)."""
    shape = _as_1d(out).shape
    D = _as_1d(input).shape[dim]
    O, L, I = _split(shape, dim)
    ctx = input.ctx
    extent = max(O * max(L, D) * I, input.offset_elements + input.size,
                 index.offset_elements + index.size)
    if I % 4 == 0 and input.offset_elements % 4 == 0 and out.offset_elements % 4 == 0:
        # Rows of a multiple of 4: an aligned 4-vector per work item (kernels/indexing.cl.mako).
        _run(ctx, "select_rows4", input.dtype, O * L * I // 4, extent, O * L * I // 4, L,
             I // 4, scalar(np.int64, D), input.buffer, input.offset_elements, index.buffer,
             index.offset_elements, out.buffer, out.offset_elements, range_flag(ctx))
        return
    _run(ctx, "gather_dim", input.dtype, O * L * I, extent, O * L * I, L, I, scalar(np.int64, D),
         input.buffer, input.offset_elements, index.buffer, index.offset_elements, 0, 1, 0,
         out.buffer, out.offset_elements, range_flag(ctx))


# Repeated index_select and embedding calls: a call whose arguments match an earlier checked
# call's (the key below: shapes, dtypes, offsets, dim / padding_idx with their types) skips the
# checks and replays that call's launch, binding only the buffers that changed
# (``run_planned_on``); the range flag's check is still deferred to the next synchronization.
# The first call (and every call that the key does not cover: int32 indices, max_norm, empty
# results) takes the checked path, which records the plan.

def _select_planned(key, input, dim, index, out_shape):
    ctx = input.ctx
    out = Tensor.empty(ctx, out_shape, input.dtype)
    ctx.defer_check("index_range", _raise_on_flag)
    run_planned_on(ctx, key, (input, index, out), _select_into, None, (input, dim, index, out))
    return out


def _embedding_into(weight, index, out):
    """out (index.shape + (E,)) = the rows of weight that index (int64) names."""
    flat = _checked(index.ctx, index.buffer, (index.size,), int64, index.offset)
    rows = _checked(out.ctx, out.buffer, (index.size, weight.shape[1]), float32, out.offset)
    _select_into(weight, 0, flat, rows)


def _index_select_checked(key, input, dim, index):
    """(index_select's result, dim normalised) after every check; a call that ``key`` covers
    (int64 index, a result that is not empty) is recorded for ``_select_planned``."""
    _tensor(input, "index_select: input")
    original = index
    index = _index(index, "index_select: index", allow_int32=True)
    check_same_context(input, index)
    _check_vector_index("index_select", index)
    dim = _dim(dim, input.ndim, "index_select")
    plannable = key is not None and index is original and index.size and input.size
    out = _select(input, dim, index, key if plannable else None)
    if plannable:
        input.ctx.plans.put(key, (dim, out.shape))
    return out, dim


def index_select(input, dim, index):
    """torch.index_select: the entries ``index`` (a vector of int64 or int32) of ``input``
    along ``dim``; their gradient is added back at ``index`` (index_add, deterministic)."""
    if input.__class__ is Tensor and index.__class__ is Tensor:
        key = ("index_select", input.shape, input.dtype, input.offset, index.shape,
               index.dtype, index.offset, dim, dim.__class__)
        checked = input.ctx.plans.get(key)
        if checked is not None:
            dim = checked[0]
            out = _select_planned(key, input, dim, index, checked[1])
        else:
            out, dim = _index_select_checked(key, input, dim, index)
    else:
        out, dim = _index_select_checked(None, input, dim, index)
    if not autograd.needs_grad(input):
        return out
    in_shape = input.shape
    index = index.detach()

    def backward(g):
        grad = Tensor.zeros(g.ctx, in_shape, g.dtype)
        return (_index_add_into(grad, dim, index, g.reshape(_as_1d(g).shape), 1),)

    return autograd.record(out, (input,), backward, "index_select")


def index_add(input, dim, index, source, *, alpha=1):
    """torch.index_add: a copy of ``input`` with ``alpha * source`` added at the entries
    ``index`` (a vector, int64 or int32) along ``dim``; ``source`` has ``input``'s shape with
    ``len(index)`` along ``dim``. Duplicates are summed in index order (deterministic).
    Gradients: ``input``'s is the output's, ``source``'s ``alpha`` times its index_select."""
    _tensor(input, "index_add: input")
    _tensor(source, "index_add: source")
    index = _index(index, "index_add: index", allow_int32=True)
    check_same_context(input, index, source)
    _check_vector_index("index_add", index)
    if input.dtype == bool_:
        raise DTypeError("index_add: bool tensors cannot be added")
    if source.dtype != input.dtype:
        raise DTypeError(f"index_add: source must have input's dtype {input.dtype}, got "
                         f"{source.dtype}")
    if masks.scalar_kind(alpha) is None:
        raise DTypeError(f"index_add: alpha must be a number, got {alpha!r}")
    dim = _dim(dim, input.ndim, "index_add")
    _check_scalar_index("index_add", input, index)
    expected = list(_as_1d(input).shape)
    expected[dim] = index.size
    if _as_1d(source).shape != tuple(expected) or (source.ndim != input.ndim and input.ndim):
        raise ShapeError(f"index_add: source must have shape {tuple(expected)} (input's with "
                         f"len(index) along dim {dim}), got {source.shape}")
    out = _index_add_into(input.clone(), dim, index, source, alpha)
    if not autograd.needs_grad(input, source):
        return out
    index = index.detach()

    def backward(g):
        picked = index_select(g, dim, index)
        return g, (picked if alpha == 1 else picked * float(alpha))

    return autograd.record(out, (input, source), backward, "index_add")


# ---- where / masked_fill / the is* tests --------------------------------------------------

_pointwise = {}


def _memo(key, factory):
    kernel = _pointwise.get(key)
    if kernel is None:
        kernel = _pointwise[key] = factory()
    return kernel


def _where_kernel(a, b, out):
    """y = c ? a : b for operands of dtype ``a`` / ``b`` (None: a number, passed as ``out``'s
    scalar type). 16-bit operands are loaded into float and stored back, exactly (a value
    chosen is one of them, or a number rounded once on the store, as torch converts it): no
    cl_khr_fp16 needed."""
    def make():
        inputs = [("c", bool_)] + [(n, t) for n, t in (("a", a), ("b", b)) if t is not None]
        scalars = [(n, _SCALAR_TYPES[compute_dtype(out)]) for n, t in (("a", a), ("b", b))
                   if t is None]
        o = cl_name(compute_dtype(out))
        return PointwiseKernel(f"where_{masks._tag(a)}_{masks._tag(b)}_{template_type(out)}",
                               inputs, [("y", out)], f"y = c ? ({o})a : ({o})b;",
                               scalars=scalars)
    return _memo(("where", a, b, out), make)


def _result_dtype(name, a, b):
    """torch's dtype of where's result: two tensors promote; a number meets a tensor's dtype
    unless it is a float and the tensor is not; two numbers: float32 or int64."""
    ta, tb = isinstance(a, Tensor), isinstance(b, Tensor)
    if ta and tb:
        return masks._promote(a.dtype, b.dtype)
    if ta or tb:
        t, number = (a, b) if ta else (b, a)
        kind = masks.scalar_kind(number)
        if kind is None:
            raise masks._not_an_operand(name, number)
        if masks._KIND[t.dtype] < kind:
            return float32 if kind == 2 else int64
        return t.dtype
    kinds = [masks.scalar_kind(x) for x in (a, b)]
    if None in kinds:
        raise masks._not_an_operand(name, a if kinds[0] is None else b)
    return float32 if 2 in kinds else int64 if 1 in kinds else bool_


def where(condition, input=None, other=None):
    """torch.where(condition, input, other): ``input`` where ``condition`` (a bool tensor) is
    True, else ``other``; the three broadcast together, ``input`` / ``other`` tensors or
    numbers, the result in their promoted dtype. Gradients flow to the chosen elements (summed
    over broadcast dimensions). The one-argument form (the indices of True elements, whose
    count is only known on the device) is not supported."""
    _tensor(condition, "where: condition")
    if input is None and other is None:
        raise UnsupportedError("where(condition) (the indices of the True elements) is not "
                               "supported: its size depends on the data; use where(condition, "
                               "input, other)")
    if input is None or other is None:
        raise ShapeError("where: give both input and other")
    if condition.dtype != bool_:
        raise DTypeError(f"where: condition must be a bool tensor (dp.bool), got "
                         f"{condition.dtype}")
    dtype = _result_dtype("where", input, other)
    tensors = [condition] + [x for x in (input, other) if isinstance(x, Tensor)]
    check_same_context(*tensors)
    shape = broadcast_shapes(*[t.shape for t in tensors])
    ops = []
    for x in (input, other):
        if isinstance(x, Tensor):
            ops.append(masks.cast(x, dtype) if x.dtype != dtype else x)
    kernel = _where_kernel(*[dtype if isinstance(x, Tensor) else None for x in (input, other)],
                           dtype)
    numbers = [_SCALAR_TYPES[compute_dtype(dtype)](x) for x in (input, other)
               if not isinstance(x, Tensor)]
    out = Tensor.empty(condition.ctx, shape, dtype)
    kernel([condition, *ops], [out], numbers)
    grads = [x for x in (input, other) if isinstance(x, Tensor)]
    if not autograd.needs_grad(*grads) or masks._KIND[dtype] != 2:
        return out
    cond = condition.detach()
    shapes = [x.shape for x in grads]
    which = [x is input for x in grads]

    def backward(g):
        result = []
        for s, is_input in zip(shapes, which):
            picked = where(cond, g, 0.0) if is_input else where(cond, 0.0, g)
            result.append(reduce_to_shape(picked, s))
        return tuple(result)

    return autograd.record(out, tuple(grads), backward, "where")


def masked_fill(input, mask, value):
    """torch.masked_fill: a copy of ``input`` with ``value`` (a number or a one-element
    tensor) where ``mask`` (a bool tensor broadcasting to ``input``'s shape) is True. The
    gradient passes where the mask is False; a tensor ``value`` that requires grad gets the
    sum of the output's gradient where the mask is True."""
    _tensor(input, "masked_fill: input")
    _tensor(mask, "masked_fill: mask")
    check_same_context(input, mask)
    if mask.dtype != bool_:
        raise DTypeError(f"masked_fill: mask must be a bool tensor (dp.bool), got {mask.dtype}")
    if isinstance(value, Tensor):
        if value.ndim != 0 and value.size != 1:
            raise ShapeError(f"masked_fill: value must be a number or a 0-d tensor, got a "
                             f"tensor of shape {value.shape}")
        value_tensor = value
        value = value.item()
    else:
        value_tensor = None
    if masks.scalar_kind(value) is None:
        raise DTypeError(f"masked_fill: value must be a number, got {type(value).__name__}")
    if masks._KIND[input.dtype] < 2 and masks.scalar_kind(value) == 2:
        raise DTypeError(f"masked_fill: a float value {value!r} into a {input.dtype} tensor")
    if broadcast_shapes(input.shape, mask.shape) != input.shape:
        raise ShapeError(f"masked_fill: mask {mask.shape} does not broadcast to input's shape "
                         f"{input.shape}")
    dtype = input.dtype
    out = Tensor.empty(input.ctx, input.shape, dtype)
    _where_kernel(None, dtype, dtype)([mask, input], [out],
                                      [_SCALAR_TYPES[compute_dtype(dtype)](value)])
    value_grad = value_tensor is not None and autograd.needs_grad(value_tensor)
    if not (autograd.needs_grad(input) or value_grad):
        return out
    cond = mask.detach()
    if not value_grad:
        return autograd.record(out, (input,), lambda g: (where(cond, 0.0, g),), "masked_fill")
    value_shape = value_tensor.shape

    def backward(g):
        filled = reduce.sum(where(cond, g, 0.0)).reshape(value_shape)
        return where(cond, 0.0, g), filled

    return autograd.record(out, (input, value_tensor), backward, "masked_fill")


# The tests by number: one kernel per dtype computes any of them, chosen by a run-time
# argument (a compile per test and dtype would be five).
_TESTS = {"isnan": 0, "isinf": 1, "isposinf": 2, "isneginf": 3, "isfinite": 4}
_FLOAT_TESTS = ("y = (test == 0) ? (x != x) : (test == 1) ? (isinf(x) != 0) : "
                "(test == 2) ? (isinf(x) && x > 0) : (test == 3) ? (isinf(x) && x < 0) : "
                "(isfinite(x) != 0);")
_INTEGER_TESTS = "y = (test == 4);"      # integers are finite, never NaN or infinite


def _test(name, input):
    _tensor(input, f"{name}: input")
    is_float = masks._KIND[input.dtype] == 2
    # 16-bit values are tested as the floats they load into (no cl_khr_fp16 needed).
    kernel = _memo(("nonfinite_tests", input.dtype), lambda: PointwiseKernel(
        f"nonfinite_tests_{template_type(input.dtype)}", [("x", input.dtype)], [("y", bool_)],
        _FLOAT_TESTS if is_float else _INTEGER_TESTS, scalars=[("test", int32)]))
    out = Tensor.empty(input.ctx, input.shape, bool_)
    kernel([input], [out], [scalar(np.int32, _TESTS[name])])
    return out


def isnan(input):
    """torch.isnan: True where ``input`` is NaN (a bool tensor; integers are never NaN)."""
    return _test("isnan", input)


def isinf(input):
    """torch.isinf: True where ``input`` is +inf or -inf."""
    return _test("isinf", input)


def isposinf(input):
    """torch.isposinf: True where ``input`` is +inf."""
    return _test("isposinf", input)


def isneginf(input):
    """torch.isneginf: True where ``input`` is -inf."""
    return _test("isneginf", input)


def isfinite(input):
    """torch.isfinite: True where ``input`` is neither NaN nor infinite."""
    return _test("isfinite", input)


def isin(elements, test_elements, *, assume_unique=False, invert=False):
    """torch.isin: True where an element of ``elements`` equals one of ``test_elements``
    (either may be a number; the two compare in their promoted dtype), or where none does with
    ``invert``. Each element scans the test elements (O(N * M) work: meant for the small test
    sets of masking)."""
    if not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor):
        raise DTypeError("isin: at least one of elements and test_elements must be a Tensor")
    ref = elements if isinstance(elements, Tensor) else test_elements
    tensors = [x for x in (elements, test_elements) if isinstance(x, Tensor)]
    check_same_context(*tensors)
    dtype = _result_dtype("isin", elements, test_elements)
    if dtype == bool_:
        dtype = int32
    ctx = ref.ctx

    def as_tensor(x):
        if isinstance(x, Tensor):
            return masks.cast(x, dtype)
        return Tensor.from_numpy(ctx, np.array([x], dtype=dtype))
    x, t = as_tensor(elements), as_tensor(test_elements)
    shape = elements.shape if isinstance(elements, Tensor) else ()
    out = Tensor.empty(ctx, shape, bool_)
    if out.size:
        if not t.size:
            out.fill_(bool(invert))
        else:
            _run(ctx, "isin_any", dtype, out.size,
                 max(out.size, x.offset_elements + x.size, t.offset_elements + t.size),
                 out.size, x.buffer, x.offset_elements, t.buffer, t.offset_elements, t.size,
                 scalar(np.int32, bool(invert)), out.buffer, out.offset_elements)
    return out


def count_nonzero(input, dim=None):
    """torch.count_nonzero: the number of nonzero elements (NaN counts), over ``dim`` (an
    int, ints or None for all) as int64."""
    _tensor(input, "count_nonzero: input")
    return reduce.sum(masks.ne(input, 0), dim)


# ---- tril / triu -----------------------------------------------------------------------------

def _triangle(name, input, diagonal, upper):
    _tensor(input, f"{name}: input")
    if input.ndim < 2:
        raise ShapeError(f"{name}: input must have at least 2 dimensions, got shape "
                         f"{input.shape}")
    if not isinstance(diagonal, (int, np.integer)) or isinstance(diagonal, bool):
        raise DTypeError(f"{name}: diagonal must be an int, got {diagonal!r}")
    R, C = input.shape[-2:]
    out = Tensor.empty(input.ctx, input.shape, input.dtype)
    _run(input.ctx, "triangle", input.dtype, out.size, out.size + input.offset_elements,
         out.size, R, C, scalar(np.int64, diagonal), scalar(np.int32, upper), input.buffer,
         input.offset_elements, out.buffer, out.offset_elements)
    if not autograd.needs_grad(input):
        return out
    return autograd.record(out, (input,), lambda g: (_triangle(name, g, diagonal, upper),), name)


def tril(input, diagonal=0):
    """torch.tril: the lower triangle (on and below ``diagonal``) of the last two dimensions,
    zeros elsewhere."""
    return _triangle("tril", input, diagonal, 0)


def triu(input, diagonal=0):
    """torch.triu: the upper triangle (on and above ``diagonal``) of the last two dimensions,
    zeros elsewhere."""
    return _triangle("triu", input, diagonal, 1)


# ---- factories ---------------------------------------------------------------------------------

def _factory_context(ctx):
    if ctx is None:
        return default_context()
    if not isinstance(ctx, Context):
        raise DeviceError(f"expected a dlprim_py.Context, got {type(ctx).__name__}")
    return ctx


def _host_number(value, what):
    """``value``, or the number a 0-d (or one-element) tensor holds, read back to the host."""
    if not isinstance(value, Tensor):
        return value
    if value.size != 1 or value.ndim > 1:
        raise ShapeError(f"{what} must be a number or a 0-d tensor, got a tensor of shape "
                         f"{value.shape}")
    return value.item()


def arange(start, end=None, step=1, *, dtype=None, ctx=None, requires_grad=False):
    """torch.arange: ``start, start + step, ...`` up to ``end`` (excluded); ``arange(n)`` is
    ``0 .. n-1``. ``dtype`` defaults to int64 when every argument is an int, else float32;
    ``ctx`` defaults to ``dlprim_py.default_context()``. Floating point values are computed as
    ``start + i * step`` in float32. A bool counts as the int it is (torch reads True as 1)."""
    if end is None:
        start, end = 0, start
    start, end, step = (int(v) if masks.scalar_kind(v) == 0 else v for v in (start, end, step))
    for name, v in (("start", start), ("end", end), ("step", step)):
        if masks.scalar_kind(v) not in (1, 2) or not math.isfinite(v):
            raise DTypeError(f"arange: {name} must be a finite number, got {v!r}")
    if step == 0:
        raise ShapeError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise ShapeError(f"arange: the range from {start} to {end} does not go in the "
                         f"direction of step {step}")
    if dtype is None:
        dtype = int64 if all(masks.scalar_kind(v) == 1 for v in (start, end, step)) else float32
    dtype = as_dtype(dtype)
    if dtype not in (float32, int32, int64):
        raise DTypeError(f"arange: dtype must be float32, int32 or int64, got {dtype}")
    if all(masks.scalar_kind(v) == 1 for v in (start, end, step)):
        count = max(0, -((int(start) - int(end)) // int(step)))
    else:
        count = max(0, math.ceil((float(end) - float(start)) / float(step)))
    ctx = _factory_context(ctx)
    out = Tensor.empty(ctx, (count,), dtype)
    scalar = np.float32 if dtype == float32 else np.int64
    _run(ctx, "arange_fill", dtype, count, count + 1, count, scalar(start), scalar(step),
         out.buffer, out.offset_elements)
    if requires_grad:
        out.requires_grad_(True)
    return out


def linspace(start, end, steps, *, dtype=None, ctx=None, requires_grad=False):
    """torch.linspace: ``steps`` values evenly spaced from ``start`` to ``end`` (both
    included), computed in float32 as torch does (from the start for the first half, from the
    end for the second); an integer ``dtype`` truncates them. ``start`` and ``end`` may be
    0-d tensors, as torch's (their values are read back to the host)."""
    start, end = (_host_number(v, f"linspace: {name}") for name, v in (("start", start),
                                                                        ("end", end)))
    for name, v in (("start", start), ("end", end)):
        if masks.scalar_kind(v) not in (1, 2) or not math.isfinite(v):
            raise DTypeError(f"linspace: {name} must be a finite number, got {v!r}")
    if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0:
        raise ShapeError(f"linspace: steps must be a non-negative int, got {steps!r}")
    dtype = float32 if dtype is None else as_dtype(dtype)
    if dtype not in (float32, int32, int64):
        raise DTypeError(f"linspace: dtype must be float32, int32 or int64, got {dtype}")
    ctx = _factory_context(ctx)
    out = Tensor.empty(ctx, (int(steps),), float32)
    step = (float(end) - float(start)) / (steps - 1) if steps > 1 else 0.0
    # One step is [start] (torch); the kernel's second half counts back from ``end``, so the
    # single value would otherwise be ``end``.
    last = end if steps > 1 else start
    _run(ctx, "linspace_fill", float32, int(steps), int(steps) + 1, int(steps),
         np.float32(start), np.float32(last), np.float32(step), out.buffer, out.offset_elements)
    if dtype != float32:
        out = masks.cast(out, dtype)
    if requires_grad:
        out.requires_grad_(True)
    return out


# ---- embedding / embedding_bag / one_hot -------------------------------------------------------

def _check_weight(name, weight):
    _tensor(weight, f"{name}: weight")
    if weight.ndim != 2:
        raise ShapeError(f"{name}: weight must be 2-d (num_embeddings, embedding_dim), got "
                         f"shape {weight.shape}")
    if weight.dtype != float32:
        raise DTypeError(f"{name}: weight must be float32, got {weight.dtype}")


def _padding_index(name, padding_idx, V):
    if padding_idx is None:
        return None
    if not isinstance(padding_idx, (int, np.integer)) or isinstance(padding_idx, bool):
        raise DTypeError(f"{name}: padding_idx must be an int or None, got {padding_idx!r}")
    if not -V <= padding_idx < V:
        raise ShapeError(f"{name}: padding_idx {padding_idx} must be within num_embeddings "
                         f"({V})")
    return int(padding_idx) % V


def _renorm(weight, flat, max_norm, norm_type):
    """embedding's max_norm: the rows of ``weight`` that ``flat`` names scaled in place to
    norm ``max_norm`` where theirs is larger."""
    if not flat.size:
        return
    from .scan import sort
    with autograd.no_grad():
        keys, _ = sort(flat, stable=True)
    V, E = weight.shape
    _run(weight.ctx, "embedding_renorm", float32, flat.size,
         max(flat.size, weight.offset_elements + weight.size), flat.size, E, scalar(np.int64, V),
         keys.buffer, weight.buffer, weight.offset_elements, np.float32(max_norm),
         np.float32(norm_type))


def _weight_grad(g_rows, index, V, E, padding_idx):
    """The weight's gradient: rows of ``g_rows`` (L, E) added at ``index`` (L,), the padding
    row zero. Its launches (the zero fill, the index sort, the sorted adds) are one plan per
    shape and offsets, replayed by a repeated backward: a dozen small launches whose host work
    would otherwise take longer than the device's."""
    ctx = g_rows.ctx
    grad = Tensor.empty(ctx, (V, E), float32)
    ctx.defer_check("index_range", _raise_on_flag)
    key = ("embedding_weight_grad", g_rows.shape, g_rows.offset, index.shape, index.offset, V,
           E, padding_idx)
    run_planned_on(ctx, key, (g_rows, index, grad), _weight_grad_into,
                   args=(g_rows, index, grad, E, padding_idx))
    return grad


def _weight_grad_into(g_rows, index, grad, E, padding_idx):
    grad.fill_(0)
    _index_add_into(grad, 0, index, g_rows, 1)
    if padding_idx is not None:
        _checked(grad.ctx, grad.buffer, (E,), float32, grad.offset + padding_idx * E * 4).fill_(0)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """torch.nn.functional.embedding: the rows of ``weight`` (V, E) named by ``input`` (int64
    or int32 of any shape), shaped ``input.shape + (E,)``.

    ``padding_idx``: that row gets no gradient. ``max_norm``: before the lookup, each row that
    ``input`` names and whose ``norm_type``-norm exceeds it is scaled in place (in ``weight``,
    without gradient, as torch's) to norm ``max_norm``. The weight's gradient sums the rows'
    gradients per index deterministically. ``scale_grad_by_freq`` and ``sparse`` are not
    supported.
    """
    key = None
    # The weight may be a module's Parameter (a Tensor subclass without fields of its own).
    if input.__class__ is Tensor and isinstance(weight, Tensor) and max_norm is None and \
            not scale_grad_by_freq and not sparse:
        key = ("embedding", input.shape, input.dtype, input.offset, weight.shape, weight.dtype,
               weight.offset, padding_idx, padding_idx.__class__)
        checked = weight.ctx.plans.get(key)
        if checked is not None:
            return _embedding_planned(key, input, weight, *checked)
    _tensor(input, "embedding: input")
    _check_weight("embedding", weight)
    index = _index(input, "embedding: input", allow_int32=True)
    check_same_context(index, weight)
    if scale_grad_by_freq:
        raise UnsupportedError("embedding: scale_grad_by_freq=True is not supported")
    if sparse:
        raise UnsupportedError("embedding: sparse=True is not supported (dense gradients only)")
    V, E = weight.shape
    padding_idx = _padding_index("embedding", padding_idx, V)
    if key is not None and index is input and index.size and weight.size:
        # Checked: this call and the next ones with the same key replay one plan.
        weight.ctx.plans.put(key, (V, E, padding_idx))
        return _embedding_planned(key, input, weight, V, E, padding_idx)
    flat = _checked(index.ctx, index.buffer, (index.size,), int64, index.offset)
    if max_norm is not None:
        if masks.scalar_kind(max_norm) not in (1, 2):
            raise DTypeError(f"embedding: max_norm must be a number, got {max_norm!r}")
        _renorm(weight, flat, float(max_norm), float(norm_type))
    rows = _select(weight, 0, flat)
    out = _checked(rows.ctx, rows.buffer, index.shape + (E,), float32, rows.offset)
    if not autograd.needs_grad(weight):
        return out
    flat = flat.detach()

    def backward(g):
        return (_weight_grad(g.reshape((flat.size, E)), flat, V, E, padding_idx),)

    return autograd.record(out, (weight,), backward, "embedding")


def _embedding_planned(key, input, weight, V, E, padding_idx):
    """embedding of checked arguments (int64 ``input``, no max_norm) through the plan of
    ``key``."""
    ctx = weight.ctx
    out = Tensor.empty(ctx, input.shape + (E,), float32)
    ctx.defer_check("index_range", _raise_on_flag)
    run_planned_on(ctx, key, (weight, input, out), _embedding_into, None, (weight, input, out))
    if not autograd.needs_grad(weight):
        return out
    flat = _checked(ctx, input.buffer, (input.size,), int64, input.offset).detach()

    def backward(g):
        return (_weight_grad(g.reshape((flat.size, E)), flat, V, E, padding_idx),)

    return autograd.record(out, (weight,), backward, "embedding")


_MODES = {"sum": 0, "mean": 1, "max": 2}


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                  mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):
    """torch.nn.functional.embedding_bag: the sum, mean or max of the ``weight`` rows of each
    bag of indices, without the intermediate rows.

    ``input``: 2-d (B, N), a bag per row (``offsets`` None); or 1-d with ``offsets`` (int64,
    the bags' starts; with ``include_last_offset`` the last entry is the end of the last bag).
    ``per_sample_weights`` (``input``'s shape, float32) scale the rows, mode "sum" only.
    ``padding_idx`` entries are left out (and not counted by the mean). An empty bag gives
    zeros. ``max_norm`` renorms the named rows in place as ``embedding``'s does. Gradients: the
    weight's (deterministic) and ``per_sample_weights``'. ``scale_grad_by_freq`` and ``sparse``
    are not supported.
    """
    _tensor(input, "embedding_bag: input")
    _check_weight("embedding_bag", weight)
    index = _index(input, "embedding_bag: input", allow_int32=True)
    if mode not in _MODES:
        raise UnsupportedError(f"embedding_bag: mode must be 'sum', 'mean' or 'max', got "
                               f"{mode!r}")
    if scale_grad_by_freq:
        raise UnsupportedError("embedding_bag: scale_grad_by_freq=True is not supported")
    if sparse:
        raise UnsupportedError("embedding_bag: sparse=True is not supported (dense gradients "
                               "only)")
    V, E = weight.shape
    ctx = weight.ctx
    padding_idx = _padding_index("embedding_bag", padding_idx, V)
    if index.ndim == 2:
        if offsets is not None:
            raise ShapeError("embedding_bag: offsets must be None for a 2-d input (each row is "
                             "a bag)")
        B, fixed = index.shape[0], index.shape[1]
        offsets_t, given = index, 0
        if fixed == 0:
            offsets_t = Tensor.zeros(ctx, (max(B, 1),), int64)
            given = B
    elif index.ndim == 1:
        if offsets is None:
            raise ShapeError("embedding_bag: offsets are required for a 1-d input")
        offsets_t = _index(offsets, "embedding_bag: offsets", allow_int32=True)
        if offsets_t.ndim != 1:
            raise ShapeError(f"embedding_bag: offsets must be 1-d, got shape {offsets_t.shape}")
        B = offsets_t.size - 1 if include_last_offset else offsets_t.size
        if B < 0:
            raise ShapeError("embedding_bag: include_last_offset needs at least one offset")
        # The last bag ends at the end of the input (torch's, whatever the last offset says).
        given = B
        fixed = 0
    else:
        raise ShapeError(f"embedding_bag: input must be 1-d (with offsets) or 2-d, got shape "
                         f"{index.shape}")
    check_same_context(index, weight, offsets_t)
    use_psw = per_sample_weights is not None
    if use_psw:
        _tensor(per_sample_weights, "embedding_bag: per_sample_weights")
        if mode != "sum":
            raise UnsupportedError(f"embedding_bag: per_sample_weights are only supported with "
                                   f"mode='sum', got mode={mode!r}")
        if per_sample_weights.shape != index.shape or per_sample_weights.dtype != float32:
            raise ShapeError(f"embedding_bag: per_sample_weights must be float32 of input's "
                             f"shape {index.shape}, got {per_sample_weights.dtype} "
                             f"{per_sample_weights.shape}")
        check_same_context(index, per_sample_weights)
    psw = per_sample_weights if use_psw else weight
    N = index.size
    flat = index.reshape((N,))
    if max_norm is not None:
        _renorm(weight, flat, float(max_norm), float(norm_type))
    out = Tensor.empty(ctx, (B, E), float32)
    arg = Tensor.empty(ctx, (B, E) if mode == "max" else (1,), int64)
    pad = scalar(np.int64, -1 if padding_idx is None else padding_idx)
    m = scalar(np.int32, _MODES[mode])
    extent = max(B * E, N * E, V * E + weight.offset_elements, N + index.offset_elements,
                 offsets_t.offset_elements + offsets_t.size, psw.offset_elements + psw.size)
    common = (E, N)

    def bag_args():
        return (index.buffer, index.offset_elements, offsets_t.buffer,
                offsets_t.offset_elements, given, fixed)

    _run(ctx, "embedding_bag_forward", float32, B * E, extent, B * E, *common,
         scalar(np.int64, V), *bag_args(), weight.buffer, weight.offset_elements, psw.buffer,
         psw.offset_elements, scalar(np.int32, use_psw), m, pad, out.buffer, out.offset_elements,
         arg.buffer, arg.offset_elements, range_flag(ctx))
    inputs = (weight, per_sample_weights) if use_psw else (weight,)
    if not autograd.needs_grad(*inputs):
        return out
    keep = (index.detach(), offsets_t.detach(), psw.detach(), arg, weight.detach())
    weight_grad = autograd.needs_grad(weight)

    def backward(g):
        idx_t, off_t, psw_t, arg_t, w_t = keep
        grads = []
        if weight_grad:
            expanded = Tensor.zeros(g.ctx, (N, E), float32)
            _run(g.ctx, "embedding_bag_expand", float32, B * E, extent, B * E, *common,
                 idx_t.buffer, idx_t.offset_elements, off_t.buffer, off_t.offset_elements,
                 given, fixed, psw_t.buffer, psw_t.offset_elements,
                 scalar(np.int32, use_psw), m, pad,
                 g.buffer, g.offset_elements, arg_t.buffer, arg_t.offset_elements,
                 expanded.buffer)
            grads.append(_weight_grad(expanded, idx_t.reshape((N,)), V, E, padding_idx))
        else:
            grads.append(None)
        if use_psw:
            # The weight as it was read (max_norm renormed it before the forward's read).
            d_psw = Tensor.empty(g.ctx, index.shape, float32)
            _run(g.ctx, "embedding_bag_psw_grad", float32, N, extent, N, E, scalar(np.int64, V),
                 idx_t.buffer, idx_t.offset_elements, off_t.buffer, off_t.offset_elements,
                 given, fixed, w_t.buffer, w_t.offset_elements, g.buffer, g.offset_elements,
                 pad, d_psw.buffer)
            grads.append(d_psw)
        return tuple(grads)

    return autograd.record(out, inputs, backward, "embedding_bag")


def one_hot(tensor, num_classes=-1):
    """torch.nn.functional.one_hot: int64 ``tensor`` of any shape -> int64 of shape
    ``tensor.shape + (num_classes,)`` with a 1 at each value. ``num_classes=-1`` takes the
    largest value + 1 (which reads the tensor back from the device, as torch does)."""
    index = _index(tensor, "one_hot: tensor")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool):
        raise DTypeError(f"one_hot: num_classes must be an int, got {num_classes!r}")
    if num_classes == -1:
        if not index.size:
            raise ShapeError("one_hot: cannot infer num_classes from an empty tensor; give it")
        num_classes = int(index.numpy().max()) + 1      # torch reads it back as well
    elif num_classes < 0:
        raise ShapeError(f"one_hot: num_classes must be -1 or >= 0, got {num_classes}")
    C = int(num_classes)
    out = Tensor.empty(index.ctx, index.shape + (C,), int64)
    if out.size:
        _run(index.ctx, "one_hot", int64, out.size, out.size + index.offset_elements + index.size,
             out.size, scalar(np.int64, C), index.buffer, index.offset_elements, out.buffer,
             out.offset_elements, range_flag(index.ctx))
    elif index.size and C == 0:
        raise ShapeError("one_hot: num_classes=0 with a non-empty tensor: every class is out "
                         "of range")
    return out
