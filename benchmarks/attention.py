"""Fused attention and a transformer block against PyTorch, as users call them.

    python benchmarks/attention.py                        # the H200 set: (8, 12, 512..2048, 64)
    python benchmarks/attention.py --quick --torch-device cpu     # tiny sizes (PoCL, CI)
    python benchmarks/attention.py --json benchmarks/results/attention-h200.json
    python benchmarks/attention.py --solver mma --suites sdpa     # one solver forced

(a) ``F.scaled_dot_product_attention`` at (batch, heads, seq, head dim), causal and not, forward
alone and forward + backward (the gradients of q, k and v), against
``torch.nn.functional.scaled_dot_product_attention`` on the same data.
(b) A pre-norm transformer block written with ``dp.functional`` (layer_norm, q/k/v linear
projections, the fused attention, output projection, MLP with GELU, residuals), inference and a
training step (forward and backward through the tape of loss = mean squared output, every
weight's gradient), against the same block in PyTorch eager with the same weights.

Every case is checked first (ours against PyTorch float32 on the same device, and both against
a float64 reference on the CPU for the attention), then timed with the host clock around the
public call with the device drained (``ctx.queue.finish()`` / ``torch.cuda.synchronize()``):
median after a warm-up, PyTorch in the same process with TF32 off, the two sides timed in three
alternating rounds (a clock ramp at the start of the run falls on both). Ratio = torch time /
ours.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.record import geomean, measured_commit  # noqa: E402

F = dp.functional


def _error(out, ref):
    """MIOpen's metric: ||out - ref|| / (sqrt(n) * max|ref|); inf where out has NaN/Inf."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.isfinite(out).all():
        return float("inf")
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.linalg.norm(out - ref) / (math.sqrt(max(ref.size, 1)) * scale))


# float32 against float64: attention's sums are over S and the head dim.
ATTENTION_TOLERANCE = 1e-5
BLOCK_TOLERANCE = 1e-4


def attention_case(ctx, torch, torch_device, batch, heads, seq, head_dim, causal, backward,
                   warmup, repeat, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, heads, seq, head_dim)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    grad = rng.standard_normal(shape).astype(np.float32)
    ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=backward) for a in arrays]
    ours_grad = dp.Tensor.from_numpy(ctx, grad)
    theirs = [torch.tensor(a, device=torch_device, requires_grad=backward) for a in arrays]
    theirs_grad = torch.tensor(grad, device=torch_device)
    tsdpa = torch.nn.functional.scaled_dot_product_attention

    def call():
        for t in ours:
            t.grad = None
        out = F.scaled_dot_product_attention(*ours, is_causal=causal)
        if backward:
            out.backward(ours_grad)
        return out

    def torch_call():
        for t in theirs:
            t.grad = None
        out = tsdpa(*theirs, is_causal=causal)
        if backward:
            out.backward(theirs_grad)
        return out

    # Check: ours and torch's float32 against float64 on the CPU (one batch/head slice of each
    # when the problem is large, to keep the reference cheap).
    out = call()
    tout = torch_call()
    sl = slice(0, 1) if batch * heads * seq > 8 * 12 * 512 else slice(None)
    ref_in = [torch.tensor(a[sl], dtype=torch.float64, requires_grad=backward) for a in arrays]
    ref = tsdpa(*ref_in, is_causal=causal)
    errors = {"out": _error(out.numpy()[sl], ref.detach().numpy()),
              "torch_out": _error(tout.detach().cpu().numpy()[sl], ref.detach().numpy())}
    if backward:
        ref.backward(torch.tensor(grad[sl], dtype=torch.float64))
        for name, o, t, r in zip("qkv", ours, theirs, ref_in):
            errors[f"d{name}"] = _error(o.grad.numpy()[sl], r.grad.numpy())
            errors[f"torch_d{name}"] = _error(t.grad.cpu().numpy()[sl], r.grad.numpy())
    ok = all(v <= ATTENTION_TOLERANCE for k, v in errors.items() if not k.startswith("torch_"))
    drain = ctx.queue.finish
    torch_drain = (lambda: torch.cuda.synchronize()) if str(torch_device).startswith("cuda") \
        else (lambda: None)
    ours_t, theirs_t = nets.paired_wall_times(call, drain, torch_call, torch_drain, warmup,
                                              repeat)
    flops = 4 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
    flops *= 3.5 if backward else 1.0     # backward: 5 GEMM-sized products against 2
    return {"case": "sdpa", "shape": list(shape), "causal": causal, "backward": backward,
            "ok": ok, "errors": errors, "ours": nets._summary_ms(ours_t),
            "torch": nets._summary_ms(theirs_t), "gflop": flops / 1e9}


class Block:
    """A pre-norm transformer block's weights (numpy), and the block in both libraries."""

    def __init__(self, d_model, heads, hidden, seed=0):
        rng = np.random.default_rng(seed)
        self.d, self.heads, self.hidden = d_model, heads, hidden

        def w(*shape):
            return (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32)

        def b(n):
            return (0.1 * rng.standard_normal(n)).astype(np.float32)

        self.weights = {"ln1_w": (1 + b(d_model)), "ln1_b": b(d_model),
                        "wq": w(d_model, d_model), "bq": b(d_model),
                        "wk": w(d_model, d_model), "bk": b(d_model),
                        "wv": w(d_model, d_model), "bv": b(d_model),
                        "wo": w(d_model, d_model), "bo": b(d_model),
                        "ln2_w": (1 + b(d_model)), "ln2_b": b(d_model),
                        "w1": w(hidden, d_model), "b1": b(hidden),
                        "w2": w(d_model, hidden), "b2": b(d_model)}

    def ours(self, p, x):
        n, t, d = x.shape
        h, hd = self.heads, d // self.heads

        def heads_first(y):
            return F.permute(y.reshape(n, t, h, hd), (0, 2, 1, 3))

        a = F.layer_norm(x, (d,), p["ln1_w"], p["ln1_b"])
        q = heads_first(F.linear(a, p["wq"], p["bq"]))
        k = heads_first(F.linear(a, p["wk"], p["bk"]))
        v = heads_first(F.linear(a, p["wv"], p["bv"]))
        att = F.scaled_dot_product_attention(q, k, v)
        att = F.permute(att, (0, 2, 1, 3)).reshape(n, t, d)
        x = x + F.linear(att, p["wo"], p["bo"])
        m = F.layer_norm(x, (d,), p["ln2_w"], p["ln2_b"])
        m = F.linear(F.gelu(F.linear(m, p["w1"], p["b1"])), p["w2"], p["b2"])
        return x + m

    def torch(self, torch, p, x):
        tf = torch.nn.functional
        n, t, d = x.shape
        h, hd = self.heads, d // self.heads

        def heads_first(y):
            return y.view(n, t, h, hd).transpose(1, 2)

        a = tf.layer_norm(x, (d,), p["ln1_w"], p["ln1_b"])
        q = heads_first(tf.linear(a, p["wq"], p["bq"]))
        k = heads_first(tf.linear(a, p["wk"], p["bk"]))
        v = heads_first(tf.linear(a, p["wv"], p["bv"]))
        att = tf.scaled_dot_product_attention(q, k, v)
        att = att.transpose(1, 2).reshape(n, t, d)
        x = x + tf.linear(att, p["wo"], p["bo"])
        m = tf.layer_norm(x, (d,), p["ln2_w"], p["ln2_b"])
        m = tf.linear(tf.gelu(tf.linear(m, p["w1"], p["b1"])), p["w2"], p["b2"])
        return x + m


def _print_kernel_profile(ctx, call, label):
    """Device time per kernel name over one call (profiling events): where the time goes."""
    from dlprim_py import launch
    with launch.kernel_events() as events:
        call()
    ctx.queue.finish()
    per = {}
    for kernel, event in events:
        n, t = per.get(kernel, (0, 0.0))
        per[kernel] = (n + 1, t + (event.profile.end - event.profile.start) * 1e-6)
    busy = sum(t for _, t in per.values())
    print(f"  {label}: {len(events)} launches, device busy {busy:.3f} ms")
    for kernel, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"     {kernel:40s} {n:4d} x {1e3 * t / n:8.1f} us = {t:7.3f} ms")


def block_case(ctx, torch, torch_device, batch, seq, d_model, heads, train, warmup, repeat,
               seed=0, profile=False):
    block = Block(d_model, heads, 4 * d_model, seed)
    rng = np.random.default_rng(seed + 1)
    x_np = rng.standard_normal((batch, seq, d_model)).astype(np.float32)
    target_np = rng.standard_normal((batch, seq, d_model)).astype(np.float32)
    ours_p = {k: dp.Tensor.from_numpy(ctx, v, requires_grad=train)
              for k, v in block.weights.items()}
    theirs_p = {k: torch.tensor(v, device=torch_device, requires_grad=train)
                for k, v in block.weights.items()}
    x, target = dp.Tensor.from_numpy(ctx, x_np), dp.Tensor.from_numpy(ctx, target_np)
    tx = torch.tensor(x_np, device=torch_device)
    ttarget = torch.tensor(target_np, device=torch_device)

    def call():
        if not train:
            with dp.no_grad():
                return block.ours(ours_p, x)
        for p in ours_p.values():
            p.grad = None
        loss = F.mse_loss(block.ours(ours_p, x), target)
        loss.backward()
        return loss

    def torch_call():
        if not train:
            with torch.no_grad():
                return block.torch(torch, theirs_p, tx)
        for p in theirs_p.values():
            p.grad = None
        loss = torch.nn.functional.mse_loss(block.torch(torch, theirs_p, tx), ttarget)
        loss.backward()
        return loss

    # Check ours against torch float32 on the same data: outputs (inference) or every weight's
    # gradient (training), MIOpen's metric.
    out, tout = call(), torch_call()
    if train:
        # The key bias's gradient is zero but for rounding (it adds q . bk to every score of a
        # query row, which softmax ignores): no relative error to compare.
        errors = {k: _error(ours_p[k].grad.numpy(), theirs_p[k].grad.cpu().numpy())
                  for k in block.weights if k != "bk"}
        errors["loss"] = abs(float(out.numpy()) - float(tout.item())) / abs(float(tout.item()))
    else:
        errors = {"out": _error(out.numpy(), tout.cpu().numpy())}
    ok = all(v <= BLOCK_TOLERANCE for v in errors.values())
    drain = ctx.queue.finish
    torch_drain = (lambda: torch.cuda.synchronize()) if str(torch_device).startswith("cuda") \
        else (lambda: None)
    ours_t, theirs_t = nets.paired_wall_times(call, drain, torch_call, torch_drain, warmup,
                                              repeat)
    if profile:
        _print_kernel_profile(ctx, call, f"block {'train' if train else 'infer'}")
    return {"case": "block", "shape": [batch, seq, d_model, heads], "train": train, "ok": ok,
            "errors": {k: v for k, v in errors.items()}, "ours": nets._summary_ms(ours_t),
            "torch": nets._summary_ms(theirs_t)}


def _label(r):
    if r["case"] == "sdpa":
        b, h, s, e = r["shape"]
        return (f"sdpa b{b} h{h} s{s} d{e} {'causal' if r['causal'] else 'full':6s} "
                f"{'fwd+bwd' if r['backward'] else 'fwd'}")
    b, s, d, h = r["shape"]
    return f"block b{b} s{s} d{d} h{h} {'train' if r['train'] else 'infer'}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seqs", default="512,1024,2048")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-batch", type=int, default=8)
    p.add_argument("--block-seq", type=int, default=512)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--suites", default="sdpa,block")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (batch 2, heads 2, seq 64/96, head dim 16; block 2x32x64): a "
                        "run that checks the script on PoCL")
    p.add_argument("--profile", action="store_true",
                   help="also print the block's device time per kernel (profiling events)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--device", default=None, help="OpenCL device (P:D or part of its name)")
    p.add_argument("--torch-device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--commit", default=None, help="commit to record (a copy without git)")
    p.add_argument("--solver", default=None,
                   help="force an attention solver (rows, tiled, mma: DLPRIM_ATTENTION_ALGO) "
                        "instead of the tuned choice")
    args = p.parse_args(argv)
    if args.solver:
        os.environ["DLPRIM_ATTENTION_ALGO"] = args.solver
        dp.config.reload()
    if args.quick:
        args.batch, args.heads, args.seqs, args.head_dim = 2, 2, "64,96", 16
        args.block_batch, args.block_seq, args.d_model = 2, 32, 64
        args.warmup, args.repeat = 1, 3
    import torch
    ctx = dp.Context(args.device) if args.device else dp.default_context()
    torch_device = nets.torch_device_for(ctx, args.torch_device)
    nets.setup_torch_baseline(torch_device)
    commit = measured_commit(args.commit)
    print(f"dlprim_py attention on {ctx.info.name} (driver {ctx.info.driver_version}); "
          f"torch {torch.__version__} on {torch_device}; commit {commit}"
          + (f"; solver {args.solver} forced" if args.solver else ""))
    suites = args.suites.split(",")
    rows = []

    def report(r):
        rows.append(r)
        errors = ", ".join(f"{k} {v:.1e}" for k, v in r["errors"].items())
        print(f"  {_label(r)}: {errors}: {'ok' if r['ok'] else 'FAILED'}", flush=True)

    if "sdpa" in suites:
        for seq in (int(s) for s in args.seqs.split(",")):
            for causal in (False, True):
                for backward in (False, True):
                    report(attention_case(ctx, torch, torch_device, args.batch, args.heads, seq,
                                          args.head_dim, causal, backward, args.warmup,
                                          args.repeat))
    if "block" in suites:
        for train in (False, True):
            report(block_case(ctx, torch, torch_device, args.block_batch, args.block_seq,
                              args.d_model, args.d_model // 64 if not args.quick else 4, train,
                              args.warmup, args.repeat, profile=args.profile))
    print(f"\n{'case':40s} {'ours ms':>9s} {'torch ms':>9s} {'torch/ours':>10s} "
          f"{'TFLOP/s':>8s}  status")
    for r in rows:
        o, t = r["ours"]["median_ms"], r["torch"]["median_ms"]
        r["ratio"] = t / o if o > 0 else None
        rate = f"{r['gflop'] / o:8.2f}" if "gflop" in r else " " * 8
        print(f"{_label(r):40s} {o:9.3f} {t:9.3f} {r['ratio']:10.2f} {rate}  "
              f"{'ok' if r['ok'] else 'FAILED'}")
    print(f"geometric mean torch/ours: {geomean(r['ratio'] for r in rows if r['ok']):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                       "torch": torch.__version__, "torch_device": str(torch_device),
                       "commit": commit, "solver": args.solver, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
