"""One exception hierarchy for the whole library.

Every public entry validates its inputs and raises one of these with a message that says what
was expected and what came, so that callers can catch ``DlprimError`` alone.
"""


class DlprimError(Exception):
    """Base class of every error the library raises on purpose."""


class ShapeError(DlprimError, ValueError):
    """A shape, size, offset or index does not fit what the operation needs."""


class DTypeError(DlprimError, TypeError):
    """A tensor has a dtype the operation does not accept."""


class DeviceError(DlprimError, RuntimeError):
    """No such OpenCL device, or tensors that live in different contexts."""


class DeviceMemoryError(DeviceError, MemoryError):
    """The device cannot hold a tensor: larger than its largest allocation, or out of memory."""


class NumericsError(DlprimError, ArithmeticError):
    """DLPRIM_CHECK_NUMERICS found an operator that made a NaN or an infinity from finite
    inputs."""


class GraphError(DlprimError, RuntimeError):
    """A backward through part of an autograd graph that an earlier backward already ran and
    freed (pass retain_graph=True to the first to run it again)."""


class UnsupportedError(DlprimError, NotImplementedError):
    """A valid request that this library (or this device, or this algorithm) does not do."""


class ModelFileError(DlprimError, ValueError):
    """A model file (ONNX) that cannot be read: missing, truncated, damaged or not valid; the
    message names the file."""


class KernelBuildError(DlprimError, RuntimeError):
    """The OpenCL compiler rejected a rendered kernel.

    The message holds the compiler log and the rendered source lines around the first error.
    """

    def __init__(self, message, log="", source=""):
        super().__init__(message)
        self.log = log
        self.source = source


class CacheWarning(UserWarning):
    """A file or folder of the on-disk caches (program binaries, find-db, tuning database) could
    not be used: damaged, written for another key, or not writable. The library rebuilds or
    carries on without it; each path is reported once per process."""


def check(condition, error_class, message):
    """Raise ``error_class(message)`` unless ``condition`` holds."""
    if not condition:
        raise error_class(message)


def not_a_tensor(what, value):
    """The DTypeError for ``value`` given where a Tensor belongs (``what`` names the argument,
    with its operator): a numpy array gets the call that makes a tensor of it."""
    hint = ""
    if type(value).__module__ == "numpy":
        hint = ("; make one with dp.Tensor.from_numpy(array) (the default context) or "
                "dp.Tensor.from_numpy(ctx, array)")
    return DTypeError(f"{what} must be a dlprim_py.Tensor, got {type(value).__name__}{hint}")
