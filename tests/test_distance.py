"""cosine_similarity, pairwise_distance, pdist, bilinear, cosine_embedding_loss,
triplet_margin_loss and triplet_margin_with_distance_loss against torch CPU float64: values and gradients on seeded data,
broadcasting, every reduction, outputs from a NaN-poisoned pool, bad arguments, and repeated
calls that build nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp

from conftest import assert_repeats_build_nothing, random
from test_activation_extra import check

F = dp.functional
INF = float("inf")


@pytest.mark.parametrize("shapes,dim", [(((4, 5), (4, 5)), 1), (((3, 4, 5), (4, 5)), -1),
                                        (((2, 3, 4), (1, 3, 4)), 1), (((6,), (6,)), 0)])
def test_cosine_similarity(ctx, rng, shapes, dim):
    check(ctx, rng, lambda a, b: F.cosine_similarity(a, b, dim),
          lambda a, b: TF.cosine_similarity(a, b, dim), [random(rng, s) for s in shapes])


def test_cosine_similarity_of_a_zero_vector(ctx, rng):
    a, b = random(rng, (3, 4)), random(rng, (3, 4))
    a[1] = 0.0
    check(ctx, rng, lambda x, y: F.cosine_similarity(x, y, 1, eps=1e-3),
          lambda x, y: TF.cosine_similarity(x, y, 1, eps=1e-3), [a, b])


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 0.5, INF, -1.0, -2.5, -INF])
@pytest.mark.parametrize("shapes,keepdim", [(((4, 5), (4, 5)), False), (((3, 4, 5), (5,)), True),
                                            (((6,), (6,)), False)])
def test_pairwise_distance(ctx, rng, p, shapes, keepdim):
    check(ctx, rng, lambda a, b: F.pairwise_distance(a, b, p, 1e-6, keepdim),
          lambda a, b: TF.pairwise_distance(a, b, p, 1e-6, keepdim),
          [random(rng, s) for s in shapes])


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, 1.5, 0.5, INF, 0.0])
def test_pdist(ctx, rng, p):
    check(ctx, rng, lambda a: F.pdist(a, p), lambda a: TF.pdist(a, p), [random(rng, (7, 5))])


def test_pdist_of_one_and_large_row_counts(ctx, rng):
    check(ctx, rng, F.pdist, TF.pdist, [random(rng, (1, 3))], grads=())
    # Enough rows that the float estimate of a pair's row needs its integer correction.
    check(ctx, rng, F.pdist, TF.pdist, [random(rng, (300, 2))])


@pytest.mark.parametrize("lead,bias", [((5,), True), ((2, 3), False), ((), True)])
def test_bilinear(ctx, rng, lead, bias):
    arrays = [random(rng, lead + (4,)), random(rng, lead + (3,)), random(rng, (6, 4, 3))]
    if bias:
        arrays.append(random(rng, (6,)))
    check(ctx, rng, F.bilinear, TF.bilinear, arrays)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(6, 5), (5,)])
def test_cosine_embedding_loss(ctx, rng, reduction, shape):
    target = np.array([1, -1, 1, -1, -1, 1][:shape[0]] if len(shape) == 2 else -1.0, np.float32)
    check(ctx, rng, lambda a, b, t: F.cosine_embedding_loss(a, b, t, -0.2, reduction=reduction),
          lambda a, b, t: TF.cosine_embedding_loss(a, b, t, -0.2, reduction=reduction),
          [random(rng, shape), random(rng, shape), target], grads=(0, 1))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("p,swap,shape", [(2.0, False, (6, 5)), (1.0, True, (6, 5)),
                                          (3.0, True, (5,))])
def test_triplet_margin_loss(ctx, rng, reduction, p, swap, shape):
    check(ctx, rng, lambda a, b, c: F.triplet_margin_loss(a, b, c, 0.5, p, swap=swap,
                                                          reduction=reduction),
          lambda a, b, c: TF.triplet_margin_loss(a, b, c, 0.5, p, swap=swap, reduction=reduction),
          [random(rng, shape) for _ in range(3)])


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("distance, swap, shape", [
    (None, False, (6, 5)), ("cosine", True, (6, 5)), ("l1", False, (2, 3, 5)),
    ("module", True, (6, 5))])
def test_triplet_margin_with_distance_loss(ctx, rng, reduction, distance, swap, shape):
    """The default distance (pairwise_distance), a composed one (1 - cosine similarity, whose
    gradients come through the tape), an L1 one over a 3-d input and the distance module; swap
    and every reduction; the module form too."""
    ours_fn, theirs_fn = {
        None: (None, None),
        "cosine": (lambda x, y: F.sub(1.0, F.cosine_similarity(x, y)),
                   lambda x, y: 1.0 - TF.cosine_similarity(x, y)),
        "l1": (lambda x, y: F.sum(F.abs(F.sub(x, y)), -1),
               lambda x, y: (x - y).abs().sum(-1)),
        "module": (dp.nn.PairwiseDistance(p=1.5), torch.nn.PairwiseDistance(p=1.5)),
    }[distance]
    check(ctx, rng, lambda a, b, c: F.triplet_margin_with_distance_loss(
              a, b, c, distance_function=ours_fn, margin=0.7, swap=swap, reduction=reduction),
          lambda a, b, c: TF.triplet_margin_with_distance_loss(
              a, b, c, distance_function=theirs_fn, margin=0.7, swap=swap, reduction=reduction),
          [random(rng, shape) for _ in range(3)])
    module = dp.nn.TripletMarginWithDistanceLoss(distance_function=ours_fn, margin=0.7,
                                                  swap=swap, reduction=reduction)
    args = [dp.Tensor.from_numpy(ctx, random(rng, shape)) for _ in range(3)]
    np.testing.assert_array_equal(
        module(*args).numpy(),
        F.triplet_margin_with_distance_loss(*args, distance_function=ours_fn, margin=0.7,
                                            swap=swap, reduction=reduction).numpy())


def test_triplet_margin_with_distance_loss_refusals(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    with pytest.raises(dp.ShapeError, match="margin must be > 0"):
        F.triplet_margin_with_distance_loss(a, a, a, margin=0.0)
    with pytest.raises(dp.ShapeError, match="one rank"):
        F.triplet_margin_with_distance_loss(a, a, dp.Tensor.from_numpy(ctx, random(rng, (5,))))
    with pytest.raises(dp.DTypeError, match="callable"):
        F.triplet_margin_with_distance_loss(a, a, a, distance_function=3)
    with pytest.raises(dp.DTypeError, match="float32 tensors"):
        F.triplet_margin_with_distance_loss(a, a, a, distance_function=lambda x, y: 1.0)


def test_bad_arguments(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    b = dp.Tensor.from_numpy(ctx, random(rng, (3, 5)))
    with pytest.raises(dp.ShapeError, match="broadcast"):
        F.cosine_similarity(a, b)
    with pytest.raises(dp.ShapeError, match="dim"):
        F.cosine_similarity(a, a, 2)
    with pytest.raises(dp.ShapeError, match="p must be"):
        F.pdist(a, -1.0)
    with pytest.raises(dp.ShapeError, match="p must be"):
        F.pairwise_distance(a, a, float("nan"))
    empty = dp.Tensor.zeros(ctx, (4, 0))
    with pytest.raises(dp.ShapeError, match="no identity"):
        F.pairwise_distance(empty, empty, -1.0)
    assert F.pairwise_distance(empty, empty, 2.0).numpy().tolist() == [0.0] * 4
    with pytest.raises(dp.ShapeError, match=r"\(N, M\)"):
        F.pdist(dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4))))
    with pytest.raises(dp.ShapeError, match="weight"):
        F.bilinear(a, a, dp.Tensor.from_numpy(ctx, random(rng, (3, 5))))
    with pytest.raises(dp.ShapeError, match="features"):
        F.bilinear(a, a, dp.Tensor.from_numpy(ctx, random(rng, (3, 4, 5))))
    with pytest.raises(dp.ShapeError, match="target"):
        F.cosine_embedding_loss(a, a, dp.Tensor.from_numpy(ctx, random(rng, (5,))))
    with pytest.raises(dp.ShapeError, match="margin"):
        F.triplet_margin_loss(a, a, a, margin=0.0)
    with pytest.raises(dp.ShapeError, match="anchor"):
        F.triplet_margin_loss(a, a, dp.Tensor.from_numpy(ctx, random(rng, (5,))))


def test_repeated_calls_build_nothing(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)), requires_grad=True)
    b = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)), requires_grad=True)
    w = dp.Tensor.from_numpy(ctx, random(rng, (3, 5, 5)), requires_grad=True)
    t = dp.Tensor.from_numpy(ctx, np.array([1, -1, 1, -1], np.float32))

    def run():
        for y in (F.cosine_similarity(a, b), F.pairwise_distance(a, b), F.pdist(a, 3.0),
                  F.bilinear(a, b, w), F.cosine_embedding_loss(a, b, t),
                  F.triplet_margin_loss(a, b, a * 0.5, swap=True)):
            y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        a.grad = b.grad = w.grad = None

    assert_repeats_build_nothing(ctx, run)
