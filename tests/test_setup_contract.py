"""The set-up contract: README's commands are what CI runs, and `make test` installs or names what it needs."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tools", "system-packages.sh")


def _quick_start_commands():
    """The fenced bash commands of README's quick-start section, in order."""
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def _commands(path):
    """The lines of a shell script that run something (no comments, no shell options, no cd)."""
    with open(path) as f:
        lines = [line.strip() for line in f]
    return [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]


def test_readme_has_one_train_and_one_test_command():
    assert _quick_start_commands() == ["make train", "make test"]


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = _quick_start_commands()[1]
    assert _commands(os.path.join(REPO, ".ci", "run")) == [test_command]


def test_make_test_checks_system_packages_before_anything_else():
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    test_rule = re.search(r"^test:(.*)$", makefile, re.M).group(1).split()
    assert test_rule[0] == "system-packages", "the package check must run before the slow set-up"
    assert re.search(r"^system-packages:\n\ttools/system-packages.sh$", makefile, re.M)


def _fake_bin(tmp_path, uid, apt_log=None):
    """A PATH with only `id` (answering uid) and, optionally, an apt-get that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"id": f"#!/bin/sh\necho {uid}\n"}
    if apt_log is not None:
        scripts["apt-get"] = f'#!/bin/sh\necho "$@" >> {apt_log}\n'
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(bin_dir)


def _run_script(path_dir):
    # /bin/bash by absolute path: the fake PATH holds no other program, so every package looks missing
    # (except sshd/ip, which the script also looks for in /usr/sbin and /sbin).
    return subprocess.run(["/bin/bash", SCRIPT], env={"PATH": path_dir}, capture_output=True, text=True, timeout=30)


def test_without_root_it_stops_at_once_naming_the_command(tmp_path):
    started = time.monotonic()
    result = _run_script(_fake_bin(tmp_path, uid=1000, apt_log=tmp_path / "apt.log"))
    assert result.returncode == 1
    assert time.monotonic() - started < 5
    assert not (tmp_path / "apt.log").exists(), "nothing may be installed without root"
    assert "openmpi-bin libopenmpi-dev" in result.stderr
    assert "sudo sh -c 'apt-get update && apt-get install -y openmpi-bin libopenmpi-dev" in result.stderr
    assert "make test" in result.stderr


def test_as_root_it_installs_what_is_missing(tmp_path):
    log = tmp_path / "apt.log"
    result = _run_script(_fake_bin(tmp_path, uid=0, apt_log=log))
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "update -qq"
    assert calls[1].startswith("install -y -qq openmpi-bin libopenmpi-dev")
    assert "openjdk-17-jre-headless" in calls[1].split(), "the Spark tests' Java runtime"


def test_with_everything_installed_it_is_silent():
    # The suite itself runs on a machine where the check passed (make test ran it first).
    result = subprocess.run([SCRIPT], capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_the_waiting_lane_names_test_files_that_exist():
    import conftest

    for name in conftest.WAITING_LANE:
        assert os.path.exists(os.path.join(REPO, "tests", name)), f"{name} is in the waiting lane but not in tests/"
