"""Where a planned ONNX model's time and memory go: per model and batch, host time per run
(enqueuing only), wall time with the device drained, device busy time per kernel from profiling
events (one run), and the bytes the plan holds by kind with its largest buffers and the kernels
that bind them.

    python benchmarks/onnx_profile.py densenet121 vgg16 --batch 64 [--image-size 224] [--top 12]
                                      [--tf32]

``--tf32``: TF32 allowed in the context (``ctx.allow_tf32``), as benchmarks/onnx.py --tf32.
"""
import argparse
import collections
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.join(_HERE, ".."))

import numpy as np  # noqa: E402

import dlprim_py as dp  # noqa: E402
from dlprim_py import launch  # noqa: E402
from dlprim_py.bench import onnx as onnx_bench  # noqa: E402

MiB = 1 << 20


def profile(ctx, name, batch, image_size, top):
    model = dp.onnx.load(onnx_bench.export(onnx_bench.make_torch_model(name), image_size), ctx)
    x = dp.Tensor.from_numpy(ctx, onnx_bench.make_images(batch, image_size))
    for _ in range(3):
        model(x)
    ctx.synchronize()
    host, wall = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        model(x)
        t1 = time.perf_counter()
        ctx.synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
    with launch.kernel_events() as events:
        model(x)
    ctx.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    for kernel, event in events:
        per[kernel][0] += 1
        per[kernel][1] += (event.profile.end - event.profile.start) * 1e-6
    busy = sum(t for _, t in per.values())
    print(f"{name} b{batch}: host {1e3 * np.median(host):.2f} ms, wall "
          f"{1e3 * np.median(wall):.2f} ms, {len(events)} launches, busy {busy:.2f} ms")
    for kernel, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"   {kernel:44s} {n:4d} x {t:8.3f} ms ({1e3 * t / n:7.1f} us each)")
    parts = model.memory_parts
    print("   memory MiB: " + ", ".join(f"{k} {v / MiB:.1f}" for k, v in parts.items())
          + f"; weights {model.weight_bytes / MiB:.1f}")
    users = collections.defaultdict(set)
    for kernel, _, _, fixed, _, _ in model._last.plan.steps:
        for _, buf in fixed:
            users[buf.int_ptr].add(kernel.kernel.function_name)
    weights = model._constant_ptrs()
    sizes = {b.int_ptr: b.size for b in model._last.plan.keep if b.int_ptr not in weights}
    for ptr, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:6]:
        names = sorted(users.get(ptr, ()))
        print(f"   buffer {size / MiB:9.1f} MiB, bound by {len(names)} kernels: "
              f"{', '.join(names[:4])}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--batch", default="64")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--tf32", action="store_true", help="TF32 allowed (ctx.allow_tf32)")
    args = p.parse_args(argv)
    for name in args.models:
        for batch in (int(b) for b in args.batch.split(",")):
            # A context per case: the convolution workspace of one does not show in another.
            ctx = dp.Context()
            ctx.allow_tf32 = True if args.tf32 else None
            profile(ctx, name, batch, args.image_size, args.top)


if __name__ == "__main__":
    main()
