"""Where a network's inference time goes: host time per forward (enqueuing only), wall time
with the device drained, and the device's busy time per kernel from profiling events (one
forward with launches through PyOpenCL so that each has an event), for the three networks.

    python benchmarks/nets_kernel_profile.py [BATCH]     (default 1)
"""
import sys, time, collections, numpy as np, pyopencl as cl
import dlprim_py as dp
from dlprim_py import launch
from dlprim_py.bench import nets
ctx = dp.Context()
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for net in ("resnet18", "resnet50", "mobilenet_v2"):
    state = nets.make_state_dict(net)
    model = nets.DpNet(ctx, net, state)
    x_np, _ = nets.make_inputs(batch)
    x = dp.Tensor.from_numpy(ctx, x_np)
    for _ in range(3): model(x)
    ctx.synchronize()
    host = []; wall = []
    for _ in range(10):
        t0 = time.perf_counter(); model(x); t1 = time.perf_counter(); ctx.synchronize(); t2 = time.perf_counter()
        host.append(t1 - t0); wall.append(t2 - t0)
    # kernel events
    with launch.kernel_events() as events:
        model(x)
    ctx.synchronize()
    per = collections.defaultdict(lambda: [0, 0.0])
    busy = 0.0
    for name, e in events:
        dt = (e.profile.end - e.profile.start) * 1e-6
        busy += dt; per[name][0] += 1; per[name][1] += dt
    span = (events[-1][1].profile.end - events[0][1].profile.start) * 1e-6
    print(f"{net} b{batch}: host {1e3*np.median(host):.2f} ms, wall {1e3*np.median(wall):.2f} ms, "
          f"{len(events)} launches, device busy {busy:.2f} ms, span {span:.2f} ms")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"   {name:40s} {n:4d} x  {t:7.3f} ms  ({1e3*t/n:6.1f} us each)")
