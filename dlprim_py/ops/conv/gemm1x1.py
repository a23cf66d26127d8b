"""1x1 convolutions (stride 1, no padding, groups 1) as plain GEMMs on the tuned GEMM engine
(``dlprim_py.ops.gemm``), without any im2col: the tensors already are the GEMM operands.

  NCHW forward        y[n] (K x HW)  = w (K x C) @ x[n] (C x HW)        batch over n
  NCHW backward data  dx[n] (C x HW) = w^T (C x K) @ dy[n] (K x HW)     batch over n
  NHWC forward        y (NHW x K)    = x (NHW x C) @ w^T (C x K)
  NHWC backward data  dx (NHW x C)   = dy (NHW x K) @ w (K x C)
  NHWC backward filt. dw (K x C)     = dy^T (K x NHW) @ x (NHW x C)

The GEMM's epilogue carries alpha, beta, the bias (shift) and the activation; a forward call
with a scale or a residual runs the implicit-GEMM kernel instead, which has the full epilogue.
NCHW backward filter sums over images, which is not one GEMM: the implicit GEMM does it.
"""
from collections import OrderedDict

from .algorithms import NO_EPILOGUE, Algorithm, ImplicitGemm, enqueue


class Gemm1x1(Algorithm):
    name = "gemm"
    _PLANS = 64   # plans bind their buffers; keep the most recent ones

    def __init__(self):
        self.fallback = ImplicitGemm()
        self.plans = OrderedDict()

    def applies(self, ctx, problem, direction):
        p = problem
        if not (p.is_1x1 and p.groups == 1):
            return False
        if direction == "backward_filter" and p.layout == "NCHW":
            return False
        return True

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        from .. import gemm   # the GEMM engine builds its kernels per plan
        return gemm

    def _needs_fallback(self, epilogue):
        return epilogue.has_scale or epilogue.has_residual

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        if direction == "forward" and self._needs_fallback(epilogue):
            self.fallback.run(ctx, problem, direction, src, other, dst, ep, epilogue, workspace)
            return
        key = (ctx.cl_context.int_ptr, problem, direction, epilogue,
               *((t.buffer.int_ptr, t.offset_elements) if t is not None else None
                 for t in (src, other, dst, ep.shift)), ep.alpha, ep.beta)
        plan = self.plans.get(key)
        if plan is None:
            plan = self._plan(ctx, problem, direction, src, other, dst, ep, epilogue)
            self.plans[key] = plan
            while len(self.plans) > self._PLANS:
                self.plans.popitem(last=False)
        else:
            self.plans.move_to_end(key)
        enqueue(plan.enqueue)

    def _plan(self, ctx, p, direction, src, other, dst, ep, epilogue):
        from ..gemm import GemmPlan
        hw = p.h * p.w
        off = lambda t: t.offset_elements  # noqa: E731
        common = dict(alpha=ep.alpha, beta=ep.beta)
        if direction == "forward":
            x, w, y = src, other, dst
            if ep.shift is not None:
                common.update(bias_buf=ep.shift.buffer, bias_off=off(ep.shift),
                              bias_per="m" if p.layout == "NCHW" else "n")
            common.update(activation=epilogue.activation)
            if p.layout == "NCHW":
                return GemmPlan(ctx, p.k, hw, p.c, w.buffer, off(w), p.c, x.buffer, off(x), hw,
                                y.buffer, off(y), hw, batch=p.n, stride_a=0,
                                stride_b=p.c * hw, stride_c=p.k * hw, **common)
            return GemmPlan(ctx, p.n * hw, p.k, p.c, x.buffer, off(x), p.c, w.buffer, off(w),
                            p.c, y.buffer, off(y), p.k, trans_b=True, **common)
        if direction == "backward_data":
            dy, w, dx = src, other, dst
            if p.layout == "NCHW":
                return GemmPlan(ctx, p.c, hw, p.k, w.buffer, off(w), p.c, dy.buffer, off(dy), hw,
                                dx.buffer, off(dx), hw, trans_a=True, batch=p.n, stride_a=0,
                                stride_b=p.k * hw, stride_c=p.c * hw, **common)
            return GemmPlan(ctx, p.n * hw, p.c, p.k, dy.buffer, off(dy), p.k, w.buffer, off(w),
                            p.c, dx.buffer, off(dx), p.c, **common)
        dy, x, dw = src, other, dst
        return GemmPlan(ctx, p.k, p.c, p.n * hw, dy.buffer, off(dy), p.k, x.buffer, off(x), p.c,
                        dw.buffer, off(dw), p.c, trans_a=True, **common)
