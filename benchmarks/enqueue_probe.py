"""What one kernel launch costs the host: PyOpenCL's enqueue_nd_range_kernel (which asks the
driver for an event and wraps it) against the OpenCL library's clEnqueueNDRangeKernel called
through ctypes without an event, with and without an argument set before it. A one-item kernel,
so that the device time stays out of it (the queue is drained between repeats).

    python benchmarks/enqueue_probe.py

Measured on an H200 (NVIDIA OpenCL 3.0, driver 580.159.04; dispatch-h200/NOTES.md): 12-14 us
through PyOpenCL, 5-6 us without the event.
"""
import time

import numpy as np
import pyopencl as cl

import dlprim_py as dp
from dlprim_py import launch


def best_us(queue, call, n=1000, repeats=7):
    best = float("inf")
    for _ in range(repeats):
        queue.finish()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    queue.finish()
    return best


def main():
    ctx = dp.Context()
    queue = ctx.queue
    print(ctx)
    program = cl.Program(ctx.cl_context, "__kernel void k(__global float* a, float b) "
                         "{ if (get_global_id(0) == 0) a[0] = b; }").build()
    kernel = cl.Kernel(program, "k")
    buffer = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, 64)
    kernel.set_arg(0, buffer)
    kernel.set_arg(1, np.float32(1))
    native = launch._clEnqueueNDRangeKernel
    if native is None:
        print("no clEnqueueNDRangeKernel found: PyOpenCL only")
    queue_handle, kernel_handle = launch.native_handle(queue), launch.native_handle(kernel)
    work = launch.WorkSize((256,), (256,))
    rows = [("PyOpenCL enqueue_nd_range_kernel",
             lambda: cl.enqueue_nd_range_kernel(queue, kernel, (256,), (256,))),
            ("PyOpenCL set_arg(buffer) + enqueue",
             lambda: (kernel.set_arg(0, buffer), cl.enqueue_nd_range_kernel(queue, kernel, (256,), (256,))))]
    if native is not None:
        rows += [("native, no event",
                  lambda: native(queue_handle, kernel_handle, *work.native)),
                 ("PyOpenCL set_arg(buffer) + native",
                  lambda: (kernel.set_arg(0, buffer), native(queue_handle, kernel_handle, *work.native)))]
    for name, call in rows:
        print(f"{name:42s} {best_us(queue, call):7.2f} us per launch")


if __name__ == "__main__":
    main()
