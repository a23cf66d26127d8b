"""grid_sample and affine_grid against torch CPU float64: every mode, padding mode and
align_corners, 4-D and 5-D, the output and the gradients of the input and the grid (outputs
taken from a poisoned pool), halves in nearest mode, bad arguments, repeated calls."""
import numpy as np
import pytest
import torch

import dlprim_py as dp

from conftest import assert_close, assert_repeats_build_nothing, random
from test_indexing import poison_pool

F = dp.functional
TF = torch.nn.functional

CASES = [(dims, mode, padding, align)
         for dims in (2, 3) for mode in ("bilinear", "nearest", "bicubic")
         for padding in ("zeros", "border", "reflection") for align in (False, True)
         if not (dims == 3 and mode == "bicubic")]


def _compare(ctx, rng, x, g, mode, padding, align, grads=("input", "grid")):
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=name in grads)
            for name, a in (("input", x), ("grid", g))]
    theirs = [torch.tensor(a.astype(np.float64), requires_grad=name in grads)
              for name, a in (("input", x), ("grid", g))]
    poison_pool(ctx)
    out = F.grid_sample(*ours, mode=mode, padding_mode=padding, align_corners=align)
    ref = TF.grid_sample(*theirs, mode=mode, padding_mode=padding, align_corners=align)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    if not grads:
        return
    gout = random(rng, out.shape)
    poison_pool(ctx)
    out.backward(dp.Tensor.from_numpy(ctx, gout))
    ref.backward(torch.tensor(gout.astype(np.float64)))
    for name, mine, ref_t in zip(("input", "grid"), ours, theirs):
        if name in grads:
            assert mine.grad.shape == mine.shape
            assert_close(mine.grad.numpy(), ref_t.grad.numpy())
        else:
            assert mine.grad is None


@pytest.mark.parametrize("dims, mode, padding, align", CASES)
def test_matches_torch(ctx, rng, dims, mode, padding, align):
    """Points inside and outside [-1, 1] (every padding mode's reflections and clamps), more
    output points than input elements, a grid that is not square."""
    x = random(rng, (2, 3, 5, 6) if dims == 2 else (2, 3, 4, 5, 6))
    g = random(rng, (2, 4, 7, 2) if dims == 2 else (2, 3, 4, 5, 3), -1.4, 1.4)
    _compare(ctx, rng, x, g, mode, padding, align)


@pytest.mark.parametrize("grads", [("input",), ("grid",), ()])
def test_one_gradient_or_none(ctx, rng, grads):
    x, g = random(rng, (2, 3, 5, 6)), random(rng, (2, 4, 7, 2), -1.2, 1.2)
    _compare(ctx, rng, x, g, "bilinear", "reflection", False, grads)
    _compare(ctx, rng, x, g, "bicubic", "zeros", True, grads)


@pytest.mark.parametrize("align", [False, True])
def test_nearest_rounds_halves_to_even(ctx, rng, align):
    """Grid values that land exactly half-way between two elements: nearest takes the even
    one, as torch's nearbyint."""
    W = 5 if align else 4     # sizes whose unnormalizing is exact in float32 for these values
    # Index-space coordinates 0.5, 1.5, ... and their grid values.
    coords = np.arange(W - 1) + 0.5
    values = (2 * coords / (W - 1) - 1) if align else ((2 * coords + 1) / W - 1)
    g = np.zeros((1, 1, W - 1, 2), np.float32)
    g[0, 0, :, 0] = values
    x = np.arange(W, dtype=np.float32).reshape(1, 1, 1, W)
    out = F.grid_sample(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, g), "nearest",
                        align_corners=align)
    ref = TF.grid_sample(torch.tensor(x), torch.tensor(g), "nearest", align_corners=align)
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    assert out.numpy().ravel().tolist() == np.rint(coords).tolist() == [0.0, 2.0, 2.0, 4.0][:W - 1]


def test_empty_grid_and_channels(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4, 4)), requires_grad=True)
    g = dp.Tensor.from_numpy(ctx, np.zeros((2, 0, 5, 2), np.float32), requires_grad=True)
    out = F.grid_sample(x, g)
    assert out.shape == (2, 3, 0, 5)
    out.backward(dp.Tensor.zeros(ctx, out.shape))
    assert np.array_equal(x.grad.numpy(), np.zeros((2, 3, 4, 4), np.float32))
    assert g.grad.shape == (2, 0, 5, 2)
    x0 = dp.Tensor.from_numpy(ctx, np.zeros((2, 0, 4, 4), np.float32))
    g0 = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 3, 2)), requires_grad=True)
    out = F.grid_sample(x0, g0)
    assert out.shape == (2, 0, 3, 3)
    out.backward(dp.Tensor.zeros(ctx, out.shape))
    assert np.array_equal(g0.grad.numpy(), np.zeros((2, 3, 3, 2), np.float32))


def test_repeated_call_builds_nothing(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 5, 6)), requires_grad=True)
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 7, 2)), requires_grad=True)

    def step():
        x.grad = g.grad = None      # no accumulation: each backward's gradients are new
        F.grid_sample(x, g, "bicubic", "border").backward(dp.Tensor.zeros(ctx, (2, 3, 4, 7)))
    assert_repeats_build_nothing(ctx, step)


def test_bad_arguments(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 5, 6)))
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 7, 2)))
    with pytest.raises(dp.UnsupportedError, match="mode must be"):
        F.grid_sample(x, g, "area")
    with pytest.raises(dp.UnsupportedError, match="padding_mode"):
        F.grid_sample(x, g, padding_mode="circular")
    with pytest.raises(dp.ShapeError, match="grid of shape"):
        F.grid_sample(x, dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 7, 3))))
    with pytest.raises(dp.ShapeError, match="grid of shape"):
        F.grid_sample(x, dp.Tensor.from_numpy(ctx, random(rng, (1, 4, 7, 2))))
    with pytest.raises(dp.ShapeError, match="input must be"):
        F.grid_sample(dp.Tensor.from_numpy(ctx, random(rng, (3, 5, 6))), g)
    with pytest.raises(dp.ShapeError, match="bicubic"):
        F.grid_sample(dp.Tensor.from_numpy(ctx, random(rng, (1, 1, 2, 2, 2))),
                      dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 2, 2, 3))), "bicubic")
    with pytest.raises(dp.ShapeError, match="empty"):
        F.grid_sample(dp.Tensor.from_numpy(ctx, np.zeros((2, 3, 0, 6), np.float32)), g)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.grid_sample(x, dp.Tensor.from_numpy(ctx, np.zeros((2, 4, 7, 2), np.int32)))


@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 1, 5), (3, 2, 4, 3, 5)])
@pytest.mark.parametrize("align", [False, True])
def test_affine_grid(ctx, rng, size, align):
    """The grid and theta's gradient, 2-D and 3-D, a unit-size axis; then sampled by
    grid_sample as a spatial transformer does, gradient to theta through both."""
    dims = len(size) - 2
    th = random(rng, (size[0], dims, dims + 1))
    ours = dp.Tensor.from_numpy(ctx, th, requires_grad=True)
    theirs = torch.tensor(th.astype(np.float64), requires_grad=True)
    out = F.affine_grid(ours, size, align)
    with pytest.warns(UserWarning) if align and 1 in size[2:] else _no_warning():
        ref = TF.affine_grid(theirs, size, align)
    assert_close(out.numpy(), ref.detach().numpy())
    x = random(rng, size)
    sampled = F.grid_sample(dp.Tensor.from_numpy(ctx, x), out, align_corners=align)
    ref_sampled = TF.grid_sample(torch.tensor(x.astype(np.float64)), ref, align_corners=align)
    g = random(rng, sampled.shape)
    sampled.backward(dp.Tensor.from_numpy(ctx, g))
    ref_sampled.backward(torch.tensor(g.astype(np.float64)))
    assert_close(ours.grad.numpy(), theirs.grad.numpy())


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_affine_grid_bad_arguments(ctx, rng):
    th = dp.Tensor.from_numpy(ctx, random(rng, (2, 2, 3)))
    with pytest.raises(dp.ShapeError, match="theta of shape"):
        F.affine_grid(th, (2, 3, 4, 5, 6))
    with pytest.raises(dp.ShapeError, match="theta of shape"):
        F.affine_grid(th, (3, 3, 4, 5))
    with pytest.raises(dp.ShapeError, match="size must be"):
        F.affine_grid(th, (2, 3, 4))
    with pytest.raises(dp.ShapeError, match="positive"):
        F.affine_grid(th, (2, 3, 0, 5))
