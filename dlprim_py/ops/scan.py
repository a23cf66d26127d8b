"""Scans and sorting along a dimension, with torch's semantics and gradients: ``cumsum``,
``sort`` and ``topk`` (kernels/scan.cl.mako).

``cumsum`` along the last dimension is the "cumsum" family (``dlprim_py.solver``,
``DLPRIM_CUMSUM_ALGO`` or ``algorithm=`` forces one): "lookback", a single pass (decoupled
look-back: each work-group scans a tile of 4096 elements in local memory and takes its prefix
from its predecessors' published totals, so each element is read once and written once; it
needs an in-order queue, since launches share one status buffer), and "chunks", work-group
chunks in local memory with a second pass adding each chunk's prefix where a row has several
(the chunk totals are scanned the same way, recursively). The tuning rules
(``tuning_db/cumsum.json``) take "lookback" for long rows and "chunks" for rows of a few chunks,
where its extra pass is small. Any other dimension is scanned by one work item per column.
Integer and bool inputs sum to int64, as torch's; ``dtype`` converts the input first.

``topk`` is the "topk" family (``DLPRIM_TOPK_ALGO`` or ``algorithm=`` forces one): "radix", a
work-group per row finding the k-th best key by 8-bit radix passes, then gathering and sorting
the k best in local memory (k up to 1024), and "bitonic", the sorting networks below.

``sort`` and ``topk`` order keys ascending or descending with NaN greater than every number
(torch's order) and equal keys by position: every sort is stable, so ``stable=False`` gives
the same result as ``stable=True`` and indices are reproducible. Rows up to one tile (twice the
work-group size, 1024 entries on most devices) are sorted by one work-group in local memory;
longer rows by a bitonic network whose steps below the tile size run in local memory and the
others as one launch each. ``topk`` keeps the best ``k`` of every tile, then of the survivors,
until one tile is left (``k`` up to half a tile; a full sort beyond), so it reads a long row
once. The values' gradient goes back to the positions they came from.
"""
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyopencl as cl

from .. import autograd, config, program, solver, tuning
from ..dtypes import as_dtype, bool_, cl_name, float32, int32, int64
from ..errors import DlprimError, DTypeError, ShapeError, not_a_tensor
from ..launch import bind, run_planned_on
from ..tensor import Tensor
from . import masks, tensor_ops
from .pointwise import group_size, launch_size

_INT32_LIMIT = 2 ** 31 - 1
_PER = 8          # elements per work item in a cumsum chunk (kernels/scan.cl.mako's PER)
_SORT_KEYS = (float32, int32, int64)


class SortResult(NamedTuple):
    """What ``sort`` and ``topk`` return, as torch's named tuples: ``values``, ``indices``
    (int64)."""
    values: Tensor
    indices: Tensor


# Every template parameter of kernels/scan.cl.mako (Mako asks for all of them whatever the
# part), with the value of a part that does not use it.
_UNUSED = dict(src="", acc="", key="", vec=0, ptx_fence=0, lper=16)


def _kernel(ctx, name, index_t, **params):
    params = dict(_UNUSED, **params)
    key = ("scan", name, index_t, tuple(sorted(params.items())))
    kernel = ctx.plans.get(key)
    if kernel is None:
        kernel = ctx.plans.put(key, bind(program.kernel(ctx, "scan", name,
                                                        dict(params, index_t=index_t))))
    return kernel


def _index_type(extent):
    return ("int", np.int32) if extent < _INT32_LIMIT else ("long", np.int64)


def _flag(value):
    from .indexing import scalar
    return scalar(np.int32, int(value))


def _args(ix, args):
    from .indexing import scalar
    return [scalar(ix, a) if a.__class__ is int else a for a in args]


# ---- cumsum --------------------------------------------------------------------------------

# Elements per work item in a look-back tile (kernels/scan.cl.mako's LPER) where no rule gives
# "per_item"; the values a rule may give (multiples of the kernel's 4-vectors).
_LOOKBACK_PER = 16
_LOOKBACK_PERS = (4, 8, 16, 32)


@dataclass(frozen=True)
class CumsumProblem:
    """A scan of ``rows`` dense rows of ``n`` elements each (the last dimension)."""
    rows: int
    n: int

    def key(self):
        return f"cumsum-r{self.rows}-n{self.n}"

    def features(self):
        return {"rows": self.rows, "n": self.n}


class LookbackSolver(solver.Solver):
    """One pass: a work-group per tile takes its prefix from its predecessors' published totals
    (decoupled look-back). Launches share one status buffer per context, so the queue must run
    them in order."""
    name = "lookback"

    def applies(self, ctx, problem):
        return not ctx.queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


class ChunksSolver(solver.Solver):
    """A work-group scan per chunk, then the chunk totals scanned and added: about four passes
    over a long row, two launches more than "lookback"; any queue."""
    name = "chunks"


FAMILY = solver.register(solver.Family("cumsum", (LookbackSolver(), ChunksSolver()),
                                       title="cumsum algorithm"))
CUMSUM_ALGORITHMS = tuple(FAMILY.solvers)


def _cumsum_algorithm(ctx, rows, N, forced):
    key = ("cumsum_choice", rows, N, forced, config.switches().forced.get("cumsum"),
           tuning.generation)
    name = ctx.plans.get(key)
    if name is None:
        name = ctx.plans.put(key, solver.select(ctx, "cumsum", CumsumProblem(rows, N),
                                                forced=forced).name)
    return name


# Tiles the first look-back status buffer of a context holds (it grows as calls need).
_STATUS_TILES = 1024


def _status(ctx, tiles):
    """The look-back status buffer of ``ctx`` (ints, zero between launches: the kernel's last
    group sets it back), for at least ``tiles`` tiles. Made from zeroed host memory, not by an
    enqueued fill, so a recording open around the call stays a plan."""
    found = ctx.plans.get(("scan.status",))
    if found is None or found[1] < tiles:
        capacity = max(tiles, 2 * found[1] if found else _STATUS_TILES)
        words = np.zeros(2 + capacity * 5, np.int32)   # counters, flags, 2-word totals, prefixes
        buffer = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                           hostbuf=words)
        found = ctx.plans.put(("scan.status",), (buffer, capacity))
    return found[0]


def _lookback_local_bytes(group, itemsize, per=_LOOKBACK_PER):
    """Local memory of scan_lookback (kernels/scan.cl.mako): the padded tile, the items' sums,
    the look-back window's values and flags, and a few words."""
    tile = group * per
    return (tile + tile // 32 + group + 32 + 1) * itemsize + 32 * 4 + 16


def lookback_per(ctx, rows, N):
    """Elements per work item of a look-back tile for rows of N: the "per_item" of the first
    cumsum rule naming "lookback" that holds and gives one (``tuning_db/cumsum.json``), else
    ``_LOOKBACK_PER``. Longer tiles mean fewer tiles, so a shorter chain of look-backs along
    a long row."""
    key = ("cumsum.lookback_per", rows, N, tuning.generation)
    per = ctx.plans.get(key)
    if per is None:
        params = tuning.merged_params(
            ctx.info, "cumsum", {"rows": rows, "n": N, "gpu": int(ctx.info.is_gpu)},
            lambda p: p.get("solver") == "lookback" and "per_item" in p)
        per = params.get("per_item", _LOOKBACK_PER)
        if per not in _LOOKBACK_PERS:
            raise DlprimError(f"cumsum rule: per_item must be one of {_LOOKBACK_PERS}, got "
                              f"{per!r}")
        ctx.plans.put(key, per)
    return per


def _lookback_group(ctx, itemsize, per=_LOOKBACK_PER):
    """Work-items per look-back group: up to 256, halved while the tile of ``itemsize``-byte
    sums does not fit the device's local memory (int64 tiles on a 32 KiB device)."""
    group = group_size(ctx, 256)
    while group > 32 and _lookback_local_bytes(group, itemsize, per) > ctx.info.local_mem_size:
        group //= 2
    return group


def _scan_lookback(ctx, x, x_off, y, y_off, rows, N, reverse, acc):
    """y = the inclusive scan of ``rows`` dense rows of N elements of buffer x, one pass."""
    per = lookback_per(ctx, rows, N)
    group = _lookback_group(ctx, np.dtype(acc).itemsize, per)
    tile = group * per
    chunks = -(-N // tile)
    tiles = rows * chunks
    if tiles >= _INT32_LIMIT // 8:
        raise ShapeError(f"cumsum: {tiles} look-back tiles are more than the status buffer "
                         f"indexes")
    index_t, ix = _index_type(max(rows * N + max(x_off, y_off), tiles * tile))
    # 4-vectors where every row starts on a 4-element boundary of both buffers.
    vec = int(x_off % 4 == 0 and y_off % 4 == 0 and (N % 4 == 0 or rows == 1))
    kernel = _kernel(ctx, "scan_lookback", index_t, part="lookback", acc=cl_name(acc),
                     group=group, vec=vec, ptx_fence=int(ctx.info.vendor == "nvidia"),
                     lper=per)
    kernel(ctx.queue, (tiles * group,), (group,),
           *_args(ix, (N, chunks, _flag(tiles), x, x_off, y, y_off, _status(ctx, tiles),
                       _flag(reverse))))


def _scan_rows(ctx, x, x_off, y, y_off, rows, N, reverse, src, acc, algorithm=None):
    """y = the inclusive scan of ``rows`` dense rows of N elements of buffer x (into y's), by
    the "cumsum" family's choice (``algorithm`` forces one)."""
    if _cumsum_algorithm(ctx, rows, N, algorithm) == "lookback":
        _scan_lookback(ctx, x, x_off, y, y_off, rows, N, reverse, acc)
        return
    _scan_chunks(ctx, x, x_off, y, y_off, rows, N, reverse, src, acc)


def _scan_chunks(ctx, x, x_off, y, y_off, rows, N, reverse, src, acc):
    """y = the inclusive scan of ``rows`` dense rows of N elements of buffer x (into y's), by
    chunks and a second pass."""
    group = group_size(ctx, 256)
    chunk = group * _PER
    chunks = -(-N // chunk)
    index_t, ix = _index_type(max(rows * N + max(x_off, y_off), rows * chunks * chunk))
    params = dict(part="cumsum", src=cl_name(src), acc=cl_name(acc), key="", group=group)
    partial = Tensor.empty(ctx, (rows * chunks,), acc) if chunks > 1 else None
    kernel = _kernel(ctx, "scan_chunks", index_t, **params)
    kernel(ctx.queue, (rows * chunks * group,), (group,),
           *_args(ix, (N, chunks, x, x_off, y, y_off,
                       partial.buffer if partial is not None else y, _flag(reverse))))
    if chunks > 1:
        # The chunk totals scanned in place (always forwards: they are in scan order already).
        _scan_chunks(ctx, partial.buffer, 0, partial.buffer, 0, rows, chunks, 0, acc, acc)
        gsize, lsize = launch_size(ctx, rows * N)
        _kernel(ctx, "scan_add", index_t, **params)(
            ctx.queue, gsize, lsize,
            *_args(ix, (rows * N, N, chunks, partial.buffer, y, y_off, _flag(reverse))))


def _cumsum(x, dim, reverse, algorithm=None):
    """The inclusive scan of dense ``x`` along ``dim`` (from the end with ``reverse``);
    ``algorithm``: a "cumsum" solver forced for scans along the last dimension. A repeated
    call replays the first one's launches on its own buffers (``run_planned_on``): the
    choices and arguments made in Python cost more host time than the launch itself."""
    acc = float32 if x.dtype == float32 else int64
    out = Tensor.empty(x.ctx, x.shape, acc)
    if x.size:
        # Everything the launches depend on but the buffers (the solver's choice and its tile
        # follow the switches and the tuning databases).
        key = ("cumsum", x.shape, x.dtype, x.offset, dim, reverse, algorithm,
               config.switches().forced.get("cumsum"), tuning.generation)
        run_planned_on(x.ctx, key, (x, out), _cumsum_into, None,
                       (x, dim, reverse, algorithm, acc, out))
    return out


def _cumsum_into(x, dim, reverse, algorithm, acc, out):
    """out = the inclusive scan of dense ``x`` (not empty) along ``dim``."""
    shape = x.shape if x.ndim else (1,)
    O, N, I = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    ctx = x.ctx
    if I == 1:
        _scan_rows(ctx, x.buffer, x.offset_elements, out.buffer, out.offset_elements, O, N,
                   reverse, x.dtype, acc, algorithm)
    else:
        index_t, ix = _index_type(x.size + x.offset_elements)
        params = dict(part="cumsum", src=cl_name(x.dtype), acc=cl_name(acc), key="",
                      group=group_size(ctx, 256))
        gsize, lsize = launch_size(ctx, O * I)
        _kernel(ctx, "scan_columns", index_t, **params)(
            ctx.queue, gsize, lsize,
            *_args(ix, (O * I, N, I, x.buffer, x.offset_elements, out.buffer,
                        out.offset_elements, _flag(reverse))))


def cumsum(input, dim, *, dtype=None, algorithm=None):
    """torch.cumsum: the running sums of ``input`` along ``dim``. float32 stays float32;
    bool, int32 and int64 sum to int64 (torch's rule); ``dtype`` (float32 or int64) converts
    the input to it first. The gradient (float32) is the reversed running sum of the output's.
    ``algorithm``: a "cumsum" solver ("lookback", "chunks") for scans along rows (also
    ``DLPRIM_CUMSUM_ALGO``); an error where it does not apply.
    """
    if not isinstance(input, Tensor):
        raise not_a_tensor("cumsum: input", input)
    dim = tensor_ops.normalise_dim(dim, input.ndim, "cumsum")
    x = input
    if dtype is not None:
        dtype = as_dtype(dtype)
        if dtype not in (float32, int64):
            raise DTypeError(f"cumsum: dtype must be float32 or int64, got {dtype}")
        x = masks.cast(input, dtype)
    elif x.dtype not in (float32, int32, int64, bool_):
        raise DTypeError(f"cumsum: float32, int32, int64 and bool tensors are supported, got "
                         f"{x.dtype}")
    if x.dtype in (int32, bool_):
        # Summed as int64 (torch's result type): converted first, so that one scan kernel per
        # result type serves every input type.
        x = masks.cast(x, int64)
    if algorithm is not None:
        FAMILY.solver(algorithm)
    out = _cumsum(x, dim, 0, algorithm)
    if out.dtype != float32 or not autograd.needs_grad(x):
        return out
    return autograd.record(out, (x,), lambda g: (_cumsum(g, dim, 1, algorithm),), "cumsum")


# ---- sort / topk ---------------------------------------------------------------------------

def _check_sortable(name, input, dim):
    if not isinstance(input, Tensor):
        raise not_a_tensor(f"{name}: input", input)
    if input.dtype not in _SORT_KEYS:
        raise DTypeError(f"{name}: float32, int32 and int64 tensors are supported, got "
                         f"{input.dtype}")
    return tensor_ops.normalise_dim(dim, input.ndim, name)


def _rows_last(x, dim):
    """``x`` with ``dim`` moved last (a copy where it is not last already), no gradient."""
    if x.ndim <= 1 or dim == x.ndim - 1:
        return x.detach()
    with autograd.no_grad():
        return tensor_ops.transpose(x.detach(), dim, -1)


def _back(t, dim, ndim):
    if ndim <= 1 or dim == ndim - 1:
        return t
    with autograd.no_grad():
        return tensor_ops.transpose(t, dim, -1)


class _Tiles:
    """The sort kernels of one key type on one context: tile size and launches."""

    def __init__(self, ctx, key, extent):
        self.ctx = ctx
        # 1024-entry tiles on GPUs; CPUs (PoCL) compile the barrier-heavy network per
        # work-group size, and a smaller group keeps that compile short.
        self.group = group_size(ctx, 64 if ctx.info.is_cpu else 512)
        self.tile = 2 * self.group
        self.index_t, self.ix = _index_type(extent)
        params = dict(part="sort", key=cl_name(key), src="", acc="", group=self.group)
        self.tile_kernel = _kernel(ctx, "sort_tile", self.index_t, **params)
        self.step_kernel = _kernel(ctx, "sort_step", self.index_t, **params)

    def tile_pass(self, rows, n, tiles, kin, kin_off, kin_stride, iin, has_idx, kout, kout_off,
                  kout_stride, iout, iout_off, keep, merge_k, local_dir, desc, segment=None):
        segment = self.tile if segment is None else segment
        groups = -(-rows // (self.tile // segment)) * tiles
        self.tile_kernel(self.ctx.queue, (groups * self.group,), (self.group,),
                         *_args(self.ix, (rows, n, tiles, _flag(segment), kin, kin_off,
                                          kin_stride,
                                          iin if iin is not None else kout, 0,
                                          _flag(has_idx), kout, kout_off, kout_stride, iout,
                                          iout_off, keep, merge_k, _flag(local_dir),
                                          _flag(desc))))

    def step(self, rows, P, k, j, keys, idx, desc):
        pairs = rows * P // 2
        gsize, lsize = launch_size(self.ctx, pairs)
        self.step_kernel(self.ctx.queue, gsize, lsize,
                         *_args(self.ix, (pairs, P, k, j, keys, idx, _flag(desc))))


def _sort_rows(x, desc, keep=None):
    """(values, indices) of the dense rows of ``x`` (last dimension) sorted, the first
    ``keep`` of each (all by default)."""
    ctx = x.ctx
    shape = x.shape if x.ndim else (1,)
    n = shape[-1]
    rows = x.size // n if n else 0
    keep = n if keep is None else keep
    out_shape = x.shape[:-1] + (keep,) if x.ndim else x.shape
    values = Tensor.empty(ctx, out_shape, x.dtype)
    indices = Tensor.empty(ctx, out_shape, int64)
    if not values.size:
        return values, indices
    P = 1 << max(0, (n - 1).bit_length())
    tiles = _Tiles(ctx, x.dtype, max(rows * P, x.offset_elements + x.size) + 1)
    T = tiles.tile
    if n <= T:
        # Short rows share a work-group, each in a segment of its padded length.
        tiles.tile_pass(rows, n, 1, x.buffer, x.offset_elements, n, None, 0, values.buffer,
                        values.offset_elements, keep, indices.buffer, indices.offset_elements,
                        keep, 0, 1, desc, segment=P)
        return values, indices
    if keep <= T // 2:
        # topk: the best ``keep`` of every tile, then of the survivors, down to one tile.
        source, source_off, source_idx, count = x.buffer, x.offset_elements, None, n
        while count > T:
            count_tiles = -(-count // T)
            kept = Tensor.empty(ctx, (rows * count_tiles * keep,), x.dtype)
            kept_idx = Tensor.empty(ctx, (rows * count_tiles * keep,), int64)
            tiles.tile_pass(rows, count, count_tiles, source, source_off, count, source_idx,
                            source_idx is not None, kept.buffer, 0, count_tiles * keep,
                            kept_idx.buffer, 0, keep, 0, 1, desc)
            source, source_off, source_idx = kept.buffer, 0, kept_idx.buffer
            count = count_tiles * keep
        tiles.tile_pass(rows, count, 1, source, source_off, count, source_idx, 1,
                        values.buffer, values.offset_elements, keep, indices.buffer,
                        indices.offset_elements, keep, 0, 1, desc)
        return values, indices
    # The whole bitonic network over rows padded to P.
    keys = Tensor.empty(ctx, (rows * P,), x.dtype)
    idx = Tensor.empty(ctx, (rows * P,), int64)
    tiles.tile_pass(rows, n, P // T, x.buffer, x.offset_elements, n, None, 0, keys.buffer, 0,
                    P, idx.buffer, 0, T, 0, 0, desc)
    k = 2 * T
    while k <= P:
        j = k // 2
        while j >= T:
            tiles.step(rows, P, k, j, keys.buffer, idx.buffer, desc)
            j //= 2
        tiles.tile_pass(rows, P, P // T, keys.buffer, 0, P, idx.buffer, 1, keys.buffer, 0, P,
                        idx.buffer, 0, T, k, 0, desc)
        k *= 2
    for source, target in ((keys, values), (idx, indices)):
        tensor_ops.strided_copy(ctx, (rows, keep), target.dtype, source.buffer, 0, (P, 1),
                                target.buffer, target.offset_elements, (keep, 1))
    return values, indices


def _record(values, indices, input, dim, name):
    if not autograd.needs_grad(input):
        return SortResult(values, indices)
    from .indexing import scatter
    shape, idx = input.shape, indices.detach()

    def backward(g):
        return (scatter(Tensor.zeros(g.ctx, shape, g.dtype), dim, idx, g),)

    return SortResult(autograd.record(values, (input,), backward, name), indices)


def sort(input, dim=-1, descending=False, *, stable=False):
    """torch.sort: (values, indices) of ``input`` sorted along ``dim``, ascending or
    ``descending``; NaN sorts as greater than every number. Equal keys keep their order
    (every sort here is stable, whatever ``stable`` says). float32, int32 and int64; the
    values' gradient goes back to where they came from."""
    dim = _check_sortable("sort", input, dim)
    if not isinstance(descending, (bool, np.bool_)) or not isinstance(stable, (bool, np.bool_)):
        raise DTypeError("sort: descending and stable must be bools")
    x = _rows_last(input, dim)
    values, indices = _sort_rows(x, int(descending))
    values, indices = _back(values, dim, input.ndim), _back(indices, dim, input.ndim)
    return _record(values, indices, input, dim, "sort")


# ---- topk ----------------------------------------------------------------------------------

_RADIX_DIGITS = 256    # the smallest work-group: one item per 8-bit digit
RADIX_KMAX = 1024      # kernels/scan.cl.mako's KMAX: the most entries sorted in local memory


def _radix_group(ctx):
    # 1024 items on GPUs: a row's loads in flight at once (at 64 rows, one group per compute
    # unit is all the parallelism there is); 256 on CPUs, where a group runs as a loop.
    return group_size(ctx, 256 if ctx.info.is_cpu else 1024)


@dataclass(frozen=True)
class TopkProblem:
    """The best ``k`` of each of ``rows`` rows of ``n`` entries."""
    rows: int
    n: int
    k: int

    def key(self):
        return f"topk-r{self.rows}-n{self.n}-k{self.k}"

    def features(self):
        return {"rows": self.rows, "n": self.n, "k": self.k}


class RadixSolver(solver.Solver):
    """A work-group per row: the k-th best key by 8-bit radix passes over the row, then the k
    best gathered and sorted in local memory (k up to RADIX_KMAX)."""
    name = "radix"

    def applies(self, ctx, problem):
        return (ctx.info.max_work_group_size >= _RADIX_DIGITS and 1 <= problem.k <= RADIX_KMAX
                and problem.n < _INT32_LIMIT)


class BitonicSolver(solver.Solver):
    """Bitonic sorting networks: the best k of every tile, then of the survivors, until one
    tile is left (k up to half a tile), else the whole row sorted."""
    name = "bitonic"


TOPK_FAMILY = solver.register(solver.Family("topk", (RadixSolver(), BitonicSolver()),
                                            title="topk algorithm"))
TOPK_ALGORITHMS = tuple(TOPK_FAMILY.solvers)


def _topk_algorithm(ctx, rows, n, k, forced):
    key = ("topk_choice", rows, n, k, forced, config.switches().forced.get("topk"),
           tuning.generation)
    name = ctx.plans.get(key)
    if name is None:
        name = ctx.plans.put(key, solver.select(ctx, "topk", TopkProblem(rows, n, k),
                                                forced=forced).name)
    return name


def _topk_radix(x, k, largest):
    """(values, indices) of the best ``k`` (>= 1) of every dense row of ``x``, by radix select."""
    ctx = x.ctx
    n = x.shape[-1] if x.ndim else 1
    rows = x.size // n
    values = Tensor.empty(ctx, x.shape[:-1] + (k,) if x.ndim else x.shape, x.dtype)
    indices = Tensor.empty(ctx, values.shape, int64)
    index_t, ix = _index_type(max(x.offset_elements + x.size, values.offset_elements + rows * k,
                                  indices.offset_elements + rows * k))
    group = _radix_group(ctx)
    # 4-vectors where every row starts on a 4-entry boundary.
    vec = int(x.offset_elements % 4 == 0 and n % 4 == 0)
    kernel = _kernel(ctx, "topk_radix", index_t, part="select", key=cl_name(x.dtype),
                     group=group, vec=vec)
    kernel(ctx.queue, (rows * group,), (group,),
           *_args(ix, (_flag(n), _flag(k), x.buffer, x.offset_elements, values.buffer,
                       values.offset_elements, indices.buffer, indices.offset_elements,
                       _flag(largest))))
    return values, indices


def topk(input, k, dim=-1, largest=True, sorted=True, *, algorithm=None):  # noqa: A002
    """torch.topk: (values, indices) of the ``k`` largest (``largest=False``: smallest) entries
    of ``input`` along ``dim``, best first (also with ``sorted=False``); NaN counts as the
    largest. Ties go to the lower position. float32, int32 and int64; the values' gradient goes
    back to where they came from. ``algorithm``: a "topk" solver ("radix", "bitonic"; also
    ``DLPRIM_TOPK_ALGO``), an error where it does not apply."""
    dim = _check_sortable("topk", input, dim)
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise DTypeError(f"topk: k must be an int, got {k!r}")
    n = input.shape[dim] if input.ndim else 1
    if not 0 <= k <= n:
        raise ShapeError(f"topk: k ({k}) must be in [0, {n}] (the size of dimension {dim})")
    if algorithm is not None:
        TOPK_FAMILY.solver(algorithm)
    x = _rows_last(input, dim)
    rows = x.size // n if n else 0
    if k and rows and _topk_algorithm(x.ctx, rows, n, int(k), algorithm) == "radix":
        values, indices = _topk_radix(x, int(k), int(bool(largest)))
    else:
        values, indices = _sort_rows(x, int(bool(largest)), int(k))
    values, indices = _back(values, dim, input.ndim), _back(indices, dim, input.ndim)
    return _record(values, indices, input, dim, "topk")
