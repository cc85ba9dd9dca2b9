"""A TensorFlow eager collective blocked on a late peer yields to a signal handler, and the runtime goes on."""

import signal
import time

import tensorflow as tf

import hvdlite.tensorflow as hvd

hvd.init()


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm()


signal.signal(signal.SIGALRM, on_alarm)
if hvd.rank() == 1:
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    start = time.monotonic()
    try:
        hvd.allreduce(tf.ones(4), name="late", op=hvd.Sum)
    except Alarm:  # the handler's own exception comes through TensorFlow's eager numpy_function
        assert time.monotonic() - start < 1.0
    else:
        raise AssertionError("the alarm never interrupted the allreduce")
else:
    time.sleep(3)
    assert hvd.allreduce(tf.ones(4), name="late", op=hvd.Sum).numpy().tolist() == [2.0] * 4
for step in range(5):
    assert hvd.allreduce(tf.ones(2) * step, name="after", op=hvd.Sum).numpy().tolist() == [2.0 * step] * 2
hvd.shutdown()
