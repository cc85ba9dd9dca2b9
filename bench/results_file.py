"""A benchmark's current result: `<out-dir>/<name>.json` holds what was run (the command, the machine, the date)
and the figures. The benchmark module's `render(data)` turns the figures into its markdown table; the benchmark
prints it and writes it beside the JSON as `<name>.md` (not kept in git), and docs/benchmarks.md shows it through
bench/page.py, which calls the same function on the kept JSON."""

import datetime
import json
import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine_line():
    """The processor, which decides much of the result (the same code ranks differently against Open MPI on a
    Xeon and on an EPYC): 'model name' from /proc/cpuinfo and the core count."""
    model = "unknown processor"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def command_line(argv=None):
    """The command as a reader would type it from the checkout's root: `python bench/<script> <arguments>`."""
    argv = list(sys.argv if argv is None else argv)
    script = os.path.relpath(os.path.abspath(argv[0]), ROOT)
    return shlex.join(["python", script] + argv[1:])


def heading(record):
    """The line above a table: what ran, where and when."""
    return f"`{record['command']}` on {record['machine']}, {record['date']}"


def save(out_dir, name, data, render):
    """Writes <out_dir>/<name>.json and <name>.md, prints the table, and returns the record."""
    record = {
        "benchmark": os.path.splitext(os.path.basename(sys.argv[0]))[0],
        "command": command_line(),
        "machine": machine_line(),
        "date": datetime.date.today().isoformat(),
        "data": data,
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    text = heading(record) + "\n\n" + render(data)
    with open(os.path.join(out_dir, name + ".md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return record


def load(path):
    with open(path) as f:
        return json.load(f)


def times(spread):
    """'1.90x (1.64x)': a ratio's median round and, in brackets, its worst."""
    return f"{spread['median']:.2f}x ({spread['worst']:.2f}x)"
