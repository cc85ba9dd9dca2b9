"""hvdlite on Spark: ``import hvdlite.spark`` in place of ``import horovod.spark``, then
``hvdlite.spark.run(fn, num_proc=N)`` from a PySpark driver. Needs ``pip install hvdlite[spark]`` on the driver,
and hvdlite in the executors' Python too. How a run works: runner.py; docs/launcher.md."""

from hvdlite.runner.api import RunError  # what run() raises when a rank fails
from hvdlite.spark.runner import run

__all__ = ["run", "RunError"]
