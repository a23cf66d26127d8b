"""3-D convolution (torch's conv3d and conv_transpose3d), NCDHW float32.

The "conv3d" family (``dlprim_py.solver``; ``DLPRIM_CONV3D_ALGO`` forces one) has two solvers,
each serving the three directions (forward, backward_data, backward_filter):

* ``vol2col_gemm``: the input volume of a chunk of images unfolded into columns
  (kernels/conv3d.cl.mako's ``conv3d_vol2col``), then the GEMM engine (``ops/gemm.py``): the
  forward one GEMM per group over the chunk's images (a batched GEMM writing the output in
  place, the bias in its epilogue), the data gradient the transposed GEMM into columns and a
  gather back into the volume (``conv3d_col2vol``), the filter gradient one GEMM per image and
  group accumulating into dw. Chunks keep the column buffer below the rule's ``chunk_bytes``.
* ``direct``: a work item per output element of the direction, gathering (no atomics); for
  few channels per group (depthwise), where GEMM tiles would sit mostly empty.

The rules of ``tuning_db/conv3d.json`` choose. Each call replays a plan recorded by its first
call (``launch.run_planned_on``), so a repeated call builds nothing.
"""
import math
from dataclasses import dataclass

import numpy as np

from ... import autograd, config, program, solver, tuning
from ...context import check_same_context
from ...errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ...launch import launch, run_planned_on
from ...tensor import Tensor
from ..pointwise import launch_size

_I32 = np.int32
_INT32_LIMIT = 2 ** 31 - 1
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def _triple(value, name):
    """(d, h, w) from an int or a sequence of 1 or 3 ints."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * 3
    try:
        items = tuple(value)
    except TypeError:
        raise ShapeError(f"{name} must be an int or 3 ints, got {value!r}") from None
    if len(items) == 1:
        items *= 3
    if len(items) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in items):
        raise ShapeError(f"{name} must be an int or 3 ints, got {value!r}")
    return tuple(int(v) for v in items)


@dataclass(frozen=True)
class Conv3dProblem:
    """The geometry of a 3-D convolution: x (n, c, d, h, w), weight (k, c/groups, *kernel),
    y (n, k, *out)."""
    n: int
    c: int
    d: int
    h: int
    w: int
    k: int
    kernel: tuple
    padding: tuple
    stride: tuple
    dilation: tuple
    groups: int

    @property
    def out(self):
        return tuple((s + 2 * p - dl * (kk - 1) - 1) // st + 1 for s, kk, p, st, dl in
                     zip((self.d, self.h, self.w), self.kernel, self.padding, self.stride,
                         self.dilation))

    @property
    def cg(self):
        return self.c // self.groups

    @property
    def kg(self):
        return self.k // self.groups

    @property
    def taps(self):
        return math.prod(self.kernel)

    @property
    def positions(self):
        return math.prod(self.out)

    @property
    def x_shape(self):
        return (self.n, self.c, self.d, self.h, self.w)

    @property
    def w_shape(self):
        return (self.k, self.cg) + self.kernel

    @property
    def y_shape(self):
        return (self.n, self.k) + self.out

    def geometry_args(self):
        """The run-time arguments of conv3d.cl.mako's GEOMETRY, in order."""
        return [_I32(v) for v in (self.n, self.c, self.d, self.h, self.w, self.k, *self.kernel,
                                  *self.out, *self.padding, *self.stride, *self.dilation,
                                  self.groups)]

    def key(self):
        return (f"conv3d-n{self.n}-c{self.c}-{self.d}x{self.h}x{self.w}-k{self.k}-"
                f"{'x'.join(map(str, self.kernel))}-p{'x'.join(map(str, self.padding))}-"
                f"s{'x'.join(map(str, self.stride))}-d{'x'.join(map(str, self.dilation))}-"
                f"g{self.groups}")


def make_problem(x_shape, w_shape, stride, padding, dilation, groups):
    """Validate a 3-D convolution's shapes and arguments: a Conv3dProblem, or ShapeError."""
    stride, padding, dilation = (_triple(stride, "stride"), _triple(padding, "padding"),
                                 _triple(dilation, "dilation"))
    if min(stride) <= 0:
        raise ShapeError(f"stride must be > 0, got {stride}")
    if min(padding) < 0:
        raise ShapeError(f"padding must be >= 0, got {padding}")
    if min(dilation) <= 0:
        raise ShapeError(f"dilation must be > 0, got {dilation}")
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups <= 0:
        raise ShapeError(f"groups must be a positive int, got {groups!r}")
    n, c, d, h, w = x_shape
    k, cg = w_shape[:2]
    kernel = tuple(w_shape[2:])
    if c % groups:
        raise ShapeError(f"input channels {c} are not divisible by groups {groups}")
    if k % groups:
        raise ShapeError(f"output channels {k} are not divisible by groups {groups}")
    if cg != c // groups:
        raise ShapeError(f"weight expects {cg} channels per group, input has {c} channels in "
                         f"{groups} groups ({c // groups} per group)")
    if min(c, d, h, w, k, *kernel) <= 0:
        raise ShapeError(f"empty convolution: input {tuple(x_shape)}, weight {tuple(w_shape)}")
    for s, kk, p, dl in zip((d, h, w), kernel, padding, dilation):
        if s + 2 * p < dl * (kk - 1) + 1:
            raise ShapeError(f"kernel {kernel} (dilation {dilation}) is larger than the padded "
                             f"input {tuple(s + 2 * p for s, p in zip((d, h, w), padding))}")
    problem = Conv3dProblem(int(n), int(c), int(d), int(h), int(w), int(k), kernel, padding,
                            stride, dilation, int(groups))
    largest = max(math.prod(problem.x_shape), math.prod(problem.y_shape),
                  math.prod(problem.w_shape), problem.c * problem.taps * problem.positions)
    if largest > _INT32_LIMIT:
        raise UnsupportedError(f"3-D convolutions with more than 2^31-1 elements in a tensor "
                               f"(or one image's columns) are not supported ({largest})")
    return problem


@dataclass(frozen=True)
class Conv3dTask:
    """A 3-D convolution problem in one direction: what the solver layer chooses for."""
    problem: Conv3dProblem
    direction: str

    def key(self):
        return f"{self.problem.key()}-{self.direction}"

    def features(self):
        p = self.problem
        return {"direction": self.direction, "n": p.n, "c": p.c, "k": p.k, "cg": p.cg,
                "kg": p.kg, "groups": p.groups, "taps": p.taps, "positions": p.positions,
                "reduction": p.cg * p.taps}


class _Solver(solver.Solver):
    def applies(self, ctx, task):
        return True

    def _built(self, ctx):
        return program.build(ctx, "conv3d", {})


class Direct3d(_Solver):
    """A work item per output element of the direction (gathers only)."""
    name = "direct"

    def run(self, ctx, task, tensors, params):
        p = task.problem
        built = self._built(ctx)
        geometry = p.geometry_args()
        if task.direction == "forward":
            x, w, bias, y = tensors
            gsize, lsize = launch_size(ctx, y.size)
            launch(ctx, built, "conv3d_direct_forward", gsize, lsize,
                   [*geometry, *_buf(x), *_buf(w), *_buf(bias if bias is not None else y),
                    _I32(bias is not None), *_buf(y)])
        elif task.direction == "backward_data":
            dy, w, dx = tensors
            gsize, lsize = launch_size(ctx, dx.size)
            launch(ctx, built, "conv3d_direct_backward_data", gsize, lsize,
                   [*geometry, *_buf(dy), *_buf(w), *_buf(dx)])
        else:
            dy, x, dw = tensors
            gsize, lsize = launch_size(ctx, dw.size)
            launch(ctx, built, "conv3d_direct_backward_filter", gsize, lsize,
                   [*geometry, *_buf(dy), *_buf(x), *_buf(dw)])


class Vol2colGemm(_Solver):
    """Columns of a chunk of images, then the GEMM engine (module docstring)."""
    name = "vol2col_gemm"

    def applies(self, ctx, task):
        p = task.problem
        return p.c * p.taps * p.positions * 4 <= ctx.info.max_alloc_size

    @staticmethod
    def chunk(ctx, problem, params):
        """Images per chunk: as many as fit ``chunk_bytes`` of columns (at least one), and
        fewer than 2^31 column elements (the kernels index them with ints)."""
        per_image = problem.c * problem.taps * problem.positions
        limit = min(int(params.get("chunk_bytes", 1 << 26)), ctx.info.max_alloc_size) // 4
        return max(1, min(problem.n, limit // per_image, _INT32_LIMIT // per_image))

    def run(self, ctx, task, tensors, params):
        from ..gemm import GemmPlan
        p = task.problem
        built = self._built(ctx)
        geometry = p.geometry_args()
        images = self.chunk(ctx, p, params)
        taps, positions, kg, cg = p.taps, p.positions, p.kg, p.cg
        rows = cg * taps               # a group's rows of columns (the forward's reduction)
        image_cols = p.c * taps * positions
        # Scratch, kept by the plan that records this run.
        col = Tensor.empty(ctx, (images * image_cols,))
        cbuf, cbase = col.buffer, col.offset_elements

        def vol2col(x, n0, count):
            gsize, lsize = launch_size(ctx, count * image_cols)
            launch(ctx, built, "conv3d_vol2col", gsize, lsize,
                   [*geometry, _I32(n0), _I32(count), *_buf(x), cbuf, _I32(cbase)])

        for n0 in range(0, p.n, images):
            count = min(images, p.n - n0)
            if task.direction == "forward":
                x, w, bias, y = tensors
                vol2col(x, n0, count)
                for g in range(p.groups):
                    extra = {}
                    if bias is not None:
                        extra = dict(bias_buf=bias.buffer, bias_off=bias.offset_elements + g * kg,
                                     bias_per="m")
                    GemmPlan(ctx, kg, positions, rows, w.buffer, w.offset_elements + g * kg * rows,
                             rows, cbuf, cbase + g * rows * positions, positions,
                             y.buffer, y.offset_elements + (n0 * p.k + g * kg) * positions,
                             positions, batch=count, stride_a=0, stride_b=image_cols,
                             stride_c=p.k * positions, **extra).enqueue()
            elif task.direction == "backward_data":
                dy, w, dx = tensors
                for g in range(p.groups):
                    # columns of group g = w_g^T (rows x kg) @ dy[n, group g] (kg x positions)
                    GemmPlan(ctx, rows, positions, kg, w.buffer,
                             w.offset_elements + g * kg * rows, rows,
                             dy.buffer, dy.offset_elements + (n0 * p.k + g * kg) * positions,
                             positions, cbuf, cbase + g * rows * positions, positions,
                             trans_a=True, batch=count, stride_a=0, stride_b=p.k * positions,
                             stride_c=image_cols).enqueue()
                gsize, lsize = launch_size(ctx, count * p.c * p.d * p.h * p.w)
                launch(ctx, built, "conv3d_col2vol", gsize, lsize,
                       [*geometry, _I32(n0), _I32(count), cbuf, _I32(cbase), *_buf(dx)])
            else:
                dy, x, dw = tensors
                vol2col(x, n0, count)
                for i in range(count):
                    for g in range(p.groups):
                        # dw_g (kg x rows) (+)= dy[n, group g] (kg x positions) @ columns^T
                        GemmPlan(ctx, kg, rows, positions, dy.buffer,
                                 dy.offset_elements + ((n0 + i) * p.k + g * kg) * positions,
                                 positions, cbuf, cbase + i * image_cols + g * rows * positions,
                                 positions, dw.buffer, dw.offset_elements + g * kg * rows, rows,
                                 trans_b=True, beta=0.0 if n0 + i == 0 else 1.0).enqueue()


def _buf(t):
    return [t.buffer, _I32(t.offset_elements)]


FAMILY = solver.register(solver.Family("conv3d", (Vol2colGemm(), Direct3d()),
                                       title="3-D convolution algorithm"))
ALGORITHMS = tuple(FAMILY.solvers)


def run(ctx, problem, direction, tensors, algorithm=None):
    """Enqueue one direction of ``problem`` on ``tensors``: forward (x, w, bias or None, y),
    backward_data (dy, w, dx), backward_filter (dy, x, dw); the destination is overwritten.
    ``algorithm`` (else ``DLPRIM_CONV3D_ALGO``, else the rules) names the solver. Replays the
    plan recorded by the first call with the same problem, solver and offsets."""
    task = Conv3dTask(problem, direction)
    forced = algorithm or config.switches().forced.get("conv3d")
    key = ("conv3d", task, forced, tuning.generation,
           tuple(None if t is None else t.offset for t in tensors))
    chosen = ctx.plans.get(("conv3d solver",) + key)
    if chosen is None:
        found = solver.select(ctx, "conv3d", task, forced=algorithm)
        chosen = ctx.plans.put(("conv3d solver",) + key,
                               (found, solver.tunables(ctx, "conv3d", task, found.name)))
    algo, params = chosen
    run_planned_on(ctx, key, tensors, lambda: algo.run(ctx, task, tensors, params))


# ---- functional --------------------------------------------------------------------------

def _check_input(t, what):
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != np.float32:
        raise DTypeError(f"{what} must be float32, got {t.dtype}")


def _check_bias(bias, channels):
    if bias is not None:
        _check_input(bias, "bias")
        if tuple(bias.shape) != (channels,):
            raise ShapeError(f"bias must have shape ({channels},), got {bias.shape}")


def _bias_grad(ctx, g):
    from .api import _bias_grad as bias_grad_2d
    n, k = g.shape[:2]
    return bias_grad_2d(ctx, g.reshape(n, k, g.shape[2] * g.shape[3], g.shape[4]), k)


def _empty_grads(ctx, x, weight, bias):
    def backward(g):
        return (Tensor.empty(ctx, x.shape) if x.requires_grad else None,
                Tensor.zeros(ctx, weight.shape) if weight.requires_grad else None,
                Tensor.zeros(ctx, bias.shape) if bias is not None and bias.requires_grad else None)
    return backward


def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, algorithm=None):
    """torch.nn.functional.conv3d: x (N, C, D, H, W) or unbatched (C, D, H, W), weight
    (K, C/groups, kD, kH, kW), bias (K,) or None; float32. Returns (N, K, Do, Ho, Wo) (or
    unbatched); gradients flow to x, weight and bias. ``padding``: an int, 3 ints, "valid" or
    "same" (stride 1; an even kernel span pads one more at the end, as torch does).
    ``algorithm``: a solver of the "conv3d" family ("vol2col_gemm", "direct"), else
    ``DLPRIM_CONV3D_ALGO``, else the rules."""
    from .api import _drop_batch, _add_batch, _pad_right, _padding, _same_extra
    _check_input(x, "input")
    _check_input(weight, "weight")
    if weight.ndim != 5:
        raise ShapeError(f"conv3d weight must have rank 5 (K, C/groups, kD, kH, kW), got "
                         f"{weight.shape}")
    if x.ndim == 4:
        return _drop_batch(conv3d(_add_batch(x), weight, bias, stride, padding, dilation, groups,
                                  algorithm=algorithm))
    if x.ndim != 5:
        raise ShapeError(f"conv3d input must have rank 5 (N, C, D, H, W) or 4 (C, D, H, W), "
                         f"got {x.shape}")
    kernel = tuple(weight.shape[2:])
    extra = _same_extra(padding, kernel, dilation)
    if any(extra):
        return conv3d(_pad_right(x, extra), weight, bias, stride,
                      _padding(padding, kernel, stride, dilation), dilation, groups,
                      algorithm=algorithm)
    padding = _padding(padding, kernel, stride, dilation)
    ctx = check_same_context(x, weight, bias)
    _check_bias(bias, weight.shape[0])
    problem = make_problem((max(x.shape[0], 1),) + tuple(x.shape[1:]), weight.shape, stride,
                           padding, dilation, groups)
    if x.shape[0] == 0:
        y = Tensor.empty(ctx, (0,) + problem.y_shape[1:])
        return autograd.record(y, (x, weight, bias), _empty_grads(ctx, x, weight, bias), "conv3d")
    y = Tensor.empty(ctx, problem.y_shape)
    run(ctx, problem, "forward", (x, weight, bias, y), algorithm)

    def backward(g):
        gx = gw = gb = None
        if x.requires_grad:
            gx = Tensor.empty(ctx, x.shape)
            run(ctx, problem, "backward_data", (g, weight, gx), algorithm)
        if weight.requires_grad:
            gw = Tensor.empty(ctx, weight.shape)
            run(ctx, problem, "backward_filter", (g, x, gw), algorithm)
        if bias is not None and bias.requires_grad:
            gb = _bias_grad(ctx, g)
        return gx, gw, gb

    return autograd.record(y, (x, weight, bias), backward, "conv3d")


def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1, *, algorithm=None):
    """torch.nn.functional.conv_transpose3d: x (N, Cin, D, H, W) or unbatched, weight
    (Cin, Cout/groups, kD, kH, kW), bias (Cout,) or None; float32. Returns (N, Cout, Do, Ho, Wo)
    with Do = (D - 1) * stride - 2 * padding + dilation * (kD - 1) + output_padding + 1 (and so
    for H, W). Computed as the data gradient of the convolution that maps the output back to
    x; ``algorithm`` as conv3d's."""
    from .api import _drop_batch, _add_batch
    _check_input(x, "input")
    _check_input(weight, "weight")
    if weight.ndim != 5:
        raise ShapeError(f"conv_transpose3d weight must have rank 5 (Cin, Cout/groups, kD, kH, "
                         f"kW), got {weight.shape}")
    if x.ndim == 4:
        return _drop_batch(conv_transpose3d(_add_batch(x), weight, bias, stride, padding,
                                            output_padding, groups, dilation,
                                            algorithm=algorithm))
    if x.ndim != 5:
        raise ShapeError(f"conv_transpose3d input must have rank 5 (N, C, D, H, W) or 4 "
                         f"(C, D, H, W), got {x.shape}")
    ctx = check_same_context(x, weight, bias)
    stride, padding, dilation = (_triple(stride, "stride"), _triple(padding, "padding"),
                                 _triple(dilation, "dilation"))
    output_padding = _triple(output_padding, "output_padding")
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups <= 0:
        raise ShapeError(f"groups must be a positive int, got {groups!r}")
    if not all(0 <= op < max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        raise ShapeError(f"output_padding {output_padding} must be >= 0 and smaller than stride "
                         f"or dilation ({stride}, {dilation})")
    n, cin = x.shape[:2]
    if weight.shape[0] != cin:
        raise ShapeError(f"conv_transpose3d weight has {weight.shape[0]} input channels, the "
                         f"input has {cin}")
    if cin % groups:
        raise ShapeError(f"input channels {cin} are not divisible by groups {groups}")
    cout = weight.shape[1] * groups
    _check_bias(bias, cout)
    out = tuple((s - 1) * st - 2 * p + dl * (kk - 1) + op + 1 for s, st, p, dl, kk, op in
                zip(x.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding))
    if min(out) <= 0:
        raise ShapeError(f"conv_transpose3d output would be {out}: padding too large")
    y_shape = (n, cout) + out
    # The convolution whose input is our output and whose output is our input.
    problem = make_problem((max(n, 1),) + y_shape[1:], weight.shape, stride, padding, dilation,
                           groups)
    if n == 0:
        y = Tensor.empty(ctx, y_shape)
        return autograd.record(y, (x, weight, bias), _empty_grads(ctx, x, weight, bias),
                               "conv_transpose3d")
    # With output_padding >= stride (allowed below the dilation) that convolution has more
    # outputs than x along a dimension; x is extended with zeros there (they scatter nothing)
    # and its gradient cut back.
    full = problem.y_shape
    extra = [f - s for f, s in zip(full[2:], x.shape[2:])]
    if full[:2] != tuple(x.shape[:2]) or min(extra) < 0:
        raise ShapeError(f"conv_transpose3d: inconsistent geometry {full} vs {x.shape}")
    x_full = x.detach()
    if max(extra):
        from ..tensor_ops import pad
        x_full = pad(x_full, [0, extra[2], 0, extra[1], 0, extra[0]])
    y = Tensor.empty(ctx, y_shape)
    run(ctx, problem, "backward_data", (x_full, weight, y), algorithm)
    if bias is not None:
        from ..pointwise import binary
        y = binary("add", y, bias.detach().reshape(1, cout, 1, 1, 1))

    def backward(g):
        gx = gw = gb = None
        if x.requires_grad:
            gx = Tensor.empty(ctx, full)
            run(ctx, problem, "forward", (g, weight, None, gx), algorithm)
            if max(extra):
                from ..tensor_ops import narrow
                for k in (2, 3, 4):
                    gx = narrow(gx, k, 0, x.shape[k])
        if weight.requires_grad:
            gw = Tensor.empty(ctx, weight.shape)
            run(ctx, problem, "backward_filter", (x_full, g, gw), algorithm)
        if bias is not None and bias.requires_grad:
            gb = _bias_grad(ctx, g)
        return gx, gw, gb

    return autograd.record(y, (x, weight, bias), backward, "conv_transpose3d")
