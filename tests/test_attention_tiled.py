"""The attention family's tiled solver (kernels/attention_tiled.cl.mako) forced, against PyTorch
on the CPU in float64: outputs and the gradients of q, k, v, every output poisoned; both widths
of a row's items (tile_x 8 and 16), odd sizes, masks, causal with L != S, GQA, dropout."""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py.errors import UnsupportedError
from dlprim_py.ops import attention as A

from conftest import assert_close, assert_repeats_build_nothing, random
from test_attention import TOL, _check, _dropout_reference, _poisoned_empty

torch = pytest.importorskip("torch")
F = dp.functional


@pytest.fixture
def tiled(monkeypatch):
    """The tiled solver forced, every output, workspace and gradient poisoned."""
    monkeypatch.setattr(A, "_empty", _poisoned_empty)
    monkeypatch.setenv("DLPRIM_ATTENTION_ALGO", "tiled")
    dp.config.reload()


def _plans():
    """The params of the plans built within the block (a spy on AttentionPlan)."""
    import unittest.mock
    built = []
    original = A.AttentionPlan.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append((self.solver, self.params))
    return built, unittest.mock.patch.object(A.AttentionPlan, "__init__", spy)


@pytest.mark.parametrize("qs, ks, vs, kw", [
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((1, 2, 45, 16), (1, 2, 29, 16), (1, 2, 29, 16), {"is_causal": True}),     # L > S
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((1, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 16), {}),                    # q broadcast
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 4 != 0
    ((1, 2, 21, 128), (1, 2, 18, 128), (1, 2, 18, 80), {}),                 # head dims
])
def test_matches_torch(ctx, rng, tiled, qs, ks, vs, kw):
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(solver == "tiled" for solver, _ in built)


def test_float_mask_with_a_fully_masked_row(ctx, rng, tiled):
    mask = random(rng, (37, 45), -2.0, 2.0)
    mask[4] = -np.inf
    mask[5, :40] = -np.inf
    out = _check(ctx, rng, (2, 3, 37, 16), (1, 3, 45, 16), (1, 3, 45, 16), mask=mask)
    assert np.all(out.numpy()[:, :, 4] == 0)


def test_bool_mask_broadcast(ctx, rng, tiled):
    mask = rng.uniform(0, 1, (2, 1, 37, 45)) > 0.3
    mask[0, 0, 3] = False           # a row with no key
    _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)


def test_dropout(ctx, rng, tiled):
    p, seed, stream = 0.3, 1234, 7
    q, k, v = random(rng, (2, 3, 19, 16)), random(rng, (2, 3, 26, 16)), random(rng, (2, 3, 26, 16))
    g = random(rng, (2, 3, 19, 16))
    keep = A.attention_dropout_mask((2, 3), 19, 26, p, seed, stream)
    ref = _dropout_reference(q, k, v, keep, p, g)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream)
    assert_close(out.numpy(), ref[0], tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, ref[1:]):
        assert_close(t.grad.numpy(), r, tol=TOL)


def test_sixteen_items_per_row_prefetch_and_causal(ctx, rng, tiled, tuning_rules):
    """tile_x 16 (the NVIDIA layout: 16 items per row), several rows and keys per item, the
    row maxima through local memory off NVIDIA; each step's tiles prefetched into registers
    during the previous step; causal with L < S (several steps, a partial last one)."""
    tuning_rules("attention", [{"when": {}, "params": {
        "solver": "tiled", "tile_x": 16, "block_m": 8, "block_n": 32, "tile_y": 4,
        "kv_block": 8, "q_step": 16, "kv_tile_y": 4, "q_block": 8, "k_step": 16,
        "q_tile_y": 4, "prefetch": True}}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (2, 2, 35, 16), (2, 2, 50, 16), (2, 2, 50, 12), is_causal=True)
    params = built[-1][1]
    assert params["tile_x"] == 16 and params["block_n"] == 32 and params["tile_y"] == 4
    assert params["prefetch"]
    assert params["shuffle"] == ("ptx" if ctx.info.vendor == "nvidia" else "local")


def test_repeated_call_builds_nothing(ctx, rng, tiled):
    q, k, v = (dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)), requires_grad=True)
               for _ in range(3))
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)))

    def run():
        for t in (q, k, v):
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    assert_repeats_build_nothing(ctx, run)


def test_refused_past_its_head_dims(ctx, rng, tiled):
    q = dp.Tensor.from_numpy(ctx, random(rng, (2, 5, 136)))
    with pytest.raises(UnsupportedError, match="tiled does not apply"):
        F.scaled_dot_product_attention(q, q, q)
