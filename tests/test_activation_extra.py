"""The activations with run-time parameters (mish, selu, celu, logsigmoid, softsign, softshrink,
hardshrink, tanhshrink, threshold, rrelu in evaluation), glu, softmin and prelu against torch
CPU float64: values and gradients on seeded data, outputs from a NaN-poisoned pool, bad
arguments, and repeated calls that build nothing."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py.bench.ops import poison_pool

from conftest import assert_close, assert_repeats_build_nothing, random

F = dp.functional


def check(ctx, rng, ours, theirs, arrays, grads=None):
    """Run ``ours`` on float32 tensors and ``theirs`` on float64 copies; compare the outputs
    (the pool poisoned with NaN first) and the gradients of the inputs in ``grads``."""
    grads = range(len(arrays)) if grads is None else grads
    xs = [dp.Tensor.from_numpy(ctx, a, requires_grad=k in grads) for k, a in enumerate(arrays)]
    ts = [torch.tensor(a.astype(np.float64), requires_grad=k in grads)
          for k, a in enumerate(arrays)]
    ref = theirs(*ts)
    poison_pool(ctx, 4 * max(ref.numel(), max(a.size for a in arrays)))
    out = ours(*xs)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    if not grads:
        return
    g = random(rng, out.shape)
    poison_pool(ctx, 4 * max(a.size for a in arrays))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    ref.backward(torch.tensor(g.astype(np.float64)))
    for k in grads:
        assert_close(xs[k].grad.numpy(), ts[k].grad.numpy())


UNARY = [
    ("mish", {}), ("selu", {}), ("celu", {"alpha": 0.7}), ("logsigmoid", {}),
    ("softsign", {}), ("softshrink", {"lambd": 0.25}), ("hardshrink", {"lambd": 0.375}),
    ("tanhshrink", {}), ("threshold", {"threshold": 0.25, "value": -0.5}),
    ("rrelu", {"lower": 0.1, "upper": 0.3, "training": False}),
]


@pytest.mark.parametrize("name,kwargs", UNARY, ids=[n for n, _ in UNARY])
def test_unary_activation(ctx, rng, name, kwargs):
    a = random(rng, (3, 5, 7), -3, 3)
    # Values at the branch points too (torch's choice of side there; the parameters are exact
    # in float32).
    a.flat[:4] = [0.0, kwargs.get("lambd", 0.5), -kwargs.get("lambd", 0.5),
                  kwargs.get("threshold", 1.0)]
    check(ctx, rng, lambda x: getattr(F, name)(x, **kwargs),
          lambda x: getattr(TF, name)(x, **kwargs), [a])


def test_large_and_small_inputs_stay_finite(ctx):
    a = np.array([-80.0, -30.0, -5.0, 0.0, 5.0, 30.0, 80.0], np.float32)
    for name in ("mish", "selu", "logsigmoid", "softsign", "tanhshrink"):
        out = getattr(F, name)(dp.Tensor.from_numpy(ctx, a)).numpy()
        ref = getattr(TF, name)(torch.tensor(a, dtype=torch.float64)).numpy()
        assert_close(out, ref)


def test_inplace(ctx, rng):
    a = random(rng, (4, 6), -2, 2)
    x = dp.Tensor.from_numpy(ctx, a)
    assert F.celu(x, 1.5, inplace=True) is x
    assert_close(x.numpy(), TF.celu(torch.tensor(a, dtype=torch.float64), 1.5).numpy())
    with pytest.raises(dp.UnsupportedError, match="inplace"):
        F.mish(dp.Tensor.from_numpy(ctx, a, requires_grad=True), inplace=True)


@pytest.mark.parametrize("shape,dim", [((4, 6), -1), ((3, 8, 5), 1), ((6, 2), 0), ((10,), 0)])
def test_glu(ctx, rng, shape, dim):
    check(ctx, rng, lambda x: F.glu(x, dim), lambda x: TF.glu(x, dim), [random(rng, shape, -2, 2)])


@pytest.mark.filterwarnings("ignore:Implicit dimension")
@pytest.mark.parametrize("shape,dim", [((4, 6), 1), ((3, 4, 5), None), ((7,), 0)])
def test_softmin(ctx, rng, shape, dim):
    check(ctx, rng, lambda x: F.softmin(x, dim), lambda x: TF.softmin(x, dim),
          [random(rng, shape, -2, 2)])


@pytest.mark.parametrize("shape,channels", [((4, 3, 5), 3), ((4, 3, 5), 1), ((6, 4), 4),
                                            ((5,), 1), ((), 1), ((2, 3, 2, 2), 3)])
def test_prelu(ctx, rng, shape, channels):
    check(ctx, rng, F.prelu, TF.prelu, [random(rng, shape, -2, 2),
                                        random(rng, (channels,), 0.1, 0.5)])


def test_bad_arguments(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    with pytest.raises(dp.ShapeError, match="even"):
        F.glu(x, 1)
    with pytest.raises(dp.ShapeError, match="dim"):
        F.glu(x, 2)
    with pytest.raises(dp.ShapeError, match="lambd"):
        F.softshrink(x, -1.0)
    with pytest.raises(dp.ShapeError, match="alpha"):
        F.celu(x, 0.0)
    with pytest.raises(dp.DTypeError, match="threshold"):
        F.threshold(x, "a", 1.0)
    with pytest.raises(dp.UnsupportedError, match="training"):
        F.rrelu(x, training=True)
    with pytest.raises(dp.ShapeError, match="one per channel"):
        F.prelu(x, dp.Tensor.from_numpy(ctx, random(rng, (3,))))
    with pytest.raises(dp.ShapeError, match="one per channel"):
        F.prelu(dp.Tensor.from_numpy(ctx, random(rng, (5,))),
                dp.Tensor.from_numpy(ctx, random(rng, (5,))))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.mish(dp.Tensor.from_numpy(ctx, np.ones(3, np.int32)))
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.selu(np.ones(3, np.float32))


def test_modules(ctx, rng):
    a = random(rng, (3, 4, 5), -2, 2)
    x, t = dp.Tensor.from_numpy(ctx, a), torch.tensor(a, dtype=torch.float64)
    pairs = [(dp.nn.Mish(), torch.nn.Mish()), (dp.nn.SELU(), torch.nn.SELU()),
             (dp.nn.CELU(0.5), torch.nn.CELU(0.5)), (dp.nn.LogSigmoid(), torch.nn.LogSigmoid()),
             (dp.nn.Softsign(), torch.nn.Softsign()), (dp.nn.Softshrink(0.2), torch.nn.Softshrink(0.2)),
             (dp.nn.Hardshrink(0.2), torch.nn.Hardshrink(0.2)), (dp.nn.Tanhshrink(), torch.nn.Tanhshrink()),
             (dp.nn.Threshold(0.1, 2.0), torch.nn.Threshold(0.1, 2.0)), (dp.nn.GLU(1), torch.nn.GLU(1)),
             (dp.nn.Softmin(2), torch.nn.Softmin(2)), (dp.nn.RReLU().eval(), torch.nn.RReLU().eval())]
    for ours, theirs in pairs:
        assert_close(ours(x).numpy(), theirs(t).numpy())
    prelu = dp.nn.PReLU(4, init=0.3, ctx=ctx)
    assert_close(prelu(x).numpy(), torch.nn.PReLU(4, init=0.3).double()(t).detach().numpy())
    assert sorted(name for name, _ in prelu.named_parameters()) == ["weight"]


def test_repeated_calls_build_nothing(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (4, 6)), requires_grad=True)
    w = dp.Tensor.from_numpy(ctx, random(rng, (6,)), requires_grad=True)

    def run():
        ys = [F.mish(x), F.selu(x), F.celu(x, 0.5), F.logsigmoid(x), F.softsign(x),
              F.softshrink(x), F.hardshrink(x), F.tanhshrink(x), F.threshold(x, 0.1, 0.0),
              F.rrelu(x), F.glu(x, 1), F.softmin(x, 1), F.prelu(x.reshape(4, 6, 1), w)]
        for y in ys:
            y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        x.grad = w.grad = None

    assert_repeats_build_nothing(ctx, run)
