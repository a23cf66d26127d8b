"""conv1d, conv3d and their transposes, unbatched inputs, padding='same' with even kernels,
unfold / fold, pixel_shuffle / pixel_unshuffle / channel_shuffle, against torch (float64):
values and gradients of every input, each 3-D solver forced on its own, every buffer the
library allocates poisoned with NaN; bad input; repeated calls building nothing."""
import numpy as np
import pyopencl as cl
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import program
from dlprim_py import tensor as tensor_module
from conftest import assert_close, random

TF = torch.nn.functional
# torch warns that it copies the input for an even kernel with padding="same".
pytestmark = pytest.mark.filterwarnings("ignore:Using padding=.same.")


@pytest.fixture(scope="module", autouse=True)
def poisoned_allocations():
    """Every buffer the library allocates starts as NaN, so an unwritten output element (or a
    stale one the memory pool hands back) fails."""
    original = tensor_module.allocate

    def allocate(ctx, nbytes):
        buffer = original(ctx, nbytes)
        if nbytes >= 4:
            cl.enqueue_fill_buffer(ctx.queue, buffer, np.float32(np.nan), 0, nbytes // 4 * 4)
        return buffer

    tensor_module.allocate = allocate
    yield
    tensor_module.allocate = original


def _check(ctx, rng, ours, theirs, *shapes, grads=True):
    """ours(*tensors) against theirs(*float64 torch tensors) on seeded data: the value and,
    with ``grads``, the gradient of every input."""
    arrays = [random(rng, s) for s in shapes]
    xs = [dp.Tensor.from_numpy(ctx, a, requires_grad=grads) for a in arrays]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=grads) for a in arrays]
    y, ref = ours(*xs), theirs(*ts)
    assert y.shape == tuple(ref.shape)
    assert_close(y.numpy(), ref.detach().numpy())
    if grads:
        g = random(rng, ref.shape)
        y.backward(dp.Tensor.from_numpy(ctx, g))
        ref.backward(torch.tensor(g, dtype=torch.float64))
        for x, t in zip(xs, ts):
            assert_close(x.grad.numpy(), t.grad.numpy())


# ---- 1-D ------------------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape,w_shape,bias,kwargs", [
    ((2, 4, 11), (6, 2, 3), True, dict(stride=2, padding=1, dilation=2, groups=2)),
    ((4, 9), (5, 4, 3), False, dict(padding=(2,))),                  # unbatched
    ((2, 3, 10), (4, 3, 4), True, dict(padding="same")),             # even kernel
    ((2, 3, 10), (4, 3, 2), False, dict(padding="same", dilation=3)),
    ((2, 3, 10), (4, 3, 3), False, dict(padding="valid")),
])
def test_conv1d(ctx, rng, x_shape, w_shape, bias, kwargs):
    shapes = (x_shape, w_shape) + (((w_shape[0],),) if bias else ())
    _check(ctx, rng, lambda *a: F.conv1d(*a, **kwargs), lambda *a: TF.conv1d(*a, **kwargs),
           *shapes)


@pytest.mark.parametrize("x_shape,w_shape,bias,kwargs", [
    ((2, 4, 7), (4, 3, 3), True, dict(stride=3, padding=1, output_padding=1, groups=2,
                                      dilation=2)),
    ((4, 6), (4, 2, 2), False, dict(stride=2)),                      # unbatched
])
def test_conv_transpose1d(ctx, rng, x_shape, w_shape, bias, kwargs):
    cout = w_shape[1] * kwargs.get("groups", 1)
    shapes = (x_shape, w_shape) + (((cout,),) if bias else ())
    _check(ctx, rng, lambda *a: F.conv_transpose1d(*a, **kwargs),
           lambda *a: TF.conv_transpose1d(*a, **kwargs), *shapes)


# ---- 2-D: unbatched, 'same' with even kernels ------------------------------------------------

@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 3, 7, 6), (4, 3, 2, 4), dict(padding="same")),
    ((2, 4, 7, 6), (4, 2, 3, 2), dict(padding="same", dilation=(1, 3), groups=2)),
    ((3, 7, 6), (4, 3, 3, 3), dict(padding=1, stride=2)),             # unbatched
    ((3, 7, 6), (4, 3, 2, 2), dict(padding="same")),                  # both
])
def test_conv2d_unbatched_and_same(ctx, rng, x_shape, w_shape, kwargs):
    _check(ctx, rng, lambda x, w, b: F.conv2d(x, w, b, **kwargs),
           lambda x, w, b: TF.conv2d(x, w, b, **kwargs), x_shape, w_shape, (w_shape[0],))


def test_conv_transpose2d_unbatched(ctx, rng):
    kwargs = dict(stride=2, padding=1, output_padding=1)
    _check(ctx, rng, lambda x, w: F.conv_transpose2d(x, w, **kwargs),
           lambda x, w: TF.conv_transpose2d(x, w, **kwargs), (4, 5, 6), (4, 3, 3, 2))


# ---- 3-D: each solver on its own --------------------------------------------------------------

CONV3D = [
    ((2, 4, 5, 6, 7), (6, 2, 2, 3, 3), True,
     dict(stride=(1, 2, 2), padding=(1, 0, 1), dilation=(2, 1, 1), groups=2)),
    ((3, 4, 5, 6), (5, 3, 2, 3, 2), False, dict(padding="same")),      # unbatched, even
    ((2, 4, 4, 5, 5), (4, 1, 3, 3, 3), True, dict(padding=1, groups=4)),   # depthwise
]
CONV_TRANSPOSE3D = [
    ((2, 4, 3, 4, 5), (4, 3, 3, 2, 3), True,
     dict(stride=(2, 1, 2), padding=(1, 0, 1), output_padding=(1, 0, 1), groups=2,
          dilation=(1, 2, 1))),
    ((2, 3, 3, 4), (2, 3, 2, 2, 2), False, dict(stride=2)),            # unbatched
]


@pytest.mark.parametrize("algo", ["vol2col_gemm", "direct"])
def test_conv3d_forced(ctx, rng, monkeypatch, algo):
    monkeypatch.setenv("DLPRIM_CONV3D_ALGO", algo)
    dp.config.reload()
    for x_shape, w_shape, bias, kwargs in CONV3D:
        shapes = (x_shape, w_shape) + (((w_shape[0],),) if bias else ())
        _check(ctx, rng, lambda *a: F.conv3d(*a, **kwargs), lambda *a: TF.conv3d(*a, **kwargs),
               *shapes)
    for x_shape, w_shape, bias, kwargs in CONV_TRANSPOSE3D:
        cout = w_shape[1] * kwargs.get("groups", 1)
        shapes = (x_shape, w_shape) + (((cout,),) if bias else ())
        _check(ctx, rng, lambda *a: F.conv_transpose3d(*a, **kwargs),
               lambda *a: TF.conv_transpose3d(*a, **kwargs), *shapes)


def test_conv3d_vol2col_in_chunks(ctx, rng, tuning_rules):
    """A rule of the user's database chooses the solver and its chunk: one image per chunk, so
    the forward and data gradient run chunk after chunk and the filter gradient accumulates
    over chunks."""
    tuning_rules("conv3d", [{"when": {}, "params": {"solver": "vol2col_gemm", "chunk_bytes": 4},
                             "why": "test"}])
    from dlprim_py.ops.conv import volumetric as module
    problem = module.make_problem((3, 2, 4, 4, 4), (3, 2, 2, 2, 2), 1, 1, 1, 1)
    from dlprim_py import solver
    assert solver.select(ctx, "conv3d", module.Conv3dTask(problem, "forward")).name == \
        "vol2col_gemm"
    assert module.Vol2colGemm.chunk(ctx, problem, {"chunk_bytes": 4}) == 1
    _check(ctx, rng, lambda x, w, b: F.conv3d(x, w, b, padding=1),
           lambda x, w, b: TF.conv3d(x, w, b, padding=1), (3, 2, 4, 4, 4), (3, 2, 2, 2, 2), (3,))


def test_conv3d_rules_prefer_direct_for_depthwise(ctx):
    from dlprim_py import solver
    from dlprim_py.ops.conv import volumetric as module
    depthwise = module.make_problem((2, 8, 4, 4, 4), (8, 1, 3, 3, 3), 1, 1, 1, 8)
    dense = module.make_problem((2, 8, 4, 4, 4), (16, 8, 3, 3, 3), 1, 1, 1, 1)
    assert solver.select(ctx, "conv3d", module.Conv3dTask(depthwise, "forward")).name == "direct"
    assert solver.select(ctx, "conv3d", module.Conv3dTask(dense, "forward")).name == \
        "vol2col_gemm"


def test_conv3d_empty_batch(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, np.zeros((0, 2, 3, 3, 3), np.float32), requires_grad=True)
    w = dp.Tensor.from_numpy(ctx, random(rng, (4, 2, 2, 2, 2)), requires_grad=True)
    y = F.conv3d(x, w)
    assert y.shape == (0, 4, 2, 2, 2)
    y.backward(dp.Tensor.empty(ctx, y.shape))
    assert not w.grad.numpy().any()


# ---- unfold / fold and the shuffles ------------------------------------------------------------

UNFOLD = dict(kernel_size=(2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1))


def test_unfold_fold(ctx, rng):
    _check(ctx, rng, lambda x: F.unfold(x, **UNFOLD), lambda x: TF.unfold(x, **UNFOLD),
           (2, 3, 6, 7))
    _check(ctx, rng, lambda x: F.unfold(x, 2), lambda x: TF.unfold(x, 2), (3, 4, 4))
    blocks = TF.unfold(torch.ones(1, 1, 6, 7), **UNFOLD).shape[-1]
    _check(ctx, rng, lambda x: F.fold(x, (6, 7), **UNFOLD), lambda x: TF.fold(x, (6, 7), **UNFOLD),
           (2, 18, blocks))
    _check(ctx, rng, lambda x: F.fold(x, 3, 2), lambda x: TF.fold(x, 3, 2), (12, 4))


@pytest.mark.parametrize("name,shape,factor", [
    ("pixel_shuffle", (2, 8, 3, 4), 2), ("pixel_shuffle", (2, 1, 9, 2, 3), 3),
    ("pixel_unshuffle", (3, 4, 6), 2), ("pixel_unshuffle", (2, 2, 6, 3), 3),
    ("channel_shuffle", (2, 6, 2, 3), 3), ("channel_shuffle", (2, 4, 5), 2),
])
def test_shuffles(ctx, rng, name, shape, factor):
    _check(ctx, rng, lambda x: getattr(F, name)(x, factor),
           lambda x: getattr(TF, name)(x, factor), shape)


# ---- bad input ------------------------------------------------------------------------------

def test_bad_input(ctx, rng):
    def t(*shape):
        return dp.Tensor.from_numpy(ctx, random(rng, shape))

    with pytest.raises(dp.ShapeError, match="rank 3"):
        F.conv1d(t(2, 3, 5), t(4, 3, 3, 3))
    with pytest.raises(dp.ShapeError, match=r"\(N, C, L\)"):
        F.conv1d(t(2, 3, 5, 5), t(4, 3, 3))
    with pytest.raises(dp.ShapeError, match="divisible by groups"):
        F.conv1d(t(2, 3, 5), t(4, 1, 3), groups=2)
    with pytest.raises(dp.UnsupportedError, match="stride 1"):
        F.conv1d(t(2, 3, 5), t(4, 3, 2), padding="same", stride=2)
    with pytest.raises(dp.ShapeError, match="rank 5"):
        F.conv3d(t(2, 3, 4, 4, 4), t(4, 3, 3, 3))
    with pytest.raises(dp.ShapeError, match=r"rank 5 \(N, C, D, H, W\) or 4"):
        F.conv3d(t(3, 4, 4), t(4, 3, 3, 3, 3))
    with pytest.raises(dp.ShapeError, match="divisible by groups"):
        F.conv3d(t(1, 3, 4, 4, 4), t(4, 1, 3, 3, 3), groups=2)
    with pytest.raises(dp.ShapeError, match="channels per group"):
        F.conv3d(t(1, 4, 4, 4, 4), t(4, 3, 3, 3, 3), groups=2)
    with pytest.raises(dp.ShapeError, match="larger than the padded input"):
        F.conv3d(t(1, 2, 2, 4, 4), t(4, 2, 3, 3, 3))
    with pytest.raises(dp.ShapeError, match="bias"):
        F.conv3d(t(1, 2, 4, 4, 4), t(4, 2, 3, 3, 3), t(3))
    with pytest.raises(dp.ShapeError, match="3 ints"):
        F.conv3d(t(1, 2, 4, 4, 4), t(4, 2, 3, 3, 3), stride=(1, 2))
    with pytest.raises(dp.DTypeError, match="float32"):
        F.conv3d(dp.Tensor.from_numpy(ctx, np.ones((1, 2, 4, 4, 4), np.int32)),
                 t(4, 2, 3, 3, 3))
    with pytest.raises(dp.UnsupportedError, match="vol2col_gemm, direct|applicable|unknown"):
        F.conv3d(t(1, 2, 4, 4, 4), t(4, 2, 3, 3, 3), algorithm="winograd")
    with pytest.raises(dp.ShapeError, match="output_padding"):
        F.conv_transpose3d(t(1, 2, 3, 3, 3), t(2, 2, 3, 3, 3), stride=2, output_padding=2)
    with pytest.raises(dp.ShapeError, match="input channels"):
        F.conv_transpose3d(t(1, 3, 3, 3, 3), t(2, 2, 3, 3, 3))
    with pytest.raises(dp.ShapeError, match=r"\(N, C, H, W\) or \(C, H, W\)"):
        F.unfold(t(2, 3), 2)
    with pytest.raises(dp.ShapeError, match="does not fit"):
        F.unfold(t(1, 2, 3, 3), 4)
    with pytest.raises(dp.ShapeError, match="divisible by the kernel"):
        F.fold(t(1, 5, 4), 3, 2)
    with pytest.raises(dp.ShapeError, match="blocks"):
        F.fold(t(1, 8, 5), 3, 2)
    with pytest.raises(dp.ShapeError, match="divisible by upscale"):
        F.pixel_shuffle(t(1, 6, 2, 2), 2)
    with pytest.raises(dp.ShapeError, match="at least 3"):
        F.pixel_shuffle(t(4, 2), 2)
    with pytest.raises(dp.ShapeError, match="divisible by downscale"):
        F.pixel_unshuffle(t(1, 1, 3, 4), 2)
    with pytest.raises(dp.ShapeError, match="divisible by groups"):
        F.channel_shuffle(t(1, 5, 2), 2)
    with pytest.raises(dp.ShapeError, match="more than 2"):
        F.channel_shuffle(t(1, 6), 2)
    with pytest.raises(dp.ShapeError, match="positive int"):
        F.channel_shuffle(t(1, 6, 2), 0)


# ---- repeated calls build nothing -------------------------------------------------------------

def test_repeated_calls_build_nothing(ctx, rng):
    """After one call (which builds), two more calls with the same shapes render, build and
    create nothing, forward and backward through the tape."""
    leaves = []

    def leaf(*shape):
        leaves.append(dp.Tensor.from_numpy(ctx, random(rng, shape), requires_grad=True))
        return leaves[-1]

    x1, w1, x3, w3, b3 = leaf(2, 4, 9), leaf(4, 2, 2), leaf(2, 4, 4, 5, 5), leaf(4, 2, 3, 3, 3), \
        leaf(4)
    x2, wd = leaf(2, 4, 6, 6), leaf(4, 1, 3, 3, 3)

    def backward(y):
        y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        # Every call starts without gradients (accumulating into one is another operation).
        for t in leaves:
            t.grad = None

    w2 = leaf(3, 4, 2, 2)
    calls = [
        lambda: backward(F.conv1d(x1, w1, padding="same", groups=2)),
        lambda: backward(F.conv_transpose1d(x1, w1.reshape(4, 2, 2) * 1.0, stride=2)),
        lambda: backward(F.conv3d(x3, w3, b3, padding=1, groups=2)),
        lambda: backward(F.conv3d(x3, wd, padding=1, groups=4)),
        lambda: backward(F.conv_transpose3d(x3, w3.reshape(4, 2, 3, 3, 3) * 1.0, stride=2)),
        lambda: backward(F.conv2d(x2[0] * 1.0, w2, padding="same")),
        lambda: backward(F.max_pool3d(x3, 2, padding=1)),
        lambda: backward(F.avg_pool1d(x1, 3, stride=2)),
        lambda: backward(F.adaptive_max_pool3d(x3, (2, 3, 2))),
        lambda: backward(F.fold(F.unfold(x2, 2, padding=1), (6, 6), 2, padding=1)),
        lambda: backward(F.channel_shuffle(F.pixel_unshuffle(F.pixel_shuffle(x2, 2), 2), 2)),
        lambda: backward(F.pad(x2, (1, -1, 2, 2), mode="circular")),
    ]
    for k, call in enumerate(calls):
        call()
        before = dict(program.stats)
        call()
        call()
        ctx.synchronize()
        assert dict(program.stats) == before, f"call {k}: a repeated call built something"
