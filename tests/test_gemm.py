"""GEMM: C = act(alpha * op(A) @ op(B) + beta * C + bias) against numpy float64.

Kernel variants are forced through ``params`` (the tuner's path) so that each is tested on its
own; the shapes are small and few parameter sets are used, since each distinct kernel costs a
compile on PoCL.
"""
import numpy as np
import pyopencl as cl
import pytest
import torch

import dlprim_py as dp
from dlprim_py import tuning
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import GemmPlan, enqueue_gemm
from dlprim_py.tune import main as tune_main, parse_size

from conftest import assert_close, poisoned, random


def tiled(tm, tn, tk, wm, wn, vec, pad, db, gvec, split=1):
    return {"solver": "splitk" if split > 1 else "tiled", "tile_m": tm, "tile_n": tn, "tile_k": tk, "wpt_m": wm,
            "wpt_n": wn, "vec": vec, "pad": pad, "double_buffer": db, "split_k": split,
            "global_vec": gvec}


# Vector loads and stores, double-buffered; and a scalar single-stage one whose work-items
# run in 8 x 4 patches (lanes_n) over tiles taken two rows at a time (tile_group).
TILED = tiled(32, 32, 16, 4, 4, 4, 4, 1, 4)
TILED_SINGLE = dict(tiled(16, 16, 8, 2, 2, 2, 0, 0, 1), lanes_n=8, tile_group=2)
SPLIT = dict(TILED, solver="splitk", split_k=3)
SMALL = {"solver": "small", "small_m": 8, "small_n": 16}


def reference(a, b, trans_a, trans_b, alpha=1.0, beta=0.0, c=None, bias=None, bias_per="n",
              activation=None):
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    a64 = np.swapaxes(a64, -1, -2) if trans_a else a64
    b64 = np.swapaxes(b64, -1, -2) if trans_b else b64
    out = alpha * (a64 @ b64)
    if beta != 0:
        out = out + beta * c.astype(np.float64)
    if bias is not None:
        out = out + (bias[:, None] if bias_per == "m" else bias).astype(np.float64)
    if activation == "relu":
        out = np.maximum(out, 0)
    elif activation == "gelu":
        out = torch.nn.functional.gelu(torch.from_numpy(out)).numpy()
    elif activation is not None:
        raise AssertionError(activation)
    return out


def operands(rng, M, N, K, trans_a, trans_b, batch=None):
    lead = () if batch is None else (batch,)
    a = random(rng, lead + ((K, M) if trans_a else (M, K)))
    b = random(rng, lead + ((N, K) if trans_b else (K, N)))
    return a, b


def run_params(ctx, params, a, b, M, N, K, trans_a=False, trans_b=False, **kwargs):
    """Run one forced kernel on fresh device copies; C poisoned unless beta reads it."""
    A = dp.Tensor.from_numpy(ctx, a)
    B = dp.Tensor.from_numpy(ctx, b)
    c0 = kwargs.pop("c", None)
    C = dp.Tensor.from_numpy(ctx, c0) if c0 is not None else poisoned(ctx, (M, N))
    bias = kwargs.pop("bias", None)
    if bias is not None:
        kwargs["bias_buf"] = dp.Tensor.from_numpy(ctx, bias).buffer
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, a.shape[-1], B.buffer, 0, b.shape[-1],
                    C.buffer, 0, N, trans_a=trans_a, trans_b=trans_b, params=params, **kwargs)
    plan.enqueue()
    return C.numpy(), plan


# ---- every kernel variant, on its own ---------------------------------------------------------

# M, N, K: non-multiples of the tiles, tiny, tall-skinny, K = 1, a long K.
SHAPES = [(1, 1, 1), (3, 5, 1), (37, 45, 29), (33, 1, 70), (1, 50, 33), (70, 9, 130),
          (64, 64, 64)]


@pytest.mark.parametrize("params", [TILED, TILED_SINGLE, SPLIT, SMALL],
                         ids=["tiled", "tiled-single-stage", "splitk", "small"])
def test_variants_random_shapes(ctx, rng, params):
    # (64, 64, 64) takes the vector-load path of TILED and SPLIT; the odd shapes the scalar one.
    for M, N, K in SHAPES if params is not TILED_SINGLE else SHAPES[:-1]:
        a, b = operands(rng, M, N, K, False, False)
        out, plan = run_params(ctx, params, a, b, M, N, K)
        assert_close(out, reference(a, b, False, False))
    if params["solver"] == "splitk":
        assert plan.algorithm == "splitk"


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (True, True)])
def test_transposes_tiled(ctx, rng, trans_a, trans_b):
    # Multiples of 4 that are not multiples of the tile: vector loads with edge tiles.
    for M, N, K in ((36, 44, 40), (64, 32, 24), (4, 8, 4)):
        a, b = operands(rng, M, N, K, trans_a, trans_b)
        out, plan = run_params(ctx, TILED, a, b, M, N, K, trans_a, trans_b)
        assert plan.config.global_vec == 4
        assert_close(out, reference(a, b, trans_a, trans_b))
    if trans_a and trans_b:
        # Odd sizes: scalar loads (the same guards serve every transpose combination).
        a, b = operands(rng, 19, 23, 17, trans_a, trans_b)
        out, plan = run_params(ctx, TILED, a, b, 19, 23, 17, trans_a, trans_b)
        assert plan.config.global_vec == 1
        assert_close(out, reference(a, b, trans_a, trans_b))


@pytest.mark.parametrize("trans_a,trans_b", [(True, True)])
def test_transposes_small(ctx, rng, trans_a, trans_b):
    for M, N, K in ((7, 5, 3), (20, 33, 18)):
        a, b = operands(rng, M, N, K, trans_a, trans_b)
        out, _ = run_params(ctx, SMALL, a, b, M, N, K, trans_a, trans_b)
        assert_close(out, reference(a, b, trans_a, trans_b))


def test_alpha_beta(ctx, rng):
    M, N, K = 36, 40, 20
    a, b = operands(rng, M, N, K, False, False)
    c = random(rng, (M, N))
    for params in (TILED, SMALL, SPLIT):
        out, _ = run_params(ctx, params, a, b, M, N, K, alpha=-0.75, beta=1.5, c=c)
        assert_close(out, reference(a, b, False, False, -0.75, 1.5, c))


def test_beta_zero_does_not_read_c(ctx, rng):
    # C starts as NaN: any read of it with beta == 0 would leak NaN into the result.
    M, N, K = 40, 36, 12
    a, b = operands(rng, M, N, K, False, False)
    for params in (TILED, SMALL, SPLIT):
        out, _ = run_params(ctx, params, a, b, M, N, K, alpha=2.0, beta=0.0)
        assert_close(out, reference(a, b, False, False, 2.0))


@pytest.mark.parametrize("params,cases", [
    (TILED, (("m", "gelu"),)),
    (SMALL, (("n", "relu"),)),
    (SPLIT, (("n", "relu"),))], ids=["tiled", "small", "splitk"])
def test_bias_activation_epilogue(ctx, rng, params, cases):
    M, N, K = 36, 44, 24
    a, b = operands(rng, M, N, K, False, False)
    c = random(rng, (M, N))
    for bias_per, activation in cases:
        bias = random(rng, N if bias_per == "n" else M)
        out, _ = run_params(ctx, params, a, b, M, N, K, alpha=1.25, beta=0.5, c=c, bias=bias,
                            bias_per=bias_per, activation=activation)
        assert_close(out, reference(a, b, False, False, 1.25, 0.5, c, bias, bias_per,
                                    activation))


def test_activation_descriptor_in_epilogue(ctx, rng):
    M, N, K = 9, 13, 7
    a, b = operands(rng, M, N, K, False, False)
    desc = dp.ActivationDesc("relu")
    out, _ = run_params(ctx, SMALL, a, b, M, N, K, activation=desc)
    assert_close(out, reference(a, b, False, False, activation="relu"))


def test_offsets_and_leading_dimensions(ctx, rng):
    """Sub-matrices of larger buffers, at element offsets, with padded rows."""
    M, N, K = 21, 18, 15
    lda, ldb, ldc = K + 3, N + 5, N + 2
    a_off, b_off, c_off, bias_off = 7, 3, 11, 5
    a_store = random(rng, a_off + M * lda)
    b_store = random(rng, b_off + K * ldb)
    bias_store = random(rng, bias_off + N)
    c_store = np.full(c_off + M * ldc, np.nan, np.float32)
    a = a_store[a_off:].reshape(M, lda)[:, :K]
    b = b_store[b_off:].reshape(K, ldb)[:, :N]
    bias = bias_store[bias_off:]
    for params in (TILED, SMALL, SPLIT):
        A, B, C, Bias = (dp.Tensor.from_numpy(ctx, x) for x in (a_store, b_store, c_store,
                                                                  bias_store))
        # The bias (with its offset) rides on the small kernel's epilogue test variant.
        epilogue = dict(bias_buf=Bias.buffer, bias_off=bias_off, activation="relu") \
            if params is SMALL else {}
        enqueue_gemm(ctx, M, N, K, A.buffer, a_off, lda, B.buffer, b_off, ldb, C.buffer, c_off,
                     ldc, params=params, **epilogue)
        got = C.numpy()
        out = got[c_off:].reshape(M, ldc)
        expected = reference(a, b, False, False, bias=bias, activation="relu") if epilogue \
            else reference(a, b, False, False)
        assert_close(out[:, :N], expected)
        # Nothing outside the C matrix was written.
        assert np.isnan(got[:c_off]).all() and np.isnan(out[:, N:]).all()


def test_tensor_offsets(ctx, rng):
    """Tensors that start inside a buffer (offset_elements != 0)."""
    M, N, K = 12, 20, 8
    a, b = operands(rng, M, N, K, False, False)
    pool = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, 5), a.ravel(), b.ravel()]))
    A = dp.Tensor(ctx, pool.buffer, (M, K), offset=pool.offset + 5 * 4)
    B = dp.Tensor(ctx, pool.buffer, (K, N), offset=pool.offset + (5 + M * K) * 4)
    assert_close(dp.gemm(A, B, algorithm="small").numpy(), reference(a, b, False, False))


# ---- tensor API, batched, selection -------------------------------------------------------

@pytest.mark.parametrize("algorithm", [None, "small"])
def test_gemm_tensor_api(ctx, rng, algorithm):
    M, N, K = 40, 28, 96
    for trans_a, trans_b in ((False, False),):
        a, b = operands(rng, M, N, K, trans_a, trans_b)
        c = random(rng, (M, N))
        C = dp.Tensor.from_numpy(ctx, c)
        out = dp.gemm(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b), C, alpha=0.5,
                      beta=-1.0, trans_a=trans_a, trans_b=trans_b, algorithm=algorithm)
        assert out is C
        assert_close(out.numpy(), reference(a, b, trans_a, trans_b, 0.5, -1.0, c))
        bias = random(rng, N)
        out = dp.gemm(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                      bias=dp.Tensor.from_numpy(ctx, bias), activation="relu", algorithm="small")
        assert_close(out.numpy(), reference(a, b, trans_a, trans_b, bias=bias,
                                            activation="relu"))


def test_gemm_batched(ctx, rng):
    batch, M, N, K = 3, 13, 10, 9
    a, b = operands(rng, M, N, K, True, True, batch=batch)
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                          trans_a=True, trans_b=True, algorithm="small")
    assert out.shape == (batch, M, N)
    assert_close(out.numpy(), reference(a, b, True, True))
    # A batch of one shares its matrix (stride 0) across the other operand's batch.
    a, _ = operands(rng, M, N, K, False, False, batch=batch)
    shared = random(rng, (1, K, N))
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, shared),
                          algorithm="small")
    assert_close(out.numpy(), reference(a, np.broadcast_to(shared, (batch, K, N)), False, False))


@pytest.mark.parametrize("params", [TILED, SMALL, SPLIT], ids=["tiled", "small", "splitk"])
def test_batched_kernel_level(ctx, rng, params):
    batch, M, N, K = 4, 20, 12, 36
    a, b = operands(rng, M, N, K, False, False, batch=batch)
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (batch, M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N, batch=batch,
                    stride_a=M * K, stride_b=K * N, stride_c=M * N, params=params)
    plan.enqueue()
    plan.enqueue()  # a plan enqueues again with the arguments bound once
    assert_close(C.numpy(), reference(a, b, False, False))


@pytest.mark.parametrize("N,reduce", [(44, "gemm_splitk_reduce4"), (45, "gemm_splitk_reduce")])
def test_split_reduce_four_columns_an_item(ctx, rng, N, reduce):
    # N a multiple of 4: the chunks are added four columns an item (float4 loads); batched,
    # ragged rows, alpha, beta, a bias and an activation in both kernels.
    batch, M, K = 2, 37, 127
    a, b = operands(rng, M, N, K, False, True, batch=batch)
    c, bias = random(rng, (batch, M, N)), random(rng, (N,))
    A, B, C = (dp.Tensor.from_numpy(ctx, x) for x in (a, b, c))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, K, C.buffer, 0, N, batch=batch,
                    stride_a=M * K, stride_b=N * K, stride_c=M * N, trans_b=True, alpha=0.5,
                    beta=-1.25, bias_buf=dp.Tensor.from_numpy(ctx, bias).buffer,
                    activation="relu", params=dict(SPLIT, split_k=4))
    assert plan.splits == 4
    assert [k.kernel.function_name for k, *_ in plan._launches] == ["gemm_tiled", reduce]
    plan.enqueue()
    expect = np.maximum(reference(a, b, False, True, 0.5, -1.25, c, bias), 0)
    assert_close(C.numpy(), expect)


def test_forced_algorithm_from_environment(ctx, monkeypatch):
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "small")
    dp.config.reload()
    assert gemm_ops.select_params(ctx, 300, 300, 300)["solver"] == "small"
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "splitk")
    dp.config.reload()
    params = gemm_ops.select_params(ctx, 300, 300, 300)
    assert params["solver"] == "splitk" and params["split_k"] > 1
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "tiled")
    dp.config.reload()
    params = gemm_ops.select_params(ctx, 300, 300, 300)
    assert params["solver"] == "tiled" and params["split_k"] == 1


def test_selection_comes_from_database(ctx):
    small = gemm_ops.select_params(ctx, 4, 4, 4)
    big = gemm_ops.select_params(ctx, 512, 512, 512)
    for params in (small, big):
        assert gemm_ops.params_problem(params, ctx.info) is None
    assert gemm_ops.select_params(ctx, 512, 512, 512, algorithm="small")["solver"] == "small"
    assert gemm_ops.select_params(ctx, 512, 512, 512, algorithm="splitk")["split_k"] > 1


def test_tuning_lookup_order(tmp_path):
    class Info:
        name = "Some Device"
        vendor = "amd"
    rules = {"m": [{"shape": {"m": 64, "n": 64, "k": 64}, "params": {"id": "small"}},
                   {"shape": {"m": 4096, "n": 4096, "k": 4096}, "params": {"id": "big"}}]}
    features = gemm_ops.features(3000, 3000, 2000)
    assert tuning.choose(rules["m"], features) == {"id": "big"}
    assert tuning.choose(rules["m"], gemm_ops.features(50, 40, 90)) == {"id": "small"}
    when = [{"when": {"max_mnk": 1000}, "params": {"id": "tiny"}}] + rules["m"]
    assert tuning.choose(when, gemm_ops.features(5, 5, 5)) == {"id": "tiny"}
    # Device entry before vendor entry before default.
    params, where = tuning.lookup(Info, "gemm", features)
    assert where == "vendor"
    Info.vendor = "nobody"
    params, where = tuning.lookup(Info, "gemm", features)
    assert where == "default" and params["solver"] in ("tiled", "small")


def test_measured_rules_for_a_transposed_form():
    """A measured rule may name the operands' form: among rules of the same shape the one
    measured on the problem's form wins; a shape without the flags was measured on A x B; a
    mismatched form counts as much as a factor of two in one size."""
    rules = [{"shape": {"m": 768, "n": 768, "k": 4096}, "params": {"id": "nn"}},
             {"shape": {"m": 768, "n": 768, "k": 4096, "trans_a": True}, "params": {"id": "tn"}},
             {"shape": {"m": 768, "n": 768, "k": 4096, "trans_b": True}, "params": {"id": "nt"}}]
    form = {(False, False): "nn", (True, False): "tn", (False, True): "nt"}
    for (ta, tb), name in form.items():
        for order in (rules, rules[::-1]):
            assert tuning.choose(order, gemm_ops.features(768, 768, 4096, trans_a=ta,
                                                          trans_b=tb)) == {"id": name}
    # Both transposed: each rule is one mismatch away but "nn" two; the first of equals wins.
    assert tuning.choose(rules, gemm_ops.features(768, 768, 4096, trans_a=True,
                                                  trans_b=True)) == {"id": "tn"}
    # A size four times off outweighs the form: the nearer shape wins.
    near = [{"shape": {"m": 768, "n": 768, "k": 4096}, "params": {"id": "near"}},
            {"shape": {"m": 3072, "n": 768, "k": 4096, "trans_a": True}, "params": {"id": "far"}}]
    assert tuning.choose(near, gemm_ops.features(768, 768, 4096, trans_a=True)) == {"id": "near"}
    # Condition rules may test the form too.
    when = [{"when": {"trans_a": 1}, "params": {"id": "cond"}}] + rules
    assert tuning.choose(when, gemm_ops.features(7, 7, 7, trans_a=True)) == {"id": "cond"}
    assert tuning.choose(when, gemm_ops.features(768, 768, 4096)) == {"id": "nn"}


def test_tuner_writes_verified_entry(ctx, tmp_path, monkeypatch):
    monkeypatch.setattr("dlprim_py.tune.gemm_candidates",
                        lambda info, space="quick": [dict(TILED_SINGLE), dict(SMALL)])
    out = tmp_path / "gemm.json"
    report = tmp_path / "report.json"
    assert tune_main(["gemm", "--sizes", "23x19x11", "--budget", "20", "--output", str(out),
                      "--report", str(report)]) == 0
    db = tuning.read_db(out, "gemm")
    entry = db["devices"][ctx.info.name]
    assert entry["vendor"] == ctx.info.vendor
    (rule,) = entry["rules"]
    assert rule["shape"] == {"m": 23, "n": 19, "k": 11}
    assert rule["params"]["solver"] in ("tiled", "small") and rule["ms"] > 0
    assert parse_size("1024") == (1024, 1024, 1024) and parse_size("2x3x4") == (2, 3, 4)
    # --merge: a second size keeps the first size's rule; the same size again replaces it.
    assert tune_main(["gemm", "--sizes", "9x7x5", "--budget", "5", "--output", str(out),
                      "--merge"]) == 0
    assert tune_main(["gemm", "--sizes", "23x19x11", "--budget", "5", "--output", str(out),
                      "--merge"]) == 0
    rules = tuning.read_db(out, "gemm")["devices"][ctx.info.name]["rules"]
    assert sorted((r["shape"]["m"], r["shape"]["n"]) for r in rules) == [(9, 7), (23, 19)]


def test_tuner_split_candidates():
    """Long-K shapes get split-K candidates, on a GPU also the long-K rule's own count."""
    from dlprim_py.tune import _with_splits

    class Info:
        is_gpu, compute_units = True, 132
        name, vendor = "a GPU", "nvidia"

    base = [dict(TILED), dict(SMALL)]
    found = {p.get("split_k", 1) for p in _with_splits(base, 64, 64, 64 * 3136, Info)}
    assert {1, 4, 8, 16, 196} <= found
    assert _with_splits(base, 64, 64, 512, Info) == base       # short K: no splits
    assert 196 not in {p.get("split_k", 1) for p in _with_splits(base, 64, 64, 64 * 3136)}


def test_tuner_rejects_wrong_candidates(ctx, monkeypatch):
    """A candidate whose result differs from the reference is never timed or chosen."""
    from dlprim_py import tune
    broken = dict(TILED_SINGLE)
    real_plan = tune._Problem.plan

    class WrongPlan:
        def __init__(self, plan, problem):
            self.plan, self.problem = plan, problem

        def enqueue(self):
            event = self.plan.enqueue()
            M, N, _ = self.problem.shape
            # Corrupt one element of the result after the kernel.
            cl.enqueue_fill_buffer(ctx.queue, self.problem.c_buf, np.float32(5.0), 4 * (M * N - 1), 4)
            return event

    def plan(self, params):
        real = real_plan(self, params)
        return WrongPlan(real, self) if params is broken else real

    monkeypatch.setattr(tune._Problem, "plan", plan)
    monkeypatch.setattr(tune, "gemm_candidates", lambda info, space="quick": [broken, dict(SMALL)])
    rules, report = tune.tune_gemm(ctx, [(16, 12, 8)], budget=20, log=lambda s: None)
    (tried,) = [entry for entry in report if entry["params"] == broken]
    assert "differs" in tried["rejected"] and "ms" not in tried
    assert rules[0]["params"]["solver"] == "small"


@pytest.mark.parametrize("timer", ["coarse", "placeholder"])
def test_tuner_times_below_timer_resolution(ctx, monkeypatch, timer):
    """A tiny GEMM is timed in batches long enough for the timer to measure, divided by the
    batch: a profiling timer of 5 ms steps (one run alone reads 0) gives a time above zero;
    one whose span is the same whatever the work (placeholder timestamps) gives way to
    wall-clock. Probing stays short either way."""
    from dlprim_py import tune
    from dlprim_py.timing import Timing, time_enqueued

    runs = []

    def fake_timer(ctx, run, warmup=3, repeat=20, wall_clock=False, **kwargs):
        def counted():
            runs.append(1)
            run()
        timing = time_enqueued(ctx, counted, warmup=warmup, repeat=repeat, wall_clock=True)
        if wall_clock:
            return timing
        if timer == "coarse":
            return Timing(np.floor(timing.samples / 5e-3) * 5e-3)
        return Timing(np.full(len(timing.samples), 1e-9))

    monkeypatch.setattr(tune, "time_enqueued", fake_timer)
    problem = tune._Problem(ctx, 23, 19, 11, np.random.default_rng(0))
    try:
        plan = problem.plan(dict(SMALL))
        seconds, batch, used = tune.time_per_run(ctx, plan.enqueue, sample_time=0.05)
    finally:
        problem.release()
    assert 0 < seconds < 1
    assert used == ("profiling" if timer == "coarse" else "wall clock")
    if timer == "coarse":
        assert batch > 1
    assert len(runs) <= 4 * tune.MAX_BATCH


# ---- bad input ----------------------------------------------------------------------------

def test_inner_dimension_mismatch(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    b = dp.Tensor.from_numpy(ctx, random(rng, (6, 3)))
    with pytest.raises(dp.ShapeError, match="inner dimensions"):
        dp.gemm(a, b)
    with pytest.raises(dp.ShapeError, match="inner dimensions"):
        dp.gemm(a, b, trans_b=True)


def test_wrong_dtype(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    b = dp.Tensor.from_numpy(ctx, np.ones((5, 3), np.int32))
    with pytest.raises(dp.DTypeError, match="float32"):
        dp.gemm(a, b)
    with pytest.raises(dp.DTypeError):
        dp.gemm(a, random(rng, (5, 3)))  # numpy array, not a Tensor
    with pytest.raises(dp.DTypeError, match="float32"):
        enqueue_gemm(ctx, 4, 3, 5, a.buffer, 0, 5, a.buffer, 0, 3, a.buffer, 0, 3,
                     dtype=np.int32)
    ok = dp.Tensor.from_numpy(ctx, random(rng, (5, 3)))
    with pytest.raises(dp.DTypeError, match="alpha must be a real number"):
        dp.gemm(a, ok, alpha="a")
    with pytest.raises(dp.DTypeError, match="beta must be a real number"):
        dp.gemm_batched(dp.Tensor.from_numpy(ctx, random(rng, (1, 4, 5))),
                        dp.Tensor.from_numpy(ctx, random(rng, (1, 5, 3))), beta=None)


def test_buffer_too_small_for_leading_dimension_and_offset(ctx, rng):
    mf = cl.mem_flags
    buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=random(rng, 100))
    big = cl.Buffer(ctx.cl_context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=random(rng, 1000))
    # 10 x 10 with lda 10 fits exactly at offset 0, not at offset 1 nor with lda 11.
    GemmPlan(ctx, 10, 10, 10, buf, 0, 10, big, 0, 10, big, 0, 10, params=SMALL)
    with pytest.raises(dp.ShapeError, match="A buffer holds 100 elements"):
        GemmPlan(ctx, 10, 10, 10, buf, 1, 10, big, 0, 10, big, 0, 10, params=SMALL)
    with pytest.raises(dp.ShapeError, match="needs 109"):
        GemmPlan(ctx, 10, 10, 10, buf, 0, 11, big, 0, 10, big, 0, 10, params=SMALL)
    with pytest.raises(dp.ShapeError, match="C buffer"):
        GemmPlan(ctx, 10, 10, 10, big, 0, 10, big, 0, 10, buf, 0, 10, batch=2, stride_c=100,
                 params=SMALL)
    with pytest.raises(dp.ShapeError, match="leading dimension of B"):
        GemmPlan(ctx, 10, 10, 10, big, 0, 10, big, 0, 9, big, 0, 10, params=SMALL)
    with pytest.raises(dp.ShapeError, match="bias buffer"):
        GemmPlan(ctx, 10, 10, 10, big, 0, 10, big, 0, 10, big, 0, 10, bias_buf=buf,
                 bias_off=95, params=SMALL)
    with pytest.raises(dp.ShapeError, match="M must be"):
        GemmPlan(ctx, 0, 10, 10, big, 0, 10, big, 0, 10, big, 0, 10)
    with pytest.raises(dp.ShapeError, match="overlap"):
        GemmPlan(ctx, 10, 10, 10, big, 0, 10, big, 0, 10, big, 0, 10, batch=2, stride_c=50)


def test_bad_tensor_arguments(ctx, rng):
    a = dp.Tensor.from_numpy(ctx, random(rng, (4, 5)))
    b = dp.Tensor.from_numpy(ctx, random(rng, (5, 3)))
    with pytest.raises(dp.ShapeError, match="c must have shape"):
        dp.gemm(a, b, dp.Tensor.from_numpy(ctx, random(rng, (3, 4))), beta=1.0)
    with pytest.raises(dp.ShapeError, match="needs c"):
        dp.gemm(a, b, beta=1.0)
    with pytest.raises(dp.ShapeError, match="bias must have shape"):
        dp.gemm(a, b, bias=dp.Tensor.from_numpy(ctx, random(rng, 4)))
    with pytest.raises(dp.ShapeError, match="2-d"):
        dp.gemm(a.reshape(20), b)
    with pytest.raises(dp.ShapeError, match="batch sizes"):
        dp.gemm_batched(dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 5))),
                        dp.Tensor.from_numpy(ctx, random(rng, (3, 5, 3))))
    with pytest.raises(dp.UnsupportedError, match="algorithm"):
        dp.gemm(a, b, algorithm="winograd")
    with pytest.raises(dp.UnsupportedError, match="do not run here"):
        GemmPlan(ctx, 4, 3, 5, a.buffer, 0, 5, b.buffer, 0, 3, b.buffer, 0, 3,
                 params=dict(TILED, wpt_m=3))
    with pytest.raises(dp.UnsupportedError):
        dp.gemm(a, b, activation="no-such-activation")


def test_gemm_with_an_activation_descriptor(ctx, rng):
    """An ActivationDesc (as the fusion API and dp.onnx pass it) works as a name does."""
    a, b = random(rng, (5, 7)), random(rng, (7, 3))
    bias = random(rng, (3,))
    at, bt, biast = (dp.Tensor.from_numpy(ctx, v) for v in (a, b, bias))
    for activation in (dp.ActivationDesc("relu"), dp.ActivationDesc("leakyrelu", alpha=0.2)):
        ref = a.astype(np.float64) @ b + bias
        ref = np.where(ref > 0, ref, 0.0 if activation.alpha == 0 else activation.alpha * ref)
        out = dp.gemm(at, bt, bias=biast, activation=activation).numpy()
        assert_close(out, ref)
