"""MIOpen's one-call fused forward, miopenConvolutionBiasActivationForward."""
from .. import autograd
from ..context import check_same_context
from ..errors import ShapeError
from .. import config
from ..logcmd import activation_flags, log_command, quiet
from ..tensor import Tensor
from .ops import check_tensor, param_view


def conv_bias_activation(x, w, bias=None, z=None, alpha1=1.0, alpha2=0.0, activation="relu", *,
                         stride=1, padding=0, dilation=1, groups=1, conv_desc=None, out=None,
                         algo=None):
    """``act(alpha1 * conv2d(x, w) + alpha2 * z + bias)`` in one kernel, like MIOpen's
    miopenConvolutionBiasActivationForward (the residual add of ResNet when z is given).

    x: (N, C, H, W); w: (K, C/groups, R, S); bias: (K,) or None; z: (N, K, Ho, Wo) or None;
    all float32 NCHW. ``activation``: None, a name (torch's or MIOpen's) or an ActivationDesc.
    ``conv_desc`` (a dp.ConvolutionDesc) replaces stride/padding/dilation/groups.
    Returns ``out`` (allocated when None), shape (N, K, Ho, Wo).
    """
    from ..activation import as_activation
    from ..ops.conv import Convolution
    from ..ops.conv.problem import ConvolutionDesc
    for name, t, optional in (("x", x, False), ("w", w, False), ("bias", bias, True),
                              ("z", z, True), ("out", out, True)):
        check_tensor(t, name, optional)
    ctx = check_same_context(x, w, bias, z, out)
    if conv_desc is None:
        conv_desc = ConvolutionDesc(padding=padding, stride=stride, dilation=dilation, groups=groups)
    act = as_activation(activation)
    memo_key = ("fusion.conv_bias_activation", x.shape, w.shape, conv_desc.padding,
                conv_desc.stride, conv_desc.dilation, conv_desc.groups)
    convolution = ctx.memo.get(memo_key)
    if convolution is None:
        # Its first call builds the kernel with the epilogue it asks for; none without.
        convolution = ctx.memo[memo_key] = Convolution(ctx, x.desc, w.desc, conv_desc,
                                                       prebuild=False)
    y_shape = tuple(convolution.output_desc.shape)
    k = y_shape[1]
    if bias is not None and bias.size != k:
        raise ShapeError(f"bias has shape {bias.shape}, expected ({k},) for {k} output channels")
    if z is not None and z.shape != y_shape:
        raise ShapeError(f"z has shape {z.shape}, expected the output shape {y_shape}")
    if out is None:
        out = Tensor.empty(ctx, y_shape)
    elif out.shape != y_shape:
        raise ShapeError(f"out has shape {out.shape}, expected {y_shape}")
    if config.log_cmd():
        _log_call(x, w, k, conv_desc, bias, z, alpha1, alpha2, act, algo)
    # The convolution inside logs nothing: the line above reproduces the whole call.
    with autograd.no_grad(), quiet():
        convolution.forward(x, w, out, alpha=float(alpha1), beta=0.0, activation=act, algo=algo,
                            shift=None if bias is None else param_view(bias, (k,)),
                            residual=z, residual_alpha=float(alpha2))
    return out


def _log_call(x, w, k, conv_desc, bias, z, alpha1, alpha2, act, algo):
    """The ``dlprim-driver CBAInfer`` command of a conv_bias_activation call (DLPRIM_LOG_CMD=1):
    the geometry, -b / -z for a bias / residual, --activation; -S names a forced algorithm and
    -s 1 find mode; alpha1 other than 1 and (with z) alpha2 other than 1 are not carried (the
    driver runs 1 and 1)."""
    missing = []
    flags = {"n": x.shape[0], "c": x.shape[1], "H": x.shape[2], "W": x.shape[3], "k": k,
             "y": w.shape[2], "x": w.shape[3], "p": conv_desc.padding[0],
             "q": conv_desc.padding[1], "u": conv_desc.stride[0], "v": conv_desc.stride[1],
             "l": conv_desc.dilation[0], "j": conv_desc.dilation[1], "g": conv_desc.groups,
             "b": int(bias is not None), "z": int(z is not None), **activation_flags(act)}
    if float(alpha1) != 1:
        missing.append(f"alpha1 {float(alpha1):g}")
    if z is not None and float(alpha2) != 1:
        missing.append(f"alpha2 {float(alpha2):g}")
    forced = algo or config.forced_algorithm("conv")
    if forced:
        flags["S"] = forced
    if config.find_mode() == "find":
        flags["s"] = 1
    log_command("CBAInfer", flags, missing)
