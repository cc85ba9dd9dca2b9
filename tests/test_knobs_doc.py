"""docs/knobs.md is the generated table of every setting, and stays in step with the code that reads them."""

import os
import re

from hvdlite.runner import knobs_doc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def test_knobs_doc_is_the_generated_one():
    assert _read("docs", "knobs.md") == knobs_doc.render(), (
        "docs/knobs.md is stale: run `python -m hvdlite.runner.knobs_doc > docs/knobs.md`"
    )


def test_the_built_core_reports_every_entry_of_its_source_table():
    source = _read("hvdlite_core", "src", "common", "config.cc")
    table = source[source.index("static const std::vector<Knob> table") : source.index("return table;")]
    in_source = re.findall(r'(?:_knob\(|\{)\s*"([A-Z0-9_]+)"', table)
    assert len(in_source) > 40, in_source
    assert [name for name, _, _ in knobs_doc.core_settings()] == in_source
    assert all(meaning for _, _, meaning in knobs_doc.core_settings())


def test_every_variable_the_python_code_reads_is_documented():
    documented = knobs_doc.documented_variables()
    read = set()
    for package in ("hvdlite", "launcher"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    text = _read(folder, name)
                    read.update(re.findall(r"HVDLITE_([A-Z0-9_]*[A-Z0-9])\b", text))
                    read.update(re.findall(r'(?:env_value\(\w+, |_env\()"([A-Z0-9_]+)"', text))
    missing = sorted(read - set(documented))
    assert not missing, f"read by the code but not in docs/knobs.md: {missing}"


def test_every_horovodrun_flag_is_either_a_flag_or_refused_with_a_reason():
    doc = _read("docs", "knobs.md")
    for flag in (
        "--config-file",
        "--elastic-timeout",
        "--reset-limit",
        "--binding-args",
        "--prefix-output-with-timestamp",
        "--autotune",
        "--slots",
        "--min-num-proc",
        "--max-num-proc",
        "--tcp",
        "--hierarchical-allgather",
        "--timeline-mark-cycles",
        "--no-stall-check",
        "--stall-check-warning-time-seconds",
        "--stall-check-shutdown-time-seconds",
        "--mpi-threads-disable",
        "--num-nccl-streams",
        "--thread-affinity",
        "--gloo-timeout-seconds",
        "--log-without-timestamp",
        "--jsrun",
        "--network-interface",
        "--output-filename",
        "--disable-cache",
        "--log-level",
    ):
        assert "`%s`" % flag in doc, flag
