"""Activations: torch names forward and backward against torch CPU float64; MIOpen's API."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import Activation, ActivationDesc

from conftest import assert_close, poisoned, random

F = dp.functional

# (our call, torch's call): every torch name, with a non-default parameter where it has one.
TORCH_NAMES = {
    "relu": (F.relu, TF.relu),
    "relu6": (F.relu6, TF.relu6),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda t: TF.leaky_relu(t, 0.2)),
    "elu": (lambda x: F.elu(x, 0.7), lambda t: TF.elu(t, 0.7)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 2.0), lambda t: TF.hardtanh(t, -0.5, 2.0)),
    "sigmoid": (F.sigmoid, torch.sigmoid),
    "tanh": (F.tanh, torch.tanh),
    "softplus": (F.softplus, TF.softplus),
    "softplus_beta": (lambda x: F.softplus(x, 2.0, 3.0), lambda t: TF.softplus(t, 2.0, 3.0)),
    "gelu": (F.gelu, TF.gelu),
    "gelu_tanh": (lambda x: F.gelu(x, "tanh"), lambda t: TF.gelu(t, approximate="tanh")),
    "silu": (F.silu, TF.silu),
    "hardswish": (F.hardswish, TF.hardswish),
    "hardsigmoid": (F.hardsigmoid, TF.hardsigmoid),
    "abs": (F.abs, torch.abs),
}


@pytest.mark.parametrize("name", list(TORCH_NAMES))
def test_torch_name_forward_and_gradient(ctx, rng, name):
    ours, theirs = TORCH_NAMES[name]
    # Odd sizes, a range that crosses every kink (hardswish's +-3, relu6's 6, softplus' threshold).
    a = random(rng, (3, 37, 5), -8.0, 8.0)
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = ours(x)
    t = torch.tensor(a.astype(np.float64), requires_grad=True)
    ref = theirs(t)
    assert_close(y.numpy(), ref.detach().numpy())
    g = random(rng, a.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    assert_close(x.grad.numpy(), t.grad.numpy())


def test_one_element_and_offset(ctx):
    base = dp.Tensor.from_numpy(ctx, np.array([5.0, -2.0, 3.0], np.float32))
    x = dp.Tensor(ctx, base.buffer, (1,), offset=4)
    assert F.relu(x).numpy().tolist() == [0.0]
    assert F.abs(x).numpy().tolist() == [2.0]


def test_inplace(ctx, rng):
    a = random(rng, (4, 9))
    x = dp.Tensor.from_numpy(ctx, a)
    assert F.relu(x, inplace=True) is x
    assert np.array_equal(x.numpy(), np.maximum(a, 0))
    leaf = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    with pytest.raises(dp.UnsupportedError, match="inplace"):
        F.relu(leaf, inplace=True)


# ---- MIOpen's modes and scaling ------------------------------------------------------------

def _numpy_mode(mode, x, a, b, g):
    A = Activation
    return {
        A.PASTHRU: lambda: x,
        A.LOGISTIC: lambda: 1 / (1 + np.exp(-x)),
        A.TANH: lambda: b * np.tanh(a * x),
        A.RELU: lambda: np.maximum(x, 0),
        A.SOFTRELU: lambda: np.log1p(np.exp(x)),
        A.ABS: lambda: np.abs(x),
        A.POWER: lambda: (a + b * x) ** g,
        A.CLIPPEDRELU: lambda: np.minimum(np.maximum(x, 0), a),
        A.LEAKYRELU: lambda: np.where(x > 0, x, a * x),
        A.ELU: lambda: np.where(x > 0, x, a * (np.exp(x) - 1)),
    }[mode]()


MIOPEN_MODES = [
    # Where a mode matches a torch name above, the same parameters: the kernels are shared.
    (Activation.PASTHRU, None, None, None),
    (Activation.LOGISTIC, None, None, None),
    (Activation.TANH, 0.5, 2.0, None),
    (Activation.RELU, None, None, None),
    (Activation.SOFTRELU, None, None, None),
    (Activation.ABS, None, None, None),
    (Activation.POWER, 5.0, 0.5, 1.5),      # base stays positive on [-8, 8]
    (Activation.CLIPPEDRELU, 6.0, None, None),
    (Activation.LEAKYRELU, 0.2, None, None),
    (Activation.ELU, 0.7, None, None),
]


@pytest.mark.parametrize("mode, alpha, beta, gamma", MIOPEN_MODES, ids=[m[0].name for m in MIOPEN_MODES])
def test_miopen_mode_forward_and_backward(ctx, rng, mode, alpha, beta, gamma):
    desc = ActivationDesc(mode, alpha, beta, gamma)
    a = random(rng, (5, 23), -8.0, 8.0)
    x = dp.Tensor.from_numpy(ctx, a)
    y = F.activation_forward(desc, x, poisoned(ctx, a.shape))
    x64 = a.astype(np.float64)
    ref = _numpy_mode(mode, x64, desc.alpha, desc.beta, desc.gamma)
    assert_close(y.numpy(), ref)
    # Backward against a central difference of the float64 formula.
    dy = random(rng, a.shape)
    dx = F.activation_backward(desc, y, dp.Tensor.from_numpy(ctx, dy), x, poisoned(ctx, a.shape))
    h = 1e-6
    slope = (_numpy_mode(mode, x64 + h, desc.alpha, desc.beta, desc.gamma)
             - _numpy_mode(mode, x64 - h, desc.alpha, desc.beta, desc.gamma)) / (2 * h)
    assert_close(dx.numpy(), dy * slope, tol=1e-5)


def test_miopen_alpha_beta_scaling(ctx, rng):
    """y = alpha act(x) + beta y and dx = alpha dy act'(x) + beta dx; beta = 0 never reads."""
    desc = ActivationDesc("leakyrelu", alpha=0.1)
    a, y0, dy, dx0 = (random(rng, (7, 11)) for _ in range(4))
    x = dp.Tensor.from_numpy(ctx, a)
    y = dp.Tensor.from_numpy(ctx, y0)
    F.activation_forward(desc, x, y, alpha=2.0, beta=-0.5)
    act = np.where(a > 0, a, 0.1 * a).astype(np.float64)
    assert_close(y.numpy(), 2.0 * act - 0.5 * y0)
    dx = dp.Tensor.from_numpy(ctx, dx0)
    F.activation_backward(desc, y, dp.Tensor.from_numpy(ctx, dy), x, dx, alpha=3.0, beta=0.25)
    assert_close(dx.numpy(), 3.0 * dy * np.where(a > 0, 1.0, 0.1) + 0.25 * dx0)
    fresh = F.activation_forward(desc, x, poisoned(ctx, a.shape), alpha=2.0)
    assert_close(fresh.numpy(), 2.0 * act)


def test_activation_by_descriptor(ctx, rng):
    a = random(rng, (9,))
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    y = F.activation(x, ActivationDesc(Activation.CLIPPEDRELU, alpha=0.5))
    assert_close(y.numpy(), np.clip(a, 0, 0.5))
    y.backward(dp.Tensor.full(ctx, a.shape, 1.0))
    assert_close(x.grad.numpy(), ((a > 0) & (a < 0.5)).astype(np.float64))


def test_bad_input(ctx):
    x = dp.Tensor.zeros(ctx, (3, 4))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.relu(dp.Tensor.zeros(ctx, (3,), np.int32))
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.sigmoid(np.zeros(3, np.float32))
    with pytest.raises(dp.ShapeError, match="shape"):
        F.activation_forward("relu", x, dp.Tensor.empty(ctx, (4, 3)))
    with pytest.raises(dp.ShapeError, match="shape"):
        F.activation_backward("relu", x, x, x, dp.Tensor.empty(ctx, (12,)))
    with pytest.raises(dp.UnsupportedError, match="unknown activation"):
        F.activation(x, "swishy")
    with pytest.raises(dp.UnsupportedError, match="approximate"):
        F.gelu(x, "erf")
    with pytest.raises(dp.ShapeError, match="min_val"):
        F.hardtanh(x, 1.0, -1.0)


@pytest.mark.parametrize("name", ["relu", "relu6", "hardtanh", "hardsigmoid", "hardswish",
                                  "leaky_relu", "elu"])
def test_nan_and_infinity_follow_torch(ctx, name):
    # Clamping activations once returned 0 (or the bound) for NaN through fmin/fmax.
    ours, theirs = TORCH_NAMES[name]
    a = np.array([np.nan, np.inf, -np.inf, 0.0, 2.5, -2.5, 7.0], np.float32)
    y = ours(dp.Tensor.from_numpy(ctx, a)).numpy()
    ref = theirs(torch.from_numpy(a).double()).numpy()
    assert np.array_equal(np.isnan(y), np.isnan(ref)), (y, ref)
    finite = ~np.isnan(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-6)


def test_gelu_tanh_far_left_and_infinities(ctx):
    # 0.5 x (1 + tanh(z)) once cancelled for z << 0: -1.8e-6 at x = -60 where torch gives 0.
    a = np.array([-60.0, -20.0, -8.0, -5.0, 0.5, 50.0, np.inf, -np.inf, np.nan], np.float32)
    x = dp.Tensor.from_numpy(ctx, a[:6], requires_grad=True)
    y = F.gelu(x, "tanh")
    F.sum(y).backward()
    t = torch.from_numpy(a[:6]).double().requires_grad_()
    yt = TF.gelu(t, approximate="tanh")
    yt.sum().backward()
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=2e-6, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=2e-6, atol=1e-12)
    special = F.gelu(dp.Tensor.from_numpy(ctx, a[6:]), "tanh").numpy()
    expected = TF.gelu(torch.from_numpy(a[6:]).double(), approximate="tanh").numpy()
    assert np.array_equal(special, expected, equal_nan=True), (special, expected)


def test_parameters_must_be_numbers(ctx):
    x = dp.Tensor.from_numpy(ctx, np.ones((2, 3), np.float32))
    for call in (lambda: F.leaky_relu(x, "a"), lambda: F.elu(x, "1"), lambda: F.softplus(x, "a"),
                 lambda: F.hardtanh(x, "a", 1.0), lambda: ActivationDesc("power", gamma=[2])):
        with pytest.raises(dp.DTypeError, match="real number"):
            call()
