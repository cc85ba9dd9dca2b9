"""Starting a rank on another host with the OpenSSH client.

``ssh [options] host exec bash -s`` runs bash on the remote host reading its script from ssh's stdin. The
launcher writes a script (:func:`remote_script`) made of ``export NAME='value'`` lines, a ``cd`` to the
launcher's working directory and the rank's command, and then keeps stdin open. So:

* the environment, the job secret included, never appears on a command line (neither ours in ``ps`` nor the
  remote one): ``export`` is a bash builtin and the script travels inside the encrypted ssh channel;
* stdin is a lifeline: the remote script starts the rank in its own process group and watches stdin. When
  it reaches EOF (the launcher closed it to stop the rank, or the launcher or ssh died, or the connection
  broke) the script sends SIGTERM to the rank's process group, then SIGKILL after a grace period. No
  remote orphans, even when the launcher is killed with SIGKILL;
* the remote exit code (128 + signal number for a rank killed by a signal) is ssh's exit code. ssh itself
  exits 255 when it cannot connect or authenticate.

The rank's own stdin is ``/dev/null``, as for local ranks.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
import subprocess
from typing import List, Mapping, Optional, Sequence

from hvdlite.runner.processes import TERMINATE_GRACE_SECONDS, RankProcess, start_rank

SSH = "ssh"
SSH_FAILURE_CODE = 255
#: ssh's keepalive through the encrypted channel: an unreachable host is given up after about 5-6 s.
SERVER_ALIVE_INTERVAL = 1
SERVER_ALIVE_COUNT = 5


@dataclasses.dataclass
class SshOptions:
    port: Optional[int] = None
    identity_file: Optional[str] = None
    config_file: Optional[str] = None
    options: List[str] = dataclasses.field(default_factory=list)  # "Key=Value", each passed as -o
    connect_timeout: Optional[float] = None


def ssh_option_args(options: SshOptions) -> List[str]:
    # ssh keeps the first value it gets for an option: the user's options go before our defaults so that
    # they win (e.g. -o BatchMode=no).
    args: List[str] = []
    if options.config_file:
        args += ["-F", options.config_file]
    for option in options.options:
        args += ["-o", option]
    if options.port is not None:
        args += ["-p", str(options.port)]
    if options.identity_file:
        args += ["-i", options.identity_file]
    args += ["-o", "BatchMode=yes"]  # fail instead of prompting for a password nobody can type
    # A host that vanishes (power, link down) sends no FIN: without these ssh would wait for hours, and the
    # launcher with it. ssh gives up after 5 unanswered requests a second apart and exits 255.
    args += [
        "-o",
        "ServerAliveInterval=%d" % SERVER_ALIVE_INTERVAL,
        "-o",
        "ServerAliveCountMax=%d" % SERVER_ALIVE_COUNT,
    ]
    if options.connect_timeout:
        args += ["-o", "ConnectTimeout=%d" % max(1, round(options.connect_timeout))]
    return args


def ssh_command(host: str, options: SshOptions) -> List[str]:
    """The command that runs the remote script on ``host`` (``-T``: no terminal, so stdout and stderr stay
    apart and nothing translates line endings)."""
    return [SSH, "-T"] + ssh_option_args(options) + [host, "exec bash -s"]


def resolve_hostname(host: str, options: SshOptions) -> str:
    """The address ssh will connect to for ``host``, after ssh config aliases (``ssh -G``); ``host`` itself
    if ssh cannot say."""
    try:
        out = subprocess.run(
            [SSH, "-G"] + ssh_option_args(options) + [host],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return host.rsplit("@", 1)[-1]
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return host.rsplit("@", 1)[-1]


def remote_script(
    env: Mapping[str, str], cwd: str, command: Sequence[str], grace: float = TERMINATE_GRACE_SECONDS
) -> bytes:
    """The bash script that runs one rank on the remote host (see the module docstring).

    Everything is inside one ``{ ... }`` group: bash reads a whole compound command before running it, so
    the watcher's ``cat`` cannot swallow the rest of the script. ``set -m`` gives the rank and the watcher
    their own process groups (and keeps the watcher's stdin: without job control bash would give a
    background job /dev/null).
    """
    lines = ["{"]
    lines += ["export %s=%s" % (key, shlex.quote(value)) for key, value in sorted(env.items())]
    lines += [
        'cd %s || { echo "hvdlite-run: cannot cd to %s on $(hostname)" >&2; exit 127; }'
        % (shlex.quote(cwd), cwd.replace('"', "'")),
        "set -m",
        "%s </dev/null &" % " ".join(shlex.quote(arg) for arg in command),
        "rank_pid=$!",
        "{ cat >/dev/null; kill -TERM -- -$rank_pid; kill -CONT -- -$rank_pid; sleep %g; kill -KILL -- -$rank_pid; }"
        " >/dev/null 2>&1 &" % grace,
        "watcher_pid=$!",
        "set +m",
        "wait $rank_pid",
        "code=$?",
        # As for local ranks: nothing the rank left in its process group outlives it.
        "kill -KILL -- -$rank_pid -$watcher_pid 2>/dev/null",
        "exit $code",
        "}",
        "",
    ]
    return "\n".join(lines).encode()


class RemoteRankProcess(RankProcess):
    """A rank started through ssh: the local process is the ssh client."""

    host: str = "?"

    def stopped(self) -> bool:
        return False  # the local process is the ssh client; the rank's state on its host is not known here

    def describe(self) -> str:
        return "rank %d (on %s)" % (self.rank, self.host)

    def explain_exit(self, code: int) -> str:
        if code != SSH_FAILURE_CODE:
            return ""
        return (
            " (255 is ssh's own failure code: the connection to %s was lost (\"Timeout, server not "
            'responding" above: the host went down or its network was cut), or ssh could not connect: then '
            "check that 'ssh %s true' works without any prompt; an unknown host key can be accepted with "
            "--ssh-option StrictHostKeyChecking=accept-new)" % (self.host, self.host)
        )

    def signal_group(self, signum: int) -> None:
        # SIGTERM: close the lifeline, the remote script stops the rank and ssh exits with its code.
        # SIGKILL: kill the ssh client; the remote side then sees EOF and cleans up on its own.
        # SIGCONT: the remote script sends it after its SIGTERM.
        if signum == signal.SIGCONT:
            return
        if signum == signal.SIGTERM and self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
            return
        super().signal_group(signum)


def start_remote_rank(
    rank: int,
    host: str,
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    options: SshOptions,
    ssh_env: Mapping[str, str],
    output_dir: Optional[str] = None,
    size: Optional[int] = None,
) -> RemoteRankProcess:
    """Starts ``command`` as ``rank`` on ``host`` with environment ``env`` (exactly these variables on top of
    what sshd gives the login). ``ssh_env`` is the ssh client's own environment."""
    process = start_rank(
        rank,
        ssh_command(host, options),
        ssh_env,
        output_dir=output_dir,
        size=size,
        stdin_data=remote_script(env, cwd, command),
        process_class=RemoteRankProcess,
    )
    process.host = host
    return process
