"""Synthetic training throughput with hvdlite and TensorFlow 2, in the manner of Horovod's
tensorflow2_synthetic_benchmark.py: a custom training loop in a tf.function with DistributedGradientTape.

    python -m hvdlite.runner.local -np 2 -- python examples/tensorflow2_synthetic_benchmark.py --model ResNet50

--model is any keras.applications model (ResNet50, MobileNetV2, ...) or small_cnn. Prints images/second per
rank and in total (mean and 95% interval over the measured iterations).
"""

import argparse
import timeit

import numpy as np
import tensorflow as tf

import hvdlite.tensorflow as hvd


def build_model(keras, name, image_size):
    if name == "small_cnn":
        layers = keras.layers
        return keras.Sequential(
            [
                keras.Input((image_size, image_size, 3)),
                layers.Conv2D(32, 3, activation="relu"),
                layers.MaxPooling2D(),
                layers.Conv2D(64, 3, activation="relu"),
                layers.GlobalAveragePooling2D(),
                layers.Dense(1000),
            ]
        )
    return getattr(keras.applications, name)(weights=None, input_shape=(image_size, image_size, 3))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ResNet50")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--num-warmup-batches", type=int, default=2)
    parser.add_argument("--num-batches-per-iter", type=int, default=2)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per rank")
    parser.add_argument("--fp16-allreduce", action="store_true")
    args = parser.parse_args()

    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    keras.utils.set_random_seed(hvd.rank())
    model = build_model(keras, args.model, args.image_size)
    optimizer = keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)
    optimizer.build(model.trainable_variables)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    data = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    target = tf.random.uniform([args.batch_size], minval=0, maxval=1000, dtype=tf.int64)

    @tf.function
    def benchmark_step():
        with tf.GradientTape() as tape:
            logits = model(data, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

    def log(text):
        if hvd.rank() == 0:
            print(text, flush=True)

    log(
        f"model {args.model}, batch size {args.batch_size}, image size {args.image_size}, {hvd.size()} ranks, "
        f"{args.threads} thread(s) each"
    )
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"iter #{i}: {rate:.1f} img/sec per rank")
        rates.append(rate)
    mean, interval = np.mean(rates), 1.96 * np.std(rates)
    log(f"img/sec per rank: {mean:.1f} +- {interval:.1f}")
    log(f"total img/sec on {hvd.size()} rank(s): {hvd.size() * mean:.1f} +- {hvd.size() * interval:.1f}")


if __name__ == "__main__":
    main()
