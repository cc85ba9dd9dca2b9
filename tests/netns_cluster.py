"""A throwaway cluster of test hosts on this machine, for tests of multi-host jobs over real ssh.

Each host is a network namespace joined to a bridge in the root namespace by a veth pair, with an address
10.123.<net>.<10+i>/24 (the launcher reaches them from 10.123.<net>.1 on the bridge) and its own OpenSSH
server on port 2222 with host keys, authorized key and config generated in a temporary directory. The
namespaces share the filesystem (and so the virtualenv) with the test, except root's home: each host sees it
through its own copy-on-write overlay, as a real host has its own. Logins run root's rc files there, and a host
the tests kill mid-login (a simulated crash) must not leave a lock in this machine's home that every later login
waits on (pyenv's rehash lock does that). Needs root, iproute2 and openssh-server; :func:`start_cluster` raises
:class:`ClusterUnavailable` with the reason otherwise.

Names carry this process's pid so that concurrent test runs on one machine do not collide; :meth:`stop`
kills everything running in the namespaces and deletes them.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import time
from typing import List, Optional

SSHD = "/usr/sbin/sshd"
SSH_PORT = 2222
COMMAND_TIMEOUT = 20


class ClusterUnavailable(RuntimeError):
    pass


@dataclasses.dataclass
class TestHost:
    alias: str  # name in the generated ssh config
    namespace: str
    address: str
    sshd: Optional[subprocess.Popen] = None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
    )
    if check and result.returncode != 0:
        raise ClusterUnavailable(
            "%s failed (exit %d): %s" % (" ".join(cmd), result.returncode, (result.stderr or result.stdout).strip())
        )
    return result


def _free_subnet() -> int:
    used = _run("ip", "-4", "-o", "addr", "show").stdout
    for candidate in [os.getpid() % 200 + 20] + list(range(20, 250)):
        if " 10.123.%d." % candidate not in used:
            return candidate
    raise ClusterUnavailable("no free 10.123.x.0/24 subnet for the test hosts")


def _processes_in(namespace: str) -> List[int]:
    result = _run("ip", "netns", "pids", namespace, check=False)
    return [int(pid) for pid in result.stdout.split()]


class Cluster:
    def __init__(self, workdir: str, count: int):
        self.workdir = workdir
        self.tag = "%d" % (os.getpid() % 100000)
        self.net = _free_subnet()
        self.bridge = "hvb" + self.tag
        self.gateway = "10.123.%d.1" % self.net
        self.hosts = [
            TestHost("hvdhost%d" % i, "hvdlite-%s-%d" % (self.tag, i), "10.123.%d.%d" % (self.net, 10 + i))
            for i in range(count)
        ]
        self.identity = os.path.join(workdir, "id_ed25519")
        self.ssh_config = os.path.join(workdir, "ssh_config")
        self._links: List[str] = []

    # -- setup --------------------------------------------------------------------------------------------

    def start(self) -> "Cluster":
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _run("ip", "addr", "add", self.gateway + "/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for index, host in enumerate(self.hosts):
            outside, inside = self.outside(index), self._veth(index)
            _run("ip", "netns", "add", host.namespace)
            _run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            self._links.append(outside)
            _run("ip", "link", "set", inside, "netns", host.namespace)
            _run("ip", "link", "set", outside, "master", self.bridge)
            _run("ip", "link", "set", outside, "up")
            _run("ip", "netns", "exec", host.namespace, "ip", "link", "set", "lo", "up")
            _run("ip", "netns", "exec", host.namespace, "ip", "addr", "add", host.address + "/24", "dev", inside)
            _run("ip", "netns", "exec", host.namespace, "ip", "link", "set", inside, "up")
        self._make_keys()
        for host in self.hosts:
            self._start_sshd(host)
        for host in self.hosts:
            self._wait_for_sshd(host)
        return self

    def _make_keys(self) -> None:
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdlite-test", "-f", self.identity)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.workdir, "host_ed25519"))
        shutil.copyfile(self.identity + ".pub", os.path.join(self.workdir, "authorized_keys"))
        with open(self.ssh_config, "w") as f:
            for host in self.hosts:
                f.write(
                    "Host %s\n  HostName %s\n  Port %d\n  User root\n  IdentityFile %s\n  IdentitiesOnly yes\n"
                    "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n\n"
                    % (host.alias, host.address, SSH_PORT, self.identity)
                )

    def _start_sshd(self, host: TestHost) -> None:
        # sshd refuses to start without its privilege separation directory (normally made by its service).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        config = os.path.join(self.workdir, "sshd_%s.conf" % host.alias)
        with open(config, "w") as f:
            f.write(
                "\n".join(
                    [
                        "Port %d" % SSH_PORT,
                        "ListenAddress %s" % host.address,
                        "HostKey %s" % os.path.join(self.workdir, "host_ed25519"),
                        "PidFile %s" % os.path.join(self.workdir, "sshd_%s.pid" % host.alias),
                        "AuthorizedKeysFile %s" % os.path.join(self.workdir, "authorized_keys"),
                        "PermitRootLogin prohibit-password",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        "StrictModes no",
                        "X11Forwarding no",
                        "AllowTcpForwarding no",
                        "PermitUserEnvironment no",
                        "MaxStartups 64",
                        "LogLevel ERROR",
                        "",
                    ]
                )
            )
        home = pwd.getpwuid(0).pw_dir
        layers = os.path.join(self.workdir, "home_%s" % host.alias)
        os.makedirs(os.path.join(layers, "upper"))
        os.makedirs(os.path.join(layers, "work"))
        # unshare and sh exec in turn, so the listener keeps the pid we start. Without overlayfs the host
        # shares this machine's home, as before, and says so in its log.
        overlay = "lowerdir=%s,upperdir=%s/upper,workdir=%s/work" % (home, layers, layers)
        start = "mount -t overlay overlay -o %s %s || echo 'test host: home not overlaid' >&2; exec %s" % (
            shlex.quote(overlay),
            shlex.quote(home),
            " ".join(shlex.quote(arg) for arg in (SSHD, "-D", "-e", "-f", config)),
        )
        log = open(os.path.join(self.workdir, "sshd_%s.log" % host.alias), "wb")
        host.sshd = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, "unshare", "--mount", "--propagation", "private"]
            + ["sh", "-c", start],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def _wait_for_sshd(self, host: TestHost, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if host.sshd.poll() is not None:
                with open(os.path.join(self.workdir, "sshd_%s.log" % host.alias)) as f:
                    raise ClusterUnavailable(
                        "sshd in %s exited with %d: %s" % (host.namespace, host.sshd.returncode, f.read().strip())
                    )
            try:
                with socket.create_connection((host.address, SSH_PORT), timeout=1.0):
                    return
            except OSError:
                time.sleep(0.1)
        raise ClusterUnavailable(
            "sshd in %s does not accept connections on %s:%d" % (host.namespace, host.address, SSH_PORT)
        )

    # -- use ------------------------------------------------------------------------------------------------

    def ssh_flags(self) -> List[str]:
        """hvdlite-run flags that reach the hosts by address, without the generated ssh config."""
        return [
            "-p",
            str(SSH_PORT),
            "-i",
            self.identity,
            "--ssh-option",
            "StrictHostKeyChecking=no",
            "--ssh-option",
            "UserKnownHostsFile=/dev/null",
            "--ssh-option",
            "LogLevel=ERROR",
        ]

    def interfaces(self) -> List[str]:
        """The bridge (the launcher's side), then each host's veth."""
        return [self.bridge] + [self._veth(index) for index in range(len(self.hosts))]

    def set_link(self, index: int, up: bool) -> None:
        """Cuts (``up=False``) or restores host ``index``'s link to the bridge, as if its cable were pulled: no
        FIN, no RST, packets in both directions simply vanish."""
        _run("ip", "link", "set", self.outside(index), "up" if up else "down")

    def limit_rate(self, index: int, rate: Optional[str]) -> None:
        """Host ``index``'s link at ``rate`` (tc's units, e.g. "1gbit") in both directions, with a token bucket
        (``tbf``: a 1 MB burst and up to 100 ms of queue, as a switch port buffers); ``None`` lifts it."""
        for prefix, device in (
            ((), self.outside(index)),
            (("ip", "netns", "exec", self.hosts[index].namespace), self._veth(index)),
        ):
            if rate is None:
                _run(*prefix, "tc", "qdisc", "del", "dev", device, "root", check=False)
            else:
                _run(
                    *prefix,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    device,
                    "root",
                    "tbf",
                    "rate",
                    rate,
                    "burst",
                    "1mb",
                    "latency",
                    "100ms",
                )

    def impair(self, index: int, rate: Optional[str], loss: Optional[float] = None) -> None:
        """Host ``index``'s link at ``rate`` (as limit_rate) and, inside the host, every packet in or out dropped
        with probability ``loss`` (iptables' statistic match: kernels without tc's netem are common on VMs);
        ``rate=None`` lifts both."""
        self.limit_rate(index, rate)
        netns = ("ip", "netns", "exec", self.hosts[index].namespace, "iptables-legacy")
        if rate is None or not loss:
            _run(*netns, "-F", check=False)
            return
        for chain in ("INPUT", "OUTPUT"):
            _run(*netns, "-A", chain, "-m", "statistic", "--mode", "random", "--probability", str(loss), "-j", "DROP")

    def outside(self, index: int) -> str:
        """Host ``index``'s link as seen from the bridge: what it receives there, the host sent."""
        return "hvo%s%d" % (self.tag, index)

    def _veth(self, index: int) -> str:
        return "hvi%s%d" % (self.tag, index)  # interface names have at most 15 characters

    def job_processes(self, host: TestHost) -> List[int]:
        """Processes in the host's namespace other than its sshd listener (``ip netns exec`` execs sshd, so
        the listener keeps the pid we started)."""
        return [pid for pid in _processes_in(host.namespace) if pid != host.sshd.pid]

    # -- teardown --------------------------------------------------------------------------------------

    def stop(self) -> None:
        for host in self.hosts:
            for pid in _processes_in(host.namespace) if self._namespace_exists(host.namespace) else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if host.sshd is not None:
                try:
                    os.killpg(host.sshd.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                host.sshd.wait(timeout=10)
            if self._namespace_exists(host.namespace):
                _run("ip", "netns", "del", host.namespace, check=False)
        for link in reversed(self._links):
            _run("ip", "link", "del", link, check=False)  # deleting one veth end removes the pair

    @staticmethod
    def _namespace_exists(namespace: str) -> bool:
        return os.path.exists(os.path.join("/run/netns", namespace))


def cluster_for_tests(tmp_path_factory, count: int, what: str):
    """Body of a pytest fixture: yields ``count`` hosts and removes them afterwards. The test fails, not skips,
    when the machine cannot create them, with the reason (``what`` names who needed them)."""
    import pytest

    workdir = str(tmp_path_factory.mktemp("cluster"))
    try:
        cluster = start_cluster(workdir, count=count)
    except ClusterUnavailable as exc:
        pytest.fail("cannot create the test hosts for %s: %s" % (what, exc), pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def start_cluster(workdir: str, count: int = 2) -> Cluster:
    """Creates ``count`` test hosts; raises ClusterUnavailable with the reason if this machine cannot."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("creating network namespaces needs root (running as uid %d)" % os.geteuid())
    for tool, package in (("ip", "iproute2"), ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            raise ClusterUnavailable("%s not found: apt-get install %s" % (tool, package))
    if not os.access(SSHD, os.X_OK):
        raise ClusterUnavailable("%s not found: apt-get install openssh-server" % SSHD)
    cluster = Cluster(workdir, count)
    try:
        return cluster.start()
    except BaseException:
        cluster.stop()
        raise
