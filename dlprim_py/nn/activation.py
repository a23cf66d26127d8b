"""Activation modules (torch.nn's): ``ReLU``, ``ReLU6``, ``LeakyReLU``, ``GELU``, ``SiLU``,
``Sigmoid``, ``Tanh``, ``Hardswish``, ``Hardsigmoid`` and ``Softmax``, each over its
``functional`` function. No parameters."""
from .. import functional as F
from ..errors import ShapeError
from .module import Module, check_ctx


class _Inplace(Module):
    _function = None

    def __init__(self, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.inplace = inplace

    def forward(self, input):
        return type(self)._function(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU(_Inplace):
    _function = staticmethod(F.relu)


class ReLU6(_Inplace):
    _function = staticmethod(F.relu6)


class SiLU(_Inplace):
    _function = staticmethod(F.silu)


class Hardswish(_Inplace):
    _function = staticmethod(F.hardswish)


class Hardsigmoid(_Inplace):
    _function = staticmethod(F.hardsigmoid)


class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input):
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class GELU(Module):
    """``approximate``: "none" (erf) or "tanh"."""

    def __init__(self, approximate="none", *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        if approximate not in ("none", "tanh"):
            raise ShapeError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Sigmoid(Module):
    def __init__(self, *, ctx=None):
        super().__init__()
        check_ctx(ctx)

    def forward(self, input):
        return F.sigmoid(input)


class Tanh(Module):
    def __init__(self, *, ctx=None):
        super().__init__()
        check_ctx(ctx)

    def forward(self, input):
        return F.tanh(input)


class Softmax(Module):
    """Softmax over ``dim``; ``dim=None`` takes torch's legacy choice (0 for 0-, 1- and 3-d
    inputs, else 1)."""

    def __init__(self, dim=None, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            dim = 0 if getattr(input, "ndim", 2) in (0, 1, 3) else 1
        return F.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"
