"""Batch normalization: ``BatchNorm1d`` ((N, C) or (N, C, L)) and ``BatchNorm2d`` ((N, C, H, W)),
torch.nn's, over ``functional.batch_norm``.

In training mode the batch statistics normalize and, with ``track_running_stats``, update
``running_mean`` / ``running_var`` (unbiased variance) by ``momentum``, and the int64 buffer
``num_batches_tracked`` counts the batches; ``momentum=None`` takes the cumulative average
(factor 1 / num_batches_tracked). In eval mode the running statistics normalize; without them
(``track_running_stats=False``) the batch statistics do in both modes.
"""
import numpy as np

from .. import autograd, functional as F
from ..dtypes import float32, int64
from ..errors import DTypeError, ShapeError
from ..ops.pointwise import PointwiseKernel
from ..tensor import Tensor
from . import init
from .module import Module, Parameter, module_context

# num_batches_tracked += 1 on the device, in place: no host round trip per training step.
_count_step = PointwiseKernel("bn_count_step", [("n", int64)], [("y", int64)], "y = n + 1;")

# momentum=None: the running statistics move by 1 / count toward the batch's (torch's update
# with that factor). functional.batch_norm keys its plans by momentum, so passing 1 / count would
# make a plan per step; it runs with momentum 1 into scratch statistics (the batch's own,
# unbiased variance) and this kernel, whose factor is a run-time argument, folds them in.
_cumulative = PointwiseKernel(
    "bn_cumulative", [("mean", float32), ("batch_mean", float32), ("var", float32),
                      ("batch_var", float32)], [("new_mean", float32), ("new_var", float32)],
    "new_mean = (1 - f) * mean + f * batch_mean; new_var = (1 - f) * var + f * batch_var;",
    scalars=[("f", np.float32)])


class _BatchNorm(Module):
    _dims = ()
    # torch loads state dicts without version metadata (older checkpoints) lacking the counter.
    _optional_state = ("num_batches_tracked",)

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        if not isinstance(num_features, int) or isinstance(num_features, bool) \
                or num_features <= 0:
            raise ShapeError(f"num_features must be a positive int, got {num_features!r}")
        if momentum is not None and (isinstance(momentum, bool)
                                     or not isinstance(momentum, (int, float))):
            raise DTypeError(f"momentum must be a number or None, got {momentum!r}")
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(Tensor.empty(ctx, (num_features,)))
            self.bias = Parameter(Tensor.empty(ctx, (num_features,)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor.zeros(ctx, (num_features,)))
            self.register_buffer("running_var", Tensor.full(ctx, (num_features,), 1.0))
            self.register_buffer("num_batches_tracked", Tensor.zeros(ctx, (), np.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        # The host's copy of num_batches_tracked, for momentum=None's factor; None: read it
        # from the device on next need (after a load, or an assignment to the buffer).
        self._batches = (None, 0)
        self._scratch = None   # momentum=None's batch statistics (zeros at first: see forward)
        self.reset_parameters()

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.fill_(0.0)
            self.running_var.fill_(1.0)
            self.num_batches_tracked.fill_(0)
            self._batches = (self.num_batches_tracked, 0)

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def _state_loaded(self):
        self._batches = (None, 0)

    def _check_input_dim(self, input):
        if not isinstance(input, Tensor):
            return   # functional.batch_norm names the problem
        if input.ndim not in self._dims:
            dims = " or ".join(f"{d}D" for d in self._dims)
            raise ShapeError(f"{type(self).__name__}: expected {dims} input, got {input.ndim}D "
                             f"input of shape {input.shape}")

    def _step_count(self):
        """num_batches_tracked += 1; returns the new count when momentum=None needs it."""
        counter = self.num_batches_tracked
        _count_step([counter], [counter])
        if self.momentum is not None:
            return None
        tensor, count = self._batches
        if tensor is not counter:
            count = int(counter.item())   # after the step: already the new count
        else:
            count += 1
        self._batches = (counter, count)
        return count

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            with autograd.no_grad():
                count = self._step_count()
            if self.momentum is None and self.running_mean is not None \
                    and self.running_var is not None:
                return self._cumulative_forward(input, count)
            if self.momentum is None:
                factor = 1.0 / count
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if tracked else None,
                            self.running_var if tracked else None, self.weight, self.bias,
                            bn_training, float(factor), self.eps)

    def _cumulative_forward(self, input, count):
        mean, var = self.running_mean, self.running_var
        scratch = self._scratch
        if scratch is None or scratch[0].shape != mean.shape or scratch[0].ctx is not mean.ctx:
            # Zeros, not uninitialised memory: momentum 1 still reads them, times 0.
            scratch = self._scratch = (Tensor.zeros(mean.ctx, mean.shape),
                                       Tensor.zeros(var.ctx, var.shape))
        y = F.batch_norm(input, scratch[0], scratch[1], self.weight, self.bias, True, 1.0,
                         self.eps)
        _cumulative([mean, scratch[0], var, scratch[1]], [mean, var], [np.float32(1.0 / count)])
        return y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch norm over (N, C) or (N, C, L), statistics per channel C."""
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch norm over (N, C, H, W), statistics per channel C."""
    _dims = (4,)
