"""The element types the library knows, with their OpenCL C names.

float32 is the type every operator supports; float16 storage, int32 and int64 (class targets,
indices) are designed in so that operators add them without changing their interfaces. bool
(masks: what comparisons return) is numpy's ``np.bool_``, one byte per element holding 0 or 1,
``uchar`` in OpenCL C (whose ``bool`` cannot be stored in a buffer).
"""
import numpy as np

from .errors import DTypeError

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

_CL_NAMES = {float32: "float", float16: "half", int32: "int", int64: "long", bool_: "uchar"}
SUPPORTED = tuple(_CL_NAMES)
# What ``as_dtype`` is most often given (the dtypes themselves and their numpy types), mapped
# without a call to np.dtype: it runs for every tensor an operator makes.
_KNOWN = {**{d: d for d in _CL_NAMES}, **{d.type: d for d in _CL_NAMES}}


def as_dtype(dtype):
    """A supported numpy dtype from anything numpy accepts as a dtype; DTypeError otherwise."""
    dt = _KNOWN.get(dtype) if dtype.__hash__ is not None else None
    if dt is not None:
        return dt
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(f"not a dtype: {dtype!r}") from e
    if dt not in _CL_NAMES:
        raise DTypeError(f"dtype {dt} is not supported; expected one of "
                         f"{', '.join(str(d) for d in SUPPORTED)}")
    return dt


def cl_name(dtype):
    """The OpenCL C type name of a supported dtype: float32 -> "float", bool -> "uchar"."""
    return _CL_NAMES[as_dtype(dtype)]


def check_dtype(tensor, allowed, what="tensor"):
    """Raise DTypeError unless ``tensor.dtype`` is one of ``allowed``."""
    allowed = tuple(np.dtype(a) for a in allowed)
    if tensor.dtype not in allowed:
        raise DTypeError(f"{what} must have dtype {' or '.join(str(a) for a in allowed)}, "
                         f"got {tensor.dtype}")
