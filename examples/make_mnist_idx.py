"""Writes a small MNIST-format dataset (IDX files, optionally gzipped) so the examples run without downloads.

The images are synthetic but learnable: each class is a distinct stroke pattern plus noise, so accuracy rising
above 10% shows that training works. The file layout and format are exactly MNIST's:
  train-images-idx3-ubyte(.gz)  train-labels-idx1-ubyte(.gz)  t10k-images-idx3-ubyte(.gz)  t10k-labels-idx1-ubyte(.gz)
"""

import argparse
import gzip
import os
import struct

import numpy as np


def class_templates(rng):
    templates = np.zeros((10, 28, 28), dtype=np.float32)
    for digit in range(10):
        for _ in range(4):  # a few random strokes per class
            r0, c0, r1, c1 = rng.integers(4, 24, size=4)
            steps = 40
            rows = np.linspace(r0, r1, steps).astype(int)
            cols = np.linspace(c0, c1, steps).astype(int)
            templates[digit, rows, cols] = 1.0
            templates[digit, np.clip(rows + 1, 0, 27), cols] = 1.0
    return templates


def make_split(rng, templates, count):
    labels = rng.integers(0, 10, size=count).astype(np.uint8)
    images = templates[labels] * rng.uniform(0.6, 1.0, size=(count, 1, 1))
    images += rng.normal(0, 0.15, size=images.shape)
    shift = rng.integers(-2, 3, size=(count, 2))
    for i in range(count):
        images[i] = np.roll(images[i], tuple(shift[i]), axis=(0, 1))
    return (np.clip(images, 0, 1) * 255).astype(np.uint8), labels


def write_idx(path, array, compress):
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(">" + "I" * array.ndim, *array.shape)
    opener = gzip.open if compress else open
    with opener(path + (".gz" if compress else ""), "wb") as f:
        f.write(header)
        f.write(array.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="data/mnist")
    parser.add_argument("--train", type=int, default=6000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-gzip", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    templates = class_templates(rng)
    for prefix, count in (("train", args.train), ("t10k", args.test)):
        images, labels = make_split(rng, templates, count)
        write_idx(os.path.join(args.out, f"{prefix}-images-idx3-ubyte"), images, not args.no_gzip)
        write_idx(os.path.join(args.out, f"{prefix}-labels-idx1-ubyte"), labels, not args.no_gzip)
    print(f"wrote {args.train} training and {args.test} test images to {args.out}")


if __name__ == "__main__":
    main()
