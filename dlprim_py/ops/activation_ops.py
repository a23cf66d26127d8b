"""Activations: torch.nn.functional's names with backward, and MIOpen's activation API.

Every activation is one ``ActivationDesc`` (``dlprim_py.activation``) rendered into a pointwise
kernel, so the same C expressions serve these operators, GEMM and convolution epilogues and the
fusion plans. One forward and one backward kernel per descriptor, whatever the shape.

MIOpen's scaling: ``activation_forward(desc, x, y, alpha, beta)`` computes
``y = alpha * act(x) + beta * y`` and ``activation_backward(desc, y, dy, x, dx, alpha, beta)``
computes ``dx = alpha * dy * act'(x) + beta * dx``; with beta == 0 the old contents of the output
are never read (they may be garbage or NaN), as in MIOpen.
"""
import math

import numpy as np

from .. import autograd, config, logcmd
from ..activation import Activation, ActivationDesc, as_activation, from_torch_name, number
from ..context import check_same_context
from ..dtypes import is_float16_type, name as dtype_name
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor, output_like
from .pointwise import PointwiseKernel, is_floating

_f32 = np.float32
_F32_DTYPE = np.dtype(np.float32)
_kernels = {}


def _memo(key, factory):
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = factory()
    return k


def _ident(desc):
    """A C identifier naming a descriptor (its parameters are baked into the kernel)."""
    digits = "_".join(repr(v).replace("-", "m").replace(".", "p").replace("+", "")
                      for v in (desc.alpha, desc.beta, desc.gamma))
    return f"{desc.mode.value}_{digits}"


def forward_kernel(desc, accumulate, dtype=_F32_DTYPE):
    """y = scale_alpha * act(x) [+ scale_beta * y]: the pointwise kernel for ``desc``, on
    tensors of ``dtype`` (float16 / bfloat16: computed in float32, without ``accumulate``)."""
    def make():
        # The pointwise template keeps outputs in `<name>_buf` at `<name>_off + i` (dense), so the
        # old value of y is read from there when beta != 0.
        old = " + scale_beta * y_buf[y_off + i]" if accumulate else ""
        return PointwiseKernel(f"act_fwd_{_ident(desc)}{'_acc' if accumulate else ''}",
                               [("x", dtype)], [("y", dtype)],
                               f"y = scale_alpha * {desc.forward_code('x')}{old};",
                               scalars=[("scale_alpha", _f32), ("scale_beta", _f32)])
    assert not (accumulate and dtype != _F32_DTYPE)
    key = ("fwd", desc.key, accumulate) if dtype == _F32_DTYPE else ("fwd", desc.key, dtype)
    return _memo(key, make)


def backward_kernel(desc, accumulate, dtype=_F32_DTYPE):
    """dx = scale_alpha * dy * act'(x) [+ scale_beta * dx] for ``desc``, on tensors of
    ``dtype`` as ``forward_kernel``."""
    def make():
        old = " + scale_beta * dx_buf[dx_off + i]" if accumulate else ""
        if dtype == _F32_DTYPE:
            derivative = desc.derivative_code('x', 'y')
        else:
            # A derivative written in y (sigmoid's y (1 - y)) takes y again from x in float32:
            # the stored 16-bit y would cost the gradient its precision (1 - y cancels).
            derivative = desc.derivative_code('x', f"({desc.forward_code('x')})")
        return PointwiseKernel(f"act_bwd_{_ident(desc)}{'_acc' if accumulate else ''}",
                               [("x", dtype), ("y", dtype), ("dy", dtype)], [("dx", dtype)],
                               f"dx = scale_alpha * dy * {derivative}{old};",
                               scalars=[("scale_alpha", _f32), ("scale_beta", _f32)])
    assert not (accumulate and dtype != _F32_DTYPE)
    key = ("bwd", desc.key, accumulate) if dtype == _F32_DTYPE else ("bwd", desc.key, dtype)
    return _memo(key, make)


def _check(t, what, shape=None, storage16=False):
    """DTypeError unless ``t`` is a float32 tensor (or, with ``storage16``, a float16 or
    bfloat16 one), ShapeError unless it has ``shape`` where given."""
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != np.float32 and not (storage16 and is_floating(t.dtype)):
        allowed = "float32, float16 or bfloat16" if storage16 else "float32"
        raise DTypeError(f"{what} must be {allowed}, got {dtype_name(t.dtype)}")
    if shape is not None and t.shape != shape:
        raise ShapeError(f"{what} must have shape {shape}, got {t.shape}")


def _log_activ(desc, shape, forward):
    """The ``dlprim-driver activ`` command of this call (DLPRIM_LOG_CMD=1): the shape as
    (N, C, H, W) (leading ones added, leading dimensions merged), MIOpen's mode number for
    its modes and the name for the others."""
    if not config.log_cmd():
        return
    shape = tuple(shape)
    if len(shape) > 4:
        shape = (math.prod(shape[:-3]),) + shape[-3:]
    n, c, h, w = (1,) * (4 - len(shape)) + shape
    modes = list(Activation)
    mode = modes.index(desc.mode) if modes.index(desc.mode) < 10 else desc.mode.value
    logcmd.log_command("activ", {"n": n, "c": c, "H": h, "W": w, "m": mode, "A": desc.alpha,
                                 "B": desc.beta, "G": desc.gamma, "F": int(forward)})


def activation_forward(desc, x, y, alpha=1.0, beta=0.0):
    """MIOpen's miopenActivationForward: ``y = alpha * act(x) + beta * y``, elementwise.

    ``desc``: an ActivationDesc, Activation or name; ``x``, ``y``: float32 tensors of one shape
    (any layout, as the operation is elementwise). Enqueues and returns ``y``.
    """
    desc = _desc(desc)
    _check(x, "x")
    _check(y, "y", x.shape)
    check_same_context(x, y)
    _log_activ(desc, x.shape, True)
    forward_kernel(desc, beta != 0)([x], [y], [alpha, beta])
    return y


def activation_backward(desc, y, dy, x, dx, alpha=1.0, beta=0.0):
    """MIOpen's miopenActivationBackward: ``dx = alpha * dy * act'(x) + beta * dx``.

    ``y`` = act(x) as the forward produced it, ``dy`` the gradient of y; all float32 of one shape.
    Enqueues and returns ``dx``.
    """
    desc = _desc(desc)
    _check(x, "x")
    for t, what in ((y, "y"), (dy, "dy"), (dx, "dx")):
        _check(t, what, x.shape)
    check_same_context(x, y, dy, dx)
    _log_activ(desc, x.shape, False)
    backward_kernel(desc, beta != 0)([x, y, dy], [dx], [alpha, beta])
    return dx


def _desc(desc):
    desc = as_activation(desc)
    if desc is None:
        raise UnsupportedError("an activation descriptor is required, got None")
    return desc


_UNSCALED = (1.0, 0.0)


def apply(desc, x, inplace=False, name=None, kernels=None):
    """``act(x)`` for a descriptor, with its backward on the tape. ``inplace`` writes the result
    into ``x`` and returns ``x`` (not allowed when x takes part in autograd). ``kernels``: the
    descriptor's (forward, backward) kernels, where the caller keeps them."""
    name = name or desc.mode.value
    if x.__class__ is not Tensor or x.dtype is not _F32_DTYPE:
        # The usual float32 tensor passes without building the message.
        _check(x, f"{name}: input", storage16=True)
        if is_float16_type(x.dtype):
            # 16-bit storage: its own kernels, computing in float32.
            kernels = (forward_kernel(desc, False, x.dtype), backward_kernel(desc, False, x.dtype))
    grad = x.requires_grad and autograd.grad_enabled()
    if inplace and grad:
        raise UnsupportedError(f"{name}: inplace=True on a tensor that requires grad; "
                               f"use inplace=False")
    forward, backward_kernel_ = kernels or (forward_kernel(desc, False), backward_kernel(desc, False))
    y = output_like(x)
    if config.switches().log_cmd:
        _log_activ(desc, x.shape, True)
    forward([x], [y], _UNSCALED)
    if inplace:
        return x.copy_(y)
    if not grad:
        return y
    # Detached views: the closure must not hold y, whose grad_fn holds the closure. Made
    # elsewhere, so that this function's variables are not cells on every call.
    return autograd.record(y, (x,), _backward(desc, backward_kernel_, x.detach(), y.detach()),
                           name)


def _backward(desc, kernel, source, result):
    """The backward of ``apply``: dy * act'(x) from the forward's input and result."""
    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape, g.dtype)
        _log_activ(desc, g.shape, False)
        kernel([source, result, g], [dx], _UNSCALED)
        return (dx,)

    return backward


_torch_entries = {}


def _torch_entry(name, **kwargs):
    """(descriptor, (forward kernel, backward kernel)) of a torch activation, memoized: building
    a descriptor and looking its kernels up cost more host time than launching a small kernel,
    and these descriptors never leave the module, so nothing changes them."""
    key = (name, tuple(sorted(kwargs.items()))) if kwargs else name
    entry = _torch_entries.get(key)
    if entry is None:
        if len(_torch_entries) > 256:
            _torch_entries.clear()
        desc = from_torch_name(name, **kwargs)
        entry = _torch_entries[key] = (desc, (forward_kernel(desc, False), backward_kernel(desc, False)))
    return entry


def _torch_apply(name, x, inplace=False, **kwargs):
    # _torch_entry's lookup inlined for the activations without parameters (relu, relu6...).
    entry = None if kwargs else _torch_entries.get(name)
    desc, kernels = entry or _torch_entry(name, **kwargs)
    return apply(desc, x, inplace, name, kernels)


def relu(x, inplace=False):
    """torch's relu: max(0, x); ``inplace`` writes into ``x``."""
    # _torch_apply inlined for the activations of every network.
    desc, kernels = _torch_entries.get("relu") or _torch_entry("relu")
    return apply(desc, x, inplace, "relu", kernels)


def relu6(x, inplace=False):
    """torch's relu6: min(max(0, x), 6)."""
    desc, kernels = _torch_entries.get("relu6") or _torch_entry("relu6")
    return apply(desc, x, inplace, "relu6", kernels)


def leaky_relu(x, negative_slope=0.01, inplace=False):
    """torch's leaky_relu: x where x > 0, else ``negative_slope`` * x."""
    return _torch_apply("leaky_relu", x, inplace, negative_slope=negative_slope)


def elu(x, alpha=1.0, inplace=False):
    """torch's elu: x where x > 0, else ``alpha`` * (exp(x) - 1)."""
    return _torch_apply("elu", x, inplace, alpha=alpha)


def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    """torch's hardtanh: x clamped to [``min_val``, ``max_val``]."""
    min_val, max_val = number(min_val, "hardtanh: min_val"), number(max_val, "hardtanh: max_val")
    if min_val > max_val:
        raise ShapeError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return _torch_apply("hardtanh", x, inplace, min_val=min_val, max_val=max_val)


def sigmoid(x):
    """torch's sigmoid: 1 / (1 + exp(-x))."""
    return _torch_apply("sigmoid", x, False)


def tanh(x):
    """torch's tanh."""
    return _torch_apply("tanh", x, False)


def softplus(x, beta=1.0, threshold=20.0):
    """torch's softplus: log(1 + exp(beta x)) / beta, and x where beta x > threshold."""
    beta, threshold = number(beta, "softplus: beta"), number(threshold, "softplus: threshold")
    if beta == 1.0 and threshold == 20.0:
        return _torch_apply("softplus", x, False)
    _check(x, "softplus: input", storage16=True)
    if beta == 0:
        raise ShapeError("softplus: beta must be non-zero")
    dt = x.dtype
    tag = "" if dt == _F32_DTYPE else dtype_name(dt)
    fwd = _memo(("softplus_fwd", tag), lambda: PointwiseKernel(
        "softplus_fwd", [("x", dt)], [("y", dt)],
        "y = (x * beta > threshold) ? x : log1p(exp(x * beta)) / beta;",
        scalars=[("beta", _f32), ("threshold", _f32)]))
    bwd = _memo(("softplus_bwd", tag), lambda: PointwiseKernel(
        "softplus_bwd", [("x", dt), ("dy", dt)], [("dx", dt)],
        "dx = (x * beta > threshold) ? dy : dy / (1.0f + exp(-x * beta));",
        scalars=[("beta", _f32), ("threshold", _f32)]))
    y = Tensor.empty(x.ctx, x.shape, dt)
    fwd([x], [y], [beta, threshold])
    source = x.detach()

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape, g.dtype)
        bwd([source, g], [dx], [beta, threshold])
        return (dx,)

    return autograd.record(y, (x,), backward, "softplus")


def gelu(x, approximate="none"):
    """torch's gelu: x * Phi(x), or its tanh approximation with ``approximate="tanh"``."""
    if approximate not in ("none", "tanh"):
        raise UnsupportedError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _torch_apply("gelu", x, False, approximate=approximate)


def silu(x, inplace=False):
    """torch's silu: x * sigmoid(x)."""
    return _torch_apply("silu", x, inplace)


def hardswish(x, inplace=False):
    """torch's hardswish: x * relu6(x + 3) / 6."""
    return _torch_apply("hardswish", x, inplace)


def hardsigmoid(x, inplace=False):
    """torch's hardsigmoid: relu6(x + 3) / 6."""
    return _torch_apply("hardsigmoid", x, inplace)


def abs(x):  # noqa: A001 - torch's name
    """torch's abs: ``|x|``."""
    return _torch_apply("abs", x, False)


# ---- activations with run-time parameters ----------------------------------------------------
# Each is one pointwise kernel forward and one backward; their parameters (lambd, alpha, the
# threshold, ...) are scalar arguments, so one compile serves every value.

def _pointwise_pair(name, forward_statement, backward_statement, scalars=(), dtype=_F32_DTYPE):
    """The memoized (forward, backward) kernels of an activation on tensors of ``dtype``:
    forward ``y`` from ``x``, backward ``dx`` from ``x``, ``y`` and ``dy``."""
    names = [(n, _f32) for n in scalars]
    tag = () if dtype == _F32_DTYPE else (dtype_name(dtype),)
    return (_memo((name, "fwd") + tag, lambda: PointwiseKernel(
                f"{name}_fwd", [("x", dtype)], [("y", dtype)], forward_statement, scalars=names)),
            _memo((name, "bwd") + tag, lambda: PointwiseKernel(
                f"{name}_bwd", [("x", dtype), ("y", dtype), ("dy", dtype)], [("dx", dtype)],
                backward_statement, scalars=names)))


_PARAMETRIC = {
    # name: (forward, backward (of x, y, dy), scalar names)
    "mish": ("float sp = x > 20.0f ? x : log1p(exp(x)); y = x * tanh(sp);",
             "float sp = x > 20.0f ? x : log1p(exp(x)); float t = tanh(sp);"
             "float s = 1.0f / (1.0f + exp(-x));"
             "dx = dy * (t + x * s * (1.0f - t * t));", ()),
    "selu": ("y = x > 0.0f ? 1.0507009873554805f * x"
             " : 1.0507009873554805f * 1.6732632423543772f * (exp(x) - 1.0f);",
             "dx = x > 0.0f ? dy * 1.0507009873554805f"
             " : dy * 1.0507009873554805f * 1.6732632423543772f * exp(x);", ()),
    "celu": ("y = x > 0.0f ? x : alpha * (exp(x / alpha) - 1.0f);",
             "dx = x > 0.0f ? dy : dy * exp(x / alpha);", ("alpha",)),
    "logsigmoid": ("y = fmin(x, 0.0f) - log1p(exp(-fabs(x)));",
                   "dx = dy / (1.0f + exp(x));", ()),
    "softsign": ("y = x / (1.0f + fabs(x));",
                 "float d = 1.0f + fabs(x); dx = dy / (d * d);", ()),
    "softshrink": ("y = x > lambd ? x - lambd : (x < -lambd ? x + lambd : 0.0f);",
                   "dx = (x > lambd || x < -lambd) ? dy : 0.0f;", ("lambd",)),
    "hardshrink": ("y = (x >= -lambd && x <= lambd) ? 0.0f : x;",
                   "dx = (x >= -lambd && x <= lambd) ? 0.0f : dy;", ("lambd",)),
    "tanhshrink": ("y = x - tanh(x);", "float t = tanh(x); dx = dy * t * t;", ()),
    "threshold": ("y = x > threshold ? x : value;",
                  "dx = x > threshold ? dy : 0.0f;", ("threshold", "value")),
}


def _parametric(name, x, values=(), inplace=False):
    """``name`` of _PARAMETRIC applied to ``x`` with its scalar ``values``, backward on the
    tape; ``inplace`` writes the result into ``x``."""
    _check(x, f"{name}: input", storage16=True)
    forward_statement, backward_statement, scalars = _PARAMETRIC[name]
    forward, backward_kernel_ = _pointwise_pair(name, forward_statement, backward_statement,
                                                scalars, x.dtype)
    grad = autograd.needs_grad(x)
    if inplace and grad:
        raise UnsupportedError(f"{name}: inplace=True on a tensor that requires grad; "
                               f"use inplace=False")
    y = output_like(x)
    forward([x], [y], values)
    if inplace:
        return x.copy_(y)
    if not grad:
        return y
    source, result = x.detach(), y.detach()

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape, g.dtype)
        backward_kernel_([source, result, g], [dx], values)
        return (dx,)

    return autograd.record(y, (x,), backward, name)


def mish(x, inplace=False):
    """torch's mish: x * tanh(softplus(x))."""
    return _parametric("mish", x, (), inplace)


def selu(x, inplace=False):
    """torch's selu: scale * (max(0, x) + min(0, alpha * (exp(x) - 1))) with torch's fixed
    alpha = 1.6732632... and scale = 1.0507009...."""
    return _parametric("selu", x, (), inplace)


def celu(x, alpha=1.0, inplace=False):
    """torch's celu: max(0, x) + min(0, ``alpha`` * (exp(x / alpha) - 1)); alpha non-zero."""
    alpha = number(alpha, "celu: alpha")
    if alpha == 0:
        raise ShapeError("celu: alpha must be non-zero (it divides x), got 0")
    return _parametric("celu", x, (alpha,), inplace)


def logsigmoid(x):
    """torch's logsigmoid: log(1 / (1 + exp(-x))), computed as min(x, 0) - log1p(exp(-abs(x)))."""
    return _parametric("logsigmoid", x)


def softsign(x):
    """torch's softsign: x / (1 + abs(x))."""
    return _parametric("softsign", x)


def _lambd(value, name):
    value = number(value, f"{name}: lambd")
    if value < 0:
        raise ShapeError(f"{name}: lambd must be >= 0, got {value}")
    return value


def softshrink(x, lambd=0.5):
    """torch's softshrink: x - lambd above ``lambd``, x + lambd below -lambd, else 0."""
    return _parametric("softshrink", x, (_lambd(lambd, "softshrink"),))


def hardshrink(x, lambd=0.5):
    """torch's hardshrink: x where abs(x) > ``lambd``, else 0."""
    return _parametric("hardshrink", x, (number(lambd, "hardshrink: lambd"),))


def tanhshrink(x):
    """torch's tanhshrink: x - tanh(x)."""
    return _parametric("tanhshrink", x)


def threshold(x, threshold, value, inplace=False):  # noqa: F811 - torch's argument name
    """torch's threshold: x where x > ``threshold``, else ``value``."""
    return _parametric("threshold", x, (number(threshold, "threshold: threshold"),
                                        number(value, "threshold: value")), inplace)


def rrelu(x, lower=1.0 / 8, upper=1.0 / 3, training=False, inplace=False):
    """torch's rrelu in evaluation (``training=False``): leaky_relu with the slope
    (lower + upper) / 2. The training form (a random slope per element) is not supported."""
    lower, upper = number(lower, "rrelu: lower"), number(upper, "rrelu: upper")
    if training:
        raise UnsupportedError("rrelu: training=True (a random slope per element) is not "
                               "supported; pass training=False")
    if lower > upper:
        raise ShapeError(f"rrelu: lower ({lower}) must not exceed upper ({upper})")
    return leaky_relu(x, (lower + upper) / 2, inplace)


def glu(x, dim=-1):
    """torch's glu: a * sigmoid(b), where a and b are the halves of ``x`` along ``dim`` (whose
    size must be even).

    One kernel each way: the output's element reads its two halves straight from the input's
    buffer (the input enters the kernel as a broadcast scalar, so no slice is copied)."""
    _check(x, "glu: input")
    if x.ndim == 0:
        raise ShapeError("glu: the input must have at least one dimension, got a 0-d tensor")
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or not -x.ndim <= dim < x.ndim:
        raise ShapeError(f"glu: dim must be an int in [{-x.ndim}, {x.ndim - 1}], got {dim!r}")
    dim = int(dim) % x.ndim
    if x.shape[dim] % 2:
        raise ShapeError(f"glu: the size of dimension {dim} must be even, got {x.shape[dim]} "
                         f"(input {x.shape})")
    half = x.shape[dim] // 2
    inner = math.prod(x.shape[dim + 1:]) * half   # elements of one half of one outer slice
    out_shape = x.shape[:dim] + (half,) + x.shape[dim + 1:]
    # The half-slices: output element i lies in outer slice i / inner at i % inner; its a is
    # there in the input's slice of 2 * inner, its b inner elements further.
    forward = _memo("glu_fwd", lambda: PointwiseKernel(
        "glu_fwd", [("x", _f32)], [("y", _f32)],
        "long o = (long)i / inner, r = (long)i % inner;"
        "long at = x_off + o * 2 * inner + r;"
        "y = x_buf[at] / (1.0f + exp(-x_buf[at + inner]));", scalars=[("inner", np.int64)]))
    backward_kernel_ = _memo("glu_bwd", lambda: PointwiseKernel(
        "glu_bwd", [("x", _f32), ("g", _f32)], [("dx", _f32)],
        "long o = (long)i / (2 * inner), r = (long)i % (2 * inner);"
        "long at = x_off + o * 2 * inner + (r < inner ? r : r - inner);"
        "float a = x_buf[at], s = 1.0f / (1.0f + exp(-x_buf[at + inner]));"
        "float gy = g_buf[g_off + o * inner + (r < inner ? r : r - inner)];"
        "dx = r < inner ? gy * s : gy * a * s * (1.0f - s);", scalars=[("inner", np.int64)]))
    y = Tensor.empty(x.ctx, out_shape)
    forward([_scalar_view(x)], [y], (inner,))
    if not autograd.needs_grad(x):
        return y
    source = x.detach()

    def backward(g):
        dx = Tensor.empty(g.ctx, source.shape)
        backward_kernel_([source, _scalar_view(g)], [dx], (inner,))
        return (dx,)

    return autograd.record(y, (x,), backward, "glu")


def _scalar_view(t):
    """``t``'s buffer seen as one element at its offset: an input the pointwise kernel
    broadcasts, whose statement indexes ``<name>_buf`` itself."""
    return Tensor(t.ctx, t.buffer, (1,), t.dtype, offset=t.offset)


def softmin(x, dim=None, _stacklevel=3, dtype=None):
    """torch's softmin: softmax(-x) over ``dim`` (None: torch's legacy choice, 0 for 0-, 1-
    and 3-d inputs, else 1)."""
    from .softmax import softmax
    _check(x, "softmin: input")
    if dtype is not None and np.dtype(dtype) != np.float32:
        raise DTypeError(f"softmin: only float32 is supported, got dtype={dtype}")
    if dim is None:
        dim = 0 if x.ndim in (0, 1, 3) else 1
    from .arithmetic import mul
    return softmax(mul(x, -1.0), dim)


def prelu(x, weight):
    """torch's prelu: x where x > 0, else weight * x, with ``weight`` one value or one per
    channel (dimension 1 of the input; a 0-d or 1-d input has one channel, as in torch).
    Gradients flow to both."""
    from .arithmetic import reduce_to_shape
    _check(x, "prelu: input")
    _check(weight, "prelu: weight")
    check_same_context(x, weight)
    if weight.ndim > 1:
        raise ShapeError(f"prelu: weight must be 0-d or 1-d, got shape {weight.shape}")
    channels = x.shape[1] if x.ndim >= 2 else 1
    if weight.size not in (1, channels):
        raise ShapeError(f"prelu: weight must hold 1 value or one per channel ({channels} for "
                         f"input {x.shape}), got {weight.size}")
    if weight.size == 1:
        w = Tensor(weight.ctx, weight.buffer, (), weight.dtype, offset=weight.offset)
    else:
        w = Tensor(weight.ctx, weight.buffer, (channels,) + (1,) * (x.ndim - 2), weight.dtype,
                   offset=weight.offset)
    forward = _memo("prelu_fwd", lambda: PointwiseKernel(
        "prelu_fwd", [("x", _f32), ("w", _f32)], [("y", _f32)], "y = x > 0.0f ? x : w * x;"))
    backward_kernel_ = _memo("prelu_bwd", lambda: PointwiseKernel(
        "prelu_bwd", [("x", _f32), ("w", _f32), ("g", _f32)], [("dx", _f32), ("dw", _f32)],
        "dx = x > 0.0f ? g : w * g; dw = x > 0.0f ? 0.0f : x * g;"))
    y = output_like(x)
    forward([x, w], [y])
    if not autograd.needs_grad(x, weight):
        return y
    source, w_source, weight_shape = x.detach(), w.detach(), weight.shape

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape)
        dw = Tensor.empty(g.ctx, g.shape)
        backward_kernel_([source, w_source, g], [dx, dw])
        return dx, reduce_to_shape(dw, w_source.shape).reshape(weight_shape)

    return autograd.record(y, (x, weight), backward, "prelu")


def activation(x, desc, inplace=False):
    """Any descriptor (MIOpen mode with its parameters, or a torch name) as an operator."""
    return apply(_desc(desc), x, inplace)


__all__ = ["ActivationDesc", "activation", "activation_forward", "activation_backward", "relu",
           "relu6", "leaky_relu", "elu", "hardtanh", "sigmoid", "tanh", "softplus", "gelu", "silu",
           "hardswish", "hardsigmoid", "abs", "mish", "selu", "celu", "logsigmoid", "softsign",
           "softshrink", "hardshrink", "tanhshrink", "threshold", "rrelu", "glu", "softmin",
           "prelu"]
