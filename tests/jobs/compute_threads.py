"""torch's thread count after hvd.init() on every rank: the rank's share of the host's CPUs where the ranks'
default pools would oversubscribe it, otherwise what the job had (the environment's OMP_NUM_THREADS, one rank)."""

import os

import torch

import hvdlite.torch as hvd

before = torch.get_num_threads()
hvd.init()
after = torch.get_num_threads()
cpus = len(os.sched_getaffinity(0))
if "OMP_NUM_THREADS" in os.environ or hvd.local_size() == 1:
    assert after == before, (before, after, cpus)
else:
    assert before * hvd.local_size() > cpus, "the default pool no longer oversubscribes: nothing to test"
    assert after == max(1, cpus // hvd.local_size()), (before, after, cpus, hvd.local_size())
assert after * hvd.local_size() <= cpus or after == 1 or "OMP_NUM_THREADS" in os.environ
hvd.shutdown()
