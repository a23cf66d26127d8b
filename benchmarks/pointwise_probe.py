"""Memory-bound kernels' variants side by side, with PyTorch in the same run.

    python benchmarks/pointwise_probe.py [--quick]
        [--only span,build,pointwise,softmax,memflags,dropout,ops,host] [--output DIR] [--commit HASH]

span: copy, relu and hardswish at 64 MiB, 256 MiB and 1 GiB, each timed six ways on both sides
(markers or CUDA events around ten calls, the same after a priming call, one call, the host clock
around many calls with and without a profiling queue, the kernels' own times and the gaps between
them), to tell a fixed cost per call from bandwidth; build: NVIDIA's register report and the PTX
of the default kernels (files under DIR/ptx); pointwise: the generator's launch variants (access
width, accesses per work item and where they lie, work-group size, grid cap, index width) on copy,
relu, hardswish, gelu, add and a bias broadcast over 2^26 float32; softmax: the softmax kernels'
reductions (local tree or warp shuffles), cache hints, launch caps and what the backward holds in
registers, over rows of 32000 (NVIDIA); memflags: relu and a buffer copy on buffers created
with other flags (HOST_NO_ACCESS, READ_ONLY / WRITE_ONLY); dropout: its variants; ops: pooling and normalization operators as dlprim-bench's ops suite runs them, ten calls per span
and one call per span, with each call's kernels and their device times; host: a call's host time.
Every variant's result is checked before it is timed: the first against float64, the others bit
for bit against the first (same arithmetic per element), on NaN-poisoned outputs.
"""
import argparse
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlprim_py as dp  # noqa: E402
from dlprim_py import functional as F  # noqa: E402
from dlprim_py.activation import from_torch_name  # noqa: E402
from dlprim_py.ops import activation_ops, dropout as dropout_ops  # noqa: E402
from dlprim_py.ops.pointwise import Launch, PointwiseKernel  # noqa: E402
import ops as ops_bench  # noqa: E402

# (label, algorithm, vector, accesses per item, groups per unit or None for no grid-stride loop,
# work-group size, interleave, index type or None for the narrowest that fits). The first is the
# default of the code under test; it is timed again last, as a measure of the run's spread.
POINTWISE_VARIANTS = [
    ("v4 u2 blk g128", "vector", 4, 2, None, 128, "block", None),
    ("v4 u1 g256", "vector", 4, 1, None, 256, "grid", None),
    ("v4 u1 g128", "vector", 4, 1, None, 128, "grid", None),
    ("v4 u1 g512", "vector", 4, 1, None, 512, "grid", None),
    ("v4 u1 g1024", "vector", 4, 1, None, 1024, "grid", None),
    ("v4 u1 g256 long", "vector", 4, 1, None, 256, "grid", "long"),
    ("v4 u2 blk g256", "vector", 4, 2, None, 256, "block", None),
    ("v4 u4 blk g128", "vector", 4, 4, None, 128, "block", None),
    ("v4 u2 grid g256", "vector", 4, 2, None, 256, "grid", None),
    ("v8 u1 g128", "vector", 8, 1, None, 128, "grid", None),
    ("v8 u1 g256", "vector", 8, 1, None, 256, "grid", None),
    ("v4 u2 blk cap16", "vector", 4, 2, 16, 256, "block", None),
    ("v4 u4 grid cap64", "vector", 4, 4, 64, 256, "grid", None),
    ("v4 u2 grid cap64", "vector", 4, 2, 64, 256, "grid", None),
    ("scalar u4 g64", "scalar", 1, 4, 64, 256, "grid", None),
]
# (label, algorithm, blocks per work item, groups per unit or None)
DROPOUT_VARIANTS = [("scalar u2", "scalar", 2, 64), ("vec4 u2", "vector", 2, 64),
                    ("vec4 u1", "vector", 1, 64), ("vec4 u2 g16", "vector", 2, 16),
                    ("vec4 u1 nogrid", "vector", 1, None)]
# --ops and --variants: the operators and variant labels to run (empty: all).
SELECTED_OPS, SELECTED_VARIANTS = [], []
# --sizes: element counts for the pointwise part (multiples of 1024; empty: 2^26).
SIZES = []
LARGE = ops_bench.LARGE
# Variants timed on the two-dimensional bias broadcast (the others run one dimension).
ND_VARIANTS = ("v4 u2 blk g128", "v4 u1 g256", "v4 u2 blk g256", "v4 u2 grid g256",
               "v4 u2 grid cap64", "v4 u4 blk g128", "v8 u1 g256", "v4 u4 grid cap64")


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def configured(name, inputs, statement, scalars, variant):
    """A PointwiseKernel whose launch is the ``variant`` row of POINTWISE_VARIANTS."""
    label, algorithm, vector, unroll, per_unit, group, interleave, index_t = variant
    k = PointwiseKernel(name, inputs, [("y", np.float32)], statement, scalars=scalars)
    k.VECTOR, k.INDEX_T = vector, index_t
    launch = Launch(unroll, interleave, group, per_unit)
    if algorithm == "scalar":
        k.SCALAR_LAUNCH = launch
    else:
        k.VECTOR_LAUNCH = k.VECTOR_LAUNCH_ND = launch
    return k


def activation_statement(name):
    k = activation_ops.forward_kernel(from_torch_name(name), False)
    return k.statement, [("x", np.float32)], k.scalars, [1.0, 0.0]


def pointwise(ctx, baseline, quick, table):
    """Every launch variant of the generator on copy, relu, hardswish, gelu and add (one
    dimension after merging) and a few on a bias broadcast (two dimensions), 2^26 float32 (or
    each of --sizes)."""
    for n in SIZES or [ops_bench._n(quick)]:
        pointwise_size(ctx, baseline, quick, table, n)


def pointwise_size(ctx, baseline, quick, table, n):
    torch = baseline.torch
    cols = 1024
    shape = (n // cols, cols)
    rng = np.random.default_rng(11)
    a, b, bias = (ops_bench._data(rng, s) for s in (shape, shape, (cols,)))
    x, y, bb = (dp.Tensor.from_numpy(ctx, v) for v in (a, b, bias))
    out = dp.Tensor.empty(ctx, shape)
    tx, ty, tb = baseline.tensor(a), baseline.tensor(b), baseline.tensor(bias)
    tout = torch.empty_like(tx)
    tf = torch.nn.functional
    f32 = np.float32
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    binary = [("a", f32), ("b", f32)]
    cases = [
        ("copy", ("y = x;", [("x", f32)], [], []), [x], 8 * n, lambda: tout.copy_(tx), lambda: a64),
        ("relu", activation_statement("relu"), [x], 8 * n, lambda: torch.relu(tx),
         lambda: np.maximum(a64, 0)),
        ("hardswish", activation_statement("hardswish"), [x], 8 * n, lambda: tf.hardswish(tx),
         lambda: a64 * np.clip(a64 + 3, 0, 6) / 6),
        ("gelu", activation_statement("gelu"), [x], 8 * n, lambda: tf.gelu(tx),
         lambda: tf.gelu(torch.from_numpy(a64)).numpy()),
        ("add", ("y = a + b;", binary, [], []), [x, y], 12 * n, lambda: torch.add(tx, ty),
         lambda: a64 + b64),
        ("mul bias", ("y = a * b;", binary, [], []), [x, bb], 8 * n + 4 * cols,
         lambda: torch.mul(tx, tb), lambda: a64 * bias.astype(np.float64)),
    ]
    for op, (statement, inputs, scalars, values), args, nbytes, theirs, reference in cases:
        if SELECTED_OPS and op not in SELECTED_OPS:
            continue
        torch_before = baseline.time(theirs)
        try:
            torch_kernel_ms = torch_kernels(torch, theirs, 10)[0] * 1e3
        except Exception:  # the profiler is a detail: its absence must not cost the figures
            torch_kernel_ms = math.nan
        variants = [v for v in POINTWISE_VARIANTS if (op != "mul bias" or v[0] in ND_VARIANTS)
                    and (not SELECTED_VARIANTS or v[0] in SELECTED_VARIANTS)]
        first = None
        for variant in variants + variants[:1]:
            k = configured(f"probe_{op.replace(' ', '_')}", inputs, statement, scalars, variant)

            def run(k=k, algorithm=variant[1]):
                k(args, [out], values, algorithm=algorithm)
            out.fill_(np.nan)
            try:
                run()
            except Exception as e:  # a variant that does not build must not hide the others
                table.append({"part": "pointwise", "op": op, "variant": variant[0], "ok": False,
                              "error": f"{type(e).__name__}: {str(e)[:300]}"})
                continue
            got = out.numpy()
            if first is None:
                error = ops_bench.error_metric(got, reference())
                ok = error <= ops_bench.TOLERANCE
                first = got
            else:
                ok = same_bits(got, first)
                error = 0.0 if ok else math.inf
            ours_s = ops_bench.time_ours(ctx, run, quick) if ok else math.nan
            with KernelLog() as log:
                for _ in range(10):
                    run()
            kernel_ms = float(np.median([k["ms"] for k in log.summary()]))
            table.append({"part": "pointwise", "op": op if n == LARGE else f"{op} {n}", "variant": variant[0],
                          "ok": ok, "error": error, "ours_ms": ours_s * 1e3, "torch_ms": torch_before * 1e3,
                          "kernel_ms": kernel_ms, "torch_kernel_ms": torch_kernel_ms, "elements": n,
                          "ours_GBps": nbytes / ours_s / 1e9, "torch_GBps": nbytes / torch_before / 1e9,
                          "speedup": torch_before / ours_s})
        torch_after = baseline.time(theirs)
        table.append({"part": "pointwise", "op": op if n == LARGE else f"{op} {n}", "variant": "torch again",
                      "ok": True, "elements": n,
                      "error": 0.0, "ours_ms": torch_after * 1e3, "torch_ms": torch_before * 1e3,
                      "ours_GBps": nbytes / torch_after / 1e9, "torch_GBps": nbytes / torch_before / 1e9,
                      "speedup": torch_before / torch_after})


# Softmax over (2^26 / 32000, 32000) rows (benchmarks/ops.py's shape), forced through
# SoftmaxPlan's options. The first of each list is the code of the last record (tree
# reductions; a scalar, streaming backward), the plans' defaults follow among the others.
_NC256_CS = (".nc.L2::256B", ".cs")
_CS_CS = (".cs", ".cs")
SOFTMAX_FORWARD = [
    ("tree", False, dict(reduce="tree")),
    ("warp", False, dict(reduce="warp")),
    ("warp st.cs", False, dict(reduce="warp", hints=(None, ".cs"))),
    ("warp rc", False, dict(reduce="warp", recompute=True)),
    ("warp rc pf2 1/unit", False, dict(reduce="warp", recompute=True, prefetch=2, groups_per_unit=1)),
    ("warp rc pf2 2/unit", False, dict(reduce="warp", recompute=True, prefetch=2, groups_per_unit=2)),
    ("warp rc pf1 1/unit", False, dict(reduce="warp", recompute=True, prefetch=1, groups_per_unit=1)),
    ("tree rc pf2 1/unit", False, dict(reduce="tree", recompute=True, prefetch=2, groups_per_unit=1)),
    ("warp rc pf2 1/unit st.cs", False, dict(reduce="warp", recompute=True, prefetch=2, groups_per_unit=1,
                                             hints=(None, ".cs"))),
    ("log warp", True, dict(reduce="warp")),
    ("log warp pf2 1/unit", True, dict(reduce="warp", prefetch=2, groups_per_unit=1)),
    ("log warp pf2 2/unit", True, dict(reduce="warp", prefetch=2, groups_per_unit=2)),
    ("log warp pf1 1/unit", True, dict(reduce="warp", prefetch=1, groups_per_unit=1)),
    ("log warp pf2 1/unit st.cs", True, dict(reduce="warp", prefetch=2, groups_per_unit=1, hints=(None, ".cs"))),
]
# (label, cached, aligned, options): cached 0 streams y and dy twice; aligned False is the
# scalar kernel.
SOFTMAX_BACKWARD = [
    ("scalar stream tree", 0, False, dict(reduce="tree")),
    ("dy warp 1/unit cs cs", None, True, dict(reduce="warp", backward_hold="dy", backward_hints=_CS_CS,
                                              groups_per_unit=1)),
    ("dy warp 2/unit cs cs", None, True, dict(reduce="warp", backward_hold="dy", backward_hints=_CS_CS,
                                              groups_per_unit=2)),
    ("dy warp 4/unit cs cs", None, True, dict(reduce="warp", backward_hold="dy", backward_hints=_CS_CS,
                                              groups_per_unit=4)),
    ("dy tree 2/unit cs cs", None, True, dict(reduce="tree", backward_hold="dy", backward_hints=_CS_CS,
                                              groups_per_unit=2)),
]


def nv_report(ctx, source):
    """NVIDIA's register and spill lines for ``source`` (built again with -cl-nv-verbose)."""
    built = cl.Program(ctx.cl_context, source).build(options=["-cl-nv-verbose"])
    log = built.get_build_info(ctx.device, cl.program_build_info.LOG)
    return "; ".join(line.strip() for line in log.splitlines() if "registers" in line or "spill" in line)


def softmax_variants(ctx, baseline, quick, table):
    """softmax / log_softmax forward and the softmax backward over (batch, 32000) rows, every
    variant of SOFTMAX_FORWARD / SOFTMAX_BACKWARD checked against float64, then timed beside
    PyTorch (timed before and after). The warp reductions and hints are NVIDIA only."""
    from dlprim_py import program
    from dlprim_py.ops.softmax import SoftmaxPlan
    if ctx.info.vendor != "nvidia":
        return
    torch = baseline.torch
    vocab = 3200 if quick else 32000
    batch = max(1, ops_bench._n(quick) // vocab)
    shape = (batch, vocab)
    rng = np.random.default_rng(3)
    a, g = ops_bench._data(rng, shape, -8, 8), ops_bench._data(rng, shape)
    x, gx = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, g)
    out = dp.Tensor.empty(ctx, shape)
    tx, tg = baseline.tensor(a), baseline.tensor(g)
    x64, g64 = baseline.tensor(a, torch.float64), baseline.tensor(g, torch.float64)
    y64 = torch.softmax(x64, -1)
    refs = {False: y64.cpu().numpy(), True: torch.log_softmax(x64, -1).cpu().numpy()}
    ref_grad = (y64 * (g64 - (g64 * y64).sum(-1, keepdim=True))).cpu().numpy()
    y = dp.Tensor.from_numpy(ctx, refs[False].astype(np.float32))
    ty = baseline.tensor(refs[False].astype(np.float32))
    theirs = {"forward": lambda: torch.softmax(tx, -1), "log": lambda: torch.log_softmax(tx, -1),
              "backward": lambda: torch._softmax_backward_data(tg, ty, -1, torch.float32)}
    torch_before = {k: baseline.time(f) for k, f in theirs.items()}
    cases = [("softmax" if not log else "log_softmax", label, None, True, opts, log,
              "log" if log else "forward") for label, log, opts in SOFTMAX_FORWARD]
    cases += [("softmax backward", label, cached, aligned, opts, False, "backward")
              for label, cached, aligned, opts in SOFTMAX_BACKWARD]
    for op, label, cached, aligned, opts, log, kind in cases:
        row = {"part": "softmax", "op": op, "variant": label, "options": {k: v for k, v in opts.items()}}
        try:
            plan = SoftmaxPlan(ctx, log, vocab, 1, a.size, "row", cached, aligned, options=opts)
            if kind == "backward":
                run = lambda plan=plan: plan.backward(y, gx, out, batch, vocab, 1)  # noqa: E731
                ref, nbytes = ref_grad, 12 * a.size
            else:
                run = lambda plan=plan: plan.forward(x, out, batch, vocab, 1)  # noqa: E731
                ref, nbytes = refs[log], 8 * a.size
            out.fill_(np.nan)
            run()
            error = ops_bench.error_metric(out.numpy(), ref)
            row["build"] = nv_report(ctx, program.render("softmax", **plan.params))
            print(f"  build {op} {label}: {row['build']}")
        except Exception as e:  # a variant that does not build must not hide the others
            table.append(dict(row, ok=False, error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        ok = error <= ops_bench.TOLERANCE
        ours_s = ops_bench.time_ours(ctx, run, quick) if ok else math.nan
        torch_s = torch_before[kind]
        table.append(dict(row, ok=ok, error=error, ours_ms=ours_s * 1e3, torch_ms=torch_s * 1e3,
                          ours_GBps=nbytes / ours_s / 1e9, torch_GBps=nbytes / torch_s / 1e9,
                          speedup=torch_s / ours_s, params=dict(plan.params, statement=None)))
    for kind, f in theirs.items():
        again = baseline.time(f)
        table.append({"part": "softmax", "op": kind, "variant": "torch again", "ok": True, "error": 0.0,
                      "ours_ms": again * 1e3, "torch_ms": torch_before[kind] * 1e3,
                      "ours_GBps": (12 if kind == "backward" else 8) * a.size / again / 1e9,
                      "torch_GBps": (12 if kind == "backward" else 8) * a.size / torch_before[kind] / 1e9,
                      "speedup": torch_before[kind] / again})


def memflags(ctx, baseline, quick, table):
    """Does the per-command excess of NVIDIA's OpenCL depend on how the buffers were created?
    relu and clEnqueueCopyBuffer over 2^26 float32 on buffers made with READ_WRITE (as the
    memory pool makes them), READ_WRITE | HOST_NO_ACCESS, and READ_ONLY / WRITE_ONLY |
    HOST_NO_ACCESS, beside PyTorch's relu and copy; ten calls per span and the kernels' events."""
    torch = baseline.torch
    mf = cl.mem_flags
    n = ops_bench._n(quick)
    rng = np.random.default_rng(21)
    host = big_data(rng, n)
    source = dp.Tensor.from_numpy(ctx, host)
    tx = baseline.tensor(host)
    tout = torch.empty_like(tx)
    relu = activation_ops.forward_kernel(from_torch_name("relu"), False)
    reference = np.maximum(host.astype(np.float64), 0)
    theirs = {"relu": lambda: torch.relu(tx), "copy": lambda: tout.copy_(tx)}
    torch_s = {k: baseline.time(f) for k, f in theirs.items()}
    layouts = [("READ_WRITE", mf.READ_WRITE, mf.READ_WRITE),
               ("RW | HOST_NO_ACCESS", mf.READ_WRITE | mf.HOST_NO_ACCESS, mf.READ_WRITE | mf.HOST_NO_ACCESS),
               ("RO / WO | HOST_NO_ACCESS", mf.READ_ONLY | mf.HOST_NO_ACCESS, mf.WRITE_ONLY | mf.HOST_NO_ACCESS)]
    for label, in_flags, out_flags in layouts + layouts[:1]:
        x = dp.Tensor(ctx, cl.Buffer(ctx.cl_context, in_flags, 4 * n), (n,))
        out = dp.Tensor(ctx, cl.Buffer(ctx.cl_context, out_flags, 4 * n), (n,))
        check = dp.Tensor.empty(ctx, (n,))
        cl.enqueue_copy(ctx.queue, x.buffer, source.buffer, byte_count=4 * n)
        for op, run in (("relu", lambda: relu([x], [out], [1.0, 0.0])),
                        ("copy", lambda: cl.enqueue_copy(ctx.queue, out.buffer, x.buffer, byte_count=4 * n))):
            check.fill_(np.nan)
            run()
            cl.enqueue_copy(ctx.queue, check.buffer, out.buffer, byte_count=4 * n)
            error = ops_bench.error_metric(check.numpy(), reference if op == "relu" else host)
            ok = error <= ops_bench.TOLERANCE
            ours_s = ops_bench.time_ours(ctx, run, quick) if ok else math.nan
            span, kernel, gap, _ = marker_span(ctx, run, 10, True, 3 if quick else 15) if ok else (math.nan,) * 4
            table.append({"part": "memflags", "op": op, "variant": label, "ok": ok, "error": error,
                          "ours_ms": ours_s * 1e3, "torch_ms": torch_s[op] * 1e3, "kernel_ms": kernel * 1e3,
                          "gap_us": gap * 1e6, "ours_GBps": 8 * n / ours_s / 1e9,
                          "torch_GBps": 8 * n / torch_s[op] / 1e9, "speedup": torch_s[op] / ours_s})


def big_data(rng, n):
    """Seeded uniform float32 in [-4, 4), never zeros: a block of a prime length drawn once and
    repeated (drawing 2^28 values would take seconds of the lent machine's time)."""
    block = rng.uniform(-4.0, 4.0, size=min(n, 1_000_003)).astype(np.float32)
    return np.resize(block, n)


def marker_span(ctx, run, calls, primed, repeat):
    """Median seconds per call between OpenCL markers around ``calls`` calls; ``primed``: one
    untimed call just before the first marker, so that the device is busy while the host
    enqueues the marker and the timed calls (the span holds no host latency). Also the kernels'
    own events of the last span: median kernel time and median gap between consecutive ones."""
    queue = ctx.queue
    spans = []
    for _ in range(repeat):
        if primed:
            run()
        with KernelLog() as log:
            begin = cl.enqueue_marker(queue)
            for _ in range(calls):
                run()
            end = cl.enqueue_marker(queue)
        end.wait()
        spans.append((end.profile.end - begin.profile.start) * 1e-9 / calls)
    events = [e for _, _, _, e in log.events]
    kernel = [(e.profile.end - e.profile.start) * 1e-9 for e in events]
    gaps = [(b.profile.start - a.profile.end) * 1e-9 for a, b in zip(events, events[1:])]
    lead = (events[0].profile.start - begin.profile.start) * 1e-9 if events else math.nan
    return (float(np.median(spans)), float(np.median(kernel)) if kernel else math.nan,
            float(np.median(gaps)) if gaps else math.nan, lead)


def host_span(run, finish, calls, repeat=3):
    """Median host seconds per call of ``calls`` back-to-back calls and one wait at the end."""
    samples = []
    for _ in range(repeat):
        finish()
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        finish()
        samples.append((time.perf_counter() - t0) / calls)
    return float(np.median(samples))


def torch_span(torch, run, calls, primed, repeat):
    """torch.cuda.Event seconds per call around ``calls`` calls (``primed`` as marker_span);
    the host clock without CUDA."""
    if not torch.cuda.is_available():
        return host_span(run, lambda: None, calls, repeat)
    return ops_bench.cuda_span(torch, run, calls, primed, repeat)


def torch_kernels(torch, run, calls):
    """PyTorch's own kernel times and gaps (CUPTI through torch.profiler) over ``calls`` calls:
    (median kernel seconds, median gap seconds), NaN where the profiler gives nothing."""
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        return math.nan, math.nan
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if getattr(e, "device_type", None) is not None and "cuda" in str(e.device_type).lower()
                     and e.time_range.end > e.time_range.start)
    if not kernels:
        return math.nan, math.nan
    times = [(e - s) * 1e-6 for s, e in kernels]
    gaps = [(b[0] - a[1]) * 1e-6 for a, b in zip(kernels, kernels[1:])]
    return float(np.median(times)), float(np.median(gaps)) if gaps else math.nan


def span(ctx, baseline, quick, table):
    """Is the gap to PyTorch a fixed cost per call or bandwidth? The same operators at 64 MiB,
    256 MiB and 1 GiB, each timed six ways on both sides: ten calls between markers (events for
    torch) as the benchmarks do, the same after a priming call, one call, the host clock around
    many calls (our profiling queue, a queue without profiling, torch), and the kernels' own
    device times and the gaps between consecutive kernels (OpenCL events; CUPTI for torch)."""
    torch = baseline.torch
    tf = torch.nn.functional
    plain = dp.Context(profiling=False)
    baseline_sync = torch.cuda.synchronize if baseline.device == "cuda" else (lambda: None)
    rng = np.random.default_rng(15)
    sizes = [1 << 12, 1 << 14] if quick else [1 << 24, 1 << 26, 1 << 28]
    repeat = 3 if quick else 15
    for n in sizes:
        host_data = big_data(rng, n)
        x, out = dp.Tensor.from_numpy(ctx, host_data), dp.Tensor.empty(ctx, (n,))
        px, pout = dp.Tensor.from_numpy(plain, host_data), dp.Tensor.empty(plain, (n,))
        tx = baseline.tensor(host_data)
        tout = torch.empty_like(tx)
        x64 = tx.double()
        relu = activation_ops.forward_kernel(from_torch_name("relu"), False)
        hardswish = activation_ops.forward_kernel(from_torch_name("hardswish"), False)
        copy_kernel = PointwiseKernel("probe_span_copy", [("x", np.float32)], [("y", np.float32)], "y = x;")
        cases = [
            ("enqueue_copy", lambda c, i, o: o.copy_(i), lambda: tout.copy_(tx), x64),
            ("copy kernel", lambda c, i, o: copy_kernel([i], [o]), lambda: tout.copy_(tx), x64),
            ("relu", lambda c, i, o: relu([i], [o], [1.0, 0.0]), lambda: torch.relu(tx), torch.relu(x64)),
            ("hardswish", lambda c, i, o: hardswish([i], [o], [1.0, 0.0]), lambda: tf.hardswish(tx),
             tf.hardswish(x64)),
        ]
        for op, ours, theirs, reference in cases:
            out.fill_(np.nan)
            ours(ctx, x, out)
            got = baseline.tensor(out.numpy()).double()
            finite = bool(torch.isfinite(got).all())
            error = float((got - reference).norm() / (math.sqrt(n) * reference.abs().max())) if finite else math.inf
            ok = error <= ops_bench.TOLERANCE
            row = {"part": "span", "op": f"{op} {4 * n >> 20} MiB", "variant": "", "ok": ok, "error": error,
                   "bytes": 8 * n}
            if ok:
                run = lambda: ours(ctx, x, out)  # noqa: E731
                for _ in range(3):
                    run()
                ctx.queue.finish()
                row["ours_span10"], row["ours_kernel"], row["ours_gap"], row["ours_lead10"] = \
                    marker_span(ctx, run, 10, False, repeat)
                row["ours_span10_primed"], _, _, row["ours_lead_primed"] = marker_span(ctx, run, 10, True, repeat)
                row["ours_span1"] = marker_span(ctx, run, 1, False, repeat)[0]
                host_calls = max(20, int(2e9 / (8 * n)))
                row["ours_host"] = host_span(run, ctx.queue.finish, host_calls)
                run_plain = lambda: ours(plain, px, pout)  # noqa: E731
                run_plain()
                row["ours_host_noprof"] = host_span(run_plain, plain.queue.finish, host_calls)
                with torch.no_grad():
                    theirs()
                    row["torch_span10"] = torch_span(torch, theirs, 10, False, repeat)
                    row["torch_span10_primed"] = torch_span(torch, theirs, 10, True, repeat)
                    row["torch_span1"] = torch_span(torch, theirs, 1, False, repeat)
                    row["torch_host"] = host_span(theirs, baseline_sync, host_calls)
                    try:
                        row["torch_kernel"], row["torch_gap"] = torch_kernels(torch, theirs, 10)
                    except Exception as e:  # the profiler is a detail: its absence must not cost the rest
                        row["torch_kernel"] = row["torch_gap"] = math.nan
                        row["torch_profiler_error"] = f"{type(e).__name__}: {e}"
            table.append(row)


SPAN_FIELDS = ("span10", "span10_primed", "span1", "host", "kernel", "gap")


def format_span(r):
    if not r.get("ok"):
        return f"{r['op']:<24} FAILED (error {r.get('error')})"
    us = lambda v: f"{v * 1e6:8.2f}"  # noqa: E731
    ours = " ".join(us(r[f"ours_{f}"]) for f in SPAN_FIELDS)
    theirs = " ".join(us(r[f"torch_{f}"]) for f in SPAN_FIELDS)
    return (f"{r['op']:<24} ours  {ours} noprof {us(r['ours_host_noprof'])} lead {us(r['ours_lead10'])}"
            f"/{us(r['ours_lead_primed'])}\n{'':<24} torch {theirs}  ratio span10 "
            f"{r['torch_span10'] / r['ours_span10']:.3f} primed {r['torch_span10_primed'] / r['ours_span10_primed']:.3f}"
            f" host {r['torch_host'] / r['ours_host']:.3f} kernel {r['torch_kernel'] / r['ours_kernel']:.3f}")


def nvidia_build_report(ctx, table, out_dir):
    """NVIDIA's compiler report (registers, spills) and the PTX of the default launch of copy,
    relu, hardswish, gelu, sigmoid and add over 2^26 elements (one step, no grid-stride loop),
    and of gelu and silu forward and backward on float16 and bfloat16 (their widest access:
    the PTX should load and store 16-byte words, ld.global.v4.u32 / st.global.v4.u32, and use
    no local memory), built with -cl-nv-verbose."""
    if ctx.info.vendor != "nvidia":
        return
    from dlprim_py import program
    f32 = np.float32
    kernels = [(name, activation_statement(name)[:3] + ([("y", f32)],))
               for name in ("relu", "hardswish", "gelu", "sigmoid")]
    kernels += [("copy", ("y = x;", [("x", f32)], [], [("y", f32)])),
                ("add", ("y = a + b;", [("a", f32), ("b", f32)], [], [("y", f32)]))]
    for name in ("gelu", "silu"):
        desc = from_torch_name(name)
        for tag, dtype in (("f16", dp.float16), ("bf16", dp.bfloat16)):
            for way, make in (("fwd", activation_ops.forward_kernel),
                              ("bwd", activation_ops.backward_kernel)):
                k = make(desc, False, dtype)
                kernels.append((f"{name}_{way}_{tag}", (k.statement, k.inputs, k.scalars,
                                                        k.outputs)))
    for name, (statement, inputs, scalars, outputs) in kernels:
        k = PointwiseKernel(f"report_{name}", inputs, outputs, statement, scalars=scalars)
        _, _, launch, _ = k.launches(ctx)
        params = k.template_params(1, "int", k.vector_widths(ctx)[0], launch.unroll,
                                   (True,) * len(inputs), launch.interleave, grid_stride=False)
        source = program.render("pointwise", **params)
        built = cl.Program(ctx.cl_context, source).build(options=["-cl-nv-verbose"])
        log = built.get_build_info(ctx.device, cl.program_build_info.LOG)
        ptx = built.get_info(cl.program_info.BINARIES)[0]
        lines = [line.strip() for line in log.splitlines() if "registers" in line or "spill" in line]
        print(f"  build {name}: " + "; ".join(lines))
        if out_dir:
            # One file per kernel (the lent machine returns a few files only): the source, the
            # compiler's log and the PTX.
            os.makedirs(os.path.join(out_dir, "ptx"), exist_ok=True)
            with open(os.path.join(out_dir, "ptx", f"{name}.txt"), "w") as f:
                f.write(f"{source}\n/* build log:\n{log}\n*/\n\n" + ptx.rstrip(b"\0").decode("ascii", "replace"))


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
    # Each variant's launch cap is a tuning value: this device's entry of the user database,
    # restored after.
    from dlprim_py import tuning
    path = tuning.user_path("dropout")
    saved = path.read_text() if path.is_file() else None
    for label, algorithm, unroll, gpu in DROPOUT_VARIANTS:
        tuning.store_device_entry(path, "dropout", ctx.info, [
            {"when": {}, "params": {"solver": algorithm, "groups_per_unit": gpu}}])
        tuning.forget()

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
    if saved is None:
        path.unlink()
    else:
        path.write_text(saved)
    tuning.forget()


class KernelLog:
    """Every kernel a call enqueues through ``Kernel.__call__``, with its device time."""

    def __init__(self):
        self.events = []

    def __enter__(self):
        self.original = cl.Kernel.__call__
        self.original_enqueue = cl.enqueue_nd_range_kernel
        self.original_copy = cl.enqueue_copy
        log = self

        def copy(queue, dest, src, **kwargs):
            event = log.original_copy(queue, dest, src, **kwargs)
            if isinstance(dest, cl.MemoryObjectHolder) and isinstance(src, cl.MemoryObjectHolder):
                log.events.append(("enqueue_copy", (), None, event))
            return event

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
        cl.enqueue_copy = copy
        return self

    def __exit__(self, *exc):
        cl.Kernel.__call__ = self.original
        cl.enqueue_nd_range_kernel = self.original_enqueue
        cl.enqueue_copy = self.original_copy

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
    if r.get("part") == "span":
        return format_span(r)
    if not r.get("ok"):
        return f"{r['op']:<24} {r['variant']:<16} FAILED (error {r.get('error')})"
    kernels = (f"  kernel {r['kernel_ms']:.4f} vs {r.get('torch_kernel_ms', math.nan):.4f}"
               if "kernel_ms" in r else "")
    return (f"{r['op']:<24} {r['variant']:<16} {r['ours_ms']:8.4f} {r.get('single_call_ms', math.nan):8.4f} "
            f"{r['torch_ms']:8.4f} {100 * r['ours_GBps'] / copy_rate:6.1f} {r['speedup']:7.2f}{kernels}")


class Table(list):
    """The rows, each printed as it comes (a run cut short by its time limit keeps them)."""

    def __init__(self, copy_rate, path=None, facts=None):
        super().__init__()
        self.copy_rate = copy_rate
        self.path = path
        self.facts = facts or {}
        print(f"{'op':<24} {'variant':<16} {'ours ms':>8} {'1call ms':>8} {'torch ms':>8} "
              f"{'% copy':>6} {'x torch':>7}")

    def append(self, row):
        super().append(row)
        print(format_row(row, self.copy_rate), flush=True)
        self.save()

    def save(self):
        """Write every row so far (a run cut short still leaves its figures)."""
        if self.path:
            with open(self.path, "w") as f:
                json.dump(dict(self.facts, rows=list(self)), f, indent=1, default=float)


def summary(table, copy_rate):
    """The pointwise sweep as one line per operator: each variant's speed against torch."""
    ops = {}
    for r in table:
        if r.get("part") in ("pointwise", "softmax", "memflags") and r.get("ok"):
            ops.setdefault(f"{r['part']} {r['op']}", []).append(r)
    if not ops:
        return
    print(f"\nx torch (copy {copy_rate:.0f} GB/s); first and last: the default, timed twice")
    for op, rows in ops.items():
        print(f"  {op:<10} " + "  ".join(f"{r['variant']} {r['speedup']:.3f}" for r in rows))


PARTS = {"span": span, "build": None, "pointwise": pointwise, "softmax": softmax_variants, "memflags": memflags,
         "dropout": dropout, "ops": operators, "host": host}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--output", default=None, help="folder for probe.json")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--ops", default="", help="pointwise part: operators to run (default all)")
    parser.add_argument("--sizes", default="", help="pointwise part: element counts (default 2^26)")
    parser.add_argument("--variants", default="",
                        help="pointwise part: variant labels to run, ';'-separated (default all)")
    args = parser.parse_args(argv)
    SELECTED_OPS[:] = [o for o in args.ops.split(",") if o]
    SIZES[:] = [int(v) for v in args.sizes.split(",") if v]
    SELECTED_VARIANTS[:] = [v for v in args.variants.split(";") if v]
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}, driver {ctx.info.driver_version})")
    baseline = ops_bench.Baseline(ctx, args.quick)
    copy_rows = ops_bench.copy(ctx, baseline, args.quick)
    copy_rate = max(r["ours_GBps"] for r in copy_rows if r["ok"])
    for r in copy_rows:
        print(f"{r['op']:<28} ours {r['ours_GBps']:7.0f} GB/s  torch {r['torch_GBps']:7.0f} GB/s")
    path = None
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        path = os.path.join(args.output, "probe.json")
    table = Table(copy_rate, path, {"device": ctx.info.name, "driver": ctx.info.driver_version,
                                    "commit": args.commit, "copy": copy_rows, "copy_GBps": copy_rate})
    for part in args.only.split(","):
        if part == "build":
            nvidia_build_report(ctx, table, args.output)
            continue
        try:
            PARTS[part](ctx, baseline, args.quick, table)
        except Exception as e:  # one broken part must not hide the others' figures
            table.append({"part": part, "op": f"{part} FAILED", "variant": f"{type(e).__name__}: {e}",
                          "ok": False})
            traceback.print_exc()
    summary(table, copy_rate)
    for r in table:
        if r.get("kernels"):
            print(f"  {r['op']}: " + ", ".join(f"{k['kernel']} {k['ms']:.4f}" for k in r["kernels"]))
    table.save()


if __name__ == "__main__":
    main()
