"""Fused scaled dot-product attention (kernels/attention.cl.mako) and multi-head attention.

``scaled_dot_product_attention`` computes softmax(Q K^T * scale + bias) V FlashAttention-style:
an online softmax over tiles of keys staged in local memory, never the L x S score matrix; it
saves each query row's log-sum-exp, and its backward (FlashAttention-2) recomputes the weights
tile by tile: a preprocess takes D = rowsum(dO * O), one kernel sums dK and dV over the query
rows for a block of keys, another dQ over the keys for a block of query rows. Every gradient
element is summed by one work item in a fixed order: no atomics, the same bits on every run.

Batch dimensions broadcast as torch's: the call flattens the broadcast batch shape into B
batches and hands the kernels a table of each batch's offsets into q, k, v and the mask, which
also maps grouped-query heads (``enable_gqa``: query head h reads key/value head
h // (Hq / Hkv), repeat_interleave's order). Gradients of operands that broadcast are summed
over the batches that share them.

Dropout draws the same numbers as ``F.dropout`` on the (B, L, S) attention weights would with
the same seed and stream (Philox4x32-10 of the element index, ``dlprim_py.ops.dropout``): the
backward regenerates the mask, and ``attention_dropout_mask`` gives it on the host for tests.

The "attention" family (``dlprim_py.solver``) has three solvers. ``rows``: a query row per
``lanes`` work items in the forward and dQ (the forward's items may take ``rows`` query rows
each, sharing their reads of k and v), a key per ``lanes`` items in dK/dV, each item
holding its share of the head dims in registers (the lanes' partial dot products summed by warp
shuffles on NVIDIA, through local memory elsewhere); portable, chosen on CPUs. ``tiled``
(kernels/attention_tiled.cl.mako, head dims up to 128): every kernel's two products as a
GEMM's register tiles, each item a tile of several rows by several keys of the scores and of
several rows (or keys) by several head dims of its output, the operands staged in local memory;
several times fewer local-memory reads per multiply-add, chosen on NVIDIA GPUs without
mma.sync. ``mma`` (kernels/attention_mma.cl.mako, head dims up to 128): every product on
NVIDIA tensor cores, mma.sync m16n8k8 TF32 instructions with the 3xTF32 split (an operand as a
TF32 big part plus the TF32 of what it leaves, three mma per product: CUTLASS's
OpMultiplyAddFastF32, as PyTorch's fp32 attention on sm80+), so the results are fp32-accurate:
it is not TF32 math and runs with TF32 off; a warp owns 16 query rows (or keys) and the softmax
runs on the mma accumulators, which feed the next product directly; chosen on NVIDIA GPUs of
compute capability 8.0 and later (``DLPRIM_TF32_EMULATE`` runs its fragments emulated on any
device, for tests). Block sizes, tiles, lanes and warps are tuning values
(``tuning_db/attention.json``); steps shrink where the device's local memory is short.
"""
import math
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, program, solver, tuning
from ..context import PlanCache, check_same_context
from ..dtypes import bool_, float32
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
from ..launch import BoundKernel, run_planned_on
from ..tensor import Tensor
from . import dropout as _dropout
from .pointwise import broadcast_shapes, group_size

# The largest head dim the kernels take: a row of q (and of the output or a gradient) lives in
# each work item's registers.
MAX_HEAD_DIM = 256
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class AttentionProblem:
    """An attention of L query rows over S keys, head dims ``dk`` (q, k) and ``dv`` (v);
    ``mask``: "none", "bool" or "float"; ``causal``; ``dropout``: whether weights are dropped."""
    dk: int
    dv: int
    L: int
    S: int
    mask: str
    causal: bool
    dropout: bool

    def key(self):
        return (f"attention-dk{self.dk}-dv{self.dv}-l{self.L}-s{self.S}-m{self.mask}"
                f"-c{int(self.causal)}-p{int(self.dropout)}")

    def features(self):
        return {"dk": self.dk, "dv": self.dv, "L": self.L, "S": self.S, "mask": self.mask,
                "causal": int(self.causal), "dropout": int(self.dropout)}


class RowsSolver(solver.Solver):
    """A work item per query row (forward, dQ) and per key (dK, dV), head dims in registers,
    key and query tiles staged in local memory."""
    name = "rows"

    def applies(self, ctx, problem):
        return max(problem.dk, problem.dv) <= MAX_HEAD_DIM


class TiledSolver(solver.Solver):
    """Register-tiled products (kernels/attention_tiled.cl.mako), as a GEMM's: in the forward
    a work-group of query rows, each item a tile of several rows by several keys of the scores
    and of several rows by several head dims of the output; in the backward likewise a group
    of keys (dK, dV) or of query rows (dQ)."""
    name = "tiled"

    def applies(self, ctx, problem):
        return max(problem.dk, problem.dv) <= TILED_MAX_HEAD_DIM


# The largest head dim of the tiled solver: an item's output tile (its rows by a sixteenth of
# the head dims) lives in registers, and the q rows of a group in local memory.
TILED_MAX_HEAD_DIM = 128

# The largest head dim of the mma solver: a warp's 16 rows of q (split into two TF32 parts)
# and of the output (or its keys' k, v and gradients) live in registers as mma fragments.
MMA_MAX_HEAD_DIM = 128

# The mma solver's tuning values where no rule gives them: forward groups of 4 warps (64 query
# rows) by 64 keys per step; dK/dV groups of 4 warps (64 keys) by 32 query rows per step; dQ
# groups of 4 warps (64 rows) by 32 keys per step; one buffer of tiles (``stages`` 1); a
# forward warp owns one m16 tile of query rows (``m_tiles`` 1; 2 shares each k / v fragment
# between two); q's fragments in registers (``q_frags``). ``q_split`` and ``frags`` (the
# kernel's header) default to head dims up to 64 (``q_split`` with one row tile per warp).
DEFAULT_MMA = {"warps": 4, "block_n": 64, "kv_warps": 4, "q_step": 32, "q_warps": 4,
               "k_step": 32}


class MmaSolver(solver.Solver):
    """Every product on NVIDIA tensor cores (kernels/attention_mma.cl.mako): mma.sync m16n8k8
    TF32 instructions with the 3xTF32 split (each operand as a TF32 big part plus a TF32 small
    part, three mma per product, as CUTLASS's OpMultiplyAddFastF32 and PyTorch's fp32
    memory-efficient attention), so the results are fp32-accurate: it is not TF32 math and runs
    with TF32 off. FlashAttention-2 style: a warp owns 16 query rows (forward, dQ) or 16 keys
    (dK/dV); the softmax runs on the mma accumulators, which feed the next product directly.
    Needs compute capability 8.0 or later, or ``DLPRIM_TF32_EMULATE=1`` (the same mma
    fragments emulated through local memory on any device: slow, for tests)."""
    name = "mma"

    def refusal(self, ctx, problem):
        """Why the solver cannot take the problem on this device, or None."""
        if max(problem.dk, problem.dv) > MMA_MAX_HEAD_DIM:
            return (f"head dims up to {MMA_MAX_HEAD_DIM} (registers), got ({problem.dk}, "
                    f"{problem.dv})")
        if config.tf32_emulate():
            return None
        from .gemm import mma_device_problem
        return mma_device_problem(ctx.info)

    def applies(self, ctx, problem):
        return self.refusal(ctx, problem) is None


FAMILY = solver.register(solver.Family("attention", (RowsSolver(), TiledSolver(), MmaSolver()),
                                       title="attention solver"))
ALGORITHMS = tuple(FAMILY.solvers)


def _fit_local(ctx, dk, dv, mask, rows, keys, kind, exchange=0):
    """Shrink the steps (``keys`` of the forward, query rows of the key kernel) until the
    kernel's local memory fits the device (``exchange``: bytes of the lanes' exchange buffer);
    UnsupportedError when even 4 do not fit."""
    dk4, dv4 = (dk + 3) // 4, (dv + 3) // 4
    limit = ctx.info.local_mem_size

    def need(step):
        if kind == "forward":
            return 16 * step * (dk4 + dv4) + (4 * rows * (step + 1) if mask != "none" else 0) \
                + exchange
        return 16 * step * (dk4 + dv4) + 8 * step + (4 * step * rows if mask != "none" else 0) \
            + exchange

    while need(keys) > limit and keys > 4:
        keys //= 2
    if need(keys) > limit:
        raise UnsupportedError(f"scaled_dot_product_attention: head dims ({dk}, {dv}) need "
                               f"{need(keys)} bytes of local memory, the device has {limit}")
    return keys


def _lanes(ctx, problem, wanted, limit, rows):
    """Work items per row: ``wanted`` where the head dims' float4s split evenly and the group
    fits, else the largest power of two below it that does (1 always does)."""
    lanes = max(1, int(wanted))
    dk4, dv4 = (problem.dk + 3) // 4, (problem.dv + 3) // 4
    while lanes > 1 and (dk4 % lanes or dv4 % lanes or rows * lanes > limit):
        lanes //= 2
    return lanes


def _odd(n):
    return n + 1 if n % 2 == 0 else n


def _tiled_local(kernel, dk, dv, tile_x, rows, step, shuffle):
    """Bytes of local memory of a tiled kernel ("forward", "kv" or "q"; kernels/
    attention_tiled.cl.mako): ``rows`` the group's rows (query rows, or keys for "kv"),
    ``step`` what it walks per step."""
    dk4, dv4 = (dk + 3) // 4, (dv + 3) // 4
    td4 = -(-dv4 // tile_x)
    kp4, vrp4 = _odd(dk4), _odd(dv4)
    kcp4 = _odd(max(dk4, -(-dk4 // tile_x) * tile_x))
    vcp4 = _odd(max(dv4, td4 * tile_x))
    if kernel == "forward":
        exchange = 4 * rows * tile_x if shuffle != "ptx" else 0
        return 16 * (rows * kp4 + step * (kp4 + td4 * tile_x)) + 4 * rows * (step + 4) + exchange
    if kernel == "kv":
        return 16 * (rows * (kp4 + vrp4) + step * (kcp4 + vcp4)) + 8 * step \
            + 8 * rows * (step + 4)
    return 16 * (rows * (kp4 + vrp4) + step * (kcp4 + vrp4)) + 4 * rows * (step + 4)


def _fit_tiled(ctx, problem, kernel, rows, step, tile_y, tile_x, shuffle):
    """(rows, step, tile_y) of a tiled kernel from the tuning values, halving the step (down to
    tile_x), then the rows, until its local memory fits the device and the group its
    work-group size."""
    rows, step, tile_y = int(rows), int(step), min(int(tile_y), int(rows))
    limit = ctx.info.local_mem_size
    while tile_x * tile_y > ctx.info.max_work_group_size and tile_y > 1:
        tile_y //= 2
    while _tiled_local(kernel, problem.dk, problem.dv, tile_x, rows, step, shuffle) > limit:
        if step > tile_x:
            step //= 2
        elif rows > 1:
            rows //= 2
            tile_y = min(tile_y, rows)
        else:
            raise UnsupportedError(f"scaled_dot_product_attention: head dims ({problem.dk}, "
                                   f"{problem.dv}) do not fit the device's local memory")
    if rows % tile_y or step % tile_x or step % 4:
        raise UnsupportedError(f"attention tiled solver ({kernel}): {rows} rows must be a "
                               f"multiple of tile_y {tile_y} and the step {step} of tile_x "
                               f"{tile_x} and 4")
    return rows, step, tile_y


def _mma_ld(width, k_contiguous):
    """Words per local row of an mma kernel's tile (kernels/attention_mma.cl.mako): read by
    8-byte fragment loads along its rows (``k_contiguous``: width + 8 or + 16, ld / 8 odd),
    else width + 4."""
    if not k_contiguous:
        return width + 4
    ld = width + 8
    return ld if (ld // 8) % 2 == 1 else width + 16


def _mma_local(kernel, dk, dv, warps, step, emulate, stages=1, fused_keys=0):
    """Bytes of local memory of an mma kernel ("forward", "kv" or "q") of ``warps`` warps
    staging ``step`` keys (or query rows) per step in ``stages`` buffers (the forward's split
    tiles, ``presplit``, count as two); ``fused_keys``: the dK/dV kernel's keys per group where
    it computes dQ too (their k and a step's dS staged)."""
    dkp, dvp = -(-dk // 8) * 8, -(-dv // 8) * 8
    extra = 48 * 32 * warps if emulate else 0
    if fused_keys:
        extra += 4 * fused_keys * (dkp + 4) + 4 * step * (fused_keys + 4)
    if kernel == "forward":
        return 4 * stages * step * (_mma_ld(dkp, True) + _mma_ld(dvp, False)) + extra \
            + (8 * 32 * warps if emulate else 0)
    if kernel == "kv":
        return stages * (4 * step * (_mma_ld(dkp, False) + _mma_ld(dvp, False)) + 8 * step) \
            + extra
    return 4 * stages * step * (_mma_ld(dkp, False) + _mma_ld(dvp, True)) + extra


def _fit_mma(ctx, problem, kernel, warps, step, emulate, stages, fused_keys=0):
    """(warps, step) of an mma kernel from the tuning values: the step halved (down to 8) until
    the kernel's local memory fits the device."""
    warps, step = int(warps), int(step)
    if warps not in (1, 2, 4, 8) or 32 * warps > ctx.info.max_work_group_size:
        raise UnsupportedError(f"attention mma solver ({kernel}): warps must be 1, 2, 4 or 8 "
                               f"within the device's work-group size, got {warps}")
    if step < 8 or step % 8:
        raise UnsupportedError(f"attention mma solver ({kernel}): the step must be a multiple "
                               f"of 8, got {step}")
    limit = ctx.info.local_mem_size
    while _mma_local(kernel, problem.dk, problem.dv, warps, step, emulate, stages,
                     fused_keys) > limit and step > 8:
        step //= 2
    if _mma_local(kernel, problem.dk, problem.dv, warps, step, emulate, stages,
                  fused_keys) > limit:
        raise UnsupportedError(f"scaled_dot_product_attention: head dims ({problem.dk}, "
                               f"{problem.dv}) do not fit the device's local memory (mma)")
    return warps, step


def _tiles_per_warp(tuned, name):
    """m16 tiles per warp of an mma kernel (``m_tiles`` forward, ``kv_tiles`` dK/dV,
    ``q_tiles`` dQ): 1, or 2 sharing each staged B fragment and its TF32 split."""
    tiles = tuned.get(name, 1)
    if isinstance(tiles, bool) or not isinstance(tiles, (int, np.integer)) or tiles not in (1, 2):
        raise UnsupportedError(f"attention mma solver: {name} must be 1 or 2, got {tiles!r}")
    return int(tiles)


class AttentionPlan:
    """The built kernels of one problem (all four from one program: kernels/attention.cl.mako
    for the rows solver, kernels/attention_tiled.cl.mako for the tiled one,
    kernels/attention_mma.cl.mako for the mma one), their launch sizes and the batch offset
    table of one broadcast pattern."""

    def __init__(self, ctx, problem, table, batches, index_t, forced):
        chosen = solver.select(ctx, "attention", problem, forced=forced)
        if chosen.name == "tiled":
            self._tiled(ctx, problem, table, batches, index_t)
            return
        if chosen.name == "mma":
            self._mma(ctx, problem, table, batches, index_t)
            return
        params = solver.tunables(ctx, "attention", problem, chosen.name)
        limit = ctx.info.max_work_group_size
        block_m = min(int(params["block_m"]), limit)
        kv_block = min(int(params["kv_block"]), limit)
        lanes = _lanes(ctx, problem, params.get("lanes", 1), limit, max(block_m, kv_block))
        rows = int(params.get("rows", 1))
        if rows not in (1, 2, 4) or block_m % rows:
            raise UnsupportedError(f"attention tuning: rows must be 1, 2 or 4 and divide "
                                   f"block_m = {block_m}, got {rows!r}")
        # NVIDIA: a row's lanes are neighbours in a warp and sum with warp shuffles (inline
        # PTX); elsewhere through local memory, with barriers.
        shuffle = "ptx" if ctx.info.vendor == "nvidia" else "local"
        exchange = 8 * lanes * max(block_m, kv_block) if lanes > 1 and shuffle == "local" else 0
        block_n = _fit_local(ctx, problem.dk, problem.dv, problem.mask, block_m,
                             int(params["block_n"]), "forward", exchange)
        q_tile = _fit_local(ctx, problem.dk, problem.dv, problem.mask, kv_block,
                            int(params["q_tile"]), "kv", exchange)
        self.params = dict(dk=problem.dk, dv=problem.dv, block_m=block_m, block_n=block_n,
                           kv_block=kv_block, q_tile=q_tile, mask=problem.mask,
                           dropout=problem.dropout, index_t=index_t, lanes=lanes, rows=rows,
                           shuffle=shuffle, unroll=bool(params.get("unroll", True)),
                           delta_group=_delta_group(ctx))
        built = program.build(ctx, "attention", self.params)
        self.forward_kernel = BoundKernel(built.kernel("attention_forward", fresh=True))
        self.delta_kernel = BoundKernel(built.kernel("attention_delta", fresh=True))
        self.q_kernel = BoundKernel(built.kernel("attention_backward_q", fresh=True))
        self.kv_kernel = BoundKernel(built.kernel("attention_backward_kv", fresh=True))
        self.solver = chosen.name
        self.index = np.int32 if index_t == "int" else np.int64
        self.table = Tensor.from_numpy(ctx, table.astype(self.index).reshape(-1))
        L, S = problem.L, problem.S
        forward_items = block_m // rows * lanes
        self.forward_size = ((math.ceil(L / block_m) * forward_items, batches),
                             (forward_items, 1))
        self.rows_size = ((math.ceil(L / block_m) * block_m * lanes, batches), (block_m * lanes, 1))
        self.keys_size = ((math.ceil(S / kv_block) * kv_block * lanes, batches),
                          (kv_block * lanes, 1))
        self.q_size = self.rows_size
        self.delta_size = _delta_size(batches * L, self.params["delta_group"])

    def _tiled(self, ctx, problem, table, batches, index_t):
        # NVIDIA: the items sharing a row are neighbours in a warp and take the row's maximum
        # with warp shuffles (inline PTX); elsewhere through local memory, with barriers.
        shuffle = "ptx" if ctx.info.vendor == "nvidia" else "local"
        L, S = problem.L, problem.S
        self.solver = "tiled"
        self.index = np.int32 if index_t == "int" else np.int64
        self.table = Tensor.from_numpy(ctx, table.astype(self.index).reshape(-1))
        self.delta_size = _delta_size(batches * L)
        tiled = solver.tunables(ctx, "attention", problem, "tiled")
        tile_x = int(tiled.get("tile_x", 16))
        if tile_x not in (8, 16):
            raise UnsupportedError(f"attention tiled solver: tile_x must be 8 or 16, got "
                                   f"{tile_x}")
        fm, fn, fy = _fit_tiled(ctx, problem, "forward", tiled["block_m"], tiled["block_n"],
                                tiled["tile_y"], tile_x, shuffle)
        kb, ks, ky = _fit_tiled(ctx, problem, "kv", tiled["kv_block"], tiled["q_step"],
                                tiled["kv_tile_y"], tile_x, shuffle)
        qb, qs, qy = _fit_tiled(ctx, problem, "q", tiled["q_block"], tiled["k_step"],
                                tiled["q_tile_y"], tile_x, shuffle)
        self.params = dict(dk=problem.dk, dv=problem.dv, tile_x=tile_x, block_m=fm,
                           block_n=fn, tile_y=fy, kv_block=kb, q_step=ks, kv_tile_y=ky,
                           q_block=qb, k_step=qs, q_tile_y=qy, mask=problem.mask,
                           dropout=problem.dropout, index_t=index_t, shuffle=shuffle,
                           prefetch=bool(tiled.get("prefetch", False)))
        built_tiled = program.build(ctx, "attention_tiled", self.params)
        self.forward_kernel = BoundKernel(built_tiled.kernel("attention_tiled_forward",
                                                             fresh=True))
        self.delta_kernel = BoundKernel(built_tiled.kernel("attention_delta", fresh=True))
        self.kv_kernel = BoundKernel(built_tiled.kernel("attention_tiled_backward_kv",
                                                        fresh=True))
        self.q_kernel = BoundKernel(built_tiled.kernel("attention_tiled_backward_q",
                                                       fresh=True))
        self.forward_size = ((math.ceil(L / fm) * tile_x * fy, batches), (tile_x * fy, 1))
        self.keys_size = ((math.ceil(S / kb) * tile_x * ky, batches), (tile_x * ky, 1))
        self.q_size = ((math.ceil(L / qb) * tile_x * qy, batches), (tile_x * qy, 1))

    def _mma(self, ctx, problem, table, batches, index_t):
        from .gemm import mma_device_problem
        L, S = problem.L, problem.S
        self.solver = "mma"
        self.index = np.int32 if index_t == "int" else np.int64
        self.table = Tensor.from_numpy(ctx, table.astype(self.index).reshape(-1))
        self.delta_size = _delta_size(batches * L)
        tuned = dict(DEFAULT_MMA, **solver.tunables(ctx, "attention", problem, "mma"))
        # Emulated where the device has no mma.sync (DLPRIM_TF32_EMULATE), or when a rule
        # asks for it ("emulate": 1, to compare the two on a GPU).
        emulate = int(bool(tuned.get("emulate", 0)) or mma_device_problem(ctx.info) is not None)
        stages = tuned.get("stages", 1)
        if stages not in (1, 2):
            raise UnsupportedError(f"attention mma solver: stages must be 1 or 2, got {stages!r}")
        rounding = tuned.get("round", "cvt")
        if rounding not in ("cvt", "int", "fast"):
            raise UnsupportedError(f"attention mma solver: round must be 'cvt', 'int' or "
                                   f"'fast', got {rounding!r}")
        small_parts = tuned.get("small", "rna")
        if small_parts not in ("rna", "trunc"):
            raise UnsupportedError(f"attention mma solver: small must be 'rna' or 'trunc', "
                                   f"got {small_parts!r}")
        if rounding == "fast" and small_parts != "trunc":
            # The fast rounding leaves NaNs to the small parts, which a rounding could lose.
            raise UnsupportedError("attention mma solver: round 'fast' needs small 'trunc'")
        presplit = bool(tuned.get("presplit", False))
        if presplit and stages != 1:
            raise UnsupportedError("attention mma solver: presplit tiles are staged through "
                                   "registers: stages must be 1")
        m_tiles, kv_tiles, q_tiles = (_tiles_per_warp(tuned, name)
                                      for name in ("m_tiles", "kv_tiles", "q_tiles"))
        fw, fn = _fit_mma(ctx, problem, "forward", tuned["warps"], tuned["block_n"], emulate,
                          2 if presplit else stages)
        # fused_dq: dQ computed in the dK/dV kernel (atomics), the dQ kernel not run. It takes
        # steps of whole m16 tiles and the group's keys staged beside the tiles: where the
        # local memory leaves 8 rows, or no room at all (large head dims), dQ has its kernel;
        # DLPRIM_DETERMINISTIC keeps the dQ kernel (atomics land in no fixed order).
        fused_dq = bool(tuned.get("fused_dq", False)) and not config.switches().deterministic
        if fused_dq:
            fused_keys = 16 * kv_tiles * int(tuned["kv_warps"])
            try:
                kw, ks = _fit_mma(ctx, problem, "kv", tuned["kv_warps"], tuned["q_step"],
                                  emulate, stages, fused_keys)
                fused_dq = ks % 16 == 0
            except UnsupportedError:
                fused_dq = False
        if not fused_dq:
            kw, ks = _fit_mma(ctx, problem, "kv", tuned["kv_warps"], tuned["q_step"], emulate,
                              stages)
        qw, qs = _fit_mma(ctx, problem, "q", tuned["q_warps"], tuned["k_step"], emulate, stages)
        # Registers: at head dims up to 64 the warps' own fragments stay in them (q split in
        # the forward); past 64 they would crowd out the accumulators. Two row tiles per warp
        # (m_tiles 2) already double q's fragments, the accumulators and the scores: q is split
        # at each step unless a rule asks otherwise.
        # ``q_frags`` false: q's fragments not kept at all, read again at each step. The
        # backward's own fragments likewise stay in registers with one tile per warp
        # (``frags``); two tiles (kv_tiles, q_tiles 2) double the accumulators and read them
        # again at each step unless a rule asks otherwise.
        small = max(problem.dk, problem.dv) <= 64
        frags = tuned.get("frags")
        frags_kv = bool(small and kv_tiles == 1 if frags is None else frags)
        frags_q = bool(small and q_tiles == 1 if frags is None else frags)
        q_frags = bool(tuned.get("q_frags", True))
        q_split = bool(tuned.get("q_split", small and m_tiles == 1 and q_frags))
        if q_split and not q_frags:
            raise UnsupportedError("attention mma solver: q_split keeps q's fragments split in "
                                   "registers: it needs q_frags")
        self.params = dict(dk=problem.dk, dv=problem.dv, warps=fw, block_n=fn, m_tiles=m_tiles,
                           kv_warps=kw, q_step=ks, q_warps=qw, k_step=qs, mask=problem.mask,
                           dropout=problem.dropout, index_t=index_t, emulate=emulate,
                           stages=stages, round=rounding, small=small_parts,
                           presplit=presplit, q_frags=q_frags, q_split=q_split,
                           kv_tiles=kv_tiles, q_tiles=q_tiles, fused_dq=fused_dq,
                           frags_kv=frags_kv, frags_q=frags_q)
        built = program.build(ctx, "attention_mma", self.params)
        self.forward_kernel = BoundKernel(built.kernel("attention_mma_forward", fresh=True))
        self.delta_kernel = BoundKernel(built.kernel("attention_delta", fresh=True))
        self.kv_kernel = BoundKernel(built.kernel("attention_mma_backward_kv", fresh=True))
        self.q_kernel = BoundKernel(built.kernel("attention_mma_backward_q", fresh=True))
        self.forward_size = ((math.ceil(L / (16 * m_tiles * fw)) * 32 * fw, batches),
                             (32 * fw, 1))
        self.keys_size = ((math.ceil(S / (16 * kv_tiles * kw)) * 32 * kw, batches),
                          (32 * kw, 1))
        self.q_size = ((math.ceil(L / (16 * q_tiles * qw)) * 32 * qw, batches), (32 * qw, 1))


def _delta_group(ctx):
    """attention_delta's work-group size in the portable solver: 64, or the largest power of
    two the device runs below it (the tiled and mma solvers need larger groups anyway)."""
    return group_size(ctx, 64)


def _delta_size(rows, group=64):
    """attention_delta's (global, local) sizes: work-groups of ``group`` items, 16 items a row
    (fewer in groups under 16), at most 16384 groups walking the rows."""
    per_group = group // min(16, group)
    return ((min(math.ceil(rows / per_group), 16384) * group,), (group,))


def _empty(ctx, shape, dtype=float32):
    """A new tensor for an output, a workspace or a gradient (tests poison it)."""
    return Tensor.empty(ctx, shape, dtype)


def _offsets(batch_shape, operand_batch, heads_group=None):
    """Per batch (flattened ``batch_shape``, C order) the operand's element offset in units of
    its batch stride: its dims broadcast (stride 0 where 1), and with ``heads_group`` the last
    batch dim (heads) mapped h -> h // heads_group (grouped-query attention)."""
    nb = len(batch_shape)
    shape = (1,) * (nb - len(operand_batch)) + tuple(operand_batch)
    strides = [0] * nb
    step = 1
    for d in range(nb - 1, -1, -1):
        strides[d] = step if shape[d] != 1 else 0
        step *= shape[d]
    count = math.prod(batch_shape)
    if nb == 0:
        return np.zeros(count, np.int64)
    index = np.indices(batch_shape).reshape(nb, -1).astype(np.int64)
    if heads_group is not None:
        index[-1] //= heads_group
    return (np.asarray(strides, np.int64)[:, None] * index).sum(axis=0)


def _check_tensor(name, t):
    if not isinstance(t, Tensor):
        raise not_a_tensor(f"scaled_dot_product_attention: {name}", t)
    if t.dtype != float32:
        raise DTypeError(f"scaled_dot_product_attention: {name} must be float32, got {t.dtype}")
    if t.ndim < 2:
        raise ShapeError(f"scaled_dot_product_attention: {name} must be at least 2-d "
                         f"(..., rows, head dim), got shape {t.shape}")


def _random_state(dropout_p, seed, stream):
    if dropout_p == 0.0:
        return 0, 0
    if seed is None:
        if stream is not None:
            raise ShapeError("scaled_dot_product_attention: stream is only meaningful with an "
                             "explicit seed")
        return _dropout._next_stream()
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 64:
        raise ShapeError(f"scaled_dot_product_attention: seed must be an int in [0, 2^64), "
                         f"got {seed!r}")
    stream = 0 if stream is None else stream
    if not isinstance(stream, (int, np.integer)) or isinstance(stream, bool) \
            or not 0 <= stream < 2 ** 64:
        raise ShapeError(f"scaled_dot_product_attention: stream must be an int in [0, 2^64), "
                         f"got {stream!r}")
    return int(seed), int(stream)


def _geometry(query, key, value, attn_mask, is_causal, enable_gqa):
    """(batch shape, L, S, E, Ev, q/k/v/mask batch offset tables, mask kind, mask strides,
    groups of k and v heads (None without GQA)) after checking the shapes as torch does."""
    L, E = query.shape[-2:]
    S, Ek = key.shape[-2:]
    Sv, Ev = value.shape[-2:]
    if Ek != E:
        raise ShapeError(f"scaled_dot_product_attention: key's head dim must be query's ({E}), "
                         f"got key {key.shape} for query {query.shape}")
    if Sv != S:
        raise ShapeError(f"scaled_dot_product_attention: value must have key's {S} rows, got "
                         f"value {value.shape} for key {key.shape}")
    if E == 0:
        raise UnsupportedError("scaled_dot_product_attention: a head dim of 0 is not supported")
    if max(E, Ev) > MAX_HEAD_DIM:
        raise UnsupportedError(f"scaled_dot_product_attention: head dims up to {MAX_HEAD_DIM} "
                               f"are supported, got {E} (query, key) and {Ev} (value)")
    qb, kb, vb = query.shape[:-2], key.shape[:-2], value.shape[:-2]
    k_group = v_group = None
    if enable_gqa:
        if min(query.ndim, key.ndim, value.ndim) < 3:
            raise ShapeError(f"scaled_dot_product_attention: enable_gqa needs a heads dimension "
                             f"(dim -3) in query, key and value, got {query.shape}, {key.shape}, "
                             f"{value.shape}")
        hq, hk, hv = qb[-1], kb[-1], vb[-1]
        if hk == 0 or hv == 0 or hq % hk or hq % hv:
            raise ShapeError(f"scaled_dot_product_attention: with enable_gqa the number of key "
                             f"and value heads ({hk}, {hv}) must divide the number of query "
                             f"heads ({hq})")
        if hk != hq:
            k_group, kb = hq // hk, kb[:-1] + (hq,)
        if hv != hq:
            v_group, vb = hq // hv, vb[:-1] + (hq,)
    try:
        batch = broadcast_shapes(qb, kb, vb)
    except ShapeError as e:
        hint = " (enable_gqa=True maps fewer key/value heads)" if not enable_gqa else ""
        raise ShapeError(f"scaled_dot_product_attention: the batch dimensions of query "
                         f"{query.shape}, key {key.shape} and value {value.shape} do not "
                         f"broadcast{hint}: {e}") from None
    tables = [_offsets(batch, qb), _offsets(batch, key.shape[:-2], k_group),
              _offsets(batch, value.shape[:-2], v_group)]
    tables[0] = tables[0] * (L * E)
    tables[1] = tables[1] * (S * E)
    tables[2] = tables[2] * (S * Ev)
    mask_kind, strides = "none", (0, 0)
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise not_a_tensor("scaled_dot_product_attention: attn_mask", attn_mask)
        if attn_mask.dtype not in (bool_, float32):
            raise DTypeError(f"scaled_dot_product_attention: attn_mask must be bool (True: takes "
                             f"part) or float32 (added to the scores), got {attn_mask.dtype}")
        if is_causal:
            raise ShapeError("scaled_dot_product_attention: pass attn_mask or is_causal=True, "
                             "not both (as torch)")
        mshape = (1,) * max(0, 2 - attn_mask.ndim) + attn_mask.shape
        ml, ms = mshape[-2:]
        fits = ml in (1, L) and ms in (1, S) and _broadcasts(mshape[:-2], batch) \
            and broadcast_shapes(mshape[:-2], batch) == batch
        if not fits:
            raise ShapeError(f"scaled_dot_product_attention: attn_mask of shape "
                             f"{attn_mask.shape} does not broadcast to the scores' shape "
                             f"{batch + (L, S)}")
        mask_kind = "bool" if attn_mask.dtype == bool_ else "float"
        strides = (ms if ml != 1 else 0, 1 if ms != 1 else 0)
        tables.append(_offsets(batch, mshape[:-2]) * (ml * ms))
    else:
        tables.append(np.zeros_like(tables[0]))
    return batch, L, S, E, Ev, np.stack(tables, axis=1), mask_kind, strides, k_group, v_group


def _broadcasts(shape, target):
    try:
        broadcast_shapes(shape, target)
        return True
    except ShapeError:
        return False


class _Call:
    """What a call of one configuration needs, made once (``_call``): the checked geometry, the
    problem and the plan."""

    def __init__(self, ctx, query, key, value, attn_mask, is_causal, enable_gqa, dropout, wide,
                 forced):
        (self.batch, self.L, self.S, self.E, self.Ev, table, mask_kind, mask_strides,
         self.k_group, self.v_group) = _geometry(query, key, value, attn_mask, is_causal,
                                                 enable_gqa)
        self.batches = math.prod(self.batch)
        self.problem = AttentionProblem(self.E, self.Ev, self.L, self.S, mask_kind,
                                        bool(is_causal), dropout)
        self.plan = None
        # The replay plans of calls without dropout, by the operands' offsets and the scale.
        self.plans = PlanCache(8)
        if self.batches * self.L * self.Ev:
            largest = max(int(table.max(initial=0)) + max(t.size for t in (query, key, value)),
                          self.batches * max(self.L, self.S) * max(self.E, self.Ev))
            index_t = "long" if wide or largest + 4 * MAX_HEAD_DIM >= 2 ** 31 - 1 else "int"
            self.plan = AttentionPlan(ctx, self.problem, table, self.batches, index_t, forced)
            index = self.plan.index
            self.mask_args = (index(mask_strides[0]), index(mask_strides[1]),
                              np.int32(bool(is_causal)))


def _call(ctx, query, key, value, attn_mask, is_causal, enable_gqa, dropout, algorithm):
    """The call's ``_Call``, from the plan cache: a repeated call on seen shapes checks and
    builds nothing."""
    forced = algorithm or config.switches().forced.get("attention")
    # 64-bit indices where an operand reaches past 2^30 elements in its buffer.
    wide = max(t.offset_elements + t.size for t in (query, key, value)) >= 2 ** 30 or (
        attn_mask is not None and attn_mask.offset_elements + attn_mask.size >= 2 ** 30)
    key_ = ("attention", query.shape, key.shape, value.shape,
            None if attn_mask is None else (attn_mask.shape, attn_mask.dtype), bool(is_causal),
            bool(enable_gqa), dropout, wide, forced, config.switches().deterministic,
            tuning.generation)
    call = ctx.plans.get(key_)
    if call is None:
        call = ctx.plans.put(key_, _Call(ctx, query, key, value, attn_mask, is_causal,
                                         enable_gqa, dropout, wide, forced))
    return call


def _common_args(plan, problem, scale2, q, k, v, mask):
    index = plan.index
    return (index(problem.L), index(problem.S), np.float32(scale2), plan.table.buffer,
            q.buffer, index(q.offset_elements), k.buffer, index(k.offset_elements),
            v.buffer, index(v.offset_elements),
            (q if mask is None else mask).buffer,
            index(0 if mask is None else mask.offset_elements))


def _backward(call, scale, scale2, drop, fuse_dq, saved, g, query, key, value, attn_mask, lse,
              delta, dq, dk, dv):
    """The backward's launches: delta (rowsum of dO * O), dQ unless the dK/dV kernel adds it
    (``fuse_dq``), and dK/dV where ``dk`` is asked for."""
    plan, problem = call.plan, call.problem
    queue, index = query.ctx.queue, plan.index
    common = _common_args(plan, problem, scale2, query, key, value, attn_mask)
    strides = call.mask_args
    plan.delta_kernel(queue, *plan.delta_size, index(call.batches * call.L), saved.buffer,
                      index(saved.offset_elements), g.buffer, index(g.offset_elements),
                      delta.buffer)
    if dq is not None and not fuse_dq:
        plan.q_kernel(queue, *plan.q_size, *common, *strides, np.float32(scale),
                      g.buffer, index(g.offset_elements), lse.buffer, delta.buffer,
                      dq.buffer, *drop)
    if dk is not None and call.S:
        dq_args = ((dq.buffer if fuse_dq else dk.buffer, np.int32(fuse_dq))
                   if plan.params.get("fused_dq", False) else ())
        plan.kv_kernel(queue, *plan.keys_size, *common, *strides, np.float32(scale),
                       g.buffer, index(g.offset_elements), lse.buffer, delta.buffer,
                       dk.buffer, dv.buffer, *dq_args, *drop)


def _dropout_args(seed, stream, p):
    keep_scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return (np.uint32(seed & _MASK32), np.uint32(seed >> 32), np.uint32(stream & _MASK32),
            np.uint32(stream >> 32), np.uint32(_dropout._threshold(p)), np.float32(keep_scale))


_NO_DROPOUT = _dropout_args(0, 0, 0.0)


def _forward(call, scale2, drop, query, key, value, attn_mask, out, lse):
    plan = call.plan
    plan.forward_kernel(query.ctx.queue, *plan.forward_size,
                        *_common_args(plan, call.problem, scale2, query, key, value, attn_mask),
                        *call.mask_args, out.buffer, plan.index(out.offset_elements), lse.buffer,
                        *drop)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, seed=None,
                                 stream=None, algorithm=None):
    """torch.nn.functional.scaled_dot_product_attention, fused (no score matrix in memory).

    Parameters
    ----------
    query, key, value : Tensor
        float32 (..., L, E), (..., S, E) and (..., S, Ev); the batch dimensions broadcast.
    attn_mask : Tensor, optional
        bool (True: the key takes part) or float32 (added to the scores), broadcastable to
        (..., L, S). A float mask that requires grad gets its gradient (the scores'), computed
        in the backward from the attention weights made explicit: (..., L, S) floats in memory
        there, unlike the fused gradients of query, key and value.
    dropout_p : float
        Probability of dropping an attention weight (applied whenever it is nonzero, as torch).
    is_causal : bool
        Query row l sees keys 0..l (top-left aligned, as torch); excludes ``attn_mask``.
    scale : float, optional
        Score scale, default 1 / sqrt(E).
    enable_gqa : bool
        Key/value may have fewer heads (dim -3) than query, dividing it; query head h reads
        key/value head h // (Hq / Hkv).
    seed, stream : int, optional
        The dropout mask's seed and stream (as ``F.dropout``); without them the process-wide
        generator (``dp.manual_seed``) supplies both.
    algorithm : str, optional
        Force a solver of the "attention" family (``DLPRIM_ATTENTION_ALGO``).

    Returns
    -------
    Tensor
        (..., L, Ev). A query row for which no key takes part (a mask row of all False or all
        -inf) gives zeros and zero gradients, as PyTorch's fused kernels do.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(name, t)
    if attn_mask is not None and not isinstance(attn_mask, Tensor):
        raise not_a_tensor("scaled_dot_product_attention: attn_mask", attn_mask)
    check_same_context(query, key, value, attn_mask)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating)) \
            or not 0.0 <= dropout_p <= 1.0:
        raise ShapeError(f"scaled_dot_product_attention: dropout_p must be a probability in "
                         f"[0, 1], got {dropout_p!r}")
    if scale is not None and (isinstance(scale, bool)
                              or not isinstance(scale, (int, float, np.floating))):
        raise ShapeError(f"scaled_dot_product_attention: scale must be a number, got {scale!r}")
    mask_grad = attn_mask is not None and autograd.needs_grad(attn_mask)
    ctx = query.ctx
    dropout_p = float(dropout_p)
    call = _call(ctx, query, key, value, attn_mask, is_causal, enable_gqa, dropout_p > 0.0,
                 algorithm)
    seed, stream = _random_state(dropout_p, seed, stream)
    batch, L, S, E, Ev = call.batch, call.L, call.S, call.E, call.Ev
    scale = 1.0 / math.sqrt(E) if scale is None else float(scale)
    out = _empty(ctx, batch + (L, Ev), float32)
    if call.plan is None:
        if out.size:
            out.fill_(0.0)
        return out
    plan = call.plan
    lse = _empty(ctx, (call.batches * L,), float32)
    scale2 = scale * math.log2(math.e)
    drop = _dropout_args(seed, stream, dropout_p) if dropout_p else _NO_DROPOUT
    if dropout_p == 0.0:
        # Without dropout a repeated call launches the same arguments but for the operands'
        # buffers: replayed from the call's plan, which sets only the buffers that changed
        # (about twenty scalar arguments per launch are host time otherwise).
        operands = (query, key, value, attn_mask, out, lse)
        run_planned_on(ctx, (query.offset, key.offset, value.offset,
                             None if attn_mask is None else attn_mask.offset, scale),
                       operands, _forward, call.plans, (call, scale2, drop) + operands)
    else:
        _forward(call, scale2, drop, query, key, value, attn_mask, out, lse)
    if not (mask_grad or autograd.needs_grad(query, key, value)):
        return out
    saved = out.detach()
    k_group, v_group = call.k_group, call.v_group

    def backward(g):
        dq = dk = dv = dmask = None
        if mask_grad:
            dmask = _mask_gradient(call, query, key, value, attn_mask, g, scale, dropout_p,
                                   seed, stream)
        if not (query.requires_grad or key.requires_grad or value.requires_grad):
            return dq, dk, dv, dmask
        kv_grads = key.requires_grad or value.requires_grad
        # The mma solver's fused_dq: dQ added by the dK/dV kernel into a zeroed dq.
        fuse_dq = plan.params.get("fused_dq", False) and query.requires_grad and kv_grads
        if query.requires_grad:
            dq = _empty(ctx, batch + (L, E), float32)
            if fuse_dq and dq.size:
                dq.fill_(0.0)   # a fill is no kernel: outside the replayed plan
        if kv_grads:
            dk = _empty(ctx, batch + (S, E), float32)
            dv = _empty(ctx, batch + (S, Ev), float32)
        delta = _empty(ctx, (call.batches * L,), float32)
        operands = (saved, g, query, key, value, attn_mask, lse, delta, dq, dk, dv)
        if dropout_p == 0.0:
            # As the forward: replayed, by the offsets, the scale and which gradients are
            # asked for (the None operands).
            run_planned_on(ctx, ("backward", saved.offset, g.offset, query.offset, key.offset,
                                 value.offset, None if attn_mask is None else attn_mask.offset,
                                 scale, fuse_dq),
                           operands, _backward, call.plans,
                           (call, scale, scale2, drop, fuse_dq) + operands)
        else:
            _backward(call, scale, scale2, drop, fuse_dq, *operands)
        if kv_grads:
            dk = _reduce_to(dk, key.shape, k_group) if key.requires_grad else None
            dv = _reduce_to(dv, value.shape, v_group) if value.requires_grad else None
        if dq is not None:
            dq = _reduce_to(dq, query.shape, None)
        return dq, dk, dv, dmask

    return autograd.record(out, (query, key, value, attn_mask if mask_grad else None), backward,
                           "scaled_dot_product_attention")


def _mask_gradient(call, query, key, value, attn_mask, g, scale, dropout_p, seed, stream):
    """The gradient of a float ``attn_mask``: dS = P (dP - rowsum(P dP)) summed to the mask's
    shape, with P = softmax(scale q k^T + mask) (0 in a row where no key takes part, as the
    fused kernel's output there), dP = g v^T under the forward's dropout mask (the same seed
    and stream). Explicit (..., L, S) tensors, off the tape."""
    from .arithmetic import add, mul, sub
    from .dropout import dropout
    from .gemm import gemm_batched
    from .indexing import isnan, where
    from .reduce import expand, sum as reduce_sum, sum_to_shape
    from .softmax import softmax
    batch, L, S = call.batch, call.L, call.S
    count = call.batches

    def full(t, rows, group):
        """``t`` broadcast to batch + (rows, features), heads repeated by ``group`` (GQA)."""
        t = t.detach()
        if group:
            lead = t.shape[:-3] + (t.shape[-3], 1)
            t = expand(t.reshape(lead + t.shape[-2:]), lead[:-1] + (group,) + t.shape[-2:])
            t = t.reshape(t.shape[:-4] + (t.shape[-4] * group,) + t.shape[-2:])
        shape = batch + (rows, t.shape[-1])
        return (t if t.shape == shape else expand(t, shape)).reshape(count, rows, shape[-1])

    with autograd.no_grad():
        q, k, v = full(query, L, None), full(key, S, call.k_group), full(value, S, call.v_group)
        scores = gemm_batched(q, k, alpha=scale, trans_b=True).reshape(batch + (L, S))
        weights = softmax(add(scores, attn_mask.detach()), dim=-1)
        weights = where(isnan(weights), 0.0, weights)
        dweights = gemm_batched(g.detach().reshape(count, L, g.shape[-1]), v,
                                trans_b=True).reshape(batch + (L, S))
        if dropout_p:
            dweights = dropout(dweights, dropout_p, seed=seed, stream=stream)
        rows = reduce_sum(mul(weights, dweights), -1, keepdim=True)
        return sum_to_shape(mul(weights, sub(dweights, rows)), attn_mask.shape)


def _reduce_to(grad, shape, group):
    """``grad`` (the broadcast batch shape + rows) summed to an operand of ``shape``; with
    ``group``, heads h of the grad go to head h // group of the operand."""
    from .reduce import sum_to_shape
    if grad.shape == tuple(shape):
        return grad
    if group is not None:
        split = grad.shape[:-3] + (grad.shape[-3] // group, group) + grad.shape[-2:]
        target = shape[:-2] + (1,) + shape[-2:]
        return sum_to_shape(grad.reshape(split), target).reshape(shape)
    return sum_to_shape(grad, shape)


def attention_dropout_mask(batch, L, S, dropout_p, seed, stream=0):
    """The keep-mask (bool, ``batch + (L, S)``) that ``scaled_dot_product_attention`` applies to
    the attention weights for this seed and stream, computed on the host."""
    shape = tuple(batch) + (L, S)
    return _dropout.reference_mask(math.prod(shape), dropout_p, seed, stream).reshape(shape)


_mask_kernels = {}


def _additive_mask(masks):
    """The float32 sum of ``masks`` (tensors, already shaped to broadcast together) as
    additive biases: a bool mask gives -inf where True (multi-head attention's convention:
    True = not allowed), a float mask itself. Off the tape."""
    from .pointwise import PointwiseKernel
    kinds = tuple("bool" if m.dtype == bool_ else "float" for m in masks)
    kernel = _mask_kernels.get(kinds)
    if kernel is None:
        terms = [f"(m{i} ? -INFINITY : 0.0f)" if kind == "bool" else f"m{i}"
                 for i, kind in enumerate(kinds)]
        kernel = _mask_kernels[kinds] = PointwiseKernel(
            "attention_mask_" + "_".join(kinds),
            [(f"m{i}", bool_ if kind == "bool" else float32) for i, kind in enumerate(kinds)],
            [("y", float32)], "y = " + " + ".join(terms) + ";")
    out = _empty(masks[0].ctx, broadcast_shapes(*(m.shape for m in masks)), float32)
    if out.size:
        kernel(list(masks), [out])
    return out


def _mha_error(message):
    return ShapeError(f"multi_head_attention_forward: {message}")


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                                 out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False):
    """torch.nn.functional.multi_head_attention_forward over the fused attention.

    Parameters
    ----------
    query, key, value : Tensor
        (L, N, E), (S, N, E), (S, N, Ev), or unbatched (L, E), (S, E), (S, Ev) (sequence
        first, as torch's functional; ``nn.MultiheadAttention(batch_first=True)`` transposes
        before calling it).
    embed_dim_to_check, num_heads : int
        E, and the heads it is split into (E divisible by num_heads).
    in_proj_weight, in_proj_bias : Tensor or None
        The packed (3E, E) projection and its (3E,) bias; with ``use_separate_proj_weight``,
        ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim)
        instead (the bias stays packed).
    bias_k, bias_v : Tensor or None
        (1, 1, E) (or (E,)) each, both or neither: a learned key and value appended to every sequence
        (after the projections), the masks given a column that allows them; gradients to both.
    add_zero_attn : bool
        Append a key and a value of zeros (after bias_k / bias_v), allowed by the masks.
    static_k, static_v
        Not supported: must be None (UnsupportedError).
    dropout_p : float
        Dropout on the attention weights when ``training``.
    out_proj_weight, out_proj_bias : Tensor
        The output projection (E, E) and its bias.
    key_padding_mask : Tensor, optional
        (N, S) (or (S,) unbatched): bool, True = the key is ignored, or float, added (a float
        mask that requires grad gets its gradient, as attn_mask's).
    need_weights : bool
        Also return the attention weights (computed explicitly, off the tape: they carry no
        gradient), averaged over heads when ``average_attn_weights``.
    attn_mask : Tensor, optional
        (L, S) or (N * num_heads, L, S): bool, True = not allowed, or float, added; a float
        mask that requires grad gets its gradient (scaled_dot_product_attention's).
    is_causal : bool
        A hint that ``attn_mask`` is the causal mask (required with it, as torch); without a
        key padding mask and weights, the fused kernel's causal mode replaces the mask.

    Returns
    -------
    (Tensor, Tensor or None)
        The output (L, N, E) (or (L, E)) and the weights (N, L, S) / (N, H, L, S) or None.
        A query row with no key allowed gives zeros (the fused kernel's convention).
    """
    from .tensor_ops import cat, narrow, permute, split
    from .linear import linear
    from .arithmetic import add
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise not_a_tensor(f"multi_head_attention_forward: {name}", t)
        if t.dtype != float32:
            raise DTypeError(f"multi_head_attention_forward: {name} must be float32, got {t.dtype}")
    for name, given in (("static_k", static_k), ("static_v", static_v)):
        if given is not None:
            raise UnsupportedError(f"multi_head_attention_forward: {name} is not supported "
                                   f"(pass None)")
    if (bias_k is None) != (bias_v is None):
        raise _mha_error("bias_k and bias_v must be given together (or both None)")
    batched = query.ndim == 3
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise _mha_error(f"query, key and value must all be 3-d (L, N, E) or all 2-d (L, E), got "
                         f"{query.shape}, {key.shape}, {value.shape}")
    if not batched:
        query, key, value = (t.reshape(t.shape[0], 1, t.shape[1]) for t in (query, key, value))
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.reshape(1, *key_padding_mask.shape)
    L, N, E = query.shape
    S = key.shape[0]
    if E != embed_dim_to_check:
        raise _mha_error(f"query's embedding dim must be embed_dim_to_check = "
                         f"{embed_dim_to_check}, got {E}")
    if not isinstance(num_heads, (int, np.integer)) or num_heads < 1 or E % num_heads:
        raise _mha_error(f"embed_dim {E} must be divisible by num_heads, got {num_heads!r}")
    if key.shape[:2] != (S, N) or value.shape[:2] != (S, N):
        raise _mha_error(f"key and value must be (S, N, ...) with query's N = {N} and one S, "
                         f"got {key.shape} and {value.shape}")
    H, hd = int(num_heads), E // int(num_heads)
    if use_separate_proj_weight:
        weights = (q_proj_weight, k_proj_weight, v_proj_weight)
        if any(w is None for w in weights):
            raise _mha_error("use_separate_proj_weight=True needs q_proj_weight, k_proj_weight "
                             "and v_proj_weight")
    elif in_proj_weight is None:
        raise _mha_error("in_proj_weight is None (pass it, or use_separate_proj_weight=True)")
    if use_separate_proj_weight or not (query is key and key is value):
        if use_separate_proj_weight:
            wq, wk, wv = weights
        else:
            if in_proj_weight.ndim != 2 or in_proj_weight.shape[0] != 3 * E:
                raise _mha_error(f"in_proj_weight must be (3 * {E}, {E}), got "
                                 f"{in_proj_weight.shape}")
            wq, wk, wv = (narrow(in_proj_weight, 0, i * E, E) for i in range(3))
        bq = bk = bv = None
        if in_proj_bias is not None:
            if in_proj_bias.shape != (3 * E,):
                raise _mha_error(f"in_proj_bias must be ({3 * E},), got {in_proj_bias.shape}")
            bq, bk, bv = (narrow(in_proj_bias, 0, i * E, E) for i in range(3))
        q, k, v = linear(query, wq, bq), linear(key, wk, bk), linear(value, wv, bv)
    else:
        # Self-attention: one GEMM for the three projections.
        if in_proj_weight.ndim != 2 or in_proj_weight.shape != (3 * E, E):
            raise _mha_error(f"in_proj_weight must be ({3 * E}, {E}), got {in_proj_weight.shape}")
        if in_proj_bias is not None and in_proj_bias.shape != (3 * E,):
            raise _mha_error(f"in_proj_bias must be ({3 * E},), got {in_proj_bias.shape}")
        q, k, v = split(linear(query, in_proj_weight, in_proj_bias), E, dim=2)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] != E:
            raise _mha_error(f"the {name} projection gives {t.shape[-1]} features, expected {E}")
    # Keys appended to every sequence, each allowed by the masks (a column added below):
    # bias_k / bias_v, then zeros with add_zero_attn.
    extra = int(bias_k is not None) + int(bool(add_zero_attn))
    if bias_k is not None:
        for name, t in (("bias_k", bias_k), ("bias_v", bias_v)):
            if not isinstance(t, Tensor):
                raise not_a_tensor(f"multi_head_attention_forward: {name}", t)
            # torch repeats it to (1, N, E): (E,), (1, E) and (1, 1, E) all do.
            if t.dtype != float32 or t.shape not in ((E,), (1, E), (1, 1, E)):
                raise _mha_error(f"{name} must be float32 (1, 1, {E}) (or ({E},)), got "
                                 f"{t.dtype} {t.shape}")
        ctx = query.ctx
        k, v = (cat([t, add(Tensor.zeros(ctx, (1, N, E)), b.reshape(1, 1, E))], 0)
                for t, b in ((k, bias_k), (v, bias_v)))
    if add_zero_attn:
        k, v = (cat([t, Tensor.zeros(t.ctx, (1, N, E))], 0) for t in (k, v))
    # (rows, N, E) -> (N, H, rows, hd)
    q, k, v = (permute(t.reshape(t.shape[0], N, H, hd), (1, 2, 0, 3)) for t in (q, k, v))

    masks = []
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise not_a_tensor("multi_head_attention_forward: attn_mask", attn_mask)
        if attn_mask.dtype not in (bool_, float32):
            raise DTypeError(f"multi_head_attention_forward: attn_mask must be bool or float32, "
                             f"got {attn_mask.dtype}")
        if attn_mask.shape == (L, S):
            masks.append(attn_mask.reshape(1, 1, L, S))
        elif attn_mask.shape == (N * H, L, S):
            masks.append(attn_mask.reshape(N, H, L, S))
        else:
            raise _mha_error(f"attn_mask must be ({L}, {S}) or ({N * H}, {L}, {S}), got "
                             f"{attn_mask.shape}")
    elif is_causal:
        raise _mha_error("is_causal=True needs attn_mask (the causal mask), as torch")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor):
            raise not_a_tensor("multi_head_attention_forward: key_padding_mask", key_padding_mask)
        if key_padding_mask.dtype not in (bool_, float32):
            raise DTypeError(f"multi_head_attention_forward: key_padding_mask must be bool or "
                             f"float32, got {key_padding_mask.dtype}")
        if key_padding_mask.shape != (N, S):
            raise _mha_error(f"key_padding_mask must be ({N}, {S}), got "
                             f"{key_padding_mask.shape}")
        masks.append(key_padding_mask.reshape(N, 1, 1, S))
    if extra:
        # The appended keys: allowed (False / 0 in a column of their own).
        masks = [cat([m, Tensor.zeros(m.ctx, m.shape[:3] + (extra,), m.dtype)], 3)
                 for m in masks]
    # As torch: the hint replaces the mask where no key padding mask or weights need it (the
    # appended keys then fall under the causal rule, as in torch's scaled_dot_product_attention).
    causal = bool(is_causal) and key_padding_mask is None and not need_weights
    mask = None
    if masks and not causal:
        # Float masks that ask for a gradient are added on the tape (scaled_dot_product_attention
        # gives the mask its gradient); the others are folded into one additive mask off it.
        rest = [m for m in masks if not autograd.needs_grad(m)]
        mask = _additive_mask(rest) if rest else None
        for m in masks:
            if autograd.needs_grad(m):
                mask = m if mask is None else add(mask, m)
    p = float(dropout_p) if training else 0.0
    seed, stream = _random_state(p, None, None)
    attn = scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                        seed=seed if p else None, stream=stream if p else None)
    attn = permute(attn, (2, 0, 1, 3)).reshape(L * N, E)
    out = linear(attn, out_proj_weight, out_proj_bias).reshape(L, N, E)
    weights_out = None
    if need_weights:
        weights_out = _attention_weights(q, k, mask, p, seed, stream, average_attn_weights)
        if not batched:
            weights_out = weights_out.reshape(*weights_out.shape[1:])
    if not batched:
        out = out.reshape(L, E)
    return out, weights_out


def _attention_weights(q, k, mask, p, seed, stream, average):
    """softmax(q k^T / sqrt(hd) + mask), dropped as the fused kernel drops them, (N, H, L, S)
    or averaged over heads (N, L, S); off the tape."""
    from .gemm import gemm_batched
    from .softmax import softmax
    from .dropout import dropout
    from .reduce import mean
    N, H, L, hd = q.shape
    S = k.shape[2]
    with autograd.no_grad():
        scores = gemm_batched(q.detach().reshape(N * H, L, hd), k.detach().reshape(N * H, S, hd),
                              alpha=1.0 / math.sqrt(hd), trans_b=True).reshape(N, H, L, S)
        if mask is not None:
            scores = scores + mask
        weights = softmax(scores, dim=-1)
        if p:
            weights = dropout(weights, p, seed=seed, stream=stream)
        if average:
            weights = mean(weights, dim=1)
    return weights


__all__ = ["scaled_dot_product_attention", "attention_dropout_mask",
           "multi_head_attention_forward"]
