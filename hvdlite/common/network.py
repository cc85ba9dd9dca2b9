"""Which addresses this machine has, and which one reaches a given host.

Used by the launcher to decide which hosts are local and where ranks reach its rendezvous service, and by
ranks (``HVDLITE_NETWORK_INTERFACE``) to pick the address they advertise. IPv4 only, standard library only.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Iterable, Optional, Set

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: get the IPv4 address of an interface

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "::1"})


def interface_ipv4(name: str) -> Optional[str]:
    """IPv4 address of network interface ``name``, or None if it has none (or does not exist)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def first_interface_ipv4(names: Iterable[str]) -> Optional[str]:
    """Address of the first interface of ``names`` that has an IPv4 address here."""
    for name in names:
        address = interface_ipv4(name.strip())
        if address:
            return address
    return None


def local_ipv4_addresses() -> Set[str]:
    """Every IPv4 address configured on this machine's interfaces."""
    addresses = set()
    for _, name in socket.if_nameindex():
        address = interface_ipv4(name)
        if address:
            addresses.add(address)
    return addresses


def is_loopback_name(host: str) -> bool:
    """True for a loopback spelling (``localhost``, ``127.x.y.z``, ``::1``): a host only this machine reaches."""
    host = host.strip().lower()
    return host in LOOPBACK_NAMES or host.startswith("127.")


def is_local_host(host: str) -> bool:
    """True if ``host`` names this machine: a loopback name or address, this machine's hostname, or one of
    its interface addresses. Names are not resolved through DNS (it may be slow or point elsewhere)."""
    if is_loopback_name(host):
        return True
    host = host.strip().lower()
    own = socket.gethostname().lower()
    if host in (own, own.split(".")[0]):
        return True
    return host in local_ipv4_addresses()


def source_address_for(host: str) -> str:
    """This machine's address on the route to ``host`` (a name or an address): the address a process on
    ``host`` can reach us at. Only asks the kernel's routing table (a UDP connect sends nothing)."""
    infos = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
    if not infos:
        raise OSError("cannot resolve %r" % host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(infos[0][4])
        return probe.getsockname()[0]
