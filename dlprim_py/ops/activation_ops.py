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
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor, output_like
from .pointwise import PointwiseKernel

_f32 = np.float32
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


def forward_kernel(desc, accumulate):
    """y = scale_alpha * act(x) [+ scale_beta * y]: the pointwise kernel for ``desc``."""
    def make():
        # The pointwise template keeps outputs in `<name>_buf` at `<name>_off + i` (dense), so the
        # old value of y is read from there when beta != 0.
        old = " + scale_beta * y_buf[y_off + i]" if accumulate else ""
        return PointwiseKernel(f"act_fwd_{_ident(desc)}{'_acc' if accumulate else ''}",
                               [("x", _f32)], [("y", _f32)],
                               f"y = scale_alpha * {desc.forward_code('x')}{old};",
                               scalars=[("scale_alpha", _f32), ("scale_beta", _f32)])
    return _memo(("fwd", desc.key, accumulate), make)


def backward_kernel(desc, accumulate):
    """dx = scale_alpha * dy * act'(x) [+ scale_beta * dx] for ``desc``."""
    def make():
        old = " + scale_beta * dx_buf[dx_off + i]" if accumulate else ""
        return PointwiseKernel(f"act_bwd_{_ident(desc)}{'_acc' if accumulate else ''}",
                               [("x", _f32), ("y", _f32), ("dy", _f32)], [("dx", _f32)],
                               f"dx = scale_alpha * dy * {desc.derivative_code('x', 'y')}{old};",
                               scalars=[("scale_alpha", _f32), ("scale_beta", _f32)])
    return _memo(("bwd", desc.key, accumulate), make)


def _check(t, what, shape=None):
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != np.float32:
        raise DTypeError(f"{what} must be float32, got {t.dtype}")
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
    _check(x, f"{name}: input")
    grad = autograd.needs_grad(x)
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
    # Detached views: the closure must not hold y, whose grad_fn holds the closure.
    source, result = x.detach(), y.detach()

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape)
        _log_activ(desc, g.shape, False)
        backward_kernel_([source, result, g], [dx], _UNSCALED)
        return (dx,)

    return autograd.record(y, (x,), backward, name)


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
    desc, kernels = _torch_entry(name, **kwargs)
    return apply(desc, x, inplace, name, kernels)


def relu(x, inplace=False):
    """torch's relu: max(0, x); ``inplace`` writes into ``x``."""
    return _torch_apply("relu", x, inplace)


def relu6(x, inplace=False):
    """torch's relu6: min(max(0, x), 6)."""
    return _torch_apply("relu6", x, inplace)


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
    _check(x, "softplus: input")
    if beta == 0:
        raise ShapeError("softplus: beta must be non-zero")
    fwd = _memo("softplus_fwd", lambda: PointwiseKernel(
        "softplus_fwd", [("x", _f32)], [("y", _f32)],
        "y = (x * beta > threshold) ? x : log1p(exp(x * beta)) / beta;",
        scalars=[("beta", _f32), ("threshold", _f32)]))
    bwd = _memo("softplus_bwd", lambda: PointwiseKernel(
        "softplus_bwd", [("x", _f32), ("dy", _f32)], [("dx", _f32)],
        "dx = (x * beta > threshold) ? dy : dy / (1.0f + exp(-x * beta));",
        scalars=[("beta", _f32), ("threshold", _f32)]))
    y = Tensor.empty(x.ctx, x.shape)
    fwd([x], [y], [beta, threshold])
    source = x.detach()

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape)
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


def activation(x, desc, inplace=False):
    """Any descriptor (MIOpen mode with its parameters, or a torch name) as an operator."""
    return apply(_desc(desc), x, inplace)


__all__ = ["ActivationDesc", "activation", "activation_forward", "activation_backward", "relu",
           "relu6", "leaky_relu", "elu", "hardtanh", "sigmoid", "tanh", "softplus", "gelu", "silu",
           "hardswish", "hardsigmoid", "abs"]
