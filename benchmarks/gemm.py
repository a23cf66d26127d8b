"""SGEMM benchmark: dlprim_py against the vendor library, measured in the same run.

    python benchmarks/gemm.py [--squares 1024,2048] [--batch 32] [--only TEXT]
                              [--device SPEC] [--algorithms auto,tiled,subgroup]
                              [--intel-runtime] [--note TEXT]
                              [--output benchmarks/results/gemm-X.json]

Shapes: square 1024..8192 and the GEMMs of ResNet-50's convolutions at ``--batch`` images
(M = output channels, N = batch * output pixels, K = input channels * kernel area, as an
im2col convolution multiplies them) plus its classifier. Every result is checked against a
float64 reference on sampled rows before it is timed.

Baseline: with a CUDA device in PyTorch, cuBLAS SGEMM through ``torch.mm`` with TF32 off, timed
with CUDA events (median after a warm-up). Otherwise numpy's matmul (host BLAS), timed with the
host clock. Ours: OpenCL profiling markers around the enqueued plan (median after a warm-up).

``--algorithms`` times each shape once per GEMM algorithm ("auto": the tuning database's
choice; "tiled", "splitk", "small", "subgroup": forced), on the same data, beside one baseline
time per shape. ``--intel-runtime`` runs the benchmark on Intel's OpenCL CPU runtime installed
from pip (intel-opencl-rt, intel-cmplr-lib-rt): the script starts itself again with an
environment that registers it (OCL_ICD_VENDORS, LD_LIBRARY_PATH; the ICD loader reads them at
process start only) and selects its device.
"""
import argparse
import glob
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from importlib import metadata

import numpy as np
import pyopencl as cl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402
from dlprim_py.launch import kernel_events  # noqa: E402
from dlprim_py.ops.gemm import GemmPlan  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

SQUARE = [1024, 2048, 4096, 8192]
# ResNet-50 (torchvision, stride in the 3x3): (name, Cout, Cin * kh * kw, output pixels).
RESNET50_CONVS = [
    ("conv1 7x7 s2", 64, 3 * 49, 112 * 112),
    ("l1 1x1 64->64", 64, 64, 56 * 56),
    ("l1 3x3 64", 64, 576, 56 * 56),
    ("l1 1x1 64->256", 256, 64, 56 * 56),
    ("l1 1x1 256->64", 64, 256, 56 * 56),
    ("l2 1x1 256->128", 128, 256, 56 * 56),
    ("l2 3x3 128 s2", 128, 1152, 28 * 28),
    ("l2 1x1 128->512", 512, 128, 28 * 28),
    ("l2 1x1 512->128", 128, 512, 28 * 28),
    ("l2 down 256->512 s2", 512, 256, 28 * 28),
    ("l3 1x1 512->256", 256, 512, 28 * 28),
    ("l3 3x3 256 s2", 256, 2304, 14 * 14),
    ("l3 1x1 256->1024", 1024, 256, 14 * 14),
    ("l3 1x1 1024->256", 256, 1024, 14 * 14),
    ("l3 down 512->1024 s2", 1024, 512, 14 * 14),
    ("l4 1x1 1024->512", 512, 1024, 14 * 14),
    ("l4 3x3 512 s2", 512, 4608, 7 * 7),
    ("l4 1x1 512->2048", 2048, 512, 7 * 7),
    ("l4 1x1 2048->512", 512, 2048, 7 * 7),
    ("l4 down 1024->2048 s2", 2048, 1024, 7 * 7),
]


def shapes(batch, squares=SQUARE):
    out = [(f"square {s}", s, s, s, "square") for s in squares]
    for name, cout, k, pixels in RESNET50_CONVS:
        out.append((name, cout, batch * pixels, k, "resnet50-conv"))
    out.append(("fc 2048->1000", batch, 1000, 2048, "resnet50-fc"))
    return out


def cuda_torch():
    """torch with TF32 off when it sees a CUDA device, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def cuda_mm_median(torch, ta, tb, out, repeat):
    """Median seconds of torch.mm(ta, tb, out=out) between CUDA events, after a warm-up."""
    for _ in range(3):
        torch.mm(ta, tb, out=out)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(ta, tb, out=out)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return float(np.median(samples))


class Baseline:
    """cuBLAS through PyTorch (TF32 off) when CUDA is there, else numpy's matmul."""

    def __init__(self):
        self.torch = cuda_torch()
        if self.torch is not None:
            self.name = f"cuBLAS (torch {self.torch.__version__}, TF32 off)"
            self.device = self.torch.cuda.get_device_name(0)
        else:
            self.name = f"numpy {np.__version__} matmul"
            self.device = platform.processor() or platform.machine()

    def time(self, a, b, repeat):
        """Median seconds of a @ b (float32)."""
        if self.torch is None:
            a @ b
            samples = []
            for _ in range(max(3, repeat // 4)):
                t0 = time.perf_counter()
                a @ b
                samples.append(time.perf_counter() - t0)
            return float(np.median(samples)), None
        torch = self.torch
        ta = torch.from_numpy(a).cuda()
        tb = torch.from_numpy(b).cuda()
        out = torch.mm(ta, tb)
        seconds = cuda_mm_median(torch, ta, tb, out, repeat)
        ref = out.cpu().numpy()
        del ta, tb, out
        return seconds, ref


def run(args):
    ctx = dp.Context(args.device)
    baseline = Baseline()
    rng = np.random.default_rng(7)
    rows = []
    print(f"device: {ctx.info.name} | {ctx.info.platform_name} | driver {ctx.info.driver_version}")
    print(f"baseline: {baseline.name} on {baseline.device}")
    header = f"{'shape':24s} {'M':>6s} {'N':>7s} {'K':>6s} {'ours ms':>9s} {'GFLOP/s':>8s} " \
             f"{'base ms':>9s} {'GFLOP/s':>8s} {'ratio':>6s}  algorithm"
    print(header)
    squares = [int(x) for x in args.squares.split(",") if x.strip()]
    selected = [s for s in shapes(args.batch, squares) if args.only is None or args.only in s[0]]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    for (name, M, N, K, group), forced in ((s, f) for s in selected for f in algorithms):
        flops = 2.0 * M * N * K
        if forced == algorithms[0]:   # one set of operands and one baseline time per shape
            a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
            b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
            base = None
        mf = cl.mem_flags
        a_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        b_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
        c_buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, M * N * 4)
        cl.enqueue_fill_buffer(ctx.queue, c_buf, np.float32(np.nan), 0, M * N * 4)
        plan = GemmPlan(ctx, M, N, K, a_buf, 0, K, b_buf, 0, N, c_buf, 0, N,
                        algorithm=None if forced == "auto" else forced)
        plan.enqueue()
        out = np.empty((M, N), np.float32)
        cl.enqueue_copy(ctx.queue, out, c_buf, is_blocking=True)
        sample = np.unique(np.concatenate([[0, M - 1], rng.integers(0, M, 32)]))
        ref = a[sample].astype(np.float64) @ b.astype(np.float64)
        got = out[sample].astype(np.float64)
        error = float(np.linalg.norm(got - ref) / (math.sqrt(got.size) * np.abs(ref).max())) \
            if np.isfinite(got).all() else math.inf
        repeat = max(10, min(100, int(1.0 / max(flops / 4e13, 1e-5))))
        if ctx.info.is_cpu:
            repeat = 3
        ours = time_enqueued(ctx, plan.enqueue, warmup=1 if ctx.info.is_cpu else 5, repeat=repeat)
        # The same plan timed by the kernel's own event, a check on the marker method.
        kernel_only = None
        if plan.algorithm != "splitk" and not ctx.info.is_cpu:
            with kernel_events() as events:
                for _ in range(min(repeat, 10)):
                    plan.enqueue()
            ctx.queue.finish()
            kernel_only = float(np.median([(e.profile.end - e.profile.start) * 1e-9
                                           for _, e in events]))
        if base is None:
            base = baseline.time(a, b, repeat)
        base_s, base_out = base
        base_error = None
        if base_out is not None:
            base_error = float(np.linalg.norm(base_out[sample].astype(np.float64) - ref)
                               / (math.sqrt(got.size) * np.abs(ref).max()))
        for buf in (a_buf, b_buf, c_buf):
            buf.release()
        row = {"name": name, "group": group, "m": M, "n": N, "k": K, "requested": forced,
               "ours_ms": ours.median * 1e3, "ours_p20_ms": ours.p20 * 1e3,
               "ours_p80_ms": ours.p80 * 1e3,
               "ours_kernel_event_ms": kernel_only * 1e3 if kernel_only else None,
               "ours_tflops": flops / ours.median / 1e12,
               "baseline_ms": base_s * 1e3, "baseline_tflops": flops / base_s / 1e12,
               "ratio": base_s / ours.median, "error": error, "baseline_error": base_error,
               "algorithm": plan.algorithm, "params": plan.params, "splits": plan.splits
               if plan.algorithm != "small" else 1}
        rows.append(row)
        ok = "" if error <= 1e-5 else f"  WRONG (error {error:.1e})"
        print(f"{name:24s} {M:6d} {N:7d} {K:6d} {row['ours_ms']:9.4f} {row['ours_tflops'] * 1e3:8.1f} "
              f"{row['baseline_ms']:9.4f} {row['baseline_tflops'] * 1e3:8.1f} {row['ratio']:6.3f}  "
              f"{_short(plan)}{ok}")
    if args.build_log and ctx.info.vendor == "nvidia":
        print_build_log(ctx, 4096, 4096, 4096)
    conv = [r["ratio"] for r in rows if r["group"] == "resnet50-conv"]
    summary = {}
    if conv:
        summary["resnet50_conv_ratio_geomean"] = geomean(conv)
        summary["resnet50_conv_ratio_min"] = float(min(conv))
        total_ours = sum(r["ours_ms"] for r in rows if r["group"] == "resnet50-conv")
        total_base = sum(r["baseline_ms"] for r in rows if r["group"] == "resnet50-conv")
        summary["resnet50_conv_total_ratio"] = total_base / total_ours
    for r in rows:
        if r["name"] == "square 4096":
            summary["square_4096_ratio"] = r["ratio"]
    print("summary:", json.dumps(summary))
    result = {"benchmark": "gemm", "device": ctx.info.name, "platform": ctx.info.platform_name,
              "driver": ctx.info.driver_version, "opencl_version": ctx.info.version,
              "baseline": baseline.name, "baseline_device": baseline.device,
              "commit": measured_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "batch": args.batch, "timing": "median of OpenCL profiling markers after warm-up",
              "summary": summary, "rows": rows}
    if args.note:
        result["note"] = args.note
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.output}")
    return result


def print_build_log(ctx, M, N, K):
    """NVIDIA's resource report (registers, spills, local memory) for the kernel of M x N x K."""
    from dlprim_py import program
    from dlprim_py.ops.gemm import GemmConfig, render_params, select_params
    params = select_params(ctx, M, N, K)
    # As a plan builds it: a register cap without the work-group size declaration.
    options = ("-cl-nv-verbose",)
    derived = GemmConfig(global_vec=params.get("global_vec", 1))
    if params.get("max_registers"):
        options += (f"-cl-nv-maxrregcount={int(params['max_registers'])}",)
        derived = GemmConfig(global_vec=params.get("global_vec", 1), reqd_size=0)
    template, values = render_params(params, derived)
    built = program.build(ctx, template, values, options=options)
    log = built.program.get_build_info(ctx.device, cl.program_build_info.LOG)
    print(f"build log of {params}:\n{log.strip()}")


def _short(plan):
    p = plan.params
    if p["solver"] == "small":
        return "small"
    if p["solver"] == "subgroup":
        return (f"subgroup sg{p['sg_size']} w{p['wpt_m']}x{p['wpt_n']} g{p['sg_groups']} "
                f"block{plan.config.block_a}{plan.config.block_b}")
    text = f"{p['tile_m']}x{p['tile_n']}x{p['tile_k']} w{p['wpt_m']}x{p['wpt_n']} v{p['vec']} " \
           f"p{p['pad']} db{p['double_buffer']}"
    if plan.algorithm == "splitk":
        text += f" split{plan.splits}"
    if p.get("max_registers"):
        text += f" r{p['max_registers']}"
    return text


_INTEL_STARTED = "DLPRIM_BENCH_INTEL_RUNTIME"


def _start_on_intel_runtime(argv):
    """Run this script again in an environment that registers Intel's pip OpenCL runtime: an
    ICD file naming libintelocl.so by its absolute path (the wheel's own names a placeholder),
    beside copies of /etc/OpenCL/vendors/*, and the runtime's library directories."""
    def files(package):
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            return []
        return [dist.locate_file(f).resolve() for f in dist.files or ()]

    library = [f for f in files("intel-opencl-rt") if f.name == "libintelocl.so"]
    if not library:
        sys.exit("--intel-runtime: pip install intel-opencl-rt intel-cmplr-lib-rt first")
    dirs = [str(library[0].parent)]
    for package in ("tbb", "intel-cmplr-lib-rt", "tcmlib"):
        for f in files(package):
            if f.suffix == ".so" and str(f.parent) not in dirs:
                dirs.append(str(f.parent))
    vendors = tempfile.mkdtemp(prefix="dlprim-icd-")
    for icd in glob.glob("/etc/OpenCL/vendors/*.icd"):
        shutil.copy(icd, vendors)
    with open(os.path.join(vendors, "dlprim-intel-cpu.icd"), "w", encoding="utf-8") as f:
        f.write(f"{library[0]}\n")
    env = dict(os.environ, OCL_ICD_VENDORS=vendors, **{_INTEL_STARTED: "1"})
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + argv, env)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="images for the ResNet-50 shapes")
    parser.add_argument("--squares", default=",".join(str(s) for s in SQUARE),
                        help="comma-separated sizes of the square problems")
    parser.add_argument("--device", default=None)
    parser.add_argument("--only", default=None, help="only shapes whose name contains this")
    parser.add_argument("--output", default=None, help="JSON result file")
    parser.add_argument("--commit", default=None,
                        help="commit to record (for copies of the tree without git metadata)")
    parser.add_argument("--build-log", action="store_true",
                        help="print NVIDIA's register report of the 4096^3 kernel")
    parser.add_argument("--algorithms", default="auto",
                        help="comma-separated: auto (the database's choice), tiled, splitk, "
                             "small, subgroup; each shape is timed with each")
    parser.add_argument("--intel-runtime", action="store_true",
                        help="run on Intel's OpenCL CPU runtime installed from pip")
    parser.add_argument("--note", default=None, help="a remark stored in the JSON record")
    args = parser.parse_args(argv)
    if args.intel_runtime and not os.environ.get(_INTEL_STARTED):
        _start_on_intel_runtime(sys.argv if argv is None else [sys.argv[0]] + list(argv))
    if args.intel_runtime:
        args.device = args.device or "Intel(R) OpenCL"
    if args.commit:
        os.environ["DLPRIM_COMMIT"] = args.commit
    run(args)


if __name__ == "__main__":
    main()
