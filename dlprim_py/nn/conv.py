"""Convolutions: ``Conv2d`` and ``ConvTranspose2d`` (torch.nn's arguments and initialisation:
weight kaiming_uniform_(a=sqrt(5)), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with torch's fan_in
of the weight tensor)."""
import math

from .. import functional as F
from ..errors import ShapeError, UnsupportedError
from ..tensor import Tensor
from . import init
from .module import Module, Parameter, module_context

# torch's padding modes; "circular" has no pad mode here (functional.pad's limitation).
PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _pair(value, what):
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    try:
        pair = tuple(value)
    except TypeError:
        raise ShapeError(f"{what} must be an int or a pair of ints, got {value!r}") from None
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise ShapeError(f"{what} must be an int or a pair of ints, got {value!r}")
    return pair


def _channels(in_channels, out_channels, groups):
    for what, v in (("in_channels", in_channels), ("out_channels", out_channels),
                    ("groups", groups)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ShapeError(f"{what} must be a positive int, got {v!r}")
    if in_channels % groups or out_channels % groups:
        raise ShapeError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be "
                         f"divisible by groups ({groups})")


class _ConvNd(Module):
    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0, 0) and self.padding != "valid":
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if getattr(self, "output_padding", (0, 0)) != (0, 0):
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode!r}"
        return text


class Conv2d(_ConvNd):
    """2-d convolution over (N, C, H, W): weight (out_channels, in_channels / groups, kH, kW),
    bias (out_channels,). ``padding``: ints, a pair, "valid" or "same" (an even kernel span pads
    one more on the right and bottom, as torch does). ``padding_mode``: "zeros", "reflect",
    "replicate" or "circular"."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        _channels(in_channels, out_channels, groups)
        if padding_mode not in PADDING_MODES:
            raise UnsupportedError(f"Conv2d: padding_mode {padding_mode!r} is not supported "
                                   f"(supported: {', '.join(PADDING_MODES)})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.dilation = _pair(dilation, "dilation")
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ShapeError(f"Conv2d: padding must be 'valid', 'same' or ints, "
                                 f"got {padding!r}")
            if padding == "same" and self.stride != (1, 1):
                raise ShapeError("Conv2d: padding='same' needs stride 1")
            self.padding = padding
        else:
            self.padding = _pair(padding, "padding")
        self.padding_mode = padding_mode
        # torch's F.pad amounts for the non-zero modes: (left, right, top, bottom); "same" with
        # an even kernel span pads one more on the right and bottom, as torch does.
        if isinstance(self.padding, str):
            totals = ((0, 0) if self.padding == "valid" else
                      tuple(d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)))
            top, left = (t // 2 for t in totals)
            self._pad = (left, totals[1] - left, top, totals[0] - top)
        else:
            pads = self.padding
            self._pad = (pads[1], pads[1], pads[0], pads[0])
        kh, kw = self.kernel_size
        self.weight = Parameter(Tensor.empty(ctx, (out_channels, in_channels // groups, kh, kw)))
        if bias:
            self.bias = Parameter(Tensor.empty(ctx, (out_channels,)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def forward(self, input):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._pad, mode=self.padding_mode)
            return F.conv2d(input, self.weight, self.bias, self.stride, 0, self.dilation,
                            self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ConvTranspose2d(_ConvNd):
    """2-d transposed convolution: weight (in_channels, out_channels / groups, kH, kW), bias
    (out_channels,); ``forward(input, output_size=None)`` picks the output padding that gives
    ``output_size`` (its last two entries) as torch does. Only padding_mode="zeros" (torch's
    only one too)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros", *,
                 ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        _channels(in_channels, out_channels, groups)
        if padding_mode != "zeros":
            raise UnsupportedError(f"ConvTranspose2d: only padding_mode='zeros' is supported, "
                                   f"got {padding_mode!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.output_padding = _pair(output_padding, "output_padding")
        self.dilation = _pair(dilation, "dilation")
        self.padding_mode = padding_mode
        kh, kw = self.kernel_size
        self.weight = Parameter(Tensor.empty(ctx, (in_channels, out_channels // groups, kh, kw)))
        if bias:
            self.bias = Parameter(Tensor.empty(ctx, (out_channels,)))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _output_padding(self, input, output_size):
        if output_size is None:
            return self.output_padding
        size = tuple(output_size)[-2:]
        if len(size) != 2:
            raise ShapeError(f"output_size must hold the two spatial sizes, got {output_size!r}")
        result = []
        for d in range(2):
            least = ((input.shape[2 + d] - 1) * self.stride[d] - 2 * self.padding[d]
                     + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            if not least <= size[d] < least + self.stride[d]:
                raise ShapeError(f"requested an output size of {size}, but valid sizes of "
                                 f"dimension {d} lie in [{least}, {least + self.stride[d] - 1}]")
            result.append(size[d] - least)
        return tuple(result)

    def forward(self, input, output_size=None):
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(input, output_size), self.groups,
                                  self.dilation)
