"""torch.nn.functional-style entry points: the everyday API.

Each name here has torch's semantics; the implementations live in ``dlprim_py.ops``, one module
per operator family.
"""
from .ops.pointwise import add, div, mul, sub  # noqa: F401
from .ops.tensor_ops import (cat, flatten, narrow, pad, permute, reshape, split, squeeze,  # noqa: F401
                             transpose, unsqueeze)
