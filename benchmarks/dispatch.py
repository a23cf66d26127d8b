"""What a call costs as users make it: the public API (``F.conv2d``, ``dp.gemm``, ``F.linear``,
a functional conv + batch norm + ReLU chain), wall clock with the device drained after each
call, against PyTorch timed the same way in the same process; and the host time per repeated
call of every family on tiny tensors (forward, and per backward node), where the host is all a
call costs.

Every case is checked against PyTorch in float64 (on the CPU) before it is timed. The device
span column is the OpenCL profiling time from a marker before the call to a marker after it:
where the time goes, not how fast the call is.

    python benchmarks/dispatch.py [--quick] [--json FILE]
"""
import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
import dlprim_py.functional as F  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402


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
    """torch_fn on float64 CPU copies of ``arrays``, as numpy."""
    import torch
    return torch_fn(*[torch.tensor(a, dtype=torch.float64) for a in arrays]).detach().numpy()


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
    for ch, hw, stride in ((32, 112, 1), (144, 56, 2), (384, 14, 1), (960, 7, 1)):
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
    return cases


def host_cases(ctx, rng):
    """(name, call, nodes) on tiny tensors: the host's time per call; ``nodes``: backward nodes
    the call records (its backward is timed per node)."""
    def t(*shape, grad=False):
        return dp.Tensor.from_numpy(ctx, rng.standard_normal(shape).astype(np.float32),
                                    requires_grad=grad)
    x, w, w1 = t(2, 8, 8, 8, grad=True), t(8, 8, 3, 3, grad=True), t(8, 8, 1, 1, grad=True)
    wd, g, b = t(8, 1, 3, 3, grad=True), t(8, grad=True), t(8, grad=True)
    rm, rv = t(8), dp.Tensor.full(ctx, (8,), 1.0)
    x2, w2, b2 = t(4, 32, grad=True), t(10, 32, grad=True), t(10, grad=True)
    target = dp.Tensor.from_numpy(ctx, np.array([1, 2, 3, 4], np.int64))
    a, bm = t(16, 16), t(16, 16)
    return [
        ("relu", lambda: F.relu(x)),
        ("add", lambda: x + x),
        ("mul by number", lambda: x * 2.0),
        ("conv2d 3x3", lambda: F.conv2d(x, w, padding=1)),
        ("conv2d 1x1", lambda: F.conv2d(x, w1)),
        ("conv2d depthwise", lambda: F.conv2d(x, wd, padding=1, groups=8)),
        ("dp.gemm 16^3", lambda: dp.gemm(a, bm)),
        ("linear", lambda: F.linear(x2, w2, b2)),
        ("batch_norm eval", lambda: F.batch_norm(x, rm, rv, g, b, training=False)),
        ("batch_norm train", lambda: F.batch_norm(x, None, None, g, b, training=True)),
        ("max_pool2d", lambda: F.max_pool2d(x, 2)),
        ("adaptive_avg_pool2d", lambda: F.adaptive_avg_pool2d(x, 1)),
        ("softmax", lambda: F.softmax(x2, dim=1)),
        ("sum", lambda: F.sum(x)),
        ("cross_entropy", lambda: F.cross_entropy(x2, target)),
        ("flatten", lambda: F.flatten(x, 1)),
    ]


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 2, few repeats (a CPU)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    batch = args.batch or (2 if args.quick else 64)
    repeat = args.repeat or (5 if args.quick else 30)
    calls = 50 if args.quick else 2000
    ctx = dp.Context()
    th = Torch()
    rng = np.random.default_rng(0)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    print(f"device: {ctx.info.name}, driver {ctx.info.driver_version}; torch {th.torch.__version__} "
          f"on {th.device}; commit {commit or '?'}")
    record = {"device": ctx.info.name, "driver": ctx.info.driver_version,
              "platform": ctx.info.platform_name, "torch": th.torch.__version__,
              "torch_device": th.device, "commit": commit, "host": platform.node(),
              "batch": batch, "public": [], "host_us": [], "backward_us_per_node": None}
    print(f"\n{'public call':48s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} "
          f"{'span ms':>8s} {'error':>9s}")
    for name, ours, theirs, check in public_cases(ctx, th, rng, batch, 256 if args.quick else 1024):
        err = check()
        ok = err < 1e-5
        mine = wall_ms(ours, ctx.synchronize, repeat)
        torch_ms = wall_ms(theirs, th.sync, repeat)
        span = time_enqueued(ctx, ours, warmup=1, repeat=repeat).median * 1e3 if ctx.profiling else None
        print(f"{name:48s} {mine:9.3f} {torch_ms:9.3f} {torch_ms / mine:10.3f} "
              f"{span if span is not None else float('nan'):8.3f} {err:9.2e}{'' if ok else '  FAILED'}")
        record["public"].append(dict(name=name, ours_ms=mine, torch_ms=torch_ms,
                                     ratio=torch_ms / mine, device_span_ms=span, error=err,
                                     ok=ok))
    print(f"\n{'host time per repeated call (tiny tensors)':48s} {'us':>9s}")
    for name, call in host_cases(ctx, rng):
        us = host_us(call, ctx.synchronize, calls)
        print(f"{name:48s} {us:9.1f}")
        record["host_us"].append(dict(name=name, us=us))
    per_node = backward_per_node(ctx, rng, max(10, calls // 20))
    print(f"{'backward, per node':48s} {per_node:9.1f}")
    record["backward_us_per_node"] = per_node
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in record["public"]) else 1


if __name__ == "__main__":
    sys.exit(main())
