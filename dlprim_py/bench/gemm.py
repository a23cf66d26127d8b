"""Suite ``gemm``: single-precision matrix products (row-major, C = alpha op(A) op(B) + beta C)
against cuBLAS (through PyTorch, TF32 off) or PyTorch on the CPU.

Shapes: square products, the transposed variants, the skinny products of a classifier layer and
a transformer block, a batched product of attention size, and the bias + ReLU epilogue.
``gemm_case`` is also what ``dlprim-driver gemm`` runs.
"""
import numpy as np

from .harness import Case, CaseSpec, Skip, error_metric


class GemmShape:
    """``batch`` products of (M x K) by (K x N); ``trans_a``/``trans_b`` say that A is stored
    K x M / B is stored N x K. ``epilogue``: None or "bias_relu" (bias per column)."""

    def __init__(self, m, n, k, trans_a=False, trans_b=False, batch=1, alpha=1.0, beta=0.0,
                 epilogue=None):
        self.m, self.n, self.k = m, n, k
        self.trans_a, self.trans_b = bool(trans_a), bool(trans_b)
        self.batch = batch
        self.alpha, self.beta = float(alpha), float(beta)
        self.epilogue = epilogue

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
        e = " +bias+relu" if self.epilogue else ""
        ab = "" if (self.alpha, self.beta) == (1.0, 0.0) else f" a={self.alpha:g} b={self.beta:g}"
        return f"{b}{self.m}x{self.n}x{self.k} {t}{e}{ab}"

    def describe(self):
        return {"m": self.m, "n": self.n, "k": self.k, "trans_a": self.trans_a,
                "trans_b": self.trans_b, "batch": self.batch, "alpha": self.alpha,
                "beta": self.beta, "epilogue": self.epilogue}


def gemm_api():
    try:
        from ..ops import gemm as gemm_ops
    except ImportError as e:
        raise Skip(f"dlprim_py.ops.gemm not importable ({e})") from None
    if not hasattr(gemm_ops, "GemmPlan"):
        raise Skip("dlprim_py.ops.gemm has no GemmPlan yet")
    return gemm_ops


def variant_name(plan):
    """The kernel variant a GemmPlan runs, with its tile parameters: "tiled 64x64x16"."""
    p = plan.params
    if plan.algorithm == "small":
        return "small"
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
    bias_host = bench.random((shape.n,)) if shape.epilogue else None
    a = Tensor.from_numpy(ctx, a_host)
    b = Tensor.from_numpy(ctx, b_host)
    c = Tensor.empty(ctx, (b_count, shape.m, shape.n))
    bias = Tensor.from_numpy(ctx, bias_host) if shape.epilogue else None
    lda, ldb, ldc = shape.a_shape[1], shape.b_shape[1], shape.n
    extra = {}
    if b_count > 1:
        extra.update(batch=b_count, stride_a=shape.m * shape.k, stride_b=shape.k * shape.n,
                     stride_c=shape.m * shape.n)
    if shape.epilogue:
        extra.update(bias_buf=bias.buffer, bias_off=bias.offset_elements, bias_per="n",
                     activation="relu")

    plan = gemm_ops.GemmPlan(ctx, shape.m, shape.n, shape.k, a.buffer, a.offset_elements, lda,
                             b.buffer, b.offset_elements, ldb, c.buffer, c.offset_elements, ldc,
                             trans_a=shape.trans_a, trans_b=shape.trans_b, alpha=shape.alpha,
                             beta=shape.beta, algorithm=algorithm, **extra)

    def run():
        plan.enqueue()

    def reference(t, a_, b_, c_, *rest):
        op_a = a_.transpose(1, 2) if shape.trans_a else a_
        op_b = b_.transpose(1, 2) if shape.trans_b else b_
        out = shape.alpha * t.bmm(op_a, op_b)
        if shape.beta:
            out = out + shape.beta * c_
        if shape.epilogue:
            out = t.relu(out + rest[0])
        return out

    def verify():
        if shape.beta:
            c.copy_(Tensor.from_numpy(ctx, c_host))
        else:
            c.fill_(np.nan)  # beta = 0 must not read C (NaN * 0 is NaN)
        run()
        arrays = [a_host, b_host, c_host] + ([bias_host] if shape.epilogue else [])
        return error_metric(c.numpy(), bench.reference.compute(reference, *arrays))

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        ta, tb_, tc = tb.tensor(a_host), tb.tensor(b_host), tb.tensor(c_host)
        tbias = tb.tensor(bias_host) if shape.epilogue else None
        op_a = ta.transpose(1, 2) if shape.trans_a else ta
        op_b = tb_.transpose(1, 2) if shape.trans_b else tb_
        torch = tb.torch
        if b_count == 1:
            op_a, op_b, tc2 = op_a[0], op_b[0], tc[0]
            if shape.epilogue:
                torch_run = lambda: torch.relu(torch.addmm(tbias, op_a, op_b))  # noqa: E731
            elif shape.beta:
                torch_run = lambda: torch.addmm(tc2, op_a, op_b, beta=shape.beta,  # noqa: E731
                                                alpha=shape.alpha)
            else:
                torch_run = lambda: torch.mm(op_a, op_b)  # noqa: E731
        else:
            torch_run = lambda: torch.bmm(op_a, op_b)  # noqa: E731
    return Case(run, verify, shape.flops(), "GFLOP/s", algorithm=variant_name(plan), torch_run=torch_run,
                params=dict(shape.describe(), flops=shape.flops()))


def shapes(bench):
    if bench.quick:
        return [GemmShape(256, 256, 256), GemmShape(256, 256, 256, trans_a=True),
                GemmShape(256, 256, 256, trans_b=True), GemmShape(255, 257, 253),
                GemmShape(256, 256, 256, epilogue="bias_relu"),
                GemmShape(96, 96, 64, batch=8, trans_b=True)]
    if bench.ctx.info.is_gpu:
        return [GemmShape(1024, 1024, 1024), GemmShape(2048, 2048, 2048),
                GemmShape(4096, 4096, 4096), GemmShape(8192, 8192, 8192),
                GemmShape(4096, 4096, 4096, trans_a=True), GemmShape(4096, 4096, 4096, trans_b=True),
                GemmShape(4095, 4097, 4093),
                GemmShape(64, 1000, 2048, trans_b=True), GemmShape(8192, 768, 3072),
                GemmShape(8192, 3072, 768, epilogue="bias_relu"),
                GemmShape(512, 512, 64, batch=96, trans_b=True)]
    return [GemmShape(512, 512, 512), GemmShape(1024, 1024, 1024),
            GemmShape(1024, 1024, 1024, trans_a=True), GemmShape(1024, 1024, 1024, trans_b=True),
            GemmShape(1000, 999, 1001), GemmShape(32, 1000, 2048, trans_b=True),
            GemmShape(1024, 768, 768, epilogue="bias_relu"), GemmShape(256, 256, 64, batch=16)]


def cases(bench):
    gemm_api()
    return [CaseSpec("gemm", s.name, lambda s=s: gemm_case(bench, s)) for s in shapes(bench)]
