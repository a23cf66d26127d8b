"""The attention solvers at several tile configurations against PyTorch's SDPA (tuning aid).

    python benchmarks/attention_tiles.py              # (8, 12, 512..2048, 64) on CUDA + the GPU
    PROBE_CONFIGS='[{"solver": "tiled", "block_m": 64, "block_n": 32, "tile_y": 8}]' \
    PROBE_SEQS=1024 PROBE_BACKWARD=0 OUT=/tmp python benchmarks/attention_tiles.py
    PROBE_SET=mma python benchmarks/attention_tiles.py   # the mma solver's variants and tiled's

Each configuration is put ahead of the shipped rules as a user tuning rule, checked against
torch's float32 result on the same device (max abs error of the output and the gradients), then
timed through the public call with the device drained: forward (no tape) and forward + backward,
median of 10 after 3 warm-ups, torch with TF32 off; then the same calls' device time (markers,
the device kept busy by a forward before each: the column that tells settings apart). One JSON
line per case; $OUT/probe.json. The user rule is removed at the end.
"""
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlprim_py as dp
from dlprim_py import tuning
from dlprim_py.bench import nets
from dlprim_py.timing import time_enqueued

F = dp.functional
import torch  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
ctx = dp.Context()
print("device", ctx.info.name if hasattr(ctx.info, "name") else ctx.info)
dev = "cuda" if torch.cuda.is_available() else "cpu"
quick = dev == "cpu"


def set_rules(rules):
    path = tuning.user_path("attention")
    tuning.store_device_entry(path, "attention", ctx.info, list(rules))
    tuning.forget()


TILED = {"solver": "tiled", "block_m": 64, "block_n": 32, "tile_y": 8}
SHIPPED_MMA = {"solver": "mma", "warps": 4, "block_n": 32, "kv_warps": 4, "q_step": 16,
               "q_warps": 4, "k_step": 16, "stages": 2}
# The mma solver (3xTF32 on tensor cores): forward warps x block_n, dK/dV kv_warps x q_step, dQ
# q_warps x k_step. First the NVIDIA rule as shipped, then its forward with warps owning two m16
# tiles of query rows (m_tiles 2: each k / v B fragment read and split once for both; q split at
# each step unless q_split) at warps x block_n x stages, the backward's values as shipped
# (stages is both's): run first, so that a bounded run (run_gpu.sh's step) measures them.
# Then the variants measured before and the shipped tiled values to compare.
MMA_SET = [SHIPPED_MMA] + [
    dict(SHIPPED_MMA, m_tiles=2, warps=warps, block_n=block_n, stages=stages)
    for warps, block_n, stages in ((4, 32, 2), (2, 32, 2), (4, 32, 1), (4, 64, 1), (2, 32, 1),
                                   (2, 64, 1), (8, 32, 2))] + [
    dict(SHIPPED_MMA, m_tiles=2, q_split=True),
    dict(SHIPPED_MMA, m_tiles=2, warps=2, q_split=True),
    # q's fragments read again (through the caches) at each step instead of kept: fewer
    # registers, with two row tiles and with one.
    dict(SHIPPED_MMA, m_tiles=2, q_frags=False),
    dict(SHIPPED_MMA, q_frags=False),
    TILED,
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32},
    {"solver": "mma", "warps": 4, "block_n": 32, "kv_warps": 4, "q_step": 16, "q_warps": 4,
     "k_step": 16},
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 64, "q_warps": 4,
     "k_step": 64},
    {"solver": "mma", "warps": 8, "block_n": 64, "kv_warps": 8, "q_step": 32, "q_warps": 8,
     "k_step": 32},
    {"solver": "mma", "warps": 2, "block_n": 64, "kv_warps": 2, "q_step": 32, "q_warps": 2,
     "k_step": 32},
    # Two buffers of tiles, the next step's cp.async copies in flight during this step (the
    # local memory then halves the forward's 64 keys per step to 32 at head dim 64).
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32, "stages": 2},
    # The forward's keys and values split once when staged (32 keys per step then fit).
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32, "presplit": True},
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32, "presplit": True, "round": "int"},
    # The TF32 parts rounded in integer operations instead of cvt.rna.tf32.f32.
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32, "round": "int"},
    # Fewer registers: q split at each step, the backward's own fragments read at each step.
    {"solver": "mma", "warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
     "k_step": 32, "q_split": False, "frags": False},
]
CONFIGS = json.loads(os.environ.get("PROBE_CONFIGS", "null")) or (
    MMA_SET if os.environ.get("PROBE_SET") == "mma" else None) or [
    {"solver": "rows"},
    {"solver": "tiled", "block_m": 64, "block_n": 32, "tile_y": 8},
    {"solver": "tiled", "block_m": 64, "block_n": 32, "tile_y": 16},
    {"solver": "tiled", "block_m": 32, "block_n": 32, "tile_y": 4},
    {"solver": "tiled", "block_m": 32, "block_n": 32, "tile_y": 8},
    {"solver": "tiled", "block_m": 64, "block_n": 16, "tile_y": 8},
]
SEQS = [int(s) for s in os.environ.get("PROBE_SEQS", "64" if quick else "512,1024,2048").split(",")]
B, H, D = (1, 2, 64) if quick else (8, 12, 64)
BACKWARD = int(os.environ.get("PROBE_BACKWARD", "1"))
results = []
# A timeout (SIGTERM) unwinds too, so that the probe's rule is removed however it ends.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
try:
    for seq in SEQS:
        rng = np.random.default_rng(0)
        shape = (B, H, seq, D)
        arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        grad = rng.standard_normal(shape).astype(np.float32)
        for causal in (False, True):
            tq = [torch.tensor(a, device=dev, requires_grad=True) for a in arrays]
            tg = torch.tensor(grad, device=dev)
            tout = torch.nn.functional.scaled_dot_product_attention(*tq, is_causal=causal)
            tout.backward(tg)
            tref = tout.detach().cpu().numpy()
            tgrads = [t.grad.cpu().numpy() for t in tq]
            sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

            def tfwd():
                with torch.no_grad():
                    return torch.nn.functional.scaled_dot_product_attention(*tq, is_causal=causal)

            def tboth():
                for t in tq:
                    t.grad = None
                torch.nn.functional.scaled_dot_product_attention(*tq, is_causal=causal).backward(tg)
            t_f = np.median(nets.wall_times(tfwd, sync, 3, 10)) * 1e3
            t_b = np.median(nets.wall_times(tboth, sync, 3, 10)) * 1e3 if BACKWARD else 0
            for cfg in CONFIGS:
                set_rules([{"when": {}, "params": cfg}])
                ours = [dp.Tensor.from_numpy(ctx, a, requires_grad=True) for a in arrays]
                og = dp.Tensor.from_numpy(ctx, grad)
                try:
                    out = F.scaled_dot_product_attention(*ours, is_causal=causal)
                    err = float(np.abs(out.numpy() - tref).max())
                    out.backward(og)
                    gerr = max(float(np.abs(o.grad.numpy() - t).max()) for o, t in zip(ours, tgrads))

                    def fwd():
                        with dp.autograd.no_grad():
                            return F.scaled_dot_product_attention(*ours, is_causal=causal)

                    def both():
                        for t in ours:
                            t.grad = None
                        F.scaled_dot_product_attention(*ours, is_causal=causal).backward(og)
                    o_f = np.median(nets.wall_times(fwd, ctx.queue.finish, 3, 10)) * 1e3
                    o_b = np.median(nets.wall_times(both, ctx.queue.finish, 3, 10)) * 1e3 \
                        if BACKWARD else 0
                    # Device time (markers, the device kept busy by a call before each): much
                    # less noisy than the wall clock, for telling settings apart.
                    d_f = time_enqueued(ctx, fwd, repeat=20, prime=fwd).median * 1e3
                    d_b = time_enqueued(ctx, both, repeat=10, prime=fwd).median * 1e3 \
                        if BACKWARD else 0
                    row = dict(seq=seq, causal=causal, cfg=cfg, err=err, gerr=gerr, fwd=o_f,
                               torch_fwd=t_f, ratio_fwd=t_f / o_f, both=o_b, torch_both=t_b,
                               ratio_both=(t_b / o_b) if o_b else 0, device_fwd=d_f,
                               device_both=d_b)
                except Exception as e:  # noqa: BLE001
                    row = dict(seq=seq, causal=causal, cfg=cfg, error=repr(e)[:300])
                results.append(row)
                print(json.dumps(row), flush=True)
finally:
    # The probe's rules must not outlive it: later runs with this cache would read them.
    if os.path.exists(tuning.user_path("attention")):
        os.remove(tuning.user_path("attention"))
    tuning.forget()
    out = os.environ.get("OUT")
    if out:     # the cases run so far
        with open(os.path.join(out, "probe.json"), "w") as f:
            json.dump(results, f, indent=1)
