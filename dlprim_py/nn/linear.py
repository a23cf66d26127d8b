"""Linear layers: ``Linear`` and ``Identity`` (torch.nn's, torch's initialisation)."""
import math

from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from . import init
from .module import Module, Parameter, module_context


def _positive(value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{what} must be a positive int, got {value!r}")
    return value


class Identity(Module):
    """Returns its input; takes and ignores any arguments (torch's)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b over the last dimension: weight (out_features, in_features), bias
    (out_features,). Initialised as torch: weight kaiming_uniform_(a=sqrt(5)), bias
    U(-1/sqrt(in_features), 1/sqrt(in_features))."""

    def __init__(self, in_features, out_features, bias=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.in_features = _positive(in_features, "in_features")
        self.out_features = _positive(out_features, "out_features")
        self.weight = Parameter(Tensor.empty(ctx, (out_features, in_features)))
        if bias:
            self.bias = Parameter(Tensor.empty(ctx, (out_features,)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Bilinear(Module):
    """y = x1^T W x2 + b: weight (out_features, in1_features, in2_features), bias
    (out_features,). Initialised as torch: U(-1/sqrt(in1_features), 1/sqrt(in1_features))."""

    def __init__(self, in1_features, in2_features, out_features, bias=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.in1_features = _positive(in1_features, "in1_features")
        self.in2_features = _positive(in2_features, "in2_features")
        self.out_features = _positive(out_features, "out_features")
        self.weight = Parameter(Tensor.empty(ctx, (out_features, in1_features, in2_features)))
        if bias:
            self.bias = Parameter(Tensor.empty(ctx, (out_features,)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1 / math.sqrt(self.in1_features)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1, input2):
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self):
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")
