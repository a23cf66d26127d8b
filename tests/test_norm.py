"""Normalization against torch (float64): batch norm (training with the running-statistics
update, inference, spatial and per-activation, forced reduction splits, a fused activation, a
10^7-element channel), layer norm, group norm, local response norm; forward and gradients."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py.ops import norm
from conftest import assert_close, assert_repeats_build_nothing, poisoned, random

TF = torch.nn.functional


def _t(a, grad=False):
    return torch.tensor(a, dtype=torch.float64, requires_grad=grad)


def _close_or_zero(out, ref, scale=1.0):
    """A gradient that is zero analytically (one element per normalized set) comes back from
    float64 as roundoff: compare absolutely there, against float32 rounding of terms of size
    ``scale`` (a device that contracts g * w - mean(g * w) into one multiply-add leaves one
    rounding of the product, which the data gradient multiplies by 1 / sqrt(eps))."""
    if np.abs(ref).max() < 1e-10:
        assert np.abs(out).max() < max(1e-6, 4 * np.finfo(np.float32).eps * scale)
    else:
        assert_close(out, ref)


def _d(ctx, a, grad=False):
    return None if a is None else dp.Tensor.from_numpy(ctx, a, requires_grad=grad)


@pytest.mark.parametrize("shape,affine", [((4, 3, 5, 7), True), ((2, 5, 33), False),
                                          ((7, 4), True), ((3, 1, 1, 1), True)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(ctx, rng, shape, affine, training):
    C = shape[1]
    x = random(rng, shape, -2, 3)
    w = random(rng, (C,), 0.5, 1.5) if affine else None
    b = random(rng, (C,)) if affine else None
    rm, rv = random(rng, (C,)), random(rng, (C,), 0.5, 2.0)
    dx, dw, db = _d(ctx, x, True), _d(ctx, w, True), _d(ctx, b, True)
    drm, drv = _d(ctx, rm), _d(ctx, rv)
    tx, tw, tb = _t(x, True), (_t(w, True) if affine else None), (_t(b, True) if affine else None)
    trm, trv = _t(rm), _t(rv)
    y = F.batch_norm(dx, drm, drv, dw, db, training=training, momentum=0.3, eps=1e-4)
    ref = TF.batch_norm(tx, trm, trv, tw, tb, training=training, momentum=0.3, eps=1e-4)
    assert_close(y.numpy(), ref.detach().numpy())
    assert_close(drm.numpy(), trm.numpy())
    assert_close(drv.numpy(), trv.numpy())
    grad = random(rng, shape)
    y.backward(dp.Tensor.from_numpy(ctx, grad))
    ref.backward(_t(grad))
    assert_close(dx.grad.numpy(), tx.grad.numpy())
    if affine:
        assert_close(dw.grad.numpy(), tw.grad.numpy())
        assert_close(db.grad.numpy(), tb.grad.numpy())


def test_batch_norm_one_element_inference(ctx, rng):
    x, rm, rv, w, b = (random(rng, (1,)).reshape(1, 1), random(rng, (1,)), random(rng, (1,), 0.5, 2),
                       random(rng, (1,)), random(rng, (1,)))
    dx, dw = _d(ctx, x, True), _d(ctx, w, True)
    tx, tw = _t(x, True), _t(w, True)
    y = F.batch_norm(dx, _d(ctx, rm), _d(ctx, rv), dw, _d(ctx, b))
    ref = TF.batch_norm(tx, _t(rm), _t(rv), tw, _t(b))
    assert_close(y.numpy(), ref.detach().numpy())
    y.backward()
    ref.backward(torch.ones_like(ref))
    assert_close(dx.grad.numpy(), tx.grad.numpy())
    assert_close(dw.grad.numpy(), tw.grad.numpy())


@pytest.mark.parametrize("chunks", [1, 3, 40])
@pytest.mark.parametrize("algo", ["groups", "groups_scalar"])
def test_batch_norm_training_api_forced_chunks(ctx, rng, monkeypatch, chunks, algo):
    """The MIOpen-style calls on poisoned outputs, with the per-channel split forced, with float4
    loads (S % 4 == 0) and with scalar loads forced."""
    monkeypatch.setenv("DLPRIM_NORM_ALGO", algo)
    dp.config.reload()
    shape = (3, 4, 6, 4)
    x, w, b = random(rng, shape, 1, 4), random(rng, (4,)), random(rng, (4,))
    tx, tw, tb = _t(x, True), _t(w, True), _t(b, True)
    y, mean, invstd = poisoned(ctx, shape), poisoned(ctx, (4,)), poisoned(ctx, (4,))
    dx_, dxw, dxb = _d(ctx, x), _d(ctx, w), _d(ctx, b)
    norm.batch_norm_forward_training(dx_, y, dxw, dxb, None, None, mean, invstd, eps=1e-5,
                                     chunks=chunks)
    ref = TF.batch_norm(tx, None, None, tw, tb, training=True, eps=1e-5)
    assert_close(y.numpy(), ref.detach().numpy())
    assert_close(mean.numpy(), x.astype(np.float64).mean(axis=(0, 2, 3)))
    assert_close(invstd.numpy(), 1 / np.sqrt(x.astype(np.float64).var(axis=(0, 2, 3)) + 1e-5))
    grad = random(rng, shape)
    ref.backward(_t(grad))
    gx, gw, gb = poisoned(ctx, shape), poisoned(ctx, (4,)), poisoned(ctx, (4,))
    norm.batch_norm_backward(dx_, _d(ctx, grad), gx, dxw, mean, invstd, gw, gb, chunks=chunks)
    assert_close(gx.numpy(), tx.grad.numpy())
    assert_close(gw.numpy(), tw.grad.numpy())
    assert_close(gb.numpy(), tb.grad.numpy())


@pytest.mark.parametrize("algo", ["groups", "columns"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_per_activation(ctx, rng, monkeypatch, training, algo):
    monkeypatch.setenv("DLPRIM_NORM_ALGO", algo)
    dp.config.reload()
    shape = (5, 3, 2, 4)
    n_act = 3 * 2 * 4
    x, w, b = random(rng, shape), random(rng, (1, 3, 2, 4)), random(rng, (1, 3, 2, 4))
    rm, rv = random(rng, (n_act,)), random(rng, (n_act,), 0.5, 2)
    y = poisoned(ctx, shape)
    drm, drv = _d(ctx, rm), _d(ctx, rv)
    tx = _t(x.reshape(5, n_act), True)
    tw, tb = _t(w.ravel(), True), _t(b.ravel(), True)
    trm, trv = _t(rm), _t(rv)
    ref = TF.batch_norm(tx, trm, trv, tw, tb, training=training, momentum=0.2)
    if training:
        mean, invstd = poisoned(ctx, (n_act,)), poisoned(ctx, (n_act,))
        norm.batch_norm_forward_training(_d(ctx, x), y, _d(ctx, w), _d(ctx, b), drm, drv, mean,
                                         invstd, momentum=0.2, mode="per_activation")
    else:
        norm.batch_norm_forward_inference(_d(ctx, x), y, _d(ctx, w), _d(ctx, b), drm, drv,
                                          mode="per_activation")
        mean = drm
        invstd = dp.Tensor.from_numpy(ctx, (1 / np.sqrt(rv.astype(np.float64) + 1e-5)).astype(np.float32))
    assert_close(y.numpy().reshape(5, n_act), ref.detach().numpy())
    assert_close(drm.numpy(), trm.numpy())
    assert_close(drv.numpy(), trv.numpy())
    grad = random(rng, shape)
    ref.backward(_t(grad.reshape(5, n_act)))
    gx, gw, gb = poisoned(ctx, shape), poisoned(ctx, w.shape), poisoned(ctx, b.shape)
    norm.batch_norm_backward(_d(ctx, x), _d(ctx, grad), gx, _d(ctx, w), mean, invstd, gw, gb,
                             mode="per_activation", training=training)
    assert_close(gx.numpy().reshape(5, n_act), tx.grad.numpy())
    assert_close(gw.numpy().ravel(), tw.grad.numpy())
    assert_close(gb.numpy().ravel(), tb.grad.numpy())


def _poisoned_at(ctx, shape, offset_elements):
    """A NaN-filled output that starts ``offset_elements`` into its buffer."""
    backing = poisoned(ctx, (offset_elements + int(np.prod(shape)),))
    return dp.Tensor(ctx, backing.buffer, shape, offset=offset_elements * 4)


def test_batch_norm_unaligned_offset(ctx, rng):
    """S % 4 == 0 but x and the outputs at odd offsets: the scalar kernels take over."""
    shape = (2, 3, 4, 4)
    x = random(rng, shape)
    backing = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, 3), x.ravel()]))
    dx = dp.Tensor(ctx, backing.buffer, shape, offset=3 * 4)
    y, mean, invstd = _poisoned_at(ctx, shape, 1), _poisoned_at(ctx, (3,), 2), poisoned(ctx, (3,))
    norm.batch_norm_forward_training(dx, y, None, None, None, None, mean, invstd)
    tx = _t(x, True)
    ref = TF.batch_norm(tx, None, None, training=True)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, shape)
    ref.backward(_t(grad))
    gx = _poisoned_at(ctx, shape, 5)
    norm.batch_norm_backward(dx, _d(ctx, grad), gx, None, mean, invstd)
    assert_close(gx.numpy(), tx.grad.numpy())


def test_batch_norm_fused_activation(ctx, rng):
    shape = (2, 3, 4, 5)
    x, w, b = random(rng, shape), random(rng, (3,)), random(rng, (3,))
    rm, rv = random(rng, (3,)), random(rng, (3,), 0.5, 2)
    y = poisoned(ctx, shape)
    norm.batch_norm_forward_inference(_d(ctx, x), y, _d(ctx, w), _d(ctx, b), _d(ctx, rm),
                                      _d(ctx, rv), activation=dp.ActivationDesc("clippedrelu", alpha=0.5))
    ref = TF.hardtanh(TF.batch_norm(_t(x), _t(rm), _t(rv), _t(w), _t(b)), 0, 0.5)
    assert_close(y.numpy(), ref.numpy())


def test_batch_norm_large_channel(ctx, rng):
    """Two channels of 5 * 10^6 elements each, with a mean far from zero."""
    shape = (5, 2, 1000, 1000)
    x = (100.0 + rng.standard_normal(shape) * np.array([1.0, 0.01]).reshape(1, 2, 1, 1)).astype(np.float32)
    y, mean, invstd = dp.Tensor.empty(ctx, shape), poisoned(ctx, (2,)), poisoned(ctx, (2,))
    norm.batch_norm_forward_training(_d(ctx, x), y, None, None, None, None, mean, invstd)
    x64 = x.astype(np.float64)
    assert_close(mean.numpy(), x64.mean(axis=(0, 2, 3)), tol=1e-7)
    assert_close(invstd.numpy(), 1 / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5), tol=1e-5)
    ref = (x64 - x64.mean(axis=(0, 2, 3), keepdims=True)) / np.sqrt(x64.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    assert_close(y.numpy(), ref, tol=2e-5)


@pytest.mark.parametrize("shape,normalized,affine", [((3, 5, 7), (5, 7), True), ((4, 9), (9,), False),
                                                     ((2, 3, 300), (300,), True), ((5, 1), (1,), True),
                                                     ((1,), (1,), False)])
def test_layer_norm(ctx, rng, shape, normalized, affine):
    (dx, dw, db), (tx, tw, tb), w, grad = _layer_norm_both(ctx, rng, shape, normalized, affine)
    # The data gradient's terms: grad * w, times 1 / sqrt(eps) for a zero variance.
    terms = np.abs(grad * (w if affine else 1.0)).max() / np.sqrt(1e-5)
    _close_or_zero(dx.grad.numpy(), tx.grad.numpy(), max(1.0, terms))
    if affine:
        _close_or_zero(dw.grad.numpy(), tw.grad.numpy())
        assert_close(db.grad.numpy(), tb.grad.numpy())


def _layer_norm_both(ctx, rng, shape, normalized, affine):
    """layer_norm of random data here and in torch (float64), the outputs compared, then both
    backwards from one random gradient: ((x, weight, bias) ours, the same torch's, the weight
    array, the gradient array)."""
    x = random(rng, shape, -1, 2)
    w = random(rng, normalized, 0.5, 1.5) if affine else None
    b = random(rng, normalized) if affine else None
    dx, dw, db = _d(ctx, x, True), _d(ctx, w, True), _d(ctx, b, True)
    tx = _t(x, True)
    tw, tb = (_t(w, True), _t(b, True)) if affine else (None, None)
    y = F.layer_norm(dx, normalized, dw, db, eps=1e-5)
    ref = TF.layer_norm(tx, normalized, tw, tb, eps=1e-5)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, shape)
    y.backward(_d(ctx, grad))
    ref.backward(_t(grad))
    return (dx, dw, db), (tx, tw, tb), w, grad


@pytest.mark.parametrize("shape,normalized,affine", [
    ((3, 5, 8), (5, 8), True),      # 40 elements: 10 float4s over a group of 32 (one each, some idle)
    ((7, 768), (768,), True),       # 192 float4s: a group of 64, 3 each
    ((2, 3, 516), (516,), False),   # 129 float4s: a group of 64, the last float4 of 3 alone
    ((4, 2052), (2052,), True),     # 513 float4s: a group of 256, 3 each, most idle at the end
    ((3, 4), (4,), True)])
def test_layer_norm_rows4(ctx, rng, monkeypatch, shape, normalized, affine):
    """The float4 row solver forced: forward, data and affine gradients against float64, the
    output poisoned first (through a warm-up call on other data whose results it would keep)."""
    from dlprim_py.ops import norm as norm_ops
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "rows4")
    dp.config.reload()
    D = int(np.prod(normalized))
    assert norm_ops.row_algorithm(ctx, int(np.prod(shape)) // D, D, False, True).name == "rows4"
    F.layer_norm(_d(ctx, np.full(shape, np.nan, np.float32)), normalized)   # poison the pool
    (dx, dw, db), (tx, tw, tb), _, _ = _layer_norm_both(ctx, rng, shape, normalized, affine)
    assert_close(dx.grad.numpy(), tx.grad.numpy())
    if affine:
        assert_close(dw.grad.numpy(), tw.grad.numpy())
        assert_close(db.grad.numpy(), tb.grad.numpy())


def test_layer_norm_rows4_alignment(ctx, rng, monkeypatch):
    """rows4 takes rows of a multiple of 4 on 16-byte boundaries only: an input at an odd
    offset or a row of 6 is refused when forced and served by "rows" otherwise; a gradient at
    an odd offset runs the rows kernels inside rows4's backward."""
    from dlprim_py.ops import norm as norm_ops
    data = random(rng, (1 + 3 * 8,), -1, 2)
    backing = dp.Tensor.from_numpy(ctx, data)
    odd = dp.Tensor(ctx, backing.buffer, (3, 8), np.float32, offset=4)
    assert norm_ops.row_algorithm(ctx, 3, 8, False, True).name in ("rows", "rows4")
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "rows4")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="rows4 does not apply"):
        F.layer_norm(odd, (8,))
    with pytest.raises(dp.UnsupportedError, match="rows4 does not apply"):
        F.layer_norm(_d(ctx, random(rng, (3, 6))), (6,))
    monkeypatch.delenv("DLPRIM_ROWNORM_ALGO")
    dp.config.reload()
    ref = TF.layer_norm(_t(data[1:].reshape(3, 8)), (8,))
    assert_close(F.layer_norm(odd, (8,)).numpy(), ref.numpy())
    # rows4 forward, a gradient at an odd offset through the rows kernels.
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "rows4")
    dp.config.reload()
    x = random(rng, (5, 12), -1, 2)
    dx = _d(ctx, x, True)
    tx = _t(x, True)
    y = F.layer_norm(dx, (12,))
    ref = TF.layer_norm(tx, (12,))
    g = random(rng, (1 + 60,))
    g_backing = dp.Tensor.from_numpy(ctx, g)
    y.backward(dp.Tensor(ctx, g_backing.buffer, (5, 12), np.float32, offset=4))
    ref.backward(_t(g[1:].reshape(5, 12)))
    assert_close(dx.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("algo", ["rows", "split"])
@pytest.mark.parametrize("shape,groups,affine", [((2, 6, 5, 3), 3, True), ((3, 6), 2, True),
                                                 ((2, 4, 7), 1, False), ((1, 5, 2, 2), 5, True),
                                                 ((2, 8, 300), 2, True)])
def test_group_norm(ctx, rng, monkeypatch, shape, groups, affine, algo):
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    C = shape[1]
    x = random(rng, shape, -1, 2)
    w = random(rng, (C,), 0.5, 1.5) if affine else None
    b = random(rng, (C,)) if affine else None
    dx, dw, db = _d(ctx, x, True), _d(ctx, w, True), _d(ctx, b, True)
    tx = _t(x, True)
    tw, tb = (_t(w, True), _t(b, True)) if affine else (None, None)
    y = F.group_norm(dx, groups, dw, db)
    ref = TF.group_norm(tx, groups, tw, tb)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, shape)
    y.backward(_d(ctx, grad))
    ref.backward(_t(grad))
    assert_close(dx.grad.numpy(), tx.grad.numpy())
    if affine:
        assert_close(dw.grad.numpy(), tw.grad.numpy())
        assert_close(db.grad.numpy(), tb.grad.numpy())


def _at(ctx, array, offset, grad=False):
    """A float32 tensor of ``array`` that starts ``offset`` elements into its buffer (what a
    view of a larger tensor gives the kernels), the elements before it random."""
    head = np.linspace(-1.0, 1.0, offset, dtype=np.float32)
    backing = dp.Tensor.from_numpy(ctx, np.concatenate([head, array.ravel()]))
    return dp.Tensor(ctx, backing.buffer, array.shape, np.float32, offset=4 * offset,
                     requires_grad=grad)


def _poison_rms(ctx, shape, normalized):
    """rms_norm forward and backward on NaN data, its outputs and gradients freed to the pool
    that the next call of that shape draws its own from: an element it does not write fails."""
    nan = np.full(shape, np.nan, np.float32)
    x = _d(ctx, nan, True)
    w = _d(ctx, np.full(normalized, np.nan, np.float32), True)
    F.rms_norm(x, normalized, w).backward(_d(ctx, nan))
    ctx.synchronize()


# (shape, normalized_shape, x's offset, the weight's offset, the gradient's offset), offsets
# in elements: "rows4" takes rows of a multiple of 4 with x and the weight on 4-element
# boundaries; a misaligned gradient runs the rows kernels inside its backward.
RMS_ROW_CASES = [((3, 5, 8), (5, 8), 0, 0, 0),       # 40 elements: 10 float4s over 32 items
                 ((7, 768), (768,), 0, 0, 0),        # a group of 64, 3 float4s each
                 ((2, 3, 516), (516,), 4, 8, 0),     # aligned views; 129 float4s
                 ((4, 2052), (2052,), 0, 0, 0),      # 513 float4s: a group of 256
                 ((3, 4), (4,), 0, 0, 0),
                 ((5, 12), (12,), 0, 0, 3),          # the gradient misaligned
                 ((4, 64), (64,), 1, 0, 0),          # the input misaligned
                 ((4, 64), (64,), 0, 2, 0),          # the weight misaligned
                 ((5, 7), (7,), 0, 0, 0),            # rows of 7
                 ((2, 3, 37), (37,), 3, 1, 5),       # rows of 37, every operand misaligned
                 ((1, 300), (300,), 0, 0, 0)]        # one row


@pytest.mark.parametrize("algo", ["rows", "rows4", None], ids=["rows", "rows4", "ruled"])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape,normalized,x_off,w_off,g_off", RMS_ROW_CASES,
                         ids=[f"{c[0]}-{c[2]}-{c[3]}-{c[4]}" for c in RMS_ROW_CASES])
def test_rms_norm_rows(ctx, rng, monkeypatch, algo, affine, shape, normalized, x_off, w_off,
                       g_off):
    """rms_norm on the row kernels' uncentred variant, each algorithm forced and as ruled:
    forward, data and weight gradients against float64 on poisoned outputs; "rows4" forced on
    rows it cannot take (a length or an offset not a multiple of 4) is refused."""
    D = int(np.prod(normalized))
    rows = int(np.prod(shape)) // D
    aligned = D % 4 == 0 and x_off % 4 == 0 and (not affine or w_off % 4 == 0)
    if algo:
        monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
        dp.config.reload()
    x = random(rng, shape, -1, 2)      # the mean away from 0: centring would show
    w = random(rng, normalized, 0.5, 1.5) if affine else None
    grad = random(rng, shape)
    dx = _at(ctx, x, x_off, True)
    dw = _at(ctx, w, w_off, True) if affine else None
    if algo == "rows4" and not aligned:
        with pytest.raises(dp.UnsupportedError, match="rows4 does not apply"):
            F.rms_norm(dx, normalized, dw)
        return
    chosen = norm.row_algorithm(ctx, rows, D, False, aligned, rms=True).name
    assert chosen == (algo or chosen) and (aligned or chosen == "rows")
    _poison_rms(ctx, shape, normalized)
    eps = 1e-5 if affine else None          # None: float32's machine epsilon, as torch's
    tx = _t(x, True)
    tw = _t(w, True) if affine else None
    y = F.rms_norm(dx, normalized, dw, eps=eps)
    ref = TF.rms_norm(tx, normalized, tw, eps=eps or float(np.finfo(np.float32).eps))
    assert_close(y.numpy(), ref.detach().numpy())
    y.backward(_at(ctx, grad, g_off))
    ref.backward(_t(grad))
    assert_close(dx.grad.numpy(), tx.grad.numpy())
    if affine:
        assert dw.grad.dtype == np.float32
        assert_close(dw.grad.numpy(), tw.grad.numpy())


@pytest.mark.parametrize("algo", ["rows", "rows4"])
def test_rms_norm_non_finite(ctx, rng, monkeypatch, algo):
    """Rows holding an infinity or a NaN give torch's values (x * rsqrt(inf): 0 for the finite
    elements, NaN for the infinite one; NaN everywhere in a row with a NaN), the other rows
    theirs."""
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    x = random(rng, (4, 8), -1, 2)
    x[0, 3], x[1, 0], x[2, 7] = np.inf, np.nan, -np.inf
    y = F.rms_norm(_d(ctx, x), (8,))
    ref = TF.rms_norm(_t(x), (8,), eps=float(np.finfo(np.float32).eps)).numpy()
    assert np.array_equal(np.isnan(y.numpy()), np.isnan(ref))
    assert_close(y.numpy(), ref)


def test_rms_norm_split_does_not_apply(ctx, rng, monkeypatch):
    """"split" is group norm's (the batch-norm kernels' centred sums): forced, rms_norm refuses
    it as layer_norm does."""
    x = _d(ctx, random(rng, (6, 4096)))
    assert norm.row_algorithm(ctx, 6, 4096, False, True, rms=True).name in ("rows", "rows4")
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "split")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_ROWNORM_ALGO=split does not apply"):
        F.rms_norm(x, (4096,))
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_ROWNORM_ALGO=split does not apply"):
        F.layer_norm(x, (4096,))


def test_rms_norm_rules_name_rms(ctx, rng, tuning_rules):
    """The rules see rms_norm's rows as feature "rms": a rule for it alone sends rms_norm to
    "rows" while layer_norm of the same rows keeps "rows4", and both stay torch's."""
    tuning_rules("rownorm", [{"when": {"rms": 1, "d": 44}, "params": {"solver": "rows"}}])
    assert norm.row_algorithm(ctx, 6, 44, False, True, rms=True).name == "rows"
    assert norm.row_algorithm(ctx, 6, 44, False, True).name == "rows4"
    x = random(rng, (6, 44), -1, 2)
    w = random(rng, (44,), 0.5, 1.5)
    assert_close(F.rms_norm(_d(ctx, x), (44,), _d(ctx, w)).numpy(),
                 TF.rms_norm(_t(x), (44,), _t(w), eps=float(np.finfo(np.float32).eps)).numpy())
    assert_close(F.layer_norm(_d(ctx, x), (44,), _d(ctx, w)).numpy(),
                 TF.layer_norm(_t(x), (44,), _t(w)).numpy())


@pytest.mark.parametrize("algo", ["rows", "rows4"])
def test_rms_norm_repeated_calls_build_nothing(ctx, rng, monkeypatch, algo):
    """After a first call (which builds), rms_norm forward and backward with each algorithm
    forced render, build and create nothing, with and without a weight."""
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", algo)
    dp.config.reload()
    x = _d(ctx, random(rng, (5, 2, 24)), True)
    w = _d(ctx, random(rng, (2, 24)), True)

    def run():
        for weight in (w, None):
            y = F.rms_norm(x, (2, 24), weight)
            y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        x.grad = w.grad = None

    assert_repeats_build_nothing(ctx, run)


def test_repeated_calls_switch_optional_operands(ctx, rng):
    """A kernel keeps its arguments between calls: an affine call, a plain one (NULL weight and
    bias), then the affine one again on other data must each match the reference."""
    shape = (6, 40)
    w, b = random(rng, (40,)), random(rng, (40,))
    tw, tb = dp.Tensor.from_numpy(ctx, w), dp.Tensor.from_numpy(ctx, b)
    for affine in (True, False, True, False):
        x = random(rng, shape)
        got = F.layer_norm(dp.Tensor.from_numpy(ctx, x), (40,), tw if affine else None,
                           tb if affine else None).numpy()
        ref = torch.nn.functional.layer_norm(
            torch.tensor(x, dtype=torch.float64), (40,),
            torch.tensor(w, dtype=torch.float64) if affine else None,
            torch.tensor(b, dtype=torch.float64) if affine else None)
        assert_close(got, ref.numpy())


@pytest.mark.parametrize("shape,size,params", [((2, 7, 3, 4), 3, {}), ((2, 7, 3, 4), 4, dict(alpha=0.1, beta=0.5, k=2.0)),
                                               ((2, 5, 6), 5, dict(alpha=0.5)), ((1, 1, 1), 2, {})])
def test_local_response_norm(ctx, rng, shape, size, params):
    x = random(rng, shape, -2, 2)
    dx, tx = _d(ctx, x, True), _t(x, True)
    y = F.local_response_norm(dx, size, **params)
    ref = TF.local_response_norm(tx, size, **params)
    assert_close(y.numpy(), ref.detach().numpy())
    grad = random(rng, shape)
    y.backward(_d(ctx, grad))
    ref.backward(_t(grad))
    assert_close(dx.grad.numpy(), tx.grad.numpy())


def test_bad_input(ctx, rng):
    x = _d(ctx, random(rng, (2, 3, 4)))
    c3 = _d(ctx, random(rng, (3,)))
    with pytest.raises(dp.ShapeError, match="3 elements"):
        F.batch_norm(x, _d(ctx, random(rng, (4,))), c3, training=False)
    with pytest.raises(dp.ShapeError, match="needs running_mean"):
        F.batch_norm(x, None, None, training=False)
    with pytest.raises(dp.ShapeError, match="more than one value"):
        F.batch_norm(_d(ctx, random(rng, (1, 3))), None, None, training=True)
    with pytest.raises(dp.UnsupportedError, match="mode"):
        norm.batch_norm_forward_inference(x, dp.Tensor.empty(ctx, x.shape), None, None, c3, c3,
                                          mode="channels")
    with pytest.raises(dp.ShapeError, match="x's shape"):
        norm.batch_norm_forward_training(x, dp.Tensor.empty(ctx, (2, 3)))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.batch_norm(_d(ctx, np.ones((2, 3), np.int32)), c3, c3)
    with pytest.raises(dp.UnsupportedError, match="algorithm"):
        norm.channel_partial_sums(ctx, "stats", 2, 3, 4, x, algorithm="rows")
    with pytest.raises(dp.ShapeError, match="trailing"):
        F.layer_norm(x, (3,))
    with pytest.raises(dp.ShapeError, match="weight must have shape"):
        F.layer_norm(x, (4,), c3)
    with pytest.raises(dp.ShapeError, match="groups"):
        F.group_norm(x, 2)
    with pytest.raises(dp.ShapeError, match="3-d"):
        F.local_response_norm(_d(ctx, random(rng, (2, 3))), 2)


def test_command_log(ctx, rng, monkeypatch, capsys):
    """DLPRIM_LOG_CMD=1 prints the dlprim-driver bnorm command that reproduces the call."""
    monkeypatch.setenv("DLPRIM_LOG_CMD", "1")
    dp.config.reload()
    x = _d(ctx, random(rng, (2, 3, 5)))
    stats = _d(ctx, random(rng, (3,), 0.5, 1.5))
    norm.batch_norm_forward_training(x, dp.Tensor.empty(ctx, x.shape), running_mean=stats,
                                     running_var=stats, activation="relu")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("DLPRIM_LOG_CMD")]
    assert lines == ["DLPRIM_LOG_CMD: dlprim-driver bnorm -n 2 -c 3 -H 5 -W 1 -m 1 -F 1 -b 0 -s 0 "
                     "-r 1 --activation relu -t 1"]


def test_batch_norm_scalar_arguments_must_be_numbers(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4)))
    for kwargs in ({"momentum": "a"}, {"eps": "1e-5"}):
        with pytest.raises(dp.DTypeError, match="must be a number"):
            F.batch_norm(x, None, None, training=True, **kwargs)


def test_group_norm_refuses_what_torch_refuses(ctx, rng):
    """One sample whose groups each hold one value: torch raises, and so do we (once a result
    of bias alone); two samples of that kind pass in both."""
    with pytest.raises(dp.ShapeError, match="more than one value per group"):
        F.group_norm(dp.Tensor.from_numpy(ctx, random(rng, (1, 3, 1, 1))), 3)
    with pytest.raises(ValueError):
        torch.nn.functional.group_norm(torch.zeros(1, 3, 1, 1), 3)
    x = random(rng, (2, 3, 1, 1))
    assert_close(F.group_norm(dp.Tensor.from_numpy(ctx, x), 3).numpy(),
                 torch.nn.functional.group_norm(torch.from_numpy(x).double(), 3).numpy())


def test_batch_norm_training_long_rows_loop_within_work_groups(ctx, rng, tuning_rules):
    """Where the rows alone fill the device, training batch norm's elementwise steps give each
    row fewer work groups than its length needs, each item looping over more of it: forward
    and backward still match torch on poisoned outputs, running statistics included. (A rule
    asking for one work group per compute unit makes that so on any device.)"""
    tuning_rules("norm", [{"when": {}, "params": {"solver": "groups", "apply_groups_per_unit": 1}}])
    shape = (16, 32, 48, 48)
    N, C, S = shape[0], shape[1], shape[2] * shape[3]
    sums = norm.prepared_sums(ctx, "stats", N, C, S, (None,))
    vector, positions, gsize, lsize = norm.batch_apply_geometry(ctx, sums, N, C, S)
    assert gsize[0] < -(-positions // lsize[0]) * lsize[0], "the geometry did not shorten rows"
    x, w, b = random(rng, shape, 1, 4), random(rng, (C,)), random(rng, (C,))
    rm, rv = random(rng, (C,)), np.abs(random(rng, (C,))) + 0.5
    tx, tw, tb = _t(x, True), _t(w, True), _t(b, True)
    trm, trv = torch.tensor(rm, dtype=torch.float64), torch.tensor(rv, dtype=torch.float64)
    ref = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.3)
    y, mean, invstd = poisoned(ctx, shape), poisoned(ctx, (C,)), poisoned(ctx, (C,))
    drm, drv = _d(ctx, rm), _d(ctx, rv)
    dx_, dxw, dxb = _d(ctx, x), _d(ctx, w), _d(ctx, b)
    norm.batch_norm_forward_training(dx_, y, dxw, dxb, drm, drv, mean, invstd, momentum=0.3)
    assert_close(y.numpy(), ref.detach().numpy())
    assert_close(drm.numpy(), trm.numpy())
    assert_close(drv.numpy(), trv.numpy())
    grad = random(rng, shape)
    ref.backward(_t(grad))
    gx, gw, gb = poisoned(ctx, shape), poisoned(ctx, (C,)), poisoned(ctx, (C,))
    norm.batch_norm_backward(dx_, _d(ctx, grad), gx, dxw, mean, invstd, gw, gb)
    assert_close(gx.numpy(), tx.grad.numpy())
    assert_close(gw.numpy(), tw.grad.numpy())
    assert_close(gb.numpy(), tb.grad.numpy())
