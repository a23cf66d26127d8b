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
import os
import platform
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.dispatch import (Torch, backward_per_node, host_cases, host_us,  # noqa: E402
                                      public_cases, wall_ms)
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 2, few repeats (a CPU)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--commit", default=None,
                        help="the commit the measured tree is (a copy on a lent machine may carry "
                             "other git metadata or none)")
    args = parser.parse_args(argv)
    batch = args.batch or (2 if args.quick else 64)
    repeat = args.repeat or (5 if args.quick else 30)
    calls = 50 if args.quick else 2000
    ctx = dp.Context()
    th = Torch()
    rng = np.random.default_rng(0)
    commit = args.commit or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
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
    for name, call, reference in host_cases(ctx, rng):
        err = error_metric(call().numpy(), reference())
        us = host_us(call, ctx.synchronize, calls)
        print(f"{name:48s} {us:9.1f}{'' if err < 1e-5 else f'  FAILED: error {err:.2e}'}")
        record["host_us"].append(dict(name=name, us=us, error=err, ok=err < 1e-5))
    per_node = backward_per_node(ctx, rng, max(10, calls // 20))
    print(f"{'backward, per node':48s} {per_node:9.1f}")
    record["backward_us_per_node"] = per_node
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in record["public"] + record["host_us"]) else 1


if __name__ == "__main__":
    sys.exit(main())
