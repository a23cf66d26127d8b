"""``dlprim-run``: run an ONNX model from the command line::

    dlprim-run model.onnx [--batch N] [--input x.npy] [--bench] [--check] [--device D]

The input is random (seeded, N(0, 1), the file's shape with its symbolic dimensions set to
--batch, 1 by default) or the given .npy file (models with one input). Prints the planning
time, each output's shape and first values, with --bench the time per batch (wall clock with
the device drained, and device time between profiling markers where the queue profiles), and
with --check the largest difference from onnxruntime (when it is installed).
"""
import argparse
import sys
import time

import numpy as np


def _input_arrays(model, batch, path, seed):
    arrays = {}
    if path is not None:
        if len(model.inputs) != 1:
            raise SystemExit(f"--input gives one array; the model has inputs {model.input_names}")
        arrays[model.input_names[0]] = np.load(path)
        return arrays
    rng = np.random.default_rng(seed)
    for info in model.inputs:
        if info.shape is None:
            raise SystemExit(f"input {info.name!r} has no shape in the file: give --input")
        shape = [batch if not isinstance(d, int) else d for d in info.shape]
        if np.dtype(info.dtype).kind == "f":
            arrays[info.name] = rng.standard_normal(shape).astype(info.dtype)
        else:
            arrays[info.name] = rng.integers(0, 2, shape).astype(info.dtype)
    return arrays


def _parser():
    p = argparse.ArgumentParser(
        prog="dlprim-run",
        description="Run an ONNX model with dlprim_py: random or given input, the outputs, time "
                    "per batch (--bench) and the difference from onnxruntime (--check).")
    p.add_argument("model", help="the .onnx file")
    p.add_argument("--batch", type=int, default=1, help="size of symbolic dimensions (default 1)")
    p.add_argument("--input", help=".npy file with the input (a model with one input)")
    p.add_argument("--bench", action="store_true", help="time repeated runs")
    p.add_argument("--repeat", type=int, default=20, help="timed runs with --bench (default 20)")
    p.add_argument("--check", action="store_true", help="compare with onnxruntime")
    p.add_argument("--device", help="DLPRIM_DEVICE-style device choice (index or name)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input")
    return p


def main(argv=None):
    import dlprim_py as dp
    args = _parser().parse_args(argv)
    ctx = dp.Context(args.device) if args.device else dp.Context()
    try:
        started = time.perf_counter()
        model = dp.onnx.load(args.model, ctx)
        loaded = time.perf_counter() - started
    except (dp.ModelFileError, dp.UnsupportedError) as exc:
        print(f"dlprim-run: {exc}", file=sys.stderr)
        return 2
    arrays = _input_arrays(model, args.batch, args.input, args.seed)
    tensors = [dp.Tensor.from_numpy(ctx, np.ascontiguousarray(arrays[n]))
               for n in model.input_names]
    started = time.perf_counter()
    outs = model(*tensors)
    ctx.queue.finish()
    planned = time.perf_counter() - started
    outs = outs if isinstance(outs, tuple) else (outs,)
    print(f"{args.model}: opset {model.opset} on {ctx.info.name}; loaded in {loaded:.3f} s, "
          f"first run (planning) {planned:.3f} s, {model.launch_count} launches, "
          f"{model.memory_bytes / 2**20:.1f} MiB ("
          + ", ".join(f"{kind} {n / 2**20:.1f}" for kind, n in model.memory_parts.items())
          + f") and {model.weight_bytes / 2**20:.1f} MiB of weights")
    for info in model.inputs:
        print(f"  input  {info.name}: {tuple(arrays[info.name].shape)} "
              f"{np.dtype(arrays[info.name].dtype).name} (file: {info.shape})")
    results = {}
    for name, t in zip(model.output_names, outs):
        value = t.numpy() if isinstance(t, dp.Tensor) else np.asarray(t)
        results[name] = value
        head = np.array2string(value.reshape(-1)[:5], precision=4)
        print(f"  output {name}: {value.shape} {value.dtype.name} {head}")
    status = 0
    if args.bench:
        from ..timing import time_enqueued
        run = lambda: model(*tensors)  # noqa: E731
        wall = time_enqueued(ctx, run, repeat=args.repeat, wall_clock=True)
        line = f"  time per batch: wall clock {wall.median * 1e3:.3f} ms"
        if ctx.profiling:
            device = time_enqueued(ctx, run, repeat=args.repeat)
            line += f", kernels {device.median * 1e3:.3f} ms"
        print(line + f" (median of {args.repeat}, batch {args.batch})")
    if args.check:
        try:
            import onnxruntime as ort
        except ImportError:
            print("  check: onnxruntime is not installed")
        else:
            session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
            names = [o.name for o in session.get_outputs()]
            reference = dict(zip(names, session.run(None, arrays)))
            for name in model.output_names:
                ref = reference[name].astype(np.float64)
                diff = float(np.abs(results[name] - ref).max()) if ref.size else 0.0
                scale = float(np.abs(ref).max()) if ref.size else 0.0
                relative = diff / scale if scale else diff
                print(f"  check {name}: max |ours - onnxruntime| = {diff:.3g} "
                      f"({relative:.3g} of the largest magnitude)")
                if not relative <= 1e-3:
                    status = 1
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
