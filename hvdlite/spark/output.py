"""The ranks' output on the driver of ``hvdlite.spark.run``: each line prefixed with ``[<rank>]<stdout>: `` or
``[<rank>]<stderr>: `` (with ``prefix_output_with_timestamp``, the time first, as Horovod writes it), written
to the ``stdout`` and ``stderr`` streams given to ``run`` (default: ``sys.stdout`` and ``sys.stderr`` at the
time of writing, so notebooks and pytest's capture see it).

The line rules are the launcher's (hvdlite/runner/output.py, offered through hvdlite.runner.api: partial lines
wait for their end, progress bars drawn with ``\\r`` become whole lines at most once every
``HVDLITE_PROGRESS_INTERVAL`` seconds, colours pass through). A Spark driver's console is a notebook or a log
far more often than a terminal, so there is no in-place drawing here.
"""

from __future__ import annotations

import sys
import time
from typing import Dict, Optional, TextIO, Tuple

from hvdlite.runner.api import LineSink, LineSplitter, progress_interval, rank_prefix, timestamp_prefix


class RankOutput:
    def __init__(self, stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None, timestamps: bool = False):
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._timestamps = timestamps
        interval = progress_interval()
        self._sinks = {name: LineSink(self._writer(name), interval) for name in self._streams}
        self._splitters: Dict[Tuple[int, str], LineSplitter] = {}

    def _writer(self, name: str):
        def write(data: bytes) -> None:
            stream = self._streams[name] or (sys.stdout if name == "stdout" else sys.stderr)
            if stream is None:
                return
            try:
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    stream.flush()  # what was written as text so far goes first
                    buffer.write(data)
                    buffer.flush()
                else:  # io.StringIO, a notebook's stream
                    stream.write(data.decode("utf-8", errors="replace"))
                    stream.flush()
            except (OSError, ValueError):
                pass  # a closed stream must not fail the job

        return write

    def _prefix(self, key: Tuple[int, str]) -> bytes:
        return timestamp_prefix(self._timestamps) + rank_prefix(key)

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        key = (rank, stream)
        splitter = self._splitters.setdefault(key, LineSplitter())
        self._forward(key, splitter.feed(data))

    def _forward(self, key, events) -> None:
        sink = self._sinks[key[1]]
        now = time.monotonic()
        for event in events:
            handler = sink.line if event.finished else sink.progress
            handler(key, self._prefix(key), event.content, event.in_place, now)

    def tick(self) -> None:
        """Writes the thinned updates of unfinished lines that are due."""
        now = time.monotonic()
        for key in self._splitters:
            self._sinks[key[1]].tick(key, now)

    def close(self) -> None:
        """The end of every rank's streams: unfinished lines are written as they stand."""
        for key, splitter in self._splitters.items():
            self._forward(key, splitter.close())
            self._sinks[key[1]].close(key, time.monotonic())
        self._splitters.clear()
