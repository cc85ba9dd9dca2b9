"""Elastic training across hosts under a seeded schedule of random faults, checked against an invariant.

    sudo python bench/chaos.py --minutes 60 --seed 1          # the hour: 3 hosts x 2 slots, a fault every 10-40 s
    sudo python bench/chaos.py --minutes 60 --seed 1 --framework keras    # the same with Keras fit
    sudo python bench/chaos.py --minutes 2 --seed 7 --interval 4 10   # what CI runs (tests/test_chaos.py)

Needs root: the hosts are network-namespace test hosts on a bridge, each with its own sshd (tests/netns_cluster.py),
created and removed by this script. The job is bench/chaos_task.py (PyTorch, or Keras with --framework keras)
under hvdlite-run's elastic driver (a discovery script this script rewrites, blacklisted hosts usable again after
a few seconds), its state committed every step and checkpointed to disk, --max-restarts for failures of its own.
Until --minutes have passed, at times drawn from --interval, one fault of the next kind in a shuffled cycle of
every kind (so each kind comes up as often):

    kill-worker   SIGKILL of a worker
    stop-worker   SIGSTOP of a worker for 5-20 s, then SIGCONT
    link-down     a host's link down for 2-10 s (no FIN, no RST: packets vanish)
    slow-link     a host's link at 100 Mbit/s losing 1% of the packets for 5-20 s (tc's tbf, iptables)
    slots         a host's slots lowered to 1 in the discovery output for 10-30 s, then raised back
    host-leave    a host gone from the discovery output for 10-30 s, then back
    kill-job      SIGKILL of the launcher and every worker, then the same command again (resuming from the checkpoint)

Faults overlap each other and the job's re-forming; a fault that takes a host away is skipped while another one
has a host away, so that the job keeps its --min-np. Then every fault is lifted, the job is told to finish its
epoch, and the invariant is checked:

- the job finishes (exit 0) and every worker of its last round ends with the same weights;
- those weights equal a fault-free replay of the committed steps (bench/chaos_task.py --replay; float tolerance:
  the allreduce sums ranks in another order than the replay);
- no process of the job is left on any host and no shared-memory segment of it in /dev/shm;
- every fault is logged with its time to recover: the longest time without a step starting on any worker from it
  to the next fault (a step that meets the fault fails; the re-formed job starts the next one).

Exit 0 only when the invariant held. The work directory is removed; where the invariant failed or some fault held
the job up for over 30 s, the launchers' output and the workers' logs are kept in --out-dir/chaos-logs. The report
(faults by kind, recovered, time to recover, steps run again after a rollback) goes to stdout and
--out-dir/chaos.json; a failure prints the command that replays its seed.
"""

import argparse
import heapq
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

import chaos_task  # noqa: E402
from netns_cluster import ClusterUnavailable, start_cluster  # noqa: E402

KINDS = ("kill-worker", "stop-worker", "link-down", "slow-link", "slots", "host-leave", "kill-job")
HOST_FAULTS = ("link-down", "host-leave", "slots")  # take a host (or part of it) away from the job
DURATIONS = {
    "stop-worker": (5, 20),
    "link-down": (2, 10),
    "slow-link": (5, 20),
    "slots": (10, 30),
    "host-leave": (10, 30),
}
MIN_NP = 2
MAX_EPOCHS = 1_000_000  # the job trains until told to stop
DISCOVERY_INTERVAL = 0.5
SLOW_RECOVERY_SECONDS = 30  # a fault held the job up longer: its logs are kept


def command_line(args):
    return (
        f"sudo python bench/chaos.py --minutes {args.minutes} --seed {args.seed} --interval {args.interval[0]:g} "
        f"{args.interval[1]:g} --framework {args.framework}"
    )


class Progress:
    """The workers' logs, read as they grow: when each step started, or the job ended, on any worker."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.offsets = {}
        self.times = []  # when every step started and every worker finished, as read so far
        self.last = 0  # the last step started

    def poll(self):
        for name in os.listdir(self.out_dir):
            if not name.endswith(".log"):
                continue
            with open(os.path.join(self.out_dir, name)) as f:
                f.seek(self.offsets.get(name, 0))
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offsets[name] = self.offsets.get(name, 0) + len(complete)
            for line in complete.splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e["event"] == "batch":
                    self.last = max(self.last, e["batches"])
                if e["event"] in ("batch", "done"):  # a job that ends right after a fault needed no further step
                    self.times.append(e["time"])

    def stall(self, since, until):
        """The longest time without a step starting on any worker, from `since` to the first step after `until`:
        how long a fault at `since` held the job up, when the next one came at `until` (None: no step since)."""
        times = sorted(t for t in self.times if since <= t <= until)
        times += [min((t for t in self.times if t > until), default=None)]
        times = [t for t in times if t is not None]
        if not times:
            return None
        return max([times[0] - since] + [b - a for a, b in zip(times, times[1:])])


class Chaos:
    def __init__(self, args, cluster, workdir):
        self.args = args
        self.cluster = cluster
        self.workdir = workdir
        self.rng = random.Random(args.seed)
        self.out_dir = os.path.join(workdir, "logs")
        os.makedirs(self.out_dir)
        self.hosts_file = os.path.join(workdir, "hosts")
        self.slots = {h.address: args.slots for h in cluster.hosts}
        self.present = {h.address: True for h in cluster.hosts}
        self.write_hosts()
        self.discover = os.path.join(workdir, "discover.sh")
        with open(self.discover, "w") as f:
            f.write(f"#!/bin/sh\ncat {self.hosts_file}\n")
        os.chmod(self.discover, 0o755)
        self.attempt = 0
        self.launches = []
        self.job = None
        self.faults = []  # dicts: kind, target, at, step, stall_s, lifted_at
        self.away = None  # the host index a host fault has taken away
        self.stopped = set()
        self.progress = Progress(self.out_dir)
        self.cycle = []
        self.ended_early = None  # the job's exit code, where it ended while the faults went on

    # -- the job --------------------------------------------------------------------------------------------

    def write_hosts(self):
        text = "".join(f"{a}:{n}\n" for a, n in self.slots.items() if self.present[a])
        tmp = self.hosts_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.hosts_file)  # the discovery script never reads half a file

    def launch(self):
        slots = len(self.cluster.hosts) * self.args.slots
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "hvdlite-run"),
            "-np", str(slots), "--min-np", str(MIN_NP), "--max-np", str(slots),
            "--host-discovery-script", self.discover,
            "--discovery-interval", str(DISCOVERY_INTERVAL),
            "--blacklist-cooldown-range", "2", "5",
            "--elastic-timeout", "120",
            "--checkpoint-dir", os.path.join(self.workdir, "ckpt"), "--checkpoint-every", "10",
            "--max-restarts", "3",
            *self.cluster.ssh_flags(),
            sys.executable, os.path.join(HERE, "chaos_task.py"), self.args.framework, self.out_dir, str(MAX_EPOCHS),
        ]  # fmt: skip
        env = dict(os.environ, CHAOS_ATTEMPT=str(self.attempt))
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        log = open(os.path.join(self.workdir, f"launcher-{self.attempt}.log"), "w")
        self.job = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.launches.append(time.time())

    def workers(self):
        """(host index, pid) of every worker process on the test hosts."""
        found = []
        for index, host in enumerate(self.cluster.hosts):
            for pid in self.cluster.job_processes(host):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read()
                except OSError:
                    continue
                if b"chaos_task.py" in cmdline and b"python" in cmdline.split(b"\0")[0]:
                    found.append((index, pid))
        return found

    def kill_job(self):
        """As a lost machine room: SIGKILL to the launcher's session and to everything of the job on every host."""
        if self.job and self.job.poll() is None:
            try:
                os.killpg(self.job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.job.wait(timeout=10)
        for host in self.cluster.hosts:
            for pid in self.cluster.job_processes(host):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.stopped.clear()

    # -- faults ---------------------------------------------------------------------------------------------

    def next_kind(self):
        if not self.cycle:
            self.cycle = list(KINDS)
            self.rng.shuffle(self.cycle)
        return self.cycle.pop()

    def inject(self, kind, now):
        """Starts a fault; returns (its record, when to lift it) or None when it cannot apply now."""
        index = self.rng.randrange(len(self.cluster.hosts))
        lo, hi = DURATIONS.get(kind, (0, 0))
        duration = self.rng.uniform(lo, hi)
        target = self.cluster.hosts[index].address
        if kind in HOST_FAULTS:
            if self.away is not None:
                return None
            self.away = index
        if kind in ("kill-worker", "stop-worker"):
            live = [w for w in self.workers() if w[1] not in self.stopped]
            if not live:
                return None
            index, pid = self.rng.choice(live)
            target = f"{self.cluster.hosts[index].address} pid {pid}"
            os.kill(pid, signal.SIGKILL if kind == "kill-worker" else signal.SIGSTOP)
            if kind == "stop-worker":
                self.stopped.add(pid)
                index = pid  # what to continue
        elif kind == "link-down":
            self.cluster.set_link(index, False)
        elif kind == "slow-link":
            self.cluster.impair(index, "100mbit", 0.01)
        elif kind == "slots":
            self.slots[target] = 1
            self.write_hosts()
        elif kind == "host-leave":
            self.present[target] = False
            self.write_hosts()
        elif kind == "kill-job":
            self.kill_job()
            self.attempt += 1
            self.launch()
        self.progress.poll()
        record = {"kind": kind, "target": target, "at": now, "step": self.progress.last, "stall_s": None}
        return record, (now + duration if kind in DURATIONS else None), index

    def lift(self, record, index):
        kind = record["kind"]
        if kind == "stop-worker":
            try:
                os.kill(index, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.stopped.discard(index)
        elif kind == "link-down":
            self.cluster.set_link(index, True)
        elif kind == "slow-link":
            self.cluster.impair(index, None)
        elif kind == "slots":
            self.slots[self.cluster.hosts[index].address] = self.args.slots
            self.write_hosts()
        elif kind == "host-leave":
            self.present[self.cluster.hosts[index].address] = True
            self.write_hosts()
        if kind in HOST_FAULTS:
            self.away = None
        record["lifted_at"] = time.time()

    def run(self):
        self.launch()
        end = time.time() + 60 * self.args.minutes
        pending = []  # (time, sequence, record, index): faults to lift
        next_fault = time.time() + self.rng.uniform(*self.args.interval)
        sequence = 0
        while time.time() < end:
            now = time.time()
            while pending and pending[0][0] <= now:
                _, _, record, index = heapq.heappop(pending)
                self.lift(record, index)
            if now >= next_fault:
                started, deferred = None, []
                while started is None and len(deferred) < len(KINDS):
                    kind = self.next_kind()
                    started = self.inject(kind, now)
                    if started is None:
                        deferred.append(kind)  # another fault holds its host: it comes next time instead
                self.cycle.extend(reversed(deferred))
                if started is not None:
                    record, until, index = started
                    self.faults.append(record)
                    print(f"{now - self.launches[0]:7.1f} s  {kind:12s} {record['target']}", flush=True)
                    if until is not None:
                        sequence += 1
                        heapq.heappush(pending, (until, sequence, record, index))
                next_fault = now + self.rng.uniform(*self.args.interval)
            if self.job.poll() is not None:
                self.ended_early = self.job.returncode
                break
            self.progress.poll()
            time.sleep(0.1)
        for _, _, record, index in sorted(pending):
            self.lift(record, index)
        with open(os.path.join(self.out_dir, "stop"), "w"):
            pass
        stop_at = time.time()
        try:
            self.job.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.kill_job()
        print(
            f"{stop_at - self.launches[0]:7.1f} s  stop requested; the job exited {time.time() - stop_at:.1f} s later"
        )
        self.measure_recovery()
        return self.job.returncode

    def measure_recovery(self):
        """Each fault's time to recover: the longest stall from it to the next fault (the last one: to the end)."""
        self.progress.poll()
        ends = [record["at"] for record in self.faults[1:]] + [time.time()]
        for record, until in zip(self.faults, ends):
            record["stall_s"] = self.progress.stall(record["at"], until)


def shm_entries():
    return {name for name in os.listdir("/dev/shm") if "hvdlite" in name}


def check(chaos, code):
    """The invariant's failures, in words (empty: it held)."""
    failures = []
    if chaos.ended_early is not None:
        failures.append(f"the job ended during the chaos, with exit code {chaos.ended_early}")
    elif code != 0:
        failures.append(f"the job exited with code {code}")
    logs = {}
    for name in os.listdir(chaos.out_dir):
        if name.endswith(".log"):
            with open(os.path.join(chaos.out_dir, name)) as f:
                logs[name] = [json.loads(line) for line in f if line.endswith("\n")]
    done = [e for log in logs.values() for e in log if e["event"] == "done"]
    final_attempt = max((e["attempt"] for e in done), default=None)
    done = [e for e in done if e["attempt"] == final_attempt]
    if not done:
        failures.append("no worker finished")
    elif len({tuple(e["weights"]) for e in done}) != 1:
        failures.append("the workers finished with different weights")
    replay_started = time.time()
    replayed = subprocess.run(
        [sys.executable, os.path.join(HERE, "chaos_task.py"), "--replay", chaos.args.framework, chaos.out_dir],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    print(f"the replay took {time.time() - replay_started:.1f} s", flush=True)
    reference = None
    if replayed.returncode != 0:
        failures.append("the replay failed: " + (replayed.stderr or replayed.stdout)[-2000:])
    else:
        reference = json.loads(replayed.stdout.strip().splitlines()[-1])
        if done and reference["steps"] != done[0]["batches"]:
            failures.append(f"the job ran {done[0]['batches']} steps, its logs {reference['steps']}")
        if done and any(
            abs(x - y) > 1e-5 * max(1.0, abs(y)) for x, y in zip(done[0]["weights"], reference["weights"])
        ):
            failures.append(f"final weights {done[0]['weights']} differ from the replay's {reference['weights']}")
    deadline = time.time() + 15
    while time.time() < deadline and any(chaos.cluster.job_processes(h) for h in chaos.cluster.hosts):
        time.sleep(0.2)
    for host in chaos.cluster.hosts:
        if chaos.cluster.job_processes(host):
            failures.append(f"processes left on {host.address}: {chaos.cluster.job_processes(host)}")
    # The segments of this run's launches (each names its own): another chaos run may share the machine.
    jobs = {e["job"] for log in logs.values() for e in log if e["event"] == "start" and e.get("job")}
    left = {name for name in shm_entries() if any(job in name for job in jobs)}
    if left:
        failures.append(f"shared memory left in /dev/shm: {sorted(left)}")
    for record in chaos.faults:
        if record["stall_s"] is None:
            failures.append(f"no step after {record['kind']} at {record['at'] - chaos.launches[0]:.1f} s")
    return failures, reference


def report(chaos, failures, reference, args):
    started = chaos.launches[0]
    by_kind = {}
    for record in chaos.faults:
        by_kind.setdefault(record["kind"], []).append(record)
    rows = []
    for kind in KINDS:
        records = by_kind.get(kind, [])
        times = [r["stall_s"] for r in records if r["stall_s"] is not None]
        rows.append(
            {
                "kind": kind,
                "injected": len(records),
                "recovered": len(times),
                "median_s": statistics.median(times) if times else None,
                "worst_s": max(times) if times else None,
            }
        )
    steps = chaos_task.logged_steps(chaos.out_dir)
    run = sum(
        1
        for name in os.listdir(chaos.out_dir)
        if name.endswith(".log")
        for line in open(os.path.join(chaos.out_dir, name))
        if '"event": "batch"' in line and '"rank": 0,' in line
    )
    summary = {
        "seed": args.seed,
        "framework": args.framework,
        "minutes": args.minutes,
        "hosts": f"{len(chaos.cluster.hosts)} x {args.slots}",
        "faults": len(chaos.faults),
        "launches": len(chaos.launches),
        "steps": len(steps),
        "steps_run_again": run - len(steps),
        "by_kind": rows,
        "faults_log": [
            dict(r, at=round(r["at"] - started, 2), lifted_at=round(r.get("lifted_at", r["at"]) - started, 2))
            for r in chaos.faults
        ],
        "invariant": "held" if not failures else "failed",
        "failures": failures,
    }
    lines = [
        f"chaos: {args.framework}, seed {args.seed}, {args.minutes} min, {summary['hosts']} hosts, "
        f"{len(chaos.faults)} faults, "
        f"{len(chaos.launches)} launch(es), {len(steps)} steps ({summary['steps_run_again']} run again after a "
        "rollback)",
        "",
        "| fault | injected | recovered | time to recover (the longest stall), median (worst) |",
        "|---|---|---|---|",
    ]
    for row in rows:
        time_text = "-" if row["median_s"] is None else f"{row['median_s']:.1f} s ({row['worst_s']:.1f} s)"
        lines.append(f"| {row['kind']} | {row['injected']} | {row['recovered']} | {time_text} |")
    lines.append("")
    if failures:
        lines += ["invariant FAILED:"] + [f"- {f}" for f in failures] + ["", f"replay: {command_line(args)}"]
    else:
        lines.append("invariant held: final weights equal the replay of the committed steps; nothing left behind")
    print("\n".join(lines), flush=True)
    with open(os.path.join(args.out_dir, "chaos.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--slots", type=int, default=2, help="slots of each host")
    parser.add_argument(
        "--interval", type=float, nargs=2, default=(10, 40), metavar=("LOW", "HIGH"), help="seconds between faults"
    )
    parser.add_argument("--framework", choices=("torch", "keras"), default="torch", help="the job's framework")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="hvdlite-chaos-")
    try:
        cluster = start_cluster(workdir, count=args.hosts)
    except ClusterUnavailable as exc:
        raise SystemExit(f"bench/chaos.py: cannot create the test hosts: {exc}")
    chaos = Chaos(args, cluster, workdir)
    summary = None
    try:
        code = chaos.run()
        failures, reference = check(chaos, code)
        summary = report(chaos, failures, reference, args)
    finally:
        chaos.kill_job()
        cluster.stop()
    slow = [r for r in chaos.faults if (r["stall_s"] or 0) > SLOW_RECOVERY_SECONDS]
    if summary["invariant"] != "held" or slow:
        # Kept for a diagnosis: the launchers' output and the workers' logs (the fault times above are from the
        # first launch); not the rest of the work folder, which holds the test hosts' keys.
        kept = os.path.join(args.out_dir, "chaos-logs")
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(chaos.out_dir, kept)
        for name in os.listdir(workdir):
            if name.startswith("launcher-"):
                shutil.copy(os.path.join(workdir, name), kept)
        print(f"the workers' logs and the launchers' output: {kept}")
    shutil.rmtree(workdir, ignore_errors=True)
    if summary["invariant"] != "held":
        sys.exit(1)


if __name__ == "__main__":
    main()
