"""Depthwise convolution (groups == C, K = C * multiplier): the plain per-output kernels and the
local-memory tiled forward, both in kernels/conv_depthwise.cl.mako."""
import math
from dataclasses import dataclass

import numpy as np

from ... import program
from ...errors import ShapeError
from ..pointwise import launch_size
from .algorithms import NO_EPILOGUE, Algorithm, _buf, launch

_F32 = np.float32
_I32 = np.int32


class Depthwise(Algorithm):
    """Direct depthwise kernels (kernels/conv_depthwise.cl.mako): groups == C, K = C * m."""
    name = "depthwise"

    def applies(self, ctx, problem, direction):
        return problem.is_depthwise and problem.k % problem.c == 0 and problem.r * problem.s <= 49

    def _reduce_group(self, ctx, problem):
        group = 256 if problem.r * problem.s <= 25 else 128
        return min(group, 1 << (ctx.info.max_work_group_size.bit_length() - 1))

    def splits(self, ctx, problem):
        target = 4 * ctx.info.compute_units if ctx.info.is_gpu else ctx.info.compute_units
        splits = max(1, min(problem.n, math.ceil(target / problem.k)))
        per_split = math.ceil(problem.n / splits)
        return math.ceil(problem.n / per_split), per_split

    @staticmethod
    def _grid(ctx, problem, pixels, channels):
        """3-D (global, local) sizes over (pixel, channel, image), channel first for NHWC."""
        fast, slow = (channels, pixels) if problem.layout == "NHWC" else (pixels, channels)
        group = min(256, ctx.info.max_work_group_size, ctx.info.max_work_item_sizes[0])
        local0 = min(group, 1 << max(0, (fast - 1).bit_length()))
        local1 = min(max(1, group // local0), ctx.info.max_work_item_sizes[1])
        gsize = (math.ceil(fast / local0) * local0, math.ceil(slow / local1) * local1, problem.n)
        return gsize, (local0, local1, 1)

    def workspace_size(self, ctx, problem, direction):
        if direction != "backward_filter":
            return 0
        splits, _ = self.splits(ctx, problem)
        return splits * problem.k * problem.r * problem.s * 4

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        params.update(kernel_r=problem.r, kernel_s=problem.s,
                      channel_last=problem.layout == "NHWC",
                      reduce_group=self._reduce_group(ctx, problem), tile=None)
        return program.build(ctx, "conv_depthwise", params)

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction, epilogue)
        geometry = problem.geometry_args()
        if direction == "forward":
            gsize, lsize = self._grid(ctx, problem, problem.ho * problem.wo, problem.k)
            launch(ctx, built, "conv_dw_forward", gsize, lsize,
                   [*geometry, *_buf(src), *_buf(other), *_buf(dst), *ep.kernel_args(dst)])
        elif direction == "backward_data":
            gsize, lsize = self._grid(ctx, problem, problem.h * problem.w, problem.c)
            launch(ctx, built, "conv_dw_backward_data", gsize, lsize,
                   [*geometry, *_buf(src), *_buf(other), *_buf(dst), _F32(ep.alpha),
                    _F32(ep.beta)])
        else:
            need = self.workspace_size(ctx, problem, direction)
            if workspace is None or workspace.nbytes < need:
                raise ShapeError(f"depthwise backward_filter needs a workspace of {need} bytes, "
                                 f"got {0 if workspace is None else workspace.nbytes}")
            splits, per_split = self.splits(ctx, problem)
            group = self._reduce_group(ctx, problem)
            launch(ctx, built, "conv_dw_backward_filter", (problem.k * group, splits), (group, 1),
                   [*geometry, *_buf(src), *_buf(other), *_buf(workspace), _I32(per_split)])
            count = problem.k * problem.r * problem.s
            rgs, rls = launch_size(ctx, count)
            launch(ctx, built, "conv_dw_reduce", rgs, rls,
                   [*geometry, _I32(splits), *_buf(workspace), *_buf(dst), _F32(ep.alpha),
                    _F32(ep.beta)])


@dataclass(frozen=True)
class DepthwiseTile:
    """Geometry of conv_dw_forward_tiled: work group gx x gy x planes, tw x th outputs per item."""
    gx: int
    gy: int
    tw: int
    th: int
    planes: int

    def input_block(self, problem):
        """(rows, columns) of the staged input block, halo included."""
        st = problem.stride_h
        return ((self.gy * self.th - 1) * st + problem.r, (self.gx * self.tw - 1) * st + problem.s)


class DepthwiseTiled(Algorithm):
    """Depthwise forward that stages each output block's input (with its halo) in local memory
    and keeps several outputs per work item in registers (conv_dw_forward_tiled in
    kernels/conv_depthwise.cl.mako). NCHW, dilation 1, equal strides; any multiplier, padding
    and the full epilogue.

    ``tile``: a fixed DepthwiseTile, or None to choose one per problem (``choose_tile``)."""
    directions = ("forward",)
    _MAX_GROUP = 256

    def __init__(self, tile=None, name="depthwise_tiled"):
        self.tile = tile
        self.name = name

    def applies(self, ctx, problem, direction):
        p = problem
        if not (direction == "forward" and p.is_depthwise and p.k % p.c == 0
                and p.layout == "NCHW" and p.dil_h == p.dil_w == 1 and p.stride_h == p.stride_w
                and p.r * p.s <= 49 and p.stride_h <= 4):
            return False
        tile = self.choose_tile(ctx, p)
        return tile is not None and self._fits(ctx, p, tile)

    @staticmethod
    def _fits(ctx, problem, tile):
        rows, cols = tile.input_block(problem)
        threads = tile.gx * tile.gy * tile.planes
        sizes = ctx.info.max_work_item_sizes
        return (threads <= ctx.info.max_work_group_size and tile.gx <= sizes[0]
                and tile.gy <= sizes[1] and tile.planes <= sizes[2]
                and tile.planes * rows * cols * 4 <= ctx.info.local_mem_size // 2)

    def choose_tile(self, ctx, problem):
        if self.tile is not None:
            return self.tile
        return _choose_dw_tile(ctx, problem)

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        tile = self.choose_tile(ctx, problem)
        params = epilogue.params()
        params.update(kernel_r=problem.r, kernel_s=problem.s, channel_last=False,
                      reduce_group=1,
                      tile=dict(stride=problem.stride_h, gx=tile.gx, gy=tile.gy, tw=tile.tw,
                                th=tile.th, planes=tile.planes))
        return program.build(ctx, "conv_depthwise", params), tile

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built, tile = self.prepare(ctx, problem, direction, epilogue)
        p = problem
        tiles_w = math.ceil(p.wo / (tile.gx * tile.tw))
        tiles = math.ceil(p.ho / (tile.gy * tile.th)) * tiles_w
        plane_groups = math.ceil(p.n * p.k / tile.planes)
        gsize = (plane_groups * tiles * tile.gx, tile.gy, tile.planes)
        launch(ctx, built, "conv_dw_forward_tiled", gsize, (tile.gx, tile.gy, tile.planes),
               [*p.geometry_args(), *_buf(src), *_buf(other), *_buf(dst), *ep.kernel_args(dst),
                _I32(tiles_w), _I32(tiles)])


# Staged bytes per work item at most: a memory-bound kernel needs many resident work items,
# and local memory is what limits them (an H200 SM holds 228 KiB for up to 2048 items).
_DW_LOCAL_BYTES_PER_ITEM = 160


def _choose_dw_tile(ctx, problem):
    """The tile with the least global traffic per plane (staged input words, halo included, plus
    padded output words), ties to more rows per item (more reuse of each staged row), among
    those within _DW_LOCAL_BYTES_PER_ITEM if any is."""
    key = (problem.ho, problem.wo, problem.r, problem.s, problem.stride_h)
    memo = ctx.memo.setdefault("conv_dw_tile", {})
    if key in memo:
        return memo[key]
    best, best_cost = None, None
    # At least 8 work items along a row (32-byte runs of stores) unless the row is shorter.
    for gx in (4, 8, 16, 32) if problem.wo < 8 else (8, 16, 32):
        tw = min(8, math.ceil(problem.wo / gx))
        for gy in (1, 2, 4, 8, 16):
            if not 8 <= gx * gy <= DepthwiseTiled._MAX_GROUP:
                continue
            for th in (4, 2, 1):
                planes = max(1, 128 // (gx * gy))
                tile = DepthwiseTile(gx, gy, tw, th, planes)
                while planes > 1 and not DepthwiseTiled._fits(ctx, problem, tile):
                    planes //= 2
                    tile = DepthwiseTile(gx, gy, tw, th, planes)
                if not DepthwiseTiled._fits(ctx, problem, tile):
                    continue
                rows, cols = tile.input_block(problem)
                crowded = rows * cols * 4 > _DW_LOCAL_BYTES_PER_ITEM * gx * gy   # per plane
                bh, bw = gy * th, gx * tw
                tiles = math.ceil(problem.ho / bh) * math.ceil(problem.wo / bw)
                cost = (crowded, tiles * (rows * cols + bh * bw), -th)
                if best_cost is None or cost < best_cost:
                    best, best_cost = tile, cost
    memo[key] = best
    return best
