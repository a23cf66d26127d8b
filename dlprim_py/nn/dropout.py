"""``Dropout``: torch.nn.Dropout over ``functional.dropout``, active in training mode only.
Masks come from the generator ``dp.manual_seed`` seeds (not torch's numbers)."""
from .. import functional as F
from ..errors import ShapeError
from .module import Module, check_ctx


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False, *, ctx=None):
        super().__init__()
        check_ctx(ctx)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ShapeError(f"dropout probability has to be between 0 and 1, got {p!r}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"
