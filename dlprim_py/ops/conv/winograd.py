"""Winograd (kernels/conv_winograd.cl.mako) for 3x3, stride 1, dilation 1, groups 1:

* ``winograd``: F(2x2, 3x3) for forward and backward data, F(3x3, 2x2) for backward filter
  (16 transform elements, 2.25x fewer multiplies than direct);
* ``winograd_f4x4``: F(4x4, 3x3) for forward and backward data (36 transform elements, 4x fewer
  multiplies, input and output transforms 2.25x smaller than F(2x2)'s per output), F(3x3, 4x4)
  for backward filter. Its matrices come from ``cook_toom`` with the points 0, 1, -1, 2, -1/2
  and infinity, the best conditioned of the sets drawn from 0, +-1, +-2, +-1/2 for float32
  (relative error about 3x F(2x2)'s);
* ``winograd_tf32``: F(2x2) with the channel GEMMs in TF32 on the GEMM engine's tensor-core
  kernel (where TF32 is allowed; ``selection`` says why F(4x4) has no TF32 variant).

The transforms run in their own kernels (the weight and input transforms of forward and
backward data in one launch) and the per-element channel GEMMs run as one batched
GEMM of the tuned GEMM engine (``dlprim_py.ops.gemm``); the epilogue is applied in the output
transform. Workspace: U (E x GM x GK), V (E x GK x T), M (E x GM x T) floats with E transform
elements and T = N * ceil(Ho/m) * ceil(Wo/m) tiles."""
import functools
from dataclasses import replace
from fractions import Fraction
import math

import numpy as np

from ... import program
from ...errors import ShapeError
from ...tensor import Tensor
from ..pointwise import launch_size
from .algorithms import NO_EPILOGUE, WORKSPACE_CAP, Algorithm, _buf, gemm_plan, launch

_I32 = np.int32
_F32 = np.float32


def _polynomial_product(a, b):
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def cook_toom(points, m, r=3):
    """Exact (A^T, G, B^T) of the Winograd correlation F(m, r), y = A^T [(G g) * (B^T d)], from
    the m + r - 2 finite interpolation ``points`` and the point at infinity: A^T (m x n) and
    G (n x r) evaluate at the points, B^T (n x n) holds the interpolation polynomials,
    n = m + r - 1. Lists of rows of Fractions."""
    n = m + r - 1
    points = [Fraction(p) for p in points]
    if len(points) != n - 1 or len(set(points)) != len(points):
        raise ValueError(f"F({m}, {r}) needs {n - 1} distinct finite points, got {points}")
    at = [[p ** i for p in points] + [Fraction(int(i == m - 1))] for i in range(m)]
    g, bt = [], []
    for j, p in enumerate(points):
        scale, poly = Fraction(1), [Fraction(1)]
        for q in points[:j] + points[j + 1:]:
            scale *= p - q
            poly = _polynomial_product(poly, [-q, Fraction(1)])
        g.append([p ** k / scale for k in range(r)])
        bt.append(poly + [Fraction(0)] * (n - len(poly)))
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    poly = [Fraction(1)]
    for q in points:
        poly = _polynomial_product(poly, [-q, Fraction(1)])
    bt.append(poly)
    return at, g, bt


F4X4_POINTS = (0, 1, -1, 2, Fraction(-1, 2))


@functools.lru_cache(maxsize=None)
def transform_matrices(m, r=3):
    """(A^T, G, B^T) of F(m, r) on F4X4_POINTS as tuples of rows of floats."""
    return tuple(tuple(tuple(float(v) for v in row) for row in matrix)
                 for matrix in cook_toom(F4X4_POINTS, m, r))


def _shape(problem, direction):
    """(GM, GK, output height, output width, input channels/height/width, pads) of the pass."""
    p = problem
    if direction == "forward":
        return p.k, p.c, p.ho, p.wo, p.h, p.w, p.pad_h, p.pad_w
    return p.c, p.k, p.h, p.w, p.ho, p.wo, 2 - p.pad_h, 2 - p.pad_w


class Winograd(Algorithm):
    """F(m x m, 3x3) with ``output_tile`` m = 2 or 4 (every direction). ``tf32``: the
    per-element channel GEMMs on the GEMM engine's TF32 tensor-core kernel ("winograd_tf32"
    for F(2x2)); the transforms stay float32."""

    def __init__(self, output_tile=2, name=None, tf32=False):
        if output_tile not in (2, 4):
            raise ValueError(f"output_tile must be 2 or 4, got {output_tile}")
        self.output_tile = output_tile
        self.elements = (output_tile + 2) ** 2
        self.tf32 = tf32
        self.name = name or ("winograd" if output_tile == 2 else f"winograd_f{output_tile}x"
                                                                 f"{output_tile}") \
            + ("_tf32" if tf32 else "")
        self.directions = ("forward", "backward_data", "backward_filter")

    def applies(self, ctx, problem, direction):
        # Forward and data-gradient calls run on parts of the batch whose workspace fits the
        # limit (algorithms.batch_chunk), so one image's must fit; a filter gradient's is whole.
        p = problem
        return (direction in self.directions and p.r == 3 and p.s == 3 and p.groups == 1
                and p.stride_h == p.stride_w == 1 and p.dil_h == p.dil_w == 1
                and p.pad_h <= 2 and p.pad_w <= 2
                and self._sizes(p if direction == "backward_filter" else replace(p, n=1),
                                direction)[-1] * 4 <= WORKSPACE_CAP)

    def _sizes(self, problem, direction):
        """Tiles and the float counts of the three workspace parts and their sum."""
        p = problem
        step, e = self.output_tile, self.elements
        if direction == "backward_filter":
            tiles = p.n * math.ceil(p.ho / step) * math.ceil(p.wo / step)
            v, d, m = e * p.c * tiles, e * p.k * tiles, e * p.k * p.c
            return tiles, v, d, m, v + d + m
        gm, gk, ho, wo = _shape(problem, direction)[:4]
        tiles = problem.n * math.ceil(ho / step) * math.ceil(wo / step)
        u, v, m = e * gm * gk, e * gk * tiles, e * gm * tiles
        return tiles, u, v, m, u + v + m

    def _gemm_plan(self, ctx, problem, direction, workspace):
        tiles, u_size, v_size, m_size, _ = self._sizes(problem, direction)
        base = workspace.offset_elements
        buf = workspace.buffer
        # Built on every run: the Convolution operator records the run once and replays it.
        if direction == "backward_filter":
            # M[e] (K x C) = D[e] (K x T) @ V[e]^T (T x C); V at base, D after it.
            k, c = problem.k, problem.c
            return gemm_plan(ctx, self.tf32, k, c, tiles, buf, base + u_size, tiles, buf,
                             base, tiles, buf, base + u_size + v_size, c, trans_b=True,
                             batch=self.elements, stride_a=k * tiles, stride_b=c * tiles,
                             stride_c=k * c)
        gm, gk = _shape(problem, direction)[:2]
        return gemm_plan(ctx, self.tf32, gm, tiles, gk, buf, base, gk, buf, base + u_size, tiles,
                         buf, base + u_size + v_size, tiles, batch=self.elements,
                         stride_a=gm * gk, stride_b=gk * tiles, stride_c=gm * tiles)

    def workspace_size(self, ctx, problem, direction):
        return self._sizes(problem, direction)[-1] * 4

    def prepare(self, ctx, problem, direction, epilogue=NO_EPILOGUE):
        params = (epilogue if direction == "forward" else NO_EPILOGUE).params()
        params["output_tile"] = self.output_tile
        if self.output_tile == 2:
            params.update(matrix_bt=None, matrix_g=None, matrix_at=None, matrix_g_grad=None,
                          matrix_at_grad=None)
        else:
            at, g, bt = transform_matrices(self.output_tile)
            at_grad, g_grad, _ = transform_matrices(3, self.output_tile)
            params.update(matrix_bt=bt, matrix_g=g, matrix_at=at, matrix_g_grad=g_grad,
                          matrix_at_grad=at_grad)
        return program.build(ctx, "conv_winograd", params)

    def run(self, ctx, problem, direction, src, other, dst, ep, epilogue=NO_EPILOGUE,
            workspace=None):
        built = self.prepare(ctx, problem, direction, epilogue)
        tiles, u_size, v_size, m_size, total = self._sizes(problem, direction)
        if workspace is None or workspace.nbytes < total * 4:
            raise ShapeError(f"{self.name} {direction} needs a workspace of {total * 4} bytes, got "
                             f"{0 if workspace is None else workspace.nbytes}")
        if direction == "backward_filter":
            self._run_filter(ctx, problem, built, src, other, dst, ep, workspace, tiles, u_size,
                             v_size)
            return
        gm, gk, ho, wo, hi, wi, pad_h, pad_w = _shape(problem, direction)
        th, tw = math.ceil(ho / self.output_tile), math.ceil(wo / self.output_tile)
        e = self.elements
        base = workspace.offset_elements
        U = Tensor(ctx, workspace.buffer, (e * gm, gk, 1, 1), offset=base * 4)
        V = Tensor(ctx, workspace.buffer, (1, e * gk, 1, tiles), offset=(base + u_size) * 4)
        M = Tensor(ctx, workspace.buffer, (1, e * gm, 1, tiles),
                   offset=(base + u_size + v_size) * 4)
        in_strides = problem.x_strides() if direction == "forward" else problem.y_strides()
        out_strides = problem.y_strides() if direction == "forward" else problem.x_strides()
        # The weight and input transforms in one launch (one work item per filter, then one
        # per input tile): at batch 1 a launch's host time is most of a transform's cost.
        gsize, lsize = launch_size(ctx, gm * gk + gk * tiles)
        launch(ctx, built, "winograd_transforms", gsize, lsize,
               [_I32(gm), _I32(gk), _I32(direction != "forward"), *_buf(other),
                *(_I32(s) for s in problem.w_strides()), *_buf(U),
                _I32(problem.n), _I32(hi), _I32(wi), _I32(pad_h), _I32(pad_w),
                _I32(th), _I32(tw), *_buf(src), *(_I32(s) for s in in_strides), *_buf(V)])
        self._gemm_plan(ctx, problem, direction, workspace).enqueue()
        gsize, lsize = launch_size(ctx, gm * tiles)
        launch(ctx, built, "winograd_output_transform", gsize, lsize,
               [_I32(problem.n), _I32(gm), _I32(ho), _I32(wo), _I32(th), _I32(tw), *_buf(M),
                *_buf(dst), *(_I32(s) for s in out_strides), *ep.kernel_args(dst)])

    def _run_filter(self, ctx, p, built, dy, x, dw, ep, workspace, tiles, v_size, d_size):
        th, tw = math.ceil(p.ho / self.output_tile), math.ceil(p.wo / self.output_tile)
        base = workspace.offset_elements
        buf = workspace.buffer
        gsize, lsize = launch_size(ctx, p.c * tiles)
        launch(ctx, built, "winograd_input_transform", gsize, lsize,
               [_I32(p.n), _I32(p.c), _I32(p.h), _I32(p.w), _I32(p.pad_h), _I32(p.pad_w),
                _I32(th), _I32(tw), *_buf(x), *(_I32(s) for s in p.x_strides()), buf,
                _I32(base)])
        gsize, lsize = launch_size(ctx, p.k * tiles)
        launch(ctx, built, "winograd_grad_transform", gsize, lsize,
               [_I32(p.n), _I32(p.k), _I32(p.ho), _I32(p.wo), _I32(th), _I32(tw), *_buf(dy),
                *(_I32(s) for s in p.y_strides()), buf, _I32(base + v_size)])
        self._gemm_plan(ctx, p, "backward_filter", workspace).enqueue()
        gsize, lsize = launch_size(ctx, p.k * p.c)
        launch(ctx, built, "winograd_filter_output_transform", gsize, lsize,
               [_I32(p.k), _I32(p.c), buf, _I32(base + v_size + d_size), *_buf(dw),
                *(_I32(s) for s in p.w_strides()), _F32(ep.alpha), _F32(ep.beta)])
