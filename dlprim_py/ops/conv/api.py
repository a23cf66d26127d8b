"""The convolution operator (MIOpen-style, caller-managed memory) and the functional API
(torch semantics, autograd)."""
import numpy as np
import pyopencl as cl

from ... import autograd, config, logcmd
from ...activation import as_activation
from ...context import PlanCache, check_same_context
from ...dtypes import FLOAT16_TYPES, float32
from ...dtypes import name as dtype_name
from ...errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ...tensor import Tensor, TensorDesc, output

from ...launch import run_planned, run_planned_on
from .algorithms import Epilogue, EpilogueArgs, backward_bias, batch_chunk, run_in_chunks
from .gemm16 import backward_bias16
from .problem import DIRECTIONS, ConvolutionDesc, ConvProblem, make_problem, pair
from . import selection


def _check_tensor(t, shape, what, dtype=np.float32):
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != dtype:
        raise DTypeError(f"{what} must be {dtype_name(dtype)}, got {dtype_name(t.dtype)}")
    if tuple(t.shape) != tuple(shape):
        raise ShapeError(f"{what} must have shape {tuple(shape)}, got {t.shape}")


class Convolution:
    """A 2-D convolution for one problem, after MIOpen: built from descriptors, run on tensors
    the caller owns.

    ``input_desc``: (N, C, H, W) for layout "NCHW", (N, H, W, C) for "NHWC";
    ``weight_desc``: (K, C/groups, R, S) for "NCHW", (K, R, S, C/groups) for "NHWC";
    ``output_desc``: (N, K, Ho, Wo) or (N, Ho, Wo, K). float32, or float16 / bfloat16 (one type
    for every tensor; layout NCHW; the "gemm16" and "im2col_gemm16" algorithms, 16-bit GEMMs
    with float32 sums, ``ops/conv/gemm16.py``). Every method writes
    ``dst = alpha * result + beta * dst`` (``dst`` is not read when beta is 0).
    Algorithms: "gemm" (1x1), "winograd" (3x3 stride 1), "winograd_f4x4" (3x3 stride 1,
    forward and backward data), "depthwise_tiled" (depthwise forward, NCHW, dilation 1),
    "depthwise_rows" (depthwise forward and data gradient, NCHW, dilation 1),
    "depthwise", "implicit_gemm" (and its fixed-tile forward variants
    "implicit_gemm_64x128x16", "implicit_gemm_64x64x16", GPUs only), "im2col_gemm" (forward
    and backward data, groups 1), "direct_phased" (backward data), "direct" (see
    ``algorithms()``);
    ``algo=None`` takes DLPRIM_CONV_ALGO, else the find/immediate choice (DLPRIM_FIND_MODE).
    """

    # Recorded plans kept per operator (directions x algorithms x epilogues in use).
    PLANS = 16

    def __init__(self, ctx, input_desc, weight_desc, conv_desc, layout="NCHW", *, prebuild=True):
        if not isinstance(conv_desc, ConvolutionDesc):
            raise ShapeError(f"conv_desc must be a ConvolutionDesc, got {type(conv_desc).__name__}")
        for d, what in ((input_desc, "input_desc"), (weight_desc, "weight_desc")):
            if not isinstance(d, TensorDesc):
                raise ShapeError(f"{what} must be a TensorDesc, got {type(d).__name__}")
        if input_desc.dtype != weight_desc.dtype:
            raise DTypeError(f"input is {dtype_name(input_desc.dtype)} but weights are "
                             f"{dtype_name(weight_desc.dtype)}")
        self.ctx = ctx
        self.conv_desc = conv_desc
        self.layout = layout
        self.problem = make_problem(input_desc.shape, weight_desc.shape, conv_desc, layout,
                                    input_desc.dtype)
        self.input_desc = input_desc
        self.weight_desc = weight_desc
        self.output_desc = TensorDesc(self.problem.y_shape, input_desc.dtype)
        # The tensors' dtype: float32, or float16 / bfloat16 (the 16-bit GEMM algorithms).
        self.dtype = input_desc.dtype
        self._chosen = {}
        self._resolved = {}
        # A call replays the launches recorded by the first call with the same scalars,
        # offsets and aliasing, on its own buffers (dlprim_py/launch.py): plans of this
        # operator's own, which live as long as it does.
        self._plans = PlanCache(self.PLANS)
        # Build the forward kernels now so that a call only enqueues; a caller that runs only
        # ``prepared`` epilogues (a fusion plan) passes prebuild=False and builds those alone.
        if prebuild:
            name = self._choose("forward")
            selection.algorithm(name).prepare(ctx, self.problem, "forward")

    def prepared(self, direction, epilogue=Epilogue(), algo=None):
        """``direction`` on algorithm ``algo`` (None: the choice, as a call's) with ``epilogue``
        (an ``Epilogue``; forward only), its kernels built and its workspace allocated now: a
        ``PreparedRun``, whose ``run(src, other, dst, ep)`` enqueues on the tensors given."""
        self._check_direction(direction)
        name, algorithm, need, _ = self._resolve(algo, direction)
        algorithm.prepare(self.ctx, self.problem, direction, epilogue)
        workspace = Tensor.empty(self.ctx, (need // 4,)) if need else None
        return PreparedRun(self, direction, name, epilogue, workspace)

    def algorithms(self, direction="forward"):
        """Names of the algorithms that apply to this problem, in priority order."""
        self._check_direction(direction)
        return selection.applicable(self.ctx, self.problem, direction)

    def workspace_size(self, algo, direction="forward"):
        """Bytes of workspace a call of ``algo`` uses for ``direction`` (0 for none): within the
        limit (DLPRIM_WORKSPACE_LIMIT), as the call runs the batch in parts where the whole
        would need more."""
        self._check_direction(direction)
        return self._resolve(algo, direction)[2]

    def _check_direction(self, direction):
        if direction not in DIRECTIONS:
            raise UnsupportedError(f"direction must be one of {DIRECTIONS}, got {direction!r}")

    def _choose(self, direction, tf32=None):
        # TF32 allowed or not (dlprim_py.backends, ctx.allow_tf32) is read at every call.
        key = (direction, selection.tf32_enabled(self.ctx) if tf32 is None else tf32)
        name = self._chosen.get(key)
        if name is None:
            name = self._chosen[key] = selection.choose(self.ctx, self.problem, direction)
        return name

    def _algorithm(self, algo, direction, tf32_checked=True):
        algorithm = selection.algorithm(algo)
        if tf32_checked and algorithm.tf32 and not selection.tf32_enabled(self.ctx):
            from ... import backends
            why = selection.tf32_refusal(self.ctx) if backends.tf32_allowed(self.ctx) else \
                ("TF32 is not allowed (dlprim_py.backends.allow_tf32 and the context's "
                 "allow_tf32 are False)")
            raise UnsupportedError(f"algorithm {algo!r} does not apply to "
                                   f"{self.problem.key(direction)}: {why}; applicable: "
                                   f"{', '.join(self.algorithms(direction))}")
        if not (selection.dtype_applies(algorithm, self.problem)
                and algorithm.applies(self.ctx, self.problem, direction)):
            raise UnsupportedError(f"algorithm {algo!r} does not apply to "
                                   f"{self.problem.key(direction)}; applicable: "
                                   f"{', '.join(self.algorithms(direction))}")
        return algorithm

    def _resolve(self, algo, direction, prepared=False):
        """(name, algorithm, workspace bytes, images per run) of a call: an algorithm whose
        workspace for the whole batch would pass the limit runs on parts of it
        (``algorithms.batch_chunk``). The checks run once per pair, since the problem is fixed
        (a small layer's call costs about as much host time as its kernel's device time).
        ``prepared``: ``algo`` is a ``PreparedRun``'s, which keeps its algorithm (a TF32 one
        too) whatever TF32's switch says later."""
        tf32 = None if prepared else selection.tf32_enabled(self.ctx)
        name = algo or self._choose(direction, tf32)
        key = (name, direction, config.workspace_limit(), tf32)
        resolved = self._resolved.get(key)
        if resolved is None:
            algorithm = self._algorithm(name, direction, tf32_checked=not prepared)
            chunk, need = batch_chunk(self.ctx, algorithm, self.problem, direction)
            resolved = self._resolved[key] = (name, algorithm, need, chunk)
        return resolved

    def _log_call(self, direction, algo, epilogue, ep):
        """The ``dlprim-driver`` command of this call (DLPRIM_LOG_CMD=1): conv, with -b 1 for a
        bias; a forward with an activation or a residual (NCHW, no scale) is CBAInfer's
        conv_bias_activation. -S names an algorithm the call or DLPRIM_CONV_ALGO forced, -s 1
        find mode; the rest (alpha, beta, a scale) is named as not carried."""
        flags = self.problem.driver_flags(direction)
        missing = []
        family = "conv"
        if direction == "forward":
            fused = epilogue.activation is not None or epilogue.has_residual
            plain = not (epilogue.has_scale or epilogue.affine_per_position or epilogue.chain)
            if fused and plain and self.layout == "NCHW":
                family = "CBAInfer"
                flags = {f: v for f, v in flags.items() if f not in ("F", "I")}
                flags.update({"b": int(epilogue.has_shift), "z": int(epilogue.has_residual),
                              **logcmd.activation_flags(epilogue.activation)})
                if epilogue.has_residual and ep.residual_alpha != 1:
                    missing.append(f"residual alpha {ep.residual_alpha:g}")
            else:
                if epilogue.has_shift and plain:
                    flags["b"] = 1
                if epilogue.activation is not None:
                    missing.append(f"activation {epilogue.activation.mode.value}")
                if epilogue.has_residual:
                    missing.append("residual")
                if not plain:
                    missing.append("a fused scale and shift" if not epilogue.chain
                                   else "a fused bias / batch-norm chain")
        if ep.alpha != 1:
            missing.append(f"alpha {ep.alpha:g}")
        if ep.beta != 0:
            missing.append(f"beta {ep.beta:g}")
        forced = algo or config.forced_algorithm("conv")
        if forced:
            flags["S"] = forced
        if config.find_mode() == "find":
            flags["s"] = 1
        logcmd.log_command(family, flags, missing)

    def _run(self, direction, algo, src, other, dst, ep, epilogue=Epilogue(), workspace=None,
             prepared=False):
        if config.log_cmd():
            self._log_call(direction, algo, epilogue, ep)
        name, algorithm, need, chunk = self._resolve(algo, direction, prepared)
        if need and (workspace is None or workspace.nbytes < need):
            if workspace is not None:
                raise ShapeError(f"{name} {direction} needs a workspace of {need} bytes, "
                                 f"got {workspace.nbytes}")
            # The context's shared scratch (a plan binds it as an operand on every run).
            workspace = self.ctx.workspace(need)
        tensors = (src, other, dst, ep.scale, ep.shift, ep.residual, workspace)
        check_same_context(*tensors)
        operands = [None if t is None else t.buffer for t in tensors]
        operands += [a for a in ep.chain_args if isinstance(a, cl.MemoryObjectHolder)]
        # Everything a recorded run depends on but its operands' buffers.
        key = (direction, name, epilogue, ep.alpha, ep.beta, ep.residual_alpha,
               tuple(None if t is None else t.offset_elements for t in tensors),
               tuple(float(a) for a in ep.chain_args if not isinstance(a, cl.MemoryObjectHolder)))
        run_planned(self.ctx, key, operands,
                    lambda: run_in_chunks(self.ctx, algorithm, self.problem, direction, chunk,
                                          src, other, dst, ep, epilogue, workspace),
                    plans=self._plans)
        return dst

    def forward(self, x, w, y, bias=None, alpha=1.0, beta=0.0, activation=None, algo=None,
                workspace=None, *, scale=None, shift=None, residual=None, residual_alpha=1.0,
                chain=(), chain_args=()):
        """y = act(alpha * conv(x, w) * scale[k] + shift[k] + residual_alpha * residual)
        + beta * y. ``bias`` (K,) is ``shift`` under another name; ``scale``/``shift`` (K,), or
        both (K, Ho, Wo) with layout NCHW for one value per output position (per-activation
        batch norm); ``residual`` shaped like y; ``activation``: an ActivationDesc, a name, or
        None.

        ``chain``/``chain_args`` (fusion plans; instead of ``scale`` and ``shift``): a bias /
        batch-norm-inference chain ``((kind, per_position), ...)`` and its kernel arguments as
        kernels/fusion_fold.cl.mako's chain_params declares them; the convolution's kernel
        computes the chain's scale and shift itself (per output position, layout NCHW, for
        links with per_position), reading the parameters' contents on every run."""
        p = self.problem
        _check_tensor(x, p.x_shape, "x", self.dtype)
        _check_tensor(w, p.w_shape, "w", self.dtype)
        _check_tensor(y, p.y_shape, "y", self.dtype)
        if bias is not None and shift is not None:
            raise ShapeError("give either bias or shift, not both (bias is the shift)")
        if bias is not None:
            shift = bias
        per_position = any(t is not None and t.ndim == 3 for t in (scale, shift))
        affine_shape = (p.k, p.ho, p.wo) if per_position else (p.k,)
        if per_position and p.layout != "NCHW":
            raise UnsupportedError("scale/shift per output position need layout NCHW")
        for t, what in ((scale, "scale"), (shift, "bias/shift")):
            if t is not None:
                _check_tensor(t, affine_shape, what, self.dtype)
        if residual is not None:
            _check_tensor(residual, p.y_shape, "residual", self.dtype)
        chain = tuple((str(kind), bool(per)) for kind, per in chain)
        if chain and (scale is not None or shift is not None):
            raise ShapeError("give either a chain or scale/shift, not both")
        if any(per for _, per in chain) and p.layout != "NCHW":
            raise UnsupportedError("a chain with per-position parameters needs layout NCHW")
        act = as_activation(activation)
        if act is not None and act.is_identity:
            act = None
        epilogue = Epilogue(scale is not None, shift is not None, residual is not None, act,
                            per_position, chain)
        ep = EpilogueArgs(scale, shift, residual, alpha, beta, residual_alpha, tuple(chain_args))
        return self._run("forward", algo, x, w, y, ep, epilogue, workspace)

    def backward_data(self, dy, w, dx, alpha=1.0, beta=0.0, algo=None, workspace=None):
        """dx = alpha * dL/dx + beta * dx, from dy (shaped like y) and w."""
        p = self.problem
        _check_tensor(dy, p.y_shape, "dy", self.dtype)
        _check_tensor(w, p.w_shape, "w", self.dtype)
        _check_tensor(dx, p.x_shape, "dx", self.dtype)
        return self._run("backward_data", algo, dy, w, dx, EpilogueArgs(alpha=alpha, beta=beta),
                         workspace=workspace)

    def backward_filter(self, dy, x, dw, alpha=1.0, beta=0.0, algo=None, workspace=None):
        """dw = alpha * dL/dw + beta * dw, from dy and x."""
        p = self.problem
        _check_tensor(dy, p.y_shape, "dy", self.dtype)
        _check_tensor(x, p.x_shape, "x", self.dtype)
        _check_tensor(dw, p.w_shape, "dw", self.dtype)
        return self._run("backward_filter", algo, dy, x, dw,
                         EpilogueArgs(alpha=alpha, beta=beta), workspace=workspace)

    def backward_bias(self, dy, db, alpha=1.0, beta=0.0):
        """db[k] = alpha * sum_{n, oh, ow} dy + beta * db[k]; db has shape (K,)."""
        p = self.problem
        _check_tensor(dy, p.y_shape, "dy", self.dtype)
        _check_tensor(db, (p.k,), "db", self.dtype)
        check_same_context(dy, db)
        if self.dtype in FLOAT16_TYPES:
            backward_bias16(self.ctx, p, dy, db, alpha, beta)
        else:
            backward_bias(self.ctx, p, dy, db, alpha, beta)
        return db


class PreparedRun:
    """A direction of a ``Convolution`` with its algorithm, epilogue and workspace fixed
    (``Convolution.prepared``). ``algorithm``: the algorithm's name."""

    __slots__ = ("convolution", "direction", "algorithm", "epilogue", "workspace")

    def __init__(self, convolution, direction, algorithm, epilogue, workspace):
        self.convolution = convolution
        self.direction = direction
        self.algorithm = algorithm
        self.epilogue = epilogue
        self.workspace = workspace

    def run(self, src, other, dst, ep):
        """``dst = alpha * result (through the epilogue) + beta * dst`` with ``ep`` (an
        ``EpilogueArgs``) the epilogue's operands; operands as ``Convolution``'s methods take
        them per direction (forward: x, w, y)."""
        return self.convolution._run(self.direction, self.algorithm, src, other, dst, ep,
                                     self.epilogue, self.workspace, prepared=True)


def _plan(ctx, input_shape, weight_shape, conv_desc, layout="NCHW", dtype=float32):
    # The switches too: an operator keeps the algorithms it chose.
    key = ("conv2d", tuple(input_shape), tuple(weight_shape), conv_desc.padding,
           conv_desc.stride, conv_desc.dilation, conv_desc.groups, layout,
           config.forced_algorithm("conv"), config.find_mode(), dtype_name(dtype))
    conv = ctx.plans.get(key)
    if conv is None:
        conv = ctx.plans.put(key, Convolution(ctx, TensorDesc(input_shape, dtype),
                                              TensorDesc(weight_shape, dtype), conv_desc, layout))
    return conv


def _padding(padding, kernel_size, stride, dilation):
    """The symmetric padding of a call: ints as given, "valid" as 0, "same" as the padding on
    the left (top), which is also the right's unless the kernel's span is even (``_same_extra``
    gives the rest)."""
    if isinstance(padding, str):
        n = len(kernel_size)
        if padding == "valid":
            return (0,) * n
        if padding == "same":
            if _ntuple(stride, "stride", n) != (1,) * n:
                raise UnsupportedError("padding='same' needs stride 1 (torch's rule)")
            dilation = _ntuple(dilation, "dilation", n)
            return tuple(d * (k - 1) // 2 for d, k in zip(dilation, kernel_size))
        raise ShapeError(f"padding must be an int, ints, 'same' or 'valid', got {padding!r}")
    return padding


def _same_extra(padding, kernel_size, dilation):
    """Per spatial dimension, the padding "same" adds on the right (bottom) beyond the left's:
    1 where dilation * (kernel - 1) is odd (torch pads asymmetrically there), else 0; all 0
    for any other padding."""
    if not (isinstance(padding, str) and padding == "same"):
        return (0,) * len(kernel_size)
    dilation = _ntuple(dilation, "dilation", len(kernel_size))
    return tuple(d * (k - 1) % 2 for d, k in zip(dilation, kernel_size))


def _ntuple(value, name, n):
    """n ints from an int or a sequence of 1 or n ints (torch's argument convention)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value),) * n
    try:
        items = tuple(value)
    except TypeError:
        raise ShapeError(f"{name} must be an int or {n} ints, got {value!r}") from None
    if len(items) == 1:
        items *= n
    if len(items) != n or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                  for v in items):
        raise ShapeError(f"{name} must be an int or {n} ints, got {value!r}")
    return tuple(int(v) for v in items)


def _add_batch(x):
    """An unbatched input as a batch of one (a view on the tape)."""
    return x.reshape((1,) + tuple(x.shape))


def _drop_batch(y):
    return y.reshape(tuple(y.shape[1:]))


def _pad_right(x, extra, layout="NCHW"):
    """x (N, C, *spatial) (or channels last) with ``extra`` zeros after each spatial
    dimension (F.pad, on the tape)."""
    from ..tensor_ops import pad
    pads = []
    for e in reversed(extra):
        pads += [0, e]
    if layout == "NHWC":
        pads = [0, 0] + pads
    return pad(x, pads)


def _check_input(x, what):
    if not isinstance(x, Tensor):
        raise not_a_tensor(what, x)


def _check_dtypes(name, x, weight, bias):
    """float32, or float16 / bfloat16 (the 16-bit GEMM algorithms), one type for the input,
    the weight and the bias (DTypeError otherwise, as torch refuses mixed types)."""
    if x.dtype != float32 and x.dtype not in FLOAT16_TYPES:
        raise DTypeError(f"{name}: input must be float32, float16 or bfloat16, got "
                         f"{dtype_name(x.dtype)}")
    for t, what in ((weight, "weight"), (bias, "bias")):
        if t is not None and isinstance(t, Tensor) and t.dtype != x.dtype:
            raise DTypeError(f"{name}: {what} must have the input's dtype {dtype_name(x.dtype)}, "
                             f"got {dtype_name(t.dtype)}")


def _check_layout(layout):
    if layout not in ("NCHW", "NHWC"):
        raise UnsupportedError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")


def _kernel_size(weight, layout):
    """(R, S) of a weight stored (K, C/g, R, S) for NCHW or (K, R, S, C/g) for NHWC."""
    return tuple(weight.shape[2:4]) if layout == "NCHW" else tuple(weight.shape[1:3])


def _bias_grad(ctx, g, channels, layout="NCHW"):
    """Sum of g (N, C, H, W), or (N, H, W, C) for NHWC, over N, H, W as a (C,) tensor."""
    if layout == "NCHW":
        n, c, h, w = g.shape
    else:
        n, h, w, c = g.shape
    problem = ConvProblem(n, c, h, w, c, 1, 1, 0, 0, 1, 1, 1, 1, 1, layout)
    db = Tensor.empty(ctx, (channels,))
    backward_bias(ctx, problem, g, db)
    return db


def _empty_batch(ctx, x, weight, bias, output_shape, channels, name):
    """The result of a convolution over an empty batch (N = 0), as torch gives it: an empty
    output, and zero gradients for the weight and bias. ``output_shape`` has N = 0."""
    dtype = x.dtype
    if bias is not None:
        _check_tensor(bias, (channels,), "bias", dtype)
    y = Tensor.empty(ctx, output_shape, dtype)

    def backward(g):
        return (Tensor.empty(ctx, x.shape, dtype) if x.requires_grad else None,
                Tensor.zeros(ctx, weight.shape, dtype) if weight.requires_grad else None,
                Tensor.zeros(ctx, bias.shape, dtype)
                if bias is not None and bias.requires_grad else None)

    return autograd.record(y, (x, weight, bias), backward, name)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, layout="NCHW"):
    """torch.nn.functional.conv2d: x (N, C, H, W), weight (K, C/groups, R, S), bias (K,) or
    None; float32. Returns (N, K, Ho, Wo); gradients flow to x, weight and bias.

    ``layout="NHWC"``: x is (N, H, W, C), weight (K, R, S, C/groups) (channels last in both,
    as the Convolution operator stores them) and the result (N, Ho, Wo, K); the same numbers as
    NCHW with every tensor permuted.

    An unbatched input (C, H, W) gives a (K, Ho, Wo) result. ``padding="same"`` with an even
    (dilated) kernel size pads one more on the right and bottom, as torch does. An empty batch
    (N = 0) gives an empty result."""
    # A call with the arguments of an earlier one (whose checks passed) takes its operator
    # and output shape from the context's plan cache and replays that call's plan.
    try:
        switches = config.switches()
        key = ("F.conv2d", x.shape, x.dtype, x.offset, weight.shape, weight.dtype, weight.offset,
               None if bias is None else (bias.shape, bias.dtype, bias.offset),
               # _arg_key inlined for the usual ints (one call each otherwise).
               stride if stride.__class__ is int else _arg_key(stride),
               padding if padding.__class__ is int else _arg_key(padding),
               dilation if dilation.__class__ is int else _arg_key(dilation),
               groups if groups.__class__ is int else _arg_key(groups), layout,
               switches.forced.get("conv"), switches.find_mode,
               # TF32 (dlprim_py.backends): the plans of either mode are kept apart.
               selection.tf32_enabled(x.ctx))
        ctx = x.ctx
        entry = ctx.plans.hit(key) or ctx.plans.get(key)
    except (AttributeError, TypeError):   # not tensors, or unhashable arguments: checked below
        key = entry = None
    if entry is not None:
        conv, y_shape, y_bytes, plans = entry
        y = output(ctx, y_shape, y_bytes) if conv.dtype is float32 else \
            Tensor.empty(ctx, y_shape, conv.dtype)
        # No closure: conv.forward is called with the operands only when there is no plan.
        operands = (x, weight, y, bias)
        run_planned_on(ctx, None, operands, conv.forward, plans, operands)
        # autograd.needs_grad inlined: the entry says x and weight are tensors.
        if ((x.requires_grad or weight.requires_grad
             or (bias is not None and bias.requires_grad)) and autograd.grad_enabled()):
            autograd.record(y, (x, weight, bias), _conv2d_backward(conv, key, x, weight, bias),
                            "conv2d")
        return y
    _check_layout(layout)
    _check_input(x, "input")
    _check_input(weight, "weight")
    _check_dtypes("conv2d", x, weight, bias)
    if x.dtype != float32 and layout != "NCHW":
        raise UnsupportedError(f"conv2d: {dtype_name(x.dtype)} tensors are computed in layout "
                               f"NCHW only, got {layout}")
    wdims, xdims = (("(K, C/groups, R, S)", "(N, C, H, W) or (C, H, W)") if layout == "NCHW"
                    else ("(K, R, S, C/groups)", "(N, H, W, C) or (H, W, C)"))
    if weight.ndim != 4:
        raise ShapeError(f"conv2d weight must have rank 4 {wdims}, got {weight.shape}")
    if x.ndim == 3:
        # Unbatched, as torch takes it: a batch of one, viewed (no copy).
        return _drop_batch(conv2d(_add_batch(x), weight, bias, stride, padding, dilation, groups,
                                  layout=layout))
    if x.ndim != 4:
        raise ShapeError(f"conv2d input must have rank 4 or 3 {xdims}, got {x.shape}")
    extra = _same_extra(padding, _kernel_size(weight, layout), dilation)
    if any(extra):
        # An even kernel span: torch pads one more on the right and bottom; the input is
        # padded there and the convolution pads symmetrically.
        return conv2d(_pad_right(x, extra, layout), weight, bias, stride,
                      _padding(padding, _kernel_size(weight, layout), stride, dilation),
                      dilation, groups, layout=layout)
    ctx = check_same_context(x, weight, bias)
    desc = ConvolutionDesc(_padding(padding, _kernel_size(weight, layout), stride, dilation),
                           stride, dilation, groups)
    if x.shape[0] == 0:
        # The geometry is checked on a batch of one; no kernel runs.
        shape = _plan(ctx, (1,) + x.shape[1:], weight.shape, desc, layout,
                      x.dtype).output_desc.shape
        return _empty_batch(ctx, x, weight, bias, (0,) + shape[1:],
                            shape[1] if layout == "NCHW" else shape[3], "conv2d")
    conv = _plan(ctx, x.shape, weight.shape, desc, layout, x.dtype)
    y = Tensor.empty(ctx, conv.output_desc.shape, x.dtype)
    conv.forward(x, weight, y, bias=bias)
    if key is not None:
        # The call's own replay plans (by how its buffers alias) live in its entry: a repeated
        # call makes one plan-cache lookup.
        ctx.plans.put(key, (conv, y.shape, max(y.nbytes, 4), PlanCache(4)))
    return autograd.record(y, (x, weight, bias), _conv2d_backward(conv, key, x, weight, bias),
                           "conv2d")


def _arg_key(value):
    """A plan-key entry for a geometry argument: ints as themselves, anything else with its
    repr too (2.0 and 2 hash alike, but only one of them passes the checks)."""
    return value if value.__class__ is int else (value, repr(value))


def _conv2d_backward(conv, key, x, weight, bias):
    """The backward of F.conv2d: the data, filter and bias gradients that the inputs need,
    replayed as one plan per forward key and gradient shape."""
    ctx = conv.ctx
    dtype = conv.dtype

    def backward(g):
        if g.dtype != dtype:
            # A gradient of another type is rounded to the output's once (torch's autograd
            # casts it to its tensor's type).
            g = g.to(dtype)
        gx = Tensor.empty(ctx, x.shape, dtype) if x.requires_grad else None
        gw = Tensor.empty(ctx, weight.shape, dtype) if weight.requires_grad else None
        gb = Tensor.empty(ctx, bias.shape, dtype) \
            if bias is not None and bias.requires_grad else None

        def run():
            if gx is not None:
                conv.backward_data(g, weight, gx)
            if gw is not None:
                conv.backward_filter(g, x, gw)
            if gb is not None:
                conv.backward_bias(g, gb)

        if key is None:
            run()
        else:
            run_planned_on(ctx, ("backward", key, g.shape, g.dtype, g.offset, gx is None,
                                 gw is None, gb is None), (g, x, weight, gx, gw, gb), run)
        return gx, gw, gb

    return backward


def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1, *, layout="NCHW"):
    """torch.nn.functional.conv_transpose2d: x (N, Cin, H, W), weight (Cin, Cout/groups, R, S),
    bias (Cout,) or None; float32. Returns (N, Cout, Ho, Wo) with
    Ho = (H - 1) * stride - 2 * padding + dilation * (R - 1) + output_padding + 1.
    Computed as the data gradient of the convolution that maps the output back to x.

    ``layout="NHWC"``: x is (N, H, W, Cin), weight (Cin, R, S, Cout/groups) and the result
    (N, Ho, Wo, Cout)."""
    _check_layout(layout)
    _check_input(x, "input")
    _check_input(weight, "weight")
    for t in (x, weight, bias):
        if t is not None and isinstance(t, Tensor) and t.dtype != float32:
            raise DTypeError(f"conv_transpose2d: float32 tensors only, got "
                             f"{dtype_name(t.dtype)} (16-bit tensors: conv2d)")
    wdims, xdims = (("(Cin, Cout/groups, R, S)", "(N, C, H, W)") if layout == "NCHW"
                    else ("(Cin, R, S, Cout/groups)", "(N, H, W, C)"))
    if weight.ndim != 4:
        raise ShapeError(f"conv_transpose2d weight must have rank 4 {wdims}, "
                         f"got {weight.shape}")
    if x.ndim == 3:
        # Unbatched, as torch takes it: a batch of one, viewed (no copy).
        return _drop_batch(conv_transpose2d(_add_batch(x), weight, bias, stride, padding,
                                            output_padding, groups, dilation, layout=layout))
    if x.ndim != 4:
        raise ShapeError(f"conv_transpose2d input must have rank 4 or 3 {xdims}, got {x.shape}")
    ctx = check_same_context(x, weight, bias)
    desc = ConvolutionDesc(padding, stride, dilation, groups)
    oph, opw = pair(output_padding, "output_padding")
    (sh, sw), (dh, dw), (ph, pw) = desc.stride, desc.dilation, desc.padding
    if not (0 <= oph < max(sh, dh) and 0 <= opw < max(sw, dw)):
        raise ShapeError(f"output_padding {(oph, opw)} must be >= 0 and smaller than stride or "
                         f"dilation ({desc.stride}, {desc.dilation})")
    if layout == "NCHW":
        n, cin, h, w = x.shape
    else:
        n, h, w, cin = x.shape
    if weight.shape[0] != cin:
        raise ShapeError(f"conv_transpose2d weight has {weight.shape[0]} input channels, the "
                         f"input has {cin}")
    cout = (weight.shape[1] if layout == "NCHW" else weight.shape[3]) * groups
    r, s = _kernel_size(weight, layout)
    ho = (h - 1) * sh - 2 * ph + dh * (r - 1) + oph + 1
    wo = (w - 1) * sw - 2 * pw + dw * (s - 1) + opw + 1
    if ho <= 0 or wo <= 0:
        raise ShapeError(f"conv_transpose2d output would be {ho}x{wo}: padding too large")
    if bias is not None:
        _check_tensor(bias, (cout,), "bias")
    # The convolution whose input is our output and whose output is our input.
    y_shape = (n, cout, ho, wo) if layout == "NCHW" else (n, ho, wo, cout)
    if n == 0:
        # The geometry is checked on a batch of one; no kernel runs.
        _plan(ctx, (1,) + y_shape[1:], weight.shape, desc, layout)
        return _empty_batch(ctx, x, weight, bias, y_shape, cout, "conv_transpose2d")
    conv = _plan(ctx, y_shape, weight.shape, desc, layout)
    # With output_padding >= stride (allowed below the dilation) the convolution that maps our
    # output back has more output rows or columns than x; the extra ones scatter nothing, so x
    # is extended with zeros to that shape and the gradient of x is cut back from it.
    full_shape = conv.output_desc.shape
    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    extra = [full_shape[k] - x.shape[k] for k in spatial]
    if (any(full_shape[k] != x.shape[k] for k in range(4) if k not in spatial)
            or min(extra) < 0):
        raise ShapeError(f"conv_transpose2d: inconsistent geometry {full_shape} vs {x.shape}")
    x_full = x.detach()
    if max(extra):
        from ..tensor_ops import pad
        pads = (0, extra[1], 0, extra[0]) if layout == "NCHW" else (0, 0, 0, extra[1], 0, extra[0])
        x_full = pad(x_full, pads)
    y = Tensor.empty(ctx, y_shape)
    conv.backward_data(x_full, weight, y)
    if bias is not None:
        from ..pointwise import binary
        bias_shape = (1, cout, 1, 1) if layout == "NCHW" else (1, 1, 1, cout)
        y = binary("add", y, bias.detach().reshape(*bias_shape))

    def backward(g):
        gx = gw = gb = None
        if x.requires_grad:
            gx = Tensor.empty(ctx, full_shape)
            conv.forward(g, weight, gx)
            if max(extra):
                from ..tensor_ops import narrow
                for k in spatial:
                    gx = narrow(gx, k, 0, x.shape[k])
        if weight.requires_grad:
            gw = Tensor.empty(ctx, weight.shape)
            conv.backward_filter(x_full, g, gw)
        if bias is not None and bias.requires_grad:
            gb = _bias_grad(ctx, g, cout, layout)
        return gx, gw, gb

    return autograd.record(y, (x, weight, bias), backward, "conv_transpose2d")


def _check_1d(x, weight, name, wdims):
    _check_input(x, "input")
    _check_input(weight, "weight")
    if weight.ndim != 3:
        raise ShapeError(f"{name} weight must have rank 3 {wdims}, got {weight.shape}")
    if x.ndim not in (2, 3):
        raise ShapeError(f"{name} input must have rank 3 (N, C, L) or 2 (C, L), got {x.shape}")


def _as_2d(x, weight):
    """(N, C, L) and a (A, B, k) weight viewed as (N, C, 1, L) and (A, B, 1, k) (no copy)."""
    return (x.reshape(x.shape[:-1] + (1, x.shape[-1])),
            weight.reshape(weight.shape[:2] + (1, weight.shape[2])))


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d: x (N, C, L) or unbatched (C, L), weight (K, C/groups, k),
    bias (K,) or None; float32. Returns (N, K, Lo) (or (K, Lo)); gradients flow to x, weight
    and bias. ``padding``: an int, "valid" or "same" (stride 1; an even kernel span pads one
    more on the right, as torch does).

    Computed by the 2-D convolution on views of height 1 (no copy)."""
    _check_1d(x, weight, "conv1d", "(K, C/groups, k)")
    if x.ndim == 2:
        return _drop_batch(conv1d(_add_batch(x), weight, bias, stride, padding, dilation, groups))
    x2, w2 = _as_2d(x, weight)
    if not isinstance(padding, str):
        padding = (0, _ntuple(padding, "padding", 1)[0])
    y = conv2d(x2, w2, bias, (1, _ntuple(stride, "stride", 1)[0]), padding,
               (1, _ntuple(dilation, "dilation", 1)[0]), groups)
    return y.reshape(y.shape[:2] + (y.shape[3],))


def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """torch.nn.functional.conv_transpose1d: x (N, Cin, L) or unbatched (Cin, L), weight
    (Cin, Cout/groups, k), bias (Cout,) or None; float32. Returns (N, Cout, Lo) with
    Lo = (L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.

    Computed by the 2-D transposed convolution on views of height 1 (no copy)."""
    _check_1d(x, weight, "conv_transpose1d", "(Cin, Cout/groups, k)")
    if x.ndim == 2:
        return _drop_batch(conv_transpose1d(_add_batch(x), weight, bias, stride, padding,
                                            output_padding, groups, dilation))
    x2, w2 = _as_2d(x, weight)
    y = conv_transpose2d(x2, w2, bias, (1, _ntuple(stride, "stride", 1)[0]),
                         (0, _ntuple(padding, "padding", 1)[0]),
                         (0, _ntuple(output_padding, "output_padding", 1)[0]), groups,
                         (1, _ntuple(dilation, "dilation", 1)[0]))
    return y.reshape(y.shape[:2] + (y.shape[3],))
