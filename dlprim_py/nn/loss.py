"""Loss modules (torch.nn's): ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss`` and
``BCEWithLogitsLoss``. Class weights and ``pos_weight`` are buffers (in ``state_dict`` as
torch keeps them); they may be given as dp.Tensors or numpy arrays (copied to ``ctx``)."""
import numpy as np

from .. import functional as F
from ..errors import ShapeError, UnsupportedError
from ..tensor import Tensor
from .module import Module, check_ctx, module_context

REDUCTIONS = ("none", "mean", "sum")


def _tensor(value, ctx, what):
    if value is None or isinstance(value, Tensor):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return Tensor.from_numpy(module_context(ctx), np.ascontiguousarray(value, np.float32))


class _Loss(Module):
    def __init__(self, reduction="mean", *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        if reduction not in REDUCTIONS:
            raise ShapeError(f"reduction must be one of {', '.join(REDUCTIONS)}, "
                             f"got {reduction!r}")
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}" if self.reduction != "mean" else ""


class CrossEntropyLoss(_Loss):
    """``functional.cross_entropy``: class-index targets (int64) or class probabilities.
    ``label_smoothing`` other than 0 raises UnsupportedError (the functional has none)."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                 *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        if label_smoothing != 0.0:
            raise UnsupportedError(f"CrossEntropyLoss: label_smoothing is not supported "
                                   f"(functional.cross_entropy has none), got {label_smoothing}")
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction,
                               self.label_smoothing)


class NLLLoss(_Loss):
    def __init__(self, weight=None, ignore_index=-100, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))
        self.ignore_index = ignore_index

    def forward(self, input, target):
        return F.nll_loss(input, target, self.weight, self.ignore_index, self.reduction)


class MSELoss(_Loss):
    def forward(self, input, target):
        return F.mse_loss(input, target, self.reduction)


class BCEWithLogitsLoss(_Loss):
    def __init__(self, weight=None, reduction="mean", pos_weight=None, *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))
        self.register_buffer("pos_weight", _tensor(pos_weight, ctx, "pos_weight"))

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, self.weight, self.reduction,
                                                  self.pos_weight)
