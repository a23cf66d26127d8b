"""Fusion plans after MIOpen's fusion API: several operators, one kernel.

A MIOpen user transliterates one to one::

    miopenCreateFusionPlan(&plan, miopenVerticalFusion, xDesc)   plan = fusion.FusionPlan(ctx, fusion.VERTICAL, x_desc)
    miopenCreateOpConvForward(plan, &conv, convDesc, wDesc)      conv = plan.create_op_conv_forward(conv_desc, w_desc)
    miopenCreateOpBiasForward(plan, &bias, bDesc)                bias = plan.create_op_bias_forward(b_desc)
    miopenCreateOpBatchNormInference(plan, &bn, mode, bnDesc)    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, bn_desc)
    miopenCreateOpActivationForward(plan, &act, mode)            act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    miopenCompileFusionPlan(handle, plan)                        plan.compile()
    miopenFusionPlanGetOp(plan, i, &op)                          plan.get_op(i)
    miopenFusionPlanGetWorkSpaceSize(handle, plan, &size, algo)  plan.workspace_size(algo)
    miopenFusionPlanConvolutionGetAlgo(plan, n, &count, algos)   plan.conv_algorithms(n)
    miopenCreateOperatorArgs(&args)                              args = fusion.OperatorArgs()
    miopenSetOpArgsConvForward(args, conv, &a, &b, w)            args.set_conv_forward(conv, a, b, w)
    miopenSetOpArgsBiasForward(args, bias, &a, &b, bias)         args.set_bias_forward(bias, a, b, bias_tensor)
    miopenSetOpArgsBatchNormInference(args, bn, &a, &b, ...)     args.set_batchnorm_inference(bn, a, b, scale, bias, mean, var, eps)
    miopenSetOpArgsActivForward(args, act, &a, &b, aa, ab, ag)   args.set_activation_forward(act, a, b, aa, ab, ag)
    miopenExecuteFusionPlan(handle, plan, xDesc, x, yDesc, y, a) plan.execute(x_desc, x, y_desc, y, args)

and MIOpen's training-side fused paths: ``create_op_batchnorm_forward`` (+ activation) and
``create_op_batchnorm_backward`` with ``create_op_activation_backward``.

``compile`` chooses one of the solvers of the "fusion" family (``dlprim_py.solver``;
``DLPRIM_FUSION_ALGO=<name>`` forces one), each the way one kind of chain fuses; it raises
UnsupportedError for anything else, naming the op that breaks the chain:

* ``conv_chain``: ``conv [bias | batchnorm_inference]* [activation]``: the convolution's own
  kernel applies the epilogue ``act(alpha * acc * scale + shift) + beta * y_old`` for every
  algorithm (the GEMM of 1x1 convolutions, Winograd's output transform, implicit GEMM,
  depthwise, direct), grouped and depthwise convolutions included. A bias alone is the shift. A
  batch norm (after or before a bias) folds into a scale and a shift per channel, conv(x, w) *
  scale[k] + shift[k], which the convolution's kernel computes itself from the chain's
  parameters (kernels/fusion_fold.cl.mako's apply_chain: once per channel where a work item
  keeps one, the GEMM's rows and Winograd's output transform, else per stored element), on every
  run: MIOpen's arguments give mean and variance, not folded vectors, and their contents may
  change between calls. No other kernel runs, and none without the epilogue is built. A
  per-activation batch norm varies over (k, h, w): its link is computed per output position
  instead of per channel.
* ``pointwise_chain``: ``[bias | batchnorm_inference | activation]+`` without a convolution: one
  kernel, a pass of float4 packets when every parameter is per channel and the activation comes
  last, else the pointwise generator with the parameters broadcast.
* ``batchnorm_train_forward``: ``batchnorm_forward [activation]``: batch norm in training mode
  (statistics, saved mean and inverse std, running averages) and the activation, by the
  library's training batch norm (``dlprim_py.ops.norm``, the kernels ``F.batch_norm`` runs) with
  the activation in its elementwise step.
* ``batchnorm_train_backward``: ``batchnorm_backward [activation_backward]`` (either order): the
  backward of act(batchnorm_train(x)) through the activation's derivative, the same batch
  norm's backward with the activation's input recomputed from x and the saved statistics.
* ``horizontal_convs``: ``fusion.HORIZONTAL`` (beyond MIOpen, which refuses it): sibling
  convolutions of one input with the same kernel size and geometry, each optionally followed
  by its bias, optionally one activation last; one convolution chain over their concatenated
  weights, whose output is theirs concatenated along channels in op order.

Training batch norm refuses one value per channel (N * H * W == 1), as torch does.

Tensors are NCHW float32. Bias and spatial batch-norm parameters have shape (1, C, 1, 1) (or
(C,)); per-activation batch-norm parameters (1, C, H, W). Activation parameters (alpha, beta,
gamma) are compile-time constants of the kernels: ``compile`` builds with the mode's defaults,
and ``execute`` builds, once per plan and parameter set, a variant for other values.
"""
# The public names of the fusion API (``from dlprim_py.fusion import X``) and the solvers.
from .batchnorm import BatchNormTrainBackward, BatchNormTrainForward  # noqa: F401
from .cba import conv_bias_activation  # noqa: F401
from .conv import ConvChain, HorizontalConvs  # noqa: F401
from .ops import (  # noqa: F401
                  ACTIVATION_ABS, ACTIVATION_CLIPPEDRELU, ACTIVATION_ELU, ACTIVATION_GELU,
                  ACTIVATION_GELU_TANH, ACTIVATION_HARDSIGMOID, ACTIVATION_HARDSWISH,
                  ACTIVATION_HARDTANH, ACTIVATION_LEAKYRELU, ACTIVATION_LOGISTIC,
                  ACTIVATION_PASTHRU, ACTIVATION_POWER, ACTIVATION_RELU, ACTIVATION_SILU,
                  ACTIVATION_SOFTRELU, ACTIVATION_TANH, BN_PER_ACTIVATION, BN_SPATIAL,
                  HORIZONTAL, SUPPORTED_CHAINS, VERTICAL, ActivationBackwardOp,
                  ActivationForwardOp, BatchNormBackwardOp, BatchNormForwardOp,
                  BatchNormInferenceOp, BiasForwardOp, ConvForwardOp, FusionOp, OperatorArgs,
                  OpSpec, activation_desc)
from .plan import FAMILY, FusionPlan, FusionProblem  # noqa: F401
from .pointwise import PointwiseChain  # noqa: F401

__all__ = [
    "FusionPlan", "OperatorArgs", "VERTICAL", "HORIZONTAL", "BN_SPATIAL", "BN_PER_ACTIVATION",
    "SUPPORTED_CHAINS", "conv_bias_activation", "activation_desc",
] + [name for name in dir() if name.startswith("ACTIVATION_")]
