"""Fast tests of the launcher's output forwarding pieces (launcher/output.py, terminal.py): the line
splitter, the thinning of progress lines for pipes, and the terminal's live area, whose bytes are played in
a real terminal emulator (tmux) and read back from its screen."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from launcher_helpers import TmuxPane

from hvdlite.runner.output import LineEvent, LineSink, LineSplitter, progress_interval
from hvdlite.runner.terminal import REFRESH_SECONDS, TerminalSink, fit_to_width, is_blank

P0 = b"[0]<stderr>: "
P1 = b"[1]<stderr>: "


def expected_lines(data: bytes):
    """The finished lines of ``data`` per the documented rules, written independently of the splitter: a line
    ends at \\n (and at the end of the stream if it has text); its content is its latest \\r segment with text;
    it is in place if text came after a \\r."""
    *finished, rest = data.split(b"\n")
    events = []
    for line in finished + [rest]:
        with_text = [(index, segment) for index, segment in enumerate(line.split(b"\r")) if segment]
        content = with_text[-1][1] if with_text else b""
        in_place = any(index > 0 for index, _ in with_text)
        events.append(LineEvent(content, in_place, True))
    if not events[-1].content:
        events.pop()  # nothing after the last newline
    return events


def chunked(data: bytes, cuts):
    points = sorted({cut % (len(data) + 1) for cut in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@settings(max_examples=300, deadline=None)
@given(
    data=st.lists(
        st.sampled_from([b"a", b"bc", b" ", b"\r", b"\n", b"\r\n", b"\x1b[31m", b"\xe2\x96\x88"]), max_size=40
    ).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=12),
)
def test_splitter_finishes_lines_as_documented_whatever_the_chunks(data, cuts):
    splitter = LineSplitter()
    events = []
    for chunk in chunked(data, cuts):
        events += splitter.feed(chunk)
    events += splitter.close()
    assert [event for event in events if event.finished] == expected_lines(data)
    for event in events:
        if not event.finished:
            assert event.content  # an update always shows something
            assert b"\r" not in event.content and b"\n" not in event.content


def test_splitter_reports_the_latest_state_of_an_unfinished_line():
    splitter = LineSplitter()
    assert splitter.feed(b"\r 10%") == [LineEvent(b" 10%", True, False)]
    assert splitter.feed(b"\r 20%\r 30%") == [LineEvent(b" 30%", True, False)]
    assert splitter.feed(b"\r") == []  # the cursor moved, nothing changed yet
    assert splitter.feed(b"\n") == [LineEvent(b" 30%", True, True)]  # "\r\n" split over two reads
    assert splitter.feed(b"Password: ") == [LineEvent(b"Password: ", False, False)]
    assert splitter.close() == [LineEvent(b"Password: ", False, True)]
    assert splitter.close() == []


def test_splitter_cuts_very_long_lines():
    splitter = LineSplitter(max_line=4)
    assert splitter.feed(b"abcdefghij\nxy") == [
        LineEvent(b"abcd", False, True),
        LineEvent(b"efgh", False, True),
        LineEvent(b"ij", False, True),
        LineEvent(b"xy", False, False),
    ]


class Recorder:
    def __init__(self):
        self.data = b""

    def __call__(self, data: bytes) -> None:
        self.data += data

    def lines(self):
        return self.data.decode().splitlines()


def drive(sink, key, prefix, splitter, chunks_at):
    """Feeds (time, bytes) chunks to ``sink`` as a pump thread would, ticking whenever a deadline passes."""
    now = 0.0
    for at, chunk in chunks_at:
        while True:
            due = sink.deadline(key)
            if due is None or due > at:
                break
            sink.tick(key, due)
        now = at
        for event in splitter.feed(chunk):
            (sink.line if event.finished else sink.progress)(key, prefix, event.content, event.in_place, now)
    for event in splitter.close():
        sink.line(key, prefix, event.content, event.in_place, now)
    sink.close(key, now)


def test_pipes_get_progress_thinned_to_one_line_per_interval_and_the_final_state():
    out = Recorder()
    sink = LineSink(out, interval=1.0)
    updates = [(step * 0.1, b"\rstep %d/30" % step) for step in range(31)]
    drive(sink, (0, "stderr"), P0, LineSplitter(), updates + [(3.05, b"\n")])
    # Each second the state of that moment, then the final state.
    assert out.lines() == [
        "[0]<stderr>: step 9/30",
        "[0]<stderr>: step 19/30",
        "[0]<stderr>: step 29/30",
        "[0]<stderr>: step 30/30",
    ]


def test_pipes_get_a_stalled_update_and_a_partial_line_once_idle():
    out = Recorder()
    sink = LineSink(out, interval=1.0)
    drive(
        sink,
        (0, "stderr"),
        P0,
        LineSplitter(),
        [
            (0.0, b"\rloading 1"),
            (0.2, b"\rloading 2"),
            (5.0, b"\rloading 3\n"),  # stalled for 4.8 s
            (5.1, b"Epoch 1"),
            (5.5, b" ..."),
            (9.0, b" done\n"),  # a partial line, idle 3.5 s
            (9.1, b"quick"),
            (9.2, b" line\n"),  # finished before the interval
            (9.3, b"\r\x1b[31mred 1"),
            (9.4, b"\r\x1b[31mred 2\x1b[0m\n"),
            (9.5, b"\r 50%"),
            (9.6, b"\r    \r"),  # a cleared bar: dropped
            (9.7, b"last words"),
        ],
    )
    assert out.lines() == [
        "[0]<stderr>: loading 2",
        "[0]<stderr>: loading 3",
        "[0]<stderr>: Epoch 1 ...",
        "[0]<stderr>: Epoch 1 ... done",
        "[0]<stderr>: quick line",
        "[0]<stderr>: \x1b[31mred 2\x1b[0m",
        "[0]<stderr>: last words",
    ]


def test_pipes_do_not_repeat_a_final_state_already_written():
    out = Recorder()
    sink = LineSink(out, interval=1.0)
    drive(sink, (0, "stderr"), P0, LineSplitter(), [(0.0, b"\r 100%"), (2.0, b"\n"), (2.1, b"\n")])
    assert out.lines() == ["[0]<stderr>:  100%", "[0]<stderr>: "]  # the empty line is a line of its own


def test_progress_interval_from_environment():
    assert progress_interval({}) == 1.0
    assert progress_interval({"HVDLITE_PROGRESS_INTERVAL": "5"}) == 5.0
    assert progress_interval({"HVDLITE_PROGRESS_INTERVAL": "0.25"}) == 0.25
    for bad in ("0", "-1", "soon"):
        assert progress_interval({"HVDLITE_PROGRESS_INTERVAL": bad}) == 1.0


def test_fit_to_width_and_blank():
    assert fit_to_width(b"abcdef", 4) == b"abcd\x1b[0m"
    assert fit_to_width(b"ab", 4) == b"ab"
    assert fit_to_width(b"\x1b[31mabcdef\x1b[0m", 3) == b"\x1b[31mabc\x1b[0m"
    assert fit_to_width(b"\x1b[31mab\x1b[0m", 3) == b"\x1b[31mab\x1b[0m\x1b[0m"
    assert fit_to_width("\u2588\u2588\u2588".encode(), 2) == "\u2588\u2588\x1b[0m".encode()
    assert fit_to_width("\u6f22\u5b57x".encode(), 3) == "\u6f22\x1b[0m".encode()  # wide characters
    assert fit_to_width(b"a\tb\x08c", 20) == b"a       bc"
    assert is_blank(b"  \x1b[2K \x1b[0m") and not is_blank(b" x ")


def play_in_terminal(data: bytes, columns: int, lines: int, tmp_path):
    """Shows ``data`` in a tmux pane; returns (visible lines, visible and scrolled-off lines)."""
    os.makedirs(str(tmp_path), exist_ok=True)
    path = os.path.join(str(tmp_path), "screen.bytes")
    with open(path, "wb") as f:
        f.write(data)
    pane = TmuxPane("cat %s" % path, columns=columns, lines=lines)
    try:
        assert pane.exit_status(timeout=20) == 0
        return pane.screen(), pane.screen(scrollback=True)
    finally:
        pane.close()


def test_terminal_live_area_in_a_real_terminal(tmp_path):
    out = Recorder()
    sink = TerminalSink(out, size=lambda: (60, 20))
    now = 0.0
    for step in range(1, 21):
        now += REFRESH_SECONDS
        sink.progress((0, "stderr"), P0, b" %d%%|\x1b[32m%s\x1b[0m" % (step * 5, b"#" * step), True, now)
        sink.progress((1, "stderr"), P1, b"step %d of 20" % step, True, now)
        if step % 5 == 0:
            sink.line((1, "stdout"), b"[1]<stdout>: ", b"checkpoint %d" % step, False, now)
        if step == 10:
            sink.message(b"hvdlite: a message of the launcher\n", now)
            sink.line((2, "stdout"), b"[2]<stdout>: ", b"x" * 100, False, now)  # wraps: it is a plain line
    assert b"\x1b[J" not in out.data  # tmux would push the whole screen into the scrollback
    mid_screen, _ = play_in_terminal(out.data, 60, 20, tmp_path / "mid")
    assert mid_screen == [
        "[1]<stdout>: checkpoint 5",
        "[1]<stdout>: checkpoint 10",
        "hvdlite: a message of the launcher",
        "[2]<stdout>: " + "x" * 47,
        "x" * 53,
        "[1]<stdout>: checkpoint 15",
        "[1]<stdout>: checkpoint 20",
        "[0]<stderr>:  100%|" + "#" * 20,
        "[1]<stderr>: step 20 of 20",
    ]
    sink.line((0, "stderr"), P0, b" 100%|" + b"#" * 50, True, now)  # the final state is written in full
    sink.line((1, "stderr"), P1, b"    ", True, now)  # cleared by its program: dropped
    screen, everything = play_in_terminal(out.data, 60, 20, tmp_path / "end")
    assert screen == mid_screen[:7] + ["[0]<stderr>:  100%|" + "#" * 41, "#" * 9]
    assert everything == screen


def test_terminal_shows_partial_lines_late_and_cuts_rows(tmp_path):
    out = Recorder()
    sink = TerminalSink(out, size=lambda: (30, 5))
    key = (0, "stdout")
    sink.progress(key, b"[0]<stdout>: ", b"rank", False, 0.0)
    assert sink.deadline(key) == REFRESH_SECONDS
    sink.line(key, b"[0]<stdout>: ", b"rank 0 ready", False, 0.01)
    assert out.data == b"[0]<stdout>: rank 0 ready\n"  # finished in time: no escape sequence at all
    sink.progress(key, b"[0]<stdout>: ", b"Continue? [y/N] ", False, 1.0)
    sink.tick(key, 1.0 + REFRESH_SECONDS)
    for rank in range(1, 7):  # more unfinished lines than the 5-line terminal can show
        sink.progress((rank, "stderr"), b"[%d]<stderr>: " % rank, b"%d" % rank * 40, True, 2.0)
    screen, everything = play_in_terminal(out.data, 30, 5, tmp_path)
    # Rows are cut to 29 columns; 3 rows, the summary and the cursor's line fill the 5 lines.
    assert screen == [
        "[0]<stdout>: Continue? [y/N]",
        "[1]<stderr>: " + "1" * 16,
        "[2]<stderr>: " + "2" * 16,
        "hvdlite: 4 more unfinished li",
    ]
    assert everything == ["[0]<stdout>: rank 0 ready"] + screen


def test_failure_summary_keeps_each_ranks_latest_record_and_names_the_silent_ones():
    from hvdlite.runner.failure_summary import RecentCollectives

    record = RecentCollectives()
    assert record.summary(range(3)) == []  # nothing printed: no summary at all
    record.observe(
        b"hvdlite.common.errors.PeerError: rank 2 (h:1) exited; last 2 collectives on rank 0, oldest "
        b"first: allreduce 'a' (4 B, done), allreduce 'b' (8 B, pending)\r"
    )
    record.observe(b"last 1 collectives on rank 1, oldest first: broadcast 'w' (1 KB, done)")
    record.observe(b"last 1 collectives on rank 1, oldest first: allgather 'x' (2 KB, pending)")  # a later error
    record.observe(b"an unrelated line that mentions collectives on rank nothing")
    assert record.summary(range(3)) == [
        "where each rank was (its last collectives, oldest first, from its error):",
        "  rank 0: allreduce 'a' (4 B, done), allreduce 'b' (8 B, pending)",
        "  rank 1: allgather 'x' (2 KB, pending)",
        "  rank 2: no record printed (it stopped first, or failed outside a collective)",
    ]
    record.clear()
    assert record.summary(range(3)) == []
