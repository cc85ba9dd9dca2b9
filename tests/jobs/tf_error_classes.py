"""The status hook maps only our own failures: a user's exception in a numpy_function stays UnknownError."""

import tensorflow as tf

import hvdlite.tensorflow as hvd
from hvdlite.tensorflow import errors

hvd.init()


def fail_with(exc):
    def body(x):
        raise exc

    @tf.function
    def call():
        return tf.numpy_function(body, [tf.ones([1])], tf.float32, stateful=True)

    return call


cases = [
    (hvd.MismatchError, tf.errors.FailedPreconditionError),
    (hvd.PeerError, tf.errors.UnavailableError),
    (hvd.HvdliteTimeoutError, tf.errors.DeadlineExceededError),
    (hvd.HvdliteError, tf.errors.UnknownError),
]
for hvd_class, tf_class in cases:
    try:
        fail_with(errors.TF_ERRORS[hvd_class]("peer 1 went away"))()
    except tf_class as e:
        assert isinstance(e, hvd_class) and "peer 1 went away" in str(e), (type(e).__mro__, str(e))
        assert "Detected at node" in str(e), "TensorFlow's context must be kept"
    else:
        raise SystemExit(f"{hvd_class} not raised")
try:  # not ours, even with a message that mentions our classes
    fail_with(RuntimeError("MismatchError: hvdlite.tensorflow.errors.PeerError: x"))()
except tf.errors.UnknownError as e:
    assert not isinstance(e, hvd.HvdliteError), type(e).__mro__
assert errors.install_status_hook()  # idempotent
