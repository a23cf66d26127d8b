"""Loss modules (torch.nn's): ``CrossEntropyLoss``, ``NLLLoss``, ``MSELoss``,
``BCEWithLogitsLoss``, ``L1Loss``, ``SmoothL1Loss``, ``HuberLoss``, ``KLDivLoss``, ``BCELoss``,
``PoissonNLLLoss``, ``GaussianNLLLoss``, ``HingeEmbeddingLoss``, ``MarginRankingLoss``,
``CosineEmbeddingLoss``, ``SoftMarginLoss``, ``MultiLabelSoftMarginLoss``,
``MultiLabelMarginLoss``, ``MultiMarginLoss``, ``TripletMarginLoss``,
``TripletMarginWithDistanceLoss`` and ``CTCLoss``, each over its
``functional`` function. Class weights and ``pos_weight`` are buffers (in ``state_dict`` as
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
    """``functional.cross_entropy``: class-index targets (int64) or class probabilities, with
    ``label_smoothing``."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                 *, ctx=None):
        super().__init__(reduction, ctx=ctx)
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


class L1Loss(_Loss):
    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, reduction="mean", beta=1.0, *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction="mean", delta=1.0, *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.delta = delta

    def forward(self, input, target):
        return F.huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(_Loss):
    """``functional.kl_div``; ``reduction`` may also be "batchmean"."""

    def __init__(self, reduction="mean", log_target=False, *, ctx=None):
        super().__init__("mean" if reduction == "batchmean" else reduction, ctx=ctx)
        self.reduction, self.log_target = reduction, log_target

    def forward(self, input, target):
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class BCELoss(_Loss):
    def __init__(self, weight=None, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class PoissonNLLLoss(_Loss):
    def __init__(self, log_input=True, full=False, eps=1e-8, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.log_input, self.full, self.eps = log_input, full, eps

    def forward(self, log_input, target):
        return F.poisson_nll_loss(log_input, target, self.log_input, self.full, eps=self.eps,
                                  reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    def __init__(self, *, full=False, eps=1e-6, reduction="mean", ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.full, self.eps = full, eps

    def forward(self, input, target, var):
        return F.gaussian_nll_loss(input, target, var, self.full, self.eps, self.reduction)


class _MarginLoss(_Loss):
    _function = None

    def __init__(self, margin=1.0, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.margin = margin

    def extra_repr(self):
        return f"margin={self.margin}" + (f", reduction={self.reduction!r}"
                                          if self.reduction != "mean" else "")


class HingeEmbeddingLoss(_MarginLoss):
    def forward(self, input, target):
        return F.hinge_embedding_loss(input, target, self.margin, reduction=self.reduction)


class MarginRankingLoss(_MarginLoss):
    def __init__(self, margin=0.0, reduction="mean", *, ctx=None):
        super().__init__(margin, reduction, ctx=ctx)

    def forward(self, input1, input2, target):
        return F.margin_ranking_loss(input1, input2, target, self.margin,
                                     reduction=self.reduction)


class CosineEmbeddingLoss(_MarginLoss):
    def __init__(self, margin=0.0, reduction="mean", *, ctx=None):
        super().__init__(margin, reduction, ctx=ctx)

    def forward(self, input1, input2, target):
        return F.cosine_embedding_loss(input1, input2, target, self.margin,
                                       reduction=self.reduction)


class SoftMarginLoss(_Loss):
    def forward(self, input, target):
        return F.soft_margin_loss(input, target, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_Loss):
    def __init__(self, weight=None, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))

    def forward(self, input, target):
        return F.multilabel_soft_margin_loss(input, target, self.weight,
                                             reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
    def forward(self, input, target):
        return F.multilabel_margin_loss(input, target, reduction=self.reduction)


class MultiMarginLoss(_Loss):
    def __init__(self, p=1, margin=1.0, weight=None, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        if p not in (1, 2):
            raise UnsupportedError(f"MultiMarginLoss: p must be 1 or 2, got {p!r}")
        self.p, self.margin = p, margin
        self.register_buffer("weight", _tensor(weight, ctx, "weight"))

    def forward(self, input, target):
        return F.multi_margin_loss(input, target, self.p, self.margin, self.weight,
                                   reduction=self.reduction)


class TripletMarginLoss(_Loss):
    def __init__(self, margin=1.0, p=2.0, eps=1e-6, swap=False, reduction="mean", *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.margin, self.p, self.eps, self.swap = margin, p, eps, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_loss(anchor, positive, negative, self.margin, self.p, self.eps,
                                     self.swap, reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    def __init__(self, *, distance_function=None, margin=1.0, swap=False, reduction="mean",
                 ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.distance_function, self.margin, self.swap = distance_function, margin, swap

    def forward(self, anchor, positive, negative):
        return F.triplet_margin_with_distance_loss(
            anchor, positive, negative, distance_function=self.distance_function,
            margin=self.margin, swap=self.swap, reduction=self.reduction)


class CTCLoss(_Loss):
    def __init__(self, blank=0, reduction="mean", zero_infinity=False, *, ctx=None):
        super().__init__(reduction, ctx=ctx)
        self.blank, self.zero_infinity = blank, zero_infinity

    def forward(self, log_probs, targets, input_lengths, target_lengths):
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                          self.reduction, self.zero_infinity)
