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
                                 elu, gelu, hardsigmoid, hardswish, hardtanh, leaky_relu, relu,
                                 relu6, sigmoid, silu, softplus, tanh)
from .ops.softmax import log_softmax, softmax  # noqa: F401
from .ops.loss import (binary_cross_entropy_with_logits, cross_entropy, mse_loss,  # noqa: F401
                       nll_loss)
from .ops.dropout import dropout  # noqa: F401
from .ops.tensor_ops import (cat, flatten, narrow, pad, permute, reshape, split, squeeze,  # noqa: F401
                             transpose, unsqueeze)
from .ops.pool import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d,  # noqa: F401
                       max_pool2d)
from .ops.conv import conv2d, conv_transpose2d  # noqa: F401
from .ops.norm import batch_norm, group_norm, layer_norm, local_response_norm  # noqa: F401
from .ops.interpolate import interpolate  # noqa: F401
from .ops.linear import linear  # noqa: F401
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
