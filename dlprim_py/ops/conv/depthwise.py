"""Depthwise convolution (groups == C, K = C * multiplier), all in kernels/conv_depthwise.cl.mako:

* ``Depthwise``: one work item per output element, every direction and layout;
* ``DepthwiseTiled``: forward of 2-D output blocks staged in local memory (NCHW);
* ``DepthwiseRows``: forward and data gradient of bands of whole rows, several small planes per
  work group (NCHW);

and the backward filter as partial sums per (channel, image range) reduced in a second pass.
"""
import math
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ... import program, solver, tuning
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
                      reduce_group=self._reduce_group(ctx, problem), tile=None, rows=None)
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
                      reduce_group=1, rows=None,
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


def tunables(ctx):
    """The depthwise kernels' budgets for the device (``tuning_db/conv_depthwise.json``):
    ``tiled_local_bytes_per_item``, ``rows_local_bytes``, ``rows_outputs_per_group``."""
    return solver.device_params(ctx, "conv_depthwise")


def _choose_dw_tile(ctx, problem):
    """The tile with the least global traffic per plane (staged input words, halo included, plus
    padded output words), ties to more rows per item (more reuse of each staged row), among
    those within the rule's tiled_local_bytes_per_item if any is."""
    key = ("conv.depthwise_tile", problem.ho, problem.wo, problem.r, problem.s, problem.stride_h,
           tuning.generation)
    found = ctx.plans.get(key)
    if found is not None:
        return found[0]
    per_item = tunables(ctx)["tiled_local_bytes_per_item"]
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
                crowded = rows * cols * 4 > per_item * gx * gy   # per plane
                bh, bw = gy * th, gx * tw
                tiles = math.ceil(problem.ho / bh) * math.ceil(problem.wo / bw)
                cost = (crowded, tiles * (rows * cols + bh * bw), -th)
                if best_cost is None or cost < best_cost:
                    best, best_cost = tile, cost
    ctx.plans.put(key, (best,))   # None too: no tile fits
    return best


# ---- row bands ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DepthwiseBands:
    """Geometry of the row-band kernels: work group gx x gy, ``planes`` consecutive (n, k)
    planes and ``band_h`` output rows of each per group."""
    gx: int
    gy: int
    planes: int
    band_h: int


class DepthwiseRows(Algorithm):
    """Forward and data gradient of whole-row bands (conv_dw_forward_rows and
    conv_dw_backward_data_rows in kernels/conv_depthwise.cl.mako): the rows a band reads are
    staged in local memory with coalesced row loads; small planes go several to a work group
    (MobileNet's 7x7 and 14x14 layers would leave most of a one-plane group idle). NCHW,
    dilation 1, equal strides up to 4; the data gradient needs multiplier 1.

    ``bands``: a fixed DepthwiseBands, or None to choose per problem (``choose_bands``)."""
    directions = ("forward", "backward_data")
    # Staged bytes per work group at most and outputs per work group aimed at: None takes the
    # device's rule (tunables()); a subclass may fix them (a probe's variants).
    LOCAL_BYTES = None
    OUTPUTS_PER_GROUP = None

    def __init__(self, bands=None, name="depthwise_rows"):
        self.bands = bands
        self.name = name

    def applies(self, ctx, problem, direction):
        p = problem
        if not (direction in self.directions and p.is_depthwise and p.k % p.c == 0
                and p.layout == "NCHW" and p.dil_h == p.dil_w == 1
                and p.stride_h == p.stride_w <= 4 and p.r * p.s <= 49):
            return False
        if direction == "backward_data" and p.k != p.c:
            return False
        bands = self.choose_bands(ctx, p, direction)
        return bands is not None and self._fits(ctx, p, direction, bands)

    @staticmethod
    def staged_shape(problem, direction, band_h):
        """(rows, columns) staged per plane for a band of ``band_h`` rows."""
        p, st = problem, problem.stride_h
        if direction == "forward":
            return (band_h - 1) * st + p.r, (p.wo - 1) * st + p.s
        rows = (band_h - 1 + p.pad_h) // st - (p.pad_h - p.r + 1) // st + 1
        cols = (p.w - 1 + p.pad_w) // st - (p.pad_w - p.s + 1) // st + 1
        return rows, cols

    @classmethod
    def _fits(cls, ctx, problem, direction, bands):
        rows, cols = cls.staged_shape(problem, direction, bands.band_h)
        sizes = ctx.info.max_work_item_sizes
        return (bands.gx * bands.gy <= ctx.info.max_work_group_size and bands.gx <= sizes[0]
                and bands.gy <= sizes[1]
                and bands.planes * rows * cols * 4 <= ctx.info.local_mem_size // 2
                # Data-gradient bands start at multiples of the stride (a row's parity is then
                # its offset's), unless one band covers the plane.
                and (direction == "forward" or bands.band_h % problem.stride_h == 0
                     or bands.band_h >= problem.h))

    def choose_bands(self, ctx, problem, direction):
        if self.bands is not None:
            return self.bands
        key = ("conv.depthwise_bands", problem.n * problem.k, problem.h, problem.w, problem.r,
               problem.s, problem.pad_h, problem.pad_w, problem.stride_h, direction,
               self.outputs_per_group(ctx), self.local_bytes(ctx))
        bands = ctx.plans.get(key)
        if bands is None:
            bands = ctx.plans.put(key, self._choose(ctx, problem, direction))
        return bands

    def local_bytes(self, ctx):
        """Staged bytes per work group at most."""
        return self.LOCAL_BYTES or tunables(ctx)["rows_local_bytes"]

    def outputs_per_group(self, ctx):
        """Outputs per work group aimed at."""
        return self.OUTPUTS_PER_GROUP or tunables(ctx)["rows_outputs_per_group"]

    def _choose(self, ctx, problem, direction):
        p, st = problem, problem.stride_h
        out_h, out_w = (p.ho, p.wo) if direction == "forward" else (p.h, p.w)
        plane_count = p.n * p.k
        gx = min(32, max(8, 1 << (out_w - 1).bit_length()))
        group = min(256, ctx.info.max_work_group_size)
        gy = max(1, group // gx)
        rows_wanted = max(1, self.outputs_per_group(ctx) // out_w)
        budget = min(self.local_bytes(ctx), ctx.info.local_mem_size // 2)
        if out_h <= rows_wanted:
            band_h, planes = out_h, max(1, rows_wanted // out_h)
            # Enough groups to fill the device twice over.
            planes = max(1, min(planes, plane_count // max(1, 2 * ctx.info.compute_units)))
        else:
            band_h, planes = rows_wanted, 1
        if direction == "backward_data" and band_h < out_h:
            band_h = max(st, band_h // st * st)

        def staged_bytes(bh, pl):
            rows, cols = self.staged_shape(p, direction, bh)
            return pl * rows * cols * 4

        while planes > 1 and staged_bytes(band_h, planes) > budget:
            planes -= 1
        step = st if direction == "backward_data" else 1
        while band_h > step and staged_bytes(band_h, planes) > budget:
            band_h -= step
        bands = DepthwiseBands(gx, gy, planes, band_h)
        return bands if self._fits(ctx, p, direction, bands) else None

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        bands = self.choose_bands(ctx, problem, direction)
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        params.update(kernel_r=problem.r, kernel_s=problem.s, channel_last=False,
                      reduce_group=1, tile=None,
                      rows=dict(stride=problem.stride_h, gx=bands.gx, gy=bands.gy))
        return program.build(ctx, "conv_depthwise", params), bands

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built, bands = self.prepare(ctx, problem, direction, epilogue)
        p = problem
        out_h = p.ho if direction == "forward" else p.h
        band_count = math.ceil(out_h / bands.band_h)
        groups = math.ceil(p.n * p.k / bands.planes) * band_count
        rows, cols = self.staged_shape(p, direction, bands.band_h)
        tail = [_I32(bands.planes), _I32(bands.band_h), _I32(band_count), _I32(rows),
                _I32(cols), cl.LocalMemory(bands.planes * rows * cols * 4)]
        gsize, lsize = (groups * bands.gx, bands.gy), (bands.gx, bands.gy)
        if direction == "forward":
            launch(ctx, built, "conv_dw_forward_rows", gsize, lsize,
                   [*p.geometry_args(), *_buf(src), *_buf(other), *_buf(dst),
                    *ep.kernel_args(dst), *tail])
        else:
            launch(ctx, built, "conv_dw_backward_data_rows", gsize, lsize,
                   [*p.geometry_args(), *_buf(src), *_buf(other), *_buf(dst), _F32(ep.alpha),
                    _F32(ep.beta), *tail])
