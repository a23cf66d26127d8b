"""NaN and infinity, and very large logits, against torch CPU: torch's result is the
specification. NaN and +-inf land where torch's do (with the sign of an infinity), finite values
agree within the usual tolerance; large logits keep torch float32's accuracy (~1e-7 relative)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import fusion

from conftest import assert_close, poisoned, random

F = dp.functional
NAN, INF = float("nan"), float("inf")
SPECIALS = [NAN, INF, -INF]
SPECIAL_IDS = ["nan", "+inf", "-inf"]
SOFTMAX_VARIANTS = [("row", None), ("row", 0), ("column", None)]
SOFTMAX_IDS = ["row-registers", "row-streaming", "column"]


def check(out, ref, tol=None):
    """NaN and +-inf exactly where ``ref`` has them, the finite values within ``tol``."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert np.array_equal(np.isnan(out), np.isnan(ref)), \
        f"NaN at {np.argwhere(np.isnan(out)).tolist()}, torch at {np.argwhere(np.isnan(ref)).tolist()}"
    inf = np.isinf(ref)
    assert np.array_equal(np.isinf(out), inf) and np.array_equal(out[inf], ref[inf]), \
        f"infinities differ: {out[np.isinf(out) | inf]} vs {ref[np.isinf(out) | inf]}"
    finite = np.isfinite(ref)
    if finite.any():
        assert_close(out[finite], ref[finite], tol)


def check_relative(out, ref, tol=1e-6):
    """Every element within ``tol`` of the float64 reference, relative to max(1, |ref|): the
    accuracy torch float32 has (the error metric, relative to the largest value, would hide a
    log-probability near 0 rounded away next to others of -1e7)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    err = np.abs(out - ref) / np.maximum(1.0, np.abs(ref))
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= tol, f"error {err.max():.3e} at {worst}: {out[worst]} vs {ref[worst]}"


def dev(ctx, a, **kwargs):
    return dp.Tensor.from_numpy(ctx, np.array(a, order="C"), **kwargs)


def t32(a, grad=False):
    return torch.tensor(np.asarray(a), dtype=torch.float32, requires_grad=grad)


# ---- softmax and log_softmax --------------------------------------------------------------

def special_rows(rng, length, value):
    """Rows of ``length``: finite rows, and rows with ``value`` first, in the middle, last, and
    both first and last; then a row of -inf and a row with +inf and -inf."""
    a = random(rng, (8, length), -3, 3)
    a[1, 0] = value
    a[2, length // 2] = value
    a[3, length - 1] = value
    a[5, 0] = a[5, length - 1] = value
    a[6, :] = -INF
    a[7, 0], a[7, -1] = INF, -INF
    return a


def _softmax_case(ctx, rng, a, dim, log, variant, cached):
    x = dev(ctx, a, requires_grad=True)
    ours = F.log_softmax if log else F.softmax
    y = ours(x, dim, variant=variant, cached=cached)
    t = t32(a, grad=True)
    ref = (torch.log_softmax if log else torch.softmax)(t, dim)
    check(y.numpy(), ref.detach().numpy())
    g = random(rng, a.shape)
    y.backward(dev(ctx, g))
    ref.backward(torch.tensor(g))
    check(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("variant, cached", SOFTMAX_VARIANTS, ids=SOFTMAX_IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("length", [5, 7, 8, 33, 1100, 1101, 10000])
def test_softmax_last_dim(ctx, rng, length, value, log, variant, cached):
    """A NaN or +inf anywhere in a row makes the whole row NaN; -inf elements give 0 (-inf);
    a row of -inf is NaN. Rows of a multiple of 4 take the vector loads; rows of 10000 fill
    a 1024-item group on GPUs (on NVIDIA: warp reductions, the next row staged, exp recomputed)."""
    _softmax_case(ctx, rng, special_rows(rng, length, value), -1, log, variant, cached)


@pytest.mark.parametrize("variant, cached", SOFTMAX_VARIANTS, ids=SOFTMAX_IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_other_dims(ctx, rng, dim, value, log, variant, cached):
    a = random(rng, (4, 5, 6), -3, 3)
    a[1, 2, 3] = value
    a[0, 0, 0] = value
    a[3, 4, 5] = value
    _softmax_case(ctx, rng, a, dim, log, variant, cached)


@pytest.mark.parametrize("variant, cached", SOFTMAX_VARIANTS, ids=SOFTMAX_IDS)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("scale", [1e3, 1e6, 1e7, 1e30])
@pytest.mark.parametrize("length", [10, 12, 1100, 10000])
def test_softmax_large_logits(ctx, rng, length, scale, log, variant, cached):
    """Logits near +-scale: rows scale + U(-3, 3) (rounded to float32: equal at 1e30, where
    log_softmax is -log(length)), and rows spread over [-scale, scale], against float64."""
    a = np.concatenate([scale + rng.uniform(-3, 3, (3, length)),
                        -scale + rng.uniform(-3, 3, (2, length)),
                        scale * rng.uniform(-1, 1, (3, length))]).astype(np.float32)
    y = (F.log_softmax if log else F.softmax)(dev(ctx, a), 1, variant=variant, cached=cached)
    ref = (torch.log_softmax if log else torch.softmax)(torch.tensor(a, dtype=torch.float64), 1)
    # The column variant (one item per row) sums a row of 10000 in sequence: that rounding, at
    # any scale, reaches a few 1e-6.
    check_relative(y.numpy(), ref.numpy(), 1e-5 if variant == "column" and length > 1100 else 1e-6)


# ---- layer norm, group norm, batch norm -----------------------------------------------------

@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("at", [0, 7], ids=["first", "inside"])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("algo", ["rows", "rows4"])
def test_layer_norm(ctx, rng, monkeypatch, value, at, affine, algo):
    """A row holding an infinity or NaN is NaN throughout (torch: var = inf - inf)."""
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    a = random(rng, (3, 4, 5), -2, 2)
    a[1].reshape(-1)[at] = value
    w, b = (random(rng, (4, 5), 0.5, 1.5), random(rng, (4, 5))) if affine else (None, None)
    y = F.layer_norm(dev(ctx, a), (4, 5), None if w is None else dev(ctx, w),
                     None if b is None else dev(ctx, b))
    ref = TF.layer_norm(t32(a), (4, 5), None if w is None else t32(w), None if b is None else t32(b))
    check(y.numpy(), ref.numpy())


@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("algo", ["rows", "split"])
def test_group_norm(ctx, rng, monkeypatch, value, algo):
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    a = random(rng, (2, 4, 3, 5), -2, 2)
    a[0, 1, 2, 3] = value          # group 0 of sample 0
    a[1, 3, 0, 0] = value          # group 1 of sample 1, its first element
    w, b = random(rng, (4,), 0.5, 1.5), random(rng, (4,))
    y = F.group_norm(dev(ctx, a), 2, dev(ctx, w), dev(ctx, b))
    ref = TF.group_norm(t32(a), 2, t32(w), t32(b))
    check(y.numpy(), ref.numpy())


@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("shape, algo", [((3, 4, 5), "groups"), ((3, 4, 8), "groups"),
                                         ((3, 4, 8), "groups_scalar"), ((6, 40), "columns")])
def test_batch_norm_training(ctx, rng, monkeypatch, value, shape, algo):
    """The output, and the running statistics: a NaN (or the inf - inf of an infinity) in a
    channel makes its running variance NaN, as in torch."""
    monkeypatch.setenv("DLPRIM_NORM_ALGO", algo)
    dp.config.reload()
    a = random(rng, shape, -2, 2)
    a[(1, 2) + (3,) * (len(shape) - 2)] = value
    a[(0, 3) + (0,) * (len(shape) - 2)] = value      # the channel's first element
    C = shape[1]
    w, b = random(rng, (C,), 0.5, 1.5), random(rng, (C,))
    rm, rv = random(rng, (C,)), random(rng, (C,), 0.5, 1.5)
    rm_d, rv_d = dev(ctx, rm), dev(ctx, rv)
    rm_t, rv_t = t32(rm), t32(rv)
    y = F.batch_norm(dev(ctx, a), rm_d, rv_d, dev(ctx, w), dev(ctx, b), training=True,
                     momentum=0.2)
    ref = TF.batch_norm(t32(a), rm_t, rv_t, t32(w), t32(b), training=True, momentum=0.2)
    check(y.numpy(), ref.numpy())
    check(rm_d.numpy(), rm_t.numpy())
    check(rv_d.numpy(), rv_t.numpy())


@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("widest", [4, 1])
def test_fused_batch_norm_training(ctx, rng, value, chunks, widest):
    """FusionPlan's training batch norm (one kernel per channel, or channels split in chunks):
    output, saved statistics and running statistics as torch's."""
    shape = (4, 3, 5, 8)
    a = random(rng, shape, -2, 2)
    a[2, 1, 3, 4] = value
    a[0, 2, 0, 0] = value
    param = (1, 3, 1, 1)
    scale, bias = random(rng, param, 0.5, 1.5), random(rng, param)
    rm, rv = random(rng, param), random(rng, param, 0.5, 1.5)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_forward(fusion.BN_SPATIAL, True)
    plan.compile()
    plan.runner.set_chunks(chunks)
    plan.runner.set_vector_width(widest)
    args = fusion.OperatorArgs()
    saved_mean, saved_inv = poisoned(ctx, param), poisoned(ctx, param)
    rm_d, rv_d = dev(ctx, rm), dev(ctx, rv)
    args.set_batchnorm_forward(bn, 1.0, 0.0, dev(ctx, scale), dev(ctx, bias), saved_mean,
                               saved_inv, rm_d, rv_d, 0.2, 1e-5)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, dev(ctx, a), plan.output_desc, y, args)
    rm_t, rv_t = t32(rm.ravel()), t32(rv.ravel())
    ref = TF.batch_norm(t32(a), rm_t, rv_t, t32(scale.ravel()), t32(bias.ravel()), training=True,
                        momentum=0.2, eps=1e-5)
    check(y.numpy(), ref.numpy())
    check(rm_d.numpy().ravel(), rm_t.numpy())
    check(rv_d.numpy().ravel(), rv_t.numpy())
    # torch's saved statistics of the same call (mean, 1 / sqrt(var + eps)).
    _, mean_t, invstd_t = torch.native_batch_norm(t32(a), t32(scale.ravel()), t32(bias.ravel()),
                                                  None, None, True, 0.2, 1e-5)
    check(saved_mean.numpy().ravel(), mean_t.numpy())
    check(saved_inv.numpy().ravel(), invstd_t.numpy())


# ---- cross_entropy and nll_loss ---------------------------------------------------------------

def _loss_inputs(rng, classes, value, spatial=()):
    """Logits (N, C, *spatial) and int64 targets: sample 0 holds ``value`` at a class that is
    not its target, sample 1 at its target, sample 2 at both; samples 3 and 4 stay finite."""
    shape = (5, classes) + spatial
    a = random(rng, shape, -3, 3)
    target = rng.integers(0, classes, (5,) + spatial).astype(np.int64)
    pos = (0,) * len(spatial)
    other = lambda t: (t + 1 + classes // 2) % classes
    a[(0, other(target[(0,) + pos])) + pos] = value
    a[(1, target[(1,) + pos]) + pos] = value
    a[(2, target[(2,) + pos]) + pos] = value
    a[(2, other(target[(2,) + pos])) + pos] = value
    return a, target


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("classes, spatial", [(5, ()), (33, ()), (3000, ()), (7, (3,))])
def test_cross_entropy(ctx, rng, classes, spatial, value, weighted, reduction):
    """A NaN or +inf logit anywhere among a sample's classes makes its loss NaN; a -inf logit
    that is not the target adds nothing (the target's: +inf loss)."""
    a, target = _loss_inputs(rng, classes, value, spatial)
    w = random(rng, (classes,), 0.5, 1.5) if weighted else None
    x = dev(ctx, a, requires_grad=True)
    loss = F.cross_entropy(x, dev(ctx, target), None if w is None else dev(ctx, w),
                           reduction=reduction)
    t = t32(a, grad=True)
    ref = TF.cross_entropy(t, torch.from_numpy(target), None if w is None else t32(w),
                           reduction=reduction)
    check(loss.numpy(), ref.detach().numpy())
    g = random(rng, ref.shape, 0.5, 1.5)
    loss.backward(dev(ctx, g))
    ref.backward(torch.tensor(g))
    check(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("algo", ["group", "item"])
def test_cross_entropy_long_rows(ctx, rng, monkeypatch, algo):
    """3000 classes, the log-sum-exp reduced by a work-group per row or by items over chunks
    whose partial (max, sum) pairs merge after: a chunk of -inf and NaN alone still makes the
    row NaN, a chunk of -inf alone adds nothing."""
    monkeypatch.setenv("DLPRIM_REDUCE_ALGO", algo)
    dp.config.reload()
    a = random(rng, (6, 3000), -3, 3)
    target = np.array([2000, 2500, 2500, 0, 0, 7], np.int64)
    a[0, 5] = NAN
    a[1, :2000] = -INF
    a[1, 100] = NAN
    a[2, :2000] = -INF
    a[3, 2999] = INF
    a[4, 0] = 10.0
    a[5] = 1e7 + rng.uniform(-3, 3, 3000)
    loss = F.cross_entropy(dev(ctx, a), dev(ctx, target), reduction="none")
    ref = TF.cross_entropy(torch.tensor(a, dtype=torch.float64), torch.from_numpy(target),
                           reduction="none").numpy()
    check(loss.numpy(), ref)
    finite = np.isfinite(ref)
    check_relative(loss.numpy()[finite], ref[finite])


def test_cross_entropy_row_of_minus_infinity(ctx, rng):
    """Every logit of a sample -inf: NaN, as torch's log_softmax of the row."""
    a, target = _loss_inputs(rng, 6, -INF)
    a[3, :] = -INF
    loss = F.cross_entropy(dev(ctx, a), dev(ctx, target), reduction="none")
    check(loss.numpy(), TF.cross_entropy(t32(a), torch.from_numpy(target), reduction="none").numpy())


@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
def test_cross_entropy_probability_target(ctx, rng, value):
    a, _ = _loss_inputs(rng, 6, value)
    p = rng.dirichlet(np.ones(6), 5).astype(np.float32)
    loss = F.cross_entropy(dev(ctx, a), dev(ctx, p), reduction="none")
    check(loss.numpy(), TF.cross_entropy(t32(a), t32(p), reduction="none").numpy())


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("value", SPECIALS, ids=SPECIAL_IDS)
def test_nll_loss(ctx, rng, value, reduction):
    """nll_loss gathers: a non-finite log-probability that is not the target changes nothing."""
    a, target = _loss_inputs(rng, 9, value)
    x = dev(ctx, a, requires_grad=True)
    loss = F.nll_loss(x, dev(ctx, target), reduction=reduction)
    t = t32(a, grad=True)
    ref = TF.nll_loss(t, torch.from_numpy(target), reduction=reduction)
    check(loss.numpy(), ref.detach().numpy())
    g = random(rng, ref.shape, 0.5, 1.5)
    loss.backward(dev(ctx, g))
    ref.backward(torch.tensor(g))
    check(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("scale", [1e3, 1e6, 1e7, 1e30])
@pytest.mark.parametrize("classes, spatial", [(10, ()), (1000, ()), (10, (3,))])
def test_cross_entropy_large_logits(ctx, rng, classes, spatial, scale):
    """Logits near +-scale: scale + U(-3, 3) (equal at 1e30: the loss is log(classes)), and
    spread over [-scale, scale]; against float64 on the same float32 logits."""
    n = 8
    a = np.concatenate([scale + rng.uniform(-3, 3, (3, classes) + spatial),
                        -scale + rng.uniform(-3, 3, (2, classes) + spatial),
                        scale * rng.uniform(-1, 1, (3, classes) + spatial)]).astype(np.float32)
    target = rng.integers(0, classes, (n,) + spatial).astype(np.int64)
    target[3] = np.argmax(a[3], axis=0)      # the largest logit: the loss is near 0
    loss = F.cross_entropy(dev(ctx, a), dev(ctx, target), reduction="none")
    ref = TF.cross_entropy(torch.tensor(a, dtype=torch.float64), torch.from_numpy(target),
                           reduction="none")
    check_relative(loss.numpy(), ref.numpy())
    mean = F.cross_entropy(dev(ctx, a), dev(ctx, target))
    check_relative(mean.numpy(), TF.cross_entropy(torch.tensor(a, dtype=torch.float64),
                                                  torch.from_numpy(target)).numpy())


# ---- activations: NaN and infinity, forward and gradient --------------------------------------

ACTIVATIONS = {
    "relu": (F.relu, TF.relu),
    "relu6": (F.relu6, TF.relu6),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda t: TF.leaky_relu(t, 0.2)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 2.0), lambda t: TF.hardtanh(t, -0.5, 2.0)),
    "elu": (lambda x: F.elu(x, 0.7), lambda t: TF.elu(t, 0.7)),
    "hardswish": (F.hardswish, TF.hardswish),
    "hardsigmoid": (F.hardsigmoid, TF.hardsigmoid),
    "abs": (F.abs, torch.abs),
    "sigmoid": (F.sigmoid, torch.sigmoid),
    "tanh": (F.tanh, torch.tanh),
    "softplus": (F.softplus, TF.softplus),
    "silu": (F.silu, TF.silu),
    "gelu": (F.gelu, TF.gelu),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_nan_and_infinity(ctx, name):
    """torch's backward passes the incoming gradient where relu's (relu6's, hardtanh's, elu's,
    hardswish's) input is NaN: its tests are 'x <= bound: 0', false for NaN; leaky_relu's
    'x > 0: 1' gives the slope there."""
    ours, theirs = ACTIVATIONS[name]
    a = np.array([NAN, INF, -INF, 0.0, 1.5, -1.5, 7.0, -7.0], np.float32)
    if name == "gelu":
        # Its derivative at +-inf is inf * exp(-inf) in torch (NaN), which a device's compiler
        # may evaluate otherwise (NVIDIA's OpenCL gives inf at +inf): NaN and finite only.
        a = a[[0, 3, 4, 5, 6, 7]]
    x = dev(ctx, a, requires_grad=True)
    y = ours(x)
    t = t32(a, grad=True)
    ref = theirs(t)
    check(y.numpy(), ref.detach().numpy(), tol=1e-6)
    g = np.linspace(0.5, 2.0, a.size).astype(np.float32)
    y.backward(dev(ctx, g))
    ref.backward(torch.tensor(g))
    check(x.grad.numpy(), t.grad.numpy(), tol=1e-6)
