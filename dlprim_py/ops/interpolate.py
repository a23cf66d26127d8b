"""Resampling: torch.nn.functional.interpolate (modes nearest, nearest-exact, linear, bilinear,
bicubic, trilinear, area; antialiased bilinear and bicubic) and ONNX's Resize (``resize``: nearest, linear, cubic with every
coordinate transformation and rounding mode).

Every mode is a separable weighted sum: each axis gets a small table of taps (source indices
and weights per output) and, for the backward, the transposed lists (the outputs that read each
input, with their weights), made once per (sizes, mode, options) on the host with the
reference's own arithmetic and kept on the device. The kernels
(``kernels/interpolate.cl.mako``) read them, so one compile per tap count serves every size:
nearest and nearest-exact have one tap per axis, the linear modes two, the cubic modes four,
area (adaptive average pooling) and the antialiased modes a run-time count (the longest
window). Layout N, C, then one to
three spatial axes, float32.
"""
import math

import numpy as np

from .. import autograd, program
from ..dtypes import float32
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import bind
from ..tensor import Tensor
from .pointwise import launch_size

MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")
# Spatial ranks torch accepts per mode.
_RANKS = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "area": (1, 2, 3), "linear": (1,),
          "bilinear": (2,), "bicubic": (2,), "trilinear": (3,)}
_LINEAR_MODES = ("linear", "bilinear", "bicubic", "trilinear")
# Taps per resampled axis (0: the run-time count of area's windows).
_TAPS = {"nearest": 1, "nearest-exact": 1, "linear": 2, "bilinear": 2, "trilinear": 2,
         "bicubic": 4, "area": 0}
_INT32_LIMIT = 2 ** 31 - 1

RESIZE_MODES = ("nearest", "linear", "cubic")
RESIZE_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                           "align_corners", "asymmetric", "tf_half_pixel_for_nn")
RESIZE_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


# ---- per-axis taps (host, numpy) -----------------------------------------------------------

def _cubic_coefficients(t, a):
    """The four weights of Keys' cubic convolution at fraction ``t`` (taps at -1, 0, 1, 2),
    as torch and ONNX write them."""
    def near(x):   # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):    # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1)


def _clamped_taps(first, count, in_size):
    return np.clip(first[:, None] + np.arange(count)[None, :], 0, in_size - 1)


def torch_taps(in_size, out_size, mode, align_corners=False, scale_factor=None, spatial=2):
    """(index, weight) arrays of shape (out_size, taps) of one axis for torch's ``mode``;
    ``scale_factor``: the user's factor when the output size came from it (torch then uses
    1 / factor as the step); ``spatial``: the input's spatial rank (torch's 2-d nearest
    takes sizes equal and doubled as they are, whatever the factor; its 1-d and 3-d do not)."""
    o = np.arange(out_size)
    if mode in ("nearest", "nearest-exact"):
        # torch computes these steps in float32 whatever the tensor's dtype (nearest_idx,
        # nearest_exact_idx in ATen's UpSample.h).
        step = (np.float32(1.0 / scale_factor) if scale_factor else
                np.float32(in_size) / np.float32(out_size))
        if mode == "nearest-exact":
            # floorf((o + 0.5) * step): the product in double, rounded to float by floorf.
            source = np.floor(((o + 0.5) * np.float64(step)).astype(np.float32))
        elif out_size == in_size and spatial == 2:
            source = o
        elif out_size == 2 * in_size and spatial == 2:
            source = o >> 1
        else:
            source = np.floor(o.astype(np.float32) * step)
        index = np.minimum(source.astype(np.int64), in_size - 1)[:, None]
        return index, np.ones((out_size, 1))
    if mode == "area":
        # Adaptive average pooling's windows [floor(o * n / m), ceil((o + 1) * n / m)).
        start = (o * in_size) // out_size
        end = -((-(o + 1) * in_size) // out_size)
        length = end - start
        taps = int(length.max()) if out_size else 1
        t = np.arange(taps)[None, :]
        inside = t < length[:, None]
        index = np.where(inside, start[:, None] + t, start[:, None] if out_size else 0)
        weight = np.where(inside, 1.0 / length[:, None], 0.0)
        return index, weight
    cubic = mode == "bicubic"
    if align_corners:
        step = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        source = step * o
    else:
        step = 1.0 / scale_factor if scale_factor else in_size / out_size
        source = step * (o + 0.5) - 0.5
        if not cubic:
            source = np.maximum(source, 0.0)
    first = np.minimum(np.floor(source).astype(np.int64), in_size - 1)
    lam = np.clip(source - first, 0.0, 1.0)
    if cubic:
        # Taps first - 1 .. first + 2 read clamped into the input (torch's border handling).
        return _clamped_taps(first - 1, 4, in_size), _cubic_coefficients(lam, -0.75)
    second = first + (first < in_size - 1)
    return np.stack([first, second], axis=1), np.stack([1.0 - lam, lam], axis=1)


def _antialias_filter(mode, x):
    """torch's antialiasing filters (Pillow's): the triangle, and Keys' cubic with a = -0.5."""
    x = np.abs(x)
    if mode == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    return np.where(x < 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
                    np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0))


def antialias_taps(in_size, out_size, mode, align_corners=False, scale_factor=None):
    """(index, weight) arrays of one axis for torch's bilinear or bicubic with
    ``antialias=True``: where it shrinks, the filter stretched by the scale over a window of
    the inputs around each output's centre, its weights normalised to sum to 1 (ATen's
    _compute_indices_min_size_weights_aa, float path)."""
    if align_corners:
        scale = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor else in_size / out_size
    half = 1.0 if mode == "bilinear" else 2.0
    support = half * scale if scale >= 1.0 else half
    longest = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    index = np.zeros((out_size, longest), np.int64)
    weight = np.zeros((out_size, longest))
    for o in range(out_size):
        center = scale * (o + 0.5)
        first = max(int(center - support + 0.5), 0)   # int(): truncation, as in C
        count = min(max(min(int(center + support + 0.5), in_size) - first, 0), longest)
        taps = np.arange(count)
        w = _antialias_filter(mode, (taps + first - center + 0.5) * invscale)
        total = w.sum()
        if total != 0.0:
            w = w / total
        index[o, :count] = first + taps
        index[o, count:] = min(first, in_size - 1)
        weight[o, :count] = w
    return index, weight


def onnx_source_coordinates(in_size, out_size, mode, scale):
    """The source coordinate of each output of one axis under ONNX's
    coordinate_transformation_mode ``mode``, in float32 with onnxruntime's order of operations
    (a rounding mode's choice at a half depends on the last bit); ``scale`` is float32."""
    f = np.float32
    o = np.arange(out_size, dtype=np.float32)
    half = f(0.5)
    if mode == "half_pixel":
        return (o + half) / scale - half
    if mode == "half_pixel_symmetric":
        # The centre of the input stays the centre of the output when the output size is not
        # scale * input size exactly (onnxruntime: the offset in float32, the rest in double).
        adjustment = f(out_size) / (scale * f(in_size))
        offset = f(in_size) / f(2) * (f(1) - adjustment)
        o = o.astype(np.float64)
        return (np.float64(offset) + (o + 0.5) / np.float64(scale) - 0.5).astype(np.float32)
    if mode == "pytorch_half_pixel":
        return (o + half) / scale - half if out_size > 1 else np.zeros(out_size, np.float32)
    if mode == "align_corners":
        if out_size == 1:
            return np.zeros(1, np.float32)
        return o * f(in_size - 1) / f(out_size - 1)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nn":
        return (o + half) / scale
    raise UnsupportedError(f"resize: coordinate_transformation_mode {mode!r} is not supported")


def onnx_taps(in_size, out_size, mode, coordinate_mode, nearest_mode, cubic_coeff_a,
              exclude_outside, scale):
    """(index, weight) arrays of shape (out_size, taps) of one axis for ONNX Resize;
    ``scale``: the model's scale of the axis, else None (then out_size / in_size)."""
    scale = np.float32(scale) if scale is not None else np.float32(out_size) / np.float32(in_size)
    if scale == 1:
        # onnxruntime takes the output coordinate as it is where an axis keeps its scale.
        source = np.arange(out_size, dtype=np.float32)
    else:
        source = onnx_source_coordinates(in_size, out_size, coordinate_mode, scale)
    x = source.astype(np.float64)   # exact: every float32 is a float64
    if mode == "nearest":
        if nearest_mode == "floor":
            index = np.floor(x)
        elif nearest_mode == "ceil":
            index = np.ceil(x)
        else:
            # std::round (halves away from zero); round_prefer_floor takes the floor at a half.
            index = np.sign(x) * np.floor(np.abs(x) + 0.5)
            if nearest_mode == "round_prefer_floor":
                index = np.where(x == np.trunc(x) + 0.5, np.floor(x), index)
        index = np.clip(index, 0, in_size - 1).astype(np.int64)[:, None]
        return index, np.ones((out_size, 1))
    if mode == "linear":
        x = np.clip(source, np.float32(0), np.float32(in_size - 1))
        first = np.minimum(x.astype(np.int64), in_size - 1)
        second = np.minimum(first + 1, in_size - 1)
        lam = (x - first.astype(np.float32)).astype(np.float64)
        # At the last input both taps read it: weights 1 - lambda and lambda still sum to 1.
        return np.stack([first, second], axis=1), np.stack([1.0 - lam, lam], axis=1)
    first = np.floor(x).astype(np.int64)
    weight = _cubic_coefficients(x - first, float(np.float32(cubic_coeff_a)))
    taps = first[:, None] - 1 + np.arange(4)[None, :]
    if exclude_outside:
        weight = np.where((taps >= 0) & (taps < in_size), weight, 0.0)
        weight = weight / weight.sum(axis=1, keepdims=True)
    return np.clip(taps, 0, in_size - 1), weight


def pack_axis(in_size, index, weight):
    """The device tables of one axis (``kernels/interpolate.cl.mako`` describes them) from its
    taps: (int32 array, float32 array, taps per output)."""
    out_size, taps = index.shape
    # Backward's lists: (input, output) pairs sorted by input, taps of one output that hit the
    # same input merged (border clamping, the last linear tap), zero weights dropped.
    inputs = index.reshape(-1).astype(np.int64)
    outputs = np.repeat(np.arange(out_size, dtype=np.int64), taps)
    pairs, where = np.unique(inputs * max(out_size, 1) + outputs, return_inverse=True)
    merged = np.bincount(where.reshape(-1), weights=weight.reshape(-1), minlength=len(pairs))
    keep = merged != 0
    pairs, merged = pairs[keep], merged[keep]
    entry_input, entry_output = pairs // max(out_size, 1), pairs % max(out_size, 1)
    pointers = np.concatenate([[0], np.cumsum(np.bincount(entry_input, minlength=in_size))])
    # One spare element each: no table is empty (a zero-size buffer is not allowed).
    ints = np.concatenate([index.reshape(-1), pointers, entry_output, [0]]).astype(np.int32)
    floats = np.concatenate([weight.reshape(-1), merged, [0.0]]).astype(np.float32)
    return ints, floats, taps


_IDENTITY = (np.zeros((1, 1), np.int64), np.ones((1, 1)))


def _device_table(ctx, key, in_size, make_taps):
    """(int tensor, float tensor, taps) of one axis, made once per ``key``: the plan cache
    holds the tables' tensors (and so their buffers) while plans may use them."""
    key = ("interpolate.table",) + key
    table = ctx.plans.get(key)
    if table is None:
        ints, floats, taps = pack_axis(in_size, *make_taps())
        table = ctx.plans.put(key, (Tensor.from_numpy(ctx, ints), Tensor.from_numpy(ctx, floats),
                                    taps))
    return table


def _geometry(ctx, key, input, out_spatial, make_tables):
    """(output shape, size arguments, taps template, tables) of a call, made once per ``key``;
    ``make_tables()`` gives a ``_Tables`` (called on the first call only)."""
    geometry = ctx.plans.get(key)
    if geometry is not None:
        return geometry
    table_of = make_tables()
    in_spatial = input.shape[2:]
    pad = 3 - len(in_spatial)
    tables, sizes_in, sizes_out = [], [], []
    for axis in range(3):
        if axis < pad:
            tables.append(_device_table(ctx, ("identity",), 1, lambda: _IDENTITY))
            sizes_in.append(1)
            sizes_out.append(1)
        else:
            n, m = in_spatial[axis - pad], out_spatial[axis - pad]
            tables.append(table_of(axis - pad, n, m))
            sizes_in.append(n)
            sizes_out.append(m)
    taps = tuple(t[2] for t in tables)
    args = tuple(np.int32(s) for s in sizes_in + sizes_out) + tuple(np.int32(t) for t in taps)
    for ints, floats, _ in tables:
        args += (ints.buffer, floats.buffer)
    # The kernels take the tap counts as constants (one compile per count, any size) except
    # area's, whose windows' lengths depend on the sizes: run-time counts on every axis.
    template = taps if table_of.fixed_taps else (0, 0, 0)
    out_shape = tuple(input.shape[:2]) + tuple(out_spatial)
    # The tables ride along so that the plan keeps their buffers alive.
    return ctx.plans.put(key, (out_shape, args, template, tuple(tables)))


def _launch(ctx, name, template, sizes_args, src, dst):
    """Enqueue ``name`` (forward: src = input, dst = output; backward: src = output's gradient,
    dst = input's gradient) over every element of ``dst``, through the plan cache."""
    total = dst.size
    wide = max(src.offset_elements + src.size, dst.offset_elements + total) >= _INT32_LIMIT
    key = ("interpolate", name, template, wide, total)
    plan = ctx.plans.get(key)
    if plan is None:
        # 32-bit indices where the tensors allow them (64-bit division is many times slower
        # on GPUs).
        index_t = "long" if wide else "int"
        kernel = bind(program.kernel(ctx, "interpolate", name,
                                     dict(taps=template, index_t=index_t)))
        gsize, lsize = launch_size(ctx, total)
        plan = ctx.plans.put(key, (kernel, gsize, lsize, np.int64 if wide else np.int32))
    kernel, gsize, lsize, index_np = plan
    kernel(ctx.queue, gsize, lsize, index_np(total), *sizes_args, src.buffer,
           index_np(src.offset_elements), dst.buffer, index_np(dst.offset_elements))


def _resample(input, key, out_spatial, make_tables, name):
    """The output of resampling ``input`` to ``out_spatial`` with the axis tables of
    ``make_tables()``, with its backward on the tape; ``key``: everything the tables and the
    output shape depend on."""
    ctx = input.ctx
    out_shape, sizes_args, template, _ = _geometry(ctx, key, input, out_spatial, make_tables)
    out = Tensor.empty(ctx, out_shape, float32)
    if out.size and input.size:
        _launch(ctx, "interpolate_forward", template, sizes_args, input, out)
    elif out.size:
        out.fill_(0.0)
    if not autograd.needs_grad(input):
        return out
    shape = input.shape

    def backward(g):
        dx = Tensor.empty(ctx, shape, float32)
        if dx.size and g.size:
            _launch(ctx, "interpolate_backward", template, sizes_args, g, dx)
        elif dx.size:
            dx.fill_(0.0)
        return (dx,)

    return autograd.record(out, (input,), backward, name)


class _Tables:
    """Axis tables of one call: ``self(axis, in size, out size)`` gives the device table;
    ``fixed_taps``: whether the kernels fix the tap counts at compile time."""

    def __init__(self, ctx, key, make_taps, fixed_taps):
        self.ctx, self.key, self.make_taps = ctx, key, make_taps
        self.fixed_taps = fixed_taps

    def __call__(self, axis, in_size, out_size):
        return _device_table(self.ctx, self.key(axis) + (in_size, out_size), in_size,
                             lambda: self.make_taps(axis, in_size, out_size))


# ---- torch.nn.functional.interpolate -------------------------------------------------------

def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _normalise_sizes(input, size, scale_factor, spatial, allow_empty=False):
    """(output sizes, scale factors or None); ``allow_empty``: sizes of 0 are fine ("area",
    adaptive pooling, as in torch)."""
    in_sizes = input.shape[2:]
    least = 0 if allow_empty else 1
    if (size is None) == (scale_factor is None):
        raise ShapeError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * spatial if _is_int(size) else tuple(size)
        if len(sizes) != spatial or any(not _is_int(s) or s < least for s in sizes):
            raise ShapeError(f"interpolate: size must be {spatial} ints >= {least} for input "
                             f"{input.shape}, got {size!r}")
        return tuple(int(s) for s in sizes), (None,) * spatial
    factors = ((scale_factor,) * spatial if _is_number(scale_factor) else tuple(scale_factor))
    if len(factors) != spatial or any(not _is_number(f) or not f > 0 or not math.isfinite(f)
                                      for f in factors):
        raise ShapeError(f"interpolate: scale_factor must be {spatial} positive numbers for input "
                         f"{input.shape}, got {scale_factor!r}")
    sizes = tuple(int(math.floor(float(s) * float(f))) for s, f in zip(in_sizes, factors))
    if any(s < least for s in sizes):
        raise ShapeError(f"interpolate: scale_factor {scale_factor!r} gives an empty output for "
                         f"input {input.shape}")
    return sizes, tuple(float(f) for f in factors)


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """torch.nn.functional.interpolate on float32 tensors of 1 to 3 spatial axes.

    Parameters
    ----------
    input : Tensor
        (N, C, W), (N, C, H, W) or (N, C, D, H, W), float32.
    size : int or tuple of int, optional
        Output spatial size (one of ``size`` and ``scale_factor``).
    scale_factor : float or tuple of float, optional
        Multiplier of each spatial size (output size ``floor(size * factor)``); the
        coordinates use ``1 / factor`` unless ``recompute_scale_factor`` is true.
    mode : str
        "nearest" (3-d to 5-d), "nearest-exact" (3-d to 5-d), "linear" (3-d), "bilinear"
        (4-d), "bicubic" (4-d, cubic coefficient -0.75, borders clamped), "trilinear" (5-d) or
        "area" (3-d to 5-d: adaptive average pooling, any output size).
    align_corners : bool, optional
        For the linear and cubic modes only (default False), as in torch.
    recompute_scale_factor : bool, optional
        With ``scale_factor``: compute the coordinates from the output size, not the factor.
    antialias : bool
        "bilinear" and "bicubic" only: where the output is smaller, the filter widens with the
        scale (torch's and Pillow's antialiasing; the cubic's coefficient is then -0.5).

    Returns
    -------
    Tensor
        ``(N, C) + size``, with its backward on the tape.

    Notes
    -----
    The backward is the exact transpose of the forward. torch's own 1-d and 3-d "nearest"
    backward departs from its forward in one case: with a ``scale_factor`` whose output size
    is the input size or twice it (2.2 on 4 elements, say), its forward steps by
    1 / factor but its backward takes each input once or twice in order, so its gradient is
    not its forward's; here both follow the forward.

    Raises
    ------
    ShapeError
        What torch refuses: a rank the mode does not take, ``align_corners`` with nearest,
        nearest-exact or area, both or neither of ``size`` and ``scale_factor``,
        ``recompute_scale_factor`` with ``size``, an empty input or output (but "area" may
        give an empty output, as in torch), ``antialias`` outside 4-d bilinear and bicubic.
    UnsupportedError
        An unknown mode.
    """
    if not isinstance(input, Tensor):
        raise not_a_tensor("interpolate: input", input)
    if input.dtype != float32:
        raise DTypeError(f"interpolate: input must be float32, got {input.dtype}")
    if mode not in MODES:
        raise UnsupportedError(f"interpolate: mode must be one of {', '.join(MODES)}, got {mode!r}")
    spatial = input.ndim - 2
    if spatial not in _RANKS[mode]:
        raise ShapeError(f"interpolate: mode {mode!r} expects a "
                         f"{' or '.join(f'{r + 2}-d' for r in _RANKS[mode])} input, got shape "
                         f"{input.shape}")
    linear = mode in _LINEAR_MODES
    if align_corners is not None and not linear:
        raise ShapeError(f"interpolate: align_corners applies to the linear and cubic modes, "
                         f"not {mode!r}")
    if antialias and mode not in ("bilinear", "bicubic"):
        raise ShapeError(f"interpolate: antialias applies to 4-d bilinear and bicubic only, not "
                         f"{mode!r}")
    antialias = bool(antialias)
    if recompute_scale_factor and size is not None:
        raise ShapeError("interpolate: recompute_scale_factor is not meaningful with an "
                         "explicit size")
    if any(s < 1 for s in input.shape[2:]):
        raise ShapeError(f"interpolate: input spatial sizes must be >= 1, got shape {input.shape}")
    sizes, factors = _normalise_sizes(input, size, scale_factor, spatial,
                                      allow_empty=mode == "area")
    if recompute_scale_factor or mode == "area":
        factors = (None,) * spatial
    align = bool(align_corners) if linear else False
    ctx = input.ctx
    key = ("interpolate.geometry", mode, align, antialias, input.shape, sizes, factors)
    if antialias:
        # Windows whose length depends on the sizes: area's run-time tap counts.
        return _resample(input, key, sizes, lambda: _Tables(
            ctx, lambda axis: (mode, "antialias", align, factors[axis]),
            lambda axis, n, m: antialias_taps(n, m, mode, align, factors[axis]), False),
            f"interpolate_{mode}_antialias")
    return _resample(input, key, sizes, lambda: _Tables(
        ctx, lambda axis: (mode, align, factors[axis], spatial == 2),
        lambda axis, n, m: torch_taps(n, m, mode, align, factors[axis], spatial),
        _TAPS[mode] != 0),
        f"interpolate_{mode}")


# ---- ONNX Resize ---------------------------------------------------------------------------

def _check_choice(name, value, choices):
    if value not in choices:
        raise UnsupportedError(f"resize: {name} {value!r} is not supported (supported: "
                               f"{', '.join(choices)})")


def resize(x, out_size, *, mode="nearest", coordinate_transformation_mode="half_pixel",
           nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False,
           scales=None):
    """ONNX Resize (opsets 13 to 19, without antialias) of the H and W axes of an NCHW tensor.

    Parameters
    ----------
    x : Tensor
        (N, C, H, W), float32.
    out_size : tuple of int
        (OH, OW), or the whole output shape (N, C, OH, OW).
    mode : str
        "nearest", "linear" or "cubic".
    coordinate_transformation_mode : str
        "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric" or "tf_half_pixel_for_nn" ("tf_crop_and_resize" raises UnsupportedError).
    nearest_mode : str
        "round_prefer_floor", "round_prefer_ceil", "floor" or "ceil" (mode "nearest").
    cubic_coeff_a : float
        The cubic convolution's coefficient (mode "cubic").
    exclude_outside : bool
        Mode "cubic": taps outside the input get weight 0 and the others are renormalised (the
        other modes read nothing outside).
    scales : tuple of float, optional
        (scale_h, scale_w), or four scales with 1 for N and C, when the model gave scales:
        the coordinates then use them rather than OH / H and OW / W (the caller gives
        ``out_size`` as ONNX computes it, ``floor(H * scale_h)`` and so on).

    Returns
    -------
    Tensor
        (N, C, OH, OW); its backward (the transposed weights) is on the tape.

    Notes
    -----
    Source coordinates are computed in float32 in onnxruntime's order of operations, so that
    the nearest mode rounds as onnxruntime does; where a coordinate lies within a float32
    rounding of a half (or of an integer for floor and ceil), onnxruntime's compiled arithmetic
    can land on the other side (seen for asymmetric round_prefer_ceil at 7 -> 4, and for
    half_pixel_symmetric with scales such as 0.6), and so may the element chosen.
    Where an axis keeps its size with a scale of 1, or the output has the input's shape,
    the input is taken as it is, as onnxruntime does.

    Raises
    ------
    UnsupportedError
        An attribute value outside those above, naming the attribute and the value.
    ShapeError, DTypeError
        ``x`` not a 4-d float32 tensor, sizes or scales not positive.
    """
    if not isinstance(x, Tensor):
        raise not_a_tensor("resize: x", x)
    if x.dtype != float32:
        raise DTypeError(f"resize: x must be float32, got {x.dtype}")
    if x.ndim != 4:
        raise ShapeError(f"resize: x must be 4-d (N, C, H, W), got shape {x.shape}")
    _check_choice("mode", mode, RESIZE_MODES)
    _check_choice("coordinate_transformation_mode", coordinate_transformation_mode,
                  RESIZE_COORDINATE_MODES)
    if mode == "nearest":
        _check_choice("nearest_mode", nearest_mode, RESIZE_NEAREST_MODES)
    if not _is_number(cubic_coeff_a) or not math.isfinite(cubic_coeff_a):
        raise ShapeError(f"resize: cubic_coeff_a must be a finite number, got {cubic_coeff_a!r}")
    sizes = tuple(out_size) if isinstance(out_size, (tuple, list, np.ndarray)) else None
    if sizes is None or len(sizes) not in (2, 4) or not all(_is_int(s) and s >= 1 for s in sizes):
        raise ShapeError(f"resize: out_size must be 2 (or 4) ints >= 1, got {out_size!r}")
    if len(sizes) == 4:
        if tuple(sizes[:2]) != tuple(x.shape[:2]):
            raise UnsupportedError(f"resize: resizing N and C is not supported (input {x.shape}, "
                                   f"out_size {out_size!r})")
        sizes = sizes[2:]
    sizes = tuple(int(s) for s in sizes)
    if scales is not None:
        scales = tuple(scales) if isinstance(scales, (tuple, list, np.ndarray)) else None
        if (scales is None or len(scales) not in (2, 4)
                or not all(_is_number(s) and s > 0 and math.isfinite(s) for s in scales)):
            raise ShapeError(f"resize: scales must be 2 (or 4) positive numbers, got {scales!r}")
        if len(scales) == 4:
            if tuple(scales[:2]) != (1, 1):
                raise UnsupportedError(f"resize: scales of N and C other than 1 are not "
                                       f"supported, got {scales!r}")
            scales = scales[2:]
        scales = tuple(float(np.float32(s)) for s in scales)
    else:
        scales = (None, None)
    if any(s < 1 for s in x.shape[2:]):
        raise ShapeError(f"resize: input H and W must be >= 1, got shape {x.shape}")
    if mode != "nearest":
        nearest_mode = None
    a = float(cubic_coeff_a) if mode == "cubic" else None
    exclude = bool(exclude_outside) and mode == "cubic"
    if sizes == tuple(x.shape[2:]):
        # onnxruntime copies the input when the output has its shape, whatever the scales.
        scales = (1.0, 1.0)
    options = (mode, coordinate_transformation_mode, nearest_mode, a, exclude)
    ctx = x.ctx
    key = ("resize.geometry", options, x.shape, sizes, scales)
    return _resample(x, key, sizes, lambda: _Tables(
        ctx, lambda axis: ("onnx",) + options + (scales[axis],),
        lambda axis, n, m: onnx_taps(n, m, mode, coordinate_transformation_mode, nearest_mode,
                                     a, exclude, scales[axis]), True),
        f"resize_{mode}")


def upsample_nearest(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_nearest (deprecated there): :func:`interpolate` with mode
    "nearest"."""
    return interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(input, size=None, scale_factor=None):
    """torch.nn.functional.upsample_bilinear (deprecated there): :func:`interpolate` of an
    (N, C, H, W) input with mode "bilinear" and ``align_corners=True``."""
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)
