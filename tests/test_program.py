"""The kernel pipeline: rendering, build errors, the in-memory and on-disk caches."""
import multiprocessing
import os

import numpy as np
import pytest

import dlprim_py as dp
from dlprim_py import program

PARAMS = dict(name="scale_copy", ndim=1, unroll=2, index_t="int", inputs=[("x", "float")],
              outputs=[("y", "float")], scalars=[("s", "float")], statement="y = s * x;",
              preamble="")


def test_render_substitutes_parameters():
    source = program.render("pointwise", **PARAMS)
    assert "__kernel void scale_copy(" in source and "y = s * x;" in source


def test_render_with_missing_parameter_raises():
    params = dict(PARAMS)
    del params["statement"]
    with pytest.raises(dp.KernelBuildError, match="statement"):
        program.render("pointwise", **params)


def test_unknown_template_raises():
    with pytest.raises(dp.KernelBuildError):
        program.render("no_such_family")


def test_build_error_has_log_and_source_lines(ctx):
    params = dict(PARAMS, statement="y = s * undeclared_name;")
    with pytest.raises(dp.KernelBuildError) as info:
        program.build(ctx, "pointwise", params)
    message = str(info.value)
    assert "undeclared_name" in message
    assert "rendered source around line" in message
    assert ">>" in message
    assert info.value.source and "undeclared_name" in info.value.source


def test_memory_cache_returns_same_program(ctx):
    first = program.build(ctx, "pointwise", PARAMS)
    assert program.build(ctx, "pointwise", dict(PARAMS)) is first
    other = program.build(ctx, "pointwise", PARAMS, options=("-cl-mad-enable",))
    assert other is not first
    kernel = first.kernel("scale_copy")
    assert first.kernel("scale_copy") is kernel
    assert first.kernel("scale_copy", fresh=True) is not kernel


def _run_scale(ctx):
    x = dp.Tensor.from_numpy(ctx, np.arange(8, dtype=np.float32))
    y = dp.Tensor.empty(ctx, (8,))
    k = program.kernel(ctx, "pointwise", "scale_copy", PARAMS)
    k(ctx.queue, (8,), None, np.int32(8), np.int32(8), x.buffer, np.int32(0), np.int32(1),
      y.buffer, np.int32(0), np.float32(3))
    return y.numpy()


def test_disk_cache_round_trip(monkeypatch, tmp_path):
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)
    first = dp.Context()
    built = program.build(first, "pointwise", PARAMS)
    assert not built.from_cache
    files = list((tmp_path / "programs").glob("*.bin"))
    assert len(files) == 1
    second = dp.Context()  # a new context has an empty memory cache
    again = program.build(second, "pointwise", PARAMS)
    assert again.from_cache
    assert np.array_equal(_run_scale(second), np.arange(8) * 3)


def test_damaged_cache_file_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    program.build(dp.Context(), "pointwise", PARAMS)
    (path,) = (tmp_path / "programs").glob("*.bin")
    path.write_bytes(b"this is not a program binary")
    ctx = dp.Context()
    with pytest.warns(dp.CacheWarning, match="not a dlprim_py program cache entry"):
        built = program.build(ctx, "pointwise", PARAMS)
    assert not built.from_cache
    assert np.array_equal(_run_scale(ctx), np.arange(8) * 3)


def test_no_cache_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("DLPRIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DLPRIM_NO_CACHE", "1")
    built = program.build(dp.Context(), "pointwise", PARAMS)
    assert not built.from_cache
    assert not (tmp_path / "programs").exists()


def _build_in_child(cache_dir, queue):
    os.environ["DLPRIM_CACHE_DIR"] = cache_dir
    os.environ.pop("DLPRIM_NO_CACHE", None)
    ctx = dp.Context()
    queue.put(_run_scale(ctx).tolist())


def test_concurrent_processes_share_the_cache(tmp_path):
    mp = multiprocessing.get_context("spawn")
    queue = mp.Queue()
    children = [mp.Process(target=_build_in_child, args=(str(tmp_path), queue)) for _ in range(3)]
    for c in children:
        c.start()
    results = [queue.get(timeout=120) for _ in children]
    for c in children:
        c.join(timeout=60)
        assert c.exitcode == 0
    assert all(r == (np.arange(8) * 3).tolist() for r in results)
    files = list((tmp_path / "programs").glob("*"))
    assert [f.suffix for f in files] == [".bin"], "a temporary file was left behind"
