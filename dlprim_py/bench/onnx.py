"""torchvision classifiers exported to ONNX, run by ``dlprim_py.onnx`` against PyTorch eager.

Each model (seeded random weights of order one through the network, see ``randomize``) is
exported by torch's TorchScript exporter (opset 17, dynamic batch), loaded with
``dp.onnx.load`` and run on the same images as the PyTorch model it came from:

- check: ours against PyTorch in float64 on the CPU for the first images of the batch
  (MIOpen's metric ``||ours - ref|| / (sqrt(n) max|ref|)``, passing under 1e-4 or within 10x
  PyTorch float32's own error);
- time: wall clock of ``model(x)`` with the device drained (``queue.finish()``), PyTorch eager
  (TF32 off) the same way with ``torch.cuda.synchronize()``, median after a warm-up, in the
  same process;
- planning: load + first call in this process (kernels from the disk cache: ``warm``), and in
  fresh processes with empty kernel caches (``cold``, then ``warm_disk``, with --first-call);
- memory: ours = ``memory_bytes`` (activations after liveness sharing, scratch, outputs) +
  ``weight_bytes`` + the input; PyTorch's = ``torch.cuda.max_memory_allocated()`` over one
  inference from a reset (weights, input and every intermediate).

``python -m dlprim_py.bench.onnx first-call --onnx FILE ...`` is the fresh process (one JSON
line); ``benchmarks/onnx.py`` is the command line; ``cases(bench)`` is the ``onnx`` suite of
``dlprim-bench``.
"""
import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings

import numpy as np

MODELS = ("resnet18", "resnet50", "mobilenet_v2", "vgg16", "densenet121", "efficientnet_b0")


def make_torch_model(name, num_classes=1000, seed=0):
    """torchvision's ``name`` with seeded random weights (``randomize``), in eval mode."""
    import torchvision
    return randomize(getattr(torchvision.models, name)(num_classes=num_classes), seed)


def randomize(model, seed=0):
    """Seeded weights of order one through the network, in place: He normal convolutions, batch
    norms with random affine parameters and statistics, linear layers with std 1/sqrt(fan in);
    returns the model in eval mode."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * math.sqrt(2.0 / fan_in))
                if m.bias is not None:
                    m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)
            elif isinstance(m, torch.nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=gen) * 0.5 + 0.5)
                m.bias.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
                m.running_mean.copy_(torch.rand(c, generator=gen) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            elif isinstance(m, torch.nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen)
                               / math.sqrt(m.in_features))
                if m.bias is not None:
                    m.bias.copy_(torch.rand(m.bias.shape, generator=gen) * 0.2 - 0.1)
    return model.eval()


def export(model, image_size, exporter="ts17"):
    """ONNX bytes of ``model`` on (1, 3, S, S) images with a dynamic batch axis named "batch";
    input "x", output "y". ``exporter``: "ts13" / "ts17" (TorchScript at that opset) or
    "dynamo"."""
    import contextlib
    import torch
    x = torch.zeros(1, 3, image_size, image_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            with contextlib.redirect_stdout(io.StringIO()):
                program = torch.onnx.export(model, (x,), dynamo=True, input_names=["x"],
                                            output_names=["y"], verbose=False,
                                            dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
            return program.model_proto.SerializeToString()
        f = io.BytesIO()
        torch.onnx.export(model, (x,), f, dynamo=False, opset_version=int(exporter[2:]),
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        return f.getvalue()


def make_images(batch, image_size, seed=1):
    return np.random.default_rng(seed).standard_normal(
        (batch, 3, image_size, image_size)).astype(np.float32)


def error_metric(ours, ref):
    """MIOpen's ||ours - ref|| / (sqrt(n) max|ref|)."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.linalg.norm((ours - ref).ravel()) / (math.sqrt(ref.size) * scale))


def check(model_torch, dp_logits, images, torch_logits=None, count=2):
    """(error of ours, error of PyTorch float32 or None) against float64 PyTorch on the CPU,
    over the first ``count`` images."""
    import copy
    import torch
    reference = copy.deepcopy(model_torch).to("cpu", torch.float64)
    with torch.no_grad():
        ref = reference(torch.from_numpy(images[:count]).to(torch.float64)).numpy()
    ours = error_metric(dp_logits[:count], ref)
    theirs = None if torch_logits is None else error_metric(torch_logits[:count], ref)
    return ours, theirs


def wall_times(call, drain, warmup=3, repeat=10, budget_s=None):
    """Seconds per ``call(); drain()`` after ``warmup`` untimed calls (at least 3 timed ones
    when ``budget_s`` cuts them short)."""
    for _ in range(warmup):
        call()
    drain()
    samples = []
    started = time.perf_counter()
    for i in range(repeat):
        t0 = time.perf_counter()
        call()
        drain()
        samples.append(time.perf_counter() - t0)
        if budget_s is not None and i >= 2 and time.perf_counter() - started > budget_s:
            break
    return np.asarray(samples)


def setup_torch_baseline(device, tf32=False):
    """TF32 as ours (off: FP32; ``tf32``: on for cuDNN's convolutions and cuBLAS's matrix
    products, PyTorch's default for convolutions) and cuDNN's algorithm search on."""
    import torch
    if str(device).startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = bool(tf32)
        torch.backends.cudnn.allow_tf32 = bool(tf32)
        torch.backends.cudnn.benchmark = True


def torch_device_for(prefer=None):
    import torch
    if prefer:
        return prefer
    return "cuda" if torch.cuda.is_available() else "cpu"


def first_call_in_subprocess(onnx_path, batch, image_size, device=None, timeout=1800,
                             tf32=False):
    """Load + first call in two fresh processes sharing a new empty cache directory: ``cold``
    (no kernel binary anywhere: DLPRIM_CACHE_DIR and the PoCL / NVIDIA driver caches point into
    it) and ``warm_disk`` (the binaries the first left)."""
    from .nets import cold_then_warm
    command = [sys.executable, "-m", "dlprim_py.bench.onnx", "first-call", "--onnx",
               onnx_path, "--batch", str(batch), "--image-size", str(image_size)]
    if device:
        command += ["--device", str(device)]
    if tf32:
        command.append("--tf32")
    return cold_then_warm(command, timeout, "dlprim-onnx-cache-")


def _first_call_main(argv):
    p = argparse.ArgumentParser(prog="python -m dlprim_py.bench.onnx first-call")
    p.add_argument("--onnx", required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--device", default=None)
    p.add_argument("--tf32", action="store_true", help="TF32 allowed (ctx.allow_tf32)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    import dlprim_py as dp
    ctx = dp.Context(args.device)
    ctx.allow_tf32 = args.tf32 or None
    imported = time.perf_counter() - started
    x = dp.Tensor.from_numpy(ctx, make_images(args.batch, args.image_size))
    t0 = time.perf_counter()
    model = dp.onnx.load(args.onnx, ctx)
    loaded = time.perf_counter() - t0
    t1 = time.perf_counter()
    model(x)
    ctx.queue.finish()
    first = time.perf_counter() - t1
    print(json.dumps({"import_s": imported, "load_s": loaded, "first_call_s": first,
                      "plan_s": loaded + first, "build_threads": dp.config.build_threads()}))
    return 0


def run_case(ctx, name, batch, image_size=224, torch_device=None, warmup=3, repeat=10,
             budget_s=None, first_call=False, exporter="ts17", log=None, workdir=None,
             tf32=False):
    """Check, then time one (model, batch) case; returns a JSON-ready dict. ``tf32``: the
    caller allowed TF32 on ``ctx`` and in torch (``setup_torch_baseline``): the check takes
    TF32's error (under 5e-3, or 10x PyTorch's own with TF32)."""
    import torch
    import dlprim_py as dp
    log = log or (lambda text: None)
    torch_device = torch_device_for(torch_device)
    result = {"model": name, "batch": batch, "image_size": image_size, "exporter": exporter,
              "tf32": bool(tf32)}
    model_torch = make_torch_model(name)
    t0 = time.perf_counter()
    data = export(model_torch, image_size, exporter)
    result["export_s"] = time.perf_counter() - t0
    images = make_images(batch, image_size)
    x = dp.Tensor.from_numpy(ctx, images)
    ctx.queue.finish()
    t0 = time.perf_counter()
    model = dp.onnx.load(data, ctx)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    logits = model(x)
    ctx.queue.finish()
    result["plan_warm_s"] = load_s + time.perf_counter() - t0
    result["launches"] = model.launch_count
    log(f"{name} n{batch}: planned in {result['plan_warm_s']:.2f} s, {model.launch_count} launches")

    on_device = model_torch.to(torch_device)
    xt = torch.from_numpy(images).to(torch_device)
    cuda = torch_device.startswith("cuda")
    drain_torch = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        torch_logits = on_device(xt)
        drain_torch()
        if cuda:
            result["torch_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        torch_logits = torch_logits.float().cpu().numpy()
    error, torch_error = check(model_torch.cpu(), logits.numpy(), images, torch_logits)
    on_device = model_torch.to(torch_device)
    result["error"], result["torch32_error"] = error, torch_error
    ok = error <= max(5e-3 if tf32 else 1e-4, 10 * (torch_error or 0.0))
    result["status"] = "ok" if ok else f"failed: error {error:.2e}"
    result["ours_peak_bytes"] = int(model.memory_bytes + model.weight_bytes + x.nbytes)
    result["ours_memory_bytes"] = int(model.memory_bytes)
    result["weight_bytes"] = int(model.weight_bytes)

    ours = wall_times(lambda: model(x), ctx.queue.finish, warmup, repeat, budget_s)
    result["ours_ms"] = float(np.median(ours)) * 1e3
    result["ours_p20_ms"] = float(np.percentile(ours, 20)) * 1e3
    result["ours_p80_ms"] = float(np.percentile(ours, 80)) * 1e3
    with torch.no_grad():
        theirs = wall_times(lambda: on_device(xt), drain_torch, warmup, repeat, budget_s)
    result["torch_ms"] = float(np.median(theirs)) * 1e3
    result["torch_p20_ms"] = float(np.percentile(theirs, 20)) * 1e3
    result["torch_p80_ms"] = float(np.percentile(theirs, 80)) * 1e3
    result["ratio"] = result["torch_ms"] / result["ours_ms"]
    if first_call:
        with tempfile.TemporaryDirectory(prefix="dlprim-onnx-", dir=workdir) as tmp:
            path = os.path.join(tmp, f"{name}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            fc = first_call_in_subprocess(path, batch, image_size, tf32=tf32)
        result["first_call"] = fc
        result["plan_cold_s"] = (fc.get("cold") or {}).get("plan_s")
        result["plan_warm_disk_s"] = (fc.get("warm_disk") or {}).get("plan_s")
    del model, logits
    if cuda:
        del on_device
        torch.cuda.empty_cache()
    ctx.empty_cache()
    return result


# ---- dlprim-bench suite "onnx" -------------------------------------------------------------

def cases(bench):
    """The ``onnx`` suite of dlprim-bench: every model of ``MODELS`` at batch 64 and 1 (or
    ``--batch``) on 224x224 images on a GPU; with --quick or on a CPU ResNet-18 and MobileNetV2
    at batch 1 on 64x64 images. Wall clock with the device drained, PyTorch the same way; the
    check is float64 PyTorch on the CPU."""
    from .harness import CaseSpec
    big = bench.ctx is not None and bench.ctx.info.is_gpu and not bench.quick
    image = 224 if big else 64
    models = MODELS if big else ("resnet18", "mobilenet_v2")
    batches = [bench.batch] if bench.batch else ([64, 1] if big else [1])
    specs = []
    for name in models:
        for b in batches:
            specs.append(CaseSpec("onnx", f"{name} n{b} {image}x{image}",
                                  lambda name=name, b=b: onnx_case(bench, name, b, image),
                                  group=name))
    return specs


def onnx_case(bench, name, batch, image_size):
    """A harness Case: run() is ``model(x)`` of the loaded ONNX model; verify() its error
    against float64 PyTorch scaled to the harness's tolerance (1e-4)."""
    import dlprim_py as dp
    from .harness import Case, Skip
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as e:
        raise Skip(f"needs torch, torchvision and onnx: {e}")
    ctx = bench.ctx
    model_torch = make_torch_model(name)
    data = export(model_torch, image_size)
    images = make_images(batch, image_size)
    model = dp.onnx.load(data, ctx)
    x = dp.Tensor.from_numpy(ctx, images)
    found = {}

    def verify():
        ours, theirs = check(model_torch, model(x).numpy(), images)
        found["error"] = ours
        return ours

    torch_run = None
    if bench.torch is not None:
        import torch
        device = bench.torch.device
        on_device = make_torch_model(name).to(device)
        xt = torch.from_numpy(images).to(device)

        def torch_run():
            with torch.no_grad():
                return on_device(xt)
    params = {"model": name, "batch": batch, "image_size": image_size, "check": found}
    return Case(lambda: model(x), verify, work=0.0, unit="ms", algorithm="onnx",
                torch_run=torch_run, params=params, wall_clock=True)


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) > 1 and sys.argv[1] == "first-call":
        sys.exit(_first_call_main(sys.argv[2:]))
    print("usage: python -m dlprim_py.bench.onnx first-call --onnx FILE [--batch N] "
          "[--image-size S]", file=sys.stderr)
    sys.exit(2)
