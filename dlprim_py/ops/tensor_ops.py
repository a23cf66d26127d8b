"""Tensor operations that move data: cat, split, narrow, permute, transpose, pad, and the shape
views flatten, squeeze, unsqueeze, reshape.

Tensors are dense, so a slice or a permutation is a copy made by one strided-copy kernel
(``kernels/tensor_ops.cl.mako``) whose sizes and strides are run-time arguments: one compile per
dtype and rank serves every shape. A transposition (a permutation that moves the contiguous
dimension) goes through local-memory tiles instead, so that reads and writes both stay contiguous:
the "copy" family's solvers "gather" and "tiles" (``dlprim_py.solver``, ``DLPRIM_COPY_ALGO``
forces one), chosen by the rules of ``tuning_db/copy.json`` when a copy's plan is made. Views
that keep the element order (reshape, flatten, squeeze, unsqueeze) share the buffer. Every
function records its backward on the autograd tape.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, program, solver, tuning
from ..context import check_same_context
from ..dtypes import cl_name
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import bind
from ..tensor import Tensor
from .pointwise import launch_size, merge_dimensions

_INT32_LIMIT = 2 ** 31 - 1
PAD_MODES = ("constant", "reflect", "replicate", "circular")


def dense_strides(shape):
    """Element strides of a C-contiguous tensor of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _check_tensor(x, what):
    if not isinstance(x, Tensor):
        raise not_a_tensor(f"{what}: input", x)


def normalise_dim(dim, ndim, what):
    """``dim`` in [-ndim, ndim) as a non-negative int; ShapeError otherwise."""
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise ShapeError(f"{what}: dim must be an int, got {dim!r}")
    if not -max(ndim, 1) <= dim < max(ndim, 1):
        raise ShapeError(f"{what}: dim {dim} is out of range for a {ndim}-d tensor "
                         f"(expected [{-max(ndim, 1)}, {max(ndim, 1) - 1}])")
    return int(dim) % max(ndim, 1)


def _index_type(*extents):
    return ("int", np.int32) if max(extents) < _INT32_LIMIT else ("long", np.int64)


def _kernel(ctx, name, dtype, ndim, index_t, mode="constant", batch_dims=0, cl_type=None):
    # A bound kernel: its arguments are set where they changed, and inside a recording (a
    # planned network) its launches are kept with the others, so that a replay copies too.
    # ``cl_type`` overrides the element type (a copy moving whole words of bits).
    params = dict(dtype=cl_type or cl_name(dtype), ndim=ndim, index_t=index_t, mode=mode,
                  batch_dims=batch_dims)
    return bind(program.kernel(ctx, "tensor_ops", name, params))


def _transposition(sizes, src_st, dst_st):
    """(p, q) when dimension p is contiguous in the source and q (the last) in the destination,
    else None."""
    if len(sizes) < 2 or dst_st[-1] != 1 or src_st[-1] == 1:
        return None
    for p in range(len(sizes) - 1):
        if src_st[p] == 1 and dst_st[p] != 1:
            return p, len(sizes) - 1
    return None


@dataclass(frozen=True)
class CopyProblem:
    """A strided copy after merging: sizes and the source's and destination's element
    strides."""
    sizes: tuple
    src_strides: tuple
    dst_strides: tuple

    def key(self):
        return (f"copy-{'x'.join(map(str, self.sizes))}-s{','.join(map(str, self.src_strides))}"
                f"-d{','.join(map(str, self.dst_strides))}")

    @property
    def pair(self):
        return _transposition(self.sizes, self.src_strides, self.dst_strides)

    def features(self):
        pair = self.pair
        return {"elements": math.prod(self.sizes), "ndim": len(self.sizes),
                "transposition": int(pair is not None),
                "tile_side": 0 if pair is None else min(self.sizes[pair[0]], self.sizes[pair[1]])}


class GatherSolver(solver.Solver):
    """A work item per destination element, in the destination's order."""
    name = "gather"


class TilesSolver(solver.Solver):
    """A transposition (the source's contiguous dimension is not the destination's) through
    32 x 32 tiles of local memory, by 256-item groups: reads and writes both contiguous."""
    name = "tiles"

    def applies(self, ctx, problem):
        return problem.pair is not None and ctx.info.max_work_group_size >= 256


FAMILY = solver.register(solver.Family("copy", (GatherSolver(), TilesSolver()),
                                       title="copy algorithm"))
COPY_ALGORITHMS = tuple(FAMILY.solvers)


def strided_copy(ctx, shape, dtype, src_buffer, src_offset, src_strides, dst_buffer, dst_offset,
                 dst_strides, algorithm=None):
    """Enqueue dst[dst_offset + sum c_k dst_strides_k] = src[src_offset + sum c_k src_strides_k]
    for every coordinate c of ``shape``; offsets and strides in elements. ``algorithm`` (else
    ``DLPRIM_COPY_ALGO``) forces one of COPY_ALGORITHMS (an error where it does not apply)."""
    key = ("strided_copy", tuple(shape), dtype, src_offset, tuple(src_strides), dst_offset,
           tuple(dst_strides), algorithm, config.switches().forced.get("copy"), tuning.generation)
    plan = ctx.plans.get(key)
    if plan is None:
        plan = ctx.plans.put(key, _copy_plan(ctx, shape, dtype, src_offset, src_strides,
                                             dst_offset, dst_strides, algorithm))
    if plan is _NOTHING:
        return
    kernel, args, (src_slot, dst_slot), gsize, lsize = plan
    args = list(args)
    args[src_slot], args[dst_slot] = src_buffer, dst_buffer
    kernel(ctx.queue, gsize, lsize, *args)


# The plan of an empty copy (the plan cache stores no None).
_NOTHING = object()


def _copy_plan(ctx, shape, dtype, src_offset, src_strides, dst_offset, dst_strides, algorithm):
    """The copy's solver, chosen here, and its launch: (kernel, arguments with None for the two
    buffers, the buffers' argument slots, global size, local size), or _NOTHING."""
    total = math.prod(shape)
    if total == 0:
        return _NOTHING
    sizes, (src_st, dst_st) = merge_dimensions(tuple(shape), [list(src_strides), list(dst_strides)])
    extent = total + src_offset + dst_offset + sum((s - 1) * (abs(a) + abs(b)) for s, a, b in
                                                   zip(shape, src_strides, dst_strides))
    index_t, index_np = _index_type(extent)
    problem = CopyProblem(tuple(sizes), tuple(src_st), tuple(dst_st))
    if solver.select(ctx, "copy", problem, forced=algorithm).name == "tiles":
        return _transpose_tiles(ctx, dtype, index_t, index_np, sizes, src_st, dst_st,
                                problem.pair, src_offset, dst_offset)
    words = _copy_words(np.dtype(dtype).itemsize, sizes, src_st, dst_st, src_offset, dst_offset)
    if words is not None:
        # Whole 4-, 8- or 16-byte words of bits per work item: fewer index computations per byte
        # (a head split's permute moves rows of 64 floats) and wider accesses.
        cl_type, per = words
        sizes = sizes[:-1] + [sizes[-1] // per]
        src_st = [s // per for s in src_st[:-1]] + [1]
        dst_st = [s // per for s in dst_st[:-1]] + [1]
        src_offset, dst_offset, total = src_offset // per, dst_offset // per, total // per
        kernel = _kernel(ctx, "strided_copy", dtype, len(sizes), index_t, cl_type=cl_type)
    else:
        kernel = _kernel(ctx, "strided_copy", dtype, len(sizes), index_t)
    args = [index_np(total)] + [index_np(s) for s in sizes]
    src_slot = len(args)
    args += [None, index_np(src_offset)] + [index_np(s) for s in src_st]
    dst_slot = len(args)
    args += [None, index_np(dst_offset)] + [index_np(s) for s in dst_st]
    gsize, lsize = launch_size(ctx, total)
    return kernel, args, (src_slot, dst_slot), gsize, lsize


# The widest word a gather copy moves per work item, by its bytes.
_COPY_WORDS = ((16, "uint4"), (8, "uint2"), (4, "uint"))


def _copy_words(itemsize, sizes, src_st, dst_st, src_offset, dst_offset):
    """(OpenCL type, elements per word) of the widest word whose copies keep the copy's meaning:
    the innermost dimension contiguous in both tensors, and its size, both offsets and every
    other stride multiples of the word's elements (so each word starts on its own boundary: the
    buffers themselves are aligned to the device's base alignment). None where no word wider
    than an element applies."""
    if src_st[-1] != 1 or dst_st[-1] != 1:
        return None
    for nbytes, cl_type in _COPY_WORDS:
        per = nbytes // itemsize
        if per < 2 or nbytes % itemsize:
            continue
        if all(v % per == 0 for v in [sizes[-1], src_offset, dst_offset, *src_st[:-1],
                                      *dst_st[:-1]]):
            return cl_type, per
    return None


def _transpose_tiles(ctx, dtype, index_t, index_np, sizes, src_st, dst_st, pair, src_offset,
                     dst_offset):
    p, q = pair
    batch = [k for k in range(len(sizes)) if k not in pair]
    kernel = _kernel(ctx, "transpose_tiles", dtype, 1, index_t, batch_dims=len(batch))
    args = [index_np(sizes[p]), index_np(sizes[q])]
    for k in batch:
        args += [index_np(sizes[k]), index_np(src_st[k]), index_np(dst_st[k])]
    src_slot = len(args)
    args += [None, index_np(src_offset), index_np(src_st[q])]
    dst_slot = len(args)
    args += [None, index_np(dst_offset), index_np(dst_st[p])]
    count = math.prod(sizes[k] for k in batch)
    gsize = (-(-sizes[p] // 32) * 32, -(-sizes[q] // 32) * 8, count)
    return kernel, args, (src_slot, dst_slot), gsize, (32, 8, 1)


def _narrow_copy(x, dim, start, length):
    shape = list(x.shape)
    shape[dim] = length
    out = Tensor.empty(x.ctx, shape, x.dtype)
    strides = dense_strides(x.shape)
    strided_copy(x.ctx, shape, x.dtype, x.buffer, x.offset_elements + start * strides[dim], strides,
                 out.buffer, out.offset_elements, dense_strides(shape))
    return out


def _embed(grad, shape, dim, start):
    """A zero tensor of ``shape`` with ``grad`` copied in at ``start`` along ``dim``."""
    full = Tensor.zeros(grad.ctx, shape, grad.dtype)
    strides = dense_strides(shape)
    strided_copy(grad.ctx, grad.shape, grad.dtype, grad.buffer, grad.offset_elements,
                 dense_strides(grad.shape), full.buffer,
                 full.offset_elements + start * strides[dim], strides)
    return full


def narrow(x, dim, start, length):
    """``x`` restricted to [start, start + length) along ``dim`` (a copy; torch.narrow).
    ``start`` may be a 0-d integer Tensor, as torch allows (it is read back to the host)."""
    _check_tensor(x, "narrow")
    if x.ndim == 0:
        raise ShapeError("narrow: cannot narrow a 0-d tensor")
    dim = normalise_dim(dim, x.ndim, "narrow")
    size = x.shape[dim]
    if isinstance(start, Tensor) and start.ndim == 0 and start.dtype.kind in "iu":
        start = int(start.item())
    if not isinstance(start, (int, np.integer)) or not isinstance(length, (int, np.integer)):
        raise ShapeError(f"narrow: start and length must be ints, got {start!r}, {length!r}")
    if start < 0:
        start += size
    if not (0 <= start <= size) or length < 0 or start + length > size:
        raise ShapeError(f"narrow: [start, start + length) = [{start}, {start + length}) is not "
                         f"inside dimension {dim} of size {size}")
    out = _narrow_copy(x, dim, int(start), int(length))
    shape = x.shape
    return autograd.record(out, (x,), lambda g: (_embed(g, shape, dim, start),), "narrow")


def split(x, split_size_or_sections, dim=0):
    """torch.split: pieces of ``split_size_or_sections`` (the last may be smaller) or of the
    listed sizes along ``dim``; a tuple of tensors (copies)."""
    _check_tensor(x, "split")
    dim = normalise_dim(dim, x.ndim, "split")
    size = x.shape[dim]
    sizes = split_size_or_sections
    if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
        step = int(sizes)
        if step <= 0 and size > 0:
            raise ShapeError(f"split: split_size must be positive, got {step}")
        sections = [min(step, size - s) for s in range(0, size, step)] if size else [0]
    else:
        if not isinstance(sizes, (tuple, list)) or not all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in sizes):
            raise ShapeError(f"split: split_size_or_sections must be an int or a sequence of "
                             f"ints, got {sizes!r}")
        sections = [int(s) for s in sizes]
        if any(s < 0 for s in sections) or sum(sections) != size:
            raise ShapeError(f"split: sections {sections} must be non-negative and sum to the "
                             f"size {size} of dimension {dim}")
    pieces, start = [], 0
    for length in sections:
        pieces.append(narrow(x, dim, start, length))
        start += length
    return tuple(pieces)


def cat(tensors, dim=0):
    """Concatenate ``tensors`` (same dtype, same shape except along ``dim``) along ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise ShapeError("cat: expected a non-empty sequence of tensors")
    for t in tensors:
        _check_tensor(t, "cat")
    ctx = check_same_context(*tensors)
    first = tensors[0]
    if first.ndim == 0:
        raise ShapeError("cat: 0-d tensors cannot be concatenated")
    dim = normalise_dim(dim, first.ndim, "cat")
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            raise DTypeError(f"cat: tensors must share one dtype, got {first.dtype} and {t.dtype}")
        if t.ndim != first.ndim or any(a != b for k, (a, b) in enumerate(zip(t.shape, first.shape))
                                       if k != dim):
            raise ShapeError(f"cat: shapes {first.shape} and {t.shape} differ outside dimension {dim}")
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = Tensor.empty(ctx, shape, first.dtype)
    out_strides = dense_strides(shape)
    starts, start = [], 0
    for t in tensors:
        strided_copy(ctx, t.shape, t.dtype, t.buffer, t.offset_elements, dense_strides(t.shape),
                     out.buffer, out.offset_elements + start * out_strides[dim], out_strides)
        starts.append(start)
        start += t.shape[dim]

    def backward(g):
        return tuple(_narrow_copy(g, dim, s, t.shape[dim]) if t.requires_grad else None
                     for s, t in zip(starts, tensors))

    return autograd.record(out, tensors, backward, "cat")


def permute(x, dims):
    """The tensor with its dimensions reordered: out.shape[k] = x.shape[dims[k]] (a copy)."""
    _check_tensor(x, "permute")
    if not isinstance(dims, (tuple, list)):
        raise ShapeError(f"permute: dims must be a sequence of ints, got {dims!r}")
    dims = tuple(normalise_dim(d, x.ndim, "permute") for d in dims)
    if sorted(dims) != list(range(x.ndim)):
        raise ShapeError(f"permute: dims {dims} are not a permutation of range({x.ndim})")
    shape = tuple(x.shape[d] for d in dims)
    out = Tensor.empty(x.ctx, shape, x.dtype)
    src = dense_strides(x.shape)
    strided_copy(x.ctx, shape, x.dtype, x.buffer, x.offset_elements, [src[d] for d in dims],
                 out.buffer, out.offset_elements, dense_strides(shape))
    inverse = tuple(np.argsort(dims))
    return autograd.record(out, (x,), lambda g: (permute(g, inverse),), "permute")


def transpose(x, dim0, dim1):
    """``x`` with dimensions ``dim0`` and ``dim1`` swapped (a copy)."""
    _check_tensor(x, "transpose")
    if x.ndim == 0:
        return reshape(x, ())
    d0 = normalise_dim(dim0, x.ndim, "transpose")
    d1 = normalise_dim(dim1, x.ndim, "transpose")
    dims = list(range(x.ndim))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(x, dims)


def reshape(x, shape):
    """A view of ``x`` with ``shape`` (one entry may be -1)."""
    _check_tensor(x, "reshape")
    return x.reshape(shape)


def flatten(x, start_dim=0, end_dim=-1):
    """A view with dimensions start_dim..end_dim merged into one."""
    _check_tensor(x, "flatten")
    ndim = len(x.shape)
    if ndim == 0:
        return x.reshape((1,))
    if (start_dim.__class__ is int and end_dim.__class__ is int
            and -ndim <= start_dim < ndim and -ndim <= end_dim < ndim):
        # normalise_dim's checks for plain ints in range (every network's flatten).
        start, end = start_dim % ndim, end_dim % ndim
    else:
        start = normalise_dim(start_dim, ndim, "flatten")
        end = normalise_dim(end_dim, ndim, "flatten")
    if start > end:
        raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:]
    # A shape of x's size made of x's own dimensions: the view without reshape's checks.
    return x._view(shape)


def squeeze(x, dim=None):
    """A view without size-1 dimensions: all of them, or those of ``dim`` (an int or a tuple;
    a listed dimension whose size is not 1 is kept, as in torch)."""
    _check_tensor(x, "squeeze")
    if dim is None:
        drop = {k for k, s in enumerate(x.shape) if s == 1}
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        drop = {k for k in (normalise_dim(d, x.ndim, "squeeze") for d in dims)
                if x.ndim and x.shape[k] == 1}
    return x.reshape(tuple(s for k, s in enumerate(x.shape) if k not in drop))


def unsqueeze(x, dim):
    """A view with a size-1 dimension inserted at ``dim`` (in [-ndim-1, ndim])."""
    _check_tensor(x, "unsqueeze")
    dim = normalise_dim(dim, x.ndim + 1, "unsqueeze")
    return x.reshape(x.shape[:dim] + (1,) + x.shape[dim:])


def _pad_pairs(pad, ndim, mode):
    if not isinstance(pad, (tuple, list)) or len(pad) % 2:
        raise ShapeError(f"pad: expected a sequence of (before, after) pairs from the last "
                         f"dimension backwards, got {pad!r}")
    if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in pad):
        raise ShapeError(f"pad: pads must be ints, got {pad!r}")
    pad = [int(p) for p in pad]
    count = len(pad) // 2
    if count > ndim:
        raise ShapeError(f"pad: {count} padded dimensions for a {ndim}-d tensor")
    if mode != "constant":
        if count > 3 or ndim < count + 1:
            raise UnsupportedError(f"pad: mode {mode!r} pads the last 1 to 3 dimensions of a "
                                   f"tensor with at least one more dimension; got {count} padded "
                                   f"dimensions on a {ndim}-d tensor")
    befores, afters = [0] * ndim, [0] * ndim
    for k in range(count):
        befores[ndim - 1 - k], afters[ndim - 1 - k] = pad[2 * k], pad[2 * k + 1]
    return befores, afters


def pad(x, pad, mode="constant", value=None):
    """torch.nn.functional.pad: ``pad`` = (left, right, top, bottom, ...) from the last dimension
    backwards; negative pads crop. ``mode``: "constant" (``value``, default 0), "reflect" (mirror
    without repeating the edge; each pad must be smaller than its dimension), "replicate"
    (repeat the edge; the dimension must not be empty) or "circular" (wrap around; each pad at
    most the dimension's size). The last three pad the last 1 to 3 dimensions of a tensor with
    at least one more. As in torch, negative pads crop: "reflect" and "replicate" then read the
    input at the same coordinates as with the positive pads, "circular" wraps around the cropped
    tensor."""
    _check_tensor(x, "pad")
    if mode not in PAD_MODES:
        raise UnsupportedError(f"pad: mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    befores, afters = _pad_pairs(pad, x.ndim, mode)
    if mode == "circular" and min(befores + afters, default=0) < 0:
        # torch crops first, then wraps around the cropped tensor: a constant pad by the
        # negative amounts, then a circular one by the positive ones. (Reflect and replicate
        # read the input at coordinates o - before whatever the signs, as the kernel does.)
        crop = [min(int(p), 0) for p in pad]
        grow = [max(int(p), 0) for p in pad]
        return _pad(_pad(x, crop), grow, mode)
    value = 0.0 if value is None else value
    if not isinstance(value, (int, float, np.number)):
        raise DTypeError(f"pad: value must be a number, got {value!r}")
    shape = tuple(s + b + a for s, b, a in zip(x.shape, befores, afters))
    if any(s < 0 for s in shape):
        raise ShapeError(f"pad: padding {tuple(pad)} gives a negative size {shape} for input {x.shape}")
    for k, (s, b, a) in enumerate(zip(x.shape, befores, afters)):
        if mode == "reflect" and (b or a) and (b >= s or a >= s):
            raise ShapeError(f"pad: reflect padding ({b}, {a}) must be smaller than dimension {k} "
                             f"of size {s}")
        if mode == "replicate" and (b or a) and s == 0:
            raise ShapeError(f"pad: replicate padding of the empty dimension {k}")
        if mode == "circular" and (b or a) and (b > s or a > s):
            raise ShapeError(f"pad: circular padding ({b}, {a}) must be at most dimension {k} "
                             f"of size {s} (it would wrap around more than once)")
    out = Tensor.empty(x.ctx, shape, x.dtype)
    total = math.prod(shape)
    if total:
        index_t, index_np = _index_type(total, x.size + x.offset_elements, out.offset_elements + total)
        ndim = max(x.ndim, 1)
        kernel = _kernel(x.ctx, "pad", x.dtype, ndim, index_t, mode)
        args = [index_np(total)]
        for o, s, b in zip(shape or (1,), x.shape or (1,), befores or (0,)):
            args += [index_np(o), index_np(s), index_np(b)]
        args += [x.buffer, index_np(x.offset_elements), out.buffer, index_np(out.offset_elements),
                 x.dtype.type(value)]
        gsize, lsize = launch_size(x.ctx, total)
        kernel(x.ctx.queue, gsize, lsize, *args)
    in_shape = x.shape

    def backward(g):
        # Padding is separable: undo it one dimension at a time, from the last.
        for k in reversed(range(len(in_shape))):
            if befores[k] or afters[k]:
                g = _pad_backward_1d(g, k, in_shape[k], befores[k], afters[k], mode)
        return (g,)

    return autograd.record(out, (x,), backward, "pad")


_pad = pad


def _pad_backward_1d(grad, dim, in_len, before, after, mode):
    shape = list(grad.shape)
    shape[dim] = in_len
    out = Tensor.empty(grad.ctx, shape, grad.dtype)
    total = math.prod(shape)
    if total:
        inner = math.prod(shape[dim + 1:])
        index_t, index_np = _index_type(grad.size + grad.offset_elements, total + out.offset_elements)
        kernel = _kernel(grad.ctx, "pad_backward_1d", grad.dtype, 1, index_t, mode)
        gsize, lsize = launch_size(grad.ctx, total)
        kernel(grad.ctx.queue, gsize, lsize, index_np(total), index_np(in_len),
               index_np(grad.shape[dim]), index_np(inner), index_np(before), index_np(after),
               grad.buffer, index_np(grad.offset_elements), out.buffer, index_np(out.offset_elements))
    return out


def _positive_int(value, what):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def pixel_shuffle(x, upscale_factor):
    """torch.nn.functional.pixel_shuffle: ``(*, C * r^2, H, W)`` -> ``(*, C, H * r, W * r)`` with
    r = ``upscale_factor`` (a reshape, one permuting copy and a reshape, on the tape)."""
    _check_tensor(x, "pixel_shuffle")
    r = _positive_int(upscale_factor, "pixel_shuffle: upscale_factor")
    if x.ndim < 3:
        raise ShapeError(f"pixel_shuffle expects an input of at least 3 dimensions "
                         f"(*, C * r^2, H, W), got shape {x.shape}")
    *lead, c, h, w = x.shape
    if c % (r * r):
        raise ShapeError(f"pixel_shuffle: channels {c} are not divisible by upscale_factor^2 "
                         f"= {r * r}")
    lead = tuple(lead)
    b = len(lead)
    y = x.reshape(lead + (c // (r * r), r, r, h, w))
    y = permute(y, tuple(range(b)) + (b, b + 3, b + 1, b + 4, b + 2))
    return y.reshape(lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(x, downscale_factor):
    """torch.nn.functional.pixel_unshuffle: ``(*, C, H * r, W * r)`` -> ``(*, C * r^2, H, W)`` with
    r = ``downscale_factor``, the inverse of ``pixel_shuffle``."""
    _check_tensor(x, "pixel_unshuffle")
    r = _positive_int(downscale_factor, "pixel_unshuffle: downscale_factor")
    if x.ndim < 3:
        raise ShapeError(f"pixel_unshuffle expects an input of at least 3 dimensions "
                         f"(*, C, H * r, W * r), got shape {x.shape}")
    *lead, c, h, w = x.shape
    if h % r or w % r:
        raise ShapeError(f"pixel_unshuffle: height {h} and width {w} must be divisible by "
                         f"downscale_factor {r}")
    lead = tuple(lead)
    b = len(lead)
    y = x.reshape(lead + (c, h // r, r, w // r, r))
    y = permute(y, tuple(range(b)) + (b, b + 2, b + 4, b + 1, b + 3))
    return y.reshape(lead + (c * r * r, h // r, w // r))


def channel_shuffle(x, groups):
    """torch.nn.functional.channel_shuffle: ``(N, C, *)`` with its C channels seen as
    (groups, C / groups) and transposed to (C / groups, groups) (ShuffleNet's shuffle)."""
    _check_tensor(x, "channel_shuffle")
    g = _positive_int(groups, "channel_shuffle: groups")
    if x.ndim < 3:
        raise ShapeError(f"channel_shuffle expects an input of more than 2 dimensions "
                         f"(N, C, *), got shape {x.shape}")
    n, c = x.shape[:2]
    if c % g:
        raise ShapeError(f"channel_shuffle: channels {c} are not divisible by groups {g}")
    rest = math.prod(x.shape[2:])
    y = permute(x.reshape(n, g, c // g, rest), (0, 2, 1, 3))
    return y.reshape(x.shape)
