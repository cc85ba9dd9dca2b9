"""Hosts and slots: ``-H host1:4,host2:4``, ``--hostfile`` and the assignment of ranks to hosts.

Ranks fill the hosts in the order given, each up to its slots (as Horovod and ``mpirun --map-by slot`` do):
``-np 3 -H a:2,b:2`` puts ranks 0 and 1 on ``a`` and rank 2 on ``b``.

``--host-ids 0,0,1,1`` (a testing aid of ``hvdlite-run`` and ``python -m hvdlite.runner.local``) lets this one
machine pretend to be several hosts instead: rank ``r`` runs here as host ``host<id_r>``, which sets the local
and cross ranks exactly as a multi-host launch would (:func:`emulated_hosts`).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import List, Optional, Sequence, Union

from hvdlite.common.topology import RankInfo, topology_for_hosts

_SLOTS_KEY = re.compile(r"^(slots|max[-_]slots)=(\S+)$")


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """A host as the user wrote it (``[user@]name``) and how many ranks it may run."""

    name: str
    slots: int

    @property
    def hostname(self) -> str:
        """The host's identity without the ssh user: ranks with equal identities share memory."""
        return self.name.rsplit("@", 1)[-1].strip("[]")


def _slots(text: str, where: str) -> int:
    try:
        slots = int(text)
    except ValueError:
        raise ValueError("%s: slots must be a positive integer, got %r" % (where, text)) from None
    if slots < 1:
        raise ValueError("%s: slots must be a positive integer, got %d" % (where, slots))
    return slots


def _merge(hosts: List[HostSlots]) -> List[HostSlots]:
    """A host listed twice gets the sum of its slots, at its first position (as mpirun does)."""
    merged: dict = {}
    for host in hosts:
        merged[host.name] = merged.get(host.name, 0) + host.slots
    return [HostSlots(name, slots) for name, slots in merged.items()]


def _split_host_slots(entry: str, where: str) -> HostSlots:
    """``name``, ``name:slots``, ``[v6addr]`` or ``[v6addr]:slots``."""
    if entry.startswith("[") or "@[" in entry:
        match = re.fullmatch(r"(.*\])(?::(.*))?", entry)
        if not match:
            raise ValueError("%s: malformed host %r" % (where, entry))
        name, slots = match.group(1), match.group(2)
    elif entry.count(":") == 1:
        name, slots = entry.split(":")
    elif ":" in entry:
        raise ValueError("%s: write IPv6 addresses in brackets, e.g. [::1]:2, got %r" % (where, entry))
    else:
        name, slots = entry, None
    if not name or name.endswith("@"):
        raise ValueError("%s: empty host name in %r" % (where, entry))
    return HostSlots(name, 1 if slots is None else _slots(slots, where))


def parse_hosts(text: str) -> List[HostSlots]:
    """Parses ``-H``: comma-separated ``host[:slots]`` (1 slot when omitted)."""
    entries = [entry.strip() for entry in text.split(",")]
    if not text.strip() or any(not entry for entry in entries):
        raise ValueError("-H: expected host:slots[,host:slots...], got %r" % text)
    return _merge([_split_host_slots(entry, "-H") for entry in entries])


def parse_hostfile_text(text: str, path: str = "hostfile") -> List[HostSlots]:
    """Parses a hostfile: one host per line, ``host slots=N`` (Open MPI's format; ``max_slots`` is accepted and
    ignored), ``host:N`` or a bare ``host`` (1 slot); ``#`` starts a comment."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s:%d" % (path, number)
        fields = line.split()
        host = _split_host_slots(fields[0], where)
        for field in fields[1:]:
            match = _SLOTS_KEY.match(field)
            if not match:
                raise ValueError("%s: expected 'host slots=N', got %r" % (where, raw.strip()))
            if match.group(1) == "slots":
                host = HostSlots(host.name, _slots(match.group(2), where))
        hosts.append(host)
    if not hosts:
        raise ValueError("%s: no hosts in the file" % path)
    return _merge(hosts)


def parse_hostfile(path: str) -> List[HostSlots]:
    with open(path, encoding="utf-8") as f:
        return parse_hostfile_text(f.read(), path)


def assign_ranks(hosts: Sequence[HostSlots], np: Optional[int]) -> List[HostSlots]:
    """The host of each rank, filling hosts in order. ``np=None`` uses every slot."""
    total = sum(host.slots for host in hosts)
    if np is None:
        np = total
    if np < 1:
        raise ValueError("-np must be at least 1, got %d" % np)
    if np > total:
        listing = ",".join("%s:%d" % (host.name, host.slots) for host in hosts)
        raise ValueError(
            "requested %d processes but the hosts have only %d slots (%s); add slots or hosts" % (np, total, listing)
        )
    assignment: List[HostSlots] = []
    for host in hosts:
        assignment += [host] * min(host.slots, np - len(assignment))
    return assignment


def to_mpi_hosts(hosts: Sequence[HostSlots]) -> str:
    """``-H`` value for mpirun (same syntax)."""
    return ",".join("%s:%d" % (host.name, host.slots) for host in hosts)


def parse_host_ids(text: str) -> List[str]:
    """Parse ``"0,0,1,1"`` into ``["0", "0", "1", "1"]``."""
    ids = [part.strip() for part in text.split(",")]
    if not ids or any(not part for part in ids):
        raise ValueError("host ids must be a comma-separated list of non-empty ids, got %r" % text)
    return ids


def emulated_hosts(host_ids: Sequence[Union[str, int]]) -> List[HostSlots]:
    """The host of each rank under ``--host-ids`` (one id per rank): rank ``r`` on ``host<id_r>``, all of them
    on this machine, each host with as many slots as it has ranks."""
    names = ["host%s" % str(host_id).strip() for host_id in host_ids]
    slots = collections.Counter(names)
    return [HostSlots(name, slots[name]) for name in names]


def compute_topology(np: int, host_ids: Optional[Sequence[Union[str, int]]] = None) -> List[RankInfo]:
    """Rank, local and cross coordinates of every rank on this machine.

    Without ``host_ids`` all ranks share the host ``"localhost"``.  With ``host_ids`` (one id per rank), rank
    ``r`` runs on host ``host<id>`` (:func:`emulated_hosts`). See :func:`topology_for_hosts` for how the
    coordinates are derived.
    """
    if np < 1:
        raise ValueError("the number of ranks must be at least 1, got %d" % np)
    if host_ids is None:
        return topology_for_hosts(["localhost"] * np)
    if len(host_ids) != np:
        raise ValueError("got %d host ids for %d ranks" % (len(host_ids), np))
    return topology_for_hosts([host.hostname for host in emulated_hosts(host_ids)])
