"""Where a repeated call's host time goes: PyOpenCL's enqueue and set_arg costs, then each
operator's host microseconds per call with real launches and with launches stubbed out (the
Python alone); arguments name operators to profile with cProfile.

    python benchmarks/host_profile.py [relu conv bn_train ...]
"""
import time, sys, numpy as np, pyopencl as cl, dlprim_py as dp, dlprim_py.functional as F
from dlprim_py import launch
ctx = dp.Context(); rng = np.random.default_rng(0)
print(ctx.info.name)
def t(*s, g=False): return dp.Tensor.from_numpy(ctx, rng.standard_normal(s).astype(np.float32), requires_grad=g)
def best(f, n=300, r=7):
    b = 1e9
    for _ in range(r):
        t0 = time.perf_counter()
        for _ in range(n): f()
        b = min(b, (time.perf_counter() - t0) / n * 1e6)
    return b
x = t(2,8,8,8); w = t(8,8,3,3); g = t(8); x2=t(4,32); w2=t(10,32); b2=t(10)
tgt = dp.Tensor.from_numpy(ctx, np.array([1,2,3,4],np.int64))
xg = t(2,8,8,8,g=True); wg = t(8,8,3,3,g=True)
cases = {"relu": lambda: F.relu(x), "add": lambda: x + x, "mul_scalar": lambda: x * 2.0,
     "conv": lambda: F.conv2d(x, w, padding=1),
     "bn_train": lambda: F.batch_norm(x, None, None, g, g, training=True), "bn_eval": lambda: F.batch_norm(x, g, g, g, g, training=False),
     "linear": lambda: F.linear(x2, w2, b2), "maxpool": lambda: F.max_pool2d(x, 2), "aap": lambda: F.adaptive_avg_pool2d(x, 1),
     "ce": lambda: F.cross_entropy(x2, tgt), "flatten": lambda: F.flatten(x, 1),
     "relu_grad": lambda: F.relu(xg), "conv_grad": lambda: F.conv2d(xg, wg, padding=1)}
for f in cases.values():
    for _ in range(5): f()
ctx.queue.finish()
# raw PyOpenCL
prg = cl.Program(ctx.cl_context, "__kernel void k(__global float* a, float b){ if (get_global_id(0) == 0) a[0] = b; }").build()
kern = cl.Kernel(prg, "k"); buf = x.buffer; kern.set_arg(0, buf); kern.set_arg(1, np.float32(1))
q = ctx.queue
print(f"raw enqueue (1 item):     {best(lambda: cl.enqueue_nd_range_kernel(q, kern, (256,), (256,))):6.1f} us")
q.finish()
print(f"set_arg buffer:           {best(lambda: kern.set_arg(0, buf)):6.1f} us")
print(f"set_arg float32:          {best(lambda: kern.set_arg(1, np.float32(2))):6.1f} us")
q.finish()
real = {n: best(f) for n, f in cases.items()}
q.finish()
fake = lambda *a, **k: None
cl.enqueue_nd_range_kernel = fake; launch.cl.enqueue_nd_range_kernel = fake; launch._clEnqueueNDRangeKernel = lambda *a: 0
py = {n: best(f) for n, f in cases.items()}
print(f"{'op':12s} {'real':>7s} {'python':>7s}")
for n in cases:
    print(f"{n:12s} {real[n]:7.1f} {py[n]:7.1f}")
if len(sys.argv) > 1:
    import cProfile, pstats
    for n in sys.argv[1:]:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(2000): cases[n]()
        pr.disable()
        print("=====", n); pstats.Stats(pr).sort_stats("tottime").print_stats(15)
