"""``MultiheadAttention`` (torch.nn's): the projections' parameters under torch's names (state
dicts load both ways) over ``functional.multi_head_attention_forward``, whose attention is the
fused kernel family."""
from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from . import init
from .linear import Linear, _positive
from .module import Module, Parameter, module_context


class MultiheadAttention(Module):
    """Attention over ``num_heads`` heads of ``embed_dim // num_heads`` features.

    Parameters as torch's: ``in_proj_weight`` (3E, E) where key and value have E features,
    else ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight`` (E, vdim);
    ``in_proj_bias`` (3E,) and ``out_proj`` (a Linear E -> E) with ``bias``; ``bias_k`` and
    ``bias_v`` (1, 1, E) with ``add_bias_kv``. Initialised as torch: the projections
    xavier_uniform_, the biases zero, bias_k and bias_v xavier_normal_. ``dropout`` applies to
    the attention weights in training mode. ``batch_first``: inputs and output (N, L, E)
    instead of (L, N, E).

    ``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)`` returns (output, weights or None) as
    ``F.multi_head_attention_forward``.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        _positive(embed_dim, "MultiheadAttention: embed_dim")
        _positive(num_heads, "MultiheadAttention: num_heads")
        if embed_dim % num_heads:
            raise ShapeError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by "
                             f"num_heads {num_heads}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout <= 1.0:
            raise ShapeError(f"MultiheadAttention: dropout must be a probability, got "
                             f"{dropout!r}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.head_dim = embed_dim // num_heads
        self.dropout, self.batch_first, self.add_zero_attn = dropout, batch_first, add_zero_attn
        E = embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(Tensor.empty(ctx, (3 * E, E)))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(Tensor.empty(ctx, (E, E)))
            self.k_proj_weight = Parameter(Tensor.empty(ctx, (E, self.kdim)))
            self.v_proj_weight = Parameter(Tensor.empty(ctx, (E, self.vdim)))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(Tensor.empty(ctx, (3 * E,)))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(E, E, bias=bias, ctx=ctx)
        if add_bias_kv:
            self.bias_k = Parameter(Tensor.empty(ctx, (1, 1, E)))
            self.bias_v = Parameter(Tensor.empty(ctx, (1, 1, E)))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        batched = query.ndim == 3
        if self.batch_first and batched:
            # (N, L, E) -> (L, N, E), keeping self-attention's one tensor one tensor (the
            # packed projection takes it).
            if key is value:
                if query is key:
                    query = key = value = F.transpose(query, 0, 1)
                else:
                    query, key = F.transpose(query, 0, 1), F.transpose(key, 0, 1)
                    value = key
            else:
                query, key, value = (F.transpose(t, 0, 1) for t in (query, key, value))
        separate = not self._qkv_same_embed_dim
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=separate, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and batched:
            out = F.transpose(out, 0, 1)
        return out, weights

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")


__all__ = ["MultiheadAttention"]
