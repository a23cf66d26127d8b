"""Reductions and cross_entropy: every forced variant side by side with PyTorch.

    python benchmarks/reduce_probe.py [--quick] [--out DIR] [--commit HASH]
                                      [--only everything,argmax,kept,cross_entropy]

Each variant is checked against PyTorch in float64 first (MIOpen's metric, 1e-5; exact for
indices), then timed three ways, medians:

* ``device``: REPEAT calls enqueued behind a user event that holds the queue, then released, so
  the markers around them time the device's work alone (no host time in the span);
* ``span``: REPEAT calls between markers as they are enqueued (benchmarks/ops.py's figure: host
  time shows when the host is slower than the device);
* ``host``: host seconds to enqueue one call.

Variants are forced through the switches (``DLPRIM_REDUCE_PARTIALS_ALGO``, the reduce solvers'
tuning values in a user tuning database, ``DLPRIM_RANGE_CHECK_ALGO``); the int64-index argmax is built here as it was.
cross_entropy is not gated (in the immediate range-check mode the call waits for its check,
which a held queue never runs): its ``span`` is the figure; each range-check mode is a row. Groups: sum/mean/norm of everything, argmax, the reductions
that met their target already (kept), cross_entropy with the log-sum-exp kernel and softmax. PyTorch is timed with CUDA events the same way
(its ``span``). The table is printed last; ``DIR/probe.json`` holds the rows and ``DIR/*.ptx`` the
device code of the main kernels when the driver hands it out (NVIDIA returns PTX).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlprim_py as dp  # noqa: E402
from dlprim_py import functional as F, tuning  # noqa: E402
from dlprim_py.ops import reduce as R  # noqa: E402
from ops import Baseline, error_metric  # noqa: E402

REPEAT = 10
SAMPLES = 9


def median_span(ctx, run, gated):
    queue = ctx.queue
    samples = []
    for _ in range(SAMPLES):
        if gated:
            gate = cl.UserEvent(ctx.cl_context)
            cl.enqueue_marker(queue, wait_for=[gate])
        begin = cl.enqueue_marker(queue)
        for _ in range(REPEAT):
            run()
        end = cl.enqueue_marker(queue)
        if gated:
            gate.set_status(cl.command_execution_status.COMPLETE)
        end.wait()
        samples.append((end.profile.end - begin.profile.start) * 1e-9 / REPEAT)
    return float(np.median(samples))


def host_time(ctx, run):
    ctx.queue.finish()
    t0 = time.perf_counter()
    for _ in range(REPEAT):
        run()
    t1 = time.perf_counter()
    ctx.queue.finish()
    return (t1 - t0) / REPEAT


class Switches:
    """Set one variant's switches and restore them after: ``PARTIALS`` forces a partials solver
    (DLPRIM_REDUCE_PARTIALS_ALGO), any other name is a tuning value of the reduce family's group
    solver (lower-cased), put in this device's entry of the user tuning database."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        values = dict(self.values)
        self.partials = os.environ.get("DLPRIM_REDUCE_PARTIALS_ALGO")
        self.db = None
        if "PARTIALS" in values:
            os.environ["DLPRIM_REDUCE_PARTIALS_ALGO"] = values.pop("PARTIALS")
            dp.config.reload()
        if values:
            path = tuning.user_path("reduce")
            self.db = (path, path.read_text() if path.is_file() else None)
            ctx = dp.default_context()
            tuning.store_device_entry(path, "reduce", ctx.info, [
                {"when": {}, "params": {"solver": "group", **{k.lower(): v for k, v in values.items()}}}])
            tuning.forget()

    def __exit__(self, *exc):
        if self.partials is None:
            os.environ.pop("DLPRIM_REDUCE_PARTIALS_ALGO", None)
        else:
            os.environ["DLPRIM_REDUCE_PARTIALS_ALGO"] = self.partials
        dp.config.reload()
        if self.db is not None:
            path, text = self.db
            if text is None:
                path.unlink()
            else:
                path.write_text(text)
            tuning.forget()


def measure(ctx, baseline, rows, case, variant, nbytes, ours, check, theirs, switches, gated=True):
    with Switches(**switches), dp.no_grad():
        error = check()
        ok = error <= 1e-5
        record = {"case": case, "variant": variant, "bytes": nbytes, "error": error, "ok": ok}
        if ok:
            for _ in range(2):
                ours()
            ctx.queue.finish()
            record["device_ms"] = median_span(ctx, ours, gated) * 1e3 if gated else math.nan
            record["span_ms"] = median_span(ctx, ours, False) * 1e3
            record["host_ms"] = host_time(ctx, ours) * 1e3
    if theirs is not None:
        record["torch_ms"] = baseline.time(theirs) * 1e3
    rows.append(record)
    print(format_row(record), flush=True)


def format_row(r):
    if not r["ok"]:
        return f"{r['case']:<28} {r['variant']:<22} WRONG error {r['error']:.2e}"
    dev = r.get("device_ms", math.nan)
    torch_ms = r.get("torch_ms", math.nan)
    return (f"{r['case']:<28} {r['variant']:<22} dev {dev:8.4f} span {r['span_ms']:8.4f} "
            f"host {r['host_ms']:7.4f} ms | {r['bytes'] / dev / 1e6 if dev == dev else math.nan:7.0f} GB/s"
            f" | torch {torch_ms:8.4f}")


def dump_ptx(ctx, out):
    """The program binaries (PTX on NVIDIA) of every reduce and softmax program built so far."""
    for k, (key, built) in enumerate(list(ctx.programs.items())):
        if key[0] not in ("reduce", "softmax", "loss"):
            continue
        try:
            binary = built.program.get_info(cl.program_info.BINARIES)[0]
        except Exception as e:  # a driver may not hand binaries out
            print(f"no binary for {key[0]}: {e}")
            return
        params = dict(key[1]) if isinstance(key[1], tuple) else {}
        label = "_".join(str(params.get(p, "")) for p in ("name", "variant", "vector", "cached", "log"))
        with open(os.path.join(out, f"{key[0]}_{k}_{label}.ptx"), "wb") as f:
            f.write(binary)


# argmax's fold before: branches on each comparison.
_BRANCHY_FOLD = """
    if (acc_i == INDEX_MAX || ((v != v) ? (acc_v == acc_v) : (v > acc_v))) { acc_v = v; acc_i = i; }
"""


def old_argmax_kernel(index_accumulators, name):
    """argmax with the fold it had before (branches), int64 or index-type index accumulator."""
    return R.ReduceKernel(name, [("x", np.float32)], [("v", np.float32), ("i", np.int64)],
                          "v = x; i = ridx;", R._ARG_COMBINE.format(cmp=">"), {"v": "-INFINITY", "i": "INDEX_MAX"},
                          fold=_BRANCHY_FOLD, index_accumulators=index_accumulators, vector_unroll=2)


def everything_cases(ctx, baseline, rows, x, tx, dx, n, lean):
    """sum / mean / norm of all 2^26 elements: the last group combines, or a second launch."""
    torch = baseline.torch
    variants = [("last group (auto)", {}), ("two launches", {"PARTIALS": "launch"}),
                ("last group, 4/CU", {"ALL_GROUPS_PER_CU": 4}),
                ("last group, 16/CU", {"ALL_GROUPS_PER_CU": 16})]
    if lean:
        variants = variants[:2]
    cases = [("sum all", lambda: F.sum(x), lambda t: torch.sum(t)),
             ("mean all", lambda: F.mean(x), lambda t: torch.mean(t)),
             ("norm all", lambda: F.norm(x), lambda t: torch.linalg.vector_norm(t))]
    for k, (case, ours, theirs) in enumerate(cases):
        for variant, switches in (variants if k == 0 else variants[:1]):
            measure(ctx, baseline, rows, case, variant, 4 * n, ours,
                    lambda o=ours, t=theirs: error_metric(o().numpy(), t(dx).cpu().numpy()),
                    (lambda t=theirs: t(tx)) if variant.endswith("(auto)") else None, switches)


def argmax_cases(ctx, baseline, rows, x, tx, n, lean):
    torch = baseline.torch
    expected = torch.argmax(tx, -1).cpu().numpy()
    kernel = R._arg_kernel("argmax")

    def old(index_accumulators, name):
        k = old_argmax_kernel(index_accumulators, name)

        def run():
            index = dp.Tensor.empty(ctx, (x.shape[0],), np.int64)
            k([x], [dp.Tensor.empty(ctx, (x.shape[0], 1)), R._view(index, (x.shape[0], 1))])
            return index
        return run
    new = lambda: F.argmax(x, -1)  # noqa: E731
    # (label, sets per item, items per row at most, run)
    variants = [("sets, items/row of the tuning rules (auto)", None, None, new),
                ("sets 2, group/row", 2, 256, new),
                ("sets 4, 64/row", 4, 64, new),
                ("sets 2, 16/row", 2, 16, new),
                ("sets 1, 32/row", 1, 32, new),
                ("branchy int64, group/row", None, None, old((), "reduce_argmax_branchy_long"))]
    if lean:
        variants = variants[:2]
    defaults = kernel.vector_unroll, kernel.max_segment
    for variant, sets, segment, ours in variants:
        kernel.vector_unroll = sets or defaults[0]
        kernel.max_segment = segment or defaults[1]
        try:
            measure(ctx, baseline, rows, "argmax rows 4096", variant, 4 * n, ours,
                    lambda o=ours: 0.0 if np.array_equal(o().numpy(), expected) else math.inf,
                    (lambda: torch.argmax(tx, -1)) if variant.endswith("(auto)") else None, {})
        finally:
            kernel.vector_unroll, kernel.max_segment = defaults
    flat = torch.argmax(tx).item()
    measure(ctx, baseline, rows, "argmax all", "last group (auto)", 4 * n, lambda: F.argmax(x),
            lambda: 0.0 if int(F.argmax(x).numpy()) == flat else math.inf, lambda: torch.argmax(tx), {})


def kept_cases(ctx, baseline, rows, x, tx, dx, n):
    """Reductions that met the target before: they must stay there."""
    torch = baseline.torch
    cases = [("sum rows 4096", lambda: F.sum(x, -1), lambda t: torch.sum(t, -1)),
             ("amax rows 4096", lambda: F.amax(x, -1), lambda t: torch.amax(t, -1)),
             ("sum columns dim=0", lambda: F.sum(x, 0), lambda t: torch.sum(t, 0))]
    for case, ours, theirs in cases:
        measure(ctx, baseline, rows, case, "auto", 4 * n, ours,
                lambda o=ours, t=theirs: error_metric(o().numpy(), t(dx).cpu().numpy()),
                lambda t=theirs: t(tx), {})


def cross_entropy_cases(ctx, baseline, rows, rng, n, lean):
    """cross_entropy (batch, 32000) with each way of reading the target check back; the
    log-sum-exp kernel alone (device time: what the loss costs without the check's wait)."""
    from dlprim_py.ops import loss as L
    torch = baseline.torch
    shape = (max(1, n // 32000), 32000)
    c = rng.uniform(-8, 8, shape).astype(np.float32)
    xc, tc, dc = dp.Tensor.from_numpy(ctx, c), baseline.tensor(c), baseline.tensor(c, torch.float64)
    target = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
    t_ours, t_torch = dp.Tensor.from_numpy(ctx, target), baseline.tensor(target)
    ref = torch.nn.functional.cross_entropy(dc, t_torch).cpu().numpy()
    name = f"cross_entropy {shape[0]}x{shape[1]}"
    for k, mode in enumerate(L.RANGE_CHECKS):
        saved = os.environ.get("DLPRIM_RANGE_CHECK_ALGO")
        os.environ["DLPRIM_RANGE_CHECK_ALGO"] = mode
        dp.config.reload()
        try:
            measure(ctx, baseline, rows, name, f"{mode}{' (auto)' if mode == L.DEFAULT_RANGE_CHECK else ''}",
                    c.nbytes, lambda: F.cross_entropy(xc, t_ours),
                    lambda: error_metric(F.cross_entropy(xc, t_ours).numpy(), ref),
                    (lambda: torch.nn.functional.cross_entropy(tc, t_torch)) if k == 0 else None, {}, gated=False)
        finally:
            if saved is None:
                os.environ.pop("DLPRIM_RANGE_CHECK_ALGO", None)
            else:
                os.environ["DLPRIM_RANGE_CHECK_ALGO"] = saved
            dp.config.reload()
    lse = dp.Tensor.empty(ctx, (shape[0], 1))
    sums = dp.Tensor.empty(ctx, (shape[0], 1))
    ref_lse = torch.logsumexp(dc, -1, keepdim=True).cpu().numpy()

    def run_lse():
        # The kernel leaves the max in lse and the log of the sum of exp(x - max) in sums.
        L._logsumexp_kernel()([xc], [lse, sums], axes=(1,))
        return lse, sums

    def lse_error():
        row_max, log_sum = run_lse()
        return error_metric(row_max.numpy() + log_sum.numpy(), ref_lse)
    measure(ctx, baseline, rows, name, "log-sum-exp kernel only", c.nbytes, run_lse,
            lse_error, lambda: torch.logsumexp(tc, -1), {})
    if not lean:
        native = R.ReduceKernel(
            "reduce_logsumexp_native", [("x", np.float32)], [("m", np.float32), ("s", np.float32)], "m = x; s = 1.0f;",
            "if (m > acc_m) { acc_s = acc_s * native_exp(acc_m - m) + s; acc_m = m; }"
            " else if (m != -INFINITY) { acc_s += s * native_exp(m - acc_m); }",
            {"m": "-INFINITY", "s": "0.0f"}, finalize="acc_m = acc_m + log(acc_s);")

        def run_native():
            native([xc], [lse, sums], axes=(1,))
            return lse
        measure(ctx, baseline, rows, name, "log-sum-exp native_exp", c.nbytes, run_native,
                lambda: error_metric(run_native().numpy(), ref_lse), None, {})
    measure(ctx, baseline, rows, f"softmax {shape[0]}x{shape[1]}", "auto", 2 * c.nbytes,
            lambda: F.softmax(xc, -1),
            lambda: error_metric(F.softmax(xc, -1).numpy(), torch.softmax(dc, -1).cpu().numpy()),
            lambda: torch.softmax(tc, -1), {})


GROUPS = ("copy", "everything", "argmax", "kept", "cross_entropy")


def copy_case(ctx, baseline, rows, x, tx, a, n):
    """The device copy (read + write) of the same tensor: the bandwidth ceiling of this run."""
    y = dp.Tensor.empty(ctx, x.shape)
    ty = tx.clone()

    def check():
        y.fill_(np.nan)
        y.copy_(x)
        return 0.0 if np.array_equal(y.numpy(), a) else math.inf
    measure(ctx, baseline, rows, "copy", "enqueue_copy", 8 * n, lambda: y.copy_(x), check,
            lambda: ty.copy_(tx), {})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--commit", default=None)
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated of {','.join(GROUPS)}")
    parser.add_argument("--lean", action="store_true", help="the chosen variants and one earlier each only")
    args = parser.parse_args(argv)
    groups = [g for g in args.only.split(",") if g]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown groups {unknown}; known: {list(GROUPS)}")
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}, driver {ctx.info.driver_version})")
    baseline = Baseline(ctx, args.quick)
    torch = baseline.torch
    rng = np.random.default_rng(5)
    n = (1 << 16) if args.quick else (1 << 26)
    rows = []
    wide = (n // 4096, 4096)
    a = rng.uniform(-2, 2, wide).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    tx, dx = baseline.tensor(a), baseline.tensor(a, torch.float64)
    if "copy" in groups:
        copy_case(ctx, baseline, rows, x, tx, a, n)
    if "everything" in groups:
        everything_cases(ctx, baseline, rows, x, tx, dx, n, args.lean)
    if "argmax" in groups:
        argmax_cases(ctx, baseline, rows, x, tx, n, args.lean)
    if "kept" in groups:
        kept_cases(ctx, baseline, rows, x, tx, dx, n)
    del dx
    if "cross_entropy" in groups:
        cross_entropy_cases(ctx, baseline, rows, rng, n, args.lean)

    os.makedirs(args.out, exist_ok=True)
    try:
        dump_ptx(ctx, args.out)
    except Exception as e:  # the table matters more than the device code
        print(f"PTX dump failed: {type(e).__name__}: {e}")
    with open(os.path.join(args.out, "probe.json"), "w") as f:
        json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version, "commit": args.commit,
                   "baseline": baseline.describe(), "rows": rows}, f, indent=1, default=float)
    print("\n" + "\n".join(format_row(r) for r in rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
