"""Suite ``gemm``: single-precision matrix products (row-major, C = alpha op(A) op(B) + beta C)
against cuBLAS (through PyTorch, TF32 off) or PyTorch on the CPU.

Shapes: square products, the transposed variants, the skinny products of a classifier layer and
a transformer block, a batched product of attention size, and the bias + ReLU epilogue.
``gemm_case`` is also what ``dlprim-driver gemm`` runs.
"""
import numpy as np

from .harness import Case, CaseSpec, Skip, error_metric
from .torch_baseline import activation_reference


class GemmShape:
    """``batch`` products of (M x K) by (K x N); ``trans_a``/``trans_b`` say that A is stored
    K x M / B is stored N x K. ``bias``: None, "n" (bias[N] added to every row) or "m"
    (bias[M] added to every column); ``activation``: None or a name / ActivationDesc applied
    last: C = act(alpha op(A) op(B) + beta C + bias)."""

    def __init__(self, m, n, k, trans_a=False, trans_b=False, batch=1, alpha=1.0, beta=0.0,
                 bias=None, activation=None):
        from ..activation import as_activation
        self.m, self.n, self.k = m, n, k
        self.trans_a, self.trans_b = bool(trans_a), bool(trans_b)
        self.batch = batch
        self.alpha, self.beta = float(alpha), float(beta)
        if bias not in (None, "n", "m"):
            raise ValueError(f"bias must be None, 'n' or 'm', got {bias!r}")
        self.bias = bias
        self.activation = as_activation(activation)

    @property
    def a_shape(self):
        return (self.k, self.m) if self.trans_a else (self.m, self.k)

    @property
    def b_shape(self):
        return (self.n, self.k) if self.trans_b else (self.k, self.n)

    def flops(self):
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def name(self):
        t = ("T" if self.trans_a else "N") + ("T" if self.trans_b else "N")
        b = f"{self.batch}x " if self.batch > 1 else ""
        e = f" +bias[{self.bias}]" if self.bias else ""
        if self.activation is not None:
            e += f"+{self.activation.mode.value}"
        ab = "" if (self.alpha, self.beta) == (1.0, 0.0) else f" a={self.alpha:g} b={self.beta:g}"
        return f"{b}{self.m}x{self.n}x{self.k} {t}{e}{ab}"

    def describe(self):
        return {"m": self.m, "n": self.n, "k": self.k, "trans_a": self.trans_a,
                "trans_b": self.trans_b, "batch": self.batch, "alpha": self.alpha,
                "beta": self.beta, "bias": self.bias,
                "activation": self.activation.mode.value if self.activation else None}


def gemm_api():
    try:
        from ..ops import gemm as gemm_ops
    except ImportError as e:
        raise Skip(f"dlprim_py.ops.gemm not importable ({e})") from None
    if not hasattr(gemm_ops, "GemmPlan"):
        raise Skip("dlprim_py.ops.gemm has no GemmPlan yet")
    return gemm_ops


def variant_name(plan):
    """The kernel variant a GemmPlan runs, with its tile parameters: "tiled 64x64x16",
    "subgroup 16 w8x1 g1" (subgroup size, register block, subgroups per work-group)."""
    p = plan.params
    if plan.algorithm == "small":
        return "small"
    if plan.algorithm == "subgroup":
        return f"subgroup {p['sg_size']} w{p['wpt_m']}x{p['wpt_n']} g{p['sg_groups']}"
    tiles = f"{p.get('tile_m')}x{p.get('tile_n')}x{p.get('tile_k')}"
    if plan.algorithm == "splitk":
        return f"splitk{plan.splits} {tiles}"
    return f"{plan.algorithm} {tiles}"


def gemm_case(bench, shape, algorithm=None):
    """A Case for one GEMM; ``algorithm`` forces "tiled", "splitk" or "small"."""
    gemm_ops = gemm_api()
    from ..tensor import Tensor
    ctx = bench.ctx
    b_count = shape.batch
    a_host = bench.random((b_count,) + shape.a_shape)
    b_host = bench.random((b_count,) + shape.b_shape)
    c_host = bench.random((b_count, shape.m, shape.n))
    bias_len = {"n": shape.n, "m": shape.m}.get(shape.bias)
    bias_host = bench.random((bias_len,)) if bias_len else None
    a = Tensor.from_numpy(ctx, a_host)
    b = Tensor.from_numpy(ctx, b_host)
    c = Tensor.empty(ctx, (b_count, shape.m, shape.n))
    bias = Tensor.from_numpy(ctx, bias_host) if bias_len else None
    lda, ldb, ldc = shape.a_shape[1], shape.b_shape[1], shape.n
    extra = {}
    if b_count > 1:
        extra.update(batch=b_count, stride_a=shape.m * shape.k, stride_b=shape.k * shape.n,
                     stride_c=shape.m * shape.n)
    if bias is not None:
        extra.update(bias_buf=bias.buffer, bias_off=bias.offset_elements, bias_per=shape.bias)
    if shape.activation is not None:
        extra.update(activation=shape.activation)

    plan = gemm_ops.GemmPlan(ctx, shape.m, shape.n, shape.k, a.buffer, a.offset_elements, lda,
                             b.buffer, b.offset_elements, ldb, c.buffer, c.offset_elements, ldc,
                             trans_a=shape.trans_a, trans_b=shape.trans_b, alpha=shape.alpha,
                             beta=shape.beta, algorithm=algorithm, **extra)

    def run():
        plan.enqueue()

    def reference(t, a_, b_, c_, *rest):
        op_a = a_.transpose(1, 2) if shape.trans_a else a_
        op_b = b_.transpose(1, 2) if shape.trans_b else b_
        out = t.bmm(op_a, op_b)
        if shape.alpha != 1.0:
            out = shape.alpha * out
        if shape.beta:
            out = out + shape.beta * c_
        if shape.bias == "n":
            out = out + rest[0].reshape(1, 1, -1)
        elif shape.bias == "m":
            out = out + rest[0].reshape(1, -1, 1)
        if shape.activation is not None:
            out = activation_reference(t, shape.activation, out)
        return out

    arrays = [a_host, b_host, c_host] + ([bias_host] if bias_len else [])

    def verify():
        if shape.beta:
            c.copy_(Tensor.from_numpy(ctx, c_host))
        else:
            c.fill_(np.nan)  # beta = 0 must not read C (NaN * 0 is NaN)
        run()
        return error_metric(c.numpy(), bench.reference.compute(reference, *arrays))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        torch = tb.torch
        targs = [tb.tensor(h) for h in arrays]
        ta, tb_, tc = targs[:3]
        op_a = (ta.transpose(1, 2) if shape.trans_a else ta)[0]
        op_b = (tb_.transpose(1, 2) if shape.trans_b else tb_)[0]
        plain = shape.alpha == 1.0 and shape.beta == 0.0 and shape.activation is None
        if b_count == 1 and plain and shape.bias is None:
            torch_run = lambda: torch.mm(op_a, op_b)  # noqa: E731
        elif b_count == 1 and plain and shape.bias == "n":
            torch_run = lambda: torch.addmm(targs[3], op_a, op_b)  # noqa: E731
        elif (b_count == 1 and shape.bias == "n" and shape.alpha == 1.0 and shape.beta == 0.0
              and shape.activation is not None and shape.activation.mode.value == "relu"):
            torch_run = lambda: torch.relu(torch.addmm(targs[3], op_a, op_b))  # noqa: E731
        elif b_count == 1 and shape.bias is None and shape.activation is None:
            tc2 = tc[0]
            torch_run = lambda: torch.addmm(tc2, op_a, op_b, beta=shape.beta,  # noqa: E731
                                            alpha=shape.alpha)
        else:
            torch_run = lambda: reference(torch, *targs)  # noqa: E731
    return Case(run, verify, shape.flops(), "GFLOP/s", algorithm=variant_name(plan), torch_run=torch_run,
                params=dict(shape.describe(), flops=shape.flops()))


def shapes(bench):
    if bench.quick:
        return [GemmShape(192, 192, 192), GemmShape(192, 192, 192, trans_a=True),
                GemmShape(192, 192, 192, trans_b=True), GemmShape(191, 193, 189),
                GemmShape(192, 192, 192, bias="n", activation="relu"),
                GemmShape(64, 64, 64, batch=8, trans_b=True)]
    if bench.ctx.info.is_gpu:
        return [GemmShape(1024, 1024, 1024), GemmShape(2048, 2048, 2048),
                GemmShape(4096, 4096, 4096), GemmShape(8192, 8192, 8192),
                GemmShape(4096, 4096, 4096, trans_a=True), GemmShape(4096, 4096, 4096, trans_b=True),
                GemmShape(4095, 4097, 4093),
                GemmShape(64, 1000, 2048, trans_b=True), GemmShape(8192, 768, 3072),
                GemmShape(8192, 3072, 768, bias="n", activation="relu"),
                GemmShape(512, 512, 64, batch=96, trans_b=True)]
    return [GemmShape(512, 512, 512), GemmShape(1024, 1024, 1024),
            GemmShape(1024, 1024, 1024, trans_a=True), GemmShape(1024, 1024, 1024, trans_b=True),
            GemmShape(1000, 999, 1001), GemmShape(32, 1000, 2048, trans_b=True),
            GemmShape(1024, 768, 768, bias="n", activation="relu"), GemmShape(256, 256, 64, batch=16)]


def cases(bench):
    gemm_api()
    return [CaseSpec("gemm", s.name, lambda s=s: gemm_case(bench, s)) for s in shapes(bench)]
