"""Fusion plans after MIOpen's fusion API: several operators, one kernel.

A MIOpen user transliterates one to one::

    miopenCreateFusionPlan(&plan, miopenVerticalFusion, xDesc)   plan = fusion.FusionPlan(ctx, fusion.VERTICAL, x_desc)
    miopenCreateOpConvForward(plan, &conv, convDesc, wDesc)      conv = plan.create_op_conv_forward(conv_desc, w_desc)
    miopenCreateOpBiasForward(plan, &bias, bDesc)                bias = plan.create_op_bias_forward(b_desc)
    miopenCreateOpBatchNormInference(plan, &bn, mode, bnDesc)    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, bn_desc)
    miopenCreateOpActivationForward(plan, &act, mode)            act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    miopenCompileFusionPlan(handle, plan)                        plan.compile()
    miopenFusionPlanGetOp(plan, i, &op)                          plan.get_op(i)
    miopenFusionPlanGetWorkSpaceSize(handle, plan, &size, algo)  plan.workspace_size(algo)
    miopenFusionPlanConvolutionGetAlgo(plan, n, &count, algos)   plan.conv_algorithms(n)
    miopenCreateOperatorArgs(&args)                              args = fusion.OperatorArgs()
    miopenSetOpArgsConvForward(args, conv, &a, &b, w)            args.set_conv_forward(conv, a, b, w)
    miopenSetOpArgsBiasForward(args, bias, &a, &b, bias)         args.set_bias_forward(bias, a, b, bias_tensor)
    miopenSetOpArgsBatchNormInference(args, bn, &a, &b, ...)     args.set_batchnorm_inference(bn, a, b, scale, bias, mean, var, eps)
    miopenSetOpArgsActivForward(args, act, &a, &b, aa, ab, ag)   args.set_activation_forward(act, a, b, aa, ab, ag)
    miopenExecuteFusionPlan(handle, plan, xDesc, x, yDesc, y, a) plan.execute(x_desc, x, y_desc, y, args)

and MIOpen's training-side fused paths: ``create_op_batchnorm_forward`` (+ activation) and
``create_op_batchnorm_backward`` with ``create_op_activation_backward``.

What fuses (``compile`` raises UnsupportedError for anything else, naming the op that breaks
the chain):

* ``conv [bias | batchnorm_inference]* [activation]``: the convolution's own kernel applies the
  epilogue ``act(alpha * acc * scale + shift) + beta * y_old`` for every algorithm (the GEMM of 1x1
  convolutions, Winograd's output transform, implicit GEMM, depthwise, direct), grouped and
  depthwise convolutions included. A bias alone is the shift. A batch norm (after or before a
  bias) folds into a scale and a shift per channel, conv(x, w) * scale[k] + shift[k], which
  the convolution's kernel computes itself from the chain's parameters
  (kernels/fusion_fold.cl.mako's apply_chain: once per channel where a work item keeps one,
  the GEMM's rows and Winograd's output transform, else per stored element), on every run:
  MIOpen's arguments give mean and variance, not folded vectors, and their contents may change
  between calls. No other kernel runs. A per-activation batch norm varies over (k, h, w): its
  link is computed per output position instead of per channel.
* ``[bias | batchnorm_inference | activation]+`` without a convolution: one kernel, a pass of
  float4 packets when every parameter is per channel and the activation comes last, else the
  pointwise generator with the parameters broadcast.
* ``batchnorm_forward [activation]``: batch norm in training mode (statistics, saved mean and
  inverse std, running averages) and the activation: one kernel, or two (partial sums, then
  normalise and activate) when few channels are split over work-groups to fill the device.
* ``batchnorm_backward [activation_backward]`` (either order): the backward of
  act(batchnorm_train(x)) through the activation's derivative: one kernel, or two likewise.
* ``fusion.HORIZONTAL`` (beyond MIOpen, which refuses it): sibling convolutions of one input
  with the same kernel size and geometry, each optionally followed by its bias, optionally one
  activation last; one convolution over their concatenated weights, whose output is theirs
  concatenated along channels in op order.

Tensors are NCHW float32. Bias and spatial batch-norm parameters have shape (1, C, 1, 1) (or
(C,)); per-activation batch-norm parameters (1, C, H, W). Activation parameters (alpha, beta,
gamma) are compile-time constants of the kernels: ``compile`` builds with the mode's defaults,
and ``execute`` builds, once per plan and parameter set, a variant for other values.
"""
import math

import numpy as np

from . import autograd, config, program
from .activation import Activation, ActivationDesc
from .context import Context, check_same_context
from .dtypes import float32
from .errors import DeviceError, DlprimError, DTypeError, ShapeError, UnsupportedError
from .logcmd import log_command, quiet
from .launch import BoundKernel, Recording
from .tensor import Tensor, TensorDesc, allocate

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


def _chain_message():
    return "supported chains: " + "; ".join(SUPPORTED_CHAINS)


def _as_desc(desc, what):
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


# ---- operators -------------------------------------------------------------------------------

class FusionOp:
    """One operator of a plan; ``index`` is its position (``plan.get_op(index)``)."""

    name = "op"

    def __init__(self, plan, index):
        self.plan = plan
        self.index = index

    def __repr__(self):
        return f"<fusion op {self.index}: {self.describe()}>"

    def describe(self):
        return self.name


class ConvForwardOp(FusionOp):
    name = "conv"

    def __init__(self, plan, index, conv_desc, weight_desc):
        super().__init__(plan, index)
        from .ops.conv.problem import ConvolutionDesc
        if not isinstance(conv_desc, ConvolutionDesc):
            raise DTypeError(f"conv_desc must be a dp.ConvolutionDesc, got {type(conv_desc).__name__}")
        self.conv_desc = conv_desc
        self.weight_desc = _as_desc(weight_desc, "weight descriptor")

    def describe(self):
        d = self.conv_desc
        return (f"conv(weight {self.weight_desc.shape}, padding {d.padding}, stride {d.stride}, "
                f"dilation {d.dilation}, groups {d.groups})")


class BiasForwardOp(FusionOp):
    name = "bias"

    def __init__(self, plan, index, bias_desc):
        super().__init__(plan, index)
        self.bias_desc = _as_desc(bias_desc, "bias descriptor")

    def describe(self):
        return f"bias({self.bias_desc.shape})"


class BatchNormInferenceOp(FusionOp):
    name = "batchnorm_inference"

    def __init__(self, plan, index, mode, bn_desc):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)
        self.bn_desc = _as_desc(bn_desc, "batch-norm descriptor")

    def describe(self):
        return f"batchnorm_inference({self.mode}, {self.bn_desc.shape})"


class ActivationForwardOp(FusionOp):
    name = "activation"

    def __init__(self, plan, index, mode):
        super().__init__(plan, index)
        self.mode = ActivationDesc(mode).mode

    def describe(self):
        return f"activation({self.mode.name})"


class BatchNormForwardOp(FusionOp):
    """Batch norm in training mode (MIOpen's miopenCreateOpBatchNormForward)."""

    name = "batchnorm_forward"

    def __init__(self, plan, index, mode, running_mean_variance=True):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)
        self.running_mean_variance = bool(running_mean_variance)

    def describe(self):
        return f"batchnorm_forward({self.mode})"


class BatchNormBackwardOp(FusionOp):
    name = "batchnorm_backward"

    def __init__(self, plan, index, mode):
        super().__init__(plan, index)
        self.mode = _as_bn_mode(mode)

    def describe(self):
        return f"batchnorm_backward({self.mode})"


class ActivationBackwardOp(FusionOp):
    name = "activation_backward"

    def __init__(self, plan, index, mode):
        super().__init__(plan, index)
        self.mode = ActivationDesc(mode).mode

    def describe(self):
        return f"activation_backward({self.mode.name})"


# ---- operator arguments ----------------------------------------------------------------------

def _check_tensor(value, what, allow_none=False):
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
        try:
            return self.values[op]
        except KeyError:
            raise DlprimError(f"no arguments were set for {op!r}") from None

    def set_conv_forward(self, op, alpha, beta, w):
        """``y = alpha * conv(x, w) (... rest of the chain) + beta * y_old``."""
        self._set(op, ConvForwardOp, dict(alpha=float(alpha), beta=float(beta),
                                          w=_check_tensor(w, "conv weights")))

    def set_bias_forward(self, op, alpha, beta, bias):
        _scaling(alpha, beta, "bias")
        self._set(op, BiasForwardOp, dict(bias=_check_tensor(bias, "bias")))

    def set_batchnorm_inference(self, op, alpha, beta, scale, bias, mean, variance, epsilon):
        """``(x - mean) / sqrt(variance + epsilon) * scale + bias`` (estimated statistics)."""
        _scaling(alpha, beta, "batchnorm_inference")
        self._set(op, BatchNormInferenceOp, dict(
            scale=_check_tensor(scale, "bn scale"), bias=_check_tensor(bias, "bn bias"),
            mean=_check_tensor(mean, "estimated mean"),
            variance=_check_tensor(variance, "estimated variance"), epsilon=float(epsilon)))

    def set_activation_forward(self, op, alpha, beta, activ_alpha, activ_beta, activ_gamma):
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
            scale=_check_tensor(scale, "bn scale"), bias=_check_tensor(bias, "bn bias"),
            saved_mean=_check_tensor(saved_mean, "saved mean", True),
            saved_inv_variance=_check_tensor(saved_inv_variance, "saved inverse variance", True),
            running_mean=_check_tensor(running_mean, "running mean", True),
            running_variance=_check_tensor(running_variance, "running variance", True),
            exp_avg_factor=float(exp_avg_factor), epsilon=float(epsilon)))

    def set_batchnorm_backward(self, op, alpha, beta, x, scale, bias, result_scale_diff,
                               result_bias_diff, saved_mean, saved_inv_variance):
        """Backward of training batch norm: x is the forward input, the saved statistics come
        from the forward pass; dscale and dbias are written to ``result_*_diff``."""
        _scaling(alpha, beta, "batchnorm_backward")
        self._set(op, BatchNormBackwardOp, dict(
            x=_check_tensor(x, "x"), scale=_check_tensor(scale, "bn scale"),
            bias=_check_tensor(bias, "bn bias"),
            scale_diff=_check_tensor(result_scale_diff, "result scale diff"),
            bias_diff=_check_tensor(result_bias_diff, "result bias diff"),
            saved_mean=_check_tensor(saved_mean, "saved mean"),
            saved_inv_variance=_check_tensor(saved_inv_variance, "saved inverse variance")))

    def set_activation_backward(self, op, alpha, beta, y, reserved, activ_alpha, activ_beta,
                                activ_gamma):
        """``y`` (the forward output) and ``reserved`` may be None: the fused kernel recomputes
        the activation's input from x and the saved statistics."""
        _scaling(alpha, beta, "activation_backward")
        _check_tensor(y, "y", True)
        self._set(op, ActivationBackwardOp, dict(
            activation=activation_desc(op.mode, activ_alpha, activ_beta, activ_gamma)))


# ---- the plan --------------------------------------------------------------------------------

class FusionPlan:
    """A chain of operators on one input, compiled into one kernel (MIOpen's fusion plan).

    ``direction``: ``fusion.VERTICAL`` (each op consumes the previous op's output).
    ``fusion.HORIZONTAL``: sibling convolutions of the input (each optionally followed by its
    bias, optionally one activation last), output concatenated along channels, which MIOpen
    refuses; other horizontal plans raise UnsupportedError at ``compile``. ``input_desc``: the
    NCHW float32 input (``dp.TensorDesc``).
    """

    def __init__(self, ctx, direction, input_desc):
        if not isinstance(ctx, Context):
            raise DeviceError(f"expected a dlprim_py.Context, got {type(ctx).__name__}")
        if direction not in (VERTICAL, HORIZONTAL):
            raise UnsupportedError(f"direction must be fusion.VERTICAL or fusion.HORIZONTAL, "
                                   f"got {direction!r}")
        self.ctx = ctx
        self.direction = direction
        self.input_desc = _as_desc(input_desc, "input descriptor")
        if self.input_desc.dtype != float32:
            raise DTypeError(f"fusion plans take float32 tensors, got {self.input_desc.dtype}")
        self.ops = []
        self.output_desc = None
        self.runner = None
        self.conv_algorithm = None
        self._bound = None   # (args, key, Recording) of the last execute, see execute()
        self._repeat = None   # what a call must pass again to skip the checks, see execute()

    # ---- building the chain --------------------------------------------------------------

    def _add(self, cls, *args):
        if self.runner is not None:
            raise DlprimError("the plan is compiled: create a new plan to add operators")
        op = cls(self, len(self.ops), *args)
        self.ops.append(op)
        return op

    def create_op_conv_forward(self, conv_desc, w_desc):
        return self._add(ConvForwardOp, conv_desc, w_desc)

    def create_op_bias_forward(self, b_desc):
        return self._add(BiasForwardOp, b_desc)

    def create_op_batchnorm_inference(self, mode, bn_desc):
        return self._add(BatchNormInferenceOp, mode, bn_desc)

    def create_op_activation_forward(self, mode):
        return self._add(ActivationForwardOp, mode)

    def create_op_batchnorm_forward(self, mode, running_mean_variance=True):
        return self._add(BatchNormForwardOp, mode, running_mean_variance)

    def create_op_batchnorm_backward(self, mode):
        return self._add(BatchNormBackwardOp, mode)

    def create_op_activation_backward(self, mode):
        return self._add(ActivationBackwardOp, mode)

    def get_op(self, index):
        """The op at ``index`` in insertion order; DlprimError when out of range."""
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.ops):
            raise DlprimError(f"op index {index!r} out of range: the plan has {len(self.ops)} ops")
        return self.ops[index]

    # ---- compiling -----------------------------------------------------------------------

    def describe(self):
        return " -> ".join(op.describe() for op in self.ops) or "(empty)"

    def compile(self):
        """Check the chain and the descriptors, build the kernels. Raises UnsupportedError for
        a chain that does not fuse (naming the op that breaks it), ShapeError for descriptors
        that disagree."""
        if not self.ops:
            raise UnsupportedError(f"the plan has no operators; {_chain_message()}")
        first = self.ops[0]
        if self.direction == HORIZONTAL:
            runner = _HorizontalConvs(self)
        elif isinstance(first, ConvForwardOp):
            runner = _ConvChain(self)
        elif isinstance(first, BatchNormForwardOp):
            runner = _BatchNormTrainForward(self)
        elif isinstance(first, (BatchNormBackwardOp, ActivationBackwardOp)):
            runner = _BatchNormTrainBackward(self)
        else:
            runner = _PointwiseChain(self)
        self.output_desc = runner.output_desc
        self.runner = runner
        self._bound = self._repeat = None
        return self

    def _compiled(self):
        if self.runner is None:
            raise DlprimError("compile() the plan before this call")
        return self.runner

    def _conv_runner(self):
        runner = self._compiled()
        if isinstance(runner, _HorizontalConvs):
            runner = runner.inner.runner
        if not isinstance(runner, _ConvChain):
            raise UnsupportedError("the plan has no convolution")
        return runner

    def conv_algorithms(self, request_count=None):
        """The convolution algorithms that run this plan's chain in one kernel, by priority
        (the first is used unless ``set_conv_algorithm`` picks another)."""
        names = self._conv_runner().algorithm_names()
        return names if request_count is None else names[:int(request_count)]

    def set_conv_algorithm(self, algo):
        self._conv_runner().set_algorithm(algo)
        self._bound = self._repeat = None

    def workspace_size(self, algo=None):
        """Bytes of workspace the plan uses (the plan allocates it itself)."""
        runner = self._compiled()
        if isinstance(runner, (_ConvChain, _HorizontalConvs)):
            return self._conv_runner().workspace_size(algo)
        return 0

    # ---- running -------------------------------------------------------------------------

    def execute(self, input_desc, x, output_desc, y, args):
        """Enqueue the fused kernel(s): ``x`` (``input_desc``) in, ``y`` (``output_desc``) out.

        For a backward plan ``x`` is dy and ``y`` is dx (MIOpen's convention).
        """
        # A layer calls its plan with the same objects again and again: the same args (not
        # changed since), descriptors and tensors (same buffers, offsets and shapes) as the last
        # checked call replay its enqueues without checking anything again; the host time of
        # a call is then about that of its enqueues.
        repeat = self._repeat
        if (repeat is not None and repeat[0] is args and repeat[1] == args.version
                and repeat[2] is input_desc and repeat[3] is output_desc and repeat[4] is x
                and repeat[5] is y
                and repeat[6] == (x.buffer, x.offset, x.shape, y.buffer, y.offset, y.shape)):
            if config.log_cmd():
                self._log_call()
            repeat[7].run((x.buffer, y.buffer))
            return
        self._repeat = None
        runner = self._compiled()
        given_descs = (input_desc, output_desc)
        input_desc = _as_desc(input_desc, "input descriptor")
        output_desc = _as_desc(output_desc, "output descriptor")
        if input_desc != self.input_desc:
            raise ShapeError(f"execute: input descriptor {input_desc} differs from the plan's "
                             f"{self.input_desc}")
        if output_desc != self.output_desc:
            raise ShapeError(f"execute: output descriptor {output_desc} differs from the plan's "
                             f"{self.output_desc}")
        _check_tensor(x, "x")
        _check_tensor(y, "y")
        if x.shape != input_desc.shape:
            raise ShapeError(f"execute: x has shape {x.shape}, the descriptor says {input_desc.shape}")
        if y.shape != output_desc.shape:
            raise ShapeError(f"execute: y has shape {y.shape}, the descriptor says {output_desc.shape}")
        if not isinstance(args, OperatorArgs):
            raise DTypeError(f"args must be a fusion.OperatorArgs, got {type(args).__name__}")
        check_same_context(x, y)
        if x.ctx.cl_context != self.ctx.cl_context:
            raise DeviceError("x lives in another OpenCL context than the plan")
        if config.log_cmd():
            self._log_call()
        if not runner.replayable:
            with autograd.no_grad():
                runner.run(x, y, args)
            return
        # A plan runs layer after layer on the same tensors: the second call with the same x, y
        # and unchanged args replays the recorded enqueues (the convolution's kernels) instead
        # of rebuilding them, which is most of a call's host time. The tensors' contents are
        # read afresh by every replay, as MIOpen's arguments promise.
        operands = [x.buffer, y.buffer]
        key = (x.offset_elements, y.offset_elements, args.version, x.buffer == y.buffer)
        bound = self._bound
        if bound is None or bound[0] is not args or bound[1] != key:
            self._bound = None
            with autograd.no_grad(), quiet(), Recording() as recording:
                runner.run(x, y, args)
            # The plan binds x and y on every run and holds what else it binds (args' tensors
            # are held by args as well).
            plan = recording.plan(self.ctx.queue, operands)
            if plan is None:
                return
            self._bound = bound = (args, key, plan)
        else:
            bound[2].run(operands)
        self._repeat = (args, args.version, *given_descs, x, y,
                        (x.buffer, x.offset, x.shape, y.buffer, y.offset, y.shape), bound[2])

    def _log_call(self):
        log_command("CBAInfer", {"plan": f"'{self.describe()}'", "n": self.input_desc.shape[0],
                                 "c": self.input_desc.shape[1],
                                 "H": self.input_desc.shape[2] if self.input_desc.ndim > 2 else 1,
                                 "W": self.input_desc.shape[3] if self.input_desc.ndim > 3 else 1})


# ---- parameter shapes ------------------------------------------------------------------------

def _channel_shape(shape):
    """(C, S) of an (N, C, *spatial) shape."""
    return shape[1], math.prod(shape[2:])


def _check_param_desc(op, desc, what, channels, spatial_shape, per_activation):
    """Raise ShapeError unless ``desc`` fits the tensor it applies to ((1, C, 1, 1), (C,) or,
    per activation, (1, C, H, W))."""
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


def _check_param_tensor(op, tensor, what, desc_shape):
    if tensor.size != math.prod(desc_shape):
        raise ShapeError(f"op {op.index} ({op.describe()}): {what} has shape {tensor.shape}, the "
                         f"descriptor says {tuple(desc_shape)}")


def _param_view(tensor, shape):
    """``tensor`` seen with ``shape`` (same memory); its size was checked against ``shape``."""
    return Tensor(tensor.ctx, tensor.buffer, shape, tensor.dtype, offset=tensor.offset)


# ---- chain runners ---------------------------------------------------------------------------

def _affine_statement(ops, args, value="v"):
    """C statements applying bias / BN-inference / activation ops to the float ``value``, the
    (name, op, field) list of the parameter tensors they read, and the (name, op, field) list
    of their scalars. ``args``: op -> its arguments, for the activation parameters (None: the
    modes' defaults)."""
    lines, inputs, scalars = [], [], []
    for op in ops:
        i = op.index
        if isinstance(op, BiasForwardOp):
            lines.append(f"{value} += b{i};")
            inputs.append((f"b{i}", op, "bias"))
        elif isinstance(op, BatchNormInferenceOp):
            lines.append(f"{value} = ({value} - m{i}) * (s{i} / sqrt(v{i} + eps{i})) + t{i};")
            inputs += [(f"m{i}", op, "mean"), (f"v{i}", op, "variance"), (f"s{i}", op, "scale"),
                       (f"t{i}", op, "bias")]
            scalars.append((f"eps{i}", op, "epsilon"))
        elif isinstance(op, ActivationForwardOp):
            desc = args[op]["activation"] if args is not None else activation_desc(op.mode)
            lines.append(f"{{ float a_in = {value}; {value} = {desc.forward_code('a_in')}; }}")
    return " ".join(lines), inputs, scalars


def _chain_parameters(plan, affine_ops, param_shapes, args):
    """The kernel arguments of a bias / BN-inference chain in op order, as fusion_fold.cl.mako's
    chain_params() declares them (bias: b; bn: mean, variance, scale, bias, then epsilon),
    after checking every tensor."""
    kernel_args = []
    for op in affine_ops:
        values = args.get(op)
        bn = isinstance(op, BatchNormInferenceOp)
        for field in (("mean", "variance", "scale", "bias") if bn else ("bias",)):
            t = values[field]
            _check_param_tensor(op, t, field, param_shapes[op])
            if t.ctx.cl_context != plan.ctx.cl_context:
                raise DeviceError(f"op {op.index}: {field} lives in another OpenCL context "
                                  f"than the plan")
            kernel_args += [t.buffer, np.int32(t.offset_elements)]
        if bn:
            kernel_args.append(np.float32(values["epsilon"]))
    return kernel_args


class _PointwiseChain:
    """bias / BN inference / activation ops without a convolution: one pointwise kernel."""
    replayable = False   # enqueues directly: FusionPlan.execute runs it every time

    def __init__(self, plan):
        self.plan = plan
        shape = plan.input_desc.shape
        if len(shape) < 2:
            raise ShapeError(f"the input must be (N, C, ...), got shape {shape}")
        channels = shape[1]
        self.param_shapes = {}
        for op in plan.ops:
            if isinstance(op, (BiasForwardOp, BatchNormInferenceOp, ActivationForwardOp)):
                if isinstance(op, BiasForwardOp):
                    _check_param_desc(op, op.bias_desc, "bias", channels, shape[2:], False)
                    self.param_shapes[op] = (1, channels) + (1,) * (len(shape) - 2)
                elif isinstance(op, BatchNormInferenceOp):
                    per_activation = op.mode == BN_PER_ACTIVATION
                    _check_param_desc(op, op.bn_desc, "batch-norm", channels, shape[2:],
                                      per_activation)
                    self.param_shapes[op] = ((1,) + tuple(shape[1:]) if per_activation else
                                             (1, channels) + (1,) * (len(shape) - 2))
                continue
            raise UnsupportedError(f"op {op.index} ({op.describe()}) cannot follow "
                                   f"{plan.ops[0].describe()} in one kernel; {_chain_message()}")
        self.output_desc = TensorDesc(shape, float32)
        self.kernels = {}
        # Every parameter per channel and the activation (if any) last: one pass of float4
        # packets, the chain recomputed per packet (kernels/fusion_fold.cl.mako); otherwise
        # the pointwise generator with the parameters broadcast.
        kinds = [type(op) for op in plan.ops]
        self.per_channel = (
            all(not (isinstance(op, BatchNormInferenceOp) and op.mode == BN_PER_ACTIVATION)
                for op in plan.ops)
            and ActivationForwardOp not in kinds[:-1] and math.prod(shape) < 2 ** 31 - 4)
        self.layout = (shape[0], channels, math.prod(shape[2:]))
        self.affine_ops = [op for op in plan.ops if not isinstance(op, ActivationForwardOp)]
        self.activation = plan.ops[-1] if kinds[-1] is ActivationForwardOp else None
        # Build the default-parameter variant now (float4 where the plane size allows it).
        if self.per_channel:
            self._plane_kernel(None, 4 if self.layout[2] % 4 == 0 else 1)
        else:
            self._kernel(None)

    widest = 4   # elements per packet at most; set_vector_width(1) forces scalar packets (tests)

    def set_vector_width(self, widest):
        self.widest = int(widest)

    def _activation_key(self, args):
        return tuple(args.get(op)["activation"].key if args is not None else None
                     for op in self.plan.ops if isinstance(op, ActivationForwardOp))

    def _plane_kernel(self, args, vec):
        """apply_affine_activation for the activation parameters of ``args`` (None: the
        defaults) and ``vec`` elements per packet, built once per parameter set."""
        key = (self._activation_key(args), vec)
        kernel = self.kernels.get(key)
        if kernel is None:
            if self.activation is None:
                code = "z"
            elif args is None:
                code = activation_desc(self.activation.mode).forward_code("z")
            else:
                code = args.get(self.activation)["activation"].forward_code("z")
            chain = [("bias" if isinstance(op, BiasForwardOp) else "bn", False)
                     for op in self.affine_ops]
            kernel = self.kernels[key] = BoundKernel(program.kernel(
                self.plan.ctx, "fusion_fold", "apply_affine_activation",
                dict(chain=chain, activation=code, vec=vec), fresh=True))
        return kernel

    def _kernel(self, args):
        """(kernel, inputs, scalars) for the activation parameters of ``args`` (None: the
        defaults), built once per parameter set."""
        from .ops.pointwise import PointwiseKernel
        key = self._activation_key(args)
        entry = self.kernels.get(key)
        if entry is None:
            statement, inputs, scalars = _affine_statement(
                self.plan.ops, None if args is None else {op: args.get(op) for op in self.plan.ops
                                                           if isinstance(op, ActivationForwardOp)})
            kernel = PointwiseKernel(
                "fused_affine_activation", [("x", float32)] + [(n, float32) for n, _, _ in inputs],
                [("y", float32)], f"float v = x; {statement} y = v;",
                scalars=[(n, np.float32) for n, _, _ in scalars])
            entry = self.kernels[key] = (kernel, inputs, scalars)
            _prebuild_pointwise(self.plan.ctx, kernel, self.plan.input_desc.shape,
                                [self.param_shapes[op] for _, op, _ in inputs])
        return entry

    def run(self, x, y, args):
        if self.per_channel:
            return self._run_planes(x, y, args)
        kernel, inputs, scalars = self._kernel(args)
        tensors = []
        for name, op, field in inputs:
            value = args.get(op)[field]
            _check_param_tensor(op, value, field, self.param_shapes[op])
            tensors.append(_param_view(value, self.param_shapes[op]))
        kernel([x] + tensors, [y], [args.get(op)[field] for _, op, field in scalars])


    def _run_planes(self, x, y, args):
        check_same_context(x, y)
        n, c, spatial = self.layout
        vec = 4 if (self.widest >= 4 and spatial % 4 == 0 and x.offset_elements % 4 == 0
                    and y.offset_elements % 4 == 0) else 1
        kernel = self._plane_kernel(args, vec)
        packets = n * c * spatial // vec
        kernel_args = [np.int32(packets), np.int32(c), np.int32(spatial)]
        kernel_args += _chain_parameters(self.plan, self.affine_ops, self.param_shapes, args)
        kernel_args += [x.buffer, np.int32(x.offset_elements), y.buffer,
                        np.int32(y.offset_elements)]
        info = self.plan.ctx.info
        group = min(256, info.max_work_group_size)
        groups = min(-(-packets // group), info.compute_units * (16 if info.is_gpu else 4))
        kernel(self.plan.ctx.queue, (groups * group,), (group,), *kernel_args)


def _prebuild_pointwise(ctx, kernel, out_shape, input_shapes):
    """Build ``kernel`` for these shapes now, so that running it only enqueues."""
    from .ops.pointwise import broadcast_strides, merge_dimensions
    strides = [broadcast_strides(s, out_shape) for s in [out_shape] + list(input_shapes)]
    sizes, _ = merge_dimensions(out_shape, strides + [broadcast_strides(out_shape, out_shape)])
    kernel._kernel(ctx, len(sizes), "int" if math.prod(out_shape) < 2 ** 31 - 1 else "long")


def _bn_group_size(ctx):
    size = 256
    while size > ctx.info.max_work_group_size:
        size //= 2
    return size


def _bn_train_kernel(ctx, name, activation, index_t, vec):
    params = dict(group_size=_bn_group_size(ctx), index_t=index_t, vec=vec,
                  act_forward=activation.forward_code("z"),
                  act_derivative=activation.derivative_code("z", "a"))
    return program.kernel(ctx, "fusion_bn", name, params)


def _bn_vector_width(layout, chunk_len, tensors, widest):
    """4 (float4 loads and stores) when a packet of 4 never leaves an (n, c) plane nor a chunk
    and every tensor starts on a 16-byte boundary, else 1."""
    if widest >= 4 and layout[2] % 4 == 0 and chunk_len % 4 == 0 and all(
            t.offset_elements % 4 == 0 for t in tensors):
        return 4
    return 1


def _bn_chunks(ctx, layout):
    """Work-groups per channel so that the device has enough of them (at least 8 * group
    elements each)."""
    _, channels, _ = layout
    per_channel = layout[0] * layout[2]
    group = _bn_group_size(ctx)
    wanted = ctx.info.compute_units * (8 if ctx.info.is_gpu else 1)
    chunks = min(-(-wanted // max(channels, 1)), per_channel // (8 * group), 256)
    return max(1, chunks)


def _bn_partials(ctx, layout, chunks):
    """(chunks, chunk_len, partials tensor or None) for splitting each channel in ``chunks``."""
    per_channel = layout[0] * layout[2]
    chunks = max(1, min(int(chunks), per_channel))
    chunk_len = -(-per_channel // chunks)
    if layout[2] % 4 == 0:   # whole packets of 4 per chunk, for the float4 variant
        chunk_len = -(-chunk_len // 4) * 4
    chunks = -(-per_channel // chunk_len)
    partials = Tensor.empty(ctx, (layout[1] * chunks * 2,)) if chunks > 1 else None
    return chunks, chunk_len, partials


def _bn_layout(shape, mode):
    """(N, C, S) as the fusion_bn kernels see the tensor in ``mode``."""
    channels, spatial = _channel_shape(shape)
    if mode == BN_PER_ACTIVATION:
        return shape[0], channels * spatial, 1
    return shape[0], channels, spatial


def _index_type(*tensors):
    largest = max(t.offset_elements + t.size for t in tensors if t is not None)
    return ("int", np.int32) if largest < 2 ** 31 - 1 else ("long", np.int64)


class _BatchNormTrainForward:
    """batchnorm_forward [activation]: statistics, normalisation and activation in one kernel."""
    replayable = False   # enqueues directly: FusionPlan.execute runs it every time

    def __init__(self, plan):
        self.plan = plan
        ops = plan.ops
        self.bn = ops[0]
        self.activation = None
        for op in ops[1:]:
            if isinstance(op, ActivationForwardOp) and self.activation is None:
                self.activation = op
                continue
            raise UnsupportedError(f"op {op.index} ({op.describe()}) cannot follow "
                                   f"{ops[op.index - 1].describe()} in a training batch-norm plan; "
                                   f"{_chain_message()}")
        shape = plan.input_desc.shape
        if len(shape) < 2:
            raise ShapeError(f"the input must be (N, C, ...), got shape {shape}")
        self.layout = _bn_layout(shape, self.bn.mode)
        self.param_size = self.layout[1]
        self.output_desc = TensorDesc(shape, float32)
        self.dummy = Tensor.zeros(plan.ctx, (1,))
        self.set_chunks(_bn_chunks(plan.ctx, self.layout))
        self._prebuild(activation_desc(self.activation.mode) if self.activation else
                       ActivationDesc(Activation.PASTHRU))

    widest = 4   # elements per load at most; set_vector_width(1) forces scalar loads (tests)

    def set_chunks(self, chunks):
        """Split each channel into ``chunks`` work-groups (1: one kernel per call; more: two
        kernels, for channels too few to fill the device). Chosen at compile; for tests."""
        self.chunks, self.chunk_len, self.partials = _bn_partials(self.plan.ctx, self.layout, chunks)

    def set_vector_width(self, widest):
        """At most ``widest`` (4 or 1) elements per load; 4 is used where it applies."""
        self.widest = int(widest)

    def _prebuild(self, activation):
        """Build the kernels a call with aligned tensors and 32-bit indices will run."""
        vec = 4 if self.layout[2] % 4 == 0 else 1
        for step in (("activation",) if self.chunks == 1 else ("partial", "apply")):
            self._kernel(activation, "int", step, vec)

    def _kernel(self, activation, index_t, step, vec=1):
        return _bn_train_kernel(self.plan.ctx, f"bn_train_forward_{step}", activation, index_t,
                                vec)

    def run(self, x, y, args):
        values = args.get(self.bn)
        activation = (args.get(self.activation)["activation"] if self.activation
                      else ActivationDesc(Activation.PASTHRU))
        params = [values[k] for k in ("scale", "bias", "saved_mean", "saved_inv_variance",
                                      "running_mean", "running_variance")]
        for name, t in zip(("scale", "bias", "saved_mean", "saved_inv_variance", "running_mean",
                            "running_variance"), params):
            if t is not None and t.size != self.param_size:
                raise ShapeError(f"batchnorm_forward: {name} has {t.size} elements, expected "
                                 f"{self.param_size} ({self.bn.mode})")
        check_same_context(x, y, *params)
        index_t, index_np = _index_type(x, y, *params)
        save = values["saved_mean"] is not None
        update = values["running_mean"] is not None
        sizes = [index_np(v) for v in self.layout]
        x_args = [x.buffer, index_np(x.offset_elements)]
        call_args = x_args + [y.buffer, index_np(y.offset_elements)]
        for t in params:
            t = t if t is not None else self.dummy
            call_args += [t.buffer, index_np(t.offset_elements)]
        call_args += [np.float32(values["exp_avg_factor"]), np.float32(values["epsilon"]),
                      np.int32(save), np.int32(update)]
        queue, group = self.plan.ctx.queue, _bn_group_size(self.plan.ctx)
        vec = _bn_vector_width(self.layout, self.chunk_len, (x, y), self.widest)
        if self.chunks == 1:
            self._kernel(activation, index_t, "activation", vec)(
                queue, (self.layout[1] * group,), (group,), *sizes, *call_args)
            return
        grid, local = (self.chunks * group, self.layout[1]), (group, 1)
        sizes.append(index_np(self.chunk_len))
        self._kernel(activation, index_t, "partial", vec)(queue, grid, local, *sizes, *x_args,
                                                           self.partials.buffer)
        self._kernel(activation, index_t, "apply", vec)(queue, grid, local, *sizes, *call_args,
                                                         self.partials.buffer)


class _BatchNormTrainBackward:
    """batchnorm_backward with activation_backward: dx, dscale, dbias of act(bn_train(x))."""
    replayable = False   # enqueues directly: FusionPlan.execute runs it every time

    def __init__(self, plan):
        self.plan = plan
        self.bn = None
        self.activation = None
        for op in plan.ops:
            if isinstance(op, BatchNormBackwardOp) and self.bn is None:
                self.bn = op
            elif isinstance(op, ActivationBackwardOp) and self.activation is None:
                self.activation = op
            else:
                raise UnsupportedError(f"op {op.index} ({op.describe()}) cannot be fused into a "
                                       f"batch-norm backward plan; {_chain_message()}")
        if self.bn is None:
            raise UnsupportedError(f"activation_backward alone is not a fusion; add a "
                                   f"batchnorm_backward op; {_chain_message()}")
        shape = plan.input_desc.shape
        if len(shape) < 2:
            raise ShapeError(f"the input must be (N, C, ...), got shape {shape}")
        self.layout = _bn_layout(shape, self.bn.mode)
        self.param_size = self.layout[1]
        self.output_desc = TensorDesc(shape, float32)
        self.set_chunks(_bn_chunks(plan.ctx, self.layout))
        self._prebuild(activation_desc(self.activation.mode) if self.activation else
                       ActivationDesc(Activation.PASTHRU))

    widest = 4
    set_chunks = _BatchNormTrainForward.set_chunks
    set_vector_width = _BatchNormTrainForward.set_vector_width
    _prebuild = _BatchNormTrainForward._prebuild

    def _kernel(self, activation, index_t, step, vec=1):
        return _bn_train_kernel(self.plan.ctx, f"bn_train_backward_{step}", activation, index_t,
                                vec)

    def run(self, dy, dx, args):
        values = args.get(self.bn)
        activation = (args.get(self.activation)["activation"] if self.activation
                      else ActivationDesc(Activation.PASTHRU))
        x = values["x"]
        if x.shape != dy.shape:
            raise ShapeError(f"batchnorm_backward: x has shape {x.shape}, dy has {dy.shape}")
        names = ("scale", "bias", "saved_mean", "saved_inv_variance", "scale_diff", "bias_diff")
        params = [values[k] for k in names]
        for name, t in zip(names, params):
            if t.size != self.param_size:
                raise ShapeError(f"batchnorm_backward: {name} has {t.size} elements, expected "
                                 f"{self.param_size} ({self.bn.mode})")
        check_same_context(dy, dx, x, *params)
        index_t, index_np = _index_type(dy, dx, x, *params)
        sizes = [index_np(v) for v in self.layout]
        buffers = {}
        for name, t in zip(("x", "dy", "dx") + names, [x, dy, dx] + params):
            buffers[name] = [t.buffer, index_np(t.offset_elements)]
        queue, group = self.plan.ctx.queue, _bn_group_size(self.plan.ctx)
        vec = _bn_vector_width(self.layout, self.chunk_len, (x, dy, dx), self.widest)
        apply_args = [a for name in ("x", "dy", "dx") + names for a in buffers[name]]
        if self.chunks == 1:
            self._kernel(activation, index_t, "activation", vec)(
                queue, (self.layout[1] * group,), (group,), *sizes, *apply_args)
            return
        grid, local = (self.chunks * group, self.layout[1]), (group, 1)
        sizes.append(index_np(self.chunk_len))
        partial_args = [a for name in ("x", "dy") + names[:4] for a in buffers[name]]
        self._kernel(activation, index_t, "partial", vec)(queue, grid, local, *sizes,
                                                           *partial_args, self.partials.buffer)
        self._kernel(activation, index_t, "apply", vec)(queue, grid, local, *sizes, *apply_args,
                                                         self.partials.buffer)


class _ConvChain:
    """conv [bias | BN inference]* [activation]: the convolution kernel's own epilogue."""
    replayable = True   # every enqueue goes through dlprim_py.launch

    def __init__(self, plan):
        self.plan = plan
        ops = plan.ops
        self.conv_op = ops[0]
        self.affine_ops = []
        self.activation = None
        for op in ops[1:]:
            if self.activation is not None:
                raise UnsupportedError(
                    f"op {op.index} ({op.describe()}) follows the activation "
                    f"(op {self.activation.index}); the convolution's epilogue ends with the "
                    f"activation; {_chain_message()}")
            if isinstance(op, (BiasForwardOp, BatchNormInferenceOp)):
                self.affine_ops.append(op)
            elif isinstance(op, ActivationForwardOp):
                self.activation = op
            else:
                raise UnsupportedError(f"op {op.index} ({op.describe()}) cannot follow a "
                                       f"convolution in one kernel; {_chain_message()}")
        x_shape = plan.input_desc.shape
        w_desc = self.conv_op.weight_desc
        if len(x_shape) != 4:
            raise ShapeError(f"a convolution plan takes an NCHW input, got shape {x_shape}")
        if w_desc.dtype != float32:
            raise DTypeError(f"op 0: weights must be float32, got {w_desc.dtype}")
        if len(w_desc.shape) != 4:
            raise ShapeError(f"op 0 ({self.conv_op.describe()}): weights must be (K, C/groups, R, S), "
                             f"got shape {w_desc.shape}")
        groups = self.conv_op.conv_desc.groups
        channels = x_shape[1]
        if channels % groups or w_desc.shape[1] * groups != channels:
            raise ShapeError(f"op 0 ({self.conv_op.describe()}): weights take {w_desc.shape[1]} "
                             f"channels per group x {groups} groups = {w_desc.shape[1] * groups}, "
                             f"the input has {channels} channels")
        if w_desc.shape[0] % groups:
            raise ShapeError(f"op 0 ({self.conv_op.describe()}): {w_desc.shape[0]} output channels "
                             f"are not divisible by {groups} groups")
        from .ops.conv import Convolution
        self.convolution = Convolution(plan.ctx, plan.input_desc, w_desc, self.conv_op.conv_desc)
        y_shape = tuple(self.convolution.output_desc.shape)
        self.output_desc = TensorDesc(y_shape, float32)
        k = y_shape[1]
        self.param_shapes = {}
        # A per-activation batch norm varies over (k, oh, ow): the epilogue computes that link
        # per output position instead of per channel.
        self.per_position = False
        for op in self.affine_ops:
            if isinstance(op, BiasForwardOp):
                _check_param_desc(op, op.bias_desc, "bias", k, y_shape[2:], False)
                self.param_shapes[op] = (k,)
            else:
                per_activation = op.mode == BN_PER_ACTIVATION
                _check_param_desc(op, op.bn_desc, "batch-norm", k, y_shape[2:], per_activation)
                self.param_shapes[op] = (k,) + (tuple(y_shape[2:]) if per_activation else ())
                self.per_position |= per_activation
        has_bn = any(isinstance(op, BatchNormInferenceOp) for op in self.affine_ops)
        biases = [op for op in self.affine_ops if isinstance(op, BiasForwardOp)]
        # One bias alone is the epilogue's shift as it is; a batch norm (or several biases) is
        # a chain whose scale and shift the convolution's kernel computes from the parameters
        # (kernels/fusion_fold.cl.mako), per channel or per output position.
        self.chain = ()
        if has_bn or len(biases) > 1:
            self.chain = tuple(("bias" if isinstance(op, BiasForwardOp) else "bn",
                                len(self.param_shapes[op]) > 1) for op in self.affine_ops)
        # The selector's choice (DLPRIM_CONV_ALGO, find-db or the immediate rule) first, then
        # the other applicable algorithms in the immediate rule's order.
        from .ops.conv.selection import choose
        names = list(self.convolution.algorithms("forward"))
        if not names:
            raise UnsupportedError(f"no convolution algorithm applies to {self.conv_op.describe()}")
        chosen = choose(plan.ctx, self.convolution.problem, "forward")
        self.algorithms = [chosen] + [n for n in names if n != chosen]
        self.set_algorithm(self.algorithms[0])

    def _epilogue(self, activation):
        from .ops.conv.algorithms import Epilogue
        if activation is not None and activation.is_identity:
            activation = None
        return Epilogue(False, bool(self.affine_ops) and not self.chain, False, activation,
                        False, self.chain)

    def _prepare(self, activation):
        """Build the convolution kernel with this chain's epilogue (what forward will ask for)."""
        from .ops.conv.selection import algorithm
        algorithm(self.algorithm).prepare(self.plan.ctx, self.convolution.problem, "forward",
                                          self._epilogue(activation))

    def algorithm_names(self):
        return [_algorithm_name(a) for a in self.algorithms]

    def _find_algorithm(self, algo):
        for a in self.algorithms:
            if a is algo or _algorithm_name(a) == algo or _algorithm_name(a) == _algorithm_name(algo):
                return a
        raise UnsupportedError(f"convolution algorithm {algo!r} does not apply to this plan; "
                               f"applicable: {', '.join(self.algorithm_names())}")

    def set_algorithm(self, algo):
        self.algorithm = self._find_algorithm(algo)
        self._allocate_workspace()
        self._prepare(activation_desc(self.activation.mode) if self.activation else None)

    def workspace_size(self, algo=None):
        algorithm = self.algorithm if algo is None else self._find_algorithm(algo)
        return int(self.convolution.workspace_size(algorithm, "forward"))

    def _allocate_workspace(self):
        size = self.workspace_size()
        self.workspace = (Tensor(self.plan.ctx, allocate(self.plan.ctx, size), (size // 4,))
                          if size else None)

    def run(self, x, y, args):
        conv_args = args.get(self.conv_op)
        w = conv_args["w"]
        if w.shape != self.conv_op.weight_desc.shape:
            raise ShapeError(f"conv weights have shape {w.shape}, the descriptor says "
                             f"{self.conv_op.weight_desc.shape}")
        if w.ctx.cl_context != self.plan.ctx.cl_context:
            raise DeviceError("the conv weights live in another OpenCL context than the plan")
        shift, chain_args = None, ()
        if self.chain:
            # The convolution's kernel reads the chain's parameters on every run (a replay
            # included): new contents of the same tensors are honoured, as MIOpen promises.
            chain_args = _chain_parameters(self.plan, self.affine_ops, self.param_shapes, args)
        elif self.affine_ops:
            op = self.affine_ops[0]
            bias = args.get(op)["bias"]
            _check_param_tensor(op, bias, "bias", self.param_shapes[op])
            shift = _param_view(bias, self.param_shapes[op])
        activation = args.get(self.activation)["activation"] if self.activation else None
        self.convolution.forward(x, w, y, alpha=conv_args["alpha"], beta=conv_args["beta"],
                                 activation=activation, algo=self.algorithm,
                                 workspace=self.workspace, shift=shift, chain=self.chain,
                                 chain_args=chain_args)

    def algorithm_object(self):
        from .ops.conv.selection import algorithm
        return algorithm(self.algorithm)


class _HorizontalConvs:
    """Sibling convolutions of one input (HORIZONTAL; MIOpen refuses these plans): each conv
    may be followed by its own bias, one activation may end the plan and applies to every
    branch. The output is the branches' outputs concatenated along channels, in op order,
    computed as one convolution over the concatenated weights (and biases), i.e. a vertical
    conv [bias] [activation] plan whose weights this runner assembles before each call."""
    replayable = False   # enqueues directly: FusionPlan.execute runs it every time

    def __init__(self, plan):
        self.plan = plan
        self.branches = []          # [conv op, bias op or None]
        self.activation = None
        for op in plan.ops:
            if self.activation is not None:
                raise UnsupportedError(f"op {op.index} ({op.describe()}) follows the activation "
                                       f"that ends a horizontal plan; {_HORIZONTAL_MESSAGE}")
            if isinstance(op, ConvForwardOp):
                self.branches.append([op, None])
            elif isinstance(op, BiasForwardOp) and self.branches and self.branches[-1][1] is None:
                self.branches[-1][1] = op
            elif isinstance(op, ActivationForwardOp) and self.branches:
                self.activation = op
            else:
                raise UnsupportedError(f"op {op.index} ({op.describe()}) cannot be fused "
                                       f"horizontally; {_HORIZONTAL_MESSAGE}")
        first = self.branches[0][0]
        geometry = _conv_geometry(first)
        for conv, _ in self.branches[1:]:
            if _conv_geometry(conv) != geometry:
                raise UnsupportedError(
                    f"op {conv.index} ({conv.describe()}) differs from op {first.index} "
                    f"({first.describe()}) in kernel size, channels or geometry: horizontal "
                    f"branches must share all but their output channels; {_HORIZONTAL_MESSAGE}")
        if first.conv_desc.groups != 1:
            raise UnsupportedError(f"op {first.index}: horizontal fusion takes ungrouped "
                                   f"convolutions, got groups={first.conv_desc.groups}; "
                                   f"{_HORIZONTAL_MESSAGE}")
        self.channels = [conv.weight_desc.shape[0] for conv, _ in self.branches]
        total = sum(self.channels)
        w_shape = (total,) + tuple(first.weight_desc.shape[1:])
        self.inner = FusionPlan(plan.ctx, VERTICAL, plan.input_desc)
        self.inner_conv = self.inner.create_op_conv_forward(first.conv_desc, TensorDesc(w_shape))
        self.has_bias = any(bias is not None for _, bias in self.branches)
        for conv, bias in self.branches:
            if bias is not None:
                k = conv.weight_desc.shape[0]
                _check_param_desc(bias, bias.bias_desc, "bias", k, (1, 1), False)
        self.inner_bias = (self.inner.create_op_bias_forward(TensorDesc((1, total, 1, 1)))
                           if self.has_bias else None)
        self.inner_activation = (self.inner.create_op_activation_forward(self.activation.mode)
                                 if self.activation else None)
        self.inner.compile()
        self.output_desc = self.inner.output_desc
        self.weights = Tensor.empty(plan.ctx, w_shape)
        # Branches without a bias contribute zeros, written once.
        self.bias = Tensor.zeros(plan.ctx, (total,)) if self.has_bias else None

    def run(self, x, y, args):
        import pyopencl as cl
        queue = self.plan.ctx.queue
        inner_args = OperatorArgs()
        row = 0
        per_k = math.prod(self.weights.shape[1:])
        alphas = set()
        for (conv, bias), k in zip(self.branches, self.channels):
            values = args.get(conv)
            w = values["w"]
            if w.shape != conv.weight_desc.shape:
                raise ShapeError(f"op {conv.index}: weights have shape {w.shape}, the descriptor "
                                 f"says {conv.weight_desc.shape}")
            alphas.add((values["alpha"], values["beta"]))
            cl.enqueue_copy(queue, self.weights.buffer, w.buffer, byte_count=w.nbytes,
                            src_offset=w.offset, dst_offset=self.weights.offset + row * per_k * 4)
            if bias is not None:
                b = args.get(bias)["bias"]
                _check_param_tensor(bias, b, "bias", (k,))
                cl.enqueue_copy(queue, self.bias.buffer, b.buffer, byte_count=b.nbytes,
                                src_offset=b.offset, dst_offset=self.bias.offset + row * 4)
            row += k
        if len(alphas) != 1:
            raise UnsupportedError(f"horizontal branches must share alpha and beta, got {alphas}")
        alpha, beta = alphas.pop()
        inner_args.set_conv_forward(self.inner_conv, alpha, beta, self.weights)
        if self.inner_bias is not None:
            inner_args.set_bias_forward(self.inner_bias, 1.0, 0.0, self.bias)
        if self.inner_activation is not None:
            act = args.get(self.activation)["activation"]
            inner_args.set_activation_forward(self.inner_activation, 1.0, 0.0, act.alpha,
                                              act.beta, act.gamma)
        self.inner.runner.run(x, y, inner_args)


_HORIZONTAL_MESSAGE = ("a horizontal plan is sibling convolutions of one input, each optionally "
                       "followed by its bias, and optionally one activation last; "
                       + _chain_message())


def _conv_geometry(conv):
    d = conv.conv_desc
    return (tuple(conv.weight_desc.shape[1:]), d.padding, d.stride, d.dilation, d.groups)


def _algorithm_name(algo):
    return algo if isinstance(algo, str) else getattr(algo, "name", str(algo))


# ---- MIOpen's one-call fused forward ---------------------------------------------------------

def conv_bias_activation(x, w, bias=None, z=None, alpha1=1.0, alpha2=0.0, activation="relu", *,
                         stride=1, padding=0, dilation=1, groups=1, conv_desc=None, out=None,
                         algo=None):
    """``act(alpha1 * conv2d(x, w) + alpha2 * z + bias)`` in one kernel, like MIOpen's
    miopenConvolutionBiasActivationForward (the residual add of ResNet when z is given).

    x: (N, C, H, W); w: (K, C/groups, R, S); bias: (K,) or None; z: (N, K, Ho, Wo) or None;
    all float32 NCHW. ``activation``: None, a name (torch's or MIOpen's) or an ActivationDesc.
    ``conv_desc`` (a dp.ConvolutionDesc) replaces stride/padding/dilation/groups.
    Returns ``out`` (allocated when None), shape (N, K, Ho, Wo).
    """
    from .activation import as_activation
    from .ops.conv import Convolution
    from .ops.conv.problem import ConvolutionDesc
    for name, t, optional in (("x", x, False), ("w", w, False), ("bias", bias, True),
                              ("z", z, True), ("out", out, True)):
        _check_tensor(t, name, optional)
    ctx = check_same_context(x, w, bias, z, out)
    if conv_desc is None:
        conv_desc = ConvolutionDesc(padding=padding, stride=stride, dilation=dilation, groups=groups)
    act = as_activation(activation)
    memo_key = ("fusion.conv_bias_activation", x.shape, w.shape, conv_desc.padding,
                conv_desc.stride, conv_desc.dilation, conv_desc.groups)
    convolution = ctx.memo.get(memo_key)
    if convolution is None:
        convolution = ctx.memo[memo_key] = Convolution(ctx, x.desc, w.desc, conv_desc)
    y_shape = tuple(convolution.output_desc.shape)
    k = y_shape[1]
    if bias is not None and bias.size != k:
        raise ShapeError(f"bias has shape {bias.shape}, expected ({k},) for {k} output channels")
    if z is not None and z.shape != y_shape:
        raise ShapeError(f"z has shape {z.shape}, expected the output shape {y_shape}")
    if out is None:
        out = Tensor.empty(ctx, y_shape)
    elif out.shape != y_shape:
        raise ShapeError(f"out has shape {out.shape}, expected {y_shape}")
    log_command("CBAInfer", {"n": x.shape[0], "c": x.shape[1], "H": x.shape[2], "W": x.shape[3],
                             "k": k, "y": w.shape[2], "x": w.shape[3],
                             "p": conv_desc.padding[0], "q": conv_desc.padding[1],
                             "u": conv_desc.stride[0], "v": conv_desc.stride[1],
                             "l": conv_desc.dilation[0], "j": conv_desc.dilation[1],
                             "g": conv_desc.groups, "b": int(bias is not None),
                             "z": int(z is not None),
                             "activation": act.mode.name if act is not None else "none"})
    with autograd.no_grad():
        convolution.forward(x, w, out, alpha=float(alpha1), beta=0.0, activation=act, algo=algo,
                            shift=None if bias is None else _param_view(bias, (k,)),
                            residual=z, residual_alpha=float(alpha2))
    return out


__all__ = [
    "FusionPlan", "OperatorArgs", "VERTICAL", "HORIZONTAL", "BN_SPATIAL", "BN_PER_ACTIVATION",
    "SUPPORTED_CHAINS", "conv_bias_activation", "activation_desc",
] + [name for name in dir() if name.startswith("ACTIVATION_")]
