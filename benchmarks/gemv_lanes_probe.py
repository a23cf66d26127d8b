"""The gemv solver's lanes x group settings (split_k chosen) for one to eight vectors, kernel
time (OpenCL markers around one GemmPlan), each checked against float64 first, cuBLAS beside
(torch.mm, CUDA events, TF32 off): a tuning aid for the gemv rules of tuning_db/gemm.json.

    python benchmarks/gemv_lanes_probe.py        (needs PyTorch with CUDA)
"""
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pyopencl as cl  # noqa: E402
import torch  # noqa: E402

import dlprim_py as dp  # noqa: E402
from dlprim_py.ops import gemm as G  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402
torch.backends.cuda.matmul.allow_tf32 = False
ctx = dp.Context()
rng = np.random.default_rng(0)
mf = cl.mem_flags
for M, N, K, ta, tb in [(1, 4096, 4096, 0, 1), (2, 4096, 4096, 0, 1), (4, 4096, 4096, 0, 1),
                        (8, 4096, 4096, 0, 1), (8, 1000, 2048, 0, 1), (1, 4096, 4096, 0, 0),
                        (4, 4096, 4096, 0, 0)]:
    a = rng.uniform(-1, 1, (K, M) if ta else (M, K)).astype(np.float32)
    b = rng.uniform(-1, 1, (N, K) if tb else (K, N)).astype(np.float32)
    ab = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
    bb = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
    cb = cl.Buffer(ctx.cl_context, mf.READ_WRITE, M * N * 4)
    ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b)
    A_ = torch.tensor(a, device="cuda"); B_ = torch.tensor(b, device="cuda")
    opa = A_.t() if ta else A_; opb = B_.t() if tb else B_
    tout = torch.empty((M, N), device="cuda")
    for _ in range(5): torch.mm(opa, opb, out=tout)
    torch.cuda.synchronize(); s = []
    for _ in range(40):
        e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
        e0.record(); torch.mm(opa, opb, out=tout); e1.record(); e1.synchronize(); s.append(e0.elapsed_time(e1))
    cublas = float(np.median(s))
    row = []
    for lanes, group, split in itertools.product((8, 16, 32, 64), (2, 4, 8, 16), (0,)):
        if lanes * group > 1024 or lanes * group < 64:
            continue
        params = dict(G.select_params(ctx, M, N, K, algorithm="gemv", trans_a=bool(ta), trans_b=bool(tb)),
                      lanes=lanes, group=group)
        try:
            plan = G.GemmPlan(ctx, M, N, K, ab, 0, a.shape[1], bb, 0, b.shape[1], cb, 0, N,
                              trans_a=bool(ta), trans_b=bool(tb), params=params)
        except Exception as e:
            row.append(f"l{lanes}g{group}: {type(e).__name__}")
            continue
        out = np.empty((M, N), np.float32); plan.enqueue(); cl.enqueue_copy(ctx.queue, out, cb, is_blocking=True)
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        assert err < 1e-5, (M, N, K, lanes, group, err)
        t = time_enqueued(ctx, plan.enqueue, warmup=5, repeat=40).median * 1e3
        row.append((t, f"l{lanes}g{group}s{plan.splits}"))
    best = sorted(r for r in row if isinstance(r, tuple))[:5]
    shipped = G.select_params(ctx, M, N, K, trans_a=bool(ta), trans_b=bool(tb))
    print(f"{M}x{N}x{K} t{ta}{tb} cuBLAS {cublas:.4f} ms; shipped {shipped.get('lanes')}x{shipped.get('group')}; best: "
          + ", ".join(f"{n} {t:.4f} ({cublas / t:.2f}x)" for t, n in best)
          + "; " + ", ".join(f"{n} {t:.4f}" for t, n in sorted((r for r in row if isinstance(r, tuple)), key=lambda r: r[1])), flush=True)
    for x in (ab, bb, cb): x.release()
