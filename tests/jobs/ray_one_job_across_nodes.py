"""A RayExecutor job of 4 workers across the two nodes: rank order, co-located ranks, a second function on the
same job, execute() on executables, and workers placed by host."""

import os

from ray_driver import SETTINGS, RayExecutor


def train(scale):
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.full((3,), float(hvd.rank() + 1)) * scale, op=hvd.Sum, name="total")
    gathered = hvd.allgather(torch.tensor([[hvd.rank()]]), name="ranks")
    return dict(
        rank=hvd.rank(),
        size=hvd.size(),
        local=(hvd.local_rank(), hvd.local_size()),
        cross=(hvd.cross_rank(), hvd.cross_size()),
        total=total.tolist(),
        gathered=gathered.flatten().tolist(),
        host=os.environ["HVDLITE_HOSTNAME"],
    )


executor = RayExecutor(SETTINGS, num_workers=4, cpus_per_worker=1)
executor.start()
results = executor.run(train, args=[2.0])
assert [r["rank"] for r in results] == [0, 1, 2, 3], results  # rank order
assert all(r["size"] == 4 and r["total"] == [20.0] * 3 and r["gathered"] == [0, 1, 2, 3] for r in results)
hosts = [r["host"] for r in results]
assert sorted(set(hosts)) == ["127.0.0.2", "127.0.0.3"], hosts
assert hosts[0] == hosts[1] and hosts[2] == hosts[3], f"co-located workers must get consecutive ranks: {hosts}"
assert [r["local"] for r in results] == [(0, 2), (1, 2), (0, 2), (1, 2)], results
assert [r["cross"] for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)], results
assert [n["ip"] for n in executor.nodes] == hosts

# A second function on the same job: hvd.init() again is a no-op, the runtime is still there.
assert executor.run(train, kwargs={"scale": 1.0})[3]["total"] == [10.0] * 3

# execute(): fn(executable) on the object every worker built in start()
executor.shutdown()


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


executor.start(executable_cls=Counter, executable_args=[10])
assert executor.execute(lambda c: c.bump()) == [11] * 4
assert executor.execute(lambda c: c.bump()) == [12] * 4
assert executor.execute_single(lambda c: c.value) == 12
executor.shutdown()

# Exactly two workers on each of two hosts
executor = RayExecutor(SETTINGS, num_hosts=2, num_workers_per_host=2, cpus_per_worker=1)
executor.start()
placed = executor.run(lambda: os.environ["HVDLITE_HOSTNAME"])
assert placed[0] == placed[1] != placed[2] == placed[3], placed
executor.shutdown()
