"""Shared fixtures and checks: one context for the session, seeded data, the error metric."""
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

# On a CPU device (PoCL in CI) the suite builds several hundred programs from source for small
# problems: without LLVM's optimizations they compile about four times faster (a cold suite in
# well under half the time) and still run its problems quickly. The library reads the variable
# with its call switches (the autouse fixture below reloads them for every test); set to
# anything, empty included, it is left as it is. On a GPU the kernels build with the vendor
# compiler's optimizations.
if "DLPRIM_BUILD_OPTIONS" not in os.environ:
    import pyopencl as _cl
    from dlprim_py.context import find_device
    from dlprim_py.errors import DeviceError
    try:
        if find_device().type & _cl.device_type.CPU:
            os.environ["DLPRIM_BUILD_OPTIONS"] = "-cl-opt-disable"
    except DeviceError:     # no device: the tests that need one say so
        pass

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: F401,E402  (the tests' metric)

# float32 results land far below this for most operators (MIOpen's metric, see error_metric).
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2e-3}


@pytest.fixture(scope="session")
def ctx():
    """The device of DLPRIM_DEVICE, else the first GPU, else the first CPU (PoCL in CI)."""
    return dp.Context()


@pytest.fixture(autouse=True)
def call_switches():
    """Each test starts from the environment's call switches (DLPRIM_*_ALGO, DLPRIM_LOG_CMD,
    DLPRIM_FIND_MODE): a test that sets one calls dp.config.reload(), and monkeypatch restores
    the variable after the test, before the next one reads them here."""
    dp.config.reload()


@pytest.fixture
def tuning_rules(ctx, monkeypatch, tmp_path):
    """``tuning_rules(family, rules)`` puts ``rules`` ahead of the shipped ones for this device:
    as its entry in a user tuning database (``$DLPRIM_CACHE_DIR/tuning/<family>.json``) of a
    cache folder of this test's own, whose compiled programs are the usual folder's (so nothing
    is rebuilt), then ``dlprim_py.tuning.forget``. The databases are forgotten again after the
    test."""
    from dlprim_py import tuning
    programs = Path(dp.config.cache_dir()) / "programs"
    programs.mkdir(parents=True, exist_ok=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "programs").symlink_to(programs, target_is_directory=True)
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(cache))

    def write(family, rules):
        path = tuning.user_path(family)
        tuning.store_device_entry(path, family, ctx.info, list(rules))
        tuning.forget()
        return path

    yield write
    tuning.forget()


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: the same data on every run and device."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def random(rng, shape, low=-1.0, high=1.0, dtype=np.float32):
    """Uniform random data, never all zeros."""
    return rng.uniform(low, high, size=shape).astype(dtype)


def assert_repeats_build_nothing(ctx, run):
    """``run()`` once, then twice more: the repeats render, build and create nothing
    (``program.stats`` unchanged once the device has drained)."""
    from dlprim_py import program
    run()
    before = dict(program.stats)
    run()
    run()
    ctx.synchronize()
    assert dict(program.stats) == before


def assert_close(out, ref, tol=None, dtype=np.float32):
    """Fail on any NaN/Inf where the reference is finite, or an error metric above ``tol``."""
    out = np.asarray(out)
    ref = np.asarray(ref)
    finite = np.isfinite(ref)
    bad = finite & ~np.isfinite(out.astype(np.float64))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{bad.sum()} non-finite outputs where the reference is finite, "
                             f"first at {index}: {out[index]} vs {ref[index]}")
    if not finite.all():
        assert np.array_equal(np.isnan(out), np.isnan(ref)), "NaN positions differ"
        out, ref = np.where(finite, out, 0), np.where(finite, ref, 0)
    tol = TOLERANCE[np.dtype(dtype)] if tol is None else tol
    err = error_metric(out, ref)
    assert err <= tol, f"error metric {err:.3e} > {tol:.1e}"


def poisoned(ctx, shape, dtype=np.float32):
    """An output tensor filled with NaN, so that any element a kernel does not write fails."""
    t = dp.Tensor.empty(ctx, shape, dtype)
    t.fill_(np.nan if np.dtype(dtype).kind == "f" else -1)
    return t


def pytest_collection_modifyitems(config, items):
    """Tests marked on_intel run only in test_gemm_subgroup.py's subprocess, which registers
    Intel's OpenCL runtime and sets DLPRIM_TEST_INTEL_SUBGROUP; elsewhere they are deselected."""
    if os.environ.get("DLPRIM_TEST_INTEL_SUBGROUP"):
        return
    intel = [item for item in items if item.get_closest_marker("on_intel") is not None]
    if intel:
        config.hook.pytest_deselected(items=intel)
        items[:] = [item for item in items if item.get_closest_marker("on_intel") is None]
