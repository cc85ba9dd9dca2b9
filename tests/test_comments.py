"""Comments say why; the figures live in docs/benchmarks.md and the history in git. A comment that quotes a
measured ratio, names a processor, points at the benchmark journal or cites an issue number goes stale the day
the code or the machine changes, so none may creep back into the sources."""

from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("hvdlite_core", "hvdlite", "launcher")
NOTEBOOK = re.compile(r"benchmarks\.md|EPYC|Xeon|[0-9]\.[0-9]+x|issue [0-9]")


def source_files():
    for folder in FOLDERS:
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith((".cc", ".h", ".py")):
                    yield os.path.join(root, name)


def test_no_figures_machines_or_issue_numbers_in_the_sources():
    found = []
    for path in source_files():
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if NOTEBOOK.search(line):
                    found.append("%s:%d: %s" % (os.path.relpath(path, REPO), number, line.strip()))
    assert not found, "lab-notebook text in the sources:\n" + "\n".join(found)
