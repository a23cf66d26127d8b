"""Matrix-vector products (M or N at most 8) through dp's GEMM against cuBLAS, in one run.

    python benchmarks/gemv_probe.py [--json FILE] [--quick] [--lanes]

For each shape and form: the public call (``dp.gemm``, wall clock with the device drained,
against ``torch.mm`` on the same transposed views timed the same way), then kernel times (the
plan's launches between profiling markers, median of 40) of the tuned choice (the "gemv"
solver) and of the tiled and split kernels forced, against ``torch.mm`` between CUDA events.
``--lanes`` (a tuning aid for the gemv rules of tuning_db/gemm.json): also the gemv kernel at
every lanes x group setting (K split as the solver chooses), each checked against float64,
the five fastest printed. Every result is checked against float64 first. Without CUDA the
baseline columns are empty.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.ops import gemm as G  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

from gemm import cuda_mm_median  # noqa: E402

# (M, N, K, trans_a, trans_b): one or a few tokens through a linear layer (x W^T), the other
# forms, a bias gradient's W^T x, a classifier at batch 8.
SHAPES = [(1, 4096, 4096, 0, 1), (1, 11008, 4096, 0, 1), (1, 4096, 4096, 0, 0),
          (4096, 1, 4096, 1, 0), (2, 4096, 4096, 0, 1), (4, 4096, 4096, 0, 1),
          (8, 4096, 4096, 0, 1), (8, 11008, 4096, 0, 1), (8, 4096, 4096, 0, 0),
          (4096, 8, 4096, 0, 0), (4096, 8, 4096, 1, 0), (4096, 4, 4096, 0, 1),
          (8, 1000, 2048, 0, 1)]


# The gemv settings --lanes times: work-items per output row (lanes) x outputs per group.
LANES_SWEEP = [(lanes, group) for lanes in (8, 16, 32, 64) for group in (2, 4, 8, 16)]


def sweep_lanes(ctx, M, N, K, ta, tb, A, B, C, ref):
    """Kernel ms of the gemv solver at each LANES_SWEEP setting that makes a work-group of 64
    items up to the device's largest, each result checked against ``ref`` first."""
    base = G.select_params(ctx, M, N, K, algorithm="gemv", trans_a=bool(ta), trans_b=bool(tb))
    times = {}
    for lanes, group in LANES_SWEEP:
        if not 64 <= lanes * group <= ctx.info.max_work_group_size:
            continue
        plan = G.GemmPlan(ctx, M, N, K, A.buffer, 0, A.shape[1], B.buffer, 0, B.shape[1],
                          C.buffer, 0, N, trans_a=bool(ta), trans_b=bool(tb),
                          params=dict(base, lanes=lanes, group=group))
        plan.enqueue()
        err = float(np.linalg.norm(C.numpy() - ref) / np.linalg.norm(ref))
        assert err < 1e-5, (M, N, K, ta, tb, lanes, group, err)
        times[f"{lanes}x{group} split {plan.splits}"] = \
            time_enqueued(ctx, plan.enqueue, warmup=5, repeat=40).median * 1e3
    return times


def walls(call, drain):
    """Median seconds of ``call(); drain()`` over 60 calls after 5 untimed ones."""
    return float(np.median(nets.wall_times(call, drain, 5, 60)))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--quick", action="store_true", help="small shapes: checks the script on PoCL")
    p.add_argument("--lanes", action="store_true",
                   help="also time the gemv kernel at every lanes x group setting")
    args = p.parse_args(argv)
    shapes = [(m, max(1, n // 64), max(1, k // 64), ta, tb) for m, n, k, ta, tb in SHAPES] \
        if args.quick else SHAPES
    try:
        import torch
        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
    ctx = dp.Context(args.device) if args.device else dp.default_context()
    rng = np.random.default_rng(0)
    rows = []
    print(f"{ctx.info.name} (driver {ctx.info.driver_version}); baseline "
          f"{'cuBLAS through torch ' + torch.__version__ if torch else 'none (no CUDA)'}")
    for M, N, K, ta, tb in shapes:
        a = rng.uniform(-1, 1, (K, M) if ta else (M, K)).astype(np.float32)
        b = rng.uniform(-1, 1, (N, K) if tb else (K, N)).astype(np.float32)
        A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
        ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
        out = dp.gemm(A, B, trans_a=bool(ta), trans_b=bool(tb)).numpy()
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        C = dp.Tensor.empty(ctx, (M, N))
        kernels = {}
        for name, algorithm in (("tuned", None), ("gemv", "gemv"), ("tiled", "tiled"),
                                ("splitk", "splitk")):
            params = G.select_params(ctx, M, N, K, algorithm=algorithm, trans_a=bool(ta),
                                     trans_b=bool(tb))
            plan = G.GemmPlan(ctx, M, N, K, A.buffer, 0, a.shape[1], B.buffer, 0, b.shape[1],
                              C.buffer, 0, N, trans_a=bool(ta), trans_b=bool(tb), params=params)
            kernels[name] = time_enqueued(ctx, plan.enqueue, warmup=5, repeat=40).median
            if name == "tuned":
                solver = plan.algorithm
        public = walls(lambda: dp.gemm(A, B, trans_a=bool(ta), trans_b=bool(tb)),
                       ctx.queue.finish)
        row = dict(m=M, n=N, k=K, trans_a=bool(ta), trans_b=bool(tb), error=err, solver=solver,
                   public_ms=public * 1e3, kernel_ms={k: v * 1e3 for k, v in kernels.items()})
        if torch is not None:
            ta_, tb_ = torch.tensor(a, device="cuda"), torch.tensor(b, device="cuda")
            opa, opb = (ta_.t() if ta else ta_), (tb_.t() if tb else tb_)
            row["torch_public_ms"] = walls(lambda: torch.mm(opa, opb),
                                           torch.cuda.synchronize) * 1e3
            row["cublas_kernel_ms"] = cuda_mm_median(torch, opa, opb,
                                                     torch.empty((M, N), device="cuda"), 40) * 1e3
        rows.append(row)
        ratio = (f"{row['torch_public_ms'] / row['public_ms']:.2f}x, kernel "
                 f"{row['cublas_kernel_ms'] / row['kernel_ms']['tuned']:.2f}x"
                 if torch is not None else "")
        print(f"{M:5d} x {N:5d} x {K:5d} t{ta}{tb} {solver:6s} public {row['public_ms']:.4f} ms "
              f"{ratio}; kernels ms tuned {row['kernel_ms']['tuned']:.4f} gemv "
              f"{row['kernel_ms']['gemv']:.4f} tiled "
              f"{row['kernel_ms']['tiled']:.4f} splitk {row['kernel_ms']['splitk']:.4f}"
              + (f" cuBLAS {row['cublas_kernel_ms']:.4f}" if torch is not None else "")
              + f"; error {err:.1e}", flush=True)
        if args.lanes:
            row["lanes_ms"] = sweep_lanes(ctx, M, N, K, ta, tb, A, B, C, ref)
            best = sorted(row["lanes_ms"].items(), key=lambda kv: kv[1])[:5]
            print("      lanes x group, fastest: "
                  + ", ".join(f"{name} {ms:.4f}" for name, ms in best), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                       "torch": None if torch is None else torch.__version__, "rows": rows},
                      f, indent=1)
    return 0 if all(r["error"] < 1e-5 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
