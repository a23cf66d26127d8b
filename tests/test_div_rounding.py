"""div's rounding modes against torch: values (float32, as torch computes them), broadcasting,
numbers on either side, zero gradients, bad modes."""
import numpy as np
import pytest
import torch

import dlprim_py as dp

from conftest import assert_repeats_build_nothing, random

F = dp.functional


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("shapes", [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((6,), ())])
def test_div_rounding(ctx, rng, mode, shapes):
    a = random(rng, shapes[0], -10, 10)
    b = random(rng, shapes[1], -3, 3)
    b[np.abs(b) < 0.1] = 0.5
    a.flat[0] = 6.0
    if b.size:
        b.flat[0] = -3.0 if b.ndim else b
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    out = F.div(x, y, rounding_mode=mode)
    ref = torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode).numpy()
    if mode is None:
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    else:
        np.testing.assert_array_equal(out.numpy(), ref)
    out.backward(dp.Tensor.full(ctx, out.shape, 1.0))
    if mode is not None:
        assert not x.grad.numpy().any() and not y.grad.numpy().any()
        assert x.grad.shape == a.shape and y.grad.shape == b.shape


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_rounding_with_numbers_and_edges(ctx, mode):
    a = np.array([7.0, -7.0, 0.0, -0.0, 1.0, -1.0, np.inf, 5.5, -5.5, 1e-30], np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    for other in (2.0, -2.0, 0.0):
        ref = torch.div(torch.tensor(a), other, rounding_mode=mode).numpy()
        np.testing.assert_array_equal(F.div(x, other, rounding_mode=mode).numpy(), ref)
        ref = torch.div(other, torch.tensor(a), rounding_mode=mode).numpy()
        np.testing.assert_array_equal(F.div(other, x, rounding_mode=mode).numpy(), ref)
    # The sign of a zero quotient follows torch.
    out = F.div(x, -3.0, rounding_mode=mode).numpy()
    ref = torch.div(torch.tensor(a), -3.0, rounding_mode=mode).numpy()
    finite = ~np.isnan(ref)
    np.testing.assert_array_equal(np.signbit(out[finite]), np.signbit(ref[finite]))


def test_div_bad_mode_and_no_builds(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (3, 4)), requires_grad=True)
    with pytest.raises(dp.UnsupportedError, match="rounding_mode"):
        F.div(x, 2.0, rounding_mode="round")

    def run():
        for mode in (None, "trunc", "floor"):
            F.div(x, x + 2.0, rounding_mode=mode).backward(dp.Tensor.full(ctx, (3, 4), 1.0))
        x.grad = None

    assert_repeats_build_nothing(ctx, run)
