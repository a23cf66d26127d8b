"""One batch norm: F.batch_norm, the MIOpen-style calls of ops.norm and the fusion plans run the
same kernels (training and inference, with and without an activation), checked against float64
torch; what torch refuses (one value per channel when training) is refused on every path; the
norm and rownorm solver families, forced and ruled by their tuning databases."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
import dlprim_py.functional as F
from conftest import assert_close, poisoned, random
from dlprim_py import fusion, tuning
from dlprim_py.ops import norm


def t64(array):
    return torch.from_numpy(np.asarray(array, dtype=np.float64))


def dev(ctx, *arrays):
    return [dp.Tensor.from_numpy(ctx, a) for a in arrays]


ACTIVATIONS = [(None, lambda t: t), ("relu", torch.relu), ("elu", TF.elu),
               ("sigmoid", torch.sigmoid)]


def _flat(mode, a):
    """An (N, C, ...) array as torch's batch norm sees it in ``mode``."""
    a = t64(a)
    return a.reshape(a.shape[0], -1) if mode == "per_activation" else a


@pytest.mark.parametrize("activation, reference", ACTIVATIONS, ids=lambda v: str(v)[:8])
@pytest.mark.parametrize("mode, shape, algo, chunks", [
    ("spatial", (4, 3, 4, 6), "groups", None),
    ("spatial", (4, 3, 4, 6), "groups_scalar", 3),
    ("spatial", (3, 2, 5, 7), "groups", 4),
    ("per_activation", (6, 3, 4, 4), "columns", None),
    ("per_activation", (6, 3, 4, 4), "groups", 2),
], ids=["spatial-float4", "spatial-scalar-3-chunks", "spatial-odd-4-chunks",
        "per_activation-columns", "per_activation-groups"])
def test_training_forward_and_backward_with_activation(ctx, rng, monkeypatch, mode, shape, algo,
                                                       chunks, activation, reference):
    """ops.norm's training batch norm with a fused activation (what the fusion plans call),
    forward and backward, on each reduction solver, against float64 torch."""
    monkeypatch.setenv("DLPRIM_NORM_ALGO", algo)
    dp.config.reload()
    C = shape[1] if mode == "spatial" else int(np.prod(shape[1:]))
    x, dy = random(rng, shape, -1, 3), random(rng, shape)
    w, b = random(rng, (C,), 0.5, 1.5), random(rng, (C,))
    rm, rv = random(rng, (C,)), random(rng, (C,), 0.5, 1.5)
    xd, wd, bd, rmd, rvd = dev(ctx, x, w, b, rm, rv)
    y, mean, invstd = poisoned(ctx, shape), poisoned(ctx, (C,)), poisoned(ctx, (C,))
    norm.batch_norm_forward_training(xd, y, wd, bd, rmd, rvd, mean, invstd, momentum=0.3,
                                     eps=1e-4, mode=mode, activation=activation, chunks=chunks)
    dx, dw, db = poisoned(ctx, shape), poisoned(ctx, (C,)), poisoned(ctx, (C,))
    norm.batch_norm_backward(xd, dev(ctx, dy)[0], dx, wd, mean, invstd, dw, db, mode=mode,
                             chunks=chunks, bias=bd, activation=activation)

    xt = _flat(mode, x).requires_grad_(True)
    wt, bt = t64(w).requires_grad_(True), t64(b).requires_grad_(True)
    rmt, rvt = t64(rm), t64(rv)
    ref = reference(TF.batch_norm(xt, rmt, rvt, wt, bt, training=True, momentum=0.3, eps=1e-4))
    ref.backward(_flat(mode, dy))
    assert_close(y.numpy().reshape(ref.shape), ref.detach().numpy())
    assert_close(rmd.numpy(), rmt.numpy())
    assert_close(rvd.numpy(), rvt.numpy())
    assert_close(dx.numpy().reshape(ref.shape), xt.grad.numpy())
    assert_close(dw.numpy(), wt.grad.numpy())
    assert_close(db.numpy(), bt.grad.numpy())


@pytest.mark.parametrize("activation", [None, fusion.ACTIVATION_RELU, fusion.ACTIVATION_ELU])
@pytest.mark.parametrize("mode", [fusion.BN_SPATIAL, fusion.BN_PER_ACTIVATION])
def test_fused_and_functional_training_are_one_implementation(ctx, rng, mode, activation):
    """A fusion plan's training batch norm (+ activation) and the MIOpen-style call with the
    same activation give the same bits, forward and backward, and torch's float64 values."""
    shape = (5, 3, 4, 4)
    C = 3 if mode == fusion.BN_SPATIAL else 48
    param = (1, 3, 1, 1) if mode == fusion.BN_SPATIAL else (1, 3, 4, 4)
    x, dy = random(rng, shape, -1, 2), random(rng, shape)
    scale, bias = random(rng, param, 0.5, 1.5), random(rng, param)
    rm, rv = random(rng, param), random(rng, param, 0.5, 1.5)
    desc = fusion.activation_desc(activation) if activation is not None else None

    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_forward(mode, True)
    act = plan.create_op_activation_forward(activation) if activation is not None else None
    plan.compile()
    xd, sd, bd = dev(ctx, x, scale, bias)
    rmd, rvd = dev(ctx, rm, rv)
    mean, inv = poisoned(ctx, param), poisoned(ctx, param)
    args = fusion.OperatorArgs()
    args.set_batchnorm_forward(bn, 1, 0, sd, bd, mean, inv, rmd, rvd, 0.2, 1e-5)
    if act is not None:
        args.set_activation_forward(act, 1, 0, 1.0, 0, 0)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)

    rmu, rvu = dev(ctx, rm, rv)
    y_u, mean_u, inv_u = poisoned(ctx, shape), poisoned(ctx, param), poisoned(ctx, param)
    norm.batch_norm_forward_training(xd, y_u, sd, bd, rmu, rvu, mean_u, inv_u, 0.2, 1e-5,
                                     mode=mode, activation=desc)
    np.testing.assert_array_equal(y.numpy(), y_u.numpy())
    np.testing.assert_array_equal(rmd.numpy(), rmu.numpy())
    np.testing.assert_array_equal(rvd.numpy(), rvu.numpy())
    np.testing.assert_array_equal(inv.numpy(), inv_u.numpy())

    back = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn_back = back.create_op_batchnorm_backward(mode)
    act_back = (back.create_op_activation_backward(activation) if activation is not None
                else None)
    back.compile()
    ds, db = poisoned(ctx, param), poisoned(ctx, param)
    bargs = fusion.OperatorArgs()
    bargs.set_batchnorm_backward(bn_back, 1, 0, xd, sd, bd, ds, db, mean, inv)
    if act_back is not None:
        bargs.set_activation_backward(act_back, 1, 0, y, None, 1.0, 0, 0)
    dyd = dev(ctx, dy)[0]
    dx = poisoned(ctx, shape)
    back.execute(back.input_desc, dyd, back.output_desc, dx, bargs)
    dx_u, ds_u, db_u = poisoned(ctx, shape), poisoned(ctx, param), poisoned(ctx, param)
    norm.batch_norm_backward(xd, dyd, dx_u, sd, mean, inv, ds_u, db_u, mode=mode, bias=bd,
                             activation=desc)
    np.testing.assert_array_equal(dx.numpy(), dx_u.numpy())
    np.testing.assert_array_equal(ds.numpy(), ds_u.numpy())
    np.testing.assert_array_equal(db.numpy(), db_u.numpy())

    act_ref = {None: lambda t: t, fusion.ACTIVATION_RELU: torch.relu,
               fusion.ACTIVATION_ELU: TF.elu}[activation]
    xt = _flat(mode, x).requires_grad_(True)
    st, bt = t64(scale).flatten().requires_grad_(True), t64(bias).flatten().requires_grad_(True)
    rmt, rvt = t64(rm).flatten(), t64(rv).flatten()
    ref = act_ref(TF.batch_norm(xt, rmt, rvt, st, bt, training=True, momentum=0.2, eps=1e-5))
    ref.backward(_flat(mode, dy))
    assert_close(y.numpy().reshape(ref.shape), ref.detach().numpy())
    assert_close(rmd.numpy().ravel(), rmt.numpy())
    assert_close(rvd.numpy().ravel(), rvt.numpy())
    assert_close(dx.numpy().reshape(ref.shape), xt.grad.numpy())
    assert_close(ds.numpy().ravel(), st.grad.numpy())
    assert_close(db.numpy().ravel(), bt.grad.numpy())
    assert C == st.numel()


@pytest.mark.parametrize("activation", [None, "relu", "hardtanh"])
def test_inference_functional_and_fused(ctx, rng, activation):
    """Batch norm with given statistics: the MIOpen-style call (+ activation), F.batch_norm,
    and a pointwise fusion plan, against float64 torch."""
    shape = (3, 4, 5, 4)
    x = random(rng, shape, -2, 2)
    w, b, m, v = (random(rng, (4,), 0.5, 1.5), random(rng, (4,)), random(rng, (4,)),
                  random(rng, (4,), 0.5, 2))
    act_ref = {None: lambda t: t, "relu": torch.relu, "hardtanh": TF.hardtanh}[activation]
    ref = act_ref(TF.batch_norm(t64(x), t64(m), t64(v), t64(w), t64(b), eps=1e-3)).numpy()
    xd, wd, bd, md, vd = dev(ctx, x, w, b, m, v)
    y = poisoned(ctx, shape)
    norm.batch_norm_forward_inference(xd, y, wd, bd, md, vd, eps=1e-3, activation=activation)
    assert_close(y.numpy(), ref)
    if activation is None:
        assert_close(F.batch_norm(xd, md, vd, wd, bd, training=False, eps=1e-3).numpy(), ref)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 4, 1, 1)))
    mode = dp.ActivationDesc(activation).mode if activation else None
    act = plan.create_op_activation_forward(mode) if mode else None
    plan.compile()
    args = fusion.OperatorArgs()
    args.set_batchnorm_inference(bn, 1, 0, wd, bd, md, vd, 1e-3)
    if act is not None:
        args.set_activation_forward(act, 1, 0, -1.0, 1.0, 0)
    y_fused = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y_fused, args)
    assert_close(y_fused.numpy(), ref)


# ---- what torch refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 3), (1, 3, 1, 1), (1, 2, 1)])
def test_one_value_per_channel_is_refused_on_every_path(ctx, rng, shape):
    x = random(rng, shape)
    C = shape[1]
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        TF.batch_norm(t64(x), None, None, training=True)
    with pytest.raises(dp.ShapeError, match="more than one value per channel"):
        F.batch_norm(dev(ctx, x)[0], None, None, training=True)
    with pytest.raises(dp.ShapeError, match="more than one value per channel"):
        norm.batch_norm_forward_training(dev(ctx, x)[0], dp.Tensor.empty(ctx, shape))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    plan.create_op_batchnorm_forward(fusion.BN_SPATIAL, False)
    with pytest.raises(dp.ShapeError, match="more than one value per channel"):
        plan.compile()
    back = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    back.create_op_batchnorm_backward(fusion.BN_SPATIAL)
    with pytest.raises(dp.ShapeError, match="more than one value per channel"):
        back.compile()
    # Inference with one value is torch's too: it computes.
    params = [dev(ctx, random(rng, (C,), 0.5, 1.5))[0] for _ in range(2)]
    y = F.batch_norm(dev(ctx, x)[0], *params, training=False)
    assert_close(y.numpy(), TF.batch_norm(t64(x), *[t64(p.numpy()) for p in params]).numpy())


def test_per_activation_plan_refuses_a_batch_of_one(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 3, 2, 2)))
    plan.create_op_batchnorm_forward(fusion.BN_PER_ACTIVATION, False)
    with pytest.raises(dp.ShapeError, match="more than one value per channel"):
        plan.compile()
    # Spatial statistics of the same input have four values per channel.
    spatial = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 3, 2, 2)))
    spatial.create_op_batchnorm_forward(fusion.BN_SPATIAL, False)
    spatial.compile()


@pytest.mark.parametrize("shape", [(1, 3, 2), (2, 3), (1, 2, 1, 2)])
def test_two_values_per_channel_train(ctx, rng, shape):
    """The smallest batches torch accepts: ours compute them, with the unbiased running
    variance over two values."""
    x = random(rng, shape)
    C = shape[1]
    rm, rv = random(rng, (C,)), random(rng, (C,), 0.5, 1.5)
    rmd, rvd = dev(ctx, rm, rv)
    rmt, rvt = t64(rm), t64(rv)
    y = F.batch_norm(dev(ctx, x)[0], rmd, rvd, training=True)
    ref = TF.batch_norm(t64(x), rmt, rvt, training=True)
    assert_close(y.numpy(), ref.numpy())
    assert_close(rmd.numpy(), rmt.numpy())
    assert_close(rvd.numpy(), rvt.numpy())


def test_empty_batch_trains_as_torch(ctx, rng):
    """torch accepts an empty batch in training: an empty result, running statistics left as
    they are, zero weight and bias gradients."""
    C = 3
    rm, rv = random(rng, (C,)), random(rng, (C,), 0.5, 1.5)
    w, b = random(rng, (C,)), random(rng, (C,))
    rmd, rvd = dev(ctx, rm, rv)
    wd, bd = (dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in (w, b))
    x = dp.Tensor.empty(ctx, (0, C, 4, 4))
    y = F.batch_norm(x, rmd, rvd, wd, bd, training=True)
    assert y.shape == (0, C, 4, 4)
    y.backward(dp.Tensor.empty(ctx, y.shape))
    wt, bt = t64(w).requires_grad_(True), t64(b).requires_grad_(True)
    rmt, rvt = t64(rm), t64(rv)
    ref = TF.batch_norm(torch.zeros(0, C, 4, 4, dtype=torch.float64), rmt, rvt, wt, bt,
                        training=True)
    ref.backward(torch.zeros_like(ref))
    assert_close(rmd.numpy(), rmt.numpy())
    assert_close(rvd.numpy(), rvt.numpy())
    np.testing.assert_array_equal(wd.grad.numpy(), wt.grad.numpy())
    np.testing.assert_array_equal(bd.grad.numpy(), bt.grad.numpy())


def test_infinity_with_a_forced_split(ctx, rng):
    """An infinity in a channel cut into chunks: the compensated sum of the chunks stays
    infinite (torch's mean), not NaN."""
    shape = (4, 2, 6, 8)
    x = random(rng, shape)
    x[3, 1, 5, 7] = np.inf
    y, mean, invstd = poisoned(ctx, shape), poisoned(ctx, (2,)), poisoned(ctx, (2,))
    norm.batch_norm_forward_training(dev(ctx, x)[0], y, None, None, None, None, mean, invstd,
                                     chunks=3)
    _, mean_t, _ = torch.native_batch_norm(torch.from_numpy(x), None, None, None, None, True,
                                           0.1, 1e-5)
    assert mean.numpy()[1] == np.inf == mean_t.numpy()[1]
    assert_close(mean.numpy()[:1], mean_t.numpy()[:1])


# ---- the solver families --------------------------------------------------------------------

def test_norm_and_rownorm_families(ctx):
    from dlprim_py import solver
    assert list(solver.family("norm").solvers) == ["groups", "groups_scalar", "columns"]
    assert list(solver.family("rownorm").solvers) == ["rows", "rows4", "split"]
    wide = norm.ChannelSumsProblem("stats", 64, 64, 1, False)
    narrow = norm.ChannelSumsProblem("stats", 64, 8, 1, False)
    planes = norm.ChannelSumsProblem("stats", 64, 64, 16, True)
    assert solver.select(ctx, "norm", wide).name == "columns"
    assert solver.select(ctx, "norm", narrow).name == "groups"
    assert solver.select(ctx, "norm", planes).name == "groups"
    units = ctx.info.compute_units
    assert norm.row_algorithm(ctx, 2, 4096, True).name == "split"
    assert norm.row_algorithm(ctx, 4 * units, 4096, True).name == "rows"
    assert norm.row_algorithm(ctx, 2, 1000, True).name == "rows"
    assert norm.row_algorithm(ctx, 2, 4096, False).name == "rows"


def test_forced_norm_solver_that_does_not_apply(ctx, rng, monkeypatch):
    x = dev(ctx, random(rng, (3, 4, 5)))[0]
    monkeypatch.setenv("DLPRIM_NORM_ALGO", "columns")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_NORM_ALGO=columns does not apply"):
        F.batch_norm(x, None, None, training=True)
    monkeypatch.setenv("DLPRIM_ROWNORM_ALGO", "split")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_ROWNORM_ALGO=split does not apply"):
        F.layer_norm(x, (5,))


@pytest.fixture
def user_tuning(tmp_path, monkeypatch):
    """A user tuning directory: write(family, rules) puts a default entry there."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    tuning.forget()
    yield lambda family, rules: (
        (tmp_path / "tuning").mkdir(exist_ok=True),
        (tmp_path / "tuning" / f"{family}.json").write_text(json.dumps(
            {"family": family, "format": 1, "devices": {}, "architectures": {}, "vendors": {},
             "default": {"rules": rules}})),
        tuning.forget())
    tuning.forget()


def test_norm_rules_and_tunables_are_data(ctx, rng, user_tuning):
    """A user database's rule chooses the reduction and its split (max_chunks), and the result
    stays torch's."""
    # Shapes no other test reduces: choices are memoized per context and problem.
    user_tuning("norm", [{"when": {"min_n": 7, "max_n": 7, "s": 40}, "params": {
        "solver": "groups_scalar", "positions_per_item": 1, "groups_per_unit": 64,
        "max_chunks": 1}}])
    x = random(rng, (7, 3, 5, 8))
    # n = 9: the shipped rule, float4 loads and one chunk for 9 * 40 / 4 positions.
    shipped = norm.prepared_sums(ctx, "stats", 9, 3, 40, dev(ctx, x))
    assert (shipped.vector, shipped.chunks, shipped.scalar_loads) == (4, 1, False)
    # n = 7: the user's rule, scalar loads, and its max_chunks keeps the 280 positions in one
    # chunk (the shipped params would cut them in two, a work group's 256 items each at most).
    sums = norm.prepared_sums(ctx, "stats", 7, 3, 40, dev(ctx, x))
    assert sums.scalar_loads and sums.vector == 1 and sums.chunks == 1
    forced = norm.prepared_sums(ctx, "stats", 10, 3, 28, dev(ctx, x), algorithm="groups_scalar")
    assert forced.chunks == 2   # 280 positions again, with the shipped groups_scalar params
    y = F.batch_norm(dev(ctx, x)[0], None, None, training=True)
    assert_close(y.numpy(), TF.batch_norm(t64(x), None, None, training=True).numpy())


def test_rownorm_rules_are_data(ctx, rng, user_tuning):
    user_tuning("rownorm", [{"when": {"splittable": 1, "max_d": 37, "min_d": 37},
                             "params": {"solver": "split"}}])
    assert norm.row_algorithm(ctx, 3 * 2, 37, True).name == "split"
    assert norm.row_algorithm(ctx, 3 * 2, 36, True).name == "rows"
    x = random(rng, (3, 2, 37))
    w, b = random(rng, (2,)), random(rng, (2,))
    y = F.group_norm(dev(ctx, x)[0], 2, *dev(ctx, w, b))
    assert_close(y.numpy(), TF.group_norm(t64(x), 2, t64(w), t64(b)).numpy())
