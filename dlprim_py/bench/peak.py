"""Suite ``peak``: what the device can do at best, measured the way clpeak does.

* FP32 multiply-add rate: independent float4 chains per work item (``kernels/peak.cl.mako``),
  sized by a calibration run so that one run takes a few milliseconds;
* copy bandwidth: a float4 copy kernel, bytes read + bytes written per second;
* TF32 tensor-core rate (NVIDIA, compute capability 8.0+): warp-level ``mma.sync`` m16n8k8 from
  registers, the ceiling of the "mma" GEMM solver (what OpenCL can reach without Hopper's
  ``wgmma``);
* kernel-launch cost: back-to-back launches of a one-work-item kernel with arguments bound once,
  device time per launch; the row's params add the host enqueue time per launch and clpeak's
  latency (queued to start of a single launch on an idle queue).

The FP32 and copy rates become the "% of peak" denominators of every other suite.
"""
import math
import time

import numpy as np
import pyopencl as cl

from .. import program
from ..errors import ShapeError
from ..ops.gemm import mma_device_problem
from ..tensor import Tensor
from ..timing import time_enqueued
from .harness import Case, CaseSpec

CHAINS = 8
UNROLL = 4
FLOPS_PER_TRIP = 8 * CHAINS * UNROLL
PARAMS = dict(chains=CHAINS, unroll=UNROLL, mma=0)
MMA_PARAMS = dict(chains=CHAINS, unroll=UNROLL, mma=1)
FLOPS_PER_MMA = 2 * 16 * 8 * 8
MULTIPLIER = np.float32(0.999)
ADDEND = np.float32(0.001)


def _local_size(ctx):
    if ctx.info.is_cpu:
        return None
    return (min(256, ctx.info.max_work_group_size),)


def fma_reference(start, steps):
    """float64 result of the fma_peak kernel for per-item starting values ``start``."""
    m, c = float(MULTIPLIER), float(ADDEND)
    limit = c / (1.0 - m)
    decay = m ** steps
    lanes = np.array([k * 0.125 + lane * 0.03125 for k in range(CHAINS) for lane in range(4)],
                     dtype=np.float32).astype(np.float64)
    a = start.astype(np.float64)[:, None] + lanes[None, :]
    return (decay * (a - limit) + limit).sum(axis=1)


class FmaProbe:
    """``items`` work items, each ``trips * UNROLL`` steps of CHAINS float4 multiply-adds."""

    def __init__(self, bench, items):
        ctx = bench.ctx
        self.ctx = ctx
        self.kernel = program.kernel(ctx, "peak", "fma_peak", PARAMS,
                                     fresh=True)
        local = _local_size(ctx)
        if local:
            items = max(local[0], items // local[0] * local[0])
        self.items = items
        self.local = local
        self.start = bench.random((items,), 0.0, 1.0)
        self.x = Tensor.from_numpy(ctx, self.start)
        self.y = Tensor.empty(ctx, (items,))
        self.trips = 1

    def set_trips(self, trips):
        self.trips = int(trips)
        self.kernel.set_args(self.x.buffer, np.int32(self.x.offset_elements), self.y.buffer,
                             np.int32(self.y.offset_elements), np.int32(self.trips), MULTIPLIER,
                             ADDEND)

    @property
    def flops(self):
        return float(self.items) * self.trips * FLOPS_PER_TRIP

    def run(self):
        cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, (self.items,), self.local)

    def calibrate(self, target_s):
        """Grow the trip count until one run takes about ``target_s`` seconds."""
        trips = 4
        self.set_trips(trips)
        for _ in range(24):
            seconds = time_enqueued(self.ctx, self.run, warmup=1, repeat=1).median
            if seconds >= target_s / 2 or trips >= 1 << 20:
                break
            scale = 2.0 if seconds <= 0 else min(16.0, max(2.0, target_s / seconds))
            trips = min(1 << 20, int(trips * scale))
            self.set_trips(trips)
        if seconds > 0 and seconds < target_s:
            self.set_trips(min(1 << 20, max(1, int(trips * target_s / seconds))))

    def verify(self):
        self.y.fill_(np.nan)
        self.run()
        out = self.y.numpy()
        ref = fma_reference(self.start, self.trips * UNROLL)
        # The recurrence contracts, so float32 rounding stays near eps / (1 - m) relative.
        return float(np.max(np.abs(out - ref) / np.abs(ref))) if np.isfinite(out).all() else math.inf


class MmaProbe:
    """``warps`` warps, each ``trips * UNROLL`` steps of CHAINS TF32 mma.sync m16n8k8 products
    from registers; every fragment element is A_VALUE or B_VALUE (exact in TF32), so each
    accumulator ends at 8 * A_VALUE * B_VALUE * steps, exact in float32 for the step counts the
    calibration reaches (a multiple of 2^-6 below 2^24 * 2^-6)."""

    A_VALUE, B_VALUE = 0.5, 0.25
    GROUP = 128

    def __init__(self, bench, warps, chains=CHAINS):
        ctx = bench.ctx
        self.ctx = ctx
        self.chains = chains
        self.kernel = program.kernel(ctx, "peak", "tf32_mma_peak", dict(MMA_PARAMS, chains=chains),
                                     fresh=True)
        self.items = max(self.GROUP, warps * 32 // self.GROUP * self.GROUP)
        self.y = Tensor.empty(ctx, (self.items,))
        self.trips = 1

    def set_trips(self, trips):
        self.trips = int(trips)
        self.kernel.set_args(self.y.buffer, np.int32(self.y.offset_elements), np.int32(self.trips),
                             np.float32(self.A_VALUE), np.float32(self.B_VALUE))

    @property
    def flops(self):
        return float(self.items // 32) * self.trips * UNROLL * self.chains * FLOPS_PER_MMA

    def run(self):
        cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, (self.items,), (self.GROUP,))

    calibrate = FmaProbe.calibrate

    def verify(self):
        self.y.fill_(np.nan)
        self.run()
        out = self.y.numpy().astype(np.float64)
        steps = self.trips * UNROLL
        expected = self.chains * 4 * 8 * self.A_VALUE * self.B_VALUE * steps
        return float(np.max(np.abs(out - expected)) / expected) if np.isfinite(out).all() \
            else math.inf


class CopyProbe:
    """A float4 copy of ``floats`` float32 values (rounded down to a multiple of 4)."""

    def __init__(self, bench, floats):
        ctx = bench.ctx
        self.ctx = ctx
        floats = max(4, floats // 4 * 4)
        self.floats = floats
        self.src_host = bench.random((floats,))
        self.src = Tensor.from_numpy(ctx, self.src_host)
        self.dst = Tensor.empty(ctx, (floats,))
        for t in (self.src, self.dst):
            if t.offset_elements % 4:
                raise ShapeError(f"the copy probe needs tensor offsets that are multiples of 4 "
                                 f"floats, got {t.offset_elements}")
        self.kernel = program.kernel(ctx, "peak", "copy_float4", PARAMS,
                                     fresh=True)
        n4 = floats // 4
        self.local = _local_size(ctx)
        group = self.local[0] if self.local else 64
        self.global_size = (math.ceil(n4 / group) * group,)
        if not self.local:
            self.global_size = (n4,)
        self.kernel.set_args(self.src.buffer, np.int64(self.src.offset_elements // 4),
                             self.dst.buffer, np.int64(self.dst.offset_elements // 4), np.int64(n4))

    @property
    def bytes(self):
        return 2.0 * self.floats * 4

    def run(self):
        cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, self.global_size, self.local)

    def verify(self):
        self.dst.fill_(np.nan)
        self.run()
        out = self.dst.numpy()
        return 0.0 if np.array_equal(out, self.src_host) else math.inf


class ReadProbe:
    """``passes`` passes of every work item over its share of ``floats`` float32 ones (float4
    loads, the global size's stride): with ``floats`` well inside the L2 cache, the cache's read
    bandwidth; far beyond it, the memory's. Bytes read per second."""

    def __init__(self, bench, floats, passes, items):
        ctx = bench.ctx
        self.ctx = ctx
        self.floats = max(4, floats // 4 * 4)
        self.passes = int(passes)
        self.src = Tensor.from_numpy(ctx, np.ones(self.floats, np.float32))
        self.local = _local_size(ctx)
        group = self.local[0] if self.local else 64
        self.items = max(group, items // group * group)
        self.y = Tensor.empty(ctx, (self.items,))
        if self.src.offset_elements or self.y.offset_elements:
            raise ShapeError("the read probe needs tensors of their own (offset 0)")
        self.kernel = program.kernel(ctx, "peak", "read_float4", PARAMS, fresh=True)
        self.kernel.set_args(self.src.buffer, np.int64(self.floats // 4), np.int32(self.passes),
                             self.y.buffer)

    @property
    def bytes(self):
        return 4.0 * self.floats * self.passes

    def run(self):
        cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, (self.items,), self.local)

    def verify(self):
        self.y.fill_(np.nan)
        self.run()
        n4, items = self.floats // 4, self.items
        # Item i reads the float4s i, i + items, ...: ceil((n4 - i) / items) of them per pass.
        counts = 4.0 * self.passes * np.maximum(0, -(-(n4 - np.arange(items)) // items))
        return 0.0 if np.array_equal(self.y.numpy().astype(np.float64), counts) else math.inf


class LaunchProbe:
    """``launches`` back-to-back launches of a kernel that increments one counter."""

    def __init__(self, bench, launches):
        ctx = bench.ctx
        self.ctx = ctx
        self.launches = launches
        self.counter = Tensor.zeros(ctx, (1,), np.int32)
        self.kernel = program.kernel(ctx, "peak", "launch_probe", PARAMS,
                                     fresh=True)
        self.kernel.set_args(self.counter.buffer, np.int32(self.counter.offset_elements))
        self.host_enqueue_us = None

    def run(self):
        queue, kernel = self.ctx.queue, self.kernel
        for _ in range(self.launches):
            cl.enqueue_nd_range_kernel(queue, kernel, (1,), None)

    def verify(self):
        self.counter.fill_(0)
        self.ctx.queue.finish()
        started = time.perf_counter()
        self.run()
        enqueued = time.perf_counter() - started
        self.ctx.queue.finish()
        self.host_enqueue_us = enqueued / self.launches * 1e6
        count = int(self.counter.numpy()[0])
        return 0.0 if count == self.launches else math.inf

    def latency_us(self, samples=20):
        """clpeak's launch latency: median of (start - queued) profiling times of single
        launches on an idle queue, in microseconds (None without profiling)."""
        if not self.ctx.profiling:
            return None
        delays = []
        for _ in range(samples):
            event = cl.enqueue_nd_range_kernel(self.ctx.queue, self.kernel, (1,), None)
            event.wait()
            delays.append((event.profile.start - event.profile.queued) * 1e-3)
        return float(np.median(delays))


def sizes(bench):
    """(FMA work items, FMA target seconds, copy floats, launches) for the device and mode."""
    info = bench.ctx.info
    if info.is_gpu and not bench.quick:
        copy_floats = min(64 << 20, info.max_alloc_size // 4 // 2)
        return info.compute_units * 2048, 0.005, copy_floats, 1000
    if info.is_gpu:
        return info.compute_units * 1024, 0.002, min(16 << 20, info.max_alloc_size // 8), 200
    if bench.quick:
        return info.compute_units * 64, 0.02, 2 << 20, 50
    return info.compute_units * 256, 0.1, 16 << 20, 200


def fma_case(bench, items=None, target_s=None):
    default_items, default_target, _, _ = sizes(bench)
    probe = FmaProbe(bench, items or default_items)
    probe.calibrate(target_s or default_target)
    return Case(probe.run, probe.verify, probe.flops, "GFLOP/s", algorithm=f"float4 x{CHAINS} mad",
                tolerance=1e-3, params={"items": probe.items, "trips": probe.trips,
                                        "peak_of": "GFLOP/s"})


def mma_case(bench, warps=None, target_s=None):
    _, default_target, _, _ = sizes(bench)
    # 16 warps per compute unit: enough to cover mma.sync's latency with CHAINS chains each.
    probe = MmaProbe(bench, warps or bench.ctx.info.compute_units * 16)
    probe.calibrate(target_s or default_target)
    return Case(probe.run, probe.verify, probe.flops, "GFLOP/s",
                algorithm=f"tf32 mma.sync m16n8k8 x{CHAINS}", tolerance=1e-6,
                params={"items": probe.items, "trips": probe.trips, "peak_of": "TF32 GFLOP/s"})


def copy_case(bench, floats=None):
    _, _, default_floats, _ = sizes(bench)
    probe = CopyProbe(bench, floats or default_floats)
    torch_run = None
    if bench.torch is not None:
        src = bench.torch.tensor(probe.src_host)
        dst = bench.torch.torch.empty_like(src)
        torch_run = lambda: dst.copy_(src)  # noqa: E731
    return Case(probe.run, probe.verify, probe.bytes, "GB/s", algorithm="float4 copy",
                torch_run=torch_run, tolerance=0.0,
                params={"bytes": probe.bytes, "peak_of": "GB/s"})


def launch_case(bench, launches=None):
    _, _, _, default_launches = sizes(bench)
    probe = LaunchProbe(bench, launches or default_launches)

    def verify():
        error = probe.verify()
        case.params["host_enqueue_us"] = round(probe.host_enqueue_us, 3)
        latency = probe.latency_us()
        if latency is not None:
            case.params["queued_to_start_us"] = round(latency, 3)
        return error

    case = Case(probe.run, verify, 0.0, "us", algorithm="1 work item",
                tolerance=0.0, params={"launches": probe.launches}, per_call=probe.launches)
    return case


def cases(bench):
    return [
        CaseSpec("peak", "fp32 multiply-add", lambda: fma_case(bench)),
        CaseSpec("peak", "copy bandwidth", lambda: copy_case(bench)),
        *([CaseSpec("peak", "tf32 mma.sync", lambda: mma_case(bench))]
          if mma_device_problem(bench.ctx.info) is None else []),
        CaseSpec("peak", "kernel launch", lambda: launch_case(bench)),
    ]
