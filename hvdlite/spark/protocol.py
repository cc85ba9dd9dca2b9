"""What the driver of ``hvdlite.spark.run`` and its Spark tasks say to each other, through the job's
authenticated rendezvous service (served by the driver; hvdlite/common/rendezvous.py).

Scope ``hvdlite.spark``:

    task.<index>         task -> driver   JSON {"host", "namespace", "pid"}: this partition's task has started
    assignment.<index>   driver -> task   JSON {"rank", "env"}: the rank it runs and that rank's variables
    exit.<index>         task -> driver   JSON {"rank", "code"}: its rank process exited (at once; the rank's
                                          last output follows, before the task returns)
    abort                driver -> tasks  reason text: stop your rank process now

The function and the results travel as ``hvdlite.run(fn)``'s blobs (hvdlite/runner/run_task.py: "fn" and
"result.<rank>" in scope ``hvdlite.run``), since each rank runs that very program.

A rank's output travels in batches, each in a scope of its own, ``hvdlite.spark.output.<rank>.<seq>`` (key
``data``; seq counts from 0), which the driver deletes once written out, so a long job's output does not pile
up in the driver's memory. A batch is a sequence of frames: one byte for the stream (0 stdout, 1 stderr),
four bytes of length (big-endian), the bytes as the rank wrote them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import struct
from typing import Iterator, List, Optional, Tuple

SCOPE = "hvdlite.spark"
OUTPUT_SCOPE_PREFIX = "hvdlite.spark.output."
OUTPUT_KEY = "data"
STREAMS = ("stdout", "stderr")
_FRAME = struct.Struct(">BI")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What every task of one run needs; pickled into the Spark job's closure (Spark's RPC carries it: enable
    ``spark.authenticate`` and ``spark.network.crypto.enabled`` where the network is not trusted)."""

    rendezvous_host: str
    rendezvous_port: int
    secret: bytes
    job_id: str
    start_timeout: float
    executable: Optional[str] = None  # the rank's Python; None: the one Spark runs the task with
    output_interval: float = 0.2  # seconds a task collects its rank's output before sending it


def task_key(index: int) -> str:
    return f"task.{index}"


def assignment_key(index: int) -> str:
    return f"assignment.{index}"


def exit_key(index: int) -> str:
    return f"exit.{index}"


ABORT_KEY = "abort"


def output_scope(rank: int, seq: int) -> str:
    return f"{OUTPUT_SCOPE_PREFIX}{rank}.{seq}"


def encode_output(pieces: List[Tuple[int, bytes]]) -> bytes:
    return b"".join(_FRAME.pack(stream, len(data)) + data for stream, data in pieces)


def decode_output(batch: bytes) -> Iterator[Tuple[str, bytes]]:
    offset = 0
    while offset < len(batch):
        stream, length = _FRAME.unpack_from(batch, offset)
        offset += _FRAME.size
        yield STREAMS[stream], batch[offset : offset + length]
        offset += length


def namespace_id() -> str:
    """Which mount, IPC and PID namespaces this process lives in: two executors on one machine but in
    different containers share a hostname only by accident, and cannot share memory."""
    links = []
    for name in ("mnt", "ipc", "pid"):
        try:
            links.append(os.readlink(f"/proc/self/ns/{name}"))
        except OSError:
            links.append("")
    return hashlib.sha256("|".join(links).encode()).hexdigest()[:8]


def this_host() -> dict:
    """The facts a task reports about where it runs."""
    return {"host": socket.gethostname(), "namespace": namespace_id(), "pid": os.getpid()}
