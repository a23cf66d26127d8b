"""The Tensor methods that run operators: ``fill_``, arithmetic, comparisons and the mask
operators ``~ & | ^``, reductions, casts (``to``, ``float`` ...), ``permute`` / ``transpose`` /
``T`` and ``@``.

They are defined here, above the operator families they call, and set on ``Tensor`` when the
package loads (``dlprim_py/__init__.py`` imports this module), so that ``tensor.py`` imports no
operator module and the layers import one way only. The arithmetic operators are the pointwise
functions themselves: ``a + b`` costs one call, with no lookup in between.
"""
import numpy as np
import pyopencl as cl

from . import autograd
from .errors import DTypeError, ShapeError, UnsupportedError
from .launch import command_enqueued
from .dtypes import (FLOAT16_TYPES, bfloat16, bool_, float16, float32, int32, int64,
                     to_bfloat16_bits)
from .ops import arithmetic, indexing, linear, masks, pointwise, reduce, scan, tensor_ops
from .ops.gemm import gemm
from .tensor import Tensor, _checked


def fill_(self, value):
    """Set every element to ``value`` (a number) in place."""
    if not isinstance(value, (int, float, np.number, np.bool_)):
        raise DTypeError(f"fill_ needs a number, got {value!r}")
    if self.size and self.dtype is bfloat16:
        # No OpenCL C type holds it: the bit pattern, rounded to nearest even on the host.
        cl.enqueue_fill_buffer(self.ctx.queue, self.buffer, to_bfloat16_bits([value]),
                               self.offset, self.nbytes)
        command_enqueued()
    elif self.size:
        kernel = pointwise.fill_kernel(self.dtype)
        if kernel is not None:
            # A kernel, not clEnqueueFillBuffer: less host time, and a recording keeps it.
            kernel([], [self], [np.array(value, dtype=self.dtype)[()]])
            return self
        pattern = np.array([value], dtype=self.dtype)
        cl.enqueue_fill_buffer(self.ctx.queue, self.buffer, pattern, self.offset, self.nbytes)
        command_enqueued()
    return self


def sum_(self, dim=None, keepdim=False):
    """The sum of the elements, or along ``dim`` (``functional.sum``)."""
    return reduce.sum(self, dim, keepdim)


def mean(self, dim=None, keepdim=False):
    """The mean of the elements, or along ``dim`` (``functional.mean``)."""
    return reduce.mean(self, dim, keepdim)


def max_(self, dim=None, keepdim=False):
    """The largest element (a 0-d tensor); with ``dim``, (values, indices) along it, as torch
    returns them."""
    if dim is None:
        return reduce.amax(self)
    return reduce.amax(self, dim, keepdim), reduce.argmax(self, dim, keepdim)


def argmax(self, dim=None, keepdim=False):
    """The index of the largest element, or along ``dim`` (``functional.argmax``)."""
    return reduce.argmax(self, dim, keepdim)


def any_(self, dim=None, keepdim=False):
    return reduce.any_(self, dim, keepdim)


def all_(self, dim=None, keepdim=False):
    return reduce.all_(self, dim, keepdim)


def to(self, dtype):
    """This tensor converted to ``dtype`` (``self`` where it has it already); see
    ``dlprim_py.ops.masks.cast`` for the rules (torch's: nonzero -> True)."""
    return masks.cast(self, dtype)


def _cast_method(dtype, name):
    def method(self):
        return masks.cast(self, dtype)
    method.__name__ = name
    method.__doc__ = f"``self.to({dtype})``."
    return method


def _foreign(other):
    """True for an operand the operators leave to Python (``t == None`` is False, ``t < "a"`` a
    TypeError): neither a Tensor nor a number nor a numpy value (which gets a DTypeError
    saying how to make a tensor of it)."""
    return (not isinstance(other, Tensor) and masks.scalar_kind(other) is None
            and type(other).__module__ != "numpy")


def _comparison(op):
    def method(self, other):
        if _foreign(other):
            return NotImplemented
        return masks.compare(op, self, other)
    method.__name__ = f"__{op}__"
    return method


def _mask_operator(symbol, reflected):
    def method(self, other):
        if _foreign(other):
            return NotImplemented
        return masks.bitwise(symbol, other, self) if reflected else masks.bitwise(symbol, self, other)
    return method


def permute(self, *dims):
    """A copy with the dimensions reordered (``functional.permute``)."""
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = dims[0]
    return tensor_ops.permute(self, dims)


def transpose(self, dim0, dim1):
    """A copy with two dimensions swapped (``functional.transpose``)."""
    return tensor_ops.transpose(self, dim0, dim1)


def T(self):
    """The transpose of a matrix (a copy); for other ranks the dimensions reversed."""
    if self.ndim < 2:
        return self
    return self.permute(tuple(reversed(range(self.ndim))))


def matmul(self, other):
    """``self @ other`` for two matrices: ``dp.gemm``, or ``linear`` on the transposed right
    operand where gradients are recorded."""
    if not isinstance(other, Tensor):
        return NotImplemented
    if self.ndim != 2 or other.ndim != 2:
        raise UnsupportedError(f"@ multiplies two matrices, got {self.shape} @ {other.shape}; "
                               f"use dlprim_py.gemm_batched for batches")
    if autograd.needs_grad(self, other):
        if self.dtype in FLOAT16_TYPES and other.dtype == self.dtype:
            return linear.matmul16(self, other)
        return linear.linear(self, tensor_ops.transpose(other, 0, 1))
    return gemm(self, other)


def getitem(self, index):
    """Basic indexing, as numpy's and torch's: ints (negative from the end), slices with step 1
    and one ``...``. A selection that is one contiguous run of memory (single indices, then
    one range, then whole dimensions: ``t[0]``, ``t[2:5]``, ``t[1, :3]``) is a view sharing this
    tensor's buffer; any other (``t[:, 1:3]``, ``t[..., -1]``) is a copy, through ``narrow``.
    Gradients flow back either way. Steps other than 1, None (new axes) and advanced indexing
    (lists, arrays, tensors, masks) raise UnsupportedError."""
    items = index if isinstance(index, tuple) else (index,)
    ellipses = sum(1 for i in items if i is Ellipsis)
    if ellipses > 1:
        raise ShapeError("an index can hold one ellipsis (...) at most")
    for i in items:
        if i is None:
            raise UnsupportedError("indexing with None (a new axis) is not supported; use "
                                   "reshape")
        if i is Ellipsis or isinstance(i, slice) or (
                isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))):
            continue
        raise UnsupportedError(f"advanced indexing (by {type(i).__name__}) is not supported: "
                               f"index with ints, slices of step 1 and ...")
    given = len(items) - ellipses
    if given > self.ndim:
        raise ShapeError(f"too many indices ({given}) for a tensor of {self.ndim} dimensions")
    if ellipses:
        k = items.index(Ellipsis)
        items = items[:k] + (slice(None),) * (self.ndim - given) + items[k + 1:]
    else:
        items = items + (slice(None),) * (self.ndim - given)
    spec = []   # per dimension: (start, length, kept in the result)
    for dim, (i, size) in enumerate(zip(items, self.shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step != 1:
                raise UnsupportedError(f"slices with a step ({step}) are not supported")
            spec.append((start, max(0, stop - start), True))
        else:
            j = int(i) + (size if i < 0 else 0)
            if not 0 <= j < size:
                raise ShapeError(f"index {int(i)} is out of range for dimension {dim} of size "
                                 f"{size}")
            spec.append((j, 1, False))
    shape = tuple(length for _, length, kept in spec if kept)
    partial = [d for d, (start, length, kept) in enumerate(spec)
               if not kept or length != self.shape[d]]
    if not partial:
        return self.reshape(shape)
    last = partial[-1]
    if all(not spec[d][2] or self.shape[d] == 1 for d in range(last)):
        return _view(self, spec, shape)
    x = self
    for dim, (start, length, _) in enumerate(spec):
        if length != self.shape[dim]:
            x = tensor_ops.narrow(x, dim, start, length)
    return x.reshape(shape)


def _view(self, spec, shape):
    """The contiguous selection ``spec`` of ``self`` as a view, its gradient written into the
    same run of a zero tensor shaped like ``self``."""
    strides = pointwise.broadcast_strides(self.shape, self.shape)   # 0 where a size is 1
    first = sum(start * stride for (start, _, _), stride in zip(spec, strides))
    offset = first * self.dtype.itemsize
    out = _checked(self.ctx, self.buffer, shape, self.dtype, self.offset + offset)
    if not autograd.needs_grad(self):
        return out
    ctx, source_shape, dtype = self.ctx, self.shape, self.dtype

    def backward(g):
        grad = Tensor.zeros(ctx, source_shape, dtype)
        if g.size:
            _checked(ctx, grad.buffer, shape, dtype, grad.offset + offset).copy_(g)
        return (grad,)

    return autograd.record(out, (self,), backward, "index")


def _rsub(self, other):
    return arithmetic.sub(other, self)


def _rtruediv(self, other):
    return arithmetic.div(other, self)


def _neg(self):
    return arithmetic.mul(self, -1.0)


def _where_method(self, condition, other):
    """``self`` where ``condition`` is True, else ``other`` (torch's ``Tensor.where``)."""
    return indexing.where(condition, self, other)


def _method(function, name):
    """``function(self, ...)`` as the method ``name`` (torch's Tensor method of that name)."""
    def method(self, *args, **kwargs):
        return function(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"``dlprim_py.functional.{function.__name__}(self, ...)``."
    return method


# The indexing, selection, scan and sort methods: torch's Tensor methods of the same names.
_FUNCTION_METHODS = {
    "gather": indexing.gather, "scatter": indexing.scatter,
    "scatter_add": indexing.scatter_add, "index_select": indexing.index_select,
    "index_add": indexing.index_add, "masked_fill": indexing.masked_fill,
    "isnan": indexing.isnan, "isinf": indexing.isinf, "isposinf": indexing.isposinf,
    "isneginf": indexing.isneginf, "isfinite": indexing.isfinite,
    "count_nonzero": indexing.count_nonzero, "tril": indexing.tril, "triu": indexing.triu,
    "cumsum": scan.cumsum, "sort": scan.sort, "topk": scan.topk,
}


def install():
    """Set the methods on ``Tensor`` (once, at package import)."""
    for name, function in _FUNCTION_METHODS.items():
        setattr(Tensor, name, _method(function, name))
    Tensor.where = _where_method
    Tensor.arange = classmethod(lambda cls, ctx, *args, **kwargs:
                                indexing.arange(*args, ctx=ctx, **kwargs))
    Tensor.arange.__func__.__doc__ = ("``Tensor.arange(ctx, start, end, step, dtype=...)``: "
                                      "``dlprim_py.arange`` on ``ctx``.")
    Tensor.linspace = classmethod(lambda cls, ctx, *args, **kwargs:
                                  indexing.linspace(*args, ctx=ctx, **kwargs))
    Tensor.linspace.__func__.__doc__ = ("``Tensor.linspace(ctx, start, end, steps, "
                                        "dtype=...)``: ``dlprim_py.linspace`` on ``ctx``.")
    for name, method in (("fill_", fill_), ("sum", sum_), ("mean", mean), ("max", max_),
                         ("argmax", argmax), ("permute", permute), ("transpose", transpose),
                         ("__matmul__", matmul), ("__getitem__", getitem),
                         ("__add__", arithmetic.add), ("__radd__", arithmetic.add),
                         ("__sub__", arithmetic.sub), ("__rsub__", _rsub),
                         ("__mul__", arithmetic.mul), ("__rmul__", arithmetic.mul),
                         ("__truediv__", arithmetic.div), ("__rtruediv__", _rtruediv),
                         ("__neg__", _neg), ("any", any_), ("all", all_), ("to", to),
                         ("__invert__", masks.invert)):
        setattr(Tensor, name, method)
    for op in masks.COMPARISONS:
        setattr(Tensor, f"__{op}__", _comparison(op))
    for symbol, name in (("&", "and"), ("|", "or"), ("^", "xor")):
        setattr(Tensor, f"__{name}__", _mask_operator(symbol, False))
        setattr(Tensor, f"__r{name}__", _mask_operator(symbol, True))
    for dtype, name in ((float32, "float"), (float16, "half"), (int32, "int"), (int64, "long"),
                        (bool_, "bool"), (bfloat16, "bfloat16")):
        setattr(Tensor, name, _cast_method(dtype, name))
    Tensor.T = property(T)


install()
