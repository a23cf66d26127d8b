"""Tensors: numpy round trips, wrapping host buffers at offsets, views, bad input."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cl_array
import pytest
import torch

import dlprim_py as dp
from conftest import assert_close, random


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_numpy_round_trip(ctx, rng, dtype):
    a = (rng.standard_normal((3, 5, 7)) * 100).astype(dtype)
    t = dp.Tensor.from_numpy(ctx, a)
    assert t.shape == (3, 5, 7) and t.dtype == np.dtype(dtype) and t.size == 105
    assert np.array_equal(t.numpy(), a)


def test_empty_zeros_full(ctx):
    assert np.all(dp.Tensor.zeros(ctx, (4, 3)).numpy() == 0)
    assert np.all(dp.Tensor.full(ctx, (5,), 2.5).numpy() == 2.5)
    assert dp.Tensor.full(ctx, (2, 2), 7, dtype=np.int64).numpy().dtype == np.int64
    assert dp.Tensor.empty(ctx, (0, 3)).numpy().shape == (0, 3)
    assert dp.Tensor.from_numpy(ctx, np.float32(3.0)).shape == ()


def test_rejects_unsupported_dtypes(ctx):
    with pytest.raises(dp.DTypeError, match="float64"):
        dp.Tensor.from_numpy(ctx, np.zeros(3))
    with pytest.raises(dp.DTypeError, match="not supported"):
        dp.Tensor.empty(ctx, (3,), np.complex64)
    with pytest.raises(dp.DTypeError):
        dp.Tensor.empty(ctx, (3,), "not a dtype")


@pytest.mark.parametrize("shape", [(-1, 2), (2.5,), "ab"])
def test_rejects_bad_shapes(ctx, shape):
    with pytest.raises(dp.ShapeError):
        dp.Tensor.empty(ctx, shape)


def test_reshape_is_a_view(ctx, rng):
    a = random(rng, (4, 6))
    t = dp.Tensor.from_numpy(ctx, a)
    v = t.reshape(3, -1)
    assert v.shape == (3, 8) and v.buffer is t.buffer
    assert np.array_equal(v.numpy(), a.reshape(3, 8))
    assert t.view((24,)).shape == (24,)
    with pytest.raises(dp.ShapeError):
        t.reshape(5, 5)
    with pytest.raises(dp.ShapeError):
        t.reshape(-1, -1)


def test_host_buffer_at_offset_on_host_queue(rng):
    """A host application's cl.Buffer at a non-zero offset, on its own queue, read and written."""
    device = dp.context.find_device()
    host_ctx = cl.Context([device])
    host_queue = cl.CommandQueue(host_ctx)
    ctx = dp.Context(queue=host_queue)
    # The buffer holds [guard | x | guard | y | guard]; x and y live at non-zero offsets.
    n, guard = 37, 5
    host = random(rng, 3 * guard + 2 * n)
    buf = cl.Buffer(host_ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    x = dp.Tensor.from_buffer(ctx, buf, (n,), np.float32, offset=guard * 4)
    y = dp.Tensor.from_buffer(ctx, buf, (n,), np.float32, offset=(2 * guard + n) * 4)
    assert np.array_equal(x.numpy(), host[guard:guard + n])
    result = x * 3.0 + x
    y.copy_(result)
    host_queue.finish()
    after = np.empty_like(host)
    cl.enqueue_copy(host_queue, after, buf)
    expected = host.copy()
    expected[2 * guard + n:2 * guard + 2 * n] = host[guard:guard + n] * 4
    assert np.array_equal(after, expected)


def test_from_buffer_checks_size_and_offset(ctx):
    buf = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, 64)
    dp.Tensor.from_buffer(ctx, buf, (16,))
    with pytest.raises(dp.ShapeError, match="too small"):
        dp.Tensor.from_buffer(ctx, buf, (16,), offset=4)
    with pytest.raises(dp.ShapeError, match="too small"):
        dp.Tensor.from_buffer(ctx, buf, (17,))
    with pytest.raises(dp.ShapeError):
        dp.Tensor.from_buffer(ctx, buf, (4,), offset=-4)
    with pytest.raises(dp.ShapeError, match="multiple"):
        dp.Tensor.from_buffer(ctx, buf, (4,), offset=2)
    with pytest.raises(dp.DeviceError):
        dp.Tensor.from_buffer(ctx, np.zeros(4), (4,))


def test_from_buffer_of_another_context_raises(ctx):
    other = cl.Context([ctx.device])
    buf = cl.Buffer(other, cl.mem_flags.READ_WRITE, 64)
    with pytest.raises(dp.DeviceError, match="another OpenCL context"):
        dp.Tensor.from_buffer(ctx, buf, (4,))


def test_pyopencl_array_without_copy(ctx, rng):
    a = random(rng, (10, 3))
    prefix = random(rng, 6)
    big = cl_array.to_device(ctx.queue, np.concatenate([prefix, a.ravel()]))
    view = big[6:].reshape(10, 3)
    t = dp.Tensor.from_array(ctx, view)
    assert t.buffer is view.base_data and t.offset == 24
    assert np.array_equal(t.numpy(), a)
    doubled = t * 2.0
    arr = doubled.to_array()
    assert arr.base_data is doubled.buffer
    assert np.array_equal(arr.get(), a * 2)
    # Writing through the wrapped tensor changes the pyopencl array.
    t.fill_(1.5)
    assert np.all(big.get()[6:] == 1.5) and np.array_equal(big.get()[:6], prefix)


def test_non_contiguous_array_refused(ctx, rng):
    arr = cl_array.to_device(ctx.queue, random(rng, (4, 4)))
    with pytest.raises(dp.ShapeError, match="contiguous"):
        dp.Tensor.from_array(ctx, arr[:, 1:])
    with pytest.raises(dp.DeviceError):
        dp.Tensor.from_array(ctx, random(rng, 3))


def test_copy_and_clone(ctx, rng):
    a = random(rng, (3, 4))
    t = dp.Tensor.from_numpy(ctx, a)
    c = t.clone()
    t.fill_(0)
    assert np.array_equal(c.numpy(), a)
    with pytest.raises(dp.ShapeError):
        t.copy_(dp.Tensor.zeros(ctx, (4, 3)))
    for value in ("a", None, [1.0]):      # once a ValueError or TypeError from numpy
        with pytest.raises(dp.DTypeError, match="number"):
            t.fill_(value)


def test_tensor_desc():
    d = dp.TensorDesc((2, 3, 4))
    assert d.shape == (2, 3, 4) and d.dtype == np.float32 and d.size == 24 and d.ndim == 3
    assert d == dp.TensorDesc([2, 3, 4], "float32")
    with pytest.raises(dp.DTypeError):
        dp.TensorDesc((2,), np.float64)
    with pytest.raises(dp.ShapeError):
        dp.TensorDesc((2, -3))


def test_tensors_of_different_contexts_do_not_mix(ctx, rng):
    other = dp.Context(dp.devices()[0][0])
    a = dp.Tensor.from_numpy(ctx, random(rng, 4))
    b = dp.Tensor.from_numpy(other, random(rng, 4))
    with pytest.raises(dp.DeviceError, match="different OpenCL contexts") as raised:
        a + b
    # The message says which objects they are and what to do.
    message = str(raised.value)
    assert "share one dlprim_py.Context" in message
    assert f"0x{id(ctx):x}" in message and f"0x{id(other):x}" in message
    if other.device == ctx.device:
        assert "same device" in message


def test_arithmetic_matches_numpy(ctx, rng):
    a, b = random(rng, (2, 3, 5)), random(rng, (3, 1), low=0.5, high=2.0)
    ta, tb = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    for out, ref in [(ta + tb, a + b), (ta - tb, a - b), (ta * tb, a * b), (ta / tb, a / b),
                     (2.0 - ta, 2.0 - a), (1.0 / tb, 1.0 / b), (-ta, -a)]:
        assert_close(out.numpy(), ref.astype(np.float64))


def test_constructor_checks_its_buffer(ctx):
    """Tensor(ctx, buffer, shape) validates as from_buffer does: a buffer too small for the
    shape at the offset (which kernels would read past), a misaligned or negative offset, a
    non-buffer and a non-context are refused."""
    import pyopencl as cl
    buffer = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, 64)
    assert dp.Tensor(ctx, buffer, (4, 4)).shape == (4, 4)
    assert dp.Tensor(ctx, buffer, (3, 4), offset=16).offset == 16
    with pytest.raises(dp.ShapeError, match="too small"):
        dp.Tensor(ctx, buffer, (5, 4))
    with pytest.raises(dp.ShapeError, match="too small"):
        dp.Tensor(ctx, buffer, (4, 4), offset=4)
    for offset in (-4, 2, 4.0):
        with pytest.raises(dp.ShapeError, match="offset"):
            dp.Tensor(ctx, buffer, (2,), offset=offset)
    with pytest.raises(dp.DeviceError, match="Buffer"):
        dp.Tensor(ctx, np.zeros(4, np.float32), (4,))
    with pytest.raises(dp.DeviceError, match="Context"):
        dp.Tensor(None, buffer, (4,))


def test_torch_conveniences(ctx, rng):
    """item, tolist, to_numpy, np.asarray, zero_, sum/mean/max/argmax, permute/transpose/T and @
    as torch's Tensor methods give them, against numpy in float64."""
    a, b = random(rng, (3, 5)), random(rng, (5, 4))
    t, u = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert t.device is ctx
    assert isinstance(t.sum().item(), float)
    np.testing.assert_allclose(t.sum().item(), a64.sum(), rtol=1e-5)
    with pytest.raises(dp.ShapeError, match="one-element"):
        t.item()
    assert t.tolist() == a.tolist() and np.array_equal(t.to_numpy(), a)
    assert np.asarray(t).dtype == np.float32 and np.array_equal(np.asarray(t), a)
    assert_close(t.mean(dim=1).numpy(), a64.mean(1))
    assert_close(t.sum(dim=0, keepdim=True).numpy(), a64.sum(0, keepdims=True))
    assert t.max().item() == a.max() and t.argmax().item() == a.argmax()
    values, indices = t.max(dim=1)
    assert np.array_equal(values.numpy(), a.max(1)) and np.array_equal(indices.numpy(), a.argmax(1))
    assert np.array_equal(t.T.numpy(), a.T) and np.array_equal(t.transpose(0, 1).numpy(), a.T)
    c = random(rng, (2, 3, 4))
    assert np.array_equal(dp.Tensor.from_numpy(ctx, c).permute(2, 0, 1).numpy(), c.transpose(2, 0, 1))
    assert np.array_equal(dp.Tensor.from_numpy(ctx, c).T.numpy(), c.transpose(2, 1, 0))
    assert_close((t @ u).numpy(), a64 @ b64)
    with pytest.raises(dp.UnsupportedError, match="two matrices"):
        dp.Tensor.from_numpy(ctx, c) @ u
    # With gradients: d(sum(t @ u))/dt = ones @ u^T.
    tg = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    (tg @ u).sum().backward()
    assert_close(tg.grad.numpy(), np.ones((3, 4)) @ b64.T)
    z = t.clone().zero_()
    assert not z.numpy().any()


def test_numpy_arrays_are_named_where_tensors_belong(ctx, rng):
    """A numpy array passed to an operator is a DTypeError (a TypeError) that says how to make
    a tensor of it; Tensor.from_numpy(array) alone takes the default context."""
    import dlprim_py.functional as F
    a = rng.standard_normal((2, 3)).astype(np.float32)
    t = dp.Tensor.from_numpy(ctx, a)
    for call in (lambda: F.relu(a), lambda: F.softmax(a, dim=1), lambda: F.sum(a),
                 lambda: F.conv2d(a[None, None], a[None, None]),
                 lambda: F.linear(a, t), lambda: F.dropout(a), lambda: F.max_pool2d(a, 2),
                 lambda: t + a):
        with pytest.raises(TypeError, match="from_numpy"):
            call()
    default = dp.Tensor.from_numpy(a)
    assert default.ctx is dp.default_context()
    np.testing.assert_array_equal(default.numpy(), a)
    assert dp.Tensor.from_numpy(a, requires_grad=True).requires_grad
    target = dp.Tensor.zeros(ctx, (2, 3))
    np.testing.assert_array_equal(target.copy_(a).numpy(), a)
    with pytest.raises(dp.ShapeError):
        target.copy_(a.T)


INDICES = [0, -1, (1, 2), (0, slice(1, 3)), (slice(None), slice(1, 3)), (Ellipsis, -1),
           (1, Ellipsis), slice(0, 1), (1, 2, 3), (slice(None), 0), (Ellipsis,), (),
           slice(5, 9), (0, slice(2, 1)), (slice(-1, None), slice(None), slice(1, -1)),
           (np.int64(1), -2)]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_basic_indexing_matches_numpy_and_torch_gradients(ctx, rng, index):
    """t[index] holds numpy's a[index]; a contiguous selection shares the buffer (a write into
    it shows in the parent), any other is a copy; the gradient is torch's."""
    a = random(rng, (2, 3, 4))
    t = dp.Tensor.from_numpy(ctx, a, requires_grad=True)
    out = t[index]
    np.testing.assert_array_equal(out.numpy(), a[index])
    ref = torch.from_numpy(a.astype(np.float64)).requires_grad_(True)
    ref_out = ref[index]
    g = random(rng, ref_out.shape)
    ref_out.backward(torch.from_numpy(g.astype(np.float64)))
    out.backward(dp.Tensor.from_numpy(ctx, g))
    np.testing.assert_allclose(t.grad.numpy(), ref.grad.numpy(), rtol=1e-6, atol=0)
    plain = dp.Tensor.from_numpy(ctx, a)
    view = plain[index]
    if view.buffer is plain.buffer and view.size:
        view.copy_(np.full(view.shape, 7.0, np.float32))
        expected = a.copy()
        expected[index] = 7.0
        np.testing.assert_array_equal(plain.numpy(), expected)


def test_indexing_refuses_what_it_does_not_do(ctx, rng):
    t = dp.Tensor.from_numpy(ctx, random(rng, (2, 3)))
    for index, error, text in [((slice(None, None, 2),), dp.UnsupportedError, "step"),
                               ((None,), dp.UnsupportedError, "reshape"),
                               (([0, 1],), dp.UnsupportedError, "advanced indexing"),
                               ((True,), dp.UnsupportedError, "advanced indexing"),
                               ((t,), dp.UnsupportedError, "advanced indexing"),
                               ((0, 0, 0), dp.ShapeError, "too many indices"),
                               ((2,), dp.ShapeError, "out of range"),
                               ((0, -4), dp.ShapeError, "out of range"),
                               ((Ellipsis, 0, Ellipsis), dp.ShapeError, "ellipsis")]:
        with pytest.raises(error, match=text):
            t[index if len(index) > 1 else index[0]]


def test_repr_shows_values_and_leaves_deferred_errors_to_the_next_sync(ctx, rng):
    """print(t) shows the values as numpy does (large tensors abbreviated); reading them does
    not swallow a deferred check's error, which the next synchronizing call raises."""
    import dlprim_py.functional as F
    small = dp.Tensor.from_numpy(ctx, np.arange(6, dtype=np.float32).reshape(2, 3))
    text = repr(small)
    assert "[[0., 1., 2.]" in text and "shape=(2, 3)" in text and "float32" in text
    big = dp.Tensor.from_numpy(ctx, np.arange(5000, dtype=np.float32))
    assert "..." in repr(big) and len(repr(big)) < 400
    logits = dp.Tensor.from_numpy(ctx, random(rng, (2, 4)))
    bad = dp.Tensor.from_numpy(ctx, np.array([1, 9], np.int64))
    loss = F.cross_entropy(logits, bad)
    repr(loss)
    with pytest.raises(dp.ShapeError):
        loss.numpy()
