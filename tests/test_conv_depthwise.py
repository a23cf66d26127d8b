"""Depthwise convolution kernels forced one by one (ops/conv/depthwise.py) against torch float64:
the row-band forward and data gradient with fixed and chosen geometries."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import algorithms, depthwise, selection
from dlprim_py.ops.conv.problem import make_problem

from conftest import assert_close, poisoned, random

Bands = depthwise.DepthwiseBands


def at_offset(ctx, a, skip=5):
    """A tensor holding ``a`` that starts ``skip`` elements into its buffer."""
    padded = np.concatenate([np.full(skip, np.nan), a.ravel()]).astype(np.float32)
    t = dp.Tensor.from_numpy(ctx, padded)
    return dp.Tensor(ctx, t.buffer, a.shape, offset=t.offset + skip * 4)


def reference(x, w, stride, pad, groups):
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(tx, tw, stride=stride, padding=pad, groups=groups)
    return tx, tw, y


# (shape, multiplier, kernel, stride, pad, bands): partial last bands and plane groups, every
# stride the kernels unroll differently, asymmetric edges.
CASES = [
    ((2, 3, 9, 7), 1, 3, 1, 1, Bands(8, 32, 2, 3)),     # 6 planes in 3 groups, 3 bands of 3
    ((2, 3, 11, 10), 1, 3, 2, 1, Bands(8, 32, 4, 4)),   # stride 2, planes 4 (last group half)
    ((1, 2, 13, 12), 2, 5, 2, 2, Bands(8, 32, 3, 2)),   # multiplier 2 (forward only), 5x5
    ((2, 2, 10, 9), 1, 3, 3, 0, Bands(8, 32, 1, 3)),    # stride 3, no padding
]


@pytest.mark.parametrize("shape, mult, r, stride, pad, bands", CASES)
def test_rows_forward_forced_bands(ctx, rng, shape, mult, r, stride, pad, bands):
    """conv_dw_forward_rows with fixed geometry, at non-zero offsets, with bias and activation
    of the epilogue into a poisoned output, then with beta."""
    n, c, h, wd = shape
    x, w = random(rng, shape), random(rng, (c * mult, 1, r, r))
    bias = random(rng, (c * mult,))
    _, _, ref = reference(x, w, stride, pad, c)
    ref = np.maximum(ref.detach().numpy() + bias[None, :, None, None], 0)
    problem = make_problem(shape, w.shape, dp.ConvolutionDesc(pad, stride, 1, c))
    algo = depthwise.DepthwiseRows(bands, name="depthwise_rows_test")
    assert algo.applies(ctx, problem, "forward")
    epilogue = algorithms.Epilogue(has_shift=True, activation=dp.ActivationDesc("relu"))
    X, W, B = (at_offset(ctx, a) for a in (x, w, bias))
    Y = poisoned(ctx, ref.shape)
    algo.run(ctx, problem, "forward", X, W, Y, algorithms.EpilogueArgs(shift=B), epilogue)
    assert_close(Y.numpy(), ref)
    y_old = random(rng, ref.shape)
    Y = at_offset(ctx, y_old)
    algo.run(ctx, problem, "forward", X, W, Y,
             algorithms.EpilogueArgs(shift=B, alpha=1.0, beta=0.5), epilogue)
    assert_close(Y.numpy(), ref + 0.5 * y_old)


@pytest.mark.parametrize("shape, mult, r, stride, pad, bands",
                         [case for case in CASES if case[1] == 1])
def test_rows_backward_data_forced_bands(ctx, rng, shape, mult, r, stride, pad, bands):
    """conv_dw_backward_data_rows with fixed geometry (band height a multiple of the stride)
    against torch's input gradient, with alpha and beta, at non-zero offsets."""
    n, c, h, wd = shape
    x, w = random(rng, shape), random(rng, (c, 1, r, r))
    tx, _, y = reference(x, w, stride, pad, c)
    dy = random(rng, tuple(y.shape))
    y.backward(torch.tensor(dy, dtype=torch.float64))
    ref = tx.grad.numpy()
    problem = make_problem(shape, w.shape, dp.ConvolutionDesc(pad, stride, 1, c))
    band_h = max(stride, bands.band_h // stride * stride)
    algo = depthwise.DepthwiseRows(Bands(bands.gx, bands.gy, bands.planes, band_h),
                                   name="depthwise_rows_test")
    assert algo.applies(ctx, problem, "backward_data")
    dx_old = random(rng, shape)
    DY, W, DX = (at_offset(ctx, a) for a in (dy, w, dx_old))
    algo.run(ctx, problem, "backward_data", DY, W, DX,
             algorithms.EpilogueArgs(alpha=2.0, beta=-1.0))
    assert_close(DX.numpy(), 2.0 * ref - dx_old)
    DX = poisoned(ctx, shape)
    algo.run(ctx, problem, "backward_data", DY, W, DX, algorithms.EpilogueArgs())
    assert_close(DX.numpy(), ref)


@pytest.mark.parametrize("h, stride", [(7, 1), (13, 2)])   # 13: one odd-height band
def test_rows_chosen_geometry_through_the_operator(ctx, rng, monkeypatch, h, stride):
    """The geometry chosen per problem (several whole planes per group for small planes), run
    through Convolution with DLPRIM_CONV_ALGO, forward and data gradient."""
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "depthwise_rows")
    dp.config.reload()
    c = 6
    x, w = random(rng, (3, c, h, h)), random(rng, (c, 1, 3, 3))
    tx, _, y = reference(x, w, stride, 1, c)
    dy = random(rng, tuple(y.shape))
    y.backward(torch.tensor(dy, dtype=torch.float64))
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(w.shape),
                          dp.ConvolutionDesc(1, stride, 1, c))
    bands = selection.algorithm("depthwise_rows").choose_bands(ctx, conv.problem, "forward")
    assert bands.band_h == conv.problem.ho
    bands = selection.algorithm("depthwise_rows").choose_bands(ctx, conv.problem, "backward_data")
    assert bands.band_h == h
    Y = poisoned(ctx, conv.output_desc.shape)
    conv.forward(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w), Y)
    assert_close(Y.numpy(), y.detach().numpy())
    DX = poisoned(ctx, x.shape)
    conv.backward_data(dp.Tensor.from_numpy(ctx, dy), dp.Tensor.from_numpy(ctx, w), DX)
    assert_close(DX.numpy(), tx.grad.numpy())


def test_rows_large_plane_is_cut_into_bands(ctx):
    """A plane too big for one group's staging is cut into bands within the local budget;
    the data-gradient bands are a multiple of the stride."""
    algo = depthwise.DepthwiseRows()
    p = make_problem((64, 96, 112, 112), (96, 1, 3, 3), dp.ConvolutionDesc(1, 2, 1, 96))
    for direction in ("forward", "backward_data"):
        bands = algo.choose_bands(ctx, p, direction)
        out_h = p.ho if direction == "forward" else p.h
        rows, cols = algo.staged_shape(p, direction, bands.band_h)
        assert bands.planes == 1 and bands.band_h < out_h
        assert rows * cols * 4 <= algo.local_bytes(ctx)
        assert direction == "forward" or bands.band_h % 2 == 0


def test_rows_applies(ctx):
    """NCHW, dilation 1, equal strides; the data gradient only with multiplier 1; never the
    filter gradient."""
    algo = selection.algorithm("depthwise_rows")

    def problem(layout="NCHW", stride=1, dil=1, mult=1):
        return make_problem((2, 4, 9, 9) if layout == "NCHW" else (2, 9, 9, 4),
                            (4 * mult, 1, 3, 3) if layout == "NCHW" else (4 * mult, 3, 3, 1),
                            dp.ConvolutionDesc(1, stride, dil, 4), layout)

    assert algo.applies(ctx, problem(), "forward")
    assert algo.applies(ctx, problem(), "backward_data")
    assert not algo.applies(ctx, problem(), "backward_filter")
    assert algo.applies(ctx, problem(mult=2), "forward")
    assert not algo.applies(ctx, problem(mult=2), "backward_data")
    assert not algo.applies(ctx, problem("NHWC"), "forward")
    assert not algo.applies(ctx, problem(dil=2), "forward")
    assert not algo.applies(ctx, problem(stride=(1, 2)), "forward")


def test_find_rules_drop_and_ties(ctx, monkeypatch):
    """find's rules on made-up device times: a candidate whose first run is twice the best is
    run once; medians within 3 % go to the higher-priority candidate; the medians decide."""
    problem = make_problem((2, 4, 9, 9), (4, 1, 3, 3), dp.ConvolutionDesc(1, 1, 1, 4))
    first, second, third = order = ["depthwise_tiled", "depthwise", "depthwise_rows"]
    monkeypatch.setattr(selection, "applicable", lambda *args: order)
    by_kernel = {"conv_dw_forward": "depthwise", "conv_dw_forward_rows": "depthwise_rows",
                 "conv_dw_forward_tiled": "depthwise_tiled"}
    samples = {first: [1.02, 5.0, 1.02], second: [1.0, 1.0, 1.0], third: [2.5, 0.1, 0.1]}
    calls = {name: 0 for name in samples}

    def fake_timing(ctx, run, warmup, repeat):
        kernel = run.__self__.steps[0].kernel.kernel
        name = by_kernel[kernel.function_name]
        value = samples[name][calls[name]]
        calls[name] += 1
        return dp.timing.Timing([value * 1e-3])

    monkeypatch.setattr(selection, "time_enqueued", fake_timing)
    winner, times = selection.measure(ctx, problem, "forward")
    assert winner == first and times[first] == pytest.approx(1.02e-3)
    assert calls == {first: 3, second: 3, third: 1}
    assert times[third] == pytest.approx(2.5e-3)
    samples[first] = [1.1, 1.1, 1.1]
    calls.update({name: 0 for name in calls})
    assert selection.measure(ctx, problem, "forward")[0] == second


def test_find_time_is_bounded(ctx):
    """A find with warm kernels runs each candidate at most a warm-up and three times."""
    import time
    problem = make_problem((2, 4, 9, 9), (4, 1, 3, 3), dp.ConvolutionDesc(1, 1, 1, 4))
    selection.measure(ctx, problem, "forward")
    started = time.perf_counter()
    winner, times = selection.measure(ctx, problem, "forward")
    assert winner in times and all(t > 0 for t in times.values())
    assert time.perf_counter() - started < 2.0


def test_rows_ranks(ctx):
    """The immediate rule: on GPUs the row bands first for the data gradient and the tiled
    kernel first for the forward; on CPUs the plain kernel first in both."""
    p = make_problem((2, 4, 9, 9), (4, 1, 3, 3), dp.ConvolutionDesc(1, 1, 1, 4))
    forward, backward = (selection.immediate(ctx, p, d) for d in ("forward", "backward_data"))
    if ctx.info.is_gpu:
        assert (forward, backward) == ("depthwise_tiled", "depthwise_rows")
    else:
        assert (forward, backward) == ("depthwise", "depthwise")
    order = selection.applicable(ctx, p, "forward")
    assert order.index("depthwise_rows") > order.index("depthwise") or not ctx.info.is_gpu


def test_rows_budgets_from_a_user_database(ctx, tuning_rules):
    """depthwise_rows' staging budget and outputs per group are tuning values: a device rule
    with a smaller budget cuts a plane into shorter bands, within it."""
    algo = depthwise.DepthwiseRows()
    p = make_problem((64, 96, 112, 112), (96, 1, 3, 3), dp.ConvolutionDesc(1, 2, 1, 96))
    shipped = algo.choose_bands(ctx, p, "forward")
    tuning_rules("conv_depthwise", [{"when": {}, "params": {"rows_local_bytes": 4096}}])
    assert algo.local_bytes(ctx) == 4096
    assert algo.outputs_per_group(ctx) == 2048        # the shipped value, not in the device rule
    small = algo.choose_bands(ctx, p, "forward")
    rows, cols = algo.staged_shape(p, "forward", small.band_h)
    assert rows * cols * 4 <= 4096 and small.band_h < shipped.band_h
