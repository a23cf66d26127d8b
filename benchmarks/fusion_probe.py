"""Where the time of a fused conv + batch norm (inference) + ReLU goes, per layer.

    python benchmarks/fusion_probe.py [--batch 64] [--layers 3x3 1x1] [--only NAME ...]
                                      [--algos-from benchmarks/results/fusion-h200.json]
                                      [--repeat 20] [--out DIR] [--quick]

For each layer, side by side, with the same convolution algorithm (``--algos-from`` takes each
layer's algorithm from a fusion.py record, so no find run is needed; else the plan's choice):

* conv:      ``Convolution.forward`` without an epilogue;
* conv_epi:  ``Convolution.forward`` with a precomputed per-channel scale and shift and ReLU
             (the epilogue alone, no batch-norm parameters read, no fold);
* fused:     the fusion plan conv -> batchnorm_inference -> relu (``FusionPlan.execute``);
* fold:      the fold kernel alone, where the plan runs one (up to 22ee7bf a kernel folded the
             batch norm into a scale and a shift before the convolution's last kernel; since,
             the convolution's kernel computes them itself and no fold runs);
* unfused:   conv, then ``norm.batch_norm_forward_inference``, then ReLU;
* torch:     cuDNN conv + torch batch_norm + relu (CUDA events).

Each is timed two ways with OpenCL markers: one call between the markers (what fusion.py
reports: includes the host's enqueue time where the device waits for it) and ``--queued``
calls back to back between the markers, divided (the device's own time once the host runs
ahead). ``host`` is the host time per call (perf_counter over many calls, queue not drained
between them). Every output is poisoned with NaN and checked against a float64 reference on
the baseline device before anything is timed. A table is printed last; the rows go to
DIR/fusion_probe.json.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402
from dlprim_py.bench.torch_baseline import TorchBaseline  # noqa: E402
from dlprim_py.ops import norm  # noqa: E402
from dlprim_py.ops.activation_ops import activation_forward  # noqa: E402
from dlprim_py.timing import time_enqueued  # noqa: E402

from fusion import EPSILON, TOLERANCE, Layer, fused_plan, quick_layers, resnet50_layers  # noqa: E402


def time_queued(ctx, run, calls, repeat):
    """Device time per call with ``calls`` calls enqueued back to back between two markers."""
    def many():
        for _ in range(calls):
            run()
    return time_enqueued(ctx, many, warmup=1, repeat=repeat).median / calls


def host_time(ctx, run, calls=100):
    """Host seconds per call, the queue drained before and after, not between calls."""
    run()
    ctx.queue.finish()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    elapsed = time.perf_counter() - t0
    ctx.queue.finish()
    return elapsed / calls


def probe_layer(ctx, spec, batch, device, rng, repeat, queued, algo):
    name, c, k, h, r = spec
    layer = Layer(ctx, rng, device, batch, c, k, h, r)
    ref = layer.reference()
    ref_conv = F.conv2d(layer.tx.double(), layer.tw.double(), padding=layer.pad).cpu().numpy()
    plan, args, y_fused = fused_plan(ctx, layer, algo)
    algorithm = plan.conv_algorithms(1)[0] if algo is None else algo
    runner = plan.runner
    row = dict(layer=name, N=batch, C=c, K=k, H=h, R=r, algorithm=algorithm,
               chain_path="fold" if hasattr(runner, "fold_kernel") else "epilogue")
    shape = plan.output_desc.shape
    convolution = dp.Convolution(ctx, layer.x.desc, layer.w.desc, layer.conv_desc)
    outs = {key: dp.Tensor.empty(ctx, shape) for key in ("conv", "conv_epi", "bn", "unfused")}
    s_host = layer.bn_hosts[0] / np.sqrt(layer.bn_hosts[3].astype(np.float64) + EPSILON)
    shift_host = layer.bn_hosts[1] - layer.bn_hosts[2] * s_host
    scale_t = dp.Tensor.from_numpy(ctx, s_host.astype(np.float32))
    shift_t = dp.Tensor.from_numpy(ctx, shift_host.astype(np.float32))
    scale, bias, mean, var = layer.bn_flat
    relu = dp.ActivationDesc(dp.Activation.RELU)

    runs = {
        "conv": lambda: convolution.forward(layer.x, layer.w, outs["conv"], algo=algorithm),
        "conv_epi": lambda: convolution.forward(layer.x, layer.w, outs["conv_epi"], algo=algorithm,
                                                scale=scale_t, shift=shift_t, activation=relu),
        "fused": lambda: plan.execute(plan.input_desc, layer.x, plan.output_desc, y_fused, args),
    }

    def run_unfused():
        with dp.no_grad():
            convolution.forward(layer.x, layer.w, outs["conv"], algo=algorithm)
            norm.batch_norm_forward_inference(outs["conv"], outs["bn"], scale, bias, mean, var,
                                              eps=EPSILON)
            activation_forward("relu", outs["bn"], outs["unfused"])
    runs["unfused"] = run_unfused
    checks = {"conv": (outs["conv"], ref_conv), "conv_epi": (outs["conv_epi"], ref),
              "fused": (y_fused, ref), "unfused": (outs["unfused"], ref)}

    if row["chain_path"] == "fold":
        runs["fold"] = lambda: runner._fold(args)

    for key, (out, expected) in checks.items():
        out.fill_(np.nan)
        runs[key]()
        row[f"{key}_error"] = error_metric(out.numpy(), expected)
    row["torch_error"] = error_metric(
        layer.torch_chain(layer.tx, layer.tw, *layer.tbn).cpu().numpy(), ref)
    row["ok"] = all(row[f"{key}_error"] < TOLERANCE for key in checks)
    if not row["ok"]:
        print(f"{name}: WRONG RESULT {[(key, row[key + '_error']) for key in checks]}",
              flush=True)
        return row
    for key, run in runs.items():
        row[f"{key}_ms"] = time_enqueued(ctx, run, warmup=3, repeat=repeat).median * 1e3
        row[f"{key}_queued_ms"] = time_queued(ctx, run, queued, max(3, repeat // 4)) * 1e3
        row[f"{key}_host_us"] = host_time(ctx, run) * 1e6
    baseline = TorchBaseline(torch, device.type)
    row["torch_ms"] = baseline.median(
        lambda: layer.torch_chain(layer.tx, layer.tw, *layer.tbn), repeat=repeat) * 1e3
    row["fused_vs_unfused"] = row["unfused_ms"] / row["fused_ms"]
    row["fused_vs_torch"] = row["torch_ms"] / row["fused_ms"]
    row["fused_minus_conv_us"] = (row["fused_ms"] - row["conv_ms"]) * 1e3
    print(f"{name:18s} {algorithm:15s} " + " ".join(
        f"{key} {row[key + '_ms']:.3f}/{row[key + '_queued_ms']:.3f}/{row[key + '_host_us']:.0f}us"
        for key in runs) + f" torch {row['torch_ms']:.3f}", flush=True)
    return row



def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="two small layers (PoCL)")
    parser.add_argument("--layers", nargs="+", default=["3x3", "1x1"])
    parser.add_argument("--only", nargs="+", default=None, help="layer names to keep")
    parser.add_argument("--algos-from", default=None,
                        help="a fusion.py JSON record: each layer's algorithm is taken from it")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--queued", type=int, default=8, help="calls per queued sample")
    parser.add_argument("--out", default=None, help="folder for fusion_probe.json")
    parser.add_argument("--commit", default=None)
    args = parser.parse_args()
    batch = args.batch or (1 if args.quick else 64)
    repeat = args.repeat or (3 if args.quick else 20)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    ctx = dp.Context()
    print(f"device: {ctx.info.name} ({ctx.info.platform_name}); baseline on {device}; "
          f"batch {batch}", flush=True)
    algos = {}
    if args.algos_from:
        with open(args.algos_from) as f:
            algos = {r["layer"]: r["algorithm"] for r in json.load(f)["results"]
                     if "algorithm" in r}
    specs = quick_layers() if args.quick else resnet50_layers()
    specs = [s for s in specs if s[0].split()[0] in args.layers
             and (args.only is None or s[0] in args.only)]
    rng = np.random.default_rng(0)
    rows = []
    for spec in specs:
        try:
            rows.append(probe_layer(ctx, spec, batch, device, rng, repeat, args.queued,
                                    algos.get(spec[0])))
        except Exception as e:  # keep the other layers; the failure is recorded
            print(f"{spec[0]}: FAILED {type(e).__name__}: {e}", flush=True)
            rows.append(dict(layer=spec[0], failed=f"{type(e).__name__}: {e}"))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    keys = ["conv", "conv_epi", "fold", "fused", "unfused"]
    present = [k for k in keys if any(f"{k}_ms" in r for r in rows)]
    print(f"\none call between markers / {args.queued} queued calls per call, ms; host us per call")
    print(f"{'layer':17s} {'algorithm':14s} " + " ".join(f"{k:>22s}" for k in present)
          + f" {'torch':>7s} {'vs unf':>6s} {'vs tor':>6s}")
    for r in rows:
        if "fused_ms" not in r:
            print(f"{r['layer']:17s} {r.get('failed', 'wrong result')}")
            continue
        cells = []
        for k in present:
            cells.append(f"{r[k + '_ms']:7.3f}/{r[k + '_queued_ms']:6.3f}/{r[k + '_host_us']:5.0f}"
                         if k + "_ms" in r else " " * 22)
        print(f"{r['layer']:17s} {r['algorithm']:14s} " + " ".join(f"{c:>22s}" for c in cells)
              + f" {r['torch_ms']:7.3f} {r['fused_vs_unfused']:6.2f} {r['fused_vs_torch']:6.2f}")
    timed = [r for r in rows if "fused_ms" in r]
    for kind in ("3x3", "1x1", "all"):
        sel = [r for r in timed if kind == "all" or r["layer"].startswith(kind)]
        if sel:
            print(f"{kind:4s} geomean fused vs unfused x{geomean([r['fused_vs_unfused'] for r in sel]):.3f}"
                  f", unfused/conv x{geomean([r['unfused_ms'] / r['conv_ms'] for r in sel]):.3f}"
                  f", vs torch x{geomean([r['fused_vs_torch'] for r in sel]):.3f}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fusion_probe.json"), "w") as f:
            json.dump(dict(device=ctx.info.name, batch=batch, commit=measured_commit(args.commit),
                           rows=rows), f, indent=1)
    return 0 if timed and all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
