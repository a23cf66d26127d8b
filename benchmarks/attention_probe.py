"""Block sizes of the attention kernels: wall time of forward and forward + backward per
choice of (block_m, block_n, kv_block, q_tile[, lanes[, rows]]), overriding the tuning values
(``tuning_db/attention.json``), to choose the rules of a device.

    python benchmarks/attention_probe.py --shape 8,12,1024,64 \
        --choices 64,32,64,32,2,1 128,16,64,32,2,2 128,32,128,32,1,1
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import solver  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.ops import attention  # noqa: E402

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
        values = [int(x) for x in choice.split(",")]
        names = ("block_m", "block_n", "kv_block", "q_tile", "lanes", "rows")
        chosen = dict(zip(names, values))

        def tunables(ctx_, family, problem, name, _c=chosen):
            params = original(ctx_, family, problem, name)
            if family == "attention":
                params.update(_c)
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
            with dp.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
            # What the plan took (lanes and steps shrink where they do not fit).
            used = [c.plan.params for c in ctx.plans._current.values()
                    if isinstance(c, attention._Call) and c.plan is not None]
            shown = {k: used[-1][k] for k in ("block_m", "block_n", "kv_block", "q_tile",
                                              "lanes", "rows", "shuffle")} if used else {}
            a = np.median(nets.wall_times(fwd, ctx.queue.finish, 2, args.repeat)) * 1e3
            b = np.median(nets.wall_times(fwd_bwd, ctx.queue.finish, 2, args.repeat)) * 1e3
            print(f"{choice:20s} fwd {a:8.3f} ms  fwd+bwd {b:8.3f} ms  bwd {b - a:8.3f} ms  "
                  f"{shown}", flush=True)
        except Exception as e:  # a choice the device refuses
            print(f"{choice:20s} {type(e).__name__}: {str(e)[:200]}", flush=True)
    solver.tunables = original


if __name__ == "__main__":
    main()
