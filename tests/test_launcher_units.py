"""Fast tests of the launcher's pieces: host parsing, the remote script (run through a local bash), the
mpirun command line, environment propagation and the choice of bootstrap mechanism."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from launcher_helpers import processes_with_marker, wait_until

from hvdlite.common import bootstrap, cluster_bootstrap
from hvdlite.runner import mpi_run
from hvdlite.runner.hosts import HostSlots, assign_ranks, parse_hostfile_text, parse_hosts
from hvdlite.runner.settings import Settings, propagated_environment
from hvdlite.runner.ssh import SshOptions, remote_script, ssh_command


def test_parse_hosts():
    assert parse_hosts("a:4,b:2") == [HostSlots("a", 4), HostSlots("b", 2)]
    assert parse_hosts("a, b:3") == [HostSlots("a", 1), HostSlots("b", 3)]
    assert parse_hosts("a:1,a:2") == [HostSlots("a", 3)]  # repeated hosts add up, as in mpirun
    assert parse_hosts("me@[fe80::1]:2")[0].hostname == "fe80::1"
    assert parse_hosts("me@node7:2")[0].hostname == "node7"
    for bad, message in (
        ("a:0", "positive"),
        ("a:x", "positive"),
        ("a,,b", "expected"),
        ("", "expected"),
        ("fe80::1:2", "brackets"),
        (":3", "empty host"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_hosts(bad)


def test_parse_hostfile():
    text = "# cluster\nnode1 slots=4\nnode2 slots=2 max_slots=8  # comment\n\nnode3\nnode4:3\n"
    assert parse_hostfile_text(text) == [
        HostSlots("node1", 4),
        HostSlots("node2", 2),
        HostSlots("node3", 1),
        HostSlots("node4", 3),
    ]
    with pytest.raises(ValueError, match=r"hosts:2: expected 'host slots=N'"):
        parse_hostfile_text("node1 slots=2\nnode2 cpus=4\n", "hosts")
    with pytest.raises(ValueError, match="no hosts"):
        parse_hostfile_text("# nothing\n")


def test_assign_ranks_fills_hosts_in_order():
    hosts = [HostSlots("a", 2), HostSlots("b", 2)]
    assert [h.name for h in assign_ranks(hosts, 3)] == ["a", "a", "b"]
    assert [h.name for h in assign_ranks(hosts, None)] == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="requested 5 processes but the hosts have only 4 slots"):
        assign_ranks(hosts, 5)


def _settings(*flags):
    from hvdlite.runner.arguments import build_parser, settings_from_args

    return settings_from_args(build_parser().parse_args(["-np", "2", *flags, "python", "t.py"]))


# An argument for each knob flag that takes one, and the value its variables must get.
KNOB_ARGUMENTS = {
    "--fusion-threshold-mb": ("0.5", "524288"),
    "--cycle-time-ms": ("2.5", "2.5"),
    "--cache-capacity": ("0", "0"),
    "--autotune-log-file": ("tune.csv", "tune.csv"),
    "--autotune-warmup-samples": ("3", "3"),
    "--timeline-filename": ("t.json", "t.json"),
    "--stall-check-warning-time-seconds": ("7", "7"),
    "--stall-check-shutdown-time-seconds": ("9", "9"),
    "--log-level": ("DEBUG", "debug"),
}


def test_every_knob_flag_sets_its_variables():
    """Read from the one table: each flag, alone, gives every rank exactly its variables."""
    from hvdlite.runner.knob_flags import KNOB_FLAGS

    assert {flag for knob in KNOB_FLAGS if knob.convert for flag in knob.flags} == set(KNOB_ARGUMENTS)
    for knob in KNOB_FLAGS:
        for flag in knob.flags:
            argument, expected = KNOB_ARGUMENTS[flag] if knob.convert else ((), knob.constant)
            env = _settings(flag, *([argument] if argument else [])).knob_env()
            assert env == {"HVDLITE_START_TIMEOUT": "60", **{"HVDLITE_" + v: expected for v in knob.variables}}, flag


def test_knob_flags_last_one_wins_and_defaults_stay_unset():
    assert _settings("--hierarchical-allreduce", "--no-hierarchical-allreduce").knobs == {
        "HVDLITE_HIERARCHICAL_ALLREDUCE": "0"
    }
    assert _settings().knob_env() == {"HVDLITE_START_TIMEOUT": "60"}  # the model chooses, the core's defaults
    assert _settings("--gloo-timeout-seconds", "12.5").knob_env() == {"HVDLITE_START_TIMEOUT": "12.5"}
    settings = _settings("--network-interface", "eth0", "--network-interfaces", "ib0,eth1")
    assert settings.knob_env()["HVDLITE_NETWORK_INTERFACE"] == "eth0,ib0,eth1"
    # horovodrun's --disable-cache turns off its cache of host checks, which hvdlite-run does not keep: the
    # tensor response cache is left alone
    assert _settings("--disable-cache").knob_env() == {"HVDLITE_START_TIMEOUT": "60"}


@pytest.mark.parametrize(
    "flag,value",
    [("--cycle-time-ms", "0"), ("--fusion-threshold-mb", "-1"), ("--cache-capacity", "1.5"), ("--log-level", "LOUD")],
)
def test_bad_knob_values_are_refused_naming_the_flag(flag, value, capsys):
    with pytest.raises(SystemExit):
        _settings(flag, value)
    assert flag in capsys.readouterr().err


def test_horovodrun_flags_that_cannot_apply_fail_saying_why(capsys):
    from hvdlite.runner.knob_flags import UNSUPPORTED_FLAGS

    for flag, why in UNSUPPORTED_FLAGS.items():
        for extra in ([], ["2"]):
            with pytest.raises(SystemExit):
                _settings(flag, *extra)
            assert "%s is not supported: %s" % (flag, why) in capsys.readouterr().err


def test_propagated_environment_drops_login_specific_variables():
    env = {
        "PATH": "/x",
        "PYTHONPATH": "/y",
        "MY_VAR": "1",
        "HOME": "/root",
        "SSH_AUTH_SOCK": "/s",
        "PWD": "/w",
        "BASH_FUNC_f%%": "() { :; }",
        "not-a-name": "v",
        "HVDLITE_FUSION_THRESHOLD": "9",
    }
    assert propagated_environment(env) == {
        "PATH": "/x",
        "PYTHONPATH": "/y",
        "MY_VAR": "1",
        "HVDLITE_FUSION_THRESHOLD": "9",
    }


def test_ssh_command_puts_user_options_first():
    options = SshOptions(port=2222, identity_file="/k", config_file="/c", options=["BatchMode=no"], connect_timeout=7)
    assert ssh_command("node1", options) == [
        "ssh",
        "-T",
        "-F",
        "/c",
        "-o",
        "BatchMode=no",
        "-p",
        "2222",
        "-i",
        "/k",
        "-o",
        "BatchMode=yes",
        "-o",
        "ServerAliveInterval=1",
        "-o",
        "ServerAliveCountMax=5",
        "-o",
        "ConnectTimeout=7",
        "node1",
        "exec bash -s",
    ]


def _run_remote_script(env, command, cwd="/", close_after=None):
    """Runs the remote script through a local `bash -s`, as sshd would on the remote host."""
    proc = subprocess.Popen(
        ["bash", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    proc.stdin.write(remote_script(env, cwd, command, grace=2))
    proc.stdin.flush()
    try:
        if close_after is None:
            proc.wait(timeout=20)  # stdin stays open: closing it would stop the rank
        else:
            time.sleep(close_after)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out.decode(), err.decode()


def test_remote_script_sets_environment_and_exit_code(tmp_path):
    env = {"PLAIN": "x", "TRICKY": 'it\'s "quoted" $HOME `date` \n next line', "EMPTY": ""}
    code = (
        "import os, sys; print(repr(os.environ['TRICKY']), os.environ['PLAIN'], repr(os.environ['EMPTY']), "
        "os.getcwd(), sys.stdin.read() == ''); sys.exit(5)"
    )
    returncode, out, err = _run_remote_script(env, [sys.executable, "-c", code], cwd=str(tmp_path))
    assert returncode == 5, err
    assert out == "%r x '' %s True\n" % (env["TRICKY"], tmp_path)
    returncode, _, err = _run_remote_script({}, ["true"], cwd="/nonexistent/dir")
    assert returncode == 127 and "cannot cd to /nonexistent/dir" in err


def test_remote_script_stops_the_rank_when_stdin_closes():
    marker = "hvdlite-lifeline-" + uuid.uuid4().hex
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)', sys.argv[1]]); time.sleep(60)"
    )
    start = time.monotonic()
    returncode, _, _ = _run_remote_script({}, [sys.executable, "-c", code, marker], close_after=1.0)
    assert returncode == 128 + signal.SIGTERM
    assert time.monotonic() - start < 10
    assert wait_until(lambda: not processes_with_marker(marker), timeout=5)


def test_mpirun_moves_tensors_through_mpi_unless_told_otherwise():
    settings = Settings(np=2)
    assert mpi_run.rank_environment(settings, {})["HVDLITE_CPU_OPERATIONS"] == "mpi"
    # the user's choice (Horovod's variable too) stands
    assert "HVDLITE_CPU_OPERATIONS" not in mpi_run.rank_environment(settings, {"HOROVOD_CPU_OPERATIONS": "gloo"})
    assert (
        mpi_run.rank_environment(settings, {"HVDLITE_CPU_OPERATIONS": "builtin"})["HVDLITE_CPU_OPERATIONS"]
        == "builtin"
    )


def test_mpirun_command_for_open_mpi_and_mpich():
    settings = Settings(
        np=4,
        hosts=parse_hosts("a:2,b:2"),
        network_interfaces=["eth0"],
        output_filename="out",
        ssh=SshOptions(port=2222),
        mpi_args=["--mca", "x", "y"],
        knobs={"HVDLITE_CYCLE_TIME": "3"},
    )
    # Started from inside another job's rank: that job's placement must not reach the MPI ranks.
    env = mpi_run.rank_environment(
        settings,
        {
            "PATH": "/bin",
            "HVDLITE_RANK": "1",
            "OMPI_COMM_WORLD_RANK": "0",
            "HOME": "/root",
            "HOROVOD_RANK": "1",
            "HOROVOD_HOSTNAME": "a",
            "HOROVOD_FUSION_THRESHOLD": "1024",
            "HVDLITE_CPU_OPERATIONS": "gloo",
        },
    )
    assert env == {
        "PATH": "/bin",
        "HOME": "/root",
        "HVDLITE_START_TIMEOUT": "60",
        "HVDLITE_CYCLE_TIME": "3",
        "HVDLITE_CPU_OPERATIONS": "gloo",
        "HVDLITE_NETWORK_INTERFACE": "eth0",
        "HOROVOD_FUSION_THRESHOLD": "1024",
    }
    cmd = mpi_run.mpirun_command(settings, ["python", "t.py"], env, "mpirun", mpi_run.OPEN_MPI, is_root=True)
    wrapped = [sys.executable, "-m", "hvdlite.runner.rank_lines", "--", "python", "t.py"]
    assert cmd == [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "4",
        "-H",
        "a:2,b:2",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "-mca",
        "plm_rsh_args",
        "-p 2222 -o BatchMode=yes -o ServerAliveInterval=1 -o ServerAliveCountMax=5",
        "-mca",
        "btl_tcp_if_include",
        "eth0",
        "-mca",
        "oob_tcp_if_include",
        "eth0",
        "--output-filename",
        "out",
        "-x",
        "HOROVOD_FUSION_THRESHOLD",
        "-x",
        "HVDLITE_CPU_OPERATIONS",
        "-x",
        "HVDLITE_CYCLE_TIME",
        "-x",
        "HVDLITE_NETWORK_INTERFACE",
        "-x",
        "HVDLITE_START_TIMEOUT",
        "-x",
        "PATH",
        "--mca",
        "x",
        "y",
        *wrapped,
    ]
    settings.ssh = SshOptions()
    settings.output_filename = None
    cmd = mpi_run.mpirun_command(settings, ["python", "t.py"], env, "mpiexec", mpi_run.MPICH)
    assert cmd == ["mpiexec", "-n", "4", "-hosts", "a:2,b:2", "-iface", "eth0", "--mca", "x", "y", *wrapped]
    # horovodrun's --binding-args replace the default binding; --prefix-output-with-timestamp reaches the wrapper
    settings.binding_args, settings.prefix_timestamps = ["--bind-to", "core"], True
    cmd = mpi_run.mpirun_command(settings, ["python", "t.py"], env, "mpirun", mpi_run.OPEN_MPI, is_root=False)
    assert cmd[:6] == ["mpirun", "-np", "4", "-H", "a:2,b:2", "--bind-to"] and cmd[6] == "core", cmd
    assert "--map-by" not in cmd and cmd[-7:] == [*wrapped[:3], "--timestamps", "--", "python", "t.py"], cmd


def test_bootstrap_mechanism_order():
    detect = bootstrap.detect_method
    assert detect({}) == "single"
    assert detect({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}) == "slurm"
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}) == "single"  # a batch script, not a step
    slurm_torchrun = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "RANK": "3", "WORLD_SIZE": "4"}
    assert detect(slurm_torchrun) == "torchrun"
    assert detect(dict(slurm_torchrun, OMPI_COMM_WORLD_SIZE="4")) == "mpi"
    assert detect({"OMPI_COMM_WORLD_SIZE": "1"}) == "single"  # mpirun -np 1 needs no MPI
    assert detect({"PMI_SIZE": "2", "HVDLITE_RANK": "0"}) == "launcher"
    assert detect({"PMI_SIZE": "2", "HVDLITE_BOOTSTRAP": "slurm"}) == "slurm"
    with pytest.raises(ValueError, match="HVDLITE_BOOTSTRAP"):
        detect({"HVDLITE_BOOTSTRAP": "pbs"})


def test_torchrun_and_slurm_placement():
    env = {
        "RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "abc",
        "HVDLITE_SECRET": "11" * 32,
    }
    placement = cluster_bootstrap.torchrun_placement(env)
    assert (placement.rank, placement.size, placement.rendezvous, placement.job_id) == (
        1,
        4,
        ("node0", 29501),
        "torchrun.abc.0",
    )
    assert placement.secret == bytes.fromhex("11" * 32) and placement.multi_host and not placement.serve_rendezvous
    public = cluster_bootstrap.torchrun_placement(dict(env, HVDLITE_SECRET="", RANK="0"))
    assert public.serve_rendezvous and len(public.secret) == 32
    with pytest.raises(RuntimeError, match="must be hex"):
        cluster_bootstrap.torchrun_placement(dict(env, HVDLITE_SECRET="xyz"))
    with pytest.raises(RuntimeError, match="set MASTER_ADDR"):
        cluster_bootstrap.torchrun_placement({"RANK": "0", "WORLD_SIZE": "2"})

    slurm = {
        "SLURM_PROCID": "2",
        "SLURM_STEP_ID": "3",
        "SLURM_JOB_ID": "812",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "gpu[007-008,010],cpu1",
        "SLURM_STEP_NUM_NODES": "4",
        "SLURMD_NODENAME": "gpu008",
        "HVDLITE_SECRET": "22" * 32,
    }
    placement = cluster_bootstrap.slurm_placement(slurm)
    assert (placement.rank, placement.size, placement.hostname, placement.job_id) == (2, 4, "gpu008", "slurm.812.3")
    assert placement.rendezvous == ("gpu007", cluster_bootstrap.slurm_port("812", "3"))
    assert 20000 <= placement.rendezvous[1] < 32000 and placement.multi_host
    assert cluster_bootstrap.first_host("node1,node2") == "node1"
    assert cluster_bootstrap.first_host("n[1-3]") == "n1"


def test_advertise_address():
    advertise = bootstrap.advertise_address
    one_host = bootstrap.Placement(size=2, rendezvous=("127.0.0.1", 1), method="launcher")
    assert advertise(one_host, {}) == "127.0.0.1"
    assert advertise(one_host, {"HVDLITE_ADVERTISE_ADDR": "10.9.8.7"}) == "10.9.8.7"
    assert advertise(one_host, {"HVDLITE_NETWORK_INTERFACE": "hvdlite-none0,lo"}) == "127.0.0.1"
    with pytest.raises(RuntimeError, match="none of the network interfaces hvdlite-none0"):
        advertise(one_host, {"HOROVOD_NETWORK_INTERFACE": "hvdlite-none0"})
    # torchrun with several "nodes" on this machine: MASTER_ADDR=localhost is a one-machine job, not an error.
    assert (
        advertise(bootstrap.Placement(size=4, rendezvous=("localhost", 1), method="torchrun", multi_host=True), {})
        == "127.0.0.1"
    )
    # MPI, every rank on this host: nothing to route to.
    assert (
        advertise(bootstrap.Placement(size=2, hostname="h", peer_hosts=["h", "h"], method="mpi"), {}) == "127.0.0.1"
    )


def test_output_folders_are_zero_padded_as_horovodrun_pads_them():
    from hvdlite.runner.processes import rank_output_folder

    assert [rank_output_folder("d", rank, size) for rank, size in ((0, 1), (9, 10), (3, 12), (10, 11), (5, 101))] == [
        "d/rank.0",
        "d/rank.9",
        "d/rank.03",
        "d/rank.10",
        "d/rank.005",
    ]


def test_runner_local_is_hvdlite_run_with_the_same_flags(capsys):
    """python -m hvdlite.runner.local translates its flags into hvdlite-run's, which has --host-ids hidden from
    --help; the emulated hosts give the same places as before."""
    from hvdlite.runner import local
    from hvdlite.runner.arguments import build_parser, command_of, settings_from_args
    from hvdlite.runner.hosts import compute_topology, emulated_hosts
    from hvdlite.runner.job import BuiltinJob

    args = local._build_parser().parse_args(
        ["-np", "3", "--host-ids", "0,1,0", "--timeout", "7.5", "--output-filename=-out"]
    )
    argv = local.hvdlite_run_argv(args, ["python", "-m", "x", "--", "-np"])
    assert argv == [
        "-np",
        "3",
        "--host-ids=0,1,0",
        "--timeout=7.5",
        "--output-filename=-out",
        "--",
        "python",
        "-m",
        "x",
        "--",
        "-np",
    ]
    parsed = build_parser().parse_args(argv)
    assert command_of(parsed) == ["python", "-m", "x", "--", "-np"]
    settings = settings_from_args(parsed)
    assert (settings.np, settings.host_ids, settings.timeout, settings.output_filename) == (
        3,
        ["0", "1", "0"],
        7.5,
        "-out",
    )
    job = BuiltinJob(settings, ["true"])
    assert [host.name for host in job.assignment] == ["host0", "host1", "host0"] and all(job.is_local.values())
    assert job.topology == compute_topology(3, ["0", "1", "0"])
    assert [host.slots for host in emulated_hosts(["0", "1", "0"])] == [2, 1, 2]
    with pytest.raises(ValueError, match="--host-ids has 2 entries for -np 3"):
        settings_from_args(build_parser().parse_args(["-np", "3", "--host-ids", "0,1", "true"]))
    with pytest.raises(ValueError, match="-H/--hostfile"):
        settings_from_args(build_parser().parse_args(["-np", "2", "-H", "a:2", "--host-ids", "0,1", "true"]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    assert "--host-ids" not in capsys.readouterr().out


def test_horovodrun_elastic_flag_names_are_accepted():
    from hvdlite.runner.arguments import build_parser

    args = build_parser().parse_args(
        [
            "-np",
            "2",
            "--min-num-proc",
            "1",
            "--max-num-proc",
            "3",
            "--slots",
            "2",
            "--host-discovery-script",
            "discover.sh",
            "python",
            "t.py",
        ]
    )
    assert (args.min_np, args.max_np, args.slots_per_host) == (1, 3, 2)


def test_config_file_errors_name_the_entry(tmp_path):
    from hvdlite.runner import config_file

    def arguments(text, controller_given=False):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        return config_file.expand(["-np", "2", "python", "t.py"], str(path), controller_given)

    assert arguments("controller: MPI\nstall_check: {enabled: false}\nlogging: {with_timestamp: false}") == [
        "--mpi",
        "--no-stall-check",
        "--log-without-timestamp",
        "-np",
        "2",
        "python",
        "t.py",
    ]
    assert arguments("controller: mpi", controller_given=True)[0] == "-np"
    assert arguments("library_options: {num_nccl_streams: null, mpi_threads_disable: false}")[0] == "-np"
    for text, message in [
        ("params: {fusion_treshold_mb: 3}", "unknown key params.fusion_treshold_mb; params takes"),
        ("tuning: {a: 1}", "unknown section 'tuning'"),
        (
            "library_options: {num_nccl_streams: 2}",
            "library_options.num_nccl_streams: --num-nccl-streams is not supported: hvdlite's NCCL data plane",
        ),
        ("controller: jsrun", "controller is 'jsrun'; hvdlite-run takes gloo or mpi"),
        ("params: [1, 2", "is not valid YAML"),
        ("params: {hierarchical_allreduce: maybe}", "params.hierarchical_allreduce: 'maybe' is not true or false"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            arguments(text)
    with pytest.raises(ValueError, match="No such file"):
        config_file.expand([], str(tmp_path / "missing.yaml"), False)


def test_horovodrun_short_spellings():
    from hvdlite.runner.arguments import build_parser

    args = build_parser().parse_args(["-prefix-timestamp", "-np", "1", "python", "t.py"])
    assert args.prefix_output_with_timestamp and args.np == 1
