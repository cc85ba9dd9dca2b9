"""TF1 graph mode: a MonitoredTrainingSession with BroadcastGlobalVariablesHook, a v1 optimizer through
DistributedOptimizer, independent collectives evaluated together, and broadcast_global_variables."""

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()  # before hvdlite is imported: a TF1 graph job
import hvdlite.tensorflow as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(R), 1.0]))
x = tf.compat.v1.placeholder(tf.float32, [])  # fed to train only: the hook's broadcast must run without it
train = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5)).minimize(tf.reduce_sum(w * x))
total = hvd.allreduce(tf.constant([float(R)]), op=hvd.Sum)
# Independent collectives evaluated together; TensorFlow may start them in any order on each rank.
together = []
for i, dtype in enumerate((tf.int32, tf.float16, tf.float64) * 7):
    together.append(
        hvd.allreduce(tf.constant([R + i], dtype), op=hvd.Sum)
        if i % 3
        else hvd.allgather(tf.fill([R + 1], tf.cast(i, dtype)))
    )
from_rank_1 = hvd.broadcast_global_variables(1)
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)], config=config) as sess:
    assert np.array_equal(sess.run(w), [0.0, 1.0])  # rank 0's initial value everywhere
    sess.run(train, feed_dict={x: R + 1.0})
    mean_grad = np.mean([r + 1.0 for r in range(N)])
    assert np.allclose(sess.run(w), [0.0 - 0.5 * mean_grad, 1.0 - 0.5 * mean_grad]), sess.run(w)
    assert sess.run(total)[0] == sum(range(N))
    for i, got in enumerate(sess.run(together)):
        expected = [sum(r + i for r in range(N))] if i % 3 else [i] * sum(r + 1 for r in range(N))
        assert np.array_equal(got, expected), (i, got, expected)
    sess.run(from_rank_1)
