"""torchvision classifiers exported to ONNX and run by dp.onnx, against PyTorch eager.

    python benchmarks/onnx.py                      # six models, batch 64 and 1, 224x224
    python benchmarks/onnx.py --models resnet50 --batch 64 --first-call --json out.json
    python benchmarks/onnx.py --quick --torch-device cpu      # tiny images (PoCL)
    python benchmarks/onnx.py --models resnet50 --batch 64 --tf32   # TF32 on both sides

Each model (torchvision's, seeded random weights) is exported with torch's TorchScript
exporter (opset 17, dynamic batch), loaded with ``dp.onnx.load`` and checked against PyTorch in
float64 on the CPU (MIOpen's metric, under 1e-4 or within 10x PyTorch float32's own error);
then ``model(x)`` is timed by wall clock with the device drained (``queue.finish()``) against
PyTorch eager on the same weights and images (TF32 off, or with --tf32 on for both: our
``ctx.allow_tf32`` and torch's cudnn / cuda.matmul ``allow_tf32``;
``torch.cuda.synchronize()``), median
after a warm-up, in the same process. Also reported: planning time (load + first call) in this
process (``plan warm``: kernels from the disk cache) and, with --first-call, in fresh processes
with empty kernel caches (``plan cold``) and with the cache that left (``warm disk``); and peak
device memory, ours (``model.memory_bytes`` + weights + input) against
``torch.cuda.max_memory_allocated()`` over one inference.
"""
import argparse
import json
import os
import platform
import sys
import time

# This file's folder leaves the path: its name would hide the onnx package from torch's
# exporter ("import onnx" would find this script).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.join(_HERE, ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import onnx as onnx_bench  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(onnx_bench.MODELS),
                   help="comma-separated torchvision models (default "
                        f"{','.join(onnx_bench.MODELS)})")
    p.add_argument("--batch", default=None, help="comma-separated batch sizes (default 64,1)")
    p.add_argument("--image-size", type=int, default=None, help="square image side (default 224)")
    p.add_argument("--exporter", default="ts17", choices=("ts13", "ts17", "dynamo"),
                   help="torch's exporter: TorchScript at opset 13 / 17, or dynamo (default ts17)")
    p.add_argument("--quick", action="store_true",
                   help="resnet18 and mobilenet_v2 on 64x64 images, batch 2, 2 repeats")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3)")
    p.add_argument("--repeat", type=int, default=None, help="timed calls (default 10)")
    p.add_argument("--budget", type=float, default=None, help="seconds of timed calls per side")
    p.add_argument("--torch-device", default=None, help="cuda, cpu (default: cuda if available)")
    p.add_argument("--first-call", action="store_true",
                   help="planning time in fresh processes with empty kernel caches (cold) and "
                        "with the cache they left")
    p.add_argument("--device", default=None, help="OpenCL device (P:D or part of its name)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    p.add_argument("--commit", default=None, help="commit to record (a copy without git)")
    p.add_argument("--tf32", action="store_true",
                   help="TF32 allowed for us (ctx.allow_tf32) and PyTorch (cudnn and "
                        "cuda.matmul allow_tf32); the check then takes TF32's error")
    args = p.parse_args(argv)
    if args.quick and args.models == ",".join(onnx_bench.MODELS):
        args.models = "resnet18,mobilenet_v2"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.batch = ([int(b) for b in args.batch.split(",") if b.strip()] if args.batch
                  else [2] if args.quick else [64, 1])
    args.image_size = args.image_size or (64 if args.quick else 224)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.repeat = args.repeat or (2 if args.quick else 10)
    return args


def _fmt(value, spec):
    if value is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 1)
    return format(value, spec)


def _mib(value):
    return None if value is None else value / 2 ** 20


def print_table(results, out=sys.stdout):
    head = (f"{'model':16s} {'batch':>5s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} "
            f"{'error':>8s} {'plan warm s':>11s} {'plan cold s':>11s} {'ours MiB':>9s} "
            f"{'torch MiB':>9s}  status")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        print(f"{r['model']:16s} {r['batch']:5d} {_fmt(r.get('ours_ms'), '9.2f')} "
              f"{_fmt(r.get('torch_ms'), '9.2f')} {_fmt(r.get('ratio'), '10.2f')} "
              f"{_fmt(r.get('error'), '8.1e')} {_fmt(r.get('plan_warm_s'), '11.2f')} "
              f"{_fmt(r.get('plan_cold_s'), '11.2f')} "
              f"{_fmt(_mib(r.get('ours_peak_bytes')), '9.1f')} "
              f"{_fmt(_mib(r.get('torch_peak_bytes')), '9.1f')}  {r.get('status', '')}",
              file=out, flush=True)


def main(argv=None):
    args = parse_args(argv)
    ctx = dp.Context(args.device)
    ctx.allow_tf32 = True if args.tf32 else None
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        print(f"torch / torchvision not importable ({e}): nothing to export or compare with",
              file=sys.stderr)
        return 2
    torch_device = onnx_bench.torch_device_for(args.torch_device)
    onnx_bench.setup_torch_baseline(torch_device, args.tf32)
    torch_info = {"version": torch.__version__, "device": torch_device, "tf32": args.tf32,
                  "cudnn_benchmark": torch_device.startswith("cuda"),
                  "threads": torch.get_num_threads()}
    if torch_device.startswith("cuda"):
        torch_info.update(cuda_device=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                          cudnn=torch.backends.cudnn.version())
    print(f"dlprim_py onnx on {ctx.info.name} ({ctx.info.platform_name}, driver "
          f"{ctx.info.driver_version}); torch {torch.__version__} on {torch_device}; images "
          f"{args.image_size}x{args.image_size}", flush=True)
    results = []
    started = time.perf_counter()
    for name in args.models:
        for batch in args.batch:
            try:
                r = onnx_bench.run_case(
                    ctx, name, batch, args.image_size, torch_device=torch_device,
                    warmup=args.warmup, repeat=args.repeat, budget_s=args.budget,
                    first_call=args.first_call, exporter=args.exporter, tf32=args.tf32,
                    log=lambda text: print("  " + text, file=sys.stderr, flush=True))
            except Exception as e:  # keep the other cases; the failure is a result
                first = (str(e).strip().splitlines() or [""])[0][:200]
                r = {"model": name, "batch": batch,
                     "status": f"failed: {type(e).__name__}: {first}"}
            results.append(r)
            print(f"{name} n{batch}: ours {_fmt(r.get('ours_ms'), '.2f')} ms, torch "
                  f"{_fmt(r.get('torch_ms'), '.2f')} ms, error {_fmt(r.get('error'), '.1e')}: "
                  f"{r['status']}", flush=True)
    print("", flush=True)
    print_table(results)
    ratios = [r["ratio"] for r in results if r.get("ratio") and r["status"] == "ok"]
    if ratios:
        print(f"geomean torch/ours {geomean(ratios):.3f} over {len(ratios)} cases")
    ok = all(r["status"] == "ok" for r in results)
    if args.json:
        report = dict(
            benchmark="onnx", commit=measured_commit(args.commit),
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
            device=ctx.info.name, platform=ctx.info.platform_name,
            driver=ctx.info.driver_version, version=dp.__version__, torch=torch_info,
            host={"machine": platform.machine(), "cpus": os.cpu_count(),
                  "python": sys.version.split()[0]},
            options={k: v for k, v in vars(args).items() if k not in ("json",)},
            timing="host wall clock per call, device drained after each; median after warm-up",
            memory="ours: memory_bytes + weight_bytes + input; torch: max_memory_allocated",
            all_ok=ok, seconds=time.perf_counter() - started,
            geomean_torch_over_ours=geomean(ratios) if ratios else None, results=results)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
