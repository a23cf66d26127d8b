"""Memory-bound operators: dlprim_py against PyTorch on the same machine, in the same run.

    python benchmarks/ops.py [--quick] [--suites copy,pointwise,reductions,softmax,bn,half]
                             [--output benchmarks/results/ops-X.json]

Each suite is a function ``suite(ctx, baseline, quick) -> list of rows``; a row holds the
operator, its shape, the bytes it must move at least (each input read once, each output written
once, unless the row says otherwise), our median time, PyTorch's median time, the error metric of
our result and whether it passed. Every result is checked before it is timed: against PyTorch in
float64 on the baseline device (MIOpen's metric, 1e-5), or exactly for indices.

Full size: every large tensor is 2^26 float32 = 256 MiB, so caches do not hold it. ``--quick``
shrinks everything to a few hundred KiB for a smoke run on a CPU device (PoCL) with PyTorch CPU
as the baseline.

Timing. Ours: OpenCL profiling markers around ``REPEAT_IN_SPAN`` back-to-back calls (so Python's
enqueue time overlaps the device's work), median of the spans divided by that count. PyTorch:
CUDA events the same way on a CUDA device, else the host clock. On both sides one untimed call
runs right before each span, so that the device is busy while the host reaches the span's first
call: without it a span also held the host's latency to its first launch, longer for Python
than for PyTorch's C++ (relu at 256 MiB on an H200: 2.6 us per call of the span for ours, 1.2 us
for PyTorch's). Baseline device: CUDA when the OpenCL device is NVIDIA's and torch sees CUDA,
else the CPU. The copy suite measures the device's copy bandwidth (clEnqueueCopyBuffer and a
generated copy kernel) as the ceiling for the others.

The half suite (``--suites half``) times float16 and bfloat16 storage (computed in float32
inside) against PyTorch on the same 16-bit dtype: activations, a broadcast add, a row sum,
softmax, layer_norm and rms_norm, softmax and layer_norm forward and backward, and training
batch_norm forward and backward, each checked against float64 of the 16-bit inputs with the
16-bit types' tolerance (HALF_TOLERANCE) first.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import functional as F  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import measured_commit  # noqa: E402
from dlprim_py.ops.pointwise import PointwiseKernel  # noqa: E402
from dlprim_py.ops.dropout import reference_mask  # noqa: E402
from dlprim_py.ops.softmax import softmax_backward  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

TOLERANCE = 1e-5
# The error metric's bound for 16-bit results: one rounding to 11 or 8 significant bits.
HALF_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2}
REPEAT_IN_SPAN = 10
LARGE = 1 << 26          # elements: 256 MiB of float32
QUICK = 1 << 16


# ---- baseline and measurement --------------------------------------------------------------

def cuda_span(torch, run, calls, primed, repeat):
    """Median seconds per call of ``calls`` calls of ``run()`` between two CUDA events, over
    ``repeat`` spans; ``primed``: one untimed call right before each span's first event, so
    that the device is busy while the span's first call launches."""
    samples = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        if primed:
            run()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) * 1e-3 / calls)
    return float(np.median(samples))


class Baseline:
    """PyTorch on the device that matches ``ctx``: timing and the float64 reference."""

    def __init__(self, ctx, quick):
        import torch
        self.torch = torch
        self.device = "cuda" if ctx.info.vendor == "nvidia" and torch.cuda.is_available() else "cpu"
        if self.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.quick = quick

    def tensor(self, array, dtype=None):
        t = self.torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
        return t if dtype is None else t.to(dtype)

    def time(self, run):
        """Median seconds of one ``run()`` (REPEAT_IN_SPAN calls per timed span)."""
        torch = self.torch
        repeat = 3 if self.quick else 15
        with torch.no_grad():
            for _ in range(2):
                run()
            if self.device == "cuda":
                return cuda_span(torch, run, REPEAT_IN_SPAN, True, repeat)
            samples = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(REPEAT_IN_SPAN):
                    run()
                samples.append((time.perf_counter() - t0) / REPEAT_IN_SPAN)
        return float(np.median(samples))

    def describe(self):
        info = {"torch": self.torch.__version__, "device": self.device}
        if self.device == "cuda":
            info["cuda_device"] = self.torch.cuda.get_device_name(0)
        return info


def time_ours(ctx, run, quick, calls=REPEAT_IN_SPAN):
    """Median seconds of one ``run()`` on ctx.queue (``calls`` calls per marker span; with more
    than one, one untimed call before each span, as Baseline.time does)."""
    def span():
        for _ in range(calls):
            run()
    with dp.no_grad():
        timing = time_enqueued(ctx, span, warmup=1 if quick else 2, repeat=3 if quick else 15,
                               prime=run if calls > 1 else None)
    return timing.median / calls


def row(ctx, baseline, op, shape, nbytes, ours, theirs, check, quick, note="", tolerance=TOLERANCE):
    """Check ``ours`` first (``check()`` -> error, at most ``tolerance``), then time both; one
    result row. A result of the wrong shape is a failed check, not the end of the suite."""
    try:
        error = check()
    except dp.DlprimError as e:
        error, note = math.inf, f"{note} {e}".strip()
    ok = error <= tolerance
    ours_s = time_ours(ctx, ours, quick) if ok else math.nan
    theirs_s = baseline.time(theirs) if theirs is not None else math.nan
    return {
        "op": op, "shape": list(shape), "bytes": int(nbytes), "ours_ms": ours_s * 1e3,
        "torch_ms": theirs_s * 1e3, "ours_GBps": nbytes / ours_s / 1e9 if ok else math.nan,
        "torch_GBps": nbytes / theirs_s / 1e9, "speedup_vs_torch": theirs_s / ours_s if ok else math.nan,
        "error": error, "ok": ok, "note": note,
    }


def _data(rng, shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, size=shape).astype(np.float32)


def _n(quick):
    return QUICK if quick else LARGE


# ---- suites --------------------------------------------------------------------------------

def copy(ctx, baseline, quick=False):
    """Device copy bandwidth: clEnqueueCopyBuffer and a generated copy kernel (read + write)."""
    n = _n(quick)
    a = _data(np.random.default_rng(0), (n,))
    x = dp.Tensor.from_numpy(ctx, a)
    y = dp.Tensor.empty(ctx, (n,))
    kernel = PointwiseKernel("bench_copy", [("x", np.float32)], [("y", np.float32)], "y = x;")
    tx, ty = baseline.tensor(a), baseline.tensor(a)

    def check(run):
        def inner():
            y.fill_(np.nan)
            run()
            return error_metric(y.numpy(), a)
        return inner

    return [
        row(ctx, baseline, "copy (enqueue_copy)", (n,), 8 * n, lambda: y.copy_(x),
            lambda: ty.copy_(tx), check(lambda: y.copy_(x)), quick),
        row(ctx, baseline, "copy (pointwise kernel)", (n,), 8 * n, lambda: kernel([x], [y]),
            lambda: ty.copy_(tx), check(lambda: kernel([x], [y])), quick),
    ]


def pointwise(ctx, baseline, quick=False):
    """Activations, broadcasting arithmetic and dropout on 2^26 elements."""
    torch = baseline.torch
    tf = torch.nn.functional
    n = _n(quick)
    cols = 1024
    shape = (n // cols, cols)
    rng = np.random.default_rng(1)
    a, b, bias = _data(rng, shape), _data(rng, shape), _data(rng, (cols,))
    x, y, bb = (dp.Tensor.from_numpy(ctx, v) for v in (a, b, bias))
    tx, ty, tb = baseline.tensor(a), baseline.tensor(b), baseline.tensor(bias)
    dx, dy, db = (baseline.tensor(v, torch.float64) for v in (a, b, bias))
    rows = []
    unary = [("relu", F.relu, tf.relu), ("gelu", F.gelu, tf.gelu), ("silu", F.silu, tf.silu),
             ("sigmoid", F.sigmoid, torch.sigmoid), ("hardswish", F.hardswish, tf.hardswish)]
    for name, ours, theirs in unary:
        rows.append(row(ctx, baseline, name, shape, 8 * n, lambda o=ours: o(x), lambda t=theirs: t(tx),
                        lambda o=ours, t=theirs: error_metric(o(x).numpy(), t(dx).cpu().numpy()), quick))
    binary = [("add", F.add, torch.add, (x, y), (tx, ty), (dx, dy), 12 * n),
              ("mul bias broadcast", F.mul, torch.mul, (x, bb), (tx, tb), (dx, db), 8 * n + 4 * cols),
              ("maximum", F.maximum, torch.maximum, (x, y), (tx, ty), (dx, dy), 12 * n)]
    for name, ours, theirs, args, targs, dargs, nbytes in binary:
        rows.append(row(ctx, baseline, name, shape, nbytes, lambda o=ours, v=args: o(*v),
                        lambda t=theirs, v=targs: t(*v),
                        lambda o=ours, t=theirs, v=args, d=dargs: error_metric(o(*v).numpy(), t(*d).cpu().numpy()),
                        quick))

    def dropout_check():
        keep = reference_mask(a.size, 0.5, 1).reshape(shape)
        return error_metric(F.dropout(x, 0.5, seed=1).numpy(), np.where(keep, 2.0 * a.astype(np.float64), 0.0))
    rows.append(row(ctx, baseline, "dropout p=0.5", shape, 8 * n, lambda: F.dropout(x, 0.5, seed=1),
                    lambda: tf.dropout(tx, 0.5, training=True), dropout_check, quick,
                    note="torch also writes its mask; its figure counts the same 8 bytes/element"))
    return rows


def reductions(ctx, baseline, quick=False):
    """sum, mean, amax, argmax and norm: over everything, along rows, along columns."""
    torch = baseline.torch
    n = _n(quick)
    rng = np.random.default_rng(2)
    wide = (n // 4096, 4096)
    a = _data(rng, wide)
    x = dp.Tensor.from_numpy(ctx, a)
    tx, dx = baseline.tensor(a), baseline.tensor(a, torch.float64)
    cases = [
        ("sum all", lambda: F.sum(x), lambda t: torch.sum(t), 4 * n),
        ("mean all", lambda: F.mean(x), lambda t: torch.mean(t), 4 * n),
        ("norm all", lambda: F.norm(x), lambda t: torch.linalg.vector_norm(t), 4 * n),
        ("sum rows (dim=-1)", lambda: F.sum(x, -1), lambda t: torch.sum(t, -1), 4 * n + 4 * wide[0]),
        ("amax rows (dim=-1)", lambda: F.amax(x, -1), lambda t: torch.amax(t, -1), 4 * n + 4 * wide[0]),
        ("sum columns (dim=0)", lambda: F.sum(x, 0), lambda t: torch.sum(t, 0), 4 * n + 4 * wide[1]),
    ]
    rows = []
    for name, ours, theirs, nbytes in cases:
        rows.append(row(ctx, baseline, name, wide, nbytes, ours, lambda t=theirs: t(tx),
                        lambda o=ours, t=theirs: error_metric(o().numpy(), t(dx).cpu().numpy()), quick))

    def argmax_check():
        mismatch = np.count_nonzero(F.argmax(x, -1).numpy() != torch.argmax(tx, -1).cpu().numpy())
        return 0.0 if mismatch == 0 else math.inf
    rows.append(row(ctx, baseline, "argmax rows (dim=-1)", wide, 4 * n + 8 * wide[0],
                    lambda: F.argmax(x, -1), lambda: torch.argmax(tx, -1), argmax_check, quick))
    return rows


def softmax(ctx, baseline, quick=False):
    """softmax / log_softmax over (batch, 32000) rows, forward and backward; cross_entropy."""
    torch = baseline.torch
    vocab = 3200 if quick else 32000
    batch = max(1, _n(quick) // vocab)
    shape = (batch, vocab)
    rng = np.random.default_rng(3)
    a, g = _data(rng, shape, -8, 8), _data(rng, shape)
    x, gx = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, g)
    tx, tg = baseline.tensor(a), baseline.tensor(g)
    dx = baseline.tensor(a, torch.float64)
    nbytes = 8 * a.size
    rows = [
        row(ctx, baseline, "softmax rows", shape, nbytes, lambda: F.softmax(x, -1),
            lambda: torch.softmax(tx, -1),
            lambda: error_metric(F.softmax(x, -1).numpy(), torch.softmax(dx, -1).cpu().numpy()), quick),
        row(ctx, baseline, "log_softmax rows", shape, nbytes, lambda: F.log_softmax(x, -1),
            lambda: torch.log_softmax(tx, -1),
            lambda: error_metric(F.log_softmax(x, -1).numpy(), torch.log_softmax(dx, -1).cpu().numpy()), quick),
    ]
    with dp.no_grad():
        y = F.softmax(x, -1)
    ty = torch.softmax(tx, -1)
    dy64 = torch.softmax(dx, -1)
    ref_grad = (dy64 * (baseline.tensor(g, torch.float64) - (baseline.tensor(g, torch.float64) * dy64).sum(-1, keepdim=True))).cpu().numpy()
    rows.append(row(ctx, baseline, "softmax backward", shape, 12 * a.size,
                    lambda: softmax_backward(y, gx, -1),
                    lambda: torch._softmax_backward_data(tg, ty, -1, torch.float32),
                    lambda: error_metric(softmax_backward(y, gx, -1).numpy(), ref_grad), quick))
    target = rng.integers(0, vocab, size=batch).astype(np.int64)
    t_ours, t_torch = dp.Tensor.from_numpy(ctx, target), baseline.tensor(target)
    rows.append(row(ctx, baseline, "cross_entropy", shape, 4 * a.size + 8 * batch,
                    lambda: F.cross_entropy(x, t_ours), lambda: torch.nn.functional.cross_entropy(tx, t_torch),
                    lambda: error_metric(F.cross_entropy(x, t_ours).numpy(),
                                         torch.nn.functional.cross_entropy(dx, t_torch).cpu().numpy()), quick,
                    note="bytes: one read of the logits; both sides write log-probabilities too; "
                         "ours waits for the target-range check's read-back each call"))
    return rows


def bn(ctx, baseline, quick=False):
    """batch_norm training: forward with the running-stat update, then backward to input,
    weight and bias, as one step. Bytes: forward reads x twice (statistics, normalize) and
    writes y; backward reads x and dy twice (sums, then dx) and writes dx: 8 tensor passes."""
    torch = baseline.torch
    shape = (4, 16, 32, 32) if quick else (64, 256, 64, 64)
    c = shape[1]
    rng = np.random.default_rng(4)
    a, g = _data(rng, shape), _data(rng, shape)
    w, b = _data(rng, (c,), 0.5, 1.5), _data(rng, (c,))
    x = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    gx = dp.Tensor.from_numpy(ctx, g)
    weight = dp.Tensor.from_numpy(ctx, w, requires_grad=True)
    bias = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    rm, rv = dp.Tensor.zeros(ctx, (c,)), dp.Tensor.full(ctx, (c,), 1.0)

    def ours():
        with dp.enable_grad():
            x.grad = weight.grad = bias.grad = None
            out = F.batch_norm(x, rm, rv, weight, bias, training=True, momentum=0.1, eps=1e-5)
            out.backward(gx)
        return out

    tx = baseline.tensor(a).requires_grad_(True)
    tw, tb = baseline.tensor(w).requires_grad_(True), baseline.tensor(b).requires_grad_(True)
    tg = baseline.tensor(g)
    trm, trv = baseline.tensor(np.zeros(c, np.float32)), baseline.tensor(np.ones(c, np.float32))

    def theirs():
        # Fresh gradients each step, as ours: accumulating would add a pass over dx.
        tx.grad = tw.grad = tb.grad = None
        with torch.enable_grad():
            out = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.1, eps=1e-5)
            out.backward(tg)

    def check():
        out = ours()
        dx64 = baseline.tensor(a, torch.float64).requires_grad_(True)
        dw64 = baseline.tensor(w, torch.float64).requires_grad_(True)
        db64 = baseline.tensor(b, torch.float64).requires_grad_(True)
        ref = torch.nn.functional.batch_norm(dx64, None, None, dw64, db64, training=True, eps=1e-5)
        ref.backward(baseline.tensor(g, torch.float64))
        return max(error_metric(out.numpy(), ref.detach().cpu().numpy()),
                   error_metric(x.grad.numpy(), dx64.grad.cpu().numpy()),
                   error_metric(weight.grad.numpy(), dw64.grad.cpu().numpy()),
                   error_metric(bias.grad.numpy(), db64.grad.cpu().numpy()))

    def ours_timed():
        ours()

    n = math.prod(shape)
    result = row(ctx, baseline, "batch_norm training fwd+bwd", shape, 8 * 4 * n, ours_timed, theirs,
                 check, quick)
    return [result]


def half(ctx, baseline, quick=False):
    """float16 and bfloat16 storage against PyTorch on the same dtype (2 bytes per element):
    gelu, silu, a broadcast add, a row sum, softmax rows, layer_norm and rms_norm; softmax and
    layer_norm (no affine) forward and backward (bytes: x and y, then y or x, dy and dx); and
    batch_norm training forward and backward on (N, 64, 32, 32) (8 passes, as ``bn``; 8 x 8
    planes with ``quick``)."""
    torch = baseline.torch
    tf = torch.nn.functional
    n = _n(quick)
    cols = 1024
    shape = (n // cols, cols)
    rng = np.random.default_rng(5)
    a, bias = _data(rng, shape), _data(rng, (cols,))
    w = _data(rng, (cols,), 0.5, 1.5)
    rows = []
    for dtype, torch_dtype in ((dp.float16, torch.float16), (dp.bfloat16, torch.bfloat16)):
        tag = dp.dtypes.name(dtype)
        x, bb, ww = (dp.Tensor.from_numpy(ctx, v, dtype=dtype) for v in (a, bias, w))
        # The 16-bit values themselves, for PyTorch and for the float64 reference.
        tx, tb, tw = (baseline.tensor(t.numpy(), torch_dtype) for t in (x, bb, ww))
        dx, db, dw = (baseline.tensor(t.numpy(), torch.float64) for t in (x, bb, ww))
        cases = [
            ("gelu", lambda: F.gelu(x), lambda: tf.gelu(tx), lambda: tf.gelu(dx), 4 * n),
            ("silu", lambda: F.silu(x), lambda: tf.silu(tx), lambda: tf.silu(dx), 4 * n),
            ("add bias broadcast", lambda: F.add(x, bb), lambda: tx + tb, lambda: dx + db,
             4 * n + 2 * cols),
            ("sum rows (dim=-1)", lambda: F.sum(x, -1), lambda: torch.sum(tx, -1),
             lambda: torch.sum(dx, -1), 2 * n + 2 * shape[0]),
            ("softmax rows", lambda: F.softmax(x, -1), lambda: torch.softmax(tx, -1),
             lambda: torch.softmax(dx, -1), 4 * n),
            ("layer_norm", lambda: F.layer_norm(x, (cols,), ww, bb),
             lambda: tf.layer_norm(tx, (cols,), tw, tb),
             lambda: tf.layer_norm(dx, (cols,), dw, db), 4 * n),
            ("rms_norm", lambda: F.rms_norm(x, (cols,), ww), lambda: tf.rms_norm(tx, (cols,), tw),
             lambda: tf.rms_norm(dx, (cols,), dw), 4 * n),
        ]
        for name, ours, theirs, reference, nbytes in cases:
            rows.append(row(ctx, baseline, f"{name} {tag}", shape, nbytes, ours, theirs,
                            lambda o=ours, r=reference: error_metric(o().numpy(), r().cpu().numpy()),
                            quick, tolerance=HALF_TOLERANCE[tag]))
        rows += _half_backward(ctx, baseline, quick, dtype, torch_dtype, tag, shape, a,
                               _data(rng, shape, -1.0, 1.0))
    return rows


def _half_backward(ctx, baseline, quick, dtype, torch_dtype, tag, shape, a, g):
    """The half suite's forward-and-backward rows: softmax and layer_norm over rows of
    ``shape``, and training batch_norm on (N, 64, 32, 32) of the same data; each call makes
    fresh gradients (as ``bn``), the check compares the output and the input's gradient."""
    torch = baseline.torch
    tf = torch.nn.functional
    n = int(np.prod(shape))
    channels = 64
    side = 32 if n >= 2 * channels * 32 * 32 else 8       # 8 x 8 planes for --quick
    bn_shape = (n // (channels * side * side), channels, side, side)
    bn_n = int(np.prod(bn_shape))
    rows = []
    cases = [
        ("softmax rows fwd+bwd", shape, lambda t: F.softmax(t, -1),
         lambda t: torch.softmax(t, -1), 10 * n),
        ("layer_norm fwd+bwd", shape, lambda t: F.layer_norm(t, (shape[-1],)),
         lambda t: tf.layer_norm(t, (shape[-1],)), 10 * n),
        ("batch_norm train fwd+bwd", bn_shape,
         lambda t: F.batch_norm(t, None, None, training=True),
         lambda t: tf.batch_norm(t, None, None, training=True), 16 * bn_n),
    ]
    for name, case_shape, ours_fn, theirs_fn, nbytes in cases:
        count = int(np.prod(case_shape))
        x = dp.Tensor.from_numpy(ctx, a.reshape(-1)[:count].reshape(case_shape), dtype=dtype,
                                 requires_grad=True)
        gx = dp.Tensor.from_numpy(ctx, g.reshape(-1)[:count].reshape(case_shape), dtype=dtype)
        tx = baseline.tensor(x.numpy(), torch_dtype).requires_grad_(True)
        tg = baseline.tensor(gx.numpy(), torch_dtype)

        def ours(x=x, gx=gx, fn=ours_fn):
            with dp.enable_grad():
                x.grad = None
                out = fn(x)
                out.backward(gx)
            return out

        def theirs(tx=tx, tg=tg, fn=theirs_fn):
            tx.grad = None
            with torch.enable_grad():
                fn(tx).backward(tg)

        def check(x=x, gx=gx, ours=ours, fn=theirs_fn):
            out = ours()
            x64 = baseline.tensor(x.numpy(), torch.float64).requires_grad_(True)
            ref = fn(x64)
            ref.backward(baseline.tensor(gx.numpy(), torch.float64))
            return max(error_metric(out.numpy(), ref.detach().cpu().numpy()),
                       error_metric(x.grad.numpy(), x64.grad.cpu().numpy()))

        rows.append(row(ctx, baseline, f"{name} {tag}", case_shape, nbytes, ours, theirs, check,
                        quick, tolerance=HALF_TOLERANCE[tag]))
    return rows


SUITES = {"copy": copy, "pointwise": pointwise, "reductions": reductions, "softmax": softmax, "bn": bn,
          "half": half}


def run(ctx, suites=tuple(SUITES), quick=False, log=print):
    """All rows of the chosen suites; a suite that fails to run becomes an error row."""
    baseline = Baseline(ctx, quick)
    rows = []
    for name in suites:
        try:
            got = SUITES[name](ctx, baseline, quick)
        except Exception as e:  # a broken operator must not hide the other suites' figures
            got = [{"op": f"{name} suite", "ok": False, "error": math.inf, "note": f"{type(e).__name__}: {e}"}]
        for r in got:
            r["suite"] = name
            log(format_row(r))
        rows += got
    copy_rate = max((r["ours_GBps"] for r in rows if r.get("suite") == "copy" and r.get("ok")), default=None)
    if copy_rate:
        for r in rows:
            if r.get("ok"):
                r["copy_percent"] = 100.0 * r["ours_GBps"] / copy_rate
    return rows, baseline


def format_row(r):
    if "ours_ms" not in r:
        return f"{r['op']:<30} FAILED {r.get('note', '')}"
    status = "ok" if r["ok"] else f"WRONG (error {r['error']:.2e})"
    return (f"{r['op']:<30} {str(tuple(r['shape'])):<20} ours {r['ours_ms']:9.4f} ms "
            f"{r['ours_GBps']:8.1f} GB/s | torch {r['torch_ms']:9.4f} ms {r['torch_GBps']:8.1f} GB/s | "
            f"x{r['speedup_vs_torch']:.2f} {status}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run on a CPU device")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated of {','.join(SUITES)}")
    parser.add_argument("--device", default=None, help="OpenCL device (P:D or a piece of its name)")
    parser.add_argument("--output", default=None, help="write the rows and the machine facts as JSON")
    parser.add_argument("--commit", default=None, help="the commit measured, for a copy without git history")
    args = parser.parse_args(argv)
    suites = [s for s in args.suites.split(",") if s]
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suites {unknown}; known: {list(SUITES)}")
    ctx = dp.Context(args.device)
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}, driver {ctx.info.driver_version})")
    rows, baseline = run(ctx, suites, args.quick)
    copy_rate = max((r["ours_GBps"] for r in rows if r.get("suite") == "copy" and r.get("ok")), default=None)
    if copy_rate:
        print(f"\nmeasured copy bandwidth: {copy_rate:.1f} GB/s; % of it per operator:")
        for r in rows:
            if "copy_percent" in r and r["suite"] != "copy":
                print(f"  {r['op']:<30} {r['copy_percent']:6.1f} %   x{r['speedup_vs_torch']:.2f} vs torch")
    if args.output:
        facts = {"device": ctx.info.name, "platform": ctx.info.platform_name,
                 "driver": ctx.info.driver_version, "host": platform.node(), "quick": args.quick,
                 "baseline": baseline.describe(), "rows": rows}
        facts["commit"] = measured_commit(args.commit)
        with open(args.output, "w") as f:
            json.dump(facts, f, indent=1, default=float)
    failed = [r["op"] for r in rows if not r.get("ok")]
    if failed:
        print(f"\nFAILED checks: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
