"""Fusion plans (MIOpen's fusion API): every chain and activation mode against PyTorch (float64)
and against the library's unfused sequence, and every refusal."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from conftest import assert_close, poisoned, random
from dlprim_py import fusion
from dlprim_py.ops import norm
from dlprim_py.ops.activation_ops import activation_backward, activation_forward
from dlprim_py.launch import Recording

MIOPEN_MODES = [
    # (mode, activ_alpha, activ_beta, activ_gamma): parameters that change the result.
    (fusion.ACTIVATION_PASTHRU, 0.0, 0.0, 0.0),
    (fusion.ACTIVATION_LOGISTIC, 0.0, 0.0, 0.0),
    (fusion.ACTIVATION_TANH, 0.7, 1.3, 0.0),
    (fusion.ACTIVATION_RELU, 0.0, 0.0, 0.0),
    (fusion.ACTIVATION_SOFTRELU, 0.0, 0.0, 0.0),
    (fusion.ACTIVATION_ABS, 0.0, 0.0, 0.0),
    (fusion.ACTIVATION_POWER, 0.5, 1.5, 2.0),
    (fusion.ACTIVATION_CLIPPEDRELU, 0.8, 0.0, 0.0),
    (fusion.ACTIVATION_LEAKYRELU, 0.1, 0.0, 0.0),
    (fusion.ACTIVATION_ELU, 0.7, 0.0, 0.0),
]


def act_ref(mode, a, b, g, t):
    """MIOpen's definition of each mode, on a float64 torch tensor."""
    A = dp.Activation
    return {
        A.PASTHRU: lambda: t,
        A.LOGISTIC: lambda: torch.sigmoid(t),
        A.TANH: lambda: b * torch.tanh(a * t),
        A.RELU: lambda: torch.relu(t),
        A.SOFTRELU: lambda: F.softplus(t),
        A.ABS: lambda: t.abs(),
        A.POWER: lambda: (a + b * t) ** g,
        A.CLIPPEDRELU: lambda: t.clamp(0.0, a),
        A.LEAKYRELU: lambda: F.leaky_relu(t, a),
        A.ELU: lambda: F.elu(t, a),
    }[mode]()


def t64(array):
    return torch.from_numpy(np.asarray(array, dtype=np.float64))


def bn_params(rng, shape):
    """scale, bias, mean, variance (positive) of ``shape``."""
    return (random(rng, shape, 0.5, 1.5), random(rng, shape), random(rng, shape),
            random(rng, shape, 0.2, 2.0))


def bn_inference_ref(x, scale, bias, mean, variance, eps):
    x, scale, bias, mean, variance = map(t64, (x, scale, bias, mean, variance))
    return (x - mean) / torch.sqrt(variance + eps) * scale + bias


def dev(ctx, *arrays):
    return [dp.Tensor.from_numpy(ctx, a) for a in arrays]


# ---- BN inference + activation without a convolution: one pointwise kernel -----------------

@pytest.mark.parametrize("mode, a, b, g", MIOPEN_MODES, ids=lambda v: getattr(v, "name", None))
def test_batchnorm_inference_activation_every_mode(ctx, rng, mode, a, b, g):
    shape = (2, 3, 5, 4)
    x = random(rng, shape, -2, 2)
    params = bn_params(rng, (1, 3, 1, 1))
    eps = 1e-3
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 3, 1, 1)))
    act = plan.create_op_activation_forward(mode)
    plan.compile()
    args = fusion.OperatorArgs()
    scale, bias, mean, variance = dev(ctx, *params)
    args.set_batchnorm_inference(bn, 1.0, 0.0, scale, bias, mean, variance, eps)
    args.set_activation_forward(act, 1.0, 0.0, a, b, g)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, dp.Tensor.from_numpy(ctx, x), plan.output_desc, y, args)
    ref = act_ref(mode, a, b, g, bn_inference_ref(x, *params, eps))
    assert_close(y.numpy(), ref.numpy())
    # The unfused sequence: the library's batch norm, then its activation.
    normalised, unfused = poisoned(ctx, shape), poisoned(ctx, shape)
    norm.batch_norm_forward_inference(dp.Tensor.from_numpy(ctx, x), normalised, scale, bias, mean,
                                      variance, eps=eps)
    activation_forward(fusion.activation_desc(mode, a, b, g), normalised, unfused)
    assert_close(y.numpy(), unfused.numpy(), tol=1e-6)
    torch_ref = act_ref(mode, a, b, g, F.batch_norm(
        t64(x), t64(params[2]).flatten(), t64(params[3]).flatten(), t64(params[0]).flatten(),
        t64(params[1]).flatten(), training=False, eps=eps))
    assert_close(y.numpy(), torch_ref.numpy())


def test_batchnorm_per_activation_bias_chain(ctx, rng):
    """bias -> BN (per activation) -> ELU -> bias: any order of pointwise ops is one kernel."""
    shape = (3, 2, 3, 4)
    x = random(rng, shape)
    b0, b3 = random(rng, (1, 2, 1, 1)), random(rng, (2,))
    params = bn_params(rng, (1, 2, 3, 4))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    ops = [plan.create_op_bias_forward(dp.TensorDesc((1, 2, 1, 1))),
           plan.create_op_batchnorm_inference(fusion.BN_PER_ACTIVATION, dp.TensorDesc((1, 2, 3, 4))),
           plan.create_op_activation_forward(fusion.ACTIVATION_ELU),
           plan.create_op_bias_forward(dp.TensorDesc((2,)))]
    plan.compile()
    assert [plan.get_op(i) for i in range(4)] == ops
    args = fusion.OperatorArgs()
    args.set_bias_forward(ops[0], 1.0, 0.0, *dev(ctx, b0))
    args.set_batchnorm_inference(ops[1], 1.0, 0.0, *dev(ctx, *params), 1e-5)
    args.set_activation_forward(ops[2], 1.0, 0.0, 0.5, 0.0, 0.0)
    args.set_bias_forward(ops[3], 1.0, 0.0, *dev(ctx, b3))
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, *dev(ctx, x), plan.output_desc, y, args)
    z = bn_inference_ref(x + b0, *params, 1e-5)
    ref = F.elu(z, 0.5) + t64(b3).reshape(1, 2, 1, 1)
    assert_close(y.numpy(), ref.numpy())


@pytest.mark.parametrize("shape, widest, activation_last", [
    ((2, 3, 4, 4), 4, True), ((2, 3, 4, 4), 1, True), ((2, 3, 5, 3), 4, True),
    ((3, 5), 4, True), ((2, 3, 4, 4), 4, False)],
    ids=["float4", "forced-scalar", "odd-plane", "2d", "activation-inside"])
def test_per_channel_chain(ctx, rng, shape, widest, activation_last):
    """bias -> BN -> bias -> TANH with every parameter per channel: one pass of packets of 4
    (or 1) elements; with the activation inside the chain, the pointwise generator."""
    x = random(rng, shape, -2, 2)
    c = shape[1]
    view = (1, c) + (1,) * (len(shape) - 2)
    b0, b2 = random(rng, view), random(rng, view)
    params = bn_params(rng, view)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    ops = [plan.create_op_bias_forward(dp.TensorDesc(view)),
           plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc(view))]
    if activation_last:
        ops += [plan.create_op_bias_forward(dp.TensorDesc(view)),
                plan.create_op_activation_forward(fusion.ACTIVATION_TANH)]
    else:
        ops += [plan.create_op_activation_forward(fusion.ACTIVATION_TANH),
                plan.create_op_bias_forward(dp.TensorDesc(view))]
    plan.compile()
    assert plan.runner.per_channel == activation_last
    plan.runner.set_vector_width(widest)
    args = fusion.OperatorArgs()
    args.set_bias_forward(ops[0], 1.0, 0.0, *dev(ctx, b0))
    args.set_batchnorm_inference(ops[1], 1.0, 0.0, *dev(ctx, *params), 1e-3)
    act, bias = (ops[3], ops[2]) if activation_last else (ops[2], ops[3])
    args.set_activation_forward(act, 1.0, 0.0, 0.7, 1.3, 0.0)
    args.set_bias_forward(bias, 1.0, 0.0, *dev(ctx, b2))
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, *dev(ctx, x), plan.output_desc, y, args)
    z = bn_inference_ref(x + b0, *params, 1e-3)
    ref = (1.3 * torch.tanh(0.7 * (z + t64(b2))) if activation_last
           else 1.3 * torch.tanh(0.7 * z) + t64(b2))
    assert_close(y.numpy(), ref.numpy())


def test_activation_parameters_change_between_runs(ctx, rng):
    """Activation parameters are compile-time constants: a new value builds a variant once."""
    shape = (2, 2, 3, 3)
    x = random(rng, shape, -2, 2)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_LEAKYRELU)
    plan.compile()
    xt = dp.Tensor.from_numpy(ctx, x)
    for slope in (0.01, 0.3):
        args = fusion.OperatorArgs()
        args.set_activation_forward(act, 1.0, 0.0, slope, 0.0, 0.0)
        y = poisoned(ctx, shape)
        plan.execute(plan.input_desc, xt, plan.output_desc, y, args)
        assert_close(y.numpy(), F.leaky_relu(t64(x), slope).numpy())


def test_tensors_at_offsets(ctx, rng):
    """Every tensor may start anywhere in its buffer."""
    shape = (2, 3, 2, 2)
    x = random(rng, shape)
    params = bn_params(rng, (3,))
    pool = dp.Tensor.from_numpy(ctx, random(rng, (200,)))

    def at(offset, array):
        t = dp.Tensor.from_buffer(ctx, pool.buffer, array.shape, offset=4 * offset)
        t.copy_(dp.Tensor.from_numpy(ctx, array))
        return t
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 3, 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    args = fusion.OperatorArgs()
    args.set_batchnorm_inference(bn, 1, 0, at(3, params[0]), at(7, params[1]), at(11, params[2]),
                                 at(17, params[3]), 1e-5)
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    y = dp.Tensor.from_buffer(ctx, pool.buffer, shape, offset=4 * 101)
    y.fill_(np.nan)
    plan.execute(plan.input_desc, at(23, x), plan.output_desc, y, args)
    assert_close(y.numpy(), torch.relu(bn_inference_ref(x, *[p.reshape(1, 3, 1, 1) for p in params],
                                                        1e-5)).numpy())


# ---- BN training forward + activation and its backward ---------------------------------------

def bn_train_torch(x, scale, bias, mode, activation, eps):
    """act(batch_norm_train(x)) in float64 with autograd, and the batch statistics."""
    n, c = x.shape[:2]
    xt = t64(x).requires_grad_(True)
    st, bt = t64(scale).requires_grad_(True), t64(bias).requires_grad_(True)
    if mode == fusion.BN_SPATIAL:
        dims = [0] + list(range(2, x.ndim))
        view = (1, c) + (1,) * (x.ndim - 2)
    else:
        dims = [0]
        view = (1,) + x.shape[1:]
    mean = xt.mean(dim=dims, keepdim=True)
    var = xt.var(dim=dims, unbiased=False, keepdim=True)
    z = (xt - mean) / torch.sqrt(var + eps) * st.reshape(view) + bt.reshape(view)
    y = activation(z)
    count = x.size // (c if mode == fusion.BN_SPATIAL else x[0].size)
    return xt, st, bt, y, mean.flatten(), var.flatten(), count


@pytest.mark.parametrize("mode, activation, reference, chunks, shape, widest", [
    (fusion.BN_SPATIAL, fusion.ACTIVATION_RELU, torch.relu, 1, (4, 3, 5, 6), 4),
    (fusion.BN_SPATIAL, fusion.ACTIVATION_RELU, torch.relu, 3, (4, 3, 5, 6), 4),
    (fusion.BN_SPATIAL, fusion.ACTIVATION_SOFTRELU, F.softplus, 1, (3, 3, 4, 6), 4),
    (fusion.BN_SPATIAL, fusion.ACTIVATION_SOFTRELU, F.softplus, 5, (3, 3, 4, 6), 4),
    (fusion.BN_SPATIAL, fusion.ACTIVATION_SOFTRELU, F.softplus, 5, (3, 3, 4, 6), 1),
    (fusion.BN_PER_ACTIVATION, fusion.ACTIVATION_LOGISTIC, torch.sigmoid, 1, (4, 3, 5, 6), 4),
    (fusion.BN_PER_ACTIVATION, fusion.ACTIVATION_LOGISTIC, torch.sigmoid, 2, (4, 3, 5, 6), 4),
], ids=["spatial-relu", "spatial-relu-3-chunks", "spatial-softrelu-float4",
        "spatial-softrelu-float4-5-chunks", "spatial-softrelu-scalar-5-chunks",
        "per_activation-logistic", "per_activation-logistic-2-chunks"])
def test_batchnorm_train_forward_and_backward_activation(ctx, rng, mode, activation, reference,
                                                         chunks, shape, widest):
    """One kernel per channel (chunks=1), or each channel split over work-groups (two kernels);
    float4 loads where the plane size allows them (widest=4), or forced scalar loads."""
    x = random(rng, shape, -1, 3)
    param_shape = (1, 3, 1, 1) if mode == fusion.BN_SPATIAL else (1,) + shape[1:]
    scale, bias = random(rng, param_shape, 0.5, 1.5), random(rng, param_shape)
    running_mean, running_var = random(rng, param_shape), random(rng, param_shape, 0.5, 1.5)
    eps, factor = 1e-4, 0.2

    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_forward(mode, True)
    act = plan.create_op_activation_forward(activation)
    plan.compile()
    plan.runner.set_chunks(chunks)
    plan.runner.set_vector_width(widest)
    assert plan.runner.chunks == chunks
    args = fusion.OperatorArgs()
    scale_d, bias_d, xd = dev(ctx, scale, bias, x)
    saved_mean, saved_inv = poisoned(ctx, param_shape), poisoned(ctx, param_shape)
    run_mean, run_var = dev(ctx, running_mean, running_var)
    args.set_batchnorm_forward(bn, 1.0, 0.0, scale_d, bias_d, saved_mean, saved_inv, run_mean,
                               run_var, factor, eps)
    args.set_activation_forward(act, 1.0, 0.0, 0.0, 0.0, 0.0)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)

    xt, st, bt, y_ref, mean, var, count = bn_train_torch(x, scale, bias, mode, reference, eps)
    assert_close(y.numpy(), y_ref.detach().numpy())
    assert_close(saved_mean.numpy().ravel(), mean.detach().numpy())
    assert_close(saved_inv.numpy().ravel(), (1 / torch.sqrt(var + eps)).detach().numpy())
    unbiased = var * count / (count - 1)
    assert_close(run_mean.numpy().ravel(),
                 ((1 - factor) * t64(running_mean).flatten() + factor * mean).detach().numpy())
    assert_close(run_var.numpy().ravel(),
                 ((1 - factor) * t64(running_var).flatten() + factor * unbiased).detach().numpy())

    # The unfused sequence: the library's training batch norm, then its activation.
    desc = fusion.activation_desc(activation)
    normalised, unfused = poisoned(ctx, shape), poisoned(ctx, shape)
    mean_u, invstd_u = poisoned(ctx, param_shape), poisoned(ctx, param_shape)
    norm.batch_norm_forward_training(xd, normalised, scale_d, bias_d, save_mean=mean_u,
                                     save_invstd=invstd_u, eps=eps, mode=mode)
    activation_forward(desc, normalised, unfused)
    assert_close(y.numpy(), unfused.numpy(), tol=1e-6)
    assert_close(saved_inv.numpy(), invstd_u.numpy(), tol=1e-6)

    # Backward, in MIOpen's op order (batch norm, then activation).
    dy = random(rng, shape)
    y_ref.backward(t64(dy))
    back = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn_back = back.create_op_batchnorm_backward(mode)
    act_back = back.create_op_activation_backward(activation)
    back.compile()
    back.runner.set_chunks(chunks)
    back.runner.set_vector_width(widest)
    bargs = fusion.OperatorArgs()
    dscale, dbias = poisoned(ctx, param_shape), poisoned(ctx, param_shape)
    bargs.set_batchnorm_backward(bn_back, 1.0, 0.0, xd, scale_d, bias_d, dscale, dbias,
                                 saved_mean, saved_inv)
    bargs.set_activation_backward(act_back, 1.0, 0.0, y, None, 0.0, 0.0, 0.0)
    dx = poisoned(ctx, shape)
    back.execute(back.input_desc, *dev(ctx, dy), back.output_desc, dx, bargs)
    assert_close(dx.numpy(), xt.grad.numpy())
    assert_close(dscale.numpy().ravel(), st.grad.numpy().ravel())
    assert_close(dbias.numpy().ravel(), bt.grad.numpy().ravel())
    # Unfused: the activation's backward, then batch norm's.
    dyd, dz, dx_u = dev(ctx, dy)[0], poisoned(ctx, shape), poisoned(ctx, shape)
    dscale_u, dbias_u = poisoned(ctx, param_shape), poisoned(ctx, param_shape)
    activation_backward(desc, unfused, dyd, normalised, dz)
    norm.batch_norm_backward(xd, dz, dx_u, scale_d, mean_u, invstd_u, dscale_u, dbias_u, mode=mode)
    assert_close(dx.numpy(), dx_u.numpy(), tol=1e-6)
    assert_close(dscale.numpy(), dscale_u.numpy(), tol=1e-6)
    assert_close(dbias.numpy(), dbias_u.numpy(), tol=1e-6)


def test_batchnorm_train_without_activation_or_running_statistics(ctx, rng):
    """Plain training batch norm (no activation, nothing saved) on an (N, C) input, and the
    backward plan without activation in data-flow order."""
    shape = (16, 5)
    x = random(rng, shape, -3, 1)
    scale, bias = random(rng, (5,), 0.5, 1.5), random(rng, (5,))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn = plan.create_op_batchnorm_forward(fusion.BN_SPATIAL, running_mean_variance=False)
    plan.compile()
    args = fusion.OperatorArgs()
    scale_d, bias_d, xd = dev(ctx, scale, bias, x)
    args.set_batchnorm_forward(bn, 1, 0, scale_d, bias_d, epsilon=1e-5)
    y = poisoned(ctx, shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    xt, st, bt, y_ref, mean, var, _ = bn_train_torch(x, scale, bias, fusion.BN_SPATIAL,
                                                     lambda z: z, 1e-5)
    assert_close(y.numpy(), y_ref.detach().numpy())
    torch_ref = F.batch_norm(t64(x), None, None, t64(scale), t64(bias), training=True, eps=1e-5)
    assert_close(y.numpy(), torch_ref.numpy())

    dy = random(rng, shape)
    y_ref.backward(t64(dy))
    back = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    bn_back = back.create_op_batchnorm_backward(fusion.BN_SPATIAL)
    back.compile()
    bargs = fusion.OperatorArgs()
    dscale, dbias = poisoned(ctx, (5,)), poisoned(ctx, (5,))
    saved_mean = dp.Tensor.from_numpy(ctx, mean.detach().numpy().astype(np.float32))
    inv_std = (1 / torch.sqrt(var + 1e-5)).detach().numpy().astype(np.float32)
    saved_inv = dp.Tensor.from_numpy(ctx, inv_std)
    bargs.set_batchnorm_backward(bn_back, 1, 0, xd, scale_d, bias_d, dscale, dbias, saved_mean,
                                 saved_inv)
    dx = poisoned(ctx, shape)
    back.execute(back.input_desc, *dev(ctx, dy), back.output_desc, dx, bargs)
    assert_close(dx.numpy(), xt.grad.numpy())
    assert_close(dscale.numpy(), st.grad.numpy())
    assert_close(dbias.numpy(), bt.grad.numpy())


# ---- refusals --------------------------------------------------------------------------------

def test_horizontal_plan_without_convolutions_is_refused(ctx):
    plan = fusion.FusionPlan(ctx, fusion.HORIZONTAL, dp.TensorDesc((1, 2, 3, 3)))
    plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    with pytest.raises(dp.UnsupportedError, match=r"op 0 \(activation.*fused horizontally"):
        plan.compile()


def test_empty_plan_is_refused(ctx):
    with pytest.raises(dp.UnsupportedError, match="supported chains"):
        fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 2, 3, 3))).compile()


def test_convolution_after_pointwise_ops_is_refused(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 2, 5, 5)))
    plan.create_op_bias_forward(dp.TensorDesc((1, 2, 1, 1)))
    plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc((4, 2, 3, 3)))
    with pytest.raises(dp.UnsupportedError, match=r"op 1 \(conv.*supported chains: conv"):
        plan.compile()


def test_op_after_activation_in_conv_chain_is_refused(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 2, 5, 5)))
    plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc((4, 2, 3, 3)))
    plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.create_op_bias_forward(dp.TensorDesc((1, 4, 1, 1)))
    with pytest.raises(dp.UnsupportedError,
                       match=r"op 2 \(bias.*follows the activation.*supported chains"):
        plan.compile()


def test_training_ops_mixed_with_inference_are_refused(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((2, 2, 3, 3)))
    plan.create_op_batchnorm_forward(fusion.BN_SPATIAL)
    plan.create_op_bias_forward(dp.TensorDesc((1, 2, 1, 1)))
    with pytest.raises(dp.UnsupportedError, match=r"op 1 \(bias"):
        plan.compile()
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((2, 2, 3, 3)))
    plan.create_op_activation_backward(fusion.ACTIVATION_RELU)
    with pytest.raises(dp.UnsupportedError, match="batchnorm_backward"):
        plan.compile()


def test_weight_channels_that_disagree_with_the_input_raise_at_compile(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 3, 5, 5)))
    plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc((4, 2, 3, 3)))
    with pytest.raises(dp.ShapeError, match="2 channels per group.*input has 3 channels"):
        plan.compile()


def test_parameter_descriptor_that_disagrees_raises_at_compile(ctx):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc((1, 3, 5, 5)))
    plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 4, 1, 1)))
    with pytest.raises(dp.ShapeError, match=r"shape \(1, 4, 1, 1\), expected \(1, 3, 1, 1\)"):
        plan.compile()


def test_bad_calls(ctx, rng):
    shape = (1, 2, 2, 2)
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(shape))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    with pytest.raises(dp.DlprimError, match="out of range"):
        plan.get_op(1)
    x, y = dev(ctx, random(rng, shape), random(rng, shape))
    args = fusion.OperatorArgs()
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    with pytest.raises(dp.DlprimError, match="compile"):
        plan.execute(plan.input_desc, x, plan.input_desc, y, args)
    plan.compile()
    with pytest.raises(dp.ShapeError, match="input descriptor"):
        plan.execute(dp.TensorDesc((1, 2, 2, 3)), x, plan.output_desc, y, args)
    with pytest.raises(dp.ShapeError, match="x has shape"):
        plan.execute(plan.input_desc, dp.Tensor.empty(ctx, (8,)), plan.output_desc, y, args)
    with pytest.raises(dp.UnsupportedError, match="alpha must be 1"):
        args.set_activation_forward(act, 0.5, 0, 0, 0, 0)
    with pytest.raises(dp.DlprimError, match="no arguments"):
        plan.execute(plan.input_desc, x, plan.output_desc, y, fusion.OperatorArgs())
    with pytest.raises(dp.DlprimError, match="compiled"):
        plan.create_op_bias_forward(dp.TensorDesc((1, 2, 1, 1)))
    with pytest.raises(dp.UnsupportedError, match="BN_SPATIAL"):
        fusion.FusionPlan(ctx, fusion.VERTICAL, plan.input_desc).create_op_batchnorm_inference(
            "bogus", dp.TensorDesc((1, 2, 1, 1)))
    with pytest.raises(dp.UnsupportedError, match="has no convolution"):
        plan.conv_algorithms(1)
    train = fusion.FusionPlan(ctx, fusion.VERTICAL, plan.input_desc)
    with_running = train.create_op_batchnorm_forward(fusion.BN_SPATIAL, True)
    without_running = train.create_op_batchnorm_forward(fusion.BN_SPATIAL, False)
    params = dev(ctx, *bn_params(rng, (2,)))
    with pytest.raises(dp.DlprimError, match="running_mean_variance=True"):
        args.set_batchnorm_forward(with_running, 1, 0, params[0], params[1])
    with pytest.raises(dp.DlprimError, match="running_mean_variance=False.*as None"):
        args.set_batchnorm_forward(without_running, 1, 0, params[0], params[1],
                                   running_mean=params[2], running_variance=params[3])
    assert plan.workspace_size() == 0


# ---- convolution chains: the convolution kernel's epilogue ------------------------------------

def conv_ref(x, w, conv_desc):
    return F.conv2d(t64(x), t64(w), padding=conv_desc.padding, stride=conv_desc.stride,
                    dilation=conv_desc.dilation, groups=conv_desc.groups)


def build_conv_plan(ctx, x_shape, w_shape, conv_desc, chain, k, y_spatial=None):
    """A compiled plan conv -> chain ("bias", "bn", "bn_per_activation" (needs the output's
    spatial shape ``y_spatial``), or an activation mode)."""
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(x_shape))
    ops = [plan.create_op_conv_forward(conv_desc, dp.TensorDesc(w_shape))]
    for step in chain:
        if step == "bias":
            ops.append(plan.create_op_bias_forward(dp.TensorDesc((1, k, 1, 1))))
        elif step == "bn":
            ops.append(plan.create_op_batchnorm_inference(fusion.BN_SPATIAL,
                                                          dp.TensorDesc((1, k, 1, 1))))
        elif step == "bn_per_activation":
            ops.append(plan.create_op_batchnorm_inference(fusion.BN_PER_ACTIVATION,
                                                          dp.TensorDesc((1, k) + y_spatial)))
        else:
            ops.append(plan.create_op_activation_forward(step))
    return plan.compile(), ops


def run_conv_chain(ctx, rng, x_shape, w_shape, conv_desc, chain, act_params=(0.0, 0.0, 0.0),
                   algorithms="all", alpha=1.0, beta=0.0, unfused=True):
    """Run the fused plan with ``algorithms`` ("all" that apply, "default": the selector's
    choice, or a list of names) and compare with PyTorch and with the library's unfused sequence
    (the convolution alone, then the same chain as a pointwise plan)."""
    k = w_shape[0]
    x, w = random(rng, x_shape), random(rng, w_shape)
    xd, wd = dev(ctx, x, w)
    ref = alpha * conv_ref(x, w, conv_desc)
    y_shape = tuple(ref.shape)
    plan, ops = build_conv_plan(ctx, x_shape, w_shape, conv_desc, chain, k, y_shape[2:])
    args = fusion.OperatorArgs()
    args.set_conv_forward(ops[0], alpha, beta, wd)
    for op in ops[1:]:
        if isinstance(op, fusion.BiasForwardOp):
            b = random(rng, (1, k, 1, 1))
            args.set_bias_forward(op, 1, 0, *dev(ctx, b))
            ref = ref + t64(b)
        elif isinstance(op, fusion.BatchNormInferenceOp):
            params = bn_params(rng, op.bn_desc.shape)
            args.set_batchnorm_inference(op, 1, 0, *dev(ctx, *params), 1e-5)
            ref = bn_inference_ref(ref, *params, 1e-5)
        else:
            args.set_activation_forward(op, 1, 0, *act_params)
            ref = act_ref(op.mode, *act_params, ref)
    y_old = random(rng, y_shape)
    ref = ref + beta * t64(y_old)
    names = plan.conv_algorithms(10)
    assert names, "no algorithm"
    if algorithms == "all":
        algorithms = names
    elif algorithms == "default":
        algorithms = names[:1]
    for name in algorithms:
        plan.set_conv_algorithm(name)
        y = dp.Tensor.from_numpy(ctx, y_old) if beta else poisoned(ctx, y_shape)
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
        assert_close(y.numpy(), ref.numpy())
    if not unfused:
        return plan

    # The unfused sequence: the convolution alone, then the rest as a separate plan.
    conv = dp.Convolution(ctx, dp.TensorDesc(x_shape), dp.TensorDesc(w_shape), conv_desc)
    y_conv = poisoned(ctx, y_shape)
    conv.forward(xd, wd, y_conv, alpha=alpha)
    unfused = y_conv
    if len(ops) > 1:
        rest = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(y_shape))
        mirror = {}
        for op in ops[1:]:
            if isinstance(op, fusion.BiasForwardOp):
                mirror[op] = rest.create_op_bias_forward(op.bias_desc)
            elif isinstance(op, fusion.BatchNormInferenceOp):
                mirror[op] = rest.create_op_batchnorm_inference(op.mode, op.bn_desc)
            else:
                mirror[op] = rest.create_op_activation_forward(op.mode)
        rest.compile()
        rest_args = fusion.OperatorArgs()
        for op, twin in mirror.items():
            rest_args.values[twin] = args.get(op)
        unfused = poisoned(ctx, y_shape)
        rest.execute(rest.input_desc, y_conv, rest.output_desc, unfused, rest_args)
    expected = unfused.numpy().astype(np.float64) + beta * y_old
    y = dp.Tensor.from_numpy(ctx, y_old) if beta else poisoned(ctx, y_shape)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    assert_close(y.numpy(), expected, tol=1e-6)
    return plan


CONV = dict(x_shape=(2, 4, 7, 6), w_shape=(6, 4, 3, 3), conv_desc=dp.ConvolutionDesc(padding=1))


@pytest.mark.parametrize("chain, every_algorithm", [
    (["bias", fusion.ACTIVATION_RELU], False),          # MIOpen's CBA
    (["bias", "bn", fusion.ACTIVATION_RELU], True),     # conv + bias + BN + activation
    (["bn", fusion.ACTIVATION_RELU], False),            # the ResNet layer
    ([fusion.ACTIVATION_LEAKYRELU], True),
    (["bias"], False),
    (["bn"], False),
    ([], False),
], ids=["cba", "cbna", "cna", "ca", "cb", "cn", "c"])
def test_conv_chains(ctx, rng, chain, every_algorithm):
    """Each chain against PyTorch and the unfused sequence. Every algorithm is forced on the
    chains with and without a shift in the epilogue (and on alpha/beta and the geometries
    below); the others take the selector's choice, as each algorithm build costs on PoCL."""
    plan = run_conv_chain(ctx, rng, chain=chain, act_params=(0.2, 0.0, 0.0),
                          algorithms="all" if every_algorithm else "default", **CONV)
    assert len(plan.conv_algorithms()) >= 3


@pytest.mark.parametrize("mode, a, b, g", MIOPEN_MODES, ids=lambda v: getattr(v, "name", None))
def test_conv_bn_every_activation_mode(ctx, rng, mode, a, b, g):
    """Each mode in a depthwise convolution's epilogue (the pointwise tests above compare the
    same modes with the unfused sequence)."""
    plan = run_conv_chain(ctx, rng, (1, 3, 5, 5), (3, 1, 3, 3), dp.ConvolutionDesc(1, groups=3),
                          ["bn", mode], act_params=(a, b, g), algorithms=["depthwise"],
                          unfused=False)
    # The depthwise kernel ran, whatever the device's first choice for this problem is.
    assert plan.runner.algorithm == "depthwise"


@pytest.mark.parametrize("x_shape, w_shape, conv_desc, algorithms", [
    ((2, 6, 9, 8), (4, 3, 3, 3), dp.ConvolutionDesc(padding=1, stride=2, groups=2), "all"),
    ((2, 4, 9, 9), (4, 1, 3, 3), dp.ConvolutionDesc(padding=1, groups=4), ["depthwise", "direct"]),
    ((1, 4, 11, 10), (8, 1, 5, 5), dp.ConvolutionDesc(padding=2, stride=2, groups=4),
     ["depthwise", "direct"]),
    ((2, 5, 6, 7), (3, 5, 1, 1), dp.ConvolutionDesc(), "all"),
    ((1, 3, 12, 11), (5, 3, 5, 3), dp.ConvolutionDesc(padding=(2, 0), stride=(1, 2), dilation=(2, 1)),
     "all"),
], ids=["grouped-s2", "depthwise", "depthwise-mult2-5x5-s2", "1x1", "5x3-dil-asym"])
def test_conv_bias_bn_relu_geometries(ctx, rng, x_shape, w_shape, conv_desc, algorithms):
    """Against PyTorch, with every algorithm that applies (depthwise problems: the depthwise and
    direct kernels); the chains test above compares with the unfused sequence. Kernels are
    specialised per kernel size, so each extra algorithm here costs a build on PoCL."""
    run_conv_chain(ctx, rng, x_shape, w_shape, conv_desc, ["bias", "bn", fusion.ACTIVATION_RELU],
                   algorithms=algorithms, unfused=False)


@pytest.mark.parametrize("x_shape, w_shape, conv_desc", [
    CONV.values(),
    ((2, 5, 6, 7), (3, 5, 1, 1), dp.ConvolutionDesc()),
], ids=["3x3", "1x1"])
def test_conv_alpha_beta(ctx, rng, x_shape, w_shape, conv_desc):
    """alpha scales the convolution before the chain; beta blends the old output after it
    (after the activation), with every algorithm."""
    run_conv_chain(ctx, rng, x_shape, w_shape, conv_desc, ["bn", fusion.ACTIVATION_RELU],
                   alpha=0.5, beta=0.75)


def test_conv_plan_reads_arguments_on_every_call(ctx, rng):
    """New tensors, a new epsilon, and new contents of the same tensors all take effect."""
    plan, ops = build_conv_plan(ctx, CONV["x_shape"], CONV["w_shape"], CONV["conv_desc"],
                                ["bn", fusion.ACTIVATION_RELU], 6)
    x, w = random(rng, CONV["x_shape"]), random(rng, CONV["w_shape"])
    xd, wd = dev(ctx, x, w)
    conv = conv_ref(x, w, CONV["conv_desc"])
    first, second = bn_params(rng, (1, 6, 1, 1)), bn_params(rng, (1, 6, 1, 1))
    second_d = dev(ctx, *second)
    for params, tensors, eps in ((first, dev(ctx, *first), 1e-5), (second, second_d, 1e-5),
                                 (second, second_d, 0.5)):
        args = fusion.OperatorArgs()
        args.set_conv_forward(ops[0], 1, 0, wd)
        args.set_batchnorm_inference(ops[1], 1, 0, *tensors, eps)
        args.set_activation_forward(ops[2], 1, 0, 0, 0, 0)
        y = poisoned(ctx, (2, 6, 7, 6))
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
        assert_close(y.numpy(), torch.relu(bn_inference_ref(conv, *params, eps)).numpy())
    third = bn_params(rng, (1, 6, 1, 1))
    for t, values in zip(second_d, third):
        t.copy_(dp.Tensor.from_numpy(ctx, values))
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    assert_close(y.numpy(), torch.relu(bn_inference_ref(conv, *third, 0.5)).numpy())


def test_conv_plan_repeated_calls_see_every_change(ctx, rng):
    """A plan replays its recorded enqueues while x, y and args stay the same; new contents of
    x or w, a set_* call on the same args, and other output tensors must all take effect."""
    plan, ops = build_conv_plan(ctx, CONV["x_shape"], CONV["w_shape"], CONV["conv_desc"],
                                ["bn", fusion.ACTIVATION_RELU], 6)
    x, w = random(rng, CONV["x_shape"]), random(rng, CONV["w_shape"])
    xd, wd = dev(ctx, x, w)
    params = bn_params(rng, (1, 6, 1, 1))
    args = fusion.OperatorArgs()
    args.set_conv_forward(ops[0], 1, 0, wd)
    args.set_batchnorm_inference(ops[1], 1, 0, *dev(ctx, *params), 1e-5)
    args.set_activation_forward(ops[2], 1, 0, 0, 0, 0)
    y = poisoned(ctx, (2, 6, 7, 6))

    def check(x, w, params, eps, out):
        expected = torch.relu(bn_inference_ref(conv_ref(x, w, CONV["conv_desc"]), *params, eps))
        assert_close(out.numpy(), expected.numpy())

    for _ in range(2):   # the second call replays
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
        check(x, w, params, 1e-5, y)
    x = random(rng, CONV["x_shape"])
    xd.copy_(dp.Tensor.from_numpy(ctx, x))
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    check(x, w, params, 1e-5, y)
    w = random(rng, CONV["w_shape"])
    wd.copy_(dp.Tensor.from_numpy(ctx, w))
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    check(x, w, params, 1e-5, y)
    params = bn_params(rng, (1, 6, 1, 1))
    args.set_batchnorm_inference(ops[1], 1, 0, *dev(ctx, *params), 0.25)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    check(x, w, params, 0.25, y)
    other = poisoned(ctx, (2, 6, 7, 6))
    plan.execute(plan.input_desc, xd, plan.output_desc, other, args)
    check(x, w, params, 0.25, other)
    plan.set_conv_algorithm(plan.conv_algorithms()[-1])
    y.fill_(np.nan)
    plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    check(x, w, params, 0.25, y)


def test_conv_plan_computes_chain_in_epilogue_every_algorithm(ctx, rng):
    """The convolution's own kernel computes the bias / batch-norm chain from the parameters (no
    fold kernel runs first): with new contents in the same parameter tensors, every
    algorithm's replay applies them, and a replay enqueues what the convolution alone does."""
    plan, ops = build_conv_plan(ctx, CONV["x_shape"], CONV["w_shape"], CONV["conv_desc"],
                                ["bias", "bn", fusion.ACTIVATION_RELU], 6)
    x, w, b = random(rng, CONV["x_shape"]), random(rng, CONV["w_shape"]), random(rng, (1, 6, 1, 1))
    xd, wd, bd = dev(ctx, x, w, b)
    conv = conv_ref(x, w, CONV["conv_desc"]) + t64(b)
    params = bn_params(rng, (1, 6, 1, 1))
    param_tensors = dev(ctx, *params)
    args = fusion.OperatorArgs()
    args.set_conv_forward(ops[0], 1, 0, wd)
    args.set_bias_forward(ops[1], 1, 0, bd)
    args.set_batchnorm_inference(ops[2], 1, 0, *param_tensors, 1e-4)
    args.set_activation_forward(ops[3], 1, 0, 0, 0, 0)
    algorithms = plan.conv_algorithms()
    assert len(algorithms) > 2
    for algo in algorithms:
        plan.set_conv_algorithm(algo)
        y = poisoned(ctx, (2, 6, 7, 6))
        for _ in range(3):   # record, then replay twice with new parameter contents
            plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
            assert_close(y.numpy(), torch.relu(bn_inference_ref(conv, *params, 1e-4)).numpy())
            params = bn_params(rng, (1, 6, 1, 1))
            for t, values in zip(param_tensors, params):
                t.copy_(dp.Tensor.from_numpy(ctx, values))
            y.fill_(np.nan)
        steps = plan._bound[2].steps
        alone = dp.Convolution(ctx, xd.desc, wd.desc, CONV["conv_desc"])
        out = poisoned(ctx, (2, 6, 7, 6))
        with Recording() as recording:
            alone.forward(xd, wd, out, algo=algo)
        assert len(steps) == len(recording.steps), algo


def test_conv_plan_logs_one_line_per_call(ctx, rng, capsys, monkeypatch):
    """DLPRIM_LOG_CMD: a plan logs its own CBAInfer line on every call, recorded or replayed,
    and not the lines of the convolution it runs inside."""
    monkeypatch.setenv("DLPRIM_LOG_CMD", "1")
    dp.config.reload()
    plan, ops = build_conv_plan(ctx, CONV["x_shape"], CONV["w_shape"], CONV["conv_desc"],
                                ["bias", fusion.ACTIVATION_RELU], 6)
    xd, wd, bd = dev(ctx, random(rng, CONV["x_shape"]), random(rng, CONV["w_shape"]),
                     random(rng, (1, 6, 1, 1)))
    args = fusion.OperatorArgs()
    args.set_conv_forward(ops[0], 1, 0, wd)
    args.set_bias_forward(ops[1], 1, 0, bd)
    args.set_activation_forward(ops[2], 1, 0, 0, 0, 0)
    y = dp.Tensor.empty(ctx, plan.output_desc.shape)
    capsys.readouterr()
    for _ in range(3):
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
    logged = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("DLPRIM_LOG_CMD: ")]
    assert len(logged) == 3 and all("CBAInfer" in line for line in logged), logged


def test_conv_plan_facts(ctx):
    plan, ops = build_conv_plan(ctx, CONV["x_shape"], CONV["w_shape"], CONV["conv_desc"],
                                ["bn", fusion.ACTIVATION_RELU], 6)
    assert plan.output_desc == dp.TensorDesc((2, 6, 7, 6))
    names = plan.conv_algorithms(10)
    assert plan.conv_algorithms(1) == names[:1]
    assert all(plan.workspace_size(n) >= 0 for n in names)
    assert plan.get_op(2) is ops[2]
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        plan.set_conv_algorithm("no_such_algorithm")


def test_conv_bn_descriptor_that_disagrees_with_conv_output_raises(ctx):
    with pytest.raises(dp.ShapeError, match=r"op 1 .*\(1, 5, 1, 1\), expected \(1, 6, 1, 1\)"):
        plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(CONV["x_shape"]))
        plan.create_op_conv_forward(CONV["conv_desc"], dp.TensorDesc(CONV["w_shape"]))
        plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 5, 1, 1)))
        plan.compile()


@pytest.mark.parametrize("x_shape, w_shape, conv_desc", [
    CONV.values(),
    ((2, 5, 6, 7), (3, 5, 1, 1), dp.ConvolutionDesc()),
], ids=["3x3", "1x1"])
def test_conv_bias_per_activation_batchnorm_relu(ctx, rng, x_shape, w_shape, conv_desc):
    """Per-activation batch norm after a convolution: the epilogue computes that link per
    output position, with every algorithm that applies."""
    run_conv_chain(ctx, rng, x_shape, w_shape, conv_desc,
                   ["bias", "bn_per_activation", fusion.ACTIVATION_RELU])


# ---- conv_bias_activation: act(alpha1 * conv(x) + alpha2 * z + bias) --------------------------

@pytest.mark.parametrize("with_z", [True, False], ids=["residual", "no-residual"])
def test_conv_bias_activation(ctx, rng, with_z):
    x, w, bias = random(rng, (2, 4, 6, 6)), random(rng, (5, 4, 3, 3)), random(rng, (5,))
    z = random(rng, (2, 5, 3, 3))
    xd, wd, bd, zd = dev(ctx, x, w, bias, z)
    out = poisoned(ctx, (2, 5, 3, 3))
    fusion.conv_bias_activation(xd, wd, bd, zd if with_z else None, alpha1=0.5,
                                alpha2=1.5 if with_z else 0.0, activation="relu", stride=2,
                                padding=1, out=out)
    ref = 0.5 * F.conv2d(t64(x), t64(w), stride=2, padding=1) + t64(bias).reshape(1, 5, 1, 1)
    if with_z:
        ref = ref + 1.5 * t64(z)
    assert_close(out.numpy(), torch.relu(ref).numpy())
    # The unfused sequence: the library's conv2d, then the additions and ReLU on the host.
    unfused = dp.functional.conv2d(xd, wd, bd, stride=2, padding=1).numpy().astype(np.float64)
    unfused = 0.5 * (unfused - bias.reshape(1, 5, 1, 1)) + bias.reshape(1, 5, 1, 1)
    if with_z:
        unfused = unfused + 1.5 * z
    assert_close(out.numpy(), np.maximum(unfused, 0), tol=1e-6)


def test_conv_bias_activation_bad_input(ctx, rng):
    xd, wd = dev(ctx, random(rng, (1, 4, 5, 5)), random(rng, (3, 4, 3, 3)))
    with pytest.raises(dp.ShapeError, match="bias has shape"):
        fusion.conv_bias_activation(xd, wd, *dev(ctx, random(rng, (4,))))
    with pytest.raises(dp.ShapeError, match="z has shape"):
        fusion.conv_bias_activation(xd, wd, None, *dev(ctx, random(rng, (1, 3, 5, 5))))
    with pytest.raises(dp.ShapeError, match="channels"):
        fusion.conv_bias_activation(xd, *dev(ctx, random(rng, (3, 2, 3, 3))))


# ---- HORIZONTAL: sibling convolutions of one input, beyond MIOpen -----------------------------

def test_horizontal_sibling_convolutions(ctx, rng):
    """Two 1x1 convolutions of one input (the second without a bias) and a shared ReLU, as one
    convolution whose output is theirs concatenated along channels."""
    x_shape = (2, 4, 5, 6)
    x, w1, w2, b1 = (random(rng, x_shape), random(rng, (3, 4, 1, 1)), random(rng, (5, 4, 1, 1)),
                     random(rng, (3,)))
    plan = fusion.FusionPlan(ctx, fusion.HORIZONTAL, dp.TensorDesc(x_shape))
    conv1 = plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc(w1.shape))
    bias1 = plan.create_op_bias_forward(dp.TensorDesc((1, 3, 1, 1)))
    conv2 = plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc(w2.shape))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    assert plan.output_desc == dp.TensorDesc((2, 8, 5, 6))
    args = fusion.OperatorArgs()
    w1d, w2d, b1d = dev(ctx, w1, w2, b1)
    args.set_conv_forward(conv1, 1, 0, w1d)
    args.set_bias_forward(bias1, 1, 0, b1d)
    args.set_conv_forward(conv2, 1, 0, w2d)
    args.set_activation_forward(act, 1, 0, 0, 0, 0)
    ref = torch.relu(torch.cat([F.conv2d(t64(x), t64(w1), t64(b1)), F.conv2d(t64(x), t64(w2))], 1))
    for name in plan.conv_algorithms():
        plan.set_conv_algorithm(name)
        y = poisoned(ctx, (2, 8, 5, 6))
        plan.execute(plan.input_desc, *dev(ctx, x), plan.output_desc, y, args)
        assert_close(y.numpy(), ref.numpy())


def test_horizontal_refusals(ctx):
    x_desc = dp.TensorDesc((1, 4, 5, 5))
    plan = fusion.FusionPlan(ctx, fusion.HORIZONTAL, x_desc)
    plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc((3, 4, 1, 1)))
    plan.create_op_conv_forward(dp.ConvolutionDesc(padding=1), dp.TensorDesc((3, 4, 3, 3)))
    with pytest.raises(dp.UnsupportedError, match=r"op 1 \(conv.*differs from op 0.*supported chains"):
        plan.compile()
    plan = fusion.FusionPlan(ctx, fusion.HORIZONTAL, x_desc)
    plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc((3, 4, 1, 1)))
    plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, 3, 1, 1)))
    with pytest.raises(dp.UnsupportedError, match=r"op 1 \(batchnorm_inference.*horizontal"):
        plan.compile()
