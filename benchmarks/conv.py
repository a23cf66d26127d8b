"""Convolution benchmark: every distinct convolution layer of ResNet-50 and MobileNetV2,
forward, backward-data and backward-filter, against the vendor library in the same run.

    python benchmarks/conv.py [--batch 64] [--models resnet50 mobilenet_v2] [--find] [--tf32]
                              [--dtype float32 | float16 | bfloat16]
                              [--directions forward backward_data backward_filter]
                              [--algo NAME]
                              [--output benchmarks/results/conv-X.json]

Every result is checked against a float64 reference of the same inputs before it is timed
(the error metric ||out - ref|| / (sqrt(n) max|ref|) must stay under 1e-5; with --tf32 under
TF32_TOLERANCE).

``--tf32``: TF32 allowed on both sides (our ``ctx.allow_tf32``, so that the choice takes the
TF32 algorithms where the device has tensor cores; torch's cudnn and cuda.matmul
``allow_tf32``, PyTorch's default for convolutions).

``--dtype float16`` / ``bfloat16``: every tensor of that type on both sides (ours: the 16-bit
GEMM algorithms "gemm16" / "im2col_gemm16", m16n8k16 tensor cores on NVIDIA GPUs of compute
capability 8.0 and later; cuDNN's fp16 / bf16 convolutions), float32 sums. The reference is
float64 of the 16-bit values; the tolerance HALF_TOLERANCE of the type (its output rounding).

Baseline: with a CUDA device in PyTorch, cuDNN through torch (TF32 off, cudnn.benchmark on so
that cuDNN picks its fastest algorithm), timed with CUDA events, median after a warm-up; the
float64 reference also runs there. Otherwise torch on the CPU (float32, host clock) and a
float64 CPU reference. Ours: OpenCL profiling markers around the enqueued call, median after a
warm-up; the algorithm is the find-mode winner with ``--find``, else the immediate rule's.
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.ops.conv import selection  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402
from dlprim_py.bench.torch_baseline import TorchBaseline  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

DIRECTIONS = ("forward", "backward_data", "backward_filter")
CHECKED_MARKERS = []


def resnet50_layers():
    """(name, C, K, H, R, stride, pad, groups) of torchvision's ResNet-50 (stride in the 3x3)."""
    layers = [("conv1", 3, 64, 224, 7, 2, 3, 1)]
    inplanes, h = 64, 56
    for stage, (planes, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                       (512, 3, 2)], start=1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            ho = h // s
            layers += [(f"l{stage} 1x1 {inplanes}->{planes}", inplanes, planes, h, 1, 1, 0, 1),
                       (f"l{stage} 3x3 {planes} s{s}", planes, planes, h, 3, s, 1, 1),
                       (f"l{stage} 1x1 {planes}->{planes * 4}", planes, planes * 4, ho, 1, 1, 0, 1)]
            if b == 0:
                layers.append((f"l{stage} down {inplanes}->{planes * 4} s{s}", inplanes,
                               planes * 4, h, 1, s, 0, 1))
            inplanes, h = planes * 4, ho
    return layers


def mobilenet_v2_layers():
    """(name, C, K, H, R, stride, pad, groups) of torchvision's MobileNetV2 (width 1.0)."""
    layers = [("stem 3x3 s2", 3, 32, 224, 3, 2, 1, 1)]
    cin, h = 32, 112
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            if t != 1:
                layers.append((f"expand {cin}->{hidden}", cin, hidden, h, 1, 1, 0, 1))
            layers.append((f"dw {hidden} s{stride}", hidden, hidden, h, 3, stride, 1, hidden))
            h = (h + 2 - 3) // stride + 1
            layers.append((f"project {hidden}->{c}", hidden, c, h, 1, 1, 0, 1))
            cin = c
    layers.append(("head 1x1 320->1280", 320, 1280, h, 1, 1, 0, 1))
    return layers


def distinct(layers):
    seen, out = set(), []
    for layer in layers:
        if layer[1:] not in seen:
            seen.add(layer[1:])
            out.append(layer)
    return out


# TF32 keeps 10 mantissa bits: errors of about 1e-4 to 1e-3 in the metric, where an indexing
# error (a missing or wrong term of K >= 27) gives 2e-2 or more.
TF32_TOLERANCE = 3e-3


# 16-bit results (float32 sums) are off the float64 reference by their rounding: a relative
# half-unit of 2^-11 (float16) or 2^-8 (bfloat16) per element, well under these in the metric;
# a missing or wrong term (K >= 27) gives 2e-2 or more.
HALF_TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2}


def bench_layer(ctx, layer, batch, directions, device, rng, repeat, tolerance=1e-5,
                dtype="float32", forced=None, tf32=False):
    name, c, k, h, r, stride, pad, groups = layer
    x = rng.uniform(-1, 1, (batch, c, h, h)).astype(np.float32)
    w = rng.uniform(-1, 1, (k, c // groups, r, r)).astype(np.float32)
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape, dtype), dp.TensorDesc(w.shape, dtype),
                          dp.ConvolutionDesc(pad, stride, 1, groups))
    yshape = conv.output_desc.shape
    dy = rng.uniform(-1, 1, yshape).astype(np.float32)
    X, W, DY = (dp.Tensor.from_numpy(ctx, a, dtype=dtype) for a in (x, w, dy))
    # Both sides take the same (16-bit rounded) values; the float64 reference too.
    tx, tw, tdy = (torch.tensor(t.numpy(), device=device) for t in (X, W, DY))
    if dtype != "float32":
        tx, tw, tdy = (t.to(getattr(torch, dtype)) for t in (tx, tw, tdy))
    kw = dict(stride=stride, padding=pad, groups=groups)
    results = []
    for direction in directions:
        if forced is not None:
            if forced not in selection.applicable(ctx, conv.problem, direction):
                continue
            algo = forced
        else:
            algo = selection.choose(ctx, conv.problem, direction)
        if direction == "forward":
            out = dp.Tensor.full(ctx, yshape, np.nan, dtype)
            run = lambda: conv.forward(X, W, out, algo=algo)  # noqa: E731
            ref = lambda: F.conv2d(tx.double(), tw.double(), **kw)  # noqa: E731
            base = lambda: F.conv2d(tx, tw, **kw)  # noqa: E731
        else:
            mask = [direction == "backward_data", direction == "backward_filter", False]
            shape = x.shape if mask[0] else w.shape
            out = dp.Tensor.full(ctx, shape, np.nan, dtype)
            if mask[0]:
                run = lambda: conv.backward_data(DY, W, out, algo=algo)  # noqa: E731
            else:
                run = lambda: conv.backward_filter(DY, X, out, algo=algo)  # noqa: E731

            def grads(a, b, g, mask=mask):
                return torch.ops.aten.convolution_backward(
                    g, a, b, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups, mask)

            index = 0 if mask[0] else 1
            ref = lambda: grads(tx.double(), tw.double(), tdy.double())[index]  # noqa: E731
            base = lambda: grads(tx, tw, tdy)  # noqa: E731
        run()
        err = error_metric(out.numpy(), ref().cpu().numpy())
        ours = time_enqueued(ctx, run, warmup=2, repeat=repeat).median
        if not CHECKED_MARKERS:
            # Profiling markers against the host clock once: the two must roughly agree.
            ctx.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeat):
                run()
            ctx.synchronize()
            wall = (time.perf_counter() - t0) / repeat
            print(f"timing check: markers {ours * 1e3:.3f} ms, host clock {wall * 1e3:.3f} ms "
                  f"per call", flush=True)
            CHECKED_MARKERS.append((ours, wall))
        # TF32 as the run asks (the baseline's constructor sets torch's switches).
        theirs = TorchBaseline(torch, device.type, tf32=tf32).median(base, repeat=repeat)
        flops = 2.0 * batch * k * yshape[2] * yshape[3] * (c // groups) * r * r
        results.append(dict(layer=name, C=c, K=k, H=h, R=r, stride=stride, pad=pad, groups=groups,
                            direction=direction, dtype=dtype, algo=algo, error=err, ok=err < tolerance,
                            ours_ms=ours * 1e3, baseline_ms=theirs * 1e3,
                            speed_vs_baseline=theirs / ours, ours_tflops=flops / ours * 1e-12))
        print(f"{name:28s} {direction:16s} {algo:14s} ours {ours * 1e3:8.3f} ms  "
              f"base {theirs * 1e3:8.3f} ms  x{theirs / ours:5.2f}  err {err:.1e}", flush=True)
    return results



def make_report(args, ctx, device, results, started):
    """The JSON report (written to ``args.output`` when given): rows and geomean speed-ups."""
    summary = {}
    good = [r for r in results if r.get("ok")]
    for direction in args.directions:
        rows = [r for r in good if r["direction"] == direction]
        summary[direction] = geomean([r["speed_vs_baseline"] for r in rows])
        dw = [r for r in rows if r["groups"] > 1]
        if dw:
            summary[direction + "_depthwise"] = geomean([r["speed_vs_baseline"] for r in dw])
        for model in args.models:
            mine = [r for r in rows if r["model"] == model]
            if mine:
                summary[f"{direction}_{model}"] = geomean([r["speed_vs_baseline"] for r in mine])
    commit = measured_commit(args.commit)
    report = dict(
        benchmark="conv", batch=args.batch, find_mode=args.find, commit=commit,
        device=ctx.info.name, platform=ctx.info.platform_name, driver=ctx.info.driver_version,
        tf32=args.tf32, dtype=args.dtype,
        baseline=("cuDNN via torch %s (CUDA %s), %s, TF32 %s, cudnn.benchmark on" % (
            torch.__version__, torch.version.cuda, args.dtype, "on" if args.tf32 else "off"))
        if device.type == "cuda" else
        f"torch {torch.__version__} CPU {args.dtype} "
        f"({platform.processor() or platform.machine()})",
        baseline_device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        all_checked=all(r.get("ok") for r in results), seconds=time.perf_counter() - started,
        marker_vs_host_clock_s=CHECKED_MARKERS[:1], geomean_speed_vs_baseline=summary,
        results=results)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2"])
    parser.add_argument("--directions", nargs="+", default=list(DIRECTIONS))
    parser.add_argument("--find", action="store_true", help="find mode (benchmark algorithms)")
    parser.add_argument("--limit", type=int, default=0, help="first N layers per model (0: all)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--output", default=None)
    parser.add_argument("--only", nargs="+", default=None,
                        help="only layers whose name contains one of these pieces")
    parser.add_argument("--commit", default=None,
                        help="commit to record (where the copy has no git metadata)")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="start no new layer after this many seconds (0: no limit)")
    parser.add_argument("--tf32", action="store_true",
                        help="TF32 allowed for us (ctx.allow_tf32) and for cuDNN / cuBLAS")
    parser.add_argument("--algo", default=None,
                        help="run this algorithm, on the layers and directions it applies to")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="every tensor of this type on both sides (16-bit: float32 sums)")
    args = parser.parse_args()
    if args.find:
        os.environ["DLPRIM_FIND_MODE"] = "find"
        dp.config.reload()   # the switches are read once, at the first call that needs them
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = dp.Context()
    ctx.allow_tf32 = True if args.tf32 else None
    rng = np.random.default_rng(0)
    layers = {"resnet50": resnet50_layers, "mobilenet_v2": mobilenet_v2_layers}
    results = []
    started = time.perf_counter()
    for model in args.models:
        todo = distinct(layers[model]())
        if args.only:
            todo = [layer for layer in todo if any(piece in layer[0] for piece in args.only)]
        if args.limit:
            todo = todo[:args.limit]
        for layer in todo:
            try:
                tolerance = HALF_TOLERANCE.get(args.dtype,
                                               TF32_TOLERANCE if args.tf32 else 1e-5)
                for row in bench_layer(ctx, layer, args.batch, args.directions, device, rng,
                                       args.repeat, tolerance, args.dtype, args.algo,
                                       tf32=args.tf32):
                    row["model"] = model
                    results.append(row)
            except Exception as e:  # keep the rest of the run; the failure is recorded
                print(f"{layer[0]}: FAILED {type(e).__name__}: {e}", flush=True)
                results.append(dict(model=model, layer=layer[0], failed=f"{type(e).__name__}: {e}"))
            if args.output:   # after every layer, so that a run cut short keeps what it measured
                make_report(args, ctx, device, results, started)
            if args.time_limit and time.perf_counter() - started > args.time_limit:
                print(f"time limit of {args.time_limit} s reached: stopping", flush=True)
                break
        else:
            continue
        break
    report = make_report(args, ctx, device, results, started)
    summary = report["geomean_speed_vs_baseline"]
    print("\ngeomean speed vs baseline (>1: faster):")
    for key, value in summary.items():
        print(f"  {key:36s} {value:6.3f}")
    print(f"checked: {sum(1 for r in results if r.get('ok'))}/{len(results)} ok")


if __name__ == "__main__":
    main()
