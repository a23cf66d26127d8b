"""torchvision classifiers with seeded random weights, exported to ONNX by torch's TorchScript
exporter (opsets 13 and 17) and its dynamo exporter, loaded with dp.onnx and compared with
onnxruntime at batch 1 and 2 (one planned shape each, then a replay of the first).

The models are the families' smallest torchvision variants (reduced widths where torchvision
takes them) on small images, to keep PoCL's time modest."""
import numpy as np
import pytest

import dlprim_py as dp

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
torchvision = pytest.importorskip("torchvision")

from onnx_util import assert_matches, export, ort_run  # noqa: E402


def _densenet():
    return torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16,
                                       bn_size=2, num_classes=10)


def _efficientnet():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    settings, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return EfficientNet(settings, 0.2, num_classes=10, last_channel=last)


def _regnet():
    from torchvision.models.regnet import BlockParams, RegNet
    params = BlockParams.from_init_params(depth=3, w_0=16, w_a=8.0, w_m=2.0, group_width=8,
                                          se_ratio=0.25)
    return RegNet(params, num_classes=10)


def _vgg():
    """torchvision's VGG with a narrow feature stack (its make_layers) and a small classifier:
    the plain family without VGG's 100 M-parameter head."""
    import torch
    from torchvision.models.vgg import VGG, make_layers
    model = VGG(make_layers([8, "M", 16, "M", 32, 32, "M"]), num_classes=10, init_weights=False)
    model.avgpool = torch.nn.AdaptiveAvgPool2d((2, 2))
    model.classifier = torch.nn.Sequential(
        torch.nn.Linear(32 * 2 * 2, 64), torch.nn.ReLU(True), torch.nn.Dropout(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(True), torch.nn.Dropout(), torch.nn.Linear(64, 10))
    return model


MODELS = {
    # name: (constructor, image size)
    "vgg": (_vgg, 32),
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), 32),
    "mobilenet_v2": (lambda: torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.25), 32),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10,
                                                                         width_mult=0.25), 32),
    "densenet": (_densenet, 32),
    "googlenet": (lambda: torchvision.models.googlenet(num_classes=10, aux_logits=False,
                                                       init_weights=False), 32),
    "squeezenet1_1": (lambda: torchvision.models.squeezenet1_1(num_classes=10), 48),
    "shufflenet_v2_x0_5": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), 32),
    "efficientnet": (_efficientnet, 32),
    "regnet": (_regnet, 32),
}

# The dynamo exporter takes 5-30 s per model on a small machine: one model goes through it.
CASES = [
    ("vgg", "ts13"),
    ("resnet18", "ts13"),
    ("mobilenet_v2", "ts13"),
    ("mobilenet_v3_small", "ts13"), ("mobilenet_v3_small", "ts17"),
    ("densenet", "ts13"),
    ("googlenet", "ts17"),
    ("squeezenet1_1", "ts13"), ("squeezenet1_1", "dynamo"),
    ("shufflenet_v2_x0_5", "ts13"),
    ("efficientnet", "ts17"),
    ("regnet", "ts13"),
]


@pytest.mark.parametrize("name,exporter", CASES, ids=[f"{n}-{e}" for n, e in CASES])
def test_model_matches_onnxruntime(ctx, name, exporter):
    make, size = MODELS[name]
    data = export(name, make, size, exporter)
    model = dp.onnx.load(data, ctx)
    assert model.input_names == ["x"]
    rng = np.random.default_rng(1)
    x2 = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    x1 = x2[:1].copy()
    ref2 = ort_run(data, {"x": x2})
    ref1 = ort_run(data, {"x": x1})
    (out_name,) = model.output_names
    assert_matches(model.run({"x": x2})[out_name], ref2[out_name], what=f"{name} batch 2")
    assert model.memory_bytes > 0
    assert_matches(model.run({"x": x1})[out_name], ref1[out_name], what=f"{name} batch 1")
    # The batch-2 plan again, on other data: a replay.
    x3 = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    assert_matches(model.run({"x": x3})[out_name], ort_run(data, {"x": x3})[out_name],
                   what=f"{name} batch 2 replayed")
    assert_matches(model.run({"x": x3[1:]})[out_name], ort_run(data, {"x": x3[1:]})[out_name],
                   what=f"{name} batch 1 replayed")
