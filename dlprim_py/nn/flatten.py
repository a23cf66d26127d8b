"""``Flatten``: torch.nn.Flatten (dimensions start_dim..end_dim merged into one)."""
from .. import functional as F
from .module import Module, check_ctx


class Flatten(Module):
    """``functional.flatten(x, start_dim, end_dim)``; by default every dimension but the
    batch's."""

    def __init__(self, start_dim=1, end_dim=-1, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        return F.flatten(input, self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
