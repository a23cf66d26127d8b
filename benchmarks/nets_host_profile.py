"""Where a batch-1 network forward's host time goes: host ms per forward (enqueuing only, then
drained), the same with launches stubbed out (the Python alone), and a cProfile of repeated
forwards (functions by their own time, microseconds per forward), for ResNet-50 and MobileNetV2.

    python benchmarks/nets_host_profile.py [NET ...] [--top 30] [--image-size 224]

A small --image-size (32, 64) keeps a CPU OpenCL device's kernel time from hiding the host's.
"""
import argparse, cProfile, pstats, time
import numpy as np
import dlprim_py as dp
from dlprim_py import launch
from dlprim_py.bench import nets

parser = argparse.ArgumentParser()
parser.add_argument("nets", nargs="*", default=["resnet50", "mobilenet_v2"])
parser.add_argument("--top", type=int, default=30)
parser.add_argument("--repeat", type=int, default=200)
parser.add_argument("--image-size", type=int, default=224)
args = parser.parse_args()
ctx = dp.Context()
print(ctx.info.name)


def host_ms(model, x, repeat, rounds=5):
    """Host ms per forward: the best of ``rounds`` means over ``repeat`` forwards, each timed
    from the call to its return and drained after (a shared machine's other load only ever
    adds time)."""
    best = float("inf")
    for _ in range(rounds):
        total = 0.0
        for _ in range(repeat):
            t0 = time.perf_counter(); model(x); t1 = time.perf_counter(); ctx.synchronize()
            total += t1 - t0
        best = min(best, total / repeat)
    return 1e3 * best


for net in args.nets:
    model = nets.DpNet(ctx, net, nets.make_state_dict(net))
    x = dp.Tensor.from_numpy(ctx, nets.make_inputs(1, args.image_size)[0])
    for _ in range(5):
        model(x)
    ctx.synchronize()
    real = host_ms(model, x, 30)
    saved = launch._clEnqueueNDRangeKernel
    launch._clEnqueueNDRangeKernel = lambda *a: 0
    stub = host_ms(model, x, 30)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.repeat):
        model(x)
    profile.disable()
    launch._clEnqueueNDRangeKernel = saved
    ctx.synchronize()
    print(f"== {net} b1 {args.image_size}x{args.image_size}: host {real:.2f} ms per forward with launches, {stub:.2f} ms Python alone")
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]
    print(f"{'calls/fwd':>9s} {'own us/fwd':>10s} {'cum us/fwd':>10s}  function")
    for (path, line, name), (cc, nc, tt, ct, _) in rows:
        print(f"{nc / args.repeat:9.1f} {1e6 * tt / args.repeat:10.1f} {1e6 * ct / args.repeat:10.1f}  "
              f"{path.split('dlprim_py/')[-1]}:{line}({name})")
