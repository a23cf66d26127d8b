"""1x1 convolutions: the folded GEMM against the per-image batched GEMM (forward, backward data)
and against the implicit GEMM (NCHW backward filter), on the distinct 1x1 layers of ResNet-50
and MobileNetV2, side by side in one run. Prints the device's OpenCL extensions first.

    python benchmarks/gemm1x1_probe.py [--batch 64] [--time-limit 60] [--output DIR]

Every variant's result is checked against a float64 reference (PyTorch, on CUDA when there)
before it is timed; outputs start as NaN. Times: OpenCL profiling markers around a recorded
run's replay, median after a warm-up. The vendor baseline is benchmarks/conv.py's job.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlprim_py as dp  # noqa: E402
from dlprim_py.ops.conv import selection  # noqa: E402
from dlprim_py.ops.conv.algorithms import EpilogueArgs, Recording  # noqa: E402
from dlprim_py.ops.conv.gemm1x1 import Gemm1x1  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402
from conv import distinct, mobilenet_v2_layers, resnet50_layers  # noqa: E402

SUBGROUP_EXTENSIONS = ("cl_khr_subgroups", "cl_intel_subgroups", "cl_khr_subgroup_shuffle",
                       "cl_khr_subgroup_ballot", "cl_nv_")


def print_extensions(ctx):
    extensions = sorted(ctx.device.extensions.split())
    print(f"extensions of {ctx.info.name} ({ctx.info.platform_name}, OpenCL "
          f"{ctx.device.version}, driver {ctx.info.driver_version}):")
    print("  " + " ".join(extensions))
    for name in SUBGROUP_EXTENSIONS:
        found = [e for e in extensions if e.startswith(name)]
        print(f"  {name}: {'yes: ' + ' '.join(found) if found else 'no'}")
    return extensions


def plan_summary(algo):
    if not getattr(algo, "plans", None):
        return ""
    plan = next(reversed(algo.plans.values()))
    p = plan.params
    if p["solver"] == "small":
        return "small"
    return (f"{p['tile_m']}x{p['tile_n']}x{p['tile_k']} gv{plan.config.global_vec} "
            f"cv{plan.config.c_vec}"
            f" split{plan.splits}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--output", default=None, help="folder for probe.json")
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = dp.Context()
    extensions = print_extensions(ctx)
    rng = np.random.default_rng(0)
    layers = [("resnet50", layer) for layer in distinct(resnet50_layers())] + \
        [("mobilenet_v2", layer) for layer in distinct(mobilenet_v2_layers())]
    layers = [(m, layer) for m, layer in layers if layer[4] == 1 and layer[7] == 1]
    folded = selection.algorithm("gemm")
    per_image = Gemm1x1(per_image=True)
    implicit = selection.algorithm("implicit_gemm")
    rows = []
    started = time.perf_counter()
    for model, (name, c, k, h, r, stride, pad, groups) in layers:
        if time.perf_counter() - started > args.time_limit:
            print(f"time limit {args.time_limit} s: stopped before {name}")
            break
        x = rng.random((args.batch, c, h, h), dtype=np.float32) - 0.5
        w = rng.random((k, c, 1, 1), dtype=np.float32) - 0.5
        conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(w.shape),
                              dp.ConvolutionDesc(0, stride))
        dy = rng.random(conv.output_desc.shape, dtype=np.float32) - 0.5
        tx, tw, tdy = (torch.tensor(a, device=device, dtype=torch.float64) for a in (x, w, dy))
        refs = {"forward": lambda: torch.nn.functional.conv2d(tx, tw, stride=stride)}
        grads = lambda mask: torch.ops.aten.convolution_backward(  # noqa: E731
            tdy, tx, tw, None, [stride] * 2, [0, 0], [1, 1], False, [0, 0], 1, mask)
        refs["backward_data"] = lambda: grads([True, False, False])[0]
        refs["backward_filter"] = lambda: grads([False, True, False])[1]
        X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
        operands = {"forward": (X, W, conv.output_desc.shape),
                    "backward_data": (DY, W, x.shape), "backward_filter": (DY, X, w.shape)}
        for direction in ("forward", "backward_data", "backward_filter"):
            ref = refs[direction]()
            alternative = implicit if direction == "backward_filter" else per_image
            src, other, shape = operands[direction]
            row = dict(model=model, layer=name, C=c, K=k, H=h, stride=stride, direction=direction,
                       alternative="implicit_gemm" if alternative is implicit else "per_image")
            for label, algo in (("folded", folded), ("alternative", alternative)):
                dst = dp.Tensor.full(ctx, shape, np.nan)
                size = algo.workspace_size(ctx, conv.problem, direction)
                workspace = dp.Tensor.empty(ctx, (max(size // 4, 1),)) if size else None
                with Recording() as recording:
                    algo.run(ctx, conv.problem, direction, src, other, dst, EpilogueArgs(),
                             workspace=workspace)
                out = torch.from_numpy(dst.numpy()).to(device, torch.float64)
                finite = bool(torch.isfinite(out).all())
                err = float(torch.linalg.norm(out - ref) / (out.numel() ** 0.5 * ref.abs().max())) \
                    if finite else float("inf")
                timing = time_enqueued(ctx, recording.replay, warmup=2, repeat=args.repeat)
                row[f"{label}_ms"] = timing.median * 1e3
                row[f"{label}_error"] = err
                row[f"{label}_plan"] = plan_summary(algo)
                del dst, workspace, out
            row["folded_speedup"] = row["alternative_ms"] / row["folded_ms"]
            row["ok"] = max(row["folded_error"], row["alternative_error"]) < 1e-5
            rows.append(row)
            print(f"{name:24s} {direction:15s} folded {row['folded_ms']:8.4f} ms "
                  f"[{row['folded_plan']}]  {row['alternative']:13s} {row['alternative_ms']:8.4f}"
                  f" ms  x{row['folded_speedup']:5.2f}  err {row['folded_error']:.1e}/"
                  f"{row['alternative_error']:.1e}{'' if row['ok'] else '  WRONG'}", flush=True)
        del X, W, DY, tx, tw, tdy
        folded.plans.clear()
        per_image.plans.clear()
    print("\nfolded GEMM vs alternative (geomean of alternative_ms / folded_ms):")
    for direction in ("forward", "backward_data", "backward_filter"):
        ratios = [r["folded_speedup"] for r in rows if r["direction"] == direction and r["ok"]]
        if ratios:
            worse = [f"{r['layer']} x{r['folded_speedup']:.2f}" for r in rows
                     if r["direction"] == direction and r["folded_speedup"] < 1]
            print(f"  {direction:16s} x{np.exp(np.mean(np.log(ratios))):.3f} over {len(ratios)}"
                  f" layers; alternative faster on: {', '.join(worse) or 'none'}")
    print(f"checked: {sum(r['ok'] for r in rows)}/{len(rows)} ok")
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        with open(os.path.join(args.output, "probe.json"), "w") as f:
            json.dump(dict(device=ctx.info.name, driver=ctx.info.driver_version,
                           extensions=extensions, batch=args.batch, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
