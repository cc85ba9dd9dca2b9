"""hvdlite: Horovod-compatible distributed training.

Import a framework module for the training API (``import hvdlite.torch as hvd``). This top-level package
stays light (no framework imports) so that the launcher starts quickly; ``hvdlite.run`` (Horovod's
``horovod.run``) is imported on first use from ``hvdlite.runner.api``, the launcher's public module and the only
part of the launcher the rest of hvdlite imports (docs/architecture.md, "Layers").
"""

from hvdlite.common.errors import HorovodInternalError, HvdliteError  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name):
    if name == "run":
        from hvdlite.runner.api import run

        return run
    raise AttributeError(f"module 'hvdlite' has no attribute {name!r}")
