"""Can OpenCL reach Hopper's warpgroup MMA (wgmma, sm_90a) on NVIDIA, and how fast is it?

    python benchmarks/sm90a_probe.py [--device SPEC] [--json FILE] [--out DIR]

NVIDIA's OpenCL compiles OpenCL C for sm_90; wgmma needs the sm_90a target, which the mma GEMM
(``kernels/gemm_mma.cl.mako``) therefore never used: its ceiling is warp-level mma.sync. This
probe asks the driver, step by step, on an NVIDIA device of compute capability 9.0:

1. ``ptx``: what the compiler emits (the PTX header of a built program: ``.version``, ``.target``);
2. ``options``: whether a build option names sm_90a (``-cl-nv-arch sm_90a`` and spellings),
   with the wgmma instructions written plainly;
3. ``retarget``: whether the driver builds a program binary that is the compiler's own PTX with
   the hidden instructions uncommented and ``.target sm_90a`` / ``.version 8.0`` in the header
   (``kernels/wgmma_probe.cl.mako`` says how they are hidden);
4. ``tiles``: where a sm_90a program exists, one m64nNkK product per data type (tf32, f16,
   bf16) against float64, for each core-matrix layout and each reading of the descriptor's
   two offsets: which one is right (``permuted``: the right values in the wrong places);
5. ``peaks``: wgmma issue rate from local memory (no global traffic, result checked), against
   the mma.sync ceiling (``bench.peak.MmaProbe``) and cuBLAS (torch.matmul, TF32 / fp16) in the
   same run;
6. ``local``: how much local memory a work-group can be given at launch (a ``__local`` kernel
   argument): OpenCL's static local memory stops at 48 KiB, wgmma pipelines want more.

Every step records what the driver said (build logs in ``--out``); nothing is assumed.
"""
import argparse
import json
import math
import os
import re
import sys
import time
import types

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import program  # noqa: E402
from dlprim_py.bench import peak  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

K = {"tf32": 8, "f16": 16, "bf16": 16}
TILES = [("tf32", 8), ("tf32", 32), ("f16", 8), ("f16", 32), ("bf16", 32)]
SWIZZLES = [("tf32", 32), ("f16", 32)]
# wgmma GEMM kernels: (data type, BN, stages, wgmma groups left in flight), each within 48 KiB
GEMMS = [("tf32", 128, 3, 0), ("tf32", 128, 3, 1), ("tf32", 128, 2, 0), ("tf32", 256, 2, 0),
         ("f16", 128, 3, 0), ("f16", 256, 2, 0), ("bf16", 128, 3, 0)]
# (width in bytes, bits of the XOR, the descriptor's swizzle code)
SWIZZLE_MODES = [(32, 1, 3), (64, 2, 2), (128, 3, 1)]
PEAKS = [("tf32", 64), ("tf32", 128), ("tf32", 256), ("f16", 128), ("f16", 256), ("bf16", 256)]
PEAK_UNROLL = 8
OPTIONS = ["-cl-nv-arch sm_90a", "-cl-nv-arch=sm_90a", "-cl-nv-arch sm_90a -cl-nv-verbose"]
LOCAL_KIB = [32, 48, 64, 96, 160, 227]


def source(hide, warpgroups=1, tiles=TILES, peaks=PEAKS, swizzles=SWIZZLES, gemms=GEMMS,
           emulate=False):
    return program.render("wgmma_probe", hide=hide, tiles=list(tiles), peaks=list(peaks),
                          swizzles=list(swizzles), warpgroups=warpgroups, unroll=PEAK_UNROLL,
                          gemms=list(gemms), emulate=emulate)


def ptx_of(prg):
    """The PTX text NVIDIA's driver returns as a program's binary."""
    return prg.binaries[0].decode("utf-8", errors="replace").rstrip("\0")


def header(ptx):
    return [line for line in ptx.splitlines()[:40] if line.startswith((".version", ".target"))]


def retarget(ptx, target="sm_90a", version=(8, 0)):
    """``ptx`` with the "//@ " markers removed, ``target`` in ``.target`` and at least
    ``version`` in ``.version``."""
    text = ptx.replace("//@ ", "")
    text = re.sub(r"^\.target\s+sm_\w+", f".target {target}", text, count=1, flags=re.M)

    def bump(match):
        have = (int(match.group(1)), int(match.group(2)))
        return ".version %d.%d" % max(have, version)
    return re.sub(r"^\.version\s+(\d+)\.(\d+)", bump, text, count=1, flags=re.M)


def build_log(prg, ctx):
    try:
        return prg.get_build_info(ctx.device, cl.program_build_info.LOG)
    except (cl.Error, AttributeError):
        return ""


def try_build(ctx, text, options=()):
    """(program or None, log) of OpenCL C ``text``."""
    raw = cl._cl._Program(ctx.cl_context, text)
    try:
        raw.build(" ".join(options).encode(), [ctx.device])
        return cl.Program(raw), raw.get_build_info(ctx.device, cl.program_build_info.LOG)
    except cl.Error as e:
        try:
            log = raw.get_build_info(ctx.device, cl.program_build_info.LOG)
        except cl.Error:
            log = ""
        return None, f"{e}\n{log}"


def try_binary(ctx, ptx):
    """(program or None, log) of a PTX program binary."""
    try:
        prg = cl.Program(ctx.cl_context, [ctx.device], [ptx.encode() + b"\0"])
        prg.build()
        return prg, build_log(prg, ctx)
    except cl.Error as e:
        return None, str(e)


def sm90a_program(ctx, out, results, warpgroups=1):
    """A program of the probe kernels for sm_90a, by the first way that works (or None)."""
    hidden, log = try_build(ctx, source(True, warpgroups))
    if hidden is None:
        results.setdefault("errors", []).append(f"hidden build failed: {log[:2000]}")
        return None
    ptx = ptx_of(hidden)
    if warpgroups == 1:
        results["ptx"] = {"header": header(ptx), "markers": ptx.count("//@ ")}
        _write(out, "probe-sm90.ptx", ptx)
    prg, log = try_binary(ctx, retarget(ptx))
    if warpgroups == 1:
        results["retarget"] = {"ok": prg is not None, "log": log[:4000]}
        _write(out, "retarget.log", log)
    if prg is not None:
        return prg
    for opt in results.get("options", []):
        if opt["ok"]:
            built, _ = try_build(ctx, source(False, warpgroups), opt["option"].split())
            return built
    return None


def probe_options(ctx, out):
    rows = []
    for option in OPTIONS:
        prg, log = try_build(ctx, source(False, 1, TILES[:1], [], [], []), option.split())
        row = {"option": option, "ok": prg is not None, "log": log[:2000]}
        if prg is not None:
            row["header"] = header(ptx_of(prg))
        rows.append(row)
        _write(out, f"option-{len(rows)}.log", log)
    return rows


# -- tiles -------------------------------------------------------------------------------

def operand(rng, dt, rows, k):
    """(bits to upload, float64 values) of a rows x k operand whose values ``dt`` holds exactly."""
    if dt == "f16":
        h = rng.standard_normal((rows, k)).astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    f = rng.standard_normal((rows, k)).astype(np.float32)
    bits = f.view(np.uint32)
    if dt == "bf16":
        top = (bits >> 16).astype(np.uint16)
        return top, (top.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    bits = bits & np.uint32(0xFFFFE000)   # TF32: 10 mantissa bits kept
    return bits, bits.view(np.float32).astype(np.float64)


def layouts(rows_a, rows_b):
    """(name, a: (core_k, core_mn, lbo, sbo), b: same): two core-matrix layouts (the two
    16-byte columns of cores next to each other, or the row blocks next to each other), each
    with the descriptor's offsets read both ways."""
    out = []
    for name, ka, ma, kb, mb in (("k-inner", 128, 256, 128, 256),
                                 ("mn-inner", rows_a // 8 * 128, 128, rows_b // 8 * 128, 128)):
        out.append((f"{name} lbo=k sbo=mn", (ka, ma, ka, ma), (kb, mb, kb, mb)))
        out.append((f"{name} lbo=mn sbo=k", (ka, ma, ma, ka), (kb, mb, mb, kb)))
    return out


def run_tiles(ctx, prg, rng):
    rows = []
    for dt, n in TILES:
        kk = K[dt]
        abits, a = operand(rng, dt, 64, kk)
        bbits, b = operand(rng, dt, n, kk)
        ref = a @ b.T
        mf = cl.mem_flags
        abuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=abits)
        bbuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bbits)
        dbuf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, 64 * n * 4)
        kernel = cl.Kernel(prg, f"wgmma_tile_{dt}_n{n}")
        for name, la, lb in layouts(64, n):
            d = np.full((64, n), np.nan, np.float32)
            cl.enqueue_copy(ctx.queue, dbuf, d)
            kernel.set_args(abuf, bbuf, dbuf, *(np.int32(v) for v in la + lb))
            try:
                cl.enqueue_nd_range_kernel(ctx.queue, kernel, (128,), (128,))
                cl.enqueue_copy(ctx.queue, d, dbuf)
                ctx.queue.finish()
            except cl.Error as e:
                rows.append({"dtype": dt, "n": n, "layout": name, "error": str(e)})
                continue
            scale = float(np.abs(ref).max())
            err = float(np.nanmax(np.abs(d - ref)) / scale) if np.isfinite(d).all() else math.inf
            permuted = bool(np.isfinite(d).all() and np.allclose(np.sort(d, None),
                                                                  np.sort(ref, None),
                                                                  rtol=0, atol=1e-5 * scale))
            rows.append({"dtype": dt, "n": n, "layout": name, "rel_error": err,
                         "right": err <= 1e-5, "permuted": permuted and err > 1e-5})
    return rows


def swizzled(bits_of, width, bits):
    """``bits_of`` (rows x KW values of ``width`` bytes a row) placed as the swizzle kernel
    places them: the flat array of local memory it writes."""
    rows, kw = bits_of.shape
    size = width // kw
    out = np.zeros(rows * width // size, bits_of.dtype)
    for r in range(rows):
        for k in range(kw):
            o = r * width + k * size
            o ^= ((o >> 7) & ((1 << bits) - 1)) << 4
            out[o // size] = bits_of[r, k]
    return out


def run_swizzles(ctx, prg, rng):
    """Each swizzle mode with the stride offset of an 8-row atom (and 1024 bytes), the leading
    offset 16 bytes (unused by K-major swizzled layouts whose rows hold the whole K)."""
    rows = []
    mf = cl.mem_flags
    for dt, n in SWIZZLES:
        size = 4 if dt == "tf32" else 2
        kernel = cl.Kernel(prg, f"wgmma_swizzle_{dt}_n{n}")
        for width, bits, code in SWIZZLE_MODES:
            kw = width // size
            abits, a = operand(rng, dt, 64, kw)
            bbits, b = operand(rng, dt, n, kw)
            ref = a @ b.T
            abuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=abits)
            bbuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bbits)
            dbuf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, 64 * n * 4)
            for sbo in sorted({8 * width, 1024}):
                d = np.full((64, n), np.nan, np.float32)
                cl.enqueue_copy(ctx.queue, dbuf, d)
                kernel.set_args(abuf, bbuf, dbuf, *(np.int32(v) for v in
                                                    (width, bits, code, 16, sbo)))
                row = {"dtype": dt, "n": n, "width": width, "sbo": sbo}
                try:
                    cl.enqueue_nd_range_kernel(ctx.queue, kernel, (128,), (128,))
                    cl.enqueue_copy(ctx.queue, d, dbuf)
                    ctx.queue.finish()
                except cl.Error as e:
                    rows.append(dict(row, error=str(e)))
                    continue
                scale = float(np.abs(ref).max())
                err = float(np.abs(d - ref).max() / scale) if np.isfinite(d).all() else math.inf
                rows.append(dict(row, rel_error=err, right=err <= 1e-5))
    return rows


# -- GEMM ------------------------------------------------------------------------------

# TF32 keeps 10 mantissa bits; the tensor cores read the top 19 bits of float32 (truncation):
# about 2^-10 relative per operand, 2^-9 per product, sqrt(K) for random signs; the check
# allows 3e-3 * sqrt(K) * max|a| * max|b|, as benchmarks/gemm_tf32.py.
GEMM_BOUND = 3e-3


def gemm_case(ctx, prg, variant, M, N, K, rng, sbo, layout, repeat=5):
    """One wgmma GEMM kernel on M x N x K: its error on 64 sampled rows against float64 (and
    the bound), and with ``repeat`` its TFLOP/s (OpenCL events, median); every element of C
    must be written (C starts as NaN)."""
    dt, bn, stages, wait = variant
    abits, a = operand(rng, dt, M, K)
    bbits, b = operand(rng, dt, N, K)
    mf = cl.mem_flags
    abuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=abits)
    bbuf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=bbits)
    c = np.full((M, N), np.nan, np.float32)
    cbuf = cl.Buffer(ctx.cl_context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=c)
    kernel = cl.Kernel(prg, f"wgmma_gemm_{dt}_n{bn}_s{stages}_w{wait}")
    kernel.set_args(abuf, bbuf, cbuf, *(np.int32(v) for v in (M, N, K, sbo, layout)))

    def run():
        cl.enqueue_nd_range_kernel(ctx.queue, kernel, (M // 128 * 256, N // bn), (256, 1))
    run()
    cl.enqueue_copy(ctx.queue, c, cbuf)
    ctx.queue.finish()
    rows = rng.choice(M, size=min(64, M), replace=False)
    ref = a[rows] @ b.T
    bound = GEMM_BOUND * math.sqrt(K) * float(np.abs(a).max()) * float(np.abs(b).max())
    err = float(np.abs(c[rows] - ref).max()) if np.isfinite(c).all() else math.inf
    out = {"variant": f"{dt} n{bn} s{stages} w{wait}", "dtype": dt, "M": M, "N": N, "K": K,
           "err_over_bound": err / bound}
    if repeat and err <= bound:
        seconds = time_enqueued(ctx, run, repeat=repeat).median
        out["tflops"] = 2.0 * M * N * K / seconds / 1e12
    return out


def gemm_layout(swizzles, dt):
    """(sbo, layout code) of the 64-byte swizzle that the tile check found right for ``dt``
    (tf32, or f16 for the 16-bit types: the layout is in bytes), or None."""
    want = "tf32" if dt == "tf32" else "f16"
    for r in swizzles:
        if r["dtype"] == want and r["width"] == 64 and r.get("right"):
            return r["sbo"], 2
    return None


# -- peaks -------------------------------------------------------------------------------

class WgmmaPeak:
    """``groups`` work-groups of the peak kernel (dt, n), ``trips`` trips each."""

    def __init__(self, ctx, prg, dt, n, warpgroups, groups):
        self.ctx, self.dt, self.n = ctx, dt, n
        self.kernel = cl.Kernel(prg, f"wgmma_peak_{dt}_n{n}")
        self.local = 128 * warpgroups
        self.items = self.local * groups
        self.y = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, self.items * 4)
        self.set_trips(1)

    def set_trips(self, trips):
        self.trips = int(trips)
        self.kernel.set_args(self.y, np.int32(self.trips))

    @property
    def flops(self):
        return 2.0 * 64 * self.n * K[self.dt] * PEAK_UNROLL * self.trips * (self.items // 128)

    def run(self):
        cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, (self.items,), (self.local,))

    def calibrate(self, target_s):
        trips = 16
        for _ in range(12):
            self.set_trips(trips)
            seconds = time_enqueued(self.ctx, self.run, warmup=1, repeat=1).median
            if seconds >= target_s / 2:
                break
            trips = int(trips * min(16.0, max(2.0, target_s / max(seconds, 1e-6))))
        # Each accumulator must stay an exact float32 integer (K * unroll * trips < 2^24).
        limit = (1 << 24) // (K[self.dt] * PEAK_UNROLL * (self.n // 2)) - 1
        self.set_trips(max(1, min(limit, int(trips * target_s / max(seconds, 1e-6)))))

    def verify(self):
        y = np.full(self.items, np.nan, np.float32)
        cl.enqueue_copy(self.ctx.queue, self.y, y)
        self.run()
        cl.enqueue_copy(self.ctx.queue, y, self.y)
        self.ctx.queue.finish()
        expected = float(K[self.dt] * PEAK_UNROLL * self.trips * (self.n // 2))
        return float(np.max(np.abs(y - expected)) / expected) if np.isfinite(y).all() else math.inf


def run_peaks(ctx, programs):
    rows = []
    for warpgroups, prg in programs.items():
        for dt, n in PEAKS:
            for per_cu in (1, 2, 4):
                probe = WgmmaPeak(ctx, prg, dt, n, warpgroups, ctx.info.compute_units * per_cu)
                try:
                    probe.calibrate(0.01)
                    error = probe.verify()
                    seconds = time_enqueued(ctx, probe.run, repeat=5).median
                except cl.Error as e:
                    rows.append({"dtype": dt, "n": n, "warpgroups": warpgroups,
                                 "groups_per_cu": per_cu, "error": str(e)})
                    continue
                rows.append({"dtype": dt, "n": n, "warpgroups": warpgroups,
                             "groups_per_cu": per_cu, "rel_error": error,
                             "tflops": probe.flops / seconds / 1e12 if error == 0 else 0.0})
    return rows


def mma_sync_ceiling(ctx):
    probe = peak.MmaProbe(types.SimpleNamespace(ctx=ctx), ctx.info.compute_units * 16)
    probe.calibrate(0.01)
    error = probe.verify()
    seconds = time_enqueued(ctx, probe.run, repeat=5).median
    return probe.flops / seconds / 1e12 if error <= 1e-6 else 0.0


def cublas_rates():
    """cuBLAS TF32 and fp16 GEMM at 8192^3 (CUDA events, median of 10), TFLOP/s; {} without
    torch on a GPU."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = True
    rates = {}
    for s, name, dtype in ((4096, "tf32 4096", torch.float32), (8192, "tf32", torch.float32),
                           (4096, "f16 4096", torch.float16), (8192, "f16", torch.float16),
                           (4096, "bf16 4096", torch.bfloat16), (8192, "bf16", torch.bfloat16)):
        a = torch.randn(s, s, device="cuda", dtype=dtype)
        b = torch.randn(s, s, device="cuda", dtype=dtype)
        c = torch.empty(s, s, device="cuda", dtype=dtype)
        times = []
        for i in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end) / 1e3)
        rates[name] = 2.0 * s ** 3 / float(np.median(times)) / 1e12
        del a, b, c
    return rates


# -- local memory at launch --------------------------------------------------------------

def run_local(ctx, prg):
    rows = []
    kernel = prg.local_probe
    items = 256
    y = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, items * 4)
    for kib in LOCAL_KIB:
        n = kib * 1024 // 4
        kernel.set_args(y, cl.LocalMemory(n * 4), np.int32(n))
        host = np.full(items, np.nan, np.float32)
        try:
            cl.enqueue_nd_range_kernel(ctx.queue, kernel, (items,), (items,))
            cl.enqueue_copy(ctx.queue, host, y)
            ctx.queue.finish()
        except cl.Error as e:
            rows.append({"kib": kib, "ok": False, "error": str(e)})
            continue
        expected = np.array([sum(float(n - 1 - i) for i in range(t, n, items))
                             for t in range(items)])
        rows.append({"kib": kib, "ok": bool(np.allclose(host, expected, rtol=1e-6))})
    return rows


def _write(out, name, text):
    if out:
        with open(os.path.join(out, name), "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device")
    ap.add_argument("--json")
    ap.add_argument("--out", help="folder for the PTX and the build logs")
    args = ap.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    ctx = dp.Context(args.device)
    info = ctx.info
    results = {"device": info.name, "driver": info.driver_version,
               "architecture": info.architecture, "commit": os.environ.get("DLPRIM_COMMIT"),
               "local_mem_size": info.local_mem_size}
    print(f"device: {info.name} ({info.architecture}), driver {info.driver_version}, "
          f"local memory {info.local_mem_size} bytes")

    def save():
        # After every step: a later step that hangs or kills the process keeps the earlier ones.
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        sys.stdout.flush()
    if info.vendor != "nvidia" or info.architecture != "nvidia:sm_90":
        print("this probe needs an NVIDIA device of compute capability 9.0 (wgmma)")
        results["skipped"] = "not an NVIDIA sm_90 device"
    else:
        started = time.perf_counter()
        results["options"] = probe_options(ctx, args.out)
        for row in results["options"]:
            print(f"option {row['option']!r}: {'built' if row['ok'] else 'refused'} "
                  f"{row.get('header', '')} {'' if row['ok'] else row['log'][:200]!r}")
        save()
        prg = sm90a_program(ctx, args.out, results)
        save()
        print(f"compiler's PTX header: {results.get('ptx', {}).get('header')}; retargeted "
              f"binary: {'built' if results.get('retarget', {}).get('ok') else 'refused'}")
        if not results.get("retarget", {}).get("ok"):
            print(results.get("retarget", {}).get("log", "")[:1500])
        plain, _ = try_build(ctx, source(True, 1, [], [], [], []))
        if plain is not None:
            results["local"] = run_local(ctx, plain)
            print("local memory at launch: " + ", ".join(
                f"{r['kib']} KiB {'ok' if r['ok'] else 'refused'}" for r in results["local"]))
        if prg is not None:
            rng = np.random.default_rng(0)
            results["tiles"] = run_tiles(ctx, prg, rng)
            for r in results["tiles"]:
                print(f"tile {r['dtype']:4} n{r['n']:<3} {r['layout']:22} "
                      + (f"error {r['error']}" if "error" in r else
                         f"rel err {r['rel_error']:.2e} {'RIGHT' if r['right'] else ''}"
                         f"{'permuted' if r['permuted'] else ''}"))
            save()
            results["swizzles"] = run_swizzles(ctx, prg, rng)
            save()
            for r in results["swizzles"]:
                print(f"swizzle {r['dtype']:4} n{r['n']:<3} {r['width']:3} B sbo {r['sbo']:4} "
                      + (f"error {r['error']}" if "error" in r else
                         f"rel err {r['rel_error']:.2e} {'RIGHT' if r['right'] else ''}"))
            results["gemm"] = []
            for size in (4096, 8192):
                for variant in GEMMS:
                    layout = gemm_layout(results["swizzles"], variant[0])
                    if layout is None:
                        print(f"gemm {variant}: no 64-byte swizzled layout checked right")
                        continue
                    try:
                        row = gemm_case(ctx, prg, variant, size, size, size, rng, *layout)
                    except cl.Error as e:
                        results["gemm"].append({"variant": str(variant), "M": size,
                                                "error": str(e)})
                        print(f"gemm {variant} {size}^3: {e}")
                        continue
                    results["gemm"].append(row)
                    save()
                    print(f"gemm {row['variant']:12} {size}^3: err/bound "
                          f"{row['err_over_bound']:.3f} "
                          + (f"{row['tflops']:.1f} TFLOP/s" if "tflops" in row else "WRONG"))
            programs = {1: prg}
            for wg in (2, 3):
                more = sm90a_program(ctx, args.out, results, wg)
                if more is not None:
                    programs[wg] = more
            results["peaks"] = run_peaks(ctx, programs)
            save()
            results["mma_sync_ceiling"] = mma_sync_ceiling(ctx)
            results["cublas"] = cublas_rates()
            print(f"mma.sync TF32 ceiling {results['mma_sync_ceiling']:.1f} TFLOP/s; cuBLAS "
                  + ", ".join(f"{k} {v:.1f}" for k, v in results["cublas"].items()))
            print("| dtype | n | warpgroups | groups/CU | TFLOP/s | check |")
            print("|---|---|---|---|---|---|")
            for r in results["peaks"]:
                print(f"| {r['dtype']} | {r['n']} | {r['warpgroups']} | {r['groups_per_cu']} | "
                      + (f"- | {r['error'][:60]} |" if "error" in r else
                         f"{r['tflops']:.1f} | {r['rel_error']:.1e} |"))
        results["seconds"] = time.perf_counter() - started
    save()


if __name__ == "__main__":
    main()
