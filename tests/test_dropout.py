"""Dropout: the mask is Philox4x32-10 of (seed, stream, index), bit for bit as in numpy."""
import warnings

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py.ops import dropout as D

from conftest import assert_close, assert_repeats_build_nothing, poisoned, random

F = dp.functional


def test_philox_known_answers():
    """Random123's known-answer vectors for philox4x32-10."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
        ((0xffffffff,) * 4, (0xffffffff, 0xffffffff), (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
        ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
         (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
    ]
    for counter, key, expected in cases:
        assert tuple(int(v) for v in D.philox4x32_10(np.array([counter]), key)[0]) == expected


@pytest.mark.parametrize("shape, p, seed, stream", [((3, 37, 5), 0.5, 1234, 0), ((1,), 0.3, 7, 2),
                                                   ((1001,), 0.9, 2 ** 63 + 5, 2 ** 40 + 1)])
def test_forward_and_backward_match_the_reference_mask(ctx, rng, shape, p, seed, stream):
    a = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = F.dropout(x, p, seed=seed, stream=stream)
    keep = D.reference_mask(a.size, p, seed, stream).reshape(shape)
    expected = np.where(keep, a.astype(np.float64) / (1 - p), 0.0)
    assert_close(y.numpy(), expected, tol=1e-7)
    assert np.array_equal(y.numpy() != 0, keep), "the mask differs from the reference"
    g = random(rng, shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    assert_close(x.grad.numpy(), np.where(keep, g.astype(np.float64) / (1 - p), 0.0), tol=1e-7)


@pytest.mark.parametrize("algorithm", ["vector", "scalar"])
def test_each_variant_writes_every_element_of_the_reference_mask(ctx, rng, algorithm):
    """Both variants on sizes with and without a partial last block, at offsets 0 and 4."""
    data = random(rng, 4103, 0.5, 1.0)
    whole = dp.Tensor.from_numpy(ctx, data)
    for n, at in ((1, 0), (7, 4), (4096, 4), (4099, 0)):
        x = dp.Tensor(ctx, whole.buffer, (n,), offset=whole.offset + 4 * at)
        y = poisoned(ctx, (n,))
        D._apply(ctx, x, y, 0.4, 321, 5, algorithm=algorithm)
        keep = D.reference_mask(n, 0.4, 321, 5)
        assert_close(y.numpy(), np.where(keep, data[at:at + n] / 0.6, 0.0), tol=1e-7)
        assert np.array_equal(y.numpy() != 0, keep)


def test_variant_choice(ctx):
    base = dp.Tensor.zeros(ctx, (16,))
    aligned = dp.Tensor(ctx, base.buffer, (8,), offset=base.offset + 16)
    shifted = dp.Tensor(ctx, base.buffer, (8,), offset=base.offset + 4)
    assert D.choose_algorithm(aligned, base) == "vector"
    assert D.choose_algorithm(shifted, base) == "scalar"
    assert D.choose_algorithm(aligned, base, forced="scalar") == "scalar"
    with pytest.raises(dp.UnsupportedError, match="vector, scalar"):
        D.choose_algorithm(aligned, base, forced="wide")


def test_keep_rate_and_offset_inputs(ctx):
    n = 200_003
    base = dp.Tensor.from_numpy(ctx, np.ones(n + 3, np.float32))
    x = dp.Tensor(ctx, base.buffer, (n,), offset=12)
    y = F.dropout(x, 0.25, seed=99).numpy()
    kept = (y != 0).mean()
    assert abs(kept - 0.75) < 0.005
    assert np.allclose(y[y != 0], 1 / 0.75)
    assert np.array_equal(y != 0, D.reference_mask(n, 0.25, 99))


def test_generator_streams(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (64,), 0.5, 1.0))
    D.manual_seed(5)
    first, second = F.dropout(x).numpy(), F.dropout(x).numpy()
    D.manual_seed(5)
    assert np.array_equal(F.dropout(x).numpy(), first)
    assert not np.array_equal(first, second)
    assert np.array_equal(first != 0, D.reference_mask(64, 0.5, 5, 0))
    assert np.array_equal(second != 0, D.reference_mask(64, 0.5, 5, 1))


def test_identity_cases_and_inplace(ctx, rng):
    a = random(rng, (5, 6))
    x = dp.Tensor.from_numpy(ctx, a)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    assert np.array_equal(F.dropout(x, 1.0, seed=3).numpy(), np.zeros_like(a))
    same = F.dropout(x, 0.5, inplace=True, seed=11)
    assert same is x
    assert np.array_equal(x.numpy() != 0, D.reference_mask(a.size, 0.5, 11).reshape(a.shape))


def test_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (4,))
    with pytest.raises(dp.ShapeError, match="probability"):
        F.dropout(x, 1.5)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.dropout(dp.Tensor.zeros(ctx, (4,), np.int32))
    with pytest.raises(dp.ShapeError, match="seed"):
        F.dropout(x, seed=-1)
    with pytest.raises(dp.ShapeError, match="stream"):
        F.dropout(x, stream=3)
    with pytest.raises(dp.UnsupportedError, match="inplace"):
        F.dropout(dp.Tensor.zeros(ctx, (4,), requires_grad=True), inplace=True)
    with pytest.raises(dp.ShapeError, match="seed"):
        D.manual_seed(2 ** 64)


# ---- channel-wise and alpha dropout ----------------------------------------------------------

def _torch_alpha(x, keep, p):
    """torch's alpha dropout formula (aten _dropout_impl) with a given keep mask, float64."""
    import torch
    alpha = 1.7580993408473766
    a = 1.0 / np.sqrt((alpha * alpha * p + 1) * (1 - p))
    noise = torch.tensor(keep, dtype=torch.float64)
    b = (noise - 1) * (alpha * a) + alpha * a * p
    return x * (noise * a) + b


@pytest.mark.parametrize("name, shape, noise_shape", [
    ("dropout1d", (3, 6, 5), (3, 6, 1)), ("dropout1d", (6, 5), (6, 1)),
    ("dropout2d", (2, 5, 3, 4), (2, 5, 1, 1)), ("dropout2d", (2, 5, 7), (2, 5, 1)),
    ("dropout3d", (2, 3, 2, 3, 2), (2, 3, 1, 1, 1)), ("dropout3d", (4, 2, 3, 2), (4, 1, 1, 1)),
    ("alpha_dropout", (4, 9), (4, 9)), ("feature_alpha_dropout", (3, 4, 5), (3, 4, 1))])
def test_channel_and_alpha_dropout_against_torch_with_the_same_mask(ctx, rng, name, shape,
                                                                      noise_shape):
    import torch
    p, seed, stream = 0.4, 99, 3
    a = random(rng, shape)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    xr = torch.tensor(a, dtype=torch.float64, requires_grad=True)
    y = getattr(F, name)(x, p, training=True, seed=seed, stream=stream)
    keep = D.reference_mask(int(np.prod(noise_shape)), p, seed, stream).reshape(noise_shape)
    if "alpha" in name:
        yr = _torch_alpha(xr, keep, p)
    else:
        yr = xr * torch.tensor(keep / (1 - p))
    assert_close(y.numpy(), yr.detach().numpy())
    g = random(rng, shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yr.backward(torch.tensor(g, dtype=torch.float64))
    assert_close(x.grad.numpy(), xr.grad.numpy())
    # eval is the identity; p == 1 gives zeros (torch); p == 0 the identity
    assert getattr(F, name)(x, p, training=False) is x
    assert getattr(F, name)(x, 0.0, training=True) is x
    with warnings.catch_warnings():   # torch's dropout2d warns about a 3-d input
        warnings.simplefilter("ignore")
        zeros = getattr(torch.nn.functional, name)(xr.detach(), 1.0, training=True)
    assert_close(getattr(F, name)(x, 1.0, training=True).numpy(), zeros.numpy())


def test_channel_and_alpha_dropout_keep_rate_and_bad_input(ctx):
    x = dp.Tensor.full(ctx, (200, 50, 1), 1.0)
    kept = (F.dropout2d(x, 0.25).numpy() != 0).mean()
    assert abs(kept - 0.75) < 0.03
    y = F.alpha_dropout(dp.Tensor.full(ctx, (20000,), 0.5), 0.3, training=True).numpy()
    assert len(np.unique(y.round(5))) == 2
    with pytest.raises(dp.ShapeError, match="dimensions"):
        F.dropout2d(dp.Tensor.full(ctx, (3, 4), 1.0))
    with pytest.raises(dp.ShapeError, match="dimensions"):
        F.dropout1d(dp.Tensor.full(ctx, (3,), 1.0))
    with pytest.raises(dp.ShapeError, match="at least 2"):
        F.feature_alpha_dropout(dp.Tensor.full(ctx, (3,), 1.0), training=True)
    x = dp.Tensor.full(ctx, (3,), 1.0)
    assert F.feature_alpha_dropout(x, 0.5, training=False) is x   # as torch: no rank check
    with pytest.raises(dp.ShapeError, match="probability"):
        F.dropout3d(dp.Tensor.full(ctx, (1, 2, 3, 4), 1.0), 1.5)
    with pytest.raises(dp.DTypeError, match="float32"):
        F.alpha_dropout(dp.Tensor.full(ctx, (3,), 1, dtype=dp.int64))


def test_channel_and_alpha_dropout_repeated_calls_build_nothing(ctx, rng):
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4, 5)))

    def run():
        x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4, 5)), requires_grad=True)
        (F.dropout2d(x, 0.3) + F.feature_alpha_dropout(x, 0.3, True)
         + F.alpha_dropout(x, 0.2, True)).backward(g)

    assert_repeats_build_nothing(ctx, run)
