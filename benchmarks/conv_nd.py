"""1-D and 3-D convolutions and 3-D pooling: dlprim_py.functional against PyTorch, in the same
process, public calls, wall clock.

    python benchmarks/conv_nd.py [--quick] [--repeat 20] [--output results.json]

Each case is checked against PyTorch in float64 (MIOpen's error metric, 1e-5 for float32;
1e-4 for the 3-D convolutions' long reductions) before it is timed; a wrong result is reported
and not timed. Timing: wall clock around one public call with the device drained after it
(``ctx.queue.finish()`` / ``torch.cuda.synchronize()``), median over ``--repeat`` calls after
three warm-up calls; "forward" runs the call alone, "train" the call and the backward of every
input (sum of the output times a fixed gradient). PyTorch runs on CUDA when it is there (TF32
off), else on the CPU. The table's ratio is PyTorch's time over ours (> 1: we are faster).
``--quick`` shrinks the shapes for a smoke run on PoCL.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py import functional as F  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402


def cases(quick):
    """(name, function name, input shapes (input, weight, bias...), keyword arguments,
    tolerance)."""
    if quick:
        n, c, s = 2, 4, 6
        return [
            ("conv3d 3x3x3", "conv3d", [(n, c, s, s, s), (8, c, 3, 3, 3), (8,)],
             dict(padding=1), 1e-4),
            ("conv3d depthwise", "conv3d", [(n, c, s, s, s), (c, 1, 3, 3, 3)],
             dict(padding=1, groups=c), 1e-4),
            ("conv_transpose3d s2", "conv_transpose3d", [(n, c, 4, 4, 4), (c, 4, 2, 2, 2)],
             dict(stride=2), 1e-4),
            ("conv1d k5", "conv1d", [(n, c, 64), (8, c, 5), (8,)], dict(padding=2), 1e-5),
            ("max_pool3d 3 s2", "max_pool3d", [(n, c, s, s, s)], dict(kernel_size=3, stride=2,
                                                                        padding=1), 1e-5),
        ]
    n = 8
    return [
        ("conv3d 64->64 3x3x3 16x56x56", "conv3d", [(n, 64, 16, 56, 56), (64, 64, 3, 3, 3), (64,)],
         dict(padding=1), 1e-4),
        ("conv3d 128->128 3x3x3 8x28x28", "conv3d",
         [(n, 128, 8, 28, 28), (128, 128, 3, 3, 3), (128,)], dict(padding=1), 1e-4),
        ("conv3d 3->64 3x7x7 s(1,2,2)", "conv3d", [(n, 3, 16, 112, 112), (64, 3, 3, 7, 7)],
         dict(stride=(1, 2, 2), padding=(1, 3, 3)), 1e-4),
        ("conv3d depthwise 64 3x3x3", "conv3d", [(n, 64, 16, 56, 56), (64, 1, 3, 3, 3)],
         dict(padding=1, groups=64), 1e-4),
        ("conv_transpose3d 64->32 2x2x2 s2", "conv_transpose3d",
         [(n, 64, 8, 28, 28), (64, 32, 2, 2, 2)], dict(stride=2), 1e-4),
        ("conv1d 256->256 k3 L4096", "conv1d", [(n, 256, 4096), (256, 256, 3), (256,)],
         dict(padding=1), 1e-4),
        ("max_pool3d 3 s2", "max_pool3d", [(n, 64, 16, 56, 56)],
         dict(kernel_size=3, stride=2, padding=1), 1e-5),
        ("avg_pool3d 2 s2", "avg_pool3d", [(n, 64, 16, 56, 56)], dict(kernel_size=2), 1e-5),
    ]


def median_time(run, sync, repeat):
    for _ in range(3):
        run()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync_torch = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ctx = dp.Context()
    sync_ours = ctx.queue.finish
    rng = np.random.default_rng(0)
    rows = []
    for name, fn, shapes, kwargs, tolerance in cases(args.quick):
        hosts = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
        ours_in = [dp.Tensor.from_numpy(ctx, h, requires_grad=True) for h in hosts]
        ref_in = [torch.tensor(h, dtype=torch.float64, requires_grad=True) for h in hosts]
        theirs_in = [torch.tensor(h, device=device, requires_grad=True) for h in hosts]
        ours_fn, torch_fn = getattr(F, fn), getattr(torch.nn.functional, fn)
        ref = torch_fn(*ref_in, **kwargs)
        grad = rng.uniform(-1, 1, tuple(ref.shape)).astype(np.float32)
        ref.backward(torch.tensor(grad, dtype=torch.float64))
        y = ours_fn(*ours_in, **kwargs)
        y.backward(dp.Tensor.from_numpy(ctx, grad))
        errors = [error_metric(y.numpy(), ref.detach().numpy())]
        errors += [error_metric(o.grad.numpy(), r.grad.numpy()) for o, r in zip(ours_in, ref_in)]
        ok = max(errors) <= tolerance
        row = {"case": name, "shapes": shapes, "kwargs": {k: str(v) for k, v in kwargs.items()},
               "error": max(errors), "ok": ok, "torch_device": device}
        if ok:
            g_ours = dp.Tensor.from_numpy(ctx, grad)
            g_torch = torch.tensor(grad, device=device)

            def ours_forward():
                with dp.autograd.no_grad():
                    ours_fn(*ours_in, **kwargs)

            def ours_train():
                for t in ours_in:
                    t.grad = None
                ours_fn(*ours_in, **kwargs).backward(g_ours)

            def torch_forward():
                with torch.no_grad():
                    torch_fn(*theirs_in, **kwargs)

            def torch_train():
                for t in theirs_in:
                    t.grad = None
                torch_fn(*theirs_in, **kwargs).backward(g_torch)

            for label, ours, theirs in (("forward", ours_forward, torch_forward),
                                        ("train", ours_train, torch_train)):
                row[f"ours_{label}_ms"] = 1e3 * median_time(ours, sync_ours, args.repeat)
                row[f"torch_{label}_ms"] = 1e3 * median_time(theirs, sync_torch, args.repeat)
        rows.append(row)
        for t in ours_in:
            t.grad = None
    print(f"{'case':40s} {'fwd ours':>9s} {'fwd torch':>9s} {'ratio':>6s} "
          f"{'train ours':>10s} {'train torch':>11s} {'ratio':>6s}  (ms; ratio = torch / ours)")
    for r in rows:
        if not r["ok"]:
            print(f"{r['case']:40s} WRONG RESULT (error {r['error']:.2e}), not timed")
            continue
        f_ratio = r["torch_forward_ms"] / r["ours_forward_ms"]
        t_ratio = r["torch_train_ms"] / r["ours_train_ms"]
        print(f"{r['case']:40s} {r['ours_forward_ms']:9.3f} {r['torch_forward_ms']:9.3f} "
              f"{f_ratio:6.2f} {r['ours_train_ms']:10.3f} {r['torch_train_ms']:11.3f} "
              f"{t_ratio:6.2f}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"device": ctx.info.name, "torch_device": device, "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
