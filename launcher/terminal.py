"""The launcher's output on a terminal: finished lines scroll up, unfinished ones stay in a live area.

The live area is the bottom of the terminal: one row per rank stream that has an unfinished line (a progress
bar being redrawn with ``\\r``, or a partial line such as a prompt), in order of first appearance, each shown
as ``[<rank>]<stream>: <current content>`` and redrawn in place when the content changes. A finished line is
written above the live area, in full, like any other output, and its row goes away. The forwarding rules
(what a line's content is, when it is finished) are in :mod:`hvdlite.runner.output`.

Screen bookkeeping: after every write the cursor is at column 0 of the line just below the live area, so the
live area is always the ``drawn_rows`` lines above the cursor. To keep that count exact each row is cut to the
terminal's width (it never wraps), and when there are more unfinished lines than the terminal has lines, the
last row says how many are not shown. Escape sequences used: cursor up/down (CSI A/B) and erase line
(CSI 2K), which every terminal emulator in use supports; ``TERM=dumb`` gets the plain line mode instead (see
:func:`supports_live_area`).
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Callable, Dict, Hashable, List, Optional, Tuple

#: Shortest time between two redraws of one row: enough to follow any progress bar, while a rank that
#: rewrites its line thousands of times a second does not flood the terminal.
REFRESH_SECONDS = 0.05

_ESCAPE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"  # CSI: colours (SGR), cursor movement, erasing
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: window title, hyperlinks
    r"|[@-Z\\-_])"
)  # other two-byte sequences
_ESCAPE_BYTES = re.compile(_ESCAPE.pattern.encode())
_RESET = "\x1b[0m"


def is_blank(content: bytes) -> bool:
    """True if ``content`` shows nothing: only white space and escape sequences."""
    return not _ESCAPE_BYTES.sub(b"", content).strip()


def supports_live_area(stream) -> bool:
    """True if ``stream`` is a terminal that can move its cursor."""
    try:
        if not stream.isatty():
            return False
    except (AttributeError, ValueError, OSError):
        return False
    return os.environ.get("TERM", "") != "dumb"


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def fit_to_width(data: bytes, width: int) -> bytes:
    """``data`` as one terminal row of at most ``width`` columns.

    Escape sequences are kept (they take no room), tabs become spaces, other control characters are
    dropped (they would move the cursor out of the row). If anything was cut, or the row changed colours,
    it ends with a colour reset so that the next row starts plain.
    """
    text = data.decode("utf-8", errors="replace")
    out: List[str] = []
    used = 0
    styled = False
    position = 0
    for match in _ESCAPE.finditer(text + "\x1b[m"):  # the sentinel flushes the text after the last escape
        for char in text[position : match.start()]:
            if char == "\t":
                spaces = min(8 - used % 8, width - used)
                out.append(" " * spaces)
                used += spaces
                continue
            if ord(char) < 0x20 or ord(char) == 0x7F:
                continue
            char_width = _char_width(char)
            if used + char_width > width:
                return ("".join(out) + _RESET).encode()
            out.append(char)
            used += char_width
        if match.end() <= len(text):
            out.append(match.group())
            styled = True
        position = match.end()
    return ("".join(out) + (_RESET if styled else "")).encode()


class _Row:
    def __init__(self, prefix: bytes, content: bytes, now: float):
        self.prefix = prefix
        self.content = content
        self.visible = False  # in the live area (drawn at every repaint)
        self.drawn: Optional[bytes] = None  # content now on the screen
        self.changed_at = now  # last redraw, or when the row appeared


class TerminalSink:
    """Everything the launcher writes to one terminal (its stdout and stderr, when both are that terminal).

    ``write`` gets raw bytes. Methods take the current time (``time.monotonic()``) so that tests can drive
    them; the caller (:class:`hvdlite.runner.output.OutputRouter`) serialises all calls.
    """

    def __init__(self, write: Callable[[bytes], None], size: Callable[[], Tuple[int, int]] = lambda: (80, 24)):
        self._write = write
        self._size = size  # () -> (columns, lines)
        self._rows: Dict[Hashable, _Row] = {}  # every unfinished line, in order of appearance
        self._layout: List[Hashable] = []  # keys of the rows on the screen, top to bottom
        self._drawn_rows = 0  # lines the live area takes (rows plus the summary line)

    # -- what the router calls ------------------------------------------------------------------------

    def progress(self, key: Hashable, prefix: bytes, content: bytes, in_place: bool, now: float) -> None:
        """The unfinished line of ``key`` now shows ``content``."""
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row(prefix, content, now)
            # A progress bar is shown at once. A partial line waits one refresh period (see tick()): most
            # are finished by then (print() writes its pieces separately), and a line finished before it
            # is shown is written like any other, without a single escape sequence.
            if in_place:
                row.visible = True
                self._repaint(b"", now)
            return
        row.content = content
        if row.visible and now - row.changed_at >= REFRESH_SECONDS:
            self._redraw(key, now)

    def line(self, key: Hashable, prefix: bytes, content: bytes, in_place: bool, now: float) -> None:
        """``key``'s line is finished with ``content``: write it above the live area, drop its row.

        An in-place line that ends blank was cleared by its program (tqdm(leave=False)): nothing is written.
        """
        row = self._rows.pop(key, None)
        if in_place and is_blank(content):
            if row is not None and row.visible:
                self._repaint(b"", now)
            return
        self.message(prefix + content + b"\n", now)

    def message(self, data: bytes, now: float) -> None:
        """Complete lines (each ending with a newline) to write above the live area."""
        if self._drawn_rows == 0:
            self._write(data)  # no live area on the screen: a plain write
        else:
            self._repaint(data, now)

    def close(self, key: Hashable, now: float) -> None:
        """``key``'s stream ended (its last line was already passed to :meth:`line`)."""
        row = self._rows.pop(key, None)
        if row is not None and row.visible:
            self._repaint(b"", now)

    def deadline(self, key: Hashable) -> Optional[float]:
        """When :meth:`tick` should next be called for ``key`` (None: not needed)."""
        row = self._rows.get(key)
        if row is None or (row.visible and row.drawn == row.content):
            return None
        return row.changed_at + REFRESH_SECONDS

    def tick(self, key: Hashable, now: float) -> None:
        deadline = self.deadline(key)
        if deadline is None or now < deadline:
            return
        row = self._rows[key]
        if row.visible:
            self._redraw(key, now)
        else:
            row.visible = True  # a partial line that stayed unfinished: show it
            self._repaint(b"", now)

    # -- drawing --------------------------------------------------------------------------------------

    def _render(self, row: _Row, columns: int) -> bytes:
        # One column less than the width: a row that fills the last column leaves some terminals waiting
        # to wrap, and the next newline would then add an empty line.
        return b"\r\x1b[2K" + fit_to_width(row.prefix + row.content, max(1, columns - 1))

    def _repaint(self, above: bytes, now: float) -> None:
        """Erase the live area, write ``above`` (finished lines), draw the live area again below it."""
        columns, lines = self._size()
        out = bytearray()
        if self._drawn_rows:
            # Erase the rows one by one (not "erase below", which tmux and some terminals turn into
            # scrolling the whole screen into the scrollback when the live area starts at the top).
            out += b"\r\x1b[%dA" % self._drawn_rows + b"\x1b[2K\n" * self._drawn_rows
            out += b"\x1b[%dA" % self._drawn_rows
        out += above
        keys = [key for key, row in self._rows.items() if row.visible]
        room = max(1, lines - 1)  # the cursor's line below the live area needs one
        hidden = 0
        if len(keys) > room:
            hidden = len(keys) - (room - 1)
            for key in keys[room - 1 :]:
                self._rows[key].drawn = self._rows[key].content  # nothing to redraw until shown
            keys = keys[: room - 1]
        for key in keys:
            row = self._rows[key]
            out += self._render(row, columns) + b"\n"
            row.drawn = row.content
            row.changed_at = now
        if hidden:
            summary = b"hvdlite: %d more unfinished lines not shown" % hidden
            out += b"\r\x1b[2K" + fit_to_width(summary, max(1, columns - 1)) + b"\n"
        self._layout = keys
        self._drawn_rows = len(keys) + (1 if hidden else 0)
        self._write(bytes(out))

    def _redraw(self, key: Hashable, now: float) -> None:
        """Redraw one row in place (the others stay as they are)."""
        row = self._rows[key]
        if key in self._layout:
            up = self._drawn_rows - self._layout.index(key)  # >= 1: the cursor is below the last row
            columns, _ = self._size()
            self._write(b"\x1b[%dA" % up + self._render(row, columns) + b"\r\x1b[%dB" % up)
        row.drawn = row.content  # a row beyond the screen's room is counted in the summary line only
        row.changed_at = now
