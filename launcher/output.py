"""Forwarding the ranks' output to the launcher's stdout and stderr.

One thread per rank stream (:func:`pump`) reads the rank's stdout or stderr pipe in chunks as the bytes come,
without waiting for a newline, so partial lines and progress updates are seen at once. The same code serves
``python -m hvdlite.runner.local``, ``hvdlite-run`` (local ranks, and remote ones: their output comes
through ssh's pipes) and ``hvdlite.run(fn)``.

Raw copies. With ``--output-filename DIR``, ``DIR/rank.<r>/stdout`` and ``.../stderr`` get exactly the bytes
the rank wrote (``\\r``, escape sequences, a last line without a newline).

Lines. What reaches the launcher's own output is made of lines, each prefixed with ``[<rank>]<stdout>: `` or
``[<rank>]<stderr>: ``; the rank's bytes are otherwise passed through unchanged (ANSI colours included).

* A line ends at ``\\n`` (or ``\\r\\n``). A line longer than 64 KiB is cut into several.
* A ``\\r`` starts an in-place update, as progress bars (tqdm, ...) draw: the text after it replaces the
  line's content. A ``\\r`` with nothing after it yet changes nothing, so a line's content is the text after
  its latest ``\\r`` that has text. Such a line is an *in-place line*.
* When a stream ends, its unfinished line (a prompt, the last words before exit) is finished as if it ended
  with a newline. An in-place line that ends blank (the program cleared its bar: tqdm(leave=False)) is dropped.

On a terminal (the launcher's stdout or stderr is a TTY, ``TERM`` is not ``dumb``): unfinished lines live in
an area at the bottom of the terminal, one row per rank stream, redrawn in place as their content changes
(:mod:`hvdlite.runner.terminal`); finished lines are written above that area. So one rank's lines are never
spliced into another's unfinished line, every rank's progress bar keeps a single row while it runs, and the
scrollback gets each finished line once, in full. A partial line is shown once it has been unfinished for
0.05 s (most are finished sooner: ``print()`` writes its pieces separately).

Elsewhere (a pipe, a file, a log collector) only whole lines are written: a finished line when it ends, and the
content of an unfinished line, as a line of its own, at most once every ``HVDLITE_PROGRESS_INTERVAL`` seconds
(default 1) while it changes. For a line without ``\\r`` that happens only after it has had no new bytes for
that long, so a line written in pieces is not cut. The final content of every line is always written (once:
not again if exactly that text was the line's last update written).
"""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from typing import IO, Dict, Hashable, List, NamedTuple, Optional, Tuple

from hvdlite.runner.failure_summary import RECORD as RECENT_COLLECTIVES
from hvdlite.runner.terminal import TerminalSink, is_blank, supports_live_area

#: Longest line forwarded as one (longer lines are cut).
MAX_LINE = 64 * 1024
#: Default of HVDLITE_PROGRESS_INTERVAL: seconds between two updates of one unfinished line when the
#: launcher's output is not a terminal.
DEFAULT_PROGRESS_INTERVAL = 1.0
#: How the launcher's own messages start.
LAUNCHER_PREFIX = "hvdlite: "

_READ_SIZE = 64 * 1024


class LineEvent(NamedTuple):
    """A change of a rank stream's current line: its content, whether it had an in-place update, and whether
    it is finished (ended by a newline or by the end of the stream)."""

    content: bytes
    in_place: bool
    finished: bool


class LineSplitter:
    """Turns a rank stream's bytes into :class:`LineEvent` s (the rules are in the module docstring).

    :meth:`feed` returns, for one chunk, every line it finishes and then, if the unfinished line changed, one
    event with its latest content (updates overwritten within the same chunk are not reported).
    """

    def __init__(self, max_line: int = MAX_LINE):
        self.max_line = max_line
        self._content = b""
        self._in_place = False
        self._after_cr = False  # a \r came after the last text: the next text replaces the content

    def feed(self, data: bytes) -> List[LineEvent]:
        events: List[LineEvent] = []
        changed = False
        for index, piece in enumerate(data.split(b"\n")):
            if index:  # a newline came before this piece
                events.append(LineEvent(self._content, self._in_place, True))
                self._content, self._in_place, self._after_cr = b"", False, False
                changed = False
            if not piece:
                continue
            for position, segment in enumerate(piece.split(b"\r") if b"\r" in piece else (piece,)):
                if position:
                    self._after_cr = True
                if segment:
                    self._add_text(segment, events)
                    changed = True
        if changed and self._content:
            events.append(LineEvent(self._content, self._in_place, False))
        return events

    def _add_text(self, text: bytes, events: List[LineEvent]) -> None:
        if self._after_cr:
            self._content, self._in_place, self._after_cr = text, True, False
        else:
            self._content += text
        while len(self._content) > self.max_line:
            events.append(LineEvent(self._content[: self.max_line], self._in_place, True))
            self._content, self._in_place = self._content[self.max_line :], False

    def close(self) -> List[LineEvent]:
        """The end of the stream: finishes the unfinished line, if any."""
        if not self._content:
            return []
        event = LineEvent(self._content, self._in_place, True)
        self._content, self._in_place, self._after_cr = b"", False, False
        return [event]


class _Unfinished:
    def __init__(self, prefix: bytes, now: float):
        self.prefix = prefix
        self.started = now
        self.last_bytes = now  # when its content last changed
        self.written_at: Optional[float] = None
        self.written: Optional[bytes] = None  # the last update written
        self.content = b""
        self.in_place = False


class LineSink:
    """The launcher's stdout or stderr when it is not a terminal: whole lines only, unfinished lines thinned
    to one update every ``interval`` seconds (see the module docstring)."""

    def __init__(self, write, interval: float = DEFAULT_PROGRESS_INTERVAL):
        self._write = write
        self.interval = interval
        self._lines: Dict[Hashable, _Unfinished] = {}

    def progress(self, key: Hashable, prefix: bytes, content: bytes, in_place: bool, now: float) -> None:
        state = self._lines.get(key)
        if state is None:
            state = self._lines[key] = _Unfinished(prefix, now)
        state.content, state.in_place, state.last_bytes = content, in_place, now
        self.tick(key, now)

    def line(self, key: Hashable, prefix: bytes, content: bytes, in_place: bool, now: float) -> None:
        state = self._lines.pop(key, None)
        if in_place and is_blank(content):
            return
        if state is not None and state.written == content:
            return  # this very text was its last update
        self._write(prefix + content + b"\n")

    def message(self, data: bytes, now: float) -> None:
        self._write(data)

    def close(self, key: Hashable, now: float) -> None:
        self._lines.pop(key, None)

    def deadline(self, key: Hashable) -> Optional[float]:
        state = self._lines.get(key)
        if state is None or state.content == state.written or is_blank(state.content):
            return None
        due = (state.started if state.written_at is None else state.written_at) + self.interval
        if not state.in_place:
            due = max(due, state.last_bytes + self.interval)
        return due

    def tick(self, key: Hashable, now: float) -> None:
        due = self.deadline(key)
        if due is None or now < due:
            return
        state = self._lines[key]
        self._write(state.prefix + state.content + b"\n")
        state.written, state.written_at = state.content, now


def rank_prefix(key: Tuple[int, str]) -> bytes:
    """``[<rank>]<stdout>: `` for key ``(rank, "stdout")``."""
    rank, stream_name = key
    return b"[%d]<%s>: " % (rank, stream_name.encode())


def timestamp_prefix(on: bool) -> bytes:
    """horovodrun's --prefix-output-with-timestamp stamp (``time.asctime()``), or nothing."""
    return time.asctime().encode() if on else b""


def progress_interval(environ=None) -> float:
    """HVDLITE_PROGRESS_INTERVAL (seconds, positive), else the default."""
    text = (os.environ if environ is None else environ).get("HVDLITE_PROGRESS_INTERVAL", "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_PROGRESS_INTERVAL
    return value if value > 0 else DEFAULT_PROGRESS_INTERVAL


class _StreamWriter:
    """Collects the bytes a sink writes during one router call and writes them to ``stream`` (a text stream)
    in one go; a stream that is gone is ignored (the ranks' pipes must be drained anyway, or they would
    block)."""

    def __init__(self, stream):
        self.stream = stream
        self._pending: List[bytes] = []

    def __call__(self, data: bytes) -> None:
        self._pending.append(data)

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        try:
            buffer = getattr(self.stream, "buffer", None)
            if buffer is not None:
                self.stream.flush()  # what was written as text so far goes first
                buffer.write(data)
                buffer.flush()
            else:  # e.g. a notebook's stream
                self.stream.write(data.decode("utf-8", errors="replace"))
                self.stream.flush()
        except (OSError, ValueError):
            pass


def _terminal_size(stream):
    def size() -> Tuple[int, int]:
        try:
            columns, lines = os.get_terminal_size(stream.fileno())
        except (OSError, ValueError, AttributeError):
            return 80, 24
        return (columns or 80), (lines or 24)

    return size


class OutputRouter:
    """Sends line events to the sink of the launcher's stdout or stderr, looked up at every call (pytest and
    notebooks swap ``sys.stdout``). Both streams on the same terminal share one :class:`TerminalSink`. All
    calls are serialised by one lock, so that lines from different threads never mix."""

    def __init__(self):
        self.lock = threading.Lock()
        self._sinks: Dict[int, tuple] = {}  # id(stream) -> (stream, sink, writer)
        self._terminals: Dict[tuple, tuple] = {}  # terminal device -> (sink, writer)
        self.timestamps = False  # --prefix-output-with-timestamp: each rank line starts with the time

    def _sink(self, stream_name: str):
        """(sink, writer) of the launcher's stream ``stream_name`` now, or None if there is no such stream."""
        stream = sys.stdout if stream_name == "stdout" else sys.stderr
        if stream is None:
            return None
        entry = self._sinks.get(id(stream))
        if entry is not None and entry[0] is stream:
            return entry[1:]
        # Forget the sinks of streams that are no longer ours (each test of a pytest run has its own).
        self._sinks = {
            ident: entry for ident, entry in self._sinks.items() if entry[0] is sys.stdout or entry[0] is sys.stderr
        }
        found = None
        if supports_live_area(stream):
            try:
                stat = os.fstat(stream.fileno())
                device = (stat.st_dev, stat.st_ino)
            except (OSError, ValueError, AttributeError):
                device = None
            if device is not None:
                found = self._terminals.get(device)
                if found is None:
                    writer = _StreamWriter(stream)
                    found = self._terminals[device] = (TerminalSink(writer, _terminal_size(stream)), writer)
        if found is None:
            writer = _StreamWriter(stream)
            found = (LineSink(writer, progress_interval()), writer)
        self._sinks[id(stream)] = (stream,) + found
        return found

    def _call(self, stream_name: str, method: str, *args) -> Optional[float]:
        with self.lock:
            found = self._sink(stream_name)
            if found is None:
                return None
            sink, writer = found
            try:
                return getattr(sink, method)(*args)
            finally:
                writer.flush()

    def forward(self, key: Tuple[int, str], events: List[LineEvent]) -> None:
        if not events:
            return
        prefix = timestamp_prefix(self.timestamps) + rank_prefix(key)
        with self.lock:
            found = self._sink(key[1])
            if found is None:
                return
            sink, writer = found
            now = time.monotonic()
            try:
                for event in events:
                    if event.finished:
                        RECENT_COLLECTIVES.observe(event.content)
                    handler = sink.line if event.finished else sink.progress
                    handler(key, prefix, event.content, event.in_place, now)
            finally:
                writer.flush()

    def deadline(self, key: Tuple[int, str]) -> Optional[float]:
        return self._call(key[1], "deadline", key)

    def tick(self, key: Tuple[int, str]) -> None:
        self._call(key[1], "tick", key, time.monotonic())

    def close(self, key: Tuple[int, str]) -> None:
        self._call(key[1], "close", key, time.monotonic())

    def message(self, stream_name: str, text: str) -> None:
        """Complete lines of the launcher's own."""
        self._call(stream_name, "message", text.encode("utf-8", errors="replace"), time.monotonic())


#: The one router of this process.
ROUTER = OutputRouter()


def report(message: str) -> None:
    """A message of the launcher itself, on its stderr (``hvdlite: message``)."""
    ROUTER.message("stderr", "%s%s\n" % (LAUNCHER_PREFIX, message))


def pump(
    pipe: IO[bytes], rank: int, stream_name: str, log_path: Optional[str], router: OutputRouter = ROUTER
) -> None:
    """Forwards ``pipe`` (the rank's ``stream_name``, "stdout" or "stderr") until EOF; runs on its own thread.

    Waits for bytes with poll(), waking up when the sink has an update due (a thinned or throttled line).
    """
    key = (rank, stream_name)
    splitter = LineSplitter()
    log = None
    try:
        if log_path is not None:
            try:
                log = open(log_path, "wb")
            except OSError as exc:
                report("cannot write %s: %s" % (log_path, exc))
        fd = pipe.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            deadline = router.deadline(key)
            if deadline is not None:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
                if not poller.poll(wait_ms):
                    router.tick(key)
                    continue
            data = os.read(fd, _READ_SIZE)
            if not data:
                break
            if log is not None:
                try:
                    log.write(data)
                    log.flush()
                except OSError:
                    pass
            router.forward(key, splitter.feed(data))
    except (OSError, ValueError):
        pass  # pipe closed underneath us during shutdown
    finally:
        router.forward(key, splitter.close())
        router.close(key)
        if log is not None:
            log.close()
        try:
            pipe.close()
        except OSError:
            pass
