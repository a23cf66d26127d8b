"""The fusion family on the solver layer: every fused solver forced through DLPRIM_FUSION_ALGO
against float64 torch, a forced solver that does not apply, and a compile that builds no
convolution kernel it then discards."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import dlprim_py as dp
from conftest import assert_close, poisoned, random
from dlprim_py import fusion, program


def t64(array):
    return torch.from_numpy(np.asarray(array, dtype=np.float64))


def dev(ctx, *arrays):
    return [dp.Tensor.from_numpy(ctx, a) for a in arrays]


def force(monkeypatch, name):
    monkeypatch.setenv("DLPRIM_FUSION_ALGO", name)
    dp.config.reload()


def test_every_solver_is_in_the_family():
    assert list(fusion.FAMILY.solvers) == ["pointwise_chain", "conv_chain", "horizontal_convs",
                                           "batchnorm_train_forward", "batchnorm_train_backward"]


def test_forced_pointwise_chain(ctx, rng, monkeypatch):
    force(monkeypatch, "pointwise_chain")
    shape = (2, 3, 4, 5)
    x, b = random(rng, shape, -2, 2), random(rng, (1, 3, 1, 1))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bias = plan.create_op_bias_forward(dp.TensorDesc((1, 3, 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_ELU)
    plan.compile()
    assert plan.solver.name == "pointwise_chain"
    args = fusion.OperatorArgs()
    args.set_bias_forward(bias, 1, 0, *dev(ctx, b))
    args.set_activation_forward(act, 1, 0, 0.5, 0, 0)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, *dev(ctx, x), plan.output_desc, y, args)
    assert_close(y.numpy(), TF.elu(t64(x) + t64(b), 0.5).numpy())


def test_forced_conv_chain(ctx, rng, monkeypatch):
    force(monkeypatch, "conv_chain")
    x, w, b = random(rng, (2, 3, 7, 6)), random(rng, (5, 3, 3, 3)), random(rng, (5,))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(x.shape))
    conv = plan.create_op_conv_forward(dp.ConvolutionDesc(padding=1), dp.TensorDesc(w.shape))
    bias = plan.create_op_bias_forward(dp.TensorDesc((1, 5, 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    assert plan.solver.name == "conv_chain"
    args = fusion.OperatorArgs()
    xd, wd, bd = dev(ctx, x, w, b)
    args.set_conv_forward(conv, 1, 0, wd)
    args.set_bias_forward(bias, 1, 0, bd)
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    y = poisoned(ctx, plan.output_desc.shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    assert_close(y.numpy(), torch.relu(TF.conv2d(t64(x), t64(w), t64(b), padding=1)).numpy())


def test_forced_horizontal_convs(ctx, rng, monkeypatch):
    force(monkeypatch, "horizontal_convs")
    x = random(rng, (2, 4, 5, 5))
    w1, w2, b2 = random(rng, (3, 4, 3, 3)), random(rng, (2, 4, 3, 3)), random(rng, (2,))
    plan = fusion.FusionPlan(ctx, fusion.HORIZONTAL, dp.TensorDesc(x.shape))
    c1 = plan.create_op_conv_forward(dp.ConvolutionDesc(padding=1), dp.TensorDesc(w1.shape))
    c2 = plan.create_op_conv_forward(dp.ConvolutionDesc(padding=1), dp.TensorDesc(w2.shape))
    bias = plan.create_op_bias_forward(dp.TensorDesc((1, 2, 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_TANH)
    plan.compile()
    assert plan.solver.name == "horizontal_convs"
    args = fusion.OperatorArgs()
    args.set_conv_forward(c1, 1, 0, *dev(ctx, w1))
    args.set_conv_forward(c2, 1, 0, *dev(ctx, w2))
    args.set_bias_forward(bias, 1, 0, *dev(ctx, b2))
    args.set_activation_forward(act, 1, 0, 0.5, 2.0, 0)
    xd = dev(ctx, x)[0]
    ref = 2.0 * torch.tanh(0.5 * torch.cat([TF.conv2d(t64(x), t64(w1), padding=1),
                                            TF.conv2d(t64(x), t64(w2), t64(b2), padding=1)], 1))
    for _ in range(2):   # the second call copies the weights again (no rebinding replay)
        y = poisoned(ctx, plan.output_desc.shape)
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
        assert_close(y.numpy(), ref.numpy())


@pytest.mark.parametrize("mode", [fusion.BN_SPATIAL, fusion.BN_PER_ACTIVATION])
def test_forced_batchnorm_train_forward_and_backward(ctx, rng, monkeypatch, mode):
    shape = (4, 3, 2, 4)
    x, dy = random(rng, shape, -1, 2), random(rng, shape)
    param = (1, 3, 1, 1) if mode == fusion.BN_SPATIAL else (1,) + shape[1:]
    scale, bias = random(rng, param, 0.5, 1.5), random(rng, param)
    force(monkeypatch, "batchnorm_train_forward")
    forward = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = forward.create_op_batchnorm_forward(mode, False)
    act = forward.create_op_activation_forward(fusion.ACTIVATION_SOFTRELU)
    forward.compile()
    assert forward.solver.name == "batchnorm_train_forward"
    xd, scale_d, bias_d = dev(ctx, x, scale, bias)
    mean, inv = poisoned(ctx, param), poisoned(ctx, param)
    args = fusion.OperatorArgs()
    args.set_batchnorm_forward(bn, 1, 0, scale_d, bias_d, mean, inv, epsilon=1e-4)
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    y = poisoned(ctx, shape)
    forward.execute(forward.input_desc, xd, forward.output_desc, y, args)

    force(monkeypatch, "batchnorm_train_backward")
    backward = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    act_back = backward.create_op_activation_backward(fusion.ACTIVATION_SOFTRELU)
    bn_back = backward.create_op_batchnorm_backward(mode)
    backward.compile()
    assert backward.solver.name == "batchnorm_train_backward"
    dscale, dbias = poisoned(ctx, param), poisoned(ctx, param)
    bargs = fusion.OperatorArgs()
    bargs.set_batchnorm_backward(bn_back, 1, 0, xd, scale_d, bias_d, dscale, dbias, mean, inv)
    bargs.set_activation_backward(act_back, 1, 0, None, None, 0, 0, 0)
    dx = poisoned(ctx, shape)
    backward.execute(backward.input_desc, *dev(ctx, dy), backward.output_desc, dx, bargs)

    n = shape[0]
    flat = (lambda a: t64(a).reshape(n, -1)) if mode == fusion.BN_PER_ACTIVATION else t64
    xt = flat(x).requires_grad_(True)
    st, bt = t64(scale).flatten().requires_grad_(True), t64(bias).flatten().requires_grad_(True)
    ref = TF.softplus(TF.batch_norm(xt, None, None, st, bt, training=True, eps=1e-4))
    ref.backward(flat(dy))
    assert_close(y.numpy().reshape(ref.shape), ref.detach().numpy())
    assert_close(dx.numpy().reshape(ref.shape), xt.grad.numpy())
    assert_close(dscale.numpy().ravel(), st.grad.numpy())
    assert_close(dbias.numpy().ravel(), bt.grad.numpy())


def test_forced_solver_that_does_not_apply_is_an_error(ctx, monkeypatch):
    force(monkeypatch, "conv_chain")
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((2, 3, 4, 4)))
    plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    with pytest.raises(dp.UnsupportedError, match="DLPRIM_FUSION_ALGO=conv_chain does not apply"
                                                  ".*applicable: pointwise_chain"):
        plan.compile()
    force(monkeypatch, "no_such_solver")
    with pytest.raises(dp.UnsupportedError, match="unknown fused solver 'no_such_solver'"):
        plan.compile()


def test_problem_is_frozen_and_describes_the_chain(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 2, 5, 5)))
    plan.create_op_conv_forward(dp.ConvolutionDesc(padding=1), dp.TensorDesc((4, 2, 3, 3)))
    plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    problem = plan.problem()
    assert problem == plan.problem() and hash(problem) == hash(plan.problem())
    assert problem.key() == "fusion vertical 1x2x5x5: " + plan.describe()
    assert problem.features()["first"] == "conv"
    with pytest.raises(Exception):
        problem.ops = ()


def _conv_programs(ctx):
    """(template, activation code) of the context's programs that end a convolution: the
    conv_* templates, and GEMMs with the convolution's epilogue (1x1 convolutions; im2col's
    GEMM writes columns that its own conv_im2col program finishes)."""
    found = []
    for template, params, _ in ctx.programs:
        params = dict(params)
        if template.startswith("conv_") and "activation" in params:
            found.append((template, params["activation"]))
        elif template == "gemm" and params.get("EPILOGUE") == "conv":
            found.append((template, params["ACTIVATION"]))
    return found


@pytest.mark.parametrize("x_shape, w_shape, desc", [
    ((2, 4, 8, 8), (6, 4, 3, 3), dict(padding=1)),
    ((2, 4, 8, 8), (6, 4, 1, 1), dict()),
    ((2, 4, 8, 8), (4, 1, 3, 3), dict(padding=1, groups=4)),
], ids=["3x3", "1x1", "depthwise"])
def test_compile_builds_no_plain_convolution_kernel(rng, monkeypatch, x_shape, w_shape, desc):
    """A conv -> bias -> relu plan builds its convolution's kernels with the epilogue only
    (compile and every algorithm's first run), and every build it counts is a program the
    context keeps: no kernel without the epilogue is built and thrown away. (Find mode times
    the algorithms without an epilogue on purpose: the immediate choice is what is counted.)"""
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    dp.config.reload()
    fresh = dp.Context()
    relu = dp.ActivationDesc("relu")
    fused = {relu.forward_code("v"), relu.forward_code("x")}
    builds = program.stats["builds"]
    plan = fusion.FusionPlan(fresh, fusion.VERTICAL, dp.TensorDesc(x_shape))
    conv = plan.create_op_conv_forward(dp.ConvolutionDesc(**desc), dp.TensorDesc(w_shape))
    bias = plan.create_op_bias_forward(dp.TensorDesc((1, w_shape[0], 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    args = fusion.OperatorArgs()
    x, w, b = (dp.Tensor.from_numpy(fresh, random(rng, s))
               for s in (x_shape, w_shape, (w_shape[0],)))
    args.set_conv_forward(conv, 1, 0, w)
    args.set_bias_forward(bias, 1, 0, b)
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    ref = torch.relu(TF.conv2d(t64(x.numpy()), t64(w.numpy()), t64(b.numpy()), **desc))
    for name in plan.conv_algorithms():
        plan.set_conv_algorithm(name)
        y = dp.Tensor.empty(fresh, plan.output_desc.shape)
        plan.execute(plan.input_desc, x, plan.output_desc, y, args)
        assert_close(y.numpy(), ref.numpy())
    built = _conv_programs(fresh)
    assert built, "no convolution program was built"
    plain = [(template, code) for template, code in built if code not in fused]
    assert not plain, f"programs built without the plan's epilogue: {plain}"
    # Every build went into the context's programs (nothing built outside them and dropped);
    # the tensors' fill and copy programs of the context are among them.
    assert program.stats["builds"] - builds == len(fresh.programs)


def test_changing_a_setting_after_execute_records_again(ctx, rng):
    """A plan replays what its first execute recorded; forcing a split or scalar loads
    afterwards drops that recording, and the next execute runs with the new setting."""
    shape = (4, 3, 4, 8)
    x = random(rng, shape)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_forward(fusion.BN_SPATIAL, False)
    plan.compile()
    args = fusion.OperatorArgs()
    args.set_batchnorm_forward(bn, 1, 0, *dev(ctx, random(rng, (3,), 0.5, 1.5),
                                               random(rng, (3,))))
    xd = dev(ctx, x)[0]
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    first = plan._bound[2]
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    assert plan._bound[2] is first   # replayed
    plan.runner.set_chunks(3)
    plan.runner.set_vector_width(1)
    y2 = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y2, args)
    assert plan._bound[2] is not first
    assert len(plan._bound[2]) == len(first)   # partial sums, finalize, apply
    assert_close(y2.numpy(), y.numpy(), tol=1e-6)
