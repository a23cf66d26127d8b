"""Tile probe: cumsum's "lookback" solver with each per_item (elements per work item of a tile,
kernels/scan.cl.mako's LPER) on long rows and on rows of 4096, public call, wall clock with the
device drained, PyTorch's cumsum beside in the same run, and the device time of a call queued
behind another; each result checked against float64 first.

    python benchmarks/cumsum_probe.py [--pers 8,16,32] [--repeat 50]

Each per_item is given as a device rule in the user tuning database (DLPRIM_CACHE_DIR), the
way a measured rule would be, then the databases are forgotten and reread.
"""
import argparse
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
import dlprim_py.functional as F  # noqa: E402
from dlprim_py import tuning  # noqa: E402
from dlprim_py.bench.dispatch import wall_ms  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

SHAPES = [(1 << 24,), (1 << 26,), (1 << 22,), (4096, 4096), (64, 65536)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pers", default="8,16,32")
    p.add_argument("--repeat", type=int, default=50)
    args = p.parse_args()
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    drain_torch = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ctx = dp.Context()
    rng = np.random.default_rng(0)
    data = {s: rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES}
    print(f"{ctx.info.name}; torch {torch.__version__} on {device}")
    pers = [int(x) for x in args.pers.split(",")]
    print(f"{'shape':>14s} {'torch ms':>9s} " + " ".join(f"{'per ' + str(x):>16s}" for x in pers))
    rows = {}
    # A timeout (SIGTERM) unwinds too: the probe's rule is removed however the run ends.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for per in pers:
            tuning.store_device_entry(tuning.user_path("cumsum"), "cumsum", ctx.info,
                                      [{"when": {}, "params": {"solver": "lookback",
                                                               "per_item": per}}])
            tuning.forget()
            for shape, x in data.items():
                X = dp.Tensor.from_numpy(ctx, x)
                call = lambda: F.cumsum(X, -1, algorithm="lookback")  # noqa: E731
                err = error_metric(call().numpy(), np.cumsum(x.astype(np.float64), -1))
                assert err < 1e-5, (shape, per, err)
                ms = wall_ms(call, ctx.synchronize, args.repeat)
                # Device time: markers around a call queued behind another (the device busy
                # while the host enqueues it).
                kernel = time_enqueued(ctx, call, repeat=args.repeat, prime=call).median * 1e3
                rows.setdefault(shape, {})[per] = (ms, kernel)
    finally:
        if os.path.exists(tuning.user_path("cumsum")):
            os.remove(tuning.user_path("cumsum"))
        tuning.forget()
    for shape, x in data.items():
        XT = torch.tensor(x, device=device)
        theirs = wall_ms(lambda: torch.cumsum(XT, -1), drain_torch, args.repeat)
        print(f"{str(shape):>14s} {theirs:9.3f} " + " ".join(
            f"{ms:6.3f} ({theirs / ms:4.2f}x)" for ms, _ in rows[shape].values()))
        print(f"{'device ms':>24s} " + " ".join(
            f"{kernel:16.3f}" for _, kernel in rows[shape].values()))


if __name__ == "__main__":
    main()
