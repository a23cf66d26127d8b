"""torch.nn.utils: ``clip_grad_norm_`` and ``clip_grad_value_`` (implemented in
``dlprim_py.nn_utils``)."""
from ..nn_utils import clip_grad_norm_, clip_grad_value_  # noqa: F401

__all__ = ["clip_grad_norm_", "clip_grad_value_"]
