"""Distances and similarities with torch.nn.functional's names: ``cosine_similarity``,
``pairwise_distance`` and ``pdist``, forward and backward.

Each forward is one broadcast + reduce kernel (``ReduceKernel``): the p-norm of the difference
of two broadcast operands over their last dimension (``pairwise_distance``; ``pdist`` on the
rows of one matrix against each other, then one kernel that keeps the upper triangle), or the
dot product and both squared norms at once, divided in the kernel's finalize
(``cosine_similarity``). The backward is one pointwise kernel (and the reduction of a broadcast
operand's gradient), or one reduce kernel for ``pdist``. ``p`` is a run-time argument: one
compile serves every finite p; p = inf folds by max.
"""
import math

import numpy as np

from .. import autograd
from ..context import check_same_context
from ..errors import DTypeError, ShapeError
from ..tensor import Tensor
from .arithmetic import reduce_to_shape
from .loss import _check_float, _view
from .pointwise import PointwiseKernel, broadcast_shapes
from .reduce import ReduceKernel, normalize_dims

_f32 = np.float32
_kernels = {}


def _memo(key, factory):
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = factory()
    return k


def _norm_order(p, name, negative=False):
    """``p`` as a float: >= 0 or inf, or with ``negative`` any number but NaN (-inf too)."""
    if not isinstance(p, (int, float, np.number)) or isinstance(p, bool):
        raise DTypeError(f"{name}: p must be a number, got {p!r}")
    p = float(p)
    if math.isnan(p) or (p < 0 and not negative):
        raise ShapeError(f"{name}: p must be >= 0 (or inf), got {p}")
    return p


def _distance_kernel(p):
    """||a - b + eps||_p over the reduced dimensions, for p (a scalar) finite or infinite (a
    negative p: (sum d^p)^(1/p), 0 where a difference is 0; -inf: the smallest |difference|)."""
    if math.isinf(p):
        kind = "max" if p > 0 else "min"
        return _memo(f"dist_{kind}", lambda: ReduceKernel(
            f"distance_{kind}", [("a", _f32), ("b", _f32)], [("y", _f32)],
            "y = fabs(a - b + eps);", kind, scalars=[("eps", _f32), ("p", _f32)]))
    # p = 0 counts the non-zero differences; 1 and 2 avoid pow.
    return _memo("dist", lambda: ReduceKernel(
        "distance_p", [("a", _f32), ("b", _f32)], [("y", _f32)],
        "float d = fabs(a - b + eps);"
        "y = p == 0.0f ? (d != 0.0f ? 1.0f : 0.0f) : (p == 1.0f ? d : (p == 2.0f ? d * d"
        " : pow(d, p)));", "sum",
        finalize="acc_y = (p == 0.0f || p == 1.0f) ? acc_y : (p == 2.0f ? sqrt(acc_y)"
                 " : pow(acc_y, 1.0f / p));",
        scalars=[("eps", _f32), ("p", _f32)]))


# The derivative of ||d||_p (= D) by d, times the incoming gradient G: torch's formulas (pdist's
# backward; the norm's for pairwise_distance), 0 where the distance is 0.
_DISTANCE_GRADIENT = (
    "float s = (d > 0.0f) ? 1.0f : ((d < 0.0f) ? -1.0f : 0.0f); float ad = fabs(d);"
    "float dd = p == 0.0f ? 0.0f"
    " : p == 1.0f ? s"
    " : isinf(p) ? (ad == D ? s : 0.0f)"
    " : D == 0.0f ? 0.0f"
    " : p == 2.0f ? d / D"
    " : p < 2.0f ? ((ad == 0.0f && p < 1.0f) ? 0.0f : s * pow(ad / D, p - 1.0f))"
    " : d * pow(ad, p - 2.0f) / pow(D, p - 1.0f);")


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """torch.nn.functional.pairwise_distance: ||x1 - x2 + eps||_p over the last dimension of
    the broadcast operands (``keepdim`` keeps it as size 1), p any number (negative ones and
    -inf as torch's vector norm: refused over an empty dimension, which has no identity for
    them). Gradients to both. At p = inf (-inf) the gradient goes to every largest (smallest)
    difference (torch's norm shares it among them)."""
    _check_float(x1, "pairwise_distance: x1")
    _check_float(x2, "pairwise_distance: x2")
    ctx = check_same_context(x1, x2)
    p = _norm_order(p, "pairwise_distance", negative=True)
    eps = float(eps)
    shape = broadcast_shapes(x1.shape, x2.shape)
    if not shape:
        shape = (1,)
    kept = shape[:-1] + (1,)
    out = Tensor.empty(ctx, kept if keepdim else shape[:-1])
    if math.prod(kept):
        if shape[-1]:
            _distance_kernel(p)([x1, x2], [_view(out, kept)], [eps, p], axes=(len(shape) - 1,))
        elif p < 0:
            raise ShapeError(f"pairwise_distance: the {p} norm over an empty last dimension has "
                             f"no identity")
        else:
            out.fill_(0.0)
    source1, source2, result = x1.detach(), x2.detach(), out.detach()

    def backward(g):
        kernel = _memo("pairwise_backward", lambda: PointwiseKernel(
            "pairwise_distance_backward",
            [("a", _f32), ("b", _f32), ("D", _f32), ("g", _f32)], [("da", _f32), ("db", _f32)],
            "float d = a - b + eps;" + _DISTANCE_GRADIENT + "da = g * dd; db = -da;",
            scalars=[("eps", _f32), ("p", _f32)]))
        da, db = Tensor.empty(ctx, shape), Tensor.empty(ctx, shape)
        kernel([source1, source2, _view(result, kept), _view(g, kept)], [da, db], [eps, p])
        return reduce_to_shape(da, x1.shape), reduce_to_shape(db, x2.shape)

    return autograd.record(out, (x1, x2), backward, "pairwise_distance")


def pdist(input, p=2.0):
    """torch.nn.functional.pdist: the p-norm distances between the rows of an (N, M) input,
    i < j in row-major order (N (N - 1) / 2 values). Gradient to the input."""
    _check_float(input, "pdist: input")
    if input.ndim != 2:
        raise ShapeError(f"pdist: the input must be (N, M), got shape {input.shape}")
    p = _norm_order(p, "pdist")
    ctx = input.ctx
    n, m = input.shape
    pairs = n * (n - 1) // 2
    out = Tensor.empty(ctx, (pairs,))
    matrix = Tensor.empty(ctx, (n, n, 1))
    if pairs:
        if m:
            _distance_kernel(p)([_view(input, (n, 1, m)), _view(input, (1, n, m))], [matrix],
                                [0.0, p], axes=(2,))
        else:
            matrix.fill_(0.0)
        # Pair k's row r is the last whose first pair start(r) = r (2n - r - 1) / 2 is <= k: a
        # float estimate, corrected in exact integers.
        upper = _memo("pdist_upper", lambda: PointwiseKernel(
            "pdist_upper", [("D", _f32)], [("y", _f32)],
            "long k = i; float b = 2.0f * n - 1.0f;"
            "long r = (long)floor((b - sqrt(fmax(b * b - 8.0f * (float)k, 0.0f))) * 0.5f);"
            "r = r < 0 ? 0 : (r > n - 2 ? n - 2 : r);"
            "while (r > 0 && r * (2 * n - r - 1) / 2 > k) r--;"
            "while (r < n - 2 && (r + 1) * (2 * n - r - 2) / 2 <= k) r++;"
            "long c = k - r * (2 * n - r - 1) / 2 + r + 1;"
            "y = D_buf[D_off + r * n + c];", scalars=[("n", np.int64)]))
        upper([_view(matrix, (1,))], [out], [n])
    source, distances = input.detach(), matrix

    def backward(g):
        dx = Tensor.empty(ctx, (n, m))
        if not pairs or not m:
            dx.fill_(0.0)
            return (dx,)
        # The gradient of every distance as a symmetric (n, n) matrix, then one reduction over
        # the other row.
        spread = _memo("pdist_spread", lambda: PointwiseKernel(
            "pdist_spread", [("g", _f32)], [("G", _f32)],
            "long r = (long)i / n, c = (long)i % n;"
            "long lo = r < c ? r : c, hi = r < c ? c : r;"
            "G = r == c ? 0.0f : g_buf[g_off + lo * (2 * n - lo - 1) / 2 + hi - lo - 1];",
            scalars=[("n", np.int64)]))
        gradient = _memo("pdist_backward", lambda: ReduceKernel(
            "pdist_backward", [("a", _f32), ("b", _f32), ("D", _f32), ("G", _f32)],
            [("dx", _f32)], "float d = a - b;" + _DISTANCE_GRADIENT + "dx = G * dd;", "sum",
            scalars=[("p", _f32)]))
        full = Tensor.empty(ctx, (n, n, 1))
        spread([_view(g, (1,))], [full], [n])
        gradient([_view(source, (n, 1, m)), _view(source, (1, n, m)), distances, full],
                 [_view(dx, (n, 1, m))], [p], axes=(1,))
        return (dx,)

    return autograd.record(out, (input,), backward, "pdist")


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """torch.nn.functional.cosine_similarity: sum(x1 x2) / (max(||x1||, eps) max(||x2||, eps))
    over ``dim`` of the broadcast operands. Gradients to both (through the norms as if
    unclamped, as torch's)."""
    _check_float(x1, "cosine_similarity: x1")
    _check_float(x2, "cosine_similarity: x2")
    ctx = check_same_context(x1, x2)
    eps = float(eps)
    shape = broadcast_shapes(x1.shape, x2.shape)
    if not shape:
        raise ShapeError("cosine_similarity: the inputs must have at least one dimension")
    (axis,) = normalize_dims(dim, len(shape), "cosine_similarity") if isinstance(
        dim, (int, np.integer)) and not isinstance(dim, bool) else (None,)
    if axis is None:
        raise ShapeError(f"cosine_similarity: dim must be an int, got {dim!r}")
    kept = tuple(1 if k == axis else s for k, s in enumerate(shape))
    result_shape = tuple(s for k, s in enumerate(shape) if k != axis)
    out = Tensor.empty(ctx, result_shape)
    norms1, norms2 = Tensor.empty(ctx, kept), Tensor.empty(ctx, kept)
    kernel = _memo("cosine", lambda: ReduceKernel(
        "cosine_similarity", [("a", _f32), ("b", _f32)],
        [("c", _f32), ("s1", _f32), ("s2", _f32)], "c = a * b; s1 = a * a; s2 = b * b;", "sum",
        finalize="acc_c = acc_c / (fmax(sqrt(acc_s1), eps) * fmax(sqrt(acc_s2), eps));",
        scalars=[("eps", _f32)]))
    if math.prod(kept):
        if shape[axis]:
            kernel([x1, x2], [_view(out, kept), norms1, norms2], [eps], axes=(axis,))
        else:
            for t in (out, norms1, norms2):
                t.fill_(0.0)
    source1, source2, result = x1.detach(), x2.detach(), out.detach()

    def backward(g):
        grad = _memo("cosine_backward", lambda: PointwiseKernel(
            "cosine_similarity_backward",
            [("a", _f32), ("b", _f32), ("c", _f32), ("s1", _f32), ("s2", _f32), ("g", _f32)],
            [("da", _f32), ("db", _f32)],
            "float r1 = sqrt(s1), r2 = sqrt(s2);"
            "float n1 = fmax(r1, eps), n2 = fmax(r2, eps);"
            "da = g * (b / (n1 * n2) - (r1 > 0.0f ? c * a / (n1 * r1) : 0.0f));"
            "db = g * (a / (n1 * n2) - (r2 > 0.0f ? c * b / (n2 * r2) : 0.0f));",
            scalars=[("eps", _f32)]))
        da, db = Tensor.empty(ctx, shape), Tensor.empty(ctx, shape)
        grad([source1, source2, _view(result, kept), norms1, norms2, _view(g, kept)], [da, db],
             [eps])
        return reduce_to_shape(da, x1.shape), reduce_to_shape(db, x2.shape)

    return autograd.record(out, (x1, x2), backward, "cosine_similarity")


__all__ = ["cosine_similarity", "pairwise_distance", "pdist"]
