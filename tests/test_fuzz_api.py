"""Property-based checks of the public API (dlprim_py.functional) against PyTorch CPU float64.

Hypothesis draws shapes, dims, parameters and layouts; each example runs our operator and
torch's on the same seeded data. Where torch refuses an input, ours must raise a library error
(dp.DlprimError); where torch accepts, ours must give the same result, or raise
UnsupportedError for a documented limitation (listed in LIMITATIONS below). Every device buffer
the library allocates during these tests is filled with NaN first, so an element an operator
never writes shows up as a mismatch.

The profile is fixed (derandomized, few examples) and shapes come from small sets, so the run is
the same everywhere and kernel builds repeat instead of multiplying.
"""
import math
import warnings

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlprim_py as dp
import dlprim_py.tensor as tensor_module

F = dp.functional

settings.register_profile("fuzz_api", derandomize=True, max_examples=12, deadline=None,
                          suppress_health_check=list(HealthCheck), database=None)
FUZZ = settings.get_profile("fuzz_api")
# Fewer examples where nearly every configuration builds kernels of its own (GEMM tiles,
# convolution algorithms, forced variants): a PoCL build and its first launch cost about a second.
FUZZ_COMPILING = settings(FUZZ, max_examples=6)

# Requests torch accepts and this library refuses on purpose, with UnsupportedError (each
# operator's docstring names them); a refusal outside this list fails.
LIMITATIONS = ("label_smoothing", "asymmetric padding", "mode must be one of",
               "1-d weight", "broadcast over", "empty weight", "antialias")


@pytest.fixture(scope="module", autouse=True)
def poisoned_allocations():
    """Every buffer the library allocates starts as NaN (the pool reuses memory, so a stale
    correct value could otherwise hide an unwritten element)."""
    original = tensor_module.allocate

    def allocate(ctx, nbytes):
        buffer = original(ctx, nbytes)
        if nbytes >= 4:
            cl.enqueue_fill_buffer(ctx.queue, buffer, np.float32(np.nan), 0, nbytes // 4 * 4)
        return buffer

    tensor_module.allocate = allocate
    yield
    tensor_module.allocate = original


def data(seed, shape, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


_placements = iter(range(1 << 62))


def dev(ctx, array, requires_grad=False):
    """``array`` on the device at an element offset of 0 to 4 in a NaN-filled buffer, so that an
    operator that ignores the offset, or reads past either end, shows it."""
    array = np.array(array, order="C")
    offset = next(_placements) % 5
    room = dp.Tensor.empty(ctx, (array.size + offset + 3,), array.dtype)
    room.fill_(np.nan if array.dtype.kind == "f" else -1)
    if array.size:
        cl.enqueue_copy(ctx.queue, room.buffer, array, is_blocking=True,
                        dst_offset=room.offset + offset * array.dtype.itemsize)
    return dp.Tensor(ctx, room.buffer, array.shape, array.dtype,
                     offset=room.offset + offset * array.dtype.itemsize, requires_grad=requires_grad)


def ref(array):
    array = np.array(array, order="C")
    return torch.from_numpy(array).double() if array.dtype.kind == "f" else torch.from_numpy(array)


def host(value):
    return value.numpy() if isinstance(value, dp.Tensor) else np.asarray(value)


def assert_matches(out, expected, tol=1e-5, what=""):
    """Same shape, NaN/Inf where the reference has them, MIOpen's error metric elsewhere;
    integer results exactly."""
    out = host(out)
    expected = expected.detach().numpy() if torch.is_tensor(expected) else np.asarray(expected)
    assert out.shape == expected.shape, f"{what}: shape {out.shape} != torch's {expected.shape}"
    if expected.dtype.kind in "iub":
        assert np.array_equal(out, expected), f"{what}: {out.ravel()[:8]} != {expected.ravel()[:8]}"
        return
    out = out.astype(np.float64)
    finite = np.isfinite(expected)
    assert np.array_equal(out[~finite], expected[~finite], equal_nan=True), \
        f"{what}: non-finite values differ: {out[~finite]} vs {expected[~finite]}"
    assert np.isfinite(out[finite]).all(), f"{what}: NaN/Inf where torch's result is finite"
    if finite.any():
        diff = out[finite] - expected[finite]
        err = np.linalg.norm(diff) / (math.sqrt(diff.size) * max(np.abs(expected[finite]).max(), 1e-30))
        assert err <= tol, f"{what}: error metric {err:.2e} > {tol:.0e}"


def _synchronized(result):
    """``result`` after its context's next synchronizing call, which raises what a deferred
    check found (a bad class target)."""
    for t in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(t, dp.Tensor):
            t.ctx.synchronize()
    return result


def compare(ours, theirs, tol=1e-5, what=""):
    """Run torch's call, then ours: torch refuses -> a library error; torch accepts -> the same
    results (a tuple compares element by element) or a documented UnsupportedError."""
    try:
        expected = theirs()
    except (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError) as torch_error:
        with pytest.raises(dp.DlprimError):
            _synchronized(ours())
        return torch_error
    try:
        out = _synchronized(ours())
    except dp.UnsupportedError as error:
        assert any(limit in str(error) for limit in LIMITATIONS), f"{what}: undocumented refusal {error}"
        return error
    if isinstance(expected, (tuple, list)):
        assert isinstance(out, (tuple, list)) and len(out) == len(expected), what
        for k, (o, e) in enumerate(zip(out, expected)):
            assert_matches(o, e, tol, f"{what}[{k}]")
    else:
        assert_matches(out, expected, tol, what)
    return None


SHAPES = [(7,), (3, 5), (2, 1, 4), (2, 3, 4, 5), (1, 1), (0, 3), (4, 0, 2), (3, 300), (2, 1030)]
seeds = st.integers(0, 2 ** 16)


# ---- reductions ----------------------------------------------------------------------------

@st.composite
def shape_and_dims(draw, shapes=SHAPES):
    shape = draw(st.sampled_from(shapes))
    nd = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple", "empty"]))
    if kind == "none" or nd == 0:
        return shape, None
    if kind == "empty":
        return shape, ()
    if kind == "int":
        return shape, draw(st.integers(-nd, nd - 1))
    axes = draw(st.lists(st.integers(0, nd - 1), min_size=1, max_size=nd, unique=True))
    # Some dims negative, in any order.
    return shape, tuple(a - nd if draw(st.booleans()) else a for a in axes)


def _torch_reduce(name, t, dim, keepdim, p=None):
    if name == "norm":
        return torch.linalg.vector_norm(t, ord=p, dim=dim, keepdim=keepdim)
    if name in ("sum", "mean") and dim is None:
        return getattr(torch, name)(t) if not keepdim else getattr(torch, name)(
            t, dim=tuple(range(t.ndim)), keepdim=True)
    if name in ("amax", "amin") and dim is None:
        dim = ()
    return getattr(torch, name)(t, dim=dim, keepdim=keepdim)


@FUZZ
@given(shape_and_dims(), st.booleans(), st.sampled_from(["sum", "mean", "amax", "amin", "norm"]),
       st.sampled_from([2, 1, 3.0, 0.5, 0, math.inf, -math.inf]), st.booleans(), seeds)
def test_reductions(ctx, shape_dims, keepdim, name, p, transposed, seed):
    shape, dim = shape_dims
    a = data(seed, shape)
    if transposed and len(shape) >= 2:
        # A permuted copy (the API's stand-in for a non-contiguous view) as the input.
        a = np.ascontiguousarray(np.swapaxes(a, 0, -1))
    kwargs = {"p": p} if name == "norm" else {}
    compare(lambda: getattr(F, name)(dev(ctx, a), dim=dim, keepdim=keepdim, **kwargs),
            lambda: _torch_reduce(name, ref(a), dim, keepdim, p), what=f"{name}{shape} dim={dim}")


@FUZZ
@given(st.sampled_from(SHAPES + [(5, 6)]), st.data(), st.booleans(), st.sampled_from(["argmax", "argmin"]),
       seeds)
def test_argmax_with_ties_and_nan(ctx, shape, draw, keepdim, name, seed):
    nd = len(shape)
    dim = draw.draw(st.none() | st.integers(-nd, nd - 1)) if nd else None
    # Few distinct values, so ties are common; sometimes a NaN, which wins in torch.
    a = np.random.default_rng(seed).integers(-2, 3, size=shape).astype(np.float32)
    if a.size and seed % 3 == 0:
        a.ravel()[seed % a.size] = np.nan
    compare(lambda: getattr(F, name)(dev(ctx, a), dim=dim, keepdim=keepdim),
            lambda: getattr(torch, name)(ref(a), dim=dim, keepdim=keepdim), what=f"{name}{shape} dim={dim}")


@FUZZ_COMPILING
@given(st.sampled_from([(3, 5), (2, 3, 4), (3, 300), (2, 1030), (300, 3), (5, 1, 1, 7)]), st.data(),
       st.sampled_from(["group", "item"]), st.sampled_from(["sum", "amax", "argmax", "norm"]), seeds)
def test_reduction_variants_forced(ctx, shape, draw, variant, name, seed):
    """Each reduction algorithm forced through DLPRIM_REDUCE_ALGO, whatever the layout."""
    nd = len(shape)
    dim = draw.draw(st.none() | st.integers(-nd, nd - 1))
    a = np.round(data(seed, shape) * 3) if name == "argmax" else data(seed, shape)
    theirs = {"sum": lambda t: torch.sum(t, dim) if dim is not None else torch.sum(t),
              "amax": lambda t: torch.amax(t, () if dim is None else dim),
              "argmax": lambda t: torch.argmax(t, dim),
              "norm": lambda t: torch.linalg.vector_norm(t, 3, dim)}[name]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DLPRIM_REDUCE_ALGO", variant)
        dp.config.reload()
        out = (F.norm(dev(ctx, a), 3, dim) if name == "norm" else getattr(F, name)(dev(ctx, a), dim))
    dp.config.reload()
    assert_matches(out, theirs(ref(a)), what=f"{name}{shape} dim={dim} {variant}")


@FUZZ_COMPILING
@given(st.sampled_from([(3, 5), (2, 3, 4), (3, 300), (2, 1030), (700, 2)]), st.data(),
       st.sampled_from(["row", "column"]), st.sampled_from([None, 0, 4, 32]), st.booleans(), seeds)
def test_softmax_variants_forced(ctx, shape, draw, variant, cached, log, seed):
    """Each softmax kernel and row cache forced; a cache too small for the row is refused."""
    dim = draw.draw(st.integers(0, len(shape) - 1))
    a = data(seed, shape) * 5
    name = "log_softmax" if log else "softmax"
    try:
        out = getattr(F, name)(dev(ctx, a), dim, variant=variant, cached=cached)
    except dp.UnsupportedError as error:
        assert "cannot hold a row" in str(error)
        return
    assert_matches(out, getattr(TF, name)(ref(a), dim), what=f"{name}{shape} {dim} {variant} {cached}")


# ---- softmax, pointwise, activations ---------------------------------------------------------

@FUZZ
@given(st.sampled_from([(9,), (3, 5), (2, 3, 4), (2, 1, 3, 5), (1,), (0, 4), (3, 600), (700, 2)]),
       st.data(), st.booleans(),
       st.sampled_from([1.0, 30.0]), seeds)
def test_softmax_every_dim(ctx, shape, draw, log, scale, seed):
    nd = len(shape)
    dim = draw.draw(st.integers(-nd - 1, nd))
    a = data(seed, shape) * scale
    name = "log_softmax" if log else "softmax"
    compare(lambda: getattr(F, name)(dev(ctx, a), dim=dim), lambda: getattr(TF, name)(ref(a), dim=dim),
            what=f"{name}{shape} dim={dim}")


@st.composite
def broadcast_pair(draw):
    out = draw(st.sampled_from([(3,), (2, 3), (2, 1, 4), (2, 3, 4), (1, 1, 3)]))

    def operand():
        form = draw(st.sampled_from(["tensor", "tensor", "scalar", "zero-d"]))
        if form == "scalar":
            return draw(st.sampled_from([2.5, -0.5, 3]))
        if form == "zero-d":
            return ()
        keep = draw(st.integers(0, len(out)))
        shape = list(out[len(out) - keep:])
        for k in range(len(shape)):
            if draw(st.booleans()):
                shape[k] = 1
        if draw(st.integers(0, 9)) == 0 and shape:
            shape[-1] += 1                   # incompatible: both must refuse
        return tuple(shape)

    return operand(), operand()


@FUZZ
@given(broadcast_pair(), st.sampled_from(["add", "sub", "mul", "div", "maximum", "minimum"]), seeds)
def test_binary_broadcasting(ctx, operands, name, seed):
    def make(spec, k):
        if isinstance(spec, tuple):
            a = data(seed + k, spec, 0.2, 1.5) * (1 if k else -1)
            return (lambda: dev(ctx, a)), (lambda: ref(a))
        return (lambda: spec), (lambda: torch.tensor(float(spec), dtype=torch.float64))
    (ours_a, theirs_a), (ours_b, theirs_b) = make(operands[0], 0), make(operands[1], 1)
    if not any(isinstance(s, tuple) for s in operands):
        return
    compare(lambda: getattr(F, name)(ours_a(), ours_b()),
            lambda: getattr(torch, name)(theirs_a(), theirs_b()), what=f"{name}{operands}")


ACTIVATIONS = [
    ("relu", {}), ("relu6", {}), ("leaky_relu", {"negative_slope": 0.2}), ("elu", {"alpha": 0.6}),
    ("hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("sigmoid", {}), ("tanh", {}),
    ("softplus", {}), ("softplus", {"beta": 2.0, "threshold": 3.0}), ("gelu", {}),
    ("gelu", {"approximate": "tanh"}), ("silu", {}), ("hardswish", {}), ("hardsigmoid", {}),
]


@FUZZ
@given(st.sampled_from(ACTIVATIONS), st.sampled_from([(5,), (3, 7), (2, 3, 5)]), st.booleans(), seeds)
def test_activations_with_special_values(ctx, activation, shape, special, seed):
    name, kwargs = activation
    a = data(seed, shape, -8, 8)
    if special:
        a.ravel()[:4] = [np.nan, np.inf, -np.inf, 0.0][:a.size]
    theirs = getattr(TF, name, None) or getattr(torch, name)
    compare(lambda: getattr(F, name)(dev(ctx, a), **kwargs), lambda: theirs(ref(a), **kwargs),
            what=f"{name}{kwargs}")


def _miopen_reference(mode, alpha, beta, gamma, x):
    A = dp.Activation
    return {
        A.PASTHRU: lambda: x, A.LOGISTIC: lambda: torch.sigmoid(x),
        A.TANH: lambda: beta * torch.tanh(alpha * x), A.RELU: lambda: torch.relu(x),
        A.SOFTRELU: lambda: torch.log1p(torch.exp(x)), A.ABS: lambda: x.abs(),
        A.POWER: lambda: (alpha + beta * x) ** gamma,
        A.CLIPPEDRELU: lambda: torch.clamp(torch.relu(x), max=alpha),
        A.LEAKYRELU: lambda: torch.where(x > 0, x, alpha * x),
        A.ELU: lambda: torch.where(x > 0, x, alpha * torch.expm1(x)),
    }[mode]()


# One (alpha, beta, gamma) per mode: the parameters are compiled into the kernels.
MIOPEN_MODES = [(dp.Activation.PASTHRU, 0, 0, 0), (dp.Activation.LOGISTIC, 0, 0, 0),
                (dp.Activation.TANH, 0.5, 2.0, 0), (dp.Activation.RELU, 0, 0, 0),
                (dp.Activation.SOFTRELU, 0, 0, 0), (dp.Activation.ABS, 0, 0, 0),
                (dp.Activation.POWER, 0.5, 2.0, 3.0), (dp.Activation.CLIPPEDRELU, 1.5, 0, 0),
                (dp.Activation.LEAKYRELU, 0.3, 0, 0), (dp.Activation.ELU, 0.7, 0, 0)]


@settings(FUZZ, max_examples=6)
@given(st.sampled_from(MIOPEN_MODES), st.sampled_from([(1.0, 0.0), (2.0, 0.5)]), seeds)
def test_miopen_activation_modes(ctx, mode_params, scaling, seed):
    """MIOpen's y = scale * act(x) + blend * y with the (alpha, beta, gamma) set, and the
    backward dx = scale * dy * act'(x) + blend * dx against torch's autograd."""
    mode, alpha, beta, gamma = mode_params
    x = data(seed, (4, 9), -3, 3)
    if mode is dp.Activation.POWER:
        x = np.abs(x)                        # (alpha + beta x) >= 0: a real power
    y0, dy, dx0 = data(seed + 1, (4, 9)), data(seed + 2, (4, 9)), data(seed + 3, (4, 9))
    scale, blend = scaling
    desc = dp.ActivationDesc(mode, alpha, beta, gamma)
    xd, y = dev(ctx, x), dev(ctx, y0)
    F.activation_forward(desc, xd, y, scale, blend)
    xt = ref(x).requires_grad_()
    act = _miopen_reference(mode, alpha, beta, gamma, xt)
    assert_matches(y, scale * act.detach() + blend * ref(y0), what=f"{mode} forward")
    (grad,) = torch.autograd.grad(act, xt, ref(dy))
    plain = dp.Tensor.empty(ctx, x.shape)
    F.activation_forward(desc, xd, plain)
    dx = dev(ctx, dx0)
    F.activation_backward(desc, plain, dev(ctx, dy), xd, dx, scale, blend)
    assert_matches(dx, scale * grad + blend * ref(dx0), tol=1e-4, what=f"{mode} backward")


# ---- pooling ---------------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from([(2, 3, 7, 6), (1, 2, 5, 5), (3, 4, 4)]), st.sampled_from([1, 2, 3, (2, 3)]),
       st.sampled_from([None, 1, 2, 3]), st.sampled_from([0, 1, 2, (1, 0)]), st.sampled_from([1, 2]),
       st.booleans(), st.booleans(), st.booleans(), seeds)
def test_pools(ctx, shape, kernel, stride, padding, dilation, ceil_mode, count_include_pad,
               is_max, seed):
    """Every combination, including torch's rule that a ceil_mode window must start inside the
    input or its left padding, and its refusals (padding over half the kernel, empty output)."""
    x = data(seed, shape)
    if is_max:
        compare(lambda: F.max_pool2d(dev(ctx, x), kernel, stride, padding, dilation, ceil_mode,
                                     return_indices=True),
                lambda: TF.max_pool2d(ref(x), kernel, stride, padding, dilation, ceil_mode,
                                      return_indices=True), what="max_pool2d")
    else:
        compare(lambda: F.avg_pool2d(dev(ctx, x), kernel, stride, padding, ceil_mode, count_include_pad),
                lambda: TF.avg_pool2d(ref(x), kernel, stride, padding, ceil_mode, count_include_pad),
                what="avg_pool2d")


@FUZZ
@given(st.sampled_from([(2, 3, 7, 6), (1, 2, 5, 5), (3, 4, 4)]),
       st.sampled_from([1, 2, 3, 5, 8, (2, 5), (None, 3), (4, None), 0, (0, 3)]), st.booleans(), seeds)
def test_adaptive_pools(ctx, shape, output_size, is_max, seed):
    x = data(seed, shape)
    if is_max:
        compare(lambda: F.adaptive_max_pool2d(dev(ctx, x), output_size, return_indices=True),
                lambda: TF.adaptive_max_pool2d(ref(x), output_size, return_indices=True))
    else:
        compare(lambda: F.adaptive_avg_pool2d(dev(ctx, x), output_size),
                lambda: TF.adaptive_avg_pool2d(ref(x), output_size))


# ---- normalisation ---------------------------------------------------------------------------

NORM_SHAPES = [(4, 3), (2, 3, 5), (2, 4, 3, 3), (1, 4, 1, 1), (3, 2, 2, 2, 2)]


@FUZZ
@given(st.sampled_from(NORM_SHAPES), st.booleans(), st.booleans(), st.booleans(), seeds)
def test_batch_norm(ctx, shape, training, affine, running, seed):
    x = data(seed, shape) * 3 + 1
    C = shape[1]
    mean, var = data(seed + 1, (C,)), data(seed + 2, (C,), 0.5, 1.5)
    w, b = data(seed + 3, (C,)), data(seed + 4, (C,))

    def ours():
        m, v = (dev(ctx, mean), dev(ctx, var)) if running else (None, None)
        y = F.batch_norm(dev(ctx, x), m, v, dev(ctx, w) if affine else None,
                         dev(ctx, b) if affine else None, training, 0.2, 1e-5)
        return (y, m, v) if running else y

    def theirs():
        m, v = (ref(mean), ref(var)) if running else (None, None)
        y = TF.batch_norm(ref(x), m, v, ref(w) if affine else None, ref(b) if affine else None,
                          training, 0.2, 1e-5)
        return (y, m, v) if running else y

    compare(ours, theirs, tol=1e-4, what=f"batch_norm{shape}")


@FUZZ
@given(st.sampled_from(NORM_SHAPES), st.data(), st.booleans(), seeds)
def test_layer_and_group_norm(ctx, shape, draw, affine, seed):
    x = data(seed, shape) * 2 + 0.5
    k = draw.draw(st.integers(1, len(shape)))
    normalized = shape[-k:]
    if draw.draw(st.integers(0, 7)) == 0:
        normalized = normalized[:-1] + (normalized[-1] + 1,)     # wrong: both must refuse
    w, b = data(seed + 1, normalized), data(seed + 2, normalized)
    compare(lambda: F.layer_norm(dev(ctx, x), normalized, dev(ctx, w) if affine else None,
                                 dev(ctx, b) if affine else None),
            lambda: TF.layer_norm(ref(x), normalized, ref(w) if affine else None,
                                  ref(b) if affine else None), tol=1e-4, what=f"layer_norm{normalized}")
    C = shape[1]
    groups = draw.draw(st.sampled_from([1, 2, 3, C]))
    wc, bc = data(seed + 3, (C,)), data(seed + 4, (C,))
    compare(lambda: F.group_norm(dev(ctx, x), groups, dev(ctx, wc) if affine else None,
                                 dev(ctx, bc) if affine else None),
            lambda: TF.group_norm(ref(x), groups, ref(wc) if affine else None,
                                  ref(bc) if affine else None), tol=1e-4, what=f"group_norm G={groups}")


@FUZZ
@given(st.sampled_from([(2, 5, 3, 3), (2, 6, 4), (1, 3, 2, 2, 2), (3, 1, 4)]), st.sampled_from([1, 2, 3, 5, 8]),
       st.sampled_from([(1e-4, 0.75, 1.0), (0.5, 0.5, 2.0)]), seeds)
def test_local_response_norm(ctx, shape, size, params, seed):
    x = data(seed, shape) * 2
    alpha, beta, k = params
    compare(lambda: F.local_response_norm(dev(ctx, x), size, alpha, beta, k),
            lambda: TF.local_response_norm(ref(x), size, alpha, beta, k), what=f"lrn{shape} {size}")


# ---- losses ----------------------------------------------------------------------------------

@FUZZ
@given(st.sampled_from([(4, 5), (5,), (2, 3, 4), (2, 3, 2, 2), (3, 1)]),
       st.sampled_from(["mean", "sum", "none"]), st.sampled_from([-100, 0, 1]),
       st.sampled_from(["none", "some", "all"]), st.booleans(), st.booleans(), seeds)
def test_nll_and_cross_entropy(ctx, shape, reduction, ignore_index, ignored, weighted, logits, seed):
    x = data(seed, shape, -2, 2)
    C = shape[0] if len(shape) == 1 else shape[1]
    target_shape = () if len(shape) == 1 else (shape[0],) + shape[2:]
    target = np.random.default_rng(seed).integers(0, C, size=target_shape).astype(np.int64)
    flat = target.reshape(-1)
    if ignored == "some":
        flat[0] = ignore_index
    elif ignored == "all":
        flat[:] = ignore_index
    if seed % 11 == 0:
        flat[-1] = C + 2 if seed % 2 else -7     # out of range: both must refuse
    w = data(seed + 1, (C,), 0.1, 1.0)
    ours_f, theirs_f = (F.cross_entropy, TF.cross_entropy) if logits else (F.nll_loss, TF.nll_loss)
    compare(lambda: ours_f(dev(ctx, x), dev(ctx, target), dev(ctx, w) if weighted else None,
                           ignore_index, reduction),
            lambda: theirs_f(ref(x), ref(target), ref(w) if weighted else None,
                             ignore_index=ignore_index, reduction=reduction),
            what=f"{ours_f.__name__}{shape} {reduction} ignore={ignore_index}/{ignored}")


@FUZZ
@given(st.sampled_from([((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((5,), ()),
                        ((2, 3), (3, 2)), ((0, 2), (0, 2))]),
       st.sampled_from(["mean", "sum", "none"]), seeds)
def test_mse_loss(ctx, shapes, reduction, seed):
    a, b = data(seed, shapes[0]), data(seed + 1, shapes[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # torch's note on broadcast targets
        compare(lambda: F.mse_loss(dev(ctx, a), dev(ctx, b), reduction),
                lambda: TF.mse_loss(ref(a), ref(b), reduction=reduction), what=f"mse{shapes}")


@FUZZ
@given(st.sampled_from([(3, 4), (5,), (2, 3, 2)]), st.sampled_from(["mean", "sum", "none"]),
       st.booleans(), st.booleans(), st.sampled_from([1.0, 40.0]), seeds)
def test_bce_with_logits(ctx, shape, reduction, weighted, pos_weighted, scale, seed):
    x, t = data(seed, shape) * scale, data(seed + 1, shape, 0, 1)
    w, pw = data(seed + 2, shape[-1:], 0.1, 1), data(seed + 3, shape[-1:], 0.1, 2)
    compare(lambda: F.binary_cross_entropy_with_logits(
                dev(ctx, x), dev(ctx, t), dev(ctx, w) if weighted else None, reduction,
                dev(ctx, pw) if pos_weighted else None),
            lambda: TF.binary_cross_entropy_with_logits(
                ref(x), ref(t), ref(w) if weighted else None, reduction=reduction,
                pos_weight=ref(pw) if pos_weighted else None), what="bce_with_logits")


# ---- tensor operations -----------------------------------------------------------------------

@FUZZ
@given(st.sampled_from([(2, 3, 4), (1, 3, 1, 2), (5,), (0, 3)]), st.data(), seeds)
def test_shape_operations(ctx, shape, draw, seed):
    x = data(seed, shape)
    nd = len(shape)
    dim = draw.draw(st.integers(-nd - 1, nd))
    other = np.array(x)
    if draw.draw(st.booleans()) and 0 <= dim % max(nd, 1) < nd and -nd <= dim < nd:
        grown = list(shape)
        grown[dim] += 2
        other = data(seed + 1, grown)
    compare(lambda: F.cat([dev(ctx, x), dev(ctx, other)], dim), lambda: torch.cat([ref(x), ref(other)], dim),
            what=f"cat dim={dim}")
    sizes = draw.draw(st.sampled_from([1, 2, 3, [1, 2], [2, 1, 1], [0, 3]]))
    compare(lambda: F.split(dev(ctx, x), sizes, dim), lambda: torch.split(ref(x), sizes, dim),
            what=f"split {sizes} dim={dim}")
    start, length = draw.draw(st.integers(-3, 4)), draw.draw(st.integers(0, 3))
    compare(lambda: F.narrow(dev(ctx, x), dim, start, length),
            lambda: torch.narrow(ref(x), dim, start, length), what=f"narrow {dim} {start} {length}")
    target = draw.draw(st.sampled_from([(-1,), (x.size,), (-1, 1), (2, -1), (1, -1, 1), (3, 3), (-1, -1)]))
    compare(lambda: F.reshape(dev(ctx, x), target), lambda: torch.reshape(ref(x), target),
            what=f"reshape {target}")
    a, b = draw.draw(st.integers(-nd - 1, nd)), draw.draw(st.integers(-nd - 1, nd))
    compare(lambda: F.flatten(dev(ctx, x), a, b), lambda: torch.flatten(ref(x), a, b), what=f"flatten {a} {b}")
    compare(lambda: F.transpose(dev(ctx, x), a, b), lambda: torch.transpose(ref(x), a, b),
            what=f"transpose {a} {b}")
    compare(lambda: F.squeeze(dev(ctx, x), dim), lambda: torch.squeeze(ref(x), dim), what=f"squeeze {dim}")
    compare(lambda: F.squeeze(dev(ctx, x)), lambda: torch.squeeze(ref(x)), what="squeeze")
    compare(lambda: F.unsqueeze(dev(ctx, x), dim), lambda: torch.unsqueeze(ref(x), dim),
            what=f"unsqueeze {dim}")
    order = draw.draw(st.permutations(range(nd)))
    if draw.draw(st.integers(0, 5)) == 0:
        order = order[:-1] + [order[0]]         # a repeated dim: both must refuse
    compare(lambda: F.permute(dev(ctx, x), order), lambda: ref(x).permute(order), what=f"permute {order}")


@FUZZ
@given(st.sampled_from([(5,), (3, 6), (2, 3, 5), (2, 3, 4, 5)]), st.sampled_from(["constant", "reflect", "replicate"]),
       st.lists(st.integers(-2, 4), min_size=2, max_size=4).filter(lambda p: len(p) % 2 == 0),
       st.sampled_from([None, 0.5]), seeds)
def test_pad(ctx, shape, mode, pads, value, seed):
    x = data(seed, shape)
    if mode != "constant":
        value = None
        # torch pads the last 1 or 2 dims of 2-4-d inputs outside constant mode.
        pads = pads[:2 * max(1, min(len(shape) - 1, 2))]
        if len(pads) // 2 + 1 < len(shape) - 1 and len(shape) > 2:
            pads = pads + [1, 1]
    compare(lambda: F.pad(dev(ctx, x), tuple(pads), mode, value),
            lambda: TF.pad(ref(x), tuple(pads), mode, value), what=f"pad {mode} {pads}")


@FUZZ
@given(st.sampled_from(["nearest", "bilinear", "area"]), st.sampled_from([None, False, True]),
       st.sampled_from([((10, 8), None), ((3, 7), None), (5, None), ((1, 1), None), (None, 2),
                        (None, 0.5), (None, (1.5, 2.5)), (None, 1.7)]), seeds)
def test_interpolate(ctx, mode, align_corners, size_scale, seed):
    x = data(seed, (2, 3, 5, 4))
    size, scale = size_scale
    compare(lambda: F.interpolate(dev(ctx, x), size, scale, mode, align_corners),
            lambda: TF.interpolate(ref(x), size, scale, mode, align_corners),
            what=f"interpolate {mode} {align_corners} {size_scale}")


# ---- linear and convolution ------------------------------------------------------------------

@FUZZ_COMPILING
@given(st.sampled_from([(3, 5), (5,), (2, 3, 5), (0, 5)]), st.sampled_from([1, 4]),
       st.booleans(), st.integers(0, 6), seeds)
def test_linear(ctx, input_shape, out_features, with_bias, corrupt, seed):
    x = data(seed, input_shape)
    w = data(seed + 1, (out_features, input_shape[-1] + (corrupt == 0)))
    b = data(seed + 2, (out_features + (corrupt == 1),))
    compare(lambda: F.linear(dev(ctx, x), dev(ctx, w), dev(ctx, b) if with_bias else None),
            lambda: TF.linear(ref(x), ref(w), ref(b) if with_bias else None), what="linear")


@settings(FUZZ, max_examples=4)
@given(st.sampled_from([(2, 4, 7, 6), (1, 4, 5, 5)]), st.sampled_from([4, 8]), st.sampled_from([1, 2, 4]),
       st.sampled_from([(3, 3), (1, 1), (2, 3)]), st.sampled_from([1, 2, (1, 2)]),
       st.sampled_from([0, 1, (1, 0)]), st.sampled_from([1, 2]), st.booleans(), st.booleans(), seeds)
def test_conv2d(ctx, shape, K, groups, kernel, stride, padding, dilation, nhwc, with_bias, seed):
    C = shape[1]
    x, w, b = data(seed, shape), data(seed + 1, (K, C // groups) + kernel), data(seed + 2, (K,))
    bias = (lambda: dev(ctx, b)) if with_bias else (lambda: None)
    expected = TF.conv2d(ref(x), ref(w), ref(b) if with_bias else None, stride, padding, dilation, groups)
    if nhwc:
        y = F.conv2d(dev(ctx, x.transpose(0, 2, 3, 1)), dev(ctx, w.transpose(0, 2, 3, 1)), bias(),
                     stride, padding, dilation, groups, layout="NHWC")
        assert_matches(y, expected.permute(0, 2, 3, 1), what="conv2d NHWC")
    else:
        assert_matches(F.conv2d(dev(ctx, x), dev(ctx, w), bias(), stride, padding, dilation, groups),
                       expected, what="conv2d")


@FUZZ_COMPILING
@given(st.sampled_from([(2, 4, 5, 4), (1, 4, 3, 3)]), st.sampled_from([2, 4]), st.sampled_from([1, 2]),
       st.sampled_from([(3, 3), (1, 1), (2, 3)]), st.sampled_from([1, 2, (2, 1)]),
       st.sampled_from([0, 1, (1, 0)]), st.sampled_from([0, 1]), st.sampled_from([1, 2]), st.booleans(),
       seeds)
def test_conv_transpose2d(ctx, shape, Cout, groups, kernel, stride, padding, output_padding, dilation,
                          nhwc, seed):
    """output_padding must be smaller than stride or dilation; torch's refusals must be ours."""
    C = shape[1]
    x, w, b = data(seed, shape), data(seed + 1, (C, Cout // groups) + kernel), data(seed + 2, (Cout,))
    if nhwc:
        compare(lambda: F.conv_transpose2d(dev(ctx, x.transpose(0, 2, 3, 1)), dev(ctx, w.transpose(0, 2, 3, 1)),
                                           dev(ctx, b), stride, padding, output_padding, groups, dilation,
                                           layout="NHWC"),
                lambda: TF.conv_transpose2d(ref(x), ref(w), ref(b), stride, padding, output_padding, groups,
                                            dilation).permute(0, 2, 3, 1), what="conv_transpose2d NHWC")
    else:
        compare(lambda: F.conv_transpose2d(dev(ctx, x), dev(ctx, w), dev(ctx, b), stride, padding,
                                           output_padding, groups, dilation),
                lambda: TF.conv_transpose2d(ref(x), ref(w), ref(b), stride, padding, output_padding,
                                            groups, dilation), what="conv_transpose2d")


# ---- dropout and autograd --------------------------------------------------------------------

@FUZZ
@given(st.sampled_from([(7,), (3, 33), (2, 5, 9)]), st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]),
       st.integers(0, 2 ** 40), st.integers(0, 3))
def test_dropout_is_deterministic_and_scaled(ctx, shape, p, seed, stream):
    x = data(seed % 1000, shape, 0.5, 1.5)
    first = F.dropout(dev(ctx, x), p, seed=seed, stream=stream).numpy()
    again = F.dropout(dev(ctx, x), p, seed=seed, stream=stream).numpy()
    assert np.array_equal(first, again)
    kept = first != 0
    if p < 1.0:
        np.testing.assert_allclose(first[kept], x[kept] / (1.0 - p), rtol=1e-6)
    else:
        assert not kept.any()
    if p == 0.0:
        assert kept.all()
    assert np.array_equal(F.dropout(dev(ctx, x), p, training=False).numpy(), x)
    mask = dp.ops.dropout.reference_mask(x.size, p, seed, stream) if 0 < p < 1 else None
    if mask is not None:
        assert np.array_equal(kept.ravel(), np.asarray(mask, bool).ravel())


@settings(FUZZ, max_examples=4)
@given(st.sampled_from(["relu", "gelu", "sigmoid"]), seeds)
def test_composed_gradients(ctx, act, seed):
    """d/d(x, w, b, y) of sum(mean(log_softmax(act(linear(x, w, b)) * y, -1), -1)) against
    torch's autograd (one shape: each GEMM configuration costs a PoCL build)."""
    shape, out_features = (2, 3, 5), 4
    x, w, b = data(seed, shape), data(seed + 1, (out_features, shape[-1])), data(seed + 2, (out_features,))
    y = data(seed + 3, shape[:-1] + (out_features,))
    ours = [dev(ctx, a, requires_grad=True) for a in (x, w, b, y)]
    theirs = [ref(a).requires_grad_() for a in (x, w, b, y)]

    def ours_chain(x, w, b, y):
        h = F.mul(getattr(F, act)(F.linear(x, w, b)), y)
        return F.sum(F.mean(F.log_softmax(h, dim=-1), -1))

    def torch_chain(x, w, b, y):
        h = getattr(torch, act)(TF.linear(x, w, b)) if act == "sigmoid" else getattr(TF, act)(TF.linear(x, w, b))
        h = h * y
        return TF.log_softmax(h, dim=-1).mean(-1).sum()

    out = ours_chain(*ours)
    out.backward()
    expected = torch_chain(*theirs)
    expected.backward()
    # A sum of products of either sign: float32 cancellation sets the bound, not the operators.
    assert_matches(out, expected, tol=1e-4, what="loss")
    for k, (o, t) in enumerate(zip(ours, theirs)):
        assert_matches(o.grad, t.grad, tol=1e-4, what=f"grad {k}")


# Gradients of single operators: (name, our call, torch's call, input shapes).
GRADIENT_CASES = [
    ("max_pool2d", lambda x: F.max_pool2d(x, 3, 2, 1, 1, True), lambda x: TF.max_pool2d(x, 3, 2, 1, 1, True),
     [(2, 3, 7, 6)]),
    ("max_pool2d dilated", lambda x: F.max_pool2d(x, 2, 1, 1, 2), lambda x: TF.max_pool2d(x, 2, 1, 1, 2),
     [(1, 2, 6, 5)]),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, (2, 3), (1, 2), (1, 0), True, False),
     lambda x: TF.avg_pool2d(x, (2, 3), (1, 2), (1, 0), True, False), [(2, 3, 7, 6)]),
    ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (2, 5)),
     lambda x: TF.adaptive_avg_pool2d(x, (2, 5)), [(2, 3, 7, 6)]),
    ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, 3), lambda x: TF.adaptive_max_pool2d(x, 3),
     [(2, 3, 7, 6)]),
    ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
     lambda x, w, b: TF.batch_norm(x, None, None, w, b, True), [(4, 3, 5), (3,), (3,)]),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (4, 5), w, b), lambda x, w, b: TF.layer_norm(x, (4, 5), w, b),
     [(2, 3, 4, 5), (4, 5), (4, 5)]),
    ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), lambda x, w, b: TF.group_norm(x, 2, w, b),
     [(2, 4, 3, 3), (4,), (4,)]),
    ("softmax", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1), [(3, 7, 2)]),
    ("log_softmax", lambda x: F.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1), [(3, 7)]),
    ("pad reflect", lambda x: F.pad(x, (2, 1, 0, 3), "reflect"), lambda x: TF.pad(x, (2, 1, 0, 3), "reflect"),
     [(2, 3, 5, 4)]),
    ("pad replicate", lambda x: F.pad(x, (3, 1), "replicate"), lambda x: TF.pad(x, (3, 1), "replicate"),
     [(2, 3, 5)]),
    ("pad crop", lambda x: F.pad(x, (-1, 2, 1, -2)), lambda x: TF.pad(x, (-1, 2, 1, -2)), [(2, 5, 4)]),
    ("interpolate bilinear", lambda x: F.interpolate(x, (7, 3), mode="bilinear", align_corners=True),
     lambda x: TF.interpolate(x, (7, 3), mode="bilinear", align_corners=True), [(1, 2, 4, 5)]),
    ("interpolate nearest", lambda x: F.interpolate(x, scale_factor=1.6),
     lambda x: TF.interpolate(x, scale_factor=1.6), [(1, 2, 4, 5)]),
    ("mse_loss", lambda a, b: F.mse_loss(a, b), lambda a, b: TF.mse_loss(a, b), [(3, 4), (3, 4)]),
    ("bce_with_logits", lambda a, t: F.binary_cross_entropy_with_logits(a, t, reduction="sum"),
     lambda a, t: TF.binary_cross_entropy_with_logits(a, t, reduction="sum"), [(3, 4), (3, 4)]),
    ("cross_entropy probabilities", lambda a, t: F.cross_entropy(a, t), lambda a, t: TF.cross_entropy(a, t),
     [(4, 5), (4, 5)]),
    ("amax", lambda x: F.amax(x, (0, 2)), lambda x: torch.amax(x, (0, 2)), [(3, 4, 2)]),
    ("norm 3", lambda x: F.norm(x, 3, 1), lambda x: torch.linalg.vector_norm(x, 3, 1), [(3, 4)]),
    ("maximum", lambda a, b: F.maximum(a, b), lambda a, b: torch.maximum(a, b), [(3, 4), (4,)]),
    ("div", lambda a, b: F.div(a, b), lambda a, b: torch.div(a, b), [(3, 1), (1, 4)]),
    ("cat", lambda a, b: F.cat([a, b], -1), lambda a, b: torch.cat([a, b], -1), [(2, 3), (2, 2)]),
    ("permute", lambda x: F.permute(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    ("conv2d", lambda x, w, b: F.conv2d(x, w, b, 2, 1, 1, 2), lambda x, w, b: TF.conv2d(x, w, b, 2, 1, 1, 2),
     [(2, 4, 6, 5), (4, 2, 3, 3), (4,)]),
    ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, 2, 1, 1),
     lambda x, w, b: TF.conv_transpose2d(x, w, b, 2, 1, 1), [(2, 4, 3, 3), (4, 2, 3, 3), (2,)]),
]


@settings(FUZZ, max_examples=8)
@given(st.sampled_from(GRADIENT_CASES), st.booleans(), seeds)
def test_gradients(ctx, case, ties, seed):
    """Every input's gradient of sum(op(inputs) * g) against torch's autograd; ``ties`` rounds
    the data so that maxima and comparisons tie."""
    name, ours, theirs, shapes = case
    arrays = [data(seed + k, s) for k, s in enumerate(shapes)]
    if name == "cross_entropy probabilities":
        arrays[1] = np.abs(arrays[1])
    if ties:
        arrays = [np.round(a * 2) / 2 + (0.75 if name in ("div", "norm 3") else 0) for a in arrays]
    inputs = [dev(ctx, a, requires_grad=True) for a in arrays]
    references = [ref(a).requires_grad_() for a in arrays]
    out, expected = ours(*inputs), theirs(*references)
    assert_matches(out, expected, tol=1e-5, what=f"{name} forward")
    g = data(seed + 99, tuple(expected.shape))
    out.backward(dev(ctx, g))
    (expected * ref(g)).sum().backward()
    for k, (o, t) in enumerate(zip(inputs, references)):
        assert_matches(o.grad, t.grad, tol=1e-4, what=f"{name} gradient of input {k}")


# Malformed arguments: each must raise a library error (never TypeError, ValueError, KeyError or
# an OpenCL error from inside, and never succeed). ``x`` is (2, 3, 4, 5), ``m`` is (3, 4).
MALFORMED = [
    lambda x, m: F.sum(m, 1.0), lambda x, m: F.sum(m, "a"), lambda x, m: F.sum(m, (0, -2)),
    lambda x, m: F.argmax(m, (0,)), lambda x, m: F.norm(m, "nuc"), lambda x, m: F.norm(m, float("nan")),
    lambda x, m: F.softmax(m, 1.0), lambda x, m: F.softmax(m, 2), lambda x, m: F.log_softmax(m, None),
    lambda x, m: F.add(m, "a"), lambda x, m: F.add(m, None), lambda x, m: F.mul(m, [1.0]),
    lambda x, m: F.maximum(m, dev(m.ctx, np.ones(5, np.float32))), lambda x, m: F.sum(np.ones(3, np.float32)),
    lambda x, m: F.relu(np.ones(3, np.float32)), lambda x, m: F.leaky_relu(m, "a"),
    lambda x, m: F.softplus(m, "a"), lambda x, m: F.hardtanh(m, 2.0, 1.0), lambda x, m: F.gelu(m, "fast"),
    lambda x, m: F.split(m, 1.5), lambda x, m: F.split(m, [1, 1]), lambda x, m: F.split(m, 0),
    lambda x, m: F.narrow(m, 0, 2, 2), lambda x, m: F.narrow(m, 2, 0, 1), lambda x, m: F.reshape(m, None),
    lambda x, m: F.reshape(m, (5, -1)), lambda x, m: F.reshape(m, (-1, -1)), lambda x, m: F.permute(m, None),
    lambda x, m: F.permute(m, (0, 0)), lambda x, m: F.transpose(m, 0, 2), lambda x, m: F.flatten(x, 2, 1),
    lambda x, m: F.squeeze(m, 2), lambda x, m: F.unsqueeze(m, 3), lambda x, m: F.cat([m, x], 0),
    lambda x, m: F.cat([], 0), lambda x, m: F.pad(m, (1.5, 1)), lambda x, m: F.pad(m, (1, 1, 1)),
    lambda x, m: F.pad(m, (1, 1), "constant", "a"), lambda x, m: F.pad(m, (4, 0), "reflect"),
    lambda x, m: F.pad(m, (-3, -2)),
    lambda x, m: F.max_pool2d(x, 2.0), lambda x, m: F.max_pool2d(x, 0), lambda x, m: F.max_pool2d(x, 2, 0),
    lambda x, m: F.max_pool2d(x, 3, padding=2), lambda x, m: F.max_pool2d(x, 6),
    lambda x, m: F.avg_pool2d(x, 2, divisor_override=0), lambda x, m: F.max_pool2d(m, 2),
    lambda x, m: F.adaptive_avg_pool2d(x, 2.5), lambda x, m: F.adaptive_max_pool2d(x, -1),
    lambda x, m: F.batch_norm(x, None, None, training=True, momentum="a"),
    lambda x, m: F.batch_norm(x, dev(x.ctx, np.zeros(4, np.float32)), dev(x.ctx, np.ones(4, np.float32))),
    lambda x, m: F.layer_norm(x, (4,)), lambda x, m: F.group_norm(x, 2), lambda x, m: F.group_norm(x, 0),
    lambda x, m: F.mse_loss(m, m, "avg"), lambda x, m: F.mse_loss(m, x),
    lambda x, m: F.nll_loss(m, dev(m.ctx, np.zeros(3, np.float32))),
    lambda x, m: F.nll_loss(m, dev(m.ctx, np.zeros(4, np.int64))),
    lambda x, m: F.nll_loss(m, dev(m.ctx, np.array([0, 4, 1], np.int64))),
    lambda x, m: F.cross_entropy(m, dev(m.ctx, np.array([0, -1, 1], np.int64))),
    lambda x, m: F.binary_cross_entropy_with_logits(m, x),
    lambda x, m: F.interpolate(x), lambda x, m: F.interpolate(x, (2, 2), 2), lambda x, m: F.interpolate(x, scale_factor=-1),
    lambda x, m: F.interpolate(x, 2, mode="linear"), lambda x, m: F.interpolate(x, 2, mode="nearest", align_corners=True),
    lambda x, m: F.linear(x, m), lambda x, m: F.linear(m, dev(m.ctx, np.ones((2, 4), np.float32)), m),
    lambda x, m: F.conv2d(x, m), lambda x, m: F.conv2d(x, dev(x.ctx, np.ones((2, 2, 3, 3), np.float32))),
    lambda x, m: F.conv2d(x, dev(x.ctx, np.ones((2, 3, 3, 3), np.float32)), stride=0),
    lambda x, m: F.conv2d(x, dev(x.ctx, np.ones((2, 3, 5, 5), np.float32))),
    lambda x, m: F.conv2d(x, dev(x.ctx, np.ones((2, 3, 3, 3), np.float32)), groups=2),
    lambda x, m: F.conv_transpose2d(x, dev(x.ctx, np.ones((3, 2, 3, 3), np.float32)), stride=2, output_padding=2),
    lambda x, m: F.dropout(m, 1.5), lambda x, m: F.dropout(m, 0.5, seed=-1), lambda x, m: F.dropout(m, "a"),
    # After a valid call whose memo key compares equal (True == 1 == 1.0).
    lambda x, m: (F.sum(m, 1), F.sum(m, True)), lambda x, m: (F.amax(m, (1,)), F.amax(m, (1.0,))),
    lambda x, m: (F.max_pool2d(x, 2), F.max_pool2d(x, 2.0)),
    lambda x, m: (F.avg_pool2d(x, 2, 1), F.avg_pool2d(x, 2, 1.0)),
    lambda x, m: (F.nll_loss(m, dev(m.ctx, np.zeros(3, np.int64)), ignore_index=1),
                  F.nll_loss(m, dev(m.ctx, np.zeros(3, np.int64)), ignore_index=1.0)),
    lambda x, m: F.nll_loss(m, dev(m.ctx, np.zeros(3, np.int64)), ignore_index=1.5),
    lambda x, m: m.fill_("a"), lambda x, m: F.pad(m, (1,), "constant"),
]


@pytest.mark.parametrize("index", range(len(MALFORMED)))
def test_malformed_arguments_raise_library_errors(ctx, index):
    x = dev(ctx, data(index, (2, 3, 4, 5)))
    m = dev(ctx, data(index, (3, 4)))
    with pytest.raises(dp.DlprimError):
        _synchronized(MALFORMED[index](x, m))
