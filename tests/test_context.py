"""Device choice, device facts, wrapping a host application's queue."""
import numpy as np
import pyopencl as cl
import pytest

import dlprim_py as dp
from dlprim_py.context import find_device, normalise_vendor


def test_devices_lists_every_device():
    found = dp.devices()
    assert found, "no OpenCL device at all"
    for index, platform, name, kind in found:
        p, d = index.split(":")
        assert cl.get_platforms()[int(p)].get_devices()[int(d)].name.strip() == name


def test_default_context_has_device_facts(ctx):
    info = ctx.info
    assert info.vendor in ("nvidia", "amd", "intel", "apple", "arm", "pocl", "other")
    assert info.local_mem_size > 0
    assert info.max_work_group_size >= 1
    assert info.compute_units >= 1
    assert isinstance(info.has_fp16, bool) and isinstance(info.has_fp64, bool)
    assert isinstance(info.has_subgroups, bool)
    assert ctx.queue.device == ctx.device
    assert ctx.cl_context == ctx.queue.context


def test_context_by_index_and_by_name():
    index, _, name, _ = dp.devices()[0]
    assert dp.Context(index).device.name.strip() == name
    assert dp.Context(name[:6]).info.name == dp.Context(name).info.name


def test_environment_variable_picks_device(monkeypatch):
    index, _, name, _ = dp.devices()[-1]
    monkeypatch.setenv("DLPRIM_DEVICE", index)
    assert find_device().name.strip() == name


@pytest.mark.parametrize("spec", ["99:0", "0:99", "no such device anywhere"])
def test_unknown_device_raises(spec):
    with pytest.raises(dp.DeviceError, match="devices:"):
        dp.Context(spec)


def test_wraps_host_queue():
    device = find_device()
    host_ctx = cl.Context([device])
    host_queue = cl.CommandQueue(host_ctx)
    ctx = dp.Context(queue=host_queue)
    assert ctx.queue is host_queue
    assert ctx.cl_context == host_ctx
    assert not ctx.owns_queue


def test_bad_queue_and_both_arguments():
    with pytest.raises(dp.DeviceError):
        dp.Context(queue="not a queue")
    host_queue = cl.CommandQueue(cl.Context([find_device()]))
    with pytest.raises(dp.DeviceError):
        dp.Context("0:0", queue=host_queue)


@pytest.mark.parametrize("platform, vendor, expected", [
    ("NVIDIA CUDA", "NVIDIA Corporation", "nvidia"),
    ("AMD Accelerated Parallel Processing", "Advanced Micro Devices, Inc.", "amd"),
    ("Intel(R) OpenCL Graphics", "Intel(R) Corporation", "intel"),
    ("Apple", "Apple", "apple"),
    ("ARM Platform", "ARM", "arm"),
    ("Portable Computing Language", "GenuineIntel", "pocl"),
    ("Something", "Unknown", "other"),
])
def test_vendor_names_are_normalised(platform, vendor, expected):
    assert normalise_vendor(platform, vendor) == expected


def test_info_command_prints_devices(capsys):
    from dlprim_py.__main__ import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "default device" in out and dp.devices()[0][2] in out


def test_a_context_serves_one_thread(ctx, rng):
    """Operators called on a context from another thread raise DeviceError (its plans and
    scratch buffers serve one call at a time); a context handed over works there, each thread
    gets a default context of its own, and one context per thread computes right."""
    import threading
    import dlprim_py.functional as F
    a = rng.uniform(-1, 1, (64, 33)).astype(np.float32)
    x = dp.Tensor.from_numpy(ctx, a)
    errors, results = [], {}

    def foreign():
        for call in (lambda: F.relu(x), lambda: F.softmax(x, dim=1), lambda: F.sum(x),
                     lambda: x + x):
            try:
                call()
            except dp.DeviceError as error:
                errors.append(str(error))

    thread = threading.Thread(target=foreign)
    thread.start()
    thread.join()
    assert len(errors) == 4 and all("use_in_this_thread" in e for e in errors), errors

    def own(k):
        mine = dp.default_context()
        assert mine is dp.default_context() and mine is not ctx
        t = dp.Tensor.from_numpy(mine, a * k)
        for _ in range(20):
            results[k] = (F.softmax(t, dim=1).numpy(), F.sum(t).numpy(), id(mine))

    threads = [threading.Thread(target=own, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[1][2] != results[2][2]
    for k in (1, 2):
        e = np.exp(a.astype(np.float64) * k - (a.astype(np.float64) * k).max(1, keepdims=True))
        np.testing.assert_allclose(results[k][0], e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(results[k][1], (a.astype(np.float64) * k).sum(), rtol=1e-5)

    handed = dp.Context(ctx.device)
    y = dp.Tensor.from_numpy(handed, a)

    def take_over():
        handed.use_in_this_thread()
        results["handed"] = F.relu(y).numpy()

    thread = threading.Thread(target=take_over)
    thread.start()
    thread.join()
    np.testing.assert_array_equal(results["handed"], np.maximum(a, 0))
    with pytest.raises(dp.DeviceError, match="belongs to thread"):
        F.relu(y)


def test_memory_accounting_and_empty_cache():
    """memory_allocated counts live tensors, memory_reserved also the freed blocks the pool
    keeps; empty_cache hands those back; a context is freed with its last reference."""
    import gc
    import weakref
    import dlprim_py.functional as F
    fresh = dp.Context(dp.default_context().device)
    assert fresh.memory_allocated() == 0
    x = dp.Tensor.from_numpy(fresh, np.ones((256, 256), np.float32))
    F.sum(F.softmax(F.relu(x), dim=1))
    assert fresh.memory_allocated() >= x.nbytes
    y = F.relu(x)
    held = fresh.memory_reserved()
    del y
    assert fresh.memory_reserved() == held > fresh.memory_allocated() >= x.nbytes
    fresh.empty_cache()
    assert fresh.memory_pool.held_blocks == 0
    assert fresh.memory_allocated() <= fresh.memory_reserved() < held
    fresh.synchronize()
    ref = weakref.ref(fresh)
    del fresh, x
    gc.collect()
    assert ref() is None, "a context outlived its last reference"


def test_oversized_tensor_is_refused_with_its_size(ctx):
    for shape in ((ctx.info.max_alloc_size // 4 + 1,), (2 ** 78,)):
        with pytest.raises(dp.DeviceMemoryError, match=r"bytes exceeds .* largest allocation"):
            dp.Tensor.empty(ctx, shape)
        with pytest.raises(dp.DlprimError):
            dp.Tensor.zeros(ctx, shape)


def test_plan_cache_is_bounded_and_keeps_what_is_used():
    from dlprim_py.context import PlanCache
    cache = PlanCache(8)
    hot = ("hot",)
    cache.put(hot, "plan")
    for i in range(100):
        cache.put(("cold", i), i)
        assert len(cache) <= 8
        if i % 3 == 0:   # used once per 3 insertions, well within capacity / 2
            assert cache.get(hot) == "plan"
    assert cache.get(hot) == "plan"
    # Entries not used since capacity insertions are gone; the newest are there.
    assert cache.get(("cold", 0)) is None
    assert cache.get(("cold", 99)) == 99
    # put replaces, in either generation.
    cache.put(("cold", 98), "again")
    assert cache.get(("cold", 98)) == "again"
    assert len(cache) <= 8
    cache.clear()
    assert len(cache) == 0 and cache.get(hot) is None
    with pytest.raises(ValueError):
        PlanCache(1)


def test_plan_cache_hit_follows_rotations():
    """``hit`` is the current generation's dict.get, bound once: the generation must be emptied
    in place on every rotation, so that hit keeps seeing what put stores; what it no longer
    sees (the previous generation) get still finds."""
    from dlprim_py.context import PlanCache
    cache = PlanCache(8)
    hit = cache.hit
    for i in range(50):
        cache.put(i, str(i))
        assert cache.hit is hit and hit(i) == str(i)
        if i >= 1:
            older = cache.get(i - 1)
            assert older == str(i - 1) and hit(i - 1) == older   # moved back into the current
    cache.clear()
    assert hit(49) is None and cache.get(49) is None
    cache.put("again", 1)
    assert hit("again") == 1


def test_plan_cache_hits_drop_nothing():
    """Only storing a new plan drops old ones: a repeated call (all hits) frees no plan, so it
    leaves no kernel object's reference cycles to the collector."""
    from dlprim_py.context import PlanCache
    cache = PlanCache(8)
    for i in range(8):
        cache.put(i, i)
    held = len(cache)
    for _ in range(3):
        for i in range(8):
            value = cache.get(i)
            assert value is None or value == i
    assert len(cache) == held
    survivors = [i for i in range(8) if cache.get(i) is not None]
    assert len(survivors) == held


def test_kept_tensor_is_made_once_outside_any_recording():
    """ctx.kept_tensor: made by its factory once (again only when ``fits`` refuses the kept
    one), and never into an open recording, so that no plan replays its fill."""
    from dlprim_py import launch
    ctx = dp.Context()
    made = []

    def make(size):
        made.append(size)
        return dp.Tensor.full(ctx, (size,), 2.0)

    with launch.Recording() as recording:
        first = ctx.kept_tensor("test.kept", lambda: make(8))
    assert recording.steps == [] and made == [8]
    np.testing.assert_array_equal(first.numpy(), np.full(8, 2.0, np.float32))
    assert ctx.kept_tensor("test.kept", lambda: make(8)) is first
    assert ctx.kept_tensor("test.kept", lambda: make(4), fits=lambda t: t.size >= 4) is first
    larger = ctx.kept_tensor("test.kept", lambda: make(16), fits=lambda t: t.size >= 16)
    assert larger is not first and made == [8, 16] and larger.size == 16
