"""Whole networks (ResNet-18, ResNet-50, MobileNetV2) in dlprim_py.functional vs PyTorch eager.

The networks are written with ``dlprim_py.functional`` and run as users run them, against
PyTorch eager with the same weights, in the same process.

    python benchmarks/nets.py                     # every net: infer n64, infer n1, train n32
    python benchmarks/nets.py --nets resnet50 --modes infer --infer-batches 64 --repeat 20
    python benchmarks/nets.py --first-call --json benchmarks/results/nets-h200.json
    python benchmarks/nets.py --quick                         # small images and batches (PoCL)

Each case is first checked against float64 PyTorch on the CPU (``--ref-device``): the logits for
inference; for a training step the loss, the weight gradients of the first convolution and of
the classifier and the first BN's running variance after the step. The metric is MIOpen's
||out - ref|| / (sqrt(n) max|ref|), shown next to the same metric of PyTorch float32 (the
baseline) against float64. Inference passes within 10x PyTorch's own error or under 1e-4. For a
training step the float64 reference takes our branch at every relu / relu6 / max pool
(``--follow-kinks``; an activation within rounding of a kink otherwise moves the gradients by
about 1e-3, for PyTorch float32 as for ours) and ours must be under 1e-4. Then both are timed
with the host clock around one call with the device drained (``queue.finish()`` /
``torch.cuda.synchronize()``), median after a warm-up: what a user waits for. Inference: BN with running statistics, no autograd; training step: BN with batch
statistics, forward, cross_entropy against seeded int64 targets, backward to every parameter (no
optimizer update); MobileNetV2's classifier dropout is left out in both libraries.

PyTorch runs on CUDA when available (TF32 off, cudnn.benchmark on), else on the CPU.
``--first-call`` also runs two fresh processes per case sharing a new empty cache directory:
the first call with every kernel to build (``cold``), then with the disk cache it left
(``warm_disk``); ``first ms`` in the table is the first call of this process (kernels from the
user's disk cache when they are there). Where torchvision is importable, the functional PyTorch
nets are first compared with torchvision's models loaded with the same state dict.
"""
import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402


def _ints(text):
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nets", default=",".join(nets.NETS),
                   help=f"comma-separated, of {', '.join(nets.NETS)}")
    p.add_argument("--modes", default="infer,train", help="comma-separated: infer, train")
    p.add_argument("--infer-batches", default=None, help="inference batches (default 64,1)")
    p.add_argument("--train-batches", default=None, help="training-step batches (default 32)")
    p.add_argument("--image-size", type=int, default=None, help="square image side (default 224)")
    p.add_argument("--num-classes", type=int, default=nets.DEFAULT_CLASSES)
    p.add_argument("--quick", action="store_true",
                   help="64x64 images, inference batch 1, training batch 2, 2 repeats")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 3)")
    p.add_argument("--repeat", type=int, default=None, help="timed calls (default 10)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of timed calls per side and case (at least 3 calls)")
    p.add_argument("--no-check", action="store_true", help="time without the float64 check")
    p.add_argument("--ref-device", default="cpu", help="where the float64 reference runs (cpu)")
    p.add_argument("--torch-device", default=None,
                   help="baseline device: cuda, cpu or none (default: cuda when available)")
    p.add_argument("--follow-kinks", choices=("auto", "on", "off"), default="auto",
                   help="the float64 reference takes our branch at every relu/relu6/max pool, "
                        "and ours must be within 1e-4 of it (auto: for training steps)")
    p.add_argument("--first-call", action="store_true",
                   help="also the first call of fresh processes: empty caches, then warm disk "
                        "cache (costs the kernel builds)")
    p.add_argument("--no-torchvision-check", action="store_true")
    p.add_argument("--device", default=None, help="OpenCL device (P:D or part of its name)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    p.add_argument("--commit", default=None, help="commit to record (a copy without git)")
    args = p.parse_args(argv)
    args.nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    bad = [n for n in args.nets if n not in nets.NETS]
    if bad or not args.nets:
        p.error(f"--nets: unknown {bad}; known: {', '.join(nets.NETS)}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in nets.MODES for m in args.modes):
        p.error(f"--modes: of {', '.join(nets.MODES)}")
    args.infer_batches = (_ints(args.infer_batches) if args.infer_batches
                          else [1] if args.quick else [64, 1])
    args.train_batches = (_ints(args.train_batches) if args.train_batches
                          else [2] if args.quick else [32])
    args.image_size = args.image_size or (64 if args.quick else 224)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.repeat = args.repeat or (2 if args.quick else 10)
    return args


def _fmt(value, spec):
    """``value`` formatted with ``spec``, or "-" in the same width when there is none."""
    if value is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width) if width.isdigit() else 1)
    return format(value, spec)


def print_table(results, out=sys.stdout):
    head = (f"{'net':13s} {'mode':5s} {'batch':>5s} {'ours ms':>9s} {'torch ms':>9s} "
            f"{'torch/ours':>10s} {'error':>8s} {'torch32':>8s} {'first ms':>9s} "
            f"{'cold ms':>9s} {'warm ms':>9s}  status")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results:
        fc = r.get("first_call") or {}
        cold = (fc.get("cold") or {}).get("first_ms")
        warm = (fc.get("warm_disk") or {}).get("first_ms")
        print(f"{r['net']:13s} {r['mode']:5s} {r['batch']:5d} {_fmt(r.get('ours_ms'), '9.2f')} "
              f"{_fmt(r.get('torch_ms'), '9.2f')} {_fmt(r.get('ratio'), '10.2f')} "
              f"{_fmt(r.get('error'), '8.1e')} {_fmt(r.get('torch32_error'), '8.1e')} "
              f"{_fmt(r.get('ours_first_call_ms'), '9.0f')} {_fmt(cold, '9.0f')} "
              f"{_fmt(warm, '9.0f')}  {r.get('status', '')}", file=out, flush=True)


def main(argv=None):
    args = parse_args(argv)
    ctx = dp.Context(args.device)
    torch_device = args.torch_device
    try:
        import torch
        if torch_device != "none":
            torch_device = nets.torch_device_for(ctx, torch_device)
        if torch_device != "none":
            nets.setup_torch_baseline(torch_device)
        torch_info = {"version": torch.__version__, "device": torch_device, "tf32": False,
                      "cudnn_benchmark": torch_device.startswith("cuda"),
                      "threads": torch.get_num_threads()}
        if torch_device.startswith("cuda"):
            torch_info.update(cuda_device=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                              cudnn=torch.backends.cudnn.version())
    except ImportError as e:
        print(f"torch not importable ({e}): nothing to check against", file=sys.stderr)
        return 2
    print(f"dlprim_py nets on {ctx.info.name} ({ctx.info.platform_name}, driver "
          f"{ctx.info.driver_version}); torch {torch.__version__} on {torch_device}; images "
          f"{args.image_size}x{args.image_size}", flush=True)

    torchvision = {}
    if not args.no_torchvision_check:
        for net in args.nets:
            state = nets.make_state_dict(net, 0, args.num_classes)
            torchvision[net] = nets.check_torchvision(net, state)
            found = torchvision[net]
            error = f" (error {found['error']:.1e})" if "error" in found else ""
            print(f"torchvision {net}: {found['status']}{error}", flush=True)

    follow = {"auto": None, "on": True, "off": False}[args.follow_kinks]
    plan = []
    for net in args.nets:
        for mode in args.modes:
            for batch in (args.infer_batches if mode == "infer" else args.train_batches):
                plan.append((net, mode, batch))
    results = []
    started = time.perf_counter()
    for net, mode, batch in plan:
        try:
            r = nets.run_case(ctx, net, mode, batch, args.image_size, args.num_classes,
                              torch_device=torch_device, warmup=args.warmup, repeat=args.repeat,
                              budget_s=args.budget, check=not args.no_check,
                              ref_device=args.ref_device, first_call=args.first_call,
                              follow_kinks=follow,
                              log=lambda text: print("  " + text, file=sys.stderr, flush=True))
        except Exception as e:  # keep the other cases; the failure is a result
            first = (str(e).strip().splitlines() or [""])[0][:200]
            r = {"net": net, "mode": mode, "batch": batch,
                 "status": f"failed: {type(e).__name__}: {first}"}
        results.append(r)
        print(f"{net} {mode} n{batch}: ours {_fmt(r.get('ours_ms'), '.2f')} ms, torch "
              f"{_fmt(r.get('torch_ms'), '.2f')} ms, error {_fmt(r.get('error'), '.1e')}: "
              f"{r['status']}", flush=True)
        if torch_device.startswith("cuda"):
            torch.cuda.empty_cache()
    print("", flush=True)
    print_table(results)
    ratios = [r["ratio"] for r in results if r.get("ratio") and r["status"] == "ok"]
    if ratios:
        print(f"geomean torch/ours {geomean(ratios):.3f} over {len(ratios)} cases")
    ok = all(r["status"] == "ok" for r in results) and all(
        v["status"] == "ok" or v["status"].startswith("skipped") for v in torchvision.values())
    if args.json:
        report = dict(
            benchmark="nets", commit=measured_commit(args.commit),
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
            device=ctx.info.name, platform=ctx.info.platform_name,
            driver=ctx.info.driver_version, version=dp.__version__, torch=torch_info,
            host={"machine": platform.machine(), "cpus": os.cpu_count(),
                  "python": sys.version.split()[0]},
            options={k: v for k, v in vars(args).items() if k not in ("json",)},
            timing="host wall clock per call, device drained after each; median after warm-up",
            torchvision=torchvision, all_ok=ok, seconds=time.perf_counter() - started,
            geomean_torch_over_ours=geomean(ratios) if ratios else None, results=results)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
