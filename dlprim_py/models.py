"""torchvision's ResNet-18, ResNet-50 and MobileNetV2 as ``dp.nn`` modules.

The structure, the attribute names and therefore the ``state_dict`` keys, shapes and order are
torchvision's (``conv1.weight``, ``layer1.0.downsample.0.weight``, ``features.0.0.weight``,
``classifier.1.weight``, ...), so ``model.load_state_dict(torchvision_model.state_dict())``
loads as is and computes the same function, and ``model.state_dict()`` loads into torchvision.

    import dlprim_py as dp
    model = dp.models.resnet18().eval()
    model.load_state_dict(torchvision.models.resnet18(weights="DEFAULT").state_dict())
    logits = model(dp.Tensor.from_numpy(images))

Initialisation follows torchvision's schemes (convolutions kaiming_normal_ with mode="fan_out",
batch norm weight 1 and bias 0, MobileNetV2's classifier N(0, 0.01)) with this library's
generator (``dp.manual_seed``); pretrained weights are not downloaded here (``weights`` must be
None: load them from torchvision's state dict). The ReLUs are not in place (torchvision's are):
an in-place activation cannot take part in autograd here, and it saves no memory either.
"""
from . import functional as F
from .errors import UnsupportedError
from .nn import (AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Dropout, Linear, MaxPool2d, Module,
                 ReLU, ReLU6, Sequential, init)
from .nn.module import module_context

__all__ = ["ResNet", "BasicBlock", "Bottleneck", "resnet18", "resnet50", "MobileNetV2",
           "InvertedResidual", "Conv2dNormActivation", "mobilenet_v2"]


def _no_weights(weights):
    if weights is not None:
        raise UnsupportedError("pretrained weights are not downloaded by dlprim_py; build the "
                               "model with weights=None and load_state_dict() torchvision's "
                               "state dict")


def _conv3x3(in_planes, out_planes, stride=1, groups=1, dilation=1, ctx=None):
    return Conv2d(in_planes, out_planes, 3, stride=stride, padding=dilation, groups=groups,
                  bias=False, dilation=dilation, ctx=ctx)


def _conv1x1(in_planes, out_planes, stride=1, ctx=None):
    return Conv2d(in_planes, out_planes, 1, stride=stride, bias=False, ctx=ctx)


class BasicBlock(Module):
    """torchvision.models.resnet.BasicBlock: two 3x3 convolutions and an identity (or
    ``downsample``) shortcut; expansion 1."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, *, ctx=None):
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride, ctx=ctx)
        self.bn1 = BatchNorm2d(planes, ctx=ctx)
        self.relu = ReLU()
        self.conv2 = _conv3x3(planes, planes, ctx=ctx)
        self.bn2 = BatchNorm2d(planes, ctx=ctx)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(Module):
    """torchvision.models.resnet.Bottleneck (ResNet v1.5: the stride on the 3x3 convolution);
    expansion 4."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, *, ctx=None):
        super().__init__()
        width = planes
        self.conv1 = _conv1x1(inplanes, width, ctx=ctx)
        self.bn1 = BatchNorm2d(width, ctx=ctx)
        self.conv2 = _conv3x3(width, width, stride, ctx=ctx)
        self.bn2 = BatchNorm2d(width, ctx=ctx)
        self.conv3 = _conv1x1(width, planes * self.expansion, ctx=ctx)
        self.bn3 = BatchNorm2d(planes * self.expansion, ctx=ctx)
        self.relu = ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(Module):
    """torchvision.models.ResNet(block, layers, num_classes, zero_init_residual)."""

    def __init__(self, block, layers, num_classes=1000, zero_init_residual=False, *, ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        self.inplanes = 64
        self.conv1 = Conv2d(3, 64, 7, stride=2, padding=3, bias=False, ctx=ctx)
        self.bn1 = BatchNorm2d(64, ctx=ctx)
        self.relu = ReLU()
        self.maxpool = MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0], 1, ctx)
        self.layer2 = self._make_layer(block, 128, layers[1], 2, ctx)
        self.layer3 = self._make_layer(block, 256, layers[2], 2, ctx)
        self.layer4 = self._make_layer(block, 512, layers[3], 2, ctx)
        self.avgpool = AdaptiveAvgPool2d((1, 1))
        self.fc = Linear(512 * block.expansion, num_classes, ctx=ctx)
        for m in self.modules():
            if isinstance(m, Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # BatchNorm2d starts at weight 1, bias 0 already (torchvision sets the same).
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    init.zeros_(m.bn2.weight)

    def _make_layer(self, block, planes, blocks, stride, ctx):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = Sequential(_conv1x1(self.inplanes, planes * block.expansion, stride, ctx),
                                    BatchNorm2d(planes * block.expansion, ctx=ctx))
        layers = [block(self.inplanes, planes, stride, downsample, ctx=ctx)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes, ctx=ctx))
        return Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(*, weights=None, num_classes=1000, zero_init_residual=False, ctx=None):
    """ResNet-18 (torchvision.models.resnet18's structure and keys)."""
    _no_weights(weights)
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, zero_init_residual, ctx=ctx)


def resnet50(*, weights=None, num_classes=1000, zero_init_residual=False, ctx=None):
    """ResNet-50 (torchvision.models.resnet50's structure and keys)."""
    _no_weights(weights)
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, zero_init_residual, ctx=ctx)


def _make_divisible(v, divisor, min_value=None):
    """torchvision's channel rounding: to a multiple of ``divisor``, never below 90% of ``v``."""
    if min_value is None:
        min_value = divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class Conv2dNormActivation(Sequential):
    """torchvision.ops.Conv2dNormActivation with batch norm: children "0" the convolution
    (padding (k - 1) // 2, no bias), "1" BatchNorm2d, "2" the activation (ReLU6 by default
    here, as MobileNetV2 uses it)."""

    def __init__(self, in_channels, out_channels, kernel_size=3, stride=1, groups=1,
                 activation_layer=ReLU6, *, ctx=None):
        super().__init__(Conv2d(in_channels, out_channels, kernel_size, stride,
                                (kernel_size - 1) // 2, groups=groups, bias=False, ctx=ctx),
                         BatchNorm2d(out_channels, ctx=ctx), activation_layer())
        self.out_channels = out_channels


class InvertedResidual(Module):
    """torchvision.models.mobilenetv2.InvertedResidual: 1x1 expansion (when expand_ratio != 1),
    3x3 depthwise, 1x1 linear projection with batch norm, in ``self.conv``; a residual sum
    where the stride is 1 and the channels stay."""

    def __init__(self, inp, oup, stride, expand_ratio, *, ctx=None):
        super().__init__()
        if stride not in (1, 2):
            raise UnsupportedError(f"InvertedResidual: stride should be 1 or 2, got {stride}")
        self.stride = stride
        hidden_dim = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = []
        if expand_ratio != 1:
            layers.append(Conv2dNormActivation(inp, hidden_dim, kernel_size=1, ctx=ctx))
        layers += [Conv2dNormActivation(hidden_dim, hidden_dim, stride=stride, groups=hidden_dim,
                                        ctx=ctx),
                   Conv2d(hidden_dim, oup, 1, 1, 0, bias=False, ctx=ctx),
                   BatchNorm2d(oup, ctx=ctx)]
        self.conv = Sequential(*layers)
        self.out_channels = oup

    def forward(self, x):
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


# (expand ratio t, output channels c, repeats n, first stride s): torchvision's settings.
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(Module):
    """torchvision.models.MobileNetV2(num_classes, width_mult, round_nearest, dropout):
    ``features`` (Conv2dNormActivation, 17 InvertedResiduals, 1x1 Conv2dNormActivation to
    ``last_channel``), global average pool, ``classifier`` (Dropout, Linear)."""

    def __init__(self, num_classes=1000, width_mult=1.0, round_nearest=8, dropout=0.2, *,
                 ctx=None):
        super().__init__()
        ctx = module_context(ctx)
        input_channel = _make_divisible(32 * width_mult, round_nearest)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult), round_nearest)
        features = [Conv2dNormActivation(3, input_channel, stride=2, ctx=ctx)]
        for t, c, n, s in MOBILENET_V2_SETTINGS:
            output_channel = _make_divisible(c * width_mult, round_nearest)
            for i in range(n):
                features.append(InvertedResidual(input_channel, output_channel,
                                                 s if i == 0 else 1, t, ctx=ctx))
                input_channel = output_channel
        features.append(Conv2dNormActivation(input_channel, self.last_channel, kernel_size=1,
                                             ctx=ctx))
        self.features = Sequential(*features)
        self.classifier = Sequential(Dropout(p=dropout), Linear(self.last_channel, num_classes,
                                                                ctx=ctx))
        for m in self.modules():
            if isinstance(m, Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    init.zeros_(m.bias)
            elif isinstance(m, Linear):
                init.normal_(m.weight, 0, 0.01)
                init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = F.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.classifier(x)


def mobilenet_v2(*, weights=None, num_classes=1000, width_mult=1.0, dropout=0.2, ctx=None):
    """MobileNetV2 (torchvision.models.mobilenet_v2's structure and keys)."""
    _no_weights(weights)
    return MobileNetV2(num_classes, width_mult, dropout=dropout, ctx=ctx)
