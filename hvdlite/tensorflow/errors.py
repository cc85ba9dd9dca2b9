"""hvdlite's exceptions as TensorFlow sees them, eagerly and inside tf.function.

Each hvdlite error class gets a TensorFlow twin that derives from both the tf.errors class of the same meaning
and the hvdlite class, so `except tf.errors.OpError`, `except hvd.MismatchError` and
`except hvd.HorovodInternalError` all catch it.

Eagerly the bridge raises the twin itself. Inside a tf.function the bridge's Python body runs as a
numpy_function op, and TensorFlow turns any Python exception there into a status with code UNKNOWN whose message
holds "<module>.<ClassName>: <message>" on a line of its own; the runtime then raises the exception class
registered for the code alone, so the class would be lost (tf.errors.UnknownError). `install_status_hook` wraps
the context manager around every tf.function call (InterpolateRuntimeError in TensorFlow's atomic_function, the
one place every call's failure passes through, Keras 3's fit included): after TensorFlow has added the failing
node's definition site to the message, an UNKNOWN error whose message names one of the twins below is re-raised
as that twin, message and payloads kept. Any other error passes unchanged.
"""
import re

import tensorflow as tf

from hvdlite.common import errors as hvd_errors


def _tf_flavoured(hvd_class, tf_class, name=None):
    """An exception class that is both the TensorFlow error and the hvdlite one."""

    # TensorFlow's signature, so that autograph and the eager runtime can build it with their own context.
    def __init__(self, node_def=None, op=None, message=None, *args):
        if message is None and op is None and isinstance(node_def, str):  # Cls(message)
            node_def, message = None, node_def
        tf_class.__init__(self, node_def, op, message, *args)

    name = name or hvd_class.__name__
    return type(name, (tf_class, hvd_class), {"__init__": __init__, "__module__": __name__, "__qualname__": name})


TF_ERRORS = {
    hvd_errors.InvalidArgumentError: _tf_flavoured(hvd_errors.InvalidArgumentError, tf.errors.InvalidArgumentError),
    hvd_errors.NotInitializedError: _tf_flavoured(hvd_errors.NotInitializedError,
                                                  tf.errors.FailedPreconditionError),
    hvd_errors.MismatchError: _tf_flavoured(hvd_errors.MismatchError, tf.errors.FailedPreconditionError),
    hvd_errors.PeerError: _tf_flavoured(hvd_errors.PeerError, tf.errors.UnavailableError),
    hvd_errors.HvdliteTimeoutError: _tf_flavoured(hvd_errors.HvdliteTimeoutError, tf.errors.DeadlineExceededError),
    hvd_errors.InternalError: _tf_flavoured(hvd_errors.InternalError, tf.errors.InternalError),
    hvd_errors.AbortedError: _tf_flavoured(hvd_errors.AbortedError, tf.errors.AbortedError),
    hvd_errors.HvdliteError: _tf_flavoured(hvd_errors.HvdliteError, tf.errors.UnknownError),
}

XlaCompilationError = _tf_flavoured(hvd_errors.HvdliteError, tf.errors.UnimplementedError, "XlaCompilationError")

_BY_NAME = {cls.__name__: cls for cls in list(TF_ERRORS.values()) + [XlaCompilationError]}
# How TensorFlow's py_func prints the exception our bridge raised, on a line of its own.
_RAISED_TWIN = re.compile(r"^%s\.(%s): " % (re.escape(__name__), "|".join(_BY_NAME)), re.M)
_UNKNOWN = 2  # error code of tf.errors.UnknownError


def as_tf_error(error: hvd_errors.HvdliteError, hint: str = "") -> Exception:
    """The TensorFlow twin of an hvdlite error, with the same message (plus hint)."""
    for hvd_class in type(error).__mro__:
        if hvd_class in TF_ERRORS:
            return TF_ERRORS[hvd_class](f"{error}{hint}")
    return error


def twin_for_status(code: int, message: str):
    """The twin class an UNKNOWN status from a tf.function stands for, or None when it is not ours."""
    if code != _UNKNOWN:
        return None
    found = _RAISED_TWIN.findall(message)
    return _BY_NAME[found[-1]] if found else None  # the last one is what reached TensorFlow


def install_status_hook() -> bool:
    """Makes failures inside tf.function surface as hvdlite's twins (see the module doc). Idempotent; False when
    this TensorFlow lacks the hook point (errors then stay tf.errors.UnknownError, message intact)."""
    try:
        from tensorflow.python.eager.polymorphic_function.atomic_function import InterpolateRuntimeError
    except ImportError:
        return False
    original = getattr(InterpolateRuntimeError, "__exit__", None)
    if original is None:
        return False
    if getattr(original, "_hvdlite_hook", False):
        return True

    def __exit__(self, typ, exc, tb):
        suppressed = original(self, typ, exc, tb)  # TensorFlow first adds the node's definition site
        if suppressed or not isinstance(exc, tf.errors.OpError):
            return suppressed
        twin = twin_for_status(exc.error_code, exc.message)
        if twin is None:
            return False
        raise twin(exc.node_def, exc.op, exc.message, exc.experimental_payloads).with_traceback(tb) from None

    __exit__._hvdlite_hook = True
    InterpolateRuntimeError.__exit__ = __exit__
    return True
