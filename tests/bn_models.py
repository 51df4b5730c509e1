"""Model factories with buffers, imported by workers as "tests.bn_models:<factory>"."""

from __future__ import annotations

import math

from torch import nn


def bn_mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """An MLP with two BatchNorm1d layers and dropout: trained buffers decide its accuracy."""
    width = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(width, 128),
        nn.BatchNorm1d(128),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(128, 128),
        nn.BatchNorm1d(128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def bn_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A small CNN with BatchNorm2d, for images (channels, height, width)."""
    channels = input_shape[0]
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * (input_shape[1] // 2) * (input_shape[2] // 2), num_classes),
    )
