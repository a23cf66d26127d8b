"""DLPRIM_CHECK_NUMERICS=1 (after MIOpen's MIOPEN_CHECK_NUMERICS): every ``dlprim_py.functional``
call checks its floating-point tensors after it ran and raises NumericsError at the first call
that produced a NaN or an infinity from finite inputs, naming the operator and where.

A debugging mode: each call then waits for the device and reads its tensors back. The switch
is read with the others (at the first call, and on ``dlprim_py.config.reload()``, which installs
or removes the checks on the module's functions: a name imported from it before keeps what it
was).
"""
import functools

import numpy as np

from .errors import NumericsError

def _tensors(values):
    from .tensor import Tensor
    for value in values:
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from _tensors(value)


def _first_nonfinite(tensors):
    """(index, tensor, flat position, value) of the first floating-point tensor holding a NaN
    or an infinity, or None."""
    for index, t in enumerate(tensors):
        if t.dtype.kind != "f" or not t.size:
            continue
        values = t.numpy().ravel()
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            return index, t, int(bad[0]), values[bad[0]]
    return None


def checked(name, function):
    """``function`` with the numerics check of operator ``name`` after every call."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        found = _first_nonfinite(list(_tensors([result])))
        if found is not None and _first_nonfinite(list(_tensors([args, list(kwargs.values())]))) is None:
            index, t, position, value = found
            raise NumericsError(f"{name} produced {value} from finite inputs (output {index}, "
                                f"shape {t.shape}, flat index {position}); "
                                f"DLPRIM_CHECK_NUMERICS is on")
        return result
    call.__wrapped_numerics__ = True
    return call


def install(namespace, names, enabled):
    """Wrap (``enabled``) or unwrap the functions ``names`` of module ``namespace`` (a dict)."""
    for name in names:
        current = namespace[name]
        # functools.wraps keeps the plain function as __wrapped__.
        original = current.__wrapped__ if getattr(current, "__wrapped_numerics__", False) else current
        namespace[name] = checked(name, original) if enabled else original
