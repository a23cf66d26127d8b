"""1x1 convolutions as folded GEMMs (ops/conv/gemm1x1.py) against PyTorch CPU in float64.

NCHW tensors are folded matrices (C x N*P): every direction is one GEMM over all images. Each
GEMM kernel ("tiled", "splitk", "small") is forced in turn, with fixed parameters (one build
per kernel variant, whatever the device's tuning rules), on odd pixel counts (7x7, 5x3: no
vector access), a count the vector loads take (8x8), stride 2 (x sampled in place), batch 1
and 3, tensors at element offsets; outputs start as NaN. The fold itself is tested at the GEMM
level (``Fold``) with its bad input.
"""
import dataclasses

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import selection
from dlprim_py.ops.conv.algorithms import Epilogue, EpilogueArgs
from dlprim_py.ops.conv.gemm1x1 import Gemm1x1
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import Fold, GemmPlan
from conftest import assert_close, poisoned, random

# (N, C, H, W, K, stride)
CASES = [(3, 5, 7, 7, 6, 1),     # P = 49, odd
         (1, 8, 5, 3, 4, 1),     # batch 1, P = 15
         (3, 6, 7, 5, 5, 2),     # stride 2 on odd sizes: Ho x Wo = 4 x 3
         (2, 16, 8, 8, 12, 1)]   # P = 64: vector loads and stores
KERNELS = ["tiled", "splitk", "small"]
# Small register blocks build fastest on PoCL, and still take the vector loads and stores
# (width 2: a folded operand needs P to be a multiple of it).
TILED_VECTOR = {"kernel": "tiled", "tile_m": 16, "tile_n": 16, "tile_k": 8, "wpt_m": 2,
                "wpt_n": 2, "vec": 2, "pad": 2, "double_buffer": 1, "split_k": 1,
                "global_vec": 2}
FORCED = {"tiled": TILED_VECTOR, "splitk": dict(TILED_VECTOR, split_k=3),
          "small": {"kernel": "small", "small_m": 8, "small_n": 16}}


def cases_for(kernel):
    """Every case for "tiled"; the other kernels share its fold code paths but for the
    vector ones, so an odd dense and a strided case each."""
    return CASES if kernel == "tiled" else CASES[:1] + CASES[2:3]


def force(tuning_rules, kernel):
    """Every GEMM the convolution plans runs ``kernel`` with fixed parameters."""
    # A rule of this device's entry in a user tuning database, ahead of the shipped ones.
    tuning_rules("gemm", [{"when": {}, "params": dict(FORCED[kernel])}])


def reference(x, w, dy, stride):
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    y = F.conv2d(xt, wt, stride=stride)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()


def make(ctx, rng, case):
    n, c, h, w, k, stride = case
    x = random(rng, (n, c, h, w))
    wt = random(rng, (k, c, 1, 1))
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    dy = random(rng, (n, k, ho, wo))
    conv = dp.Convolution(ctx, dp.TensorDesc(x.shape), dp.TensorDesc(wt.shape),
                          dp.ConvolutionDesc(0, stride))
    return conv, x, wt, dy, reference(x, wt, dy, stride)


def at_offset(ctx, a, pad):
    """``a`` on the device, starting ``pad`` elements into a NaN-filled buffer."""
    flat = np.concatenate([np.full(pad, np.nan, np.float32), a.ravel().astype(np.float32)])
    big = dp.Tensor.from_numpy(ctx, flat)
    return dp.Tensor.from_buffer(ctx, big.buffer, a.shape, offset=pad * 4)


@pytest.mark.parametrize("kernel", KERNELS)
def test_forward(ctx, rng, monkeypatch, kernel, tuning_rules):
    force(tuning_rules, kernel)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for case in cases_for(kernel):
        conv, x, w, dy, (y_ref, _, _) = make(ctx, rng, case)
        assert conv.algorithms()[0] == "gemm"
        bias = random(rng, (case[4],))
        y = poisoned(ctx, y_ref.shape)
        conv.forward(T(x), T(w), y, bias=T(bias), alpha=0.7, activation="relu", algo="gemm")
        assert_close(y.numpy(), np.maximum(0.7 * y_ref + bias[None, :, None, None], 0))
        # beta reads y_old after the activation (the same build: alpha, beta are arguments)
        y_old = random(rng, y_ref.shape)
        y = T(y_old)
        conv.forward(T(x), T(w), y, bias=T(bias), alpha=-1.5, beta=0.5, activation="relu",
                     algo="gemm")
        assert_close(y.numpy(), np.maximum(-1.5 * y_ref + bias[None, :, None, None], 0)
                     + 0.5 * y_old)


@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_data(ctx, rng, monkeypatch, kernel, tuning_rules):
    force(tuning_rules, kernel)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for case in cases_for(kernel):
        conv, x, w, dy, (_, dx_ref, _) = make(ctx, rng, case)
        assert conv.algorithms("backward_data")[0] == "gemm"
        dx = poisoned(ctx, x.shape)
        conv.backward_data(T(dy), T(w), dx, algo="gemm")
        assert_close(dx.numpy(), dx_ref)
    dx_old = random(rng, x.shape)
    dx = T(dx_old)
    conv.backward_data(T(dy), T(w), dx, alpha=2.0, beta=-0.5, algo="gemm")
    assert_close(dx.numpy(), 2.0 * dx_ref - 0.5 * dx_old)


@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_filter(ctx, rng, monkeypatch, kernel, tuning_rules):
    """dw = dy (K x N*P) @ x^T: the fold runs along the GEMM's reduction dimension."""
    force(tuning_rules, kernel)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for case in cases_for(kernel):
        conv, x, w, dy, (_, _, dw_ref) = make(ctx, rng, case)
        # Offered; first or not as the device's rules rank it (the H200's put implicit_gemm
        # first for these filter gradients).
        assert "gemm" in conv.algorithms("backward_filter")
        dw = poisoned(ctx, w.shape)
        conv.backward_filter(T(dy), T(x), dw, algo="gemm")
        assert_close(dw.numpy(), dw_ref)
    dw_old = random(rng, w.shape)
    dw = T(dw_old)
    conv.backward_filter(T(dy), T(x), dw, alpha=0.5, beta=1.0, algo="gemm")
    assert_close(dw.numpy(), 0.5 * dw_ref + dw_old)


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=["s1", "s2"])
def test_offsets(ctx, rng, monkeypatch, case, tuning_rules):
    """Every tensor starts inside its buffer (element offsets that break vector alignment)."""
    force(tuning_rules, "tiled")
    conv, x, w, dy, (y_ref, dx_ref, dw_ref) = make(ctx, rng, case)
    bias = random(rng, (case[4],))
    X, W, DY, B = (at_offset(ctx, a, pad) for a, pad in ((x, 3), (w, 1), (dy, 5), (bias, 2)))
    y = at_offset(ctx, np.full(y_ref.shape, np.nan, np.float32), 7)
    conv.forward(X, W, y, bias=B, algo="gemm")
    assert_close(y.numpy(), y_ref + bias[None, :, None, None])
    dx = at_offset(ctx, np.full(x.shape, np.nan, np.float32), 1)
    conv.backward_data(DY, W, dx, algo="gemm")
    assert_close(dx.numpy(), dx_ref)
    dw = at_offset(ctx, np.full(w.shape, np.nan, np.float32), 6)
    conv.backward_filter(DY, X, dw, algo="gemm")
    assert_close(dw.numpy(), dw_ref)


def fused_expected(y_ref, alpha, scale, shift, z, residual_alpha, beta, y_old):
    """act(alpha * conv * scale + shift + residual_alpha * z) + beta * y_old with ReLU; scale
    and shift per channel (K,) or per position (K, Ho, Wo)."""
    expand = lambda v: v[None, :, None, None] if v.ndim == 1 else v[None]  # noqa: E731
    pre = alpha * y_ref * expand(scale) + expand(shift) + residual_alpha * z
    return np.maximum(pre, 0) + beta * y_old


@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_epilogue(ctx, rng, monkeypatch, kernel, tuning_rules):
    """The convolution's whole epilogue in the GEMM's store, activation before beta * y_old:
    strided (scalar stores) and P = 64 (vector stores)."""
    force(tuning_rules, kernel)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for case in (CASES[2], CASES[3]) if kernel == "tiled" else (CASES[2],):
        conv, x, w, dy, (y_ref, _, _) = make(ctx, rng, case)
        k = case[4]
        scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
        z, y_old = random(rng, y_ref.shape), random(rng, y_ref.shape)
        y = T(y_old)
        conv.forward(T(x), T(w), y, alpha=0.7, beta=0.4, scale=T(scale), shift=T(shift),
                     residual=T(z), residual_alpha=-1.3, activation="relu", algo="gemm")
        assert_close(y.numpy(), fused_expected(y_ref, 0.7, scale, shift, z, -1.3, 0.4, y_old))


@pytest.mark.parametrize("algo,case", [("gemm", CASES[0]), ("gemm_per_image", CASES[2])],
                         ids=["folded", "per_image"])
def test_fused_epilogue_per_position(ctx, rng, monkeypatch, algo, case, tuning_rules):
    """Scale and shift per output position (per-activation batch norm folded in), read at
    (k, oh, ow) of each image, folded or per image, odd P."""
    force(tuning_rules, "tiled")
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    for case in (case,):
        conv, x, w, dy, (y_ref, _, _) = make(ctx, rng, case)
        shape = y_ref.shape[1:]
        scale, shift = random(rng, shape, 0.5, 1.5), random(rng, shape)
        z = random(rng, y_ref.shape)
        y = poisoned(ctx, y_ref.shape)
        conv.forward(T(x), T(w), y, scale=T(scale), shift=T(shift), residual=T(z),
                     activation="relu", algo=algo)
        assert_close(y.numpy(), fused_expected(y_ref, 1.0, scale, shift, z, 1.0, 0.0, 0.0))


def test_fused_epilogue_nhwc(ctx, rng, monkeypatch, tuning_rules):
    """NHWC: output channels are the GEMM's columns (scale and shift per column)."""
    force(tuning_rules, "tiled")
    n, c, h, w, k, stride = CASES[2]
    conv, x, wt, dy, (y_ref, _, _) = make(ctx, rng, CASES[2])
    nhwc = lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))  # noqa: E731
    conv = dp.Convolution(ctx, dp.TensorDesc((n, h, w, c)), dp.TensorDesc((k, 1, 1, c)),
                          dp.ConvolutionDesc(0, stride), layout="NHWC")
    scale, shift = random(rng, (k,), 0.5, 1.5), random(rng, (k,))
    z, y_old = random(rng, y_ref.shape), random(rng, y_ref.shape)
    T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
    y = T(nhwc(y_old))
    conv.forward(T(nhwc(x)), T(nhwc(wt)), y, alpha=0.5, beta=-0.5, scale=T(scale),
                 shift=T(shift), residual=T(nhwc(z)), activation="relu", algo="gemm")
    expected = fused_expected(y_ref, 0.5, scale, shift, z, 1.0, -0.5, y_old)
    assert_close(y.numpy(), nhwc(expected))


def test_no_workspace_for_strided_forward(ctx, rng):
    conv, *_ = make(ctx, rng, CASES[2])
    algo = selection.algorithm("gemm")
    assert algo.workspace_size(ctx, conv.problem, "forward") == 0
    assert algo.workspace_size(ctx, conv.problem, "backward_filter") == 0
    assert algo.workspace_size(ctx, conv.problem, "backward_data") > 0   # dense, then scattered


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_per_image_variant(ctx, rng, monkeypatch, direction, tuning_rules):
    """"gemm_per_image", the unfolded per-image batched GEMM, stride 1 and 2 (it does not do
    NCHW filter gradients, and NHWC is "gemm" itself): registered, ranked after "gemm"."""
    force(tuning_rules, "tiled")
    algo = selection.algorithm("gemm_per_image")
    assert algo.per_image and isinstance(algo, Gemm1x1)
    for case in (CASES[0], CASES[2]):
        conv, x, w, dy, (y_ref, dx_ref, _) = make(ctx, rng, case)
        p = conv.problem
        names = conv.algorithms(direction)
        assert names[0] == "gemm" and "gemm_per_image" in names
        assert not algo.applies(ctx, p, "backward_filter")
        assert not algo.applies(ctx, dataclasses.replace(p, layout="NHWC"), direction)
        size = algo.workspace_size(ctx, p, direction)
        workspace = dp.Tensor.empty(ctx, (size // 4,)) if size else None
        T = lambda a: dp.Tensor.from_numpy(ctx, a)  # noqa: E731
        if direction == "forward":
            out, src, other, ref = poisoned(ctx, y_ref.shape), T(x), T(w), y_ref
        else:
            out, src, other, ref = poisoned(ctx, x.shape), T(dy), T(w), dx_ref
        algo.run(ctx, p, direction, src, other, out, EpilogueArgs(), Epilogue(), workspace)
        assert_close(out.numpy(), ref)


# ---- the fold at the GEMM level -------------------------------------------------------------

def test_fold_addresses():
    dense = Fold(6, 20)
    assert [dense.offset(j) for j in (0, 5, 6, 13)] == [0, 5, 20, 41]
    strided = Fold(6, 40, width=3, row_step=10, col_step=2)   # 2 x 3 samples of 4 x 10 rows
    assert strided.mode == 2
    assert [strided.offset(j) for j in (0, 2, 3, 5, 6)] == [0, 4, 10, 14, 40]
    assert Fold(6, 20, width=3, row_step=3, col_step=1).mode == 1   # a unit stride is dense
    assert dense.max_offset(8) == 21 and dense.max_offset(12) == 25
    assert Fold(6, 2).max_offset(8) == 5   # overlapping images: the previous one reaches further
    assert dense.vector_ok(2) and not dense.vector_ok(4) and not strided.vector_ok(2)


def test_folded_gemm_tall_positions(ctx, rng):
    """Image stride larger than the rows (a channel slice of a bigger tensor) with the rows of
    C padded: the GEMM writes only inside each image's rows."""
    n, M, K, P, rows_b, ldc = 3, 5, 4, 10, 7, 12
    a = random(rng, (M, K))
    b_store = random(rng, (n, rows_b, P))        # only the first K rows of each image are used
    c_store = np.full((n, M, ldc), np.nan, np.float32)
    A, B, C = (dp.Tensor.from_numpy(ctx, v) for v in (a, b_store, c_store))
    GemmPlan(ctx, M, n * P, K, A.buffer, 0, K, B.buffer, 0, P, C.buffer, 0, ldc,
             fold_b=Fold(P, rows_b * P), fold_c=Fold(P, M * ldc), params=TILED_VECTOR).enqueue()
    got = C.numpy()
    expected = np.einsum("mk,nkp->nmp", a.astype(np.float64), b_store[:, :K].astype(np.float64))
    assert_close(got[:, :, :P], expected)
    assert np.isnan(got[:, :, P:]).all()


def test_fold_bad_input(ctx):
    buf = cl.Buffer(ctx.cl_context, cl.mem_flags.READ_WRITE, 64 * 4)
    with pytest.raises(dp.ShapeError, match="positions must be an int >= 1"):
        Fold(0, 4)
    with pytest.raises(dp.ShapeError, match="not whole rows"):
        Fold(6, 40, width=4, row_step=10, col_step=2)
    with pytest.raises(dp.UnsupportedError, match="only along K"):
        GemmPlan(ctx, 2, 2, 4, buf, 0, 2, buf, 0, 2, buf, 0, 2, trans_a=True, fold_a=Fold(2, 8))
    with pytest.raises(dp.UnsupportedError, match="only densely"):
        GemmPlan(ctx, 2, 4, 2, buf, 0, 2, buf, 0, 4, buf, 0, 2,
                 fold_c=Fold(2, 8, width=1, row_step=2, col_step=1))
    with pytest.raises(dp.ShapeError, match="holds 64 elements .* needs 104"):
        # 4 images of 16 columns 24 elements apart, 2 rows 16 apart: 16 + 3 * 24 + 15 + 1.
        GemmPlan(ctx, 2, 64, 2, buf, 0, 2, buf, 0, 16, buf, 0, 64, fold_b=Fold(16, 24))
    with pytest.raises(dp.ShapeError, match="overlap"):
        GemmPlan(ctx, 2, 8, 2, buf, 0, 2, buf, 0, 8, buf, 0, 4, fold_c=Fold(4, 6))



@pytest.mark.parametrize("positions,vector", [(64, 2), (49, 1)], ids=["P64", "P49"])
def test_folded_vector_access(ctx, rng, positions, vector):
    """Vector loads of a folded B and vector stores of a folded C need P to be a multiple of
    the width; otherwise the same parameters fall back to scalar access."""
    n, M, K = 3, 36, 20
    a = random(rng, (M, K))
    b = random(rng, (n, K, positions))
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = poisoned(ctx, (n, M, positions))
    plan = GemmPlan(ctx, M, n * positions, K, A.buffer, 0, K, B.buffer, 0, positions,
                    C.buffer, 0, positions, fold_b=Fold(positions, K * positions),
                    fold_c=Fold(positions, M * positions), params=TILED_VECTOR)
    plan.enqueue()
    assert plan.config.global_vec == vector and plan.config.c_vec == vector
    assert_close(C.numpy(), np.einsum("mk,nkp->nmp", a.astype(np.float64), b.astype(np.float64)))


def test_long_k_split_rule():
    """On a GPU, a GEMM with far fewer output tiles than compute units and a long K is split
    (about two work-groups per unit); CPUs are left alone."""
    from dlprim_py.ops.gemm import DEFAULT_TILED, _split_long_k

    class Info:
        is_gpu, compute_units = True, 132
        name, vendor = "a GPU", "nvidia"

    params = dict(DEFAULT_TILED)   # 32 x 32 tiles
    split = _split_long_k(params, Info, 64, 64, 64 * 3136, 1)["split_k"]
    assert split == 196   # 4 tiles of 64 work-items: up to 16 groups per unit, chunks >= 1024
    assert _split_long_k(params, Info, 64, 64, 512, 1)["split_k"] == 1         # short K
    # NVIDIA's rule for 576 <= K < 4096 on small outputs (batch-1 1x1 convolutions): chunks
    # of 128 and more.
    assert _split_long_k(params, Info, 512, 49, 2048, 1)["split_k"] == 16
    assert _split_long_k(params, Info, 160, 49, 960, 1)["split_k"] == 7
    Info.vendor = "amd"
    assert _split_long_k(params, Info, 64, 64, 2048, 1)["split_k"] == 1        # short K
    Info.vendor = "nvidia"
    assert _split_long_k(params, Info, 1024, 1024, 1 << 16, 1)["split_k"] == 1  # many tiles
    # A measured split that already fills the device stands; one that leaves it idle does not.
    assert _split_long_k(dict(params, split_k=3), Info, 512, 512, 1 << 20, 1)["split_k"] == 3
    assert _split_long_k(dict(params, split_k=4), Info, 64, 64, 64 * 3136, 1)["split_k"] == 196
    assert _split_long_k(params, Info, 64, 64, 16 * 1024, 1)["split_k"] == 16
    Info.is_gpu = False
    assert _split_long_k(params, Info, 64, 64, 1 << 20, 1)["split_k"] == 1


def test_conv_order_epilogue_gemm_level(ctx, rng):
    """order="conv" on a plain (unfolded) GEMM: scale per column, bias per position (row * N +
    col), residual at C's layout with padded rows, vector stores; and its bad input."""
    M, N, K, ldc = 8, 16, 12, 20
    a, b = random(rng, (M, K)), random(rng, (K, N))
    scale, bias = random(rng, N), random(rng, (M, N))
    r_store, c_store = random(rng, (M, ldc)), random(rng, (M, ldc))
    A, B, S, Bias, R, C = (dp.Tensor.from_numpy(ctx, v)
                           for v in (a, b, scale, bias, r_store, c_store))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, ldc,
                    order="conv", alpha=2.0, beta=0.5, scale_buf=S.buffer, scale_per="n",
                    bias_buf=Bias.buffer, bias_per="position", residual_buf=R.buffer,
                    residual_alpha=-1.0, activation="relu", params=TILED_VECTOR)
    plan.enqueue()
    assert plan.config.c_vec == 2
    acc = a.astype(np.float64) @ b.astype(np.float64)
    pre = 2.0 * acc * scale + bias - r_store[:, :N]
    got = C.numpy()
    assert_close(got[:, :N], np.maximum(pre, 0) + 0.5 * c_store[:, :N])
    assert np.array_equal(got[:, N:], c_store[:, N:])
    with pytest.raises(dp.UnsupportedError, match="order='conv'"):
        GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, ldc,
                 scale_buf=S.buffer, scale_per="n")
    with pytest.raises(dp.ShapeError, match="bias_per must be"):
        GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, ldc,
                 bias_buf=Bias.buffer, bias_per="position")
    with pytest.raises(dp.ShapeError, match="scale buffer holds 16 elements"):
        GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, ldc, order="conv",
                 scale_buf=S.buffer, scale_per="position")
    with pytest.raises(dp.ShapeError, match="residual buffer holds"):
        GemmPlan(ctx, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, ldc, order="conv",
                 residual_buf=S.buffer)


def test_long_k_split_rule_is_data(ctx, tuning_rules):
    """The long-K split's numbers come from tuning_db/gemm_split.json: the shipped rules leave
    a CPU alone; a user rule for this device splits there too."""
    from dlprim_py.ops.gemm import DEFAULT_TILED, _split_long_k
    params = dict(DEFAULT_TILED)
    if not ctx.info.is_gpu:
        assert _split_long_k(params, ctx.info, 64, 64, 64 * 3136, 1) == params
    tuning_rules("gemm_split", [{"when": {"min_k": 4096}, "params": dict(
        items_per_unit=64 * ctx.info.compute_units, min_groups_per_unit=2, min_chunk=2048)}])
    # One 32 x 32 output tile: fewer tiles than compute units on any device.
    split = _split_long_k(params, ctx.info, 32, 32, 64 * 3136, 1)
    assert split["solver"] == "splitk" and 2 <= split["split_k"] <= 64 * 3136 // 2048
