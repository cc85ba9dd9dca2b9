"""The elastic driver: ``hvdlite-run -np N --min-np A --max-np B --host-discovery-script script.sh``.

It keeps a set of worker processes, one per slot the discovery script reports (at most ``--max-np``), and
forms numbered *rounds* of them: each round gives every member a rank and the job size (the worker side of the
protocol is hvdlite/common/elastic.py). What changes the membership:

- A worker exits non-zero: its host is blacklisted (for good, or for a time drawn from
  ``--blacklist-cooldown-range``), and the next round is formed from the workers that ask to join it. The
  survivors' collectives failed; ``hvd.elastic.run`` rolled them back to their last commit and sent them here.
- The discovery script (run every ``--discovery-interval`` s) reports new slots: workers are started there and
  ``hosts_updated`` is set, so that the running workers leave at their next ``state.commit()`` and the next
  round takes everyone in. A host that disappears from the script's output has its workers stopped.
- A round is formed as soon as every live worker has asked to join it. Once a member of the current round has
  asked (its round ended), the others have ``ROUND_SETTLE_SECONDS``; those that have not asked by then (stopped,
  hung) are stopped and left out. Workers that only joined wait, without a limit, for the members' next commit.
- Fewer than ``--min-np`` workers willing to continue, and none coming within ``--elastic-timeout`` (by default
  ``--start-timeout``): the job fails with that message. A job that would re-form more often than
  ``--reset-limit`` allows fails instead. Every worker exiting 0 ends the job with 0.

Ranks are numbered host by host (co-located ranks share memory). Rank 0 always goes to a worker of the previous
round (the lowest surviving rank), because ``state.sync()`` broadcasts from rank 0.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import shlex
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

from hvdlite.common import elastic as protocol
from hvdlite.common import network
from hvdlite.common.rendezvous import RendezvousServer
from hvdlite.common.topology import topology_for_hosts
from hvdlite.runner.hosts import HostSlots, parse_hostfile_text
from hvdlite.runner.local import (JobOutcome, RankProcess, _SignalCatcher, report, start_rank, stop_ranks,
                                  terminate_group)
from hvdlite.runner.settings import Settings
from hvdlite.runner.ssh import start_remote_rank

ROUND_SETTLE_SECONDS = 15.0  # > PEER_TIMEOUT_SECONDS (5): survivors of a silent peer's loss arrive within it
_POLL_INTERVAL = 0.05


@dataclasses.dataclass
class ElasticSettings:
    min_np: int
    max_np: int
    discovery_script: str
    discovery_interval: float = 1.0
    cooldown_range: Optional[Tuple[float, float]] = None  # None: a failed host stays blacklisted
    slots_per_host: int = 1  # for discovery lines that name a host without ":slots"
    elastic_timeout: Optional[float] = None  # the wait for --min-np workers; None: the start timeout
    reset_limit: Optional[int] = None  # how many times the job may re-form; None: no limit

    def validate(self, np: int) -> None:
        if not 1 <= self.min_np <= np <= self.max_np:
            raise ValueError(f"need 1 <= --min-np ({self.min_np}) <= -np ({np}) <= --max-np ({self.max_np})")
        if self.cooldown_range is not None and not 0 <= self.cooldown_range[0] <= self.cooldown_range[1]:
            raise ValueError(f"--blacklist-cooldown-range {self.cooldown_range}: need 0 <= low <= high")
        if self.elastic_timeout is not None and self.elastic_timeout <= 0:
            raise ValueError(f"--elastic-timeout {self.elastic_timeout:g}: need a positive number of seconds")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ValueError(f"--reset-limit {self.reset_limit}: need 0 or more")


def discover_hosts(script: str, slots_per_host: int, timeout: float = 30.0) -> List[HostSlots]:
    """Runs the discovery script: one ``host`` or ``host:slots`` per line (Horovod's format)."""
    # A path runs as a program (Horovod's contract: an executable script); anything else as a shell command.
    if os.path.isfile(script):
        try:
            result = subprocess.run([os.path.abspath(script)], capture_output=True, text=True, timeout=timeout)
        except OSError:  # not executable, or no "#!" line: as sh would run it
            result = subprocess.run(["sh", os.path.abspath(script)], capture_output=True, text=True, timeout=timeout)
    else:
        result = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"host discovery script {script} exited with {result.returncode}: "
                           f"{result.stderr.strip()[-500:]}")
    lines = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines.append(line if ":" in line else f"{line}:{slots_per_host}")
    return parse_hostfile_text("\n".join(line.replace(":", " slots=", 1) for line in lines), script)


@dataclasses.dataclass
class Worker:
    worker_id: str  # "w<n>", stable for the job
    index: int      # n: the prefix of its output lines
    host: str
    slot: int
    process: RankProcess
    last_rank: Optional[int] = None  # its rank in the last round it took part in
    exit_code: Optional[int] = None


class ElasticDriver:
    def __init__(self, settings: Settings, elastic: ElasticSettings, command: Sequence[str]):
        self.settings = settings
        self.elastic = elastic
        self.command = list(command)
        self.secret = secrets.token_bytes(32)
        self.job_id = secrets.token_hex(6)
        self.scope = protocol.scope(self.job_id)
        self.server: Optional[RendezvousServer] = None
        self.workers: List[Worker] = []
        self.next_index = 0
        self.round = -1
        self.members: set = set()  # worker ids of the current round
        self.blacklist: Dict[str, float] = {}  # host -> time it may be used again (inf: never)
        self.host_order: List[str] = []
        self.failure: Optional[Tuple[Worker, int]] = None  # the first worker that failed, and its code
        self.base_env = dict(os.environ)
        self.base_env.update(settings.knob_env())

    # -- workers --------------------------------------------------------------------------------------

    def live(self) -> List[Worker]:
        return [w for w in self.workers if w.exit_code is None]

    def _start_worker(self, host: str, slot: int) -> None:
        index = self.next_index
        self.next_index += 1
        worker_id = f"w{index}"
        local = network.is_local_host(host)
        env = dict(self.base_env)
        for name in ("HVDLITE_RANK", "HVDLITE_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"):
            env.pop(name, None)
        env.update({
            "HVDLITE_ELASTIC": "1", "HVDLITE_WORKER_ID": worker_id, "HVDLITE_JOB_ID": self.job_id,
            "HVDLITE_RENDEZVOUS_ADDR": self._rendezvous_address(host), "HVDLITE_RENDEZVOUS_PORT":
            str(self.server.address[1]), "HVDLITE_SECRET": self.secret.hex(), "HVDLITE_HOSTNAME": host,
            "PYTHONUNBUFFERED": "1"})
        if self.settings.verbose:
            report(f"starting worker {worker_id} on {host} slot {slot}: {shlex.join(self.command)}")
        if local:
            process = start_rank(index, self.command, env, output_dir=self.settings.output_filename)
        else:
            process = start_remote_rank(index, host, self.command, env, os.getcwd(), self.settings.ssh,
                                        dict(os.environ), output_dir=self.settings.output_filename)
        self.workers.append(Worker(worker_id, index, host, slot, process))
        if host not in self.host_order:
            self.host_order.append(host)

    def _rendezvous_address(self, host: str) -> str:
        """How a worker on host reaches the service (which listens on every interface: hosts may come later)."""
        return "127.0.0.1" if network.is_local_host(host) else network.source_address_for(host)

    def _fill_slots(self, hosts: List[HostSlots], limit: int) -> int:
        """Starts workers on free slots of usable hosts, up to ``limit`` live workers; returns how many."""
        now = time.monotonic()
        started = 0
        present = {h.name for h in hosts}
        for worker in self.live():  # hosts that left the discovery output lose their workers
            if worker.host not in present:
                report(f"host {worker.host} is gone from the discovery output; stopping worker {worker.worker_id}")
                terminate_group(worker.process)
        for host in hosts:
            if self.blacklist.get(host.name, 0) > now:
                continue
            used = {w.slot for w in self.live() if w.host == host.name}
            for slot in range(host.slots):
                if len(self.live()) >= limit:
                    return started
                if slot not in used:
                    self._start_worker(host.name, slot)
                    started += 1
        return started

    # -- rounds ---------------------------------------------------------------------------------------

    def _ready(self, worker: Worker, round_number: int) -> bool:
        return self.server.peek(self.scope, f"ready.{round_number}.{worker.worker_id}") is not None

    def _form_round(self, members: List[Worker]) -> None:
        """Publishes round self.round + 1 with these members (host by host; rank 0 a previous member)."""
        def host_key(host: str) -> Tuple[float, int]:
            previous = [w.last_rank for w in members if w.host == host and w.last_rank is not None]
            return (min(previous) if previous else float("inf"), self.host_order.index(host))

        hosts = sorted({w.host for w in members}, key=host_key)
        ordered = sorted(members, key=lambda w: (hosts.index(w.host), w.last_rank is None,
                                                 w.last_rank if w.last_rank is not None else 0, w.slot))
        ordered = ordered[:self.elastic.max_np]
        layout = topology_for_hosts([w.host for w in ordered])
        self.round += 1
        assignment = {}
        for worker, info in zip(ordered, layout):
            worker.last_rank = info.rank
            assignment[worker.worker_id] = {
                "rank": info.rank, "size": info.size, "local_rank": info.local_rank, "local_size": info.local_size,
                "cross_rank": info.cross_rank, "cross_size": info.cross_size, "hostname": worker.host}
        self.members = set(assignment)
        self.server.put(self.scope, f"round.{self.round}", json.dumps({"workers": assignment}).encode())
        self.server.put(self.scope, "latest", str(self.round).encode())
        report(f"elastic round {self.round}: {len(ordered)} worker(s) on {', '.join(hosts)}")

    def _blacklist(self, host: str) -> None:
        if self.elastic.cooldown_range is None:
            self.blacklist[host] = float("inf")
        else:
            low, high = self.elastic.cooldown_range
            self.blacklist[host] = time.monotonic() + random.uniform(low, high)

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> JobOutcome:
        hosts = discover_hosts(self.elastic.discovery_script, self.elastic.slots_per_host)
        # Every interface: hosts may join later. Requests are authenticated with the job's secret.
        self.server = RendezvousServer(self.secret, host="0.0.0.0", port=0).start()
        try:
            with _SignalCatcher() as signals:
                outcome = self._supervise(hosts, signals)
        finally:
            processes = [w.process for w in self.workers]
            stop_ranks(processes, grace=5.0)
            for process in processes:
                process.join_output(timeout=2.0)
            self.server.stop()
        return outcome

    def _supervise(self, hosts: List[HostSlots], signals: _SignalCatcher) -> JobOutcome:
        # The first round: -np workers (fewer if the hosts have fewer slots: at least --min-np are awaited).
        self._fill_slots(hosts, limit=self.settings.np)
        last_discovery = time.monotonic()
        waiting_since: Optional[float] = None
        short_since: Optional[float] = None
        started_at = time.monotonic()
        while True:
            if signals.received:
                return JobOutcome(128 + signals.received[0])
            if self.settings.timeout is not None and time.monotonic() - started_at > self.settings.timeout:
                report(f"job exceeded the timeout of {self.settings.timeout:g} s; stopping all workers")
                return JobOutcome(124)
            for worker in self.live():
                code = worker.process.exited()
                if code is None:
                    continue
                worker.exit_code = code
                if code != 0:
                    report(f"worker {worker.worker_id} (rank {worker.last_rank} on {worker.host}) exited with code "
                           f"{code}; blacklisting {worker.host} and re-forming the job without it")
                    self.failure = self.failure or (worker, code)
                    self._blacklist(worker.host)
            live = self.live()
            if not live:  # success when the workers of the last round finished; lost workers before do not count
                if any(w.exit_code == 0 for w in self.workers):
                    return JobOutcome(0)
                report("every worker has exited without finishing")
                return JobOutcome(self.failure[1] if self.failure else 1,
                                  self.failure[0].index if self.failure else None)
            if any(w.exit_code == 0 for w in self.workers):
                time.sleep(_POLL_INTERVAL)  # the job is finishing: no new rounds, no new workers
                continue
            now = time.monotonic()
            if now - last_discovery >= self.elastic.discovery_interval:
                last_discovery = now
                try:
                    hosts = discover_hosts(self.elastic.discovery_script, self.elastic.slots_per_host)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    report(f"host discovery failed ({exc}); keeping the current hosts")
                if self._fill_slots(hosts, limit=self.elastic.max_np) and self.round >= 0:
                    self.server.put(self.scope, "hosts_updated", str(self.round).encode())
            target = self.round + 1
            ready = [w for w in live if self._ready(w, target)]
            if not ready:
                waiting_since = None
                time.sleep(_POLL_INTERVAL)
                continue
            # The settling clock starts when a member of the current round asks for the next one (its round has
            # ended: a failure or added workers). Workers that only joined wait for the members' next commit,
            # however far away it is.
            if any(w.worker_id in self.members for w in ready) or not self.members:
                waiting_since = waiting_since or now
            if len(ready) < len(live) and (waiting_since is None or now - waiting_since < ROUND_SETTLE_SECONDS):
                time.sleep(_POLL_INTERVAL)
                continue
            if len(ready) < self.elastic.min_np:
                short_since = short_since or now
                wait_limit, flag = ((self.settings.start_timeout, "--start-timeout")
                                    if self.elastic.elastic_timeout is None
                                    else (self.elastic.elastic_timeout, "--elastic-timeout"))
                if now - short_since > wait_limit:
                    report(f"only {len(ready)} worker(s) can continue, fewer than --min-np {self.elastic.min_np}, "
                           f"and no more came within {wait_limit:g} s ({flag}); stopping the job")
                    return JobOutcome(self.failure[1] if self.failure else 1,
                                      self.failure[0].index if self.failure else None)
                time.sleep(_POLL_INTERVAL)
                continue
            short_since = None
            if self.round >= 0 and self.elastic.reset_limit is not None and target > self.elastic.reset_limit:
                report(f"the job has re-formed {target - 1} time(s) and --reset-limit is "
                       f"{self.elastic.reset_limit}; stopping it instead of re-forming it again")
                return JobOutcome(self.failure[1] if self.failure else 1,
                                  self.failure[0].index if self.failure else None)
            for worker in live:
                if worker not in ready:
                    report(f"worker {worker.worker_id} on {worker.host} did not ask to join round {target} within "
                           f"{ROUND_SETTLE_SECONDS:g} s; stopping it")
                    terminate_group(worker.process)
                    self._blacklist(worker.host)
            self._form_round(ready)
            waiting_since = None
