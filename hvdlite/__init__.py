"""hvdlite: Horovod-compatible distributed training.

Import a framework module for the training API (``import hvdlite.torch as hvd``). This top-level package
stays light (no framework imports) so that the launcher starts quickly.
"""
from hvdlite.common.errors import HorovodInternalError, HvdliteError  # noqa: F401

__version__ = "0.1.0"
