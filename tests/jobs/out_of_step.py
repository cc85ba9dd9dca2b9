"""Ranks out of step (rank 0 in an allgather, the others in a barrier) fail on every rank within the desync
timeout, with one message naming both collectives and their ranks; the runtime stays usable."""

import time

import torch

import hvdlite.torch as hvd

hvd.init()
me = hvd.rank()
# 1. Rank 0 went on to an allgather, the others to a barrier (as after an exception one rank caught): every rank
#    fails within the desync timeout with one message naming both collectives and who is in each.
start = time.monotonic()
try:
    if me == 0:
        hvd.allgather(torch.ones(2), name="features")
    else:
        hvd.barrier()
except hvd.MismatchError as e:
    waited = time.monotonic() - start
    message = str(e)
    assert "out of step" in message, message
    assert (
        "allgather of tensor 'features' was submitted by rank(s) 0 but not by rank(s) "
        + ", ".join(str(r) for r in range(1, hvd.size()))
        in message
    ), message
    assert "barrier" in message and "but not by rank(s) 0" in message, message
    assert 2.0 < waited < 8.0, waited
else:
    raise AssertionError("ranks out of step were not detected")
# 2. The runtime is still usable, also for the same kind of collectives.
gathered = hvd.allgather(torch.ones(2) * me, name="features").tolist()
assert gathered == sum(([float(r)] * 2 for r in range(hvd.size())), [])
hvd.barrier()
# 3. A rank that is merely slow (nothing submitted that the others lack) is not out of step, however long it takes.
if me == 0:
    time.sleep(5)
assert hvd.allreduce(torch.ones(3), name="after_slow", op=hvd.Sum).tolist() == [float(hvd.size())] * 3
# 4. The same for a cached tensor (steady-state training): the slow rank's peers wait on a cache hit.
for step in range(3):
    if me == 0 and step == 2:
        time.sleep(5)
    assert hvd.allreduce(torch.ones(3), name="cached", op=hvd.Sum).tolist() == [float(hvd.size())] * 3
# 5. Cached tensors out of step: every rank submits a different cached tensor.
try:
    hvd.allreduce(torch.ones(3), name="after_slow" if me == 0 else "cached", op=hvd.Sum)
except hvd.MismatchError as e:
    assert "allreduce of tensor 'after_slow'" in str(e) and "allreduce of tensor 'cached'" in str(e), e
else:
    raise AssertionError("cached tensors out of step were not detected")
hvd.barrier()
hvd.shutdown()
