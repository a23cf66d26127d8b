"""The element types the library knows, with their OpenCL C names.

float32 is the type every operator supports; float16 storage, int32 and int64 (class targets,
indices) are designed in so that operators add them without changing their interfaces. bool
(masks: what comparisons return) is numpy's ``np.bool_``, one byte per element holding 0 or 1,
``uchar`` in OpenCL C (whose ``bool`` cannot be stored in a buffer).

bfloat16 (the top 16 bits of a float32: 8 exponent bits, 7 mantissa bits) has no numpy type;
the library's ``bfloat16`` is a numpy dtype of its own, a structured dtype of one unsigned
16-bit field named "bfloat16" (its bit pattern), distinct from every numpy number type. It is
storage: casts (``Tensor.to``), GEMM, linear layers and the pointwise, activation, reduction,
softmax, normalization and pooling operators take it (and float16) without cl_khr_fp16,
converting to float32 in the kernels; an operator that does not take it raises DTypeError
(``cl_name`` refuses it, so no generic kernel reads its bits as integers). Host
conversions: ``to_bfloat16_bits`` (float32 -> bfloat16, rounded to nearest even, NaN kept a
NaN) and ``bfloat16_to_float32`` (exact); ml_dtypes' bfloat16 arrays are read where that
package is installed (it is not needed).
"""
import numpy as np

from .errors import DTypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)
bfloat16 = np.dtype([("bfloat16", "<u2")])

_CL_NAMES = {float32: "float", float16: "half", int32: "int", int64: "long", bool_: "uchar"}
SUPPORTED = tuple(_CL_NAMES) + (bfloat16,)
# The 16-bit floating point storage types GEMM and casts take without cl_khr_fp16.
FLOAT16_TYPES = (float16, bfloat16)
# What ``as_dtype`` is most often given (the dtypes themselves and their numpy types), mapped
# without a call to np.dtype: it runs for every tensor an operator makes. bfloat16's numpy type
# is np.void, which names no dtype of the library.
_KNOWN = {**{d: d for d in SUPPORTED}, **{d.type: d for d in _CL_NAMES}, "bfloat16": bfloat16}


def as_dtype(dtype):
    """A supported numpy dtype from anything numpy accepts as a dtype; DTypeError otherwise."""
    dt = _KNOWN.get(dtype) if dtype.__hash__ is not None else None
    if dt is not None:
        return dt
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"not a dtype: {dtype!r}") from e
    if dt == bfloat16 or (dt.name == "bfloat16" and dt.itemsize == 2):
        return bfloat16     # the library's, or ml_dtypes' (the same bits)
    if dt not in _CL_NAMES:
        raise DTypeError(f"dtype {dt} is not supported; expected one of "
                         f"{', '.join(name(d) for d in SUPPORTED)}")
    return dt


def cl_name(dtype):
    """The OpenCL C type name of a supported dtype: float32 -> "float", bool -> "uchar".
    DTypeError for bfloat16, which OpenCL C has no type for: the kernels that take it read its
    bits themselves, and a generic kernel must not treat them as integers."""
    dt = as_dtype(dtype)
    if dt is bfloat16:
        raise DTypeError(unsupported_16bit("this operator", dt))
    return _CL_NAMES[dt]


def name(dtype):
    """A dtype's name for messages: "float32", "bfloat16"."""
    dt = as_dtype(dtype)
    return "bfloat16" if dt is bfloat16 else str(dt)


def is_float16_type(dtype):
    """Whether ``dtype`` is a 16-bit floating point storage type (float16 or bfloat16)."""
    return dtype is bfloat16 or dtype == float16


def unsupported_16bit(what, dtype):
    """The message of the DTypeError an operator that does not take 16-bit inputs raises."""
    return (f"{what} does not take {name(dtype)} tensors yet; 16-bit tensors are storage for "
            f"casts (Tensor.to, .float()), GEMM (dp.gemm, matmul), linear layers, convolution and "
            f"the pointwise, activation, reduction, softmax, normalization and pooling operators; "
            f"convert with .float() first")


def to_bfloat16_bits(values):
    """``values`` (any real numpy array) as bfloat16: float32 rounded to nearest even on the 16
    dropped bits (overflow to infinity as IEEE rounding does), NaN kept a quiet NaN of the same
    sign. Returns an array of dtype ``bfloat16``."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    u = f.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    bits = np.where(np.isnan(f), (u >> np.uint32(16)) | np.uint32(0x40), rounded)
    # ascontiguousarray makes a 0-d array 1-d: the input's shape back.
    return bits.astype(np.uint16).view(bfloat16).reshape(np.shape(values))


def bfloat16_to_float32(values):
    """A bfloat16 array (the library's dtype, ml_dtypes', or its uint16 bits) as float32,
    exactly."""
    bits = np.ascontiguousarray(values).view(np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(np.shape(values))


def check_dtype(tensor, allowed, what="tensor"):
    """Raise DTypeError unless ``tensor.dtype`` is one of ``allowed``."""
    allowed = tuple(as_dtype(a) for a in allowed)
    if tensor.dtype not in allowed:
        if is_float16_type(tensor.dtype) and float32 in allowed:
            raise DTypeError(unsupported_16bit(what, tensor.dtype))
        raise DTypeError(f"{what} must have dtype {' or '.join(name(a) for a in allowed)}, "
                         f"got {name(tensor.dtype)}")
