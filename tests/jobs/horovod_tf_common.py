"""What the jobs of tests/test_horovod_api_tensorflow.py share: one TensorFlow thread, hvdlite joined, checks of
values, errors and warnings, and a recorder of the collectives each bridge call runs. Importing it joins the job."""

import warnings

import numpy as np
import tensorflow as tf

# One thread each, set before anything starts TensorFlow's runtime.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import hvdlite.tensorflow as hvd  # noqa: E402
from hvdlite.tensorflow import bridge as bridge_module  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
assert hvd.gpu_available("tensorflow") is False  # its GPU tensors pass through host memory


def close(what, got, expected, atol=1e-6):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert got.shape == expected.shape and np.allclose(got, expected, atol=atol), f"{what}: {got} != {expected}"


def raises(exc, fn, *text):
    try:
        fn()
    except exc as e:
        for t in text:
            assert t in str(e), f"{exc.__name__} without {t!r}: {e}"
        return e
    raise SystemExit(f"no {exc.__name__} from {fn}")


def warns(category, fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    assert any(issubclass(w.category, category) for w in caught), [str(w.message) for w in caught]
    return out


class Recorder:
    """Records the collectives of every bridge call (name, input shape), to see how gradients are grouped."""

    def __enter__(self):
        self.calls, self.original = [], bridge_module.call

        def recording_call(collectives, inputs, *args, **kwargs):
            self.calls.append([(c.name, tuple(i.shape.as_list())) for c, i in zip(collectives, inputs)])
            return self.original(collectives, inputs, *args, **kwargs)

        bridge_module.call = recording_call
        return self

    def __exit__(self, *exc):
        bridge_module.call = self.original
