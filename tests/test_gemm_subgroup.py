"""GEMM's "subgroup" kernel (Intel subgroups) on Intel's OpenCL CPU runtime, against numpy
float64 with NaN-poisoned outputs.

The runtime comes from pip (intel-opencl-rt, with intel-cmplr-lib-rt; both in the ``test``
extra). Its ICD file names a placeholder path, and the ICD loader reads OCL_ICD_VENDORS and
the dynamic linker LD_LIBRARY_PATH only when a process starts, so ``test_on_intel_runtime``
runs this file again in a subprocess whose environment registers the runtime: a temporary
vendors directory holding an .icd with the library's absolute path (plus copies of
/etc/OpenCL/vendors/*), the runtime's library directories on LD_LIBRARY_PATH, and
DLPRIM_DEVICE naming Intel's platform. The rest of the suite keeps its device (PoCL, or the
GPU of DLPRIM_DEVICE): registering Intel's platform in this process would put it ahead of PoCL
in the platform list. The tests marked ``on_intel`` run in the subprocess only (conftest.py
deselects them elsewhere), and ``test_on_intel_runtime`` fails when any of them failed there.
"""
import glob
import os
import shutil
import subprocess
import sys
import types
from importlib import metadata

import numpy as np
import pytest
import torch

import dlprim_py as dp
from dlprim_py import tune, tuning
from dlprim_py.ops import gemm as gemm_ops
from dlprim_py.ops.gemm import Fold, GemmPlan

from conftest import assert_close, poisoned, random

INNER = "DLPRIM_TEST_INTEL_SUBGROUP"
INTEL_PLATFORM = "Intel(R) OpenCL"
INSTALL = ("Intel's OpenCL CPU runtime is not installed: pip install intel-opencl-rt "
           "intel-cmplr-lib-rt (both in dlprim_py's `test` extra)")

# Tests that run in test_on_intel_runtime's subprocess; elsewhere conftest.py deselects them.
on_intel = pytest.mark.on_intel

# Both subgroup sizes; several subgroups per work-group and several column groups per lane,
# and one subgroup of 8 rows (its aligned operands take the block-read path).
SG16 = {"kernel": "subgroup", "sg_size": 16, "wpt_m": 4, "wpt_n": 2, "sg_groups": 2}
SG8 = {"kernel": "subgroup", "sg_size": 8, "wpt_m": 8, "wpt_n": 1, "sg_groups": 1}


def intel_runtime():
    """(absolute path of libintelocl.so, library directories it needs), or None when the
    pip packages are not installed."""
    def files(package):
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            return None
        return [dist.locate_file(f).resolve() for f in dist.files or ()]

    runtime = files("intel-opencl-rt")
    if not runtime:
        return None
    library = [f for f in runtime if f.name == "libintelocl.so"] or \
        [f for f in runtime if f.name.startswith("libintelocl.so.")]
    if not library or not library[0].is_file():
        return None
    dirs = [library[0].parent]
    for package in ("tbb", "intel-cmplr-lib-rt", "tcmlib"):
        for f in files(package) or ():
            if f.suffix == ".so" and f.parent not in dirs:
                dirs.append(f.parent)
    return library[0], [str(d) for d in dirs]


# ---- in this process: the launcher, the selection rules and the refusal ----------------------

def test_on_intel_runtime(tmp_path):
    found = intel_runtime()
    if found is None:
        pytest.skip(INSTALL)
    library, dirs = found
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    for icd in glob.glob("/etc/OpenCL/vendors/*.icd"):
        shutil.copy(icd, vendors)
    (vendors / "dlprim-intel-cpu.icd").write_text(f"{library}\n")
    env = dict(os.environ, OCL_ICD_VENDORS=str(vendors), DLPRIM_DEVICE=INTEL_PLATFORM,
               **{INNER: "1"})
    env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [p for p in
                                                     env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    # The same dlprim_py as this process's, installed or not.
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(dp.__file__))] +
                                        [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for name in ("DLPRIM_GEMM_ALGO", "PYTEST_ADDOPTS"):   # options meant for this process
        env.pop(name, None)
    # This process's own tests are left out there: every test run there must pass.
    done = subprocess.run([sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q",
                           "-p", "no:cacheprovider", "-p", "no:xdist", "-rfEs", "-m", "on_intel"],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the tests on Intel's runtime failed:\n{output[-6000:]}"
    # Every test of this file but the ones of this process ran and passed there.
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "deselected" in summary, output[-3000:]


def fake_device(extensions):
    """The DeviceInfo fields that rule lookup and parameter checks read."""
    return types.SimpleNamespace(name="an Intel device", vendor="intel", platform_name="x",
                                 extensions=frozenset(extensions), max_work_group_size=256,
                                 local_mem_size=65536, is_gpu=True, compute_units=32)


def test_intel_rules_pick_subgroup_only_with_the_extensions():
    usable = lambda info: lambda p: gemm_ops.params_problem(p, info) is None  # noqa: E731
    feats = gemm_ops.features(512, 512, 512)
    with_sg = fake_device(gemm_ops.SUBGROUP_EXTENSIONS)
    params, where = tuning.lookup(with_sg, "gemm", feats, usable(with_sg))
    assert (params["solver"], where) == ("subgroup", "vendor")
    without = fake_device(["cl_khr_subgroups"])
    params, _ = tuning.lookup(without, "gemm", feats, usable(without))
    assert params["solver"] == "tiled"
    # Tiny problems keep the one-item-per-element kernel.
    params, _ = tuning.lookup(with_sg, "gemm", gemm_ops.features(8, 8, 8), usable(with_sg))
    assert params["solver"] == "small"
    # The condition on its own, and its format check.
    rules = [{"when": {"extensions": ["cl_x"], "min_k": 4}, "params": {"id": 1}},
             {"when": {}, "params": {"id": 2}}]
    assert tuning.choose(rules, feats, extensions={"cl_x"}) == {"id": 1}
    assert tuning.choose(rules, feats) == {"id": 2}
    assert tuning.choose(rules, gemm_ops.features(1, 1, 1), extensions={"cl_x"}) == {"id": 2}
    with pytest.raises(dp.DlprimError, match="list of extension names"):
        tuning.choose([{"when": {"extensions": "cl_x"}, "params": {}}], feats)


def test_other_vendors_never_get_subgroup_rules():
    for vendor, entry in tuning.read_db(tuning.shipped_path("gemm"), "gemm")["vendors"].items():
        kinds = {rule["params"]["solver"] for rule in entry["rules"]}
        assert ("subgroup" in kinds) == (vendor == "intel"), vendor
        for rule in entry["rules"]:
            if rule["params"]["solver"] == "subgroup":
                assert set(rule["when"]["extensions"]) >= set(gemm_ops.SUBGROUP_EXTENSIONS)


def test_tuner_offers_subgroup_candidates_only_with_the_extensions():
    kinds = lambda info: {p["solver"] for p in tune.gemm_candidates(info)}  # noqa: E731
    assert "subgroup" in kinds(fake_device(gemm_ops.SUBGROUP_EXTENSIONS))
    assert "subgroup" not in kinds(fake_device(()))


def test_subgroup_refused_without_the_extensions(ctx):
    if all(e in ctx.info.extensions for e in gemm_ops.SUBGROUP_EXTENSIONS):
        pytest.skip("this device has Intel subgroups")
    A, B, C = (dp.Tensor.from_numpy(ctx, np.ones((4, 4), np.float32)) for _ in range(3))
    with pytest.raises(dp.UnsupportedError, match="cl_intel_subgroups.*does not report"):
        GemmPlan(ctx, 4, 4, 4, A.buffer, 0, 4, B.buffer, 0, 4, C.buffer, 0, 4, params=SG16)
    with pytest.raises(dp.UnsupportedError, match="cl_intel_subgroups"):
        dp.gemm(A, B, algorithm="subgroup")


# ---- on Intel's runtime -----------------------------------------------------------------------

def reference(a, b, trans_a, trans_b, alpha=1.0):
    a64 = np.swapaxes(a, -1, -2) if trans_a else a
    b64 = np.swapaxes(b, -1, -2) if trans_b else b
    return alpha * (a64.astype(np.float64) @ b64.astype(np.float64))


def run(ctx, params, a, b, M, N, K, trans_a=False, trans_b=False, c=None, **kwargs):
    """One forced kernel on fresh device copies, C poisoned unless given; the result and plan."""
    A, B = dp.Tensor.from_numpy(ctx, a), dp.Tensor.from_numpy(ctx, b)
    C = dp.Tensor.from_numpy(ctx, c) if c is not None else poisoned(ctx, (M, N))
    plan = GemmPlan(ctx, M, N, K, A.buffer, 0, a.shape[-1], B.buffer, 0, b.shape[-1],
                    C.buffer, 0, N, trans_a=trans_a, trans_b=trans_b, params=params, **kwargs)
    plan.enqueue()
    assert plan.algorithm == "subgroup"
    return C.numpy(), plan


def operands(rng, M, N, K, trans_a, trans_b):
    return (random(rng, (K, M) if trans_a else (M, K)),
            random(rng, (N, K) if trans_b else (K, N)))


@pytest.fixture
def intel(ctx):
    assert all(e in ctx.info.extensions for e in gemm_ops.SUBGROUP_EXTENSIONS), \
        f"{ctx.info.name} on {ctx.info.platform_name} lacks Intel subgroups"
    return ctx


@on_intel
@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 31, 15), (9, 33, 17), (8, 32, 16),
                                   (300, 3, 40), (3, 200, 33), (37, 45, 1), (20, 70, 100)])
def test_shapes(intel, rng, M, N, K):
    # SG16's block is 8 rows (2 subgroups of 4) by 32 columns, K steps of 16.
    a, b = operands(rng, M, N, K, False, False)
    out, _ = run(intel, SG16, a, b, M, N, K)
    assert_close(out, reference(a, b, False, False))


@on_intel
@pytest.mark.parametrize("params", [SG16, SG8], ids=["sg16", "sg8"])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_transposes(intel, rng, params, trans_a, trans_b):
    # SG8 on aligned sizes: its interior blocks read the untransposed operands with block reads.
    M, N, K = (37, 45, 29) if params is SG16 else (64, 40, 48)
    a, b = operands(rng, M, N, K, trans_a, trans_b)
    out, plan = run(intel, params, a, b, M, N, K, bool(trans_a), bool(trans_b))
    assert_close(out, reference(a, b, trans_a, trans_b))
    if params is SG8:
        assert (plan.config.block_a, plan.config.block_b) == (1 - trans_a, 1 - trans_b)


@on_intel
@pytest.mark.parametrize("shift", [3, 4])
def test_offsets_and_leading_dimensions(intel, rng, shift):
    """Operands inside larger buffers at offsets with padded rows: unaligned (plain loads) and
    aligned to 4 (block reads)."""
    M, N, K = 24, 40, 32
    lda, ldb, ldc = K + shift, N + shift, N + 2 * shift
    a_store, b_store = random(rng, shift + M * lda), random(rng, shift + K * ldb)
    a = a_store[shift:].reshape(M, lda)[:, :K]
    b = b_store[shift:].reshape(K, ldb)[:, :N]
    A, B = dp.Tensor.from_numpy(intel, a_store), dp.Tensor.from_numpy(intel, b_store)
    C = poisoned(intel, (shift + M * ldc,))
    plan = GemmPlan(intel, M, N, K, A.buffer, shift, lda, B.buffer, shift, ldb, C.buffer, shift,
                    ldc, params=SG8)
    plan.enqueue()
    assert plan.config.block_a == plan.config.block_b == int(shift == 4)
    out = C.numpy()
    assert_close(out[shift:].reshape(M, ldc)[:, :N], reference(a, b, False, False))
    # Nothing outside C's rows was written.
    assert np.isnan(out[:shift]).all() and np.isnan(out[shift:].reshape(M, ldc)[:, N:]).all()


@on_intel
def test_batched(intel, rng):
    """Batch strides, with B shared across the batch (stride 0)."""
    batch, M, N, K = 3, 13, 35, 21
    a, b = random(rng, (batch, M, K)), random(rng, (K, N))
    A, B = dp.Tensor.from_numpy(intel, a), dp.Tensor.from_numpy(intel, b)
    C = poisoned(intel, (batch, M, N))
    GemmPlan(intel, M, N, K, A.buffer, 0, K, B.buffer, 0, N, C.buffer, 0, N, batch=batch,
             stride_a=M * K, stride_b=0, stride_c=M * N, params=SG16).enqueue()
    assert_close(C.numpy(), reference(a, b, False, False))


@on_intel
def test_alpha_beta(intel, rng):
    M, N, K = 19, 37, 23
    a, b = operands(rng, M, N, K, False, False)
    c = random(rng, (M, N))
    out, _ = run(intel, SG16, a, b, M, N, K, c=c, alpha=0.5, beta=-1.5)
    assert_close(out, reference(a, b, False, False, 0.5) - 1.5 * c.astype(np.float64))
    # beta == 0 never reads C (poisoned with NaN).
    out, _ = run(intel, SG16, a, b, M, N, K, alpha=2.0, beta=0.0)
    assert_close(out, reference(a, b, False, False, 2.0))


@on_intel
@pytest.mark.parametrize("bias_per,activation", [("n", "relu"), ("m", "gelu")])
def test_bias_activation(intel, rng, bias_per, activation):
    M, N, K = 21, 34, 18
    a, b = operands(rng, M, N, K, False, True)
    bias = random(rng, (N if bias_per == "n" else M,))
    bias_t = dp.Tensor.from_numpy(intel, bias)
    out, _ = run(intel, SG16, a, b, M, N, K, trans_b=True, bias_buf=bias_t.buffer,
                 bias_per=bias_per, activation=activation)
    ref = reference(a, b, False, True) + (bias[None, :] if bias_per == "n" else bias[:, None])
    ref = np.maximum(ref, 0) if activation == "relu" else \
        torch.nn.functional.gelu(torch.from_numpy(ref)).numpy()
    assert_close(out, ref)


def bn_params(rng, shape):
    return (random(rng, shape), random(rng, shape, 0.5, 1.5), random(rng, shape),
            random(rng, shape))  # scale, variance, mean, shift


@on_intel
@pytest.mark.parametrize("per_position", [False, True])
def test_conv_order_chain_residual_folded(intel, rng, per_position):
    """The 1x1 convolution's GEMM: y (K x n*P) = w (K x C) @ x (C x n*P) with x and y folded
    NCHW batches, then act(bias -> batch norm chain + residual) + beta * y."""
    n, c, k, P = 3, 10, 12, 25
    M, N, K = k, n * P, c
    w, x = random(rng, (k, c)), random(rng, (n, c, P))
    r, y0 = random(rng, (n, k, P)), random(rng, (n, k, P))
    link = (k, P) if per_position else (k,)
    b0 = random(rng, link)
    scale, var, mean, shift = bn_params(rng, link)
    tensors = [dp.Tensor.from_numpy(intel, t) for t in (b0, mean, var, scale, shift)]
    chain_args = [tensors[0].buffer, np.int32(0)]
    for t in tensors[1:]:   # chain_params order: mean, variance, scale, bias, epsilon
        chain_args += [t.buffer, np.int32(0)]
    chain_args.append(np.float32(1e-3))
    W, X, R = (dp.Tensor.from_numpy(intel, t) for t in (w, x, r))
    Y = dp.Tensor.from_numpy(intel, y0)
    fold = Fold(P, k * P)
    GemmPlan(intel, M, N, K, W.buffer, 0, c, X.buffer, 0, P, Y.buffer, 0, P,
             fold_b=Fold(P, c * P), fold_c=fold, order="conv", residual_buf=R.buffer,
             residual_alpha=0.5, beta=0.25, activation="relu",
             chain=(("bias", per_position), ("bn", per_position)), chain_args=chain_args,
             params=SG16).enqueue()
    acc = np.einsum("kc,ncp->nkp", w.astype(np.float64), x.astype(np.float64))
    expand = (lambda v: v[None]) if per_position else (lambda v: v[None, :, None])
    z = acc + expand(b0)
    z = (z - expand(mean)) * expand(scale) / np.sqrt(expand(var) + 1e-3) + expand(shift)
    ref = np.maximum(z + 0.5 * r, 0) + 0.25 * y0
    assert_close(Y.numpy(), ref)


@on_intel
def test_folded_along_k(intel, rng):
    """A 1x1 convolution's filter gradient: dw (k x c) = dy (k x n*P) @ x^T (n*P x c), both
    operands folded along K (A untransposed, B transposed)."""
    n, c, k, P = 3, 11, 9, 14
    dy, x = random(rng, (n, k, P)), random(rng, (n, c, P))
    DY, X = dp.Tensor.from_numpy(intel, dy), dp.Tensor.from_numpy(intel, x)
    DW = poisoned(intel, (k, c))
    GemmPlan(intel, k, c, n * P, DY.buffer, 0, P, X.buffer, 0, P, DW.buffer, 0, c,
             trans_b=True, fold_a=Fold(P, k * P), fold_b=Fold(P, c * P), params=SG16).enqueue()
    assert_close(DW.numpy(), np.einsum("nkp,ncp->kc", dy.astype(np.float64), x.astype(np.float64)))


@on_intel
def test_strided_fold_through_convolution(intel, rng, monkeypatch):
    """A stride-2 1x1 convolution with a bias and ReLU, routed to the subgroup kernel by
    DLPRIM_GEMM_ALGO (x sampled in place: B folded with a stride)."""
    monkeypatch.setenv("DLPRIM_GEMM_ALGO", "subgroup")
    dp.config.reload()
    n, c, h, w_, k = 2, 6, 7, 7, 9
    conv = dp.Convolution(intel, dp.TensorDesc((n, c, h, w_)), dp.TensorDesc((k, c, 1, 1)),
                          dp.ConvolutionDesc(stride=(2, 2)))
    x, w, bias = random(rng, (n, c, h, w_)), random(rng, (k, c, 1, 1)), random(rng, (k,))
    y = poisoned(intel, (n, k, 4, 4))
    conv.forward(dp.Tensor.from_numpy(intel, x), dp.Tensor.from_numpy(intel, w), y,
                 bias=dp.Tensor.from_numpy(intel, bias), activation="relu", algo="gemm")
    ref = torch.relu(torch.nn.functional.conv2d(torch.from_numpy(x).double(),
                                                torch.from_numpy(w).double(),
                                                torch.from_numpy(bias).double(), stride=2))
    assert_close(y.numpy(), ref.numpy())


@on_intel
def test_rule_chooses_subgroup(intel, rng):
    params = gemm_ops.select_params(intel, 256, 256, 256)
    assert params["solver"] == "subgroup"
    a, b = operands(rng, 70, 90, 50, False, False)
    out = dp.gemm(dp.Tensor.from_numpy(intel, a), dp.Tensor.from_numpy(intel, b))
    assert_close(out.numpy(), reference(a, b, False, False))


@on_intel
def test_tuner_times_subgroup_candidates(intel, monkeypatch, tmp_path):
    """The tuner on a small budget (two candidates): subgroup candidates are checked against
    the reference, timed, and can win; a wrong candidate is rejected (here a tiled one given a
    broken tile)."""
    candidates = [SG16, SG8]
    monkeypatch.setattr(tune, "gemm_candidates", lambda info, space="quick": list(candidates))
    rules, report = tune.tune_gemm(intel, [(64, 48, 40)], budget=60.0, log=lambda s: None)
    timed = [e for e in report if "ms" in e]
    assert {e["params"]["sg_size"] for e in timed} == {8, 16}
    assert all(e["verify_error"] <= tune.TOLERANCE for e in timed)
    assert rules and rules[0]["params"]["solver"] == "subgroup"
    assert rules[0]["shape"] == {"m": 64, "n": 48, "k": 40}


@on_intel
def test_refusals(intel):
    A, B, C = (dp.Tensor.from_numpy(intel, np.ones((4, 4), np.float32)) for _ in range(3))
    cases = [(dict(SG16, split_k=2), "does not split K"),
             (dict(SG16, sg_size=12), "sg_size must be 8 or 16"),
             (dict(SG16, wpt_m=0), "wpt_m of the subgroup kernel"),
             ({"kernel": "subgroup", "sg_size": 16}, "lack")]
    for params, message in cases:
        with pytest.raises(dp.UnsupportedError, match=message):
            GemmPlan(intel, 4, 4, 4, A.buffer, 0, 4, B.buffer, 0, 4, C.buffer, 0, 4,
                     params=params)
