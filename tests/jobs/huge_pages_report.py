"""Allreduces of a 12 MB buffer, reused, by single copy; each rank prints a REPORT of how much of its buffers
lies on huge pages and what the promotion counted, for the test to read."""

import json

import numpy as np
from numpy_collectives import allreduce

from hvdlite.common import basics

basics.init()
n, me = basics.size(), basics.rank()
HUGE = 2 << 20
COUNT = 3 << 20  # float32: 12 MB, five or six whole huge pages inside


def huge_kb_under(address, nbytes):
    # AnonHugePages of the mappings that overlap the buffer (/proc/self/smaps; collapsing splits a mapping at the
    # huge-page boundaries).
    overlaps, huge = False, 0
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            overlaps = lo < address + nbytes and address < hi
        elif overlaps and fields and fields[0] == "AnonHugePages:":
            huge += int(fields[1])
    return huge


def expected(i):
    return n * (i + 1) + n * (n - 1) / 2  # every rank r contributes r + 1 + i


def info():
    return dict(kv.split("=", 1) for kv in basics.build_info().split(";") if "=" in kv)["huge_page_buffers"]


checked = 0
# Reused in place: the same buffer four times.
buffer = np.empty(COUNT, np.float32)
for i in range(4):
    buffer[:] = me + 1 + i
    assert np.all(allreduce(buffer, "inplace") == expected(i)), i
    checked += 1
interior = ((buffer.ctypes.data + buffer.nbytes) // HUGE - -(-buffer.ctypes.data // HUGE)) * HUGE
report = {
    "in_place": info(),
    "huge_kb": huge_kb_under(buffer.ctypes.data, buffer.nbytes),
    "interior_kb": interior // 1024,
}
# Reused out of place: input and output are both read by the peers.
source, result = np.empty(COUNT, np.float32), np.empty(COUNT, np.float32)
for i in range(3):
    source[:] = me + 1 + i
    assert np.all(allreduce(source, "outofplace", out=result) == expected(i)), i
    assert np.all(source == me + 1 + i)
    checked += 1
report["out_of_place"] = info()
# A fresh array each use: numpy maps a 12 MB array afresh, often at the address the last one had.
addresses = set()
for i in range(2 * 64 + 2):
    fresh = np.full(COUNT, me + 1 + i, np.float32)
    addresses.add(fresh.ctypes.data)
    assert np.all(allreduce(fresh, "fresh") == expected(i)), i
    checked += 1
    del fresh
report["fresh"] = info()
report["fresh_addresses"] = len(addresses)
print("REPORT %d %s" % (me, json.dumps(report)), flush=True)
print("OK %d" % checked, flush=True)
basics.shutdown()
