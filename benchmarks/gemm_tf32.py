"""TF32 GEMM benchmark: dp.gemm with TF32 allowed against torch.matmul with TF32 allowed (cuBLAS
on tensor cores), measured in the same process.

    python benchmarks/gemm_tf32.py [--device SPEC] [--only TEXT] [--repeat 20]
                                   [--variants] [--json FILE]

Shapes: squares 1024..8192 and ResNet-50 1x1 convolutions at batch 64 as NHWC GEMMs
(M = batch * pixels, N = output channels, K = input channels). Each case is first checked against
float64 (numpy, on 256 sampled rows of C) within TF32's error bound, then timed:

* ``ours``: the public call ``dp.gemm(a, b, c=c)`` with ``dp.backends.allow_tf32 = True``, host
  wall clock around the call and ``ctx.queue.finish()``, median after a warm-up;
* ``kernel``: OpenCL profiling markers around the same call (device time);
* ``torch``: ``torch.matmul(a, b, out=c)`` with ``torch.backends.cuda.matmul.allow_tf32 = True``,
  wall clock around the call and ``torch.cuda.synchronize()``, median after a warm-up;
* ``fp32``: our float32 GEMM (TF32 off) wall clock, for the gain.

First the ceiling: the rate of TF32 ``mma.sync`` issued from registers (no memory traffic,
``kernels/peak.cl.mako``), what a warp-level tensor-core GEMM from OpenCL cannot exceed.
``--variants`` also times mma kernel parameter sets on a few shapes (kernel time, each checked
first), to choose the tuning rules.
"""
import argparse
import json
import math
import os
import sys
import types

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.ops import gemm as gemm_ops  # noqa: E402
from dlprim_py.bench import peak  # noqa: E402
from dlprim_py.bench.dispatch import wall_ms  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

SQUARES = [1024, 2048, 4096, 8192]
# ResNet-50 1x1 convolutions at batch 64, NHWC: (name, M = 64 * pixels, N = Cout, K = Cin).
RESNET = [
    ("r50 l1 1x1 256->64", 64 * 56 * 56, 64, 256),
    ("r50 l1 1x1 64->256", 64 * 56 * 56, 256, 64),
    ("r50 l2 1x1 512->128", 64 * 28 * 28, 128, 512),
    ("r50 l3 1x1 256->1024", 64 * 14 * 14, 1024, 256),
    ("r50 l4 1x1 2048->512", 64 * 7 * 7, 512, 2048),
]
BASE = dict(tile_m=128, tile_n=128, tile_k=16, warps_m=2, warps_n=4, stages=2)
VARIANTS = [
    BASE,
    dict(BASE, round="int"),
    dict(BASE, staged=1),
    dict(BASE, staged=1, round="int"),
    dict(BASE, warps_m=4, warps_n=2, tile_group=8),
    dict(BASE, warps_m=4, warps_n=2, tile_group=8, staged=1, round="int"),
    dict(BASE, warps_m=2, warps_n=2),
    dict(BASE, warps_m=2, warps_n=2, staged=1, round="int"),
    dict(BASE, warps_m=2, warps_n=2, round="int", tile_group=8),
    dict(BASE, tile_n=64, warps_m=4, warps_n=1),
    dict(BASE, tile_n=64, warps_m=4, warps_n=1, staged=1, round="int"),
    dict(BASE, tile_n=64, warps_m=2, warps_n=1, round="int"),
    dict(BASE, tile_n=64, warps_m=2, warps_n=1, staged=1, round="int"),
    dict(BASE, tile_m=64, tile_n=64, warps_m=2, warps_n=2, stages=3),
    dict(BASE, tile_m=64, tile_n=64, warps_m=2, warps_n=2, staged=1, round="int"),
    dict(BASE, tile_m=64, tile_n=128, warps_m=2, warps_n=2, round="int"),
]
# The large-square rule (4 warps of 64 x 64, staged slices) against tiles of 256 x 128 and
# 128 x 256 (42.7 FLOP per byte of slice against 32), which fit 48 KiB of local memory only with
# both slices stored M (N) contiguous (stage_mn) and 8 deep.
RULE = dict(BASE, warps_m=2, warps_n=2, staged=1, round="int")
WIDE = [
    RULE,
    dict(RULE, stage_mn=1),
    dict(RULE, tile_k=8, stage_mn=1),
    dict(RULE, tile_m=256, tile_k=8, warps_m=4, stage_mn=1),
    dict(RULE, tile_m=256, tile_k=8, warps_m=4, stage_mn=1, tile_group=8),
    dict(RULE, tile_m=256, tile_k=8, warps_m=4, stage_mn=1, round="cvt"),
    dict(RULE, tile_n=256, tile_k=8, warps_n=4, stage_mn=1),
    dict(RULE, tile_m=256, tile_n=64, warps_m=4, warps_n=1, stage_mn=1),
]
VARIANT_SETS = {"all": VARIANTS, "wide": WIDE}
# Small-tile variants only on the small squares (their tile counts are what they are for).
SMALL_SQUARES = ("square 1024", "square 2048")
# TF32 keeps 10 of float32's 23 mantissa bits: each operand is off by at most 2^-11 relative
# (round to nearest), so a product by about 2^-10 and a sum of K of them by about
# 2^-10 * sqrt(K) * |a||b| for random signs. The check allows 3e-3 * sqrt(K) * max|a| * max|b|
# (a margin of about 3 over that), far under any indexing error (which is of order |a||b| K).
BOUND = 3e-3


def cases(only):
    out = [(f"square {s}", s, s, s) for s in SQUARES] + RESNET
    return [c for c in out if not only or only in c[0]]


def check(c, a, b, rows):
    """Max |c - a @ b| on the sampled rows, and the bound it must stay under."""
    ref = a[rows].astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(c[rows] - ref).max())
    bound = BOUND * math.sqrt(a.shape[1]) * float(np.abs(a).max()) * float(np.abs(b).max())
    return err, bound


def ptxas_info(ctx, params, M, N, K):
    """NVIDIA's compiler report (registers, spills, shared memory) of the kernel of ``params``
    for a packed M x N x K problem, or '' elsewhere."""
    if ctx.info.vendor != "nvidia":
        return ""
    mma = gemm_ops.FAMILY.solvers["mma"]
    cfg = mma.configure(ctx, gemm_ops.GemmProblem(M, N, K, 1, True), params,
                        gemm_ops.GemmLayout(lda=K, ldb=N, ldc=N))
    prg = cl.Program(ctx.cl_context, gemm_ops.kernel_source(params, cfg))
    prg.build(options=["-cl-nv-verbose"])
    log = prg.get_build_info(ctx.device, cl.program_build_info.LOG)
    return "; ".join(line.strip() for line in log.splitlines()
                     if "registers" in line or "spill" in line)


def wall(run, finish, repeat=20):
    """Median seconds of ``run(); finish()`` after 3 warm-up calls."""
    return wall_ms(run, finish, repeat) / 1e3


def mma_ceiling(ctx):
    """TF32 mma.sync issue rate from registers (``bench.peak.MmaProbe``), checked, for a few
    occupancies and chain counts: the ceiling of any mma.sync GEMM from OpenCL on this device.
    Empty where the device has no mma.sync."""
    if gemm_ops.mma_device_problem(ctx.info) is not None:
        return []
    rows = []
    for warps_per_cu in (4, 8, 16, 32):
        # One chain: every mma waits for the previous one's accumulators (its latency).
        for chains in (1, 2, 4, 8):
            probe = peak.MmaProbe(types.SimpleNamespace(ctx=ctx),
                                  ctx.info.compute_units * warps_per_cu, chains)
            probe.calibrate(0.005)
            error = probe.verify()
            seconds = time_enqueued(ctx, probe.run, repeat=10).median
            rows.append({"warps_per_cu": warps_per_cu, "chains": chains, "error": error,
                         "tflops": probe.flops / seconds / 1e12 if error <= 1e-6 else 0.0})
    return rows


def read_bandwidth(ctx):
    """Read bandwidth (``bench.peak.ReadProbe``, checked, device time) from a buffer the L2
    cache holds (8 MiB, 64 passes) and from memory (1 GiB, one pass): what the mma kernel's
    tiles are fed from. A C tile of TM x TN over K reads (TM + TN) K floats of A and B for
    2 TM TN K flops: 128 x 128 tiles need 1 byte per 32 flops from L2."""
    rows = []
    items = ctx.info.compute_units * 2048
    for name, floats, passes in (("L2", 2 << 20, 64), ("memory", 256 << 20, 1)):
        probe = peak.ReadProbe(types.SimpleNamespace(ctx=ctx), floats, passes, items)
        error = probe.verify()
        seconds = time_enqueued(ctx, probe.run, repeat=10).median
        rows.append({"source": name, "bytes": probe.bytes, "error": error,
                     "tb_per_s": probe.bytes / seconds / 1e12 if error == 0 else 0.0})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device")
    ap.add_argument("--only")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--variant-set", choices=sorted(VARIANT_SETS), default="all")
    ap.add_argument("--json")
    args = ap.parse_args()
    ctx = dp.Context(args.device)
    try:
        import torch
        tdev = "cuda" if torch.cuda.is_available() else None
    except ImportError:
        torch, tdev = None, None
    if tdev:
        torch.backends.cuda.matmul.allow_tf32 = True
    print(f"device: {ctx.info.name} ({ctx.info.architecture}), driver {ctx.info.driver_version};"
          f" torch {torch.__version__ if torch else None} on {tdev}")
    rng = np.random.default_rng(0)
    results = {"device": ctx.info.name, "driver": ctx.info.driver_version,
               "architecture": ctx.info.architecture, "torch": torch.__version__ if torch else None,
               "commit": os.environ.get("DLPRIM_COMMIT"), "cases": [], "variants": []}
    ceiling = mma_ceiling(ctx)
    if ceiling:
        results["mma_ceiling"] = ceiling
        best = max(ceiling, key=lambda r: r["tflops"])
        print(f"mma.sync TF32 ceiling (registers only): {best['tflops']:.1f} TFLOP/s "
              f"({best['warps_per_cu']} warps per compute unit, {best['chains']} chains); "
              + ", ".join(f"{r['warps_per_cu']}w x{r['chains']}: {r['tflops']:.0f}"
                          for r in ceiling))
    if ctx.info.is_gpu:
        results["read_bandwidth"] = read_bandwidth(ctx)
        print("read bandwidth: " + ", ".join(
            f"{r['source']} {r['tb_per_s']:.2f} TB/s" for r in results["read_bandwidth"])
            + " (128 x 128 tiles: 1 byte per 32 flops)")
    header = (f"{'case':24} {'M':>7} {'N':>5} {'K':>5} {'solver':>7} {'err/bound':>9} "
              f"{'ours TF/s':>9} {'kernel':>8} {'torch':>8} {'ratio':>6} {'fp32':>7}")
    print(header)
    for name, M, N, K in cases(args.only):
        a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
        C = dp.Tensor.empty(ctx, (M, N))
        C.fill_(np.nan)
        rows = np.sort(rng.choice(M, size=min(M, 256), replace=False))
        flops = 2.0 * M * N * K
        dp.backends.allow_tf32 = False
        fp32 = wall(lambda: dp.gemm(A, B, c=C), ctx.queue.finish, repeat=args.repeat)
        dp.backends.allow_tf32 = True
        C.fill_(np.nan)
        dp.gemm(A, B, c=C)
        key_plan = gemm_ops.select_params(ctx, M, N, K, 1, tf32=True)
        err, bound = check(C.numpy(), a, b, rows)
        row = {"case": name, "m": M, "n": N, "k": K, "solver": key_plan["solver"],
               "params": key_plan, "max_abs_err": err, "bound": bound, "ok": err <= bound}
        if err <= bound:
            ours = wall(lambda: dp.gemm(A, B, c=C), ctx.queue.finish, repeat=args.repeat)
            kern = time_enqueued(ctx, lambda: dp.gemm(A, B, c=C), repeat=args.repeat).median
            row.update(ours_ms=ours * 1e3, kernel_ms=kern * 1e3, fp32_ms=fp32 * 1e3,
                       ours_tflops=flops / ours / 1e12, kernel_tflops=flops / kern / 1e12,
                       fp32_tflops=flops / fp32 / 1e12)
            if tdev:
                ta, tb = torch.from_numpy(a).to(tdev), torch.from_numpy(b).to(tdev)
                tc = torch.empty((M, N), device=tdev)
                torch.matmul(ta, tb, out=tc)
                torch.cuda.synchronize()
                terr, _ = check(tc.cpu().numpy(), a, b, rows)
                tt = wall(lambda: torch.matmul(ta, tb, out=tc), torch.cuda.synchronize,
                          repeat=args.repeat)
                row.update(torch_ms=tt * 1e3, torch_tflops=flops / tt / 1e12,
                           torch_max_abs_err=terr, ratio=tt / ours)
                del ta, tb, tc
        results["cases"].append(row)
        print(f"{name:24} {M:7d} {N:5d} {K:5d} {row['solver']:>7} {err / bound:9.3f} "
              f"{row.get('ours_tflops', float('nan')):9.1f} "
              f"{row.get('kernel_tflops', float('nan')):8.1f} "
              f"{row.get('torch_tflops', float('nan')):8.1f} {row.get('ratio', float('nan')):6.2f} "
              f"{row.get('fp32_tflops', float('nan')):7.1f}", flush=True)
        del A, B, C
    if args.variants:
        print("variants (kernel time, GemmPlan with the parameters given):")
        for name, M, N, K in cases(args.only):
            if name not in SMALL_SQUARES + ("square 4096", "square 8192", "r50 l1 1x1 256->64",
                                            "r50 l1 1x1 64->256", "r50 l3 1x1 256->1024"):
                continue
            a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
            b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
            A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
            C = dp.Tensor.empty(ctx, (M, N))
            rows = np.sort(rng.choice(M, size=min(M, 256), replace=False))
            for v in VARIANT_SETS[args.variant_set]:
                if name in SMALL_SQUARES and v["tile_m"] * v["tile_n"] > 64 * 128 \
                        and v is not BASE:
                    continue
                params = dict(v, solver="mma")
                why = gemm_ops.params_problem(params, ctx.info)
                if why:
                    print(f"  {name:22} {v}: {why}")
                    continue
                if name == "square 4096":
                    try:
                        print(f"  ptxas {json.dumps(v)}: {ptxas_info(ctx, params, M, N, K)}")
                    except cl.Error as e:
                        print(f"  ptxas {json.dumps(v)}: {str(e)[:300]}")
                try:
                    plan = gemm_ops.GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N,
                                             C.buffer, 0, N, params=params)
                except dp.DlprimError as e:
                    print(f"  {name:22} {v}: {type(e).__name__}: {str(e)[:300]}")
                    continue
                C.fill_(np.nan)
                plan.enqueue()
                err, bound = check(C.numpy(), a, b, rows)
                t = time_enqueued(ctx, plan.enqueue, repeat=args.repeat).median \
                    if err <= bound else float("nan")
                results["variants"].append({"case": name, "params": v, "ok": err <= bound,
                                            "kernel_ms": t * 1e3,
                                            "tflops": 2.0 * M * N * K / t / 1e12})
                print(f"  {name:22} {json.dumps(v):110} err/bound {err / bound:6.3f} "
                      f"{2.0 * M * N * K / t / 1e12:7.1f} TFLOP/s", flush=True)
            del A, B, C
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
