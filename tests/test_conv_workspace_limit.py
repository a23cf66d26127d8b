"""The convolution workspace limit (DLPRIM_WORKSPACE_LIMIT): an algorithm whose workspace for
the whole batch would pass it runs on equal parts of the batch that fit, forward (with a
residual) and backward data, each workspace algorithm forced on its own, against PyTorch CPU
in float64; the filter gradient is not split; the limit's default rule and bad values."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dlprim_py as dp
from dlprim_py.ops.conv import algorithms, selection
from dlprim_py.ops.conv.api import Convolution
from dlprim_py.ops.conv.problem import ConvolutionDesc, make_problem
from dlprim_py.tensor import TensorDesc
from conftest import assert_close, poisoned, random

WORKSPACE_ALGOS = ("im2col_gemm", "winograd", "winograd_f4x4")


def _limit(monkeypatch, mib):
    monkeypatch.setenv("DLPRIM_WORKSPACE_LIMIT", str(mib))
    dp.config.reload()


@pytest.mark.parametrize("algo", WORKSPACE_ALGOS)
@pytest.mark.parametrize("images_per_run", [1, 2])
def test_forward_and_backward_data_run_in_parts(ctx, rng, monkeypatch, algo, images_per_run):
    n, c, h, w, k = 5, 6, 9, 11, 7
    x, wt = random(rng, (n, c, h, w)), random(rng, (k, c, 3, 3))
    res, dy = random(rng, (n, k, h, w)), random(rng, (n, k, h, w))
    conv = Convolution(ctx, TensorDesc(x.shape), TensorDesc(wt.shape),
                       ConvolutionDesc(padding=(1, 1)), prebuild=False)
    problem = conv.problem
    a = selection.algorithm(algo)
    whole = a.workspace_size(ctx, problem, "forward")
    one = a.workspace_size(ctx, make_problem((1, c, h, w), wt.shape, conv.conv_desc), "forward")
    # A limit between the need of `images_per_run` images and one more.
    per_image = (whole - one) / (n - 1)
    _limit(monkeypatch, (one + (images_per_run - 0.5) * per_image) / 2 ** 20)
    used = conv.workspace_size(algo, "forward")
    assert used < whole
    assert conv._resolve(algo, "forward")[3] == images_per_run
    X, W = torch.from_numpy(x).double(), torch.from_numpy(wt).double()
    ref = F.conv2d(X, W, padding=1).numpy() + res
    y = poisoned(ctx, ref.shape)
    conv.forward(dp.Tensor.from_numpy(ctx, x), dp.Tensor.from_numpy(ctx, wt), y, algo=algo,
                 residual=dp.Tensor.from_numpy(ctx, res))
    assert_close(y.numpy(), ref, 1e-4)
    if "backward_data" in a.directions:
        dx = poisoned(ctx, x.shape)
        conv.backward_data(dp.Tensor.from_numpy(ctx, dy), dp.Tensor.from_numpy(ctx, wt), dx,
                           algo=algo)
        ref_dx = torch.nn.grad.conv2d_input(x.shape, W, torch.from_numpy(dy).double(),
                                            padding=1).numpy()
        assert_close(dx.numpy(), ref_dx, 1e-4)


def test_filter_gradient_is_not_split(ctx, rng, monkeypatch):
    _limit(monkeypatch, 0.001)
    problem = make_problem((4, 3, 8, 8), (5, 3, 3, 3), ConvolutionDesc(padding=(1, 1)))
    a = selection.algorithm("winograd")
    assert algorithms.batch_chunk(ctx, a, problem, "backward_filter") == (
        4, a.workspace_size(ctx, problem, "backward_filter"))


def test_default_limit_is_256_mib_or_the_output():
    small = make_problem((2, 3, 8, 8), (5, 3, 3, 3), ConvolutionDesc(padding=(1, 1)))
    assert algorithms.workspace_limit(small, "forward") == 256 << 20
    big = make_problem((64, 64, 224, 224), (64, 64, 3, 3), ConvolutionDesc(padding=(1, 1)))
    assert algorithms.workspace_limit(big, "forward") == 64 * 64 * 224 * 224 * 4
    huge = make_problem((512, 64, 224, 224), (64, 64, 3, 3), ConvolutionDesc(padding=(1, 1)))
    assert algorithms.workspace_limit(huge, "forward") == algorithms.WORKSPACE_CAP


def test_a_batch_too_large_for_one_workspace_is_split(ctx):
    """A VGG-16 layer at batch 64: Winograd's whole-batch workspace (3.7 GB) is past the 2 GiB
    a workspace can be; it applies and runs within the limit, in parts."""
    problem = make_problem((64, 64, 224, 224), (64, 64, 3, 3), ConvolutionDesc(padding=(1, 1)))
    a = selection.algorithm("winograd_f4x4")
    assert a.workspace_size(ctx, problem, "forward") > algorithms.WORKSPACE_CAP
    assert a.applies(ctx, problem, "forward")
    chunk, need = algorithms.batch_chunk(ctx, a, problem, "forward")
    assert need <= algorithms.workspace_limit(problem, "forward") and 1 < chunk < 64


@pytest.mark.parametrize("value", ["0", "-3", "lots"])
def test_bad_limit_is_refused(monkeypatch, value):
    monkeypatch.setenv("DLPRIM_WORKSPACE_LIMIT", value)
    with pytest.raises(dp.errors.ShapeError, match="DLPRIM_WORKSPACE_LIMIT"):
        dp.config.reload()
        dp.config.workspace_limit()
