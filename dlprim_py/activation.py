"""The activation descriptor shared by pointwise activations, GEMM and convolution epilogues,
and the fusion API.

MIOpen's modes with their (alpha, beta, gamma) parameters, and the torch activations MIOpen
lacks (GELU, SiLU, hard-swish, ...) so that MobileNet- and EfficientNet-style layers fuse too.
``ActivationDesc.forward_code(x)`` gives the OpenCL C expression of act(x) and
``derivative_code(x, y)`` the expression of d act / dx given x and y = act(x); the parameters
are baked in as literals, so a kernel is compiled per (mode, alpha, beta, gamma).
"""
import enum
import numbers

from .errors import DlprimError, DTypeError, UnsupportedError


class Activation(enum.Enum):
    """An activation mode: MIOpen's ``miopenActivationMode_t`` with its meanings, then torch's
    activations that MIOpen lacks. ``alpha``, ``beta`` and ``gamma`` are the parameters of an
    ``ActivationDesc``.

    * PASTHRU: x; LOGISTIC: 1 / (1 + exp(-x)); TANH: beta * tanh(alpha * x)
    * RELU: max(0, x); SOFTRELU: log(1 + exp(x)); ABS: ``|x|``
    * POWER: (alpha + beta * x) ^ gamma; CLIPPEDRELU: min(alpha, max(0, x))
    * LEAKYRELU: x, or alpha * x where x <= 0; ELU: x, or alpha * (exp(x) - 1) where x <= 0
    * HARDTANH: min(beta, max(alpha, x)); GELU: x * Phi(x); GELU_TANH: its tanh approximation
    * SILU: x * sigmoid(x); HARDSWISH: x * relu6(x + 3) / 6; HARDSIGMOID: relu6(x + 3) / 6
    """
    # MIOpen's miopenActivationMode_t, same meanings.
    PASTHRU = "passthru"          # x
    LOGISTIC = "logistic"         # 1 / (1 + exp(-x))
    TANH = "tanh"                 # beta * tanh(alpha * x)
    RELU = "relu"                 # max(0, x)
    SOFTRELU = "softrelu"         # log(1 + exp(x))
    ABS = "abs"                   # |x|
    POWER = "power"               # (alpha + beta * x) ^ gamma
    CLIPPEDRELU = "clippedrelu"   # min(alpha, max(0, x))
    LEAKYRELU = "leakyrelu"       # x > 0 ? x : alpha * x
    ELU = "elu"                   # x > 0 ? x : alpha * (exp(x) - 1)
    # Beyond MIOpen, with torch's definitions.
    HARDTANH = "hardtanh"         # min(beta, max(alpha, x))
    GELU = "gelu"                 # x * Phi(x)
    GELU_TANH = "gelu_tanh"       # torch's approximate="tanh"
    SILU = "silu"                 # x * sigmoid(x)
    HARDSWISH = "hardswish"       # x * relu6(x + 3) / 6
    HARDSIGMOID = "hardsigmoid"   # relu6(x + 3) / 6


# Defaults for the parameters a mode uses (MIOpen's, or torch's for the torch-only names).
_DEFAULTS = {
    Activation.TANH: (1.0, 1.0, 0.0),
    Activation.POWER: (0.0, 1.0, 1.0),
    Activation.CLIPPEDRELU: (6.0, 0.0, 0.0),
    Activation.LEAKYRELU: (0.01, 0.0, 0.0),
    Activation.ELU: (1.0, 0.0, 0.0),
    Activation.HARDTANH: (-1.0, 1.0, 0.0),
}


def number(value, what):
    """``value`` as a float; DTypeError naming ``what`` unless it is a real number."""
    if not isinstance(value, numbers.Real):
        raise DTypeError(f"{what} must be a real number, got {value!r}")
    return float(value)


def _lit(value):
    text = repr(float(value))
    if text in ("inf", "-inf", "nan"):
        raise DlprimError(f"activation parameter must be finite, got {value}")
    return f"{text}f"


class ActivationDesc:
    """An activation mode with its parameters: ``ActivationDesc("relu")``,
    ``ActivationDesc(Activation.CLIPPEDRELU, alpha=6)``."""

    def __init__(self, mode, alpha=None, beta=None, gamma=None):
        if isinstance(mode, str):
            try:
                mode = Activation(mode.lower())
            except ValueError:
                try:
                    mode = Activation[mode.upper()]
                except KeyError:
                    raise UnsupportedError(f"unknown activation {mode!r}; known: "
                                           f"{', '.join(m.value for m in Activation)}") from None
        if not isinstance(mode, Activation):
            raise UnsupportedError(f"activation mode must be an Activation or a name, got {mode!r}")
        defaults = _DEFAULTS.get(mode, (0.0, 0.0, 0.0))
        self.mode = mode
        self.alpha = number(defaults[0] if alpha is None else alpha, f"{mode.value} alpha")
        self.beta = number(defaults[1] if beta is None else beta, f"{mode.value} beta")
        self.gamma = number(defaults[2] if gamma is None else gamma, f"{mode.value} gamma")
        for v in (self.alpha, self.beta, self.gamma):
            _lit(v)

    @property
    def key(self):
        """Hashable identity for kernel caches."""
        return (self.mode.value, self.alpha, self.beta, self.gamma)

    @property
    def is_identity(self):
        return self.mode is Activation.PASTHRU

    def __eq__(self, other):
        return isinstance(other, ActivationDesc) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"ActivationDesc({self.mode.name}, alpha={self.alpha}, beta={self.beta}, gamma={self.gamma})"

    def forward_code(self, x):
        """OpenCL C expression (float) of act(x); ``x`` must be a variable name."""
        a, b, g = _lit(self.alpha), _lit(self.beta), _lit(self.gamma)
        m = self.mode
        A = Activation
        if m is A.PASTHRU:
            return f"({x})"
        if m is A.LOGISTIC:
            return f"(1.0f / (1.0f + exp(-{x})))"
        if m is A.TANH:
            return f"({b} * tanh({a} * {x}))"
        # fmin/fmax return the number when one operand is NaN; torch propagates NaN, and so
        # do the comparisons below (false for NaN, which then passes through).
        if m is A.RELU:
            return f"({x} < 0.0f ? 0.0f : {x})"
        if m is A.SOFTRELU:
            # log1p(exp(x)) overflows for large x, where it equals x (torch's threshold is 20).
            return f"({x} > 20.0f ? {x} : log1p(exp({x})))"
        if m is A.ABS:
            return f"fabs({x})"
        if m is A.POWER:
            return f"pow({a} + {b} * {x}, {g})"
        if m is A.CLIPPEDRELU:
            return f"({x} < 0.0f ? 0.0f : ({x} > {a} ? {a} : {x}))"
        if m is A.LEAKYRELU:
            return f"({x} > 0.0f ? {x} : {a} * {x})"
        if m is A.ELU:
            return f"({x} > 0.0f ? {x} : {a} * (exp({x}) - 1.0f))"
        if m is A.HARDTANH:
            return f"({x} < {a} ? {a} : ({x} > {b} ? {b} : {x}))"
        if m is A.GELU:
            return f"(0.5f * {x} * (1.0f + erf({x} * 0.70710678118654752f)))"
        if m is A.GELU_TANH:
            # 0.5 x (1 + tanh(z)) = x / (1 + exp(-2 z)): 1 + tanh(z) cancels for z << 0 (an
            # error of 1e-6 at x = -60 where the result is 0).
            return (f"({x} / (1.0f + exp(-1.5957691216057307f * "
                    f"({x} + 0.044715f * {x} * {x} * {x}))))")
        if m is A.SILU:
            return f"({x} / (1.0f + exp(-{x})))"
        if m is A.HARDSWISH:
            return f"({x} * fmin(fmax({x} + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f))"
        if m is A.HARDSIGMOID:
            return f"({x} < -3.0f ? 0.0f : ({x} > 3.0f ? 1.0f : ({x} + 3.0f) * (1.0f / 6.0f)))"
        raise UnsupportedError(f"no forward code for {m}")

    def derivative_code(self, x, y):
        """OpenCL C expression of d act(x) / dx; ``x``, ``y`` = act(x) are variable names.

        At the kinks (x == 0 for ReLU and friends) the value follows torch's choice, and so
        does a NaN input: torch's backward zeroes the gradient where a comparison such as
        x <= 0 holds and passes it otherwise, so a NaN (every comparison false) takes the
        passing branch. The conditions below use the same comparisons, not negated
        ones (x > 0 ? 1 : 0 would give 0 at NaN).
        """
        a, b, g = _lit(self.alpha), _lit(self.beta), _lit(self.gamma)
        m = self.mode
        A = Activation
        if m is A.PASTHRU:
            return "1.0f"
        if m is A.LOGISTIC:
            return f"({y} * (1.0f - {y}))"
        if m is A.TANH:
            return f"({a} * {b} * (1.0f - tanh({a} * {x}) * tanh({a} * {x})))"
        if m is A.RELU:
            return f"({x} <= 0.0f ? 0.0f : 1.0f)"
        if m is A.SOFTRELU:
            return f"(1.0f / (1.0f + exp(-{x})))"
        if m is A.ABS:
            return f"({x} > 0.0f ? 1.0f : ({x} < 0.0f ? -1.0f : 0.0f))"
        if m is A.POWER:
            return f"({g} * {b} * pow({a} + {b} * {x}, {g} - 1.0f))"
        if m is A.CLIPPEDRELU:
            return f"(({x} <= 0.0f || {x} >= {a}) ? 0.0f : 1.0f)"
        if m is A.LEAKYRELU:
            return f"({x} > 0.0f ? 1.0f : {a})"
        if m is A.ELU:
            return f"({x} <= 0.0f ? {a} * exp({x}) : 1.0f)"
        if m is A.HARDTANH:
            return f"(({x} <= {a} || {x} >= {b}) ? 0.0f : 1.0f)"
        if m is A.GELU:
            return (f"(0.5f * (1.0f + erf({x} * 0.70710678118654752f)) + "
                    f"{x} * 0.39894228040143268f * exp(-0.5f * {x} * {x}))")
        if m is A.GELU_TANH:
            # With s = sigmoid(2 z): 1 + tanh(z) = 2 s and 1 - tanh(z)^2 = 4 s (1 - s), no
            # cancellation for z << 0; dz/dx = 0.79788 (1 + 0.134145 x^2).
            s = (f"(1.0f / (1.0f + exp(-1.5957691216057307f * "
                 f"({x} + 0.044715f * {x} * {x} * {x}))))")
            return (f"({s} + 2.0f * {x} * {s} * (1.0f - {s})"
                    f" * 0.79788456080286536f * (1.0f + 0.134145f * {x} * {x}))")
        if m is A.SILU:
            return (f"((1.0f / (1.0f + exp(-{x}))) * (1.0f + {x} * (1.0f - 1.0f / (1.0f + exp(-{x})))))")
        if m is A.HARDSWISH:
            return f"({x} < -3.0f ? 0.0f : ({x} <= 3.0f ? ({x} * (1.0f / 3.0f) + 0.5f) : 1.0f))"
        if m is A.HARDSIGMOID:
            return f"(({x} > -3.0f && {x} < 3.0f) ? (1.0f / 6.0f) : 0.0f)"
        raise UnsupportedError(f"no derivative code for {m}")


# torch.nn.functional names -> descriptor factories.
def from_torch_name(name, **kwargs):
    """The descriptor for a torch activation name: relu, relu6, leaky_relu(negative_slope),
    elu(alpha), hardtanh(min_val, max_val), sigmoid, tanh, softplus, gelu(approximate), silu,
    hardswish, hardsigmoid, abs."""
    A = Activation
    if name == "relu":
        return ActivationDesc(A.RELU)
    if name == "relu6":
        return ActivationDesc(A.CLIPPEDRELU, alpha=6.0)
    if name == "leaky_relu":
        return ActivationDesc(A.LEAKYRELU, alpha=kwargs.get("negative_slope", 0.01))
    if name == "elu":
        return ActivationDesc(A.ELU, alpha=kwargs.get("alpha", 1.0))
    if name == "hardtanh":
        return ActivationDesc(A.HARDTANH, alpha=kwargs.get("min_val", -1.0), beta=kwargs.get("max_val", 1.0))
    if name == "sigmoid":
        return ActivationDesc(A.LOGISTIC)
    if name == "tanh":
        return ActivationDesc(A.TANH, alpha=1.0, beta=1.0)
    if name == "softplus":
        return ActivationDesc(A.SOFTRELU)
    if name == "gelu":
        return ActivationDesc(A.GELU_TANH if kwargs.get("approximate", "none") == "tanh" else A.GELU)
    if name == "silu":
        return ActivationDesc(A.SILU)
    if name == "hardswish":
        return ActivationDesc(A.HARDSWISH)
    if name == "hardsigmoid":
        return ActivationDesc(A.HARDSIGMOID)
    if name == "abs":
        return ActivationDesc(A.ABS)
    return ActivationDesc(name)


def as_activation(activation):
    """None, an ActivationDesc, an Activation or a name (torch's or MIOpen's) -> descriptor
    or None (no activation)."""
    if activation is None:
        return None
    if isinstance(activation, ActivationDesc):
        return activation
    if isinstance(activation, Activation):
        return ActivationDesc(activation)
    if isinstance(activation, str):
        return from_torch_name(activation.lower())
    raise UnsupportedError(f"activation must be None, a name or an ActivationDesc, got {activation!r}")
