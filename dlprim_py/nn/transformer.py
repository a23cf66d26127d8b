"""Transformer layers (torch.nn's): ``TransformerEncoderLayer``, ``TransformerEncoder``,
``TransformerDecoderLayer``, ``TransformerDecoder`` and ``Transformer``, composed of the library's modules under
torch's submodule names (state dicts load both ways): ``MultiheadAttention`` (the fused
attention kernels), ``Linear``, ``LayerNorm``, ``Dropout``.

torch's encoder may take a "fast path" of nested tensors in evaluation mode, which gives zeros
at padded positions; these layers always compute the plain form (torch's path with
``enable_nested_tensor=False``, accepted and ignored here)."""
import numpy as np

from .. import functional as F
from ..errors import ShapeError
from ..tensor import Tensor
from .attention import MultiheadAttention
from .container import ModuleList
from .dropout import Dropout
from .linear import Linear, _positive
from .module import Module, module_context
from .normalization import LayerNorm
from . import init

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _activation(activation):
    if isinstance(activation, str):
        try:
            return _ACTIVATIONS[activation]
        except KeyError:
            raise ShapeError(f"activation should be relu/gelu or a callable, got "
                             f"{activation!r}") from None
    if not callable(activation):
        raise ShapeError(f"activation should be relu/gelu or a callable, got {activation!r}")
    return activation


def _copies(layer, count):
    """``count`` layers like ``layer``: made with its arguments, its weights copied (torch
    deep-copies the layer)."""
    _positive(count, "num_layers")
    layers = []
    state = layer.state_dict()
    for _ in range(count):
        copy = type(layer)(*layer._arguments[0], **layer._arguments[1])
        copy.load_state_dict(state)
        copy.train(layer.training)
        layers.append(copy)
    return ModuleList(layers)


class _Layer(Module):
    """What the encoder and decoder layers share, registered in torch's order: self-attention
    (``cross``: then attention over the memory, ``multihead_attn``), the feed-forward block
    (linear1, dropout, linear2), ``blocks`` layer norms and as many dropouts after the blocks,
    the activation; and the self-attention and feed-forward blocks themselves."""

    def __init__(self, arguments, ctx, cross):
        super().__init__()
        (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
         norm_first, bias) = arguments
        ctx = module_context(ctx)
        self._arguments = (arguments, {"ctx": ctx})

        def attention():
            return MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                      batch_first=batch_first, ctx=ctx)
        self.self_attn = attention()
        if cross:
            self.multihead_attn = attention()
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, ctx=ctx)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, ctx=ctx)
        self.norm_first = norm_first
        blocks = 3 if cross else 2
        for k in range(1, blocks + 1):
            setattr(self, f"norm{k}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias, ctx=ctx))
        for k in range(1, blocks + 1):
            setattr(self, f"dropout{k}", Dropout(dropout))
        self._ff_dropout = f"dropout{blocks}"
        self.activation = _activation(activation)

    def _sa_block(self, x, mask, padding, is_causal):
        x = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=padding,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        ff = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return getattr(self, self._ff_dropout)(ff)


class TransformerEncoderLayer(_Layer):
    """Self-attention then a feed-forward block, each with a residual connection, dropout and
    layer norm (after each block, or before with ``norm_first``); torch's arguments and
    submodules (self_attn, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2).
    ``forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)``."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, *,
                 ctx=None):
        super().__init__((d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                          batch_first, norm_first, bias), ctx, cross=False)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer`` (its weights at construction, as torch's deep
    copy), then ``norm`` where given. ``forward(src, mask=None, src_key_padding_mask=None,
    is_causal=None)``."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = _copies(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoderLayer(_Layer):
    """Self-attention, attention over the encoder's ``memory``, then a feed-forward block, each
    with a residual connection, dropout and layer norm (``norm_first`` as the encoder's);
    torch's submodules (self_attn, multihead_attn, linear1, dropout, linear2, norm1..3,
    dropout1..3). ``forward(tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
    memory_is_causal=False)``."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, *,
                 ctx=None):
        super().__init__((d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                          batch_first, norm_first, bias), ctx, cross=True)

    def _mha_block(self, x, memory, mask, padding, is_causal):
        x = self.multihead_attn(x, memory, memory, attn_mask=mask, key_padding_mask=padding,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))


class TransformerDecoder(Module):
    """``num_layers`` copies of ``decoder_layer``, then ``norm`` where given.
    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)``."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _copies(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return self.norm(x) if self.norm is not None else x




class Transformer(Module):
    """torch.nn.Transformer: an encoder of ``num_encoder_layers`` layers and a decoder of
    ``num_decoder_layers``, each with a final layer norm (or ``custom_encoder`` /
    ``custom_decoder``); every weight matrix initialised xavier_uniform_, as torch's.
    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False)``."""

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        arguments = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                     batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(*arguments, ctx=ctx), num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, ctx=ctx))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(*arguments, ctx=ctx), num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, ctx=ctx))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, *, ctx=None):
        """The (sz, sz) float mask of a causal sequence: 0 on and below the diagonal, -inf
        above."""
        mask = np.triu(np.full((sz, sz), -np.inf, np.float32), 1)
        return Tensor.from_numpy(module_context(ctx), mask)


__all__ = ["TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
           "TransformerDecoder", "Transformer"]
