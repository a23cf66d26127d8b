"""ctc_loss against torch CPU float64: padded and concatenated targets, int32 and int64, lengths
as lists and tensors, repeated labels, empty targets, steps past an input's length, a blank
other than 0, impossible alignments with and without zero_infinity, every reduction, the
unbatched form; the gradient (torch's form) with outputs from a poisoned pool; bad arguments;
repeated calls."""
import numpy as np
import pytest
import torch

import dlprim_py as dp

from conftest import assert_close, assert_repeats_build_nothing
from test_indexing import poison_pool

F = dp.functional
TF = torch.nn.functional


def _log_probs(rng, shape):
    return torch.tensor(rng.standard_normal(shape)).log_softmax(-1).numpy()


def _compare(ctx, rng, lp, targets, input_lengths, target_lengths, tensors=False, **kw):
    ours_lp = dp.Tensor.from_numpy(ctx, lp.astype(np.float32), requires_grad=True)
    ref_lp = torch.tensor(lp, requires_grad=True)
    as_ours = (lambda a: dp.Tensor.from_numpy(ctx, np.asarray(a, np.int64))) if tensors else list
    poison_pool(ctx)
    out = F.ctc_loss(ours_lp, dp.Tensor.from_numpy(ctx, targets), as_ours(input_lengths),
                     as_ours(target_lengths), **kw)
    ref = TF.ctc_loss(ref_lp, torch.tensor(targets.astype(np.int64)), list(input_lengths),
                      list(target_lengths), **kw)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    if not np.isfinite(ref.detach().numpy()).all():
        return out, ours_lp, None
    g = rng.standard_normal(tuple(ref.shape))
    poison_pool(ctx)
    out.backward(dp.Tensor.from_numpy(ctx, g.astype(np.float32)))
    ref.backward(torch.tensor(g))
    assert_close(ours_lp.grad.numpy(), ref_lp.grad.numpy(), tol=1e-5)
    return out, ours_lp, ref_lp


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("form", ["padded", "concatenated", "int32", "tensors"])
def test_matches_torch(ctx, rng, reduction, form):
    """Eight entries: shorter inputs, a label repeated back to back (a blank must separate
    them), an empty target."""
    T, N, C, S = 30, 8, 12, 9
    lp = _log_probs(rng, (T, N, C))
    targets = rng.integers(1, C, (N, S))
    targets[2, 3] = targets[2, 2]
    target_lengths = rng.integers(1, S + 1, N)
    target_lengths[5] = 0
    input_lengths = np.full(N, T)
    input_lengths[1], input_lengths[6] = 20, 25
    if form == "concatenated":
        targets = np.concatenate([targets[n, :target_lengths[n]] for n in range(N)])
    if form == "int32":
        targets = targets.astype(np.int32)
    _compare(ctx, rng, lp, targets, input_lengths, target_lengths, tensors=form == "tensors",
             reduction=reduction)


def test_gradient_is_zero_past_each_input_and_blank_elsewhere(ctx, rng):
    """A blank other than 0; the gradient past an entry's input length is zero."""
    T, N, C = 12, 3, 6
    lp = _log_probs(rng, (T, N, C))
    targets = np.array([[0, 1, 2], [4, 4, 0], [2, 3, 1]])
    _, ours, _ = _compare(ctx, rng, lp, targets, [12, 7, 9], [3, 2, 3], blank=5,
                          reduction="sum")
    assert not ours.grad.numpy()[7:, 1].any() and not ours.grad.numpy()[9:, 2].any()


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_impossible_alignments(ctx, rng, zero_infinity):
    """Targets longer than their inputs allow: inf, or 0 with a zero gradient."""
    T, N, C = 6, 3, 5
    lp = _log_probs(rng, (T, N, C))
    targets = np.array([[1, 1, 1, 1], [1, 2, 3, 4], [2, 3, 0, 0]])
    out, ours, ref = _compare(ctx, rng, lp, targets, [6, 3, 6], [4, 4, 2],
                              zero_infinity=zero_infinity, reduction="none")
    losses = out.numpy()
    assert np.isinf(losses[:2]).all() != zero_infinity
    if zero_infinity:
        assert not ours.grad.numpy()[:, :2].any()


def test_unbatched(ctx, rng):
    lp = _log_probs(rng, (15, 7))
    _compare(ctx, rng, lp, np.array([3, 1, 3, 6]), [15], [4], reduction="mean")


def test_repeated_call_builds_nothing(ctx, rng):
    lp = dp.Tensor.from_numpy(ctx, _log_probs(rng, (10, 2, 5)).astype(np.float32),
                              requires_grad=True)
    targets = dp.Tensor.from_numpy(ctx, np.array([[1, 2], [3, 4]]))

    def step():
        lp.grad = None
        F.ctc_loss(lp, targets, [10, 9], [2, 1]).backward()
    assert_repeats_build_nothing(ctx, step)


def test_bad_arguments(ctx, rng):
    lp = dp.Tensor.from_numpy(ctx, _log_probs(rng, (10, 2, 5)).astype(np.float32))
    targets = dp.Tensor.from_numpy(ctx, np.array([[1, 2], [3, 4]]))
    with pytest.raises(dp.ShapeError, match="other than the blank"):
        F.ctc_loss(lp, dp.Tensor.from_numpy(ctx, np.array([[1, 0], [3, 4]])), [10, 10], [2, 2])
    with pytest.raises(dp.ShapeError, match="other than the blank"):
        F.ctc_loss(lp, dp.Tensor.from_numpy(ctx, np.array([[1, 5], [3, 4]])), [10, 10], [2, 2])
    with pytest.raises(dp.ShapeError, match="at most T"):
        F.ctc_loss(lp, targets, [11, 10], [2, 2])
    with pytest.raises(dp.ShapeError, match="at most S"):
        F.ctc_loss(lp, targets, [10, 10], [3, 2])
    with pytest.raises(dp.ShapeError, match="2 lengths"):
        F.ctc_loss(lp, targets, [10], [2, 2])
    with pytest.raises(dp.ShapeError, match="negative"):
        F.ctc_loss(lp, targets, [10, -1], [2, 2])
    with pytest.raises(dp.ShapeError, match="add up"):
        F.ctc_loss(lp, dp.Tensor.from_numpy(ctx, np.array([1, 2, 3])), [10, 10], [2, 2])
    with pytest.raises(dp.ShapeError, match="blank must be"):
        F.ctc_loss(lp, targets, [10, 10], [2, 2], blank=5)
    with pytest.raises(dp.ShapeError, match="reduction"):
        F.ctc_loss(lp, targets, [10, 10], [2, 2], reduction="avg")
    with pytest.raises(dp.DTypeError, match="targets must be"):
        F.ctc_loss(lp, dp.Tensor.from_numpy(ctx, np.array([[1.0, 2.0], [3.0, 4.0]],
                                                          np.float32)), [10, 10], [2, 2])
    with pytest.raises(dp.DTypeError, match="log_probs must be float32"):
        F.ctc_loss(targets, targets, [10, 10], [2, 2])
