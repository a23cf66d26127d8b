"""The solver layer's families of the small operators (reduce, reduce_partials, softmax, pool,
dropout, pointwise, copy): every solver forced through its DLPRIM_<FAMILY>_ALGO switch against a
float64 reference, unknown and inapplicable forced solvers refused, and choices and tuning
values that follow the tuning databases' rules."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from dlprim_py import solver, tuning
from dlprim_py.ops import dropout as D, reduce as R, softmax as S, tensor_ops as T
from dlprim_py.ops.pointwise import PointwiseKernel

from conftest import assert_close, poisoned, random

F = dp.functional


def _force(monkeypatch, family, name):
    monkeypatch.setenv(f"DLPRIM_{family.upper()}_ALGO", name)
    dp.config.reload()


def _offset(ctx, data, offset):
    """A tensor holding ``data`` at ``offset`` elements into its buffer."""
    whole = dp.Tensor.from_numpy(ctx, np.concatenate([np.zeros(offset, np.float32), data.ravel()]))
    return dp.Tensor(ctx, whole.buffer, data.shape, offset=whole.offset + 4 * offset)


def test_every_family_is_registered():
    for name, solvers in (("reduce", {"group", "item", "columns"}),
                          ("reduce_partials", {"last_group", "launch"}),
                          ("softmax", {"row", "column"}), ("pool", {"window", "plane"}),
                          ("dropout", {"vector", "scalar"}), ("pointwise", {"scalar", "vector"}),
                          ("copy", {"gather", "tiles"})):
        assert set(solver.family(name).solvers) == solvers


# ---- each solver forced, against float64 ---------------------------------------------------

@pytest.mark.parametrize("name", ["row", "column"])
def test_softmax_forced(ctx, rng, monkeypatch, name):
    _force(monkeypatch, "softmax", name)
    for shape, dim in (((7, 300), 1), ((4, 9, 5), 1)):
        a = random(rng, shape, -5, 5)
        x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
        t = torch.tensor(a.astype(np.float64), requires_grad=True)
        y, ref = F.log_softmax(x, dim), torch.log_softmax(t, dim)
        assert_close(y.numpy(), ref.detach().numpy())
        g = random(rng, shape)
        y.backward(dp.Tensor.from_numpy(ctx, g))
        ref.backward(torch.tensor(g.astype(np.float64)))
        assert_close(x.grad.numpy(), t.grad.numpy())
        assert S._plan(ctx, True, shape[dim], int(np.prod(shape[dim + 1:])), a.size, None,
                       None).variant == name


@pytest.mark.parametrize("name", ["vector", "scalar"])
def test_dropout_forced(ctx, rng, monkeypatch, name):
    _force(monkeypatch, "dropout", name)
    for n in (4103, 8):
        a = random(rng, n, 0.5, 1.0)
        x = dp.Tensor.from_numpy(ctx, a)
        assert D.choose_algorithm(x, x) == name
        y = F.dropout(x, 0.3, seed=11, stream=2).numpy()
        keep = D.reference_mask(n, 0.3, 11, 2)
        assert_close(y, np.where(keep, a.astype(np.float64) / 0.7, 0.0), tol=1e-7)


@pytest.mark.parametrize("name", ["scalar", "vector"])
def test_pointwise_forced(ctx, rng, monkeypatch, name):
    _force(monkeypatch, "pointwise", name)
    a, b = random(rng, (6, 5, 8)), random(rng, (5, 8))
    out = F.add(dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b))
    assert_close(out.numpy(), a.astype(np.float64) + b)
    assert_close(F.relu(dp.Tensor.from_numpy(ctx, a)).numpy(), np.maximum(a.astype(np.float64), 0))


@pytest.mark.parametrize("name", ["gather", "tiles"])
def test_copy_forced_transpose(ctx, rng, monkeypatch, name):
    _force(monkeypatch, "copy", name)
    a = random(rng, (3, 40, 33))
    assert_close(F.permute(dp.Tensor.from_numpy(ctx, a), (0, 2, 1)).numpy(),
                 a.astype(np.float64).transpose(0, 2, 1))


@pytest.mark.parametrize("name", ["window", "plane"])
def test_pool_forced(ctx, rng, monkeypatch, name):
    _force(monkeypatch, "pool", name)
    a = random(rng, (2, 3, 6, 5))
    x = dp.Tensor.from_numpy(ctx, a)
    t = torch.tensor(a.astype(np.float64))
    assert_close(F.avg_pool2d(x, (6, 5)).numpy(), TF.avg_pool2d(t, (6, 5)).numpy())
    assert_close(F.adaptive_max_pool2d(x, 1).numpy(), TF.adaptive_max_pool2d(t, 1).numpy())


# ---- unknown and inapplicable forced solvers ---------------------------------------------

@pytest.mark.parametrize("family, call", [
    ("reduce", lambda ctx: F.sum(dp.Tensor.zeros(ctx, (3, 4)), 1)),
    ("reduce_partials", lambda ctx: F.sum(dp.Tensor.zeros(ctx, (3, 4)))),
    ("softmax", lambda ctx: F.softmax(dp.Tensor.zeros(ctx, (3, 4)), 1)),
    ("pool", lambda ctx: F.max_pool2d(dp.Tensor.zeros(ctx, (1, 2, 4, 4)), 2)),
    ("dropout", lambda ctx: F.dropout(dp.Tensor.zeros(ctx, (8,)), 0.5, seed=1)),
    ("pointwise", lambda ctx: F.relu(dp.Tensor.zeros(ctx, (8,)))),
    ("copy", lambda ctx: F.permute(dp.Tensor.zeros(ctx, (3, 4)), (1, 0))),
])
def test_unknown_forced_solver(ctx, monkeypatch, family, call):
    _force(monkeypatch, family, "no_such_solver")
    with pytest.raises(dp.UnsupportedError, match="no_such_solver"):
        call(ctx)


def test_inapplicable_forced_solvers(ctx, rng, monkeypatch):
    x = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 6, 6)))
    _force(monkeypatch, "pool", "plane")
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_POOL_ALGO=plane does not apply"):
        F.max_pool2d(x, 3)
    _force(monkeypatch, "copy", "tiles")
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_COPY_ALGO=tiles does not apply"):
        F.narrow(x, 3, 1, 4)
    _force(monkeypatch, "dropout", "vector")
    shifted = _offset(ctx, random(rng, 16), 1)
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_DROPOUT_ALGO=vector does not apply"):
        F.dropout(shifted, 0.5, seed=3)
    _force(monkeypatch, "pointwise", "vector")
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_POINTWISE_ALGO=vector does not apply"):
        F.relu(shifted)


def test_pointwise_keyword_vector_falls_back_where_it_does_not_apply(ctx, rng):
    """The keyword's contract (unlike the switch): vector where it applies, else scalar."""
    a = random(rng, 17)
    y = poisoned(ctx, (17,))
    copy = PointwiseKernel("solver_test_copy", [("x", np.float32)], [("y", np.float32)], "y = x;")
    copy([_offset(ctx, a, 1)], [y], algorithm="vector")
    assert_close(y.numpy(), a.astype(np.float64))


# ---- rules as data -----------------------------------------------------------------------

def test_a_rule_chooses_the_solver(ctx, rng, tuning_rules):
    """A device rule of a user database puts the column solver on the last dimension and the
    gather on a transposition; the results stay right."""
    a = random(rng, (5, 40), -3, 3)
    assert S.choose_variant(1, ctx=ctx, size=40) == "row"
    tuning_rules("softmax", [{"when": {"min_size": 16}, "params": {"solver": "column"}}])
    assert S.choose_variant(1, ctx=ctx, size=40) == "column"
    assert S.choose_variant(1, ctx=ctx, size=8) == "row"
    assert_close(F.softmax(dp.Tensor.from_numpy(ctx, a), 1).numpy(),
                 torch.softmax(torch.tensor(a.astype(np.float64)), 1).numpy())
    problem = T.CopyProblem((40, 33), (1, 40), (33, 1))
    assert solver.select(ctx, "copy", problem).name == "tiles"
    tuning_rules("copy", [{"when": {"transposition": 1}, "params": {"solver": "gather"}}])
    assert solver.select(ctx, "copy", problem).name == "gather"
    b = random(rng, (40, 33))
    assert_close(F.permute(dp.Tensor.from_numpy(ctx, b), (1, 0)).numpy(), b.T.astype(np.float64))


def test_tuning_values_come_from_the_rules(ctx, rng, tuning_rules):
    """A rule that gives some values leaves the others to the shipped ones; the dropout mask does
    not depend on the launch it changes."""
    problem = D.DropoutProblem(4096, True)
    assert solver.tunables(ctx, "dropout", problem, "vector") == {"unroll": 2, "groups_per_unit": 64}
    a = random(rng, 4096, 0.5, 1.0)
    before = F.dropout(dp.Tensor.from_numpy(ctx, a), 0.5, seed=9).numpy()
    tuning_rules("dropout", [{"when": {"min_size": 1024}, "params": {"solver": "vector", "unroll": 3}}])
    assert solver.tunables(ctx, "dropout", problem, "vector") == {"unroll": 3, "groups_per_unit": 64}
    assert solver.tunables(ctx, "dropout", D.DropoutProblem(100, True), "vector")["unroll"] == 2
    after = F.dropout(dp.Tensor.from_numpy(ctx, a), 0.5, seed=9).numpy()
    assert np.array_equal(before, after)


def test_forget_makes_a_new_choice(ctx, tuning_rules):
    """Choices are memoized until a tuning database is forgotten."""
    problem = S.SoftmaxProblem(64, 1)
    assert solver.select(ctx, "softmax", problem).name == "row"
    generation = tuning.generation
    tuning_rules("softmax", [{"when": {}, "params": {"solver": "column"}}])
    assert tuning.generation > generation
    assert solver.select(ctx, "softmax", problem).name == "column"


def test_tuning_values_outside_their_bounds_are_refused(ctx, rng, tuning_rules):
    tuning_rules("reduce", [{"when": {}, "params": {"solver": "group", "set_chunk": R.LONGEST_FOLD + 1}}])
    with pytest.raises(dp.DlprimError, match="set_chunk"):
        F.sum(dp.Tensor.from_numpy(ctx, random(rng, (3, 1000))), 1)
    tuning_rules("softmax", [{"when": {}, "params": {"solver": "row", "vector": 8}}])
    with pytest.raises(dp.DlprimError, match="vector must be 1, 2 or 4"):
        F.softmax(dp.Tensor.from_numpy(ctx, random(rng, (3, 64))), 1)


def test_shipped_databases_name_only_known_solvers():
    """Every rule of the shipped databases names a solver of its family."""
    for name in ("reduce", "reduce_partials", "softmax", "pool", "dropout", "pointwise", "copy"):
        db = tuning.read_db(tuning.shipped_path(name), name)
        entries = [db["default"]] + [e for section in tuning.SECTIONS for e in db[section].values()]
        for entry in entries:
            for rule in entry["rules"]:
                assert rule["params"]["solver"] in solver.family(name).solvers, (name, rule)


def test_pointwise_launches_from_a_user_database(ctx, rng, tuning_rules):
    """The pointwise solvers' launches are tuning values (tuning_db/pointwise_launch.json): a
    device rule changes the scalar launch and the vector width, the rest comes from the shipped
    rule, and calls stay right."""
    from dlprim_py.ops.pointwise import Launch
    kernel = PointwiseKernel("launch_rule_scale", [("x", np.float32)], [("y", np.float32)],
                             "y = 3.0f * x;")
    shipped = kernel.launches(ctx)
    tuning_rules("pointwise_launch", [{"when": {}, "params": {
        "scalar": {"unroll": 1, "interleave": "grid", "group_size": 64, "groups_per_unit": 4},
        "vector": 2}}])
    scalar, vector, vector_launch, _ = kernel.launches(ctx)
    assert scalar == Launch(1, "grid", 64, 4) and vector == 2
    assert vector_launch == shipped[2]
    for algorithm in ("scalar", "vector"):
        x = dp.Tensor.from_numpy(ctx, rng.standard_normal(1030).astype(np.float32))
        y = dp.Tensor.full(ctx, (1030,), np.nan)
        kernel([x], [y], algorithm=algorithm)
        np.testing.assert_allclose(y.numpy(), 3.0 * x.numpy(), rtol=1e-6)
