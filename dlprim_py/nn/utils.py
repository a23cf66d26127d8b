"""``dp.nn.utils``: torch.nn.utils' gradient clipping, ``clip_grad_norm_`` and
``clip_grad_value_``, on the device (no host round trip unless ``error_if_nonfinite``)."""
import math

from .. import autograd, functional as F
from ..errors import DTypeError, NumericsError
from ..tensor import Tensor


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = []
    for p in parameters:
        if not isinstance(p, Tensor):
            raise DTypeError(f"expected dlprim_py tensors (parameters), got {type(p).__name__}")
        if p.grad is not None:
            grads.append(p.grad)
    return grads


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """Scale the gradients of ``parameters`` in place so that their joint ``norm_type``-norm (the
    norm of the per-gradient norms, as if all were one vector) is at most ``max_norm``: each is
    multiplied by min(1, max_norm / (total + 1e-6)). Returns the total norm before clipping, a
    0-d tensor on the device. ``error_if_nonfinite`` reads it back and raises NumericsError for a
    NaN or infinite norm (and leaves the gradients alone)."""
    grads = _grads(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        from ..context import default_context
        return Tensor.zeros(default_context(), ())
    with autograd.no_grad():
        norms = [F.norm(g, norm_type).reshape(1) for g in grads]
        total = F.norm(norms[0] if len(norms) == 1 else F.cat(norms), norm_type).reshape(())
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise NumericsError(f"the total norm of order {norm_type} of the gradients is "
                                f"non-finite, so it cannot be clipped; pass "
                                f"error_if_nonfinite=False to clip anyway")
        coef = F.minimum(max_norm / (total + 1e-6), 1.0)
        for g in grads:
            g.copy_(g * coef)
    return total


def clip_grad_value_(parameters, clip_value):
    """Clamp every gradient of ``parameters`` into [-clip_value, clip_value] in place."""
    clip_value = float(clip_value)
    with autograd.no_grad():
        for g in _grads(parameters):
            g.copy_(F.maximum(F.minimum(g, clip_value), -clip_value))
