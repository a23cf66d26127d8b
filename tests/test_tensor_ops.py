"""cat, split, narrow, permute, transpose, pad and the shape views, against torch (float64),
forward and gradients."""
import numpy as np
import pytest
import torch

import dlprim_py as dp
import dlprim_py.functional as F
from conftest import assert_close, random


def _pair(ctx, rng, shape, offset_elements=0):
    """A dp tensor at a non-zero buffer offset (kernels must honour it) and a float64 torch leaf."""
    data = random(rng, shape)
    if offset_elements:
        backing = dp.Tensor.from_numpy(ctx, np.concatenate([random(rng, offset_elements), data.ravel()]))
        x = dp.Tensor(ctx, backing.buffer, shape, np.float32, offset=offset_elements * 4)
        x.requires_grad_(True)
    else:
        x = dp.Tensor.from_numpy(ctx, data, requires_grad=True)
    return x, torch.tensor(data, dtype=torch.float64, requires_grad=True)


def _check_grad(rng, out, ref, pairs):
    grad = random(rng, ref.shape)
    out.backward(dp.Tensor.from_numpy(out.ctx, grad))
    ref.backward(torch.tensor(grad, dtype=torch.float64))
    for x, t in pairs:
        assert_close(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("shape,dim,start,length", [((5, 7, 3), 1, 2, 4), ((9,), 0, 8, 1),
                                                    ((4, 6), -1, 0, 6), ((3, 4), 0, 1, 0)])
def test_narrow(ctx, rng, shape, dim, start, length):
    x, t = _pair(ctx, rng, shape, offset_elements=3)
    out = F.narrow(x, dim, start, length)
    ref = t.narrow(dim, start, length)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    if out.size:
        _check_grad(rng, out, ref, [(x, t)])


def test_narrow_start_as_a_0d_tensor(ctx, rng):
    """torch.narrow takes a 0-d integer tensor for start (PyTorch's OpInfo samples pass one)."""
    x, t = _pair(ctx, rng, (5, 6))
    start = dp.Tensor.from_numpy(ctx, np.array(-4, np.int64))
    out = F.narrow(x, 1, start, 3)
    assert_close(out.numpy(), t.narrow(1, torch.tensor(-4), 3).detach().numpy())
    with pytest.raises(dp.ShapeError, match="must be ints"):
        F.narrow(x, 1, dp.Tensor.from_numpy(ctx, np.array([1], np.int64)), 3)


@pytest.mark.parametrize("sections", [2, [1, 4, 2], 7])
def test_split(ctx, rng, sections):
    x, t = _pair(ctx, rng, (3, 7, 2))
    outs = F.split(x, sections, dim=1)
    refs = torch.split(t, sections, dim=1)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert_close(o.numpy(), r.detach().numpy())
    # Each piece's backward embeds its gradient in a full-size zero tensor; the tape sums them.
    joined = F.cat([o * float(k + 1) for k, o in enumerate(outs)], 1)
    ref_joined = torch.cat([r * float(k + 1) for k, r in enumerate(refs)], 1)
    _check_grad(rng, joined, ref_joined, [(x, t)])


@pytest.mark.parametrize("shapes,dim", [([(2, 3, 5), (2, 1, 5), (2, 4, 5)], 1),
                                        ([(3, 2), (3, 2)], -1), ([(1,), (5,)], 0),
                                        ([(2, 3), (1, 3)], 0)])
def test_cat(ctx, rng, shapes, dim):
    pairs = [_pair(ctx, rng, s, offset_elements=k) for k, s in enumerate(shapes)]
    out = F.cat([p[0] for p in pairs], dim)
    ref = torch.cat([p[1] for p in pairs], dim)
    assert_close(out.numpy(), ref.detach().numpy())
    _check_grad(rng, out, ref, pairs)


@pytest.mark.parametrize("shape,dims", [((2, 3, 4), (2, 0, 1)), ((5, 1, 3, 2), (3, 1, 0, 2)),
                                        ((7,), (0,)), ((33, 17), (1, 0))])
def test_permute(ctx, rng, shape, dims):
    x, t = _pair(ctx, rng, shape, offset_elements=5)
    out = F.permute(x, dims)
    ref = t.permute(dims)
    assert_close(out.numpy(), ref.detach().numpy())
    _check_grad(rng, out, ref, [(x, t)])


def test_transpose(ctx, rng):
    x, t = _pair(ctx, rng, (3, 4, 5))
    out = F.transpose(x, 0, -1)
    ref = t.transpose(0, -1)
    assert_close(out.numpy(), ref.detach().numpy())
    _check_grad(rng, out, ref, [(x, t)])


def test_views(ctx, rng):
    x, t = _pair(ctx, rng, (2, 1, 3, 1, 4))
    for out, ref in [(F.flatten(x, 1, 3), t.flatten(1, 3)), (F.flatten(x), t.flatten()),
                     (F.squeeze(x), t.squeeze()), (F.squeeze(x, 1), t.squeeze(1)),
                     (F.squeeze(x, 0), t.squeeze(0)), (F.squeeze(x, (1, 3)), t.squeeze((1, 3))),
                     (F.unsqueeze(x, -1), t.unsqueeze(-1)), (F.unsqueeze(x, 0), t.unsqueeze(0)),
                     (F.reshape(x, (4, -1)), t.reshape(4, -1))]:
        assert out.shape == tuple(ref.shape)
        assert_close(out.numpy(), ref.detach().numpy())
    out = F.flatten(F.unsqueeze(x, 2), 0, 2) * 2.0
    ref = t.unsqueeze(2).flatten(0, 2) * 2.0
    _check_grad(rng, out, ref, [(x, t)])


@pytest.mark.parametrize("mode,shape,pads", [
    ("constant", (2, 3, 5, 4), (1, 2, 0, 3)),
    ("constant", (2, 3, 5, 4), (-1, 2, 1, -2, 1, 0)),
    ("constant", (1,), (2, 3)),
    ("reflect", (2, 3, 5, 4), (3, 1, 2, 4)),
    ("reflect", (2, 6), (5, 5)),
    ("replicate", (2, 3, 5, 4), (1, 3, 2, 0)),
    ("replicate", (1, 2, 1, 1, 3), (2, 1, 3, 0, 1, 2)),
    ("circular", (2, 3, 5, 4), (4, 1, 2, 5)),
    ("circular", (2, 3, 4), (3, 0)),
    ("circular", (1, 2, 3, 4, 5), (1, 2, 0, 4, 3, 1)),
    # Negative pads crop: circular wraps around the cropped tensor, reflect and replicate read
    # the input where positive pads would (the whole of it: (-4, 5) on 4 repeats the last).
    ("circular", (2, 3, 5), (-1, 2)),
    ("reflect", (2, 3, 5, 4), (1, -1, -2, 2)),
    ("reflect", (2, 4), (-2, 2)),
    ("replicate", (2, 3, 5), (-2, 3)),
    ("replicate", (2, 3, 4), (-4, 5)),
])
def test_pad(ctx, rng, mode, shape, pads):
    x, t = _pair(ctx, rng, shape, offset_elements=2)
    kwargs = {"value": 0.75} if mode == "constant" else {}
    out = F.pad(x, pads, mode=mode, **kwargs)
    ref = torch.nn.functional.pad(t, pads, mode=mode, **kwargs)
    assert out.shape == tuple(ref.shape)
    assert_close(out.numpy(), ref.detach().numpy())
    _check_grad(rng, out, ref, [(x, t)])


def test_int64_cat_and_permute(ctx, rng):
    a = rng.integers(-2**40, 2**40, size=(3, 4))
    b = rng.integers(-2**40, 2**40, size=(3, 2))
    out = F.cat([dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)], 1)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a, b], 1))
    np.testing.assert_array_equal(F.permute(out, (1, 0)).numpy(), np.concatenate([a, b], 1).T)


def test_bad_input(ctx, rng):
    x = dp.Tensor.from_numpy(ctx, random(rng, (2, 3, 4)))
    with pytest.raises(dp.ShapeError, match="out of range"):
        F.narrow(x, 3, 0, 1)
    with pytest.raises(dp.ShapeError, match="inside dimension"):
        F.narrow(x, 1, 2, 2)
    with pytest.raises(dp.ShapeError, match="sum to"):
        F.split(x, [1, 1], dim=1)
    with pytest.raises(dp.ShapeError, match="differ outside"):
        F.cat([x, dp.Tensor.from_numpy(ctx, random(rng, (2, 4, 4)))], 2)
    with pytest.raises(dp.DTypeError, match="one dtype"):
        F.cat([x, dp.Tensor.from_numpy(ctx, np.zeros((2, 3, 4), np.int32))], 0)
    with pytest.raises(dp.ShapeError, match="non-empty"):
        F.cat([], 0)
    with pytest.raises(dp.ShapeError, match="not a permutation"):
        F.permute(x, (0, 0, 1))
    with pytest.raises(dp.ShapeError, match="smaller than dimension"):
        F.pad(x, (4, 0), mode="reflect")
    with pytest.raises(dp.UnsupportedError, match="mode"):
        F.pad(x, (1, 1), mode="wrap")
    with pytest.raises(dp.ShapeError, match="more than once"):
        F.pad(x, (5, 0), mode="circular")
    with pytest.raises(dp.UnsupportedError, match="last 1 to 3"):
        F.pad(dp.Tensor.from_numpy(ctx, random(rng, (4,))), (1, 1), mode="circular")
    with pytest.raises(dp.ShapeError, match="pairs"):
        F.pad(x, (1, 1, 1))
    with pytest.raises(dp.ShapeError, match="negative size"):
        F.pad(x, (-3, -2))
    with pytest.raises(dp.ShapeError, match="comes after"):
        F.flatten(x, 2, 1)
    with pytest.raises(dp.DTypeError, match="Tensor"):
        F.permute(np.zeros(3), (0,))


def test_random_shapes(ctx, rng):
    """Seeded random ranks and shapes through narrow, cat, permute and pad, with gradients."""
    for _ in range(8):
        ndim = int(rng.integers(1, 5))
        shape = tuple(int(s) for s in rng.integers(1, 6, size=ndim))
        x, t = _pair(ctx, rng, shape, offset_elements=int(rng.integers(0, 4)))
        dim = int(rng.integers(0, ndim))
        start = int(rng.integers(0, shape[dim]))
        length = int(rng.integers(1, shape[dim] - start + 1))
        dims = tuple(int(d) for d in rng.permutation(ndim))
        count = int(rng.integers(1, min(ndim, 3) + 1))
        pads = tuple(int(p) for p in rng.integers(0, 3, size=2 * count))
        out = F.pad(F.permute(F.cat([F.narrow(x, dim, start, length), x], dim), dims), pads)
        ref = torch.nn.functional.pad(torch.cat([t.narrow(dim, start, length), t], dim).permute(dims), pads)
        assert_close(out.numpy(), ref.detach().numpy())
        _check_grad(rng, out, ref, [(x, t)])


@pytest.mark.parametrize("algo", ["gather", "tiles"])
@pytest.mark.parametrize("shape,dims", [((3, 37, 45), (0, 2, 1)), ((2, 5, 33, 9), (0, 2, 3, 1)),
                                        ((40, 70), (1, 0)), ((2, 3, 4, 35), (3, 1, 0, 2))])
def test_permute_forced_copy_algorithm(ctx, rng, monkeypatch, algo, shape, dims):
    """Each copy algorithm on its own, across tile edges (sizes not multiples of 32) and batches."""
    monkeypatch.setenv("DLPRIM_COPY_ALGO", algo)
    dp.config.reload()
    x, t = _pair(ctx, rng, shape, offset_elements=1)
    out = F.permute(x, dims)
    ref = t.permute(dims)
    assert_close(out.numpy(), ref.detach().numpy())
    _check_grad(rng, out, ref, [(x, t)])
    a = rng.integers(-2**40, 2**40, size=shape)
    np.testing.assert_array_equal(F.permute(dp.Tensor.from_numpy(ctx, a), dims).numpy(),
                                  a.transpose(dims))


def test_unknown_copy_algorithm(ctx, rng, monkeypatch):
    monkeypatch.setenv("DLPRIM_COPY_ALGO", "dma")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="copy algorithm"):
        F.permute(dp.Tensor.from_numpy(ctx, random(rng, (3, 4))), (1, 0))


def test_bad_argument_types_are_library_errors(ctx, rng):
    """Once a TypeError or ValueError from Python, or (pad) a silent truncation of 1.5 to 1."""
    x = dp.Tensor.from_numpy(ctx, random(rng, (3, 4)))
    for call in (lambda: F.split(x, 1.5), lambda: F.split(x, [1.5, 1.5]), lambda: F.split(x, None),
                 lambda: F.permute(x, None), lambda: F.reshape(x, None), lambda: x.reshape(None),
                 lambda: F.pad(x, (1.5, 1))):
        with pytest.raises(dp.ShapeError):
            call()
    with pytest.raises(dp.DTypeError, match="value must be a number"):
        F.pad(x, (1, 1), "constant", "a")


@pytest.mark.parametrize("dtype,shape,dims,offset,word", [
    (np.float32, (2, 5, 3, 8), (0, 2, 1, 3), 0, "uint4"),     # a head split: rows of 8 floats
    (np.float32, (2, 5, 3, 6), (0, 2, 1, 3), 0, "uint2"),     # rows of 6: 8-byte words
    (np.float32, (2, 5, 3, 8), (0, 2, 1, 3), 3, None),        # odd offset: elements
    (np.float32, (4, 3, 5), (1, 0, 2), 0, None),              # rows of 5
    (np.int64, (3, 4, 6), (1, 0, 2), 0, "uint4"),
    (np.float16, (3, 4, 6), (1, 0, 2), 0, "uint"),            # 6 halves: 4-byte words
    (np.float16, (3, 2, 16), (1, 0, 2), 8, "uint4"),
    (np.bool_, (2, 3, 32), (1, 0, 2), 0, "uint4"),
])
def test_permute_in_words(ctx, rng, dtype, shape, dims, offset, word):
    """A permutation keeping the innermost dimension moves whole words of bits where sizes,
    strides and offsets allow (checked here through the decision and the bits moved), elements
    otherwise; every destination element is written (the output is poisoned first)."""
    from dlprim_py.ops import tensor_ops
    src = (rng.integers(0, 2, shape) if dtype is np.bool_ else
           rng.standard_normal(shape)).astype(dtype)
    backing = np.concatenate([np.zeros(offset, dtype), src.ravel()])
    whole = dp.Tensor.from_numpy(ctx, backing)
    x = dp.Tensor(ctx, whole.buffer, shape, dtype, offset=offset * np.dtype(dtype).itemsize)
    out_shape = tuple(shape[d] for d in dims)
    out = dp.Tensor.from_numpy(ctx, np.full(out_shape, 7, dtype))   # poison
    st = tensor_ops.dense_strides(shape)
    sizes, (src_st, dst_st) = tensor_ops.merge_dimensions(out_shape, [[st[d] for d in dims],
                                                                      tensor_ops.dense_strides(out_shape)])
    chosen = tensor_ops._copy_words(np.dtype(dtype).itemsize, sizes, src_st, dst_st, offset, 0)
    assert (chosen[0] if chosen else None) == word
    tensor_ops.strided_copy(ctx, out_shape, dtype, x.buffer, offset, [st[d] for d in dims],
                            out.buffer, 0, tensor_ops.dense_strides(out_shape))
    np.testing.assert_array_equal(out.numpy(), np.transpose(src, dims))
    np.testing.assert_array_equal(F.permute(x, dims).numpy(), np.transpose(src, dims))
