"""Fusion benchmark: convolution + batch norm (inference) + ReLU as one fusion plan, against the
library's unfused sequence and against cuDNN's convolution followed by PyTorch's batch norm and
ReLU, on ResNet-50's 3x3 and 1x1 layers, all in the same run.

    python benchmarks/fusion.py [--batch 64] [--json benchmarks/results/fusion-X.json]
                                [--quick] [--find] [--repeat 20] [--layers 3x3 1x1]

Three ways to compute act(BN(conv(x))) for each layer, each checked against a float64
reference of the same inputs before it is timed (error metric ||out - ref|| / (sqrt(n) max|ref|)
under 1e-5):

* fused:   ``fusion.FusionPlan`` conv -> batchnorm_inference -> activation(RELU): the
           convolution's last kernel (GEMM, Winograd output transform, ...) computes the batch
           norm's scale and shift per channel from its parameters and applies
           act(acc * scale + shift); no other kernel runs;
* unfused: the same library, one call per operator: ``Convolution.forward``, then
           ``norm.batch_norm_forward_inference``, then ``activation_forward(relu)``, with the
           same convolution algorithm as the fused plan;
* torch:   ``F.conv2d`` (cuDNN on a CUDA device, cudnn.benchmark on, TF32 off), then
           ``F.batch_norm(training=False)``, then ``F.relu``: eager PyTorch.

The convolutions alone (ours with the same algorithm, and cuDNN's) are timed too, to show how
much of each total the batch norm and ReLU cost. Ours are timed with OpenCL profiling markers
around everything one call enqueues (device time, including the gaps between its kernels),
torch with CUDA events (host clock on a CPU), median after a warm-up. ``--quick`` (batch 1, two small layers, few repeats) runs on PoCL in seconds.
Targets: fused >= 1.3x unfused and >= 1.0x torch on every layer.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import fusion  # noqa: E402
from dlprim_py.ops import norm  # noqa: E402
from dlprim_py.ops.activation_ops import activation_forward  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402
from dlprim_py.bench.torch_baseline import TorchBaseline  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

EPSILON = 1e-5
TOLERANCE = 1e-5
TARGET_VS_UNFUSED = 1.3
TARGET_VS_TORCH = 1.0


def resnet50_layers():
    """Distinct stride-1 (name, C, K, H, R) layers of ResNet-50: its 3x3 and 1x1 convolutions
    (padding (R - 1) / 2)."""
    layers = [("3x3 64@56", 64, 64, 56, 3), ("3x3 128@28", 128, 128, 28, 3),
              ("3x3 256@14", 256, 256, 14, 3), ("3x3 512@7", 512, 512, 7, 3)]
    layers += [("1x1 64->64@56", 64, 64, 56, 1), ("1x1 64->256@56", 64, 256, 56, 1),
               ("1x1 256->64@56", 256, 64, 56, 1), ("1x1 256->128@56", 256, 128, 56, 1),
               ("1x1 128->512@28", 128, 512, 28, 1), ("1x1 512->128@28", 512, 128, 28, 1),
               ("1x1 512->256@28", 512, 256, 28, 1), ("1x1 256->1024@14", 256, 1024, 14, 1),
               ("1x1 1024->256@14", 1024, 256, 14, 1), ("1x1 1024->512@14", 1024, 512, 14, 1),
               ("1x1 512->2048@7", 512, 2048, 7, 1), ("1x1 2048->512@7", 2048, 512, 7, 1)]
    return layers


def quick_layers():
    return [("3x3 64@14", 64, 64, 14, 3), ("1x1 256->64@14", 256, 64, 14, 1)]


class Layer:
    """The inputs of one layer, on the OpenCL device and in torch."""

    def __init__(self, ctx, rng, device, batch, c, k, h, r):
        pad = (r - 1) // 2
        self.conv_desc = dp.ConvolutionDesc(padding=pad)
        self.x_host = rng.uniform(-1, 1, (batch, c, h, h)).astype(np.float32)
        bound = 1 / math.sqrt(c * r * r)
        self.w_host = rng.uniform(-bound, bound, (k, c, r, r)).astype(np.float32)
        self.bn_hosts = [rng.uniform(0.5, 1.5, k).astype(np.float32),    # scale
                         rng.uniform(-1, 1, k).astype(np.float32),       # bias
                         rng.uniform(-0.2, 0.2, k).astype(np.float32),   # mean
                         rng.uniform(0.5, 1.5, k).astype(np.float32)]    # variance
        self.x = dp.Tensor.from_numpy(ctx, self.x_host)
        self.w = dp.Tensor.from_numpy(ctx, self.w_host)
        self.bn = [dp.Tensor.from_numpy(ctx, a.reshape(1, k, 1, 1)) for a in self.bn_hosts]
        self.bn_flat = [t.reshape(k) for t in self.bn]
        self.pad, self.k = pad, k
        self.tx, self.tw = (torch.from_numpy(a).to(device) for a in (self.x_host, self.w_host))
        self.tbn = [torch.from_numpy(a).to(device) for a in self.bn_hosts]

    def torch_chain(self, x, w, scale, bias, mean, var):
        y = F.conv2d(x, w, padding=self.pad)
        y = F.batch_norm(y, mean, var, scale, bias, training=False, eps=EPSILON)
        return F.relu(y)

    def reference(self):
        return self.torch_chain(self.tx.double(), self.tw.double(),
                                *(t.double() for t in self.tbn)).cpu().numpy()


def fused_plan(ctx, layer, algo):
    plan = fusion.FusionPlan(ctx, fusion.VERTICAL, layer.x.desc)
    conv = plan.create_op_conv_forward(layer.conv_desc, layer.w.desc)
    bn = plan.create_op_batchnorm_inference(fusion.BN_SPATIAL, dp.TensorDesc((1, layer.k, 1, 1)))
    act = plan.create_op_activation_forward(fusion.ACTIVATION_RELU)
    plan.compile()
    if algo is not None:
        plan.set_conv_algorithm(algo)
    args = fusion.OperatorArgs()
    args.set_conv_forward(conv, 1.0, 0.0, layer.w)
    args.set_batchnorm_inference(bn, 1.0, 0.0, *layer.bn, EPSILON)
    args.set_activation_forward(act, 1.0, 0.0, 0.0, 0.0, 0.0)
    y = dp.Tensor.empty(ctx, plan.output_desc.shape)
    return plan, args, y


def bench_layer(ctx, spec, batch, device, rng, repeat, algo):
    name, c, k, h, r = spec
    layer = Layer(ctx, rng, device, batch, c, k, h, r)
    ref = layer.reference()
    row = dict(layer=name, N=batch, C=c, K=k, H=h, R=r)

    plan, args, y_fused = fused_plan(ctx, layer, algo)
    algorithm = plan.conv_algorithms(1)[0] if algo is None else algo
    row["algorithm"] = algorithm

    def run_fused():
        plan.execute(plan.input_desc, layer.x, plan.output_desc, y_fused, args)

    convolution = dp.Convolution(ctx, layer.x.desc, layer.w.desc, layer.conv_desc)
    y_conv = dp.Tensor.empty(ctx, plan.output_desc.shape)
    y_bn = dp.Tensor.empty(ctx, plan.output_desc.shape)
    y_unfused = dp.Tensor.empty(ctx, plan.output_desc.shape)
    scale, bias, mean, var = layer.bn_flat

    def run_unfused():
        with dp.no_grad():
            convolution.forward(layer.x, layer.w, y_conv, algo=algorithm)
            norm.batch_norm_forward_inference(y_conv, y_bn, scale, bias, mean, var, eps=EPSILON)
            activation_forward("relu", y_bn, y_unfused)

    def run_torch():
        return layer.torch_chain(layer.tx, layer.tw, *layer.tbn)

    for key, out, run in (("fused", y_fused, run_fused), ("unfused", y_unfused, run_unfused)):
        out.fill_(np.nan)
        run()
        row[f"{key}_error"] = error_metric(out.numpy(), ref)
    row["torch_error"] = error_metric(run_torch().cpu().numpy(), ref)
    row["ok"] = all(row[f"{key}_error"] < TOLERANCE for key in ("fused", "unfused"))
    if not row["ok"]:
        print(f"{name}: WRONG RESULT fused {row['fused_error']:.1e} unfused "
              f"{row['unfused_error']:.1e}: not timed", flush=True)
        return row

    row["fused_ms"] = time_enqueued(ctx, run_fused, warmup=3, repeat=repeat).median * 1e3
    row["unfused_ms"] = time_enqueued(ctx, run_unfused, warmup=3, repeat=repeat).median * 1e3
    row["torch_ms"] = TorchBaseline(torch, device.type).median(run_torch, repeat=repeat) * 1e3
    # The convolutions alone say how much of each total the batch norm and ReLU cost.
    row["conv_only_ms"] = time_enqueued(
        ctx, lambda: convolution.forward(layer.x, layer.w, y_conv, algo=algorithm),
        warmup=3, repeat=repeat).median * 1e3
    row["torch_conv_only_ms"] = TorchBaseline(torch, device.type).median(
        lambda: F.conv2d(layer.tx, layer.tw, padding=layer.pad), repeat=repeat) * 1e3
    row["fused_vs_unfused"] = row["unfused_ms"] / row["fused_ms"]
    row["fused_vs_torch"] = row["torch_ms"] / row["fused_ms"]
    flops = 2.0 * batch * k * h * h * c * r * r
    row["fused_tflops"] = flops / (row["fused_ms"] * 1e-3) * 1e-12
    # The names benchmarks/make_results.py tabulates for every family's script.
    row.update(ours_ms=row["fused_ms"], baseline_ms=row["torch_ms"],
               speed_vs_baseline=row["fused_vs_torch"], ours_tflops=row["fused_tflops"],
               error=row["fused_error"])
    print(f"{name:18s} {algorithm:14s} fused {row['fused_ms']:8.3f} ms  unfused "
          f"{row['unfused_ms']:8.3f} ms  torch {row['torch_ms']:8.3f} ms  "
          f"x{row['fused_vs_unfused']:5.2f} vs unfused  x{row['fused_vs_torch']:5.2f} vs torch  "
          f"(conv alone {row['conv_only_ms']:.3f} ms, torch's {row['torch_conv_only_ms']:.3f} ms)  "
          f"err {row['fused_error']:.1e}", flush=True)
    return row



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=None, help="batch size (64; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="two small layers, few repeats")
    parser.add_argument("--layers", nargs="+", default=["3x3", "1x1"],
                        help="which layer kinds: 3x3, 1x1")
    parser.add_argument("--algo", default=None, help="force the convolution algorithm")
    parser.add_argument("--find", action="store_true", help="find mode (benchmark algorithms)")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the results as JSON here")
    parser.add_argument("--commit", default=None,
                        help="commit to record (where the copy has no git metadata)")
    args = parser.parse_args()
    if args.find:
        os.environ["DLPRIM_FIND_MODE"] = "find"
        dp.config.reload()   # the switches are read once, at the first call that needs them
    batch = args.batch or (1 if args.quick else 64)
    repeat = args.repeat or (3 if args.quick else 20)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}); baseline on {device}; "
          f"batch {batch}", flush=True)
    rng = np.random.default_rng(0)
    specs = quick_layers() if args.quick else resnet50_layers()
    specs = [s for s in specs if s[0].split()[0] in args.layers]
    results = []
    started = time.perf_counter()
    for spec in specs:
        try:
            results.append(bench_layer(ctx, spec, batch, device, rng, repeat, args.algo))
        except Exception as e:  # keep the rest of the run; the failure is recorded
            print(f"{spec[0]}: FAILED {type(e).__name__}: {e}", flush=True)
            results.append(dict(layer=spec[0], failed=f"{type(e).__name__}: {e}"))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    timed = [r for r in results if "fused_ms" in r]
    summary = {}
    for kind in ("3x3", "1x1", "all"):
        rows = [r for r in timed if kind == "all" or r["layer"].startswith(kind)]
        if rows:
            summary.update({
                f"{kind}_geomean_fused_vs_unfused": geomean([r["fused_vs_unfused"] for r in rows]),
                f"{kind}_min_fused_vs_unfused": min(r["fused_vs_unfused"] for r in rows),
                f"{kind}_geomean_fused_vs_torch": geomean([r["fused_vs_torch"] for r in rows]),
                f"{kind}_min_fused_vs_torch": min(r["fused_vs_torch"] for r in rows)})
    targets = dict(
        fused_vs_unfused=TARGET_VS_UNFUSED, fused_vs_torch=TARGET_VS_TORCH,
        layers_meeting_unfused=sum(r["fused_vs_unfused"] >= TARGET_VS_UNFUSED for r in timed),
        layers_meeting_torch=sum(r["fused_vs_torch"] >= TARGET_VS_TORCH for r in timed),
        layers_timed=len(timed))
    commit = measured_commit(args.commit)
    report = dict(
        benchmark="fusion conv+bn+relu", batch=batch, quick=args.quick, find_mode=args.find,
        commit=commit, device=ctx.info.name, platform=ctx.info.platform_name,
        driver=ctx.info.driver_version,
        baseline=("cuDNN conv via torch %s (CUDA %s) + torch batch_norm + relu, eager, TF32 off, "
                  "cudnn.benchmark on" % (torch.__version__, torch.version.cuda))
        if device.type == "cuda" else
        f"torch {torch.__version__} CPU float32 eager ({platform.processor() or platform.machine()})",
        baseline_device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        all_checked=bool(results) and all(r.get("ok") for r in results),
        seconds=time.perf_counter() - started, summary=summary, targets=targets, results=results)

    print(f"\n{'layer':18s} {'algorithm':14s} {'fused ms':>9s} {'unfused ms':>11s} {'torch ms':>9s} "
          f"{'vs unfused':>10s} {'vs torch':>9s} {'our conv':>9s} {'torch conv':>10s}")
    for r in results:
        if "fused_ms" in r:
            print(f"{r['layer']:18s} {r['algorithm']:14s} {r['fused_ms']:9.3f} {r['unfused_ms']:11.3f} "
                  f"{r['torch_ms']:9.3f} {r['fused_vs_unfused']:9.2f}x {r['fused_vs_torch']:8.2f}x "
                  f"{r['conv_only_ms']:9.3f} {r['torch_conv_only_ms']:10.3f}")
        else:
            print(f"{r['layer']:18s} {r.get('failed') or 'wrong result, not timed'}")
    for kind in ("3x3", "1x1", "all"):
        if f"{kind}_geomean_fused_vs_unfused" in summary:
            print(f"{kind:4s} geomean x{summary[kind + '_geomean_fused_vs_unfused']:.2f} vs unfused "
                  f"(min x{summary[kind + '_min_fused_vs_unfused']:.2f}), "
                  f"x{summary[kind + '_geomean_fused_vs_torch']:.2f} vs torch "
                  f"(min x{summary[kind + '_min_fused_vs_torch']:.2f})")
    print(f"targets: >= {TARGET_VS_UNFUSED}x unfused on {targets['layers_meeting_unfused']}/"
          f"{len(timed)} layers, >= {TARGET_VS_TORCH}x torch on {targets['layers_meeting_torch']}/"
          f"{len(timed)}; results checked: {sum(1 for r in results if r.get('ok'))}/{len(results)}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["all_checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
