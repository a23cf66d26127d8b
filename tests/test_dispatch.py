"""The hot path: a call on shapes seen before renders no template, builds no program and creates
no kernel object, forward and backward, for every operator family; and the outputs of a long
loop are freed without the cycle collector.

Speed itself is measured by the benchmarks (``dlprim-bench --suite dispatch``); these tests
assert what can be counted.
"""
import gc

import numpy as np
import pytest

import dlprim_py as dp
import dlprim_py.functional as F
from dlprim_py import fusion, program
from dlprim_py.ops.interpolate import resize

from conftest import assert_close, random


def _tensor(ctx, rng, shape, grad=False):
    return dp.Tensor.from_numpy(ctx, random(rng, shape), requires_grad=grad)


def _cases(ctx, rng):
    """name -> a callable that runs one call of the family (forward, and backward where the
    inputs require gradients) on fresh outputs."""
    leaves = []

    def t(*shape):
        leaves.append(_tensor(ctx, rng, shape, grad=True))
        return leaves[-1]

    x4, w3, w1, wd = t(2, 8, 6, 6), t(8, 8, 3, 3), t(4, 8, 1, 1), t(8, 1, 3, 3)
    bias8, gamma, beta = t(8), t(8), t(8)
    running_mean = dp.Tensor.from_numpy(ctx, random(rng, (8,)))
    running_var = dp.Tensor.from_numpy(ctx, random(rng, (8,), 0.5, 1.5))
    x2, w2, b2 = t(4, 16), t(10, 16), t(10)
    gamma16 = t(16)
    x5 = t(1, 2, 3, 4, 4)
    target = dp.Tensor.from_numpy(ctx, np.array([1, 0, 9, 3], np.int64))
    a, b, bias4 = t(3, 5), t(5, 4), t(4)

    def backward(y):
        # Every call starts without gradients (accumulating into one is another operation).
        y.backward(dp.Tensor.full(ctx, y.shape, 0.5))
        for leaf in leaves:
            leaf.grad = None

    return {
        "add": lambda: backward(x4 + x4 * 2.0),
        "sub_div_max": lambda: backward(F.maximum(x4 - x4 / 3.0, x4)),
        "relu": lambda: backward(F.relu(x4)),
        "gelu_silu": lambda: backward(F.silu(F.gelu(x4))),
        "relu6_hardswish": lambda: backward(F.hardswish(F.relu6(x4))),
        "softmax": lambda: backward(F.log_softmax(F.softmax(x2, dim=1), dim=0)),
        "sum_mean": lambda: backward(F.sum(x4, dim=(0, 2)) + F.mean(x4, dim=(0, 2))),
        "sum_all": lambda: backward(F.sum(x4)),
        "amax_argmax": lambda: (backward(F.amax(x2, dim=1)), F.argmax(x2, dim=1)),
        "cross_entropy": lambda: backward(F.cross_entropy(x2, target)),
        "mse": lambda: backward(F.mse_loss(x2, x2 * 0.5)),
        "bce_logits": lambda: backward(F.binary_cross_entropy_with_logits(x2, x2 * 0.0 + 0.5)),
        "dropout": lambda: backward(F.dropout(x4, 0.5, training=True)),
        "tensor_ops": lambda: backward(F.cat([F.permute(x4, (0, 2, 3, 1)),
                                               F.transpose(x4, 1, 3)], dim=1)),
        "pad_narrow": lambda: backward(F.narrow(F.pad(x4, (1, 1, 2, 0)), 2, 1, 4)),
        "flatten": lambda: backward(F.flatten(x4, 1)),
        "max_pool": lambda: backward(F.max_pool2d(x4, 3, stride=2, padding=1)),
        "avg_pool": lambda: backward(F.avg_pool2d(x4, 2)),
        "adaptive_avg_pool": lambda: backward(F.adaptive_avg_pool2d(x4, 1)),
        "conv3x3": lambda: backward(F.conv2d(x4, w3, bias8, padding=1)),
        "conv1x1": lambda: backward(F.conv2d(x4, w1)),
        "conv_stride2": lambda: backward(F.conv2d(x4, w3, stride=2, padding=1)),
        "conv_depthwise": lambda: backward(F.conv2d(x4, wd, padding=1, groups=8)),
        "conv_transpose": lambda: backward(F.conv_transpose2d(x4, w3, stride=2)),
        "batch_norm_train": lambda: backward(F.batch_norm(x4, None, None, gamma, beta,
                                                          training=True)),
        "batch_norm_eval": lambda: backward(F.batch_norm(x4, running_mean, running_var, gamma,
                                                         beta, training=False)),
        "group_layer_norm": lambda: backward(F.layer_norm(F.group_norm(x4, 2, gamma, beta),
                                                          (6,))),
        "rms_norm": lambda: (backward(F.rms_norm(x2, (16,), gamma16)),
                             backward(F.rms_norm(x4, (6, 6)))),
        "interpolate": lambda: backward(F.interpolate(x4, scale_factor=2, mode="bilinear",
                                                      align_corners=False)),
        "interpolate_modes": lambda: (
            backward(F.interpolate(x4, size=(9, 4), mode="bicubic", align_corners=True)),
            backward(F.interpolate(x4, scale_factor=0.6, mode="nearest-exact")),
            backward(F.interpolate(x5, size=(5, 3, 7), mode="trilinear")),
            backward(F.interpolate(x5, size=(2, 3, 3), mode="area")),
            backward(F.interpolate(x4, size=(3, 4), mode="bilinear", antialias=True))),
        "resize": lambda: (
            backward(resize(x4, (9, 4), mode="cubic", exclude_outside=True)),
            resize(x4, (3, 13), mode="nearest", coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor"),
            resize(x4, (5, 5), mode="linear", scales=(0.9, 0.9))),
        "linear": lambda: backward(F.linear(x2, w2, b2)),
        "gemm": lambda: (dp.gemm(a, b), dp.gemm(a, b, bias=bias4, activation="relu")),
        "gemm_batched": lambda: dp.gemm_batched(a.reshape(1, 3, 5), b.reshape(1, 5, 4)),
        "masks": lambda: (backward(x4 * ((x4 > 0.25) & ~(0.75 <= x4)).float()),
                          F.logical_or(x4 == x4, x4 != 0.5).all(1), (x4 < bias8[:6]).sum(),
                          x4.long().bool().any()),
    }


def _counts():
    return dict(program.stats)


@pytest.fixture(scope="module")
def cases(ctx):
    return _cases(ctx, np.random.default_rng(7))


CASES = ("add", "sub_div_max", "relu", "gelu_silu", "relu6_hardswish", "softmax", "sum_mean",
         "sum_all", "amax_argmax", "cross_entropy", "mse", "bce_logits", "dropout", "tensor_ops",
         "pad_narrow", "flatten", "max_pool", "avg_pool", "adaptive_avg_pool", "conv3x3",
         "conv1x1", "conv_stride2", "conv_depthwise", "conv_transpose", "batch_norm_train",
         "batch_norm_eval", "group_layer_norm", "rms_norm", "interpolate", "interpolate_modes",
         "resize", "linear", "gemm", "gemm_batched",
         "masks")


def test_every_case_is_listed(cases):
    assert sorted(cases) == sorted(CASES)


@pytest.mark.parametrize("name", CASES)
def test_repeated_call_builds_nothing(ctx, cases, name):
    """After one call (which builds), two more calls with the same shapes render, build and
    create nothing, forward and backward through the tape."""
    run = cases[name]
    run()
    before = _counts()
    run()
    run()
    ctx.synchronize()
    assert _counts() == before, f"{name}: a repeated call built {before} -> {_counts()}"


class _CountingEnviron(dict):
    """os.environ's stand-in that counts the library's lookups."""
    reads = 0

    def get(self, key, default=None):
        type(self).reads += 1
        return super().get(key, default)

    def __getitem__(self, key):
        type(self).reads += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("name", CASES)
def test_repeated_call_reads_no_environment(ctx, cases, name, monkeypatch):
    """The call switches (DLPRIM_*_ALGO, DLPRIM_LOG_CMD, DLPRIM_FIND_MODE) are read once, not
    per call: a repeated call looks nothing up in the environment."""
    import os
    run = cases[name]
    run()
    ctx.synchronize()
    monkeypatch.setattr(os, "environ", _CountingEnviron(os.environ))
    _CountingEnviron.reads = 0
    run()
    ctx.synchronize()
    assert _CountingEnviron.reads == 0, f"{name}: {_CountingEnviron.reads} environment reads"


def test_config_reload_applies_a_changed_switch(ctx, rng, monkeypatch):
    """A switch set after the first call takes effect on dp.config.reload(), not before."""
    x = _tensor(ctx, rng, (3, 8))
    F.relu(x)
    monkeypatch.setenv("DLPRIM_POINTWISE_ALGO", "no_such_variant")
    F.relu(x)
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="no_such_variant"):
        F.relu(x)


@pytest.mark.parametrize("algo", ["direct", "implicit_gemm", "im2col_gemm", "winograd",
                                  "winograd_f4x4", "gemm"])
def test_every_conv_algorithm_replays(ctx, rng, monkeypatch, algo):
    """Each convolution algorithm, forced, builds nothing on a repeated call in any direction,
    and the replayed call computes the same numbers as the recorded one on other tensors."""
    monkeypatch.setenv("DLPRIM_CONV_ALGO", algo)
    dp.config.reload()
    from dlprim_py.ops.conv import selection
    from dlprim_py.ops.conv.problem import make_problem
    shape, w_shape = (2, 4, 6, 6), ((5, 4, 1, 1) if algo == "gemm" else (5, 4, 3, 3))
    padding = 0 if algo == "gemm" else 1
    problem = make_problem(shape, w_shape, dp.ConvolutionDesc(padding))
    # The gradients whose direction the algorithm serves (forcing one that does not apply is
    # refused).
    data_grad, filter_grad = (selection.algorithm(algo).applies(ctx, problem, d)
                              for d in ("backward_data", "backward_filter"))
    w = _tensor(ctx, rng, w_shape, grad=filter_grad)
    results = []
    for call in range(3):
        x = _tensor(ctx, rng, shape, grad=data_grad or not filter_grad)
        y = F.conv2d(x, w, padding=padding)
        g = _tensor(ctx, rng, y.shape)
        if data_grad or filter_grad:
            y.backward(g)
        if call == 1:
            before = _counts()
        results.append((x.numpy(), w.numpy(), g.numpy(), y.numpy(),
                        x.grad.numpy() if data_grad else None,
                        w.grad.numpy() if filter_grad else None))
        w.grad = None
    assert _counts() == before, f"{algo}: a repeated call built something"
    import torch
    for xv, wv, gv, yv, dxv, dwv in results:
        xt = torch.tensor(xv, dtype=torch.float64, requires_grad=True)
        wt = torch.tensor(wv, dtype=torch.float64, requires_grad=True)
        yt = torch.nn.functional.conv2d(xt, wt, padding=padding)
        yt.backward(torch.tensor(gv, dtype=torch.float64))
        assert_close(yv, yt.detach().numpy())
        if dxv is not None:
            assert_close(dxv, xt.grad.numpy())
        if dwv is not None:
            assert_close(dwv, wt.grad.numpy())


def test_convolution_operator_replays_on_other_tensors(ctx, rng):
    """The Convolution operator replays its recorded run on new tensors (other buffers, the
    same shapes): nothing built, and every result right (outputs poisoned first)."""
    desc = dp.ConvolutionDesc(1, 1, 1, 1)
    x_desc, w_desc = dp.TensorDesc((2, 3, 5, 5)), dp.TensorDesc((4, 3, 3, 3))
    conv = dp.Convolution(ctx, x_desc, w_desc, desc)
    import torch
    before = None
    for call in range(4):
        x = _tensor(ctx, rng, x_desc.shape)
        w = _tensor(ctx, rng, w_desc.shape)
        y = dp.Tensor.full(ctx, conv.output_desc.shape, float("nan"))
        conv.forward(x, w, y)
        ref = torch.nn.functional.conv2d(torch.tensor(x.numpy(), dtype=torch.float64),
                                         torch.tensor(w.numpy(), dtype=torch.float64), padding=1)
        assert_close(y.numpy(), ref.numpy())
        if call == 1:
            before = _counts()
    assert _counts() == before


def test_aliased_operands_get_their_own_plan(ctx, rng):
    """A GEMM recorded with distinct buffers is not replayed for a call whose operands share a
    buffer (and the other way round): the plans are keyed on the aliasing."""
    a = _tensor(ctx, rng, (4, 4))
    b = _tensor(ctx, rng, (4, 4))
    ref_ab = a.numpy().astype(np.float64) @ b.numpy()
    assert_close(dp.gemm(a, b).numpy(), ref_ab)
    assert_close(dp.gemm(a, a).numpy(), a.numpy().astype(np.float64) @ a.numpy())
    c = dp.Tensor.full(ctx, (4, 4), 1.0)
    dp.gemm(a, b, c, beta=1.0)
    assert_close(c.numpy(), ref_ab + 1.0)


def test_raw_gemm_replay_checks_buffers(ctx, rng):
    """enqueue_gemm replays a plan only on buffers of this context that are large enough."""
    from dlprim_py.ops.gemm import enqueue_gemm
    a = _tensor(ctx, rng, (8, 8))
    c = dp.Tensor.empty(ctx, (8, 8))
    enqueue_gemm(ctx, 8, 8, 8, a.buffer, 0, 8, a.buffer, 0, 8, c.buffer, 0, 8)
    import pyopencl as cl
    tiny = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, 16)
    with pytest.raises(dp.ShapeError):
        enqueue_gemm(ctx, 8, 8, 8, a.buffer, 0, 8, a.buffer, 0, 8, tiny, 0, 8)
    other = cl.Buffer(cl.Context([ctx.device]), cl.mem_flags.READ_WRITE, 256)
    with pytest.raises(dp.DeviceError):
        enqueue_gemm(ctx, 8, 8, 8, a.buffer, 0, 8, a.buffer, 0, 8, other, 0, 8)


def test_fusion_plan_and_conv_bias_activation_replay(ctx, rng):
    """A fusion plan's execute and conv_bias_activation build nothing on repeated calls."""
    x = _tensor(ctx, rng, (2, 4, 6, 6))
    w = _tensor(ctx, rng, (8, 4, 3, 3))
    bias = _tensor(ctx, rng, (8,))
    fusion.conv_bias_activation(x, w, bias, padding=1)
    before = _counts()
    for _ in range(2):
        x = _tensor(ctx, rng, (2, 4, 6, 6))
        fusion.conv_bias_activation(x, w, bias, padding=1)
    assert _counts() == before


@pytest.mark.parametrize("grad", [False, True])
def test_loop_outputs_freed_without_cycle_collector(ctx, rng, grad):
    """10^4 calls of a small network step (conv, batch norm, relu, add, pooling, linear, loss)
    with the cycle collector off: the pool's memory in use stays flat, so every output and
    every backward closure was freed by reference counting alone."""
    x = _tensor(ctx, rng, (2, 3, 8, 8), grad=grad)
    w = _tensor(ctx, rng, (4, 3, 3, 3), grad=grad)
    gamma, beta = _tensor(ctx, rng, (4,), grad=grad), _tensor(ctx, rng, (4,), grad=grad)
    fc, target = _tensor(ctx, rng, (5, 4), grad=grad), dp.Tensor.from_numpy(
        ctx, np.array([1, 4], np.int64))

    def step():
        y = F.relu(F.batch_norm(F.conv2d(x, w, padding=1), None, None, gamma, beta,
                                training=True))
        y = y + F.relu6(y)
        y = F.flatten(F.adaptive_avg_pool2d(F.max_pool2d(y, 2), 1), 1)
        loss = F.cross_entropy(F.linear(y, fc), target)
        if grad:
            loss.backward()
            for p in (x, w, gamma, beta, fc):
                p.grad = None
        F.amax(F.softmax(F.gelu(x), dim=1), dim=1)

    step()
    ctx.synchronize()
    pool = ctx.memory_pool
    gc.collect()
    gc.disable()
    try:
        step()
        held = pool.active_blocks
        for _ in range(10 ** 4 // 10):
            for _ in range(10):
                step()
            assert pool.active_blocks <= held, "tensors were left for the cycle collector"
    finally:
        gc.enable()
    ctx.synchronize()


@pytest.mark.parametrize("name", CASES)
def test_call_leaves_no_reference_cycle(ctx, cases, name):
    """A call and its backward leave nothing for the cycle collector: outputs and their backward
    closures are freed by reference counting as soon as they are dropped."""
    run = cases[name]
    run()
    # Until nothing is left: a collection can free objects (through weak references'
    # callbacks) whose own cycles only the next one finds, e.g. an earlier test's kernel
    # objects, whose PyOpenCL invokers are reference cycles.
    while gc.collect():
        pass
    gc.disable()
    try:
        run()
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0, f"{name}: {found} objects in reference cycles"


def _training_step(ctx, arrays, target):
    """A small network step (conv, depthwise conv, batch norm with running statistics, relu6,
    residual add, pooling, linear, cross-entropy) on tensors made from ``arrays``: the loss and
    every gradient, as numpy arrays."""
    x, w, wd, gamma, beta, fc, bias = (dp.Tensor.from_numpy(ctx, a, requires_grad=True)
                                       for a in arrays)
    running_mean = dp.Tensor.zeros(ctx, (8,))
    running_var = dp.Tensor.full(ctx, (8,), 1.0)
    y = F.batch_norm(F.conv2d(x, w, padding=1), running_mean, running_var, gamma, beta,
                     training=True)
    y = F.relu6(y) + F.conv2d(y, wd, padding=1, groups=8)
    y = F.batch_norm(y, None, None, gamma, beta, training=True)
    y = F.flatten(F.adaptive_avg_pool2d(F.max_pool2d(y, 2), 1), 1)
    loss = F.cross_entropy(F.linear(y, fc, bias), dp.Tensor.from_numpy(ctx, target))
    loss.backward()
    return [loss.numpy(), running_mean.numpy(), running_var.numpy()] + [
        t.grad.numpy() for t in (x, w, wd, gamma, beta, fc, bias)]


def test_replayed_steps_compute_what_fresh_calls_compute(ctx):
    """Steps of a network on new data replay plans recorded by earlier steps (and by each
    other: both batch norms share kernels with their backward passes, which bind other
    buffers): every result equals that of the same step in a fresh context, which records."""
    rng = np.random.default_rng(11)

    def data():
        return ([random(rng, s) for s in ((2, 3, 8, 8), (8, 3, 3, 3), (8, 1, 3, 3), (8,), (8,),
                                          (5, 8), (5,))], rng.integers(0, 5, 2))

    _training_step(ctx, *data())
    for _ in range(3):
        arrays, target = data()
        replayed = _training_step(ctx, arrays, target)
        fresh = _training_step(dp.Context(ctx.device), arrays, target)
        for got, want in zip(replayed, fresh):
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dispatch_suite_host_cases_are_right(ctx):
    """The host-bound calls that dlprim-bench's dispatch suite and benchmarks/dispatch.py time
    compute what PyTorch computes in float64."""
    from dlprim_py.bench.dispatch import HOST_NAMES, host_cases
    from dlprim_py.bench.harness import error_metric
    cases = host_cases(ctx, np.random.default_rng(5))
    assert tuple(name for name, _, _ in cases) == HOST_NAMES
    for name, call, reference in cases:
        assert error_metric(call().numpy(), reference()) < 1e-5, name


def test_dispatch_suite_is_listed():
    from dlprim_py import bench
    from dlprim_py.bench.dispatch import HOST_NAMES, public_names
    args = bench.parse_args(["--suite", "dispatch", "--list"])
    assert args.suites == ["dispatch"]
    assert len(public_names(64, 1024)) == 9 and len(HOST_NAMES) == 16


def test_launches_without_the_native_entry_point(ctx, rng, monkeypatch):
    """Where the OpenCL library's own clEnqueueNDRangeKernel is not found, launches go
    through PyOpenCL and compute the same."""
    from dlprim_py import launch
    a, w = random(rng, (2, 8, 6, 6)), random(rng, (8, 8, 3, 3))
    x, k = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, w)
    native = F.relu(F.conv2d(x, k, padding=1)).numpy()
    monkeypatch.setattr(launch, "_clEnqueueNDRangeKernel", None)
    fallback = F.relu(F.conv2d(x, k, padding=1)).numpy()
    np.testing.assert_array_equal(native, fallback)


def test_native_enqueue_error_is_raised_by_name(ctx):
    """A launch the driver refuses raises PyOpenCL's error naming the code, not a silent
    no-op."""
    import pyopencl as cl
    from dlprim_py import launch
    built = program.build_source(ctx, "__kernel void one(__global float* a) { a[0] = 1.0f; }")
    kernel = launch.BoundKernel(program.new_kernel(built.program, "one"))
    y = dp.Tensor.empty(ctx, (1,))
    kernel.set_all([y.buffer])
    too_large = ctx.info.max_work_group_size * 2
    with pytest.raises(cl.Error):
        launch.enqueue_kernel(ctx.queue, launch.native_handle(ctx.queue), kernel,
                              launch.WorkSize((too_large,), (too_large,)))


def test_conv2d_repeated_call_follows_a_changed_forced_algorithm(ctx, rng, monkeypatch):
    """A forced convolution algorithm set (and reloaded) after a call with the same arguments
    applies to the next call: the plan and the operator are keyed on the switch."""
    x = _tensor(ctx, rng, (1, 8, 6, 6))
    w = _tensor(ctx, rng, (8, 8, 3, 3))
    expected = F.conv2d(x, w, padding=1).numpy()
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "direct")
    dp.config.reload()
    assert_close(F.conv2d(x, w, padding=1).numpy(), expected)
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "no_such_algo")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="no_such_algo"):
        F.conv2d(x, w, padding=1)


def test_kernel_events_collect_each_launch_with_its_event(ctx, rng):
    """Inside kernel_events every launch (a plan's replay too) comes with an event that has
    profiling times; outside, launches make none."""
    from dlprim_py.launch import kernel_events
    x = dp.Tensor.from_numpy(ctx, rng.standard_normal((2, 8, 8, 8)).astype(np.float32))
    w = dp.Tensor.from_numpy(ctx, rng.standard_normal((8, 8, 3, 3)).astype(np.float32))
    F.conv2d(x, w, padding=1)
    F.relu(x)
    with kernel_events() as events:
        F.conv2d(x, w, padding=1)
        F.relu(x)
    ctx.synchronize()
    assert len(events) >= 2
    assert all(isinstance(name, str) and name for name, _ in events)
    if ctx.profiling:
        assert all(e.profile.end >= e.profile.start for _, e in events)
    with kernel_events() as outer_events:
        F.relu(x)
    assert len(events) >= 2 and len(outer_events) == 1


def test_tensor_ops_and_interpolate_launches_are_recorded(ctx, rng):
    """cat, permute, pad, narrow and interpolate launch through bound kernels: a recording of
    them (a planned network) replays every copy on other buffers."""
    from dlprim_py import launch
    x = _tensor(ctx, rng, (2, 3, 4, 4))

    def chain(t):
        y = F.cat([F.permute(t, (0, 1, 3, 2)), t], dim=1)
        y = F.narrow(F.pad(y, (1, 1, 0, 2)), 2, 1, 4)
        return F.interpolate(y, scale_factor=2, mode="nearest")

    with dp.no_grad():
        with launch.Recording() as recording:
            y = chain(x)
        plan = recording.plan(ctx.queue, [x.buffer, y.buffer])
        assert plan is not None
        x2 = _tensor(ctx, rng, (2, 3, 4, 4))
        y2 = dp.Tensor.full(ctx, y.shape, float("nan"))
        plan.run([x2.buffer, y2.buffer])
        assert_close(y2.numpy(), chain(x2).numpy(), 0.0)
