"""normalize, rms_norm and instance_norm against torch CPU float64: values and gradients on
seeded data, outputs from a NaN-poisoned pool, the running statistics' update, bad arguments,
and repeated calls that build nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp

from conftest import assert_close, assert_repeats_build_nothing, random
from test_activation_extra import check

F = dp.functional


@pytest.mark.parametrize("shape,p,dim", [((4, 5), 2.0, 1), ((3, 4, 5), 1.0, -1),
                                         ((3, 4, 5), 3.0, (0, 2)), ((6,), 2.0, 0)])
def test_normalize(ctx, rng, shape, p, dim):
    check(ctx, rng, lambda x: F.normalize(x, p, dim), lambda x: TF.normalize(x, p, dim),
          [random(rng, shape)])


def test_normalize_clamps_small_norms(ctx, rng):
    a = random(rng, (4, 5))
    a[2] = 1e-4
    check(ctx, rng, lambda x: F.normalize(x, eps=1e-2), lambda x: TF.normalize(x, eps=1e-2), [a])


@pytest.mark.parametrize("shape,normalized,weight,eps", [((4, 6), (6,), True, None),
                                                         ((2, 3, 4, 5), (4, 5), True, 1e-3),
                                                         ((3, 5), 5, False, None), ((7,), (7,), True, 0.1)])
def test_rms_norm(ctx, rng, shape, normalized, weight, eps):
    wshape = (normalized,) if isinstance(normalized, int) else normalized
    arrays = [random(rng, shape)] + ([random(rng, wshape, 0.5, 1.5)] if weight else [])
    check(ctx, rng, lambda x, *w: F.rms_norm(x, normalized, *w, eps=eps),
          lambda x, *w: TF.rms_norm(x, wshape, *w, eps=eps), arrays)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 4)])
@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm(ctx, rng, shape, affine):
    c = shape[1]
    arrays = [random(rng, shape, -2, 3)]
    if affine:
        arrays += [random(rng, (c,), 0.5, 1.5), random(rng, (c,))]
    check(ctx, rng, lambda x, *wb: F.instance_norm(x, None, None, *wb),
          lambda x, *wb: TF.instance_norm(x, None, None, *wb), arrays)


def test_instance_norm_running_statistics(ctx, rng):
    a = random(rng, (3, 4, 6), -1, 3)
    rm, rv = random(rng, (4,)), random(rng, (4,), 0.5, 1.5)
    ours_m, ours_v = dp.Tensor.from_numpy(ctx, rm), dp.Tensor.from_numpy(ctx, rv)
    ref_m, ref_v = torch.tensor(rm, dtype=torch.float64), torch.tensor(rv, dtype=torch.float64)
    out = F.instance_norm(dp.Tensor.from_numpy(ctx, a), ours_m, ours_v, momentum=0.3)
    ref = TF.instance_norm(torch.tensor(a, dtype=torch.float64), ref_m, ref_v, momentum=0.3)
    assert_close(out.numpy(), ref.numpy())
    assert_close(ours_m.numpy(), ref_m.numpy())
    assert_close(ours_v.numpy(), ref_v.numpy())
    # Normalized by the running statistics.
    w, b = random(rng, (4,), 0.5, 1.5), random(rng, (4,))
    check(ctx, rng, lambda x, w_, b_: F.instance_norm(x, ours_m, ours_v, w_, b_, False),
          lambda x, w_, b_: TF.instance_norm(x, ref_m, ref_v, w_, b_, False), [a, w, b])


def test_bad_arguments(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    with pytest.raises(dp.ShapeError, match="dim"):
        F.normalize(x, dim=2)
    with pytest.raises(dp.UnsupportedError, match="out"):
        F.normalize(x, out=x)
    with pytest.raises(dp.ShapeError, match="trailing"):
        F.rms_norm(x, (4,))
    with pytest.raises(dp.ShapeError, match="weight"):
        F.rms_norm(x, (5,), dp.Tensor.from_numpy(ctx, random(rng, (4,))))
    with pytest.raises(dp.ShapeError, match="spatial"):
        F.instance_norm(dp.Tensor.from_numpy(ctx, random(rng, (4, 5, 1))))
    with pytest.raises(dp.ShapeError, match="use_input_stats"):
        F.instance_norm(dp.Tensor.from_numpy(ctx, random(rng, (4, 5, 3))), use_input_stats=False)
    with pytest.raises(dp.ShapeError, match="one per channel"):
        F.instance_norm(dp.Tensor.from_numpy(ctx, random(rng, (4, 5, 3))),
                        weight=dp.Tensor.from_numpy(ctx, random(rng, (4,))))


def test_modules(ctx, rng):
    a = random(rng, (3, 4, 6))
    x, t = dp.Tensor.from_numpy(ctx, a), torch.tensor(a, dtype=torch.float64)
    ours = dp.nn.RMSNorm(6, eps=1e-4, ctx=ctx)
    assert_close(ours(x).numpy(), torch.nn.RMSNorm(6, eps=1e-4).double()(t).detach().numpy())
    for cls, theirs_cls in ((dp.nn.InstanceNorm1d, torch.nn.InstanceNorm1d),):
        for affine, track in ((False, False), (True, True)):
            ours, theirs = cls(4, affine=affine, track_running_stats=track, ctx=ctx), \
                theirs_cls(4, affine=affine, track_running_stats=track).double()
            assert_close(ours(x).numpy(), theirs(t).detach().numpy())
            if track:
                assert_close(ours.running_mean.numpy(), theirs.running_mean.numpy())
                ours.eval(), theirs.eval()
                assert_close(ours(x).numpy(), theirs(t).detach().numpy())


def test_repeated_calls_build_nothing(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4)), requires_grad=True)
    w = dp.Tensor.from_numpy(ctx, random(rng, (3,)), requires_grad=True)
    w34 = dp.Tensor.from_numpy(ctx, random(rng, (3, 4)), requires_grad=True)
    rm, rv = dp.Tensor.zeros(ctx, (3,)), dp.Tensor.full(ctx, (3,), 1.0)

    def run():
        for y in (F.normalize(x), F.rms_norm(x, (4,)), F.rms_norm(x, (3, 4), w34),
                  F.instance_norm(x, rm, rv, w, w)):
            y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        x.grad = w.grad = w34.grad = None

    assert_repeats_build_nothing(ctx, run)
