"""Batch-1 3x3 convolutions of ResNet-18/50: each algorithm forced through F.conv2d
(DLPRIM_CONV_ALGO, reloaded), microseconds per call in a stream of 50 calls (drained at the end)
and per lone call (drained after it); "!" marks a result off the first algorithm's by more than
1e-4, "-" an algorithm that does not apply. The H200's figures are in dispatch-h200/NOTES.md.

    python benchmarks/conv_batch1_probe.py
"""
import os, time, numpy as np, dlprim_py as dp, dlprim_py.functional as F
ctx = dp.Context(); rng = np.random.default_rng(0)
shapes = [(64, 56, 1), (128, 28, 1), (256, 14, 1), (512, 7, 1), (128, 56, 2), (256, 28, 2), (512, 14, 2)]
algos = ["winograd", "winograd_f4x4", "implicit_gemm", "im2col_gemm", "direct"]
print(f"{'layer':14s}" + "".join(f"{a:>18s}" for a in algos))
for c, hw, stride in shapes:
    x = dp.Tensor.from_numpy(ctx, rng.standard_normal((1, c, hw, hw)).astype(np.float32))
    w = dp.Tensor.from_numpy(ctx, (rng.standard_normal((c, c, 3, 3)) * 0.05).astype(np.float32))
    ref = None
    row = f"{c}@{hw} s{stride}".ljust(14)
    for a in algos:
        os.environ["DLPRIM_CONV_ALGO"] = a; dp.config.reload()
        try:
            y = F.conv2d(x, w, padding=1, stride=stride).numpy()
        except dp.DlprimError:
            row += f"{'-':>18s}"; continue
        if ref is None: ref = y
        err = np.abs(y - ref).max() / np.abs(ref).max()
        for _ in range(5): F.conv2d(x, w, padding=1, stride=stride)
        ctx.synchronize()
        t0 = time.perf_counter()
        for _ in range(50): F.conv2d(x, w, padding=1, stride=stride)
        ctx.synchronize(); stream = (time.perf_counter() - t0) / 50 * 1e6
        lone = []
        for _ in range(20):
            t0 = time.perf_counter(); F.conv2d(x, w, padding=1, stride=stride); ctx.synchronize(); lone.append(time.perf_counter() - t0)
        row += f"{stream:8.1f}/{1e6*np.median(lone):6.1f}{'!' if err > 1e-4 else ' '}  "
    print(row, flush=True)
os.environ.pop("DLPRIM_CONV_ALGO"); dp.config.reload()
print("(us per call in a stream / per lone drained call)")
