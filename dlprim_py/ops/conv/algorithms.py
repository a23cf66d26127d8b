"""The convolution algorithms. Each answers MIOpen's three questions for a problem and a
direction ("forward", "backward_data", "backward_filter"): does it apply (``applies``), how
much workspace it needs (``workspace_size``, bytes), and how to run it (``run``).

``run`` takes, per direction:
  forward          src=x,  other=w, dst=y
  backward_data    src=dy, other=w, dst=dx
  backward_filter  src=dy, other=x, dst=dw
as Tensors, with ``dst = alpha * result + beta * dst`` and, for forward, the fused epilogue.
Kernels are built on first use per (context, configuration) and memoized by ``program.build``.
"""
import math
from dataclasses import dataclass, replace

import numpy as np
import pyopencl as cl

from ... import program, tuning
from ...errors import ShapeError
from ..pointwise import launch_size
from ...tensor import _checked

_F32 = np.float32
_I32 = np.int32


@dataclass(frozen=True)
class Epilogue:
    """Compile-time shape of the forward epilogue (conv_common.cl.mako)."""
    has_scale: bool = False
    has_shift: bool = False
    has_residual: bool = False
    activation: object = None   # an ActivationDesc or None
    affine_per_position: bool = False   # scale/shift per (k, oh, ow) of an NCHW y
    # A fusion plan's bias / batch-norm-inference chain, ((kind, per_position), ...) with kind
    # "bias" or "bn" (kernels/fusion_fold.cl.mako): the kernel computes the scale and shift
    # from the chain's own parameters (EpilogueArgs.chain_args) instead of reading vectors.
    chain: tuple = ()

    def params(self):
        act = self.activation
        return dict(has_scale=self.has_scale, has_shift=self.has_shift,
                    has_residual=self.has_residual,
                    activation="(v)" if act is None else act.forward_code("v"),
                    affine_per_position=self.affine_per_position,
                    chain=[tuple(link) for link in self.chain])


NO_EPILOGUE = Epilogue()


@dataclass
class EpilogueArgs:
    """The run-time operands of the epilogue: tensors (or None) and scalars."""
    scale: object = None
    shift: object = None
    residual: object = None
    alpha: float = 1.0
    beta: float = 0.0
    residual_alpha: float = 1.0
    # The chain's kernel arguments in fusion_fold.cl.mako's chain_params order (buffers, int32
    # offsets, float32 epsilons), when Epilogue.chain is set.
    chain_args: tuple = ()

    def kernel_args(self, dummy):
        args = []
        for t in (self.scale, self.shift, self.residual):
            if t is None:
                args += [dummy.buffer, _I32(0)]
            else:
                args += [t.buffer, _I32(t.offset_elements)]
        return args + [_F32(self.alpha), _F32(self.beta), _F32(self.residual_alpha),
                       *self.chain_args]

    def chain_key(self):
        """What identifies the chain's arguments (buffers, offsets, epsilons)."""
        return tuple(a.int_ptr if isinstance(a, cl.MemoryObjectHolder) else float(a)
                     for a in self.chain_args)


def _buf(t):
    return [t.buffer, _I32(t.offset_elements)]


# ---- the workspace limit: runs on parts of the batch ---------------------------------------

# Workspaces are indexed with 32-bit offsets.
WORKSPACE_CAP = 2 ** 31 - 4
DEFAULT_WORKSPACE_LIMIT = 256 << 20


def workspace_limit(problem, direction):
    """Bytes of workspace one call may use: DLPRIM_WORKSPACE_LIMIT, else 256 MiB or the pass's
    output size, whichever is larger (a layer then holds at most about twice its output), and
    never over WORKSPACE_CAP."""
    from ... import config
    limit = config.workspace_limit()
    if limit is None:
        out = problem.y_shape if direction == "forward" else (
            problem.x_shape if direction == "backward_data" else problem.w_shape)
        limit = max(DEFAULT_WORKSPACE_LIMIT, 4 * math.prod(out))
    return min(limit, WORKSPACE_CAP)


def batch_chunk(ctx, algorithm, problem, direction):
    """(images per run, workspace bytes per run) of ``algorithm``: the whole batch where its
    workspace fits the limit, else equal parts of the batch that fit (forward and backward
    data, whose images are independent; a filter gradient sums over the batch and is not
    split). A workspace grows linearly with the images (the transformed or unfolded inputs
    and outputs) on top of a fixed part (a transformed filter)."""
    need = algorithm.workspace_size(ctx, problem, direction)
    n = problem.n
    if n == 1 or direction == "backward_filter":
        return n, need
    limit = workspace_limit(problem, direction)
    if need <= limit:
        return n, need
    one = algorithm.workspace_size(ctx, replace(problem, n=1), direction)
    per_image = (need - one) / (n - 1)
    chunk = int((limit - (one - per_image)) // per_image) if per_image > 0 else n
    chunk = max(1, min(n, chunk))
    runs = -(-n // chunk)
    chunk = -(-n // runs)
    return chunk, algorithm.workspace_size(ctx, replace(problem, n=chunk), direction)


def _images(t, start, count):
    """Images ``start:start + count`` of a dense batch-first tensor, as a view."""
    per_image = math.prod(t.shape[1:])
    return _checked(t.ctx, t.buffer, (count,) + t.shape[1:], t.dtype,
                    t.offset + start * per_image * t.dtype.itemsize)


def run_in_chunks(ctx, algorithm, problem, direction, chunk, src, other, dst, ep,
                  epilogue=None, workspace=None):
    """``algorithm.run`` on the batch ``chunk`` images at a time (``batch_chunk``), in one
    workspace: src, dst and a residual are viewed per part; the filter and per-channel or
    per-position operands are shared."""
    epilogue = NO_EPILOGUE if epilogue is None else epilogue
    if chunk >= problem.n:
        algorithm.run(ctx, problem, direction, src, other, dst, ep, epilogue, workspace)
        return
    for start in range(0, problem.n, chunk):
        count = min(chunk, problem.n - start)
        part_ep = ep if ep.residual is None else replace(
            ep, residual=_images(ep.residual, start, count))
        algorithm.run(ctx, replace(problem, n=count), direction, _images(src, start, count),
                      other, _images(dst, start, count), part_ep, epilogue, workspace)


# ---- launches and their recording (dlprim_py/launch.py) ----------------------------------

from ...launch import Recording, enqueue, launch  # noqa: E402,F401  (used by every algorithm)


class Algorithm:
    name = "?"
    directions = ("forward", "backward_data", "backward_filter")
    # True: a TF32 algorithm, applicable only to TF32 tasks (selection.ConvTask.tf32).
    tf32 = False
    # The problem dtypes (ConvProblem.dtype) the algorithm computes; the solver layer and a
    # forced algorithm check it before ``applies`` (selection.dtype_applies).
    dtypes = ("float32",)

    def applies(self, ctx, problem, direction):
        raise NotImplementedError

    def workspace_size(self, ctx, problem, direction):
        return 0

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        """Build the kernels this algorithm needs for the problem (no enqueue)."""
        raise NotImplementedError

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        raise NotImplementedError

    def __repr__(self):
        return f"<conv algorithm {self.name}>"


# ---- direct -------------------------------------------------------------------------------

class Direct(Algorithm):
    """One work item per output element (kernels/conv_direct.cl.mako). Always applies."""
    name = "direct"

    def applies(self, ctx, problem, direction):
        return True

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        return program.build(ctx, "conv_direct", params)

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction, epilogue)
        geometry = problem.geometry_args()
        total = math.prod(dst.shape)
        gsize, lsize = launch_size(ctx, total)
        if direction == "forward":
            launch(ctx, built, "conv_direct_forward", gsize, lsize,
                   [*geometry, *_buf(src), *_buf(other), *_buf(dst), *ep.kernel_args(dst)])
        else:
            name = f"conv_direct_{direction}"
            launch(ctx, built, name, gsize, lsize, [*geometry, *_buf(src), *_buf(other),
                                                    *_buf(dst), _F32(ep.alpha), _F32(ep.beta)])


class DirectPhased(Algorithm):
    """Backward data by conv_direct_backward_data_phased (kernels/conv_direct.cl.mako): a few
    input channels per work item, work items grouped by stride phase. Applies to every
    backward data problem; it is meant for few input channels, where GEMM tiles sit mostly
    empty (an RGB stem's 7x7 stride-2 data gradient)."""
    name = "direct_phased"
    directions = ("backward_data",)

    def applies(self, ctx, problem, direction):
        return direction == "backward_data"

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        return program.build(ctx, "conv_direct", NO_EPILOGUE.params())

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction)
        p = problem
        c_blocks = -(-p.cg // 4)   # PHASED_C in the kernel
        items = (p.n * p.groups * c_blocks * p.stride_h * p.stride_w
                 * -(-p.h // p.stride_h) * -(-p.w // p.stride_w))
        gsize, lsize = launch_size(ctx, items)
        launch(ctx, built, "conv_direct_backward_data_phased", gsize, lsize,
               [*p.geometry_args(), *_buf(src), *_buf(other), *_buf(dst), _F32(ep.alpha),
                _F32(ep.beta)])


def backward_bias(ctx, problem, dy, db, alpha=1.0, beta=0.0):
    """db[k] = alpha * sum over (n, oh, ow) of dy[n, k, oh, ow] + beta * db[k]."""
    built = program.build(ctx, "conv_direct", NO_EPILOGUE.params())
    group = 256
    launch(ctx, built, "conv_direct_backward_bias", (problem.k * group,), (group,),
           [*problem.geometry_args(), *_buf(dy), *_buf(db), _F32(alpha), _F32(beta)])


class DirectSmall(Algorithm):
    """Forward for few input and output channels (kernels/conv_direct_small.cl.mako): the
    weights staged once per work group in local memory, PIXELS x K outputs per work item, the
    tap loops unrolled (one compile per C, R, S, K). For RGB(A) stems (C <= 4, K <= 64), where a
    GEMM's tiles see a reduction of only C * R * S = 27 or 147.

    ``pixels``: output pixels per work item (1 or 2), or None for 1: on an H200 the MobileNetV2
    stem (3 -> 32, 3x3 stride 2, batch 64) took 0.097 ms with 1 and 0.725 ms with 2."""
    directions = ("forward",)
    _GROUP = 128
    MAX_CHANNELS = 4
    MAX_TAPS = 160
    MAX_OUT_CHANNELS = 64

    def __init__(self, pixels=None, name="direct_small"):
        self.pixels = pixels
        self.name = name

    def _pixels(self, problem):
        return 1 if self.pixels is None else self.pixels

    def _local_bytes(self, problem):
        return problem.c * problem.r * problem.s * -(-problem.k // 4) * 16

    def applies(self, ctx, problem, direction):
        p = problem
        return (direction == "forward" and p.groups == 1 and p.c <= self.MAX_CHANNELS
                and p.k <= self.MAX_OUT_CHANNELS and p.c * p.r * p.s <= self.MAX_TAPS
                and self._local_bytes(p) <= ctx.info.local_mem_size - 1024)

    def _group(self, ctx):
        return min(self._GROUP, ctx.info.max_work_group_size)

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        params = epilogue.params()
        params.update(channels=problem.c, kernel_r=problem.r, kernel_s=problem.s,
                      out_channels=problem.k, pixels=self._pixels(problem),
                      group_size=self._group(ctx))
        return program.build(ctx, "conv_direct_small", params)

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction, epilogue)
        p = problem
        pixels = self._pixels(p)
        group = self._group(ctx)
        items = p.n * p.ho * -(-p.wo // pixels)
        launch(ctx, built, "conv_direct_small_forward", (-(-items // group) * group,), (group,),
               [*p.geometry_args(), *_buf(src), *_buf(other), *_buf(dst), *ep.kernel_args(dst)])


# ---- implicit GEMM ------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmTile:
    tile_m: int
    tile_n: int
    tile_k: int
    thread_m: int
    thread_n: int

    @property
    def threads(self):
        return (self.tile_m // self.thread_m) * (self.tile_n // self.thread_n)

    @property
    def local_bytes(self):
        """Local memory of conv_implicit_gemm.cl.mako's two stages of A and B slices: tile_k
        rows of float4s each, padded by one float4."""
        return 2 * self.tile_k * ((self.tile_m + 4) // 4 + (self.tile_n + 4) // 4) * 16


TILE_LARGE = GemmTile(128, 128, 8, 8, 8)
TILE_WIDE = GemmTile(64, 128, 8, 8, 4)
TILE_MEDIUM = GemmTile(64, 64, 8, 4, 4)
TILE_SMALL = GemmTile(32, 32, 8, 4, 4)
# kk steps of 16: half the barriers and loop overhead per multiply-add (the GEMM engine's depth).
TILE_LARGE_K16 = GemmTile(128, 128, 16, 8, 8)
TILE_WIDE_K16 = GemmTile(64, 128, 16, 8, 4)
TILE_MEDIUM_K16 = GemmTile(64, 64, 16, 4, 4)
# Few output channels over many pixels (an RGB stem: K = 32, C * R * S = 27).
TILE_THIN_K16 = GemmTile(32, 256, 16, 4, 8)

# Kernel sizes compiled with R and S as constants (the common ones); others read them at run time.
_FIXED_KERNELS = ((1, 1), (3, 3))


def gemm_plan(ctx, tf32, M, N, K, *args, batch=1, **kwargs):
    """A ``GemmPlan`` of an algorithm's GEMM: float32 by the GEMM engine's choice, or with
    ``tf32`` on its TF32 tensor-core kernel ("mma", ``gemm.tf32_params``)."""
    from ..gemm import GemmPlan, tf32_params
    if tf32:
        kwargs["params"] = tf32_params(ctx, M, N, K, batch)
    return GemmPlan(ctx, M, N, K, *args, batch=batch, **kwargs)


def _gemm_dims(problem, direction):
    p = problem
    if direction == "forward":
        return p.kg, p.n * p.ho * p.wo, p.cg * p.r * p.s
    if direction == "backward_data":
        return p.cg, p.n * p.h * p.w, p.kg * p.r * p.s
    return p.kg, p.cg * p.r * p.s, p.n * p.ho * p.wo


class ImplicitGemm(Algorithm):
    """Implicit GEMM in local-memory tiles (kernels/conv_implicit_gemm.cl.mako).

    ``tile``: a fixed GemmTile, or None for the per-device rule. 1x1 convolutions take the same
    kernel: with R = S = 1 and no padding the gather is a plain strided load, no im2col buffer.
    """

    def __init__(self, tile=None, name="implicit_gemm", directions=None, gpu_only=False):
        self.tile = tile
        self.name = name
        if directions is not None:
            self.directions = directions
        self.gpu_only = gpu_only

    def applies(self, ctx, problem, direction):
        if direction not in self.directions or (self.gpu_only and not ctx.info.is_gpu):
            return False
        tile = self.choose_tile(ctx, problem, direction)
        # 32 KiB devices (Apple, Mali, Oclgrind) lack room for the largest tiles' 33-37 KiB.
        return (tile.threads <= ctx.info.max_work_group_size
                and tile.local_bytes <= ctx.info.local_mem_size)

    def choose_tile(self, ctx, problem, direction):
        """The fixed tile, else the first rule of ``tuning_db/conv_implicit_gemm.json`` that
        holds for the direction's GEMM (device -> architecture -> vendor -> default), chosen
        once per problem and direction."""
        if self.tile is not None:
            return self.tile
        key = ("conv.implicit_gemm_tile", problem, direction, tuning.generation)
        tile = ctx.plans.get(key)
        if tile is None:
            gm, gn, gk = _gemm_dims(problem, direction)
            units = ctx.info.compute_units
            features = {"direction": direction, "gm": gm, "gn": gn, "gk": gk,
                        "rs": problem.r * problem.s, "gpu": int(ctx.info.is_gpu),
                        "waves_64x128": math.ceil(gm / 64) * math.ceil(gn / 128) / units,
                        "mn_per_cu": gm * gn / units}
            params, _ = tuning.lookup(ctx.info, "conv_implicit_gemm", features)
            tile = ctx.plans.put(key, GemmTile(**params))
        return tile

    def splits(self, ctx, problem, direction, tile):
        """kk split factor and the kk range per split (a multiple of tile_k)."""
        gm, gn, gk = _gemm_dims(problem, direction)
        if direction != "backward_filter":
            return 1, gk
        blocks = math.ceil(gm / tile.tile_m) * math.ceil(gn / tile.tile_n) * problem.groups
        target = 4 * ctx.info.compute_units if ctx.info.is_gpu else ctx.info.compute_units
        # Keep each split long enough that the partial-sum traffic stays small.
        splits = max(1, min(target // max(blocks, 1), gk // (16 * tile.tile_k)))
        per_split = math.ceil(math.ceil(gk / splits) / tile.tile_k) * tile.tile_k
        splits = math.ceil(gk / per_split)
        return splits, per_split

    def workspace_size(self, ctx, problem, direction):
        tile = self.choose_tile(ctx, problem, direction)
        splits, _ = self.splits(ctx, problem, direction, tile)
        if splits == 1:
            return 0
        return splits * problem.k * problem.cg * problem.r * problem.s * 4

    @staticmethod
    def _by_phase(problem, direction):
        """Backward data with stride > 1 runs once per output phase (see _run_phases)."""
        p = problem
        return (direction == "backward_data" and (p.stride_h > 1 or p.stride_w > 1)
                and p.dil_h == p.dil_w == 1)

    def _params(self, problem, direction, tile, split_k, epilogue):
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        fixed = (problem.r, problem.s) in _FIXED_KERNELS and not self._by_phase(problem, direction)
        params.update(direction=direction, tile_m=tile.tile_m, tile_n=tile.tile_n,
                      tile_k=tile.tile_k, thread_m=tile.thread_m, thread_n=tile.thread_n,
                      channel_last=problem.layout == "NHWC", split_k=split_k,
                      kernel_r=problem.r if fixed else 0, kernel_s=problem.s if fixed else 0)
        return params

    def _run_phases(self, ctx, problem, built, tile, src, other, dst, ep):
        """Backward data for stride (sh, sw): dx rows h = a + sh * q of one phase a take only the
        taps r = r0 + sh * j with r0 = (a + pad) mod sh, and read dy row q + (a + pad - r0) / sh - j.
        Each of the sh * sw phases is thus a stride-1 backward data over a (ceil((H - a) / sh) x
        ceil((W - b) / sw)) view of dx with an (Rj x Sj) view of w and padding (a + pad - r0) / sh,
        run by the same kernel with those views' strides and offsets; no zero of the strided
        problem is multiplied."""
        p = problem
        xs, ws, ys = p.x_strides(), p.w_strides(), p.y_strides()
        kernel_name = "conv_igemm_backward_data"
        for a in range(p.stride_h):
            hq = -(-(p.h - a) // p.stride_h)
            r0 = (a + p.pad_h) % p.stride_h
            rj = max(0, -(-(p.r - r0) // p.stride_h))
            pad_q = (a + p.pad_h - r0) // p.stride_h
            for b in range(p.stride_w):
                wq = -(-(p.w - b) // p.stride_w)
                s0 = (b + p.pad_w) % p.stride_w
                sj = max(0, -(-(p.s - s0) // p.stride_w))
                pad_wq = (b + p.pad_w - s0) // p.stride_w
                if hq <= 0 or wq <= 0:
                    continue
                geometry = [p.n, p.c, hq, wq, p.k, rj, sj, p.ho, p.wo, pad_q, pad_wq, 1, 1, 1, 1,
                            p.groups,
                            xs[0], xs[1], xs[2] * p.stride_h, xs[3] * p.stride_w,
                            ws[0], ws[1], ws[2] * p.stride_h, ws[3] * p.stride_w, *ys]
                gm, gn = p.cg, p.n * hq * wq
                gsize = (math.ceil(gn / tile.tile_n) * tile.threads, math.ceil(gm / tile.tile_m),
                         p.groups)
                launch(ctx, built, kernel_name, gsize, (tile.threads, 1, 1),
                       [*(_I32(v) for v in geometry),
                        other.buffer, _I32(other.offset_elements + r0 * ws[2] + s0 * ws[3]),
                        *_buf(src),
                        dst.buffer, _I32(dst.offset_elements + a * xs[2] + b * xs[3]),
                        _I32(max(p.kg * rj * sj, 1)), *ep.kernel_args(dst)])

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        tile = self.choose_tile(ctx, problem, direction)
        splits, per_split = self.splits(ctx, problem, direction, tile)
        built = program.build(ctx, "conv_implicit_gemm",
                              self._params(problem, direction, tile, splits > 1, epilogue))
        return built, tile, splits, per_split

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built, tile, splits, per_split = self.prepare(ctx, problem, direction, epilogue)
        gm, gn, gk = _gemm_dims(problem, direction)
        gsize = (math.ceil(gn / tile.tile_n) * tile.threads, math.ceil(gm / tile.tile_m),
                 problem.groups * splits)
        lsize = (tile.threads, 1, 1)
        if self._by_phase(problem, direction):
            self._run_phases(ctx, problem, built, tile, src, other, dst, ep)
            return
        if direction == "forward":
            a, b = other, src          # A = w, B = x
        elif direction == "backward_data":
            a, b = other, src          # A = w, B = dy
        else:
            a, b = src, other          # A = dy, B = x
        name = f"conv_igemm_{direction}"
        geometry = problem.geometry_args()
        if splits == 1:
            launch(ctx, built, name, gsize, lsize, [*geometry, *_buf(a), *_buf(b), *_buf(dst),
                                                    _I32(per_split), *ep.kernel_args(dst)])
            return
        need = self.workspace_size(ctx, problem, direction)
        if workspace is None or workspace.nbytes < need:
            raise ShapeError(f"{self.name} {direction} needs a workspace of {need} bytes, got "
                             f"{0 if workspace is None else workspace.nbytes}")
        partial_args = EpilogueArgs(alpha=1.0, beta=0.0)
        launch(ctx, built, name, gsize, lsize, [*geometry, *_buf(a), *_buf(b), *_buf(workspace),
                                                _I32(per_split), *partial_args.kernel_args(dst)])
        count = problem.k * problem.cg * problem.r * problem.s
        rgs, rls = launch_size(ctx, count)
        launch(ctx, built, "conv_igemm_reduce", rgs, rls,
               [_I32(count), _I32(splits), *_buf(workspace), *_buf(dst), _F32(ep.alpha),
                _F32(ep.beta)])


def implicit_gemm_variants():
    """Fixed-tile forward implicit GEMMs that find mode times beside the rule's choice on GPUs
    (the two tiles the rule picks between for kernels larger than 1x1)."""
    return [ImplicitGemm(tile, f"implicit_gemm_{tile.tile_m}x{tile.tile_n}x{tile.tile_k}",
                         directions=("forward",), gpu_only=True)
            for tile in (TILE_WIDE_K16, TILE_MEDIUM_K16)]


# ---- explicit GEMM (im2col) ---------------------------------------------------------------

class Im2colGemm(Algorithm):
    """Forward and backward data as one GEMM of the tuned GEMM engine (``ops/gemm.py``) over an
    explicit column matrix (kernels/conv_im2col.cl.mako), like MIOpen's GEMM algorithm, for
    groups 1 and kernels larger than 1x1 (1x1 has ``gemm``). The column matrix costs GK / (R S)
    times the input's traffic (about 2.25x for 3x3 stride 2), which the engine's faster inner
    loop repays on the large-K layers (3x3 stride 2, 7x7 stem).

    Workspace: forward col [GK][NP] then acc [K][NP]; backward data rows [K][NP] then
    dcol [GK][NP] (NP = N * Ho * Wo, GK = C * R * S), floats.

    ``tf32``: "im2col_gemm_tf32", the GEMM on the engine's TF32 tensor-core kernel."""
    name = "im2col_gemm"
    directions = ("forward", "backward_data")

    def __init__(self, tf32=False):
        self.tf32 = tf32
        if tf32:
            self.name = "im2col_gemm_tf32"

    @staticmethod
    def _sizes(problem):
        p = problem
        pixels = p.n * p.ho * p.wo
        taps = p.c * p.r * p.s
        return pixels, taps, (taps + p.k) * pixels

    def applies(self, ctx, problem, direction):
        p = problem
        if direction not in self.directions or p.groups != 1 or p.r * p.s == 1:
            return False
        pixels, taps, total = self._sizes(p)
        return taps * pixels < 2 ** 31 and total * 4 <= ctx.info.max_alloc_size

    def workspace_size(self, ctx, problem, direction):
        return self._sizes(problem)[-1] * 4

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        params["channel_last"] = problem.layout == "NHWC"
        return program.build(ctx, "conv_im2col", params)

    def _gemm_plan(self, ctx, problem, direction, w, workspace):
        pixels, taps, _ = self._sizes(problem)
        buf, base = workspace.buffer, workspace.offset_elements
        k = problem.k
        # Built on every run: the Convolution operator records the run once and replays it.
        if direction == "forward":
            # acc [K][NP] = w [K][GK] @ col [GK][NP]
            return gemm_plan(ctx, self.tf32, k, pixels, taps, w.buffer, w.offset_elements, taps,
                             buf, base, pixels, buf, base + taps * pixels, pixels)
        # dcol [GK][NP] = w^T [GK][K] @ rows [K][NP]
        return gemm_plan(ctx, self.tf32, taps, pixels, k, w.buffer, w.offset_elements, taps,
                         buf, base, pixels, buf, base + k * pixels, pixels, trans_a=True)

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction, epilogue)
        pixels, taps, total = self._sizes(problem)
        if workspace is None or workspace.nbytes < total * 4:
            raise ShapeError(f"im2col_gemm {direction} needs a workspace of {total * 4} bytes, "
                             f"got {0 if workspace is None else workspace.nbytes}")
        geometry = problem.geometry_args()
        buf, base = workspace.buffer, workspace.offset_elements
        plan = self._gemm_plan(ctx, problem, direction, other, workspace)
        if direction == "forward":
            gsize, lsize = launch_size(ctx, problem.c * pixels)
            launch(ctx, built, "conv_im2col", gsize, lsize,
                   [*geometry, *_buf(src), buf, _I32(base)])
            plan.enqueue()
            gsize, lsize = launch_size(ctx, problem.k * pixels)
            launch(ctx, built, "conv_rows_to_output", gsize, lsize,
                   [*geometry, buf, _I32(base + taps * pixels), *_buf(dst),
                    *ep.kernel_args(dst)])
        else:
            gsize, lsize = launch_size(ctx, problem.k * pixels)
            launch(ctx, built, "conv_output_to_rows", gsize, lsize,
                   [*geometry, *_buf(src), buf, _I32(base)])
            plan.enqueue()
            gsize, lsize = launch_size(ctx, math.prod(dst.shape))
            launch(ctx, built, "conv_col2im", gsize, lsize,
                   [*geometry, buf, _I32(base + problem.k * pixels), *_buf(dst),
                    _F32(ep.alpha), _F32(ep.beta)])
