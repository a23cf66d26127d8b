"""Convolution layers of networks (default: the 1x1 filter gradients of ResNet-50 and
MobileNetV2): every applicable algorithm timed through the Convolution operator (its plan
replayed, device drained), with what the immediate rule picks and which is fastest, to check
the rule against the device.

    python benchmarks/find_probe.py [--batch 64,32] [--direction backward_filter]
    python benchmarks/find_probe.py --nets densenet121 --kernels 3 --direction forward
"""
import argparse, json, os, sys, time
import numpy as np
import dlprim_py as dp
from dlprim_py.ops.conv import selection
from dlprim_py.ops.conv.problem import make_problem
sys.path.insert(0, os.path.dirname(__file__))
from conv import distinct, mobilenet_v2_layers, resnet50_layers  # noqa: E402


def densenet121_layers():
    """DenseNet-121's distinct convolutions past the stem (name, c, k, h, r, stride, pad,
    groups): per block, the 1x1 bottlenecks (growing inputs to 128) and the 3x3 128 -> 32
    layers, and the transitions' 1x1 halvings."""
    layers, c = [], 64
    for block, (count, h) in enumerate(zip((6, 12, 24, 16), (56, 28, 14, 7))):
        for i in range(count):
            layers.append((f"dense{block}.{i}.conv1", c + 32 * i, 128, h, 1, 1, 0, 1))
        layers.append((f"dense{block}.conv2", 128, 32, h, 3, 1, 1, 1))
        c += 32 * count
        if block < 3:
            layers.append((f"transition{block}", c, c // 2, h, 1, 1, 0, 1))
            c //= 2
    return layers


NETS = {"resnet50": resnet50_layers, "mobilenet_v2": mobilenet_v2_layers,
        "densenet121": densenet121_layers}

parser = argparse.ArgumentParser()
parser.add_argument("--batch", default="64,32")
parser.add_argument("--direction", default="backward_filter")
parser.add_argument("--nets", default="resnet50,mobilenet_v2")
parser.add_argument("--kernels", default="1", help="filter sizes to take (default 1)")
parser.add_argument("--json")
args = parser.parse_args()
ctx = dp.Context()
print(ctx.info.name)
rng = np.random.default_rng(0)
rows = []
for batch in map(int, args.batch.split(",")):
    layers = [l for net in args.nets.split(",") for l in NETS[net]()]
    for name, c, k, h, r, stride, pad, groups in distinct(layers):
        if str(r) not in args.kernels.split(",") or stride != 1 or groups != 1:
            continue
        xs, ws = (batch, c, h, h), (k, c, r, r)
        desc = dp.ConvolutionDesc(pad, 1)
        p = make_problem(xs, ws, desc)
        d = args.direction
        conv = dp.Convolution(ctx, dp.TensorDesc(xs), dp.TensorDesc(ws), desc)
        x = dp.Tensor.from_numpy(ctx, rng.standard_normal(xs).astype(np.float32))
        dy = dp.Tensor.from_numpy(ctx, rng.standard_normal(p.y_shape).astype(np.float32))
        w = dp.Tensor.from_numpy(ctx, rng.standard_normal(ws).astype(np.float32))
        out = {"forward": dp.Tensor.empty(ctx, p.y_shape), "backward_data": dp.Tensor.empty(ctx, xs),
               "backward_filter": dp.Tensor.empty(ctx, ws)}[d]
        call = {"forward": lambda a: conv.forward(x, w, out, algo=a),
                "backward_data": lambda a: conv.backward_data(dy, w, out, algo=a),
                "backward_filter": lambda a: conv.backward_filter(dy, x, out, algo=a)}[d]
        wall = {}
        for algo in selection.applicable(ctx, p, d):
            if algo in ("direct", "direct_phased"):
                continue
            for _ in range(3):
                call(algo)
            ctx.synchronize()
            samples = []
            for _ in range(15):
                t0 = time.perf_counter(); call(algo); ctx.synchronize()
                samples.append(time.perf_counter() - t0)
            wall[algo] = float(np.median(samples)) * 1e3
        immediate = selection.immediate(ctx, p, d)
        best = min(wall, key=wall.get)
        rows.append(dict(name=name, batch=batch, c=c, k=k, h=h, gemm_k=batch * h * h,
                         immediate=immediate, best=best, ms=wall))
        print(f"b{batch} {name:22s} c{c:5d} k{k:5d} h{h:4d} immediate {immediate:14s} "
              f"({wall[immediate]:.3f} ms) best {best:14s} ({wall[best]:.3f} ms) "
              f"x{wall[immediate] / wall[best]:.2f}")
if args.json:
    json.dump(rows, open(args.json, "w"), indent=1)
