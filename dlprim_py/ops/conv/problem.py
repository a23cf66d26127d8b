"""The convolution problem: geometry, layout, validation and the canonical key.

A problem is what every algorithm looks at to say whether it applies and how much workspace it
needs. Tensors are addressed through element strides in the logical order x (N, C, H, W),
w (K, C/groups, R, S), y (N, K, Ho, Wo), so one kernel serves NCHW and NHWC:

* ``layout="NCHW"``: x is stored (N, C, H, W), w (K, C/g, R, S), y (N, K, Ho, Wo);
* ``layout="NHWC"``: x is stored (N, H, W, C), w (K, R, S, C/g), y (N, Ho, Wo, K).
"""
from dataclasses import dataclass

import numpy as np

from ...dtypes import FLOAT16_TYPES, as_dtype
from ...dtypes import name as dtype_name
from ...errors import DTypeError, ShapeError, UnsupportedError

LAYOUTS = ("NCHW", "NHWC")
DIRECTIONS = ("forward", "backward_data", "backward_filter")
_INT32_LIMIT = 2 ** 31 - 1


def pair(value, name):
    """(a, b) from an int or a pair of ints (torch's argument convention)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value), int(value)
    try:
        a, b = value
    except (TypeError, ValueError):
        raise ShapeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    for v in (a, b):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ShapeError(f"{name} must be an int or a pair of ints, got {value!r}")
    return int(a), int(b)


class ConvolutionDesc:
    """Padding, stride, dilation and groups of a 2-D convolution (ints or (h, w) pairs), after
    MIOpen's convolution descriptor. Cross-correlation, like torch and cuDNN."""

    def __init__(self, padding=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
        self.padding = pair(padding, "padding")
        self.stride = pair(stride, "stride")
        self.dilation = pair(dilation, "dilation")
        if any(p < 0 for p in self.padding):
            raise ShapeError(f"padding must be >= 0, got {self.padding}")
        if any(s <= 0 for s in self.stride):
            raise ShapeError(f"stride must be > 0, got {self.stride}")
        if any(d <= 0 for d in self.dilation):
            raise ShapeError(f"dilation must be > 0, got {self.dilation}")
        if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups <= 0:
            raise ShapeError(f"groups must be a positive int, got {groups!r}")
        self.groups = int(groups)

    def __repr__(self):
        return (f"ConvolutionDesc(padding={self.padding}, stride={self.stride}, "
                f"dilation={self.dilation}, groups={self.groups})")


@dataclass(frozen=True)
class ConvProblem:
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    pad_h: int
    pad_w: int
    stride_h: int
    stride_w: int
    dil_h: int
    dil_w: int
    groups: int
    layout: str = "NCHW"
    dtype: str = "float32"

    @property
    def ho(self):
        return (self.h + 2 * self.pad_h - self.dil_h * (self.r - 1) - 1) // self.stride_h + 1

    @property
    def wo(self):
        return (self.w + 2 * self.pad_w - self.dil_w * (self.s - 1) - 1) // self.stride_w + 1

    @property
    def cg(self):
        return self.c // self.groups

    @property
    def kg(self):
        return self.k // self.groups

    @property
    def is_depthwise(self):
        return self.groups == self.c and self.groups > 1

    @property
    def is_1x1(self):
        return (self.r == self.s == 1 and self.pad_h == self.pad_w == 0
                and self.stride_h == self.stride_w == 1)

    # Shapes as stored in the problem's layout.
    @property
    def x_shape(self):
        return ((self.n, self.c, self.h, self.w) if self.layout == "NCHW"
                else (self.n, self.h, self.w, self.c))

    @property
    def w_shape(self):
        return ((self.k, self.cg, self.r, self.s) if self.layout == "NCHW"
                else (self.k, self.r, self.s, self.cg))

    @property
    def y_shape(self):
        return ((self.n, self.k, self.ho, self.wo) if self.layout == "NCHW"
                else (self.n, self.ho, self.wo, self.k))

    def x_strides(self):
        """Element strides of x in logical (N, C, H, W) order."""
        c, h, w = self.c, self.h, self.w
        return (c * h * w, h * w, w, 1) if self.layout == "NCHW" else (h * w * c, 1, w * c, c)

    def w_strides(self):
        """Element strides of w in logical (K, C/g, R, S) order."""
        cg, r, s = self.cg, self.r, self.s
        return (cg * r * s, r * s, s, 1) if self.layout == "NCHW" else (r * s * cg, 1, s * cg, cg)

    def y_strides(self):
        k, ho, wo = self.k, self.ho, self.wo
        return (k * ho * wo, ho * wo, wo, 1) if self.layout == "NCHW" else (ho * wo * k, 1, wo * k, k)

    def geometry_args(self):
        """The run-time arguments of conv_common's geometry_params(), in order."""
        values = (self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.ho, self.wo,
                  self.pad_h, self.pad_w, self.stride_h, self.stride_w, self.dil_h, self.dil_w,
                  self.groups) + self.x_strides() + self.w_strides() + self.y_strides()
        return [np.int32(v) for v in values]

    def key(self, direction):
        """Canonical problem string (the find-db key), e.g.
        ``64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-1-NCHW-float32-forward``."""
        return (f"{self.c}-{self.h}-{self.w}-{self.r}x{self.s}-{self.k}-{self.ho}-{self.wo}-"
                f"{self.n}-{self.pad_h}x{self.pad_w}-{self.stride_h}x{self.stride_w}-"
                f"{self.dil_h}x{self.dil_w}-{self.groups}-{self.layout}-{self.dtype}-{direction}")

    def driver_flags(self, direction):
        """MIOpenDriver ``conv`` flags for the command log."""
        forw = {"forward": 1, "backward_data": 2, "backward_filter": 4}[direction]
        return {"n": self.n, "c": self.c, "H": self.h, "W": self.w, "k": self.k, "y": self.r,
                "x": self.s, "p": self.pad_h, "q": self.pad_w, "u": self.stride_h,
                "v": self.stride_w, "l": self.dil_h, "j": self.dil_w, "g": self.groups,
                "F": forw, "I": self.layout}

    def flops(self):
        """Multiply-adds times two of one direction (all three are the same count)."""
        return 2 * self.n * self.k * self.ho * self.wo * self.cg * self.r * self.s


def make_problem(input_shape, weight_shape, conv_desc, layout="NCHW", dtype=np.float32):
    """Validate shapes against the descriptor and build the ConvProblem.

    ``input_shape``/``weight_shape`` are as stored in ``layout`` (see the module docstring).
    Raises ShapeError (mismatches), DTypeError, UnsupportedError (unknown layout).
    """
    if layout not in LAYOUTS:
        raise UnsupportedError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    dtype = as_dtype(dtype)
    if dtype != np.float32 and dtype not in FLOAT16_TYPES:
        raise DTypeError(f"convolution supports float32, float16 and bfloat16, got "
                         f"{dtype_name(dtype)}")
    input_shape, weight_shape = tuple(input_shape), tuple(weight_shape)
    if len(input_shape) != 4:
        raise ShapeError(f"convolution input must have rank 4 ({layout}), got shape {input_shape}")
    if len(weight_shape) != 4:
        raise ShapeError(f"convolution weight must have rank 4, got shape {weight_shape}")
    if layout == "NCHW":
        n, c, h, w = input_shape
        k, cg, r, s = weight_shape
    else:
        n, h, w, c = input_shape
        k, r, s, cg = weight_shape
    g = conv_desc.groups
    if c % g:
        raise ShapeError(f"input channels {c} are not divisible by groups {g}")
    if k % g:
        raise ShapeError(f"output channels {k} are not divisible by groups {g}")
    if cg != c // g:
        raise ShapeError(f"weight expects {cg} channels per group, input has {c} channels "
                         f"in {g} groups ({c // g} per group)")
    if min(n, c, h, w, k, r, s) <= 0:
        raise ShapeError(f"empty convolution: input {input_shape}, weight {weight_shape}")
    ph, pw = conv_desc.padding
    dh, dw = conv_desc.dilation
    if h + 2 * ph < dh * (r - 1) + 1 or w + 2 * pw < dw * (s - 1) + 1:
        raise ShapeError(f"kernel {r}x{s} (dilation {dh}x{dw}) is larger than the padded input "
                         f"{h + 2 * ph}x{w + 2 * pw}")
    problem = ConvProblem(n, c, h, w, k, r, s, ph, pw, *conv_desc.stride, dh, dw, g, layout,
                          dtype_name(dtype))
    largest = max(n * c * h * w, n * k * problem.ho * problem.wo, k * cg * r * s)
    if largest > _INT32_LIMIT:
        raise UnsupportedError(f"tensors of more than 2^31-1 elements are not supported ({largest})")
    return problem
