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
    flag = ctx.memo.get("nll_range_flag")
    if flag is None:
        flag = ctx.memo["nll_range_flag"] = Tensor.zeros(ctx, (4,), np.int64)
    return flag


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
    float32 probability target shaped like the input (mean averages over all positions)."""
    _check_reduction(reduction, "cross_entropy")
    _check_float(input, "cross_entropy: input")
    if label_smoothing != 0.0:
        raise UnsupportedError(f"cross_entropy: label_smoothing is not supported, got {label_smoothing}")
    if input.ndim == 0:
        raise ShapeError(f"cross_entropy: input must be (C), (N, C) or (N, C, d1, ...), got {input.shape}")
    class_dim = 0 if input.ndim == 1 else 1
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
