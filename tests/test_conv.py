"""2-D convolution against PyTorch CPU in float64: every algorithm forced on every configuration
it applies to, in every direction, both layouts; the fused epilogue; alpha/beta; the functional
API with autograd; transposed convolution; selection and the find-db; bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py import finddb
from dlprim_py.ops.conv import algorithms, depthwise, selection
from dlprim_py.ops.conv.problem import make_problem
from conftest import assert_close, poisoned, random

# (N, C, H, W, K, R, S, padding, stride, dilation, groups)
CONFIGS = {
    "3x3": (2, 4, 7, 6, 5, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    "3x3pads": (2, 3, 7, 5, 4, 3, 3, (0, 2), (1, 1), (1, 1), 1),   # Winograd's padding cases
    "asym": (2, 6, 9, 11, 8, 3, 2, (1, 2), (2, 1), (1, 2), 2),
    "1x1": (2, 8, 5, 4, 6, 1, 1, (0, 0), (1, 1), (1, 1), 1),
    "1x1s2": (2, 8, 7, 6, 4, 1, 1, (0, 0), (2, 2), (1, 1), 1),
    "s2_3x3": (2, 6, 9, 8, 5, 3, 3, (1, 1), (2, 2), (1, 1), 1),     # backward data by phases
    "5x5s3": (1, 3, 11, 10, 4, 5, 5, (2, 1), (3, 2), (1, 1), 1),
    "dw3x3": (2, 6, 8, 7, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6),
    "dw3x3s2": (2, 6, 9, 8, 6, 3, 3, (1, 1), (2, 2), (1, 1), 6),
    "dw_mult2": (1, 4, 6, 6, 8, 3, 3, (0, 1), (1, 2), (2, 1), 4),
}
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def torch_reference(x, w, b, cfg):
    """y, dx, dw, db in float64 (NCHW), with an upstream gradient dy drawn by the caller."""
    n, c, h, wd, k, r, s, pad, stride, dil, groups = cfg
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = None if b is None else torch.tensor(b, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(xt, wt, bt, stride=stride, padding=pad, dilation=dil, groups=groups)
    return xt, wt, bt, y


def nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def make_case(rng, cfg, layout):
    n, c, h, wd, k, r, s, pad, stride, dil, groups = cfg
    x = random(rng, (n, c, h, wd))
    w = random(rng, (k, c // groups, r, s))
    xt, wt, _, y = torch_reference(x, w, None, cfg)
    dy = random(rng, tuple(y.shape))
    y.backward(torch.tensor(dy, dtype=torch.float64))
    ref = {"y": y.detach().numpy(), "dx": xt.grad.numpy(), "dw": wt.grad.numpy()}
    if layout == "NHWC":
        x, w, dy = nhwc(x), nhwc(w), nhwc(dy)
        ref = {name: nhwc(v) for name, v in ref.items()}
    return x, w, dy, ref


def make_conv(ctx, cfg, layout):
    n, c, h, wd, k, r, s, pad, stride, dil, groups = cfg
    xs = (n, c, h, wd) if layout == "NCHW" else (n, h, wd, c)
    ws = (k, c // groups, r, s) if layout == "NCHW" else (k, r, s, c // groups)
    return dp.Convolution(ctx, dp.TensorDesc(xs), dp.TensorDesc(ws),
                          dp.ConvolutionDesc(pad, stride, dil, groups), layout=layout)


def run_direction(ctx, conv, direction, algo, x, w, dy):
    X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
    if direction == "forward":
        out = poisoned(ctx, conv.output_desc.shape)
        conv.forward(X, W, out, algo=algo)
    elif direction == "backward_data":
        out = poisoned(ctx, x.shape)
        conv.backward_data(DY, W, out, algo=algo)
    else:
        out = poisoned(ctx, w.shape)
        conv.backward_filter(DY, X, out, algo=algo)
    return out.numpy()


REF_NAME = {"forward": "y", "backward_data": "dx", "backward_filter": "dw"}


# NHWC on a subset: each layout is its own compile, and these cover its index paths.
CASES = [(name, "NCHW") for name in CONFIGS] + [(name, "NHWC") for name in ("3x3", "asym", "1x1", "1x1s2", "dw3x3s2")]


@pytest.mark.parametrize("name,layout", CASES)
def test_every_algorithm_every_direction(ctx, rng, name, layout):
    cfg = CONFIGS[name]
    x, w, dy, ref = make_case(rng, cfg, layout)
    conv = make_conv(ctx, cfg, layout)
    for direction in DIRECTIONS:
        algos = conv.algorithms(direction)
        assert "direct" in algos
        if name.startswith("dw"):
            assert "depthwise" in algos
        if name.startswith("3x3"):
            assert "winograd" in algos
        if name == "1x1" and (direction != "backward_filter" or layout == "NHWC"):
            assert algos[0] == "gemm"
        if name == "1x1s2" and direction != "backward_filter":
            assert algos[0] == "gemm"
        for algo in algos:
            out = run_direction(ctx, conv, direction, algo, x, w, dy)
            try:
                assert_close(out, ref[REF_NAME[direction]])
            except AssertionError as e:
                raise AssertionError(f"{name} {layout} {direction} {algo}: {e}") from None


def test_implicit_gemm_tiles(ctx, rng):
    """The GPU tile shapes run on any device: force each on one problem, all directions."""
    cfg = (2, 8, 9, 9, 70, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    problem = make_problem(x.shape, w.shape, dp.ConvolutionDesc(1, 1, 1, 1))
    for tile in (algorithms.TILE_LARGE, algorithms.TILE_WIDE):
        if tile.threads > ctx.info.max_work_group_size:
            continue
        algo = algorithms.ImplicitGemm(tile)
        X, W, DY = (dp.Tensor.from_numpy(ctx, a) for a in (x, w, dy))
        for direction, (src, other, shape) in {
                "forward": (X, W, ref["y"].shape), "backward_data": (DY, W, x.shape),
                "backward_filter": (DY, X, w.shape)}.items():
            out = poisoned(ctx, shape)
            size = algo.workspace_size(ctx, problem, direction)
            ws = dp.Tensor.empty(ctx, (max(size // 4, 1),))
            algo.run(ctx, problem, direction, src, other, out, algorithms.EpilogueArgs(),
                     workspace=ws)
            assert_close(out.numpy(), ref[REF_NAME[direction]])


def test_split_k_backward_filter(ctx, rng):
    """backward_filter with kk split over work groups and reduced through the workspace."""
    cfg = (4, 3, 10, 10, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1)
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    problem = make_problem(x.shape, w.shape, dp.ConvolutionDesc(1, 1, 1, 1))

    class ManySplits(algorithms.ImplicitGemm):
        def splits(self, ctx, problem, direction, tile):
            return 5, 88   # 400 pixels in 5 splits of 88 (multiple of tile_k)

    algo = ManySplits(algorithms.TILE_SMALL)
    assert algo.workspace_size(ctx, problem, "backward_filter") == 5 * w.size * 4
    ws = dp.Tensor.empty(ctx, (5 * w.size + 3,))
    ws = dp.Tensor.from_buffer(ctx, ws.buffer, (5 * w.size,), offset=12)
    out = poisoned(ctx, w.shape)
    algo.run(ctx, problem, "backward_filter", dp.Tensor.from_numpy(ctx, dy),
             dp.Tensor.from_numpy(ctx, x), out, algorithms.EpilogueArgs(), workspace=ws)
    assert_close(out.numpy(), ref["dw"])


@pytest.mark.parametrize("name", ["3x3", "1x1", "dw3x3s2"])
def test_fused_epilogue(ctx, rng, name):
    """y = act(alpha * conv * scale + shift + residual_alpha * z) + beta * y_old, each algorithm."""
    cfg = CONFIGS[name]
    x, w, _, ref = make_case(rng, cfg, "NCHW")
    k = cfg[4]
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    z, y_old = random(rng, ref["y"].shape), random(rng, ref["y"].shape)
    alpha, beta, ralpha = 0.7, 0.3, -1.3
    pre = alpha * ref["y"] * scale[None, :, None, None] + shift[None, :, None, None] + ralpha * z
    expected = np.maximum(pre, 0) + beta * y_old
    conv = make_conv(ctx, cfg, "NCHW")
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for algo in conv.algorithms():
        y = T(y_old)
        conv.forward(T(x), T(w), y, alpha=alpha, beta=beta, activation="relu", algo=algo,
                     scale=T(scale), shift=T(shift), residual=T(z), residual_alpha=ralpha)
        assert_close(y.numpy(), expected)
        # bias alone (the shift) with another activation.
        y = poisoned(ctx, ref["y"].shape)
        conv.forward(T(x), T(w), y, bias=T(shift), activation=dp.ActivationDesc("leakyrelu", 0.1),
                     algo=algo)
        pre = ref["y"] + shift[None, :, None, None]
        assert_close(y.numpy(), np.where(pre > 0, pre, 0.1 * pre))
        # bias, activation and beta: beta * y_old is added after the activation.
        y = T(y_old)
        conv.forward(T(x), T(w), y, bias=T(shift), beta=0.5, activation="relu", algo=algo)
        assert_close(y.numpy(), np.maximum(pre, 0) + 0.5 * y_old)


def test_alpha_beta_accumulate_and_offsets(ctx, rng):
    """beta=1 accumulates in every direction; tensors at non-zero offsets inside larger buffers."""
    cfg = CONFIGS["asym"]
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    conv = make_conv(ctx, cfg, "NCHW")

    def at_offset(a, pad=5):
        big = dp.Tensor.from_numpy(ctx, np.concatenate([np.full(pad, np.nan, np.float32), a.ravel()]))
        return dp.Tensor.from_buffer(ctx, big.buffer, a.shape, offset=pad * 4)

    X, W, DY = at_offset(x), at_offset(w, 7), at_offset(dy, 3)
    for algo in ("implicit_gemm", "direct"):
        old = random(rng, ref["y"].shape)
        y = at_offset(old, 9)
        conv.forward(X, W, y, alpha=2.0, beta=1.0, algo=algo)
        assert_close(y.numpy(), 2 * ref["y"] + old)
        old = random(rng, x.shape)
        dx = at_offset(old, 2)
        conv.backward_data(DY, W, dx, alpha=-1.0, beta=1.0, algo=algo)
        assert_close(dx.numpy(), old - ref["dx"])
        old = random(rng, w.shape)
        dw = at_offset(old, 11)
        conv.backward_filter(DY, X, dw, alpha=0.5, beta=1.0, algo=algo)
        assert_close(dw.numpy(), 0.5 * ref["dw"] + old)
    db = at_offset(np.ones(cfg[4], np.float32), 4)
    conv.backward_bias(DY, db, alpha=1.0, beta=2.0)
    assert_close(db.numpy(), dy.sum(axis=(0, 2, 3)) + 2.0)


@pytest.mark.parametrize("bias", [True, False])
def test_functional_conv2d_autograd(ctx, rng, bias):
    x = random(rng, (2, 6, 8, 7))
    w = random(rng, (4, 3, 3, 3))
    b = random(rng, (4,)) if bias else None
    kwargs = dict(stride=(1, 2), padding=1, dilation=(2, 1), groups=2)
    X = dp.Tensor.from_numpy(ctx, x, requires_grad=True)
    W = dp.Tensor.from_numpy(ctx, w, requires_grad=True)
    B = dp.Tensor.from_numpy(ctx, b, requires_grad=True) if bias else None
    y = dp.functional.conv2d(X, W, B, **kwargs)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True) if bias else None
    yt = F.conv2d(xt, wt, bt, **kwargs)
    assert_close(y.numpy(), yt.detach().numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yt.backward(torch.tensor(g, dtype=torch.float64))
    assert_close(X.grad.numpy(), xt.grad.numpy())
    assert_close(W.grad.numpy(), wt.grad.numpy())
    if bias:
        assert_close(B.grad.numpy(), bt.grad.numpy())


@pytest.mark.parametrize("cfg", [
    # (N, Cin, H, W, Cout, R, S, stride, padding, output_padding, groups, dilation)
    (2, 4, 5, 4, 6, 3, 3, 2, 1, 1, 2, (1, 1)),
    (1, 3, 4, 6, 2, 2, 3, (3, 1), (0, 1), (2, 0), 1, (1, 2)),
    # output_padding >= stride, allowed below the dilation (once refused as "inconsistent").
    (1, 2, 4, 5, 3, 3, 3, 1, 0, 1, 1, 2),
    (2, 4, 4, 3, 4, 3, 2, (1, 2), (1, 0), (1, 1), 2, (2, 1)),
])
def test_functional_conv_transpose2d_autograd(ctx, rng, cfg):
    n, cin, h, w_, cout, r, s, stride, padding, output_padding, groups, dilation = cfg
    x = random(rng, (n, cin, h, w_))
    w = random(rng, (cin, cout // groups, r, s))
    b = random(rng, (cout,))
    kwargs = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                  dilation=dilation)
    X = dp.Tensor.from_numpy(ctx, x, requires_grad=True)
    W = dp.Tensor.from_numpy(ctx, w, requires_grad=True)
    B = dp.Tensor.from_numpy(ctx, b, requires_grad=True)
    y = dp.functional.conv_transpose2d(X, W, B, **kwargs)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    yt = F.conv_transpose2d(xt, wt, bt, **kwargs)
    assert_close(y.numpy(), yt.detach().numpy())
    g = random(rng, y.shape)
    y.backward(dp.Tensor.from_numpy(ctx, g))
    yt.backward(torch.tensor(g, dtype=torch.float64))
    assert_close(X.grad.numpy(), xt.grad.numpy())
    assert_close(W.grad.numpy(), wt.grad.numpy())
    assert_close(B.grad.numpy(), bt.grad.numpy())


def test_selection_forced_and_immediate(ctx, monkeypatch):
    problem = make_problem((2, 6, 8, 8), (6, 1, 3, 3), dp.ConvolutionDesc(1, 1, 1, 6))
    # GPUs take the tiled depthwise kernel (local-memory staging); CPUs the plain one.
    expected = "depthwise_tiled" if ctx.info.is_gpu else "depthwise"
    assert selection.immediate(ctx, problem, "forward") == expected
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "direct")
    dp.config.reload()
    assert selection.choose(ctx, problem, "forward") == "direct"
    dense = make_problem((2, 6, 8, 8), (4, 6, 3, 3), dp.ConvolutionDesc(1, 1, 1, 1))
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "depthwise")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        selection.choose(ctx, dense, "forward")
    monkeypatch.setenv("DLPRIM_CONV_ALGO", "no_such_algo")
    dp.config.reload()
    with pytest.raises(dp.UnsupportedError, match="unknown convolution algorithm"):
        selection.choose(ctx, dense, "forward")


def test_find_mode_and_find_db(ctx, rng, monkeypatch, tmp_path):
    path = tmp_path / "finddb.json"
    monkeypatch.setattr(finddb, "path_for", lambda c: path)
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)   # which turns the find-db off
    ctx.memo.pop("conv_finddb", None)
    ctx.memo.pop("conv_find", None)
    monkeypatch.setenv("DLPRIM_FIND_MODE", "find")
    dp.config.reload()
    cfg = CONFIGS["3x3"]
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    conv = make_conv(ctx, cfg, "NCHW")
    key = conv.problem.key("forward")
    assert key == "4-7-6-3x3-5-7-6-2-1x1-1x1-1x1-1-NCHW-float32-forward"
    stored = finddb.FindDb(ctx).lookup(key)
    assert stored in conv.algorithms("forward")
    out = run_direction(ctx, conv, "forward", None, x, w, dy)
    assert_close(out, ref["y"])
    # Another process (a fresh FindDb) reads the record; a second store merges, not replaces.
    other = finddb.FindDb(ctx)
    other.store("some-other-problem", "direct", 1.0)
    assert finddb.FindDb(ctx).lookup(key) == stored
    assert finddb.FindDb(ctx).lookup("some-other-problem") == "direct"
    ctx.memo.pop("conv_finddb", None)
    ctx.memo.pop("conv_find", None)


def test_find_inside_a_recording_adds_no_launches(ctx, rng, monkeypatch, tmp_path):
    """Find mode measures where a call first needs the choice, which may be inside the
    recording of that call's plan (a backward's directions are chosen there): the candidates'
    trial runs must stay out of it, or every replay of the plan would run them all."""
    from dlprim_py import launch
    from dlprim_py.ops.conv import selection
    monkeypatch.setattr(finddb, "path_for", lambda c: tmp_path / "finddb.json")
    monkeypatch.delenv("DLPRIM_NO_CACHE", raising=False)
    ctx.memo.pop("conv_finddb", None)
    monkeypatch.setenv("DLPRIM_FIND_MODE", "find")
    dp.config.reload()
    conv = make_conv(ctx, CONFIGS["3x3"], "NCHW")
    with launch.Recording() as recording:
        name = selection.find(ctx, conv.problem, "backward_data")
    assert name in conv.algorithms("backward_data")
    assert recording.steps == [] and not recording.opaque
    ctx.memo.pop("conv_finddb", None)


def test_bad_input(ctx):
    desc = dp.ConvolutionDesc(1, 1, 1, 1)
    T = dp.TensorDesc
    with pytest.raises(dp.ShapeError, match="not divisible by groups"):
        dp.Convolution(ctx, T((1, 6, 5, 5)), T((4, 3, 3, 3)), dp.ConvolutionDesc(1, 1, 1, 4))
    with pytest.raises(dp.ShapeError, match="channels per group"):
        dp.Convolution(ctx, T((1, 6, 5, 5)), T((4, 4, 3, 3)), desc)
    with pytest.raises(dp.ShapeError, match="larger than the padded input"):
        dp.Convolution(ctx, T((1, 2, 3, 3)), T((4, 2, 5, 5)), dp.ConvolutionDesc(0, 1, 1, 1))
    with pytest.raises(dp.ShapeError, match="stride must be > 0"):
        dp.ConvolutionDesc(0, (1, 0))
    with pytest.raises(dp.ShapeError, match="stride must be > 0"):
        dp.ConvolutionDesc(0, -2)
    with pytest.raises(dp.ShapeError, match="weight must have rank 4"):
        dp.Convolution(ctx, T((1, 2, 5, 5)), T((4, 2, 3)), desc)
    with pytest.raises(dp.UnsupportedError, match="layout"):
        dp.Convolution(ctx, T((1, 2, 5, 5)), T((4, 2, 3, 3)), desc, layout="CHWN")
    conv = dp.Convolution(ctx, T((1, 2, 5, 5)), T((4, 2, 3, 3)), desc)
    x = dp.Tensor.zeros(ctx, (1, 2, 5, 5))
    w = dp.Tensor.zeros(ctx, (4, 2, 3, 3))
    with pytest.raises(dp.ShapeError, match=r"y must have shape \(1, 4, 5, 5\)"):
        conv.forward(x, w, dp.Tensor.zeros(ctx, (1, 4, 4, 4)))
    with pytest.raises(dp.UnsupportedError, match="does not apply"):
        conv.forward(x, w, dp.Tensor.zeros(ctx, (1, 4, 5, 5)), algo="depthwise")
    X = dp.Tensor.zeros(ctx, (1, 6, 5, 5))
    with pytest.raises(dp.ShapeError, match="channels per group"):
        dp.functional.conv2d(X, dp.Tensor.zeros(ctx, (4, 4, 3, 3)), groups=2)
    with pytest.raises(dp.ShapeError, match="rank 4"):
        dp.functional.conv2d(X, dp.Tensor.zeros(ctx, (4, 6, 3)))
    with pytest.raises(dp.ShapeError, match="stride must be > 0"):
        dp.functional.conv2d(X, dp.Tensor.zeros(ctx, (4, 6, 3, 3)), stride=0)
    with pytest.raises(dp.ShapeError, match="larger than the padded input"):
        dp.functional.conv2d(X, dp.Tensor.zeros(ctx, (4, 6, 7, 7)))
    with pytest.raises(dp.ShapeError, match="output_padding"):
        dp.functional.conv_transpose2d(X, dp.Tensor.zeros(ctx, (6, 2, 3, 3)), stride=2,
                                       output_padding=2)
    with pytest.raises(dp.DTypeError):
        dp.functional.conv2d(np.zeros((1, 6, 5, 5)), dp.Tensor.zeros(ctx, (4, 6, 3, 3)))


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@st.composite
def conv_configs(draw):
    groups = draw(st.integers(1, 3))
    depthwise = draw(st.booleans())
    cg = 1 if depthwise else draw(st.integers(1, 3))
    kg = draw(st.integers(1, 2)) if depthwise else draw(st.integers(1, 3))
    r, s = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3]))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    h = draw(st.integers(max(1, dil[0] * (r - 1) + 1 - 2 * pad[0]), 9))
    w = draw(st.integers(max(1, dil[1] * (s - 1) + 1 - 2 * pad[1]), 9))
    n = draw(st.integers(1, 2))
    if depthwise and groups == 1:
        groups = 2
    return (n, cg * groups, h, w, kg * groups, r, s, pad, stride, dil, groups)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=conv_configs(), seed=st.integers(0, 2 ** 16))
def test_drawn_configurations(ctx, cfg, seed):
    rng = np.random.default_rng(seed)
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    conv = make_conv(ctx, cfg, "NCHW")
    for direction in DIRECTIONS:
        for algo in conv.algorithms(direction):
            out = run_direction(ctx, conv, direction, algo, x, w, dy)
            try:
                assert_close(out, ref[REF_NAME[direction]])
            except AssertionError as e:
                raise AssertionError(f"{cfg} {direction} {algo}: {e}") from None


def test_repeated_calls_on_the_same_tensors(ctx, rng):
    """A second call on the same tensors replays the recorded launches: new data, right result."""
    cfg = CONFIGS["3x3"]
    conv = make_conv(ctx, cfg, "NCHW")
    X = dp.Tensor.empty(ctx, (2, 4, 7, 6))
    W = dp.Tensor.empty(ctx, (5, 4, 3, 3))
    Y = dp.Tensor.empty(ctx, conv.output_desc.shape)
    for algo in conv.algorithms():
        for _ in range(2):
            x, w = random(rng, X.shape), random(rng, W.shape)
            X.copy_(dp.Tensor.from_numpy(ctx, x))
            W.copy_(dp.Tensor.from_numpy(ctx, w))
            Y.fill_(np.nan)
            conv.forward(X, W, Y, algo=algo)
            assert_close(Y.numpy(), torch_reference(x, w, None, cfg)[3].detach().numpy())


@pytest.mark.parametrize("shape, mult, r, stride, pad, tile", [
    # partial blocks in both axes, several planes per group, the last plane group half empty
    ((3, 3, 13, 11), 1, 3, 1, 1, depthwise.DepthwiseTile(4, 2, 3, 2, 3)),
    # stride 2, multiplier 2, 5x5 with asymmetric coverage of the last block
    ((2, 2, 12, 17), 2, 5, 2, 2, depthwise.DepthwiseTile(8, 2, 2, 4, 2)),
])
def test_depthwise_tiled_forced_tiles(ctx, rng, shape, mult, r, stride, pad, tile):
    """conv_dw_forward_tiled with fixed tiles against torch float64, on tensors at a non-zero
    offset, with the bias, activation and beta of the epilogue."""
    n, c, h, wd = shape
    x, w = random(rng, shape), random(rng, (c * mult, 1, r, r))
    bias = random(rng, (c * mult,))
    ref = F.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(bias), stride=stride,
                   padding=pad, groups=c).numpy()
    y_old = random(rng, ref.shape)
    conv = dp.Convolution(ctx, dp.TensorDesc(shape), dp.TensorDesc(w.shape),
                          dp.ConvolutionDesc(pad, stride, 1, c))
    algo = depthwise.DepthwiseTiled(tile, name="depthwise_tiled_test")
    assert algo.applies(ctx, conv.problem, "forward")
    assert not algo.applies(ctx, conv.problem, "backward_data")

    def at_offset(a):
        padded = np.concatenate([np.full(5, np.nan), a.ravel()]).astype(np.float32)
        t = dp.Tensor.from_numpy(ctx, padded)
        return dp.Tensor(ctx, t.buffer, a.shape, offset=t.offset + 5 * 4)

    X, W, B, Y = at_offset(x), at_offset(w), at_offset(bias), at_offset(y_old)
    algo.run(ctx, conv.problem, "forward", X, W, Y,
             algorithms.EpilogueArgs(shift=B, alpha=1.0, beta=0.5),
             algorithms.Epilogue(has_shift=True, activation=dp.ActivationDesc("relu")))
    assert_close(Y.numpy(), np.maximum(ref, 0) + 0.5 * y_old)
    Y = poisoned(ctx, ref.shape)
    algo.run(ctx, conv.problem, "forward", X, W, Y, algorithms.EpilogueArgs(shift=B))
    # A shift that the compiled epilogue lacks is not applied.
    assert_close(Y.numpy(), ref - bias[None, :, None, None])


def test_depthwise_tiled_applies_and_ranks(ctx):
    """Forward only, NCHW, dilation 1, equal strides; ranked first on GPUs only."""
    dw = lambda layout="NCHW", stride=1, dil=1: make_problem(  # noqa: E731
        (2, 4, 9, 9) if layout == "NCHW" else (2, 9, 9, 4),
        (4, 1, 3, 3) if layout == "NCHW" else (4, 3, 3, 1),
        dp.ConvolutionDesc(1, stride, dil, 4), layout)
    algo = selection.algorithm("depthwise_tiled")
    assert algo.applies(ctx, dw(), "forward")
    assert algo.applies(ctx, dw(stride=2), "forward")
    assert not algo.applies(ctx, dw(), "backward_filter")
    assert not algo.applies(ctx, dw(layout="NHWC"), "forward")
    assert not algo.applies(ctx, dw(dil=2), "forward")
    assert not algo.applies(ctx, dw(stride=(1, 2)), "forward")
    first = selection.immediate(ctx, dw(), "forward")
    assert first == ("depthwise_tiled" if ctx.info.is_gpu else "depthwise")


@pytest.mark.parametrize("name", ["1x1", "1x1s2"])
def test_gemm_1x1_full_epilogue(ctx, rng, monkeypatch, name):
    """Every epilogue (scale, residual, activation before beta) runs in the GEMM engine's own
    epilogue in the convolution's order, with beta 0 or not: "gemm" is what runs, never another
    algorithm behind its name."""
    def refuse(*args, **kwargs):
        raise AssertionError("the implicit GEMM ran under the name gemm")
    monkeypatch.setattr(algorithms.ImplicitGemm, "run", refuse)
    cfg = CONFIGS[name]
    x, w, _, ref = make_case(rng, cfg, "NCHW")
    k = cfg[4]
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    z, y_old = random(rng, ref["y"].shape), random(rng, ref["y"].shape)
    conv = make_conv(ctx, cfg, "NCHW")
    assert conv.algorithms()[0] == "gemm"
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    pre = 0.7 * ref["y"] * scale[None, :, None, None] + shift[None, :, None, None] - 1.3 * z
    for beta in (0.0, 0.4):
        y = T(y_old) if beta else poisoned(ctx, ref["y"].shape)
        conv.forward(T(x), T(w), y, alpha=0.7, beta=beta, activation="relu", algo="gemm",
                     scale=T(scale), shift=T(shift), residual=T(z), residual_alpha=-1.3)
        assert_close(y.numpy(), np.maximum(pre, 0) + beta * y_old)


def test_direct_phased_backward_data(ctx, rng):
    """conv_direct_backward_data_phased on a stem-like layer (5 input channels: one full and one
    partial channel block, 7x7 stride 2, odd sizes so that phases differ in extent), at offsets,
    with alpha and beta, forced; off GPUs the immediate rule takes it for such a thin data
    gradient (GPUs take im2col_gemm there)."""
    cfg = (2, 5, 13, 11, 6, 7, 7, (3, 3), (2, 2), (1, 1), 1)
    x, w, dy, ref = make_case(rng, cfg, "NCHW")
    conv = make_conv(ctx, cfg, "NCHW")
    expected = "im2col_gemm" if ctx.info.is_gpu else "direct_phased"
    assert selection.immediate(ctx, conv.problem, "backward_data") == expected

    def at_offset(a, pad):
        big = dp.Tensor.from_numpy(ctx, np.concatenate([np.full(pad, np.nan, np.float32),
                                                        a.ravel().astype(np.float32)]))
        return dp.Tensor.from_buffer(ctx, big.buffer, a.shape, offset=pad * 4)

    old = random(rng, x.shape)
    dx = at_offset(old, 3)
    conv.backward_data(at_offset(dy, 5), at_offset(w, 1), dx, alpha=-0.5, beta=1.0,
                       algo="direct_phased")
    assert_close(dx.numpy(), old - 0.5 * ref["dx"])


@pytest.mark.parametrize("transpose", [False, True])
def test_empty_batch(ctx, rng, transpose):
    """N = 0 gives an empty result and zero weight/bias gradients, as in torch (once refused as
    an "empty convolution")."""
    x = dp.Tensor.from_numpy(ctx, np.zeros((0, 4, 6, 5), np.float32), requires_grad=True)
    w_shape = (4, 3, 3, 3) if transpose else (3, 4, 3, 3)
    w = dp.Tensor.from_numpy(ctx, random(rng, w_shape), requires_grad=True)
    b = dp.Tensor.from_numpy(ctx, random(rng, (3,)), requires_grad=True)
    ours = dp.functional.conv_transpose2d if transpose else dp.functional.conv2d
    theirs = F.conv_transpose2d if transpose else F.conv2d
    y = ours(x, w, b, stride=2, padding=1)
    assert y.shape == tuple(theirs(torch.zeros(0, 4, 6, 5), torch.zeros(w_shape), None, stride=2,
                                   padding=1).shape)
    dp.functional.sum(y).backward()
    assert x.grad.shape == x.shape
    assert not w.grad.numpy().any() and not b.grad.numpy().any()
    with pytest.raises(dp.ShapeError, match="bias"):
        ours(x, w, dp.Tensor.zeros(ctx, (4,)))
