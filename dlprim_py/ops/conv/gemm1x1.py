"""1x1 convolutions (no padding, groups 1) as GEMMs on the tuned GEMM engine
(``dlprim_py.ops.gemm``), without any im2col: the tensors already are the GEMM operands.

NCHW tensors are seen as folded matrices (``gemm.Fold``): x as C x N*P, y as K x N*P with P the
pixels per image, column j = n * P + p addressing image n, pixel p. Every direction is then ONE
GEMM over all images, whatever their size (7x7 maps give tiles as full as 56x56 ones):

  NCHW forward        y (K x N*P)  = w (K x C) @ x (C x N*P)        x sampled in place if strided
  NCHW backward data  dx (C x N*P) = w^T (C x K) @ dy (K x N*P)
  NCHW backward filt. dw (K x C)   = dy (K x N*P) @ x^T (N*P x C)   split along the long N*P
  NHWC forward        y (NHW x K)  = x (NHW x C) @ w^T (C x K)
  NHWC backward data  dx (NHW x C) = dy (NHW x K) @ w (K x C)
  NHWC backward filt. dw (K x C)   = dy^T (K x NHW) @ x (NHW x C)   (unit stride)

The forward GEMM stores through the convolution's whole epilogue (the GEMM engine's "conv"
order): act(alpha * acc * scale + shift + residual_alpha * z) + beta * y_old, with scale and
shift per output channel or per output position (per-activation batch norm), no extra pass.

With stride > 1 only every stride-th pixel takes part. NCHW forward and backward filter read
those pixels of x in place (a strided fold). NCHW backward data multiplies into a dense
(N, C, Ho, Wo) workspace and scatters it into dx with zeros between (kernels/conv_gemm.cl.mako),
instead of multiplying the zeros as the implicit GEMM's backward data does; NHWC forward
gathers the pixels into such a workspace first.

"gemm_per_image" (``Gemm1x1(per_image=True)``) runs NCHW forward and backward data as one GEMM
per image (a strided batch; strided forward through the gather). On the H200
(benchmarks/gemm1x1_probe.py, 16 layers) it beat the folded GEMM on two forward layers (by 6%,
and by 20% on 32->16 channels before the 32-row tile rule) and one data gradient (3%), and lost
on the others by up to 2.2x, so only find mode or DLPRIM_CONV_ALGO chooses it.
"""
import dataclasses
import math

from ... import program
from ...tensor import Tensor
from ..pointwise import launch_size

import numpy as np

np_i32, np_f32 = np.int32, np.float32
from .algorithms import NO_EPILOGUE, Algorithm, EpilogueArgs, _buf, gemm_plan, launch


class Gemm1x1(Algorithm):
    """``per_image``: "gemm_per_image" (above); ``tf32``: "gemm_tf32", the folded GEMMs on the
    GEMM engine's TF32 tensor-core kernel ("mma", which addresses the folds and stores through
    the same epilogue)."""
    name = "gemm"

    def __init__(self, per_image=False, tf32=False):
        self.per_image = per_image
        self.tf32 = tf32
        if per_image:
            self.name = "gemm_per_image"
        elif tf32:
            self.name = "gemm_tf32"

    def applies(self, ctx, problem, direction):
        p = problem
        if not (p.r == p.s == 1 and p.pad_h == p.pad_w == 0 and p.groups == 1):
            return False
        if self.per_image and (p.layout != "NCHW" or direction == "backward_filter"):
            return False   # NHWC runs the same GEMMs as "gemm"
        if direction == "backward_filter":
            if p.layout == "NCHW":
                return not self.per_image
            return self._unit_stride(p)
        return True

    @staticmethod
    def _unit_stride(problem):
        return problem.stride_h == problem.stride_w == 1

    def _folded(self, problem):
        return problem.layout == "NCHW" and not self.per_image

    def workspace_size(self, ctx, problem, direction):
        if self._unit_stride(problem) or direction == "backward_filter":
            return 0
        if self._folded(problem) and direction == "forward":
            return 0
        p = problem
        return p.n * p.c * p.ho * p.wo * 4

    @staticmethod
    def _dense(problem):
        """The stride-1 problem over the subsampled pixels."""
        return dataclasses.replace(problem, h=problem.ho, w=problem.wo, stride_h=1, stride_w=1)

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        from .. import gemm   # the GEMM engine builds its kernels per plan
        return gemm

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        strided = not self._unit_stride(problem)
        if strided and not (self._folded(problem) and direction != "backward_data"):
            self._run_strided(ctx, problem, direction, src, other, dst, ep, epilogue, workspace)
            return
        self._run_dense(ctx, problem, direction, src, other, dst, ep, epilogue)

    def _run_strided(self, ctx, problem, direction, src, other, dst, ep, epilogue, workspace):
        dense = self._dense(problem)
        sub = Tensor(ctx, workspace.buffer, dense.x_shape, offset=workspace.offset)
        built = program.build(ctx, "conv_gemm", {})
        geometry = problem.geometry_args()
        sub_strides = [dense.x_strides()[i] for i in range(4)]
        if direction == "forward":
            gsize, lsize = launch_size(ctx, sub.size)
            launch(ctx, built, "conv_gemm_gather", gsize, lsize,
                   [*geometry, *_buf(src), *_buf(sub), *(np_i32(v) for v in sub_strides)])
            self._run_dense(ctx, dense, direction, sub, other, dst, ep, epilogue)
            return
        self._run_dense(ctx, dense, direction, src, other, sub, EpilogueArgs(), NO_EPILOGUE)
        gsize, lsize = launch_size(ctx, math.prod(dst.shape))
        launch(ctx, built, "conv_gemm_scatter", gsize, lsize,
               [*geometry, *_buf(sub), *(np_i32(v) for v in sub_strides), *_buf(dst),
                np_f32(ep.alpha), np_f32(ep.beta)])

    def _run_dense(self, ctx, problem, direction, src, other, dst, ep, epilogue):
        # Built on every run: the Convolution operator records the run once and replays it.
        self._plan(ctx, problem, direction, src, other, dst, ep, epilogue).enqueue()

    @staticmethod
    def _x_fold(p):
        """x (N, C, H, W) as C x N*Ho*Wo: the pixels a 1x1 convolution of stride p reads."""
        from ..gemm import Fold
        if p.stride_h == p.stride_w == 1:
            return Fold(p.h * p.w, p.c * p.h * p.w)
        return Fold(p.ho * p.wo, p.c * p.h * p.w, p.wo, p.stride_h * p.w, p.stride_w)

    def _plan(self, ctx, p, direction, src, other, dst, ep, epilogue):
        from ..gemm import Fold
        tf32 = self.tf32
        off = lambda t: t.offset_elements  # noqa: E731
        common = dict(alpha=ep.alpha, beta=ep.beta)
        if direction == "forward":
            # Output channels are the GEMM's rows in NCHW, its columns in NHWC.
            per = "position" if epilogue.affine_per_position else \
                "m" if p.layout == "NCHW" else "n"
            common.update(order="conv", activation=epilogue.activation,
                          residual_alpha=ep.residual_alpha)
            for t, name in ((ep.shift, "bias"), (ep.scale, "scale")):
                if t is not None:
                    common.update({f"{name}_buf": t.buffer, f"{name}_off": off(t),
                                   f"{name}_per": per})
            if ep.residual is not None:
                common.update(residual_buf=ep.residual.buffer, residual_off=off(ep.residual))
            if epilogue.chain:
                # Computed per row (channel) or position by the GEMM's own epilogue.
                common.update(chain=epilogue.chain, chain_args=ep.chain_args,
                              chain_per="m" if p.layout == "NCHW" else "n")
        if self._folded(p):
            hw, pixels = p.h * p.w, p.ho * p.wo
            if direction == "forward":
                x, w, y = src, other, dst
                return gemm_plan(ctx, tf32, p.k, p.n * pixels, p.c, w.buffer, off(w), p.c,
                                 x.buffer, off(x), hw, y.buffer, off(y), pixels,
                                 fold_b=self._x_fold(p), fold_c=Fold(pixels, p.k * pixels),
                                 **common)
            if direction == "backward_data":   # unit stride here: pixels == hw
                dy, w, dx = src, other, dst
                return gemm_plan(ctx, tf32, p.c, p.n * hw, p.k, w.buffer, off(w), p.c,
                                 dy.buffer, off(dy), hw, dx.buffer, off(dx), hw, trans_a=True,
                                 fold_b=Fold(hw, p.k * hw), fold_c=Fold(hw, p.c * hw), **common)
            dy, x, dw = src, other, dst
            return gemm_plan(ctx, tf32, p.k, p.c, p.n * pixels, dy.buffer, off(dy), pixels,
                             x.buffer, off(x), hw, dw.buffer, off(dw), p.c, trans_b=True,
                             fold_a=Fold(pixels, p.k * pixels), fold_b=self._x_fold(p),
                             **common)
        hw = p.h * p.w
        if direction == "forward":
            x, w, y = src, other, dst
            if p.layout == "NCHW":
                return gemm_plan(ctx, tf32, p.k, hw, p.c, w.buffer, off(w), p.c, x.buffer,
                                 off(x), hw, y.buffer, off(y), hw, batch=p.n, stride_a=0,
                                 stride_b=p.c * hw, stride_c=p.k * hw, **common)
            return gemm_plan(ctx, tf32, p.n * hw, p.k, p.c, x.buffer, off(x), p.c, w.buffer,
                             off(w), p.c, y.buffer, off(y), p.k, trans_b=True, **common)
        if direction == "backward_data":
            dy, w, dx = src, other, dst
            if p.layout == "NCHW":
                return gemm_plan(ctx, tf32, p.c, hw, p.k, w.buffer, off(w), p.c, dy.buffer,
                                 off(dy), hw, dx.buffer, off(dx), hw, trans_a=True, batch=p.n,
                                 stride_a=0, stride_b=p.k * hw, stride_c=p.c * hw, **common)
            return gemm_plan(ctx, tf32, p.n * hw, p.c, p.k, dy.buffer, off(dy), p.k, w.buffer,
                             off(w), p.c, dx.buffer, off(dx), p.c, **common)
        dy, x, dw = src, other, dst
        return gemm_plan(ctx, tf32, p.k, p.c, p.n * hw, dy.buffer, off(dy), p.k, x.buffer,
                         off(x), p.c, dw.buffer, off(dw), p.c, trans_a=True, **common)
