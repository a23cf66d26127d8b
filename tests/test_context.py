"""Device choice, device facts, wrapping a host application's queue."""
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
