"""The elementwise and margin losses against torch CPU float64: values and gradients on seeded
data, every reduction, broadcasting, outputs from a NaN-poisoned pool, bad arguments, and
repeated calls that build nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import program

from conftest import random
from test_activation_extra import check

F = dp.functional
REDUCTIONS = ["none", "mean", "sum"]


def _sign(rng, shape):
    return np.where(rng.uniform(size=shape) < 0.5, -1.0, 1.0).astype(np.float32)


def _probability(rng, shape):
    return random(rng, shape, 0.05, 0.95)


# name -> (our call, torch's call, inputs (rng -> arrays), indices of inputs with gradients)
CASES = {
    "l1": (lambda r, **k: lambda a, b: F.l1_loss(a, b, reduction=r),
           lambda r, **k: lambda a, b: TF.l1_loss(a, b, reduction=r),
           lambda rng: [random(rng, (4, 5)), random(rng, (4, 5))], (0, 1)),
    "l1_broadcast": (lambda r, **k: lambda a, b: F.l1_loss(a, b, reduction=r),
                     lambda r, **k: lambda a, b: TF.l1_loss(a, b, reduction=r),
                     lambda rng: [random(rng, (3, 4, 5)), random(rng, (4, 1))], (0, 1)),
    "smooth_l1": (lambda r: lambda a, b: F.smooth_l1_loss(a, b, reduction=r, beta=0.5),
                  lambda r: lambda a, b: TF.smooth_l1_loss(a, b, reduction=r, beta=0.5),
                  lambda rng: [random(rng, (4, 5), -2, 2), random(rng, (4, 5))], (0, 1)),
    "smooth_l1_beta0": (lambda r: lambda a, b: F.smooth_l1_loss(a, b, reduction=r, beta=0.0),
                        lambda r: lambda a, b: TF.smooth_l1_loss(a, b, reduction=r, beta=0.0),
                        lambda rng: [random(rng, (6,)), random(rng, (6,))], (0, 1)),
    "huber": (lambda r: lambda a, b: F.huber_loss(a, b, reduction=r, delta=0.75),
              lambda r: lambda a, b: TF.huber_loss(a, b, reduction=r, delta=0.75),
              lambda rng: [random(rng, (2, 3, 4), -2, 2), random(rng, (3, 4))], (0, 1)),
    "kl_div": (lambda r: lambda a, b: F.kl_div(a, b, reduction=r),
               lambda r: lambda a, b: TF.kl_div(a, b, reduction=r),
               lambda rng: [random(rng, (4, 5), -3, 0), _probability(rng, (4, 5))], (0, 1)),
    "kl_div_log_target": (lambda r: lambda a, b: F.kl_div(a, b, reduction=r, log_target=True),
                          lambda r: lambda a, b: TF.kl_div(a, b, reduction=r, log_target=True),
                          lambda rng: [random(rng, (4, 5), -3, 0), random(rng, (4, 5), -3, 0)],
                          (0, 1)),
    "bce": (lambda r: lambda a, b: F.binary_cross_entropy(a, b, reduction=r),
            lambda r: lambda a, b: TF.binary_cross_entropy(a, b, reduction=r),
            lambda rng: [_probability(rng, (4, 5)), _probability(rng, (4, 5))], (0, 1)),
    "bce_weight": (lambda r: lambda a, b, w: F.binary_cross_entropy(a, b, w, reduction=r),
                   lambda r: lambda a, b, w: TF.binary_cross_entropy(a, b, w, reduction=r),
                   lambda rng: [_probability(rng, (4, 5)), _probability(rng, (4, 5)),
                                random(rng, (5,), 0.5, 2)], (0, 1)),
    "poisson": (lambda r: lambda a, b: F.poisson_nll_loss(a, b, reduction=r),
                lambda r: lambda a, b: TF.poisson_nll_loss(a, b, reduction=r),
                lambda rng: [random(rng, (4, 5)), random(rng, (4, 5), 0, 3)], (0, 1)),
    "poisson_full": (lambda r: lambda a, b: F.poisson_nll_loss(a, b, log_input=False, full=True,
                                                               reduction=r),
                     lambda r: lambda a, b: TF.poisson_nll_loss(a, b, log_input=False, full=True,
                                                                reduction=r),
                     lambda rng: [random(rng, (4, 5), 0.1, 3), random(rng, (4, 5), 0, 3)], (0, 1)),
    "gaussian": (lambda r: lambda a, b, v: F.gaussian_nll_loss(a, b, v, reduction=r),
                 lambda r: lambda a, b, v: TF.gaussian_nll_loss(a, b, v, reduction=r),
                 lambda rng: [random(rng, (4, 5)), random(rng, (4, 5)), random(rng, (4, 5), 0.2, 2)],
                 (0, 1, 2)),
    "gaussian_short_var": (lambda r: lambda a, b, v: F.gaussian_nll_loss(a, b, v, full=True,
                                                                         reduction=r),
                           lambda r: lambda a, b, v: TF.gaussian_nll_loss(a, b, v, full=True,
                                                                          reduction=r),
                           lambda rng: [random(rng, (3, 2, 4)), random(rng, (3, 2, 4)),
                                        random(rng, (3, 2), 0.2, 2)], (0, 1, 2)),
    "gaussian_one_var": (lambda r: lambda a, b, v: F.gaussian_nll_loss(a, b, v, eps=0.3,
                                                                       reduction=r),
                         lambda r: lambda a, b, v: TF.gaussian_nll_loss(a, b, v, eps=0.3,
                                                                        reduction=r),
                         lambda rng: [random(rng, (3, 2, 4)), random(rng, (3, 2, 4)),
                                      random(rng, (3, 1, 4), 0.1, 2)], (0, 1, 2)),
    "hinge_embedding": (lambda r: lambda a, t: F.hinge_embedding_loss(a, t, 0.5, reduction=r),
                        lambda r: lambda a, t: TF.hinge_embedding_loss(a, t, 0.5, reduction=r),
                        lambda rng: [random(rng, (4, 5), -2, 2), _sign(rng, (4, 5))], (0,)),
    "margin_ranking": (lambda r: lambda a, b, t: F.margin_ranking_loss(a, b, t, 0.25, reduction=r),
                       lambda r: lambda a, b, t: TF.margin_ranking_loss(a, b, t, 0.25, reduction=r),
                       lambda rng: [random(rng, (7,)), random(rng, (7,)), _sign(rng, (7,))],
                       (0, 1, 2)),
    "soft_margin": (lambda r: lambda a, t: F.soft_margin_loss(a, t, reduction=r),
                    lambda r: lambda a, t: TF.soft_margin_loss(a, t, reduction=r),
                    lambda rng: [random(rng, (4, 5), -3, 3), _sign(rng, (4, 5))], (0,)),
    "multilabel_soft_margin": (
        lambda r: lambda a, t, w: F.multilabel_soft_margin_loss(a, t, w, reduction=r),
        lambda r: lambda a, t, w: TF.multilabel_soft_margin_loss(a, t, w, reduction=r),
        lambda rng: [random(rng, (4, 5), -3, 3), _probability(rng, (4, 5)),
                     random(rng, (5,), 0.5, 2)], (0, 1)),
    "multilabel_soft_margin_1d": (
        lambda r: lambda a, t: F.multilabel_soft_margin_loss(a, t, reduction=r),
        lambda r: lambda a, t: TF.multilabel_soft_margin_loss(a, t, reduction=r),
        lambda rng: [random(rng, (6,), -3, 3), _probability(rng, (6,))], (0, 1)),
}


@pytest.mark.filterwarnings("ignore:Using a target size", "ignore:reduction. 'mean'")
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_loss(ctx, rng, name, reduction):
    ours, theirs, inputs, grads = CASES[name]
    check(ctx, rng, ours(reduction), theirs(reduction), inputs(rng), grads)


def test_kl_div_batchmean(ctx, rng):
    for log_target in (False, True):
        check(ctx, rng, lambda a, b: F.kl_div(a, b, "batchmean", log_target),
              lambda a, b: TF.kl_div(a, b, reduction="batchmean", log_target=log_target),
              [random(rng, (3, 4, 2), -3, 0), _probability(rng, (3, 4, 2))])


def test_bce_clamps_its_logs_and_kl_div_zero_targets(ctx):
    x = np.array([0.0, 1.0, 0.5, 1e-30], np.float32)
    t = np.array([1.0, 0.0, 0.5, 1.0], np.float32)
    out = F.binary_cross_entropy(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, t),
                                 reduction="none").numpy()
    ref = TF.binary_cross_entropy(torch.tensor(x, dtype=torch.float64),
                                  torch.tensor(t, dtype=torch.float64), reduction="none").numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5)
    kl = F.kl_div(dp.Tensor.from_numpy(ctx, x - 1.0), dp.Tensor.from_numpy(ctx, t * 0.0),
                  reduction="sum").numpy()
    assert kl == 0.0


def test_bad_arguments(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    b = dp.Tensor.from_numpy(ctx, random(rng, (3, 5)))
    with pytest.raises(dp.UnsupportedError, match="reduction"):
        F.l1_loss(a, a, reduction="avg")
    with pytest.raises(dp.UnsupportedError, match="reduction"):
        F.huber_loss(a, a, reduction="batchmean")
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.l1_loss(a, b)
    with pytest.raises(dp.ShapeError, match="beta"):
        F.smooth_l1_loss(a, a, beta=-1.0)
    with pytest.raises(dp.ShapeError, match="delta"):
        F.huber_loss(a, a, delta=0.0)
    with pytest.raises(dp.ShapeError, match="input's shape"):
        F.binary_cross_entropy(a, dp.Tensor.from_numpy(ctx, random(rng, (1, 5))))
    with pytest.raises(dp.ShapeError, match="var"):
        F.gaussian_nll_loss(a, a, dp.Tensor.from_numpy(ctx, random(rng, (4, 2))))
    with pytest.raises(dp.ShapeError, match="var"):
        F.gaussian_nll_loss(a, a, -1.0)
    with pytest.raises(dp.ShapeError, match="rank"):
        F.margin_ranking_loss(a, a, dp.Tensor.from_numpy(ctx, random(rng, (5,))))
    with pytest.raises(dp.DTypeError, match="target"):
        F.soft_margin_loss(a, dp.Tensor.from_numpy(ctx, np.ones((4, 5), np.int64)))
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.kl_div(a, np.ones((4, 5), np.float32))
    with pytest.raises(dp.UnsupportedError, match="size_average"):
        F.poisson_nll_loss(a, a, size_average=True)


def test_gaussian_nll_loss_with_a_float_var(ctx, rng):
    check(ctx, rng, lambda a, b: F.gaussian_nll_loss(a, b, 0.5),
          lambda a, b: TF.gaussian_nll_loss(a, b, 0.5), [random(rng, (4, 3)), random(rng, (4, 3))])


def test_repeated_calls_build_nothing(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5), 0.1, 0.9), requires_grad=True)
    t = dp.Tensor.from_numpy(ctx, random(rng, (4, 5), 0.1, 0.9))

    def run():
        for reduction in REDUCTIONS:
            for y in (F.l1_loss(a, t, reduction), F.smooth_l1_loss(a, t, reduction),
                      F.huber_loss(a, t, reduction), F.kl_div(a, t, reduction),
                      F.binary_cross_entropy(a, t, reduction=reduction),
                      F.poisson_nll_loss(a, t, reduction=reduction),
                      F.gaussian_nll_loss(a, t, t, reduction=reduction),
                      F.hinge_embedding_loss(a, t, reduction=reduction),
                      F.margin_ranking_loss(a, t, t, reduction=reduction),
                      F.soft_margin_loss(a, t, reduction),
                      F.multilabel_soft_margin_loss(a, t, reduction=reduction)):
                y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        a.grad = None

    run()
    before = dict(program.stats)
    run()
    ctx.synchronize()
    assert dict(program.stats) == before
