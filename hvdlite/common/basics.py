"""init/shutdown, the job layout (rank, size, local and cross ranks) and process sets, for every framework."""

import atexit
import os
import socket
import sys
import threading
import traceback
from typing import Dict, List, Optional, Sequence

from hvdlite.common import bootstrap, mpi_plugin, ops
from hvdlite.common.binding import check, ffi, lib
from hvdlite.common.errors import InvalidArgumentError, NotInitializedError

OP_ALLREDUCE, OP_ALLGATHER, OP_BROADCAST, OP_ALLTOALL, OP_REDUCESCATTER = 0, 1, 2, 3, 4
OP_BARRIER, OP_JOIN, OP_ADD_PROCESS_SET, OP_REMOVE_PROCESS_SET = 5, 6, 7, 8

_lock = threading.Lock()
_placement: Optional[bootstrap.Placement] = None
_generation = 0
_atexit_registered = False
_failure_reason: Optional[str] = None  # why this process is going down, told to the other ranks at shutdown


class ProcessSet:
    """A subset of ranks that runs collectives among themselves (Horovod's ProcessSet).

    Create it with the member ranks and register it with ``add_process_set`` (collective over every rank) or
    pass it to ``init(process_sets=[...])``. ``process_set_id`` is None until registered.
    """

    def __init__(self, ranks_or_comm: Sequence[int]):  # Horovod's parameter name
        ranks = ranks_or_comm
        if hasattr(ranks, "Get_size") and hasattr(ranks, "Get_group"):  # an mpi4py communicator
            ranks = _ranks_of_mpi_comm(ranks)
        self.ranks: List[int] = sorted(int(r) for r in ranks)
        self.process_set_id: Optional[int] = None

    def size(self) -> Optional[int]:
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self) -> Optional[int]:
        """This process's index in the set, or None if it is not a member or the set is not registered."""
        if self.process_set_id is None or rank() not in self.ranks:
            return None
        return self.ranks.index(rank())

    def included(self) -> Optional[bool]:
        return rank() in self.ranks if self.process_set_id is not None else None

    def __repr__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _ranks_of_mpi_comm(comm) -> List[int]:
    """Members of an mpi4py communicator as hvdlite ranks (relative to the communicator init() used)."""
    from hvdlite.common.mpi_bootstrap import world_ranks

    return world_ranks(_placement if _placement is not None else bootstrap.Placement(), comm)


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def init(comm=None, process_sets: Optional[Sequence[ProcessSet]] = None) -> None:
    """Joins the job: connects to every other rank (collective). Idempotent while running; after shutdown(),
    or once a fatal error or another rank's shutdown ended the runtime, it starts a new one.

    ``comm`` (first, as in Horovod): an mpi4py communicator, or a list of COMM_WORLD ranks, whose members form
    the job with their ranks in it; without it the job is found from the environment
    (hvdlite/common/bootstrap.py). ``process_sets`` are registered right after.
    """
    global _placement, _generation, _atexit_registered
    if isinstance(process_sets, str):
        # Horovod's "dynamic" allows add_process_set() after init; hvdlite's process sets always are.
        if process_sets != "dynamic":
            raise InvalidArgumentError(f"process_sets={process_sets!r}: give a list of ProcessSet or 'dynamic'")
        process_sets = None
    with _lock:
        if lib.hvdlite_is_initialized() == 1:  # running; 2: ended by a failure, which a new init replaces
            return
        if mpi_plugin.requested():
            # Before any peer is contacted: a machine without MPI fails here at once, naming the fix.
            plugin, why_not = mpi_plugin.ensure()
            if plugin is None:
                raise InvalidArgumentError("HVDLITE_CPU_OPERATIONS=mpi, but " + why_not)
        placement = bootstrap.detect(comm=comm)
        config = ffi.new("hvdlite_init_config*")
        config.rank = placement.rank
        config.size = placement.size
        keep_alive = []
        if placement.size > 1:
            start_timeout = float(
                os.environ.get("HVDLITE_START_TIMEOUT", os.environ.get("HOROVOD_START_TIMEOUT", 60))
            )
            address = bootstrap.advertise_address(placement)
            port = ffi.new("int32_t*")
            check(lib.hvdlite_listener_open(address.encode(), port))
            bootstrap.log("info", f"data-plane listener at {address}:{port[0]}", placement.rank)
            peers = bootstrap.exchange_peers(placement, f"{address}:{port[0]}", _generation, start_timeout)
            placement = bootstrap.complete_layout(placement, peers)
            hosts = {}
            host_ids = [hosts.setdefault(p["host"], len(hosts)) for p in peers]
            addresses = [ffi.new("char[]", p["address"].encode()) for p in peers]
            keep_alive += addresses
            config.peer_addresses = keep_alive_array = ffi.new("char*[]", addresses)
            keep_alive.append(keep_alive_array)
            config.host_ids = ids = ffi.new("int32_t[]", host_ids)
            config.pids = pids = ffi.new("int32_t[]", [int(p["pid"]) for p in peers])
            keep_alive += [ids, pids]
        secret = ffi.new("uint8_t[]", placement.secret or b"\0")
        config.secret = secret
        config.secret_len = len(placement.secret)
        # Names the mesh's handshake keys and shm segments: equal on every rank of this runtime and new for
        # each one (elastic rounds mix processes with different numbers of earlier inits: the round names it).
        incarnation = placement.exchange_scope or f"{placement.job_id}.{_generation}"
        job = ffi.new("char[]", incarnation.encode())
        config.job_id = job
        if placement.comm is not None:  # bootstrapped over MPI: the MPI data plane uses the same communicator
            from mpi4py import MPI

            config.mpi_comm = ffi.cast("void*", MPI._addressof(placement.comm))
        try:
            check(lib.hvdlite_init(config))
        finally:
            # Also after a refusal (a knob that differs, a backend that cannot start): every rank was refused
            # alike, and a retry must exchange addresses in a fresh scope, not read this attempt's.
            _generation += 1
        _placement = placement
        global_process_set.ranks = list(range(placement.size))
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _chain_excepthook()
            _atexit_registered = True
    for process_set in process_sets or ():
        add_process_set(process_set)


def shutdown() -> None:
    """Leaves the job. Pending operations on every rank fail with AbortedError. init() may be called again."""
    check(lib.hvdlite_shutdown())
    ops.release_finished_abandoned()  # shutdown finished (aborted) every operation an interrupted wait gave up


def note_failure(error: BaseException) -> None:
    """Records that this process is going down because of ``error``: when hvdlite shuts down (at exit), the other
    ranks' pending and later collectives fail with an error that names this rank, its host and the exception,
    instead of a bare "another rank shut hvdlite down". The first failure noted wins. Called for uncaught
    exceptions (through sys.excepthook) and by the launcher's function runner."""
    global _failure_reason
    if _failure_reason is not None:
        return
    where = ""
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        where = f" at {os.path.basename(last.filename)}:{last.lineno} in {last.name}"
    message = str(error)
    if len(message) > 500:
        message = message[:500] + "..."
    placement = _placement
    who = f"rank {placement.rank}" if placement is not None else "a rank"
    _failure_reason = f"{who} on {socket.gethostname()} raised {type(error).__name__}: {message}{where}"


def _shutdown_at_exit() -> None:
    if lib.hvdlite_is_initialized() == 0:
        return
    if _failure_reason is not None:
        check(lib.hvdlite_abort(_failure_reason.encode(errors="replace")))
        ops.release_finished_abandoned()
    else:
        shutdown()


def _chain_excepthook() -> None:
    """Notes an uncaught exception before the interpreter's exit handlers shut hvdlite down (the hook runs
    first), then hands it to whatever hook was installed before (the default prints the traceback)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        try:
            if exc is not None:
                note_failure(exc.with_traceback(tb) if tb is not None else exc)
        finally:
            previous(exc_type, exc, tb)

    sys.excepthook = hook


def is_initialized() -> bool:
    return bool(lib.hvdlite_is_initialized())


def _require_init() -> bootstrap.Placement:
    if not lib.hvdlite_is_initialized() or _placement is None:
        raise NotInitializedError("hvdlite has not been initialized; call hvd.init() first")
    return _placement


def rank() -> int:
    return _require_init().rank


def size() -> int:
    return _require_init().size


def local_rank() -> int:
    return _require_init().local_rank


def local_size() -> int:
    return _require_init().local_size


def cross_rank() -> int:
    return _require_init().cross_rank


def cross_size() -> int:
    return _require_init().cross_size


def is_homogeneous() -> bool:
    return size() == local_size() * cross_size()


def _run_control(op: int, ranks: Sequence[int]) -> List[int]:
    """Enqueues a process-set change (collective over every rank) and waits for it."""
    _require_init()
    handle = ops.submit(ops.request(op, None, 0, (), 0, 0, splits=ranks))
    try:
        ops.wait(handle)
        return ops.int_results(handle)
    finally:
        ops.release(handle)


def add_process_set(process_set) -> ProcessSet:
    """Registers a process set on every rank (every rank must call it, in the same order)."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    process_set.process_set_id = _run_control(OP_ADD_PROCESS_SET, process_set.ranks)[0]
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters a process set on every rank (collective). Returns False if it was not registered."""
    if process_set.process_set_id in (None, 0):
        return False
    _run_control(OP_REMOVE_PROCESS_SET, [process_set.process_set_id])
    process_set.process_set_id = None
    return True


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline (chrome://tracing, Perfetto) of every tensor's negotiation and
    execution to file_path, as Horovod's ``hvd.start_timeline``. Rank 0 writes it; on other ranks this is
    accepted and records nothing, unless file_path contains ``{rank}``: then every rank writes its own file, with
    its rank in place of the marker. A running timeline (started here or by HVDLITE_TIMELINE) is closed first.
    mark_cycles adds a CYCLE_START instant event at each cycle that ran collectives."""
    _require_init()
    check(lib.hvdlite_start_timeline(os.fsencode(os.fspath(file_path)), 1 if mark_cycles else 0))


def stop_timeline() -> None:
    """Stops the timeline and closes its file (a complete JSON trace). Without a running timeline: no-op."""
    _require_init()
    check(lib.hvdlite_stop_timeline())


def timeline_counter(name: str, values: Dict[str, float]) -> None:
    """Adds named figures (e.g. the bytes a gradient compressor sent this step) to this rank's timeline as a
    counter event, drawn as a graph on a row called ``name``; records nothing where no timeline is written."""
    _require_init()
    keys = [ffi.new("char[]", str(key).encode()) for key in values]
    check(
        lib.hvdlite_timeline_counter(
            str(name).encode(),
            ffi.new("const char*[]", keys) if keys else ffi.NULL,
            ffi.new("double[]", [float(v) for v in values.values()]) if keys else ffi.NULL,
            len(keys),
        )
    )


def _core_text(fill, size: int = 4096) -> str:
    """Text from a core call that fills a buffer and returns the length it needs."""
    while True:
        buf = ffi.new("char[]", size)
        needed = fill(buf, size)
        if needed < size:
            return ffi.string(buf).decode()
        size = needed + 1


def knob_table() -> str:
    """Every setting the core reads: "NAME\\tdefault\\tmeaning" lines (needs no init)."""
    return _core_text(lib.hvdlite_knob_table, 16384)


def build_info() -> str:
    return _core_text(lib.hvdlite_build_info)
