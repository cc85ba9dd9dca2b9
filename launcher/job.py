"""The built-in launch mode: a rendezvous service plus one process per rank, started directly on this
machine or over ssh on the others (protocol in docs/launcher.md)."""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import shlex
import signal
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hvdlite.common import network
from hvdlite.common.rendezvous import RendezvousClient, RendezvousServer
from hvdlite.common.topology import topology_for_hosts
from hvdlite.runner.hosts import HostSlots, assign_ranks, emulated_hosts
from hvdlite.runner.output import report
from hvdlite.runner.processes import TIMEOUT_EXIT_CODE, JobOutcome, RankProcess, build_rank_env, run_ranks, start_rank
from hvdlite.runner.settings import Settings, propagated_environment
from hvdlite.runner.ssh import resolve_hostname, ssh_command, start_remote_rank


class LaunchError(RuntimeError):
    """The job cannot be started as asked (no route to a host, an unknown interface, too few slots...)."""


class BuiltinJob:
    """One job: ``with BuiltinJob(settings, command) as job: outcome = job.run()``.

    The rendezvous service runs from ``__enter__`` to ``__exit__``, so a caller (``hvdlite.run``) can store
    data for the ranks before :meth:`run` and read what they left after it.
    """

    def __init__(
        self,
        settings: Settings,
        command: Sequence[str],
        extra_env: Optional[Mapping[str, str]] = None,
        environ: Optional[Mapping[str, str]] = None,
    ):
        settings.validate()
        if not command:
            raise LaunchError("no command given")
        self.settings = settings
        self.ssh = dataclasses.replace(
            settings.ssh, connect_timeout=settings.ssh.connect_timeout or settings.start_timeout
        )
        self.command = list(command)
        self.environ = dict(os.environ if environ is None else environ)
        self.base_env = dict(self.environ)
        self.base_env.update(extra_env or {})
        self.base_env.update(settings.knob_env())
        self.assignment: List[HostSlots]
        self.is_local: Dict[str, bool]
        if settings.host_ids is not None:  # one machine pretending to be several hosts (--host-ids)
            self.assignment = emulated_hosts(settings.host_ids)
            self.is_local = {host.name: True for host in self.assignment}
        else:
            hosts = settings.host_list()
            try:
                self.assignment = assign_ranks(hosts, settings.np)
            except ValueError as exc:
                raise LaunchError(str(exc)) from None
            self.is_local = {host.name: network.is_local_host(host.hostname) for host in hosts}
        self.topology = topology_for_hosts([host.hostname for host in self.assignment])
        self.secret = secrets.token_bytes(32)
        self.job_id = secrets.token_hex(6)
        self.server: Optional[RendezvousServer] = None
        self._address_for: Dict[str, str] = {}

    # -- rendezvous -----------------------------------------------------------------------------------

    def _rendezvous_addresses(self) -> Tuple[str, Dict[str, str]]:
        """(address to bind, {host: address its ranks use to reach the service})."""
        names = list(dict.fromkeys(host.name for host in self.assignment))
        remote = [name for name in names if not self.is_local[name]]
        if self.settings.network_interfaces:
            address = network.first_interface_ipv4(self.settings.network_interfaces)
            if address is None:
                raise LaunchError(
                    "none of the network interfaces %s has an IPv4 address on this machine"
                    % ",".join(self.settings.network_interfaces)
                )
            return address, {name: address for name in names}
        if not remote:
            return "127.0.0.1", {name: "127.0.0.1" for name in names}
        per_host = {}
        for name in remote:
            target = resolve_hostname(name, self.ssh)
            try:
                per_host[name] = network.source_address_for(target)
            except OSError as exc:
                raise LaunchError(
                    "cannot find a route from this machine to %s (%s): %s" % (name, target, exc)
                ) from None
        # Local ranks must be reachable from the remote ones too: not loopback.
        for name in names:
            per_host.setdefault(name, per_host[remote[0]])
        distinct = set(per_host.values())
        return (distinct.pop() if len(distinct) == 1 else "0.0.0.0"), per_host

    def __enter__(self) -> "BuiltinJob":
        bind, self._address_for = self._rendezvous_addresses()
        self.server = RendezvousServer(self.secret, host=bind, port=0).start()
        if self.settings.verbose:
            report("rendezvous service at %s:%d (job %s)" % (bind, self.server.address[1], self.job_id))
        return self

    def __exit__(self, *exc_info) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def client(self) -> RendezvousClient:
        """A client of this job's rendezvous service (for the launcher's own use)."""
        host, port = self.server.address
        return RendezvousClient("127.0.0.1" if host == "0.0.0.0" else host, port, self.secret)

    # -- ranks ----------------------------------------------------------------------------------------

    def _starter(self, rank: int) -> Callable[[], RankProcess]:
        host = self.assignment[rank]
        info = self.topology[rank]
        local = self.is_local[host.name]
        base = self.base_env if local else propagated_environment(self.base_env)
        env = build_rank_env(
            info,
            rendezvous_addr=self._address_for[host.name],
            rendezvous_port=self.server.address[1],
            secret=self.secret,
            job_id=self.job_id,
            base_env=base,
        )
        output_dir = self.settings.output_filename
        if local:
            if self.settings.verbose:
                report("rank %d on %s (local): %s" % (rank, host.name, shlex.join(self.command)))
            return functools.partial(
                start_rank, rank, self.command, env, output_dir=output_dir, size=len(self.assignment)
            )
        if self.settings.verbose:
            report(
                "rank %d on %s over ssh: %s <<< [environment and command]"
                % (rank, host.name, shlex.join(ssh_command(host.name, self.ssh)))
            )
        return functools.partial(
            start_remote_rank,
            rank,
            host.name,
            self.command,
            env,
            os.getcwd(),
            self.ssh,
            self.environ,
            output_dir=output_dir,
            size=len(self.assignment),
        )

    def run(self) -> JobOutcome:
        if self.server is None:
            raise RuntimeError("BuiltinJob.run() outside of its with-block")
        return run_ranks([self._starter(rank) for rank in range(len(self.assignment))], self.settings.timeout)

    def missed_start(self, outcome: JobOutcome) -> bool:
        """Whether the job failed because its ranks did not all meet at their first ``hvd.init()`` within
        --start-timeout: the failed rank had published its address and waited for one that never did."""
        if outcome.code == 0 or outcome.failed_rank is None or self.server is None:
            return False
        scope = f"init.{self.job_id}.0"  # the ranks' first address exchange (hvdlite/common/bootstrap.py)
        published = [self.server.peek(scope, str(rank)) is not None for rank in range(len(self.assignment))]
        return published[outcome.failed_rank] and not all(published)


#: What one attempt at a job returns: how it ended, and why it must not be started again (None: it may be).
Attempt = Callable[[Settings], Tuple[JobOutcome, Optional[str]]]

#: The launcher's own signals: a job it stopped because it got one was stopped by the user.
_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_restarting(settings: Settings, attempt: Attempt) -> JobOutcome:
    """Runs ``attempt`` and, while it fails, again up to ``settings.max_restarts`` times (torchrun's
    --max-restarts). Each attempt's ranks find its number in HVDLITE_RESTART_COUNT (0 first); with
    --output-filename DIR, restart n keeps its ranks' output in DIR/restart.<n>. A job the launcher stopped (a
    signal it got, --timeout) or that missed its start is not started again."""
    restart = 0
    while True:
        knobs = dict(settings.knobs, HVDLITE_RESTART_COUNT=str(restart))
        output = settings.output_filename
        if output and restart:  # the failed attempts' output stays for a look at why they failed
            output = os.path.join(output, "restart.%d" % restart)
        outcome, keep_stopped = attempt(dataclasses.replace(settings, knobs=knobs, output_filename=output))
        if outcome.code == 0 or settings.max_restarts == 0:
            return outcome
        keep_stopped = keep_stopped or _stopped_by_launcher(outcome)
        if keep_stopped:
            report("the job is not started again: %s" % keep_stopped)
            return outcome
        if restart >= settings.max_restarts:
            report(
                "the job failed with exit code %d after %d restart(s) (--max-restarts %d); giving up"
                % (outcome.code, restart, settings.max_restarts)
            )
            return outcome
        restart += 1
        report(
            "the job failed with exit code %d; starting it again (restart %d of %d)"
            % (outcome.code, restart, settings.max_restarts)
        )


def _stopped_by_launcher(outcome: JobOutcome) -> Optional[str]:
    """Why the launcher itself stopped the job, if it did (a failed rank is named in the outcome; these are
    not)."""
    if outcome.failed_rank is not None:
        return None
    if outcome.code == TIMEOUT_EXIT_CODE:
        return "it was stopped by --timeout"
    if outcome.code - 128 in _STOPPING_SIGNALS:
        return "it was stopped by %s" % signal.Signals(outcome.code - 128).name
    return None


def run_command(settings: Settings, command: Sequence[str]) -> JobOutcome:
    """Runs ``command`` on every rank in the built-in mode, again after a failure as ``settings.max_restarts``
    allows."""

    def attempt(attempt_settings: Settings) -> Tuple[JobOutcome, Optional[str]]:
        with BuiltinJob(attempt_settings, command) as job:
            outcome = job.run()
            return outcome, (
                "its ranks did not all start within --start-timeout" if job.missed_start(outcome) else None
            )

    return run_restarting(settings, attempt)
