"""Dropout with a seeded counter-based generator (kernels/dropout.cl.mako, Philox4x32-10).

The mask is a pure function of (seed, stream, element index): the same seed and stream give
the same mask on any device, any driver and any launch geometry, and the backward recomputes it
instead of storing it. The kernel reads and writes each 4-element Philox block as one 16-byte
access where the offsets allow ("vector"), else element by element ("scalar").
``philox4x32_10`` and ``reference_mask`` are the same generator in numpy,
so a mask can be checked (or reproduced on the host) bit for bit.

Without an explicit ``seed``, calls draw from a process-wide generator: ``manual_seed(s)``
resets it to seed ``s`` and stream 0, and every call takes the next stream.
"""
import math
import threading

import numpy as np

from .. import autograd, config, program
from ..errors import DTypeError, ShapeError, UnsupportedError
from ..tensor import Tensor
from ..launch import bind
from .pointwise import launch_size

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_DEFAULT_SEED = 0x5EED

_state = threading.local()


def manual_seed(seed):
    """Seed the process-wide dropout generator (non-negative int below 2^64); stream 0 next."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 64:
        raise ShapeError(f"seed must be an int in [0, 2^64), got {seed!r}")
    _state.seed = int(seed)
    _state.stream = 0


def _next_stream():
    if not hasattr(_state, "seed"):
        manual_seed(_DEFAULT_SEED)
    stream = _state.stream
    _state.stream += 1
    return _state.seed, stream


def philox4x32_10(counter, key):
    """Philox4x32-10 in numpy: ``counter`` (n, 4) uint32 and ``key`` (2,) -> (n, 4) uint32."""
    c = np.asarray(counter, dtype=np.uint64).copy()
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(_MASK32)
    for rnd in range(10):
        if rnd:
            k0 = (k0 + np.uint64(_W0)) & mask
            k1 = (k1 + np.uint64(_W1)) & mask
        p0 = np.uint64(_M0) * c[:, 0]
        p1 = np.uint64(_M1) * c[:, 2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask
        c = np.stack([hi1 ^ c[:, 1] ^ k0, lo1, hi0 ^ c[:, 3] ^ k1, lo0], axis=1)
    return c.astype(np.uint32)


def _threshold(p):
    return int(round(p * (1 << 24)))


def reference_mask(size, p, seed, stream=0):
    """The keep-mask (bool, ``size`` elements) that the kernel uses, computed in numpy."""
    blocks = math.ceil(size / 4)
    b = np.arange(blocks, dtype=np.uint64)
    counter = np.stack([b & np.uint64(_MASK32), b >> np.uint64(32),
                        np.full(blocks, stream & _MASK32, np.uint64),
                        np.full(blocks, stream >> 32, np.uint64)], axis=1)
    words = philox4x32_10(counter, (seed & _MASK32, seed >> 32)).reshape(-1)[:size]
    return (words >> 8) >= _threshold(p)


ALGORITHMS = ("vector", "scalar")
# Whole 4-element blocks per work item and loop step: their loads are in flight together while
# the generator runs.
UNROLL = 2
# At most this many 256-item groups per compute unit (None: one group per 256 * UNROLL blocks).
GROUPS_PER_UNIT = 64


def choose_algorithm(x, y, forced=None):
    """"vector" (one aligned 16-byte access per block) where both offsets are multiples of 4,
    else "scalar"; ``forced`` (or DLPRIM_DROPOUT_ALGO) picks "scalar" anywhere."""
    forced = forced or config.forced_algorithm("dropout")
    if forced is not None and forced not in ALGORITHMS:
        raise UnsupportedError(f"dropout algorithm must be one of {', '.join(ALGORITHMS)}, got {forced!r}")
    if forced == "scalar" or x.offset_elements % 4 or y.offset_elements % 4:
        return "scalar"
    return "vector"


def _apply(ctx, x, y, p, seed, stream, algorithm=None, unroll=None):
    """y = dropout(x) with the mask of (seed, stream); ``algorithm`` forces a variant."""
    total = x.size
    if total == 0:
        return
    unroll = unroll or UNROLL
    blocks = total // 4
    gsize, lsize = launch_size(ctx, max(blocks, 1), per_item=unroll, groups_per_unit=GROUPS_PER_UNIT)
    largest = max(total + 4 * unroll * gsize[0], x.offset_elements + total, y.offset_elements + total)
    index_t = "int" if largest < 2 ** 31 - 1 else "long"
    index = np.int32 if index_t == "int" else np.int64
    vector = 4 if choose_algorithm(x, y, algorithm) == "vector" else 1
    kernel = bind(program.kernel(ctx, "dropout", "dropout_apply",
                                 dict(index_t=index_t, vector=vector, unroll=unroll)))
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    kernel(ctx.queue, gsize, lsize, index(total), x.buffer, index(x.offset_elements),
           y.buffer, index(y.offset_elements), np.uint32(seed & _MASK32), np.uint32(seed >> 32),
           np.uint32(stream & _MASK32), np.uint32(stream >> 32), np.uint32(_threshold(p)),
           np.float32(scale))


def dropout(input, p=0.5, training=True, inplace=False, *, seed=None, stream=None):
    """torch.nn.functional.dropout: zero each element with probability ``p`` and scale the rest
    by 1 / (1 - p) when ``training``; the identity otherwise.

    ``seed`` (int in [0, 2^64)) and ``stream`` (int, default 0 with a seed) pick the mask
    exactly; without a seed the process-wide generator supplies both (see ``manual_seed``).
    """
    if not isinstance(input, Tensor):
        raise DTypeError(f"dropout: expected a Tensor, got {type(input).__name__}")
    if input.dtype != np.float32:
        raise DTypeError(f"dropout: only float32 is supported, got {input.dtype}")
    if not isinstance(p, (int, float, np.floating)) or not 0.0 <= p <= 1.0:
        raise ShapeError(f"dropout: p must be a probability in [0, 1], got {p!r}")
    if inplace and autograd.needs_grad(input):
        raise UnsupportedError("dropout: inplace=True on a tensor that requires grad; use inplace=False")
    if not training or p == 0.0:
        return input
    if seed is None:
        if stream is not None:
            raise ShapeError("dropout: stream is only meaningful with an explicit seed")
        seed, stream = _next_stream()
    else:
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2 ** 64:
            raise ShapeError(f"dropout: seed must be an int in [0, 2^64), got {seed!r}")
        stream = 0 if stream is None else stream
        if not isinstance(stream, (int, np.integer)) or not 0 <= stream < 2 ** 64:
            raise ShapeError(f"dropout: stream must be an int in [0, 2^64), got {stream!r}")
    seed, stream, p = int(seed), int(stream), float(p)
    ctx = input.ctx
    out = Tensor.empty(ctx, input.shape)
    _apply(ctx, input, out, p, seed, stream)
    if inplace:
        # The kernel's operands are restrict-qualified: it never writes where it reads.
        return input.copy_(out)

    def backward(g):
        dx = Tensor.empty(g.ctx, g.shape)
        _apply(g.ctx, g, dx, p, seed, stream)
        return (dx,)

    return autograd.record(out, (input,), backward, "dropout")
