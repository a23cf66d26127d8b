"""Training batch norm with an activation, forward and backward (MIOpen's
BnFwdTrgActivationFused / BnBwdTrgActivationFused): the library's one training batch norm
(``dlprim_py.ops.norm``) with the activation passed in, so the fusion plans and
``F.batch_norm`` run the same kernels."""
import math

from ..activation import Activation, ActivationDesc
from ..context import check_same_context
from ..dtypes import float32
from ..errors import ShapeError
from ..ops import norm
from ..tensor import TensorDesc
from .ops import VERTICAL, FusedSolver, activation_of, chain_message


def _bn_layout(shape):
    """(N, C, S) of an (N, C, *spatial) input in spatial mode."""
    if len(shape) < 2:
        raise ShapeError(f"the input must be (N, C, ...), got shape {shape}")
    return shape[0], shape[1], math.prod(shape[2:])


class _TrainRun:
    """What the forward and backward runs share: the plan's (N, C, S), the per-channel
    parameter size, and the split and load width tests may force."""

    def __init__(self, ctx, problem, bn, activation):
        self.ctx = ctx
        self.bn = bn
        self.activation = activation
        n, c, s = _bn_layout(problem.input_shape)
        self.param_size = c * s if bn.mode == "per_activation" else c
        self.output_desc = TensorDesc(problem.input_shape, float32)
        count = n if bn.mode == "per_activation" else n * s
        if count == 1:
            # What torch refuses ("Expected more than 1 value per channel when training"), and
            # F.batch_norm with it: refused when the plan is compiled.
            raise ShapeError(f"op {bn.index} ({bn.describe()}): training batch norm expected "
                             f"more than one value per channel, got input shape "
                             f"{problem.input_shape}")
        self.chunks = None
        self.algorithm = None

    # Called when a setting changes: the plan drops the enqueues it recorded with the old one.
    on_change = None

    def set_chunks(self, chunks):
        """Split each channel into ``chunks`` work groups (None: the reduction solver's
        choice, tuning_db/norm.json)."""
        self.chunks = None if chunks is None else int(chunks)
        if self.on_change is not None:
            self.on_change()

    def set_vector_width(self, widest):
        """At most ``widest`` (4 or 1) elements per load: 1 takes the scalar-load reduction
        (groups_scalar) where the channels are reduced by work groups."""
        self.algorithm = "groups_scalar" if int(widest) < 4 else None
        if self.on_change is not None:
            self.on_change()

    def _algorithm(self, shape):
        # Per-activation statistics (S == 1 per channel) keep the solver's choice: their loads
        # are scalar already.
        if self.algorithm is not None and (self.bn.mode == "per_activation"
                                           or math.prod(shape[2:]) == 1):
            return None
        return self.algorithm

    def _activation(self, values):
        return (activation_of(self.activation, values) if self.activation
                else ActivationDesc(Activation.PASTHRU))

    def _check_sizes(self, names, tensors, what):
        for name, t in zip(names, tensors):
            if t is not None and t.size != self.param_size:
                raise ShapeError(f"{what}: {name} has {t.size} elements, expected "
                                 f"{self.param_size} ({self.bn.mode})")


class BatchNormTrainForward(FusedSolver):
    """``batchnorm_forward [activation]``: statistics, saved mean and inverse std, running
    averages, normalisation and activation."""
    name = "batchnorm_train_forward"

    def refusal(self, problem):
        if problem.direction != VERTICAL:
            return -1, "training batch norm is a vertical plan"
        ops = problem.ops
        if ops[0].kind != "batchnorm_forward":
            return 0, f"op 0 ({ops[0].describe()}) is not batchnorm_forward; {chain_message()}"
        activation = None
        for op in ops[1:]:
            if op.kind == "activation" and activation is None:
                activation = op
                continue
            return op.index, (f"op {op.index} ({op.describe()}) cannot follow "
                              f"{ops[op.index - 1].describe()} in a training batch-norm plan; "
                              f"{chain_message()}")
        return None

    def prepare(self, ctx, problem):
        ops = problem.ops
        return BatchNormTrainForwardRun(ctx, problem, ops[0], ops[1] if len(ops) > 1 else None)


class BatchNormTrainForwardRun(_TrainRun):

    def run(self, x, y, values):
        args = values[self.bn.index]
        names = ("scale", "bias", "saved_mean", "saved_inv_variance", "running_mean",
                 "running_variance")
        params = [args[k] for k in names]
        self._check_sizes(names, params, "batchnorm_forward")
        check_same_context(x, y, *params)
        norm.batch_norm_forward_training(
            x, y, args["scale"], args["bias"], args["running_mean"], args["running_variance"],
            args["saved_mean"], args["saved_inv_variance"], args["exp_avg_factor"],
            args["epsilon"], self.bn.mode, self._activation(values), self.chunks,
            self._algorithm(x.shape))


class BatchNormTrainBackward(FusedSolver):
    """``batchnorm_backward`` with ``activation_backward`` (either order): dx, dscale, dbias of
    act(batchnorm_train(x)); the activation's input is recomputed from x and the saved
    statistics."""
    name = "batchnorm_train_backward"

    def refusal(self, problem):
        if problem.direction != VERTICAL:
            return -1, "training batch norm is a vertical plan"
        bn = activation = None
        for op in problem.ops:
            if op.kind == "batchnorm_backward" and bn is None:
                bn = op
            elif op.kind == "activation_backward" and activation is None:
                activation = op
            else:
                return op.index, (f"op {op.index} ({op.describe()}) cannot be fused into a "
                                  f"batch-norm backward plan; {chain_message()}")
        if bn is None:
            return len(problem.ops), (f"activation_backward alone is not a fusion; add a "
                                      f"batchnorm_backward op; {chain_message()}")
        return None

    def prepare(self, ctx, problem):
        bn = next(op for op in problem.ops if op.kind == "batchnorm_backward")
        activation = next((op for op in problem.ops if op.kind == "activation_backward"), None)
        return BatchNormTrainBackwardRun(ctx, problem, bn, activation)


class BatchNormTrainBackwardRun(_TrainRun):

    def run(self, dy, dx, values):
        args = values[self.bn.index]
        x = args["x"]
        if x.shape != dy.shape:
            raise ShapeError(f"batchnorm_backward: x has shape {x.shape}, dy has {dy.shape}")
        names = ("scale", "bias", "saved_mean", "saved_inv_variance", "scale_diff", "bias_diff")
        self._check_sizes(names, [args[k] for k in names], "batchnorm_backward")
        check_same_context(dy, dx, x, *[args[k] for k in names])
        norm.batch_norm_backward(
            x, dy, dx, args["scale"], args["saved_mean"], args["saved_inv_variance"],
            args["scale_diff"], args["bias_diff"], self.bn.mode, True, self.chunks,
            args["bias"], self._activation(values), self._algorithm(x.shape))
