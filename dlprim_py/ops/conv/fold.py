"""torch's ``unfold`` (im2col) and ``fold`` (col2im) over (N, C, H, W), each the other's
gradient. They are the 3-D convolution's column kernels (kernels/conv3d.cl.mako's
``conv3d_vol2col`` and ``conv3d_col2vol``) with a depth of one: the columns of an image are
(C * kH * kW, L) with L the number of blocks, which is torch's layout, and ``fold`` gathers every
column entry of an output element (no atomics, a fixed summation order)."""
import numpy as np

from ... import autograd, program
from ...errors import DTypeError, ShapeError, not_a_tensor
from ...launch import launch, run_planned_on
from ...tensor import Tensor
from ..pointwise import launch_size

_I32 = np.int32
_INT32_LIMIT = 2 ** 31 - 1


def _pair(value, name):
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    try:
        items = tuple(value)
    except TypeError:
        raise ShapeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    if len(items) == 1:
        items *= 2
    if len(items) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in items):
        raise ShapeError(f"{name} must be an int or a pair of ints, got {value!r}")
    return int(items[0]), int(items[1])


def _arguments(what, kernel_size, dilation, padding, stride):
    kernel, dilation = _pair(kernel_size, "kernel_size"), _pair(dilation, "dilation")
    padding, stride = _pair(padding, "padding"), _pair(stride, "stride")
    if min(kernel) <= 0 or min(dilation) <= 0 or min(stride) <= 0 or min(padding) < 0:
        raise ShapeError(f"{what}: kernel_size {kernel}, dilation {dilation} and stride "
                         f"{stride} must be positive and padding {padding} non-negative")
    return kernel, dilation, padding, stride


def _blocks(what, size, kernel, dilation, padding, stride):
    blocks = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, k, d, p, st in
                   zip(size, kernel, dilation, padding, stride))
    if min(blocks) <= 0:
        raise ShapeError(f"{what}: kernel_size {kernel} with dilation {dilation} does not fit "
                         f"the padded input {tuple(s + 2 * p for s, p in zip(size, padding))}")
    return blocks


def _geometry(n, c, size, kernel, blocks, dilation, padding, stride):
    """conv3d.cl.mako's GEOMETRY for a depth of one (one output channel, one group)."""
    return [_I32(v) for v in (n, c, 1, *size, 1, 1, *kernel, 1, *blocks, 0, *padding, 1, *stride,
                              1, *dilation, 1)]


def _check(x, what):
    if not isinstance(x, Tensor):
        raise not_a_tensor(f"{what}: input", x)
    if x.dtype != np.float32:
        raise DTypeError(f"{what}: input must be float32, got {x.dtype}")


def _run(kernel_name, x, out, n, geometry):
    ctx = x.ctx
    built = program.build(ctx, "conv3d", {})
    key = (kernel_name, tuple(int(g) for g in geometry), x.offset, out.offset)

    def run():
        gsize, lsize = launch_size(ctx, out.size)
        launch(ctx, built, kernel_name, gsize, lsize,
               [*geometry, _I32(0), _I32(n), x.buffer, _I32(x.offset_elements), out.buffer,
                _I32(out.offset_elements)])

    run_planned_on(ctx, key, (x, out), run)
    return out


def _im2col(x, kernel, dilation, padding, stride):
    n, c, h, w = x.shape
    blocks = _blocks("unfold", (h, w), kernel, dilation, padding, stride)
    out = Tensor.empty(x.ctx, (n, c * kernel[0] * kernel[1], blocks[0] * blocks[1]))
    if max(out.size, x.size) > _INT32_LIMIT:
        raise ShapeError(f"unfold: more than 2^31-1 elements ({out.size})")
    if out.size:
        _run("conv3d_vol2col", x, out, n,
             _geometry(n, c, (h, w), kernel, blocks, dilation, padding, stride))
    return out


def _col2im(x, size, kernel, dilation, padding, stride):
    n, rows, _ = x.shape
    c = rows // (kernel[0] * kernel[1])
    blocks = _blocks("fold", size, kernel, dilation, padding, stride)
    out = Tensor.empty(x.ctx, (n, c) + tuple(size))
    if max(out.size, x.size) > _INT32_LIMIT:
        raise ShapeError(f"fold: more than 2^31-1 elements ({out.size})")
    if out.size:
        _run("conv3d_col2vol", x, out, n,
             _geometry(n, c, size, kernel, blocks, dilation, padding, stride))
    return out


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.unfold (im2col): ``(N, C, H, W)`` or ``(C, H, W)`` float32 ->
    ``(N, C * kH * kW, L)`` (or unbatched), L the number of sliding blocks; row
    ``c * kH * kW + i * kW + j`` holds input channel c at kernel position (i, j) of every
    block."""
    _check(input, "unfold")
    if input.ndim == 3:
        out = unfold(input.reshape((1,) + input.shape), kernel_size, dilation, padding, stride)
        return out.reshape(out.shape[1:])
    if input.ndim != 4:
        raise ShapeError(f"unfold expects a (N, C, H, W) or (C, H, W) input, got shape "
                         f"{input.shape}")
    args = _arguments("unfold", kernel_size, dilation, padding, stride)
    out = _im2col(input, *args)
    size = input.shape[2:]
    return autograd.record(out, (input,), lambda g: (_col2im(g, size, *args),), "unfold")


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """torch.nn.functional.fold (col2im): ``(N, C * kH * kW, L)`` or ``(C * kH * kW, L)``
    float32 -> ``(N, C, *output_size)`` (or unbatched), summing the entries that overlap; the
    inverse arrangement of ``unfold``."""
    _check(input, "fold")
    if input.ndim == 2:
        out = fold(input.reshape((1,) + input.shape), output_size, kernel_size, dilation,
                   padding, stride)
        return out.reshape(out.shape[1:])
    if input.ndim != 3:
        raise ShapeError(f"fold expects a (N, C * kH * kW, L) or (C * kH * kW, L) input, got "
                         f"shape {input.shape}")
    size = _pair(output_size, "output_size")
    if min(size) <= 0:
        raise ShapeError(f"fold: output_size must be positive, got {size}")
    kernel, dilation, padding, stride = args = _arguments("fold", kernel_size, dilation, padding,
                                                          stride)
    n, rows, length = input.shape
    taps = kernel[0] * kernel[1]
    if rows % taps:
        raise ShapeError(f"fold: input's dimension 1 ({rows}) must be divisible by the kernel's "
                         f"{kernel[0]} * {kernel[1]} = {taps} positions")
    blocks = _blocks("fold", size, kernel, dilation, padding, stride)
    if length != blocks[0] * blocks[1]:
        raise ShapeError(f"fold: the input has {length} blocks, output_size {size} with "
                         f"kernel_size {kernel}, dilation {dilation}, padding {padding} and "
                         f"stride {stride} makes {blocks[0] * blocks[1]}")
    out = _col2im(input, size, *args)
    return autograd.record(out, (input,), lambda g: (_im2col(g, *args),), "fold")
