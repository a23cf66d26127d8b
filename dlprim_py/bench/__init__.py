"""``dlprim-bench`` (``python -m dlprim_py.bench``): how fast is this on my device, against what
I already have.

Suites: ``peak`` (FP32 multiply-add rate, copy bandwidth, launch cost), ``gemm``, ``conv``
(ResNet-50, VGG-16 and MobileNetV2 layers; forward, backward-data, backward-filter), ``ops``
(pooling, batch norm, activations, softmax, reductions) and ``fusion``; ``nets`` (whole
ResNet-50 / MobileNetV2 inference and training steps), ``dispatch`` (public calls as users
make them, host microseconds per call in each row's params), ``optim`` (one optimizer step on
ResNet-18's parameters, fused update against torch.optim's) and ``train`` (dp.models training
steps with dp.optim's SGD and AdamW) and ``onnx`` (torchvision classifiers exported to ONNX and
run by ``dp.onnx``) only when named with --suite.
Every case is checked against a float64 reference before it is timed; times are the median
(and 20th/80th percentiles) after a warm-up of OpenCL profiling-event times, or for ``nets``,
``dispatch`` and ``train`` of the wall clock with the device drained after each call; rates are
compared with the measured device peak, and the same work in PyTorch (CUDA with TF32 off on NVIDIA,
else CPU) is timed in the same run, the same way (``harness.Measurement.collect``: the same
warm-up and repeats, more runs while they spread widely). A ratio to PyTorch ranks the two only
where both sides' p80/p20 are within --max-spread: the others are shown in parentheses and the
summary counts them as not rankable instead of averaging them into a speed-up. Examples::

    dlprim-bench --quick                      # a few minutes on a 2-core CPU (PoCL)
    dlprim-bench --json out.json --plot out.png
    dlprim-bench --suite conv --nets resnet50 --batch 32
"""
import argparse
import importlib
import sys
import time

SUITES = ("peak", "gemm", "conv", "ops", "fusion")
# Run only when named with --suite: whole networks (nets.py), inference and a training step;
# public calls and host time per call (dispatch.py); one optimizer step alone, fused update
# against torch.optim's (optim.py); dp.models training steps with dp.optim (train.py);
# torchvision models exported to ONNX and run by dp.onnx (onnx.py).
EXTRA_SUITES = ("nets", "dispatch", "optim", "train", "onnx")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="dlprim-bench",
        description="Benchmark dlprim_py on an OpenCL device against its measured peak and "
                    "against PyTorch.")
    parser.add_argument("--suite", action="append", choices=SUITES + EXTRA_SUITES, metavar="SUITE",
                        help=f"suite to run, repeatable (default: all of {', '.join(SUITES)}; "
                             f"also: {', '.join(EXTRA_SUITES)})")
    parser.add_argument("--quick", action="store_true",
                        help="small batch, a few layers, few repeats (minutes on a 2-core CPU)")
    parser.add_argument("--batch", type=int, default=None,
                        help="batch size for conv/ops/fusion (default: 32 on a GPU, 1 with --quick)")
    parser.add_argument("--nets", default="resnet50,vgg16,mobilenet_v2",
                        help="conv layer sets, comma-separated (resnet50, vgg16, mobilenet_v2)")
    parser.add_argument("--directions", default="fwd,bwd-data,bwd-filter",
                        help="conv directions, comma-separated (fwd, bwd-data, bwd-filter)")
    parser.add_argument("--all-algorithms", action="store_true",
                        help="conv: time every algorithm on every layer (forced), not only the "
                             "one the library picks")
    parser.add_argument("--device", default=None,
                        help='OpenCL device: "P:D" index or a piece of its name (default: '
                             'DLPRIM_DEVICE, else the first GPU, else the first CPU)')
    parser.add_argument("--warmup", type=int, default=None, help="warm-up runs per case")
    parser.add_argument("--repeat", type=int, default=None, help="most timed runs per case")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of timed runs per case (fewer repeats for slow cases)")
    parser.add_argument("--max-spread", type=float, default=None,
                        help="p80/p20 of a case's times above which its ratio to PyTorch is "
                             "reported as not rankable (default 1.25)")
    parser.add_argument("--time-limit", type=float, default=480.0,
                        help="seconds after which the remaining cases are reported as skipped "
                             "(default 480; 0: no limit)")
    parser.add_argument("--no-torch", action="store_true",
                        help="do not time PyTorch (it still serves as the reference)")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE as JSON")
    parser.add_argument("--commit", default=None,
                        help="the commit the measured tree is, for the JSON record, when it has "
                             "no git history (a copy of a checkout)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw the speed relative to PyTorch per case (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--list", action="store_true",
                        help="list the cases the selected suites would run, and stop")
    args = parser.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch must be >= 1, got {args.batch}")
    for name in ("warmup", "repeat"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            parser.error(f"--{name} must be >= {0 if name == 'warmup' else 1}, got {value}")
    if args.time_limit < 0:
        parser.error(f"--time-limit must be >= 0, got {args.time_limit}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be > 0, got {args.budget}")
    if args.max_spread is not None and not args.max_spread >= 1:
        parser.error(f"--max-spread must be >= 1, got {args.max_spread}")
    from .layers import NETS
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    unknown = [n for n in nets if n not in NETS]
    if unknown or not nets:
        parser.error(f"--nets: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(NETS)}")
    args.nets = nets
    directions = [d.strip() for d in args.directions.split(",") if d.strip()]
    bad = [d for d in directions if d not in ("fwd", "bwd-data", "bwd-filter")]
    if bad or not directions:
        parser.error(f"--directions: unknown {', '.join(bad) or '(none given)'}; known: "
                     f"fwd, bwd-data, bwd-filter")
    args.directions = directions
    args.suites = list(dict.fromkeys(args.suite or SUITES))
    return args


def measurement_for(args):
    from .harness import Measurement
    # The library's work and PyTorch's are both timed by this (Measurement.collect).
    if args.quick:
        m = Measurement(warmup=1, repeat=7, min_repeat=3, budget_s=0.25)
    else:
        m = Measurement(warmup=3, repeat=20, min_repeat=3, budget_s=0.2)
    if args.warmup is not None:
        m.warmup = args.warmup
    if args.repeat is not None:
        m.repeat = args.repeat
        m.min_repeat = min(m.min_repeat, args.repeat)
    if args.budget is not None:
        m.budget_s = args.budget
    if args.max_spread is not None:
        m.max_spread = args.max_spread
    return m


def suite_cases(bench, name):
    """The CaseSpecs of suite ``name``, or one skipped Row when the suite cannot run here."""
    from .harness import Row, Skip
    module = importlib.import_module(f".{name}", __name__)
    try:
        return module.cases(bench), None
    except Skip as e:
        row = Row(name, "(suite)")
        row.status = f"skipped: {e}"
        return [], row


def measure_peaks(bench):
    """Fill ``bench.peaks`` from a short peak probe (when the peak suite is not selected)."""
    from . import peak
    from .harness import CaseSpec, Measurement, measure
    saved, saved_torch = bench.measurement, bench.torch
    bench.measurement, bench.torch = Measurement(warmup=1, repeat=5, min_repeat=3, budget_s=0.2), None
    try:
        for spec in (CaseSpec("peak", "fp32", lambda: peak.fma_case(bench)),
                     CaseSpec("peak", "copy", lambda: peak.copy_case(bench))):
            row = measure(bench, spec)
            if row.ok and row.rate:
                bench.peaks[row.params["peak_of"]] = row.rate
    finally:
        bench.measurement, bench.torch = saved, saved_torch


def _release_memory(ctx):
    """Hand the blocks a finished case freed back to the driver: the memory pool keeps them
    otherwise, and a full run's many sizes would add up on the device."""
    ctx.empty_cache()


def run(args, out=None):
    """Run the selected suites; returns (bench, rows, record)."""
    from ..context import Context
    from . import record, torch_baseline
    from .harness import Bench, Row, measure
    from .progress import Progress
    from .report import format_table, format_totals, network_totals, summary

    out = sys.stdout if out is None else out
    started = time.perf_counter()
    ctx = Context(args.device)
    baseline, reference, torch_note = torch_baseline.make(ctx, use_baseline=not args.no_torch)
    bench = Bench(ctx, quick=args.quick, batch=args.batch, measurement=measurement_for(args),
                  torch=baseline)
    bench.reference = reference
    bench.nets = args.nets
    bench.directions = args.directions
    bench.all_algorithms = args.all_algorithms
    info = ctx.info
    print(f"dlprim_py bench on {info.name} ({info.platform_name}, driver {info.driver_version}); "
          f"baseline: {('torch ' + baseline.device) if baseline else 'none'}"
          f"{' (' + torch_note + ')' if torch_note else ''}", file=out, flush=True)

    specs, rows = [], []
    # conv runs last: it has the most cases, so a time limit cuts into its tail only.
    for name in sorted(args.suites, key=lambda n: n == "conv"):
        found, skipped = suite_cases(bench, name)
        specs += found
        if skipped is not None:
            rows.append(skipped)
    if args.list:
        for row in rows:
            print(f"{row.suite}: {row.status}", file=out)
        for spec in specs:
            print(f"{spec.suite}: {spec.name}", file=out)
        return bench, [], None
    if "peak" not in args.suites:
        measure_peaks(bench)
    progress = Progress(len(specs), enabled=not args.no_progress)
    for spec in specs:
        progress.step(f"{spec.suite}: {spec.name}")
        if args.time_limit and time.perf_counter() - started > args.time_limit:
            row = Row(spec.suite, spec.name, spec.group)
            row.status = f"skipped: time limit of {args.time_limit:g} s reached (--time-limit)"
            rows.append(row)
            continue
        row = measure(bench, spec)
        peak_of = row.params.get("peak_of") if row.ok else None
        if peak_of and row.rate:
            bench.peaks[peak_of] = row.rate
            row.peak_percent = 100.0
        rows.append(row)
        _release_memory(ctx)
    progress.close()

    for name in args.suites:
        suite_rows = [r for r in rows if r.suite == name]
        if suite_rows:
            print("", file=out)
            print(format_table(suite_rows, title=f"== {name}"), file=out)
    totals = network_totals(rows)
    if totals:
        print("", file=out)
        print(format_totals(totals), file=out)
    print("", file=out)
    print(summary(rows, bench.measurement.max_spread), file=out)
    elapsed = time.perf_counter() - started
    options = {"suites": args.suites, "quick": args.quick, "batch": args.batch,
               "nets": args.nets, "directions": args.directions,
               "all_algorithms": args.all_algorithms,
               "warmup": bench.measurement.warmup, "repeat": bench.measurement.repeat,
               "budget_s": bench.measurement.budget_s,
               "max_spread": bench.measurement.max_spread, "time_limit_s": args.time_limit}
    torch_info = baseline.describe() if baseline else {"note": torch_note or "not timed"}
    rec = record.build_record(bench, rows, options, torch_info, elapsed,
                              commit=getattr(args, "commit", None))
    rec["conv_totals"] = totals
    print(f"elapsed {elapsed:.1f} s", file=out)
    return bench, rows, rec


def main(argv=None):
    from . import record
    from .plot import missing_matplotlib, plot_ratios
    args = parse_args(argv)
    if args.plot:
        reason = missing_matplotlib()
        if reason is not None:
            print(f"dlprim-bench: {reason}", file=sys.stderr)
            return 2
    _, rows, rec = run(args)
    if rec is None:
        return 0
    if args.json:
        record.write_json(args.json, rec)
        print(f"wrote {args.json}")
    if args.plot:
        reason = plot_ratios(rows, args.plot, title=f"dlprim_py vs PyTorch on {rec['device']['name']}")
        print(f"wrote {args.plot}" if reason is None else f"no plot: {reason}",
              file=sys.stdout if reason is None else sys.stderr)
    failed = [r for r in rows if r.status.startswith("failed")]
    return 1 if failed or (args.plot and reason is not None) else 0
