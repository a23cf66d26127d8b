"""Suite ``ops``: memory-bound operators (pooling, normalization, activations, softmax, reductions,
data layout)
through ``dlprim_py.functional``, whose names and semantics are torch.nn.functional's; so the
same call with the same arguments is the PyTorch baseline and, in float64, the reference.

Rates are in GB/s of the bytes an operator must read and write at least once.
"""
import numpy as np

from .harness import Case, CaseSpec, Skip, error_metric


class OpSpec:
    """``fn`` (a name in dlprim_py.functional and in torch.nn.functional or torch) applied to
    random inputs of ``shapes``, with keyword arguments ``kwargs``; ``positive`` lists inputs
    that must be > 0 (variances); the last ``len(keyword_tensors)`` inputs are passed as those
    keywords (layer_norm's weight and bias) instead of by position."""

    def __init__(self, label, fn, shapes, kwargs=None, positive=(), torch_namespace="F",
                 keyword_tensors=()):
        self.label = label
        self.fn = fn
        self.shapes = [tuple(s) for s in shapes]
        self.kwargs = dict(kwargs or {})
        self.positive = tuple(positive)
        self.torch_namespace = torch_namespace
        self.keyword_tensors = tuple(keyword_tensors)

    def arguments(self, tensors):
        """(positional, keyword) arguments of the call on ``tensors`` (one per shape)."""
        split = len(tensors) - len(self.keyword_tensors)
        keywords = dict(zip(self.keyword_tensors, tensors[split:]), **self.kwargs)
        return list(tensors[:split]), keywords

    def torch_fn(self, torch):
        space = torch.nn.functional if self.torch_namespace == "F" else torch
        return getattr(space, self.fn)

    @property
    def name(self):
        shape = "x".join(str(d) for d in self.shapes[0])
        return f"{self.label} {shape}"


def functional():
    try:
        from .. import functional as dp_functional
    except ImportError as e:
        raise Skip(f"dlprim_py.functional not importable ({e})") from None
    return dp_functional


def poison_pool(ctx, nbytes):
    """Leave NaN-filled buffers of ``nbytes`` in the context's memory pool, so that an output the
    operator allocates from it starts as NaN and an element it never writes fails the check."""
    from ..tensor import Tensor
    held = [Tensor.empty(ctx, (max(1, nbytes // 4),)).fill_(np.nan) for _ in range(2)]
    ctx.queue.finish()
    del held


def op_case(bench, spec):
    dp_functional = functional()
    fn = getattr(dp_functional, spec.fn, None)
    if fn is None:
        raise Skip(f"dlprim_py.functional.{spec.fn} not there yet")
    from ..autograd import no_grad
    from ..tensor import Tensor
    ctx = bench.ctx
    hosts = []
    for i, shape in enumerate(spec.shapes):
        low, high = (0.5, 1.5) if i in spec.positive else (-2.0, 2.0)
        hosts.append(bench.random(shape, low, high))
    tensors = [Tensor.from_numpy(ctx, h) for h in hosts]

    args, kwargs = spec.arguments(tensors)

    def call():
        with no_grad():
            return fn(*args, **kwargs)

    def torch_call(torch, *arrays):
        t_args, t_kwargs = spec.arguments(arrays)
        return spec.torch_fn(torch)(*t_args, **t_kwargs)

    ref = bench.reference.compute(torch_call, *hosts)
    out_bytes = ref.size * 4

    def run():
        call()

    def verify():
        poison_pool(ctx, out_bytes)
        out = call()
        if not isinstance(out, Tensor):
            raise Skip(f"dlprim_py.functional.{spec.fn} returned {type(out).__name__}, not a Tensor")
        return error_metric(out.numpy(), ref)

    moved = sum(h.nbytes for h in hosts) + out_bytes
    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        t_args, t_kwargs = spec.arguments([tb.tensor(h) for h in hosts])
        tfn = spec.torch_fn(tb.torch)
        torch_run = lambda: tfn(*t_args, **t_kwargs)  # noqa: E731
    return Case(run, verify, moved, "GB/s", algorithm=_algorithm(spec), torch_run=torch_run,
                params={"fn": spec.fn, "shapes": spec.shapes, "kwargs": spec.kwargs,
                        "bytes": moved})


def _algorithm(spec):
    """What the library runs for ``spec``: softmax's row or column kernel, else the function."""
    if spec.fn in ("softmax", "log_softmax"):
        from ..ops.softmax import choose_variant
        shape = spec.shapes[0]
        dim = spec.kwargs.get("dim", -1) % len(shape)
        return f"{spec.fn} {choose_variant(int(np.prod(shape[dim + 1:])))}"
    return spec.fn


def specs(bench):
    n = bench.default_batch(gpu=32, quick=1, cpu=4)
    c = 256
    feature = (n, c, 56, 56)
    stats = (c,)
    rows = max(1, n) * 64
    video = (n, 64, 8, 56, 56)
    return [
        OpSpec("max_pool2d 3x3 s2", "max_pool2d", [(n, 64, 112, 112)],
               dict(kernel_size=3, stride=2, padding=1)),
        OpSpec("avg_pool2d 2x2 s2", "avg_pool2d", [feature], dict(kernel_size=2, stride=2)),
        OpSpec("avg_pool2d global 7x7", "avg_pool2d", [(n, 2048, 7, 7)], dict(kernel_size=7)),
        OpSpec("batch_norm inference", "batch_norm", [feature, stats, stats, stats, stats],
               dict(training=False, eps=1e-5), positive=(2,)),
        OpSpec("batch_norm training", "batch_norm", [feature, stats, stats, stats, stats],
               dict(training=True, momentum=0.1, eps=1e-5), positive=(2,)),
        OpSpec("adaptive_avg_pool2d 1x1", "adaptive_avg_pool2d", [(n, 2048, 7, 7)],
               dict(output_size=1)),
        OpSpec("max_pool3d 3x3x3 s2", "max_pool3d", [video],
               dict(kernel_size=3, stride=2, padding=1)),
        OpSpec("avg_pool3d 2x2x2 s2", "avg_pool3d", [video], dict(kernel_size=2, stride=2)),
        OpSpec("adaptive_avg_pool3d 1x1x1", "adaptive_avg_pool3d", [(n, 512, 4, 7, 7)],
               dict(output_size=1)),
        OpSpec("max_pool1d 3 s2", "max_pool1d", [(n, 256, 4096)],
               dict(kernel_size=3, stride=2, padding=1)),
        OpSpec("pixel_shuffle x2", "pixel_shuffle", [(n, 256, 56, 56)], dict(upscale_factor=2)),
        OpSpec("unfold 3x3", "unfold", [(n, 64, 56, 56)], dict(kernel_size=3, padding=1)),
        OpSpec("group_norm 32 groups", "group_norm", [feature, stats, stats],
               dict(num_groups=32, eps=1e-5), keyword_tensors=("weight", "bias")),
        OpSpec("layer_norm rows", "layer_norm", [(rows, 768), (768,), (768,)],
               dict(normalized_shape=(768,), eps=1e-5), keyword_tensors=("weight", "bias")),
        OpSpec("relu", "relu", [feature]),
        OpSpec("gelu", "gelu", [feature]),
        OpSpec("silu", "silu", [feature]),
        OpSpec("hardswish", "hardswish", [feature]),
        OpSpec("softmax rows", "softmax", [(rows, 1000)], dict(dim=-1)),
        OpSpec("log_softmax rows", "log_softmax", [(rows, 1000)], dict(dim=-1)),
        OpSpec("softmax channels", "softmax", [(n, 21, 64, 64)], dict(dim=1)),
        OpSpec("sum rows", "sum", [(rows, 4096)], dict(dim=-1), torch_namespace="torch"),
        OpSpec("sum spatial", "sum", [(n, 2048, 7, 7)], dict(dim=(2, 3)), torch_namespace="torch"),
        OpSpec("mean channels", "mean", [feature], dict(dim=1), torch_namespace="torch"),
        OpSpec("amax rows", "amax", [(rows, 4096)], dict(dim=-1), torch_namespace="torch"),
        OpSpec("interpolate nearest 2x", "interpolate", [(n, 64, 56, 56)],
               dict(scale_factor=2, mode="nearest")),
        OpSpec("interpolate nearest-exact 0.6x", "interpolate", [(n, 64, 56, 56)],
               dict(scale_factor=0.6, mode="nearest-exact")),
        OpSpec("interpolate bilinear 2x", "interpolate", [(n, 64, 56, 56)],
               dict(scale_factor=2, mode="bilinear", align_corners=False)),
        OpSpec("interpolate bicubic 224->299", "interpolate", [(n, 3, 224, 224)],
               dict(size=(299, 299), mode="bicubic", align_corners=False)),
        OpSpec("interpolate trilinear 2x", "interpolate", [(n, 16, 16, 32, 32)],
               dict(scale_factor=2, mode="trilinear", align_corners=False)),
        OpSpec("interpolate area 56->7", "interpolate", [(n, 256, 56, 56)],
               dict(size=(7, 7), mode="area")),
        OpSpec("mish", "mish", [feature]),
        OpSpec("glu channels", "glu", [feature], dict(dim=1)),
        OpSpec("rms_norm rows", "rms_norm", [(rows, 768), (768,)],
               dict(normalized_shape=(768,)), keyword_tensors=("weight",)),
        OpSpec("normalize rows", "normalize", [(rows, 768)], dict(dim=-1)),
        OpSpec("cosine_similarity rows", "cosine_similarity", [(rows, 768), (rows, 768)],
               dict(dim=-1)),
        OpSpec("smooth_l1_loss mean", "smooth_l1_loss", [feature, feature]),
        OpSpec("kl_div batchmean", "kl_div", [(rows, 1000), (rows, 1000)],
               dict(reduction="batchmean"), positive=(1,)),
    ]


def cases(bench):
    functional()
    return [CaseSpec("ops", s.name, lambda s=s: op_case(bench, s)) for s in specs(bench)]

