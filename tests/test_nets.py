"""Whole networks through dlprim_py.functional (dlprim_py.bench.nets): ResNet-18, ResNet-50 and
MobileNetV2 with torchvision's structure and parameter names, on tiny inputs (batch 2 of 48x48
images; ResNet-50 inference: batch 1 of 32x32), against float64 PyTorch on the CPU with the same
seeded random weights and images.

Inference: the logits. Training step (BN with batch statistics, cross_entropy, backward): the
loss, the weight gradients of the first convolution and of the classifier, and the first BN's
running variance after the step; the float64 reference follows our branch at every relu / relu6
/ max pool (a near-kink activation must not route the gradient differently). Each error is
MIOpen's metric, required under 10x PyTorch float32's own error against float64 or 1e-4 (the
training checks skip PyTorch float32 and use 1e-4); ours lands near PyTorch float32's, around
1e-7 to 1e-6.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.harness import Bench, CaseSpec, Measurement, measure  # noqa: E402

@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The float64 reference in one thread: MobileNetV2's depthwise convolutions are thousands of
    small per-group calls in float64, and OpenMP's barriers make them many times slower when
    the cores are shared (the device's own threads, pytest-xdist's other workers)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# torchvision's parameter counts (sum of numel over named_parameters()).
PARAMETERS = {"resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872}
# Number of BatchNorm2d modules.
BATCH_NORMS = {"resnet18": 20, "resnet50": 53, "mobilenet_v2": 52}


@pytest.mark.parametrize("net", nets.NETS)
def test_state_dict_has_torchvisions_names_and_shapes(net):
    state = nets.make_state_dict(net, seed=0)
    params = {k: v for k, v in state.items() if nets.trainable(k)}
    assert sum(v.size for v in params.values()) == PARAMETERS[net]
    assert sum(k.endswith(".num_batches_tracked") for k in state) == BATCH_NORMS[net]
    for k, v in state.items():
        if k.endswith(".num_batches_tracked"):
            assert v.dtype == np.int64 and v.shape == ()
        else:
            assert v.dtype == np.float32 and np.isfinite(v).all(), k
            assert np.count_nonzero(v) == v.size, k
        if k.endswith(".running_var"):
            assert (v > 0).all()
    first, last = nets.FIRST_CONV[net], nets.LAST_FC[net]
    keys = list(state)
    assert keys[0] == first and keys[-2:] == [last, last[:-len("weight")] + "bias"]
    if net.startswith("resnet"):
        assert state["conv1.weight"].shape == (64, 3, 7, 7)
        assert "layer2.0.downsample.0.weight" in state
        assert "layer2.1.downsample.0.weight" not in state
        assert state["fc.weight"].shape == (1000, 512 if net == "resnet18" else 2048)
        if net == "resnet50":
            assert state["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
            assert state["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)
            assert state["layer2.0.conv2.weight"].shape == (128, 128, 3, 3)
    else:
        assert state["features.0.0.weight"].shape == (32, 3, 3, 3)
        assert state["features.1.conv.0.0.weight"].shape == (32, 1, 3, 3)    # depthwise, t=1
        assert state["features.1.conv.1.weight"].shape == (16, 32, 1, 1)
        assert state["features.2.conv.1.0.weight"].shape == (96, 1, 3, 3)
        assert state["features.2.conv.3.running_var"].shape == (24,)
        assert state["features.18.0.weight"].shape == (1280, 320, 1, 1)
        assert state["classifier.1.weight"].shape == (1000, 1280)
    # Seeded: the same seed gives the same weights, another seed others.
    again = nets.make_state_dict(net, seed=0)
    other = nets.make_state_dict(net, seed=1)
    assert all(np.array_equal(state[k], again[k]) for k in state)
    assert not np.array_equal(state[first], other[first])


@pytest.mark.parametrize("net", nets.NETS)
def test_torch_functional_net_is_torchvisions(net):
    pytest.importorskip("torchvision")
    result = nets.check_torchvision(net, nets.make_state_dict(net, seed=0), image_size=64)
    assert result["status"] == "ok", result


def _check(ctx, net, mode, batch, size, follow_kinks=None, torch32_device="cpu"):
    state = nets.make_state_dict(net, seed=0)
    x, target = nets.make_inputs(batch, size, seed=1)
    assert np.count_nonzero(x) == x.size
    ok, detail, kinks = nets.check_case(ctx, net, mode, state, x, target,
                                        torch32_device=torch32_device, follow_kinks=follow_kinks)
    summary = {k: f"{d['error']:.2e} (torch fp32 {d['torch32_error'] or 0:.2e}, tol "
                  f"{d['tolerance']:.1e})" for k, d in detail.items()}
    assert ok, summary
    return detail, kinks


# Every resnet18 / mobilenet_v2 case is at batch 2 on 48x48 images: one set of kernels (they are
# specialised on the shapes) for the whole file, which matters with empty kernel caches.
SIZE = 48


@pytest.mark.parametrize("net,batch,size", [("resnet18", 2, SIZE), ("mobilenet_v2", 2, SIZE),
                                            ("resnet50", 1, 32)])
def test_inference_matches_float64(ctx, net, batch, size):
    detail, _ = _check(ctx, net, "infer", batch, size)
    assert list(detail) == ["out"]


@pytest.mark.parametrize("net", ["resnet18", "mobilenet_v2"])
def test_training_step_matches_float64(ctx, net):
    # 48x48 images at batch 2: the last stage (2x2) BN normalizes 8 values per channel (at 32x32
    # it would be 2, and the gradients of a 2-value normalization are ill-conditioned).
    # Without PyTorch float32 (it would need the plain float64 reference too): the floor, 1e-4.
    detail, kinks = _check(ctx, net, "train", 2, SIZE, follow_kinks=True, torch32_device=None)
    bn = nets.FIRST_BN[net]
    assert set(detail) == {"loss", f"grad {nets.FIRST_CONV[net]}", f"grad {nets.LAST_FC[net]}",
                           f"{bn}.running_var after"}
    assert kinks > 0
    assert all(d["tolerance"] == 1e-4 for d in detail.values())


def test_training_step_updates_every_parameter(ctx):
    # One step on mobilenet's smallest input: every parameter has a finite gradient of its
    # shape; the step is repeatable (gradients are cleared, not accumulated).
    state = nets.make_state_dict("mobilenet_v2", seed=3)
    x_np, t_np = nets.make_inputs(2, SIZE, seed=4)
    model = nets.DpNet(ctx, "mobilenet_v2", state, training=True)
    x, t = dp.Tensor.from_numpy(ctx, x_np), dp.Tensor.from_numpy(ctx, t_np)
    loss1 = float(model.train_step(x, t).numpy())
    grads1 = {n: p.grad.numpy() for n, p in model.params.items() if nets.trainable(n)}
    assert len(grads1) == len(model.parameters()) == 158
    for n, g in grads1.items():
        assert g.shape == state[n].shape and np.isfinite(g).all(), n
    assert math.isfinite(loss1) and abs(loss1 - math.log(1000)) < 3
    loss2 = float(model.train_step(x, t).numpy())
    fc = model.grad("classifier.1.weight").numpy()
    assert abs(loss2 - loss1) < 1e-4 * abs(loss1)
    np.testing.assert_allclose(fc, grads1["classifier.1.weight"], rtol=1e-4, atol=1e-6)


def test_kink_following_reference_is_the_plain_one_away_from_kinks(ctx):
    # FollowingOps with a log of ours changes nothing but the branch at near-kink inputs: the
    # float64 inference logits agree with the plain float64 net to rounding.
    state = nets.make_state_dict("resnet18", seed=0)
    x, _ = nets.make_inputs(2, SIZE, seed=2)
    model = nets.DpNet(ctx, "resnet18", state, record_kinks=True)
    ours = nets.dp_results(model, x, None, "infer")["out"]
    kinds = [k for k, _ in model.kink_log]
    assert kinds.count("max_pool") == 1 and kinds.count("relu") == 17
    plain = nets.torch_results(nets.TorchNet("resnet18", state), x, None, "infer")["out"]
    follow = nets.torch_results(nets.TorchNet("resnet18", state, follow=model.kink_log), x, None,
                                "infer")["out"]
    assert nets.error_metric(follow, plain) < 1e-6
    assert nets.error_metric(ours, plain) < 1e-5


def test_nets_suite_of_dlprim_bench(ctx):
    # The suite lists its cases without building them, and one small case goes through the
    # harness: checked, then timed against torch on the CPU.
    from dlprim_py.bench.torch_baseline import make
    baseline, reference, _ = make(ctx)
    b = Bench(ctx, quick=True, torch=baseline,
              measurement=Measurement(warmup=0, repeat=2, min_repeat=1, budget_s=0.01))
    b.reference = reference
    b.nets = ["resnet50", "vgg16", "mobilenet_v2"]
    names = [s.name for s in nets.cases(b)]
    assert names == ["resnet50 infer n1 64x64", "resnet50 train n2 64x64",
                     "mobilenet_v2 infer n1 64x64", "mobilenet_v2 train n2 64x64"]
    row = measure(b, CaseSpec("nets", "mobilenet_v2 infer", lambda: nets.net_case(
        b, "mobilenet_v2", "infer", 2, SIZE)))
    assert row.ok, row.status
    assert row.error <= 1e-4 and row.median_ms > 0 and row.torch_median_ms > 0
    assert row.params["check"]["detail"]["out"]["error"] < 1e-5


def test_error_metric_and_tolerance():
    ref = np.array([1.0, -2.0, 4.0])
    assert nets.error_metric(ref, ref) == 0.0
    assert nets.error_metric(ref + [0, 0, 4e-6], ref) == pytest.approx(4e-6 / (math.sqrt(3) * 4))
    assert nets.error_metric(np.array([1.0, np.nan, 4.0]), ref) == math.inf
    assert nets.tolerance_for(None) == 1e-4 and nets.tolerance_for(1e-4) == pytest.approx(1e-3)
    with pytest.raises(ValueError):
        nets.forward("alexnet", None, None)


def test_dlprim_bench_runs_nets_only_when_asked():
    from dlprim_py import bench
    assert "nets" not in bench.parse_args([]).suites
    args = bench.parse_args(["--suite", "nets", "--nets", "mobilenet_v2", "--list"])
    assert args.suites == ["nets"] and args.nets == ["mobilenet_v2"]
