"""Damage to the on-disk caches: program entries, the cache folder, the user tuning database."""
import json
import os
import re
import stat
import warnings

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import program, tuning

from conftest import assert_close, random

TIMES = dict(name="scale_copy", ndim=1, unroll=2, index_t="int", inputs=[("x", "float")],
             outputs=[("y", "float")], scalars=[("s", "float")], statement="y = s * x;",
             preamble="")
PLUS = dict(TIMES, statement="y = s + x;")
X = np.arange(8, dtype=np.float32)
EXPECTED = {"times": X * 3, "plus": X + 3}


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A fresh, empty cache folder for this test."""
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)
    return tmp_path / "cache"


def _build(ctx, params):
    # build_source goes to the disk cache on every call (the memory cache is build()'s).
    return program.build_source(ctx, program.render("pointwise", **params))


def _run(ctx, built):
    x = dp.Tensor.from_numpy(ctx, X)
    y = dp.Tensor.empty(ctx, (8,))
    built.kernel("scale_copy", fresh=True)(
        ctx.queue, (8,), None, np.int32(8), np.int32(8), x.buffer, np.int32(0), np.int32(1),
        y.buffer, np.int32(0), np.float32(3))
    return y.numpy()


def _entries(cache):
    return sorted((cache / "programs").glob("*.bin"))


def _cache_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, dp.CacheWarning)]


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_damaged_entry_is_rebuilt_once_with_a_warning(ctx, cache, damage):
    assert not _build(ctx, TIMES).from_cache
    (path,) = _entries(cache)

    def spoil():
        data = path.read_bytes()
        middle = len(data) // 2
        if damage == "truncated":
            path.write_bytes(data[:middle])
        else:
            path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x20]) + data[middle + 1:])

    spoil()
    reason = "header says" if damage == "truncated" else "checksum mismatch"
    with pytest.warns(dp.CacheWarning, match=reason) as record:
        built = _build(ctx, TIMES)
    assert not built.from_cache
    assert [str(path) in m for m in _cache_warnings(record)] == [True]
    np.testing.assert_array_equal(_run(ctx, built), EXPECTED["times"])
    # Rewritten: the next build loads it.
    assert _build(ctx, TIMES).from_cache
    # Damaged again in the same process: rebuilt, but said only once.
    spoil()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        built = _build(ctx, TIMES)
    assert not built.from_cache
    np.testing.assert_array_equal(_run(ctx, built), EXPECTED["times"])


def test_swapped_entries_are_rebuilt(ctx, cache):
    _build(ctx, TIMES)
    (times_path,) = _entries(cache)
    _build(ctx, PLUS)
    (plus_path,) = set(_entries(cache)) - {times_path}
    times_data, plus_data = times_path.read_bytes(), plus_path.read_bytes()
    times_path.write_bytes(plus_data)
    plus_path.write_bytes(times_data)
    with pytest.warns(dp.CacheWarning, match="key mismatch") as record:
        built = {"times": _build(ctx, TIMES), "plus": _build(ctx, PLUS)}
    messages = _cache_warnings(record)
    assert len(messages) == 2
    assert str(times_path) in messages[0] and str(plus_path) in messages[1]
    for name, b in built.items():
        assert not b.from_cache
        np.testing.assert_array_equal(_run(ctx, b), EXPECTED[name])
    assert times_path.read_bytes() == times_data and plus_path.read_bytes() == plus_data


def _check_unusable_folder(ctx, named):
    with pytest.warns(dp.CacheWarning, match=re.escape(str(named))) as record:
        built = _build(ctx, TIMES)
    assert len(_cache_warnings(record)) == 1
    np.testing.assert_array_equal(_run(ctx, built), EXPECTED["times"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # said once
        built = _build(ctx, PLUS)
    np.testing.assert_array_equal(_run(ctx, built), EXPECTED["plus"])


@pytest.mark.parametrize("under", [False, True], ids=["file", "under_file"])
def test_cache_folder_that_is_a_file_warns_once(ctx, monkeypatch, tmp_path, under):
    regular = tmp_path / "not_a_folder"
    regular.write_text("a regular file")
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(regular / "sub" if under else regular))
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)
    _check_unusable_folder(ctx, regular)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes to read-only folders")
def test_read_only_cache_folder_warns_once(ctx, cache):
    cache.mkdir()
    cache.chmod(0o555)
    try:
        _check_unusable_folder(ctx, cache)
    finally:
        cache.chmod(0o755)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_cache_files_follow_the_umask(ctx, cache, umask, mode):
    old = os.umask(umask)
    try:
        _build(ctx, TIMES)
        tuning.write_db(cache / "tuning" / "gemm.json", tuning.empty_db("gemm"))
    finally:
        os.umask(old)
    for path in _entries(cache) + [cache / "tuning" / "gemm.json"]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    assert stat.S_IMODE((cache / "programs").stat().st_mode) == 0o777 & ~umask


def _damaged_tuning(name):
    yield '{"family": "gemm", "format": 1, "devi'                         # truncated
    yield "\x00\x17 not json"
    # Valid JSON of the wrong layout: a rule without "params" for this very device.
    yield json.dumps({"family": "gemm", "format": 1,
                      "devices": {name: {"rules": [{"when": {}, "paramz": {}}]}}})


@pytest.mark.parametrize("case", range(3), ids=["truncated", "garbage", "layout"])
def test_damaged_tuning_file_is_ignored(ctx, cache, rng, case):
    fresh = dp.Context()                    # an empty memo of GEMM parameters
    user = tuning.user_path("gemm")
    user.parent.mkdir(parents=True)
    user.write_text(list(_damaged_tuning(fresh.info.name))[case])
    tuning.forget("gemm")
    try:
        a, b = random(rng, (13, 17)), random(rng, (17, 11))
        with pytest.warns(dp.CacheWarning, match=re.escape(str(user))) as record:
            c = dp.gemm(dp.Tensor.from_numpy(fresh, a), dp.Tensor.from_numpy(fresh, b)).numpy()
        assert len(_cache_warnings(record)) == 1
        assert_close(c, a.astype(np.float64) @ b)
        # A later write replaces the damaged file.
        tuning.store_device_entry(user, "gemm", fresh.info, [])
        assert tuning.read_db(user, "gemm")["devices"][fresh.info.name]["rules"] == []
    finally:
        tuning.forget("gemm")


def test_build_options_of_the_environment(ctx, cache, monkeypatch):
    """DLPRIM_BUILD_OPTIONS enters every build() and its keys: the memory cache, and the disk
    cache, whose entry for other options is another file; the program still computes the same."""
    for options in ("", "-cl-opt-disable", "-cl-opt-disable -cl-mad-enable"):
        monkeypatch.setenv("DLPRIM_BUILD_OPTIONS", options)
        dp.config.reload()
        built = program.build(ctx, "pointwise", TIMES)
        assert built.options == tuple(options.split())
        np.testing.assert_array_equal(_run(ctx, built), EXPECTED["times"])
    assert len(_entries(cache)) == 3
