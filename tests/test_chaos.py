"""Two minutes of bench/chaos.py under a fixed seed, for each framework: elastic training (PyTorch, Keras fit) on 3
network-namespace hosts x 2 slots while every kind of fault arrives every 4-10 s (CI's version of the chaos hour,
docs/faults.md). The job must finish with the weights of a fault-free replay of its committed steps and leave
nothing behind; the test fails, not skips, when the machine cannot create the hosts."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_two_minutes_of_random_faults_keep_the_invariant(tmp_path, framework):
    result = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "chaos.py"),
            "--minutes",
            "2",
            "--seed",
            "7",
            "--interval",
            "4",
            "10",
            "--framework",
            framework,
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=840,
    )
    print(result.stdout[-6000:])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    summary = json.loads((tmp_path / "chaos.json").read_text())
    assert summary["invariant"] == "held" and not summary["failures"], summary["failures"]
    assert summary["faults"] >= 8, summary["faults"]
    injected = {row["kind"]: row["injected"] for row in summary["by_kind"]}
    assert all(count >= 1 for count in injected.values()), injected  # every kind came up
    assert summary["launches"] >= 2  # the whole job was killed at least once and resumed from its checkpoint
    assert summary["steps"] > 0
