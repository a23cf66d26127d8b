"""Training steps of ``dp.models`` with ``dp.optim`` against the same models in PyTorch eager: the
``train`` suite of dlprim-bench and ``benchmarks/train.py``.

A step is what a training loop does: ``zero_grad``, forward (batch norm in training mode),
cross-entropy against int64 targets, backward, ``optimizer.step()``. The torch model is
torchvision's where it is importable, else the functional torch network of ``bench.nets`` (the
same state-dict keys); both start from one seeded state dict. The check runs one step of each
from that state (dropout off for that step) and compares the loss, and the first convolution's
and the classifier's weights after the update, with MIOpen's metric against PyTorch float32.
Times are wall clock around one step with the device drained.
"""
import numpy as np

from .harness import error_metric

NETS = ("resnet18", "resnet50", "mobilenet_v2")
OPTIMIZERS = {"sgd": ("SGD", dict(lr=0.01, momentum=0.9, weight_decay=1e-4)),
              "adamw": ("AdamW", dict(lr=1e-3, weight_decay=0.01))}


def torch_model(net, state, device):
    """(torchvision's model, or the functional torch net, holding ``state`` in training mode on
    ``device``, "torchvision" or "functional")."""
    import torch
    from . import nets
    try:
        import torchvision
    except ImportError:
        return _FunctionalTorch(nets.TorchNet(net, state, device, "float32", training=True)), \
            "functional"
    model = getattr(torchvision.models, net)(num_classes=nets.num_classes_of(net, state))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return model.to(device).train(), "torchvision"


class _FunctionalTorch:
    """``bench.nets.TorchNet`` with the module methods the step uses."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, x):
        return self.inner(x)

    def parameters(self):
        return self.inner.parameters()

    def named_parameters(self):
        from .nets import trainable
        return [(n, t) for n, t in self.inner.params.items() if trainable(n)]

    def modules(self):
        return ()


def _dropouts(model):
    return [m for m in model.modules() if type(m).__name__ == "Dropout"]


class TrainPair:
    """Our model and optimizer and PyTorch's, from one state dict, with their inputs.

    ``step()`` / ``torch_step()`` run one training step each; ``drain()`` / ``torch_drain()``
    wait for the devices."""

    def __init__(self, ctx, net, optimizer, batch, image_size, torch_device, seed=0):
        import torch
        import dlprim_py as dp
        from .. import nn
        from . import nets
        self.torch = torch
        self.ctx = ctx
        self.torch_device = torch_device
        state = nets.make_state_dict(net, seed=seed)
        classes = nets.num_classes_of(net, state)
        self.model = getattr(dp.models, net)(num_classes=classes, ctx=ctx)
        self.model.load_state_dict(state)
        self.model.train()
        self.torch_model, self.torch_kind = torch_model(net, state, torch_device)
        x, y = nets.make_inputs(batch, image_size, classes, seed + 1)
        self.x, self.y = dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, y)
        self.tx = torch.from_numpy(x).to(torch_device)
        self.ty = torch.from_numpy(y).to(torch_device)
        name, kwargs = OPTIMIZERS[optimizer]
        self.optimizer = getattr(dp.optim, name)(self.model.parameters(), **kwargs)
        self.torch_optimizer = getattr(torch.optim, name)(self.torch_model.parameters(), **kwargs)
        self.criterion = nn.CrossEntropyLoss(ctx=ctx)

    def step(self):
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(self.x), self.y)
        loss.backward()
        self.optimizer.step()
        return loss

    def torch_step(self):
        with self.torch.enable_grad():
            self.torch_optimizer.zero_grad()
            loss = self.torch.nn.functional.cross_entropy(self.torch_model(self.tx), self.ty)
            loss.backward()
            self.torch_optimizer.step()
        return loss

    def drain(self):
        self.ctx.synchronize()

    def torch_drain(self):
        if str(self.torch_device).startswith("cuda"):
            self.torch.cuda.synchronize()

    def check(self):
        """Errors of one step of each from the shared state (dropout off), each divided by its
        tolerance (so 1 is the limit): {"loss": relative difference / 1e-4, first conv weight
        name: metric / 1e-2, classifier weight name: metric / 1e-4}. Run it on a fresh pair: it
        takes a step."""
        ours_d, theirs_d = _dropouts(self.model), _dropouts(self.torch_model)
        saved = [m.p for m in ours_d], [m.p for m in theirs_d]
        for m in ours_d + theirs_d:
            m.p = 0.0
        loss = float(self.step().item())
        tloss = float(self.torch_step().item())
        for m, p in zip(ours_d, saved[0]):
            m.p = p
        for m, p in zip(theirs_d, saved[1]):
            m.p = p
        ours = dict(self.model.named_parameters())
        theirs = dict(self.torch_model.named_parameters())
        first = next(n for n, t in ours.items() if n.endswith("weight") and t.ndim == 4)
        last = [n for n, t in ours.items() if n.endswith("weight") and t.ndim == 2][-1]
        errors = {"loss": abs(loss - tloss) / max(abs(tloss), 1e-30) / 1e-4}
        for n, tolerance in ((first, 1e-2), (last, 1e-4)):
            errors[n] = error_metric(ours[n].numpy(),
                                     theirs[n].detach().cpu().numpy()) / tolerance
        return errors


def cases(bench):
    """The ``train`` suite: one training step of each of resnet18, resnet50 and mobilenet_v2
    (those of ``--nets``; all three when none of them is named) with SGD and with AdamW. On a
    GPU at ``--batch`` (default 32) on 224x224 images; with --quick or on a CPU at batch 2 on
    64x64 images. Wall clock with the device drained, PyTorch's the same way."""
    from .harness import Case, CaseSpec, Skip
    reference = getattr(bench, "reference", None)
    if reference is None or reference.torch is None or bench.torch is None:
        raise Skip("no PyTorch baseline: torch not importable")
    chosen = [n for n in getattr(bench, "nets", NETS) if n in NETS] or list(NETS)
    big = bench.ctx is not None and bench.ctx.info.is_gpu and not bench.quick
    batch, image = bench.batch or (32 if big else 2), 224 if big else 64
    specs = []
    for net in chosen:
        for optimizer in OPTIMIZERS:
            def prepare(net=net, optimizer=optimizer):
                device = bench.torch.device
                pair = TrainPair(bench.ctx, net, optimizer, batch, image, device)
                found = {}

                def verify():
                    # Errors relative to their tolerances, scaled to the harness's 1e-4.
                    errors = TrainPair(bench.ctx, net, optimizer, batch, image, device).check()
                    found.update(errors)
                    return max(errors.values()) * 1e-4

                def torch_run():
                    pair.torch_step()

                return Case(lambda: pair.step(), verify, work=0.0, unit="ms",
                            algorithm=optimizer, torch_run=torch_run, tolerance=1e-4,
                            params={"net": net, "optimizer": optimizer, "batch": batch,
                                    "image_size": image, "torch_model": pair.torch_kind,
                                    "errors": found},
                            wall_clock=True)
            specs.append(CaseSpec("train", f"{net} {optimizer} n{batch} {image}x{image}",
                                  prepare, group=net))
    return specs
