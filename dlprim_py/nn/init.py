"""torch.nn.init's initialisers for ``dlprim_py`` tensors, in place.

The numbers are drawn on the host from the generator ``dp.manual_seed`` seeds
(``dlprim_py.seed.host_generator``, a numpy Generator) in float64 and copied to the device once:
the distributions and their bounds are torch's, the samples are not (torch's generator is
another algorithm), so a module seeded here and one seeded in torch start from different
weights. Load torch's ``state_dict()`` to start from the same ones.
"""
import math

import numpy as np

from ..errors import ShapeError
from ..seed import host_generator


def calculate_gain(nonlinearity, param=None):
    """torch.nn.init.calculate_gain: the recommended gain for a nonlinearity."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ShapeError(f"negative_slope {slope!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ShapeError(f"unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.ndim < 2:
        raise ShapeError("fan in and fan out cannot be computed for a tensor of fewer than 2 "
                         f"dimensions, got shape {tensor.shape}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    if mode not in ("fan_in", "fan_out"):
        raise ShapeError(f"mode {mode!r} is not supported, use 'fan_in' or 'fan_out'")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def _write(tensor, values):
    tensor.copy_(np.array(values, dtype=tensor.dtype, order="C").reshape(tensor.shape))
    return tensor


def uniform_(tensor, a=0.0, b=1.0):
    """Fill with U(a, b)."""
    return _write(tensor, host_generator().uniform(a, b, tensor.shape))


def normal_(tensor, mean=0.0, std=1.0):
    """Fill with N(mean, std^2)."""
    return _write(tensor, host_generator().normal(mean, std, tensor.shape))


def constant_(tensor, val):
    return tensor.fill_(val)


def zeros_(tensor):
    return tensor.fill_(0)


def ones_(tensor):
    return tensor.fill_(1)


def xavier_uniform_(tensor, gain=1.0):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / float(fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain=1.0):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / float(fan_in + fan_out)))


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """U(-bound, bound), bound = gain * sqrt(3 / fan) (torch's He uniform)."""
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    """N(0, std^2), std = gain / sqrt(fan) (torch's He normal)."""
    fan = _fan(tensor, mode)
    if fan == 0:
        return tensor
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))
