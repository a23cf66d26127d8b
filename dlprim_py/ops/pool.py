"""Pooling over 1, 2 or 3 spatial dimensions: max_pool{1,2,3}d, avg_pool{1,2,3}d,
adaptive_avg_pool{1,2,3}d, adaptive_max_pool{1,2,3}d.

``Pool`` is the operator (``Pool2d`` its 2-D form): built once for a pooling description, it
validates shapes, compiles its kernels (``kernels/pool.cl.mako``) in its setup and then only
enqueues, forward and backward, on caller-owned tensors (MIOpen's pooling descriptor in spirit).
The functional names below allocate outputs and record the backward on the autograd tape, with
torch's semantics.

Layout: ``(N, C, *spatial)`` (or ``(C, *spatial)``, taken as N = 1), float32, or float16 /
bfloat16 storage (loaded into float32, rounded once on store, no cl_khr_fp16 needed); the
kernels see every rank as D x H x W planes. Sizes are run-time kernel arguments, so one compile serves every
shape and rank of a (method, window kind) pair. Two forward solvers of the "pool" family
(``dlprim_py.solver``, ``DLPRIM_POOL_ALGO`` forces one): a work item per output ("window"), and
for windows covering the whole plane (global pooling) work items sharing a plane ("plane"); the
rules of ``tuning_db/pool.json`` prefer "plane" where it applies. Backward gathers per
input element.
"""
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, logcmd, program, solver, tuning
from ..context import check_same_context
from ..dtypes import float32, int64, is_float16_type, name as dtype_name
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor
from ..launch import bind, run_planned_on
from .pointwise import group_size, launch_size

_INT32_LIMIT = 2 ** 31 - 1


def _tuple(value, what, n=2):
    """An n-tuple of ints from an int, a 1-sequence or an n-sequence (torch's convention)."""
    kind = "an int" if n == 1 else f"an int or {n} ints"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        items = tuple(value)
    except TypeError:
        raise ShapeError(f"{what} must be {kind}, got {value!r}") from None
    if len(items) == 1:
        items = items * n
    if len(items) != n or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in items):
        raise ShapeError(f"{what} must be {kind}, got {value!r}")
    return tuple(int(v) for v in items)


def _pair(value, what):
    return _tuple(value, what, 2)


@dataclass(frozen=True)
class PoolProblem:
    """A pooling forward over ``planes`` planes of ``height`` x ``width``; ``whole_plane``: each
    output's window is its whole input plane (global pooling)."""
    planes: int
    height: int
    width: int
    whole_plane: bool

    def key(self):
        return f"pool-p{self.planes}-{self.height}x{self.width}-w{int(self.whole_plane)}"

    def features(self):
        return {"planes": self.planes, "plane_size": self.height * self.width,
                "whole_plane": int(self.whole_plane)}


class WindowSolver(solver.Solver):
    """A work item per output walks its window."""
    name = "window"


class PlaneSolver(solver.Solver):
    """Work items share a plane whose window is the whole plane, reading it contiguously."""
    name = "plane"

    def applies(self, ctx, problem):
        return problem.whole_plane


FAMILY = solver.register(solver.Family("pool", (WindowSolver(), PlaneSolver()),
                                       title="pooling algorithm"))
ALGORITHMS = tuple(FAMILY.solvers)


def pooled_size(size, kernel, stride, pad, dilation, ceil_mode):
    """torch's output length of one pooled dimension."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    # With ceil_mode the last window must start inside the input or its left padding.
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


class Pool:
    """A 1-, 2- or 3-D pooling operator on ``(N, C, *spatial)`` or ``(C, *spatial)`` float32
    tensors (``dims`` spatial dimensions).

    ``method``: "max" or "avg". Fixed windows: ``kernel_size``, ``stride`` (default: the kernel),
    ``padding``, ``dilation`` (max only), ``ceil_mode``, ``count_include_pad`` and
    ``divisor_override`` (avg only), each an int or ``dims`` ints. Adaptive windows:
    ``output_size`` instead (an int or ``dims`` entries; None in them keeps that input size).
    The kernels see every rank as D x H x W planes (D = 1 for 2-D, D = H = 1 for 1-D).
    """

    def __init__(self, ctx, method, kernel_size=None, stride=None, padding=0, dilation=1,
                 ceil_mode=False, count_include_pad=True, divisor_override=None, output_size=None,
                 dims=2):
        if method not in ("max", "avg"):
            raise UnsupportedError(f"pooling method must be 'max' or 'avg', got {method!r}")
        if dims not in (1, 2, 3):
            raise UnsupportedError(f"pooling has 1, 2 or 3 spatial dimensions, got {dims!r}")
        self.ctx = ctx
        self.method = method
        self.dims = dims
        # Input shape -> output shape, for the calls after the first.
        self.shapes = {}
        self.adaptive = output_size is not None
        ones, zeros = (1,) * dims, (0,) * dims
        if self.adaptive:
            if kernel_size is not None:
                raise ShapeError("adaptive pooling takes output_size, not kernel_size")
            what = (f"output_size must be a non-negative int or {dims} of them (or None), "
                    f"got {output_size!r}")
            if isinstance(output_size, (int, np.integer)):
                output_size = (int(output_size),) * dims
            if not isinstance(output_size, (tuple, list)):
                raise ShapeError(what)
            output_size = tuple(output_size)
            if len(output_size) == 1:
                output_size = output_size * dims
            # 0 is allowed, as in torch: an empty output.
            if len(output_size) != dims or any(
                    s is not None and (not isinstance(s, (int, np.integer))
                                       or isinstance(s, bool) or s < 0) for s in output_size):
                raise ShapeError(what)
            self.output_size = output_size
            self.kernel = self.stride = ones
            self.padding, self.dilation = zeros, ones
        else:
            if kernel_size is None:
                raise ShapeError("pooling needs kernel_size (or output_size for adaptive pooling)")
            self.kernel = _tuple(kernel_size, "kernel_size", dims)
            self.stride = (self.kernel if stride is None or stride == () or stride == []
                           else _tuple(stride, "stride", dims))
            self.padding = _tuple(padding, "padding", dims)
            self.dilation = _tuple(dilation, "dilation", dims)
            if min(self.kernel) <= 0 or min(self.stride) <= 0 or min(self.dilation) <= 0:
                raise ShapeError(f"kernel_size {self.kernel}, stride {self.stride} and dilation "
                                 f"{self.dilation} must be positive")
            if method == "avg" and self.dilation != ones:
                raise UnsupportedError(f"avg_pool{dims}d has no dilation")
            for k, p in zip(self.kernel, self.padding):
                # torch's limit, the same with dilation.
                if p < 0 or p > k // 2:
                    raise ShapeError(f"padding {self.padding} must be >= 0 and at most half the "
                                     f"kernel size {self.kernel}")
        if divisor_override is not None and (not isinstance(divisor_override, (int, np.integer))
                                             or isinstance(divisor_override, bool)
                                             or divisor_override == 0):
            raise ShapeError(f"divisor_override must be a non-zero int, got {divisor_override!r}")
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = bool(count_include_pad)
        self.divisor_override = int(divisor_override or 0)
        self._window = "adaptive" if self.adaptive else "regular"
        # (kernel name, index type, indices saved, window kind) -> BoundKernel
        self._kernels = {}
        # (input shape, forced solver, tuning generation) -> the solver's name
        self._solvers = {}

    @property
    def _name(self):
        return f"{self.method}_pool{self.dims}d"

    def output_shape(self, input_shape):
        """The output shape for an ``(N, C, *spatial)`` or ``(C, *spatial)`` input; ShapeError if
        it is empty."""
        input_shape = tuple(input_shape)
        n = self.dims
        if len(input_shape) not in (n + 1, n + 2):
            names = ("L",), ("H", "W"), ("D", "H", "W")
            spatial = ", ".join(names[n - 1])
            raise ShapeError(f"{self._name if not self.adaptive else 'adaptive ' + self._name} "
                             f"expects a (N, C, {spatial}) or (C, {spatial}) input, got shape "
                             f"{input_shape}")
        sizes = input_shape[-n:]
        if self.adaptive:
            if 0 in sizes:
                raise ShapeError(f"adaptive pooling of an empty plane {input_shape}")
            out = tuple(s if o is None else o for s, o in zip(sizes, self.output_size))
        else:
            out = tuple(pooled_size(s, k, st, p, d, self.ceil_mode) for s, k, st, p, d in
                        zip(sizes, self.kernel, self.stride, self.padding, self.dilation))
            if min(out) <= 0:
                raise ShapeError(f"{self.method} pooling with kernel {self.kernel}, stride "
                                 f"{self.stride}, padding {self.padding}, dilation {self.dilation} "
                                 f"gives an empty output for input {input_shape}")
        return input_shape[:-n] + out

    def _log(self, x_shape, y_shape, forward_only):
        """The ``dlprim-driver pool`` command of this call (DLPRIM_LOG_CMD=1)."""
        if self.dims != 2:
            # The driver's pool command is 2-D; other ranks log the call's shape by name.
            logcmd.log_command("pool", {"I": "x".join(map(str, x_shape)), "m": self.method,
                                        "F": int(forward_only)}, [f"{self.dims}-D pooling"])
            return
        n, c, h, w = (1,) * (4 - len(x_shape)) + tuple(x_shape)
        flags = {"n": n, "c": c, "H": h, "W": w}
        if self.adaptive:
            flags["adaptive"] = f"{y_shape[-2]}x{y_shape[-1]}"
        else:
            flags.update({"y": self.kernel[0], "x": self.kernel[1], "u": self.stride[0],
                          "v": self.stride[1], "p": self.padding[0], "q": self.padding[1],
                          "dilation_h": self.dilation[0], "dilation_w": self.dilation[1],
                          "ceil_mode": int(self.ceil_mode), "divisor": self.divisor_override})
        flags["m"] = ("max" if self.method == "max" else
                      "avg_in" if self.count_include_pad and not self.adaptive else "avg")
        flags["F"] = int(forward_only)
        logcmd.log_command("pool", flags)

    def _kernel(self, name, index_t, save_indices, window=None, dtype=float32):
        key = (name, index_t, save_indices, window, dtype)
        kernel = self._kernels.get(key)
        if kernel is None:
            params = dict(method=self.method, window=window or self._window,
                          save_indices=save_indices, index_t=index_t, group_size=group_size(self.ctx))
            if is_float16_type(dtype):
                # 16-bit storage, computed in float32 (kernels/pool.cl.mako).
                from .pointwise import template_type
                params["dtype"] = template_type(dtype)
            kernel = self._kernels[key] = bind(program.kernel(self.ctx, "pool", name, params))
        return kernel

    def algorithm(self, input_shape):
        """The forward solver's name for an input shape: "plane" (work items share a plane)
        when the window is the whole plane, else "window" (a work item per output), by the
        tuning rules; ``DLPRIM_POOL_ALGO`` forces one (an error where it does not apply)."""
        key = (tuple(input_shape), config.switches().forced.get("pool"), tuning.generation)
        name = self._solvers.get(key)
        if name is None:
            n = self.dims
            sizes = tuple(input_shape[-n:])
            if self.adaptive:
                whole = self.output_shape(input_shape)[-n:] == (1,) * n
            else:
                whole = (self.kernel == sizes and self.padding == (0,) * n
                         and self.dilation == (1,) * n)
            problem = PoolProblem(int(np.prod(input_shape[:-n], dtype=np.int64)),
                                  int(np.prod(sizes[:-1], dtype=np.int64)), sizes[-1], whole)
            name = self._solvers[key] = solver.select(self.ctx, "pool", problem).name
        return name

    def _forward_plane(self, x, y, indices, index_t, index_np):
        plane_size = int(np.prod(x.shape[-self.dims:], dtype=np.int64))
        planes = y.size
        group = group_size(self.ctx)
        plane_threads = 1
        while plane_threads * 2 <= min(plane_size, group):
            plane_threads *= 2
        divisor = float(self.divisor_override or plane_size)
        # The plane kernel lives in the adaptive build, whatever the window kind.
        kernel = self._kernel("pool_plane_forward", index_t, indices is not None, "adaptive",
                              x.dtype)
        args = [index_np(planes), np.int32(plane_size), np.int32(plane_threads),
                np.float32(divisor), x.buffer, index_np(x.offset_elements), y.buffer,
                index_np(y.offset_elements)]
        if indices is not None:
            args += [indices.buffer, index_np(indices.offset_elements)]
        per_group = group // plane_threads
        kernel(self.ctx.queue, (-(-planes // per_group) * group,), (group,), *args)

    def _common_args(self, total, in_shape, out_shape, index_np):
        pad = 3 - self.dims

        def three(values, fill):
            return (fill,) * pad + tuple(values)

        i32 = np.int32
        values = (three(in_shape[-self.dims:], 1) + three(out_shape[-self.dims:], 1)
                  + three(self.kernel, 1) + three(self.stride, 1) + three(self.padding, 0)
                  + three(self.dilation, 1) + (int(self.count_include_pad), self.divisor_override))
        return [index_np(total)] + [i32(v) for v in values]

    def _check(self, x, y, indices, x_what, y_what):
        for t, what in ((x, x_what), (y, y_what)):
            if not isinstance(t, Tensor):
                raise not_a_tensor(what, t)
            if t.dtype != float32 and not is_float16_type(t.dtype):
                raise DTypeError(f"{what} must be float32, float16 or bfloat16, got "
                                 f"{dtype_name(t.dtype)}")
        if x.dtype != y.dtype:
            raise DTypeError(f"{x_what} and {y_what} must have one dtype, got "
                             f"{dtype_name(x.dtype)} and {dtype_name(y.dtype)}")
        check_same_context(x, y, indices)
        expected = self.output_shape(x.shape)
        if y.shape != expected:
            raise ShapeError(f"{y_what} must have shape {expected} for input {x.shape}, got {y.shape}")
        if indices is not None:
            if self.method != "max":
                raise UnsupportedError("only max pooling has indices")
            if indices.dtype != int64 or indices.shape != expected:
                raise ShapeError(f"indices must be int64 of shape {expected}, got {indices.dtype} "
                                 f"{indices.shape}")
        largest = max(t.offset_elements + t.size for t in (x, y, indices) if t is not None)
        return ("int", np.int32) if largest < _INT32_LIMIT else ("long", np.int64)

    def forward(self, x, y, indices=None):
        """Enqueue y = pool(x). ``indices`` (max only, int64, y's shape) receives each window's
        argmax as a flat position in its input plane ((d*H + h)*W + w); backward of max needs
        it."""
        index_t, index_np = self._check(x, y, indices, "x", "y")
        self._log(x.shape, y.shape, True)
        if y.size == 0:
            return
        if self.algorithm(x.shape) == "plane":
            self._forward_plane(x, y, indices, index_t, index_np)
            return
        kernel = self._kernel("pool_forward", index_t, indices is not None, dtype=x.dtype)
        args = self._common_args(y.size, x.shape, y.shape, index_np)
        args += [x.buffer, index_np(x.offset_elements), y.buffer, index_np(y.offset_elements)]
        if indices is not None:
            args += [indices.buffer, index_np(indices.offset_elements)]
        gsize, lsize = launch_size(self.ctx, y.size)
        kernel(self.ctx.queue, gsize, lsize, *args)

    def backward(self, dy, dx, indices=None):
        """Enqueue dx = d pool / dx applied to dy (dx is overwritten, not accumulated).
        Max pooling needs the ``indices`` its forward wrote."""
        index_t, index_np = self._check(dx, dy, indices, "dx", "dy")
        if self.method == "max" and indices is None:
            raise ShapeError("max pooling backward needs the indices written by forward")
        self._log(dx.shape, dy.shape, False)
        if dx.size == 0:
            return
        if dy.size == 0:
            # No window reads anything (adaptive output size 0).
            dx.fill_(0.0)
            return
        kernel = self._kernel("pool_backward", index_t, False, dtype=dx.dtype)
        args = self._common_args(dx.size, dx.shape, dy.shape, index_np)
        args += [dy.buffer, index_np(dy.offset_elements), dx.buffer, index_np(dx.offset_elements)]
        if indices is not None:
            args += [indices.buffer, index_np(indices.offset_elements)]
        gsize, lsize = launch_size(self.ctx, dx.size)
        kernel(self.ctx.queue, gsize, lsize, *args)


class Pool2d(Pool):
    """A 2-D pooling operator on NCHW (or CHW) float32 tensors: ``Pool`` with ``dims=2``."""

    def __init__(self, ctx, method, kernel_size=None, stride=None, padding=0, dilation=1,
                 ceil_mode=False, count_include_pad=True, divisor_override=None, output_size=None):
        super().__init__(ctx, method, kernel_size, stride, padding, dilation, ceil_mode,
                         count_include_pad, divisor_override, output_size, dims=2)


def _operator(ctx, *key, **kwargs):
    op = ctx.plans.get(("pool operator",) + key)
    if op is None:
        op = ctx.plans.put(("pool operator",) + key, Pool(ctx, **kwargs))
    return op


def _run(op, x, return_indices=False):
    if not isinstance(x, Tensor):
        raise not_a_tensor("pooling: input", x)
    ctx = x.ctx
    y_shape = op.shapes.get(x.shape)
    if y_shape is None:
        y_shape = op.shapes[x.shape] = op.output_shape(x.shape)
    y = Tensor.empty(ctx, y_shape, x.dtype)
    grad = x.requires_grad and autograd.grad_enabled()
    indices = None
    if op.method == "max" and (return_indices or grad):
        indices = Tensor.empty(ctx, y_shape, int64)
    # A call replays the plan of its key (the first call with it ran the operator's checks and
    # chose its solver: the forced one and the tuning databases' generation are in the key).
    # No closures here (their variables would be cells on every call): the forward is called
    # with its operands where there is no plan, the backward is made by _backward.
    key = ("pool", op, x.shape, x.dtype, x.offset, indices is not None,
           config.switches().forced.get("pool"), tuning.generation)
    operands = (x, y, indices)
    run_planned_on(ctx, key, operands, op.forward, None, operands)
    if grad:
        autograd.record(y, (x,), _backward(ctx, op, key, x, indices), op._name)
    return (y, indices) if return_indices else y


def _backward(ctx, op, key, x, indices):
    def backward(g):
        if g.dtype != x.dtype:
            # A gradient given in another type: the kernels read dy as x's.
            from .pointwise import convert
            g = convert(g, x.dtype)
        dx = Tensor.empty(ctx, x.shape, x.dtype)
        run_planned_on(ctx, ("backward", key, g.shape, g.dtype, g.offset), (g, dx, indices),
                       lambda: op.backward(g, dx, indices))
        return (dx,)

    return backward


def _plain_key(name, input, values):
    """A plan-cache key for the operator of ``name`` with arguments ``values``, where every
    one is an int, a bool, None or a tuple of ints (the types are in it: 2.0 == 2 and True ==
    1, but only some of them pass the checks); None otherwise, or when ``input`` is not a
    tensor (those calls take _key's way, which freezes any value)."""
    if input.__class__ is not Tensor:
        return None
    types = []
    for value in values:
        kind = value.__class__
        if kind is tuple:
            for item in value:
                if item.__class__ is not int:
                    return None
        elif kind is not int and kind is not bool and value is not None:
            return None
        types.append(kind)
    return ("pool operator by arguments", name, values, tuple(types))


def _operator_by(input, name, values, kwargs):
    """The Pool for ``kwargs`` (the call's arguments ``values`` as keywords): found by
    ``_plain_key`` where it applies (a repeated call builds no other key), else by ``_key``."""
    key = _plain_key(name, input, values)
    if key is not None:
        ctx = input.ctx
        op = ctx.plans.hit(key) or ctx.plans.get(key)
        if op is None:
            op = ctx.plans.put(key, _operator(ctx, *_key(kwargs), **kwargs))
        return op
    return _operator(_ctx_of(input), *_key(kwargs), **kwargs)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool2d on (N, C, H, W) or (C, H, W) float32. With
    ``return_indices`` also returns int64 flat positions h*W + w of each maximum."""
    kwargs = dict(method="max", kernel_size=kernel_size, stride=stride, padding=padding,
                  dilation=dilation, ceil_mode=ceil_mode)
    op = _operator_by(input, "max_pool2d", (kernel_size, stride, padding, dilation, ceil_mode),
                      kwargs)
    return _run(op, input, return_indices)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool2d on (N, C, H, W) or (C, H, W) float32."""
    kwargs = dict(method="avg", kernel_size=kernel_size, stride=stride, padding=padding,
                  ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                  divisor_override=divisor_override)
    op = _operator_by(input, "avg_pool2d", (kernel_size, stride, padding, ceil_mode,
                                            count_include_pad, divisor_override), kwargs)
    return _run(op, input)


def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d: any output size (windows may overlap)."""
    kwargs = dict(method="avg", output_size=output_size)
    op = _operator_by(input, "adaptive_avg_pool2d", (output_size,), kwargs)
    return _run(op, input)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool2d: any output size (windows may overlap)."""
    kwargs = dict(method="max", output_size=output_size)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input, return_indices)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool1d on (N, C, L) or (C, L) float32. With ``return_indices``
    also returns int64 positions l of each maximum."""
    kwargs = dict(method="max", kernel_size=kernel_size, stride=stride, padding=padding,
                  dilation=dilation, ceil_mode=ceil_mode, dims=1)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input, return_indices)


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool3d on (N, C, D, H, W) or (C, D, H, W) float32. With
    ``return_indices`` also returns int64 flat positions (d*H + h)*W + w of each maximum."""
    kwargs = dict(method="max", kernel_size=kernel_size, stride=stride, padding=padding,
                  dilation=dilation, ceil_mode=ceil_mode, dims=3)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input, return_indices)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """torch.nn.functional.avg_pool1d on (N, C, L) or (C, L) float32."""
    kwargs = dict(method="avg", kernel_size=kernel_size, stride=stride, padding=padding,
                  ceil_mode=ceil_mode, count_include_pad=count_include_pad, dims=1)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input)


def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool3d on (N, C, D, H, W) or (C, D, H, W) float32."""
    kwargs = dict(method="avg", kernel_size=kernel_size, stride=stride, padding=padding,
                  ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                  divisor_override=divisor_override, dims=3)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input)


def adaptive_avg_pool1d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool1d on (N, C, L) or (C, L) float32."""
    kwargs = dict(method="avg", output_size=output_size, dims=1)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input)


def adaptive_avg_pool3d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool3d on (N, C, D, H, W) or (C, D, H, W) float32."""
    kwargs = dict(method="avg", output_size=output_size, dims=3)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input)


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool1d on (N, C, L) or (C, L) float32."""
    kwargs = dict(method="max", output_size=output_size, dims=1)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input, return_indices)


def adaptive_max_pool3d(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool3d on (N, C, D, H, W) or (C, D, H, W) float32."""
    kwargs = dict(method="max", output_size=output_size, dims=3)
    op = _operator(_ctx_of(input), *_key(kwargs), **kwargs)
    return _run(op, input, return_indices)


def _ctx_of(x):
    if not isinstance(x, Tensor):
        raise not_a_tensor("pooling: input", x)
    return x.ctx


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    return type(value).__name__, value


def _key(kwargs):
    # Types are part of the key: 2.0 == 2 would otherwise find the operator built for 2 and
    # skip the validation that refuses a float kernel size. (A module-level function: a nested
    # recursive one is a reference cycle on every call.)
    return tuple(sorted((k, _freeze(v)) for k, v in kwargs.items()))


# ---- max_unpool: the inverse of max pooling with return_indices ----------------------------

def _max_unpool(name, dims, input, indices, kernel_size, stride, padding, output_size):
    """Zeros of the unpooled shape with each input element written at its flat spatial
    position ``indices`` (torch's scatter along the flattened spatial axes); the gradient is
    the output gradient gathered at ``indices``."""
    from .indexing import scatter
    if not isinstance(input, Tensor):
        raise not_a_tensor(f"{name}: input", input)
    if not isinstance(indices, Tensor):
        raise not_a_tensor(f"{name}: indices", indices)
    check_same_context(input, indices)
    if input.dtype != float32:
        raise DTypeError(f"{name}: input must be float32, got {input.dtype}")
    if indices.dtype != int64:
        raise DTypeError(f"{name}: indices must be int64 (max_pool's return_indices), got "
                         f"{indices.dtype}")
    if input.ndim not in (dims + 1, dims + 2):
        raise ShapeError(f"{name}: input must have {dims + 2} (batched) or {dims + 1} "
                         f"(unbatched) dimensions, got shape {input.shape}")
    if indices.shape != input.shape:
        raise ShapeError(f"{name}: indices must have input's shape {input.shape}, got "
                         f"{indices.shape}")
    kernel = _tuple(kernel_size, f"{name}: kernel_size", dims)
    stride = kernel if stride is None else _tuple(stride, f"{name}: stride", dims)
    padding = _tuple(padding, f"{name}: padding", dims)
    spatial = input.shape[-dims:]
    default = tuple((spatial[d] - 1) * stride[d] - 2 * padding[d] + kernel[d]
                    for d in range(dims))
    if output_size is None:
        size = default
    else:
        size = tuple(int(v) for v in output_size)
        if len(size) == dims + 2:       # torch also takes (N, C, *spatial)
            size = size[2:]
        if len(size) != dims:
            raise ShapeError(f"{name}: output_size must have {dims} or {dims + 2} entries, got "
                             f"{tuple(output_size)}")
        for d in range(dims):
            if not default[d] - stride[d] < size[d] < default[d] + stride[d]:
                raise ShapeError(f"{name}: output_size {size} must be within a stride of the "
                                 f"default size {default} (stride {stride})")
    lead = input.shape[:-dims]
    flat_in = int(np.prod(spatial))
    flat_out = int(np.prod(size))
    if flat_out == 0 and flat_in:
        raise ShapeError(f"{name}: an empty output size {size} for a non-empty input")
    zeros = Tensor.zeros(input.ctx, lead + (flat_out,), float32)
    out = scatter(zeros, -1, indices.reshape(lead + (flat_in,)), input.reshape(lead + (flat_in,)))
    return out.reshape(lead + size)


def max_unpool1d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """torch.nn.functional.max_unpool1d: the (N, C, L) or (C, L) float32 ``input`` written at
    the positions ``indices`` (int64, from max_pool1d with ``return_indices``) of zeros of
    length ``(L - 1) * stride - 2 * padding + kernel_size`` or ``output_size``."""
    return _max_unpool("max_unpool1d", 1, input, indices, kernel_size, stride, padding,
                       output_size)


def max_unpool2d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """torch.nn.functional.max_unpool2d: the (N, C, H, W) or (C, H, W) float32 ``input``
    written at the flat positions h*W + w ``indices`` (from max_pool2d with
    ``return_indices``) of zeros of the unpooled size or ``output_size``."""
    return _max_unpool("max_unpool2d", 2, input, indices, kernel_size, stride, padding,
                       output_size)


def max_unpool3d(input, indices, kernel_size, stride=None, padding=0, output_size=None):
    """torch.nn.functional.max_unpool3d: the (N, C, D, H, W) or (C, D, H, W) float32
    ``input`` written at the flat positions (d*H + h)*W + w ``indices`` (from max_pool3d with
    ``return_indices``) of zeros of the unpooled size or ``output_size``."""
    return _max_unpool("max_unpool3d", 3, input, indices, kernel_size, stride, padding,
                       output_size)
