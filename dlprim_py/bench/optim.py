"""Suite ``optim`` (run when named with --suite): one optimizer step alone, the fused update of
``dlprim_py.optim`` against torch.optim's on the same parameters (foreach on CUDA, torch's
default), by wall clock with the device drained after each step, as a training loop sees it.

The parameters are ResNet-18's (62 tensors, 11.7 M weights; a handful of small ones with
--quick); rates are in GB/s of what a step must read and write (SGD with momentum: parameter,
gradient and momentum buffer; AdamW: parameter, gradient and both moments). Verification: one
step from fresh state against torch.optim's in float64.
"""
import numpy as np

from .harness import Case, CaseSpec, Skip, error_metric


def resnet18_shapes():
    """The shapes of torchvision's ResNet-18 parameters, in its order."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    channels = 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            first = block == 0
            shapes += [(width, channels, 3, 3), (width,), (width,), (width, width, 3, 3),
                       (width,), (width,)]
            if first and stage:
                shapes += [(width, channels, 1, 1), (width,), (width,)]
            channels = width
    return shapes + [(1000, 512), (1000,)]


# name -> (torch.optim class name, options, bytes read and written per element)
OPTIMIZERS = {
    "sgd momentum": ("SGD", dict(lr=0.01, momentum=0.9, weight_decay=1e-4), 5 * 4),
    "adamw": ("AdamW", dict(lr=1e-3, weight_decay=1e-2), 7 * 4),
}


def optim_case(bench, name):
    from .. import optim
    from ..tensor import Tensor
    kind, options, per_element = OPTIMIZERS[name]
    ctx = bench.ctx
    shapes = [(7, 5), (300,), (16, 3, 3, 3), (16,)] * 3 if bench.quick else resnet18_shapes()
    weights = [bench.random(s) for s in shapes]
    grads = [bench.random(s, -0.1, 0.1) for s in shapes]
    elements = sum(w.size for w in weights)

    def fresh():
        params = [Tensor.from_numpy(ctx, w, requires_grad=True) for w in weights]
        for p, g in zip(params, grads):
            p.grad = Tensor.from_numpy(ctx, g)
        return params, getattr(optim, kind)(params, **options)

    params, opt = fresh()
    opt.step()

    def reference():
        if bench.torch is None and getattr(bench, "reference", None) is None:
            raise Skip("no torch reference")
        import torch
        ref = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in weights]
        for r, g in zip(ref, grads):
            r.grad = torch.tensor(g, dtype=torch.float64)
        getattr(torch.optim, kind)(ref, **options).step()
        return np.concatenate([r.detach().numpy().ravel() for r in ref])

    expected = reference()

    def verify():
        mine, step_opt = fresh()
        step_opt.step()
        return error_metric(np.concatenate([p.numpy().ravel() for p in mine]), expected)

    torch_run = None
    if bench.torch is not None:
        tb = bench.torch
        # Copies: on the CPU a baseline tensor shares the numpy array's memory, and its steps
        # would move the weights that verification starts from.
        t_params = [tb.tensor(w.copy()).requires_grad_(True) for w in weights]
        for t, g in zip(t_params, grads):
            t.grad = tb.tensor(g.copy())
        t_opt = getattr(tb.torch.optim, kind)(t_params, **options)
        t_opt.step()
        torch_run = t_opt.step
    return Case(opt.step, verify, elements * per_element, "GB/s", algorithm=f"{kind} fused",
                torch_run=torch_run, wall_clock=True,
                params={"optimizer": kind, "options": options, "tensors": len(shapes),
                        "elements": elements})


def cases(bench):
    return [CaseSpec("optim", f"{name} step", lambda name=name: optim_case(bench, name))
            for name in OPTIMIZERS]
