"""The benchmark harness: a case is verified against a reference, then timed, then compared with
the same work in PyTorch; each case becomes one ``Row`` of the report.

A suite module exposes ``cases(bench) -> list[CaseSpec]``. A ``CaseSpec`` is cheap (a name and a
``prepare`` callable) so that the progress bar knows the total before anything is built;
``prepare()`` allocates, compiles and returns a ``Case``:

* ``run()`` enqueues the library's work on ``ctx.queue`` and nothing else (it is what is timed);
* ``verify()`` runs it once more on poisoned outputs, reads the results back and returns the
  error metric against a float64 reference;
* ``work`` and ``unit``: flops ("GFLOP/s") or bytes moved ("GB/s") of one ``run()``;
* ``torch_run``: the same work in PyTorch on the baseline device, or None.
"""
import math
import time

import numpy as np

from ..errors import DlprimError
from ..timing import Timing, time_enqueued

# float32 results land far below this for the operators measured (MIOpen's metric).
DEFAULT_TOLERANCE = 1e-5
# A ratio of two medians ranks the two only where both were measured tightly: with p80 / p20 of
# either side above this, the report calls the ratio not rankable instead of a speed-up.
MAX_SPREAD = 1.25


class Skip(Exception):
    """A case or a whole suite cannot run here; the message says why."""


def error_metric(out, ref):
    """MIOpen's metric ``||out - ref|| / (sqrt(n) * max|ref|)`` in float64; inf when ``out`` has
    NaN or Inf where ``ref`` is finite."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise DlprimError(f"result shape {out.shape} != reference shape {ref.shape}")
    if out.size == 0:
        return 0.0
    finite = np.isfinite(ref)
    if (finite & ~np.isfinite(out)).any():
        return math.inf
    if not finite.all():
        out, ref = np.where(finite, out, 0.0), np.where(finite, ref, 0.0)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.linalg.norm((out - ref).ravel()) / (math.sqrt(out.size) * scale))


class CaseSpec:
    """A case before it is built: ``suite``, ``name`` and ``prepare() -> Case``."""

    def __init__(self, suite, name, prepare, group=""):
        self.suite = suite
        self.name = name
        self.group = group
        self.prepare = prepare


class Case:
    """A built case; see the module docstring for the meaning of each field."""

    def __init__(self, run, verify, work, unit, algorithm="", torch_run=None, tolerance=None,
                 params=None, per_call=1, wall_clock=False):
        self.run = run
        self.verify = verify
        self.work = float(work)
        self.unit = unit
        self.algorithm = algorithm
        self.torch_run = torch_run
        self.tolerance = DEFAULT_TOLERANCE if tolerance is None else tolerance
        self.params = dict(params or {})
        # How many operations one run() performs: the times reported are per operation.
        self.per_call = per_call
        # Time run() (and torch_run) by wall clock with the device drained after each, as a
        # caller of a public call sees it, instead of by device events.
        self.wall_clock = wall_clock


class Row:
    """One line of the report (also one record of the JSON file)."""

    FIELDS = ("suite", "group", "name", "status", "algorithm", "median_ms", "p20_ms", "p80_ms",
              "samples", "unit", "work", "rate", "peak_percent", "torch_median_ms", "torch_p20_ms",
              "torch_p80_ms", "torch_samples", "speedup_vs_torch", "rankable", "error",
              "tolerance", "wall_s", "params")

    def __init__(self, suite, name, group=""):
        self.suite = suite
        self.name = name
        self.group = group
        self.status = "ok"
        self.algorithm = ""
        self.median_ms = self.p20_ms = self.p80_ms = None
        self.unit = ""
        self.work = None
        self.rate = None
        self.peak_percent = None
        self.samples = self.torch_samples = None
        self.torch_median_ms = self.torch_p20_ms = self.torch_p80_ms = None
        self.speedup_vs_torch = None
        # Whether both medians were measured tightly enough (p80 / p20 within the
        # measurement's max_spread) for speedup_vs_torch to rank them; None without a torch time.
        self.rankable = None
        self.error = None
        self.tolerance = None
        self.wall_s = None
        self.params = {}

    @property
    def ok(self):
        return self.status == "ok"

    def as_dict(self):
        return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return f"Row({self.suite}/{self.name}: {self.status}, {self.median_ms} ms)"


def rate_of(work, unit, seconds):
    """GFLOP/s or GB/s (both 1e9 per second) of ``work`` done in ``seconds``; None for times."""
    if unit in ("GFLOP/s", "GB/s") and seconds > 0:
        return work / seconds / 1e9
    return None


class Measurement:
    """How a case is timed, the library's work and PyTorch's alike (``collect``): warm-up and
    repeat counts, a cap on the time spent per case, and the widest spread of samples whose
    median ranks.

    The first run sets how many timed runs fit into ``budget_s`` (at least ``min_repeat``, at
    most ``repeat``), so a slow case costs a bounded time and a fast one gets its full repeats.
    ``exact``: ``warmup`` warm-up runs and ``repeat`` timed runs whatever they cost (the
    driver's -i), no more than ``max_time`` seconds of timed runs when that is given.
    """

    def __init__(self, warmup=3, repeat=20, min_repeat=3, budget_s=1.0, max_spread=MAX_SPREAD,
                 exact=False, max_time=None):
        self.warmup = warmup
        self.repeat = repeat
        self.min_repeat = min_repeat
        self.budget_s = budget_s
        self.max_spread = max_spread
        self.exact = exact
        self.max_time = max_time

    def repeats_for(self, seconds):
        if self.exact:
            return self.repeat
        if seconds <= 0:
            return self.repeat
        return int(max(self.min_repeat, min(self.repeat, self.budget_s // seconds)))

    def collect(self, once):
        """A Timing of the seconds ``once()`` returns, one run each.

        The first run sizes the repeat count and is the first warm-up run (the first timed run
        when ``warmup`` is 0); then up to ``warmup - 1`` more warm-up runs (at most half the
        repeats, for slow cases; exactly that many when ``exact``), then the timed runs. While
        their spread (p80 / p20) is above ``max_spread``, more timed runs follow, up to twice
        the repeat count and ``budget_s`` more seconds (not when ``exact``): a median of more
        samples moves less."""
        first = once()
        repeat = self.repeats_for(first)
        samples = [] if self.warmup > 0 else [first]
        extra = max(0, self.warmup - 1)
        for _ in range(extra if self.exact else min(extra, repeat // 2)):
            once()
        started = time.perf_counter()
        while len(samples) < repeat:
            if self.max_time is not None and samples and \
                    time.perf_counter() - started > self.max_time:
                return Timing(samples, capped=self.max_time)
            samples.append(once())
        timing = Timing(samples)
        if self.exact:
            return timing
        until = time.perf_counter() + self.budget_s
        while (timing.spread > self.max_spread and len(samples) < 2 * repeat
               and time.perf_counter() < until):
            samples.append(once())
            timing = Timing(samples)
        return timing

    def ranks(self, *timings):
        """Whether every one of ``timings`` is tight enough (p80 / p20 within max_spread) for
        a ratio of their medians to rank them."""
        return all(t.spread <= self.max_spread for t in timings)


def time_case(ctx, case, measurement):
    """Device time of ``case.run`` (per operation; wall clock with the device drained for a
    ``wall_clock`` case), sampled by ``measurement.collect``: a Timing of seconds."""
    # verify() already ran the case once (kernels built, memory touched).
    wall = case.wall_clock
    timing = measurement.collect(
        lambda: time_enqueued(ctx, case.run, warmup=0, repeat=1, wall_clock=wall).median)
    if case.per_call != 1:
        timing = Timing(timing.samples / case.per_call, capped=timing.capped)
    return timing


def measure(bench, spec):
    """Build, verify, time and compare one case; never raises for a failing case.
    ``row.wall_s`` is the host time the whole case took (builds, references, both timings)."""
    started = time.perf_counter()
    row = _measure(bench, spec)
    row.wall_s = round(time.perf_counter() - started, 3)
    return row


def _measure(bench, spec):
    row = Row(spec.suite, spec.name, spec.group)
    try:
        case = spec.prepare()
    except Skip as e:
        row.status = f"skipped: {e}"
        return row
    except Exception as e:  # the library under test failing to build a case is a result too
        row.status = f"failed: {type(e).__name__}: {_first_line(e)}"
        return row
    row.algorithm = case.algorithm
    row.unit = case.unit
    row.work = case.work
    row.tolerance = case.tolerance
    row.params = case.params
    try:
        row.error = float(case.verify())
    except Skip as e:
        row.status = f"skipped: {e}"
        return row
    except Exception as e:  # a crash in the library under test is a result to report
        row.status = f"failed: {type(e).__name__}: {_first_line(e)}"
        return row
    if not (row.error <= case.tolerance):
        row.status = f"failed: error {row.error:.3g} > {case.tolerance:.1g}"
        return row
    try:
        timing = time_case(bench.ctx, case, bench.measurement)
    except Exception as e:
        row.status = f"failed: {type(e).__name__}: {_first_line(e)}"
        return row
    row.median_ms, row.p20_ms, row.p80_ms = (timing.median * 1e3, timing.p20 * 1e3,
                                             timing.p80 * 1e3)
    row.samples = len(timing.samples)
    row.rate = rate_of(case.work, case.unit, timing.median)
    peak = bench.peak_for(case.unit)
    if row.rate is not None and peak:
        row.peak_percent = 100.0 * row.rate / peak
    if case.torch_run is not None and bench.torch is not None:
        try:
            t = bench.torch.time(case.torch_run, bench.measurement, wall_clock=case.wall_clock)
            if case.per_call != 1:
                t = Timing(t.samples / case.per_call)
            row.torch_median_ms, row.torch_p20_ms, row.torch_p80_ms = (t.median * 1e3, t.p20 * 1e3,
                                                                       t.p80 * 1e3)
            row.torch_samples = len(t.samples)
            if t.median > 0:
                row.speedup_vs_torch = t.median / timing.median
                row.rankable = bench.measurement.ranks(timing, t)
        except Exception as e:
            row.params["torch_error"] = f"{type(e).__name__}: {_first_line(e)}"
    return row


def _first_line(error):
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


class Bench:
    """What every suite gets: the context, options, measured peaks, the torch baseline (or None),
    a seeded generator and the reference helper."""

    def __init__(self, ctx, *, quick=False, batch=None, measurement=None, torch=None, seed=0):
        self.ctx = ctx
        self.quick = quick
        self.batch = batch
        self.measurement = measurement or Measurement()
        self.torch = torch
        self.rng = np.random.default_rng(seed)
        # Filled by the peak probe: "GFLOP/s" and "GB/s" -> measured device peak.
        self.peaks = {}
        self.started = time.time()

    def peak_for(self, unit):
        return self.peaks.get(unit)

    def random(self, shape, low=-1.0, high=1.0):
        """Seeded uniform float32 data (never zeros), fast for large shapes: a block of a prime
        length is drawn once and repeated, so that the repeat never lines up with a dimension."""
        size = math.prod(shape)
        block = 1_000_003
        if size <= block:
            return self.rng.uniform(low, high, size=shape).astype(np.float32)
        base = self.rng.uniform(low, high, size=block).astype(np.float32)
        return np.resize(base, size).reshape(shape)

    def default_batch(self, gpu, quick, cpu):
        """The batch size to use: --batch when given, else per mode and device kind."""
        if self.batch:
            return self.batch
        if self.quick:
            return quick
        return gpu if self.ctx.info.is_gpu else cpu
