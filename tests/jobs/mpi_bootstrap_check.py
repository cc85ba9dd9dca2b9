"""Under mpirun: hvd.init() from Open MPI's environment, then init(comm=...) with a reversed communicator; each
checks ranks, an allreduce, an allgather in hvdlite's rank order, the data plane asked for (EXPECT_BACKEND) and
MPI's thread support, and prints one line per check for the test."""

import os
import sys

import torch
from mpi4py import MPI

import hvdlite.torch as hvd
from hvdlite.common import bootstrap

world = MPI.COMM_WORLD.Get_rank()
assert world == int(os.environ["OMPI_COMM_WORLD_RANK"]) and "HVDLITE_RANK" not in os.environ
assert bootstrap.detect_method(os.environ) == "mpi"


def check(expected_rank, label):
    r, n = hvd.rank(), hvd.size()
    assert (r, n) == (expected_rank, 2), (r, n)
    total = hvd.allreduce(torch.tensor([float(r + 1), 10.0 * r]), op=hvd.Sum)
    assert total.tolist() == [3.0, 10.0], total
    gathered = hvd.allgather(torch.tensor([[world, r]]))  # rows in hvdlite rank order
    assert gathered[:, 1].tolist() == [0, 1] and sorted(gathered[:, 0].tolist()) == [0, 1], gathered
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_size()) == (r, 2, 1)
    info = dict(i.split("=", 1) for i in hvd.build_info().split(";") if "=" in i)
    assert info["cpu_operations"] == os.environ["EXPECT_BACKEND"], info  # the data plane the test asked for
    assert hvd.mpi_enabled() == (info["cpu_operations"] == "mpi") and hvd.mpi_built()
    assert hvd.mpi_threads_supported()  # mpi4py asks MPI_THREAD_MULTIPLE, which Open MPI provides
    # One write per line: with PYTHONUNBUFFERED print() writes the newline separately, and Open MPI's
    # output forwarding can then put another rank's text in between.
    sys.stdout.write(
        "%s world=%d rank=%d gathered=%s cycle=%s\n" % (label, world, r, gathered[:, 0].tolist(), info["CYCLE_TIME"])
    )
    sys.stdout.flush()


hvd.init()  # from the environment: OMPI_COMM_WORLD_*
check(world, "ENV")
# Under PYTHONUNBUFFERED=1 each of these is written in four pieces: only hvdlite-run --mpi keeps such lines whole,
# so only its test asks for them (under plain mpirun they would cut the other rank's lines).
for i in range(20 if os.environ.get("PRINT_PIECES") else 0):
    print("PIECES", world, i)
hvd.shutdown()
reversed_comm = MPI.COMM_WORLD.Split(0, key=-world)
hvd.init(comm=reversed_comm)  # that communicator's ranks: world rank 1 is hvdlite rank 0
check(1 - world, "COMM")
hvd.shutdown()
