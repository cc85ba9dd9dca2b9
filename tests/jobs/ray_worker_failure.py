"""A worker's exception stops the job and names its rank; a stopped executor refuses to run; start() again gives
fresh workers; more workers than the cluster has CPUs fail with a clear error."""

import time

import ray
from ray_driver import SETTINGS, RayExecutor, WorkerError


def unhappy_rank_two():
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    if hvd.rank() == 2:
        raise ValueError("rank two is unhappy")
    hvd.allreduce(torch.ones(1), name="never_completes")  # the others wait here for rank 2


executor = RayExecutor(SETTINGS, num_workers=4)
executor.start()
started = time.monotonic()
try:
    executor.run(unhappy_rank_two)
except WorkerError as e:
    assert e.rank == 2, e
    assert "ValueError: rank two is unhappy" in str(e) and "unhappy_rank_two" in e.remote_traceback, str(e)
    assert isinstance(e.__cause__, ray.exceptions.RayTaskError)
else:
    raise SystemExit("the failure was not reported")
assert time.monotonic() - started < 30, "the blocked workers must be stopped, not waited for"
try:
    executor.run(lambda: 1)
except RuntimeError as e:
    assert "not started" in str(e)
else:
    raise SystemExit("a stopped executor ran a function")
executor.start()  # a new job on fresh workers
assert executor.run(lambda: __import__("hvdlite.torch").torch.init() or 7) == [7] * 4
executor.shutdown()

# More workers than the cluster has CPUs: a clear error, not a hang
executor = RayExecutor(RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=3), num_workers=5)
try:
    executor.start()
except TimeoutError as e:
    assert "did not grant 5 workers" in str(e), str(e)
else:
    raise SystemExit("5 workers started on 4 CPUs")
assert executor.workers == []
