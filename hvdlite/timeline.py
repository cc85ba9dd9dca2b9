"""Read, check and summarise an hvdlite timeline (the Chrome trace that ``HVDLITE_TIMELINE`` or
``hvd.start_timeline`` makes rank 0 write).

    python -m hvdlite.timeline timeline.json            # per-tensor table, busiest first
    python -m hvdlite.timeline timeline.json --top 5
    python -m hvdlite.timeline timeline.json --check    # only check the format (exit status 1 on problems)

The trace opens in Perfetto (ui.perfetto.dev) and chrome://tracing. ``check`` holds a trace to the rules of
the Trace Event Format that those viewers rely on, so a trace that passes here loads there: every event is an
object with a known phase; timed events carry numeric, non-negative ``ts`` and integer ``pid``/``tid``;
within each (pid, tid) row, begin and end events nest and never end before they begin. (Perfetto's own trace
processor would be the natural checker, but its Python package downloads a native binary at first use.)

A file cut short, by a process that was killed while writing, is read as Chrome reads it: the JSON array may
lack its closing bracket.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Dict, Iterable, List, Tuple, Union

# Phases of the Trace Event Format (duration, complete, instant, counter, async, flow, sample, object,
# metadata, memory dump, mark, clock sync, context). hvdlite writes B, E, i and M.
KNOWN_PHASES = set("BEXiIcbnestfPNODMVvRC(),") - {","}
METADATA_NAMES = {"process_name", "process_sort_index", "process_labels", "thread_name", "thread_sort_index"}


def load(path: str) -> List[dict]:
    """The trace's events, from a JSON array (closed or cut short) or an object with ``traceEvents``."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        if not text.lstrip().startswith("["):
            raise
        # Cut short: keep the complete events (the writer puts one per line) and close the array.
        complete = text[: text.rfind("\n")] if not text.rstrip().endswith("}") else text
        data = json.loads(complete.rstrip().rstrip(",") + "]")
    if isinstance(data, dict):
        if "traceEvents" not in data:
            raise ValueError(f"{path}: a JSON object without 'traceEvents' is not a Chrome trace")
        data = data["traceEvents"]
    if not isinstance(data, list):
        raise ValueError(f"{path}: a Chrome trace is a JSON array of events, found {type(data).__name__}")
    return data


def check(events: Iterable[dict]) -> List[str]:
    """Problems that would make Perfetto or chrome://tracing reject or misdraw the trace; empty when none."""
    problems: List[str] = []
    open_spans: Dict[Tuple[int, int], List[Tuple[str, float]]] = {}
    for index, event in enumerate(events):
        where = f"event {index}"
        if not isinstance(event, dict):
            problems.append(f"{where}: not a JSON object")
            continue
        phase = event.get("ph")
        if phase not in KNOWN_PHASES:
            problems.append(f"{where}: unknown phase {phase!r}")
            continue
        if phase == "M":
            if event.get("name") not in METADATA_NAMES:
                problems.append(f"{where}: unknown metadata {event.get('name')!r}")
            if not isinstance(event.get("args"), dict):
                problems.append(f"{where}: metadata without 'args'")
            continue
        ts, pid, tid = event.get("ts"), event.get("pid"), event.get("tid")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            problems.append(f"{where}: 'ts' must be a non-negative number, found {ts!r}")
            continue
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, tid)):
            problems.append(f"{where}: 'pid' and 'tid' must be integers, found {pid!r}, {tid!r}")
            continue
        if phase in ("B", "X", "i", "I") and not isinstance(event.get("name"), str):
            problems.append(f"{where}: phase {phase!r} needs a 'name'")
        stack = open_spans.setdefault((pid, tid), [])
        if phase == "B":
            stack.append((event.get("name", ""), ts))
        elif phase == "E":
            if not stack:
                problems.append(f"{where}: end event on pid {pid} tid {tid} with no span open")
                continue
            name, began = stack.pop()
            if ts < began:
                problems.append(f"{where}: span {name!r} on pid {pid} ends at {ts} before it began at {began}")
    for (pid, tid), stack in sorted(open_spans.items()):
        for name, began in stack:
            problems.append(f"span {name!r} on pid {pid} tid {tid} begun at {began} never ends")
    return problems


@dataclasses.dataclass
class TensorSummary:
    """One timeline row (a tensor): how many times each activity ran and the time it took, in microseconds."""

    tensor: str
    count: Dict[str, int] = dataclasses.field(default_factory=dict)
    total_us: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def busy_us(self) -> float:
        return sum(self.total_us.values())


def activities(events: List[dict], prefix: str) -> Dict[str, set]:
    """Tensor name -> the full names of its spans starting with ``prefix``, e.g. {"ALLREDUCE (fused x2,
    hierarchical)"}: which algorithm each collective ran as (the tests and bench/hierarchical.py read it)."""
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    found: Dict[str, set] = {}
    for event in events:
        if event.get("ph") == "B" and event["name"].startswith(prefix) and event.get("pid") in rows:
            found.setdefault(rows[event["pid"]], set()).add(event["name"])
    return found


def spans(events: List[dict]) -> List[Tuple[str, str, float, float]]:
    """(tensor, activity, begin us, end us) of every complete span, in the order the spans end."""
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    stacks: Dict[Tuple[int, int], List[Tuple[str, float]]] = {}
    found = []
    for event in events:
        phase = event.get("ph")
        if phase == "B":
            stacks.setdefault((event["pid"], event["tid"]), []).append((event["name"], event["ts"]))
        elif phase == "E" and stacks.get((event["pid"], event["tid"])):
            name, began = stacks[(event["pid"], event["tid"])].pop()
            found.append((rows.get(event["pid"], f"pid {event['pid']}"), name, began, event["ts"]))
    return found


def summarize(events: List[dict]) -> Tuple[List[TensorSummary], int]:
    """Per-tensor totals of each activity (NEGOTIATE_allreduce, ALLREDUCE, ...) busiest first, and the number of
    cycle markers. Activities are the span names without their fusion note ("ALLREDUCE (fused x4)" counts as
    ALLREDUCE)."""
    cycles = sum(1 for e in events if e.get("ph") in ("i", "I") and e.get("name") == "CYCLE_START")
    summaries: Dict[str, TensorSummary] = {}
    for tensor, name, began, ended in spans(events):
        name = name.split(" (", 1)[0]
        summary = summaries.setdefault(tensor, TensorSummary(tensor))
        summary.count[name] = summary.count.get(name, 0) + 1
        summary.total_us[name] = summary.total_us.get(name, 0.0) + (ended - began)
    ordered = sorted(summaries.values(), key=lambda s: (-s.busy_us, s.tensor))
    return ordered, cycles


def format_table(summaries: List[TensorSummary], cycles: int, top: Union[int, None] = None) -> str:
    shown = summaries if top is None else summaries[:top]
    lines = [
        f"{len(summaries)} tensors, {cycles} cycle markers",
        f"{'tensor':<40} {'activity':<24} {'count':>6} {'total ms':>10} {'mean us':>9}",
    ]
    for summary in shown:
        for activity in sorted(summary.total_us, key=lambda a: -summary.total_us[a]):
            count, total = summary.count[activity], summary.total_us[activity]
            lines.append(
                f"{summary.tensor[:40]:<40} {activity[:24]:<24} {count:>6} {total / 1000:>10.3f} "
                f"{total / count:>9.1f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdlite.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="timeline file written by HVDLITE_TIMELINE or hvd.start_timeline")
    parser.add_argument("--top", type=int, default=None, help="show only the N busiest tensors")
    parser.add_argument("--check", action="store_true", help="only check the trace (exit status 1 on problems)")
    args = parser.parse_args(argv)
    try:
        events = load(args.trace)
    except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError
        print(f"{args.trace}: cannot read a trace: {error}", file=sys.stderr)
        return 2
    problems = check(events)
    if problems:
        for problem in problems[:20]:
            print(f"{args.trace}: {problem}", file=sys.stderr)
        print(f"{args.trace}: {len(problems)} problem(s); Perfetto may reject or misdraw this trace", file=sys.stderr)
        return 1
    if args.check:
        print(f"{args.trace}: {len(events)} events, a well-formed Chrome trace")
    else:
        print(format_table(*summarize(events), top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
