"""The learning task of bench/slow_links.py: generated CIFAR-like images and a small conv net whose parameters sit
mostly in two matrices (as in VGG-style classifiers), so that gradient traffic, not compute, bounds a step on a
slow link.

Each of the 10 classes is a smooth colour pattern (a few Gaussian blobs); a sample is its class's pattern shifted
by up to 4 pixels, with random contrast and strong pixel noise, so the net has to learn shift-tolerant features
and accuracy climbs over a few hundred steps instead of jumping to 100%.
"""

import numpy as np

IMAGE = 32
CLASSES = 10


def class_patterns(seed=0):
    rng = np.random.default_rng(seed)
    grid = np.mgrid[0:IMAGE, 0:IMAGE].astype(np.float32)
    patterns = np.zeros((CLASSES, 3, IMAGE, IMAGE), dtype=np.float32)
    for c in range(CLASSES):
        for _ in range(4):
            centre = rng.uniform(4, IMAGE - 4, size=2)
            width = rng.uniform(2.5, 6)
            colour = rng.normal(0, 1, size=3).astype(np.float32)
            blob = np.exp(-((grid[0] - centre[0]) ** 2 + (grid[1] - centre[1]) ** 2) / (2 * width**2))
            patterns[c] += colour[:, None, None] * blob
    return patterns


def make_split(count, seed, patterns, noise=4.0, shift=4):
    """(images float32 [count, 3, 32, 32], labels int64 [count])."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count)
    images = np.empty((count, 3, IMAGE, IMAGE), dtype=np.float32)
    for i, label in enumerate(labels):
        dy, dx = rng.integers(-shift, shift + 1, size=2)
        image = np.roll(patterns[label], (dy, dx), axis=(1, 2)) * rng.uniform(0.6, 1.4)
        images[i] = image + rng.normal(0, noise, size=image.shape).astype(np.float32)
    return images, labels.astype(np.int64)


def make_data(train=8192, test=2048, seed=0):
    patterns = class_patterns(seed)
    return make_split(train, seed + 1, patterns), make_split(test, seed + 2, patterns)


def make_model(seed=0):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 256),
        nn.ReLU(),
        nn.Linear(256, CLASSES),
    )


def make_keras_model(seed=0):
    """The same net in Keras 3 (channels last: images go in as [count, 32, 32, 3])."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((IMAGE, IMAGE, 3)),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
