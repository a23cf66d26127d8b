"""The arithmetic operators with gradients: ``add``, ``sub``, ``mul``, ``div``, ``maximum``,
``minimum`` (numpy broadcasting, a Tensor or a Python number on either side), over the
pointwise family's ``binary``. A broadcast operand's gradient is summed back to its shape by the
reduce family, so this module stands above both.
"""
from .. import autograd
from ..errors import UnsupportedError
from ..tensor import Tensor
from . import reduce
from .pointwise import PointwiseKernel, binary, convert


def reduce_to_shape(grad, shape, dtype=None):
    """Sum ``grad`` over the dimensions that broadcasting expanded, back to ``shape``, and
    convert it to ``dtype`` where given (an operand's gradient has its type: a float16 operand
    of a float32 result gets a float16 gradient, as in torch)."""
    if grad.shape != tuple(shape):
        grad = reduce.sum_to_shape(grad, shape)
    if dtype is not None and grad.dtype != dtype:
        grad = convert(grad, dtype)
    return grad


def _is_tensor(x):
    return isinstance(x, Tensor)


def _scaled(b, alpha):
    """``alpha * b`` of torch's add/sub(a, b, alpha=...), through mul where b is a Tensor (so
    its gradient is scaled as well)."""
    return mul(b, alpha) if _is_tensor(b) else b * alpha


def add(a, b, *, alpha=1):
    """``a + alpha * b`` with numpy broadcasting (a number is allowed for one side)."""
    if alpha != 1:
        b = _scaled(b, alpha)
    out = binary("add", a, b)
    if not autograd.needs_grad(a, b):
        return out
    return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)], lambda g: (
        reduce_to_shape(g, a.shape, a.dtype) if _is_tensor(a) else None,
        reduce_to_shape(g, b.shape, b.dtype) if _is_tensor(b) else None), "add")


def sub(a, b, *, alpha=1):
    """``a - alpha * b`` with numpy broadcasting (a number is allowed for one side)."""
    if alpha != 1:
        b = _scaled(b, alpha)
    out = binary("sub", a, b)
    if not autograd.needs_grad(a, b):
        return out
    return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)], lambda g: (
        reduce_to_shape(g, a.shape, a.dtype) if _is_tensor(a) else None,
        reduce_to_shape(binary("mul", g, -1.0), b.shape, b.dtype) if _is_tensor(b) else None), "sub")


def mul(a, b):
    """``a * b`` with numpy broadcasting (a number is allowed for one side)."""
    out = binary("mul", a, b)
    if not autograd.needs_grad(a, b):
        return out
    return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)], lambda g: (
        reduce_to_shape(binary("mul", g, b), a.shape, a.dtype) if _is_tensor(a) else None,
        reduce_to_shape(binary("mul", g, a), b.shape, b.dtype) if _is_tensor(b) else None), "mul")


_ROUNDING_MODES = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}


def div(a, b, *, rounding_mode=None):
    """torch.div: ``a / b`` with numpy broadcasting (a number is allowed for one side).

    ``rounding_mode``: None (true division), "trunc" (rounded toward zero) or "floor" (rounded
    down, as torch's floor division of floats: the floor of the exact quotient). A rounded
    quotient's gradient is zero for both operands, as torch's."""
    op = _ROUNDING_MODES.get(rounding_mode) if isinstance(rounding_mode, (str, type(None))) else None
    if op is None:
        raise UnsupportedError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                               f"{rounding_mode!r}")
    out = binary(op, a, b)
    if not autograd.needs_grad(a, b):
        return out
    if rounding_mode is not None:
        def zeros(x):
            return Tensor.zeros(x.ctx, x.shape, x.dtype) if _is_tensor(x) else None

        return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)],
                               lambda g: (zeros(a), zeros(b)), "div")
    # A detached view: the closure must not hold out, whose grad_fn holds the closure.
    result = out.detach()

    def backward(g):
        ga = reduce_to_shape(binary("div", g, b), a.shape, a.dtype) if _is_tensor(a) else None
        gb = None
        if _is_tensor(b):
            # d(a/b)/db = -(a/b)/b
            gb = reduce_to_shape(binary("mul", binary("div", result, b), binary("mul", g, -1.0)),
                                 b.shape, b.dtype)
        return ga, gb

    return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)], backward, "div")


# torch's rule for maximum/minimum: the gradient goes to the chosen operand, half to each on a
# tie, and to both where a NaN makes neither comparison true.
_EXTREMUM_GRADIENT = {
    "maximum": ("da = (a == b) ? 0.5f * g : ((a < b) ? 0.0f : g);",
                "db = (a == b) ? 0.5f * g : ((a > b) ? 0.0f : g);"),
    "minimum": ("da = (a == b) ? 0.5f * g : ((a > b) ? 0.0f : g);",
                "db = (a == b) ? 0.5f * g : ((a < b) ? 0.0f : g);"),
}
_extremum_gradient_kernels = {}


def _extremum(op, a, b):
    out = binary(op, a, b)
    ref = a if _is_tensor(a) else b
    # A number operand becomes a 0-d tensor for the backward's broadcast.
    ta = a if _is_tensor(a) else Tensor.full(ref.ctx, (), a, ref.dtype)
    tb = b if _is_tensor(b) else Tensor.full(ref.ctx, (), b, ref.dtype)
    ta_source, tb_source = ta.detach(), tb.detach()

    def backward(g):
        key = (op, g.dtype, ta_source.dtype, tb_source.dtype)
        k = _extremum_gradient_kernels.get(key)
        if k is None:
            stmt_a, stmt_b = _EXTREMUM_GRADIENT[op]
            k = _extremum_gradient_kernels[key] = PointwiseKernel(
                f"{op}_backward", [("g", g.dtype), ("a", ta_source.dtype), ("b", tb_source.dtype)],
                [("da", g.dtype), ("db", g.dtype)], stmt_a + stmt_b)
        da = Tensor.empty(g.ctx, g.shape, g.dtype)
        db = Tensor.empty(g.ctx, g.shape, g.dtype)
        k([g, ta_source, tb_source], [da, db])
        return (reduce_to_shape(da, a.shape, a.dtype) if _is_tensor(a) else None,
                reduce_to_shape(db, b.shape, b.dtype) if _is_tensor(b) else None)

    return autograd.record(out, [x if _is_tensor(x) else None for x in (a, b)], backward, op)


def maximum(a, b):
    """torch.maximum with numpy broadcasting (a number is allowed for one side); NaN propagates."""
    return _extremum("maximum", a, b)


def minimum(a, b):
    """torch.minimum with numpy broadcasting (a number is allowed for one side); NaN propagates."""
    return _extremum("minimum", a, b)
