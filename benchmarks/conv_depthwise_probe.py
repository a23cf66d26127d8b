"""Depthwise convolution probe: every depthwise algorithm (and row-band geometry variant) forced
on MobileNetV2's distinct depthwise layers, each checked against a float64 reference and timed
beside the vendor library in the same run; then the time ``selection.measure`` (find) takes for
a few ResNet-50 and MobileNetV2 problems with warm kernels.

    python benchmarks/conv_depthwise_probe.py [--batch 64] [--out DIR] [--commit HASH]
                                              [--layers 3] [--skip-find]

Writes DIR/conv-depthwise-probe.json and DIR/conv-find-time.json; prints a table last.
Ours: OpenCL profiling markers around replays of the recorded run, median after a warm-up.
Baseline: PyTorch (cuDNN with TF32 off and cudnn.benchmark on, CUDA events) on a CUDA device,
else torch on the CPU (host clock).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import geomean  # noqa: E402
from dlprim_py.bench.torch_baseline import TorchBaseline  # noqa: E402
from dlprim_py.ops.conv import depthwise, selection  # noqa: E402
from dlprim_py.ops.conv.algorithms import EpilogueArgs  # noqa: E402
from dlprim_py.ops.conv.problem import make_problem  # noqa: E402
from dlprim_py.launch import Recording  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402
from conv import distinct, mobilenet_v2_layers  # noqa: E402


def rows_variant(outputs, local_bytes=16384):
    cls = type("RowsVariant", (depthwise.DepthwiseRows,),
               {"OUTPUTS_PER_GROUP": outputs, "LOCAL_BYTES": local_bytes})
    return cls(name=f"rows_{outputs}_{local_bytes // 1024}k")


def tiled_variant(*tile):
    return depthwise.DepthwiseTiled(depthwise.DepthwiseTile(*tile),
                                    name="tiled_" + "_".join(map(str, tile)))


VARIANTS = {
    "forward": [selection.algorithm("depthwise"), selection.algorithm("depthwise_tiled"),
                tiled_variant(8, 8, 1, 1, 2), tiled_variant(8, 4, 1, 2, 4),
                tiled_variant(16, 4, 1, 2, 2), tiled_variant(8, 8, 2, 1, 2),
                selection.algorithm("depthwise_rows"), rows_variant(512), rows_variant(2048),
                rows_variant(1024, 8192)],
    "backward_data": [selection.algorithm("depthwise"), selection.algorithm("depthwise_rows"),
                      rows_variant(512), rows_variant(2048), rows_variant(1024, 8192)],
    "backward_filter": [selection.algorithm("depthwise")],
}



def probe_layer(ctx, layer, batch, device, baseline, repeat):
    name, c, k, h, r, stride, pad, groups = layer
    problem = make_problem((batch, c, h, h), (k, 1, r, r), dp.ConvolutionDesc(pad, stride, 1, c))
    gen = torch.Generator(device=device).manual_seed(0)
    tx = torch.rand((batch, c, h, h), generator=gen, device=device) * 2 - 1
    tw = torch.rand((k, 1, r, r), generator=gen, device=device) * 2 - 1
    tdy = torch.rand(problem.y_shape, generator=gen, device=device) * 2 - 1
    X, W, DY = (dp.Tensor.from_numpy(ctx, t.cpu().numpy()) for t in (tx, tw, tdy))
    kw = dict(stride=stride, padding=pad, groups=groups)

    def grads(a, b, g, mask):
        return torch.ops.aten.convolution_backward(g, a, b, None, [stride] * 2, [pad] * 2,
                                                   [1, 1], False, [0, 0], groups, mask)

    rows = []
    for direction, variants in VARIANTS.items():
        if direction == "forward":
            ref = F.conv2d(tx.double(), tw.double(), **kw)
            base = lambda: F.conv2d(tx, tw, **kw)  # noqa: E731
            src, other, shape = X, W, problem.y_shape
        elif direction == "backward_data":
            ref = grads(tx.double(), tw.double(), tdy.double(), [True, False, False])[0]
            base = lambda: grads(tx, tw, tdy, [True, False, False])  # noqa: E731
            src, other, shape = DY, W, problem.x_shape
        else:
            ref = grads(tx.double(), tw.double(), tdy.double(), [False, True, False])[1]
            base = lambda: grads(tx, tw, tdy, [False, True, False])  # noqa: E731
            src, other, shape = DY, X, problem.w_shape
        ref = ref.cpu().numpy()
        row = dict(layer=name, C=c, H=h, stride=stride, direction=direction, ours={}, error={})
        for algo in variants:
            if not algo.applies(ctx, problem, direction):
                continue
            out = dp.Tensor.full(ctx, shape, np.nan)
            size = algo.workspace_size(ctx, problem, direction)
            ws = dp.Tensor.empty(ctx, (max(size // 4, 1),)) if size else None
            with Recording() as recording:
                algo.run(ctx, problem, direction, src, other, out, EpilogueArgs(), workspace=ws)
            err = error_metric(out.numpy(), ref)
            row["error"][algo.name] = err
            if not err < 1e-5:
                print(f"{name} {direction} {algo.name}: WRONG, error {err:.2e}", flush=True)
                continue
            row["ours"][algo.name] = time_enqueued(ctx, recording.replay, warmup=2,
                                                   repeat=repeat).median * 1e3
            if isinstance(algo, depthwise.DepthwiseRows):
                b = algo.choose_bands(ctx, problem, direction)
                row.setdefault("bands", {})[algo.name] = [b.gx, b.gy, b.planes, b.band_h]
        row["baseline_ms"] = baseline.median(base, repeat=repeat) * 1e3
        best = min(row["ours"], key=row["ours"].get) if row["ours"] else None
        row["best"] = best
        row["speed_vs_baseline"] = row["baseline_ms"] / row["ours"][best] if best else None
        row["immediate"] = selection.immediate(ctx, problem, direction)
        rows.append(row)
        cells = "  ".join(f"{n} {t:.4f}" for n, t in row["ours"].items())
        print(f"{name:10s} {direction:15s} base {row['baseline_ms']:.4f}  {cells}", flush=True)
    return rows


def find_times(ctx, batch):
    """Seconds ``selection.measure`` takes per problem: with kernels in the context's memo, and
    with the memo emptied (binaries from the disk cache, a new process's case)."""
    problems = [("resnet50 l1 3x3 64", (batch, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
                ("resnet50 l1 1x1 64->256", (batch, 64, 56, 56), (256, 64, 1, 1), 0, 1, 1),
                ("resnet50 l3 3x3 256", (batch, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
                ("resnet50 conv1 7x7 s2", (batch, 3, 224, 224), (64, 3, 7, 7), 3, 2, 1),
                ("mobilenet_v2 dw 144 s1", (batch, 144, 56, 56), (144, 1, 3, 3), 1, 1, 144),
                ("mobilenet_v2 dw 576 s2", (batch, 576, 14, 14), (576, 1, 3, 3), 1, 2, 576)]
    out = []
    for name, xs, ws, pad, stride, groups in problems:
        problem = make_problem(xs, ws, dp.ConvolutionDesc(pad, stride, 1, groups))
        for direction in ("forward", "backward_data", "backward_filter"):
            t0 = time.perf_counter()
            selection.measure(ctx, problem, direction)      # builds what it needs
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            winner, times = selection.measure(ctx, problem, direction)
            warm = time.perf_counter() - t0
            ctx.programs.clear()
            t0 = time.perf_counter()
            selection.measure(ctx, problem, direction)
            disk = time.perf_counter() - t0
            out.append(dict(problem=name, direction=direction, first_call_s=cold,
                            warm_memo_s=warm, warm_disk_cache_s=disk, winner=winner,
                            candidates_ms={n: t * 1e3 for n, t in times.items()}))
            print(f"find {name:26s} {direction:15s} warm {warm:.3f} s  disk-cache {disk:.3f} s "
                  f"first {cold:.3f} s  -> {winner}", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--layers", type=int, default=0, help="first N depthwise layers (0: all)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--commit", default="")
    parser.add_argument("--skip-find", action="store_true")
    parser.add_argument("--skip-probe", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    baseline = TorchBaseline(torch, device)
    ctx = dp.Context()
    meta = dict(commit=args.commit, batch=args.batch, device=ctx.info.name,
                driver=ctx.info.driver_version, baseline=baseline.describe())
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()
    rows = []
    if not args.skip_probe:
        layers = [layer for layer in distinct(mobilenet_v2_layers()) if layer[7] > 1]
        path = os.path.join(args.out, "conv-depthwise-probe.json")
        for layer in layers[:args.layers or None]:
            rows += probe_layer(ctx, layer, args.batch, device, baseline, args.repeat)
            with open(path, "w") as f:     # after every layer: a run cut short keeps its rows
                json.dump(dict(meta, partial=True, results=rows), f, indent=1)
        summary = {}
        for direction in VARIANTS:
            mine = [r for r in rows if r["direction"] == direction]
            summary[direction + "_best"] = geomean([r["speed_vs_baseline"] for r in mine])
            for algo in VARIANTS[direction]:
                summary[f"{direction}_{algo.name}"] = geomean(
                    [r["baseline_ms"] / r["ours"][algo.name] for r in mine
                     if algo.name in r["ours"]])
        with open(path, "w") as f:
            json.dump(dict(meta, partial=bool(args.layers), seconds=time.perf_counter() - started, summary=summary,
                           results=rows), f, indent=1)
    if not args.skip_find:
        finds = find_times(ctx, args.batch)
        with open(os.path.join(args.out, "conv-find-time.json"), "w") as f:
            json.dump(dict(meta, rules=dict(repeat=selection.FIND_REPEAT,
                                            drop=selection.FIND_DROP,
                                            cap_s=selection.FIND_CAP_S, tie=selection.FIND_TIE),
                           results=finds), f, indent=1)
    if rows:
        print("\nspeed vs baseline, geomean over layers (>1: faster):")
        for key, value in summary.items():
            print(f"  {key:40s} {value:6.3f}")
    print(f"probe seconds {time.perf_counter() - started:.1f}")


if __name__ == "__main__":
    main()
