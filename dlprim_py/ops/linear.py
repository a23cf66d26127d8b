"""torch.nn.functional.linear through the GEMM engine: y = x @ weight^T + bias, with the bias
added in the GEMM's epilogue (no separate pass), and its backward as two more GEMMs,
dx = dy @ weight and dweight = dy^T @ x, and a column sum, dbias = dy summed over its rows (the
reduction kernels read dy once at full bandwidth; a GEMM with a vector of ones has one column
of output for the tiles of a matrix product: on the H200 an MLP's bias gradient took 0.22 ms
that way against 0.03 ms in cuBLAS).

x: (..., in_features), weight: (out_features, in_features), bias: (out_features,) or None;
float32, dense row-major; every operand may sit at any element offset in its buffer. float16
and bfloat16: all operands of one type, the output and the gradients of that type (as torch),
every sum in float32 (``ops/gemm.py``'s 16-bit GEMMs, which take every transpose, so the
backward moves no data): a 16-bit result is rounded once, at the end.
"""
import math

from .. import autograd
from ..context import PlanCache, check_same_context
from ..dtypes import FLOAT16_TYPES, bfloat16, float16, float32
from ..dtypes import name as dtype_name
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import run_planned_on
from ..tensor import Tensor, output
from .gemm import enqueue_gemm
from .reduce import sum_to_shape


def _check(input, weight, bias):
    for what, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is None and what == "bias":
            continue
        if not isinstance(t, Tensor):
            raise not_a_tensor(f"linear: {what}", t)
        if t.dtype not in (float32, float16, bfloat16):
            raise DTypeError(f"linear: {what} must be float32, float16 or bfloat16, got "
                             f"{dtype_name(t.dtype)}")
        if t.dtype != input.dtype:
            raise DTypeError(f"linear: {what} must have input's dtype {dtype_name(input.dtype)}, "
                             f"got {dtype_name(t.dtype)}")
    check_same_context(input, weight, bias)
    if weight.ndim == 1:
        raise UnsupportedError(f"linear: a 1-d weight {weight.shape} (torch's vector form) is not "
                               f"supported; pass weight.reshape(1, -1)")
    if weight.ndim != 2:
        raise ShapeError(f"linear: weight must be (out_features, in_features), got {weight.shape}")
    out_features, in_features = weight.shape
    if input.ndim == 0 or input.shape[-1] != in_features:
        raise ShapeError(f"linear: input's last dimension must be in_features = {in_features}, "
                         f"got input shape {input.shape}")
    if bias is not None and bias.shape in ((), (1,)) and out_features != 1:
        raise UnsupportedError(f"linear: a bias of shape {bias.shape} broadcast over "
                               f"{out_features} outputs is not supported; pass ({out_features},)")
    if bias is not None and bias.shape != (out_features,):
        raise ShapeError(f"linear: bias must have shape ({out_features},), got {bias.shape}")
    return out_features, in_features


def linear(input, weight, bias=None):
    """y = input @ weight^T + bias over the last dimension of ``input`` (any leading shape).

    An empty weight (no input or no output features) gives the bias broadcast, or zeros, as
    torch's; its gradients are zeros (and the bias's, the output gradient summed).

    Limitations (UnsupportedError), both accepted by torch: a 1-d weight, and a bias that
    broadcasts (shape () or (1,)) instead of (out_features,)."""
    # A call with the operands' layout of an earlier one (whose checks passed) takes that
    # call's entry from the plan cache: its output shape and sizes, and its replay plans (by
    # how the buffers alias), as conv2d does.
    try:
        key = ("F.linear", input.shape, input.dtype, input.offset, weight.shape, weight.dtype,
               weight.offset, None if bias is None else (bias.shape, bias.dtype, bias.offset))
        ctx = input.ctx
        entry = ctx.plans.hit(key) or ctx.plans.get(key)
    except AttributeError:   # not tensors: checked below
        key = entry = None
    first = entry is None
    if first:
        out_features, in_features = _check(input, weight, bias)
        if not in_features or not out_features:
            return _empty_weight(input, weight, bias, out_features)
        ctx = input.ctx
        rows = math.prod(input.shape[:-1])
        out_shape = input.shape[:-1] + (out_features,)
        itemsize = input.dtype.itemsize
        entry = (out_shape, max(itemsize * math.prod(out_shape), itemsize), rows, out_features,
                 in_features, PlanCache(4))
    out_shape, nbytes, rows, out_features, in_features, plans = entry
    half = input.dtype in FLOAT16_TYPES
    out = output(ctx, out_shape, nbytes) if not half else \
        Tensor.empty(ctx, out_shape, input.dtype)
    if rows:
        operands = (input, weight, out, bias)
        run_planned_on(ctx, None, operands, _forward, plans,
                       (ctx, rows, out_features, in_features) + operands)
    else:
        # run_planned_on checks the contexts of a call that computes something.
        check_same_context(input, weight, bias)
    if first and key is not None:
        # Kept only now: the first call's checks passed.
        ctx.plans.put(key, entry)
    if not ((input.requires_grad or weight.requires_grad
             or (bias is not None and bias.requires_grad)) and autograd.grad_enabled()):
        return out
    return autograd.record(out, (input, weight, bias),
                           _backward(ctx, input, weight, bias, rows, out_features, in_features),
                           "linear")


def _empty_weight(input, weight, bias, out_features):
    """linear with a weight of no input or no output features (checked): the bias broadcast
    (or zeros); zero gradients for the input and the weight, the output gradient summed over
    its rows for the bias."""
    from .reduce import expand
    ctx, dtype = input.ctx, input.dtype
    shape = input.shape[:-1] + (out_features,)
    if bias is not None and math.prod(shape):
        out = expand(bias.detach(), shape)
    else:
        out = Tensor.zeros(ctx, shape, dtype)
    if not autograd.needs_grad(input, weight, bias):
        return out

    def backward(g):
        dx = Tensor.zeros(ctx, input.shape, dtype) if input.requires_grad else None
        dweight = Tensor.zeros(ctx, weight.shape, dtype) if weight.requires_grad else None
        dbias = None
        if bias is not None and bias.requires_grad:
            dbias = sum_to_shape(_grad_of(g, dtype), bias.shape) if g.size else \
                Tensor.zeros(ctx, bias.shape, dtype)
        return dx, dweight, dbias

    return autograd.record(out, (input, weight, bias), backward, "linear")


def _forward(ctx, rows, out_features, in_features, input, weight, out, bias):
    enqueue_gemm(ctx, rows, out_features, in_features,
                 input.buffer, input.offset_elements, in_features,
                 weight.buffer, weight.offset_elements, in_features,
                 out.buffer, out.offset_elements, out_features, trans_b=True,
                 bias_buf=None if bias is None else bias.buffer,
                 bias_off=0 if bias is None else bias.offset_elements, bias_per="n",
                 checked=True, dtype=input.dtype, c_dtype=input.dtype)


def _grad_of(g, dtype):
    """The incoming gradient in the operands' type (a float32 gradient of a 16-bit output is
    rounded to it once, as torch's autograd casts a gradient to its tensor's type)."""
    return g if g.dtype == dtype else g.to(dtype)


def _backward(ctx, input, weight, bias, rows, out_features, in_features):
    dtype = input.dtype
    # 16-bit operands: 16-bit gradients, each GEMM summing in float32 and rounding once.
    types = dict(dtype=dtype, c_dtype=dtype) if dtype in FLOAT16_TYPES else {}

    def backward(g):
        g = _grad_of(g, dtype)
        dx = dweight = dbias = None
        if input.requires_grad:
            dx = Tensor.empty(ctx, input.shape, dtype)
            if rows:
                enqueue_gemm(ctx, rows, in_features, out_features,
                             g.buffer, g.offset_elements, out_features,
                             weight.buffer, weight.offset_elements, in_features,
                             dx.buffer, dx.offset_elements, in_features, checked=True, **types)
        if weight.requires_grad:
            dweight = Tensor.empty(ctx, weight.shape, dtype)
            if rows:
                enqueue_gemm(ctx, out_features, in_features, rows,
                             g.buffer, g.offset_elements, out_features,
                             input.buffer, input.offset_elements, in_features,
                             dweight.buffer, dweight.offset_elements, in_features, trans_a=True,
                             checked=True, **types)
            else:
                dweight.fill_(0.0)
        if bias is not None and bias.requires_grad:
            if rows:
                # Summed in float32 (a 16-bit gradient rounded once), as the GEMMs do.
                sums = sum_to_shape(Tensor(ctx, g.buffer, (rows, out_features), dtype,
                                           offset=g.offset), (1, out_features))
                dbias = Tensor(ctx, sums.buffer, bias.shape, dtype, offset=sums.offset)
            else:
                dbias = Tensor.zeros(ctx, bias.shape, dtype)
        return dx, dweight, dbias

    return backward


def matmul16(a, b):
    """``a @ b`` of two 16-bit matrices with gradients: ``dp.gemm`` forward (a result of their
    type), and the gradients as GEMMs on the transposes in place, da = g @ b^T and
    db = a^T @ g, of the operands' type (the float32 ``@`` goes through ``linear`` on a
    transposed copy instead)."""
    from .gemm import gemm
    out = gemm(a, b)
    if not autograd.needs_grad(a, b):
        return out
    dtype = a.dtype

    def backward(g):
        g = _grad_of(g, dtype)
        da = gemm(g, b, trans_b=True) if a.requires_grad else None
        db = gemm(a, g, trans_a=True) if b.requires_grad else None
        return da, db

    return autograd.record(out, (a, b), backward, "matmul")


__all__ = ["linear", "matmul16"]


def bilinear(input1, input2, weight, bias=None):
    """torch.nn.functional.bilinear: y[..., o] = sum_ij input1[..., i] weight[o, i, j]
    input2[..., j] + bias[o]; input1 (..., I), input2 (..., J) with the same leading shape,
    weight (O, I, J), bias (O,). Gradients to all four.

    A GEMM (input1 against the weight laid out as (O * J, I)), then the product with input2
    summed over J, composed of the library's operators: the backward is theirs, through the
    tape."""
    from . import reduce
    from .arithmetic import add, mul
    from .tensor_ops import permute
    for what, t in (("input1", input1), ("input2", input2), ("weight", weight), ("bias", bias)):
        if t is None and what == "bias":
            continue
        if not isinstance(t, Tensor):
            raise not_a_tensor(f"bilinear: {what}", t)
        if t.dtype != float32:
            raise DTypeError(f"bilinear: {what} must be float32, got {t.dtype}")
    check_same_context(input1, input2, weight, bias)
    if weight.ndim != 3:
        raise ShapeError(f"bilinear: weight must be (out_features, in1_features, in2_features), "
                         f"got {weight.shape}")
    out_features, in1, in2 = weight.shape
    if input1.ndim == 0 or input1.shape[-1] != in1 or input2.ndim == 0 or input2.shape[-1] != in2:
        raise ShapeError(f"bilinear: inputs must end in {in1} and {in2} features for a weight "
                         f"{weight.shape}, got {input1.shape} and {input2.shape}")
    if input1.shape[:-1] != input2.shape[:-1]:
        raise ShapeError(f"bilinear: the inputs' leading shapes must match, got {input1.shape} "
                         f"and {input2.shape}")
    if bias is not None and bias.shape != (out_features,):
        raise ShapeError(f"bilinear: bias must have shape ({out_features},), got {bias.shape}")
    lead = input1.shape[:-1]
    rows = math.prod(lead)
    # t[n, o * J + j] = sum_i input1[n, i] weight[o, i, j]
    stacked = permute(weight, (0, 2, 1)).reshape(out_features * in2, in1)
    t = linear(input1.reshape(rows, in1), stacked).reshape(rows, out_features, in2)
    y = reduce.sum(mul(t, input2.reshape(rows, 1, in2)), 2)
    if bias is not None:
        y = add(y, bias)
    return y.reshape(lead + (out_features,))
