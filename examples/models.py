"""Reference models defined here because torchvision has no CPU wheel on our package mirror.

resnet50() follows torchvision's ResNet-50 v1.5 layer for layer (bottleneck stride on the 3x3 conv): 25,557,032
parameters with 1000 classes, the same as torchvision.models.resnet50().
"""

import torch.nn as nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels, width, stride=1, downsample=None):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers, num_classes=1000):
        super().__init__()
        self.in_channels = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._stage(64, layers[0], 1)
        self.layer2 = self._stage(128, layers[1], 2)
        self.layer3 = self._stage(256, layers[2], 2)
        self.layer4 = self._stage(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _stage(self, width, blocks, stride):
        downsample = None
        if stride != 1 or self.in_channels != width * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.in_channels, width * Bottleneck.expansion, 1, stride=stride, bias=False),
                nn.BatchNorm2d(width * Bottleneck.expansion),
            )
        layers = [Bottleneck(self.in_channels, width, stride, downsample)]
        self.in_channels = width * Bottleneck.expansion
        layers += [Bottleneck(self.in_channels, width) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet50(num_classes=1000):
    return ResNet([3, 4, 6, 3], num_classes)


def resnet18_like(num_classes=1000):
    """A lighter bottleneck ResNet (one block per stage) for quick runs and tests."""
    return ResNet([1, 1, 1, 1], num_classes)


MODELS = {"resnet50": resnet50, "resnet_small": resnet18_like}
