"""torch.nn.utils's gradient clipping over dp.Tensor parameters (``dp.nn.utils``):
``clip_grad_norm_`` and ``clip_grad_value_``.

``clip_grad_norm_`` is fused as the optimizers' updates are (``dlprim_py.optim.fused``): one
launch per chunk of up to 8 gradients writes each work group's partial (sum of |g|^p, or max
|g|), one launch reduces the partials to the total norm and the clip coefficient on the device,
and one launch per chunk scales the gradients by it. Nothing is read back to the host unless
``error_if_nonfinite`` asks for the check.
"""
import math

import numpy as np

from ..launch import enqueue_bound
from ..errors import DeviceError, DTypeError, NumericsError, ShapeError, not_a_tensor
from ..optim import fused
from ..tensor import Tensor

_GROUP = 64


def _grads(parameters, what):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    try:
        parameters = list(parameters)
    except TypeError:
        raise DTypeError(f"{what}: parameters must be a Tensor or an iterable of Tensors, got "
                         f"{type(parameters).__name__}") from None
    grads, ctx = [], None
    for i, p in enumerate(parameters):
        if not isinstance(p, Tensor):
            raise not_a_tensor(f"{what}: parameter {i}", p)
        g = p.grad
        if g is None:
            continue
        if not isinstance(g, Tensor):
            raise not_a_tensor(f"{what}: parameter {i}'s .grad", g)
        if g.dtype != np.float32:
            raise DTypeError(f"{what}: gradient {i} is {g.dtype}; only float32 is supported")
        if ctx is None:
            ctx = g.ctx
        elif g.ctx is not ctx:
            raise DeviceError(f"{what}: gradients live in more than one context")
        grads.append(g)
    return grads, ctx


def _norm_kind(norm_type, what):
    if isinstance(norm_type, str) and norm_type.lower() == "inf":
        norm_type = math.inf
    if isinstance(norm_type, bool) or not isinstance(norm_type, (int, float, np.integer,
                                                                 np.floating)):
        raise ShapeError(f"{what}: norm_type must be a number or 'inf', got {norm_type!r}")
    norm_type = float(norm_type)
    if norm_type == math.inf:
        return "inf", norm_type
    if norm_type == 2.0:
        return "2", norm_type
    if norm_type == 1.0:
        return "1", norm_type
    if norm_type > 0 and math.isfinite(norm_type):
        return "p", norm_type
    raise ShapeError(f"{what}: norm_type must be positive (or inf), got {norm_type!r}")


def _chunks(ctx, grads, buffers):
    index_t, index = fused.index_type(grads)
    slots = fused.slot_count(ctx, fused.slot_bytes(buffers, 0, np.dtype(index).itemsize))
    return index_t, index, slots, [grads[i:i + slots] for i in range(0, len(grads), slots)]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None):
    """torch.nn.utils.clip_grad_norm_: scale the gradients of ``parameters`` (a Tensor or an
    iterable of them; those without a .grad are skipped) in place so that their total
    ``norm_type``-norm (2, 1, inf or any positive p) is at most ``max_norm``: every gradient
    is multiplied by min(1, max_norm / (total + 1e-6)). Returns the total norm before clipping
    as a 0-d float32 dp.Tensor (0 where no parameter has a gradient).

    A non-finite total raises NumericsError with ``error_if_nonfinite`` (and changes nothing);
    otherwise the gradients are scaled as torch scales them (NaN everywhere for a NaN norm)."""
    what = "clip_grad_norm_"
    max_norm = float(max_norm) if isinstance(max_norm, (int, float, np.integer, np.floating)) \
        and not isinstance(max_norm, bool) else max_norm
    if not isinstance(max_norm, float):
        raise ShapeError(f"{what}: max_norm must be a number, got {max_norm!r}")
    kind, power = _norm_kind(norm_type, what)
    grads, ctx = _grads(parameters, what)
    grads = [g for g in grads if g.size]
    if not grads:
        from ..context import default_context
        return Tensor.zeros(ctx or default_context(), ())
    index_t, index, slots, chunks = _chunks(ctx, grads, 1)
    per_chunk = [fused.groups_for(ctx, max(g.size for g in chunk), _GROUP) for chunk in chunks]
    partials = Tensor.empty(ctx, (sum(per_chunk),))
    result = Tensor.empty(ctx, (2,))
    params = (("kernel", "norm"), ("slots", slots), ("index_t", index_t), ("norm", kind),
              ("group", _GROUP))
    base = 0
    for position, chunk in enumerate(chunks):
        slot_args = [[index(g.size), g.buffer, index(g.offset_elements)] for g in chunk]
        fused.run(ctx, "norm_partial", params, position,
                  (partials.buffer, index(base), np.float32(power)), slots, slot_args,
                  max(g.size for g in chunk), group=_GROUP)
        base += per_chunk[position]
    finish = fused.bound_kernel(ctx, "norm_finish", params, 0)[0]
    args = (partials.buffer, np.int32(base), result.buffer, np.float32(max_norm),
            np.float32(1.0 / power))
    finish.set_all(args)
    enqueue_bound(ctx.queue, finish, (_GROUP,), (_GROUP,), args)
    total = _scalar_view(result)
    if error_if_nonfinite:
        value = float(total.numpy())
        if not math.isfinite(value):
            raise NumericsError(f"{what}: the total norm of order {norm_type} of the gradients "
                                f"is non-finite ({value}), so it cannot be clipped; pass "
                                f"error_if_nonfinite=False to scale them anyway")
    scale = (("kernel", "scale"), ("slots", slots), ("index_t", index_t))
    for position, chunk in enumerate(chunks):
        slot_args = [[index(g.size), g.buffer, index(g.offset_elements)] for g in chunk]
        fused.run(ctx, "scale_grads", scale, position, (result.buffer,), slots, slot_args,
                  max(g.size for g in chunk))
    return total


def clip_grad_value_(parameters, clip_value, foreach=None):
    """torch.nn.utils.clip_grad_value_: clamp the gradients of ``parameters`` (a Tensor or an
    iterable of them; those without a .grad are skipped) in place to [-clip_value, clip_value],
    one launch per 8 gradients; NaN stays NaN. Returns None."""
    what = "clip_grad_value_"
    if isinstance(clip_value, bool) or not isinstance(clip_value, (int, float, np.integer,
                                                                   np.floating)):
        raise ShapeError(f"{what}: clip_value must be a number, got {clip_value!r}")
    clip_value = float(clip_value)
    grads, ctx = _grads(parameters, what)
    grads = [g for g in grads if g.size]
    if not grads:
        return None
    index_t, index, slots, chunks = _chunks(ctx, grads, 1)
    params = (("kernel", "clamp"), ("slots", slots), ("index_t", index_t))
    for position, chunk in enumerate(chunks):
        slot_args = [[index(g.size), g.buffer, index(g.offset_elements)] for g in chunk]
        fused.run(ctx, "clamp_grads", params, position, (np.float32(clip_value),), slots,
                  slot_args, max(g.size for g in chunk))
    return None


def _scalar_view(result):
    """The 0-d tensor of ``result``'s first element (same buffer)."""
    from ..tensor import _checked
    return _checked(result.ctx, result.buffer, (), result.dtype, result.offset)
