"""Reductions, softmax and cross_entropy: every forced variant side by side with PyTorch.

    python benchmarks/reduce_probe.py [--quick] [--out DIR] [--commit HASH]

Each variant is checked against PyTorch in float64 first (MIOpen's metric, 1e-5; exact for
indices), then timed three ways, medians:

* ``device``: REPEAT calls enqueued behind a user event that holds the queue, then released, so
  the markers around them time the device's work alone (no host time in the span);
* ``span``: REPEAT calls between markers as they are enqueued (benchmarks/ops.py's figure: host
  time shows when the host is slower than the device);
* ``host``: host seconds to enqueue one call.

Variants are forced through the modules' switches (``reduce.VECTOR``, ``SEGMENT``, ``UNROLL``,
``ITEM_WAVES``, ``softmax.VECTOR``, ``cached=``). PyTorch is timed with CUDA events the same way
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
from dlprim_py import functional as F  # noqa: E402
from dlprim_py.ops import reduce as R  # noqa: E402
from dlprim_py.ops import softmax as S  # noqa: E402
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
    """Set module switches for one variant and restore them after."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.saved = {}
        for name, value in self.values.items():
            module, attr = (S, name[len("softmax_"):]) if name.startswith("softmax_") else (R, name)
            self.saved[name] = (module, attr, getattr(module, attr))
            setattr(module, attr, value)

    def __exit__(self, *exc):
        for module, attr, value in self.saved.values():
            setattr(module, attr, value)


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--commit", default=None)
    args = parser.parse_args(argv)
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
    reduce_variants = [
        ("auto (vec4 x4)", {}),
        ("scalar", {"VECTOR": 1}),
        ("vec4 x8", {"VECTOR_UNROLL": 8}),
        ("vec4 x2", {"VECTOR_UNROLL": 2}),
        ("vec4 seg256", {"SEGMENT": 256}),
    ]
    cases = [
        ("sum all", lambda: F.sum(x), lambda t: torch.sum(t), 4 * n),
        ("sum rows 4096", lambda: F.sum(x, -1), lambda t: torch.sum(t, -1), 4 * n),
        ("amax rows 4096", lambda: F.amax(x, -1), lambda t: torch.amax(t, -1), 4 * n),
    ]
    for case, ours, theirs, nbytes in cases:
        extra = [("groups/CU 8", {"GROUPS_PER_CU": 8}), ("groups/CU 32", {"GROUPS_PER_CU": 32})]
        for variant, switches in reduce_variants + (extra if case == "sum all" else []):
            measure(ctx, baseline, rows, case, variant, nbytes, ours,
                    lambda o=ours, t=theirs: error_metric(o().numpy(), t(dx).cpu().numpy()),
                    (lambda t=theirs: t(tx)) if variant.startswith("auto") else None, switches)

    def argmax_check():
        return 0.0 if np.array_equal(F.argmax(x, -1).numpy(), torch.argmax(tx, -1).cpu().numpy()) else math.inf
    for variant, switches in reduce_variants[:2]:
        measure(ctx, baseline, rows, "argmax rows 4096", variant, 4 * n, lambda: F.argmax(x, -1),
                argmax_check, (lambda: torch.argmax(tx, -1)) if variant.startswith("auto") else None, switches)
    for variant, switches in [("auto (item)", {}), ("item waves 0.5", {"ITEM_WAVES": 0.5}),
                              ("item waves 2", {"ITEM_WAVES": 2}), ("item unroll 4", {"UNROLL": 4})]:
        measure(ctx, baseline, rows, "sum columns dim=0", variant, 4 * n, lambda: F.sum(x, 0),
                lambda: error_metric(F.sum(x, 0).numpy(), torch.sum(dx, 0).cpu().numpy()),
                (lambda: torch.sum(tx, 0)) if variant.startswith("auto") else None, switches)

    def small_case(case, shape, dim, op, theirs_op, variants):
        b = rng.uniform(-2, 2, shape).astype(np.float32)
        xb, tb, db = dp.Tensor.from_numpy(ctx, b), baseline.tensor(b), baseline.tensor(b, torch.float64)
        for variant, switches in variants:
            measure(ctx, baseline, rows, case, variant, b.nbytes, lambda: op(xb, dim),
                    lambda: error_metric(op(xb, dim).numpy(), theirs_op(db, dim).cpu().numpy()),
                    (lambda: theirs_op(tb, dim)) if variant.startswith("auto") else None, switches)

    scale = 8 if args.quick else 1
    small_case("sum rows 4096x4096", (4096 // scale, 4096), -1, F.sum, torch.sum,
               reduce_variants[:2] + [("vec4 seg256", {"SEGMENT": 256})])
    small_case("sum spatial 64x2048x7x7", (64 // scale, 2048, 7, 7), (2, 3), F.sum, torch.sum,
               [("auto", {}), ("seg16", {"SEGMENT": 16}), ("seg256 (old)", {"SEGMENT": 256})])
    small_case("mean channels 64x256x56x56", (64 // scale, 256, 56, 56), 1, F.mean, torch.mean,
               [("auto (item)", {}), ("item waves 4", {"ITEM_WAVES": 4})])

    # softmax over (batch, 32000) and (4096, 1000)
    for shape in ((max(1, n // 32000), 32000), (4096 // scale, 1000)):
        c = rng.uniform(-8, 8, shape).astype(np.float32)
        xc, tc, dc = dp.Tensor.from_numpy(ctx, c), baseline.tensor(c), baseline.tensor(c, torch.float64)
        for log in (False, True):
            ours_fn = F.log_softmax if log else F.softmax
            theirs_fn = torch.log_softmax if log else torch.softmax
            name = f"{'log_' if log else ''}softmax {shape[0]}x{shape[1]}"
            variants = [("auto", {}, None), ("streaming vec4", {}, 0), ("registers scalar (old)", {"softmax_VECTOR": 1}, None),
                        ("streaming scalar", {"softmax_VECTOR": 1}, 0)]
            if shape[1] == 1000:
                variants.append(("one row per group", {}, 4))
            if log:
                variants = variants[:2]
            for variant, switches, cached in variants:
                measure(ctx, baseline, rows, name, variant, 2 * c.nbytes,
                        lambda f=ours_fn, k=cached: f(xc, -1, cached=k),
                        lambda f=ours_fn, g=theirs_fn, k=cached: error_metric(f(xc, -1, cached=k).numpy(), g(dc, -1).cpu().numpy()),
                        (lambda g=theirs_fn: g(tc, -1)) if variant == "auto" else None, switches)
        if shape[1] == 32000:
            target = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
            t_ours, t_torch = dp.Tensor.from_numpy(ctx, target), baseline.tensor(target)
            for variant, switches in [("auto", {}), ("scalar", {"VECTOR": 1})]:
                measure(ctx, baseline, rows, f"cross_entropy {shape[0]}x{shape[1]}", variant, c.nbytes,
                        lambda: F.cross_entropy(xc, t_ours),
                        lambda: error_metric(F.cross_entropy(xc, t_ours).numpy(),
                                             torch.nn.functional.cross_entropy(dc, t_torch).cpu().numpy()),
                        (lambda: torch.nn.functional.cross_entropy(tc, t_torch)) if variant == "auto" else None,
                        switches, gated=False)

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
