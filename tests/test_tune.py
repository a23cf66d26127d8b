"""dlprim-tune: the budget bounds the whole run (builds and checks included) and what does not
fit is skipped and named; progress is one plain line per candidate when stderr is not a
terminal; the help text. The winners' correctness checks are in test_gemm.py."""
import io
import json
import time

import pytest

from dlprim_py import program, tune, tuning

# Cheap builds: the one-item-per-element kernel in several shapes.
SMALLS = [{"solver": "small", "small_m": m, "small_n": n}
          for m, n in ((8, 16), (16, 16), (4, 8), (8, 8), (16, 8), (4, 16))]
# Every build takes at least this long (the time a real kernel build takes on a CPU device is
# seconds; the test makes it long enough to matter whatever the program cache holds).
BUILD_S = 0.4


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def slow_builds(monkeypatch):
    """Candidates: SMALLS; every plan built (on the verify problem or a real size) costs at
    least BUILD_S seconds more; a compile is guessed at 1 s before one was measured (these
    kernels compile in about that on PoCL, whatever the state of the caches)."""
    monkeypatch.setattr(tune, "gemm_candidates", lambda info, space="quick": [dict(p) for p in SMALLS])
    monkeypatch.setattr(tune, "BUILD_GUESS", {"built": 0.0, "disk": BUILD_S, "compile": (1.0, 1.0)})
    real_plan = tune._Problem.plan

    def plan(self, params):
        if not getattr(program._probing, "on", False):   # a build, not the tuner's probe
            time.sleep(BUILD_S)
        return real_plan(self, params)

    monkeypatch.setattr(tune._Problem, "plan", plan)


def test_budget_bounds_the_whole_run_and_names_what_it_skips(ctx, slow_builds, tmp_path, capsys):
    """Three tiny sizes and a large one on a 6-second budget: the run ends within the budget
    and a generous tolerance (one step beyond its estimate), the large size is skipped without
    being run, candidates that did not fit are named in the output and the report, and the log
    (stderr is no terminal here) has lines, no carriage returns."""
    budget = 6.0
    out, report_path = tmp_path / "gemm.json", tmp_path / "report.json"
    started = time.perf_counter()
    rc = tune.main(["gemm", "--sizes", "9x7x5,16x12x8,2048,23x19x11", "--budget", str(budget),
                    "--output", str(out), "--report", str(report_path)])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert rc == 0, err
    assert elapsed <= budget + 5.0, err
    assert "\r" not in err
    report = json.loads(report_path.read_text())
    summary = report["budget"]
    assert summary["budget_s"] == budget and summary["used_s"] <= budget + 5.0
    assert "2048x2048x2048" in summary["sizes_skipped_for_budget"]
    assert "gemm 2048x2048x2048: skipped" in err
    skipped = [e for e in report["candidates"] if "skipped" in e]
    assert skipped and summary["skipped_candidates"] == len(skipped)
    assert any(e["shape"] != [2048] * 3 for e in skipped), "only the large size was skipped"
    # Each skipped candidate has its line, naming the size and the candidate, or its size one
    # line that says the whole size was skipped.
    lines = err.splitlines()
    for entry in skipped:
        size = "x".join(map(str, entry["shape"]))
        assert (f"gemm {size}: skipped, {entry['skipped']}; no rule" in lines
                or any(line.startswith(f"gemm {size} [") and tune.describe(entry["params"]) in line
                       and f"skipped, {entry['skipped']}" in line for line in lines)), entry
    # The sizes that got a rule: the rule is one that was timed on that size.
    rules = tuning.read_db(out, "gemm")["devices"][ctx.info.name]["rules"]
    timed = {(tuple(e["shape"]), json.dumps(e["params"], sort_keys=True))
             for e in report["candidates"] if "ms" in e}
    assert rules
    for rule in rules:
        shape = (rule["shape"]["m"], rule["shape"]["n"], rule["shape"]["k"])
        assert (shape, json.dumps(rule["params"], sort_keys=True)) in timed
    assert lines[-1].startswith(f"budget {budget:g} s: used ")
    assert ("over by" in lines[-1]) == (summary["used_s"] > budget)


def test_a_spent_budget_skips_every_size_and_says_so(ctx, monkeypatch):
    """Started past its budget, the tuner runs nothing: every candidate of every size is
    reported as skipped, and there is no rule."""
    monkeypatch.setattr(tune, "gemm_candidates",
                        lambda info, space="quick": [dict(p) for p in SMALLS[:2]])
    log, stream = [], io.StringIO()
    rules, report = tune.tune_gemm(ctx, [(9, 7, 5), (16, 12, 8)], budget=1.0, log=log.append,
                                   progress=tune.Progress(stream),
                                   started=time.perf_counter() - 2.0)
    assert rules == []
    assert len(report) == 4 and all("skipped" in e for e in report)
    assert [line.split(":")[0] for line in log if "no rule" in line] == \
        ["gemm 9x7x5", "gemm 16x12x8"]
    summary, line = tune.budget_summary(1.0, 2.5, [(9, 7, 5), (16, 12, 8)], rules, report)
    assert summary["over_by_s"] == 1.5 and "over by 1.5 s" in line
    assert summary["sizes_skipped_for_budget"] == ["9x7x5", "16x12x8"]


def test_progress_lines_on_a_log_and_in_place_on_a_terminal():
    log = io.StringIO()
    progress = tune.Progress(log)
    progress.candidate("gemm 64x64x64 [1/2] small 8x16: 1 ms")
    progress.candidate("gemm 64x64x64 [2/2] small 16x16: skipped")
    progress.line("gemm 64x64x64: 1 GFLOP/s")
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == ["gemm 64x64x64 [1/2] small 8x16: 1 ms",
                                           "gemm 64x64x64 [2/2] small 16x16: skipped",
                                           "gemm 64x64x64: 1 GFLOP/s"]
    terminal = Terminal()
    progress = tune.Progress(terminal)
    progress.candidate("gemm 64x64x64 [1/2] small 8x16: 1 ms")
    progress.line("gemm 64x64x64: 1 GFLOP/s")
    text = terminal.getvalue()
    assert text.startswith("\r") and text.count("\n") == 1 and text.endswith("1 GFLOP/s\n")


def test_describe_names_the_parameters_that_differ():
    tiled = tune._tiled(64, 32, 16, 8, 4, 4, 4, 1, split=3, gvec=4, max_registers=128)
    assert tune.describe(tiled) == "splitk 64x32x16 wpt 8x4 vec 4 pad 4 db 1 gvec 4 split 3 regs 128"
    assert tune.describe({"solver": "small", "small_m": 8, "small_n": 16}) == "small 8x16"
    assert tune.describe({"solver": "subgroup", "sg_size": 16, "wpt_m": 4, "wpt_n": 2,
                          "sg_groups": 1}) == "subgroup sg 16 wpt 4x2 groups 1"


def test_a_long_run_is_timed_in_single_runs_without_probing(ctx, monkeypatch):
    """A run whose check took LONG_RUN or more: LONG_SAMPLES single runs by the host's clock,
    no warm-up beyond the check, no batches."""
    from dlprim_py.timing import Timing
    calls = []

    def fake(ctx, run, warmup=3, repeat=20, wall_clock=False, max_time=60.0, **kwargs):
        calls.append((warmup, repeat, wall_clock, max_time))
        return Timing([0.5, 0.52, 0.51][:repeat])

    monkeypatch.setattr(tune, "time_enqueued", fake)
    seconds, batch, timer = tune.time_per_run(ctx, lambda: None, first_run=0.6)
    assert (seconds, batch, timer) == (0.51, 1, "wall clock")
    assert calls == [(0, tune.LONG_SAMPLES, True, None)]
    assert tune.timing_cost(0.6) == pytest.approx(tune.LONG_SAMPLES * 0.6)


def test_help_shows_defaults_in_plain_words(capsys):
    with pytest.raises(SystemExit) as info:
        tune.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text and "see above" not in text
    assert "(default: 300.0)" in text and "(default: quick)" in text
    assert "(default: 64, 256," in text
    assert "(default: None)" not in text and "(default: False)" not in text
    merge = text[text.index("--merge"):]
    assert "keep" in merge and "replace only" in merge
    assert "budget bounds the whole run" in text


def test_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit) as info:
        tune.main(["gemm", "--budget", "0"])
    assert info.value.code == 2 and "--budget must be > 0" in capsys.readouterr().err


def test_the_cost_of_a_build_is_known_before_it_starts(ctx, monkeypatch, tmp_path):
    """A candidate's build is to compile (nothing in the disk cache), then built (the context
    holds it), then for a new context a load from the disk cache; probing builds nothing."""
    import numpy as np
    import dlprim_py as dp
    from dlprim_py import program
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    dp.config.reload()
    # A kernel shape no other test builds, so that the context does not hold it yet.
    params = {"solver": "small", "small_m": 2, "small_n": 32}
    costs = tune._Costs(ctx.info.is_gpu)
    verifier = tune._Verifier(ctx, np.random.default_rng(0), costs)
    builds = program.stats["builds"]
    assert verifier.kind(params, False) == "compile"
    assert program.stats["builds"] == builds
    assert verifier.check(params, False) <= tune.TOLERANCE
    assert verifier.kind(params, False) is None            # built and checked
    assert "compile" in costs.build and costs.verify_rate
    assert tune._Verifier(ctx, np.random.default_rng(0), costs).kind(params, False) == "built"
    other = dp.Context(ctx.info.name)
    assert tune._Verifier(other, np.random.default_rng(0), costs).kind(params, False) == "disk"
    verifier.release()
