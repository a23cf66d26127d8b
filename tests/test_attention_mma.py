"""The attention family's mma solver (kernels/attention_mma.cl.mako: mma.sync TF32 with the
3xTF32 split) forced, against PyTorch on the CPU in float64 at fp32 tolerances (the split must
give fp32 accuracy: with the small parts dropped, TF32 alone, the error metric is ~1e-4
against 2e-6): outputs and the gradients of q, k, v, every output poisoned; odd sizes (not
multiples of the blocks), head dims not multiples of 8, masks, causal with L != S, GQA, dropout
against the host mask.

On an NVIDIA GPU of compute capability 8.0 or later the PTX kernels run with the shipped
values; elsewhere DLPRIM_TF32_EMULATE runs the same fragments through local memory, with small
blocks (2 warps, 16 keys or rows per step) that PoCL builds quickly."""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import solver
from dlprim_py.errors import UnsupportedError
from dlprim_py.ops import attention as A
from dlprim_py.ops.gemm import mma_device_problem

from conftest import assert_close, assert_repeats_build_nothing, random
from test_attention import TOL, _check, _dropout_reference, _poisoned_empty
from test_gemm_tf32 import fake_context

torch = pytest.importorskip("torch")
F = dp.functional

# Emulated: 2 warps per group (32 query rows or keys), 16 keys or rows per step.
SMALL = {"solver": "mma", "warps": 2, "block_n": 16, "kv_warps": 2, "q_step": 16,
         "q_warps": 2, "k_step": 16}


def real_mma(ctx):
    return mma_device_problem(ctx.info) is None


def _mma_rule(ctx, **params):
    """A rule forcing the mma solver with ``params``: over the shipped values on a GPU with
    mma.sync, over SMALL's emulated blocks elsewhere."""
    return dict({"solver": "mma"} if real_mma(ctx) else SMALL, **params)


@pytest.fixture
def mma(ctx, monkeypatch, tuning_rules):
    """The mma solver forced, every output, workspace and gradient poisoned; emulated with
    SMALL blocks where the device has no mma.sync."""
    monkeypatch.setattr(A, "_empty", _poisoned_empty)
    monkeypatch.setenv("DLPRIM_ATTENTION_ALGO", "mma")
    if not real_mma(ctx):
        monkeypatch.setenv("DLPRIM_TF32_EMULATE", "1")
        tuning_rules("attention", [{"when": {}, "params": SMALL}])
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
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 37, 64), (1, 2, 35, 64), (1, 2, 35, 64), {"is_causal": True}),  # head dim 64
])
def test_matches_torch(ctx, rng, mma, qs, ks, vs, kw):
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(name == "mma" for name, _ in built)
    assert all(params["emulate"] == int(not real_mma(ctx)) for _, params in built)
    # q kept split where the emulated blocks run (SMALL); the NVIDIA rule keeps it as floats.
    assert all(params["q_split"] == (not real_mma(ctx)) and params["frags_kv"]
               and params["frags_q"] for _, params in built)


def test_large_head_dims(ctx, rng, mma):
    """Head dims past 64 (96 and 72, neither a multiple of 16): q's fragments split at each
    step in the forward, the backward's own fragments read again at each step."""
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (1, 2, 37, 96), (1, 2, 35, 96), (1, 2, 35, 72), is_causal=True)
    params = built[-1][1]
    assert not params["q_split"] and not params["frags_kv"] and not params["frags_q"]


def test_two_stages(ctx, rng, mma, tuning_rules):
    """stages 2: each step's tiles in one of two buffers, the next step's copied (cp.async on
    NVIDIA) while this one computes: several steps with a partial last one, causal with L < S;
    then operands at odd offsets in their buffers (element copies instead of 16-byte ones)."""
    small = dict(SMALL, stages=2)
    if real_mma(ctx):
        small = {"solver": "mma", "stages": 2}
    tuning_rules("attention", [{"when": {}, "params": small}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), is_causal=True)
    assert built[-1][1]["stages"] == 2
    shapes = ((1, 2, 21, 16), (1, 2, 30, 16), (1, 2, 30, 16))
    arrays = [random(rng, s) for s in shapes]
    g = random(rng, shapes[0])
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    ref.backward(torch.tensor(g, dtype=torch.float64))
    # Each operand one element into its buffer.
    pools = [dp.Tensor.from_numpy(ctx, np.concatenate([[7.0], a.ravel()]).astype(np.float32))
             for a in arrays]
    views = [dp.Tensor(ctx, p.buffer, a.shape, offset=p.offset + 4, requires_grad=True)
             for p, a in zip(pools, arrays)]
    assert all(v.offset_elements % 4 for v in views)
    out = F.scaled_dot_product_attention(*views)
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(views, (tq, tk, tv)):
        assert_close(t.grad.numpy(), r.grad.numpy(), tol=TOL)


def test_presplit(ctx, rng, mma, tuning_rules):
    """presplit: the forward's staged keys and values split into their TF32 parts once, two
    tiles each; a float mask, causal-like rows with no key, several steps."""
    # presplit takes one stage (the shipped NVIDIA rule has two).
    params = dict(SMALL, presplit=True) if not real_mma(ctx) else \
        {"solver": "mma", "presplit": True, "stages": 1}
    tuning_rules("attention", [{"when": {}, "params": params}])
    mask = random(rng, (37, 45), -2.0, 2.0)
    mask[4] = -np.inf
    built, spy = _plans()
    with spy:
        out = _check(ctx, rng, (2, 3, 37, 16), (1, 3, 45, 16), (1, 3, 45, 12), mask=mask)
    assert built[-1][1]["presplit"]
    assert np.all(out.numpy()[:, :, 4] == 0)


def test_larger_values(ctx, rng, mma):
    """Operands of several units (scores up to ~30, weights far from uniform): the small parts
    of the split carry the digits TF32 drops."""
    q, k, v = random(rng, (1, 2, 40, 16), -4, 4), random(rng, (1, 2, 40, 16), -2, 2), \
        random(rng, (1, 2, 40, 16), -3, 3)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
    g = random(rng, tuple(ref.shape))
    ref.backward(torch.tensor(g, dtype=torch.float64))
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours)
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, (tq, tk, tv)):
        assert_close(t.grad.numpy(), r.grad.numpy(), tol=TOL)


def test_float_mask_with_a_fully_masked_row_and_dropout(ctx, rng, mma):
    """A float mask (a row all -inf gives zeros) with dropout against the host's keep-mask, in
    one program (both are template parameters: one build on PoCL)."""
    p, seed, stream = 0.3, 1234, 7
    shape_q, shape_k = (2, 3, 37, 16), (1, 3, 45, 16)
    mask = random(rng, (37, 45), -2.0, 2.0)
    mask[4] = -np.inf
    mask[5, :40] = -np.inf
    q, k, v = random(rng, shape_q), random(rng, shape_k), random(rng, shape_k)
    g = random(rng, shape_q)
    keep = A.attention_dropout_mask((2, 3), 37, 45, p, seed, stream)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    # Row 4 takes no key: its weights are 0 (the softmax of a row of 0s, zeroed, keeps the
    # reference's gradient finite).
    empty = np.isneginf(mask).all(axis=-1, keepdims=True)
    bias = torch.tensor(np.where(empty, 0.0, mask), dtype=torch.float64)
    scores = tq @ tk.transpose(-1, -2) / 4.0 + bias
    weights = torch.softmax(scores, dim=-1) * torch.tensor(~empty) * torch.tensor(keep) / (1 - p)
    ref = weights @ tv
    ref.backward(torch.tensor(g, dtype=torch.float64))
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, attn_mask=dp.Tensor.from_numpy(ctx, mask),
                                         dropout_p=p, seed=seed, stream=stream)
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    assert np.all(out.numpy()[:, :, 4] == 0)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, (tq, tk, tv)):
        assert_close(t.grad.numpy(), r.grad.numpy(), tol=TOL)


def test_bool_mask_broadcast(ctx, rng, mma):
    mask = rng.uniform(0, 1, (2, 1, 37, 45)) > 0.3
    mask[0, 0, 3] = False           # a row with no key
    _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)


def test_repeated_call_builds_nothing(ctx, rng, mma):
    q, k, v = (dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)), requires_grad=True)
               for _ in range(3))
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 37, 16)))

    def run():
        for t in (q, k, v):
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    assert_repeats_build_nothing(ctx, run)


@pytest.mark.parametrize("extra", [{}, {"m_tiles": 2, "kv_tiles": 2, "q_tiles": 2},
                                   {"small": "trunc"}, {"small": "trunc", "round": "fast"},
                                   {"fused_dq": True, "kv_tiles": 2}])
def test_ptx_matches_emulation(ctx, rng, mma, tuning_rules, extra):
    """On a GPU with mma.sync: the PTX kernels against the emulated ones (the same fragments),
    to the last bits but for the hardware's own order of the 8 products of an mma; with one
    and two m16 tiles per warp in each kernel."""
    if not real_mma(ctx):
        pytest.skip("the device has no mma.sync")
    q, k, v = (dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 70, 64)), requires_grad=True)
               for _ in range(3))
    g = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 70, 64)))
    results = []
    for emulate in (0, 1):
        tuning_rules("attention", [{"when": {}, "params": dict(SMALL, emulate=emulate,
                                                                **extra)}])
        for t in (q, k, v):
            t.grad = None
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(g)
        results.append([out.numpy()] + [t.grad.numpy() for t in (q, k, v)])
    for ptx, emulated in zip(*results):
        assert_close(ptx, emulated, tol=TOL)


def test_refused_past_its_head_dims(ctx, rng, mma):
    q = dp.Tensor.from_numpy(ctx, random(rng, (2, 5, 136)))
    with pytest.raises(UnsupportedError, match="mma does not apply"):
        F.scaled_dot_product_attention(q, q, q)


def test_refused_without_mma_sync(monkeypatch):
    """Without DLPRIM_TF32_EMULATE the solver needs compute capability 8.0: refused (with the
    reason) on a Turing GPU and off NVIDIA, where the family falls back to the tiled solver."""
    monkeypatch.delenv("DLPRIM_TF32_EMULATE", raising=False)
    dp.config.reload()
    problem = A.AttentionProblem(64, 64, 512, 512, "none", False, False)
    mma = A.FAMILY.solvers["mma"]
    turing = fake_context(architecture="nvidia:sm_75")
    assert "8.0" in mma.refusal(turing, problem)
    assert solver.select(turing, "attention", problem).name == "tiled"
    other = fake_context(vendor="amd", architecture="amd:gfx90a")
    assert "NVIDIA" in mma.refusal(other, problem)
    wide = A.AttentionProblem(160, 64, 512, 512, "none", False, False)
    assert "128" in mma.refusal(fake_context(), wide)


def test_chosen_first_on_nvidia_gpus():
    """The NVIDIA rule names mma first: an H200 gets it for fp32 attention (TF32 off: the
    split is fp32-accurate), masks, causal and dropout alike, with the rule's values."""
    ctx = fake_context()
    for problem in (A.AttentionProblem(64, 64, 512, 512, "none", False, False),
                    A.AttentionProblem(64, 64, 1024, 1024, "none", True, False),
                    A.AttentionProblem(96, 96, 2048, 2048, "none", False, False),
                    A.AttentionProblem(64, 64, 512, 512, "bool", False, True)):
        assert solver.select(ctx, "attention", problem).name == "mma"
        params = solver.tunables(ctx, "attention", problem, "mma")
        assert (params["warps"], params["block_n"], params["stages"]) == (4, 16, 2)
        assert (params["q_step"], params["k_step"], params["q_split"]) == (16, 16, False)
        assert params["small"] == "trunc" and params.get("m_tiles", 1) == 1
        assert params["fused_dq"] and params["round"] == "fast"
    # Long rows without mask, causality or dropout at head dims up to 64: two tiles per warp
    # in every kernel.
    for L in (1024, 4096):
        problem = A.AttentionProblem(64, 64, L, L, "none", False, False)
        params = solver.tunables(ctx, "attention", problem, "mma")
        assert (params["warps"], params["m_tiles"], params["kv_tiles"], params["q_tiles"]) == \
            (8, 2, 1, 2)
        assert (params["q_step"], params["k_step"], params["small"]) == (16, 32, "trunc")
        assert params["fused_dq"] and params["round"] == "fast"
    # Causal rows from 2048: two forward tiles per warp, 32-deep backward steps.
    for L in (2048, 8192):
        problem = A.AttentionProblem(64, 64, L, L, "none", True, False)
        params = solver.tunables(ctx, "attention", problem, "mma")
        assert (params["warps"], params["m_tiles"], params["k_step"]) == (8, 2, 32)
        assert (params["q_step"], params["small"], params["fused_dq"]) == (16, "trunc", True)
        assert params["round"] == "fast"


def test_bad_tuning_values(ctx, rng, mma, tuning_rules):
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, warps=3, emulate=1)}])
    q = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 9, 16)))
    with pytest.raises(UnsupportedError, match="warps must be 1, 2, 4 or 8"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, block_n=12, emulate=1)}])
    with pytest.raises(UnsupportedError, match="multiple of 8"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, stages=3, emulate=1)}])
    with pytest.raises(UnsupportedError, match="stages must be 1 or 2"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, presplit=True, stages=2,
                                                            emulate=1)}])
    with pytest.raises(UnsupportedError, match="stages must be 1"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, round="rz", emulate=1)}])
    with pytest.raises(UnsupportedError, match="round must be"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, small="rz", emulate=1)}])
    with pytest.raises(UnsupportedError, match="small must be"):
        F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, round="fast", small="rna",
                                                            emulate=1)}])
    with pytest.raises(UnsupportedError, match="round 'fast' needs small 'trunc'"):
        F.scaled_dot_product_attention(q, q, q)


def _two_tiles(ctx, **extra):
    """The rule of the m_tiles 2 tests: two m16 tiles of query rows per forward warp (SMALL's
    blocks emulated: 2 warps, 64 rows per group), with ``extra``."""
    if real_mma(ctx):
        # presplit takes one stage (the shipped NVIDIA rule has two).
        stages = {"stages": 1} if extra.get("presplit") else {}
        return dict({"solver": "mma", "m_tiles": 2}, **stages, **extra)
    return dict(SMALL, m_tiles=2, **extra)


@pytest.mark.parametrize("qs, ks, vs, kw", [
    # Two groups of 64 rows, the second's last warp with rows in neither tile past row 69;
    # 45 keys (three steps of 16, the last partial).
    ((2, 3, 70, 16), (2, 3, 45, 16), (2, 3, 45, 16), {}),
    ((2, 3, 70, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((1, 2, 45, 16), (1, 2, 29, 16), (1, 2, 29, 16), {"is_causal": True}),     # L > S
    ((1, 2, 29, 16), (1, 2, 83, 16), (1, 2, 83, 16), {"is_causal": True}),     # L < S
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 75, 64), (1, 2, 35, 64), (1, 2, 35, 64), {"is_causal": True}),  # head dim 64
])
def test_two_row_tiles(ctx, rng, mma, tuning_rules, qs, ks, vs, kw):
    """m_tiles 2: each forward warp owns two m16 tiles of query rows (rows g, g + 8 of each),
    every B fragment of k and v read and split once for both; q split at each step."""
    tuning_rules("attention", [{"when": {}, "params": _two_tiles(ctx)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(p["m_tiles"] == 2 and not p["q_split"] for _, p in built)


def test_two_row_tiles_masks(ctx, rng, mma, tuning_rules):
    """m_tiles 2 with a broadcast bool mask (a row with no key, in a warp's second tile), then
    a float mask with rows of no key in either tile."""
    tuning_rules("attention", [{"when": {}, "params": _two_tiles(ctx)}])
    mask = rng.uniform(0, 1, (2, 1, 70, 45)) > 0.3
    mask[0, 0, 19] = False          # warp 0's second tile, row g = 3
    mask[1, 0, 66] = False          # the second group
    out = _check(ctx, rng, (2, 3, 70, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)
    assert np.all(out.numpy()[0, :, 19] == 0) and np.all(out.numpy()[1, :, 66] == 0)
    fmask = random(rng, (70, 45), -2.0, 2.0)
    fmask[4] = -np.inf
    fmask[27] = -np.inf
    out = _check(ctx, rng, (1, 3, 70, 16), (1, 3, 45, 16), (1, 3, 45, 12), mask=fmask)
    assert np.all(out.numpy()[:, :, [4, 27]] == 0)


def test_two_row_tiles_dropout(ctx, rng, mma, tuning_rules):
    """m_tiles 2 with dropout against the host's keep-mask: each tile's rows draw their own
    elements of the (B, L, S) weights; causal, L and S not multiples of the blocks."""
    tuning_rules("attention", [{"when": {}, "params": _two_tiles(ctx)}])
    p, seed, stream = 0.25, 99, 3
    shape_q, shape_k = (2, 2, 70, 16), (2, 2, 53, 16)
    q, k, v = random(rng, shape_q), random(rng, shape_k), random(rng, shape_k)
    g = random(rng, shape_q)
    keep = A.attention_dropout_mask((2, 2), 70, 53, p, seed, stream)
    tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    causal = torch.ones(70, 53, dtype=torch.bool).tril()
    scores = (tq @ tk.transpose(-1, -2) / 4.0).masked_fill(~causal, -np.inf)
    ref = torch.softmax(scores, dim=-1) * torch.tensor(keep) / (1 - p) @ tv
    ref.backward(torch.tensor(g, dtype=torch.float64))
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    built, spy = _plans()
    with spy:
        out = F.scaled_dot_product_attention(*ours, is_causal=True, dropout_p=p, seed=seed,
                                             stream=stream)
    assert built[-1][1]["m_tiles"] == 2
    assert_close(out.numpy(), ref.detach().numpy(), tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, (tq, tk, tv)):
        assert_close(t.grad.numpy(), r.grad.numpy(), tol=TOL)


@pytest.mark.parametrize("extra", [
    {"q_split": True},               # both tiles' q kept split for the whole walk
    {"stages": 2},                   # the tiles' next step copied while this one computes
    {"presplit": True},              # k and v split once when staged, read as parts
    {"warps": 1},                    # a group of one warp (32 rows)
    {"q_frags": False},              # q's fragments read again at each step
])
def test_two_row_tiles_with(ctx, rng, mma, tuning_rules, extra):
    """m_tiles 2 with the forward's other variants, causal with L and S not multiples of
    the blocks, head dims 20 and 13 (neither a multiple of 8)."""
    tuning_rules("attention", [{"when": {}, "params": _two_tiles(ctx, **extra)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (2, 2, 70, 20), (2, 2, 45, 20), (2, 2, 45, 13), is_causal=True)
    params = built[-1][1]
    assert params["m_tiles"] == 2
    assert all(params[key] == value for key, value in extra.items())


def test_q_read_each_step(ctx, rng, mma, tuning_rules):
    """q_frags false with one row tile per warp: q's fragments not kept, read and split at
    each step; a float mask and GQA."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, q_frags=False)}])
    mask = random(rng, (37, 45), -2.0, 2.0)
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (2, 4, 37, 24), (2, 2, 45, 24), (2, 2, 45, 16), mask=mask,
               enable_gqa=True)
    params = built[-1][1]
    assert params["m_tiles"] == 1 and not params["q_frags"] and not params["q_split"]


def test_bad_row_tiles(ctx, rng, mma, tuning_rules):
    q = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 9, 16)))
    for name in ("m_tiles", "kv_tiles", "q_tiles"):
        for bad in (3, 0, True, 2.0, "2"):
            tuning_rules("attention", [{"when": {}, "params": dict(SMALL, emulate=1,
                                                                    **{name: bad})}])
            with pytest.raises(UnsupportedError, match=f"{name} must be 1 or 2"):
                F.scaled_dot_product_attention(q, q, q)
    tuning_rules("attention", [{"when": {}, "params": dict(SMALL, q_frags=False, q_split=True,
                                                            emulate=1)}])
    with pytest.raises(UnsupportedError, match="q_split .* needs q_frags"):
        F.scaled_dot_product_attention(q, q, q)


def _backward_tiles(ctx, **extra):
    """Two m16 tiles per warp in both backward kernels (32 keys per dK/dV warp, 32 query rows
    per dQ warp; SMALL's 2 warps emulated: 64 per group), with ``extra``."""
    return _mma_rule(ctx, **dict({"kv_tiles": 2, "q_tiles": 2}, **extra))


@pytest.mark.parametrize("qs, ks, vs, kw", [
    # Two groups of 64 keys (the second's warps partly past key 69) and of 64 query rows.
    ((2, 3, 70, 16), (2, 3, 70, 16), (2, 3, 70, 16), {}),
    ((2, 3, 70, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((1, 2, 45, 16), (1, 2, 29, 16), (1, 2, 29, 16), {"is_causal": True}),     # L > S
    ((1, 2, 29, 16), (1, 2, 83, 16), (1, 2, 83, 16), {"is_causal": True}),     # L < S
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 75, 64), (1, 2, 71, 64), (1, 2, 71, 64), {"is_causal": True}),  # head dim 64
])
def test_backward_two_tiles(ctx, rng, mma, tuning_rules, qs, ks, vs, kw):
    """kv_tiles / q_tiles 2: each dK/dV warp owns two m16 tiles of keys and each dQ warp two
    of query rows, every staged B fragment (q and dO; k and v) read and split once for both;
    the warps' own fragments read again at each step."""
    tuning_rules("attention", [{"when": {}, "params": _backward_tiles(ctx)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(p["kv_tiles"] == 2 and p["q_tiles"] == 2 and not p["frags_kv"]
                         and not p["frags_q"] for _, p in built)


def test_backward_two_tiles_masks_dropout(ctx, rng, mma, tuning_rules):
    """Two tiles per backward warp with a bool mask (a row with no key, keys no row sees in
    a warp's second tile), then dropout against the host's keep-mask."""
    tuning_rules("attention", [{"when": {}, "params": _backward_tiles(ctx)}])
    mask = rng.uniform(0, 1, (2, 1, 70, 45)) > 0.3
    mask[0, 0, 19] = False          # dQ warp 0's second tile, row g = 3
    mask[1, 0, :, 20] = False       # dK/dV warp 0's second tile, key g = 4
    out = _check(ctx, rng, (2, 3, 70, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)
    assert np.all(out.numpy()[0, :, 19] == 0)
    p, seed, stream = 0.25, 7, 1
    shape_q, shape_k = (2, 2, 70, 16), (2, 2, 53, 16)
    q, k, v = random(rng, shape_q), random(rng, shape_k), random(rng, shape_k)
    g = random(rng, shape_q)
    keep = A.attention_dropout_mask((2, 2), 70, 53, p, seed, stream)
    ref = _dropout_reference(q, k, v, keep, p, g)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream)
    assert_close(out.numpy(), ref[0], tol=TOL)
    out.backward(dp.Tensor.from_numpy(ctx, g))
    for t, r in zip(ours, ref[1:]):
        assert_close(t.grad.numpy(), r, tol=TOL)


@pytest.mark.parametrize("extra", [
    {"frags": True},                 # the warps' own fragments of both tiles in registers
    {"stages": 2},                   # the tiles' next step copied while this one computes
    {"kv_tiles": 1},                 # two tiles in dQ only (dK/dV keeps its fragments)
    {"q_tiles": 1, "kv_warps": 1},   # two tiles in dK/dV only, a group of one warp
])
def test_backward_two_tiles_with(ctx, rng, mma, tuning_rules, extra):
    """Two tiles per backward warp with the other variants, causal with L and S not
    multiples of the blocks, head dims 20 and 13 (neither a multiple of 8)."""
    tuning_rules("attention", [{"when": {}, "params": _backward_tiles(ctx, **extra)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (2, 2, 70, 20), (2, 2, 45, 20), (2, 2, 45, 13), is_causal=True)
    params = built[-1][1]
    assert params["kv_tiles"] == extra.get("kv_tiles", 2)
    assert params["q_tiles"] == extra.get("q_tiles", 2)
    frags = extra.get("frags")
    assert params["frags_kv"] == (params["kv_tiles"] == 1 if frags is None else frags)
    assert params["frags_q"] == (params["q_tiles"] == 1 if frags is None else frags)


@pytest.mark.parametrize("qs, ks, vs, kw", [
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 75, 64), (1, 2, 71, 64), (1, 2, 71, 64), {}),                   # head dim 64
])
@pytest.mark.parametrize("tiles", [{}, {"m_tiles": 2, "kv_tiles": 2, "q_tiles": 2}])
def test_truncated_small_parts(ctx, rng, mma, tuning_rules, qs, ks, vs, kw, tiles):
    """small "trunc": the small TF32 parts left unrounded for the tensor core to truncate (the
    emulation truncates every operand as the tensor core does): still fp32-accurate, in
    every kernel, with one and two tiles per warp."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, small="trunc", **tiles)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(p["small"] == "trunc" for _, p in built)


@pytest.mark.parametrize("qs, ks, vs, kw", [
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 75, 64), (1, 2, 71, 64), (1, 2, 71, 64), {}),                   # head dim 64
])
@pytest.mark.parametrize("tiles", [{}, {"m_tiles": 2, "kv_tiles": 2, "q_tiles": 2},
                                   {"fused_dq": True}])
def test_fast_rounding(ctx, rng, mma, tuning_rules, qs, ks, vs, kw, tiles):
    """round "fast" (big parts rounded without a NaN test; small parts truncated): still
    fp32-accurate in every kernel, with one and two tiles per warp and with dQ fused."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, small="trunc",
                                                                round="fast", **tiles)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(p["round"] == "fast" for _, p in built)


@pytest.mark.parametrize("bits", [0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFF800FFF, 0xFFFFFFFF])
def test_fast_rounding_keeps_nans(ctx, rng, mma, tuning_rules, bits):
    """A NaN in q, k or v (whatever its payload: the fast rounding may turn it into an infinity
    or a zero in the big part) still reaches the rows torch makes NaN, and only those, forward
    and backward."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, small="trunc",
                                                                round="fast")}])
    nan = np.array([bits], dtype=np.uint32).view(np.float32)[0]
    shape = (1, 2, 21, 16)
    for which in range(3):
        arrays = [random(rng, shape) for _ in range(3)]
        arrays[which][0, 1, 5, 3] = nan
        tq, tk, tv = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays)
        g = random(rng, shape)
        expect = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)
        expect.backward(torch.tensor(g, dtype=torch.float64))
        q, k, v = (dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in arrays)
        out = F.scaled_dot_product_attention(q, k, v)
        out.backward(dp.Tensor.from_numpy(ctx, g))
        for ours, theirs in zip([out] + [t.grad for t in (q, k, v)],
                                [expect] + [t.grad for t in (tq, tk, tv)]):
            theirs = theirs.detach().numpy()
            np.testing.assert_array_equal(np.isnan(ours.numpy()), np.isnan(theirs))


@pytest.mark.parametrize("qs, ks, vs, kw", [
    ((2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), {"is_causal": True}),
    ((1, 2, 45, 16), (1, 2, 29, 16), (1, 2, 29, 16), {"is_causal": True}),     # L > S
    ((2, 6, 20, 16), (2, 2, 33, 16), (2, 3, 33, 16), {"enable_gqa": True, "scale": 0.3}),
    ((1, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 16), {}),                    # q broadcast
    ((19, 12), (23, 12), (23, 7), {"scale": 1.7}),                          # 2-d, E % 8 != 0
    ((1, 2, 37, 64), (1, 2, 70, 64), (1, 2, 70, 64), {"is_causal": True}),  # head dim 64
])
@pytest.mark.parametrize("tiles", [{}, {"kv_tiles": 2, "kv_warps": 2}])
def test_fused_dq(ctx, rng, mma, tuning_rules, qs, ks, vs, kw, tiles):
    """fused_dq: dQ computed in the dK/dV kernel (each step's dS through local memory, dQ +=
    dS K over the group's keys, added to a zeroed dq by atomics), the dQ kernel not run."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, fused_dq=True, **tiles)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, qs, ks, vs, **kw)
    assert built and all(p["fused_dq"] for _, p in built)


def test_fused_dq_masks_dropout_and_partial_gradients(ctx, rng, mma, tuning_rules):
    """fused_dq with a bool mask and with dropout against the host's keep-mask; then only q,
    and only k and v, asking for gradients (the dQ kernel, and dK/dV without dQ)."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, fused_dq=True)}])
    mask = rng.uniform(0, 1, (2, 1, 37, 45)) > 0.3
    mask[0, 0, 5] = False
    _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), mask=mask)
    p, seed, stream = 0.25, 5, 2
    shape_q, shape_k = (2, 2, 37, 16), (2, 2, 45, 16)
    q, k, v = random(rng, shape_q), random(rng, shape_k), random(rng, shape_k)
    g = random(rng, shape_q)
    keep = A.attention_dropout_mask((2, 2), 37, 45, p, seed, stream)
    ref = _dropout_reference(q, k, v, keep, p, g)
    for wanted in ((True, True, True), (True, False, False), (False, True, True)):
        ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=w) for a, w in zip((q, k, v), wanted)]
        out = F.scaled_dot_product_attention(*ours, dropout_p=p, seed=seed, stream=stream)
        assert_close(out.numpy(), ref[0], tol=TOL)
        out.backward(dp.Tensor.from_numpy(ctx, g))
        for t, r, w in zip(ours, ref[1:], wanted):
            if w:
                assert_close(t.grad.numpy(), r, tol=TOL)
            else:
                assert t.grad is None


def test_fused_dq_needs_whole_row_tiles(ctx, rng, mma, tuning_rules):
    """fused_dq with steps of 8 query rows (less than an m16 tile): dQ keeps its kernel."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, fused_dq=True, q_step=8)}])
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (1, 2, 21, 16), (1, 2, 30, 16), (1, 2, 30, 16))
    assert built and not built[-1][1]["fused_dq"] and built[-1][1]["q_step"] == 8


def test_fused_dq_where_the_keys_do_not_fit(ctx, rng, mma, tuning_rules, monkeypatch):
    """Where the group's keys and a step's dS do not fit beside the dK/dV kernel's tiles even
    at 8-row steps (head dims 128 / 80 in an H200's 48 KiB), dQ keeps its kernel: such a call
    once raised instead. The local memory of fused_dq is made too large here."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, fused_dq=True)}])
    local = A._mma_local
    monkeypatch.setattr(A, "_mma_local", lambda *args: 1 << 40 if args[7:] and args[7]
                        else local(*args))
    built, spy = _plans()
    with spy:
        _check(ctx, rng, (1, 2, 13, 16), (1, 2, 17, 16), (1, 2, 17, 16))
    assert built and not built[-1][1]["fused_dq"]


def test_deterministic_switch_keeps_the_dq_kernel(ctx, rng, mma, tuning_rules, monkeypatch):
    """DLPRIM_DETERMINISTIC=1: a rule's fused_dq (atomics, run-to-run last bits) is not used;
    the dQ kernel runs."""
    tuning_rules("attention", [{"when": {}, "params": _mma_rule(ctx, fused_dq=True)}])
    monkeypatch.setenv("DLPRIM_DETERMINISTIC", "1")
    dp.config.reload()
    built, spy = _plans()
    with spy:
        out = _check(ctx, rng, (2, 3, 37, 16), (2, 3, 45, 16), (2, 3, 45, 16), is_causal=True)
    assert built and not any(p["fused_dq"] for _, p in built)
    assert out.shape == (2, 3, 37, 16)
