"""Fused attention (F.scaled_dot_product_attention) and F.multi_head_attention_forward against
PyTorch on the CPU in float64: outputs and the gradients of q, k, v, every output poisoned."""
import math

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py.errors import DTypeError, ShapeError, UnsupportedError
from dlprim_py.ops import attention as A
from dlprim_py.tensor import Tensor

from conftest import assert_close, assert_repeats_build_nothing, random

torch = pytest.importorskip("torch")
F = dp.functional
TOL = 2e-6


def _poisoned_empty(ctx, shape, dtype=np.float32):
    t = Tensor.empty(ctx, shape, dtype)
    if t.size:
        t.fill_(np.nan)
    return t


@pytest.fixture
def poison(monkeypatch):
    """Every output, workspace and gradient the attention module allocates starts as NaN."""
    monkeypatch.setattr(A, "_empty", _poisoned_empty)


def _t64(a):
    if a is None:
        return None
    if a.dtype == np.bool_:
        return torch.tensor(a)
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _check(ctx, rng, qs, ks, vs, mask=None, tol=TOL, algorithm=None, grads="qkv", **kw):
    """Ours against torch's SDPA in float64: output and the gradients of ``grads`` (the others
    not asked for), ours with the solver ``algorithm`` (None: the tuned choice)."""
    q, k, v = random(rng, qs), random(rng, ks), random(rng, vs)
    tq, tk, tv = _t64(q), _t64(k), _t64(v)
    tm = None if mask is None else (torch.tensor(mask) if mask.dtype == np.bool_
                                    else torch.tensor(mask, dtype=torch.float64))
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, **kw)
    g = random(rng, tuple(ref.shape))
    ref.backward(torch.tensor(g, dtype=torch.float64))
    dq, dk, dv = (dp.Tensor.from_numpy(ctx, a, requires_grad=name in grads)
                  for name, a in zip("qkv", (q, k, v)))
    dm = None if mask is None else dp.Tensor.from_numpy(ctx, mask)
    out = F.scaled_dot_product_attention(dq, dk, dv, attn_mask=dm, algorithm=algorithm, **kw)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy(), tol=tol)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for name, ours, theirs in (("q", dq, tq), ("k", dk, tk), ("v", dv, tv)):
        if name not in grads:
            assert ours.grad is None, name
            continue
        assert ours.grad.shape == ours.shape, name
        assert_close(ours.grad.numpy(), theirs.grad.numpy(), tol=tol)
    return out


@pytest.mark.parametrize("qs, ks, vs, kw", [
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {}),
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((1, 2, 45, 16), (1, 2, 29, 16), (1, 2, 29, 16), {"is_causal": True}),     # L > S
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((2, 3, 9, 16), (3, 11, 16), (1, 11, 16), {}),                          # batch broadcast
    ((1, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 16), {}),                    # q broadcast
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 4 != 0
])
def test_matches_torch(ctx, rng, poison, qs, ks, vs, kw):
    _check(ctx, rng, qs, ks, vs, **kw)


@pytest.mark.parametrize("dk, dv", [(32, 64), (128, 80)])
def test_head_dims(ctx, rng, poison, dk, dv):
    _check(ctx, rng, (1, 2, 21, dk), (1, 2, 18, dk), (1, 2, 18, dv), is_causal=dk == 32)


def test_float_mask_broadcast_with_a_fully_masked_row(ctx, rng, poison):
    """A float mask (L, S) over every batch; a row of -inf gives zeros and zero gradients, as
    torch's fused kernels."""
    mask = random(rng, (37, 45), -2.0, 2.0)
    mask[4] = -np.inf
    mask[5, :40] = -np.inf
    out = _check(ctx, rng, (2, 3, 37, 16), (1, 3, 45, 16), (1, 3, 45, 16), mask=mask)
    assert np.all(out.numpy()[:, :, 4] == 0)


@pytest.mark.parametrize("shape", [(2, 1, 37, 45), (1, 45), (37, 1)])
def test_bool_mask_broadcast(ctx, rng, poison, shape):
    mask = rng.uniform(0, 1, shape) > 0.3
    if len(shape) == 4:
        mask[0, 0, 3] = False           # a row with no key
    _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)


def test_empty_keys_and_rows(ctx, rng):
    q = dp.Tensor.from_numpy(ctx, random(rng, (2, 5, 8)))
    k = dp.Tensor.from_numpy(ctx, random(rng, (2, 0, 8)))
    v = dp.Tensor.from_numpy(ctx, random(rng, (2, 0, 6)))
    out = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 5, 6) and np.all(out.numpy() == 0)
    out = F.scaled_dot_product_attention(dp.Tensor.from_numpy(ctx, random(rng, (2, 0, 8))), q, q)
    assert out.shape == (2, 0, 8)


def _dropout_reference(q, k, v, keep, p, g, causal=False, mask=None):
    """Attention with the weights dropped by ``keep`` (numpy bool), float64, and its gradients
    (and the float ``mask``'s, added to the scores, where given); ``causal``: query row l sees
    keys 0..l (top-left aligned, as torch)."""
    tq, tk, tv = _t64(q), _t64(k), _t64(v)
    scores = tq @ tk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    tm = None if mask is None else _t64(mask)
    if tm is not None:
        scores = scores + tm
    if causal:
        L, S = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    weights = torch.softmax(scores, dim=-1) * torch.tensor(keep) / (1 - p)
    out = weights @ tv
    out.backward(torch.tensor(g, dtype=torch.float64))
    grads = (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
    return (out.detach().numpy(),) + grads + (() if tm is None else (tm.grad.numpy(),))


def test_dropout_uses_the_dropout_generator_forward_and_backward(ctx, rng, poison):
    """The weights are dropped as F.dropout would drop a (B, L, S) tensor with the same seed
    and stream (attention_dropout_mask); the backward regenerates that mask."""
    p, seed, stream = 0.3, 1234, 7
    q, k, v = random(rng, (2, 3, 19, 16)), random(rng, (2, 3, 26, 16)), random(rng, (2, 3, 26, 16))
    g = random(rng, (2, 3, 19, 16))
    keep = A.attention_dropout_mask((2, 3), 19, 26, p, seed, stream)
    assert 0.5 < keep.mean() < 0.9
    ref = _dropout_reference(q, k, v, keep, p, g)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream)
    assert_close(out.numpy(), ref[0], tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, ref[1:]):
        assert_close(t.grad.numpy(), r, tol=TOL)
    again = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream)
    assert np.array_equal(again.numpy(), out.numpy())
    other = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream + 1)
    assert not np.array_equal(other.numpy(), out.numpy())


@pytest.mark.parametrize("algorithm", ["rows", "tiled"])
@pytest.mark.parametrize("qs, ks, ms, kw", [
    ((2, 3, 19, 16), (2, 3, 26, 16), (19, 26), {}),
    ((2, 4, 9, 16), (2, 2, 13, 16), (2, 1, 9, 13), {"enable_gqa": True, "scale": 0.4}),
    ((3, 9, 12), (1, 13, 12), (3, 9, 13), {})])
def test_float_mask_gradient(ctx, rng, poison, algorithm, qs, ks, ms, kw):
    """A float attn_mask that requires grad gets the scores' gradient summed to its shape
    (broadcast over batches and heads, grouped heads), every solver's q, k, v gradients
    unchanged beside it; only the mask asking for one works too."""
    q, k, v, m = random(rng, qs), random(rng, ks), random(rng, ks), random(rng, ms)
    refs = [_t64(a) for a in (q, k, v, m)]
    ref = torch.nn.functional.scaled_dot_product_attention(*refs[:3], attn_mask=refs[3], **kw)
    g = random(rng, tuple(ref.shape))
    ref.backward(torch.tensor(g, dtype=torch.float64))
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v, m)]
    out = F.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3], algorithm=algorithm, **kw)
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for mine, theirs in zip(ours, refs):
        assert mine.grad.shape == mine.shape
        assert_close(mine.grad.numpy(), theirs.grad.numpy(), tol=TOL)
    alone = [dp.Tensor.from_numpy(ctx, a) for a in (q, k, v)] + \
        [dp.Tensor.from_numpy(ctx, m, requires_grad=True)]
    F.scaled_dot_product_attention(*alone[:3], attn_mask=alone[3], algorithm=algorithm,
                                   **kw).backward(dp.Tensor.from_numpy(ctx, g))
    assert_close(alone[3].grad.numpy(), refs[3].grad.numpy(), tol=TOL)


def test_float_mask_gradient_with_dropout(ctx, rng, poison):
    """The mask's gradient under dropout: the forward's keep-mask (same seed and stream)."""
    p, seed, stream = 0.3, 99, 4
    q, k, v = random(rng, (2, 3, 19, 16)), random(rng, (2, 3, 26, 16)), random(rng, (2, 3, 26, 16))
    m, g = random(rng, (3, 19, 26)), random(rng, (2, 3, 19, 16))
    keep = A.attention_dropout_mask((2, 3), 19, 26, p, seed, stream)
    ref = _dropout_reference(q, k, v, keep, p, g, mask=m)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v, m)]
    out = F.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3], dropout_p=p, seed=seed,
                                         stream=stream)
    assert_close(out.numpy(), ref[0], tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, ref[1:]):
        assert_close(t.grad.numpy(), r, tol=TOL)


@pytest.mark.parametrize("L, S", [(19, 26), (26, 19)])
def test_dropout_with_causality(ctx, rng, poison, L, S):
    """Dropout over causal weights (query row l sees keys 0..l), L < S and L > S: forward and
    the three gradients against the float64 reference with the same keep-mask."""
    p, seed, stream = 0.2, 99, 3
    q, k, v = random(rng, (2, 2, L, 16)), random(rng, (2, 2, S, 16)), random(rng, (2, 2, S, 16))
    g = random(rng, (2, 2, L, 16))
    keep = A.attention_dropout_mask((2, 2), L, S, p, seed, stream)
    ref = _dropout_reference(q, k, v, keep, p, g, causal=True)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, dropout_p=p, is_causal=True, seed=seed,
                                         stream=stream)
    assert_close(out.numpy(), ref[0], tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, ref[1:]):
        assert_close(t.grad.numpy(), r, tol=TOL)


def test_dropout_follows_manual_seed(ctx, rng):
    q = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 19, 16)))
    k = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 26, 16)))
    dp.manual_seed(11)
    a = F.scaled_dot_product_attention(q, k, k, dropout_p=0.3).numpy()
    b = F.scaled_dot_product_attention(q, k, k, dropout_p=0.3).numpy()
    dp.manual_seed(11)
    assert np.array_equal(F.scaled_dot_product_attention(q, k, k, dropout_p=0.3).numpy(), a)
    assert not np.array_equal(a, b)
    full = F.scaled_dot_product_attention(q, k, k, dropout_p=1.0).numpy()
    assert np.all(full == 0)


def test_repeated_call_builds_nothing(ctx, rng):
    """A repeated forward and backward on seen shapes renders, builds and creates nothing."""
    q, k, v = (dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)), requires_grad=True)
               for _ in range(3))
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)))

    def run():
        for t in (q, k, v):
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    assert_repeats_build_nothing(ctx, run)


@pytest.mark.parametrize("algorithm", ["rows", "tiled"])
def test_replayed_calls_take_their_own_operands(ctx, rng, poison, algorithm):
    """A call without dropout replays the plan of the first call of its shapes: later calls
    on other tensors (other buffers, a new mask, gradients for some operands only) compute
    their own results, forward and backward."""
    mask = random(rng, (21, 26), -2.0, 2.0)
    for grads in ("qkv", "qkv", "q", "kv", "k", "qkv"):
        moved = (mask + rng.uniform(-1, 1, mask.shape)).astype(np.float32)
        for kw in ({}, {"is_causal": True}, {"mask": moved}):
            _check(ctx, rng, (2, 3, 21, 16), (2, 3, 26, 16), (2, 3, 26, 16),
                   algorithm=algorithm, grads=grads, **kw)


def test_rows_per_item_without_lanes(ctx, rng, poison, tuning_rules):
    """Forward items of two query rows, one item per row, on the device's shuffle-free path."""
    tuning_rules("attention", [{"when": {}, "params": {
        "solver": "rows", "block_m": 16, "block_n": 8, "kv_block": 16, "q_tile": 8,
        "lanes": 1, "rows": 2, "unroll": True}}])
    mask = random(rng, (1, 21))
    _check(ctx, rng, (2, 3, 19, 16), (2, 3, 21, 16), (2, 3, 21, 16), mask=mask)


@pytest.mark.parametrize("group", [8, 32])
def test_delta_in_small_work_groups(ctx, rng, poison, tuning_rules, monkeypatch, group):
    """attention_delta in the work-groups of a device that runs fewer than 64 items (8: one row
    of 8 lanes a group; 32: two rows of 16), rows whose head dim no lane count divides."""
    tuning_rules("attention", [{"when": {}, "params": {
        "solver": "rows", "block_m": 8, "block_n": 8, "kv_block": 8, "q_tile": 8,
        "lanes": 1, "rows": 1, "unroll": False}}])
    monkeypatch.setattr(A, "_delta_group", lambda ctx: group)
    sizes = []
    original = A.AttentionPlan.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        sizes.append(self.delta_size)
    monkeypatch.setattr(A.AttentionPlan, "__init__", spy)
    _check(ctx, rng, (2, 3, 19, 12), (2, 3, 21, 12), (2, 3, 21, 20), is_causal=True)
    # 114 rows: one a group of 8 (8 lanes), two a group of 32 (16 lanes each).
    assert sizes and sizes[-1] == {8: ((114 * 8,), (8,)), 32: ((57 * 32,), (32,))}[group]


def test_forced_solver(ctx, rng, monkeypatch):
    q = dp.Tensor.from_numpy(ctx, random(rng, (2, 9, 16)))
    monkeypatch.setenv("DLPRIM_ATTENTION_ALGO", "rows")
    dp.config.reload()
    F.scaled_dot_product_attention(q, q, q)
    monkeypatch.setenv("DLPRIM_ATTENTION_ALGO", "nope")
    dp.config.reload()
    with pytest.raises(UnsupportedError, match="rows"):
        F.scaled_dot_product_attention(q, q, q)


def test_bad_inputs(ctx, rng):
    def t(*shape, dtype=np.float32, grad=False):
        return dp.Tensor.from_numpy(ctx, random(rng, shape).astype(dtype), requires_grad=grad)
    q, k, v = t(2, 3, 5, 8), t(2, 3, 6, 8), t(2, 3, 6, 4)
    sdpa = F.scaled_dot_product_attention
    with pytest.raises(DTypeError, match="query must be float32"):
        sdpa(t(2, 3, 5, 8, dtype=np.int32), k, v)
    with pytest.raises(ShapeError, match="at least 2-d"):
        sdpa(t(8), k, v)
    with pytest.raises(ShapeError, match="key's head dim"):
        sdpa(q, t(2, 3, 6, 7), v)
    with pytest.raises(ShapeError, match="value must have key's 6 rows"):
        sdpa(q, k, t(2, 3, 7, 4))
    with pytest.raises(ShapeError, match="do not broadcast"):
        sdpa(t(2, 3, 5, 8), t(2, 2, 6, 8), t(2, 2, 6, 4))
    with pytest.raises(ShapeError, match="must divide"):
        sdpa(t(2, 3, 5, 8), t(2, 2, 6, 8), t(2, 2, 6, 4), enable_gqa=True)
    with pytest.raises(ShapeError, match="does not broadcast to the scores"):
        sdpa(q, k, v, attn_mask=t(5, 5))
    with pytest.raises(ShapeError, match="does not broadcast to the scores"):
        sdpa(q, k, v, attn_mask=t(4, 3, 5, 6))
    with pytest.raises(DTypeError, match="attn_mask must be bool"):
        sdpa(q, k, v, attn_mask=t(5, 6, dtype=np.int32))
    with pytest.raises(ShapeError, match="not both"):
        sdpa(q, k, v, attn_mask=t(5, 6), is_causal=True)
    with pytest.raises(ShapeError, match="dropout_p"):
        sdpa(q, k, v, dropout_p=1.5)
    with pytest.raises(UnsupportedError, match="head dims up to"):
        sdpa(t(1, 2, 300), t(1, 2, 300), t(1, 2, 4))
    with pytest.raises(ShapeError, match="seed"):
        sdpa(q, k, v, dropout_p=0.1, seed=-1)


def _mha_case(ctx, rng, L, S, N, E, H, self_attention=True, separate=False, key_padding=None,
              attn_mask=None, need_weights=False, average=True, is_causal=False, bias_kv=False,
              zero_attn=False, mask_grad=False):
    """F.multi_head_attention_forward against torch's in float64: output, weights, and the
    gradients of the input and the weights (and with ``mask_grad`` of the float masks)."""
    x = random(rng, (L, N, E))
    kx = x if self_attention else random(rng, (S, N, E))
    vx = x if self_attention else random(rng, (S, N, E))
    weights = {"in_w": random(rng, (3 * E, E)), "in_b": random(rng, (3 * E,)),
               "out_w": random(rng, (E, E)), "out_b": random(rng, (E,)),
               "q_w": random(rng, (E, E)), "k_w": random(rng, (E, E)), "v_w": random(rng, (E, E)),
               "bias_k": random(rng, (1, 1, E)), "bias_v": random(rng, (1, 1, E))}

    def arguments(make, make_mask):
        q = make(x)
        k = q if self_attention else make(kx)
        v = q if self_attention else make(vx)
        w = {name: make(a) for name, a in weights.items()}
        bias_k, bias_v = (w["bias_k"], w["bias_v"]) if bias_kv else (None, None)
        return (q, k, v, E, H, None if separate else w["in_w"], w["in_b"], bias_k, bias_v,
                zero_attn, 0.0, w["out_w"], w["out_b"]), dict(
            training=True, need_weights=need_weights, use_separate_proj_weight=separate,
            key_padding_mask=None if key_padding is None else make_mask(key_padding),
            attn_mask=None if attn_mask is None else make_mask(attn_mask),
            q_proj_weight=w["q_w"] if separate else None,
            k_proj_weight=w["k_w"] if separate else None,
            v_proj_weight=w["v_w"] if separate else None,
            average_attn_weights=average, is_causal=is_causal), w, q

    def ours_mask(m):
        return dp.Tensor.from_numpy(ctx, m, requires_grad=mask_grad and m.dtype != np.bool_)

    def their_mask(m):
        if m.dtype == np.bool_:
            return torch.tensor(m)
        return _t64(m) if mask_grad else _t64(m).detach()

    args, their_kw, theirs, tq = arguments(_t64, their_mask)
    ref, ref_w = torch.nn.functional.multi_head_attention_forward(*args, **their_kw)
    args, kw, ours, oq = arguments(lambda a: dp.Tensor.from_numpy(ctx, a, requires_grad=True),
                                   ours_mask)
    out, out_w = F.multi_head_attention_forward(*args, **kw)
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    if need_weights:
        assert_close(out_w.numpy(), ref_w.detach().numpy(), tol=TOL)
    else:
        assert out_w is None
    g = random(rng, tuple(ref.shape))
    ref.backward(torch.tensor(g, dtype=torch.float64))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    names = (["q_w", "k_w", "v_w"] if separate else ["in_w"]) + ["in_b", "out_w", "out_b"] + \
        (["bias_k", "bias_v"] if bias_kv else [])
    for name in names:
        assert_close(ours[name].grad.numpy(), theirs[name].grad.numpy(), tol=TOL)
    assert_close(oq.grad.numpy(), tq.grad.numpy(), tol=TOL)
    for name in ("attn_mask", "key_padding_mask"):
        if mask_grad and kw[name] is not None and kw[name].dtype != dp.bool:
            assert_close(kw[name].grad.numpy(), their_kw[name].grad.numpy(), tol=TOL)


def test_mha_self_attention_packed(ctx, rng):
    _mha_case(ctx, rng, 9, 9, 2, 32, 2)


def test_mha_cross_attention_with_both_masks(ctx, rng):
    key_padding = rng.uniform(0, 1, (2, 11)) > 0.7
    key_padding[:, 0] = False
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False, key_padding=key_padding,
              attn_mask=random(rng, (9, 11)))


def test_mha_separate_weights_bool_mask_and_weights(ctx, rng):
    mask = rng.uniform(0, 1, (4, 9, 11)) > 0.8
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False, separate=True, attn_mask=mask,
              need_weights=True)


def test_mha_causal_hint(ctx, rng):
    causal = np.triu(np.ones((9, 9), bool), 1)
    _mha_case(ctx, rng, 9, 9, 2, 32, 2, attn_mask=causal, is_causal=True)
    _mha_case(ctx, rng, 9, 9, 2, 32, 2, attn_mask=causal, is_causal=True, need_weights=True,
              average=False)


@pytest.mark.parametrize("bias_kv, zero_attn", [(True, False), (False, True), (True, True)])
def test_mha_appended_keys(ctx, rng, bias_kv, zero_attn):
    """bias_k / bias_v and add_zero_attn: keys appended to every sequence, the float, bool and
    key padding masks widened to allow them, the causal hint replacing the mask as in torch;
    the weights and the gradients of bias_k and bias_v as torch's."""
    key_padding = rng.uniform(0, 1, (2, 11)) > 0.7
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False, key_padding=key_padding,
              attn_mask=random(rng, (9, 11)), bias_kv=bias_kv, zero_attn=zero_attn)
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False,
              attn_mask=rng.uniform(0, 1, (4, 9, 11)) > 0.8, need_weights=True, average=False,
              bias_kv=bias_kv, zero_attn=zero_attn)
    causal = np.triu(np.ones((9, 9), bool), 1)
    _mha_case(ctx, rng, 9, 9, 2, 32, 2, attn_mask=causal, is_causal=True, bias_kv=bias_kv,
              zero_attn=zero_attn)


def test_mha_float_mask_gradients(ctx, rng):
    """Float attn_mask and key_padding_mask that require grad: their gradients as torch's,
    beside a bool mask folded off the tape, with appended keys (the masks' added column)."""
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False,
              key_padding=random(rng, (2, 11)), attn_mask=random(rng, (9, 11)), mask_grad=True)
    _mha_case(ctx, rng, 9, 11, 2, 32, 2, self_attention=False,
              key_padding=rng.uniform(0, 1, (2, 11)) > 0.8, attn_mask=random(rng, (4, 9, 11)),
              mask_grad=True, bias_kv=True, zero_attn=True)


def test_mha_bad_inputs(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (5, 2, 8)))
    w = dp.Tensor.from_numpy(ctx, random(rng, (24, 8)))
    o = dp.Tensor.from_numpy(ctx, random(rng, (8, 8)))
    mha = F.multi_head_attention_forward
    with pytest.raises(ShapeError, match="embed_dim_to_check"):
        mha(x, x, x, 16, 2, w, None, None, None, False, 0.0, o, None)
    with pytest.raises(ShapeError, match="divisible"):
        mha(x, x, x, 8, 3, w, None, None, None, False, 0.0, o, None)
    with pytest.raises(ShapeError, match="together"):
        mha(x, x, x, 8, 2, w, None, o, None, False, 0.0, o, None)
    with pytest.raises(ShapeError, match=r"bias_k must be float32 \(1, 1, 8\)"):
        mha(x, x, x, 8, 2, w, None, o, o, False, 0.0, o, None)
    with pytest.raises(UnsupportedError, match="static_k"):
        mha(x, x, x, 8, 2, w, None, None, None, False, 0.0, o, None, static_k=o)
    with pytest.raises(ShapeError, match="attn_mask must be"):
        mha(x, x, x, 8, 2, w, None, None, None, False, 0.0, o, None, attn_mask=o)
    with pytest.raises(ShapeError, match="needs attn_mask"):
        mha(x, x, x, 8, 2, w, None, None, None, False, 0.0, o, None, is_causal=True)
    with pytest.raises(ShapeError, match="in_proj_weight"):
        mha(x, x, x, 8, 2, o, None, None, None, False, 0.0, o, None)


@pytest.mark.parametrize("lanes, rows, kw, mask_kind", [
    (2, 1, {"is_causal": True}, None), (4, 2, {"scale": 0.7}, "bool"),
    (2, 2, {"dropout_p": 0.25, "seed": 99}, None)])
def test_lanes_and_rows_per_item(ctx, rng, poison, tuning_rules, lanes, rows, kw, mask_kind):
    """Several work items per row and per key (the NVIDIA rule's layout), summing their partial
    dot products through local memory as on devices without warp shuffles, and forward items
    taking two query rows."""
    tuning_rules("attention", [{"when": {}, "params": {
        "solver": "rows", "block_m": 8, "block_n": 8, "kv_block": 8, "q_tile": 8,
        "lanes": lanes, "rows": rows, "unroll": False}}])
    plan_params = []
    original = A.AttentionPlan.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        plan_params.append(self.params)
    qs, ks = (2, 3, 19, 16), (2, 3, 21, 16)
    mask = None
    if mask_kind == "bool":
        mask = rng.uniform(0, 1, (2, 1, 19, 21)) > 0.3
        mask[1, 0, 2] = False
    elif mask_kind == "float":
        mask = random(rng, (19, 21))
    import unittest.mock
    with unittest.mock.patch.object(A.AttentionPlan, "__init__", spy):
        if "dropout_p" in kw:
            p, seed = kw["dropout_p"], kw["seed"]
            q, k, v, g = (random(rng, s) for s in (qs, ks, ks, qs))
            keep = A.attention_dropout_mask((2, 3), 19, 21, p, seed)
            ref = _dropout_reference(q, k, v, keep, p, g)
            ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
            out = F.scaled_dot_product_attention(*ours, **kw)
            assert_close(out.numpy(), ref[0], tol=TOL)
            out.backward(dp.Tensor.from_numpy(ctx, g))
            for t, r in zip(ours, ref[1:]):
                assert_close(t.grad.numpy(), r, tol=TOL)
        else:
            _check(ctx, rng, qs, ks, ks, mask=mask, **kw)
    assert plan_params and plan_params[-1]["lanes"] == lanes
    assert plan_params[-1]["rows"] == rows
    assert plan_params[-1]["shuffle"] == ("ptx" if ctx.info.vendor == "nvidia" else "local")


def test_shipped_rules_name_the_family_solver():
    """Every rule of tuning_db/attention.json names a solver of the family with the values its
    plans read: block sizes, lanes and rows for the rows solver, block, step and tile sizes for
    the tiled one, warps and steps (multiples of 8) for the mma one."""
    from dlprim_py import solver, tuning
    db = tuning.read_db(tuning.shipped_path("attention"), "attention")
    entries = [db["default"]] + [e for section in tuning.SECTIONS for e in db[section].values()]
    for entry in entries:
        for rule in entry["rules"]:
            params = rule["params"]
            assert params["solver"] in solver.family("attention").solvers
            if params["solver"] == "tiled":
                assert {"block_m", "block_n", "tile_y", "tile_x", "kv_block", "q_step",
                        "kv_tile_y", "q_block", "k_step", "q_tile_y"} <= set(params)
                continue
            if params["solver"] == "mma":
                assert {"warps", "block_n", "kv_warps", "q_step", "q_warps", "k_step"} \
                    <= set(params)
                assert all(params[k] % 8 == 0 for k in ("block_n", "q_step", "k_step"))
                continue
            assert {"block_m", "block_n", "kv_block", "q_tile", "lanes", "rows"} <= set(params)
            assert params["block_m"] % params["rows"] == 0
