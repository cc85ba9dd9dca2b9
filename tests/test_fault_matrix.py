"""The fault matrix: a rank dies in each way it can, in repeated trials, and the job must end cleanly.

Each trial starts ``hvdlite-run -np N`` with ranks that allreduce in a loop (tests/jobs/fault_trial.py), picks a
victim at random (rank 0, the coordinator, included), injects the fault once every rank is running, and checks:
every survivor's collective fails within the bound, naming the victim; the launcher exits non-zero within
10 s of the fault; afterwards no process of the job, no /dev/shm segment and no temporary file is left.

Bounds: a killed or raising rank is noticed through its closed sockets or its own report (2 s allowed); a
stopped rank only by its silence, after ``PEER_TIMEOUT_SECONDS`` (5 s by default; 5 + 2 s allowed).

The link-down cell runs on network-namespace test hosts (netns_cluster.py) started over ssh: np=3 on three hosts
of one rank, np=4 on two hosts of two. A random host's link is cut (no FIN, no RST: packets vanish); the ranks
on the other hosts must fail within ``PEER_UNREACHABLE_SECONDS`` (3 s, the kernel TCP heartbeat) + 2 s naming
every rank of the cut host, the ranks on the cut host must give up by themselves (they cannot be told), and
once the link is back nothing of the job is left on any host. The two cells run side by side, each in three
lanes of its own hosts.

SIGSTOP trials run five at a time (each mostly waits out the peer timeout), the others two at a time; the leftover
checks then cover all of them.
``HVDLITE_FAULT_TRIALS`` sets the trials per cell (5 by default, as in CI: every rank, or every host of the
link-down cell, is the victim once in a cell's first trials, then at random); with ``HVDLITE_FAULT_REPORT=path``
the measured detection and exit times are written there as JSON (docs/faults.md quotes them).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time

import pytest
from launcher_helpers import hvdlite_run
from multiproc import job_env

# Alone (tests/conftest.py): its bounds are seconds after the fault, and it checks every hvdlite entry in
# /dev/shm and /tmp before and after.
pytestmark = pytest.mark.alone

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
TRIAL_JOB = os.path.join(TESTS_DIR, "jobs", "fault_trial.py")
TRIALS = int(os.environ.get("HVDLITE_FAULT_TRIALS", "5"))
DETECTION_BOUND = {"sigkill": 2.0, "raise": 2.0, "sigstop": 5.0 + 2.0, "linkdown": 3.0 + 2.0}
LAUNCHER_EXIT_BOUND = 10.0
MEASURED: dict = {}


def victim_schedule(seed: str, choices: int) -> list:
    """TRIALS victims out of range(choices): each once in a shuffled order, then random ones."""
    rng = random.Random(seed)
    first = rng.sample(range(choices), choices)
    return (first + [rng.randrange(choices) for _ in range(max(0, TRIALS - choices))])[:TRIALS]


def shm_entries() -> set:
    return {name for name in os.listdir("/dev/shm") if "hvdlite" in name}


def tmp_entries() -> set:
    return {name for name in os.listdir("/tmp") if "hvdlite" in name}


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_for_files(directory, prefix: str, count: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(name.startswith(prefix) for name in os.listdir(directory)) >= count:
            return True
        time.sleep(0.02)
    return False


def survivor_errors(out, survivors, context: str) -> dict:
    """Rank -> the error each survivor recorded (tests/jobs/fault_trial.py writes error.<rank>)."""
    errors = {}
    for rank in survivors:
        path = out / f"error.{rank}"
        assert path.exists(), f"rank {rank} never saw an error\n{context}"
        errors[rank] = json.loads(path.read_text())
    return errors


def run_trial(tmp_path, np: int, fault: str, victim: int) -> dict:
    """One trial; returns its figures and the pids of its ranks (checked for leftovers by the caller)."""
    out = tmp_path / f"{fault}-np{np}-{victim}-{time.monotonic_ns()}"
    out.mkdir()
    launcher = subprocess.Popen(
        [hvdlite_run(), "-np", str(np), sys.executable, TRIAL_JOB, str(out), str(victim), fault],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert wait_for_files(out, "running.", np, 60), "the ranks never got going"
        pids = {r: int((out / f"pid.{r}").read_text()) for r in range(np)}
        fault_time = time.time()
        if fault == "sigkill":
            os.kill(pids[victim], signal.SIGKILL)
        elif fault == "sigstop":
            os.kill(pids[victim], signal.SIGSTOP)
        # "raise": the victim raises by itself at step 40, right after "running" (step 20) plus ~20 steps
        try:
            output, _ = launcher.communicate(timeout=LAUNCHER_EXIT_BOUND + 20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"hvdlite-run still running {LAUNCHER_EXIT_BOUND + 20} s after the fault")
        exit_time = time.time()
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    context = f"np={np} fault={fault} victim={victim}\n{output[-4000:]}"
    if fault == "raise":  # the fault is the victim's raise, which it timed just before
        fault_time = float((out / "raised").read_text())
    assert launcher.returncode != 0, context
    survivors = [r for r in range(np) if r != victim]
    errors = survivor_errors(out, survivors, context)
    detections = [error["time"] - fault_time for error in errors.values()]
    for rank, error in errors.items():
        assert f"rank {victim}" in error["message"], f"rank {rank}: {error}\n{context}"
        if fault in ("sigkill", "sigstop"):  # where this rank was: its last collectives
            assert f"collectives on rank {rank}, oldest first: " in error["message"], error
            assert "allreduce 'grad' (16 KB, pending)" in error["message"], error
        if fault == "raise":
            assert (
                f"rank {victim} on {socket.gethostname()} raised RuntimeError: user code failed at step 40"
                in error["message"]
            ), error
    assert max(detections) <= DETECTION_BOUND[fault], f"detections {detections}\n{context}"
    exit_after = exit_time - fault_time
    assert exit_after <= LAUNCHER_EXIT_BOUND, f"launcher exited {exit_after:.1f} s after the fault\n{context}"
    if fault in ("sigkill", "sigstop"):  # the launcher's closing summary: where each rank was
        assert "hvdlite: where each rank was (its last collectives" in output, context
        for rank in survivors:
            assert f"hvdlite:   rank {rank}: allreduce 'grad' (16 KB, done)" in output, context
    return {"detect_max_s": max(detections), "launcher_exit_s": exit_after, "pids": list(pids.values())}


def run_trials(tmp_path, np: int, fault: str, victims: list) -> list:
    """Runs the trials of ``victims`` side by side (a stopped rank's trial spends its time waiting out the peer
    timeout, so two at once take the time of one), then checks that nothing of theirs is left behind:
    processes, shared memory, temporary files."""
    shm_before, tmp_before = shm_entries(), tmp_entries()
    with concurrent.futures.ThreadPoolExecutor(len(victims)) as pool:
        results = list(pool.map(lambda victim: run_trial(tmp_path, np, fault, victim), victims))
    time.sleep(0.2)
    for result in results:
        assert not [pid for pid in result["pids"] if process_alive(pid)], result
    assert shm_entries() <= shm_before, f"left in /dev/shm: {shm_entries() - shm_before}"
    assert tmp_entries() <= tmp_before, f"left in /tmp: {tmp_entries() - tmp_before}"
    return results


@pytest.mark.timeout(TRIALS * 20 + 60)
@pytest.mark.parametrize("np", [3, 4])
@pytest.mark.parametrize("fault", ["sigkill", "raise", "sigstop"])
def test_fault_matrix(tmp_path, np, fault):
    victims = victim_schedule(f"{fault}-{np}", np)
    side_by_side = 5 if fault == "sigstop" else 2  # a stopped rank's trial mostly waits out the peer timeout
    results = []
    for first in range(0, TRIALS, side_by_side):
        results += run_trials(tmp_path, np, fault, victims[first : first + side_by_side])
    record_cell(f"{fault} np={np}", results)


def record_cell(cell: str, results: list) -> None:
    """Prints a cell's detection and launcher-exit figures and, with HVDLITE_FAULT_REPORT, writes all so far."""
    detect = [r["detect_max_s"] for r in results]
    exits = [r["launcher_exit_s"] for r in results]
    MEASURED[cell] = {
        "trials": len(results),
        "detect_median_s": statistics.median(detect),
        "detect_max_s": max(detect),
        "launcher_exit_median_s": statistics.median(exits),
        "launcher_exit_max_s": max(exits),
    }
    print(
        f"{cell}: detection median {statistics.median(detect):.2f} s, max {max(detect):.2f} s; "
        f"launcher exit median {statistics.median(exits):.2f} s, max {max(exits):.2f} s"
    )
    report = os.environ.get("HVDLITE_FAULT_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump(MEASURED, f, indent=1)


# -- the link-down cell -------------------------------------------------------------------------------------

LINK_DOWN_LAYOUTS = {3: [1, 1, 1], 4: [2, 2]}  # slots per host; ranks are numbered host by host
LINK_DOWN_LANES = 3  # trials of a cell that run side by side, each lane on its own hosts


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from netns_cluster import cluster_for_tests

    yield from cluster_for_tests(
        tmp_path_factory, LINK_DOWN_LANES * sum(map(len, LINK_DOWN_LAYOUTS.values())), "the link-down cell"
    )


def wait_until_gone(pids, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if process_alive(pid)]


def run_link_down_trial(cluster, tmp_path, np: int, first_host: int, victim_host: int) -> dict:
    layout = LINK_DOWN_LAYOUTS[np]
    hosts = [cluster.hosts[first_host + i] for i in range(len(layout))]
    rank_host = [index for index, slots in enumerate(layout) for _ in range(slots)]
    victims = [r for r in range(np) if rank_host[r] == victim_host]
    survivors = [r for r in range(np) if rank_host[r] != victim_host]
    out = tmp_path / f"linkdown-np{np}-{victim_host}-{time.monotonic_ns()}"
    out.mkdir()
    spec = ",".join(f"{host.address}:{slots}" for host, slots in zip(hosts, layout))
    launcher = subprocess.Popen(
        [
            hvdlite_run(),
            "-np",
            str(np),
            "-H",
            spec,
            *cluster.ssh_flags(),
            "--start-timeout",
            "30",
            sys.executable,
            TRIAL_JOB,
            str(out),
            str(victims[0]),
            "linkdown",
        ],
        env=job_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    link = first_host + victim_host
    cut = False
    try:
        assert wait_for_files(out, "running.", np, 60), "the ranks never got going"
        pids = {r: int((out / f"pid.{r}").read_text()) for r in range(np)}
        fault_time = time.time()
        cluster.set_link(link, up=False)
        cut = True
        try:
            output, _ = launcher.communicate(timeout=LAUNCHER_EXIT_BOUND + 20)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"hvdlite-run still running {LAUNCHER_EXIT_BOUND + 20} s after the link went down")
        exit_time = time.time()
        # The cut-off ranks hear nothing more from anyone: their own heartbeat must end them.
        stranded = wait_until_gone(
            [pids[r] for r in victims], fault_time + DETECTION_BOUND["linkdown"] + 5 - time.time()
        )
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        if cut:
            cluster.set_link(link, up=True)
    context = f"np={np} link down on {hosts[victim_host].address} (ranks {victims})\n{output[-4000:]}"
    assert not stranded, f"ranks on the cut-off host still running: {stranded}\n{context}"
    assert launcher.returncode != 0, context
    errors = survivor_errors(out, survivors, context)
    detections = [error["time"] - fault_time for error in errors.values()]
    for rank, error in errors.items():
        for victim in victims:
            assert f"rank {victim} ({hosts[victim_host].address}" in error["message"], (
                f"rank {rank}: {error}\n{context}"
            )
        assert "unreachable" in error["message"], f"rank {rank}: {error}\n{context}"
    assert max(detections) <= DETECTION_BOUND["linkdown"], f"detections {detections}\n{context}"
    exit_after = exit_time - fault_time
    assert exit_after <= LAUNCHER_EXIT_BOUND, (
        f"launcher exited {exit_after:.1f} s after the link went down\n{context}"
    )
    # The launcher's closing summary says where each rank was.
    assert "hvdlite: where each rank was" in output, context
    # Once the link is back, the sshd sessions of the cut host learn that their client is gone and end too.
    leftovers = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        leftovers = {host.alias: cluster.job_processes(host) for host in hosts}
        if not any(leftovers.values()):
            break
        time.sleep(0.2)
    assert not any(leftovers.values()), f"left running on the test hosts: {leftovers}\n{context}"
    return {"detect_max_s": max(detections), "launcher_exit_s": exit_after, "pids": list(pids.values())}


@pytest.mark.timeout(TRIALS * 30 + 120)
def test_fault_matrix_link_down(cluster, tmp_path):
    """Both np cells at once, each in three lanes of its own hosts (np=3: hosts 0-2, 3-5, 6-8; np=4: 9-10, 11-12,
    13-14); lane k runs the cell's trials k, k + 3, ..."""
    schedules = {np: victim_schedule(f"linkdown-{np}", len(layout)) for np, layout in LINK_DOWN_LAYOUTS.items()}
    lanes = []  # (np, first host, victims)
    first = 0
    for np, layout in LINK_DOWN_LAYOUTS.items():
        for lane in range(LINK_DOWN_LANES):
            lanes.append((np, first, schedules[np][lane::LINK_DOWN_LANES]))
            first += len(layout)
    shm_before, tmp_before = shm_entries(), tmp_entries()

    def run_lane(lane):
        np, first_host, victims = lane
        return [run_link_down_trial(cluster, tmp_path, np, first_host, victim) for victim in victims]

    results = {np: [] for np in LINK_DOWN_LAYOUTS}
    with concurrent.futures.ThreadPoolExecutor(len(lanes)) as pool:
        for lane, lane_results in zip(lanes, pool.map(run_lane, lanes)):
            results[lane[0]] += lane_results
    time.sleep(0.2)
    assert shm_entries() <= shm_before, f"left in /dev/shm: {shm_entries() - shm_before}"
    assert tmp_entries() <= tmp_before, f"left in /tmp: {tmp_entries() - tmp_before}"
    for np, cell_results in results.items():
        record_cell(f"linkdown np={np}", cell_results)
