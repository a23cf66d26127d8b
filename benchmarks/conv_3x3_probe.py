"""Side-by-side timing of forced convolution variants on the 3x3 and 7x7 layers of ResNet-50 and
MobileNetV2 (batch 64), against cuDNN in the same run.

    python benchmarks/conv_3x3_probe.py [--batch 64] [--repeat 10] [--output probe.json]
                                        [--only l2 conv1 ...] [--directions forward ...]
(PROBE_TILES=0 leaves out the implicit GEMM's fixed-tile variants.)

Every variant (an algorithm by name, or the implicit GEMM with a fixed tile) runs once on
NaN-poisoned outputs and is checked against a float64 reference of the same inputs (PyTorch on
the CUDA device when there is one) before it is timed: replays of its recorded enqueues, OpenCL
profiling markers, median after a warm-up. The baseline is cuDNN through torch (TF32 off,
cudnn.benchmark on) timed with CUDA events. A table is printed last; ``--output`` gets the rows.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.torch_baseline import TorchBaseline  # noqa: E402
from dlprim_py.ops.conv import algorithms as conv_algorithms  # noqa: E402
from dlprim_py.ops.conv import selection  # noqa: E402
from dlprim_py.launch import Recording  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

# (name, C, K, H, R, stride, pad)
LAYERS = [
    ("l2 3x3 128 s2", 128, 128, 56, 3, 2, 1),
    ("l3 3x3 256 s2", 256, 256, 28, 3, 2, 1),
    ("l4 3x3 512 s2", 512, 512, 14, 3, 2, 1),
    ("conv1", 3, 64, 224, 7, 2, 3),
    ("stem 3x3 s2", 3, 32, 224, 3, 2, 1),
    ("l1 3x3 64 s1", 64, 64, 56, 3, 1, 1),
    ("l2 3x3 128 s1", 128, 128, 28, 3, 1, 1),
    ("l3 3x3 256 s1", 256, 256, 14, 3, 1, 1),
    ("l4 3x3 512 s1", 512, 512, 7, 3, 1, 1),
]

TILES = {"LARGE": conv_algorithms.TILE_LARGE, "WIDE": conv_algorithms.TILE_WIDE,
         "MEDIUM": conv_algorithms.TILE_MEDIUM, "LARGE_K16": conv_algorithms.TILE_LARGE_K16,
         "WIDE_K16": conv_algorithms.TILE_WIDE_K16, "MEDIUM_K16": conv_algorithms.TILE_MEDIUM_K16,
         "THIN_K16": conv_algorithms.TILE_THIN_K16}


def variants(ctx, problem, direction):
    """(label, Algorithm) pairs to time: the applicable named algorithms (the direct kernels
    only for thin GEMMs), and for the implicit GEMM every fixed tile the device runs."""
    out = []
    for name in selection.applicable(ctx, problem, direction):
        if name in ("direct", "direct_phased") and not selection._tiny_gemm(problem, direction):
            continue
        if name == "implicit_gemm" and direction == "backward_data" and problem.c < 8:
            continue   # tens of milliseconds: the direct kernels serve that case
        out.append((name, selection.algorithm(name)))
    if direction == "forward":
        for pixels in (1, 2):
            algo = conv_algorithms.DirectSmall(pixels)
            if algo.applies(ctx, problem, direction):
                out.append((f"direct_small p{pixels}", algo))
    if os.environ.get("PROBE_TILES", "1") == "0":
        return out
    if direction == "forward" or (direction == "backward_data" and problem.stride_h > 1
                                  and problem.c >= 8):
        for label, tile in TILES.items():
            if tile.threads <= ctx.info.max_work_group_size:
                out.append((f"igemm {label}", conv_algorithms.ImplicitGemm(tile)))
    return out


def probe_layer(ctx, layer, batch, directions, device, rng, repeat, rows):
    name, c, k, h, r, stride, pad = layer
    x = rng.uniform(-1, 1, (batch, c, h, h)).astype(np.float32)
    w = rng.uniform(-1, 1, (k, c, r, r)).astype(np.float32)
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(w.shape),
                          dp.ConvolutionDesc(pad, stride))
    problem = conv.problem
    yshape = conv.output_desc.shape
    dy = rng.uniform(-1, 1, yshape).astype(np.float32)
    X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
    tx, tw, tdy = (torch.tensor(a, device=device) for a in (x, w, dy))
    baseline = TorchBaseline(torch, device.type)
    for direction in directions:
        if direction == "forward":
            src, other, shape = X, W, yshape
            ref = F.conv2d(tx.double(), tw.double(), stride=stride, padding=pad).cpu().numpy()
            base = lambda: F.conv2d(tx, tw, stride=stride, padding=pad)  # noqa: E731
        else:
            mask = [direction == "backward_data", direction == "backward_filter", False]
            src, other, shape = (DY, W, x.shape) if mask[0] else (DY, X, w.shape)

            def grads(a, b, g, mask=mask):
                return torch.ops.aten.convolution_backward(
                    g, a, b, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, mask)

            index = 0 if mask[0] else 1
            ref = grads(tx.double(), tw.double(), tdy.double())[index].cpu().numpy()
            base = lambda grads=grads: grads(tx, tw, tdy)  # noqa: E731
        theirs = baseline.median(base, repeat=repeat)
        immediate = selection.immediate(ctx, problem, direction)
        for label, algo in variants(ctx, problem, direction):
            row = dict(layer=name, direction=direction, variant=label, baseline_ms=theirs * 1e3,
                       immediate=immediate)
            try:
                size = algo.workspace_size(ctx, problem, direction)
                workspace = dp.Tensor.empty(ctx, (max(size // 4, 1),)) if size else None
                out = dp.Tensor.full(ctx, shape, np.nan)
                with Recording() as recording:
                    algo.run(ctx, problem, direction, src, other, out,
                             conv_algorithms.EpilogueArgs(), workspace=workspace)
                err = error_metric(out.numpy(), ref)
                ours = time_enqueued(ctx, recording.replay, warmup=2, repeat=repeat).median
                row.update(error=err, ok=bool(err < 1e-5), ours_ms=ours * 1e3,
                           speed_vs_baseline=theirs / ours,
                           tflops=problem.flops() / ours * 1e-12)
                plans = getattr(algo, "plans", None)
                if plans:
                    row["gemm"] = repr(next(reversed(plans.values())))
                del workspace, out
            except Exception as e:  # keep the other variants; the failure is recorded
                row.update(failed=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
            if "failed" in row:
                print(f"{name:15s} {direction:15s} {label:16s} FAILED {row['failed']}",
                      flush=True)
            else:
                print(f"{name:15s} {direction:15s} {label:16s} {row['ours_ms']:8.3f} ms  "
                      f"cuDNN {row['baseline_ms']:7.3f}  x{row['speed_vs_baseline']:5.2f}  "
                      f"{row['tflops']:5.1f} TF  err {row['error']:.1e}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--directions", nargs="+", default=["forward", "backward_data"])
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--output", default=None)
    parser.add_argument("--time-limit", type=float, default=0)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}); baseline on {device}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    started = time.perf_counter()
    layers = [layer for layer in LAYERS
              if not args.only or any(piece in layer[0] for piece in args.only)]
    for layer in layers:
        probe_layer(ctx, layer, args.batch, args.directions, device, rng, args.repeat, rows)
        if args.output:
            with open(args.output, "w") as f:
                json.dump(dict(device=ctx.info.name, batch=args.batch, rows=rows), f, indent=1)
        if args.time_limit and time.perf_counter() - started > args.time_limit:
            print("time limit reached", flush=True)
            break
    print(f"\n{'layer':15s} {'direction':15s} {'best':16s} {'ms':>8s} {'cuDNN':>7s}  speed  "
          f"(immediate: speed)")
    best = {}
    for row in rows:
        if row.get("ok"):
            key = (row["layer"], row["direction"])
            if key not in best or row["ours_ms"] < best[key]["ours_ms"]:
                best[key] = row
    for (layer, direction), row in best.items():
        imm = [r for r in rows if r["layer"] == layer and r["direction"] == direction
               and r["variant"] == row["immediate"] and r.get("ok")]
        imm_speed = f"{imm[0]['speed_vs_baseline']:.2f}" if imm else "-"
        print(f"{layer:15s} {direction:15s} {row['variant']:16s} {row['ours_ms']:8.3f} "
              f"{row['baseline_ms']:7.3f}  {row['speed_vs_baseline']:5.2f}  "
              f"({row['immediate']}: {imm_speed})")
    bad = [r for r in rows if not r.get("ok")]
    print(f"checked: {len(rows) - len(bad)}/{len(rows)} ok; {time.perf_counter() - started:.0f} s")
    for r in bad:
        print(f"  NOT OK {r['layer']} {r['direction']} {r['variant']}: "
              f"{r.get('failed') or r.get('error')}")


if __name__ == "__main__":
    main()
