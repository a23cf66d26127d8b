"""``dlprim_py.nn``: torch.nn's modules over ``dlprim_py.functional``.

    import dlprim_py as dp
    dp.manual_seed(0)
    model = dp.nn.Sequential(dp.nn.Conv2d(3, 16, 3, padding=1), dp.nn.BatchNorm2d(16),
                             dp.nn.ReLU(), dp.nn.AdaptiveAvgPool2d(1), dp.nn.Flatten(),
                             dp.nn.Linear(16, 10))
    loss = dp.nn.CrossEntropyLoss()(model(x), target)
    loss.backward()                      # .grad of every model.parameters()
    model.load_state_dict(torch_model.state_dict())   # torch's keys and shapes

``dp.nn.functional`` is ``dp.functional`` (also as ``import dlprim_py.nn.functional as F``).
Modules take torch's arguments and an optional ``ctx=`` keyword (where their tensors live;
default ``dp.default_context()``). Initial weights follow torch's schemes (``dp.nn.init``) with
numbers from this library's generator (``dp.manual_seed``), not torch's.
"""
import sys

from .. import functional
from . import init, utils  # noqa: F401
from .activation import (CELU, GELU, GLU, SELU, Hardshrink, Hardsigmoid, Hardswish, LeakyReLU,
                         LogSigmoid, Mish, PReLU, ReLU, ReLU6, RReLU, Sigmoid, SiLU, Softmax,
                         Softmin, Softshrink, Softsign, Tanh, Tanhshrink, Threshold)
from .batchnorm import BatchNorm1d, BatchNorm2d
from .container import ModuleDict, ModuleList, Sequential
from .conv import Conv2d, ConvTranspose2d
from .dropout import Dropout
from .flatten import Flatten
from .distance import CosineSimilarity, PairwiseDistance
from .attention import MultiheadAttention
from .embedding import Embedding, EmbeddingBag
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)
from .linear import Bilinear, Identity, Linear
from .loss import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, CrossEntropyLoss, CTCLoss,
                   GaussianNLLLoss, HingeEmbeddingLoss, HuberLoss, KLDivLoss, L1Loss,
                   MarginRankingLoss, MSELoss, MultiLabelMarginLoss, MultiLabelSoftMarginLoss,
                   MultiMarginLoss, NLLLoss, PoissonNLLLoss, SmoothL1Loss, SoftMarginLoss,
                   TripletMarginLoss, TripletMarginWithDistanceLoss)
from .module import Module, Parameter, StateDictError
from .normalization import (GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, LayerNorm,
                            RMSNorm)
from .pooling import AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d

# dp.nn.functional is dp.functional itself, importable by that name too, as torch's
# "import torch.nn.functional as F" is (the same module object, so nothing is copied).
sys.modules[__name__ + ".functional"] = functional

__all__ = [
    "Module", "Parameter", "StateDictError", "Sequential", "ModuleList", "ModuleDict",
    "Conv2d", "ConvTranspose2d", "Linear", "Bilinear", "Identity", "Flatten",
    "BatchNorm1d", "BatchNorm2d", "LayerNorm", "GroupNorm", "RMSNorm", "InstanceNorm1d",
    "InstanceNorm2d", "InstanceNorm3d",
    "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardswish", "Hardsigmoid",
    "Softmax", "Mish", "SELU", "CELU", "LogSigmoid", "Softsign", "Softshrink", "Hardshrink",
    "Tanhshrink", "Threshold", "RReLU", "GLU", "Softmin", "PReLU", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "Dropout",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss", "L1Loss", "SmoothL1Loss",
    "HuberLoss", "KLDivLoss", "BCELoss", "PoissonNLLLoss", "GaussianNLLLoss",
    "HingeEmbeddingLoss", "MarginRankingLoss", "CosineEmbeddingLoss", "SoftMarginLoss",
    "MultiLabelSoftMarginLoss", "MultiLabelMarginLoss", "MultiMarginLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss", "CTCLoss", "MultiheadAttention",
    "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer", "TransformerDecoder",
    "Transformer",
    "Embedding", "EmbeddingBag",
    "CosineSimilarity", "PairwiseDistance",
]
