"""torch.nn.functional-style entry points: the everyday API.

Each name here has torch's semantics; the implementations live in ``dlprim_py.ops``, one module
per operator family.
"""
from .ops.pointwise import add, div, mul, sub  # noqa: F401
