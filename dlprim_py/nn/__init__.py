"""torch.nn for dlprim_py."""
from . import utils  # noqa: F401
