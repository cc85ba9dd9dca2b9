"""Where each rank was when a job failed: the launcher's closing summary of the ranks' last collectives.

When a collective fails (a lost peer, a timeout), the core ends every rank's error with its recent-operations
record, one line: ``last 8 collectives on rank 1, oldest first: allreduce 'grad' (16 KB, done), ...``. That line
reaches the launcher inside the rank's traceback, among every other rank's output. The output router hands each
finished line to :data:`RECORD`, which keeps the latest record of each rank; when the job fails, the launcher
prints them together, rank by rank, so a user sees where every rank was without reading N interleaved
tracebacks. Ranks that printed no record (the one that died first, or one that was busy elsewhere) are named.
"""

from __future__ import annotations

import re
import threading
from typing import Dict, Iterable, List

_MARKER = b" collectives on rank "
_PATTERN = re.compile(rb"last \d+ collectives on rank (\d+), oldest first: (.*?)\s*$")


class RecentCollectives:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rank: Dict[int, str] = {}

    def clear(self) -> None:
        with self._lock:
            self._by_rank.clear()

    def observe(self, line: bytes) -> None:
        """Remembers the record if ``line`` (a finished line of a rank's output) carries one."""
        if _MARKER not in line:
            return
        match = _PATTERN.search(line)
        if match:
            with self._lock:
                self._by_rank[int(match.group(1))] = match.group(2).decode("utf-8", errors="replace")

    def summary(self, ranks: Iterable[int]) -> List[str]:
        """One line per rank for the launcher's report; empty when no rank printed a record."""
        with self._lock:
            if not self._by_rank:
                return []
            known = dict(self._by_rank)
        lines = ["where each rank was (its last collectives, oldest first, from its error):"]
        for rank in sorted(set(ranks) | set(known)):
            lines.append(
                "  rank %d: %s"
                % (rank, known.get(rank, "no record printed (it stopped first, or failed outside a collective)"))
            )
        return lines


#: The record of this process's current job (the launcher runs one job at a time).
RECORD = RecentCollectives()
