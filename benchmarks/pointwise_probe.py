"""Memory-bound kernels' variants side by side, with PyTorch in the same run.

    python benchmarks/pointwise_probe.py [--quick] [--only pointwise,dropout,ops] [--output DIR]

pointwise: the generator's scalar and vector variants (elements per access, groups per work item,
grid cap) on copy, relu, sigmoid, add and a bias broadcast over 2^26 float32; dropout: its scalar
and vector variants and blocks per work item; ops: pooling and normalization operators as
dlprim-bench's ops suite runs them, timed ten calls per span (the device's time) and one call per
span (what a lone call costs, host included), with each call's kernels and their device times.
Every variant's result is checked before it is timed: the first against float64, the others bit
for bit against the first (same arithmetic per element), on NaN-poisoned outputs.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlprim_py as dp  # noqa: E402
from dlprim_py import functional as F  # noqa: E402
from dlprim_py.activation import from_torch_name  # noqa: E402
from dlprim_py.ops import activation_ops, dropout as dropout_ops  # noqa: E402
from dlprim_py.ops.pointwise import PointwiseKernel  # noqa: E402
import ops as ops_bench  # noqa: E402

# (label, algorithm, vector, unroll, groups per unit)
POINTWISE_VARIANTS = [
    ("scalar u4 g64", "scalar", 1, 4, 64),
    ("vec4 u2 g64", "vector", 4, 2, 64),
    ("vec4 u1 g64", "vector", 4, 1, 64),
    ("vec4 u1 nogrid", "vector", 4, 1, None),
    ("vec4 u2 nogrid", "vector", 4, 2, None),
]
DROPOUT_VARIANTS = [("scalar u2", "scalar", 2, 64), ("vec4 u2", "vector", 2, 64),
                    ("vec4 u1", "vector", 1, 64), ("vec4 u2 g16", "vector", 2, 16),
                    ("vec4 u1 nogrid", "vector", 1, None)]


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def pointwise(ctx, baseline, quick, table):
    torch = baseline.torch
    n = ops_bench._n(quick)
    cols = 1024
    shape = (n // cols, cols)
    rng = np.random.default_rng(11)
    a, b, bias = (ops_bench._data(rng, s) for s in (shape, shape, (cols,)))
    x, y, bb = (dp.Tensor.from_numpy(ctx, v) for v in (a, b, bias))
    out = dp.Tensor.empty(ctx, shape)
    tx, ty, tb = baseline.tensor(a), baseline.tensor(b), baseline.tensor(bias)
    tout = torch.empty_like(tx)
    f32 = np.float32

    def act(name):
        k = activation_ops.forward_kernel(from_torch_name(name), False)
        return k.statement, [("x", f32)], k.scalars, [1.0, 0.0]

    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cases = [
        ("copy", ("y = x;", [("x", f32)], [], []), [x], 8 * n, lambda: tout.copy_(tx), a64),
        ("relu", act("relu"), [x], 8 * n, lambda: torch.relu(tx), np.maximum(a64, 0)),
        ("sigmoid", act("sigmoid"), [x], 8 * n, lambda: torch.sigmoid(tx), 1 / (1 + np.exp(-a64))),
        ("add", ("y = a + b;", [("a", f32), ("b", f32)], [], []), [x, y], 12 * n,
         lambda: torch.add(tx, ty), a64 + b64),
        ("mul bias", ("y = a * b;", [("a", f32), ("b", f32)], [], []), [x, bb], 8 * n + 4 * cols,
         lambda: torch.mul(tx, tb), a64 * bias.astype(np.float64)),
    ]
    for op, (statement, inputs, scalars, values), args, nbytes, theirs, ref in cases:
        torch_s = baseline.time(theirs)
        first = None
        for label, algorithm, vector, unroll, gpu in POINTWISE_VARIANTS:
            k = PointwiseKernel(f"probe_{op.replace(' ', '_')}", inputs, [("y", f32)], statement,
                                scalars=scalars)
            k.VECTOR = vector
            if algorithm == "scalar":
                k.UNROLL, k.GROUPS_PER_UNIT = unroll, gpu
            else:
                k.VECTOR_UNROLL, k.VECTOR_GROUPS_PER_UNIT = unroll, gpu
                k.VECTOR_UNROLL_ND, k.VECTOR_GROUPS_PER_UNIT_ND = unroll, gpu

            def run(k=k, algorithm=algorithm):
                k(args, [out], values, algorithm=algorithm)
            out.fill_(np.nan)
            run()
            got = out.numpy()
            if first is None:
                error = ops_bench.error_metric(got, ref)
                ok = error <= ops_bench.TOLERANCE
                first = got
            else:
                ok = same_bits(got, first)
                error = 0.0 if ok else math.inf
            ours_s = ops_bench.time_ours(ctx, run, quick) if ok else math.nan
            table.append({"part": "pointwise", "op": op, "variant": label, "ok": ok, "error": error,
                          "ours_ms": ours_s * 1e3, "torch_ms": torch_s * 1e3,
                          "ours_GBps": nbytes / ours_s / 1e9, "torch_GBps": nbytes / torch_s / 1e9,
                          "speedup": torch_s / ours_s})


def dropout(ctx, baseline, quick, table):
    torch = baseline.torch
    n = ops_bench._n(quick)
    rng = np.random.default_rng(12)
    a = ops_bench._data(rng, (n,))
    x = dp.Tensor.from_numpy(ctx, a)
    out = dp.Tensor.empty(ctx, (n,))
    tx = baseline.tensor(a)
    torch_s = baseline.time(lambda: torch.nn.functional.dropout(tx, 0.5, training=True))
    keep = dropout_ops.reference_mask(n, 0.5, 1)
    ref = np.where(keep, 2.0 * a.astype(np.float64), 0.0)
    saved = dropout_ops.GROUPS_PER_UNIT
    for label, algorithm, unroll, gpu in DROPOUT_VARIANTS:
        dropout_ops.GROUPS_PER_UNIT = gpu

        def run(algorithm=algorithm, unroll=unroll):
            dropout_ops._apply(ctx, x, out, 0.5, 1, 0, algorithm=algorithm, unroll=unroll)
        out.fill_(np.nan)
        run()
        error = ops_bench.error_metric(out.numpy(), ref)
        ok = error <= ops_bench.TOLERANCE
        ours_s = ops_bench.time_ours(ctx, run, quick) if ok else math.nan
        table.append({"part": "dropout", "op": "dropout p=0.5", "variant": label, "ok": ok,
                      "error": error, "ours_ms": ours_s * 1e3, "torch_ms": torch_s * 1e3,
                      "ours_GBps": 8 * n / ours_s / 1e9, "torch_GBps": 8 * n / torch_s / 1e9,
                      "speedup": torch_s / ours_s})
    dropout_ops.GROUPS_PER_UNIT = saved


class KernelLog:
    """Every kernel a call enqueues through ``Kernel.__call__``, with its device time."""

    def __init__(self):
        self.events = []

    def __enter__(self):
        self.original = cl.Kernel.__call__
        self.original_enqueue = cl.enqueue_nd_range_kernel
        log = self

        def call(kernel, *args, **kwargs):
            event = log.original(kernel, *args, **kwargs)
            log.events.append((kernel.function_name, args[1], args[2], event))
            return event

        def enqueue(queue, kernel, gsize, lsize, *args, **kwargs):
            event = log.original_enqueue(queue, kernel, gsize, lsize, *args, **kwargs)
            log.events.append((kernel.function_name, gsize, lsize, event))
            return event
        cl.Kernel.__call__ = call
        cl.enqueue_nd_range_kernel = enqueue
        return self

    def __exit__(self, *exc):
        cl.Kernel.__call__ = self.original
        cl.enqueue_nd_range_kernel = self.original_enqueue

    def summary(self):
        rows = []
        for name, gsize, lsize, event in self.events:
            event.wait()
            rows.append({"kernel": name, "global": list(gsize), "local": list(lsize) if lsize else None,
                         "ms": (event.profile.end - event.profile.start) * 1e-6})
        return rows


def operators(ctx, baseline, quick, table):
    torch = baseline.torch
    tf = torch.nn.functional
    n = 1 if quick else 64
    rng = np.random.default_rng(13)
    feature = (n, 32 if quick else 256, 56, 56)
    c = feature[1]
    cases = [
        ("max_pool2d 3x3 s2", [(n, 64, 112, 112)], lambda t: F.max_pool2d(t[0], 3, 2, 1),
         lambda t: tf.max_pool2d(t[0], 3, 2, 1)),
        ("avg_pool2d 2x2", [feature], lambda t: F.avg_pool2d(t[0], 2), lambda t: tf.avg_pool2d(t[0], 2)),
        ("avg_pool2d global 7x7", [(n, 2048, 7, 7)], lambda t: F.avg_pool2d(t[0], 7),
         lambda t: tf.avg_pool2d(t[0], 7)),
        ("adaptive_avg_pool2d 1x1", [(n, 2048, 7, 7)], lambda t: F.adaptive_avg_pool2d(t[0], 1),
         lambda t: tf.adaptive_avg_pool2d(t[0], 1)),
        ("batch_norm inference", [feature, (c,), (c,), (c,), (c,)],
         lambda t: F.batch_norm(t[0], t[1], t[2], t[3], t[4], training=False),
         lambda t: tf.batch_norm(t[0], t[1], t[2], t[3], t[4], training=False)),
        ("batch_norm training", [feature, (c,), (c,), (c,), (c,)],
         lambda t: F.batch_norm(t[0], t[1], t[2], t[3], t[4], training=True),
         lambda t: tf.batch_norm(t[0], t[1], t[2], t[3], t[4], training=True)),
        ("layer_norm 4096x768", [(64 * n, 768), (768,), (768,)],
         lambda t: F.layer_norm(t[0], (768,), t[1], t[2]), lambda t: tf.layer_norm(t[0], (768,), t[1], t[2])),
        ("group_norm 32", [feature, (c,), (c,)], lambda t: F.group_norm(t[0], 32, t[1], t[2]),
         lambda t: tf.group_norm(t[0], 32, t[1], t[2])),
        ("relu (functional)", [feature], lambda t: F.relu(t[0]), lambda t: torch.relu(t[0])),
    ]
    for name, shapes, ours, theirs in cases:
        try:
            table.append(operator_row(ctx, baseline, quick, rng, name, shapes, ours, theirs))
        except Exception as e:  # one broken operator must not hide the others' figures
            table.append({"part": "ops", "op": name, "variant": f"{type(e).__name__}: {e}", "ok": False})


def operator_row(ctx, baseline, quick, rng, name, shapes, ours, theirs):
    torch = baseline.torch
    hosts = [ops_bench._data(rng, s, 0.5, 1.5) for s in shapes]
    mine = [dp.Tensor.from_numpy(ctx, h) for h in hosts]
    tt = [baseline.tensor(h) for h in hosts]
    t64 = [baseline.tensor(h, torch.float64) for h in hosts]
    with dp.no_grad():
        error = ops_bench.error_metric(ours(mine).numpy(), theirs(t64).cpu().numpy())
    ok = error <= ops_bench.TOLERANCE
    ten = ops_bench.time_ours(ctx, lambda: ours(mine), quick) if ok else math.nan
    one = ops_bench.time_ours(ctx, lambda: ours(mine), quick, calls=1) if ok else math.nan
    torch_s = baseline.time(lambda: theirs(tt))
    with dp.no_grad(), KernelLog() as log:
        ours(mine)
    nbytes = sum(h.nbytes for h in hosts)
    return {"part": "ops", "op": name, "variant": "current", "ok": ok, "error": error,
              "ours_ms": ten * 1e3, "single_call_ms": one * 1e3, "torch_ms": torch_s * 1e3,
              "ours_GBps": nbytes / ten / 1e9, "torch_GBps": nbytes / torch_s / 1e9,
              "speedup": torch_s / ten, "speedup_single": torch_s / one,
              "kernels": log.summary()}


def host(ctx, baseline, quick, table):
    """Where a call's host time goes: seconds per call of the host loop alone (small tensors,
    so the device keeps up), from a functional call down to a bare enqueue of preset arguments;
    and ten 2^26-element relu calls per span with and without a flush after each call."""
    import time
    import pyopencl as cl
    rng = np.random.default_rng(14)
    small = dp.Tensor.from_numpy(ctx, ops_bench._data(rng, (64, 768)))
    w, b = (dp.Tensor.from_numpy(ctx, ops_bench._data(rng, (768,))) for _ in range(2))
    feat = dp.Tensor.from_numpy(ctx, ops_bench._data(rng, (2, 32, 8, 8)))
    c = [dp.Tensor.from_numpy(ctx, ops_bench._data(rng, (32,), 0.5, 1.5)) for _ in range(4)]
    out = dp.Tensor.empty(ctx, small.shape)
    relu_kernel = activation_ops.forward_kernel(from_torch_name("relu"), False)
    relu_kernel([small], [out], [1.0, 0.0])
    (bound, gsize, lsize, head, operand_args, tail), = [
        p for p in relu_kernel._built[ctx].values() if isinstance(p, tuple)][:1]
    raw = bound.kernel
    raw_args = head + [small.buffer] + operand_args[0] + [out.buffer] + operand_args[1] + \
        [np.float32(1.0), np.float32(0.0)] + tail
    raw.set_args(*raw_args)
    calls = {
        "F.relu": lambda: F.relu(small),
        "PointwiseKernel call": lambda: relu_kernel([small], [out], [1.0, 0.0]),
        "BoundKernel, no change": lambda: bound(ctx.queue, gsize, lsize, *raw_args),
        "pyopencl kernel(...)": lambda: raw(ctx.queue, gsize, lsize, *raw_args),
        "enqueue_nd_range_kernel": lambda: cl.enqueue_nd_range_kernel(ctx.queue, raw, gsize, lsize),
        "Tensor.empty": lambda: dp.Tensor.empty(ctx, small.shape),
        "F.add": lambda: F.add(small, small),
        "F.layer_norm": lambda: F.layer_norm(small, (768,), w, b),
        "F.max_pool2d": lambda: F.max_pool2d(feat, 3, 2, 1),
        "F.avg_pool2d global": lambda: F.avg_pool2d(feat, 8),
        "F.batch_norm inference": lambda: F.batch_norm(feat, *c, training=False),
        "F.batch_norm training": lambda: F.batch_norm(feat, *c, training=True),
        "F.dropout": lambda: F.dropout(small, 0.5, seed=1),
    }
    with dp.no_grad():
        for name, call in calls.items():
            best = math.inf
            for _ in range(5):
                ctx.queue.finish()
                t0 = time.perf_counter()
                for _ in range(50):
                    call()
                best = min(best, (time.perf_counter() - t0) / 50)
            ctx.queue.finish()
            table.append({"part": "host", "op": name, "variant": "host per call", "ok": True,
                          "ours_ms": best * 1e3, "torch_ms": math.nan, "ours_GBps": 0.0,
                          "torch_GBps": 0.0, "speedup": math.nan})
    n = ops_bench._n(quick)
    big = dp.Tensor.from_numpy(ctx, ops_bench._data(rng, (n,)))
    for flush in (False, True):
        def run(flush=flush):
            F.relu(big)
            if flush:
                ctx.queue.flush()
        ours_s = ops_bench.time_ours(ctx, run, quick)
        table.append({"part": "host", "op": "F.relu 2^26" + (" + flush" if flush else ""),
                      "variant": "10 per span", "ok": True, "ours_ms": ours_s * 1e3,
                      "torch_ms": math.nan, "ours_GBps": 8 * n / ours_s / 1e9, "torch_GBps": 0.0,
                      "speedup": math.nan})


def format_row(r, copy_rate):
    if not r.get("ok"):
        return f"{r['op']:<24} {r['variant']:<16} FAILED (error {r.get('error')})"
    return (f"{r['op']:<24} {r['variant']:<16} {r['ours_ms']:8.4f} {r.get('single_call_ms', math.nan):8.4f} "
            f"{r['torch_ms']:8.4f} {100 * r['ours_GBps'] / copy_rate:6.1f} {r['speedup']:7.2f}")


class Table(list):
    """The rows, each printed as it comes (a run cut short by its time limit keeps them)."""

    def __init__(self, copy_rate):
        super().__init__()
        self.copy_rate = copy_rate
        print(f"{'op':<24} {'variant':<16} {'ours ms':>8} {'1call ms':>8} {'torch ms':>8} "
              f"{'% copy':>6} {'x torch':>7}")

    def append(self, row):
        super().append(row)
        print(format_row(row, self.copy_rate), flush=True)


PARTS = {"pointwise": pointwise, "dropout": dropout, "ops": operators, "host": host}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--output", default=None, help="folder for probe.json")
    parser.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}, driver {ctx.info.driver_version})")
    baseline = ops_bench.Baseline(ctx, args.quick)
    copy_rows = ops_bench.copy(ctx, baseline, args.quick)
    copy_rate = max(r["ours_GBps"] for r in copy_rows if r["ok"])
    for r in copy_rows:
        print(f"{r['op']:<28} ours {r['ours_GBps']:7.0f} GB/s  torch {r['torch_GBps']:7.0f} GB/s")
    table = Table(copy_rate)
    for part in args.only.split(","):
        try:
            PARTS[part](ctx, baseline, args.quick, table)
        except Exception as e:  # one broken part must not hide the others' figures
            table.append({"part": part, "op": f"{part} FAILED", "variant": f"{type(e).__name__}: {e}",
                          "ok": False})
    for r in table:
        if r.get("kernels"):
            print(f"  {r['op']}: " + ", ".join(f"{k['kernel']} {k['ms']:.4f}" for k in r["kernels"]))
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        with open(os.path.join(args.output, "probe.json"), "w") as f:
            json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version, "commit": args.commit,
                       "copy": copy_rows, "copy_GBps": copy_rate, "rows": table}, f, indent=1, default=float)


if __name__ == "__main__":
    main()
