"""``dlprim-tune``: search kernel parameters on the current device and store the winners.

Usage::

    dlprim-tune gemm [--sizes 1024,4096,256x3136x576] [--budget SECONDS] [--output PATH]
                     [--device SPEC] [--space quick|full] [--merge] [--report PATH]

For each problem size every candidate parameter set is built, run on seeded random data and
compared with a float64 reference (on a small odd-sized problem in full, of the same
alignment as the size's so that the same build is checked, and on sampled rows of the real
one); a candidate whose result differs is rejected and never timed. The others are timed
(median after a warm-up; each sample a batch of runs long enough for the device's timer,
divided by its length, or for a run of LONG_RUN seconds or more single runs by the host's
clock, the check run serving as the warm-up) and the fastest becomes a measured rule of this
device's entry in the tuning database (``dlprim_py.tuning``), naming its solver
(``{"solver": "tiled", ...}``; "splitk" for tiles split along K). Devices that report Intel
subgroups also try the "subgroup" solver's register blocks.

The budget bounds the whole run, builds and checks included (``tune_gemm``): sizes run
smallest first; the candidates are built and checked up front in at most BUILD_SHARE of the
budget; each size then gets an equal share of what is left (its first candidate may use the
rest of the budget, so that it gets a rule). Every step starts only when its estimated cost
(``_Costs``: the longest build so far, runs predicted from the rates measured on the smaller
sizes) fits; what does not fit is skipped and named, in the progress lines and in the report.
A step that takes longer than its estimate overruns the budget by the difference (at most one
step: a kernel build, seconds on a CPU, or a run longer than predicted); the last line says
by how much. The command's budget counts from the start of ``main`` (device set-up included;
the Python imports before it, about a second, are not).

Without ``--output`` the database under the cache directory is written, which lookups read
before the shipped one. ``--merge`` keeps the device's other rules (from that database, else
the shipped one) and replaces only those of the sizes tuned; without it the entry holds the
tuned sizes alone. Progress goes to stderr, one line per candidate (``Progress``).
"""
import argparse
import itertools
import json
import math
import sys
import time

import numpy as np
import pyopencl as cl

from . import program, tuning
from .context import Context
from .errors import DlprimError
from .ops import gemm as gemm_ops
from .timing import time_enqueued

# Sizes whose classes the shipped databases cover: square, the GEMMs of convolution layers
# (M = output channels, N = batch * output pixels, K = input channels * kernel area; a 1x1
# convolution's filter gradient: M x N channels, K = batch * pixels), tall-K and small problems.
DEFAULT_SIZES = ["64", "256", "512", "1024", "2048", "4096",
                 "64x100352x64", "64x25088x576", "256x25088x64", "128x6272x1152",
                 "512x6272x128", "256x1568x2304", "1024x1568x256", "512x392x4608",
                 "2048x392x512", "64x64x16384", "32x1000x2048", "512x3136x2048",
                 "64x64x200704"]
# The verify problem: odd M and odd edges in every dimension (every tile has edges), N and K
# multiples of 4 for sizes whose rows start on 4-float boundaries (the vector loads and stores
# those build get), odd for the others.
VERIFY_M = 67
VERIFY_NK = {True: (44, 36), False: (45, 35)}
TOLERANCE = 1e-5
# A timed sample is a batch of runs whose span reaches MIN_SPAN seconds (the batch grows, at
# least doubling, up to MAX_BATCH runs), divided by the batch: a tiny GEMM alone can take less
# than the profiling timer resolves. Host wall-clock around the batch replaces the profiled
# span where that does not measure the work (Mesa 22's rusticl gives every event the same
# placeholder timestamps, 0 to 3 ns): when a batch took PROBE_WALL seconds of wall-clock yet
# spans less than MIN_SPAN (the device would have run 0.25% of that time), or when a batch of
# MAX_BATCH runs still spans less than MIN_SPAN (under 50 ns a run, below any kernel launch).
# PROBE_WALL also bounds the batch the next probe tries, so that probing costs little wall
# time whatever the timer reports.
MIN_SPAN = 50e-6
MAX_BATCH = 1024
PROBE_WALL = 20e-3
# Seconds of samples per candidate.
SAMPLE_TIME = 0.3
# A run this long (its check run's wall-clock) is timed as LONG_SAMPLES single runs by the host's
# clock, the check run its warm-up: no probing, and the fewest runs of a size whose single run
# takes minutes on a CPU device.
LONG_RUN = 0.1
LONG_SAMPLES = 3
# The most of the budget that building and checking the candidates up front may take.
BUILD_SHARE = 0.5
# Seconds a candidate's build and check is guessed to take before one of its kind was measured
# (``_Costs``): its programs loaded from the disk cache, or compiled from source (on a GPU, on a
# CPU device: PoCL also compiles each kernel at its first launch).
BUILD_GUESS = {"built": 0.0, "disk": 0.5, "compile": (10.0, 3.0)}


class Progress:
    """One line per candidate on ``stream`` (stderr): plain lines where the stream is not a
    terminal (a log or a pipe keeps every line, and no carriage return), else one line redrawn
    in place; ``line`` writes a line that stays (a size's result, a summary)."""

    WIDTH = 119

    def __init__(self, stream=None):
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty()) if callable(isatty) else False
        self._drawn = False

    def candidate(self, text):
        if self.interactive:
            self.stream.write("\r" + text[:self.WIDTH].ljust(self.WIDTH))
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def line(self, text):
        if self._drawn:
            self.stream.write("\r" + " " * self.WIDTH + "\r")
            self._drawn = False
        self.stream.write(text + "\n")
        self.stream.flush()


def describe(params):
    """A candidate's parameters in a few words: "tiled 32x32x16 wpt 4x4 vec 4 pad 4 db 1 gvec 4"."""
    solver = params.get("solver", "?")
    if solver == "small":
        return f"small {params.get('small_m')}x{params.get('small_n')}"
    if solver == "subgroup":
        return (f"subgroup sg {params.get('sg_size')} wpt {params.get('wpt_m')}x"
                f"{params.get('wpt_n')} groups {params.get('sg_groups')}")
    if "tile_m" not in params:
        return json.dumps(params, sort_keys=True)
    text = (f"{solver} {params['tile_m']}x{params['tile_n']}x{params['tile_k']} wpt "
            f"{params.get('wpt_m')}x{params.get('wpt_n')} vec {params.get('vec')} pad "
            f"{params.get('pad')} db {params.get('double_buffer')} gvec {params.get('global_vec', 1)}")
    if params.get("split_k", 1) > 1:
        text += f" split {params['split_k']}"
    for key, word in (("max_registers", "regs"), ("lanes_n", "lanes"), ("tile_group", "group")):
        if params.get(key):
            text += f" {word} {params[key]}"
    return text


def parse_size(text):
    """"1024" -> (1024, 1024, 1024); "MxNxK" -> (M, N, K)."""
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise DlprimError(f"size {text!r} must be N or MxNxK") from None
    if len(values) == 1:
        values *= 3
    if len(values) != 3 or min(values) < 1:
        raise DlprimError(f"size {text!r} must be N or MxNxK with positive entries")
    return tuple(values)


def _tiled(tm, tn, tk, wm, wn, vec, pad, db, split=1, gvec=1, max_registers=None):
    params = {"solver": "splitk" if split > 1 else "tiled", "tile_m": tm, "tile_n": tn, "tile_k": tk, "wpt_m": wm,
              "wpt_n": wn, "vec": vec, "pad": pad, "double_buffer": db, "split_k": split,
              "global_vec": gvec}
    if max_registers:
        params["max_registers"] = max_registers
    return params


def gemm_candidates(info, space="quick"):
    """Parameter sets to try on a device, the likeliest first. "quick" is a focused set per
    vendor; "full" the product of every tunable's values."""
    found = []
    if space == "full":
        for tm, tn, tk, wm, wn, vec, pad, db, gvec in itertools.product(
                (32, 64, 128), (32, 64, 128), (8, 16, 32), (2, 4, 8), (2, 4, 8), (1, 2, 4),
                (0, 4), (0, 1), (1, 4)):
            found.append(_tiled(tm, tn, tk, wm, wn, vec, pad, db, gvec=gvec))
    elif info.is_gpu:
        for tm, tn, tk, wm, wn in ((128, 128, 16, 8, 8), (128, 128, 8, 8, 8), (128, 64, 16, 8, 8),
                                   (64, 128, 16, 8, 8), (128, 64, 16, 8, 4), (64, 128, 16, 4, 8),
                                   (64, 64, 16, 8, 4), (64, 64, 16, 4, 8), (64, 64, 16, 4, 4),
                                   (32, 64, 16, 4, 4), (64, 64, 32, 8, 4), (64, 256, 16, 8, 8),
                                   (256, 64, 16, 8, 8)):
            for gvec in (4, 1):
                found.append(_tiled(tm, tn, tk, wm, wn, 4, 4, 1, gvec=gvec))
        for tm, tn, tk, wm, wn in ((128, 128, 16, 8, 8), (128, 64, 16, 8, 8), (64, 128, 16, 8, 8)):
            found.append(_tiled(tm, tn, tk, wm, wn, 4, 4, 0, gvec=4))
            found.append(_tiled(tm, tn, tk, wm, wn, 4, 4, 1, gvec=4, max_registers=128))
        found.append(_tiled(128, 128, 16, 8, 8, 2, 4, 1, gvec=4))
        # Few rows (a classifier's batch) or few columns: narrow tiles keep more of them busy.
        for tm, tn, tk, wm, wn in ((32, 128, 16, 4, 8), (32, 64, 32, 4, 4), (128, 32, 16, 8, 4),
                                   (64, 256, 16, 8, 8)):
            found.append(_tiled(tm, tn, tk, wm, wn, 4, 4, 1, gvec=4, max_registers=128))
    else:
        for tm, tn, tk, wm, wn, vec in ((32, 32, 16, 4, 4, 4), (64, 64, 16, 8, 8, 4),
                                        (64, 64, 16, 4, 4, 4), (32, 64, 16, 4, 8, 4),
                                        (16, 16, 16, 4, 4, 4), (32, 32, 32, 8, 8, 4)):
            for db, gvec in ((0, 1), (1, 4)):
                found.append(_tiled(tm, tn, tk, wm, wn, vec, 4 if gvec == 4 else 0, db, gvec=gvec))
    if all(e in info.extensions for e in gemm_ops.SUBGROUP_EXTENSIONS):
        # Devices with Intel subgroups: register blocks of both subgroup sizes, one or several
        # subgroups per work-group, ahead of the tiled ones (the shipped rule's first).
        found = [{"solver": "subgroup", "sg_size": sg, "wpt_m": wm, "wpt_n": wn,
                  "sg_groups": groups}
                 for sg, wm, wn, groups in ((16, 4, 4, 2), (16, 4, 4, 1), (16, 8, 2, 1),
                                            (16, 8, 4, 1), (16, 2, 8, 1), (16, 8, 2, 4),
                                            (8, 8, 2, 1), (8, 4, 8, 1), (8, 8, 4, 2))] + found
    found.append({"solver": "small", "small_m": 8, "small_n": 16})
    found.append({"solver": "small", "small_m": 16, "small_n": 16})
    return [p for p in found if gemm_ops.params_problem(p, info) is None]


def _with_splits(candidates, M, N, K, info=None, leading=12):
    """Split-K versions of the tiled candidates for problems with few output tiles and long K:
    those of the ``leading`` likeliest tilings come first (a split count is a run-time
    argument, so they cost no extra builds), then the candidates themselves. On a GPU
    (``info``), each tiling also gets the split the library's long-K rule would give it
    (hundreds for a convolution's filter gradient, K = batch * pixels)."""
    if M * N > 1024 * 1024 or K < 1024:
        return candidates
    splits = (4, 8, 16) if M * N <= 512 * 512 else (2, 3, 4, 6)
    extra = []
    for p in [p for p in candidates if p["solver"] == "tiled"][:leading]:
        counts = set(splits)
        if info is not None:
            counts.add(gemm_ops._split_long_k(dict(p, split_k=1), info, M, N, K, 1)["split_k"])
        for split in sorted(counts):
            if split > 1 and K // split >= 2 * p["tile_k"]:
                extra.append(dict(p, solver="splitk", split_k=split))
    return extra + candidates


def merge_rules(old, new):
    """``old`` rules with those of ``new``'s shapes replaced by ``new``'s."""
    shape = lambda rule: tuple(sorted(rule["shape"].items())) if "shape" in rule else None  # noqa: E731
    tuned = {shape(rule) for rule in new}
    return [rule for rule in old if shape(rule) is None or shape(rule) not in tuned] + list(new)


class _Problem:
    """Seeded random operands on the device and a float64 reference on sampled rows."""

    def __init__(self, ctx, M, N, K, rng, sample_rows=48):
        self.ctx = ctx
        self.shape = (M, N, K)
        self.a = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        self.b = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        mf = cl.mem_flags
        self.a_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=self.a)
        self.b_buf = cl.Buffer(ctx.cl_context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=self.b)
        self.c_buf = cl.Buffer(ctx.cl_context, mf.READ_WRITE, M * N * 4)
        rows = {0, M - 1}
        rows.update(rng.integers(0, M, size=min(M, sample_rows)).tolist())
        self.rows = np.array(sorted(rows))
        self.reference = self.a[self.rows].astype(np.float64) @ self.b.astype(np.float64)

    def plan(self, params):
        M, N, K = self.shape
        return gemm_ops.GemmPlan(self.ctx, M, N, K, self.a_buf, 0, K, self.b_buf, 0, N,
                                 self.c_buf, 0, N, params=params)

    def error(self, plan):
        """MIOpen's error metric of the plan's result on the sampled rows (inf for NaN)."""
        M, N, _ = self.shape
        cl.enqueue_fill_buffer(self.ctx.queue, self.c_buf, np.float32(np.nan), 0, M * N * 4)
        plan.enqueue()
        out = np.empty((M, N), np.float32)
        cl.enqueue_copy(self.ctx.queue, out, self.c_buf, is_blocking=True)
        got = out[self.rows].astype(np.float64)
        if not np.isfinite(got).all():
            return math.inf
        scale = max(np.abs(self.reference).max(), 1e-30)
        return float(np.linalg.norm(got - self.reference) / (math.sqrt(got.size) * scale))

    def release(self):
        for buf in (self.a_buf, self.b_buf, self.c_buf):
            buf.release()


def _aligned(M, N, K):
    """Whether the rows of A (K floats), B and C (N floats) start on 4-float boundaries: the
    alignment class a size's builds depend on."""
    return K % 4 == 0 and N % 4 == 0


def time_per_run(ctx, run, sample_time=SAMPLE_TIME, first_run=None):
    """(seconds per call of ``run``, calls per sample, "profiling" or "wall clock"): the median
    of about ``sample_time`` seconds of samples, each a batch of calls whose span the timer
    measures (see MIN_SPAN), divided by the batch's length. A batch is first timed once; the
    samples then must have a median of MIN_SPAN too (a coarse timer reads a batch near one of
    its steps as 0 or as a step), else the batch grows again.

    ``first_run``: the wall-clock seconds a call just took (the tuner's check run). From
    LONG_RUN on, the call is timed as LONG_SAMPLES single calls by the host's clock, that call
    having been their warm-up (a call's launch costs microseconds: nothing against a tenth of a
    second); should those show a short call after all (the first one built something), the
    batches above time it."""
    if first_run is not None and first_run >= LONG_RUN:
        timing = time_enqueued(ctx, run, warmup=0, repeat=LONG_SAMPLES, wall_clock=True,
                               max_time=None)
        if timing.median >= LONG_RUN / 10:
            return timing.median, 1, "wall clock"
    wall, batch, repeat = not ctx.profiling, 1, 1

    def batched():
        for _ in range(batch):
            run()

    while True:
        started = time.perf_counter()
        timing = time_enqueued(ctx, batched, warmup=1, repeat=repeat, wall_clock=wall)
        # The warm-up and the samples, a batch each.
        elapsed = (time.perf_counter() - started) / (len(timing.samples) + 1)
        span = timing.median
        if span >= MIN_SPAN or (wall and batch >= MAX_BATCH):
            if repeat > 1:
                return span / batch, batch, "wall clock" if wall else "profiling"
            repeat = max(3, min(20, int(sample_time / max(span, 1e-6))))
            continue
        if not wall and (elapsed >= PROBE_WALL or batch >= MAX_BATCH):
            # The profiled span does not measure the work: wall-clock from a lone call on.
            wall, batch, repeat = True, 1, 1
            continue
        # Straight to the batch that the span predicts, at least a doubling, no longer than
        # PROBE_WALL by the wall-clock.
        predicted = math.ceil(batch * MIN_SPAN / max(span, 1e-9))
        bounded = math.floor(batch * PROBE_WALL / max(elapsed, 1e-9))
        batch, repeat = min(MAX_BATCH, max(2 * batch, min(predicted, bounded))), 1


def timing_cost(run_seconds, sample_time=SAMPLE_TIME):
    """About the seconds ``time_per_run`` takes for a call of ``run_seconds``."""
    if run_seconds >= LONG_RUN:
        return LONG_SAMPLES * run_seconds
    # Probing (a warm-up and a sample, or batches up to PROBE_WALL each for a short call), a
    # warm-up, then 3 to 20 samples of about sample_time in all.
    samples = min(20, max(3, sample_time / max(run_seconds, 1e-9)))
    return (3 + samples) * run_seconds + 2 * PROBE_WALL


class _Costs:
    """What the tuner knows of the cost of its steps, to decide what fits in the budget.

    A candidate's build and check on the verify problem costs what the builds of its kind took
    at most so far: "built" (the context holds its programs: nothing), "disk" (binaries from the
    program cache) or "compile" (from source); before the first of a kind, a guess
    (BUILD_GUESS). A run's seconds on a size come from the candidate's own rate on the latest
    smaller size that timed it, else the lowest rate timed on the latest size (sizes run
    smallest first, and a GEMM's rate grows with its size, so these overestimate), else its rate
    on the verify problem (far lower still)."""

    def __init__(self, is_gpu):
        self.guess = dict(BUILD_GUESS, compile=BUILD_GUESS["compile"][bool(is_gpu)])
        self.build = {}
        self.rate = {}
        self.floor = None
        self.verify_rate = {}

    def build_seconds(self, kind):
        return self.build.get(kind, self.guess[kind])

    def built(self, kind, seconds):
        self.build[kind] = max(self.build.get(kind, 0.0), seconds)

    def run_seconds(self, key, flops):
        rate = self.rate.get(key) or self.floor or self.verify_rate.get(key)
        return flops / rate if rate else 0.0

    def candidate(self, key, flops, kind):
        """Seconds to build (``kind``: "built", "disk", "compile" or None for a candidate built
        and checked already), check and time candidate ``key`` on a size of ``flops``."""
        run = self.run_seconds(key, flops)
        return (self.build_seconds(kind) if kind else 0.0) + run + timing_cost(run)

    def measured(self, timed):
        """``timed``: (key, flop/s) of the candidates timed on a size."""
        if timed:
            self.rate.update(timed)
            self.floor = min(rate for _, rate in timed)


class _Verifier:
    """Builds and checks candidates on the verify problem of each alignment class, once per
    candidate and class; keeps the outcome (the error, or the build's failure) and the cost."""

    def __init__(self, ctx, rng, costs):
        self.ctx = ctx
        self.rng = rng
        self.costs = costs
        self.problems = {}
        self.outcome = {}

    def problem(self, aligned):
        found = self.problems.get(aligned)
        if found is None:
            found = self.problems[aligned] = _Problem(self.ctx, VERIFY_M, *VERIFY_NK[aligned],
                                                      self.rng, sample_rows=VERIFY_M)
        return found

    def kind(self, params, aligned):
        """None where ``params`` was built and checked for this class, else what building it
        takes: "built" (the context holds its programs), "disk" or "compile"."""
        if (json.dumps(params, sort_keys=True), aligned) in self.outcome:
            return None
        with program.probe_builds():
            try:
                self.problem(aligned).plan(params)
            except program.NotBuilt as e:
                return "disk" if e.on_disk else "compile"
            except (DlprimError, cl.Error):
                pass  # refused before any build: costs nothing
        return "built"

    def check(self, params, aligned):
        """The verify error of ``params`` (inf for a wrong result), or raises the build's
        DlprimError / cl.Error (kept, and raised again for a later call)."""
        key = json.dumps(params, sort_keys=True)
        found = self.outcome.get((key, aligned))
        if found is None:
            kind = self.kind(params, aligned)
            started = time.perf_counter()
            problem = self.problem(aligned)
            try:
                plan = problem.plan(params)
                found = problem.error(plan)
                if found <= TOLERANCE:
                    # One more run, the first having built what the device builds at launch:
                    # the candidate's rate on a tiny problem, the estimate of last resort.
                    t0 = time.perf_counter()
                    plan.enqueue()
                    self.ctx.queue.finish()
                    M, N, K = problem.shape
                    self.costs.verify_rate[key] = 2.0 * M * N * K / max(
                        time.perf_counter() - t0, 1e-9)
            except (DlprimError, cl.Error) as e:
                found = e
            self.costs.built(kind, time.perf_counter() - started)
            self.outcome[(key, aligned)] = found
        if isinstance(found, Exception):
            raise found
        return found

    def release(self):
        for problem in self.problems.values():
            problem.release()


# What a candidate's cost covers, by what its build takes (``_Verifier.kind``).
STEPS = {None: "timing it", "built": "checking and timing it",
         "disk": "loading its build, checking and timing it",
         "compile": "compiling it, checking and timing it"}
BUILD_STEPS = {"built": "checking it", "disk": "loading its build and checking it",
               "compile": "compiling and checking it"}


def _rejected(error):
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def _secs(seconds):
    """"2.5 s", or "40 ms" below a tenth of a second."""
    return f"{seconds:.1f} s" if seconds >= 0.1 else f"{seconds * 1e3:.0f} ms"


def _fmt_size(shape):
    return "x".join(str(v) for v in shape)


def tune_gemm(ctx, sizes, budget, space="quick", log=print, seed=1234, progress=None,
              started=None):
    """Tune every size in ``sizes`` within ``budget`` seconds from ``started`` (a
    ``time.perf_counter()`` reading; default: now), builds and checks included; returns the list
    of measured rules (one per size that got one, in the order of ``sizes``) and a report of
    every candidate: timed ("ms"), rejected ("rejected": why) or skipped ("skipped": why, for
    want of budget). ``log`` gets the lines that stay (a size's result), ``progress`` (a
    ``Progress``; default on stderr) one line per candidate. See the module docstring for how
    the budget is shared."""
    started = time.perf_counter() if started is None else started
    deadline = started + budget
    progress = Progress() if progress is None else progress
    rng = np.random.default_rng(seed)
    costs = _Costs(ctx.info.is_gpu)
    verifier = _Verifier(ctx, rng, costs)
    # Candidates in the solver form (the form before it, {"kernel": ...}, is read as well).
    base = [p if "solver" in p else gemm_ops.solver_params(p)
            for p in gemm_candidates(ctx.info, space)]
    report, found = [], {}
    elapsed = lambda: time.perf_counter() - started  # noqa: E731

    # Build and check the candidates first, for the alignments the sizes need, so that compile
    # time does not eat the shares of the first sizes; at most BUILD_SHARE of the budget.
    classes = list(dict.fromkeys(_aligned(*size) for size in sizes))
    jobs = [(params, aligned) for aligned in classes for params in base]
    build_end = started + BUILD_SHARE * budget
    unbuilt = 0
    for done, (params, aligned) in enumerate(jobs):
        head = f"build+check [{done + 1}/{len(jobs)}] {describe(params)}"
        kind = verifier.kind(params, aligned)
        need = costs.build_seconds(kind) if kind else 0.0
        if time.perf_counter() + need > build_end:
            unbuilt += 1
            progress.candidate(f"{head}: skipped, {BUILD_STEPS[kind]} needs about {_secs(need)}, "
                               f"{_secs(max(0.0, build_end - time.perf_counter()))} left of the "
                               f"share for builds ({elapsed():.0f}/{budget:.0f} s)")
            continue
        t0 = time.perf_counter()
        try:
            error = verifier.check(params, aligned)
            outcome = ("ok" if error <= TOLERANCE
                       else f"rejected, result differs from the reference (error {error:.2e})")
        except (DlprimError, cl.Error) as e:
            outcome = f"build failed: {_rejected(e)}"
        progress.candidate(f"{head}: {outcome}, {_secs(time.perf_counter() - t0)} "
                           f"({elapsed():.0f}/{budget:.0f} s)")
    if unbuilt:
        log(f"build+check: {unbuilt} of {len(jobs)} builds did not fit in "
            f"{BUILD_SHARE:.0%} of the budget; the sizes build them where their share allows")

    order = sorted(range(len(sizes)), key=lambda i: math.prod(sizes[i]))
    lists = {}
    for index in order:
        M, N, K = sizes[index]
        candidates = _with_splits(base, M, N, K, ctx.info)
        if M * N * K <= 1 << 18:
            # Tiny problems: the one-item-per-element kernel first, so the budget reaches it.
            candidates = sorted(candidates, key=lambda p: p["solver"] != "small")
        lists[index] = (candidates, [json.dumps(p, sort_keys=True) for p in candidates])

    def least(index):
        """The least seconds a candidate of size ``index`` is estimated to need, builds aside."""
        flops = 2.0 * math.prod(sizes[index])
        return min(costs.candidate(key, flops, None) for key in lists[index][1])

    for position, index in enumerate(order):
        M, N, K = sizes[index]
        name = f"gemm {_fmt_size(sizes[index])}"
        aligned = _aligned(M, N, K)
        flops = 2.0 * M * N * K
        now = time.perf_counter()
        # An equal share of what is left, among this size and the later ones that can fit.
        later = sum(1 for i in order[position + 1:] if now + least(i) <= deadline)
        size_end = now + max(0.0, deadline - now) / (1 + later)
        candidates, keys = lists[index]
        cheapest = min(costs.candidate(key, flops, verifier.kind(params, aligned))
                       for params, key in zip(candidates, keys))
        if now + cheapest > deadline:
            why = (f"its cheapest candidate needs about {_secs(cheapest)}, "
                   f"{_secs(max(0.0, deadline - now))} of the budget left")
            for params in candidates:
                report.append({"shape": [M, N, K], "params": params, "skipped": why})
            log(f"{name}: skipped, {why}; no rule")
            continue
        problem = _Problem(ctx, M, N, K, rng)
        best, timed, skipped = None, [], 0
        for done, (params, key) in enumerate(zip(candidates, keys)):
            head = f"{name} [{done + 1}/{len(candidates)}] {describe(params)}"
            entry = {"shape": [M, N, K], "params": params}
            report.append(entry)
            # The first candidate may use the rest of the budget, later ones the size's share.
            limit = deadline if best is None else min(size_end, deadline)

            def skip(why):
                entry["skipped"] = why
                progress.candidate(f"{head}: skipped, {why} ({elapsed():.0f}/{budget:.0f} s)")

            left = lambda: max(0.0, limit - time.perf_counter())  # noqa: E731
            share = "of the budget" if best is None else "of the size's share"
            # Probed again: a build since the size began may have built this one's programs.
            kind = verifier.kind(params, aligned)
            need = costs.candidate(key, flops, kind)
            if time.perf_counter() + need > limit:
                skip(f"{STEPS[kind]} needs about {_secs(need)}, {_secs(left())} left {share}")
                skipped += 1
                continue
            try:
                entry["verify_error"] = verifier.check(params, aligned)
                if entry["verify_error"] <= TOLERANCE:
                    run = costs.run_seconds(key, flops)
                    if time.perf_counter() + run + timing_cost(run) > limit:
                        skip(f"checked on the small problem, but its run and timing (about "
                             f"{_secs(run + timing_cost(run))}) no longer fit, {_secs(left())} "
                             f"left {share}")
                        skipped += 1
                        continue
                    plan = problem.plan(params)
                    t0 = time.perf_counter()
                    entry["error"] = problem.error(plan)
                    check = time.perf_counter() - t0
                else:
                    entry["error"] = math.inf
            except (DlprimError, cl.Error) as e:
                entry["rejected"] = _rejected(e)
                progress.candidate(f"{head}: build failed, {entry['rejected']}")
                continue
            if max(entry["error"], entry["verify_error"]) > TOLERANCE:
                worst = max(entry["error"], entry["verify_error"])
                entry["rejected"] = f"result differs from the reference (error {worst:.2e})"
                progress.candidate(f"{head}: rejected, {entry['rejected']}")
                continue
            if time.perf_counter() + timing_cost(check) > limit:
                skip(f"checked, but timing it (about {_secs(timing_cost(check))}) does not fit, "
                     f"{_secs(left())} left {share}")
                skipped += 1
                continue
            seconds, entry["batch"], entry["timer"] = time_per_run(ctx, plan.enqueue,
                                                                   first_run=check)
            entry["ms"] = seconds * 1e3
            entry["gflops"] = flops / seconds / 1e9
            timed.append((key, flops / seconds))
            if best is None or entry["ms"] < best["ms"]:
                best = entry
            progress.candidate(f"{head}: {entry['ms']:.4g} ms, {entry['gflops']:.4g} GFLOP/s "
                               f"(best {best['gflops']:.4g}) ({elapsed():.0f}/{budget:.0f} s)")
        problem.release()
        costs.measured(timed)
        note = f"{len(timed)} of {len(candidates)} candidates timed"
        if skipped:
            note += f", {skipped} skipped for the budget"
        if best is None:
            log(f"{name}: no candidate {'fit and ' if skipped else ''}passed ({note}); no rule")
            continue
        log(f"{name}: {best['gflops']:.1f} GFLOP/s with {describe(best['params'])} ({note})")
        found[index] = {"shape": {"m": M, "n": N, "k": K}, "params": best["params"],
                        "ms": round(best["ms"], 5), "gflops": round(best["gflops"], 1)}
    verifier.release()
    return [found[i] for i in range(len(sizes)) if i in found], report


def budget_summary(budget, used, sizes, rules, report):
    """The run's use of its budget and the sizes left without a rule, as a dict (for the
    report) and a line to print."""
    ruled = {(r["shape"]["m"], r["shape"]["n"], r["shape"]["k"]) for r in rules}
    missing = [tuple(s) for s in dict.fromkeys(tuple(s) for s in sizes) if tuple(s) not in ruled]
    skipped = [e for e in report if "skipped" in e]
    unfit = [s for s in missing if all("skipped" in e for e in report if tuple(e["shape"]) == s)]
    summary = {"budget_s": budget, "used_s": round(used, 2),
               "over_by_s": round(max(0.0, used - budget), 2),
               "skipped_candidates": len(skipped),
               "sizes_without_rule": [_fmt_size(s) for s in missing],
               "sizes_skipped_for_budget": [_fmt_size(s) for s in unfit]}
    if used > budget:
        line = (f"budget {budget:g} s: used {_secs(used)}, over by {_secs(used - budget)} (a step "
                f"took longer than estimated)")
    else:
        line = f"budget {budget:g} s: used {_secs(used)}"
    if skipped:
        line += f"; {len(skipped)} candidate runs skipped for the budget"
    if unfit:
        line += f"; sizes skipped for the budget (no rule): {', '.join(summary['sizes_skipped_for_budget'])}"
    others = [s for s in missing if s not in unfit]
    if others:
        line += f"; no candidate passed for {', '.join(_fmt_size(s) for s in others)}"
    return summary, line


DESCRIPTION = """\
Search GEMM kernel parameters on an OpenCL device and store the fastest as rules of the
device's entry in the tuning database.

For each size every candidate is built, run on seeded random data and compared with a float64
reference; a candidate whose result differs is rejected and never timed. The others are timed
(median after a warm-up) and the fastest becomes the size's rule.

The budget bounds the whole run, builds and checks included. Sizes run smallest first; the
candidates are built and checked up front in at most half of the budget, then each size gets an
equal share of what is left. Every step starts only if its estimated cost fits: what does not
is skipped and named. The last line says how much of the budget the run used; a step that takes
longer than its estimate (a kernel build has none before the first) can overrun the budget by
the difference.

Progress goes to stderr, one line per candidate (redrawn in place on a terminal)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description's paragraphs kept; each option's default at the end of its help (where
    the help does not already say it, and the option has a value by default)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" not in text and action.default not in (None, False, argparse.SUPPRESS)
                and action.option_strings):
            default = action.default
            if isinstance(default, str) and "," in default:
                default = default.replace(",", ", ")
            text += f" (default: {default})"
        return text.replace("%", "%%")


def main(argv=None):
    started = time.perf_counter()
    parser = argparse.ArgumentParser(prog="dlprim-tune", description=DESCRIPTION,
                                     formatter_class=_HelpFormatter)
    parser.add_argument("family", choices=["gemm"], help="kernel family to tune")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help="comma-separated sizes: N (N^3) or MxNxK")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds for the whole run, builds and checks included")
    parser.add_argument("--space", choices=["quick", "full"], default="quick",
                        help="focused candidate set or the full product of tunables")
    parser.add_argument("--output", default=None,
                        help="database file to write (default: the user database in the cache "
                             "directory, which lookups read before the shipped one)")
    parser.add_argument("--report", default=None,
                        help="write every candidate's result (timed, rejected or skipped) and "
                             "the budget's use to this JSON file")
    parser.add_argument("--device", default=None,
                        help="device: P:D index or part of its name (default: DLPRIM_DEVICE, "
                             "else the first GPU, else the first CPU)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the device's rules for the sizes not tuned now (from the "
                             "output database, else the shipped one) and replace only those of "
                             "the tuned sizes; without it the device's entry holds the tuned "
                             "sizes alone")
    args = parser.parse_args(argv)
    if not args.budget > 0:
        parser.error(f"--budget must be > 0, got {args.budget}")

    progress = Progress(sys.stderr)
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        if not sizes:
            raise DlprimError("--sizes names no size")
        ctx = Context(args.device)
        progress.line(f"tuning gemm on {ctx.info.name} ({ctx.info.platform_name}, driver "
                      f"{ctx.info.driver_version}), {len(sizes)} sizes, budget {args.budget:g} s")
        rules, report = tune_gemm(ctx, sizes, args.budget, args.space, log=progress.line,
                                  progress=progress, started=started)
        tuned = len(rules)
        path = args.output or tuning.user_path("gemm")
        if args.merge:
            old = None
            for db in (tuning.read_db(path, "gemm", strict=False),
                       tuning.read_db(tuning.shipped_path("gemm"), "gemm")):
                if ctx.info.name in db["devices"]:
                    old = db["devices"][ctx.info.name]["rules"]
                    break
            rules = merge_rules(old or [], rules)
        tuning.store_device_entry(path, "gemm", ctx.info, rules)
        kept = f" ({tuned} tuned now, {len(rules) - tuned} kept)" if args.merge else ""
        progress.line(f"wrote {len(rules)} rules{kept} for {ctx.info.name!r} to {path}")
        summary, line = budget_summary(args.budget, time.perf_counter() - started, sizes,
                                       rules[len(rules) - tuned:], report)
        if args.report:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                           "budget": summary, "candidates": report}, f, indent=1)
        progress.line(line)
    except DlprimError as e:
        print(f"dlprim-tune: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
