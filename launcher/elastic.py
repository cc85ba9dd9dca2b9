"""The elastic driver: ``hvdlite-run -np N --min-np A --max-np B --host-discovery-script script.sh``.

It keeps a set of worker processes, one per slot the discovery script reports (at most ``--max-np``), and
forms numbered *rounds* of them: each round gives every member a rank and the job size (the worker side of the
protocol is hvdlite/common/elastic.py). What changes the membership:

- A worker exits non-zero: its host is blacklisted, which means no *new* worker starts there (for good, or for a
  time drawn from ``--blacklist-cooldown-range``); the host's other workers go on. The next round is formed from
  the workers that ask to join it. The survivors' collectives failed; ``hvd.elastic.run`` rolled them back to
  their last commit and sent them here.
- The discovery script (run every ``--discovery-interval`` s) reports more slots on a host, or a new host:
  workers are started on the free slots. Once every one of them is waiting to join the next round (it has
  started, imported its framework and reached ``init()``), ``hosts_updated`` is set, so that the running workers
  leave at their next ``state.commit()`` and the next round takes everyone in; until then they train on, instead
  of waiting at a commit for a new worker's start-up. A slot whose worker was stopped is used again once that
  worker has exited (at a later discovery).
- It reports fewer slots on a host: the workers beyond the new count go, the highest local ranks first (workers
  not yet in a round before them: those are stopped at once). The others are marked to leave and
  ``hosts_updated`` is set; at their next commit every worker asks to join the next round, and the driver stops
  the marked ones instead of placing them. Stopping them is not a failure (no blacklisting). If the slots come
  back before that, the marks are lifted.
- A host that disappears from the script's output has its workers stopped at once (not a failure either; the
  others' collectives fail and they re-form from their last commit).
- A round is formed as soon as every live member of the current round, and every new worker that is waiting,
  has asked to join it. Once a member has asked (its round ended), the other members have
  ``ROUND_SETTLE_SECONDS``; those that have not asked by then (stopped, hung) are stopped and left out. A new
  worker still starting is neither waited for nor stopped: it joins a later round. New workers that are waiting
  wait, without a limit, for the members' next commit. (Round 0 waits for every worker it starts with.)
- Fewer than ``--min-np`` workers willing to continue, and none coming within ``--elastic-timeout`` (by default
  ``--start-timeout``): the job fails with that message. A job that would re-form more often than
  ``--reset-limit`` allows fails instead. Every worker exiting 0 ends the job with 0; once one has, workers not in
  the last round are stopped (not a failure) rather than left to wait for a round that never comes.

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
from hvdlite.runner.output import report
from hvdlite.runner.processes import JobOutcome, RankProcess, SignalCatcher, start_rank, stop_ranks, terminate_group
from hvdlite.runner.settings import Settings
from hvdlite.runner.ssh import resolve_hostname, start_remote_rank

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
        raise RuntimeError(
            f"host discovery script {script} exited with {result.returncode}: {result.stderr.strip()[-500:]}"
        )
    lines = []
    for line in result.stdout.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines.append(line if ":" in line else f"{line}:{slots_per_host}")
    return parse_hostfile_text("\n".join(line.replace(":", " slots=", 1) for line in lines), script)


@dataclasses.dataclass
class Worker:
    worker_id: str  # "w<n>", stable for the job
    index: int  # n: the prefix of its output lines
    host: str
    slot: int
    process: RankProcess
    last_rank: Optional[int] = None  # its rank in the last round it took part in
    exit_code: Optional[int] = None
    leaving: bool = False  # its host has fewer slots now: stopped when the next round is formed
    stopped: Optional[str] = None  # why the driver stopped it on purpose (its exit is then not a failure)


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
        self.discovered: List[str] = []  # the hosts of the latest discovery output
        self.failure: Optional[Tuple[Worker, int]] = None  # the first worker that failed, and its code
        self.hosts_updated_round: Optional[int] = None  # the round hosts_updated was last set for
        self.started_in_round = 0  # workers started since the current round was formed
        self.base_env = dict(os.environ)
        self.base_env.update(settings.knob_env())

    # -- workers --------------------------------------------------------------------------------------

    def live(self) -> List[Worker]:
        return [w for w in self.workers if w.exit_code is None]

    def active(self) -> List[Worker]:
        """Live workers the driver has not stopped (a stopped one may take a moment to exit)."""
        return [w for w in self.workers if w.exit_code is None and w.stopped is None]

    def _start_worker(self, host: str, slot: int) -> None:
        index = self.next_index
        self.next_index += 1
        worker_id = f"w{index}"
        local = network.is_local_host(host)
        env = dict(self.base_env)
        for name in ("HVDLITE_RANK", "HVDLITE_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE"):
            env.pop(name, None)
        env.update(
            {
                "HVDLITE_ELASTIC": "1",
                "HVDLITE_WORKER_ID": worker_id,
                "HVDLITE_JOB_ID": self.job_id,
                "HVDLITE_RENDEZVOUS_ADDR": self._rendezvous_address(host),
                "HVDLITE_RENDEZVOUS_PORT": str(self.server.address[1]),
                "HVDLITE_SECRET": self.secret.hex(),
                "HVDLITE_HOSTNAME": host,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.settings.verbose:
            report(f"starting worker {worker_id} on {host} slot {slot}: {shlex.join(self.command)}")
        if local:
            process = start_rank(index, self.command, env, output_dir=self.settings.output_filename)
        else:
            process = start_remote_rank(
                index,
                host,
                self.command,
                env,
                os.getcwd(),
                self.settings.ssh,
                dict(os.environ),
                output_dir=self.settings.output_filename,
            )
        self.workers.append(Worker(worker_id, index, host, slot, process))
        self.started_in_round += 1
        if host not in self.host_order:
            self.host_order.append(host)

    def _rendezvous_address(self, host: str) -> str:
        """How a worker on host reaches the service (which listens on every interface: hosts may come later).

        The worker also advertises to its peers the address it has on the route to this one
        (bootstrap.advertise_address), so it must not be loopback where peers run on other hosts. As in
        job.py (the static launcher):
        - a remote host is looked up as ssh sees it (``ssh -G``): discovery may print ssh config aliases, which
          the resolver does not know;
        - a worker on this machine gets this machine's address on the route to a remote host of the current
          discovery output, loopback only while every host is local. (A worker started while every host was local
          keeps loopback: a remote host that comes later cannot reach it, and its workers fail to connect.)"""
        remote = [name for name in self.discovered if not network.is_local_host(name)]
        if network.is_local_host(host):
            if not remote:
                return "127.0.0.1"
            host = remote[0]
        target = resolve_hostname(host, self.settings.ssh)
        try:
            return network.source_address_for(target)
        except OSError as exc:
            raise RuntimeError(f"cannot find a route from this machine to {host} ({target}): {exc}") from None

    def _stop(self, worker: Worker, why: str) -> None:
        """Stops a worker on purpose: its exit is not a failure (no blacklisting)."""
        worker.stopped = why
        terminate_group(worker.process)

    def _follow_slot_counts(self, hosts: List[HostSlots]) -> bool:
        """Marks the workers beyond a host's (lower) slot count to leave at the next round (those not in the
        current round are stopped at once), and lifts such marks when the slots come back; returns True when
        workers were marked."""
        marked = False
        for host in hosts:
            # Highest local rank first; workers not yet in a round count as the highest.
            on_host = sorted(
                (w for w in self.active() if w.host == host.name),
                key=lambda w: (w.last_rank is None, w.last_rank or 0, w.slot),
                reverse=True,
            )
            staying = [w for w in on_host if not w.leaving]
            leaving = [w for w in on_host if w.leaving]
            if len(staying) > host.slots:
                for worker in staying[: len(staying) - host.slots]:
                    if worker.worker_id not in self.members:  # in no round's mesh yet: nothing to wait for
                        report(
                            f"host {host.name} now has {host.slots} slot(s); stopping worker "
                            f"{worker.worker_id} (not yet in a round); it is not a failure"
                        )
                        self._stop(worker, "its slot was removed")
                        continue
                    worker.leaving = True
                    marked = True
                    report(
                        f"host {host.name} now has {host.slots} slot(s); worker {worker.worker_id} "
                        f"({self._describe_rank(worker)}) leaves the job at the next commit"
                    )
            elif leaving and len(staying) < host.slots:
                for worker in reversed(leaving[max(0, len(leaving) - (host.slots - len(staying))) :]):
                    worker.leaving = False
                    report(
                        f"host {host.name} has {host.slots} slot(s) again; worker {worker.worker_id} "
                        f"({self._describe_rank(worker)}) stays"
                    )
        return marked

    @staticmethod
    def _describe_rank(worker: Worker) -> str:
        return f"rank {worker.last_rank}" if worker.last_rank is not None else "not yet in a round"

    def _fill_slots(self, hosts: List[HostSlots], limit: int) -> int:
        """Starts workers on free slots of usable hosts, up to ``limit`` workers that stay; returns how many.

        A host takes as many workers as it has slots, counting the ones still running there (those marked to
        leave and those stopped but not yet exited too): a slot is used again once its worker has exited."""
        now = time.monotonic()
        started = 0
        present = {h.name for h in hosts}
        self.discovered = [h.name for h in hosts]  # for _rendezvous_address
        for worker in self.active():  # hosts that left the discovery output lose their workers
            if worker.host not in present:
                report(f"host {worker.host} is gone from the discovery output; stopping worker {worker.worker_id}")
                self._stop(worker, f"host {worker.host} is gone")
        for host in hosts:
            if self.blacklist.get(host.name, 0) > now:
                continue
            on_host = [w for w in self.live() if w.host == host.name]
            used = {w.slot for w in on_host}
            free = [slot for slot in range(host.slots) if slot not in used][: max(0, host.slots - len(on_host))]
            for slot in free:
                if len([w for w in self.active() if not w.leaving]) >= limit:
                    return started
                self._start_worker(host.name, slot)
                started += 1
        return started

    def _discovered(self, hosts: List[HostSlots]) -> None:
        """Follows the discovery output: removals, additions, and the ``hosts_updated`` flag that ends the round
        at the members' next commit."""
        marked = self._follow_slot_counts(hosts)
        started = self._fill_slots(hosts, limit=self.elastic.max_np)
        if self.round < 0:
            return  # round 0 is not formed yet: it takes (and leaves out) whoever is there then
        # Workers started here end the round only once they are waiting to join (_newcomers_waiting).
        if marked:
            self._end_round_at_next_commit()
        elif (
            not started
            and self.hosts_updated_round == self.round
            and not self.started_in_round
            and not any(w.leaving for w in self.active())
        ):
            # The slots came back before the removal: nothing left to re-form for. (A rank 0 that already read
            # the flag re-forms the same workers, which is harmless.)
            self.server.put(self.scope, "hosts_updated", b"-1")
            self.hosts_updated_round = None

    def _end_round_at_next_commit(self) -> None:
        self.server.put(self.scope, "hosts_updated", str(self.round).encode())
        self.hosts_updated_round = self.round

    def _newcomers(self) -> List[Worker]:
        """Live workers started during the current round, not leaving."""
        return [w for w in self.active() if w.worker_id not in self.members and not w.leaving]

    def _newcomers_waiting(self) -> None:
        """Ends the current round at the members' next commit once every new worker waits to join the next one."""
        if self.round < 0 or self.hosts_updated_round == self.round:
            return
        staying = [w for w in self.active() if w.worker_id in self.members and not w.leaving]
        newcomers = self._newcomers()
        if len(staying) >= self.elastic.max_np:
            return  # no room: a worker left out of a full round waits for a member to go
        if newcomers and all(self._ready(w, self.round + 1) for w in newcomers):
            self._end_round_at_next_commit()

    # -- rounds ---------------------------------------------------------------------------------------

    def _ready(self, worker: Worker, round_number: int) -> bool:
        return self.server.peek(self.scope, f"ready.{round_number}.{worker.worker_id}") is not None

    def _form_round(self, members: List[Worker]) -> None:
        """Publishes round self.round + 1 with these members (host by host; rank 0 a previous member)."""

        def host_key(host: str) -> Tuple[float, int]:
            previous = [w.last_rank for w in members if w.host == host and w.last_rank is not None]
            return (min(previous) if previous else float("inf"), self.host_order.index(host))

        hosts = sorted({w.host for w in members}, key=host_key)
        ordered = sorted(
            members,
            key=lambda w: (
                hosts.index(w.host),
                w.last_rank is None,
                w.last_rank if w.last_rank is not None else 0,
                w.slot,
            ),
        )
        ordered = ordered[: self.elastic.max_np]
        layout = topology_for_hosts([w.host for w in ordered])
        self.round += 1
        assignment = {}
        for worker, info in zip(ordered, layout):
            worker.last_rank = info.rank
            assignment[worker.worker_id] = {
                "rank": info.rank,
                "size": info.size,
                "local_rank": info.local_rank,
                "local_size": info.local_size,
                "cross_rank": info.cross_rank,
                "cross_size": info.cross_size,
                "hostname": worker.host,
            }
        self.members = set(assignment)
        self.started_in_round = 0
        self.server.put(self.scope, f"round.{self.round}", json.dumps({"workers": assignment}).encode())
        self.server.put(self.scope, "latest", str(self.round).encode())
        report(f"elastic round {self.round}: {len(ordered)} worker(s) on {', '.join(hosts)}")

    def _drop_leavers(self, ready: List[Worker]) -> None:
        """Stops the workers marked to leave (their host has fewer slots now) as the next round is formed."""
        for worker in ready:
            if worker.leaving:
                report(
                    f"stopping worker {worker.worker_id} ({self._describe_rank(worker)} on {worker.host}): "
                    f"its slot was removed; it is not a failure"
                )
                self._stop(worker, "its slot was removed")

    def _blacklist(self, host: str) -> Optional[float]:
        """No new worker starts on host for a while (None: for the rest of the job); returns the seconds."""
        if self.elastic.cooldown_range is None:
            self.blacklist[host] = float("inf")
            return None
        low, high = self.elastic.cooldown_range
        seconds = random.uniform(low, high)
        self.blacklist[host] = time.monotonic() + seconds
        return seconds

    def _report_failure(self, worker: Worker, code: int) -> None:
        seconds = self._blacklist(worker.host)
        if seconds is None:
            banned = (
                f"no new worker starts on {worker.host} for the rest of the job (blacklisted; "
                f"--blacklist-cooldown-range allows it again after a while)"
            )
        else:
            low, high = self.elastic.cooldown_range
            banned = (
                f"no new worker starts on {worker.host} for the next {seconds:.0f} s (blacklisted; "
                f"--blacklist-cooldown-range {low:g} {high:g})"
            )
        others = [w for w in self.active() if w.host == worker.host]
        if others:
            banned += f"; its {len(others)} other worker(s) there go on"
        if any(w.exit_code == 0 for w in self.workers):
            going_on = "the job is finishing"
        else:
            remaining = len([w for w in self.active() if not w.leaving])
            going_on = f"the job re-forms with the {remaining} remaining worker(s)"
        where = (
            f"rank {worker.last_rank} on {worker.host}"
            if worker.last_rank is not None
            else f"not yet in a round, on {worker.host}"
        )
        report(f"worker {worker.worker_id} ({where}) exited with code {code}; {going_on}; {banned}")

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> JobOutcome:
        hosts = discover_hosts(self.elastic.discovery_script, self.elastic.slots_per_host)
        # Every interface: hosts may join later. Requests are authenticated with the job's secret.
        self.server = RendezvousServer(self.secret, host="0.0.0.0", port=0).start()
        try:
            with SignalCatcher() as signals:
                outcome = self._supervise(hosts, signals)
        finally:
            processes = [w.process for w in self.workers]
            stop_ranks(processes, grace=5.0)
            for process in processes:
                process.join_output(timeout=2.0)
            self.server.stop()
        return outcome

    def _supervise(self, hosts: List[HostSlots], signals: SignalCatcher) -> JobOutcome:
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
            failed = []
            for worker in self.live():
                code = worker.process.exited()
                if code is None:
                    continue
                worker.exit_code = code
                if code != 0 and worker.stopped is None:  # one the driver stopped on purpose is no failure
                    failed.append((worker, code))
            for worker, code in failed:  # after every exit is known: the count of remaining workers is right
                self.failure = self.failure or (worker, code)
                self._report_failure(worker, code)
            live = self.live()
            if not live:  # success when the workers of the last round finished; lost workers before do not count
                if any(w.exit_code == 0 for w in self.workers):
                    return JobOutcome(0)
                report("every worker has exited without finishing")
                return JobOutcome(
                    self.failure[1] if self.failure else 1, self.failure[0].index if self.failure else None
                )
            if any(w.exit_code == 0 for w in self.workers):
                # The job is finishing: no new rounds, no new workers. One not in the last round (still starting,
                # or waiting for a round that will not come) would only wait out its timeout: it stops now.
                for worker in self.active():
                    if worker.worker_id not in self.members:
                        report(
                            f"stopping worker {worker.worker_id} ({self._describe_rank(worker)} on {worker.host}): "
                            f"the job is finishing; it is not a failure"
                        )
                        self._stop(worker, "the job is finishing")
                time.sleep(_POLL_INTERVAL)
                continue
            now = time.monotonic()
            if now - last_discovery >= self.elastic.discovery_interval:
                last_discovery = now
                try:
                    hosts = discover_hosts(self.elastic.discovery_script, self.elastic.slots_per_host)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    report(f"host discovery failed ({exc}); keeping the current hosts")
                self._discovered(hosts)
            self._newcomers_waiting()
            live = self.active()  # stopped workers that have not exited yet take no part
            if not live:
                time.sleep(_POLL_INTERVAL)
                continue
            target = self.round + 1
            ready = [w for w in live if self._ready(w, target)]
            if not ready:
                waiting_since = None
                time.sleep(_POLL_INTERVAL)
                continue
            # Whom the round waits for: the members, and new workers already waiting (round 0: everyone).
            if self.members:
                live = [w for w in live if w.worker_id in self.members or w in ready]
            # The settling clock starts when a member of the current round asks for the next one (its round has
            # ended: a failure or added workers). Workers that only joined wait for the members' next commit,
            # however far away it is.
            if any(w.worker_id in self.members for w in ready) or not self.members:
                waiting_since = waiting_since or now
            if len(ready) < len(live) and (waiting_since is None or now - waiting_since < ROUND_SETTLE_SECONDS):
                time.sleep(_POLL_INTERVAL)
                continue
            staying = [w for w in ready if not w.leaving]
            if len(staying) < self.elastic.min_np:
                short_since = short_since or now
                wait_limit, flag = (
                    (self.settings.start_timeout, "--start-timeout")
                    if self.elastic.elastic_timeout is None
                    else (self.elastic.elastic_timeout, "--elastic-timeout")
                )
                if now - short_since > wait_limit:
                    report(
                        f"only {len(staying)} worker(s) can continue, fewer than --min-np {self.elastic.min_np}, "
                        f"and no more came within {wait_limit:g} s ({flag}); stopping the job"
                    )
                    return JobOutcome(
                        self.failure[1] if self.failure else 1, self.failure[0].index if self.failure else None
                    )
                time.sleep(_POLL_INTERVAL)
                continue
            short_since = None
            if self.round >= 0 and self.elastic.reset_limit is not None and target > self.elastic.reset_limit:
                report(
                    f"the job has re-formed {target - 1} time(s) and --reset-limit is "
                    f"{self.elastic.reset_limit}; stopping it instead of re-forming it again"
                )
                return JobOutcome(
                    self.failure[1] if self.failure else 1, self.failure[0].index if self.failure else None
                )
            for worker in live:
                if worker not in ready:
                    report(
                        f"worker {worker.worker_id} on {worker.host} did not ask to join round {target} within "
                        f"{ROUND_SETTLE_SECONDS:g} s; stopping it"
                    )
                    terminate_group(worker.process)
                    self._blacklist(worker.host)
            self._drop_leavers(ready)
            self._form_round(staying)
            waiting_since = None
