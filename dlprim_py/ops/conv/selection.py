"""Choosing a convolution algorithm, after MIOpen.

The algorithms are the solvers of the "conv" family (``dlprim_py.solver``), chosen per problem
and direction (``ConvTask``):

* immediate mode (``DLPRIM_FIND_MODE=immediate``, the default): the per-device ranks of
  ``tuning_db/conv.json`` order the applicable algorithms by the problem's features; nothing
  runs.
* find mode (``DLPRIM_FIND_MODE=find``): every applicable algorithm runs once per problem on
  scratch tensors after a warm-up, the fastest is stored in the device's find-db
  (``dlprim_py.finddb``) under the problem's canonical key and reused by later processes.
* ``DLPRIM_CONV_ALGO=<name>`` forces one algorithm (an error if it does not apply).

TF32: the algorithms whose GEMM runs on the tensor-core kernel of ``ops/gemm.py`` ("mma")
are variants of their float32 algorithm with ``_tf32`` after the name ("gemm_tf32",
"winograd_tf32", "im2col_gemm_tf32"; ``Algorithm.tf32``). F(4x4) Winograd has none: its
transforms multiply TF32's rounding of the transformed operands about tenfold (16x16 maps of
108 terms: 0.048 against 0.006 for F(2x2) and 0.003 for the column GEMM, max error against
float64, inputs in [-1, 1]), past TF32's bound. They apply only
where TF32 is allowed (``dlprim_py.backends.allow_tf32`` or ``ctx.allow_tf32``) and the device
runs TF32 mma.sync (NVIDIA, compute capability 8.0 and later; or DLPRIM_TF32_EMULATE); the task
says whether both hold (``ConvTask.tf32``, part of its key), and the ranks put them first.
Elsewhere TF32 allowed changes nothing: the float32 algorithms are chosen, as torch falls back.
"""
from dataclasses import dataclass

import numpy as np
import pyopencl as cl

from ... import backends, config, program, solver
from ...timing import time_enqueued
from .algorithms import (Direct, DirectPhased, DirectSmall, EpilogueArgs, ImplicitGemm, Im2colGemm,
                         Recording, _gemm_dims, batch_chunk, implicit_gemm_variants,
                         run_in_chunks)
from .depthwise import Depthwise, DepthwiseRows, DepthwiseTiled
from .gemm16 import Gemm16
from .gemm1x1 import Gemm1x1
from .problem import ConvProblem
from .winograd import Winograd

# Every algorithm by name; the order is the tie-break order of equal ranks.
ALGORITHMS = {a.name: a for a in (Gemm1x1(tf32=True), Gemm1x1(), Gemm1x1(per_image=True),
                                  Winograd(tf32=True),
                                  Winograd(), Winograd(output_tile=4),
                                  DepthwiseTiled(), DepthwiseRows(),
                                  Depthwise(),
                                  ImplicitGemm(), *implicit_gemm_variants(),
                                  Im2colGemm(tf32=True), Im2colGemm(),
                                  DirectSmall(), DirectPhased(), Direct(),
                                  # float16 / bfloat16 problems only (Algorithm.dtypes).
                                  Gemm16(direct=True), Gemm16())}


def dtype_applies(algo, problem):
    """Whether ``algo`` computes tensors of the problem's dtype: the float32 algorithms
    float32 ones, the 16-bit GEMM algorithms ("gemm16", "im2col_gemm16") float16 and bfloat16
    ones."""
    return problem.dtype in algo.dtypes


def tf32_refusal(ctx):
    """Why the TF32 algorithms do not run on ``ctx``'s device (no TF32 mma.sync, and
    DLPRIM_TF32_EMULATE off), or None."""
    emulate = config.tf32_emulate()
    key = ("conv.tf32_refusal", emulate)
    if key not in ctx.memo:
        from ..gemm import mma_device_problem
        ctx.memo[key] = None if emulate else mma_device_problem(ctx.info)
    return ctx.memo[key]


def tf32_enabled(ctx):
    """Whether convolutions on ``ctx`` may run in TF32 here: TF32 allowed and a device that
    runs the TF32 algorithms (``tf32_refusal``)."""
    return backends.tf32_allowed(ctx) and tf32_refusal(ctx) is None


def task(ctx, problem, direction):
    """The ``ConvTask`` of a problem and direction on ``ctx`` (TF32 as ``tf32_enabled``)."""
    return ConvTask(problem, direction, tf32_enabled(ctx))


@dataclass(frozen=True)
class ConvTask:
    """A convolution problem in one direction: what the solver layer chooses for. ``tf32``:
    TF32 allowed on a device that runs the TF32 algorithms (``tf32_enabled``); they apply only
    then."""
    problem: ConvProblem
    direction: str
    tf32: bool = False

    def key(self):
        return self.problem.key(self.direction) + ("-tf32" if self.tf32 else "")

    def features(self):
        p = self.problem
        return {"direction": self.direction, "n": p.n, "c": p.c, "k": p.k, "cg": p.cg,
                "kg": p.kg, "ck": p.cg * p.kg, "hw": p.h * p.w, "groups": p.groups,
                "rs": p.r * p.s,
                "stride": max(p.stride_h, p.stride_w),
                "tiny_gemm": int(_tiny_gemm(p, self.direction)), "tf32": int(self.tf32)}


class _ConvFamily(solver.Family):
    """Convolution algorithms take the problem and the direction apart; the TF32 ones apply
    only to TF32 tasks."""

    def applies(self, algo, ctx, task):
        if (algo.tf32 and not task.tf32) or not dtype_applies(algo, task.problem):
            return False
        return algo.applies(ctx, task.problem, task.direction)


def _measure(ctx, task, names):
    return measure(ctx, task.problem, task.direction, names)[1]


FAMILY = solver.register(_ConvFamily("conv", ALGORITHMS.values(), measure=_measure,
                                        title="convolution algorithm"))


def algorithm(name):
    return FAMILY.solver(name)


def applicable(ctx, problem, direction):
    """Names of the algorithms that apply, in the immediate rule's order of preference
    (``tuning_db/conv.json``'s ranks)."""
    return FAMILY.applicable(ctx, task(ctx, problem, direction))


def _tiny_gemm(problem, direction):
    """True when the direction's GEMM has fewer than 8 rows (e.g. the data gradient of an RGB
    input layer): GEMM tiles would waste most of their work there, the direct kernel does not."""
    return problem.groups == 1 and _gemm_dims(problem, direction)[0] < 8


def immediate(ctx, problem, direction):
    return solver.immediate(ctx, FAMILY, task(ctx, problem, direction)).name


def choose(ctx, problem, direction):
    """The algorithm name for a problem and direction (``solver.select``: DLPRIM_CONV_ALGO,
    else find mode's winner, else the immediate rule)."""
    return solver.select(ctx, "conv", task(ctx, problem, direction)).name


# Find's timing rules: one warm-up, then up to FIND_REPEAT runs, stopped early when a candidate's
# first run is already FIND_DROP times the best median so far or its runs pass FIND_CAP_S;
# medians within FIND_TIE of the best go to the candidate of higher priority (the immediate
# rule's order), so that noise does not flip a choice between equals.
FIND_REPEAT = 3
FIND_DROP = 2.0
FIND_CAP_S = 0.05
FIND_TIE = solver.FIND_TIE


def find(ctx, problem, direction):
    """Benchmark the applicable algorithms once per problem; the winner's name (stored in the
    find-db)."""
    return solver.find(ctx, FAMILY, task(ctx, problem, direction))


def _scratch(ctx, shape, dtype="float32"):
    """A tensor of ``shape`` holding random values in [-0.5, 0.5): random, not constant, data
    (some devices run faster on zeros), tiled on the device from one host block of at most
    2^20 values so that a large problem's set-up stays a few device copies; a 16-bit
    ``dtype``: those values converted."""
    from ...tensor import Tensor
    if dtype != "float32":
        return _scratch(ctx, shape).to(dtype)
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


def measure(ctx, problem, direction, names=None):
    """Time the applicable algorithms (or ``names``, in priority order) on scratch tensors:
    (winner, {name: median seconds}). Candidates dropped after their first run have that run
    as their time."""
    from ...tensor import Tensor
    # The direct kernel is the fallback and the reference (as MIOpen's naive solvers): find
    # times it only when nothing else applies or the GEMM is too thin for tiles.
    names = applicable(ctx, problem, direction) if names is None else names
    candidates = [n for n in names
                  if n not in ("direct", "direct_phased") or _tiny_gemm(problem, direction)]
    candidates = candidates or ["direct"]
    x, w, y = (_scratch(ctx, shape, problem.dtype)
               for shape in (problem.x_shape, problem.w_shape, problem.y_shape))
    operands = {"forward": (x, w, y), "backward_data": (y, w, x), "backward_filter": (y, x, w)}
    src, other, dst = operands[direction]
    times = {}
    # Programs not built yet, where a planner gathers them to build at once
    # (program.collecting()): every candidate's, not the first's alone.
    missing = []
    for candidate in candidates:
        algo = ALGORITHMS[candidate]
        chunk, size = batch_chunk(ctx, algo, problem, direction)
        workspace = Tensor.empty(ctx, (max(size // 4, 1),)) if size else None
        # Time replays of a recorded run, as an operator call on the same tensors runs (on
        # parts of the batch where the workspace limit says so): device time then decides,
        # not the host's cost of binding arguments.
        try:
            with Recording() as recording:
                run_in_chunks(ctx, algo, problem, direction, chunk, src, other, dst,
                              EpilogueArgs(), workspace=workspace)
        except program.NotBuilt as e:
            if not program.collecting():
                raise
            missing += e.recipes
            continue
        if missing:
            continue
        samples = list(time_enqueued(ctx, recording.replay, warmup=0, repeat=1).samples)
        best = min(times.values(), default=None)
        if best is None or samples[0] < FIND_DROP * best:
            while len(samples) < FIND_REPEAT and sum(samples) < FIND_CAP_S:
                samples += list(time_enqueued(ctx, recording.replay, warmup=0, repeat=1).samples)
        times[candidate] = float(np.median(samples))
    if missing:
        raise program.NotBuilt(missing[0].label, None, missing)
    fastest = min(times.values())
    winner = next(n for n in candidates if times[n] <= fastest * (1 + FIND_TIE))
    return winner, times
