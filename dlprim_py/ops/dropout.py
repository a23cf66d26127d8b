"""Dropout with a seeded counter-based generator (kernels/dropout.cl.mako, Philox4x32-10).

The mask is a pure function of (seed, stream, element index): the same seed and stream give
the same mask on any device, any driver and any launch geometry, and the backward recomputes it
instead of storing it. The kernel reads and writes each 4-element Philox block as one 16-byte
access where the offsets allow (the "vector" solver of the "dropout" family,
``dlprim_py.solver``), else element by element ("scalar"); ``DLPRIM_DROPOUT_ALGO`` forces one.
Blocks per item and the launch's cap are tuning values (``tuning_db/dropout.json``), read when
a call's plan is made.
``philox4x32_10`` and ``reference_mask`` are the same generator in numpy,
so a mask can be checked (or reproduced on the host) bit for bit.

Without an explicit ``seed``, calls draw from a process-wide generator: ``manual_seed(s)``
resets it to seed ``s`` and stream 0, and every call takes the next stream.
"""
import math
import threading
from dataclasses import dataclass

import numpy as np

from .. import autograd, config, program, solver, tuning
from ..errors import DTypeError, ShapeError, UnsupportedError, not_a_tensor
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


@dataclass(frozen=True)
class DropoutProblem:
    """Dropout of ``size`` elements; ``aligned``: the input's and the output's offsets are
    multiples of 4 elements (a Philox block)."""
    size: int
    aligned: bool

    def key(self):
        return f"dropout-n{self.size}-a{int(self.aligned)}"

    def features(self):
        return {"size": self.size, "aligned": int(self.aligned)}


class VectorSolver(solver.Solver):
    """One aligned 16-byte access per 4-element block."""
    name = "vector"

    def applies(self, ctx, problem):
        return problem.aligned


class ScalarSolver(solver.Solver):
    """Element by element, at any offsets."""
    name = "scalar"


FAMILY = solver.register(solver.Family("dropout", (VectorSolver(), ScalarSolver()),
                                       title="dropout algorithm"))
ALGORITHMS = tuple(FAMILY.solvers)


def _problem(x, y):
    return DropoutProblem(x.size, not (x.offset_elements % 4 or y.offset_elements % 4))


def choose_algorithm(x, y, forced=None):
    """The solver's name for y = dropout(x): "vector" (one aligned 16-byte access per block)
    where both offsets are multiples of 4, else "scalar", by the tuning rules; ``forced`` (or
    DLPRIM_DROPOUT_ALGO) picks one (an error where it does not apply)."""
    return solver.select(x.ctx, "dropout", _problem(x, y), forced=forced).name


def _plan(ctx, x, y, algorithm, unroll):
    """(kernel, global size, local size, index type) of a call: chosen once per size, offsets
    and switches (the solver and its tuning values read here)."""
    key = ("dropout", x.size, x.offset_elements, y.offset_elements, algorithm, unroll,
           config.switches().forced.get("dropout"), tuning.generation)
    plan = ctx.plans.get(key)
    if plan is not None:
        return plan
    problem = _problem(x, y)
    chosen = solver.select(ctx, "dropout", problem, forced=algorithm)
    params = solver.tunables(ctx, "dropout", problem, chosen.name)
    unroll = unroll or params["unroll"]
    total = x.size
    blocks = total // 4
    gsize, lsize = launch_size(ctx, max(blocks, 1), per_item=unroll,
                               groups_per_unit=params["groups_per_unit"])
    largest = max(total + 4 * unroll * gsize[0], x.offset_elements + total, y.offset_elements + total)
    index_t = "int" if largest < 2 ** 31 - 1 else "long"
    vector = 4 if chosen.name == "vector" else 1
    kernel = bind(program.kernel(ctx, "dropout", "dropout_apply",
                                 dict(index_t=index_t, vector=vector, unroll=unroll)))
    return ctx.plans.put(key, (kernel, gsize, lsize, np.int32 if index_t == "int" else np.int64))


def _apply(ctx, x, y, p, seed, stream, algorithm=None, unroll=None):
    """y = dropout(x) with the mask of (seed, stream); ``algorithm`` forces a solver,
    ``unroll`` the blocks per item (measurements)."""
    total = x.size
    if total == 0:
        return
    kernel, gsize, lsize, index = _plan(ctx, x, y, algorithm, unroll)
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
        raise not_a_tensor("dropout: input", input)
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


# ---- channel-wise and alpha dropout: a mask of one value per (sample, channel) or element ----

# SELU's negative saturation value -scale * alpha; alpha dropout sets dropped elements to it
_SELU_SATURATION = 1.7580993408473766


def _check_common(name, input, p):
    if not isinstance(input, Tensor):
        raise not_a_tensor(f"{name}: input", input)
    if input.dtype != np.float32:
        raise DTypeError(f"{name}: only float32 is supported, got {input.dtype}")
    if not isinstance(p, (int, float, np.floating)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ShapeError(f"{name}: p must be a probability in [0, 1], got {p!r}")


def _keep_scaled(ctx, shape, p, seed, stream):
    """A float32 tensor of ``shape``: 1 / (1 - p) where kept, 0 where dropped (no gradient)."""
    with autograd.no_grad():
        return dropout(Tensor.full(ctx, shape, 1.0), p, seed=seed, stream=stream)


def _finish(name, input, out, inplace):
    if not inplace:
        return out
    if autograd.needs_grad(input):
        raise UnsupportedError(f"{name}: inplace=True on a tensor that requires grad; use "
                               f"inplace=False")
    return input.copy_(out.detach())


def _feature_dropout(name, input, p, training, inplace, batched_ndim, seed, stream):
    _check_common(name, input, p)
    if input.ndim not in (batched_ndim - 1, batched_ndim):
        raise ShapeError(f"{name}: input must have {batched_ndim - 1} (unbatched) or "
                         f"{batched_ndim} (batched) dimensions, got shape {input.shape}")
    if not training or p == 0.0:
        return input
    # one value per channel: (C, 1, ...) unbatched, (N, C, 1, ...) batched
    lead = 1 if input.ndim == batched_ndim - 1 else 2
    noise_shape = input.shape[:lead] + (1,) * (input.ndim - lead)
    mask = _keep_scaled(input.ctx, noise_shape, float(p), seed, stream)
    return _finish(name, input, input * mask, inplace)


def dropout1d(input, p=0.5, training=True, inplace=False, *, seed=None, stream=None):
    """torch.nn.functional.dropout1d: zero whole channels of an (N, C, L) or (C, L) input
    with probability ``p`` and scale the rest by 1 / (1 - p) when ``training``; the identity
    otherwise. ``seed`` and ``stream`` as in :func:`dropout` (the mask has one value per
    channel)."""
    return _feature_dropout("dropout1d", input, p, training, inplace, 3, seed, stream)


def dropout2d(input, p=0.5, training=True, inplace=False, *, seed=None, stream=None):
    """torch.nn.functional.dropout2d: zero whole channels of an (N, C, H, W) input with
    probability ``p`` and scale the rest by 1 / (1 - p) when ``training``. A 3-d input is taken
    as (N, C, L), as torch does. ``seed`` and ``stream`` as in :func:`dropout`."""
    _check_common("dropout2d", input, p)
    if input.ndim not in (3, 4):
        raise ShapeError(f"dropout2d: input must have 4 dimensions (N, C, H, W) or 3 (N, C, L), "
                         f"got shape {input.shape}")
    return _feature_dropout("dropout2d", input, p, training, inplace, input.ndim, seed, stream)


def dropout3d(input, p=0.5, training=True, inplace=False, *, seed=None, stream=None):
    """torch.nn.functional.dropout3d: zero whole channels of an (N, C, D, H, W) or
    (C, D, H, W) input with probability ``p`` and scale the rest by 1 / (1 - p) when
    ``training``. ``seed`` and ``stream`` as in :func:`dropout`."""
    return _feature_dropout("dropout3d", input, p, training, inplace, 5, seed, stream)


def _alpha_dropout(name, input, p, training, inplace, noise_shape, seed, stream):
    if not training or p == 0.0:
        return input
    p = float(p)
    if p == 1.0:
        return _finish(name, input, input * 0.0, inplace)
    # torch's formula: kept elements x * a, dropped ones the saturation value, shifted by b so
    # that a SELU network keeps mean 0 and variance 1: y = x * keep * a + alpha * a * (keep - 1 + p)
    a = 1.0 / math.sqrt((_SELU_SATURATION ** 2 * p + 1.0) * (1.0 - p))
    keep_scaled = _keep_scaled(input.ctx, noise_shape, p, seed, stream)
    with autograd.no_grad():
        factor = keep_scaled * ((1.0 - p) * a)
        shift = keep_scaled * ((1.0 - p) * _SELU_SATURATION * a) + (
            _SELU_SATURATION * a * (p - 1.0))
    return _finish(name, input, input * factor + shift, inplace)


def alpha_dropout(input, p=0.5, training=False, inplace=False, *, seed=None, stream=None):
    """torch.nn.functional.alpha_dropout: dropout for SELU networks. When ``training``, each
    element is dropped with probability ``p`` to SELU's saturation value, then all are scaled
    and shifted so that mean and variance are kept; the identity otherwise (the default, as
    torch). ``seed`` and ``stream`` as in :func:`dropout`."""
    _check_common("alpha_dropout", input, p)
    return _alpha_dropout("alpha_dropout", input, p, training, inplace, input.shape, seed, stream)


def feature_alpha_dropout(input, p=0.5, training=False, inplace=False, *, seed=None,
                          stream=None):
    """torch.nn.functional.feature_alpha_dropout: :func:`alpha_dropout` with one mask value per
    (sample, channel) of an input of at least 2 dimensions (N, C, ...); the identity unless
    ``training`` (then any input is taken)."""
    _check_common("feature_alpha_dropout", input, p)
    if not training or p == 0.0:
        return input     # torch checks the rank only when it draws a mask
    if input.ndim < 2:
        raise ShapeError(f"feature_alpha_dropout: input must have at least 2 dimensions "
                         f"(N, C, ...), got shape {input.shape}")
    noise_shape = input.shape[:2] + (1,) * (input.ndim - 2)
    return _alpha_dropout("feature_alpha_dropout", input, p, training, inplace, noise_shape,
                          seed, stream)
