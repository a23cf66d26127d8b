"""``LayerNorm``, ``GroupNorm``, ``RMSNorm`` and ``InstanceNorm1d/2d/3d`` (torch.nn's; affine
weight ones, bias zeros)."""
from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from . import init
from .module import Module, Parameter, module_context


class LayerNorm(Module):
    """Normalize over the trailing ``normalized_shape`` dimensions; ``elementwise_affine``
    gives weight and (with ``bias``) bias of that shape."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *,
                 ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        if not self.normalized_shape or not all(
                isinstance(s, int) and not isinstance(s, bool) and s > 0
                for s in self.normalized_shape):
            raise ShapeError(f"normalized_shape must be positive ints, got {normalized_shape!r}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(Tensor.empty(ctx, self.normalized_shape))
            if bias:
                self.bias = Parameter(Tensor.empty(ctx, self.normalized_shape))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class GroupNorm(Module):
    """Statistics per sample and group of num_channels / num_groups channels; ``affine``
    gives per-channel weight and bias."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        for what, v in (("num_groups", num_groups), ("num_channels", num_channels)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ShapeError(f"{what} must be a positive int, got {v!r}")
        if num_channels % num_groups:
            raise ShapeError(f"num_channels ({num_channels}) must be divisible by num_groups "
                             f"({num_groups})")
        self.num_groups, self.num_channels = num_groups, num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(Tensor.empty(ctx, (num_channels,)))
            self.bias = Parameter(Tensor.empty(ctx, (num_channels,)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class RMSNorm(Module):
    """torch's RMSNorm over the trailing ``normalized_shape``; ``elementwise_affine`` gives a
    weight of that shape, initialised to ones; ``eps`` None is float32's machine epsilon."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(Tensor.full(ctx, self.normalized_shape, 1.0))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class _InstanceNorm(Module):
    """torch's InstanceNorm: statistics per sample and channel; ``affine`` gives a weight (ones)
    and bias (zeros) per channel; ``track_running_stats`` keeps running_mean (zeros) and
    running_var (ones) as buffers, updated in training and used in evaluation."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        if affine:
            self.weight = Parameter(Tensor.full(ctx, (num_features,), 1.0))
            self.bias = Parameter(Tensor.zeros(ctx, (num_features,)))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor.zeros(ctx, (num_features,)))
            self.register_buffer("running_var", Tensor.full(ctx, (num_features,), 1.0))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)

    def forward(self, input):
        return F.instance_norm(input, self.running_mean, self.running_var, self.weight,
                               self.bias, self.training or not self.track_running_stats,
                               self.momentum if self.momentum is not None else 0.1, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    pass


class InstanceNorm2d(_InstanceNorm):
    pass


class InstanceNorm3d(_InstanceNorm):
    pass
