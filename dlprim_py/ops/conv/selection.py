"""Choosing a convolution algorithm, after MIOpen.

* immediate mode (``DLPRIM_FIND_MODE=immediate``, the default): a per-device rule orders the
  applicable algorithms by the problem's shape; nothing runs.
* find mode (``DLPRIM_FIND_MODE=find``): every applicable algorithm runs once per problem on
  scratch tensors after a warm-up, the fastest is stored in the device's find-db
  (``dlprim_py.finddb``) under the problem's canonical key and reused by later processes.
* ``DLPRIM_CONV_ALGO=<name>`` forces one algorithm (an error if it does not apply).
"""
import numpy as np
import pyopencl as cl

from ... import config, finddb
from ...errors import UnsupportedError
from ...timing import time_enqueued
from .algorithms import (Direct, DirectPhased, DirectSmall, EpilogueArgs, ImplicitGemm, Im2colGemm,
                         Recording, _gemm_dims, implicit_gemm_variants)
from .depthwise import Depthwise, DepthwiseRows, DepthwiseTiled
from .gemm1x1 import Gemm1x1
from .winograd import Winograd

# Every algorithm by name; the order is the tie-break order of find mode.
ALGORITHMS = {a.name: a for a in (Gemm1x1(), Gemm1x1(per_image=True),
                                  Winograd(), Winograd(output_tile=4),
                                  DepthwiseTiled(), DepthwiseRows(),
                                  Depthwise(),
                                  ImplicitGemm(), *implicit_gemm_variants(), Im2colGemm(),
                                  DirectSmall(), DirectPhased(), Direct())}


def algorithm(name):
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise UnsupportedError(f"unknown convolution algorithm {name!r}; known: "
                               f"{', '.join(ALGORITHMS)}") from None


def applicable(ctx, problem, direction):
    """Names of the algorithms that apply, in the immediate rule's order of preference."""
    names = [n for n, a in ALGORITHMS.items() if a.applies(ctx, problem, direction)]
    return sorted(names, key=lambda n: _rank(ctx, problem, direction, n))


def _tiny_gemm(problem, direction):
    """True when the direction's GEMM has fewer than 8 rows (e.g. the data gradient of an RGB
    input layer): GEMM tiles would waste most of their work there, the direct kernel does not."""
    return problem.groups == 1 and _gemm_dims(problem, direction)[0] < 8


# Measured at batch 1 on an H200 (ResNet 3x3 layers through F.conv2d, per call in a stream
# of calls, host time included): Winograd F(2x2) 55-57 us on every stride-1 layer (its four
# or five launches included), the column GEMM 60-77 us on the stride-2 ones, the implicit
# GEMM 44 us at 64@56 but 84-331 us on the deeper layers (too few output tiles to fill the
# device). The ranking below holds there as well: small problems need no rule of their own.
def _rank(ctx, problem, direction, name):
    if name == "direct":
        return 5 if _tiny_gemm(problem, direction) else 100
    if name == "direct_phased":
        # Same sums as the direct kernel, without its per-item divergence on the stride test.
        return 4 if _tiny_gemm(problem, direction) else 99
    if name == "depthwise_rows":
        # On the H200 its data gradient ran 1.3-2.3x as fast as the plain kernel's on every
        # MobileNetV2 layer, its forward 0.4-0.9x the tiled kernel's: first for the data
        # gradient, behind both for the forward. Not measured on CPUs.
        if not ctx.info.is_gpu:
            return 0.5
        return -2 if direction == "backward_data" else 2
    if name == "depthwise_tiled":
        # Local-memory staging pays on GPUs; a CPU's caches serve the plain kernel as well.
        return -1 if ctx.info.is_gpu else 1
    if name in ("depthwise", "gemm"):
        return 0
    if name == "winograd":
        # Winograd's transforms pay off when the channel GEMMs are big enough. Backward filter
        # measured on an H200 (ResNet-50 3x3 stride 1, batch 64): 0.48-1.19x cuDNN against the
        # implicit GEMM's 0.27-0.88x.
        big = problem.cg >= 64 and problem.kg >= 64 and ctx.info.is_gpu
        if direction == "backward_filter":
            return 1 if big else 20
        return 1 if big else 50
    if name == "winograd_f4x4":
        if direction == "backward_filter":
            # F(3x3, 4x4), same measurements: ahead of F(2x2) from 128 channels (1.10 against
            # 0.75x at 128, 0.73 against 0.48x at 512, even at 256), behind it at 64.
            wide = problem.cg >= 128 and problem.kg >= 128 and ctx.info.is_gpu
            return 0.9 if wide else 21
        # Measured on an H200 (ResNet-50 3x3 stride-1 layers, C = K = 64..512, batch 64):
        # 0.92-2.5x cuDNN forward and backward data, ahead of F(2x2) on every layer.
        big = problem.cg >= 64 and problem.kg >= 64 and ctx.info.is_gpu
        return 0.9 if big else 55
    if name == "im2col_gemm":
        if not ctx.info.is_gpu:
            return 11
        # Measured on an H200 (batch 64): the GEMM engine over the column matrix beats the
        # implicit GEMM on every 3x3 and 7x7 layer with 64 or more output channels forward
        # (0.97-1.07x cuDNN against 0.61-0.82x), and on every data gradient (by 1.5-3x; by
        # 10x against direct_phased on the RGB stems); an RGB stem's forward with 32 output
        # channels is the implicit GEMM's.
        if direction == "backward_data":
            return 3
        return 9 if problem.kg >= 64 else 11
    if name == "direct_small":
        # Measured on an H200 (batch 64): 1.43x cuDNN on the MobileNetV2 stem (3 -> 32, 3x3),
        # against 0.84x for the implicit GEMM; on the ResNet-50 7x7 stem (3 -> 64) 0.95x,
        # behind im2col_gemm's 1.02x.
        if not ctx.info.is_gpu:
            return 13
        return 8 if problem.r * problem.s <= 9 else 12
    if name.startswith("implicit_gemm_"):
        return 12   # fixed-tile variants: find mode times them, the rule's tile comes first
    return 10


def immediate(ctx, problem, direction):
    return applicable(ctx, problem, direction)[0]


def choose(ctx, problem, direction):
    """The algorithm name for a problem and direction, by DLPRIM_CONV_ALGO, else the mode."""
    forced = config.forced_algorithm("conv")
    if forced:
        if not algorithm(forced).applies(ctx, problem, direction):
            raise UnsupportedError(f"DLPRIM_CONV_ALGO={forced} does not apply to "
                                   f"{problem.key(direction)}")
        return forced
    if config.find_mode() == "find":
        return find(ctx, problem, direction)
    return immediate(ctx, problem, direction)


# Find's timing rules: one warm-up, then up to FIND_REPEAT runs, stopped early when a candidate's
# first run is already FIND_DROP times the best median so far or its runs pass FIND_CAP_S;
# medians within FIND_TIE of the best go to the candidate of higher priority (the immediate
# rule's order), so that noise does not flip a choice between equals.
FIND_REPEAT = 3
FIND_DROP = 2.0
FIND_CAP_S = 0.05
FIND_TIE = 0.03


def find(ctx, problem, direction):
    """Benchmark the applicable algorithms once per problem; the winner's name (memoized in the
    context and stored in the find-db)."""
    key = problem.key(direction)
    memo = ctx.memo.setdefault("conv_find", {})
    if key in memo:
        return memo[key]
    db = finddb.for_context(ctx)
    name = db.lookup(key)
    if name in ALGORITHMS and ALGORITHMS[name].applies(ctx, problem, direction):
        memo[key] = name
        return name
    best, times = measure(ctx, problem, direction)
    db.store(key, best, times[best] * 1e3)
    memo[key] = best
    return best


def _scratch(ctx, shape):
    """A tensor of ``shape`` holding random values in [-0.5, 0.5): random, not constant, data
    (some devices run faster on zeros), tiled on the device from one host block of at most
    2^20 values so that a large problem's set-up stays a few device copies."""
    from ...tensor import Tensor
    block = ctx.memo.get("conv_find_block")
    if block is None:
        values = np.random.default_rng(0).random(1 << 20, dtype=np.float32) - 0.5
        block = ctx.memo["conv_find_block"] = Tensor.from_numpy(ctx, values)
    t = Tensor.empty(ctx, shape)
    done, total = 0, t.size * 4
    while done < total:
        count = min(block.nbytes, total - done)
        cl.enqueue_copy(ctx.queue, t.buffer, block.buffer, byte_count=count,
                        src_offset=block.offset, dst_offset=t.offset + done)
        done += count
    return t


def measure(ctx, problem, direction):
    """Time the applicable algorithms on scratch tensors: (winner, {name: median seconds}).
    Candidates dropped after their first run have that run as their time."""
    from ...tensor import Tensor
    # The direct kernel is the fallback and the reference (as MIOpen's naive solvers): find
    # times it only when nothing else applies or the GEMM is too thin for tiles.
    candidates = [n for n in applicable(ctx, problem, direction)
                  if n not in ("direct", "direct_phased") or _tiny_gemm(problem, direction)]
    candidates = candidates or ["direct"]
    x, w, y = (_scratch(ctx, shape) for shape in (problem.x_shape, problem.w_shape,
                                                  problem.y_shape))
    operands = {"forward": (x, w, y), "backward_data": (y, w, x), "backward_filter": (y, x, w)}
    src, other, dst = operands[direction]
    times = {}
    for candidate in candidates:
        algo = ALGORITHMS[candidate]
        size = algo.workspace_size(ctx, problem, direction)
        workspace = Tensor.empty(ctx, (max(size // 4, 1),)) if size else None
        # Time replays of a recorded run, as an operator call on the same tensors runs: device
        # time then decides, not the host's cost of binding arguments.
        with Recording() as recording:
            algo.run(ctx, problem, direction, src, other, dst, EpilogueArgs(), workspace=workspace)
        samples = list(time_enqueued(ctx, recording.replay, warmup=0, repeat=1).samples)
        best = min(times.values(), default=None)
        if best is None or samples[0] < FIND_DROP * best:
            while len(samples) < FIND_REPEAT and sum(samples) < FIND_CAP_S:
                samples += list(time_enqueued(ctx, recording.replay, warmup=0, repeat=1).samples)
        times[candidate] = float(np.median(samples))
    fastest = min(times.values())
    winner = next(n for n in candidates if times[n] <= fastest * (1 + FIND_TIE))
    return winner, times
