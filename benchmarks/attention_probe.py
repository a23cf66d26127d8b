"""Block sizes of the attention kernels: wall time of forward and forward + backward per
choice of (block_m, block_n, kv_block, q_tile), overriding the tuning values.

    python benchmarks/attention_probe.py --shape 8,12,1024,64 --choices 128,32,128,32 64,32,64,32
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import solver  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402

F = dp.functional


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8,12,1024,64")
    p.add_argument("--choices", nargs="+", default=["128,32,128,32"])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    ctx = dp.default_context()
    shape = tuple(int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    q, k, v = (dp.Tensor.from_numpy(ctx, rng.standard_normal(shape).astype(np.float32),
                                    requires_grad=True) for _ in range(3))
    g = dp.Tensor.from_numpy(ctx, rng.standard_normal(shape).astype(np.float32))
    original = solver.tunables
    for choice in args.choices:
        bm, bn, kvb, qt = (int(x) for x in choice.split(","))

        def tunables(ctx_, family, problem, name, _c=(bm, bn, kvb, qt)):
            params = original(ctx_, family, problem, name)
            if family == "attention":
                params.update(block_m=_c[0], block_n=_c[1], kv_block=_c[2], q_tile=_c[3])
            return params
        solver.tunables = tunables
        ctx.plans.clear()

        def fwd():
            with dp.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)

        def fwd_bwd():
            for t in (q, k, v):
                t.grad = None
            F.scaled_dot_product_attention(q, k, v, is_causal=args.causal).backward(g)
        try:
            a = np.median(nets.wall_times(fwd, ctx.queue.finish, 2, args.repeat)) * 1e3
            b = np.median(nets.wall_times(fwd_bwd, ctx.queue.finish, 2, args.repeat)) * 1e3
            print(f"{choice:20s} fwd {a:8.3f} ms  fwd+bwd {b:8.3f} ms  bwd {b - a:8.3f} ms", flush=True)
        except Exception as e:  # a choice the device refuses
            print(f"{choice:20s} {type(e).__name__}: {str(e)[:200]}", flush=True)
    solver.tunables = original


if __name__ == "__main__":
    main()
