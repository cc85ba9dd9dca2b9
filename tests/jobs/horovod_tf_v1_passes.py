"""Horovod's own case for backward_passes_per_step with tf.compat.v1 optimizers: a TF1 graph in a session.
The accumulators are local variables, initialised by MonitoredTrainingSession."""

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()  # before hvdlite is imported: a TF1 graph job
import hvdlite.tensorflow as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
mean_r1 = np.mean([r + 1.0 for r in range(N)])
w = tf.compat.v1.get_variable("w", initializer=tf.constant([0.0, 0.0]))
scale = tf.compat.v1.placeholder(tf.float32, [])
step = tf.compat.v1.train.get_or_create_global_step()
opt = hvd.DistributedOptimizer(
    tf.compat.v1.train.GradientDescentOptimizer(1.0), backward_passes_per_step=3, average_aggregated_gradients=True
)
train = opt.minimize(tf.reduce_sum(w * (R + 1.0) * scale), global_step=step)
with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)]) as sess:
    seen = []
    for p in range(6):
        sess.run(train, feed_dict={scale: p + 1.0})
        seen.append(sess.run(w)[0])
    first, second = (1 + 2 + 3) / 3.0 * mean_r1, (4 + 5 + 6) / 3.0 * mean_r1
    expected = [0.0, 0.0, -first, -first, -first, -first - second]
    assert np.allclose(seen, expected, atol=1e-5), (seen, expected)
    assert sess.run(step) == 6, sess.run(step)
