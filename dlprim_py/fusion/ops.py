"""The operators of a fusion plan, their frozen descriptions, and their run-time arguments
(MIOpen's miopenFusionOpDescriptor_t and miopenOperatorArgs_t)."""
import math
from dataclasses import dataclass

import numpy as np

from .. import solver
from ..activation import Activation, ActivationDesc
from ..dtypes import float32
from ..errors import DeviceError, DlprimError, DTypeError, ShapeError, UnsupportedError
from ..tensor import Tensor, TensorDesc

VERTICAL = "vertical"
HORIZONTAL = "horizontal"

BN_SPATIAL = "spatial"
BN_PER_ACTIVATION = "per_activation"

# MIOpen's miopenActivationMode_t, then the torch activations MIOpen lacks.
ACTIVATION_PASTHRU = Activation.PASTHRU
ACTIVATION_LOGISTIC = Activation.LOGISTIC
ACTIVATION_TANH = Activation.TANH
ACTIVATION_RELU = Activation.RELU
ACTIVATION_SOFTRELU = Activation.SOFTRELU
ACTIVATION_ABS = Activation.ABS
ACTIVATION_POWER = Activation.POWER
ACTIVATION_CLIPPEDRELU = Activation.CLIPPEDRELU
ACTIVATION_LEAKYRELU = Activation.LEAKYRELU
ACTIVATION_ELU = Activation.ELU
ACTIVATION_HARDTANH = Activation.HARDTANH
ACTIVATION_GELU = Activation.GELU
ACTIVATION_GELU_TANH = Activation.GELU_TANH
ACTIVATION_SILU = Activation.SILU
ACTIVATION_HARDSWISH = Activation.HARDSWISH
ACTIVATION_HARDSIGMOID = Activation.HARDSIGMOID

SUPPORTED_CHAINS = (
    "conv [bias | batchnorm_inference]* [activation]",
    "[bias | batchnorm_inference | activation]+ (no convolution)",
    "batchnorm_forward [activation]",
    "batchnorm_backward [activation_backward] (either order)",
    "HORIZONTAL: (conv [bias])+ [activation], sibling convolutions concatenated along channels",
)

# Which activation parameters each mode reads; the others are normalised away so that modes
# without parameters compile once whatever values the caller passes.
_USES = {
    Activation.TANH: (True, True, False),
    Activation.POWER: (True, True, True),
    Activation.CLIPPEDRELU: (True, False, False),
    Activation.LEAKYRELU: (True, False, False),
    Activation.ELU: (True, False, False),
    Activation.HARDTANH: (True, True, False),
}


def activation_desc(mode, alpha=None, beta=None, gamma=None):
    """The ActivationDesc of ``mode`` with the parameters it uses (defaults where None)."""
    desc = ActivationDesc(mode)
    uses = _USES.get(desc.mode, (False, False, False))
    values = [v if used and v is not None else None for v, used in zip((alpha, beta, gamma), uses)]
    return ActivationDesc(desc.mode, *values)


def chain_message():
    return "supported chains: " + "; ".join(SUPPORTED_CHAINS)


def as_desc(desc, what):
    if isinstance(desc, TensorDesc):
        return desc
    if isinstance(desc, Tensor):
        return desc.desc
    raise DTypeError(f"{what} must be a dp.TensorDesc, got {type(desc).__name__}")


def _as_bn_mode(mode):
    if mode in (BN_SPATIAL, BN_PER_ACTIVATION):
        return mode
    raise UnsupportedError(f"batch-norm mode must be fusion.BN_SPATIAL or fusion.BN_PER_ACTIVATION, "
                           f"got {mode!r}")


# ---- frozen descriptions ---------------------------------------------------------------------

@dataclass(frozen=True)
class OpSpec:
    """What a plan's op is, without the plan: the chain a fusion problem describes is a tuple of
    these. ``kind``: the op's name ("conv", "bias", ...); ``mode``: a batch-norm mode or an
    Activation; ``desc``: the weight, bias or batch-norm descriptor; ``geometry``: a
    convolution's (padding, stride, dilation, groups); ``running``: batchnorm_forward's
    running_mean_variance."""
    index: int
    kind: str
    mode: object = None
    desc: object = None
    geometry: tuple = ()
    running: bool = False

    def describe(self):
        if self.kind == "conv":
            padding, stride, dilation, groups = self.geometry
            return (f"conv(weight {self.desc.shape}, padding {padding}, stride {stride}, "
                    f"dilation {dilation}, groups {groups})")
        if self.kind == "bias":
            return f"bias({self.desc.shape})"
        if self.kind == "batchnorm_inference":
            return f"batchnorm_inference({self.mode}, {self.desc.shape})"
        if self.kind in ("activation", "activation_backward"):
            return f"{self.kind}({self.mode.name})"
        return f"{self.kind}({self.mode})"

    def conv_desc(self):
        from ..ops.conv.problem import ConvolutionDesc
        padding, stride, dilation, groups = self.geometry
        return ConvolutionDesc(padding, stride, dilation, groups)


# ---- operators -------------------------------------------------------------------------------

class FusedSolver(solver.Solver):
    """A fused solver of the "fusion" family: ``refusal(problem)`` is None where it fuses the
    chain, else (index of the op that breaks it, why), which the plan reports when no solver
    fuses the chain; it applies where it has no refusal."""

    def refusal(self, problem):
        raise NotImplementedError

    def applies(self, ctx, problem):
        return self.refusal(problem) is None


class FusionOp:
    """One operator of a plan; ``index`` is its position (``plan.get_op(index)``)."""

    name = "op"

    def __init__(self, plan, index):
        self.plan = plan
        self.index = index

    def __repr__(self):
        return f"<fusion op {self.index}: {self.describe()}>"

    def spec(self):
        return OpSpec(self.index, self.name)

    def describe(self):
        return self.spec().describe()


class ConvForwardOp(FusionOp):
    name = "conv"

    def __init__(self, plan, index, conv_desc, weight_desc):
        super().__init__(plan, index)
        from ..ops.conv.problem import ConvolutionDesc
        if not isinstance(conv_desc, ConvolutionDesc):
            raise DTypeError(f"conv_desc must be a dp.ConvolutionDesc, got {type(conv_desc).__name__}")
        self.conv_desc = conv_desc
        self.weight_desc = as_desc(weight_desc, "weight descriptor")

    def spec(self):
        d = self.conv_desc
        return OpSpec(self.index, self.name, desc=self.weight_desc,
                      geometry=(d.padding, d.stride, d.dilation, d.groups))


class BiasForwardOp(FusionOp):
    name = "bias"

    def __init__(self, plan, index, bias_desc):
        super().__init__(plan, index)
        self.bias_desc = as_desc(bias_desc, "bias descriptor")

    def spec(self):
        return OpSpec(self.index, self.name, desc=self.bias_desc)


class BatchNormInferenceOp(FusionOp):
    name = "batchnorm_inference"

    def __init__(self, plan, index, mode, bn_desc):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)
        self.bn_desc = as_desc(bn_desc, "batch-norm descriptor")

    def spec(self):
        return OpSpec(self.index, self.name, self.mode, self.bn_desc)


class _ActivationOp(FusionOp):
    """An activation (forward or backward) of ``mode``."""

    def __init__(self, plan, index, mode):
        super().__init__(plan, index)
        self.mode = ActivationDesc(mode).mode

    def spec(self):
        return OpSpec(self.index, self.name, self.mode)


class ActivationForwardOp(_ActivationOp):
    name = "activation"


class BatchNormForwardOp(FusionOp):
    """Batch norm in training mode (MIOpen's miopenCreateOpBatchNormForward)."""

    name = "batchnorm_forward"

    def __init__(self, plan, index, mode, running_mean_variance=True):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)
        self.running_mean_variance = bool(running_mean_variance)

    def spec(self):
        return OpSpec(self.index, self.name, self.mode, running=self.running_mean_variance)


class BatchNormBackwardOp(FusionOp):
    name = "batchnorm_backward"

    def __init__(self, plan, index, mode):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)

    def spec(self):
        return OpSpec(self.index, self.name, self.mode)


class ActivationBackwardOp(_ActivationOp):
    name = "activation_backward"


# ---- operator arguments ----------------------------------------------------------------------

def check_tensor(value, what, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, Tensor):
        raise DTypeError(f"{what} must be a dp.Tensor, got {type(value).__name__}")
    if value.dtype != float32:
        raise DTypeError(f"{what} must be float32, got {value.dtype}")
    return value


def _scaling(alpha, beta, what):
    """Refuse alpha != 1 or beta != 0 for an op after the first: MIOpen's fused kernels ignore
    them, and refusing is better than ignoring silently (the convolution's own alpha and beta
    scale the whole chain's result)."""
    alpha, beta = float(alpha), float(beta)
    if alpha != 1.0 or beta != 0.0:
        raise UnsupportedError(f"{what}: alpha must be 1 and beta 0 in a fusion plan, got "
                               f"alpha={alpha}, beta={beta}")


class OperatorArgs:
    """The run-time arguments of a plan's operators (MIOpen's miopenOperatorArgs_t).

    Tensors are held by reference: their contents are read when the plan executes.
    """

    def __init__(self):
        self.values = {}
        self.version = 0   # counts the set_* calls: a plan replays its enqueues while unchanged

    def _set(self, op, kind, values):
        if not isinstance(op, kind):
            raise DlprimError(f"expected a {kind.name} op, got {op!r}")
        self.values[op] = values
        self.version += 1

    def get(self, op):
        """The arguments set for ``op``; DlprimError when none were."""
        try:
            return self.values[op]
        except KeyError:
            raise DlprimError(f"no arguments were set for {op!r}") from None

    def set_conv_forward(self, op, alpha, beta, w):
        """``y = alpha * conv(x, w) (... rest of the chain) + beta * y_old``."""
        self._set(op, ConvForwardOp, dict(alpha=float(alpha), beta=float(beta),
                                          w=check_tensor(w, "conv weights")))

    def set_bias_forward(self, op, alpha, beta, bias):
        """``x + bias`` per channel (``alpha`` 1 and ``beta`` 0, as in every op after the first)."""
        _scaling(alpha, beta, "bias")
        self._set(op, BiasForwardOp, dict(bias=check_tensor(bias, "bias")))

    def set_batchnorm_inference(self, op, alpha, beta, scale, bias, mean, variance, epsilon):
        """``(x - mean) / sqrt(variance + epsilon) * scale + bias`` (estimated statistics)."""
        _scaling(alpha, beta, "batchnorm_inference")
        self._set(op, BatchNormInferenceOp, dict(
            scale=check_tensor(scale, "bn scale"), bias=check_tensor(bias, "bn bias"),
            mean=check_tensor(mean, "estimated mean"),
            variance=check_tensor(variance, "estimated variance"), epsilon=float(epsilon)))

    def set_activation_forward(self, op, alpha, beta, activ_alpha, activ_beta, activ_gamma):
        """``act(x)`` with the mode's parameters (those the mode does not use are ignored)."""
        _scaling(alpha, beta, "activation")
        self._set(op, ActivationForwardOp, dict(
            activation=activation_desc(op.mode, activ_alpha, activ_beta, activ_gamma)))

    def set_batchnorm_forward(self, op, alpha, beta, scale, bias, saved_mean=None,
                              saved_inv_variance=None, running_mean=None, running_variance=None,
                              exp_avg_factor=0.1, epsilon=1e-5):
        """Training batch norm. ``saved_mean``/``saved_inv_variance`` receive the batch mean and
        1/sqrt(var + eps) (both or neither); ``running_mean``/``running_variance`` are updated
        as ``(1 - exp_avg_factor) * running + exp_avg_factor * batch`` (unbiased variance)."""
        _scaling(alpha, beta, "batchnorm_forward")
        if (saved_mean is None) != (saved_inv_variance is None):
            raise DlprimError("give both saved_mean and saved_inv_variance, or neither")
        if (running_mean is None) != (running_variance is None):
            raise DlprimError("give both running_mean and running_variance, or neither")
        has_running = running_mean is not None
        if isinstance(op, BatchNormForwardOp) and op.running_mean_variance != has_running:
            raise DlprimError(f"the batchnorm_forward op was created with running_mean_variance="
                              f"{op.running_mean_variance}: give running_mean and running_variance "
                              f"{'' if op.running_mean_variance else 'as None'}".rstrip())
        self._set(op, BatchNormForwardOp, dict(
            scale=check_tensor(scale, "bn scale"), bias=check_tensor(bias, "bn bias"),
            saved_mean=check_tensor(saved_mean, "saved mean", True),
            saved_inv_variance=check_tensor(saved_inv_variance, "saved inverse variance", True),
            running_mean=check_tensor(running_mean, "running mean", True),
            running_variance=check_tensor(running_variance, "running variance", True),
            exp_avg_factor=float(exp_avg_factor), epsilon=float(epsilon)))

    def set_batchnorm_backward(self, op, alpha, beta, x, scale, bias, result_scale_diff,
                               result_bias_diff, saved_mean, saved_inv_variance):
        """Backward of training batch norm: x is the forward input, the saved statistics come
        from the forward pass; dscale and dbias are written to ``result_*_diff``."""
        _scaling(alpha, beta, "batchnorm_backward")
        self._set(op, BatchNormBackwardOp, dict(
            x=check_tensor(x, "x"), scale=check_tensor(scale, "bn scale"),
            bias=check_tensor(bias, "bn bias"),
            scale_diff=check_tensor(result_scale_diff, "result scale diff"),
            bias_diff=check_tensor(result_bias_diff, "result bias diff"),
            saved_mean=check_tensor(saved_mean, "saved mean"),
            saved_inv_variance=check_tensor(saved_inv_variance, "saved inverse variance")))

    def set_activation_backward(self, op, alpha, beta, y, reserved, activ_alpha, activ_beta,
                                activ_gamma):
        """``y`` (the forward output) and ``reserved`` may be None: the fused kernels recompute
        the activation's input from x and the saved statistics."""
        _scaling(alpha, beta, "activation_backward")
        check_tensor(y, "y", True)
        self._set(op, ActivationBackwardOp, dict(
            activation=activation_desc(op.mode, activ_alpha, activ_beta, activ_gamma)))


# ---- parameter shapes ------------------------------------------------------------------------

def check_param_desc(op, desc, what, channels, spatial_shape, per_activation):
    """Raise ShapeError unless ``desc`` fits the tensor it applies to ((1, C, 1, 1), (C,) or,
    per activation, (1, C, H, W)). ``op``: its OpSpec."""
    shape = tuple(desc.shape)
    if per_activation:
        expected = [(1, channels) + tuple(spatial_shape), (channels,) + tuple(spatial_shape)]
    else:
        expected = [(1, channels) + (1,) * len(spatial_shape), (channels,)]
    if shape not in expected:
        raise ShapeError(f"op {op.index} ({op.describe()}): {what} descriptor has shape {shape}, "
                         f"expected {' or '.join(str(e) for e in expected)} for a tensor with "
                         f"{channels} channels and spatial shape {tuple(spatial_shape)}")
    if desc.dtype != float32:
        raise DTypeError(f"op {op.index}: {what} must be float32, got {desc.dtype}")


def check_param_tensor(op, tensor, what, desc_shape):
    if tensor.size != math.prod(desc_shape):
        raise ShapeError(f"op {op.index} ({op.describe()}): {what} has shape {tensor.shape}, the "
                         f"descriptor says {tuple(desc_shape)}")


def param_view(tensor, shape):
    """``tensor`` seen with ``shape`` (same memory); its size was checked against ``shape``."""
    return Tensor(tensor.ctx, tensor.buffer, shape, tensor.dtype, offset=tensor.offset)


def chain_parameters(ctx, affine_ops, param_shapes, values):
    """The kernel arguments of a bias / BN-inference chain in op order, as fusion_fold.cl.mako's
    chain_params() declares them (bias: b; bn: mean, variance, scale, bias, then epsilon),
    after checking every tensor. ``values``: each op's arguments, by op index."""
    kernel_args = []
    for op in affine_ops:
        args = values[op.index]
        bn = op.kind == "batchnorm_inference"
        for field in (("mean", "variance", "scale", "bias") if bn else ("bias",)):
            t = args[field]
            check_param_tensor(op, t, field, param_shapes[op.index])
            if t.ctx.cl_context != ctx.cl_context:
                raise DeviceError(f"op {op.index}: {field} lives in another OpenCL context "
                                  f"than the plan")
            kernel_args += [t.buffer, np.int32(t.offset_elements)]
        if bn:
            kernel_args.append(np.float32(values[op.index]["epsilon"]))
    return kernel_args


def activation_of(spec, values):
    """The ActivationDesc an activation op runs with: its arguments' (None: the mode's
    defaults, what ``compile`` builds)."""
    if values is None:
        return activation_desc(spec.mode)
    return values[spec.index]["activation"]


@dataclass(frozen=True)
class FusionProblem:
    """A chain of operators on one input: what a fused solver is chosen for. ``ops``: the ops'
    ``OpSpec``s in plan order."""
    direction: str
    input_shape: tuple
    ops: tuple

    def key(self):
        return (f"fusion {self.direction} {'x'.join(map(str, self.input_shape))}: "
                + " -> ".join(op.describe() for op in self.ops))

    def features(self):
        return {"direction": self.direction, "ops": len(self.ops),
                "first": self.ops[0].kind if self.ops else "",
                "n": self.input_shape[0] if self.input_shape else 0,
                "c": self.input_shape[1] if len(self.input_shape) > 1 else 1}
