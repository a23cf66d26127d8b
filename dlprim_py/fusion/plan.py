"""The fusion plan (MIOpen's miopenFusionPlanDescriptor_t) and the "fusion" solver family.

``compile`` describes the chain as a frozen ``FusionProblem`` and asks the solver layer for the
fused solver that computes it (``DLPRIM_FUSION_ALGO=<solver>`` forces one): each solver says
from the ops alone whether the chain is one it fuses. A chain that none fuses is refused with
the reason of the solver that matched the longest part of it (the op that breaks the chain).
Whatever the solver, ``execute`` records its enqueues once per set of arguments and tensors and
replays them afterwards.
"""

import numpy as np

from .. import autograd, config, solver
from ..context import Context, check_same_context
from ..dtypes import float32
from ..errors import DeviceError, DlprimError, DTypeError, ShapeError, UnsupportedError
from ..launch import Recording
from ..logcmd import log_command, quiet
from .batchnorm import BatchNormTrainBackward, BatchNormTrainForward
from .conv import ConvChain, HorizontalConvs
from .ops import (HORIZONTAL, VERTICAL, ActivationBackwardOp, ActivationForwardOp,
                  BatchNormBackwardOp, BatchNormForwardOp, BatchNormInferenceOp, BiasForwardOp,
                  ConvForwardOp, FusionProblem, OperatorArgs, as_desc, chain_message, check_tensor)
from .pointwise import PointwiseChain


FAMILY = solver.register(solver.Family(
    "fusion", [PointwiseChain(), ConvChain(), HorizontalConvs(), BatchNormTrainForward(),
               BatchNormTrainBackward()], title="fused solver"))


def choose(ctx, problem):
    """The fused solver for ``problem`` (``solver.select``); UnsupportedError naming the op
    that breaks the chain where no solver fuses it."""
    refusals = [FAMILY.solvers[name].refusal(problem) for name in FAMILY.solvers]
    if all(refusal is not None for refusal in refusals):
        # The solver that followed the chain furthest says why it breaks (the family's order
        # between equals).
        index, message = max(refusals, key=lambda r: r[0])
        raise UnsupportedError(message)
    return solver.select(ctx, "fusion", problem)


class FusionPlan:
    """A chain of operators on one input, compiled into one kernel (MIOpen's fusion plan).

    ``direction``: ``fusion.VERTICAL`` (each op consumes the previous op's output).
    ``fusion.HORIZONTAL``: sibling convolutions of the input (each optionally followed by its
    bias, optionally one activation last), output concatenated along channels, which MIOpen
    refuses; other horizontal plans raise UnsupportedError at ``compile``. ``input_desc``: the
    NCHW float32 input (``dp.TensorDesc``).

    After ``compile``, ``runner`` is the prepared fused solver and ``solver`` the solver.
    """

    def __init__(self, ctx, direction, input_desc):
        if not isinstance(ctx, Context):
            raise DeviceError(f"expected a dlprim_py.Context, got {type(ctx).__name__}")
        if direction not in (VERTICAL, HORIZONTAL):
            raise UnsupportedError(f"direction must be fusion.VERTICAL or fusion.HORIZONTAL, "
                                   f"got {direction!r}")
        self.ctx = ctx
        self.direction = direction
        self.input_desc = as_desc(input_desc, "input descriptor")
        if self.input_desc.dtype != float32:
            raise DTypeError(f"fusion plans take float32 tensors, got {self.input_desc.dtype}")
        self.ops = []
        self.output_desc = None
        self.runner = None
        self.solver = None
        self._bound = None   # (args, key, Plan) of the last recorded execute, see execute()
        self._repeat = None   # what a call must pass again to skip the checks, see execute()

    # ---- building the chain --------------------------------------------------------------

    def _add(self, cls, *args):
        if self.runner is not None:
            raise DlprimError("the plan is compiled: create a new plan to add operators")
        op = cls(self, len(self.ops), *args)
        self.ops.append(op)
        return op

    def create_op_conv_forward(self, conv_desc, w_desc):
        """Append a convolution (``ConvolutionDesc``, the weights' ``TensorDesc``); it comes
        first."""
        return self._add(ConvForwardOp, conv_desc, w_desc)

    def create_op_bias_forward(self, b_desc):
        """Append a per-channel bias of shape (1, C, 1, 1) or (C,)."""
        return self._add(BiasForwardOp, b_desc)

    def create_op_batchnorm_inference(self, mode, bn_desc):
        """Append a batch norm with estimated statistics (mode ``BN_SPATIAL`` or
        ``BN_PER_ACTIVATION``)."""
        return self._add(BatchNormInferenceOp, mode, bn_desc)

    def create_op_activation_forward(self, mode):
        """Append an activation (an ``ACTIVATION_*`` mode; its parameters come with the
        arguments)."""
        return self._add(ActivationForwardOp, mode)

    def create_op_batchnorm_forward(self, mode, running_mean_variance=True):
        """Append a batch norm in training mode (batch statistics; running averages updated
        when ``running_mean_variance``)."""
        return self._add(BatchNormForwardOp, mode, running_mean_variance)

    def create_op_batchnorm_backward(self, mode):
        """Append the backward of a training batch norm."""
        return self._add(BatchNormBackwardOp, mode)

    def create_op_activation_backward(self, mode):
        """Append the backward of an activation."""
        return self._add(ActivationBackwardOp, mode)

    def get_op(self, index):
        """The op at ``index`` in insertion order; DlprimError when out of range."""
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.ops):
            raise DlprimError(f"op index {index!r} out of range: the plan has {len(self.ops)} ops")
        return self.ops[index]

    # ---- compiling -----------------------------------------------------------------------

    def describe(self):
        """The chain as text: the ops' descriptions joined by arrows."""
        return " -> ".join(op.describe() for op in self.ops) or "(empty)"

    def problem(self):
        """The chain as the solver layer sees it (a ``FusionProblem``)."""
        return FusionProblem(self.direction, tuple(self.input_desc.shape),
                             tuple(op.spec() for op in self.ops))

    def compile(self):
        """Check the chain and the descriptors, choose the fused solver and build its kernels.
        Raises UnsupportedError for a chain that does not fuse (naming the op that breaks it),
        ShapeError for descriptors that disagree."""
        if not self.ops:
            raise UnsupportedError(f"the plan has no operators; {chain_message()}")
        problem = self.problem()
        chosen = choose(self.ctx, problem)
        runner = chosen.prepare(self.ctx, problem)
        if hasattr(runner, "on_change"):
            runner.on_change = self._forget_recording
        self.output_desc = runner.output_desc
        self.solver, self.runner = chosen, runner
        self._bound = self._repeat = None
        return self

    def _compiled(self):
        if self.runner is None:
            raise DlprimError("compile() the plan before this call")
        return self.runner

    def _conv_runner(self):
        conv = getattr(self._compiled(), "conv_chain", None)
        if conv is None:
            raise UnsupportedError("the plan has no convolution")
        return conv

    def conv_algorithms(self, request_count=None):
        """The convolution algorithms that run this plan's chain in one kernel, by priority
        (the first is used unless ``set_conv_algorithm`` picks another)."""
        names = self._conv_runner().algorithm_names()
        return names if request_count is None else names[:int(request_count)]

    def set_conv_algorithm(self, algo):
        """Run the chain with ``algo``, one of ``conv_algorithms()``."""
        self._conv_runner().set_algorithm(algo)
        self._forget_recording()

    def _forget_recording(self):
        """The next execute runs the solver again (a setting of its changed)."""
        self._bound = self._repeat = None

    def workspace_size(self, algo=None):
        """Bytes of workspace the plan uses (the plan allocates it itself)."""
        conv = getattr(self._compiled(), "conv_chain", None)
        return 0 if conv is None else conv.workspace_size(algo)

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
        input_desc = as_desc(input_desc, "input descriptor")
        output_desc = as_desc(output_desc, "output descriptor")
        if input_desc != self.input_desc:
            raise ShapeError(f"execute: input descriptor {input_desc} differs from the plan's "
                             f"{self.input_desc}")
        if output_desc != self.output_desc:
            raise ShapeError(f"execute: output descriptor {output_desc} differs from the plan's "
                             f"{self.output_desc}")
        check_tensor(x, "x")
        check_tensor(y, "y")
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
        # A plan runs layer after layer on the same tensors: the second call with the same x, y
        # and unchanged args replays the recorded enqueues instead of running the solver again,
        # which is most of a call's host time. The tensors' contents are read afresh by every
        # replay, as MIOpen's arguments promise. A run that enqueues copies (horizontal plans)
        # cannot be rebound: it runs again on every call.
        operands = [x.buffer, y.buffer]
        key = (x.offset_elements, y.offset_elements, args.version, x.buffer == y.buffer)
        bound = self._bound
        if bound is None or bound[0] is not args or bound[1] != key:
            self._bound = None
            values = [args.get(op) for op in self.ops]
            with autograd.no_grad(), quiet(), Recording() as recording:
                runner.run(x, y, values)
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
