"""PyTorch as the baseline and as the float64 reference.

Baseline: the same work in PyTorch on the matching device, CUDA when the OpenCL device is an
NVIDIA GPU and ``torch.cuda.is_available()`` (TF32 off, so that cuBLAS/cuDNN compute in FP32 as
the library does), else the CPU. CUDA work is timed with ``torch.cuda.Event`` pairs, CPU work with
the host clock; the runs are sampled as the library's are (``Measurement.collect``: the median
of the timed runs after a warm-up, more runs while they spread widely).

Reference: float64 PyTorch on the baseline's device (a float64 convolution of a full layer is
far too slow on a host CPU when a GPU is there).
"""
import time

import numpy as np

from .harness import Skip


def import_torch():
    """The torch module, or None with the reason as a string."""
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising anything else
        return None, f"torch not importable ({type(e).__name__}: {e})"
    return torch, None


def baseline_device(torch, ctx):
    """"cuda" on an NVIDIA OpenCL device with CUDA available, else "cpu"."""
    try:
        if ctx.info.vendor == "nvidia" and torch.cuda.is_available():
            return "cuda"
    except Exception:
        pass
    return "cpu"


class TorchBaseline:
    """Times callables that run PyTorch work on ``device``; ``tf32`` sets torch's TF32 switches
    (cuBLAS and cuDNN) for a comparison with TF32 allowed on both sides (off by default: FP32
    as the library computes by default)."""

    def __init__(self, torch, device, tf32=False):
        self.torch = torch
        self.device = device
        self.tf32 = bool(tf32)
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.tf32
            torch.backends.cudnn.allow_tf32 = self.tf32
            # cuDNN benchmarks its algorithms on the first call of each shape (the warm-up),
            # as the library's find mode does.
            torch.backends.cudnn.benchmark = True

    def describe(self):
        t = self.torch
        info = {"version": t.__version__, "device": self.device, "tf32": self.tf32,
                "threads": t.get_num_threads()}
        if self.device == "cuda":
            info["cuda_device"] = t.cuda.get_device_name(0)
            info["cuda"] = t.version.cuda
            info["cudnn"] = t.backends.cudnn.version()
            info["cudnn_benchmark"] = True
        return info

    def tensor(self, array):
        """A float32 torch tensor on the baseline device holding ``array``."""
        return self.torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).to(self.device)

    def synchronize(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time(self, run, measurement, wall_clock=False):
        """Timing (seconds) of ``run()``, sampled as the library's work is
        (``measurement.collect``: warm-up, median of enough timed runs, more of them while they
        spread widely): one untimed call first, as the library's case ran once to be checked;
        device events, or with ``wall_clock`` the host's clock around the call and a drain."""
        torch = self.torch
        with torch.no_grad():
            run()
            self.synchronize()
            return measurement.collect(lambda: self._once(run, wall_clock))

    def median(self, run, warmup=3, repeat=10):
        """Median seconds of ``repeat`` timed runs of ``run()`` after ``warmup`` untimed ones."""
        for _ in range(warmup):
            run()
        self.synchronize()
        return float(np.median([self._once(run) for _ in range(repeat)]))

    def _once(self, run, wall_clock=False):
        if wall_clock:
            t0 = time.perf_counter()
            run()
            self.synchronize()
            return time.perf_counter() - t0
        if self.device == "cuda":
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0


class Reference:
    """float64 results computed with PyTorch (``compute``), or Skip when torch is missing."""

    def __init__(self, torch, device, reason=None):
        self.torch = torch
        self.device = device
        self.reason = reason

    def compute(self, fn, *arrays):
        """``fn(torch, *tensors)`` on float64 copies of ``arrays``; returns numpy float64 (or a
        tuple of them when ``fn`` returns a tuple)."""
        if self.torch is None:
            raise Skip(f"no reference: {self.reason}")
        torch = self.torch
        with torch.no_grad(), _no_cudnn_benchmark(torch):
            tensors = [torch.from_numpy(np.asarray(a, dtype=np.float64)).to(self.device)
                       for a in arrays]
            out = fn(torch, *tensors)
        if isinstance(out, (tuple, list)):
            return tuple(o.detach().cpu().numpy() for o in out)
        return out.detach().cpu().numpy()

    def compute_with_grad(self, fn, arrays, grad_of):
        """Gradients of ``sum(fn(*x) * dy)`` with respect to ``arrays[i]`` for i in ``grad_of``,
        where the last array is dy. float64 autograd on the reference device."""
        if self.torch is None:
            raise Skip(f"no reference: {self.reason}")
        torch = self.torch
        tensors = [torch.from_numpy(np.asarray(a, dtype=np.float64)).to(self.device)
                   for a in arrays]
        for i in grad_of:
            tensors[i].requires_grad_(True)
        with _no_cudnn_benchmark(torch):
            out = fn(torch, *tensors[:-1])
            grads = torch.autograd.grad(out, [tensors[i] for i in grad_of],
                                        grad_outputs=tensors[-1])
        return tuple(g.detach().cpu().numpy() for g in grads)


class _no_cudnn_benchmark:
    """A float64 reference runs once per shape: cuDNN's algorithm search would only cost time."""

    def __init__(self, torch):
        self.backends = torch.backends.cudnn

    def __enter__(self):
        self.saved = self.backends.benchmark
        self.backends.benchmark = False

    def __exit__(self, *exc):
        self.backends.benchmark = self.saved


def make(ctx, use_baseline=True):
    """(baseline or None, Reference, notes) for ``ctx``."""
    torch, reason = import_torch()
    if torch is None:
        return None, Reference(None, None, reason), reason
    device = baseline_device(torch, ctx)
    baseline = TorchBaseline(torch, device) if use_baseline else None
    return baseline, Reference(torch, device), None


def activation_reference(torch, desc, x):
    """act(x) in torch for an ``ActivationDesc`` (MIOpen's modes and the torch extras)."""
    from ..activation import Activation as A
    F = torch.nn.functional
    a, b, g = desc.alpha, desc.beta, desc.gamma
    m = desc.mode
    if m is A.PASTHRU:
        return x
    if m is A.LOGISTIC:
        return torch.sigmoid(x)
    if m is A.TANH:
        return b * torch.tanh(a * x)
    if m is A.RELU:
        return torch.relu(x)
    if m is A.SOFTRELU:
        return F.softplus(x)
    if m is A.ABS:
        return torch.abs(x)
    if m is A.POWER:
        return torch.pow(a + b * x, g)
    if m is A.CLIPPEDRELU:
        return torch.clamp(x, 0.0, a)
    if m is A.LEAKYRELU:
        return torch.where(x > 0, x, a * x)
    if m is A.ELU:
        return torch.where(x > 0, x, a * (torch.exp(x) - 1))
    if m is A.HARDTANH:
        return torch.clamp(x, a, b)
    if m is A.GELU:
        return F.gelu(x)
    if m is A.GELU_TANH:
        return F.gelu(x, approximate="tanh")
    if m is A.SILU:
        return F.silu(x)
    if m is A.HARDSWISH:
        return F.hardswish(x)
    if m is A.HARDSIGMOID:
        return F.hardsigmoid(x)
    raise ValueError(f"no torch reference for {m}")
