"""``dlprim-tune``: search kernel parameters on the current device and store the winners.

Usage::

    dlprim-tune gemm [--sizes 1024,4096,256x3136x576] [--budget SECONDS] [--output PATH]
                     [--device SPEC] [--space quick|full] [--merge]

For each problem size every candidate parameter set is built, run on seeded random data and
compared with a float64 reference (on a small odd-sized problem in full, and on sampled rows of
the real one); a candidate whose result differs is rejected and never timed. The others are
timed with OpenCL profiling (median after a warm-up; each sample a batch of runs, long
enough for the device's timer to measure, divided by its length; host wall-clock where the
profiled span does not grow with the work) and the fastest becomes a measured rule
of this device's entry in the tuning database (``dlprim_py.tuning``), naming its solver
(``{"solver": "tiled", ...}``; "splitk" for tiles split along K). Devices that report Intel
subgroups also try the "subgroup" solver's register blocks. Without ``--output``
the database under the cache directory is written, which lookups read before the shipped one.
``--merge`` keeps the device's other rules (from that database, else the shipped one) and
replaces only those of the sizes tuned; without it the entry holds the tuned sizes alone.
Progress goes to stderr as a plain text bar.
"""
import argparse
import itertools
import json
import math
import sys
import time

import numpy as np
import pyopencl as cl

from . import tuning
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
VERIFY_SHAPE = (67, 45, 35)  # odd sizes: every tile has edges
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


class ProgressBar:
    """A one-line text progress bar on stderr."""

    def __init__(self, total, label, width=30, stream=sys.stderr):
        self.total = max(total, 1)
        self.label = label
        self.width = width
        self.stream = stream
        self.done = 0
        self.started = time.perf_counter()

    def update(self, done, note=""):
        self.done = done
        filled = int(self.width * min(done, self.total) / self.total)
        elapsed = time.perf_counter() - self.started
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                          f"{done}/{self.total} {elapsed:5.0f}s {note[:60]:<60}")
        self.stream.flush()

    def close(self):
        self.stream.write("\n")
        self.stream.flush()


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


def time_per_run(ctx, run, sample_time=SAMPLE_TIME):
    """(seconds per call of ``run``, calls per sample, "profiling" or "wall clock"): the median
    of about ``sample_time`` seconds of samples, each a batch of calls whose span the timer
    measures (see MIN_SPAN), divided by the batch's length. A batch is first timed once; the
    samples then must have a median of MIN_SPAN too (a coarse timer reads a batch near one of
    its steps as 0 or as a step), else the batch grows again."""
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


def tune_gemm(ctx, sizes, budget, space="quick", log=print, seed=1234):
    """Tune every size in ``sizes`` within about ``budget`` seconds in all; returns the list of
    measured rules (one per size) and a report of every candidate tried."""
    rng = np.random.default_rng(seed)
    # Candidates in the solver form (the form before it, {"kernel": ...}, is read as well).
    base = [p if "solver" in p else gemm_ops.solver_params(p)
            for p in gemm_candidates(ctx.info, space)]
    verified = {}
    verify_problem = _Problem(ctx, *VERIFY_SHAPE, rng, sample_rows=VERIFY_SHAPE[0])
    rules, report = [], []
    # Build and verify every candidate first, so that compile time does not eat the budgets of
    # the first sizes.
    bar = ProgressBar(len(base), "build+verify")
    for done, params in enumerate(base):
        try:
            verified[json.dumps(params, sort_keys=True)] = \
                verify_problem.error(verify_problem.plan(params))
        except (DlprimError, cl.Error):
            pass  # rejected again, with its message, in the timed loop below
        bar.update(done + 1)
    bar.close()
    started = time.perf_counter()
    for index, (M, N, K) in enumerate(sizes):
        size_budget = (budget - (time.perf_counter() - started)) / (len(sizes) - index)
        size_started = time.perf_counter()
        candidates = _with_splits(base, M, N, K, ctx.info)
        if M * N * K <= 1 << 18:
            # Tiny problems: the one-item-per-element kernel first, so the budget reaches it.
            candidates = sorted(candidates, key=lambda p: p["solver"] != "small")
        problem = _Problem(ctx, M, N, K, rng)
        flops = 2.0 * M * N * K
        best = None
        bar = ProgressBar(len(candidates), f"gemm {M}x{N}x{K}")
        for done, params in enumerate(candidates):
            if time.perf_counter() - size_started > size_budget and best is not None:
                break
            entry = {"shape": [M, N, K], "params": params}
            try:
                key = json.dumps(params, sort_keys=True)
                if key not in verified:
                    verified[key] = verify_problem.error(verify_problem.plan(params))
                entry["verify_error"] = verified[key]
                plan = problem.plan(params)
                entry["error"] = problem.error(plan) if verified[key] <= TOLERANCE else math.inf
            except (DlprimError, cl.Error) as e:
                entry["rejected"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                report.append(entry)
                bar.update(done + 1, "build failed")
                continue
            if max(entry["error"], entry["verify_error"]) > TOLERANCE:
                entry["rejected"] = f"result differs from the reference (error {entry['error']:.2e})"
                report.append(entry)
                bar.update(done + 1, "rejected: wrong result")
                continue
            seconds, entry["batch"], entry["timer"] = time_per_run(ctx, plan.enqueue)
            entry["ms"] = seconds * 1e3
            entry["gflops"] = flops / seconds / 1e9
            report.append(entry)
            if best is None or entry["ms"] < best["ms"]:
                best = entry
            bar.update(done + 1, f"best {best['gflops']:.0f} GFLOP/s")
        bar.close()
        problem.release()
        if best is None:
            log(f"gemm {M}x{N}x{K}: no candidate passed; no rule written")
            continue
        log(f"gemm {M}x{N}x{K}: {best['gflops']:.1f} GFLOP/s with {best['params']}")
        rules.append({"shape": {"m": M, "n": N, "k": K}, "params": best["params"],
                      "ms": round(best["ms"], 5), "gflops": round(best["gflops"], 1)})
    verify_problem.release()
    return rules, report


def main(argv=None):
    parser = argparse.ArgumentParser(prog="dlprim-tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=["gemm"], help="kernel family to tune")
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help="comma-separated sizes: N (N^3) or MxNxK")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the search")
    parser.add_argument("--space", choices=["quick", "full"], default="quick",
                        help="focused candidate set or the full product of tunables")
    parser.add_argument("--output", default=None,
                        help="database file to write (default: the user database)")
    parser.add_argument("--report", default=None, help="write every candidate's result here")
    parser.add_argument("--device", default=None, help="device: P:D index or part of its name")
    parser.add_argument("--merge", action="store_true",
                        help="keep the device's rules for other sizes (see above)")
    args = parser.parse_args(argv)

    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        ctx = Context(args.device)
        print(f"tuning gemm on {ctx.info.name} ({ctx.info.platform_name}, driver "
              f"{ctx.info.driver_version}), {len(sizes)} sizes, budget {args.budget:.0f} s",
              file=sys.stderr)
        rules, report = tune_gemm(ctx, sizes, args.budget, args.space,
                                  log=lambda s: print(s, file=sys.stderr))
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
        print(f"wrote {len(rules)} rules for {ctx.info.name!r} to {path}", file=sys.stderr)
        if args.report:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump({"device": ctx.info.name, "driver": ctx.info.driver_version,
                           "candidates": report}, f, indent=1)
    except DlprimError as e:
        print(f"dlprim-tune: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
