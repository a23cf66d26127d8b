"""Whole networks written with ``dlprim_py.functional``, run as users run them, checked against
PyTorch in float64 and timed against PyTorch eager with the same weights.

Networks: ResNet-18, ResNet-50 and MobileNetV2 with torchvision's exact structure and parameter
names (``conv1.weight``, ``layer1.0.downsample.0.weight``, ``features.0.0.weight``,
``classifier.1.weight``, ...), so that ``torchvision.models.<net>().state_dict()`` converted to
numpy loads as is, and a state dict made here loads into torchvision with ``strict=True``.

One forward function per network is written against a ``torch.nn.functional``-like namespace
(``conv2d``, ``batch_norm``, ``relu``, ``relu6``, ``max_pool2d``, ``adaptive_avg_pool2d``,
``flatten``, ``linear``, residual ``+``), so the very same code runs on ``dlprim_py.functional``
(ours) and on ``torch.nn.functional`` (the reference in float64 and the eager baseline in
float32); ``check_torchvision`` compares the torch side with torchvision's own modules where
torchvision is installed. Nothing here imports torch or torchvision at import time.

    import dlprim_py as dp
    from dlprim_py.bench import nets
    state = nets.make_state_dict("resnet18", seed=0)          # numpy arrays, torch's shapes
    model = nets.DpNet(dp.Context(), "resnet18", state)        # inference (BN eval)
    logits = model(dp.Tensor.from_numpy(model.ctx, images))   # (N, 1000)

Modes: ``infer`` (BN with running statistics, no autograd) and ``train`` (one training step: BN
with batch statistics, forward, cross_entropy against int64 targets, backward to every
parameter). MobileNetV2's classifier Dropout(0.2) is left out (the identity, as in eval) in both
modes and in both libraries, so that the training step is deterministic and comparable.

``run_case`` checks a case against float64 PyTorch on the CPU (MIOpen's error metric, next to the
same metric of PyTorch float32 against float64), then times it: wall clock per call with the
device drained (``queue.finish()`` for ours, ``torch.cuda.synchronize()`` for PyTorch), median
after a warm-up, both in the same process; optionally the first call of a fresh process with
empty kernel caches and with the disk cache left by that run (``first_call_in_subprocess``).

Gradients of relu / relu6 / max-pool networks are discontinuous: an activation within rounding
of 0 or 6 (or a near-tie in a pooling window) can make float32 and float64 take different
branches, which moves a gradient by far more than rounding (seen: MobileNetV2, batch 2, 64x64,
one relu6 input 1.1e-6 from 0 gave a first-conv gradient error of 2.6e-4 against PyTorch
float32's 2.9e-6; at batch 32 on 224x224 such branch changes put both ours and PyTorch float32
near 1e-3). The check of a training step therefore lets the float64 reference follow our branch
at every kink (``RecordingOps`` / ``FollowingOps``, ``check_case(follow_kinks=...)``) and holds
ours to 1e-4 against it.

``python -m dlprim_py.bench.nets first-call ...`` is that subprocess (prints one JSON line);
``benchmarks/nets.py`` is the command-line benchmark; ``cases(bench)`` is the ``nets`` suite of
``dlprim-bench``.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import numpy as np

from .harness import error_metric

NETS = ("resnet18", "resnet50", "mobilenet_v2")
MODES = ("infer", "train")
BN_EPS = 1e-5
BN_MOMENTUM = 0.1
DEFAULT_CLASSES = 1000


# ---- the networks, written once against a functional namespace -----------------------------

class Ops:
    """The layers of the networks over a ``torch.nn.functional``-like namespace ``F`` and a
    mapping ``params`` from torchvision's state-dict names to tensors of that library."""

    def __init__(self, F, params, training=False, flatten=None):
        self.F = F
        self.p = params
        self.training = training
        # torch keeps flatten in the torch namespace, not in torch.nn.functional.
        self.flatten = flatten or F.flatten

    def conv(self, x, name, cin, cout, k, stride=1, padding=0, groups=1):
        # cin, cout, k describe the weight (the shape walk uses them); the weight carries them.
        return self.F.conv2d(x, self.p[name + ".weight"], None, stride, padding, 1, groups)

    def bn(self, x, name):
        p = self.p
        return self.F.batch_norm(x, p[name + ".running_mean"], p[name + ".running_var"],
                                 p[name + ".weight"], p[name + ".bias"], self.training,
                                 BN_MOMENTUM, BN_EPS)

    def relu(self, x):
        return self.F.relu(x)

    def relu6(self, x):
        return self.F.relu6(x)

    def max_pool(self, x):
        return self.F.max_pool2d(x, 3, 2, 1)

    def global_pool_flat(self, x):
        return self.flatten(self.F.adaptive_avg_pool2d(x, (1, 1)), 1)

    def linear(self, x, name, fin, fout):
        return self.F.linear(x, self.p[name + ".weight"], self.p[name + ".bias"])

    def add(self, a, b):
        return a + b


class ShapeOps:
    """Walks a network on shapes only and records every state-dict entry, in torchvision's
    order, as name -> (shape, kind); kind is "conv", "bn_weight", "bn_bias", "bn_mean", "bn_var",
    "bn_count", "fc_weight" or "fc_bias"."""

    def __init__(self):
        self.entries = OrderedDict()

    def conv(self, x, name, cin, cout, k, stride=1, padding=0, groups=1):
        n, c, h, w = x
        if c != cin:
            raise AssertionError(f"{name}: input has {c} channels, the layer takes {cin}")
        self.entries[name + ".weight"] = ((cout, cin // groups, k, k), "conv")
        ho = (h + 2 * padding - k) // stride + 1
        wo = (w + 2 * padding - k) // stride + 1
        return (n, cout, ho, wo)

    def bn(self, x, name):
        c = x[1]
        for suffix, kind in (("weight", "bn_weight"), ("bias", "bn_bias"),
                             ("running_mean", "bn_mean"), ("running_var", "bn_var")):
            self.entries[f"{name}.{suffix}"] = ((c,), kind)
        self.entries[name + ".num_batches_tracked"] = ((), "bn_count")
        return x

    def relu(self, x):
        return x

    relu6 = relu

    def max_pool(self, x):
        n, c, h, w = x
        return (n, c, (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1)

    def global_pool_flat(self, x):
        return (x[0], x[1])

    def linear(self, x, name, fin, fout):
        if x[1] != fin:
            raise AssertionError(f"{name}: input has {x[1]} features, the layer takes {fin}")
        self.entries[name + ".weight"] = ((fout, fin), "fc_weight")
        self.entries[name + ".bias"] = ((fout,), "fc_bias")
        return (x[0], fout)

    def add(self, a, b):
        if a != b:
            raise AssertionError(f"residual add of shapes {a} and {b}")
        return a


class RecordingOps(Ops):
    """Ours, keeping every branch decision at a kink of the network's piecewise-linear
    functions, in call order (``log``): which side of 0 each relu input is on (bool), which
    piece of relu6 each input is on (int8: 0 for <= 0, 1 between, 2 for >= 6), and the argmax of
    each max pool (int32 flat positions). ``FollowingOps`` replays them in the reference."""

    def __init__(self, F, params, training=False, log=None):
        super().__init__(F, params, training)
        self.log = [] if log is None else log

    def relu(self, x):
        self.log.append(("relu", x.numpy() > 0))
        return super().relu(x)

    def relu6(self, x):
        v = x.numpy()
        self.log.append(("relu6", (v > 0).astype(np.int8) + (v >= 6)))
        return super().relu6(x)

    def max_pool(self, x):
        y, index = self.F.max_pool2d(x, 3, 2, 1, return_indices=True)
        self.log.append(("max_pool", index.numpy().astype(np.int32)))
        return y


class FollowingOps(Ops):
    """The torch reference taking the branch ours took at every kink (from a RecordingOps log):
    relu(x) = x * [ours > 0], relu6(x) = x * [0 < ours < 6] + 6 * [ours >= 6], max pool = the
    element ours picked. Away from kinks this is exactly relu, relu6 and max pooling; at an
    input within rounding of 0 or 6, or a near-tie in a pooling window, the float64 reference
    would otherwise take the other branch and send the gradient elsewhere (a discontinuity of
    the derivative, not an error of either side)."""

    def __init__(self, torch, params, training, log):
        super().__init__(torch.nn.functional, params, training, torch.flatten)
        self.torch = torch
        self.log = list(log)
        self.position = 0

    def _next(self, kind, shape):
        got, value = self.log[self.position]
        self.position += 1
        if got != kind or tuple(value.shape) != tuple(shape):
            raise AssertionError(f"kink log out of step: expected {kind} {tuple(shape)}, "
                                 f"found {got} {value.shape}")
        return value

    def _mask(self, array, x):
        return self.torch.from_numpy(np.ascontiguousarray(array)).to(device=x.device,
                                                                     dtype=x.dtype)

    def relu(self, x):
        return x * self._mask(self._next("relu", x.shape), x)

    def relu6(self, x):
        piece = self._next("relu6", x.shape)
        return x * self._mask(piece == 1, x) + 6.0 * self._mask(piece == 2, x)

    def max_pool(self, x):
        n, c, h, w = x.shape
        ho, wo = (h + 2 - 3) // 2 + 1, (w + 2 - 3) // 2 + 1
        index = self._next("max_pool", (n, c, ho, wo))
        index = self.torch.from_numpy(index.astype(np.int64)).to(x.device)
        return x.reshape(n, c, h * w).gather(2, index.reshape(n, c, ho * wo)).reshape(
            n, c, ho, wo)


def _basic_block(ops, x, name, inplanes, planes, stride):
    """torchvision.models.resnet.BasicBlock (expansion 1)."""
    out = ops.conv(x, f"{name}.conv1", inplanes, planes, 3, stride, 1)
    out = ops.relu(ops.bn(out, f"{name}.bn1"))
    out = ops.conv(out, f"{name}.conv2", planes, planes, 3, 1, 1)
    out = ops.bn(out, f"{name}.bn2")
    identity = x
    if stride != 1 or inplanes != planes:
        identity = ops.bn(ops.conv(x, f"{name}.downsample.0", inplanes, planes, 1, stride),
                          f"{name}.downsample.1")
    return ops.relu(ops.add(out, identity)), planes


def _bottleneck(ops, x, name, inplanes, planes, stride):
    """torchvision.models.resnet.Bottleneck (expansion 4, the stride on the 3x3: ResNet v1.5)."""
    width, outp = planes, planes * 4
    out = ops.relu(ops.bn(ops.conv(x, f"{name}.conv1", inplanes, width, 1), f"{name}.bn1"))
    out = ops.relu(ops.bn(ops.conv(out, f"{name}.conv2", width, width, 3, stride, 1),
                          f"{name}.bn2"))
    out = ops.bn(ops.conv(out, f"{name}.conv3", width, outp, 1), f"{name}.bn3")
    identity = x
    if stride != 1 or inplanes != outp:
        identity = ops.bn(ops.conv(x, f"{name}.downsample.0", inplanes, outp, 1, stride),
                          f"{name}.downsample.1")
    return ops.relu(ops.add(out, identity)), outp


def _resnet(block, layers):
    def forward(ops, x, num_classes=DEFAULT_CLASSES):
        x = ops.relu(ops.bn(ops.conv(x, "conv1", 3, 64, 7, 2, 3), "bn1"))
        x = ops.max_pool(x)
        inplanes = 64
        for i, (planes, count) in enumerate(zip((64, 128, 256, 512), layers)):
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                x, inplanes = block(ops, x, f"layer{i + 1}.{j}", inplanes, planes, stride)
        x = ops.global_pool_flat(x)
        return ops.linear(x, "fc", inplanes, num_classes)
    return forward


# (expand ratio t, output channels c, repeats n, first stride s): torchvision's settings.
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _conv_bn_relu6(ops, x, name, cin, cout, k, stride=1, groups=1):
    """torchvision.ops.Conv2dNormActivation(activation_layer=ReLU6): {name}.0 conv, {name}.1 BN."""
    x = ops.conv(x, f"{name}.0", cin, cout, k, stride, (k - 1) // 2, groups)
    return ops.relu6(ops.bn(x, f"{name}.1"))


def _inverted_residual(ops, x, name, inp, oup, stride, t):
    """torchvision.models.mobilenetv2.InvertedResidual; its layers are {name}.conv.<i>."""
    hidden = int(round(inp * t))
    k = 0
    out = x
    if t != 1:
        out = _conv_bn_relu6(ops, out, f"{name}.conv.{k}", inp, hidden, 1)
        k += 1
    out = _conv_bn_relu6(ops, out, f"{name}.conv.{k}", hidden, hidden, 3, stride, hidden)
    out = ops.conv(out, f"{name}.conv.{k + 1}", hidden, oup, 1)
    out = ops.bn(out, f"{name}.conv.{k + 2}")
    if stride == 1 and inp == oup:
        out = ops.add(x, out)
    return out


def _mobilenet_v2(ops, x, num_classes=DEFAULT_CLASSES):
    """torchvision.models.mobilenet_v2 (width 1.0); the classifier's Dropout(0.2) is left out."""
    x = _conv_bn_relu6(ops, x, "features.0", 3, 32, 3, 2)
    cin, index = 32, 1
    for t, c, n, s in MOBILENET_V2_SETTINGS:
        for i in range(n):
            x = _inverted_residual(ops, x, f"features.{index}", cin, c, s if i == 0 else 1, t)
            cin, index = c, index + 1
    x = _conv_bn_relu6(ops, x, f"features.{index}", cin, 1280, 1)
    x = ops.global_pool_flat(x)
    return ops.linear(x, "classifier.1", 1280, num_classes)


FORWARD = {
    "resnet18": _resnet(_basic_block, (2, 2, 2, 2)),
    "resnet50": _resnet(_bottleneck, (3, 4, 6, 3)),
    "mobilenet_v2": _mobilenet_v2,
}

# The state-dict name of each network's first convolution and of its classifier's weight.
FIRST_CONV = {"resnet18": "conv1.weight", "resnet50": "conv1.weight",
              "mobilenet_v2": "features.0.0.weight"}
LAST_FC = {"resnet18": "fc.weight", "resnet50": "fc.weight", "mobilenet_v2": "classifier.1.weight"}
FIRST_BN = {"resnet18": "bn1", "resnet50": "bn1", "mobilenet_v2": "features.0.1"}


def _check_net(net):
    if net not in FORWARD:
        raise ValueError(f"unknown network {net!r}; known: {', '.join(NETS)}")


def forward(net, ops, x, num_classes=DEFAULT_CLASSES):
    """The logits of network ``net`` for images ``x`` through the layers of ``ops``."""
    _check_net(net)
    return FORWARD[net](ops, x, num_classes)


def state_dict_spec(net, num_classes=DEFAULT_CLASSES, image_size=224):
    """OrderedDict name -> (shape, kind) of torchvision's state dict of ``net``."""
    walk = ShapeOps()
    forward(net, walk, (1, 3, image_size, image_size), num_classes)
    return walk.entries


def make_state_dict(net, seed=0, num_classes=DEFAULT_CLASSES):
    """A random state dict of ``net`` (numpy, torchvision's names, shapes and order), seeded.

    Convolutions: He normal (std sqrt(2 / fan_in)); BN: weight U(0.5, 1), bias U(-0.1, 0.1),
    running mean U(-0.1, 0.1), running variance U(0.5, 1.5), and the last BN of every residual
    branch with its weight scaled by 0.25 so that the inference activations stay of order one
    through the residual sums; the classifier: std 1 / sqrt(fan_in), bias U(-0.1, 0.1).
    ``num_batches_tracked`` are int64 zeros (0-d), as torch keeps them."""
    rng = np.random.default_rng(seed)
    state = OrderedDict()
    residual_last = _residual_branch_last_bn(net)
    for name, (shape, kind) in state_dict_spec(net, num_classes).items():
        if kind == "conv":
            fan_in = math.prod(shape[1:])
            value = rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
        elif kind == "bn_weight":
            value = rng.uniform(0.5, 1.0, shape)
            if name[:-len(".weight")] in residual_last:
                value *= 0.25
        elif kind in ("bn_bias", "bn_mean", "fc_bias"):
            value = rng.uniform(-0.1, 0.1, shape)
        elif kind == "bn_var":
            value = rng.uniform(0.5, 1.5, shape)
        elif kind == "fc_weight":
            value = rng.standard_normal(shape) / math.sqrt(shape[1])
        elif kind == "bn_count":
            state[name] = np.zeros((), np.int64)
            continue
        else:
            raise AssertionError(kind)
        state[name] = np.asarray(value, np.float32)
    return state


def _residual_branch_last_bn(net):
    """Names of the BNs that end a residual branch (the ones added to an identity)."""
    names = set()
    for name in state_dict_spec(net):
        if net == "resnet18" and name.endswith(".bn2.weight"):
            names.add(name[:-len(".weight")])
        elif net == "resnet50" and name.endswith(".bn3.weight"):
            names.add(name[:-len(".weight")])
    if net == "mobilenet_v2":
        cin, index = 32, 1
        for t, c, n, s in MOBILENET_V2_SETTINGS:
            for i in range(n):
                if (s if i == 0 else 1) == 1 and cin == c:
                    names.add(f"features.{index}.conv.{3 if t != 1 else 2}")
                cin, index = c, index + 1
    return names


def trainable(name):
    """Whether a state-dict entry is a parameter (torch's ``named_parameters``), not a buffer."""
    return not (name.endswith(".running_mean") or name.endswith(".running_var")
                or name.endswith(".num_batches_tracked"))


def float_entries(state):
    """The (name, value) entries of ``state`` that a network computes with: all but the BN
    batch counters (``num_batches_tracked``)."""
    return ((name, value) for name, value in state.items()
            if not name.endswith(".num_batches_tracked"))


def make_inputs(batch, image_size=224, num_classes=DEFAULT_CLASSES, seed=1):
    """Seeded images N(0, 1) (N, 3, S, S) float32 and int64 class targets (N,)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, image_size, image_size)).astype(np.float32)
    target = rng.integers(0, num_classes, size=batch).astype(np.int64)
    return x, target


def num_classes_of(net, state):
    return int(state[LAST_FC[net]].shape[0])


# ---- ours: dlprim_py ------------------------------------------------------------------------

class DpNet:
    """Network ``net`` on ``ctx`` with the weights of the numpy ``state`` (float32 tensors;
    parameters ``requires_grad`` in training mode). ``model(x)`` returns the logits."""

    def __init__(self, ctx, net, state, training=False, record_kinks=False):
        import dlprim_py as dp
        _check_net(net)
        self.ctx = ctx
        self.net = net
        self.training = training
        self.num_classes = num_classes_of(net, state)
        self.params = OrderedDict()
        for name, value in float_entries(state):
            self.params[name] = dp.Tensor.from_numpy(
                ctx, np.ascontiguousarray(value, np.float32),
                requires_grad=training and trainable(name))
        # record_kinks: keep the branch taken at every relu / relu6 / max pool (kink_log) for a
        # reference that follows it (TorchNet(follow=...)); it reads every activation back.
        self.ops = (RecordingOps(dp.functional, self.params, training) if record_kinks
                    else Ops(dp.functional, self.params, training))

    @property
    def kink_log(self):
        return getattr(self.ops, "log", None)

    def parameters(self):
        return [t for n, t in self.params.items() if trainable(n)]

    def __call__(self, x):
        if self.training:
            return forward(self.net, self.ops, x, self.num_classes)
        from ..autograd import no_grad
        with no_grad():
            return forward(self.net, self.ops, x, self.num_classes)

    def zero_grad(self):
        for t in self.parameters():
            t.grad = None

    def train_step(self, x, target):
        """One training step (no optimizer update): gradients land in ``.grad`` of every
        parameter (cleared first); returns the loss tensor."""
        import dlprim_py.functional as F
        self.zero_grad()
        loss = F.cross_entropy(self(x), target)
        loss.backward()
        return loss

    def grad(self, name):
        return self.params[name].grad


# ---- the reference and the baseline: torch.nn.functional ----------------------------------

class TorchNet:
    """The same network in ``torch.nn.functional`` on ``device`` in ``dtype`` (float64 for the
    reference, float32 for the baseline)."""

    def __init__(self, net, state, device="cpu", dtype="float64", training=False, follow=None):
        import torch
        _check_net(net)
        self.torch = torch
        self.net = net
        self.device = device
        self.dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.training = training
        self.num_classes = num_classes_of(net, state)
        self.params = OrderedDict()
        for name, value in float_entries(state):
            t = torch.from_numpy(np.array(value)).to(device=device, dtype=self.dtype)
            if training and trainable(name):
                t.requires_grad_(True)
            self.params[name] = t
        # follow: a DpNet's kink_log; the net then takes ours' branch at every kink (one call).
        self.ops = (FollowingOps(torch, self.params, training, follow) if follow is not None
                    else Ops(torch.nn.functional, self.params, training, torch.flatten))

    def tensor(self, array):
        t = self.torch.from_numpy(np.ascontiguousarray(array))
        if t.is_floating_point():
            t = t.to(dtype=self.dtype)
        return t.to(self.device)

    def parameters(self):
        return [t for n, t in self.params.items() if trainable(n)]

    def __call__(self, x):
        if self.training:
            return forward(self.net, self.ops, x, self.num_classes)
        with self.torch.no_grad():
            return forward(self.net, self.ops, x, self.num_classes)

    def zero_grad(self):
        for t in self.parameters():
            t.grad = None

    def train_step(self, x, target):
        self.zero_grad()
        loss = self.torch.nn.functional.cross_entropy(self(x), target)
        loss.backward()
        return loss

    def grad(self, name):
        return self.params[name].grad

    def synchronize(self):
        if str(self.device).startswith("cuda"):
            self.torch.cuda.synchronize()


def check_torchvision(net, state, device="cpu", dtype="float64", batch=2, image_size=64,
                      limit=None):
    """Compare the functional torch net with torchvision's own model loaded with ``state``
    (``load_state_dict(strict=True)``): the same state-dict names, order and shapes; the same
    logits in eval mode; and in a training step (train mode, its Dropout modules at p=0) the same
    loss, first-convolution weight gradient and first BN running variance. Returns a dict:
    ``status`` ("ok", "skipped: ..." or "failed: ..."), ``error`` (the largest error metric)."""
    try:
        import torch
        import torchvision
    except Exception as e:  # ImportError or a broken install
        return {"status": f"skipped: torchvision not importable ({type(e).__name__}: {e})"}
    num_classes = num_classes_of(net, state)
    model = getattr(torchvision.models, net)(weights=None, num_classes=num_classes)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = {k: tuple(np.shape(v)) for k, v in state.items()}
    if theirs != ours:
        missing = sorted(set(theirs) - set(ours))[:5]
        extra = sorted(set(ours) - set(theirs))[:5]
        shapes = sorted(k for k in set(theirs) & set(ours) if theirs[k] != ours[k])[:5]
        return {"status": f"failed: state dict differs: missing {missing}, extra {extra}, "
                          f"shapes differ {shapes}"}
    if list(theirs) != list(ours):
        return {"status": "failed: state dict order differs from torchvision's"}
    loaded = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
    dt = getattr(torch, dtype)
    x, target = make_inputs(batch, image_size, num_classes, seed=7)
    errors = {}
    # Eval: the logits.
    model.load_state_dict(loaded, strict=True)
    model = model.to(device=device, dtype=dt).eval()
    ref = TorchNet(net, state, device, dt)
    with torch.no_grad():
        errors["eval logits"] = error_metric(ref(ref.tensor(x)).cpu().double().numpy(),
                                             model(ref.tensor(x)).cpu().double().numpy())
    # A training step from the same state.
    model.load_state_dict(loaded, strict=True)
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    loss = torch.nn.functional.cross_entropy(model(ref.tensor(x)), ref.tensor(target))
    loss.backward()
    named = dict(model.named_parameters())
    bn = FIRST_BN[net]
    theirs_train = {"loss": loss.detach(), "grad " + FIRST_CONV[net]: named[FIRST_CONV[net]].grad,
                    f"{bn}.running_var after": model.state_dict()[bn + ".running_var"]}
    ours_train = torch_results(TorchNet(net, state, device, dt, training=True), x, target,
                               "train")
    for k, v in theirs_train.items():
        errors["train " + k] = error_metric(ours_train[k], v.detach().cpu().double().numpy())
    limit = limit if limit is not None else (1e-12 if dtype == "float64" else 1e-5)
    worst = max(errors.values())
    status = "ok" if worst <= limit else f"failed: {errors}"
    return {"status": status, "error": worst, "errors": errors, "entries": len(ours)}


# ---- checks -------------------------------------------------------------------------------

def tolerance_for(torch32_error, factor=10.0, floor=1e-4):
    """The acceptable error of ours: within ``factor`` x PyTorch float32's own error against
    float64, or below ``floor``."""
    return max(factor * (torch32_error or 0.0), floor)


def dp_results(model, x_np, target_np, mode):
    """Ours on numpy inputs: {"out": logits} (infer), or (train) the loss, the weight gradients
    of the first convolution and of the classifier, and the first BN's running variance after
    the step (batch statistics folded in with momentum 0.1, the unbiased variance)."""
    import dlprim_py as dp
    ctx = model.ctx
    x = dp.Tensor.from_numpy(ctx, x_np)
    if mode == "infer":
        return {"out": model(x).numpy()}
    target = dp.Tensor.from_numpy(ctx, target_np)
    loss = model.train_step(x, target)
    bn = FIRST_BN[model.net]
    return {"loss": loss.numpy().reshape(()),
            "grad " + FIRST_CONV[model.net]: model.grad(FIRST_CONV[model.net]).numpy(),
            "grad " + LAST_FC[model.net]: model.grad(LAST_FC[model.net]).numpy(),
            f"{bn}.running_var after": model.params[bn + ".running_var"].numpy()}


def torch_results(model, x_np, target_np, mode):
    """The same quantities as ``dp_results`` from a TorchNet, as float64 numpy."""
    x = model.tensor(x_np)
    if mode == "infer":
        out = {"out": model(x)}
    else:
        loss = model.train_step(x, model.tensor(target_np))
        bn = FIRST_BN[model.net]
        out = {"loss": loss.reshape(()),
               "grad " + FIRST_CONV[model.net]: model.grad(FIRST_CONV[model.net]),
               "grad " + LAST_FC[model.net]: model.grad(LAST_FC[model.net]),
               f"{bn}.running_var after": model.params[bn + ".running_var"]}
    return {k: v.detach().cpu().double().numpy() for k, v in out.items()}


def compare(ours, torch32, ref, factor=10.0, floor=1e-4, ref_for_torch32=None,
            torch32_sets_tolerance=True):
    """Per quantity: our error against ``ref``, PyTorch float32's error against
    ``ref_for_torch32`` (default ``ref``; None when ``torch32`` is None), the tolerance
    (``tolerance_for``; only ``floor`` when not ``torch32_sets_tolerance``) and whether ours
    passes. Returns (ok, {name: {...}})."""
    detail, ok = {}, True
    ref32 = ref if ref_for_torch32 is None else ref_for_torch32
    for name, r in ref.items():
        err = error_metric(ours[name], r)
        t32 = error_metric(torch32[name], ref32[name]) if torch32 is not None else None
        tol = tolerance_for(t32 if torch32_sets_tolerance else None, factor, floor)
        passed = bool(err <= tol)
        ok &= passed
        detail[name] = {"error": err, "torch32_error": t32, "tolerance": tol, "ok": passed}
    return ok, detail


def check_case(ctx, net, mode, state, x_np, target_np, torch32_device=None, ref_device="cpu",
               follow_kinks=None, factor=10.0, floor=1e-4):
    """Ours against float64 PyTorch on ``ref_device`` (the quantities of ``dp_results``: logits
    for "infer"; the loss, the first convolution's and the classifier's weight gradients and the
    first BN's running variance for "train"), next to PyTorch float32 on ``torch32_device``
    (None: not run) against the plain float64 reference.

    ``follow_kinks`` (None: for training steps): the float64 reference takes our branch at every
    relu / relu6 / max pool (FollowingOps), so that an activation within rounding of a kink
    cannot send the two gradients different ways. Ours must then be within ``floor`` of it:
    PyTorch float32's error (reported, against the plain reference) holds its own branch
    changes and is no yardstick (at batch 32 on 224x224 they put it near 1e-3). Following reads
    every activation of ours back to the host and keeps one byte per relu / relu6 element
    (under a GB for these networks at batch 32 on 224x224). Returns (ok, detail, kinks) where
    ``kinks`` is the number of branch decisions followed (0 when not following)."""
    training = mode == "train"
    if follow_kinks is None:
        follow_kinks = training
    model = DpNet(ctx, net, state, training, record_kinks=follow_kinks)
    ours = dp_results(model, x_np, target_np, mode)
    plain = ref = None
    kinks = 0
    if not follow_kinks or torch32_device is not None:
        # PyTorch float32 is measured against the plain reference (its own kinks are its own).
        plain = ref = torch_results(TorchNet(net, state, ref_device, "float64", training), x_np,
                                    target_np, mode)
    if follow_kinks:
        log = model.kink_log
        kinks = sum(int(v.size) for _, v in log)
        ref = torch_results(TorchNet(net, state, ref_device, "float64", training, follow=log),
                            x_np, target_np, mode)
    del model
    t32 = None
    if torch32_device is not None:
        t32 = torch_results(TorchNet(net, state, torch32_device, "float32", training), x_np,
                            target_np, mode)
    ok, detail = compare(ours, t32, ref, factor, floor, ref_for_torch32=plain,
                         torch32_sets_tolerance=not follow_kinks)
    return ok, detail, kinks


# ---- timing -------------------------------------------------------------------------------

def wall_times(call, drain, warmup=3, repeat=10, budget_s=None):
    """Seconds per call of ``call(); drain()`` for ``repeat`` calls after ``warmup`` untimed
    ones (fewer repeats when ``budget_s`` is reached, at least 3)."""
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


def paired_wall_times(ours, ours_drain, theirs, theirs_drain, warmup=3, repeat=10, rounds=3):
    """``wall_times`` of two calls taken in alternating rounds (ours, theirs, ours, ...), each
    round ``repeat`` calls after ``warmup``: a drift of the device's clocks or of the host during
    the measurement then falls on both sides rather than on whichever ran first. Returns the two
    arrays of ``rounds * repeat`` samples."""
    mine, other = [], []
    for _ in range(rounds):
        mine.append(wall_times(ours, ours_drain, warmup, repeat))
        other.append(wall_times(theirs, theirs_drain, warmup, repeat))
    return np.concatenate(mine), np.concatenate(other)


def _summary_ms(samples):
    return {"median_ms": float(np.median(samples)) * 1e3,
            "p20_ms": float(np.percentile(samples, 20)) * 1e3,
            "p80_ms": float(np.percentile(samples, 80)) * 1e3,
            "repeats": int(len(samples))}


def torch_device_for(ctx=None, prefer=None):
    """``prefer`` when given, else "cuda" when torch has CUDA, else "cpu"."""
    import torch
    if prefer:
        return prefer
    return "cuda" if torch.cuda.is_available() else "cpu"


def setup_torch_baseline(device):
    """TF32 off (FP32 as ours), cuDNN's algorithm search on (its warm-up finds the best)."""
    import torch
    if str(device).startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True


def _call(model, mode, x, target):
    """What one timed call is: an inference, or a training step (DpNet or TorchNet)."""
    if mode == "infer":
        return lambda: model(x)
    return lambda: model.train_step(x, target)


def run_case(ctx, net, mode, batch, image_size=224, num_classes=DEFAULT_CLASSES, seed=0,
             torch_device=None, warmup=3, repeat=10, budget_s=None, check=True, ref_device="cpu",
             first_call=False, factor=10.0, floor=1e-4, follow_kinks=None, log=None):
    """Check, then time one (net, mode, batch) case; returns a JSON-ready dict.

    ``torch_device``: where PyTorch float32 runs (None: CUDA when available, else CPU; "" or
    "none": no PyTorch timing). ``ref_device``: where the float64 reference runs. ``first_call``:
    also measure the first call of fresh processes (empty caches, then warm disk cache).
    ``follow_kinks``: see ``check_case``."""
    import dlprim_py as dp
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    log = log or (lambda *a: None)
    training = mode == "train"
    result = {"net": net, "mode": mode, "batch": batch, "image_size": image_size,
              "num_classes": num_classes, "status": "ok"}
    state = make_state_dict(net, seed, num_classes)
    x_np, target_np = make_inputs(batch, image_size, num_classes, seed + 1)

    # Ours: the first call of this process (kernels built, or read from the disk cache), timed
    # on its own; the check below runs on fresh models (training steps change running stats).
    model = DpNet(ctx, net, state, training)
    x = dp.Tensor.from_numpy(ctx, x_np)
    target = dp.Tensor.from_numpy(ctx, target_np)
    ctx.queue.finish()
    call = _call(model, mode, x, target)
    t0 = time.perf_counter()
    call()
    ctx.queue.finish()
    result["ours_first_call_ms"] = (time.perf_counter() - t0) * 1e3
    log(f"{net} {mode} {batch}: ours first call {result['ours_first_call_ms']:.0f} ms")

    torch_model = None
    if torch_device not in ("", "none"):
        try:
            device = torch_device_for(ctx, torch_device)
            setup_torch_baseline(device)
            torch_model = TorchNet(net, state, device, "float32", training)
            result["torch_device"] = device
        except ImportError as e:
            result["torch_note"] = f"torch not importable: {e}"

    if check:
        ok, detail, kinks = check_case(ctx, net, mode, state, x_np, target_np,
                                       torch_model.device if torch_model is not None else None,
                                       ref_device, follow_kinks, factor, floor)
        result["check"] = detail
        result["kinks_followed"] = kinks
        result["error"] = max(d["error"] for d in detail.values())
        t32s = [d["torch32_error"] for d in detail.values() if d["torch32_error"] is not None]
        result["torch32_error"] = max(t32s) if t32s else None
        if not ok:
            bad = [f"{k} {d['error']:.3g} > {d['tolerance']:.3g}" for k, d in detail.items()
                   if not d["ok"]]
            result["status"] = "failed check: " + "; ".join(bad)
        t32 = result["torch32_error"]
        log(f"{net} {mode} {batch}: error {result['error']:.3g} (torch fp32 "
            f"{'-' if t32 is None else format(t32, '.3g')})")

    samples = wall_times(call, ctx.queue.finish, warmup, repeat, budget_s)
    result["ours"] = _summary_ms(samples)
    result["ours_ms"] = result["ours"]["median_ms"]
    del model, call

    if torch_model is not None:
        tx = torch_model.tensor(x_np)
        ttarget = torch_model.tensor(target_np)
        tcall = _call(torch_model, mode, tx, ttarget)
        t0 = time.perf_counter()
        tcall()
        torch_model.synchronize()
        result["torch_first_call_ms"] = (time.perf_counter() - t0) * 1e3
        samples = wall_times(tcall, torch_model.synchronize, warmup, repeat, budget_s)
        result["torch"] = _summary_ms(samples)
        result["torch_ms"] = result["torch"]["median_ms"]
        result["ratio"] = result["torch_ms"] / result["ours_ms"]
        del torch_model, tcall

    if first_call:
        result["first_call"] = first_call_in_subprocess(net, mode, batch, image_size, num_classes,
                                                        seed)
    ctx.empty_cache()
    return result


# ---- the first call of a fresh process ------------------------------------------------------

def first_call(net, mode, batch, image_size=224, num_classes=DEFAULT_CLASSES, seed=0,
               device=None):
    """In this process: context, upload, then the first and the second call, each timed with
    the device drained. Returns a dict of milliseconds."""
    t_start = time.perf_counter()
    import dlprim_py as dp
    t_import = time.perf_counter()
    ctx = dp.Context(device)
    t_ctx = time.perf_counter()
    state = make_state_dict(net, seed, num_classes)
    x_np, target_np = make_inputs(batch, image_size, num_classes, seed + 1)
    model = DpNet(ctx, net, state, mode == "train")
    x = dp.Tensor.from_numpy(ctx, x_np)
    target = dp.Tensor.from_numpy(ctx, target_np)
    ctx.queue.finish()
    t_upload = time.perf_counter()
    call = _call(model, mode, x, target)
    call()
    ctx.queue.finish()
    t_first = time.perf_counter()
    call()
    ctx.queue.finish()
    t_second = time.perf_counter()
    return {"import_ms": (t_import - t_start) * 1e3, "context_ms": (t_ctx - t_import) * 1e3,
            "upload_ms": (t_upload - t_ctx) * 1e3, "first_ms": (t_first - t_upload) * 1e3,
            "second_ms": (t_second - t_first) * 1e3}


def first_call_in_subprocess(net, mode, batch, image_size=224, num_classes=DEFAULT_CLASSES,
                             seed=0, device=None, timeout=1800):
    """The first call of two fresh processes sharing a new, empty cache directory: ``cold``
    (no kernel binary anywhere: DLPRIM_CACHE_DIR, and the driver caches PoCL and NVIDIA keep,
    point into it) and ``warm_disk`` (the binaries the first one wrote)."""
    command = [sys.executable, "-m", "dlprim_py.bench.nets", "first-call", "--net", net,
               "--mode", mode, "--batch", str(batch), "--image-size", str(image_size),
               "--num-classes", str(num_classes), "--seed", str(seed)]
    if device:
        command += ["--device", str(device)]
    return cold_then_warm(command, timeout, "dlprim-nets-cache-")


def cold_then_warm(command, timeout, prefix):
    """Run ``command`` (a first call that prints its figures as a JSON line) in two fresh
    processes sharing a new, empty cache directory: {"cold": ..., "warm_disk": ...}, or an
    "error" entry for a run that failed or timed out (the second is then not run)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        env = dict(os.environ, DLPRIM_CACHE_DIR=os.path.join(tmp, "dlprim"),
                   POCL_CACHE_DIR=os.path.join(tmp, "pocl"),
                   CUDA_CACHE_PATH=os.path.join(tmp, "nv"))
        env.pop("DLPRIM_NO_CACHE", None)
        for label in ("cold", "warm_disk"):
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                out[label] = {"error": f"timed out after {timeout} s"}
                break
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            if done.returncode != 0 or not lines:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                out[label] = {"error": f"exit {done.returncode}: {' | '.join(tail)}"}
                break
            out[label] = json.loads(lines[-1])
    return out


# ---- dlprim-bench suite "nets" -------------------------------------------------------------

def cases(bench):
    """The ``nets`` suite of dlprim-bench: inference and one training step of every network of
    ``--nets`` that is defined here (resnet50 and mobilenet_v2; resnet18 runs from
    benchmarks/nets.py). On a GPU: inference at ``--batch`` (default 64) and training at
    ``--batch`` (default 32), 224x224 images; with --quick or on a CPU: inference at batch 1
    and training at batch 2 (or ``--batch``), 64x64 images. Times are wall clock with the
    device drained after each call, PyTorch's the same way; the check is the float64 reference
    (``check_case``)."""
    from .harness import CaseSpec
    nets = [n for n in getattr(bench, "nets", NETS) if n in FORWARD]
    big = bench.ctx is not None and bench.ctx.info.is_gpu and not bench.quick
    image = 224 if big else 64
    batches = {"infer": bench.batch or (64 if big else 1),
               "train": bench.batch or (32 if big else 2)}
    specs = []
    for net in nets:
        for mode in MODES:
            b = batches[mode]
            specs.append(CaseSpec("nets", f"{net} {mode} n{b} {image}x{image}",
                                  lambda net=net, mode=mode, b=b: net_case(bench, net, mode, b,
                                                                           image),
                                  group=net))
    return specs


def net_case(bench, net, mode, batch, image_size):
    """A harness Case: run() is one inference or one training step; verify() the largest error
    against the float64 reference relative to its tolerance (``check_case``: for inference 1e-4
    or 10x PyTorch float32's own error when the baseline is there, for a training step 1e-4
    against the reference that follows our kinks), scaled to the harness's tolerance of 1e-4."""
    import dlprim_py as dp
    from .harness import Case, Skip
    ctx = bench.ctx
    reference = getattr(bench, "reference", None)
    if reference is None or reference.torch is None:
        raise Skip("no float64 reference: torch not importable")
    training = mode == "train"
    state = make_state_dict(net, 0, DEFAULT_CLASSES)
    x_np, target_np = make_inputs(batch, image_size, DEFAULT_CLASSES, 1)
    model = DpNet(ctx, net, state, training)
    x = dp.Tensor.from_numpy(ctx, x_np)
    target = dp.Tensor.from_numpy(ctx, target_np)
    call = _call(model, mode, x, target)
    found = {}

    def verify():
        ok, detail, kinks = check_case(ctx, net, mode, state, x_np, target_np,
                                       bench.torch.device if bench.torch is not None else None,
                                       reference.device)
        found["detail"] = detail
        found["kinks_followed"] = kinks
        # The harness compares one number with one tolerance: the worst error relative to its
        # own tolerance, scaled to the tolerance given to the harness (1e-4).
        return max(d["error"] / d["tolerance"] for d in detail.values()) * 1e-4

    torch_run = None
    if bench.torch is not None:
        torch_run = _torch_run(net, state, bench.torch.device, mode, x_np, target_np)
    params = {"net": net, "mode": mode, "batch": batch, "image_size": image_size,
              "check": found}
    return Case(call, verify, work=0.0, unit="ms", algorithm=mode, torch_run=torch_run,
                tolerance=1e-4, params=params, wall_clock=True)


def _torch_run(net, state, device, mode, x_np, target_np):
    """The baseline's callable: PyTorch float32 on ``device``, with autograd on for a training
    step (the harness times the baseline under torch.no_grad())."""
    tm = TorchNet(net, state, device, "float32", mode == "train")
    call = _call(tm, mode, tm.tensor(x_np), tm.tensor(target_np))

    def run():
        with tm.torch.enable_grad():
            call()
    return run


# ---- python -m dlprim_py.bench.nets first-call ... -----------------------------------------

def _main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m dlprim_py.bench.nets",
                                     description="The first call of a network in this fresh "
                                                 "process (one JSON line on stdout).")
    parser.add_argument("what", choices=["first-call"])
    parser.add_argument("--net", choices=NETS, required=True)
    parser.add_argument("--mode", choices=MODES, default="infer")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-classes", type=int, default=DEFAULT_CLASSES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    result = first_call(args.net, args.mode, args.batch, args.image_size, args.num_classes,
                        args.seed, args.device)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
