"""A fusion plan's bias / batch-norm chain computed in the convolution's own epilogue
(kernels/fusion_fold.cl.mako's apply_chain, imported by conv_common.cl.mako and gemm_common.cl.mako):
the 1x1 GEMM with each of its kernels forced ("tiled" computes a per-channel chain once per
register-block row; "splitk" and "small" per element), folded and per image, per channel and
per output position, NHWC (channels on the GEMM's columns), and contents changed between
calls; and every depthwise algorithm with a chain (the other algorithms are forced in
test_fusion.py). Float64 PyTorch references, outputs poisoned with NaN."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
from conftest import assert_close, poisoned, random
from dlprim_py import fusion
from dlprim_py.ops import gemm as gemm_ops
from test_fusion import run_conv_chain

# Small register blocks build fastest on PoCL and still take the vector stores (P % 2 == 0).
TILED = {"kernel": "tiled", "tile_m": 16, "tile_n": 16, "tile_k": 8, "wpt_m": 2, "wpt_n": 2,
         "vec": 2, "pad": 2, "double_buffer": 1, "split_k": 1, "global_vec": 2}
FORCED = {"tiled": TILED, "splitk": dict(TILED, split_k=3),
          "small": {"kernel": "small", "small_m": 8, "small_n": 16}}


def force(tuning_rules, kernel):
    # A rule of this device's entry in a user tuning database, ahead of the shipped ones.
    tuning_rules("gemm", [{"when": {}, "params": dict(FORCED[kernel])}])


def t64(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def bn_params(rng, shape):
    return [random(rng, shape, 0.5, 1.5), random(rng, shape), random(rng, shape),
            random(rng, shape, 0.2, 2.0)]


def bn_ref(v, scale, bias, mean, variance, eps):
    scale, bias, mean, variance = map(t64, (scale, bias, mean, variance))
    return (v - mean) / torch.sqrt(variance + eps) * scale + bias


def plan_bias_bn_relu(ctx, x_shape, w_shape, per_activation, y_spatial):
    k = w_shape[0]
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, dp.TensorDesc(x_shape))
    conv = plan.create_op_conv_forward(dp.ConvolutionDesc(), dp.TensorDesc(w_shape))
    bias = plan.create_op_bias_forward(dp.TensorDesc((1, k, 1, 1)))
    bn_shape = (1, k) + (y_spatial if per_activation else (1, 1))
    bn = plan.create_op_batchnorm_inference(
        fusion.BN_PER_ACTIVATION if per_activation else fusion.BN_SPATIAL, dp.TensorDesc(bn_shape))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    return plan.compile(), (conv, bias, bn, act), bn_shape


@pytest.mark.parametrize("kernel, algo, x_shape, per_activation", [
    ("tiled", "gemm", (2, 6, 8, 4), False),          # folded C, vector stores, hoisted rows
    ("tiled", "gemm", (3, 5, 7, 5), False),          # folded C, odd P: scalar stores
    ("tiled", "gemm_per_image", (2, 6, 8, 4), False),   # batched GEMM, vector stores
    ("tiled", "gemm", (2, 6, 8, 4), True),           # per position: computed per element
    ("tiled", "gemm_per_image", (3, 5, 7, 5), True),
    ("splitk", "gemm", (3, 5, 7, 5), False),         # the split-K reduction's epilogue
    ("small", "gemm", (3, 5, 7, 5), True),
], ids=["tiled-folded-vec", "tiled-folded-odd", "tiled-per-image", "tiled-position",
        "tiled-per-image-position", "splitk", "small-position"])
def test_gemm_chain_every_kernel(ctx, rng, monkeypatch, kernel, algo, x_shape, per_activation, tuning_rules):
    """conv 1x1 -> bias -> BN -> ReLU through each GEMM kernel, then again with new contents
    in the same parameter tensors (a replay must read them)."""
    force(tuning_rules, kernel)
    k = 9   # rows beyond a 16-row tile's last channel: the hoisted rows clamp, never store
    w_shape = (k, x_shape[1], 1, 1)
    y_spatial = tuple(x_shape[2:])
    plan, (conv, bias_op, bn, act), bn_shape = plan_bias_bn_relu(ctx, x_shape, w_shape,
                                                                  per_activation, y_spatial)
    plan.set_conv_algorithm(algo)
    x, w, b = random(rng, x_shape), random(rng, w_shape), random(rng, (1, k, 1, 1))
    xd, wd, bd = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, b))
    params = bn_params(rng, bn_shape)
    param_tensors = [dp.Tensor.from_numpy(ctx, a) for a in params]
    args = fusion.OperatorArgs()
    args.set_conv_forward(conv, 1.0, 0.0, wd)
    args.set_bias_forward(bias_op, 1.0, 0.0, bd)
    args.set_batchnorm_inference(bn, 1.0, 0.0, *param_tensors, 1e-3)
    args.set_activation_forward(act, 1.0, 0.0, 0.0, 0.0, 0.0)
    pre = torch.nn.functional.conv2d(t64(x), t64(w)) + t64(b)
    y = poisoned(ctx, (x_shape[0], k) + y_spatial)
    for _ in range(2):
        plan.execute(plan.input_desc, xd, plan.output_desc, y, args)
        assert_close(y.numpy(), torch.relu(bn_ref(pre, *params, 1e-3)).numpy())
        params = bn_params(rng, bn_shape)
        for t, values in zip(param_tensors, params):
            t.copy_(dp.Tensor.from_numpy(ctx, values))
        y.fill_(np.nan)
    assert plan.runner.algorithm == algo


def test_gemm_chain_nhwc(ctx, rng, monkeypatch, tuning_rules):
    """NHWC 1x1 (Convolution.forward with a chain): channels are the GEMM's columns."""
    force(tuning_rules, "tiled")
    n, c, h, w_, k = 2, 6, 4, 4, 10
    conv = dp.Convolution(ctx, dp.TensorDesc((n, h, w_, c)), dp.TensorDesc((k, 1, 1, c)),
                          dp.ConvolutionDesc(), layout="NHWC")
    x, w = random(rng, (n, c, h, w_)), random(rng, (k, c, 1, 1))
    params = bn_params(rng, (k,))
    tensors = [dp.Tensor.from_numpy(ctx, a) for a in params]
    # chain_params order: mean, variance, scale, bias, epsilon.
    chain_args = []
    for t in (tensors[2], tensors[3], tensors[0], tensors[1]):
        chain_args += [t.buffer, np.int32(t.offset_elements)]
    chain_args.append(np.float32(1e-3))
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731
    y = poisoned(ctx, (n, h, w_, k))
    conv.forward(dp.Tensor.from_numpy(ctx, nhwc(x)), dp.Tensor.from_numpy(ctx, nhwc(w)), y,
                 activation="relu", algo="gemm", chain=(("bn", False),), chain_args=chain_args)
    ref = torch.relu(bn_ref(torch.nn.functional.conv2d(t64(x), t64(w)),
                            *(a.reshape(1, k, 1, 1) for a in params), 1e-3))
    assert_close(y.numpy(), nhwc(ref.numpy()))


def test_chain_and_scale_together_is_refused(ctx, rng):
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 2, 3, 3)), dp.TensorDesc((2, 2, 1, 1)),
                          dp.ConvolutionDesc())
    x, w = dp.Tensor.from_numpy(ctx, random(rng, (1, 2, 3, 3))), dp.Tensor.zeros(ctx, (2, 2, 1, 1))
    with pytest.raises(dp.ShapeError, match="either a chain or scale/shift"):
        conv.forward(x, w, dp.Tensor.empty(ctx, (1, 2, 3, 3)), scale=dp.Tensor.zeros(ctx, (2,)),
                     chain=(("bias", False),), chain_args=())


@pytest.mark.parametrize("bn", ["bn", "bn_per_activation"])
def test_depthwise_chain_every_algorithm(ctx, rng, bn):
    """A depthwise convolution with bias -> BN -> ReLU through every algorithm that applies
    (depthwise, depthwise_rows, depthwise_tiled, implicit GEMM, direct), per channel and per
    output position, against PyTorch in float64."""
    plan = run_conv_chain(ctx, rng, (2, 4, 9, 9), (4, 1, 3, 3),
                          dp.ConvolutionDesc(padding=1, groups=4),
                          ["bias", bn, fusion.ACTIVATION_RELU], algorithms="all", unfused=False)
    assert {"depthwise", "depthwise_rows", "depthwise_tiled"} <= set(plan.conv_algorithms())
