"""Sampling at arbitrary points: torch.nn.functional.grid_sample and affine_grid (spatial
transformer networks, flow warping).

``grid_sample`` reads the input at each grid point (coordinates in [-1, 1], x along W first),
by bilinear (trilinear for 5-D inputs), nearest or bicubic (4-D) interpolation, with zeros,
border or reflection padding and either reading of align_corners: one kernel family,
``kernels/grid_sample.cl.mako``, forward and backward. The input's gradient is scattered with
atomic additions (their order, and so the last bits of a sum, vary from run to run, as in
torch's CUDA kernels); the grid's is written per point. ``affine_grid`` composes the library's
operators (the base grid times every theta in one GEMM, through ``linear``), so its gradient
to theta comes from the tape.
"""
import math

import numpy as np

from .. import autograd, program
from ..context import check_same_context
from ..dtypes import float32
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import bind
from ..tensor import Tensor
from .pointwise import launch_size

MODES = ("bilinear", "nearest", "bicubic")
PADDING_MODES = ("zeros", "border", "reflection")


def _kernels(ctx, dims, mode, padding, align, input_grad=False, grid_grad=False):
    params = dict(DIMS=dims, MODE=mode, PADDING=padding, ALIGN=int(align),
                  INPUT_GRAD=int(input_grad), GRID_GRAD=int(grid_grad))
    return program.build(ctx, "grid_sample", params)


def _sizes(input):
    spatial = input.shape[2:]
    D, H, W = (1,) + spatial if len(spatial) == 2 else spatial
    return np.int32(D), np.int32(H), np.int32(W)


def grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """torch.nn.functional.grid_sample: ``input`` (N, C, H, W) or (N, C, D, H, W) sampled at
    ``grid`` (N, H_out, W_out, 2) or (N, D_out, H_out, W_out, 3), whose last dimension holds x
    (along W), y (along H)[, z (along D)] in [-1, 1]; output (N, C) + the grid's spatial
    shape. ``mode``: "bilinear" (trilinear for 5-D), "nearest" (halves round to even, as
    torch) or "bicubic" (4-D only); ``padding_mode``: "zeros", "border" or "reflection";
    ``align_corners`` (None: False, torch's default): -1 and 1 are the centres of the corner
    elements rather than their outer edges. Gradients to the input and to the grid (none
    through nearest)."""
    for what, t in (("input", input), ("grid", grid)):
        if not isinstance(t, Tensor):
            raise not_a_tensor(f"grid_sample: {what}", t)
        if t.dtype != float32:
            raise DTypeError(f"grid_sample: {what} must be float32, got {t.dtype}")
    ctx = check_same_context(input, grid)
    if mode not in MODES:
        raise UnsupportedError(f"grid_sample: mode must be one of {MODES}, got {mode!r}")
    if padding_mode not in PADDING_MODES:
        raise UnsupportedError(f"grid_sample: padding_mode must be one of {PADDING_MODES}, got "
                               f"{padding_mode!r}")
    if input.ndim not in (4, 5):
        raise ShapeError(f"grid_sample: input must be (N, C, H, W) or (N, C, D, H, W), got "
                         f"{input.shape}")
    dims = input.ndim - 2
    if grid.ndim != input.ndim or grid.shape[0] != input.shape[0] or grid.shape[-1] != dims:
        raise ShapeError(f"grid_sample: a {input.ndim}-d input {input.shape} takes a grid of "
                         f"shape (N{', D_out' if dims == 3 else ''}, H_out, W_out, {dims}) with "
                         f"N = {input.shape[0]}, got {grid.shape}")
    if mode == "bicubic" and dims == 3:
        raise ShapeError("grid_sample: mode 'bicubic' takes 4-d inputs only (as torch)")
    if any(s == 0 for s in input.shape[2:]):
        raise ShapeError(f"grid_sample: the input's spatial dimensions must not be empty, got "
                         f"{input.shape}")
    align = bool(align_corners)
    N, C = input.shape[:2]
    P = math.prod(grid.shape[1:-1])
    out = Tensor.empty(ctx, (N, C) + grid.shape[1:-1])
    total = N * P
    D, H, W = _sizes(input)
    if out.size:
        kernel = bind(_kernels(ctx, dims, mode, padding_mode, align).kernel(
            "grid_sample_forward"))
        gsize, lsize = launch_size(ctx, total)
        kernel(ctx.queue, gsize, lsize, np.int64(total), np.int64(C), np.int64(P), D, H, W,
               input.buffer, np.int64(input.offset_elements), grid.buffer,
               np.int64(grid.offset_elements), out.buffer, np.int64(out.offset_elements))
    if not autograd.needs_grad(input, grid):
        return out
    source, points = input.detach(), grid.detach()

    def backward(g):
        input_grad = input.requires_grad
        # The kernel writes the grid's gradient wherever it is not zero by definition (nearest,
        # or nothing sampled).
        want_grid = grid.requires_grad and mode != "nearest" and bool(C and total)
        gx = Tensor.zeros(ctx, input.shape) if input_grad else None
        ggrid = None
        if grid.requires_grad:
            ggrid = (Tensor.empty if want_grid else Tensor.zeros)(ctx, grid.shape)
        if total and C and (input_grad or want_grid):
            kernel = bind(_kernels(ctx, dims, mode, padding_mode, align, input_grad,
                                   want_grid).kernel("grid_sample_backward"))
            gsize, lsize = launch_size(ctx, total)
            # Buffers the kernel does not touch: any valid one stands in (never read).
            gx_buf = gx.buffer if gx is not None else g.buffer
            gg_buf = ggrid.buffer if want_grid else g.buffer
            kernel(ctx.queue, gsize, lsize, np.int64(total), np.int64(C), np.int64(P), D, H, W,
                   source.buffer, np.int64(source.offset_elements), points.buffer,
                   np.int64(points.offset_elements), g.buffer, np.int64(g.offset_elements),
                   gx_buf, np.int64(gx.offset_elements if gx is not None else 0), gg_buf,
                   np.int64(ggrid.offset_elements if want_grid else 0))
        return gx, ggrid

    return autograd.record(out, (input, grid), backward, "grid_sample")


def affine_grid(theta, size, align_corners=None):
    """torch.nn.functional.affine_grid: the sampling grid of the affine maps ``theta`` (N, 2, 3)
    for ``size`` (N, C, H, W), or (N, 3, 4) for (N, C, D, H, W): grid[n, ..., :] = theta[n] @
    (x, y[, z], 1) over the base grid of normalized coordinates (``align_corners`` as
    grid_sample's; None: False). Gradient to theta."""
    from .linear import linear
    from .tensor_ops import permute
    if not isinstance(theta, Tensor):
        raise not_a_tensor("affine_grid: theta", theta)
    if theta.dtype != float32:
        raise DTypeError(f"affine_grid: theta must be float32, got {theta.dtype}")
    size = tuple(int(s) for s in size)
    if len(size) not in (4, 5):
        raise ShapeError(f"affine_grid: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    dims = len(size) - 2
    N = size[0]
    if theta.shape != (N, dims, dims + 1):
        raise ShapeError(f"affine_grid: a size of {len(size)} dimensions takes theta of shape "
                         f"({N}, {dims}, {dims + 1}), got {theta.shape}")
    if any(s <= 0 for s in size):
        raise ShapeError(f"affine_grid: the sizes must be positive, got {size}")
    align = bool(align_corners)

    def axis(n):
        if n == 1:
            return np.zeros(1)
        points = np.linspace(-1.0, 1.0, n)
        return points if align else points * (n - 1) / n

    spatial = size[2:]
    # The base grid, (x, y[, z], 1) per point, x along the last dimension.
    coords = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")[::-1]
    base = np.stack(list(coords) + [np.ones(spatial)], axis=-1).reshape(-1, dims + 1)
    base_t = Tensor.from_numpy(theta.ctx, base.astype(np.float32))
    # (P, N * dims) = base (P, k) @ theta^T, every batch entry's rows of theta stacked as
    # (N * dims, k): one GEMM, theta's gradient from linear's.
    points = linear(base_t, theta.reshape(N * dims, dims + 1))
    grid = permute(points.reshape(base.shape[0], N, dims), (1, 0, 2))
    return grid.reshape((N,) + spatial + (dims,))


__all__ = ["grid_sample", "affine_grid"]
