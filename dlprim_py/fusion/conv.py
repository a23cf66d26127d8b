"""Convolution chains: ``conv [bias | batchnorm_inference]* [activation]`` in the convolution's
own kernel (its epilogue), and sibling convolutions of one input fused horizontally."""
import math

import pyopencl as cl

from ..dtypes import float32
from ..errors import DeviceError, DTypeError, ShapeError, UnsupportedError
from ..launch import enqueue
from ..tensor import Tensor, TensorDesc
from .ops import (BN_PER_ACTIVATION, HORIZONTAL, VERTICAL, FusedSolver, FusionProblem, OpSpec,
                  activation_desc, activation_of, chain_message, chain_parameters,
                  check_param_desc, check_param_tensor, param_view)


class ConvChain(FusedSolver):
    """``conv [bias | batchnorm_inference]* [activation]``: the convolution kernel applies the
    epilogue ``act(alpha * acc * scale + shift) + beta * y_old`` for every algorithm. A bias
    alone is the shift; a batch norm (or several biases) is a chain whose scale and shift the
    kernel computes from the parameters (kernels/fusion_fold.cl.mako), per channel or, for a
    per-activation batch norm, per output position."""
    name = "conv_chain"

    def refusal(self, problem):
        if problem.direction != VERTICAL:
            return -1, "a convolution chain is a vertical plan"
        ops = problem.ops
        if ops[0].kind != "conv":
            return 0, f"op 0 ({ops[0].describe()}) is not a convolution; {chain_message()}"
        activation = None
        for op in ops[1:]:
            if activation is not None:
                return op.index, (f"op {op.index} ({op.describe()}) follows the activation "
                                  f"(op {activation.index}); the convolution's epilogue ends "
                                  f"with the activation; {chain_message()}")
            if op.kind == "activation":
                activation = op
            elif op.kind not in ("bias", "batchnorm_inference"):
                return op.index, (f"op {op.index} ({op.describe()}) cannot follow a "
                                  f"convolution in one kernel; {chain_message()}")
        return None

    def prepare(self, ctx, problem):
        return ConvChainRun(ctx, problem)


class ConvChainRun:
    """A compiled convolution chain: the ``Convolution`` of the plan's input and weights, run
    through ``Convolution.prepared`` with the chain as its epilogue (built at compile: no
    kernel without the epilogue is built)."""

    def __init__(self, ctx, problem):
        from ..ops.conv.api import Convolution
        self.ctx = ctx
        ops = problem.ops
        self.conv_op = conv = ops[0]
        self.affine_ops = [op for op in ops[1:] if op.kind != "activation"]
        self.activation = next((op for op in ops[1:] if op.kind == "activation"), None)
        x_shape = problem.input_shape
        w_desc = conv.desc
        if len(x_shape) != 4:
            raise ShapeError(f"a convolution plan takes an NCHW input, got shape {x_shape}")
        if w_desc.dtype != float32:
            raise DTypeError(f"op 0: weights must be float32, got {w_desc.dtype}")
        if len(w_desc.shape) != 4:
            raise ShapeError(f"op 0 ({conv.describe()}): weights must be (K, C/groups, R, S), "
                             f"got shape {w_desc.shape}")
        groups = conv.geometry[3]
        channels = x_shape[1]
        if channels % groups or w_desc.shape[1] * groups != channels:
            raise ShapeError(f"op 0 ({conv.describe()}): weights take {w_desc.shape[1]} "
                             f"channels per group x {groups} groups = {w_desc.shape[1] * groups}, "
                             f"the input has {channels} channels")
        if w_desc.shape[0] % groups:
            raise ShapeError(f"op 0 ({conv.describe()}): {w_desc.shape[0]} output channels "
                             f"are not divisible by {groups} groups")
        self.convolution = Convolution(ctx, TensorDesc(x_shape, float32), w_desc,
                                       conv.conv_desc(), prebuild=False)
        y_shape = tuple(self.convolution.output_desc.shape)
        self.output_desc = TensorDesc(y_shape, float32)
        k = y_shape[1]
        self.param_shapes = {}
        for op in self.affine_ops:
            if op.kind == "bias":
                check_param_desc(op, op.desc, "bias", k, y_shape[2:], False)
                self.param_shapes[op.index] = (k,)
            else:
                per_activation = op.mode == BN_PER_ACTIVATION
                check_param_desc(op, op.desc, "batch-norm", k, y_shape[2:], per_activation)
                self.param_shapes[op.index] = (k,) + (tuple(y_shape[2:]) if per_activation
                                                      else ())
        has_bn = any(op.kind == "batchnorm_inference" for op in self.affine_ops)
        biases = [op for op in self.affine_ops if op.kind == "bias"]
        # One bias alone is the epilogue's shift as it is; a batch norm (or several biases) is
        # a chain whose scale and shift the convolution's kernel computes from the parameters
        # (kernels/fusion_fold.cl.mako), per channel or per output position.
        self.chain = ()
        if has_bn or len(biases) > 1:
            self.chain = tuple(("bias" if op.kind == "bias" else "bn",
                                len(self.param_shapes[op.index]) > 1) for op in self.affine_ops)
        names = list(self.convolution.algorithms("forward"))
        if not names:
            raise UnsupportedError(f"no convolution algorithm applies to {conv.describe()}")
        self._runs = {}
        # The convolution's choice (DLPRIM_CONV_ALGO, find-db or the immediate rule) first,
        # then the other applicable algorithms in the immediate rule's order.
        first = self._prepared(None, self._default_activation())
        self.algorithms = [first.algorithm] + [n for n in names if n != first.algorithm]
        self.algorithm = first.algorithm
        self.conv_chain = self

    def _default_activation(self):
        return activation_desc(self.activation.mode) if self.activation else None

    def _epilogue(self, activation):
        from ..ops.conv.api import Epilogue
        if activation is not None and activation.is_identity:
            activation = None
        return Epilogue(False, bool(self.affine_ops) and not self.chain, False, activation,
                        False, self.chain)

    def _prepared(self, algo, activation):
        """The convolution prepared with algorithm ``algo`` (None: its choice) and this
        chain's epilogue ending in ``activation``, made once per pair."""
        key = (algo, None if activation is None else activation.key)
        run = self._runs.get(key)
        if run is None:
            run = self._runs[key] = self.convolution.prepared("forward",
                                                              self._epilogue(activation), algo)
        return run

    def algorithm_names(self):
        return list(self.algorithms)

    def _find_algorithm(self, algo):
        name = algo if isinstance(algo, str) else getattr(algo, "name", str(algo))
        if name not in self.algorithms:
            raise UnsupportedError(f"convolution algorithm {algo!r} does not apply to this plan; "
                                   f"applicable: {', '.join(self.algorithms)}")
        return name

    def set_algorithm(self, algo):
        self.algorithm = self._find_algorithm(algo)
        self._prepared(self.algorithm, self._default_activation())

    def workspace_size(self, algo=None):
        name = self.algorithm if algo is None else self._find_algorithm(algo)
        return int(self.convolution.workspace_size(name, "forward"))

    def run(self, x, y, values):
        from ..ops.conv.api import EpilogueArgs
        conv_args = values[self.conv_op.index]
        w = conv_args["w"]
        if w.shape != self.conv_op.desc.shape:
            raise ShapeError(f"conv weights have shape {w.shape}, the descriptor says "
                             f"{self.conv_op.desc.shape}")
        if w.ctx.cl_context != self.ctx.cl_context:
            raise DeviceError("the conv weights live in another OpenCL context than the plan")
        shift, chain_args = None, ()
        if self.chain:
            # The convolution's kernel reads the chain's parameters on every run (a replay
            # included): new contents of the same tensors are honoured, as MIOpen promises.
            chain_args = tuple(chain_parameters(self.ctx, self.affine_ops, self.param_shapes,
                                                values))
        elif self.affine_ops:
            op = self.affine_ops[0]
            bias = values[op.index]["bias"]
            check_param_tensor(op, bias, "bias", self.param_shapes[op.index])
            shift = param_view(bias, self.param_shapes[op.index])
        activation = activation_of(self.activation, values) if self.activation else None
        prepared = self._prepared(self.algorithm, activation)
        prepared.run(x, w, y, EpilogueArgs(shift=shift, alpha=conv_args["alpha"],
                                           beta=conv_args["beta"], chain_args=chain_args))


# ---- horizontal fusion -----------------------------------------------------------------------

HORIZONTAL_MESSAGE = ("a horizontal plan is sibling convolutions of one input, each optionally "
                      "followed by its bias, and optionally one activation last; "
                      + chain_message())


def _conv_geometry(conv):
    return (tuple(conv.desc.shape[1:]), *conv.geometry)


class HorizontalConvs(FusedSolver):
    """Sibling convolutions of one input (HORIZONTAL; MIOpen refuses these plans): each conv
    may be followed by its own bias, one activation may end the plan and applies to every
    branch. The output is the branches' outputs concatenated along channels, in op order,
    computed as one convolution chain over the concatenated weights (and biases)."""
    name = "horizontal_convs"

    def refusal(self, problem):
        if problem.direction != HORIZONTAL:
            return -1, "horizontal fusion needs a fusion.HORIZONTAL plan"
        branches, activation = [], None
        for op in problem.ops:
            if activation is not None:
                return op.index, (f"op {op.index} ({op.describe()}) follows the activation "
                                  f"that ends a horizontal plan; {HORIZONTAL_MESSAGE}")
            if op.kind == "conv":
                branches.append([op, None])
            elif op.kind == "bias" and branches and branches[-1][1] is None:
                branches[-1][1] = op
            elif op.kind == "activation" and branches:
                activation = op
            else:
                return op.index, (f"op {op.index} ({op.describe()}) cannot be fused "
                                  f"horizontally; {HORIZONTAL_MESSAGE}")
        first = branches[0][0]
        for conv, _ in branches[1:]:
            if _conv_geometry(conv) != _conv_geometry(first):
                return conv.index, (
                    f"op {conv.index} ({conv.describe()}) differs from op {first.index} "
                    f"({first.describe()}) in kernel size, channels or geometry: horizontal "
                    f"branches must share all but their output channels; {HORIZONTAL_MESSAGE}")
        if first.geometry[3] != 1:
            return first.index, (f"op {first.index}: horizontal fusion takes ungrouped "
                                 f"convolutions, got groups={first.geometry[3]}; "
                                 f"{HORIZONTAL_MESSAGE}")
        return None

    def prepare(self, ctx, problem):
        return HorizontalConvsRun(ctx, problem)


class HorizontalConvsRun:
    """A compiled horizontal plan: the branches' weights (and biases) copied into one weight
    tensor before each run of a convolution chain over them, built directly (conv [bias]
    [activation] on the concatenated channels)."""

    def __init__(self, ctx, problem):
        self.ctx = ctx
        self.branches = []          # [conv spec, bias spec or None]
        self.activation = None
        for op in problem.ops:
            if op.kind == "conv":
                self.branches.append([op, None])
            elif op.kind == "bias":
                self.branches[-1][1] = op
            else:
                self.activation = op
        first = self.branches[0][0]
        self.channels = [conv.desc.shape[0] for conv, _ in self.branches]
        total = sum(self.channels)
        w_shape = (total,) + tuple(first.desc.shape[1:])
        self.has_bias = any(bias is not None for _, bias in self.branches)
        for conv, bias in self.branches:
            if bias is not None:
                check_param_desc(bias, bias.desc, "bias", conv.desc.shape[0], (1, 1), False)
        # The vertical chain the branches become: conv, its bias, the activation.
        chain = [OpSpec(0, "conv", desc=TensorDesc(w_shape, float32), geometry=first.geometry)]
        if self.has_bias:
            chain.append(OpSpec(1, "bias", desc=TensorDesc((1, total, 1, 1), float32)))
        if self.activation is not None:
            chain.append(OpSpec(len(chain), "activation", self.activation.mode))
        self.chain_ops = tuple(chain)
        self.conv_chain = ConvChainRun(ctx, FusionProblem(VERTICAL, problem.input_shape,
                                                          self.chain_ops))
        self.output_desc = self.conv_chain.output_desc
        self.weights = Tensor.empty(ctx, w_shape)
        # Branches without a bias contribute zeros, written once.
        self.bias = Tensor.zeros(ctx, (total,)) if self.has_bias else None

    def run(self, x, y, values):
        queue = self.ctx.queue
        row = 0
        per_k = math.prod(self.weights.shape[1:])
        alphas = set()
        for (conv, bias), k in zip(self.branches, self.channels):
            args = values[conv.index]
            w = args["w"]
            if w.shape != conv.desc.shape:
                raise ShapeError(f"op {conv.index}: weights have shape {w.shape}, the descriptor "
                                 f"says {conv.desc.shape}")
            alphas.add((args["alpha"], args["beta"]))
            # Copies, not kernels: a recording of this run replays but does not rebind.
            enqueue(lambda w=w, row=row: cl.enqueue_copy(
                queue, self.weights.buffer, w.buffer, byte_count=w.nbytes, src_offset=w.offset,
                dst_offset=self.weights.offset + row * per_k * 4))
            if bias is not None:
                b = values[bias.index]["bias"]
                check_param_tensor(bias, b, "bias", (k,))
                enqueue(lambda b=b, row=row: cl.enqueue_copy(
                    queue, self.bias.buffer, b.buffer, byte_count=b.nbytes, src_offset=b.offset,
                    dst_offset=self.bias.offset + row * 4))
            row += k
        if len(alphas) != 1:
            raise UnsupportedError(f"horizontal branches must share alpha and beta, got {alphas}")
        alpha, beta = alphas.pop()
        chain_values = [dict(alpha=alpha, beta=beta, w=self.weights)]
        if self.has_bias:
            chain_values.append(dict(bias=self.bias))
        if self.activation is not None:
            chain_values.append(values[self.activation.index])
        self.conv_chain.run(x, y, chain_values)
