"""float16 / bfloat16 GEMM benchmark: dp.gemm on 16-bit tensors against torch.matmul on the same
dtype (cuBLAS on tensor cores), measured in the same process.

    python benchmarks/gemm_half.py --dtype float16|bfloat16 [--device SPEC] [--only TEXT]
                                   [--layout nn,nt] [--out same|float32] [--repeat 20]
                                   [--variants] [--json FILE]

Squares 1024..8192, layouts "nn" (b stored K x N, as torch.matmul(a, b)) and "nt" (b stored
N x K: dp.gemm(..., trans_b=True), torch.matmul(a, b.t())). Each case is first checked on 256
sampled rows of C against the float64 product of the 16-bit inputs (bound: 1e-4 of the rows'
sum |a||b| plus half a unit in the last place of a 16-bit result, tests/test_gemm_half.py's),
then timed:

* ``ours``: ``dp.gemm(a, b, c=c)``, host wall clock around the call and ``ctx.queue.finish()``,
  median after a warm-up; ``kernel``: OpenCL profiling markers around the same call;
* ``torch``: ``torch.matmul(a, b, out=c)`` in the same dtype, wall clock around the call and
  ``torch.cuda.synchronize()``; ``ratio``: torch's time / ours (the target is >= 0.6).

``--out float32`` writes a float32 C (dp.gemm(out_dtype=float32); torch still writes the 16-bit
type, the ratio then compares unlike outputs). ``--variants`` also times a few parameter sets of
the mma kernel on each case (kernel time, each checked first), to choose the tuning rule.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import dtypes  # noqa: E402
from dlprim_py.ops import gemm as gemm_ops  # noqa: E402
from dlprim_py.bench.dispatch import wall_ms  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

SQUARES = [1024, 2048, 4096, 8192]
BASE = dict(gemm_ops.DEFAULT_MMA16)
VARIANTS = [
    BASE,
    dict(BASE, tile_group=8),
    dict(BASE, warps_m=4, warps_n=2),
    dict(BASE, tile_n=64, warps_m=4, warps_n=1),
    dict(BASE, tile_n=64, warps_m=2, warps_n=2, stages=3),
    dict(BASE, tile_m=64, tile_n=64, warps_m=2, warps_n=2, stages=3),
    dict(BASE, tile_m=64, tile_n=128, warps_m=2, warps_n=2, stages=3),
    dict(BASE, tile_m=64, tile_n=64, tile_k=64, warps_m=2, warps_n=2),
]


def to_host(values, dtype):
    """float64 of float32 ``values`` rounded to ``dtype`` as the library stores them."""
    if dtype is dp.bfloat16:
        return dtypes.bfloat16_to_float32(dtypes.to_bfloat16_bits(values)).astype(np.float64)
    return values.astype(np.float16).astype(np.float64)


def check(c, a64, b64, rows, trans_b, out_dtype):
    """(max violation ratio: the largest |c - ref| / bound on the sampled rows, <= 1 passes)."""
    op_b = b64.T if trans_b else b64
    ref = a64[rows] @ op_b
    scale = np.abs(a64[rows]) @ np.abs(op_b)
    ulp = {dp.float16: 2.0 ** -11, dp.bfloat16: 2.0 ** -8}.get(out_dtype, 0.0)
    bound = 1e-4 * scale.max() + ulp * np.abs(ref)
    return float((np.abs(np.asarray(c, np.float64)[rows] - ref) / bound).max())


def wall(run, finish, repeat):
    return wall_ms(run, finish, repeat) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    ap.add_argument("--device")
    ap.add_argument("--only")
    ap.add_argument("--layout", default="nn,nt")
    ap.add_argument("--out", choices=("same", "float32"), default="same")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    dtype = dtypes.as_dtype(args.dtype)
    out_dtype = dtype if args.out == "same" else dp.float32
    ctx = dp.Context(args.device)
    try:
        import torch
        tdev = "cuda" if torch.cuda.is_available() else None
    except ImportError:
        torch, tdev = None, None
    print(f"device: {ctx.info.name} ({ctx.info.architecture}), driver {ctx.info.driver_version};"
          f" torch {torch.__version__ if torch else None} on {tdev}; {args.dtype}, C {args.out}")
    rng = np.random.default_rng(0)
    results = {"device": ctx.info.name, "dtype": args.dtype, "out": args.out,
               "commit": os.environ.get("DLPRIM_COMMIT"), "cases": [], "variants": []}
    print(f"{'case':18} {'solver':>7} {'err/bound':>9} {'ours TF/s':>9} {'kernel':>8} "
          f"{'torch':>8} {'ratio':>6}")
    for size in SQUARES:
        for layout in args.layout.split(","):
            name = f"{layout} {size}"
            if args.only and args.only not in name:
                continue
            M = N = K = size
            trans_b = layout == "nt"
            a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
            b = rng.uniform(-1, 1, (N, K) if trans_b else (K, N)).astype(np.float32)
            A = dp.Tensor.from_numpy(ctx, a, dtype=dtype)
            B = dp.Tensor.from_numpy(ctx, b, dtype=dtype)
            a64, b64 = to_host(a, dtype), to_host(b, dtype)
            C = dp.Tensor.empty(ctx, (M, N), out_dtype)
            C.fill_(np.nan)
            rows = np.sort(rng.choice(M, size=min(M, 256), replace=False))
            flops = 2.0 * M * N * K

            def run():
                dp.gemm(A, B, c=C, trans_b=trans_b)
            run()
            params = gemm_ops.select_params(ctx, M, N, K, dtype=dtypes.name(dtype),
                                            c_dtype=dtypes.name(out_dtype))
            ratio_err = check(C.numpy(), a64, b64, rows, trans_b, out_dtype)
            row = {"case": name, "m": M, "n": N, "k": K, "solver": params["solver"],
                   "params": params, "err_over_bound": ratio_err, "ok": ratio_err <= 1}
            if ratio_err <= 1:
                ours = wall(run, ctx.queue.finish, args.repeat)
                kern = time_enqueued(ctx, run, repeat=args.repeat).median
                row.update(ours_ms=ours * 1e3, kernel_ms=kern * 1e3,
                           ours_tflops=flops / ours / 1e12, kernel_tflops=flops / kern / 1e12)
                if tdev:
                    tdtype = getattr(torch, args.dtype)
                    ta = torch.from_numpy(a).to(tdev).to(tdtype)
                    tb = torch.from_numpy(b).to(tdev).to(tdtype)
                    tb = tb.t() if trans_b else tb
                    tc = torch.empty((M, N), device=tdev, dtype=tdtype)
                    torch.matmul(ta, tb, out=tc)
                    torch.cuda.synchronize()
                    terr = check(tc.float().cpu().numpy(), a64, b64, rows, trans_b, dtype)
                    tt = wall(lambda: torch.matmul(ta, tb, out=tc), torch.cuda.synchronize,
                              args.repeat)
                    row.update(torch_ms=tt * 1e3, torch_tflops=flops / tt / 1e12,
                               torch_err_over_bound=terr, ratio=tt / ours)
                    del ta, tb, tc
            results["cases"].append(row)
            print(f"{name:18} {row['solver']:>7} {ratio_err:9.3f} "
                  f"{row.get('ours_tflops', float('nan')):9.1f} "
                  f"{row.get('kernel_tflops', float('nan')):8.1f} "
                  f"{row.get('torch_tflops', float('nan')):8.1f} "
                  f"{row.get('ratio', float('nan')):6.2f}", flush=True)
            if args.variants:
                for v in VARIANTS:
                    why = gemm_ops.params_problem(v, ctx.info)
                    if why:
                        print(f"  {json.dumps(v)}: {why}")
                        continue
                    try:
                        plan = gemm_ops.GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0,
                                                 K if trans_b else N, C.buffer, 0, N,
                                                 trans_b=trans_b, dtype=dtype,
                                                 c_dtype=out_dtype, params=v)
                    except dp.DlprimError as e:
                        print(f"  {json.dumps(v)}: {type(e).__name__}: {str(e)[:300]}")
                        continue
                    C.fill_(np.nan)
                    plan.enqueue()
                    verr = check(C.numpy(), a64, b64, rows, trans_b, out_dtype)
                    t = time_enqueued(ctx, plan.enqueue, repeat=args.repeat).median \
                        if verr <= 1 else float("nan")
                    results["variants"].append({"case": name, "params": v, "ok": verr <= 1,
                                                "kernel_ms": t * 1e3,
                                                "tflops": flops / t / 1e12})
                    print(f"  {json.dumps(v):120} err/bound {verr:6.3f} "
                          f"{flops / t / 1e12:7.1f} TFLOP/s", flush=True)
            del A, B, C
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
