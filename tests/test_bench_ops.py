"""The memory-bound benchmark suite runs, checks its results and reports both sides (quick)."""
import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "ops.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ops", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_suites_check_and_time_both_sides(ctx, bench):
    rows, baseline = bench.run(ctx, ["copy", "reductions"], quick=True, log=lambda line: None)
    # PyTorch runs where the OpenCL device is: CUDA beside NVIDIA's driver, else the CPU.
    import torch
    expected = "cuda" if ctx.info.vendor == "nvidia" and torch.cuda.is_available() else "cpu"
    assert baseline.device == expected
    assert {r["suite"] for r in rows} == {"copy", "reductions"}
    for r in rows:
        assert r["ok"], r
        assert r["error"] <= bench.TOLERANCE
        assert r["bytes"] > 0 and math.isfinite(r["ours_ms"]) and r["ours_ms"] > 0
        assert math.isfinite(r["torch_ms"]) and r["torch_ms"] > 0
        assert "copy_percent" in r


def test_wrong_results_are_not_timed(ctx, bench):
    baseline = bench.Baseline(ctx, quick=True)
    r = bench.row(ctx, baseline, "broken", (1,), 4, lambda: None, lambda: None, lambda: 1.0, True)
    assert not r["ok"] and math.isnan(r["ours_ms"])
