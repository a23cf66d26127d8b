"""Suite ``fusion``: MIOpen-style fusion plans (one kernel for convolution + bias / batch norm +
activation, and training batch norm + activation) against the same chain as separate PyTorch
calls, and against the library's own unfused calls.

``plan_case`` is also what ``dlprim-driver CBAInfer`` runs.
"""
import numpy as np

from ..activation import ActivationDesc
from .conv import ConvShape
from .harness import Case, CaseSpec, Skip, error_metric
from .torch_baseline import activation_reference

# MIOpenDriver CBAInfer's -F fusion modes, by index, as the ops of the chain.
FUSION_MODES = ("cbna", "cna", "na", "cn", "cba", "ca", "cb")
BN_EPSILON = 1e-5


def fusion_api():
    try:
        from .. import fusion
    except ImportError as e:
        raise Skip(f"dlprim_py.fusion not importable ({e})") from None
    return fusion


def chain_ops(mode):
    """("conv", "bias", "bn", "act") members of a mode string such as "cbna"."""
    if mode not in FUSION_MODES:
        raise ValueError(f"fusion mode must be one of {', '.join(FUSION_MODES)}, got {mode!r}")
    return {"conv": "c" in mode, "bias": "b" in mode, "bn": "n" in mode, "act": "a" in mode}


def plan_case(bench, shape, mode, activation=None, algo=None, torch_unfused=True):
    """A Case running a compiled FusionPlan for ``mode`` ("cbna", "cba", ...) on ``shape``
    (a ConvShape; for "na" only its input is used). ``activation``: an ActivationDesc (ReLU by
    default); ``algo``: force the convolution algorithm (name or index)."""
    fusion = fusion_api()
    from ..tensor import Tensor, TensorDesc
    from ..ops.conv import ConvolutionDesc
    ctx = bench.ctx
    ops = chain_ops(mode)
    act = activation or ActivationDesc("relu")
    x_host = bench.random(shape.input_shape)
    channels = shape.k if ops["conv"] else shape.c
    fan_in = (shape.c // shape.groups) * shape.r * shape.s
    w_host = bench.random(shape.weight_shape, -1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in))
    bias_host = bench.random((channels,))
    bn_hosts = [bench.random((channels,), 0.5, 1.5), bench.random((channels,)),
                bench.random((channels,), -0.2, 0.2), bench.random((channels,), 0.5, 1.5)]
    out_shape = shape.output_shape if ops["conv"] else shape.input_shape

    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, TensorDesc(shape.input_shape))
    args = fusion.OperatorArgs()
    x = Tensor.from_numpy(ctx, x_host)
    y = Tensor.empty(ctx, out_shape)
    param_desc = TensorDesc((1, channels, 1, 1))
    created = []
    if ops["conv"]:
        conv_desc = ConvolutionDesc(padding=shape.pad, stride=shape.stride,
                                    dilation=shape.dilation, groups=shape.groups)
        created.append(("conv", plan.create_op_conv_forward(conv_desc, TensorDesc(shape.weight_shape))))
    if ops["bias"]:
        created.append(("bias", plan.create_op_bias_forward(param_desc)))
    if ops["bn"]:
        created.append(("bn", plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, param_desc)))
    if ops["act"]:
        created.append(("act", plan.create_op_activation_forward(act.mode)))
    plan.compile()
    algorithm = "pointwise"
    if ops["conv"]:
        names = plan.conv_algorithms()
        if algo is not None:
            if isinstance(algo, str) and algo.isdigit():
                algo = int(algo)
            chosen = names[algo] if isinstance(algo, int) and 0 <= algo < len(names) else algo
            plan.set_conv_algorithm(chosen)
            algorithm = str(chosen)
        else:
            algorithm = names[0]
    keep = []  # device tensors the arguments refer to
    for kind, op in created:
        if kind == "conv":
            w = Tensor.from_numpy(ctx, w_host)
            keep.append(w)
            args.set_conv_forward(op, 1.0, 0.0, w)
        elif kind == "bias":
            b = Tensor.from_numpy(ctx, bias_host.reshape(1, channels, 1, 1))
            keep.append(b)
            args.set_bias_forward(op, 1.0, 0.0, b)
        elif kind == "bn":
            scale, shift, mean, var = (Tensor.from_numpy(ctx, h.reshape(1, channels, 1, 1))
                                       for h in bn_hosts)
            keep += [scale, shift, mean, var]
            args.set_batchnorm_inference(op, 1.0, 0.0, scale, shift, mean, var, BN_EPSILON)
        else:
            args.set_activation_forward(op, 1.0, 0.0, act.alpha, act.beta, act.gamma)

    def run():
        plan.execute(plan.input_desc, x, plan.output_desc, y, args)

    def chain(t, xt, wt, bt, scale, shift, mean, var):
        out = xt
        if ops["conv"]:
            out = t.nn.functional.conv2d(out, wt, bt if ops["bias"] else None, shape.stride,
                                         shape.pad, shape.dilation, shape.groups)
        elif ops["bias"]:
            out = out + bt.reshape(1, -1, 1, 1)
        if ops["bn"]:
            out = t.nn.functional.batch_norm(out, mean, var, scale, shift, False, 0.0, BN_EPSILON)
        if ops["act"]:
            out = activation_reference(t, act, out)
        return out

    hosts = [x_host, w_host, bias_host] + bn_hosts

    def verify():
        y.fill_(np.nan)
        run()
        return error_metric(y.numpy(), bench.reference.compute(chain, *hosts))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        targs = [tb.tensor(h) for h in hosts]
        torch_run = lambda: chain(tb.torch, *targs)  # noqa: E731
    flops = shape.flops() if ops["conv"] else 0.0
    unit = "GFLOP/s" if ops["conv"] else "GB/s"
    work = flops if ops["conv"] else 2.0 * 4 * np.prod(out_shape)
    params = dict(shape.describe(), chain=plan.describe(), mode=mode, activation=act.mode.name)
    return Case(run, verify, work, unit, algorithm=algorithm, torch_run=torch_run, params=params)


def unfused_case(bench, shape, activation=None):
    """conv, then bias add, then the activation as three library calls: what the plan saves."""
    from ..ops.conv import Convolution, ConvolutionDesc
    from ..ops.pointwise import binary
    from ..ops.activation_ops import activation_forward
    from ..tensor import Tensor, TensorDesc
    ctx = bench.ctx
    act = activation or ActivationDesc("relu")
    x_host = bench.random(shape.input_shape)
    fan_in = (shape.c // shape.groups) * shape.r * shape.s
    w_host = bench.random(shape.weight_shape, -1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in))
    bias_host = bench.random((shape.k,))
    conv = Convolution(ctx, TensorDesc(shape.input_shape), TensorDesc(shape.weight_shape),
                       ConvolutionDesc(padding=shape.pad, stride=shape.stride,
                                       dilation=shape.dilation, groups=shape.groups))
    x, w = Tensor.from_numpy(ctx, x_host), Tensor.from_numpy(ctx, w_host)
    bias = Tensor.from_numpy(ctx, bias_host.reshape(1, shape.k, 1, 1))
    conv_out = Tensor.empty(ctx, shape.output_shape)
    y = Tensor.empty(ctx, shape.output_shape)
    from ..autograd import no_grad
    algorithm = conv.algorithms("forward")[0]

    def run():
        with no_grad():
            conv.forward(x, w, conv_out)
            biased = binary("add", conv_out, bias)
            activation_forward(act, biased, y)

    def chain(t, xt, wt, bt):
        out = t.nn.functional.conv2d(xt, wt, bt, shape.stride, shape.pad, shape.dilation,
                                     shape.groups)
        return activation_reference(t, act, out)

    def verify():
        y.fill_(np.nan)
        run()
        return error_metric(y.numpy(), bench.reference.compute(chain, x_host, w_host, bias_host))

    params = dict(shape.describe(), chain="conv, add, activation (3 calls)")
    return Case(run, verify, shape.flops(), "GFLOP/s", algorithm=f"{algorithm} + 2 pointwise",
                params=params)


def bn_train_case(bench, input_shape, activation=None):
    """Training batch norm + activation (statistics, normalisation, running averages) as one
    plan, against torch's batch_norm(training=True) followed by the activation."""
    fusion = fusion_api()
    from ..tensor import Tensor, TensorDesc
    ctx = bench.ctx
    act = activation or ActivationDesc("relu")
    channels = input_shape[1]
    x_host = bench.random(input_shape)
    scale_host = bench.random((channels,), 0.5, 1.5)
    shift_host = bench.random((channels,))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, TensorDesc(input_shape))
    bn = plan.create_op_batchnorm_forward(fusion.BN_SPATIAL, running_mean_variance=False)
    act_op = plan.create_op_activation_forward(act.mode)
    plan.compile()
    x = Tensor.from_numpy(ctx, x_host)
    y = Tensor.empty(ctx, input_shape)
    p_shape = (1, channels, 1, 1)
    scale = Tensor.from_numpy(ctx, scale_host.reshape(p_shape))
    shift = Tensor.from_numpy(ctx, shift_host.reshape(p_shape))
    args = fusion.OperatorArgs()
    args.set_batchnorm_forward(bn, 1.0, 0.0, scale, shift, epsilon=BN_EPSILON)
    args.set_activation_forward(act_op, 1.0, 0.0, act.alpha, act.beta, act.gamma)

    def run():
        plan.execute(plan.input_desc, x, plan.output_desc, y, args)

    def chain(t, xt, s, b):
        out = t.nn.functional.batch_norm(xt, None, None, s, b, True, 0.1, BN_EPSILON)
        return activation_reference(t, act, out)

    def verify():
        y.fill_(np.nan)
        run()
        return error_metric(y.numpy(), bench.reference.compute(chain, x_host, scale_host,
                                                               shift_host))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        targs = [tb.tensor(h) for h in (x_host, scale_host, shift_host)]
        torch_run = lambda: chain(tb.torch, *targs)  # noqa: E731
    moved = 2.0 * 4 * x_host.size
    return Case(run, verify, moved, "GB/s", algorithm="bn train + act, 1 plan",
                torch_run=torch_run, params={"input": input_shape, "chain": plan.describe()})


def cases(bench):
    fusion_api()
    batch = bench.default_batch(gpu=32, quick=1, cpu=4)
    if bench.quick:
        layers = [ConvShape(batch, 64, 14, 14, 64, 3, 3, (1, 1)),
                  ConvShape(batch, 576, 14, 14, 96, 1, 1)]
        bn_shape = (batch, 64, 56, 56)
    else:
        layers = [ConvShape(batch, 64, 56, 56, 64, 3, 3, (1, 1)),
                  ConvShape(batch, 256, 56, 56, 64, 1, 1),
                  ConvShape(batch, 512, 7, 7, 512, 3, 3, (1, 1)),
                  ConvShape(batch, 576, 14, 14, 576, 3, 3, (1, 1), groups=576)]
        bn_shape = (batch, 256, 56, 56)
    specs = []
    for shape in layers:
        label = (f"{shape.c}->{shape.k} {shape.r}x{shape.s}"
                 f"{' g' + str(shape.groups) if shape.groups > 1 else ''} @{shape.h} n{shape.n}")
        for mode in ("cba", "cbna"):
            specs.append(CaseSpec("fusion", f"{mode} {label}",
                                  lambda s=shape, m=mode: plan_case(bench, s, m)))
        specs.append(CaseSpec("fusion", f"unfused cba {label}",
                              lambda s=shape: unfused_case(bench, s)))
    na = ConvShape(*bn_shape, bn_shape[1], 1, 1)
    specs.append(CaseSpec("fusion", "na " + "x".join(map(str, bn_shape)),
                          lambda: plan_case(bench, na, "na")))
    specs.append(CaseSpec("fusion", "bn train + relu " + "x".join(map(str, bn_shape)),
                          lambda: bn_train_case(bench, bn_shape)))
    specs.append(CaseSpec("fusion", "bn train + relu backward " + "x".join(map(str, bn_shape)),
                          lambda: bn_train_backward_case(bench, bn_shape)))
    return specs


def conv_bias_activation_case(bench, shape, activation=None, bias=True, residual=False,
                              algo=None):
    """``fusion.conv_bias_activation``: act(conv(x, w) + z + bias) in one kernel (MIOpen's
    miopenConvolutionBiasActivationForward; z is ResNet's residual). ``activation`` None means
    no activation."""
    fusion = fusion_api()
    from ..tensor import Tensor
    from ..ops.conv import ConvolutionDesc
    ctx = bench.ctx
    x_host = bench.random(shape.input_shape)
    fan_in = (shape.c // shape.groups) * shape.r * shape.s
    w_host = bench.random(shape.weight_shape, -1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in))
    bias_host = bench.random((shape.k,))
    z_host = bench.random(shape.output_shape)
    conv_desc = ConvolutionDesc(padding=shape.pad, stride=shape.stride, dilation=shape.dilation,
                                groups=shape.groups)
    x, w = Tensor.from_numpy(ctx, x_host), Tensor.from_numpy(ctx, w_host)
    b = Tensor.from_numpy(ctx, bias_host) if bias else None
    z = Tensor.from_numpy(ctx, z_host) if residual else None
    out = Tensor.empty(ctx, shape.output_shape)
    activation_name = activation if activation is not None else None

    def run():
        fusion.conv_bias_activation(x, w, b, z, 1.0, 1.0 if residual else 0.0, activation_name,
                                    conv_desc=conv_desc, out=out, algo=algo)

    def chain(t, xt, wt, bt, zt):
        y = t.nn.functional.conv2d(xt, wt, bt if bias else None, shape.stride, shape.pad,
                                   shape.dilation, shape.groups)
        if residual:
            y = y + zt
        return activation_reference(t, activation, y) if activation is not None else y

    hosts = (x_host, w_host, bias_host, z_host)

    def verify():
        out.fill_(np.nan)
        run()
        return error_metric(out.numpy(), bench.reference.compute(chain, *hosts))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        targs = [tb.tensor(h) for h in hosts]
        torch_run = lambda: chain(tb.torch, *targs)  # noqa: E731
    from ..ops.conv import choose
    conv = ctx.memo.get(("fusion.conv_bias_activation", x.shape, w.shape, conv_desc.padding,
                         conv_desc.stride, conv_desc.dilation, conv_desc.groups))
    params = dict(shape.describe(), bias=bias, residual=residual,
                  activation=activation.mode.name if activation is not None else None)
    case = Case(run, verify, shape.flops(), "GFLOP/s", algorithm=str(algo or ""),
                torch_run=torch_run, params=params)
    if not case.algorithm:
        run()  # builds the convolution the call memoizes, so its choice can be named
        conv = ctx.memo.get(("fusion.conv_bias_activation", x.shape, w.shape, conv_desc.padding,
                             conv_desc.stride, conv_desc.dilation, conv_desc.groups))
        if conv is not None:
            case.algorithm = choose(ctx, conv.problem, "forward")
    return case


def bn_train_backward_case(bench, input_shape, activation=None):
    """The backward of act(batch_norm(x)) in training mode as one plan (MIOpen's
    batchnorm_backward + activation_backward): dx, dscale and dbias, against torch's autograd
    backward of the same two operators."""
    fusion = fusion_api()
    from ..tensor import Tensor, TensorDesc
    ctx = bench.ctx
    act = activation or ActivationDesc("relu")
    channels = input_shape[1]
    x_host = bench.random(input_shape)
    dy_host = bench.random(input_shape)
    scale_host = bench.random((channels,), 0.5, 1.5)
    shift_host = bench.random((channels,))
    p_shape = (1, channels, 1, 1)
    x, dy = Tensor.from_numpy(ctx, x_host), Tensor.from_numpy(ctx, dy_host)
    scale = Tensor.from_numpy(ctx, scale_host.reshape(p_shape))
    shift = Tensor.from_numpy(ctx, shift_host.reshape(p_shape))
    saved_mean, saved_inv = Tensor.empty(ctx, p_shape), Tensor.empty(ctx, p_shape)
    y = Tensor.empty(ctx, input_shape)
    forward = fusion.FusionPlan(ctx, fusion.VERTICAL, TensorDesc(input_shape))
    bn = forward.create_op_batchnorm_forward(fusion.BN_SPATIAL, running_mean_variance=False)
    act_op = forward.create_op_activation_forward(act.mode)
    forward.compile()
    fargs = fusion.OperatorArgs()
    fargs.set_batchnorm_forward(bn, 1.0, 0.0, scale, shift, saved_mean, saved_inv,
                                epsilon=BN_EPSILON)
    fargs.set_activation_forward(act_op, 1.0, 0.0, act.alpha, act.beta, act.gamma)
    forward.execute(forward.input_desc, x, forward.output_desc, y, fargs)

    backward = fusion.FusionPlan(ctx, fusion.VERTICAL, TensorDesc(input_shape))
    bn_back = backward.create_op_batchnorm_backward(fusion.BN_SPATIAL)
    act_back = backward.create_op_activation_backward(act.mode)
    backward.compile()
    dx = Tensor.empty(ctx, input_shape)
    dscale, dshift = Tensor.empty(ctx, p_shape), Tensor.empty(ctx, p_shape)
    bargs = fusion.OperatorArgs()
    bargs.set_batchnorm_backward(bn_back, 1.0, 0.0, x, scale, shift, dscale, dshift, saved_mean,
                                 saved_inv)
    bargs.set_activation_backward(act_back, 1.0, 0.0, y, None, act.alpha, act.beta, act.gamma)

    def run():
        backward.execute(backward.input_desc, dy, backward.output_desc, dx, bargs)

    def chain(t, xt, s, b):
        out = t.nn.functional.batch_norm(xt, None, None, s, b, True, 0.1, BN_EPSILON)
        return activation_reference(t, act, out)

    def verify():
        for t in (dx, dscale, dshift):
            t.fill_(np.nan)
        run()
        refs = bench.reference.compute_with_grad(chain, [x_host, scale_host, shift_host, dy_host],
                                                 [0, 1, 2])
        outs = (dx.numpy(), dscale.numpy().reshape(-1), dshift.numpy().reshape(-1))
        return max(error_metric(o, r) for o, r in zip(outs, refs))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        torch = tb.torch
        tx, ts, tsh = (tb.tensor(h).requires_grad_(True) for h in (x_host, scale_host, shift_host))
        tdy = tb.tensor(dy_host)
        with torch.enable_grad():
            ty = chain(torch, tx, ts, tsh)
        torch_run = lambda: torch.autograd.grad(ty, (tx, ts, tsh), tdy,  # noqa: E731
                                                retain_graph=True)
    moved = 3.0 * 4 * x_host.size
    return Case(run, verify, moved, "GB/s", algorithm="bn + act backward, 1 plan",
                torch_run=torch_run, params={"input": input_shape, "chain": backward.describe()})
