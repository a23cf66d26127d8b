"""Resampling: torch.nn.functional.interpolate with modes nearest, linear (3-d), bilinear (4-d,
with or without align_corners) and area (adaptive average pooling).

Each axis gets a small table of source indices and weights (and, for backward, the range of
outputs that read each input) made once per (sizes, mode, scale) on the host with torch's own
arithmetic, and kept on the device; the kernels (``kernels/interpolate.cl.mako``) read them, so
one compile per mode serves every size. Layout NCHW / NCW, float32.
"""
import math

import numpy as np

from .. import autograd, program
from ..dtypes import float32
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import bind
from ..tensor import Tensor
from .pointwise import launch_size

MODES = ("nearest", "linear", "bilinear", "area")
_INT32_LIMIT = 2 ** 31 - 1


def axis_table(in_size, out_size, mode, align_corners=False, scale_factor=None):
    """(index, lambda) numpy arrays of one axis, laid out as ``kernels/interpolate.cl.mako``
    describes. ``mode``: "nearest" or "linear"; ``scale_factor``: the user's factor when the
    output size came from it (torch then uses 1 / factor as the step)."""
    o = np.arange(out_size)
    if mode == "nearest":
        # torch computes this step in float32 whatever the tensor's dtype.
        if out_size == in_size:
            first = o
        elif out_size == 2 * in_size:
            first = o >> 1
        else:
            step = (np.float32(1.0 / scale_factor) if scale_factor else
                    np.float32(in_size) / np.float32(out_size))
            first = np.minimum(np.floor(o.astype(np.float32) * step).astype(np.int64), in_size - 1)
        second, lam = first, np.zeros(out_size)
    else:
        if align_corners:
            step = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
            source = step * o
        else:
            step = 1.0 / scale_factor if scale_factor else in_size / out_size
            source = np.maximum(step * (o + 0.5) - 0.5, 0.0)
        first = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
        lam = np.clip(source - first, 0.0, 1.0)
        second = first + (first < in_size - 1)
    lo = np.full(in_size, out_size, dtype=np.int64)
    hi = np.zeros(in_size, dtype=np.int64)
    for source_index in (first, second):
        np.minimum.at(lo, source_index, o)
        np.maximum.at(hi, source_index, o + 1)
    lo = np.where(hi == 0, 0, lo)
    index = np.concatenate([first, second, lo, hi]).astype(np.int32)
    return index, lam.astype(np.float32)


def _device_table(ctx, in_size, out_size, mode, align_corners, scale_factor):
    # The plan cache holds the tables' tensors (and so their buffers) while plans may use them.
    key = ("interpolate.table", in_size, out_size, mode, bool(align_corners), scale_factor)
    table = ctx.plans.get(key)
    if table is None:
        index, lam = axis_table(in_size, out_size, mode, align_corners, scale_factor)
        table = ctx.plans.put(key, (Tensor.from_numpy(ctx, index), Tensor.from_numpy(ctx, lam)))
    return table


def _normalise_sizes(input, size, scale_factor, spatial, allow_empty=False):
    """(output sizes, scale factors or None); ``allow_empty``: sizes of 0 are fine ("area",
    adaptive pooling, as in torch)."""
    in_sizes = input.shape[2:]
    least = 0 if allow_empty else 1
    if (size is None) == (scale_factor is None):
        raise ShapeError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * spatial if isinstance(size, (int, np.integer)) else tuple(size)
        if len(sizes) != spatial or any(not isinstance(s, (int, np.integer)) or s < least for s in sizes):
            raise ShapeError(f"interpolate: size must be {spatial} ints >= {least} for input "
                             f"{input.shape}, got {size!r}")
        return tuple(int(s) for s in sizes), (None,) * spatial
    factors = ((scale_factor,) * spatial if isinstance(scale_factor, (int, float, np.number))
               else tuple(scale_factor))
    if len(factors) != spatial or any(not f > 0 for f in factors):
        raise ShapeError(f"interpolate: scale_factor must be {spatial} positive numbers for input "
                         f"{input.shape}, got {scale_factor!r}")
    sizes = tuple(int(math.floor(float(s) * float(f))) for s, f in zip(in_sizes, factors))
    if any(s < least for s in sizes):
        raise ShapeError(f"interpolate: scale_factor {scale_factor!r} gives an empty output for "
                         f"input {input.shape}")
    return sizes, tuple(float(f) for f in factors)


def _kernel(ctx, kind, name, *tensors):
    """The kernel ``name`` for ``kind`` with 32-bit indices where the tensors allow them
    (64-bit division is many times slower on GPUs)."""
    largest = max(t.offset_elements + t.size for t in tensors)
    index_t, index_np = ("int", np.int32) if largest < _INT32_LIMIT else ("long", np.int64)
    # Bound: a recording (a planned network) keeps its launches.
    return bind(program.kernel(ctx, "interpolate", name, dict(mode=kind, index_t=index_t))), index_np


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """torch.nn.functional.interpolate on (N, C, W) or (N, C, H, W) float32 tensors.

    Modes: "nearest" (3-d, 4-d), "linear" (3-d), "bilinear" (4-d), "area" (4-d, adaptive
    average pooling). ``align_corners`` applies to the linear modes only.

    Limitations (UnsupportedError), all accepted by torch: 5-d inputs, "area" on 3-d inputs,
    the modes "bicubic", "trilinear" and "nearest-exact", and ``antialias``.
    """
    if not isinstance(input, Tensor):
        raise not_a_tensor("interpolate: input", input)
    if input.dtype != float32:
        raise DTypeError(f"interpolate: input must be float32, got {input.dtype}")
    if mode not in MODES:
        raise UnsupportedError(f"interpolate: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if antialias:
        raise UnsupportedError("interpolate: antialias is not supported")
    spatial = input.ndim - 2
    wanted = {"linear": (1,), "bilinear": (2,), "nearest": (1, 2), "area": (2,)}[mode]
    # torch's ranks: a rank torch refuses is a ShapeError, one only this library lacks is not.
    torch_ranks = {"linear": (1,), "bilinear": (2,), "nearest": (1, 2, 3), "area": (1, 2, 3)}[mode]
    if spatial not in wanted:
        error = UnsupportedError if spatial in torch_ranks else ShapeError
        raise error(f"interpolate: mode {mode!r} expects a "
                    f"{' or '.join(f'{w + 2}-d' for w in wanted)} input, got shape {input.shape}")
    linear = mode in ("linear", "bilinear")
    if align_corners is not None and not linear:
        raise ShapeError(f"interpolate: align_corners applies to the linear modes, not {mode!r}")
    sizes, factors = _normalise_sizes(input, size, scale_factor, spatial, allow_empty=mode == "area")
    if recompute_scale_factor:
        factors = (None,) * spatial
    if mode == "area":
        from .pool import adaptive_avg_pool2d
        return adaptive_avg_pool2d(input, sizes)
    align = bool(align_corners) if linear else False
    kind = "linear" if linear else "nearest"
    if spatial == 1:
        H, W, OH, OW = 1, input.shape[2], 1, sizes[0]
        factor_h, factor_w = None, factors[0]
    else:
        (H, W), (OH, OW) = input.shape[2:], sizes
        factor_h, factor_w = factors
    ctx = input.ctx
    h_table = _device_table(ctx, H, OH, kind, align, factor_h)
    w_table = _device_table(ctx, W, OW, kind, align, factor_w)
    out = Tensor.empty(ctx, input.shape[:2] + tuple(sizes), float32)
    sizes_args = (np.int32(H), np.int32(W), np.int32(OH), np.int32(OW),
                  h_table[0].buffer, h_table[1].buffer, w_table[0].buffer, w_table[1].buffer)
    if out.size and H * W:
        kernel, index_np = _kernel(ctx, kind, "interpolate_forward", input, out)
        gsize, lsize = launch_size(ctx, out.size)
        kernel(ctx.queue, gsize, lsize, index_np(out.size), *sizes_args, input.buffer,
               index_np(input.offset_elements), out.buffer, index_np(out.offset_elements))

    def backward(g):
        dx = Tensor.empty(ctx, input.shape, float32)
        if dx.size:
            kernel, index_np = _kernel(ctx, kind, "interpolate_backward", g, dx)
            gsize, lsize = launch_size(ctx, dx.size)
            kernel(ctx.queue, gsize, lsize, index_np(dx.size), *sizes_args, g.buffer,
                   index_np(g.offset_elements), dx.buffer, index_np(dx.offset_elements))
        return (dx,)

    return autograd.record(out, (input,), backward, f"interpolate_{mode}")
