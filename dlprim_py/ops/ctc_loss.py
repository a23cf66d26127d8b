"""torch.nn.functional.ctc_loss: connectionist temporal classification (speech and handwriting
recognition), forward and backward, by the alpha and beta recursions in log space
(``kernels/ctc_loss.cl.mako``): one work-group per batch entry, the extended target's states of
a time step in parallel, the steps in order.

The lengths and the targets are read to the host (they size the workspaces and are checked:
lengths within the input and the target, labels in [0, C) and not the blank), as torch's CPU
implementation reads them. The gradient is torch's: ``exp(log_probs) - occupancy`` per time
step, which is the derivative through the log_softmax that made the log-probabilities.
"""
import numpy as np

from .. import autograd, program
from ..context import check_same_context
from ..dtypes import float32, int32, int64
from ..errors import DTypeError, ShapeError, not_a_tensor
from ..launch import bind
from ..tensor import Tensor
from .pointwise import group_size

_REDUCTIONS = ("none", "mean", "sum")


def _host_lengths(value, what, count):
    """The ``count`` lengths of ``value`` (ints, a sequence or an integer tensor) as int64."""
    if isinstance(value, Tensor):
        if value.dtype not in (int32, int64):
            raise DTypeError(f"ctc_loss: {what} must be integers, got {value.dtype}")
        lengths = value.numpy().astype(np.int64).reshape(-1)
    else:
        try:
            lengths = np.asarray(value, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise DTypeError(f"ctc_loss: {what} must be integers, got {value!r}") from None
    if lengths.size != count:
        raise ShapeError(f"ctc_loss: {what} must hold {count} lengths, got {lengths.size}")
    if (lengths < 0).any():
        raise ShapeError(f"ctc_loss: {what} must not be negative, got {lengths.tolist()}")
    return lengths


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False):
    """torch.nn.functional.ctc_loss.

    ``log_probs`` (T, N, C) float32 (log_softmax outputs; (T, C) unbatched); ``targets``
    int64 or int32, (N, S) padded or 1-d, the targets one after another ((S,) unbatched);
    ``input_lengths`` and ``target_lengths``: N lengths each (ints or integer tensors).
    ``reduction``: "none" (a loss per batch entry), "sum", or "mean" (each loss divided by its
    target's length, at least 1, then averaged). ``zero_infinity``: an impossible alignment's
    loss (inf) and its gradient become 0. Gradient to ``log_probs``.
    """
    if not isinstance(log_probs, Tensor):
        raise not_a_tensor("ctc_loss: log_probs", log_probs)
    if not isinstance(targets, Tensor):
        raise not_a_tensor("ctc_loss: targets", targets)
    check_same_context(log_probs, targets)
    if log_probs.dtype != float32:
        raise DTypeError(f"ctc_loss: log_probs must be float32, got {log_probs.dtype}")
    if targets.dtype not in (int32, int64):
        raise DTypeError(f"ctc_loss: targets must be int64 or int32, got {targets.dtype}")
    if reduction not in _REDUCTIONS:
        raise ShapeError(f"ctc_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    ctx = log_probs.ctx
    batched = log_probs.ndim == 3
    if log_probs.ndim not in (2, 3):
        raise ShapeError(f"ctc_loss: log_probs must be (T, N, C) or (T, C), got "
                         f"{log_probs.shape}")
    T, C = log_probs.shape[0], log_probs.shape[-1]
    N = log_probs.shape[1] if batched else 1
    if not isinstance(blank, (int, np.integer)) or isinstance(blank, bool) or not 0 <= blank < C:
        raise ShapeError(f"ctc_loss: blank must be a class in [0, {C}), got {blank!r}")
    inputs = _host_lengths(input_lengths, "input_lengths", N)
    lengths = _host_lengths(target_lengths, "target_lengths", N)
    if (inputs > T).any():
        raise ShapeError(f"ctc_loss: input_lengths must be at most T = {T}, got "
                         f"{inputs.tolist()}")
    labels = targets.numpy().astype(np.int64)
    if batched and labels.ndim == 2:
        if labels.shape[0] != N:
            raise ShapeError(f"ctc_loss: targets must be (N = {N}, S) or 1-d, got "
                             f"{targets.shape}")
        if (lengths > labels.shape[1]).any():
            raise ShapeError(f"ctc_loss: target_lengths must be at most S = {labels.shape[1]}, "
                             f"got {lengths.tolist()}")
        offsets = np.arange(N, dtype=np.int64) * labels.shape[1]
    elif labels.ndim == 1:
        if lengths.sum() > labels.size:
            raise ShapeError(f"ctc_loss: target_lengths add up to {int(lengths.sum())}, more "
                             f"than the {labels.size} targets")
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    else:
        raise ShapeError(f"ctc_loss: targets must be (N, S) or 1-d"
                         f"{'' if batched else ' for an unbatched input'}, got {targets.shape}")
    used = np.concatenate([labels.reshape(-1)[o:o + n] for o, n in zip(offsets, lengths)]) \
        if N else np.zeros(0, np.int64)
    if used.size and ((used < 0).any() or (used >= C).any() or (used == blank).any()):
        raise ShapeError(f"ctc_loss: target labels must be classes in [0, {C}) other than the "
                         f"blank {blank}")
    flat = Tensor.from_numpy(ctx, np.ascontiguousarray(labels.reshape(-1)) if labels.size
                             else np.zeros(1, np.int64))
    meta = [Tensor.from_numpy(ctx, a) for a in (offsets, lengths, inputs)]
    states = int(2 * lengths.max() + 1) if N else 1
    group = group_size(ctx)
    built = program.build(ctx, "ctc_loss", {"GROUP": group})
    alpha = Tensor.empty(ctx, (max(N * T * states, 1),))
    nll = Tensor.empty(ctx, (max(N, 1),))
    sizes = (np.int32(T), np.int32(N), np.int32(C), np.int32(states), np.int32(blank))
    source = log_probs.detach()
    if N:
        bind(built.kernel("ctc_alpha"))(
            ctx.queue, (N * group,), (group,), *sizes, source.buffer,
            np.int64(source.offset_elements), flat.buffer, *(m.buffer for m in meta),
            alpha.buffer, nll.buffer)
    losses = Tensor(ctx, nll.buffer, (N,), float32, offset=nll.offset)
    if zero_infinity and N:
        from .indexing import isinf, where
        with autograd.no_grad():
            losses = where(isinf(losses), 0.0, losses)
    elif N:
        losses = losses.clone()
    else:
        losses = Tensor.empty(ctx, (0,))
    if autograd.needs_grad(log_probs):
        def backward(g):
            grad = Tensor.empty(ctx, log_probs.shape)
            if N:
                beta = Tensor.empty(ctx, (max(N * T * states, 1),))
                z = Tensor.empty(ctx, (max(N * T, 1),))
                scale = g if g.offset_elements == 0 else g.clone()
                bind(built.kernel("ctc_gradient"))(
                    ctx.queue, (N * group,), (group,), *sizes, source.buffer,
                    np.int64(source.offset_elements), flat.buffer, *(m.buffer for m in meta),
                    alpha.buffer, beta.buffer, z.buffer, nll.buffer, scale.buffer,
                    np.int32(bool(zero_infinity)), grad.buffer, np.int64(grad.offset_elements))
            elif grad.size:
                grad.fill_(0.0)
            return (grad,)

        losses = autograd.record(losses, (log_probs,), backward, "ctc_loss")
    from .arithmetic import div
    from .reduce import mean, sum as reduce_sum
    if not batched:
        losses = losses.reshape(())
    if reduction == "none":
        return losses
    if reduction == "sum":
        return reduce_sum(losses)
    per = Tensor.from_numpy(ctx, np.maximum(lengths, 1).astype(np.float32).reshape(losses.shape))
    return mean(div(losses, per))
