"""dlprim-bench: argument parsing, the harness (verify before timing, skips and failures), the
report and JSON record, the layer sets, the peak probe on tiny sizes and one real case of every
suite."""
import io
import json
import math

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import bench
from dlprim_py.bench import conv as conv_suite
from dlprim_py.bench import fusion as fusion_suite
from dlprim_py.bench import gemm as gemm_suite
from dlprim_py.bench import ops as ops_suite
from dlprim_py.bench import peak, record, report
from dlprim_py.bench.harness import (Bench, Case, CaseSpec, Measurement, Row, Skip, error_metric,
                                     measure)
from dlprim_py.bench.layers import NETS, layers_of
from dlprim_py.bench.progress import Progress
from dlprim_py.bench.torch_baseline import Reference, TorchBaseline, make


@pytest.fixture
def small_bench(ctx):
    """A quick Bench with the torch baseline on the CPU and few repeats."""
    baseline, reference, _ = make(ctx)
    b = Bench(ctx, quick=True, batch=1, torch=baseline,
              measurement=Measurement(warmup=1, repeat=3, min_repeat=2, budget_s=0.05))
    b.reference = reference
    return b


# ---- arguments ------------------------------------------------------------------------------

def test_parse_args_defaults_run_every_suite():
    args = bench.parse_args([])
    assert args.suites == list(bench.SUITES)
    assert args.nets == ["resnet50", "vgg16", "mobilenet_v2"]
    assert args.directions == ["fwd", "bwd-data", "bwd-filter"]
    assert not args.quick and args.json is None and args.batch is None


def test_parse_args_selects_suites_batch_and_nets():
    args = bench.parse_args(["--suite", "gemm", "--suite", "conv", "--suite", "gemm", "--quick",
                             "--batch", "8", "--nets", "vgg16", "--directions", "fwd",
                             "--json", "out.json", "--repeat", "4", "--budget", "0.5"])
    assert args.suites == ["gemm", "conv"]
    assert args.quick and args.batch == 8 and args.nets == ["vgg16"]
    assert args.directions == ["fwd"] and args.json == "out.json"
    m = bench.measurement_for(args)
    assert (m.repeat, m.budget_s) == (4, 0.5)


@pytest.mark.parametrize("argv", [["--suite", "nope"], ["--batch", "0"], ["--nets", "alexnet"],
                                  ["--directions", "sideways"], ["--repeat", "0"],
                                  ["--budget", "-1"]])
def test_parse_args_rejects_bad_values(argv, capsys):
    with pytest.raises(SystemExit) as info:
        bench.parse_args(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


# ---- harness --------------------------------------------------------------------------------

def test_error_metric_matches_miopen_definition():
    ref = np.array([1.0, -2.0, 4.0])
    out = ref + np.array([0.0, 0.0, 0.4])
    assert error_metric(ref, ref) == 0.0
    assert error_metric(out, ref) == pytest.approx(0.4 / (math.sqrt(3) * 4.0))
    assert error_metric(np.array([1.0, np.nan, 4.0]), ref) == math.inf
    with pytest.raises(dp.DlprimError):
        error_metric(ref[:2], ref)


def test_measurement_bounds_repeats():
    m = Measurement(warmup=2, repeat=20, min_repeat=3, budget_s=1.0)
    assert m.repeats_for(10.0) == 3
    assert m.repeats_for(0.25) == 4
    assert m.repeats_for(1e-6) == 20
    assert m.repeats_for(0.0) == 20


class _Clock:
    """A stand-in for the time module in the harness: seconds advance only when told."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def time(self):
        return self.now


def _timer(values, clock=None, step=0.0):
    """A fake once(): returns ``values`` in turn (the last one again when they run out),
    advancing ``clock`` by ``step`` a run; counts the calls."""
    values = list(values)

    def once():
        once.calls += 1
        if clock is not None:
            clock.now += step
        return values[min(once.calls - 1, len(values) - 1)]
    once.calls = 0
    return once


def test_measurement_collect_warms_up_then_takes_more_runs_while_they_spread(monkeypatch):
    from dlprim_py.bench import harness
    monkeypatch.setattr(harness, "time", _Clock())
    m = Measurement(warmup=2, repeat=5, min_repeat=3, budget_s=10.0, max_spread=1.25)
    # Two warm-up runs, slow (the first call of a shape), left out; five steady runs.
    once = _timer([0.1, 0.05] + [1e-3] * 5)
    timing = m.collect(once)
    assert once.calls == 7 and len(timing.samples) == 5 and timing.median == 1e-3
    assert m.ranks(timing)
    # Runs alternating between 1 and 3 ms: p80/p20 of 3, so more runs, up to twice the repeats.
    noisy = _timer([1e-3, 1e-3] + [1e-3, 3e-3] * 20)
    timing = m.collect(noisy)
    assert len(timing.samples) == 10 and noisy.calls == 12
    assert timing.spread > 1.25 and not m.ranks(timing)
    # ... and for at most budget_s more seconds.
    clock = _Clock()
    monkeypatch.setattr(harness, "time", clock)
    slow = _timer([1e-3, 1e-3] + [1e-3, 3e-3] * 20, clock, step=4.0)
    m.budget_s = 10.0
    timing = m.collect(slow)
    assert len(timing.samples) == 5 + 3
    # warmup 0: the first run is the first sample.
    m0 = Measurement(warmup=0, repeat=3, min_repeat=3, budget_s=1.0)
    assert list(m0.collect(_timer([1.1e-3, 1e-3, 1e-3])).samples) == [1.1e-3, 1e-3, 1e-3]


def test_measurement_exact_runs_what_it_is_told_unless_capped(monkeypatch):
    from dlprim_py.bench import harness
    clock = _Clock()
    monkeypatch.setattr(harness, "time", clock)
    # The driver's -i 4 after 3 warm-up runs: exactly that many, however slow or noisy.
    m = Measurement(warmup=3, repeat=4, exact=True, budget_s=math.inf)
    once = _timer([100.0, 1.0] + [1.0, 9.0] * 10, clock, step=30.0)
    timing = m.collect(once)
    assert once.calls == 7 and len(timing.samples) == 4 and timing.capped is None
    # A cap of 50 s of timed runs: a run starts only while less than that has passed.
    m.max_time = 50.0
    once = _timer([1.0] * 10, clock, step=30.0)
    timing = m.collect(once)
    assert len(timing.samples) == 2 and timing.capped == 50.0


def _quiet_case(bench):
    def prepare():
        return Case(lambda: None, lambda: 0.0, 1e6, "GFLOP/s", torch_run=lambda: None)
    return CaseSpec("t", "case", prepare)


@pytest.mark.parametrize("torch_times, rankable", [([2e-3] * 40, True),
                                                   ([1e-3, 4e-3] * 20, False)])
def test_the_torch_time_is_sampled_as_ours_and_a_wide_spread_does_not_rank(
        ctx, monkeypatch, torch_times, rankable):
    """Both sides go through Measurement.collect (fake timers here, not the wall clock): ours
    steady at 1 ms; PyTorch's steady at 2 ms ranks as 2.00x, PyTorch's alternating between 1
    and 4 ms does not, and the summary says so instead of a speed-up."""
    torch = pytest.importorskip("torch")
    from dlprim_py.bench import harness
    from dlprim_py.timing import Timing
    monkeypatch.setattr(harness, "time_enqueued",
                        lambda ctx, run, **kwargs: Timing([1e-3]))
    baseline = TorchBaseline(torch, "cpu")
    once = _timer(torch_times)
    monkeypatch.setattr(baseline, "_once", lambda run, wall_clock=False: once())
    m = Measurement(warmup=2, repeat=6, min_repeat=3, budget_s=10.0, max_spread=1.25)
    b = Bench(ctx, measurement=m, torch=baseline)
    row = measure(b, _quiet_case(b))
    assert row.ok, row.status
    assert row.median_ms == pytest.approx(1.0) and row.samples == 6
    assert row.rankable is rankable
    text = report.summary([row], m.max_spread)
    table = report.format_table([row])
    if rankable:
        assert row.torch_samples == 6 and row.speedup_vs_torch == pytest.approx(2.0)
        assert text.endswith("geometric mean speed vs torch 2.00x over 1 cases")
        assert " 2.00 " in table
    else:
        # The same two warm-up runs, then more runs while they spread: twice the repeats.
        assert row.torch_samples == 12 and once.calls == 2 + 12
        assert "geometric mean" not in text and "not rankable" in text and "1.25" in text
        assert f"({row.speedup_vs_torch:.2f})" in table


def test_summary_ranks_only_the_tight_ratios():
    rows = _rows()
    loose = Row("gemm", "1024 NN")
    loose.median_ms, loose.torch_median_ms = 1.0, 8.0
    loose.speedup_vs_torch, loose.rankable = 8.0, False
    rows[0].rankable = True
    text = report.summary(rows + [loose])
    assert "geometric mean speed vs torch 2.00x over 1 cases" in text
    assert "1 more cases not rankable" in text


def _failing_spec(error):
    def prepare():
        def verify():
            return error
        return Case(lambda: pytest.fail("a case that fails verification must not be timed"),
                    verify, 1.0, "GFLOP/s")
    return CaseSpec("t", "bad", prepare)


def test_measure_refuses_to_time_a_wrong_result(small_bench):
    row = measure(small_bench, _failing_spec(1e-2))
    assert row.status.startswith("failed: error") and row.median_ms is None
    row = measure(small_bench, _failing_spec(math.nan))
    assert row.status.startswith("failed") and row.median_ms is None


def test_measure_reports_skips_and_errors(small_bench):
    def skipping():
        raise Skip("operator not there")

    def crashing():
        raise dp.ShapeError("bad shape")

    assert measure(small_bench, CaseSpec("t", "a", skipping)).status == "skipped: operator not there"
    row = measure(small_bench, CaseSpec("t", "b", crashing))
    assert row.status == "failed: ShapeError: bad shape"


def test_measure_times_a_verified_case_and_compares_with_torch(small_bench):
    row = measure(small_bench, CaseSpec("peak", "copy", lambda: peak.copy_case(small_bench, 4096)))
    assert row.ok, row.status
    assert row.error == 0.0 and row.median_ms > 0 and row.p20_ms <= row.median_ms <= row.p80_ms
    assert row.rate == pytest.approx(2 * 4096 * 4 / (row.median_ms * 1e-3) / 1e9)
    assert row.torch_median_ms > 0
    assert row.speedup_vs_torch == pytest.approx(row.torch_median_ms / row.median_ms)


def test_bench_random_is_seeded_and_never_constant(ctx):
    a = Bench(ctx, seed=3).random((5, 7))
    b = Bench(ctx, seed=3).random((5, 7))
    assert np.array_equal(a, b) and a.dtype == np.float32 and np.unique(a).size == a.size
    big = Bench(ctx).random((1_000_003 * 2 + 5,))
    assert big.shape == (2_000_011,) and np.isfinite(big).all() and big.std() > 0.5


# ---- progress, report, record, plot -----------------------------------------------------------

def test_progress_writes_one_line_per_step():
    stream = io.StringIO()
    progress = Progress(3, stream=stream)
    for label in ("a", "b", "c"):
        progress.step(label)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("[") and "0/3" in lines[0] and lines[0].endswith(" a")
    assert "3/3" in lines[-1] and lines[-1].endswith("done")


def _rows():
    ok = Row("gemm", "256 NN")
    ok.algorithm, ok.median_ms, ok.p20_ms, ok.p80_ms = "tiled", 2.0, 1.5, 2.5
    ok.unit, ok.rate, ok.peak_percent, ok.error = "GFLOP/s", 16.8, 42.0, 1e-7
    ok.torch_median_ms, ok.speedup_vs_torch = 4.0, 2.0
    bad = Row("gemm", "512 NN")
    bad.status = "failed: error 0.1 > 1e-05"
    skipped = Row("ops", "softmax")
    skipped.status = "skipped: not there"
    return [ok, bad, skipped]


def test_report_table_and_summary():
    rows = _rows()
    text = report.format_table(rows, title="== gemm")
    lines = text.splitlines()
    assert lines[0] == "== gemm" and lines[1].startswith("case")
    assert "16.8 GFLOP/s" in text and "42.0" in text and "2.00" in text
    assert "failed: error 0.1 > 1e-05" in text and "skipped: not there" in text
    assert report.summary(rows) == ("1 measured, 1 failed, 1 skipped; geometric mean speed vs "
                                    "torch 2.00x over 1 cases")


def test_record_holds_device_version_commit_and_rows(ctx, tmp_path):
    b = Bench(ctx)
    b.peaks["GFLOP/s"] = 100.0
    rec = record.build_record(b, _rows(), {"quick": True}, {"version": "x"}, 1.5)
    path = tmp_path / "sub" / "out.json"
    record.write_json(path, rec)
    loaded = json.loads(path.read_text())
    assert loaded["library"]["version"] == dp.__version__ and "commit" in loaded["library"]
    assert loaded["device"]["name"] == ctx.info.name
    assert loaded["device"]["driver_version"] == ctx.info.driver_version
    assert loaded["peaks"] == {"GFLOP/s": 100.0}
    assert [r["name"] for r in loaded["rows"]] == ["256 NN", "512 NN", "softmax"]
    assert loaded["rows"][0]["speedup_vs_torch"] == 2.0
    named = record.build_record(b, [], {}, {}, 0.0, commit="0123abc")
    assert named["library"]["commit"] == "0123abc"
    found, _ = record.source_commit()
    assert found is None or len(found) == 40


def test_plot_needs_a_torch_ratio(tmp_path):
    from dlprim_py.bench.plot import plot_ratios
    assert plot_ratios(_rows()[1:], tmp_path / "p.png") == "no case has a PyTorch time to compare with"
    reason = plot_ratios(_rows(), tmp_path / "p.png")
    assert reason is None and (tmp_path / "p.png").stat().st_size > 0 or "matplotlib" in reason


# ---- layer sets -------------------------------------------------------------------------------

def test_layer_sets_match_the_networks():
    # Distinct layers, and all convolutions of each network counted with their repeats.
    expected = {"resnet50": (23, 53, 4.09e9), "vgg16": (9, 13, 15.35e9),
                "mobilenet_v2": (30, 52, 0.30e9)}
    for net, (distinct, total, macs) in expected.items():
        layers = layers_of(net)
        assert len(layers) == distinct and sum(l.count for l in layers) == total
        assert sum(l.flops(1) * l.count for l in layers) / 2 == pytest.approx(macs, rel=0.01)
        quick = layers_of(net, quick=True)
        assert quick and all(q.key in {l.key for l in layers} for q in quick)
    first = layers_of("resnet50")[0]
    assert (first.input_shape(64), first.weight_shape(), first.output_shape(64)) == (
        (64, 3, 224, 224), (64, 3, 7, 7), (64, 64, 112, 112))
    depthwise = [l for l in layers_of("mobilenet_v2") if l.groups > 1]
    assert depthwise and all(l.groups == l.in_channels == l.out_channels for l in depthwise)
    assert set(NETS) == {"resnet50", "vgg16", "mobilenet_v2"}


def test_suites_list_their_cases_without_building(ctx):
    b = Bench(ctx, quick=True)
    names = [s.name for s in conv_suite.cases(b)]
    assert "resnet50 2048->512 1x1 @7 n1 bwd-filter" in names
    assert "vgg16 512->512 3x3 @14 n1 fwd" in names
    assert not any(n.startswith("vgg16") and "bwd" in n for n in names)
    assert len(gemm_suite.cases(b)) == len(gemm_suite.shapes(b))
    assert [s.suite for s in ops_suite.cases(b)] == ["ops"] * len(ops_suite.specs(b))
    assert any(s.name.startswith("cbna") for s in fusion_suite.cases(b))


# ---- peak probe ------------------------------------------------------------------------------

def test_peak_fma_probe_verifies_and_catches_a_wrong_count(small_bench):
    probe = peak.FmaProbe(small_bench, 64)
    probe.set_trips(8)
    # The probe rounds its item count to whole work-groups of the device.
    assert probe.items >= 64 and probe.flops == probe.items * 8 * peak.FLOPS_PER_TRIP
    assert probe.verify() < 1e-4
    probe.trips = 9  # the kernel still runs 8 trips: the closed form must disagree
    assert probe.verify() > 1e-4


def test_peak_fma_reference_closed_form():
    start = np.array([0.25], dtype=np.float32)
    lanes = [k * 0.125 + lane * 0.03125 for k in range(peak.CHAINS) for lane in range(4)]
    m, c = float(peak.MULTIPLIER), float(peak.ADDEND)
    expected = 0.0
    for offset in lanes:
        a = 0.25 + offset
        for _ in range(5):
            a = a * m + c
        expected += a
    assert peak.fma_reference(start, 5)[0] == pytest.approx(expected, rel=1e-12)


def test_peak_cases_on_tiny_sizes(small_bench):
    for spec in (CaseSpec("peak", "fma", lambda: peak.fma_case(small_bench, 64, 1e-3)),
                 CaseSpec("peak", "copy", lambda: peak.copy_case(small_bench, 1000)),
                 CaseSpec("peak", "launch", lambda: peak.launch_case(small_bench, 5))):
        row = measure(small_bench, spec)
        assert row.ok, row.status
        assert row.median_ms > 0
    assert row.params["launches"] == 5 and row.params["host_enqueue_us"] > 0
    assert row.params["queued_to_start_us"] >= 0


@pytest.mark.parametrize("floats, passes, items", [(4000, 3, 64), (1001 * 4, 1, 128), (40, 2, 64)])
def test_read_probe_counts_what_every_item_read(small_bench, floats, passes, items):
    """The read probe's sums are the exact counts of floats each item read: shares of unequal
    length (n4 not a multiple of the items, or fewer float4s than items) and several passes;
    a pass the kernel did not make fails the check."""
    probe = peak.ReadProbe(small_bench, floats, passes, items)
    assert probe.bytes == 4.0 * floats * passes
    assert probe.verify() == 0.0
    probe.passes += 1   # the kernel still makes the old count of passes
    assert probe.verify() == math.inf


def test_torch_baseline_sets_tf32_as_asked():
    """The CUDA baseline sets torch's TF32 switches as asked, both of them (a TF32 comparison
    whose baseline silently computed in FP32 once overstated the library's convolutions)."""
    torch = pytest.importorskip("torch")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for tf32 in (True, False):
            baseline = TorchBaseline(torch, "cuda", tf32=tf32)
            assert torch.backends.cuda.matmul.allow_tf32 is tf32
            assert torch.backends.cudnn.allow_tf32 is tf32
            assert baseline.tf32 is tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert TorchBaseline(torch, "cpu").tf32 is False


def test_launch_probe_counts_every_launch(small_bench):
    probe = peak.LaunchProbe(small_bench, 7)
    assert probe.verify() == 0.0
    assert int(probe.counter.numpy()[0]) == 7


# ---- one real case per suite -------------------------------------------------------------------

def _check_row(small_bench, spec):
    row = measure(small_bench, spec)
    assert row.ok, f"{spec.name}: {row.status}"
    assert row.error <= row.tolerance and row.median_ms > 0 and row.algorithm
    assert row.torch_median_ms is not None
    return row


def test_gemm_case_runs_for_real(small_bench):
    shape = gemm_suite.GemmShape(24, 40, 16, trans_b=True, alpha=0.5, beta=2.0)
    row = _check_row(small_bench, CaseSpec("gemm", shape.name,
                                           lambda: gemm_suite.gemm_case(small_bench, shape)))
    assert row.work == 2 * 24 * 40 * 16


def test_conv_cases_run_for_real(small_bench):
    shape = conv_suite.ConvShape(2, 4, 7, 7, 6, 3, 3, (1, 1), (2, 2))
    for direction in conv_suite.DIRECTIONS:
        _check_row(small_bench, CaseSpec("conv", direction, lambda d=direction: conv_suite.conv_case(
            small_bench, shape, d)))


def test_conv_case_forces_algorithms_by_name_and_index(small_bench):
    shape = conv_suite.ConvShape(1, 3, 6, 6, 4, 3, 3, (1, 1))
    case = conv_suite.conv_case(small_bench, shape, "fwd", algo="direct")
    assert case.algorithm == "direct" and case.verify() < 1e-5
    with pytest.raises(dp.UnsupportedError, match="out of range"):
        conv_suite.conv_case(small_bench, shape, "fwd", algo=99)
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        conv_suite.conv_case(small_bench, shape, "fwd", algo="depthwise")


def test_ops_case_runs_for_real(small_bench):
    spec = ops_suite.OpSpec("softmax", "softmax", [(3, 50)], dict(dim=-1))
    row = _check_row(small_bench, CaseSpec("ops", spec.name, lambda: ops_suite.op_case(small_bench, spec)))
    assert row.unit == "GB/s" and row.work == 2 * 3 * 50 * 4
    missing = ops_suite.OpSpec("nope", "no_such_function", [(2, 2)])
    assert measure(small_bench, CaseSpec("ops", "nope", lambda: ops_suite.op_case(
        small_bench, missing))).status.startswith("skipped")


def test_fusion_case_runs_for_real(small_bench):
    shape = conv_suite.ConvShape(1, 4, 6, 6, 8, 3, 3, (1, 1))
    row = _check_row(small_bench, CaseSpec("fusion", "cbna", lambda: fusion_suite.plan_case(
        small_bench, shape, "cbna")))
    assert "batchnorm_inference" in row.params["chain"]


def test_reference_without_torch_skips():
    with pytest.raises(Skip, match="no reference"):
        Reference(None, None, "torch not importable").compute(lambda t, a: a, np.ones(2))


def test_torch_baseline_on_cpu_times_with_the_host_clock():
    torch = pytest.importorskip("torch")
    baseline = TorchBaseline(torch, "cpu")
    x = baseline.tensor(np.ones((4, 4), np.float32))
    timing = baseline.time(lambda: x @ x, Measurement(warmup=1, repeat=3, min_repeat=2, budget_s=0.1))
    assert len(timing.samples) >= 2 and timing.median > 0
    assert baseline.describe()["device"] == "cpu"


def test_main_writes_json(tmp_path, capsys):
    out = tmp_path / "peak.json"
    rc = bench.main(["--suite", "peak", "--quick", "--no-torch", "--no-progress", "--repeat", "2",
                     "--budget", "0.01", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "== peak" in text and "fp32 multiply-add" in text
    rec = json.loads(out.read_text())
    assert {r["name"] for r in rec["rows"]} == {"fp32 multiply-add", "copy bandwidth", "kernel launch"}
    assert all(r["status"] == "ok" for r in rec["rows"])
    assert rec["peaks"]["GFLOP/s"] > 0 and rec["peaks"]["GB/s"] > 0
    assert rec["options"]["quick"] is True


def test_a_suite_without_its_operator_says_skipped(ctx, monkeypatch):
    def missing():
        raise Skip("dlprim_py.ops.conv not importable (test)")
    monkeypatch.setattr(conv_suite, "conv_api", missing)
    specs, row = bench.suite_cases(Bench(ctx, quick=True), "conv")
    assert specs == [] and row.suite == "conv"
    assert row.status == "skipped: dlprim_py.ops.conv not importable (test)"


def test_peaks_are_measured_when_the_peak_suite_is_not_run(small_bench, monkeypatch):
    monkeypatch.setattr(peak, "sizes", lambda b: (64, 1e-3, 4096, 5))
    bench.measure_peaks(small_bench)
    assert small_bench.peaks["GFLOP/s"] > 0 and small_bench.peaks["GB/s"] > 0
    assert small_bench.torch is not None  # restored after the probe


def test_list_names_the_cases_without_running(capsys):
    assert bench.main(["--list", "--quick", "--suite", "conv", "--suite", "gemm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "conv: resnet50 2048->512 1x1 @7 n1 fwd" in lines
    assert sum(line.startswith("gemm: ") for line in lines) == len(gemm_suite.shapes(Bench(None, quick=True)))


def test_make_results_renders_bench_and_script_records(ctx, tmp_path):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "make_results.py"
    spec = importlib.util.spec_from_file_location("make_results", path)
    make_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_results)
    b = Bench(ctx)
    fma = Row("peak", "fp32 multiply-add")
    fma.median_ms, fma.p20_ms, fma.p80_ms, fma.rate, fma.unit = 1.0, 0.9, 1.1, 123.0, "GFLOP/s"
    rec = record.build_record(b, [fma] + _rows(), {"suites": ["peak", "gemm"], "quick": True},
                              {"version": "2.x", "device": "cpu"}, 2.0)
    record.write_json(tmp_path / "dlprim-bench-test.json", rec)
    (tmp_path / "gemm-other.json").write_text(json.dumps(
        {"benchmark": "gemm", "device": "X", "rows": [{"name": "square 64", "ours_ms": 1.5,
                                                        "baseline_ms": 3.0, "ratio": 2.0}]}))
    assert make_results.main(["--results", str(tmp_path)]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert f"| {ctx.info.name} | quick | 123 |" in text
    assert "| 256 NN | tiled | 2 | 1.5-2.5 | 16.8 GFLOP/s | 42.0 | 4 | 2.00 |" in text
    assert "| 512 NN | - | failed: error 0.1 > 1e-05 |" in text
    assert "| square 64 | 1.5 | 3 | 2 |" in text


def test_time_limit_reports_the_rest_as_skipped(tmp_path, capsys):
    out = tmp_path / "limited.json"
    assert bench.main(["--suite", "peak", "--quick", "--no-torch", "--no-progress",
                       "--time-limit", "1e-6", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3
    assert all(r["status"].startswith("skipped: time limit") and r["median_ms"] is None for r in rows)


def test_ops_verification_catches_an_output_never_written(small_bench, monkeypatch):
    from dlprim_py import functional
    monkeypatch.setattr(functional, "relu", lambda x: dp.Tensor.empty(x.ctx, x.shape))
    spec = ops_suite.OpSpec("relu", "relu", [(4, 300)])
    row = measure(small_bench, CaseSpec("ops", spec.name, lambda: ops_suite.op_case(small_bench, spec)))
    assert row.status == "failed: error inf > 1e-05" and row.median_ms is None


def test_network_totals_weight_layers_by_count():
    rows = []
    for name, count, ours, theirs in (("a", 3, 1.0, 2.0), ("b", 1, 4.0, 2.0)):
        r = Row("conv", f"resnet50 {name} fwd", group="resnet50")
        r.median_ms, r.torch_median_ms = ours, theirs
        r.params = {"direction": "fwd", "count_in_net": count}
        rows.append(r)
    bad = Row("conv", "vgg16 c fwd", group="vgg16")
    bad.status = "failed: error 1 > 1e-05"
    bad.params = {"direction": "fwd"}
    totals = report.network_totals(rows + [bad])
    assert totals == [{"net": "resnet50", "direction": "fwd", "layers": 2, "convolutions": 4,
                       "ms": 7.0, "torch_ms": 8.0, "speedup_vs_torch": 8.0 / 7.0,
                       "rankable": True}]
    assert "resnet50" in report.format_totals(totals)


def test_all_algorithms_lists_forced_cases_and_skips_those_that_do_not_apply(small_bench, capsys):
    assert bench.main(["--list", "--quick", "--suite", "conv", "--all-algorithms", "--nets",
                       "mobilenet_v2", "--directions", "fwd"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "conv: mobilenet_v2 576->96 1x1 @14 n1 fwd [depthwise]" in lines
    shape = conv_suite.ConvShape(1, 3, 5, 5, 4, 3, 3)
    row = measure(small_bench, CaseSpec("conv", "x", lambda: conv_suite._forced_case(
        small_bench, shape, "fwd", "depthwise")))
    assert row.status.startswith("skipped: algorithm 'depthwise' does not apply")


def test_plot_without_matplotlib_stops_before_measuring(monkeypatch, capsys, tmp_path):
    """dlprim-bench --plot checks for matplotlib first: without it, it names the plot extra and
    exits non-zero before running any suite."""
    import builtins
    import dlprim_py.bench as bench_cli
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setattr(bench_cli, "run", lambda args: pytest.fail("a suite ran"))
    assert bench_cli.main(["--quick", "--suite", "peak", "--plot", str(tmp_path / "p.png")]) == 2
    assert "dlprim_py[plot]" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()
