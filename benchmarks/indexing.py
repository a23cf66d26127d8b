"""Indexing, scans and selection on large tensors against PyTorch in the same process:
embedding (forward, and forward + backward), index_select, gather, cumsum and topk.

    python benchmarks/indexing.py                                # full sizes (a GPU)
    python benchmarks/indexing.py --scale 0.02 --torch-device cpu --repeat 3   # a quick check
    python benchmarks/indexing.py --json benchmarks/results/indexing-h200.json

Each case is checked first against PyTorch on the same inputs (exact for the selections and
topk's values, the error metric of the tests for cumsum and the gradients), then timed: the
host clock around the public call with the device drained (``ctx.queue.finish()`` /
``torch.cuda.synchronize()``), median after a warm-up. PyTorch runs float32 with TF32 off.
``--scale`` shrinks the large dimensions (for a check on a CPU).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
import dlprim_py.functional as F  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402

TOLERANCE = 1e-5


def _scaled(n, scale, minimum=1):
    return max(minimum, int(round(n * scale)))


def cases(scale):
    """name -> (description, a builder: (ctx, torch, device, rng) -> (ours, theirs, check))."""
    V, E = _scaled(50000, scale, 16), _scaled(768, scale, 4)
    B, S = 8, _scaled(512, scale, 2)
    side = _scaled(4096, scale, 8)
    long_n = _scaled(2 ** 24, scale ** 2, 1024)
    rows, vocab = 64, _scaled(32000, scale, 64)
    k = min(50, vocab)
    return {
        "embedding": (f"embedding {V}x{E}, indices {B}x{S}",
                      lambda *a: _embedding(*a, V, E, B, S, backward=False)),
        "embedding_fwd_bwd": (f"embedding {V}x{E}, indices {B}x{S}, forward + backward",
                              lambda *a: _embedding(*a, V, E, B, S, backward=True)),
        "index_select": (f"index_select dim 0 of {V}x{E}, {B * S} indices",
                         lambda *a: _index_select(*a, V, E, B * S)),
        "gather": (f"gather dim 1 of {side}x{side}",
                   lambda *a: _gather(*a, side)),
        "cumsum_long": (f"cumsum of {long_n} elements",
                        lambda *a: _cumsum(*a, (long_n,), 0)),
        "cumsum_rows": (f"cumsum along the rows of {side}x{side}",
                        lambda *a: _cumsum(*a, (side, side), 1)),
        "topk": (f"topk k={k} of {rows}x{vocab} along the rows",
                 lambda *a: _topk(*a, rows, vocab, k)),
    }


def _pair(ctx, torch, device, array):
    return dp.Tensor.from_numpy(ctx, array), torch.from_numpy(array).to(device)


def _exact(a, b):
    return 0.0 if np.array_equal(a, b) else float("inf")


def _embedding(ctx, torch, device, rng, V, E, B, S, backward):
    w = rng.standard_normal((V, E)).astype(np.float32)
    idx = rng.integers(0, V, (B, S))
    W, WT = _pair(ctx, torch, device, w)
    I, IT = _pair(ctx, torch, device, idx)
    g = rng.standard_normal((B, S, E)).astype(np.float32)
    G, GT = _pair(ctx, torch, device, g)
    if backward:
        W.requires_grad_(True)
        WT.requires_grad_(True)

    def ours():
        y = F.embedding(I, W)
        if backward:
            W.grad = None
            y.backward(G)
        return y

    def theirs():
        y = torch.nn.functional.embedding(IT, WT)
        if backward:
            WT.grad = None
            y.backward(GT)
        return y

    def check():
        errors = {"forward": _exact(ours().numpy(), theirs().detach().cpu().numpy())}
        if backward:
            errors["weight_grad"] = error_metric(W.grad.numpy(), WT.grad.cpu().numpy()) / TOLERANCE
        return errors
    return ours, theirs, check


def _index_select(ctx, torch, device, rng, V, E, L):
    x = rng.standard_normal((V, E)).astype(np.float32)
    idx = rng.integers(0, V, L)
    X, XT = _pair(ctx, torch, device, x)
    I, IT = _pair(ctx, torch, device, idx)
    ours = lambda: F.index_select(X, 0, I)  # noqa: E731
    theirs = lambda: torch.index_select(XT, 0, IT)  # noqa: E731
    return ours, theirs, lambda: {"forward": _exact(ours().numpy(), theirs().cpu().numpy())}


def _gather(ctx, torch, device, rng, side):
    x = rng.standard_normal((side, side)).astype(np.float32)
    idx = rng.integers(0, side, (side, side))
    X, XT = _pair(ctx, torch, device, x)
    I, IT = _pair(ctx, torch, device, idx)
    ours = lambda: F.gather(X, 1, I)  # noqa: E731
    theirs = lambda: torch.gather(XT, 1, IT)  # noqa: E731
    return ours, theirs, lambda: {"forward": _exact(ours().numpy(), theirs().cpu().numpy())}


def _cumsum(ctx, torch, device, rng, shape, dim):
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    X, XT = _pair(ctx, torch, device, x)
    ours = lambda: F.cumsum(X, dim)  # noqa: E731
    theirs = lambda: torch.cumsum(XT, dim)  # noqa: E731
    reference = np.cumsum(x.astype(np.float64), dim)

    def check():
        # Against float64; torch's float32 result is measured the same way, for scale.
        return {"forward": error_metric(ours().numpy(), reference) / TOLERANCE,
                "torch_forward": error_metric(theirs().cpu().numpy(), reference) / TOLERANCE}
    return ours, theirs, check


def _topk(ctx, torch, device, rng, rows, n, k):
    x = rng.standard_normal((rows, n)).astype(np.float32)
    X, XT = _pair(ctx, torch, device, x)
    ours = lambda: F.topk(X, k, -1)  # noqa: E731
    theirs = lambda: torch.topk(XT, k, -1)  # noqa: E731

    def check():
        values, indices = ours()
        want = theirs()
        return {"values": _exact(values.numpy(), want.values.cpu().numpy()),
                "indices": _exact(indices.numpy(), want.indices.cpu().numpy())}
    return ours, theirs, check


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="factor on the large dimensions (cumsum_long: its square)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--device", default=None, help="OpenCL device (P:D or part of its name)")
    p.add_argument("--torch-device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--commit", default=None, help="commit to record (a copy without git)")
    args = p.parse_args(argv)
    import torch
    ctx = dp.Context(args.device) if args.device else dp.default_context()
    torch_device = nets.torch_device_for(ctx, args.torch_device)
    nets.setup_torch_baseline(torch_device)
    cuda = str(torch_device).startswith("cuda")
    commit = measured_commit(args.commit)
    print(f"dlprim_py indexing on {ctx.info.name} (driver {ctx.info.driver_version}); "
          f"torch {torch.__version__} on {torch_device}; commit {commit}")
    table = cases(args.scale)
    names = args.cases.split(",") if args.cases else list(table)
    rows = []
    for name in names:
        description, build = table[name]
        rng = np.random.default_rng(0)
        ours, theirs, check = build(ctx, torch, torch_device, rng)
        errors = check()
        ok = all(e <= 1.0 for key, e in errors.items() if not key.startswith("torch_"))
        mine = nets.wall_times(ours, ctx.queue.finish, args.warmup, args.repeat)
        drain = torch.cuda.synchronize if cuda else (lambda: None)
        with torch.no_grad() if "bwd" not in name else torch.enable_grad():
            their = nets.wall_times(theirs, drain, args.warmup, args.repeat)
        row = {"case": name, "description": description, "ok": ok, "errors": errors,
               "ours": nets._summary_ms(mine), "torch": nets._summary_ms(their)}
        rows.append(row)
        shown = ", ".join(f"{k} {v:.2g}" for k, v in errors.items())
        print(f"  {name}: {description}: error / tolerance {shown}: "
              f"{'ok' if ok else 'FAILED'}", flush=True)
    print(f"\n{'case':18s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s}  status")
    for r in rows:
        o, t = r["ours"]["median_ms"], r["torch"]["median_ms"]
        print(f"{r['case']:18s} {o:9.3f} {t:9.3f} {t / o:10.2f}  {'ok' if r['ok'] else 'FAILED'}")
    ratios = [r["torch"]["median_ms"] / r["ours"]["median_ms"] for r in rows if r["ok"]]
    if ratios:
        print(f"geomean torch/ours {geomean(ratios):.3f} over {len(ratios)} cases")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                       "torch": torch.__version__, "torch_device": str(torch_device),
                       "commit": commit, "scale": args.scale, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
