"""The ``dispatch`` suite of dlprim-bench, and what ``benchmarks/dispatch.py`` runs: calls as
users make them. The public API (``F.conv2d``, ``dp.gemm``, ``F.linear``, a functional conv +
batch norm + ReLU chain) against PyTorch, and the host time per repeated call of every family on
tiny tensors (forward, and per backward node), where the host is all a call costs.

Every case is checked against PyTorch in float64 (on the CPU) before it is timed. In the suite,
the harness times each call by wall clock with the device drained after it, PyTorch the same
way (``Case.wall_clock``); each row's params add the host microseconds per call of
back-to-back calls.
"""
import math
import time

import numpy as np

import dlprim_py as dp
import dlprim_py.functional as F

from .harness import error_metric


def wall_ms(run, drain, repeat, warmup=3):
    """Median wall clock of ``run(); drain()`` in ms, after ``warmup`` calls."""
    for _ in range(warmup):
        run()
    drain()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        drain()
        samples.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(samples))


def host_us(run, drain, calls):
    """Host microseconds per call of ``calls`` back-to-back calls (the device drained only at
    the end: for tiny tensors the host is the bottleneck)."""
    for _ in range(5):
        run()
    drain()
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, time.perf_counter() - t0)
        drain()
    return 1e6 * best / calls


class Torch:
    def __init__(self):
        import torch
        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cudnn.benchmark = True

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def tensor(self, array, grad=False):
        t = self.torch.tensor(array, device=self.device)
        return t.requires_grad_(grad)


def _ref(torch_fn, arrays):
    """torch_fn on CPU copies of ``arrays`` (floating point ones in float64), as numpy."""
    import torch
    return torch_fn(*[torch.tensor(a, dtype=torch.float64 if a.dtype.kind == "f" else None)
                      for a in arrays]).detach().numpy()


_DEPTHWISE = ((32, 112, 1), (144, 56, 2), (384, 14, 1), (960, 7, 1))


def public_names(batch, gemm_size):
    """The names of ``public_cases``, in order, without building anything."""
    return ([f"F.conv2d 64->64 3x3 56^2 b{batch}", f"F.conv2d 64->64 1x1 56^2 b{batch}"]
            + [f"F.conv2d dw {ch} 3x3 s{stride} {hw}^2 b{batch}" for ch, hw, stride in _DEPTHWISE]
            + [f"dp.gemm {gemm_size}^3", f"F.linear {batch}x2048->1000",
               f"relu(batch_norm(conv2d)) 64->64 3x3 56^2 b{batch}"])


def public_cases(ctx, th, rng, batch, gemm_size):
    """(name, ours(), theirs(), check()) for the public calls of the issue's table."""
    tF = th.torch.nn.functional
    cases = []

    def conv_case(name, n, c, k, hw, r, stride, pad, groups):
        x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
        w = (rng.standard_normal((k, c // groups, r, r)) / math.sqrt(c // groups * r * r)).astype(np.float32)
        xd, wd = dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w)
        xt, wt = th.tensor(x), th.tensor(w)

        def check():
            out = F.conv2d(xd, wd, stride=stride, padding=pad, groups=groups).numpy()
            return error_metric(out, _ref(lambda a, b: tF.conv2d(a, b, stride=stride, padding=pad,
                                                                  groups=groups), (x, w)))
        cases.append((name, lambda: F.conv2d(xd, wd, stride=stride, padding=pad, groups=groups),
                      lambda: tF.conv2d(xt, wt, stride=stride, padding=pad, groups=groups), check))

    conv_case(f"F.conv2d 64->64 3x3 56^2 b{batch}", batch, 64, 64, 56, 3, 1, 1, 1)
    conv_case(f"F.conv2d 64->64 1x1 56^2 b{batch}", batch, 64, 64, 56, 1, 1, 0, 1)
    for ch, hw, stride in _DEPTHWISE:
        conv_case(f"F.conv2d dw {ch} 3x3 s{stride} {hw}^2 b{batch}", batch, ch, ch, hw, 3, stride,
                  1, ch)

    size = gemm_size
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    ad, bd = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    at, bt = th.tensor(a), th.tensor(b)
    cases.append((f"dp.gemm {size}^3", lambda: dp.gemm(ad, bd), lambda: th.torch.mm(at, bt),
                  lambda: error_metric(dp.gemm(ad, bd).numpy(), a.astype(np.float64) @ b)))

    x = rng.standard_normal((batch, 2048)).astype(np.float32)
    w = (rng.standard_normal((1000, 2048)) / 45).astype(np.float32)
    bias = rng.standard_normal(1000).astype(np.float32)
    xd, wd, bdd = (dp.Tensor.from_numpy(ctx, v) for v in (x, w, bias))
    xt, wt, btt = (th.tensor(v) for v in (x, w, bias))
    cases.append((f"F.linear {batch}x2048->1000", lambda: F.linear(xd, wd, bdd),
                  lambda: tF.linear(xt, wt, btt),
                  lambda arrays=(x, w, bias): error_metric(F.linear(xd, wd, bdd).numpy(),
                                                          _ref(tF.linear, arrays))))

    x = rng.standard_normal((batch, 64, 56, 56)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    stats = [rng.standard_normal(64).astype(np.float32) for _ in range(3)]
    var = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    mean, gamma, beta = stats
    dps = [dp.Tensor.from_numpy(ctx, v) for v in (x, w, mean, var, gamma, beta)]
    ths = [th.tensor(v) for v in (x, w, mean, var, gamma, beta)]

    def chain(Fm, x_, w_, m_, v_, g_, b_):
        return Fm.relu(Fm.batch_norm(Fm.conv2d(x_, w_, padding=1), m_, v_, g_, b_,
                                     training=False))

    cases.append((f"relu(batch_norm(conv2d)) 64->64 3x3 56^2 b{batch}", lambda: chain(F, *dps),
                  lambda: chain(tF, *ths),
                  lambda: error_metric(chain(F, *dps).numpy(),
                                       _ref(lambda *t: chain(tF, *t), (x, w, mean, var, gamma, beta)))))
    assert [c[0] for c in cases] == public_names(batch, gemm_size)
    return cases


HOST_NAMES = ("relu", "add", "mul by number", "conv2d 3x3", "conv2d 1x1", "conv2d depthwise",
              "dp.gemm 16^3", "linear", "batch_norm eval", "batch_norm train", "max_pool2d",
              "adaptive_avg_pool2d", "softmax", "sum", "cross_entropy", "flatten")


def host_cases(ctx, rng):
    """(name, call, reference) on tiny tensors, where the host is all a call costs:
    ``reference()`` is the call's result in float64 by PyTorch on the CPU (which this needs)."""
    def t(*shape, grad=False):
        return dp.Tensor.from_numpy(ctx, rng.standard_normal(shape).astype(np.float32),
                                    requires_grad=grad)
    x, w, w1 = t(2, 8, 8, 8, grad=True), t(8, 8, 3, 3, grad=True), t(8, 8, 1, 1, grad=True)
    wd, g, b = t(8, 1, 3, 3, grad=True), t(8, grad=True), t(8, grad=True)
    rm, rv = t(8), dp.Tensor.full(ctx, (8,), 1.0)
    x2, w2, b2 = t(4, 32, grad=True), t(10, 32, grad=True), t(10, grad=True)
    target = dp.Tensor.from_numpy(ctx, np.array([1, 2, 3, 4], np.int64))
    a, bm = t(16, 16), t(16, 16)

    import torch
    tF = torch.nn.functional

    def ref(fn, *tensors):
        """``_ref`` of ``fn`` on copies of ``tensors``' values, computed when called."""
        return lambda: _ref(fn, [t.numpy() for t in tensors])

    cases = [
        ("relu", lambda: F.relu(x), ref(tF.relu, x)),
        ("add", lambda: x + x, ref(lambda x: x + x, x)),
        ("mul by number", lambda: x * 2.0, ref(lambda x: x * 2.0, x)),
        ("conv2d 3x3", lambda: F.conv2d(x, w, padding=1),
         ref(lambda x, w: tF.conv2d(x, w, padding=1), x, w)),
        ("conv2d 1x1", lambda: F.conv2d(x, w1), ref(tF.conv2d, x, w1)),
        ("conv2d depthwise", lambda: F.conv2d(x, wd, padding=1, groups=8),
         ref(lambda x, w: tF.conv2d(x, w, padding=1, groups=8), x, wd)),
        ("dp.gemm 16^3", lambda: dp.gemm(a, bm), ref(torch.mm, a, bm)),
        ("linear", lambda: F.linear(x2, w2, b2), ref(tF.linear, x2, w2, b2)),
        ("batch_norm eval", lambda: F.batch_norm(x, rm, rv, g, b, training=False),
         ref(lambda *v: tF.batch_norm(*v, training=False), x, rm, rv, g, b)),
        ("batch_norm train", lambda: F.batch_norm(x, None, None, g, b, training=True),
         ref(lambda x, g, b: tF.batch_norm(x, None, None, g, b, training=True), x, g, b)),
        ("max_pool2d", lambda: F.max_pool2d(x, 2), ref(lambda x: tF.max_pool2d(x, 2), x)),
        ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(x, 1),
         ref(lambda x: tF.adaptive_avg_pool2d(x, 1), x)),
        ("softmax", lambda: F.softmax(x2, dim=1), ref(lambda x: tF.softmax(x, dim=1), x2)),
        ("sum", lambda: F.sum(x), ref(torch.sum, x)),
        ("cross_entropy", lambda: F.cross_entropy(x2, target), ref(tF.cross_entropy, x2, target)),
        ("flatten", lambda: F.flatten(x, 1), ref(lambda x: torch.flatten(x, 1), x)),
    ]
    assert tuple(c[0] for c in cases) == HOST_NAMES
    return cases


def backward_per_node(ctx, rng, calls):
    """Host microseconds per backward node of a small conv / BN / ReLU / pool / linear / loss
    graph (forward excluded)."""
    def t(*shape):
        return dp.Tensor.from_numpy(ctx, rng.standard_normal(shape).astype(np.float32),
                                    requires_grad=True)
    x, w, g, b, fc = t(2, 8, 8, 8), t(8, 8, 3, 3), t(8), t(8), t(10, 8)
    target = dp.Tensor.from_numpy(ctx, np.array([1, 2], np.int64))
    params = (x, w, g, b, fc)

    def forward():
        y = F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, g, b, training=True))
        y = F.flatten(F.adaptive_avg_pool2d(F.max_pool2d(y + y, 2), 1), 1)
        return F.cross_entropy(F.linear(y, fc), target)

    nodes = 9   # conv, bn, relu, add, max_pool, avg_pool, flatten, linear, cross_entropy
    total = 0.0
    for i in range(calls + 5):
        loss = forward()
        ctx.synchronize()
        t0 = time.perf_counter()
        loss.backward()
        if i >= 5:
            total += time.perf_counter() - t0
        ctx.synchronize()
        for p in params:
            p.grad = None
    return 1e6 * total / calls / nodes




# ---- the dlprim-bench suite -----------------------------------------------------------------

def cases(bench):
    """CaseSpecs: the public calls at ``--batch`` (64 on a GPU; 2 with --quick or on a CPU,
    with a 256^3 GEMM), then the host-bound tiny calls."""
    from .harness import CaseSpec, Skip
    reference = getattr(bench, "reference", None)
    if reference is None or reference.torch is None:
        raise Skip("no float64 reference: torch not importable")
    big = bench.ctx.info.is_gpu and not bench.quick
    batch = bench.batch or (64 if big else 2)
    th = Torch()
    rng = np.random.default_rng(0)
    built = {}

    def public(index):
        if "public" not in built:
            built["public"] = public_cases(bench.ctx, th, rng, batch, 1024 if big else 256)
        return _public_case(bench, th, *built["public"][index])

    specs = [CaseSpec("dispatch", name, lambda i=i: public(i), group="public call")
             for i, name in enumerate(public_names(batch, 1024 if big else 256))]

    def tiny(index):
        if "host" not in built:
            built["host"] = host_cases(bench.ctx, rng)
        return _host_case(bench, *built["host"][index])

    specs += [CaseSpec("dispatch", f"host: {name}", lambda i=i: tiny(i), group="host per call")
              for i, name in enumerate(HOST_NAMES)]
    return specs


def _public_case(bench, th, name, ours, theirs, check):
    from .harness import Case
    params = {"host_us_per_call": host_us(ours, bench.ctx.synchronize,
                                          20 if bench.quick else 200)}
    return Case(ours, check, work=0.0, unit="ms", algorithm="public call",
                torch_run=theirs if bench.torch is not None else None, params=params,
                wall_clock=True)


def _host_case(bench, name, call, reference):
    from .harness import Case
    params = {"host_us_per_call": host_us(call, bench.ctx.synchronize,
                                          50 if bench.quick else 1000)}
    return Case(call, lambda: error_metric(call().numpy(), reference()), work=0.0, unit="ms",
                algorithm="host", params=params, wall_clock=True)
