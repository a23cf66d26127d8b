"""dp.models (ResNet-18, ResNet-50, MobileNetV2 as dp.nn modules) against the functional float64
PyTorch reference of dlprim_py.bench.nets, which has torchvision's structure and keys: the
state-dict keys, order, shapes and dtypes agree; a random state dict (numpy, or torch tensors)
loads with strict=True; eval logits on a 1x3x64x64 image agree; a training step's loss, batch
norm running statistics and batch counters follow torch's rules."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlprim_py as dp  # noqa: E402
from dlprim_py.bench import nets  # noqa: E402
from dlprim_py.bench.harness import error_metric  # noqa: E402

CLASSES = 10


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # The float64 reference in one thread: shared cores make OpenMP's barriers slow.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("net", nets.NETS)
def test_state_dict_matches_torchvisions_layout(ctx, net):
    model = getattr(dp.models, net)(num_classes=CLASSES, ctx=ctx)
    ours = model.state_dict()
    spec = nets.state_dict_spec(net, CLASSES)
    assert list(ours) == list(spec)
    for key, (shape, kind) in spec.items():
        assert ours[key].shape == shape, key
        assert ours[key].dtype == (np.int64 if kind == "bn_count" else np.float32), key
    names = {n for n, _ in model.named_parameters()}
    assert names == {k for k in spec if nets.trainable(k)}
    assert sum(p.size for p in model.parameters()) == sum(
        np.prod(s, dtype=int) for k, (s, _) in spec.items() if nets.trainable(k))


@pytest.mark.parametrize("net", nets.NETS)
def test_eval_logits_match_torch(ctx, net):
    state = nets.make_state_dict(net, seed=3, num_classes=CLASSES)
    model = getattr(dp.models, net)(num_classes=CLASSES, ctx=ctx)
    # Torch tensors, as torchvision_model.state_dict() gives them.
    result = model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    model.eval()
    x, _ = nets.make_inputs(1, 64, CLASSES, seed=4)
    with dp.no_grad():
        ours = model(dp.Tensor.from_numpy(ctx, x)).numpy()
    ref = nets.TorchNet(net, state, dtype="float64")
    expected = ref(ref.tensor(x)).numpy()
    assert ours.shape == (1, CLASSES)
    assert error_metric(ours, expected) < 1e-4
    # Round trip: what the model saves is what it loaded.
    saved = model.state_dict()
    for k, v in state.items():
        np.testing.assert_array_equal(saved[k], v)


def test_resnet18_training_step_matches_torch(ctx):
    state = nets.make_state_dict("resnet18", seed=5, num_classes=CLASSES)
    model = dp.models.resnet18(num_classes=CLASSES, ctx=ctx)
    model.load_state_dict(state)
    model.train()
    x, target = nets.make_inputs(2, 48, CLASSES, seed=6)
    loss = dp.nn.CrossEntropyLoss()(model(dp.Tensor.from_numpy(ctx, x)),
                                    dp.Tensor.from_numpy(ctx, target))
    loss.backward()
    ref = nets.TorchNet("resnet18", state, dtype="float64", training=True)
    ref_loss = ref.train_step(ref.tensor(x), ref.tensor(target))
    assert abs(loss.item() - ref_loss.item()) < 1e-4 * max(1.0, abs(ref_loss.item()))
    saved = model.state_dict()
    for name in ("bn1", "layer4.1.bn2"):
        np.testing.assert_allclose(saved[name + ".running_var"],
                                   ref.params[name + ".running_var"].numpy(), rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(saved[name + ".running_mean"],
                                   ref.params[name + ".running_mean"].numpy(), rtol=1e-4,
                                   atol=1e-5)
        assert saved[name + ".num_batches_tracked"] == 1
    # The classifier's gradients come after the last relu only through the pooled features.
    grads = dict(model.named_parameters())
    assert error_metric(grads["fc.weight"].grad.numpy(), ref.grad("fc.weight").numpy()) < 1e-4
    assert error_metric(grads["fc.bias"].grad.numpy(), ref.grad("fc.bias").numpy()) < 1e-4
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_pretrained_weights_are_not_downloaded():
    with pytest.raises(dp.UnsupportedError, match="load_state_dict"):
        dp.models.resnet18(weights="DEFAULT")


def test_mobilenet_dropout_follows_the_mode(ctx):
    model = dp.models.mobilenet_v2(num_classes=CLASSES, ctx=ctx)
    assert isinstance(model.classifier[0], dp.nn.Dropout) and model.classifier[0].p == 0.2
    assert model.training and model.classifier[0].training
    model.eval()
    assert not any(m.training for m in model.modules())
