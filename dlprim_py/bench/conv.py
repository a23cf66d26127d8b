"""Suite ``conv``: the distinct convolution layers of ResNet-50, VGG-16 and MobileNetV2, forward,
backward-data and backward-filter, against cuDNN (through PyTorch) or PyTorch on the CPU.

``conv_case`` is also what ``dlprim-driver conv`` runs, so both report the same figures.
"""
import numpy as np

from .harness import Case, CaseSpec, Skip
from .layers import QUICK_DIRECTIONS, layers_of

DIRECTIONS = ("fwd", "bwd-data", "bwd-filter")
# The library's names of the three directions (Convolution.algorithms(direction) and friends).
API_DIRECTION = {"fwd": "forward", "bwd-data": "backward_data", "bwd-filter": "backward_filter"}
# Backward-filter sums over batch x output pixels: float32 accumulation error grows with that.
TOLERANCE = {"fwd": 1e-5, "bwd-data": 1e-5, "bwd-filter": 5e-5}


class ConvShape:
    """A 2-D convolution problem in NCHW: input (n, c, h, w), weights (k, c/groups, r, s)."""

    def __init__(self, n, c, h, w, k, r, s, pad=(0, 0), stride=(1, 1), dilation=(1, 1), groups=1):
        self.n, self.c, self.h, self.w, self.k, self.r, self.s = n, c, h, w, k, r, s
        self.pad = tuple(pad)
        self.stride = tuple(stride)
        self.dilation = tuple(dilation)
        self.groups = groups

    @classmethod
    def from_layer(cls, layer, batch):
        p, st = layer.padding, layer.stride
        return cls(batch, layer.in_channels, layer.size, layer.size, layer.out_channels,
                   layer.kernel, layer.kernel, (p, p), (st, st), (1, 1), layer.groups)

    @property
    def input_shape(self):
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self):
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def output_hw(self):
        oh = (self.h + 2 * self.pad[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1
        ow = (self.w + 2 * self.pad[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1
        return oh, ow

    @property
    def output_shape(self):
        return (self.n, self.k) + self.output_hw

    def flops(self):
        oh, ow = self.output_hw
        return 2.0 * self.n * self.k * oh * ow * (self.c // self.groups) * self.r * self.s

    def describe(self):
        return {"input": self.input_shape, "weight": self.weight_shape, "pad": self.pad,
                "stride": self.stride, "dilation": self.dilation, "groups": self.groups}


def conv_api():
    """(Convolution, ConvolutionDesc), or Skip when the convolution module is not there."""
    try:
        from ..ops.conv import Convolution, ConvolutionDesc
    except ImportError as e:
        raise Skip(f"dlprim_py.ops.conv not importable ({e})") from None
    return Convolution, ConvolutionDesc


def resolve_algorithm(conv, direction, requested):
    """``requested`` (a name, or an index into ``conv.algorithms(direction)``) -> the algorithm
    name; UnsupportedError when it does not apply to the problem."""
    from ..errors import UnsupportedError
    available = list(conv.algorithms(API_DIRECTION[direction]))
    if isinstance(requested, str) and requested.lstrip("-").isdigit():
        requested = int(requested)
    if isinstance(requested, int):
        if 0 <= requested < len(available):
            return available[requested]
        raise UnsupportedError(f"algorithm index {requested} out of range for {direction}: "
                               f"{len(available)} apply ({', '.join(available)})")
    if requested in available:
        return requested
    raise UnsupportedError(f"algorithm {requested!r} does not apply to this {direction} problem; "
                           f"applicable: {', '.join(available) or 'none'}")


def chosen_algorithm(conv, direction):
    """The algorithm the library picks for ``direction`` (DLPRIM_CONV_ALGO, else find or
    immediate mode, as a call with algo=None does)."""
    from ..ops.conv import choose
    return choose(conv.ctx, conv.problem, API_DIRECTION[direction])


def _to_layout(array, layout):
    """An NCHW (or KCRS) array as stored in ``layout``."""
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1)) if layout == "NHWC" else array


def _from_layout(array, layout):
    return np.ascontiguousarray(array.transpose(0, 3, 1, 2)) if layout == "NHWC" else array


def conv_case(bench, shape, direction, algo=None, bias=False, layout="NCHW"):
    """A Case for one convolution problem and direction ("fwd", "bwd-data", "bwd-filter");
    ``algo`` forces an algorithm (name or index); ``bias`` adds a per-channel bias to the
    forward; ``layout`` "NCHW" or "NHWC" (the data is checked in NCHW either way)."""
    Convolution, ConvolutionDesc = conv_api()
    from ..tensor import Tensor, TensorDesc
    ctx = bench.ctx
    api = API_DIRECTION[direction]
    x_host = bench.random(shape.input_shape)
    fan_in = (shape.c // shape.groups) * shape.r * shape.s
    w_host = bench.random(shape.weight_shape, -1.0 / np.sqrt(fan_in), 1.0 / np.sqrt(fan_in))
    dy_host = bench.random(shape.output_shape)
    stored = lambda s: (s[0], s[2], s[3], s[1]) if layout == "NHWC" else tuple(s)  # noqa: E731
    conv = Convolution(ctx, TensorDesc(stored(shape.input_shape)),
                       TensorDesc(stored(shape.weight_shape)),
                       ConvolutionDesc(padding=shape.pad, stride=shape.stride,
                                       dilation=shape.dilation, groups=shape.groups),
                       layout=layout)
    if tuple(conv.output_desc.shape) != stored(shape.output_shape):
        raise Skip(f"library output shape {conv.output_desc.shape} != "
                   f"{stored(shape.output_shape)}")
    algorithm = (resolve_algorithm(conv, direction, algo) if algo is not None
                 else chosen_algorithm(conv, direction))
    size = int(conv.workspace_size(algorithm, api) or 0)
    workspace = Tensor.empty(ctx, ((size + 3) // 4,)) if size else None
    x = Tensor.from_numpy(ctx, _to_layout(x_host, layout))
    w = Tensor.from_numpy(ctx, _to_layout(w_host, layout))
    bias_host = bench.random((shape.k,)) if bias and direction == "fwd" else None
    b = Tensor.from_numpy(ctx, bias_host) if bias_host is not None else None
    stride, pad, dil, groups = shape.stride, shape.pad, shape.dilation, shape.groups
    ref = bench.reference
    # The algorithm and its workspace are passed explicitly: run() then only enqueues.
    kwargs = {"algo": algorithm, "workspace": workspace}

    if direction == "fwd":
        out = Tensor.empty(ctx, stored(shape.output_shape))

        def run():
            conv.forward(x, w, out, bias=b, **kwargs)

        def reference():
            if bias_host is None:
                return ref.compute(lambda t, a, f: t.nn.functional.conv2d(
                    a, f, None, stride, pad, dil, groups), x_host, w_host)
            return ref.compute(lambda t, a, f, c: t.nn.functional.conv2d(
                a, f, c, stride, pad, dil, groups), x_host, w_host, bias_host)
    elif direction == "bwd-data":
        dy = Tensor.from_numpy(ctx, _to_layout(dy_host, layout))
        out = Tensor.empty(ctx, stored(shape.input_shape))

        def run():
            conv.backward_data(dy, w, out, 1.0, 0.0, **kwargs)

        def reference():
            return ref.compute(lambda t, b, g: t.nn.grad.conv2d_input(
                shape.input_shape, b, g, stride, pad, dil, groups), w_host, dy_host)
    else:
        dy = Tensor.from_numpy(ctx, _to_layout(dy_host, layout))
        out = Tensor.empty(ctx, stored(shape.weight_shape))

        def run():
            conv.backward_filter(dy, x, out, 1.0, 0.0, **kwargs)

        def reference():
            return ref.compute(lambda t, a, g: t.nn.grad.conv2d_weight(
                a, shape.weight_shape, g, stride, pad, dil, groups), x_host, dy_host)

    def verify():
        from .harness import error_metric
        out.fill_(np.nan)
        run()
        return error_metric(_from_layout(out.numpy(), layout), reference())

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        F = tb.torch.nn.functional
        tx, tw = tb.tensor(x_host), tb.tensor(w_host)
        if direction == "fwd":
            tbias = tb.tensor(bias_host) if bias_host is not None else None
            torch_run = lambda: F.conv2d(tx, tw, tbias, stride, pad, dil, groups)  # noqa: E731
        elif direction == "bwd-data":
            tdy = tb.tensor(dy_host)
            torch_run = lambda: tb.torch.nn.grad.conv2d_input(  # noqa: E731
                shape.input_shape, tw, tdy, stride, pad, dil, groups)
        else:
            tdy = tb.tensor(dy_host)
            torch_run = lambda: tb.torch.nn.grad.conv2d_weight(  # noqa: E731
                tx, shape.weight_shape, tdy, stride, pad, dil, groups)
    params = dict(shape.describe(), direction=direction, flops=shape.flops(), layout=layout,
                  bias=bias_host is not None)
    return Case(run, verify, shape.flops(), "GFLOP/s", algorithm=algorithm, torch_run=torch_run,
                tolerance=TOLERANCE[direction], params=params)


def cases(bench):
    conv_api()
    batch = bench.default_batch(gpu=32, quick=1, cpu=4)
    directions = getattr(bench, "directions", DIRECTIONS)
    algorithms = [None]
    if getattr(bench, "all_algorithms", False):
        from ..ops.conv import ALGORITHMS
        algorithms = list(ALGORITHMS)
    specs = []
    for net in getattr(bench, "nets", ("resnet50", "vgg16", "mobilenet_v2")):
        for layer in layers_of(net, quick=bench.quick):
            shape = ConvShape.from_layer(layer, batch)
            wanted = directions
            if bench.quick:
                wanted = [d for d in directions if d in QUICK_DIRECTIONS.get(net, DIRECTIONS)]
            for direction in wanted:
                for algo in algorithms:
                    def prepare(shape=shape, direction=direction, count=layer.count, algo=algo):
                        case = _forced_case(bench, shape, direction, algo)
                        case.params["count_in_net"] = count
                        return case
                    label = f"{net} {layer.name} n{batch} {direction}"
                    specs.append(CaseSpec("conv", label + (f" [{algo}]" if algo else ""), prepare,
                                          group=net if algo is None else f"{net} [{algo}]"))
    return specs


def _forced_case(bench, shape, direction, algo):
    """conv_case; a forced algorithm that does not apply to the layer is a skip, not a failure."""
    from ..errors import UnsupportedError
    if algo is None:
        return conv_case(bench, shape, direction)
    try:
        return conv_case(bench, shape, direction, algo=algo)
    except UnsupportedError as e:
        if "does not apply" in str(e):
            raise Skip(str(e).split(";")[0]) from None
        raise
