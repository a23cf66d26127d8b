"""float16 / bfloat16 convolution (NCHW) on the GEMM engine's 16-bit GEMMs (``ops/gemm.py``:
the m16n8k16 tensor-core kernel "mma" on NVIDIA GPUs of compute capability 8.0 and later, the
portable "small" kernel elsewhere), products summed in float32, each result rounded to 16 bits
once (im2col_gemm16's forward with beta != 0: twice, below). Every direction, groups, stride,
padding, dilation; the forward's bias and activation in the GEMM's epilogue.

"im2col_gemm16" (any geometry), with NP = N * Ho * Wo, GK = C * R * S, LD = NP rounded up to 8
(column matrices' rows on 16-byte boundaries), a GEMM per group g over the whole batch, the
groups one strided batch (one GEMM each where a forward adds a bias: the GEMM's bias is the
same for every batch entry) (kernels/conv_gemm16.cl.mako moves the data):

  forward          col [GK][LD] = im2col(x)                                        16-bit
                   acc [K][LD]  = act(alpha * w_g [K/g x GK/g] @ col_g + bias)      16-bit
                   y            = acc permuted to NCHW (+ beta * y, rounded again)
  backward data    rows [K][LD] = dy permuted                                       16-bit
                   dcol [GK][LD] = w_g^T @ rows_g                                   float32
                   dx           = alpha * col2im(dcol) (float32 sums) + beta * dx, rounded once
  backward filter  rows = dy permuted, col = im2col(x)                              16-bit
                   dw_g = alpha * rows_g [K/g x NP] @ col_g^T + beta * dw_g: the batch is the
                   GEMM's K, summed in float32 inside it, rounded once

Forward and data gradient take parts of the batch where the whole one's workspace passes the
limit (``algorithms.batch_chunk``). So does the filter gradient, on its own: the GEMM of each
part adds into a float32 [K][GK/g] accumulator (beta 1 after the first), which
conv16_store_scaled rounds into dw at the end, so the batch is still summed in float32.
A filter gradient whose GEMM has few output tiles and a long K (batch x pixels: 200704 for a
56 x 56 layer at batch 64, one 128 x 128 tile for 64 channels) splits K into chunks, one GEMM
batch entry each writing float32 partial sums (``_filter_splits``; the 16-bit mma kernel has
no split of its own), which conv16_store_scaled adds and rounds once.

The forward's permutation adds beta * y after the activation, as the convolution's epilogue
does (the GEMM's adds it before); y is then rounded twice (beta = 0: once). One GEMM over all
images keeps the tiles full on small maps (7 x 7: 49 columns per image).

"gemm16" (1x1, stride 1, no padding): no im2col. Forward and backward data are one strided
batch of GEMMs per group straight between the tensors (y_n = w_g @ x_n per image, dx_n =
w_g^T @ dy_n; 16-bit C, alpha and beta in the GEMM's epilogue); backward filter is
im2col_gemm16's (for 1x1 the column matrix is x permuted).

The GEMM's parameters are the engine's choice (``tuning_db/gemm.json``) unless ``gemm_params``
names them (tests force the emulated tensor-core kernel that way). Scale, residual, chain and
per-position epilogues, and "gemm16"'s forward with an activation and beta != 0, are refused
(UnsupportedError).
Layout NCHW only.
"""
import math
from dataclasses import replace

import numpy as np

from ... import program
from ...errors import ShapeError, UnsupportedError
from ...dtypes import as_dtype
from ..pointwise import launch_size
from .algorithms import NO_EPILOGUE, Algorithm, _images, launch, workspace_limit

HALF_DTYPES = ("float16", "bfloat16")
_I32, _F32 = np.int32, np.float32
# Column matrices' rows start on 16-byte boundaries (8 16-bit values): the tensor-core
# kernel's 16-byte copies need it.
_ALIGN = 8
# A split filter gradient's chunks of K: at least this many pixels each, the float32 partial
# sums of all chunks within _SPLIT_BYTES.
_MIN_CHUNK = 1024
_SPLIT_BYTES = 64 << 20


def _round_up(value, multiple):
    return -(-value // multiple) * multiple


class Gemm16(Algorithm):
    """``direct``: "gemm16" (1x1, stride 1, no padding: forward and data gradient without
    im2col), else "im2col_gemm16"."""
    dtypes = HALF_DTYPES

    def __init__(self, direct=False, gemm_params=None):
        self.direct = direct
        self.name = "gemm16" if direct else "im2col_gemm16"
        # A GEMM parameter dict to force (``{"solver": ...}``), None for the engine's choice.
        self.gemm_params = gemm_params

    @staticmethod
    def _sizes(p):
        """(NP, LD, GK) of the problem."""
        pixels = p.n * p.ho * p.wo
        return pixels, _round_up(pixels, _ALIGN), p.c * p.r * p.s

    def _copies(self, problem, direction):
        """Whether the direction goes through the column matrices (else straight GEMMs)."""
        return not self.direct or direction == "backward_filter"

    def applies(self, ctx, problem, direction):
        p = problem
        if p.dtype not in HALF_DTYPES or p.layout != "NCHW" or direction not in self.directions:
            return False
        if self.direct and not p.is_1x1:
            return False
        pixels, ld, taps = self._sizes(p)
        if self._copies(p, direction) and max(taps, p.k) * ld >= 2 ** 31:
            return False
        return self.workspace_size(ctx, p, direction) <= ctx.info.max_alloc_size

    @staticmethod
    def _filter_bytes(p, images, parts):
        """Workspace bytes of a filter gradient over ``images`` per part (``parts`` > 1: with
        the float32 accumulator)."""
        ld = _round_up(images * p.ho * p.wo, _ALIGN)
        acc = 4 * p.k * p.cg * p.r * p.s if parts > 1 else 0
        return _round_up(2 * p.k * ld, 16) + _round_up(2 * p.c * p.r * p.s * ld, 16) + acc

    def filter_chunk(self, problem):
        """Images per part of a filter gradient: the whole batch where its column matrices
        fit the workspace limit (``algorithms.workspace_limit``), else equal parts that do
        (one image at least)."""
        p = problem
        limit = workspace_limit(p, "backward_filter")
        if p.n == 1 or self._filter_bytes(p, p.n, 1) <= limit:
            return p.n
        per_image = self._filter_bytes(p, 2, 2) - self._filter_bytes(p, 1, 2)
        fixed = self._filter_bytes(p, 1, 2) - per_image
        chunk = max(1, min(p.n, int((limit - fixed) // max(per_image, 1))))
        runs = -(-p.n // chunk)
        return -(-p.n // runs)

    @staticmethod
    def _filter_splits(ctx, problem):
        """Chunks of K (the pixels of the whole batch) that an unchunked filter gradient's GEMM
        is split into (1: none): on a GPU, for one group whose 128 x 128 output tiles are
        fewer than its compute units, enough work-groups for about two per compute unit, each chunk at least ``_MIN_CHUNK`` long,
        the float32 partial sums within ``_SPLIT_BYTES``."""
        p = problem
        pixels = p.n * p.ho * p.wo
        if not ctx.info.is_gpu or p.groups != 1 or pixels < 2 * _MIN_CHUNK:
            return 1
        tiles = -(-p.k // 128) * -(-(p.c * p.r * p.s) // 128)
        if tiles >= ctx.info.compute_units:
            return 1
        wanted = -(-2 * ctx.info.compute_units // tiles)
        by_bytes = _SPLIT_BYTES // (4 * p.k * p.c * p.r * p.s)
        return max(1, min(wanted, pixels // _MIN_CHUNK, by_bytes))

    def _parts(self, problem, direction, ctx=None):
        """Workspace layout: ((16-bit elements of col or rows, 16-bit elements of rows or 0,
        float32 elements of acc or dcol))."""
        p = problem
        if not self._copies(p, direction):
            return 0, 0, 0
        pixels, ld, taps = self._sizes(p)
        if direction == "forward":
            return taps * ld, p.k * ld, 0
        if direction == "backward_data":
            return p.k * ld, 0, taps * ld
        chunk = self.filter_chunk(p)
        if chunk < p.n:
            ld = _round_up(chunk * p.ho * p.wo, _ALIGN)
            # Each part split along its pixels too where that pays: as many float32 slots
            # (within _SPLIT_BYTES, outside the chunk's own budget).
            splits = 1 if ctx is None else self._filter_splits(ctx, replace(p, n=chunk))
            return p.k * ld, taps * ld, p.k * p.cg * p.r * p.s * splits
        splits = 1 if ctx is None else self._filter_splits(ctx, p)
        return p.k * ld, taps * ld, (p.k * taps if splits > 1 else 0) * splits

    def _offsets(self, problem, direction, workspace):
        """Element offsets (16-bit, 16-bit, float32) of the workspace's parts, each part on a
        16-byte boundary (the workspace's own offset is one: a context scratch or a new
        buffer)."""
        first, second, wide = self._parts(problem, direction)   # the offsets need no ctx
        base = workspace.offset
        at_second = base + _round_up(2 * first, 16)
        at_wide = at_second + _round_up(2 * second, 16)
        return base // 2, at_second // 2, at_wide // 4

    def workspace_size(self, ctx, problem, direction):
        first, second, wide = self._parts(problem, direction, ctx)
        if not (first or second or wide):
            return 0
        return _round_up(2 * first, 16) + _round_up(2 * second, 16) + 4 * wide

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        return program.build(ctx, "conv_gemm16",
                             {"TYPE": "half" if problem.dtype == "float16" else "bfloat16"})

    # ---- the GEMMs ----------------------------------------------------------------------

    def _gemm(self, ctx, problem, M, N, K, *args, c_dtype=None, **kwargs):
        from ..gemm import GemmPlan
        dtype = as_dtype(problem.dtype)
        if self.gemm_params is not None:
            kwargs["params"] = dict(self.gemm_params)
        GemmPlan(ctx, M, N, K, *args, dtype=dtype, c_dtype=dtype if c_dtype is None else c_dtype,
                 **kwargs).enqueue()

    def _group_gemms(self, ctx, problem, M, N, K, a, b, c, bias=None, **kwargs):
        """The groups' GEMMs on the column matrices: ``a``, ``b``, ``c`` are (buffer, offset,
        leading dimension, offset step from one group to the next). One strided batch over the
        groups, or one GEMM per group with a bias (the GEMM's bias is the same for every
        batch entry; a group's is the bias's next M values)."""
        if bias is None or problem.groups == 1:
            batch = problem.groups
            self._gemm(ctx, problem, M, N, K, *a[:3], *b[:3], *c[:3], batch=batch,
                       stride_a=a[3] if batch > 1 else 0, stride_b=b[3] if batch > 1 else 0,
                       stride_c=c[3] if batch > 1 else 0,
                       bias_buf=None if bias is None else bias.buffer,
                       bias_off=0 if bias is None else bias.offset_elements, **kwargs)
            return
        for g in range(problem.groups):
            self._gemm(ctx, problem, M, N, K, a[0], a[1] + g * a[3], a[2], b[0], b[1] + g * b[3],
                       b[2], c[0], c[1] + g * c[3], c[2], bias_buf=bias.buffer,
                       bias_off=bias.offset_elements + g * M, **kwargs)

    def _check_epilogue(self, epilogue, ep):
        if (epilogue.has_scale or epilogue.has_residual or epilogue.chain
                or epilogue.affine_per_position):
            raise UnsupportedError("16-bit convolutions fuse a bias and an activation only (no "
                                   "scale, residual, chain or per-position epilogue)")
        # The GEMM's epilogue adds beta * C before the activation, the convolution's after it.
        if self.direct and epilogue.activation is not None and ep.beta != 0:
            raise UnsupportedError("16-bit convolutions fuse an activation only with beta = 0")

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        p = problem
        if direction == "forward":
            self._check_epilogue(epilogue, ep)
        need = self.workspace_size(ctx, p, direction)
        if need and (workspace is None or workspace.nbytes < need):
            raise ShapeError(f"{self.name} {direction} needs a workspace of {need} bytes, got "
                             f"{0 if workspace is None else workspace.nbytes}")
        built = self.prepare(ctx, p, direction)
        if not self._copies(p, direction):
            self._run_direct(ctx, p, direction, src, other, dst, ep, epilogue)
            return
        pixels, ld, taps = self._sizes(p)
        geometry = p.geometry_args()
        buf = workspace.buffer
        first, second, wide = self._offsets(p, direction, workspace)
        kg, gk = p.kg, p.cg * p.r * p.s
        if direction == "forward":
            x, w, y = src, other, dst
            self._launch_im2col(ctx, built, p, geometry, x, buf, first, ld)
            self._group_gemms(ctx, p, kg, pixels, gk, (w.buffer, w.offset_elements, gk, kg * gk),
                              (buf, first, ld, gk * ld), (buf, second, ld, kg * ld),
                              bias=ep.shift, alpha=ep.alpha, activation=epilogue.activation,
                              bias_per="m")
            gsize, lsize = launch_size(ctx, math.prod(y.shape))
            launch(ctx, built, "conv16_rows_to_output", gsize, lsize,
                   [*geometry, buf, _I32(second), _I32(ld), y.buffer, _I32(y.offset_elements),
                    _F32(ep.beta)])
            return
        if direction == "backward_data":
            dy, w, dx = src, other, dst
            self._launch_rows(ctx, built, p, geometry, dy, buf, first, ld)
            self._group_gemms(ctx, p, gk, pixels, kg, (w.buffer, w.offset_elements, gk, kg * gk),
                              (buf, first, ld, kg * ld), (buf, wide, ld, gk * ld), trans_a=True,
                              c_dtype=np.float32)
            gsize, lsize = launch_size(ctx, math.prod(dx.shape))
            launch(ctx, built, "conv16_col2im", gsize, lsize,
                   [*geometry, buf, _I32(wide), _I32(ld), dx.buffer, _I32(dx.offset_elements),
                    _F32(ep.alpha), _F32(ep.beta)])
            return
        dy, x, dw = src, other, dst
        chunk = self.filter_chunk(p)
        if chunk < p.n:
            self._run_filter_in_parts(ctx, built, p, chunk, dy, x, dw, ep, buf,
                                      (first, second, wide))
            return
        self._launch_rows(ctx, built, p, geometry, dy, buf, first, ld)
        self._launch_im2col(ctx, built, p, geometry, x, buf, second, ld)
        splits = self._filter_splits(ctx, p)
        if splits > 1:
            self._run_filter_split(ctx, built, p, splits, dw, ep, buf, first, second, wide, ld)
            return
        self._group_gemms(ctx, p, kg, gk, pixels, (buf, first, ld, kg * ld),
                          (buf, second, ld, gk * ld), (dw.buffer, dw.offset_elements, gk, kg * gk),
                          trans_b=True, alpha=ep.alpha, beta=ep.beta)

    def _split_gemms(self, ctx, p, pixels, kc, buf, first, second, wide, ld, beta=0.0):
        """One group's filter gradient over ``pixels`` columns with K in chunks of kc (a
        multiple of _ALIGN, so that every chunk's operands stay on 16-byte boundaries): the
        whole chunks as one strided GEMM batch into float32 slots [chunk][K][GK] of the
        workspace at ``wide``, the rest into the next slot (``beta`` 1: added to what the slots
        hold). Returns the slots written."""
        gk = p.c * p.r * p.s
        whole, rest = divmod(pixels, kc)
        slot = p.k * gk
        if whole:
            self._gemm(ctx, p, p.k, gk, kc, buf, first, ld, buf, second, ld, buf, wide, gk,
                       trans_b=True, c_dtype=np.float32, beta=beta, batch=whole,
                       stride_a=kc, stride_b=kc, stride_c=slot)
        if rest:
            self._gemm(ctx, p, p.k, gk, rest, buf, first + whole * kc, ld, buf,
                       second + whole * kc, ld, buf, wide + whole * slot, gk, trans_b=True,
                       c_dtype=np.float32, beta=beta)
        return whole + (rest > 0)

    def _store_slots(self, ctx, built, p, slots, dw, ep, buf, wide):
        """dw = alpha * (the sum of the float32 slots at ``wide``) + beta * dw, rounded once."""
        count = p.k * p.cg * p.r * p.s
        gsize, lsize = launch_size(ctx, count)
        launch(ctx, built, "conv16_store_scaled", gsize, lsize,
               [_I32(count), _I32(slots), buf, _I32(wide), dw.buffer, _I32(dw.offset_elements),
                _F32(ep.alpha), _F32(ep.beta)])

    def _run_filter_split(self, ctx, built, p, splits, dw, ep, buf, first, second, wide, ld):
        """One group's filter gradient with K (the pixels) in ``splits`` chunks (slots added
        and rounded once by conv16_store_scaled)."""
        pixels = self._sizes(p)[0]
        kc = _round_up(-(-pixels // splits), _ALIGN)
        slots = self._split_gemms(ctx, p, pixels, kc, buf, first, second, wide, ld)
        self._store_slots(ctx, built, p, slots, dw, ep, buf, wide)

    def _run_filter_in_parts(self, ctx, built, p, chunk, dy, x, dw, ep, buf, offsets):
        """The filter gradient ``chunk`` images at a time: each part's GEMMs add into the
        float32 accumulator, rounded into dw once at the end. Where a part's GEMM would leave
        the GPU idle (``_filter_splits`` of a whole part), each part is split along its pixels
        the same way, into the same slots: the first part writes every slot, later (never
        longer) parts add into the first of them."""
        first, second, wide = offsets
        kg, gk = p.kg, p.cg * p.r * p.s
        splits = self._filter_splits(ctx, replace(p, n=chunk))
        kc = slots = None
        if splits > 1:
            kc = _round_up(-(-(chunk * p.ho * p.wo) // splits), _ALIGN)
        for start in range(0, p.n, chunk):
            count = min(chunk, p.n - start)
            part = replace(p, n=count)
            pixels, ld, _ = self._sizes(part)
            geometry = part.geometry_args()
            self._launch_rows(ctx, built, part, geometry, _images(dy, start, count), buf, first,
                              ld)
            self._launch_im2col(ctx, built, part, geometry, _images(x, start, count), buf,
                                second, ld)
            beta = 0.0 if start == 0 else 1.0
            if kc is not None:
                written = self._split_gemms(ctx, part, pixels, kc, buf, first, second, wide, ld,
                                            beta)
                slots = written if slots is None else slots
                continue
            self._group_gemms(ctx, part, kg, gk, pixels, (buf, first, ld, kg * ld),
                              (buf, second, ld, gk * ld), (buf, wide, gk, kg * gk), trans_b=True,
                              beta=beta, c_dtype=np.float32)
        self._store_slots(ctx, built, p, slots or 1, dw, ep, buf, wide)

    @staticmethod
    def _launch_im2col(ctx, built, p, geometry, x, buf, off, ld):
        gsize, lsize = launch_size(ctx, p.c * p.n * p.ho * p.wo)
        launch(ctx, built, "conv16_im2col", gsize, lsize,
               [*geometry, x.buffer, _I32(x.offset_elements), buf, _I32(off), _I32(ld)])

    @staticmethod
    def _launch_rows(ctx, built, p, geometry, dy, buf, off, ld):
        gsize, lsize = launch_size(ctx, math.prod(dy.shape))
        launch(ctx, built, "conv16_output_to_rows", gsize, lsize,
               [*geometry, dy.buffer, _I32(dy.offset_elements), buf, _I32(off), _I32(ld)])

    def _run_direct(self, ctx, p, direction, src, other, dst, ep, epilogue):
        """1x1, stride 1, no padding: per group, one GEMM per image (a strided batch) between
        the tensors themselves (hw = H * W = Ho * Wo)."""
        hw, kg, cg = p.h * p.w, p.kg, p.cg
        for g in range(p.groups):
            if direction == "forward":
                x, w, y = src, other, dst
                bias = ep.shift
                self._gemm(ctx, p, kg, hw, cg, w.buffer, w.offset_elements + g * kg * cg, cg,
                           x.buffer, x.offset_elements + g * cg * hw, hw,
                           y.buffer, y.offset_elements + g * kg * hw, hw,
                           alpha=ep.alpha, beta=ep.beta, activation=epilogue.activation,
                           bias_buf=None if bias is None else bias.buffer,
                           bias_off=0 if bias is None else bias.offset_elements + g * kg,
                           bias_per="m", batch=p.n, stride_a=0, stride_b=p.c * hw,
                           stride_c=p.k * hw)
            else:
                dy, w, dx = src, other, dst
                self._gemm(ctx, p, cg, hw, kg, w.buffer, w.offset_elements + g * kg * cg, cg,
                           dy.buffer, dy.offset_elements + g * kg * hw, hw,
                           dx.buffer, dx.offset_elements + g * cg * hw, hw, trans_a=True,
                           alpha=ep.alpha, beta=ep.beta, batch=p.n, stride_a=0,
                           stride_b=p.k * hw, stride_c=p.c * hw)


def backward_bias16(ctx, problem, dy, db, alpha=1.0, beta=0.0):
    """db[k] = alpha * sum over (n, oh, ow) of dy[n, k, oh, ow] + beta * db[k] on 16-bit
    tensors: float32 sums, one rounding."""
    built = program.build(ctx, "conv_gemm16",
                          {"TYPE": "half" if problem.dtype == "float16" else "bfloat16"})
    group = 64
    launch(ctx, built, "conv16_bias_grad", (problem.k * group,), (group,),
           [*problem.geometry_args(), dy.buffer, _I32(dy.offset_elements), db.buffer,
            _I32(db.offset_elements), _F32(alpha), _F32(beta)])
