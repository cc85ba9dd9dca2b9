"""Data-parallel MNIST training with Keras 3 and hvdlite (the Horovod lines are marked "hvdlite:").

    python examples/make_mnist_idx.py --out data/mnist          # or use the real MNIST files
    python -m hvdlite.runner.local -np 2 -- python examples/keras_mnist.py --data-dir data/mnist

Reads the standard IDX files (gzipped or not), gives each rank its own shard of the training set (a tf.data
pipeline reshuffled every epoch), scales the learning rate by the number of ranks with a warmup, averages
metrics over ranks, and lets rank 0 alone print progress and write the checkpoint (a plain Keras file that
loads without hvdlite, or with hvd.load_model to resume distributed training).
"""

import argparse
import math
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_idx  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402


def load_split(root, train):
    images, labels = mnist_idx.load_split(root, train)
    return images[..., None], labels


def shard(images, labels, rank, size):
    """Rank r takes every size-th example starting at r, padded so that every rank has as many batches."""
    per_rank = math.ceil(len(labels) / size)
    order = np.arange(per_rank * size) % len(labels)
    mine = order[rank::size]
    return images[mine], labels[mine]


def build_model(keras):
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(16, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(10),
        ]
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate for one rank (scaled by size)")
    parser.add_argument("--warmup-epochs", type=float, default=1)
    parser.add_argument("--steps-per-execution", type=int, default=4)
    parser.add_argument("--checkpoint", default="checkpoints/keras_mnist.keras")
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    hvd.init()  # hvdlite: 1. start
    tf.config.threading.set_intra_op_parallelism_threads(1)  # hvdlite: 2. one core per rank
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.utils.set_random_seed(args.seed + hvd.rank())  # different initial weights: the broadcast fixes them

    x_train, y_train = shard(*load_split(args.data_dir, train=True), hvd.rank(), hvd.size())
    x_test, y_test = shard(*load_split(args.data_dir, train=False), hvd.rank(), hvd.size())
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(y_train), seed=args.seed, reshuffle_each_iteration=True)
        .batch(args.batch_size, drop_remainder=True)
        .prefetch(2)
    )
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(256)

    model = build_model(keras)
    scaled_lr = args.lr * hvd.size()
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.SGD(scaled_lr, momentum=0.9),  # hvdlite: 3.
        compression=compression,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=args.steps_per_execution,
    )
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # hvdlite: 4. same start everywhere
        hvd.callbacks.MetricAverageCallback(),  # averaged logs before anything reads them
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs, verbose=1 if hvd.rank() == 0 else 0
        ),
    ]
    model.fit(
        train, epochs=args.epochs, validation_data=test, callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0
    )

    loss, accuracy = model.evaluate(test, verbose=0)
    accuracy = float(hvd.allreduce(accuracy, name="metric.test_accuracy"))
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.2%} (averaged over {hvd.size()} ranks)", flush=True)
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        model.save(args.checkpoint)
        print(f"checkpoint written to {args.checkpoint}")


if __name__ == "__main__":
    main()
