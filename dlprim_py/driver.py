"""``dlprim-driver``: one operator call from the command line, in MIOpenDriver's syntax.

Examples::

    dlprim-driver conv -n 64 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -u 1 -v 1 -l 1 -j 1 -g 1 -F 1 -t 1 -V 1
    dlprim-driver pool -n 32 -c 64 -H 112 -W 112 -y 3 -x 3 -p 1 -q 1 -u 2 -v 2 -m max -t 1
    dlprim-driver bnorm -n 32 -c 256 -H 56 -W 56 -m 1 -F 1 -b 1 -t 1
    dlprim-driver activ -n 32 -c 256 -H 56 -W 56 -m 3 -t 1
    dlprim-driver softmax -n 128 -c 1000 -H 1 -W 1 -a 1 -m 1 -t 1
    dlprim-driver gemm -m 1024 -n 1024 -k 1024 -u 0 -v 0 -t 1
    dlprim-driver CBAInfer -n 32 -c 64 -H 56 -W 56 -k 64 -y 3 -x 3 -p 1 -q 1 -F 4 -m 3 -t 1

Common flags: -F direction (conv: 1 forward, 2 backward-data, 4 backward-filter, sums of them,
0 all three), -t 1 time the call (OpenCL profiling events, median of exactly -i runs after
--warmup untimed ones; --max_time caps the timed runs, and the time line then says it did),
-V 1 verify it against a float64 reference (PyTorch), -S force an algorithm (a name, or an
index into the applicable ones), -s 1 find mode (benchmark the applicable algorithms once and
remember the winner), -i timed iterations, --device "P:D" or a piece of the device name.
It prints the algorithm, the time and the verification result; the exit status is 1 when a
verification fails. ``DLPRIM_LOG_CMD=1`` makes every operator call print the command that
reproduces it here, ``-t 1`` included (see ``dlprim_py.logcmd``).
"""
import math
import os
import re
import shlex
import sys

import numpy as np

from . import config
from .errors import DlprimError, UnsupportedError


class UsageError(DlprimError, ValueError):
    """A command line the driver cannot read: unknown command or flag, a missing value."""


class Flag:
    """One flag: short letter, long name, default (a string, as MIOpenDriver keeps them), type
    (int, float or str) and help. ``fixed``: only the default value is supported."""

    def __init__(self, short, name, default, kind, help, fixed=False):
        self.short = short
        self.name = name
        self.default = default
        self.kind = kind
        self.help = help
        self.fixed = fixed

    def convert(self, text):
        try:
            if self.kind is int:
                return int(float(text)) if re.fullmatch(r"-?\d+(\.0*)?", text) else int(text)
            if self.kind is float:
                return float(text)
            return text
        except ValueError:
            raise UsageError(f"flag -{self.short}/--{self.name} takes {self.kind.__name__}, "
                             f"got {text!r}") from None


COMMON = [
    Flag("i", "iter", "10", int, "timed iterations (after the warm-up), exactly this many unless "
                                 "--max_time cuts them short"),
    Flag(None, "warmup", "3", int, "untimed runs before the timed ones"),
    Flag(None, "max_time", "0", float, "seconds of timed iterations after which no more start "
                                       "(0: no cap); the time line then says so"),
    Flag("V", "verify", "1", int, "verify against a float64 reference (1) or not (0)"),
    Flag("t", "time", "0", int, "time the call with OpenCL profiling events (1)"),
    Flag("w", "wall", "0", int, "also report host wall-clock time per call (1)"),
    Flag(None, "device", "", str, 'OpenCL device: "P:D" or a piece of its name'),
]

_CONV_GEOMETRY = [
    Flag("n", "batchsize", "100", int, "batch size"),
    Flag("c", "in_channels", "3", int, "input channels"),
    Flag("H", "in_h", "32", int, "input height"),
    Flag("W", "in_w", "32", int, "input width"),
    Flag("k", "out_channels", "32", int, "output channels"),
    Flag("y", "fil_h", "3", int, "filter height"),
    Flag("x", "fil_w", "3", int, "filter width"),
    Flag("p", "pad_h", "0", int, "zero padding, height"),
    Flag("q", "pad_w", "0", int, "zero padding, width"),
    Flag("u", "conv_stride_h", "1", int, "stride, height"),
    Flag("v", "conv_stride_w", "1", int, "stride, width"),
    Flag("l", "dilation_h", "1", int, "dilation, height"),
    Flag("j", "dilation_w", "1", int, "dilation, width"),
    Flag("g", "group_count", "1", int, "groups (= channels for depthwise)"),
    Flag("r", "pad_val", "0", int, "padding value (only 0)", fixed=True),
    Flag("z", "pad_mode", "default", str, "padding mode: default (the -p/-q pads), same, valid"),
]

FLAGS = {
    "conv": _CONV_GEOMETRY + [
        Flag("F", "forw", "0", int, "1 forward, 2 backward-data, 4 backward-filter, sums; 0 all"),
        Flag("S", "solution", "-1", str, "force an algorithm: a name or an index (-1: choose)"),
        Flag("s", "search", "0", int, "find mode: benchmark the applicable algorithms (1)"),
        Flag("b", "bias", "0", int, "add a per-channel bias in the forward pass (1)"),
        Flag("I", "in_layout", "NCHW", str, "layout of all tensors: NCHW or NHWC"),
        Flag("O", "out_layout", "", str, "output layout (must equal -I when given)"),
        Flag("f", "fil_layout", "", str, "filter layout (must equal -I when given)"),
        Flag("m", "mode", "conv", str, "conv (transposed convolution: run -F 2)", fixed=True),
        Flag("_", "spatial_dim", "2", int, "spatial dimensions (only 2)", fixed=True),
        Flag("P", "printconv", "1", int, "print the convolution dimensions (1)"),
    ],
    "pool": [
        Flag("n", "batchsize", "100", int, "batch size"),
        Flag("c", "in_channels", "3", int, "channels"),
        Flag("H", "in_h", "32", int, "input height"),
        Flag("W", "in_w", "32", str, "input width (or a tensor NxCxHxW[,NCHW], as newer "
                                     "MIOpenDriver pool takes it)"),
        Flag(None, "input", "", str, "input tensor NxCxHxW[,NCHW] (overrides -n -c -H -W)"),
        Flag("y", "win_h", "3", int, "window height"),
        Flag("x", "win_w", "3", int, "window width"),
        Flag("u", "pool_stride_h", "1", int, "stride, height"),
        Flag("v", "pool_stride_w", "1", int, "stride, width"),
        Flag("p", "pad_h", "0", int, "zero padding, height"),
        Flag("q", "pad_w", "0", int, "zero padding, width"),
        Flag("m", "mode", "max", str, "max, avg (padding not counted) or avg_in (counted)"),
        Flag("F", "forw", "0", int, "1 forward only; 0 forward and backward"),
        Flag(None, "dilation_h", "1", int, "window dilation, height (max only)"),
        Flag(None, "dilation_w", "1", int, "window dilation, width (max only)"),
        Flag(None, "ceil_mode", "0", int, "round the output size up (1)"),
        Flag(None, "divisor", "0", int, "avg: divide by this instead of the window size (0: off)"),
        Flag(None, "adaptive", "", str, "adaptive pooling to an output of OHxOW (no window flags)"),
        Flag("M", "index_position", "0", int, "index kind of MIOpen's mask (no effect here)"),
        Flag("I", "index_type", "miopenIndexUint8", str, "MIOpen's mask type (no effect here)"),
        Flag("P", "print", "1", int, "print the pooling dimensions (1)"),
    ],
    "bnorm": [
        Flag("n", "batchsize", "32", int, "batch size"),
        Flag("c", "in_channels", "3", int, "channels"),
        Flag("H", "in_h", "32", int, "input height"),
        Flag("W", "in_w", "32", int, "input width"),
        Flag("m", "mode", "0", int, "0 per-activation, 1 spatial"),
        Flag("F", "forw", "0", int, "1 forward training, 2 forward inference"),
        Flag("b", "back", "0", int, "backward (1)"),
        Flag("s", "save", "0", int, "save the batch mean and inverse std (1)"),
        Flag("r", "run", "0", int, "keep running mean and variance (1)"),
        Flag("A", "alpha", "1.0", float, "alpha (only 1)", fixed=True),
        Flag("B", "beta", "0.", float, "beta (only 0)", fixed=True),
        Flag("L", "layout", "NCHW", str, "layout (only NCHW)", fixed=True),
        Flag("P", "printconv", "1", int, "print the dimensions (1)"),
        Flag(None, "activation", "", str, "forward: apply an activation after the batch norm"),
    ],
    "activ": [
        Flag("n", "batchsize", "100", int, "batch size"),
        Flag("c", "in_channels", "3", int, "channels"),
        Flag("H", "in_h", "32", int, "input height"),
        Flag("W", "in_w", "32", int, "input width"),
        Flag("m", "mode", "3", str, "MIOpen's mode number (3 relu, ...) or a name (gelu, silu)"),
        Flag("A", "alpha", "", float, "activation alpha (default: the mode's)"),
        Flag("B", "beta", "", float, "activation beta (default: the mode's)"),
        Flag("G", "gamma", "", float, "activation gamma (default: the mode's)"),
        Flag("F", "forw", "0", int, "1 forward only; 0 forward and backward"),
    ],
    "softmax": [
        Flag("n", "batchsize", "100", int, "batch size"),
        Flag("c", "in_channels", "3", int, "channels"),
        Flag("H", "in_h", "32", int, "input height"),
        Flag("W", "in_w", "32", int, "input width"),
        Flag("a", "algorithm", "1", int, "0 fast, 1 accurate (both max-subtracted), 2 log-softmax"),
        Flag("m", "mode", "1", int, "0 instance (over C*H*W), 1 channel (over C)"),
        Flag("A", "alpha", "1.0", float, "alpha (only 1)", fixed=True),
        Flag("B", "beta", "0.0", float, "beta (only 0)", fixed=True),
        Flag("F", "forw", "0", int, "1 forward only; 0 forward and backward"),
    ],
    "gemm": [
        Flag("m", "a_h", "256", int, "M: rows of op(A) and C"),
        Flag("n", "b_w", "256", int, "N: columns of op(B) and C"),
        Flag("k", "a_w", "256", int, "K: the inner dimension"),
        Flag("u", "transA", "0", int, "A is stored transposed (1)"),
        Flag("v", "transB", "0", int, "B is stored transposed (1)"),
        Flag("A", "alpha", "1.0", float, "alpha"),
        Flag("B", "beta", "0.0", float, "beta"),
        Flag("b", "batch_count", "1", int, "strided batch of products"),
        Flag("C", "isColMajor", "0", int, "matrices are column-major (1)"),
        Flag("F", "forw", "1", int, "forward (the only direction)"),
        Flag("S", "solution", "-1", str, "force a kernel: tiled, splitk or small (-1: choose)"),
        Flag(None, "bias", "", str, "add a bias: n (bias[N] to every row) or m (bias[M] to "
                                    "every column)"),
        Flag(None, "activation", "", str, "apply an activation last (a name, e.g. relu)"),
    ],
    "CBAInfer": _CONV_GEOMETRY + [
        Flag("F", "fusion_mode", "0", int, "0 cbna, 1 cna, 2 na, 3 cn, 4 cba, 5 ca, 6 cb"),
        Flag("m", "activMode", "3", str, "activation: MIOpen's mode number or a name"),
        Flag("M", "bnMode", "1", int, "batch-norm mode: 1 spatial (0 per-activation)"),
        Flag("A", "alpha", "", float, "activation alpha (default: the mode's)"),
        Flag("B", "beta", "", float, "activation beta (default: the mode's)"),
        Flag("G", "gamma", "", float, "activation gamma (default: the mode's)"),
        Flag("S", "solution", "-1", str, "force the convolution algorithm (-1: choose)"),
        Flag("s", "search", "0", int, "find mode (1)"),
        Flag("b", "bias", "", int, "conv_bias_activation: with a bias (1)"),
        Flag("z", "residual", "", int, "conv_bias_activation: with a residual input z (1)"),
        Flag(None, "activation", "", str, "conv_bias_activation: the activation name or none"),
        Flag(None, "plan", "", str, "a fusion plan as its description (as DLPRIM_LOG_CMD logs it)"),
        Flag("P", "printconv", "1", int, "print the dimensions (1)"),
    ],
}
# CBAInfer's -z is the residual flag (the padding mode flag of conv does not apply there).
FLAGS["CBAInfer"] = [f for f in FLAGS["CBAInfer"] if f.name != "pad_mode"]
COMMANDS = {name.lower(): name for name in FLAGS}


def _table(command):
    flags = FLAGS[command] + COMMON
    by_short = {f.short: f for f in flags if f.short}
    by_long = {f.name: f for f in flags}
    return flags, by_short, by_long


def parse_flags(command, argv):
    """The flags of ``command`` from ``argv`` (``-x value`` or ``--name value`` or
    ``--name=value``) as {long name: value}; ``"_given"`` lists the names given explicitly."""
    flags, by_short, by_long = _table(command)
    values = {}
    given = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        inline = None
        if token.startswith("--"):
            name, _, inline = token[2:].partition("=")
            flag = by_long.get(name)
            if inline == "" and "=" not in token[2:]:
                inline = None
        elif token.startswith("-") and len(token) == 2:
            flag = by_short.get(token[1])
        else:
            raise UsageError(f"{command}: expected a flag, got {token!r}")
        if flag is None:
            known = " ".join(f"-{f.short}" if f.short else f"--{f.name}" for f in flags)
            raise UsageError(f"{command}: unknown flag {token!r}; known: {known}")
        if inline is None:
            if i + 1 >= len(tokens):
                raise UsageError(f"{command}: flag {token} needs a value")
            inline = tokens[i + 1]
            i += 1
        values[flag.name] = flag.convert(inline)
        given.append(flag.name)
        i += 1
    for flag in flags:
        if flag.name not in values:
            values[flag.name] = flag.convert(flag.default) if flag.default != "" else None
        elif flag.fixed and values[flag.name] != flag.convert(flag.default):
            raise UnsupportedError(f"{command}: -{flag.short}/--{flag.name} {values[flag.name]} is "
                                   f"not supported (only {flag.default})")
    values["_given"] = given
    return values


def usage(command=None):
    if command is None:
        lines = ["usage: dlprim-driver COMMAND [flags]   (MIOpenDriver's syntax)",
                 f"commands: {', '.join(FLAGS)}", "dlprim-driver COMMAND -h lists its flags"]
        return "\n".join(lines)
    flags, _, _ = _table(command)
    lines = [f"dlprim-driver {command} flags:"]
    for f in flags:
        name = f"-{f.short}, --{f.name}" if f.short else f"    --{f.name}"
        default = f" (default {f.default})" if f.default != "" else ""
        lines.append(f"  {name:28s} {f.help}{default}")
    return "\n".join(lines)


# ---- problems ------------------------------------------------------------------------------

def _conv_shape(flags):
    from .bench.conv import ConvShape
    pads = (flags["pad_h"], flags["pad_w"])
    mode = flags.get("pad_mode") or "default"
    if mode == "valid":
        pads = (0, 0)
    elif mode == "same":
        dil = (flags["dilation_h"], flags["dilation_w"])
        if (flags["conv_stride_h"], flags["conv_stride_w"]) != (1, 1):
            raise UnsupportedError("pad_mode same needs stride 1")
        total = (dil[0] * (flags["fil_h"] - 1), dil[1] * (flags["fil_w"] - 1))
        if total[0] % 2 or total[1] % 2:
            raise UnsupportedError("pad_mode same with an even filter needs asymmetric padding")
        pads = (total[0] // 2, total[1] // 2)
    elif mode != "default":
        raise UnsupportedError(f"pad_mode must be default, same or valid, got {mode!r}")
    return ConvShape(flags["batchsize"], flags["in_channels"], flags["in_h"], flags["in_w"],
                     flags["out_channels"], flags["fil_h"], flags["fil_w"], pads,
                     (flags["conv_stride_h"], flags["conv_stride_w"]),
                     (flags["dilation_h"], flags["dilation_w"]), flags["group_count"])


def _solution(flags):
    value = flags.get("solution")
    if value is None or str(value).strip() in ("", "-1"):
        return None
    return value


CONV_DIRECTIONS = (("fwd", 1, "Forward Conv"), ("bwd-data", 2, "Backward Data Conv"),
                   ("bwd-filter", 4, "Backward Weights Conv"))


def conv_jobs(bench, flags):
    from .bench.conv import conv_case
    shape = _conv_shape(flags)
    layout = (flags["in_layout"] or "NCHW").upper()
    for other in ("out_layout", "fil_layout"):
        if flags[other] and flags[other].upper() != layout:
            raise UnsupportedError(f"--{other} {flags[other]} differs from --in_layout {layout}: "
                                   f"one layout for every tensor")
    if layout not in ("NCHW", "NHWC"):
        raise UnsupportedError(f"layout must be NCHW or NHWC, got {layout}")
    forw = flags["forw"]
    if forw < 0 or forw > 7:
        raise UsageError(f"conv -F must be 0..7 (1 forward, 2 backward-data, 4 backward-filter), "
                         f"got {forw}")
    bits = forw or 7
    algo = _solution(flags)
    jobs = []
    for direction, bit, label in CONV_DIRECTIONS:
        if bits & bit:
            jobs.append((label, lambda d=direction: conv_case(
                bench, shape, d, algo=algo, bias=bool(flags["bias"]) and d == "fwd",
                layout=layout)))
    return jobs, shape.describe()


def _input_shape(flags):
    text = flags.get("input")
    if text:
        dims = text.split(",")[0]
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise UsageError(f"--input must look like NxCxHxW, got {text!r}") from None
        if len(shape) != 4:
            raise UnsupportedError(f"--input must be 4-d NxCxHxW, got {text!r}")
        return shape
    width = flags["in_w"]
    if isinstance(width, str):
        if "x" in width.lower():
            return _input_shape({"input": width})
        try:
            width = int(width)
        except ValueError:
            raise UsageError(f"-W takes a width or NxCxHxW, got {width!r}") from None
    return (flags["batchsize"], flags["in_channels"], flags["in_h"], width)


def pool_jobs(bench, flags):
    from .bench.harness import Case, error_metric
    from .ops.pool import Pool2d
    from .tensor import Tensor
    from .dtypes import int64
    ctx = bench.ctx
    shape = _input_shape(flags)
    mode = flags["mode"]
    if mode not in ("max", "avg", "avg_in"):
        raise UnsupportedError(f"pool -m must be max, avg or avg_in, got {mode!r}")
    method = "max" if mode == "max" else "avg"
    kernel = (flags["win_h"], flags["win_w"])
    stride = (flags["pool_stride_h"], flags["pool_stride_w"])
    pad = (flags["pad_h"], flags["pad_w"])
    dilation = (flags["dilation_h"], flags["dilation_w"])
    ceil_mode = bool(flags["ceil_mode"])
    include_pad = mode == "avg_in"
    divisor = flags["divisor"] or None
    adaptive = None
    if flags.get("adaptive"):
        try:
            adaptive = tuple(int(v) for v in flags["adaptive"].lower().split("x"))
        except ValueError:
            raise UsageError(f"--adaptive must look like OHxOW, got {flags['adaptive']!r}") from None
        if len(adaptive) != 2:
            raise UsageError(f"--adaptive must look like OHxOW, got {flags['adaptive']!r}")
        op = Pool2d(ctx, method, output_size=adaptive)
    elif method == "max":
        op = Pool2d(ctx, method, kernel_size=kernel, stride=stride, padding=pad,
                    dilation=dilation, ceil_mode=ceil_mode)
    else:
        if dilation != (1, 1):
            raise UnsupportedError("average pooling has no dilation")
        op = Pool2d(ctx, method, kernel_size=kernel, stride=stride, padding=pad,
                    ceil_mode=ceil_mode, count_include_pad=include_pad, divisor_override=divisor)
    out_shape = op.output_shape(shape)
    x_host = bench.random(shape)
    dy_host = bench.random(out_shape)
    x = Tensor.from_numpy(ctx, x_host)
    y = Tensor.empty(ctx, out_shape)
    indices = Tensor.empty(ctx, out_shape, int64) if method == "max" else None
    moved = 4.0 * (x_host.size + 2 * np.prod(out_shape))

    def torch_pool(t, a):
        F = t.nn.functional
        if adaptive is not None:
            pool = F.adaptive_max_pool2d if method == "max" else F.adaptive_avg_pool2d
            return pool(a, adaptive)
        if method == "max":
            return F.max_pool2d(a, kernel, stride, pad, dilation, ceil_mode)
        return F.avg_pool2d(a, kernel, stride, pad, ceil_mode, include_pad, divisor)

    def forward_case():
        def run():
            op.forward(x, y, indices)

        def verify():
            y.fill_(np.nan)
            run()
            return error_metric(y.numpy(), bench.reference.compute(torch_pool, x_host))
        return Case(run, verify, moved, "GB/s", algorithm=f"{method} pool{' + indices' if indices is not None else ''}")

    def backward_case():
        dy = Tensor.from_numpy(ctx, dy_host)
        dx = Tensor.empty(ctx, shape)
        op.forward(x, y, indices)

        def run():
            op.backward(dy, dx, indices)

        def verify():
            dx.fill_(np.nan)
            run()
            (ref,) = bench.reference.compute_with_grad(torch_pool, [x_host, dy_host], [0])
            return error_metric(dx.numpy(), ref)
        return Case(run, verify, 4.0 * (2 * x_host.size + dy_host.size), "GB/s",
                    algorithm=f"{method} pool backward")

    jobs = [("Forward Pooling", forward_case)]
    if flags["forw"] == 0:
        jobs.append(("Backward Pooling", backward_case))
    problem = ({"input": shape, "adaptive output": adaptive, "mode": mode} if adaptive else
               {"input": shape, "window": kernel, "stride": stride, "pad": pad, "mode": mode})
    return jobs, problem


def bnorm_jobs(bench, flags):
    from .bench.harness import Case, error_metric
    from .bench.torch_baseline import activation_reference
    from .ops import norm
    from .tensor import Tensor
    ctx = bench.ctx
    shape = _input_shape(flags)
    if flags["mode"] not in (0, 1):
        raise UsageError(f"bnorm -m must be 0 (per-activation) or 1 (spatial), got {flags['mode']}")
    mode = "spatial" if flags["mode"] == 1 else "per_activation"
    c = shape[1]
    param_shape = (c,) if mode == "spatial" else (int(np.prod(shape[1:])),)
    eps, momentum = 1e-5, 0.1
    x_host = bench.random(shape)
    w_host = bench.random(param_shape, 0.5, 1.5)
    b_host = bench.random(param_shape)
    mean_host = bench.random(param_shape, -0.2, 0.2)
    var_host = bench.random(param_shape, 0.5, 1.5)
    dy_host = bench.random(shape)
    activation = None
    if flags.get("activation"):
        activation = activation_from_flags({"mode": flags["activation"]}, "mode")
    x, w, b = (Tensor.from_numpy(ctx, h) for h in (x_host, w_host, b_host))
    y = Tensor.empty(ctx, shape)
    moved = 4.0 * 2 * x_host.size

    def flat(t, a):
        """The torch view in which batch_norm's channels are bnorm's statistics groups."""
        return a if mode == "spatial" else a.reshape(a.shape[0], -1)

    def activate(t, y):
        return activation_reference(t, activation, y) if activation is not None else y

    def reference_train(t, a, ww, bb):
        return activate(t, t.nn.functional.batch_norm(flat(t, a), None, None, ww, bb, True,
                                                      momentum, eps).reshape(a.shape))

    def reference_grad(t, a, ww, bb):
        return t.nn.functional.batch_norm(flat(t, a), None, None, ww, bb, True, momentum,
                                          eps).reshape(a.shape)

    def reference_infer(t, a, ww, bb, mm, vv):
        return activate(t, t.nn.functional.batch_norm(flat(t, a), mm, vv, ww, bb, False, 0.0,
                                                      eps).reshape(a.shape))

    def train_case():
        save = bool(flags["save"])
        keep_running = bool(flags["run"])
        saved = [Tensor.empty(ctx, param_shape) for _ in range(2)] if save else [None, None]
        running = ([Tensor.from_numpy(ctx, mean_host), Tensor.from_numpy(ctx, var_host)]
                   if keep_running else [None, None])

        def run():
            norm.batch_norm_forward_training(x, y, w, b, running[0], running[1], saved[0],
                                             saved[1], momentum, eps, mode=mode,
                                             activation=activation)

        def verify():
            y.fill_(np.nan)
            run()
            ref = bench.reference.compute(reference_train, x_host, w_host, b_host)
            return error_metric(y.numpy(), ref)
        return Case(run, verify, moved, "GB/s", algorithm=f"{mode} training")

    def infer_case():
        mean, var = Tensor.from_numpy(ctx, mean_host), Tensor.from_numpy(ctx, var_host)

        def run():
            norm.batch_norm_forward_inference(x, y, w, b, mean, var, eps, mode=mode,
                                              activation=activation)

        def verify():
            y.fill_(np.nan)
            run()
            ref = bench.reference.compute(reference_infer, x_host, w_host, b_host, mean_host,
                                          var_host)
            return error_metric(y.numpy(), ref)
        return Case(run, verify, moved, "GB/s", algorithm=f"{mode} inference")

    def backward_case():
        mean, invstd = Tensor.empty(ctx, param_shape), Tensor.empty(ctx, param_shape)
        norm.batch_norm_forward_training(x, y, w, b, None, None, mean, invstd, momentum, eps,
                                         mode=mode)
        dy = Tensor.from_numpy(ctx, dy_host)
        dx = Tensor.empty(ctx, shape)
        dw, db = Tensor.empty(ctx, param_shape), Tensor.empty(ctx, param_shape)

        def run():
            norm.batch_norm_backward(x, dy, dx, w, mean, invstd, dw, db, mode=mode, training=True)

        def verify():
            for t in (dx, dw, db):
                t.fill_(np.nan)
            run()
            refs = bench.reference.compute_with_grad(reference_grad,
                                                     [x_host, w_host, b_host, dy_host], [0, 1, 2])
            return max(error_metric(o.numpy(), r) for o, r in zip((dx, dw, db), refs))
        return Case(run, verify, 4.0 * 3 * x_host.size, "GB/s", algorithm=f"{mode} backward")

    jobs = []
    forw = flags["forw"]
    if forw not in (0, 1, 2):
        raise UsageError(f"bnorm -F must be 0, 1 (training) or 2 (inference), got {forw}")
    if forw == 1 or (forw == 0 and not flags["back"]):
        jobs.append(("Forward Train Batch Norm", train_case))
    if forw == 2:
        jobs.append(("Forward Inference Batch Norm", infer_case))
    if flags["back"]:
        jobs.append(("Backward Batch Norm", backward_case))
    return jobs, {"input": shape, "mode": mode, "activation": activation}


# MIOpen's miopenActivationMode_t numbers.
ACTIVATION_NUMBERS = ("passthru", "logistic", "tanh", "relu", "softrelu", "abs", "power",
                      "clippedrelu", "leakyrelu", "elu")


def activation_from_flags(flags, mode_key):
    from .activation import ActivationDesc, from_torch_name
    mode = str(flags[mode_key]).strip()
    params = {k: flags[k] for k in ("alpha", "beta", "gamma") if flags.get(k) is not None}
    if mode.lstrip("-").isdigit():
        number = int(mode)
        if not 0 <= number < len(ACTIVATION_NUMBERS):
            raise UsageError(f"activation mode number must be 0..{len(ACTIVATION_NUMBERS) - 1}, "
                             f"got {number}")
        return ActivationDesc(ACTIVATION_NUMBERS[number], **params)
    if params:
        return ActivationDesc(mode, **params)
    try:
        return ActivationDesc(mode)
    except DlprimError:
        return from_torch_name(mode.lower())


def activ_jobs(bench, flags):
    from .bench.harness import Case, error_metric
    from .bench.torch_baseline import activation_reference
    from .ops.activation_ops import activation_backward, activation_forward
    from .tensor import Tensor
    ctx = bench.ctx
    shape = _input_shape(flags)
    desc = activation_from_flags(flags, "mode")
    x_host = bench.random(shape)
    dy_host = bench.random(shape)
    x = Tensor.from_numpy(ctx, x_host)
    y = Tensor.empty(ctx, shape)

    def forward_case():
        def run():
            activation_forward(desc, x, y)

        def verify():
            y.fill_(np.nan)
            run()
            ref = bench.reference.compute(lambda t, a: activation_reference(t, desc, a), x_host)
            return error_metric(y.numpy(), ref)
        return Case(run, verify, 8.0 * x_host.size, "GB/s", algorithm=desc.mode.value)

    def backward_case():
        activation_forward(desc, x, y)
        dy = Tensor.from_numpy(ctx, dy_host)
        dx = Tensor.empty(ctx, shape)

        def run():
            activation_backward(desc, y, dy, x, dx)

        def verify():
            dx.fill_(np.nan)
            run()
            (ref,) = bench.reference.compute_with_grad(
                lambda t, a: activation_reference(t, desc, a), [x_host, dy_host], [0])
            return error_metric(dx.numpy(), ref)
        return Case(run, verify, 16.0 * x_host.size, "GB/s", algorithm=desc.mode.value)

    jobs = [("Forward Activation", forward_case)]
    if flags["forw"] == 0:
        jobs.append(("Backward Activation", backward_case))
    return jobs, {"input": shape, "activation": repr(desc)}


def softmax_jobs(bench, flags):
    from .bench.harness import Case, error_metric
    from .ops import softmax as softmax_ops
    from .tensor import Tensor
    ctx = bench.ctx
    shape = _input_shape(flags)
    algorithm = flags["algorithm"]
    if algorithm not in (0, 1, 2):
        raise UsageError(f"softmax -a must be 0 (fast), 1 (accurate) or 2 (log), got {algorithm}")
    if flags["mode"] not in (0, 1):
        raise UsageError(f"softmax -m must be 0 (instance) or 1 (channel), got {flags['mode']}")
    log = algorithm == 2
    # instance mode: one softmax over C*H*W per image; channel mode: over C per pixel.
    view = shape if flags["mode"] == 1 else (shape[0], int(np.prod(shape[1:])))
    x_host = bench.random(view, -4.0, 4.0)
    dy_host = bench.random(view)
    x = Tensor.from_numpy(ctx, x_host)
    fn = softmax_ops.log_softmax if log else softmax_ops.softmax
    name = "log_softmax" if log else "softmax"

    def reference(t, a):
        return getattr(t.nn.functional, name)(a, dim=1)

    def forward_case():
        def run():
            fn(x, 1)

        def verify():
            from .bench.ops import poison_pool
            poison_pool(ctx, x_host.nbytes)  # the output comes from the pool: start it as NaN
            return error_metric(fn(x, 1).numpy(), bench.reference.compute(reference, x_host))
        return Case(run, verify, 8.0 * x_host.size, "GB/s", algorithm=name)

    def backward_case():
        y = fn(x, 1)
        dy = Tensor.from_numpy(ctx, dy_host)
        dx = Tensor.empty(ctx, view)

        def run():
            softmax_ops.softmax_backward(y, dy, 1, log=log, dx=dx)

        def verify():
            dx.fill_(np.nan)
            run()
            (ref,) = bench.reference.compute_with_grad(reference, [x_host, dy_host], [0])
            return error_metric(dx.numpy(), ref)
        return Case(run, verify, 12.0 * x_host.size, "GB/s", algorithm=f"{name} backward")

    jobs = [("Forward Softmax", forward_case)]
    if flags["forw"] == 0:
        jobs.append(("Backward Softmax", backward_case))
    return jobs, {"input": shape, "softmax over": view, "log": log}


def gemm_jobs(bench, flags):
    from .bench.gemm import GemmShape, gemm_case
    m, n, k = flags["a_h"], flags["b_w"], flags["a_w"]
    ta, tb = bool(flags["transA"]), bool(flags["transB"])
    if flags["isColMajor"]:
        # Column-major C = op(A) op(B) is row-major C^T = op(B)^T op(A)^T: swap the operands.
        m, n, ta, tb = n, m, tb, ta
    bias = flags.get("bias") or None
    if bias not in (None, "n", "m"):
        raise UsageError(f"gemm --bias must be n or m, got {bias!r}")
    if flags["isColMajor"] and bias:
        bias = {"n": "m", "m": "n"}[bias]
    activation = None
    if flags.get("activation"):
        activation = activation_from_flags({"mode": flags["activation"]}, "mode")
    shape = GemmShape(m, n, k, trans_a=ta, trans_b=tb, batch=flags["batch_count"],
                      alpha=flags["alpha"], beta=flags["beta"], bias=bias, activation=activation)
    algo = _solution(flags)
    return [("Gemm", lambda: gemm_case(bench, shape, algorithm=algo))], shape.describe()


_PLAN_OP = re.compile(r"(\w+)\((.*)\)$")


def parse_plan(description):
    """The ops of a fusion plan description (``FusionPlan.describe()``, which DLPRIM_LOG_CMD
    logs) as a list of (name, argument text)."""
    ops = []
    for part in description.split(" -> "):
        match = _PLAN_OP.match(part.strip())
        if not match:
            raise UsageError(f"--plan: cannot read {part!r} (expected op(arguments))")
        ops.append((match.group(1), match.group(2)))
    return ops


def _plan_jobs(bench, flags, description):
    from .activation import ActivationDesc
    from .bench.conv import ConvShape
    from .bench.fusion import bn_train_backward_case, bn_train_case, plan_case
    ops = parse_plan(description)
    names = [name for name, _ in ops]
    shape_in = _input_shape(flags)
    activation = None
    for name, text in ops:
        if name in ("activation", "activation_backward"):
            activation = ActivationDesc(text.strip())
    if names[:1] == ["batchnorm_forward"] and set(names[1:]) <= {"activation"}:
        return [("Fused BN training forward",
                 lambda: bn_train_case(bench, shape_in, activation))], {"plan": description}
    if sorted(names) == ["activation_backward", "batchnorm_backward"]:
        return [("Fused BN training backward",
                 lambda: bn_train_backward_case(bench, shape_in, activation))], {"plan": description}
    letters = {"conv": "c", "bias": "b", "batchnorm_inference": "n", "activation": "a"}
    if any(n not in letters for n in names):
        raise UnsupportedError(f"--plan: the driver runs forward inference plans (conv, bias, "
                               f"batchnorm_inference, activation), batchnorm_forward + "
                               f"activation and batchnorm_backward + activation_backward; got "
                               f"{' -> '.join(names)}")
    for name, text in ops:
        if name == "batchnorm_inference" and "per_activation" in text:
            raise UnsupportedError("--plan: the driver runs spatial batch norm only")
    mode = "".join(dict.fromkeys(letters[n] for n in names))
    shape = ConvShape(*shape_in, shape_in[1], 1, 1)
    if names[0] == "conv":
        nums = [int(v) for v in re.findall(r"-?\d+", ops[0][1])]
        if len(nums) != 11:
            raise UsageError(f"--plan: cannot read the convolution {ops[0][1]!r}")
        k, _, r, s, ph, pw, uh, uw, dh, dw, g = nums
        shape = ConvShape(*shape_in, k, r, s, (ph, pw), (uh, uw), (dh, dw), g)
    from .bench.fusion import FUSION_MODES
    if mode not in FUSION_MODES:
        raise UnsupportedError(f"--plan: chain {' -> '.join(names)} is not one the driver runs "
                               f"({', '.join(FUSION_MODES)})")
    return [(f"Fused {mode}", lambda: plan_case(bench, shape, mode, activation,
                                                 algo=_solution(flags)))], {"plan": description}


def cbainfer_jobs(bench, flags):
    from .bench.fusion import FUSION_MODES, conv_bias_activation_case, plan_case
    if flags.get("plan"):
        return _plan_jobs(bench, flags, flags["plan"])
    shape = _conv_shape(flags)
    given = flags["_given"]
    if any(name in given for name in ("activation", "bias", "residual")):
        activation = None
        text = (flags.get("activation") or "relu").strip()
        if text.lower() != "none":
            flags = dict(flags, activMode=text)
            activation = activation_from_flags(flags, "activMode")
        return [("ConvBiasActivation", lambda: conv_bias_activation_case(
            bench, shape, activation, bias=bool(flags.get("bias")),
            residual=bool(flags.get("residual")), algo=_solution(flags)))], shape.describe()
    mode_index = flags["fusion_mode"]
    if not 0 <= mode_index < len(FUSION_MODES):
        raise UsageError(f"CBAInfer -F must be 0..{len(FUSION_MODES) - 1} "
                         f"({', '.join(FUSION_MODES)}), got {mode_index}")
    if flags["bnMode"] != 1 and "n" in FUSION_MODES[mode_index]:
        raise UnsupportedError("CBAInfer: batch norm after a convolution fuses in spatial mode "
                               "only (-M 1)")
    mode = FUSION_MODES[mode_index]
    activation = activation_from_flags(flags, "activMode")
    return [(f"Fused {mode}", lambda: plan_case(bench, shape, mode, activation,
                                                 algo=_solution(flags)))], shape.describe()


BUILDERS = {"conv": conv_jobs, "pool": pool_jobs, "bnorm": bnorm_jobs, "activ": activ_jobs,
            "softmax": softmax_jobs, "gemm": gemm_jobs, "CBAInfer": cbainfer_jobs}


# ---- running -------------------------------------------------------------------------------

def timing_note(timing, flags):
    """"median of 10 after 3 warm-up runs", or where --max_time stopped the runs short of -i,
    "median of 6 of -i 10: capped at 60 s by --max_time"."""
    count = len(timing.samples)
    if timing.capped is not None:
        return (f"median of {count} of -i {flags['iter']}: capped at {timing.capped:g} s by "
                f"--max_time")
    return f"median of {count} after {flags['warmup']} warm-up runs"


def run_command(command, flags, out=None):
    """Run one driver command with parsed ``flags``; returns the exit status."""
    import time
    from .bench import torch_baseline
    from .bench.harness import Bench, Measurement, time_case
    from .context import Context
    out = sys.stdout if out is None else out
    if flags.get("search"):
        os.environ["DLPRIM_FIND_MODE"] = "find"
        config.reload()
    ctx = Context(flags.get("device") or None)
    if flags["iter"] < 1 or flags["warmup"] < 0 or flags["max_time"] < 0:
        raise UsageError(f"-i must be >= 1, --warmup >= 0 and --max_time >= 0; got -i "
                         f"{flags['iter']}, --warmup {flags['warmup']}, --max_time "
                         f"{flags['max_time']:g}")
    iterations = flags["iter"]
    # Exactly --warmup untimed and -i timed runs, whatever they cost, unless --max_time.
    measurement = Measurement(warmup=flags["warmup"], repeat=iterations, min_repeat=iterations,
                              budget_s=math.inf, exact=True,
                              max_time=flags["max_time"] or None)
    bench = Bench(ctx, measurement=measurement)
    _, bench.reference, torch_note = torch_baseline.make(ctx, use_baseline=False)
    jobs, problem = BUILDERS[command](bench, flags)
    print(f"dlprim-driver {command} on {ctx.info.name}: "
          + ", ".join(f"{k} {v}" for k, v in problem.items()), file=out)
    status = 0
    for label, prepare in jobs:
        case = prepare()
        print(f"{label}: algorithm {case.algorithm}", file=out)
        if flags["verify"]:
            if bench.reference.torch is None:
                print(f"{label}: not verified ({torch_note})", file=out)
            else:
                error = case.verify()
                if error <= case.tolerance:
                    print(f"{label}: verifies OK (error {error:.2e} <= {case.tolerance:.0e}, "
                          f"float64 reference)", file=out)
                else:
                    print(f"{label}: verification FAILED (error {error:.2e} > "
                          f"{case.tolerance:.0e})", file=out)
                    status = 1
        if flags["time"]:
            timing = time_case(ctx, case, measurement)
            rate = ""
            if case.unit in ("GFLOP/s", "GB/s") and timing.median > 0:
                rate = f", {case.work / timing.median / 1e9:.4g} {case.unit}"
            print(f"{label}: kernel time {timing.median * 1e3:.4f} ms ({timing_note(timing, flags)}; "
                  f"p20 {timing.p20 * 1e3:.4f}, p80 {timing.p80 * 1e3:.4f}){rate}", file=out)
            if flags["wall"]:
                ctx.synchronize()
                started = time.perf_counter()
                for _ in range(iterations):
                    case.run()
                ctx.synchronize()
                wall = (time.perf_counter() - started) / iterations
                print(f"{label}: wall-clock time {wall * 1e3:.4f} ms per call", file=out)
        if not flags["verify"] and not flags["time"]:
            case.run()
            ctx.synchronize()
            print(f"{label}: ran", file=out)
    return status


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    # A line copied from DLPRIM_LOG_CMD output may keep its "dlprim-driver" prefix.
    if argv[0] in ("dlprim-driver", "DLPRIM_LOG_CMD:"):
        return main(argv[1:])
    command = COMMANDS.get(argv[0].lower())
    if command is None:
        print(f"dlprim-driver: unknown command {argv[0]!r}\n{usage()}", file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in argv[1:]):
        print(usage(command))
        return 0
    try:
        flags = parse_flags(command, argv[1:])
        return run_command(command, flags)
    except UsageError as e:
        print(f"dlprim-driver: {e}", file=sys.stderr)
        return 2
    except DlprimError as e:
        print(f"dlprim-driver {command}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def split_logged(line):
    """The argv of a ``DLPRIM_LOG_CMD: dlprim-driver ...`` log line (quotes and a trailing
    ``# not carried: ...`` comment as a shell reads them), without the prefix."""
    line = line.strip()
    if line.startswith("DLPRIM_LOG_CMD:"):
        line = line[len("DLPRIM_LOG_CMD:"):]
    argv = shlex.split(line, comments=True)
    if argv and argv[0] == "dlprim-driver":
        argv = argv[1:]
    return argv


if __name__ == "__main__":
    sys.exit(main())
