"""Programs that multi-process tests run live in modules under tests/jobs/, where they are linted, formatted and
read as code, and where the job harness explains a failed assertion as pytest does: the Python source still held
in string literals across tests/*.py stays under a small budget (a few launcher scripts of a handful of lines)."""

from __future__ import annotations

import ast
import glob
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
BUDGET = 500
CODE_MARKERS = ("import ", "hvd.", "print(", "def ", " = ")


def program_lines(source: str) -> int:
    """Lines of string literals (plain or f-strings) of three lines or more that read as Python, docstrings
    left out."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    lines = source.splitlines()
    total = 0
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            span = node.end_lineno - node.lineno
            if span >= 2 and any(m in "\n".join(lines[node.lineno - 1 : node.end_lineno]) for m in CODE_MARKERS):
                total += span
    return total


def test_the_counter_sees_a_program_and_not_a_docstring():
    source = (
        'def test_x():\n    """Docstring with import and a = b\n    over lines\n    """\n'
        '    run("""\nimport os\nx = 1\nprint(x)\n""")\n'
    )
    assert program_lines(source) == 4


def test_string_programs_stay_within_the_budget():
    counts = {}
    for path in sorted(glob.glob(os.path.join(TESTS, "*.py"))):
        with open(path, encoding="utf-8") as f:
            counts[os.path.basename(path)] = program_lines(f.read())
    total = sum(counts.values())
    largest = sorted(counts.items(), key=lambda item: -item[1])[:5]
    assert total <= BUDGET, "%d lines of programs in strings (largest: %s): move them to tests/jobs/" % (
        total,
        largest,
    )
