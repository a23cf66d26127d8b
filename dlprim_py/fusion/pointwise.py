"""The pointwise chain: bias / batch-norm inference / activation ops without a convolution, in
one kernel."""
import math

import numpy as np

from .. import program
from ..context import check_same_context
from ..dtypes import float32
from ..errors import ShapeError
from ..launch import BoundKernel
from ..tensor import TensorDesc
from .ops import (BN_PER_ACTIVATION, VERTICAL, FusedSolver, activation_of, chain_message,
                  chain_parameters, check_param_desc, check_param_tensor, param_view)

POINTWISE_KINDS = ("bias", "batchnorm_inference", "activation")


class PointwiseChain(FusedSolver):
    """``[bias | batchnorm_inference | activation]+``: one pass of float4 packets when every
    parameter is per channel and the activation comes last (kernels/fusion_fold.cl.mako),
    else the pointwise generator with the parameters broadcast."""
    name = "pointwise_chain"

    def refusal(self, problem):
        """None where the chain fuses, else (index of the op that breaks it, why)."""
        if problem.direction != VERTICAL:
            return -1, "a pointwise chain is a vertical plan"
        first = problem.ops[0]
        for op in problem.ops:
            if op.kind not in POINTWISE_KINDS:
                return op.index, (f"op {op.index} ({op.describe()}) cannot follow "
                                  f"{first.describe()} in one kernel; {chain_message()}")
        return None

    def prepare(self, ctx, problem):
        return PointwiseChainRun(ctx, problem)


class PointwiseChainRun:
    """A compiled pointwise chain: ``run(x, y, values)`` enqueues it."""

    widest = 4   # elements per packet at most; set_vector_width(1) forces scalar packets (tests)
    # Called when a setting changes: the plan drops the enqueues it recorded with the old one.
    on_change = None

    def __init__(self, ctx, problem):
        self.ctx = ctx
        self.problem = problem
        shape = problem.input_shape
        if len(shape) < 2:
            raise ShapeError(f"the input must be (N, C, ...), got shape {shape}")
        channels = shape[1]
        ops = problem.ops
        self.param_shapes = {}
        for op in ops:
            if op.kind == "bias":
                check_param_desc(op, op.desc, "bias", channels, shape[2:], False)
                self.param_shapes[op.index] = (1, channels) + (1,) * (len(shape) - 2)
            elif op.kind == "batchnorm_inference":
                per_activation = op.mode == BN_PER_ACTIVATION
                check_param_desc(op, op.desc, "batch-norm", channels, shape[2:], per_activation)
                self.param_shapes[op.index] = ((1,) + tuple(shape[1:]) if per_activation else
                                               (1, channels) + (1,) * (len(shape) - 2))
        self.output_desc = TensorDesc(shape, float32)
        self.kernels = {}
        # Every parameter per channel and the activation (if any) last: one pass of float4
        # packets, the chain recomputed per packet (kernels/fusion_fold.cl.mako); otherwise
        # the pointwise generator with the parameters broadcast.
        kinds = [op.kind for op in ops]
        self.per_channel = (
            all(not (op.kind == "batchnorm_inference" and op.mode == BN_PER_ACTIVATION)
                for op in ops)
            and "activation" not in kinds[:-1] and math.prod(shape) < 2 ** 31 - 4)
        self.layout = (shape[0], channels, math.prod(shape[2:]))
        self.affine_ops = [op for op in ops if op.kind != "activation"]
        self.activation = ops[-1] if kinds[-1] == "activation" else None
        self.activations = [op for op in ops if op.kind == "activation"]
        # Build the default-parameter variant now (float4 where the plane size allows it).
        if self.per_channel:
            self._plane_kernel(None, 4 if self.layout[2] % 4 == 0 else 1)
        else:
            self._kernel(None)

    def set_vector_width(self, widest):
        self.widest = int(widest)
        if self.on_change is not None:
            self.on_change()

    def _activation_key(self, values):
        return tuple(activation_of(op, values).key for op in self.activations)

    def _plane_kernel(self, values, vec):
        """apply_affine_activation for the activation parameters of ``values`` (None: the
        defaults) and ``vec`` elements per packet, built once per parameter set."""
        key = (self._activation_key(values), vec)
        kernel = self.kernels.get(key)
        if kernel is None:
            code = ("z" if self.activation is None
                    else activation_of(self.activation, values).forward_code("z"))
            chain = [("bias" if op.kind == "bias" else "bn", False) for op in self.affine_ops]
            kernel = self.kernels[key] = BoundKernel(program.kernel(
                self.ctx, "fusion_fold", "apply_affine_activation",
                dict(chain=chain, activation=code, vec=vec), fresh=True))
        return kernel

    def _kernel(self, values):
        """(kernel, inputs, scalars) for the activation parameters of ``values`` (None: the
        defaults), built once per parameter set."""
        from ..ops.pointwise import PointwiseKernel
        key = self._activation_key(values)
        entry = self.kernels.get(key)
        if entry is None:
            statement, inputs, scalars = _affine_statement(self.problem.ops, values)
            kernel = PointwiseKernel(
                "fused_affine_activation", [("x", float32)] + [(n, float32) for n, _, _ in inputs],
                [("y", float32)], f"float v = x; {statement} y = v;",
                scalars=[(n, np.float32) for n, _, _ in scalars])
            entry = self.kernels[key] = (kernel, inputs, scalars)
            _prebuild_pointwise(self.ctx, kernel, self.problem.input_shape,
                                [self.param_shapes[op.index] for _, op, _ in inputs])
        return entry

    def run(self, x, y, values):
        if self.per_channel:
            return self._run_planes(x, y, values)
        kernel, inputs, scalars = self._kernel(values)
        tensors = []
        for name, op, field in inputs:
            value = values[op.index][field]
            check_param_tensor(op, value, field, self.param_shapes[op.index])
            tensors.append(param_view(value, self.param_shapes[op.index]))
        kernel([x] + tensors, [y], [values[op.index][field] for _, op, field in scalars])

    def _run_planes(self, x, y, values):
        check_same_context(x, y)
        n, c, spatial = self.layout
        vec = 4 if (self.widest >= 4 and spatial % 4 == 0 and x.offset_elements % 4 == 0
                    and y.offset_elements % 4 == 0) else 1
        kernel = self._plane_kernel(values, vec)
        packets = n * c * spatial // vec
        kernel_args = [np.int32(packets), np.int32(c), np.int32(spatial)]
        kernel_args += chain_parameters(self.ctx, self.affine_ops, self.param_shapes, values)
        kernel_args += [x.buffer, np.int32(x.offset_elements), y.buffer,
                        np.int32(y.offset_elements)]
        info = self.ctx.info
        group = min(256, info.max_work_group_size)
        groups = min(-(-packets // group), info.compute_units * (16 if info.is_gpu else 4))
        kernel(self.ctx.queue, (groups * group,), (group,), *kernel_args)


def _affine_statement(ops, values, value="v"):
    """C statements applying bias / BN-inference / activation ops to the float ``value``, the
    (name, op, field) list of the parameter tensors they read, and the (name, op, field) list
    of their scalars. ``values``: the ops' arguments (None: the activations' defaults)."""
    lines, inputs, scalars = [], [], []
    for op in ops:
        i = op.index
        if op.kind == "bias":
            lines.append(f"{value} += b{i};")
            inputs.append((f"b{i}", op, "bias"))
        elif op.kind == "batchnorm_inference":
            lines.append(f"{value} = ({value} - m{i}) * (s{i} / sqrt(v{i} + eps{i})) + t{i};")
            inputs += [(f"m{i}", op, "mean"), (f"v{i}", op, "variance"), (f"s{i}", op, "scale"),
                       (f"t{i}", op, "bias")]
            scalars.append((f"eps{i}", op, "epsilon"))
        elif op.kind == "activation":
            desc = activation_of(op, values)
            lines.append(f"{{ float a_in = {value}; {value} = {desc.forward_code('a_in')}; }}")
    return " ".join(lines), inputs, scalars


def _prebuild_pointwise(ctx, kernel, out_shape, input_shapes):
    """Build ``kernel`` for these shapes now, so that running it only enqueues."""
    from ..ops.pointwise import broadcast_strides, merge_dimensions
    strides = [broadcast_strides(s, out_shape) for s in [out_shape] + list(input_shapes)]
    sizes, _ = merge_dimensions(out_shape, strides + [broadcast_strides(out_shape, out_shape)])
    kernel._kernel(ctx, len(sizes), "int" if math.prod(out_shape) < 2 ** 31 - 1 else "long")
