"""Signal handlers run while a rank waits on its peers: a SIGALRM timeout interrupts a synchronous allreduce,
Ctrl-C interrupts synchronize() of an asynchronous one, whose handle stays valid and later returns the result."""

import os
import signal
import threading
import time

import torch

import hvdlite.torch as hvd
from hvdlite.common import ops as core_ops

hvd.init()
me = hvd.rank()


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm()


signal.signal(signal.SIGALRM, on_alarm)
if me == 1:
    # 1. A SIGALRM-based timeout interrupts a synchronous allreduce that rank 0 submits only 3 s later.
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    start = time.monotonic()
    try:
        hvd.allreduce(torch.ones(4), name="late", op=hvd.Sum)
    except Alarm:
        waited = time.monotonic() - start
        assert 0.45 < waited < 1.0, waited
    else:
        raise AssertionError("the alarm never interrupted the allreduce")
    # 2. Ctrl-C (SIGINT from another thread, as a terminal sends it) interrupts synchronize() of an async op;
    #    the handle stays valid and a second synchronize() returns the result.
    handle = hvd.allreduce_async(torch.full((3,), 2.0), name="later", op=hvd.Sum)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        hvd.synchronize(handle)
    except KeyboardInterrupt:
        assert time.monotonic() - start < 1.0
    else:
        raise AssertionError("Ctrl-C never interrupted synchronize")
    assert not hvd.poll(handle)
    print("INTERRUPTED BOTH", flush=True)
    assert hvd.synchronize(handle).tolist() == [4.0] * 3

    def interrupted_allreduce_(tensor, name, alarm_after):
        # allreduce_ interrupted by an alarm: the tensor stays in use and receives rank 0's late result
        expected = (tensor * 2).tolist()
        signal.setitimer(signal.ITIMER_REAL, alarm_after)
        try:
            hvd.allreduce_(tensor, name=name, op=hvd.Sum)
        except Alarm:
            pass
        else:
            raise AssertionError(f"the alarm never interrupted allreduce_ of {name}")
        # abandoned, not leaked: its buffer is held and its handle released once it finishes
        assert core_ops.release_finished_abandoned() == 1
        deadline = time.monotonic() + 10
        while tensor.tolist() != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tensor.tolist() == expected, tensor
        while core_ops.release_finished_abandoned() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core_ops.release_finished_abandoned() == 0

    # 3. The same for the synchronous in-place allreduce_ (no Python handle), interrupted in a later wait slice
    interrupted_allreduce_(torch.full((5,), 3.0), "inplace-late", 0.3)
    # 4. and inside the first slice: allreduce_ is then still in its one call that enqueues and waits, and the
    #    exception comes the moment that call returns
    interrupted_allreduce_(torch.full((2,), 1.5), "inplace-early", 0.02)
    # 5. and on a name whose request is already prepared (allreduce_'s steady state, which runs it without a
    #    helper), inside the first slice
    assert hvd.allreduce_(torch.ones(4), name="inplace-steady", op=hvd.Sum).tolist() == [2.0] * 4
    interrupted_allreduce_(torch.full((4,), 5.0), "inplace-steady", 0.02)
    # 6. allreduce into a new tensor on a prepared name (its steady state also runs without a helper), inside the
    #    first slice: the input and the output the caller never got stay held until the operation finishes
    assert hvd.allreduce(torch.ones(4), name="new-steady", op=hvd.Sum).tolist() == [2.0] * 4
    source = torch.full((4,), 7.0)
    signal.setitimer(signal.ITIMER_REAL, 0.02)
    try:
        hvd.allreduce(source, name="new-steady", op=hvd.Sum)
    except Alarm:
        pass
    else:
        raise AssertionError("the alarm never interrupted allreduce into a new tensor")
    assert core_ops.release_finished_abandoned() == 1
    deadline = time.monotonic() + 10
    while core_ops.release_finished_abandoned() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert core_ops.release_finished_abandoned() == 0
    assert source.tolist() == [7.0] * 4  # the input is only read
else:
    time.sleep(3)
    assert hvd.allreduce(torch.ones(4), name="late", op=hvd.Sum).tolist() == [2.0] * 4
    time.sleep(1)
    assert hvd.allreduce(torch.full((3,), 2.0), name="later", op=hvd.Sum).tolist() == [4.0] * 3
    time.sleep(1)
    assert hvd.allreduce(torch.full((5,), 3.0), name="inplace-late", op=hvd.Sum).tolist() == [6.0] * 5
    time.sleep(1)
    assert hvd.allreduce(torch.full((2,), 1.5), name="inplace-early", op=hvd.Sum).tolist() == [3.0] * 2
    assert hvd.allreduce_(torch.ones(4), name="inplace-steady", op=hvd.Sum).tolist() == [2.0] * 4
    time.sleep(1)
    assert hvd.allreduce(torch.full((4,), 5.0), name="inplace-steady", op=hvd.Sum).tolist() == [10.0] * 4
    assert hvd.allreduce(torch.ones(4), name="new-steady", op=hvd.Sum).tolist() == [2.0] * 4
    time.sleep(1)
    assert hvd.allreduce(torch.full((4,), 7.0), name="new-steady", op=hvd.Sum).tolist() == [14.0] * 4
# The abandoned synchronous allreduce finished in the background; later collectives work as usual.
for step in range(20):
    assert hvd.allreduce(torch.ones(2) * step, name="after", op=hvd.Sum).tolist() == [2.0 * step] * 2
hvd.barrier()
hvd.shutdown()
