"""The distinct convolution layers of ResNet-50, VGG-16 and MobileNetV2 (224x224 input), as data.

A layer is (in_channels, out_channels, kernel, stride, padding, groups, input_size) with square
kernels and images; ``count`` says how many times it occurs in the network, so that a weighted
sum of per-layer times approximates the network's convolution time. Shapes at batch N are
``(N, in_channels, input_size, input_size)``.
"""
from collections import OrderedDict


class ConvLayer:
    def __init__(self, net, in_channels, out_channels, kernel, stride, padding, groups, size,
                 count=1):
        self.net = net
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel = kernel
        self.stride = stride
        self.padding = padding
        self.groups = groups
        self.size = size
        self.count = count

    @property
    def key(self):
        return (self.in_channels, self.out_channels, self.kernel, self.stride, self.padding,
                self.groups, self.size)

    @property
    def output_size(self):
        return (self.size + 2 * self.padding - self.kernel) // self.stride + 1

    def input_shape(self, batch):
        return (batch, self.in_channels, self.size, self.size)

    def weight_shape(self):
        return (self.out_channels, self.in_channels // self.groups, self.kernel, self.kernel)

    def output_shape(self, batch):
        return (batch, self.out_channels, self.output_size, self.output_size)

    def flops(self, batch):
        """Multiply-adds x 2 of the forward pass (the same for either backward pass)."""
        out = self.output_size
        return (2.0 * batch * self.out_channels * out * out * (self.in_channels // self.groups)
                * self.kernel * self.kernel)

    @property
    def name(self):
        g = f" g{self.groups}" if self.groups > 1 else ""
        s = f" s{self.stride}" if self.stride > 1 else ""
        return (f"{self.in_channels}->{self.out_channels} {self.kernel}x{self.kernel}{s}{g} "
                f"@{self.size}")

    def __repr__(self):
        return f"ConvLayer({self.net}: {self.name} x{self.count})"


def _distinct(net, layers):
    found = OrderedDict()
    for (c, k, r, s, p, g, size) in layers:
        key = (c, k, r, s, p, g, size)
        if key in found:
            found[key].count += 1
        else:
            found[key] = ConvLayer(net, c, k, r, s, p, g, size)
    return list(found.values())


def resnet50():
    """torchvision's ResNet-50 (v1.5: the stride sits on the 3x3 convolution)."""
    layers = [(3, 64, 7, 2, 3, 1, 224)]
    size, in_c = 56, 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        out_c = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            layers.append((in_c, width, 1, 1, 0, 1, size))
            layers.append((width, width, 3, s, 1, 1, size))
            out_size = size // s
            layers.append((width, out_c, 1, 1, 0, 1, out_size))
            if b == 0:
                layers.append((in_c, out_c, 1, s, 0, 1, size))
            in_c, size = out_c, out_size
    return _distinct("resnet50", layers)


def vgg16():
    layers = []
    size, in_c = 224, 3
    for out_c, convs in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(convs):
            layers.append((in_c, out_c, 3, 1, 1, 1, size))
            in_c = out_c
        size //= 2
    return _distinct("vgg16", layers)


def mobilenet_v2():
    """torchvision's MobileNetV2 (width 1.0): expand 1x1, depthwise 3x3, project 1x1."""
    layers = [(3, 32, 3, 2, 1, 1, 224)]
    size, in_c = 112, 32
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = in_c * t
            if t != 1:
                layers.append((in_c, hidden, 1, 1, 0, 1, size))
            layers.append((hidden, hidden, 3, stride, 1, hidden, size))
            size = (size + 2 - 3) // stride + 1
            layers.append((hidden, c, 1, 1, 0, 1, size))
            in_c = c
    layers.append((in_c, 1280, 1, 1, 0, 1, size))
    return _distinct("mobilenet_v2", layers)


NETS = {"resnet50": resnet50, "vgg16": vgg16, "mobilenet_v2": mobilenet_v2}

# A few cheap, representative layers per net for --quick (a 2-core CPU must finish in minutes):
# ResNet-50's last 1x1 reduction, MobileNetV2's depthwise and pointwise pair, and the smallest
# VGG-16 layer, forward only (its backward passes alone would take a minute there).
QUICK = {
    "resnet50": [(2048, 512, 1, 1, 0, 1, 7)],
    "vgg16": [(512, 512, 3, 1, 1, 1, 14)],
    "mobilenet_v2": [(576, 576, 3, 1, 1, 576, 14), (576, 96, 1, 1, 0, 1, 14)],
}
QUICK_DIRECTIONS = {"vgg16": ("fwd",)}


def layers_of(net, quick=False):
    """The distinct conv layers of ``net`` ("resnet50", "vgg16", "mobilenet_v2")."""
    layers = NETS[net]()
    if quick:
        wanted = QUICK[net]
        layers = [l for l in layers if l.key in wanted]
    return layers
