"""``Tensor``: an OpenCL buffer, a byte offset into it, a shape and a dtype.

Tensors are dense and C-contiguous. Views (``reshape``) share the buffer. A tensor can wrap
memory it does not own (``from_buffer``, ``from_array``) without copying, which is how a host
application hands its own ``cl.Buffer`` (at any offset) to the library.
"""
import math
from threading import get_ident

import numpy as np
import pyopencl as cl
import pyopencl.array as cl_array

from . import autograd
from .context import Context, default_context
from .dtypes import as_dtype, bfloat16, bfloat16_to_float32, float16, float32, to_bfloat16_bits
from .errors import DeviceError, DeviceMemoryError, DTypeError, ShapeError
from .launch import command_enqueued


def normalise_shape(shape):
    """A tuple of non-negative ints from an int or a sequence of ints."""
    if type(shape) is tuple:
        # The common case, on every tensor an operator creates: already a tuple of ints.
        for s in shape:
            if type(s) is not int or s < 0:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ShapeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    for s in shape:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise ShapeError(f"shape entries must be ints, got {shape!r}")
        if s < 0:
            raise ShapeError(f"shape entries must be >= 0, got {shape!r}")
    return tuple(int(s) for s in shape)


def _check_context(ctx):
    if ctx is None:
        return default_context()
    if not isinstance(ctx, Context):
        raise DeviceError(f"expected a dlprim_py.Context, got {type(ctx).__name__}")
    return ctx


# from_numpy's array when only the array is given (None is an array-like of its own).
_NO_ARRAY = object()


class TensorDesc:
    """The shape and dtype of a tensor, without memory (the fusion API describes with it)."""

    def __init__(self, shape, dtype=np.float32):
        self.shape = normalise_shape(shape)
        self.dtype = as_dtype(dtype)

    @property
    def size(self):
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self.shape)

    def __eq__(self, other):
        return isinstance(other, TensorDesc) and (self.shape, self.dtype) == (other.shape, other.dtype)

    def __hash__(self):
        return hash((self.shape, self.dtype))

    def __repr__(self):
        return f"TensorDesc({self.shape}, {self.dtype})"


class Tensor:
    """A dense C-contiguous tensor in an OpenCL buffer.

    ``buffer``: the ``cl.Buffer`` (or pooled buffer) holding the data; ``offset``: byte offset of
    element 0 in it; ``shape``, ``dtype``. ``requires_grad``, ``grad`` and ``grad_fn`` belong to
    the autograd tape.
    """

    # Fixed fields: every operator call makes a tensor, and one without a __dict__ is made and
    # freed faster (and is not tracked by the cycle collector for its fields alone).
    # ``handle``: the buffer's ``int_ptr``, read once here (the property costs a call into
    # PyOpenCL) for the plans that compare it on every call.
    __slots__ = ("ctx", "buffer", "handle", "shape", "dtype", "offset", "grad", "grad_fn",
                 "requires_grad", "__weakref__")

    def __init__(self, ctx, buffer, shape, dtype=np.float32, offset=0, requires_grad=False):
        """A tensor over ``buffer`` (validated: a buffer of ``ctx``'s OpenCL context that holds
        ``offset`` + the tensor's bytes; operators make their outputs without these checks)."""
        if not isinstance(ctx, Context):
            raise DeviceError(f"expected a dlprim_py.Context, got {type(ctx).__name__}")
        if not isinstance(buffer, cl.MemoryObjectHolder):
            raise DeviceError(f"expected a pyopencl Buffer, got {type(buffer).__name__}")
        self.ctx = ctx
        self.buffer = buffer
        self.handle = buffer.int_ptr
        self.shape = normalise_shape(shape)
        self.dtype = as_dtype(dtype)
        if (not isinstance(offset, (int, np.integer)) or isinstance(offset, bool) or offset < 0
                or offset % self.dtype.itemsize):
            raise ShapeError(f"byte offset must be a non-negative multiple of {self.dtype.itemsize} "
                             f"for {self.dtype}, got {offset!r}")
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        if offset + nbytes > buffer.size:
            raise ShapeError(f"buffer of {buffer.size} bytes is too small for a {self.shape} "
                             f"{self.dtype} tensor at byte offset {offset} (needs {offset + nbytes})")
        self.offset = int(offset)
        self.grad = None
        self.grad_fn = None
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def empty(cls, ctx, shape, dtype=np.float32, requires_grad=False):
        """An uninitialised tensor (its memory comes from the context's pool)."""
        if ctx.__class__ is not Context:
            ctx = _check_context(ctx)
        shape = normalise_shape(shape)
        if (dtype is _FLOAT32_TYPE or dtype is _FLOAT32) and not requires_grad:
            # What operators ask for on every call: float32, no gradient.
            return _checked(ctx, allocate(ctx, max(math.prod(shape) * 4, 4)), shape, _FLOAT32, 0)
        dtype = as_dtype(dtype)
        nbytes = max(math.prod(shape) * dtype.itemsize, dtype.itemsize)
        if requires_grad:
            return cls(ctx, allocate(ctx, nbytes), shape, dtype, requires_grad=True)
        return _checked(ctx, allocate(ctx, nbytes), shape, dtype, 0)

    @classmethod
    def zeros(cls, ctx, shape, dtype=np.float32, requires_grad=False):
        """A tensor of zeros."""
        return cls.full(ctx, shape, 0, dtype, requires_grad=requires_grad)

    @classmethod
    def full(cls, ctx, shape, value, dtype=np.float32, requires_grad=False):
        """A tensor with every element ``value``."""
        t = cls.empty(ctx, shape, dtype, requires_grad=requires_grad)
        t.fill_(value)
        return t

    @classmethod
    def from_numpy(cls, ctx, array=_NO_ARRAY, requires_grad=False, dtype=None):
        """A copy of the numpy array ``array`` on the device of ``ctx`` (C order), of the
        array's dtype or of ``dtype``. ``Tensor.from_numpy(array)`` takes the thread's default
        context (``dlprim_py.default_context()``).

        ``dtype`` (a floating point dtype: float32, float16, ``dlprim_py.bfloat16``) converts
        a real array on the host first: to float16 as numpy rounds (nearest even), to bfloat16
        from float32 rounded to nearest even (``dtypes.to_bfloat16_bits``; a float64 array
        is first rounded to float32). An array of ``dlprim_py.bfloat16`` (or ml_dtypes')
        bfloat16 is taken as it is."""
        if array is _NO_ARRAY:
            ctx, array = default_context(), ctx
        ctx = _check_context(ctx)
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        if dtype is not None:
            dtype = as_dtype(dtype)
            if dtype not in (float32, float16, bfloat16):
                raise DTypeError(f"from_numpy converts to float32, float16 or bfloat16 only, "
                                 f"got dtype={dtype}; convert the array with numpy")
            if array.dtype.kind == "V" and as_dtype(array.dtype) is bfloat16:
                array = bfloat16_to_float32(array)
            if dtype is bfloat16:
                array = to_bfloat16_bits(array.astype(np.float32, copy=False))
            else:
                array = array.astype(dtype, copy=False)
        if array.dtype == np.float64:
            raise DTypeError("float64 arrays are not supported; convert with .astype(np.float32)")
        dtype = as_dtype(array.dtype)
        if dtype is bfloat16 and array.dtype != bfloat16:    # ml_dtypes' bfloat16: same bits
            array = np.ascontiguousarray(array).view(np.uint16).view(bfloat16)
        array = np.asarray(array, dtype=dtype, order="C")
        t = cls.empty(ctx, array.shape, dtype, requires_grad=requires_grad)
        if array.size:
            cl.enqueue_copy(ctx.queue, t.buffer, array, dst_offset=t.offset, is_blocking=True)
        return t

    @classmethod
    def from_buffer(cls, ctx, buffer, shape, dtype=np.float32, offset=0, requires_grad=False):
        """Wrap an existing ``cl.Buffer`` without copying. ``offset`` is in bytes.

        Raises ShapeError if the buffer is too small for ``offset`` + the tensor's bytes.
        """
        ctx = _check_context(ctx)
        if not isinstance(buffer, cl.MemoryObjectHolder):
            raise DeviceError(f"expected a pyopencl Buffer, got {type(buffer).__name__}")
        if buffer.context != ctx.cl_context:
            raise DeviceError("the buffer belongs to another OpenCL context than the Context given")
        # The constructor checks the offset and that the buffer holds the tensor.
        return cls(ctx, buffer, shape, dtype, offset=offset, requires_grad=requires_grad)

    @classmethod
    def from_array(cls, ctx, array, requires_grad=False):
        """Wrap a contiguous ``pyopencl.array.Array`` without copying."""
        ctx = _check_context(ctx)
        if not isinstance(array, cl_array.Array):
            raise DeviceError(f"expected a pyopencl.array.Array, got {type(array).__name__}")
        if not array.flags.c_contiguous:
            raise ShapeError("only C-contiguous pyopencl arrays can be wrapped without a copy")
        if array.context != ctx.cl_context:
            raise DeviceError("the array belongs to another OpenCL context than the Context given")
        return cls.from_buffer(ctx, array.base_data, array.shape, array.dtype, offset=array.offset,
                               requires_grad=requires_grad)

    def to_array(self):
        """A ``pyopencl.array.Array`` over the same memory (no copy)."""
        return cl_array.Array(self.ctx.queue, self.shape, self.dtype, data=self.buffer,
                              offset=self.offset)

    # ---- facts --------------------------------------------------------------------------

    @property
    def size(self):
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes of the data."""
        return self.size * self.dtype.itemsize

    @property
    def offset_elements(self):
        """Offset of element 0 in elements of ``dtype`` (what kernels take)."""
        return self.offset // self.dtype.itemsize

    @property
    def desc(self):
        """The tensor's shape and dtype as a ``TensorDesc``."""
        return TensorDesc(self.shape, self.dtype)

    @property
    def is_leaf(self):
        """Whether the tensor was made by the caller rather than by a recorded operator."""
        return self.grad_fn is None

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    # Identity, as torch's: == and != compare elementwise (dlprim_py/tensor_methods.py sets
    # them), and tensors still serve as dict keys and set members by identity.
    __hash__ = object.__hash__

    def __bool__(self):
        """The truth of a one-element tensor's value (waits for queued work), as torch's; any
        other size is ambiguous and raises ShapeError (use ``.any()`` or ``.all()``)."""
        if self.size != 1:
            raise ShapeError(f"the truth value of a tensor of {self.size} elements (shape "
                             f"{self.shape}) is ambiguous; use .any() or .all()")
        return bool(self.item())

    def __repr__(self):
        """The values as numpy prints them (small tensors whole, large ones abbreviated), with
        the shape and dtype, as torch's. Reading them waits for the queue, but leaves a
        deferred check's error (a bad class target) to the next synchronizing call."""
        grad = ", requires_grad=True" if self.requires_grad else ""
        try:
            host = np.empty(self.shape, self.dtype)
            if host.size:
                cl.enqueue_copy(self.ctx.queue, host, self.buffer, src_offset=self.offset,
                                is_blocking=True)
            if self.dtype is bfloat16:
                host = bfloat16_to_float32(host)
            values = np.array2string(host, separator=", ", threshold=200, edgeitems=3,
                                     prefix="Tensor(")
        except (cl.Error, ValueError, MemoryError) as error:   # a repr must not raise
            values = f"<values unreadable: {error}>"
        dtype = "bfloat16" if self.dtype is bfloat16 else self.dtype
        return f"Tensor({values}, shape={self.shape}, dtype={dtype}{grad})"

    # ---- torch's conveniences ------------------------------------------------------------

    @property
    def device(self):
        """The tensor's Context (what torch's ``.device`` names, where it lives)."""
        return self.ctx

    def item(self):
        """The value of a one-element tensor as a Python number (waits for queued work)."""
        if self.size != 1:
            raise ShapeError(f"item() needs a one-element tensor, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self):
        """The values as nested Python lists (a number for a 0-d tensor)."""
        return self.numpy().tolist()

    def to_numpy(self):
        """The same as ``numpy()``."""
        return self.numpy()

    # numpy's operators defer to the tensor's own (a clear error for an array operand) instead
    # of converting it through __array__.
    __array_ufunc__ = None

    def __array__(self, dtype=None, copy=None):
        # np.asarray(t): the values, not an object array holding the tensor.
        values = self.numpy()
        return values if dtype is None else values.astype(dtype)

    def zero_(self):
        """Set every element to zero in place."""
        return self.fill_(0)

    # The methods that run operators (fill_, arithmetic, reductions, permute, @) are set on
    # the class by dlprim_py/tensor_methods.py, which stands above the operator families: this
    # module imports none of them.

    # ---- data movement ------------------------------------------------------------------

    def numpy(self):
        """A numpy copy of the data (waits for queued work, and raises what a deferred check
        of that work found, see ``Context.synchronize``). A bfloat16 tensor comes back as a
        float32 array (numpy has no bfloat16; the conversion is exact); ``bits()`` gives its
        bit patterns."""
        out = self.bits()
        return bfloat16_to_float32(out) if self.dtype is bfloat16 else out

    def bits(self):
        """A numpy copy of the data as stored: ``numpy()``, but a bfloat16 tensor's as an
        array of ``dlprim_py.bfloat16`` (its bit patterns; ``.view(np.uint16)`` reads them)."""
        out = np.empty(self.shape, self.dtype)
        if out.size:
            cl.enqueue_copy(self.ctx.queue, out, self.buffer, src_offset=self.offset, is_blocking=True)
        if self.ctx.deferred_checks:
            self.ctx.run_deferred_checks()
        return out

    def copy_(self, source):
        """Copy ``source`` (same shape and dtype; a Tensor of the same context, or a numpy
        array, copied from the host) into this tensor in place."""
        if isinstance(source, np.ndarray):
            if source.shape != self.shape or source.dtype != self.dtype:
                raise ShapeError(f"copy_ needs the same shape and dtype: {self.shape} "
                                 f"{self.dtype} <- array {source.shape} {source.dtype}")
            if self.size:
                cl.enqueue_copy(self.ctx.queue, self.buffer, np.ascontiguousarray(source),
                                dst_offset=self.offset, is_blocking=True)
                command_enqueued()
            return self
        if not isinstance(source, Tensor):
            raise DTypeError(f"copy_ expects a Tensor or a numpy array, got "
                             f"{type(source).__name__}")
        if source.shape != self.shape or source.dtype != self.dtype:
            raise ShapeError(f"copy_ needs the same shape and dtype: {self.shape} {self.dtype} "
                             f"<- {source.shape} {source.dtype}")
        if source.ctx.cl_context != self.ctx.cl_context:
            raise DeviceError("copy_ between tensors of different OpenCL contexts")
        if self.size:
            cl.enqueue_copy(self.ctx.queue, self.buffer, source.buffer, byte_count=self.nbytes,
                            src_offset=source.offset, dst_offset=self.offset)
            command_enqueued()
        return self

    def clone(self):
        """A new tensor with a copy of the data (not part of the autograd graph)."""
        return Tensor.empty(self.ctx, self.shape, self.dtype).copy_(self)

    def detach(self):
        """The same memory, cut off from the autograd graph."""
        return _checked(self.ctx, self.buffer, self.shape, self.dtype, self.offset)

    # ---- views --------------------------------------------------------------------------

    def reshape(self, *shape):
        """A view with another shape of the same size; one entry may be -1."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            try:
                shape = tuple(shape[0])
            except TypeError:
                raise ShapeError(f"reshape: shape must be ints or a sequence of ints, "
                                 f"got {shape[0]!r}") from None
        shape = list(shape)
        if shape.count(-1) > 1:
            raise ShapeError(f"only one dimension can be -1, got {tuple(shape)}")
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ShapeError(f"cannot reshape {self.shape} to {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        shape = normalise_shape(shape)
        if math.prod(shape) != self.size:
            raise ShapeError(f"cannot reshape {self.shape} ({self.size} elements) to {shape}")
        return self._view(shape)

    view = reshape

    def _view(self, shape):
        """A view with ``shape``, a normalised shape of this tensor's size (reshape's checks
        passed, or the caller made it from this tensor's dimensions)."""
        out = _checked(self.ctx, self.buffer, shape, self.dtype, self.offset)
        if self.requires_grad and autograd.grad_enabled():
            autograd.record(out, (self,), _reshape_back(self.shape), "reshape")
        return out

    # ---- autograd -----------------------------------------------------------------------

    def requires_grad_(self, flag=True):
        """Make this (floating-point) tensor a leaf that gathers a gradient in ``.grad``."""
        if flag and self.dtype.kind != "f" and self.dtype is not bfloat16:
            raise DTypeError(f"only floating point tensors can require gradients, got {self.dtype}")
        self.requires_grad = bool(flag)
        return self

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) * grad into ``.grad`` of every leaf that requires it.

        ``grad`` defaults to ones for a one-element tensor and is required otherwise. The graph's
        saved tensors are freed as it runs: a second backward through it raises GraphError
        unless this one is given ``retain_graph=True`` (torch's rule).
        """
        autograd.backward(self, grad, retain_graph)

    def zero_grad(self):
        """Drop the gathered gradient (``.grad`` becomes None)."""
        self.grad = None

def _reshape_back(shape):
    """The backward of a view: the gradient viewed with the source's ``shape``."""
    return lambda g: (g.reshape(shape),)


def _checked(ctx, buffer, shape, dtype, offset):
    """A Tensor of fields that have passed the constructor's checks already (a normalised shape,
    a supported dtype, a valid offset): every operator's output and view is made here, without
    running them again."""
    t = _new_tensor(Tensor)
    t.ctx, t.buffer, t.handle, t.shape, t.dtype, t.offset = (ctx, buffer, buffer.int_ptr, shape,
                                                             dtype, offset)
    t.grad = t.grad_fn = None
    t.requires_grad = False
    return t


def output(ctx, shape, nbytes):
    """An uninitialised float32 tensor of a normalised ``shape`` whose ``nbytes`` is known (an
    operator's output on a repeated call, the checks done when its plan was made)."""
    # _checked and allocate inlined (every repeated operator call makes its output here). No
    # test against the device's largest allocation: every caller's size is that of a tensor
    # that exists (an input, or a first call's output), or less.
    if ctx.thread != get_ident():
        ctx.check_thread()
    try:
        buffer = ctx.memory_pool.allocate(nbytes)
    except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as error:
        raise _allocation_error(ctx, nbytes, error) from None
    t = _new_tensor(Tensor)
    t.ctx, t.buffer, t.handle, t.shape, t.dtype, t.offset = (ctx, buffer, buffer.int_ptr, shape,
                                                             _FLOAT32, 0)
    t.grad = t.grad_fn = None
    t.requires_grad = False
    return t


def output_like(t):
    """An uninitialised tensor of ``t``'s shape and dtype in ``t``'s context (an operator's
    output; ``t``'s shape is normalised already)."""
    # As output: no test against the largest allocation, since t exists.
    ctx, shape, dtype = t.ctx, t.shape, t.dtype
    if ctx.thread != get_ident():
        ctx.check_thread()
    itemsize = dtype.itemsize
    nbytes = max(math.prod(shape) * itemsize, itemsize)
    try:
        buffer = ctx.memory_pool.allocate(nbytes)
    except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as error:
        raise _allocation_error(ctx, nbytes, error) from None
    out = _new_tensor(Tensor)
    out.ctx, out.buffer, out.handle, out.shape, out.dtype, out.offset = (
        ctx, buffer, buffer.int_ptr, shape, dtype, 0)
    out.grad = out.grad_fn = None
    out.requires_grad = False
    return out


_new_tensor = object.__new__


def allocate(ctx, nbytes):
    """A device buffer of at least ``nbytes`` bytes from the context's memory pool;
    DeviceMemoryError (naming the size and the device's limit) where the device cannot hold it."""
    if ctx.thread != get_ident():
        ctx.check_thread()
    if nbytes > ctx.info.max_alloc_size:
        raise DeviceMemoryError(f"a tensor of {nbytes} bytes exceeds {ctx.info.name}'s largest "
                                f"allocation ({ctx.info.max_alloc_size} bytes; "
                                f"{ctx.info.global_mem_size} bytes of global memory)")
    try:
        return ctx.memory_pool.allocate(nbytes)
    except (cl.MemoryError, cl.RuntimeError, cl.LogicError) as error:
        raise _allocation_error(ctx, nbytes, error) from None


def _allocation_error(ctx, nbytes, error):
    return DeviceMemoryError(f"could not allocate {nbytes} bytes on {ctx.info.name} "
                             f"({ctx.memory_allocated()} bytes in tensors, "
                             f"{ctx.memory_reserved()} held by the pool, "
                             f"{ctx.info.global_mem_size} of global memory): {error}")


_FLOAT32 = np.dtype(np.float32)
_FLOAT32_TYPE = np.float32
