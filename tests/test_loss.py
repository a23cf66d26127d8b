"""Losses against torch CPU float64: forward, gradients, every reduction, bad targets."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp

from conftest import assert_close, random

F = dp.functional
REDUCTIONS = ["none", "mean", "sum"]


def _check(ctx, rng, ours, theirs, float_inputs, other_inputs=(), grads=None):
    """Run both, compare outputs and the gradients of the float inputs listed in ``grads``."""
    grads = range(len(float_inputs)) if grads is None else grads
    xs = [dp.Tensor.from_numpy(ctx, a, requires_grad=k in grads) for k, a in enumerate(float_inputs)]
    ts = [torch.tensor(a.astype(np.float64), requires_grad=k in grads) for k, a in enumerate(float_inputs)]
    out = ours(*xs, *[dp.Tensor.from_numpy(ctx, o) if isinstance(o, np.ndarray) else o for o in other_inputs])
    ref = theirs(*ts, *[torch.tensor(o) if isinstance(o, np.ndarray) else o for o in other_inputs])
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    g = random(rng, out.shape)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    for k in grads:
        assert_close(xs[k].grad.numpy(), ts[k].grad.numpy())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 2, 3), (6,)])
def test_nll_loss_and_cross_entropy(ctx, rng, reduction, shape):
    classes = shape[0] if len(shape) == 1 else shape[1]
    target_shape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    target = rng.integers(0, classes, size=target_shape).astype(np.int64)
    if target.size > 1:
        target.flat[1] = -100                       # ignored
    weight = rng.uniform(0.5, 2.0, classes).astype(np.float32)
    logits = random(rng, shape, -3, 3)
    for with_weight in (False, True):
        wx = dp.Tensor.from_numpy(ctx, weight) if with_weight else None
        wt = torch.tensor(weight.astype(np.float64)) if with_weight else None
        _check(ctx, rng, lambda x, t: F.cross_entropy(x, t, weight=wx, reduction=reduction),
               lambda x, t: TF.cross_entropy(x, t, weight=wt, reduction=reduction),
               [logits], [target])
        _check(ctx, rng, lambda x, t: F.nll_loss(x, t, weight=wx, ignore_index=-100, reduction=reduction),
               lambda x, t: TF.nll_loss(x, t, weight=wt, reduction=reduction),
               [logits], [target])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_with_probabilities(ctx, rng, reduction):
    logits = random(rng, (5, 4, 3), -3, 3)
    probs = rng.dirichlet(np.ones(4), size=(5, 3)).transpose(0, 2, 1).astype(np.float32).copy()
    weight = rng.uniform(0.5, 2.0, 4).astype(np.float32)
    wx, wt = dp.Tensor.from_numpy(ctx, weight), torch.tensor(weight.astype(np.float64))
    _check(ctx, rng, lambda x, t: F.cross_entropy(x, t, weight=wx, reduction=reduction),
           lambda x, t: TF.cross_entropy(x, t, weight=wt, reduction=reduction), [logits, probs], grads=[0])


def test_nll_ignore_index_and_all_ignored(ctx):
    logp = dp.Tensor.from_numpy(ctx, np.log(np.full((3, 4), 0.25, np.float32)))
    target = dp.Tensor.from_numpy(ctx, np.array([1, 3, 1], np.int64))
    assert_close(F.nll_loss(logp, target, ignore_index=3, reduction="sum").numpy(), 2 * np.log(4.0))
    all_ignored = dp.Tensor.from_numpy(ctx, np.array([3, 3, 3], np.int64))
    assert np.isnan(F.nll_loss(logp, all_ignored, ignore_index=3).numpy())


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("a_shape, b_shape", [((3, 1, 5), (4, 1)), ((1,), (1,))])
def test_mse_loss(ctx, rng, reduction, a_shape, b_shape):
    _check(ctx, rng, lambda a, b: F.mse_loss(a, b, reduction=reduction),
           lambda a, b: TF.mse_loss(a, b, reduction=reduction) if a.shape == b.shape else
           TF.mse_loss(*torch.broadcast_tensors(a, b), reduction=reduction),
           [random(rng, a_shape), random(rng, b_shape)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_bce_with_logits(ctx, rng, reduction, weighted):
    x = random(rng, (6, 5), -30, 30)                # large logits: the stable form matters
    t = rng.uniform(0, 1, (6, 5)).astype(np.float32)
    if weighted:
        w, pw = random(rng, (6, 1), 0.5, 2), random(rng, (5,), 0.5, 3)
        wx, pwx = dp.Tensor.from_numpy(ctx, w), dp.Tensor.from_numpy(ctx, pw)
        wt, pwt = torch.tensor(w.astype(np.float64)), torch.tensor(pw.astype(np.float64))
    else:
        wx = pwx = wt = pwt = None
    _check(ctx, rng,
           lambda a, b: F.binary_cross_entropy_with_logits(a, b, weight=wx, reduction=reduction, pos_weight=pwx),
           lambda a, b: TF.binary_cross_entropy_with_logits(a, b, weight=wt, reduction=reduction, pos_weight=pwt),
           [x, t])


def test_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (3, 4))
    for bad in (4, -1, -101):
        target = dp.Tensor.from_numpy(ctx, np.array([0, bad, 2], np.int64))
        # Raised at the first synchronizing call (the default, deferred check).
        with pytest.raises(dp.ShapeError, match=f"target {bad} is out of range for 4 classes"):
            F.nll_loss(x, target).numpy()
        with pytest.raises(dp.ShapeError, match="out of range"):
            F.cross_entropy(x, target)
            ctx.synchronize()
    with pytest.raises(dp.DTypeError, match="int64"):
        F.nll_loss(x, dp.Tensor.zeros(ctx, (3,), np.int32))
    with pytest.raises(dp.ShapeError, match="target of shape"):
        F.nll_loss(x, dp.Tensor.zeros(ctx, (4,), np.int64))
    with pytest.raises(dp.ShapeError, match="weight"):
        F.nll_loss(x, dp.Tensor.zeros(ctx, (3,), np.int64), weight=dp.Tensor.zeros(ctx, (3,)))
    with pytest.raises(dp.UnsupportedError, match="reduction"):
        F.mse_loss(x, x, reduction="avg")
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.mse_loss(x, dp.Tensor.zeros(ctx, (5,)))
    with pytest.raises(dp.ShapeError, match="target shape"):
        F.binary_cross_entropy_with_logits(x, dp.Tensor.zeros(ctx, (4,)))
    with pytest.raises(dp.ShapeError, match="label_smoothing"):
        F.cross_entropy(x, dp.Tensor.zeros(ctx, (3,), np.int64), label_smoothing=1.5)
    with pytest.raises(dp.ShapeError, match="probability target"):
        F.cross_entropy(x, dp.Tensor.zeros(ctx, (3, 5)))


@pytest.mark.parametrize("variant", ["group", "item"])
def test_cross_entropy_long_masked_rows_with_partials(ctx, rng, variant, monkeypatch, tuning_rules):
    """The log-sum-exp over the classes merges (max, sum) pairs across partial results; masked
    (-inf) logits add nothing. Each reduce variant forced, chunks cut short."""
    monkeypatch.setenv("DLPRIM_REDUCE_ALGO", variant)
    dp.config.reload()
    tuning_rules("reduce", [{"when": {}, "params": {"solver": name, "unroll": 2, "set_chunk": 4}}
                            for name in ("group", "item")])
    logits = random(rng, (3, 3000), -20, 20)
    logits[0, 1000:] = -np.inf
    logits[2, ::2] = -np.inf
    target = np.array([5, 17, 1], np.int64)
    _check(ctx, rng, lambda x, t: F.cross_entropy(x, t), lambda x, t: TF.cross_entropy(x, t),
           [logits], [target])


@pytest.mark.parametrize("mode", ["deferred", "immediate"])
def test_range_flag_is_cleared_after_an_error(ctx, rng, mode, monkeypatch):
    """Each range-check mode forced: a bad target raises (nll_loss and cross_entropy; deferred
    at the next synchronizing call, immediate in the call), and the flag lives across calls, so
    a good call after one that raised passes, also when the target was written by the queue's
    last command."""
    monkeypatch.setenv("DLPRIM_RANGE_CHECK_ALGO", mode)
    dp.config.reload()

    def call(op, *args):
        out = op(*args)
        if mode == "deferred":
            return out.numpy()
        # Raised in the call: nothing is left for the next synchronizing call.
        assert not ctx.deferred_checks
        return out.numpy()

    a = random(rng, (3, 4))
    x = dp.Tensor.from_numpy(ctx, a)
    for op in (F.nll_loss, F.cross_entropy):
        with pytest.raises(dp.ShapeError, match="target 9 is out of range for 4 classes"):
            out = op(x, dp.Tensor.from_numpy(ctx, np.array([0, 9, 2], np.int64)))
            if mode == "deferred":
                out.numpy()
    good = np.array([3, 1, 2], np.int64)
    t = dp.Tensor.from_numpy(ctx, good)
    out = call(F.nll_loss, x, t)
    assert_close(out, TF.nll_loss(torch.tensor(a.astype(np.float64)), torch.tensor(good)).numpy())
    # A bad value written into the target just before the call, on the queue.
    t.copy_(dp.Tensor.from_numpy(ctx, np.array([3, -7, 2], np.int64)))
    with pytest.raises(dp.ShapeError, match="target -7 is out of range"):
        out = F.cross_entropy(x, t)
        ctx.synchronize()
    t.copy_(dp.Tensor.from_numpy(ctx, good))
    out = call(F.cross_entropy, x, t)
    assert_close(out, TF.cross_entropy(torch.tensor(a.astype(np.float64)), torch.tensor(good)).numpy())


def test_deferred_range_check_raises_once_at_the_next_sync(ctx, rng):
    """A bad target in a training step: the call and its backward only enqueue (they replay
    their plans; the bad target is never used as an index), the next synchronizing call
    raises, naming the value, the classes and the ignore_index, and later calls run clean."""
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 6)), requires_grad=True)
    good = dp.Tensor.from_numpy(ctx, np.array([0, 5, 2, 1], np.int64))
    bad = dp.Tensor.from_numpy(ctx, np.array([0, 6, 2, 1], np.int64))
    for _ in range(2):   # the second call replays the first one's plan
        F.cross_entropy(x, good, ignore_index=3).backward()
        ctx.synchronize()
    loss = F.cross_entropy(x, bad, ignore_index=3)
    loss.backward()
    assert "nll_range" in ctx.deferred_checks
    with pytest.raises(dp.ShapeError, match=r"target 6 is out of range for 6 classes "
                                            r"\(expected 0..5 or ignore_index=3\)"):
        ctx.synchronize()
    ctx.synchronize()   # raised once
    assert np.isfinite(F.cross_entropy(x, good).numpy())


def test_first_loss_plan_does_not_reset_the_range_flag(rng):
    """The target-range flag is made outside the plan of the call that first needs it: with a
    fresh context, a bad target in one nll_loss shape, then a replay of the first call's plan
    (another shape) before the synchronization, still raises."""
    ctx = dp.Context()
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 6)))
    y = dp.Tensor.from_numpy(ctx, random(rng, (3, 6)))
    good = dp.Tensor.from_numpy(ctx, np.array([0, 5, 2, 1], np.int64))
    F.nll_loss(x, good)                    # records its plan, makes the flag
    ctx.synchronize()
    F.nll_loss(y, dp.Tensor.from_numpy(ctx, np.array([0, 9, 2], np.int64)))   # sets the flag
    F.nll_loss(x, good)                    # a replay: must leave it set
    with pytest.raises(dp.ShapeError, match="target 9 is out of range"):
        ctx.synchronize()


def test_bad_range_check_mode(ctx, monkeypatch):
    monkeypatch.setenv("DLPRIM_RANGE_CHECK_ALGO", "pinned")
    dp.config.reload()
    x = dp.Tensor.zeros(ctx, (3, 4))
    with pytest.raises(dp.UnsupportedError, match="range check must be one of"):
        F.nll_loss(x, dp.Tensor.zeros(ctx, (3,), np.int64))


def test_ignore_index_must_be_an_int(ctx):
    """1.5 was truncated to 1, and 1.0 after a call with 1 reused that call's setup."""
    x = dp.Tensor.from_numpy(ctx, np.zeros((3, 4), np.float32))
    t = dp.Tensor.from_numpy(ctx, np.array([0, 1, 2], np.int64))
    F.nll_loss(x, t, ignore_index=1)
    for bad in (1.0, 1.5, "1", None):
        for loss in (F.nll_loss, F.cross_entropy):
            with pytest.raises(dp.DTypeError, match="ignore_index must be an int"):
                loss(x, t, ignore_index=bad)
