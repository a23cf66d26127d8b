"""The Tensor methods that run operators: ``fill_``, arithmetic, reductions, ``permute`` /
``transpose`` / ``T`` and ``@``.

They are defined here, above the operator families they call, and set on ``Tensor`` when the
package loads (``dlprim_py/__init__.py`` imports this module), so that ``tensor.py`` imports no
operator module and the layers import one way only. The arithmetic operators are the pointwise
functions themselves: ``a + b`` costs one call, with no lookup in between.
"""
import numpy as np
import pyopencl as cl

from . import autograd
from .errors import DTypeError, UnsupportedError
from .launch import command_enqueued
from .ops import arithmetic, linear, pointwise, reduce, tensor_ops
from .ops.gemm import gemm
from .tensor import Tensor


def fill_(self, value):
    """Set every element to ``value`` (a number) in place."""
    if not isinstance(value, (int, float, np.number)):
        raise DTypeError(f"fill_ needs a number, got {value!r}")
    if self.size:
        kernel = pointwise.fill_kernel(self.dtype)
        if kernel is not None:
            # A kernel, not clEnqueueFillBuffer: less host time, and a recording keeps it.
            kernel([], [self], [np.array(value, dtype=self.dtype)[()]])
            return self
        pattern = np.array([value], dtype=self.dtype)
        cl.enqueue_fill_buffer(self.ctx.queue, self.buffer, pattern, self.offset, self.nbytes)
        command_enqueued()
    return self


def sum(self, dim=None, keepdim=False):  # noqa: A001  (torch's method name)
    return reduce.sum(self, dim, keepdim)


def mean(self, dim=None, keepdim=False):
    return reduce.mean(self, dim, keepdim)


def max(self, dim=None, keepdim=False):  # noqa: A001
    """The largest element (a 0-d tensor); with ``dim``, (values, indices) along it, as torch
    returns them."""
    if dim is None:
        return reduce.amax(self)
    return reduce.amax(self, dim, keepdim), reduce.argmax(self, dim, keepdim)


def argmax(self, dim=None, keepdim=False):
    return reduce.argmax(self, dim, keepdim)


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
        return linear.linear(self, tensor_ops.transpose(other, 0, 1))
    return gemm(self, other)


def _rsub(self, other):
    return arithmetic.sub(other, self)


def _rtruediv(self, other):
    return arithmetic.div(other, self)


def _neg(self):
    return arithmetic.mul(self, -1.0)


def install():
    """Set the methods on ``Tensor`` (once, at package import)."""
    for name, method in (("fill_", fill_), ("sum", sum), ("mean", mean), ("max", max),
                         ("argmax", argmax), ("permute", permute), ("transpose", transpose),
                         ("__matmul__", matmul),
                         ("__add__", arithmetic.add), ("__radd__", arithmetic.add),
                         ("__sub__", arithmetic.sub), ("__rsub__", _rsub),
                         ("__mul__", arithmetic.mul), ("__rmul__", arithmetic.mul),
                         ("__truediv__", arithmetic.div), ("__rtruediv__", _rtruediv),
                         ("__neg__", _neg)):
        setattr(Tensor, name, method)
    Tensor.T = property(T)


install()
