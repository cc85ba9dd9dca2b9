"""The ranks' output through the launcher, end to end: tqdm progress bars on a terminal (a tmux pane) and
through pipes, partial lines, colours, and the raw streams of --output-filename."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from launcher_helpers import TmuxPane, hvdlite_run, run_launcher, wait_until, write_script
from multiproc import REPO_ROOT, job_env

PY = sys.executable

# Two ranks each run a tqdm bar (updated at every step) and rank 1 prints ordinary lines meanwhile. Half way
# both stop until the test creates the file argv[1], so that the test can look at the terminal mid-run.
TQDM_SCRIPT = """
import os, sys, time
from tqdm import tqdm

rank = int(os.environ["HVDLITE_RANK"])
go = sys.argv[1]
total = 40
with tqdm(total=total, desc="bar%d" % rank, mininterval=0, miniters=1, ncols=80) as bar:
    for step in range(total):
        time.sleep(0.01)
        bar.update(1)
        if rank == 1 and step % 10 == 0:
            print("rank 1 at step", step, flush=True)
        if step == total // 2 - 1:
            open("%s.half%d" % (go, rank), "w").close()
            while not os.path.exists(go):
                time.sleep(0.02)
print("done", rank, flush=True)
"""


def bar_lines(lines, rank):
    return [line for line in lines if line.startswith("[%d]<stderr>: bar%d:" % (rank, rank))]


@pytest.mark.timeout(120)
def test_progress_bars_update_in_place_on_a_terminal(tmp_path):
    go = str(tmp_path / "go")
    script = write_script(tmp_path, TQDM_SCRIPT)
    command = " ".join(shlex.quote(arg) for arg in [hvdlite_run(), "-np", "2", "--timeout", "90", PY, script, go])
    pane = TmuxPane("cd %s && %s" % (shlex.quote(REPO_ROOT), command), columns=160, lines=40)
    try:
        # Half way: each rank's bar is one row showing its current state (20 of 40), drawn while the line
        # is still unfinished; rank 1's ordinary lines are above the bars, whole.
        def both_half_way(lines):
            return all(len(bar_lines(lines, rank)) == 1 and " 20/40 " in bar_lines(lines, rank)[0] for rank in (0, 1))

        assert wait_until(lambda: all(os.path.exists("%s.half%d" % (go, rank)) for rank in (0, 1)), timeout=60), (
            "\n".join(pane.screen())
        )
        mid = pane.wait_for_screen(both_half_way, timeout=20)
        everything = pane.screen(scrollback=True)
        assert [line for line in everything if "<stderr>" in line] == bar_lines(mid, 0) + bar_lines(mid, 1) or [
            line for line in everything if "<stderr>" in line
        ] == bar_lines(mid, 1) + bar_lines(mid, 0), "\n".join(everything)
        assert "[1]<stdout>: rank 1 at step 10" in mid, "\n".join(mid)
        assert mid.index("[1]<stdout>: rank 1 at step 10") < mid.index(bar_lines(mid, 1)[0])

        open(go, "w").close()
        assert pane.exit_status(timeout=60) == 0, "\n".join(pane.screen(scrollback=True))
        final = pane.screen(scrollback=True)
    finally:
        open(go, "w").close()  # never leave the ranks waiting
        pane.close()
    # At the end: one line per bar, its final state, among whole lines; nothing else of the bars anywhere.
    for rank in (0, 1):
        bars = bar_lines(final, rank)
        assert len(bars) == 1, "\n".join(final)
        assert re.search(r"bar%d: 100%%\|█+\| 40/40 \[" % rank, bars[0]), bars[0]
        assert "[%d]<stdout>: done %d" % (rank, rank) in final
    assert [line for line in final if "rank 1 at step" in line] == [
        "[1]<stdout>: rank 1 at step %d" % step for step in (0, 10, 20, 30)
    ]
    for line in final:
        assert re.match(r"\[[01]\]<std(out|err)>: ", line), "\n".join(final)
    assert len(final) == 2 + 4 + 2, "\n".join(final)


@pytest.mark.timeout(120)
def test_progress_through_a_pipe_is_thinned_to_whole_lines(tmp_path):
    script = write_script(
        tmp_path,
        """
        import os, sys, time
        from tqdm import tqdm

        rank = int(os.environ["HVDLITE_RANK"])
        start = time.monotonic()
        for _ in tqdm(range(150), desc="bar%d" % rank, mininterval=0, miniters=1):
            time.sleep(0.02)
        print("updates took %.2f s" % (time.monotonic() - start), file=sys.stderr, flush=True)
        print("loading... ", end="", flush=True)   # a partial line, finished 1.5 s later
        time.sleep(1.5)
        print("\\x1b[32mok\\x1b[0m", flush=True)
        print("Continue? [y/N] ", end="", flush=True)   # the last words, without a newline
        """,
    )
    result = run_launcher(["-np", "2", PY, script], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "\r" not in result.stdout + result.stderr
    for rank in (0, 1):
        stderr = [line for line in result.stderr.splitlines() if line.startswith("[%d]" % rank)]
        bars = bar_lines(stderr, rank)
        took = float(re.search(r"updates took ([\d.]+) s", "\n".join(stderr)).group(1))
        # 151 updates of 150 steps: at most one line per second (the default interval) plus the final state;
        # at least one while the bar ran (it ran for 3 s or more), then the final state, once.
        assert 2 <= len(bars) <= took / 1.0 + 2, "\n".join(bars)
        assert all(" 100%|" not in line for line in bars[:-1]) and " 150/150 " in bars[-1], "\n".join(bars)
        counts = [int(re.search(r" (\d+)/150 ", line).group(1)) for line in bars]
        assert counts == sorted(counts) and 0 < counts[0] < 150, bars
        assert stderr == bars + ["[%d]<stderr>: updates took %.2f s" % (rank, took)], "\n".join(stderr)
        stdout = [line for line in result.stdout.splitlines() if line.startswith("[%d]" % rank)]
        assert stdout == [
            "[%d]<stdout>: loading... " % rank,  # once idle for a second
            "[%d]<stdout>: loading... \x1b[32mok\x1b[0m" % rank,
            "[%d]<stdout>: Continue? [y/N] " % rank,
        ], stdout


@pytest.mark.timeout(90)
def test_output_files_hold_the_raw_streams(tmp_path):
    # Through the minimal starter this time (the same forwarding code as hvdlite-run).
    logs = tmp_path / "logs"
    script = write_script(
        tmp_path,
        """
        import os, sys
        from tqdm import tqdm

        rank = int(os.environ["HVDLITE_RANK"])
        written = open(sys.argv[1] + ".%d" % rank, "w", encoding="utf-8")

        class Tee:  # what tqdm writes, also kept by the rank itself
            def write(self, text):
                written.write(text)
                sys.stderr.write(text)
            def flush(self):
                written.flush()
                sys.stderr.flush()

        for _ in tqdm(range(30), desc="bar", mininterval=0, miniters=1, file=Tee()):
            pass
        Tee().write("\\x1b[31mred\\x1b[0m and a last line without newline")
        print("out\\r\\nwith crlf", end="")
        """,
    )
    copy = str(tmp_path / "written")
    result = subprocess.run(
        [
            PY,
            "-m",
            "hvdlite.runner.local",
            "-np",
            "2",
            "--output-filename",
            str(logs),
            "--timeout",
            "60",
            "--",
            PY,
            script,
            copy,
        ],
        cwd=REPO_ROOT,
        env=job_env(),
        capture_output=True,
        timeout=80,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in (0, 1):
        raw = (logs / ("rank.%d" % rank) / "stderr").read_bytes()
        with open("%s.%d" % (copy, rank), "rb") as f:
            assert raw == f.read()
        assert raw.count(b"\r") >= 31 and raw.endswith(b"without newline")
        assert (logs / ("rank.%d" % rank) / "stdout").read_bytes() == b"out\r\nwith crlf"
        forwarded = [line for line in result.stderr.decode().splitlines() if line.startswith("[%d]" % rank)]
        assert forwarded[-2].startswith("[%d]<stderr>: bar: 100%%|" % rank), forwarded
        assert forwarded[-1] == "[%d]<stderr>: \x1b[31mred\x1b[0m and a last line without newline" % rank
        assert [line for line in result.stdout.decode().split("\n") if line.startswith("[%d]" % rank)] == [
            "[%d]<stdout>: out" % rank,
            "[%d]<stdout>: with crlf" % rank,
        ]
