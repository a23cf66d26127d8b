"""Activation modules (torch.nn's): ``ReLU``, ``ReLU6``, ``LeakyReLU``, ``GELU``, ``SiLU``,
``Sigmoid``, ``Tanh``, ``Hardswish``, ``Hardsigmoid``, ``Softmax``, ``Mish``, ``SELU``,
``CELU``, ``LogSigmoid``, ``Softsign``, ``Softshrink``, ``Hardshrink``, ``Tanhshrink``,
``Threshold``, ``RReLU`` (evaluation), ``GLU``, ``Softmin`` and ``PReLU``, each over its
``functional`` function. Only ``PReLU`` has a parameter."""
from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from .module import Module, Parameter, check_ctx, module_context


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


class _Plain(Module):
    """An activation without arguments."""
    _function = None

    def __init__(self, *, ctx=None):
        super().__init__()
        check_ctx(ctx)

    def forward(self, input):
        return type(self)._function(input)


class Mish(_Inplace):
    _function = staticmethod(F.mish)


class SELU(_Inplace):
    _function = staticmethod(F.selu)


class LogSigmoid(_Plain):
    _function = staticmethod(F.logsigmoid)


class Softsign(_Plain):
    _function = staticmethod(F.softsign)


class Tanhshrink(_Plain):
    _function = staticmethod(F.tanhshrink)


class CELU(Module):
    def __init__(self, alpha=1.0, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.celu(input, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Softshrink(Module):
    def __init__(self, lambd=0.5, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.lambd = lambd

    def forward(self, input):
        return F.softshrink(input, self.lambd)

    def extra_repr(self):
        return str(self.lambd)


class Hardshrink(Softshrink):
    def forward(self, input):
        return F.hardshrink(input, self.lambd)


class Threshold(Module):
    def __init__(self, threshold, value, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, input):
        return F.threshold(input, self.threshold, self.value, self.inplace)

    def extra_repr(self):
        return f"threshold={self.threshold}, value={self.value}" + (
            ", inplace=True" if self.inplace else "")


class RReLU(Module):
    """torch's RReLU in evaluation mode (slope (lower + upper) / 2); a module in training mode
    raises UnsupportedError (the random slopes are not supported)."""

    def __init__(self, lower=1.0 / 8, upper=1.0 / 3, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.lower, self.upper, self.inplace = lower, upper, inplace

    def forward(self, input):
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self):
        return f"lower={self.lower}, upper={self.upper}" + (", inplace=True" if self.inplace else "")


class GLU(Module):
    def __init__(self, dim=-1, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.dim = dim

    def forward(self, input):
        return F.glu(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmin(Softmax):
    def forward(self, input):
        return F.softmin(input, self.dim)


class PReLU(Module):
    """torch's PReLU: a learnable slope, one (``num_parameters=1``) or one per channel, all
    set to ``init``."""

    def __init__(self, num_parameters=1, init=0.25, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        if not isinstance(num_parameters, int) or isinstance(num_parameters, bool) or num_parameters <= 0:
            raise ShapeError(f"PReLU: num_parameters must be a positive int, got {num_parameters!r}")
        self.num_parameters, self.init = num_parameters, init
        self.weight = Parameter(Tensor.full(ctx, (num_parameters,), float(init)))

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"
