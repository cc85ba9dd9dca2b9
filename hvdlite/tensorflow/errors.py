"""hvdlite's exceptions as TensorFlow sees them, eagerly and inside tf.function.

Each hvdlite error class gets a TensorFlow twin that derives from both the tf.errors class of the same meaning
and the hvdlite class, so `except tf.errors.OpError`, `except hvd.MismatchError` and
`except hvd.HorovodInternalError` all catch it.

Eagerly the bridge raises the twin itself. In a graph the bridge's Python body runs as a numpy_function op,
and TensorFlow turns a Python exception there into a status whose code depends only on the Python base class
(INVALID_ARGUMENT for a ValueError, UNKNOWN for most others) and whose message holds
"<module>.<ClassName>: <message>" on a line of its own; the runtime then raises the exception class registered
for the code, so the class would be lost (e.g. tf.errors.UnknownError for a mismatch). `install_status_hook`
wraps the two places every graph failure passes through, after TensorFlow has added the failing node's
definition site to the message: the context manager around every tf.function call (InterpolateRuntimeError in
TensorFlow's atomic_function, Keras 3's fit included) and tf.compat.v1 Session's `_do_call` (Session.run,
MonitoredSession, hooks). An error with the code TensorFlow gives our exception whose message names one of the
twins below is re-raised as that twin, message and payloads kept. Any other error passes unchanged.
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
    hvd_errors.NotInitializedError: _tf_flavoured(hvd_errors.NotInitializedError, tf.errors.FailedPreconditionError),
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


def _py_func_code(cls) -> int:
    """The status code TensorFlow's py_func gives a Python exception of this class (by its base classes)."""
    if issubclass(cls, (ValueError, TypeError)):
        return tf.errors.INVALID_ARGUMENT
    if issubclass(cls, StopIteration):
        return tf.errors.OUT_OF_RANGE
    if issubclass(cls, MemoryError):
        return tf.errors.RESOURCE_EXHAUSTED
    if issubclass(cls, NotImplementedError):
        return tf.errors.UNIMPLEMENTED
    return tf.errors.UNKNOWN


def as_tf_error(error: hvd_errors.HvdliteError, hint: str = "") -> Exception:
    """The TensorFlow twin of an hvdlite error, with the same message (plus hint)."""
    for hvd_class in type(error).__mro__:
        if hvd_class in TF_ERRORS:
            return TF_ERRORS[hvd_class](f"{error}{hint}")
    return error


def twin_for_status(code: int, message: str):
    """The twin class a failed graph op's status stands for, or None when it is not ours."""
    found = _RAISED_TWIN.findall(message)
    if not found:
        return None
    twin = _BY_NAME[found[-1]]  # the last one is what reached TensorFlow
    return twin if code == _py_func_code(twin) else None


def _reraise_as_twin(exc: tf.errors.OpError, tb):
    """Raises exc's twin if it has one; returns otherwise."""
    twin = twin_for_status(exc.error_code, exc.message)
    if twin is not None:
        raise twin(exc.node_def, exc.op, exc.message, exc.experimental_payloads).with_traceback(tb) from None


def install_status_hook() -> bool:
    """Makes failures inside tf.function and tf.compat.v1 Session runs surface as hvdlite's twins (see the module
    doc). Idempotent; False when this TensorFlow lacks a hook point (errors there then keep TensorFlow's class,
    message intact)."""
    return _hook_tf_function() & _hook_session()


def _wrap_once(owner, name: str, wrap) -> bool:
    """Replaces ``owner.name`` by ``wrap(original)`` unless that was done already; False if it is missing."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if not getattr(original, "_hvdlite_hook", False):
        wrapper = wrap(original)
        wrapper._hvdlite_hook = True
        setattr(owner, name, wrapper)
    return True


def _hook_tf_function() -> bool:
    try:
        from tensorflow.python.eager.polymorphic_function.atomic_function import InterpolateRuntimeError
    except ImportError:
        return False

    def wrap(original):
        def __exit__(self, typ, exc, tb):
            suppressed = original(self, typ, exc, tb)  # TensorFlow first adds the node's definition site
            if not suppressed and isinstance(exc, tf.errors.OpError):
                _reraise_as_twin(exc, tb)
            return suppressed

        return __exit__

    return _wrap_once(InterpolateRuntimeError, "__exit__", wrap)


def _hook_session() -> bool:
    try:
        from tensorflow.python.client.session import BaseSession
    except ImportError:
        return False

    def wrap(original):
        def _do_call(self, fn, *args):
            try:
                return original(self, fn, *args)  # raises with the failing node's definition site added
            except tf.errors.OpError as e:
                _reraise_as_twin(e, e.__traceback__)
                raise

        return _do_call

    return _wrap_once(BaseSession, "_do_call", wrap)
