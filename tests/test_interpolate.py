"""interpolate against torch (float64): nearest, linear, bilinear with and without
align_corners, area; up- and downsampling, odd sizes, scale factors; forward and gradients."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from conftest import assert_close, random

TF = torch.nn.functional


@pytest.mark.parametrize("shape,kwargs", [
    ((2, 3, 5, 7), dict(size=(9, 4), mode="nearest")),
    ((1, 2, 4, 6), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 5, 5), dict(scale_factor=1.7, mode="nearest")),
    ((2, 3, 7), dict(size=3, mode="nearest")),
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bilinear", align_corners=False)),
    ((2, 3, 5, 7), dict(size=(9, 4), mode="bilinear", align_corners=True)),
    ((1, 2, 6, 4), dict(scale_factor=(0.5, 2.5), mode="bilinear")),
    ((1, 2, 6, 4), dict(scale_factor=1.5, mode="bilinear", recompute_scale_factor=True)),
    ((1, 1, 1, 1), dict(size=(3, 2), mode="bilinear", align_corners=True)),
    ((1, 1, 4, 3), dict(size=(1, 1), mode="bilinear", align_corners=True)),
    ((2, 3, 6), dict(size=11, mode="linear", align_corners=False)),
    ((2, 3, 6), dict(size=4, mode="linear", align_corners=True)),
    ((2, 3, 8, 6), dict(size=(3, 4), mode="area")),
])
def test_interpolate(ctx, rng, shape, kwargs):
    data = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    y = F.interpolate(x, **kwargs)
    ref = TF.interpolate(t, **kwargs)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, ref.shape)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    assert_close(x.grad.numpy(), t.grad.numpy())


def test_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 4, 4)))
    with pytest.raises(dp.ShapeError, match="exactly one"):
        F.interpolate(x)
    with pytest.raises(dp.ShapeError, match="exactly one"):
        F.interpolate(x, size=2, scale_factor=2)
    with pytest.raises(dp.ShapeError, match="align_corners"):
        F.interpolate(x, size=2, mode="nearest", align_corners=True)
    with pytest.raises(dp.ShapeError, match="3-d"):
        F.interpolate(x, size=2, mode="linear")
    with pytest.raises(dp.UnsupportedError, match="mode"):
        F.interpolate(x, size=2, mode="bicubic")
    # Ranks torch accepts there: a limitation, not a shape error (once ShapeError).
    with pytest.raises(dp.UnsupportedError, match="4-d"):
        F.interpolate(dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 5))), size=2, mode="area")
    with pytest.raises(dp.UnsupportedError, match="3-d or 4-d"):
        F.interpolate(dp.Tensor.from_numpy(ctx, random(rng, (1, 1, 2, 2, 2))), size=2)
    with pytest.raises(dp.ShapeError, match="4-d"):
        F.interpolate(dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 5))), size=2, mode="bilinear")
    with pytest.raises(dp.ShapeError, match=">= 1"):
        F.interpolate(x, size=(0, 2))
    with pytest.raises(dp.ShapeError, match="empty output"):
        F.interpolate(x, scale_factor=0.1)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.interpolate(dp.Tensor.from_numpy(ctx, np.ones((1, 1, 2, 2), np.int32)), size=3)


def test_random_sizes(ctx, rng):
    """Seeded random input and output sizes in both directions, each mode, with gradients."""
    for mode, align in [("nearest", None), ("bilinear", False), ("bilinear", True)] * 3:
        shape = (1, int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        size = (int(rng.integers(1, 13)), int(rng.integers(1, 13)))
        data = random(rng, shape)
        x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
        t = torch.tensor(data, dtype=torch.float64, requires_grad=True)
        y = F.interpolate(x, size=size, mode=mode, align_corners=align)
        ref = TF.interpolate(t, size=size, mode=mode, align_corners=align)
        assert_close(y.numpy(), ref.detach().numpy())
        grad = random(rng, ref.shape)
        y.backward(dp.Tensor.from_numpy(ctx, grad))
        ref.backward(torch.tensor(grad, dtype=torch.float64))
        assert_close(x.grad.numpy(), t.grad.numpy())


def test_area_to_an_empty_output(ctx, rng):
    """"area" (adaptive pooling) gives an empty output for size 0 as torch does (once refused);
    the other modes refuse it, as torch does."""
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 7, 3)))
    for size, scale in (((0, 2), None), (None, 0.25)):
        y = F.interpolate(x, size, scale, mode="area")
        assert y.shape == tuple(TF.interpolate(torch.zeros(1, 2, 7, 3), size, scale, mode="area").shape)
        with pytest.raises(dp.ShapeError):
            F.interpolate(x, size, scale, mode="nearest")
