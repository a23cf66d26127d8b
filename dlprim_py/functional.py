"""torch.nn.functional-style entry points: the everyday API.

Each name here has torch's semantics; the implementations live in ``dlprim_py.ops``, one module
per operator family.
"""
from .ops.arithmetic import add, div, maximum, minimum, mul, sub  # noqa: F401
from .ops.reduce import amax, amin, argmax, argmin, mean, norm, sum  # noqa: F401,A004
from .ops.reduce import all_ as all, any_ as any  # noqa: F401,A004
from .ops.masks import (eq, ge, gt, le, logical_and, logical_not, logical_or,  # noqa: F401
                        logical_xor, lt, ne)
from .ops.activation_ops import (abs, activation, activation_backward, activation_forward,  # noqa: F401,A004
                                 celu, elu, gelu, glu, hardshrink, hardsigmoid, hardswish,
                                 hardtanh, leaky_relu, logsigmoid, mish, prelu, relu, relu6,
                                 rrelu, selu, sigmoid, silu, softmin, softplus, softshrink,
                                 softsign, tanh, tanhshrink, threshold)
from .ops.softmax import log_softmax, softmax  # noqa: F401
from .ops.loss import (binary_cross_entropy, binary_cross_entropy_with_logits,  # noqa: F401
                       cosine_embedding_loss, cross_entropy, gaussian_nll_loss,
                       hinge_embedding_loss, huber_loss, kl_div, l1_loss, linear_cross_entropy,
                       margin_ranking_loss,
                       mse_loss, multi_margin_loss, multilabel_margin_loss,
                       multilabel_soft_margin_loss, nll_loss, poisson_nll_loss, smooth_l1_loss,
                       soft_margin_loss, triplet_margin_loss,
                       triplet_margin_with_distance_loss)
from .ops.distance import cosine_similarity, pairwise_distance, pdist  # noqa: F401
from .ops.grid_sample import affine_grid, grid_sample  # noqa: F401
from .ops.ctc_loss import ctc_loss  # noqa: F401
from .ops.dropout import (alpha_dropout, dropout, dropout1d, dropout2d, dropout3d,  # noqa: F401
                          feature_alpha_dropout)
from .ops.tensor_ops import (cat, channel_shuffle, flatten, narrow, pad, permute,  # noqa: F401
                             pixel_shuffle, pixel_unshuffle, reshape, split, squeeze, transpose,
                             unsqueeze)
from .ops.pool import (adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_avg_pool3d,  # noqa: F401
                       adaptive_max_pool1d, adaptive_max_pool2d, adaptive_max_pool3d,
                       avg_pool1d, avg_pool2d, avg_pool3d, max_pool1d, max_pool2d, max_pool3d,
                       max_unpool1d, max_unpool2d, max_unpool3d)
from .ops.conv import (conv1d, conv2d, conv3d, conv_transpose1d, conv_transpose2d,  # noqa: F401
                       conv_transpose3d)
from .ops.conv.fold import fold, unfold  # noqa: F401
from .ops.norm import (batch_norm, group_norm, instance_norm, layer_norm,  # noqa: F401
                       local_response_norm, normalize, rms_norm)
from .ops.interpolate import interpolate, upsample_bilinear, upsample_nearest  # noqa: F401
from .ops.linear import bilinear, linear  # noqa: F401
from .ops.indexing import (arange, count_nonzero, embedding, embedding_bag, gather,  # noqa: F401
                           index_add, index_select, isfinite, isin, isinf, isnan, isneginf,
                           isposinf, linspace, masked_fill, one_hot, scatter, scatter_add, tril,
                           triu, where)
from .ops.scan import cumsum, sort, topk  # noqa: F401
from .ops.attention import multi_head_attention_forward, scaled_dot_product_attention  # noqa: F401


def _install_numerics_checks(switches):
    from . import numerics
    # The operators (a wrapped one keeps its operator module's name through functools.wraps).
    names = [n for n, v in list(globals().items()) if callable(v) and not n.startswith("_")
             and getattr(v, "__module__", "").startswith("dlprim_py.ops")]
    numerics.install(globals(), names, switches.check_numerics)


def _setup_numerics():
    from . import config
    config._reload_hooks.append(_install_numerics_checks)
    _install_numerics_checks(config.switches())


_setup_numerics()
