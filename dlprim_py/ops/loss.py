"""Losses with torch.nn.functional's names and semantics, forward and backward.

* ``nll_loss`` and ``cross_entropy`` with int64 class targets (N) or (N, d1, ...), optional
  per-class ``weight``, ``ignore_index``; ``cross_entropy`` also takes class probabilities
  (a float target shaped like the input). A target outside [0, C) other than ignore_index
  raises ShapeError and is never used as an index: a check kernel enqueued with the call sets
  a flag on the device. How the flag reaches the host (``DLPRIM_RANGE_CHECK_ALGO``):
  "deferred" (default) reads it at the context's next synchronizing call (``Tensor.numpy()``,
  ``Context.synchronize()``) and raises there, as CUDA reports a device-side assert at the next
  synchronization: the call itself only enqueues, replays its launches from a plan, and the
  host goes on enqueuing (a training step's backward) while the device runs the forward.
  "immediate" raises in the call: the flag's read is enqueued right after the check into
  page-locked memory, and the call waits for it after enqueuing the rest, so it waits for the
  check (and whatever the queue held before), not for its own work; a training step then
  drains the queue at its loss.
  ``cross_entropy`` with class targets reads the logits once (their log-sum-exp over the
  classes, then the picked logit minus it).
* ``mse_loss`` and ``binary_cross_entropy_with_logits`` (``weight``, ``pos_weight``), with
  broadcasting; their mean/sum reductions are one fused map+reduce kernel, no temporary.

``reduction`` is "none", "mean" or "sum" everywhere.
"""
import math

import numpy as np
import pyopencl as cl

from .. import autograd, program
from ..context import check_same_context
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..tensor import Tensor
from .. import config
from ..launch import bind, run_planned_on
from . import reduce as R
from .arithmetic import mul, reduce_to_shape
from .pointwise import PointwiseKernel, broadcast_shapes, launch_size
from .reduce import ReduceKernel
from .softmax import log_softmax, softmax_backward

_f32 = np.float32
_REDUCTIONS = ("none", "mean", "sum")
RANGE_CHECKS = ("deferred", "immediate")
# Without DLPRIM_RANGE_CHECK_ALGO.
DEFAULT_RANGE_CHECK = "deferred"
_kernels = {}


def _memo(key, factory):
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = factory()
    return k


def _check_reduction(reduction, name):
    if reduction not in _REDUCTIONS:
        raise UnsupportedError(f"{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _check_float(t, what):
    if not isinstance(t, Tensor):
        raise not_a_tensor(what, t)
    if t.dtype != np.float32:
        raise DTypeError(f"{what} must be float32, got {t.dtype}")


def _view(t, shape):
    return Tensor(t.ctx, t.buffer, shape, t.dtype, offset=t.offset)


# ---- nll_loss / cross_entropy --------------------------------------------------------------

def _nll_geometry(x, target):
    _check_float(x, "nll_loss: input")
    if not isinstance(target, Tensor):
        raise not_a_tensor("nll_loss: target", target)
    if target.dtype != np.int64:
        raise DTypeError(f"nll_loss: class targets must be int64, got {target.dtype}")
    if x.ndim == 1:
        expected, n, c, s = (), 1, x.shape[0], 1
    elif x.ndim >= 2:
        n, c, s = x.shape[0], x.shape[1], math.prod(x.shape[2:])
        expected = (x.shape[0],) + x.shape[2:]
    else:
        raise ShapeError(f"nll_loss: input must be (C), (N, C) or (N, C, d1, ...), got {x.shape}")
    if target.shape != expected:
        raise ShapeError(f"nll_loss: input {x.shape} needs a target of shape {expected}, got {target.shape}")
    return n, c, s


def _nll_program(ctx, weighted, divide, index_t, shifted):
    key = ("nll_program", weighted, divide, index_t, shifted)
    built = ctx.memo.get(key)
    if built is None:
        built = ctx.memo[key] = program.build(ctx, "loss", dict(
            weighted=weighted, divide=divide, index_t=index_t, shifted=shifted))
    return built


def _enqueue(ctx, built, name, gsize, lsize, args):
    """Enqueue kernel ``name`` of ``built`` with ``args`` on the context's queue; an argument
    is set only when it differs from the last call's (``bind``)."""
    bind(built.kernel(name))(ctx.queue, gsize, lsize, *args)


def _range_flag(ctx):
    """The context's target-range flag (4 int64: set, offending value, classes, ignore_index),
    zero while no call has seen a bad target: whoever raises on it clears it."""
    # Kept outside any recording: a plan replaying its zero fill would drop an error another
    # call had set.
    return ctx.kept_tensor("nll_range_flag", lambda: Tensor.zeros(ctx, (4,), np.int64))


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """torch.nn.functional.nll_loss: input float32 log-probabilities (N, C, ...), target int64.

    "mean" divides by the sum of the weights of the non-ignored targets (torch's rule; NaN when
    every target is ignored). A target outside [0, C) other than ``ignore_index`` raises
    ShapeError at the next synchronizing call (see the module's text).
    """
    _check_reduction(reduction, "nll_loss")
    out, grad_of_input = _nll(input, target, weight, ignore_index, reduction)
    return autograd.record(out, (input, None, None), lambda g: (grad_of_input(g), None, None), "nll_loss")


def _range_check_mode():
    mode = config.forced_algorithm("range_check") or DEFAULT_RANGE_CHECK
    if mode not in RANGE_CHECKS:
        raise UnsupportedError(f"range check must be one of {RANGE_CHECKS}, got {mode!r}")
    return mode


def _pinned_flag(ctx):
    """Four int64 of page-locked host memory for the flag's read-back: a buffer allocated by
    the driver in host memory (ALLOC_HOST_PTR), mapped once and kept mapped."""
    host = ctx.memo.get("nll_range_host")
    if host is None:
        buffer = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, 32)
        array, _ = cl.enqueue_map_buffer(ctx.queue, buffer, cl.map_flags.READ | cl.map_flags.WRITE,
                                         0, (4,), np.int64, is_blocking=True)
        host = ctx.memo["nll_range_host"] = (buffer, array)
    return host[1]


def _raise_on_range_flag(ctx, read=None):
    """Raise ShapeError (clearing the flag) where a call's check found a bad target. ``read``:
    the pending non-blocking read of the flag into the pinned array (immediate checks); by
    default a blocking read now (a synchronizing call's deferred check)."""
    flag, host = _range_flag(ctx), _pinned_flag(ctx)
    if read is None:
        cl.enqueue_copy(ctx.queue, host, flag.buffer, src_offset=flag.offset, is_blocking=True)
    else:
        read.wait()
    if host[0]:
        bad_value, classes, ignore_index = (int(v) for v in host[1:])
        flag.fill_(0)
        host[:] = 0
        raise ShapeError(f"nll_loss: target {bad_value} is out of range for {classes} classes "
                         f"(expected 0..{classes - 1} or ignore_index={ignore_index})"
                         + ("" if read is not None else
                            "; raised at the first synchronizing call after the call that read "
                            "it (DLPRIM_RANGE_CHECK_ALGO=immediate raises in the call itself)"))


def _enqueue_range_check(setup, target):
    """Enqueue the target check kernel of one call; it sets the context's flag on a bad target."""
    if setup.total:
        _enqueue(setup.ctx, setup.built, "nll_check", *setup.launch,
                 [setup.total_arg, setup.classes_arg, setup.ignore_arg, target.buffer,
                  setup.target_offset_arg, _range_flag(setup.ctx).buffer])


def _read_range_flag(ctx):
    """A non-blocking read of the flag into the pinned array (the immediate mode: enqueued
    right after the check, so that the host then waits for the check, not for the call's own
    work)."""
    flag = _range_flag(ctx)
    return cl.enqueue_copy(ctx.queue, _pinned_flag(ctx), flag.buffer, src_offset=flag.offset,
                           is_blocking=False)


def _finish_range_check(setup, mode, read):
    """After a call's own work is enqueued: deferred, the context checks the flag at its next
    synchronizing call; immediate, wait for the flag's ``read`` and raise on a bad target."""
    if not setup.total:
        return
    if mode == "deferred":
        setup.ctx.defer_check("nll_range", _raise_on_range_flag)
    else:
        _raise_on_range_flag(setup.ctx, read)


class _NllSetup:
    """A validated nll_loss problem: geometry (n, c, s), context, index type, program, launch
    size, and its scalar kernel arguments made once (a bound kernel skips an argument passed
    again as the same object)."""

    def __init__(self, n, c, s, ctx, index, built, input, target, weight, ignore_index):
        self.n, self.c, self.s, self.ctx, self.index, self.built = n, c, s, ctx, index, built
        self.total = total = n * s
        self.ignore_index = ignore_index
        self.launch = launch_size(ctx, max(total, 1))
        self.total_arg, self.classes_arg, self.spatial_arg = index(total), index(c), index(s)
        self.ignore_arg = np.int64(ignore_index)
        self.input_offset_arg = index(input.offset_elements)
        self.target_offset_arg = index(target.offset_elements)
        self.weight_offset_arg = index((weight if weight is not None else input).offset_elements)
        self.zero_arg = index(0)
        self._scratch = {}

    def scratch(self, name, shape):
        """A tensor of this problem's own for an intermediate that no call keeps past its
        end (calls run in order on the context's queue, so one serves them all)."""
        t = self._scratch.get(name)
        if t is None:
            t = self._scratch[name] = Tensor.empty(self.ctx, shape)
        return t


_MAX_SETUPS = 64


def _nll_setup(input, target, weight, reduction, shifted, ignore_index):
    """The ``_NllSetup`` of an nll_loss call, validated; memoized per context by shapes,
    dtypes and offsets (at most _MAX_SETUPS: each holds its scratch tensors)."""
    # Before the memo: 1.0 == 1 would find the setup of ignore_index=1.
    if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, bool):
        raise DTypeError(f"nll_loss: ignore_index must be an int, got {ignore_index!r}")
    key = _setup_key(input, target, weight, reduction, shifted, ignore_index)
    ctx = getattr(input, "ctx", None)
    if key is not None and ctx is not None:
        setup = ctx.memo.get("nll_setups", {}).get(key)
        if (setup is not None and target.ctx is setup.ctx
                and (weight is None or weight.ctx is setup.ctx)):
            return setup
    setup = _validate_nll(input, target, weight, reduction, shifted, ignore_index)
    if key is not None:
        setups = setup.ctx.memo.setdefault("nll_setups", {})
        if len(setups) >= _MAX_SETUPS:
            setups.clear()
        setups[key] = setup
    return setup


def _setup_key(input, target, weight, reduction, shifted, ignore_index):
    """The memo key of a call's setup, or None where the operands give none (not tensors, or
    something unhashable): validation then says what is wrong."""
    try:
        key = (input.shape, input.dtype, input.offset, target.shape, target.dtype, target.offset,
               None if weight is None else (weight.shape, weight.dtype, weight.offset),
               reduction == "mean", shifted, ignore_index)
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


def _validate_nll(input, target, weight, reduction, shifted, ignore_index):
    n, c, s = _nll_geometry(input, target)
    if weight is not None:
        _check_float(weight, "nll_loss: weight")
        if weight.shape != (c,):
            raise ShapeError(f"nll_loss: weight must have shape ({c},) for {c} classes, got {weight.shape}")
    ctx = check_same_context(input, target, weight)
    total = n * s
    largest = max(input.offset_elements + input.size, total, target.offset_elements + target.size)
    index = np.int32 if largest < 2 ** 31 - 1 else np.int64
    built = _nll_program(ctx, weight is not None, reduction == "mean",
                         "int" if index is np.int32 else "long", shifted)
    return _NllSetup(n, c, s, ctx, index, built, input, target, weight, int(ignore_index))


def _nll(input, target, weight, ignore_index, reduction, shift_of=None):
    """The nll_loss forward, enqueued; returns (loss, g -> gradient wrt the log-probabilities).
    ``shift_of(setup)``: enqueues two per-target-element shifts (float32, dense) and returns
    them, (m, l); the log-probabilities are then ``(input - m) - l`` along the classes, never
    materialized (cross_entropy: the logits' max and the log of their sum of exp(x - max)).

    In the deferred range-check mode the forward's launches (check, shift, gather, sums) replay
    from one plan per setup and reduction; in the immediate mode the call waits for its check."""
    setup = _nll_setup(input, target, weight, reduction, shift_of is not None, ignore_index)
    ctx, index, built, total = setup.ctx, setup.index, setup.built, setup.total
    c, s = setup.c, setup.s
    gsize, lsize = setup.launch
    mode = _range_check_mode()
    if reduction == "none":
        out, divisor = Tensor.empty(ctx, target.shape), None
    else:
        out, divisor = Tensor.empty(ctx, ()), Tensor.empty(ctx, ())
    w = weight if weight is not None else input

    reads = []

    def forward():
        _enqueue_range_check(setup, target)
        if mode == "immediate" and total:
            reads.append(_read_range_flag(ctx))
        shifts = () if shift_of is None else shift_of(setup)
        # The per-element losses are the result of "none"; the sums' inputs otherwise.
        loss = out if reduction == "none" else setup.scratch("loss", target.shape)
        picked = setup.scratch("picked", target.shape)
        if total:
            zero = setup.zero_arg
            _enqueue(ctx, built, "nll_gather", gsize, lsize,
                     [setup.total_arg, setup.classes_arg, setup.spatial_arg, setup.ignore_arg,
                      input.buffer, setup.input_offset_arg,
                      *(arg for t in shifts
                        for arg in (t.buffer, zero if t.offset == 0 else index(t.offset_elements))),
                      target.buffer, setup.target_offset_arg, w.buffer, setup.weight_offset_arg,
                      loss.buffer, zero, picked.buffer, zero])
        if reduction != "none":
            kernel = _memo(("nll_reduce", reduction), lambda: ReduceKernel(
                f"nll_reduce_{reduction}", [("l", _f32), ("w", _f32)], [("y", _f32), ("wsum", _f32)],
                "y = l; wsum = w;", "sum",
                finalize="acc_y = acc_y / acc_wsum;" if reduction == "mean" else ""))
            if total:
                kernel([loss, picked], [out, divisor])
            else:
                out.fill_(np.nan if reduction == "mean" else 0.0)
                divisor.fill_(0.0)

    if mode == "deferred":
        run_planned_on(ctx, ("nll_forward", setup, reduction, shift_of is not None, R.switches()),
                       (input, target, weight, out, divisor), forward)
    else:
        forward()
    _finish_range_check(setup, mode, reads[0] if reads else None)
    source_shape = input.shape

    def backward(g):
        dx = Tensor.empty(ctx, source_shape)
        d = divisor if divisor is not None else g

        def run():
            dx.fill_(0.0)
            if total:
                bind(built.kernel("nll_scatter"))(
                    ctx.queue, gsize, lsize, index(total), index(c), index(s),
                    np.int64(ignore_index), target.buffer, index(target.offset_elements), w.buffer,
                    index(w.offset_elements), g.buffer, index(g.offset_elements),
                    index(1 if reduction == "none" else 0), d.buffer, index(d.offset_elements),
                    dx.buffer, index(0))

        # Replayed per setup (shapes, offsets, options) and gradient layout.
        run_planned_on(ctx, ("nll_backward", setup, g.shape, g.dtype, g.offset, d.offset),
                       (target, w, g, d, dx), run)
        return dx

    return out, backward


def _logsumexp_kernel():
    """(m, s) = (max, log of the sum of exp(. - max)) over the classes, merged online: the
    picked log-probability is then (x - m) - s, exact for the largest logits whatever their
    scale (x - (m + s) would round m + s to m's ulp: 0.41 off at logits of 1e7).

    As torch's log_softmax, a NaN or +inf logit anywhere in a row makes s NaN (and with it
    every loss of the row), a row of -inf gives m = -inf, and -inf logits add nothing. A NaN
    logit enters as the pair (NaN, NaN): it fails m > acc_m and adds its NaN s to the sum,
    whatever exp gives for a NaN argument. A pair with m == -inf holds no finite element and
    adds 0, or its s where that is NaN (a pair of -inf and NaN logits), which also avoids
    exp(-inf - -inf). The NaN is kept by comparisons, not by arithmetic with a constant zero:
    a compiler may fold s * 0.0f to 0 (rusticl of Mesa 22.3 does), which would drop it. A
    +inf max enters with a sum of 1: the finalize makes it NaN."""
    return _memo("logsumexp", lambda: ReduceKernel(
        "reduce_logsumexp", [("x", _f32)], [("m", _f32), ("s", _f32)],
        "m = x; s = x != x ? x : 1.0f;",
        "if (m > acc_m) { acc_s = acc_s * exp(acc_m - m) + s; acc_m = m; }"
        " else { acc_s += m == -INFINITY ? (s != s ? s : 0.0f) : s * exp(m - acc_m); }",
        {"m": "-INFINITY", "s": "0.0f"},
        finalize="acc_s = acc_m == INFINITY ? NAN : log(acc_s);"))


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0):
    """torch.nn.functional.cross_entropy: log_softmax over dim 1 (dim 0 for a (C) input), then
    nll_loss for int64 class targets, or -sum(weight * target * log p) over the classes for a
    float32 probability target shaped like the input (mean averages over all positions).

    ``label_smoothing`` ε in [0, 1]: a probability target becomes target (1 - ε) + ε / C; with
    class targets the loss is (1 - ε) nll + ε / C times the sum of -weight * log p over the
    classes of each non-ignored position, reduced as torch reduces it ("mean" divides by the
    targets' weight sum)."""
    _check_reduction(reduction, "cross_entropy")
    _check_float(input, "cross_entropy: input")
    label_smoothing = _param(label_smoothing, "cross_entropy: label_smoothing")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ShapeError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    if input.ndim == 0:
        raise ShapeError(f"cross_entropy: input must be (C), (N, C) or (N, C, d1, ...), got {input.shape}")
    class_dim = 0 if input.ndim == 1 else 1
    if label_smoothing != 0.0:
        return _smoothed_cross_entropy(input, target, weight, ignore_index, reduction,
                                       label_smoothing, class_dim)
    if isinstance(target, Tensor) and target.dtype == np.int64:
        # One read of the logits: their max and log-sum-exp over the classes, then the picked
        # logit minus them. The backward forms log_softmax then.
        keep_dims = tuple(1 if k == class_dim else d for k, d in enumerate(input.shape))

        def log_sum_exp(setup):
            row_max = setup.scratch("row_max", keep_dims)
            log_sum = setup.scratch("log_sum", keep_dims)
            if input.size:
                _logsumexp_kernel()([input], [row_max, log_sum], axes=(class_dim,))
            return row_max, log_sum

        out, grad_of_logp = _nll(input, target, weight, ignore_index, reduction, log_sum_exp)
        source = input.detach()

        def backward(g):
            logp = log_softmax(source, class_dim)
            return (softmax_backward(logp, grad_of_logp(g), class_dim, log=True), None, None)

        return autograd.record(out, (input, None, None), backward, "cross_entropy")
    if not isinstance(target, Tensor) or target.dtype != np.float32:
        raise DTypeError(f"cross_entropy: target must be int64 class indices or float32 "
                         f"probabilities, got {getattr(target, 'dtype', type(target).__name__)}")
    if target.shape != input.shape:
        raise ShapeError(f"cross_entropy: a probability target must have the input's shape "
                         f"{input.shape}, got {target.shape}")
    logp = log_softmax(input, class_dim)
    product = mul(logp, target)
    if weight is not None:
        _check_float(weight, "cross_entropy: weight")
        c = input.shape[class_dim]
        if weight.shape != (c,):
            raise ShapeError(f"cross_entropy: weight must have shape ({c},), got {weight.shape}")
        product = mul(product, weight.reshape((c,) + (1,) * (input.ndim - class_dim - 1)))
    per_sample = mul(R.sum(product, class_dim), -1.0)
    if reduction == "none":
        return per_sample
    if reduction == "sum":
        return R.sum(per_sample)
    return R.mean(per_sample)


# ---- mse_loss / binary_cross_entropy_with_logits -------------------------------------------

def _fused_loss(name, operands, map_statement, reduction, backward_kernel, backward_inputs,
                grads_for):
    """Shared body: elementwise loss (none) or fused map+reduce (mean/sum), and the backward.

    ``operands``: the tensors broadcast together; ``map_statement`` assigns ``y`` from them;
    ``backward_kernel`` computes one gradient per entry of ``grads_for`` from
    ``backward_inputs + [g]`` with scalar ``scale``.
    """
    ctx = check_same_context(*operands)
    shape = broadcast_shapes(*(t.shape for t in operands))
    names = [f"in{k}" for k in range(len(operands))]
    count = math.prod(shape)
    if reduction == "none":
        kernel = _memo((name, "none"), lambda: PointwiseKernel(
            f"{name}_none", [(n, _f32) for n in names], [("y", _f32)], map_statement))
        out = Tensor.empty(ctx, shape)
        kernel(list(operands), [out])
        scale = 1.0
    else:
        kernel = _memo((name, "reduce"), lambda: ReduceKernel(
            f"{name}_reduce", [(n, _f32) for n in names], [("y", _f32)], map_statement, "sum",
            finalize="acc_y = acc_y * scale;", scalars=[("scale", _f32)]))
        out = Tensor.empty(ctx, ())
        scale = (1.0 / count if count else math.nan) if reduction == "mean" else 1.0
        if count:
            kernel(list(operands), [out], [scale])
        else:
            out.fill_(scale if reduction == "mean" else 0.0)
    sources = [t.detach() for t in backward_inputs]

    def backward(g):
        grads = [Tensor.empty(ctx, shape) for _ in grads_for]
        if count:
            backward_kernel([*sources, g], grads, [scale])
        return tuple(reduce_to_shape(gr, t.shape) if t is not None else None
                     for gr, t in zip(grads, grads_for))

    return autograd.record(out, grads_for, backward, name)


def mse_loss(input, target, reduction="mean"):
    """torch.nn.functional.mse_loss: (input - target)^2, broadcast, reduced; gradients to both."""
    _check_reduction(reduction, "mse_loss")
    _check_float(input, "mse_loss: input")
    _check_float(target, "mse_loss: target")
    backward = _memo("mse_backward", lambda: PointwiseKernel(
        "mse_backward", [("a", _f32), ("b", _f32), ("g", _f32)], [("da", _f32), ("db", _f32)],
        "da = 2.0f * (a - b) * g * scale; db = -da;", scalars=[("scale", _f32)]))
    return _fused_loss("mse_loss", [input, target], "float d = in0 - in1; y = d * d;", reduction,
                       backward, [input, target], (input, target))


# torch's stable form: (1 - t) x + (1 + (pw - 1) t) (log1p(exp(-|x|)) + max(-x, 0)), times w.
_BCE = ("float lw = 1.0f + (in3 - 1.0f) * in1;"
        "float sp = log1p(exp(-fabs(in0))) + fmax(-in0, 0.0f);"
        "y = in2 * ((1.0f - in1) * in0 + lw * sp);")


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """torch.nn.functional.binary_cross_entropy_with_logits, numerically stable; ``weight``
    broadcasts to the input, ``pos_weight`` along the last (class) dimension. Gradients flow to
    input and target."""
    _check_reduction(reduction, "binary_cross_entropy_with_logits")
    _check_float(input, "binary_cross_entropy_with_logits: input")
    _check_float(target, "binary_cross_entropy_with_logits: target")
    if target.shape != input.shape:
        raise ShapeError(f"binary_cross_entropy_with_logits: target shape {target.shape} must "
                         f"equal the input shape {input.shape}")
    ones = None
    if weight is None or pos_weight is None:
        ones = Tensor.full(input.ctx, (), 1.0)
    if weight is not None:
        _check_float(weight, "binary_cross_entropy_with_logits: weight")
    if pos_weight is not None:
        _check_float(pos_weight, "binary_cross_entropy_with_logits: pos_weight")
    w = weight if weight is not None else ones
    pw = pos_weight if pos_weight is not None else ones
    if broadcast_shapes(input.shape, w.shape, pw.shape) != input.shape:
        raise ShapeError(f"binary_cross_entropy_with_logits: weight {w.shape} and pos_weight "
                         f"{pw.shape} must broadcast to the input shape {input.shape}")
    backward = _memo("bce_backward", lambda: PointwiseKernel(
        "bce_logits_backward", [("x", _f32), ("t", _f32), ("w", _f32), ("pw", _f32), ("g", _f32)],
        [("dx", _f32), ("dt", _f32)],
        "float lw = 1.0f + (pw - 1.0f) * t;"
        "float sig_neg = 1.0f / (1.0f + exp(x));"     # sigmoid(-x)
        "float sp = log1p(exp(-fabs(x))) + fmax(-x, 0.0f);"
        "float gs = g * w * scale;"
        "dx = gs * ((1.0f - t) - lw * sig_neg);"
        "dt = gs * (-x + (pw - 1.0f) * sp);", scalars=[("scale", _f32)]))
    return _fused_loss("bce_with_logits", [input, target, w, pw], _BCE, reduction, backward,
                       [input, target, w, pw], (input, target))


# ---- elementwise losses: one map (+ reduce) kernel forward, one kernel backward -------------

def unit_weight(ctx):
    """A 0-d 1.0 kept per context: the weight operand of a call without one (nothing writes
    it; a fresh one per call would cost a fill)."""
    return ctx.kept_tensor("unit_weight", lambda: Tensor.full(ctx, (), 1.0))


def _elementwise_loss(name, operands, forward, backward, grads, reduction, params=(),
                      divisor=None, rows=False):
    """An elementwise loss over ``operands`` broadcast together, reduced; its backward on the
    tape.

    ``forward``: C code assigning ``y`` from ``in0``, ``in1``, ... and the ``params`` (pairs
    (name, value), float scalars of both kernels). ``backward``: C code assigning ``d<k>`` for
    each operand index k in ``grads`` from the operands, the incoming gradient ``g`` and
    ``scale`` (the reduction's factor, already in ``g``'s place: multiply by it). "mean"
    divides by ``divisor`` (default: the number of elements). ``rows``: the loss of an element
    is summed over the last dimension and divided by its size first (one value per row:
    "none" gives a loss per row, "mean" averages the rows)."""
    ctx = check_same_context(*operands)
    shape = broadcast_shapes(*(t.shape for t in operands))
    names = [f"in{k}" for k in range(len(operands))]
    scalar_names = [n for n, _ in params]
    values = [float(v) for _, v in params]
    count = math.prod(shape)
    row_size = shape[-1] if rows and shape else 1
    if reduction == "none" and not rows:
        kernel = _memo((name, "none"), lambda: PointwiseKernel(
            f"{name}_none", [(n, _f32) for n in names], [("y", _f32)], forward,
            scalars=[(n, _f32) for n in scalar_names]))
        out = Tensor.empty(ctx, shape)
        kernel(list(operands), [out], values)
        scale = 1.0
    else:
        kernel = _memo((name, "reduce"), lambda: ReduceKernel(
            f"{name}_reduce", [(n, _f32) for n in names], [("y", _f32)], forward, "sum",
            finalize="acc_y = acc_y * scale;",
            scalars=[("scale", _f32)] + [(n, _f32) for n in scalar_names]))
        if reduction == "none":          # rows
            out = Tensor.empty(ctx, shape[:-1])
            scale = 1.0 / row_size if row_size else math.nan
            kept = shape[:-1] + (1,)
        else:
            out = Tensor.empty(ctx, ())
            kept = None
            if reduction == "mean":
                total = (count // row_size if row_size else 0) if divisor is None else divisor
                scale = 1.0 / (total * row_size) if total and row_size else math.nan
            else:
                scale = 1.0 / row_size if row_size else math.nan
        if count:
            kernel(list(operands), [out if kept is None else _view(out, kept)], [scale, *values],
                   axes=None if kept is None else (len(shape) - 1,))
        else:
            out.fill_(math.nan if reduction == "mean" or rows and not row_size else 0.0)
    sources = [t.detach() for t in operands]

    def backward_fn(g):
        kernel = _memo((name, "backward"), lambda: PointwiseKernel(
            f"{name}_backward", [(n, _f32) for n in names] + [("g", _f32)],
            [(f"d{k}", _f32) for k in grads], backward,
            scalars=[("scale", _f32)] + [(n, _f32) for n in scalar_names]))
        if rows and reduction == "none":
            g = _view(g, shape[:-1] + (1,))
        result = [Tensor.empty(ctx, shape) for _ in grads]
        if count:
            kernel([*sources, g], result, [scale, *values])
        by_index = dict(zip(grads, result))
        return tuple(reduce_to_shape(by_index[k], t.shape) if k in by_index else None
                     for k, t in enumerate(operands))

    return autograd.record(out, [t if k in grads else None for k, t in enumerate(operands)],
                           backward_fn, name)


def legacy_reduction(size_average, reduce, reduction):
    """torch's rule for the deprecated ``size_average`` and ``reduce`` arguments: where either
    is given, they decide the reduction (each True when None): "none" without ``reduce``, else
    "mean" with ``size_average`` and "sum" without."""
    if size_average is None and reduce is None:
        return reduction
    reduce = True if reduce is None else reduce
    size_average = True if size_average is None else size_average
    return "none" if not reduce else ("mean" if size_average else "sum")


def _loss_inputs(name, reduction, *tensors, same_shape=False, reductions=_REDUCTIONS):
    """Check a loss's reduction and float32 tensor operands (named), broadcastable (or of one
    shape with ``same_shape``)."""
    if reduction not in reductions:
        raise UnsupportedError(f"{name}: reduction must be one of {reductions}, got {reduction!r}")
    for what, t in tensors:
        _check_float(t, f"{name}: {what}")
    first = tensors[0][1]
    for what, t in tensors[1:]:
        if same_shape and t.shape != first.shape:
            raise ShapeError(f"{name}: {what} must have the input's shape {first.shape}, got "
                             f"{t.shape}")
    broadcast_shapes(*(t.shape for _, t in tensors))


def _param(value, what, positive=False, non_negative=False):
    if not isinstance(value, (int, float, np.number)) or isinstance(value, bool):
        raise DTypeError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if positive and not value > 0:
        raise ShapeError(f"{what} must be > 0, got {value}")
    if non_negative and not value >= 0:
        raise ShapeError(f"{what} must be >= 0, got {value}")
    return value


_SIGN = "((d > 0.0f) ? 1.0f : ((d < 0.0f) ? -1.0f : 0.0f))"


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.l1_loss: abs(input - target), broadcast, reduced; gradients to both."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("l1_loss", reduction, ("input", input), ("target", target))
    return _elementwise_loss(
        "l1_loss", [input, target], "y = fabs(in0 - in1);",
        f"float d = in0 - in1; d0 = {_SIGN} * g * scale; d1 = -d0;", (0, 1), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """torch.nn.functional.smooth_l1_loss: 0.5 d^2 / beta where abs(d) < ``beta``, else
    abs(d) - 0.5 beta (d = input - target); beta = 0 is l1_loss."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("smooth_l1_loss", reduction, ("input", input), ("target", target))
    beta = _param(beta, "smooth_l1_loss: beta", non_negative=True)
    return _elementwise_loss(
        "smooth_l1_loss", [input, target],
        "float d = fabs(in0 - in1); y = d < beta ? 0.5f * d * d / beta : d - 0.5f * beta;",
        "float d = in0 - in1;"
        "d0 = g * scale * (d < -beta ? -1.0f : (d > beta ? 1.0f : (beta == 0.0f ? 0.0f : d / beta)));"
        "d1 = -d0;", (0, 1), reduction, [("beta", beta)])


def huber_loss(input, target, reduction="mean", delta=1.0):
    """torch.nn.functional.huber_loss: 0.5 d^2 where abs(d) < ``delta``, else
    delta (abs(d) - 0.5 delta) (d = input - target); delta > 0."""
    _loss_inputs("huber_loss", reduction, ("input", input), ("target", target))
    delta = _param(delta, "huber_loss: delta", positive=True)
    return _elementwise_loss(
        "huber_loss", [input, target],
        "float d = fabs(in0 - in1); y = d < delta ? 0.5f * d * d : delta * (d - 0.5f * delta);",
        "float d = in0 - in1;"
        "d0 = g * scale * (d < -delta ? -delta : (d > delta ? delta : d)); d1 = -d0;",
        (0, 1), reduction, [("delta", delta)])


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """torch.nn.functional.kl_div: target (log target - input), the input being
    log-probabilities; ``log_target``: the target is given as log-probabilities too.
    ``reduction`` "batchmean" divides the sum by the batch size (input.shape[0]); "mean"
    averages every element, as torch's. A target of 0 adds 0 (torch's xlogy)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("kl_div", reduction, ("input", input), ("target", target),
                 reductions=_REDUCTIONS + ("batchmean",))
    divisor = None
    if reduction == "batchmean":
        reduction, divisor = "mean", (input.shape[0] if input.ndim else 1)
    if log_target:
        return _elementwise_loss(
            "kl_div_log_target", [input, target], "y = exp(in1) * (in1 - in0);",
            "float e = exp(in1) * g * scale; d0 = -e; d1 = e * (in1 - in0 + 1.0f);", (0, 1),
            reduction, divisor=divisor)
    return _elementwise_loss(
        "kl_div", [input, target],
        "y = (in1 == 0.0f ? 0.0f : in1 * log(in1)) - in1 * in0;",
        "d0 = -in1 * g * scale; d1 = g * scale * ((in1 == 0.0f ? 0.0f : log(in1) + 1.0f) - in0);",
        (0, 1), reduction, divisor=divisor)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """torch.nn.functional.binary_cross_entropy: -w (t log x + (1 - t) log(1 - x)), each log
    clamped to >= -100 as torch's; ``weight`` broadcasts to the input. Gradients to input and
    target. An input outside [0, 1] gives NaN (torch raises on the host)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("binary_cross_entropy", reduction, ("input", input), ("target", target),
                 same_shape=True)
    operands = [input, target]
    if weight is not None:
        _check_float(weight, "binary_cross_entropy: weight")
        if broadcast_shapes(input.shape, weight.shape) != input.shape:
            raise ShapeError(f"binary_cross_entropy: weight {weight.shape} must broadcast to the "
                             f"input shape {input.shape}")
        operands.append(weight)
    else:
        operands.append(unit_weight(input.ctx))
    return _elementwise_loss(
        "binary_cross_entropy", operands,
        "float lx = log(in0); lx = lx < -100.0f ? -100.0f : lx;"
        "float l1x = log1p(-in0); l1x = l1x < -100.0f ? -100.0f : l1x;"
        "y = -in2 * (in1 * lx + (1.0f - in1) * l1x);",
        "float lx = log(in0); lx = lx < -100.0f ? -100.0f : lx;"
        "float l1x = log1p(-in0); l1x = l1x < -100.0f ? -100.0f : l1x;"
        "float gw = g * scale * in2;"
        "d0 = gw * (in0 - in1) / fmax((1.0f - in0) * in0, 1e-12f);"
        "d1 = gw * (l1x - lx);", (0, 1), reduction)


def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8,
                     reduce=None, reduction="mean"):
    """torch.nn.functional.poisson_nll_loss: exp(input) - target input (``log_input``), else
    input - target log(input + ``eps``); ``full`` adds Stirling's term where target > 1.
    ``size_average``/``reduce``: torch's deprecated form of ``reduction``."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("poisson_nll_loss", reduction, ("input", input), ("target", target))
    eps = _param(eps, "poisson_nll_loss: eps")
    stirling = "(in1 > 1.0f ? in1 * log(in1) - in1 + 0.5f * log(6.283185307179586f * in1) : 0.0f)"
    stirling_grad = "(in1 > 1.0f ? log(in1) + 0.5f / in1 : 0.0f)"
    return _elementwise_loss(
        "poisson_nll_loss", [input, target],
        f"y = (log_input != 0.0f ? exp(in0) - in1 * in0 : in0 - in1 * log(in0 + eps))"
        f" + (full != 0.0f ? {stirling} : 0.0f);",
        "float gs = g * scale;"
        "d0 = gs * (log_input != 0.0f ? exp(in0) - in1 : 1.0f - in1 / (in0 + eps));"
        f"d1 = gs * ((log_input != 0.0f ? -in0 : -log(in0 + eps))"
        f" + (full != 0.0f ? {stirling_grad} : 0.0f));",
        (0, 1), reduction, [("log_input", bool(log_input)), ("full", bool(full)), ("eps", eps)])


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean"):
    """torch.nn.functional.gaussian_nll_loss: 0.5 (log v + (input - target)^2 / v) with
    v = max(var, ``eps``) (the gradient to var as if unclamped, as torch's), plus
    0.5 log(2 pi) with ``full``. ``var``: the input's shape, or one dimension short of it (the
    last), or of the input's rank with size 1 in the one dimension where they differ; or a
    float. A negative var gives NaN (torch raises on the host)."""
    _check_reduction(reduction, "gaussian_nll_loss")
    _check_float(input, "gaussian_nll_loss: input")
    _check_float(target, "gaussian_nll_loss: target")
    if isinstance(var, (int, float, np.number)) and not isinstance(var, bool):
        if var < 0:
            raise ShapeError(f"gaussian_nll_loss: var must be >= 0, got {var}")
        var = Tensor.full(input.ctx, (), float(var))
    _check_float(var, "gaussian_nll_loss: var")
    original = var
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape and input.ndim:
            var = var.reshape(var.shape + (1,))
        elif not (input.ndim == var.ndim and sum(v for i, v in zip(input.shape, var.shape)
                                                 if i != v) == 1) and var.ndim:
            raise ShapeError(f"gaussian_nll_loss: var of shape {var.shape} does not fit the "
                             f"input {input.shape} (expected {input.shape}, "
                             f"{input.shape[:-1]}, or the input's shape with 1 in one "
                             f"dimension)")
    broadcast_shapes(input.shape, target.shape, var.shape)
    eps = _param(eps, "gaussian_nll_loss: eps")
    return _elementwise_loss(
        "gaussian_nll_loss", [input, target, var],
        "float v = fmax(in2, eps); float d = in0 - in1;"
        "y = 0.5f * (log(v) + d * d / v) + (full != 0.0f ? 0.9189385332046727f : 0.0f);",
        "float v = fmax(in2, eps); float d = in0 - in1; float gs = g * scale;"
        "d0 = gs * d / v; d1 = -d0; d2 = gs * 0.5f * (1.0f / v - d * d / (v * v));",
        (0, 1, 2), reduction, [("full", bool(full)), ("eps", eps)])


def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None,
                         reduction="mean"):
    """torch.nn.functional.hinge_embedding_loss: input where target is 1, max(0, margin -
    input) where it is -1 (both terms where it is neither, as torch's); gradient to input."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("hinge_embedding_loss", reduction, ("input", input), ("target", target))
    margin = _param(margin, "hinge_embedding_loss: margin")
    return _elementwise_loss(
        "hinge_embedding_loss", [input, target],
        "y = (in1 != 1.0f ? fmax(margin - in0, 0.0f) : 0.0f) + (in1 != -1.0f ? in0 : 0.0f);",
        "d0 = g * scale * ((in1 != 1.0f && margin - in0 >= 0.0f ? -1.0f : 0.0f)"
        " + (in1 != -1.0f ? 1.0f : 0.0f));", (0,), reduction, [("margin", margin)])


def margin_ranking_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                        reduction="mean"):
    """torch.nn.functional.margin_ranking_loss: max(0, -target (input1 - input2) + margin);
    the three have one rank and broadcast. Gradients to all three."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("margin_ranking_loss", reduction, ("input1", input1), ("input2", input2),
                 ("target", target))
    if not input1.ndim == input2.ndim == target.ndim:
        raise ShapeError(f"margin_ranking_loss: the inputs and target must have one rank, got "
                         f"{input1.shape}, {input2.shape} and {target.shape}")
    margin = _param(margin, "margin_ranking_loss: margin")
    return _elementwise_loss(
        "margin_ranking_loss", [input1, input2, target],
        "y = fmax(-in2 * (in0 - in1) + margin, 0.0f);",
        "float s = (-in2 * (in0 - in1) + margin >= 0.0f) ? g * scale : 0.0f;"
        "d0 = -in2 * s; d1 = in2 * s; d2 = -(in0 - in1) * s;", (0, 1, 2), reduction,
        [("margin", margin)])


def soft_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.soft_margin_loss: log(1 + exp(-target input)); gradient to the
    input (torch's target has none)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("soft_margin_loss", reduction, ("input", input), ("target", target))
    return _elementwise_loss(
        "soft_margin_loss", [input, target], "y = log1p(exp(-in1 * in0));",
        "d0 = -in1 * g * scale / (1.0f + exp(in1 * in0));", (0,), reduction)


def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None,
                                reduction="mean"):
    """torch.nn.functional.multilabel_soft_margin_loss: -(t logsigmoid(x) + (1 - t)
    logsigmoid(-x)) times ``weight`` (broadcast), averaged over the classes (the last
    dimension) of each sample, then reduced over the samples. Gradients to input and
    target."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _loss_inputs("multilabel_soft_margin_loss", reduction, ("input", input), ("target", target))
    if input.ndim == 0:
        raise ShapeError("multilabel_soft_margin_loss: the input must have a class dimension, "
                         "got a 0-d tensor")
    if weight is None:
        weight = unit_weight(input.ctx)
    _check_float(weight, "multilabel_soft_margin_loss: weight")
    # logsigmoid(x) = min(x, 0) - log1p(exp(-|x|)), and logsigmoid(-x) = logsigmoid(x) - x.
    return _elementwise_loss(
        "multilabel_soft_margin_loss", [input, target, weight],
        "float ls = fmin(in0, 0.0f) - log1p(exp(-fabs(in0)));"
        "y = -in2 * (in1 * ls + (1.0f - in1) * (ls - in0));",
        "float gs = g * scale * in2;"
        "d0 = gs * (1.0f / (1.0f + exp(-in0)) - in1); d1 = -gs * in0;", (0, 1), reduction,
        rows=True)


# ---- losses over distances -----------------------------------------------------------------

def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                          reduction="mean"):
    """torch.nn.functional.cosine_embedding_loss: 1 - cos where target is 1, max(0, cos -
    ``margin``) where it is -1 (0 elsewhere), cos over the last dimension of (N, D) or (D)
    inputs with torch's 1e-12 added to each squared norm. Gradients to both inputs."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "cosine_embedding_loss")
    for what, t in (("input1", input1), ("input2", input2), ("target", target)):
        _check_float(t, f"cosine_embedding_loss: {what}")
    ctx = check_same_context(input1, input2, target)
    if input1.shape != input2.shape or input1.ndim not in (1, 2):
        raise ShapeError(f"cosine_embedding_loss: the inputs must be (N, D) or (D) of one shape, "
                         f"got {input1.shape} and {input2.shape}")
    if target.shape != input1.shape[:-1]:
        raise ShapeError(f"cosine_embedding_loss: target must have shape {input1.shape[:-1]} for "
                         f"inputs {input1.shape}, got {target.shape}")
    margin = _param(margin, "cosine_embedding_loss: margin")
    rows = input1.shape[:-1] + (1,)
    dot, s1, s2 = (Tensor.empty(ctx, rows) for _ in range(3))
    if math.prod(rows):
        if input1.shape[-1]:
            _memo("cosine_sums", lambda: ReduceKernel(
                "cosine_sums", [("a", _f32), ("b", _f32)],
                [("c", _f32), ("s1", _f32), ("s2", _f32)], "c = a * b; s1 = a * a; s2 = b * b;",
                "sum"))([input1, input2], [dot, s1, s2], axes=(input1.ndim - 1,))
        else:
            for t in (dot, s1, s2):
                t.fill_(0.0)
    cos = "float r = sqrt((in1 + 1e-12f) * (in2 + 1e-12f)); float cs = in0 / r;"
    with autograd.no_grad():
        out = _elementwise_loss(
            "cosine_embedding_loss", [dot, s1, s2, _view(target, rows)],
            cos + "y = in3 == 1.0f ? 1.0f - cs : (in3 == -1.0f ? fmax(cs - margin, 0.0f) : 0.0f);",
            "", (), reduction, [("margin", margin)])
    if out.ndim == 2:
        out = _view(out, out.shape[:1])
    elif out.ndim == 1 and reduction == "none":
        out = _view(out, ())
    scale = (1.0 / math.prod(rows) if math.prod(rows) else math.nan) if reduction == "mean" else 1.0
    sources = (input1.detach(), input2.detach(), _view(target, rows))

    def backward(g):
        kernel = _memo("cosine_embedding_backward", lambda: PointwiseKernel(
            "cosine_embedding_loss_backward",
            [("a", _f32), ("b", _f32), ("t", _f32), ("c", _f32), ("s1", _f32), ("s2", _f32),
             ("g", _f32)], [("da", _f32), ("db", _f32)],
            "float p = s1 + 1e-12f, q = s2 + 1e-12f, r = sqrt(p * q), cs = c / r;"
            "float dc = t == 1.0f ? -1.0f : ((t == -1.0f && cs - margin >= 0.0f) ? 1.0f : 0.0f);"
            "dc *= g * scale;"
            "da = dc * (b / r - cs * a / p); db = dc * (a / r - cs * b / q);",
            scalars=[("scale", _f32), ("margin", _f32)]))
        da, db = Tensor.empty(ctx, input1.shape), Tensor.empty(ctx, input1.shape)
        if input1.size:
            kernel([sources[0], sources[1], sources[2], dot, s1, s2,
                    g if g.ndim == 0 else _view(g, rows)], [da, db], [scale, margin])
        return da, db, None

    return autograd.record(out, (input1, input2, None), backward, "cosine_embedding_loss")


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-6, swap=False,
                        size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.triplet_margin_loss: max(d(a, p) - d(a, n) + ``margin``, 0) with d
    ``pairwise_distance`` (``p``, ``eps``); ``swap`` takes min(d(a, n), d(p, n)) for the
    negative distance. Inputs (N, D) or (D), of one rank. Gradients to all three."""
    from .distance import pairwise_distance
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "triplet_margin_loss")
    for what, t in (("anchor", anchor), ("positive", positive), ("negative", negative)):
        _check_float(t, f"triplet_margin_loss: {what}")
    if not anchor.ndim == positive.ndim == negative.ndim or anchor.ndim not in (1, 2):
        raise ShapeError(f"triplet_margin_loss: anchor, positive and negative must all be (N, D) "
                         f"or (D), got {anchor.shape}, {positive.shape} and {negative.shape}")
    margin = _param(margin, "triplet_margin_loss: margin")
    if margin <= 0:
        raise ShapeError(f"triplet_margin_loss: margin must be > 0, got {margin}")
    return _triplet(lambda a, b: pairwise_distance(a, b, p, eps), anchor, positive, negative,
                    margin, swap, reduction)


def _triplet(distance, anchor, positive, negative, margin, swap, reduction):
    """max(d(a, p) - d(a, n) + ``margin``, 0) with d = ``distance``, reduced; ``swap`` takes
    min(d(a, n), d(p, n)). Both triplet losses' form."""
    from .arithmetic import minimum
    to_positive = distance(anchor, positive)
    to_negative = distance(anchor, negative)
    if swap:
        to_negative = minimum(to_negative, distance(positive, negative))
    for what, t in (("d(anchor, positive)", to_positive), ("d(anchor, negative)", to_negative)):
        if not isinstance(t, Tensor) or t.dtype != _f32:
            raise DTypeError(f"triplet_margin_with_distance_loss: distance_function must give "
                             f"float32 tensors, got {what} = {t!r}")
    return _elementwise_loss(
        "triplet_margin_loss", [to_positive, to_negative], "y = fmax(margin + in0 - in1, 0.0f);",
        "float s = margin + in0 - in1 >= 0.0f ? g * scale : 0.0f; d0 = s; d1 = -s;", (0, 1),
        reduction, [("margin", margin)])


def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None,
                                      margin=1.0, swap=False, reduction="mean"):
    """torch.nn.functional.triplet_margin_with_distance_loss: max(d(a, p) - d(a, n) +
    ``margin``, 0) with d = ``distance_function`` (a callable on two tensors giving a tensor
    of distances, default ``pairwise_distance``: any function of the library's operators, whose
    gradients flow through the tape); ``swap`` takes min(d(a, n), d(p, n)). The three inputs
    have one rank. Gradients to all three."""
    from .distance import pairwise_distance
    _check_reduction(reduction, "triplet_margin_with_distance_loss")
    for what, t in (("anchor", anchor), ("positive", positive), ("negative", negative)):
        _check_float(t, f"triplet_margin_with_distance_loss: {what}")
    if not anchor.ndim == positive.ndim == negative.ndim:
        raise ShapeError(f"triplet_margin_with_distance_loss: anchor, positive and negative "
                         f"must have one rank, got {anchor.shape}, {positive.shape} and "
                         f"{negative.shape}")
    margin = _param(margin, "triplet_margin_with_distance_loss: margin")
    if margin <= 0:
        raise ShapeError(f"triplet_margin_with_distance_loss: margin must be > 0, got {margin}")
    if distance_function is None:
        distance_function = pairwise_distance
    elif not callable(distance_function):
        raise DTypeError(f"triplet_margin_with_distance_loss: distance_function must be "
                         f"callable, got {distance_function!r}")
    return _triplet(distance_function, anchor, positive, negative, margin, swap, reduction)


# ---- multi-class margin losses ------------------------------------------------------------

def _class_indices(ctx, classes):
    """0, 1, ..., classes - 1 as float32 (C,), kept per context: the class of an element as an
    operand that broadcasts (exact below 2^24 classes)."""
    return ctx.kept_tensor(("class_indices", classes), lambda: Tensor.from_numpy(
        ctx, np.arange(classes, dtype=np.float32)))


def _class_geometry(name, input, target, target_like_input=False):
    """(N, C, input as (N, C), target as (N, 1) or (N, C)) of an (N, C) or (C) input."""
    _check_float(input, f"{name}: input")
    if not isinstance(target, Tensor):
        raise not_a_tensor(f"{name}: target", target)
    if target.dtype != np.int64:
        raise DTypeError(f"{name}: target must be int64 class indices, got {target.dtype}")
    check_same_context(input, target)
    if input.ndim not in (1, 2) or input.shape[-1] == 0:
        raise ShapeError(f"{name}: input must be (N, C) or (C) with C > 0, got {input.shape}")
    n, c = (1, input.shape[0]) if input.ndim == 1 else input.shape
    expected = input.shape if target_like_input else input.shape[:-1]
    if target.shape != expected:
        raise ShapeError(f"{name}: input {input.shape} needs a target of shape {expected}, got "
                         f"{target.shape}")
    # The input's view is on the tape (its gradient reaches the input).
    return n, c, input.reshape(n, c), _view(target, (n, c) if target_like_input else (n, 1))


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None,
                      reduce=None, reduction="mean"):
    """torch.nn.functional.multi_margin_loss: for each sample, the sum over the classes i other
    than its target y of max(0, ``margin`` - x[y] + x[i])^p (p 1 or 2), times weight[y], over C.
    Input (N, C) or (C), int64 target (N) or (). A target outside [0, C) raises ShapeError at
    the next synchronizing call, as nll_loss's. Gradient to the input."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "multi_margin_loss")
    if p not in (1, 2) or isinstance(p, bool):
        raise UnsupportedError(f"multi_margin_loss: p must be 1 or 2, got {p!r}")
    margin = _param(margin, "multi_margin_loss: margin")
    n, c, x, t = _class_geometry("multi_margin_loss", input, target)
    ctx = input.ctx
    if weight is not None:
        _check_float(weight, "multi_margin_loss: weight")
        if weight.shape != (c,):
            raise ShapeError(f"multi_margin_loss: weight must have shape ({c},), got {weight.shape}")
        w = _view(weight, (1, c))
    else:
        w = unit_weight(ctx)
    # The target's range, checked on the device as nll_loss checks it (no ignore_index here).
    setup = _nll_setup(input, target, None, "sum", False, -(2 ** 63))
    mode = _range_check_mode()
    _enqueue_range_check(setup, target)
    read = _read_range_flag(ctx) if mode == "immediate" and setup.total else None
    classes = _view(_class_indices(ctx, c), (1, c))
    # Per sample: its target's logit and weight, and the target as a float (one kernel).
    picked, picked_weight, target_class = (Tensor.empty(ctx, (n, 1)) for _ in range(3))
    _memo("margin_pick", lambda: ReduceKernel(
        "multi_margin_pick", [("x", _f32), ("t", np.int64), ("w", _f32), ("k", _f32)],
        [("xt", _f32), ("wt", _f32), ("tf", _f32)],
        "bool hit = (float)t == k; xt = hit ? x : 0.0f; wt = hit ? w : 0.0f; tf = (float)t;",
        "acc_xt += xt; acc_wt += wt; acc_tf = fmax(acc_tf, tf);",
        {"xt": "0.0f", "wt": "0.0f", "tf": "-INFINITY"}))([x, t, w, classes],
                                                     [picked, picked_weight, target_class])
    _finish_range_check(setup, mode, read)
    source, classes_source, target_source = x.detach(), classes, target_class
    if autograd.needs_grad(input):
        def pick_backward(g):
            dx = Tensor.empty(ctx, (n, c))
            _memo("margin_pick_backward", lambda: PointwiseKernel(
                "multi_margin_pick_backward", [("g", _f32), ("k", _f32), ("tf", _f32)],
                [("dx", _f32)], "dx = k == tf ? g : 0.0f;"))([g, classes_source, target_source],
                                                              [dx])
            return (dx,)

        picked = autograd.record(picked, (x,), pick_backward, "multi_margin_pick")
    out = _elementwise_loss(
        "multi_margin_loss", [x, picked, picked_weight, target_class, classes],
        "float z = margin - in1 + in0;"
        "y = (in4 != in3 && z > 0.0f) ? in2 * (power == 1.0f ? z : z * z) : 0.0f;",
        "float z = margin - in1 + in0;"
        "float dz = (in4 != in3 && z > 0.0f) ? in2 * (power == 1.0f ? 1.0f : 2.0f * z) : 0.0f;"
        "d0 = dz * g * scale; d1 = -d0;", (0, 1), reduction,
        [("margin", margin), ("power", float(p))], rows=True)
    if input.ndim == 1 and reduction == "none":
        out = out.reshape(())
    return out


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """torch.nn.functional.multilabel_margin_loss: for each sample, the target classes are
    the entries of its int64 target row up to the first negative one; the loss sums
    max(0, 1 - (x[j] - x[i])) over those entries j (a class named twice counts twice) and the
    classes i named by none of them, over C. Input and
    target (N, C) or (C). Entries at or past C are not checked (they match no class). Gradient
    to the input."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_reduction(reduction, "multilabel_margin_loss")
    n, c, x, t = _class_geometry("multilabel_margin_loss", input, target, target_like_input=True)
    ctx = input.ctx
    classes = _class_indices(ctx, c)
    # The first negative entry of each row, then how often each class is named before it
    # (torch's loop runs over target entries, so a class named twice counts twice; a class
    # named at all is not a non-target class).
    first = Tensor.empty(ctx, (n, 1))
    _memo("multilabel_first", lambda: ReduceKernel(
        "multilabel_first_stop", [("t", np.int64), ("k", _f32)], [("f", _f32)],
        "f = t < 0 ? k : classes;", "min", scalars=[("classes", _f32)]))(
        [t, _view(classes, (1, c))], [first], [float(c)])
    is_target = Tensor.empty(ctx, (n, c, 1))
    _memo("multilabel_count", lambda: ReduceKernel(
        "multilabel_target_count", [("t", np.int64), ("f", _f32), ("kj", _f32), ("ki", _f32)],
        [("m", _f32)], "m = (kj < f && (float)t == ki) ? 1.0f : 0.0f;", "sum"))(
        [_view(t, (n, 1, c)), _view(first, (n, 1, 1)), _view(classes, (1, 1, c)),
         _view(classes, (1, c, 1))], [is_target])
    operands = [_view(x, (n, c, 1)), _view(x, (n, 1, c)), is_target, _view(is_target, (n, 1, c))]
    if reduction == "none":
        out = Tensor.empty(ctx, (n,))
        target_view, axes, scale = _view(out, (n, 1, 1)), (1, 2), 1.0 / c
    else:
        out = Tensor.empty(ctx, ())
        target_view, axes = out, None
        scale = 1.0 / (c * n) if reduction == "mean" else 1.0 / c
    if n:
        _memo("multilabel_margin", lambda: ReduceKernel(
            "multilabel_margin_loss", [("xj", _f32), ("xi", _f32), ("mj", _f32), ("mi", _f32)],
            [("y", _f32)], "y = (mj > 0.0f && mi == 0.0f) ? mj * fmax(1.0f - xj + xi, 0.0f) : 0.0f;",
            "sum", finalize="acc_y = acc_y * scale;", scalars=[("scale", _f32)]))(
            operands, [target_view], [scale], axes=axes)
    else:
        out.fill_(math.nan if reduction == "mean" else 0.0)
    sources = [o.detach() for o in operands]

    def backward(g):
        dx = Tensor.empty(ctx, input.shape)
        if n:
            _memo("multilabel_margin_backward", lambda: ReduceKernel(
                "multilabel_margin_backward",
                [("xk", _f32), ("xm", _f32), ("mk", _f32), ("mm", _f32), ("g", _f32)],
                [("d", _f32)],
                "d = ((mk > 0.0f && mm == 0.0f && 1.0f - xk + xm > 0.0f) ? -mk : 0.0f)"
                " + ((mk == 0.0f && mm > 0.0f && 1.0f - xm + xk > 0.0f) ? mm : 0.0f);"
                "d *= g * scale;", "sum", scalars=[("scale", _f32)]))(
                [*sources, g if g.ndim == 0 else _view(g, (n, 1, 1))], [_view(dx, (n, c, 1))],
                [scale], axes=(2,))
        return (dx,)

    if input.ndim == 1 and reduction == "none":
        out = _view(out, ())
    return autograd.record(out, (input,), backward, "multilabel_margin_loss")


def _smoothed_cross_entropy(input, target, weight, ignore_index, reduction, smoothing, class_dim):
    """cross_entropy with label smoothing, as torch composes it."""
    from .arithmetic import add, div
    classes = input.shape[class_dim]
    if isinstance(target, Tensor) and target.dtype == np.float32:
        if target.shape != input.shape:
            raise ShapeError(f"cross_entropy: a probability target must have the input's shape "
                             f"{input.shape}, got {target.shape}")
        smoothed = add(mul(target, 1.0 - smoothing), smoothing / classes)
        return cross_entropy(input, smoothed, weight, ignore_index, reduction, 0.0)
    nll = cross_entropy(input, target, weight, ignore_index, reduction, 0.0)
    ctx = input.ctx
    n = 1 if input.ndim == 1 else input.shape[0]
    s = math.prod(input.shape[2:])
    logp = log_softmax(input, class_dim).reshape(n, classes, s)
    t = _view(target, (n, 1, s))
    w = _view(weight, (1, classes, 1)) if weight is not None else unit_weight(ctx)
    # -sum_c w_c log p_c at each non-ignored position.
    smooth = Tensor.empty(ctx, (n, 1, s))
    _memo("smooth_sum", lambda: ReduceKernel(
        "label_smoothing_sum", [("lp", _f32), ("w", _f32), ("t", np.int64)], [("y", _f32)],
        "y = t != ignore ? -w * lp : 0.0f;", "sum", scalars=[("ignore", np.int64)]))(
        [logp, w, t], [smooth], [ignore_index], axes=(1,))
    w_source, t_source = w.detach(), t

    def smooth_backward(g):
        dlogp = Tensor.empty(ctx, (n, classes, s))
        _memo("smooth_backward", lambda: PointwiseKernel(
            "label_smoothing_backward", [("w", _f32), ("t", np.int64), ("g", _f32)],
            [("d", _f32)], "d = t != ignore ? -w * g : 0.0f;",
            scalars=[("ignore", np.int64)]))([w_source, t_source, g], [dlogp], [ignore_index])
        return (dlogp,)

    smooth = autograd.record(smooth, (logp,), smooth_backward, "label_smoothing")
    smooth = smooth.reshape(target.shape)
    if reduction == "none":
        term = smooth
    elif reduction == "sum":
        term = R.sum(smooth)
    else:
        # torch's divisor: the weights of the non-ignored targets (their count without weights).
        divisor = Tensor.empty(ctx, ())
        _memo("smooth_divisor", lambda: ReduceKernel(
            "label_smoothing_divisor", [("t", np.int64), ("w", _f32), ("k", _f32)],
            [("y", _f32)], "y = (float)t == k ? w : 0.0f;", "sum"))(
            [t, w, _view(_class_indices(ctx, classes), (1, classes, 1))], [divisor])
        term = div(R.sum(smooth), divisor)
    return add(mul(nll, 1.0 - smoothing), mul(term, smoothing / classes))


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None,
                         reduction="mean", ignore_index=None, label_smoothing=0.0,
                         options=None):
    """torch.nn.functional.linear_cross_entropy: :func:`cross_entropy` of
    ``linear(input, linear_weight, linear_bias)``.

    ``input`` is (N, in_features) or (in_features); ``linear_weight`` is (C, in_features), or
    (C, d_1, ..., d_K, in_features) for a K-dimensional loss over logits (N, C, d_1, ..., d_K)
    (batched input only); ``linear_bias`` has shape (C, d_1, ..., d_K). ``ignore_index`` None
    means -100 for class targets and none for probability targets. ``options`` (torch's
    chunking strategy, a memory saving that leaves the result unchanged) is accepted and
    ignored: the logits are always formed in full."""
    from .linear import linear
    for name, value in (("input", input), ("linear_weight", linear_weight),
                        ("target", target)):
        if not isinstance(value, Tensor):
            raise not_a_tensor(f"linear_cross_entropy: {name}", value)
    if input.ndim not in (1, 2):
        raise ShapeError(f"linear_cross_entropy: input must be (N, in_features) or "
                         f"(in_features), got shape {input.shape}")
    if linear_weight.ndim < 2:
        raise ShapeError(f"linear_cross_entropy: linear_weight must have at least 2 dimensions "
                         f"(C, ..., in_features), got shape {linear_weight.shape}")
    if input.shape[-1] != linear_weight.shape[-1]:
        raise ShapeError(f"linear_cross_entropy: input's last dimension {input.shape[-1]} must "
                         f"equal linear_weight's (in_features) {linear_weight.shape[-1]}")
    classes, out_features = linear_weight.shape[0], linear_weight.shape[1:-1]
    if linear_bias is not None and linear_bias.shape != (classes,) + out_features:
        raise ShapeError(f"linear_cross_entropy: linear_bias must have shape "
                         f"{(classes,) + out_features}, got {linear_bias.shape}")
    if out_features and input.ndim == 1:
        raise ShapeError(f"linear_cross_entropy: a K-dimensional loss (linear_weight "
                         f"{linear_weight.shape}) needs a batched input (N, in_features), got "
                         f"{input.shape}")
    logits_shape = input.shape[:-1] + (classes,) + out_features
    if ignore_index is None:
        ignore_index = -100
    elif target.shape == logits_shape:
        raise ShapeError("linear_cross_entropy: ignore_index cannot be given with probability "
                         "targets")
    rows = math.prod((classes,) + out_features)
    w = linear_weight if not out_features else linear_weight.reshape((rows, input.shape[-1]))
    b = linear_bias if linear_bias is None or not out_features else linear_bias.reshape((rows,))
    logits = linear(input, w, b)
    if out_features:
        logits = logits.reshape(logits_shape)
    return cross_entropy(logits, target, weight, ignore_index, reduction, label_smoothing)
