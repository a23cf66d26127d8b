"""``Embedding`` and ``EmbeddingBag`` (torch.nn's): a lookup table of ``num_embeddings`` rows of
``embedding_dim`` features over ``functional.embedding`` / ``embedding_bag``; initialised as
torch's, N(0, 1), the ``padding_idx`` row zero."""
from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from . import init
from .linear import _positive
from .module import Module, Parameter, module_context


def _table(ctx, num_embeddings, embedding_dim, padding_idx, weight, what):
    _positive(num_embeddings, f"{what}: num_embeddings")
    _positive(embedding_dim, f"{what}: embedding_dim")
    if padding_idx is not None:
        if not -num_embeddings <= padding_idx < num_embeddings:
            raise ShapeError(f"{what}: padding_idx must be within num_embeddings, got "
                             f"{padding_idx}")
        padding_idx %= num_embeddings
    if weight is None:
        table = Parameter(Tensor.empty(ctx, (num_embeddings, embedding_dim)))
        init.normal_(table)
        if padding_idx is not None:
            values = table.numpy()
            values[padding_idx] = 0.0
            table.data.copy_(Tensor.from_numpy(ctx, values))
        return table, padding_idx
    if tuple(weight.shape) != (num_embeddings, embedding_dim):
        raise ShapeError(f"{what}: _weight must be ({num_embeddings}, {embedding_dim}), got "
                         f"{weight.shape}")
    return Parameter(weight), padding_idx


class Embedding(Module):
    """``forward(input)``: the rows named by ``input`` (int64 or int32, any shape), shaped
    ``input.shape + (embedding_dim,)``. ``padding_idx``: that row starts at zero and gets no
    gradient; ``max_norm`` / ``norm_type``: rows named whose norm exceeds it are rescaled in
    the table (``functional.embedding``). ``scale_grad_by_freq`` and ``sparse`` are refused
    there, as in the functional form."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight, self.padding_idx = _table(ctx, num_embeddings, embedding_dim, padding_idx,
                                               _weight, "Embedding")
        self.weight.requires_grad_(not _freeze)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}"
                + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""))

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        """A table holding ``embeddings`` (a 2-d tensor, used as it is); ``freeze``: no
        gradient."""
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ShapeError("Embedding.from_pretrained: embeddings must be a 2-d tensor")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze, ctx=embeddings.ctx)


class EmbeddingBag(Module):
    """``forward(input, offsets=None, per_sample_weights=None)``: the sum, mean or max of each
    bag's rows (``functional.embedding_bag``)."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
                 include_last_offset=False, padding_idx=None, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight, self.padding_idx = _table(ctx, num_embeddings, embedding_dim, padding_idx,
                                               _weight, "EmbeddingBag")
        self.max_norm, self.norm_type, self.mode = max_norm, norm_type, mode
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        return F.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                               self.scale_grad_by_freq, self.mode, self.sparse,
                               per_sample_weights, self.include_last_offset, self.padding_idx)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"


__all__ = ["Embedding", "EmbeddingBag"]
