"""DLPRIM_LOG_CMD: every logged line, read back by the driver's own parser, holds the call's
parameters (a convolution's bias as -b 1, its algorithm, the fused forms as CBAInfer) and -t 1;
what no flag expresses is named after a '#'. That the lines run and verify in the driver is
test_driver.py's round trip."""
import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import fusion
from dlprim_py.driver import parse_flags, split_logged
from dlprim_py.logcmd import command_line

from conftest import random

F = dp.functional


@pytest.fixture
def logged(monkeypatch, capsys):
    """``logged(call)``: the (command, flags, comment) of each line ``call()`` logs, the flags as
    the driver parses them."""
    monkeypatch.setenv("DLPRIM_LOG_CMD", "1")
    monkeypatch.setenv("DLPRIM_FIND_MODE", "immediate")
    dp.config.reload()

    def run(call):
        capsys.readouterr()
        call()
        lines = [line for line in capsys.readouterr().err.splitlines()
                 if line.startswith("DLPRIM_LOG_CMD: ")]
        found = []
        for line in lines:
            argv = split_logged(line)
            flags = parse_flags(argv[0], argv[1:])
            assert flags["time"] == 1 and argv[-2:] == ["-t", "1"], line
            comment = line.partition("#")[2].strip()
            found.append((argv[0], flags, comment))
        return found
    return run


def geometry(flags):
    return (flags["batchsize"], flags["in_channels"], flags["in_h"], flags["in_w"],
            flags["out_channels"], flags["fil_h"], flags["fil_w"], flags["pad_h"], flags["pad_w"],
            flags["conv_stride_h"], flags["conv_stride_w"], flags["dilation_h"],
            flags["dilation_w"], flags["group_count"])


def tensor(ctx, rng, shape, grad=False):
    return dp.Tensor.from_numpy(ctx, random(rng, shape), requires_grad=grad)


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_lines_carry_the_geometry_and_the_bias(ctx, rng, logged, with_bias):
    """conv2d forward and both gradients: -F 1 (with -b 1 exactly when the call has a bias),
    -F 2 and -F 4; the geometry of the call."""
    x = tensor(ctx, rng, (2, 4, 9, 8), grad=True)
    w = tensor(ctx, rng, (6, 2, 3, 2), grad=True)
    b = tensor(ctx, rng, (6,), grad=True) if with_bias else None
    y = None

    def call():
        nonlocal y
        y = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2)
        y.backward(tensor(ctx, rng, y.shape))

    lines = logged(call)
    assert [(c, f["forw"]) for c, f, _ in lines] == [("conv", 1), ("conv", 2), ("conv", 4)]
    for _, flags, comment in lines:
        assert geometry(flags) == (2, 4, 9, 8, 6, 3, 2, 1, 0, 2, 1, 1, 2, 2)
        assert flags["in_layout"] == "NCHW" and comment == ""
    assert [f["bias"] for _, f, _ in lines] == [int(with_bias), 0, 0]


def test_conv_operator_lines_carry_layout_algorithm_and_what_they_cannot(ctx, rng, logged):
    """The MIOpen-style operator: layout NHWC, a forced algorithm (-S), find mode (-s 1);
    alpha and beta are named as not carried."""
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 5, 5, 3)), dp.TensorDesc((4, 3, 3, 3)),
                          dp.ConvolutionDesc(padding=(1, 1)), layout="NHWC")
    algo = conv.algorithms("forward")[0]
    x, w, b = tensor(ctx, rng, (1, 5, 5, 3)), tensor(ctx, rng, (4, 3, 3, 3)), tensor(ctx, rng, (4,))
    y = dp.Tensor.empty(ctx, conv.output_desc.shape)
    ((command, flags, comment),) = logged(lambda: conv.forward(x, w, y, bias=b, algo=algo))
    assert command == "conv" and flags["in_layout"] == "NHWC" and flags["bias"] == 1
    assert geometry(flags) == (1, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    assert flags["solution"] == algo and flags["search"] == 0 and comment == ""
    ((_, flags, comment),) = logged(lambda: conv.forward(x, w, y, alpha=0.5, beta=1.0))
    assert flags["bias"] == 0 and comment == "not carried: alpha 0.5, beta 1"


def test_fused_forward_lines_are_cbainfer(ctx, rng, logged, monkeypatch):
    """A forward with an activation and a residual, and conv_bias_activation: one CBAInfer
    line each (the convolution inside logs none), with -b, -z and the activation."""
    conv = dp.Convolution(ctx, dp.TensorDesc((1, 3, 6, 6)), dp.TensorDesc((4, 3, 3, 3)),
                          dp.ConvolutionDesc(padding=(1, 1), stride=(2, 2)))
    x, w, b = tensor(ctx, rng, (1, 3, 6, 6)), tensor(ctx, rng, (4, 3, 3, 3)), tensor(ctx, rng, (4,))
    z = tensor(ctx, rng, conv.output_desc.shape)
    y = dp.Tensor.empty(ctx, conv.output_desc.shape)
    lines = logged(lambda: conv.forward(x, w, y, bias=b, residual=z, activation="relu"))
    ((command, flags, comment),) = lines
    assert command == "CBAInfer" and comment == ""
    assert geometry(flags) == (1, 3, 6, 6, 4, 3, 3, 1, 1, 2, 2, 1, 1, 1)
    assert (flags["bias"], flags["residual"], flags["activation"]) == (1, 1, "relu")
    monkeypatch.setenv("DLPRIM_FIND_MODE", "find")
    dp.config.reload()
    z = tensor(ctx, rng, (1, 4, 6, 6))
    leaky = dp.ActivationDesc("leakyrelu", alpha=0.2)
    lines = logged(lambda: fusion.conv_bias_activation(x, w, None, z, 1.0, 0.5, leaky,
                                                       padding=1))
    ((command, flags, comment),) = lines
    assert command == "CBAInfer" and flags["search"] == 1
    assert geometry(flags) == (1, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    assert (flags["bias"], flags["residual"], flags["activation"]) == (0, 1, "leakyrelu")
    assert flags["alpha"] == pytest.approx(0.2)
    assert comment == "not carried: alpha2 0.5"
    # The mode's own parameters need no flag.
    ((_, flags, _),) = logged(lambda: fusion.conv_bias_activation(x, w, b, activation="elu",
                                                                  padding=1))
    assert flags["activation"] == "elu" and flags["alpha"] is None


def test_other_families_lines_carry_their_call(ctx, rng, logged):
    x = tensor(ctx, rng, (2, 3, 9, 8), grad=True)
    ((command, flags, _),) = logged(lambda: F.avg_pool2d(x.detach(), (3, 2), stride=2,
                                                         padding=(1, 0)))
    assert command == "pool" and (flags["win_h"], flags["win_w"]) == (3, 2)
    assert (flags["pool_stride_h"], flags["pool_stride_w"], flags["pad_h"], flags["pad_w"]) == \
        (2, 2, 1, 0)
    assert (flags["mode"], flags["forw"]) == ("avg_in", 1)
    assert (flags["batchsize"], flags["in_channels"], flags["in_h"], flags["in_w"]) == (2, 3, 9, "8")

    mean, var = (dp.Tensor.from_numpy(ctx, v) for v in (np.zeros(3, np.float32),
                                                        np.ones(3, np.float32)))
    lines = logged(lambda: F.batch_norm(x, mean, var, training=True, eps=1e-3).backward(
        tensor(ctx, rng, x.shape)))
    assert [(c, f["forw"], f["back"]) for c, f, _ in lines] == [("bnorm", 1, 0), ("bnorm", 0, 1)]
    assert lines[0][1]["run"] == 1 and lines[0][1]["mode"] == 1
    assert lines[0][2] == "not carried: eps 0.001"

    lines = logged(lambda: F.leaky_relu(x, 0.2).backward(tensor(ctx, rng, x.shape)))
    assert [(c, f["forw"]) for c, f, _ in lines] == [("activ", 1), ("activ", 0)]
    assert lines[0][1]["mode"] == "8" and lines[0][1]["alpha"] == pytest.approx(0.2)

    lines = logged(lambda: F.log_softmax(x, dim=1).backward(tensor(ctx, rng, x.shape)))
    assert [(c, f["algorithm"], f["forw"]) for c, f, _ in lines] == [("softmax", 2, 1),
                                                                      ("softmax", 2, 0)]
    assert (lines[0][1]["batchsize"], lines[0][1]["in_channels"], lines[0][1]["in_h"]) == \
        (2, 3, 72)

    from dlprim_py.ops.gemm import gemm
    a, b = tensor(ctx, rng, (5, 7)), tensor(ctx, rng, (6, 7))
    bias = tensor(ctx, rng, (6,))
    ((command, flags, comment),) = logged(lambda: gemm(a, b, trans_b=True, bias=bias,
                                                       activation="gelu", alpha=0.5,
                                                       algorithm="small"))
    assert command == "gemm" and comment == ""
    assert (flags["a_h"], flags["b_w"], flags["a_w"], flags["transA"], flags["transB"]) == \
        (5, 6, 7, 0, 1)
    assert (flags["alpha"], flags["beta"], flags["batch_count"]) == (0.5, 0.0, 1)
    assert (flags["bias"], flags["activation"], flags["solution"]) == ("n", "gelu", "small")


def test_a_plan_line_names_its_plan(ctx, rng, logged):
    x = tensor(ctx, rng, (1, 4, 6, 6))
    w = tensor(ctx, rng, (8, 4, 3, 3))
    b = tensor(ctx, rng, (8,))
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, x.desc)
    conv_op = plan.create_op_conv_forward(dp.ConvolutionDesc(1, 1, 1, 1), w.desc)
    bias_op = plan.create_op_bias_forward(dp.TensorDesc((1, 8, 1, 1)))
    act_op = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    args = fusion.OperatorArgs()
    args.set_conv_forward(conv_op, 1, 0, w)
    args.set_bias_forward(bias_op, 1, 0, b.reshape(1, 8, 1, 1))
    args.set_activation_forward(act_op, 1, 0, 0, 0, 0)
    out = dp.Tensor.empty(ctx, (1, 8, 6, 6))
    ((command, flags, _),) = logged(lambda: plan.execute(plan.input_desc, x, plan.output_desc,
                                                         out, args))
    assert command == "CBAInfer" and flags["plan"] == plan.describe()
    assert (flags["batchsize"], flags["in_channels"], flags["in_h"], flags["in_w"]) == (1, 4, 6, 6)


def test_command_line_format():
    assert command_line("gemm", {"m": 2, "bias": "n"}) == "dlprim-driver gemm -m 2 --bias n -t 1"
    assert command_line("gemm", {"m": 2, "t": 0}) == "dlprim-driver gemm -m 2 -t 0"
    line = command_line("conv", {"n": 1}, ["alpha 0.5"])
    assert line == "dlprim-driver conv -n 1 -t 1  # not carried: alpha 0.5"
    assert split_logged("DLPRIM_LOG_CMD: " + line) == ["conv", "-n", "1", "-t", "1"]
