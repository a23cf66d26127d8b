"""The elementwise and margin losses against torch CPU float64: values and gradients on seeded
data, every reduction, broadcasting, outputs from a NaN-poisoned pool, bad arguments, and
repeated calls that build nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp

from conftest import assert_close, assert_repeats_build_nothing, random
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
        check(ctx, rng, lambda a, b: F.kl_div(a, b, reduction="batchmean", log_target=log_target),
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
    # torch's deprecated size_average / reduce decide the reduction where given.
    for size_average, reduce, reduction in ((False, None, "sum"), (None, False, "none"),
                                            (True, True, "mean")):
        assert_close(F.l1_loss(a, a * 0.5, size_average, reduce).numpy(),
                     F.l1_loss(a, a * 0.5, reduction=reduction).numpy())


def test_gaussian_nll_loss_with_a_float_var(ctx, rng):
    check(ctx, rng, lambda a, b: F.gaussian_nll_loss(a, b, 0.5),
          lambda a, b: TF.gaussian_nll_loss(a, b, 0.5), [random(rng, (4, 3)), random(rng, (4, 3))])


def test_repeated_calls_build_nothing(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5), 0.1, 0.9), requires_grad=True)
    t = dp.Tensor.from_numpy(ctx, random(rng, (4, 5), 0.1, 0.9))

    def run():
        for reduction in REDUCTIONS:
            for y in (F.l1_loss(a, t, reduction=reduction),
                      F.smooth_l1_loss(a, t, reduction=reduction),
                      F.huber_loss(a, t, reduction), F.kl_div(a, t, reduction=reduction),
                      F.binary_cross_entropy(a, t, reduction=reduction),
                      F.poisson_nll_loss(a, t, reduction=reduction),
                      F.gaussian_nll_loss(a, t, t, reduction=reduction),
                      F.hinge_embedding_loss(a, t, reduction=reduction),
                      F.margin_ranking_loss(a, t, t, reduction=reduction),
                      F.soft_margin_loss(a, t, reduction=reduction),
                      F.multilabel_soft_margin_loss(a, t, reduction=reduction)):
                y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        a.grad = None

    assert_repeats_build_nothing(ctx, run)


def _with_targets(ours, theirs, target, *extra):
    """Calls of a loss with an int64 target (and other fixed operands)."""
    return (lambda x: ours(x, target[0], *extra[0]), lambda x: theirs(x, target[1], *extra[1]))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,weighted,shape", [(1, False, (5, 4)), (2, True, (5, 4)), (1, True, (6,))])
def test_multi_margin_loss(ctx, rng, reduction, p, weighted, shape):
    c = shape[-1]
    t = rng.integers(0, c, size=shape[:-1]).astype(np.int64)
    w = random(rng, (c,), 0.5, 2)
    ours, theirs = _with_targets(
        lambda x, t_, w_: F.multi_margin_loss(x, t_, p, 0.6, w_, reduction=reduction),
        lambda x, t_, w_: TF.multi_margin_loss(x, t_, p, 0.6, w_, reduction=reduction),
        (dp.Tensor.from_numpy(ctx, t), torch.tensor(t)),
        (dp.Tensor.from_numpy(ctx, w) if weighted else None,),
        (torch.tensor(w, dtype=torch.float64) if weighted else None,))
    check(ctx, rng, ours, theirs, [random(rng, shape, -1, 1)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("batched", [True, False])
def test_multilabel_margin_loss(ctx, rng, reduction, batched):
    # rows 4 and 5 name a class twice before the stop: torch counts it twice
    t = np.array([[1, 3, -1, 0, 0], [0, 1, 2, 3, 4], [-1, 2, 0, 0, 0], [4, -1, 1, 1, 1],
                  [2, 2, 0, -1, 3], [3, 1, 3, 3, 1]], np.int64)
    if not batched:
        t = t[4]
    ours, theirs = _with_targets(
        lambda x, t_: F.multilabel_margin_loss(x, t_, reduction=reduction),
        lambda x, t_: TF.multilabel_margin_loss(x, t_, reduction=reduction),
        (dp.Tensor.from_numpy(ctx, t), torch.tensor(t)), (), ())
    check(ctx, rng, ours, theirs, [random(rng, t.shape, -1, 1)])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,weighted", [((5, 4), True), ((3, 4, 2, 3), False), ((6,), True)])
def test_cross_entropy_label_smoothing(ctx, rng, reduction, shape, weighted):
    c = shape[0] if len(shape) == 1 else shape[1]
    t = rng.integers(0, c, size=() if len(shape) == 1 else (shape[0],) + shape[2:]).astype(np.int64)
    if t.size > 1:
        t.flat[1] = -100
    w = random(rng, (c,), 0.5, 2)
    ours, theirs = _with_targets(
        lambda x, t_, w_: F.cross_entropy(x, t_, w_, reduction=reduction, label_smoothing=0.2),
        lambda x, t_, w_: TF.cross_entropy(x, t_, w_, reduction=reduction, label_smoothing=0.2),
        (dp.Tensor.from_numpy(ctx, t), torch.tensor(t)),
        (dp.Tensor.from_numpy(ctx, w) if weighted else None,),
        (torch.tensor(w, dtype=torch.float64) if weighted else None,))
    check(ctx, rng, ours, theirs, [random(rng, shape, -2, 2)])


def test_cross_entropy_label_smoothing_with_probabilities(ctx, rng):
    probs = rng.dirichlet(np.ones(4), size=5).astype(np.float32)
    check(ctx, rng, lambda x, p: F.cross_entropy(x, p, label_smoothing=0.3),
          lambda x, p: TF.cross_entropy(x, p, label_smoothing=0.3),
          [random(rng, (5, 4), -2, 2), probs], grads=(0,))


def test_margin_losses_refuse(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    t = dp.Tensor.from_numpy(ctx, np.array([1, 0, 4, 2], np.int64))
    with pytest.raises(dp.UnsupportedError, match="p must be"):
        F.multi_margin_loss(x, t, p=3)
    with pytest.raises(dp.DTypeError, match="int64"):
        F.multi_margin_loss(x, x)
    with pytest.raises(dp.ShapeError, match="target of shape"):
        F.multilabel_margin_loss(x, t)
    with pytest.raises(dp.ShapeError, match="weight"):
        F.multi_margin_loss(x, t, weight=dp.Tensor.from_numpy(ctx, random(rng, (4,))))
    # A target outside [0, C) is reported at the next synchronizing call.
    F.multi_margin_loss(x, dp.Tensor.from_numpy(ctx, np.array([1, 7, 0, 0], np.int64)))
    with pytest.raises(dp.ShapeError, match="out of range"):
        ctx.synchronize()


def test_loss_modules(ctx, rng):
    a, b = random(rng, (4, 5), 0.1, 0.9), random(rng, (4, 5), 0.1, 0.9)
    x, y = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    xt, yt = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    sign = _sign(rng, (4,))
    s, st = dp.Tensor.from_numpy(ctx, sign), torch.tensor(sign, dtype=torch.float64)
    labels = np.array([1, 0, 4, 2], np.int64)
    lab, labt = dp.Tensor.from_numpy(ctx, labels), torch.tensor(labels)
    multi = np.array([[1, -1, 0, 0, 0]] * 4, np.int64)
    m, mt = dp.Tensor.from_numpy(ctx, multi), torch.tensor(multi)
    nn, tnn = dp.nn, torch.nn
    pairs = [
        (nn.L1Loss()(x, y), tnn.L1Loss()(xt, yt)),
        (nn.SmoothL1Loss(beta=0.5)(x, y), tnn.SmoothL1Loss(beta=0.5)(xt, yt)),
        (nn.HuberLoss(reduction="sum", delta=0.5)(x, y), tnn.HuberLoss("sum", 0.5)(xt, yt)),
        (nn.KLDivLoss(reduction="batchmean")(x, y), tnn.KLDivLoss(reduction="batchmean")(xt, yt)),
        (nn.BCELoss()(x, y), tnn.BCELoss()(xt, yt)),
        (nn.PoissonNLLLoss(log_input=False)(x, y), tnn.PoissonNLLLoss(log_input=False)(xt, yt)),
        (nn.GaussianNLLLoss()(x, y, y), tnn.GaussianNLLLoss()(xt, yt, yt)),
        (nn.HingeEmbeddingLoss(0.5)(x, y), tnn.HingeEmbeddingLoss(0.5)(xt, yt)),
        (nn.SoftMarginLoss()(x, y), tnn.SoftMarginLoss()(xt, yt)),
        (nn.MultiLabelSoftMarginLoss()(x, y), tnn.MultiLabelSoftMarginLoss()(xt, yt)),
        (nn.MarginRankingLoss(0.1)(x, y, y), tnn.MarginRankingLoss(0.1)(xt, yt, yt)),
        (nn.CosineEmbeddingLoss(0.1)(x, y, s), tnn.CosineEmbeddingLoss(0.1)(xt, yt, st)),
        (nn.TripletMarginLoss(0.5)(x, y, y * 0.5), tnn.TripletMarginLoss(0.5)(xt, yt, yt * 0.5)),
        (nn.MultiMarginLoss(p=2)(x, lab), tnn.MultiMarginLoss(p=2)(xt, labt)),
        (nn.MultiLabelMarginLoss()(x, m), tnn.MultiLabelMarginLoss()(xt, mt)),
        (nn.CrossEntropyLoss(label_smoothing=0.1)(x, lab),
         tnn.CrossEntropyLoss(label_smoothing=0.1)(xt, labt)),
        (nn.CosineSimilarity()(x, y), tnn.CosineSimilarity()(xt, yt)),
        (nn.PairwiseDistance(p=1.0)(x, y), tnn.PairwiseDistance(p=1.0)(xt, yt)),
    ]
    for ours, theirs in pairs:
        assert_close(ours.numpy(), theirs.numpy())
    bilinear = nn.Bilinear(5, 5, 3, ctx=ctx)
    assert bilinear(x, y).shape == (4, 3)
    assert sorted(n for n, _ in bilinear.named_parameters()) == ["bias", "weight"]


def test_margin_losses_build_nothing_when_repeated(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)), requires_grad=True)
    t = dp.Tensor.from_numpy(ctx, np.array([1, 0, 4, 2], np.int64))
    m = dp.Tensor.from_numpy(ctx, np.array([[1, -1, 0, 0, 0]] * 4, np.int64))

    def run():
        for reduction in REDUCTIONS:
            for y in (F.multi_margin_loss(x, t, reduction=reduction),
                      F.multilabel_margin_loss(x, m, reduction=reduction),
                      F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.1)):
                y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        x.grad = None

    assert_repeats_build_nothing(ctx, run)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", ["classes", "unbatched", "probabilities", "k_dim"])
def test_linear_cross_entropy(ctx, rng, reduction, case):
    """linear_cross_entropy against torch's in float64: loss and the gradients of input,
    linear_weight and linear_bias, with class weights, ignore_index and label smoothing."""
    n, f, c = 6, 5, 4
    in_shape = (f,) if case == "unbatched" else (n, f)
    w_shape = (c, 3, f) if case == "k_dim" else (c, f)
    x, w, b = random(rng, in_shape), random(rng, w_shape), random(rng, w_shape[:-1])
    cw = random(rng, (c,), 0.5, 2)
    logits = in_shape[:-1] + w_shape[:-1]
    kwargs = dict(reduction=reduction)
    if case == "probabilities":
        t = rng.random(logits).astype(np.float32)
        t /= t.sum(-1, keepdims=True)
        kwargs["label_smoothing"] = 0.2
    else:
        t = rng.integers(0, c, logits[:1] + logits[2:] if case == "k_dim" else logits[:-1])
        if case == "classes":
            t[1] = 2
            kwargs["ignore_index"] = 2
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (x, w, b)]
    theirs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b)]
    tr = torch.tensor(t, dtype=torch.float64 if t.dtype == np.float32 else torch.int64)
    y = F.linear_cross_entropy(ours[0], ours[1], dp.Tensor.from_numpy(ctx, t),
                               linear_bias=ours[2], weight=dp.Tensor.from_numpy(ctx, cw), **kwargs)
    yr = TF.linear_cross_entropy(theirs[0], theirs[1], tr, linear_bias=theirs[2],
                                 weight=torch.tensor(cw, dtype=torch.float64), **kwargs)
    assert y.shape == tuple(yr.shape)
    assert_close(y.numpy(), yr.detach().numpy())
    g = random(rng, yr.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yr.backward(torch.tensor(g, dtype=torch.float64))
    for mine, ref in zip(ours, theirs):
        assert_close(mine.grad.numpy(), ref.grad.numpy())


def test_linear_cross_entropy_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (3, 5)))
    w = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    t = dp.Tensor.from_numpy(ctx, np.array([0, 1, 3]))
    with pytest.raises(dp.ShapeError, match="in_features"):
        F.linear_cross_entropy(x, dp.Tensor.from_numpy(ctx, random(rng, (4, 6))), t)
    with pytest.raises(dp.ShapeError, match="linear_bias"):
        F.linear_cross_entropy(x, w, t, linear_bias=dp.Tensor.from_numpy(ctx, random(rng, (5,))))
    with pytest.raises(dp.ShapeError, match="batched"):
        F.linear_cross_entropy(x[0], dp.Tensor.from_numpy(ctx, random(rng, (4, 2, 5))), t[0])
