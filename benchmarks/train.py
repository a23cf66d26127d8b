"""Training steps of dp.models (ResNet-18, ResNet-50, MobileNetV2) with dp.optim against the same
models in PyTorch eager, as users train them.

    python benchmarks/train.py                                   # every net, SGD and AdamW, b32
    python benchmarks/train.py --nets resnet18 --optimizers sgd --batch 8 --image-size 64
    python benchmarks/train.py --json benchmarks/results/train-h200.json

What a step is and how it is checked: ``dlprim_py/bench/train.py`` (the dlprim-bench ``train``
suite runs the same cases). Each case is checked first (one step from the shared state against
PyTorch float32; the tolerances are there), then timed with the host clock around one step
with the device drained (median after a warm-up), and the optimizer's ``step()`` alone the same
way (our fused update against torch's default, the foreach path on CUDA). PyTorch runs with
TF32 off and cudnn.benchmark on. SGD: lr 0.01, momentum 0.9, weight decay 1e-4; AdamW: lr 1e-3,
weight decay 0.01.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402
from dlprim_py.bench.train import NETS, OPTIMIZERS, TrainPair  # noqa: E402


def run_case(ctx, net, optimizer, batch, image_size, torch_device, warmup, repeat, seed=0):
    """The check on a fresh pair, then the timed steps and the optimizer alone on another."""
    errors = TrainPair(ctx, net, optimizer, batch, image_size, torch_device, seed).check()
    pair = TrainPair(ctx, net, optimizer, batch, image_size, torch_device, seed)
    ours = nets.wall_times(pair.step, pair.drain, warmup, repeat)
    theirs = nets.wall_times(pair.torch_step, pair.torch_drain, warmup, repeat)
    # The optimizer alone: the gradients of the last step are there.
    ours_opt = nets.wall_times(pair.optimizer.step, pair.drain, warmup, repeat)
    theirs_opt = nets.wall_times(pair.torch_optimizer.step, pair.torch_drain, warmup, repeat)
    return {"net": net, "optimizer": optimizer, "batch": batch, "image_size": image_size,
            "torch_model": pair.torch_kind, "ok": all(e <= 1.0 for e in errors.values()),
            "errors": errors, "ours": nets._summary_ms(ours), "torch": nets._summary_ms(theirs),
            "ours_optimizer": nets._summary_ms(ours_opt),
            "torch_optimizer": nets._summary_ms(theirs_opt),
            "parameters": int(sum(p.size for p in pair.model.parameters()))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nets", default=",".join(NETS))
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--device", default=None, help="OpenCL device (P:D or part of its name)")
    p.add_argument("--torch-device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--commit", default=None, help="commit to record (a copy without git)")
    args = p.parse_args(argv)
    import torch
    ctx = dp.Context(args.device) if args.device else dp.default_context()
    torch_device = nets.torch_device_for(ctx, args.torch_device)
    nets.setup_torch_baseline(torch_device)
    commit = measured_commit(args.commit)
    print(f"dlprim_py training steps on {ctx.info.name} (driver {ctx.info.driver_version}); "
          f"torch {torch.__version__} on {torch_device}; commit {commit}")
    rows = []
    for net in args.nets.split(","):
        for optimizer in args.optimizers.split(","):
            r = run_case(ctx, net, optimizer, args.batch, args.image_size, torch_device,
                         args.warmup, args.repeat)
            rows.append(r)
            errors = ", ".join(f"{k} {v:.2f}" for k, v in r["errors"].items())
            print(f"  {net} {optimizer}: error / tolerance {errors} (against {r['torch_model']}): "
                  f"{'ok' if r['ok'] else 'FAILED'}", flush=True)
    print(f"\n{'net':13s} {'optim':6s} {'batch':>5s} {'ours ms':>8s} {'torch ms':>9s} "
          f"{'torch/ours':>10s} {'opt ours':>9s} {'opt torch':>9s} {'ratio':>6s}  status")
    for r in rows:
        o, t = r["ours"]["median_ms"], r["torch"]["median_ms"]
        oo, to = r["ours_optimizer"]["median_ms"], r["torch_optimizer"]["median_ms"]
        print(f"{r['net']:13s} {r['optimizer']:6s} {r['batch']:5d} {o:8.2f} {t:9.2f} {t / o:10.2f} "
              f"{oo:9.3f} {to:9.3f} {to / oo:6.2f}  {'ok' if r['ok'] else 'FAILED'}")
    ratios = [r["torch"]["median_ms"] / r["ours"]["median_ms"] for r in rows if r["ok"]]
    if ratios:
        print(f"geomean torch/ours {geomean(ratios):.3f} over {len(ratios)} steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                       "torch": torch.__version__, "torch_device": str(torch_device),
                       "commit": commit, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
