"""The implicit GEMM's tiles forced on their own against PyTorch CPU in float64, every direction:
the kk-16 tiles the GPU rule picks, the thin tile, the named fixed-tile variants; float4 weight
loads with aligned and unaligned weight offsets and kk tails; the GPU tile rule."""
from types import SimpleNamespace

import numpy as np
import pyopencl as cl
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import algorithms, selection
from dlprim_py.ops.conv.problem import make_problem
from conftest import assert_close, poisoned, random


def references(x, w, dy, pad, stride):
    X, W, DY = (torch.from_numpy(a).double() for a in (x, w, dy))
    return {"forward": F.conv2d(X, W, padding=pad, stride=stride).numpy(),
            "backward_data": torch.nn.grad.conv2d_input(x.shape, W, DY, padding=pad,
                                                         stride=stride).numpy(),
            "backward_filter": torch.nn.grad.conv2d_weight(X, w.shape, DY, padding=pad,
                                                           stride=stride).numpy()}


def at_offset(ctx, rng, a, pad):
    flat = np.concatenate([random(rng, (pad,)), a.ravel()])
    return dp.Tensor(ctx, dp.Tensor.from_numpy(ctx, flat).buffer, a.shape, offset=pad * 4)


def run_all(ctx, algo, problem, x, w, dy, refs, rng, w_pad=0, directions=None):
    X, DY = dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, dy)
    W = at_offset(ctx, rng, w, w_pad) if w_pad else dp.Tensor.from_numpy(ctx, w)
    operands = {"forward": (X, W), "backward_data": (DY, W), "backward_filter": (DY, X)}
    for direction in directions or operands:
        src, other = operands[direction]
        out = poisoned(ctx, refs[direction].shape)
        size = algo.workspace_size(ctx, problem, direction)
        workspace = dp.Tensor.empty(ctx, (max(size // 4, 1),))
        algo.run(ctx, problem, direction, src, other, out, algorithms.EpilogueArgs(),
                 workspace=workspace)
        try:
            assert_close(out.numpy(), refs[direction])
        except AssertionError as e:
            raise AssertionError(f"{algo.name} {algo.tile} {direction}: {e}") from None


# (n, c, h, k, r, stride, pad), tiles, directions: GK = 45 and 147 (kk tails of the float4
# weight runs), stride 2, R and S as constants (3x3) and at run time (7x7).
CASES = [((2, 5, 11, 37, 3, 2, 1), ("TILE_WIDE_K16", "TILE_MEDIUM_K16", "TILE_THIN_K16"), None),
         ((1, 3, 15, 9, 7, 2, 3), ("TILE_MEDIUM_K16",), ["forward"])]


@pytest.mark.parametrize("case,tiles,directions", CASES)
def test_tiles(ctx, rng, case, tiles, directions):
    n, c, h, k, r, stride, pad = case
    x, w = random(rng, (n, c, h, h)), random(rng, (k, c, r, r))
    ho = (h + 2 * pad - r) // stride + 1
    dy = random(rng, (n, k, ho, ho))
    refs = references(x, w, dy, pad, stride)
    problem = make_problem(x.shape, w.shape, dp.ConvolutionDesc(pad, stride))
    for tile in (getattr(algorithms, name) for name in tiles):
        if tile.threads > ctx.info.max_work_group_size or tile.local_bytes > ctx.info.local_mem_size:
            continue
        algo = algorithms.ImplicitGemm(tile)
        run_all(ctx, algo, problem, x, w, dy, refs, rng, directions=directions)
        # A weight offset of 1 element: rows no longer 4-aligned, the scalar weight loads.
        run_all(ctx, algo, problem, x, w, dy, refs, rng, w_pad=1, directions=["forward"])


def test_named_variants(ctx, rng):
    """The fixed-tile variants find mode times: forward only, GPUs only, right on any device."""
    x, w = random(rng, (2, 8, 9, 9)), random(rng, (20, 8, 3, 3))
    dy = random(rng, (2, 20, 5, 5))
    refs = references(x, w, dy, 1, 2)
    problem = make_problem(x.shape, w.shape, dp.ConvolutionDesc(1, 2))
    for name in ("implicit_gemm_64x128x16", "implicit_gemm_64x64x16"):
        algo = selection.algorithm(name)
        assert algo.directions == ("forward",)
        assert algo.applies(ctx, problem, "forward") == ctx.info.is_gpu
        assert not algo.applies(ctx, problem, "backward_data")
        run_all(ctx, algo, problem, x, w, dy, refs, rng, w_pad=4, directions=["forward"])


def test_gpu_tile_rule():
    """3x3 and larger forward on a GPU: kk-16 tiles, 64x128 while three waves of them fill the
    device, else 64x64; thin GEMMs keep the small tile; 1x1 keeps its rule."""
    gpu = SimpleNamespace(info=SimpleNamespace(name="a GPU", vendor="nvidia", is_gpu=True,
                                               compute_units=132, max_work_group_size=1024),
                          memo={}, plans=dp.context.PlanCache())
    rule = algorithms.ImplicitGemm()
    desc = dp.ConvolutionDesc(1, 2)
    l2 = make_problem((64, 128, 56, 56), (128, 128, 3, 3), desc)
    l4 = make_problem((64, 512, 14, 14), (512, 512, 3, 3), desc)
    stem = make_problem((64, 3, 224, 224), (32, 3, 3, 3), desc)
    one = make_problem((64, 256, 14, 14), (1024, 256, 1, 1), dp.ConvolutionDesc(0, 1))
    assert rule.choose_tile(gpu, l2, "forward") == algorithms.TILE_WIDE_K16
    assert rule.choose_tile(gpu, l4, "forward") == algorithms.TILE_MEDIUM_K16
    assert rule.choose_tile(gpu, stem, "forward") == algorithms.TILE_SMALL
    assert rule.choose_tile(gpu, one, "forward") == algorithms.TILE_LARGE
    assert rule.choose_tile(gpu, l2, "backward_filter") == algorithms.TILE_LARGE


def test_immediate_choices_on_a_gpu():
    """The measured preferences: F(4x4) first for wide 3x3 stride 1 (backward filter from 128
    channels, F(2x2) below), im2col_gemm for wide stride-2 forward and every data gradient it
    takes, direct_small for a 3x3 RGB stem."""
    gpu = SimpleNamespace(info=SimpleNamespace(name="a GPU", vendor="nvidia", is_gpu=True,
                                               compute_units=132, max_work_group_size=1024,
                                               max_alloc_size=2 ** 36, local_mem_size=49152),
                          memo={}, plans=dp.context.PlanCache())
    s1 = make_problem((64, 128, 28, 28), (128, 128, 3, 3), dp.ConvolutionDesc(1, 1))
    s2 = make_problem((64, 128, 56, 56), (128, 128, 3, 3), dp.ConvolutionDesc(1, 2))
    stem = make_problem((64, 3, 224, 224), (32, 3, 3, 3), dp.ConvolutionDesc(1, 2))
    conv1 = make_problem((64, 3, 224, 224), (64, 3, 7, 7), dp.ConvolutionDesc(3, 2))
    assert selection.immediate(gpu, s1, "forward") == "winograd_f4x4"
    assert selection.immediate(gpu, s1, "backward_data") == "winograd_f4x4"
    assert selection.immediate(gpu, s1, "backward_filter") == "winograd_f4x4"
    l1 = make_problem((64, 64, 56, 56), (64, 64, 3, 3), dp.ConvolutionDesc(1, 1))
    assert selection.immediate(gpu, l1, "backward_filter") == "winograd"
    assert selection.immediate(gpu, s2, "forward") == "im2col_gemm"
    assert selection.immediate(gpu, s2, "backward_data") == "im2col_gemm"
    assert selection.immediate(gpu, conv1, "forward") == "im2col_gemm"
    assert selection.immediate(gpu, conv1, "backward_data") == "im2col_gemm"
    assert selection.immediate(gpu, stem, "forward") == "direct_small"
    assert selection.immediate(gpu, stem, "backward_data") == "im2col_gemm"


@pytest.mark.parametrize("name", ["TILE_MEDIUM_K16", "TILE_THIN_K16", "TILE_SMALL"])
def test_tile_local_memory(ctx, name, monkeypatch):
    """local_bytes is the kernel's own local memory, and a tile larger than the device's local
    memory does not apply (it once failed at launch with OUT_OF_RESOURCES on 32 KiB devices)."""
    tile = getattr(algorithms, name)
    if tile.threads > ctx.info.max_work_group_size or tile.local_bytes > ctx.info.local_mem_size:
        pytest.skip("tile too large for this device")
    problem = make_problem((1, 3, 9, 9), (8, 3, 3, 3), dp.ConvolutionDesc(1, 1))
    algo = algorithms.ImplicitGemm(tile)
    built = algo.prepare(ctx, problem, "forward")[0]
    kernel = built.kernel("conv_igemm_forward")
    used = kernel.get_work_group_info(cl.kernel_work_group_info.LOCAL_MEM_SIZE, ctx.device)
    # Drivers may add a few bytes of their own (NVIDIA's reports 16 more). Mesa's rusticl on
    # llvmpipe reports twice the declared arrays (34816 bytes for this tile's 17408, more than
    # its 32 KiB) yet runs the kernel: only the lower bound holds there.
    assert tile.local_bytes <= used
    if ctx.info.platform_name != "rusticl":
        assert used <= tile.local_bytes + 64
    assert algo.applies(ctx, problem, "forward")
    monkeypatch.setattr(ctx.info, "local_mem_size", tile.local_bytes - 1)
    assert not algo.applies(ctx, problem, "forward")


def test_nvidia_rule_for_small_1x1_filter_gradients():
    """On NVIDIA GPUs the implicit GEMM comes first for the 1x1 filter gradients where it was
    measured faster (small C*K up to 28x28, C <= 320 at 7x7); the column GEMM keeps ResNet-50's
    1x1 layers and the wide 7x7 projections, and other vendors keep the shipped default."""
    def gpu(vendor):
        return SimpleNamespace(info=SimpleNamespace(name=f"a {vendor} GPU", vendor=vendor,
                                                    is_gpu=True, compute_units=132,
                                                    max_work_group_size=1024,
                                                    max_alloc_size=2 ** 36, local_mem_size=49152),
                               memo={}, plans=dp.context.PlanCache())
    one = dp.ConvolutionDesc(0, 1)
    cases = {((64, 192, 14, 14), (64, 192, 1, 1)): "implicit_gemm",
             ((64, 32, 28, 28), (192, 32, 1, 1)): "implicit_gemm",
             ((64, 160, 7, 7), (960, 160, 1, 1)): "implicit_gemm",
             ((64, 1024, 14, 14), (256, 1024, 1, 1)): "gemm",
             ((64, 128, 28, 28), (512, 128, 1, 1)): "gemm",
             ((64, 960, 7, 7), (160, 960, 1, 1)): "gemm",
             ((64, 64, 56, 56), (64, 64, 1, 1)): "gemm"}
    for (xs, ws), expected in cases.items():
        p = make_problem(xs, ws, one)
        assert selection.immediate(gpu("nvidia"), p, "backward_filter") == expected, (xs, ws)
        assert selection.immediate(gpu("amd"), p, "backward_filter") == "gemm", (xs, ws)
        assert selection.immediate(gpu("nvidia"), p, "forward") == "gemm", (xs, ws)


def test_tile_rule_from_a_user_database(ctx, rng, tuning_rules):
    """The implicit GEMM's tile comes from tuning_db/conv_implicit_gemm.json: a device rule in
    the user's database replaces it, and the convolution with that tile is still right."""
    from dlprim_py.ops.conv.problem import ConvolutionDesc
    desc = ConvolutionDesc(1, 1)
    xs, ws = (2, 6, 9, 9), (8, 6, 3, 3)
    problem = make_problem(xs, ws, desc)
    rule = algorithms.ImplicitGemm()
    assert rule.choose_tile(ctx, problem, "forward") == (
        algorithms.TILE_MEDIUM_K16 if ctx.info.is_gpu else algorithms.TILE_SMALL)
    tuning_rules("conv_implicit_gemm", [{"when": {"direction": "forward"}, "params": dict(
        tile_m=64, tile_n=64, tile_k=16, thread_m=4, thread_n=4)}])
    assert rule.choose_tile(ctx, problem, "forward") == algorithms.TILE_MEDIUM_K16
    if not ctx.info.is_gpu:   # the user's rule names forward only: the shipped ones serve the rest
        assert rule.choose_tile(ctx, problem, "backward_data") == algorithms.TILE_SMALL
    x, w = random(rng, xs), random(rng, ws)
    conv = dp.Convolution(ctx, dp.TensorDesc(xs), dp.TensorDesc(ws), desc)
    y = poisoned(ctx, problem.y_shape)
    conv.forward(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, w), y,
                 algo="implicit_gemm")
    ref = F.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    assert_close(y.numpy(), ref)
