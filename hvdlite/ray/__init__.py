"""hvdlite on Ray: ``from hvdlite.ray import RayExecutor`` in place of ``from horovod.ray import RayExecutor``.
Needs ``pip install hvdlite[ray]``."""

from hvdlite.ray.executor import RayExecutor, RaySettings, WorkerError  # noqa: F401
