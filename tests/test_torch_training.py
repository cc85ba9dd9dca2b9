"""Training integration (hvdlite.torch.DistributedOptimizer and friends), across real processes.

Each job builds the same model on every rank, trains on this rank's shard, and compares against a reference
computed inside the job by a plain single-process optimizer on the concatenated global batch.
"""

import os
import sys

import pytest
from multiproc import run_job, run_job_function

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(job, np=2, env=None, timeout=120):
    """Runs tests/jobs/<job>.py on np ranks; a failed assertion fails the test with the rank's explanation."""
    return run_job_function(job, np, timeout=timeout, env=env)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np,during_backward", [(2, "1"), (2, "0"), (3, "auto")])
def test_matches_single_process_on_global_batch(np, during_backward):
    run(
        "training_global_batch",
        np=np,
        env={"HVDLITE_REDUCE_DURING_BACKWARD": during_backward},
    )


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"])
def test_gradient_accumulation_backward_passes_per_step(during_backward):
    run(
        "training_accumulation",
        env={"HVDLITE_REDUCE_DURING_BACKWARD": during_backward},
    )


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"])
def test_a_failed_step_leaves_the_optimizer_usable(during_backward):
    run(
        "training_failed_step",
        env={"HVDLITE_REDUCE_DURING_BACKWARD": during_backward},
    )


@pytest.mark.timeout(200)
def test_skip_synchronize_with_gradient_clipping_and_fp16_compression():
    run("training_skip_synchronize_clipping")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("during_backward", ["1", "0"])
def test_parameters_unused_on_some_ranks_are_averaged_and_on_every_rank_left_alone(during_backward):
    run("training_unused_parameters", np=3, env={"HVDLITE_REDUCE_DURING_BACKWARD": during_backward})


@pytest.mark.timeout(200)
def test_optimizer_state_and_objects_broadcast():
    run(
        "training_state_broadcast",
        np=3,
    )


@pytest.mark.timeout(200)
def test_sync_batch_norm_matches_batch_norm_on_the_full_batch():
    run(
        "training_sync_batch_norm",
        np=2,
    )


@pytest.mark.timeout(200)
def test_collective_gradients():
    run(
        "training_collective_gradients",
        np=2,
    )


@pytest.mark.timeout(200)
def test_sparse_gradients_and_sparse_as_dense():
    run(
        "training_sparse_gradients",
        np=2,
    )


@pytest.mark.timeout(120)
def test_usage_errors():
    run("training_usage_errors")


@pytest.mark.timeout(120)
def test_a_new_optimizer_over_the_same_parameters_replaces_the_earlier_one():
    run("training_rewrapped_optimizer")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("during_backward", ["1", "0"])
def test_parameter_groups_added_while_training_are_averaged(during_backward):
    run("training_added_param_group", env={"HVDLITE_REDUCE_DURING_BACKWARD": during_backward})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher", ["local", "mpi"])
def test_mnist_example_trains_and_checkpoints(tmp_path, launcher):
    """The README's training example, started by hvdlite-run's built-in mode and by hvdlite-run --mpi (whose ranks
    move their tensors through the MPI backend)."""
    import subprocess

    data = tmp_path / "mnist"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "make_mnist_idx.py"),
            "--out",
            str(data),
            "--train",
            "1200",
            "--test",
            "400",
        ],
        check=True,
    )
    checkpoint = tmp_path / "ckpt" / "mnist.pt"
    script = f"""
import runpy, sys
import hvdlite.torch as hvd
hvd.init()  # the example's own init() is then a no-op
sys.stdout.write("MPI DATA PLANE %s\\n" % hvd.mpi_enabled())
sys.argv = ["pytorch_mnist.py", "--data-dir", {str(data)!r}, "--epochs", "1", "--checkpoint", {str(checkpoint)!r}]
runpy.run_path({os.path.join(ROOT, "examples", "pytorch_mnist.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240, launcher=launcher)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count("MPI DATA PLANE %s" % (launcher == "mpi")) == 2, out
    assert "test accuracy" in out and "checkpoint written" in out, out
    accuracy = float(out.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50.0, out  # ten classes: chance is 10%
    import torch

    state = torch.load(checkpoint)
    assert set(state) == {"model", "optimizer", "epochs"}
    assert out.count("checkpoint written") == 1  # rank 0 only


@pytest.mark.timeout(300)
def test_synthetic_benchmark_example_runs():
    script = f"""
import runpy, sys
sys.argv = ["b", "--model", "resnet_small", "--batch-size", "2", "--image-size", "32", "--num-iters", "1",
            "--num-batches-per-iter", "1", "--num-warmup-batches", "1"]
runpy.run_path({os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")!r}, run_name="__main__")
"""
    result = run_job(script, np=2, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "total img/sec on 2 rank(s)" in out, out


@pytest.mark.parametrize("np,omp_threads", [(2, None), (3, None), (2, "2"), (1, None)])
def test_ranks_sharing_a_host_share_its_cpus_unless_the_job_says(monkeypatch, np, omp_threads):
    """Without OMP_NUM_THREADS, init() lowers torch's pool to the rank's share of the host's CPUs where the
    ranks' pools would oversubscribe it; a given OMP_NUM_THREADS, or a rank alone, keeps its count."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    run("compute_threads", np=np, env=None if omp_threads is None else {"OMP_NUM_THREADS": omp_threads})


def test_a_new_share_starts_from_the_unshared_pool_and_leaves_a_count_the_script_chose(monkeypatch):
    """Re-sharing (elastic rounds): a round with fewer ranks on the host restores the pool hvdlite lowered, a
    round with more lowers it from there, and a count the script set after init() is left alone from then on."""
    import torch

    from hvdlite.torch import compute_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(compute_threads, "host_cpus", lambda: 8)
    monkeypatch.setattr(compute_threads, "_chosen", None)
    monkeypatch.setattr(compute_threads, "_unshared", None)
    monkeypatch.setattr(compute_threads, "_left_to_script", False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        counts = []
        for local_size in (1, 2, 3, 1, 4):
            compute_threads.share_host_cpus(0, local_size)
            counts.append(torch.get_num_threads())
        assert counts == [8, 4, 2, 8, 2]
        torch.set_num_threads(3)  # the script's choice
        for local_size in (1, 8):
            compute_threads.share_host_cpus(0, local_size)
            assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
