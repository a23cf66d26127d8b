"""The GEMM family on the solver layer: its choices as data (a table made before the solver
layer, tests/data/gemm_selection.json), every solver forced through DLPRIM_GEMM_ALGO and checked
against numpy float64, forced solvers that are unknown or do not apply, tuning databases of
the form before the solver layer, and plans that keep the tuned parameters as given."""
import dataclasses
import json
import os
import types

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import solver, tuning
from dlprim_py.context import PlanCache
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import GemmPlan, GemmProblem

from conftest import assert_close, poisoned, random

TABLE = os.path.join(os.path.dirname(__file__), "data", "gemm_selection.json")


def fake_context(fields):
    """What choosing reads of a context: the device's facts and the memo and plan caches."""
    info = types.SimpleNamespace(**dict(fields, extensions=frozenset(fields["extensions"])))
    return types.SimpleNamespace(info=info, memo={}, plans=PlanCache())


@pytest.fixture(scope="module")
def table():
    with open(TABLE, encoding="utf-8") as f:
        return json.load(f)


def expected(table, index):
    return None if index is None else table["params"][index]


def choice(ctx, M, N, K, batch, algorithm=None):
    try:
        return gemm_ops.select_params(ctx, M, N, K, batch, algorithm)
    except dp.UnsupportedError:
        return None


@pytest.mark.parametrize("device", ["h200", "pocl", "pocl_xeon", "intel_gpu", "amd", "other"])
def test_choices_match_the_table(table, device):
    """Every (shape, forced solver) of the table gets the parameters it lists: NVIDIA H200's
    measured and condition rules with the long-K split, the local PoCL device's vendor rules,
    the shipped PoCL device entry, Intel's subgroup rule, AMD's split rule and the default."""
    ctx = fake_context(table["devices"][device])
    rows = table["rows"][device]
    assert len(rows) > 100
    for M, N, K, batch, algorithm, index in rows:
        assert choice(ctx, M, N, K, batch, algorithm) == expected(table, index), \
            (device, M, N, K, batch, algorithm)


# "mma" (TF32) applies to no problem of the table (TF32 off): test_gemm_tf32.py forces it;
# "gemv" is forced in no row of the table: test_gemm_gemv.py forces it.
@pytest.mark.parametrize("algorithm", [a for a in gemm_ops.ALGORITHMS if a not in ("mma", "gemv")])
def test_forcing_through_the_environment_matches_the_table(table, monkeypatch, algorithm):
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", algorithm)
    dp.config.reload()
    for device in ("h200", "intel_gpu"):
        ctx = fake_context(table["devices"][device])
        rows = [r for r in table["rows"][device] if r[4] == algorithm]
        assert rows
        for M, N, K, batch, _, index in rows:
            assert choice(ctx, M, N, K, batch) == expected(table, index), (device, M, N, K)


def test_tuned_choice_is_the_solver_layers(table):
    """The solver layer's select names the solver of the tuned parameters (but where the
    long-K rule split a tiled rule's K: then the tiled kernel's "splitk")."""
    ctx = fake_context(table["devices"]["h200"])
    for M, N, K, batch in ((4, 4, 4, 1), (512, 512, 512, 1), (32, 1000, 2048, 1),
                           (64, 64, 200704, 1)):
        params = gemm_ops.select_params(ctx, M, N, K, batch)
        chosen = solver.select(ctx, "gemm", GemmProblem(M, N, K, batch)).name
        assert params["solver"] == chosen or (chosen, params["solver"]) == ("tiled", "splitk")
    assert solver.select(ctx, "gemm", GemmProblem(64, 64, 200704)).name == "tiled"
    assert gemm_ops.select_params(ctx, 64, 64, 200704)["solver"] == "splitk"


def test_transformer_shapes_take_their_measured_rules(table):
    """On the H200 a transformer's projections (4096 tokens, width 768, MLP 3072) take the
    64 x 128 tiles measured on them, not the nearest square's 64 x 256; the weight gradient
    its split."""
    ctx = fake_context(table["devices"]["h200"])
    for M, N, K in ((4096, 768, 768), (4096, 3072, 768), (4096, 768, 3072)):
        params = gemm_ops.select_params(ctx, M, N, K)
        assert (params["solver"], params["tile_m"], params["tile_n"]) == ("tiled", 64, 128)
    params = gemm_ops.select_params(ctx, 768, 768, 4096)
    assert (params["solver"], params["split_k"], params["tile_group"]) == ("splitk", 6, 8)


@pytest.mark.parametrize("algorithm", gemm_ops.ALGORITHMS)
def test_every_solver_forced(ctx, rng, monkeypatch, algorithm):
    """Each solver forced through DLPRIM_GEMM_ALGO, against numpy float64 on poisoned outputs:
    odd sizes (edge tiles, scalar loads), a multiple of the tiles, a transposed batch."""
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", algorithm)
    dp.config.reload()
    if algorithm == "subgroup" and not all(e in ctx.info.extensions
                                           for e in gemm_ops.SUBGROUP_EXTENSIONS):
        with pytest.raises(dp.UnsupportedError, match="DLPRIM_GEMM_ALGO=subgroup does not apply"):
            gemm_ops.select_params(ctx, 37, 45, 29)
        pytest.skip("no Intel subgroups here: test_gemm_subgroup.py runs it on Intel's runtime")
    if algorithm == "mma":
        # TF32 is off by default: forced, it is refused; test_gemm_tf32.py runs it.
        with pytest.raises(dp.UnsupportedError, match="DLPRIM_GEMM_ALGO=mma does not apply"):
            gemm_ops.select_params(ctx, 37, 45, 29)
        pytest.skip("TF32 off: test_gemm_tf32.py runs the mma solver")
    if algorithm == "gemv":
        with pytest.raises(dp.UnsupportedError, match="DLPRIM_GEMM_ALGO=gemv does not apply"):
            gemm_ops.select_params(ctx, 37, 45, 29)
        pytest.skip("matrix-vector products only: test_gemm_gemv.py runs the gemv solver")
    for M, N, K in ((37, 45, 29), (64, 64, 64)):
        a, b = random(rng, (M, K)), random(rng, (K, N))
        A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
        C = poisoned(ctx, (M, N))
        plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N)
        plan.enqueue()
        assert plan.solver.name == plan.params["solver"] == algorithm
        assert plan.algorithm == algorithm
        assert_close(C.numpy(), a.astype(np.float64) @ b.astype(np.float64))
    batch, M, N, K = 3, 9, 20, 33
    a, b = random(rng, (batch, K, M)), random(rng, (batch, N, K))
    out = dp.gemm_batched(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b),
                          trans_a=True, trans_b=True)
    ref = np.swapaxes(a.astype(np.float64), 1, 2) @ np.swapaxes(b.astype(np.float64), 1, 2)
    assert_close(out.numpy(), ref)


def test_unknown_or_inapplicable_forced_solver(table, monkeypatch):
    ctx = fake_context(table["devices"]["h200"])
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "winograd")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError,
                       match="unknown GEMM algorithm 'winograd'; known: tiled, splitk, small, "
                             "subgroup"):
        gemm_ops.select_params(ctx, 64, 64, 64)
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "subgroup")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError,
                       match="DLPRIM_GEMM_ALGO=subgroup does not apply to gemm-m64-n64-k64-b1; "
                             "applicable: tiled, splitk, small"):
        gemm_ops.select_params(ctx, 64, 64, 64)
    monkeypatch.delenv("DLPRIM_GEMM_ALGO")
    dp.config.reload()
    # The same solver named by the caller: the message says why.
    with pytest.raises(dp.UnsupportedError,
                       match=r"GEMM algorithm 'subgroup' does not apply to gemm-m64-n64-k64-b1: "
                             r"the subgroup kernel needs \['cl_intel_subgroups', "
                             r"'cl_intel_required_subgroup_size'\].*; applicable: tiled, splitk, "
                             r"small"):
        gemm_ops.select_params(ctx, 64, 64, 64, algorithm="subgroup")
    with pytest.raises(dp.UnsupportedError, match="unknown GEMM algorithm 'direct'"):
        gemm_ops.select_params(ctx, 64, 64, 64, algorithm="direct")
    # Forced parameters must fit the solver they name.
    tiled = dict(gemm_ops.DEFAULT_TILED)
    assert gemm_ops.params_problem(tiled, ctx.info) is None
    assert "splitk solver splits it" in gemm_ops.params_problem(dict(tiled, split_k=3), ctx.info)
    assert "split_k >= 2" in gemm_ops.params_problem(dict(tiled, solver="splitk"), ctx.info)
    assert "unknown solver 'winograd'" in gemm_ops.params_problem(
        dict(tiled, solver="winograd"), ctx.info)
    assert "lack ['lanes', 'group']" in gemm_ops.params_problem(dict(tiled, solver="gemv"),
                                                               ctx.info)
    gemv = dict(gemm_ops.DEFAULT_GEMV)
    assert gemm_ops.params_problem(gemv, ctx.info) is None
    assert "power of two" in gemm_ops.params_problem(dict(gemv, group=6), ctx.info)
    assert "positive int" in gemm_ops.params_problem(dict(gemv, lanes=0), ctx.info)
    assert "> device maximum" in gemm_ops.params_problem(dict(gemv, lanes=512, group=8),
                                                         ctx.info)


def test_solver_form_of_parameters():
    """Parameters of the form before the solver layer name the kernel; "tiled" with a split is
    the "splitk" solver. The solver form passes unchanged, as a copy."""
    tiled = {"kernel": "tiled", "tile_m": 32, "split_k": 1}
    assert gemm_ops.solver_params(tiled) == {"solver": "tiled", "tile_m": 32, "split_k": 1}
    assert gemm_ops.solver_params(dict(tiled, split_k=3))["solver"] == "splitk"
    assert gemm_ops.solver_params({"kernel": "tiled", "tile_m": 16})["solver"] == "tiled"
    assert gemm_ops.solver_params({"kernel": "small", "small_m": 8}) == {"solver": "small",
                                                                         "small_m": 8}
    new = {"solver": "subgroup", "sg_size": 16}
    assert gemm_ops.solver_params(new) == new and gemm_ops.solver_params(new) is not new
    assert tiled == {"kernel": "tiled", "tile_m": 32, "split_k": 1}   # not modified


@pytest.fixture
def user_database(tmp_path, monkeypatch):
    """Writes a user tuning database under a fresh DLPRIM_CACHE_DIR; forgotten afterwards."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    tuning.forget("gemm")

    def write(db):
        tuning.write_db(tuning.user_path("gemm"), db)
        tuning.forget("gemm")
    yield write
    tuning.forget("gemm")   # the next lookup rereads the databases of the restored folder


def test_old_form_user_database_is_read(ctx, user_database):
    """A user database that dlprim-tune wrote before the solver layer ({"kernel": ...}) is read
    as the solver form: its tiled rule with a split is the "splitk" solver's."""
    split = {"kernel": "tiled", "tile_m": 16, "tile_n": 16, "tile_k": 8, "wpt_m": 2, "wpt_n": 2,
             "vec": 2, "pad": 2, "double_buffer": 1, "split_k": 3, "global_vec": 2}
    user_database({"family": "gemm", "format": 1, "devices": {ctx.info.name: {"rules": [
        {"when": {"max_mnk": 1000}, "params": {"kernel": "small", "small_m": 4,
                                                "small_n": 8}},
        {"when": {}, "params": split}]}}})
    fresh = types.SimpleNamespace(info=ctx.info, memo={}, plans=PlanCache())
    assert gemm_ops.select_params(fresh, 8, 8, 8) == {"solver": "small", "small_m": 4,
                                                      "small_n": 8}
    chosen = gemm_ops.select_params(fresh, 40, 40, 96)
    assert chosen == gemm_ops.solver_params(split) and chosen["solver"] == "splitk"
    stored = tuning.read_db(tuning.user_path("gemm"), "gemm")
    assert stored["devices"][ctx.info.name]["rules"][1]["params"]["solver"] == "splitk"


def test_plan_keeps_the_tuned_parameters(ctx, rng):
    """A plan derives its vector widths, split and the like into ``config`` and leaves the
    parameters it was given as they were."""
    params = {"solver": "splitk", "tile_m": 16, "tile_n": 16, "tile_k": 8, "wpt_m": 2,
              "wpt_n": 2, "vec": 2, "pad": 2, "double_buffer": 1, "split_k": 3,
              "global_vec": 2}
    given = dict(params)
    M, N, K = 19, 23, 40    # odd leading dimensions: scalar loads and stores
    a, b = random(rng, (M, K)), random(rng, (K, N))
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N, params=params)
    plan.enqueue()
    assert_close(C.numpy(), a.astype(np.float64) @ b.astype(np.float64))
    assert params == given and plan.params == given
    assert (plan.config.global_vec, plan.config.c_vec) == (1, 1)
    assert plan.config.splits == plan.splits == 3 and plan.config.k_chunk == 16
    assert plan.algorithm == "splitk"
    assert plan.workspace.size >= 4 * 3 * M * N
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.config.splits = 1
    # A K that one chunk covers runs the tiled kernel alone.
    short = GemmPlan(ctx, M, N, 8, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N,
                     params=params)
    assert (short.algorithm, short.splits, short.workspace) == ("tiled", 1, None)


def test_problem_and_family():
    problem = GemmProblem(3, 4, 5, 2)
    assert problem.key() == "gemm-m3-n4-k5-b2"
    assert problem.features() == {"m": 3, "n": 4, "k": 5, "mn": 12, "mnk": 60, "batch": 2,
                                  "tf32": 0, "ab16": 0, "trans_a": False, "trans_b": False}
    transposed = GemmProblem(3, 4, 5, 2, trans_a=True)
    assert transposed.key() == "gemm-m3-n4-k5-b2-ta" and transposed != problem
    assert transposed.features()["trans_a"] is True
    assert problem == GemmProblem(3, 4, 5, 2) and hash(problem) == hash(GemmProblem(3, 4, 5, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.m = 4
    family = solver.family("gemm")
    assert family is gemm_ops.FAMILY and tuple(family.solvers) == gemm_ops.ALGORITHMS
    splitk = family.solver("splitk")
    info = types.SimpleNamespace(is_gpu=False, max_work_group_size=256, local_mem_size=65536,
                                 extensions=frozenset(), name="x", vendor="other",
                                 architecture=None)
    fake = types.SimpleNamespace(info=info, memo={}, plans=PlanCache())
    params = dict(gemm_ops.DEFAULT_TILED, solver="splitk", split_k=4)
    # 4 chunks of K = 256 (16 rows of tiles each): 4 planes of M x N floats per batch entry.
    assert splitk.workspace_size(fake, GemmProblem(10, 20, 256, 2), params) == 4 * 2 * 4 * 200
    assert family.solver("tiled").workspace_size(fake, GemmProblem(10, 20, 256, 2)) == 0
